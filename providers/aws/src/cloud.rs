//! The `aws` provider object and the context its parts share.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::api::ec2::AvailabilityZone;
use crate::api::{AwsClient, Endpoint};
use crate::config::AwsConfig;
use crate::credentials::{CredentialSettings, CredentialSource};
use crate::instances::AwsInstances;
use crate::loadbalancer::AwsLoadBalancer;
use crate::routes::AwsRoutes;
use crate::runtime::AwsRuntime;

/// How long a health answer is reused (the probe may run often; each costs one AWS call).
const HEALTH_TTL: Duration = Duration::from_secs(30);
/// Time allowed for the region lookup at start (environment, profile, IMDS).
const REGION_LOOKUP: Duration = Duration::from_secs(15);
/// At most one listing of the cluster's Nodes per this interval (instance → node name).
const NODE_LIST_INTERVAL: Duration = Duration::from_secs(60);
/// How long an instance state read from EC2 is trusted (to leave stopped instances out of
/// RegisterTargets without asking EC2 again).
const STATE_TTL: Duration = Duration::from_secs(60);

/// An instance's state and security groups as EC2 reported them, and when.
type SeenInstance = (String, Vec<String>, Instant);

/// What every part of one provider instance shares (the tasks on the runtime hold it; the
/// runtime itself is held next to it, by the parts, so that a task never drops it).
pub struct AwsContext {
    /// The EC2 / ELBv2 client.
    pub api: AwsClient,
    /// The cloud config.
    pub config: AwsConfig,
    /// The region.
    pub region: String,
    /// `KubernetesClusterID` / `KubernetesClusterTag`.
    pub cluster_id: Option<String>,
    zones: tokio::sync::Mutex<Option<Arc<BTreeMap<String, AvailabilityZone>>>>,
    node_names: Mutex<HashMap<String, String>>,
    node_ids: Mutex<HashMap<String, String>>,
    host: Mutex<Option<Arc<Host>>>,
    nodes_listed: Mutex<Option<Instant>>,
    health: Mutex<Option<(Instant, Result<()>)>>,
    states: Mutex<HashMap<String, SeenInstance>>,
    warned: Mutex<HashMap<String, Vec<String>>>,
    /// Per Service UID, its load-balancer annotations as last applied successfully (the value
    /// an invalid one falls back to).
    applied: Mutex<HashMap<String, BTreeMap<String, String>>>,
}

impl AwsContext {
    /// Record the state and security groups EC2 reported for `instance`.
    pub fn remember_state(&self, instance: &crate::api::ec2::Instance) {
        self.states.lock().expect("states").insert(
            instance.id.clone(),
            (
                instance.state.clone(),
                instance.security_groups.clone(),
                Instant::now(),
            ),
        );
    }

    /// The state EC2 reported for `instance_id` within the last minute.
    pub fn known_state(&self, instance_id: &str) -> Option<String> {
        self.states
            .lock()
            .expect("states")
            .get(instance_id)
            .filter(|(_, _, at)| at.elapsed() < STATE_TTL)
            .map(|(s, _, _)| s.clone())
    }

    /// The security groups EC2 reported for `instance_id` within the last minute.
    pub fn known_groups(&self, instance_id: &str) -> Option<Vec<String>> {
        self.states
            .lock()
            .expect("states")
            .get(instance_id)
            .filter(|(_, _, at)| at.elapsed() < STATE_TTL)
            .map(|(_, g, _)| g.clone())
    }

    /// Record the load-balancer annotations of `service` (the `aws-load-balancer-*` keys and
    /// the source-ranges annotation) as applied successfully.
    pub fn remember_applied(&self, service: &Service) {
        let uid = service.metadata.uid.clone().unwrap_or_default();
        self.applied
            .lock()
            .expect("applied")
            .insert(uid, crate::annotations::load_balancer_annotations(service));
    }

    /// The value of annotation `key` on `service` when it was last applied successfully:
    /// `Some(None)` when it was absent then, `None` when nothing was applied by this process.
    pub fn applied_value(&self, service: &Service, key: &str) -> Option<Option<String>> {
        let uid = service.metadata.uid.clone().unwrap_or_default();
        self.applied
            .lock()
            .expect("applied")
            .get(&uid)
            .map(|a| a.get(key).cloned())
    }

    /// Forget what was applied for `service` (deleted).
    pub fn forget_applied(&self, service: &Service) {
        let uid = service.metadata.uid.clone().unwrap_or_default();
        self.applied.lock().expect("applied").remove(&uid);
    }

    /// A Warning event on `service` with `reason` and the `lines`, once for each distinct set
    /// of lines (the AWS CCM ignores unknown annotations silently; this says so once). Posted
    /// through the host's Kubernetes access from the calling (host) thread; a failure to post
    /// is only logged.
    pub fn warn_once(&self, ctx: &CallContext, service: &Service, reason: &str, lines: &[String]) {
        let uid = service.metadata.uid.clone().unwrap_or_default();
        let key = format!("{uid}/{reason}");
        {
            let mut warned = self.warned.lock().expect("warned");
            if lines.is_empty() {
                warned.remove(&key);
                return;
            }
            if warned.get(&key).map(Vec::as_slice) == Some(lines) {
                return;
            }
            warned.insert(key, lines.to_vec());
        }
        let ns = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let message = lines.join("; ");
        log::warn!("aws: service {ns}/{name}: {message}");
        let Some(host) = self.host() else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let stamp = {
            let secs = now.as_secs();
            let (days, rem) = (secs / 86_400, secs % 86_400);
            let (y, m, d) = civil_from_days(days as i64);
            format!(
                "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
                rem / 3600,
                (rem % 3600) / 60,
                rem % 60
            )
        };
        let event = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": format!("{name}.{:x}", now.as_nanos()), "namespace": ns},
            "involvedObject": {
                "apiVersion": "v1", "kind": "Service", "namespace": ns, "name": name,
                "uid": uid,
                "resourceVersion": service.metadata.resource_version.clone().unwrap_or_default(),
            },
            "reason": reason,
            "message": message,
            "type": "Warning",
            "count": 1,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": "service-controller"},
            "reportingComponent": "service-controller",
        });
        let body = serde_json::to_vec(&event).unwrap_or_default();
        match host.kube_request(
            ctx,
            "POST",
            &format!("/api/v1/namespaces/{ns}/events"),
            "application/json",
            &body,
        ) {
            Ok((s, _)) if s < 300 => {}
            Ok((s, b)) => log::warn!(
                "aws: posting the {reason} event of {ns}/{name}: HTTP {s}: {}",
                String::from_utf8_lossy(&b)
            ),
            Err(e) => log::warn!("aws: posting the {reason} event of {ns}/{name}: {e}"),
        }
    }

    /// The cluster ID for tags: the configured one, else the host's `--cluster-name`.
    pub fn cluster_id_or<'a>(&'a self, cluster_name: &'a str) -> &'a str {
        self.cluster_id.as_deref().unwrap_or(cluster_name)
    }

    /// The zone ID of `zone` (`None` for a zone AWS does not list).
    pub async fn zone_id(&self, zone: &str) -> Result<Option<String>> {
        Ok(self.zone(zone).await?.map(|z| z.id))
    }

    /// The availability zone named `zone` (DescribeAvailabilityZones once per provider;
    /// again when a zone is missing).
    pub async fn zone(&self, zone: &str) -> Result<Option<AvailabilityZone>> {
        let mut cached = self.zones.lock().await;
        if let Some(z) = cached.as_ref().and_then(|m| m.get(zone)) {
            return Ok(Some(z.clone()));
        }
        let all: BTreeMap<String, AvailabilityZone> = self
            .api
            .describe_availability_zones()
            .await?
            .into_iter()
            .map(|z| (z.name.clone(), z))
            .collect();
        let found = all.get(zone).cloned();
        *cached = Some(Arc::new(all));
        Ok(found)
    }

    /// Record that `instance_id` is the node `node_name` (for routes).
    pub fn remember_node(&self, instance_id: &str, node_name: &str) {
        let mut m = self.node_names.lock().expect("node name map");
        if m.get(instance_id).map(String::as_str) != Some(node_name) {
            if let Some(old) = m.insert(instance_id.to_string(), node_name.to_string()) {
                self.node_ids.lock().expect("node id map").remove(&old);
            }
            self.node_ids
                .lock()
                .expect("node id map")
                .insert(node_name.to_string(), instance_id.to_string());
        }
    }

    /// The node name recorded for `instance_id`.
    pub fn node_name_of(&self, instance_id: &str) -> Option<String> {
        self.node_names
            .lock()
            .expect("node name map")
            .get(instance_id)
            .cloned()
    }

    /// Node names of instances (for routes and load-balancer hosts): names recorded by
    /// earlier calls, else the cluster's Nodes by provider ID (through the host's Kubernetes
    /// access, at most once a minute), else the instance's private DNS name (EC2's default
    /// node name). Instances that resolve to nothing are left out.
    pub fn node_names(
        self: &Arc<Self>,
        rt: &AwsRuntime,
        ctx: &CallContext,
        ids: &[String],
    ) -> Result<HashMap<String, String>> {
        let mut out = HashMap::new();
        let mut missing = Vec::new();
        for id in ids {
            match self.node_name_of(id) {
                Some(n) => {
                    out.insert(id.clone(), n);
                }
                None => missing.push(id.clone()),
            }
        }
        if missing.is_empty() {
            return Ok(out);
        }
        if self.refresh_nodes_from_host(ctx) {
            missing.retain(|id| match self.node_name_of(id) {
                Some(n) => {
                    out.insert(id.clone(), n);
                    false
                }
                None => true,
            });
        }
        if !missing.is_empty() {
            let cx = self.clone();
            let found = rt.run(ctx, async move {
                Ok(cx
                    .api
                    .describe_instances(&[("instance-id", &missing[..])])
                    .await?)
            })?;
            for i in found {
                if let Some(dns) = i.private_dns {
                    out.insert(i.id, dns);
                }
            }
        }
        Ok(out)
    }

    /// Read the cluster's Nodes (name and provider ID) through the host, at most once a
    /// minute. Returns whether it read them.
    fn refresh_nodes_from_host(&self, ctx: &CallContext) -> bool {
        let Some(host) = self.host() else {
            return false;
        };
        {
            let mut last = self.nodes_listed.lock().expect("nodes listed");
            if last.is_some_and(|t| t.elapsed() < NODE_LIST_INTERVAL) {
                return false;
            }
            *last = Some(Instant::now());
        }
        match host.kube_request(ctx, "GET", "/api/v1/nodes", "", &[]) {
            Ok((200, body)) => {
                let list: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                for item in list["items"].as_array().into_iter().flatten() {
                    let (Some(name), Some(pid)) = (
                        item["metadata"]["name"].as_str(),
                        item["spec"]["providerID"].as_str(),
                    ) else {
                        continue;
                    };
                    if let Ok(id) = crate::instances::instance_id_from_provider_id(pid) {
                        self.remember_node(&id, name);
                    }
                }
                true
            }
            Ok((status, _)) => {
                log::warn!("aws: listing nodes through the host: HTTP {status}");
                false
            }
            Err(e) => {
                log::warn!("aws: listing nodes through the host: {e}");
                false
            }
        }
    }

    /// The instance ID of the node named `node_name`: recorded earlier, else from the
    /// cluster's Nodes read through the host (one listing a minute at most, shared by every
    /// caller: the route controller creates hundreds of routes at once), else that Node's
    /// provider ID read alone, else `None` (callers then look the name up as a private DNS
    /// name).
    pub fn instance_of_node(&self, ctx: &CallContext, node_name: &str) -> Option<String> {
        let known = |cx: &Self| {
            cx.node_ids
                .lock()
                .expect("node id map")
                .get(node_name)
                .cloned()
        };
        if let Some(id) = known(self) {
            return Some(id);
        }
        if self.refresh_nodes_from_host(ctx) {
            if let Some(id) = known(self) {
                return Some(id);
            }
        }
        let host = self.host()?;
        match host.kube_request(ctx, "GET", &format!("/api/v1/nodes/{node_name}"), "", &[]) {
            Ok((200, body)) => {
                let node: serde_json::Value = serde_json::from_slice(&body).ok()?;
                let id = crate::instances::instance_id_from_provider_id(
                    node["spec"]["providerID"].as_str()?,
                )
                .ok()?;
                self.remember_node(&id, node_name);
                Some(id)
            }
            _ => None,
        }
    }

    /// The host's services, once `initialize` ran.
    pub fn host(&self) -> Option<Arc<Host>> {
        self.host.lock().expect("host").clone()
    }
}

/// The provider object.
pub struct AwsCloud {
    cx: Arc<AwsContext>,
    rt: Arc<AwsRuntime>,
    instances: Arc<AwsInstances>,
    load_balancer: Arc<AwsLoadBalancer>,
    routes: Arc<AwsRoutes>,
}

fn endpoint(
    config: &AwsConfig,
    service: &'static str,
    version: &'static str,
    region: &str,
) -> Endpoint {
    match config.override_for(service, region) {
        Some(o) => Endpoint {
            service,
            version,
            url: o.url.clone(),
            signing_region: o.signing_region.clone(),
            signing_name: o
                .signing_name
                .clone()
                .unwrap_or_else(|| service.to_string()),
        },
        None => Endpoint::default_for(service, version, region),
    }
}

impl AwsCloud {
    /// The factory: parse the cloud config, start the runtime, find the region, build the
    /// clients. No AWS call is made here (credentials are resolved by the first call).
    pub fn new(config: Option<&[u8]>) -> Result<Self> {
        let config = AwsConfig::parse(config)?;
        for ignored in config.ignored() {
            log::warn!("aws cloud config: {ignored}; the key has no effect");
        }
        let rt = AwsRuntime::new()?;
        let sdk_http = crate::api::sdk_http_client();
        let region = match config.configured_region() {
            Some(r) => r,
            None => {
                let sources = crate::region::RegionSources {
                    config_file: config.shared_config_file.clone(),
                    credentials_file: config.shared_credentials_file.clone(),
                    profile: config.profile.clone(),
                };
                let http = sdk_http.clone();
                let found = rt.run_for(REGION_LOOKUP, async move {
                    Ok(crate::region::find_region(&sources, http).await)
                });
                match found {
                    Ok(Ok(r)) => r,
                    Ok(Err(tried)) => {
                        return Err(ProviderError::invalid_config(format!(
                            "aws cloud config: no region: {tried}"
                        )))
                    }
                    Err(e) => {
                        return Err(ProviderError::invalid_config(format!(
                            "aws cloud config: no region: looking it up (environment, profile, instance metadata) failed: {e}"
                        )))
                    }
                }
            }
        };
        let sts_url = config.override_for("sts", &region).map(|o| o.url.clone());
        let credentials = Arc::new(CredentialSource::new(
            CredentialSettings {
                region: Some(region.clone()),
                credentials_file: config.shared_credentials_file.clone(),
                config_file: config.shared_config_file.clone(),
                profile: config.profile.clone(),
                role_arn: config.role_arn.clone(),
                sts_url,
            },
            sdk_http,
        ));
        let ec2 = endpoint(&config, "ec2", "2016-11-15", &region);
        let elbv2 = endpoint(&config, "elasticloadbalancing", "2015-12-01", &region);
        log::info!(
            "aws provider: region {region}, EC2 {}, ELBv2 {}, cluster ID {}",
            ec2.url,
            elbv2.url,
            config
                .cluster_id
                .as_deref()
                .unwrap_or("(none: --cluster-name is used)")
        );
        let api = {
            let _guard = rt.handle().enter();
            AwsClient::new(credentials, ec2, elbv2)
        };
        let rt = Arc::new(rt);
        let cx = Arc::new(AwsContext {
            api,
            cluster_id: config.cluster_id.clone(),
            config,
            region,
            zones: tokio::sync::Mutex::new(None),
            node_names: Mutex::new(HashMap::new()),
            node_ids: Mutex::new(HashMap::new()),
            host: Mutex::new(None),
            nodes_listed: Mutex::new(None),
            health: Mutex::new(None),
            states: Mutex::new(HashMap::new()),
            warned: Mutex::new(HashMap::new()),
            applied: Mutex::new(HashMap::new()),
        });
        Ok(Self {
            instances: Arc::new(AwsInstances::new(cx.clone(), rt.clone())),
            load_balancer: Arc::new(AwsLoadBalancer::new(cx.clone(), rt.clone())),
            routes: Arc::new(AwsRoutes::new(cx.clone(), rt.clone())),
            cx,
            rt,
        })
    }

    /// The shared context (tests).
    pub fn context(&self) -> &Arc<AwsContext> {
        &self.cx
    }
}

impl CloudProvider for AwsCloud {
    fn provider_name(&self) -> String {
        crate::AWS.into()
    }

    fn has_cluster_id(&self) -> bool {
        self.cx.cluster_id.is_some()
    }

    fn initialize(&self, _ctx: &CallContext, host: Host) -> Result<()> {
        *self.cx.host.lock().expect("host") = Some(Arc::new(host));
        Ok(())
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(self.instances.clone())
    }

    fn bulk_instances(&self) -> Option<Arc<dyn BulkInstances>> {
        Some(self.instances.clone())
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.load_balancer.clone())
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(self.routes.clone())
    }

    fn platforms(&self) -> Vec<String> {
        vec!["aws://".into()]
    }

    /// One DescribeAvailabilityZones (answers reused for 30 s): the credentials are accepted
    /// and the EC2 endpoint answers.
    fn health(&self, ctx: &CallContext) -> Result<()> {
        if let Some((at, r)) = self.cx.health.lock().expect("health").as_ref() {
            if at.elapsed() < HEALTH_TTL {
                return r.clone();
            }
        }
        let cx = self.cx.clone();
        let r = self.rt.run(ctx, async move {
            cx.api
                .describe_availability_zones()
                .await
                .map(drop)
                .map_err(ProviderError::from)
        });
        if !matches!(&r, Err(e) if matches!(e.kind(), ErrorKind::CANCELLED | ErrorKind::DEADLINE_EXCEEDED))
        {
            *self.cx.health.lock().expect("health") = Some((Instant::now(), r.clone()));
        }
        r
    }
}

/// Year, month, day of a day count since 1970-01-01 (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_454), (2026, 1, 1));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }
}
