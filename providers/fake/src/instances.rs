//! Instances: lookup (provider ID first, then node name, then a synthesised instance when
//! `autoInstances` is on), and the legacy `Instances`, `InstancesV2` and `Zones` capabilities.

use std::collections::BTreeMap;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde_json::json;

use crate::cloud::{effective_provider_id, lock, FakeCloud, Settings};
use crate::config::InstanceConfig;
use crate::faults::instance_error_any;

/// An instance as the cloud reports it (configured or synthesised), all defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Instance {
    pub(crate) name: String,
    pub(crate) provider_id: String,
    pub(crate) instance_id: String,
    pub(crate) instance_type: String,
    pub(crate) zone: String,
    pub(crate) region: String,
    pub(crate) addresses: Vec<NodeAddress>,
    pub(crate) exists: bool,
    pub(crate) shutdown: bool,
    pub(crate) additional_labels: BTreeMap<String, String>,
    pub(crate) metadata_nil: bool,
}

fn addr(type_: &str, address: String) -> NodeAddress {
    NodeAddress {
        type_: type_.to_string(),
        address,
    }
}

impl FakeCloud {
    fn default_addresses(&self, name: &str) -> Vec<NodeAddress> {
        let ip = lock(&self.inner.auto_ips).ip_for(name);
        vec![
            addr(address_type::INTERNAL_IP, ip.to_string()),
            addr(address_type::HOSTNAME, name.to_string()),
        ]
    }

    fn configured(&self, s: &Settings, c: &InstanceConfig) -> Instance {
        let d = &s.config.defaults;
        Instance {
            name: c.name.clone(),
            provider_id: effective_provider_id(&self.inner.provider_name, c),
            instance_id: c.instance_id.clone().unwrap_or_else(|| c.name.clone()),
            instance_type: c
                .instance_type
                .clone()
                .unwrap_or_else(|| d.instance_type.clone()),
            zone: c.zone.clone().unwrap_or_else(|| d.zone.clone()),
            region: c.region.clone().unwrap_or_else(|| d.region.clone()),
            addresses: match &c.addresses {
                Some(list) => list
                    .iter()
                    .map(|a| addr(&a.type_, a.address.clone()))
                    .collect(),
                None => self.default_addresses(&c.name),
            },
            exists: c.exists,
            shutdown: c.shutdown,
            additional_labels: c.additional_labels.clone(),
            metadata_nil: c.metadata_nil,
        }
    }

    fn synthesised(&self, s: &Settings, name: &str) -> Instance {
        let d = &s.config.defaults;
        Instance {
            name: name.to_string(),
            provider_id: format!("{}://{name}", self.inner.provider_name),
            instance_id: name.to_string(),
            instance_type: d.instance_type.clone(),
            zone: d.zone.clone(),
            region: d.region.clone(),
            addresses: self.default_addresses(name),
            exists: true,
            shutdown: false,
            additional_labels: BTreeMap::new(),
            metadata_nil: false,
        }
    }

    /// Apply the instance's own injected errors, then build its view.
    fn found(&self, s: &Settings, idx: usize, method: &str) -> Result<Option<Instance>> {
        self.found_any(s, idx, &[method])
    }

    /// [`FakeCloud::found`] for a call that stands for several methods (a bulk lookup).
    fn found_any(&self, s: &Settings, idx: usize, methods: &[&str]) -> Result<Option<Instance>> {
        let c = &s.config.instances[idx];
        instance_error_any(&c.errors, &c.name, methods, &self.inner.counters)?;
        Ok(Some(self.configured(s, c)))
    }

    pub(crate) fn find_by_name(
        &self,
        s: &Settings,
        name: &str,
        method: &str,
    ) -> Result<Option<Instance>> {
        if let Some(&i) = s.by_name.get(name) {
            return self.found(s, i, method);
        }
        Ok((s.config.auto_instances && !name.is_empty()).then(|| self.synthesised(s, name)))
    }

    pub(crate) fn find_by_provider_id(
        &self,
        s: &Settings,
        provider_id: &str,
        method: &str,
    ) -> Result<Option<Instance>> {
        if let Some(&i) = s.by_provider_id.get(provider_id) {
            return self.found(s, i, method);
        }
        if !s.config.auto_instances {
            return Ok(None);
        }
        // `<providerName>://<name>` of a synthesised instance, unless a configured instance
        // owns that name (it has a different provider ID, so this one is unknown).
        let name = provider_id
            .strip_prefix(self.inner.provider_name.as_str())
            .and_then(|rest| rest.strip_prefix("://"))
            .filter(|n| !n.is_empty() && !n.contains('/') && !s.by_name.contains_key(*n));
        Ok(name.map(|n| self.synthesised(s, n)))
    }

    /// V2 lookup: `spec.providerID` first, then `metadata.name`.
    pub(crate) fn find_node(
        &self,
        s: &Settings,
        node: &Node,
        method: &str,
    ) -> Result<Option<Instance>> {
        self.find_node_any(s, node, &[method])
    }

    /// [`FakeCloud::find_node`] for a call that stands for several methods (a bulk lookup):
    /// the instance's own errors of the first of `methods` that has one apply.
    fn find_node_any(
        &self,
        s: &Settings,
        node: &Node,
        methods: &[&str],
    ) -> Result<Option<Instance>> {
        let pid = node_provider_id(node);
        if !pid.is_empty() {
            if let Some(&i) = s.by_provider_id.get(pid) {
                return self.found_any(s, i, methods);
            }
        }
        let name = node_name(node);
        if let Some(&i) = s.by_name.get(name) {
            return self.found_any(s, i, methods);
        }
        Ok((s.config.auto_instances && !name.is_empty()).then(|| self.synthesised(s, name)))
    }

    /// One node's answer to a bulk lookup: the per-node methods' answers in one value. An
    /// instance the cloud does not know, or one with `exists: false`, is `exists: false` (never
    /// an error); the instance's own `errors` (under `InstancesBatch` or the per-node method
    /// names of what `query` asks) fail this node only.
    fn batch_answer(
        &self,
        s: &Settings,
        node: &Node,
        query: InstanceQuery,
    ) -> Result<InstanceStatus> {
        let mut methods = vec!["InstancesBatch"];
        for (part, method) in QUERY_PARTS {
            if query.contains(part) {
                methods.push(method);
            }
        }
        let gone = |shutdown| InstanceStatus {
            exists: false,
            shutdown,
            metadata: None,
        };
        Ok(match self.find_node_any(s, node, &methods)? {
            None => gone(false),
            Some(i) if !i.exists => gone(query.contains(InstanceQuery::SHUTDOWN) && i.shutdown),
            Some(i) => InstanceStatus {
                exists: true,
                shutdown: query.contains(InstanceQuery::SHUTDOWN) && i.shutdown,
                metadata: (query.contains(InstanceQuery::METADATA) && !i.metadata_nil)
                    .then(|| metadata_of(i)),
            },
        })
    }
}

/// The parts of a bulk query and the per-node method each stands for.
const QUERY_PARTS: [(InstanceQuery, &str); 3] = [
    (InstanceQuery::EXISTS, "InstanceExists"),
    (InstanceQuery::SHUTDOWN, "InstanceShutdown"),
    (InstanceQuery::METADATA, "InstanceMetadata"),
];

fn metadata_of(i: Instance) -> InstanceMetadata {
    InstanceMetadata {
        provider_id: i.provider_id,
        instance_type: i.instance_type,
        node_addresses: i.addresses,
        zone: i.zone,
        region: i.region,
        additional_labels: i.additional_labels,
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

fn node_provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or("")
}

fn node_args(node: &Node) -> serde_json::Value {
    json!({ "node": node_name(node), "providerID": node_provider_id(node) })
}

/// The instance, if it exists; InstanceNotFound otherwise.
fn existing(i: Option<Instance>) -> Result<Instance> {
    i.filter(|i| i.exists)
        .ok_or_else(ProviderError::instance_not_found)
}

impl Instances for FakeCloud {
    fn node_addresses(&self, ctx: &CallContext, node_name: &str) -> Result<Vec<NodeAddress>> {
        let m = "NodeAddresses";
        let s = self.begin(m, "node-addresses", json!({ "node": node_name }), ctx)?;
        Ok(existing(self.find_by_name(&s, node_name, m)?)?.addresses)
    }

    fn node_addresses_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Vec<NodeAddress>> {
        let m = "NodeAddressesByProviderID";
        let args = json!({ "providerID": provider_id });
        let s = self.begin(m, "node-addresses-by-provider-id", args, ctx)?;
        Ok(existing(self.find_by_provider_id(&s, provider_id, m)?)?.addresses)
    }

    fn instance_id(&self, ctx: &CallContext, node_name: &str) -> Result<String> {
        let m = "InstanceID";
        let s = self.begin(m, "instance-id", json!({ "node": node_name }), ctx)?;
        Ok(existing(self.find_by_name(&s, node_name, m)?)?.instance_id)
    }

    fn instance_type(&self, ctx: &CallContext, node_name: &str) -> Result<String> {
        let m = "InstanceType";
        let s = self.begin(m, "instance-type", json!({ "node": node_name }), ctx)?;
        Ok(existing(self.find_by_name(&s, node_name, m)?)?.instance_type)
    }

    fn instance_type_by_provider_id(&self, ctx: &CallContext, provider_id: &str) -> Result<String> {
        let m = "InstanceTypeByProviderID";
        let args = json!({ "providerID": provider_id });
        let s = self.begin(m, "instance-type-by-provider-id", args, ctx)?;
        Ok(existing(self.find_by_provider_id(&s, provider_id, m)?)?.instance_type)
    }

    fn instance_exists_by_provider_id(&self, ctx: &CallContext, provider_id: &str) -> Result<bool> {
        let m = "InstanceExistsByProviderID";
        let args = json!({ "providerID": provider_id });
        let s = self.begin(m, "instance-exists-by-provider-id", args, ctx)?;
        Ok(self
            .find_by_provider_id(&s, provider_id, m)?
            .is_some_and(|i| i.exists))
    }

    fn instance_shutdown_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<bool> {
        let m = "InstanceShutdownByProviderID";
        let args = json!({ "providerID": provider_id });
        let s = self.begin(m, "instance-shutdown-by-provider-id", args, ctx)?;
        if provider_id.is_empty() {
            // As upstream's fake: the by-provider-ID variant needs a provider ID.
            return Err(ProviderError::other(
                "InstanceShutdownByProviderID: empty provider ID",
            ));
        }
        self.find_by_provider_id(&s, provider_id, m)?
            .map(|i| i.shutdown)
            .ok_or_else(ProviderError::instance_not_found)
    }

    fn current_node_name(&self, ctx: &CallContext, hostname: &str) -> Result<String> {
        let args = json!({ "hostname": hostname });
        self.begin("CurrentNodeName", "current-node-name", args, ctx)?;
        Ok(hostname.to_string())
    }
}

impl InstancesV2 for FakeCloud {
    fn instance_exists(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        let m = "InstanceExists";
        let s = self.begin(m, "instance-exists", node_args(node), ctx)?;
        Ok(self.find_node(&s, node, m)?.is_some_and(|i| i.exists))
    }

    fn instance_shutdown(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        let m = "InstanceShutdown";
        let s = self.begin(m, "instance-shutdown", node_args(node), ctx)?;
        self.find_node(&s, node, m)?
            .map(|i| i.shutdown)
            .ok_or_else(ProviderError::instance_not_found)
    }

    fn instance_metadata(
        &self,
        ctx: &CallContext,
        node: &Node,
    ) -> Result<Option<InstanceMetadata>> {
        let m = "InstanceMetadata";
        let s = self.begin(m, "instance-metadata-by-provider-id", node_args(node), ctx)?;
        let i = existing(self.find_node(&s, node, m)?)?;
        if i.metadata_nil {
            return Ok(None);
        }
        Ok(Some(metadata_of(i)))
    }
}

impl BulkInstances for FakeCloud {
    /// One call (recorded once, as `instances-batch` with the node names and the query) answers
    /// every node; the `InstancesBatch` faults (latency, errors, ...) apply to the call.
    fn instances_batch(
        &self,
        ctx: &CallContext,
        nodes: &[Node],
        query: InstanceQuery,
    ) -> Result<Vec<Result<InstanceStatus>>> {
        let m = "InstancesBatch";
        let asked: Vec<&str> = QUERY_PARTS
            .iter()
            .filter(|(part, _)| query.contains(*part))
            .map(|(_, method)| *method)
            .collect();
        let names: Vec<&str> = nodes.iter().map(node_name).collect();
        let args = json!({ "nodes": names, "query": asked });
        let s = self.begin(m, "instances-batch", args, ctx)?;
        Ok(nodes
            .iter()
            .map(|node| self.batch_answer(&s, node, query))
            .collect())
    }
}

impl Zones for FakeCloud {
    fn get_zone_by_provider_id(&self, ctx: &CallContext, provider_id: &str) -> Result<Zone> {
        let m = "GetZoneByProviderID";
        let args = json!({ "providerID": provider_id });
        let s = self.begin(m, "get-zone-by-provider-id", args, ctx)?;
        let i = existing(self.find_by_provider_id(&s, provider_id, m)?)?;
        Ok(Zone {
            failure_domain: i.zone,
            region: i.region,
        })
    }

    fn get_zone_by_node_name(&self, ctx: &CallContext, node_name: &str) -> Result<Zone> {
        let m = "GetZoneByNodeName";
        let s = self.begin(
            m,
            "get-zone-by-node-name",
            json!({ "node": node_name }),
            ctx,
        )?;
        let i = existing(self.find_by_name(&s, node_name, m)?)?;
        Ok(Zone {
            failure_domain: i.zone,
            region: i.region,
        })
    }
}
