//! The cloud-node-lifecycle controller (canonical `cloud-node-lifecycle-controller`, alias
//! `cloud-node-lifecycle`; docs/upstream-compat.md#node-lifecycle-controller): every
//! `--node-monitor-period`, for every node: a Ready node loses the shutdown taint; a node that
//! is not Ready is deleted when its instance no longer exists in the cloud, and gets the
//! shutdown taint when its instance is shut down.
//!
//! Safe node deletion: a node is deleted only on an explicit "does not exist" answer
//! ([`Existence::DoesNotExist`]: `InstanceExists` false; with the legacy interface also
//! `InstanceID` answering `InstanceNotFound`, as upstream). Every error, whatever its kind
//! (unauthorized, throttled, deadline, cancelled, panicked, other), keeps the node. Beyond
//! upstream, and off by default ([`NodeDeletionPolicy`]): `--node-deletion-confirmations N`
//! waits for N such answers in a row spread over at least one period ([`NodeMonitor`] keeps the
//! count between passes), `--node-deletion-mode=report` reports instead of deleting, and
//! `--node-deletion-on-instance-not-found` counts an InstancesV2 `InstanceNotFound` error as
//! "does not exist" (k/k#141364). Every deletion decision is an event on the Node that states
//! the evidence.
//!
//! Deliberate differences from upstream:
//! - the loop waits for the node cache to sync before its first pass (upstream starts at once
//!   and its first pass may see an empty cache; the outcome is the same, one period later);
//! - `getProviderID` with a V2 provider that returns nil metadata yields `""` (upstream
//!   dereferences nil);
//! - the evidence event ([`INSTANCE_DOES_NOT_EXIST`]) before upstream's `DeletingNode`, and the
//!   flags above;
//! - a node whose question from an earlier pass (`InstanceExists`, ...) is still running in the
//!   plugin past its deadline is not asked again that pass (one WARN line per pass counts
//!   them): upstream asks again and, with a plugin that ignores cancellation, piles up calls.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_abi::{ErrorKind, ProviderError};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::DeleteParams;
use kube::Api;

use super::node::{get_instance_provider_id, kube_error_text};
use super::{
    publish_if_throttled, Controller, ControllerConfig, ControllerContext, ControllerName,
    NotStarted, Start,
};
use crate::provider::bulk::INSTANCES_BATCH;
use crate::provider::{CacheUse, InstanceAnswer, InstanceQuery, Provider};
use crate::runtime::events::{node_ref, EventRecorder, EventType};
use crate::runtime::patches::{add_node_taint, remove_node_taint};
use crate::runtime::well_known::{READY_CONDITION, SHUTDOWN_TAINT};
use crate::runtime::{CachedNode, NodeRef};

/// Canonical controller name.
pub const NAME: &str = "cloud-node-lifecycle-controller";
/// Alias (also the `running_managed_controllers` name).
pub const ALIAS: &str = "cloud-node-lifecycle";
/// Event source component.
pub const COMPONENT: &str = "cloud-node-lifecycle-controller";
/// Event reason of a deletion.
pub const DELETING_NODE: &str = "DeletingNode";
/// Event reason of a failed deletion.
pub const DELETING_NODE_FAILED: &str = "DeletingNodeFailed";
/// Event reason (Normal, beyond upstream) of the decision to delete, stating the evidence;
/// upstream's [`DELETING_NODE`] follows it.
pub const INSTANCE_DOES_NOT_EXIST: &str = "InstanceDoesNotExist";
/// Event reason (Warning, beyond upstream) of a deletion withheld by
/// `--node-deletion-mode=report`, stating the evidence.
pub const NODE_DELETION_WITHHELD: &str = "NodeDeletionWithheld";

/// Default of `--node-deletion-confirmations`: delete on the first "does not exist" answer,
/// as upstream.
pub const DEFAULT_DELETION_CONFIRMATIONS: u32 = 1;
/// Default of `--node-deletion-mode`: delete, as upstream.
pub const DEFAULT_DELETION_MODE: NodeDeletionMode = NodeDeletionMode::Delete;
/// Default of `--node-deletion-on-instance-not-found`: an InstancesV2 `InstanceNotFound` error
/// is an error and keeps the node, as upstream.
pub const DEFAULT_DELETION_ON_INSTANCE_NOT_FOUND: bool = false;

/// `--node-deletion-mode`: what a confirmed "does not exist" leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDeletionMode {
    /// Delete the Node (upstream).
    Delete,
    /// Keep the Node; emit a Warning event and count `ccm_node_deletions_withheld_total`.
    Report,
}

impl NodeDeletionMode {
    /// Every mode, in the order the flag's help lists them.
    pub const ALL: [Self; 2] = [Self::Delete, Self::Report];

    /// The flag value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Delete => "delete",
            Self::Report => "report",
        }
    }

    /// The mode named `value` (exactly as [`Self::as_str`] spells it).
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == value)
    }
}

impl Default for NodeDeletionMode {
    fn default() -> Self {
        DEFAULT_DELETION_MODE
    }
}

impl fmt::Display for NodeDeletionMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When the lifecycle controller deletes a Node whose instance does not exist (the
/// `--node-deletion-*` flags). The default is upstream's behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDeletionPolicy {
    /// `--node-deletion-confirmations`: "does not exist" answers in a row, spread over at least
    /// one `--node-monitor-period`, before the decision (at least 1).
    pub confirmations: u32,
    /// `--node-deletion-mode`.
    pub mode: NodeDeletionMode,
    /// `--node-deletion-on-instance-not-found`: an InstancesV2 `InstanceExists` that fails with
    /// `InstanceNotFound` counts as "does not exist".
    pub on_instance_not_found: bool,
}

impl Default for NodeDeletionPolicy {
    fn default() -> Self {
        Self {
            confirmations: DEFAULT_DELETION_CONFIRMATIONS,
            mode: DEFAULT_DELETION_MODE,
            on_instance_not_found: DEFAULT_DELETION_ON_INSTANCE_NOT_FOUND,
        }
    }
}

/// The shutdown taint: key, effect NoSchedule, nothing else.
pub fn shutdown_taint() -> Taint {
    Taint {
        key: SHUTDOWN_TAINT.into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    }
}

/// Start conditions: the provider must offer Instances or InstancesV2.
pub fn check(ctx: &ControllerContext) -> Result<(), NotStarted> {
    let caps = ctx.provider.capabilities();
    if !caps.instances && !caps.instances_v2 {
        return Err(NotStarted(
            "cloud provider does not support instances".into(),
        ));
    }
    Ok(())
}

/// The cloud-node-lifecycle controller in the start-up table ([`super::CONTROLLERS`]).
pub const CONTROLLER: Controller = Controller {
    name: ControllerName {
        canonical: NAME,
        alias: ALIAS,
        client: "node-controller",
    },
    start: |ctx| Start::when(check(ctx), || run(ctx.clone())),
};

/// Run until `ctx.stop` is cancelled: a [`NodeMonitor`] pass every `node_monitor_period`,
/// measured from the end of one pass to the start of the next.
pub async fn run(ctx: ControllerContext) {
    tokio::select! {
        _ = ctx.stop.cancelled() => return,
        synced = ctx.nodes.wait_synced() => if !synced { return },
    }
    ctx.metrics.set_running(ALIAS, true);
    let policy = &ctx.config.node_deletion;
    if *policy != NodeDeletionPolicy::default() {
        tracing::info!(
            controller = NAME,
            confirmations = policy.confirmations,
            mode = %policy.mode,
            on_instance_not_found = policy.on_instance_not_found,
            "node deletion: {} \"does not exist\" answer(s) in a row, mode {}{}",
            policy.confirmations,
            policy.mode,
            if policy.on_instance_not_found { ", InstancesV2 InstanceNotFound counts as does not exist" } else { "" },
        );
    }
    let recorder = ctx.recorder(COMPONENT);
    let mut monitor = NodeMonitor::default();
    loop {
        tokio::select! {
            _ = ctx.stop.cancelled() => break,
            _ = monitor.pass(&ctx, &recorder) => {}
        }
        tokio::select! {
            _ = ctx.stop.cancelled() => break,
            _ = tokio::time::sleep(ctx.config.node_monitor_period) => {}
        }
    }
    ctx.metrics.set_running(ALIAS, false);
}

fn ready_status(node: &CachedNode) -> &str {
    node.condition(READY_CONDITION)
        .map_or("Unknown", |c| c.status.as_str())
}

/// Is `node` a node without a providerID created less than `grace` ago?
fn within_provider_id_grace(node: &CachedNode, grace: std::time::Duration) -> bool {
    if !spec_provider_id(node).is_empty() {
        return false;
    }
    let Some(created) = node.creation_timestamp() else {
        return false;
    };
    let age_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond() - created.0.as_millisecond();
    u128::try_from(age_ms).map_or(true, |age| age < grace.as_millis())
}

fn spec_provider_id(node: &impl NodeRef) -> &str {
    node.node_provider_id()
}

/// The key of a node's confirmation count: its UID (a node deleted and created again under the
/// same name starts from zero), or its name when it has none.
fn node_key(node: &CachedNode) -> &str {
    node.uid()
        .or(node.name_str().map(|n| &**n))
        .unwrap_or_default()
}

/// One pass over every cached node with no memory of earlier passes (upstream
/// `MonitorNodes`). With `--node-deletion-confirmations` above 1 it never deletes; the
/// controller keeps a [`NodeMonitor`] across passes instead.
pub async fn monitor_nodes(ctx: &ControllerContext, recorder: &EventRecorder) {
    NodeMonitor::default().pass(ctx, recorder).await;
}

/// What the cloud said about a node's instance.
#[derive(Debug)]
pub enum Existence {
    /// It exists.
    Exists,
    /// An explicit "does not exist" answer: the only answer that can lead to a deletion.
    DoesNotExist(Absence),
    /// The cloud could not tell: any error, of any kind. Never leads to a deletion.
    Unknown(ProviderError),
}

/// The evidence of a "does not exist" answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Absence {
    /// The provider ID asked about (`""` when the node has none and the cloud gave none).
    pub provider_id: String,
    /// Which answer said so, e.g. `InstanceExists returned false`.
    pub answer: String,
}

/// Whether `node`'s instance exists, with the evidence (upstream `ensureNodeExistsByProviderID`
/// with every answer classified): `Exists`, an explicit [`Existence::DoesNotExist`], or
/// [`Existence::Unknown`] for every error. The only error that can mean "does not exist" is
/// `InstanceNotFound`: from the legacy `InstanceID` (as upstream), and from InstancesV2
/// `InstanceExists` only with `policy.on_instance_not_found`.
pub async fn instance_existence(
    provider: &Provider,
    node: &impl NodeRef,
    policy: &NodeDeletionPolicy,
) -> Existence {
    let caps = provider.capabilities();
    if caps.instances_v2 {
        let absence = |answer: String| {
            Existence::DoesNotExist(Absence {
                provider_id: spec_provider_id(node).to_string(),
                answer,
            })
        };
        return match provider.instance_exists(node).await {
            Ok(true) => Existence::Exists,
            Ok(false) => absence("InstanceExists returned false".into()),
            Err(e) if e.kind() == ErrorKind::INSTANCE_NOT_FOUND && policy.on_instance_not_found => {
                absence(format!(
                    "InstanceExists failed with InstanceNotFound ({e}), counted as does not exist by --node-deletion-on-instance-not-found"
                ))
            }
            Err(e) => Existence::Unknown(e),
        };
    }
    if !caps.instances {
        return Existence::Unknown(ProviderError::other(
            "instances interface not supported in the cloud provider",
        ));
    }
    match legacy_provider_id(provider, node).await {
        Err(e) => Existence::Unknown(e),
        Ok(None) => Existence::DoesNotExist(Absence {
            provider_id: String::new(),
            answer: "InstanceID returned InstanceNotFound".into(),
        }),
        Ok(Some(id)) => match provider.instance_exists_by_provider_id(&id).await {
            Ok(true) => Existence::Exists,
            Ok(false) => Existence::DoesNotExist(Absence {
                provider_id: id,
                answer: "InstanceExistsByProviderID returned false".into(),
            }),
            Err(e) => Existence::Unknown(e),
        },
    }
}

/// The answers of a bulk provider about the nodes that are not Ready (existence and shutdown,
/// in as few `InstancesBatch` calls as the batch size allows), by [`node_key`]; empty for other
/// providers, which are asked node by node. The lifecycle loop reads the instance cache with
/// its own period as max-age ([`lifecycle_cache_use`]).
async fn bulk_answers(
    ctx: &ControllerContext,
    nodes: &[Arc<CachedNode>],
) -> HashMap<String, Result<InstanceAnswer, ProviderError>> {
    if !ctx.provider.bulk_instances() {
        return HashMap::new();
    }
    let not_ready: Vec<Arc<CachedNode>> = nodes
        .iter()
        .filter(|n| ready_status(n) != "True")
        .cloned()
        .collect();
    if not_ready.is_empty() {
        return HashMap::new();
    }
    let answers = ctx
        .provider
        .instance_answers(
            &not_ready,
            InstanceQuery::EXISTS.with(InstanceQuery::SHUTDOWN),
            lifecycle_cache_use(&ctx.config),
        )
        .await;
    not_ready
        .iter()
        .map(|n| node_key(n).to_string())
        .zip(answers)
        .collect()
}

/// How the lifecycle loop uses the instance cache: answers younger than
/// `--node-monitor-period` (a pass never reuses what the previous pass, at least a period
/// earlier, learned); it keeps nothing. A "does not exist" answer is never in the cache, so every
/// one of them that counts towards a deletion came from the cloud in that pass.
pub fn lifecycle_cache_use(config: &ControllerConfig) -> CacheUse {
    CacheUse::read(config.node_monitor_period)
}

/// [`instance_existence`] from a bulk answer: `exists: false` is the explicit "does not
/// exist"; a per-node error is [`Existence::Unknown`], except `InstanceNotFound` with
/// `policy.on_instance_not_found` (as for `InstanceExists`). A batch-level "not found" never
/// reaches here as such (the call layer makes it `OTHER`).
pub fn existence_of_answer(
    node: &impl NodeRef,
    answer: &Result<InstanceAnswer, ProviderError>,
    policy: &NodeDeletionPolicy,
) -> Existence {
    let absence = |answer: String| {
        Existence::DoesNotExist(Absence {
            provider_id: spec_provider_id(node).to_string(),
            answer,
        })
    };
    match answer {
        Ok(a) if a.exists == Some(false) => absence(format!("{INSTANCES_BATCH} returned exists: false")),
        Ok(_) => Existence::Exists,
        Err(e) if e.kind() == ErrorKind::INSTANCE_NOT_FOUND && policy.on_instance_not_found => {
            absence(format!(
                "{INSTANCES_BATCH} failed with InstanceNotFound for this node ({e}), counted as does not exist by --node-deletion-on-instance-not-found"
            ))
        }
        Err(e) => Existence::Unknown(e.clone()),
    }
}

/// What a "does not exist" answer leads to, given the answers before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not confirmed yet: fewer than `--node-deletion-confirmations` answers in a row, or they
    /// do not yet span one `--node-monitor-period`.
    Wait {
        /// Answers in a row so far, this one included.
        answers: u32,
    },
    /// Confirmed, `--node-deletion-mode=delete`: delete the node.
    Delete {
        /// Answers in a row.
        answers: u32,
        /// From the first of them to this one.
        span: Duration,
    },
    /// Confirmed, `--node-deletion-mode=report`: report once, keep the node.
    Withhold {
        /// Answers in a row.
        answers: u32,
        /// From the first of them to this one.
        span: Duration,
    },
    /// Report mode, already reported for this run of answers: nothing more to do.
    AlreadyWithheld,
}

#[derive(Debug, Clone)]
struct Streak {
    provider_id: String,
    answers: u32,
    first: Instant,
    withheld: bool,
}

/// The lifecycle controller's memory between passes: per node, the "does not exist" answers in
/// a row. Any other answer, the node being Ready, or the node leaving the cache forgets them;
/// so does a restart or a change of leader (the count starts again, the safe direction).
#[derive(Debug, Default)]
pub struct NodeMonitor {
    streaks: HashMap<String, Streak>,
}

impl NodeMonitor {
    /// Record a "does not exist" answer about `provider_id` for the node `key` at `now` and
    /// decide. A different provider ID than the run's starts a new run.
    pub fn does_not_exist(
        &mut self,
        key: &str,
        provider_id: &str,
        now: Instant,
        policy: &NodeDeletionPolicy,
        period: Duration,
    ) -> Verdict {
        let fresh = || Streak {
            provider_id: provider_id.to_string(),
            answers: 0,
            first: now,
            withheld: false,
        };
        let streak = self.streaks.entry(key.to_string()).or_insert_with(fresh);
        if streak.provider_id != provider_id {
            *streak = fresh();
        }
        streak.answers = streak.answers.saturating_add(1);
        let answers = streak.answers;
        let span = now.saturating_duration_since(streak.first);
        let needed = policy.confirmations.max(1);
        if answers < needed || (needed > 1 && span < period) {
            return Verdict::Wait { answers };
        }
        match policy.mode {
            NodeDeletionMode::Delete => Verdict::Delete { answers, span },
            NodeDeletionMode::Report if streak.withheld => Verdict::AlreadyWithheld,
            NodeDeletionMode::Report => {
                streak.withheld = true;
                Verdict::Withhold { answers, span }
            }
        }
    }

    /// Forget node `key`'s answers; returns how many there were.
    pub fn forget(&mut self, key: &str) -> u32 {
        self.streaks.remove(key).map_or(0, |s| s.answers)
    }

    /// "Does not exist" answers in a row recorded for node `key`.
    pub fn answers(&self, key: &str) -> u32 {
        self.streaks.get(key).map_or(0, |s| s.answers)
    }

    fn forget_with_reason(&mut self, key: &str, name: &str, why: &str) {
        let forgotten = self.forget(key);
        if forgotten > 0 {
            tracing::info!(controller = NAME, node = %name, "{why}: forgetting {forgotten} \"does not exist\" answer(s) in a row for node {name}");
        }
    }

    /// One pass over every cached node (upstream `MonitorNodes`). No node is excluded:
    /// control-plane, uninitialised and provider-ID-less nodes are all examined.
    ///
    /// Beyond upstream, whose pass is sequential, the nodes are checked
    /// [`ControllerConfig::node_status_workers`] at a time (`--concurrent-node-status-updates`,
    /// 0 meaning `--concurrent-node-syncs`, default 64), so a zone outage with thousands of
    /// NotReady nodes on the per-node path still ends a pass in seconds: each worker's cloud calls
    /// go through the provider's call budget (`--cloud-api-qps`), throttling pause and call
    /// pool as every other call, and its writes through the client's rate limit. The decisions
    /// about one node are made in the order upstream makes them; only different nodes overlap.
    ///
    /// With a bulk provider (beyond upstream) the nodes that are not Ready are looked up first,
    /// existence and shutdown together, in batches ([`bulk_answers`]); the decisions are then
    /// made node by node from those answers, exactly as from the per-node calls.
    ///
    /// A pass keeps no per-node set: the "does not exist" runs of nodes that left the cache are
    /// forgotten by marking the runs the pass met (usually none), so an idle pass costs one look
    /// at each cached node.
    ///
    /// With node ownership enforced (hybrid clusters) `ctx.nodes` holds only the provider's
    /// nodes, and a node without a providerID is left alone until `--provider-id-grace-period`
    /// after its creation, so the controller that may initialise it has the time to (KEP-5778).
    pub async fn pass(&mut self, ctx: &ControllerContext, recorder: &EventRecorder) {
        let started = Instant::now();
        let mut nodes = ctx.nodes.list();
        if let Some(grace) = ctx.config.provider_id_grace_period {
            nodes.retain(|n| !within_provider_id_grace(n, grace));
        }
        let mut answers = bulk_answers(ctx, &nodes).await;
        let workers = ctx.config.node_status_workers();
        let shared = Mutex::new(PassState {
            monitor: self,
            met: HashSet::new(),
            still_open: Vec::new(),
            not_ready: 0,
        });
        let checks = nodes.into_iter().map(|node| {
            let answer = if answers.is_empty() {
                None
            } else {
                answers.remove(node_key(&node))
            };
            (node, answer)
        });
        futures::stream::iter(checks)
            .for_each_concurrent(workers, |(node, answer)| {
                check_node(ctx, recorder, &shared, node, answer)
            })
            .await;
        let PassState {
            monitor,
            met,
            still_open,
            not_ready,
        } = shared.into_inner().unwrap_or_else(|p| p.into_inner());
        let metrics = &ctx.metrics;
        metrics.node_lifecycle_passes.inc();
        metrics
            .node_lifecycle_last_pass_seconds
            .set(started.elapsed().as_secs_f64());
        metrics
            .node_lifecycle_last_pass_not_ready
            .set(i64::try_from(not_ready).unwrap_or(i64::MAX));
        if met.len() != monitor.streaks.len() {
            monitor.streaks.retain(|key, _| met.contains(key));
        }
        if let Some((first, method)) = still_open.first() {
            tracing::warn!(
                controller = NAME,
                nodes = still_open.len(),
                "{} node(s) not checked this pass (e.g. {first}): their earlier {method} call is still running in the plugin past its deadline",
                still_open.len()
            );
        }
    }
}

/// What the concurrent checks of one pass share (locked only between awaits).
struct PassState<'a> {
    monitor: &'a mut NodeMonitor,
    /// Keys of the nodes met this pass that had a "does not exist" run: the runs of every
    /// other key belong to nodes no longer cached.
    met: HashSet<String>,
    /// Nodes not asked again this pass, with the method still running in the plugin.
    still_open: Vec<(String, &'static str)>,
    /// Nodes met that were not Ready.
    not_ready: usize,
}

impl PassState<'_> {
    /// Forget `key`'s run (logging why); it was met this pass.
    fn forget(&mut self, key: &str, name: &str, why: &str) {
        if self.monitor.streaks.is_empty() {
            return;
        }
        self.monitor.forget_with_reason(key, name, why);
    }
}

fn lock<'a, 'b>(shared: &'a Mutex<PassState<'b>>) -> std::sync::MutexGuard<'a, PassState<'b>> {
    // Every write under the lock is one map or vector operation: a poisoned lock is still whole.
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// The checks and decisions of one pass about one node (see [`NodeMonitor::pass`]).
async fn check_node(
    ctx: &ControllerContext,
    recorder: &EventRecorder,
    shared: &Mutex<PassState<'_>>,
    node: Arc<CachedNode>,
    answer: Option<Result<InstanceAnswer, ProviderError>>,
) {
    let name = node.name();
    let key = node_key(&node);
    if ready_status(&node) == "True" {
        lock(shared).forget(key, name, "node is Ready");
        // Ready nodes are never deleted, even when the cloud says the instance is gone.
        if let Err(e) = remove_node_taint(&ctx.client, &node, SHUTDOWN_TAINT, "NoSchedule").await {
            tracing::error!(controller = NAME, node = %name, "error patching node taints: {}", kube_error_text(&e));
        }
        return;
    }
    lock(shared).not_ready += 1;
    // Beyond upstream: a question about this node asked in an earlier pass whose thread still
    // runs in the plugin past its deadline is not asked again (it would only wait for that
    // thread): no answer for this pass, as for an error.
    if answer.is_none() {
        if let Some(method) = ctx.provider.open_instance_question(&node) {
            tracing::debug!(controller = NAME, node = %name, method, "not asking again: the earlier {method} call about node {name} is still running in the plugin");
            let mut state = lock(shared);
            state.forget(key, name, "no answer from the cloud");
            state.still_open.push((name.to_string(), method));
            return;
        }
    }
    let existence = match &answer {
        Some(answer) => existence_of_answer(&node, answer, &ctx.config.node_deletion),
        None => instance_existence(&ctx.provider, &node, &ctx.config.node_deletion).await,
    };
    match existence {
        Existence::Exists => lock(shared).forget(key, name, "instance exists"),
        Existence::Unknown(e) => {
            // Never a deletion, whatever the kind of error. Throttled: a Warning event; the
            // next pass's calls wait for the provider's pause.
            if !publish_if_throttled(recorder, node_ref(&node), &e) {
                tracing::error!(controller = NAME, node = %name, kind = e.kind().name(), "error checking if node {name} exists: {e}");
            }
            lock(shared).forget(key, name, "no answer from the cloud");
            return;
        }
        Existence::DoesNotExist(absence) => {
            on_does_not_exist(ctx, recorder, shared, &node, key, &absence).await;
            return;
        }
    }
    let shutdown = match answer {
        // The instance exists (else the node was handled above): the answer says.
        Some(Ok(answer)) => Ok(answer.shutdown.unwrap_or(false)),
        Some(Err(e)) => Err(e),
        None => shutdown_in_cloud_provider(&ctx.provider, &node).await,
    };
    match shutdown {
        Ok(true) => {
            if let Err(e) = add_node_taint(&ctx.client, name, &shutdown_taint()).await {
                tracing::error!(controller = NAME, node = %name, "failed to apply shutdown taint to node {name}, it may have been deleted: {}", kube_error_text(&e));
            }
        }
        // Not shut down: the taint is only removed once the node is Ready again.
        Ok(false) => {}
        Err(e) if publish_if_throttled(recorder, node_ref(&node), &e) => {}
        Err(e) => {
            tracing::error!(controller = NAME, node = %name, "error checking if node {name} is shutdown: {e}");
        }
    }
}

async fn on_does_not_exist(
    ctx: &ControllerContext,
    recorder: &EventRecorder,
    shared: &Mutex<PassState<'_>>,
    node: &CachedNode,
    key: &str,
    absence: &Absence,
) {
    let name = node.name();
    let policy = &ctx.config.node_deletion;
    let verdict = {
        let mut state = lock(shared);
        let verdict = state.monitor.does_not_exist(
            key,
            &absence.provider_id,
            Instant::now(),
            policy,
            ctx.config.node_monitor_period,
        );
        state.met.insert(key.to_string());
        verdict
    };
    match verdict {
        Verdict::Wait { answers } => {
            let evidence = evidence(name, absence, answers, None);
            tracing::info!(controller = NAME, node = %name, "{evidence}; {answers} of {} answers in a row over at least {}, not deleting node {name} yet", policy.confirmations, crate::runtime::duration::format(ctx.config.node_monitor_period));
        }
        Verdict::AlreadyWithheld => {
            tracing::debug!(controller = NAME, node = %name, "instance of node {name} still does not exist in the cloud; deletion withheld (--node-deletion-mode=report)");
        }
        Verdict::Withhold { answers, span } => {
            let message = format!(
                "{}; not deleting node {name} (--node-deletion-mode=report)",
                evidence(name, absence, answers, Some(span))
            );
            tracing::warn!(controller = NAME, node = %name, "{message}");
            recorder.publish(
                node_ref(node),
                EventType::Warning,
                NODE_DELETION_WITHHELD,
                message,
            );
            ctx.metrics.node_deletions_withheld.inc();
        }
        Verdict::Delete { answers, span } => {
            recorder.publish(
                node_ref(node),
                EventType::Normal,
                INSTANCE_DOES_NOT_EXIST,
                format!(
                    "{}; deleting node {name}",
                    evidence(name, absence, answers, Some(span))
                ),
            );
            if delete(ctx, recorder, node).await {
                lock(shared).monitor.forget(key);
            }
        }
    }
}

/// Upstream's deletion: its log line, `DeletingNode` event, DELETE without preconditions, and
/// `DeletingNodeFailed` on failure. `true` when the API server accepted the delete.
async fn delete(ctx: &ControllerContext, recorder: &EventRecorder, node: &CachedNode) -> bool {
    let name = node.name();
    tracing::info!(controller = NAME, node = %name, "deleting node since it is no longer present in cloud provider: {name}");
    recorder.publish(
        node_ref(node),
        EventType::Normal,
        DELETING_NODE,
        format!("Deleting node {name} because it does not exist in the cloud provider"),
    );
    let api: Api<Node> = Api::all(ctx.client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            ctx.metrics.node_deletions.inc();
            true
        }
        Err(e) => {
            let err = kube_error_text(&e);
            tracing::error!(controller = NAME, node = %name, "unable to delete node {name:?}: {err}");
            recorder.publish(
                node_ref(node),
                EventType::Warning,
                DELETING_NODE_FAILED,
                format!("Failed deleting node {name}: {err}"),
            );
            false
        }
    }
}

/// "Instance fake://1 does not exist in the cloud (InstanceExists returned false; 3 answers in a
/// row over 10s)". `span` is given for a decision; a single answer has no count.
fn evidence(name: &str, absence: &Absence, answers: u32, span: Option<Duration>) -> String {
    let subject = if absence.provider_id.is_empty() {
        format!("The instance of node {name} (no provider ID)")
    } else {
        format!("Instance {}", absence.provider_id)
    };
    let count = match (answers, span) {
        (1, _) => String::new(),
        (n, Some(span)) => format!("; {n} answers in a row over {}", format_span(span)),
        (n, None) => format!("; {n} answers in a row"),
    };
    format!(
        "{subject} does not exist in the cloud ({}{count})",
        absence.answer
    )
}

/// A span for people: whole seconds from 1s, whole milliseconds below.
fn format_span(span: Duration) -> String {
    let rounded = if span >= Duration::from_secs(1) {
        Duration::from_secs(span.as_secs())
    } else {
        Duration::from_millis(u64::try_from(span.as_millis()).unwrap_or(u64::MAX))
    };
    crate::runtime::duration::format(rounded)
}

/// Upstream `getProviderID`: the spec value; else (V2) the metadata's provider ID, which may be
/// `""`; else `GetInstanceProviderID` (InstanceNotFound propagated unchanged, other errors
/// wrapped "failed to get instance ID from cloud provider: …").
pub async fn get_provider_id(
    provider: &Provider,
    node: &impl NodeRef,
) -> Result<String, ProviderError> {
    let pid = spec_provider_id(node);
    if !pid.is_empty() {
        return Ok(pid.to_string());
    }
    if provider.capabilities().instances_v2 {
        // Better than upstream: nil metadata is "no provider ID" instead of a nil dereference.
        return Ok(provider
            .instance_metadata(node)
            .await?
            .map(|m| m.provider_id)
            .unwrap_or_default());
    }
    get_instance_provider_id(provider, node.node_name()).await
}

/// The provider ID for legacy existence/shutdown checks: `Ok(None)` when the instance is not
/// found by name.
async fn legacy_provider_id(
    provider: &Provider,
    node: &impl NodeRef,
) -> Result<Option<String>, ProviderError> {
    let pid = spec_provider_id(node);
    if !pid.is_empty() {
        return Ok(Some(pid.to_string()));
    }
    let name = node.node_name();
    match get_instance_provider_id(provider, name).await {
        Ok(id) => Ok(Some(id)),
        Err(e) if e.kind() == ErrorKind::INSTANCE_NOT_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

/// Upstream `ensureNodeExistsByProviderID`, with upstream's defaults: [`instance_existence`]
/// as a boolean (`Err` for [`Existence::Unknown`]).
pub async fn ensure_node_exists(
    provider: &Provider,
    node: &impl NodeRef,
) -> Result<bool, ProviderError> {
    match instance_existence(provider, node, &NodeDeletionPolicy::default()).await {
        Existence::Exists => Ok(true),
        Existence::DoesNotExist(_) => Ok(false),
        Existence::Unknown(e) => Err(e),
    }
}

/// Upstream `shutdownInCloudProvider`.
pub async fn shutdown_in_cloud_provider(
    provider: &Provider,
    node: &impl NodeRef,
) -> Result<bool, ProviderError> {
    let caps = provider.capabilities();
    if caps.instances_v2 {
        return provider.instance_shutdown(node).await;
    }
    if !caps.instances {
        return Err(ProviderError::other(
            "cloud provider does not support instances",
        ));
    }
    let Some(id) = legacy_provider_id(provider, node).await? else {
        return Ok(false);
    };
    match provider.instance_shutdown_by_provider_id(&id).await {
        Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => Ok(false),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn with_ready(status: Option<&str>) -> CachedNode {
        CachedNode::from(Node {
            status: Some(NodeStatus {
                conditions: status.map(|s| {
                    vec![
                        NodeCondition {
                            type_: "MemoryPressure".into(),
                            status: "True".into(),
                            ..Default::default()
                        },
                        NodeCondition {
                            type_: "Ready".into(),
                            status: s.into(),
                            ..Default::default()
                        },
                    ]
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn ready_status_defaults_to_unknown() {
        assert_eq!(ready_status(&with_ready(Some("True"))), "True");
        assert_eq!(ready_status(&with_ready(Some("False"))), "False");
        assert_eq!(ready_status(&with_ready(None)), "Unknown");
        assert_eq!(ready_status(&CachedNode::default()), "Unknown");
    }

    fn policy(confirmations: u32, mode: NodeDeletionMode) -> NodeDeletionPolicy {
        NodeDeletionPolicy {
            confirmations,
            mode,
            ..Default::default()
        }
    }

    #[test]
    fn one_confirmation_decides_at_once_as_upstream() {
        let mut m = NodeMonitor::default();
        let p = NodeDeletionPolicy::default();
        let t0 = Instant::now();
        let period = Duration::from_secs(5);
        assert_eq!(
            m.does_not_exist("uid", "fake://1", t0, &p, period),
            Verdict::Delete {
                answers: 1,
                span: Duration::ZERO
            }
        );
    }

    #[test]
    fn confirmations_need_answers_in_a_row_over_a_period() {
        let mut m = NodeMonitor::default();
        let p = policy(3, NodeDeletionMode::Delete);
        let period = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(
            m.does_not_exist("a", "fake://1", at(0), &p, period),
            Verdict::Wait { answers: 1 }
        );
        assert_eq!(
            m.does_not_exist("a", "fake://1", at(1_000), &p, period),
            Verdict::Wait { answers: 2 }
        );
        // Three answers, but within 2s: not spread over a period yet.
        assert_eq!(
            m.does_not_exist("a", "fake://1", at(2_000), &p, period),
            Verdict::Wait { answers: 3 }
        );
        assert_eq!(
            m.does_not_exist("a", "fake://1", at(5_000), &p, period),
            Verdict::Delete {
                answers: 4,
                span: Duration::from_secs(5)
            }
        );
        // Another answer resets; so does another provider ID.
        assert_eq!(m.forget("a"), 4);
        assert_eq!(m.answers("a"), 0);
        m.does_not_exist("a", "fake://1", at(6_000), &p, period);
        m.does_not_exist("a", "fake://1", at(11_000), &p, period);
        assert_eq!(m.answers("a"), 2);
        assert_eq!(
            m.does_not_exist("a", "fake://2", at(16_000), &p, period),
            Verdict::Wait { answers: 1 },
            "a new instance starts a new run"
        );
        // Nodes are counted apart.
        assert_eq!(
            m.does_not_exist("b", "fake://1", at(16_000), &p, period),
            Verdict::Wait { answers: 1 }
        );
        assert_eq!(m.answers("a"), 1);
    }

    #[test]
    fn report_mode_withholds_once_per_run() {
        let mut m = NodeMonitor::default();
        let p = policy(2, NodeDeletionMode::Report);
        let period = Duration::from_millis(100);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(
            m.does_not_exist("a", "", at(0), &p, period),
            Verdict::Wait { answers: 1 }
        );
        assert_eq!(
            m.does_not_exist("a", "", at(100), &p, period),
            Verdict::Withhold {
                answers: 2,
                span: Duration::from_millis(100)
            }
        );
        assert_eq!(
            m.does_not_exist("a", "", at(200), &p, period),
            Verdict::AlreadyWithheld
        );
        m.forget("a");
        m.does_not_exist("a", "", at(300), &p, period);
        assert!(matches!(
            m.does_not_exist("a", "", at(400), &p, period),
            Verdict::Withhold { answers: 2, .. }
        ));
    }

    #[test]
    fn evidence_names_the_instance_the_answer_and_the_count() {
        let absence = Absence {
            provider_id: "aws:///eu-west-1a/i-123".into(),
            answer: "InstanceExists returned false".into(),
        };
        assert_eq!(
            evidence("n1", &absence, 1, Some(Duration::ZERO)),
            "Instance aws:///eu-west-1a/i-123 does not exist in the cloud (InstanceExists returned false)"
        );
        assert_eq!(
            evidence("n1", &absence, 3, Some(Duration::from_millis(15_020))),
            "Instance aws:///eu-west-1a/i-123 does not exist in the cloud (InstanceExists returned false; 3 answers in a row over 15s)"
        );
        let no_id = Absence {
            provider_id: String::new(),
            answer: "InstanceID returned InstanceNotFound".into(),
        };
        assert_eq!(
            evidence("n1", &no_id, 2, Some(Duration::from_micros(250_400))),
            "The instance of node n1 (no provider ID) does not exist in the cloud (InstanceID returned InstanceNotFound; 2 answers in a row over 250ms)"
        );
    }

    #[test]
    fn deletion_mode_names() {
        for m in NodeDeletionMode::ALL {
            assert_eq!(NodeDeletionMode::parse(m.as_str()), Some(m));
        }
        assert_eq!(NodeDeletionMode::parse("Delete"), None);
        assert_eq!(NodeDeletionMode::default(), NodeDeletionMode::Delete);
    }

    #[test]
    fn shutdown_taint_is_exact() {
        let t = shutdown_taint();
        assert_eq!(t.key, "node.cloudprovider.kubernetes.io/shutdown");
        assert_eq!(t.effect, "NoSchedule");
        assert_eq!(t.value, None);
        assert_eq!(t.time_added, None);
    }
}
