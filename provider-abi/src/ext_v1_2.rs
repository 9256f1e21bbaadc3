//! ABI 1.2: the extension module a 1.2 plugin exports next to its 1.0 root module and its 1.1
//! extension module.
//!
//! 1.2 adds one thing (docs/abi-1.2.md): the **incremental host update** of a load balancer,
//! for providers whose cloud API is incremental (AWS `RegisterTargets`/`DeregisterTargets`,
//! metal, the containers provider). Instead of the whole host list of `UpdateLoadBalancer`, the
//! host sends the hosts added and removed since the set the plugin last acknowledged, named by
//! a token the host chose ([`AbiProviderExtV1_2::update_load_balancer_hosts`]).
//!
//! Like 1.1 ([`crate::ext`]), the additions sit in a module of their own, exported under
//! [`EXT_V1_2_SYMBOL`] and checked by the host with abi_stable's layout checker on its own, so
//! that the 1.0 and 1.1 modules stay exactly as released. A 1.2 factory returns the 1.0 object,
//! the 1.1 extension and the 1.2 extension, all backed by the same provider value. A 1.0 or 1.1
//! host never looks for this module; a 1.2 host uses it when present and the full
//! `UpdateLoadBalancer` otherwise.
//!
//! Frozen once released: a later minor version adds a module of its own (`…_v1_3`).

use abi_stable::{
    sabi_trait,
    std_types::{RBox, ROption, RSlice, RStr, RString},
    type_layout::TypeLayout,
    StableAbi,
};

use crate::abi::{AbiResult, CloudProviderBox, LoggerBox};
use crate::context::CallContext;
use crate::ext::ProviderExtBox;

/// The symbol of the 1.2 extension: an `extern "C" fn() -> ExtV1_2Export`.
pub const EXT_V1_2_SYMBOL: &str = "ccm_provider_plugin_ext_v1_2";

/// Optional 1.2 features a provider declares (a bit set; unknown bits are ignored).
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Debug, Default)]
pub struct ExtCapabilitiesV1_2(pub u64);

impl ExtCapabilitiesV1_2 {
    /// [`AbiProviderExtV1_2::update_load_balancer_hosts`] applies host changes incrementally.
    pub const INCREMENTAL_HOSTS: Self = Self(1);

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

/// The answer to an incremental host update (an extensible enum: a host that does not know a
/// code treats it as [`HostUpdateOutcome::BASE_MISMATCH`], which is always safe).
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Debug)]
pub struct HostUpdateOutcome(pub u8);

impl HostUpdateOutcome {
    /// The change was applied: the load balancer's hosts are now the set named by the call's
    /// `token`, which the next incremental update may use as its `base`.
    pub const APPLIED: Self = Self(0);
    /// The plugin does not hold the set named by `base` for this load balancer (it never got
    /// it, lost it in a restart or reload, or a later full call replaced it): nothing was
    /// changed. The host sends the whole set again (`base` = [`NO_BASE`]).
    pub const BASE_MISMATCH: Self = Self(1);
}

/// `base` of an update that carries the whole host set: `added` is the complete list and
/// `removed` is empty; the load balancer's hosts become exactly `added`.
pub const NO_BASE: u64 = 0;

/// `base` naming the host set of the load balancer's last successful **full** call
/// (`EnsureLoadBalancer` or `UpdateLoadBalancer`) when no host update has been applied since:
/// the first host change after an ensure travels as a difference instead of the whole set.
/// Never a host's `token`. A plugin that does not record it answers
/// [`HostUpdateOutcome::BASE_MISMATCH`] (as for any unknown base) and gets the whole set
/// (added in ccm-provider-abi 1.2.1; docs/abi-1.2.md).
pub const LAST_FULL: u64 = u64::MAX;

/// One incremental host update (see [`AbiProviderExtV1_2::update_load_balancer_hosts`]).
#[repr(C)]
#[derive(StableAbi, Copy, Clone, Debug)]
pub struct AbiHostUpdate<'a> {
    /// The token of the host set the host believes the plugin holds for this load balancer,
    /// from an earlier `APPLIED` answer; [`NO_BASE`]: `added` is the whole set.
    pub base: u64,
    /// The host's name for the set after this change (never [`NO_BASE`] or [`LAST_FULL`]).
    pub token: u64,
    /// Node JSON of the hosts that join (or whose providerID changed: their new form).
    pub added: RSlice<'a, RString>,
    /// Node JSON of the hosts that leave, with the name and providerID the host sent them with
    /// (so a provider can read their providerID): the node as the host holds it now when it
    /// still has that providerID, else only `metadata.name` and `spec.providerID`. Removals
    /// apply before additions. Empty when `base` is [`NO_BASE`].
    pub removed: RSlice<'a, RString>,
}

/// The 1.2 additions of one provider instance. `NOT_IMPLEMENTED` errors mean "not offered".
#[sabi_trait]
pub trait AbiProviderExtV1_2: Send + Sync {
    /// Optional 1.2 features the provider offers.
    fn capabilities(&self) -> ExtCapabilitiesV1_2;
    /// Incremental `UpdateLoadBalancer` of the Service's (JSON) load balancer: apply `update`
    /// (docs/abi-1.2.md). Returns [`HostUpdateOutcome::BASE_MISMATCH`] (changing nothing) when
    /// `update.base` is not the token the plugin recorded for this load balancer. An error
    /// leaves the load balancer in an unknown state: the host's next update carries the whole
    /// set.
    #[sabi(last_prefix_field)]
    fn update_load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: RStr<'_>,
        service: RStr<'_>,
        update: AbiHostUpdate<'_>,
    ) -> AbiResult<HostUpdateOutcome>;
}

/// A provider made by a 1.2 factory: the 1.0 object, its 1.1 extension and its 1.2 extension,
/// all backed by the same provider value in the plugin.
#[repr(C)]
#[derive(StableAbi)]
pub struct AbiProviderV1_2 {
    /// The 1.0 interface of the provider.
    pub base: CloudProviderBox,
    /// Its 1.1 additions.
    pub ext: ProviderExtBox,
    /// Its 1.2 additions.
    pub ext_v1_2: ProviderExtV1_2Box,
}

/// A 1.2 provider factory: cloud config bytes (`RNone` without `--cloud-config`) to provider.
#[sabi_trait]
pub trait AbiProviderFactoryV1_2: Send + Sync {
    /// Build the provider.
    #[sabi(last_prefix_field)]
    fn create(&self, config: ROption<RSlice<'_, u8>>) -> AbiResult<AbiProviderV1_2>;
}

/// The 1.2 registrar, implemented by the host: like [`crate::ext::AbiExtRegistrar`],
/// registering 1.2 factories.
#[sabi_trait]
pub trait AbiExtRegistrarV1_2: Send {
    /// Path of the plugin file being loaded.
    fn plugin_path(&self) -> RString;
    /// The most verbose level the host will print (see [`crate::abi::log_level`]).
    fn max_log_level(&self) -> u8;
    /// A log sink the plugin may keep for its whole life.
    fn logger(&self) -> LoggerBox;
    /// Register a named 1.2 provider factory.
    #[sabi(last_prefix_field)]
    fn register_provider(
        &mut self,
        name: RStr<'_>,
        factory: ProviderFactoryV1_2Box,
    ) -> AbiResult<()>;
}

/// See [`AbiProviderExtV1_2`].
pub type ProviderExtV1_2Box = AbiProviderExtV1_2_TO<'static, RBox<()>>;
/// See [`AbiProviderFactoryV1_2`].
pub type ProviderFactoryV1_2Box = AbiProviderFactoryV1_2_TO<'static, RBox<()>>;
/// See [`AbiExtRegistrarV1_2`].
pub type ExtRegistrarV1_2Box = AbiExtRegistrarV1_2_TO<'static, RBox<()>>;

/// The 1.2 extension module (generated by [`crate::export_plugin!`]). The plugin's panic
/// strategy stays in the 1.1 module, which every 1.2 plugin also exports.
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginExtV1_2_Ref)))]
#[sabi(missing_field(panic))]
pub struct PluginExtV1_2 {
    /// The ccm-provider-abi version the plugin was built against (e.g. `1.2.0`).
    pub abi_version: RStr<'static>,
    /// Registers the plugin's providers as 1.2 factories; a 1.2 host calls it instead of the
    /// 1.1 module's `register`.
    #[sabi(last_prefix_field)]
    pub register: extern "C" fn(ExtRegistrarV1_2Box) -> AbiResult<()>,
}

/// What the [`EXT_V1_2_SYMBOL`] function returns: the module and the layout the plugin was
/// compiled with, which the host checks against its own before reading the module.
#[repr(C)]
pub struct ExtV1_2Export {
    /// `<PluginExtV1_2_Ref as StableAbi>::LAYOUT` as the plugin sees it.
    pub layout: &'static TypeLayout,
    /// The module.
    pub module: PluginExtV1_2_Ref,
}

/// The layout the host expects of [`ExtV1_2Export::module`].
pub fn expected_layout() -> &'static TypeLayout {
    <PluginExtV1_2_Ref as StableAbi>::LAYOUT
}
