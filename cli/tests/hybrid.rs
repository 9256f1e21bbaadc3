//! Hybrid clusters (issue 20) through the real `ccm-host run` binary against the in-memory API
//! server: several providers in one host (`--cloud-provider fake,metal`), each on the nodes it
//! owns, and one host per provider (two daemons, each with its own lease).
//!
//! The providers are the real plugins: `fake` (providerIDs `fake://NAME`; its `stateDir` shows
//! every call in `calls.jsonl` and its load balancers and routes in `cloud.json`) and `metal`
//! (providerIDs `metal://ID` from an inventory file; load-balancer addresses from a pool, kept
//! in the ConfigMap `kube-system/ccm-metal-ipam`). Outcomes are read from the API (nodes,
//! Services, Events with their source component and host, Leases), from each cloud's state and
//! from the hosts' `/metrics`, `/healthz` and `/readyz`.
//!
//! The daemons run with their default flags (client rate limits on) except the short leader
//! election timings of `tests/daemon.rs`, a 1 s `--node-monitor-period` and what each test is
//! about. Every wait polls until a generous deadline; nothing is asserted on time but the lower
//! bound of a grace period.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ccm_provider_fake::control::{read_calls, CallRecord};
use ccm_provider_fake::FakeState;
use kube_apiserver_inmem::{ApiServer, Controls};
use serde_json::{json, Value};

mod support;

use support::{free_port, https, plugin_dir_with, BIN};

const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
const PLATFORM_LABEL: &str = "topology.kubernetes.io/platform";
const PLATFORM_ANNOTATION: &str = "cloudprovider.kubernetes.io/platform";
const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";
const LB_PROVIDER_ANNOTATION: &str = "ccm-host/load-balancer-provider";
const LB_FINALIZER: &str = "service.kubernetes.io/load-balancer-cleanup";
const METAL_IPAM: (&str, &str) = ("kube-system", "ccm-metal-ipam");
/// Bound of every wait: far above what a converged run needs on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(180);
/// Lifecycle passes each provider must have made after the deletions before the test decides
/// that a node is never deleted.
const EXTRA_PASSES: usize = 3;

// ---- the cluster and the hosts -------------------------------------------------------------

/// The in-memory API server (on its own runtime), a temp directory with the kubeconfig and a
/// plugin directory holding the fake and metal plugins.
struct Cluster {
    server: ApiServer,
    ctl: Controls,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    plugins: PathBuf,
    rt: tokio::runtime::Runtime,
}

impl Cluster {
    fn start() -> Cluster {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let server = rt.block_on(ApiServer::start()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        https::allow_test_token(&server);
        let plugins = plugin_dir_with(
            dir.path(),
            &["libccm_provider_fake.so", "libccm_provider_metal.so"],
        );
        Cluster {
            ctl: server.controls(),
            server,
            dir,
            kubeconfig,
            plugins,
            rt,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Store `obj`; the stored object (with its resourceVersion) comes back.
    fn seed(&self, obj: Value) -> Value {
        self.ctl.seed(obj).unwrap()
    }

    fn node(&self, name: &str) -> Option<Value> {
        self.ctl.get("nodes", "", name)
    }

    fn service(&self, name: &str) -> Value {
        self.ctl
            .get("services", "default", name)
            .unwrap_or_else(|| panic!("service default/{name} exists"))
    }

    /// The events about the object `kind`/`name`: (source component, reason, source host,
    /// message).
    fn events_about(&self, kind: &str, name: &str) -> Vec<Event> {
        self.ctl
            .list("events")
            .into_iter()
            .filter(|e| e["involvedObject"]["kind"] == kind && e["involvedObject"]["name"] == name)
            .map(|e| Event {
                component: e["source"]["component"].as_str().unwrap_or("").into(),
                reason: e["reason"].as_str().unwrap_or("").into(),
                host: e["source"]["host"].as_str().unwrap_or("").into(),
                message: e["message"].as_str().unwrap_or("").into(),
            })
            .collect()
    }

    fn lease_holder(&self, name: &str) -> Option<String> {
        let lease = self
            .ctl
            .get("leases.coordination.k8s.io", "kube-system", name)?;
        lease["spec"]["holderIdentity"]
            .as_str()
            .filter(|h| !h.is_empty())
            .map(str::to_string)
    }

    /// Turn `default/<name>` into a ClusterIP Service, as `kubectl edit` would (the class, the
    /// node ports and the external traffic policy go with the type).
    fn make_cluster_ip(&self, name: &str) {
        use kube::api::{Patch, PatchParams};
        let api: kube::Api<k8s_openapi::api::core::v1::Service> =
            kube::Api::namespaced(self.server.client(), "default");
        let body = json!({"spec": {
            "type": "ClusterIP",
            "loadBalancerClass": null,
            "externalTrafficPolicy": null,
            "ports": [{"port": 80, "protocol": "TCP"}],
        }});
        self.rt
            .block_on(api.patch(name, &PatchParams::default(), &Patch::Merge(&body)))
            .unwrap_or_else(|e| panic!("service {name} to ClusterIP: {e}"));
    }

    /// The metal provider's allocation of `default/<service>` in its ConfigMap.
    fn metal_allocation(&self, service: &str) -> Option<Value> {
        let cm = self.ctl.get("configmaps", METAL_IPAM.0, METAL_IPAM.1)?;
        let entry = cm["data"][format!("default.{service}")].as_str()?;
        serde_json::from_str(entry).ok()
    }
}

#[derive(Debug, Clone)]
struct Event {
    component: String,
    reason: String,
    host: String,
    message: String,
}

/// One `ccm-host run` process; its stderr goes to a file.
struct Host {
    name: String,
    child: std::cell::RefCell<Child>,
    port: u16,
    log: PathBuf,
}

impl Host {
    /// `ccm-host run` against `cluster` with the plugin directory, the kubeconfig, the secure
    /// port on 127.0.0.1 (delegating to the same API server), short leader-election timings, a
    /// 1 s node monitor period, and `args`.
    fn start(cluster: &Cluster, name: &str, args: &[String]) -> Host {
        let port = free_port();
        let log = cluster.path(&format!("{name}.log"));
        let child = Command::new(BIN)
            .arg("run")
            .arg("--plugin-dir")
            .arg(&cluster.plugins)
            .arg("--kubeconfig")
            .arg(&cluster.kubeconfig)
            .args(["--bind-address", "127.0.0.1", "--secure-port"])
            .arg(port.to_string())
            .arg("--authentication-kubeconfig")
            .arg(&cluster.kubeconfig)
            .arg("--authorization-kubeconfig")
            .arg(&cluster.kubeconfig)
            // As tests/daemon.rs: a renew deadline of three retry periods.
            .args([
                "--leader-elect-lease-duration=4s",
                "--leader-elect-renew-deadline=3s",
                "--leader-elect-retry-period=1s",
                "--node-monitor-period=1s",
            ])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("ccm-host starts");
        Host {
            name: name.into(),
            child: std::cell::RefCell::new(child),
            port,
            log,
        }
    }

    fn read_log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    fn tail(&self, n: usize) -> String {
        let log = self.read_log();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "--- {} (last {n} lines) ---\n{}",
            self.name,
            lines[lines.len().saturating_sub(n)..].join("\n")
        )
    }

    /// GET `path` on the secure port with the test token.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        https::get(self.port, path, Some(https::TEST_TOKEN)).ok()
    }

    /// `/metrics`, or an empty text when it does not answer.
    fn metrics(&self) -> String {
        match self.get("/metrics") {
            Some((200, body)) => body,
            _ => String::new(),
        }
    }

    /// SIGTERM, then the exit code (`None` if it did not exit within [`WAIT`]).
    fn stop(&self) -> Option<i32> {
        // SAFETY: kill(2) on our own child's pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.borrow().id() as i32, libc::SIGTERM);
        }
        let started = Instant::now();
        while started.elapsed() < WAIT {
            if let Ok(Some(status)) = self.child.borrow_mut().try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    /// Panics with the log when the process has exited.
    fn assert_running(&self, waiting_for: &str) {
        let exited = self.child.borrow_mut().try_wait();
        if let Ok(Some(status)) = exited {
            panic!(
                "host {} exited ({status}) while waiting for {waiting_for}\n{}",
                self.name,
                self.tail(60)
            );
        }
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let child = self.child.get_mut();
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Poll `check` until it says `Ok`, failing (with the hosts' logs) after [`WAIT`] or when a
/// host exits.
fn eventually<T>(what: &str, hosts: &[&Host], mut check: impl FnMut() -> Result<T, String>) -> T {
    let started = Instant::now();
    loop {
        let why = match check() {
            Ok(v) => return v,
            Err(why) => why,
        };
        for host in hosts {
            host.assert_running(what);
        }
        if started.elapsed() > WAIT {
            let logs: Vec<String> = hosts.iter().map(|h| h.tail(60)).collect();
            panic!(
                "timed out after {WAIT:?} waiting for {what}: {why}\n{}",
                logs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An event the test waits for: (involved kind, involved name, reason, source component, source
/// host); an empty component or host matches any.
type Expected<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str);

/// Wait, while `hosts` run, until every `expected` event is stored. Events are written
/// asynchronously after what they report (a deleted node is gone before its `DeletingNode`
/// event may be written) and not flushed at exit, so positive checks on events wait for them
/// before the hosts stop.
fn wait_for_events(cluster: &Cluster, hosts: &[&Host], expected: &[Expected]) {
    eventually("the expected events", hosts, || {
        let missing: Vec<&Expected> = expected
            .iter()
            .filter(|(kind, name, reason, component, host)| {
                !cluster.events_about(kind, name).iter().any(|e| {
                    e.reason == *reason
                        && (component.is_empty() || e.component == *component)
                        && (host.is_empty() || e.host == *host)
                })
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing {missing:?}"))
        }
    });
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

// ---- objects ---------------------------------------------------------------------------------

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A kubelet-style Node: Ready or not; `extra` is merged in.
fn node(name: &str, ready: bool, extra: Value) -> Value {
    let mut n = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    });
    merge(&mut n, extra);
    n
}

/// The `node.cloudprovider.kubernetes.io/uninitialized` taint a kubelet with
/// `--cloud-provider=external` sets.
fn tainted() -> Value {
    json!({"spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]}})
}

fn with(mut a: Value, b: Value) -> Value {
    merge(&mut a, b);
    a
}

fn provider_id(id: &str) -> Value {
    json!({"spec": {"providerID": id}})
}

fn platform_label(platform: &str) -> Value {
    json!({"metadata": {"labels": {PLATFORM_LABEL: platform}}})
}

fn pod_cidr(cidr: &str) -> Value {
    json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}})
}

fn lb_service(name: &str, class: Option<&str>) -> Value {
    let mut svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]},
    });
    if let Some(class) = class {
        svc["spec"]["loadBalancerClass"] = json!(class);
    }
    svc
}

fn pid_of(n: &Value) -> &str {
    n["spec"]["providerID"].as_str().unwrap_or("")
}

fn label<'a>(n: &'a Value, key: &str) -> Option<&'a str> {
    n["metadata"]["labels"][key].as_str()
}

fn taint_keys(n: &Value) -> Vec<String> {
    n["spec"]["taints"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn ingress_ip(svc: &Value) -> Option<String> {
    svc["status"]["loadBalancer"]["ingress"][0]["ip"]
        .as_str()
        .map(str::to_string)
}

/// Is `ip` in the fake provider's default pool 198.18.0.0/15?
fn in_fake_pool(ip: &str) -> bool {
    ip.parse::<std::net::Ipv4Addr>()
        .is_ok_and(|a| a.octets()[0] == 198 && (a.octets()[1] & 0xfe) == 18)
}

// ---- clouds ----------------------------------------------------------------------------------

/// The fake and metal clouds of a test: the fake's state directory and config, and metal's
/// config (its inventory beside it), in the cluster's directory.
struct Clouds {
    fake_state: PathBuf,
    fake_config: PathBuf,
    metal_config: PathBuf,
}

impl Clouds {
    /// Write the fake's config ([`write_fake_config`]: `fake_instances`, `fake_extra`) and
    /// metal's ([`write_metal_config`]: `metal_machines`).
    fn write(
        cluster: &Cluster,
        fake_instances: &[&str],
        fake_extra: &str,
        metal_machines: &[&str],
    ) -> Clouds {
        let clouds = Clouds {
            fake_state: cluster.path("fake-state"),
            fake_config: cluster.path("fake.yaml"),
            metal_config: cluster.path("metal.yaml"),
        };
        write_fake_config(
            &clouds.fake_config,
            &clouds.fake_state,
            fake_instances,
            fake_extra,
        );
        write_metal_config(
            &clouds.metal_config,
            &cluster.path("inventory.yaml"),
            metal_machines,
        );
        clouds
    }

    /// `ccm-host run` arguments for one host with `providers` (fake and metal among them, fake
    /// first: the default), both configs, a cluster CIDR, then `extra`.
    fn run_args_for(&self, providers: &str, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            format!("--cloud-provider={providers}"),
            format!("--cloud-config=fake={}", self.fake_config.display()),
            format!("--cloud-config=metal={}", self.metal_config.display()),
            "--cluster-cidr=10.244.0.0/16".to_string(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }

    /// [`Self::run_args_for`] `fake,metal`.
    fn run_args(&self, extra: &[&str]) -> Vec<String> {
        self.run_args_for("fake,metal", extra)
    }
}

/// A fake cloud config: `stateDir`, no synthesised instances, the given instances (YAML list
/// items) and `extra` top-level YAML.
fn write_fake_config(path: &Path, state_dir: &Path, instances: &[&str], extra: &str) {
    std::fs::create_dir_all(state_dir).unwrap();
    let mut text = format!(
        "stateDir: {}\nautoInstances: false\ninstances:\n",
        state_dir.display()
    );
    for i in instances {
        text.push_str(&format!("  - {i}\n"));
    }
    text.push_str(extra);
    std::fs::write(path, text).unwrap();
}

/// A metal cloud config with the inventory `machines` (YAML list items) and the pool
/// `192.0.2.0/29`.
fn write_metal_config(path: &Path, inventory: &Path, machines: &[&str]) {
    let mut text = String::from("machines:\n");
    for m in machines {
        text.push_str(&format!("  - {m}\n"));
    }
    std::fs::write(inventory, text).unwrap();
    std::fs::write(
        path,
        format!(
            "inventory: {}\nloadBalancer:\n  pools:\n    - name: public\n      addresses: [192.0.2.0/29]\n",
            inventory.display()
        ),
    )
    .unwrap();
}

/// Every call the fake cloud of `state_dir` received.
fn fake_calls(state_dir: &Path) -> Vec<CallRecord> {
    read_calls(state_dir).unwrap_or_default()
}

/// Is the call about node `name` (or its providerID `pid`)? Node, providerID, batch and
/// load-balancer host arguments count.
fn call_names_node(c: &CallRecord, name: &str, pid: &str) -> bool {
    let a = &c.args;
    let in_list = |key: &str| {
        a[key]
            .as_array()
            .is_some_and(|l| l.iter().any(|v| v == name))
    };
    a["node"] == name
        || (!pid.is_empty() && a["providerID"] == pid)
        || in_list("nodes")
        || in_list("hosts")
}

/// The names of the fake's calls about node `name` / `pid`.
fn fake_calls_about(calls: &[CallRecord], name: &str, pid: &str) -> Vec<String> {
    calls
        .iter()
        .filter(|c| call_names_node(c, name, pid))
        .map(|c| c.call.clone())
        .collect()
}

/// The hosts of the fake load balancer of `default/<service>`.
fn fake_lb_hosts(state_dir: &Path, service: &str) -> Option<Vec<String>> {
    FakeState::read(state_dir)
        .ok()?
        .load_balancer(&format!("default/{service}"))
        .map(|lb| lb.hosts.clone())
}

// ---- metrics ---------------------------------------------------------------------------------

/// The sum of the samples of `name` carrying every `labels` pair.
fn metric(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---- 1-4: two providers in one host ----------------------------------------------------------

/// The "done when", in one host running `--cloud-provider fake,metal`:
///
/// 1. each provider initialises its own nodes, whether kubelet set the providerID or the
///    node-ownership controller claimed the node by the platform label (the fake asked first, so
///    it wins a node both clouds know); the fake is never asked about a metal node (except the
///    ownership question about the unclaimed one, which it answers "no") and metal never acts on
///    a fake node;
/// 2. the foreign nodes (`kwok://k-1`, and one labelled with the platform `kwok`), NotReady and
///    tainted, stay byte for byte as seeded and no provider is asked about them;
/// 3. NotReady nodes whose instances are gone from their own cloud are deleted by their own
///    provider's lifecycle controller; NotReady nodes of the other provider, that this one says
///    do not exist, and the foreign nodes, that both say do not exist, are never deleted over
///    several further passes of both lifecycle controllers;
/// 4. the classless Service gets its load balancer from the default provider (fake) with only
///    the fake's nodes as hosts, the `metal-lb` Service from metal's pool, a Service of another
///    class from nobody; events carry `<controller>/<provider>`.
#[test]
fn two_providers_in_one_host_each_handle_only_their_own_nodes_and_load_balancers() {
    let cluster = Cluster::start();
    let clouds = Clouds::write(&cluster, &[
            "{name: f-1}",
            "{name: f-claim}",
            "{name: f-stay}",
            "{name: f-gone, exists: false}",
            // Not the fake's, but the fake cannot say so at first: while it fails, the
            // ownership round stops there and metal, asked after it, cannot win.
            "{name: m-claim, exists: false, errors: {InstanceExists: {kind: other, message: fake cloud unreachable, times: 2}}}",
        ], "", &[
            "{name: m-1, id: rack1-01, instanceType: r640, zone: rack1, region: dc1, addresses: [{type: InternalIP, address: 10.10.0.1}]}",
            "{name: m-claim, id: rack1-02, instanceType: r640, addresses: [{type: InternalIP, address: 10.10.0.2}]}",
            "{name: m-label, id: rack1-03, instanceType: r650, addresses: [{type: InternalIP, address: 10.10.0.3}]}",
            "{name: m-gone, id: rack1-04, state: absent}",
            "{name: m-stay, id: rack1-05, addresses: [{type: InternalIP, address: 10.10.0.5}]}",
            "{name: m-annot, id: rack1-06, addresses: [{type: InternalIP, address: 10.10.0.6}]}",
            // A machine of the fake's node's name: metal would claim f-claim if it were asked
            // first, or initialise it if its controllers saw it.
            "{name: f-claim, id: decoy, instanceType: decoy, addresses: [{type: InternalIP, address: 10.10.0.99}]}",
        ]);
    let fake_state = clouds.fake_state.clone();

    // Fake nodes.
    cluster.seed(node(
        "f-1",
        true,
        with(
            with(tainted(), provider_id("fake://f-1")),
            pod_cidr("10.244.1.0/24"),
        ),
    ));
    cluster.seed(node("f-claim", true, tainted()));
    cluster.seed(node("f-stay", false, provider_id("fake://f-stay")));
    cluster.seed(node("f-gone", false, provider_id("fake://f-gone")));
    // Metal nodes.
    cluster.seed(node(
        "m-1",
        true,
        with(
            with(tainted(), provider_id("metal://rack1-01")),
            pod_cidr("10.244.2.0/24"),
        ),
    ));
    cluster.seed(node("m-claim", true, tainted()));
    cluster.seed(node(
        "m-label",
        true,
        with(tainted(), platform_label("metal")),
    ));
    // The KEP draft's annotation instead of the label.
    cluster.seed(node(
        "m-annot",
        true,
        with(
            tainted(),
            json!({"metadata": {"annotations": {PLATFORM_ANNOTATION: "metal"}}}),
        ),
    ));
    cluster.seed(node("m-stay", false, provider_id("metal://rack1-05")));
    cluster.seed(node("m-gone", false, provider_id("metal://rack1-04")));
    // Foreign nodes: NotReady, tainted, with a pod CIDR; both clouds say they do not exist.
    let k1 = cluster.seed(node(
        "k-1",
        false,
        with(
            with(tainted(), provider_id("kwok://k-1")),
            pod_cidr("10.244.9.0/24"),
        ),
    ));
    let k_label = cluster.seed(node(
        "k-label",
        false,
        with(tainted(), platform_label("kwok")),
    ));
    // Unclaimed, and no cloud knows it.
    cluster.seed(node("u-1", true, tainted()));
    cluster.seed(lb_service("web", None));
    cluster.seed(lb_service("metal-web", Some("metal-lb")));
    cluster.seed(lb_service("other", Some("someone-else")));

    let host = Host::start(
        &cluster,
        "hybrid",
        &clouds.run_args(&["--load-balancer-class=metal-lb=metal"]),
    );

    eventually(
        "every node handled and both load balancers",
        &[&host],
        || {
            let initialised = |name: &str, pid: &str| -> Result<(), String> {
                let n = cluster.node(name).ok_or(format!("{name} is gone"))?;
                if pid_of(&n) != pid || taint_keys(&n).iter().any(|t| t == TAINT) {
                    return Err(format!(
                        "{name} not initialised: providerID {:?}, taints {:?}",
                        pid_of(&n),
                        taint_keys(&n)
                    ));
                }
                Ok(())
            };
            initialised("f-1", "fake://f-1")?;
            initialised("f-claim", "fake://f-claim")?;
            initialised("m-1", "metal://rack1-01")?;
            initialised("m-claim", "metal://rack1-02")?;
            initialised("m-label", "metal://rack1-03")?;
            initialised("m-annot", "metal://rack1-06")?;
            for gone in ["f-gone", "m-gone"] {
                if cluster.node(gone).is_some() {
                    return Err(format!("{gone} not deleted yet"));
                }
            }
            let web = ingress_ip(&cluster.service("web")).ok_or("web has no ingress")?;
            let metal_web =
                ingress_ip(&cluster.service("metal-web")).ok_or("metal-web has no ingress")?;
            let hosts = fake_lb_hosts(&fake_state, "web").ok_or("no fake LB for web")?;
            if hosts != ["f-1", "f-claim", "f-stay"] {
                return Err(format!("fake LB hosts {hosts:?}"));
            }
            if !cluster
                .events_about("Node", "u-1")
                .iter()
                .any(|e| e.reason == "NoCloudProviderClaimsNode")
            {
                return Err("no NoCloudProviderClaimsNode event on u-1".into());
            }
            let routes = FakeState::read(&fake_state)
                .map_err(|e| e.to_string())?
                .routes;
            if !routes.iter().any(|r| r.target_node == "f-1") {
                return Err(format!("no route for f-1 yet: {routes:?}"));
            }
            Ok((web, metal_web))
        },
    );

    // Further lifecycle passes of both providers over their NotReady nodes that exist: the
    // fake's calls about f-stay, metal's InstanceExists calls from its lifecycle controller.
    let fake_passes = || {
        fake_calls_about(&fake_calls(&fake_state), "f-stay", "fake://f-stay")
            .iter()
            .filter(|c| *c == "instance-exists")
            .count()
    };
    let metal_passes = |host: &Host| {
        metric(
            &host.metrics(),
            "ccm_provider_calls_total",
            &[
                ("method", "InstanceExists"),
                ("caller", "cloud-node-lifecycle-controller"),
                ("provider", "metal"),
            ],
        ) as usize
    };
    let (fake_before, metal_before) = (fake_passes(), metal_passes(&host));
    let fake_metal = eventually("more lifecycle passes", &[], || {
        let (f, m) = (fake_passes(), metal_passes(&host));
        if f >= fake_before + EXTRA_PASSES && m >= metal_before + EXTRA_PASSES {
            Ok((f, m))
        } else {
            Err(format!(
                "fake asked about f-stay {f} times (from {fake_before}), metal lifecycle InstanceExists {m} (from {metal_before})"
            ))
        }
    });
    println!("lifecycle calls: fake about f-stay, metal InstanceExists: {fake_metal:?}");

    // 4. Load balancers by class, each from its provider, with that provider's nodes.
    let web = cluster.service("web");
    let ip = ingress_ip(&web).unwrap();
    assert!(
        in_fake_pool(&ip),
        "web's ingress {ip} is from the fake's pool"
    );
    assert_eq!(
        web["metadata"]["annotations"][LB_PROVIDER_ANNOTATION], "fake",
        "{web}"
    );
    let metal_web = cluster.service("metal-web");
    assert_eq!(ingress_ip(&metal_web).as_deref(), Some("192.0.2.1"));
    assert_eq!(
        metal_web["metadata"]["annotations"][LB_PROVIDER_ANNOTATION], "metal",
        "{metal_web}"
    );
    let allocation = cluster
        .metal_allocation("metal-web")
        .expect("metal's ConfigMap holds metal-web's address");
    assert_eq!(
        allocation["addresses"][0]["ip"], "192.0.2.1",
        "{allocation}"
    );
    assert_eq!(
        cluster.metal_allocation("web"),
        None,
        "metal allocated for web"
    );
    let state = FakeState::read(&fake_state).unwrap();
    assert_eq!(
        state
            .load_balancers
            .iter()
            .map(|lb| lb.service_key())
            .collect::<Vec<_>>(),
        ["default/web"],
        "the fake has only the classless Service's load balancer"
    );
    let other = cluster.service("other");
    assert_eq!(ingress_ip(&other), None, "{other}");
    assert!(other["metadata"]["finalizers"].is_null(), "{other}");
    assert!(
        web["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == LB_FINALIZER)),
        "{web}"
    );

    // Both Services stop being LoadBalancers (type ClusterIP, which clears the class): each
    // load balancer is deleted by the provider that made it, and the other provider's
    // controller, which now sees "needs cleanup" on both, leaves the other's alone.
    for svc in ["web", "metal-web"] {
        cluster.make_cluster_ip(svc);
    }
    eventually(
        "both load balancers cleaned up by their owners",
        &[&host],
        || {
            for svc in ["web", "metal-web"] {
                let s = cluster.service(svc);
                if !s["metadata"]["finalizers"].is_null() || ingress_ip(&s).is_some() {
                    return Err(format!("{svc} not cleaned up yet: {s}"));
                }
            }
            if fake_lb_hosts(&fake_state, "web").is_some() {
                return Err("the fake's load balancer for web still exists".into());
            }
            if cluster.metal_allocation("metal-web").is_some() {
                return Err("metal still holds metal-web's address".into());
            }
            Ok(())
        },
    );

    wait_for_events(
        &cluster,
        &[&host],
        &[
            ("Node", "f-1", "Synced", "cloud-node-controller/fake", ""),
            (
                "Node",
                "f-claim",
                "Synced",
                "cloud-node-controller/fake",
                "",
            ),
            ("Node", "m-1", "Synced", "cloud-node-controller/metal", ""),
            (
                "Node",
                "m-claim",
                "Synced",
                "cloud-node-controller/metal",
                "",
            ),
            (
                "Node",
                "m-label",
                "Synced",
                "cloud-node-controller/metal",
                "",
            ),
            (
                "Node",
                "m-annot",
                "Synced",
                "cloud-node-controller/metal",
                "",
            ),
            (
                "Node",
                "f-claim",
                "CloudProviderClaimedNode",
                "node-ownership-controller",
                "",
            ),
            (
                "Node",
                "m-claim",
                "CloudProviderClaimedNode",
                "node-ownership-controller",
                "",
            ),
            (
                "Node",
                "m-claim",
                "NodeOwnershipUnknown",
                "node-ownership-controller",
                "",
            ),
            (
                "Node",
                "f-gone",
                "DeletingNode",
                "cloud-node-lifecycle-controller/fake",
                "",
            ),
            (
                "Node",
                "m-gone",
                "DeletingNode",
                "cloud-node-lifecycle-controller/metal",
                "",
            ),
            (
                "Service",
                "web",
                "EnsuredLoadBalancer",
                "service-controller/fake",
                "",
            ),
            (
                "Service",
                "web",
                "DeletedLoadBalancer",
                "service-controller/fake",
                "",
            ),
            (
                "Service",
                "metal-web",
                "EnsuredLoadBalancer",
                "service-controller/metal",
                "",
            ),
            (
                "Service",
                "metal-web",
                "DeletedLoadBalancer",
                "service-controller/metal",
                "",
            ),
        ],
    );
    // The whole run, shutdown included: stop the host before looking at what it left.
    assert_eq!(host.stop(), Some(0), "SIGTERM exits 0\n{}", host.tail(40));

    // 1. Each provider initialised its own nodes.
    let n = cluster.node("f-1").unwrap();
    assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("fake.medium"), "{n}");
    assert_eq!(label(&n, ZONE_LABEL), Some("fake-zone-a"), "{n}");
    let n = cluster.node("f-claim").unwrap();
    assert_eq!(
        label(&n, PLATFORM_LABEL),
        Some("fake"),
        "claimed by the first provider that knows it: {n}"
    );
    assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("fake.medium"), "{n}");
    let n = cluster.node("m-1").unwrap();
    assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("r640"), "{n}");
    assert_eq!(label(&n, ZONE_LABEL), Some("rack1"), "{n}");
    let n = cluster.node("m-claim").unwrap();
    assert_eq!(label(&n, PLATFORM_LABEL), Some("metal"), "{n}");
    assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("r640"), "{n}");
    let n = cluster.node("m-label").unwrap();
    assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("r650"), "{n}");

    let components = |name: &str| -> BTreeSet<String> {
        cluster
            .events_about("Node", name)
            .into_iter()
            .map(|e| e.component)
            .collect()
    };
    let unknown: Vec<Event> = cluster
        .events_about("Node", "m-claim")
        .into_iter()
        .filter(|e| e.reason == "NodeOwnershipUnknown")
        .collect();
    assert!(
        !unknown.is_empty()
            && unknown
                .iter()
                .all(|e| e.component == "node-ownership-controller"
                    && e.message
                        .contains("fake could not answer (fake cloud unreachable)")),
        "m-claim: {unknown:#?}"
    );
    for (name, provider) in [("f-claim", "fake"), ("m-claim", "metal")] {
        let events = cluster.events_about("Node", name);
        let claims: Vec<&Event> = events
            .iter()
            .filter(|e| e.reason == "CloudProviderClaimedNode")
            .collect();
        assert!(
            claims.len() == 1
                && claims[0]
                    .message
                    .starts_with(&format!("cloud provider {provider} knows this node")),
            "{name}: {claims:#?}"
        );
    }
    for name in ["f-1", "f-claim", "f-stay", "f-gone"] {
        let c = components(name);
        assert!(
            c.iter().all(|c| !c.ends_with("/metal")),
            "metal acted on the fake's node {name}: {c:?}"
        );
    }
    for name in ["m-1", "m-claim", "m-label", "m-annot", "m-stay", "m-gone"] {
        let c = components(name);
        assert!(
            c.iter().all(|c| !c.ends_with("/fake")),
            "the fake acted on metal's node {name}: {c:?}"
        );
    }
    let calls = fake_calls(&fake_state);
    for (name, pid) in [
        ("m-1", "metal://rack1-01"),
        ("m-label", "metal://rack1-03"),
        ("m-annot", "metal://rack1-06"),
        ("m-stay", "metal://rack1-05"),
        ("m-gone", "metal://rack1-04"),
        ("k-1", "kwok://k-1"),
        ("k-label", ""),
    ] {
        assert_eq!(
            fake_calls_about(&calls, name, pid),
            Vec::<String>::new(),
            "the fake was asked about {name}"
        );
    }
    // The unclaimed nodes: only the ownership question (InstanceExists), answered "no".
    for name in ["m-claim", "u-1"] {
        let about = fake_calls_about(&calls, name, "");
        assert!(
            !about.is_empty() && about.iter().all(|c| c == "instance-exists"),
            "the fake's calls about {name}: {about:?}"
        );
    }

    // 2. The foreign nodes are untouched: the stored objects are the seeded ones.
    assert_eq!(cluster.node("k-1").as_ref(), Some(&k1), "k-1 was changed");
    assert_eq!(
        cluster.node("k-label").as_ref(),
        Some(&k_label),
        "k-label was changed"
    );
    for name in ["k-1", "k-label"] {
        assert_eq!(
            cluster.events_about("Node", name).len(),
            0,
            "events about {name}"
        );
    }
    let routes = FakeState::read(&fake_state).unwrap().routes;
    assert_eq!(
        routes
            .iter()
            .map(|r| r.target_node.as_str())
            .collect::<Vec<_>>(),
        ["f-1"],
        "routes only for the fake's nodes with a pod CIDR"
    );
    // The unclaimed node nobody knows stays as it was, waiting.
    let u1 = cluster.node("u-1").unwrap();
    assert_eq!(pid_of(&u1), "");
    assert_eq!(label(&u1, PLATFORM_LABEL), None);
    assert_eq!(taint_keys(&u1), [TAINT]);
    assert_eq!(
        components("u-1"),
        BTreeSet::from(["node-ownership-controller".to_string()])
    );

    // 3. Deleted by their own provider (the DeletingNode events waited for above); the others
    // never deleted.
    for name in ["f-stay", "m-stay"] {
        let n = cluster
            .node(name)
            .unwrap_or_else(|| panic!("{name} was deleted"));
        assert!(
            !taint_keys(&n).iter().any(|t| t == SHUTDOWN_TAINT),
            "{name}: {n}"
        );
        assert_eq!(components(name), BTreeSet::new(), "events about {name}");
    }

    // 4. Only each Service's own provider acted on it, creation to deletion.
    assert!(
        calls
            .iter()
            .filter_map(|c| c.args["service"].as_str())
            .all(|s| s == "default/web"),
        "the fake was asked about another Service's load balancer"
    );
    let service_components = |name: &str| -> BTreeSet<String> {
        cluster
            .events_about("Service", name)
            .into_iter()
            .map(|e| e.component)
            .collect()
    };
    assert_eq!(
        service_components("web"),
        BTreeSet::from(["service-controller/fake".to_string()])
    );
    assert_eq!(
        service_components("metal-web"),
        BTreeSet::from(["service-controller/metal".to_string()])
    );
    assert_eq!(service_components("other"), BTreeSet::new());
    for (svc, provider) in [("web", "fake"), ("metal-web", "metal")] {
        let events = cluster.events_about("Service", svc);
        assert!(
            events.iter().any(|e| e.reason == "DeletedLoadBalancer"
                && e.component == format!("service-controller/{provider}")),
            "{svc}: {events:#?}"
        );
    }
}

// ---- 3b: --provider-id-grace-period ---------------------------------------------------------

/// With ownership enforced, a node of a provider that has no providerID yet is left alone by
/// the lifecycle controller until `--provider-id-grace-period` after its creation (the
/// controller that may initialise it gets the time to), then handled as upstream: a NotReady
/// node whose instance its own cloud does not know is deleted. A node with a providerID is
/// not covered by the grace period.
#[test]
fn a_node_without_provider_id_is_left_alone_for_the_grace_period() {
    const GRACE: Duration = Duration::from_secs(8);
    let cluster = Cluster::start();
    let clouds = Clouds::write(
        &cluster,
        &["{name: f-1}"],
        "",
        &[
            "{name: m-1, id: rack1-01}",
            "{name: m-gone, id: rack1-04, state: absent}",
        ],
    );
    let fake_state = clouds.fake_state.clone();
    let seeded = Instant::now();
    cluster.seed(node("f-1", true, provider_id("fake://f-1")));
    cluster.seed(node("m-1", true, provider_id("metal://rack1-01")));
    // NotReady, owned by metal through its label, unknown to metal's inventory.
    cluster.seed(node("m-nopid", false, platform_label("metal")));
    cluster.seed(node("m-gone", false, provider_id("metal://rack1-04")));
    let host = Host::start(
        &cluster,
        "grace",
        &clouds.run_args(&[&format!("--provider-id-grace-period={}s", GRACE.as_secs())]),
    );
    eventually("m-gone deleted at once", &[&host], || {
        match cluster.node("m-gone") {
            Some(_) => Err("m-gone not deleted yet".to_string()),
            None => Ok(()),
        }
    });
    let deleted_after =
        eventually(
            "m-nopid deleted after its grace period",
            &[&host],
            || match cluster.node("m-nopid") {
                Some(_) => Err("m-nopid not deleted yet".to_string()),
                None => Ok(seeded.elapsed()),
            },
        );
    // The node was created after `seeded` and seen gone after its deletion: a lower bound,
    // less the resolution of creationTimestamp (whole seconds, as upstream's API server
    // writes it, so a node's age reads up to 1 s more than it is).
    assert!(
        deleted_after >= GRACE - Duration::from_secs(1),
        "m-nopid deleted {deleted_after:?} after it was seeded, within the grace period {GRACE:?}"
    );
    wait_for_events(
        &cluster,
        &[&host],
        &[(
            "Node",
            "m-nopid",
            "DeletingNode",
            "cloud-node-lifecycle-controller/metal",
            "",
        )],
    );
    assert!(
        fake_calls_about(&fake_calls(&fake_state), "m-nopid", "").is_empty(),
        "the fake was asked about metal's node"
    );
    assert_eq!(host.stop(), Some(0), "{}", host.tail(40));
}

/// The first ownership round comes before a provider's controllers start: with the fake slow to
/// answer whether it knows a node (`InstanceExists` takes 2 s), the load balancer of a classless
/// Service is still first built with the fake's nodes claimed in that round, not with no hosts
/// (an `UnAvailableLoadBalancer` warning) to be updated a moment later.
#[test]
fn load_balancers_are_first_built_after_the_unclaimed_nodes_are_claimed() {
    let cluster = Cluster::start();
    let clouds = Clouds::write(
        &cluster,
        &["{name: f-1}", "{name: f-2}"],
        "latency: {InstanceExists: 2s}\n",
        &["{name: m-1, id: rack1-01}"],
    );
    let fake_state = clouds.fake_state.clone();
    cluster.seed(node("f-1", true, tainted()));
    cluster.seed(node("f-2", true, tainted()));
    cluster.seed(node("m-1", true, provider_id("metal://rack1-01")));
    cluster.seed(lb_service("web", None));
    let host = Host::start(&cluster, "first-round", &clouds.run_args(&[]));
    eventually("web's load balancer", &[&host], || {
        ingress_ip(&cluster.service("web")).ok_or_else(|| "web has no ingress".to_string())
    });
    assert_eq!(host.stop(), Some(0), "{}", host.tail(40));
    let calls = fake_calls(&fake_state);
    let first = calls
        .iter()
        .find(|c| c.call == "create")
        .unwrap_or_else(|| panic!("no EnsureLoadBalancer call: {calls:#?}"));
    assert_eq!(
        first.args["hosts"],
        json!(["f-1", "f-2"]),
        "the first EnsureLoadBalancer"
    );
    let unavailable: Vec<Event> = cluster
        .events_about("Service", "web")
        .into_iter()
        .filter(|e| e.reason == "UnAvailableLoadBalancer")
        .collect();
    assert!(unavailable.is_empty(), "{unavailable:#?}");
}

/// The first round is waited for 10 s at most: with the fake's answer held (a `pause` gate on
/// `InstanceExists`), the providers' controllers start after that without the undecided node
/// (one log line), and it joins its provider's load balancer once it is claimed.
#[test]
fn the_first_round_is_waited_for_ten_seconds_at_most() {
    let cluster = Cluster::start();
    let gate = cluster.path("gate-instance-exists");
    std::fs::write(&gate, "").unwrap();
    let clouds = Clouds::write(
        &cluster,
        &["{name: f-1}", "{name: f-2}"],
        &format!("pause: {{InstanceExists: {}}}\n", gate.display()),
        &["{name: m-1, id: rack1-01}"],
    );
    cluster.seed(node(
        "f-1",
        true,
        with(tainted(), provider_id("fake://f-1")),
    ));
    cluster.seed(node("f-2", true, tainted()));
    cluster.seed(lb_service("web", None));
    let host = Host::start(
        &cluster,
        "held-round",
        &clouds.run_args(&["--provider-call-timeout=10m"]),
    );
    let hosts = || fake_lb_hosts(&clouds.fake_state, "web").unwrap_or_default();
    eventually(
        "f-1 initialised and web built without the held node",
        &[&host],
        || {
            let f1 = cluster.node("f-1").ok_or("f-1 is gone")?;
            if taint_keys(&f1).iter().any(|k| k == TAINT) {
                return Err("f-1 still tainted".to_string());
            }
            match hosts().as_slice() {
                [one] if one == "f-1" => Ok(()),
                other => Err(format!("fake LB hosts {other:?}")),
            }
        },
    );
    assert!(
        host.read_log().contains(
            "1 node(s) unclaimed at start still undecided after 10s: the cloud providers' \
             controllers start without them"
        ),
        "{}",
        host.tail(40)
    );
    std::fs::remove_file(&gate).unwrap();
    eventually("f-2 claimed and a host of web", &[&host], || {
        match hosts().as_slice() {
            [a, b] if a == "f-1" && b == "f-2" => Ok(()),
            other => Err(format!("fake LB hosts {other:?}")),
        }
    });
    assert_eq!(host.stop(), Some(0), "{}", host.tail(40));
}

// ---- 4b: --load-balancer-hosts NAME=all -------------------------------------------------------

/// `--load-balancer-hosts fake=all`: the fake's load balancer gets every node upstream's host
/// predicates accept, whoever owns it (metal's, a foreign one, an unclaimed one), and none that
/// they exclude; the foreign node still is not written to.
#[test]
fn load_balancer_hosts_all_hands_the_provider_every_eligible_node() {
    let cluster = Cluster::start();
    let clouds = Clouds::write(
        &cluster,
        &["{name: f-1}", "{name: f-x}"],
        "",
        &["{name: m-1, id: rack1-01}"],
    );
    let fake_state = clouds.fake_state.clone();
    let excluded = json!({"metadata": {"labels": {EXCLUDE_LB_LABEL: "true"}}});
    cluster.seed(node("f-1", true, provider_id("fake://f-1")));
    cluster.seed(node(
        "f-x",
        true,
        with(provider_id("fake://f-x"), excluded.clone()),
    ));
    cluster.seed(node("m-1", true, provider_id("metal://rack1-01")));
    let k1 = cluster.seed(node("k-1", true, provider_id("kwok://k-1")));
    cluster.seed(node("k-x", true, with(provider_id("kwok://k-x"), excluded)));
    // Unclaimed but not waiting for a cloud provider (no taint): nobody claims it.
    cluster.seed(node("u-1", true, json!({})));
    cluster.seed(lb_service("web", None));
    cluster.seed(lb_service("metal-web", Some("metal-lb")));

    let host = Host::start(
        &cluster,
        "all-hosts",
        &clouds.run_args(&[
            "--load-balancer-class=metal-lb=metal",
            "--load-balancer-hosts=fake=all",
        ]),
    );
    eventually(
        "the fake's load balancer with every eligible node",
        &[&host],
        || {
            let hosts = fake_lb_hosts(&fake_state, "web").ok_or("no fake LB for web")?;
            if hosts != ["f-1", "k-1", "m-1", "u-1"] {
                return Err(format!("fake LB hosts {hosts:?}"));
            }
            ingress_ip(&cluster.service("web")).ok_or("web has no ingress")?;
            ingress_ip(&cluster.service("metal-web")).ok_or("metal-web has no ingress")?;
            Ok(())
        },
    );
    assert_eq!(host.stop(), Some(0), "SIGTERM exits 0\n{}", host.tail(40));
    assert_eq!(cluster.node("k-1").as_ref(), Some(&k1), "k-1 was changed");
    assert_eq!(
        cluster.node("u-1").unwrap()["metadata"]["labels"],
        Value::Null
    );
    let calls = fake_calls(&fake_state);
    for (name, pid) in [("k-1", "kwok://k-1"), ("m-1", "metal://rack1-01")] {
        let about: BTreeSet<String> = fake_calls_about(&calls, name, pid).into_iter().collect();
        assert!(
            about.iter().all(|c| c == "create" || c == "update"),
            "the fake was asked about {name} other than as a load-balancer host: {about:?}"
        );
    }
}

/// Ownership that users cannot forge (issue 28): whoever may edit a Service rewrites its
/// `ccm-host/load-balancer-provider` annotation from metal to fake and deletes it. The owner
/// stays metal (the host's record in status, and the class): metal releases its address and
/// drops the finalizer, with a Warning event saying the annotation was ignored; the fake is
/// never asked about the Service. A node that names its platform by its own annotation is
/// claimed with an event naming that annotation.
#[test]
fn a_rewritten_provider_annotation_does_not_move_a_load_balancers_cleanup() {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{DeleteParams, Patch, PatchParams};
    let cluster = Cluster::start();
    let clouds = Clouds::write(
        &cluster,
        &["{name: f-1}"],
        "",
        &["{name: m-1, id: rack1-01}", "{name: m-2, id: rack1-02}"],
    );
    cluster.seed(node("f-1", true, provider_id("fake://f-1")));
    cluster.seed(node("m-1", true, provider_id("metal://rack1-01")));
    cluster.seed(node(
        "m-2",
        true,
        with(
            tainted(),
            json!({"metadata": {"annotations": {PLATFORM_ANNOTATION: "metal"}}}),
        ),
    ));
    cluster.seed(lb_service("metal-web", Some("metal-lb")));
    let host = Host::start(
        &cluster,
        "hijack",
        &clouds.run_args(&["--load-balancer-class=metal-lb=metal"]),
    );
    let ip = eventually("metal's load balancer and its record", &[&host], || {
        let svc = cluster.service("metal-web");
        let ip = ingress_ip(&svc).ok_or("metal-web has no ingress")?;
        cluster
            .metal_allocation("metal-web")
            .ok_or("no metal allocation")?;
        let recorded = svc["status"]["conditions"]
            .as_array()
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == "ccm-host/LoadBalancerProvider")
            })
            .map(|c| c["message"].clone());
        if recorded != Some(json!("metal")) {
            return Err(format!("no record of the owner in status: {recorded:?}"));
        }
        Ok(ip)
    });
    assert!(!in_fake_pool(&ip), "{ip} is metal's");
    // The node that names its platform by annotation was claimed with an event saying so.
    wait_for_events(
        &cluster,
        &[&host],
        &[("Node", "m-2", "CloudProviderClaimedNode", "", "")],
    );
    let claimed = cluster
        .events_about("Node", "m-2")
        .into_iter()
        .find(|e| e.reason == "CloudProviderClaimedNode")
        .unwrap();
    assert!(
        claimed.message.contains("metal")
            && claimed
                .message
                .contains(&format!("annotation {PLATFORM_ANNOTATION}=metal")),
        "{claimed:?}"
    );

    // The hijack: the annotation names the fake, then the Service is deleted.
    let api: kube::Api<Service> = kube::Api::namespaced(cluster.server.client(), "default");
    let body = json!({"metadata": {"annotations": {LB_PROVIDER_ANNOTATION: "fake"}}});
    cluster
        .rt
        .block_on(api.patch("metal-web", &PatchParams::default(), &Patch::Merge(&body)))
        .unwrap();
    cluster
        .rt
        .block_on(api.delete("metal-web", &DeleteParams::default()))
        .unwrap();
    eventually(
        "metal-web gone and metal's address released",
        &[&host],
        || {
            if cluster
                .ctl
                .get("services", "default", "metal-web")
                .is_some()
            {
                return Err("metal-web still exists".into());
            }
            if let Some(a) = cluster.metal_allocation("metal-web") {
                return Err(format!("metal still allocates {a}"));
            }
            Ok(())
        },
    );
    wait_for_events(
        &cluster,
        &[&host],
        &[
            (
                "Service",
                "metal-web",
                "LoadBalancerProviderAnnotationIgnored",
                "service-controller/metal",
                "",
            ),
            (
                "Service",
                "metal-web",
                "DeletedLoadBalancer",
                "service-controller/metal",
                "",
            ),
        ],
    );
    assert_eq!(host.stop(), Some(0), "SIGTERM exits 0\n{}", host.tail(40));
    let events = cluster.events_about("Service", "metal-web");
    assert!(
        events.iter().all(|e| !e.component.ends_with("/fake")),
        "the fake acted on metal-web: {events:?}"
    );
    let asked: Vec<String> = fake_calls(&clouds.fake_state)
        .iter()
        .filter(|c| c.args["service"] == "default/metal-web")
        .map(|c| c.call.clone())
        .collect();
    assert!(
        asked.is_empty(),
        "the fake was asked about metal-web: {asked:?}"
    );
}

// ---- 5: flags ----------------------------------------------------------------------------------

/// `ccm-host run` with `args` (and the cluster's plugin directory) until it exits: (exit code,
/// the `error:` lines of stderr, stderr).
fn run_to_exit(cluster: &Cluster, args: &[&str]) -> (Option<i32>, Vec<String>, String) {
    let out = Command::new(BIN)
        .arg("run")
        .arg("--plugin-dir")
        .arg(&cluster.plugins)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["--secure-port=0", "--leader-elect=false"])
        .args(args)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let errors = stderr
        .lines()
        .filter(|l| l.starts_with("error"))
        .map(str::to_string)
        .collect();
    (out.status.code(), errors, stderr)
}

/// Two providers claiming one platform are refused at start (exit 2, one line naming both),
/// whether `--cloud-provider-platforms` says so or the providers declare it; so is a
/// load-balancer class mapped to a provider that is not running. Nothing is written to the
/// cluster.
#[test]
fn a_duplicate_platform_claim_and_an_unknown_class_provider_are_refused_with_exit_2() {
    let cluster = Cluster::start();
    cluster.seed(node(
        "f-1",
        true,
        with(tainted(), provider_id("fake://f-1")),
    ));
    let requests_before = cluster.ctl.requests().len();

    let (code, errors, stderr) = run_to_exit(
        &cluster,
        &[
            "--cloud-provider=fake,fake-v1",
            "--cloud-provider-platforms=fake=fake,fake-v1=fake",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        errors,
        ["error: providers fake and fake-v1 both claim the platform fake://: a node's owner must \
          be unique (set --cloud-provider-platforms to split them)"],
        "{stderr}"
    );

    // Declared, not configured: fake-v1 named `fake` by its config owns fake:// as well.
    let v1_config = cluster.path("fake-v1.yaml");
    std::fs::write(&v1_config, "providerName: fake\n").unwrap();
    let (code, errors, stderr) = run_to_exit(
        &cluster,
        &[
            "--cloud-provider=fake,fake-v1",
            &format!("--cloud-config=fake-v1={}", v1_config.display()),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].starts_with("error: providers fake and fake-v1 both claim the platform fake://"),
        "{stderr}"
    );

    let (code, errors, stderr) = run_to_exit(
        &cluster,
        &[
            "--cloud-provider=fake,metal",
            "--load-balancer-class=x=nope",
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        errors,
        ["error: --load-balancer-class x=nope: nope is not one of --cloud-provider (fake,metal)"],
        "{stderr}"
    );

    // A per-provider value without its provider's name, with several providers.
    let (code, errors, stderr) = run_to_exit(
        &cluster,
        &[
            "--cloud-provider=fake,metal",
            &format!("--cloud-config={}", v1_config.display()),
        ],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("with several providers (fake,metal) write NAME=VALUE"),
        "{stderr}"
    );

    // None of them got as far as the cluster.
    let writes: Vec<String> = cluster.ctl.requests()[requests_before..]
        .iter()
        .filter(|r| r.verb != "get" && r.verb != "list" && r.verb != "watch")
        .map(|r| format!("{} {}", r.verb, r.path))
        .collect();
    assert_eq!(writes, Vec::<String>::new());
}

// ---- 6: one host per provider ----------------------------------------------------------------

/// The isolation recipe: two hosts against one API server, one provider each, each with its
/// own lease: the fake (`--cloud-provider-platforms fake`, classless Services) and metal
/// (`--cloud-provider-platforms metal --load-balancer-class metal-lb
/// --ignore-classless-services`). Both lead; each initialises, re-addresses and deletes only
/// its own nodes (the other's NotReady nodes, that its cloud says do not exist, survive many
/// lifecycle passes); each Service gets its load balancer from its own provider with that
/// provider's nodes; the foreign node stays as seeded. Events name the host that wrote them
/// (`source.host` is the host's lease identity).
#[test]
fn two_hosts_with_one_provider_each_never_touch_each_others_nodes_or_load_balancers() {
    let cluster = Cluster::start();
    let clouds = Clouds::write(&cluster, &[
            "{name: f-1}",
            "{name: f-label}",
            "{name: f-stay}",
            "{name: f-gone, exists: false}",
        ], "", &[
            "{name: m-1, id: rack1-01, instanceType: r640, addresses: [{type: InternalIP, address: 10.10.0.1}]}",
            "{name: m-claim, id: rack1-02, addresses: [{type: InternalIP, address: 10.10.0.2}]}",
            "{name: m-label, id: rack1-03, addresses: [{type: InternalIP, address: 10.10.0.3}]}",
            "{name: m-gone, id: rack1-04, state: absent}",
            "{name: m-stay, id: rack1-05, addresses: [{type: InternalIP, address: 10.10.0.5}]}",
        ]);
    let fake_state = clouds.fake_state.clone();
    cluster.seed(node(
        "f-1",
        true,
        with(
            with(tainted(), provider_id("fake://f-1")),
            pod_cidr("10.244.1.0/24"),
        ),
    ));
    cluster.seed(node(
        "f-label",
        true,
        with(tainted(), platform_label("fake")),
    ));
    cluster.seed(node("f-stay", false, provider_id("fake://f-stay")));
    cluster.seed(node("f-gone", false, provider_id("fake://f-gone")));
    cluster.seed(node(
        "m-1",
        true,
        with(
            with(tainted(), provider_id("metal://rack1-01")),
            pod_cidr("10.244.2.0/24"),
        ),
    ));
    cluster.seed(node(
        "m-label",
        true,
        with(tainted(), platform_label("metal")),
    ));
    cluster.seed(node("m-claim", true, tainted()));
    cluster.seed(node("m-stay", false, provider_id("metal://rack1-05")));
    cluster.seed(node("m-gone", false, provider_id("metal://rack1-04")));
    let k1 = cluster.seed(node(
        "k-1",
        false,
        with(
            with(tainted(), provider_id("kwok://k-1")),
            pod_cidr("10.244.9.0/24"),
        ),
    ));
    cluster.seed(lb_service("web", None));
    cluster.seed(lb_service("metal-web", Some("metal-lb")));

    let fake_host = Host::start(
        &cluster,
        "fake-host",
        &strings(&[
            "--cloud-provider=fake",
            &format!("--cloud-config={}", clouds.fake_config.display()),
            "--cloud-provider-platforms=fake",
            "--leader-elect-resource-name=ccm-fake",
            "--cluster-cidr=10.244.0.0/16",
        ]),
    );
    let metal_host = Host::start(
        &cluster,
        "metal-host",
        &strings(&[
            "--cloud-provider=metal",
            &format!("--cloud-config={}", clouds.metal_config.display()),
            "--cloud-provider-platforms=metal",
            "--load-balancer-class=metal-lb",
            "--ignore-classless-services",
            "--leader-elect-resource-name=ccm-metal",
        ]),
    );

    let (fake_id, metal_id) = eventually(
        "both hosts lead and every node is handled",
        &[&fake_host, &metal_host],
        || {
            let fake_id = cluster
                .lease_holder("ccm-fake")
                .ok_or("ccm-fake not held")?;
            let metal_id = cluster
                .lease_holder("ccm-metal")
                .ok_or("ccm-metal not held")?;
            for (name, pid) in [
                ("f-1", "fake://f-1"),
                ("f-label", "fake://f-label"),
                ("m-1", "metal://rack1-01"),
                ("m-label", "metal://rack1-03"),
                ("m-claim", "metal://rack1-02"),
            ] {
                let n = cluster.node(name).ok_or(format!("{name} is gone"))?;
                if pid_of(&n) != pid || taint_keys(&n).iter().any(|t| t == TAINT) {
                    return Err(format!(
                        "{name} not initialised: providerID {:?}, taints {:?}",
                        pid_of(&n),
                        taint_keys(&n)
                    ));
                }
            }
            for gone in ["f-gone", "m-gone"] {
                if cluster.node(gone).is_some() {
                    return Err(format!("{gone} not deleted yet"));
                }
            }
            ingress_ip(&cluster.service("web")).ok_or("web has no ingress")?;
            ingress_ip(&cluster.service("metal-web")).ok_or("metal-web has no ingress")?;
            let hosts = fake_lb_hosts(&fake_state, "web").ok_or("no fake LB for web")?;
            if hosts != ["f-1", "f-label", "f-stay"] {
                return Err(format!("fake LB hosts {hosts:?}"));
            }
            Ok((fake_id, metal_id))
        },
    );
    assert_ne!(fake_id, metal_id);
    assert_eq!(
        cluster.lease_holder("cloud-controller-manager"),
        None,
        "neither host used the default lease"
    );

    // More lifecycle passes of both hosts over the NotReady nodes they own.
    let fake_passes = || {
        fake_calls_about(&fake_calls(&fake_state), "f-stay", "fake://f-stay")
            .iter()
            .filter(|c| *c == "instance-exists")
            .count()
    };
    let metal_passes = |host: &Host| {
        metric(
            &host.metrics(),
            "ccm_provider_calls_total",
            &[
                ("method", "InstanceExists"),
                ("caller", "cloud-node-lifecycle-controller"),
            ],
        ) as usize
    };
    let (fake_before, metal_before) = (fake_passes(), metal_passes(&metal_host));
    eventually("more lifecycle passes", &[], || {
        let (f, m) = (fake_passes(), metal_passes(&metal_host));
        if f >= fake_before + EXTRA_PASSES && m >= metal_before + EXTRA_PASSES {
            Ok(())
        } else {
            Err(format!(
                "fake asked about f-stay {f} times (from {fake_before}), metal lifecycle InstanceExists {m} (from {metal_before})"
            ))
        }
    });
    // Services: each from its own provider, written by its own host.
    let web = cluster.service("web");
    assert!(in_fake_pool(&ingress_ip(&web).unwrap()), "{web}");
    assert_eq!(
        web["metadata"]["annotations"][LB_PROVIDER_ANNOTATION],
        "fake"
    );
    let metal_web = cluster.service("metal-web");
    assert_eq!(ingress_ip(&metal_web).as_deref(), Some("192.0.2.1"));
    assert_eq!(
        metal_web["metadata"]["annotations"][LB_PROVIDER_ANNOTATION],
        "metal"
    );
    assert!(cluster.metal_allocation("metal-web").is_some());
    assert_eq!(cluster.metal_allocation("web"), None);
    assert_eq!(
        FakeState::read(&fake_state)
            .unwrap()
            .load_balancers
            .iter()
            .map(|lb| lb.service_key())
            .collect::<Vec<_>>(),
        ["default/web"]
    );

    // Both Services turn ClusterIP: each host deletes its own load balancer and leaves the
    // other's Service alone (ccm-host/load-balancer-provider names the owner).
    for svc in ["web", "metal-web"] {
        cluster.make_cluster_ip(svc);
    }
    eventually(
        "both load balancers cleaned up by their owners",
        &[&fake_host, &metal_host],
        || {
            for svc in ["web", "metal-web"] {
                let s = cluster.service(svc);
                if !s["metadata"]["finalizers"].is_null() || ingress_ip(&s).is_some() {
                    return Err(format!("{svc} not cleaned up yet: {s}"));
                }
            }
            if fake_lb_hosts(&fake_state, "web").is_some() {
                return Err("the fake's load balancer for web still exists".into());
            }
            if cluster.metal_allocation("metal-web").is_some() {
                return Err("metal still holds metal-web's address".into());
            }
            Ok(())
        },
    );

    wait_for_events(
        &cluster,
        &[&fake_host, &metal_host],
        &[
            ("Node", "f-1", "Synced", "cloud-node-controller", &fake_id),
            (
                "Node",
                "f-label",
                "Synced",
                "cloud-node-controller",
                &fake_id,
            ),
            ("Node", "m-1", "Synced", "cloud-node-controller", &metal_id),
            (
                "Node",
                "m-label",
                "Synced",
                "cloud-node-controller",
                &metal_id,
            ),
            (
                "Node",
                "m-claim",
                "Synced",
                "cloud-node-controller",
                &metal_id,
            ),
            (
                "Node",
                "m-claim",
                "CloudProviderClaimedNode",
                "node-ownership-controller",
                &metal_id,
            ),
            (
                "Node",
                "f-gone",
                "DeletingNode",
                "cloud-node-lifecycle-controller",
                &fake_id,
            ),
            (
                "Node",
                "m-gone",
                "DeletingNode",
                "cloud-node-lifecycle-controller",
                &metal_id,
            ),
            (
                "Service",
                "web",
                "EnsuredLoadBalancer",
                "service-controller",
                &fake_id,
            ),
            (
                "Service",
                "web",
                "DeletedLoadBalancer",
                "service-controller",
                &fake_id,
            ),
            (
                "Service",
                "metal-web",
                "EnsuredLoadBalancer",
                "service-controller",
                &metal_id,
            ),
            (
                "Service",
                "metal-web",
                "DeletedLoadBalancer",
                "service-controller",
                &metal_id,
            ),
        ],
    );
    assert_eq!(
        fake_host.stop(),
        Some(0),
        "SIGTERM exits 0\n{}",
        fake_host.tail(40)
    );
    assert_eq!(
        metal_host.stop(),
        Some(0),
        "SIGTERM exits 0\n{}",
        metal_host.tail(40)
    );

    // Nodes: each host wrote events only about its own nodes, and the nodes carry what its
    // cloud says.
    let events = |name: &str| cluster.events_about("Node", name);
    for name in ["f-1", "f-label"] {
        let n = cluster.node(name).unwrap();
        assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("fake.medium"), "{n}");
        assert!(
            events(name)
                .iter()
                .any(|e| e.reason == "Synced" && e.host == fake_id),
            "{name}: {:#?}",
            events(name)
        );
    }
    let n = cluster.node("m-1").unwrap();
    assert_eq!(label(&n, INSTANCE_TYPE_LABEL), Some("r640"), "{n}");
    assert_eq!(
        label(&cluster.node("m-claim").unwrap(), PLATFORM_LABEL),
        Some("metal")
    );
    for name in ["m-1", "m-label", "m-claim"] {
        assert!(
            events(name)
                .iter()
                .any(|e| e.reason == "Synced" && e.host == metal_id),
            "{name}: {:#?}",
            events(name)
        );
    }
    for name in ["f-1", "f-label", "f-stay", "f-gone"] {
        let foreign: Vec<Event> = events(name)
            .into_iter()
            .filter(|e| e.host != fake_id)
            .collect();
        assert!(foreign.is_empty(), "the metal host on {name}: {foreign:#?}");
    }
    for name in ["m-1", "m-label", "m-claim", "m-stay", "m-gone"] {
        // The fake host may have asked its own cloud about the unclaimed m-claim before metal
        // claimed it, and said so; nothing else.
        let foreign: Vec<Event> = events(name)
            .into_iter()
            .filter(|e| e.host != metal_id)
            .filter(|e| !(name == "m-claim" && e.reason == "NoCloudProviderClaimsNode"))
            .collect();
        assert!(foreign.is_empty(), "the fake host on {name}: {foreign:#?}");
    }
    assert!(events("f-gone")
        .iter()
        .any(|e| e.reason == "DeletingNode" && e.host == fake_id));
    assert!(events("m-gone")
        .iter()
        .any(|e| e.reason == "DeletingNode" && e.host == metal_id));
    for name in ["f-stay", "m-stay"] {
        assert!(cluster.node(name).is_some(), "{name} was deleted");
        assert!(events(name).is_empty(), "{name}: {:#?}", events(name));
    }
    assert_eq!(cluster.node("k-1").as_ref(), Some(&k1), "k-1 was changed");
    assert!(events("k-1").is_empty(), "{:#?}", events("k-1"));
    let calls = fake_calls(&fake_state);
    let fake_pid = calls.first().map(|c| c.pid);
    assert!(calls.iter().all(|c| Some(c.pid) == fake_pid));
    for (name, pid) in [
        ("m-1", "metal://rack1-01"),
        ("m-label", ""),
        ("m-stay", "metal://rack1-05"),
        ("m-gone", "metal://rack1-04"),
        ("k-1", "kwok://k-1"),
    ] {
        assert_eq!(
            fake_calls_about(&calls, name, pid),
            Vec::<String>::new(),
            "the fake was asked about {name}"
        );
    }
    let about = fake_calls_about(&calls, "m-claim", "");
    assert!(
        about.iter().all(|c| c == "instance-exists"),
        "the fake's calls about m-claim: {about:?}"
    );
    assert_eq!(
        FakeState::read(&fake_state)
            .unwrap()
            .routes
            .iter()
            .map(|r| r.target_node.as_str())
            .collect::<Vec<_>>(),
        ["f-1"]
    );

    for (svc, id) in [("web", &fake_id), ("metal-web", &metal_id)] {
        let events = cluster.events_about("Service", svc);
        assert!(
            !events.is_empty() && events.iter().all(|e| &e.host == id),
            "{svc}: {events:#?}"
        );
        assert!(
            events.iter().any(|e| e.reason == "DeletedLoadBalancer"),
            "{svc}: {events:#?}"
        );
    }
    assert!(
        fake_calls(&fake_state)
            .iter()
            .filter_map(|c| c.args["service"].as_str())
            .all(|s| s == "default/web"),
        "the fake was asked about another Service's load balancer"
    );
}

// ---- 7: metrics and health per provider --------------------------------------------------------

/// The names of the metric families of an exposition, one per `# TYPE` line, in order.
fn type_lines(body: &str) -> Vec<&str> {
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect()
}

/// The family (`# TYPE` name) each sample line belongs to.
fn family_of_samples<'a>(body: &'a str, sample: &str) -> Vec<&'a str> {
    let mut family = "";
    let mut out = Vec::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().unwrap_or_default();
        } else if line.starts_with(&format!("{sample}{{")) {
            out.push(family);
        }
    }
    out
}

/// A host of three providers (fake, metal, fake-v1): `/metrics` has each `ccm_provider_*`
/// metric once, its series told apart by `provider`; the work queues are named per provider;
/// `/healthz` has `cloud-provider-calls-<name>` for each and `/readyz` has
/// `cloud-provider-<name>` for each provider with a health probe (metal has none), reporting
/// each on its own: the fake's failing probe fails `/readyz`, fake-v1's passes.
#[test]
fn metrics_and_health_checks_are_per_provider() {
    let cluster = Cluster::start();
    let clouds = Clouds::write(
        &cluster,
        &["{name: f-1}"],
        "health: {kind: unauthorized, message: credentials rejected}\n",
        &["{name: m-1, id: rack1-01}"],
    );
    cluster.seed(node(
        "f-1",
        true,
        with(tainted(), provider_id("fake://f-1")),
    ));
    cluster.seed(node(
        "m-1",
        true,
        with(tainted(), provider_id("metal://rack1-01")),
    ));
    // Unclaimed; only fake-v1 (no config: it knows every node) says yes, through the legacy
    // Instances (InstanceID), as the third provider asked.
    cluster.seed(node("v1-node", true, tainted()));
    let host = Host::start(
        &cluster,
        "metrics",
        &clouds.run_args_for("fake,metal,fake-v1", &[]),
    );
    let providers = ["fake", "metal", "fake-v1"];
    let body = eventually("every provider's calls in /metrics", &[&host], || {
        let body = match host.get("/metrics") {
            Some((200, body)) => body,
            other => return Err(format!("/metrics: {other:?}")),
        };
        for p in providers {
            if metric(
                &body,
                "ccm_provider_calls_total",
                &[("method", "Initialize"), ("provider", p)],
            ) < 1.0
            {
                return Err(format!("no Initialize call of {p} yet"));
            }
        }
        for p in ["fake", "metal"] {
            if metric(
                &body,
                "ccm_provider_calls_total",
                &[("method", "InstanceMetadata"), ("provider", p)],
            ) < 1.0
            {
                return Err(format!("no InstanceMetadata call of {p} yet"));
            }
            if !body.contains(&format!("workqueue_adds_total{{name=\"Nodes/{p}\"}}")) {
                return Err(format!("no Nodes/{p} queue yet"));
            }
        }
        let v1 = cluster.node("v1-node").ok_or("v1-node is gone")?;
        if pid_of(&v1) != "fake-v1://v1-node" || label(&v1, PLATFORM_LABEL) != Some("fake-v1") {
            return Err(format!(
                "v1-node not claimed and initialised by fake-v1: {v1}"
            ));
        }
        Ok(body)
    });
    let types = type_lines(&body);
    let unique: BTreeSet<&str> = types.iter().copied().collect();
    assert_eq!(
        types.len(),
        unique.len(),
        "a metric family is written twice:\n{body}"
    );
    let families: BTreeSet<&str> = family_of_samples(&body, "ccm_provider_calls_total")
        .into_iter()
        .collect();
    assert_eq!(families.len(), 1, "{families:?}\n{body}");
    let family = *families.iter().next().unwrap();
    assert_eq!(
        body.lines()
            .filter(|l| l.starts_with(&format!("# TYPE {family} ")))
            .count(),
        1
    );
    assert!(
        body.lines()
            .filter(|l| l.starts_with("ccm_provider_calls_total{"))
            .all(|l| providers
                .iter()
                .any(|p| l.contains(&format!("provider=\"{p}\"")))),
        "a ccm_provider_calls_total series without its provider:\n{body}"
    );

    for p in providers {
        let path = format!("/healthz/cloud-provider-calls-{p}");
        assert_eq!(host.get(&path), Some((200, "ok".to_string())), "{path}");
    }
    assert_eq!(
        host.get("/healthz/cloud-provider-calls").map(|(c, _)| c),
        Some(404)
    );
    let readyz = eventually(
        "/readyz reports the providers' probes",
        &[&host],
        || match host.get("/readyz") {
            Some((503, body))
                if body.contains("[-]cloud-provider-fake failed: reason withheld")
                    && body.contains("[+]cloud-provider-fake-v1 ok")
                    && !body.contains("cloud-provider-metal") =>
            {
                Ok(body)
            }
            other => Err(format!("/readyz: {other:?}")),
        },
    );
    assert!(!readyz.contains("credentials rejected"), "{readyz}");
    let (code, reason) = host.get("/readyz/cloud-provider-fake").unwrap();
    assert_eq!(code, 503);
    assert!(reason.contains("credentials rejected"), "{reason}");
    assert_eq!(
        host.get("/readyz/cloud-provider-fake-v1"),
        Some((200, "ok".to_string()))
    );
    assert_eq!(
        host.get("/readyz/cloud-provider-metal").map(|(c, _)| c),
        Some(404),
        "metal offers no health probe"
    );
    assert_eq!(host.stop(), Some(0), "SIGTERM exits 0\n{}", host.tail(40));
}

/// One host per provider, and a node without providerID or label that both clouds know: the
/// first claim wins, because the other host then sees the node as owned. Here metal's claim is
/// written while the fake host's question to its cloud is held (a `pause` gate), so the fake
/// host's "yes" comes after metal's label: it must not overwrite it.
#[test]
fn two_hosts_that_both_know_an_unclaimed_node_keep_the_first_claim() {
    let cluster = Cluster::start();
    let gate = cluster.path("gate-instance-exists");
    std::fs::write(&gate, "").unwrap();
    let clouds = Clouds::write(
        &cluster,
        &["{name: dual}"],
        &format!("pause: {{InstanceExists: {}}}\n", gate.display()),
        &["{name: dual, id: rack9-01, instanceType: r640}"],
    );
    let fake_state = clouds.fake_state.clone();
    cluster.seed(node("dual", true, tainted()));
    let fake_host = Host::start(
        &cluster,
        "fake-host",
        &strings(&[
            "--cloud-provider=fake",
            &format!("--cloud-config={}", clouds.fake_config.display()),
            "--cloud-provider-platforms=fake",
            "--leader-elect-resource-name=ccm-fake",
            "--configure-cloud-routes=false",
            // The held question must outlast the rest of the test, not time out and be
            // asked again.
            "--provider-call-timeout=10m",
        ]),
    );
    // The fake host asks first (its cloud holds the answer), so that it decides on the node
    // as it was before metal's claim.
    eventually(
        "the fake host asking its cloud about dual",
        &[&fake_host],
        || {
            let asked = fake_calls_about(&fake_calls(&fake_state), "dual", "");
            if asked.iter().any(|c| c == "instance-exists") {
                Ok(())
            } else {
                Err(format!("the fake's calls about dual: {asked:?}"))
            }
        },
    );
    let metal_host = Host::start(
        &cluster,
        "metal-host",
        &strings(&[
            "--cloud-provider=metal",
            &format!("--cloud-config={}", clouds.metal_config.display()),
            "--cloud-provider-platforms=metal",
            "--ignore-classless-services",
            "--leader-elect-resource-name=ccm-metal",
        ]),
    );
    eventually(
        "metal's claim while the fake host waits for its cloud",
        &[&fake_host, &metal_host],
        || {
            let n = cluster.node("dual").ok_or("dual is gone")?;
            if label(&n, PLATFORM_LABEL) != Some("metal") || pid_of(&n) != "metal://rack9-01" {
                return Err(format!("dual not claimed and initialised by metal: {n}"));
            }
            Ok(())
        },
    );
    wait_for_events(
        &cluster,
        &[&fake_host, &metal_host],
        &[(
            "Node",
            "dual",
            "CloudProviderClaimedNode",
            "node-ownership-controller",
            "",
        )],
    );
    // The fake's cloud answers "yes, I know dual" now, after metal's claim.
    std::fs::remove_file(&gate).unwrap();
    eventually(
        "the fake host's claim round for dual to end",
        &[&fake_host, &metal_host],
        || {
            let log = fake_host.read_log();
            let done = log.lines().any(|l| {
                l.contains("dual")
                    && (l.contains("cloud provider fake knows this node")
                        || l.contains("was claimed while the providers were asked"))
            });
            done.then_some(()).ok_or_else(|| "not yet".to_string())
        },
    );
    let n = cluster.node("dual").unwrap();
    assert_eq!(
        label(&n, PLATFORM_LABEL),
        Some("metal"),
        "the first claim stays: {n}"
    );
    assert_eq!(pid_of(&n), "metal://rack9-01", "{n}");
    let claims: Vec<Event> = cluster
        .events_about("Node", "dual")
        .into_iter()
        .filter(|e| e.reason == "CloudProviderClaimedNode")
        .collect();
    assert_eq!(claims.len(), 1, "one claim: {claims:#?}");
    assert!(claims[0].message.contains("metal"), "{claims:#?}");
    assert_eq!(fake_host.stop(), Some(0), "{}", fake_host.tail(40));
    assert_eq!(metal_host.stop(), Some(0), "{}", metal_host.tail(40));
}
