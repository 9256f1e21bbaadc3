//! A token bucket shared fairly between named callers.
//!
//! Used twice: as the host-wide budget of cloud calls (`--cloud-api-qps`/`--cloud-api-burst`,
//! one caller per controller) and as the client-side limit of Kubernetes API requests
//! (`--kube-api-qps`/`--kube-api-burst`, upstream's client-go limiter).
//!
//! Tokens refill continuously at `qps` up to `burst`. A caller takes a token at once when one is
//! there and nobody is queued; otherwise it queues under its caller name, and a dispatcher task
//! hands out tokens round-robin between the names that have waiters, so a controller with a
//! thousand queued calls cannot starve another with one. A waiter that gives up (its future is
//! dropped) costs no token.
//!
//! Hand-written rather than `governor`: governor has no fair queueing between callers (its
//! waiters race for the next token), which is the property the budget exists for, and the whole
//! limiter is smaller than governor's dependency tree.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// A fair token bucket. Cheap to clone; clones share the bucket.
#[derive(Clone)]
pub struct FairLimiter {
    shared: Arc<Shared>,
}

struct Shared {
    qps: f64,
    burst: f64,
    state: Mutex<State>,
}

struct State {
    tokens: f64,
    refilled_at: Instant,
    /// Waiters per caller, in the order callers first queued.
    queues: Vec<(Arc<str>, VecDeque<oneshot::Sender<()>>)>,
    /// Round-robin position in `queues`.
    next: usize,
    dispatcher_running: bool,
}

impl State {
    fn refill(&mut self, qps: f64, burst: f64) {
        let now = Instant::now();
        let elapsed = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.tokens = (self.tokens + elapsed * qps).min(burst);
        self.refilled_at = now;
    }

    fn has_waiters(&self) -> bool {
        self.queues.iter().any(|(_, q)| !q.is_empty())
    }

    /// The next waiter, round-robin over callers.
    fn pop_next(&mut self) -> Option<oneshot::Sender<()>> {
        let n = self.queues.len();
        for i in 0..n {
            let idx = (self.next + i) % n;
            if let Some(waiter) = self.queues[idx].1.pop_front() {
                self.next = (idx + 1) % n;
                return Some(waiter);
            }
        }
        None
    }
}

impl std::fmt::Debug for FairLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairLimiter")
            .field("qps", &self.shared.qps)
            .field("burst", &self.shared.burst)
            .finish()
    }
}

impl FairLimiter {
    /// A bucket refilling at `qps` tokens per second, holding at most `burst` (at least 1);
    /// it starts full.
    ///
    /// # Panics
    /// When `qps` is not a positive finite number (flags are validated before this).
    pub fn new(qps: f64, burst: u32) -> Self {
        assert!(qps.is_finite() && qps > 0.0, "qps must be positive");
        let burst = f64::from(burst.max(1));
        Self {
            shared: Arc::new(Shared {
                qps,
                burst,
                state: Mutex::new(State {
                    tokens: burst,
                    refilled_at: Instant::now(),
                    queues: Vec::new(),
                    next: 0,
                    dispatcher_running: false,
                }),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Take one token for `caller`, waiting for it fairly; returns how long it waited.
    /// Must be called inside a tokio runtime.
    pub async fn acquire(&self, caller: &str) -> Duration {
        let started = Instant::now();
        let rx = {
            let mut state = self.lock();
            state.refill(self.shared.qps, self.shared.burst);
            if !state.has_waiters() && state.tokens >= 1.0 {
                state.tokens -= 1.0;
                return Duration::ZERO;
            }
            let (tx, rx) = oneshot::channel();
            match state.queues.iter_mut().find(|(name, _)| &**name == caller) {
                Some((_, queue)) => queue.push_back(tx),
                None => state.queues.push((Arc::from(caller), VecDeque::from([tx]))),
            }
            if !state.dispatcher_running {
                state.dispatcher_running = true;
                let this = self.clone();
                tokio::spawn(async move { this.dispatch().await });
            }
            rx
        };
        // A closed channel means the dispatcher is gone (runtime shutting down): go ahead.
        let _ = rx.await;
        started.elapsed()
    }

    /// Hand out tokens to waiters until none are left.
    async fn dispatch(self) {
        loop {
            let wait = {
                let mut state = self.lock();
                state.refill(self.shared.qps, self.shared.burst);
                while state.tokens >= 1.0 {
                    match state.pop_next() {
                        // A waiter that gave up takes no token.
                        Some(waiter) => {
                            if waiter.send(()).is_ok() {
                                state.tokens -= 1.0;
                            }
                        }
                        None => break,
                    }
                }
                if !state.has_waiters() {
                    state.queues.retain(|(_, q)| !q.is_empty());
                    state.next = 0;
                    state.dispatcher_running = false;
                    return;
                }
                Duration::from_secs_f64(((1.0 - state.tokens) / self.shared.qps).max(0.0))
            };
            tokio::time::sleep(wait.max(Duration::from_micros(100))).await;
        }
    }
}

/// A [`tower::Layer`] that takes one token from a [`FairLimiter`] before every request: the
/// client-side `--kube-api-qps`/`--kube-api-burst` limit of the Kubernetes client.
#[derive(Clone, Debug)]
pub struct RateLimitLayer {
    limiter: FairLimiter,
    caller: &'static str,
}

impl RateLimitLayer {
    /// Limit requests through `limiter`, queued under `caller`.
    pub fn new(limiter: FairLimiter, caller: &'static str) -> Self {
        Self { limiter, caller }
    }
}

impl<S> tower::Layer<S> for RateLimitLayer {
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimited {
            inner,
            limiter: self.limiter.clone(),
            caller: self.caller,
            permit: false,
            pending: None,
        }
    }
}

type PendingToken = std::pin::Pin<Box<dyn std::future::Future<Output = Duration> + Send>>;

/// The service of [`RateLimitLayer`]: not ready until it holds a token.
pub struct RateLimited<S> {
    inner: S,
    limiter: FairLimiter,
    caller: &'static str,
    permit: bool,
    pending: Option<PendingToken>,
}

impl<S, Req> tower::Service<Req> for RateLimited<S>
where
    S: tower::Service<Req>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        if !self.permit {
            let pending = self.pending.get_or_insert_with(|| {
                let limiter = self.limiter.clone();
                let caller = self.caller;
                Box::pin(async move { limiter.acquire(caller).await })
            });
            std::task::ready!(pending.as_mut().poll(cx));
            self.pending = None;
            self.permit = true;
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.permit = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_is_free_then_the_rate_applies() {
        let limiter = FairLimiter::new(10.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            assert_eq!(limiter.acquire("a").await, Duration::ZERO);
        }
        for _ in 0..10 {
            limiter.acquire("a").await;
        }
        // 10 tokens beyond the burst at 10/s: one virtual second (paused clock, exact).
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(990) && elapsed <= Duration::from_millis(1100),
            "{elapsed:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn callers_share_the_bucket_round_robin() {
        let limiter = FairLimiter::new(100.0, 1);
        limiter.acquire("warm-up").await; // empty the bucket
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // A flood of 50 from one caller queued first, then 5 from another.
        for (caller, count) in [("flood", 50), ("small", 5)] {
            for _ in 0..count {
                let (limiter, order) = (limiter.clone(), order.clone());
                tasks.push(tokio::spawn(async move {
                    limiter.acquire(caller).await;
                    order.lock().unwrap().push(caller);
                }));
                tokio::task::yield_now().await;
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 55);
        let last_small = order.iter().rposition(|c| *c == "small").unwrap();
        // Round-robin: the 5 small calls are served within the first 10 grants, not after 50.
        assert!(
            last_small < 10,
            "small caller starved: last served at {last_small}: {order:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_waiter_costs_no_token() {
        let limiter = FairLimiter::new(1.0, 1);
        limiter.acquire("a").await;
        // Gives up before its token comes.
        let abandoned =
            tokio::time::timeout(Duration::from_millis(100), limiter.acquire("a")).await;
        assert!(abandoned.is_err());
        let start = Instant::now();
        limiter.acquire("b").await;
        // The next token (1 s after the first) goes to b, not to the abandoned waiter.
        assert!(
            start.elapsed() <= Duration::from_millis(950),
            "{:?}",
            start.elapsed()
        );
        // And the one after that is a full period later.
        let start = Instant::now();
        limiter.acquire("b").await;
        assert!(
            start.elapsed() >= Duration::from_millis(990),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_layer_limits_requests() {
        use tower::{Service, ServiceExt};
        let limiter = FairLimiter::new(5.0, 2);
        let mut svc = tower::Layer::layer(
            &RateLimitLayer::new(limiter, "kube-api"),
            tower::service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x * 2) }),
        );
        let start = Instant::now();
        for i in 0..7 {
            let out = svc.ready().await.unwrap().call(i).await.unwrap();
            assert_eq!(out, i * 2);
        }
        // 2 free, 5 more at 5/s: one virtual second.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(990) && elapsed <= Duration::from_millis(1100),
            "{elapsed:?}"
        );
    }
}
