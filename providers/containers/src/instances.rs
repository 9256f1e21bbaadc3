//! InstancesV2 and bulk lookups: a node is the container whose name is the Node's name (or the
//! name in its providerID) and that carries the cluster's label (`io.x-k8s.kind.cluster=<cluster>`
//! by default). A running container exists; a stopped one (exited, created, paused, ...) exists
//! and is shut down (a stopped container has no address: its metadata has none, and the Node
//! keeps the addresses it had); a removed one, or one without the cluster's label, does not exist.
//!
//! Differences from cloud-provider-kind: the providerID is the same (`kind://<cluster>/kind/<name>`,
//! so Nodes initialised by either keep their IDs), but a stopped container is reported shut
//! down (cloud-provider-kind says "not shut down" until it is removed), the instance type is a
//! label or the image name instead of the constant `kind-node`, zone and region come from
//! labels, and a node on several networks is fine: one InternalIP per network, the cluster's
//! network first (cloud-provider-kind's metadata fails for such a node).

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::cloud::Shared;
use crate::engine::Container;

/// The provider ID of container `name` in `cluster`.
pub fn provider_id(cluster: &str, name: &str) -> String {
    format!("{}://{cluster}/kind/{name}", crate::KIND)
}

/// `(cluster, container name)` of a provider ID of this provider's form.
pub fn parse_provider_id(id: &str) -> Option<(&str, &str)> {
    let rest = id.strip_prefix(&format!("{}://", crate::KIND))?;
    let (cluster, name) = rest.split_once("/kind/")?;
    (!cluster.is_empty() && !name.is_empty() && !name.contains('/')).then_some((cluster, name))
}

/// A label value made of an arbitrary string (an image reference): characters outside
/// `[A-Za-z0-9._-]` become `-`, at most 63 characters, starting and ending alphanumeric.
pub fn label_value(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The `containers` InstancesV2.
pub struct ContainerInstances {
    shared: Arc<Shared>,
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

impl ContainerInstances {
    /// Instances of the shared runtime client.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// The container name a node stands for: from its providerID when it has one of ours
    /// (`None` when its providerID is another cluster's or another provider's), else its name.
    fn container_name<'a>(&self, node: &'a Node) -> Option<&'a str> {
        match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(pid) if !pid.is_empty() => match parse_provider_id(pid) {
                Some((cluster, name)) if cluster == self.shared.config.cluster => Some(name),
                _ => None,
            },
            _ => Some(node_name(node)).filter(|n| !n.is_empty()),
        }
    }

    fn in_cluster(&self, c: &Container) -> bool {
        c.labels().get(&self.shared.config.cluster_label) == Some(&self.shared.config.cluster)
    }

    /// The node's container, `None` when it is gone or not the cluster's.
    fn find(&self, ctx: &CallContext, node: &Node) -> Result<Option<Container>> {
        let Some(name) = self.container_name(node) else {
            return Ok(None);
        };
        // The Engine API also finds a container by a prefix of its ID: only the exact name counts.
        Ok(self
            .shared
            .engine
            .inspect(ctx, name)?
            .filter(|c| c.short_name() == name && self.in_cluster(c)))
    }

    fn not_found(&self, node: &Node) -> ProviderError {
        ProviderError::new(
            ErrorKind::INSTANCE_NOT_FOUND,
            format!(
                "instance not found: node {:?}: no container {:?} with label {}={} in {}",
                node_name(node),
                self.container_name(node).unwrap_or(node_name(node)),
                self.shared.config.cluster_label,
                self.shared.config.cluster,
                self.shared.engine.socket().display()
            ),
        )
    }

    /// The metadata of a node's container.
    pub fn metadata(&self, c: &Container) -> InstanceMetadata {
        let cfg = &self.shared.config;
        let labels = c.labels();
        let name = c.short_name();
        let mut addresses: Vec<NodeAddress> = Vec::new();
        let networks = &c.network_settings.networks;
        let ordered = networks
            .get_key_value(&cfg.network)
            .into_iter()
            .chain(networks.iter().filter(|(n, _)| **n != cfg.network));
        for (_, ep) in ordered {
            for a in [&ep.ip_address, &ep.global_ipv6_address] {
                if !a.is_empty() && !addresses.iter().any(|x| &x.address == a) {
                    addresses.push(NodeAddress {
                        type_: address_type::INTERNAL_IP.into(),
                        address: a.clone(),
                    });
                }
            }
        }
        // A stopped container has no address: report none at all, so that the Node keeps
        // the addresses it has (the host keeps them when the cloud returns none).
        if !addresses.is_empty() {
            addresses.push(NodeAddress {
                type_: address_type::HOSTNAME.into(),
                address: name.into(),
            });
        }
        let instance_type = labels
            .get(&cfg.instance_type_label)
            .filter(|_| !cfg.instance_type_label.is_empty())
            .cloned()
            .unwrap_or_else(|| c.config.image.clone());
        InstanceMetadata {
            provider_id: provider_id(&cfg.cluster, name),
            instance_type: label_value(&instance_type),
            node_addresses: addresses,
            zone: labels.get(&cfg.zone_label).cloned().unwrap_or_default(),
            region: labels.get(&cfg.region_label).cloned().unwrap_or_default(),
            additional_labels: BTreeMap::new(),
        }
    }
}

impl InstancesV2 for ContainerInstances {
    fn instance_exists(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        Ok(self.find(ctx, node)?.is_some())
    }

    fn instance_shutdown(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        match self.find(ctx, node)? {
            Some(c) => Ok(!c.is_up()),
            None => Err(self.not_found(node)),
        }
    }

    fn instance_metadata(
        &self,
        ctx: &CallContext,
        node: &Node,
    ) -> Result<Option<InstanceMetadata>> {
        match self.find(ctx, node)? {
            Some(c) => Ok(Some(self.metadata(&c))),
            None => Err(self.not_found(node)),
        }
    }
}

impl BulkInstances for ContainerInstances {
    /// One container listing (filtered by the cluster's label) answers every node.
    fn instances_batch(
        &self,
        ctx: &CallContext,
        nodes: &[Node],
        query: InstanceQuery,
    ) -> Result<Vec<Result<InstanceStatus>>> {
        let cfg = &self.shared.config;
        let label = format!("{}={}", cfg.cluster_label, cfg.cluster);
        let by_name: BTreeMap<String, Container> = self
            .shared
            .engine
            .list_by_label(ctx, &label)?
            .into_iter()
            .map(Container::from)
            .filter(|c| self.in_cluster(c))
            .map(|c| (c.short_name().to_string(), c))
            .collect();
        Ok(nodes
            .iter()
            .map(|node| {
                let found = self.container_name(node).and_then(|n| by_name.get(n));
                Ok(match found {
                    None => InstanceStatus::default(),
                    Some(c) => InstanceStatus {
                        exists: true,
                        shutdown: !c.is_up(),
                        metadata: query
                            .contains(InstanceQuery::METADATA)
                            .then(|| self.metadata(c)),
                    },
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let id = provider_id("kind", "kind-worker2");
        assert_eq!(id, "kind://kind/kind/kind-worker2");
        assert_eq!(parse_provider_id(&id), Some(("kind", "kind-worker2")));
        assert_eq!(parse_provider_id("kind://kind/other/x"), None);
        assert_eq!(parse_provider_id("aws:///us-east-1a/i-1"), None);
        assert_eq!(parse_provider_id("kind:///kind/x"), None);
    }

    #[test]
    fn image_names_become_label_values() {
        assert_eq!(
            label_value("docker.io/kindest/node:v1.33.1"),
            "docker.io-kindest-node-v1.33.1"
        );
        assert_eq!(
            label_value("localhost/x@sha256:ab"),
            "localhost-x-sha256-ab"
        );
        assert_eq!(label_value(&"a".repeat(80)).len(), 63);
        assert_eq!(label_value("-x-"), "x");
    }
}
