//! The cloud controllers, one module each, and what they share.
//!
//! | module | canonical name | alias |
//! |---|---|---|
//! | `node` | `cloud-node-controller` | `cloud-node` |
//! | `node_lifecycle` | `cloud-node-lifecycle-controller` | `cloud-node-lifecycle` |
//! | `service` | `service-lb-controller` | `service` |
//! | `route` | `node-route-controller` | `route` |
//!
//! Every controller is started with a [`ControllerContext`] and runs until its `stop` token is
//! cancelled. Controllers read Nodes and Services from the shared informers (one watch each,
//! trimmed by [`cache_trim`]), call the provider only through [`crate::provider::Provider`], and write through
//! [`crate::runtime::patches`] and [`crate::runtime::events`].
//!
//! A provider call the cloud throttled ([`crate::provider::throttle`]) is not a failure of the
//! object being synced: each controller retries it after the pause without growing its per-item
//! back-off, and publishes a Warning event ([`publish_throttled`]) on the Node or Service.

pub mod cache_trim;
pub mod node;
pub mod node_addresses;
pub mod node_lifecycle;
pub(crate) mod node_ownership;
pub mod route;
pub mod service;
pub(crate) mod sync_error;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::runtime::watcher;
use kube::Api;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::provider::throttle::THROTTLED_EVENT_REASON;
use crate::provider::{Provider, Throttled};
use crate::runtime::cached_node::CachedNode;
use crate::runtime::events::{EventRecorder, EventType};
use crate::runtime::informer::SharedInformer;
use crate::runtime::metrics::Metrics;

/// Settings of the controllers (the controller flags of `ccm-host run`).
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// `--cluster-name` (default `kubernetes`), passed to every LB and route call.
    pub cluster_name: String,
    /// `--node-monitor-period` (default 5s): lifecycle controller period.
    pub node_monitor_period: Duration,
    /// `--node-status-update-frequency` (default 5m): node address loop period.
    pub node_status_update_frequency: Duration,
    /// `--concurrent-node-syncs`: node initialisation workers (must be > 0).
    pub concurrent_node_syncs: usize,
    /// `--concurrent-node-status-updates` (0 = use `concurrent_node_syncs`).
    pub concurrent_node_status_updates: usize,
    /// `--concurrent-service-syncs`: service workers and node-sync fan-out (must be > 0).
    pub concurrent_service_syncs: usize,
    /// Least time between the starts of two node syncs of the service controller (default 1s;
    /// beyond upstream, `--node-sync-interval`): during mass node changes a load balancer's
    /// hosts are updated at most once per interval.
    pub node_sync_interval: Duration,
    /// `--route-reconciliation-period` (default 10s).
    pub route_reconciliation_period: Duration,
    /// `--configure-cloud-routes` (default true): a start condition of the route controller.
    pub configure_cloud_routes: bool,
    /// `--cluster-cidr`: the pod network the route controller needs (checked when it starts).
    pub cluster_cidr: String,
    /// `--load-balancer-class` (repeatable): classes this host also handles.
    pub load_balancer_classes: Vec<String>,
    /// `--ignore-classless-services`: leave services without a class to another controller.
    pub ignore_classless_services: bool,
    /// `--node-deletion-confirmations`, `--node-deletion-mode` and
    /// `--node-deletion-on-instance-not-found` (default: upstream's behaviour).
    pub node_deletion: node_lifecycle::NodeDeletionPolicy,
    /// With node ownership enforced (hybrid clusters, crate::runtime::ownership): how long after its
    /// creation a node without a providerID is left alone by the lifecycle controller
    /// (`--provider-id-grace-period`). `None`: upstream's behaviour.
    pub provider_id_grace_period: Option<Duration>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            cluster_name: "kubernetes".into(),
            node_monitor_period: Duration::from_secs(5),
            node_status_update_frequency: Duration::from_secs(300),
            // Beyond upstream (1), like the `ccm-host run` default: see BENCHMARKS.md.
            concurrent_node_syncs: 64,
            concurrent_node_status_updates: 0,
            concurrent_service_syncs: 1,
            node_sync_interval: Duration::from_secs(1),
            route_reconciliation_period: Duration::from_secs(10),
            configure_cloud_routes: true,
            cluster_cidr: String::new(),
            load_balancer_classes: Vec::new(),
            ignore_classless_services: false,
            node_deletion: node_lifecycle::NodeDeletionPolicy::default(),
            provider_id_grace_period: None,
        }
    }
}

impl ControllerConfig {
    /// Nodes worked on at once by the periodic per-node loops (the address loop and the
    /// lifecycle checks of NotReady nodes): `concurrent_node_status_updates`, 0 meaning
    /// `concurrent_node_syncs`; at least 1.
    pub fn node_status_workers(&self) -> usize {
        match self.concurrent_node_status_updates {
            0 => self.concurrent_node_syncs,
            n => n,
        }
        .max(1)
    }
}

/// Everything a controller needs. Cheap to clone.
#[derive(Clone)]
pub struct ControllerContext {
    /// API client.
    pub client: kube::Client,
    /// The selected provider.
    pub provider: Provider,
    /// Shared node cache and changes.
    pub nodes: SharedInformer<CachedNode>,
    /// Shared service cache and changes.
    pub services: SharedInformer<Service>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Settings.
    pub config: Arc<ControllerConfig>,
    /// Reported as the events' source host.
    pub host_identity: String,
    /// Cancelled on shutdown or leadership loss.
    pub stop: CancellationToken,
    /// The provider's name when several run (hybrid clusters): it is appended to the event
    /// source component and the work-queue names, so each provider's controllers stay apart.
    pub provider_label: Option<Arc<str>>,
    /// The provider's name when node ownership is enforced (several providers, or
    /// `--cloud-provider-platforms`): the service controller then records it on the Services it
    /// provisions and acts only on its own (`service::ServiceController::responsible`), so
    /// neither another provider in this host nor another host drops its finalizer.
    pub lb_provider: Option<Arc<str>>,
}

impl ControllerContext {
    /// A context over `client` with the shared node and service informers started now (trimmed
    /// by [`cache_trim`]) and stopped by `stop`.
    pub fn new(
        client: &kube::Client,
        provider: &Provider,
        metrics: &Arc<Metrics>,
        config: ControllerConfig,
        host_identity: &str,
        stop: &CancellationToken,
    ) -> Self {
        Self {
            client: client.clone(),
            provider: provider.clone(),
            nodes: SharedInformer::start(
                Api::all(client.clone()),
                watcher::Config::default(),
                cache_trim::node,
                stop.clone(),
            ),
            services: SharedInformer::start(
                Api::all(client.clone()),
                watcher::Config::default(),
                cache_trim::service,
                stop.clone(),
            ),
            metrics: metrics.clone(),
            config: Arc::new(config),
            host_identity: host_identity.into(),
            stop: stop.clone(),
            provider_label: None,
            lb_provider: None,
        }
    }

    /// The same context for another provider of a hybrid cluster: `nodes` are the nodes it
    /// handles (a view of the shared informer), `config` its settings, `label` its name when
    /// several providers run, `lb_provider` its name when ownership is enforced. The services
    /// informer stays shared.
    pub fn for_provider(
        &self,
        provider: &Provider,
        nodes: SharedInformer<CachedNode>,
        config: ControllerConfig,
        label: Option<&str>,
        lb_provider: Option<&str>,
    ) -> Self {
        let mut ctx = self.clone();
        ctx.provider = provider.clone();
        ctx.nodes = nodes;
        ctx.config = Arc::new(config);
        ctx.provider_label = label.map(Arc::from);
        ctx.lb_provider = lb_provider.map(Arc::from);
        ctx
    }

    /// The event source component for `component`: upstream's, or `component/provider` when
    /// several providers run.
    pub fn component(&self, component: &str) -> String {
        match &self.provider_label {
            Some(p) => format!("{component}/{p}"),
            None => component.to_string(),
        }
    }

    /// A work queue's name, told apart per provider like [`Self::component`].
    pub fn queue_name(&self, queue: &str) -> String {
        self.component(queue)
    }

    /// An event recorder for `component`.
    pub fn recorder(&self, component: &str) -> EventRecorder {
        EventRecorder::new(
            self.client.clone(),
            &self.component(component),
            &self.host_identity,
        )
    }

    /// The same context writing through `client` (the daemon gives each controller its own
    /// client, as upstream does: see [`crate::runtime::kube_clients`]). The shared informers keep theirs.
    pub fn with_client(mut self, client: kube::Client) -> Self {
        self.client = client;
        self
    }

    /// The same context for the controller `name`: its provider calls are labelled with the
    /// name in the call metrics and queued under it in the cloud-call budget.
    pub fn for_controller(&self, name: &'static str) -> Self {
        let mut ctx = self.clone();
        ctx.provider = self.provider.for_caller(name);
        ctx
    }
}

/// Why a controller was not started (upstream logs these and skips the controller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotStarted(pub String);

/// The names of one controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerName {
    /// Canonical name (`cloud-node-controller`).
    pub canonical: &'static str,
    /// Alias (`cloud-node`), also the `running_managed_controllers` name.
    pub alias: &'static str,
    /// Upstream's client identity: the User-Agent suffix of the controller's own API client
    /// (both node controllers are `node-controller` upstream).
    pub client: &'static str,
}

/// How starting a controller went, as upstream's controller manager sees it.
#[derive(Debug)]
pub enum Start {
    /// Running until the context's `stop` token is cancelled.
    Started(JoinHandle<()>),
    /// A start condition does not hold: logged, and the manager goes on without it.
    Skipped(NotStarted),
    /// A start error that ends `ccm-host run`.
    Fatal(String),
}

impl Start {
    /// Spawn `run` (in the current tracing span) when `check` passed, else skip.
    fn when<F>(check: Result<(), NotStarted>, run: impl FnOnce() -> F) -> Self
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        match check {
            Ok(()) => Self::Started(tokio::spawn(run().in_current_span())),
            Err(not_started) => Self::Skipped(not_started),
        }
    }
}

/// One controller the host can run: its names and how it starts.
#[derive(Debug)]
pub struct Controller {
    /// Its names (`--controllers`, metrics, health checks, User-Agent).
    pub name: ControllerName,
    /// Check the start conditions and spawn the controller.
    pub start: fn(&ControllerContext) -> Start,
}

/// Every controller the host has, in start order: `--controllers` reads its names from here.
pub static CONTROLLERS: [Controller; 4] = [
    node::CONTROLLER,
    node_lifecycle::CONTROLLER,
    service::CONTROLLER,
    route::CONTROLLER,
];

/// Publish the Warning event of a throttled provider call on `object` (reason
/// `CloudProviderThrottled`, the message names the method and the pause) and log it.
pub(crate) fn publish_throttled(
    recorder: &EventRecorder,
    object: ObjectReference,
    throttled: &Throttled,
) {
    let message = throttled.event_message();
    tracing::info!(
        component = recorder.component(),
        kind = object.kind.as_deref().unwrap_or_default(),
        name = object.name.as_deref().unwrap_or_default(),
        "{message}"
    );
    recorder.publish(object, EventType::Warning, THROTTLED_EVENT_REASON, message);
}

/// [`publish_throttled`] when `e` is a throttled call (true); nothing otherwise (false).
pub(crate) fn publish_if_throttled(
    recorder: &EventRecorder,
    object: ObjectReference,
    e: &ccm_provider_abi::ProviderError,
) -> bool {
    match Throttled::of(e) {
        Some(throttled) => {
            publish_throttled(recorder, object, &throttled);
            true
        }
        None => false,
    }
}

/// Spawn `task` on `tasks` inside the current tracing span: in a hybrid cluster each provider's
/// controllers run in a `provider` span, so their log lines name the provider.
pub(crate) fn spawn_in_span<F>(tasks: &mut tokio::task::JoinSet<F::Output>, task: F)
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    use tracing::Instrument;
    tasks.spawn(task.in_current_span());
}
