//! Benchmark 3 of issue 10: memory and idle CPU of the real `ccm-host run` process watching a
//! large cluster. The bench process starts the in-memory API server, seeds N initialised nodes
//! (default 5,000, with realistic status: conditions, capacity, node info, images) and S
//! services (default 10,000; `BENCH_MEM_LB_SERVICES` of them, default 10, of type LoadBalancer,
//! the rest ClusterIP), then starts the release binary against it with the fake provider (an
//! explicit instance per node whose addresses match the nodes', so the sync is read-only).
//!
//! After the host has synced (every load-balancer service has its ingress status and the node
//! address loop has asked the cloud about every node, read from the host's own `/metrics`), it
//! samples `VmHWM`/`VmRSS` from `/proc/<pid>/status`, then measures CPU (utime + stime from
//! `/proc/<pid>/stat`) over an idle window (`BENCH_IDLE_SECS`, default 60) and the RSS at its end.
//! The figures include the fake provider plugin, which runs inside the host process (its
//! instance table and its in-memory call log).
//!
//! Ignored by default; prints figures, asserts only that the host syncs and stays up. Run with:
//! `cargo test --release -p ccm-host-cli --test bench_memory -- --ignored --nocapture`
//! Environment: `BENCH_MEM_NODES` (5000), `BENCH_MEM_SERVICES` (10000),
//! `BENCH_MEM_LB_SERVICES` (10), `BENCH_MEM_NODE_IMAGES` (10: entries of `status.images` per
//! node), `BENCH_IDLE_SECS` (60), `BENCH_KEEP_LOG` (a path to copy the
//! host's log to), `BENCH_HOST_WRAPPER` (a profiler command to run the host under).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_apiserver_inmem::ApiServer;
use serde_json::{json, Value};

fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: expected a number, got {v:?}")),
        Err(_) => default,
    }
}

mod support;

use support::{free_port, plugin_dir, BIN};

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn node_ip(i: usize) -> String {
    let n = i + 1;
    format!("10.{}.{}.{}", n / 65536, (n / 256) % 256, n % 256)
}

/// An initialised node roughly the size of a real one (~4 KB of JSON with 10 images).
fn node(i: usize, image_count: usize) -> Value {
    let name = node_name(i);
    let condition = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet {reason}"),
               "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let images: Vec<Value> = (0..image_count)
        .map(|k| {
            json!({"names": [format!("registry.example/team/app-{k}@sha256:{:064x}", k * 7919 + i),
                             format!("registry.example/team/app-{k}:v1.{k}.0")],
                   "sizeBytes": 10_000_000 + k * 1_000_000})
        })
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/instance-type": "fake.medium", "node.kubernetes.io/instance-type": "fake.medium",
                "failure-domain.beta.kubernetes.io/zone": "fake-zone-a", "topology.kubernetes.io/zone": "fake-zone-a",
                "failure-domain.beta.kubernetes.io/region": "fake-region-1", "topology.kubernetes.io/region": "fake-region-1",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"providerID": format!("fake://{name}"), "podCIDR": format!("10.244.{}.0/24", i % 256)},
        "status": {
            "addresses": [{"type": "InternalIP", "address": node_ip(i)}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "8", "memory": "32859496Ki", "pods": "110", "ephemeral-storage": "101430960Ki"},
            "allocatable": {"cpu": "7910m", "memory": "31708520Ki", "pods": "110", "ephemeral-storage": "93478772582"},
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                         "bootID": format!("{i:032x}"), "kernelVersion": "6.1.0-18-amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": "v1.35.0", "kubeProxyVersion": "v1.35.0",
                         "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    })
}

fn service(i: usize, load_balancer: bool) -> Value {
    let name = format!("svc-{i:05}");
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": format!("ns-{:02}", i % 20),
                     "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "bench"}},
        "spec": {
            "type": if load_balancer { "LoadBalancer" } else { "ClusterIP" },
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
                      {"name": "metrics", "port": 9090, "protocol": "TCP", "targetPort": 9090}],
        },
    })
}

/// The fake cloud: one instance per node with the node's addresses (so no address patch).
fn cloud_config(nodes: usize) -> Value {
    let instances: Vec<Value> = (0..nodes)
        .map(|i| {
            json!({"name": node_name(i), "addresses": [
                {"type": "InternalIP", "address": node_ip(i)},
                {"type": "Hostname", "address": node_name(i)}]})
        })
        .collect();
    json!({"autoInstances": false, "instances": instances})
}

/// (VmHWM, VmRSS) in KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// utime + stime of the process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command name (which may contain spaces) start at field 3.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields[11].parse().expect("utime");
    let stime: u64 = fields[12].parse().expect("stime");
    utime + stime
}

fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// `/metrics` over HTTPS (the host serves it to anyone: see the always-allowed paths below).
fn metrics(port: u16) -> Option<String> {
    support::https::get(port, "/metrics", None)
        .ok()
        .filter(|(code, _)| *code == 200)
        .map(|(_, body)| body)
}

/// The value of the first sample line starting with `prefix`.
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

struct Host(Child);

impl Drop for Host {
    /// SIGTERM (graceful: the host releases its lease, a profiler writes its output), then
    /// SIGKILL if it is still there after 30 s.
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture (see bench/run.sh)"]
async fn bench_memory() {
    let nodes = env_num("BENCH_MEM_NODES", 5000);
    let services = env_num("BENCH_MEM_SERVICES", 10_000);
    let lb_services = env_num("BENCH_MEM_LB_SERVICES", 10).min(services);
    let idle = Duration::from_secs(env_num("BENCH_IDLE_SECS", 60) as u64);
    let images = env_num("BENCH_MEM_NODE_IMAGES", 10);
    assert!(nodes > 0, "BENCH_MEM_NODES must be > 0");

    let server = ApiServer::start().await.expect("API server");
    let controls = server.controls();
    let t = Instant::now();
    for i in 0..nodes {
        controls.seed(node(i, images)).expect("seed node");
    }
    for ns in 0..20 {
        controls
            .seed(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{ns:02}")}}))
            .expect("seed namespace");
    }
    // Spread the load-balancer services over the range.
    let lb_every = services.checked_div(lb_services).unwrap_or(usize::MAX);
    let mut lb_names = Vec::new();
    for i in 0..services {
        let lb = lb_names.len() < lb_services && i % lb_every == 0;
        let svc = controls.seed(service(i, lb)).expect("seed service");
        if lb {
            lb_names.push((
                svc["metadata"]["namespace"].as_str().unwrap().to_string(),
                svc["metadata"]["name"].as_str().unwrap().to_string(),
            ));
        }
    }
    println!(
        "seeded {nodes} nodes and {services} services ({lb_services} LoadBalancer) in {:?}",
        t.elapsed()
    );

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let cloud = dir.path().join("cloud.json");
    std::fs::write(&cloud, serde_json::to_vec(&cloud_config(nodes)).unwrap()).unwrap();
    let log = std::fs::File::create(dir.path().join("host.log")).unwrap();
    let port = free_port();
    let started = Instant::now();
    // BENCH_HOST_WRAPPER: a profiler to run the host under, e.g.
    // "valgrind --tool=massif --massif-out-file=/tmp/massif.out" (then the figures are the
    // profiler's, not the host's).
    let wrapper: Vec<String> = std::env::var("BENCH_HOST_WRAPPER")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let mut command = match wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    let child = command
        .arg("run")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir.path()))
        .args(["--cloud-provider", "fake", "--cloud-config"])
        .arg(&cloud)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &port.to_string(),
        ])
        // /metrics without a token: this bench reads it and measures the host, not the
        // delegated authorization.
        .arg("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics")
        // Routes need the node NetworkUnavailable patches (5,000 writes at the default
        // --kube-api-qps 20); this bench is about the watched state, so they are off.
        .args(["--configure-cloud-routes=false"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("ccm-host starts");
    let host = Host(child);
    let pid = host.0.id();

    // Synced: every LB service has an ingress, and the address loop asked about every node.
    let limit = Duration::from_secs(600);
    let mut last_calls = 0.0;
    loop {
        if let Some(text) = metrics(port) {
            last_calls = sample(
                &text,
                "ccm_provider_calls_total{method=\"InstanceMetadata\",caller=\"cloud-node-controller\"}",
            );
            let in_flight = sample(
                &text,
                "ccm_provider_calls_in_flight{method=\"InstanceMetadata\"}",
            );
            let lbs_done = lb_names.iter().all(|(ns, name)| {
                controls
                    .get("services", ns, name)
                    .is_some_and(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"].is_string())
            });
            if last_calls >= nodes as f64 && in_flight == 0.0 && lbs_done {
                break;
            }
        }
        assert!(
            started.elapsed() < limit,
            "host did not sync within {limit:?} (InstanceMetadata calls: {last_calls}); log: {}",
            std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let sync_time = started.elapsed();
    let node_syncs = |text: Option<String>| {
        text.map(|t| sample(&t, "service_controller_nodesync_latency_seconds_count"))
            .unwrap_or(f64::NAN)
    };
    let node_syncs_at_sync = node_syncs(metrics(port));
    // Let the event writer and the last status patches settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (hwm_sync, rss_sync) = memory_kib(pid);
    let node_writes = controls
        .requests()
        .iter()
        .filter(|r| r.resource == "nodes" && matches!(r.verb.as_str(), "update" | "patch"))
        .count();

    // Idle window.
    #[allow(unsafe_code)]
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    let mut rss_max = rss_sync;
    while t0.elapsed() < idle {
        tokio::time::sleep(Duration::from_secs(1).min(idle)).await;
        rss_max = rss_max.max(memory_kib(pid).1);
    }
    let cpu1 = cpu_ticks(pid);
    let window = t0.elapsed().as_secs_f64();
    let (hwm_end, rss_end) = memory_kib(pid);
    let nthreads = threads(pid);
    let node_syncs_at_end = node_syncs(metrics(port));
    let mut host = host;
    assert!(
        host.0.try_wait().unwrap().is_none(),
        "the host exited during the bench; log: {}",
        std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default()
    );
    let cpu_s = (cpu1 - cpu0) as f64 / ticks_per_s;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "BENCH memory nodes={nodes} services={services} lb_services={lb_services} images={images} \
         sync_seconds={:.1} peak_rss_sync_mib={:.1} rss_sync_mib={:.1} peak_rss_end_mib={:.1} \
         rss_end_mib={:.1} rss_idle_max_mib={:.1} idle_seconds={:.0} idle_cpu_seconds={:.2} \
         idle_cpu_percent={:.2} threads={nthreads} node_writes_during_sync={node_writes} \
         lb_node_syncs_at_sync={node_syncs_at_sync} lb_node_syncs_at_end={node_syncs_at_end}",
        sync_time.as_secs_f64(),
        mib(hwm_sync),
        mib(rss_sync),
        mib(hwm_end),
        mib(rss_end),
        mib(rss_max),
        window,
        cpu_s,
        100.0 * cpu_s / window,
    );
    drop(host);
    if let Ok(path) = std::env::var("BENCH_KEEP_LOG") {
        std::fs::copy(dir.path().join("host.log"), &path).expect("copy the host log");
        println!("host log copied to {path}");
    }
    server.shutdown().await;
}
