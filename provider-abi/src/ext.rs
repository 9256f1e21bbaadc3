//! ABI 1.1: the extension module a 1.1 plugin exports next to its 1.0 root module.
//!
//! Why a module of its own (docs/abi-1.1.md): abi_stable refuses a library whose prefix types
//! have fewer fields than the loader's, so appending methods to the 1.0 traits would make every
//! plugin built against 1.0 fail to load in a 1.1 host. The 1.0 interface ([`crate::abi`]) is
//! therefore frozen, and everything 1.1 adds is reached through [`PluginExtV1_1`], which the
//! plugin exports under [`EXT_V1_1_SYMBOL`] and the host checks with abi_stable's layout checker
//! on its own. A 1.0 host never looks for it; a 1.1 host uses it when present and falls back to
//! the 1.0 behaviour when not.
//!
//! Like the 1.0 interface, everything here is frozen once released: a later minor version adds
//! a module of its own (`…_v1_2`) rather than fields here.

use abi_stable::{
    sabi_trait,
    std_types::{RBox, ROption, RResult, RSlice, RStr, RString, RVec},
    type_layout::TypeLayout,
    StableAbi,
};

use crate::abi::{AbiResult, CloudProviderBox, LoggerBox};
use crate::context::CallContext;
use crate::error::ProviderError;
use crate::types::AbiInstanceMetadata;

/// The symbol of the 1.1 extension: an `extern "C" fn() -> ExtV1_1Export`.
pub const EXT_V1_1_SYMBOL: &str = "ccm_provider_plugin_ext_v1_1";

/// How the plugin was compiled to handle panics (`cfg(panic)` of the plugin crate).
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Debug)]
pub struct PanicStrategy(pub u8);

impl PanicStrategy {
    /// `panic = "unwind"`: the SDK catches panics at the boundary.
    pub const UNWIND: Self = Self(0);
    /// `panic = "abort"`: a panic ends the whole host process; 1.1 hosts refuse such plugins.
    pub const ABORT: Self = Self(1);
}

/// Optional 1.1 features a provider declares (a bit set; unknown bits are ignored).
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Debug, Default)]
pub struct ExtCapabilities(pub u64);

impl ExtCapabilities {
    /// [`AbiProviderExt::instances_batch`] answers many nodes in one call.
    pub const BULK_INSTANCES: Self = Self(1);
    /// Two Services may get the same load-balancer address (e.g. one shared IP with ports).
    pub const LB_SHARED_ADDRESSES: Self = Self(1 << 1);

    /// No optional feature.
    pub const fn empty() -> Self {
        Self(0)
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both sets.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// What [`AbiProviderExt::instances_batch`] must find out (a bit set).
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Debug)]
pub struct InstanceQuery(pub u32);

impl InstanceQuery {
    /// `InstanceMetadata` (only for nodes whose instance exists).
    pub const METADATA: Self = Self(1);
    /// `InstanceExists`.
    pub const EXISTS: Self = Self(1 << 1);
    /// `InstanceShutdown` (only for nodes whose instance exists).
    pub const SHUTDOWN: Self = Self(1 << 2);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both sets.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }
}

/// One node's answer to a batch lookup.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiInstanceStatus {
    /// The instance exists. `false` is the explicit "does not exist" answer (never an error).
    pub exists: bool,
    /// The instance is shut down (only meaningful when it exists and SHUTDOWN was asked).
    pub shutdown: bool,
    /// The metadata, when METADATA was asked and the instance exists.
    pub metadata: ROption<AbiInstanceMetadata>,
}

/// The 1.1 additions of one provider instance. Every method has the meaning of its 1.1 SDK
/// counterpart in [`crate::sdk`]; `NOT_IMPLEMENTED` errors mean "not offered".
#[sabi_trait]
pub trait AbiProviderExt: Send + Sync {
    /// Optional features the provider offers.
    fn capabilities(&self) -> ExtCapabilities;
    /// ProviderID prefixes (platforms, KEP-5778) this provider owns, e.g. `aws://`. Empty: the
    /// host uses `<ProviderName>://`.
    fn platforms(&self) -> RVec<RString>;
    /// Answer `query` for every node (Node JSON) in one call, in the same order.
    fn instances_batch(
        &self,
        ctx: &CallContext,
        nodes: RSlice<'_, RString>,
        query: InstanceQuery,
    ) -> AbiResult<RVec<RResult<AbiInstanceStatus, ProviderError>>>;
    /// Apply new cloud-config bytes (credentials rotated, settings changed) in place.
    fn reconfigure(&self, ctx: &CallContext, config: RSlice<'_, u8>) -> AbiResult<()>;
    /// Whether the provider can do its work now (credentials valid, cloud API reachable).
    fn health(&self, ctx: &CallContext) -> AbiResult<()>;
    /// The node names the Service's (JSON) load balancer targets now; `RNone` when it does not
    /// exist.
    #[sabi(last_prefix_field)]
    fn load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
    ) -> AbiResult<ROption<RVec<RString>>>;
}

/// A provider made by a 1.1 factory: the 1.0 object (used for every 1.0 method) and its
/// extension, both backed by the same provider value in the plugin.
#[repr(C)]
#[derive(StableAbi)]
pub struct AbiProviderV1_1 {
    /// The 1.0 interface of the provider.
    pub base: CloudProviderBox,
    /// Its 1.1 additions.
    pub ext: ProviderExtBox,
}

/// A 1.1 provider factory: cloud config bytes (`RNone` without `--cloud-config`) to provider.
#[sabi_trait]
pub trait AbiProviderFactoryV1_1: Send + Sync {
    /// Build the provider.
    #[sabi(last_prefix_field)]
    fn create(&self, config: ROption<RSlice<'_, u8>>) -> AbiResult<AbiProviderV1_1>;
}

/// The 1.1 registrar, implemented by the host: like [`crate::abi::AbiRegistrar`], registering
/// 1.1 factories.
#[sabi_trait]
pub trait AbiExtRegistrar: Send {
    /// Path of the plugin file being loaded.
    fn plugin_path(&self) -> RString;
    /// The most verbose level the host will print (see [`crate::abi::log_level`]).
    fn max_log_level(&self) -> u8;
    /// A log sink the plugin may keep for its whole life.
    fn logger(&self) -> LoggerBox;
    /// Register a named 1.1 provider factory.
    #[sabi(last_prefix_field)]
    fn register_provider(
        &mut self,
        name: RStr<'_>,
        factory: ProviderFactoryV1_1Box,
    ) -> AbiResult<()>;
}

/// See [`AbiProviderExt`].
pub type ProviderExtBox = AbiProviderExt_TO<'static, RBox<()>>;
/// See [`AbiProviderFactoryV1_1`].
pub type ProviderFactoryV1_1Box = AbiProviderFactoryV1_1_TO<'static, RBox<()>>;
/// See [`AbiExtRegistrar`].
pub type ExtRegistrarBox = AbiExtRegistrar_TO<'static, RBox<()>>;

/// The 1.1 extension module (generated by [`crate::export_plugin!`]).
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginExtV1_1_Ref)))]
#[sabi(missing_field(panic))]
pub struct PluginExtV1_1 {
    /// The ccm-provider-abi version the plugin was built against (e.g. `1.1.0`).
    pub abi_version: RStr<'static>,
    /// How the plugin was compiled to handle panics.
    pub panic_strategy: PanicStrategy,
    /// Registers the plugin's providers as 1.1 factories; a 1.1 host calls it instead of the
    /// root module's `register`.
    #[sabi(last_prefix_field)]
    pub register: extern "C" fn(ExtRegistrarBox) -> AbiResult<()>,
}

/// What the [`EXT_V1_1_SYMBOL`] function returns: the module and the layout the plugin was
/// compiled with, which the host checks against its own before reading the module.
#[repr(C)]
pub struct ExtV1_1Export {
    /// `<PluginExtV1_1_Ref as StableAbi>::LAYOUT` as the plugin sees it.
    pub layout: &'static TypeLayout,
    /// The module.
    pub module: PluginExtV1_1_Ref,
}

/// The layout the host expects of [`ExtV1_1Export::module`].
pub fn expected_layout() -> &'static TypeLayout {
    <PluginExtV1_1_Ref as StableAbi>::LAYOUT
}
