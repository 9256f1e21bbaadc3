//! The decision part of a node sync for one service: compare the fresh host set with the
//! service's last-synced set, and store the fresh set *before* the cloud is called (so a
//! concurrent or repeated node sync with the same nodes does not call the cloud again; a
//! failure is retried through a full EnsureLoadBalancer on the service queue instead).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::predicates::{nodes_sufficiently_equal, stable_node_set};

/// Last-synced host sets, per service key.
pub type LastSynced = HashMap<String, Vec<Arc<Node>>>;

/// What a node sync does for one service.
#[derive(Debug)]
pub enum NodeSyncPlan {
    /// Listing nodes failed: no cloud call, retry the service.
    Retry(String),
    /// The host set did not change.
    Skip,
    /// Call UpdateLoadBalancer with these hosts (already stored as last-synced).
    Update(Vec<Arc<Node>>),
}

/// Plan the node sync of service `key` from a fresh node listing. Reading the last-synced set
/// and storing the new one happen under one lock held by the caller (`last`), so two syncs of
/// the same service cannot interleave between them.
pub fn plan(
    last: &mut LastSynced,
    key: &str,
    listed: Result<Vec<Arc<Node>>, String>,
) -> NodeSyncPlan {
    let listed = match listed {
        Ok(l) => l,
        Err(e) => return NodeSyncPlan::Retry(e),
    };
    let new: Vec<Arc<Node>> = listed.into_iter().filter(|n| stable_node_set(n)).collect();
    let old: Vec<Arc<Node>> = last
        .get(key)
        .map(|v| v.iter().filter(|n| stable_node_set(n)).cloned().collect())
        .unwrap_or_default();
    last.insert(key.to_string(), new.clone());
    if nodes_sufficiently_equal(&old, &new) {
        NodeSyncPlan::Skip
    } else {
        NodeSyncPlan::Update(new)
    }
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
        v.iter().map(|n| n.metadata.name.clone().unwrap()).collect()
    }

    #[test]
    fn list_error_retries_without_touching_last_synced() {
        let mut last = LastSynced::new();
        last.insert("ns/a".into(), vec![node("n1", "p1")]);
        let p = plan(&mut last, "ns/a", Err("boom".into()));
        assert!(
            matches!(p, NodeSyncPlan::Retry(ref e) if e == "boom"),
            "{p:?}"
        );
        assert_eq!(names(&last["ns/a"]), ["n1"]);
    }

    #[test]
    fn first_sync_updates_and_stores_before_the_call() {
        let mut last = LastSynced::new();
        let p = plan(
            &mut last,
            "ns/a",
            Ok(vec![node("n1", "p1"), node("n2", "p2")]),
        );
        let NodeSyncPlan::Update(hosts) = p else {
            panic!("expected an update, got {p:?}")
        };
        assert_eq!(names(&hosts), ["n1", "n2"]);
        assert_eq!(names(&last["ns/a"]), ["n1", "n2"]);
        // A repeated sync with the same nodes (e.g. after the update failed) does nothing.
        let again = plan(
            &mut last,
            "ns/a",
            Ok(vec![node("n2", "p2"), node("n1", "p1")]),
        );
        assert!(matches!(again, NodeSyncPlan::Skip), "{again:?}");
    }

    #[test]
    fn provider_id_change_and_same_size_other_node_update() {
        let mut last = LastSynced::new();
        last.insert("k".into(), vec![node("n1", "p1"), node("n2", "p2")]);
        assert!(matches!(
            plan(&mut last, "k", Ok(vec![node("n1", "p1"), node("n2", "p2")])),
            NodeSyncPlan::Skip
        ));
        assert!(matches!(
            plan(
                &mut last,
                "k",
                Ok(vec![node("n1", "p1"), node("n2", "changed")])
            ),
            NodeSyncPlan::Update(_)
        ));
        assert!(matches!(
            plan(&mut last, "k", Ok(vec![node("n1", "p1"), node("n3", "p3")])),
            NodeSyncPlan::Update(_)
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
        last.insert("k".into(), vec![node("n1", "p1"), node("n2", "p2")]);
        let p = plan(
            &mut last,
            "k",
            Ok(vec![node("n1", "p1"), Arc::new(excluded.clone())]),
        );
        let NodeSyncPlan::Update(hosts) = p else {
            panic!("expected an update, got {p:?}")
        };
        assert_eq!(names(&hosts), ["n1"]);
        // Stored sets are re-filtered: an excluded node stored earlier does not count.
        last.insert("k".into(), vec![node("n1", "p1"), Arc::new(excluded)]);
        assert!(matches!(
            plan(&mut last, "k", Ok(vec![node("n1", "p1")])),
            NodeSyncPlan::Skip
        ));
    }
}
