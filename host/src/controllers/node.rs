//! The cloud-node controller (canonical `cloud-node-controller`, alias `cloud-node`;
//! docs/upstream-compat.md#node-controller): initialises nodes that carry the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint from the cloud's instance metadata
//! (provider ID, instance-type / zone / region labels, additional labels, addresses), removes
//! the taint, keeps the GA labels of initialised nodes equal to their beta labels, and refreshes
//! node addresses every `--node-status-update-frequency`.
//!
//! Mechanics: node Add/Update changes from the shared informer enqueue the node name on the
//! `Nodes` work queue; `concurrent_node_syncs` workers run [`NodeController::sync_node`]. Failed
//! syncs are re-queued with upstream's default controller rate limiter: per-node exponential
//! backoff 5ms → 1000s combined (max of both) with an overall 10 qps / burst 100 token bucket.
//! A sync the cloud throttled (beyond upstream: ABI 1.1 `THROTTLED`) is re-queued after the
//! provider's pause instead, without counting a failure, and the node gets a
//! `CloudProviderThrottled` Warning event (also from the address loop).
//!
//! Deliberate differences from upstream (docs/upstream-compat.md#node-controller, with the
//! reasons), each marked in the code:
//! - nil instance metadata in the periodic address loop is skipped (upstream dereferences it);
//! - the initialisation update re-reads the node from the API (not the cache) after a Conflict,
//!   so a retry does not replay the same stale object; a node deleted meanwhile ends the sync
//!   quietly instead of erroring and re-queueing, and one found already initialised (no cloud
//!   taint; providerID and labels as the cloud gives them: an earlier sync initialised it
//!   while the cache lagged behind) ends it without a second update or `Synced` event;
//! - the provider ID is only written when the node being updated still has none (upstream
//!   decides on the first copy and could try to overwrite an ID set meanwhile, which the API
//!   rejects);
//! - address change detection also catches changes within a repeated address type (see
//!   [`super::node_addresses::addresses_changed`]);
//! - `concurrent_node_syncs = 0` is refused at start instead of silently doing nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_abi::{ErrorKind, InstanceMetadata, ProviderError};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};
use kube::api::PostParams;
use kube::Api;
use tokio::sync::broadcast;

use super::node_addresses::{
    addresses_changed, apply_node_ip, desired_addresses, is_reserved_label_key,
    label_reconciliation,
};
use super::sync_error::{Requeue, SyncError};
use super::{
    publish_throttled, Controller, ControllerConfig, ControllerContext, ControllerName, NotStarted,
    Start,
};
use crate::provider::{CacheUse, InstanceAnswer, InstanceQuery, Provider};
use crate::runtime::events::{node_ref, EventRecorder, EventType};
use crate::runtime::informer::Change;
use crate::runtime::patches::{is_conflict, is_not_found, patch_node_addresses, patch_node_labels};
use crate::runtime::well_known::{
    INSTANCE_TYPE_BETA_LABEL, INSTANCE_TYPE_LABEL, PROVIDED_NODE_IP_ANNOTATION, REGION_BETA_LABEL,
    REGION_LABEL, UNINITIALIZED_TAINT, ZONE_BETA_LABEL, ZONE_LABEL,
};
use crate::runtime::workqueue::WorkQueue;
use crate::runtime::CachedNode;

/// Canonical controller name.
pub const NAME: &str = "cloud-node-controller";
/// Alias (also the `running_managed_controllers` name).
pub const ALIAS: &str = "cloud-node";
/// Event source component.
pub const COMPONENT: &str = "cloud-node-controller";
/// Work queue name.
pub const QUEUE: &str = "Nodes";
/// Per-node backoff of the work queue (client-go's default controller rate limiter).
const BACKOFF_BASE: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1000);
/// The overall bucket of the default controller rate limiter.
const BUCKET_QPS: f64 = 10.0;
const BUCKET_BURST: f64 = 100.0;
/// Retries of the initialisation update on Conflict (upstream `UpdateNodeSpecBackoff`).
const UPDATE_ATTEMPTS: u32 = 20;
const UPDATE_BACKOFF: Duration = Duration::from_millis(50);

/// Start conditions: the provider must offer Instances or InstancesV2.
pub fn check(ctx: &ControllerContext) -> Result<(), NotStarted> {
    let caps = ctx.provider.capabilities();
    if !caps.instances && !caps.instances_v2 {
        return Err(NotStarted(
            "cloud provider does not support instances".into(),
        ));
    }
    // Upstream accepts 0 and then never processes a node (docs/upstream-compat.md#upstream-sharp-edges); refuse it instead.
    if ctx.config.concurrent_node_syncs == 0 {
        return Err(NotStarted(
            "--concurrent-node-syncs is 0: no node would ever be initialised; use 1 or more".into(),
        ));
    }
    Ok(())
}

/// The cloud-node controller in the start-up table ([`super::CONTROLLERS`]).
pub const CONTROLLER: Controller = Controller {
    name: ControllerName {
        canonical: NAME,
        alias: ALIAS,
        client: "node-controller",
    },
    start: |ctx| Start::when(check(ctx), || run(ctx.clone())),
};

/// Run until `ctx.stop` is cancelled.
pub async fn run(ctx: ControllerContext) {
    let controller = Arc::new(NodeController::new(ctx.clone()));
    let mut changes = ctx.nodes.subscribe();
    tokio::select! {
        _ = ctx.stop.cancelled() => return,
        synced = ctx.nodes.wait_synced() => if !synced { return },
    }
    ctx.metrics.set_running(ALIAS, true);
    let queue = controller.queue.clone();
    // The informer's initial list may have been delivered before we subscribed: enqueue every
    // cached node once (upstream's AddFunc for the initial list).
    let initial = ctx.nodes.list();
    prefetch(&ctx.provider, &ctx.config, initial.iter().cloned());
    for node in initial {
        if let Some(name) = node.name_str() {
            queue.add(name.to_string());
        }
    }

    let mut tasks = tokio::task::JoinSet::new();
    // Event handler: Add and Update enqueue the (new) node; no Delete handler.
    {
        let (queue, nodes, stop) = (queue.clone(), ctx.nodes.clone(), ctx.stop.clone());
        let (provider, config) = (ctx.provider.clone(), ctx.config.clone());
        crate::controllers::spawn_in_span(&mut tasks, async move {
            loop {
                let change = tokio::select! {
                    _ = stop.cancelled() => break,
                    c = changes.recv() => c,
                };
                match change {
                    Ok(Change::Added(n)) => {
                        // Before the worker can take it, so it finds the lookup under way.
                        prefetch(&provider, &config, [n.clone()]);
                        if let Some(name) = n.name_str() {
                            queue.add(name.to_string());
                        }
                    }
                    Ok(Change::Updated { new: n, .. }) => {
                        if let Some(name) = n.name_str() {
                            queue.add(name.to_string());
                        }
                    }
                    Ok(Change::Deleted(_)) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let all = nodes.list();
                        prefetch(&provider, &config, all.iter().cloned());
                        for n in all {
                            if let Some(name) = n.name_str() {
                                queue.add(name.to_string());
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
    }
    // Workers.
    for _ in 0..ctx.config.concurrent_node_syncs.max(1) {
        let (c, stop) = (controller.clone(), ctx.stop.clone());
        crate::controllers::spawn_in_span(&mut tasks, async move {
            while let Some(name) = c.queue.get().await {
                tokio::select! {
                    _ = stop.cancelled() => { c.queue.done(&name); break; }
                    _ = c.process(&name) => {}
                }
                c.queue.done(&name);
            }
        });
    }
    // Periodic address loop: first pass now, then `period` after the end of each pass.
    {
        let (c, stop) = (controller.clone(), ctx.stop.clone());
        let period = ctx.config.node_status_update_frequency;
        crate::controllers::spawn_in_span(&mut tasks, async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = c.update_node_status() => {}
                }
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(period) => {}
                }
            }
        });
    }
    ctx.stop.cancelled().await;
    queue.shutdown();
    while tasks.join_next().await.is_some() {}
    ctx.metrics.set_running(ALIAS, false);
}

/// A token bucket like golang.org/x/time/rate's `Reserve().Delay()`: every reservation takes a
/// token, going into debt when empty; the delay is the time until the debt is repaid.
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn reserve(&mut self) -> Duration {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * BUCKET_QPS;
        self.tokens = (self.tokens + refill).min(BUCKET_BURST);
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / BUCKET_QPS)
        }
    }
}

/// The controller's state: context, event recorder, queue.
pub struct NodeController {
    ctx: ControllerContext,
    recorder: EventRecorder,
    /// The `Nodes` queue (keys are node names).
    pub queue: WorkQueue<String>,
    bucket: Mutex<Bucket>,
}

fn has_cloud_taint(node: &CachedNode) -> bool {
    node.taints().iter().any(|t| t.key == UNINITIALIZED_TAINT)
}

fn name_of(node: &CachedNode) -> &str {
    node.name()
}

fn provider_id_of(node: &CachedNode) -> &str {
    node.provider_id().unwrap_or_default()
}

fn addresses_of(node: &CachedNode) -> &[NodeAddress] {
    node.addresses().unwrap_or_default()
}

/// Seconds since the node's creation (0 when unknown).
fn seconds_since_creation(node: &CachedNode) -> f64 {
    node.creation_timestamp()
        .map(|t| {
            k8s_openapi::jiff::Timestamp::now()
                .duration_since(t.0)
                .as_secs_f64()
                .max(0.0)
        })
        .unwrap_or(0.0)
}

/// The message of an API error (the Status message for API answers).
pub(crate) fn kube_error_text(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// A provider error as a node sync error: its text, and whether it was throttled (a `RetryError`
/// is not honoured here, as upstream's node controller does not).
fn provider_error(e: &ProviderError) -> SyncError {
    SyncError::mentioning(e.to_string(), e)
}

/// The first error of a by-provider-ID / by-name pair was throttled: the fallback is not tried
/// (it would only wait for the same pause); the sync is retried after it.
fn throttled_first(e: &ProviderError) -> bool {
    e.kind() == ErrorKind::THROTTLED
}

/// Upstream `GetInstanceProviderID`: `<ProviderName()>://<InstanceID(node)>`. `NotImplemented`
/// and `InstanceNotFound` are returned unchanged (callers test the kind); other errors are
/// wrapped as "failed to get instance ID from cloud provider: …". An empty instance ID yields
/// `"<provider>://"`, as upstream.
pub async fn get_instance_provider_id(
    provider: &Provider,
    node_name: &str,
) -> Result<String, ProviderError> {
    if !provider.capabilities().instances {
        return Err(ProviderError::other(
            "failed to get instances from cloud provider",
        ));
    }
    match provider.instance_id(node_name).await {
        Ok(id) => Ok(format!("{}://{id}", provider.provider_name())),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::NOT_IMPLEMENTED | ErrorKind::INSTANCE_NOT_FOUND
            ) =>
        {
            Err(e)
        }
        Err(e) => Err(e.context("failed to get instance ID from cloud provider")),
    }
}

/// Upstream `getInstanceMetadata` (initialisation path). `Ok(None)` is a V2 provider's
/// `(nil, nil)`. Asks the cloud with the per-node methods (also for a bulk provider: the
/// conformance kit tests them), never the cache.
pub async fn get_instance_metadata(
    provider: &Provider,
    node: &Node,
) -> Result<Option<InstanceMetadata>, String> {
    instance_metadata(provider, &Arc::new(CachedNode::from(node.clone())), None)
        .await
        .map_err(|e| e.to_string())
}

/// How initialisation uses the provider's instance cache: it accepts answers younger than
/// `--node-status-update-frequency` (the address loop would not correct an older one sooner;
/// a bulk provider answered them when the node appeared, see [`prefetch`]) and keeps what it
/// learns as long, so the address loop's next pass does not ask again.
pub fn init_cache_use(config: &ControllerConfig) -> CacheUse {
    CacheUse {
        max_age: config.node_status_update_frequency,
        keep_for: config.node_status_update_frequency,
    }
}

/// How the address loop uses the instance cache: answers younger than its period
/// (`--node-status-update-frequency`), so no address is older than upstream's; it keeps
/// nothing (its next pass wants newer answers).
pub fn address_cache_use(config: &ControllerConfig) -> CacheUse {
    CacheUse::read(config.node_status_update_frequency)
}

/// With a bulk provider, start looking up the tainted ones of `nodes` at once, in batches
/// (beyond upstream): the workers then find the answers in the cache, or join the batch under
/// way, so N new nodes cost about N / `--instance-batch-size` calls whatever the number of
/// workers. Nothing for other providers.
fn prefetch(
    provider: &Provider,
    config: &ControllerConfig,
    nodes: impl IntoIterator<Item = Arc<CachedNode>>,
) {
    if provider.bulk_instances() {
        provider.prefetch_instances(
            nodes.into_iter().filter(|n| has_cloud_taint(n)),
            InstanceQuery::METADATA,
            init_cache_use(config),
        );
    }
}

/// [`get_instance_metadata`], telling a throttled call apart. With `cache`, through the
/// provider's instance cache as it says and, for a bulk provider, in a batch.
async fn instance_metadata(
    provider: &Provider,
    node: &Arc<CachedNode>,
    cache: Option<CacheUse>,
) -> Result<Option<InstanceMetadata>, SyncError> {
    let name = name_of(node);
    let caps = provider.capabilities();
    let batched = cache.is_some() && provider.bulk_instances();
    if caps.instances_v2 || batched {
        let md = match cache {
            Some(cache) => provider.instance_metadata_cached(node, cache).await,
            None => provider.instance_metadata(node).await,
        }
        .map_err(|e| provider_error(&e))?;
        return match md {
            Some(mut md) if md.provider_id.is_empty() => {
                if provider_id_of(node).is_empty() {
                    return Err(format!(
                        "cloud provider does not set node provider ID for node {name}"
                    )
                    .into());
                }
                md.provider_id = provider_id_of(node).to_string();
                Ok(Some(md))
            }
            other => Ok(other),
        };
    }
    if !caps.instances {
        return Err("failed to get instances from cloud provider".into());
    }
    let mut provider_id = provider_id_of(node).to_string();
    if provider_id.is_empty() {
        match get_instance_provider_id(provider, name).await {
            Ok(id) => provider_id = id,
            // The only case where initialisation continues without a provider ID.
            Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => {
                tracing::warn!(controller = NAME, node = name, "cloud provider does not implement InstanceID; initialising without a provider ID");
            }
            Err(e) => return Err(provider_error(&e)),
        }
    }
    let node_addresses = addresses_by_provider_id_or_name(provider, &provider_id, name).await?;
    let instance_type = match provider.instance_type_by_provider_id(&provider_id).await {
        Ok(t) => t,
        Err(by_id) if throttled_first(&by_id) => return Err(provider_error(&by_id)),
        Err(by_id) => provider.instance_type(name).await.map_err(|by_name| {
            SyncError::mentioning(format!(
                "InstanceType: Error fetching by providerID: {by_id} Error fetching by NodeName: {by_name}"
            ), &by_name)
        })?,
    };
    let mut md = InstanceMetadata {
        provider_id: provider_id.clone(),
        instance_type,
        node_addresses,
        ..Default::default()
    };
    if caps.zones {
        let zone = match provider.get_zone_by_provider_id(&provider_id).await {
            Ok(z) => z,
            Err(by_id) if throttled_first(&by_id) => {
                return Err(provider_error(&by_id)
                    .context("failed to get zone from cloud provider"))
            }
            Err(by_id) => provider.get_zone_by_node_name(name).await.map_err(|by_name| {
                SyncError::mentioning(format!(
                    "failed to get zone from cloud provider: Zone: Error fetching by providerID: {by_id} Error fetching by NodeName: {by_name}"
                ), &by_name)
            })?,
        };
        if !zone.failure_domain.is_empty() {
            md.zone = zone.failure_domain;
        }
        if !zone.region.is_empty() {
            md.region = zone.region;
        }
    }
    Ok(Some(md))
}

/// `NodeAddressesByProviderID` (even with an empty ID, as upstream), falling back to
/// `NodeAddresses(name)`.
async fn addresses_by_provider_id_or_name(
    provider: &Provider,
    provider_id: &str,
    name: &str,
) -> Result<Vec<NodeAddress>, SyncError> {
    match provider.node_addresses_by_provider_id(provider_id).await {
        Ok(a) => Ok(a),
        Err(by_id) if throttled_first(&by_id) => Err(provider_error(&by_id)),
        Err(by_id) => provider.node_addresses(name).await.map_err(|by_name| {
            SyncError::mentioning(
                format!(
                    "error fetching node by provider ID: {by_id}, and error by node name: {by_name}"
                ),
                &by_name,
            )
        }),
    }
}

/// The changes initialisation makes to a node (upstream's list of node modifiers), applied to
/// whatever version of the node is current when the update is sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeModifications {
    /// Set `spec.providerID` (only if the node still has none).
    pub provider_id: Option<String>,
    /// Labels set unconditionally (instance type, zone, region; beta + GA).
    pub labels: BTreeMap<String, String>,
    /// AdditionalLabels that survived the reserved-namespace filter; added only when absent.
    pub additional_labels: BTreeMap<String, String>,
}

impl NodeModifications {
    /// Would [`Self::apply`] change nothing on `node`: no cloud taint, the providerID set (when
    /// there is one to set), every label present with the cloud's value (additional labels:
    /// present)?
    pub fn already_applied(&self, node: &CachedNode) -> bool {
        let provider_id_set = self.provider_id.is_none() || !provider_id_of(node).is_empty();
        !has_cloud_taint(node)
            && provider_id_set
            && self
                .labels
                .iter()
                .all(|(k, v)| node.label(k) == Some(v.as_str()))
            && self
                .additional_labels
                .keys()
                .all(|k| node.label(k).is_some())
    }

    /// Apply to `node`, removing every taint keyed [`UNINITIALIZED_TAINT`] (other taints keep
    /// their order; the list may become empty).
    pub fn apply(&self, node: &mut Node) {
        let spec = node.spec.get_or_insert_with(Default::default);
        if let Some(id) = &self.provider_id {
            // Better than upstream: never try to change an ID set since we read the node (the
            // API rejects it as immutable, which would fail the sync forever).
            if spec.provider_id.as_deref().unwrap_or_default().is_empty() {
                spec.provider_id = Some(id.clone());
            }
        }
        let taints: Vec<Taint> = spec
            .taints
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != UNINITIALIZED_TAINT)
            .collect();
        spec.taints = Some(taints);
        if self.labels.is_empty() && self.additional_labels.is_empty() {
            return;
        }
        let labels = node.metadata.labels.get_or_insert_with(Default::default);
        for (k, v) in &self.labels {
            labels.insert(k.clone(), v.clone());
        }
        for (k, v) in &self.additional_labels {
            match labels.get(k) {
                Some(existing) => {
                    if existing != v {
                        tracing::warn!(controller = NAME, label = %k, existing = %existing, cloud = %v, "node already has the label with another value; keeping the node's value");
                    }
                }
                None => {
                    labels.insert(k.clone(), v.clone());
                }
            }
        }
    }
}

/// Upstream `getNodeModifiersFromCloudProvider` (the taint removal is in
/// [`NodeModifications::apply`]). Fails when the node-IP annotation does not fit the cloud's
/// addresses.
pub fn node_modifications(
    node: &CachedNode,
    md: &InstanceMetadata,
) -> Result<NodeModifications, String> {
    let name = name_of(node);
    let mut m = NodeModifications::default();
    if provider_id_of(node).is_empty() {
        if md.provider_id.is_empty() {
            tracing::warn!(
                controller = NAME,
                node = name,
                "cloud provider gave no provider ID; node initialised without one"
            );
        } else {
            m.provider_id = Some(md.provider_id.clone());
        }
    }
    // Validated against the cloud's addresses only (no kubelet Hostname), before untainting.
    apply_node_ip(
        node.annotation(PROVIDED_NODE_IP_ANNOTATION),
        md.node_addresses.clone(),
    )
    .map_err(|e| format!("provided node ip for node {name:?} is not valid: {e}"))?;
    let mut set = |beta: &str, ga: &str, value: &str| {
        if !value.is_empty() {
            m.labels.insert(beta.to_string(), value.to_string());
            m.labels.insert(ga.to_string(), value.to_string());
        }
    };
    set(
        INSTANCE_TYPE_BETA_LABEL,
        INSTANCE_TYPE_LABEL,
        &md.instance_type,
    );
    set(ZONE_BETA_LABEL, ZONE_LABEL, &md.zone);
    set(REGION_BETA_LABEL, REGION_LABEL, &md.region);
    for (k, v) in &md.additional_labels {
        if is_reserved_label_key(k) {
            tracing::warn!(controller = NAME, node = name, label = %k, "dropping additional label in a reserved kubernetes.io / k8s.io namespace");
            continue;
        }
        m.additional_labels.insert(k.clone(), v.clone());
    }
    Ok(m)
}

/// How [`NodeController::update_with_retry`] ended.
enum Initialised {
    /// This sync initialised the node: the API server's answer.
    Now(Box<Node>),
    /// The node no longer exists.
    Gone,
    /// The node read again after a Conflict was already initialised
    /// ([`NodeModifications::already_applied`]).
    Already,
}

impl NodeController {
    /// A controller for `ctx` (does not start anything).
    pub fn new(ctx: ControllerContext) -> Self {
        let recorder = ctx.recorder(COMPONENT);
        let queue = WorkQueue::new(&ctx.queue_name(QUEUE), BACKOFF_BASE, BACKOFF_MAX)
            .with_metrics(&ctx.metrics.workqueue);
        Self {
            ctx,
            recorder,
            queue,
            bucket: Mutex::new(Bucket {
                tokens: BUCKET_BURST,
                last: Instant::now(),
            }),
        }
    }

    /// Sync one key and requeue it on failure, as upstream's `processNextWorkItem`. A throttled
    /// sync is re-queued after the provider's pause with its failure count unchanged (not
    /// forgotten, not rate-limited).
    async fn process(&self, name: &String) {
        let result = self.sync_node(name).await;
        let requeue = Requeue::of(&result);
        let mut overall = Duration::ZERO;
        match (&result, requeue) {
            (Err(e), Requeue::Throttled(_)) => {
                if let (Some(throttled), Some(node)) =
                    (e.throttled(), self.ctx.nodes.store().get(name))
                {
                    publish_throttled(&self.recorder, node_ref(&node), throttled);
                }
            }
            (Err(e), _) => {
                overall = self
                    .bucket
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .reserve();
                tracing::info!(controller = NAME, node = %name, "error syncing '{name}': {e}, requeuing");
            }
            (Ok(()), _) => {}
        }
        requeue.apply(&self.queue, name, overall);
    }

    /// Upstream `syncNode`: initialise a tainted node, or reconcile the labels of an
    /// initialised one. A node missing from the cache is done.
    pub async fn sync_node(&self, name: &str) -> Result<(), SyncError> {
        let Some(cur) = self.ctx.nodes.store().get(name) else {
            return Ok(());
        };
        if !has_cloud_taint(&cur) {
            return Ok(self.reconcile_labels(&cur).await?);
        }
        let md = instance_metadata(
            &self.ctx.provider,
            &cur,
            Some(init_cache_use(&self.ctx.config)),
        )
        .await
        .map_err(|e| e.context(format!("failed to get instance metadata for node {name}")))?;
        let Some(md) = md else {
            // Kept as upstream (docs/upstream-compat.md#upstream-sharp-edges): the node stays tainted and is retried only when a
            // later event re-enqueues it (the provider said it cannot describe it yet).
            tracing::info!(
                controller = NAME,
                node = name,
                "skip sync node {name} because cloud provided nil metadata"
            );
            return Ok(());
        };
        let mods = node_modifications(&cur, &md)
            .map_err(|e| format!("failed to get node modifiers from cloud provider: {e}"))?;
        let updated = match self.update_with_retry(&cur, &mods).await? {
            Initialised::Now(updated) => CachedNode::from(*updated),
            Initialised::Gone => {
                tracing::info!(
                    controller = NAME,
                    node = name,
                    "node was deleted during initialisation"
                );
                return Ok(());
            }
            Initialised::Already => {
                tracing::debug!(
                    controller = NAME,
                    node = name,
                    "node {name} was initialised by an earlier sync the cache had not shown yet"
                );
                return Ok(());
            }
        };
        self.ctx
            .metrics
            .node_taint_removal_delay
            .observe(seconds_since_creation(&updated));
        // Addresses right away, so users do not wait for the periodic loop.
        self.update_node_address(&updated, &md).await;
        tracing::info!(
            controller = NAME,
            node = name,
            "successfully initialized node {name} with cloud provider"
        );
        self.recorder.publish(
            node_ref(&cur),
            EventType::Normal,
            "Synced",
            "Node synced successfully",
        );
        self.ctx
            .metrics
            .node_initial_sync_delay
            .observe(seconds_since_creation(&cur));
        Ok(())
    }

    /// One full PUT of the node with `mods` applied, retried on Conflict.
    async fn update_with_retry(
        &self,
        cached: &CachedNode,
        mods: &NodeModifications,
    ) -> Result<Initialised, String> {
        let name = name_of(cached);
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        let mut base = cached.to_node();
        for attempt in 1..=UPDATE_ATTEMPTS {
            let mut node = base.clone();
            mods.apply(&mut node);
            match api.replace(name, &PostParams::default(), &node).await {
                Ok(updated) => return Ok(Initialised::Now(Box::new(updated))),
                Err(e) if is_not_found(&e) => return Ok(Initialised::Gone),
                Err(e) if is_conflict(&e) && attempt < UPDATE_ATTEMPTS => {
                    let jitter = f64::from(attempt.wrapping_mul(37) % 100) / 100.0;
                    tokio::time::sleep(UPDATE_BACKOFF.mul_f64(1.0 + jitter)).await;
                    // Better than upstream: read the current version from the API, not the
                    // cache, which may still hold the version that conflicted.
                    base = match api.get(name).await {
                        // The cache was behind: an earlier sync of this node (queued again
                        // by a change the cache delivered before its own update) already
                        // initialised it: the changes would change nothing. Applying them
                        // again would repeat the PUT, the address patch and the Synced
                        // event. (A taint removed by hand leaves the labels or providerID
                        // to write: such a node is still initialised here.)
                        Ok(n) if mods.already_applied(&CachedNode::from(n.clone())) => {
                            return Ok(Initialised::Already)
                        }
                        Ok(n) => n,
                        Err(e) if is_not_found(&e) => return Ok(Initialised::Gone),
                        Err(e) => {
                            return Err(format!(
                                "failed to get node {name}: {}",
                                kube_error_text(&e)
                            ))
                        }
                    };
                }
                Err(e) => {
                    return Err(format!(
                        "failed to update node {name}: {}",
                        kube_error_text(&e)
                    ))
                }
            }
        }
        Err(format!(
            "failed to update node {name}: still conflicting after {UPDATE_ATTEMPTS} attempts"
        ))
    }

    /// Upstream `reconcileNodeLabels`: one label patch when a GA label differs from its beta.
    async fn reconcile_labels(&self, node: &CachedNode) -> Result<(), String> {
        let update = label_reconciliation(|k| node.label(k));
        if update.is_empty() {
            return Ok(());
        }
        let name = name_of(node);
        patch_node_labels(&self.ctx.client, name, &update)
            .await
            .map_err(|e| {
                format!(
                    "failed update labels for node {name}: {}",
                    kube_error_text(&e)
                )
            })
    }

    /// Upstream `updateNodeAddress`: patch `status.addresses` when the cloud's addresses (plus
    /// the kubelet's Hostname, with the node-IP rules applied) differ from the node's.
    pub async fn update_node_address(&self, node: &CachedNode, md: &InstanceMetadata) {
        let name = name_of(node);
        if has_cloud_taint(node) {
            tracing::debug!(
                controller = NAME,
                node = name,
                "node is still tainted; addresses not updated"
            );
            return;
        }
        let current = addresses_of(node);
        let new = match desired_addresses(
            &md.node_addresses,
            current,
            node.annotation(PROVIDED_NODE_IP_ANNOTATION),
        ) {
            None => {
                tracing::debug!(
                    controller = NAME,
                    node = name,
                    "cloud provider returned no addresses; keeping the node's"
                );
                return;
            }
            Some(Err(e)) => {
                tracing::error!(
                    controller = NAME,
                    node = name,
                    "failed to update node addresses for node {name:?}: {e}"
                );
                return;
            }
            Some(Ok(new)) => new,
        };
        if !addresses_changed(current, &new) {
            return;
        }
        if let Err(e) = patch_node_addresses(&self.ctx.client, name, current, &new).await {
            tracing::error!(
                controller = NAME,
                node = name,
                "error patching node with cloud ip addresses: {}",
                kube_error_text(&e)
            );
        }
    }

    /// Upstream `getInstanceNodeAddresses` (periodic loop): V2 → full metadata (through the
    /// instance cache: [`address_cache_use`]); legacy → addresses by provider ID with fallback
    /// by name (one call when the first succeeds).
    async fn instance_node_addresses(
        &self,
        node: &Arc<CachedNode>,
    ) -> Result<Option<InstanceMetadata>, SyncError> {
        let provider = &self.ctx.provider;
        let caps = provider.capabilities();
        if caps.instances_v2 {
            return provider
                .instance_metadata_cached(node, address_cache_use(&self.ctx.config))
                .await
                .map_err(|e| provider_error(&e));
        }
        if !caps.instances {
            return Err("failed to get instances from cloud provider".into());
        }
        let node_addresses =
            addresses_by_provider_id_or_name(provider, provider_id_of(node), name_of(node)).await?;
        Ok(Some(InstanceMetadata {
            node_addresses,
            ..Default::default()
        }))
    }

    /// One pass of the periodic address loop (upstream `UpdateNodeStatus`) over every cached
    /// node, `concurrent_node_status_updates` at a time (0 ⇒ `concurrent_node_syncs`). With a
    /// bulk provider (beyond upstream) the untainted nodes are looked up first, in batches,
    /// through the instance cache ([`address_cache_use`]); the addresses are then updated
    /// node by node as before.
    pub async fn update_node_status(&self) {
        let started = Instant::now();
        let nodes = self.ctx.nodes.list();
        let cfg = &self.ctx.config;
        let workers = cfg.node_status_workers();
        let count = nodes.len();
        if self.ctx.provider.bulk_instances() {
            let nodes: Vec<Arc<CachedNode>> =
                nodes.into_iter().filter(|n| !has_cloud_taint(n)).collect();
            let answers = self
                .ctx
                .provider
                .instance_answers(&nodes, InstanceQuery::METADATA, address_cache_use(cfg))
                .await;
            futures::stream::iter(nodes.iter().zip(answers))
                .for_each_concurrent(workers, |(node, answer)| async move {
                    self.on_instance_addresses(node, metadata_of_answer(answer))
                        .await;
                })
                .await;
            tracing::debug!(controller = NAME, nodes = count, elapsed = ?started.elapsed(), "node address update pass done");
            return;
        }
        futures::stream::iter(nodes)
            .for_each_concurrent(workers, |node| async move {
                if has_cloud_taint(&node) {
                    return; // syncNode handles it
                }
                self.on_instance_addresses(&node, self.instance_node_addresses(&node).await)
                    .await;
            })
            .await;
        tracing::debug!(controller = NAME, nodes = count, elapsed = ?started.elapsed(), "node address update pass done");
    }

    /// The address loop's handling of one node's answer: update the addresses, or log.
    async fn on_instance_addresses(
        &self,
        node: &CachedNode,
        answer: Result<Option<InstanceMetadata>, SyncError>,
    ) {
        match answer {
            Ok(Some(md)) => self.update_node_address(node, &md).await,
            // docs/upstream-compat.md#upstream-sharp-edges: upstream dereferences nil metadata here and crashes; skip.
            Ok(None) => {
                tracing::debug!(
                    controller = NAME,
                    node = name_of(node),
                    "cloud provided nil metadata; addresses not updated"
                )
            }
            // Throttled: the node's addresses are refreshed by the next pass, whose calls
            // wait for the pause.
            Err(e) if e.throttled().is_some() => {
                if let Some(throttled) = e.throttled() {
                    publish_throttled(&self.recorder, node_ref(node), throttled);
                }
            }
            Err(e) => {
                tracing::error!(
                    controller = NAME,
                    node = name_of(node),
                    "error getting instance metadata for node addresses: {e}"
                )
            }
        }
    }
}

/// The metadata in a bulk answer, as the per-node `InstanceMetadata` would answer it.
fn metadata_of_answer(
    answer: Result<InstanceAnswer, ProviderError>,
) -> Result<Option<InstanceMetadata>, SyncError> {
    answer
        .and_then(InstanceAnswer::into_metadata)
        .map_err(|e| provider_error(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::well_known::PROVIDED_NODE_IP_ANNOTATION;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    /// The cache's form of a node.
    fn c(n: &Node) -> CachedNode {
        CachedNode::from(n.clone())
    }

    fn taint(key: &str, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        }
    }

    fn node(provider_id: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("node0".into()),
                labels: (!labels.is_empty()).then(|| {
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                annotations: (!annotations.is_empty()).then(|| {
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: (!provider_id.is_empty()).then(|| provider_id.to_string()),
                taints: Some(vec![
                    taint("ImproveCoverageTaint", "NoSchedule"),
                    taint(UNINITIALIZED_TAINT, "NoSchedule"),
                    taint("other", "NoExecute"),
                ]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: a.into(),
        }
    }

    fn metadata() -> InstanceMetadata {
        InstanceMetadata {
            provider_id: "fake://12345".into(),
            instance_type: "t1.micro".into(),
            node_addresses: vec![
                addr("InternalIP", "10.0.0.1"),
                addr("ExternalIP", "132.143.154.163"),
            ],
            zone: "us-west-1a".into(),
            region: "us-west".into(),
            additional_labels: BTreeMap::from([
                ("my.custom.label/foo".to_string(), "bar".to_string()),
                ("kubernetes.io/foo".to_string(), "dropped".to_string()),
                ("topology.k8s.io/x".to_string(), "dropped".to_string()),
                ("topology.k8s.cp/x".to_string(), "kept".to_string()),
                ("existing".to_string(), "cloud".to_string()),
            ]),
        }
    }

    #[test]
    fn modifications_set_provider_id_labels_and_remove_only_the_cloud_taint() {
        let mut n = node("", &[("existing", "node")], &[]);
        let m = node_modifications(&c(&n), &metadata()).unwrap();
        m.apply(&mut n);
        let spec = n.spec.as_ref().unwrap();
        assert_eq!(spec.provider_id.as_deref(), Some("fake://12345"));
        assert_eq!(
            spec.taints.as_ref().unwrap(),
            &vec![
                taint("ImproveCoverageTaint", "NoSchedule"),
                taint("other", "NoExecute")
            ]
        );
        let labels = n.metadata.labels.unwrap();
        let expect: BTreeMap<String, String> = [
            ("beta.kubernetes.io/instance-type", "t1.micro"),
            ("node.kubernetes.io/instance-type", "t1.micro"),
            ("failure-domain.beta.kubernetes.io/zone", "us-west-1a"),
            ("topology.kubernetes.io/zone", "us-west-1a"),
            ("failure-domain.beta.kubernetes.io/region", "us-west"),
            ("topology.kubernetes.io/region", "us-west"),
            ("my.custom.label/foo", "bar"),
            ("topology.k8s.cp/x", "kept"),
            ("existing", "node"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(labels, expect);
    }

    #[test]
    fn modifications_are_already_applied_only_when_they_would_change_nothing() {
        let fresh = node("", &[], &[]);
        let m = node_modifications(&c(&fresh), &metadata()).unwrap();
        assert!(
            !m.already_applied(&c(&fresh)),
            "tainted, no providerID, no labels"
        );
        let mut done = fresh.clone();
        m.apply(&mut done);
        assert!(m.already_applied(&c(&done)));
        // Taint removed by hand: labels and providerID still to write.
        let mut by_hand = fresh.clone();
        by_hand.spec.as_mut().unwrap().taints = None;
        assert!(!m.already_applied(&c(&by_hand)));
        // ... also when the kubelet set the providerID.
        by_hand.spec.as_mut().unwrap().provider_id = Some("fake://12345".into());
        assert!(!m.already_applied(&c(&by_hand)));
        // One cloud label with another value.
        let mut changed = done.clone();
        changed
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("topology.kubernetes.io/zone".into(), "elsewhere".into());
        assert!(!m.already_applied(&c(&changed)));
        // No providerID from the cloud: nothing to set there.
        let none = NodeModifications {
            provider_id: None,
            ..m.clone()
        };
        let mut without_id = done.clone();
        without_id.spec.as_mut().unwrap().provider_id = None;
        assert!(none.already_applied(&c(&without_id)));
    }

    #[test]
    fn existing_provider_id_is_never_changed() {
        let mut n = node("fake://existing", &[], &[]);
        let m = node_modifications(&c(&n), &metadata()).unwrap();
        assert_eq!(m.provider_id, None);
        m.apply(&mut n);
        assert_eq!(
            n.spec.unwrap().provider_id.as_deref(),
            Some("fake://existing")
        );
        // An ID set between reading and updating is kept too.
        let mut n = node("", &[], &[]);
        let m = node_modifications(&c(&n), &metadata()).unwrap();
        n.spec.as_mut().unwrap().provider_id = Some("fake://meanwhile".into());
        m.apply(&mut n);
        assert_eq!(
            n.spec.unwrap().provider_id.as_deref(),
            Some("fake://meanwhile")
        );
    }

    #[test]
    fn empty_metadata_fields_write_no_labels_and_only_cloud_taint_goes() {
        let mut n = node("", &[], &[]);
        n.spec.as_mut().unwrap().taints = Some(vec![taint(UNINITIALIZED_TAINT, "NoSchedule")]);
        let md = InstanceMetadata::default();
        let m = node_modifications(&c(&n), &md).unwrap();
        m.apply(&mut n);
        assert_eq!(n.metadata.labels, None);
        assert_eq!(n.spec.as_ref().unwrap().provider_id, None);
        assert_eq!(
            n.spec.unwrap().taints,
            Some(vec![]),
            "an empty list, as upstream"
        );
    }

    #[test]
    fn invalid_or_absent_node_ip_fails_before_anything_is_changed() {
        let n = node("", &[], &[(PROVIDED_NODE_IP_ANNOTATION, "10.0.0.9")]);
        assert_eq!(
            node_modifications(&c(&n), &metadata()).unwrap_err(),
            "provided node ip for node \"node0\" is not valid: failed to get node address from cloud provider that matches ip: 10.0.0.9"
        );
        let n = node("", &[], &[(PROVIDED_NODE_IP_ANNOTATION, "10.0.0.1.1")]);
        assert!(node_modifications(&c(&n), &metadata())
            .unwrap_err()
            .starts_with(
                "provided node ip for node \"node0\" is not valid: failed to parse node IP"
            ));
        let n = node("", &[], &[(PROVIDED_NODE_IP_ANNOTATION, "132.143.154.163")]);
        assert!(node_modifications(&c(&n), &metadata()).is_ok());
    }

    #[test]
    fn cloud_taint_is_matched_by_key_only() {
        let mut n = node("", &[], &[]);
        assert!(has_cloud_taint(&c(&n)));
        n.spec.as_mut().unwrap().taints = Some(vec![taint(UNINITIALIZED_TAINT, "NoExecute")]);
        assert!(has_cloud_taint(&c(&n)));
        n.spec.as_mut().unwrap().taints = Some(vec![taint("x", "NoSchedule")]);
        assert!(!has_cloud_taint(&c(&n)));
        n.spec = None;
        assert!(!has_cloud_taint(&c(&n)));
    }

    #[test]
    fn overall_bucket_allows_a_burst_then_spaces_requeues() {
        let mut b = Bucket {
            tokens: BUCKET_BURST,
            last: Instant::now(),
        };
        for _ in 0..100 {
            assert!(b.reserve() < Duration::from_millis(5));
        }
        let d1 = b.reserve();
        let d2 = b.reserve();
        assert!(d1 > Duration::from_millis(50), "{d1:?}");
        assert!(d2 > d1, "{d1:?} then {d2:?}");
    }
}
