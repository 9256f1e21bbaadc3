//! The service load-balancer controller (canonical `service-lb-controller`, alias `service`):
//! provisions a cloud load balancer for every Service of type `LoadBalancer`, keeps its hosts in
//! line with the nodes, publishes its address in `status.loadBalancer`, and deletes it when the
//! Service goes away (docs/upstream-compat.md#service-controller).
//!
//! Upstream behaviour, kept exactly:
//! - The finalizer `service.kubernetes.io/load-balancer-cleanup` is added before any cloud call
//!   and removed only after the load balancer is deleted; finalizer and `status.loadBalancer` are
//!   patched through `services/status`, and only when they change (nil ingress == empty).
//! - A `service` queue (`--concurrent-service-syncs` workers) and a `node` queue (one worker that
//!   fans out over the cached load-balancer services with the same parallelism); both back off
//!   per key from 5 s to 300 s. (Upstream queues each changed node's name and syncs every
//!   service for each key; here every node change queues the one key [`NODE_SYNC_KEY`], so any
//!   number of changes coalesce into one full node sync with the same outcome: see "Deliberate
//!   differences".) A provider `RetryAfter` error re-adds the service after exactly
//!   that delay without counting a failure.
//! - Beyond upstream: a provider call the cloud throttled (ABI 1.1 `THROTTLED`) re-adds the
//!   service after the provider's pause without counting a failure, and the service gets a
//!   `CloudProviderThrottled` Warning event instead of `SyncLoadBalancerFailed`,
//!   `DeleteLoadBalancerFailed` or `UpdateLoadBalancerFailed`.
//! - Node sync lists nodes fresh for each service, stores the host set as last-synced before the
//!   cloud call, and retries failures through a full EnsureLoadBalancer on the service queue.
//! - Events (component `service-controller`) with upstream reasons and messages.
//!
//! # Beyond upstream: loadBalancerClass routing
//! Upstream ignores every Service that sets `spec.loadBalancerClass`. `--load-balancer-class
//! NAME` (repeatable) makes this host also handle Services of class `NAME`; Services without a
//! class keep the upstream behaviour unless `--ignore-classless-services` is set, which leaves
//! them to another controller. Both are off by default, so the upstream semantics hold. A
//! Service this host does not handle is treated exactly like upstream treats a Service with a
//! class: it is not provisioned, and if it still carries our finalizer its deletion cleans up
//! the load balancer this host created.
//!
//! # Deliberate differences (docs/upstream-compat.md#service-controller)
//! - Reading and storing a service's last-synced host set happen under one lock (upstream takes
//!   the lock twice), so two node syncs can never interleave between them.
//! - A panic while syncing a service is turned into a sync error (rate-limited retry) instead of
//!   killing the worker.
//! - One node-queue key for all node changes. Each upstream node sync already covers every
//!   service and every node, so syncing once per changed node only repeats the same work: at
//!   start-up with 5,000 nodes upstream runs 5,000 full node syncs (O(nodes² × LB services)),
//!   here one. A change arriving during a sync still queues exactly one more sync.
//! - One host set per node sync ([`node_sync::Round`]), one shared serialisation of it for full
//!   `UpdateLoadBalancer` calls, and the ABI 1.2 incremental host update (only the added and
//!   removed nodes) for plugins that offer it (docs/abi-1.2.md), from the first change after an
//!   EnsureLoadBalancer on (`LAST_FULL`). Last-synced sets are shared sorted (name, providerID)
//!   keys, not node lists; consecutive ensures over the same nodes share one host list. Node syncs start at least
//!   `--node-sync-interval` apart, so during mass node changes a load balancer gets at most one
//!   host update per interval (staleness bound: docs/architecture.md).
//! - The shared cache does not hold services that cannot have a load balancer
//!   ([`crate::controllers::cache_trim`]). A key missing from the cache is read from the API
//!   before it is treated as deleted, so the decisions are upstream's.

pub(crate) mod node_sync;
pub mod predicates;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ccm_provider_abi::{ErrorKind, ProviderError};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Service};
use kube::Api;
use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio::task::JoinSet;

use super::node::kube_error_text;
pub use super::sync_error::{Requeue, SyncError};
use super::{publish_throttled, Controller, ControllerContext, ControllerName, NotStarted, Start};
use crate::provider::{HostList, Throttled};
use crate::runtime::events::{service_ref, EventRecorder, EventType};
use crate::runtime::informer::Change;
use crate::runtime::patches::{is_not_found, patch_service_status};
use crate::runtime::well_known::{
    LB_CLEANUP_FINALIZER, LB_PROVIDER_ANNOTATION, LB_PROVIDER_CONDITION,
    LB_PROVIDER_CONDITION_REASON,
};
use crate::runtime::workqueue::WorkQueue;
use crate::runtime::CachedNode;
use ccm_provider_abi::ext_v1_2::{ExtCapabilitiesV1_2, LAST_FULL, NO_BASE};

pub use predicates::ClassPolicy;
use predicates::{
    has_lb_finalizer, has_lb_ingress, load_balancer_status_equal, needs_cleanup, needs_update,
    should_sync_updated_node, split_key, update_failed_message,
};

/// Canonical controller name.
pub const NAME: &str = "service-lb-controller";
/// Alias.
pub const ALIAS: &str = "service";
/// Event source component.
pub const COMPONENT: &str = "service-controller";
/// Per-key backoff of both queues.
pub const MIN_RETRY_DELAY: Duration = Duration::from_secs(5);
/// Cap of the per-key backoff.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);
/// Service resync: services needing cleanup are re-queued this often.
pub const SERVICE_SYNC_PERIOD: Duration = Duration::from_secs(30);

const NO_NODES_MESSAGE: &str = "There are no available nodes for LoadBalancer";

/// Event reason (Warning, beyond upstream) when a Service's [`LB_PROVIDER_ANNOTATION`] names
/// another provider than the one that owns its load balancer: the annotation is ignored.
pub const LB_PROVIDER_ANNOTATION_IGNORED: &str = "LoadBalancerProviderAnnotationIgnored";

/// The provider the host recorded as owner of `svc`'s load balancer ([`LB_PROVIDER_CONDITION`]).
pub fn recorded_lb_provider(svc: &Service) -> Option<&str> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == LB_PROVIDER_CONDITION)
        .map(|c| c.message.as_str())
        .filter(|m| !m.is_empty())
}

fn lb_provider_annotation(svc: &Service) -> Option<&str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LB_PROVIDER_ANNOTATION))
        .map(String::as_str)
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// Start condition: the provider must support load balancers.
pub fn check(ctx: &ControllerContext) -> Result<(), NotStarted> {
    if ctx.provider.capabilities().load_balancer {
        Ok(())
    } else {
        Err(NotStarted(
            "the cloud provider does not support external load balancers".into(),
        ))
    }
}

/// The service (load balancer) controller in the start-up table ([`super::CONTROLLERS`]).
pub const CONTROLLER: Controller = Controller {
    name: ControllerName {
        canonical: NAME,
        alias: ALIAS,
        client: "service-controller",
    },
    start: |ctx| Start::when(check(ctx), || run(ctx.clone())),
};

/// Run until `ctx.stop` is cancelled (skipped with a warning if [`check`] fails).
pub async fn run(ctx: ControllerContext) {
    match ServiceController::new(ctx) {
        Ok(c) => c.run().await,
        Err(e) => tracing::warn!(controller = NAME, "not started: {e}"),
    }
}

/// Which branch a sync took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Delete,
    Ensure,
}

/// The controller's state. Most callers only need [`run`]; the methods are public so tests can
/// drive single steps as upstream's unit tests do.
pub struct ServiceController {
    ctx: ControllerContext,
    recorder: EventRecorder,
    policy: ClassPolicy,
    workers: usize,
    /// Services processed and not yet deleted (upstream's service cache).
    cache: Mutex<HashMap<String, Arc<Service>>>,
    /// Host sets last sent to the cloud, per service key.
    last_synced: Mutex<node_sync::LastSynced>,
    /// Services whose EnsureLoadBalancer has succeeded (beyond upstream, see `node_sync_service`).
    ensured: Mutex<HashSet<String>>,
    /// ABI 1.2: per service key, the token of the host set the plugin acknowledged last
    /// (docs/abi-1.2.md). Taken out while an update runs; forgotten by EnsureLoadBalancer, a
    /// failed update and the service's deletion.
    host_tokens: Mutex<HashMap<String, u64>>,
    /// The next token to hand out (never `NO_BASE`; `LAST_FULL` is never reached).
    next_token: AtomicU64,
    /// ABI 1.2: per service key, a count bumped when a host update starts and when it ends (odd:
    /// one is in flight). An EnsureLoadBalancer during which it did not move leaves the plugin
    /// holding exactly the ensure's hosts, so the next update may be a difference against them
    /// (`LAST_FULL`).
    host_updates: Mutex<HashMap<String, u64>>,
    /// The most recent host set of any listing: a listing with equal hosts shares it
    /// ([`node_sync::Round::new`]).
    latest_hosts: Mutex<Option<node_sync::HostKeys>>,
    /// The host list of the last EnsureLoadBalancer and the nodes it was made from, kept while
    /// the service queue has work: a burst of ensures over unchanged nodes (start-up, a large
    /// cluster's convergence) serialises the hosts once, not once per load balancer.
    ensure_hosts: Mutex<Option<(node_sync::HostSet, HostList)>>,
    /// Numbers the node listings whose host sets are stored ([`node_sync::Stored`]), in order.
    listings: AtomicU64,
    /// The provider answered the 1.2 call `NOT_IMPLEMENTED`: full updates from now on.
    incremental_off: AtomicBool,
    /// Least time between the starts of two node syncs ([`ControllerConfig::node_sync_interval`]).
    node_sync_interval: Duration,
    service_queue: WorkQueue<String>,
    node_queue: WorkQueue<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// client-go `MetaNamespaceKeyFunc` of a service: the key of its queue and of the cache.
fn service_key(svc: &Service) -> String {
    crate::runtime::informer::cache_key(svc)
}

/// Not of type LoadBalancer, yet `status.loadBalancer.ingress` is not empty.
fn stale_lb_status(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer")
        && has_lb_ingress(svc)
}

/// The node queue's only key: every node change asks for one full node sync.
pub const NODE_SYNC_KEY: &str = "node-sync";

impl ServiceController {
    /// Build the controller (upstream `New`): fails when the provider has no LoadBalancer.
    pub fn new(ctx: ControllerContext) -> Result<Arc<Self>, NotStarted> {
        check(&ctx)?;
        let recorder = ctx.recorder(COMPONENT);
        let policy = ClassPolicy::from_config(&ctx.config);
        let workers = ctx.config.concurrent_service_syncs.max(1);
        Ok(Arc::new(Self {
            recorder,
            policy,
            workers,
            cache: Mutex::default(),
            last_synced: Mutex::default(),
            ensured: Mutex::default(),
            host_tokens: Mutex::default(),
            next_token: AtomicU64::new(NO_BASE + 1),
            host_updates: Mutex::default(),
            latest_hosts: Mutex::default(),
            ensure_hosts: Mutex::default(),
            listings: AtomicU64::new(0),
            incremental_off: AtomicBool::new(false),
            node_sync_interval: ctx.config.node_sync_interval,
            service_queue: WorkQueue::new(
                &ctx.queue_name("service"),
                MIN_RETRY_DELAY,
                MAX_RETRY_DELAY,
            )
            .with_metrics(&ctx.metrics.workqueue),
            node_queue: WorkQueue::new(&ctx.queue_name("node"), MIN_RETRY_DELAY, MAX_RETRY_DELAY)
                .with_metrics(&ctx.metrics.workqueue),
            ctx,
        }))
    }

    /// The service queue (keys `namespace/name`).
    pub fn service_queue(&self) -> &WorkQueue<String> {
        &self.service_queue
    }

    /// The node queue (keys: node names; any key syncs every service).
    pub fn node_queue(&self) -> &WorkQueue<String> {
        &self.node_queue
    }

    /// The cached (last processed) version of a service.
    pub fn cached_service(&self, key: &str) -> Option<Arc<Service>> {
        lock(&self.cache).get(key).cloned()
    }

    /// Whether the service's EnsureLoadBalancer has succeeded in this process: from then on
    /// node syncs update its hosts (before, they hand it back to the service queue).
    pub fn is_ensured(&self, key: &str) -> bool {
        lock(&self.ensured).contains(key)
    }

    /// Names of the hosts last sent to the cloud for a service, sorted.
    pub fn last_synced_node_names(&self, key: &str) -> Option<Vec<String>> {
        lock(&self.last_synced)
            .get(key)
            .map(|stored| stored.hosts.iter().map(|h| h.name().to_string()).collect())
    }

    fn event(&self, svc: &Service, type_: EventType, reason: &str, message: impl Into<String>) {
        self.recorder
            .publish(service_ref(svc), type_, reason, message);
    }

    /// Whether this controller's provider is the one to act on `svc` at all. One provider
    /// without ownership: always (upstream). With ownership enforced (hybrid clusters, or one
    /// host per provider), decided from what users cannot change behind the host's back, so no
    /// provider ever cleans up, or drops the finalizer of, another provider's load balancer:
    ///
    /// 1. the host's own record, [`LB_PROVIDER_CONDITION`] in `status` (written through
    ///    `services/status`, which editing a Service does not reach);
    /// 2. else, for a `LoadBalancer` Service, its class (or classlessness): the API server
    ///    keeps `loadBalancerClass` immutable while the type is `LoadBalancer`;
    /// 3. else (a Service that stopped being a LoadBalancer before the host recorded it) the
    ///    [`LB_PROVIDER_ANNOTATION`] written with the finalizer, else the class.
    ///
    /// An annotation that disagrees with 1 or 2 is ignored with a Warning event
    /// ([`LB_PROVIDER_ANNOTATION_IGNORED`]).
    fn responsible(&self, svc: &Service) -> bool {
        let Some(me) = self.ctx.lb_provider.as_deref() else {
            return true;
        };
        if let Some(owner) = recorded_lb_provider(svc) {
            return owner == me;
        }
        if is_load_balancer(svc) {
            return self.policy.claims(svc);
        }
        match lb_provider_annotation(svc) {
            Some(owner) => owner == me,
            None => self.policy.claims(svc),
        }
    }

    /// With ownership enforced, a Service this provider is responsible for whose
    /// [`LB_PROVIDER_ANNOTATION`] names another provider: say once per sync that it is ignored.
    fn warn_forged_annotation(&self, svc: &Service) {
        let Some(me) = self.ctx.lb_provider.as_deref() else {
            return;
        };
        let Some(named) = lb_provider_annotation(svc) else {
            return;
        };
        if named == me {
            return;
        }
        let by = if recorded_lb_provider(svc).is_some() {
            format!("the host's record ({LB_PROVIDER_CONDITION} in status)")
        } else {
            "its load balancer class".to_string()
        };
        tracing::warn!(controller = NAME, service = %service_key(svc), "{LB_PROVIDER_ANNOTATION}={named} ignored: the load balancer is {me}'s by {by}");
        self.event(
            svc,
            EventType::Warning,
            LB_PROVIDER_ANNOTATION_IGNORED,
            format!(
                "Annotation {LB_PROVIDER_ANNOTATION}={named} ignored: this Service's load balancer is provider {me}'s by {by}; {me} keeps serving and cleaning it up"
            ),
        );
    }

    fn cluster(&self) -> &str {
        &self.ctx.config.cluster_name
    }

    // ---- event handlers ---------------------------------------------------------------------

    fn on_service_added(&self, svc: &Service) {
        // Beyond upstream: also a service that is not of type LoadBalancer but still shows a
        // load-balancer ingress. Its cleanup stopped half-way (the previous leader died between
        // removing the finalizer and clearing the status, or after a failed status patch), and
        // upstream never looks at it again; the delete branch of its sync clears the status.
        // Found by the reliability soak.
        if (self.policy.wants_load_balancer(svc) || needs_cleanup(svc) || stale_lb_status(svc))
            && self.responsible(svc)
        {
            self.service_queue.add(service_key(svc));
        }
    }

    fn on_service_updated(&self, old: &Service, new: &Service) {
        if (needs_update(&self.policy, old, new) || needs_cleanup(new)) && self.responsible(new) {
            self.service_queue.add(service_key(new));
        }
    }

    fn on_service_change(&self, change: &Change<Service>) {
        match change {
            // Upstream's add handler; the stale-status clause of `on_service_added` is for the
            // replay at start (a service entering the trimmed cache also arrives as Added, and
            // upstream queues nothing for an ingress appearing on a non-LoadBalancer service).
            Change::Added(svc) => {
                if (self.policy.wants_load_balancer(svc) || needs_cleanup(svc))
                    && self.responsible(svc)
                {
                    self.service_queue.add(service_key(svc));
                }
            }
            Change::Updated { old, new } => self.on_service_updated(old, new),
            // Deletion is driven by the deletionTimestamp update while the finalizer holds the
            // object; a service deleted without it is found missing by a later sync.
            Change::Deleted(_) => {}
        }
    }

    fn on_node_change(&self, change: &Change<CachedNode>) {
        match change {
            Change::Added(_) | Change::Deleted(_) => self.queue_node_sync(),
            Change::Updated { old, new } => {
                if should_sync_updated_node(old, new) {
                    self.queue_node_sync();
                }
            }
        }
    }

    fn queue_node_sync(&self) {
        self.node_queue.add(NODE_SYNC_KEY.to_string());
    }

    /// What a (re)registered handler sees: an add for every cached object.
    fn replay_all(&self) {
        for svc in self.ctx.services.list() {
            self.on_service_added(&svc);
        }
        // Also with no nodes left: the last ones may have been deleted while we lagged.
        self.queue_node_sync();
    }

    /// Upstream's 30 s service resync: old == new, so only services needing cleanup re-queue.
    fn resync_services(&self) {
        for svc in self.ctx.services.list() {
            if needs_cleanup(&svc) && self.responsible(&svc) {
                self.service_queue.add(service_key(&svc));
            }
        }
    }

    // ---- run loop ---------------------------------------------------------------------------

    /// Run until `ctx.stop` is cancelled.
    pub async fn run(self: Arc<Self>) {
        let stop = self.ctx.stop.clone();
        let mut services = self.ctx.services.subscribe();
        let mut nodes = self.ctx.nodes.subscribe();
        let synced = tokio::select! {
            _ = stop.cancelled() => false,
            ok = async { self.ctx.services.wait_synced().await && self.ctx.nodes.wait_synced().await } => ok,
        };
        if !synced {
            return;
        }
        tracing::info!(
            controller = NAME,
            workers = self.workers,
            "starting service controller"
        );
        self.ctx.metrics.set_running(ALIAS, true);
        self.replay_all();

        let mut tasks = JoinSet::new();
        for _ in 0..self.workers {
            let this = self.clone();
            crate::controllers::spawn_in_span(&mut tasks, async move {
                while this.process_next_service_item().await.is_some() {}
            });
        }
        {
            let this = self.clone();
            crate::controllers::spawn_in_span(&mut tasks, async move {
                // Coalescing (beyond upstream): a node sync starts at least
                // `node_sync_interval` after the previous one started. Changes arriving
                // meanwhile only mark the one node key, so during mass node changes each load
                // balancer gets at most one host update per interval; a change after a quiet
                // spell is synced at once. Staleness bound: docs/architecture.md.
                let mut last_start: Option<tokio::time::Instant> = None;
                loop {
                    if let Some(start) = last_start {
                        tokio::time::sleep_until(start + this.node_sync_interval).await;
                    }
                    let Some(key) = this.node_queue.get().await else {
                        break;
                    };
                    last_start = Some(tokio::time::Instant::now());
                    this.process_node_item(key).await;
                }
            });
        }

        let mut resync = tokio::time::interval(SERVICE_SYNC_PERIOD);
        resync.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = resync.tick() => self.resync_services(),
                change = services.recv() => match change {
                    Ok(c) => self.on_service_change(&c),
                    Err(broadcast::error::RecvError::Lagged(_)) => self.replay_all(),
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                change = nodes.recv() => match change {
                    Ok(c) => self.on_node_change(&c),
                    Err(broadcast::error::RecvError::Lagged(_)) => self.replay_all(),
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        self.service_queue.shutdown();
        self.node_queue.shutdown();
        // Workers in the middle of a provider call are dropped, which cancels the call.
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        self.ctx.metrics.set_running(ALIAS, false);
        tracing::info!(controller = NAME, "shutting down service controller");
    }

    /// Take one service key, sync it and re-queue it per the retry policy. `None` once the
    /// queue is shut down.
    pub async fn process_next_service_item(&self) -> Option<(String, Requeue)> {
        let key = self.service_queue.get().await?;
        let result = AssertUnwindSafe(self.sync_service(&key))
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Err(SyncError::new(format!("panic while syncing service {key}"))));
        let requeue = Requeue::of(&result);
        if let Err(e) = &result {
            match requeue {
                // Not the service's failure: after the provider's pause, back-off unchanged.
                Requeue::Throttled(pause) => tracing::info!(
                    controller = NAME,
                    "error processing service {key} (throttled; retrying after {pause:?}): {e}"
                ),
                Requeue::After(after) => tracing::warn!(
                    controller = NAME,
                    "error processing service {key} (retrying in {after:?}): {e}"
                ),
                Requeue::RateLimited | Requeue::Forgotten => tracing::error!(
                    controller = NAME,
                    "error processing service {key} (retrying with exponential backoff): {e}"
                ),
            }
        }
        requeue.apply(&self.service_queue, &key, Duration::ZERO);
        self.service_queue.done(&key);
        if self.service_queue.is_empty() {
            self.release_ensure_hosts();
        }
        Some((key, requeue))
    }

    /// Take one node key and sync every service's hosts; services that failed are added to the
    /// service queue. Returns false once the queue is shut down.
    pub async fn process_next_node_item(&self) -> bool {
        let Some(key) = self.node_queue.get().await else {
            return false;
        };
        self.process_node_item(key).await;
        true
    }

    async fn process_node_item(&self, key: String) {
        for svc in self.sync_nodes().await {
            self.service_queue.add(svc);
        }
        self.node_queue.forget(&key);
        self.node_queue.done(&key);
    }

    // ---- service sync -----------------------------------------------------------------------

    /// Upstream `syncService`: sync one `namespace/name` key.
    pub async fn sync_service(&self, key: &str) -> Result<(), SyncError> {
        let (ns, name) = split_key(key).map_err(SyncError::new)?;
        let found = self.ctx.services.store().get(key);
        match found {
            // Not cached: deleted, or (beyond upstream) a service that cannot have a load
            // balancer, which the cache does not keep (`cache_trim`). Upstream's lister would
            // still hold the latter, so read it: a live object takes upstream's "found" path
            // (a load balancer left behind by a service that turned ClusterIP before this
            // process ever synced it is still found and deleted).
            None => {
                let api: Api<Service> = Api::namespaced(self.ctx.client.clone(), &ns);
                match api.get_opt(&name).await {
                    Ok(Some(live)) => self.process_service_create_or_update(live, key).await,
                    Ok(None) => self.process_service_deletion(key).await,
                    Err(e) => Err(SyncError::new(format!(
                        "failed to get service {key}: {}",
                        kube_error_text(&e)
                    ))),
                }
            }
            Some(svc) => {
                self.process_service_create_or_update((*svc).clone(), key)
                    .await
            }
        }
    }

    async fn process_service_deletion(&self, key: &str) -> Result<(), SyncError> {
        let Some(cached) = self.cached_service(key) else {
            return Ok(());
        };
        tracing::info!(
            controller = NAME,
            "service {key} has been deleted; cleaning up its load balancer"
        );
        self.process_load_balancer_delete(&cached).await?;
        lock(&self.cache).remove(key);
        lock(&self.last_synced).remove(key);
        lock(&self.host_tokens).remove(key);
        lock(&self.ensured).remove(key);
        Ok(())
    }

    /// Delete the load balancer of a cached service that is gone (or was re-created).
    async fn process_load_balancer_delete(&self, svc: &Service) -> Result<(), SyncError> {
        if !self.policy.wants_load_balancer(svc) || !self.responsible(svc) {
            return Ok(());
        }
        self.event(
            svc,
            EventType::Normal,
            "DeletingLoadBalancer",
            "Deleting load balancer",
        );
        if let Err(e) = self
            .ctx
            .provider
            .ensure_load_balancer_deleted(self.cluster(), svc)
            .await
        {
            match Throttled::of(&e) {
                Some(t) => publish_throttled(&self.recorder, service_ref(svc), &t),
                None => self.event(
                    svc,
                    EventType::Warning,
                    "DeleteLoadBalancerFailed",
                    format!("Error deleting load balancer: {e}"),
                ),
            }
            return Err(SyncError::provider(&e));
        }
        self.event(
            svc,
            EventType::Normal,
            "DeletedLoadBalancer",
            "Deleted load balancer",
        );
        Ok(())
    }

    async fn process_service_create_or_update(
        &self,
        svc: Service,
        key: &str,
    ) -> Result<(), SyncError> {
        if !self.responsible(&svc) {
            // Another provider's Service (hybrid clusters): not ours to touch.
            return Ok(());
        }
        self.warn_forged_annotation(&svc);
        if let Some(cached) = self.cached_service(key) {
            if cached.metadata.uid != svc.metadata.uid {
                // Deleted and re-created (without the finalizer) between two syncs.
                lock(&self.ensured).remove(key);
                self.process_load_balancer_delete(&cached).await?;
            }
        }
        lock(&self.cache).insert(key.to_string(), Arc::new(svc.clone()));
        match self.sync_load_balancer_if_needed(&svc, key).await {
            Err(e) => {
                match e.throttled() {
                    Some(t) => publish_throttled(&self.recorder, service_ref(&svc), t),
                    None => self.event(
                        &svc,
                        EventType::Warning,
                        "SyncLoadBalancerFailed",
                        format!("Error syncing load balancer: {e}"),
                    ),
                }
                Err(e)
            }
            Ok(Op::Delete) => {
                lock(&self.cache).remove(key);
                lock(&self.last_synced).remove(key);
                lock(&self.host_tokens).remove(key);
                lock(&self.host_updates).remove(key);
                lock(&self.ensured).remove(key);
                Ok(())
            }
            Ok(Op::Ensure) => {
                lock(&self.ensured).insert(key.to_string());
                Ok(())
            }
        }
    }

    async fn sync_load_balancer_if_needed(
        &self,
        svc: &Service,
        key: &str,
    ) -> Result<Op, SyncError> {
        let previous = svc.status.as_ref().and_then(|s| s.load_balancer.clone());
        let (op, new_status) = if !self.policy.wants_load_balancer(svc) || needs_cleanup(svc) {
            let exists = self
                .ctx
                .provider
                .get_load_balancer(self.cluster(), svc)
                .await
                .map_err(|e| {
                    SyncError::mentioning(
                        format!("failed to check if load balancer exists before cleanup: {e}"),
                        &e,
                    )
                })?
                .is_some();
            if exists {
                tracing::info!(
                    controller = NAME,
                    "deleting existing load balancer for service {key}"
                );
                self.event(
                    svc,
                    EventType::Normal,
                    "DeletingLoadBalancer",
                    "Deleting load balancer",
                );
                match self
                    .ctx
                    .provider
                    .ensure_load_balancer_deleted(self.cluster(), svc)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::IMPLEMENTED_ELSEWHERE => {
                        tracing::debug!(controller = NAME, "load balancer of {key} is implemented elsewhere; ignoring the deletion error");
                    }
                    Err(e) => {
                        return Err(SyncError::mentioning(
                            format!("failed to delete load balancer: {e}"),
                            &e,
                        ))
                    }
                }
            }
            self.remove_finalizer(svc).await.map_err(|e| {
                SyncError::new(format!(
                    "failed to remove load balancer cleanup finalizer: {}",
                    api_message(&e)
                ))
            })?;
            self.event(
                svc,
                EventType::Normal,
                "DeletedLoadBalancer",
                "Deleted load balancer",
            );
            (Op::Delete, LoadBalancerStatus::default())
        } else {
            tracing::info!(
                controller = NAME,
                "ensuring load balancer for service {key}"
            );
            self.event(
                svc,
                EventType::Normal,
                "EnsuringLoadBalancer",
                "Ensuring load balancer",
            );
            self.add_finalizer(svc).await.map_err(|e| {
                SyncError::new(format!(
                    "failed to add load balancer cleanup finalizer: {}",
                    api_message(&e)
                ))
            })?;
            let status = match self.ensure_load_balancer(svc, key).await {
                Ok(Some(status)) => status,
                Ok(None) => {
                    return Err(SyncError::new(
                        "service status returned by EnsureLoadBalancer is nil",
                    ))
                }
                Err(e) if e.kind() == ErrorKind::IMPLEMENTED_ELSEWHERE => {
                    tracing::debug!(
                        controller = NAME,
                        "load balancer of {key} is implemented elsewhere; nothing to do"
                    );
                    return Ok(Op::Ensure);
                }
                Err(e) => {
                    return Err(SyncError::wrapping(
                        format!("failed to ensure load balancer: {e}"),
                        &e,
                    ));
                }
            };
            self.event(
                svc,
                EventType::Normal,
                "EnsuredLoadBalancer",
                "Ensured load balancer",
            );
            (Op::Ensure, status)
        };
        match self.patch_status(svc, previous.as_ref(), &new_status).await {
            Ok(()) => Ok(op),
            // The service vanished right after its finalizer was removed.
            Err(e) if is_not_found(&e) => Ok(op),
            Err(e) => Err(SyncError::new(format!(
                "failed to update load balancer status: {}",
                api_message(&e)
            ))),
        }
    }

    async fn ensure_load_balancer(
        &self,
        svc: &Service,
        key: &str,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let listing = self.new_listing();
        if listing.hosts().is_empty() {
            self.event(
                svc,
                EventType::Warning,
                "UnAvailableLoadBalancer",
                NO_NODES_MESSAGE,
            );
        }
        // A full call: the plugin's 1.2 token for this load balancer is void.
        lock(&self.host_tokens).remove(key);
        let updates_before = self.host_updates_of(key);
        lock(&self.last_synced).insert(key.to_string(), listing.stored());
        let result = match self.ensure_host_list(listing.hosts()) {
            Ok(hosts) => {
                self.ctx
                    .provider
                    .ensure_load_balancer_shared(self.cluster(), svc, &hosts)
                    .await
            }
            Err(e) => Err(e),
        };
        let overlapped =
            !updates_before.is_multiple_of(2) || self.host_updates_of(key) != updates_before;
        if overlapped {
            // Beyond upstream: a host update of this load balancer ran (or was running) during
            // the ensure, and which of the two the cloud applied last is unknown; upstream
            // leaves the ensure's possibly older hosts in place until the next node change.
            // Forget the stored set and the token, so that a node sync sends the whole current
            // set, and ask for one.
            lock(&self.last_synced).remove(key);
            lock(&self.host_tokens).remove(key);
            self.queue_node_sync();
        } else if matches!(result, Ok(Some(_))) && self.incremental() {
            // The plugin holds exactly the hosts stored above: the next change may be a
            // difference against them.
            lock(&self.host_tokens)
                .entry(key.to_string())
                .or_insert(LAST_FULL);
        }
        result
    }

    /// The JSON of `hosts` for EnsureLoadBalancer: the last ensure's when it was made from the
    /// very same node objects, else made now (and kept for the next ensure).
    fn ensure_host_list(&self, hosts: &node_sync::HostSet) -> Result<HostList, ProviderError> {
        let mut cached = lock(&self.ensure_hosts);
        if let Some((set, list)) = cached.as_ref() {
            if set.len() == hosts.len()
                && set.iter().zip(hosts.iter()).all(|(a, b)| Arc::ptr_eq(a, b))
            {
                return Ok(list.clone());
            }
        }
        let list = HostList::new(hosts)?;
        *cached = Some((hosts.clone(), list.clone()));
        Ok(list)
    }

    /// The service queue is drained: let the ensures' host list go, and give its pages back
    /// when it was large.
    fn release_ensure_hosts(&self) {
        let Some((_, list)) = lock(&self.ensure_hosts).take() else {
            return;
        };
        list.release();
    }

    fn host_updates_of(&self, key: &str) -> u64 {
        lock(&self.host_updates).get(key).copied().unwrap_or(0)
    }

    fn bump_host_updates(&self, key: &str) {
        *lock(&self.host_updates).entry(key.to_string()).or_default() += 1;
    }

    async fn add_finalizer(&self, svc: &Service) -> Result<(), kube::Error> {
        let recorded = match &self.ctx.lb_provider {
            Some(provider) => recorded_lb_provider(svc) == Some(provider.as_ref()),
            None => true,
        };
        if has_lb_finalizer(svc) && recorded {
            return Ok(());
        }
        let body = match &self.ctx.lb_provider {
            // Ownership enforced (several providers, or one host per provider): the Service
            // also records whose load balancer it gets, so the cleanup after a type change
            // (which clears the class) is that provider's alone: in status, where editing the
            // Service cannot reach ([`Self::responsible`]), and as an annotation for people.
            Some(provider) => json!({
                "metadata": {
                    "finalizers": [LB_CLEANUP_FINALIZER],
                    "annotations": {LB_PROVIDER_ANNOTATION: provider.as_ref()},
                },
                "status": {"conditions": [{
                    "type": LB_PROVIDER_CONDITION,
                    "status": "True",
                    "reason": LB_PROVIDER_CONDITION_REASON,
                    "message": provider.as_ref(),
                    "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::now(),
                    ),
                }]},
            }),
            None => json!({"metadata": {"finalizers": [LB_CLEANUP_FINALIZER]}}),
        };
        patch_service_status(&self.ctx.client, svc, &body)
            .await
            .map(|_| ())
    }

    async fn remove_finalizer(&self, svc: &Service) -> Result<(), kube::Error> {
        if !has_lb_finalizer(svc) {
            return Ok(());
        }
        let body =
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [LB_CLEANUP_FINALIZER]}});
        patch_service_status(&self.ctx.client, svc, &body)
            .await
            .map(|_| ())
    }

    async fn patch_status(
        &self,
        svc: &Service,
        previous: Option<&LoadBalancerStatus>,
        new: &LoadBalancerStatus,
    ) -> Result<(), kube::Error> {
        if load_balancer_status_equal(previous, Some(new)) {
            return Ok(());
        }
        let ingress = match new.ingress.as_ref() {
            Some(list) if !list.is_empty() => serde_json::to_value(list).unwrap_or(Value::Null),
            _ => Value::Null,
        };
        let body = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        patch_service_status(&self.ctx.client, svc, &body)
            .await
            .map(|_| ())
    }

    // ---- node sync --------------------------------------------------------------------------

    /// Upstream `syncNodes`: update the hosts of every cached load-balancer service whose host
    /// set changed, with `--concurrent-service-syncs` parallelism. Returns the keys to retry.
    ///
    /// Beyond upstream: the host set is computed once for the whole sync and shared by every
    /// service ([`node_sync::Round`]); its JSON for full `UpdateLoadBalancer` calls is made once,
    /// on first need, and handed to every call ([`HostList`]); ABI 1.2 plugins get only the
    /// change ([`Self::push_hosts`]).
    pub async fn sync_nodes(&self) -> BTreeSet<String> {
        let started = Instant::now();
        let services: Vec<Arc<Service>> = lock(&self.cache).values().cloned().collect();
        let total = services.len();
        let round = self.new_round();
        let retry = Mutex::new(BTreeSet::new());
        futures::stream::iter(services)
            .for_each_concurrent(self.workers, |svc| {
                let (retry, round) = (&retry, &round);
                async move {
                    if self.node_sync_service(&svc, round).await {
                        lock(retry).insert(service_key(&svc));
                    }
                }
            })
            .await;
        if let Some(Ok(full)) = round.full.into_inner() {
            full.release();
        }
        let retry = retry.into_inner().unwrap_or_else(|p| p.into_inner());
        tracing::debug!(
            controller = NAME,
            "updated {} out of {total} load balancers to the current set of nodes",
            total - retry.len()
        );
        self.ctx
            .metrics
            .service_nodesync_latency
            .observe(started.elapsed().as_secs_f64());
        retry
    }

    /// A node-sync round over the current nodes.
    fn new_round(&self) -> NodeSyncRound {
        NodeSyncRound {
            plan: self.new_listing(),
            full: OnceLock::new(),
        }
    }

    /// List the nodes for a node sync or an EnsureLoadBalancer: numbered in order, and sharing
    /// the latest host set when the hosts are the same.
    fn new_listing(&self) -> node_sync::Round {
        let mut latest = lock(&self.latest_hosts);
        let listing = self.listings.fetch_add(1, Ordering::SeqCst) + 1;
        let round = node_sync::Round::new(self.ctx.nodes.list(), listing, latest.as_ref());
        *latest = Some(round.keys().clone());
        round
    }

    /// Upstream `nodeSyncService`: true when the service must be retried.
    async fn node_sync_service(&self, svc: &Service, round: &NodeSyncRound) -> bool {
        if !self.policy.wants_load_balancer(svc) || !self.responsible(svc) {
            return false;
        }
        let key = service_key(svc);
        // Beyond upstream: a service whose first EnsureLoadBalancer has not succeeded yet (still
        // running, or failing) has no load balancer to update. Upstream calls
        // UpdateLoadBalancer anyway, which real clouds answer with "not found" and an
        // UpdateLoadBalancerFailed event. Here it is handed back to the service queue instead:
        // the worker re-runs EnsureLoadBalancer with the current hosts once the running sync is
        // done.
        if !lock(&self.ensured).contains(&key) {
            tracing::debug!(
                controller = NAME,
                "{key} has no ensured load balancer yet; re-syncing it instead of updating its hosts"
            );
            return true;
        }
        // The shared informer's cache cannot fail to list; the error branch of the plan is kept
        // for parity with upstream's lister.
        let mut plan = node_sync::plan(&mut lock(&self.last_synced), &key, Ok(&round.plan));
        // An EnsureLoadBalancer stored a set listed after this round began: like upstream's
        // per-service listing, compare with the nodes as they are now (rare: a round of its own
        // for this service).
        let fresh;
        let round = if matches!(plan, node_sync::NodeSyncPlan::Stale) {
            fresh = self.new_round();
            plan = node_sync::plan(&mut lock(&self.last_synced), &key, Ok(&fresh.plan));
            &fresh
        } else {
            round
        };
        match plan {
            // Only when an EnsureLoadBalancer listed again meanwhile; the next node sync
            // (queued by the change it saw) settles it.
            node_sync::NodeSyncPlan::Stale => false,
            node_sync::NodeSyncPlan::Skip => false,
            node_sync::NodeSyncPlan::Retry(e) => {
                tracing::error!(controller = NAME, "failed to retrieve node list: {e}");
                self.ctx.metrics.service_nodesync_error_total.inc();
                true
            }
            node_sync::NodeSyncPlan::Update { hosts, delta } => {
                let change = HostsUpdate {
                    key: &key,
                    hosts: &hosts,
                    delta: delta.as_deref(),
                    round,
                };
                self.bump_host_updates(&key);
                let result = self.update_load_balancer_hosts(svc, &change).await;
                self.bump_host_updates(&key);
                match result {
                    Ok(()) => false,
                    // Not a node-sync error: the service queue retries it, and its call waits
                    // for the pause.
                    Err(e) if e.kind() == ErrorKind::THROTTLED => true,
                    Err(e) => {
                        tracing::error!(
                            controller = NAME,
                            "failed to update load balancer hosts for service {key}: {e}"
                        );
                        self.ctx.metrics.service_nodesync_error_total.inc();
                        true
                    }
                }
            }
        }
    }

    /// Whether host updates go through the ABI 1.2 incremental call.
    fn incremental(&self) -> bool {
        self.ctx
            .provider
            .ext_v1_2_capabilities()
            .contains(ExtCapabilitiesV1_2::INCREMENTAL_HOSTS)
            && !self.incremental_off.load(Ordering::Relaxed)
    }

    /// Send `change` to the cloud: the ABI 1.2 incremental call when the provider offers it
    /// (the change against the token the plugin acknowledged, or the whole set when there is no
    /// token or the plugin answers `BASE_MISMATCH`), the full `UpdateLoadBalancer` with the
    /// round's shared host list otherwise (docs/abi-1.2.md).
    async fn push_hosts(
        &self,
        svc: &Service,
        change: &HostsUpdate<'_>,
    ) -> Result<(), ProviderError> {
        let provider = &self.ctx.provider;
        let cluster = self.cluster();
        if self.incremental() {
            // Taken out: an error or a mismatch leaves no token behind.
            let base = lock(&self.host_tokens).remove(change.key);
            let token = self.next_token.fetch_add(1, Ordering::Relaxed);
            let outcome = match (base, change.delta) {
                (Some(base), Some(delta)) => {
                    let (added, removed) = delta.lists()?;
                    provider
                        .update_load_balancer_hosts(cluster, svc, base, token, &added, &removed)
                        .await
                }
                // No token, or no stored set to take a difference from: the whole set.
                _ => Ok(false),
            };
            let applied = match outcome {
                Ok(true) => true,
                Ok(false) => {
                    let full = change.round.full(change.hosts)?;
                    match provider
                        .update_load_balancer_hosts(
                            cluster,
                            svc,
                            NO_BASE,
                            token,
                            &full,
                            &HostList::empty(),
                        )
                        .await
                    {
                        Ok(applied) => applied,
                        Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => false,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => false,
                Err(e) => return Err(e),
            };
            if applied {
                lock(&self.host_tokens).insert(change.key.to_string(), token);
                return Ok(());
            }
            // NOT_IMPLEMENTED, or a whole set refused as a mismatch: this provider instance
            // does not do incremental updates after all.
            tracing::info!(
                controller = NAME,
                "the cloud provider does not apply incremental host updates; sending full host lists"
            );
            self.incremental_off.store(true, Ordering::Relaxed);
        }
        let full = change.round.full(change.hosts)?;
        provider
            .update_load_balancer_shared(cluster, svc, &full)
            .await
    }

    /// Upstream `lockedUpdateLoadBalancerHosts`.
    async fn update_load_balancer_hosts(
        &self,
        svc: &Service,
        change: &HostsUpdate<'_>,
    ) -> Result<(), ProviderError> {
        let started = Instant::now();
        self.ctx.metrics.service_lb_sync_total.inc();
        let result = self.update_load_balancer_hosts_inner(svc, change).await;
        self.ctx
            .metrics
            .service_update_lb_host_latency
            .observe(started.elapsed().as_secs_f64());
        result
    }

    async fn update_load_balancer_hosts_inner(
        &self,
        svc: &Service,
        change: &HostsUpdate<'_>,
    ) -> Result<(), ProviderError> {
        let hosts: &[Arc<CachedNode>] = change.hosts;
        let err = match self.push_hosts(svc, change).await {
            Ok(()) => {
                if hosts.is_empty() {
                    self.event(
                        svc,
                        EventType::Warning,
                        "UnAvailableLoadBalancer",
                        NO_NODES_MESSAGE,
                    );
                } else {
                    self.event(
                        svc,
                        EventType::Normal,
                        "UpdatedLoadBalancer",
                        "Updated load balancer with new hosts",
                    );
                }
                return Ok(());
            }
            Err(e) if e.kind() == ErrorKind::IMPLEMENTED_ELSEWHERE => return Ok(()),
            Err(e) => {
                if let Some(t) = Throttled::of(&e) {
                    // No existence check: it would only wait for the same pause.
                    publish_throttled(&self.recorder, service_ref(svc), &t);
                    return Err(e);
                }
                e
            }
        };
        // It is only an error if the load balancer still exists.
        match self
            .ctx
            .provider
            .get_load_balancer(self.cluster(), svc)
            .await
        {
            Err(ge) => tracing::error!(
                controller = NAME,
                "failed to check if load balancer exists for service {}: {ge}",
                service_key(svc)
            ),
            Ok(None) => return Ok(()),
            Ok(Some(_)) => {}
        }
        self.event(
            svc,
            EventType::Warning,
            "UpdateLoadBalancerFailed",
            update_failed_message(hosts, &err),
        );
        Err(err)
    }
}

/// One node sync's shared state: the plan's host set and deltas, and the host set's JSON for
/// full calls (made once, on first need).
struct NodeSyncRound {
    plan: node_sync::Round,
    full: OnceLock<Result<HostList, ProviderError>>,
}

impl NodeSyncRound {
    /// The round's host set serialised once for every full call of the round.
    fn full(&self, hosts: &[Arc<CachedNode>]) -> Result<HostList, ProviderError> {
        self.full.get_or_init(|| HostList::new(hosts)).clone()
    }
}

/// What one service's host update is about.
struct HostsUpdate<'a> {
    key: &'a str,
    /// The fresh set (the round's).
    hosts: &'a node_sync::HostSet,
    /// The change from the service's stored set (`None`: nothing was stored).
    delta: Option<&'a node_sync::HostDelta>,
    round: &'a NodeSyncRound,
}
