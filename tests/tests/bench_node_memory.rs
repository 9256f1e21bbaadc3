//! What one cached node costs in the host, itemised (issue 32 item 4): the heap of the typed
//! `Node` the shared node cache keeps (after `controllers::cache_trim::node`), by part, for the
//! node `bench_memory` and `bench_scale` seed (~4 KB of JSON: 7 labels, 2 annotations, 4
//! conditions, node info, 10 images). Heap bytes are read from the counting global allocator
//! this test binary gets from the fake provider's rlib (`ccm_provider_fake::heap`); each figure
//! is the growth for 1,000 copies, divided by 1,000. The only test in its file, so no other test
//! allocates meanwhile. Two figures: the bytes asked for, and the allocator's footprint of the
//! same blocks (`heap::footprint_current`: with glibc each block's chunk, at least 32 bytes: a
//! node is ~60 blocks, most of them short strings, so the footprint is what a node really costs).
//!
//! Ignored; prints `BENCH node_memory ...`:
//! `cargo test -p ccm-integration-tests --test bench_node_memory -- --ignored --nocapture`

use std::sync::Arc;

use ccm_host::controllers::cache_trim;
use ccm_host::runtime::informer::cache_key;
use ccm_host::runtime::CachedNode;
use ccm_provider_fake::heap;
use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};

fn node(i: usize) -> Value {
    let name = format!("node-{i:05}");
    let condition = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet {reason}"),
               "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let images: Vec<Value> = (0..10)
        .map(|k| {
            json!({"names": [format!("registry.example/team/app-{k}@sha256:{:064x}", k * 7919 + i),
                             format!("registry.example/team/app-{k}:v1.{k}.0")],
                   "sizeBytes": 10_000_000 + k * 1_000_000})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "uid": format!("{i:08x}-0000-4000-8000-000000000000"),
            "resourceVersion": "123456", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "fake.medium",
                "topology.kubernetes.io/zone": "fake-zone-a", "topology.kubernetes.io/region": "fake-region-1",
                "beta.kubernetes.io/os": "linux",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"providerID": format!("fake://{name}"), "podCIDR": "10.128.1.0/24", "podCIDRs": ["10.128.1.0/24"]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "8", "memory": "32859496Ki", "pods": "110"},
            "allocatable": {"cpu": "7910m", "memory": "31708520Ki", "pods": "110"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                         "bootID": format!("{i:032x}"), "kernelVersion": "6.1.0-18-amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": "v1.35.0", "kubeProxyVersion": "v1.35.0",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    })
}

const COPIES: usize = 1_000;

/// Heap bytes per copy of what `make` builds (kept alive until measured): asked for.
fn per_copy<T>(make: impl Fn(usize) -> T) -> usize {
    per_copy_both(make).0
}

/// Heap bytes per copy of what `make` builds: (asked for, the allocator's footprint).
fn per_copy_both<T>(make: impl Fn(usize) -> T) -> (usize, usize) {
    let mut kept: Vec<T> = Vec::with_capacity(COPIES);
    let (before, before_fp) = (heap::current(), heap::footprint_current());
    kept.extend((0..COPIES).map(&make));
    let (after, after_fp) = (heap::current(), heap::footprint_current());
    drop(kept);
    (
        (after - before) / COPIES,
        after_fp.saturating_sub(before_fp) / COPIES,
    )
}

fn typed(i: usize) -> Node {
    serde_json::from_value(node(i)).unwrap()
}

fn trimmed(i: usize) -> Node {
    let mut n = typed(i);
    assert!(cache_trim::node(&mut n));
    n
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn bench_node_memory() {
    let (full, full_fp) = per_copy_both(typed);
    let full = full + std::mem::size_of::<Node>();
    let (cached, cached_fp) = per_copy_both(|i| Arc::new(trimmed(i)));
    let key = per_copy(|i| cache_key(&trimmed(i)));
    // What the cache keeps since the compact form (runtime::cached_node): the same trimmed node.
    // Strings shared between nodes (label keys and values, the JSON rest) are interned once:
    // warm the table with one node so the figure is the per-node cost.
    let warm = CachedNode::from(trimmed(COPIES + 1));
    let (compact, compact_fp) = per_copy_both(|i| Arc::new(CachedNode::from(trimmed(i))));
    drop(warm);
    let part = |f: fn(&mut Node)| {
        per_copy(move |i| {
            let mut n = trimmed(i);
            f(&mut n);
            n
        })
    };
    let base = part(|_| {});
    let without = |f: fn(&mut Node)| base.saturating_sub(part(f));
    let labels = without(|n| n.metadata.labels = None);
    let annotations = without(|n| n.metadata.annotations = None);
    let other_metadata = without(|n| {
        n.metadata.name = None;
        n.metadata.uid = None;
        n.metadata.resource_version = None;
    });
    let spec = without(|n| n.spec = None);
    let conditions = without(|n| {
        if let Some(s) = n.status.as_mut() {
            s.conditions = None;
        }
    });
    let condition_messages = without(|n| {
        for c in n
            .status
            .iter_mut()
            .flat_map(|s| s.conditions.iter_mut().flatten())
        {
            c.message = None;
        }
    });
    let node_info = without(|n| {
        if let Some(s) = n.status.as_mut() {
            s.node_info = None;
        }
    });
    let addresses = without(|n| {
        if let Some(s) = n.status.as_mut() {
            s.addresses = None;
        }
    });
    println!(
        "BENCH node_memory full_typed_node_bytes={full} full_typed_node_footprint_bytes={} \
         cached_arc_node_heap_bytes={cached} cached_arc_node_footprint_bytes={cached_fp} cache_key_bytes={key} \
         trimmed_node_heap_bytes={base} labels_bytes={labels} annotations_bytes={annotations} \
         name_uid_resource_version_bytes={other_metadata} spec_bytes={spec} conditions_bytes={conditions} \
         condition_messages_bytes={condition_messages} node_info_bytes={node_info} addresses_bytes={addresses} \
         inline_node_struct_bytes={} compact_node_heap_bytes={compact} \
         compact_node_footprint_bytes={compact_fp} compact_inline_bytes={}",
        full_fp + std::mem::size_of::<Node>(),
        std::mem::size_of::<Node>(),
        std::mem::size_of::<CachedNode>()
    );
}
