//! ABI 1.1 bulk instance lookups: node initialisation, the address loop and the lifecycle
//! checks ask about many nodes in one `InstancesBatch` call when the provider declares
//! `BULK_INSTANCES` (docs/writing-a-provider.md#bulk-instance-lookups-implement-bulkinstances).
//!
//! The [`Batcher`] collects the nodes asked about, by every controller, for a short window
//! (`--instance-batch-window`, default [`DEFAULT_INSTANCE_BATCH_WINDOW`]) or until a batch holds
//! `--instance-batch-size` nodes (default [`DEFAULT_INSTANCE_BATCH_SIZE`]), then makes one call
//! through [`Provider::call`] (throttling pause, budget, deadline, metrics: one call, one token).
//! A node already waiting in a batch is not asked about twice: a caller joins the open batch
//! (widening its query) or a sent one that asks at least as much. At most
//! [`BATCHES_IN_FLIGHT`] batches are in the plugin at once, which bounds the memory of the node
//! JSON handed over.
//!
//! Answers: a per-node error is that node's error (a per-node `THROTTLED` starts the throttling
//! pause as a throttled call does); a batch-level error is every node's error, and a
//! batch-level "not found" becomes `OTHER` (it says nothing about any one node, so it can never
//! count as "does not exist"). `exists: false` is the only "does not exist".
//!
//! Answers are read from, and kept in, the provider's [`super::instance_cache`] as each caller's
//! [`CacheUse`] says.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::runtime::cached_node::{CachedNode, NodeRef};
use ccm_provider_abi::ext::{ExtCapabilities, InstanceQuery};
use ccm_provider_abi::{InstanceMetadata, InstanceStatus, ProviderError};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tokio::sync::{oneshot, Semaphore};

use super::call_metrics::CallerLabels;
use super::instance_cache::{CacheUse, InstanceAnswer};
use super::{nodes_json, release_hosts, unsupported, Provider};

/// Default of `--instance-batch-window`: how long the first node of a batch waits for others.
pub const DEFAULT_INSTANCE_BATCH_WINDOW: Duration = Duration::from_millis(100);
/// Default of `--instance-batch-size`: the most nodes in one `InstancesBatch` call.
pub const DEFAULT_INSTANCE_BATCH_SIZE: usize = 500;
/// Batches handed to the plugin at once; more wait for their turn.
pub const BATCHES_IN_FLIGHT: usize = 2;
/// The method name of a bulk lookup (metrics, the fake's faults, error messages).
pub const INSTANCES_BATCH: &str = "InstancesBatch";

type Answer = Result<InstanceAnswer, ProviderError>;

/// Metrics of bulk lookups and of the instance cache (part of [`super::CallMetrics`]).
#[derive(Clone)]
pub struct BulkMetrics {
    /// `ccm_provider_instance_batch_size`: nodes per `InstancesBatch` call.
    pub batch_size: Histogram,
    /// `ccm_provider_instance_cache_hits_total{caller}`: node lookups answered by the cache.
    pub cache_hits: Family<CallerLabels, Counter>,
    /// `ccm_provider_instance_cache_misses_total{caller}`: node lookups that asked the cloud
    /// (alone, in a batch, or joining a batch already under way).
    pub cache_misses: Family<CallerLabels, Counter>,
}

impl Default for BulkMetrics {
    fn default() -> Self {
        Self {
            // 1 .. 2048 nodes
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            cache_hits: Family::default(),
            cache_misses: Family::default(),
        }
    }
}

impl BulkMetrics {
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "ccm_provider_instance_batch_size",
            "Nodes asked about per bulk instance lookup (InstancesBatch call)",
            self.batch_size.clone(),
        );
        registry.register(
            "ccm_provider_instance_cache_hits",
            "Node instance lookups answered by the host's cache of instance answers, by caller",
            self.cache_hits.clone(),
        );
        registry.register(
            "ccm_provider_instance_cache_misses",
            "Node instance lookups that asked the cloud (not in the cache, or too old for the caller), by caller",
            self.cache_misses.clone(),
        );
    }
}

/// The collection of nodes into batches (one per provider).
pub(crate) struct Batcher {
    window: Duration,
    max: usize,
    state: Mutex<State>,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("window", &self.window)
            .field("max", &self.max)
            .finish()
    }
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// The batch collecting nodes.
    open: Option<Batch>,
    /// Nodes waiting for an answer, by [`node_key`]: their place in the open batch and in sent
    /// ones.
    waiting: HashMap<String, Vec<Slot>>,
}

struct Batch {
    id: u64,
    /// The caller label of the call (the caller whose node opened the batch).
    caller: &'static str,
    nodes: Vec<(String, Arc<CachedNode>)>,
    query: InstanceQuery,
    /// The instance cache's generation when the batch was sealed: its answers are kept only
    /// if no reload cleared the cache since ([`super::instance_cache`]).
    generation: u64,
}

struct Slot {
    batch: u64,
    sent: bool,
    /// The cache generation its batch was sealed in (meaningful once sent): a caller joins a
    /// sent batch only of the current generation, never a call made before a reload.
    generation: u64,
    query: InstanceQuery,
    keep_for: Duration,
    waiters: Vec<oneshot::Sender<Answer>>,
}

/// What asking about one node led to.
enum Asked {
    /// Answered by the cache.
    Hit(InstanceAnswer),
    /// In a batch; the answer comes on the receiver (`None` for a prefetch).
    Waiting(Option<oneshot::Receiver<Answer>>),
}

/// A node as a batch sees it: the same object (UID) with the same provider ID.
fn node_key(node: &CachedNode) -> String {
    format!(
        "{}\0{}\0{}",
        node.node_name(),
        node.node_uid().unwrap_or_default(),
        node.node_provider_id()
    )
}

impl Batcher {
    pub(crate) fn new(window: Duration, max: usize) -> Self {
        Self {
            window,
            max: max.max(1),
            state: Mutex::default(),
            permits: Arc::new(Semaphore::new(BATCHES_IN_FLIGHT)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl InstanceAnswer {
    /// A node's answer in a batch that asked `query`.
    fn of(status: InstanceStatus, query: InstanceQuery) -> Self {
        let exists = status.exists;
        Self {
            exists: Some(exists),
            shutdown: (exists && query.contains(InstanceQuery::SHUTDOWN))
                .then_some(status.shutdown),
            metadata: (exists && query.contains(InstanceQuery::METADATA))
                .then_some(status.metadata),
        }
    }
}

impl InstanceAnswer {
    /// The metadata part as the per-node `InstanceMetadata` answers it: `exists: false` is
    /// `InstanceNotFound`; `Ok(None)` is upstream's `(nil, nil)`.
    pub fn into_metadata(self) -> Result<Option<InstanceMetadata>, ProviderError> {
        if self.exists == Some(false) {
            return Err(ProviderError::instance_not_found()
                .context(format!("{INSTANCES_BATCH} answered exists: false")));
        }
        Ok(self.metadata.flatten())
    }
}

/// The answer when the batch a caller waited for was abandoned (the runtime shut down).
fn abandoned() -> ProviderError {
    ProviderError::cancelled(format!("{INSTANCES_BATCH}: the batch was abandoned"))
}

/// A batch-level error as every node's error: a "not found" of the whole call is not about any
/// one node.
fn batch_error(e: ProviderError) -> ProviderError {
    if e.is_not_found() {
        ProviderError::other(format!("{INSTANCES_BATCH} failed: {}", e.message()))
    } else {
        e
    }
}

impl Provider {
    /// Whether the provider answers many nodes in one call (ABI 1.1 `BULK_INSTANCES`). Without
    /// it the controllers ask node by node, as upstream.
    pub fn bulk_instances(&self) -> bool {
        self.ext_capabilities()
            .contains(ExtCapabilities::BULK_INSTANCES)
    }

    fn count_lookup(&self, hit: bool) {
        let bulk = &self.inner.metrics.bulk;
        let labels = CallerLabels {
            caller: self.caller,
        };
        if hit {
            bulk.cache_hits.get_or_create(&labels).inc();
        } else {
            bulk.cache_misses.get_or_create(&labels).inc();
        }
    }

    /// Answers to `query` for every node, in order: from the cache when young enough for
    /// `cache`, else from the cloud in as few `InstancesBatch` calls as the batch size allows
    /// (shared with whatever other callers ask at the same time). Needs
    /// [`Provider::bulk_instances`]; without it every answer is a `NotImplemented` error.
    pub async fn instance_answers(
        &self,
        nodes: &[Arc<CachedNode>],
        query: InstanceQuery,
        cache: CacheUse,
    ) -> Vec<Result<InstanceAnswer, ProviderError>> {
        if !self.bulk_instances() {
            return nodes
                .iter()
                .map(|_| Err(unsupported("bulk instance lookups")))
                .collect();
        }
        let asked = self.ask(nodes.iter().cloned(), query, cache, true);
        let mut out = Vec::with_capacity(asked.len());
        for a in asked {
            out.push(match a {
                Asked::Hit(answer) => Ok(answer),
                Asked::Waiting(Some(rx)) => rx.await.unwrap_or_else(|_| Err(abandoned())),
                Asked::Waiting(None) => Err(abandoned()),
            });
        }
        out
    }

    /// Start asking about `nodes` without waiting (bulk providers only; nothing otherwise):
    /// nodes already answered young enough for `cache`, or already in a batch, are left out.
    /// The answers are kept as `cache.keep_for` says, for whoever asks next.
    pub fn prefetch_instances(
        &self,
        nodes: impl IntoIterator<Item = Arc<CachedNode>>,
        query: InstanceQuery,
        cache: CacheUse,
    ) {
        if self.bulk_instances() {
            self.ask(nodes, query, cache, false);
        }
    }

    /// `InstanceMetadata` through the cache (answers younger than `cache.max_age`) and, for a
    /// bulk provider, through a batch; else the per-node `InstanceMetadata`. A batch's
    /// `exists: false` is `InstanceNotFound`, as the per-node method answers.
    pub async fn instance_metadata_cached(
        &self,
        node: &Arc<CachedNode>,
        cache: CacheUse,
    ) -> Result<Option<InstanceMetadata>, ProviderError> {
        let query = InstanceQuery::METADATA;
        if self.bulk_instances() {
            return self
                .instance_answers(std::slice::from_ref(node), query, cache)
                .await
                .pop()
                .unwrap_or_else(|| Err(abandoned()))?
                .into_metadata();
        }
        if let Some(answer) = self.inner.instance_cache.get(node, query, cache.max_age) {
            self.count_lookup(true);
            return Ok(answer.metadata.flatten());
        }
        self.count_lookup(false);
        let generation = self.inner.instance_cache.generation();
        let md = self.instance_metadata(node).await?;
        if !cache.keep_for.is_zero() {
            let answer = InstanceAnswer {
                metadata: Some(md.clone()),
                ..Default::default()
            };
            self.inner
                .instance_cache
                .put(node, &answer, cache.keep_for, generation);
        }
        Ok(md)
    }

    /// Put every node into a batch (or answer it from the cache), under one lock; start the
    /// batches that became full and the window of a newly opened one.
    fn ask(
        &self,
        nodes: impl IntoIterator<Item = Arc<CachedNode>>,
        query: InstanceQuery,
        cache: CacheUse,
        want_answers: bool,
    ) -> Vec<Asked> {
        // Existence is always asked: a batch answer without it could not tell "no metadata"
        // from "no instance".
        let query = query.with(InstanceQuery::EXISTS);
        let batcher = &self.inner.batcher;
        let mut out = Vec::new();
        let mut full = Vec::new();
        let mut opened = None;
        {
            let mut guard = batcher.lock();
            let state = &mut *guard;
            let generation = self.inner.instance_cache.generation();
            for node in nodes {
                let key = node_key(&node);
                let slots = state.waiting.entry(key.clone()).or_default();
                let joined = slots
                    .iter()
                    .position(|s| s.sent && s.generation == generation && s.query.contains(query))
                    .or_else(|| slots.iter().position(|s| !s.sent));
                if let Some(i) = joined {
                    let slot = &mut slots[i];
                    if !slot.sent {
                        slot.query = slot.query.with(query);
                        if let Some(open) = &mut state.open {
                            open.query = open.query.with(query);
                        }
                    }
                    slot.keep_for = slot.keep_for.max(cache.keep_for);
                    out.push(Asked::Waiting(want_answers.then(|| {
                        let (tx, rx) = oneshot::channel();
                        slot.waiters.push(tx);
                        rx
                    })));
                    continue;
                }
                // The cache is read under the batcher's lock: a batch keeps its answers
                // before it forgets its nodes, so a node is either still waiting or answered.
                if let Some(answer) = self.inner.instance_cache.get(&node, query, cache.max_age) {
                    if slots.is_empty() {
                        state.waiting.remove(&key);
                    }
                    out.push(Asked::Hit(answer));
                    continue;
                }
                let open = state.open.get_or_insert_with(|| {
                    let id = state.next_id;
                    state.next_id += 1;
                    opened = Some(id);
                    Batch {
                        id,
                        caller: self.caller,
                        nodes: Vec::new(),
                        query,
                        generation,
                    }
                });
                open.query = open.query.with(query);
                let mut waiters = Vec::new();
                out.push(Asked::Waiting(want_answers.then(|| {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    rx
                })));
                slots.push(Slot {
                    batch: open.id,
                    sent: false,
                    generation,
                    query,
                    keep_for: cache.keep_for,
                    waiters,
                });
                open.nodes.push((key, node));
                if open.nodes.len() >= batcher.max {
                    if let Some(batch) = Self::seal(state, generation) {
                        full.push(batch);
                    }
                }
            }
        }
        if want_answers {
            for a in &out {
                self.count_lookup(matches!(a, Asked::Hit(_)));
            }
        }
        for batch in full {
            let this = self.clone();
            tokio::spawn(async move { this.send(batch).await });
        }
        if let Some(id) = opened {
            let (this, window) = (self.clone(), batcher.window);
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                let batch = {
                    let mut state = this.inner.batcher.lock();
                    match &state.open {
                        Some(open) if open.id == id => {
                            Self::seal(&mut state, this.inner.instance_cache.generation())
                        }
                        _ => None,
                    }
                };
                if let Some(batch) = batch {
                    this.send(batch).await;
                }
            });
        }
        out
    }

    /// Close the open batch: its nodes now wait for its answer, which answers the union of
    /// what was asked about them, learned in the cache's `generation` (the current one).
    fn seal(state: &mut State, generation: u64) -> Option<Batch> {
        let mut batch = state.open.take()?;
        batch.generation = generation;
        for (key, _) in &batch.nodes {
            if let Some(slot) = state
                .waiting
                .get_mut(key)
                .and_then(|slots| slots.iter_mut().find(|s| s.batch == batch.id))
            {
                slot.sent = true;
                slot.generation = generation;
                slot.query = batch.query;
            }
        }
        Some(batch)
    }

    /// Make the batch's call (when its turn comes) and hand every node its answer.
    async fn send(&self, batch: Batch) {
        let batcher = &self.inner.batcher;
        let permit = batcher.permits.clone().acquire_owned().await.ok();
        let nodes: Vec<Arc<CachedNode>> = batch.nodes.iter().map(|(_, n)| n.clone()).collect();
        self.inner
            .metrics
            .bulk
            .batch_size
            .observe(nodes.len() as f64);
        let result = self
            .for_caller(batch.caller)
            .instances_batch(&nodes, batch.query)
            .await;
        drop(permit);
        let answers: Vec<Answer> = match result {
            Ok(statuses) => {
                let epoch = self.inner.throttle.epoch();
                let mut pause: Option<ProviderError> = None;
                statuses
                    .into_iter()
                    .map(|s| match s {
                        Ok(status) => Ok(InstanceAnswer::of(status, batch.query)),
                        Err(e) if e.throttle_delay().is_some() => {
                            // One throttling signal per batch, however many nodes carry it.
                            let first = pause
                                .get_or_insert_with(|| {
                                    self.throttled(INSTANCES_BATCH, epoch, e.clone())
                                })
                                .clone();
                            Err(match first.throttle_delay() {
                                Some(delay) => ProviderError::throttled(
                                    format!(
                                        "cloud provider throttled {INSTANCES_BATCH}: {}",
                                        e.message()
                                    ),
                                    delay,
                                ),
                                // A 1.0 plugin: an ordinary error.
                                None => first,
                            })
                        }
                        Err(e) => Err(e),
                    })
                    .collect()
            }
            Err(e) => {
                let e = batch_error(e);
                nodes.iter().map(|_| Err(e.clone())).collect()
            }
        };
        let mut state = batcher.lock();
        for ((key, node), answer) in batch.nodes.iter().zip(answers) {
            let Some(slots) = state.waiting.get_mut(key) else {
                continue;
            };
            let Some(i) = slots.iter().position(|s| s.batch == batch.id) else {
                continue;
            };
            let slot = slots.swap_remove(i);
            if slots.is_empty() {
                state.waiting.remove(key);
            }
            if let Ok(answer) = &answer {
                self.inner
                    .instance_cache
                    .put(node, answer, slot.keep_for, batch.generation);
            }
            for waiter in slot.waiters {
                let _ = waiter.send(answer.clone());
            }
        }
    }

    /// One `InstancesBatch` call through the call path: one answer per node, in order (a
    /// count that differs is an error of the call). Outside the batches and the cache: the
    /// controllers use [`Provider::instance_answers`]; `ccm-host check` compares this with the
    /// per-node methods.
    pub async fn instances_batch(
        &self,
        nodes: &[impl NodeRef],
        query: InstanceQuery,
    ) -> Result<Vec<Result<InstanceStatus, ProviderError>>, ProviderError> {
        let ext = self
            .ext()
            .ok_or_else(|| unsupported("bulk instance lookups"))?;
        let json = nodes_json(nodes)?;
        let asked = json.len();
        let answers = self
            .call(INSTANCES_BATCH, move |ctx| {
                let answers = ext.instances_batch(ctx, json.as_slice().into(), query);
                let len = json.len();
                release_hosts(json, len);
                answers.map(|v| {
                    v.into_iter()
                        .map(|a| a.into_result().map(InstanceStatus::from))
                        .collect::<Vec<_>>()
                })
            })
            .await?;
        if answers.len() != asked {
            return Err(ProviderError::other(format!(
                "{INSTANCES_BATCH} answered {} nodes, asked about {asked}",
                answers.len()
            )));
        }
        Ok(answers)
    }
}
