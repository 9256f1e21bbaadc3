//! Benchmark of issue 32 item 3: the real `ccm-host run` binary (release) at cluster scale, with
//! the in-memory API server in ANOTHER process (`kube-apiserver-inmem`, its own binary) so that
//! the host's figures are the host's. The bench seeds `BENCH_SCALE_NODES` (65,000) initialised,
//! Ready nodes (~4 KB of JSON each: conditions, node info, 10 images) and `BENCH_SCALE_SERVICES`
//! (10,000) services, `BENCH_SCALE_LB_SERVICES` (100) of them LoadBalancer, through the API over
//! HTTP, then starts the host with the fake provider's `.so` and measures, in order:
//!
//! 1. converge: from the host's start until every LoadBalancer service has its ingress IP;
//! 2. steady state: RSS after `BENCH_SCALE_SETTLE_SECS` (10) of rest, and CPU over
//!    `BENCH_IDLE_SECS` (30) of idling;
//! 3. one node change (a node gets `node.kubernetes.io/exclude-from-external-load-balancers`):
//!    wall time and host CPU until the provider has been called for every LoadBalancer service
//!    (`ccm_provider_calls_total` of the methods starting with `UpdateLoadBalancer`, from the
//!    host's `/metrics`) and none of those calls is in flight;
//! 4. a zone outage: 10 % of the nodes turn NotReady; the duration of the first lifecycle pass
//!    that saw all of them (`ccm_node_lifecycle_last_pass_seconds`).
//!
//! Memory: the process's `VmRSS` is sampled every 50 ms (and at the end of each phase), and with it the fake provider's own heap
//! (the plugin's counting allocator, `heapFile`, see `docs/fake-provider.md`): the *host's share*
//! (`*_host_mib`) is RSS minus the provider's heap as the allocator holds it (its footprint: the
//! blocks' chunks, not only the bytes asked for; its instance table, each load balancer's host
//! names, its SDK adapter's parsed host lists); both are printed, per phase, with the peak of
//! each. `*_host_asked_mib` subtracts only the bytes the provider asked for (the figure reported
//! before the footprint was counted). `converge_peak_host_settled_mib` subtracts the largest
//! provider footprint of the last 0.5 s instead (memory the provider has just freed is still
//! resident until glibc gives it back; see `SETTLE_WINDOW`). `BENCH_SCALE_TRACE=<file>` writes
//! every sample (`ms rss_kib provider_footprint_kib host_kib`). The provider records no call log
//! (`callLog: false`); calls are counted by the host's metrics. The fake answers instance
//! questions (`InstanceMetadata`, `InstanceExists`, `InstanceShutdown`, `InstancesBatch`) after
//! `BENCH_SCALE_LATENCY_MS` (50) and offers bulk lookups unless `BENCH_SCALE_BULK=0`. It is an
//! ABI 1.2 plugin with incremental host updates (`incrementalHosts`) unless
//! `BENCH_SCALE_INCREMENTAL=0`, which makes it answer like a 1.0/1.1 plugin (full host lists).
//!
//! Other settings: `BENCH_SCALE_KUBE_QPS` / `BENCH_SCALE_KUBE_BURST` (the host's client limit;
//! default: the host's defaults, 20/30), `BENCH_SCALE_ROUTES` (0: `--configure-cloud-routes`
//! off; with routes on pass `BENCH_SCALE_HOST_ARGS=--cluster-cidr=10.0.0.0/8`, the nodes' pod
//! CIDRs are /24s of it), `BENCH_SCALE_HOST_ARGS` (more flags, space-separated), `BENCH_SCALE_APISERVER` (path of
//! the `kube-apiserver-inmem` binary; default: next to this test's target directory),
//! `BENCH_SCALE_TARGET` (a target directory, e.g. `target/release`, to take `ccm-host`,
//! `kube-apiserver-inmem` and `libccm_provider_fake.so` from instead of this test's build: the
//! bench process itself does little, so a debug test can drive release binaries).
//!
//! Ignored; prints `BENCH scale ...` and asserts only that the host converges and stays up:
//! `cargo build --release -p ccm-host-cli -p kube-apiserver-inmem -p ccm-provider-fake &&
//! BENCH_SCALE_TARGET=$PWD/target/release BENCH_SCALE_NODES=5000 cargo test -p ccm-host-cli --test bench_scale -- --ignored --nocapture`

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::{json, Value};

mod support;

use support::{free_port, plugin_dir, BIN};

fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: expected a number, got {v:?}")),
        Err(_) => default,
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn node_ip(i: usize) -> String {
    let n = i + 1;
    format!("10.{}.{}.{}", n / 65536, (n / 256) % 256, n % 256)
}

/// The node's pod CIDR: a /24 of its own within 10.0.0.0/8 (the route controller reads
/// `podCIDRs`, which a real API server fills from `podCIDR` and the in-memory one does not).
fn pod_cidr(i: usize) -> String {
    format!("10.{}.{}.0/24", (i / 256) % 256, i % 256)
}

/// An initialised, Ready node roughly the size of a real one (as `bench_memory`'s).
fn node(i: usize) -> Value {
    let name = node_name(i);
    let condition = |t: &str, status: &str, reason: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": format!("kubelet {reason}"),
               "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    };
    let images: Vec<Value> = (0..10)
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
                "node.kubernetes.io/instance-type": "fake.medium",
                "topology.kubernetes.io/zone": "fake-zone-a", "topology.kubernetes.io/region": "fake-region-1",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"providerID": format!("fake://{name}"), "podCIDR": pod_cidr(i), "podCIDRs": [pod_cidr(i)]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": node_ip(i)}, {"type": "Hostname", "address": name}],
            "capacity": {"cpu": "8", "memory": "32859496Ki", "pods": "110"},
            "allocatable": {"cpu": "7910m", "memory": "31708520Ki", "pods": "110"},
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
                     "labels": {"app.kubernetes.io/name": name, "bench-lb": load_balancer.to_string()}},
        "spec": {
            "type": if load_balancer { "LoadBalancer" } else { "ClusterIP" },
            "selector": {"app.kubernetes.io/name": name},
            "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
        },
    })
}

/// The fake cloud: one instance per node with the node's addresses (so the host writes no
/// address), no call log, its heap figures in `dir/heap.json`.
fn cloud_config(
    nodes: usize,
    dir: &Path,
    latency_ms: usize,
    bulk: bool,
    incremental: bool,
) -> Value {
    let instances: Vec<Value> = (0..nodes)
        .map(|i| {
            json!({"name": node_name(i), "addresses": [
                {"type": "InternalIP", "address": node_ip(i)},
                {"type": "Hostname", "address": node_name(i)}]})
        })
        .collect();
    let latency = format!("{latency_ms}ms");
    json!({"autoInstances": false, "instances": instances, "bulkInstances": bulk,
           "incrementalHosts": incremental,
           "stateDir": dir, "callLog": false, "cloudStateFile": false, "heapFile": true,
           "latency": {"InstanceMetadata": latency, "InstanceExists": latency,
                       "InstanceShutdown": latency, "InstancesBatch": latency}})
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// utime + stime of the process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// The provider's heap now, in KiB: (bytes it asked for, the allocator's footprint of them),
/// `heap.json`'s `current` and `footprint` (a fake without `footprint`: the bytes asked for).
fn plugin_heap_kib(file: &Path) -> (u64, u64) {
    let v = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok());
    let field = |name: &str| v.as_ref().and_then(|v| v[name].as_u64());
    let asked = field("current").unwrap_or(0);
    (asked / 1024, field("footprint").unwrap_or(asked) / 1024)
}

/// `BENCH_SCALE_TRACE=<file>`: every sample as a line `ms rss_kib provider_footprint_kib
/// host_kib` (to see where a peak comes from).
static TRACE: std::sync::OnceLock<Mutex<std::fs::File>> = std::sync::OnceLock::new();
static TRACE_START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Peaks of one phase, from the 50 ms samples (and one taken when the phase ends, so that a
/// phase shorter than the period has one).
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    rss: u64,
    /// RSS minus the provider's footprint.
    host: u64,
    /// RSS minus the bytes the provider asked for (the figure before the footprint was
    /// counted: it includes the allocator's overhead on the provider's blocks).
    host_asked: u64,
    /// RSS minus the largest provider footprint of the last [`SETTLE_WINDOW`]: memory the
    /// provider freed in that window counts as the provider's until the heap has given it back.
    host_settled: u64,
    plugin: u64,
    plugin_footprint: u64,
}

struct Sampler {
    peaks: Arc<Mutex<Peaks>>,
    stop: Arc<AtomicBool>,
    pid: u32,
    heap_file: PathBuf,
}

/// How long memory the provider freed still counts as the provider's in `host_settled`: a
/// load-balancer call's plugin frees its parse of every host (~300 MiB at 65,000 nodes) at its
/// end, the provider's footprint falls at once, and RSS only when glibc has merged and returned
/// those pages (the host's trim after the call): 50–250 ms in `BENCH_SCALE_TRACE` at 65,000
/// nodes, during which `RSS − footprint` counts the plugin's garbage as the host's.
const SETTLE_WINDOW: Duration = Duration::from_millis(500);

/// The provider footprints of the last [`SETTLE_WINDOW`], with their time.
static RECENT: Mutex<std::collections::VecDeque<(Instant, u64)>> =
    Mutex::new(std::collections::VecDeque::new());

fn sample(pid: u32, heap_file: &Path, peaks: &Mutex<Peaks>) {
    let rss = status_kib(pid, "VmRSS:");
    let (plugin, footprint) = plugin_heap_kib(heap_file);
    let recent_max = {
        let mut recent = RECENT.lock().unwrap();
        let now = Instant::now();
        recent.push_back((now, footprint));
        while recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > SETTLE_WINDOW)
        {
            recent.pop_front();
        }
        recent.iter().map(|(_, f)| *f).max().unwrap_or(footprint)
    };
    if let Some(trace) = TRACE.get() {
        use std::io::Write;
        let ms = TRACE_START.get_or_init(Instant::now).elapsed().as_millis();
        let _ = writeln!(
            trace.lock().unwrap(),
            "{ms} {rss} {footprint} {}",
            rss.saturating_sub(footprint)
        );
    }
    let mut g = peaks.lock().unwrap();
    g.rss = g.rss.max(rss);
    g.plugin = g.plugin.max(plugin);
    g.plugin_footprint = g.plugin_footprint.max(footprint);
    g.host = g.host.max(rss.saturating_sub(footprint));
    g.host_asked = g.host_asked.max(rss.saturating_sub(plugin));
    g.host_settled = g.host_settled.max(rss.saturating_sub(recent_max));
}

impl Sampler {
    fn start(pid: u32, heap_file: PathBuf) -> Self {
        let peaks = Arc::new(Mutex::new(Peaks::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s, file) = (peaks.clone(), stop.clone(), heap_file.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                sample(pid, &file, &p);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Self {
            peaks,
            stop,
            pid,
            heap_file,
        }
    }

    /// The peaks since the last call (with a sample taken now); starts a new phase.
    fn phase(&self) -> Peaks {
        sample(self.pid, &self.heap_file, &self.peaks);
        std::mem::take(&mut *self.peaks.lock().unwrap())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Process(Child);

impl Drop for Process {
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

/// `BENCH_SCALE_TARGET`, if set.
fn target_dir() -> Option<PathBuf> {
    std::env::var_os("BENCH_SCALE_TARGET").map(PathBuf::from)
}

/// The host binary: `BENCH_SCALE_TARGET`'s, else this build's.
fn host_bin() -> PathBuf {
    target_dir().map_or_else(|| PathBuf::from(BIN), |d| d.join("ccm-host"))
}

/// A plugin directory with the fake: `BENCH_SCALE_TARGET`'s, else this build's.
fn plugins(dir: &Path) -> PathBuf {
    let Some(target) = target_dir() else {
        return plugin_dir(dir);
    };
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let so = target.join("libccm_provider_fake.so");
    std::fs::copy(&so, plugins.join("libccm_provider_fake.so"))
        .unwrap_or_else(|e| panic!("{}: {e}", so.display()));
    plugins
}

fn apiserver_bin() -> PathBuf {
    if let Ok(p) = std::env::var("BENCH_SCALE_APISERVER") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    let dir = target_dir().unwrap_or_else(|| exe.parent().unwrap().parent().unwrap().to_path_buf());
    let bin = dir.join("kube-apiserver-inmem");
    assert!(
        bin.exists(),
        "{} not found: build it first (cargo build -p kube-apiserver-inmem) or set BENCH_SCALE_APISERVER",
        bin.display()
    );
    bin
}

/// `/metrics` over HTTPS.
fn metrics(port: u16) -> Option<String> {
    support::https::get(port, "/metrics", None)
        .ok()
        .filter(|(code, _)| *code == 200)
        .map(|(_, body)| body)
}

/// The sum of the samples whose line starts with `prefix`.
fn sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// `ccm_provider_calls_total` per method (summed over callers).
fn calls_by_method(text: &str) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for l in text.lines() {
        let Some(rest) = l.strip_prefix("ccm_provider_calls_total{method=\"") else {
            continue;
        };
        let (Some((method, _)), Some(v)) = (
            rest.split_once('"'),
            l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()),
        ) else {
            continue;
        };
        *out.entry(method.to_string()).or_default() += v;
    }
    out
}

/// The calls made between two `calls_by_method` readings, as `Method:N,…`.
fn calls_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> String {
    after
        .iter()
        .filter_map(|(m, v)| {
            let d = v - before.get(m).copied().unwrap_or(0.0);
            (d > 0.0).then(|| format!("{m}:{d}"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

async fn wait_for<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture (see the module documentation)"]
async fn bench_scale() {
    let nodes = env_num("BENCH_SCALE_NODES", 65_000);
    let services = env_num("BENCH_SCALE_SERVICES", 10_000);
    let lb_services = env_num("BENCH_SCALE_LB_SERVICES", 100).min(services);
    let idle = Duration::from_secs(env_num("BENCH_IDLE_SECS", 30) as u64);
    let settle = Duration::from_secs(env_num("BENCH_SCALE_SETTLE_SECS", 10) as u64);
    let latency = env_num("BENCH_SCALE_LATENCY_MS", 50);
    let bulk = env_num("BENCH_SCALE_BULK", 1) != 0;
    let incremental = env_num("BENCH_SCALE_INCREMENTAL", 1) != 0;
    let routes = env_num("BENCH_SCALE_ROUTES", 0) != 0;
    let qps = std::env::var("BENCH_SCALE_KUBE_QPS").ok();
    let burst = std::env::var("BENCH_SCALE_KUBE_BURST").ok();
    assert!(
        nodes > 0 && lb_services > 0,
        "BENCH_SCALE_NODES and BENCH_SCALE_LB_SERVICES must be > 0"
    );

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let apiserver = Process(
        Command::new(apiserver_bin())
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .arg("--port-file")
            .arg(dir.path().join("port"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kube-apiserver-inmem starts"),
    );
    wait_for(
        "the API server's port file",
        Duration::from_secs(30),
        || dir.path().join("port").exists().then_some(()),
    )
    .await;
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = Client::try_from(config).unwrap();

    // Seed through the API, 64 requests at a time.
    let t = Instant::now();
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in 0..20 {
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": format!("ns-{ns:02}")}})).unwrap();
        ns_api.create(&PostParams::default(), &ns).await.unwrap();
    }
    let node_api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(0..nodes)
        .map(|i| {
            let api = node_api.clone();
            async move {
                let n: Node = serde_json::from_value(node(i)).unwrap();
                api.create(&PostParams::default(), &n).await.map(|_| ())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await
        .expect("seed nodes");
    let lb_every = services / lb_services;
    futures::stream::iter(0..services)
        .map(|i| {
            let client = client.clone();
            async move {
                let lb = i % lb_every == 0 && i / lb_every < lb_services;
                let svc: Service = serde_json::from_value(service(i, lb)).unwrap();
                let ns = svc.metadata.namespace.clone().unwrap();
                Api::<Service>::namespaced(client, &ns)
                    .create(&PostParams::default(), &svc)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await
        .expect("seed services");
    let seed_seconds = t.elapsed().as_secs_f64();
    let apiserver_rss = status_kib(apiserver.0.id(), "VmRSS:");

    let state = dir.path().join("fake");
    std::fs::create_dir_all(&state).unwrap();
    let cloud = dir.path().join("cloud.json");
    std::fs::write(
        &cloud,
        serde_json::to_vec(&cloud_config(nodes, &state, latency, bulk, incremental)).unwrap(),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("host.log")).unwrap();
    let port = free_port();
    let mut command = Command::new(host_bin());
    command
        .arg("run")
        .arg("--plugin-dir")
        .arg(plugins(dir.path()))
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
        .arg("--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics")
        .arg(format!("--configure-cloud-routes={routes}"));
    if let Some(q) = &qps {
        command.arg(format!("--kube-api-qps={q}"));
    }
    if let Some(b) = &burst {
        command.arg(format!("--kube-api-burst={b}"));
    }
    command.args(
        std::env::var("BENCH_SCALE_HOST_ARGS")
            .unwrap_or_default()
            .split_whitespace(),
    );
    let started = Instant::now();
    let host = Process(
        command
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("ccm-host starts"),
    );
    let pid = host.0.id();
    if let Some(path) = std::env::var_os("BENCH_SCALE_TRACE") {
        let file = std::fs::File::create(&path).expect("BENCH_SCALE_TRACE file");
        let _ = TRACE.set(Mutex::new(file));
    }
    let sampler = Sampler::start(pid, state.join("heap.json"));
    #[allow(unsafe_code)]
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let host_log = || std::fs::read_to_string(dir.path().join("host.log")).unwrap_or_default();

    // 1. Converge: every LB service has its ingress.
    let lb_api: Api<Service> = Api::all(client.clone());
    let lb_list = ListParams::default().labels("bench-lb=true");
    loop {
        let list = lb_api.list(&lb_list).await.expect("list LB services");
        let done = list
            .items
            .iter()
            .filter(|s| {
                s.status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.as_ref())
                    .is_some_and(|i| !i.is_empty())
            })
            .count();
        if done == lb_services {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(3600),
            "not converged within an hour ({done} of {lb_services} load balancers); log tail: {}",
            host_log()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let converge_seconds = started.elapsed().as_secs_f64();
    let converge_cpu = cpu_ticks(pid) as f64 / ticks_per_s;
    // With routes on, convergence also waits for a route per node (`CreateRoute` calls); the
    // `NetworkUnavailable` condition writes that follow go on at the client limit.
    let routes_seconds = if routes {
        wait_for("a route per node", Duration::from_secs(3600), || {
            let created = sum(
                &metrics(port)?,
                "ccm_provider_calls_total{method=\"CreateRoute\"",
            );
            (created >= nodes as f64).then_some(())
        })
        .await;
        started.elapsed().as_secs_f64()
    } else {
        0.0
    };

    // 2. Steady state.
    tokio::time::sleep(settle).await;
    let converge_peaks = sampler.phase();
    let steady_rss = status_kib(pid, "VmRSS:");
    let (steady_plugin, steady_footprint) = plugin_heap_kib(&state.join("heap.json"));
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    tokio::time::sleep(idle).await;
    let idle_cpu = (cpu_ticks(pid) - cpu0) as f64 / ticks_per_s;
    let idle_percent = 100.0 * idle_cpu / t0.elapsed().as_secs_f64();
    let idle_peaks = sampler.phase();

    // 3. One node change reaching every load balancer.
    let lb_calls = |text: &str| {
        (
            sum(text, "ccm_provider_calls_total{method=\"UpdateLoadBalancer"),
            sum(
                text,
                "ccm_provider_calls_in_flight{method=\"UpdateLoadBalancer",
            ),
        )
    };
    let text0 = metrics(port).expect("metrics");
    let (calls0, _) = lb_calls(&text0);
    let by_method0 = calls_by_method(&text0);
    let cpu0 = cpu_ticks(pid);
    let t0 = Instant::now();
    node_api
        .patch(
            &node_name(0),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": "true"}}})),
        )
        .await
        .expect("label node-00000");
    let calls = wait_for(
        "one node change reaching every load balancer",
        Duration::from_secs(1800),
        || {
            let (calls, in_flight) = lb_calls(&metrics(port)?);
            (calls - calls0 >= lb_services as f64 && in_flight == 0.0).then_some(calls - calls0)
        },
    )
    .await;
    let change_seconds = t0.elapsed().as_secs_f64();
    let change_cpu = (cpu_ticks(pid) - cpu0) as f64 / ticks_per_s;
    let change_peaks = sampler.phase();
    let change_calls = calls_between(
        &by_method0,
        &calls_by_method(&metrics(port).expect("metrics")),
    );

    // 4. 10 % of the nodes NotReady: the first pass that saw all of them.
    let not_ready = nodes / 10;
    let passes0 = sum(
        &metrics(port).expect("metrics"),
        "ccm_node_lifecycle_passes_total",
    );
    futures::stream::iter(0..not_ready)
        .map(|k| {
            let api = node_api.clone();
            // Spread over the range (every tenth node).
            let name = node_name(k * 10 + 1);
            async move {
                api.patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"conditions": [
                        {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                         "message": "Kubelet stopped posting node status."}]}})),
                )
                .await
                .map(|_| ())
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<()>>()
        .await
        .expect("nodes NotReady");
    let (pass_seconds, passes) = wait_for(
        "a lifecycle pass over every NotReady node",
        Duration::from_secs(1800),
        || {
            let text = metrics(port)?;
            (sum(&text, "ccm_node_lifecycle_last_pass_not_ready_nodes") >= not_ready as f64).then(
                || {
                    (
                        sum(&text, "ccm_node_lifecycle_last_pass_seconds"),
                        sum(&text, "ccm_node_lifecycle_passes_total") - passes0,
                    )
                },
            )
        },
    )
    .await;
    let outage_peaks = sampler.phase();
    let text = metrics(port).expect("metrics");
    let provider_calls = sum(&text, "ccm_provider_calls_total{");
    let hwm = status_kib(pid, "VmHWM:");
    let end_rss = status_kib(pid, "VmRSS:");
    let mut host = host;
    assert!(
        host.0.try_wait().unwrap().is_none(),
        "the host exited during the bench; log tail: {}",
        host_log()
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "BENCH scale nodes={nodes} services={services} lb_services={lb_services} routes={routes} bulk={bulk} incremental={incremental} \
         latency_ms={latency} kube_api_qps={} kube_api_burst={} seed_seconds={seed_seconds:.1} \
         apiserver_rss_mib={:.0} converge_seconds={converge_seconds:.1} routes_seconds={routes_seconds:.1} converge_cpu_seconds={converge_cpu:.1} \
         converge_peak_rss_mib={:.1} converge_peak_host_mib={:.1} converge_peak_host_settled_mib={:.1} converge_peak_host_asked_mib={:.1} \
         converge_peak_provider_heap_mib={:.1} converge_peak_provider_footprint_mib={:.1} \
         steady_rss_mib={:.1} steady_provider_heap_mib={:.1} steady_provider_footprint_mib={:.1} \
         steady_host_mib={:.1} steady_host_asked_mib={:.1} \
         settle_seconds={} idle_seconds={:.0} idle_cpu_seconds={idle_cpu:.2} idle_cpu_percent={idle_percent:.2} idle_peak_host_mib={:.1} \
         node_change_seconds={change_seconds:.2} node_change_cpu_seconds={change_cpu:.2} node_change_lb_calls={calls} node_change_calls={change_calls} \
         node_change_peak_rss_mib={:.1} node_change_peak_host_mib={:.1} node_change_peak_host_asked_mib={:.1} \
         node_change_peak_provider_heap_mib={:.1} \
         not_ready={not_ready} lifecycle_pass_seconds={pass_seconds:.2} lifecycle_passes={passes} \
         outage_peak_host_mib={:.1} provider_calls={provider_calls} vm_hwm_mib={:.1} end_rss_mib={:.1}",
        qps.as_deref().unwrap_or("default"),
        burst.as_deref().unwrap_or("default"),
        mib(apiserver_rss),
        mib(converge_peaks.rss),
        mib(converge_peaks.host),
        mib(converge_peaks.host_settled),
        mib(converge_peaks.host_asked),
        mib(converge_peaks.plugin),
        mib(converge_peaks.plugin_footprint),
        mib(steady_rss),
        mib(steady_plugin),
        mib(steady_footprint),
        mib(steady_rss.saturating_sub(steady_footprint)),
        mib(steady_rss.saturating_sub(steady_plugin)),
        settle.as_secs(),
        idle.as_secs_f64(),
        mib(idle_peaks.host),
        mib(change_peaks.rss),
        mib(change_peaks.host),
        mib(change_peaks.host_asked),
        mib(change_peaks.plugin),
        mib(outage_peaks.host),
        mib(hwm),
        mib(end_rss),
    );
    if let Ok(path) = std::env::var("BENCH_KEEP_LOG") {
        std::fs::copy(dir.path().join("host.log"), &path).expect("copy the host log");
    }
    drop(sampler);
    drop(host);
    drop(apiserver);
}
