//! # ccm-provider-fake
//!
//! A programmable in-memory cloud for ccm-host's tests, sandbox and benchmarks, modelled on the
//! upstream fake cloud (`k8s.io/cloud-provider/fake`). One plugin library registers two providers:
//!
//! - `fake`: InstancesV2, legacy Instances, LoadBalancer, Routes, Zones and Clusters;
//! - `fake-v1`: the upstream fake's defaults, i.e. the same without InstancesV2.
//!
//! Both read the same configuration ([`config::FakeConfig`], YAML or JSON, see
//! `docs/fake-provider.md`). With `stateDir` set, tests steer and observe a running plugin through
//! files; [`control`] has the helpers for that side.
//!
//! The rlib also lets Rust tests use the cloud directly: [`FakeCloud`] implements the SDK traits.

pub mod cloud;
pub mod config;
pub mod control;
mod faults;
pub mod heap;
mod instances;
pub mod loadbalancer;
pub mod routes;

pub use cloud::{Capabilities, FakeCloud, Flavour};
pub use config::{AddressConfig, Defaults, ErrorSpec, FakeConfig, InjectedKind, InstanceConfig};
pub use control::{CallRecord, FakeState};

use ccm_provider_abi::prelude::*;

/// The registered name of the full provider.
pub const FAKE: &str = "fake";
/// The registered name of the provider with upstream fake's defaults (no InstancesV2).
pub const FAKE_V1: &str = "fake-v1";

/// Registers `fake` and `fake-v1` (upstream `RegisterCloudProvider`).
pub fn register(r: &mut Registrar) -> Result<(), ProviderError> {
    r.register(FAKE, |config| FakeCloud::new(FAKE, Flavour::Fake, config))?;
    r.register(FAKE_V1, |config| {
        FakeCloud::new(FAKE_V1, Flavour::FakeV1, config)
    })?;
    Ok(())
}

ccm_provider_abi::export_plugin!(register);

#[cfg(test)]
mod tests;
