//! The node-ownership controller (beyond upstream, which runs one provider and so never asks
//! whose a node is; hybrid clusters, KEP-5778, docs/hybrid-clusters.md). It runs only when node
//! ownership is enforced (several providers, or `--cloud-provider-platforms`), next to the
//! cloud-node controllers, under their name and client.
//!
//! A node that waits for initialisation (it has the `node.cloudprovider.kubernetes.io/
//! uninitialized` taint) but names no owner (no providerID, no `topology.kubernetes.io/platform`
//! label or `cloudprovider.kubernetes.io/platform` annotation) is *unclaimed*: no provider's
//! cloud-node controller sees it. This controller asks the providers in `--cloud-provider` order
//! whether they know the node (InstancesV2 `InstanceExists`, else Instances `InstanceID` by node
//! name) and labels it with the platform of the first that does; that provider's cloud-node
//! controller then initialises it.
//!
//! - An error from a provider stops the round (a later provider must not win because an earlier
//!   one could not answer): a `NodeOwnershipUnknown` Warning event, and the node is asked about
//!   again with a per-node back-off (1 s doubling to 5 min).
//! - No provider knows it: a `NoCloudProviderClaimsNode` Warning event; the node stays tainted
//!   and untouched and is asked about again with the same back-off (its instance may appear).
//! - A claim is a `CloudProviderClaimedNode` Normal event naming the provider and the label. The
//!   label is written only if the node is still unclaimed: the patch carries the
//!   resourceVersion the providers were asked about, so of two hosts that both know a node
//!   (one host per provider) the first claim stays.
//!
//! A node that names its platform itself (the label or the annotation, no providerID) is its
//! provider's without asking; it gets one `CloudProviderClaimedNode` Normal event naming the
//! provider and the label or annotation it was claimed by (per node and host run), so such a
//! claim is never silent.
//!
//! Nodes without the taint are never claimed: a node that is not waiting for a cloud provider
//! (kwok, virtual kubelet, a kubelet without `--cloud-provider=external`) stays foreign.
//!
//! The providers' controllers start after the *first round* ([`FirstRound`]): every node that
//! was unclaimed when this controller started has been asked about once, and each claim has
//! reached the node cache (at most [`FIRST_ROUND_MAX`]; then they start without the rest, with
//! one log line). Otherwise a provider's service controller would build its load balancers
//! while its nodes were still being claimed: with no hosts (an `UnAvailableLoadBalancer`
//! warning) or too few, updated a moment later.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use tokio::sync::{broadcast, watch};

use super::ControllerContext;
use crate::provider::Provider;
use crate::runtime::events::{node_ref, EventRecorder, EventType};
use crate::runtime::informer::Change;
use crate::runtime::ownership::{Owner, Ownership, PLATFORM_LABEL};
use crate::runtime::patches::{is_conflict, is_not_found};
use crate::runtime::well_known::UNINITIALIZED_TAINT;
use crate::runtime::workqueue::WorkQueue;
use crate::runtime::CachedNode;

/// Controller name (calls, logs, the work queue).
pub const NAME: &str = "node-ownership-controller";
/// Event reason of a claim.
pub const CLAIMED_REASON: &str = "CloudProviderClaimedNode";
/// Event reason when no provider knows the node.
pub const UNCLAIMED_REASON: &str = "NoCloudProviderClaimsNode";
/// Event reason when a provider could not answer.
pub const UNKNOWN_REASON: &str = "NodeOwnershipUnknown";
const BACKOFF_BASE: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(300);
const WORKERS: usize = 4;

/// The longest the providers' controllers wait for the first round.
pub const FIRST_ROUND_MAX: Duration = Duration::from_secs(10);

/// Whether the first ownership round is over (see the module comment). Clones share it.
#[derive(Clone)]
pub struct FirstRound(Arc<watch::Sender<bool>>);

impl Default for FirstRound {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(false)))
    }
}

impl FirstRound {
    /// The round is over (or there is none: the controller does not run).
    pub fn finish(&self) {
        self.0.send_replace(true);
    }

    /// Wait until [`Self::finish`]: at most [`FIRST_ROUND_MAX`] and 5 s more, a backstop in
    /// case the controller ended without finishing the round (it does so itself after
    /// [`FIRST_ROUND_MAX`]).
    pub async fn finished(self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`, so the wait only ends by the value turning true or the
        // backstop.
        let _ = tokio::time::timeout(
            FIRST_ROUND_MAX + Duration::from_secs(5),
            rx.wait_for(|done| *done),
        )
        .await;
    }

    /// Is the round over?
    pub fn is_finished(&self) -> bool {
        *self.0.borrow()
    }
}

/// The nodes of the first round not decided yet: `finish`es the round when the last one is.
struct Pending {
    names: Mutex<HashSet<String>>,
    round: FirstRound,
}

impl Pending {
    /// `name` is decided for the first round.
    fn decided(&self, name: &str) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        if names.remove(name) && names.is_empty() {
            self.round.finish();
        }
    }
}

/// Is `node` waiting for a cloud provider to initialise it?
fn waits_for_initialisation(node: &CachedNode) -> bool {
    node.taints().iter().any(|t| t.key == UNINITIALIZED_TAINT)
}

/// What the providers said about one node.
enum Verdict {
    /// Provider index that knows it.
    Known(usize),
    /// Provider name and its error.
    Unknown(String, String),
    /// Nobody knows it.
    Nobody,
}

/// Run until `ctx.stop`: `ctx.nodes` must be the shared informer of every node. `first_round`
/// is finished when the nodes unclaimed at the start are decided (or after
/// [`FIRST_ROUND_MAX`]).
pub async fn run(
    ctx: ControllerContext,
    ownership: Ownership,
    providers: Vec<Provider>,
    first_round: FirstRound,
) {
    let mut changes = ctx.nodes.subscribe();
    tokio::select! {
        _ = ctx.stop.cancelled() => return,
        synced = ctx.nodes.wait_synced() => if !synced { return },
    }
    let queue: WorkQueue<String> = WorkQueue::new("NodeOwnership", BACKOFF_BASE, BACKOFF_MAX)
        .with_metrics(&ctx.metrics.workqueue);
    let candidate = {
        let ownership = ownership.clone();
        move |n: &CachedNode| ownership.owner(n) == Owner::Unclaimed && waits_for_initialisation(n)
    };
    let enqueue_all = |queue: &WorkQueue<String>| {
        for n in ctx.nodes.list() {
            if candidate(&n) {
                if let Some(name) = n.name_str() {
                    queue.add(name.to_string());
                }
            }
        }
    };
    // The first round: the candidates now, queued once and waited for.
    let initial: HashSet<String> = ctx
        .nodes
        .list()
        .iter()
        .filter(|n| candidate(n))
        .filter_map(|n| n.name_str().map(|n| n.to_string()))
        .collect();
    for name in &initial {
        queue.add(name.clone());
    }
    if initial.is_empty() {
        first_round.finish();
    }
    let pending = Arc::new(Pending {
        names: Mutex::new(initial),
        round: first_round.clone(),
    });
    // A node of the first round is decided once its claim reached the cache (it is no longer
    // a candidate there), or once it was asked about without a claim (no provider knows it,
    // or one could not answer: later rounds are not waited for).
    let still_candidate = {
        let (nodes, candidate) = (ctx.nodes.clone(), candidate.clone());
        move |name: &str| nodes.store().get(name).is_some_and(|n| candidate(&n))
    };
    let recorder = Arc::new(ctx.recorder(NAME));
    // Nodes whose claim was announced (an event), by this controller's claims or by their
    // own label or annotation.
    let announced: Announced = Arc::default();
    let announce = {
        let (ownership, recorder, announced) =
            (ownership.clone(), recorder.clone(), announced.clone());
        move |n: &CachedNode| {
            let (Some(name), Some((owner, by))) = (n.name_str(), ownership.declared_owner(n))
            else {
                return;
            };
            if !lock_set(&announced).insert(name.to_string()) {
                return;
            }
            let provider = &ownership.names()[owner];
            let message =
                format!("claimed by cloud provider {provider} because of the node's own {by}");
            tracing::info!(node = &**name, provider = provider.as_str(), "{message}");
            recorder.publish(node_ref(n), EventType::Normal, CLAIMED_REASON, message);
        }
    };
    for n in ctx.nodes.list() {
        announce(&n);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let (queue, ctx, ownership, providers, recorder, announced) = (
            queue.clone(),
            ctx.clone(),
            ownership.clone(),
            providers.clone(),
            recorder.clone(),
            announced.clone(),
        );
        let (pending, still_candidate) = (pending.clone(), still_candidate.clone());
        crate::controllers::spawn_in_span(&mut tasks, async move {
            while let Some(name) = queue.get().await {
                let retry = tokio::select! {
                    _ = ctx.stop.cancelled() => { queue.done(&name); break; }
                    r = claim(&ctx, &ownership, &providers, &recorder, &announced, &name) => r,
                };
                if retry {
                    queue.add_rate_limited(name.clone());
                } else {
                    queue.forget(&name);
                }
                if retry || !still_candidate(&name) {
                    pending.decided(&name);
                }
                queue.done(&name);
            }
        });
    }
    let deadline = tokio::time::sleep(FIRST_ROUND_MAX);
    tokio::pin!(deadline);
    loop {
        let change = tokio::select! {
            _ = ctx.stop.cancelled() => break,
            () = &mut deadline, if !first_round.is_finished() => {
                let left = pending.names.lock().unwrap_or_else(|p| p.into_inner()).len();
                tracing::warn!(
                    "{left} node(s) unclaimed at start still undecided after {FIRST_ROUND_MAX:?}: \
                     the cloud providers' controllers start without them (they join as they are claimed)"
                );
                first_round.finish();
                continue;
            }
            c = changes.recv() => c,
        };
        match change {
            Ok(Change::Added(n) | Change::Updated { new: n, .. }) => {
                announce(&n);
                if candidate(&n) {
                    if let Some(name) = n.name_str() {
                        queue.add(name.to_string());
                    }
                }
                // Decided from the cache, not from this change: changes made while the cache
                // first synced arrive after the pending set was built and may be older.
                if let Some(name) = n.name_str() {
                    if !still_candidate(name) {
                        pending.decided(name);
                    }
                }
            }
            Ok(Change::Deleted(n)) => {
                if let Some(name) = n.name_str() {
                    lock_set(&announced).remove(&**name);
                    if !still_candidate(name) {
                        pending.decided(name);
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(_)) => {
                enqueue_all(&queue);
                let names: Vec<String> = pending
                    .names
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .cloned()
                    .collect();
                for name in names.iter().filter(|n| !still_candidate(n)) {
                    pending.decided(name);
                }
            }
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
    queue.shutdown();
    while tasks.join_next().await.is_some() {}
}

/// Names of the nodes whose claim was announced.
type Announced = Arc<Mutex<HashSet<String>>>;

fn lock_set(set: &Announced) -> std::sync::MutexGuard<'_, HashSet<String>> {
    set.lock().unwrap_or_else(|p| p.into_inner())
}

/// One round for node `name`; true when it must be asked about again later.
async fn claim(
    ctx: &ControllerContext,
    ownership: &Ownership,
    providers: &[Provider],
    recorder: &EventRecorder,
    announced: &Announced,
    name: &str,
) -> bool {
    let Some(node) = ctx.nodes.store().get(name) else {
        return false;
    };
    if ownership.owner(&node) != Owner::Unclaimed || !waits_for_initialisation(&node) {
        return false;
    }
    match ask(providers, &node).await {
        Verdict::Known(i) => {
            let value = ownership.label_value(i).to_string();
            let provider = &ownership.names()[i];
            // This claim has its own event: the label it writes is not announced again.
            lock_set(announced).insert(name.to_string());
            let labelled = label_unless_claimed(&ctx.client, ownership, &node, &value).await;
            if matches!(labelled, Err(ref e) if !is_not_found(e)) {
                lock_set(announced).remove(name);
            }
            match labelled {
                Ok(Labelled::Yes) => {
                    let message = format!(
                        "cloud provider {provider} knows this node: labelled {PLATFORM_LABEL}={value}, so {provider} initialises it"
                    );
                    tracing::info!(node = name, provider = provider.as_str(), "{message}");
                    recorder.publish(node_ref(&node), EventType::Normal, CLAIMED_REASON, message);
                    false
                }
                Ok(Labelled::ClaimedMeanwhile) => {
                    tracing::info!(
                        node = name,
                        provider = provider.as_str(),
                        "node {name} was claimed while the providers were asked (another host's label, or a providerID): \
                         cloud provider {provider} leaves it to its owner"
                    );
                    false
                }
                Err(e) if is_not_found(&e) => false,
                Err(e) => {
                    tracing::warn!(
                        node = name,
                        "cannot label the node for cloud provider {provider}: {e}"
                    );
                    true
                }
            }
        }
        Verdict::Unknown(provider, why) => {
            let message = format!(
                "cannot tell which cloud provider owns this node: {provider} could not answer ({why}); asking again later"
            );
            tracing::warn!(node = name, provider = provider.as_str(), "{message}");
            recorder.publish(node_ref(&node), EventType::Warning, UNKNOWN_REASON, message);
            true
        }
        Verdict::Nobody => {
            let message = format!(
                "no cloud provider of this host ({}) knows this node: it is left to another cloud controller \
                 manager, and stays uninitialised if none owns it (set its spec.providerID or the label \
                 {PLATFORM_LABEL}, or run the provider that owns it)",
                ownership.names().join(", ")
            );
            tracing::warn!(node = name, "{message}");
            recorder.publish(
                node_ref(&node),
                EventType::Warning,
                UNCLAIMED_REASON,
                message,
            );
            true
        }
    }
}

/// What [`label_unless_claimed`] did.
enum Labelled {
    Yes,
    /// The node got an owner (or lost the taint) since it was read: left alone.
    ClaimedMeanwhile,
}

/// Attempts at the conditional label write before the round is retried later.
const LABEL_ATTEMPTS: u32 = 5;

/// Label `node` `PLATFORM_LABEL=value` only if it is still unclaimed and waiting: the patch
/// carries the resourceVersion the decision was made on, so a label or providerID written in
/// the meantime (another host claiming the node while this one asked its providers, a kubelet
/// setting its providerID) makes it a Conflict; the node is then read again and decided anew.
/// Without the precondition the later of two hosts that both know a node overwrote the
/// first's claim (found by tests/hybrid.rs).
async fn label_unless_claimed(
    client: &kube::Client,
    ownership: &Ownership,
    node: &CachedNode,
    value: &str,
) -> Result<Labelled, kube::Error> {
    let name = node.name();
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let mut current = node.clone();
    let mut attempt = 1;
    loop {
        if ownership.owner(&current) != Owner::Unclaimed || !waits_for_initialisation(&current) {
            return Ok(Labelled::ClaimedMeanwhile);
        }
        let body = serde_json::json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "labels": {PLATFORM_LABEL: value},
        }});
        match api
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&body),
            )
            .await
        {
            Ok(_) => return Ok(Labelled::Yes),
            Err(e) if is_conflict(&e) && attempt < LABEL_ATTEMPTS => {
                attempt += 1;
                current = CachedNode::from(api.get(name).await?);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Ask the providers in order whether they know `node`; the first "yes" wins, the first error
/// ends the round.
async fn ask(providers: &[Provider], node: &CachedNode) -> Verdict {
    let name = node.name();
    for (i, provider) in providers.iter().enumerate() {
        let caps = provider.capabilities();
        let known = if caps.instances_v2 {
            provider.instance_exists(node).await
        } else if caps.instances {
            match provider.instance_id(name).await {
                Ok(_) => Ok(true),
                Err(e) if e.is_not_found() => Ok(false),
                Err(e) => Err(e),
            }
        } else {
            // A provider without instances cannot own nodes.
            continue;
        };
        match known {
            Ok(true) => return Verdict::Known(i),
            Ok(false) => {}
            Err(e) => {
                return Verdict::Unknown(provider.registered_name().to_string(), e.to_string())
            }
        }
    }
    Verdict::Nobody
}
