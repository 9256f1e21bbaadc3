//! One error type and one retry policy for the queue-driven controllers (cloud-node and
//! service), as upstream's `processNextWorkItem` loops share client-go's rate-limited queue:
//!
//! | outcome of a sync | [`Requeue`] | queue operation |
//! |---|---|---|
//! | success | `Forgotten` | `forget`: the key's back-off starts over |
//! | a provider call was throttled (ABI 1.1 `THROTTLED`) | `Throttled(pause)` | `add_after(pause)`, back-off unchanged (not the object's failure) |
//! | a provider `RetryError` (service controller, as upstream) | `After(delay)` | `add_after(delay)`, no failure counted |
//! | any other error | `RateLimited` | `add_rate_limited`: the key's exponential back-off (the node controller also waits for its overall bucket, as upstream's default controller rate limiter) |
//!
//! The controllers keep their own log lines and events (upstream's wording differs between
//! them); what happens to the key is decided here only.

use std::time::Duration;

use ccm_provider_abi::ProviderError;

use crate::provider::Throttled;
use crate::runtime::workqueue::WorkQueue;

/// Why one sync of a Node or a Service failed. `Display` is the upstream error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncError {
    message: String,
    retry_after: Option<Duration>,
    throttled: Option<Throttled>,
}

impl SyncError {
    /// An error with this text and no provider error behind it.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retry_after: None,
            throttled: None,
        }
    }

    /// A provider error returned as is (upstream returns it unwrapped, so a `RetryError` stays
    /// detectable).
    pub fn provider(e: &ProviderError) -> Self {
        Self::wrapping(e.to_string(), e)
    }

    /// `message` about provider error `e`, keeping a `RetryError`'s delay and the throttling
    /// detectable (upstream wraps with `%w`).
    pub fn wrapping(message: String, e: &ProviderError) -> Self {
        Self {
            message,
            retry_after: e.retry_after_delay(),
            throttled: Throttled::of(e),
        }
    }

    /// `message` about provider error `e` (a `RetryError` not kept, as upstream formats these
    /// with `%v`), keeping the throttling detectable.
    pub fn mentioning(message: String, e: &ProviderError) -> Self {
        Self {
            throttled: Throttled::of(e),
            ..Self::new(message)
        }
    }

    /// Prefix the message (`context: message`), keeping what the policy reads.
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        Self {
            message: format!("{context}: {}", self.message),
            ..self
        }
    }

    /// The delay a provider `RetryAfter` error asked for, if this error wraps one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The throttled provider call, if this error wraps one.
    pub fn throttled(&self) -> Option<&Throttled> {
        self.throttled.as_ref()
    }
}

impl From<String> for SyncError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for SyncError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SyncError {}

/// How a processed key went back on its queue (the table in the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Success: backoff reset, not re-queued.
    Forgotten,
    /// Error: re-added with the key's exponential backoff (failure counted).
    RateLimited,
    /// Provider `RetryAfter`: re-added after exactly this delay (no failure counted).
    After(Duration),
    /// A provider call was throttled: re-added after the provider's pause (no failure counted).
    Throttled(Duration),
}

impl Requeue {
    /// The policy: what a sync's outcome does to its key.
    pub fn of(result: &Result<(), SyncError>) -> Self {
        match result {
            Ok(()) => Self::Forgotten,
            Err(e) => match (e.throttled(), e.retry_after()) {
                (Some(throttled), _) => Self::Throttled(throttled.pause),
                (None, Some(after)) => Self::After(after),
                (None, None) => Self::RateLimited,
            },
        }
    }

    /// Apply it to `key` on `queue`. `at_least` is a floor for the rate-limited delay (the node
    /// controller's overall bucket; zero for none).
    pub fn apply<K>(self, queue: &WorkQueue<K>, key: &K, at_least: Duration)
    where
        K: Clone + Eq + std::hash::Hash + Send + 'static,
    {
        match self {
            Self::Forgotten => queue.forget(key),
            Self::RateLimited => queue.add_rate_limited_min(key.clone(), at_least),
            Self::After(delay) | Self::Throttled(delay) => queue.add_after(key.clone(), delay),
        }
    }
}
