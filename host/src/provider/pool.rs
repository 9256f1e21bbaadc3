//! The threads provider calls run on: one bounded pool per provider, which the host accounts
//! for.
//!
//! A plugin call blocks its thread until the plugin returns; the host can stop waiting at the
//! deadline but cannot take the thread back. On tokio's shared blocking pool every call that
//! ignored its cancellation kept a thread forever, and after 512 of them no provider call ran
//! again, for any controller, while `/healthz` said 200. Here:
//!
//! - calls run on at most [`MAX_WORKERS`] threads of the provider's own pool, started on demand
//!   (a call waits in the pool's queue when all are busy; its deadline still covers the wait);
//! - a thread that had no work for [`IDLE_TIMEOUT`] ends, as tokio's blocking threads do (a
//!   burst of the address loop's lookups starts a few dozen threads; they no longer stay for
//!   the life of the process);
//! - a call abandoned while its thread runs it (deadline passed, or the caller went away) makes
//!   that thread *hung*: it no longer counts as a worker, so a new one can start, and it ends as
//!   soon as the plugin returns;
//! - at [`HUNG_CAP`] hung threads the provider is unhealthy: new calls fail at once with a
//!   clear error instead of queueing forever, one ERROR line says so, `/readyz` fails (the
//!   daemon's `provider-calls` check, [`CallPool::health`]), and the
//!   `ccm_provider_calls_hung` gauge shows it. When hung calls return, it recovers.
//!
//! So at most `MAX_WORKERS + HUNG_CAP` threads exist per provider, whatever the plugin does,
//! and a hung provider cannot take threads from another one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;

/// Threads that run calls (the controllers' default concurrency fits well below it).
pub const MAX_WORKERS: usize = 256;
/// Hung threads a provider may have before its calls are refused.
pub const HUNG_CAP: usize = 64;
/// How long a thread waits for work before it ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Hung threads of every pool in the process (reported when the host exits).
static STUCK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Provider calls of every provider still running in plugin threads whose callers gave up.
pub fn stuck_calls() -> usize {
    STUCK.load(Ordering::Acquire)
}

/// A job's life: queued, running, done; `ABANDONED` once its caller stopped waiting.
const QUEUED: u8 = 0;
const RUNNING: u8 = 1;
const DONE: u8 = 2;
const ABANDONED: u8 = 3;

struct Job {
    state: Arc<AtomicU8>,
    /// Runs the call, marks it done (unless it was abandoned meanwhile) and only then sends
    /// the answer, so a caller that got its answer never finds the call still running.
    /// Returns whether the call was still wanted.
    run: Box<dyn FnOnce(&AtomicU8) -> bool + Send>,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Worker threads alive and not hung (busy or idle).
    workers: usize,
    /// Workers waiting for a job.
    idle: usize,
    /// Threads still running a call whose caller gave up.
    hung: usize,
    /// The unhealthy state was logged (cleared when it recovers).
    reported: bool,
}

/// Metrics of a pool (registered with the call metrics).
#[derive(Clone, Default)]
pub struct PoolMetrics {
    /// `ccm_provider_calls_hung`: threads running calls whose callers gave up.
    pub hung: Gauge,
    /// `ccm_provider_calls_refused_total`: calls failed at once because of hung calls.
    pub refused: Counter,
    /// `ccm_provider_call_threads`: threads of the pool (workers and hung).
    pub threads: Gauge,
}

struct Shared {
    provider: String,
    max_workers: usize,
    hung_cap: usize,
    idle_timeout: Duration,
    state: Mutex<State>,
    work: Condvar,
    metrics: PoolMetrics,
}

/// One provider's call threads. Cheap to clone.
#[derive(Clone)]
pub struct CallPool {
    shared: Arc<Shared>,
}

/// A call handed to the pool; awaiting it gives the call's result (`Err` when its thread
/// ended without one: a panic in the host's own closure). Dropping it before the answer
/// abandons the call (a running call's thread becomes hung).
pub struct PoolCall<T> {
    state: Arc<AtomicU8>,
    pool: CallPool,
    answer: oneshot::Receiver<T>,
}

impl<T> std::future::Future for PoolCall<T> {
    type Output = Result<T, oneshot::error::RecvError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.answer).poll(cx)
    }
}

impl<T> Drop for PoolCall<T> {
    fn drop(&mut self) {
        self.pool.abandon(&self.state);
    }
}

impl CallPool {
    /// The pool of `provider` with the default limits.
    pub fn new(provider: &str, metrics: PoolMetrics) -> Self {
        Self::with_limits(provider, MAX_WORKERS, HUNG_CAP, metrics)
    }

    /// A pool with other limits (tests).
    pub fn with_limits(
        provider: &str,
        max_workers: usize,
        hung_cap: usize,
        metrics: PoolMetrics,
    ) -> Self {
        Self::with_idle_timeout(provider, max_workers, hung_cap, IDLE_TIMEOUT, metrics)
    }

    fn with_idle_timeout(
        provider: &str,
        max_workers: usize,
        hung_cap: usize,
        idle_timeout: Duration,
        metrics: PoolMetrics,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                provider: provider.to_string(),
                max_workers: max_workers.max(1),
                hung_cap: hung_cap.max(1),
                idle_timeout,
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                metrics,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why calls are refused now, if they are (`/readyz`).
    pub fn health(&self) -> Result<(), String> {
        let state = self.lock();
        if state.hung >= self.shared.hung_cap {
            Err(self.unhealthy_message(state.hung))
        } else {
            Ok(())
        }
    }

    /// Threads the pool has now (workers and hung ones).
    pub fn threads(&self) -> usize {
        let state = self.lock();
        state.workers + state.hung
    }

    fn unhealthy_message(&self, hung: usize) -> String {
        format!(
            "provider {}: {hung} calls are stuck in the plugin past their deadline (at most {} \
             allowed); its calls are refused until some return",
            self.shared.provider, self.shared.hung_cap
        )
    }

    /// Queue `f`, or refuse it at once (`Err` with the reason) while the provider has too many
    /// hung calls.
    pub fn submit<T, F>(&self, f: F) -> Result<PoolCall<T>, String>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let state_flag = Arc::new(AtomicU8::new(QUEUED));
        let job = Job {
            state: state_flag.clone(),
            run: Box::new(move |state: &AtomicU8| {
                let answer = f();
                let wanted = state
                    .compare_exchange(RUNNING, DONE, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok();
                if wanted {
                    let _ = tx.send(answer);
                }
                wanted
            }),
        };
        let mut state = self.lock();
        if state.hung >= self.shared.hung_cap {
            drop(state);
            self.shared.metrics.refused.inc();
            return Err(self.unhealthy_message(self.shared.hung_cap));
        }
        state.queue.push_back(job);
        if state.idle == 0 && state.workers < self.shared.max_workers {
            state.workers += 1;
            self.update_threads(&state);
            drop(state);
            self.start_worker();
        } else {
            drop(state);
            self.shared.work.notify_one();
        }
        Ok(PoolCall {
            state: state_flag,
            pool: self.clone(),
            answer: rx,
        })
    }

    fn update_threads(&self, state: &State) {
        let threads = i64::try_from(state.workers + state.hung).unwrap_or(i64::MAX);
        self.shared.metrics.threads.set(threads);
        self.shared
            .metrics
            .hung
            .set(i64::try_from(state.hung).unwrap_or(i64::MAX));
    }

    fn start_worker(&self) {
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("ccm-call-{}", self.shared.provider))
            .spawn(move || pool.work());
        if let Err(e) = spawned {
            let mut state = self.lock();
            state.workers -= 1;
            self.update_threads(&state);
            tracing::error!(provider = %self.shared.provider, "cannot start a provider call thread: {e}");
        }
    }

    /// A worker: run queued jobs until one is abandoned while running (then end: a replacement
    /// was allowed to start meanwhile), or until it waited [`IDLE_TIMEOUT`] for one.
    fn work(&self) {
        let mut state = self.lock();
        loop {
            let Some(job) = state.queue.pop_front() else {
                state.idle += 1;
                let (guard, waited) = self
                    .shared
                    .work
                    .wait_timeout(state, self.shared.idle_timeout)
                    .unwrap_or_else(|p| p.into_inner());
                state = guard;
                state.idle -= 1;
                if waited.timed_out() && state.queue.is_empty() {
                    state.workers -= 1;
                    self.update_threads(&state);
                    return;
                }
                continue;
            };
            // A queued call whose caller already gave up is not run at all.
            if job
                .state
                .compare_exchange(QUEUED, RUNNING, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            drop(state);
            let wanted = (job.run)(&job.state);
            state = self.lock();
            if !wanted {
                // Abandoned while running: this thread was counted hung and replaced.
                state.hung -= 1;
                STUCK.fetch_sub(1, Ordering::AcqRel);
                if state.reported && state.hung < self.shared.hung_cap {
                    state.reported = false;
                    tracing::info!(provider = %self.shared.provider, hung = state.hung, "provider calls no longer refused: hung calls returned");
                }
                self.update_threads(&state);
                return;
            }
        }
    }

    /// The caller of a job stopped waiting for it.
    fn abandon(&self, job: &AtomicU8) {
        match job.compare_exchange(RUNNING, ABANDONED, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => {
                let mut state = self.lock();
                state.workers -= 1;
                state.hung += 1;
                STUCK.fetch_add(1, Ordering::AcqRel);
                if state.hung >= self.shared.hung_cap && !state.reported {
                    state.reported = true;
                    tracing::error!("{}", self.unhealthy_message(state.hung));
                }
                // Keep the pool's capacity: start a replacement if calls are waiting, unless
                // the provider is at its cap of hung threads (then threads stay bounded by
                // MAX_WORKERS + HUNG_CAP: a worker only starts while fewer are hung).
                let replace = !state.queue.is_empty()
                    && state.idle == 0
                    && state.workers < self.shared.max_workers
                    && state.hung < self.shared.hung_cap;
                if replace {
                    state.workers += 1;
                }
                self.update_threads(&state);
                drop(state);
                if replace {
                    self.start_worker();
                }
            }
            // Still queued: mark it so no worker runs it. Done: nothing to do.
            Err(QUEUED) => {
                let _ =
                    job.compare_exchange(QUEUED, ABANDONED, Ordering::AcqRel, Ordering::Acquire);
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(max: usize, cap: usize) -> CallPool {
        CallPool::with_limits("test", max, cap, PoolMetrics::default())
    }

    #[tokio::test]
    async fn calls_run_and_answer() {
        let p = pool(2, 2);
        let call = p.submit(|| 40 + 2).unwrap();
        assert_eq!(call.await.unwrap(), 42);
        // Dropped after the answer: not hung.
        assert!(p.health().is_ok());
    }

    #[tokio::test]
    async fn hung_calls_are_replaced_up_to_the_cap_then_refused() {
        let p = pool(2, 3);
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let block = |release: Arc<(Mutex<bool>, Condvar)>| {
            move || {
                let (lock, cv) = &*release;
                let mut go = lock.lock().unwrap();
                while !*go {
                    go = cv.wait(go).unwrap();
                }
            }
        };
        for _ in 0..3 {
            let call = p.submit(block(release.clone())).unwrap();
            // Wait until a thread runs it, then give up on it.
            while call.state.load(Ordering::Acquire) != RUNNING {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            drop(call);
        }
        let err = p.health().unwrap_err();
        assert!(err.contains("3 calls are stuck"), "{err}");
        assert!(p.submit(|| ()).is_err(), "refused at the cap");
        assert!(p.threads() <= 2 + 3, "bounded: {}", p.threads());
        // The stuck calls return: the pool recovers and calls run again.
        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        let started = std::time::Instant::now();
        while p.health().is_err() {
            assert!(started.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(p.submit(|| 7).unwrap().await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_queued_call_given_up_never_runs() {
        let p = pool(1, 4);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let first = p.submit(move || rx.recv().ok()).unwrap();
        let ran = Arc::new(AtomicU8::new(0));
        let second = {
            let ran = ran.clone();
            p.submit(move || ran.store(1, Ordering::Release)).unwrap()
        };
        drop(second);
        tx.send(()).unwrap();
        first.await.unwrap();
        // The only worker is free again and ran nothing else.
        assert_eq!(p.submit(|| 1).unwrap().await.unwrap(), 1);
        assert_eq!(ran.load(Ordering::Acquire), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_threads_end() {
        let p = CallPool::with_idle_timeout(
            "test",
            8,
            4,
            Duration::from_millis(50),
            PoolMetrics::default(),
        );
        let calls: Vec<_> = (0..4).map(|i| p.submit(move || i).unwrap()).collect();
        for (i, call) in calls.into_iter().enumerate() {
            assert_eq!(call.await.unwrap(), i);
        }
        assert!(p.threads() >= 1);
        let started = std::time::Instant::now();
        while p.threads() > 0 {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "idle threads end"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A call after that starts a thread again.
        assert_eq!(p.submit(|| 7).unwrap().await.unwrap(), 7);
    }
}
