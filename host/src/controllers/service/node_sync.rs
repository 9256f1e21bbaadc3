//! The decision part of a node sync: the host set computed once per sync ([`Round`]), and for
//! each service a comparison with its last-synced set that stores the fresh set *before* the
//! cloud is called (so a concurrent or repeated node sync with the same nodes does not call the
//! cloud again; a failure is retried through a full EnsureLoadBalancer on the service queue
//! instead).
//!
//! Beyond upstream (issue 32: host updates proportional to the change): the fresh set is one
//! shared `Arc` for every service of the sync (upstream copies the node list per service), a
//! service whose stored set *is* that `Arc` is skipped without looking at the nodes, and the
//! difference between a stored set and the fresh one ([`HostDelta`], by name and providerID as
//! upstream's `nodesSufficientlyEqual`) is computed once per distinct stored set, not once per
//! service: all services synced by the previous round share its set, so a round costs one O(N)
//! comparison plus O(1) per service. The delta's Node JSON for the ABI 1.2 incremental call is
//! serialised once as well ([`HostDelta::lists`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use ccm_provider_abi::ProviderError;
use k8s_openapi::api::core::v1::Node;

use super::predicates::stable_node_set;
use crate::provider::HostList;

/// A host set, shared by every service synced to it.
pub type HostSet = Arc<Vec<Arc<Node>>>;

/// A service's last-synced host set and the number of the node listing it came from (the
/// controller numbers its listings in order: node-sync rounds and EnsureLoadBalancer's).
#[derive(Debug, Clone)]
pub struct Stored {
    /// The listing's number.
    pub listing: u64,
    /// The hosts.
    pub hosts: HostSet,
}

/// Last-synced host sets, per service key.
pub type LastSynced = HashMap<String, Stored>;

/// The difference between a stored host set and the fresh one.
#[derive(Debug, Default)]
pub struct HostDelta {
    /// Hosts of the stored set that left (or whose providerID changed: the old form).
    pub removed: Vec<Arc<Node>>,
    /// Hosts of the fresh set that joined (or whose providerID changed: the new form).
    pub added: Vec<Arc<Node>>,
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

fn name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or_default()
}

fn provider_id(n: &Node) -> &str {
    n.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// Upstream's `nodesSufficientlyEqual` as a difference: hosts are the same when name and
/// providerID are. Stored sets are re-filtered (a node stored before it became unstable does
/// not count).
pub fn host_delta(old: &[Arc<Node>], new: &[Arc<Node>]) -> HostDelta {
    let old_by_name: HashMap<&str, &Arc<Node>> = old
        .iter()
        .filter(|n| stable_node_set(n))
        .map(|n| (name(n), n))
        .collect();
    let new_by_name: HashMap<&str, &Arc<Node>> = new.iter().map(|n| (name(n), n)).collect();
    let mut delta = HostDelta::default();
    for (k, n) in &old_by_name {
        match new_by_name.get(k) {
            Some(m) if provider_id(m) == provider_id(n) => {}
            _ => delta.removed.push(Arc::clone(n)),
        }
    }
    for (k, n) in &new_by_name {
        match old_by_name.get(k) {
            Some(m) if provider_id(m) == provider_id(n) => {}
            _ => delta.added.push(Arc::clone(n)),
        }
    }
    // Deterministic order (the plugin gets them in this order).
    delta.removed.sort_by(|a, b| name(a).cmp(name(b)));
    delta.added.sort_by(|a, b| name(a).cmp(name(b)));
    delta
}

/// One node sync: the fresh host set, computed once, and the deltas from the stored sets.
pub struct Round {
    listing: u64,
    hosts: HostSet,
    /// Deltas by the address of the stored set they start from (the set is kept alive with it,
    /// so the address cannot be reused during the round).
    deltas: Mutex<HashMap<usize, (HostSet, Arc<HostDelta>)>>,
}

impl Round {
    /// A round over the listed nodes (filtered by upstream's `stableNodeSetPredicates`), the
    /// controller's listing number `listing`.
    pub fn new(listed: Vec<Arc<Node>>, listing: u64) -> Self {
        Self {
            listing,
            hosts: Arc::new(listed.into_iter().filter(|n| stable_node_set(n)).collect()),
            deltas: Mutex::default(),
        }
    }

    /// The fresh host set.
    pub fn hosts(&self) -> &HostSet {
        &self.hosts
    }

    /// The delta from `old` to the fresh set, computed once per distinct `old`.
    pub fn delta_from(&self, old: &HostSet) -> Arc<HostDelta> {
        let addr = Arc::as_ptr(old) as usize;
        let mut deltas = self.deltas.lock().unwrap_or_else(|p| p.into_inner());
        deltas
            .entry(addr)
            .or_insert_with(|| (old.clone(), Arc::new(host_delta(old, &self.hosts))))
            .1
            .clone()
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
    let new = round.hosts().clone();
    let stored = Stored {
        listing: round.listing,
        hosts: new.clone(),
    };
    let delta = match last.insert(key.to_string(), stored).map(|s| s.hosts) {
        Some(old) if Arc::ptr_eq(&old, &new) => return NodeSyncPlan::Skip,
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
    NodeSyncPlan::Update { hosts: new, delta }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn node(name: &str, pid: &str) -> Arc<Node> {
        Arc::new(Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(pid.into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn names(v: &[Arc<Node>]) -> Vec<String> {
        let mut v: Vec<String> = v.iter().map(|n| n.metadata.name.clone().unwrap()).collect();
        v.sort();
        v
    }

    fn set(v: Vec<Arc<Node>>) -> Stored {
        Stored {
            listing: 0,
            hosts: Arc::new(v),
        }
    }

    fn round(v: Vec<Arc<Node>>) -> Round {
        Round::new(v, 1)
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
        assert_eq!(names(&last["ns/a"].hosts), ["n1"]);
    }

    #[test]
    fn first_sync_updates_and_stores_before_the_call() {
        let mut last = LastSynced::new();
        let r = round(vec![node("n1", "p1"), node("n2", "p2")]);
        let p = plan(&mut last, "ns/a", Ok(&r));
        let NodeSyncPlan::Update { hosts, delta } = p else {
            panic!("expected an update, got {p:?}")
        };
        assert!(delta.is_none(), "nothing stored: no delta");
        assert_eq!(names(&hosts), ["n1", "n2"]);
        assert_eq!(names(&last["ns/a"].hosts), ["n1", "n2"]);
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
        // A providerID change: the old form leaves, the new one joins.
        assert_eq!(names(&delta.removed), ["n2"]);
        assert_eq!(names(&delta.added), ["n2"]);
        assert_eq!(
            delta.added[0].spec.as_ref().unwrap().provider_id.as_deref(),
            Some("changed")
        );
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
        // Serialised once for all services sharing the delta.
        let (a1, _) = deltas[0].lists().unwrap();
        let (a2, _) = deltas[2].lists().unwrap();
        assert_eq!(a1.len(), 1);
        assert_eq!(a1.bytes(), a2.bytes());
    }

    #[test]
    fn a_set_stored_from_a_newer_listing_is_not_overwritten() {
        let mut last = LastSynced::new();
        let fresher = Stored {
            listing: 2,
            hosts: Arc::new(vec![node("n1", "p1"), node("n2", "p2")]),
        };
        last.insert("k".into(), fresher);
        let p = plan(&mut last, "k", Ok(&round(vec![node("n1", "p1")])));
        assert!(matches!(p, NodeSyncPlan::Stale), "{p:?}");
        assert_eq!(names(&last["k"].hosts), ["n1", "n2"]);
        let fresh = Round::new(vec![node("n1", "p1"), node("n2", "p2")], 3);
        assert!(matches!(
            plan(&mut last, "k", Ok(&fresh)),
            NodeSyncPlan::Skip
        ));
    }

    #[test]
    fn filters_unstable_nodes_on_both_sides() {
        let mut excluded = (*node("n2", "p2")).clone();
        excluded.metadata.labels = Some(
            [(
                crate::runtime::well_known::EXCLUDE_LB_LABEL.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        let mut last = LastSynced::new();
        // The stored set held n2 before it became excluded: the fresh set differs.
        last.insert("k".into(), set(vec![node("n1", "p1"), node("n2", "p2")]));
        let p = plan(
            &mut last,
            "k",
            Ok(&round(vec![node("n1", "p1"), Arc::new(excluded.clone())])),
        );
        let NodeSyncPlan::Update { hosts, delta } = p else {
            panic!("expected an update, got {p:?}")
        };
        assert_eq!(names(&hosts), ["n1"]);
        assert_eq!(names(&delta.unwrap().removed), ["n2"]);
        // Stored sets are re-filtered: an excluded node stored earlier does not count.
        last.insert("k".into(), set(vec![node("n1", "p1"), Arc::new(excluded)]));
        assert!(matches!(
            plan(&mut last, "k", Ok(&round(vec![node("n1", "p1")]))),
            NodeSyncPlan::Skip
        ));
    }
}
