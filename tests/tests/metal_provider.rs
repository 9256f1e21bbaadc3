//! The `metal` provider through the real host controllers against the in-memory API server:
//! the plugin's `.so` loaded by the real loader, `Initialize` given the host's Kubernetes access,
//! node initialisation / address updates / lifecycle from the inventory file (edited while the
//! controllers run), and load-balancer IP allocation persisted in a ConfigMap (survives a new
//! provider instance), with its error events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_host::controllers::node::NodeController;
use ccm_host::controllers::node_lifecycle;
use ccm_host::controllers::service::ServiceController;
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_integration_tests::harness::{eventually, eventually_async};
use ccm_integration_tests::metal::MetalEnv;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(20);
/// Bound for outcomes that wait on the service controller's retry backoff (5 s, 10 s, 20 s...).
const RETRY_WAIT: Duration = Duration::from_secs(90);
const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
const STATE_CM: (&str, &str) = ("kube-system", "ccm-metal-ipam");
const NS: &str = "default";

const INVENTORY: &str = r#"
machines:
  - name: node-a
    id: rack1-01
    instanceType: r640
    zone: rack1
    region: dc1
    labels: {metal.example.com/row: r1}
    addresses:
      - {type: InternalIP, address: 10.10.0.1}
      - {type: InternalIP, address: "fd10::1"}
      - {type: ExternalIP, address: 203.0.113.1}
      - {type: Hostname, address: node-a}
  - name: node-b
    id: rack1-02
    instanceType: r650
    zone: rack1
    region: dc1
    addresses:
      - {type: InternalIP, address: 10.10.0.2}
  - name: node-c
    providerID: metal://rack2-01
    zone: rack2
    region: dc1
    addresses:
      - {type: InternalIP, address: 10.10.0.3}
"#;

fn cfg() -> ControllerConfig {
    ControllerConfig {
        node_status_update_frequency: Duration::from_secs(3600),
        ..Default::default()
    }
}

fn lb_config() -> Value {
    json!({"loadBalancer": {"pools": [
        {"name": "public", "addresses": ["192.0.2.0/29", "2001:db8::/125"]},
        {"name": "reserved", "addresses": ["198.51.100.10-198.51.100.12"], "autoAssign": false},
    ]}})
}

fn tainted_node(name: &str, extra: Value) -> Value {
    let mut n = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    merge(&mut n, extra);
    n
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn stored_node(env: &MetalEnv, name: &str) -> Value {
    env.server
        .controls()
        .get("nodes", "", name)
        .unwrap_or_else(|| panic!("node {name} is stored"))
}

fn labels(n: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(n["metadata"]["labels"].clone()).unwrap_or_default()
}

fn addresses(n: &Value) -> Vec<String> {
    n["status"]["addresses"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    format!(
                        "{}={}",
                        x["type"].as_str().unwrap(),
                        x["address"].as_str().unwrap()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn taint_keys(n: &Value) -> Vec<String> {
    n["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["key"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

async fn node_ctx(env: &MetalEnv, nodes: usize) -> ControllerContext {
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    let c = ctx.clone();
    eventually("node cache", WAIT, || {
        (c.nodes.list().len() == nodes).then_some(())
    })
    .await;
    ctx
}

// ---- InstancesV2 through the node controllers --------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_initialised_from_the_inventory_by_name_address_and_provider_id() {
    let env = MetalEnv::start(json!({}), Some(INVENTORY)).await;
    let controls = env.server.controls();
    controls.seed(tainted_node("node-a", json!({}))).unwrap();
    // Registered under another name: found by its address.
    controls
        .seed(tainted_node(
            "kubelet-7",
            json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.10.0.2"}]}}),
        ))
        .unwrap();
    // Kubelet set the provider ID: found by it.
    controls
        .seed(tainted_node(
            "whatever",
            json!({"spec": {"providerID": "metal://rack2-01"}}),
        ))
        .unwrap();
    controls.seed(tainted_node("stranger", json!({}))).unwrap();
    let ctx = node_ctx(&env, 4).await;
    let ctrl = NodeController::new(ctx);

    ctrl.sync_node("node-a").await.expect("node-a initialises");
    let a = stored_node(&env, "node-a");
    assert_eq!(a["spec"]["providerID"], "metal://rack1-01");
    assert!(taint_keys(&a).is_empty());
    let l = labels(&a);
    assert_eq!(l["node.kubernetes.io/instance-type"], "r640");
    assert_eq!(l["topology.kubernetes.io/zone"], "rack1");
    assert_eq!(l["topology.kubernetes.io/region"], "dc1");
    assert_eq!(l["metal.example.com/row"], "r1");
    assert_eq!(
        addresses(&a),
        vec![
            "InternalIP=10.10.0.1",
            "InternalIP=fd10::1",
            "ExternalIP=203.0.113.1",
            "Hostname=node-a"
        ]
    );

    ctrl.sync_node("kubelet-7")
        .await
        .expect("kubelet-7 initialises");
    let b = stored_node(&env, "kubelet-7");
    assert_eq!(b["spec"]["providerID"], "metal://rack1-02");
    assert_eq!(labels(&b)["node.kubernetes.io/instance-type"], "r650");

    ctrl.sync_node("whatever")
        .await
        .expect("whatever initialises");
    let c = stored_node(&env, "whatever");
    assert_eq!(labels(&c)["topology.kubernetes.io/zone"], "rack2");
    assert_eq!(addresses(&c), vec!["InternalIP=10.10.0.3"]);

    let e = ctrl.sync_node("stranger").await.unwrap_err();
    assert!(
        e.to_string().contains("instance not found: node \"stranger\": no machine has its name or any of its addresses"),
        "{e}"
    );
    assert_eq!(taint_keys(&stored_node(&env, "stranger")), vec![TAINT]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_edits_apply_without_a_restart_and_bad_edits_keep_the_last_good_one() {
    let env = MetalEnv::start(json!({}), Some(INVENTORY)).await;
    env.server
        .controls()
        .seed(tainted_node("node-b", json!({})))
        .unwrap();
    // A short address-loop period: the loop reuses instance answers younger than its period
    // (the provider's instance cache), so an edit shows within one period, as upstream's does.
    let ctx = env.context(ControllerConfig {
        node_status_update_frequency: Duration::from_millis(200),
        ..cfg()
    });
    assert!(ctx.nodes.wait_synced().await);
    let ctrl = NodeController::new(ctx.clone());
    ctrl.sync_node("node-b").await.unwrap();
    assert_eq!(
        addresses(&stored_node(&env, "node-b")),
        vec!["InternalIP=10.10.0.2"]
    );

    // The address loop skips nodes whose cached copy still carries the taint.
    let c = ctx.clone();
    eventually("node-b initialised in the cache", WAIT, || {
        c.nodes
            .list()
            .iter()
            .any(|n| n.name() == "node-b" && n.taints().is_empty())
            .then_some(())
    })
    .await;
    // node-b gets a new address; the periodic address update picks it up.
    env.write_inventory(&INVENTORY.replace("address: 10.10.0.2}", "address: 10.10.0.22}"));
    let (env_ref, ctrl_ref) = (&env, &ctrl);
    eventually_async("the address loop applies the edit", WAIT, || async move {
        ctrl_ref.update_node_status().await;
        (addresses(&stored_node(env_ref, "node-b")) == vec!["InternalIP=10.10.0.22"]).then_some(())
    })
    .await;

    // A malformed edit (duplicate provider IDs, and a new machine node-d): refused as a whole.
    let bad = format!(
        "{}\n  - {{name: node-d, id: rack1-01}}\n",
        INVENTORY.replace("address: 10.10.0.2}", "address: 10.10.0.99}")
    );
    env.write_inventory(&bad);
    env.server
        .controls()
        .seed(tainted_node("node-d", json!({})))
        .unwrap();
    env.server
        .controls()
        .seed(tainted_node("node-a", json!({})))
        .unwrap();
    let c = ctx.clone();
    eventually("node cache", WAIT, || {
        (c.nodes.list().len() == 3).then_some(())
    })
    .await;
    ctrl.update_node_status().await;
    assert_eq!(
        addresses(&stored_node(&env, "node-b")),
        vec!["InternalIP=10.10.0.22"],
        "the last good inventory stays in force"
    );
    let e = ctrl.sync_node("node-d").await.unwrap_err();
    assert!(e.to_string().contains("instance not found"), "{e}");
    ctrl.sync_node("node-a")
        .await
        .expect("machines of the last good inventory still initialise");

    // The fix applies.
    let good = format!("{INVENTORY}\n  - {{name: node-d, id: rack3-01, zone: rack3}}\n");
    env.write_inventory(&good);
    ctrl.sync_node("node-d")
        .await
        .expect("node-d initialises after the fix");
    assert_eq!(
        stored_node(&env, "node-d")["spec"]["providerID"],
        "metal://rack3-01"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_taints_shut_down_machines_and_deletes_absent_ones() {
    let inventory = format!(
        "{INVENTORY}\n  - {{name: node-off, id: off-1, state: shutdown}}\n  - {{name: node-gone, id: gone-1, state: absent}}\n"
    );
    let env = MetalEnv::start(json!({}), Some(&inventory)).await;
    let not_ready = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
    for (name, pid) in [
        ("node-a", "metal://rack1-01"),
        ("node-off", "metal://off-1"),
        ("node-gone", "metal://gone-1"),
    ] {
        let mut n = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                           "spec": {"providerID": pid}});
        merge(&mut n, not_ready.clone());
        env.server.controls().seed(n).unwrap();
    }
    let ctx = node_ctx(&env, 3).await;
    let recorder = ctx.recorder(node_lifecycle::COMPONENT);
    node_lifecycle::monitor_nodes(&ctx, &recorder).await;
    assert!(
        env.server
            .controls()
            .get("nodes", "", "node-gone")
            .is_none(),
        "absent machine: node deleted"
    );
    assert_eq!(
        taint_keys(&stored_node(&env, "node-off")),
        vec![SHUTDOWN_TAINT]
    );
    assert!(taint_keys(&stored_node(&env, "node-a")).is_empty());

    // The machine is powered on again and the node turns Ready: the taint goes.
    env.write_inventory(&inventory.replace("state: shutdown", "state: running"));
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(env.client.clone());
    nodes
        .patch_status(
            "node-off",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .unwrap();
    let c = ctx.clone();
    eventually("node-off Ready in the cache", WAIT, || {
        c.nodes
            .list()
            .iter()
            .any(|n| {
                n.name() == "node-off" && n.condition("Ready").is_some_and(|c| c.status == "True")
            })
            .then_some(())
    })
    .await;
    node_lifecycle::monitor_nodes(&ctx, &recorder).await;
    assert!(taint_keys(&stored_node(&env, "node-off")).is_empty());
}

// ---- LoadBalancer through the service controller -----------------------------------------------

struct Lb {
    env: MetalEnv,
    ctx: ControllerContext,
    ctrl: Arc<ServiceController>,
}

fn svc(name: &str, extra: Value) -> Value {
    let mut s = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    });
    merge(&mut s, extra);
    s
}

fn key(name: &str) -> String {
    format!("{NS}/{name}")
}

fn ingress(s: &Service) -> Vec<String> {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
        .unwrap_or_default()
}

impl Lb {
    async fn start(config: Value) -> Lb {
        let env = MetalEnv::start(config, None).await;
        env.server
            .controls()
            .seed(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
                         "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            )
            .unwrap();
        let (ctx, ctrl) = Self::controller(&env, &env.provider).await;
        Lb { env, ctx, ctrl }
    }

    async fn controller(
        env: &MetalEnv,
        provider: &ccm_host::provider::Provider,
    ) -> (ControllerContext, Arc<ServiceController>) {
        let ctx = env.context_for(provider, cfg());
        assert!(ctx.nodes.wait_synced().await && ctx.services.wait_synced().await);
        let c = ctx.clone();
        eventually("node cache", WAIT, || {
            (c.nodes.list().len() == 1).then_some(())
        })
        .await;
        let ctrl = ServiceController::new(ctx.clone()).expect("metal offers LoadBalancer");
        (ctx, ctrl)
    }

    async fn cached(&self, name: &str, pred: impl Fn(&Service) -> bool) -> Service {
        cached(&self.ctx, name, pred).await
    }

    /// Seed a service, sync it once, and return the informer's copy once it has an ingress.
    async fn provision(&self, name: &str, extra: Value) -> Vec<String> {
        self.env.server.controls().seed(svc(name, extra)).unwrap();
        self.cached(name, |_| true).await;
        self.ctrl
            .sync_service(&key(name))
            .await
            .unwrap_or_else(|e| panic!("sync {name}: {e}"));
        ingress(&self.cached(name, |s| !ingress(s).is_empty()).await)
    }

    /// Seed a service and sync it once; return the sync error.
    async fn refused(&self, name: &str, extra: Value) -> String {
        self.env.server.controls().seed(svc(name, extra)).unwrap();
        self.cached(name, |_| true).await;
        self.ctrl
            .sync_service(&key(name))
            .await
            .expect_err("the sync fails")
            .to_string()
    }

    /// The allocation ConfigMap's data.
    fn state(&self) -> BTreeMap<String, Value> {
        state(&self.env)
    }

    async fn warning(&self, name: &str, reason: &str, message_part: &str) -> String {
        let controls = self.env.server.controls();
        eventually(
            &format!("{reason} event of {name} containing {message_part:?}"),
            WAIT,
            || {
                controls
                    .list("events")
                    .into_iter()
                    .filter(|e| {
                        e["involvedObject"]["name"] == name
                            && e["type"] == "Warning"
                            && e["reason"] == reason
                    })
                    .filter_map(|e| e["message"].as_str().map(String::from))
                    .find(|m| m.contains(message_part))
            },
        )
        .await
    }
}

async fn cached(ctx: &ControllerContext, name: &str, pred: impl Fn(&Service) -> bool) -> Service {
    let store = ctx.services.store().clone();
    let r = format!("{NS}/{name}");
    eventually(&format!("informer copy of {name}"), WAIT, || {
        store.get(&r).filter(|s| pred(s)).map(|s| (*s).clone())
    })
    .await
}

fn state(env: &MetalEnv) -> BTreeMap<String, Value> {
    env.server
        .controls()
        .get("configmaps", STATE_CM.0, STATE_CM.1)
        .map(|cm| {
            cm["data"]
                .as_object()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, serde_json::from_str(v.as_str().unwrap()).unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_pool_addresses_persisted_in_a_config_map() {
    let lb = Lb::start(lb_config()).await;
    assert_eq!(lb.provision("web", json!({})).await, vec!["192.0.2.1"]);
    // spec.loadBalancerIP from a pool that only serves explicit requests.
    assert_eq!(
        lb.provision(
            "pinned",
            json!({"spec": {"loadBalancerIP": "198.51.100.11"}})
        )
        .await,
        vec!["198.51.100.11"]
    );
    // The annotation, dual-stack, in ipFamilies order.
    assert_eq!(
        lb.provision(
            "dual",
            json!({"metadata": {"annotations": {"metal.ccm-host.io/load-balancer-ips": "2001:db8::5"}},
                   "spec": {"ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}})
        )
        .await,
        vec!["2001:db8::5", "192.0.2.2"]
    );
    assert_eq!(
        lb.provision("v6", json!({"spec": {"ipFamilies": ["IPv6"]}}))
            .await,
        vec!["2001:db8::1"]
    );
    let state = lb.state();
    assert_eq!(
        state.keys().cloned().collect::<Vec<_>>(),
        vec![
            "default.dual",
            "default.pinned",
            "default.v6",
            "default.web"
        ]
    );
    assert_eq!(
        state["default.web"]["addresses"],
        json!([{"ip": "192.0.2.1", "pool": "public"}])
    );
    assert_eq!(state["default.pinned"]["addresses"][0]["pool"], "reserved");
    let web = lb.cached("web", |_| true).await;
    assert_eq!(
        state["default.web"]["uid"],
        json!(web.metadata.uid.unwrap())
    );
    // GetLoadBalancerName is upstream's.
    let name = lb
        .env
        .provider
        .get_load_balancer_name("kubernetes", &web_with_uid("ab-cd-ef"))
        .await
        .unwrap();
    assert_eq!(name, "aabcdef");
}

fn web_with_uid(uid: &str) -> Service {
    serde_json::from_value(json!({"metadata": {"name": "web", "namespace": NS, "uid": uid}}))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_fail_the_sync_with_clear_warning_events() {
    let lb = Lb::start(lb_config()).await;
    lb.provision("holder", json!({"spec": {"loadBalancerIP": "192.0.2.3"}}))
        .await;
    let cases = [
        ("unknown-pool", json!({"metadata": {"annotations": {"metal.ccm-host.io/pool": "gold"}}}),
         "service default/unknown-pool: pool \"gold\" (annotation metal.ccm-host.io/pool) does not exist; pools: public, reserved"),
        ("outside", json!({"spec": {"loadBalancerIP": "203.0.113.9"}}),
         "service default/outside: requested address 203.0.113.9 is outside every pool"),
        ("taken", json!({"spec": {"loadBalancerIP": "192.0.2.3"}}),
         "service default/taken: requested address 192.0.2.3 is already taken: it is allocated to service default/holder"),
        ("broadcast", json!({"spec": {"loadBalancerIP": "192.0.2.7"}}),
         "192.0.2.7 is the broadcast address of 192.0.2.0/29 in pool \"public\""),
        ("garbage", json!({"spec": {"loadBalancerIP": "not-an-ip"}}),
         "service default/garbage: spec.loadBalancerIP \"not-an-ip\" is not an IP address"),
    ];
    for (name, extra, want) in cases {
        let err = lb.refused(name, extra).await;
        assert!(err.starts_with("failed to ensure load balancer: "), "{err}");
        assert!(
            err.contains(want),
            "{name}: {err:?} should contain {want:?}"
        );
        let event = lb.warning(name, "SyncLoadBalancerFailed", want).await;
        assert!(
            event.starts_with("Error syncing load balancer: failed to ensure load balancer: "),
            "{event}"
        );
    }
    // Nothing was allocated for them.
    assert_eq!(
        lb.state().keys().cloned().collect::<Vec<_>>(),
        vec!["default.holder"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhaustion_is_reported_and_retried_until_an_address_is_released() {
    let lb = Lb::start(
        json!({"loadBalancer": {"pools": [{"name": "tiny", "addresses": ["192.0.2.8/31"]}]}}),
    )
    .await;
    tokio::spawn(lb.ctrl.clone().run());
    for name in ["one", "two"] {
        lb.env.server.controls().seed(svc(name, json!({}))).unwrap();
    }
    let one = lb.cached("one", |s| !ingress(s).is_empty()).await;
    let two = lb.cached("two", |s| !ingress(s).is_empty()).await;
    let mut got = vec![ingress(&one), ingress(&two)];
    got.sort();
    assert_eq!(got, vec![vec!["192.0.2.8"], vec!["192.0.2.9"]]);

    lb.env
        .server
        .controls()
        .seed(svc("three", json!({})))
        .unwrap();
    lb.warning(
        "three",
        "SyncLoadBalancerFailed",
        "no free IPv4 address for service default/three: pool \"tiny\" (192.0.2.8/31) has 2 of 2 IPv4 addresses allocated",
    )
    .await;
    assert!(!lb.state().contains_key("default.three"));

    // Deleting one releases its address (through the finalizer and EnsureLoadBalancerDeleted);
    // the controller's retry of three then gets it.
    let freed = ingress(&one);
    let services: Api<Service> = Api::namespaced(lb.env.client.clone(), NS);
    services
        .delete("one", &DeleteParams::default())
        .await
        .unwrap();
    let three = {
        let store = lb.ctx.services.store().clone();
        let r = format!("{NS}/three");
        eventually("three gets the released address", RETRY_WAIT, || {
            store
                .get(&r)
                .filter(|s| !ingress(s).is_empty())
                .map(|s| (*s).clone())
        })
        .await
    };
    assert_eq!(ingress(&three), freed);
    let st = lb.state();
    assert!(!st.contains_key("default.one") && st.contains_key("default.three"));
    assert!(
        lb.env
            .server
            .controls()
            .get("services", NS, "one")
            .is_none(),
        "finalizer removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_survive_a_new_provider_instance() {
    let lb = Lb::start(lb_config()).await;
    let names = ["s1", "s2", "s3", "s4"];
    let mut before = BTreeMap::new();
    for n in names {
        before.insert(n, lb.provision(n, json!({})).await);
    }
    // s2 goes away: its address is free for someone new, but nobody else moves.
    let services: Api<Service> = Api::namespaced(lb.env.client.clone(), NS);
    services
        .delete("s2", &DeleteParams::default())
        .await
        .unwrap();
    cached(&lb.ctx, "s2", |s| s.metadata.deletion_timestamp.is_some()).await;
    lb.ctrl.sync_service(&key("s2")).await.unwrap();

    // "Restart": a new provider instance (no shared memory) and a new controller. Clear the
    // published statuses so nothing but the cluster-side allocations can carry the addresses.
    let provider = lb.env.new_provider().await;
    for n in ["s1", "s3", "s4"] {
        services
            .patch_status(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": null}}})),
            )
            .await
            .unwrap();
    }
    let (ctx, ctrl) = Lb::controller(&lb.env, &provider).await;
    // A newcomer first, then the others in reverse order.
    lb.env
        .server
        .controls()
        .seed(svc("new", json!({})))
        .unwrap();
    cached(&ctx, "new", |_| true).await;
    ctrl.sync_service(&key("new")).await.unwrap();
    for n in ["s4", "s3", "s1"] {
        cached(&ctx, n, |s| ingress(s).is_empty()).await;
        ctrl.sync_service(&key(n)).await.unwrap();
        let s = cached(&ctx, n, |s| !ingress(s).is_empty()).await;
        assert_eq!(ingress(&s), before[n], "{n} keeps its address");
    }
    let newcomer = cached(&ctx, "new", |s| !ingress(s).is_empty()).await;
    assert_eq!(
        ingress(&newcomer),
        before["s2"],
        "the released address is reused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_share_an_address_only_when_they_opt_in_and_ports_differ() {
    let lb = Lb::start(lb_config()).await;
    let share = |port: i32| {
        json!({"metadata": {"annotations": {"metal.ccm-host.io/allow-shared-ip": "front"}},
               "spec": {"ports": [{"name": "p", "port": port, "protocol": "TCP", "targetPort": 8080}]}})
    };
    let http = lb.provision("http", share(80)).await;
    let https = lb.provision("https", share(443)).await;
    assert_eq!(https, http, "same key, distinct ports: one address");
    let http2 = lb.provision("http2", share(80)).await;
    assert_ne!(http2, http, "a colliding port gets its own address");
    let mut pinned = share(80);
    merge(&mut pinned, json!({"spec": {"loadBalancerIP": http[0]}}));
    let err = lb.refused("http3", pinned).await;
    assert!(
        err.contains("is already taken: port TCP/80 is already used on it by service default/http"),
        "{err}"
    );
    let plain = json!({"spec": {"loadBalancerIP": http[0], "ports": [{"name": "p", "port": 8443, "protocol": "TCP", "targetPort": 8080}]}});
    let err = lb.refused("loner", plain).await;
    assert!(
        err.contains(
            "to share it, both services need the same metal.ccm-host.io/allow-shared-ip annotation"
        ),
        "{err}"
    );
    let st = lb.state();
    assert_eq!(st["default.http"]["sharingKey"], "front");
    assert_eq!(st["default.https"]["ports"], json!(["TCP/443"]));
}
