//! Test environment for the `kind` (containers) provider against real podman.
//!
//! - [`Podman`]: `deploy/podman-env.sh` (CONTAINERS_CONF; fails with the `apt-get install` command
//!   when podman or runc is missing: these tests never skip), the provider's images
//!   (`scripts/images.sh`: the haproxy proxy and a busybox-httpd node stand-in, built from the
//!   local Debian base), `podman system service` on a socket in a temporary directory (a
//!   watchdog ends it when the test process is gone), and a network of the test's own.
//! - Node containers serve their own name over HTTP on [`NODE_PORT`]; only the test's network
//!   connects them. The test's own requests go to 127.0.0.1 only (the proxy publishes Service
//!   ports on the loopback).
//! - [`Env`]: the in-memory API server and the plugin's `.so` through the host's loader, with a
//!   cloud config pointing at the test's socket, cluster and network.

#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::{HostServices, Provider, ProviderOptions};
use ccm_host::runtime::metrics::Metrics;
use kube_apiserver_inmem::ApiServer;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

pub const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
pub const NODE_PORT: i32 = 30080;
pub const OWNER_LABEL: &str = "io.ccm-host.containers.load-balancer-of";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A podman command with the private containers.conf.
pub fn podman(conf: &str) -> Command {
    let mut c = Command::new("podman");
    c.env("CONTAINERS_CONF", conf);
    c
}

/// Run podman, panic with its stderr on failure; stdout trimmed.
pub fn podman_ok(conf: &str, args: &[&str]) -> String {
    let out = podman(conf).args(args).output().expect("run podman");
    if !out.status.success() {
        panic!(
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `deploy/podman-env.sh` and `scripts/images.sh`, once per test process (the tests of a binary
/// run in parallel; the first image build must not run several times at once):
/// `(CONTAINERS_CONF, proxy image, node image)`.
fn setup() -> &'static (String, String, String) {
    static SETUP: OnceLock<(String, String, String)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let root = root();
        let env = Command::new("bash")
            .arg("-c")
            .arg(". deploy/podman-env.sh >/dev/null && printf %s \"$CONTAINERS_CONF\"")
            .current_dir(&root)
            .output()
            .expect("run bash");
        if !env.status.success() {
            panic!(
                "podman is not usable here; these tests need it (they never skip): {}",
                String::from_utf8_lossy(&env.stderr).trim()
            );
        }
        let conf = String::from_utf8_lossy(&env.stdout).trim().to_string();
        let images = Command::new("bash")
            .arg("providers/containers/scripts/images.sh")
            .current_dir(&root)
            .stderr(Stdio::inherit())
            .output()
            .expect("run images.sh");
        assert!(
            images.status.success(),
            "providers/containers/scripts/images.sh failed (its messages are above)"
        );
        let refs: Vec<String> = String::from_utf8_lossy(&images.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(refs.len(), 2, "images.sh printed {refs:?}");
        (conf, refs[0].clone(), refs[1].clone())
    })
}

/// podman, its service on a private socket, the images, a private network.
pub struct Podman {
    pub conf: String,
    pub socket: PathBuf,
    pub proxy_image: String,
    pub node_image: String,
    pub network: String,
    /// Unique per environment: prefix of container names and the cluster's name.
    pub cluster: String,
    service: Child,
    dir: tempfile::TempDir,
}

impl Podman {
    pub fn start() -> Self {
        let (conf, proxy_image, node_image) = setup().clone();
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("podman.sock");
        // The watchdog ends the service when this test process is gone, even if it is killed.
        let script = format!(
            "podman system service --time=0 \"unix://$0\" >\"$0.log\" 2>&1 & child=$!; \
             while kill -0 {parent} 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done; \
             kill $child 2>/dev/null; wait $child 2>/dev/null",
            parent = std::process::id()
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .arg(&socket)
            .env("CONTAINERS_CONF", &conf);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let service = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start podman system service");
        let started = Instant::now();
        while !ping(&socket) {
            if started.elapsed() > Duration::from_secs(30) {
                panic!(
                    "podman system service did not answer on {} within 30 s",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let cluster = format!(
            "ccmt{}x{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let network = format!("{cluster}-net");
        podman_ok(&conf, &["network", "create", &network]);
        Podman {
            conf,
            socket,
            proxy_image,
            node_image,
            network,
            cluster,
            service,
            dir,
        }
    }

    /// Start a node container `<cluster>-<suffix>` serving its name on [`NODE_PORT`].
    pub fn node(&self, suffix: &str) -> String {
        let name = format!("{}-{suffix}", self.cluster);
        let serve = format!(
            "mkdir -p /www && echo {name} >/www/index.html && exec busybox httpd -f -p {NODE_PORT} -h /www"
        );
        podman_ok(
            &self.conf,
            &[
                "run",
                "-d",
                "--name",
                &name,
                "--hostname",
                &name,
                "--network",
                &self.network,
                "--label",
                &format!("io.x-k8s.kind.cluster={}", self.cluster),
                "--label",
                "topology.kubernetes.io/zone=zone-a",
                &self.node_image,
                "sh",
                "-c",
                &serve,
            ],
        );
        name
    }

    /// `podman inspect` of a container (`None`: no such container).
    pub fn inspect(&self, name: &str) -> Option<Value> {
        let out = podman(&self.conf)
            .args(["container", "inspect", name])
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.get(0).cloned()
    }

    /// The container's IPv4 address on the test's network.
    pub fn ip(&self, name: &str) -> String {
        self.inspect(name).expect("container exists")["NetworkSettings"]["Networks"][&self.network]
            ["IPAddress"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Names of the load-balancer containers of this cluster.
    pub fn proxies(&self) -> Vec<String> {
        let out = podman_ok(
            &self.conf,
            &[
                "ps",
                "-a",
                "--filter",
                &format!("label={OWNER_LABEL}={}", self.cluster),
                "--format",
                "{{.Names}}",
            ],
        );
        let mut v: Vec<String> = out.lines().map(str::to_string).collect();
        v.sort();
        v
    }

    /// What a proxy container says and holds (for failure messages): its last log lines and
    /// its configuration's header (the hosts).
    pub fn describe_proxies(&self) -> String {
        let mut out = String::new();
        for p in self.proxies() {
            let logs = podman(&self.conf)
                .args(["logs", "--tail", "15", &p])
                .output()
                .map(|o| {
                    format!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    )
                })
                .unwrap_or_default();
            let config = podman(&self.conf)
                .args(["exec", &p, "grep", "^# host", "/etc/ccm-lb/haproxy.cfg"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            out.push_str(&format!("--- {p}: hosts\n{config}--- {p}: log\n{logs}"));
        }
        out
    }

    /// The cloud config for this environment.
    pub fn cloud_config(&self, publish: bool) -> String {
        format!(
            "socket: {}\ncluster: {}\nnetwork: {}\nloadBalancer:\n  image: {}\n  publishOnLoopback: {publish}\n  healthCheckInterval: 500ms\n",
            self.socket.display(),
            self.cluster,
            self.network,
            self.proxy_image
        )
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Every container of this environment: nodes by name prefix, proxies by label.
        let mut names: Vec<String> = podman(&self.conf)
            .args(["ps", "-a", "--format", "{{.Names}}"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter(|n| n.starts_with(&format!("{}-", self.cluster)))
            .map(str::to_string)
            .collect();
        names.extend(self.proxies());
        if !names.is_empty() {
            let mut args = vec!["rm", "-f", "-t", "0"];
            args.extend(names.iter().map(String::as_str));
            let _ = podman(&self.conf).args(&args).output();
        }
        let _ = podman(&self.conf)
            .args(["network", "rm", "-f", &self.network])
            .output();
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.service.id())])
            .status();
        let _ = self.service.wait();
    }
}

fn ping(socket: &Path) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

/// A free TCP port on 127.0.0.1 (for a Service port published on the loopback).
pub fn free_port() -> i32 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .unwrap()
        .port()
        .into()
}

/// `GET /` on 127.0.0.1:`port`, one connection: the body (a node's name), or the error.
pub fn get(port: i32) -> Result<String, String> {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP answer ({} bytes)", raw.len()))?;
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!(
            "answer: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.trim().to_string())
}

/// `n` requests: answers per node, and the failures.
pub fn tally(port: i32, n: usize) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut per = BTreeMap::new();
    let mut errors = Vec::new();
    for _ in 0..n {
        match get(port) {
            Ok(body) => *per.entry(body).or_insert(0) += 1,
            Err(e) => errors.push(e),
        }
    }
    (per, errors)
}

/// The plugin's `.so` as cargo built it for this test run.
pub fn built_plugin() -> PathBuf {
    ccm_test_support::built_plugin("ccm_provider_containers")
}

/// The host side: API server, the plugin through the loader, metrics.
pub struct Env {
    pub server: ApiServer,
    pub client: kube::Client,
    pub provider: Provider,
    pub registry: PluginRegistry,
    pub metrics: Arc<Metrics>,
    pub stop: CancellationToken,
    pub dir: tempfile::TempDir,
}

impl Env {
    pub async fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = ApiServer::start()
            .await
            .expect("in-memory API server starts");
        let client = server.client();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        std::fs::copy(
            built_plugin(),
            plugins.join("libccm_provider_containers.so"),
        )
        .unwrap();
        let registry = PluginRegistry::load_dirs(&[plugins], &LoaderOptions::default())
            .expect("plugin dir loads");
        assert!(
            registry.refused().is_empty(),
            "plugin refused: {:?}",
            registry.refused()
        );
        let provider = registry
            .create(
                "kind",
                Some(config.as_bytes()),
                &ProviderOptions {
                    call_timeout: Duration::from_secs(60),
                    ..Default::default()
                },
            )
            .expect("kind provider builds");
        provider
            .initialize(HostServices::new(
                "kubernetes",
                Some(client.clone()),
                Arc::new(AtomicBool::new(false)),
            ))
            .await
            .expect("kind provider initialises");
        let mut prom = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut prom));
        Env {
            server,
            client,
            provider,
            registry,
            metrics,
            stop: CancellationToken::new(),
            dir,
        }
    }

    pub fn context(&self, config: ControllerConfig) -> ControllerContext {
        ControllerContext::new(
            &self.client,
            &self.provider,
            &self.metrics,
            config,
            "containers-test-host",
            &self.stop,
        )
    }

    /// A kubelet-style Node (uninitialised taint, Ready).
    pub fn seed_node(&self, name: &str) {
        let n = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name},
            "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        });
        self.server.controls().seed(n).expect("seed node");
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.server.controls().get("nodes", "", name)
    }

    pub fn service(&self, name: &str) -> Option<Value> {
        self.server.controls().get("services", "default", name)
    }

    pub fn events(&self) -> Vec<Value> {
        self.server.controls().list("events")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A LoadBalancer Service on `port` → [`NODE_PORT`].
pub fn lb_service(
    name: &str,
    port: i32,
    extra_ports: Value,
) -> k8s_openapi::api::core::v1::Service {
    let mut ports = vec![
        json!({"name": "http", "port": port, "targetPort": 80, "protocol": "TCP", "nodePort": NODE_PORT}),
    ];
    if let Value::Array(more) = extra_ports {
        ports.extend(more);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "selector": {"app": name}, "ports": ports},
    }))
    .unwrap()
}

pub fn ingress_ips(svc: &Value) -> Vec<String> {
    svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["ip"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub use ccm_test_support::eventually;
