//! Load-balancer host updates proportional to the change (issue 32, docs/abi-1.2.md): a
//! CI-sized cluster (2,000 nodes, 20 LoadBalancer Services) behind the whole service controller,
//! the fake provider's `.so` through the real loader, the in-memory API server over HTTP.
//!
//! One node change must make at most one host update per load balancer, and:
//! - with the fake as an ABI 1.2 plugin (`incrementalHosts: true`): `UpdateLoadBalancerHosts`
//!   with just the changed node, from the first change after `EnsureLoadBalancer` on (its base is
//!   `LAST_FULL`, the ensure's hosts), never the whole set and never a full `UpdateLoadBalancer`;
//! - with the fake acting as a 1.1 plugin (`incrementalHosts: false`): one full
//!   `UpdateLoadBalancer` per load balancer, with every host.
//!
//! In both cases the fake's load balancers end with exactly the cluster's nodes. A third test
//! drives the token agreement (base, token, `BASE_MISMATCH`, a full call replacing the token by
//! `LAST_FULL`)
//! through the host's `Provider` and the SDK in the fake's `.so`.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_host::controllers::service::ServiceController;
use ccm_host::controllers::ControllerConfig;
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use ccm_provider_fake::control::CallRecord;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

const NODES: usize = 2_000;
const SERVICES: usize = 20;
const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(120);

fn node_json(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"providerID": format!("fake://{name}")},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn svc_json(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    })
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

fn svc_key(i: usize) -> String {
    format!("{NS}/svc-{i:02}")
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The host updates (full `update` and incremental `update-hosts`) per service.
fn host_updates(calls: &[CallRecord]) -> BTreeMap<String, Vec<CallRecord>> {
    let mut out: BTreeMap<String, Vec<CallRecord>> = BTreeMap::new();
    for c in calls {
        if c.call == "update" || c.call == "update-hosts" {
            out.entry(c.arg("service").unwrap_or_default().to_string())
                .or_default()
                .push(c.clone());
        }
    }
    out
}

struct Cluster {
    h: Harness,
    nodes: Api<Node>,
}

impl Cluster {
    /// 2,000 nodes, the whole service controller running, 20 LoadBalancer Services ensured.
    async fn start(incremental: bool) -> Cluster {
        let fake: FakeConfig = serde_json::from_value(json!({
            "incrementalHosts": incremental,
        }))
        .expect("fake config");
        let h = Harness::start("fake", fake).await;
        assert_eq!(
            h.provider.abi_generation(),
            "1.2",
            "the fake is built against ABI 1.2"
        );
        for i in 0..NODES {
            h.server
                .controls()
                .seed(node_json(&node_name(i)))
                .expect("seed node");
        }
        let ctx = h.context(ControllerConfig {
            concurrent_service_syncs: 5,
            ..ControllerConfig::default()
        });
        assert!(ctx.nodes.wait_synced().await && ctx.services.wait_synced().await);
        eventually("node cache", WAIT, || {
            (ctx.nodes.list().len() == NODES).then_some(())
        })
        .await;
        let ctrl = ServiceController::new(ctx.clone()).expect("fake offers LoadBalancer");
        tokio::spawn(ctrl.clone().run());
        let services: Api<Service> = Api::namespaced(h.client.clone(), NS);
        for i in 0..SERVICES {
            let svc = serde_json::from_value(svc_json(&format!("svc-{i:02}"))).unwrap();
            services
                .create(&PostParams::default(), &svc)
                .await
                .expect("create service");
        }
        // Ensured as the controller sees it (a node sync hands a service whose first ensure has
        // not returned back to the service queue: a `create`, not a host update).
        eventually("every load balancer ensured", WAIT, || {
            (0..SERVICES)
                .all(|i| ctrl.is_ensured(&svc_key(i)))
                .then_some(())
        })
        .await;
        let created: std::collections::BTreeSet<String> = h
            .calls()
            .iter()
            .filter(|c| c.call == "create" && c.hosts().len() == NODES)
            .filter_map(|c| c.arg("service").map(str::to_string))
            .collect();
        assert_eq!(created.len(), SERVICES, "every LB created with every node");
        let nodes = Api::all(h.client.clone());
        Cluster { h, nodes }
    }

    /// Make one node change (`add` a node, or delete it) and wait until every load balancer has
    /// had a host update since the calls were cleared; then a moment more, so that a second
    /// update per load balancer would show. Returns the host updates per service.
    async fn change(&self, name: &str, add: bool) -> BTreeMap<String, Vec<CallRecord>> {
        self.h.clear_calls();
        if add {
            let node = serde_json::from_value(node_json(name)).unwrap();
            self.nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("create node");
        } else {
            self.nodes
                .delete(name, &DeleteParams::default())
                .await
                .expect("delete node");
        }
        eventually("a host update for every load balancer", WAIT, || {
            let updates = host_updates(&self.h.calls());
            (updates.len() == SERVICES).then_some(())
        })
        .await;
        // Later syncs (the coalescing interval is 1 s) would make a second update here if the
        // change were sent twice; none may.
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let updates = host_updates(&self.h.calls());
        assert_eq!(updates.len(), SERVICES, "{:?}", updates.keys());
        for (svc, calls) in &updates {
            assert_eq!(
                calls.len(),
                1,
                "{svc}: one node change made {} host updates: {calls:?}",
                calls.len()
            );
        }
        updates
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abi_1_2_plugin_gets_only_the_change() {
    let c = Cluster::start(true).await;
    // The first change after EnsureLoadBalancer is already a difference: against the hosts of
    // the ensure (`LAST_FULL`), not the whole set.
    let first = c.change("extra-a", true).await;
    for i in 0..SERVICES {
        let calls = &first[&svc_key(i)];
        assert_eq!(calls[0].call, "update-hosts", "{calls:?}");
        assert_eq!(calls[0].args["replace"], false, "{calls:?}");
        assert_eq!(strings(&calls[0].args["added"]), ["extra-a"]);
        assert!(strings(&calls[0].args["removed"]).is_empty());
    }
    // And so on, against the token of the last update: one node joins ...
    let joined = c.change("extra-b", true).await;
    for i in 0..SERVICES {
        let calls = &joined[&svc_key(i)];
        assert_eq!(calls[0].call, "update-hosts", "{calls:?}");
        assert_eq!(calls[0].args["replace"], false, "{calls:?}");
        assert_eq!(strings(&calls[0].args["added"]), ["extra-b"]);
        assert!(strings(&calls[0].args["removed"]).is_empty());
    }
    // ... and one leaves.
    let left = c.change(&node_name(7), false).await;
    for i in 0..SERVICES {
        let calls = &left[&svc_key(i)];
        assert_eq!(calls[0].call, "update-hosts", "{calls:?}");
        assert_eq!(calls[0].args["replace"], false, "{calls:?}");
        assert!(strings(&calls[0].args["added"]).is_empty());
        assert_eq!(strings(&calls[0].args["removed"]), [node_name(7)]);
    }
    // The cloud applied them: every load balancer holds exactly the cluster's nodes.
    let lbs = c.h.cloud().load_balancers;
    let mut want: Vec<String> = (0..NODES).filter(|i| *i != 7).map(node_name).collect();
    want.extend(["extra-a".to_string(), "extra-b".to_string()]);
    want.sort();
    assert_eq!(lbs.len(), SERVICES);
    for lb in &lbs {
        assert_eq!(lb.hosts, want, "load balancer of {}", lb.service);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn abi_1_1_plugin_gets_full_host_lists() {
    let c = Cluster::start(false).await;
    for (name, add, hosts) in [
        ("extra-a".to_string(), true, NODES + 1),
        (node_name(7), false, NODES),
    ] {
        let updates = c.change(&name, add).await;
        for i in 0..SERVICES {
            let calls = &updates[&svc_key(i)];
            assert_eq!(calls[0].call, "update", "{calls:?}");
            let got = calls[0].hosts();
            assert_eq!(got.len(), hosts);
            assert!(got.contains(&"extra-a".to_string()));
            assert_eq!(got.contains(&node_name(7)), add);
        }
    }
    let lbs = c.h.cloud().load_balancers;
    assert_eq!(lbs.len(), SERVICES);
    for lb in &lbs {
        assert_eq!(lb.hosts.len(), NODES, "load balancer of {}", lb.service);
        assert!(!lb.hosts.contains(&node_name(7)));
    }
}

/// The token agreement of docs/abi-1.2.md, through the real loader and the SDK's bookkeeping in
/// the fake's `.so`: after EnsureLoadBalancer a change against its hosts (`LAST_FULL`) is
/// applied; an unknown base is a mismatch that changes nothing, the whole set (base 0) is
/// applied and names a token, a change against that token is applied, and a full call
/// (EnsureLoadBalancer) replaces it by `LAST_FULL` again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_name_the_set_the_plugin_applied() {
    use ccm_host::provider::HostList;
    use ccm_provider_abi::ext_v1_2::LAST_FULL;
    let fake: FakeConfig = serde_json::from_value(json!({"incrementalHosts": true})).unwrap();
    let h = Harness::start("fake", fake).await;
    let p = &h.provider;
    let node = |n: &str| -> Node { serde_json::from_value(node_json(n)).unwrap() };
    let mut svc: Service = serde_json::from_value(svc_json("tok")).unwrap();
    svc.metadata.uid = Some("uid-tok".into());
    let (a, b, c) = (node("a"), node("b"), node("c"));
    let list =
        |v: &[&Node]| HostList::new(&v.iter().map(|n| (*n).clone()).collect::<Vec<_>>()).unwrap();
    let hosts = |h: &Harness| {
        h.cloud()
            .load_balancer("default/tok")
            .unwrap()
            .hosts
            .clone()
    };
    p.ensure_load_balancer("k", &svc, std::slice::from_ref(&a))
        .await
        .unwrap();
    // The ensure's hosts are the base `LAST_FULL`; any other base is refused, nothing changes.
    let mismatch = p
        .update_load_balancer_hosts("k", &svc, 41, 42, &list(&[&b]), &list(&[]))
        .await
        .unwrap();
    assert!(!mismatch);
    assert_eq!(hosts(&h), ["a"]);
    // The refusal spent it (the plugin no longer knows what the host believes): refused too.
    assert!(!p
        .update_load_balancer_hosts("k", &svc, LAST_FULL, 42, &list(&[&b]), &list(&[]))
        .await
        .unwrap());
    p.ensure_load_balancer("k", &svc, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert!(p
        .update_load_balancer_hosts("k", &svc, LAST_FULL, 42, &list(&[&b]), &list(&[]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["a", "b"]);
    // Applied: `LAST_FULL` is spent, 42 names the set now.
    assert!(!p
        .update_load_balancer_hosts("k", &svc, LAST_FULL, 43, &list(&[&c]), &list(&[]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["a", "b"]);
    // The whole set names token 43.
    assert!(p
        .update_load_balancer_hosts("k", &svc, 0, 43, &list(&[&a, &b]), &list(&[]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["a", "b"]);
    // A change against 43 is applied and names 44; 43 is spent.
    assert!(p
        .update_load_balancer_hosts("k", &svc, 43, 44, &list(&[&c]), &list(&[&a]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["b", "c"]);
    assert!(!p
        .update_load_balancer_hosts("k", &svc, 43, 45, &list(&[&a]), &list(&[]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["b", "c"]);
    // After a mismatch the plugin holds no token: the host sends the whole set again.
    assert!(p
        .update_load_balancer_hosts("k", &svc, 0, 46, &list(&[&b, &c]), &list(&[]))
        .await
        .unwrap());
    // A full call replaces the set: the token is forgotten, `LAST_FULL` names its hosts.
    p.ensure_load_balancer("k", &svc, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert!(!p
        .update_load_balancer_hosts("k", &svc, 46, 47, &list(&[&c]), &list(&[]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["a"]);
    p.ensure_load_balancer("k", &svc, std::slice::from_ref(&a))
        .await
        .unwrap();
    assert!(p
        .update_load_balancer_hosts("k", &svc, LAST_FULL, 48, &list(&[&c]), &list(&[]))
        .await
        .unwrap());
    assert_eq!(hosts(&h), ["a", "c"]);
    let names: Vec<String> = h
        .calls()
        .into_iter()
        .map(|c| c.call)
        .filter(|c| c == "update-hosts")
        .collect();
    // Mismatches are answered by the SDK without calling the provider's method.
    assert_eq!(names.len(), 5, "{names:?}");
}
