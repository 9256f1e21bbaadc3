//! A work queue with client-go's semantics, which upstream controllers rely on:
//! - a key is queued at most once (adds while queued are merged);
//! - a key being processed is not handed to a second worker; re-added meanwhile, it is queued
//!   again when the first worker calls [`WorkQueue::done`];
//! - [`WorkQueue::add_rate_limited`] re-adds with per-key exponential backoff
//!   (`base * 2^failures`, capped), [`WorkQueue::forget`] resets it;
//! - [`WorkQueue::add_after`] re-adds after an exact delay (upstream's RetryError path).
//!
//! With [`WorkQueue::with_metrics`] it reports client-go's workqueue metrics under the queue's
//! name (`workqueue_depth`, `workqueue_adds_total`, `workqueue_queue_duration_seconds`,
//! `workqueue_work_duration_seconds`, `workqueue_retries_total`,
//! `workqueue_unfinished_work_seconds`, `workqueue_longest_running_processor_seconds`).
//!
//! Beyond client-go: once a burst has drained (the queue empties), the spare capacity of its
//! tables is given back (`State::release_spare`). The node controller queues every node at
//! start, and Rust's hash tables and `VecDeque` never shrink by themselves, so each node queue
//! otherwise kept ~150 bytes per node of empty slots for the life of the process (4.3 MiB
//! of the host's steady state at 20,000 nodes in `bench_scale`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::runtime::metrics::{QueueMetrics, WorkqueueMetrics};

struct State<K> {
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    /// Keys being processed, with when their worker took them.
    processing: HashMap<K, Instant>,
    failures: HashMap<K, u32>,
    /// When each queued key was added (for `workqueue_queue_duration_seconds`).
    added_at: HashMap<K, Instant>,
    shutting_down: bool,
}

/// Tables at most this large keep their capacity (no reallocation churn for small queues).
const KEEP_CAPACITY: usize = 256;

impl<K: Hash + Eq> State<K> {
    /// Shrink every table holding spare room for more than four times its content (and more
    /// than [`KEEP_CAPACITY`] entries) to its content: called when the queue has just emptied,
    /// so a burst's high-water mark is not kept.
    fn release_spare(&mut self) {
        fn spare(len: usize, capacity: usize) -> bool {
            capacity > KEEP_CAPACITY && capacity > len.saturating_mul(4)
        }
        if spare(self.queue.len(), self.queue.capacity()) {
            self.queue.shrink_to(KEEP_CAPACITY);
        }
        if spare(self.dirty.len(), self.dirty.capacity()) {
            self.dirty.shrink_to(KEEP_CAPACITY);
        }
        if spare(self.processing.len(), self.processing.capacity()) {
            self.processing.shrink_to(KEEP_CAPACITY);
        }
        if spare(self.failures.len(), self.failures.capacity()) {
            self.failures.shrink_to(KEEP_CAPACITY);
        }
        if spare(self.added_at.len(), self.added_at.capacity()) {
            self.added_at.shrink_to(KEEP_CAPACITY);
        }
    }
}

/// A deduplicating, rate-limited work queue. Cheap to clone.
pub struct WorkQueue<K> {
    name: Arc<str>,
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
    base_delay: Duration,
    max_delay: Duration,
    metrics: Option<QueueMetrics>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            state: self.state.clone(),
            notify: self.notify.clone(),
            base_delay: self.base_delay,
            max_delay: self.max_delay,
            metrics: self.metrics.clone(),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + 'static> WorkQueue<K> {
    /// A queue whose rate-limited re-adds back off from `base_delay` up to `max_delay`.
    pub fn new(name: &str, base_delay: Duration, max_delay: Duration) -> Self {
        Self {
            name: name.into(),
            state: Arc::new(Mutex::new(State {
                queue: VecDeque::new(),
                dirty: HashSet::new(),
                processing: HashMap::new(),
                failures: HashMap::new(),
                added_at: HashMap::new(),
                shutting_down: false,
            })),
            notify: Arc::new(Notify::new()),
            base_delay,
            max_delay,
            metrics: None,
        }
    }

    /// Report this queue's metrics in `metrics` under its name. The two "in progress" gauges
    /// are refreshed every second by a task that ends when the queue shuts down (so this must
    /// be called inside a tokio runtime).
    pub fn with_metrics(mut self, metrics: &WorkqueueMetrics) -> Self {
        let m = metrics.queue(&self.name);
        self.metrics = Some(m.clone());
        let state = Arc::downgrade(&self.state);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(state) = state.upgrade() else { return };
                let s = state.lock().unwrap_or_else(|p| p.into_inner());
                if s.shutting_down {
                    return;
                }
                let now = Instant::now();
                let running: Vec<f64> = s
                    .processing
                    .values()
                    .map(|t| now.saturating_duration_since(*t).as_secs_f64())
                    .collect();
                m.unfinished_work.set(running.iter().sum());
                m.longest_running
                    .set(running.iter().copied().fold(0.0, f64::max));
            }
        });
        self
    }

    /// The queue's name (upstream's workqueue name).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `key` now.
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.shutting_down || !s.dirty.insert(key.clone()) {
            return;
        }
        if let Some(m) = &self.metrics {
            m.adds.inc();
            s.added_at.entry(key.clone()).or_insert_with(Instant::now);
        }
        if !s.processing.contains_key(&key) {
            s.queue.push_back(key);
            self.update_depth(&s);
            drop(s);
            self.notify.notify_one();
        }
    }

    fn update_depth(&self, s: &State<K>) {
        if let Some(m) = &self.metrics {
            m.depth
                .set(i64::try_from(s.queue.len()).unwrap_or(i64::MAX));
        }
    }

    /// Queue `key` after `delay`.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            this.add(key);
        });
    }

    /// The backoff the next rate-limited add of `key` would use, without recording a failure.
    pub fn next_backoff(&self, key: &K) -> Duration {
        let failures = self.lock().failures.get(key).copied().unwrap_or(0);
        self.backoff_for(failures)
    }

    fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.min(31));
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// Queue `key` after its per-key exponential backoff, and count a failure.
    pub fn add_rate_limited(&self, key: K) {
        self.add_rate_limited_min(key, Duration::ZERO);
    }

    /// Like [`WorkQueue::add_rate_limited`], but wait at least `min_delay` (the delay of an
    /// overall rate limiter combined with the per-key backoff, client-go's `MaxOfRateLimiter`).
    pub fn add_rate_limited_min(&self, key: K, min_delay: Duration) {
        if let Some(m) = &self.metrics {
            m.retries.inc();
        }
        let delay = {
            let mut s = self.lock();
            let failures = s.failures.entry(key.clone()).or_insert(0);
            let delay = self.backoff_for(*failures);
            *failures = failures.saturating_add(1);
            delay
        };
        self.add_after(key, delay.max(min_delay));
    }

    /// Reset the failure count of `key`.
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// How many rate-limited re-adds `key` has had since it was last forgotten.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Wait for the next key; `None` once the queue is shut down.
    pub async fn get(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.lock();
                if s.shutting_down {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    let now = Instant::now();
                    if let Some(m) = &self.metrics {
                        if let Some(added) = s.added_at.remove(&key) {
                            m.queue_duration
                                .observe(now.saturating_duration_since(added).as_secs_f64());
                        }
                    }
                    s.processing.insert(key.clone(), now);
                    self.update_depth(&s);
                    if s.queue.is_empty() {
                        s.release_spare();
                    } else {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Mark `key` processed; if it was re-added meanwhile, queue it again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        if let (Some(started), Some(m)) = (s.processing.remove(key), &self.metrics) {
            m.work_duration.observe(
                Instant::now()
                    .saturating_duration_since(started)
                    .as_secs_f64(),
            );
        }
        if s.dirty.contains(key) {
            s.queue.push_back(key.clone());
            self.update_depth(&s);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Keys waiting (upstream `workqueue_depth`).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    /// True when no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stop handing out keys; waiting `get` calls return `None`.
    pub fn shutdown(&self) {
        self.lock().shutting_down = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedups_and_requeues_keys_added_while_processing() {
        let q = WorkQueue::new("t", Duration::from_millis(5), Duration::from_secs(1));
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        let k = q.get().await.unwrap();
        assert_eq!(k, "a");
        q.add("a"); // while processing: not handed out twice
        assert_eq!(q.get().await.unwrap(), "b");
        assert!(q.is_empty());
        q.done(&"a");
        assert_eq!(q.get().await.unwrap(), "a");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_exponentially_and_forget_resets() {
        let q = WorkQueue::new("t", Duration::from_secs(5), Duration::from_secs(300));
        assert_eq!(q.next_backoff(&1), Duration::from_secs(5));
        q.add_rate_limited(1);
        assert_eq!(q.next_backoff(&1), Duration::from_secs(10));
        q.add_rate_limited(1);
        q.add_rate_limited(1);
        assert_eq!(q.num_requeues(&1), 3);
        for _ in 0..10 {
            q.add_rate_limited(2);
        }
        assert_eq!(q.next_backoff(&2), Duration::from_secs(300), "capped");
        q.forget(&1);
        assert_eq!(q.num_requeues(&1), 0);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(q.get().await, Some(1));
    }

    /// A drained burst gives its tables' room back; a burst still queued keeps it.
    #[tokio::test]
    async fn a_drained_burst_releases_the_tables_room() {
        let metrics = WorkqueueMetrics::default();
        let q = WorkQueue::new("burst", Duration::from_millis(5), Duration::from_secs(1))
            .with_metrics(&metrics);
        let capacities = |q: &WorkQueue<u32>| {
            let s = q.lock();
            [
                s.queue.capacity(),
                s.dirty.capacity(),
                s.added_at.capacity(),
                s.processing.capacity(),
            ]
        };
        for k in 0..10_000 {
            q.add(k);
        }
        let mut taken = Vec::new();
        for _ in 0..9_999 {
            let k = q.get().await.unwrap();
            q.done(&k);
            taken.push(k);
        }
        assert!(
            capacities(&q).iter().take(3).all(|&c| c >= 10_000),
            "one key left: the burst's room is kept {:?}",
            capacities(&q)
        );
        let last = q.get().await.unwrap();
        q.done(&last);
        assert!(
            capacities(&q).iter().all(|&c| c <= 4 * KEEP_CAPACITY),
            "drained: {:?}",
            capacities(&q)
        );
        taken.push(last);
        taken.sort_unstable();
        assert_eq!(taken, (0..10_000).collect::<Vec<_>>(), "every key once");
        q.add(7);
        assert_eq!(q.get().await, Some(7), "the queue still works");
    }

    #[tokio::test(start_paused = true)]
    async fn reports_client_go_metrics() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = WorkqueueMetrics::default();
        metrics.register(&mut registry);
        let q = WorkQueue::new("things", Duration::from_secs(1), Duration::from_secs(8))
            .with_metrics(&metrics);
        q.add("a");
        q.add("a"); // merged: one add
        q.add("b");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let a = q.get().await.unwrap();
        // "a" in progress for 3.5 s; the gauges refresh every second (last at 3 s).
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let text = crate::runtime::metrics::render(&registry);
        assert!(
            text.contains("workqueue_adds_total{name=\"things\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_depth{name=\"things\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_longest_running_processor_seconds{name=\"things\"} 3"),
            "{text}"
        );
        // Waited 2 s in the queue: in the (1, 10] bucket, not the 1 s one.
        assert!(
            text.contains("workqueue_queue_duration_seconds_bucket{le=\"1.0\",name=\"things\"} 0"),
            "{text}"
        );
        q.done(&a);
        q.add_rate_limited("c");
        let text = crate::runtime::metrics::render(&registry);
        assert!(
            text.contains("workqueue_retries_total{name=\"things\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("workqueue_work_duration_seconds_count{name=\"things\"} 1"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn shutdown_releases_waiters() {
        let q: WorkQueue<u8> =
            WorkQueue::new("t", Duration::from_millis(5), Duration::from_secs(1));
        let waiter = {
            let q = q.clone();
            tokio::spawn(async move { q.get().await })
        };
        tokio::task::yield_now().await;
        q.shutdown();
        assert_eq!(waiter.await.unwrap(), None);
    }
}
