//! The provider call layer with the real fake `.so`: the host-wide cloud-call budget (rate and
//! fairness between controllers), coalescing of identical concurrent reads, and the call metrics.
//!
//! Budget assertions are upper bounds on what reached the plugin (a slow machine only lowers
//! them) and orderings, never durations.

use std::time::Duration;

use ccm_host::provider::ProviderOptions;
use ccm_integration_tests::harness::Harness;
use ccm_provider_fake::config::FakeConfig;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Node;
use kube::api::ObjectMeta;
use prometheus_client::registry::Registry;

fn config(json: serde_json::Value) -> FakeConfig {
    serde_json::from_value(json).expect("valid fake config")
}

fn node(name: &str, resource_version: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(resource_version.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn budget(qps: f64, burst: u32) -> ProviderOptions {
    ProviderOptions {
        cloud_api_qps: qps,
        cloud_api_burst: burst,
        ..ProviderOptions::default()
    }
}

fn render(h: &Harness) -> String {
    let mut registry = Registry::default();
    h.provider.metrics().register(&mut registry);
    ccm_host::runtime::metrics::render(&registry)
}

/// The largest number of recorded calls named `call` inside any window of `window_ms`.
fn max_in_window(h: &Harness, call: &str, window_ms: u64) -> usize {
    let mut times: Vec<u64> = h
        .calls()
        .into_iter()
        .filter(|c| c.call == call)
        .map(|c| c.at_ms)
        .collect();
    times.sort_unstable();
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] >= window_ms {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cloud_call_budget_holds_under_load() {
    // 10 calls/s, burst 5; 40 calls from 8 concurrent callers.
    let h = Harness::start_with("fake", FakeConfig::default(), budget(10.0, 5)).await;
    let callers = [
        "cloud-node-controller",
        "service-lb-controller",
        "node-route-controller",
        "x",
    ];
    let calls = (0..40).map(|i| {
        let provider = h.provider.for_caller(callers[i % callers.len()]);
        async move {
            provider
                .instance_exists(&node(&format!("n{i}"), "1"))
                .await
                .expect("InstanceExists")
        }
    });
    let results = join_all(calls).await;
    assert!(results.iter().all(|exists| *exists));
    let recorded = h
        .calls()
        .iter()
        .filter(|c| c.call == "instance-exists")
        .count();
    assert_eq!(recorded, 40, "every call reached the plugin once");
    // In any one second at most burst + qps calls (+1 for a window edge) reached the cloud.
    let peak = max_in_window(&h, "instance-exists", 1000);
    println!("peak calls in any 1 s window: {peak} (budget 10/s, burst 5)");
    assert!(peak <= 16, "budget exceeded: {peak} calls in one second");
    // 40 calls at 10/s after a burst of 5 cannot fit in much less than 3.5 s: the log spans it.
    let times: Vec<u64> = h.calls().iter().map(|c| c.at_ms).collect();
    let span = times.iter().max().unwrap() - times.iter().min().unwrap();
    assert!(span >= 3000, "40 calls spread over only {span} ms");
    let text = render(&h);
    assert!(
        text.contains(
            "ccm_provider_budget_wait_seconds_count{caller=\"cloud-node-controller\"} 10"
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_budget_is_fair_between_controllers() {
    let h = Harness::start_with("fake", FakeConfig::default(), budget(20.0, 1)).await;
    let flood = h.provider.for_caller("service-lb-controller");
    let small = h.provider.for_caller("cloud-node-controller");
    let flood_calls = tokio::spawn(async move {
        join_all((0..40).map(|i| {
            let p = flood.clone();
            async move {
                p.instance_exists_by_provider_id(&format!("fake://flood-{i}"))
                    .await
            }
        }))
        .await
    });
    // Let the flood queue up first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let small_calls = join_all((0..3).map(|i| {
        let p = small.clone();
        async move {
            p.instance_exists_by_provider_id(&format!("fake://small-{i}"))
                .await
        }
    }))
    .await;
    assert!(small_calls.iter().all(Result::is_ok));
    flood_calls.await.unwrap();
    let order: Vec<String> = h
        .calls()
        .into_iter()
        .filter(|c| c.call == "instance-exists-by-provider-id")
        .filter_map(|c| c.arg("providerID").map(str::to_string))
        .collect();
    assert_eq!(order.len(), 43);
    let last_small = order.iter().rposition(|id| id.contains("small")).unwrap();
    let small_at = order.iter().position(|id| id.contains("small")).unwrap();
    println!("small caller served at positions {small_at}..={last_small} of 43");
    // Round-robin: the three small calls are interleaved with the flood, not queued behind it.
    assert!(
        last_small < small_at + 8,
        "the small caller waited behind the flood: {order:?}"
    );
    assert!(last_small < 30, "small calls served only at {last_small}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_concurrent_reads_make_one_plugin_call() {
    let h = Harness::start(
        "fake",
        config(serde_json::json!({"latency": {"InstanceMetadata": "300ms"}})),
    )
    .await;
    let node_controller = h.provider.for_caller("cloud-node-controller");
    let address_loop = h.provider.for_caller("cloud-node-controller-addresses");
    // The same node seen at two resource versions (as two controllers' caches would).
    let (a, b, other) = (node("n1", "10"), node("n1", "11"), node("n2", "10"));
    let (ra, rb, rother) = tokio::join!(
        node_controller.instance_metadata(&a),
        address_loop.instance_metadata(&b),
        node_controller.instance_metadata(&other),
    );
    let (ra, rb) = (ra.unwrap().unwrap(), rb.unwrap().unwrap());
    assert_eq!(
        ra.provider_id, rb.provider_id,
        "both callers got the one answer"
    );
    assert_ne!(rother.unwrap().unwrap().provider_id, ra.provider_id);
    let by_node = |name: &str| {
        h.calls()
            .iter()
            .filter(|c| c.call == "instance-metadata-by-provider-id" && c.arg("node") == Some(name))
            .count()
    };
    assert_eq!(by_node("n1"), 1, "coalesced: {:?}", h.call_names());
    assert_eq!(by_node("n2"), 1);
    // Once finished, the next read calls the plugin again (no caching).
    node_controller.instance_metadata(&a).await.unwrap();
    assert_eq!(by_node("n1"), 2);
    let text = render(&h);
    assert!(
        text.contains("ccm_provider_calls_coalesced_total{method=\"InstanceMetadata\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_are_never_coalesced_and_a_dropped_waiter_does_not_cancel_the_shared_call() {
    let h = Harness::start(
        "fake",
        config(serde_json::json!({"latency": {"InstanceExists": "300ms", "CreateRoute": "100ms"}})),
    )
    .await;
    let n = node("n1", "1");
    // One waiter gives up early; the other still gets the answer of the same plugin call.
    let impatient = tokio::time::timeout(Duration::from_millis(50), h.provider.instance_exists(&n));
    let patient = h.provider.instance_exists(&n);
    let (gave_up, answer) = tokio::join!(impatient, patient);
    assert!(gave_up.is_err());
    assert!(answer.expect("the shared call was not cancelled"));
    assert_eq!(
        h.calls()
            .iter()
            .filter(|c| c.call == "instance-exists")
            .count(),
        1
    );
    assert!(!h.call_names().contains(&"cancel-observed".to_string()));

    let route = ccm_provider_abi::Route {
        name: String::new(),
        target_node: "n1".into(),
        destination_cidr: "10.244.1.0/24".into(),
        ..Default::default()
    };
    let (r1, r2) = tokio::join!(
        h.provider.create_route("kubernetes", "hint", &route),
        h.provider.create_route("kubernetes", "hint", &route),
    );
    let _ = (r1, r2);
    assert_eq!(
        h.calls()
            .iter()
            .filter(|c| c.call == "create-route")
            .count(),
        2,
        "two CreateRoute calls reach the plugin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn call_metrics_count_errors_timeouts_and_panics_by_method() {
    let h = Harness::start_with(
        "fake",
        config(serde_json::json!({
            "errors": {"InstanceShutdownByProviderID": {"kind": "other", "times": 2}},
            "panics": ["CurrentNodeName"],
            "hang": ["Master"],
        })),
        ProviderOptions {
            call_timeout: Duration::from_millis(300),
            ..ProviderOptions::default()
        },
    )
    .await;
    let p = h.provider.for_caller("node-lifecycle-controller");
    for _ in 0..3 {
        let _ = p.instance_shutdown_by_provider_id("fake://i-1").await;
    }
    let panicked = p.current_node_name("host-a").await.unwrap_err();
    assert_eq!(panicked.kind(), ccm_provider_abi::ErrorKind::PANICKED);
    let timed_out = p.master("kubernetes").await.unwrap_err();
    assert_eq!(
        timed_out.kind(),
        ccm_provider_abi::ErrorKind::DEADLINE_EXCEEDED
    );

    let text = render(&h);
    for expected in [
        "ccm_provider_calls_total{method=\"InstanceShutdownByProviderID\",caller=\"node-lifecycle-controller\"} 3",
        "ccm_provider_call_errors_total{method=\"InstanceShutdownByProviderID\",kind=\"other\"} 2",
        "ccm_provider_call_panics_total{method=\"CurrentNodeName\"} 1",
        "ccm_provider_call_errors_total{method=\"CurrentNodeName\",kind=\"panicked\"} 1",
        "ccm_provider_call_timeouts_total{method=\"Master\"} 1",
        "ccm_provider_call_duration_seconds_count{method=\"InstanceShutdownByProviderID\"} 3",
        "ccm_provider_calls_in_flight{method=\"Master\"} 0",
    ] {
        assert!(text.contains(expected), "missing {expected}:\n{text}");
    }
}
