//! Service load-balancer controller against the in-memory API server and the fake provider's
//! `.so` (docs/upstream-compat.md#service-controller, with the cases of upstream's
//! `controllers/service/controller_test.go`). Single steps are driven through the controller's
//! public methods, as upstream's tests call `syncService` / `syncNodes`; the end-to-end cases
//! run the whole controller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_host::controllers::service::{self, Requeue, ServiceController};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::runtime::well_known::LB_CLEANUP_FINALIZER;
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);
const NS: &str = "default";

fn fake(config: Value) -> FakeConfig {
    serde_json::from_value(config).expect("fake config")
}

fn node_json(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"providerID": format!("fake://{name}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn svc_json(name: &str, type_: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"type": type_, "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    })
}

fn key(name: &str) -> String {
    format!("{NS}/{name}")
}

struct Env {
    h: Harness,
    ctx: ControllerContext,
    ctrl: Arc<ServiceController>,
}

impl Env {
    async fn start(fake_config: FakeConfig, config: ControllerConfig, nodes: &[&str]) -> Env {
        let h = Harness::start("fake", fake_config).await;
        for n in nodes {
            h.server.controls().seed(node_json(n)).expect("seed node");
        }
        let ctx = h.context(config);
        assert!(ctx.nodes.wait_synced().await && ctx.services.wait_synced().await);
        let want = nodes.len();
        eventually("node cache", WAIT, || {
            (ctx.nodes.list().len() == want).then_some(())
        })
        .await;
        let ctrl = ServiceController::new(ctx.clone()).expect("fake offers LoadBalancer");
        Env { h, ctx, ctrl }
    }

    async fn default(nodes: &[&str]) -> Env {
        Self::start(FakeConfig::default(), ControllerConfig::default(), nodes).await
    }

    fn run(&self) {
        tokio::spawn(self.ctrl.clone().run());
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.h.client.clone(), NS)
    }

    /// A JSON merge patch of service `name`.
    async fn merge(&self, name: &str, body: Value) {
        self.services()
            .patch(name, &PatchParams::default(), &Patch::Merge(body))
            .await
            .unwrap();
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.h.client.clone())
    }

    /// Seed a service and wait until the informer has it.
    async fn seed(&self, svc: Value) -> Service {
        let name = svc["metadata"]["name"].as_str().unwrap().to_string();
        self.h.server.controls().seed(svc).expect("seed service");
        self.cached(&name, |_| true).await
    }

    /// Wait until the informer's copy of `name` satisfies `pred`.
    async fn cached(&self, name: &str, pred: impl Fn(&Service) -> bool) -> Service {
        let store = self.ctx.services.store().clone();
        let r = format!("{NS}/{name}");
        eventually(&format!("informer copy of {name}"), WAIT, || {
            store.get(&r).filter(|s| pred(s)).map(|s| (*s).clone())
        })
        .await
    }

    async fn gone_from_cache(&self, name: &str) {
        let store = self.ctx.services.store().clone();
        let r = format!("{NS}/{name}");
        eventually(&format!("{name} gone from the informer"), WAIT, || {
            store.get(&r).is_none().then_some(())
        })
        .await;
    }

    async fn node_count(&self, n: usize) {
        let ctx = self.ctx.clone();
        eventually("node cache size", WAIT, || {
            (ctx.nodes.list().len() == n).then_some(())
        })
        .await;
    }

    fn stored(&self, name: &str) -> Option<Value> {
        self.h.server.controls().get("services", NS, name)
    }

    /// PATCH requests to the service (all go to services/status).
    fn patches(&self, name: &str) -> Vec<Value> {
        self.h
            .server
            .controls()
            .requests()
            .into_iter()
            .filter(|r| r.verb == "patch" && r.resource == "services" && r.name == name)
            .map(|r| {
                assert_eq!(
                    r.subresource, "status",
                    "service patches go through services/status"
                );
                r.json()
            })
            .collect()
    }

    fn calls(&self, call: &str) -> Vec<ccm_provider_fake::control::CallRecord> {
        self.h
            .calls()
            .into_iter()
            .filter(|c| c.call == call)
            .collect()
    }

    fn calls_for(&self, call: &str, name: &str) -> Vec<Vec<String>> {
        let k = key(name);
        self.calls(call)
            .into_iter()
            .filter(|c| c.arg("service") == Some(k.as_str()))
            .map(|c| {
                let mut h = c.hosts();
                h.sort();
                h
            })
            .collect()
    }

    /// Events (type, reason, message) about service `name`, once `pred` holds for them.
    async fn events_until(
        &self,
        name: &str,
        pred: impl Fn(&[(String, String, String)]) -> bool,
    ) -> Vec<(String, String, String)> {
        let controls = self.h.server.controls();
        eventually(&format!("events of {name}"), WAIT, || {
            let evs: Vec<(String, String, String)> = controls
                .list("events")
                .into_iter()
                .filter(|e| {
                    e["involvedObject"]["name"] == name && e["involvedObject"]["kind"] == "Service"
                })
                .map(|e| {
                    assert_eq!(e["source"]["component"], service::COMPONENT);
                    (
                        e["type"].as_str().unwrap_or_default().to_string(),
                        e["reason"].as_str().unwrap_or_default().to_string(),
                        e["message"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            pred(&evs).then_some(evs)
        })
        .await
    }

    async fn has_event(&self, name: &str, type_: &str, reason: &str, message: &str) {
        self.events_until(name, |evs| {
            evs.iter()
                .any(|(t, r, m)| t == type_ && r == reason && m == message)
        })
        .await;
    }
}

fn finalizers(v: &Value) -> Vec<String> {
    v["metadata"]["finalizers"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn ingress_ips(v: &Value) -> Vec<String> {
    v["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn has_status(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

fn has_finalizer(s: &Service) -> bool {
    s.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == LB_CLEANUP_FINALIZER))
}

/// Provision `name` through one sync and wait until the informer shows its status.
async fn provisioned(env: &Env, name: &str) -> Service {
    env.seed(svc_json(name, "LoadBalancer")).await;
    env.ctrl.sync_service(&key(name)).await.expect("sync");
    env.cached(name, |s| has_status(s) && has_finalizer(s))
        .await
}

// ---- TestSyncLoadBalancerIfNeeded ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_cluster_ip_service_deletes_nothing_and_writes_nothing() {
    let env = Env::default(&["n1"]).await;
    // Not cached (it cannot have a load balancer): seen once a later service is.
    env.h
        .server
        .controls()
        .seed(svc_json("cip", "ClusterIP"))
        .unwrap();
    env.seed(svc_json("marker", "LoadBalancer")).await;
    assert!(env.ctx.services.list().len() == 1);
    env.ctrl.sync_service(&key("cip")).await.expect("sync");
    assert!(
        env.calls("create").is_empty()
            && env.calls("update").is_empty()
            && env.calls("delete").is_empty()
    );
    assert!(env.patches("cip").is_empty());
    assert!(
        env.ctrl.cached_service(&key("cip")).is_none(),
        "delete op drops the cache entry"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_load_balancer_adds_finalizer_before_the_cloud_then_patches_status() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let env = Env::start(
        fake(json!({"pause": {"EnsureLoadBalancer": gate.path()}})),
        ControllerConfig {
            cluster_name: "my-cluster".into(),
            ..Default::default()
        },
        &["n1", "n2"],
    )
    .await;
    let mut svc = svc_json("lb", "LoadBalancer");
    svc["spec"]["ports"] = json!([
        {"name": "udp", "port": 53, "protocol": "UDP", "targetPort": 53},
        {"name": "tcp", "port": 80, "protocol": "TCP", "targetPort": 8080},
        {"name": "sctp", "port": 9000, "protocol": "SCTP", "targetPort": 9000},
    ]);
    env.seed(svc).await;
    let ctrl = env.ctrl.clone();
    let sync = tokio::spawn(async move { ctrl.sync_service(&key("lb")).await });
    // While the cloud call is blocked, the finalizer is already stored and no status yet.
    eventually("create call", WAIT, || {
        (!env.calls("create").is_empty()).then_some(())
    })
    .await;
    let during = env.stored("lb").unwrap();
    assert_eq!(finalizers(&during), [LB_CLEANUP_FINALIZER]);
    assert!(ingress_ips(&during).is_empty());
    drop(gate);
    sync.await.unwrap().expect("sync");

    let after = env.stored("lb").unwrap();
    let lb = env
        .h
        .cloud()
        .load_balancer(&key("lb"))
        .cloned()
        .expect("LB created");
    assert_eq!(lb.cluster, "my-cluster");
    assert_eq!(lb.hosts, ["n1", "n2"]);
    let protos: Vec<_> = lb
        .ports
        .iter()
        .map(|p| (p.protocol.clone(), p.port))
        .collect();
    assert_eq!(
        protos,
        [
            ("UDP".into(), 53),
            ("TCP".into(), 80),
            ("SCTP".into(), 9000)
        ]
    );
    assert_eq!(ingress_ips(&after), vec![lb.load_balancer_ip.clone()]);
    let patches = env.patches("lb");
    assert_eq!(patches.len(), 2, "finalizer + status: {patches:?}");
    assert_eq!(
        patches[0],
        json!({"metadata": {"finalizers": [LB_CLEANUP_FINALIZER]}})
    );
    assert!(patches[1]["status"]["loadBalancer"]["ingress"].is_array());
    env.has_event(
        "lb",
        "Normal",
        "EnsuringLoadBalancer",
        "Ensuring load balancer",
    )
    .await;
    env.has_event(
        "lb",
        "Normal",
        "EnsuredLoadBalancer",
        "Ensured load balancer",
    )
    .await;
    assert_eq!(
        env.ctrl.last_synced_node_names(&key("lb")).unwrap(),
        ["n1", "n2"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_service_with_a_class_is_a_delete_op_that_writes_nothing() {
    let env = Env::default(&["n1"]).await;
    let mut svc = svc_json("classed", "LoadBalancer");
    svc["spec"]["loadBalancerClass"] = json!("example.com/other");
    env.seed(svc).await;
    env.ctrl.sync_service(&key("classed")).await.expect("sync");
    assert!(env.calls("create").is_empty() && env.calls("delete").is_empty());
    assert!(env.patches("classed").is_empty());
    assert!(env.h.cloud().load_balancers.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_service_no_longer_load_balancer_deletes_lb_then_finalizer_and_status() {
    let env = Env::default(&["n1"]).await;
    provisioned(&env, "was-lb").await;
    env.merge("was-lb", json!({"spec": {"type": "ClusterIP"}}))
        .await;
    env.cached("was-lb", |s| {
        s.spec.as_ref().unwrap().type_.as_deref() == Some("ClusterIP")
    })
    .await;
    env.h.server.controls().clear_requests();
    env.h.clear_calls();
    env.ctrl.sync_service(&key("was-lb")).await.expect("sync");
    assert_eq!(env.calls("delete").len(), 1);
    assert!(env.h.cloud().load_balancers.is_empty());
    let patches = env.patches("was-lb");
    assert_eq!(patches.len(), 2, "{patches:?}");
    assert_eq!(
        patches[0],
        json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [LB_CLEANUP_FINALIZER]}})
    );
    assert_eq!(
        patches[1],
        json!({"status": {"loadBalancer": {"ingress": null}}})
    );
    let stored = env.stored("was-lb").unwrap();
    assert!(finalizers(&stored).is_empty() && ingress_ips(&stored).is_empty());
    env.has_event(
        "was-lb",
        "Normal",
        "DeletingLoadBalancer",
        "Deleting load balancer",
    )
    .await;
    env.has_event(
        "was-lb",
        "Normal",
        "DeletedLoadBalancer",
        "Deleted load balancer",
    )
    .await;
    assert!(env.ctrl.cached_service(&key("was-lb")).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_deleting_service_deletes_lb_and_releases_the_object() {
    let env = Env::default(&["n1"]).await;
    provisioned(&env, "bye").await;
    env.services()
        .delete("bye", &DeleteParams::default())
        .await
        .unwrap();
    env.cached("bye", |s| s.metadata.deletion_timestamp.is_some())
        .await;
    env.h.server.controls().clear_requests();
    env.ctrl
        .sync_service(&key("bye"))
        .await
        .expect("NotFound of the status patch is ignored");
    assert_eq!(env.calls("delete").len(), 1);
    assert!(env.h.cloud().load_balancers.is_empty());
    assert_eq!(
        env.patches("bye").len(),
        2,
        "finalizer removal + status clear"
    );
    assert!(
        env.stored("bye").is_none(),
        "object deleted once the finalizer is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_with_finalizer_already_present_patches_only_status_and_repeats_write_nothing() {
    let env = Env::default(&["n1"]).await;
    let mut svc = svc_json("fin", "LoadBalancer");
    svc["metadata"]["finalizers"] = json!([LB_CLEANUP_FINALIZER]);
    env.seed(svc).await;
    env.ctrl.sync_service(&key("fin")).await.expect("sync");
    let patches = env.patches("fin");
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert!(patches[0]["status"].is_object());
    // Nothing changes on a second sync: no finalizer patch, no status patch.
    env.cached("fin", has_status).await;
    env.h.server.controls().clear_requests();
    env.ctrl.sync_service(&key("fin")).await.expect("sync");
    assert!(env.patches("fin").is_empty());
    assert_eq!(env.calls("create").len(), 2);
}

// ---- TestUpdateNodesInExternalLoadBalancer ---------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_sync_updates_only_load_balancer_services_for_any_worker_count() {
    for workers in [1, 2, 5] {
        let env = Env::start(
            fake(json!({"errors": {"EnsureLoadBalancerDeleted": {"message": "cannot delete"}}})),
            ControllerConfig {
                concurrent_service_syncs: workers,
                ..Default::default()
            },
            &["n1", "n2"],
        )
        .await;
        for name in ["a", "b", "c"] {
            provisioned(&env, name).await;
        }
        // "c" turns ClusterIP and its cloud delete fails: the cache keeps a non-LB entry.
        env.merge("c", json!({"spec": {"type": "ClusterIP"}})).await;
        env.cached("c", |s| {
            s.spec.as_ref().unwrap().type_.as_deref() == Some("ClusterIP")
        })
        .await;
        let err = env.ctrl.sync_service(&key("c")).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to delete load balancer: cannot delete"
        );
        assert!(env.ctrl.cached_service(&key("c")).is_some());

        env.h.server.controls().seed(node_json("n3")).unwrap();
        env.node_count(3).await;
        env.h.clear_calls();
        let retry = env.ctrl.sync_nodes().await;
        assert!(retry.is_empty(), "{retry:?}");
        let updates = env.calls("update");
        assert_eq!(updates.len(), 2, "workers={workers}: {updates:?}");
        assert_eq!(
            env.h.metrics.service_lb_sync_total.get(),
            2,
            "one per UpdateLoadBalancer"
        );
        assert_eq!(env.h.metrics.service_nodesync_error_total.get(), 0);
        for name in ["a", "b"] {
            assert_eq!(
                env.calls_for("update", name),
                [vec!["n1", "n2", "n3"]],
                "workers={workers}"
            );
        }
        env.has_event(
            "a",
            "Normal",
            "UpdatedLoadBalancer",
            "Updated load balancer with new hosts",
        )
        .await;
    }
}

// ---- TestNodeChangesForStableNodeSetEnabled / TestNodesNotEqual ------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_changes_update_hosts_only_when_the_stable_set_changes() {
    let env = Env::default(&["n1", "n2"]).await;
    provisioned(&env, "s1").await;
    let mut local = svc_json("s2", "LoadBalancer");
    local["spec"]["externalTrafficPolicy"] = json!("Local");
    env.seed(local).await;
    env.ctrl.sync_service(&key("s2")).await.unwrap();

    let nodes = env.nodes();
    // One step: change, wait for the informer, node sync, expected host list (None = no update).
    async fn step(env: &Env, what: &str, expect: Option<&[&str]>) {
        env.h.clear_calls();
        let retry = env.ctrl.sync_nodes().await;
        assert!(retry.is_empty(), "{what}: {retry:?}");
        match expect {
            None => assert!(
                env.calls("update").is_empty(),
                "{what}: {:?}",
                env.calls("update")
            ),
            Some(hosts) => {
                for s in ["s1", "s2"] {
                    assert_eq!(env.calls_for("update", s), [hosts.to_vec()], "{what} ({s})");
                }
            }
        }
    }
    let patch_node = |name: &'static str, body: Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap();
        }
    };
    let patch_node_status = |name: &'static str, ready: &'static str| {
        let nodes = nodes.clone();
        async move {
            let body = json!({"status": {"conditions": [{"type": "Ready", "status": ready}]}});
            nodes
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
                .await
                .unwrap();
        }
    };
    let node_is = |name: &'static str, pred: fn(&Node) -> bool| {
        let ctx = env.ctx.clone();
        async move {
            eventually(&format!("node {name}"), WAIT, || {
                ctx.nodes
                    .store()
                    .get(name)
                    .filter(|n| pred(&n.to_node()))
                    .map(|_| ())
            })
            .await
        }
    };
    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c[0].status == "True")
    };

    step(&env, "no change", None).await;
    patch_node_status("n1", "False").await;
    node_is("n1", |n| {
        !n.status
            .as_ref()
            .unwrap()
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .any(|c| c.status == "True")
    })
    .await;
    step(&env, "node NotReady", None).await;
    patch_node_status("n1", "True").await;
    node_is("n1", ready).await;
    step(&env, "node Ready again", None).await;
    patch_node(
        "n1",
        json!({"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}),
    )
    .await;
    node_is("n1", |n| n.spec.as_ref().unwrap().taints.is_some()).await;
    step(&env, "unrelated taint", None).await;

    env.h.server.controls().seed(node_json("n3")).unwrap();
    env.node_count(3).await;
    step(&env, "node added", Some(&["n1", "n2", "n3"])).await;

    patch_node("n3", json!({"spec": {"taints": [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}]}})).await;
    node_is("n3", |n| n.spec.as_ref().unwrap().taints.is_some()).await;
    step(&env, "ToBeDeleted taint", Some(&["n1", "n2"])).await;

    patch_node("n2", json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}})).await;
    node_is("n2", |n| n.metadata.labels.is_some()).await;
    step(&env, "excluded", Some(&["n1"])).await;

    patch_node("n2", json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "false"}}})).await;
    node_is("n2", |n| {
        n.metadata
            .labels
            .as_ref()
            .unwrap()
            .values()
            .any(|v| v == "false")
    })
    .await;
    step(&env, "exclusion label false", Some(&["n1", "n2"])).await;

    let mut keep = node_json("n4");
    keep["metadata"]["finalizers"] = json!(["test.example/keep"]);
    env.h.server.controls().seed(keep).unwrap();
    env.node_count(4).await;
    step(&env, "n4 added", Some(&["n1", "n2", "n4"])).await;
    nodes.delete("n4", &DeleteParams::default()).await.unwrap();
    node_is("n4", |n| n.metadata.deletion_timestamp.is_some()).await;
    step(&env, "deletionTimestamp", Some(&["n1", "n2"])).await;

    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    env.node_count(3).await; // n1, n3 (tainted), n4 (deleting)
    step(&env, "node deleted", Some(&["n1"])).await;

    // providerID set on a node that had none (it cannot change once set): same names, update.
    let mut bare = node_json("n5");
    bare["spec"] = json!({});
    env.h.server.controls().seed(bare).unwrap();
    env.node_count(4).await;
    step(&env, "n5 added", Some(&["n1", "n5"])).await;
    patch_node("n5", json!({"spec": {"providerID": "fake://n5"}})).await;
    node_is("n5", |n| n.spec.as_ref().unwrap().provider_id.is_some()).await;
    step(&env, "providerID changed", Some(&["n1", "n5"])).await;

    // A failed update is retried through the service queue, not by the next node sync.
    env.h.set_control(&fake(
        json!({"errors": {"UpdateLoadBalancer": {"message": "update broke"}}}),
    ));
    env.h.server.controls().seed(node_json("n6")).unwrap();
    env.node_count(5).await;
    env.h.clear_calls();
    let retry = env.ctrl.sync_nodes().await;
    assert_eq!(
        retry.into_iter().collect::<Vec<_>>(),
        [key("s1"), key("s2")]
    );
    assert_eq!(env.calls("update").len(), 2);
    assert_eq!(
        env.calls("get-load-balancer").len(),
        2,
        "GetLoadBalancer fallback"
    );
    assert_eq!(env.h.metrics.service_nodesync_error_total.get(), 2);
    env.has_event(
        "s1",
        "Warning",
        "UpdateLoadBalancerFailed",
        "Error updating load balancer with new hosts [n1 n5 n6] [node names limited, total number of nodes: 3], error: update broke",
    )
    .await;
    step(&env, "same nodes after a failed update", None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_update_of_a_missing_load_balancer_is_success() {
    let env = Env::start(
        fake(json!({"implementedElsewhere": ["default/elsewhere"]})),
        ControllerConfig::default(),
        &["n1"],
    )
    .await;
    env.seed(svc_json("elsewhere", "LoadBalancer")).await;
    env.ctrl
        .sync_service(&key("elsewhere"))
        .await
        .expect("ImplementedElsewhere is success");
    // No status, no EnsuredLoadBalancer, the finalizer stays.
    let stored = env.stored("elsewhere").unwrap();
    assert_eq!(finalizers(&stored), [LB_CLEANUP_FINALIZER]);
    assert!(ingress_ips(&stored).is_empty());
    assert_eq!(env.patches("elsewhere").len(), 1);
    // Now the cloud forgets the exemption: UpdateLoadBalancer fails (no such LB), and
    // GetLoadBalancer reports none, so the node sync counts it as done.
    env.h.set_control(&FakeConfig::default());
    env.h.server.controls().seed(node_json("n2")).unwrap();
    env.node_count(2).await;
    env.h.clear_calls();
    assert!(env.ctrl.sync_nodes().await.is_empty());
    assert_eq!(env.h.call_names(), ["update", "get-load-balancer"]);
    let evs = env
        .events_until("elsewhere", |e| {
            e.iter().any(|x| x.1 == "EnsuringLoadBalancer")
        })
        .await;
    assert!(
        !evs.iter()
            .any(|e| e.1 == "EnsuredLoadBalancer" || e.1 == "UpdateLoadBalancerFailed"),
        "{evs:?}"
    );
}

// ---- TestSlowNodeSync ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_node_sync_does_not_overwrite_a_fresher_ensure() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let env = Env::default(&["node1"]).await;
    provisioned(&env, "service1").await;
    provisioned(&env, "service2").await;
    env.h.server.controls().seed(node_json("node2")).unwrap();
    env.node_count(2).await;
    env.h
        .set_control(&fake(json!({"pause": {"UpdateLoadBalancer": gate.path()}})));
    env.h.clear_calls();

    let ctrl = env.ctrl.clone();
    let node_sync = tokio::spawn(async move { ctrl.sync_nodes().await }); // 1 worker
    let first = eventually("first update call (blocked)", WAIT, || {
        env.calls("update").first().cloned()
    })
    .await;
    let blocked = first.arg("service").unwrap().to_string();
    let other = if blocked == key("service1") {
        "service2"
    } else {
        "service1"
    };

    env.h.server.controls().seed(node_json("node3")).unwrap();
    env.node_count(3).await;
    env.ctrl
        .sync_service(&key(other))
        .await
        .expect("sync of the other service");
    drop(gate);
    let retry = node_sync.await.unwrap();
    assert!(retry.is_empty());

    let updates = env.calls("update");
    assert_eq!(updates.len(), 1, "{updates:?}");
    let mut hosts = updates[0].hosts();
    hosts.sort();
    assert_eq!(hosts, ["node1", "node2"]);
    let ensures = env.calls("create");
    assert_eq!(ensures.len(), 1);
    assert_eq!(ensures[0].arg("service"), Some(key(other).as_str()));
    let mut hosts = ensures[0].hosts();
    hosts.sort();
    assert_eq!(hosts, ["node1", "node2", "node3"]);
}

// ---- TestProcessServiceCreateOrUpdate / K8sError / TestSyncService ---------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_holds_the_latest_processed_object() {
    let env = Env::default(&["n1"]).await;
    provisioned(&env, "ip").await;
    env.merge("ip", json!({"spec": {"loadBalancerIP": "203.0.113.7"}}))
        .await;
    env.cached("ip", |s| {
        s.spec.as_ref().unwrap().load_balancer_ip.is_some()
    })
    .await;
    env.ctrl.sync_service(&key("ip")).await.unwrap();
    let cached = env.ctrl.cached_service(&key("ip")).unwrap();
    assert_eq!(
        cached.spec.as_ref().unwrap().load_balancer_ip.as_deref(),
        Some("203.0.113.7")
    );
    assert_eq!(ingress_ips(&env.stored("ip").unwrap()), ["203.0.113.7"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_patch_conflict_is_an_error_and_not_found_is_success() {
    let env = Env::default(&["n1"]).await;
    for name in ["conflict", "notfound"] {
        let mut svc = svc_json(name, "LoadBalancer");
        svc["metadata"]["finalizers"] = json!([LB_CLEANUP_FINALIZER]);
        env.seed(svc).await;
    }
    env.h.server.controls().force_conflicts(1, "services");
    let err = env.ctrl.sync_service(&key("conflict")).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.starts_with("failed to update load balancer status: "),
        "{msg}"
    );
    assert!(err.retry_after().is_none());
    env.has_event(
        "conflict",
        "Warning",
        "SyncLoadBalancerFailed",
        &format!("Error syncing load balancer: {msg}"),
    )
    .await;

    env.h
        .server
        .controls()
        .fail_next(1, "patch", "services", 404);
    env.ctrl
        .sync_service(&key("notfound"))
        .await
        .expect("NotFound is ignored");
    assert!(
        ingress_ips(&env.stored("notfound").unwrap()).is_empty(),
        "the failed patch wrote nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_service_key_format_and_valid_service() {
    let env = Env::default(&["n1"]).await;
    let err = env.ctrl.sync_service("a/b/c").await.unwrap_err();
    assert_eq!(err.to_string(), "unexpected key format: \"a/b/c\"");
    env.seed(svc_json("ok", "LoadBalancer")).await;
    env.ctrl
        .sync_service(&key("ok"))
        .await
        .expect("valid LB service");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nil_status_from_the_cloud_is_an_error() {
    let env = Env::start(
        fake(json!({"ensureReturnsNil": true})),
        ControllerConfig::default(),
        &["n1"],
    )
    .await;
    env.seed(svc_json("nil", "LoadBalancer")).await;
    let err = env.ctrl.sync_service(&key("nil")).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "service status returned by EnsureLoadBalancer is nil"
    );
    env.has_event(
        "nil",
        "Warning",
        "SyncLoadBalancerFailed",
        "Error syncing load balancer: service status returned by EnsureLoadBalancer is nil",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_nodes_warns_and_still_calls_the_cloud() {
    let env = Env::default(&[]).await;
    env.seed(svc_json("lonely", "LoadBalancer")).await;
    env.ctrl.sync_service(&key("lonely")).await.unwrap();
    assert_eq!(env.calls_for("create", "lonely"), [Vec::<String>::new()]);
    env.has_event(
        "lonely",
        "Warning",
        "UnAvailableLoadBalancer",
        "There are no available nodes for LoadBalancer",
    )
    .await;
}

// ---- TestProcessServiceDeletion / re-created services ----------------------------------------

/// Remove the finalizer by hand and delete the service: it vanishes from the lister while the
/// controller's cache still holds it.
async fn vanish(env: &Env, name: &str) {
    env.merge(name, json!({"metadata": {"finalizers": null}}))
        .await;
    env.services()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    env.gone_from_cache(name).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_service_is_cleaned_up_from_the_cache() {
    let env = Env::default(&["n1"]).await;
    env.ctrl
        .sync_service(&key("never-seen"))
        .await
        .expect("unknown key is nothing to do");
    provisioned(&env, "del").await;
    vanish(&env, "del").await;

    env.h.set_control(&fake(
        json!({"errors": {"EnsureLoadBalancerDeleted": {"message": "cloud says no"}}}),
    ));
    let err = env.ctrl.sync_service(&key("del")).await.unwrap_err();
    assert_eq!(err.to_string(), "cloud says no", "returned verbatim");
    assert!(env.ctrl.cached_service(&key("del")).is_some());
    env.has_event(
        "del",
        "Warning",
        "DeleteLoadBalancerFailed",
        "Error deleting load balancer: cloud says no",
    )
    .await;

    env.h.set_control(&FakeConfig::default());
    env.ctrl.sync_service(&key("del")).await.unwrap();
    assert!(env.ctrl.cached_service(&key("del")).is_none());
    assert!(env.h.cloud().load_balancers.is_empty());
    env.has_event(
        "del",
        "Normal",
        "DeletedLoadBalancer",
        "Deleted load balancer",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recreated_service_with_another_uid_replaces_the_old_load_balancer() {
    let env = Env::default(&["n1"]).await;
    let old = provisioned(&env, "again").await;
    vanish(&env, "again").await;
    let new = env.seed(svc_json("again", "LoadBalancer")).await;
    assert_ne!(old.metadata.uid, new.metadata.uid);
    env.h.clear_calls();
    env.ctrl.sync_service(&key("again")).await.unwrap();
    assert_eq!(env.h.call_names(), ["delete", "create"]);
    let lb = env.h.cloud().load_balancer(&key("again")).cloned().unwrap();
    assert_eq!(Some(lb.uid), new.metadata.uid);
    assert_eq!(
        env.ctrl.cached_service(&key("again")).unwrap().metadata.uid,
        new.metadata.uid
    );
}

// ---- TestServiceQueueDelay -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_queue_delay_follows_the_retry_policy() {
    let env = Env::default(&["n1"]).await;
    env.seed(svc_json("q", "LoadBalancer")).await;
    let q = env.ctrl.service_queue();
    let k = key("q");

    q.add(k.clone());
    assert_eq!(
        env.ctrl.process_next_service_item().await,
        Some((k.clone(), Requeue::Forgotten))
    );
    assert_eq!(q.num_requeues(&k), 0);

    env.h.set_control(&fake(
        json!({"errors": {"EnsureLoadBalancer": {"message": "plain"}}}),
    ));
    q.add(k.clone());
    assert_eq!(
        env.ctrl.process_next_service_item().await,
        Some((k.clone(), Requeue::RateLimited))
    );
    assert_eq!(q.num_requeues(&k), 1);
    q.forget(&k);

    env.h.set_control(&fake(
        json!({"errors": {"EnsureLoadBalancer": {"kind": "retry_after", "retryAfter": "42s"}}}),
    ));
    q.add(k.clone());
    assert_eq!(
        env.ctrl.process_next_service_item().await,
        Some((k.clone(), Requeue::After(Duration::from_secs(42))))
    );
    assert_eq!(
        q.num_requeues(&k),
        0,
        "a RetryError is not counted as a failure"
    );
    assert!(q.is_empty(), "re-added only after the delay");
}

// ---- End to end ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_controller_provisions_follows_nodes_and_cleans_up() {
    let env = Env::default(&["n1"]).await;
    env.run();
    env.h
        .server
        .controls()
        .seed(svc_json("web", "LoadBalancer"))
        .unwrap();
    env.cached("web", has_status).await;
    // A new node reaches the LB through the node queue.
    env.h.server.controls().seed(node_json("n2")).unwrap();
    eventually("hosts follow the nodes", WAIT, || {
        (env.h.cloud().load_balancer(&key("web"))?.hosts == ["n1", "n2"]).then_some(())
    })
    .await;
    // Deleting the service deletes the LB, then the finalizer lets the object go.
    env.services()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("service gone", WAIT, || {
        env.stored("web").is_none().then_some(())
    })
    .await;
    assert!(env.h.cloud().load_balancers.is_empty());
    assert_eq!(env.calls_for("create", "web").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_from_the_cloud_is_retried_until_it_succeeds() {
    let env = Env::start(
        fake(json!({"errors": {"EnsureLoadBalancer": {"kind": "retry_after", "retryAfter": "1s", "times": 1}}})),
        ControllerConfig::default(),
        &["n1"],
    )
    .await;
    env.run();
    env.h
        .server
        .controls()
        .seed(svc_json("later", "LoadBalancer"))
        .unwrap();
    env.cached("later", has_status).await;
    assert_eq!(env.calls_for("create", "later").len(), 2);
    let evs = env
        .events_until("later", |e| {
            e.iter().any(|x| x.1 == "SyncLoadBalancerFailed")
        })
        .await;
    let failed = evs
        .iter()
        .find(|x| x.1 == "SyncLoadBalancerFailed")
        .unwrap();
    assert!(
        failed
            .2
            .starts_with("Error syncing load balancer: failed to ensure load balancer: "),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_service_while_ensure_is_slow_never_leaks_a_load_balancer() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let env = Env::start(
        fake(json!({"pause": {"EnsureLoadBalancer": gate.path()}})),
        ControllerConfig::default(),
        &["n1", "n2"],
    )
    .await;
    env.run();
    env.h
        .server
        .controls()
        .seed(svc_json("slow", "LoadBalancer"))
        .unwrap();
    eventually("ensure in progress", WAIT, || {
        (!env.calls("create").is_empty()).then_some(())
    })
    .await;
    env.services()
        .delete("slow", &DeleteParams::default())
        .await
        .unwrap();
    env.cached("slow", |s| s.metadata.deletion_timestamp.is_some())
        .await;
    drop(gate);
    eventually("service gone", WAIT, || {
        env.stored("slow").is_none().then_some(())
    })
    .await;
    eventually("LB table empty", WAIT, || {
        env.h.cloud().load_balancers.is_empty().then_some(())
    })
    .await;
    assert!(!env.calls("delete").is_empty());
}

/// Beyond upstream: node changes while the first EnsureLoadBalancer runs do not call
/// UpdateLoadBalancer on a load balancer that does not exist yet (upstream does, and real clouds
/// answer "not found" with an UpdateLoadBalancerFailed event); the service is re-ensured with
/// the current hosts instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_changes_during_the_first_ensure_re_ensure_instead_of_updating() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let env = Env::start(
        fake(json!({"pause": {"EnsureLoadBalancer": gate.path()}})),
        // The node sync the change queues runs at once (no coalescing interval), so it meets
        // the EnsureLoadBalancer still in progress; with the interval it could run after the
        // first ensure returned and update the (then existing) load balancer legitimately.
        ControllerConfig {
            node_sync_interval: Duration::ZERO,
            ..ControllerConfig::default()
        },
        &["n1"],
    )
    .await;
    env.run();
    env.h
        .server
        .controls()
        .seed(svc_json("first", "LoadBalancer"))
        .unwrap();
    eventually("ensure in progress", WAIT, || {
        (!env.calls("create").is_empty()).then_some(())
    })
    .await;
    env.h.server.controls().seed(node_json("n2")).unwrap();
    env.node_count(2).await;
    // A node sync now hands the service back to the service queue and calls nothing.
    assert_eq!(
        env.ctrl.sync_nodes().await.into_iter().collect::<Vec<_>>(),
        [key("first")]
    );
    assert!(env.calls("update").is_empty());
    drop(gate);
    eventually("the LB has both hosts", WAIT, || {
        (env.h.cloud().load_balancer(&key("first"))?.hosts == ["n1", "n2"]).then_some(())
    })
    .await;
    assert!(env.calls("update").is_empty(), "{:?}", env.h.call_names());
    let evs = env
        .events_until("first", |e| e.iter().any(|x| x.1 == "EnsuredLoadBalancer"))
        .await;
    assert!(
        !evs.iter().any(|e| e.1 == "UpdateLoadBalancerFailed"),
        "{evs:?}"
    );
}

/// Beyond upstream (ABI 1.2): a host update that runs while an EnsureLoadBalancer of the same
/// load balancer is in progress leaves the cloud with whichever of the two the plugin applied
/// last, here the ensure's older host list. The host then sends the whole current set once more
/// (upstream leaves the older list until the next node change), and does not take the ensure's
/// hosts as the base of the next incremental change (`LAST_FULL`, docs/abi-1.2.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_update_during_a_re_ensure_is_followed_by_the_whole_set() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("ensure-gate");
    let env = Env::start(
        fake(json!({"incrementalHosts": true, "pause": {"EnsureLoadBalancer": &gate}})),
        ControllerConfig {
            node_sync_interval: Duration::ZERO,
            ..ControllerConfig::default()
        },
        &["n1", "n2"],
    )
    .await;
    env.run();
    env.seed(svc_json("web", "LoadBalancer")).await;
    let hosts = |env: &Env| {
        env.h
            .cloud()
            .load_balancer(&key("web"))
            .map(|lb| lb.hosts.clone())
    };
    eventually("ensured with both hosts", WAIT, || {
        (env.ctrl.is_ensured(&key("web")) && hosts(&env)? == ["n1", "n2"]).then_some(())
    })
    .await;
    // A re-ensure (an annotation changed), held at its start; it listed n1 and n2.
    std::fs::write(&gate, b"").unwrap();
    env.h.clear_calls();
    env.merge(
        "web",
        json!({"metadata": {"annotations": {"touched": "1"}}}),
    )
    .await;
    eventually("re-ensure in progress", WAIT, || {
        (!env.calls("create").is_empty()).then_some(())
    })
    .await;
    // n3 joins meanwhile: its host update runs (the whole set: the ensure voided the token).
    env.h.server.controls().seed(node_json("n3")).unwrap();
    eventually("host update with n3", WAIT, || {
        env.calls("update-hosts")
            .iter()
            .any(|c| c.args["added"].to_string().contains("n3"))
            .then_some(())
    })
    .await;
    assert_eq!(hosts(&env).unwrap(), ["n1", "n2", "n3"]);
    // The ensure applies its older list last; the host follows with the whole current set.
    std::fs::remove_file(&gate).unwrap();
    let whole_sets = |env: &Env| {
        env.calls("update-hosts")
            .iter()
            .filter(|c| c.args["replace"] == true)
            .count()
    };
    eventually("a second whole set, after the ensure", WAIT, || {
        (whole_sets(&env) == 2 && hosts(&env)? == ["n1", "n2", "n3"]).then_some(())
    })
    .await;
    assert_eq!(env.calls("create").len(), 1, "{:?}", env.h.call_names());
    // The next change is a difference against that set, and lands.
    env.h.server.controls().seed(node_json("n4")).unwrap();
    eventually("n4 added", WAIT, || {
        (hosts(&env)? == ["n1", "n2", "n3", "n4"]).then_some(())
    })
    .await;
    let last = env.calls("update-hosts").pop().unwrap();
    assert_eq!(last.args["replace"], false, "{last:?}");
    assert_eq!(last.args["added"], json!(["n4"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_services_with_eight_workers_each_ensure_once() {
    let env = Env::start(
        FakeConfig::default(),
        ControllerConfig {
            concurrent_service_syncs: 8,
            ..Default::default()
        },
        &["n1", "n2", "n3"],
    )
    .await;
    env.run();
    let api = env.services();
    for i in 0..200 {
        let svc: Service =
            serde_json::from_value(svc_json(&format!("svc-{i:03}"), "LoadBalancer")).unwrap();
        api.create(&PostParams::default(), &svc).await.unwrap();
    }
    let controls = env.h.server.controls();
    eventually("200 ingress statuses", Duration::from_secs(120), || {
        let done = controls
            .list("services")
            .iter()
            .filter(|s| !ingress_ips(s).is_empty())
            .count();
        (done == 200).then_some(())
    })
    .await;
    let mut per_service: BTreeMap<String, usize> = BTreeMap::new();
    for c in env.calls("create") {
        *per_service
            .entry(c.arg("service").unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_service.len(), 200);
    assert!(per_service.values().all(|&n| n == 1), "{per_service:?}");
    // The fake writes the tail of a burst to cloud.json from its writer thread (within 200 ms).
    eventually("the cloud holds 200 load balancers", WAIT, || {
        (env.h.cloud().load_balancers.len() == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_class_routing_is_opt_in() {
    async fn provisioned_names(config: ControllerConfig) -> Vec<String> {
        let env = Env::start(FakeConfig::default(), config, &["n1"]).await;
        env.run();
        let mut classed = svc_json("mine", "LoadBalancer");
        classed["spec"]["loadBalancerClass"] = json!("example.com/mine");
        let mut foreign = svc_json("foreign", "LoadBalancer");
        foreign["spec"]["loadBalancerClass"] = json!("example.com/other");
        for s in [svc_json("plain", "LoadBalancer"), classed, foreign] {
            env.h.server.controls().seed(s).unwrap();
        }
        // Each handled service is ensured once; the others are never queued.
        eventually("handled services ensured", WAIT, || {
            let expected = (env.ctx.config.load_balancer_classes.len())
                + usize::from(!env.ctx.config.ignore_classless_services);
            // The call log is written when a call starts, cloud.json when it changed the cloud.
            let calls = env.calls("create").len();
            let lbs = env.h.cloud().load_balancers.len();
            (calls == expected && lbs == expected).then_some(())
        })
        .await;
        let mut names: Vec<String> = env
            .h
            .cloud()
            .load_balancers
            .into_iter()
            .map(|l| l.service)
            .collect();
        names.sort();
        names
    }
    assert_eq!(
        provisioned_names(ControllerConfig::default()).await,
        ["plain"],
        "upstream default"
    );
    assert_eq!(
        provisioned_names(ControllerConfig {
            load_balancer_classes: vec!["example.com/mine".into()],
            ..Default::default()
        })
        .await,
        ["mine", "plain"]
    );
    assert_eq!(
        provisioned_names(ControllerConfig {
            load_balancer_classes: vec!["example.com/mine".into()],
            ignore_classless_services: true,
            ..Default::default()
        })
        .await,
        ["mine"]
    );
}

// ---- Beyond upstream: trimmed cache and one node-sync key -------------------------------------

/// Clear the ingress and remove the finalizer by hand (as an operator or an older controller
/// might), leaving a LoadBalancer service whose load balancer still exists.
async fn release_by_hand(env: &Env, name: &str) {
    env.services()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": null}}})),
        )
        .await
        .unwrap();
    env.merge(name, json!({"metadata": {"finalizers": null}}))
        .await;
    env.cached(name, |s| !has_status(s) && !has_finalizer(s))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_leaving_the_cache_has_its_load_balancer_deleted() {
    let env = Env::default(&["n1"]).await;
    env.run();
    env.h
        .server
        .controls()
        .seed(svc_json("half", "LoadBalancer"))
        .unwrap();
    env.cached("half", |s| has_status(s) && has_finalizer(s))
        .await;
    assert_eq!(env.h.cloud().load_balancers.len(), 1);
    // The ingress is cleared and the finalizer removed by hand, then the service turns
    // ClusterIP: it can no longer have a load balancer, so the cache lets it go, but its load
    // balancer still exists and must be deleted (upstream: needsUpdate, then the delete op).
    release_by_hand(&env, "half").await;
    env.merge("half", json!({"spec": {"type": "ClusterIP"}}))
        .await;
    env.gone_from_cache("half").await;
    eventually("the load balancer is deleted", WAIT, || {
        env.h.cloud().load_balancers.is_empty().then_some(())
    })
    .await;
    env.has_event(
        "half",
        "Normal",
        "DeletedLoadBalancer",
        "Deleted load balancer",
    )
    .await;
    assert!(env.stored("half").is_some(), "the service itself stays");
    eventually("the controller forgets it", WAIT, || {
        env.ctrl
            .cached_service(&key("half"))
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncached_service_is_read_from_the_api_so_a_new_leader_still_deletes_its_load_balancer()
{
    let env = Env::default(&["n1"]).await;
    provisioned(&env, "orphan").await;
    // Finalizer and ingress removed by hand, then ClusterIP: the cache lets it go.
    release_by_hand(&env, "orphan").await;
    env.merge("orphan", json!({"spec": {"type": "ClusterIP"}}))
        .await;
    env.gone_from_cache("orphan").await;
    // A controller that never synced it (a new leader) gets its key: the live object is read
    // and takes upstream's delete branch.
    let fresh = ServiceController::new(env.ctx.clone()).unwrap();
    env.h.server.controls().clear_requests();
    fresh.sync_service(&key("orphan")).await.expect("sync");
    assert!(env.h.cloud().load_balancers.is_empty(), "no leaked LB");
    assert_eq!(env.calls("delete").len(), 1);
    assert!(env
        .h
        .server
        .controls()
        .requests()
        .iter()
        .any(|r| r.verb == "get" && r.resource == "services" && r.name == "orphan"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_changes_during_a_node_sync_queue_one_more_sync_not_one_per_node() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let env = Env::default(&["n1"]).await;
    env.run();
    env.h
        .server
        .controls()
        .seed(svc_json("web", "LoadBalancer"))
        .unwrap();
    env.cached("web", has_status).await;
    env.h
        .set_control(&fake(json!({"pause": {"UpdateLoadBalancer": gate.path()}})));
    env.h.clear_calls();
    env.h.server.controls().seed(node_json("n2")).unwrap();
    eventually("node sync blocked in UpdateLoadBalancer", WAIT, || {
        env.calls("update").first().cloned()
    })
    .await;
    for i in 3..=22 {
        env.h
            .server
            .controls()
            .seed(node_json(&format!("n{i}")))
            .unwrap();
    }
    env.node_count(22).await;
    // Upstream queues the 20 node names; here the one key is marked for one more sync.
    assert!(
        env.ctrl.node_queue().len() <= 1,
        "node queue holds {} keys",
        env.ctrl.node_queue().len()
    );
    drop(gate);
    let all: Vec<String> = {
        let mut v: Vec<String> = (1..=22).map(|i| format!("n{i}")).collect();
        v.sort();
        v
    };
    eventually("the load balancer has every node", WAIT, || {
        (env.h.cloud().load_balancer(&key("web"))?.hosts == all).then_some(())
    })
    .await;
    let updates = env.calls_for("update", "web");
    assert_eq!(
        updates.len(),
        2,
        "the blocked update and one more: {updates:?}"
    );
    assert_eq!(updates[1], all);
}
