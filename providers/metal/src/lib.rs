//! # ccm-provider-metal
//!
//! The bare-metal provider plugin, registered as `metal`:
//!
//! - **InstancesV2** from a machine inventory file (YAML) named by the cloud config: provider
//!   IDs `metal://<id>`, instance types, zones, regions, addresses, extra labels and a state
//!   (`running` / `shutdown` / `absent`). The file is re-read when it changes; a malformed edit
//!   is logged once and the last good inventory stays in force ([`reload`]).
//! - **LoadBalancer** as IP address management over configured pools ([`ipam`]), IPv4 and
//!   IPv6, with requested addresses, dual-stack, opt-in sharing, and allocations kept in a
//!   ConfigMap of the cluster ([`store`]) so that a service keeps its address across restarts.
//!
//! Configuration reference: `docs/metal-provider.md`.

pub mod cloud;
pub mod config;
pub mod instances;
pub mod inventory;
pub mod ipam;
pub mod loadbalancer;
mod names;
pub mod pool;
pub mod reload;
pub mod service;
pub mod store;

#[cfg(test)]
mod proptests;

pub use cloud::MetalCloud;

use ccm_provider_abi::prelude::*;

/// The registered provider name, and the scheme of its provider IDs.
pub const METAL: &str = "metal";

/// Registers `metal` (upstream `RegisterCloudProvider`).
pub fn register(r: &mut Registrar) -> Result<(), ProviderError> {
    r.register(METAL, MetalCloud::new)
}

ccm_provider_abi::export_plugin!(register);
