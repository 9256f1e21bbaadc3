//! The ABI-stable plugin interface: what crosses the FFI between the host and a plugin `.so`.
//!
//! Plugin authors do not use this module directly: they implement the plain traits of
//! [`crate::sdk`] and call [`crate::export_plugin!`], which generates everything here.
//!
//! Shape of the interface (the Rust form of upstream `cloudprovider.Interface`):
//! - the library exports one root module, [`PluginModule`], checked by abi_stable at load time;
//! - the host calls its `register` function with a host-implemented [`AbiRegistrar`]; the plugin
//!   registers one or more named [`AbiProviderFactory`]s (upstream `RegisterCloudProvider`);
//! - a factory turns the cloud config bytes into an [`AbiCloudProvider`], whose capability
//!   getters return `ROption` (the Rust form of upstream's `(impl, bool)` pair: `RNone` = false).
//!
//! This interface is frozen at 1.0: every trait and struct keeps its layout for the whole major
//! version (abi_stable refuses a plugin whose prefix types have fewer fields than the host's, so
//! appending here would lock 1.0 plugins out). Later minor versions add modules of their own:
//! see [`crate::ext`] and docs/abi-1.1.md.

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, ROption, RResult, RSlice, RStr, RString, RVec},
    StableAbi,
};

use crate::context::CallContext;
use crate::error::ProviderError;
use crate::types::{AbiInstanceMetadata, AbiLoadBalancerStatus, AbiNodeAddress, AbiRoute, AbiZone};

/// Result type of every ABI call.
pub type AbiResult<T> = RResult<T, ProviderError>;

/// Upstream `LoadBalancer`. Services and nodes cross as JSON text.
#[sabi_trait]
pub trait AbiLoadBalancer: Send + Sync {
    /// `GetLoadBalancer`: `RSome(status)` when it exists.
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<ROption<AbiLoadBalancerStatus>>;

    /// `GetLoadBalancerName`.
    fn get_load_balancer_name(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<RString>;

    /// `EnsureLoadBalancer`: `RNone` is the upstream nil status (the controller treats it as an error).
    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
        nodes: RSlice<'_, RString>,
    ) -> AbiResult<ROption<AbiLoadBalancerStatus>>;

    /// `UpdateLoadBalancer`.
    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
        nodes: RSlice<'_, RString>,
    ) -> AbiResult<()>;

    /// `EnsureLoadBalancerDeleted`.
    #[sabi(last_prefix_field)]
    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<()>;
}

/// Upstream legacy `Instances` (name and provider-ID based).
#[sabi_trait]
pub trait AbiInstances: Send + Sync {
    /// `NodeAddresses`.
    fn node_addresses(
        &self,
        ctx: &CallContext,
        node_name: RStr<'_>,
    ) -> AbiResult<RVec<AbiNodeAddress>>;
    /// `NodeAddressesByProviderID`.
    fn node_addresses_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<RVec<AbiNodeAddress>>;
    /// `InstanceID`.
    fn instance_id(&self, ctx: &CallContext, node_name: RStr<'_>) -> AbiResult<RString>;
    /// `InstanceType`.
    fn instance_type(&self, ctx: &CallContext, node_name: RStr<'_>) -> AbiResult<RString>;
    /// `InstanceTypeByProviderID`.
    fn instance_type_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<RString>;
    /// `InstanceExistsByProviderID`.
    fn instance_exists_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<bool>;
    /// `InstanceShutdownByProviderID`.
    fn instance_shutdown_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<bool>;
    /// `CurrentNodeName`.
    #[sabi(last_prefix_field)]
    fn current_node_name(&self, ctx: &CallContext, hostname: RStr<'_>) -> AbiResult<RString>;
}

/// Upstream `InstancesV2` (node-object based). Nodes cross as JSON text.
#[sabi_trait]
pub trait AbiInstancesV2: Send + Sync {
    /// `InstanceExists`.
    fn instance_exists(&self, ctx: &CallContext, node: RStr<'_>) -> AbiResult<bool>;
    /// `InstanceShutdown`.
    fn instance_shutdown(&self, ctx: &CallContext, node: RStr<'_>) -> AbiResult<bool>;
    /// `InstanceMetadata`: `RNone` is upstream's `(nil, nil)`.
    #[sabi(last_prefix_field)]
    fn instance_metadata(
        &self,
        ctx: &CallContext,
        node: RStr<'_>,
    ) -> AbiResult<ROption<AbiInstanceMetadata>>;
}

/// Upstream `Zones` (deprecated; never consulted when InstancesV2 is in use).
#[sabi_trait]
pub trait AbiZones: Send + Sync {
    /// `GetZoneByProviderID`.
    fn get_zone_by_provider_id(
        &self,
        ctx: &CallContext,
        provider_id: RStr<'_>,
    ) -> AbiResult<AbiZone>;
    /// `GetZoneByNodeName`.
    #[sabi(last_prefix_field)]
    fn get_zone_by_node_name(&self, ctx: &CallContext, node_name: RStr<'_>) -> AbiResult<AbiZone>;
}

/// Upstream `Clusters`.
#[sabi_trait]
pub trait AbiClusters: Send + Sync {
    /// `ListClusters`.
    fn list_clusters(&self, ctx: &CallContext) -> AbiResult<RVec<RString>>;
    /// `Master`.
    #[sabi(last_prefix_field)]
    fn master(&self, ctx: &CallContext, cluster_name: RStr<'_>) -> AbiResult<RString>;
}

/// Upstream `Routes`.
#[sabi_trait]
pub trait AbiRoutes: Send + Sync {
    /// `ListRoutes`.
    fn list_routes(&self, ctx: &CallContext, cluster_name: RStr<'_>) -> AbiResult<RVec<AbiRoute>>;
    /// `CreateRoute` (`route.name` is ignored; `name_hint` is the node UID).
    fn create_route(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        name_hint: RStr<'_>,
        route: &AbiRoute,
    ) -> AbiResult<()>;
    /// `DeleteRoute`.
    #[sabi(last_prefix_field)]
    fn delete_route(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        route: &AbiRoute,
    ) -> AbiResult<()>;
}

/// A raw response to [`AbiHost::kube_request`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone)]
pub struct AbiKubeResponse {
    /// HTTP status code.
    pub status: u16,
    /// Response body.
    pub body: RVec<u8>,
}

/// What the host offers a provider at `Initialize` (upstream hands a client builder and a stop
/// channel; plugins have no view of the host's runtime, so the host runs requests for them).
#[sabi_trait]
pub trait AbiHost: Send + Sync {
    /// The value of `--cluster-name`.
    fn cluster_name(&self) -> RString;
    /// Send one request to the Kubernetes API server with the host's credentials, e.g.
    /// `("GET", "/api/v1/namespaces/kube-system/configmaps/x", "", [])`. Blocks until answered.
    fn kube_request(
        &self,
        ctx: &CallContext,
        method: RStr<'_>,
        path: RStr<'_>,
        content_type: RStr<'_>,
        body: RSlice<'_, u8>,
    ) -> AbiResult<AbiKubeResponse>;
    /// True once the host is shutting down (upstream's closed `stop` channel): background work
    /// the provider started in `initialize` must end.
    #[sabi(last_prefix_field)]
    fn is_stopping(&self) -> bool;
}

/// Upstream `cloudprovider.Interface`.
#[sabi_trait]
pub trait AbiCloudProvider: Send + Sync {
    /// `ProviderName`.
    fn provider_name(&self) -> RString;
    /// `HasClusterID`.
    fn has_cluster_id(&self) -> bool;
    /// `Initialize`: called once on the leader before controllers start.
    fn initialize(&self, ctx: &CallContext, host: HostBox) -> AbiResult<()>;
    /// `LoadBalancer()`.
    fn load_balancer(&self) -> ROption<LoadBalancerBox>;
    /// `Instances()`.
    fn instances(&self) -> ROption<InstancesBox>;
    /// `InstancesV2()`.
    fn instances_v2(&self) -> ROption<InstancesV2Box>;
    /// `Zones()`.
    fn zones(&self) -> ROption<ZonesBox>;
    /// `Clusters()`.
    fn clusters(&self) -> ROption<ClustersBox>;
    /// `Routes()`.
    #[sabi(last_prefix_field)]
    fn routes(&self) -> ROption<RoutesBox>;
}

/// Upstream `cloudprovider.Factory`: cloud config bytes (`RNone` without `--cloud-config`) to provider.
#[sabi_trait]
pub trait AbiProviderFactory: Send + Sync {
    /// Build the provider.
    #[sabi(last_prefix_field)]
    fn create(&self, config: ROption<RSlice<'_, u8>>) -> AbiResult<CloudProviderBox>;
}

/// Log levels as they cross the boundary (same order as `log::Level`).
pub mod log_level {
    /// Logging off.
    pub const OFF: u8 = 0;
    /// error
    pub const ERROR: u8 = 1;
    /// warn
    pub const WARN: u8 = 2;
    /// info
    pub const INFO: u8 = 3;
    /// debug
    pub const DEBUG: u8 = 4;
    /// trace
    pub const TRACE: u8 = 5;
}

/// The host's log sink; the SDK forwards the plugin's `log`/`tracing` records here.
#[sabi_trait]
pub trait AbiLogger: Send + Sync {
    /// Emit one record (`level` from [`log_level`]).
    #[sabi(last_prefix_field)]
    fn log(&self, level: u8, target: RStr<'_>, message: RStr<'_>);
}

/// Implemented by the host and handed to the plugin's `register` function
/// (upstream `RegisterCloudProvider`).
#[sabi_trait]
pub trait AbiRegistrar: Send {
    /// Path of the plugin file being loaded (lets a plugin find files installed beside it).
    fn plugin_path(&self) -> RString;
    /// The most verbose level the host will print (see [`log_level`]).
    fn max_log_level(&self) -> u8;
    /// A log sink the plugin may keep for its whole life.
    fn logger(&self) -> LoggerBox;
    /// Register a named provider factory. Names are validated by the host (non-empty, unique
    /// across every loaded plugin).
    #[sabi(last_prefix_field)]
    fn register_provider(&mut self, name: RStr<'_>, factory: ProviderFactoryBox) -> AbiResult<()>;
}

/// Owned FFI-safe trait objects.
pub type LoadBalancerBox = AbiLoadBalancer_TO<'static, RBox<()>>;
/// See [`AbiInstances`].
pub type InstancesBox = AbiInstances_TO<'static, RBox<()>>;
/// See [`AbiInstancesV2`].
pub type InstancesV2Box = AbiInstancesV2_TO<'static, RBox<()>>;
/// See [`AbiZones`].
pub type ZonesBox = AbiZones_TO<'static, RBox<()>>;
/// See [`AbiClusters`].
pub type ClustersBox = AbiClusters_TO<'static, RBox<()>>;
/// See [`AbiRoutes`].
pub type RoutesBox = AbiRoutes_TO<'static, RBox<()>>;
/// See [`AbiHost`].
pub type HostBox = AbiHost_TO<'static, RBox<()>>;
/// See [`AbiCloudProvider`].
pub type CloudProviderBox = AbiCloudProvider_TO<'static, RBox<()>>;
/// See [`AbiProviderFactory`].
pub type ProviderFactoryBox = AbiProviderFactory_TO<'static, RBox<()>>;
/// See [`AbiLogger`].
pub type LoggerBox = AbiLogger_TO<'static, RBox<()>>;
/// See [`AbiRegistrar`].
pub type RegistrarBox = AbiRegistrar_TO<'static, RBox<()>>;

/// The root module every plugin library exports (generated by [`crate::export_plugin!`]).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModule_Ref)))]
#[sabi(missing_field(panic))]
pub struct PluginModule {
    /// The plugin crate's package name.
    pub plugin_name: RStr<'static>,
    /// The plugin crate's version.
    pub plugin_version: RStr<'static>,
    /// The entry function: registers the plugin's providers with the host.
    #[sabi(last_prefix_field)]
    pub register: extern "C" fn(RegistrarBox) -> AbiResult<()>,
}

impl RootModule for PluginModule_Ref {
    declare_root_module_statics! {PluginModule_Ref}
    const BASE_NAME: &'static str = "ccm_provider_plugin";
    const NAME: &'static str = "ccm_provider_plugin";
    /// The version of the root module's interface, frozen at 1.0.0: every type reachable from
    /// it keeps its 1.0 layout, so any 1.x plugin loads in any 1.x host (abi_stable requires
    /// `host minor <= plugin minor` here, which a crate version would break for 1.0 plugins in
    /// a 1.1 host). What a plugin was built against is [`crate::ext::PluginExtV1_1::abi_version`].
    const VERSION_STRINGS: VersionStrings = ROOT_INTERFACE_VERSION;
}

/// The frozen version of the 1.0 root interface (see [`PluginModule_Ref`]'s `VERSION_STRINGS`).
pub const ROOT_INTERFACE_VERSION: VersionStrings = VersionStrings::new("1.0.0");

/// The exported symbol that holds abi_stable's library header. `export_plugin!` spells it out
/// so that plugin crates need no direct dependency on abi_stable; a test keeps them in sync.
pub const ROOT_MODULE_SYMBOL: &str = "_1as_0lib_1header_0root_bmodule_bloader";

#[cfg(test)]
mod tests {
    #[test]
    fn root_module_symbol_matches_abi_stable() {
        assert_eq!(
            super::ROOT_MODULE_SYMBOL,
            abi_stable::library::ROOT_MODULE_LOADER_NAME
        );
    }
}
