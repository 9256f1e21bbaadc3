//! Benchmark of issue 32: what one node change costs when it reaches S LoadBalancer Services.
//! N nodes (default 5,000) and S LoadBalancer Services (default 100) behind the whole service
//! controller, the fake provider's `.so` through the real loader, the in-memory API server over
//! HTTP, all in this process. After a warm-up change (the first host update of each load
//! balancer), C single node changes (default 3: a node joins) are made one at a time; for each
//! it prints the wall time until every load balancer had its host update, the process CPU time
//! spent meanwhile (host, fake plugin and API server together: the fake logs every call with its
//! host names, so the plugin's share grows with the hosts it is sent), and the bytes of Node
//! JSON that crossed the ABI (each call's nodes serialised as the host does, from the cache).
//! The file builds against main as well (mode `1.1` there), for before/after figures. Modes: `1.2` (the fake as an ABI 1.2 plugin: incremental host updates) and
//! `1.1` (full `UpdateLoadBalancer` host lists).
//!
//! Ignored by default; prints figures and asserts only correctness (no timing assertion). Run:
//! `cargo test -p ccm-integration-tests --test bench_node_change -- --ignored --nocapture`
//! (add `--release` for production-like figures).
//!
//! Environment (all optional): `BENCH_NODES` (5000), `BENCH_LB_SERVICES` (100),
//! `BENCH_CHANGES` (3), `BENCH_MODES` ("1.2,1.1"), `BENCH_SERVICE_CONCURRENCY` (1, the default
//! of `--concurrent-service-syncs`).

use std::time::{Duration, Instant};

use ccm_host::controllers::service::ServiceController;
use ccm_host::controllers::ControllerConfig;
use ccm_host::runtime::CachedNode;
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

const NS: &str = "default";
const WAIT: Duration = Duration::from_secs(1800);

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?} as a number")),
        Err(_) => default,
    }
}

fn node_json(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
            "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "m5.large"}},
        "spec": {"providerID": format!("fake://{name}")},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                          {"type": "Hostname", "address": name}],
        },
    })
}

/// utime + stime of this process, from /proc/self/stat (clock ticks of 10 ms).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    // Fields 14 and 15 of stat(5) are utime and stime; `rest` starts at field 3.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

struct Figures {
    wall: Duration,
    cpu: Duration,
    updates: usize,
    full_calls: usize,
    abi_bytes: usize,
}

async fn run_mode(mode: &str, nodes: usize, services: usize, changes: usize, workers: usize) {
    let incremental = mode == "1.2";
    let mut fake = json!({"cloudStateFile": false});
    if incremental {
        fake["incrementalHosts"] = json!(true);
    }
    let fake: FakeConfig = serde_json::from_value(fake).expect("fake config");
    let h = Harness::start("fake", fake).await;
    for i in 0..nodes {
        h.server
            .controls()
            .seed(node_json(&format!("node-{i:05}")))
            .expect("seed node");
    }
    let ctx = h.context(ControllerConfig {
        concurrent_service_syncs: workers,
        ..ControllerConfig::default()
    });
    assert!(ctx.nodes.wait_synced().await && ctx.services.wait_synced().await);
    eventually("node cache", WAIT, || {
        (ctx.nodes.list().len() == nodes).then_some(())
    })
    .await;
    tokio::spawn(
        ServiceController::new(ctx.clone())
            .expect("LoadBalancer")
            .run(),
    );
    let api: Api<Service> = Api::namespaced(h.client.clone(), NS);
    for i in 0..services {
        let svc = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i:03}"), "namespace": NS},
            "spec": {"type": "LoadBalancer", "selector": {"app": "x"},
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
        }))
        .unwrap();
        api.create(&PostParams::default(), &svc).await.unwrap();
    }
    let started = Instant::now();
    let ensured = || async {
        let list = api.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .filter(|s| {
                s.status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.as_ref())
                    .is_some_and(|i| !i.is_empty())
            })
            .count()
    };
    while ensured().await < services {
        assert!(started.elapsed() < WAIT, "load balancers not ensured");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The controller marks a load balancer ensured right after publishing its status.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!(
        "[{mode}] {nodes} nodes, {services} LB services ensured in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let node_api: Api<Node> = Api::all(h.client.clone());
    // Host updates finished: the count of upstream's per-update latency histogram (observed
    // when the call returned; `service_lb_sync_total` counts them when they start).
    let syncs = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &h.registry).expect("encode");
        text.lines()
            .find_map(|l| {
                l.strip_prefix("service_controller_update_loadbalancer_host_latency_seconds_count ")
            })
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    let mut results = Vec::new();
    // Change 0 is the warm-up (the plugin holds no token yet: whole sets).
    for change in 0..=changes {
        h.clear_calls();
        let before = syncs();
        let name = format!("extra-{change:03}");
        let node: Node = serde_json::from_value(node_json(&name)).unwrap();
        let (t0, c0) = (Instant::now(), process_cpu());
        node_api
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        // A cheap signal (a metric, not the call log), so the wait costs little CPU of its own.
        loop {
            if syncs() >= before + services {
                break;
            }
            assert!(t0.elapsed() < WAIT, "load balancers not updated");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (wall, cpu) = (t0.elapsed(), process_cpu().saturating_sub(c0));
        // The fake writes its call log behind the calls: wait for the records (not timed).
        let calls = eventually("the host updates in the call log", WAIT, || {
            let calls = h.calls();
            let n = calls
                .iter()
                .filter(|c| c.call == "update" || c.call == "update-hosts")
                .count();
            (n >= services).then_some(calls)
        })
        .await;
        let full: Vec<_> = calls.iter().filter(|c| c.call == "update").collect();
        let inc: Vec<_> = calls.iter().filter(|c| c.call == "update-hosts").collect();
        // Bytes of Node JSON per call (serde_json over the cached Node, as the host sends it).
        let json_len = |n: &CachedNode| serde_json::to_vec(n).unwrap().len();
        let all_bytes: usize = ctx.nodes.list().iter().map(|n| json_len(n)).sum();
        let one_bytes = ctx
            .nodes
            .list()
            .iter()
            .find(|n| n.name() == name.as_str())
            .map(|n| json_len(n))
            .unwrap_or_default();
        let abi_bytes = full.len() * all_bytes
            + inc
                .iter()
                .map(|c| {
                    if c.args["replace"] == true {
                        all_bytes
                    } else {
                        one_bytes
                    }
                })
                .sum::<usize>();
        for c in &inc {
            if change > 0 {
                assert_eq!(c.args["replace"], false, "only the change after warm-up");
            }
        }
        assert_eq!(
            full.len() + inc.len(),
            services,
            "one update per load balancer"
        );
        if change > 0 {
            results.push(Figures {
                wall,
                cpu,
                updates: full.len() + inc.len(),
                full_calls: full.len(),
                abi_bytes,
            });
        }
    }
    for (i, f) in results.iter().enumerate() {
        println!(
            "[{mode}] change {}: wall {:.3}s, process CPU {:.2}s, {} host updates ({} full), {:.1} KB of Node JSON across the ABI",
            i + 1,
            f.wall.as_secs_f64(),
            f.cpu.as_secs_f64(),
            f.updates,
            f.full_calls,
            f.abi_bytes as f64 / 1e3
        );
    }
    let n = results.len().max(1) as f64;
    println!(
        "[{mode}] mean per node change reaching {services} LBs ({nodes} nodes, --concurrent-service-syncs {workers}): wall {:.3}s, CPU {:.2}s, {:.1} KB of Node JSON across the ABI",
        results.iter().map(|f| f.wall.as_secs_f64()).sum::<f64>() / n,
        results.iter().map(|f| f.cpu.as_secs_f64()).sum::<f64>() / n,
        results.iter().map(|f| f.abi_bytes as f64).sum::<f64>() / n / 1e3,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "benchmark: prints figures; run with --ignored --nocapture"]
async fn bench_node_change() {
    let nodes = env_num("BENCH_NODES", 5_000usize);
    let services = env_num("BENCH_LB_SERVICES", 100usize);
    let changes = env_num("BENCH_CHANGES", 3usize);
    let workers = env_num("BENCH_SERVICE_CONCURRENCY", 1usize);
    let modes = std::env::var("BENCH_MODES").unwrap_or_else(|_| "1.2,1.1".into());
    for mode in modes.split(',').map(str::trim) {
        assert!(
            mode == "1.2" || mode == "1.1",
            "BENCH_MODES: 1.2 or 1.1, got {mode:?}"
        );
        run_mode(mode, nodes, services, changes, workers).await;
    }
}
