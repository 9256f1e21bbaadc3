//! What the shared node and service caches keep of each object (a transform on the watch
//! streams, like client-go's `SetTransform`).
//!
//! Upstream caches whole objects. Most of a large cluster's cached bytes are fields no cloud
//! controller and no provider reads, and the issue-10 memory target (5,000 nodes and 10,000
//! services in < 60 MiB) cannot be met with them (see BENCHMARKS.md), so, on purpose, the
//! caches drop:
//!
//! - from every object: `metadata.managedFields` and the
//!   `kubectl.kubernetes.io/last-applied-configuration` annotation (client-side bookkeeping
//!   that copies the whole object);
//! - from nodes: `status.images`, `status.volumesInUse`, `status.volumesAttached` and
//!   `status.config` (kubelet bookkeeping: ~35% of a node's cached bytes with ten images);
//! - from services that are not of type LoadBalancer, carry no load-balancer finalizer and
//!   show no load-balancer ingress (the services the service controller never provisions,
//!   ~99% of a typical cluster's): everything but the identity and the fields its predicates
//!   read (name, namespace, uid, resourceVersion, generation, creation and deletion
//!   timestamps, finalizers, `spec.type`, `spec.loadBalancerClass`). Such a copy is a *stub*
//!   ([`is_service_stub`]); the service controller reads the full object from the API before it
//!   hands a stub's service to the provider.
//!
//! Objects handed to providers come from these caches, so a provider never sees the dropped
//! fields (documented in `docs/writing-a-provider.md`). Writes never send a cached object's
//! status or managedFields back: the node controller's PUT goes to the main resource (the API
//! server ignores `status` there and keeps `managedFields` when the field is absent), and every
//! other write is a patch.

use k8s_openapi::api::core::v1::{Node, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::service::predicates::has_lb_finalizer;

/// kubectl's client-side apply record: a copy of the whole object in an annotation.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn trim_metadata(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// Trim a node for the shared cache.
pub fn node(node: &mut Node) {
    trim_metadata(&mut node.metadata);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_in_use = None;
        status.volumes_attached = None;
        status.config = None;
    }
}

/// Whether the service controller may act on `svc`'s load balancer: a LoadBalancer service
/// (of any class), one holding the cleanup finalizer, or one still showing an ingress. These
/// stay whole in the cache.
fn may_have_load_balancer(svc: &Service) -> bool {
    let type_ = svc.spec.as_ref().and_then(|s| s.type_.as_deref());
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    type_ == Some("LoadBalancer") || has_lb_finalizer(svc) || ingress
}

/// Trim a service for the shared cache: whole (less managedFields and the last-applied
/// annotation) when it may have a load balancer, a stub otherwise.
pub fn service(svc: &mut Service) {
    trim_metadata(&mut svc.metadata);
    if may_have_load_balancer(svc) {
        return;
    }
    let meta = std::mem::take(&mut svc.metadata);
    let spec = svc.spec.take().unwrap_or_default();
    *svc = Service {
        metadata: ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            resource_version: meta.resource_version,
            generation: meta.generation,
            creation_timestamp: meta.creation_timestamp,
            deletion_timestamp: meta.deletion_timestamp,
            finalizers: meta.finalizers,
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: spec.type_,
            load_balancer_class: spec.load_balancer_class,
            ..ServiceSpec::default()
        }),
        status: None,
    };
}

/// Whether `svc` (a cached copy) is a stub: its full object must be read from the API before
/// it is handed to a provider. A stub and the object it came from give the same answer.
pub fn is_service_stub(svc: &Service) -> bool {
    !may_have_load_balancer(svc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(v: serde_json::Value) -> Service {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn clusterip_service_becomes_a_stub_with_the_fields_the_controller_reads() {
        let mut s = svc(json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "labels": {"app": "a"}, "finalizers": ["example.com/other"],
                         "annotations": {"note": "x"}},
            "spec": {"type": "ClusterIP", "ports": [{"port": 80}], "selector": {"app": "a"},
                     "clusterIP": "10.0.0.1"},
            "status": {"loadBalancer": {}}
        }));
        assert!(is_service_stub(&s));
        service(&mut s);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                             "finalizers": ["example.com/other"]},
                "spec": {"type": "ClusterIP"}
            })
        );
        assert!(is_service_stub(&s), "a stub is recognised as one");
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
            assert!(!is_service_stub(&s));
            service(&mut s);
            assert_eq!(serde_json::to_value(&s).unwrap(), v);
        }
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
                       "volumesInUse": ["v"],
                       "volumesAttached": [{"name": "v", "devicePath": "/dev/x"}]}
        }))
        .unwrap();
        node(&mut n);
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["metadata"]["annotations"], json!({"keep": "me"}));
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["metadata"]["labels"], json!({"l": "v"}));
        assert_eq!(v["spec"]["providerID"], "fake://n");
        for gone in ["images", "volumesInUse", "volumesAttached"] {
            assert!(v["status"].get(gone).is_none(), "{gone} dropped");
        }
        for kept in ["addresses", "conditions", "nodeInfo"] {
            assert!(v["status"].get(kept).is_some(), "{kept} kept");
        }
    }
}
