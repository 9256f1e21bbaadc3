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
//! - a call abandoned while its thread runs it (deadline passed, or every caller went away)
//!   makes that thread *hung*: it no longer counts as a worker, so a new one can start, and it
//!   ends as soon as the plugin returns;
//! - a call with a [`CallKey`] identical to one whose thread is still running, hung or not,
//!   *joins* it ([`CallPool::join`]): it waits (within its own deadline) for that thread's
//!   answer instead of starting another thread (an answer that is the joined call's own
//!   cancellation is not this caller's: the provider layer then makes its own call). Asking the same question of a plugin that ignores cancellation again and
//!   again (the lifecycle loop asks about every NotReady node each pass) costs one thread per
//!   distinct question, not one per pass;
//! - hung calls are contained **per method**: at [`METHOD_HUNG_CAP`] hung threads of one method,
//!   new calls of that method fail at once with a clear error naming it, one ERROR line says
//!   so, and its own `/readyz` check (`cloud-provider-calls-<Method>`, added by the daemon
//!   through [`CallPool::on_method_refused`]) fails, while the provider's other methods keep
//!   working (upstream stalls only what waits for the stuck call). `ccm_provider_calls_hung`
//!   and `ccm_provider_calls_refused_total` carry the method;
//! - at [`HUNG_CAP`] hung threads in all (several methods stuck) the whole provider is
//!   unhealthy: every new call fails at once, one ERROR line says so, `/healthz` fails (the
//!   daemon's `cloud-provider-calls` check, [`CallPool::health`]). When hung calls return,
//!   each recovers.
//!
//! So at most `MAX_WORKERS + HUNG_CAP` threads exist per provider, whatever the plugin does,
//! and a hung provider cannot take threads from another one. A queued call of a method refused
//! meanwhile is refused, not run. The per-method cap counts hung threads, so a burst of more
//! than `HUNG_CAP` *distinct* calls of one method running at once that all hang still reaches
//! the provider-wide cap (the controllers keep at most 64 calls of one method in flight: the
//! address loop's lookups).

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::oneshot;

use super::call_metrics::MethodLabels;

/// Threads that run calls (the controllers' default concurrency fits well below it).
pub const MAX_WORKERS: usize = 256;
/// Hung threads a provider may have, all methods together, before all its calls are refused.
pub const HUNG_CAP: usize = 128;
/// Hung threads one method may have before that method's calls are refused.
pub const METHOD_HUNG_CAP: usize = 16;
/// How long a thread waits for work before it ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Hung threads of every pool in the process (reported when the host exits).
static STUCK: AtomicUsize = AtomicUsize::new(0);

/// Provider calls of every provider still running in plugin threads whose callers gave up.
pub fn stuck_calls() -> usize {
    STUCK.load(Ordering::Acquire)
}

/// What makes two calls identical for joining: the method, a generation (the provider bumps it
/// on every `--cloud-config` reload, so no call joins one made with the old config) and a
/// SHA-256 digest of the call's arguments.
pub type CallKey = (&'static str, u64, [u8; 32]);

/// A call's life in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    /// Running, and nobody waits for it any more: its thread was counted hung and replaced.
    Hung,
}

/// A call the pool knows about (queued or running). Removed when its thread finishes it, or
/// when its last waiter leaves before a thread took it.
struct Slot {
    method: &'static str,
    key: Option<CallKey>,
    phase: Phase,
    /// `Vec<oneshot::Sender<Result<T, String>>>`: the callers waiting for the answer (typed
    /// by the call).
    senders: Box<dyn Any + Send>,
    /// Answers every waiter of `senders` with a refusal (monomorphised for the call's type).
    refuse: fn(Box<dyn Any + Send>, &Stuck),
    /// Callers still waiting ([`PoolCall`]s not dropped).
    waiting: usize,
}

struct Job {
    id: u64,
    /// Runs the call and hands the answer to [`CallPool::finish`]; returns whether the call
    /// was hung (its thread was replaced meanwhile and must end).
    run: Box<dyn FnOnce(&CallPool) -> bool + Send>,
}

#[derive(Default)]
struct MethodState {
    /// Hung threads of this method.
    hung: usize,
    /// The refused state was logged (cleared when it recovers).
    reported: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    slots: HashMap<u64, Slot>,
    /// Calls with a key, queued or running (hung included), by key.
    by_key: HashMap<CallKey, u64>,
    next_id: u64,
    /// Worker threads alive and not hung (busy or idle).
    workers: usize,
    /// Workers waiting for a job.
    idle: usize,
    /// Threads still running a call whose callers gave up.
    hung: usize,
    methods: HashMap<&'static str, MethodState>,
    /// The provider-wide unhealthy state was logged (cleared when it recovers).
    reported: bool,
}

/// Metrics of a pool (registered with the call metrics).
#[derive(Clone, Default)]
pub struct PoolMetrics {
    /// `ccm_provider_calls_hung{method}`: threads running calls whose callers gave up.
    pub hung: Family<MethodLabels, Gauge>,
    /// `ccm_provider_calls_refused_total{method}`: calls failed at once because of hung calls.
    pub refused: Family<MethodLabels, Counter>,
    /// `ccm_provider_call_threads`: threads of the pool (workers and hung).
    pub threads: Gauge,
}

/// Called with a method's name when its calls start being refused.
pub type RefusedHook = Arc<dyn Fn(&'static str) + Send + Sync>;

struct Shared {
    provider: String,
    max_workers: usize,
    hung_cap: usize,
    method_cap: usize,
    idle_timeout: Duration,
    state: Mutex<State>,
    work: Condvar,
    metrics: PoolMetrics,
    on_refused: Mutex<Option<RefusedHook>>,
}

/// One provider's call threads. Cheap to clone.
#[derive(Clone)]
pub struct CallPool {
    shared: Arc<Shared>,
}

/// A pool that does not keep it alive (for health checks held by the pool's own hook).
#[derive(Clone)]
pub struct WeakCallPool(Weak<Shared>);

impl WeakCallPool {
    /// [`CallPool::method_health`]; `Ok` once the pool is gone.
    pub fn method_health(&self, method: &str) -> Result<(), Stuck> {
        self.0
            .upgrade()
            .map_or(Ok(()), |shared| CallPool { shared }.method_health(method))
    }
}

/// Why calls are refused: too many of them are stuck in the plugin past their deadline.
/// `Display` is the line the log, `/healthz`, `/readyz` and the refused call's error show.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stuck {
    /// The provider reached its cap of hung calls: every call is refused.
    #[error(
        "provider {provider}: {hung} calls are stuck in the plugin past their deadline (at most \
         {cap} allowed); its calls are refused until some return"
    )]
    Provider {
        /// The provider's name.
        provider: String,
        /// Calls hung now.
        hung: usize,
        /// The cap.
        cap: usize,
    },
    /// One method reached its cap of hung calls: that method's calls are refused.
    #[error(
        "provider {provider}: {hung} {method} calls are stuck in the plugin past their deadline \
         (at most {cap} per method); {method} calls are refused until some return, the \
         provider's other methods still run"
    )]
    Method {
        /// The provider's name.
        provider: String,
        /// The method.
        method: String,
        /// Calls of it hung now.
        hung: usize,
        /// The cap per method.
        cap: usize,
    },
}

/// Why a call handed to the pool has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolError {
    /// Refused while it waited in the queue: its method (or the provider) reached the cap of
    /// hung calls meanwhile.
    Refused(Stuck),
    /// Its thread ended without an answer (a panic in the host's own closure).
    Lost,
}

type Answer<T> = Result<T, Stuck>;

fn refuse_all<T: Send + 'static>(senders: Box<dyn Any + Send>, why: &Stuck) {
    if let Ok(senders) = senders.downcast::<Vec<oneshot::Sender<Answer<T>>>>() {
        for s in *senders {
            let _ = s.send(Err(why.clone()));
        }
    }
}

/// A call handed to the pool (or joined); awaiting it gives the call's result. Dropping it
/// before the answer leaves the call; a running call left by its last waiter makes its thread
/// hung.
pub struct PoolCall<T> {
    id: u64,
    pool: CallPool,
    answer: oneshot::Receiver<Answer<T>>,
    /// Whether this call joined one already queued or running.
    joined: bool,
}

impl<T> PoolCall<T> {
    /// Whether this call joined an identical one instead of starting its own.
    pub fn joined(&self) -> bool {
        self.joined
    }
}

impl<T> std::future::Future for PoolCall<T> {
    type Output = Result<T, PoolError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| match answer {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(why)) => Err(PoolError::Refused(why)),
                Err(_) => Err(PoolError::Lost),
            })
    }
}

impl<T> Drop for PoolCall<T> {
    fn drop(&mut self) {
        self.pool.leave(self.id);
    }
}

impl CallPool {
    /// The pool of `provider` with the default limits.
    pub fn new(provider: &str, metrics: PoolMetrics) -> Self {
        Self::with_limits(provider, MAX_WORKERS, HUNG_CAP, METHOD_HUNG_CAP, metrics)
    }

    /// A pool with other limits (tests).
    pub fn with_limits(
        provider: &str,
        max_workers: usize,
        hung_cap: usize,
        method_cap: usize,
        metrics: PoolMetrics,
    ) -> Self {
        Self::with_idle_timeout(
            provider,
            max_workers,
            hung_cap,
            method_cap,
            IDLE_TIMEOUT,
            metrics,
        )
    }

    fn with_idle_timeout(
        provider: &str,
        max_workers: usize,
        hung_cap: usize,
        method_cap: usize,
        idle_timeout: Duration,
        metrics: PoolMetrics,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                provider: provider.to_string(),
                max_workers: max_workers.max(1),
                hung_cap: hung_cap.max(1),
                method_cap: method_cap.max(1),
                idle_timeout,
                state: Mutex::new(State::default()),
                work: Condvar::new(),
                metrics,
                on_refused: Mutex::new(None),
            }),
        }
    }

    /// A handle that does not keep the pool alive.
    pub fn downgrade(&self) -> WeakCallPool {
        WeakCallPool(Arc::downgrade(&self.shared))
    }

    /// Call `hook` with a method's name each time its calls start being refused (the daemon
    /// adds the method's `/readyz` check).
    pub fn on_method_refused(&self, hook: RefusedHook) {
        *self
            .shared
            .on_refused
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why every call is refused now, if it is (`/healthz`).
    pub fn health(&self) -> Result<(), Stuck> {
        let state = self.lock();
        if state.hung >= self.shared.hung_cap {
            Err(self.unhealthy_message(state.hung))
        } else {
            Ok(())
        }
    }

    /// Why `method`'s calls are refused now, if they are (its `/readyz` check).
    pub fn method_health(&self, method: &str) -> Result<(), Stuck> {
        let state = self.lock();
        let hung = state.methods.get(method).map_or(0, |m| m.hung);
        if hung >= self.shared.method_cap {
            Err(self.method_message(method, hung))
        } else {
            Ok(())
        }
    }

    /// The methods whose calls are refused now.
    pub fn refused_methods(&self) -> Vec<&'static str> {
        let state = self.lock();
        let mut methods: Vec<&'static str> = state
            .methods
            .iter()
            .filter(|(_, m)| m.hung >= self.shared.method_cap)
            .map(|(name, _)| *name)
            .collect();
        methods.sort_unstable();
        methods
    }

    /// Threads the pool has now (workers and hung ones).
    pub fn threads(&self) -> usize {
        let state = self.lock();
        state.workers + state.hung
    }

    /// Hung threads now (all methods).
    pub fn hung(&self) -> usize {
        self.lock().hung
    }

    /// Whether a call with `key` is running past the point its callers gave up (an open
    /// question the plugin never answered).
    pub fn is_hung(&self, key: &CallKey) -> bool {
        let state = self.lock();
        state
            .by_key
            .get(key)
            .and_then(|id| state.slots.get(id))
            .is_some_and(|slot| slot.phase == Phase::Hung)
    }

    fn unhealthy_message(&self, hung: usize) -> Stuck {
        Stuck::Provider {
            provider: self.shared.provider.to_string(),
            hung,
            cap: self.shared.hung_cap,
        }
    }

    fn method_message(&self, method: &str, hung: usize) -> Stuck {
        Stuck::Method {
            provider: self.shared.provider.to_string(),
            method: method.to_string(),
            hung,
            cap: self.shared.method_cap,
        }
    }

    /// Join the call with `key` still queued or running (hung included): wait for its answer
    /// instead of starting another call. `None` when there is none. Never refused: it starts
    /// no thread. (The caller decides what to do with an answer that is the joined call's own
    /// cancellation.)
    pub fn join<T: Clone + Send + 'static>(&self, key: &CallKey) -> Option<PoolCall<T>> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        let id = *state.by_key.get(key)?;
        let slot = state.slots.get_mut(&id)?;
        let senders = slot
            .senders
            .downcast_mut::<Vec<oneshot::Sender<Answer<T>>>>()?;
        senders.retain(|s| !s.is_closed());
        senders.push(tx);
        slot.waiting += 1;
        Some(PoolCall {
            id,
            pool: self.clone(),
            answer: rx,
            joined: true,
        })
    }

    /// Queue `f` as a call of `method` (known by `key` to [`CallPool::join`] while it is queued
    /// or running), or refuse it at once (`Err` with the reason) while `method`, or the
    /// provider as a whole, has too many hung calls.
    pub fn submit<T, F>(
        &self,
        method: &'static str,
        key: Option<CallKey>,
        f: F,
    ) -> Result<PoolCall<T>, Stuck>
    where
        T: Clone + Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let mut state = self.lock();
        if let Some(message) = self.refusal(&state, method) {
            drop(state);
            self.shared
                .metrics
                .refused
                .get_or_create(&MethodLabels { method })
                .inc();
            return Err(message);
        }
        let id = state.next_id;
        state.next_id += 1;
        state.slots.insert(
            id,
            Slot {
                method,
                key,
                phase: Phase::Queued,
                senders: Box::new(vec![tx]),
                refuse: refuse_all::<T>,
                waiting: 1,
            },
        );
        if let Some(key) = key {
            state.by_key.insert(key, id);
        }
        state.queue.push_back(Job {
            id,
            run: Box::new(move |pool: &CallPool| {
                let answer = f();
                pool.finish(id, answer)
            }),
        });
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
            id,
            pool: self.clone(),
            answer: rx,
            joined: false,
        })
    }

    /// Why a new call of `method` is refused now, if it is.
    fn refusal(&self, state: &State, method: &str) -> Option<Stuck> {
        let method_hung = state.methods.get(method).map_or(0, |m| m.hung);
        if state.hung >= self.shared.hung_cap {
            Some(self.unhealthy_message(state.hung))
        } else if method_hung >= self.shared.method_cap {
            Some(self.method_message(method, method_hung))
        } else {
            None
        }
    }

    fn update_threads(&self, state: &State) {
        let threads = i64::try_from(state.workers + state.hung).unwrap_or(i64::MAX);
        self.shared.metrics.threads.set(threads);
    }

    fn set_hung_gauge(&self, method: &'static str, hung: usize) {
        self.shared
            .metrics
            .hung
            .get_or_create(&MethodLabels { method })
            .set(i64::try_from(hung).unwrap_or(i64::MAX));
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

    /// A worker: run queued jobs until one turns out hung (then end: a replacement was allowed
    /// to start meanwhile), or until it waited [`IDLE_TIMEOUT`] for one.
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
            // A queued call whose callers all gave up is gone: it is not run at all.
            let method = match state.slots.get_mut(&job.id) {
                Some(slot) if slot.phase == Phase::Queued => slot.method,
                _ => continue,
            };
            // Nor is one whose method (or provider) reached its cap of hung calls while it
            // waited: a burst of calls of a method that hangs does not take more threads.
            if let Some(why) = self.refusal(&state, method) {
                if let Some(slot) = state.slots.remove(&job.id) {
                    if let Some(key) = &slot.key {
                        if state.by_key.get(key) == Some(&job.id) {
                            state.by_key.remove(key);
                        }
                    }
                    drop(state);
                    self.shared
                        .metrics
                        .refused
                        .get_or_create(&MethodLabels { method })
                        .inc();
                    (slot.refuse)(slot.senders, &why);
                    state = self.lock();
                }
                continue;
            }
            if let Some(slot) = state.slots.get_mut(&job.id) {
                slot.phase = Phase::Running;
            }
            drop(state);
            if (job.run)(self) {
                // This thread was counted hung and replaced; `finish` accounted for its end.
                return;
            }
            state = self.lock();
        }
    }

    /// The call `id` returned `answer`: forget it (so a caller that got its answer never finds
    /// the call still running), end its hung accounting, and hand the answer to every caller
    /// still waiting, joiners included. Returns whether the call was hung.
    fn finish<T: Clone + Send + 'static>(&self, id: u64, answer: T) -> bool {
        let mut state = self.lock();
        let Some(slot) = state.slots.remove(&id) else {
            return false;
        };
        if let Some(key) = &slot.key {
            if state.by_key.get(key) == Some(&id) {
                state.by_key.remove(key);
            }
        }
        let hung = slot.phase == Phase::Hung;
        if hung {
            state.hung -= 1;
            STUCK.fetch_sub(1, Ordering::AcqRel);
            let method = state.methods.entry(slot.method).or_default();
            method.hung -= 1;
            let (method_hung, method_reported) = (method.hung, method.reported);
            if method_reported && method_hung < self.shared.method_cap {
                state.methods.entry(slot.method).or_default().reported = false;
                tracing::info!(provider = %self.shared.provider, method = slot.method, hung = method_hung, "{} calls no longer refused: hung calls returned", slot.method);
            }
            if state.reported && state.hung < self.shared.hung_cap {
                state.reported = false;
                tracing::info!(provider = %self.shared.provider, hung = state.hung, "provider calls no longer refused: hung calls returned");
            }
            self.set_hung_gauge(slot.method, method_hung);
            self.update_threads(&state);
        }
        drop(state);
        if let Ok(senders) = slot.senders.downcast::<Vec<oneshot::Sender<Answer<T>>>>() {
            let mut senders: Vec<_> = senders.into_iter().filter(|s| !s.is_closed()).collect();
            if let Some(last) = senders.pop() {
                for s in senders {
                    let _ = s.send(Ok(answer.clone()));
                }
                let _ = last.send(Ok(answer));
            }
        }
        hung
    }

    /// A caller of call `id` stopped waiting for it.
    fn leave(&self, id: u64) {
        let mut state = self.lock();
        let Some(slot) = state.slots.get_mut(&id) else {
            // Finished.
            return;
        };
        slot.waiting -= 1;
        if slot.waiting > 0 {
            return;
        }
        match slot.phase {
            // A hung call left by a joiner stays hung; a thread finishing it removes it.
            Phase::Hung => {}
            // Never run: forget it (the worker that pops it skips it).
            Phase::Queued => {
                let key = slot.key;
                state.slots.remove(&id);
                if let Some(key) = key {
                    if state.by_key.get(&key) == Some(&id) {
                        state.by_key.remove(&key);
                    }
                }
            }
            Phase::Running => {
                slot.phase = Phase::Hung;
                let method_name = slot.method;
                state.workers -= 1;
                state.hung += 1;
                STUCK.fetch_add(1, Ordering::AcqRel);
                let method = state.methods.entry(method_name).or_default();
                method.hung += 1;
                let method_hung = method.hung;
                let mut newly_refused = false;
                if method_hung >= self.shared.method_cap && !method.reported {
                    method.reported = true;
                    newly_refused = true;
                    tracing::error!("{}", self.method_message(method_name, method_hung));
                }
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
                self.set_hung_gauge(method_name, method_hung);
                self.update_threads(&state);
                drop(state);
                if replace {
                    self.start_worker();
                }
                if newly_refused {
                    let hook = self
                        .shared
                        .on_refused
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    if let Some(hook) = hook {
                        hook(method_name);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(max: usize, cap: usize, method_cap: usize) -> CallPool {
        CallPool::with_limits("test", max, cap, method_cap, PoolMetrics::default())
    }

    /// A gate the test opens; calls block on it ignoring everything else.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<bool>, Condvar)>);

    impl Gate {
        fn wait(&self) {
            let (lock, cv) = &*self.0;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        }
        fn open(&self) {
            *self.0 .0.lock().unwrap() = true;
            self.0 .1.notify_all();
        }
    }

    fn key(method: &'static str, n: u8) -> Option<CallKey> {
        Some((method, 0, [n; 32]))
    }

    fn running(p: &CallPool, id: u64) -> bool {
        p.lock()
            .slots
            .get(&id)
            .is_some_and(|s| s.phase == Phase::Running)
    }

    /// Submit a blocking call and give up on it once a thread runs it.
    async fn hang(p: &CallPool, method: &'static str, key: Option<CallKey>, gate: &Gate) {
        let gate = gate.clone();
        let call = p.submit(method, key, move || gate.wait()).unwrap();
        while !running(p, call.id) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(call);
    }

    async fn wait_healthy(p: &CallPool, method: &str) {
        let started = std::time::Instant::now();
        while p.health().is_err() || p.method_health(method).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn calls_run_and_answer() {
        let p = pool(2, 2, 2);
        let call = p.submit("M", None, || 40 + 2).unwrap();
        assert_eq!(call.await.unwrap(), 42);
        // Dropped after the answer: not hung.
        assert!(p.health().is_ok());
        assert_eq!(p.hung(), 0);
    }

    #[tokio::test]
    async fn a_method_whose_calls_hang_is_refused_alone_and_recovers() {
        let p = pool(4, 8, 3);
        let refused = Arc::new(Mutex::new(Vec::new()));
        {
            let refused = refused.clone();
            p.on_method_refused(Arc::new(move |m| refused.lock().unwrap().push(m)));
        }
        let gate = Gate::default();
        for n in 0..3 {
            hang(&p, "Stuck", key("Stuck", n), &gate).await;
        }
        let err = p.method_health("Stuck").unwrap_err();
        assert!(
            matches!(&err, Stuck::Method { method, hung: 3, .. } if method == "Stuck"),
            "{err}"
        );
        assert_eq!(*refused.lock().unwrap(), vec!["Stuck"]);
        assert_eq!(p.refused_methods(), vec!["Stuck"]);
        let e = p.submit("Stuck", key("Stuck", 9), || ()).err().unwrap();
        assert!(
            matches!(&e, Stuck::Method { method, .. } if method == "Stuck"),
            "{e}"
        );
        // The provider and its other methods are fine.
        assert!(p.health().is_ok());
        assert_eq!(p.submit("Other", None, || 7).unwrap().await.unwrap(), 7);
        assert!(p.threads() <= 4 + 3, "bounded: {}", p.threads());
        gate.open();
        wait_healthy(&p, "Stuck").await;
        assert_eq!(p.submit("Stuck", None, || 1).unwrap().await.unwrap(), 1);
        assert!(p.refused_methods().is_empty());
    }

    #[tokio::test]
    async fn identical_calls_join_the_running_one_even_once_hung() {
        let p = pool(4, 8, 8);
        let gate = Gate::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let submit = |n: u8| {
            let (gate, runs) = (gate.clone(), runs.clone());
            p.submit("Q", key("Q", n), move || {
                runs.fetch_add(1, Ordering::AcqRel);
                gate.wait();
                n
            })
            .unwrap()
        };
        let first = submit(1);
        while !running(&p, first.id) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let id = first.id;
        drop(first);
        assert_eq!(p.hung(), 1);
        assert!(p.is_hung(&key("Q", 1).unwrap()));
        // Asked again, five times: all join the hung call, no new thread.
        let again: Vec<_> = (0..5)
            .map(|_| p.join::<u8>(&key("Q", 1).unwrap()).unwrap())
            .collect();
        assert!(again.iter().all(|c| c.joined() && c.id == id));
        assert_eq!(p.hung(), 1);
        // A different question is a call of its own.
        let other = submit(2);
        assert!(!other.joined());
        gate.open();
        for call in again {
            assert_eq!(call.await.unwrap(), 1);
        }
        assert_eq!(other.await.unwrap(), 2);
        assert_eq!(runs.load(Ordering::Acquire), 2);
        wait_healthy(&p, "Q").await;
        assert_eq!(p.hung(), 0);
        assert!(!p.is_hung(&key("Q", 1).unwrap()));
    }

    #[tokio::test]
    async fn hung_calls_of_several_methods_refuse_the_provider_at_its_cap() {
        let p = pool(2, 3, 2);
        let gate = Gate::default();
        hang(&p, "A", None, &gate).await;
        hang(&p, "B", None, &gate).await;
        hang(&p, "C", None, &gate).await;
        let err = p.health().unwrap_err();
        assert!(matches!(err, Stuck::Provider { hung: 3, .. }), "{err}");
        assert!(p.submit("D", None, || ()).is_err(), "refused at the cap");
        assert!(p.threads() <= 2 + 3, "bounded: {}", p.threads());
        gate.open();
        wait_healthy(&p, "A").await;
        assert_eq!(p.submit("D", None, || 7).unwrap().await.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_queued_call_given_up_never_runs() {
        let p = pool(1, 4, 4);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let rx = Arc::new(Mutex::new(rx));
        let first = p
            .submit("M", None, move || rx.lock().unwrap().recv().ok())
            .unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        let second = {
            let ran = ran.clone();
            p.submit("M", key("M", 1), move || ran.store(1, Ordering::Release))
                .unwrap()
        };
        drop(second);
        tx.send(()).unwrap();
        first.await.unwrap();
        // The only worker is free again and ran nothing else.
        assert_eq!(p.submit("M", None, || 1).unwrap().await.unwrap(), 1);
        assert_eq!(ran.load(Ordering::Acquire), 0);
        assert!(p.lock().by_key.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn idle_threads_end() {
        let p = CallPool::with_idle_timeout(
            "test",
            8,
            4,
            4,
            Duration::from_millis(50),
            PoolMetrics::default(),
        );
        let calls: Vec<_> = (0..4)
            .map(|i| p.submit("M", None, move || i).unwrap())
            .collect();
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
        assert_eq!(p.submit("M", None, || 7).unwrap().await.unwrap(), 7);
    }
}
