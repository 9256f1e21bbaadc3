//! Fault injection: errors (optionally only the next N calls), latency, panics, hangs and pause
//! gates. Every wait polls the call's context so that a cancelled call ends within a few ms.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ccm_provider_abi::{CallContext, ProviderError};

use crate::config::{ErrorSpec, FakeConfig, ALL_METHODS};

/// How often a blocked call looks at its context (and at a pause gate file).
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// The fault settings of one configuration, indexed for cheap per-call lookups.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    errors: HashMap<String, ErrorSpec>,
    latency: HashMap<String, Duration>,
    panics: HashSet<String>,
    hang: HashSet<String>,
    stuck: HashSet<String>,
    pause: HashMap<String, PathBuf>,
    /// False when no fault of any kind is configured (the common, fast case).
    any: bool,
}

impl Faults {
    pub(crate) fn from_config(c: &FakeConfig) -> Self {
        let f = Self {
            errors: c.errors.clone().into_iter().collect(),
            latency: c.latency.iter().map(|(k, v)| (k.clone(), v.0)).collect(),
            panics: c.panics.iter().cloned().collect(),
            hang: c.hang.iter().cloned().collect(),
            stuck: c.stuck.iter().cloned().collect(),
            pause: c.pause.clone().into_iter().collect(),
            any: false,
        };
        let any = !(f.errors.is_empty()
            && f.latency.is_empty()
            && f.panics.is_empty()
            && f.hang.is_empty()
            && f.stuck.is_empty()
            && f.pause.is_empty());
        Self { any, ..f }
    }

    fn lookup<'a, T>(map: &'a HashMap<String, T>, method: &str) -> Option<(&'a str, &'a T)> {
        map.get_key_value(method)
            .or_else(|| map.get_key_value(ALL_METHODS))
            .map(|(k, v)| (k.as_str(), v))
    }

    fn listed(set: &HashSet<String>, method: &str) -> bool {
        set.contains(method) || set.contains(ALL_METHODS)
    }

    /// Whether `method` is listed in `stuck` (blocks ignoring its cancellation; the cloud
    /// polls the live settings to release it).
    pub(crate) fn stuck(&self, method: &str) -> bool {
        self.any && Self::listed(&self.stuck, method)
    }

    /// Run the faults configured for `method`, in order: pause gate, latency, hang, panic, error.
    /// `on_cancel` is called once when a wait observes that the call is over.
    pub(crate) fn apply(
        &self,
        method: &str,
        ctx: &CallContext,
        counters: &Counters,
        on_cancel: &dyn Fn(),
    ) -> Result<(), ProviderError> {
        if !self.any {
            return Ok(());
        }
        if let Some((_, gate)) = Self::lookup(&self.pause, method) {
            wait_until(ctx, on_cancel, None, || !gate.exists())?;
        }
        if let Some((_, delay)) = Self::lookup(&self.latency, method) {
            counters.delayed.fetch_add(1, Ordering::SeqCst);
            let slept = sleep(ctx, *delay, on_cancel);
            counters.delayed.fetch_sub(1, Ordering::SeqCst);
            slept?;
        }
        if Self::listed(&self.hang, method) {
            wait_until(ctx, on_cancel, None, || false)?;
        }
        if Self::listed(&self.panics, method) {
            panic!("fake cloud: injected panic in {method}");
        }
        if let Some((key, spec)) = Self::lookup(&self.errors, method) {
            if counters.consume(key, spec) {
                return Err(spec.to_error(method));
            }
        }
        Ok(())
    }
}

/// Check a per-instance error map (keys are method names or `"*"`) for a call that stands for
/// `methods` (one method; a bulk lookup stands for `InstancesBatch` and the per-node methods it
/// covers): the entry of the first of `methods` that has one, else `"*"`.
pub(crate) fn instance_error_any(
    errors: &BTreeMap<String, ErrorSpec>,
    instance: &str,
    methods: &[&str],
    counters: &Counters,
) -> Result<(), ProviderError> {
    if errors.is_empty() {
        return Ok(());
    }
    let found = methods
        .iter()
        .find_map(|m| errors.get_key_value(*m))
        .or_else(|| errors.get_key_value(ALL_METHODS));
    if let Some((key, spec)) = found {
        if counters.consume(&format!("instance/{instance}/{key}"), spec) {
            let method = if key == ALL_METHODS {
                methods.first().copied().unwrap_or(ALL_METHODS)
            } else {
                key.as_str()
            };
            return Err(spec.to_error(method));
        }
    }
    Ok(())
}

/// The answer of the health probe: the configured `health` error (its `times` budget counted
/// like an injected error's), else healthy.
pub(crate) fn health(spec: Option<&ErrorSpec>, counters: &Counters) -> Result<(), ProviderError> {
    match spec {
        Some(spec) if counters.consume("health", spec) => Err(spec.to_error("Health")),
        _ => Ok(()),
    }
}

/// What is left of each `times: N` budget. Reset whenever the settings are replaced.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Calls left to fail, by error key.
    left: Mutex<HashMap<String, u32>>,
    /// Calls in their `latency` wait right now (the `delayed` field of the call log).
    delayed: AtomicUsize,
}

impl Counters {
    /// True when the call should fail (and uses up one of `spec.times` if set).
    fn consume(&self, key: &str, spec: &ErrorSpec) -> bool {
        let Some(times) = spec.times else {
            return true;
        };
        let mut left = self.left.lock().unwrap_or_else(PoisonError::into_inner);
        let n = left.entry(key.to_string()).or_insert(times);
        if *n == 0 {
            false
        } else {
            *n -= 1;
            true
        }
    }

    pub(crate) fn reset(&self) {
        self.left
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Calls in their `latency` wait right now.
    pub(crate) fn delayed(&self) -> u64 {
        self.delayed.load(Ordering::SeqCst) as u64
    }
}

/// Sleep `total`, looking at the context every [`POLL`].
pub(crate) fn sleep(
    ctx: &CallContext,
    total: Duration,
    on_cancel: &dyn Fn(),
) -> Result<(), ProviderError> {
    let end = Instant::now() + total;
    wait_until(ctx, on_cancel, Some(end), || Instant::now() >= end)
}

/// Block until `done()` (checked every [`POLL`]) or until `until`, whichever comes first. Returns
/// the context's error as soon as the call is cancelled or past its deadline.
pub(crate) fn wait_until(
    ctx: &CallContext,
    on_cancel: &dyn Fn(),
    until: Option<Instant>,
    mut done: impl FnMut() -> bool,
) -> Result<(), ProviderError> {
    loop {
        if let Err(e) = ctx.check() {
            on_cancel();
            return Err(e);
        }
        if done() {
            return Ok(());
        }
        let mut step = POLL;
        if let Some(until) = until {
            step = step.min(until.saturating_duration_since(Instant::now()));
        }
        if let Some(left) = ctx.remaining() {
            // Wake right at the deadline (plus a hair so `check` sees it as passed).
            step = step.min(left + Duration::from_micros(100));
        }
        std::thread::sleep(step);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InjectedKind;
    use std::cell::Cell;

    #[test]
    fn times_budget_runs_out() {
        let c = Counters::default();
        let spec = ErrorSpec::new(InjectedKind::Other).times(2);
        assert!(c.consume("m", &spec));
        assert!(c.consume("m", &spec));
        assert!(!c.consume("m", &spec));
        c.reset();
        assert!(c.consume("m", &spec));
        assert!(c.consume("x", &ErrorSpec::new(InjectedKind::Other)));
    }

    #[test]
    fn sleep_ends_at_the_deadline() {
        let ctx = CallContext::new(Some(Duration::from_millis(20)));
        let seen = Cell::new(0);
        let start = Instant::now();
        let err = sleep(&ctx, Duration::from_secs(5), &|| seen.set(seen.get() + 1)).unwrap_err();
        assert_eq!(err.kind(), ccm_provider_abi::ErrorKind::DEADLINE_EXCEEDED);
        assert!(start.elapsed() < Duration::from_secs(1));
        assert_eq!(seen.get(), 1);
    }
}
