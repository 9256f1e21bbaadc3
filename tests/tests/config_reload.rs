//! `--cloud-config` hot reload and the health probe at the provider layer, with the fake
//! provider's `.so` (host/src/provider/lifecycle.rs): reload in place through the provider's
//! `reconfigure`, reload by rebuilding it from its factory (initialised like the first
//! instance, swapped in while a call is still running on the old one), every kind of bad
//! config keeping the old instance, and the instance cache emptied by a reload (no answer
//! learned under the old config is served after it). The file watch and `/readyz` are tested with the real daemon
//! in cli/tests/config_reload.rs.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use ccm_host::controllers::{node, ControllerConfig};
use ccm_host::provider::{CacheUse, HostServices, ReloadMethod};
use ccm_host::runtime::CachedNode;
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_abi::ErrorKind;
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::Node;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);
const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// The fake's config as the harness gives it (with its state directory), plus `extra`.
fn config_bytes(h: &Harness, extra: Value) -> Vec<u8> {
    let mut v = extra;
    v["stateDir"] = json!(h.state_dir());
    serde_json::to_vec(&v).unwrap()
}

fn fake(v: Value) -> FakeConfig {
    serde_json::from_value(v).expect("fake config")
}

fn node_named(name: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

async fn instance_type(h: &Harness, name: &str) -> String {
    h.provider
        .instance_metadata(&node_named(name))
        .await
        .expect("InstanceMetadata answers")
        .expect("metadata")
        .instance_type
}

/// Initialise the provider as the daemon does on becoming leader.
async fn initialize(h: &Harness) {
    let host = HostServices::new(
        "kubernetes",
        Some(h.client.clone()),
        Arc::new(AtomicBool::new(false)),
    );
    h.provider.initialize(host).await.expect("Initialize");
}

/// Reload the provider with default instance type `large`, applied in place by `reconfigure`.
async fn reconfigure_to_large(h: &Harness) {
    let reloaded = h
        .provider
        .reload(&config_bytes(
            h,
            json!({"defaults": {"instanceType": "large"}}),
        ))
        .await;
    assert_eq!(reloaded, Ok(ReloadMethod::Reconfigure));
}

fn calls_named(h: &Harness, call: &str) -> usize {
    h.calls().iter().filter(|c| c.call == call).count()
}

/// A node as the controllers hand it to the instance cache (which keeps answers per Node
/// object: it needs the UID).
fn cached_node(name: &str) -> Arc<CachedNode> {
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": name, "uid": format!("uid-{name}")}}))
            .unwrap();
    Arc::new(node.into())
}

/// Calls that asked the cloud about an instance, one node at a time or in a batch.
fn instance_lookups(h: &Harness) -> usize {
    calls_named(h, "instance-metadata-by-provider-id") + calls_named(h, "instances-batch")
}

/// Accept cached answers of the last hour and keep what is learned as long (node
/// initialisation's use of the cache, with a long period).
const KEEP: CacheUse = CacheUse {
    max_age: Duration::from_secs(3600),
    keep_for: Duration::from_secs(3600),
};

async fn cached_instance_type(h: &Harness, node: &Arc<CachedNode>) -> String {
    h.provider
        .instance_metadata_cached(node, KEEP)
        .await
        .expect("InstanceMetadata answers")
        .expect("metadata")
        .instance_type
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_config_is_applied_in_place_by_reconfigure_and_the_controllers_use_it() {
    let h = Harness::start("fake", fake(json!({"defaults": {"instanceType": "small"}}))).await;
    initialize(&h).await;
    let ctx = h.context(ControllerConfig {
        node_status_update_frequency: Duration::from_secs(3600),
        ..Default::default()
    });
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
    let create = |name: &str| {
        h.server.controls().seed(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                   "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]}}),
        )
    };
    let type_of = |name: &str| {
        h.server.controls().get("nodes", "", name).and_then(|n| {
            n["metadata"]["labels"][TYPE_LABEL]
                .as_str()
                .map(str::to_string)
        })
    };
    create("before").unwrap();
    eventually("node 'before' initialised", WAIT, || type_of("before")).await;
    assert_eq!(type_of("before").as_deref(), Some("small"));

    reconfigure_to_large(&h).await;

    create("after").unwrap();
    let t = eventually("node 'after' initialised", WAIT, || type_of("after")).await;
    assert_eq!(t, "large", "the node controller's calls see the new config");
    assert_eq!(type_of("before").as_deref(), Some("small"));
    // In place: the instance the host initialised is the one that answered, no second one.
    assert_eq!(calls_named(&h, "reconfigure"), 1);
    assert_eq!(calls_named(&h, "initialize"), 1);
    let m = h.provider.reload_metrics();
    assert_eq!(m.get(ReloadMethod::Reconfigure, true), 1);
    assert_eq!(m.get(ReloadMethod::Rebuild, true), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_reconfigure_a_rebuilt_instance_is_initialised_and_swapped_in_while_calls_finish_on_the_old_one(
) {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let h = Harness::start(
        "fake",
        fake(json!({
            "defaults": {"instanceType": "small"},
            "reconfigure": "notImplemented",
            "pause": {"InstanceMetadata": gate.path()},
        })),
    )
    .await;
    initialize(&h).await;

    // A call blocked inside the plugin (on the pause gate) while the reload happens.
    let in_flight = {
        let provider = h.provider.clone();
        tokio::spawn(async move { provider.instance_metadata(&node_named("n1")).await })
    };
    eventually("the call reached the plugin", WAIT, || {
        (calls_named(&h, "instance-metadata-by-provider-id") == 1).then_some(())
    })
    .await;

    let reloaded = tokio::time::timeout(
        WAIT,
        h.provider.reload(&config_bytes(
            &h,
            json!({"defaults": {"instanceType": "large"}, "reconfigure": "notImplemented"}),
        )),
    )
    .await
    .expect("the reload does not wait for the call in flight");
    assert_eq!(
        reloaded,
        Ok(ReloadMethod::Rebuild),
        "the swap does not wait for the call in flight"
    );
    assert!(!in_flight.is_finished());
    // The new instance got Initialize (with the host's services) before it was swapped in; its
    // call log starts again at seq 1.
    let calls = h.calls();
    let inits: Vec<u64> = calls
        .iter()
        .filter(|c| c.call == "initialize")
        .map(|c| c.seq)
        .collect();
    assert_eq!(inits.len(), 2, "{calls:?}");
    assert_eq!(
        inits[1], 1,
        "the second Initialize is the new instance's first call"
    );
    assert_eq!(
        calls_named(&h, "reconfigure"),
        1,
        "asked first, NOT_IMPLEMENTED"
    );

    drop(gate);
    let old_answer = in_flight.await.unwrap().unwrap().unwrap();
    assert_eq!(
        old_answer.instance_type, "small",
        "finished on the old instance"
    );
    assert_eq!(instance_type(&h, "n2").await, "large");
    let m = h.provider.reload_metrics();
    assert_eq!(
        (
            m.get(ReloadMethod::Rebuild, true),
            m.get(ReloadMethod::Reconfigure, true)
        ),
        (1, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bad_config_keeps_the_old_instance_whatever_step_refuses_it() {
    // In place: reconfigure refuses bytes that do not parse.
    let h = Harness::start("fake", fake(json!({"defaults": {"instanceType": "small"}}))).await;
    let e = h
        .provider
        .reload(&config_bytes(&h, json!({"defaults": {"instanceTyp": "x"}})))
        .await
        .unwrap_err();
    assert_eq!(e.method, ReloadMethod::Reconfigure);
    assert!(e.message.contains("unknown field"), "{e}");
    assert_eq!(instance_type(&h, "n1").await, "small");
    let m = h.provider.reload_metrics();
    assert_eq!(m.get(ReloadMethod::Reconfigure, false), 1);
    assert_eq!(m.get(ReloadMethod::Reconfigure, true), 0);

    // Rebuilt: the factory refuses, the new instance offers other capabilities, or its
    // Initialize fails. Each time the old instance keeps answering, initialised once.
    let h = Harness::start(
        "fake",
        fake(json!({"defaults": {"instanceType": "small"}, "reconfigure": "notImplemented"})),
    )
    .await;
    initialize(&h).await;
    let cases = [
        (json!({"defaults": {"instanceTyp": "x"}}), "factory refused it"),
        (
            json!({"disableRoutes": true}),
            "capabilities [InstancesV2, Instances, Zones, LoadBalancer, Routes, Clusters] → [InstancesV2, Instances, Zones, LoadBalancer, Clusters]",
        ),
        (
            json!({"errors": {"Initialize": {"kind": "unauthorized", "message": "bad key"}}}),
            "Initialize of the new instance failed: bad key",
        ),
    ];
    for (i, (bad, why)) in cases.into_iter().enumerate() {
        let e = h.provider.reload(&config_bytes(&h, bad)).await.unwrap_err();
        assert_eq!(e.method, ReloadMethod::Rebuild);
        assert!(e.message.contains(why), "{e}");
        assert_eq!(instance_type(&h, &format!("n{i}")).await, "small");
        assert_eq!(
            h.provider
                .reload_metrics()
                .get(ReloadMethod::Rebuild, false),
            i as u64 + 1
        );
    }
    // One Initialize of the first instance, one of the instance whose Initialize failed; the
    // calls since went to the first one (its call log goes on, no restart at seq 1).
    assert_eq!(calls_named(&h, "initialize"), 2);
    let last = h.calls().pop().unwrap();
    assert_eq!(last.call, "instance-metadata-by-provider-id");
    assert!(last.seq > 3, "{last:?}");
    assert_eq!(
        h.provider.reload_metrics().get(ReloadMethod::Rebuild, true),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_probe_answers_what_the_provider_says() {
    let h = Harness::start("fake", FakeConfig::default()).await;
    h.provider.health().await.expect("healthy by default");
    h.set_control(&fake(
        json!({"health": {"kind": "unauthorized", "message": "credentials rejected"}}),
    ));
    let e = h.provider.health().await.unwrap_err();
    assert_eq!(
        (e.kind(), e.message()),
        (ErrorKind::UNAUTHORIZED, "credentials rejected")
    );
    h.set_control(&fake(json!({"health": {"kind": "not_implemented"}})));
    assert_eq!(
        h.provider.health().await.unwrap_err().kind(),
        ErrorKind::NOT_IMPLEMENTED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reload_empties_the_instance_cache() {
    for (reconfigure, bulk) in [
        ("inPlace", false),
        ("notImplemented", false),
        ("inPlace", true),
        ("notImplemented", true),
    ] {
        let case = format!("reconfigure: {reconfigure}, bulkInstances: {bulk}");
        let config = |instance_type: &str| {
            json!({"defaults": {"instanceType": instance_type}, "reconfigure": reconfigure,
                   "bulkInstances": bulk})
        };
        let h = Harness::start("fake", fake(config("small"))).await;
        let node = cached_node("n1");
        assert_eq!(cached_instance_type(&h, &node).await, "small", "{case}");
        assert_eq!(cached_instance_type(&h, &node).await, "small", "{case}");
        assert_eq!(
            instance_lookups(&h),
            1,
            "{case}: the second answer is the cache's"
        );

        let method = h
            .provider
            .reload(&config_bytes(&h, config("large")))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let expected = if reconfigure == "inPlace" {
            ReloadMethod::Reconfigure
        } else {
            ReloadMethod::Rebuild
        };
        assert_eq!(method, expected, "{case}");

        assert_eq!(
            cached_instance_type(&h, &node).await,
            "large",
            "{case}: the first lookup after the reload asks the cloud"
        );
        assert_eq!(instance_lookups(&h), 2, "{case}");
        assert_eq!(cached_instance_type(&h, &node).await, "large", "{case}");
        assert_eq!(instance_lookups(&h), 2, "{case}: cached again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lookup_under_way_during_a_reload_is_neither_joined_nor_kept() {
    let gate = tempfile::NamedTempFile::new().unwrap();
    let h = Harness::start(
        "fake",
        fake(json!({
            "defaults": {"instanceType": "small"},
            "pause": {"InstanceMetadata": gate.path()},
        })),
    )
    .await;
    let node = cached_node("n1");
    // A lookup blocked inside the plugin (on the pause gate) while the config changes.
    let in_flight = {
        let (provider, node) = (h.provider.clone(), node.clone());
        tokio::spawn(async move { provider.instance_metadata_cached(&node, KEEP).await })
    };
    eventually("the lookup reached the plugin", WAIT, || {
        (calls_named(&h, "instance-metadata-by-provider-id") == 1).then_some(())
    })
    .await;
    reconfigure_to_large(&h).await;

    // Asked after the reload: a call of its own (the paused one would answer for the old
    // config, and only once the gate opens).
    let after = tokio::time::timeout(Duration::from_secs(10), cached_instance_type(&h, &node))
        .await
        .expect("not joined to the lookup under way");
    assert_eq!(after, "large");

    drop(gate);
    let old = in_flight.await.unwrap().unwrap().unwrap();
    assert_eq!(
        old.instance_type, "small",
        "its caller gets the answer it asked for"
    );
    // ... which the cache did not keep over the new one.
    assert_eq!(cached_instance_type(&h, &node).await, "large");
    assert_eq!(instance_lookups(&h), 2);
}
