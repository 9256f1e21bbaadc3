//! Route controller against the in-memory API server and the fake provider's `.so`
//! (docs/upstream-compat.md#route-controller), with the cases of upstream's
//! `controllers/route/route_controller_test.go`.

use std::time::{Duration, Instant};

use ccm_host::controllers::{route, ControllerConfig, ControllerContext};
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{ListParams, Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

const CLUSTER_CIDR: &str = "10.120.0.0/14";

fn fake(config: Value) -> FakeConfig {
    serde_json::from_value(config).expect("fake config")
}

fn node(name: &str, uid: &str, pod_cidrs: &[&str], ip: &str) -> Value {
    let mut n = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": uid},
        "spec": {},
        "status": {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]},
    });
    if !pod_cidrs.is_empty() {
        n["spec"]["podCIDRs"] = json!(pod_cidrs);
        n["spec"]["podCIDR"] = json!(pod_cidrs[0]);
    }
    n
}

fn route_cfg(node: &str, cidr: &str) -> Value {
    json!({"targetNode": node, "destinationCIDR": cidr})
}

async fn synced(h: &Harness, config: ControllerConfig) -> ControllerContext {
    let ctx = h.context(config);
    assert!(ctx.nodes.wait_synced().await);
    ctx
}

async fn reconcile_once(h: &Harness, ctx: &ControllerContext, cidrs: &str) {
    let cidrs = route::parse_cluster_cidrs(cidrs).unwrap();
    let recorder = ctx.recorder(route::COMPONENT);
    route::reconcile(ctx, &recorder, &cidrs)
        .await
        .expect("reconcile");
    let _ = h;
}

fn routes(h: &Harness) -> Vec<(String, String, bool)> {
    let mut v: Vec<_> = h
        .cloud()
        .routes
        .into_iter()
        .map(|r| (r.target_node, r.destination_cidr, r.blackhole))
        .collect();
    v.sort();
    v
}

fn uid(h: &Harness, name: &str) -> String {
    h.server.controls().get("nodes", "", name).unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string()
}

fn condition(h: &Harness, name: &str) -> Option<(String, String, String)> {
    let node = h.server.controls().get("nodes", "", name)?;
    let conds = node["status"]["conditions"].as_array()?.clone();
    conds
        .iter()
        .find(|c| c["type"] == "NetworkUnavailable")
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_string(),
                c["reason"].as_str().unwrap_or_default().to_string(),
                c["message"].as_str().unwrap_or_default().to_string(),
            )
        })
}

async fn wait_nodes(ctx: &ControllerContext, n: usize) {
    eventually("node cache", Duration::from_secs(10), || {
        (ctx.nodes.list().len() == n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_creates_missing_deletes_stale_and_sets_conditions() {
    let h = Harness::start(
        "fake",
        fake(json!({
            "routes": [
                route_cfg("node-1", "10.120.0.0/24"),
                route_cfg("node-1", "10.120.9.0/24"),
                route_cfg("node-3", "10.120.2.0/24"),
                route_cfg("gone", "10.120.3.0/24"),
                {"targetNode": "node-4", "destinationCIDR": "10.120.5.0/24", "blackhole": true},
                {"targetNode": "node-4", "destinationCIDR": "192.168.0.0/24", "blackhole": true},
            ]
        })),
    )
    .await;
    let ctl = h.server.controls();
    ctl.seed(node("node-1", "uid-1", &["10.120.0.0/24"], "10.0.0.1"))
        .unwrap();
    ctl.seed(node("node-2", "uid-2", &["10.120.1.0/24"], "10.0.0.2"))
        .unwrap();
    ctl.seed(node("node-3", "uid-3", &[], "10.0.0.3")).unwrap();
    ctl.seed(node("node-5", "uid-5", &[], "10.0.0.5")).unwrap();
    let ctx = synced(&h, ControllerConfig::default()).await;
    wait_nodes(&ctx, 4).await;

    reconcile_once(&h, &ctx, CLUSTER_CIDR).await;

    assert_eq!(
        routes(&h),
        [
            ("node-1".into(), "10.120.0.0/24".into(), false),
            ("node-2".into(), "10.120.1.0/24".into(), false),
            ("node-4".into(), "192.168.0.0/24".into(), true),
        ],
        "missing route added; wrong-CIDR, stale, unknown-node and in-range blackhole routes deleted; \
         the out-of-range blackhole kept"
    );
    let created = h
        .calls()
        .into_iter()
        .filter(|c| c.call == "create-route")
        .collect::<Vec<_>>();
    assert_eq!(created.len(), 1);
    let uid2 = uid(&h, "node-2");
    assert_eq!(
        created[0].arg("nameHint"),
        Some(uid2.as_str()),
        "the name hint is the node UID"
    );
    let stored = h
        .cloud()
        .routes
        .into_iter()
        .find(|r| r.target_node == "node-2")
        .unwrap();
    assert_eq!(
        stored.target_node_addresses.len(),
        2,
        "created with the node's addresses"
    );
    assert_eq!(
        h.call_names()
            .iter()
            .filter(|c| *c == "delete-route")
            .count(),
        4
    );

    let created_ok = (
        "False".to_string(),
        "RouteCreated".to_string(),
        "RouteController created a route".to_string(),
    );
    assert_eq!(condition(&h, "node-1"), Some(created_ok.clone()));
    assert_eq!(condition(&h, "node-2"), Some(created_ok));
    assert_eq!(
        condition(&h, "node-3"),
        Some((
            "True".into(),
            "NoRouteCreated".into(),
            "RouteController failed to create a route".into()
        )),
        "a node with stale routes but no podCIDRs is marked unavailable"
    );
    assert_eq!(
        condition(&h, "node-5"),
        None,
        "nodes without podCIDRs or routes are skipped"
    );
    assert_eq!(h.metrics.route_sync_total.get(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_nodes_get_one_route_per_pod_cidr() {
    let h = Harness::start("fake", FakeConfig::default()).await;
    h.server
        .controls()
        .seed(node(
            "node-1",
            "uid-1",
            &["10.120.0.0/24", "fd00:10:244::/64"],
            "10.0.0.1",
        ))
        .unwrap();
    h.server
        .controls()
        .seed(node("node-2", "uid-2", &["fd00:10:244:1::/64"], "10.0.0.2"))
        .unwrap();
    let ctx = synced(&h, ControllerConfig::default()).await;
    wait_nodes(&ctx, 2).await;
    reconcile_once(&h, &ctx, "10.120.0.0/14,fd00:10:244::/56").await;
    assert_eq!(
        routes(&h),
        [
            ("node-1".into(), "10.120.0.0/24".into(), false),
            ("node-1".into(), "fd00:10:244::/64".into(), false),
            ("node-2".into(), "fd00:10:244:1::/64".into(), false),
        ]
    );
    // A second pass with nothing changed creates nothing and writes no condition (once the
    // cache has seen the conditions the first pass wrote: the controller reads the cache).
    eventually(
        "cache sees both conditions",
        Duration::from_secs(10),
        || {
            ctx.nodes
                .list()
                .iter()
                .all(|n| n.condition("NetworkUnavailable").is_some())
                .then_some(())
        },
    )
    .await;
    h.clear_calls();
    h.server.controls().clear_requests();
    reconcile_once(&h, &ctx, "10.120.0.0/14,fd00:10:244::/56").await;
    assert_eq!(h.call_names(), ["list-routes"]);
    assert!(
        h.server
            .controls()
            .requests()
            .iter()
            .all(|r| matches!(r.verb.as_str(), "get" | "list" | "watch")),
        "no writes when everything is in place: {:?}",
        h.server.controls().requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_aware_routes_are_recreated_when_addresses_change() {
    let h = Harness::start(
        "fake",
        fake(json!({
            "routeEnableNodeAddresses": true,
            "routes": [{
                "targetNode": "node-1", "destinationCIDR": "10.120.0.0/24",
                "targetNodeAddresses": [{"type": "InternalIP", "address": "10.0.0.99"}]
            }]
        })),
    )
    .await;
    h.server
        .controls()
        .seed(node("node-1", "uid-1", &["10.120.0.0/24"], "10.0.0.1"))
        .unwrap();
    let ctx = synced(&h, ControllerConfig::default()).await;
    wait_nodes(&ctx, 1).await;
    reconcile_once(&h, &ctx, CLUSTER_CIDR).await;
    let names = h.call_names();
    let del = names
        .iter()
        .position(|c| c == "delete-route")
        .expect("stale route deleted");
    let cre = names
        .iter()
        .position(|c| c == "create-route")
        .expect("route re-created");
    assert!(
        del < cre,
        "deletion before creation for address-aware providers: {names:?}"
    );
    let r = h.cloud().routes;
    assert_eq!(r.len(), 1);
    let addrs: Vec<_> = r[0]
        .target_node_addresses
        .iter()
        .map(|a| a.address.clone())
        .collect();
    assert_eq!(addrs, ["10.0.0.1", "node-1"]);
    assert_eq!(condition(&h, "node-1").unwrap().1, "RouteCreated");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_pod_cidrs_fail_the_second_create_with_an_event() {
    let h = Harness::start("fake", FakeConfig::default()).await;
    h.server
        .controls()
        .seed(node(
            "node-1",
            "uid-1",
            &["10.120.0.0/24", "10.120.0.0/24"],
            "10.0.0.1",
        ))
        .unwrap();
    let ctx = synced(&h, ControllerConfig::default()).await;
    wait_nodes(&ctx, 1).await;
    reconcile_once(&h, &ctx, CLUSTER_CIDR).await;
    assert_eq!(
        routes(&h),
        [("node-1".into(), "10.120.0.0/24".into(), false)]
    );
    assert_eq!(condition(&h, "node-1").unwrap().1, "NoRouteCreated");
    let events: Api<Event> = Api::namespaced(h.client.clone(), "default");
    let event = ccm_integration_tests::harness::eventually_async(
        "FailedToCreateRoute event",
        Duration::from_secs(10),
        || {
            let events = events.clone();
            async move {
                events
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("FailedToCreateRoute"))
            }
        },
    )
    .await;
    let msg = event.message.unwrap();
    let prefix = format!(
        "Could not create route {} 10.120.0.0/24 for node node-1 after ",
        uid(&h, "node-1")
    );
    assert!(msg.starts_with(&prefix), "{msg}");
    assert!(msg.ends_with("already exists"), "{msg}");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(
        event.source.unwrap().component.as_deref(),
        Some("route_controller")
    );
    let obj = event.involved_object;
    assert_eq!(
        (
            obj.api_version.as_deref(),
            obj.kind.as_deref(),
            obj.name.as_deref()
        ),
        (Some("v1"), Some("Node"), Some("node-1"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cni_condition_is_overridden_once_then_left_alone() {
    let h = Harness::start(
        "fake",
        fake(json!({"routes": [route_cfg("node-1", "10.120.0.0/24")]})),
    )
    .await;
    let mut n = node("node-1", "uid-1", &["10.120.0.0/24"], "10.0.0.1");
    n["status"]["conditions"] = json!([{
        "type": "NetworkUnavailable", "status": "False", "reason": "CalicoIsUp", "message": "Calico is running on this node",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"
    }]);
    h.server.controls().seed(n).unwrap();
    let ctx = synced(&h, ControllerConfig::default()).await;
    wait_nodes(&ctx, 1).await;
    let seeded = h.server.controls().writes_to("nodes", "", "node-1");
    reconcile_once(&h, &ctx, CLUSTER_CIDR).await;
    assert_eq!(
        condition(&h, "node-1"),
        Some((
            "False".into(),
            "RouteCreated".into(),
            "RouteController created a route".into()
        ))
    );
    let stored = h.server.controls().get("nodes", "", "node-1").unwrap();
    assert_ne!(
        stored["status"]["conditions"][0]["lastTransitionTime"],
        "2026-01-01T00:00:00Z"
    );
    assert_eq!(
        h.server.controls().writes_to("nodes", "", "node-1"),
        seeded + 1
    );
    eventually(
        "cache sees the new condition",
        Duration::from_secs(10),
        || {
            let n = ctx.nodes.list();
            let c = n[0].condition("NetworkUnavailable")?.clone();
            (c.reason.as_deref() == Some("RouteCreated")).then_some(())
        },
    )
    .await;
    reconcile_once(&h, &ctx, CLUSTER_CIDR).await;
    assert_eq!(
        h.server.controls().writes_to("nodes", "", "node-1"),
        seeded + 1,
        "no second write"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_error_fails_the_pass_without_touching_routes() {
    let h = Harness::start(
        "fake",
        fake(json!({"routes": [route_cfg("gone", "10.120.3.0/24")], "errors": {"ListRoutes": {"kind": "other", "message": "cloud API down"}}})),
    )
    .await;
    let ctx = synced(&h, ControllerConfig::default()).await;
    let cidrs = route::parse_cluster_cidrs(CLUSTER_CIDR).unwrap();
    let err = route::reconcile(&ctx, &ctx.recorder(route::COMPONENT), &cidrs)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cloud API down"), "{err}");
    assert_eq!(h.cloud().routes.len(), 1);
    assert!(!h.call_names().contains(&"delete-route".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_driven_runs_react_to_new_nodes_and_stay_rate_limited() {
    let h = Harness::start("fake", FakeConfig::default()).await;
    let period = Duration::from_millis(300);
    let ctx = synced(
        &h,
        ControllerConfig {
            route_reconciliation_period: period,
            ..ControllerConfig::default()
        },
    )
    .await;
    let cidrs = route::parse_cluster_cidrs(CLUSTER_CIDR).unwrap();
    let started = Instant::now();
    let task = tokio::spawn(route::run(ctx.clone(), cidrs));
    h.server
        .controls()
        .seed(node("node-1", "uid-1", &["10.120.0.0/24"], "10.0.0.1"))
        .unwrap();
    eventually("route for the new node", Duration::from_secs(10), || {
        (routes(&h).len() == 1).then_some(())
    })
    .await;

    // A storm of relevant node changes: reconciles stay bounded by the period.
    let nodes: Api<Node> = Api::all(h.client.clone());
    for i in 0..30 {
        let patch = json!({"spec": {"podCIDRs": [format!("10.120.{}.0/24", i % 2)], "podCIDR": format!("10.120.{}.0/24", i % 2)}});
        let _ = nodes
            .patch("node-1", &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
    eventually(
        "routes follow the last podCIDR",
        Duration::from_secs(10),
        || {
            (routes(&h) == [("node-1".to_string(), "10.120.1.0/24".to_string(), false)])
                .then_some(())
        },
    )
    .await;
    let elapsed = started.elapsed();
    let passes = h.metrics.route_sync_total.get();
    let bound = (elapsed.as_secs_f64() / period.as_secs_f64()).floor() as u64 + 2;
    assert!(
        passes <= bound,
        "{passes} reconciles in {elapsed:?} exceeds one per {period:?}"
    );
    h.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
}
