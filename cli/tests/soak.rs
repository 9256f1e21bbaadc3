//! Reliability soak: two `ccm-host run` replicas with leader election against the in-memory API
//! server and one shared fake cloud, while nodes and LoadBalancer services are created, changed
//! and deleted continuously and faults are injected on both sides:
//!
//! - API server: watch drops, expired watches (410 after a compaction), 5xx and 429 bursts
//!   (429 with Retry-After), forced write conflicts, latency;
//! - fake cloud (its control file): errors, RetryAfter errors, latency, panics, hangs (calls that
//!   only end at the host's call timeout);
//! - the leader is killed with SIGKILL at random times and restarted as a new process;
//! - a burst: a third into the churn, many Ready nodes and LoadBalancer services arrive at once.
//!
//! The replicas run with the default client limits (`--kube-api-qps 20 --kube-api-burst 30`), so
//! the burst builds up a backlog of API requests in the controllers' clients, as in the field.
//!
//! When churn and faults stop, it waits for the system to converge (polling, generous deadline,
//! no timing assertions) and checks: every live tainted node initialised, every Ready node kept
//! (the host deleted only NotReady nodes whose instance is gone), every LoadBalancer service has
//! the cloud's status, the cloud holds exactly one load balancer per LoadBalancer service with
//! the right ports and hosts and none for anything else (0 leaked), exactly one route per live
//! node and none for a deleted one, never two leaders (the shared call log shows no two processes
//! calling the cloud interleaved; no two live replicas believing they lead), no lease lost by a
//! live leader (API faults never touch the Lease, so a loss means renewals fell behind), and no
//! host crash. The last line printed has the counts.
//!
//! Size and replay: `CCM_SOAK_SEED` (printed at the start; it fixes every stream of random
//! choices, while the interleaving with the replicas' own timing still varies from run to run),
//! `CCM_SOAK_SECONDS` (churn time, default 25), `CCM_SOAK_SCALE` (population and pace, default
//! 1: about 10 nodes and 8 services, 5 operations/s), `CCM_SOAK_BURST_NODES` /
//! `CCM_SOAK_BURST_SERVICES` (the burst, default 40 and 8 per scale). The CI default takes about
//! 30 s. A large local run: `CCM_SOAK_SECONDS=600 CCM_SOAK_SCALE=20 cargo test -p ccm-host-cli --test
//! soak soak_churn -- --nocapture`; the field burst of the issue tracker's closing notes:
//! `CCM_SOAK_SECONDS=90 CCM_SOAK_BURST_NODES=1000 CCM_SOAK_BURST_SERVICES=200`.
//!
//! The two `a_*` tests below are regressions for host bugs the soak found.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ccm_host::runtime::well_known::{EXCLUDE_LB_LABEL, LB_CLEANUP_FINALIZER, UNINITIALIZED_TAINT};
use ccm_provider_fake::config::GoDuration;
use ccm_provider_fake::control::{self as fake, CallRecord};
use ccm_provider_fake::{ErrorSpec, FakeConfig, FakeState, InjectedKind, InstanceConfig};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_apiserver_inmem::{ApiServer, Controls};
use serde_json::{json, Value};
use support::{Replica, Rng};

/// How long the system may take to converge once faults stop. Only a safety net: a healthy
/// run converges in seconds, but the service controller's backoff (up to 300 s upstream) can
/// make a service that failed often wait long.
const CONVERGE_DEADLINE: Duration = Duration::from_secs(420);
/// Provider calls the soak injects faults into (Initialize is left alone: a failed Initialize
/// is a deliberate fatal exit of the new leader, not a fault the host should ride out).
const FAULT_METHODS: &[&str] = &[
    "EnsureLoadBalancer",
    "UpdateLoadBalancer",
    "EnsureLoadBalancerDeleted",
    "GetLoadBalancer",
    "InstanceMetadata",
    "InstanceExists",
    "InstanceShutdown",
    "ListRoutes",
    "CreateRoute",
    "DeleteRoute",
];
const SERVICE_NS: &str = "default";

struct Settings {
    seed: u64,
    seconds: u64,
    scale: u64,
    burst_nodes: usize,
    burst_services: usize,
}

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|_| {
        panic!("{name}={value:?} is not a whole number (see the doc comment of cli/tests/soak.rs)")
    }))
}

fn settings() -> Settings {
    let seconds = env_number("CCM_SOAK_SECONDS").unwrap_or(25);
    let scale = env_number("CCM_SOAK_SCALE").unwrap_or(1);
    assert!(seconds > 0, "CCM_SOAK_SECONDS must be at least 1");
    assert!(
        (1..=1000).contains(&scale),
        "CCM_SOAK_SCALE must be 1..=1000, got {scale}"
    );
    let burst = |name: &str, per_scale: u64| {
        usize::try_from(env_number(name).unwrap_or(per_scale * scale)).unwrap_or(usize::MAX)
    };
    Settings {
        seed: env_number("CCM_SOAK_SEED").unwrap_or_else(support::clock_seed),
        seconds,
        scale,
        burst_nodes: burst("CCM_SOAK_BURST_NODES", 40),
        burst_services: burst("CCM_SOAK_BURST_SERVICES", 8),
    }
}

// ---------------------------------------------------------------------------------------------
// Counts
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Counts {
    ops: BTreeMap<&'static str, u64>,
    api_faults: BTreeMap<&'static str, u64>,
    provider_faults: BTreeMap<&'static str, u64>,
    driver_retries: u64,
    kills: u64,
    lease_loss_exits: u64,
    leader_changes: u64,
}

fn inc(map: &mut BTreeMap<&'static str, u64>, key: &'static str) {
    *map.entry(key).or_default() += 1;
}

fn summary(map: &BTreeMap<&'static str, u64>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------------
// The replicas
// ---------------------------------------------------------------------------------------------

struct Fleet {
    dir: PathBuf,
    args: Vec<String>,
    /// The running replica of each slot.
    slots: [Replica; 2],
    /// Replicas that ended (killed, lost the lease, or crashed).
    ended: Vec<Replica>,
    started: [u32; 2],
    /// Replicas that ended by themselves for another reason than losing the lease, and every
    /// panic of the host itself (never of a provider, which the ABI turns into an error).
    crashes: Vec<String>,
    /// Moments when two live replicas believed they were the leader.
    two_leader_samples: Vec<String>,
    holder: Option<String>,
}

impl Fleet {
    fn new(dir: &Path, args: Vec<String>) -> Fleet {
        let a = Self::spawn(dir, &args, "a1");
        let b = Self::spawn(dir, &args, "b1");
        Fleet {
            dir: dir.to_path_buf(),
            args,
            slots: [a, b],
            ended: Vec::new(),
            started: [1, 1],
            crashes: Vec::new(),
            two_leader_samples: Vec::new(),
            holder: None,
        }
    }

    fn spawn(dir: &Path, args: &[String], name: &str) -> Replica {
        Replica::start(name, args, dir.join(format!("replica-{name}.log")), "info")
    }

    fn restart(&mut self, slot: usize) {
        self.started[slot] += 1;
        let name = format!("{}{}", ["a", "b"][slot], self.started[slot]);
        let fresh = Self::spawn(&self.dir, &self.args, &name);
        let old = std::mem::replace(&mut self.slots[slot], fresh);
        self.ended.push(old);
    }

    /// Read logs, notice exits (restarting the slot), and sample the "one leader" invariant.
    fn poll(&mut self, ctl: &Controls, counts: &mut Counts) {
        for slot in 0..2 {
            let r = &mut self.slots[slot];
            r.poll();
            if let Some(status) = r.exit {
                if r.facts.lost_lease && status.code() == Some(1) {
                    counts.lease_loss_exits += 1;
                } else {
                    self.crashes.push(format!(
                        "replica {} exited by itself with {status}; log tail:\n  {}",
                        r.name,
                        r.facts.tail.join("\n  ")
                    ));
                }
                self.restart(slot);
            }
        }
        let believers: Vec<&str> = self
            .slots
            .iter()
            .filter(|r| r.alive() && r.facts.became_leader && !r.facts.lost_lease)
            .map(|r| r.name.as_str())
            .collect();
        if believers.len() > 1 {
            self.two_leader_samples
                .push(format!("replicas {believers:?} both lead"));
        }
        let holder = lease_holder(ctl);
        if holder.is_some() && holder != self.holder {
            counts.leader_changes += 1;
            self.holder = holder;
        }
    }

    /// The slot whose replica holds the lease and runs the controllers.
    fn leader(&self) -> Option<usize> {
        let holder = self.holder.as_deref()?;
        (0..2).find(|&s| {
            let r = &self.slots[s];
            r.alive() && r.facts.became_leader && r.facts.identity.as_deref() == Some(holder)
        })
    }

    fn kill_and_restart(&mut self, slot: usize) {
        self.slots[slot].kill();
        self.restart(slot);
    }

    /// SIGTERM every replica: each must exit 0 (the leader after releasing the lease).
    fn stop(&mut self) {
        for r in &mut self.slots {
            r.poll();
            if r.alive() {
                // SAFETY: kill(2) on our own child's pid.
                #[allow(unsafe_code)]
                unsafe {
                    libc::kill(r.child.id() as i32, libc::SIGTERM);
                }
            }
        }
        for r in &mut self.slots {
            let deadline = Instant::now() + Duration::from_secs(30);
            while r.alive() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
                r.poll();
            }
            match r.exit {
                Some(status) if status.code() == Some(0) => {}
                Some(status) if r.facts.lost_lease && status.code() == Some(1) => {}
                other => self.crashes.push(format!(
                    "replica {} did not exit 0 on SIGTERM ({other:?}); log tail:\n  {}",
                    r.name,
                    r.facts.tail.join("\n  ")
                )),
            }
        }
        for r in self.slots.iter().chain(&self.ended) {
            for p in &r.facts.host_panics {
                self.crashes
                    .push(format!("replica {} panicked: {p}", r.name));
            }
        }
    }
}

fn lease_holder(ctl: &Controls) -> Option<String> {
    let lease = ctl.get(
        "leases.coordination.k8s.io",
        "kube-system",
        "cloud-controller-manager",
    )?;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_string)
}

/// The shared call log: each process's calls must form one contiguous block that starts with
/// `initialize` (two leaders calling the cloud at once would interleave).
fn call_log_leader_violations(calls: &[CallRecord]) -> (Vec<String>, usize) {
    let mut problems = Vec::new();
    let mut seen: BTreeSet<u32> = BTreeSet::new();
    let mut current: Option<u32> = None;
    for c in calls {
        if current == Some(c.pid) {
            continue;
        }
        if !seen.insert(c.pid) {
            problems.push(format!(
                "process {} called the cloud again (call #{} {:?}) after process {} had started leading",
                c.pid,
                c.seq,
                c.call,
                current.unwrap_or_default()
            ));
        } else if c.call != "initialize" {
            problems.push(format!(
                "process {}'s first cloud call was {:?}, not initialize",
                c.pid, c.call
            ));
        }
        current = Some(c.pid);
    }
    (problems, seen.len())
}

// ---------------------------------------------------------------------------------------------
// The cluster model the driver keeps
// ---------------------------------------------------------------------------------------------

struct NodeModel {
    index: u32,
    ready: bool,
    excluded: bool,
    /// The cloud says the instance is gone (the node is then frozen: readiness never changes).
    gone: bool,
    ready_since: Instant,
}

#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, NodeModel>,
    /// Names that must never be reused (their instance was once gone: the host deletes nodes
    /// by name, so a new node of that name could be deleted for the old one's sake).
    retired: BTreeSet<String>,
    /// Nodes the host deleted: (name, was Ready, was gone).
    host_deleted: Vec<(String, bool, bool)>,
    /// Services the driver created and has not deleted: name → wants a load balancer.
    services: BTreeMap<String, bool>,
}

impl Model {
    fn gone_instances(&self) -> Vec<InstanceConfig> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.gone)
            .map(|(name, _)| InstanceConfig {
                exists: false,
                ..InstanceConfig::named(name.clone())
            })
            .collect()
    }
}

fn pod_cidr(index: u32) -> String {
    format!("10.{}.{}.0/24", 128 + index / 256, index % 256)
}

fn node_object(name: &str, index: u32, ready: bool) -> Node {
    let cidr = pod_cidr(index);
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr],
                 "taints": [{"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"}]},
        "status": {"conditions": [ready_condition(ready)],
                   "addresses": [{"type": "Hostname", "address": name}]}
    }))
    .unwrap()
}

fn ready_condition(ready: bool) -> Value {
    json!({"type": "Ready", "status": if ready { "True" } else { "False" },
           "reason": if ready { "KubeletReady" } else { "KubeletNotReady" }})
}

fn service_ports(rng: &mut Rng) -> Value {
    let n = rng.between(1, 2);
    let mut ports = Vec::new();
    for i in 0..n {
        let (port, protocol) = *rng.pick(&[(80, "TCP"), (443, "TCP"), (8080, "TCP"), (53, "UDP")]);
        ports.push(json!({"name": format!("p{i}"), "port": port + i * 1000, "protocol": protocol}));
    }
    Value::Array(ports)
}

fn is_retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            s.code >= 500 || s.code == 429 || (s.code == 409 && s.reason != "AlreadyExists")
        }
        _ => true,
    }
}

fn code_of(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The driver's own requests meet the injected faults too: retry them like a kubelet would.
async fn with_retries<T, F, Fut>(counts: &mut Counts, mut f: F) -> kube::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = kube::Result<T>>,
{
    let mut attempt = 0u32;
    loop {
        match f().await {
            Err(e) if is_retryable(&e) && attempt < 20 => {
                attempt += 1;
                counts.driver_retries += 1;
                tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt.min(10)))).await;
            }
            other => return other,
        }
    }
}

struct Driver {
    /// Random streams per kind of decision, so that a seed replays the same choices of each
    /// kind even though wall-clock timing interleaves them differently from run to run.
    rng: Rng,
    api_rng: Rng,
    cloud_rng: Rng,
    ctl: Controls,
    nodes: Api<Node>,
    services: Api<Service>,
    state_dir: PathBuf,
    model: Model,
    counts: Counts,
    target_nodes: usize,
    target_services: usize,
    next_node_index: u32,
    next_service: u32,
    /// The fault part of the fake cloud's control file (the gone instances are added to it).
    provider_fault: FakeConfig,
}

impl Driver {
    fn write_control(&self) {
        let mut config = self.provider_fault.clone();
        config.instances = self.model.gone_instances();
        fake::write_control(&self.state_dir, &config).expect("write the fake cloud control file");
    }

    async fn step(&mut self) {
        let nodes = self.model.nodes.len();
        let services = self.model.services.len();
        let below = |n: usize, target: usize| if n < target { 6 } else { 2 };
        let above = |n: usize, target: usize| if n > target { 5 } else { 1 };
        let weights = [
            below(nodes, self.target_nodes),
            if nodes > 0 {
                above(nodes, self.target_nodes)
            } else {
                0
            },
            if nodes > 0 { 6 } else { 0 },
            if nodes > 0 { 1 } else { 0 },
            below(services, self.target_services),
            if services > 0 {
                above(services, self.target_services)
            } else {
                0
            },
            if services > 0 { 5 } else { 0 },
        ];
        match self.rng.weighted(&weights) {
            0 => self.create_node().await,
            1 => self.delete_node().await,
            2 => self.change_node().await,
            3 => self.mark_gone().await,
            4 => self.create_service().await,
            5 => self.delete_service().await,
            _ => self.change_service().await,
        }
    }

    /// The burst phase: `nodes` new Ready nodes and `services` new LoadBalancer services at
    /// once, as a cluster scale-up or a namespace being applied. The daemon meets it at the
    /// default client limits, so its controllers build up a backlog of API requests.
    async fn burst(&mut self, nodes: usize, services: usize) {
        for _ in 0..nodes {
            self.next_node_index += 1;
            let index = self.next_node_index - 1;
            self.add_node(format!("node-{index}"), index, true).await;
        }
        for _ in 0..services {
            self.next_service += 1;
            self.add_service(format!("svc-{}", self.next_service - 1), true)
                .await;
        }
        inc(&mut self.counts.ops, "burst");
    }

    fn random_node(&mut self, pred: impl Fn(&NodeModel) -> bool) -> Option<String> {
        let names: Vec<String> = self
            .model
            .nodes
            .iter()
            .filter(|(_, n)| pred(n))
            .map(|(k, _)| k.clone())
            .collect();
        (!names.is_empty()).then(|| self.rng.pick(&names).clone())
    }

    async fn create_node(&mut self) {
        // Reuse a free name now and then (a kubelet re-registering), else a new one.
        let free: Vec<String> = (0..self.next_node_index)
            .map(|i| format!("node-{i}"))
            .filter(|n| {
                !self.model.nodes.contains_key(n)
                    && !self.model.retired.contains(n)
                    && self.ctl.get("nodes", "", n).is_none()
            })
            .collect();
        let (name, index) = if !free.is_empty() && self.rng.chance(0.3) {
            let name = self.rng.pick(&free).clone();
            let index = name["node-".len()..].parse().unwrap();
            (name, index)
        } else {
            self.next_node_index += 1;
            let i = self.next_node_index - 1;
            (format!("node-{i}"), i)
        };
        let ready = self.rng.chance(0.75);
        self.add_node(name, index, ready).await;
    }

    /// Create the node `name` (a kubelet registering) and track it in the model.
    async fn add_node(&mut self, name: String, index: u32, ready: bool) {
        let node = node_object(&name, index, ready);
        let api = self.nodes.clone();
        let pp = PostParams::default();
        match with_retries(&mut self.counts, || api.create(&pp, &node)).await {
            Ok(_) => {}
            Err(e) if code_of(&e) == Some(409) => {}
            Err(e) => panic!("creating node {name}: {e}"),
        }
        inc(&mut self.counts.ops, "node+");
        self.model.nodes.insert(
            name,
            NodeModel {
                index,
                ready,
                excluded: false,
                gone: false,
                ready_since: Instant::now(),
            },
        );
    }

    async fn delete_node(&mut self) {
        let Some(name) = self.random_node(|_| true) else {
            return;
        };
        let api = self.nodes.clone();
        let dp = DeleteParams::default();
        match with_retries(&mut self.counts, || api.delete(&name, &dp)).await {
            Ok(_) => {}
            // The host deleted it first (NotReady and gone): found by `notice_host_deletions`.
            Err(e) if code_of(&e) == Some(404) => return,
            Err(e) => panic!("deleting node {name}: {e}"),
        }
        inc(&mut self.counts.ops, "node-");
        let node = self.model.nodes.remove(&name).unwrap();
        if node.gone {
            self.model.retired.insert(name);
            self.write_control();
        }
    }

    async fn change_node(&mut self) {
        let Some(name) = self.random_node(|_| true) else {
            return;
        };
        let api = self.nodes.clone();
        let pp = PatchParams::default();
        let node = &self.model.nodes[&name];
        let result = if !node.gone && self.rng.chance(0.5) {
            // The kubelet reports a readiness change.
            let ready = !node.ready;
            let patch =
                Patch::Strategic(json!({"status": {"conditions": [ready_condition(ready)]}}));
            let r = with_retries(&mut self.counts, || api.patch_status(&name, &pp, &patch)).await;
            if r.is_ok() {
                let n = self.model.nodes.get_mut(&name).unwrap();
                n.ready = ready;
                n.ready_since = Instant::now();
            }
            r
        } else if self.rng.chance(0.5) {
            // An admin takes it out of (or back into) load balancers.
            let excluded = !node.excluded;
            let value = if excluded { json!("true") } else { Value::Null };
            let patch = Patch::Merge(json!({"metadata": {"labels": {EXCLUDE_LB_LABEL: value}}}));
            let r = with_retries(&mut self.counts, || api.patch(&name, &pp, &patch)).await;
            if r.is_ok() {
                self.model.nodes.get_mut(&name).unwrap().excluded = excluded;
            }
            r
        } else {
            // Any other label: no cloud effect, but an update event for every controller.
            let value = format!("v{}", self.rng.below(1000));
            let patch = Patch::Merge(json!({"metadata": {"labels": {"soak/generation": value}}}));
            with_retries(&mut self.counts, || api.patch(&name, &pp, &patch)).await
        };
        match result {
            Ok(_) => inc(&mut self.counts.ops, "node~"),
            Err(e) if code_of(&e) == Some(404) => {}
            Err(e) => panic!("changing node {name}: {e}"),
        }
    }

    /// The cloud loses the instance of an initialised node whose readiness has been stable for
    /// a while (so the host's cache agrees with the model about it).
    async fn mark_gone(&mut self) {
        let stable = Duration::from_secs(5);
        let candidates: Vec<String> = self
            .model
            .nodes
            .iter()
            .filter(|(name, n)| {
                !n.gone
                    && n.ready_since.elapsed() > stable
                    && self.ctl.get("nodes", "", name).is_some_and(|o| {
                        o["spec"]["providerID"].is_string()
                            && !o["spec"]["taints"]
                                .as_array()
                                .is_some_and(|t| t.iter().any(|t| t["key"] == UNINITIALIZED_TAINT))
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        if candidates.is_empty() {
            return;
        }
        let name = self.rng.pick(&candidates).clone();
        self.model.nodes.get_mut(&name).unwrap().gone = true;
        self.write_control();
        inc(&mut self.counts.ops, "instance-gone");
    }

    async fn create_service(&mut self) {
        let free: Vec<String> = (0..self.next_service)
            .map(|i| format!("svc-{i}"))
            .filter(|n| {
                !self.model.services.contains_key(n)
                    && self.ctl.get("services", SERVICE_NS, n).is_none()
            })
            .collect();
        let name = if !free.is_empty() && self.rng.chance(0.3) {
            self.rng.pick(&free).clone()
        } else {
            self.next_service += 1;
            format!("svc-{}", self.next_service - 1)
        };
        let lb = self.rng.chance(0.85);
        self.add_service(name, lb).await;
    }

    /// Create the service `name` (type LoadBalancer when `lb`) and track it in the model.
    async fn add_service(&mut self, name: String, lb: bool) {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": SERVICE_NS},
            "spec": {"type": if lb { "LoadBalancer" } else { "ClusterIP" },
                     "selector": {"app": name}, "ports": service_ports(&mut self.rng)}
        }))
        .unwrap();
        let api = self.services.clone();
        let pp = PostParams::default();
        match with_retries(&mut self.counts, || api.create(&pp, &svc)).await {
            Ok(_) => {}
            // Created by an attempt whose answer was lost, or still terminating.
            Err(e) if code_of(&e) == Some(409) => {
                if self.ctl.get("services", SERVICE_NS, &name).is_none() {
                    return;
                }
            }
            Err(e) => panic!("creating service {name}: {e}"),
        }
        let live = self.ctl.get("services", SERVICE_NS, &name);
        if live.is_some_and(|s| s["metadata"]["deletionTimestamp"].is_string()) {
            // The 409 was a terminating service of that name, not ours.
            return;
        }
        inc(&mut self.counts.ops, "service+");
        self.model.services.insert(name, lb);
    }

    async fn delete_service(&mut self) {
        let names: Vec<String> = self.model.services.keys().cloned().collect();
        let name = self.rng.pick(&names).clone();
        let api = self.services.clone();
        let dp = DeleteParams::default();
        match with_retries(&mut self.counts, || api.delete(&name, &dp)).await {
            Ok(_) => {}
            Err(e) if code_of(&e) == Some(404) => {}
            Err(e) => panic!("deleting service {name}: {e}"),
        }
        inc(&mut self.counts.ops, "service-");
        self.model.services.remove(&name);
    }

    async fn change_service(&mut self) {
        let names: Vec<String> = self.model.services.keys().cloned().collect();
        let name = self.rng.pick(&names).clone();
        let lb = self.model.services[&name];
        let api = self.services.clone();
        let pp = PatchParams::default();
        let (patch, new_lb) = if self.rng.chance(0.3) {
            // LoadBalancer <-> ClusterIP.
            let ty = if lb { "ClusterIP" } else { "LoadBalancer" };
            (json!({"spec": {"type": ty}}), !lb)
        } else if self.rng.chance(0.7) {
            (json!({"spec": {"ports": service_ports(&mut self.rng)}}), lb)
        } else {
            let value = format!("v{}", self.rng.below(1000));
            (
                json!({"metadata": {"annotations": {"soak/generation": value}}}),
                lb,
            )
        };
        let patch = Patch::Merge(patch);
        match with_retries(&mut self.counts, || api.patch(&name, &pp, &patch)).await {
            Ok(_) => {
                inc(&mut self.counts.ops, "service~");
                self.model.services.insert(name, new_lb);
            }
            Err(e) if code_of(&e) == Some(404) => {}
            Err(e) => panic!("changing service {name}: {e}"),
        }
    }

    /// Nodes that vanished without the driver deleting them were deleted by the host.
    fn notice_host_deletions(&mut self) {
        let live: BTreeSet<String> = self
            .ctl
            .list("nodes")
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let vanished: Vec<String> = self
            .model
            .nodes
            .keys()
            .filter(|n| !live.contains(*n))
            .cloned()
            .collect();
        for name in vanished {
            let node = self.model.nodes.remove(&name).unwrap();
            if node.gone {
                self.model.retired.insert(name.clone());
            }
            self.model.host_deleted.push((name, node.ready, node.gone));
        }
    }

    // ---- faults -------------------------------------------------------------------------

    /// Arm one API server fault. Returns how long a timed fault (latency) lasts.
    fn api_fault(&mut self) -> Option<Duration> {
        let verbs = [
            "*", "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        // Errors hit what the controllers read and write, never the Lease: a leader that cannot
        // renew must step down (cli/tests/daemon.rs tests that), so a lease loss here can only
        // mean that a live leader fell behind, which the soak counts as a failure.
        let resources = ["nodes", "services", "events"];
        match self.api_rng.below(6) {
            0 => {
                self.ctl.drop_watches();
                inc(&mut self.counts.api_faults, "watch-drop");
            }
            1 => {
                self.ctl.compact();
                self.ctl.drop_watches();
                inc(&mut self.counts.api_faults, "watch-expired");
            }
            2 => {
                let code = *self.api_rng.pick(&[500, 503]);
                let n = self.api_rng.between(1, 4) as u32;
                let (verb, resource) = (*self.api_rng.pick(&verbs), *self.api_rng.pick(&resources));
                self.ctl.fail_next(n, verb, resource, code);
                inc(&mut self.counts.api_faults, "5xx");
            }
            3 => {
                let n = self.api_rng.between(1, 4) as u32;
                let (verb, resource) = (*self.api_rng.pick(&verbs), *self.api_rng.pick(&resources));
                self.ctl.set_retry_after(1);
                self.ctl.fail_next(n, verb, resource, 429);
                inc(&mut self.counts.api_faults, "429");
            }
            4 => {
                let n = self.api_rng.between(1, 3) as u32;
                let resource = *self.api_rng.pick(&["nodes", "services"]);
                self.ctl.force_conflicts(n, resource);
                inc(&mut self.counts.api_faults, "conflict");
            }
            _ => {
                let d = Duration::from_millis(self.api_rng.between(20, 250));
                self.ctl.set_latency(d);
                inc(&mut self.counts.api_faults, "latency");
                return Some(Duration::from_millis(self.api_rng.between(500, 2500)));
            }
        }
        None
    }

    /// Install one fake cloud fault for a while; returns how long.
    fn provider_fault(&mut self) -> Duration {
        let method = self.cloud_rng.pick(FAULT_METHODS).to_string();
        let mut f = FakeConfig::default();
        match self.cloud_rng.below(5) {
            0 => {
                let n = self.cloud_rng.between(1, 4) as u32;
                f.errors
                    .insert(method, ErrorSpec::new(InjectedKind::Other).times(n));
                inc(&mut self.counts.provider_faults, "error");
            }
            1 => {
                let after = Duration::from_millis(self.cloud_rng.between(500, 2000));
                let n = self.cloud_rng.between(1, 3) as u32;
                let lb = [
                    "EnsureLoadBalancer",
                    "UpdateLoadBalancer",
                    "EnsureLoadBalancerDeleted",
                ];
                f.errors.insert(
                    self.cloud_rng.pick(&lb).to_string(),
                    ErrorSpec::retry_after(after).times(n),
                );
                inc(&mut self.counts.provider_faults, "retry-after");
            }
            2 => {
                let d = Duration::from_millis(self.cloud_rng.between(50, 600));
                f.latency.insert("*".into(), GoDuration(d));
                inc(&mut self.counts.provider_faults, "latency");
            }
            3 => {
                f.panics.push(method);
                inc(&mut self.counts.provider_faults, "panic");
            }
            _ => {
                f.hang.push(method);
                inc(&mut self.counts.provider_faults, "hang-timeout");
            }
        }
        self.provider_fault = f;
        self.write_control();
        Duration::from_millis(self.cloud_rng.between(500, 3000))
    }

    fn clear_provider_fault(&mut self) {
        self.provider_fault = FakeConfig::default();
        self.write_control();
    }
}

// ---------------------------------------------------------------------------------------------
// Convergence and the final checks
// ---------------------------------------------------------------------------------------------

fn has_uninitialized_taint(node: &Value) -> bool {
    node["spec"]["taints"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["key"] == UNINITIALIZED_TAINT))
}

/// What is still wrong with the cluster and the cloud (empty once converged), and the number
/// of leaked load balancers and routes among those problems.
fn problems(model: &Model, ctl: &Controls, state_dir: &Path) -> (Vec<String>, usize, usize) {
    let mut out = Vec::new();
    let nodes: BTreeMap<String, Value> = ctl
        .list("nodes")
        .into_iter()
        .map(|n| (n["metadata"]["name"].as_str().unwrap().to_string(), n))
        .collect();
    let services: BTreeMap<String, Value> = ctl
        .list("services")
        .into_iter()
        .filter(|s| {
            s["metadata"]["namespace"] == SERVICE_NS && s["metadata"]["name"] != "kubernetes"
        })
        .map(|s| (s["metadata"]["name"].as_str().unwrap().to_string(), s))
        .collect();
    let cloud = match FakeState::read(state_dir) {
        Ok(c) => c,
        Err(e) => return (vec![format!("cannot read the fake cloud state: {e}")], 0, 0),
    };

    // Nodes.
    for (name, m) in &model.nodes {
        match nodes.get(name) {
            None => out.push(format!("node {name} is missing")),
            Some(n) => {
                if has_uninitialized_taint(n) {
                    out.push(format!("node {name} is still tainted uninitialized"));
                }
                if n["spec"]["providerID"] != format!("fake://{name}").as_str() {
                    out.push(format!(
                        "node {name} has providerID {}",
                        n["spec"]["providerID"]
                    ));
                }
                if m.gone && !m.ready {
                    out.push(format!(
                        "node {name} (NotReady, its instance gone) was not deleted by the host"
                    ));
                }
            }
        }
    }
    for name in nodes.keys() {
        if !model.nodes.contains_key(name) {
            out.push(format!("node {name} exists but the driver deleted it"));
        }
    }

    // Services and their load balancers.
    let wanted_hosts: Vec<String> = nodes
        .iter()
        .filter(|(_, n)| {
            n["metadata"]["labels"][EXCLUDE_LB_LABEL].is_null()
                && n["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|(k, _)| k.clone())
        .collect();
    let mut want_lb = BTreeSet::new();
    for (name, s) in &services {
        if s["metadata"]["deletionTimestamp"].is_string() {
            out.push(format!("service {name} is still terminating"));
            continue;
        }
        let Some(&lb) = model.services.get(name) else {
            out.push(format!("service {name} exists but the driver deleted it"));
            continue;
        };
        let is_lb = s["spec"]["type"] == "LoadBalancer";
        if lb != is_lb {
            out.push(format!(
                "service {name}: type {} but the driver set LoadBalancer={lb}",
                s["spec"]["type"]
            ));
        }
        let finalized = s["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == LB_CLEANUP_FINALIZER));
        let ingress_ip = s["status"]["loadBalancer"]["ingress"][0]["ip"].as_str();
        let key = format!("{SERVICE_NS}/{name}");
        if !is_lb {
            if finalized || ingress_ip.is_some() {
                out.push(format!(
                    "ClusterIP service {name} keeps its finalizer or LB status"
                ));
            }
            continue;
        }
        want_lb.insert(key.clone());
        if !finalized {
            out.push(format!(
                "service {name} has no {LB_CLEANUP_FINALIZER} finalizer"
            ));
        }
        match cloud.load_balancer(&key) {
            None => out.push(format!("service {name} has no load balancer in the cloud")),
            Some(lb) => {
                if ingress_ip != Some(lb.load_balancer_ip.as_str()) {
                    out.push(format!(
                        "service {name} status ingress {ingress_ip:?}, cloud has {}",
                        lb.load_balancer_ip
                    ));
                }
                if s["metadata"]["uid"] != lb.uid.as_str() {
                    out.push(format!(
                        "load balancer of {name} is for an older service (uid)"
                    ));
                }
                let mut want_ports: Vec<(i64, String)> = s["spec"]["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        (
                            p["port"].as_i64().unwrap(),
                            p["protocol"].as_str().unwrap_or("TCP").to_string(),
                        )
                    })
                    .collect();
                let mut have_ports: Vec<(i64, String)> = lb
                    .ports
                    .iter()
                    .map(|p| (i64::from(p.port), p.protocol.clone()))
                    .collect();
                want_ports.sort();
                have_ports.sort();
                if want_ports != have_ports {
                    out.push(format!(
                        "load balancer of {name} has ports {have_ports:?}, service {want_ports:?}"
                    ));
                }
                if lb.hosts != wanted_hosts {
                    out.push(format!(
                        "load balancer of {name} has hosts {:?}, expected {wanted_hosts:?}",
                        lb.hosts
                    ));
                }
            }
        }
    }
    for name in model.services.keys() {
        if !services.contains_key(name) {
            out.push(format!("service {name} is missing"));
        }
    }
    let mut leaked_lbs = 0;
    for lb in &cloud.load_balancers {
        if !want_lb.contains(&lb.service_key()) {
            leaked_lbs += 1;
            out.push(format!(
                "leaked load balancer {} for {} (no such LoadBalancer service)",
                lb.name,
                lb.service_key()
            ));
        }
    }

    // Routes: exactly one per node (its podCIDR), none for a deleted node.
    let mut leaked_routes = 0;
    let mut routed = BTreeSet::new();
    for r in &cloud.routes {
        let expected = model
            .nodes
            .get(&r.target_node)
            .filter(|_| nodes.contains_key(&r.target_node))
            .map(|m| pod_cidr(m.index));
        if expected.as_deref() != Some(r.destination_cidr.as_str()) {
            leaked_routes += 1;
            out.push(format!(
                "route {} ({} via {}) is for a deleted node or a wrong CIDR",
                r.name, r.destination_cidr, r.target_node
            ));
        } else if !routed.insert(r.target_node.clone()) {
            out.push(format!("node {} has two routes", r.target_node));
        }
    }
    for name in nodes.keys() {
        if model.nodes.contains_key(name) && !routed.contains(name) {
            out.push(format!("node {name} has no route"));
        }
    }
    (out, leaked_lbs, leaked_routes)
}

// ---------------------------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_churn_faults_and_leader_kills_converge_without_leaks() {
    let s = settings();
    println!(
        "soak: seed={} seconds={} scale={} burst={}+{} (replay with CCM_SOAK_SEED={} CCM_SOAK_SECONDS={} CCM_SOAK_SCALE={} CCM_SOAK_BURST_NODES={} CCM_SOAK_BURST_SERVICES={})",
        s.seed, s.seconds, s.scale, s.burst_nodes, s.burst_services, s.seed, s.seconds, s.scale, s.burst_nodes, s.burst_services
    );
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let state_dir = dir.path().join("cloud");
    std::fs::create_dir_all(&state_dir).unwrap();
    let cloud_config = dir.path().join("cloud.yaml");
    std::fs::write(
        &cloud_config,
        format!("stateDir: {}\nsharedState: true\n", state_dir.display()),
    )
    .unwrap();
    let plugins = support::plugin_dir(dir.path());
    let args: Vec<String> = [
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--cloud-provider",
        "fake",
        "--cloud-config",
        cloud_config.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--secure-port",
        "0",
        // Short lease timings so that a killed leader is replaced within seconds; the renew
        // deadline leaves a renewal two retry periods (API latency faults reach 250 ms a request).
        "--leader-elect-lease-duration",
        "4s",
        "--leader-elect-renew-deadline",
        "3s",
        "--leader-elect-retry-period",
        "1s",
        "--cluster-cidr",
        "10.128.0.0/9",
        "--route-reconciliation-period",
        "2s",
        "--node-monitor-period",
        "1s",
        "--provider-call-timeout",
        "3s",
        "--concurrent-node-syncs",
        "2",
        "--concurrent-service-syncs",
        "2",
        // Field conditions: the client limits stay at their defaults (20 qps, burst 30).
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();

    let scale = s.scale as usize;
    let mut driver = Driver {
        rng: Rng::new(s.seed),
        api_rng: Rng::new(s.seed ^ 0xa5a5_0001),
        cloud_rng: Rng::new(s.seed ^ 0xa5a5_0002),
        ctl: ctl.clone(),
        nodes: Api::all(server.client()),
        services: Api::namespaced(server.client(), SERVICE_NS),
        state_dir: state_dir.clone(),
        model: Model::default(),
        counts: Counts::default(),
        target_nodes: 10 * scale,
        target_services: 8 * scale,
        next_node_index: 0,
        next_service: 0,
        provider_fault: FakeConfig::default(),
    };
    driver.write_control();
    let mut fleet = Fleet::new(dir.path(), args);

    // Churn with faults for `seconds`.
    let started = Instant::now();
    let churn_end = started + Duration::from_secs(s.seconds);
    let op_gap = Duration::from_millis(200 / s.scale.min(20));
    let mut next_op = Instant::now();
    let mut next_api_fault = started + Duration::from_secs(2);
    let mut next_provider_fault = started + Duration::from_secs(3);
    let mut kill_rng = Rng::new(s.seed ^ 0xa5a5_0003);
    let mut pace_rng = Rng::new(s.seed ^ 0xa5a5_0004);
    let mut next_kill = started + Duration::from_secs(kill_rng.between(6, 10));
    let mut burst_at = Some(started + Duration::from_secs(s.seconds) / 3);
    let mut api_latency_until: Option<Instant> = None;
    let mut provider_fault_until: Option<Instant> = None;
    let mut last_model_check = Instant::now();
    while Instant::now() < churn_end {
        let now = Instant::now();
        fleet.poll(&ctl, &mut driver.counts);
        if now >= next_op {
            driver.step().await;
            next_op = now + op_gap.mul_f64(0.5 + pace_rng.below(100) as f64 / 100.0);
        }
        if now - last_model_check > Duration::from_secs(1) {
            driver.notice_host_deletions();
            last_model_check = now;
        }
        if api_latency_until.is_some_and(|t| now >= t) {
            ctl.set_latency(Duration::ZERO);
            api_latency_until = None;
        }
        if now >= next_api_fault {
            if let Some(d) = driver.api_fault() {
                api_latency_until = Some(now + d);
            }
            next_api_fault = now + Duration::from_millis(driver.api_rng.between(300, 1500));
        }
        if provider_fault_until.is_some_and(|t| now >= t) {
            driver.clear_provider_fault();
            provider_fault_until = None;
            next_provider_fault = now + Duration::from_millis(driver.cloud_rng.between(500, 2500));
        }
        if provider_fault_until.is_none() && now >= next_provider_fault {
            provider_fault_until = Some(now + driver.provider_fault());
        }
        if burst_at.is_some_and(|t| now >= t) {
            burst_at = None;
            driver.burst(s.burst_nodes, s.burst_services).await;
        }
        if now >= next_kill {
            if let Some(slot) = fleet.leader() {
                fleet.kill_and_restart(slot);
                driver.counts.kills += 1;
            }
            next_kill = now + Duration::from_secs(kill_rng.between(6, 14));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Faults and churn stop; the system must converge.
    ctl.clear_faults();
    ctl.set_latency(Duration::ZERO);
    driver.clear_provider_fault();
    let churn_took = started.elapsed();
    let converge_started = Instant::now();
    let mut next_progress = Duration::from_secs(30);
    let (mut remaining, mut leaked_lbs, mut leaked_routes);
    loop {
        fleet.poll(&ctl, &mut driver.counts);
        driver.notice_host_deletions();
        (remaining, leaked_lbs, leaked_routes) = problems(&driver.model, &ctl, &state_dir);
        if remaining.is_empty() || converge_started.elapsed() > CONVERGE_DEADLINE {
            break;
        }
        if converge_started.elapsed() > next_progress {
            println!(
                "soak: converging for {:.0?}: {} problems, e.g. {:?}",
                converge_started.elapsed(),
                remaining.len(),
                &remaining[..remaining.len().min(3)]
            );
            next_progress += Duration::from_secs(30);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let converged_after = converge_started.elapsed();
    fleet.poll(&ctl, &mut driver.counts);
    tokio::task::block_in_place(|| fleet.stop());

    // Safety checks over the whole run.
    let wrongful: Vec<String> = driver
        .model
        .host_deleted
        .iter()
        .filter(|(_, ready, gone)| *ready || !*gone)
        .map(|(name, ready, gone)| {
            format!("host deleted node {name} (ready={ready}, instance gone={gone})")
        })
        .collect();
    let calls = fake::read_calls(&state_dir).expect("read the shared call log");
    let (call_log_violations, leading_processes) = call_log_leader_violations(&calls);

    let c = &driver.counts;
    let ops: u64 = c.ops.values().sum();
    let api_faults: u64 = c.api_faults.values().sum();
    let provider_faults: u64 = c.provider_faults.values().sum();
    let two_leaders = call_log_violations.len() + fleet.two_leader_samples.len();
    let report = |title: &str, items: &[String]| {
        if !items.is_empty() {
            println!("soak: {title} ({}):", items.len());
            for i in items.iter().take(30) {
                println!("  - {i}");
            }
        }
    };
    report("not converged", &remaining);
    report("wrongful node deletions", &wrongful);
    report("two leaders (call log)", &call_log_violations);
    report("two leaders (replica logs)", &fleet.two_leader_samples);
    report("crashes", &fleet.crashes);
    println!(
        "soak: churn {churn_took:.1?}, converged in {converged_after:.1?}; {} cloud calls by {leading_processes} leading processes; \
         {} host deletions of gone NotReady nodes; driver retries {}; {} ERROR lines in {} replica logs",
        calls.len(),
        driver.model.host_deleted.len() - wrongful.len(),
        c.driver_retries,
        fleet.slots.iter().chain(&fleet.ended).map(|r| r.facts.errors).sum::<u64>(),
        fleet.slots.len() + fleet.ended.len(),
    );
    println!(
        "soak: seed={} ops={ops} ({}) faults={} (api: {}; provider: {}; leader kills={}) \
         leader-changes={} lease-loss-exits={} leaks={} (load balancers={leaked_lbs} routes={leaked_routes}) \
         wrongful-deletions={} two-leaders={two_leaders} crashes={} unconverged={}",
        s.seed,
        summary(&c.ops),
        api_faults + provider_faults + c.kills,
        summary(&c.api_faults),
        summary(&c.provider_faults),
        c.kills,
        c.leader_changes,
        c.lease_loss_exits,
        leaked_lbs + leaked_routes,
        wrongful.len(),
        fleet.crashes.len(),
        remaining.len(),
    );
    let failed = !remaining.is_empty()
        || !wrongful.is_empty()
        || c.lease_loss_exits > 0
        || two_leaders > 0
        || !fleet.crashes.is_empty();
    assert!(
        !failed,
        "soak failed (see the report above; replay with CCM_SOAK_SEED={})",
        s.seed
    );
    assert!(ops > 0 && leading_processes > 0, "the soak did nothing");
}

/// Regression (found by the soak, seed 8): an API error while a replica first reads the Lease
/// made it exit 1; upstream's elector retries, and so must we.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_rides_out_api_errors_while_it_sets_up_the_lease() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let plugins = support::plugin_dir(dir.path());
    ctl.fail_next(3, "get", "leases.coordination.k8s.io", 500);
    let args: Vec<String> = [
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--cloud-provider",
        "fake",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--secure-port",
        "0",
        "--leader-elect-retry-period",
        "200ms",
        "--controllers",
        "cloud-node",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut replica = Replica::start("solo", &args, dir.path().join("solo.log"), "info");
    let started = Instant::now();
    tokio::task::block_in_place(|| loop {
        replica.poll();
        if let Some(status) = replica.exit {
            panic!(
                "the replica exited with {status}:\n{}",
                replica.facts.tail.join("\n")
            );
        }
        if replica.facts.became_leader && lease_holder(&ctl).is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no leader after 60s:\n{}",
            replica.facts.tail.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    });
    let failed = ctl
        .requests()
        .iter()
        .filter(|r| r.resource == "leases.coordination.k8s.io" && r.code == 500)
        .count();
    assert_eq!(failed, 3, "the injected lease errors were met");
}

/// Regression (found by the soak, seed 11 at scale 5): a service switched from LoadBalancer to
/// ClusterIP whose cleanup stopped between the finalizer removal and the status clear (the
/// leader died) kept its load-balancer ingress forever, because no later leader enqueued it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_clears_a_stale_lb_status_left_by_the_previous_one() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let plugins = support::plugin_dir(dir.path());
    // What the previous leader left: no finalizer any more, the old ingress still published.
    ctl.seed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "was-lb", "namespace": SERVICE_NS},
        "spec": {"type": "ClusterIP", "ports": [{"port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    let services: Api<Service> = Api::namespaced(server.client(), SERVICE_NS);
    services
        .patch_status(
            "was-lb",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.18.0.7"}]}}})),
        )
        .await
        .unwrap();
    ctl.seed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "plain", "namespace": SERVICE_NS},
        "spec": {"type": "ClusterIP", "ports": [{"port": 80, "protocol": "TCP"}]}
    }))
    .unwrap();
    assert!(
        ctl.get("services", SERVICE_NS, "was-lb").unwrap()["status"]["loadBalancer"]["ingress"]
            .is_array()
    );
    let args: Vec<String> = [
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--cloud-provider",
        "fake",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--secure-port",
        "0",
        "--leader-elect=false",
        "--controllers",
        "service",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut replica = Replica::start("solo", &args, dir.path().join("solo.log"), "info");
    let started = Instant::now();
    tokio::task::block_in_place(|| loop {
        replica.poll();
        assert!(replica.alive(), "{}", replica.facts.tail.join("\n"));
        let svc = ctl.get("services", SERVICE_NS, "was-lb").unwrap();
        if svc["status"]["loadBalancer"]["ingress"]
            .as_array()
            .is_none_or(|i| i.is_empty())
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the stale ingress is still there after 60s:\n{}",
            replica.facts.tail.join("\n")
        );
        std::thread::sleep(Duration::from_millis(50));
    });
    // Only the stale one was touched: the plain ClusterIP service got no write.
    let writes = |name: &str| {
        ctl.requests()
            .iter()
            .filter(|r| r.resource == "services" && r.name == name && r.verb != "get")
            .count()
    };
    assert_eq!(writes("plain"), 0);
    assert!(writes("was-lb") >= 1);
}

/// The soak's two-leader detector on synthetic call logs.
#[test]
fn call_log_check_flags_interleaved_leaders() {
    let log = |calls: &[(u32, &str)]| -> Vec<CallRecord> {
        calls
            .iter()
            .enumerate()
            .map(|(i, (pid, call))| CallRecord {
                seq: i as u64 + 1,
                call: call.to_string(),
                provider: "fake".into(),
                args: Value::Null,
                at_ms: 0,
                pid: *pid,
            })
            .collect()
    };
    let handover = log(&[
        (1, "initialize"),
        (1, "create"),
        (2, "initialize"),
        (2, "update"),
    ]);
    assert_eq!(call_log_leader_violations(&handover), (vec![], 2));
    let interleaved = log(&[(1, "initialize"), (2, "initialize"), (1, "create")]);
    let (problems, _) = call_log_leader_violations(&interleaved);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("process 1 called the cloud again"));
    let (problems, _) = call_log_leader_violations(&log(&[(3, "create")]));
    assert!(problems[0].contains("not initialize"), "{problems:?}");
}
