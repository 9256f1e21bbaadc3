//! Benchmark of issue 18 items 2 and 3: cloud calls of the node controllers with bulk instance
//! lookups (ABI 1.1 `BULK_INSTANCES`) next to the per-node path, in one run, through the real
//! controllers, the in-memory API server and the fake provider's `.so` (`bulkInstances: true`
//! for the bulk path, `false` for the per-node one; everything else equal).
//!
//! 1. `bulk_init`: N tainted nodes (default 5,000) appear at once; the cloud-node controller
//!    initialises them with the fake at `BENCH_INIT_LATENCY_MS` (50) per call, every default
//!    (64 workers, `--instance-batch-window 100ms`, `--instance-batch-size 500`). Reported: time,
//!    cloud calls (the fake's call log), node writes; then one address-loop pass right after
//!    (its answers come from the instance cache).
//! 2. `steady_calls`: M initialised nodes (default 1,000), all Ready or `not_ready` of them
//!    NotReady; one simulated hour of the default periods (`--node-status-update-frequency`
//!    5m, `--node-monitor-period` 5s) with time scaled down `BENCH_TIME_SCALE` (300) times:
//!    the real passes (`NodeController::update_node_status`, `NodeMonitor::pass`) run on the
//!    default schedule, a lifecycle pass every 5s/scale and an address pass every twelfth of
//!    the hour (every 60th lifecycle tick, the first at the start), 720 + 12 passes, with the
//!    controllers' max-ages (and the batch window) scaled the same way. The calls are counted in the fake's call log
//!    over exactly those passes, i.e. calls per simulated hour, not extrapolated. Before the
//!    hour starts, one scaled address period passes after initialisation, so no answer of
//!    initialisation is young enough to help (steady state).
//!
//! Both phases end by comparing the nodes of the two paths (provider ID, labels, addresses,
//! taints, Ready condition): they must be identical (asserted). Time is reported, never
//! asserted.
//!
//! `cargo test --release -p ccm-integration-tests --test bench_instance_calls -- --ignored --nocapture`
//! (`bench/run.sh --only instance_calls`). Environment (all optional): `BENCH_INIT_NODES`
//! (5000), `BENCH_INIT_LATENCY_MS` (50), `BENCH_KUBE_QPS` ("unlimited"; `default` = 20, the
//! `ccm-host run` default, or a number: the node controller's client-side API limit, burst 30),
//! `BENCH_STEADY_NODES` (1000), `BENCH_STEADY_NOT_READY` ("0,10"), `BENCH_TIME_SCALE` (300),
//! `BENCH_PHASES` ("init,steady").
//!
//! One line per case starts with `BENCH bulk_init` or `BENCH steady_calls`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ccm_host::controllers::node::{self, NodeController};
use ccm_host::controllers::node_lifecycle::{self, NodeMonitor};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::provider::ProviderOptions;
use ccm_host::runtime::kube_clients::KubeClients;
use ccm_host::runtime::CachedNode;
use ccm_integration_tests::harness::Harness;
use ccm_provider_fake::config::FakeConfig;
use ccm_provider_fake::control::CallRecord;
use k8s_openapi::api::core::v1::Node;
use kube_apiserver_inmem::RequestRecord;
use serde_json::{json, Value};

const TAINT: &str = ccm_host::runtime::well_known::UNINITIALIZED_TAINT;
const KUBE_API_BURST: u32 = 30;
/// The default periods (`ControllerConfig::default()`, upstream's).
const ADDRESS_PERIOD: Duration = Duration::from_secs(300);
const MONITOR_PERIOD: Duration = Duration::from_secs(5);
const HOUR: Duration = Duration::from_secs(3600);

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn env_num<T: std::str::FromStr>(name: &str, default: &str) -> T {
    env_or(name, default)
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    PerNode,
    Bulk,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::PerNode => "per_node",
            Path::Bulk => "bulk",
        }
    }
}

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

/// What the controllers decide about a node, by name (compared between the paths).
fn outcomes(h: &Harness) -> BTreeMap<String, String> {
    h.server
        .controls()
        .list("nodes")
        .into_iter()
        .map(|n| {
            let ready = n["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .map(|c| c["status"].clone());
            let outcome = json!({
                "providerID": n["spec"]["providerID"],
                "labels": n["metadata"]["labels"],
                "addresses": n["status"]["addresses"],
                "taints": n["spec"]["taints"],
                "ready": ready,
            });
            (
                n["metadata"]["name"].as_str().unwrap().to_string(),
                outcome.to_string(),
            )
        })
        .collect()
}

fn by_call(calls: &[CallRecord]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for c in calls {
        *out.entry(c.call.clone()).or_default() += 1;
    }
    out
}

/// The cloud: one instance per node, with explicit addresses (a synthesised instance's address
/// could depend on the order of the lookups when two names hash alike, and the two paths look
/// up in different orders).
fn fake(path: Path, latency_ms: u64, nodes: usize) -> FakeConfig {
    let instances: Vec<Value> = names(nodes)
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let ip = format!("10.{}.{}.{}", 1 + i / 65536, (i / 256) % 256, i % 256);
            json!({"name": name, "addresses": [
                {"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}]})
        })
        .collect();
    let mut c = json!({"cloudStateFile": false, "bulkInstances": path == Path::Bulk,
                       "autoInstances": false, "instances": instances});
    if latency_ms > 0 {
        c["latency"] = json!({"*": format!("{latency_ms}ms")});
    }
    serde_json::from_value(c).expect("fake config")
}

async fn start(
    path: Path,
    latency_ms: u64,
    nodes: usize,
    config: ControllerConfig,
    options: ProviderOptions,
) -> (Harness, ControllerContext) {
    let h = Harness::start_with("fake", fake(path, latency_ms, nodes), options).await;
    assert_eq!(h.provider.bulk_instances(), path == Path::Bulk);
    let ctx = h.context(config);
    assert!(ctx.nodes.wait_synced().await, "node informer syncs");
    (h, ctx)
}

/// Seed `names` as kubelet-registered nodes and wait until the controller (already running)
/// initialised all of them; returns the time it took.
async fn seed_and_initialise(h: &Harness, ctx: &ControllerContext, names: &[String]) -> Duration {
    let controls = h.server.controls();
    let started = Instant::now();
    for n in names {
        controls.seed(kubelet_node(n)).expect("seed node");
    }
    // A bounded wait for the outcome, not a timing assertion.
    let limit = Duration::from_secs(600);
    loop {
        let done = ctx.nodes.list().iter().filter(|n| initialised(n)).count();
        if done == names.len() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "only {done} of {} nodes initialised after {limit:?}",
            names.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("node-{i:05}")).collect()
}

async fn bench_init(
    path: Path,
    nodes: usize,
    latency_ms: u64,
    kube_qps: Option<f64>,
) -> BTreeMap<String, String> {
    let (h, mut ctx) = start(
        path,
        latency_ms,
        nodes,
        ControllerConfig::default(),
        ProviderOptions::default(),
    )
    .await;
    if let Some(qps) = kube_qps {
        let kube_config = kube::Config::from_custom_kubeconfig(
            h.server.kubeconfig(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("kubeconfig of the in-memory API server");
        let clients = KubeClients::new(kube_config, qps, KUBE_API_BURST).expect("clients");
        ctx = ctx.with_client(clients.client("node-controller").expect("client"));
    }
    let ctx = ctx.for_controller(node::NAME);
    let controller = tokio::spawn(node::run(ctx.clone()));
    // Let the controller subscribe and run its (empty) first address pass.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let controls = h.server.controls();
    controls.clear_requests();
    h.clear_calls();

    let all = names(nodes);
    let elapsed = seed_and_initialise(&h, &ctx, &all).await;
    let calls = h.calls();
    let requests = controls.requests();
    let node_writes = requests
        .iter()
        .filter(|r| r.resource == "nodes" && is_write(r) && r.code < 300)
        .count();
    let batches: Vec<usize> = calls
        .iter()
        .filter(|c| c.call == "instances-batch")
        .map(|c| c.args["nodes"].as_array().map_or(0, Vec::len))
        .collect();

    // One address-loop pass right after: initialisation's answers are younger than its period.
    let before = h.calls().len();
    NodeController::new(ctx.clone()).update_node_status().await;
    let address_pass_calls = h.calls().len() - before;

    let n = nodes as f64;
    println!(
        "BENCH bulk_init path={} nodes={nodes} latency_ms={latency_ms} kube_qps={} seconds={:.3} \
         nodes_per_s={:.0} cloud_calls={} calls_per_node={:.4} batch_calls={} max_batch={} \
         node_writes_per_node={:.2} address_pass_calls={address_pass_calls}",
        path.name(),
        kube_qps.map_or_else(|| "unlimited".to_string(), |q| q.to_string()),
        elapsed.as_secs_f64(),
        n / elapsed.as_secs_f64(),
        calls.len(),
        calls.len() as f64 / n,
        batches.len(),
        batches.iter().max().copied().unwrap_or(0),
        node_writes as f64 / n,
    );
    println!("  provider calls by name: {:?}", by_call(&calls));
    let out = outcomes(&h);
    h.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    out
}

async fn bench_steady(
    path: Path,
    nodes: usize,
    not_ready: usize,
    scale: u32,
) -> BTreeMap<String, String> {
    let config = ControllerConfig {
        node_status_update_frequency: ADDRESS_PERIOD / scale,
        node_monitor_period: MONITOR_PERIOD / scale,
        ..ControllerConfig::default()
    };
    // The collection window scaled like the periods: it changes no count (a pass asks about
    // all its nodes at once), only the wall time of the lifecycle passes.
    let options = ProviderOptions {
        instance_batch_window: ProviderOptions::default().instance_batch_window / scale,
        ..ProviderOptions::default()
    };
    let (h, ctx) = start(path, 0, nodes, config.clone(), options).await;
    // Initialise the nodes through the controller, then stop it: the hour drives the passes.
    let init_ctx = ctx.for_controller(node::NAME);
    let stop = tokio_util::sync::CancellationToken::new();
    let init = {
        let mut c = init_ctx.clone();
        c.stop = stop.clone();
        tokio::spawn(node::run(c))
    };
    let all = names(nodes);
    seed_and_initialise(&h, &ctx, &all).await;
    stop.cancel();
    let _ = init.await;
    // NotReady nodes (their instances exist): the lifecycle checks ask about them every pass.
    let api: kube::Api<Node> = kube::Api::all(h.client.clone());
    for name in all.iter().take(not_ready) {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}});
        api.patch_status(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("NotReady");
    }
    let lifecycle_ctx = ctx.for_controller(node_lifecycle::NAME);
    loop {
        let cached_not_ready = lifecycle_ctx
            .nodes
            .list()
            .iter()
            .filter(|n| {
                n.conditions()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "False")
            })
            .count();
        if cached_not_ready == not_ready {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Steady state: every answer initialisation kept is older than the address loop's max-age.
    tokio::time::sleep(config.node_status_update_frequency).await;
    h.clear_calls();

    let controller = NodeController::new(init_ctx);
    let recorder = lifecycle_ctx.recorder(node_lifecycle::COMPONENT);
    let mut monitor = NodeMonitor::default();
    let ticks = (HOUR.as_secs() / MONITOR_PERIOD.as_secs()) as usize; // 720
    let every = (ADDRESS_PERIOD.as_secs() / MONITOR_PERIOD.as_secs()) as usize; // 60
    let (mut address_passes, mut address_calls, mut lifecycle_calls) = (0, 0, 0);
    let started = Instant::now();
    for tick in 0..ticks {
        if tick % every == 0 {
            let before = h.calls().len();
            controller.update_node_status().await;
            address_passes += 1;
            address_calls += h.calls().len() - before;
        }
        let before = h.calls().len();
        monitor.pass(&lifecycle_ctx, &recorder).await;
        lifecycle_calls += h.calls().len() - before;
        tokio::time::sleep(config.node_monitor_period).await;
    }
    let wall = started.elapsed();
    let calls = h.calls();
    assert_eq!(calls.len(), address_calls + lifecycle_calls);
    println!(
        "BENCH steady_calls path={} nodes={nodes} not_ready={not_ready} time_scale={scale} \
         address_passes={address_passes} lifecycle_passes={ticks} calls_per_hour={} \
         address_calls={address_calls} lifecycle_calls={lifecycle_calls} \
         calls_per_1000_nodes_per_hour={:.1} wall_seconds={:.1}",
        path.name(),
        calls.len(),
        calls.len() as f64 * 1000.0 / nodes as f64,
        wall.as_secs_f64(),
    );
    println!("  provider calls by name: {:?}", by_call(&calls));
    let out = outcomes(&h);
    h.stop.cancel();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture (see bench/run.sh)"]
async fn bench_instance_calls() {
    let init_nodes: usize = env_num("BENCH_INIT_NODES", "5000");
    let latency_ms: u64 = env_num("BENCH_INIT_LATENCY_MS", "50");
    let kube_qps = match env_or("BENCH_KUBE_QPS", "unlimited").as_str() {
        "unlimited" => None,
        "default" => Some(20.0),
        q => Some(q.parse::<f64>().expect("BENCH_KUBE_QPS")),
    };
    let steady_nodes: usize = env_num("BENCH_STEADY_NODES", "1000");
    let not_ready: Vec<usize> = env_or("BENCH_STEADY_NOT_READY", "0,10")
        .split(',')
        .map(|s| s.trim().parse().expect("BENCH_STEADY_NOT_READY"))
        .collect();
    let scale: u32 = env_num("BENCH_TIME_SCALE", "300");
    assert!(init_nodes > 0 && steady_nodes > 0 && scale > 0);

    let phases = env_or("BENCH_PHASES", "init,steady");
    let phases: Vec<&str> = phases.split(',').map(str::trim).collect();
    if phases.contains(&"init") {
        let per_node = bench_init(Path::PerNode, init_nodes, latency_ms, kube_qps).await;
        let bulk = bench_init(Path::Bulk, init_nodes, latency_ms, kube_qps).await;
        assert_eq!(per_node.len(), init_nodes);
        assert_eq!(
            per_node, bulk,
            "identical outcomes on the nodes (initialisation)"
        );
    }
    if !phases.contains(&"steady") {
        return;
    }
    for &k in &not_ready {
        let per_node = bench_steady(Path::PerNode, steady_nodes, k, scale).await;
        let bulk = bench_steady(Path::Bulk, steady_nodes, k, scale).await;
        assert_eq!(
            per_node, bulk,
            "identical outcomes on the nodes (steady state)"
        );
    }
}
