//! The error model shared by the host and plugins.

use std::fmt;
use std::time::Duration;

use abi_stable::{std_types::RString, StableAbi};

/// What kind of failure a provider call reported.
///
/// A `u32` code rather than an enum so that new kinds can be added in a minor release without
/// breaking the layout: a host that does not know a code treats it as [`ErrorKind::OTHER`].
#[repr(transparent)]
#[derive(StableAbi, Copy, Clone, PartialEq, Eq, Hash)]
pub struct ErrorKind(pub u32);

impl ErrorKind {
    /// Any other failure.
    pub const OTHER: Self = Self(0);
    /// A cloud resource (other than an instance) does not exist.
    pub const NOT_FOUND: Self = Self(1);
    /// Upstream `cloudprovider.InstanceNotFound`: the instance does not exist.
    pub const INSTANCE_NOT_FOUND: Self = Self(2);
    /// Upstream `cloudprovider.NotImplemented`.
    pub const NOT_IMPLEMENTED: Self = Self(3);
    /// Upstream `cloudprovider.ImplementedElsewhere`: another controller manages this load balancer.
    pub const IMPLEMENTED_ELSEWHERE: Self = Self(4);
    /// Upstream `api.RetryError`: retry after exactly [`ProviderError::retry_after`].
    pub const RETRY_AFTER: Self = Self(5);
    /// The host cancelled the call (shutdown, or the caller went away).
    pub const CANCELLED: Self = Self(6);
    /// The call ran past its deadline.
    pub const DEADLINE_EXCEEDED: Self = Self(7);
    /// The provider panicked; the SDK caught the panic at the ABI boundary.
    pub const PANICKED: Self = Self(8);
    /// The cloud config handed to the provider factory is invalid.
    pub const INVALID_CONFIG: Self = Self(9);
    /// ABI 1.1: the cloud API refused the call for rate (HTTP 429, AWS `RequestLimitExceeded`),
    /// optionally with the delay it asked for ([`ProviderError::throttle_delay`]). The host
    /// pauses every call to the provider until then. A 1.0 host reads it as [`Self::OTHER`].
    pub const THROTTLED: Self = Self(10);
    /// ABI 1.1: the cloud rejected the provider's credentials or permissions (HTTP 401/403,
    /// AWS `UnauthorizedOperation`/`AuthFailure`). Never evidence that an instance is gone. A
    /// 1.0 host reads it as [`Self::OTHER`].
    pub const UNAUTHORIZED: Self = Self(11);

    /// Every kind this version knows, for listings and metrics labels.
    pub const ALL: [Self; 12] = [
        Self::OTHER,
        Self::NOT_FOUND,
        Self::INSTANCE_NOT_FOUND,
        Self::NOT_IMPLEMENTED,
        Self::IMPLEMENTED_ELSEWHERE,
        Self::RETRY_AFTER,
        Self::CANCELLED,
        Self::DEADLINE_EXCEEDED,
        Self::PANICKED,
        Self::INVALID_CONFIG,
        Self::THROTTLED,
        Self::UNAUTHORIZED,
    ];

    /// A stable snake_case name (used in logs and metric labels).
    pub fn name(self) -> &'static str {
        match self {
            Self::NOT_FOUND => "not_found",
            Self::INSTANCE_NOT_FOUND => "instance_not_found",
            Self::NOT_IMPLEMENTED => "not_implemented",
            Self::IMPLEMENTED_ELSEWHERE => "implemented_elsewhere",
            Self::RETRY_AFTER => "retry_after",
            Self::CANCELLED => "cancelled",
            Self::DEADLINE_EXCEEDED => "deadline_exceeded",
            Self::PANICKED => "panicked",
            Self::INVALID_CONFIG => "invalid_config",
            Self::THROTTLED => "throttled",
            Self::UNAUTHORIZED => "unauthorized",
            _ => "other",
        }
    }
}

impl fmt::Debug for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if Self::ALL.contains(self) {
            f.write_str(self.name())
        } else {
            write!(f, "unknown({})", self.0)
        }
    }
}

/// An error returned by a provider: a kind, a message, and for [`ErrorKind::RETRY_AFTER`] and
/// [`ErrorKind::THROTTLED`] a delay.
#[repr(C)]
#[derive(StableAbi, Clone, PartialEq, Eq)]
pub struct ProviderError {
    kind: ErrorKind,
    message: RString,
    retry_after_ms: u64,
}

impl ProviderError {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: RString::from(message.into()),
            retry_after_ms: 0,
        }
    }

    /// Any other failure.
    pub fn other(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::OTHER, message)
    }

    /// A non-instance cloud resource was not found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NOT_FOUND, message)
    }

    /// Upstream `InstanceNotFound` (message "instance not found").
    pub fn instance_not_found() -> Self {
        Self::new(ErrorKind::INSTANCE_NOT_FOUND, "instance not found")
    }

    /// Upstream `NotImplemented` (message "unimplemented").
    pub fn not_implemented() -> Self {
        Self::new(ErrorKind::NOT_IMPLEMENTED, "unimplemented")
    }

    /// Upstream `ImplementedElsewhere` (message "implemented by alternate to cloud provider").
    pub fn implemented_elsewhere() -> Self {
        Self::new(
            ErrorKind::IMPLEMENTED_ELSEWHERE,
            "implemented by alternate to cloud provider",
        )
    }

    /// Upstream `api.RetryError`: ask the controller to retry after exactly `after`.
    pub fn retry_after(after: Duration, message: impl Into<String>) -> Self {
        Self {
            kind: ErrorKind::RETRY_AFTER,
            message: RString::from(message.into()),
            retry_after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// ABI 1.1: the cloud API throttled the call; `retry_after` is the delay it asked for, if
    /// any (without one the host backs off exponentially).
    pub fn throttled(message: impl Into<String>, retry_after: Option<Duration>) -> Self {
        Self {
            kind: ErrorKind::THROTTLED,
            message: RString::from(message.into()),
            retry_after_ms: retry_after
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// ABI 1.1: the cloud rejected the provider's credentials or permissions.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::UNAUTHORIZED, message)
    }

    /// The call was cancelled by the host.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::CANCELLED, message)
    }

    /// The call ran past its deadline.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::DEADLINE_EXCEEDED, message)
    }

    /// The provider panicked.
    pub fn panicked(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PANICKED, message)
    }

    /// The cloud config is invalid.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::INVALID_CONFIG, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind.
    pub fn message(&self) -> &str {
        self.message.as_str()
    }

    /// The requested retry delay, for [`ErrorKind::RETRY_AFTER`] errors.
    pub fn retry_after_delay(&self) -> Option<Duration> {
        (self.kind == ErrorKind::RETRY_AFTER).then(|| Duration::from_millis(self.retry_after_ms))
    }

    /// For [`ErrorKind::THROTTLED`]: `Some(delay asked for)`, `Some(None)` without one; `None`
    /// for every other kind.
    pub fn throttle_delay(&self) -> Option<Option<Duration>> {
        (self.kind == ErrorKind::THROTTLED)
            .then(|| (self.retry_after_ms > 0).then(|| Duration::from_millis(self.retry_after_ms)))
    }

    /// True for upstream `InstanceNotFound` (and the generic `NotFound`).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::NOT_FOUND | ErrorKind::INSTANCE_NOT_FOUND
        )
    }

    /// Prefix the message with context, keeping the kind (like Go's `fmt.Errorf("...: %w", err)`).
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = RString::from(format!("{context}: {}", self.message));
        self
    }
}

impl fmt::Display for ProviderError {
    /// The message alone, as upstream's `Error()` returns it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message.as_str())
    }
}

impl fmt::Debug for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("ProviderError");
        d.field("kind", &self.kind)
            .field("message", &self.message.as_str());
        if let Some(after) = self.retry_after_delay() {
            d.field("retry_after", &after);
        }
        if let Some(Some(after)) = self.throttle_delay() {
            d.field("retry_after", &after);
        }
        d.finish()
    }
}

impl std::error::Error for ProviderError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_sentinel_messages_are_exact() {
        assert_eq!(
            ProviderError::instance_not_found().to_string(),
            "instance not found"
        );
        assert_eq!(
            ProviderError::not_implemented().to_string(),
            "unimplemented"
        );
        assert_eq!(
            ProviderError::implemented_elsewhere().to_string(),
            "implemented by alternate to cloud provider"
        );
    }

    #[test]
    fn retry_after_keeps_its_delay_and_context_keeps_kind() {
        let e = ProviderError::retry_after(Duration::from_secs(42), "still provisioning")
            .context("failed to ensure load balancer");
        assert_eq!(e.kind(), ErrorKind::RETRY_AFTER);
        assert_eq!(e.retry_after_delay(), Some(Duration::from_secs(42)));
        assert_eq!(
            e.to_string(),
            "failed to ensure load balancer: still provisioning"
        );
        assert_eq!(ProviderError::other("x").retry_after_delay(), None);
    }

    #[test]
    fn throttled_carries_an_optional_delay_apart_from_retry_after() {
        let e = ProviderError::throttled("Rate exceeded", Some(Duration::from_millis(1500)));
        assert_eq!(e.kind(), ErrorKind::THROTTLED);
        assert_eq!(e.throttle_delay(), Some(Some(Duration::from_millis(1500))));
        assert_eq!(e.retry_after_delay(), None, "not an upstream RetryError");
        assert_eq!(
            ProviderError::throttled("slow down", None).throttle_delay(),
            Some(None)
        );
        assert_eq!(ProviderError::other("x").throttle_delay(), None);
        assert_eq!(ErrorKind::UNAUTHORIZED.name(), "unauthorized");
    }

    #[test]
    fn unknown_kinds_are_reported_as_other() {
        assert_eq!(ErrorKind(77).name(), "other");
        assert_eq!(format!("{:?}", ErrorKind(77)), "unknown(77)");
        assert_eq!(format!("{:?}", ErrorKind::PANICKED), "panicked");
    }
}
