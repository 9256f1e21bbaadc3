//! Benchmark 2 of issue 10: load balancers. S LoadBalancer services (default 1,000) are created
//! at once with every provider call taking 100 ms and the host-wide cloud-call budget at
//! 200 calls/s (`--cloud-api-qps 200 --cloud-api-burst 10`); then C node changes (default 100:
//! nodes excluded from load balancers with `node.kubernetes.io/exclude-from-external-load-balancers`)
//! are made at once. Reported per `--concurrent-service-syncs`: time until every service has
//! its ingress status, EnsureLoadBalancer calls; time until every load balancer has the final
//! host set, UpdateLoadBalancer calls.
//!
//! Ignored by default; prints figures and asserts only correctness. Run with:
//! `cargo test --release -p ccm-integration-tests --test bench_load_balancers -- --ignored --nocapture`
//!
//! Environment (all optional): `BENCH_SERVICES` (1000), `BENCH_LB_NODES` (200, cluster size),
//! `BENCH_NODE_CHANGES` (100, at most `BENCH_LB_NODES - 1`), `BENCH_LB_LATENCY_MS` (100),
//! `BENCH_CLOUD_QPS` (200; 0 = no budget), `BENCH_CLOUD_BURST` (10),
//! `BENCH_SERVICE_CONCURRENCY` ("1,default,20").

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Seek, SeekFrom};
use std::time::{Duration, Instant};

use ccm_host::controllers::service::{self, ServiceController};
use ccm_host::controllers::ControllerConfig;
use ccm_host::provider::ProviderOptions;
use ccm_integration_tests::harness::Harness;
use ccm_provider_fake::config::FakeConfig;
use ccm_provider_fake::control::{CallRecord, CALLS_FILE};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::json;

const NS: &str = "default";
const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

fn env_num<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?} as a number")),
        Err(_) => default,
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

fn svc_name(i: usize) -> String {
    format!("svc-{i:05}")
}

fn has_ingress(s: &Service) -> bool {
    s.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
}

/// Follows the fake's call log (`calls.jsonl`) incrementally: the last host set each service
/// was sent, and call counts by name.
struct CallFollower {
    path: std::path::PathBuf,
    offset: u64,
    last_hosts: BTreeMap<String, BTreeSet<String>>,
    counts: BTreeMap<String, usize>,
}

impl CallFollower {
    fn new(h: &Harness) -> Self {
        let path = h.state_dir().join(CALLS_FILE);
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        Self {
            path,
            offset,
            last_hosts: BTreeMap::new(),
            counts: BTreeMap::new(),
        }
    }

    /// Read the complete lines appended since the last poll.
    fn poll(&mut self) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut reader = std::io::BufReader::new(f);
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) if !line.ends_with('\n') => {
                    let _ = n; // a line still being written: read it next time
                    break;
                }
                Ok(n) => {
                    self.offset += n as u64;
                    let Ok(rec) = serde_json::from_str::<CallRecord>(&line) else {
                        continue;
                    };
                    *self.counts.entry(rec.call.clone()).or_default() += 1;
                    if rec.call == "update" || rec.call == "create" {
                        if let Some(svc) = rec.arg("service") {
                            self.last_hosts
                                .insert(svc.to_string(), rec.hosts().into_iter().collect());
                        }
                    }
                }
            }
        }
    }

    fn count(&self, call: &str) -> usize {
        self.counts.get(call).copied().unwrap_or(0)
    }
}

/// `ccm_provider_calls_in_flight{method="UpdateLoadBalancer"}` from the provider's call metrics.
fn updates_in_flight(registry: &prometheus_client::registry::Registry) -> i64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("metrics encode");
    text.lines()
        .find(|l| l.starts_with("ccm_provider_calls_in_flight{method=\"UpdateLoadBalancer\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

struct Case {
    services: usize,
    nodes: usize,
    changes: usize,
    latency_ms: u64,
    cloud_qps: f64,
    cloud_burst: u32,
    concurrency: usize,
}

async fn run_case(case: &Case) {
    let fake: FakeConfig = serde_json::from_value(json!({
        "cloudStateFile": false,
        "latency": {"*": format!("{}ms", case.latency_ms)},
    }))
    .expect("fake config");
    let options = ProviderOptions {
        cloud_api_qps: case.cloud_qps,
        cloud_api_burst: case.cloud_burst,
        ..ProviderOptions::default()
    };
    let h = Harness::start_with("fake", fake, options).await;
    let controls = h.server.controls();
    for i in 0..case.nodes {
        let name = node_name(i);
        controls
            .seed(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name},
                "spec": {"providerID": format!("fake://{name}")},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }))
            .expect("seed node");
    }
    let ctx = h
        .context(ControllerConfig {
            concurrent_service_syncs: case.concurrency,
            ..ControllerConfig::default()
        })
        .for_controller(service::NAME);
    assert!(ctx.nodes.wait_synced().await && ctx.services.wait_synced().await);
    while ctx.nodes.list().len() < case.nodes {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ctrl = ServiceController::new(ctx.clone()).expect("fake offers LoadBalancer");
    let run = tokio::spawn(ctrl.clone().run());
    // Let the controller start and sync the (service-less) node set.
    tokio::time::sleep(Duration::from_millis(300)).await;
    controls.clear_requests();
    let mut follower = CallFollower::new(&h);

    // Phase 1: every service at once.
    let started = Instant::now();
    for i in 0..case.services {
        let name = svc_name(i);
        controls
            .seed(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"type": "LoadBalancer", "selector": {"app": name},
                         "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}]},
            }))
            .expect("seed service");
    }
    let per_call = Duration::from_millis(case.latency_ms.max(1));
    let limit = Duration::from_secs(120)
        + per_call * (case.services as u32 * 4 / case.concurrency as u32)
        + Duration::from_secs_f64(if case.cloud_qps > 0.0 {
            case.services as f64 * 4.0 / case.cloud_qps
        } else {
            0.0
        });
    let provision_time = loop {
        let done = ctx
            .services
            .list()
            .iter()
            .filter(|s| has_ingress(s))
            .count();
        if done == case.services {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "only {done} of {} services got an ingress status within {limit:?}",
            case.services
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    follower.poll();
    let ensures = follower.count("create");
    let requests = controls.requests();
    let svc_writes = requests
        .iter()
        .filter(|r| {
            r.resource == "services"
                && matches!(r.verb.as_str(), "update" | "patch")
                && r.code < 300
        })
        .count();
    let stored = controls.list("services");
    assert_eq!(stored.len(), case.services);
    let with_status = stored
        .iter()
        .filter(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"].is_string())
        .count();
    assert_eq!(
        with_status, case.services,
        "every service has an ingress IP"
    );

    // Phase 2: exclude the first `changes` nodes from load balancers, all at once.
    let expected: BTreeSet<String> = (case.changes..case.nodes).map(node_name).collect();
    let nodes_api: Api<Node> = Api::all(h.client.clone());
    let before_updates = follower.count("update");
    let started = Instant::now();
    let patches = (0..case.changes).map(|i| {
        let api = nodes_api.clone();
        async move {
            api.patch(
                &node_name(i),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {EXCLUDE: "true"}}})),
            )
            .await
            .expect("node patch")
        }
    });
    futures::future::join_all(patches).await;
    let patched = started.elapsed();
    let mut registry = prometheus_client::registry::Registry::default();
    ctx.provider.metrics().register(&mut registry);
    let limit = Duration::from_secs(120)
        + per_call * (case.services as u32 * 8 / case.concurrency as u32)
        + Duration::from_secs_f64(if case.cloud_qps > 0.0 {
            case.services as f64 * 8.0 / case.cloud_qps
        } else {
            0.0
        });
    let rehost_time = loop {
        follower.poll();
        // Every service's last call carried the final host set, and no call is still running
        // (the fake logs a call when it starts).
        let all_final = (0..case.services).all(|i| {
            follower
                .last_hosts
                .get(&format!("{NS}/{}", svc_name(i)))
                .is_some_and(|h| *h == expected)
        });
        if all_final && updates_in_flight(&registry) == 0 {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "load balancers did not all get the final host set within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let updates = follower.count("update") - before_updates;
    for i in [0, case.services / 2, case.services - 1] {
        let key = format!("{NS}/{}", svc_name(i));
        assert_eq!(
            ctrl.last_synced_node_names(&key),
            Some(expected.iter().cloned().collect::<Vec<_>>()),
            "{key}: last synced hosts"
        );
    }

    println!(
        "BENCH load_balancers services={} nodes={} node_changes={} latency_ms={} cloud_qps={} \
         cloud_burst={} concurrency={} provision_seconds={:.3} ensure_calls={} \
         service_writes_per_service={:.2} rehost_seconds={:.3} update_calls={} \
         update_calls_per_service={:.2} node_patch_seconds={:.3}",
        case.services,
        case.nodes,
        case.changes,
        case.latency_ms,
        case.cloud_qps,
        case.cloud_burst,
        case.concurrency,
        provision_time.as_secs_f64(),
        ensures,
        svc_writes as f64 / case.services as f64,
        rehost_time.as_secs_f64(),
        updates,
        updates as f64 / case.services as f64,
        patched.as_secs_f64(),
    );

    h.stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), run).await;
    drop(h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture (see bench/run.sh)"]
async fn bench_load_balancers() {
    let services: usize = env_num("BENCH_SERVICES", 1000);
    let nodes: usize = env_num("BENCH_LB_NODES", 200);
    let changes: usize = env_num("BENCH_NODE_CHANGES", 100);
    assert!(
        services > 0 && nodes > 1,
        "BENCH_SERVICES > 0 and BENCH_LB_NODES > 1"
    );
    assert!(
        changes > 0 && changes < nodes,
        "BENCH_NODE_CHANGES must be between 1 and BENCH_LB_NODES - 1"
    );
    let latency_ms: u64 = env_num("BENCH_LB_LATENCY_MS", 100);
    let cloud_qps: f64 = env_num("BENCH_CLOUD_QPS", 200.0);
    assert!(
        cloud_qps.is_finite() && cloud_qps >= 0.0,
        "BENCH_CLOUD_QPS >= 0"
    );
    let cloud_burst: u32 = env_num("BENCH_CLOUD_BURST", 10);
    assert!(cloud_burst > 0, "BENCH_CLOUD_BURST must be > 0");
    let default_concurrency = ControllerConfig::default().concurrent_service_syncs;
    let raw = std::env::var("BENCH_SERVICE_CONCURRENCY").unwrap_or_else(|_| "1,default,20".into());
    let mut concurrencies: Vec<usize> =
        raw.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| match s {
                "default" => default_concurrency,
                n => n.parse().ok().filter(|&n| n > 0).unwrap_or_else(|| {
                    panic!("BENCH_SERVICE_CONCURRENCY: bad value {s:?} in {raw:?}")
                }),
            })
            .collect();
    concurrencies.dedup();
    println!(
        "load balancers: {services} services, {nodes} nodes, {changes} node changes, \
         default --concurrent-service-syncs = {default_concurrency}"
    );
    for concurrency in concurrencies {
        run_case(&Case {
            services,
            nodes,
            changes,
            latency_ms,
            cloud_qps,
            cloud_burst,
            concurrency,
        })
        .await;
    }
}
