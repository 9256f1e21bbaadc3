//! The fake cloud itself: its settings (replaceable at run time), its state (load balancers,
//! routes, address allocations), the top-level provider interface and `Clusters`.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, RwLock, Weak};
use std::time::Duration;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde_json::json;

use crate::config::{FakeConfig, IpPool, ReconfigureMode};
use crate::control::{
    CallLog, CallRecord, ControlChange, ControlWatcher, FakeState, LoadBalancerRecord, RouteKey,
    RouteRecord, StateFile,
};
use crate::faults::{Counters, Faults};

/// Which registered provider a cloud is: they differ only in capability defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `fake`: every capability, InstancesV2 included.
    Fake,
    /// `fake-v1`: upstream fake's defaults, i.e. everything but InstancesV2.
    FakeV1,
}

/// The capabilities a cloud offers (fixed when it is created).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// `LoadBalancer()`.
    pub load_balancer: bool,
    /// `Instances()`.
    pub instances: bool,
    /// `InstancesV2()`.
    pub instances_v2: bool,
    /// `Zones()`.
    pub zones: bool,
    /// `Clusters()`.
    pub clusters: bool,
    /// `Routes()`.
    pub routes: bool,
    /// ABI 1.1 `BulkInstances` (`bulkInstances`, off by default).
    pub bulk_instances: bool,
    /// ABI 1.2 incremental host updates (`incrementalHosts`, off by default).
    pub incremental_hosts: bool,
}

impl Capabilities {
    fn from_config(flavour: Flavour, c: &FakeConfig) -> Self {
        let on = |disable: Option<bool>, default: bool| !disable.unwrap_or(!default);
        Self {
            load_balancer: on(c.disable_load_balancers, true),
            instances: on(c.disable_instances, true),
            instances_v2: on(c.disable_instances_v2, flavour == Flavour::Fake),
            zones: on(c.disable_zones, true),
            clusters: on(c.disable_clusters, true),
            routes: on(c.disable_routes, true),
            bulk_instances: c.bulk_instances,
            incremental_hosts: c.incremental_hosts,
        }
    }
}

/// How often a `stuck` call looks whether the live settings still list its method.
const STUCK_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// The settings in force, indexed for O(1) lookups. Replaced as a whole on a control change.
pub(crate) struct Settings {
    pub(crate) config: FakeConfig,
    /// Instance index by node name.
    pub(crate) by_name: HashMap<String, usize>,
    /// Instance index by (effective, non-empty) provider ID.
    pub(crate) by_provider_id: HashMap<String, usize>,
    pub(crate) faults: Faults,
    pub(crate) elsewhere: HashSet<String>,
}

impl Settings {
    fn build(config: FakeConfig, provider_name: &str) -> Self {
        let mut by_name = HashMap::with_capacity(config.instances.len());
        let mut by_provider_id = HashMap::with_capacity(config.instances.len());
        for (i, inst) in config.instances.iter().enumerate() {
            by_name.insert(inst.name.clone(), i);
            let pid = effective_provider_id(provider_name, inst);
            if !pid.is_empty() {
                by_provider_id.insert(pid, i);
            }
        }
        Self {
            faults: Faults::from_config(&config),
            elsewhere: config.implemented_elsewhere.iter().cloned().collect(),
            by_name,
            by_provider_id,
            config,
        }
    }
}

/// `providerID` of a configured instance: explicit, else `<providerName>://<instanceID|name>`.
pub(crate) fn effective_provider_id(
    provider_name: &str,
    inst: &crate::config::InstanceConfig,
) -> String {
    match &inst.provider_id {
        Some(id) => id.clone(),
        None => format!(
            "{provider_name}://{}",
            inst.instance_id.as_deref().unwrap_or(&inst.name)
        ),
    }
}

/// Mutable cloud resources.
#[derive(Default)]
pub(crate) struct CloudState {
    /// Load balancers by service key `namespace/name`.
    pub(crate) lbs: HashMap<String, LoadBalancerRecord>,
    pub(crate) pool: PoolAlloc,
    /// Routes by cluster, then by (target node, destination CIDR).
    pub(crate) routes: HashMap<String, HashMap<RouteKey, RouteRecord>>,
}

impl CloudState {
    /// The state of a `cloud.json` written by another process sharing the cloud.
    fn from_snapshot(snapshot: FakeState, pool: IpPool) -> Self {
        let mut state = Self::default();
        for lb in snapshot.load_balancers {
            let key = lb.service_key();
            if let Ok(ip) = lb.load_balancer_ip.parse::<Ipv4Addr>() {
                state.pool.restore(&key, ip, pool);
            }
            state.lbs.insert(key, lb);
        }
        for route in snapshot.routes {
            state
                .routes
                .entry(route.cluster.clone())
                .or_default()
                .insert(route.key(), route);
        }
        state
    }

    pub(crate) fn snapshot(&self) -> FakeState {
        let mut load_balancers: Vec<_> = self.lbs.values().cloned().collect();
        load_balancers.sort_by_key(|lb| lb.service_key());
        let mut routes: Vec<_> = self
            .routes
            .values()
            .flat_map(|r| r.values().cloned())
            .collect();
        routes.sort_by(|a, b| (&a.cluster, &a.name).cmp(&(&b.cluster, &b.name)));
        FakeState {
            load_balancers,
            routes,
        }
    }
}

/// Deterministic InternalIPs for instances without configured addresses: `10.0.0.0/8`, derived
/// from a hash of the node name; the rare collision moves to the next free address.
#[derive(Default)]
pub(crate) struct AutoIps {
    by_name: HashMap<String, Ipv4Addr>,
    used: HashSet<u32>,
}

impl AutoIps {
    const SPAN: u32 = (1 << 24) - 2;

    pub(crate) fn ip_for(&mut self, name: &str) -> Ipv4Addr {
        if let Some(ip) = self.by_name.get(name) {
            return *ip;
        }
        let mut i = (fnv1a(name.as_bytes()) % u64::from(Self::SPAN)) as u32;
        loop {
            let ip = (10u32 << 24) | (i + 1);
            if self.used.insert(ip) {
                let ip = Ipv4Addr::from(ip);
                self.by_name.insert(name.to_string(), ip);
                return ip;
            }
            i = (i + 1) % Self::SPAN;
        }
    }
}

/// Pool addresses handed out, by service key. An address stays with its service until the load
/// balancer is deleted.
#[derive(Default)]
pub(crate) struct PoolAlloc {
    by_key: HashMap<String, Ipv4Addr>,
    used: HashSet<Ipv4Addr>,
}

impl PoolAlloc {
    pub(crate) fn get_or_alloc(&mut self, key: &str, pool: IpPool) -> Result<Ipv4Addr> {
        if let Some(ip) = self.by_key.get(key) {
            return Ok(*ip);
        }
        let size = pool.size();
        if size == 0 {
            return Err(ProviderError::other(format!(
                "ipPool {pool} has no addresses"
            )));
        }
        // Start at a hash of the key so the address does not depend on the order of creation.
        let start = (fnv1a(key.as_bytes()) % u64::from(size)) as u32;
        for step in 0..size {
            let ip = pool.nth((start + step) % size);
            if self.used.insert(ip) {
                self.by_key.insert(key.to_string(), ip);
                return Ok(ip);
            }
        }
        Err(ProviderError::other(format!(
            "ipPool {pool} is exhausted ({size} load balancers)"
        )))
    }

    /// Record the address of a load balancer loaded from a shared `cloud.json` (only addresses
    /// of `pool` are the pool's to hand out and release).
    pub(crate) fn restore(&mut self, key: &str, ip: Ipv4Addr, pool: IpPool) {
        let offset = u64::from(u32::from(ip)).wrapping_sub(u64::from(u32::from(pool.network)));
        if u32::from(ip) >= u32::from(pool.network)
            && offset < 1u64 << (32 - u32::from(pool.prefix))
        {
            self.by_key.insert(key.to_string(), ip);
            self.used.insert(ip);
        }
    }

    pub(crate) fn release(&mut self, key: &str) {
        if let Some(ip) = self.by_key.remove(key) {
            self.used.remove(&ip);
        }
    }
}

/// 64-bit FNV-1a: stable across runs and Rust versions (unlike `DefaultHasher`).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A programmable in-memory cloud. Cheap to clone (shared state).
#[derive(Clone)]
pub struct FakeCloud {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) provider_name: String,
    /// The name the plugin registered this cloud under (the `providerName` when none is set).
    registered_name: String,
    caps: Capabilities,
    has_cluster_id: bool,
    /// The factory configuration (or the last one `reconfigure` applied): what a removed
    /// control file goes back to.
    base: Mutex<FakeConfig>,
    settings: RwLock<Arc<Settings>>,
    pub(crate) counters: Counters,
    control: Option<ControlWatcher>,
    pub(crate) log: CallLog,
    pub(crate) state: Mutex<CloudState>,
    state_file: Option<Arc<StateWriter>>,
    /// `sharedState`: `cloud.json` is loaded at creation and on `Initialize`.
    shared: bool,
    pub(crate) auto_ips: Mutex<AutoIps>,
    host: Mutex<Option<Host>>,
}

impl FakeCloud {
    /// Build a cloud from `--cloud-config` bytes (`None`: an empty cloud with `autoInstances`).
    pub fn new(registered_name: &str, flavour: Flavour, config: Option<&[u8]>) -> Result<Self> {
        let config = match config {
            Some(bytes) => FakeConfig::parse(bytes)?,
            None => FakeConfig::default(),
        };
        Self::from_config(registered_name, flavour, config)
    }

    /// Build a cloud from a configuration value.
    pub fn from_config(
        registered_name: &str,
        flavour: Flavour,
        config: FakeConfig,
    ) -> Result<Self> {
        config.validate()?;
        let provider_name = config
            .provider_name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| registered_name.to_string());
        let dir = config.state_dir.clone();
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                ProviderError::invalid_config(format!(
                    "fake cloud: cannot create stateDir {}: {e}",
                    dir.display()
                ))
            })?;
        }
        let log =
            CallLog::new(provider_name.clone(), dir.as_deref(), config.call_log).map_err(|e| {
                ProviderError::invalid_config(format!(
                    "fake cloud: cannot open the call log in stateDir {}: {e}",
                    dir.as_deref().unwrap_or(std::path::Path::new("")).display()
                ))
            })?;
        let mut state = CloudState::default();
        for seed in &config.routes {
            let rec = RouteRecord::from_seed(seed);
            state
                .routes
                .entry(rec.cluster.clone())
                .or_default()
                .insert(rec.key(), rec);
        }
        let cloud = Self {
            inner: Arc::new(Inner {
                registered_name: registered_name.to_string(),
                caps: Capabilities::from_config(flavour, &config),
                has_cluster_id: config.has_cluster_id,
                settings: RwLock::new(Arc::new(Settings::build(config.clone(), &provider_name))),
                provider_name,
                base: Mutex::new(config.clone()),
                counters: Counters::default(),
                control: dir.as_deref().map(ControlWatcher::new),
                log,
                state: Mutex::new(state),
                state_file: dir
                    .as_deref()
                    .filter(|_| config.cloud_state_file)
                    .map(|dir| Arc::new(StateWriter::new(StateFile::new(dir)))),
                shared: config.shared_state,
                auto_ips: Mutex::new(AutoIps::default()),
                host: Mutex::new(None),
            }),
        };
        if let Some(dir) = dir.as_deref().filter(|_| config.heap_file) {
            spawn_heap_writer(&cloud.inner, dir.join(HEAP_FILE));
        }
        // Apply a control file that is already there, and publish the initial state (or, when
        // shared, take over the state another process published).
        let _ = cloud.settings();
        if let Some(w) = &cloud.inner.state_file {
            if cloud.inner.shared && w.file.exists() {
                cloud.load_shared_state();
            } else {
                w.file.write(&lock(&cloud.inner.state).snapshot());
            }
            if !cloud.inner.shared {
                w.spawn(Arc::downgrade(&cloud.inner))?;
            }
        }
        Ok(cloud)
    }

    /// `sharedState`: replace the in-memory state with the one in `cloud.json`.
    fn load_shared_state(&self) {
        let Some(file) = self
            .inner
            .state_file
            .as_ref()
            .filter(|_| self.inner.shared)
            .map(|w| &w.file)
        else {
            return;
        };
        if let Some(snapshot) = file.read() {
            let pool = self.settings().config.ip_pool;
            *lock(&self.inner.state) = CloudState::from_snapshot(snapshot, pool);
        }
    }

    /// The capabilities this cloud offers.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// The calls recorded so far (the last 50,000), in order.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.inner.log.snapshot()
    }

    /// The stable names of the calls recorded so far.
    pub fn call_names(&self) -> Vec<String> {
        self.calls().into_iter().map(|c| c.call).collect()
    }

    /// Forget the in-memory call records (upstream `ClearCalls`; the file is not touched).
    pub fn clear_calls(&self) {
        self.inner.log.clear()
    }

    /// The cloud's load balancers and routes.
    pub fn state(&self) -> FakeState {
        lock(&self.inner.state).snapshot()
    }

    /// Replace the live settings, exactly as a new control file would.
    pub fn set_config(&self, config: FakeConfig) -> Result<()> {
        config.validate()?;
        self.install(config);
        Ok(())
    }

    /// True once `initialize` was called (the cloud keeps the `Host` it was given).
    pub fn is_initialized(&self) -> bool {
        lock(&self.inner.host).is_some()
    }

    fn install(&self, live: FakeConfig) {
        // Only the programmable part is live; the rest is fixed at creation.
        let config = with_fixed(live, &lock(&self.inner.base));
        let settings = Arc::new(Settings::build(config, &self.inner.provider_name));
        *self
            .inner
            .settings
            .write()
            .unwrap_or_else(PoisonError::into_inner) = settings;
        self.inner.counters.reset();
        ccm_provider_abi::log::debug!("fake cloud: new settings installed");
    }

    /// The settings in force (one `stat` of the control file when a stateDir is set).
    pub(crate) fn settings(&self) -> Arc<Settings> {
        if let Some(w) = &self.inner.control {
            match w.poll() {
                ControlChange::None => {}
                ControlChange::New(c) => self.install(*c),
                ControlChange::Removed => {
                    let base = lock(&self.inner.base).clone();
                    self.install(base)
                }
            }
        }
        self.inner
            .settings
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Start of every provider call: pick up control changes, record the call, run the faults.
    pub(crate) fn begin(
        &self,
        method: &str,
        call: &str,
        args: serde_json::Value,
        ctx: &CallContext,
    ) -> Result<Arc<Settings>> {
        let mut s = self.settings();
        ccm_provider_abi::log::debug!("fake cloud: {method} {args}");
        self.inner
            .log
            .record_delayed(call, args, self.inner.counters.delayed());
        // `stuck`: block without looking at the context, until the live settings drop the
        // method (a control-file change).
        while s.faults.stuck(method) {
            std::thread::sleep(STUCK_POLL);
            s = self.settings();
        }
        s.faults.apply(method, ctx, &self.inner.counters, &|| {
            self.inner
                .log
                .record("cancel-observed", json!({ "method": method }))
        })?;
        Ok(s)
    }

    /// Change the cloud state; `f` returns whether it changed anything, in which case
    /// `cloud.json` is rewritten off the state lock ([`StateWriter`]): a 2,000-node cloud's file
    /// is megabytes, and writing it under the lock after every change made concurrent calls wait
    /// for each other's writes past their deadline. With `sharedState` it is written at once
    /// under the lock, as the file is then the cloud other processes take over.
    pub(crate) fn mutate<R>(&self, f: impl FnOnce(&mut CloudState) -> (R, bool)) -> R {
        let mut state = lock(&self.inner.state);
        let (r, changed) = f(&mut state);
        if changed {
            if let Some(w) = &self.inner.state_file {
                if self.inner.shared {
                    w.file.write(&state.snapshot());
                } else {
                    w.generation.fetch_add(1, Ordering::SeqCst);
                    drop(state);
                    w.changed(&self.inner);
                }
            }
        }
        r
    }

    /// How many times `cloud.json` was written since the cloud was created (tests).
    #[cfg(test)]
    pub(crate) fn state_file_writes(&self) -> u64 {
        self.inner
            .state_file
            .as_ref()
            .map_or(0, |w| w.file.writes())
    }
}

/// How long the writer thread waits between two writes of a burst handed to it: changes within
/// it are written together.
pub(crate) const STATE_WRITE_INTERVAL: Duration = Duration::from_millis(200);

/// Writes of one caller in a row before it hands the rest of a burst to the writer thread.
const CALLER_ROUNDS: usize = 2;

/// Keeps `cloud.json` up to date off the state lock, coalescing changes:
/// - the call whose change finds no write in progress writes the file itself (a snapshot taken
///   briefly under the state lock, written outside it), so a lone change is on disk when its
///   call returns;
/// - a change made while a write is in progress only marks the file dirty: the writing call
///   writes again (one write for every change made meanwhile) before it returns;
/// - after [`CALLER_ROUNDS`] writes in a row, a burst that keeps going is handed to the writer
///   thread, which writes at most every [`STATE_WRITE_INTERVAL`] until the changes stop.
///
/// When the cloud is dropped, a change not yet written is written then.
pub(crate) struct StateWriter {
    pub(crate) file: StateFile,
    /// Bumped under the state lock with every change.
    generation: AtomicU64,
    flags: Mutex<WriterFlags>,
    cv: Condvar,
}

#[derive(Default)]
struct WriterFlags {
    /// A call or the thread is writing (and will look at `dirty` before it stops).
    writing: bool,
    /// A change not yet in a snapshot being written.
    dirty: bool,
    /// The writer thread owns the writing.
    handed_off: bool,
    closed: bool,
}

impl StateWriter {
    fn new(file: StateFile) -> Self {
        Self {
            file,
            generation: AtomicU64::new(0),
            flags: Mutex::new(WriterFlags::default()),
            cv: Condvar::new(),
        }
    }

    /// Snapshot the state (under its lock) and write it (outside).
    fn write_now(&self, inner: &Inner) {
        let (generation, snapshot) = {
            let state = lock(&inner.state);
            (self.generation.load(Ordering::SeqCst), state.snapshot())
        };
        self.file.write_generation(generation, &snapshot);
    }

    /// A change was made (the state lock released).
    fn changed(&self, inner: &Inner) {
        {
            let mut flags = lock(&self.flags);
            if flags.writing {
                flags.dirty = true;
                return;
            }
            flags.writing = true;
        }
        for round in 1.. {
            self.write_now(inner);
            let mut flags = lock(&self.flags);
            if !flags.dirty {
                flags.writing = false;
                return;
            }
            flags.dirty = false;
            if round >= CALLER_ROUNDS {
                // Still changing: the thread takes over, the call returns. The marker says so
                // (under the flags' lock, so it never races the thread's removal).
                flags.dirty = true;
                flags.handed_off = true;
                self.file.mark_pending(true);
                drop(flags);
                self.cv.notify_one();
                return;
            }
        }
    }

    /// The writer thread: waits for a burst handed to it; `false` once the cloud is gone.
    fn wait_handoff(&self) -> bool {
        let mut flags = lock(&self.flags);
        while !flags.handed_off && !flags.closed {
            flags = self.cv.wait(flags).unwrap_or_else(PoisonError::into_inner);
        }
        !flags.closed
    }

    /// Stop the thread; whether a change was left unwritten.
    fn close(&self) -> bool {
        let mut flags = lock(&self.flags);
        flags.closed = true;
        let unwritten = flags.dirty || flags.handed_off;
        drop(flags);
        self.cv.notify_one();
        unwritten
    }

    fn spawn(self: &Arc<Self>, cloud: Weak<Inner>) -> Result<()> {
        let writer = Arc::clone(self);
        std::thread::Builder::new()
            .name("fake-cloud-state".into())
            .spawn(move || {
                while writer.wait_handoff() {
                    loop {
                        std::thread::sleep(STATE_WRITE_INTERVAL);
                        {
                            let mut flags = lock(&writer.flags);
                            if flags.closed {
                                return;
                            }
                            flags.dirty = false;
                        }
                        let Some(inner) = cloud.upgrade() else { return };
                        writer.write_now(&inner);
                        drop(inner);
                        let mut flags = lock(&writer.flags);
                        if !flags.dirty {
                            flags.handed_off = false;
                            flags.writing = false;
                            writer.file.mark_pending(false);
                            break;
                        }
                    }
                }
            })
            .map(drop)
            .map_err(|e| {
                ProviderError::other(format!(
                    "fake cloud: cannot start the thread writing cloud.json: {e}"
                ))
            })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(w) = self.state_file.as_ref().filter(|_| !self.shared) {
            if w.close() {
                let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
                w.file
                    .write_generation(w.generation.load(Ordering::SeqCst), &state.snapshot());
                w.file.mark_pending(false);
            }
        }
    }
}

/// `live` with the fields that are fixed at creation taken from `base`.
fn with_fixed(live: FakeConfig, base: &FakeConfig) -> FakeConfig {
    FakeConfig {
        provider_name: base.provider_name.clone(),
        has_cluster_id: base.has_cluster_id,
        disable_instances: base.disable_instances,
        disable_instances_v2: base.disable_instances_v2,
        disable_load_balancers: base.disable_load_balancers,
        disable_routes: base.disable_routes,
        disable_zones: base.disable_zones,
        disable_clusters: base.disable_clusters,
        bulk_instances: base.bulk_instances,
        incremental_hosts: base.incremental_hosts,
        state_dir: base.state_dir.clone(),
        cloud_state_file: base.cloud_state_file,
        shared_state: base.shared_state,
        routes: base.routes.clone(),
        ..live
    }
}

/// The top-level keys fixed at creation that differ between `old` and `new`.
fn fixed_changes(old: &FakeConfig, new: &FakeConfig) -> Vec<String> {
    let (Ok(old), Ok(new)) = (
        serde_json::to_value(with_fixed(FakeConfig::default(), old)),
        serde_json::to_value(with_fixed(FakeConfig::default(), new)),
    ) else {
        return vec!["(unserialisable config)".into()];
    };
    let keys = |v: &serde_json::Value| -> std::collections::BTreeSet<String> {
        v.as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default()
    };
    keys(&old)
        .union(&keys(&new))
        .filter(|k| old.get(k.as_str()) != new.get(k.as_str()))
        .cloned()
        .collect()
}

impl CloudProvider for FakeCloud {
    fn provider_name(&self) -> String {
        self.inner.provider_name.clone()
    }

    fn has_cluster_id(&self) -> bool {
        self.inner.has_cluster_id
    }

    fn initialize(&self, ctx: &CallContext, host: Host) -> Result<()> {
        let cluster = host.cluster_name();
        self.begin(
            "Initialize",
            "initialize",
            json!({ "cluster": cluster }),
            ctx,
        )?;
        // A new leader takes over the cloud as the previous one left it.
        self.load_shared_state();
        *lock(&self.inner.host) = Some(host);
        Ok(())
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        self.inner
            .caps
            .load_balancer
            .then(|| Arc::new(self.clone()) as Arc<dyn LoadBalancer>)
    }

    fn instances(&self) -> Option<Arc<dyn Instances>> {
        self.inner
            .caps
            .instances
            .then(|| Arc::new(self.clone()) as Arc<dyn Instances>)
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        self.inner
            .caps
            .instances_v2
            .then(|| Arc::new(self.clone()) as Arc<dyn InstancesV2>)
    }

    fn zones(&self) -> Option<Arc<dyn Zones>> {
        self.inner
            .caps
            .zones
            .then(|| Arc::new(self.clone()) as Arc<dyn Zones>)
    }

    fn clusters(&self) -> Option<Arc<dyn Clusters>> {
        self.inner
            .caps
            .clusters
            .then(|| Arc::new(self.clone()) as Arc<dyn Clusters>)
    }

    /// The `health` setting: healthy unless it names an error (not recorded in the call log,
    /// so the host's periodic probe does not fill it).
    fn health(&self, _ctx: &CallContext) -> Result<()> {
        let s = self.settings();
        crate::faults::health(s.config.health.as_ref(), &self.inner.counters)
    }

    /// New `--cloud-config` bytes, applied in place (`reconfigure: inPlace`, the default) unless
    /// they change a field fixed at creation; `reconfigure: notImplemented` makes the host
    /// rebuild the provider instead. A control file in force stays in force; the new config
    /// is what removing it goes back to.
    fn reconfigure(&self, _ctx: &CallContext, config: &[u8]) -> Result<()> {
        let s = self.settings();
        self.inner
            .log
            .record("reconfigure", json!({ "bytes": config.len() }));
        if s.config.reconfigure == ReconfigureMode::NotImplemented {
            return Err(ProviderError::not_implemented());
        }
        let mut new = FakeConfig::parse(config)?;
        {
            let mut base = lock(&self.inner.base);
            // `providerName` set to the name in force (or left out when it is the registered
            // name) is no change.
            let effective = new
                .provider_name
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(&self.inner.registered_name);
            if effective == self.inner.provider_name {
                new.provider_name = base.provider_name.clone();
            }
            let changed = fixed_changes(&base, &new);
            if !changed.is_empty() {
                return Err(ProviderError::invalid_config(format!(
                    "fake cloud: reconfigure cannot change {} (fixed when the cloud is created)",
                    changed.join(", ")
                )));
            }
            *base = new.clone();
        }
        if !self
            .inner
            .control
            .as_ref()
            .is_some_and(ControlWatcher::active)
        {
            self.install(new);
        }
        ccm_provider_abi::log::info!("fake cloud: reconfigured in place");
        Ok(())
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.inner
            .caps
            .routes
            .then(|| Arc::new(self.clone()) as Arc<dyn Routes>)
    }

    fn bulk_instances(&self) -> Option<Arc<dyn BulkInstances>> {
        self.inner
            .caps
            .bulk_instances
            .then(|| Arc::new(self.clone()) as Arc<dyn BulkInstances>)
    }
}

impl Clusters for FakeCloud {
    fn list_clusters(&self, ctx: &CallContext) -> Result<Vec<String>> {
        let s = self.begin("ListClusters", "list-clusters", json!({}), ctx)?;
        Ok(s.config.clusters.clone())
    }

    fn master(&self, ctx: &CallContext, cluster_name: &str) -> Result<String> {
        let s = self.begin("Master", "master", json!({ "cluster": cluster_name }), ctx)?;
        Ok(s.config.master.clone())
    }
}

/// The file `heapFile` writes in the state directory.
pub const HEAP_FILE: &str = "heap.json";

/// Write `{"current": bytes, "peak": bytes, "footprint": bytes, "footprintPeak": bytes}` of the
/// plugin's heap ([`crate::heap`]) to `path` (replacing the file at once) until the cloud is
/// dropped: every 200 ms, and within 10 ms of the footprint moving by 1 MiB or more. A reader
/// sampling the process's RSS beside it would otherwise subtract a footprint up to 200 ms old
/// while a load-balancer call's parse of every host grows or frees hundreds of MiB.
fn spawn_heap_writer(inner: &Arc<Inner>, path: std::path::PathBuf) {
    const POLL: Duration = Duration::from_millis(10);
    const PERIOD: Duration = Duration::from_millis(200);
    const MOVED: usize = 1 << 20;
    let cloud = Arc::downgrade(inner);
    let tmp = path.with_extension("json.tmp");
    let spawned = std::thread::Builder::new()
        .name("fake-heap-file".into())
        .spawn(move || {
            let mut written: Option<(std::time::Instant, usize)> = None;
            while cloud.strong_count() > 0 {
                let footprint = crate::heap::footprint_current();
                let due = written.is_none_or(|(at, fp)| {
                    at.elapsed() >= PERIOD || fp.abs_diff(footprint) >= MOVED
                });
                if due {
                    let text = format!(
                        "{{\"current\":{},\"peak\":{},\"footprint\":{},\"footprintPeak\":{}}}\n",
                        crate::heap::current(),
                        crate::heap::peak(),
                        footprint,
                        crate::heap::footprint_peak()
                    );
                    if std::fs::write(&tmp, text).is_ok() {
                        let _ = std::fs::rename(&tmp, &path);
                    }
                    written = Some((std::time::Instant::now(), footprint));
                }
                std::thread::sleep(POLL);
            }
        });
    if let Err(e) = spawned {
        ccm_provider_abi::log::warn!("fake cloud: cannot start the heap file writer: {e}");
    }
}
