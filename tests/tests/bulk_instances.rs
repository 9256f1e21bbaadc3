//! Bulk instance lookups (ABI 1.1 `BULK_INSTANCES`) and the instance cache, through the real
//! controllers and the fake provider's `.so` (`bulkInstances: true`): node initialisation, the
//! address loop and the lifecycle checks ask about many nodes in one `InstancesBatch` call
//! (counted in the fake's call log, one `instances-batch` record per call); a provider without
//! the capability is asked node by node; the address loop right after initialisation asks
//! nothing (cache); a per-node error is that node's only, a batch-level one every node's, and
//! neither ever deletes a Node (host/src/provider/bulk.rs, docs/writing-a-provider.md).
//!
//! Batches are made deterministic by size, not by time: the collection window is set far
//! longer than any test, so a batch is sent when it holds `--instance-batch-size` nodes (or, for
//! a caller that waits for all its nodes, when the window ends: only where noted).

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_host::controllers::node::{self, NodeController};
use ccm_host::controllers::node_lifecycle::{
    self, monitor_nodes, NodeDeletionPolicy, INSTANCE_DOES_NOT_EXIST,
};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::provider::{CacheUse, InstanceQuery, ProviderOptions};
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use ccm_provider_fake::control::CallRecord;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
const WAIT: Duration = Duration::from_secs(30);
const BATCH: &str = "instances-batch";
/// Longer than any test: batches are sent by size.
const LONG_WINDOW: Duration = Duration::from_secs(600);

fn fake(config: Value) -> FakeConfig {
    serde_json::from_value(config).expect("fake config")
}

/// The fake with bulk lookups on, plus `extra`.
fn bulk(extra: Value) -> FakeConfig {
    let mut c = json!({"bulkInstances": true});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    fake(c)
}

fn batching(size: usize, window: Duration) -> ProviderOptions {
    ProviderOptions {
        instance_batch_size: size,
        instance_batch_window: window,
        ..ProviderOptions::default()
    }
}

fn cfg() -> ControllerConfig {
    ControllerConfig {
        // The address loop's first pass runs at start; the tests run the next one themselves.
        node_status_update_frequency: Duration::from_secs(3600),
        // Fewer workers than a batch holds: batching does not depend on them.
        concurrent_node_syncs: 2,
        ..Default::default()
    }
}

fn tainted_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "Hostname", "address": name}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn not_ready_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"providerID": format!("fake://{name}")},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    })
}

fn initialised(h: &Harness, name: &str) -> bool {
    h.server.controls().get("nodes", "", name).is_some_and(|n| {
        !n["spec"]["taints"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == TAINT))
            && n["spec"]["providerID"].is_string()
    })
}

async fn wait_initialised(h: &Harness, names: &[String]) {
    eventually("nodes initialised", WAIT, || {
        names.iter().all(|n| initialised(h, n)).then_some(())
    })
    .await;
}

/// Wait until the controller's cache shows every node initialised (the address loop reads it).
async fn wait_cached_untainted(ctx: &ControllerContext, count: usize) {
    eventually("initialised nodes cached", WAIT, || {
        let nodes = ctx.nodes.list();
        (nodes.len() == count
            && nodes
                .iter()
                .all(|n| n.taints().iter().all(|t| t.key != TAINT)))
        .then_some(())
    })
    .await;
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:02}")).collect()
}

fn batch_nodes(c: &CallRecord) -> Vec<String> {
    c.args["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect()
}

fn batches(h: &Harness) -> Vec<CallRecord> {
    h.calls().into_iter().filter(|c| c.call == BATCH).collect()
}

fn provider_metrics(h: &Harness) -> String {
    let mut registry = Registry::default();
    h.provider.metrics().register(&mut registry);
    ccm_host::runtime::metrics::render(&registry)
}

fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

async fn synced(h: &Harness, config: ControllerConfig) -> ControllerContext {
    let ctx = h.context(config);
    assert!(ctx.nodes.wait_synced().await);
    ctx
}

fn events_with_reason(h: &Harness, reason: &str) -> Vec<Value> {
    h.server
        .controls()
        .list("events")
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

// ---- Node initialisation and the address loop -----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialisation_asks_in_batches_and_the_address_loop_then_asks_nothing() {
    let h = Harness::start_with("fake", bulk(json!({})), batching(10, LONG_WINDOW)).await;
    let ctx = synced(&h, cfg()).await;
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
    let all = names("node", 30);
    for n in &all {
        h.server.controls().seed(tainted_node(n)).unwrap();
    }
    wait_initialised(&h, &all).await;

    // 30 nodes, batches of 10, two workers: three calls, every node in exactly one of them,
    // and no per-node call.
    let calls = h.calls();
    assert!(calls.iter().all(|c| c.call == BATCH), "{calls:#?}");
    assert_eq!(calls.len(), 3, "{calls:#?}");
    let mut asked: Vec<String> = calls.iter().flat_map(batch_nodes).collect();
    assert!(calls.iter().all(|c| batch_nodes(c).len() == 10));
    asked.sort();
    assert_eq!(asked, all, "every node asked about once");
    assert_eq!(
        calls[0].args["query"],
        json!(["InstanceExists", "InstanceMetadata"]),
        "existence is always asked with the metadata"
    );
    // The outcome is the per-node path's: provider ID, labels, the cloud's addresses.
    let n = h.server.controls().get("nodes", "", "node-07").unwrap();
    assert_eq!(n["spec"]["providerID"], "fake://node-07");
    assert_eq!(
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"],
        "fake.medium"
    );
    let addresses = n["status"]["addresses"].as_array().unwrap();
    assert!(addresses.iter().any(|a| a["type"] == "InternalIP"));
    let m = provider_metrics(&h);
    assert_eq!(sample(&m, "ccm_provider_instance_batch_size_count"), 3.0);
    assert_eq!(sample(&m, "ccm_provider_instance_batch_size_sum"), 30.0);
    assert_eq!(
        sample(
            &m,
            "ccm_provider_calls_total{method=\"InstancesBatch\",caller=\"cloud-node-controller\"}"
        ),
        3.0
    );

    // The address loop right after: every answer is in the cache (younger than its period).
    wait_cached_untainted(&ctx, 30).await;
    let hits = "ccm_provider_instance_cache_hits_total{caller=\"cloud-node-controller\"}";
    let before = sample(&provider_metrics(&h), hits);
    NodeController::new(ctx.for_controller(node::NAME))
        .update_node_status()
        .await;
    assert_eq!(h.calls().len(), 3, "the address loop made no call");
    assert_eq!(sample(&provider_metrics(&h), hits) - before, 30.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_address_loop_asks_about_every_node_in_batches_once_answers_are_older_than_its_period()
{
    // A pass waits for all its answers, so its last batch is sent when the window ends.
    let h = Harness::start_with(
        "fake",
        bulk(json!({})),
        batching(4, Duration::from_millis(50)),
    )
    .await;
    let all = names("node", 10);
    for n in &all {
        let mut node = tainted_node(n);
        node["spec"] = json!({"providerID": format!("fake://{n}")});
        h.server.controls().seed(node).unwrap();
    }
    let config = ControllerConfig {
        node_status_update_frequency: Duration::from_millis(1),
        ..cfg()
    };
    let ctx = synced(&h, config).await;
    wait_cached_untainted(&ctx, 10).await;
    let controller = NodeController::new(ctx.for_controller(node::NAME));
    controller.update_node_status().await;
    let calls = batches(&h);
    assert_eq!(calls.len(), 3, "4 + 4 + 2: {calls:#?}");
    assert_eq!(h.calls().len(), 3, "nothing else");
    // The cloud's addresses were published, as by the per-node path.
    let n = h.server.controls().get("nodes", "", "node-03").unwrap();
    assert!(n["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["type"] == "InternalIP"));
    // The next pass asks again: the address loop keeps nothing of its own.
    controller.update_node_status().await;
    assert_eq!(batches(&h).len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_capability_nodes_are_asked_one_by_one_and_the_cache_still_serves_the_address_loop(
) {
    // 1.1 provider without BULK_INSTANCES (the fake's default): InstancesV2 per node.
    let h = Harness::start_with("fake", fake(json!({})), batching(10, LONG_WINDOW)).await;
    assert!(!h.provider.bulk_instances());
    let ctx = synced(&h, cfg()).await;
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
    let all = names("node", 5);
    for n in &all {
        h.server.controls().seed(tainted_node(n)).unwrap();
    }
    wait_initialised(&h, &all).await;
    let calls = h.call_names();
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(calls
        .iter()
        .all(|c| c == "instance-metadata-by-provider-id"));
    wait_cached_untainted(&ctx, 5).await;
    NodeController::new(ctx.for_controller(node::NAME))
        .update_node_status()
        .await;
    assert_eq!(
        h.calls().len(),
        5,
        "the address loop's answers came from the cache"
    );

    // fake-v1 (legacy Instances, no InstancesV2, no bulk): the per-node legacy calls.
    let h = Harness::start_with("fake-v1", fake(json!({})), batching(10, LONG_WINDOW)).await;
    let ctx = synced(&h, cfg()).await;
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
    let all = names("legacy", 3);
    for n in &all {
        h.server.controls().seed(tainted_node(n)).unwrap();
    }
    wait_initialised(&h, &all).await;
    let calls = h.call_names();
    assert!(!calls.iter().any(|c| c == BATCH), "{calls:?}");
    assert!(calls.iter().any(|c| c == "node-addresses-by-provider-id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_error_in_a_batch_is_that_nodes_and_a_batch_error_every_nodes() {
    let h = Harness::start_with(
        "fake",
        bulk(json!({
            "instances": [{"name": "bad-00", "errors": {"InstanceMetadata":
                {"kind": "other", "message": "metadata service down for bad-00"}}}],
            "errors": {"InstancesBatch": {"kind": "other", "message": "cloud API down", "times": 1}},
        })),
        // Retries ask about one or two nodes: their batches are sent when the window ends.
        batching(6, Duration::from_millis(50)),
    )
    .await;
    // Seeded before the controller starts: its first list asks about all six in one batch.
    let good = names("good", 5);
    for n in good.iter().chain(["bad-00".to_string()].iter()) {
        h.server.controls().seed(tainted_node(n)).unwrap();
    }
    let ctx = synced(&h, cfg()).await;
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
    // The first batch (all six nodes) fails as a whole; every node is retried; the good ones
    // are initialised, bad-00 keeps failing on its own.
    wait_initialised(&h, &good).await;
    let first = &batches(&h)[0];
    assert_eq!(batch_nodes(first).len(), 6);
    eventually("bad-00 asked again", WAIT, || {
        (batches(&h)
            .iter()
            .filter(|c| batch_nodes(c).contains(&"bad-00".to_string()))
            .count()
            >= 3)
            .then_some(())
    })
    .await;
    assert!(!initialised(&h, "bad-00"), "its own error keeps it tainted");
    let stored = h.server.controls().get("nodes", "", "bad-00").unwrap();
    assert!(stored["spec"]["providerID"].is_null());
    assert!(stored["metadata"]["labels"].is_null());
    // The error gone, the node is initialised by its next retry.
    h.set_control(&bulk(json!({})));
    wait_initialised(&h, &["bad-00".to_string()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_batch_pauses_every_call_and_the_nodes_are_initialised_after_it() {
    let h = Harness::start_with(
        "fake",
        bulk(json!({})),
        batching(3, Duration::from_millis(50)),
    )
    .await;
    // The batch is held in the plugin (pause gate) until every worker waits for it, then
    // answers THROTTLED once.
    let gate = h.state_path("gate");
    std::fs::write(&gate, "").unwrap();
    h.set_control(&bulk(json!({
        "errors": {"InstancesBatch":
            {"kind": "throttled", "retryAfter": "1s", "message": "Rate exceeded", "times": 1}},
        "pause": {"InstancesBatch": gate},
    })));
    let all = names("node", 3);
    for n in &all {
        h.server.controls().seed(tainted_node(n)).unwrap();
    }
    let config = ControllerConfig {
        concurrent_node_syncs: 3,
        ..cfg()
    };
    let ctx = synced(&h, config).await;
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
    let misses = "ccm_provider_instance_cache_misses_total{caller=\"cloud-node-controller\"}";
    eventually("three workers wait for the batch", WAIT, || {
        (sample(&provider_metrics(&h), misses) == 3.0 && batches(&h).len() == 1).then_some(())
    })
    .await;
    std::fs::remove_file(&gate).unwrap();
    wait_initialised(&h, &all).await;
    let calls = batches(&h);
    assert_eq!(batch_nodes(&calls[0]).len(), 3, "{calls:#?}");
    assert!(calls.len() >= 2, "{calls:#?}");
    assert!(
        calls[1].at_ms >= calls[0].at_ms + 1000,
        "no call during the 1 s pause: {calls:#?}"
    );
    assert_eq!(
        sample(
            &provider_metrics(&h),
            "ccm_provider_throttled_total{method=\"InstancesBatch\"}"
        ),
        1.0
    );
    // Every node whose sync was throttled gets the Warning event (and is retried after the
    // pause without a failure, which is how it got initialised).
    for n in &all {
        let event = eventually("CloudProviderThrottled event", WAIT, || {
            events_with_reason(&h, "CloudProviderThrottled")
                .into_iter()
                .find(|e| e["involvedObject"]["name"] == n.as_str())
        })
        .await;
        assert_eq!(event["type"], "Warning");
        assert_eq!(
            event["message"],
            "cloud provider throttled InstancesBatch: Rate exceeded; every call to the cloud \
             provider is paused for 1s, then retried"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_asking_at_the_same_time_share_batches_and_cached_answers() {
    let h = Harness::start_with("fake", bulk(json!({})), batching(8, LONG_WINDOW)).await;
    let all = names("node", 8);
    for n in &all {
        h.server.controls().seed(not_ready_node(n)).unwrap();
    }
    let ctx = synced(&h, cfg()).await;
    eventually("nodes cached", WAIT, || {
        (ctx.nodes.list().len() == 8).then_some(())
    })
    .await;
    let nodes = ctx.nodes.list();
    let keep = CacheUse {
        max_age: Duration::from_secs(60),
        keep_for: Duration::from_secs(60),
    };
    // Two callers, half the nodes each, then the other half: one batch of 8 between them.
    let a = h.provider.for_caller("a");
    let b = h.provider.for_caller("b");
    let (first, second) = nodes.split_at(4);
    let (x, y) = tokio::join!(
        a.instance_answers(first, InstanceQuery::METADATA, keep),
        b.instance_answers(second, InstanceQuery::METADATA, keep),
    );
    assert!(x
        .iter()
        .chain(&y)
        .all(|r| r.as_ref().unwrap().exists == Some(true)));
    assert_eq!(batches(&h).len(), 1);
    // Answers kept: asked again within their age, nothing is sent.
    let again = a
        .instance_answers(
            &nodes,
            InstanceQuery::METADATA,
            CacheUse::read(keep.max_age),
        )
        .await;
    assert!(again.iter().all(Result::is_ok));
    assert_eq!(batches(&h).len(), 1);
    // ... but a query asking more than was answered goes to the cloud.
    let shutdown = a
        .instance_answers(
            &nodes,
            InstanceQuery::SHUTDOWN,
            CacheUse::read(keep.max_age),
        )
        .await;
    assert!(shutdown
        .iter()
        .all(|r| r.as_ref().unwrap().shutdown == Some(false)));
    assert_eq!(batches(&h).len(), 2);
    let m = provider_metrics(&h);
    assert_eq!(
        sample(&m, "ccm_provider_instance_cache_hits_total{caller=\"a\"}"),
        8.0
    );
    assert_eq!(
        sample(&m, "ccm_provider_instance_cache_misses_total{caller=\"a\"}"),
        12.0
    );
}

// ---- Lifecycle ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lifecycle_pass_asks_about_every_not_ready_node_in_one_batch() {
    let h = Harness::start_with(
        "fake",
        bulk(json!({"autoInstances": false, "instances": [
            {"name": "fine"},
            {"name": "gone", "exists": false},
            {"name": "stopped", "shutdown": true},
            {"name": "denied", "errors": {"InstancesBatch":
                {"kind": "unauthorized", "message": "403 Forbidden: UnauthorizedOperation"}}},
        ]})),
        batching(500, Duration::from_millis(20)),
    )
    .await;
    for n in ["fine", "gone", "stopped", "denied"] {
        h.server.controls().seed(not_ready_node(n)).unwrap();
    }
    let mut ready = not_ready_node("ready");
    ready["status"]["conditions"][0]["status"] = json!("True");
    h.server.controls().seed(ready).unwrap();
    let ctx = synced(&h, ControllerConfig::default()).await;
    eventually("nodes cached", WAIT, || {
        (ctx.nodes.list().len() == 5).then_some(())
    })
    .await;
    let recorder = ctx.recorder(node_lifecycle::COMPONENT);
    monitor_nodes(&ctx.for_controller(node_lifecycle::NAME), &recorder).await;

    let calls = h.calls();
    assert_eq!(calls.len(), 1, "{calls:#?}");
    let asked: BTreeSet<String> = batch_nodes(&calls[0]).into_iter().collect();
    assert_eq!(
        asked,
        ["denied", "fine", "gone", "stopped"]
            .map(String::from)
            .into(),
        "the Ready node is not asked about"
    );
    assert_eq!(
        calls[0].args["query"],
        json!(["InstanceExists", "InstanceShutdown"])
    );
    let controls = h.server.controls();
    assert!(
        controls.get("nodes", "", "gone").is_none(),
        "does not exist: deleted"
    );
    assert!(
        controls.get("nodes", "", "denied").is_some(),
        "an error never deletes"
    );
    assert!(controls.get("nodes", "", "fine").is_some());
    let taints = |n: &str| controls.get("nodes", "", n).unwrap()["spec"]["taints"].clone();
    assert_eq!(taints("stopped")[0]["key"], SHUTDOWN);
    assert!(taints("fine").is_null() || taints("fine") == json!([]));
    let evidence = eventually("evidence event", WAIT, || {
        events_with_reason(&h, INSTANCE_DOES_NOT_EXIST).pop()
    })
    .await;
    assert_eq!(
        evidence["message"],
        "Instance fake://gone does not exist in the cloud (InstancesBatch returned exists: false); deleting node gone"
    );
}

/// Safe deletion through batches: a per-node error of every kind, and a batch-level error of
/// every kind, keep the Node (a batch-level "instance not found" even with
/// `--node-deletion-on-instance-not-found`); the same cloud without the error deletes it on the
/// next pass, so the error is what kept it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_error_in_or_of_a_batch_ever_deletes() {
    let kinds = [
        json!({"kind": "unauthorized", "message": "401 Unauthorized: AuthFailure"}),
        json!({"kind": "throttled", "retryAfter": "20ms", "message": "RequestLimitExceeded"}),
        json!({"kind": "cancelled"}),
        json!({"kind": "other"}),
        json!({"kind": "not_found"}),
        json!({"kind": "instance_not_found"}),
        json!({"kind": "not_implemented"}),
        json!({"kind": "retry_after", "retryAfter": "1s"}),
    ];
    for kind in &kinds {
        for batch_level in [false, true] {
            let what = format!("{kind} (batch-level: {batch_level})");
            let gone = json!({"autoInstances": false,
                              "instances": [{"name": "gone", "exists": false}]});
            let mut cloud = gone.clone();
            if batch_level {
                cloud["errors"] = json!({"InstancesBatch": kind});
            } else {
                cloud["instances"][0]["errors"] = json!({"InstancesBatch": kind});
            }
            let h =
                Harness::start_with("fake", bulk(cloud), batching(500, Duration::from_millis(5)))
                    .await;
            h.server.controls().seed(not_ready_node("gone")).unwrap();
            let config = ControllerConfig {
                node_monitor_period: Duration::ZERO,
                node_deletion: NodeDeletionPolicy {
                    // A per-node InstanceNotFound counts with the opt-in (as InstanceExists'
                    // does); so that case is left to the test below.
                    on_instance_not_found: batch_level,
                    ..Default::default()
                },
                ..Default::default()
            };
            let ctx = synced(&h, config).await;
            eventually("node cached", WAIT, || {
                (ctx.nodes.list().len() == 1).then_some(())
            })
            .await;
            let recorder = ctx.recorder(node_lifecycle::COMPONENT);
            for _ in 0..2 {
                monitor_nodes(&ctx, &recorder).await;
                // A throttled answer pauses the provider: the next pass waits for it.
                assert!(
                    h.server.controls().get("nodes", "", "gone").is_some(),
                    "{what}: kept"
                );
            }
            assert!(
                !batches(&h).is_empty(),
                "{what}: the cloud was asked in batches"
            );
            h.set_control(&bulk(gone));
            monitor_nodes(&ctx, &recorder).await;
            assert!(
                h.server.controls().get("nodes", "", "gone").is_none(),
                "{what}: without the error the node is deleted"
            );
        }
    }
}

/// `--node-deletion-on-instance-not-found` counts a node's own `InstanceNotFound` in a batch
/// answer as "does not exist", as it does for `InstanceExists`; without it the node is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_own_instance_not_found_counts_only_with_the_opt_in() {
    for opt_in in [false, true] {
        let h = Harness::start_with(
            "fake",
            bulk(
                json!({"autoInstances": false, "instances": [{"name": "lost", "errors":
                {"InstancesBatch": {"kind": "instance_not_found"}}}]}),
            ),
            batching(500, Duration::from_millis(5)),
        )
        .await;
        h.server.controls().seed(not_ready_node("lost")).unwrap();
        let config = ControllerConfig {
            node_monitor_period: Duration::ZERO,
            node_deletion: NodeDeletionPolicy {
                on_instance_not_found: opt_in,
                ..Default::default()
            },
            ..Default::default()
        };
        let ctx = synced(&h, config).await;
        eventually("node cached", WAIT, || {
            (ctx.nodes.list().len() == 1).then_some(())
        })
        .await;
        monitor_nodes(&ctx, &ctx.recorder(node_lifecycle::COMPONENT)).await;
        assert_eq!(
            h.server.controls().get("nodes", "", "lost").is_none(),
            opt_in,
            "opt-in {opt_in}"
        );
    }
}
