//! ccm-host: a Kubernetes cloud-controller-manager that loads cloud providers from plugins.
//!
//! - [`plugin`]: loading `.so` files and the provider registry (`--plugin-dir`).
//! - [`provider`]: the selected provider as typed async calls with deadlines.
//! - [`cli`]: the command line.

pub mod args;
pub mod check;
pub mod cli;
pub mod controllers;
pub mod crash;
pub mod daemon;
pub mod duration;
pub mod events;
pub mod informer;
pub mod kube_clients;
pub mod malloc;
pub mod metrics;
pub mod ownership;
pub mod patches;
pub mod plugin;
pub mod provider;
pub mod rate_limit;
pub mod sandbox;
pub mod scaffold;
pub mod well_known;
pub mod workqueue;
