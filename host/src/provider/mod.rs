//! The selected cloud provider as the controllers see it: typed async methods over the plugin's
//! ABI, all going through one call path ([`Provider::call`]).
//!
//! The host never calls a plugin on an async worker: every call runs on the provider's own call
//! pool ([`pool`]: threads owned by the provider, so a call stuck in a plugin never holds one of
//! tokio's threads) with a deadline; when the deadline passes the host stops waiting, sets the call's cancellation
//! flag (which the plugin can poll through its `CallContext`) and returns `DeadlineExceeded`.
//! Dropping the returned future (e.g. on shutdown) cancels the call the same way.
//!
//! Beyond upstream, the same path applies a host-wide budget of cloud calls
//! (`--cloud-api-qps`/`--cloud-api-burst`, shared round-robin between the calling controllers,
//! see [`crate::runtime::rate_limit`]), coalesces identical read calls that are in flight at the same
//! time (two `InstanceMetadata` calls for one node make one plugin call), pauses every call to
//! the provider after the cloud throttled one ([`throttle`]: ABI 1.1 `THROTTLED`), and records
//! [`CallMetrics`].
//!
//! Instance lookups can also go through [`bulk`] (ABI 1.1 `BULK_INSTANCES`: many nodes in one
//! call) and the provider's cache of instance answers ([`instance_cache`]).

pub(crate) mod bulk;
mod call_metrics;
mod host_services;
pub(crate) mod instance_cache;
pub(crate) mod lifecycle;
pub(crate) mod limits;
pub mod pool;
pub(crate) mod throttle;

use std::any::Any;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use abi_stable::std_types::{RResult, RString};
use ccm_provider_abi::abi::{
    ClustersBox, InstancesBox, InstancesV2Box, LoadBalancerBox, RoutesBox, ZonesBox,
};
use ccm_provider_abi::ext::{ExtCapabilities, ProviderExtBox};
use ccm_provider_abi::ext_v1_2::{
    AbiHostUpdate, ExtCapabilitiesV1_2, HostUpdateOutcome, ProviderExtV1_2Box,
};
use ccm_provider_abi::types::AbiRoute;
use ccm_provider_abi::{CallContext, ErrorKind, InstanceMetadata, ProviderError, Route, Zone};
use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use serde::Serialize;

use crate::plugin::{Factory, PluginRegistry, SelectError};
use crate::runtime::cached_node::NodeRef;
use crate::runtime::rate_limit::FairLimiter;
pub use call_metrics::CallMetrics;
use call_metrics::{CallLabels, CallerLabels, ErrorLabels, InFlight, MethodLabels};
pub use ccm_provider_abi::ext::InstanceQuery;
pub use host_services::HostServices;
pub use instance_cache::{CacheUse, InstanceAnswer};
pub use lifecycle::{ReloadError, ReloadMethod, ReloadMetrics};
use throttle::Throttle;
pub use throttle::Throttled;

impl PluginRegistry {
    /// Build the provider `name` from its plugin's factory with the cloud config bytes
    /// (upstream `InitCloudProvider`). Defined here rather than in `plugin` so that the loader
    /// does not depend on the call layer.
    pub fn create(
        &self,
        name: &str,
        config: Option<&[u8]>,
        options: &ProviderOptions,
    ) -> Result<Provider, SelectError> {
        let reg = self.registration(name)?;
        Provider::create(&reg.name, &reg.plugin_path, &reg.factory, config, options).map_err(|e| {
            SelectError::Factory(format!(
                "could not init cloud provider {name:?} (from {}): {e}",
                reg.plugin_path.display()
            ))
        })
    }
}

/// Options of the provider call layer.
#[derive(Debug, Clone)]
pub struct ProviderOptions {
    /// Deadline of every provider call (default 30 s).
    pub call_timeout: Duration,
    /// Host-wide budget of cloud calls per second (`--cloud-api-qps`); 0 = unlimited.
    pub cloud_api_qps: f64,
    /// Calls allowed at once above the rate (`--cloud-api-burst`).
    pub cloud_api_burst: u32,
    /// How long the first node of a bulk instance lookup waits for others
    /// (`--instance-batch-window`; [`bulk`]).
    pub instance_batch_window: Duration,
    /// The most nodes in one bulk instance lookup (`--instance-batch-size`).
    pub instance_batch_size: usize,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(30),
            cloud_api_qps: 0.0,
            cloud_api_burst: 1,
            instance_batch_window: bulk::DEFAULT_INSTANCE_BATCH_WINDOW,
            instance_batch_size: bulk::DEFAULT_INSTANCE_BATCH_SIZE,
        }
    }
}

/// The caller label of calls made outside a controller (Initialize, tools).
pub const HOST_CALLER: &str = "host";

/// Which optional capabilities the provider offers (upstream's `(impl, bool)` getters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// `LoadBalancer()`
    pub load_balancer: bool,
    /// `Instances()`
    pub instances: bool,
    /// `InstancesV2()`
    pub instances_v2: bool,
    /// `Zones()`
    pub zones: bool,
    /// `Clusters()`
    pub clusters: bool,
    /// `Routes()`
    pub routes: bool,
}

impl Capabilities {
    /// Names of the capabilities present, upstream spelling.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.instances_v2, "InstancesV2"),
            (self.instances, "Instances"),
            (self.zones, "Zones"),
            (self.load_balancer, "LoadBalancer"),
            (self.routes, "Routes"),
            (self.clusters, "Clusters"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// The selected provider. Cheap to clone; share it between controllers, each under its own
/// caller name ([`Provider::for_caller`]) so the call budget can be fair between them.
#[derive(Clone)]
pub struct Provider {
    inner: Arc<Inner>,
    caller: &'static str,
    /// Overrides `options.call_timeout` for this handle ([`Provider::with_call_timeout`]).
    call_timeout: Option<Duration>,
}

type SharedCall<T> = Shared<BoxFuture<'static, Result<T, ProviderError>>>;

struct Inner {
    registered_name: String,
    plugin_path: PathBuf,
    options: ProviderOptions,
    /// The plugin's objects (cloud, capability objects, 1.1 extension), replaced as a whole by a
    /// `--cloud-config` reload; every call clones what it needs out of it at its start
    /// ([`lifecycle`]). Everything else here is the host's and survives a reload.
    plugin: RwLock<Arc<lifecycle::Plugin>>,
    /// What the provider offers (provider name, capabilities, platforms, ...): the first
    /// instance's, fixed for the life of the provider (a reload must keep it).
    identity: lifecycle::Identity,
    /// The factory, for rebuilding the provider with a new config.
    factory: Arc<Factory>,
    /// Serialises reloads and `Initialize`; remembers what `Initialize` was given.
    lifecycle: tokio::sync::Mutex<lifecycle::Lifecycle>,
    /// `ccm_cloud_config_reloads_total`.
    reload_metrics: ReloadMetrics,
    budget: Option<FairLimiter>,
    /// The pause after a throttled call, shared by every caller and method.
    throttle: Throttle,
    metrics: CallMetrics,
    /// Read calls in flight, by [`ReadKey`].
    in_flight_reads: Mutex<HashMap<ReadKey, ReadEntry>>,
    /// Nodes collected into bulk instance lookups (not a plugin object: it calls the plugin
    /// through [`Provider::call`]).
    batcher: bulk::Batcher,
    /// Instance answers, read by each caller with a max-age of its own.
    instance_cache: instance_cache::InstanceCache,
    /// The threads calls run on.
    pool: pool::CallPool,
}

/// What identifies a call for coalescing and joining ([`pool::CallKey`]): the method, the
/// instance cache's generation (bumped by every `--cloud-config` reload) and a SHA-256 digest
/// of the call's arguments. A digest rather than the arguments: for an instance lookup they are
/// the node's JSON, a few KB that the map and each waiter held in copies of their own (the
/// address loop keeps 64 lookups in flight).
type ReadKey = pool::CallKey;

fn read_call_key(op: &'static str, generation: u64, args: &str) -> ReadKey {
    call_key(op, generation, &[args])
}

/// The key of a call with several arguments (each length-prefixed, so no two argument lists
/// hash alike by moving a boundary).
fn call_key(op: &'static str, generation: u64, args: &[&str]) -> pool::CallKey {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for a in args {
        ctx.update(&(a.len() as u64).to_le_bytes());
        ctx.update(a.as_bytes());
    }
    let mut digest = [0; 32];
    digest.copy_from_slice(ctx.finish().as_ref());
    (op, generation, digest)
}

/// A read call in flight: a `WeakShared` of its shared future (typed by the call's result).
struct ReadEntry {
    weak: Box<dyn Any + Send + Sync>,
    /// Whether the call is still running (monomorphised for the entry's result type).
    running: fn(&(dyn Any + Send + Sync)) -> bool,
}

fn upgrade<T: Clone + Send + Sync + 'static>(
    weak: &(dyn Any + Send + Sync),
) -> Option<SharedCall<T>> {
    weak.downcast_ref::<WeakShared<BoxFuture<'static, Result<T, ProviderError>>>>()
        .and_then(WeakShared::upgrade)
        .filter(|call| call.peek().is_none())
}

fn running<T: Clone + Send + Sync + 'static>(weak: &(dyn Any + Send + Sync)) -> bool {
    upgrade::<T>(weak).is_some()
}

/// Entries are normally removed by their last waiter; when every waiter was dropped first, a dead
/// entry stays until its key is used again or the map grows past this size and is swept.
const READ_SWEEP_THRESHOLD: usize = 512;

fn unsupported(capability: &str) -> ProviderError {
    ProviderError::not_implemented()
        .context(format!("the cloud provider does not support {capability}"))
}

fn to_json<T: Serialize>(what: &str, value: &T) -> Result<String, ProviderError> {
    serde_json::to_string(value)
        .map_err(|e| ProviderError::other(format!("cannot serialise {what} for the provider: {e}")))
}

/// A host list serialised for the plugin once and shared by any number of load-balancer calls:
/// a node sync serialises the current hosts once and hands the same bytes (and their digest,
/// the key of the write call) to every Service's `UpdateLoadBalancer`, instead of one JSON copy
/// of every host per Service. Cheap to clone.
#[derive(Clone)]
pub struct HostList {
    json: Arc<[RString]>,
    /// SHA-256 over the length-prefixed JSON of every host ([`call_key`]'s framing).
    digest: [u8; 32],
    bytes: usize,
}

impl HostList {
    /// Serialise `nodes` (in this order).
    pub fn new(nodes: &[impl NodeRef]) -> Result<Self, ProviderError> {
        let json = nodes_json(nodes)?;
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut bytes = 0;
        for h in &json {
            ctx.update(&(h.len() as u64).to_le_bytes());
            ctx.update(h.as_bytes());
            bytes += h.len();
        }
        let mut digest = [0; 32];
        digest.copy_from_slice(ctx.finish().as_ref());
        Ok(Self {
            json: json.into(),
            digest,
            bytes,
        })
    }

    /// The empty list.
    pub fn empty() -> Self {
        Self::new(&[] as &[Node]).expect("an empty list serialises")
    }

    /// Number of hosts.
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// No hosts.
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    /// Bytes of JSON the list hands to the plugin.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Let go of the list after its last call (see [`release_host_list`]).
    pub fn release(self) {
        release_host_list(self);
    }
}

impl std::fmt::Debug for HostList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostList")
            .field("len", &self.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

/// Sets the call's cancellation flag when dropped before the call finished.
struct CancelOnDrop(Option<CallContext>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            ctx.cancel();
        }
    }
}

impl Provider {
    /// Run the factory (with the deadline) and cache the capability objects.
    pub(crate) fn create(
        registered_name: &str,
        plugin_path: &Path,
        factory: &Arc<Factory>,
        config: Option<&[u8]>,
        options: &ProviderOptions,
    ) -> Result<Self, ProviderError> {
        let plugin = lifecycle::Plugin::build(factory, config, options.call_timeout)?;
        let metrics = CallMetrics::default();
        let inner = Inner {
            registered_name: registered_name.to_string(),
            plugin_path: plugin_path.to_path_buf(),
            options: options.clone(),
            identity: plugin.identity.clone(),
            plugin: RwLock::new(Arc::new(plugin)),
            factory: factory.clone(),
            lifecycle: tokio::sync::Mutex::default(),
            reload_metrics: ReloadMetrics::default(),
            budget: (options.cloud_api_qps > 0.0)
                .then(|| FairLimiter::new(options.cloud_api_qps, options.cloud_api_burst)),
            throttle: Throttle::default(),
            pool: pool::CallPool::new(registered_name, metrics.pool.clone()),
            metrics,
            in_flight_reads: Mutex::new(HashMap::new()),
            batcher: bulk::Batcher::new(options.instance_batch_window, options.instance_batch_size),
            instance_cache: instance_cache::InstanceCache::default(),
        };
        Ok(Self {
            inner: Arc::new(inner),
            caller: HOST_CALLER,
            call_timeout: None,
        })
    }

    /// The same provider, with calls labelled (metrics) and queued (budget) as `caller`.
    pub fn for_caller(&self, caller: &'static str) -> Provider {
        Provider {
            inner: self.inner.clone(),
            caller,
            call_timeout: self.call_timeout,
        }
    }

    /// The same provider (same plugin object, same metrics) with another call deadline for the
    /// calls made through this handle (`ccm-host check` probes the provider with expired ones).
    pub fn with_call_timeout(&self, timeout: Duration) -> Provider {
        Provider {
            call_timeout: Some(timeout),
            ..self.clone()
        }
    }

    /// The caller name of this handle.
    pub fn caller(&self) -> &'static str {
        self.caller
    }

    /// The call metrics (register them with [`CallMetrics::register`]).
    pub fn metrics(&self) -> &CallMetrics {
        &self.inner.metrics
    }

    /// The name the provider was registered and selected under.
    pub fn registered_name(&self) -> &str {
        &self.inner.registered_name
    }

    /// `ProviderName()`: the scheme of provider IDs.
    pub fn provider_name(&self) -> &str {
        &self.inner.identity.provider_name
    }

    /// The plugin file the provider came from.
    pub fn plugin_path(&self) -> &Path {
        &self.inner.plugin_path
    }

    /// The ccm-provider-abi generation of the provider's interface: `1.2` or `1.1` when its
    /// plugin offers that extension, else `1.0`.
    pub fn abi_generation(&self) -> &'static str {
        if self.inner.identity.abi_1_2 {
            "1.2"
        } else if self.inner.identity.abi_1_1 {
            "1.1"
        } else {
            "1.0"
        }
    }

    /// The platforms (providerID prefixes, KEP-5778) this provider owns.
    pub fn platforms(&self) -> &[String] {
        &self.inner.identity.platforms
    }

    /// What the provider's ABI 1.1 extension declared (empty for a 1.0 plugin).
    pub fn ext_capabilities(&self) -> ExtCapabilities {
        self.inner.identity.ext_capabilities
    }

    /// `HasClusterID()`.
    pub fn has_cluster_id(&self) -> bool {
        self.inner.identity.has_cluster_id
    }

    /// The optional capabilities present.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.identity.capabilities
    }

    /// The end of the throttling pause in effect, if any ([`throttle`]).
    pub fn throttled_until(&self) -> Option<tokio::time::Instant> {
        self.inner.throttle.paused_until()
    }

    /// The single path every provider call takes: throttling pause, budget, call pool,
    /// deadline, cancellation, metrics. Such a call never joins another one; see
    /// [`Provider::call_keyed`].
    ///
    /// The deadline starts when the plugin is called: waiting for a throttling pause or for the
    /// budget does not use it up. Dropping the future ends either wait at once.
    pub async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T, ProviderError>
    where
        T: limits::Bounded + Clone + Send + 'static,
        F: FnOnce(&CallContext) -> RResult<T, ProviderError> + Send + 'static,
    {
        self.call_keyed(op, None, f).await
    }

    /// [`Provider::call`] for a call identified by `key` ([`call_key`]): while an identical
    /// call's thread still runs in the plugin, hung past its deadline included, this call waits
    /// for that thread's answer (within its own deadline) instead of taking another thread
    /// ([`pool`]).
    async fn call_keyed<T, F>(
        &self,
        op: &'static str,
        key: Option<pool::CallKey>,
        f: F,
    ) -> Result<T, ProviderError>
    where
        T: limits::Bounded + Clone + Send + 'static,
        F: FnOnce(&CallContext) -> RResult<T, ProviderError> + Send + 'static,
    {
        let metrics = &self.inner.metrics;
        let throttle = &self.inner.throttle;
        let mut paused = throttle.wait().await;
        if let Some(budget) = &self.inner.budget {
            let waited = budget.acquire(self.caller).await;
            metrics
                .budget_wait
                .get_or_create(&CallerLabels {
                    caller: self.caller,
                })
                .observe(waited.as_secs_f64());
            // A pause that began while this call waited for its token.
            paused += throttle.wait().await;
        }
        if !paused.is_zero() {
            metrics
                .throttle_wait
                .get_or_create(&CallerLabels {
                    caller: self.caller,
                })
                .observe(paused.as_secs_f64());
        }
        metrics
            .calls
            .get_or_create(&CallLabels {
                method: op,
                caller: self.caller,
            })
            .inc();
        let method = MethodLabels { method: op };
        let _in_flight = InFlight::start(metrics.in_flight.get_or_create(&method).clone());
        let started = std::time::Instant::now();

        let timeout = self.call_timeout.unwrap_or(self.inner.options.call_timeout);
        let epoch = throttle.epoch();
        let deadline = tokio::time::Instant::now() + timeout;
        // An identical call still running in the plugin (hung past its deadline included):
        // wait for its answer within this call's deadline instead of taking another thread.
        if let Some(key) = &key {
            if let Some(mut joined) = self.inner.pool.join::<Result<T, ProviderError>>(key) {
                metrics.coalesced.get_or_create(&method).inc();
                let outcome = tokio::time::timeout_at(deadline, &mut joined).await;
                drop(joined);
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let answered = match outcome {
                    // It ran into its own deadline with most of this caller's spent waiting
                    // for it: the same question went unanswered for as long, and the plugin's
                    // message says where (e.g. the cloud's action and endpoint). Asking again
                    // in what is left would only end in the host's bare "did not return".
                    Ok(Ok(Err(e)))
                        if e.kind() == ErrorKind::DEADLINE_EXCEEDED && left < timeout / 2 =>
                    {
                        Some(Err(e))
                    }
                    // It ended by its own cancellation (its caller's deadline or departure):
                    // not an answer to this caller, which asks for itself below.
                    Ok(Ok(Err(e)))
                        if e.kind() == ErrorKind::CANCELLED
                            || e.kind() == ErrorKind::DEADLINE_EXCEEDED =>
                    {
                        None
                    }
                    Ok(Ok(result)) => Some(result.and_then(|value| limits::check(op, value))),
                    Ok(Err(_)) => None,
                    // Still running: nothing to cancel (it is not this caller's call).
                    Err(_) => Some(Err(ProviderError::deadline_exceeded(format!(
                        "{op} did not return within {timeout:?} (waiting for an identical call still running in the plugin)"
                    )))),
                };
                if let Some(result) = answered {
                    return self.finish_call(op, epoch, started, result);
                }
            }
        }
        // What is left of the deadline after a join (all of it otherwise); messages name the
        // whole deadline.
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let ctx = CallContext::new(Some(remaining));
        let mut guard = CancelOnDrop(Some(ctx.clone()));
        let plugin_ctx = ctx.clone();
        let plugin = self.inner.plugin_path.clone();
        // On the provider's own bounded pool ([`pool`]); a fatal signal inside the plugin names
        // the plugin and the call (crate::runtime::crash).
        let submitted = self.inner.pool.submit(op, key, move || {
            crate::runtime::crash::in_call(&plugin, op, || f(&plugin_ctx).into_result())
        });
        let mut task = match submitted {
            Ok(task) => task,
            Err(refused) => {
                guard.0 = None;
                return Err(self.count_error(op, ProviderError::other(refused.to_string())));
            }
        };
        // The plugin's context ends at the deadline; the host gives it a moment more, so a
        // plugin that honours its context answers with its own deadline error (which says
        // what it was waiting for) rather than the host's bare "did not return".
        let grace = (timeout / 20).min(std::time::Duration::from_millis(250));
        let outcome = tokio::time::timeout_at(deadline + grace, &mut task).await;
        // Dropping the pool's handle abandons the call if it is still running.
        drop(task);
        let result = match outcome {
            Ok(Ok(result)) => {
                guard.0 = None;
                // What the plugin returned stays within the host's limits ([`limits`]).
                result.and_then(|value| limits::check(op, value))
            }
            // Refused while queued: the method reached its cap of hung calls meanwhile.
            Ok(Err(pool::PoolError::Refused(why))) => {
                guard.0 = None;
                Err(ProviderError::other(why.to_string()))
            }
            // The SDK catches plugin panics; this is a panic in the host's own closure.
            Ok(Err(pool::PoolError::Lost)) => Err(ProviderError::panicked(format!(
                "{op}: the call's thread ended without an answer"
            ))),
            Err(_) => {
                ctx.cancel();
                guard.0 = None;
                tracing::warn!(op, ?timeout, provider = %self.inner.registered_name, "provider call timed out; cancelled");
                Err(ProviderError::deadline_exceeded(format!(
                    "{op} did not return within {timeout:?}"
                )))
            }
        };
        self.finish_call(op, epoch, started, result)
    }

    /// The end of every call: duration, throttling bookkeeping, error metrics.
    fn finish_call<T>(
        &self,
        op: &'static str,
        epoch: u64,
        started: std::time::Instant,
        result: Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        self.inner
            .metrics
            .duration
            .get_or_create(&MethodLabels { method: op })
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(v) => {
                self.inner.throttle.on_success(epoch);
                Ok(v)
            }
            Err(e) => {
                let e = self.throttled(op, epoch, e);
                Err(self.count_error(op, e))
            }
        }
    }

    /// Count a failed call in the error metrics.
    fn count_error(&self, op: &'static str, e: ProviderError) -> ProviderError {
        let metrics = &self.inner.metrics;
        let kind = e.kind();
        metrics
            .errors
            .get_or_create(&ErrorLabels {
                method: op,
                kind: kind.name(),
            })
            .inc();
        let method = MethodLabels { method: op };
        if kind == ccm_provider_abi::ErrorKind::PANICKED {
            metrics.panics.get_or_create(&method).inc();
        } else if kind == ccm_provider_abi::ErrorKind::DEADLINE_EXCEEDED {
            metrics.timeouts.get_or_create(&method).inc();
        }
        e
    }

    /// Whether the provider's calls run (`Err`: too many calls hung in the plugin, so new ones
    /// are refused; see [`pool`]).
    pub fn call_health(&self) -> Result<(), pool::Stuck> {
        self.inner.pool.health()
    }

    /// Whether `method`'s calls run (`Err`: too many of them hung in the plugin, so new ones
    /// are refused while the other methods still run; see [`pool`]).
    pub fn method_call_health(&self, method: &str) -> Result<(), pool::Stuck> {
        self.inner.pool.method_health(method)
    }

    /// The methods whose calls are refused now (too many of them hung).
    pub fn refused_methods(&self) -> Vec<&'static str> {
        self.inner.pool.refused_methods()
    }

    /// Call `hook(method, check)` each time a method's calls start being refused; `check`
    /// answers that method's health from then on (it does not keep the provider alive). The
    /// daemon adds it to `/readyz`.
    pub fn on_method_refused(
        &self,
        hook: impl Fn(&'static str, Arc<dyn Fn() -> Result<(), pool::Stuck> + Send + Sync>)
            + Send
            + Sync
            + 'static,
    ) {
        let weak = self.inner.pool.downgrade();
        self.inner.pool.on_method_refused(Arc::new(move |method| {
            let weak = weak.clone();
            hook(method, Arc::new(move || weak.method_health(method)));
        }));
    }

    /// Hung call threads now (all methods).
    pub fn hung_calls(&self) -> usize {
        self.inner.pool.hung()
    }

    /// The lifecycle controller's question about `node` that is still open: the method of an
    /// earlier identical call (`InstanceExists`, `InstanceShutdown`; with the legacy interface
    /// `InstanceID`, `InstanceExistsByProviderID`, `InstanceShutdownByProviderID`) whose
    /// thread still runs in the plugin although its callers gave up. Asking again would only
    /// wait for that same thread.
    pub fn open_instance_question(&self, node: &impl NodeRef) -> Option<&'static str> {
        let generation = self.inner.instance_cache.generation();
        let pool = &self.inner.pool;
        let hung =
            |op: &'static str, args: &str| pool.is_hung(&read_call_key(op, generation, args));
        if self.capabilities().instances_v2 {
            let args = read_key(node);
            return ["InstanceExists", "InstanceShutdown"]
                .into_iter()
                .find(|op| hung(op, &args));
        }
        let name = node.node_name();
        if hung("InstanceID", name) {
            return Some("InstanceID");
        }
        let id = node.node_provider_id();
        ["InstanceExistsByProviderID", "InstanceShutdownByProviderID"]
            .into_iter()
            .find(|op| !id.is_empty() && hung(op, id))
    }

    /// Threads of the provider's call pool now.
    pub fn call_threads(&self) -> usize {
        self.inner.pool.threads()
    }

    /// React to a `THROTTLED` answer: pause every call to the provider ([`throttle`]), count
    /// it, and return it with the pause in effect as its delay and a message naming the method.
    /// A 1.0 plugin cannot return `THROTTLED` (the kind did not exist), so from one that code
    /// reads as `OTHER`, as a 1.0 host reads it. Other errors pass unchanged.
    fn throttled(&self, op: &'static str, epoch: u64, e: ProviderError) -> ProviderError {
        let Some(delay) = e.throttle_delay() else {
            return e;
        };
        if !self.inner.identity.abi_1_1 {
            return ProviderError::other(e.message());
        }
        let applied = self.inner.throttle.on_throttled(epoch, delay);
        let metrics = &self.inner.metrics;
        metrics
            .throttled
            .get_or_create(&MethodLabels { method: op })
            .inc();
        metrics.throttle_pause.inc_by(applied.added.as_secs_f64());
        tracing::warn!(
            op,
            caller = self.caller,
            provider = %self.inner.registered_name,
            asked = ?delay,
            pause = ?applied.remaining,
            "cloud provider throttled {op}: {e}; pausing every call to the provider"
        );
        ProviderError::throttled(
            format!("cloud provider throttled {op}: {}", e.message()),
            Some(applied.remaining),
        )
    }

    /// A read-only call that may be shared: while a call with the same `op` and `key` is in
    /// flight, a second caller waits for its answer instead of calling the plugin again (never
    /// one that started before a `--cloud-config` reload: the key carries the instance cache's
    /// generation, which every reload bumps). The plugin call is cancelled only when every
    /// waiter has gone away.
    async fn read_call<T, F>(&self, op: &'static str, key: String, f: F) -> Result<T, ProviderError>
    where
        T: limits::Bounded + Clone + Send + Sync + 'static,
        F: FnOnce(&CallContext) -> RResult<T, ProviderError> + Send + 'static,
    {
        let args = key;
        let key = read_call_key(op, self.inner.instance_cache.generation(), &args);
        // Only the digest waits with the call.
        drop(args);
        let shared: SharedCall<T> = {
            let mut reads = self
                .inner
                .in_flight_reads
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let in_flight = reads.get(&key).and_then(|e| upgrade::<T>(&*e.weak));
            match in_flight {
                Some(call) => {
                    self.inner
                        .metrics
                        .coalesced
                        .get_or_create(&MethodLabels { method: op })
                        .inc();
                    call
                }
                None => {
                    let this = self.clone();
                    let call: BoxFuture<'static, Result<T, ProviderError>> =
                        Box::pin(async move { this.call_keyed(op, Some(key), f).await });
                    let call = call.shared();
                    if reads.len() >= READ_SWEEP_THRESHOLD {
                        reads.retain(|_, e| (e.running)(&*e.weak));
                    }
                    if let Some(weak) = call.downgrade() {
                        reads.insert(
                            key,
                            ReadEntry {
                                weak: Box::new(weak),
                                running: running::<T>,
                            },
                        );
                    }
                    call
                }
            }
        };
        let result = shared.clone().await;
        drop(shared);
        let mut reads = self
            .inner
            .in_flight_reads
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Forget the entry once its call has finished (or every waiter has gone); a newer call
        // under the same key is left alone.
        let finished = reads.get(&key).is_some_and(|e| !(e.running)(&*e.weak));
        if finished {
            reads.remove(&key);
        }
        result
    }

    /// The key of a write call ([`call_key`]): its arguments and hosts exactly as the plugin
    /// gets them (the hosts by their digest, [`HostList`]), so only a call identical in every
    /// byte joins one still running.
    fn write_key(&self, op: &'static str, args: &[&str], hosts: &[&HostList]) -> pool::CallKey {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for a in args {
            ctx.update(&(a.len() as u64).to_le_bytes());
            ctx.update(a.as_bytes());
        }
        for h in hosts {
            ctx.update(&(h.len() as u64).to_le_bytes());
            ctx.update(&h.digest);
        }
        let mut digest = [0; 32];
        digest.copy_from_slice(ctx.finish().as_ref());
        (op, self.inner.instance_cache.generation(), digest)
    }

    /// The current instance's ABI 1.2 extension, if the plugin offers one.
    fn ext_v1_2(&self) -> Option<Arc<ProviderExtV1_2Box>> {
        self.plugin().ext_v1_2.clone()
    }

    /// What the provider's ABI 1.2 extension declared (empty for a 1.0 or 1.1 plugin).
    pub fn ext_v1_2_capabilities(&self) -> ExtCapabilitiesV1_2 {
        self.inner.identity.ext_v1_2_capabilities
    }

    /// The current instance's ABI 1.1 extension, if the plugin offers one.
    pub(crate) fn ext(&self) -> Option<Arc<ProviderExtBox>> {
        self.plugin().ext.clone()
    }

    /// One object of the current instance (a reference-count increment under the read lock).
    fn object<T>(
        &self,
        pick: impl FnOnce(&lifecycle::Plugin) -> Option<&Arc<T>>,
        capability: &str,
    ) -> Result<Arc<T>, ProviderError> {
        let plugin = self.inner.plugin.read().unwrap_or_else(|p| p.into_inner());
        pick(&plugin)
            .cloned()
            .ok_or_else(|| unsupported(capability))
    }

    fn lb(&self) -> Result<Arc<LoadBalancerBox>, ProviderError> {
        self.object(|p| p.load_balancer.as_ref(), "LoadBalancer")
    }

    fn legacy(&self) -> Result<Arc<InstancesBox>, ProviderError> {
        self.object(|p| p.instances.as_ref(), "Instances")
    }

    fn v2(&self) -> Result<Arc<InstancesV2Box>, ProviderError> {
        self.object(|p| p.instances_v2.as_ref(), "InstancesV2")
    }

    fn zones(&self) -> Result<Arc<ZonesBox>, ProviderError> {
        self.object(|p| p.zones.as_ref(), "Zones")
    }

    fn routes(&self) -> Result<Arc<RoutesBox>, ProviderError> {
        self.object(|p| p.routes.as_ref(), "Routes")
    }

    fn clusters(&self) -> Result<Arc<ClustersBox>, ProviderError> {
        self.object(|p| p.clusters.as_ref(), "Clusters")
    }

    // ---- LoadBalancer ----------------------------------------------------------------------

    /// `GetLoadBalancer`: `Some(status)` when it exists.
    pub async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let key = format!("{cluster}\0{}", read_key(service));
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        self.read_call("GetLoadBalancer", key, move |ctx| {
            lb.get_load_balancer(ctx, cluster.as_str().into(), svc.as_str().into())
                .map(|o| o.into_option().map(Into::into))
        })
        .await
    }

    /// `GetLoadBalancerName`.
    pub async fn get_load_balancer_name(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<String, ProviderError> {
        let key = format!("{cluster}\0{}", read_key(service));
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        self.read_call("GetLoadBalancerName", key, move |ctx| {
            lb.get_load_balancer_name(ctx, cluster.as_str().into(), svc.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `EnsureLoadBalancer`: `None` is upstream's nil status.
    pub async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[impl NodeRef],
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        self.ensure_load_balancer_shared(cluster, service, &HostList::new(nodes)?)
            .await
    }

    /// `EnsureLoadBalancer` with a host list serialised once for many calls ([`HostList`]).
    pub async fn ensure_load_balancer_shared(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &HostList,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        let nodes = nodes.clone();
        let key = self.write_key("EnsureLoadBalancer", &[&cluster, &svc], &[&nodes]);
        self.call_keyed("EnsureLoadBalancer", Some(key), move |ctx| {
            let status = lb.ensure_load_balancer(
                ctx,
                cluster.as_str().into(),
                svc.as_str().into(),
                nodes.json[..].into(),
            );
            // The plugin's parsed copy of every host is garbage now: give its pages back even
            // when the list itself is kept for the next ensure (a burst of ensures otherwise
            // grows the heap around each parse; measured: +93 MiB peak at 20,000 nodes).
            let len = nodes.len();
            release_hosts(nodes, len);
            status.map(|o| o.into_option().map(Into::into))
        })
        .await
    }

    /// `UpdateLoadBalancer`.
    pub async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[impl NodeRef],
    ) -> Result<(), ProviderError> {
        self.update_load_balancer_shared(cluster, service, &HostList::new(nodes)?)
            .await
    }

    /// `UpdateLoadBalancer` with a host list serialised once for many calls ([`HostList`]).
    pub async fn update_load_balancer_shared(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &HostList,
    ) -> Result<(), ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        let nodes = nodes.clone();
        let key = self.write_key("UpdateLoadBalancer", &[&cluster, &svc], &[&nodes]);
        self.call_keyed("UpdateLoadBalancer", Some(key), move |ctx| {
            let done = lb.update_load_balancer(
                ctx,
                cluster.as_str().into(),
                svc.as_str().into(),
                nodes.json[..].into(),
            );
            release_host_list(nodes);
            done
        })
        .await
    }

    /// ABI 1.2 `UpdateLoadBalancerHosts` (docs/abi-1.2.md): apply `removed` then `added` to the
    /// set the plugin holds under token `base` (`NO_BASE`: `added` is the whole set), naming the
    /// result `token`. `Ok(true)`: applied; `Ok(false)`: the plugin does not hold `base`
    /// (`BASE_MISMATCH`, or an outcome this host does not know) and changed nothing.
    /// `NotImplemented` when the plugin has no 1.2 extension.
    pub async fn update_load_balancer_hosts(
        &self,
        cluster: &str,
        service: &Service,
        base: u64,
        token: u64,
        added: &HostList,
        removed: &HostList,
    ) -> Result<bool, ProviderError> {
        self.lb()?;
        let Some(ext) = self.ext_v1_2() else {
            return Err(ProviderError::not_implemented().context(
                "a plugin built against ccm-provider-abi 1.0 or 1.1 has no incremental host update",
            ));
        };
        let (cluster, svc) = (cluster.to_string(), to_json("Service", service)?);
        let (added, removed) = (added.clone(), removed.clone());
        let key = self.write_key(
            "UpdateLoadBalancerHosts",
            &[&cluster, &svc, &base.to_string(), &token.to_string()],
            &[&added, &removed],
        );
        self.call_keyed("UpdateLoadBalancerHosts", Some(key), move |ctx| {
            let outcome = ext.update_load_balancer_hosts(
                ctx,
                cluster.as_str().into(),
                svc.as_str().into(),
                AbiHostUpdate {
                    base,
                    token,
                    added: added.json[..].into(),
                    removed: removed.json[..].into(),
                },
            );
            release_host_list(added);
            outcome.map(|o| o == HostUpdateOutcome::APPLIED)
        })
        .await
    }

    /// `EnsureLoadBalancerDeleted`.
    pub async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        let key = self.write_key("EnsureLoadBalancerDeleted", &[&cluster, &svc], &[]);
        self.call_keyed("EnsureLoadBalancerDeleted", Some(key), move |ctx| {
            lb.ensure_load_balancer_deleted(ctx, cluster.as_str().into(), svc.as_str().into())
        })
        .await
    }

    /// ABI 1.1 `LoadBalancerHosts`: the node names the Service's load balancer targets now
    /// (`None` when it does not exist). `NotImplemented` when the provider offers no read-back
    /// (or its plugin was built against ABI 1.0). Only `ccm-host check` calls it.
    pub async fn load_balancer_hosts(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<Option<Vec<String>>, ProviderError> {
        self.lb()?;
        let Some(ext) = self.ext() else {
            return Err(ProviderError::not_implemented()
                .context("a plugin built against ccm-provider-abi 1.0 has no host read-back"));
        };
        let (cluster, svc) = (cluster.to_string(), to_json("Service", service)?);
        self.call("LoadBalancerHosts", move |ctx| {
            ext.load_balancer_hosts(ctx, cluster.as_str().into(), svc.as_str().into())
                .map(|hosts| {
                    hosts
                        .into_option()
                        .map(|h| h.into_iter().map(RString::into_string).collect())
                })
        })
        .await
    }

    // ---- Instances (legacy) ----------------------------------------------------------------

    /// `NodeAddresses`.
    pub async fn node_addresses(&self, node_name: &str) -> Result<Vec<NodeAddress>, ProviderError> {
        let key = node_name.to_string();
        let (i, name) = (self.legacy()?, node_name.to_string());
        self.read_call("NodeAddresses", key, move |ctx| {
            i.node_addresses(ctx, name.as_str().into())
                .map(from_abi_addresses)
        })
        .await
    }

    /// `NodeAddressesByProviderID`.
    pub async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<Vec<NodeAddress>, ProviderError> {
        let key = provider_id.to_string();
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.read_call("NodeAddressesByProviderID", key, move |ctx| {
            i.node_addresses_by_provider_id(ctx, id.as_str().into())
                .map(from_abi_addresses)
        })
        .await
    }

    /// `InstanceID`.
    pub async fn instance_id(&self, node_name: &str) -> Result<String, ProviderError> {
        let key = node_name.to_string();
        let (i, name) = (self.legacy()?, node_name.to_string());
        self.read_call("InstanceID", key, move |ctx| {
            i.instance_id(ctx, name.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `InstanceType`.
    pub async fn instance_type(&self, node_name: &str) -> Result<String, ProviderError> {
        let key = node_name.to_string();
        let (i, name) = (self.legacy()?, node_name.to_string());
        self.read_call("InstanceType", key, move |ctx| {
            i.instance_type(ctx, name.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `InstanceTypeByProviderID`.
    pub async fn instance_type_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<String, ProviderError> {
        let key = provider_id.to_string();
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.read_call("InstanceTypeByProviderID", key, move |ctx| {
            i.instance_type_by_provider_id(ctx, id.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `InstanceExistsByProviderID`.
    pub async fn instance_exists_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<bool, ProviderError> {
        let key = provider_id.to_string();
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.read_call("InstanceExistsByProviderID", key, move |ctx| {
            i.instance_exists_by_provider_id(ctx, id.as_str().into())
        })
        .await
    }

    /// `InstanceShutdownByProviderID`.
    pub async fn instance_shutdown_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<bool, ProviderError> {
        let key = provider_id.to_string();
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.read_call("InstanceShutdownByProviderID", key, move |ctx| {
            i.instance_shutdown_by_provider_id(ctx, id.as_str().into())
        })
        .await
    }

    /// `CurrentNodeName`.
    pub async fn current_node_name(&self, hostname: &str) -> Result<String, ProviderError> {
        let key = hostname.to_string();
        let (i, host) = (self.legacy()?, hostname.to_string());
        self.read_call("CurrentNodeName", key, move |ctx| {
            i.current_node_name(ctx, host.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    // ---- InstancesV2 -----------------------------------------------------------------------

    /// `InstanceExists`.
    pub async fn instance_exists(&self, node: &impl NodeRef) -> Result<bool, ProviderError> {
        let key = read_key(node);
        let (i, node) = (self.v2()?, to_json("Node", node)?);
        self.read_call("InstanceExists", key, move |ctx| {
            i.instance_exists(ctx, node.as_str().into())
        })
        .await
    }

    /// `InstanceShutdown`.
    pub async fn instance_shutdown(&self, node: &impl NodeRef) -> Result<bool, ProviderError> {
        let key = read_key(node);
        let (i, node) = (self.v2()?, to_json("Node", node)?);
        self.read_call("InstanceShutdown", key, move |ctx| {
            i.instance_shutdown(ctx, node.as_str().into())
        })
        .await
    }

    /// `InstanceMetadata`: `None` is upstream's `(nil, nil)`.
    pub async fn instance_metadata(
        &self,
        node: &impl NodeRef,
    ) -> Result<Option<InstanceMetadata>, ProviderError> {
        let key = read_key(node);
        let (i, node) = (self.v2()?, to_json("Node", node)?);
        self.read_call("InstanceMetadata", key, move |ctx| {
            i.instance_metadata(ctx, node.as_str().into())
                .map(|o| o.into_option().map(Into::into))
        })
        .await
    }

    // ---- Zones -----------------------------------------------------------------------------

    /// `GetZoneByProviderID`.
    pub async fn get_zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, ProviderError> {
        let key = provider_id.to_string();
        let (z, id) = (self.zones()?, provider_id.to_string());
        self.read_call("GetZoneByProviderID", key, move |ctx| {
            z.get_zone_by_provider_id(ctx, id.as_str().into())
                .map(Into::into)
        })
        .await
    }

    /// `GetZoneByNodeName`.
    pub async fn get_zone_by_node_name(&self, node_name: &str) -> Result<Zone, ProviderError> {
        let key = node_name.to_string();
        let (z, name) = (self.zones()?, node_name.to_string());
        self.read_call("GetZoneByNodeName", key, move |ctx| {
            z.get_zone_by_node_name(ctx, name.as_str().into())
                .map(Into::into)
        })
        .await
    }

    // ---- Clusters --------------------------------------------------------------------------

    /// `ListClusters`.
    pub async fn list_clusters(&self) -> Result<Vec<String>, ProviderError> {
        let key = String::new();
        let c = self.clusters()?;
        self.read_call("ListClusters", key, move |ctx| {
            c.list_clusters(ctx)
                .map(|v| v.into_iter().map(RString::into_string).collect())
        })
        .await
    }

    /// `Master`.
    pub async fn master(&self, cluster: &str) -> Result<String, ProviderError> {
        let key = cluster.to_string();
        let (c, cluster) = (self.clusters()?, cluster.to_string());
        self.read_call("Master", key, move |ctx| {
            c.master(ctx, cluster.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    // ---- Routes ----------------------------------------------------------------------------

    /// `ListRoutes`.
    pub async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, ProviderError> {
        let key = cluster.to_string();
        let (r, cluster) = (self.routes()?, cluster.to_string());
        self.read_call("ListRoutes", key, move |ctx| {
            r.list_routes(ctx, cluster.as_str().into())
                .map(|v| v.into_iter().map(Route::from).collect())
        })
        .await
    }

    /// `CreateRoute`.
    pub async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        let (r, cluster, hint) = (self.routes()?, cluster.to_string(), name_hint.to_string());
        let route = AbiRoute::from(route.clone());
        self.call("CreateRoute", move |ctx| {
            r.create_route(ctx, cluster.as_str().into(), hint.as_str().into(), &route)
        })
        .await
    }

    /// `DeleteRoute`.
    pub async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), ProviderError> {
        let (r, cluster) = (self.routes()?, cluster.to_string());
        let route = AbiRoute::from(route.clone());
        self.call("DeleteRoute", move |ctx| {
            r.delete_route(ctx, cluster.as_str().into(), &route)
        })
        .await
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("registered_name", &self.inner.registered_name)
            .field("provider_name", &self.inner.identity.provider_name)
            .field("plugin_path", &self.inner.plugin_path)
            .field("capabilities", &self.capabilities())
            .finish()
    }
}

/// The identity of a read call's argument for coalescing: its JSON without the fields that
/// change on every write but not what a provider answers (resourceVersion, managedFields,
/// condition heartbeats).
fn read_key<T: Serialize>(value: &T) -> String {
    let Ok(mut v) = serde_json::to_value(value) else {
        return String::new();
    };
    if let Some(meta) = v
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    if let Some(conditions) = v
        .pointer_mut("/status/conditions")
        .and_then(serde_json::Value::as_array_mut)
    {
        for c in conditions
            .iter_mut()
            .filter_map(serde_json::Value::as_object_mut)
        {
            c.remove("lastHeartbeatTime");
        }
    }
    v.to_string()
}

/// The hosts of a load-balancer call, serialised straight from the caller's (cached) nodes.
///
/// Each node is written into one reused buffer and copied into a string of exactly its length:
/// serialising into a fresh string leaves it with up to twice the capacity it needs, which for
/// thousands of hosts doubled the memory of every call (see BENCHMARKS.md, "Memory").
fn nodes_json(nodes: &[impl NodeRef]) -> Result<Vec<RString>, ProviderError> {
    let mut buf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        buf.clear();
        serde_json::to_writer(&mut buf, n).map_err(|e| {
            ProviderError::other(format!("cannot serialise Node for the provider: {e}"))
        })?;
        // serde_json writes valid UTF-8.
        let json = std::str::from_utf8(&buf)
            .map_err(|e| ProviderError::other(format!("serialised Node is not UTF-8: {e}")))?;
        out.push(RString::from(json));
    }
    Ok(out)
}

/// Let go of a load-balancer call's host list (the plugin has freed its parsed copy by now)
/// and give the pages back ([`crate::runtime::malloc::release_free_memory`]) when the list was large
/// and this was its last user (a shared list is freed by the last call of the node sync).
fn release_host_list(hosts: HostList) {
    let large = hosts.len() >= RELEASE_AFTER_HOSTS;
    let last = Arc::strong_count(&hosts.json) == 1;
    drop(hosts);
    if large && last {
        crate::runtime::malloc::release_free_memory();
    }
}

/// Let go of the host list of one call (`hosts`, `len` hosts) after which the plugin's parse of
/// it is garbage, and trim the heap when the list was large, also when the list itself lives on
/// (an ensure's list shared with the next ensure).
fn release_hosts<T>(hosts: T, len: usize) {
    drop(hosts);
    if len >= RELEASE_AFTER_HOSTS {
        crate::runtime::malloc::release_free_memory();
    }
}

/// Host lists from this many nodes are followed by a trim of the heap ([`release_hosts`]):
/// around a megabyte of JSON, and several more of parsed nodes in the plugin.
const RELEASE_AFTER_HOSTS: usize = 500;

fn from_abi_addresses(
    v: abi_stable::std_types::RVec<ccm_provider_abi::types::AbiNodeAddress>,
) -> Vec<NodeAddress> {
    v.into_iter().map(Into::into).collect()
}

/// Run a synchronous plugin call (the factory) on a helper thread with a deadline, for callers
/// that are not inside the async runtime.
fn run_with_deadline<T: Send + 'static>(
    op: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> RResult<T, ProviderError> + Send + 'static,
) -> Result<T, ProviderError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("ccm-{op}"))
        .spawn(move || {
            let _ = tx.send(f().into_result());
        })
        .map_err(|e| ProviderError::other(format!("cannot start a thread for {op}: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(ProviderError::deadline_exceeded(
            format!("{op} did not return within {timeout:?}"),
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ProviderError::panicked(
            format!("{op} ended without an answer"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_lists_are_the_nodes_json_in_strings_of_exactly_their_length() {
        let node = |name: &str, label: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"zone": label, "emoji": "ünïcödé"}},
                "spec": {"providerID": format!("fake://{name}")},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]},
            }))
            .unwrap()
        };
        let nodes = vec![
            Arc::new(node("a", "z1")),
            Arc::new(node("b-with-a-longer-name", "z2")),
        ];
        let hosts = nodes_json(&nodes).unwrap();
        assert_eq!(hosts.len(), 2);
        for (json, node) in hosts.iter().zip(&nodes) {
            assert_eq!(json.as_str(), serde_json::to_string(&**node).unwrap());
            assert_eq!(json.capacity(), json.len(), "no spare capacity kept");
        }
        let none: &[Node] = &[];
        assert!(nodes_json(none).unwrap().is_empty());
    }
}
