//! The host-wide pause after the cloud throttled a call (ABI 1.1 `ErrorKind::THROTTLED`).
//!
//! When any call returns `THROTTLED`, every later call to the same provider, from every
//! controller and for every method, waits until the pause ends before it is handed to the plugin
//! (and then takes its turn in the `--cloud-api-qps` budget as usual). The pause is:
//! - the delay the cloud asked for ([`ccm_provider_abi::ProviderError::throttle_delay`]), capped
//!   at [`MAX_PAUSE`];
//! - without a delay, an exponential back-off: [`INITIAL_BACKOFF`] doubling per throttled call
//!   up to [`MAX_PAUSE`], back to [`INITIAL_BACKOFF`] after the next successful call.
//!
//! One throttling episode doubles the back-off once: calls that were already on their way to
//! the plugin when a pause began (started in an earlier *epoch*) and come back throttled too
//! only extend the pause by a delay of their own, never double it; nor does their success reset
//! it. A pause is never shortened.
//!
//! The pause is not part of a call's deadline: the deadline (`--provider-call-timeout`) starts
//! when the plugin is called, after the pause and the budget, as it already did after the budget.
//! A caller that goes away (its future dropped: shutdown, leadership lost) stops waiting at once,
//! and the plugin is never called.

use std::sync::Mutex;
use std::time::Duration;

use ccm_provider_abi::{ErrorKind, ProviderError};
use tokio::time::Instant;

/// The first pause when the cloud throttles without saying for how long.
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(1);
/// The longest pause: the back-off stops doubling here, and a longer delay asked for by the
/// cloud is cut to it (the next call then finds out whether the cloud still throttles).
pub const MAX_PAUSE: Duration = Duration::from_secs(300);
/// The reason of the Warning event controllers publish on the object whose sync was throttled.
pub const THROTTLED_EVENT_REASON: &str = "CloudProviderThrottled";

/// The pause state of one provider. Shared by every handle of the provider.
#[derive(Debug)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Calls wait until this instant (none, or in the past: no pause).
    until: Option<Instant>,
    /// The pause of the next throttled call without a delay.
    backoff: Duration,
    /// Counts pauses begun; a call remembers the epoch it started in.
    epoch: u64,
}

/// What one throttled answer did to the pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Applied {
    /// How much later the pause now ends than before (zero when it was already long enough).
    pub(crate) added: Duration,
    /// Time from now to the end of the pause.
    pub(crate) remaining: Duration,
}

impl Default for Throttle {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                until: None,
                backoff: INITIAL_BACKOFF,
                epoch: 0,
            }),
        }
    }
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait until no pause is in effect; returns how long that took (zero when there was none).
    /// A pause extended while waiting is waited for too.
    pub(crate) async fn wait(&self) -> Duration {
        let started = Instant::now();
        loop {
            let until = self.lock().until;
            match until {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => return started.elapsed(),
            }
        }
    }

    /// The epoch a call starts in (take it right before the plugin is called).
    pub(crate) fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    /// The end of the current pause, if one is in effect.
    pub(crate) fn paused_until(&self) -> Option<Instant> {
        self.lock().until.filter(|u| *u > Instant::now())
    }

    /// A call started in `epoch` came back throttled, asking for `delay` (or not): begin or
    /// extend the pause.
    pub(crate) fn on_throttled(&self, epoch: u64, delay: Option<Duration>) -> Applied {
        let now = Instant::now();
        let mut s = self.lock();
        let current_end = s.until.filter(|u| *u > now);
        // A new signal, unless a pause begun after this call started is still on (then this
        // answer belongs to the same episode).
        let fresh = epoch == s.epoch || current_end.is_none();
        let pause = match delay.filter(|d| !d.is_zero()) {
            Some(d) => d.min(MAX_PAUSE),
            None if fresh => {
                let p = s.backoff;
                s.backoff = s.backoff.saturating_mul(2).min(MAX_PAUSE);
                p
            }
            None => Duration::ZERO,
        };
        if fresh {
            s.epoch += 1;
        }
        let from = current_end.unwrap_or(now);
        let end = from.max(now + pause);
        s.until = Some(end);
        Applied {
            added: end - from,
            remaining: end - now,
        }
    }

    /// A call started in `epoch` succeeded: the back-off starts again from
    /// [`INITIAL_BACKOFF`] (not for a call that started before the latest pause began).
    pub(crate) fn on_success(&self, epoch: u64) {
        let mut s = self.lock();
        if s.epoch == epoch {
            s.backoff = INITIAL_BACKOFF;
        }
    }
}

/// A provider call the cloud throttled, as controllers see it: the host's error text (it names
/// the method) and how long every call to the provider is paused. Controllers re-queue the item
/// after the pause without counting a failure, and publish a Warning event
/// ([`THROTTLED_EVENT_REASON`], message [`Throttled::event_message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    /// The error's text, e.g. `cloud provider throttled InstanceMetadata: Rate exceeded`.
    pub message: String,
    /// The pause left when the error was returned.
    pub pause: Duration,
}

impl Throttled {
    /// `Some` when `e` is a `THROTTLED` error (from [`crate::provider::Provider`] its delay is the
    /// pause in effect).
    pub fn of(e: &ProviderError) -> Option<Self> {
        (e.kind() == ErrorKind::THROTTLED).then(|| Self {
            message: e.to_string(),
            pause: e.throttle_delay().flatten().unwrap_or_default(),
        })
    }

    /// The Warning event's message: what was throttled and for how long calls are paused.
    pub fn event_message(&self) -> String {
        format!(
            "{}; every call to the cloud provider is paused for {}, then retried",
            self.message,
            crate::runtime::duration::format(self.pause)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn no_pause_means_no_wait() {
        let t = Throttle::default();
        assert_eq!(t.wait().await, Duration::ZERO);
        assert_eq!(t.paused_until(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_delay_is_honoured_and_capped() {
        let t = Throttle::default();
        let a = t.on_throttled(t.epoch(), Some(Duration::from_secs(2)));
        assert_eq!(a.added, Duration::from_secs(2));
        assert_eq!(a.remaining, Duration::from_secs(2));
        assert_eq!(t.wait().await, Duration::from_secs(2));
        let a = t.on_throttled(t.epoch(), Some(Duration::from_secs(3600)));
        assert_eq!(a.remaining, MAX_PAUSE, "an hour is cut to the cap");
        // A delay does not move the back-off: the next throttle without one pauses 1 s.
        tokio::time::advance(MAX_PAUSE).await;
        let a = t.on_throttled(t.epoch(), None);
        assert_eq!(a.remaining, INITIAL_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn back_off_doubles_to_the_cap_and_resets_after_a_success() {
        let t = Throttle::default();
        let mut pauses = Vec::new();
        for _ in 0..11 {
            let epoch = t.epoch();
            pauses.push(t.on_throttled(epoch, None).remaining.as_secs());
            t.wait().await;
        }
        assert_eq!(pauses, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        t.on_success(t.epoch());
        assert_eq!(t.on_throttled(t.epoch(), None).remaining, INITIAL_BACKOFF);
    }

    #[tokio::test(start_paused = true)]
    async fn one_episode_doubles_once() {
        let t = Throttle::default();
        // Three calls on their way to the plugin at once; all come back throttled.
        let epoch = t.epoch();
        assert_eq!(
            t.on_throttled(epoch, None).remaining,
            Duration::from_secs(1)
        );
        let late = t.on_throttled(epoch, None);
        assert_eq!(late.added, Duration::ZERO, "same episode: no extension");
        assert_eq!(late.remaining, Duration::from_secs(1));
        // ... unless it carries a longer delay of its own.
        let longer = t.on_throttled(epoch, Some(Duration::from_secs(3)));
        assert_eq!(longer.added, Duration::from_secs(2));
        // A success of a call from before the pause does not reset the back-off.
        t.on_success(epoch);
        t.wait().await;
        assert_eq!(
            t.on_throttled(t.epoch(), None).remaining,
            Duration::from_secs(2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_is_never_shortened_and_waiters_see_extensions() {
        let t = std::sync::Arc::new(Throttle::default());
        t.on_throttled(t.epoch(), Some(Duration::from_secs(10)));
        let a = t.on_throttled(t.epoch(), Some(Duration::from_secs(1)));
        assert_eq!(
            (a.added, a.remaining),
            (Duration::ZERO, Duration::from_secs(10))
        );
        let started = Instant::now();
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move {
                t.wait().await;
                Instant::now()
            })
        };
        // Let the waiter go to sleep until the first end (current-thread runtime).
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_secs(5)).await;
        t.on_throttled(t.epoch(), Some(Duration::from_secs(20)));
        assert_eq!(waiter.await.unwrap() - started, Duration::from_secs(25));
    }

    #[test]
    fn controllers_read_the_pause_from_the_error() {
        let e = ProviderError::throttled(
            "cloud provider throttled InstanceMetadata: Rate exceeded",
            Some(Duration::from_millis(2500)),
        );
        let t = Throttled::of(&e).unwrap();
        assert_eq!(t.pause, Duration::from_millis(2500));
        assert_eq!(
            t.event_message(),
            "cloud provider throttled InstanceMetadata: Rate exceeded; every call to the cloud \
             provider is paused for 2.5s, then retried"
        );
        assert_eq!(Throttled::of(&ProviderError::other("x")), None);
        let retry = ProviderError::retry_after(Duration::from_secs(1), "not throttling");
        assert_eq!(Throttled::of(&retry), None);
    }
}
