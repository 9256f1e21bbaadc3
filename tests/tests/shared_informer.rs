//! The host's shared watch (`informer::SharedInformer`) against the in-memory API server: the
//! changes it sends (with the old and new versions), what its cache keeps under the service
//! trim, the differences it sends after a relist forced by 410 Gone, and what the node cache gives
//! back of a node (its compact form, `runtime::cached_node`).

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_host::controllers::cache_trim;
use ccm_host::runtime::informer::{cache_key, Change, SharedInformer};
use ccm_integration_tests::harness::eventually_async;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube_apiserver_inmem::{ApiServer, ApiServerOptions};
use serde_json::json;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(20);

/// A change reduced to what the tests compare: kind, key, and the service types of the old and
/// new versions.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Added(String, String),
    Updated(String, String, String),
    Deleted(String, String),
}

fn svc_type(s: &Service) -> String {
    s.spec
        .as_ref()
        .and_then(|s| s.type_.clone())
        .unwrap_or_default()
}

fn seen(c: Change<Service>) -> Seen {
    match c {
        Change::Added(s) => Seen::Added(cache_key(&*s), svc_type(&s)),
        Change::Updated { old, new } => {
            assert_eq!(cache_key(&*old), cache_key(&*new));
            Seen::Updated(cache_key(&*new), svc_type(&old), svc_type(&new))
        }
        Change::Deleted(s) => Seen::Deleted(cache_key(&*s), svc_type(&s)),
    }
}

fn added(name: &str, t: &str) -> Seen {
    Seen::Added(format!("{NS}/{name}"), t.into())
}

fn updated(name: &str, old: &str, new: &str) -> Seen {
    Seen::Updated(format!("{NS}/{name}"), old.into(), new.into())
}

fn deleted(name: &str, t: &str) -> Seen {
    Seen::Deleted(format!("{NS}/{name}"), t.into())
}

/// Receive exactly `n` changes (sorted, since a relist sends them in list order), then check
/// that nothing more arrives for a moment.
async fn next_changes(rx: &mut broadcast::Receiver<Change<Service>>, n: usize) -> Vec<Seen> {
    let mut got = Vec::new();
    while got.len() < n {
        match tokio::time::timeout(WAIT, rx.recv()).await {
            Ok(Ok(c)) => got.push(seen(c)),
            Ok(Err(e)) => panic!("change stream: {e} after {got:?}"),
            Err(_) => panic!("timed out waiting for {n} changes, got {got:?}"),
        }
    }
    if let Ok(Ok(extra)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        panic!("unexpected change {:?} after {got:?}", seen(extra));
    }
    got.sort();
    got
}

fn cached(informer: &SharedInformer<Service>) -> BTreeSet<String> {
    informer.list().iter().map(|s| cache_key(&**s)).collect()
}

/// A view's filter: the Services labelled `x=mine`.
fn labelled_mine() -> ccm_host::runtime::informer::Keep<Service> {
    std::sync::Arc::new(|s: &Service| {
        s.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("x"))
            .is_some_and(|v| v == "mine")
    })
}

fn keys(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| format!("{NS}/{n}")).collect()
}

async fn create(api: &Api<Service>, name: &str, t: &str) {
    let ports = json!([{"port": 80, "protocol": "TCP"}]);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": {"type": t, "ports": ports}}),
        )
        .expect("service literal"),
    )
    .await
    .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

async fn set_type(api: &Api<Service>, name: &str, t: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"type": t}})),
    )
    .await
    .unwrap_or_else(|e| panic!("patch {name}: {e}"));
}

async fn label(api: &Api<Service>, name: &str, value: &str) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": value}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("label {name}: {e}"));
}

async fn delete(api: &Api<Service>, name: &str) {
    api.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
}

/// The services informer with the host's trim, subscribed before its first list and synced.
async fn start_synced(
    server: &ApiServer,
    stop: &CancellationToken,
) -> (
    SharedInformer<Service>,
    broadcast::Receiver<Change<Service>>,
) {
    let informer = SharedInformer::start(
        Api::all(server.client()),
        watcher::Config::default(),
        cache_trim::service,
        stop.clone(),
    );
    let rx = informer.subscribe();
    assert!(informer.wait_synced().await);
    (informer, rx)
}

#[tokio::test]
async fn changes_carry_both_versions_and_uncached_services_send_only_their_exit() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(server.client(), NS);
    let stop = CancellationToken::new();
    create(&api, "before", "LoadBalancer").await;
    create(&api, "plain-before", "ClusterIP").await;

    let (informer, mut rx) = start_synced(&server, &stop).await;
    // The first list: only the service that may have a load balancer is cached and sent.
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("before", "LoadBalancer")]
    );
    assert_eq!(cached(&informer), keys(&["before"]));

    create(&api, "lb", "LoadBalancer").await;
    create(&api, "plain", "ClusterIP").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("lb", "LoadBalancer")]
    );

    label(&api, "lb", "1").await;
    label(&api, "plain", "1").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [updated("lb", "LoadBalancer", "LoadBalancer")]
    );
    let lb = informer
        .store()
        .get(&format!("{NS}/lb"))
        .expect("lb cached");
    assert_eq!(lb.metadata.labels.as_ref().unwrap()["x"], "1");
    assert!(
        lb.metadata.managed_fields.is_none(),
        "the trim ran on the cached copy"
    );

    // Leaving the cache is an update to the uncached version; the later deletion sends nothing.
    set_type(&api, "lb", "ClusterIP").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [updated("lb", "LoadBalancer", "ClusterIP")]
    );
    assert_eq!(cached(&informer), keys(&["before"]));
    delete(&api, "lb").await;
    delete(&api, "plain").await;
    // Entering the cache is an addition.
    set_type(&api, "plain-before", "LoadBalancer").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("plain-before", "LoadBalancer")]
    );
    delete(&api, "before").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [deleted("before", "LoadBalancer")]
    );
    assert_eq!(cached(&informer), keys(&["plain-before"]));
    stop.cancel();
    server.shutdown().await;
}

#[tokio::test]
async fn a_relist_after_410_sends_the_differences_and_replaces_the_cache() {
    let server = ApiServer::start_with(ApiServerOptions {
        history_limit: 5,
        ..Default::default()
    })
    .await
    .unwrap();
    let ctl = server.controls();
    let api: Api<Service> = Api::namespaced(server.client(), NS);
    let stop = CancellationToken::new();
    for name in ["kept", "changed", "leaving", "deleted"] {
        create(&api, name, "LoadBalancer").await;
    }
    create(&api, "plain", "ClusterIP").await;
    let (informer, mut rx) = start_synced(&server, &stop).await;
    assert_eq!(next_changes(&mut rx, 4).await.len(), 4);
    let kept_before = informer.store().get(&format!("{NS}/kept")).unwrap();

    // Keep the watch down while more changes than the history window happen, so it resumes
    // from a resourceVersion the server has forgotten (410) and relists.
    let lists = |ctl: &kube_apiserver_inmem::Controls| {
        ctl.requests()
            .iter()
            .filter(|r| r.verb == "list" && r.resource == "services")
            .count()
    };
    let lists_before = lists(&ctl);
    ctl.fail_next(1_000, "watch", "services", 500);
    ctl.drop_watches();
    label(&api, "changed", "1").await;
    set_type(&api, "leaving", "NodePort").await;
    delete(&api, "deleted").await;
    create(&api, "new", "LoadBalancer").await;
    create(&api, "new-plain", "ClusterIP").await;
    for i in 0..6 {
        label(&api, "plain", &i.to_string()).await;
    }
    ctl.compact();
    ctl.clear_faults();

    // Every relisted object the cache keeps is sent (as upstream's resync does), leaving the
    // cache is an update, an object gone during the outage is deleted, and uncached ones
    // stay invisible.
    let mut want = vec![
        updated("kept", "LoadBalancer", "LoadBalancer"),
        updated("changed", "LoadBalancer", "LoadBalancer"),
        updated("leaving", "LoadBalancer", "NodePort"),
        deleted("deleted", "LoadBalancer"),
        added("new", "LoadBalancer"),
    ];
    want.sort();
    assert_eq!(next_changes(&mut rx, want.len()).await, want);
    assert_eq!(cached(&informer), keys(&["kept", "changed", "new"]));
    assert!(lists(&ctl) > lists_before, "the watch relisted");
    assert!(
        ctl.requests()
            .iter()
            .any(|r| r.verb == "watch" && r.resource == "services" && r.code == 410),
        "a watch was answered with 410"
    );
    let changed = informer.store().get(&format!("{NS}/changed")).unwrap();
    assert_eq!(changed.metadata.labels.as_ref().unwrap()["x"], "1");
    let kept = informer.store().get(&format!("{NS}/kept")).unwrap();
    assert_eq!(
        kept.metadata.resource_version,
        kept_before.metadata.resource_version
    );

    // The watch is live again after the relist.
    delete(&api, "new").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [deleted("new", "LoadBalancer")]
    );
    eventually_async("the cache after the relist", WAIT, || async {
        (cached(&informer) == keys(&["kept", "changed"])).then_some(())
    })
    .await;
    stop.cancel();
    server.shutdown().await;
}

/// `SharedInformer::view` (each provider's nodes in a hybrid cluster): only the kept objects,
/// an object entering the view is `Added`, one leaving it is `Deleted`, and the parent's
/// changes of objects outside the view send nothing.
#[tokio::test]
async fn a_view_keeps_what_its_filter_accepts_and_sends_entries_and_exits() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(server.client(), NS);
    let stop = CancellationToken::new();
    create(&api, "mine-before", "LoadBalancer").await;
    label(&api, "mine-before", "mine").await;
    create(&api, "other-before", "LoadBalancer").await;

    let (parent, _parent_rx) = start_synced(&server, &stop).await;
    let view = parent.view(labelled_mine(), stop.clone());
    let mut rx = view.subscribe();
    assert!(view.wait_synced().await);
    // The first list of the view is its cache, sent as additions to early subscribers.
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("mine-before", "LoadBalancer")]
    );
    assert_eq!(cached(&view), keys(&["mine-before"]));

    // Outside the view: nothing.
    create(&api, "other", "LoadBalancer").await;
    label(&api, "other-before", "theirs").await;
    // Entering: an addition; changing inside: an update; leaving: a deletion.
    label(&api, "other", "mine").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("other", "LoadBalancer")]
    );
    set_type(&api, "other", "NodePort").await;
    // NodePort services are not cached by the parent's trim: leaving the parent's cache is
    // leaving the view, with the parent's update to the uncached version.
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [updated("other", "LoadBalancer", "NodePort")]
    );
    assert_eq!(cached(&view), keys(&["mine-before"]));
    label(&api, "mine-before", "theirs").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [deleted("mine-before", "LoadBalancer")]
    );
    label(&api, "mine-before", "mine").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("mine-before", "LoadBalancer")]
    );
    assert_eq!(cached(&view), keys(&["mine-before"]));
    assert_eq!(
        cached(&parent),
        keys(&["mine-before", "other-before"]),
        "the parent keeps everything"
    );
    delete(&api, "mine-before").await;
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [deleted("mine-before", "LoadBalancer")]
    );
    assert!(cached(&view).is_empty());
    stop.cancel();
}

/// `view_after`: the view stays unsynced (and empty) until its gate opens, even though the parent
/// synced; what changed in between is in its first fill, sent to early subscribers as additions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_view_syncs_when_its_gate_opens_with_what_changed_meanwhile() {
    let server = ApiServer::start().await.unwrap();
    let api: Api<Service> = Api::namespaced(server.client(), NS);
    let stop = CancellationToken::new();
    create(&api, "mine-before", "LoadBalancer").await;
    label(&api, "mine-before", "mine").await;
    let (parent, _parent_rx) = start_synced(&server, &stop).await;
    let (open, gate) = tokio::sync::oneshot::channel::<()>();
    let view = parent.view_after(
        labelled_mine(),
        async move {
            let _ = gate.await;
        },
        stop.clone(),
    );
    let mut rx = view.subscribe();
    // While the gate is shut: a change the view must not lose.
    create(&api, "mine-meanwhile", "LoadBalancer").await;
    label(&api, "mine-meanwhile", "mine").await;
    label(&api, "mine-before", "theirs").await;
    // The parent has them all before the gate opens (so the first fill is what is asserted).
    let x_of = |name: &str| {
        parent
            .store()
            .get(&format!("{NS}/{name}"))
            .and_then(|s| s.metadata.labels.as_ref()?.get("x").cloned())
    };
    eventually_async("the parent caught up", Duration::from_secs(20), || {
        let done = x_of("mine-before").as_deref() == Some("theirs")
            && x_of("mine-meanwhile").as_deref() == Some("mine");
        async move { done.then_some(()) }
    })
    .await;
    let waited = tokio::time::timeout(Duration::from_millis(500), view.wait_synced()).await;
    assert!(waited.is_err(), "the view synced before its gate opened");
    assert!(cached(&view).is_empty());
    open.send(()).unwrap();
    assert!(view.wait_synced().await);
    assert_eq!(
        next_changes(&mut rx, 1).await,
        [added("mine-meanwhile", "LoadBalancer")]
    );
    assert_eq!(cached(&view), keys(&["mine-meanwhile"]));
    stop.cancel();
}

/// A node as kubelets write them: every kind of field the compact cache keeps apart (labels,
/// annotations, taints, pod CIDRs, conditions, addresses, node info with per-machine IDs, daemon
/// endpoints, runtime handlers) and ones the trim drops (images, capacity, pressure conditions,
/// condition messages).
fn rich_node(name: &str, machine: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "topology.kubernetes.io/zone": "zone-a"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "finalizers": ["example.com/keep"],
        },
        "spec": {"providerID": format!("fake://{name}"), "podCIDR": "10.1.0.0/24",
                 "podCIDRs": ["10.1.0.0/24", "fd00::/64"],
                 "taints": [{"key": "example.com/t", "value": "v", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "8", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": machine, "systemUUID": machine, "bootID": machine,
                         "kernelVersion": "6.1.0", "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "containerd://1.7",
                         "kubeletVersion": "v1.35.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "runtimeHandlers": [{"name": "runc", "features": {"recursiveReadOnlyMounts": true}}],
            "images": [{"names": ["registry.example/app:v1"], "sizeBytes": 1000}],
        },
    }))
    .unwrap()
}

/// The node cache keeps nodes in a compact form (`runtime::cached_node`): what it gives back, as
/// a `Node` to controllers and as JSON to providers, is the API server's node with only the
/// documented trims (`cache_trim::node`), after the first list and after an update.
#[tokio::test]
async fn cached_nodes_are_the_api_servers_nodes_minus_the_documented_trims() {
    use ccm_host::runtime::CachedNode;
    use k8s_openapi::api::core::v1::Node;

    let server = ApiServer::start().await.unwrap();
    let api: Api<Node> = Api::all(server.client());
    for (name, machine) in [("n1", "m-1"), ("n2", "m-2")] {
        api.create(&PostParams::default(), &rich_node(name, machine))
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }
    let stop = CancellationToken::new();
    let informer: SharedInformer<CachedNode> = SharedInformer::start(
        Api::all(server.client()),
        watcher::Config::default(),
        cache_trim::node,
        stop.clone(),
    );
    assert!(informer.wait_synced().await);
    let same_as_api = |name: &'static str| {
        let (api, informer) = (api.clone(), informer.clone());
        async move {
            let mut expect = api.get(name).await.unwrap();
            assert!(cache_trim::node(&mut expect));
            let cached = eventually_async(&format!("{name} cached"), WAIT, || {
                let cached = informer.store().get(name);
                let rv = expect.metadata.resource_version.clone();
                async move { cached.filter(|c| c.resource_version() == rv.as_deref()) }
            })
            .await;
            assert_eq!(cached.to_node(), expect, "{name} as a Node");
            assert_eq!(
                serde_json::to_value(&*cached).unwrap(),
                serde_json::to_value(&expect).unwrap(),
                "{name} as the JSON a provider gets"
            );
            cached
        }
    };
    let n1 = same_as_api("n1").await;
    same_as_api("n2").await;
    // What the controllers read of it.
    assert_eq!(n1.label("topology.kubernetes.io/zone"), Some("zone-a"));
    assert_eq!(n1.provider_id(), Some("fake://n1"));
    assert_eq!(n1.taints()[0].key, "example.com/t");
    assert_eq!(n1.conditions().len(), 1, "only Ready is kept");
    assert_eq!(n1.condition("Ready").unwrap().message, None);
    assert!(n1.to_node().status.unwrap().images.is_none());

    api.patch(
        "n1",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-b"}},
                             "spec": {"taints": []}}),
        ),
    )
    .await
    .unwrap();
    let n1 = same_as_api("n1").await;
    assert_eq!(n1.label("topology.kubernetes.io/zone"), Some("zone-b"));
    assert!(n1.taints().is_empty());
    stop.cancel();
}
