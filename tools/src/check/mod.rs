//! `ccm-host check`: the conformance kit for provider authors.
//!
//! Loads a plugin with the real loader, builds the selected provider with the given cloud
//! config, and runs a scripted suite against it: the real controllers (cloud-node,
//! cloud-node-lifecycle, service-lb, node-route) against the in-memory API server, plus direct
//! calls for the contract points the controllers cannot show (idempotency, missing objects,
//! expired deadlines). Prints a pass / fail / skip table with a reason per failed check.
//!
//! Exit codes: 0 every check passed or was skipped; 1 at least one failed; 2 usage error (bad
//! flag, unreadable plugin directory or cloud config, unknown provider, factory error).
//!
//! The check nodes are instances the provider must know: `--node NAME[=PROVIDER_ID]` (default
//! `ccm-check-1..3`). A provider author points the kit at real (test) instances with a test
//! cloud config and `--node` flags; see `docs/writing-a-provider.md`.

mod deadline;
mod hang;
mod lb;
mod nodes;
pub mod report;
mod routes;
pub mod scene;
pub mod validate;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Display;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_abi::{ErrorKind, ProviderError};
use clap::Args;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use kube_apiserver_inmem::ApiServer;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use ccm_host::args::{OutputFormat, PluginDirArgs};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::plugin::PluginRegistry;
use ccm_host::provider::{Capabilities, Provider, ProviderOptions};
use ccm_host::runtime::metrics::Metrics;
use report::{Outcome, Report, Status, Subject, CHECKS, DEPENDS};
use scene::NodeSpec;

/// Exit code: every check passed or was skipped.
pub const EXIT_PASS: i32 = 0;
/// Exit code: at least one check failed.
pub const EXIT_FAIL: i32 = 1;
/// Exit code: usage error (flags, plugin, provider, cloud config).
pub const EXIT_USAGE: i32 = 2;

/// `ccm-host check` arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Where the plugins come from.
    #[command(flatten)]
    pub plugins: PluginDirArgs,
    /// The provider to check: a name registered by a plugin in --plugin-dir.
    #[arg(long, value_name = "NAME")]
    pub cloud_provider: String,
    /// Cloud config file handed to the provider's factory (as `ccm-host run --cloud-config`).
    #[arg(long, value_name = "FILE")]
    pub cloud_config: Option<PathBuf>,
    /// A check node whose instance the provider knows and that is running: NAME, or
    /// NAME=PROVIDER_ID when kubelet sets the provider ID (repeatable; default ccm-check-1,
    /// ccm-check-2, ccm-check-3).
    #[arg(long = "node", value_name = "NAME[=PROVIDER_ID]")]
    pub nodes: Vec<String>,
    /// A node whose instance exists but is stopped: checks InstanceShutdown and the
    /// lifecycle controller's shutdown taint.
    #[arg(long, value_name = "NAME[=PROVIDER_ID]")]
    pub shutdown_node: Option<String>,
    /// A provider ID no instance has [default: <ProviderName>://ccm-check-absent-<random>].
    #[arg(long, value_name = "ID")]
    pub absent_provider_id: Option<String>,
    /// Cluster name passed to load-balancer and route calls (use a dedicated one on a real cloud).
    #[arg(long, default_value = "kubernetes")]
    pub cluster_name: String,
    /// Pod network range: the nodes' pod CIDRs and the route checks' CIDRs are carved from it.
    /// The route controller deletes other routes inside it: use a range nothing else uses.
    #[arg(long, default_value = "10.244.0.0/16")]
    pub cluster_cidr: String,
    /// Deadline of every provider call.
    #[arg(long, visible_alias = "call-timeout", default_value = "30s")]
    pub provider_call_timeout: String,
    /// How long to wait for a controller to converge before the check fails.
    #[arg(long, default_value = "60s")]
    pub sync_timeout: String,
    /// An annotation on every Service the load-balancer checks use, KEY=VALUE (repeatable), e.g.
    /// `service.beta.kubernetes.io/aws-load-balancer-type=nlb` to check a provider's other kind
    /// of load balancer.
    #[arg(long = "service-annotation", value_name = "KEY=VALUE")]
    pub service_annotations: Vec<String>,
    /// Skip a check by id (repeatable; ids as in the result table).
    #[arg(long = "skip", value_name = "CHECK")]
    pub skip: Vec<String>,
    /// Fail a check that is skipped although the provider has what it covers, because the
    /// provider offers no way to observe it (lb-hosts with load balancers but no host
    /// read-back). Skips for a capability the provider lacks, or --skip, stay skips.
    #[arg(long)]
    pub strict: bool,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// The validated arguments.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The check nodes, with their pod CIDRs.
    pub nodes: Vec<NodeSpec>,
    /// The stopped instance, if given.
    pub shutdown_node: Option<NodeSpec>,
    /// `--absent-provider-id`.
    pub absent_provider_id: Option<String>,
    /// `--cluster-name`.
    pub cluster_name: String,
    /// `--cluster-cidr`.
    pub cluster_cidr: IpNet,
    /// The CIDR of the route round trip (not given to any node).
    pub spare_cidr: String,
    /// `--provider-call-timeout`.
    pub call_timeout: Duration,
    /// `--sync-timeout`.
    pub sync_timeout: Duration,
    /// `--skip`.
    pub skip: BTreeSet<String>,
    /// `--strict`.
    pub strict: bool,
    /// Unique to this run (UIDs of the Services handed to the provider directly).
    pub nonce: String,
    /// `--service-annotation`.
    pub service_annotations: BTreeMap<String, String>,
}

impl Plan {
    /// Validate the arguments; every error names the flag.
    pub fn new(args: &CheckArgs) -> Result<Self, String> {
        let mut nodes = if args.nodes.is_empty() {
            scene::DEFAULT_NODES
                .iter()
                .map(|n| NodeSpec::parse("--node", n))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            args.nodes
                .iter()
                .map(|n| NodeSpec::parse("--node", n))
                .collect::<Result<Vec<_>, _>>()?
        };
        let shutdown_node = args
            .shutdown_node
            .as_deref()
            .map(|n| NodeSpec::parse("--shutdown-node", n))
            .transpose()?;
        let mut seen = BTreeSet::new();
        for name in nodes
            .iter()
            .chain(shutdown_node.iter())
            .map(|n| n.name.as_str())
        {
            if !seen.insert(name) {
                return Err(format!(
                    "node {name:?} is given twice (--node / --shutdown-node)"
                ));
            }
        }
        if args.cluster_name.trim().is_empty() {
            return Err("--cluster-name is empty".into());
        }
        if args
            .absent_provider_id
            .as_deref()
            .is_some_and(|id| id.trim().is_empty())
        {
            return Err("--absent-provider-id is empty".into());
        }
        let cluster_cidr: IpNet = args.cluster_cidr.trim().parse().map_err(|e| {
            format!(
                "--cluster-cidr {:?}: {e} (one CIDR, e.g. 10.244.0.0/16)",
                args.cluster_cidr
            )
        })?;
        let (cidrs, spare_cidr) = scene::pod_cidrs(&cluster_cidr, nodes.len())?;
        for (node, cidr) in nodes.iter_mut().zip(cidrs) {
            node.pod_cidr = Some(cidr);
        }
        let duration = |flag: &str, value: &str| {
            ccm_host::runtime::duration::parse(value)
                .map_err(|e| format!("--{flag}: {e}"))
                .and_then(|d| {
                    if d.is_zero() {
                        Err(format!("--{flag} must be more than 0"))
                    } else {
                        Ok(d)
                    }
                })
        };
        let call_timeout = duration("provider-call-timeout", &args.provider_call_timeout)?;
        let sync_timeout = duration("sync-timeout", &args.sync_timeout)?;
        let mut skip = BTreeSet::new();
        for id in &args.skip {
            if !CHECKS.iter().any(|(c, _)| c == id) {
                return Err(format!(
                    "--skip {id:?}: no such check; the checks are: {}",
                    CHECKS
                        .iter()
                        .map(|(c, _)| *c)
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            skip.insert(id.clone());
        }
        let mut service_annotations = BTreeMap::new();
        for a in &args.service_annotations {
            let Some((k, v)) = a.split_once('=').filter(|(k, _)| !k.trim().is_empty()) else {
                return Err(format!(
                    "--service-annotation {a:?}: not KEY=VALUE (e.g. service.beta.kubernetes.io/aws-load-balancer-type=nlb)"
                ));
            };
            service_annotations.insert(k.trim().to_string(), v.to_string());
        }
        Ok(Self {
            nodes,
            shutdown_node,
            absent_provider_id: args.absent_provider_id.clone(),
            cluster_name: args.cluster_name.clone(),
            cluster_cidr,
            spare_cidr,
            call_timeout,
            sync_timeout,
            skip,
            strict: args.strict,
            nonce: scene::nonce(),
            service_annotations,
        })
    }

    /// The scene's Service `name` (see [`scene::service`]) with the `--service-annotation`s.
    pub fn service(&self, name: &str, uid: Option<&str>) -> Service {
        let mut svc = scene::service(name, uid);
        if !self.service_annotations.is_empty() {
            svc.metadata
                .annotations
                .get_or_insert_default()
                .extend(self.service_annotations.clone());
        }
        svc
    }
}

fn usage(e: impl Display) -> i32 {
    eprintln!("error: {e}");
    EXIT_USAGE
}

/// Entry point of `ccm-host check`: returns the process exit code.
pub async fn main(args: CheckArgs, max_log_level: u8) -> anyhow::Result<i32> {
    let plan = match Plan::new(&args) {
        Ok(p) => p,
        Err(e) => return Ok(usage(e)),
    };
    // Quietly: a directory cargo builds into holds test fixtures too. One line says files
    // were skipped; an unknown provider's error lists every refused file.
    let registry = match PluginRegistry::load_dirs_quietly(
        &args.plugins.plugin_dirs,
        &args.plugins.loader_options(max_log_level),
    ) {
        Ok(r) => r,
        Err(e) => return Ok(usage(e)),
    };
    let config = match &args.cloud_config {
        None => None,
        Some(path) => match ccm_host::args::read_input_file(path) {
            Ok(bytes) => Some(bytes),
            Err(e) => return Ok(usage(format!("--cloud-config {}: {e}", path.display()))),
        },
    };
    let options = ProviderOptions {
        call_timeout: plan.call_timeout,
        ..ProviderOptions::default()
    };
    let provider = match registry.create(&args.cloud_provider, config.as_deref(), &options) {
        Ok(p) => p,
        Err(e) => return Ok(usage(e)),
    };
    if let Some(note) = registry.skipped_note(&args.plugins.plugin_dirs) {
        eprintln!("check: {note}");
    }
    let plugin = registry
        .plugins()
        .iter()
        .find(|p| p.path == provider.plugin_path());
    // HasClusterID is a plugin call without an error channel: asked on a thread of its own
    // under the call deadline, so a plugin that hangs there cannot hang the kit.
    let has_cluster_id = {
        let p = provider.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("ccm-check-has-cluster-id".into())
            .spawn(move || {
                let _ = tx.send(p.has_cluster_id());
            })?;
        match tokio::time::timeout(plan.call_timeout, rx).await {
            Ok(Ok(v)) => v,
            _ => {
                return Ok(usage(format!(
                    "HasClusterID of provider {:?} did not return within {}",
                    args.cloud_provider,
                    ccm_host::runtime::duration::format(plan.call_timeout)
                )))
            }
        }
    };
    let subject = Subject {
        provider: provider.registered_name().to_string(),
        provider_name: provider.provider_name().to_string(),
        has_cluster_id,
        plugin_path: provider.plugin_path().display().to_string(),
        plugin: plugin.map_or_else(String::new, |p| {
            format!("{} {}", p.plugin_name, p.plugin_version)
        }),
        abi_version: plugin.map_or_else(String::new, |p| p.abi_version.clone()),
        capabilities: provider.capabilities(),
        nodes: plan
            .nodes
            .iter()
            .chain(plan.shutdown_node.iter())
            .map(|n| n.name.clone())
            .collect(),
        cluster_name: plan.cluster_name.clone(),
    };
    let report = Suite::run(plan, provider, subject).await?;
    let mut out = std::io::stdout().lock();
    match args.output {
        OutputFormat::Text => report.write_text(&mut out)?,
        OutputFormat::Json => report.write_json(&mut out)?,
    }
    Ok(if report.failed > 0 {
        EXIT_FAIL
    } else {
        EXIT_PASS
    })
}

/// Run one check: skipped when `--skip` names it, when the provider lacks what it exercises
/// (`$gate` gives the reason) or when a check it depends on failed; otherwise its outcome, made
/// a failure by a call that hung during it (see [`hang`]).
macro_rules! step {
    ($suite:expr, $id:literal, $gate:expr, $body:expr) => {{
        let outcome = match $suite.gate($id, $gate) {
            Some(skip) => skip,
            None => {
                $suite.begin_check($id);
                let outcome = $body;
                let outcome = $suite.end_check($id, outcome);
                if let Some(root) = $suite.needed_hang_check() {
                    if outcome.status == $crate::check::report::Status::Skip {
                        $suite.blocked.insert($id, root);
                    }
                }
                outcome
            }
        };
        $suite.report.add($id, outcome);
    }};
}
pub(crate) use step;

/// The running suite: the in-memory API server, the provider, the controller context.
pub(crate) struct Suite {
    plan: Plan,
    provider: Provider,
    caps: Capabilities,
    server: ApiServer,
    client: kube::Client,
    ctx: ControllerContext,
    stop: CancellationToken,
    registry: Registry,
    report: Report,
    /// Panic messages seen in direct calls.
    panics: Mutex<Vec<String>>,
    /// Running controllers: stop token and task.
    controllers: Vec<(CancellationToken, JoinHandle<()>)>,
    /// The scene's nodes as the API server holds them after initialisation, by name.
    initialised: BTreeMap<String, Node>,
    /// The node whose instance does not exist.
    absent: NodeSpec,
    /// The Service handed to the provider directly.
    direct_service: Service,
    /// The status the first EnsureLoadBalancer returned.
    lb_status: Option<k8s_openapi::api::core::v1::LoadBalancerStatus>,
    /// The Service the service controller provisions, as created (with its UID).
    controller_service: Option<Service>,
    /// The second Service handed to the provider directly (lb-distinct), once used.
    second_service: Option<Service>,
    /// Checks skipped because a check they depend on failed: id -> the failed check.
    blocked: BTreeMap<&'static str, &'static str>,
    /// Methods that ran into the call deadline ([`hang`]).
    hangs: hang::Hangs,
}

impl Suite {
    async fn run(plan: Plan, provider: Provider, subject: Subject) -> anyhow::Result<Report> {
        let strict = plan.strict;
        let server = ApiServer::start().await?;
        let client = server.client();
        let stop = CancellationToken::new();
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        provider.metrics().register(&mut registry);
        let config = ControllerConfig {
            cluster_name: plan.cluster_name.clone(),
            node_monitor_period: Duration::from_secs(1),
            route_reconciliation_period: Duration::from_millis(500),
            concurrent_node_syncs: 2,
            concurrent_service_syncs: 2,
            ..ControllerConfig::default()
        };
        let ctx = ControllerContext::new(
            &client,
            &provider,
            &metrics,
            config,
            "ccm-host-check",
            &stop,
        );
        let absent_id = plan.absent_provider_id.clone().unwrap_or_else(|| {
            format!(
                "{}://ccm-check-absent-{}",
                provider.provider_name(),
                plan.nonce
            )
        });
        let absent = NodeSpec {
            name: format!("ccm-check-absent-{}", plan.nonce),
            provider_id: Some(absent_id),
            pod_cidr: None,
        };
        let direct_service =
            plan.service("ccm-check-direct", Some(&scene::uid(&plan.nonce, "direct")));
        let mut suite = Suite {
            caps: provider.capabilities(),
            plan,
            provider,
            server,
            client,
            ctx,
            stop,
            registry,
            report: Report::new(subject).strict(strict),
            panics: Mutex::new(Vec::new()),
            controllers: Vec::new(),
            initialised: BTreeMap::new(),
            absent,
            direct_service,
            lb_status: None,
            controller_service: None,
            second_service: None,
            blocked: BTreeMap::new(),
            hangs: hang::Hangs::default(),
        };
        let result = suite.run_all().await;
        suite.begin_check("cleanup");
        suite.cleanup().await;
        suite.stop_controllers().await;
        suite.stop.cancel();
        let Suite { server, report, .. } = suite;
        if tokio::time::timeout(STOP_LIMIT, server.shutdown())
            .await
            .is_err()
        {
            tracing::debug!("the in-memory API server did not stop within {STOP_LIMIT:?}");
        }
        result.map(|()| report)
    }

    async fn run_all(&mut self) -> anyhow::Result<()> {
        step!(self, "provider-name", None, self.provider_name_check());
        step!(self, "initialize", None, self.initialize().await);
        if !self.ctx.nodes.wait_synced().await || !self.ctx.services.wait_synced().await {
            anyhow::bail!("the in-memory API server's watches did not start");
        }
        self.seed_nodes()?;
        self.node_checks().await;
        self.lb_checks().await;
        self.route_checks().await;
        step!(self, "deadline", None, self.deadline().await);
        step!(self, "no-panics", None, self.no_panics());
        Ok(())
    }

    /// `Some(skip outcome)` when the check is not to run: `--skip`, a check it depends on
    /// failed (directly or through another skipped one: the reason names that check, where the
    /// cause was reported), or `gate` gives a reason (a capability the provider lacks).
    fn gate(&mut self, id: &'static str, gate: Option<String>) -> Option<Outcome> {
        if self.plan.skip.contains(id) {
            return Some(Outcome::skip("skipped (--skip)"));
        }
        let deps = DEPENDS
            .iter()
            .find(|(c, _)| *c == id)
            .map_or(&[][..], |(_, d)| *d);
        let root = deps.iter().find_map(|dep| {
            if self.report.status(dep) == Some(Status::Fail) {
                CHECKS.iter().find(|(c, _)| c == dep).map(|(c, _)| *c)
            } else {
                self.blocked.get(dep).copied()
            }
        });
        match root {
            Some(root) => {
                self.blocked.insert(id, root);
                Some(Outcome::skip(format!("skipped: depends on {root}")))
            }
            None => gate.map(Outcome::skip),
        }
    }

    fn provider_name_check(&self) -> Outcome {
        let name = self.provider.provider_name();
        match validate::provider_name(name) {
            Ok(()) => Outcome::pass(format!("provider IDs look like {name}://<id>")),
            Err(e) => Outcome::fail(e),
        }
    }

    async fn initialize(&self) -> Outcome {
        let host = ccm_host::provider::HostServices::new(
            &self.plan.cluster_name,
            Some(self.client.clone()),
            Arc::new(std::sync::atomic::AtomicBool::new(false)),
        );
        match self
            .direct("Initialize", "", self.provider.initialize(host))
            .await
        {
            Ok(()) => Outcome::pass("Initialize returned Ok"),
            Err(e) => Outcome::fail(format!(
                "Initialize failed ({}): {e}; ccm-host run would exit",
                e.kind().name()
            )),
        }
    }

    /// Record the panic message of a direct call's result, and hand the result back.
    fn seen<T>(&self, result: Result<T, ProviderError>) -> Result<T, ProviderError> {
        if let Err(e) = &result {
            if e.kind() == ErrorKind::PANICKED {
                let mut panics = self.panics.lock().unwrap_or_else(|p| p.into_inner());
                if !panics.iter().any(|m| m == e.message()) {
                    panics.push(e.message().to_string());
                }
            }
        }
        result
    }

    /// Start a controller with its own stop token (a child of the suite's).
    fn start_controller<F, Fut>(&mut self, name: &'static str, run: F)
    where
        F: FnOnce(ControllerContext) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let mut ctx = self.ctx.for_controller(name);
        let token = self.stop.child_token();
        ctx.stop = token.clone();
        self.controllers.push((token, tokio::spawn(run(ctx))));
    }

    /// Stop every running controller: each gets [`STOP_LIMIT`] to end after its stop token is
    /// cancelled, then its task is dropped (which cancels a provider call it is waiting for).
    async fn stop_controllers(&mut self) {
        for (token, mut task) in self.controllers.drain(..) {
            token.cancel();
            if tokio::time::timeout(STOP_LIMIT, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
            }
        }
    }

    /// Poll `probe` every 50 ms until it returns `Some`, at most `--sync-timeout`; `None` at
    /// once when a provider call of a method not known to hang runs into the deadline (the
    /// running check then fails with that call, see [`hang`]).
    async fn wait_for<T, Fut>(&self, mut probe: impl FnMut() -> Fut) -> Option<T>
    where
        Fut: std::future::Future<Output = Option<T>>,
    {
        let started = Instant::now();
        loop {
            if let Some(v) = probe().await {
                return Some(v);
            }
            if self.controller_call_hung()
                || self.stalled()
                || started.elapsed() > self.plan.sync_timeout
            {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// An object as the API server holds it now (`""` namespace for nodes).
    fn stored(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.server.controls().get(resource, namespace, name)
    }

    fn stored_node(&self, name: &str) -> Option<Node> {
        self.stored("nodes", "", name)
            .and_then(|v| serde_json::from_value(v).ok())
    }

    /// The scene's check nodes as stored now (the ones that still exist).
    fn current_nodes(&self) -> Vec<Node> {
        self.plan
            .nodes
            .iter()
            .filter_map(|n| self.stored_node(&n.name))
            .collect()
    }

    /// Warning events about an object: `reason: message`, most recent last.
    fn warnings_about(&self, name: &str) -> Vec<String> {
        let mut events: Vec<(String, String)> = self
            .server
            .controls()
            .list("events")
            .into_iter()
            .filter(|e| e["involvedObject"]["name"] == name && e["type"] == "Warning")
            .map(|e| {
                let time = e["lastTimestamp"].as_str().unwrap_or_default().to_string();
                let text = format!(
                    "{}: {}",
                    e["reason"].as_str().unwrap_or_default(),
                    e["message"].as_str().unwrap_or_default()
                );
                (time, text)
            })
            .collect();
        events.sort();
        let mut texts: Vec<String> = events.into_iter().map(|(_, t)| t).collect();
        texts.dedup();
        texts
    }

    /// Remove what the suite created in the cloud, whatever happened (best effort; failures
    /// are printed, they do not change the result).
    async fn cleanup(&mut self) {
        let cluster = self.plan.cluster_name.clone();
        if self.caps.load_balancer {
            let services = [
                Some(self.direct_service.clone()),
                Some(deadline::probe_service(&self.plan)),
                self.controller_service.clone(),
                self.second_service.clone(),
            ];
            for svc in services.into_iter().flatten() {
                let name = lb::service_name(&svc);
                if let Err(e) = self
                    .direct(
                        "EnsureLoadBalancerDeleted",
                        &name,
                        self.provider.ensure_load_balancer_deleted(&cluster, &svc),
                    )
                    .await
                {
                    eprintln!(
                        "warning: cleanup: EnsureLoadBalancerDeleted({name}): {e}; delete its load balancer by hand"
                    );
                }
            }
        }
        if self.caps.routes {
            let ours: BTreeSet<&str> = self
                .plan
                .nodes
                .iter()
                .chain(self.plan.shutdown_node.iter())
                .map(|n| n.name.as_str())
                .collect();
            match self
                .direct("ListRoutes", &cluster, self.provider.list_routes(&cluster))
                .await
            {
                Ok(routes) => {
                    for r in routes.iter().filter(|r| {
                        ours.contains(r.target_node.as_str())
                            || r.destination_cidr == self.plan.spare_cidr
                    }) {
                        if let Err(e) = self
                            .direct(
                                "DeleteRoute",
                                &r.destination_cidr,
                                self.provider.delete_route(&cluster, r),
                            )
                            .await
                        {
                            eprintln!(
                                "warning: cleanup: DeleteRoute({} {}): {e}",
                                r.target_node, r.destination_cidr
                            );
                        }
                    }
                }
                Err(e) => eprintln!("warning: cleanup: ListRoutes: {e}"),
            }
        }
    }

    fn metrics_text(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }

    /// Sum of a provider-call counter per method, from the metrics registry.
    fn counter_by_method(&self, metric: &str) -> BTreeMap<String, u64> {
        parse_counter(&self.metrics_text(), metric)
    }

    /// The value of an unlabelled series (0 when absent).
    fn metric_value(&self, series: &str) -> u64 {
        parse_value(&self.metrics_text(), series)
    }
}

/// How long the suite waits for a controller task or the in-memory API server to stop before
/// it drops them: the kit's own waits are bounded, whatever a plugin does.
const STOP_LIMIT: Duration = Duration::from_secs(2);

/// `metric{...method="M"...} value` lines of a text exposition, summed per method.
fn parse_counter(text: &str, metric: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let prefix = format!("{metric}{{");
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((labels, value)) = line[prefix.len()..].split_once("} ") else {
            continue;
        };
        let Some(method) = labels
            .split(',')
            .find_map(|kv| kv.strip_prefix("method=\""))
            .map(|m| m.trim_end_matches('"'))
        else {
            continue;
        };
        let value = value.trim().parse::<f64>().unwrap_or(0.0);
        if value > 0.0 {
            *out.entry(method.to_string()).or_insert(0) += value as u64;
        }
    }
    out
}

/// The value of the unlabelled series `series` in a text exposition (0 when absent).
fn parse_value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// `"A×2, B×1"`.
fn per_method(counts: &BTreeMap<String, u64>) -> String {
    counts
        .iter()
        .map(|(m, n)| format!("{m}×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Problems per node, grouped by text: `node a: text`, `nodes a, b: text`.
fn per_node(problems: Vec<(String, String)>) -> Vec<String> {
    let mut grouped: Vec<(String, Vec<String>)> = Vec::new();
    for (node, text) in problems {
        match grouped.iter_mut().find(|(t, _)| *t == text) {
            Some((_, nodes)) => nodes.push(node),
            None => grouped.push((text, vec![node])),
        }
    }
    grouped
        .into_iter()
        .map(|(text, nodes)| match nodes.as_slice() {
            [one] => format!("node {one}: {text}"),
            many => format!("nodes {}: {text}", many.join(", ")),
        })
        .collect()
}

/// `kind: message` of a provider error, for reasons.
fn err_text(e: &ProviderError) -> String {
    format!("{} error: {e}", e.kind().name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CheckArgs,
    }

    fn plan(extra: &[&str]) -> Result<Plan, String> {
        let mut argv = vec![
            "check",
            "--plugin-dir",
            "/nonexistent",
            "--cloud-provider",
            "fake",
        ];
        argv.extend_from_slice(extra);
        Plan::new(&Cli::try_parse_from(argv).expect("flags parse").args)
    }

    #[test]
    fn defaults() {
        let p = plan(&[]).unwrap();
        let names: Vec<_> = p.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, scene::DEFAULT_NODES);
        assert_eq!(p.nodes[2].pod_cidr.as_deref(), Some("10.244.2.0/24"));
        assert_eq!(p.spare_cidr, "10.244.3.0/24");
        assert_eq!(p.call_timeout, Duration::from_secs(30));
        assert_eq!(p.cluster_name, "kubernetes");
        assert!(p.skip.is_empty());
    }

    #[test]
    fn every_bad_flag_is_named() {
        let err = |extra: &[&str]| plan(extra).unwrap_err();
        assert!(err(&["--node", "a", "--node", "a"]).contains("given twice"));
        assert!(err(&["--node", "a", "--shutdown-node", "a"]).contains("given twice"));
        assert!(err(&["--node", "Bad_Name"]).contains("--node"));
        assert!(err(&["--cluster-cidr", "10.0.0.0/40"]).contains("--cluster-cidr"));
        assert!(err(&["--cluster-cidr", "10.0.0.0/24"]).contains("too small"));
        assert!(err(&["--sync-timeout", "soon"]).contains("--sync-timeout"));
        assert!(err(&["--call-timeout", "0"]).contains("more than 0"));
        assert!(err(&["--skip", "lb-everything"]).contains("no such check"));
        assert!(err(&["--absent-provider-id", " "]).contains("--absent-provider-id"));
        assert!(err(&["--service-annotation", "nlb"]).contains("--service-annotation \"nlb\""));
        assert!(err(&["--service-annotation", "=nlb"]).contains("not KEY=VALUE"));
        let p = plan(&["--skip", "deadline", "--node", "x=p://1"]).unwrap();
        assert!(p.skip.contains("deadline"));
        assert_eq!(p.nodes[0].provider_id.as_deref(), Some("p://1"));
        assert!(p.service("s", None).metadata.annotations.is_none());
        let p = plan(&[
            "--service-annotation",
            "a/type=nlb",
            "--service-annotation",
            "b=",
        ])
        .unwrap();
        let a = p.service("s", None).metadata.annotations.unwrap();
        assert_eq!((a["a/type"].as_str(), a["b"].as_str()), ("nlb", ""));
    }

    #[test]
    fn counters_are_summed_per_method() {
        let text = "# HELP x\n\
            ccm_provider_call_panics_total{method=\"InstanceShutdown\"} 2\n\
            ccm_provider_call_panics_total{method=\"ListRoutes\"} 0\n\
            ccm_provider_calls_total{method=\"InstanceShutdown\",caller=\"host\"} 3\n\
            ccm_provider_calls_total{method=\"InstanceShutdown\",caller=\"route\"} 4\n";
        let panics = parse_counter(text, "ccm_provider_call_panics_total");
        assert_eq!(per_method(&panics), "InstanceShutdown×2");
        let calls = parse_counter(text, "ccm_provider_calls_total");
        assert_eq!(calls["InstanceShutdown"], 7);
        let histogram = "x_sum 1.5\nx_count 3\nx_bucket{le=\"1.0\"} 2\n";
        assert_eq!(parse_value(histogram, "x_count"), 3);
        assert_eq!(parse_value(histogram, "y_count"), 0);
    }

    #[test]
    fn node_problems_are_grouped() {
        let p = per_node(vec![
            ("a".into(), "boom".into()),
            ("b".into(), "other".into()),
            ("c".into(), "boom".into()),
        ]);
        assert_eq!(p, ["nodes a, c: boom", "node b: other"]);
    }
}
