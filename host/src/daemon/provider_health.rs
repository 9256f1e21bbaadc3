//! The provider's health probe (ABI 1.1 `health`) as the `/readyz` check `cloud-provider`.
//!
//! The probe runs on every replica (standbys too: readiness says whether this replica could
//! do the work), right at start-up and then every `--provider-health-period` (default 30 s),
//! through the ordinary call path (deadline `--provider-call-timeout`, the cloud-call budget and
//! any throttling pause, counted as method `Health`). `/readyz` reads the last answer and never
//! calls the plugin itself, so a scraping load balancer or kubelet cannot turn into cloud calls.
//! A reloaded `--cloud-config` probes again at once ([`HealthProbe::probe_now`]).
//!
//! Until the first answer the check fails ("no answer yet"). A provider that answers
//! `NOT_IMPLEMENTED` (the SDK's default, and every 1.0 plugin, which is not probed at all)
//! has no check. A failing probe fails the check with the provider's message; the change is
//! logged once (WARN when it starts failing, INFO when it recovers).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_provider_abi::ErrorKind;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::http::Health;
use crate::provider::Provider;

/// The name of the `/readyz` check.
pub const CHECK: &str = "cloud-provider";

/// The last answer of the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    /// No answer yet.
    Pending,
    Healthy,
    Unhealthy(String),
}

/// A running probe. Cheap to clone.
#[derive(Clone)]
pub struct HealthProbe {
    wake: Arc<Notify>,
}

impl HealthProbe {
    /// Start probing `provider` every `period` (a 1.0 plugin is never probed: `None`) until
    /// `stop`; the answers become the check `name` of `health` ([`CHECK`], or
    /// `cloud-provider-<name>` when several providers run).
    pub fn start(
        provider: &Provider,
        name: &str,
        period: Duration,
        health: &Health,
        stop: &CancellationToken,
    ) -> Option<HealthProbe> {
        if provider.abi_generation() == "1.0" || period.is_zero() {
            return None;
        }
        let answer = Arc::new(Mutex::new(Answer::Pending));
        let check_name = name.to_string();
        let name = provider.registered_name().to_string();
        let check = {
            let answer = answer.clone();
            Arc::new(
                move || match &*answer.lock().unwrap_or_else(|p| p.into_inner()) {
                    Answer::Pending => Err(format!(
                        "cloud provider {name}: no answer from its health probe yet"
                    )),
                    Answer::Healthy => Ok(()),
                    Answer::Unhealthy(why) => Err(format!("cloud provider {name}: {why}")),
                },
            )
        };
        health.add_ready_check(&check_name, check.clone());
        let probe = HealthProbe {
            wake: Arc::new(Notify::new()),
        };
        let (provider, health, stop, wake) = (
            provider.clone(),
            health.clone(),
            stop.clone(),
            probe.wake.clone(),
        );
        tokio::spawn(async move {
            let mut offered = true;
            loop {
                let result = tokio::select! {
                    _ = stop.cancelled() => return,
                    r = provider.health() => r,
                };
                let next = match result {
                    Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => None,
                    Ok(()) => Some(Answer::Healthy),
                    Err(e) => Some(Answer::Unhealthy(e.to_string())),
                };
                match next {
                    None => {
                        if offered {
                            tracing::info!(
                                provider = provider.registered_name(),
                                "the cloud provider offers no health probe; /readyz has no {check_name} check"
                            );
                            health.remove_ready_check(&check_name);
                            offered = false;
                        }
                    }
                    Some(next) => {
                        if !offered {
                            health.add_ready_check(&check_name, check.clone());
                            offered = true;
                        }
                        let mut last = answer.lock().unwrap_or_else(|p| p.into_inner());
                        match (&*last, &next) {
                            (Answer::Unhealthy(_), Answer::Healthy) => tracing::info!(
                                provider = provider.registered_name(),
                                "cloud provider health probe passes again"
                            ),
                            (prev, Answer::Unhealthy(why)) if prev != &next => tracing::warn!(
                                provider = provider.registered_name(),
                                "cloud provider health probe failed: {why}; /readyz/{check_name} fails until it passes"
                            ),
                            _ => {}
                        }
                        *last = next;
                    }
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                    _ = wake.notified() => {}
                }
            }
        });
        Some(probe)
    }

    /// Probe again now (after a reload), not at the end of the period.
    pub fn probe_now(&self) {
        self.wake.notify_one();
    }
}
