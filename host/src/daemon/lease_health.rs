//! The `leaderElection` health check with upstream's rule: a replica that is not the leader is
//! healthy; the leader is unhealthy once it has not renewed its lease for the lease duration
//! plus 20 s (client-go's `HealthzAdaptor` timeout), so a kubelet liveness probe restarts a
//! leader whose renewals are stuck while it still believes it leads.
//!
//! kube-lease-manager renews the lease internally and does not report renewals, so while this
//! replica leads, [`LeaseHealth::track`] reads the Lease twice per retry period and records
//! when the last renewal under our identity happened (its `renewTime`).
//!
//! The same record gives upstream's renew deadline, which kube-lease-manager lacks: it keeps
//! retrying a failing renewal while still reporting leadership, so a leader whose renewals
//! failed or hung (API errors, latency) went on running its controllers after the lease had
//! expired and another replica had taken it: two leaders (found by the soak).
//! [`LeaseHealth::lost`] resolves once no renewal has been seen for the renew deadline, or the
//! Lease names another holder; the daemon then stops leading, as client-go's elector does.

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
    /// When the last renewal under our identity observed happened.
    renewed: Arc<Mutex<Option<Instant>>>,
    /// Another holder observed in the Lease while this replica leads.
    taken_by: Arc<Mutex<Option<String>>>,
}

impl LeaseHealth {
    /// A check for the lease `namespace/name` with `lease_duration`.
    pub fn new(namespace: &str, name: &str, lease_duration: Duration) -> Self {
        Self {
            lease: format!("{namespace}/{name}"),
            tolerance: lease_duration + HEALTHZ_TIMEOUT,
            leading: Arc::new(AtomicBool::new(false)),
            renewed: Arc::new(Mutex::new(None)),
            taken_by: Arc::new(Mutex::new(None)),
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
        self.record_renewal_aged(Duration::ZERO);
    }

    /// Record a renewal that happened `age` ago.
    fn record_renewal_aged(&self, age: Duration) {
        let now = Instant::now();
        let at = now.checked_sub(age).unwrap_or(now);
        *self.renewed.lock().unwrap_or_else(|p| p.into_inner()) = Some(at);
    }

    fn record_holder(&self, holder: &str) {
        *self.taken_by.lock().unwrap_or_else(|p| p.into_inner()) = Some(holder.to_string());
    }

    /// Why this replica must stop leading, if it must: no renewal seen for `renew_deadline`,
    /// or the Lease names another holder.
    pub fn lost_reason(&self, renew_deadline: Duration) -> Option<String> {
        if !self.leading.load(Ordering::Acquire) {
            return None;
        }
        if let Some(holder) = self
            .taken_by
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Some(format!("the lease {} is held by {holder}", self.lease));
        }
        let renewed = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        match renewed {
            Some(at) if at.elapsed() <= renew_deadline => None,
            Some(at) => Some(format!(
                "no renewal of the lease {} for {:.1?} (renew deadline {renew_deadline:?})",
                self.lease,
                at.elapsed()
            )),
            None => Some(format!("no renewal of the lease {} seen", self.lease)),
        }
    }

    /// Resolves with the reason once this replica, leading, must stop ([`Self::lost_reason`]);
    /// checked every 100 ms.
    pub async fn lost(&self, renew_deadline: Duration) -> String {
        loop {
            if let Some(reason) = self.lost_reason(renew_deadline) {
                return reason;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

    /// While leading, read the Lease every `period` and record renewals by `identity` (and any
    /// other holder), until `stop` is cancelled. A failed read records nothing (so a leader cut
    /// off from the API server turns unhealthy and loses the lease, as upstream's does).
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
                    match spec.holder_identity.as_deref() {
                        Some(holder) if holder == identity => {}
                        Some(holder) if !holder.is_empty() => {
                            self.record_holder(holder);
                            continue;
                        }
                        _ => continue,
                    }
                    // The age of the renewal by its renewTime (written with this host's
                    // clock by our own lease manager), so the deadline does not also count
                    // how late this read came.
                    let age = spec.renew_time.as_ref().map(|t| {
                        let written = u64::try_from(t.0.as_millisecond()).unwrap_or(0);
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
                            .unwrap_or(0);
                        Duration::from_millis(now.saturating_sub(written))
                    });
                    let renew = spec
                        .renew_time
                        .map(|t| format!("{:?}", t.0))
                        .or(lease.metadata.resource_version);
                    if renew.is_some() && renew != last_seen {
                        last_seen = renew;
                        self.record_renewal_aged(age.unwrap_or(Duration::ZERO));
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

    #[tokio::test(start_paused = true)]
    async fn the_leader_is_lost_after_the_renew_deadline_or_when_another_holds_the_lease() {
        let deadline = Duration::from_secs(10);
        let h = LeaseHealth::new("kube-system", "ccm", Duration::from_secs(15));
        assert_eq!(
            h.lost_reason(deadline),
            None,
            "a standby has nothing to lose"
        );
        h.became_leader();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(h.lost_reason(deadline), None, "10 s is within the deadline");
        // A renewal observed late counts from when it happened.
        h.record_renewal_aged(Duration::from_secs(4));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(h.lost_reason(deadline), None);
        tokio::time::advance(Duration::from_millis(500)).await;
        let reason = h.lost_reason(deadline).expect("deadline passed");
        assert!(
            reason.starts_with("no renewal of the lease kube-system/ccm for 10.5s"),
            "{reason}"
        );
        let lost = tokio::time::timeout(Duration::from_secs(1), h.lost(deadline)).await;
        assert_eq!(lost.ok().as_deref(), Some(reason.as_str()));

        h.record_renewal();
        assert_eq!(h.lost_reason(deadline), None);
        h.record_holder("other-replica");
        assert_eq!(
            h.lost_reason(deadline).as_deref(),
            Some("the lease kube-system/ccm is held by other-replica")
        );
        h.stopped_leading();
        assert_eq!(h.lost_reason(deadline), None);
    }
}
