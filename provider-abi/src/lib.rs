//! # ccm-provider-abi
//!
//! The ABI-stable cloud provider interface of ccm-host (a Kubernetes cloud-controller-manager
//! that loads its cloud providers as plugins) and the SDK a
//! vendor uses to write a provider plugin: the Rust equivalent of upstream Kubernetes'
//! `k8s.io/cloud-provider` `cloudprovider.Interface` plus `RegisterCloudProvider`.
//!
//! ## Writing a provider
//! ```ignore
//! use std::sync::Arc;
//! use ccm_provider_abi::prelude::*;
//!
//! struct MyCloud;
//! impl CloudProvider for MyCloud {
//!     fn provider_name(&self) -> String { "mycloud".into() }
//!     fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> { Some(Arc::new(MyInstances)) }
//! }
//! # struct MyInstances;
//! # impl InstancesV2 for MyInstances { /* ... */ }
//!
//! fn register(r: &mut Registrar) -> ccm_provider_abi::sdk::Result<()> {
//!     r.register("mycloud", |_config| Ok(MyCloud))
//! }
//! ccm_provider_abi::export_plugin!(register);
//! ```
//! Build it as a `cdylib` (`crate-type = ["cdylib"]`) and drop the `.so` into the host's
//! `--plugin-dir`. Log with the [`log`] crate's macros (re-exported here): records are
//! forwarded to the host's log with the plugin's name. Panics are caught at the boundary and
//! reported as [`ErrorKind::PANICKED`]; plugins must keep `panic = "unwind"` (the default).
//!
//! ## Versioning
//! The major version of this crate is the plugin ABI version. Within a major version every host
//! loads every plugin, older or newer (docs/abi-1.1.md, docs/abi-1.2.md):
//! - the 1.0 interface ([`abi`], reached from the root module) is frozen: its traits and structs
//!   never change, and the root module declares the fixed interface version 1.0.0;
//! - each minor version adds one extension module of its own ([`ext`] for 1.1, [`ext_v1_2`] for
//!   1.2) that the plugin
//!   exports under its own symbol and the host checks separately: a host uses the extensions it
//!   knows and the plugin offers, and falls back to 1.0 behaviour for the rest;
//! - new error kinds are new [`ErrorKind`] codes; a host that does not know one treats it as
//!   [`ErrorKind::OTHER`].
//!
//! [`export_plugin!`] exports both the root module and every extension module of this version,
//! so a plugin built against 1.2 loads in a 1.0 host (as a 1.0 plugin), in a 1.1 host (with its
//! 1.1 additions) and in a 1.2 host (with all of them).

// Every public item of the SDK is documented (also set in Cargo.toml, stated here so that a
// copy of the sources keeps it).
#![deny(missing_docs)]

// abi_stable's derives (StableAbi, sabi_trait) generate `unsafe impl`s, unsafe blocks, impls
// inside functions and `*_Ref` type names in the modules that use them; the rest of the crate
// has no unsafe code.
#[allow(unsafe_code, non_local_definitions, non_camel_case_types)]
pub mod abi;
pub mod context;
pub mod error;
#[allow(unsafe_code, non_local_definitions, non_camel_case_types)]
pub mod ext;
#[allow(unsafe_code, non_local_definitions, non_camel_case_types)]
pub mod ext_v1_2;
pub mod sdk;
pub mod types;

pub use context::CallContext;
pub use error::{ErrorKind, ProviderError};
pub use types::{InstanceMetadata, InstanceStatus, Route, Zone};

#[doc(hidden)]
pub use abi_stable;
pub use k8s_openapi;
pub use log;

/// The ABI version this crate defines (its package version).
pub const ABI_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Everything a provider implementation needs.
pub mod prelude {
    pub use crate::context::CallContext;
    pub use crate::error::{ErrorKind, ProviderError};
    pub use crate::ext::InstanceQuery;
    pub use crate::sdk::{
        BulkInstances, CloudProvider, Clusters, Host, HostChange, Instances, InstancesV2,
        LoadBalancer, Registrar, Routes, Zones,
    };
    pub use crate::types::{address_type, InstanceMetadata, InstanceStatus, Route, Zone};
    pub use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, Node, NodeAddress, PortStatus, Service,
    };
}

/// Export a provider plugin: generates the library's root module and its entry function.
///
/// `$register` is a `fn(&mut Registrar) -> Result<(), ProviderError>` that registers one or more
/// named providers. The host calls it once, right after the ABI checks.
#[macro_export]
macro_rules! export_plugin {
    ($register:path) => {
        #[doc(hidden)]
        pub fn __ccm_plugin_root_module() -> $crate::abi::PluginModule_Ref {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::abi::PluginModule {
                plugin_name: $crate::abi_stable::std_types::RStr::from_str(env!("CARGO_PKG_NAME")),
                plugin_version: $crate::abi_stable::std_types::RStr::from_str(env!(
                    "CARGO_PKG_VERSION"
                )),
                register: __ccm_plugin_register,
            }
            .leak_into_prefix()
        }

        #[doc(hidden)]
        extern "C" fn __ccm_plugin_register(
            registrar: $crate::abi::RegistrarBox,
        ) -> $crate::abi::AbiResult<()> {
            $crate::sdk::__run_registration(registrar, $register)
        }

        #[doc(hidden)]
        extern "C" fn __ccm_plugin_register_v1_1(
            registrar: $crate::ext::ExtRegistrarBox,
        ) -> $crate::abi::AbiResult<()> {
            $crate::sdk::__run_registration_v1_1(registrar, $register)
        }

        /// ABI 1.1: the extension module (see `ccm_provider_abi::ext::EXT_V1_1_SYMBOL`).
        #[doc(hidden)]
        #[unsafe(no_mangle)]
        pub extern "C" fn ccm_provider_plugin_ext_v1_1() -> $crate::ext::ExtV1_1Export {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::ext::ExtV1_1Export {
                layout: $crate::ext::expected_layout(),
                module: $crate::ext::PluginExtV1_1 {
                    abi_version: $crate::abi_stable::std_types::RStr::from_str(
                        $crate::ABI_VERSION,
                    ),
                    // Evaluated in the plugin crate: its own panic strategy.
                    panic_strategy: if cfg!(panic = "abort") {
                        $crate::ext::PanicStrategy::ABORT
                    } else {
                        $crate::ext::PanicStrategy::UNWIND
                    },
                    register: __ccm_plugin_register_v1_1,
                }
                .leak_into_prefix(),
            }
        }

        #[doc(hidden)]
        extern "C" fn __ccm_plugin_register_v1_2(
            registrar: $crate::ext_v1_2::ExtRegistrarV1_2Box,
        ) -> $crate::abi::AbiResult<()> {
            $crate::sdk::__run_registration_v1_2(registrar, $register)
        }

        /// ABI 1.2: the extension module (see `ccm_provider_abi::ext_v1_2::EXT_V1_2_SYMBOL`).
        #[doc(hidden)]
        #[unsafe(no_mangle)]
        pub extern "C" fn ccm_provider_plugin_ext_v1_2() -> $crate::ext_v1_2::ExtV1_2Export {
            use $crate::abi_stable::prefix_type::PrefixTypeTrait;
            $crate::ext_v1_2::ExtV1_2Export {
                layout: $crate::ext_v1_2::expected_layout(),
                module: $crate::ext_v1_2::PluginExtV1_2 {
                    abi_version: $crate::abi_stable::std_types::RStr::from_str(
                        $crate::ABI_VERSION,
                    ),
                    register: __ccm_plugin_register_v1_2,
                }
                .leak_into_prefix(),
            }
        }

        /// abi_stable's library header (see `ccm_provider_abi::abi::ROOT_MODULE_SYMBOL`).
        #[doc(hidden)]
        #[allow(non_upper_case_globals)]
        #[unsafe(no_mangle)]
        pub static _1as_0lib_1header_0root_bmodule_bloader: $crate::abi_stable::library::LibHeader = {
            extern "C" fn __ccm_erased_root_module() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(__ccm_plugin_root_module)
            }
            // SAFETY: the constructor returns the root module of type `PluginModule_Ref`, the
            // type named here, exactly as abi_stable's `export_root_module` attribute does.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::abi::PluginModule_Ref>(
                    __ccm_erased_root_module,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}
