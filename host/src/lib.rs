//! ccm-host: the cloud-controller-manager library that loads cloud providers from plugins.
//!
//! The layers, from the bottom:
//! - [`runtime`]: the controller runtime (shared informers, work queues, events, patches, API
//!   clients and rate limits, metrics), as kube-runtime and client-go are for upstream.
//! - [`plugin`]: loading `.so` files and the provider registry (`--plugin-dir`).
//! - [`provider`]: a loaded provider as typed async calls with deadlines, on the provider's own
//!   call pool.
//! - [`controllers`]: the cloud-node, cloud-node-lifecycle, service and route controllers.
//! - [`daemon`]: `ccm-host run` (upstream's flags, leader election, serving, health) and
//!   [`plugin_listing`] for `ccm-host plugins`.
//!
//! The developer tools (sandbox, check, new-provider) are the `ccm-host-tools` crate and the binary
//! is `ccm-host-cli`; this crate does not depend on either, nor on the in-memory API server.

#![deny(missing_docs)]

pub mod args;
pub mod controllers;
pub mod daemon;
pub mod plugin;
pub mod plugin_listing;
pub mod provider;
pub mod runtime;
