//! The decision part of a node sync: the host set computed once per node listing ([`Round`]),
//! and for each service a comparison with its last-synced set that stores the fresh set
//! *before* the cloud is called (so a concurrent or repeated node sync with the same nodes does
//! not call the cloud again; a failure is retried through a full EnsureLoadBalancer on the
//! service queue instead).
//!
//! Beyond upstream (issue 32: host updates proportional to the change):
//!
//! - A stored set is not a copy of the node list (upstream keeps the `[]*v1.Node` of the last
//!   sync per service) but the sorted `(name, providerID)` pairs upstream's
//!   `nodesSufficientlyEqual` compares ([`HostKeys`]): ~0.1 KB per host, and it pins no
//!   superseded version of a node in memory (a kubelet's status updates replace every cached
//!   node within minutes; stored `Arc<Node>`s would keep the old ones).
//! - Equal sets are one `Arc`, shared by every service synced to them: a listing whose keys
//!   equal the controller's latest set reuses it ([`Round::new`]'s `latest`), EnsureLoadBalancer
//!   included, so after convergence all load balancers hold the same set however many ensures
//!   built it. A service whose stored set *is* the round's `Arc` is skipped in O(1); the
//!   difference between a stored set and the fresh one ([`HostDelta`]) is a merge of two sorted
//!   lists, computed once per distinct stored set, not once per service.
//! - A removed host travels to the plugin as the cache's current node when it is still listed
//!   with the same providerID (e.g. it became excluded), else as a node carrying only its name
//!   and its stored providerID (deleted, or its old form after a providerID change):
//!   docs/abi-1.2.md. The delta's Node JSON for the ABI 1.2 incremental call is serialised
//!   once for all services sharing it ([`HostDelta::lists`]).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ccm_provider_abi::ProviderError;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::predicates::stable_node_set;
use crate::provider::HostList;
use crate::runtime::cached_node::{intern, Str};
use crate::runtime::CachedNode;

/// A host set of one listing: the nodes, sorted by name.
pub type HostSet = Arc<Vec<Arc<CachedNode>>>;

/// A host as a stored set remembers it: what upstream's `nodesSufficientlyEqual` compares (the
/// cached node's own strings, shared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostKey {
    name: Str,
    provider_id: Str,
}

impl HostKey {
    fn of(n: &CachedNode) -> Self {
        Self {
            name: n.name_str().cloned().unwrap_or_else(|| intern("")),
            provider_id: n.provider_id_str().cloned().unwrap_or_else(|| intern("")),
        }
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A node carrying only the key: how a removed host that the cache no longer holds in this
    /// form travels to the plugin.
    fn stub(&self) -> CachedNode {
        CachedNode::from(Node {
            metadata: ObjectMeta {
                name: Some(self.name.to_string()),
                ..Default::default()
            },
            spec: (!self.provider_id.is_empty()).then(|| NodeSpec {
                provider_id: Some(self.provider_id.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// A stored host set: the keys of a [`HostSet`], sorted by name (node names are unique).
pub type HostKeys = Arc<[HostKey]>;

/// A service's last-synced host set and the number of the node listing it came from (the
/// controller numbers its listings in order: node-sync rounds and EnsureLoadBalancer's).
#[derive(Debug, Clone)]
pub struct Stored {
    /// The listing's number.
    pub listing: u64,
    /// The hosts.
    pub hosts: HostKeys,
}

/// Last-synced host sets, per service key.
pub type LastSynced = HashMap<String, Stored>;

/// The difference between a stored host set and the fresh one.
#[derive(Debug, Default)]
pub struct HostDelta {
    /// Hosts of the stored set that left (or whose providerID changed: the old form).
    pub removed: Vec<Arc<CachedNode>>,
    /// Hosts of the fresh set that joined (or whose providerID changed: the new form).
    pub added: Vec<Arc<CachedNode>>,
    lists: OnceLock<Result<(HostList, HostList), ProviderError>>,
}

impl HostDelta {
    /// No host joined or left.
    pub fn is_empty(&self) -> bool {
        self.removed.is_empty() && self.added.is_empty()
    }

    /// `(added, removed)` serialised for the plugin, once for every service sharing the delta.
    pub fn lists(&self) -> Result<(HostList, HostList), ProviderError> {
        self.lists
            .get_or_init(|| Ok((HostList::new(&self.added)?, HostList::new(&self.removed)?)))
            .clone()
    }
}

fn name(n: &CachedNode) -> &str {
    n.name()
}

fn provider_id(n: &CachedNode) -> &str {
    n.provider_id().unwrap_or_default()
}

/// One node listing, made once and shared by every service that uses it (a node sync's round,
/// or one EnsureLoadBalancer): the host set (upstream's `stableNodeSetPredicates`), its keys,
/// and the deltas from the stored sets.
pub struct Round {
    listing: u64,
    /// Every listed node, sorted by name (removed hosts are looked up here).
    all: Vec<Arc<CachedNode>>,
    hosts: HostSet,
    keys: HostKeys,
    /// Deltas by the address of the stored set they start from (the set is kept alive with it,
    /// so the address cannot be reused during the round).
    deltas: Mutex<HashMap<usize, (HostKeys, Arc<HostDelta>)>>,
}

impl Round {
    /// A round over the listed nodes, the controller's listing number `listing`. When its keys
    /// equal `latest` (the controller's most recent set), the round uses that `Arc`, so that
    /// equal stored sets stay one.
    pub fn new(mut listed: Vec<Arc<CachedNode>>, listing: u64, latest: Option<&HostKeys>) -> Self {
        listed.sort_unstable_by(|a, b| name(a).cmp(name(b)));
        let hosts: Vec<Arc<CachedNode>> = listed
            .iter()
            .filter(|n| stable_node_set(n))
            .cloned()
            .collect();
        let keys: Vec<HostKey> = hosts.iter().map(|n| HostKey::of(n)).collect();
        let keys = match latest {
            Some(l) if l[..] == keys[..] => l.clone(),
            _ => keys.into(),
        };
        Self {
            listing,
            all: listed,
            hosts: Arc::new(hosts),
            keys,
            deltas: Mutex::default(),
        }
    }

    /// The fresh set.
    pub fn hosts(&self) -> &HostSet {
        &self.hosts
    }

    /// The fresh set's keys, as services store them.
    pub fn keys(&self) -> &HostKeys {
        &self.keys
    }

    /// What a service stores when it is synced to this round.
    pub fn stored(&self) -> Stored {
        Stored {
            listing: self.listing,
            hosts: self.keys.clone(),
        }
    }

    /// The delta from `old` to the fresh set, computed once per distinct `old`.
    pub fn delta_from(&self, old: &HostKeys) -> Arc<HostDelta> {
        let addr = Arc::as_ptr(old) as *const HostKey as usize;
        let mut deltas = self.deltas.lock().unwrap_or_else(|p| p.into_inner());
        deltas
            .entry(addr)
            .or_insert_with(|| (old.clone(), Arc::new(self.delta(old))))
            .1
            .clone()
    }

    /// Merge of the two sorted key lists: hosts are the same when name and providerID are.
    fn delta(&self, old: &[HostKey]) -> HostDelta {
        let new = &self.keys[..];
        let mut delta = HostDelta::default();
        let (mut i, mut j) = (0, 0);
        loop {
            let order = match (old.get(i), new.get(j)) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some(o), Some(n)) => o.name.cmp(&n.name),
            };
            match order {
                Ordering::Less => {
                    delta.removed.push(self.removed_node(&old[i]));
                    i += 1;
                }
                Ordering::Greater => {
                    delta.added.push(self.hosts[j].clone());
                    j += 1;
                }
                Ordering::Equal => {
                    if old[i].provider_id != new[j].provider_id {
                        delta.removed.push(self.removed_node(&old[i]));
                        delta.added.push(self.hosts[j].clone());
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        delta
    }

    /// A removed host for the plugin: the listed node when it still has the stored providerID,
    /// else a node carrying only the stored key.
    fn removed_node(&self, key: &HostKey) -> Arc<CachedNode> {
        match self.all.binary_search_by(|n| name(n).cmp(key.name())) {
            Ok(i) if provider_id(&self.all[i]) == &*key.provider_id => self.all[i].clone(),
            _ => Arc::new(key.stub()),
        }
    }
}

/// What a node sync does for one service.
#[derive(Debug)]
pub enum NodeSyncPlan {
    /// Listing nodes failed: no cloud call, retry the service.
    Retry(String),
    /// The stored set comes from a listing newer than the round's (an EnsureLoadBalancer ran
    /// while the round was under way): plan again with a fresh listing, as upstream (which
    /// lists per service) would. Nothing was stored.
    Stale,
    /// The host set did not change.
    Skip,
    /// Update the load balancer to `hosts` (already stored as last-synced); `delta` is the
    /// change from the stored set, `None` when the service had none stored.
    Update {
        /// The whole fresh set.
        hosts: HostSet,
        /// The change from the stored set.
        delta: Option<Arc<HostDelta>>,
    },
}

/// Plan the node sync of service `key` in `round`. Reading the last-synced set and storing the
/// new one happen under one lock held by the caller (`last`), so two syncs of the same service
/// cannot interleave between them.
pub fn plan(last: &mut LastSynced, key: &str, round: Result<&Round, String>) -> NodeSyncPlan {
    let round = match round {
        Ok(r) => r,
        Err(e) => return NodeSyncPlan::Retry(e),
    };
    if last.get(key).is_some_and(|s| s.listing > round.listing) {
        return NodeSyncPlan::Stale;
    }
    let new = round.keys();
    let delta = match last
        .insert(key.to_string(), round.stored())
        .map(|s| s.hosts)
    {
        Some(old) if Arc::ptr_eq(&old, new) => return NodeSyncPlan::Skip,
        Some(old) => {
            let delta = round.delta_from(&old);
            if delta.is_empty() {
                return NodeSyncPlan::Skip;
            }
            Some(delta)
        }
        // First sync of this service: different unless both are empty (upstream compares an
        // empty stored set).
        None if new.is_empty() => return NodeSyncPlan::Skip,
        None => None,
    };
    NodeSyncPlan::Update {
        hosts: round.hosts().clone(),
        delta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(name: &str, pid: &str) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(pid.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(name: &str, pid: &str) -> Arc<CachedNode> {
        Arc::new(plain(name, pid).into())
    }

    fn excluded(name: &str, pid: &str) -> Arc<CachedNode> {
        let mut n = plain(name, pid);
        n.metadata.labels = Some(
            [(
                crate::runtime::well_known::EXCLUDE_LB_LABEL.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        Arc::new(n.into())
    }

    fn names(v: &[Arc<CachedNode>]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|n| n.name().to_string()).collect();
        v.sort();
        v
    }

    fn key_names(v: &HostKeys) -> Vec<&str> {
        v.iter().map(HostKey::name).collect()
    }

    fn set(v: Vec<Arc<CachedNode>>) -> Stored {
        Round::new(v, 0, None).stored()
    }

    fn round(v: Vec<Arc<CachedNode>>) -> Round {
        Round::new(v, 1, None)
    }

    #[test]
    fn list_error_retries_without_touching_last_synced() {
        let mut last = LastSynced::new();
        last.insert("ns/a".into(), set(vec![node("n1", "p1")]));
        let p = plan(&mut last, "ns/a", Err("boom".into()));
        assert!(
            matches!(p, NodeSyncPlan::Retry(ref e) if e == "boom"),
            "{p:?}"
        );
        assert_eq!(key_names(&last["ns/a"].hosts), ["n1"]);
    }

    #[test]
    fn first_sync_updates_and_stores_before_the_call() {
        let mut last = LastSynced::new();
        let r = round(vec![node("n2", "p2"), node("n1", "p1")]);
        let p = plan(&mut last, "ns/a", Ok(&r));
        let NodeSyncPlan::Update { hosts, delta } = p else {
            panic!("expected an update, got {p:?}")
        };
        assert!(delta.is_none(), "nothing stored: no delta");
        assert_eq!(names(&hosts), ["n1", "n2"]);
        assert_eq!(key_names(&last["ns/a"].hosts), ["n1", "n2"], "sorted");
        // A repeated sync with the same nodes (e.g. after the update failed) does nothing,
        // in the same round (the stored set is the round's) or a new one.
        assert!(matches!(
            plan(&mut last, "ns/a", Ok(&r)),
            NodeSyncPlan::Skip
        ));
        let again = round(vec![node("n2", "p2"), node("n1", "p1")]);
        assert!(matches!(
            plan(&mut last, "ns/a", Ok(&again)),
            NodeSyncPlan::Skip
        ));
    }

    #[test]
    fn provider_id_change_and_same_size_other_node_update() {
        let mut last = LastSynced::new();
        last.insert("k".into(), set(vec![node("n1", "p1"), node("n2", "p2")]));
        assert!(matches!(
            plan(
                &mut last,
                "k",
                Ok(&round(vec![node("n1", "p1"), node("n2", "p2")]))
            ),
            NodeSyncPlan::Skip
        ));
        let NodeSyncPlan::Update {
            delta: Some(delta), ..
        } = plan(
            &mut last,
            "k",
            Ok(&round(vec![node("n1", "p1"), node("n2", "changed")])),
        )
        else {
            panic!("expected an update with a delta")
        };
        // A providerID change: the old form leaves (as a node with only name and the old
        // providerID: the listing holds the new form), the new one joins.
        assert_eq!(names(&delta.removed), ["n2"]);
        assert_eq!(*delta.removed[0], *node("n2", "p2"));
        assert_eq!(names(&delta.added), ["n2"]);
        assert_eq!(delta.added[0].provider_id(), Some("changed"));
        let NodeSyncPlan::Update {
            delta: Some(delta), ..
        } = plan(
            &mut last,
            "k",
            Ok(&round(vec![node("n1", "p1"), node("n3", "p3")])),
        )
        else {
            panic!("expected an update with a delta")
        };
        assert_eq!(names(&delta.removed), ["n2"]);
        assert_eq!(names(&delta.added), ["n3"]);
    }

    #[test]
    fn a_removed_host_still_listed_travels_as_the_listed_node() {
        let mut last = LastSynced::new();
        last.insert("k".into(), set(vec![node("n1", "p1"), node("n2", "p2")]));
        let now_excluded = excluded("n2", "p2");
        let r = round(vec![node("n1", "p1"), now_excluded.clone()]);
        let NodeSyncPlan::Update {
            delta: Some(delta),
            hosts,
        } = plan(&mut last, "k", Ok(&r))
        else {
            panic!("expected an update with a delta")
        };
        assert_eq!(names(&hosts), ["n1"]);
        assert!(delta.added.is_empty());
        assert!(
            Arc::ptr_eq(&delta.removed[0], &now_excluded),
            "the listed node itself, with its labels"
        );
        assert_eq!(key_names(&last["k"].hosts), ["n1"], "excluded: not stored");
    }

    #[test]
    fn one_delta_per_distinct_stored_set() {
        let mut last = LastSynced::new();
        let before = set(vec![node("n1", "p1")]);
        for k in ["a", "b", "c"] {
            last.insert(k.into(), before.clone());
        }
        last.insert("d".into(), set(vec![node("n1", "p1"), node("n2", "p2")]));
        let r = round(vec![node("n1", "p1"), node("n2", "p2")]);
        let deltas: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|k| match plan(&mut last, k, Ok(&r)) {
                NodeSyncPlan::Update {
                    delta: Some(d),
                    hosts,
                } => {
                    assert!(Arc::ptr_eq(&hosts, r.hosts()), "the round's one set");
                    d
                }
                p => panic!("expected an update, got {p:?}"),
            })
            .collect();
        assert!(Arc::ptr_eq(&deltas[0], &deltas[1]) && Arc::ptr_eq(&deltas[1], &deltas[2]));
        assert_eq!(names(&deltas[0].added), ["n2"]);
        assert!(deltas[0].removed.is_empty());
        // The same set content under another Arc: compared, found equal, skipped.
        assert!(matches!(plan(&mut last, "d", Ok(&r)), NodeSyncPlan::Skip));
        // Every service now stores the round's one set.
        for k in ["a", "b", "c", "d"] {
            assert!(Arc::ptr_eq(&last[k].hosts, r.keys()), "{k}");
        }
        // Serialised once for all services sharing the delta.
        let (a1, _) = deltas[0].lists().unwrap();
        let (a2, _) = deltas[2].lists().unwrap();
        assert_eq!(a1.len(), 1);
        assert_eq!(a1.bytes(), a2.bytes());
    }

    #[test]
    fn a_listing_equal_to_the_latest_set_shares_it() {
        let first = round(vec![node("n1", "p1"), node("n2", "p2")]);
        let latest = first.keys().clone();
        // Same hosts in another order, other Node values, an excluded node beside them.
        let same = Round::new(
            vec![node("n2", "p2"), excluded("n3", "p3"), node("n1", "p1")],
            2,
            Some(&latest),
        );
        assert!(Arc::ptr_eq(same.keys(), &latest));
        let other = Round::new(vec![node("n1", "p1")], 3, Some(&latest));
        assert!(!Arc::ptr_eq(other.keys(), &latest));
        assert_eq!(key_names(other.keys()), ["n1"]);
        let pid_changed = Round::new(vec![node("n1", "p1"), node("n2", "x")], 4, Some(&latest));
        assert!(!Arc::ptr_eq(pid_changed.keys(), &latest));
    }

    #[test]
    fn a_set_stored_from_a_newer_listing_is_not_overwritten() {
        let mut last = LastSynced::new();
        let fresher = Round::new(vec![node("n1", "p1"), node("n2", "p2")], 2, None).stored();
        last.insert("k".into(), fresher);
        let p = plan(&mut last, "k", Ok(&round(vec![node("n1", "p1")])));
        assert!(matches!(p, NodeSyncPlan::Stale), "{p:?}");
        assert_eq!(key_names(&last["k"].hosts), ["n1", "n2"]);
        let fresh = Round::new(vec![node("n1", "p1"), node("n2", "p2")], 3, None);
        assert!(matches!(
            plan(&mut last, "k", Ok(&fresh)),
            NodeSyncPlan::Skip
        ));
    }

    #[test]
    fn a_deleted_host_travels_as_its_name_and_stored_provider_id() {
        let mut last = LastSynced::new();
        last.insert("k".into(), set(vec![node("n1", "p1"), node("n2", "p2")]));
        let NodeSyncPlan::Update {
            delta: Some(delta), ..
        } = plan(&mut last, "k", Ok(&round(vec![node("n2", "p2")])))
        else {
            panic!("expected an update with a delta")
        };
        assert_eq!(delta.removed.len(), 1);
        assert_eq!(*delta.removed[0], *node("n1", "p1"));
    }
}
