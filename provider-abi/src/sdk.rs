//! The provider SDK: plain Rust traits a vendor implements, and the adapters that expose them
//! through the ABI. Writing a provider = implement these traits + one [`crate::export_plugin!`].
//!
//! Every adapter method parses the JSON the host sent, calls the vendor's method inside
//! `catch_unwind` (a panic becomes [`ErrorKind::PANICKED`](crate::ErrorKind::PANICKED), never an
//! abort of the host), and converts the result to its ABI form.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use abi_stable::{
    sabi_trait::TD_Opaque,
    std_types::{RBox, ROption, RResult, RSlice, RStr, RString, RVec},
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use serde::de::DeserializeOwned;

use crate::abi::*;
use crate::context::CallContext;
use crate::error::ProviderError;
use crate::ext::{
    AbiInstanceStatus, AbiProviderExt, AbiProviderFactoryV1_1, AbiProviderV1_1, ExtCapabilities,
    ExtRegistrarBox, InstanceQuery, ProviderExtBox, ProviderFactoryV1_1Box,
};
use crate::ext_v1_2::{
    AbiHostUpdate, AbiProviderExtV1_2, AbiProviderFactoryV1_2, AbiProviderV1_2,
    ExtCapabilitiesV1_2, ExtRegistrarV1_2Box, HostUpdateOutcome, ProviderExtV1_2Box,
    ProviderFactoryV1_2Box, LAST_FULL, NO_BASE,
};
use crate::types::{AbiRoute, InstanceMetadata, InstanceStatus, Route, Zone};

/// Result of every SDK method.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// Upstream `cloudprovider.Interface`. Capabilities default to "not supported".
pub trait CloudProvider: Send + Sync + 'static {
    /// `ProviderName`: the scheme of provider IDs this provider creates (`<name>://...`).
    fn provider_name(&self) -> String;
    /// `HasClusterID`: false makes the host refuse to start unless `--allow-untagged-cloud`.
    fn has_cluster_id(&self) -> bool {
        true
    }
    /// `Initialize`: called once, on the leader, before the controllers start. Keep `host` to
    /// talk to the Kubernetes API or to learn when the host stops.
    fn initialize(&self, _ctx: &CallContext, _host: Host) -> Result<()> {
        Ok(())
    }
    /// `LoadBalancer()`.
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        None
    }
    /// `Instances()` (legacy).
    fn instances(&self) -> Option<Arc<dyn Instances>> {
        None
    }
    /// `InstancesV2()`: preferred over `Instances` and `Zones` when present.
    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        None
    }
    /// `Zones()` (deprecated).
    fn zones(&self) -> Option<Arc<dyn Zones>> {
        None
    }
    /// `Clusters()`.
    fn clusters(&self) -> Option<Arc<dyn Clusters>> {
        None
    }
    /// `Routes()`.
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        None
    }

    // ---- ABI 1.1 additions (a 1.0 host never calls them) ----

    /// The providerID prefixes (platforms, KEP-5778) whose nodes this provider owns, e.g.
    /// `["aws://"]`. Empty (the default): `<provider_name>://`.
    fn platforms(&self) -> Vec<String> {
        Vec::new()
    }
    /// Bulk instance lookups: answers for many nodes in one call. The host batches node
    /// initialisation, the address loop and the lifecycle checks through it when present.
    fn bulk_instances(&self) -> Option<Arc<dyn BulkInstances>> {
        None
    }
    /// Apply new `--cloud-config` bytes in place (the file changed: rotated credentials, new
    /// settings). Return an error to keep the current configuration; the default
    /// (`NotImplemented`) makes the host build a new provider from the factory instead and
    /// swap it in once its `initialize` succeeded.
    fn reconfigure(&self, _ctx: &CallContext, _config: &[u8]) -> Result<()> {
        Err(ProviderError::not_implemented())
    }
    /// Whether the provider can do its work now (credentials valid, cloud API reachable);
    /// shown as its own `/readyz` check. The default (`NotImplemented`) adds no check.
    fn health(&self, _ctx: &CallContext) -> Result<()> {
        Err(ProviderError::not_implemented())
    }
}

/// ABI 1.1: answers for many nodes in one call (see [`CloudProvider::bulk_instances`]).
pub trait BulkInstances: Send + Sync + 'static {
    /// One answer per node, in the order of `nodes`: whether its instance exists (`exists:
    /// false` is the explicit "does not exist"; never report that for an error), whether it is
    /// shut down, and its metadata, as `query` asks. A per-node `Err` fails only that node.
    fn instances_batch(
        &self,
        ctx: &CallContext,
        nodes: &[Node],
        query: InstanceQuery,
    ) -> Result<Vec<Result<InstanceStatus>>>;
}

/// Upstream `LoadBalancer`. Treat `service` and `nodes` as read-only.
pub trait LoadBalancer: Send + Sync + 'static {
    /// `GetLoadBalancer`: `Some(status)` if the load balancer exists.
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>>;
    /// `GetLoadBalancerName`.
    fn get_load_balancer_name(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<String>;
    /// `EnsureLoadBalancer`: create or update; returns the status to publish. `Ok(None)` is
    /// upstream's nil status, which the service controller reports as an error.
    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<Option<LoadBalancerStatus>>;
    /// `UpdateLoadBalancer`: update the backend host set only.
    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()>;
    /// `EnsureLoadBalancerDeleted`: `Ok` if absent or deleted.
    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<()>;

    // ---- ABI 1.1 additions (a 1.0 host never calls them) ----

    /// The node names the Service's load balancer targets now (`Ok(None)` when it does not
    /// exist). `ccm-host check` uses it to verify that `update_load_balancer` honours the host
    /// set; the default (`NotImplemented`) makes that check a skip.
    fn load_balancer_hosts(
        &self,
        _ctx: &CallContext,
        _cluster_name: &str,
        _service: &Service,
    ) -> Result<Option<Vec<String>>> {
        Err(ProviderError::not_implemented())
    }
    /// Whether two Services may get the same load-balancer address (e.g. one shared IP told
    /// apart by port). `false` (the default): `ccm-host check` expects distinct addresses.
    fn shares_addresses(&self) -> bool {
        false
    }

    // ---- ABI 1.2 additions (a 1.0 or 1.1 host never calls them) ----

    /// Whether [`LoadBalancer::update_load_balancer_hosts`] is implemented. `false` (the
    /// default): the host keeps sending the whole host list through `update_load_balancer`.
    fn incremental_hosts(&self) -> bool {
        false
    }
    /// Incremental `UpdateLoadBalancer`: remove `change.removed` from the load balancer's
    /// hosts, then add `change.added` (when `change.replace`, `added` is the whole set and the
    /// hosts become exactly that). Only called when [`LoadBalancer::incremental_hosts`] is true.
    ///
    /// The SDK keeps the bookkeeping of ABI 1.2 (docs/abi-1.2.md): it calls this only when the
    /// change is against the set this provider instance last applied for the load balancer,
    /// and otherwise asks the host for the whole set. After an `Err` the host sends the whole
    /// set next time. Make both halves idempotent: removing a host that is not there, or adding
    /// one that is, is not an error.
    fn update_load_balancer_hosts(
        &self,
        _ctx: &CallContext,
        _cluster_name: &str,
        _service: &Service,
        _change: &HostChange,
    ) -> Result<()> {
        Err(ProviderError::not_implemented())
    }
}

/// ABI 1.2: a change of a load balancer's hosts (see [`LoadBalancer::update_load_balancer_hosts`]).
#[derive(Debug, Clone, Default)]
pub struct HostChange {
    /// `added` is the whole host set (after a restart, a reload or a full call): make the
    /// load balancer's hosts exactly `added`; `removed` is empty.
    pub replace: bool,
    /// Hosts that join, or whose providerID changed (their new form).
    pub added: Vec<Node>,
    /// Hosts that leave (or the old form of a changed one): name and providerID as the host
    /// sent them; the rest of the node only when the host still has it with that providerID.
    pub removed: Vec<Node>,
}

/// Upstream legacy `Instances`.
pub trait Instances: Send + Sync + 'static {
    /// `NodeAddresses`.
    fn node_addresses(&self, ctx: &CallContext, node_name: &str) -> Result<Vec<NodeAddress>>;
    /// `NodeAddressesByProviderID`.
    fn node_addresses_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: &str,
    ) -> Result<Vec<NodeAddress>>;
    /// `InstanceID`: `Err(instance_not_found())` when the instance does not exist.
    fn instance_id(&self, ctx: &CallContext, node_name: &str) -> Result<String>;
    /// `InstanceType`.
    fn instance_type(&self, ctx: &CallContext, node_name: &str) -> Result<String>;
    /// `InstanceTypeByProviderID`.
    fn instance_type_by_provider_id(&self, ctx: &CallContext, provider_id: &str) -> Result<String>;
    /// `InstanceExistsByProviderID`: stopped instances still exist.
    fn instance_exists_by_provider_id(&self, ctx: &CallContext, provider_id: &str) -> Result<bool>;
    /// `InstanceShutdownByProviderID` (`NotImplemented` counts as "not shut down").
    fn instance_shutdown_by_provider_id(
        &self,
        _ctx: &CallContext,
        _provider_id: &str,
    ) -> Result<bool> {
        Err(ProviderError::not_implemented())
    }
    /// `CurrentNodeName` (unused by the controllers).
    fn current_node_name(&self, _ctx: &CallContext, _hostname: &str) -> Result<String> {
        Err(ProviderError::not_implemented())
    }
}

/// Upstream `InstancesV2`.
pub trait InstancesV2: Send + Sync + 'static {
    /// `InstanceExists`: stopped instances still exist.
    fn instance_exists(&self, ctx: &CallContext, node: &Node) -> Result<bool>;
    /// `InstanceShutdown`.
    fn instance_shutdown(&self, ctx: &CallContext, node: &Node) -> Result<bool>;
    /// `InstanceMetadata`: look up by `spec.providerID` first. `Ok(None)` leaves the node
    /// uninitialised (upstream's `(nil, nil)`).
    fn instance_metadata(&self, ctx: &CallContext, node: &Node)
        -> Result<Option<InstanceMetadata>>;
}

/// Upstream `Zones` (deprecated).
pub trait Zones: Send + Sync + 'static {
    /// `GetZoneByProviderID`.
    fn get_zone_by_provider_id(&self, ctx: &CallContext, provider_id: &str) -> Result<Zone>;
    /// `GetZoneByNodeName`.
    fn get_zone_by_node_name(&self, ctx: &CallContext, node_name: &str) -> Result<Zone>;
}

/// Upstream `Clusters`.
pub trait Clusters: Send + Sync + 'static {
    /// `ListClusters`.
    fn list_clusters(&self, ctx: &CallContext) -> Result<Vec<String>>;
    /// `Master`.
    fn master(&self, ctx: &CallContext, cluster_name: &str) -> Result<String>;
}

/// Upstream `Routes`.
pub trait Routes: Send + Sync + 'static {
    /// `ListRoutes`.
    fn list_routes(&self, ctx: &CallContext, cluster_name: &str) -> Result<Vec<Route>>;
    /// `CreateRoute`: `route.name` is ignored; `name_hint` (the node UID) may shape the name.
    fn create_route(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<()>;
    /// `DeleteRoute`: `route` as returned by `list_routes`.
    fn delete_route(&self, ctx: &CallContext, cluster_name: &str, route: &Route) -> Result<()>;
}

/// What the host offers at `initialize` (see [`AbiHost`]).
pub struct Host(HostBox);

impl Host {
    /// The value of `--cluster-name`.
    pub fn cluster_name(&self) -> String {
        self.0.cluster_name().into_string()
    }

    /// One request to the Kubernetes API server with the host's credentials; returns the HTTP
    /// status and body. `content_type` is used when `body` is not empty.
    pub fn kube_request(
        &self,
        ctx: &CallContext,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>)> {
        self.0
            .kube_request(
                ctx,
                method.into(),
                path.into(),
                content_type.into(),
                body.into(),
            )
            .into_result()
            .map(|r| (r.status, r.body.into_vec()))
    }

    /// True once the host is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.0.is_stopping()
    }
}

/// Handed to the plugin's registration function (upstream `RegisterCloudProvider`).
///
/// The same registration function serves every host generation: a 1.0 host calls it through
/// the root module (1.0 factories), a 1.1 host through the 1.1 extension module (1.1 factories,
/// whose providers also carry the 1.1 additions), a 1.2 host through the 1.2 module.
pub struct Registrar {
    inner: RegistrarInner,
}

enum RegistrarInner {
    V1_0(RegistrarBox),
    V1_1(ExtRegistrarBox),
    V1_2(ExtRegistrarV1_2Box),
}

impl Registrar {
    /// Path of the plugin file being loaded.
    pub fn plugin_path(&self) -> PathBuf {
        let path = match &self.inner {
            RegistrarInner::V1_0(r) => r.plugin_path(),
            RegistrarInner::V1_1(r) => r.plugin_path(),
            RegistrarInner::V1_2(r) => r.plugin_path(),
        };
        PathBuf::from(path.into_string())
    }

    /// Register a provider under `name`. `factory` receives the `--cloud-config` bytes (`None`
    /// when no config was given) and is called only if this provider is selected.
    pub fn register<P, F>(&mut self, name: &str, factory: F) -> Result<()>
    where
        P: CloudProvider,
        F: Fn(Option<&[u8]>) -> Result<P> + Send + Sync + 'static,
    {
        match &mut self.inner {
            RegistrarInner::V1_0(r) => {
                let factory = ProviderFactoryBox::from_value(FactoryAdapter(factory), TD_Opaque);
                r.register_provider(name.into(), factory).into_result()
            }
            RegistrarInner::V1_1(r) => {
                let factory =
                    ProviderFactoryV1_1Box::from_value(FactoryAdapter(factory), TD_Opaque);
                r.register_provider(name.into(), factory).into_result()
            }
            RegistrarInner::V1_2(r) => {
                let factory =
                    ProviderFactoryV1_2Box::from_value(FactoryAdapter(factory), TD_Opaque);
                r.register_provider(name.into(), factory).into_result()
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Panic and log plumbing
// ---------------------------------------------------------------------------------------------

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Run `f`, turning a panic into a `Panicked` error named after `op`.
pub fn guard<T>(op: &str, f: impl FnOnce() -> Result<T>) -> RResult<T, ProviderError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r.into(),
        Err(payload) => RResult::RErr(ProviderError::panicked(format!(
            "provider panicked in {op}: {}",
            panic_message(payload.as_ref())
        ))),
    }
}

/// Like [`guard`] for methods without an error channel: a panic is logged and `fallback` returned.
fn guard_infallible<T>(op: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            log::error!(
                "provider panicked in {op}: {}",
                panic_message(payload.as_ref())
            );
            fallback
        }
    }
}

static HOST_LOGGER: OnceLock<LoggerBox> = OnceLock::new();

struct ForwardingLogger;

fn to_level(level: log::Level) -> u8 {
    match level {
        log::Level::Error => log_level::ERROR,
        log::Level::Warn => log_level::WARN,
        log::Level::Info => log_level::INFO,
        log::Level::Debug => log_level::DEBUG,
        log::Level::Trace => log_level::TRACE,
    }
}

impl log::Log for ForwardingLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        if let Some(sink) = HOST_LOGGER.get() {
            let message = record.args().to_string();
            sink.log(
                to_level(record.level()),
                record.target().into(),
                message.as_str().into(),
            );
        }
    }

    fn flush(&self) {}
}

fn install_logging(logger: LoggerBox, max_log_level: u8) {
    if HOST_LOGGER.set(logger).is_ok() {
        // Each plugin has its own copy of std and of the `log` facade: these calls only affect
        // this plugin. A failure means the plugin installed its own logger, which we respect.
        let _ = log::set_logger(&ForwardingLogger);
        let max = match max_log_level {
            log_level::OFF => log::LevelFilter::Off,
            log_level::ERROR => log::LevelFilter::Error,
            log_level::WARN => log::LevelFilter::Warn,
            log_level::INFO => log::LevelFilter::Info,
            log_level::DEBUG => log::LevelFilter::Debug,
            _ => log::LevelFilter::Trace,
        };
        log::set_max_level(max);
        // Panics are caught at the boundary and returned as errors; send the panic report
        // (with its location) to the host's log instead of the plugin's stderr.
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            log::error!("panic{location}: {}", panic_message(info.payload()));
        }));
    }
}

#[doc(hidden)]
pub fn __run_registration(
    registrar: RegistrarBox,
    register: fn(&mut Registrar) -> Result<()>,
) -> AbiResult<()> {
    install_logging(registrar.logger(), registrar.max_log_level());
    let mut registrar = Registrar {
        inner: RegistrarInner::V1_0(registrar),
    };
    guard("plugin registration", move || register(&mut registrar))
}

#[doc(hidden)]
pub fn __run_registration_v1_2(
    registrar: ExtRegistrarV1_2Box,
    register: fn(&mut Registrar) -> Result<()>,
) -> AbiResult<()> {
    install_logging(registrar.logger(), registrar.max_log_level());
    let mut registrar = Registrar {
        inner: RegistrarInner::V1_2(registrar),
    };
    guard("plugin registration", move || register(&mut registrar))
}

#[doc(hidden)]
pub fn __run_registration_v1_1(
    registrar: ExtRegistrarBox,
    register: fn(&mut Registrar) -> Result<()>,
) -> AbiResult<()> {
    install_logging(registrar.logger(), registrar.max_log_level());
    let mut registrar = Registrar {
        inner: RegistrarInner::V1_1(registrar),
    };
    guard("plugin registration", move || register(&mut registrar))
}

// ---------------------------------------------------------------------------------------------
// Adapters: SDK traits -> ABI traits
// ---------------------------------------------------------------------------------------------

fn parse<T: DeserializeOwned>(what: &str, json: RStr<'_>) -> Result<T> {
    serde_json::from_str(json.as_str())
        .map_err(|e| ProviderError::other(format!("host sent a {what} that does not parse: {e}")))
}

fn parse_nodes(nodes: RSlice<'_, RString>) -> Result<Vec<Node>> {
    // Sized up front: a `Node` is over a kilobyte before its heap data, and collecting through
    // `Result` would grow the vector by doubling.
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes.iter() {
        out.push(parse("Node", n.as_rstr())?);
    }
    Ok(out)
}

fn addresses(v: Vec<NodeAddress>) -> RVec<crate::types::AbiNodeAddress> {
    v.into_iter().map(Into::into).collect()
}

struct FactoryAdapter<F>(F);

impl<P, F> AbiProviderFactory for FactoryAdapter<F>
where
    P: CloudProvider,
    F: Fn(Option<&[u8]>) -> Result<P> + Send + Sync + 'static,
{
    fn create(&self, config: ROption<RSlice<'_, u8>>) -> AbiResult<CloudProviderBox> {
        guard("provider factory", || {
            let provider = (self.0)(config.into_option().map(|c| c.as_slice()))?;
            Ok(CloudProviderBox::from_value(
                ProviderAdapter::new(Arc::new(provider)),
                TD_Opaque,
            ))
        })
    }
}

impl<P, F> AbiProviderFactoryV1_1 for FactoryAdapter<F>
where
    P: CloudProvider,
    F: Fn(Option<&[u8]>) -> Result<P> + Send + Sync + 'static,
{
    fn create(&self, config: ROption<RSlice<'_, u8>>) -> AbiResult<AbiProviderV1_1> {
        guard("provider factory", || {
            let provider = Arc::new((self.0)(config.into_option().map(|c| c.as_slice()))?);
            Ok(AbiProviderV1_1 {
                base: CloudProviderBox::from_value(
                    ProviderAdapter::new(provider.clone()),
                    TD_Opaque,
                ),
                ext: ProviderExtBox::from_value(ExtAdapter(provider), TD_Opaque),
            })
        })
    }
}

impl<P, F> AbiProviderFactoryV1_2 for FactoryAdapter<F>
where
    P: CloudProvider,
    F: Fn(Option<&[u8]>) -> Result<P> + Send + Sync + 'static,
{
    fn create(&self, config: ROption<RSlice<'_, u8>>) -> AbiResult<AbiProviderV1_2> {
        guard("provider factory", || {
            let provider = Arc::new((self.0)(config.into_option().map(|c| c.as_slice()))?);
            let base = ProviderAdapter::new(provider.clone());
            let ext_v1_2 = ExtV1_2Adapter {
                provider: provider.clone(),
                tokens: base.tokens.clone(),
            };
            Ok(AbiProviderV1_2 {
                base: CloudProviderBox::from_value(base, TD_Opaque),
                ext: ProviderExtBox::from_value(ExtAdapter(provider), TD_Opaque),
                ext_v1_2: ProviderExtV1_2Box::from_value(ext_v1_2, TD_Opaque),
            })
        })
    }
}

struct ProviderAdapter<P> {
    provider: Arc<P>,
    /// ABI 1.2 bookkeeping, shared with the instance's [`ExtV1_2Adapter`]: a full call
    /// (`EnsureLoadBalancer`, `UpdateLoadBalancer`, deletion) forgets the load balancer's token.
    tokens: Arc<HostTokens>,
}

impl<P> ProviderAdapter<P> {
    fn new(provider: Arc<P>) -> Self {
        Self {
            provider,
            tokens: Arc::default(),
        }
    }
}

/// ABI 1.2: the token of the host set each load balancer got last through an incremental
/// update, by [`lb_key`]. A token is taken out of the map while its update runs, so a second
/// update against the same base (which the host never sends) is answered `BASE_MISMATCH`.
#[derive(Default)]
struct HostTokens(Mutex<HashMap<String, u64>>);

impl HostTokens {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// A full call (`EnsureLoadBalancer`, `UpdateLoadBalancer`) set the load balancer's hosts:
    /// the next update may be a difference against them ([`LAST_FULL`]).
    fn full_call_applied(&self, key: String) {
        self.lock().insert(key, LAST_FULL);
    }
}

/// A load balancer's identity for [`HostTokens`]: cluster, namespace, name and UID (a Service
/// deleted and created again under the same name starts without a token).
fn lb_key(cluster_name: &str, svc: &Service) -> String {
    let m = &svc.metadata;
    format!(
        "{cluster_name}/{}/{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default(),
        m.uid.as_deref().unwrap_or_default()
    )
}

/// The 1.2 additions of a provider, over the same value as its [`ProviderAdapter`].
struct ExtV1_2Adapter<P> {
    provider: Arc<P>,
    tokens: Arc<HostTokens>,
}

impl<P: CloudProvider> AbiProviderExtV1_2 for ExtV1_2Adapter<P> {
    fn capabilities(&self) -> ExtCapabilitiesV1_2 {
        guard_infallible("CapabilitiesV1_2", ExtCapabilitiesV1_2::empty(), || {
            let mut caps = ExtCapabilitiesV1_2::empty();
            if self
                .provider
                .load_balancer()
                .is_some_and(|lb| lb.incremental_hosts())
            {
                caps = caps.with(ExtCapabilitiesV1_2::INCREMENTAL_HOSTS);
            }
            caps
        })
    }

    fn update_load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
        update: AbiHostUpdate<'_>,
    ) -> AbiResult<HostUpdateOutcome> {
        let AbiHostUpdate {
            base,
            token,
            added,
            removed,
        } = update;
        guard("UpdateLoadBalancerHosts", || {
            let Some(lb) = self
                .provider
                .load_balancer()
                .filter(|lb| lb.incremental_hosts())
            else {
                return Err(ProviderError::not_implemented());
            };
            if token == NO_BASE || token == LAST_FULL {
                return Err(ProviderError::other(format!(
                    "host sent an incremental host update with the reserved token {token}"
                )));
            }
            let svc: Service = parse("Service", service)?;
            let key = lb_key(cluster_name.as_str(), &svc);
            let held = self.tokens.lock().remove(&key);
            if base != NO_BASE && held != Some(base) {
                return Ok(HostUpdateOutcome::BASE_MISMATCH);
            }
            let change = HostChange {
                replace: base == NO_BASE,
                added: parse_nodes(added)?,
                removed: if base == NO_BASE {
                    Vec::new()
                } else {
                    parse_nodes(removed)?
                },
            };
            lb.update_load_balancer_hosts(ctx, cluster_name.as_str(), &svc, &change)?;
            self.tokens.lock().insert(key, token);
            Ok(HostUpdateOutcome::APPLIED)
        })
    }
}

/// The 1.1 additions of a provider, over the same value as its [`ProviderAdapter`].
struct ExtAdapter<P>(Arc<P>);

impl<P: CloudProvider> AbiProviderExt for ExtAdapter<P> {
    fn capabilities(&self) -> ExtCapabilities {
        guard_infallible("Capabilities", ExtCapabilities::empty(), || {
            let mut caps = ExtCapabilities::empty();
            if self.0.bulk_instances().is_some() {
                caps = caps.with(ExtCapabilities::BULK_INSTANCES);
            }
            if self
                .0
                .load_balancer()
                .is_some_and(|lb| lb.shares_addresses())
            {
                caps = caps.with(ExtCapabilities::LB_SHARED_ADDRESSES);
            }
            caps
        })
    }

    fn platforms(&self) -> RVec<RString> {
        guard_infallible("Platforms", Vec::new(), || self.0.platforms())
            .into_iter()
            .map(RString::from)
            .collect()
    }

    fn instances_batch(
        &self,
        ctx: &CallContext,
        nodes: RSlice<'_, RString>,
        query: InstanceQuery,
    ) -> AbiResult<RVec<RResult<AbiInstanceStatus, ProviderError>>> {
        guard("InstancesBatch", || {
            let Some(bulk) = self.0.bulk_instances() else {
                return Err(ProviderError::not_implemented());
            };
            let nodes = parse_nodes(nodes)?;
            let answers = bulk.instances_batch(ctx, &nodes, query)?;
            if answers.len() != nodes.len() {
                return Err(ProviderError::other(format!(
                    "instances_batch answered {} nodes, asked for {}",
                    answers.len(),
                    nodes.len()
                )));
            }
            Ok(answers
                .into_iter()
                .map(|a| RResult::from(a.map(AbiInstanceStatus::from)))
                .collect())
        })
    }

    fn reconfigure(&self, ctx: &CallContext, config: RSlice<'_, u8>) -> AbiResult<()> {
        guard("Reconfigure", || self.0.reconfigure(ctx, config.as_slice()))
    }

    fn health(&self, ctx: &CallContext) -> AbiResult<()> {
        guard("Health", || self.0.health(ctx))
    }

    fn load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<ROption<RVec<RString>>> {
        guard("LoadBalancerHosts", || {
            let Some(lb) = self.0.load_balancer() else {
                return Err(ProviderError::not_implemented());
            };
            let svc: Service = parse("Service", service)?;
            Ok(lb
                .load_balancer_hosts(ctx, cluster_name.as_str(), &svc)?
                .map(|hosts| hosts.into_iter().map(RString::from).collect())
                .into())
        })
    }
}

impl<P: CloudProvider> AbiCloudProvider for ProviderAdapter<P> {
    fn provider_name(&self) -> RString {
        guard_infallible("ProviderName", String::new(), || {
            self.provider.provider_name()
        })
        .into()
    }

    fn has_cluster_id(&self) -> bool {
        guard_infallible("HasClusterID", false, || self.provider.has_cluster_id())
    }

    fn initialize(&self, ctx: &CallContext, host: HostBox) -> AbiResult<()> {
        guard("Initialize", || self.provider.initialize(ctx, Host(host)))
    }

    fn load_balancer(&self) -> ROption<LoadBalancerBox> {
        guard_infallible("LoadBalancer", None, || self.provider.load_balancer())
            .map(|c| {
                LoadBalancerBox::from_value(
                    LbAdapter {
                        lb: c,
                        tokens: self.tokens.clone(),
                    },
                    TD_Opaque,
                )
            })
            .into()
    }

    fn instances(&self) -> ROption<InstancesBox> {
        guard_infallible("Instances", None, || self.provider.instances())
            .map(|c| InstancesBox::from_value(InstancesAdapter(c), TD_Opaque))
            .into()
    }

    fn instances_v2(&self) -> ROption<InstancesV2Box> {
        guard_infallible("InstancesV2", None, || self.provider.instances_v2())
            .map(|c| InstancesV2Box::from_value(InstancesV2Adapter(c), TD_Opaque))
            .into()
    }

    fn zones(&self) -> ROption<ZonesBox> {
        guard_infallible("Zones", None, || self.provider.zones())
            .map(|c| ZonesBox::from_value(ZonesAdapter(c), TD_Opaque))
            .into()
    }

    fn clusters(&self) -> ROption<ClustersBox> {
        guard_infallible("Clusters", None, || self.provider.clusters())
            .map(|c| ClustersBox::from_value(ClustersAdapter(c), TD_Opaque))
            .into()
    }

    fn routes(&self) -> ROption<RoutesBox> {
        guard_infallible("Routes", None, || self.provider.routes())
            .map(|c| RoutesBox::from_value(RoutesAdapter(c), TD_Opaque))
            .into()
    }
}

struct LbAdapter {
    lb: Arc<dyn LoadBalancer>,
    tokens: Arc<HostTokens>,
}

impl AbiLoadBalancer for LbAdapter {
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<ROption<crate::types::AbiLoadBalancerStatus>> {
        guard("GetLoadBalancer", || {
            let svc: Service = parse("Service", service)?;
            let status = self
                .lb
                .get_load_balancer(ctx, cluster_name.as_str(), &svc)?;
            Ok(status.map(Into::into).into())
        })
    }

    fn get_load_balancer_name(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<RString> {
        guard("GetLoadBalancerName", || {
            let svc: Service = parse("Service", service)?;
            Ok(self
                .lb
                .get_load_balancer_name(ctx, cluster_name.as_str(), &svc)?
                .into())
        })
    }

    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
        nodes: RSlice<'_, RString>,
    ) -> AbiResult<ROption<crate::types::AbiLoadBalancerStatus>> {
        guard("EnsureLoadBalancer", || {
            let svc: Service = parse("Service", service)?;
            let key = lb_key(cluster_name.as_str(), &svc);
            self.tokens.forget(&key);
            let nodes = parse_nodes(nodes)?;
            let status = self
                .lb
                .ensure_load_balancer(ctx, cluster_name.as_str(), &svc, &nodes)?;
            self.tokens.full_call_applied(key);
            Ok(status.map(Into::into).into())
        })
    }

    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
        nodes: RSlice<'_, RString>,
    ) -> AbiResult<()> {
        guard("UpdateLoadBalancer", || {
            let svc: Service = parse("Service", service)?;
            let key = lb_key(cluster_name.as_str(), &svc);
            self.tokens.forget(&key);
            let nodes = parse_nodes(nodes)?;
            self.lb
                .update_load_balancer(ctx, cluster_name.as_str(), &svc, &nodes)?;
            self.tokens.full_call_applied(key);
            Ok(())
        })
    }

    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<()> {
        guard("EnsureLoadBalancerDeleted", || {
            let svc: Service = parse("Service", service)?;
            self.tokens.forget(&lb_key(cluster_name.as_str(), &svc));
            self.lb
                .ensure_load_balancer_deleted(ctx, cluster_name.as_str(), &svc)
        })
    }
}

struct InstancesAdapter(Arc<dyn Instances>);

impl AbiInstances for InstancesAdapter {
    fn node_addresses(
        &self,
        ctx: &CallContext,
        node_name: RStr<'_>,
    ) -> AbiResult<RVec<crate::types::AbiNodeAddress>> {
        guard("NodeAddresses", || {
            Ok(addresses(self.0.node_addresses(ctx, node_name.as_str())?))
        })
    }

    fn node_addresses_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<RVec<crate::types::AbiNodeAddress>> {
        guard("NodeAddressesByProviderID", || {
            Ok(addresses(self.0.node_addresses_by_provider_id(
                ctx,
                provider_id.as_str(),
            )?))
        })
    }

    fn instance_id(&self, ctx: &CallContext, node_name: RStr<'_>) -> AbiResult<RString> {
        guard("InstanceID", || {
            Ok(self.0.instance_id(ctx, node_name.as_str())?.into())
        })
    }

    fn instance_type(&self, ctx: &CallContext, node_name: RStr<'_>) -> AbiResult<RString> {
        guard("InstanceType", || {
            Ok(self.0.instance_type(ctx, node_name.as_str())?.into())
        })
    }

    fn instance_type_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<RString> {
        guard("InstanceTypeByProviderID", || {
            Ok(self
                .0
                .instance_type_by_provider_id(ctx, provider_id.as_str())?
                .into())
        })
    }

    fn instance_exists_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<bool> {
        guard("InstanceExistsByProviderID", || {
            self.0
                .instance_exists_by_provider_id(ctx, provider_id.as_str())
        })
    }

    fn instance_shutdown_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<bool> {
        guard("InstanceShutdownByProviderID", || {
            self.0
                .instance_shutdown_by_provider_id(ctx, provider_id.as_str())
        })
    }

    fn current_node_name(&self, ctx: &CallContext, hostname: RStr<'_>) -> AbiResult<RString> {
        guard("CurrentNodeName", || {
            Ok(self.0.current_node_name(ctx, hostname.as_str())?.into())
        })
    }
}

struct InstancesV2Adapter(Arc<dyn InstancesV2>);

impl AbiInstancesV2 for InstancesV2Adapter {
    fn instance_exists(&self, ctx: &CallContext, node: RStr<'_>) -> AbiResult<bool> {
        guard("InstanceExists", || {
            self.0.instance_exists(ctx, &parse("Node", node)?)
        })
    }

    fn instance_shutdown(&self, ctx: &CallContext, node: RStr<'_>) -> AbiResult<bool> {
        guard("InstanceShutdown", || {
            self.0.instance_shutdown(ctx, &parse("Node", node)?)
        })
    }

    fn instance_metadata(
        &self,
        ctx: &CallContext,
        node: RStr<'_>,
    ) -> AbiResult<ROption<crate::types::AbiInstanceMetadata>> {
        guard("InstanceMetadata", || {
            let md = self.0.instance_metadata(ctx, &parse("Node", node)?)?;
            Ok(md.map(Into::into).into())
        })
    }
}

struct ZonesAdapter(Arc<dyn Zones>);

impl AbiZones for ZonesAdapter {
    fn get_zone_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<crate::types::AbiZone> {
        guard("GetZoneByProviderID", || {
            Ok(self
                .0
                .get_zone_by_provider_id(ctx, provider_id.as_str())?
                .into())
        })
    }

    fn get_zone_by_node_name(
        &self,
        ctx: &CallContext,
        node_name: RStr<'_>,
    ) -> AbiResult<crate::types::AbiZone> {
        guard("GetZoneByNodeName", || {
            Ok(self
                .0
                .get_zone_by_node_name(ctx, node_name.as_str())?
                .into())
        })
    }
}

struct ClustersAdapter(Arc<dyn Clusters>);

impl AbiClusters for ClustersAdapter {
    fn list_clusters(&self, ctx: &CallContext) -> AbiResult<RVec<RString>> {
        guard("ListClusters", || {
            Ok(self
                .0
                .list_clusters(ctx)?
                .into_iter()
                .map(RString::from)
                .collect())
        })
    }

    fn master(&self, ctx: &CallContext, cluster_name: RStr<'_>) -> AbiResult<RString> {
        guard("Master", || {
            Ok(self.0.master(ctx, cluster_name.as_str())?.into())
        })
    }
}

struct RoutesAdapter(Arc<dyn Routes>);

impl AbiRoutes for RoutesAdapter {
    fn list_routes(&self, ctx: &CallContext, cluster_name: RStr<'_>) -> AbiResult<RVec<AbiRoute>> {
        guard("ListRoutes", || {
            Ok(self
                .0
                .list_routes(ctx, cluster_name.as_str())?
                .into_iter()
                .map(AbiRoute::from)
                .collect())
        })
    }

    fn create_route(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        name_hint: RStr<'_>,
        route: &AbiRoute,
    ) -> AbiResult<()> {
        guard("CreateRoute", || {
            let route = Route::from(route.clone());
            self.0
                .create_route(ctx, cluster_name.as_str(), name_hint.as_str(), &route)
        })
    }

    fn delete_route(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        route: &AbiRoute,
    ) -> AbiResult<()> {
        guard("DeleteRoute", || {
            let route = Route::from(route.clone());
            self.0.delete_route(ctx, cluster_name.as_str(), &route)
        })
    }
}

// Keep RBox in the public signature set used by the macro.
#[doc(hidden)]
pub type __RBox<T> = RBox<T>;
