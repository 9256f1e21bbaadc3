//! # ccm-provider-containers
//!
//! The "containers are instances" provider plugin, registered as `kind`: the cloud is a
//! container runtime reached through the Docker-compatible Engine API on a unix socket
//! (Docker's or podman's), as in kind clusters and other clusters whose nodes are containers.
//!
//! - **InstancesV2** and bulk lookups ([`instances`]): a Node is the container of its name
//!   carrying the cluster's label; provider IDs `kind://<cluster>/kind/<container>`
//!   (cloud-provider-kind's form), one InternalIP per network and the Hostname, instance type
//!   from a label or the image, zone and region from labels; stopped = shut down, removed = gone.
//! - **LoadBalancer** ([`loadbalancer`]): one haproxy container per Service on the cluster's
//!   network, forwarding each TCP port to every host's NodePort with health checks, reloaded
//!   seamlessly on host changes ([`haproxy`]); optionally published on 127.0.0.1.
//! - No Routes (the cluster's CNI routes pods) and no Zones interface (zones come through
//!   InstancesV2).
//!
//! The Engine API client ([`engine`]) is a small HTTP/1.1 client over the socket; runtime
//! errors never mean "instance not found", so they never delete a Node.
//!
//! Reference: `docs/containers-provider.md`.

pub mod cloud;
pub mod config;
pub mod engine;
pub mod haproxy;
pub mod instances;
pub mod loadbalancer;
pub mod tar;

#[cfg(test)]
mod fake_engine;
#[cfg(test)]
mod fake_engine_tests;

pub use cloud::ContainersCloud;

use ccm_provider_abi::prelude::*;

/// The registered provider name, and the scheme of its provider IDs (cloud-provider-kind's).
pub const KIND: &str = "kind";

/// Registers `kind` (upstream `RegisterCloudProvider`).
pub fn register(r: &mut Registrar) -> Result<(), ProviderError> {
    r.register(KIND, ContainersCloud::new)
}

ccm_provider_abi::export_plugin!(register);
