//! The `leaderElection` health check with upstream's rule: a replica that is not the leader is
//! healthy; the leader is unhealthy once it has not renewed its lease for the lease duration
//! plus 20 s (client-go's `HealthzAdaptor` timeout), so a kubelet liveness probe restarts a
//! leader whose renewals are stuck while it still believes it leads.
//!
//! kube-lease-manager renews the lease internally and does not report renewals, so while this
//! replica leads, [`LeaseHealth::track`] reads the Lease every retry period and records when it
//! last saw `renewTime` advance under our identity.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// client-go's leader-election healthz timeout, added to the lease duration.
pub const HEALTHZ_TIMEOUT: Duration = Duration::from_secs(20);

/// Shared state of the check. Cheap to clone.
#[derive(Clone)]
pub struct LeaseHealth {
    lease: String,
    tolerance: Duration,
    leading: Arc<AtomicBool>,
    /// When a renewal under our identity was last observed.
    renewed: Arc<Mutex<Option<Instant>>>,
}

impl LeaseHealth {
    /// A check for the lease `namespace/name` with `lease_duration`.
    pub fn new(namespace: &str, name: &str, lease_duration: Duration) -> Self {
        Self {
            lease: format!("{namespace}/{name}"),
            tolerance: lease_duration + HEALTHZ_TIMEOUT,
            leading: Arc::new(AtomicBool::new(false)),
            renewed: Arc::new(Mutex::new(None)),
        }
    }

    /// Record that this replica became the leader (its lease was just acquired).
    pub fn became_leader(&self) {
        self.record_renewal();
        self.leading.store(true, Ordering::Release);
    }

    /// Record that this replica no longer leads.
    pub fn stopped_leading(&self) {
        self.leading.store(false, Ordering::Release);
    }

    fn record_renewal(&self) {
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// The check: `Err` with upstream's message when the leader's renewals are overdue.
    pub fn check(&self) -> Result<(), String> {
        if !self.leading.load(Ordering::Acquire) {
            return Ok(());
        }
        let renewed = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        match renewed {
            Some(at) if at.elapsed() <= self.tolerance => Ok(()),
            Some(at) => Err(format!(
                "failed election to renew leadership on lease {} (last renewal seen {:.0?} ago, allowed {:?})",
                self.lease,
                at.elapsed(),
                self.tolerance
            )),
            None => Err(format!("no renewal of lease {} seen yet", self.lease)),
        }
    }

    /// While leading, read the Lease every `period` and record renewals by `identity`, until
    /// `stop` is cancelled. A failed read records nothing (so a leader cut off from the API
    /// server turns unhealthy, as upstream's does).
    pub async fn track(
        self,
        api: Api<Lease>,
        name: String,
        identity: String,
        period: Duration,
        stop: CancellationToken,
    ) {
        let mut last_seen: Option<String> = None;
        let mut tick = tokio::time::interval(period.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            match api.get_opt(&name).await {
                Ok(Some(lease)) => {
                    let spec = lease.spec.unwrap_or_default();
                    if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                        continue;
                    }
                    let renew = spec
                        .renew_time
                        .map(|t| format!("{:?}", t.0))
                        .or(lease.metadata.resource_version);
                    if renew.is_some() && renew != last_seen {
                        last_seen = renew;
                        self.record_renewal();
                    }
                }
                Ok(None) => tracing::debug!(lease = %self.lease, "lease not found"),
                Err(e) => tracing::debug!(lease = %self.lease, "cannot read the lease: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn leader_turns_unhealthy_after_lease_duration_plus_20s_without_renewal() {
        let h = LeaseHealth::new(
            "kube-system",
            "cloud-controller-manager",
            Duration::from_secs(15),
        );
        assert_eq!(h.check(), Ok(()), "a standby is healthy");
        h.became_leader();
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(h.check(), Ok(()));
        h.record_renewal();
        tokio::time::advance(Duration::from_secs(35)).await;
        assert_eq!(h.check(), Ok(()), "35 s = 15 s + 20 s is still fine");
        tokio::time::advance(Duration::from_secs(1)).await;
        let err = h.check().unwrap_err();
        assert!(
            err.starts_with(
                "failed election to renew leadership on lease kube-system/cloud-controller-manager"
            ),
            "{err}"
        );
        h.stopped_leading();
        assert_eq!(h.check(), Ok(()));
    }
}
