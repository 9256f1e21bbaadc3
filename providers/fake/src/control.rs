//! Run-time control and observation through files in `stateDir` (the host loads the plugin with
//! `dlopen`, so tests cannot reach its memory):
//!
//! - [`CONTROL_FILE`] (`control.yaml`): re-read when it changes; replaces the live settings.
//! - [`CALLS_FILE`] (`calls.jsonl`): one JSON line per provider call ([`CallRecord`]).
//! - [`STATE_FILE`] (`cloud.json`): the cloud's load balancers and routes ([`FakeState`] of
//!   [`LoadBalancerRecord`]s and [`RouteRecord`]s, the types the cloud keeps them in),
//!   rewritten atomically after changes, off the state lock and coalesced (`cloud::StateWriter`;
//!   with `sharedState`: at once, under the lock).
//!
//! The free functions here are the test side of that contract.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use ccm_provider_abi::prelude::{LoadBalancerIngress, LoadBalancerStatus, PortStatus};
use serde::{Deserialize, Serialize};

use crate::config::{AddressConfig, FakeConfig, RouteConfig};

/// Name of the control file in `stateDir`.
pub const CONTROL_FILE: &str = "control.yaml";
/// Name of the call log in `stateDir`.
pub const CALLS_FILE: &str = "calls.jsonl";
/// Name of the cloud state file in `stateDir`.
pub const STATE_FILE: &str = "cloud.json";
/// Present while a burst of changes is left to the writer thread, so `cloud.json` may be behind
/// the cloud by up to the writer's interval; removed once the burst is written
/// ([`FakeState::read_settled`] waits for that).
pub const STATE_PENDING_FILE: &str = "cloud.json.pending";

/// How many call records are also kept in memory (see `FakeCloud::calls`).
const MEMORY_LOG_CAP: usize = 50_000;

/// One provider call, as written to `calls.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    /// 1, 2, ... per provider instance, in the order of the file.
    pub seq: u64,
    /// Stable call name (`create`, `instance-metadata-by-provider-id`, `cancel-observed`, ...).
    pub call: String,
    /// The provider's name (`ProviderName()`).
    pub provider: String,
    /// The call's arguments (`service`, `hosts`, `node`, `providerID`, `cluster`, `cidr`, ...).
    #[serde(default)]
    pub args: serde_json::Value,
    /// When the call arrived, in milliseconds since the Unix epoch (to count calls per second).
    #[serde(default)]
    pub at_ms: u64,
    /// The process that made the call (tells host replicas sharing a `stateDir` apart).
    #[serde(default)]
    pub pid: u32,
    /// Other calls of this cloud that were in their `latency` wait when this call arrived: with
    /// a latency set, this call and those were in the plugin at the same time (tests read the
    /// host's concurrency from it). Left out of the file when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delayed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl CallRecord {
    /// A string argument, if present.
    pub fn arg(&self, key: &str) -> Option<&str> {
        self.args.get(key).and_then(|v| v.as_str())
    }

    /// The `hosts` argument of load-balancer calls.
    pub fn hosts(&self) -> Vec<String> {
        self.args
            .get("hosts")
            .and_then(|h| h.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|h| h.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A load balancer of the fake cloud (as in `cloud.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerRecord {
    /// Upstream `DefaultLoadBalancerName`: `"a"` + the UID without dashes, at most 32 characters.
    pub name: String,
    /// The `--cluster-name` it was ensured for.
    pub cluster: String,
    /// Service namespace.
    pub namespace: String,
    /// Service name.
    pub service: String,
    /// Service UID.
    pub uid: String,
    /// The service's ports.
    pub ports: Vec<PortRecord>,
    /// Names of the backend nodes, sorted.
    pub hosts: Vec<String>,
    /// The address published in the ingress.
    #[serde(rename = "loadBalancerIP")]
    pub load_balancer_ip: String,
    /// `ipMode` published in the ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_mode: Option<String>,
}

impl LoadBalancerRecord {
    /// `namespace/name`.
    pub fn service_key(&self) -> String {
        format!("{}/{}", self.namespace, self.service)
    }

    /// The status the cloud reports for this load balancer.
    pub fn status(&self) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(self.load_balancer_ip.clone()),
                hostname: None,
                ip_mode: self.ip_mode.clone(),
                ports: Some(
                    self.ports
                        .iter()
                        .map(|p| PortStatus {
                            port: p.port,
                            protocol: p.protocol.clone(),
                            error: None,
                        })
                        .collect(),
                ),
            }]),
        }
    }
}

/// One port of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRecord {
    /// Port name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `TCP`, `UDP`, `SCTP`.
    pub protocol: String,
    /// Service port.
    pub port: i32,
    /// Node port, if allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<i32>,
}

/// (target node, destination CIDR): at most one route each per cluster.
pub(crate) type RouteKey = (String, String);

/// A route of the fake cloud (as in `cloud.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRecord {
    /// `<cluster>-<node>-<cidr>` for routes created through `CreateRoute`.
    pub name: String,
    /// The cluster it belongs to.
    pub cluster: String,
    /// Node name.
    pub target_node: String,
    /// Pod CIDR.
    #[serde(rename = "destinationCIDR")]
    pub destination_cidr: String,
    /// The route's target is gone.
    #[serde(default)]
    pub blackhole: bool,
    /// Addresses of the target node when the route was created.
    #[serde(default)]
    pub target_node_addresses: Vec<AddressConfig>,
    /// The name hint given to `CreateRoute` (the node UID).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name_hint: String,
}

/// Upstream fake's route name.
pub fn route_name(cluster: &str, node: &str, cidr: &str) -> String {
    format!("{cluster}-{node}-{cidr}")
}

impl RouteRecord {
    pub(crate) fn from_seed(seed: &RouteConfig) -> Self {
        Self {
            name: seed.name.clone().unwrap_or_else(|| {
                route_name(&seed.cluster, &seed.target_node, &seed.destination_cidr)
            }),
            cluster: seed.cluster.clone(),
            target_node: seed.target_node.clone(),
            destination_cidr: seed.destination_cidr.clone(),
            blackhole: seed.blackhole,
            target_node_addresses: seed.target_node_addresses.clone(),
            name_hint: String::new(),
        }
    }

    pub(crate) fn key(&self) -> RouteKey {
        (self.target_node.clone(), self.destination_cidr.clone())
    }
}

/// The cloud's resources, as written to `cloud.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FakeState {
    /// Load balancers, sorted by service key (`namespace/name`).
    pub load_balancers: Vec<LoadBalancerRecord>,
    /// Routes, sorted by cluster and name.
    pub routes: Vec<RouteRecord>,
}

impl FakeState {
    /// [`Self::read`] once no burst of changes is left to the writer thread (waiting at most
    /// `timeout`): what tests read after the calls they made have returned.
    pub fn read_settled(dir: &Path, timeout: std::time::Duration) -> io::Result<Self> {
        let deadline = std::time::Instant::now() + timeout;
        while dir.join(STATE_PENDING_FILE).exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Self::read(dir)
    }

    /// Read `dir/cloud.json`; a missing file is an empty cloud.
    pub fn read(dir: &Path) -> io::Result<Self> {
        match fs::read(dir.join(STATE_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e),
        }
    }

    /// The load balancer of service `namespace/name`.
    pub fn load_balancer(&self, service_key: &str) -> Option<&LoadBalancerRecord> {
        self.load_balancers
            .iter()
            .find(|lb| lb.service_key() == service_key)
    }
}

/// Read every record of `dir/calls.jsonl` (missing file: none). A torn last line is skipped.
pub fn read_calls(dir: &Path) -> io::Result<Vec<CallRecord>> {
    let text = match fs::read_to_string(dir.join(CALLS_FILE)) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

/// The records of `dir/calls.jsonl` named `call`.
pub fn calls_named(dir: &Path, call: &str) -> io::Result<Vec<CallRecord>> {
    Ok(read_calls(dir)?
        .into_iter()
        .filter(|c| c.call == call)
        .collect())
}

/// Empty the call log (the plugin appends, so truncating is safe while it runs).
pub fn clear_calls(dir: &Path) -> io::Result<()> {
    match OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(dir.join(CALLS_FILE))
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Poll `dir/calls.jsonl` until `pred` holds for the records (or `timeout`); returns them.
pub fn wait_for_calls(
    dir: &Path,
    timeout: Duration,
    mut pred: impl FnMut(&[CallRecord]) -> bool,
) -> io::Result<Vec<CallRecord>> {
    let end = Instant::now() + timeout;
    loop {
        let calls = read_calls(dir)?;
        if pred(&calls) || Instant::now() >= end {
            return Ok(calls);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Write `dir/control.yaml` atomically (temp file + rename, so the plugin always notices the
/// change and never reads half a file). `stateDir` is left out (it cannot change at run time), so
/// the config given to the factory can be reused as is.
pub fn write_control(dir: &Path, config: &FakeConfig) -> io::Result<()> {
    let config = FakeConfig {
        state_dir: None,
        ..config.clone()
    };
    let text = yaml_serde::to_string(&config).map_err(io::Error::other)?;
    write_atomic(&dir.join(CONTROL_FILE), text.as_bytes())
}

/// Remove `dir/control.yaml`: the plugin goes back to its `--cloud-config` settings.
pub fn remove_control(dir: &Path) -> io::Result<()> {
    match fs::remove_file(dir.join(CONTROL_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Write `path` via a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tmp.push(format!(".tmp{}-{n}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
    }
    fs::rename(&tmp, path)
}

// ---------------------------------------------------------------------------------------------
// Plugin side
// ---------------------------------------------------------------------------------------------

/// The call log: an append-only file (one `write` per line) plus a bounded in-memory copy.
pub(crate) struct CallLog {
    provider: String,
    /// `callLog`: false records nothing.
    enabled: bool,
    inner: Mutex<LogInner>,
}

struct LogInner {
    seq: u64,
    file: Option<File>,
    memory: VecDeque<CallRecord>,
    line: Vec<u8>,
}

impl CallLog {
    pub(crate) fn new(provider: String, dir: Option<&Path>, enabled: bool) -> io::Result<Self> {
        let file = dir
            .filter(|_| enabled)
            .map(|d| {
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(d.join(CALLS_FILE))
            })
            .transpose()?;
        Ok(Self {
            provider,
            enabled,
            inner: Mutex::new(LogInner {
                seq: 0,
                file,
                memory: VecDeque::new(),
                line: Vec::with_capacity(256),
            }),
        })
    }

    pub(crate) fn record(&self, call: &str, args: serde_json::Value) {
        self.record_delayed(call, args, 0);
    }

    /// [`CallLog::record`] with the calls in their latency wait ([`CallRecord::delayed`]).
    pub(crate) fn record_delayed(&self, call: &str, args: serde_json::Value, delayed: u64) {
        if !self.enabled {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let inner = &mut *g;
        inner.seq += 1;
        let rec = CallRecord {
            seq: inner.seq,
            call: call.to_string(),
            provider: self.provider.clone(),
            args,
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                .unwrap_or(0),
            pid: std::process::id(),
            delayed,
        };
        if let Some(file) = &mut inner.file {
            inner.line.clear();
            if serde_json::to_writer(&mut inner.line, &rec).is_ok() {
                inner.line.push(b'\n');
                if let Err(e) = file.write_all(&inner.line) {
                    ccm_provider_abi::log::debug!("fake cloud: cannot append to the call log: {e}");
                }
            }
        }
        if inner.memory.len() == MEMORY_LOG_CAP {
            inner.memory.pop_front();
        }
        inner.memory.push_back(rec);
    }

    pub(crate) fn snapshot(&self) -> Vec<CallRecord> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.memory.iter().cloned().collect()
    }

    pub(crate) fn clear(&self) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.memory.clear();
    }
}

/// Identity of one version of the control file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    ino: u64,
    len: u64,
    mtime: Option<SystemTime>,
}

/// What the watcher found on this call.
pub(crate) enum ControlChange {
    /// Nothing changed.
    None,
    /// A new, valid control configuration.
    New(Box<FakeConfig>),
    /// The file was removed: go back to the factory configuration.
    Removed,
}

/// Watches `stateDir/control.yaml` with one `stat` per call.
pub(crate) struct ControlWatcher {
    path: PathBuf,
    last: Mutex<Option<Fingerprint>>,
}

impl ControlWatcher {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(CONTROL_FILE),
            last: Mutex::new(None),
        }
    }

    /// Whether a control file was in force at the last [`ControlWatcher::poll`].
    pub(crate) fn active(&self) -> bool {
        self.last
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    pub(crate) fn poll(&self) -> ControlChange {
        let now = fs::metadata(&self.path).ok().map(|m| Fingerprint {
            ino: m.ino(),
            len: m.len(),
            mtime: m.modified().ok(),
        });
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == now {
            return ControlChange::None;
        }
        *last = now;
        if now.is_none() {
            return ControlChange::Removed;
        }
        // Read under the lock so that two racing calls do not both apply (and log) it.
        match fs::read(&self.path)
            .map_err(|e| e.to_string())
            .and_then(|b| FakeConfig::parse(&b).map_err(|e| e.message().to_string()))
        {
            Ok(c) if c.state_dir.is_some() => {
                ccm_provider_abi::log::error!(
                    "fake cloud: ignoring {}: stateDir can only be set in --cloud-config; keeping the last good settings",
                    self.path.display()
                );
                ControlChange::None
            }
            Ok(c) => ControlChange::New(Box::new(c)),
            Err(e) => {
                ccm_provider_abi::log::error!(
                    "fake cloud: ignoring {}: {e}; keeping the last good settings",
                    self.path.display()
                );
                ControlChange::None
            }
        }
    }
}

/// Writes `stateDir/cloud.json`.
pub(crate) struct StateFile {
    path: PathBuf,
    pending: PathBuf,
    /// The generation of the state last written: a write of an older snapshot (racing a newer
    /// one) is dropped, so the file never goes back in time.
    written: std::sync::Mutex<u64>,
    /// How many times the file was written.
    writes: std::sync::atomic::AtomicU64,
}

impl StateFile {
    pub(crate) fn new(dir: &Path) -> Self {
        Self {
            path: dir.join(STATE_FILE),
            pending: dir.join(STATE_PENDING_FILE),
            written: std::sync::Mutex::new(0),
            writes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Whether a state was written already (by this or another process).
    pub(crate) fn exists(&self) -> bool {
        self.path.exists()
    }

    /// The state last written (by this or another process sharing the `stateDir`), if any.
    pub(crate) fn read(&self) -> Option<FakeState> {
        let dir = self.path.parent()?;
        match FakeState::read(dir) {
            Ok(state) => Some(state),
            Err(e) => {
                ccm_provider_abi::log::error!(
                    "fake cloud: cannot read the shared state {}: {e}",
                    self.path.display()
                );
                None
            }
        }
    }

    /// Write `state`, the cloud's state at `generation`, unless a newer one was written.
    pub(crate) fn write_generation(&self, generation: u64, state: &FakeState) {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if generation < *written {
            return;
        }
        *written = generation;
        self.write(state);
    }

    /// Mark `cloud.json` as behind the cloud (a burst left to the writer thread) or not.
    pub(crate) fn mark_pending(&self, pending: bool) {
        let result = if pending {
            fs::write(&self.pending, b"")
        } else {
            match fs::remove_file(&self.pending) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        };
        if let Err(e) = result {
            ccm_provider_abi::log::warn!("fake cloud: cannot mark {}: {e}", self.pending.display());
        }
    }

    /// How many times the file was written.
    #[cfg(test)]
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn write(&self, state: &FakeState) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = serde_json::to_vec_pretty(state)
            .map_err(io::Error::other)
            .and_then(|bytes| write_atomic(&self.path, &bytes));
        if let Err(e) = result {
            ccm_provider_abi::log::warn!("fake cloud: cannot write {}: {e}", self.path.display());
        }
    }
}
