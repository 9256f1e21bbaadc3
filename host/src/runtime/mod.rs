//! The controller runtime the controllers are built on, as kube-runtime and client-go are for
//! upstream: shared informers, work queues, events, patches, the API clients and their rate limits,
//! metrics, and the process-level pieces a long-running daemon needs (malloc settings, crash lines).
//!
//! Nothing here knows about providers or plugins except [`crash`] (which names the plugin a fatal
//! signal came from) and [`ownership`] (which of the active providers owns a Node).

pub mod cached_node;
pub mod crash;
pub mod duration;
pub mod events;
pub mod informer;
pub mod kube_clients;
pub mod malloc;
pub mod metrics;
pub mod ownership;
pub(crate) mod patches;
pub(crate) mod rate_limit;
pub mod well_known;
pub(crate) mod workqueue;

pub use cached_node::{CachedNode, NodeRef};
pub use events::{EventRecorder, EventType};
pub use informer::{Cache, Change, SharedInformer, Store};
pub use workqueue::WorkQueue;
