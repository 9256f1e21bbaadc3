//! The node as the shared node cache keeps it: [`CachedNode`], a compact, lossless form of a
//! (trimmed) k8s-openapi `Node`.
//!
//! Upstream caches the typed object. Here a cached `Node` cost ~4.5 KB (BENCHMARKS.md, "What a
//! node costs in the host"): 1.5 KB of it is k8s-openapi's inline struct, where every optional
//! field of the metadata, spec and status takes its room whether present or not, and most of the
//! rest are label and annotation maps whose keys and values repeat on every node. At 65,000 nodes
//! that alone was ~290 MiB. A `CachedNode` keeps
//!
//! - the fields the controllers read as their own fields: name, UID, resourceVersion,
//!   creation and deletion timestamps, labels and annotations (sorted pairs of shared strings),
//!   provider ID, pod CIDRs, taints, `unschedulable`, conditions and addresses;
//! - everything else (the rest of the metadata, the spec and the status: node info without its
//!   three per-machine IDs, daemon endpoints, runtime handlers, features, ...) as one compact JSON
//!   document, **interned**: nodes of one pool share it.
//!
//! Strings that repeat across nodes (label and annotation keys and values, the JSON rest) are
//! interned in a process-wide table that forgets a string once no cached node holds it (pruned
//! when the table has doubled since the last prune, so its cost stays proportional to what is
//! live). Per-node strings (name, UID, provider ID, ...) are shared `Arc<str>` too, so a listing
//! or a change copies no string.
//!
//! [`CachedNode::to_node`] gives the `Node` back, field for field as cached (a round trip is
//! lossless, tested below); providers get nodes that way, and so does the node controller's PUT.
//! Controllers read the accessors.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Serialize, Serializer};

/// A shared string.
pub type Str = Arc<str>;

/// Interned strings: one `Arc<str>` per distinct value that a cached node holds.
struct Interner {
    strings: HashSet<Str>,
    /// Prune when the table reaches this size.
    prune_at: usize,
}

/// A table below this size is never pruned.
const MIN_PRUNE: usize = 1024;

static STRINGS: LazyLock<Mutex<Interner>> = LazyLock::new(|| {
    Mutex::new(Interner {
        strings: HashSet::new(),
        prune_at: MIN_PRUNE,
    })
});

/// The shared copy of `s`.
pub fn intern(s: &str) -> Str {
    // Nothing in here can panic half-way through a change of the set.
    let mut table = STRINGS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = table.strings.get(s) {
        return found.clone();
    }
    if table.strings.len() >= table.prune_at {
        // A count of one is the table's own: no cached node holds the string any more, and
        // only `intern` (under this lock) can hand it out again.
        table.strings.retain(|s| Arc::strong_count(s) > 1);
        table.strings.shrink_to_fit();
        table.prune_at = (table.strings.len() * 2).max(MIN_PRUNE);
    }
    let new: Str = Str::from(s);
    table.strings.insert(new.clone());
    new
}

/// How many strings the table holds.
#[cfg(test)]
fn interned_count() -> usize {
    STRINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .strings
        .len()
}

/// A label or annotation map: pairs sorted by key, keys and values interned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pairs(Box<[(Str, Str)]>);

impl Pairs {
    fn from_map(map: BTreeMap<String, String>) -> Self {
        // A BTreeMap iterates in key order: the pairs are sorted.
        Self(map.iter().map(|(k, v)| (intern(k), intern(v))).collect())
    }

    fn to_map(&self) -> BTreeMap<String, String> {
        self.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.0[i].1)
    }

    /// The pairs in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (&**k, &**v))
    }
}

/// A node as the shared cache keeps it (see the module comment).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CachedNode {
    name: Option<Str>,
    uid: Option<Str>,
    resource_version: Option<Str>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<Pairs>,
    annotations: Option<Pairs>,
    provider_id: Option<Str>,
    pod_cidr: Option<Str>,
    pod_cidrs: Option<Box<[Str]>>,
    taints: Option<Box<[Taint]>>,
    unschedulable: Option<bool>,
    conditions: Option<Box<[NodeCondition]>>,
    addresses: Option<Box<[NodeAddress]>>,
    /// `status.nodeInfo`'s machineID, systemUUID and bootID, kept out of `rest` so that nodes
    /// of one pool share theirs.
    machine_ids: Option<Box<[Str; 3]>>,
    /// Whether the node had a `spec` / a `status` (possibly holding only fields kept above).
    has_spec: bool,
    has_status: bool,
    /// The rest of the node as JSON, interned; `None` when nothing is left.
    rest: Option<Str>,
}

fn vec_to_box<T>(v: Option<Vec<T>>) -> Option<Box<[T]>> {
    v.map(Vec::into_boxed_slice)
}

impl From<Node> for CachedNode {
    fn from(mut node: Node) -> Self {
        let meta = &mut node.metadata;
        let own = |s: Option<String>| s.map(Str::from);
        let mut cached = CachedNode {
            name: own(meta.name.take()),
            uid: own(meta.uid.take()),
            resource_version: own(meta.resource_version.take()),
            creation_timestamp: meta.creation_timestamp.take(),
            deletion_timestamp: meta.deletion_timestamp.take(),
            labels: meta.labels.take().map(Pairs::from_map),
            annotations: meta.annotations.take().map(Pairs::from_map),
            has_spec: node.spec.is_some(),
            has_status: node.status.is_some(),
            ..Default::default()
        };
        if let Some(spec) = node.spec.as_mut() {
            cached.provider_id = own(spec.provider_id.take());
            cached.pod_cidr = own(spec.pod_cidr.take());
            cached.pod_cidrs = spec.pod_cidrs.take().map(|cidrs| {
                cidrs
                    .into_iter()
                    // The first is usually `podCIDR` again: one string for both.
                    .map(|c| match &cached.pod_cidr {
                        Some(first) if **first == *c => first.clone(),
                        _ => Str::from(c),
                    })
                    .collect()
            });
            cached.taints = vec_to_box(spec.taints.take());
            cached.unschedulable = spec.unschedulable.take();
            if *spec == NodeSpec::default() {
                node.spec = None;
            }
        }
        if let Some(status) = node.status.as_mut() {
            cached.conditions = vec_to_box(status.conditions.take());
            cached.addresses = vec_to_box(status.addresses.take());
            if let Some(info) = status.node_info.as_mut() {
                let ids = [
                    std::mem::take(&mut info.machine_id),
                    std::mem::take(&mut info.system_uuid),
                    std::mem::take(&mut info.boot_id),
                ];
                if ids.iter().any(|id| !id.is_empty()) {
                    cached.machine_ids = Some(Box::new(ids.map(Str::from)));
                }
            }
            if *status == NodeStatus::default() {
                node.status = None;
            }
        }
        if node != Node::default() {
            // Serialising a k8s-openapi type to a string cannot fail.
            let json = serde_json::to_string(&node).unwrap_or_default();
            cached.rest = Some(intern(&json));
        }
        cached
    }
}

impl CachedNode {
    /// The node as k8s-openapi's `Node` (the same fields as the one it was made from).
    pub fn to_node(&self) -> Node {
        let mut node: Node = self
            .rest
            .as_deref()
            // Made by `From<Node>` from a `Node`: it parses.
            .and_then(|json| serde_json::from_str(json).ok())
            .unwrap_or_default();
        let s = |v: &Option<Str>| v.as_deref().map(String::from);
        let meta = &mut node.metadata;
        meta.name = s(&self.name);
        meta.uid = s(&self.uid);
        meta.resource_version = s(&self.resource_version);
        meta.creation_timestamp.clone_from(&self.creation_timestamp);
        meta.deletion_timestamp.clone_from(&self.deletion_timestamp);
        meta.labels = self.labels.as_ref().map(Pairs::to_map);
        meta.annotations = self.annotations.as_ref().map(Pairs::to_map);
        if self.has_spec {
            let spec = node.spec.get_or_insert_with(Default::default);
            spec.provider_id = s(&self.provider_id);
            spec.pod_cidr = s(&self.pod_cidr);
            spec.pod_cidrs = self
                .pod_cidrs
                .as_ref()
                .map(|c| c.iter().map(|c| c.to_string()).collect());
            spec.taints = self.taints.as_ref().map(|t| t.to_vec());
            spec.unschedulable = self.unschedulable;
        }
        if self.has_status {
            let status = node.status.get_or_insert_with(Default::default);
            status.conditions = self.conditions.as_ref().map(|c| c.to_vec());
            status.addresses = self.addresses.as_ref().map(|a| a.to_vec());
            if let (Some(info), Some(ids)) = (status.node_info.as_mut(), &self.machine_ids) {
                info.machine_id = ids[0].to_string();
                info.system_uuid = ids[1].to_string();
                info.boot_id = ids[2].to_string();
            }
        }
        node
    }

    /// `metadata.name` ("" when absent).
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// `metadata.name`, shared.
    pub fn name_str(&self) -> Option<&Str> {
        self.name.as_ref()
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// `metadata.creationTimestamp`.
    pub fn creation_timestamp(&self) -> Option<&Time> {
        self.creation_timestamp.as_ref()
    }

    /// `metadata.deletionTimestamp`.
    pub fn deletion_timestamp(&self) -> Option<&Time> {
        self.deletion_timestamp.as_ref()
    }

    /// `metadata.labels`.
    pub fn labels(&self) -> Option<&Pairs> {
        self.labels.as_ref()
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.as_ref().and_then(|l| l.get(key))
    }

    /// `metadata.annotations`.
    pub fn annotations(&self) -> Option<&Pairs> {
        self.annotations.as_ref()
    }

    /// One annotation's value.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref().and_then(|a| a.get(key))
    }

    /// `spec.providerID`.
    pub fn provider_id(&self) -> Option<&str> {
        self.provider_id.as_deref()
    }

    /// `spec.providerID`, shared.
    pub fn provider_id_str(&self) -> Option<&Str> {
        self.provider_id.as_ref()
    }

    /// `spec.podCIDR`.
    pub fn pod_cidr(&self) -> Option<&str> {
        self.pod_cidr.as_deref()
    }

    /// `spec.podCIDRs`.
    pub fn pod_cidrs(&self) -> Option<&[Str]> {
        self.pod_cidrs.as_deref()
    }

    /// `spec.taints` (empty when absent).
    pub fn taints(&self) -> &[Taint] {
        self.taints.as_deref().unwrap_or_default()
    }

    /// `spec.unschedulable`.
    pub fn unschedulable(&self) -> Option<bool> {
        self.unschedulable
    }

    /// `status.conditions` (empty when absent).
    pub fn conditions(&self) -> &[NodeCondition] {
        self.conditions.as_deref().unwrap_or_default()
    }

    /// The first condition of this type.
    pub fn condition(&self, type_: &str) -> Option<&NodeCondition> {
        self.conditions().iter().find(|c| c.type_ == type_)
    }

    /// `status.addresses`, as cached (`None` when absent).
    pub fn addresses(&self) -> Option<&[NodeAddress]> {
        self.addresses.as_deref()
    }
}

/// A node as provider calls take it: k8s-openapi's `Node` (tests, tools) or the shared cache's
/// [`CachedNode`], or an `Arc` of either. Serialised, it is the `Node`'s JSON.
pub trait NodeRef: Serialize + Send + Sync {
    /// `metadata.name` ("" when absent).
    fn node_name(&self) -> &str;
    /// `metadata.uid`.
    fn node_uid(&self) -> Option<&str>;
    /// `spec.providerID` ("" when absent).
    fn node_provider_id(&self) -> &str;
}

impl NodeRef for Node {
    fn node_name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn node_uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }
    fn node_provider_id(&self) -> &str {
        self.spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or_default()
    }
}

impl NodeRef for CachedNode {
    fn node_name(&self) -> &str {
        self.name()
    }
    fn node_uid(&self) -> Option<&str> {
        self.uid()
    }
    fn node_provider_id(&self) -> &str {
        self.provider_id().unwrap_or_default()
    }
}

impl<T: NodeRef> NodeRef for Arc<T> {
    fn node_name(&self) -> &str {
        (**self).node_name()
    }
    fn node_uid(&self) -> Option<&str> {
        (**self).node_uid()
    }
    fn node_provider_id(&self) -> &str {
        (**self).node_provider_id()
    }
}

impl crate::runtime::informer::Cache for CachedNode {
    type Object = Node;
    fn from_object(node: Node) -> Self {
        node.into()
    }
    fn to_object(&self) -> Node {
        self.to_node()
    }
    fn key(&self) -> String {
        // Nodes are cluster-scoped: the key is the name.
        self.name().to_string()
    }
}

/// Serialised as the `Node` it stands for.
impl Serialize for CachedNode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_node().serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn full() -> Node {
        serde_json::from_value(json!({
            "metadata": {
                "name": "n1", "uid": "u-1", "resourceVersion": "7", "generation": 3,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-02T00:00:00Z",
                "finalizers": ["example.com/f"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "ux"}],
                "labels": {"kubernetes.io/hostname": "n1", "a": "b"},
                "annotations": {"k": "v"}
            },
            "spec": {
                "providerID": "fake://n1", "podCIDR": "10.0.0.0/24",
                "podCIDRs": ["10.0.0.0/24", "fd00::/64"], "unschedulable": true,
                "taints": [{"key": "t", "effect": "NoSchedule"}], "externalID": "legacy"
            },
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}],
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                             "kernelVersion": "6.1", "osImage": "Debian", "containerRuntimeVersion": "c",
                             "kubeletVersion": "v1.35.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"},
                "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                "runtimeHandlers": [{"name": "runc"}],
                "phase": "Running"
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_round_trip_is_lossless() {
        for node in [
            full(),
            Node::default(),
            serde_json::from_value(json!({"metadata": {"name": "bare"}, "spec": {}, "status": {}}))
                .unwrap(),
            serde_json::from_value(json!({"metadata": {"name": "x", "labels": {}},
                "spec": {"providerID": ""}, "status": {"nodeInfo": {"machineID": "", "systemUUID": "",
                "bootID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
                "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "", "architecture": ""}}}))
            .unwrap(),
        ] {
            let cached = CachedNode::from(node.clone());
            assert_eq!(cached.to_node(), node);
            assert_eq!(
                serde_json::to_value(&cached).unwrap(),
                serde_json::to_value(&node).unwrap()
            );
        }
    }

    #[test]
    fn accessors_read_the_kept_fields() {
        let n = CachedNode::from(full());
        assert_eq!(n.name(), "n1");
        assert_eq!(n.uid(), Some("u-1"));
        assert_eq!(n.resource_version(), Some("7"));
        assert!(n.deletion_timestamp().is_some());
        assert_eq!(n.label("a"), Some("b"));
        assert_eq!(n.label("kubernetes.io/hostname"), Some("n1"));
        assert_eq!(n.label("missing"), None);
        assert_eq!(n.annotation("k"), Some("v"));
        assert_eq!(n.provider_id(), Some("fake://n1"));
        assert_eq!(n.pod_cidr(), Some("10.0.0.0/24"));
        assert_eq!(n.pod_cidrs().unwrap().len(), 2);
        assert_eq!(n.taints()[0].key, "t");
        assert_eq!(n.unschedulable(), Some(true));
        assert_eq!(n.condition("Ready").unwrap().status, "True");
        assert_eq!(n.addresses().unwrap()[0].address, "10.1.0.1");
        assert!(CachedNode::default().taints().is_empty());
        assert_eq!(CachedNode::default().name(), "");
    }

    #[test]
    fn nodes_of_one_pool_share_their_repeated_strings() {
        let mk = |i: usize| {
            let mut n = full();
            n.metadata.name = Some(format!("pool-node-{i}"));
            n.status
                .as_mut()
                .unwrap()
                .node_info
                .as_mut()
                .unwrap()
                .machine_id = format!("m{i}");
            CachedNode::from(n)
        };
        let (a, b) = (mk(1), mk(2));
        let (ra, rb) = (a.rest.as_ref().unwrap(), b.rest.as_ref().unwrap());
        assert!(Arc::ptr_eq(ra, rb), "the JSON rest is shared");
        let (la, lb) = (&a.labels.as_ref().unwrap().0, &b.labels.as_ref().unwrap().0);
        assert!(Arc::ptr_eq(&la[0].0, &lb[0].0), "label keys are shared");
        assert_eq!(
            a.to_node().status.unwrap().node_info.unwrap().machine_id,
            "m1"
        );
        assert_eq!(
            b.to_node().status.unwrap().node_info.unwrap().machine_id,
            "m2"
        );
    }

    #[test]
    fn the_table_forgets_strings_no_node_holds() {
        let unique = |i: usize| format!("cached-node-test-only-{i}");
        let held: Vec<Str> = (0..10).map(|i| intern(&unique(i))).collect();
        // Enough short-lived strings to force prunes.
        for i in 10..(4 * MIN_PRUNE + 10) {
            drop(intern(&unique(i)));
        }
        assert!(interned_count() < 4 * MIN_PRUNE, "{}", interned_count());
        for (i, s) in held.iter().enumerate() {
            assert!(Arc::ptr_eq(s, &intern(&unique(i))), "held strings stay");
        }
    }
}
