//! Benchmark 1 of issue 10: node initialisation. N tainted nodes (default 5,000) appear at once
//! in the in-memory API server; the cloud-node controller initialises them through the fake
//! provider's `.so` with an injected latency per provider call. Reported per (latency,
//! concurrency): time until every node is initialised (taint gone, provider ID, labels and the
//! cloud's InternalIP in place), API writes per node, provider calls per node.
//!
//! Ignored by default; prints figures and asserts only correctness (every node initialised,
//! nothing written twice needlessly is *reported*, not asserted). Run with:
//! `cargo test --release -p ccm-integration-tests --test bench_node_init -- --ignored --nocapture`
//! (`bench/run.sh` runs it several times and writes the medians to `BENCHMARKS.md`).
//!
//! Environment (all optional):
//! - `BENCH_NODES` (5000): nodes created at once;
//! - `BENCH_LATENCIES_MS` ("0,50"): fake provider latency per call, every method;
//! - `BENCH_CONCURRENCY` ("1,default"): `--concurrent-node-syncs` values; `default` is
//!   `ControllerConfig::default()` (the `ccm-host run` default);
//! - `BENCH_CLOUD_QPS` ("0"): `--cloud-api-qps` values (0 = no budget, the default), burst 10
//!   (the flag default);
//! - `BENCH_KUBE_QPS` ("unlimited"): the node controller's client-side API limit
//!   (`--kube-api-qps`, burst 30 as the flag default; `default` = 20, the `ccm-host run`
//!   default). At a limit the time is bound by it: every initialised node costs about three
//!   requests (two node writes and one event), so 20 qps initialise ~7 nodes a second whatever
//!   the concurrency. `unlimited` measures the controller's own speed.
//!
//! One line per case starts with `BENCH node_init` and holds `key=value` pairs.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_host::controllers::{node, ControllerConfig};
use ccm_host::provider::ProviderOptions;
use ccm_host::runtime::kube_clients::KubeClients;
use ccm_host::runtime::CachedNode;
use ccm_integration_tests::harness::Harness;
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::Node;
use kube_apiserver_inmem::RequestRecord;
use serde_json::{json, Value};

const TAINT: &str = ccm_host::runtime::well_known::UNINITIALIZED_TAINT;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn parse_list<T>(name: &str, default: &str, map: impl Fn(&str) -> Option<T>) -> Vec<T> {
    let raw = env_or(name, default);
    raw.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| map(s).unwrap_or_else(|| panic!("{name}: cannot parse {s:?} (in {raw:?})")))
        .collect()
}

/// A node as kubelet registers it with an external cloud provider: tainted, no provider ID,
/// only the kubelet's Hostname address.
fn kubelet_node(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [{"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    })
}

fn initialised(n: &CachedNode) -> bool {
    n.taints().iter().all(|t| t.key != TAINT)
        && n.provider_id().is_some_and(|id| !id.is_empty())
        && n.addresses()
            .is_some_and(|a| a.iter().any(|a| a.type_ == "InternalIP"))
}

fn is_write(r: &RequestRecord) -> bool {
    matches!(r.verb.as_str(), "create" | "update" | "patch" | "delete")
}

struct Case {
    nodes: usize,
    latency_ms: u64,
    concurrency: usize,
    cloud_qps: f64,
    /// The node controller's client-side API limit (None: unlimited).
    kube_qps: Option<f64>,
}

/// The `--kube-api-burst` default.
const KUBE_API_BURST: u32 = 30;

async fn run_case(case: &Case) {
    let mut fake: FakeConfig =
        serde_json::from_value(json!({"cloudStateFile": false})).expect("fake config");
    if case.latency_ms > 0 {
        fake = serde_json::from_value(json!({
            "cloudStateFile": false,
            "latency": {"*": format!("{}ms", case.latency_ms)},
        }))
        .expect("fake config");
    }
    let options = ProviderOptions {
        cloud_api_qps: case.cloud_qps,
        cloud_api_burst: 10,
        ..ProviderOptions::default()
    };
    let h = Harness::start_with("fake", fake, options).await;
    let config = ControllerConfig {
        concurrent_node_syncs: case.concurrency,
        // The periodic address loop runs its first pass at start (no nodes yet); keep its
        // second pass out of the measurement window of the slow baseline.
        node_status_update_frequency: Duration::from_secs(3600),
        ..ControllerConfig::default()
    };
    let mut ctx = h.context(config).for_controller(node::NAME);
    if let Some(qps) = case.kube_qps {
        // The node controller's own client with its own limit, as `ccm-host run` builds it.
        let kube_config = kube::Config::from_custom_kubeconfig(
            h.server.kubeconfig(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("kubeconfig of the in-memory API server");
        let clients = KubeClients::new(kube_config, qps, KUBE_API_BURST).expect("clients");
        ctx = ctx.with_client(clients.client("node-controller").expect("client"));
    }
    assert!(ctx.nodes.wait_synced().await, "node informer syncs");
    let controller = tokio::spawn(node::run(ctx.clone()));
    // Let the controller subscribe and run its (empty) first address pass.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let controls = h.server.controls();
    controls.clear_requests();
    h.clear_calls();

    let started = Instant::now();
    for i in 0..case.nodes {
        controls
            .seed(kubelet_node(&format!("node-{i:05}")))
            .expect("seed node");
    }
    let seeded = started.elapsed();
    // A bounded wait for the outcome (not a timing assertion): generous for the slowest case.
    let limit = Duration::from_secs(120)
        + case.kube_qps.map_or(Duration::ZERO, |q| {
            Duration::from_secs_f64(case.nodes as f64 * 4.0 / q)
        })
        + Duration::from_millis(case.latency_ms * case.nodes as u64 * 4 / case.concurrency as u64)
        + Duration::from_millis(case.nodes as u64 * 20 / case.concurrency.min(8) as u64);
    let elapsed = loop {
        let done = ctx.nodes.list().iter().filter(|n| initialised(n)).count();
        if done == case.nodes {
            break started.elapsed();
        }
        if started.elapsed() > limit {
            panic!(
                "only {done} of {} nodes initialised after {limit:?} (latency {} ms, concurrency {})",
                case.nodes, case.latency_ms, case.concurrency
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };

    // Let the event writer catch up (events are asynchronous and not part of the time). Events
    // that did not fit the recorder's bounded queue were dropped (as client-go does), so wait
    // for the count to stop growing rather than for one event per node.
    let drain = Instant::now();
    let mut events = controls.list("events").len();
    while events < case.nodes && drain.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = controls.list("events").len();
        if now == events {
            break;
        }
        events = now;
    }

    // Correctness, from the API server's own state.
    let stored = controls.list("nodes");
    assert_eq!(stored.len(), case.nodes);
    for n in &stored {
        let node: Node = serde_json::from_value(n.clone()).expect("node decodes");
        assert!(initialised(&node.clone().into()), "not initialised: {n}");
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels
                .get("node.kubernetes.io/instance-type")
                .map(String::as_str),
            Some("fake.medium"),
            "instance-type label on {:?}",
            node.metadata.name
        );
    }

    let requests = controls.requests();
    let node_writes: Vec<_> = requests
        .iter()
        .filter(|r| r.resource == "nodes" && is_write(r))
        .collect();
    let ok_node_writes = node_writes.iter().filter(|r| r.code < 300).count();
    let conflicts = node_writes.iter().filter(|r| r.code == 409).count();
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for r in node_writes.iter().filter(|r| r.code < 300) {
        *per_node.entry(r.name.as_str()).or_default() += 1;
    }
    let max_writes_one_node = per_node.values().copied().max().unwrap_or(0);
    let event_writes = requests
        .iter()
        .filter(|r| r.resource == "events" && is_write(r) && r.code < 300)
        .count();
    let node_reads = requests
        .iter()
        .filter(|r| r.resource == "nodes" && r.verb == "get")
        .count();
    let calls = h.calls();
    let mut by_call: BTreeMap<String, usize> = BTreeMap::new();
    for c in &calls {
        *by_call.entry(c.call.clone()).or_default() += 1;
    }
    let n = case.nodes as f64;
    println!(
        "BENCH node_init nodes={} latency_ms={} concurrency={} cloud_qps={} kube_qps={} seconds={:.3} \
         nodes_per_s={:.0} node_writes_per_node={:.2} max_node_writes_one_node={} \
         event_writes_per_node={:.2} node_gets_per_node={:.2} conflicts={} \
         provider_calls_per_node={:.2} seed_seconds={:.3}",
        case.nodes,
        case.latency_ms,
        case.concurrency,
        case.cloud_qps,
        case.kube_qps
            .map_or_else(|| "unlimited".to_string(), |q| q.to_string()),
        elapsed.as_secs_f64(),
        n / elapsed.as_secs_f64(),
        ok_node_writes as f64 / n,
        max_writes_one_node,
        event_writes as f64 / n,
        node_reads as f64 / n,
        conflicts,
        calls.len() as f64 / n,
        seeded.as_secs_f64(),
    );
    println!("  provider calls by name: {by_call:?}");

    h.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture (see bench/run.sh)"]
async fn bench_node_init() {
    let nodes: usize = env_or("BENCH_NODES", "5000")
        .parse()
        .expect("BENCH_NODES is a number");
    assert!(nodes > 0, "BENCH_NODES must be > 0");
    let default_concurrency = ControllerConfig::default().concurrent_node_syncs;
    let latencies = parse_list("BENCH_LATENCIES_MS", "0,50", |s| s.parse::<u64>().ok());
    let mut concurrencies = parse_list("BENCH_CONCURRENCY", "1,default", |s| match s {
        "default" => Some(default_concurrency),
        n => n.parse::<usize>().ok().filter(|&n| n > 0),
    });
    concurrencies.dedup();
    let budgets = parse_list("BENCH_CLOUD_QPS", "0", |s| {
        s.parse::<f64>().ok().filter(|q| q.is_finite() && *q >= 0.0)
    });
    let kube_limits = parse_list("BENCH_KUBE_QPS", "unlimited", |s| match s {
        "unlimited" => Some(None),
        "default" => Some(Some(20.0)),
        q => q
            .parse::<f64>()
            .ok()
            .filter(|q| q.is_finite() && *q > 0.0)
            .map(Some),
    });
    println!(
        "node initialisation: {nodes} nodes; default --concurrent-node-syncs = {default_concurrency}"
    );
    for &latency_ms in &latencies {
        for &concurrency in &concurrencies {
            for &cloud_qps in &budgets {
                for &kube_qps in &kube_limits {
                    run_case(&Case {
                        nodes,
                        latency_ms,
                        concurrency,
                        cloud_qps,
                        kube_qps,
                    })
                    .await;
                }
            }
        }
    }
}
