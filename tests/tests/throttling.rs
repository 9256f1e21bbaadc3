//! Throttling (ABI 1.1 `THROTTLED`) through the real controllers and the fake provider's `.so`:
//! a throttled call pauses every call to the provider (every controller, every method), the
//! object is retried after the pause without its work-queue failure count growing, a
//! `CloudProviderThrottled` Warning event lands on the Node or Service, and the
//! `ccm_provider_throttle*` metrics count it (host/src/provider/throttle.rs).
//!
//! "No call during the pause" is checked from the fake's call log: every call that reached the
//! plugin after the throttled one arrived at least the pause later. Nothing else is in flight
//! when the throttled call is made, so this holds exactly; a slow machine only makes the gaps
//! longer.

use std::time::Duration;

use ccm_host::controllers::service::{self, ServiceController};
use ccm_host::controllers::{node, node_lifecycle, ControllerConfig, ControllerContext};
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use ccm_provider_fake::control::CallRecord;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};

const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const WAIT: Duration = Duration::from_secs(30);
const METADATA_CALL: &str = "instance-metadata-by-provider-id";

fn fake(config: Value) -> FakeConfig {
    serde_json::from_value(config).expect("fake config")
}

fn cfg() -> ControllerConfig {
    ControllerConfig {
        // The address loop's first pass runs at start (no untainted node then); no later pass.
        node_status_update_frequency: Duration::from_secs(3600),
        node_monitor_period: Duration::from_millis(100),
        concurrent_node_syncs: 4,
        ..Default::default()
    }
}

/// A node as kubelet registers it with an external cloud provider.
fn tainted_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]},
    })
}

fn lb_service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
    })
}

async fn synced(h: &Harness) -> ControllerContext {
    let ctx = h.context(cfg());
    assert!(ctx.nodes.wait_synced().await && ctx.services.wait_synced().await);
    ctx
}

fn start_node_controller(ctx: &ControllerContext) {
    tokio::spawn(node::run(ctx.for_controller(node::NAME)));
}

fn start_service_controller(ctx: &ControllerContext) {
    let ctrl = ServiceController::new(ctx.for_controller(service::NAME)).expect("fake has LBs");
    tokio::spawn(ctrl.run());
}

/// The provider call metrics, rendered.
fn provider_metrics(h: &Harness) -> String {
    let mut registry = Registry::default();
    h.provider.metrics().register(&mut registry);
    ccm_host::runtime::metrics::render(&registry)
}

/// The controllers' metrics (work queues), rendered.
fn controller_metrics(h: &Harness) -> String {
    ccm_host::runtime::metrics::render(&h.registry)
}

async fn wait_throttled(h: &Harness, method: &str, count: u32) {
    let series = format!("ccm_provider_throttled_total{{method=\"{method}\"}} {count}\n");
    eventually(&format!("{method} throttled {count}x"), WAIT, || {
        provider_metrics(h).contains(&series).then_some(())
    })
    .await;
}

fn initialised(h: &Harness, name: &str) -> bool {
    h.server.controls().get("nodes", "", name).is_some_and(|n| {
        !n["spec"]["taints"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["key"] == TAINT))
    })
}

async fn wait_initialised(h: &Harness, names: &[&str]) {
    eventually("nodes initialised", WAIT, || {
        names.iter().all(|n| initialised(h, n)).then_some(())
    })
    .await;
}

async fn wait_ingress(h: &Harness, name: &str) {
    eventually("load-balancer ingress", WAIT, || {
        h.server
            .controls()
            .get("services", "default", name)
            .filter(|s| {
                s["status"]["loadBalancer"]["ingress"]
                    .as_array()
                    .is_some_and(|i| !i.is_empty())
            })
            .map(|_| ())
    })
    .await;
}

fn events_of(h: &Harness, name: &str) -> Vec<Value> {
    h.server
        .controls()
        .list("events")
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == name)
        .collect()
}

fn throttled_events(h: &Harness, name: &str) -> Vec<Value> {
    events_of(h, name)
        .into_iter()
        .filter(|e| e["reason"] == "CloudProviderThrottled")
        .collect()
}

/// The first recorded call named `call` (the fake records a call before it fails it).
fn first(calls: &[CallRecord], call: &str) -> CallRecord {
    calls
        .iter()
        .find(|c| c.call == call)
        .unwrap_or_else(|| panic!("no {call} call in {calls:#?}"))
        .clone()
}

/// Every call recorded after `throttled` arrived at least `pause` after it; returns their names.
fn assert_nothing_during_pause(calls: &[CallRecord], throttled: &CallRecord, pause: Duration) {
    let pause_ms = u64::try_from(pause.as_millis()).unwrap();
    let during: Vec<&CallRecord> = calls
        .iter()
        .filter(|c| c.seq > throttled.seq && c.at_ms < throttled.at_ms + pause_ms)
        .collect();
    assert!(
        during.is_empty(),
        "calls reached the plugin during the {pause:?} pause that began after call {} ({}): {during:#?}",
        throttled.seq,
        throttled.call
    );
}

fn names_after(calls: &[CallRecord], seq: u64) -> Vec<&str> {
    calls
        .iter()
        .filter(|c| c.seq > seq)
        .map(|c| c.call.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_throttled_instance_metadata_pauses_every_caller_and_the_node_initialises_without_a_failure(
) {
    let h = Harness::start(
        "fake",
        fake(json!({"errors": {"InstanceMetadata": {
            "kind": "throttled", "retryAfter": "2s", "message": "Rate exceeded", "times": 1,
        }}})),
    )
    .await;
    let ctx = synced(&h).await;
    start_node_controller(&ctx);
    start_service_controller(&ctx);
    h.server.controls().seed(tainted_node("n1")).unwrap();
    wait_throttled(&h, "InstanceMetadata", 1).await;

    // While every call is paused: another node for the node controller, and a LoadBalancer
    // service for the service controller.
    h.server.controls().seed(tainted_node("n2")).unwrap();
    h.server.controls().seed(lb_service("web")).unwrap();
    wait_initialised(&h, &["n1", "n2"]).await;
    wait_ingress(&h, "web").await;

    let calls = h.calls();
    let throttled = first(&calls, METADATA_CALL);
    assert_eq!(throttled.args["node"], "n1", "{throttled:?}");
    assert_nothing_during_pause(&calls, &throttled, Duration::from_secs(2));
    let after = names_after(&calls, throttled.seq);
    assert_eq!(
        after.iter().filter(|c| **c == METADATA_CALL).count(),
        2,
        "n1 retried and n2 initialised after the pause: {after:?}"
    );
    assert!(after.contains(&"create"), "EnsureLoadBalancer: {after:?}");

    // The node was retried without counting a failure.
    let queues = controller_metrics(&h);
    assert!(
        queues.contains("workqueue_retries_total{name=\"Nodes\"} 0\n"),
        "{queues}"
    );
    assert!(
        queues.contains("workqueue_retries_total{name=\"service\"} 0\n"),
        "{queues}"
    );

    let events = throttled_events(&h, "n1");
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["kind"], "Node");
    assert_eq!(e["source"]["component"], "cloud-node-controller");
    assert_eq!(
        e["message"],
        "cloud provider throttled InstanceMetadata: Rate exceeded; every call to the cloud \
         provider is paused for 2s, then retried"
    );
    eventually("n1 Synced event", WAIT, || {
        events_of(&h, "n1")
            .iter()
            .any(|e| e["reason"] == "Synced")
            .then_some(())
    })
    .await;
    assert!(throttled_events(&h, "n2").is_empty(), "n2 only waited");

    let text = provider_metrics(&h);
    for series in [
        "ccm_provider_throttled_total{method=\"InstanceMetadata\"} 1\n",
        "ccm_provider_throttle_pause_seconds_total 2.0\n",
        "ccm_provider_call_errors_total{method=\"InstanceMetadata\",kind=\"throttled\"} 1\n",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
    assert!(
        !text.contains("ccm_provider_throttled_total{method=\"EnsureLoadBalancer\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_delay_the_pause_backs_off_exponentially_and_a_success_resets_it() {
    let h = Harness::start(
        "fake",
        fake(json!({"errors": {"InstanceMetadata": {"kind": "throttled", "times": 2}}})),
    )
    .await;
    let ctx = synced(&h).await;
    start_node_controller(&ctx);
    h.server.controls().seed(tainted_node("n1")).unwrap();
    wait_initialised(&h, &["n1"]).await;

    let calls: Vec<CallRecord> = h
        .calls()
        .into_iter()
        .filter(|c| c.call == METADATA_CALL)
        .collect();
    assert_eq!(calls.len(), 3, "two throttled, then the answer: {calls:#?}");
    // 1 s after the first, 2 s after the second.
    assert_nothing_during_pause(&h.calls(), &calls[0], Duration::from_secs(1));
    assert_nothing_during_pause(&h.calls(), &calls[1], Duration::from_secs(2));
    let text = provider_metrics(&h);
    assert!(
        text.contains("ccm_provider_throttle_pause_seconds_total 3.0\n"),
        "{text}"
    );
    let mut messages: Vec<String> = throttled_events(&h, "n1")
        .iter()
        .map(|e| e["message"].as_str().unwrap().to_string())
        .collect();
    messages.sort();
    assert_eq!(
        messages,
        [
            "cloud provider throttled InstanceMetadata: injected throttling in InstanceMetadata; \
             every call to the cloud provider is paused for 1s, then retried",
            "cloud provider throttled InstanceMetadata: injected throttling in InstanceMetadata; \
             every call to the cloud provider is paused for 2s, then retried",
        ]
    );

    // The successful call reset the back-off: the next throttling pauses 1 s again, not 4 s.
    h.set_control(&fake(json!({"errors": {"InstanceMetadata": {
        "kind": "throttled", "times": 1,
    }}})));
    h.server.controls().seed(tainted_node("n2")).unwrap();
    wait_initialised(&h, &["n2"]).await;
    let text = provider_metrics(&h);
    assert!(
        text.contains("ccm_provider_throttle_pause_seconds_total 4.0\n"),
        "{text}"
    );
    assert!(
        text.contains("ccm_provider_throttled_total{method=\"InstanceMetadata\"} 3\n"),
        "{text}"
    );
    let queues = controller_metrics(&h);
    assert!(
        queues.contains("workqueue_retries_total{name=\"Nodes\"} 0\n"),
        "{queues}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_throttled_ensure_load_balancer_pauses_every_caller_and_the_service_gets_its_load_balancer(
) {
    let h = Harness::start(
        "fake",
        fake(json!({"errors": {"EnsureLoadBalancer": {
            "kind": "throttled", "retryAfter": "2s", "message": "429 Too Many Requests", "times": 1,
        }}})),
    )
    .await;
    let ctx = synced(&h).await;
    start_node_controller(&ctx);
    start_service_controller(&ctx);
    h.server.controls().seed(lb_service("web")).unwrap();
    wait_throttled(&h, "EnsureLoadBalancer", 1).await;

    // A node registering during the pause is initialised only after it.
    h.server.controls().seed(tainted_node("n1")).unwrap();
    wait_ingress(&h, "web").await;
    wait_initialised(&h, &["n1"]).await;

    let calls = h.calls();
    let throttled = first(&calls, "create");
    assert_nothing_during_pause(&calls, &throttled, Duration::from_secs(2));
    let after = names_after(&calls, throttled.seq);
    assert!(
        after.contains(&"create"),
        "EnsureLoadBalancer retried: {after:?}"
    );
    assert!(after.contains(&METADATA_CALL), "n1 initialised: {after:?}");

    let queues = controller_metrics(&h);
    assert!(
        queues.contains("workqueue_retries_total{name=\"service\"} 0\n"),
        "{queues}"
    );
    // The recorder writes events after the status it reports: wait for the last one.
    eventually("the EnsuredLoadBalancer event", WAIT, || {
        events_of(&h, "web")
            .iter()
            .any(|e| e["reason"] == "EnsuredLoadBalancer")
            .then_some(())
    })
    .await;
    let events = throttled_events(&h, "web");
    assert_eq!(events.len(), 1, "{events:#?}");
    let e = &events[0];
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["kind"], "Service");
    assert_eq!(e["source"]["component"], "service-controller");
    assert_eq!(
        e["message"],
        "cloud provider throttled EnsureLoadBalancer: 429 Too Many Requests; every call to the \
         cloud provider is paused for 2s, then retried"
    );
    let reasons: Vec<Value> = events_of(&h, "web")
        .iter()
        .map(|e| e["reason"].clone())
        .collect();
    assert!(
        !reasons.contains(&json!("SyncLoadBalancerFailed")),
        "throttling is not a sync failure: {reasons:?}"
    );
    assert!(
        reasons.contains(&json!("EnsuredLoadBalancer")),
        "{reasons:?}"
    );

    let text = provider_metrics(&h);
    for series in [
        "ccm_provider_throttled_total{method=\"EnsureLoadBalancer\"} 1\n",
        "ccm_provider_throttle_pause_seconds_total 2.0\n",
    ] {
        assert!(text.contains(series), "{series} missing from:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_throttled_instance_exists_keeps_the_node_and_the_next_pass_waits() {
    let h = Harness::start(
        "fake",
        fake(json!({"errors": {"InstanceExists": {
            "kind": "throttled", "retryAfter": "1s", "times": 1,
        }}})),
    )
    .await;
    // Not Ready, already initialised: the lifecycle controller asks whether it still exists.
    h.server
        .controls()
        .seed(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1"},
            "spec": {"providerID": "fake://n1"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }))
        .unwrap();
    let ctx = synced(&h).await;
    tokio::spawn(node_lifecycle::run(
        ctx.for_controller(node_lifecycle::NAME),
    ));
    wait_throttled(&h, "InstanceExists", 1).await;
    eventually("a later pass answered", WAIT, || {
        (h.calls()
            .iter()
            .filter(|c| c.call == "instance-exists")
            .count()
            >= 2)
            .then_some(())
    })
    .await;

    let calls = h.calls();
    let throttled = first(&calls, "instance-exists");
    // The passes every 100 ms all waited for the pause.
    assert_nothing_during_pause(&calls, &throttled, Duration::from_secs(1));
    assert!(h.server.controls().get("nodes", "", "n1").is_some());
    let events = throttled_events(&h, "n1");
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        events[0]["source"]["component"],
        "cloud-node-lifecycle-controller"
    );
    assert_eq!(
        events[0]["message"],
        "cloud provider throttled InstanceExists: injected throttling in InstanceExists; every \
         call to the cloud provider is paused for 1s, then retried"
    );
}

fn bare_node(name: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({"metadata": {"name": name}})).unwrap()
}

/// The largest number of recorded calls named `call` inside any window of `window_ms`.
fn max_in_window(calls: &[CallRecord], call: &str, window_ms: u64) -> usize {
    let mut times: Vec<u64> = calls
        .iter()
        .filter(|c| c.call == call)
        .map(|c| c.at_ms)
        .collect();
    times.sort_unstable();
    let (mut best, mut start) = (0, 0);
    for end in 0..times.len() {
        while times[end] - times[start] >= window_ms {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_waiting_for_the_pause_keep_their_deadline_and_cancellation_then_take_the_budget() {
    // A 300 ms call deadline, a 2 s pause, then 5 calls/s (burst 1).
    let options = ccm_host::provider::ProviderOptions {
        call_timeout: Duration::from_millis(300),
        cloud_api_qps: 5.0,
        cloud_api_burst: 1,
        ..ccm_host::provider::ProviderOptions::default()
    };
    let h = Harness::start_with(
        "fake",
        fake(json!({"errors": {"InstanceExists": {
            "kind": "throttled", "retryAfter": "2s", "message": "Rate exceeded", "times": 1,
        }}})),
        options,
    )
    .await;
    let p = h.provider.for_caller("a");
    let e = p.instance_exists(&bare_node("n0")).await.unwrap_err();
    assert_eq!(e.kind(), ccm_provider_abi::ErrorKind::THROTTLED);
    assert_eq!(
        e.to_string(),
        "cloud provider throttled InstanceExists: Rate exceeded"
    );
    assert_eq!(e.throttle_delay(), Some(Some(Duration::from_secs(2))));
    assert!(p.throttled_until().is_some());

    // A caller that gives up while waiting never reaches the plugin.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        p.instance_shutdown(&bare_node("given-up")),
    )
    .await;
    assert!(gave_up.is_err(), "still paused after 50 ms: {gave_up:?}");

    // Waiting longer than the call deadline is not a timeout: the deadline starts at the plugin.
    let (a, b) = (h.provider.for_caller("a"), h.provider.for_caller("b"));
    let results = futures::future::join_all((0..12).map(|i| {
        let p = if i % 2 == 0 { a.clone() } else { b.clone() };
        async move { p.instance_exists(&bare_node(&format!("n{i}"))).await }
    }))
    .await;
    for r in &results {
        assert_eq!(r.as_ref().ok(), Some(&true), "{results:?}");
    }

    let calls = h.calls();
    assert!(
        !calls.iter().any(|c| c.call == "instance-shutdown"),
        "the abandoned call reached the plugin: {calls:#?}"
    );
    let throttled = first(&calls, "instance-exists");
    assert_nothing_during_pause(&calls, &throttled, Duration::from_secs(2));
    // After the pause the waiting calls took their turn: at most burst + qps (+1 for a window
    // edge) in any second.
    let peak = max_in_window(&calls, "instance-exists", 1000);
    assert!(peak <= 7, "{peak} calls in one second after the pause");
    let text = provider_metrics(&h);
    assert!(
        !text.contains("ccm_provider_call_timeouts_total{"),
        "no call timed out: {text}"
    );
}
