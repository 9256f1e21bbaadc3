//! `ccm-host run`: the cloud-controller-manager daemon.
//!
//! Start-up order as upstream: validate flags (every problem reported, exit 2) → load plugins and
//! build the selected provider on every replica (HasClusterID check) → API client → HTTP
//! endpoints → leader election (kube-lease-manager, Lease `kube-system/cloud-controller-manager`)
//! → on leadership: `Initialize`, shared informers, then each enabled controller. Losing the
//! lease exits with status 1 like upstream; SIGTERM/SIGINT stop the controllers, release the
//! lease and exit 0.

pub(crate) mod cloud_config;
pub(crate) mod delegated_auth;
pub(crate) mod flags;
pub(crate) mod http;
pub(crate) mod lease_health;
pub(crate) mod provider_health;
pub mod provider_set;
pub mod selection;
pub(crate) mod serving;
pub mod upstream_flags;

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::controllers::{self, ControllerContext, Start};
use crate::plugin::PluginRegistry;
use crate::provider::{HostServices, Provider, ProviderOptions};
use crate::runtime::kube_clients::{self, KubeClients};
use crate::runtime::metrics::Metrics;
use crate::runtime::ownership::Ownership;
pub use flags::{RunArgs, RunSettings};
use provider_set::{LbHosts, ProviderSpec};
use selection::ControllerName;

/// Exit code for invalid flags or an unusable provider/plugin (as upstream's flag errors).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the lease is lost or a controller fails to start (as upstream's fatal exits).
pub const EXIT_FATAL: i32 = 1;

/// How long shutdown waits for controllers before releasing the lease anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Run the daemon until SIGTERM/SIGINT; returns the process exit code.
pub async fn run(args: RunArgs, max_log_level: u8) -> i32 {
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    let signals = tokio::spawn(async move {
        wait_for_signal().await;
        on_signal.cancel();
    });
    let code = run_until(args, max_log_level, shutdown).await;
    signals.abort();
    code
}

/// Run the daemon until `shutdown` is cancelled (the graceful path: stop controllers, release
/// the lease, return 0), or until the lease is lost or start-up fails. Embedders such as
/// `ccm-host sandbox` use this to run the real daemon in-process.
pub async fn run_until(args: RunArgs, max_log_level: u8, shutdown: CancellationToken) -> i32 {
    run_embedded(args, max_log_level, shutdown, None).await
}

/// As [`run_until`], with the provider the embedder built (from the same plugin and cloud config,
/// with [`provider_options`]): the embedder and the controllers then share that one instance, so
/// what the embedder asks it (the sandbox's view of the cloud) is what the controllers did.
pub async fn run_until_with(
    args: RunArgs,
    max_log_level: u8,
    shutdown: CancellationToken,
    provider: Provider,
) -> i32 {
    run_embedded(args, max_log_level, shutdown, Some(vec![provider])).await
}

/// As [`run_until_with`] for a run of several providers: `providers` in `--cloud-provider`
/// order, each built from its own cloud config.
pub async fn run_until_with_providers(
    args: RunArgs,
    max_log_level: u8,
    shutdown: CancellationToken,
    providers: Vec<Provider>,
) -> i32 {
    run_embedded(args, max_log_level, shutdown, Some(providers)).await
}

/// One provider of the run.
#[derive(Clone)]
struct Active {
    provider: Provider,
    spec: ProviderSpec,
}

async fn run_embedded(
    args: RunArgs,
    max_log_level: u8,
    shutdown: CancellationToken,
    providers: Option<Vec<Provider>>,
) -> i32 {
    let settings = match args.validate() {
        Ok(s) => s,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return EXIT_USAGE;
        }
    };
    if let Some(w) = settings.selection.warning() {
        tracing::warn!("{w}");
    }

    // Provider factories on every replica, before leader election. Every provider named by
    // --cloud-provider was requested: any that cannot start is fatal.
    let built = match providers {
        Some(given) => adopt_providers(&settings, given),
        None => build_providers(&args, &settings, max_log_level),
    };
    let (active, config_files) = match built {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let several = active.len() > 1;
    for a in &active {
        if a.provider.has_cluster_id() {
            continue;
        }
        if args.allow_untagged_cloud {
            tracing::warn!(provider = a.spec.name, "detected a cluster without a ClusterID; running anyway because --allow-untagged-cloud is set");
        } else {
            let of = if several {
                format!(" (cloud provider {})", a.spec.name)
            } else {
                String::new()
            };
            eprintln!(
                "error: no ClusterID found{of}. A ClusterID is required for the cloud provider to function properly. \
                 This check can be bypassed by setting --allow-untagged-cloud"
            );
            return EXIT_USAGE;
        }
    }
    let ownership = match ownership_of(&active, settings.providers.ownership_enforced) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let clients = match build_clients(&args, &settings).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let identity = identity();
    let stop = CancellationToken::new();
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    for a in &active {
        // Several providers: the same families, told apart by a `provider` label
        // (crate::runtime::metrics::render merges what prometheus-client writes per registration).
        let sub = if several {
            registry.sub_registry_with_label((
                std::borrow::Cow::Borrowed("provider"),
                std::borrow::Cow::Owned(a.spec.name.clone()),
            ))
        } else {
            &mut registry
        };
        a.provider.metrics().register(sub);
        a.provider.reload_metrics().register(sub);
    }
    let registry = Arc::new(registry);
    let health = http::Health::default();
    let check_name = |base: &str, a: &Active| {
        if several {
            format!("{base}-{}", a.spec.name)
        } else {
            base.to_string()
        }
    };
    for a in &active {
        // Beyond upstream: a provider whose calls hang in the plugin (past their deadline, up to
        // the pool's cap) has its calls refused; /healthz says so, so a liveness probe restarts
        // a host that only a restart can free (provider::pool).
        let provider = a.provider.clone();
        let calls: http::Check =
            Arc::new(move || provider.call_health().map_err(|e| e.to_string()));
        health.add_check(&check_name("cloud-provider-calls", a), calls.clone());
        health.add_live_check(&check_name("cloud-provider-calls", a), calls);
        // A method whose calls hang (up to the pool's per-method cap) has its calls refused
        // alone: from then on it has a /readyz check of its own,
        // `cloud-provider-calls-<Method>` (`cloud-provider-calls-<name>-<Method>` with several
        // providers), which passes again once they return.
        let (ready, prefix) = (health.clone(), check_name("cloud-provider-calls", a));
        a.provider.on_method_refused(move |method, check| {
            ready.add_ready_check(
                &format!("{prefix}-{method}"),
                Arc::new(move || check().map_err(|e| e.to_string())),
            );
        });
    }
    if args.secure_port != 0 {
        let serving = serving::start(&args, &settings, health.clone(), registry.clone(), &stop);
        if let Err(e) = serving.await {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    }
    // Beyond upstream, on every replica: each provider's health probe as a check of /readyz
    // (`cloud-provider`, or `cloud-provider-<name>` with several), and --cloud-config hot reload.
    for (a, config_file) in active.iter().zip(config_files) {
        let probe = provider_health::HealthProbe::start(
            &a.provider,
            &check_name(provider_health::CHECK, a),
            settings.provider_health_period,
            &health,
            &stop,
        );
        if let Some(file) = config_file {
            if !settings.cloud_config_reload_period.is_zero() {
                cloud_config::spawn(
                    file,
                    a.provider.clone(),
                    settings.cloud_config_reload_period,
                    probe,
                    stop.clone(),
                );
            }
        }
    }
    health.set_ready();

    let daemon = Daemon {
        args,
        settings,
        active,
        ownership,
        clients,
        identity,
        metrics,
        health,
        stop,
        shutdown,
    };
    daemon.run().await
}

/// The ownership of the nodes among `active` (crate::runtime::ownership): each provider's platforms are
/// its `--cloud-provider-platforms`, else the ones it declares.
fn ownership_of(active: &[Active], enforced: bool) -> anyhow::Result<Ownership> {
    let platforms: Vec<(String, Vec<String>)> = active
        .iter()
        .map(|a| {
            let list = if a.spec.platforms.is_empty() {
                a.provider.platforms().to_vec()
            } else {
                a.spec.platforms.clone()
            };
            (a.spec.name.clone(), list)
        })
        .collect();
    let ownership = Ownership::new(&platforms, enforced).map_err(anyhow::Error::msg)?;
    if enforced {
        for (i, a) in active.iter().enumerate() {
            tracing::info!(
                provider = a.spec.name,
                platforms = ?ownership.platforms(i),
                "the provider owns the nodes of these platforms"
            );
        }
    }
    Ok(ownership)
}

struct Daemon {
    args: RunArgs,
    settings: RunSettings,
    /// The providers, in `--cloud-provider` order.
    active: Vec<Active>,
    ownership: Ownership,
    clients: KubeClients,
    identity: String,
    metrics: Arc<Metrics>,
    health: http::Health,
    stop: CancellationToken,
    /// Cancelled to shut down gracefully (signals, or the embedder).
    shutdown: CancellationToken,
}

impl Daemon {
    async fn run(self) -> i32 {
        if !self.args.leader_elect {
            let handles = match self.start_controllers().await {
                Ok(h) => h,
                Err(code) => return code,
            };
            self.shutdown.cancelled().await;
            tracing::info!("shutting down");
            self.stop_controllers(handles).await;
            return 0;
        }

        // kube-lease-manager renews `grace` seconds before the lease expires. Renew every
        // retry period, as client-go's elector tries to, so that a failed renewal is retried
        // well within the renew deadline (enforced below with `LeaseHealth::lost`).
        let lease_secs = self.settings.lease_duration.as_secs().max(1);
        let grace = lease_secs
            .saturating_sub(self.settings.retry_period.as_secs().max(1))
            .max(1);
        // Leader election has a client of its own (own rate limiter and User-Agent, as
        // upstream), so no backlog of controller requests can delay a renewal.
        let lease_client = match self.clients.client(kube_clients::LEADER_ELECTION) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_USAGE;
            }
        };
        // Building the manager reads (or creates) the Lease. Like upstream's elector, which
        // retries every retry period on any API error before it first leads, a failure here is
        // retried: a 5xx or 429 at start-up must not make the replica exit (found by the soak).
        let manager = loop {
            let built = kube_lease_manager::LeaseManagerBuilder::new(
                lease_client.clone(),
                &self.args.leader_elect_resource_name,
            )
            .with_namespace(&self.args.leader_elect_resource_namespace)
            .with_identity(&self.identity)
            .with_duration(lease_secs)
            .with_grace(grace)
            .build()
            .await;
            match built {
                Ok(m) => break m,
                Err(e) => {
                    tracing::error!(
                        "leader election: cannot get the lease {}/{}: {e}; retrying in {:?}",
                        self.args.leader_elect_resource_namespace,
                        self.args.leader_elect_resource_name,
                        self.settings.retry_period
                    );
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return 0,
                        _ = tokio::time::sleep(self.settings.retry_period) => {}
                    }
                }
            }
        };
        let (mut leader, lease_task) = manager.watch().await;
        let lease_health = lease_health::LeaseHealth::new(
            &self.args.leader_elect_resource_namespace,
            &self.args.leader_elect_resource_name,
            self.settings.lease_duration,
        );
        {
            let lease_health = lease_health.clone();
            self.health
                .add_check("leaderElection", Arc::new(move || lease_health.check()));
        }
        tracing::info!(identity = %self.identity, "waiting for the lease {}/{}", self.args.leader_elect_resource_namespace, self.args.leader_elect_resource_name);

        // Wait to become leader (or for a signal).
        let signal = self.shutdown.clone().cancelled_owned();
        tokio::pin!(signal);
        loop {
            if *leader.borrow_and_update() {
                break;
            }
            tokio::select! {
                _ = &mut signal => {
                    drop(leader);
                    release(lease_task, false).await;
                    return 0;
                }
                changed = leader.changed() => if changed.is_err() {
                    eprintln!("error: leader election stopped unexpectedly");
                    return EXIT_FATAL;
                }
            }
        }
        tracing::info!(identity = %self.identity, "became leader; starting controllers");
        lease_health.became_leader();
        tokio::spawn(lease_health.clone().track(
            kube::Api::namespaced(
                lease_client.clone(),
                &self.args.leader_elect_resource_namespace,
            ),
            self.args.leader_elect_resource_name.clone(),
            self.identity.clone(),
            self.settings.retry_period / 2,
            self.stop.clone(),
        ));
        let handles = match self.start_controllers().await {
            Ok(h) => h,
            Err(code) => {
                drop(leader);
                release(lease_task, true).await;
                return code;
            }
        };
        loop {
            tokio::select! {
                _ = &mut signal => {
                    tracing::info!("shutting down: stopping controllers and releasing the lease");
                    self.stop_controllers(handles).await;
                    drop(leader);
                    release(lease_task, true).await;
                    return 0;
                }
                changed = leader.changed() => {
                    if changed.is_err() || !*leader.borrow_and_update() {
                        lease_health.stopped_leading();
                        tracing::error!("leaderelection lost");
                        self.stop.cancel();
                        return EXIT_FATAL;
                    }
                }
                // Upstream's renew deadline (see `lease_health`): stop before the lease can
                // expire under a replica that still runs controllers.
                reason = lease_health.lost(self.settings.renew_deadline) => {
                    lease_health.stopped_leading();
                    tracing::error!("leaderelection lost: {reason}");
                    self.stop.cancel();
                    return EXIT_FATAL;
                }
            }
        }
    }

    /// Initialize the providers, start the informers and every enabled controller (once per
    /// provider when several run, each over the nodes it owns).
    async fn start_controllers(&self) -> Result<Vec<(ControllerName, JoinHandle<()>)>, i32> {
        let client = |name: &str| {
            self.clients.client(name).map_err(|e| {
                eprintln!("error: {e}");
                self.stop.cancel();
                EXIT_FATAL
            })
        };
        let several = self.active.len() > 1;
        for a in &self.active {
            // The provider's own API access (upstream hands it the client builder) is named
            // after the provider.
            let host = HostServices::new(
                &self.settings.controllers.cluster_name,
                Some(client(&format!("cloud-provider-{}", a.spec.name))?),
                Arc::new(AtomicBool::new(false)),
            );
            if let Err(e) = a.provider.initialize(host).await {
                let of = if several {
                    format!(" {}", a.spec.name)
                } else {
                    String::new()
                };
                eprintln!("error: cloud provider{of} Initialize failed: {e}");
                return Err(EXIT_FATAL);
            }
        }
        let mut config = self.settings.controllers.clone();
        if self.ownership.enforced() {
            config.provider_id_grace_period = Some(self.settings.provider_id_grace_period);
        }
        let base = ControllerContext::new(
            &client(kube_clients::SHARED_INFORMERS)?,
            &self.active[0].provider,
            &self.metrics,
            config,
            &self.identity,
            &self.stop,
        );
        // With ownership enforced, the providers' node views open after the node-ownership
        // controller's first round (controllers::node_ownership::FirstRound); without that
        // controller there is no round to wait for.
        let first_round = controllers::node_ownership::FirstRound::default();
        let claims = self.ownership.enforced()
            && self.settings.selection.is_enabled(controllers::node::NAME);
        if !claims {
            first_round.finish();
        }
        // Each provider's context: its nodes (a view of the shared informer when ownership is
        // enforced), its load-balancer classes, and its name on events, queues and logs.
        let scoped: Vec<(ControllerContext, ControllerContext)> = self
            .active
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let mut config = (*base.config).clone();
                config.load_balancer_classes = a.spec.load_balancer_classes.clone();
                config.ignore_classless_services = !a.spec.classless;
                let nodes = if self.ownership.enforced() {
                    let ownership = self.ownership.clone();
                    base.nodes.view_after(
                        Arc::new(move |n: &crate::runtime::CachedNode| ownership.handles(i, n)),
                        first_round.clone().finished(),
                        self.stop.clone(),
                    )
                } else {
                    base.nodes.clone()
                };
                let label = several.then_some(a.spec.name.as_str());
                let lb_provider = self.ownership.enforced().then_some(a.spec.name.as_str());
                let owned =
                    base.for_provider(&a.provider, nodes, config.clone(), label, lb_provider);
                // Load balancers target the owned nodes unless the provider asked for all.
                let lb = match a.spec.lb_hosts {
                    LbHosts::Owned => owned.clone(),
                    LbHosts::All => base.for_provider(
                        &a.provider,
                        base.nodes.clone(),
                        config,
                        label,
                        lb_provider,
                    ),
                };
                (owned, lb)
            })
            .collect();
        let mut handles = Vec::new();
        for controller in self.settings.selection.enabled() {
            let name = controller.name;
            for (a, (owned, lb)) in self.active.iter().zip(&scoped) {
                let scope = if name.canonical == controllers::service::NAME {
                    lb
                } else {
                    owned
                };
                // Each provider's controllers have API clients of their own (own rate limit, as
                // two CCMs would), named after the provider when several run.
                let client_name = match &scope.provider_label {
                    Some(p) => format!("{}/{p}", name.client),
                    None => name.client.to_string(),
                };
                let ctx = scope
                    .for_controller(name.canonical)
                    .with_client(client(&client_name)?);
                let span = if several {
                    tracing::info_span!("provider", provider = %a.spec.name)
                } else {
                    tracing::Span::none()
                };
                let started = {
                    let _entered = span.enter();
                    (controller.start)(&ctx)
                };
                match started {
                    Start::Started(handle) => {
                        tracing::info!(
                            controller = name.canonical,
                            provider = a.spec.name,
                            "started"
                        );
                        handles.push((name, handle));
                    }
                    Start::Skipped(not_started) => {
                        let _entered = span.enter();
                        tracing::warn!(
                            controller = name.canonical,
                            "not started{}: {not_started}",
                            for_provider(&ctx)
                        );
                    }
                    Start::Fatal(e) => {
                        eprintln!("error: starting {}: {e}", name.canonical);
                        self.stop.cancel();
                        return Err(EXIT_FATAL);
                    }
                }
            }
            // Beyond upstream, with ownership enforced: unclaimed nodes waiting for
            // initialisation are offered to the providers in order (controllers::node_ownership).
            if name.canonical == controllers::node::NAME && self.ownership.enforced() {
                let ctx = base
                    .for_controller(controllers::node_ownership::NAME)
                    .with_client(client(name.client)?);
                let providers = self
                    .active
                    .iter()
                    .map(|a| a.provider.for_caller(controllers::node_ownership::NAME))
                    .collect();
                handles.push((
                    name,
                    tokio::spawn(controllers::node_ownership::run(
                        ctx,
                        self.ownership.clone(),
                        providers,
                        first_round.clone(),
                    )),
                ));
            }
        }
        for (name, _) in &handles {
            self.health.add_check(name.canonical, Arc::new(|| Ok(())));
        }
        Ok(handles)
    }

    async fn stop_controllers(&self, handles: Vec<(ControllerName, JoinHandle<()>)>) {
        self.stop.cancel();
        let all = futures::future::join_all(handles.into_iter().map(|(_, h)| h));
        if tokio::time::timeout(SHUTDOWN_GRACE, all).await.is_err() {
            tracing::warn!("controllers did not stop within {SHUTDOWN_GRACE:?}");
        }
    }
}

/// ` for cloud provider NAME` when several providers run (the log line then names it even
/// where spans are not shown), else nothing.
fn for_provider(ctx: &ControllerContext) -> String {
    ctx.provider_label
        .as_deref()
        .map(|p| format!(" for cloud provider {p}"))
        .unwrap_or_default()
}

/// Stop the lease task; `held`: this replica led, so the lease is released (a standby that
/// never led says so instead: it had nothing to release).
async fn release(
    task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    held: bool,
) {
    match tokio::time::timeout(SHUTDOWN_GRACE, task).await {
        Ok(Ok(Ok(_))) if held => tracing::info!("released the lease"),
        Ok(Ok(Ok(_))) => {
            tracing::info!("stopped while waiting for the lease (never led: nothing to release)")
        }
        Ok(Ok(Err(e))) => tracing::warn!("could not release the lease: {e}"),
        Ok(Err(e)) => tracing::warn!("lease task failed: {e}"),
        Err(_) => tracing::warn!("lease release timed out"),
    }
}

/// The selected provider, and the `--cloud-config` file it was made from (for hot reload).
/// The options of the provider call layer for these settings.
pub fn provider_options(settings: &RunSettings) -> ProviderOptions {
    ProviderOptions {
        call_timeout: settings.provider_call_timeout,
        cloud_api_qps: settings.cloud_api_qps,
        cloud_api_burst: settings.cloud_api_burst,
        instance_batch_window: settings.instance_batch_window,
        instance_batch_size: settings.instance_batch_size,
    }
}

/// A provider's `--cloud-config`, read (for the factory and the reload watch).
fn read_cloud_config(path: Option<&Path>) -> Result<Option<cloud_config::ConfigFile>, String> {
    Ok(match path {
        Some(path) => {
            // The file's identity before its bytes: a change in between is seen at the first
            // look of the reload watch.
            let stamp = cloud_config::Stamp::of(path).ok();
            let bytes = crate::args::read_input_file(path)
                .map_err(|e| format!("cannot read --cloud-config {}: {e}", path.display()))?;
            Some(cloud_config::ConfigFile::new(path, stamp, bytes))
        }
        None => None,
    })
}

type Built = (Vec<Active>, Vec<Option<cloud_config::ConfigFile>>);

/// The providers an embedder built, matched to `--cloud-provider` by name and order.
fn adopt_providers(settings: &RunSettings, given: Vec<Provider>) -> anyhow::Result<Built> {
    let specs = &settings.providers.providers;
    let names: Vec<&str> = given.iter().map(|p| p.registered_name()).collect();
    let wanted: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    if names != wanted {
        anyhow::bail!("the embedder built the providers {names:?} for --cloud-provider {wanted:?}");
    }
    let mut active = Vec::new();
    let mut files = Vec::new();
    for (provider, spec) in given.into_iter().zip(specs) {
        files.push(read_cloud_config(spec.cloud_config.as_deref()).map_err(anyhow::Error::msg)?);
        active.push(Active {
            provider,
            spec: spec.clone(),
        });
    }
    Ok((active, files))
}

fn build_providers(
    args: &RunArgs,
    settings: &RunSettings,
    max_log_level: u8,
) -> anyhow::Result<Built> {
    let registry = PluginRegistry::load_dirs(
        &args.plugins.plugin_dirs,
        &args.plugins.loader_options(max_log_level),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let options = provider_options(settings);
    let mut active = Vec::new();
    let mut files = Vec::new();
    for spec in &settings.providers.providers {
        let config = read_cloud_config(spec.cloud_config.as_deref()).map_err(anyhow::Error::msg)?;
        let provider = registry
            .create(
                &spec.name,
                config.as_ref().map(cloud_config::ConfigFile::bytes),
                &options,
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tracing::info!(
            provider = provider.registered_name(),
            plugin = %provider.plugin_path().display(),
            capabilities = ?provider.capabilities().names(),
            "cloud provider ready"
        );
        files.push(config);
        active.push(Active {
            provider,
            spec: spec.clone(),
        });
    }
    Ok((active, files))
}

/// The daemon's API clients (see [`KubeClients`]): from `--kubeconfig` (else in-cluster, then
/// `~/.kube/config`), `--master` overriding the server, each limited by
/// `--kube-api-qps`/`--kube-api-burst`.
async fn build_clients(args: &RunArgs, settings: &RunSettings) -> anyhow::Result<KubeClients> {
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| anyhow::anyhow!("cannot read --kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow::anyhow!("invalid --kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| anyhow::anyhow!("no Kubernetes API configuration (in-cluster or ~/.kube/config): {e}; pass --kubeconfig"))?,
    };
    if let Some(master) = &args.master {
        config.cluster_url = master
            .parse()
            .map_err(|e| anyhow::anyhow!("invalid --master {master:?}: {e}"))?;
    }
    Ok(KubeClients::new(
        config,
        settings.kube_api_qps,
        settings.kube_api_burst,
    )?)
}

/// `<hostname>_<random>` like upstream's leader-election identity.
fn identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "ccm-host".into());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{host}_{:x}{:x}", nanos, std::process::id())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("received SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("received SIGINT"),
    }
}
