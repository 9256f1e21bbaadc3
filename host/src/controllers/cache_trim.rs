//! What the shared node and service caches keep of each object (a transform on the watch
//! streams, like client-go's `SetTransform`).
//!
//! Upstream caches whole objects. Most of a large cluster's cached bytes are fields no cloud
//! controller and no provider reads, and the issue-10 memory target (5,000 nodes and 10,000
//! services in < 60 MiB) cannot be met with them (see BENCHMARKS.md), so, on purpose, the
//! caches drop:
//!
//! - from every object: `metadata.managedFields`;
//! - from services: the `kubectl.kubernetes.io/last-applied-configuration` annotation
//!   (client-side bookkeeping that copies the whole object; services are only ever patched, so
//!   it is never written back; nodes keep theirs, because the node controller PUTs the cached
//!   metadata);
//! - from nodes: `status.images`, `status.volumesInUse`, `status.volumesAttached`,
//!   `status.config`, `status.capacity` and `status.allocatable` (kubelet and scheduler
//!   bookkeeping: half of a node's cached bytes with ten images, each resource map alone
//!   costing ~0.6 KB);
//! - from nodes' `status.conditions`: every condition but `Ready` (the lifecycle and service
//!   controllers) and `NetworkUnavailable` (the route controller), and the `message` of those
//!   two (kubelet's prose): the kubelet's pressure conditions cost ~0.2 KB each and nothing here
//!   reads them (`bench_node_memory` itemises a node's cost; see BENCHMARKS.md);
//! - services that cannot have a load balancer (not of type LoadBalancer, no load-balancer
//!   finalizer, no load-balancer ingress: ~99% of a typical cluster's services) are not cached
//!   at all ([`crate::runtime::informer::Trim`]). Even an empty `Service` costs ~1.2 KB in the cache
//!   (the typed struct and the index key), 12 MiB for 10,000 of them. The service controller
//!   loses nothing: a service entering the set is seen as added (queued by upstream's add
//!   test, which for a service that did not want a load balancer before is its update test), a
//!   service leaving it is seen as updated, and a key missing from the cache is read from the
//!   API before it is treated as deleted.
//!
//! What is left of a node is then kept in compact form, [`crate::runtime::cached_node::CachedNode`]
//! (repeated strings shared between nodes, no k8s-openapi inline struct: ~1.7 KB instead of
//! ~4.5 KB per node, BENCHMARKS.md); it converts back to the same `Node` losslessly.
//!
//! Objects handed to providers come from these caches, so a provider never sees the dropped
//! fields (documented in `docs/writing-a-provider.md`). Writes never send a cached object's
//! status or managedFields back: the node controller's PUT goes to the main resource (the API
//! server ignores `status` there and keeps `managedFields` when the field is absent), and every
//! other write is a patch.

use k8s_openapi::api::core::v1::{Node, Service};

use super::service::predicates::{has_lb_finalizer, has_lb_ingress};

use crate::runtime::well_known::{
    LAST_APPLIED_ANNOTATION, NETWORK_UNAVAILABLE_CONDITION, READY_CONDITION,
};

/// Trim a node for the shared cache (every node is cached). Nothing the node controller's PUT
/// sends back (metadata, spec) is dropped but managedFields, which the API server keeps when
/// the field is absent.
pub fn node(node: &mut Node) -> bool {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_in_use = None;
        status.volumes_attached = None;
        status.config = None;
        status.capacity = None;
        status.allocatable = None;
        if let Some(conditions) = status.conditions.as_mut() {
            conditions
                .retain(|c| c.type_ == READY_CONDITION || c.type_ == NETWORK_UNAVAILABLE_CONDITION);
            conditions.shrink_to_fit();
            for c in conditions {
                c.message = None;
            }
        }
    }
    true
}

/// Whether the service controller may act on `svc`'s load balancer: a LoadBalancer service
/// (of any class), one holding the cleanup finalizer, or one still showing an ingress.
pub fn may_have_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        || has_lb_finalizer(svc)
        || has_lb_ingress(svc)
}

/// Trim a service for the shared cache; only services that may have a load balancer are
/// cached.
pub fn service(svc: &mut Service) -> bool {
    svc.metadata.managed_fields = None;
    if let Some(annotations) = svc.metadata.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
    may_have_load_balancer(svc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn services_that_cannot_have_a_load_balancer_are_not_cached() {
        for v in [
            json!({"metadata": {"name": "a", "finalizers": ["example.com/other"]},
                   "spec": {"type": "ClusterIP", "ports": [{"port": 80}]},
                   "status": {"loadBalancer": {}}}),
            json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort"},
                   "status": {"loadBalancer": {"ingress": []}}}),
            json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName", "externalName": "x"}}),
            json!({"metadata": {"name": "no-spec"}}),
        ] {
            assert!(!service(&mut svc(v.clone())), "{v}");
        }
    }

    #[test]
    fn services_that_may_have_a_load_balancer_stay_whole() {
        for v in [
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "lb", "annotations": {"a": "b"}},
                   "spec": {"type": "LoadBalancer", "ports": [{"port": 80}], "loadBalancerClass": "x/y"}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "fin", "finalizers": ["service.kubernetes.io/load-balancer-cleanup"]},
                   "spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "stale"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]},
                   "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}),
        ] {
            let mut s = svc(v.clone());
            assert!(service(&mut s), "{v}");
            assert_eq!(serde_json::to_value(&s).unwrap(), v);
        }
    }

    #[test]
    fn cached_services_lose_the_last_applied_copy_and_managed_fields() {
        let mut s = svc(json!({
            "metadata": {"name": "lb", "annotations": {LAST_APPLIED_ANNOTATION: "{...}", "a": "b"},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"type": "LoadBalancer"}
        }));
        assert!(service(&mut s));
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["metadata"]["annotations"], json!({"a": "b"}));
        assert!(v["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn bookkeeping_fields_are_dropped_and_the_rest_kept() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {"l": "v"},
                         "annotations": {LAST_APPLIED_ANNOTATION: "{}", "keep": "me"},
                         "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "spec": {"providerID": "fake://n"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b",
                                    "kernelVersion": "k", "osImage": "o", "containerRuntimeVersion": "c",
                                    "kubeletVersion": "v", "kubeProxyVersion": "v",
                                    "operatingSystem": "linux", "architecture": "amd64"},
                       "images": [{"names": ["i"], "sizeBytes": 1}],
                       "capacity": {"cpu": "8"}, "allocatable": {"cpu": "7"},
                       "volumesInUse": ["v"],
                       "volumesAttached": [{"name": "v", "devicePath": "/dev/x"}]}
        }))
        .unwrap();
        assert!(node(&mut n), "every node is cached");
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(
            v["metadata"]["annotations"],
            json!({LAST_APPLIED_ANNOTATION: "{}", "keep": "me"}),
            "the node controller PUTs the cached metadata: every annotation stays"
        );
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["metadata"]["labels"], json!({"l": "v"}));
        assert_eq!(v["spec"]["providerID"], "fake://n");
        for gone in [
            "images",
            "volumesInUse",
            "volumesAttached",
            "capacity",
            "allocatable",
        ] {
            assert!(v["status"].get(gone).is_none(), "{gone} dropped");
        }
        for kept in ["addresses", "conditions", "nodeInfo"] {
            assert!(v["status"].get(kept).is_some(), "{kept} kept");
        }
    }

    #[test]
    fn only_the_conditions_the_controllers_read_are_kept_without_their_message() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "m"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "DiskPressure", "status": "False"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated", "message": "RouteController created a route"},
            ]}
        }))
        .unwrap();
        assert!(node(&mut n));
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(
            v["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated"},
            ])
        );
    }
}
