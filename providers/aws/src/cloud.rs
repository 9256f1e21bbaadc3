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
}

impl AwsContext {
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
            None => rt
                .run_for(REGION_LOOKUP, {
                    let profile = config.profile.clone();
                    async move {
                    let mut chain = aws_config::default_provider::region::DefaultRegionChain::builder();
                    if let Some(p) = &profile {
                        chain = chain.profile_name(p);
                    }
                    Ok(chain.build().region().await.map(|r| r.to_string()))
                    }
                })
                .ok()
                .flatten()
                .ok_or_else(|| {
                    ProviderError::invalid_config(
                        "aws cloud config: no region: set Region or Zone in [Global], or AWS_REGION (the instance metadata service did not answer)",
                    )
                })?,
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
