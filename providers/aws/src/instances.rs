//! InstancesV2 and the bulk lookups, from DescribeInstances.
//!
//! A node is found by `spec.providerID` (`aws:///<zone>/<instance-id>`, `aws:////<id>` or a
//! bare `i-...`), else by its name: a name that is an instance ID (resource-based naming,
//! `i-0123….<region>.compute.internal`) by ID, any other name as the instance's private DNS
//! name (EC2's default node name), among the cluster's instances that are not terminated.
//!
//! Lookups use DescribeInstances with `instance-id` / `private-dns-name` filters (150 values
//! per call, pages followed): an unknown ID is simply absent from the answer, and one call
//! answers many nodes ([`BulkInstances`]).
//!
//! States: `stopped` is shut down; `terminated` (or absent) does not exist; every other state
//! exists and is not shut down. Errors: throttling → `throttled`, rejected credentials or
//! permissions → `unauthorized`; neither is ever "does not exist".

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use futures::future::try_join_all;

use crate::api::ec2::{Instance, FILTER_VALUES_PER_CALL};
use crate::cloud::AwsContext;
use crate::config::IpFamily;
use crate::runtime::AwsRuntime;
use crate::tags;

/// The label the AWS CCM sets to the zone's ID (`use1-az6`).
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";

/// What a node is looked up by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// An instance ID (from the provider ID or an instance-ID node name).
    Id(String),
    /// A private DNS name (the node name).
    Name(String),
}

/// The instance ID in a provider ID: `aws:///<zone>/<id>`, `aws:////<id>`, `aws://<zone>/<id>`
/// or a bare `i-...`.
pub fn instance_id_from_provider_id(provider_id: &str) -> std::result::Result<String, String> {
    let path = match provider_id.strip_prefix("aws://") {
        Some(rest) => rest,
        None if provider_id.contains("://") => {
            return Err(format!(
                "provider ID {provider_id:?} is not an aws:// provider ID"
            ))
        }
        None => provider_id,
    };
    let tokens: Vec<&str> = path.trim_matches('/').split('/').collect();
    let id = match tokens.as_slice() {
        [id] => *id,
        [_zone, id] => *id,
        _ => "",
    };
    if is_instance_id(id) {
        Ok(id.to_string())
    } else {
        Err(format!(
            "invalid format for AWS instance in provider ID {provider_id:?}"
        ))
    }
}

/// `i-` followed by 8 or 17 hexadecimal digits.
pub fn is_instance_id(s: &str) -> bool {
    s.strip_prefix("i-").is_some_and(|h| {
        (h.len() == 8 || h.len() == 17) && h.chars().all(|c| c.is_ascii_hexdigit())
    })
}

/// How `node` is looked up.
pub fn key_of(node: &Node) -> Result<Key> {
    if let Some(pid) = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .filter(|p| !p.is_empty())
    {
        return instance_id_from_provider_id(pid)
            .map(Key::Id)
            .map_err(ProviderError::other);
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(ProviderError::other(
            "node has neither a name nor a provider ID",
        ));
    }
    // Resource-based names: `i-0123456789abcdef0` or `i-0123456789abcdef0.<region>.compute.internal`.
    let first = name.split('.').next().unwrap_or_default();
    if is_instance_id(first) {
        return Ok(Key::Id(first.to_string()));
    }
    Ok(Key::Name(name))
}

/// The node addresses of `instance`, as the AWS CCM orders them, per address family.
pub fn node_addresses(instance: &Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let addr = |t: &str, a: &str| NodeAddress {
        type_: t.to_string(),
        address: a.to_string(),
    };
    let mut interfaces: Vec<_> = instance.interfaces.iter().collect();
    // The primary device first; interfaces without an attachment last.
    interfaces.sort_by_key(|i| i.device_index.unwrap_or(u32::MAX));
    let mut out = Vec::new();
    for family in families {
        match family {
            IpFamily::V4 => {
                let before = out.len();
                for i in interfaces.iter().filter(|i| i.status == "in-use") {
                    for ip in &i.private_ips {
                        if ip.parse::<std::net::Ipv4Addr>().is_ok() {
                            out.push(addr(address_type::INTERNAL_IP, ip));
                        }
                    }
                }
                if out.len() == before {
                    if let Some(ip) = &instance.private_ip {
                        out.push(addr(address_type::INTERNAL_IP, ip));
                    }
                }
                if let Some(ip) = &instance.public_ip {
                    out.push(addr(address_type::EXTERNAL_IP, ip));
                }
                if let Some(dns) = &instance.private_dns {
                    out.push(addr(address_type::INTERNAL_DNS, dns));
                    out.push(addr(address_type::HOSTNAME, dns));
                }
                if let Some(dns) = &instance.public_dns {
                    out.push(addr(address_type::EXTERNAL_DNS, dns));
                }
            }
            IpFamily::V6 => {
                for i in interfaces.iter().filter(|i| i.status == "in-use") {
                    if let Some(ip) = i.ipv6.first() {
                        out.push(addr(address_type::INTERNAL_IP, ip));
                    }
                }
            }
        }
    }
    out
}

/// The `aws:///<zone>/<id>` provider ID of `instance`.
pub fn provider_id_of(instance: &Instance) -> String {
    format!("aws:///{}/{}", instance.zone, instance.id)
}

/// The InstancesV2 and BulkInstances of the provider.
pub struct AwsInstances {
    cx: Arc<AwsContext>,
    rt: Arc<AwsRuntime>,
}

impl AwsInstances {
    /// Instances over the provider's context and runtime.
    pub fn new(cx: Arc<AwsContext>, rt: Arc<AwsRuntime>) -> Self {
        Self { cx, rt }
    }

    /// The instance behind `key` (terminated ones included).
    fn find(&self, ctx: &CallContext, key: &Key) -> Result<Option<Instance>> {
        let cx = self.cx.clone();
        let k = key.clone();
        self.rt.run(ctx, async move {
            Ok(cx.lookup(std::slice::from_ref(&k)).await?.remove(&k))
        })
    }
}

impl AwsContext {
    /// Look up many keys with as few DescribeInstances calls as possible: IDs and names are
    /// each sent 150 per call, the calls run concurrently (at most four at a time).
    pub async fn lookup(&self, keys: &[Key]) -> Result<HashMap<Key, Instance>> {
        let mut ids: Vec<String> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for k in keys {
            match k {
                Key::Id(id) if !ids.contains(id) => ids.push(id.clone()),
                Key::Name(n) if !names.contains(n) => names.push(n.clone()),
                _ => {}
            }
        }
        let mut queries: Vec<(&'static str, Vec<String>)> = Vec::new();
        for chunk in ids.chunks(FILTER_VALUES_PER_CALL) {
            queries.push(("instance-id", chunk.to_vec()));
        }
        for chunk in names.chunks(FILTER_VALUES_PER_CALL) {
            queries.push(("private-dns-name", chunk.to_vec()));
        }
        let limit = Arc::new(tokio::sync::Semaphore::new(4));
        let calls = queries.into_iter().map(|(filter, values)| {
            let limit = limit.clone();
            async move {
                let _permit = limit.acquire_owned().await;
                let found = self
                    .api
                    .describe_instances(&[(filter, &values[..])])
                    .await?;
                Ok::<_, ProviderError>((filter, found))
            }
        });
        let mut out = HashMap::new();
        for (filter, found) in try_join_all(calls).await? {
            for instance in found {
                self.remember_state(&instance);
                if filter == "instance-id" {
                    out.insert(Key::Id(instance.id.clone()), instance);
                    continue;
                }
                // By name: only the cluster's instances, never a terminated one (a new
                // instance may reuse the private DNS name of a terminated one).
                if instance.state == "terminated" {
                    continue;
                }
                if let Some(id) = &self.cluster_id {
                    if !tags::has_cluster_tag(&instance.tags, id) {
                        continue;
                    }
                }
                let Some(name) = instance.private_dns.clone() else {
                    continue;
                };
                let key = Key::Name(name);
                if let Some(other) = out.get(&key) {
                    return Err(ProviderError::other(format!(
                        "multiple instances found for node name {:?}: {} and {}",
                        match &key {
                            Key::Name(n) => n.as_str(),
                            Key::Id(i) => i.as_str(),
                        },
                        other.id,
                        instance.id
                    )));
                }
                out.insert(key, instance);
            }
        }
        Ok(out)
    }

    /// The metadata of `node`, whose instance is `instance`.
    pub async fn metadata(&self, node: &Node, instance: &Instance) -> Result<InstanceMetadata> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| provider_id_of(instance));
        let mut labels = BTreeMap::new();
        let has_zone_id = node
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(ZONE_ID_LABEL));
        if !has_zone_id && !instance.zone.is_empty() {
            if let Some(zone_id) = self.zone_id(&instance.zone).await? {
                labels.insert(ZONE_ID_LABEL.to_string(), zone_id);
            }
        }
        if let Some(name) = &node.metadata.name {
            self.remember_node(&instance.id, name);
        }
        Ok(InstanceMetadata {
            provider_id,
            instance_type: instance.instance_type.clone(),
            node_addresses: node_addresses(instance, &self.config.node_ip_families),
            zone: instance.zone.clone(),
            region: self.region.clone(),
            additional_labels: labels,
        })
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// "Not found" for a node looked up by `key`.
fn not_found(node: &Node, key: &Key) -> ProviderError {
    let why = match key {
        Key::Id(id) => format!("instance {id} does not exist"),
        Key::Name(n) => format!("no instance of the cluster has the private DNS name {n:?}"),
    };
    ProviderError::new(
        ErrorKind::INSTANCE_NOT_FOUND,
        format!("instance not found: node {:?}: {why}", node_name(node)),
    )
}

/// An instance that is gone: absent or terminated.
fn alive(found: Option<&Instance>) -> Option<&Instance> {
    found.filter(|i| i.state != "terminated")
}

impl InstancesV2 for AwsInstances {
    fn instance_exists(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        let key = key_of(node)?;
        let found = self.find(ctx, &key)?;
        match (&key, alive(found.as_ref())) {
            (_, Some(_)) => Ok(true),
            // Only an instance ID is evidence: a name that matches nothing may be a name
            // this provider cannot map (as the AWS CCM, an error, never a deletion).
            (Key::Id(_), None) => Ok(false),
            (Key::Name(_), None) => Err(not_found(node, &key)),
        }
    }

    fn instance_shutdown(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        let key = key_of(node)?;
        let found = self.find(ctx, &key)?;
        match alive(found.as_ref()) {
            Some(i) => Ok(i.state == "stopped"),
            None => Err(not_found(node, &key)),
        }
    }

    fn instance_metadata(
        &self,
        ctx: &CallContext,
        node: &Node,
    ) -> Result<Option<InstanceMetadata>> {
        let key = key_of(node)?;
        let (cx, node) = (self.cx.clone(), node.clone());
        self.rt.run(ctx, async move {
            let found = cx.lookup(std::slice::from_ref(&key)).await?;
            match alive(found.get(&key)) {
                Some(i) => Ok(Some(cx.metadata(&node, i).await?)),
                None => Err(not_found(&node, &key)),
            }
        })
    }
}

impl BulkInstances for AwsInstances {
    fn instances_batch(
        &self,
        ctx: &CallContext,
        nodes: &[Node],
        query: InstanceQuery,
    ) -> Result<Vec<Result<InstanceStatus>>> {
        let keys: Vec<Result<Key>> = nodes.iter().map(key_of).collect();
        let valid: Vec<Key> = keys
            .iter()
            .filter_map(|k| k.as_ref().ok().cloned())
            .collect();
        let (cx, nodes) = (self.cx.clone(), nodes.to_vec());
        self.rt.run(ctx, async move {
            let found = cx.lookup(&valid).await?;
            let mut out = Vec::with_capacity(nodes.len());
            for (node, key) in nodes.iter().zip(keys) {
                let key = match key {
                    Ok(k) => k,
                    Err(e) => {
                        out.push(Err(e));
                        continue;
                    }
                };
                let answer = match (alive(found.get(&key)), &key) {
                    (None, Key::Id(_)) => Ok(InstanceStatus {
                        exists: false,
                        shutdown: false,
                        metadata: None,
                    }),
                    (None, Key::Name(_)) => Err(not_found(node, &key)),
                    (Some(i), _) => {
                        let metadata = if query.contains(InstanceQuery::METADATA) {
                            match cx.metadata(node, i).await {
                                Ok(m) => Some(m),
                                Err(e) => {
                                    out.push(Err(e));
                                    continue;
                                }
                            }
                        } else {
                            None
                        };
                        Ok(InstanceStatus {
                            exists: true,
                            shutdown: i.state == "stopped",
                            metadata,
                        })
                    }
                };
                out.push(answer);
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ec2::Interface;
    use serde_json::json;

    #[test]
    fn provider_ids_and_names_map_to_keys() {
        let ok = |p: &str| instance_id_from_provider_id(p).unwrap();
        assert_eq!(
            ok("aws:///us-east-1a/i-0123456789abcdef0"),
            "i-0123456789abcdef0"
        );
        assert_eq!(ok("aws:////i-01234567"), "i-01234567");
        assert_eq!(ok("aws://us-east-1a/i-01234567"), "i-01234567");
        assert_eq!(ok("i-01234567"), "i-01234567");
        assert!(instance_id_from_provider_id("gce://p/z/i-01234567").is_err());
        assert!(instance_id_from_provider_id("aws:///us-east-1a/vol-1").is_err());
        assert!(instance_id_from_provider_id("aws:///a/b/i-01234567").is_err());

        let node = |v| serde_json::from_value::<Node>(v).unwrap();
        let k = key_of(&node(
            json!({"metadata": {"name": "ip-10-0-1-4.ec2.internal"}}),
        ))
        .unwrap();
        assert_eq!(k, Key::Name("ip-10-0-1-4.ec2.internal".into()));
        let k = key_of(&node(
            json!({"metadata": {"name": "i-0123456789abcdef0.us-east-1.compute.internal"}}),
        ))
        .unwrap();
        assert_eq!(k, Key::Id("i-0123456789abcdef0".into()));
        let k = key_of(&node(
            json!({"metadata": {"name": "x"}, "spec": {"providerID": "aws:///z/i-01234567"}}),
        ))
        .unwrap();
        assert_eq!(k, Key::Id("i-01234567".into()));
    }

    #[test]
    fn addresses_follow_the_aws_ccm_order() {
        let i = Instance {
            id: "i-1".into(),
            private_dns: Some("ip-10-0-1-4.ec2.internal".into()),
            public_dns: Some("ec2-54-1-2-3.compute-1.amazonaws.com".into()),
            private_ip: Some("10.0.1.4".into()),
            public_ip: Some("54.1.2.3".into()),
            interfaces: vec![
                Interface {
                    device_index: Some(1),
                    status: "in-use".into(),
                    private_ips: vec!["10.0.2.9".into()],
                    ipv6: vec!["2600::9".into()],
                },
                Interface {
                    device_index: Some(0),
                    status: "in-use".into(),
                    private_ips: vec!["10.0.1.4".into(), "10.0.1.5".into()],
                    ipv6: vec!["2600::4".into(), "2600::5".into()],
                },
                Interface {
                    device_index: Some(2),
                    status: "available".into(),
                    private_ips: vec!["10.0.3.1".into()],
                    ipv6: vec![],
                },
            ],
            ..Default::default()
        };
        let show = |v: Vec<NodeAddress>| {
            v.into_iter()
                .map(|a| format!("{}={}", a.type_, a.address))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            show(node_addresses(&i, &[IpFamily::V4])),
            vec![
                "InternalIP=10.0.1.4",
                "InternalIP=10.0.1.5",
                "InternalIP=10.0.2.9",
                "ExternalIP=54.1.2.3",
                "InternalDNS=ip-10-0-1-4.ec2.internal",
                "Hostname=ip-10-0-1-4.ec2.internal",
                "ExternalDNS=ec2-54-1-2-3.compute-1.amazonaws.com",
            ]
        );
        assert_eq!(
            show(node_addresses(&i, &[IpFamily::V6, IpFamily::V4]))[..2],
            ["InternalIP=2600::4", "InternalIP=2600::9"]
        );
        assert_eq!(
            provider_id_of(&Instance {
                id: "i-1".into(),
                zone: "z".into(),
                ..Default::default()
            }),
            "aws:///z/i-1"
        );
    }
}
