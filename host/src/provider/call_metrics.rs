//! Metrics of the provider call layer (beyond upstream, which has none for the plugin boundary):
//! every call counted by method and caller, errors by kind, latency, in-flight calls, timeouts,
//! panics, coalesced reads, time spent waiting for the cloud-call budget, and throttling (calls
//! the cloud throttled, the pause they caused and the time calls waited for it).

use prometheus_client::encoding::EncodeLabelSet;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `{method}`: the upstream method name (`InstanceMetadata`, `EnsureLoadBalancer`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    /// Upstream method name.
    pub method: &'static str,
}

/// `{method, caller}`: caller is the controller that made the call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// Upstream method name.
    pub method: &'static str,
    /// Canonical controller name, or `host` for calls outside controllers.
    pub caller: &'static str,
}

/// `{method, kind}`: kind is the stable error-kind name (`not_found`, `retry_after`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Upstream method name.
    pub method: &'static str,
    /// `ErrorKind::name()`.
    pub kind: &'static str,
}

/// `{caller}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallerLabels {
    /// Canonical controller name, or `host`.
    pub caller: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// The provider call metrics. Clones share the same series.
#[derive(Clone)]
pub struct CallMetrics {
    /// `ccm_provider_calls_total{method,caller}`: calls made to the plugin.
    pub calls: Family<CallLabels, Counter>,
    /// `ccm_provider_call_errors_total{method,kind}`.
    pub errors: Family<ErrorLabels, Counter>,
    /// `ccm_provider_call_duration_seconds{method}`: time inside the plugin (budget wait excluded).
    pub duration: Family<MethodLabels, Histogram, fn() -> Histogram>,
    /// `ccm_provider_calls_in_flight{method}`.
    pub in_flight: Family<MethodLabels, Gauge>,
    /// `ccm_provider_call_timeouts_total{method}`: calls that hit the call deadline (abandoned
    /// by the host, or given up by the plugin when it saw the deadline pass).
    pub timeouts: Family<MethodLabels, Counter>,
    /// `ccm_provider_call_panics_total{method}`: calls that panicked inside the plugin.
    pub panics: Family<MethodLabels, Counter>,
    /// `ccm_provider_calls_coalesced_total{method}`: reads answered by an identical call in flight.
    pub coalesced: Family<MethodLabels, Counter>,
    /// `ccm_provider_budget_wait_seconds{caller}`: time spent waiting for the cloud-call budget.
    pub budget_wait: Family<CallerLabels, Histogram, fn() -> Histogram>,
    /// `ccm_provider_throttled_total{method}`: calls the cloud throttled (ABI 1.1 `THROTTLED`).
    pub throttled: Family<MethodLabels, Counter>,
    /// `ccm_provider_throttle_pause_seconds_total`: how long calls to the provider were paused
    /// because of throttling (each throttled call adds what it extended the pause by).
    pub throttle_pause: Counter<f64, AtomicU64>,
    /// `ccm_provider_throttle_wait_seconds{caller}`: time calls waited for a throttling pause
    /// (observed only for calls that waited).
    pub throttle_wait: Family<CallerLabels, Histogram, fn() -> Histogram>,
    /// Bulk instance lookups and the instance cache ([`super::bulk`]).
    pub bulk: super::bulk::BulkMetrics,
    /// The provider's call threads ([`super::pool`]).
    pub pool: super::pool::PoolMetrics,
}

impl Default for CallMetrics {
    fn default() -> Self {
        Self {
            calls: Family::default(),
            errors: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            in_flight: Family::default(),
            timeouts: Family::default(),
            panics: Family::default(),
            coalesced: Family::default(),
            budget_wait: Family::new_with_constructor(latency_histogram),
            throttled: Family::default(),
            throttle_pause: Counter::default(),
            throttle_wait: Family::new_with_constructor(latency_histogram),
            bulk: super::bulk::BulkMetrics::default(),
            pool: super::pool::PoolMetrics::default(),
        }
    }
}

impl std::fmt::Debug for CallMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallMetrics")
    }
}

impl CallMetrics {
    /// Register every series in `registry` (prometheus-client adds `_total` to counters).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ccm_provider_calls",
            "Calls made to the cloud provider plugin, by method and calling controller",
            self.calls.clone(),
        );
        registry.register(
            "ccm_provider_call_errors",
            "Provider calls that returned an error, by method and error kind",
            self.errors.clone(),
        );
        registry.register(
            "ccm_provider_call_duration_seconds",
            "Time spent inside the provider plugin per call",
            self.duration.clone(),
        );
        registry.register(
            "ccm_provider_calls_in_flight",
            "Provider calls currently running",
            self.in_flight.clone(),
        );
        registry.register(
            "ccm_provider_call_timeouts",
            "Provider calls that hit the call deadline (abandoned and cancelled by the host, or given up by the plugin)",
            self.timeouts.clone(),
        );
        registry.register(
            "ccm_provider_call_panics",
            "Provider calls that panicked inside the plugin",
            self.panics.clone(),
        );
        registry.register(
            "ccm_provider_calls_coalesced",
            "Read calls answered by an identical call already in flight",
            self.coalesced.clone(),
        );
        registry.register(
            "ccm_provider_budget_wait_seconds",
            "Time calls waited for the host-wide cloud-call budget (--cloud-api-qps)",
            self.budget_wait.clone(),
        );
        registry.register(
            "ccm_provider_throttled",
            "Provider calls the cloud throttled (ABI 1.1 THROTTLED), by method",
            self.throttled.clone(),
        );
        registry.register(
            "ccm_provider_throttle_pause_seconds",
            "Seconds every call to the provider was paused because the cloud throttled a call",
            self.throttle_pause.clone(),
        );
        registry.register(
            "ccm_provider_throttle_wait_seconds",
            "Time calls waited for a throttling pause to end, by calling controller",
            self.throttle_wait.clone(),
        );
        self.bulk.register(registry);
        registry.register(
            "ccm_provider_calls_hung",
            "Provider call threads still running a call whose caller gave up (deadline passed); at the cap the provider's calls are refused",
            self.pool.hung.clone(),
        );
        registry.register(
            "ccm_provider_calls_refused",
            "Provider calls failed at once because too many earlier calls hung in the plugin",
            self.pool.refused.clone(),
        );
        registry.register(
            "ccm_provider_call_threads",
            "Threads of the provider's call pool (workers and hung)",
            self.pool.threads.clone(),
        );
    }
}

/// Decrements an in-flight gauge when dropped (also when the call's future is dropped).
pub(crate) struct InFlight(pub(crate) Gauge);

impl InFlight {
    pub(crate) fn start(gauge: Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
