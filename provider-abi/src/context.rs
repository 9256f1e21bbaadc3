//! The per-call context: a deadline and a cancellation flag the plugin can poll.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use abi_stable::{std_types::RArc, StableAbi};

use crate::error::ProviderError;

/// Handed to every provider call.
///
/// The host sets the cancellation flag when the deadline passes (it stops waiting at that moment)
/// or when it shuts down. A long-running provider method should call [`CallContext::check`]
/// between steps and return its error when the call is over.
#[repr(C)]
#[derive(StableAbi, Clone)]
pub struct CallContext {
    /// Deadline in milliseconds since the Unix epoch; 0 means none.
    deadline_unix_ms: u64,
    cancelled: RArc<AtomicBool>,
}

impl CallContext {
    /// A context whose deadline is `timeout` from now (`None`: no deadline).
    pub fn new(timeout: Option<Duration>) -> Self {
        let deadline_unix_ms = timeout
            .map(|t| {
                let deadline = SystemTime::now() + t;
                let ms = deadline
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis();
                u64::try_from(ms).unwrap_or(u64::MAX).max(1)
            })
            .unwrap_or(0);
        Self {
            deadline_unix_ms,
            cancelled: RArc::new(AtomicBool::new(false)),
        }
    }

    /// A context with no deadline that is never cancelled (tests, tools).
    pub fn background() -> Self {
        Self::new(None)
    }

    /// The deadline, if any.
    pub fn deadline(&self) -> Option<SystemTime> {
        (self.deadline_unix_ms != 0)
            .then(|| UNIX_EPOCH + Duration::from_millis(self.deadline_unix_ms))
    }

    /// Time left until the deadline (zero once it has passed); `None` without a deadline.
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline().map(|d| {
            d.duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO)
        })
    }

    /// True once the host has cancelled the call.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Cancel the call (the host does this on timeout or shutdown).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    /// `Err(Cancelled)` or `Err(DeadlineExceeded)` when the call is over, `Ok(())` otherwise.
    pub fn check(&self) -> Result<(), ProviderError> {
        if self.is_cancelled() {
            return Err(ProviderError::cancelled("call cancelled by the host"));
        }
        if self.remaining() == Some(Duration::ZERO) {
            return Err(ProviderError::deadline_exceeded("call deadline exceeded"));
        }
        Ok(())
    }
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallContext")
            .field("remaining", &self.remaining())
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn clones_share_the_cancellation_flag() {
        let ctx = CallContext::new(Some(Duration::from_secs(60)));
        let seen_by_plugin = ctx.clone();
        assert!(seen_by_plugin.check().is_ok());
        ctx.cancel();
        assert_eq!(
            seen_by_plugin.check().unwrap_err().kind(),
            ErrorKind::CANCELLED
        );
    }

    #[test]
    fn deadline_in_the_past_is_reported() {
        let ctx = CallContext::new(Some(Duration::ZERO));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(ctx.remaining(), Some(Duration::ZERO));
        assert_eq!(
            ctx.check().unwrap_err().kind(),
            ErrorKind::DEADLINE_EXCEEDED
        );
        assert!(CallContext::background().deadline().is_none());
    }
}
