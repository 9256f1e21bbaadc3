//! Cloud-node-lifecycle controller against the in-memory API server and the fake provider's
//! `.so` (docs/upstream-compat.md#node-lifecycle-controller, with the cases of upstream's
//! `controllers/nodelifecycle/node_lifecycle_controller_test.go`), V1 (`fake-v1`) and V2 (`fake`) variants.

use std::time::Duration;

use ccm_host::controllers::node_lifecycle::{self, get_provider_id, monitor_nodes};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_abi::ErrorKind;
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::Node;
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
