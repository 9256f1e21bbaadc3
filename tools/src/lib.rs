//! The developer tools of ccm-host, on top of the CCM library (`ccm_host`) and the in-memory API
//! server (`kube_apiserver_inmem`):
//! - [`sandbox`]: `ccm-host sandbox`, the real controllers against an in-memory cluster and a
//!   demo cloud;
//! - [`check`]: `ccm-host check`, the conformance kit a provider author runs against a plugin;
//! - [`scaffold`]: `ccm-host new-provider`, a new plugin crate with the SDK beside it.

pub mod check;
pub mod sandbox;
pub mod scaffold;
