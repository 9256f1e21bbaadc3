//! Cloud-node-lifecycle controller against the in-memory API server and the fake provider's
//! `.so` (docs/upstream-compat.md#node-lifecycle-controller, with the cases of upstream's
//! `controllers/nodelifecycle/node_lifecycle_controller_test.go`), V1 (`fake-v1`) and V2 (`fake`) variants.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ccm_host::controllers::node_lifecycle::{
    self, get_provider_id, monitor_nodes, NodeDeletionMode, NodeDeletionPolicy, NodeMonitor,
};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::provider::ProviderOptions;
use ccm_host::runtime::events::{EventRecorder, EventType};
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_abi::ErrorKind;
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const WAIT: Duration = Duration::from_secs(20);

fn fake(config: Value) -> FakeConfig {
    serde_json::from_value(config).expect("fake config")
}

fn node(ready: Option<&str>, provider_id: &str, taints: Value) -> Value {
    let mut n = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node0"},
        "spec": {"taints": taints},
        "status": {"conditions": []},
    });
    if let Some(r) = ready {
        n["status"]["conditions"] = json!([{"type": "Ready", "status": r}]);
    }
    if !provider_id.is_empty() {
        n["spec"]["providerID"] = json!(provider_id);
    }
    n
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    Deleted,
    Unchanged,
    ShutdownTainted,
}

struct Case {
    name: &'static str,
    provider: &'static str,
    /// The fake's config (`providerName: fake`, `autoInstances: false` added).
    cloud: Value,
    node: Value,
    expect: Expect,
}

async fn synced(h: &Harness) -> ControllerContext {
    let ctx = h.context(ControllerConfig::default());
    assert!(ctx.nodes.wait_synced().await);
    eventually("node cached", WAIT, || {
        (!ctx.nodes.list().is_empty()).then_some(())
    })
    .await;
    ctx
}

fn events(h: &Harness) -> Vec<Value> {
    h.server.controls().list("events")
}

fn node_writes(h: &Harness) -> usize {
    h.server
        .controls()
        .requests()
        .iter()
        .filter(|r| {
            r.resource == "nodes" && matches!(r.verb.as_str(), "update" | "patch" | "delete")
        })
        .count()
}

async fn run_case(c: Case) {
    let mut cloud = c.cloud.clone();
    cloud["providerName"] = json!("fake");
    if cloud.get("autoInstances").is_none() {
        cloud["autoInstances"] = json!(false);
    }
    let h = Harness::start(c.provider, fake(cloud)).await;
    h.server.controls().seed(c.node.clone()).unwrap();
    let before = h.server.controls().get("nodes", "", "node0").unwrap();
    let ctx = synced(&h).await;
    let recorder = ctx.recorder(node_lifecycle::COMPONENT);
    monitor_nodes(&ctx, &recorder).await;
    let after = h.server.controls().get("nodes", "", "node0");
    match c.expect {
        Expect::Deleted => {
            assert!(after.is_none(), "{}: node deleted", c.name);
            let ev = eventually("DeletingNode event", WAIT, || {
                events(&h)
                    .into_iter()
                    .find(|e| e["reason"] == "DeletingNode")
            })
            .await;
            assert_eq!(ev["type"], "Normal", "{}", c.name);
            assert_eq!(
                ev["message"],
                "Deleting node node0 because it does not exist in the cloud provider",
                "{}",
                c.name
            );
            assert_eq!(ev["source"]["component"], "cloud-node-lifecycle-controller");
            assert_eq!(
                ev["involvedObject"]["apiVersion"], "v1",
                "{}: apiVersion set",
                c.name
            );
            assert_eq!(ev["involvedObject"]["kind"], "Node");
            assert_eq!(ev["involvedObject"]["name"], "node0");
            assert_eq!(ev["involvedObject"]["uid"], before["metadata"]["uid"]);
            let deletes: Vec<_> = h
                .server
                .controls()
                .requests()
                .into_iter()
                .filter(|r| r.resource == "nodes" && r.verb == "delete")
                .collect();
            assert_eq!(deletes.len(), 1, "{}", c.name);
            assert!(deletes[0].query.is_empty(), "{}: no preconditions", c.name);
        }
        Expect::Unchanged => {
            assert_eq!(after.as_ref(), Some(&before), "{}: node unchanged", c.name);
            assert_eq!(node_writes(&h), 0, "{}: no writes", c.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(events(&h).is_empty(), "{}: no events", c.name);
        }
        Expect::ShutdownTainted => {
            let after = after.unwrap_or_else(|| panic!("{}: node kept", c.name));
            assert_eq!(
                after["spec"]["taints"],
                json!([{"key": SHUTDOWN, "effect": "NoSchedule"}]),
                "{}: exactly the shutdown taint",
                c.name
            );
            // Everything but the taints, resourceVersion and generation is as before.
            let mut a = after.clone();
            let mut b = before.clone();
            for v in [&mut a, &mut b] {
                v["spec"]["taints"] = Value::Null;
                v["metadata"]["resourceVersion"] = Value::Null;
                v["metadata"]["generation"] = Value::Null;
            }
            assert_eq!(a, b, "{}", c.name);
            // The taint patch carries the resourceVersion (optimistic concurrency).
            let patch = h
                .server
                .controls()
                .requests()
                .into_iter()
                .find(|r| r.resource == "nodes" && r.verb == "patch")
                .expect("taint patch");
            assert_eq!(
                patch.json()["metadata"]["resourceVersion"],
                before["metadata"]["resourceVersion"]
            );
        }
    }
}

fn instance(extra: Value) -> Value {
    let mut i = json!({"name": "node0", "instanceID": "12345", "providerID": "fake://12345"});
    for (k, v) in extra.as_object().unwrap() {
        i[k] = v.clone();
    }
    i
}

/// Test_NodesDeleted, V1 and V2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_deleted_cases() {
    for (provider, exists_method) in [
        ("fake-v1", "InstanceExistsByProviderID"),
        ("fake", "InstanceExists"),
    ] {
        let cases = [
            Case {
                name: "NotReady + not exists ⇒ deleted",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false}))]}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Deleted,
            },
            Case {
                name: "NotReady + provider error ⇒ kept",
                provider,
                cloud: json!({"instances": [instance(json!({}))], "errors": {exists_method: {"kind": "other"}}}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Unchanged,
            },
            Case {
                name: "NotReady + exists ⇒ kept",
                provider,
                cloud: json!({"instances": [instance(json!({}))]}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Unchanged,
            },
            Case {
                name: "Ready=Unknown + not exists ⇒ deleted",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false}))]}),
                node: node(Some("Unknown"), "fake://12345", json!([])),
                expect: Expect::Deleted,
            },
            Case {
                name: "no Ready condition + not exists ⇒ deleted",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false}))]}),
                node: node(None, "fake://12345", json!([])),
                expect: Expect::Deleted,
            },
            Case {
                name: "Ready=Unknown + exists, not shut down ⇒ kept",
                provider,
                cloud: json!({"instances": [instance(json!({}))]}),
                node: node(Some("Unknown"), "fake://12345", json!([])),
                expect: Expect::Unchanged,
            },
            Case {
                name: "Ready=True + gone ⇒ kept",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false}))]}),
                node: node(Some("True"), "fake://12345", json!([])),
                expect: Expect::Unchanged,
            },
            Case {
                name: "uninitialised node + gone ⇒ deleted (taints irrelevant)",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false}))]}),
                node: node(
                    Some("False"),
                    "fake://12345",
                    json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]),
                ),
                expect: Expect::Deleted,
            },
        ];
        for c in cases {
            eprintln!("case {provider}: {}", c.name);
            run_case(c).await;
        }
    }
}

/// Test_NodesShutdown, V1 and V2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_shutdown_cases() {
    for (provider, shutdown_method) in [
        ("fake-v1", "InstanceShutdownByProviderID"),
        ("fake", "InstanceShutdown"),
    ] {
        let mut cases = vec![
            Case {
                name: "NotReady + shut down + exists ⇒ shutdown taint",
                provider,
                cloud: json!({"instances": [instance(json!({"shutdown": true}))]}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::ShutdownTainted,
            },
            Case {
                name: "same with empty spec.providerID",
                provider,
                cloud: json!({"instances": [instance(json!({"shutdown": true}))]}),
                node: node(Some("False"), "", json!([])),
                expect: Expect::ShutdownTainted,
            },
            Case {
                name: "NotReady + shutdown-check error + not exists ⇒ deleted",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false}))],
                              "errors": {shutdown_method: {"kind": "other"}}}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Deleted,
            },
            Case {
                name: "NotReady + shutdown-check error + exists ⇒ untouched",
                provider,
                cloud: json!({"instances": [instance(json!({"shutdown": true}))],
                              "errors": {shutdown_method: {"kind": "other"}}}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Unchanged,
            },
            Case {
                name: "NotReady + not shut down + not exists ⇒ deleted",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false, "shutdown": false}))]}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Deleted,
            },
            Case {
                name: "Ready + provider says shut down ⇒ no taint",
                provider,
                cloud: json!({"instances": [instance(json!({"shutdown": true}))]}),
                node: node(Some("True"), "fake://12345", json!([])),
                expect: Expect::Unchanged,
            },
            Case {
                name: "shut down but not existing ⇒ deleted",
                provider,
                cloud: json!({"instances": [instance(json!({"exists": false, "shutdown": true}))]}),
                node: node(Some("False"), "fake://12345", json!([])),
                expect: Expect::Deleted,
            },
            Case {
                name: "already tainted + still shut down ⇒ no write",
                provider,
                cloud: json!({"instances": [instance(json!({"shutdown": true}))]}),
                node: node(
                    Some("False"),
                    "fake://12345",
                    json!([{"key": SHUTDOWN, "effect": "NoSchedule"}]),
                ),
                expect: Expect::Unchanged,
            },
        ];
        if provider == "fake-v1" {
            cases.extend([
                Case {
                    name: "V1: InstanceID returns \"\" ⇒ provider ID fake:// does not exist ⇒ deleted",
                    provider,
                    cloud: json!({"instances": [instance(json!({"instanceID": ""}))]}),
                    node: node(Some("False"), "", json!([])),
                    expect: Expect::Deleted,
                },
                Case {
                    name: "V1: InstanceID error ⇒ untouched",
                    provider,
                    cloud: json!({"instances": [instance(json!({}))], "errors": {"InstanceID": {"kind": "other"}}}),
                    node: node(Some("False"), "", json!([])),
                    expect: Expect::Unchanged,
                },
                Case {
                    name: "V1: InstanceID InstanceNotFound ⇒ deleted",
                    provider,
                    cloud: json!({"instances": [instance(json!({}))],
                                  "errors": {"InstanceID": {"kind": "instance_not_found"}}}),
                    node: node(Some("False"), "", json!([])),
                    expect: Expect::Deleted,
                },
                Case {
                    name: "V1: shutdown NotImplemented ⇒ not shut down",
                    provider,
                    cloud: json!({"instances": [instance(json!({"shutdown": true}))],
                                  "errors": {"InstanceShutdownByProviderID": {"kind": "not_implemented"}}}),
                    node: node(Some("False"), "fake://12345", json!([])),
                    expect: Expect::Unchanged,
                },
            ]);
        }
        for c in cases {
            eprintln!("case {provider}: {}", c.name);
            run_case(c).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_calls_resolve_the_provider_id_by_instance_id() {
    let h = Harness::start(
        "fake-v1",
        fake(json!({"providerName": "fake", "autoInstances": false,
                    "instances": [instance(json!({"shutdown": true}))]})),
    )
    .await;
    h.server
        .controls()
        .seed(node(Some("False"), "", json!([])))
        .unwrap();
    let ctx = synced(&h).await;
    monitor_nodes(&ctx, &ctx.recorder(node_lifecycle::COMPONENT)).await;
    assert_eq!(
        h.call_names(),
        [
            "instance-id",
            "instance-exists-by-provider-id",
            "instance-id",
            "instance-shutdown-by-provider-id"
        ]
    );
    assert_eq!(h.calls()[1].arg("providerID"), Some("fake://12345"));
    assert_eq!(h.calls()[3].arg("providerID"), Some("fake://12345"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_node_loses_the_shutdown_taint_and_other_taints_stay() {
    let h = Harness::start("fake", fake(json!({}))).await;
    h.server
        .controls()
        .seed(node(
            Some("True"),
            "fake://node0",
            json!([{"key": "keep", "effect": "NoExecute"}, {"key": SHUTDOWN, "effect": "NoSchedule"}]),
        ))
        .unwrap();
    let ctx = synced(&h).await;
    monitor_nodes(&ctx, &ctx.recorder(node_lifecycle::COMPONENT)).await;
    let n = h.server.controls().get("nodes", "", "node0").unwrap();
    assert_eq!(
        n["spec"]["taints"],
        json!([{"key": "keep", "effect": "NoExecute"}])
    );
    assert!(
        h.call_names().is_empty(),
        "Ready nodes are not looked up: {:?}",
        h.call_names()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_delete_emits_deleting_node_failed() {
    let h = Harness::start(
        "fake",
        fake(json!({"autoInstances": false, "instances": [{"name": "node0", "exists": false}]})),
    )
    .await;
    h.server
        .controls()
        .seed(node(Some("False"), "", json!([])))
        .unwrap();
    let ctx = synced(&h).await;
    h.server.controls().fail_next(1, "delete", "nodes", 500);
    monitor_nodes(&ctx, &ctx.recorder(node_lifecycle::COMPONENT)).await;
    assert!(
        h.server.controls().get("nodes", "", "node0").is_some(),
        "delete failed"
    );
    let failed = eventually("DeletingNodeFailed", WAIT, || {
        events(&h)
            .into_iter()
            .find(|e| e["reason"] == "DeletingNodeFailed")
    })
    .await;
    assert_eq!(failed["type"], "Warning");
    let msg = failed["message"].as_str().unwrap();
    assert!(msg.starts_with("Failed deleting node node0: "), "{msg}");
    assert_eq!(failed["involvedObject"]["apiVersion"], "v1");
    eventually("DeletingNode", WAIT, || {
        events(&h)
            .into_iter()
            .find(|e| e["reason"] == "DeletingNode")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_loop_deletes_a_node_whose_instance_goes_away() {
    let h = Harness::start("fake", fake(json!({"providerName": "fake"}))).await;
    h.server
        .controls()
        .seed(node(Some("False"), "fake://node0", json!([])))
        .unwrap();
    let ctx = h.context(ControllerConfig {
        node_monitor_period: Duration::from_millis(100),
        ..Default::default()
    });
    assert!(node_lifecycle::check(&ctx).is_ok());
    let task = tokio::spawn(node_lifecycle::run(ctx));
    // Exists: several passes keep it.
    eventually("a few passes", WAIT, || {
        (h.call_names()
            .iter()
            .filter(|c| *c == "instance-exists")
            .count()
            >= 3)
            .then_some(())
    })
    .await;
    assert!(h.server.controls().get("nodes", "", "node0").is_some());
    h.set_control(&fake(
        json!({"autoInstances": false, "instances": [{"name": "node0", "exists": false}]}),
    ));
    eventually("node deleted", WAIT, || {
        h.server
            .controls()
            .get("nodes", "", "node0")
            .is_none()
            .then_some(())
    })
    .await;
    h.stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops on cancel")
        .unwrap();
}

/// Test_GetProviderID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_provider_id_cases() {
    let with_id: Node =
        serde_json::from_value(node(Some("False"), "fake://spec", json!([]))).unwrap();
    let without: Node = serde_json::from_value(node(Some("False"), "", json!([]))).unwrap();
    for provider in ["fake", "fake-v1"] {
        let h = Harness::start(
            provider,
            fake(json!({"providerName": "fake", "instances": [instance(json!({}))]})),
        )
        .await;
        assert_eq!(
            get_provider_id(&h.provider, &with_id).await.unwrap(),
            "fake://spec",
            "{provider}: spec wins"
        );
        assert!(h.call_names().is_empty());
        assert_eq!(
            get_provider_id(&h.provider, &without).await.unwrap(),
            "fake://12345",
            "{provider}"
        );
    }
    // V2: the metadata's ID, which may be "".
    let h = Harness::start(
        "fake",
        fake(json!({"instances": [{"name": "node0", "providerID": ""}]})),
    )
    .await;
    assert_eq!(get_provider_id(&h.provider, &without).await.unwrap(), "");
    // V1: InstanceNotFound unchanged; other errors wrapped.
    let h = Harness::start("fake-v1", fake(json!({"autoInstances": false}))).await;
    let e = get_provider_id(&h.provider, &without).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INSTANCE_NOT_FOUND);
    assert_eq!(e.to_string(), "instance not found");
    let h = Harness::start(
        "fake-v1",
        fake(json!({"errors": {"InstanceID": {"kind": "other", "message": "unknown error"}}})),
    )
    .await;
    let e = get_provider_id(&h.provider, &without).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "failed to get instance ID from cloud provider: unknown error"
    );
}

// ---------------------------------------------------------------------------------------------
// Safe node deletion (issue 18 item 4): only an explicit "does not exist" deletes;
// --node-deletion-confirmations, --node-deletion-mode, --node-deletion-on-instance-not-found.
// ---------------------------------------------------------------------------------------------

/// A controller config with `policy`. The monitor period is zero so that a test can step
/// passes back to back: the "spread over at least one period" rule is then always met (the
/// rule itself is covered by the unit tests and by
/// `confirmations_are_spread_over_the_monitor_period`, which runs the real loop).
fn stepping(policy: NodeDeletionPolicy) -> ControllerConfig {
    ControllerConfig {
        node_monitor_period: Duration::ZERO,
        node_deletion: policy,
        ..Default::default()
    }
}

/// Wait until every event published on `recorder` so far is stored: the recorder writes in
/// order, so once a sentinel published now is visible, so is everything before it.
async fn flush_events(h: &Harness, recorder: &EventRecorder) {
    static SENTINELS: AtomicUsize = AtomicUsize::new(0);
    let marker = format!("sentinel {}", SENTINELS.fetch_add(1, Ordering::Relaxed));
    recorder.publish(
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some("sentinel".into()),
            ..Default::default()
        },
        EventType::Normal,
        "Sentinel",
        marker.clone(),
    );
    eventually("events flushed", WAIT, || {
        events(h)
            .iter()
            .any(|e| e["message"] == marker.as_str())
            .then_some(())
    })
    .await;
}

/// The events of `reason` about node0.
fn events_of(h: &Harness, reason: &str) -> Vec<Value> {
    events(h)
        .into_iter()
        .filter(|e| e["reason"] == reason && e["involvedObject"]["name"] == "node0")
        .collect()
}

fn node_deletes(h: &Harness) -> usize {
    h.server
        .controls()
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes" && r.verb == "delete")
        .count()
}

fn node0_exists(h: &Harness) -> bool {
    h.server.controls().get("nodes", "", "node0").is_some()
}

/// The cloud of these tests: node0's instance `fake://12345` is gone, plus `extra` keys.
fn gone_cloud(extra: Value) -> FakeConfig {
    let mut c = json!({"providerName": "fake", "autoInstances": false,
                       "instances": [instance(json!({"exists": false}))]});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    fake(c)
}

/// Seed NotReady node0 (provider ID `provider_id`, may be empty), wait until it is cached, and
/// return its UID.
async fn seed_not_ready(h: &Harness, ctx: &ControllerContext, provider_id: &str) -> String {
    let stored = h
        .server
        .controls()
        .seed(node(Some("False"), provider_id, json!([])))
        .unwrap();
    assert!(ctx.nodes.wait_synced().await);
    eventually("node cached", WAIT, || {
        (!ctx.nodes.list().is_empty()).then_some(())
    })
    .await;
    stored["metadata"]["uid"].as_str().unwrap().to_string()
}

/// Every kind of error from the existence check keeps the node, pass after pass; the same cloud
/// without the error deletes it on the next pass (so the error is what kept it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_of_every_kind_never_delete() {
    let kinds = [
        json!({"kind": "unauthorized", "message": "401 Unauthorized: AuthFailure"}),
        json!({"kind": "unauthorized", "message": "403 Forbidden: UnauthorizedOperation"}),
        json!({"kind": "throttled", "retryAfter": "20ms", "message": "RequestLimitExceeded"}),
        json!({"kind": "cancelled"}),
        json!({"kind": "other"}),
        json!({"kind": "not_found"}),
        json!({"kind": "instance_not_found"}),
        json!({"kind": "not_implemented"}),
        json!({"kind": "retry_after", "retryAfter": "1s"}),
    ];
    // (provider, node's provider ID, the methods whose error is injected)
    let paths = [
        ("fake", "fake://12345", "InstanceExists"),
        ("fake", "", "InstanceExists"),
        ("fake-v1", "fake://12345", "InstanceExistsByProviderID"),
        ("fake-v1", "", "InstanceID"),
    ];
    for (provider, provider_id, method) in paths {
        let mut faults: Vec<(String, Value)> = kinds
            .iter()
            // Legacy InstanceID's InstanceNotFound *is* upstream's "does not exist" (see
            // nodes_shutdown_cases); every other error is not.
            .filter(|k| !(method == "InstanceID" && k["kind"] == "instance_not_found"))
            .map(|k| (format!("{k}"), json!({"errors": {method: k}})))
            .collect();
        // The call layer's own errors: a panic, and a call past its deadline.
        faults.push(("panic".into(), json!({"panics": [method]})));
        faults.push(("deadline".into(), json!({"hang": [method]})));
        for (what, fault) in faults {
            eprintln!("case {provider} {method} (provider ID {provider_id:?}): {what}");
            let h = Harness::start_with(
                provider,
                gone_cloud(fault),
                ProviderOptions {
                    call_timeout: Duration::from_millis(300),
                    ..Default::default()
                },
            )
            .await;
            let ctx = h.context(stepping(NodeDeletionPolicy::default()));
            let uid = seed_not_ready(&h, &ctx, provider_id).await;
            let recorder = ctx.recorder(node_lifecycle::COMPONENT);
            let mut monitor = NodeMonitor::default();
            for _ in 0..2 {
                monitor.pass(&ctx, &recorder).await;
                assert!(node0_exists(&h), "{what}: kept");
                assert_eq!(monitor.answers(&uid), 0, "{what}: no answer counted");
            }
            assert_eq!(
                h.calls()
                    .iter()
                    .filter(|c| c.call == fake_call_name(method))
                    .count(),
                2,
                "{what}: {method} asked once per pass"
            );
            assert_eq!(node_deletes(&h), 0, "{what}: no DELETE sent");
            assert_eq!(h.metrics.node_deletions.get(), 0);
            flush_events(&h, &recorder).await;
            for reason in [
                "DeletingNode",
                "InstanceDoesNotExist",
                "NodeDeletionWithheld",
            ] {
                assert!(events_of(&h, reason).is_empty(), "{what}: no {reason}");
            }

            // The same cloud answering: deleted.
            h.set_control(&gone_cloud(json!({})));
            monitor.pass(&ctx, &recorder).await;
            assert!(!node0_exists(&h), "{what}: deleted once the cloud answers");
            assert_eq!(h.metrics.node_deletions.get(), 1);
            flush_events(&h, &recorder).await;
            let deleting = events_of(&h, "DeletingNode");
            assert_eq!(deleting.len(), 1, "{what}");
            assert_eq!(deleting[0]["count"], 1, "{what}: one DeletingNode in all");
        }
    }
}

/// The fake's call-log name of an upstream method.
fn fake_call_name(method: &str) -> &'static str {
    match method {
        "InstanceExists" => "instance-exists",
        "InstanceExistsByProviderID" => "instance-exists-by-provider-id",
        "InstanceID" => "instance-id",
        other => panic!("no call name for {other}"),
    }
}

/// The upstream default keeps its events and adds the evidence before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_states_its_evidence() {
    for (provider, provider_id, expected) in [
        (
            "fake",
            "fake://12345",
            "Instance fake://12345 does not exist in the cloud (InstanceExists returned false); deleting node node0",
        ),
        (
            "fake-v1",
            "fake://12345",
            "Instance fake://12345 does not exist in the cloud (InstanceExistsByProviderID returned false); deleting node node0",
        ),
    ] {
        let h = Harness::start(provider, gone_cloud(json!({}))).await;
        let ctx = h.context(stepping(NodeDeletionPolicy::default()));
        seed_not_ready(&h, &ctx, provider_id).await;
        let recorder = ctx.recorder(node_lifecycle::COMPONENT);
        NodeMonitor::default().pass(&ctx, &recorder).await;
        assert!(!node0_exists(&h));
        flush_events(&h, &recorder).await;
        let evidence = events_of(&h, "InstanceDoesNotExist");
        assert_eq!(evidence.len(), 1, "{provider}");
        assert_eq!(evidence[0]["type"], "Normal");
        assert_eq!(evidence[0]["message"], expected);
        assert_eq!(
            evidence[0]["source"]["component"],
            "cloud-node-lifecycle-controller"
        );
        let deleting = events_of(&h, "DeletingNode");
        assert_eq!(
            deleting[0]["message"],
            "Deleting node node0 because it does not exist in the cloud provider"
        );
        // The evidence comes first.
        let order: Vec<_> = events(&h)
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == "node0")
            .map(|e| e["reason"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(order, ["InstanceDoesNotExist", "DeletingNode"], "{provider}");
    }
    // Legacy interface, no provider ID: InstanceID's InstanceNotFound is the answer (upstream).
    let h = Harness::start(
        "fake-v1",
        fake(json!({"providerName": "fake", "autoInstances": false})),
    )
    .await;
    let ctx = h.context(stepping(NodeDeletionPolicy::default()));
    seed_not_ready(&h, &ctx, "").await;
    let recorder = ctx.recorder(node_lifecycle::COMPONENT);
    NodeMonitor::default().pass(&ctx, &recorder).await;
    assert!(!node0_exists(&h));
    flush_events(&h, &recorder).await;
    assert_eq!(
        events_of(&h, "InstanceDoesNotExist")[0]["message"],
        "The instance of node node0 (no provider ID) does not exist in the cloud \
         (InstanceID returned InstanceNotFound); deleting node node0"
    );
}

/// --node-deletion-confirmations=3: three answers in a row; an error or an "exists" in between
/// starts the count again, and so does the node being Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_confirmations_in_a_row_and_a_reset_on_any_other_answer() {
    for provider in ["fake", "fake-v1"] {
        let h = Harness::start(provider, gone_cloud(json!({}))).await;
        let ctx = h.context(stepping(NodeDeletionPolicy {
            confirmations: 3,
            ..Default::default()
        }));
        let uid = seed_not_ready(&h, &ctx, "fake://12345").await;
        let recorder = ctx.recorder(node_lifecycle::COMPONENT);
        let mut monitor = NodeMonitor::default();
        let gone = gone_cloud(json!({}));
        let failing = gone_cloud(json!({"errors": {"*": {"kind": "unauthorized"}}}));
        let exists = fake(json!({"providerName": "fake", "autoInstances": false,
                                 "instances": [instance(json!({}))]}));
        // (cloud, answers in a row after the pass)
        let steps = [
            (&gone, 1),
            (&gone, 2),
            (&failing, 0),
            (&gone, 1),
            (&gone, 2),
            (&exists, 0),
            (&gone, 1),
            (&gone, 2),
        ];
        for (i, (cloud, answers)) in steps.into_iter().enumerate() {
            h.set_control(cloud);
            monitor.pass(&ctx, &recorder).await;
            assert!(node0_exists(&h), "{provider} step {i}: kept");
            assert_eq!(monitor.answers(&uid), answers, "{provider} step {i}");
        }
        // Ready in between also starts again.
        let api: Api<Node> = Api::all(h.client.clone());
        let ready =
            |status: &str| json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
        api.patch_status(
            "node0",
            &PatchParams::default(),
            &Patch::Merge(ready("True")),
        )
        .await
        .unwrap();
        eventually("Ready cached", WAIT, || {
            ctx.nodes
                .list()
                .iter()
                .any(|n| n.condition("Ready").is_some_and(|c| c.status == "True"))
                .then_some(())
        })
        .await;
        monitor.pass(&ctx, &recorder).await;
        assert_eq!(monitor.answers(&uid), 0, "{provider}: Ready forgets");
        api.patch_status(
            "node0",
            &PatchParams::default(),
            &Patch::Merge(ready("False")),
        )
        .await
        .unwrap();
        eventually("NotReady cached", WAIT, || {
            ctx.nodes
                .list()
                .iter()
                .all(|n| n.condition("Ready").is_some_and(|c| c.status == "False"))
                .then_some(())
        })
        .await;
        for answers in [1, 2] {
            monitor.pass(&ctx, &recorder).await;
            assert_eq!(monitor.answers(&uid), answers, "{provider}");
        }
        assert!(node0_exists(&h));
        assert_eq!(
            node_deletes(&h),
            0,
            "{provider}: no DELETE before the third"
        );
        flush_events(&h, &recorder).await;
        assert!(events_of(&h, "InstanceDoesNotExist").is_empty());
        assert!(events_of(&h, "DeletingNode").is_empty());

        monitor.pass(&ctx, &recorder).await;
        assert!(
            !node0_exists(&h),
            "{provider}: the third answer in a row deletes"
        );
        assert_eq!(h.metrics.node_deletions.get(), 1);
        flush_events(&h, &recorder).await;
        let evidence = events_of(&h, "InstanceDoesNotExist");
        assert_eq!(evidence.len(), 1, "{provider}");
        let msg = evidence[0]["message"].as_str().unwrap();
        let method = if provider == "fake" {
            "InstanceExists"
        } else {
            "InstanceExistsByProviderID"
        };
        let prefix = format!(
            "Instance fake://12345 does not exist in the cloud ({method} returned false; 3 answers in a row over "
        );
        assert!(msg.starts_with(&prefix), "{msg}");
        assert!(msg.ends_with("); deleting node node0"), "{msg}");
        assert_eq!(events_of(&h, "DeletingNode").len(), 1);
    }
}

/// The real loop: three answers in a row take at least two periods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirmations_are_spread_over_the_monitor_period() {
    let period = Duration::from_millis(300);
    let h = Harness::start("fake", gone_cloud(json!({}))).await;
    let ctx = h.context(ControllerConfig {
        node_monitor_period: period,
        node_deletion: NodeDeletionPolicy {
            confirmations: 3,
            ..Default::default()
        },
        ..Default::default()
    });
    seed_not_ready(&h, &ctx, "fake://12345").await;
    let task = tokio::spawn(node_lifecycle::run(ctx));
    eventually("node deleted", WAIT, || (!node0_exists(&h)).then_some(())).await;
    let exists_calls: Vec<_> = h
        .calls()
        .into_iter()
        .filter(|c| c.call == "instance-exists")
        .collect();
    assert_eq!(exists_calls.len(), 3, "deleted on the third answer");
    let first_to_last = exists_calls[2].at_ms - exists_calls[0].at_ms;
    assert!(
        u128::from(first_to_last) >= 2 * period.as_millis(),
        "answers {first_to_last} ms apart"
    );
    let evidence = eventually("evidence event", WAIT, || {
        events_of(&h, "InstanceDoesNotExist").into_iter().next()
    })
    .await;
    let msg = evidence["message"].as_str().unwrap();
    assert!(
        msg.contains("(InstanceExists returned false; 3 answers in a row over "),
        "{msg}"
    );
    // Counted once the API server answered the DELETE (the node may vanish from the store a
    // moment before the controller has the answer).
    eventually("deletion counted", WAIT, || {
        (h.metrics.node_deletions.get() == 1).then_some(())
    })
    .await;
    let text = ccm_host::runtime::metrics::render(&h.registry);
    assert!(text.contains("\nccm_node_deletions_total 1\n"), "{text}");
    assert!(
        text.contains("\nccm_node_deletions_withheld_total 0\n"),
        "{text}"
    );
    h.stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .expect("stops on cancel")
        .unwrap();
}

/// --node-deletion-mode=report: a Warning event and the metric, once per run of answers; the
/// node stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_mode_keeps_the_node_with_an_event_and_a_metric() {
    let h = Harness::start("fake", gone_cloud(json!({}))).await;
    let ctx = h.context(stepping(NodeDeletionPolicy {
        confirmations: 2,
        mode: NodeDeletionMode::Report,
        ..Default::default()
    }));
    let uid = seed_not_ready(&h, &ctx, "fake://12345").await;
    let before = h.server.controls().get("nodes", "", "node0").unwrap();
    let recorder = ctx.recorder(node_lifecycle::COMPONENT);
    let mut monitor = NodeMonitor::default();
    let withheld = || h.metrics.node_deletions_withheld.get();
    monitor.pass(&ctx, &recorder).await;
    assert_eq!(withheld(), 0, "one answer of two");
    for _ in 0..3 {
        monitor.pass(&ctx, &recorder).await;
        assert_eq!(withheld(), 1, "counted once per run");
    }
    assert_eq!(monitor.answers(&uid), 4);
    assert_eq!(
        h.server.controls().get("nodes", "", "node0").as_ref(),
        Some(&before),
        "node kept as it was"
    );
    assert_eq!(node_writes(&h), 0, "no write to the node");
    assert_eq!(h.metrics.node_deletions.get(), 0);
    flush_events(&h, &recorder).await;
    let ev = events_of(&h, "NodeDeletionWithheld");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["count"], 1);
    assert_eq!(ev[0]["type"], "Warning");
    let msg = ev[0]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "Instance fake://12345 does not exist in the cloud (InstanceExists returned false; 2 answers in a row over "
        ),
        "{msg}"
    );
    assert!(
        msg.ends_with("; not deleting node node0 (--node-deletion-mode=report)"),
        "{msg}"
    );
    assert_eq!(ev[0]["involvedObject"]["uid"], before["metadata"]["uid"]);
    for reason in ["DeletingNode", "InstanceDoesNotExist"] {
        assert!(events_of(&h, reason).is_empty(), "no {reason}");
    }
    let text = ccm_host::runtime::metrics::render(&h.registry);
    assert!(
        text.contains("\nccm_node_deletions_withheld_total 1\n"),
        "{text}"
    );
    assert!(text.contains("\nccm_node_deletions_total 0\n"), "{text}");

    // The instance comes back, then goes again: a new run, reported again.
    h.set_control(&fake(
        json!({"providerName": "fake", "autoInstances": false,
                                "instances": [instance(json!({}))]}),
    ));
    monitor.pass(&ctx, &recorder).await;
    assert_eq!(monitor.answers(&uid), 0);
    h.set_control(&gone_cloud(json!({})));
    monitor.pass(&ctx, &recorder).await;
    monitor.pass(&ctx, &recorder).await;
    assert_eq!(withheld(), 2);
    assert!(node0_exists(&h));
    assert_eq!(node_deletes(&h), 0);
}

/// --node-deletion-on-instance-not-found: an InstancesV2 InstanceExists failing with
/// InstanceNotFound deletes; without it (upstream) the node is kept. The legacy interface's
/// InstanceExistsByProviderID is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_not_found_counts_as_gone_only_when_asked() {
    let not_found = |method: &str| {
        fake(json!({"providerName": "fake", "autoInstances": false,
                    "instances": [instance(json!({}))],
                    "errors": {method: {"kind": "instance_not_found"}}}))
    };
    let opt_in = NodeDeletionPolicy {
        on_instance_not_found: true,
        ..Default::default()
    };
    for (provider, method, policy, deleted) in [
        (
            "fake",
            "InstanceExists",
            NodeDeletionPolicy::default(),
            false,
        ),
        ("fake", "InstanceExists", opt_in.clone(), true),
        (
            "fake-v1",
            "InstanceExistsByProviderID",
            opt_in.clone(),
            false,
        ),
    ] {
        let case = format!("{provider} {method} {policy:?}");
        let h = Harness::start(provider, not_found(method)).await;
        let ctx = h.context(stepping(policy));
        seed_not_ready(&h, &ctx, "fake://12345").await;
        let recorder = ctx.recorder(node_lifecycle::COMPONENT);
        let mut monitor = NodeMonitor::default();
        for _ in 0..3 {
            monitor.pass(&ctx, &recorder).await;
        }
        flush_events(&h, &recorder).await;
        if deleted {
            assert!(!node0_exists(&h), "{case}");
            assert_eq!(h.metrics.node_deletions.get(), 1, "{case}");
            assert_eq!(
                events_of(&h, "InstanceDoesNotExist")[0]["message"],
                "Instance fake://12345 does not exist in the cloud (InstanceExists failed with \
                 InstanceNotFound (instance not found), counted as does not exist by \
                 --node-deletion-on-instance-not-found); deleting node node0",
                "{case}"
            );
            assert_eq!(events_of(&h, "DeletingNode").len(), 1, "{case}");
        } else {
            assert!(node0_exists(&h), "{case}: kept forever");
            assert_eq!(node_deletes(&h), 0, "{case}");
            assert!(
                events(&h).iter().all(|e| e["reason"] == "Sentinel"),
                "{case}"
            );
        }
    }
}

/// A pass over many NotReady nodes on the per-node path checks them concurrently, never more at
/// once than the node-status workers (`--concurrent-node-status-updates`), and with one worker
/// one by one, as upstream. The concurrency is read at the fake: each call records how many
/// other calls were in their 100 ms latency wait when it arrived (`delayed`), so the most calls
/// in the plugin at once is at least the largest `delayed` + 1, and at most the host's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pass_checks_not_ready_nodes_concurrently_within_the_bound() {
    const NODES: usize = 40;
    for (workers, expect_concurrent) in [(8, true), (1, false)] {
        let h = Harness::start(
            "fake",
            fake(json!({"providerName": "fake",
                        "latency": {"InstanceExists": "100ms", "InstanceShutdown": "100ms"}})),
        )
        .await;
        let ctx = h.context(ControllerConfig {
            node_monitor_period: Duration::ZERO,
            concurrent_node_status_updates: workers,
            ..Default::default()
        });
        for i in 0..NODES {
            h.server
                .controls()
                .seed(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": format!("node-{i:02}")},
                    "spec": {"providerID": format!("fake://node-{i:02}")},
                    "status": {"conditions": [{"type": "Ready", "status": "False"}]},
                }))
                .unwrap();
        }
        assert!(ctx.nodes.wait_synced().await);
        eventually("nodes cached", WAIT, || {
            (ctx.nodes.list().len() == NODES).then_some(())
        })
        .await;
        let recorder = ctx.recorder(node_lifecycle::COMPONENT);
        NodeMonitor::default().pass(&ctx, &recorder).await;

        let calls = h.calls();
        for call in ["instance-exists", "instance-shutdown"] {
            assert_eq!(
                calls.iter().filter(|c| c.call == call).count(),
                NODES,
                "{workers} workers: one {call} per NotReady node"
            );
        }
        let most_at_once = calls
            .iter()
            .filter(|c| c.call.starts_with("instance-"))
            .map(|c| c.delayed + 1)
            .max()
            .unwrap();
        assert!(
            most_at_once <= workers as u64,
            "{workers} workers: {most_at_once} calls in the plugin at once"
        );
        if expect_concurrent {
            assert!(
                most_at_once > 1,
                "{workers} workers: the checks ran one at a time"
            );
        }
        assert_eq!(
            h.server.controls().list("nodes").len(),
            NODES,
            "no node deleted"
        );
    }
}
