//! `ccm-host sandbox`: the real controllers against the in-memory API server and a provider
//! plugin (by default the fake provider with a built-in demo cloud): no cluster needed.
//!
//! 1. Load the plugins, select the provider, build the scene (generated, or `--scenario FILE`)
//!    and the cloud config (for the fake without `--cloud-config`: the demo cloud).
//! 2. Start [`kube_apiserver_inmem::ApiServer`], write a kubeconfig (also to `--kubeconfig-out`),
//!    seed namespaces, kubelet-style nodes (with their Leases) and LoadBalancer services
//!    (validated by the API server with a dry run first, so a bad scenario changes nothing).
//! 3. Run the real daemon in-process ([`crate::daemon::run_until`], leader election on) with
//!    flags built from ours plus any `ccm-host run` flags given after `--`.
//! 4. Show progress until the scene converges or `--timeout` passes (stderr is teed meanwhile,
//!    [`capture`], so the controllers' error lines can say why they stopped), let the events
//!    settle, print the summary (the cluster's and the cloud's view; why not, first, when it did
//!    not converge), keep serving for `--duration`, stop everything and say what is left of the
//!    kubeconfig the hints named.
//!
//! Exit codes: 0 converged, 1 not converged (or the controllers stopped), 2 bad input,
//! 130 interrupted before the scene converged.

pub mod capture;
pub mod observe;
pub mod report;
pub mod scene;

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Service};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use kube_apiserver_inmem::{ApiServer, ApiServerOptions};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::controllers::service::predicates::ClassPolicy;
use crate::daemon::{RunArgs, RunSettings};
use crate::plugin::{LoaderOptions, PluginRegistry};
use crate::provider::{Provider, ProviderOptions};
use observe::{Expectations, Observation, Progress};
use report::{CloudSource, ProviderInfo, ReportInput};
use scene::{Scenario, Scene, SceneCloudConfig};

/// Exit code for bad input (flags, scenario, provider).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when the scene did not converge or the controllers stopped.
pub const EXIT_NOT_CONVERGED: i32 = 1;
/// Exit code when interrupted (SIGINT/SIGTERM) before the scene converged.
pub const EXIT_INTERRUPTED: i32 = 130;

/// The system-wide plugin directory, used by default when it exists.
pub const SYSTEM_PLUGIN_DIR: &str = "/usr/lib/ccm-host/plugins";

/// The bearer token the sandbox's API server accepts for the secure port (`-- --secure-port N`):
/// user `sandbox-viewer`, allowed to get every path.
pub const SANDBOX_TOKEN: &str = "ccm-sandbox-token";

/// Flags of `ccm-host run` the sandbox sets itself; they cannot be given after `--`.
const OWNED_RUN_FLAGS: [(&str, &str); 7] = [
    ("--plugin-dir", "use `ccm-host sandbox --plugin-dir DIR` (before --)"),
    ("--allow-insecure-plugins", "use `ccm-host sandbox --allow-insecure-plugins` (before --)"),
    ("--cloud-provider", "use `ccm-host sandbox --cloud-provider NAME` (before --)"),
    ("--cloud-config", "use `ccm-host sandbox --cloud-config FILE` (before --)"),
    ("--kubeconfig", "the controllers talk to the sandbox's API server; use --kubeconfig-out PATH to get its kubeconfig"),
    ("--master", "the controllers talk to the sandbox's API server"),
    ("--cluster-cidr", "use `ccm-host sandbox --cluster-cidr CIDR` (before --) or clusterCIDR in the scenario"),
];

/// How progress is shown on stderr.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ProgressMode {
    /// A live line when stderr is a terminal, plain lines otherwise.
    Auto,
    /// A live line redrawn in place.
    Live,
    /// A plain line when the counts changed (at most one every 2 s, at least one every 10 s).
    Lines,
    /// Nothing until the summary.
    None,
}

/// Output format of the summary (stdout).
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum SummaryFormat {
    /// Tables.
    Text,
    /// One JSON document.
    Json,
}

/// `ccm-host sandbox` arguments.
#[derive(Debug, Args)]
#[command(
    after_help = "Flags of `ccm-host run` for the controllers go after `--`, e.g. \
    `ccm-host sandbox -- --concurrent-node-syncs 4 --controllers '*,-route'`. The sandbox sets \
    --plugin-dir, --cloud-provider, --cloud-config, --kubeconfig and --cluster-cidr itself, and \
    defaults --secure-port 0, --leader-elect true, --configure-cloud-routes true and the \
    --authentication-kubeconfig/--authorization-kubeconfig of the secure port (its API server)."
)]
pub struct SandboxArgs {
    /// Directory of provider plugin `.so` files (repeatable). Default: the directory of this
    /// executable and /usr/lib/ccm-host/plugins, those that exist.
    #[arg(long = "plugin-dir", env = "CCM_PLUGIN_DIR", value_delimiter = ':')]
    pub plugin_dirs: Vec<PathBuf>,
    /// Load plugin files or directories writable by group/others or owned by another user.
    #[arg(long)]
    pub allow_insecure_plugins: bool,
    /// The provider to run.
    #[arg(long, env = "CCM_CLOUD_PROVIDER", default_value = "fake")]
    pub cloud_provider: String,
    /// The provider's cloud config file. Without it the fake provider runs the built-in demo
    /// cloud (one instance per node, an LB address pool, routes).
    #[arg(long, env = "CCM_CLOUD_CONFIG")]
    pub cloud_config: Option<PathBuf>,
    /// Nodes of the generated scene.
    #[arg(long, default_value_t = 20, conflicts_with = "scenario")]
    pub nodes: usize,
    /// LoadBalancer services of the generated scene (the last of two or more has a
    /// loadBalancerClass the controllers do not own).
    #[arg(long, default_value_t = 5, conflicts_with = "scenario")]
    pub services: usize,
    /// A scenario file (YAML): nodes, services, clusterCIDR, cloudConfig (see docs/sandbox.md).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// Pod network of the cluster (default: the scenario's clusterCIDR, else 10.244.0.0/16).
    #[arg(long)]
    pub cluster_cidr: Option<String>,
    /// How long to wait for the scene to converge (Go duration). `auto`: 2m plus the time the
    /// scene's API writes take at the default client limit (20 requests/s per controller).
    #[arg(long, default_value = "auto")]
    pub timeout: String,
    /// How long to keep the API server and the controllers running after the wait ends
    /// (converged or not), e.g. for kubectl; Ctrl-C ends it early (Go duration).
    #[arg(long, default_value = "0s")]
    pub duration: String,
    /// Write a kubeconfig for the sandbox's API server here (for kubectl while it runs).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig_out: Option<PathBuf>,
    /// Address of the sandbox's API server.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub api_address: SocketAddr,
    /// Keep the sandbox's files (kubeconfig, cloud config, the fake cloud's state and call log)
    /// in this directory instead of a temporary one that is removed at the end.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Progress display on stderr.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    /// Summary format on stdout.
    #[arg(long, short = 'o', value_enum, default_value_t = SummaryFormat::Text)]
    pub output: SummaryFormat,
    /// Flags of `ccm-host run` for the controllers.
    #[arg(last = true, value_name = "RUN FLAGS")]
    pub run_flags: Vec<String>,
}

/// A problem with the input: printed as `error: ...`, exit code 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Usage(msg.into()))
}

/// Entry point of `ccm-host sandbox`: returns the process exit code.
pub async fn main(args: SandboxArgs, max_log_level: u8) -> anyhow::Result<i32> {
    let result = match Sandbox::prepare(args, max_log_level).await {
        Ok(sandbox) => sandbox.run().await,
        Err(e) => Err(e),
    };
    match result {
        Ok(code) => Ok(code),
        Err(e) => match e.downcast_ref::<Usage>() {
            Some(u) => {
                eprintln!("error: {u}");
                Ok(EXIT_USAGE)
            }
            None => Err(e),
        },
    }
}

/// The sandbox's files: a temporary directory removed on drop, or `--work-dir`.
struct WorkDir {
    path: PathBuf,
    keep: bool,
}

impl WorkDir {
    fn create(requested: Option<&Path>) -> anyhow::Result<WorkDir> {
        use std::os::unix::fs::DirBuilderExt;
        match requested {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| usage(format!("--work-dir {}: {e}", dir.display())))?;
                Ok(WorkDir {
                    path: dir.canonicalize()?,
                    keep: true,
                })
            }
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.subsec_nanos())
                    .unwrap_or_default();
                let path = std::env::temp_dir()
                    .join(format!("ccm-sandbox-{}-{nanos:08x}", std::process::id()));
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&path)
                    .with_context(|| format!("creating {}", path.display()))?;
                Ok(WorkDir { path, keep: false })
            }
        }
    }

    fn join(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// Remove the directory now unless it is kept: Ok(true) when it was removed.
    fn remove(mut self) -> std::io::Result<bool> {
        if self.keep {
            return Ok(false);
        }
        // Whatever happens, Drop does not try again.
        self.keep = true;
        std::fs::remove_dir_all(&self.path).map(|()| true)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The flags of `ccm-host run`, parsed the way `run` parses them.
#[derive(Debug, Parser)]
#[command(name = "ccm-host sandbox --", no_binary_name = false)]
struct DaemonFlags {
    #[command(flatten)]
    run: RunArgs,
}

/// Whether `flags` mention `flag` (`--flag`, `--flag=value`).
fn mentions(flags: &[String], flag: &str) -> bool {
    flags
        .iter()
        .any(|f| f == flag || f.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
}

/// The `ccm-host run` command line of the embedded daemon.
fn daemon_argv(
    run_flags: &[String],
    plugin_dir: &Path,
    provider: &str,
    cloud_config: Option<&Path>,
    kubeconfig: &Path,
    cluster_cidr: &str,
    allow_insecure: bool,
) -> Result<Vec<String>, String> {
    let mut problems = Vec::new();
    for (flag, hint) in OWNED_RUN_FLAGS {
        if mentions(run_flags, flag) {
            problems.push(format!("{flag} after -- is set by the sandbox: {hint}"));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("\n"));
    }
    let mut argv: Vec<String> = vec!["ccm-host sandbox --".into()];
    let mut push = |a: &str, b: &str| {
        argv.push(a.to_string());
        argv.push(b.to_string());
    };
    push("--plugin-dir", &plugin_dir.display().to_string());
    push("--cloud-provider", provider);
    if let Some(c) = cloud_config {
        push("--cloud-config", &c.display().to_string());
    }
    push("--kubeconfig", &kubeconfig.display().to_string());
    push("--cluster-cidr", cluster_cidr);
    let kubeconfig = kubeconfig.display().to_string();
    for (flag, default) in [
        ("--secure-port", "0"),
        ("--leader-elect", "true"),
        ("--configure-cloud-routes", "true"),
        // The secure port (when served) asks the sandbox's API server about tokens and access,
        // which answers for SANDBOX_TOKEN (see `run`).
        ("--authentication-kubeconfig", kubeconfig.as_str()),
        ("--authorization-kubeconfig", kubeconfig.as_str()),
    ] {
        if !mentions(run_flags, flag) {
            push(flag, default);
        }
    }
    if allow_insecure {
        argv.push("--allow-insecure-plugins".into());
    }
    argv.extend(run_flags.iter().cloned());
    Ok(argv)
}

/// The plugin directories to use: the flag's, else the defaults that exist.
fn plugin_dirs(requested: &[PathBuf]) -> anyhow::Result<(Vec<PathBuf>, bool)> {
    if !requested.is_empty() {
        return Ok((requested.to_vec(), false));
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.canonicalize().ok())
        .and_then(|e| e.parent().map(Path::to_path_buf));
    let candidates: Vec<PathBuf> = exe_dir
        .iter()
        .cloned()
        .chain(std::iter::once(PathBuf::from(SYSTEM_PLUGIN_DIR)))
        .collect();
    let dirs: Vec<PathBuf> = candidates.iter().filter(|d| d.is_dir()).cloned().collect();
    if dirs.is_empty() {
        return Err(usage(format!(
            "no plugin directory: pass --plugin-dir DIR (the defaults, {}, do not exist)",
            candidates
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        )));
    }
    Ok((dirs, true))
}

fn is_fake(provider: &str) -> bool {
    matches!(provider, "fake" | "fake-v1")
}

struct Sandbox {
    args: SandboxArgs,
    max_log_level: u8,
    work: WorkDir,
    timeout: Duration,
    duration: Duration,
    scene: Scene,
    run_args: RunArgs,
    settings: RunSettings,
    provider: Provider,
    cloud: CloudSource,
    expectations: Expectations,
}

/// `--timeout auto`: two minutes plus what the scene's API writes take at the default client
/// limit of 20 requests a second per controller (about three per node: its two writes and an
/// event; about six per LoadBalancer service: finalizer, status and events). 200 nodes and 50
/// services: 2m45s; 2,000 nodes and 200 services: 7m30s. The run ends as soon as it converged.
fn auto_timeout(scene: &scene::Scene) -> Duration {
    const DEFAULT_KUBE_API_QPS: u64 = 20;
    let node_secs = scene.nodes.len() as u64 * 3 / DEFAULT_KUBE_API_QPS;
    let service_secs = scene.services.len() as u64 * 6 / DEFAULT_KUBE_API_QPS;
    Duration::from_secs(120 + node_secs.max(service_secs))
}

impl Sandbox {
    /// Everything that can fail on bad input, before anything runs.
    async fn prepare(args: SandboxArgs, max_log_level: u8) -> anyhow::Result<Sandbox> {
        let duration_flag = |flag: &str, value: &str| {
            crate::duration::parse(value).map_err(|e| usage(format!("--{flag}: {e}")))
        };
        let timeout = match args.timeout.trim() {
            "auto" => None,
            value => {
                let t = duration_flag("timeout", value)?;
                if t.is_zero() {
                    return Err(usage("--timeout must be greater than 0"));
                }
                Some(t)
            }
        };
        let duration = duration_flag("duration", &args.duration)?;
        let provider_name = args.cloud_provider.trim().to_string();
        if provider_name.is_empty() {
            return Err(usage("--cloud-provider cannot be empty"));
        }

        // The scene.
        let demo_cloud = is_fake(&provider_name) && args.cloud_config.is_none();
        let (scenario, source) = match &args.scenario {
            Some(path) => (
                Scenario::read(path).map_err(usage)?,
                format!("scenario {}", path.display()),
            ),
            None if demo_cloud => (
                Scenario::generate(args.nodes, args.services),
                format!(
                    "generated: {} nodes, {} LoadBalancer services",
                    args.nodes, args.services
                ),
            ),
            None => (
                Scenario::generate(args.nodes, args.services).without_demo_cloud(),
                format!(
                    "generated: {} nodes, {} LoadBalancer services",
                    args.nodes, args.services
                ),
            ),
        };
        if scenario.cloud_config.is_some() && args.cloud_config.is_some() {
            return Err(usage(format!(
                "both --cloud-config {} and the scenario's cloudConfig give the cloud config; use one",
                args.cloud_config.as_deref().unwrap_or(Path::new("")).display()
            )));
        }
        let what = match &args.scenario {
            Some(p) => format!("invalid scenario {}", p.display()),
            None => "invalid scene".to_string(),
        };
        let scene = scenario
            .into_scene(source, args.cluster_cidr.as_deref(), demo_cloud)
            .map_err(|e| usage(format!("{what}:\n{e}")))?;
        // A scenario that gives the config file's content verbatim replaces the demo cloud.
        let demo_cloud = demo_cloud && scene.verbatim_config().is_none();

        // Plugins and the daemon's flags.
        let work = WorkDir::create(args.work_dir.as_deref())?;
        let (dirs, quiet) = plugin_dirs(&args.plugin_dirs)?;
        let loader = LoaderOptions {
            allow_insecure: args.allow_insecure_plugins,
            max_log_level,
        };
        // The default directories hold whatever cargo built next to the binary (test fixtures
        // among them): load them without logging the files that are not plugins.
        let registry = if quiet {
            tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
                PluginRegistry::load_dirs(&dirs, &loader)
            })
        } else {
            PluginRegistry::load_dirs(&dirs, &loader)
        }
        .map_err(|e| usage(e.to_string()))?;
        let Some(registration) = registry.get(&provider_name) else {
            let msg = registry
                .create(&provider_name, None, &ProviderOptions::default())
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(usage(format!(
                "{msg} (plugin directories: {})",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let plugin_dir = work.join("plugins");
        let plugin_path = registration.plugin_path.canonicalize()?;
        prepare_plugin_dir(&plugin_dir, &plugin_path)?;
        let config_path = work.join("cloud-config.yaml");
        let kubeconfig = work.join("kubeconfig");
        let has_config = demo_cloud || scene.cloud_config.is_some() || args.cloud_config.is_some();
        let argv = daemon_argv(
            &args.run_flags,
            &plugin_dir,
            &provider_name,
            has_config.then_some(config_path.as_path()),
            &kubeconfig,
            &scene.cluster_cidr.to_string(),
            args.allow_insecure_plugins,
        )
        .map_err(usage)?;
        let run_args = DaemonFlags::try_parse_from(&argv)
            .map_err(|e| {
                let text = e.to_string();
                usage(format!(
                    "flags after --: {}",
                    text.trim().trim_start_matches("error: ")
                ))
            })?
            .run;
        let settings = run_args
            .validate()
            .map_err(|errors| usage(format!("flags after --:\n  {}", errors.join("\n  "))))?;

        // The cloud config the provider gets.
        let state_dir = work.join("cloud");
        let config: Option<Value> = if demo_cloud {
            Some(scene.demo_cloud_config(&settings.controllers.cluster_name, &state_dir))
        } else if let Some(SceneCloudConfig::Mapping(overlay)) = &scene.cloud_config {
            let config = Value::Object(overlay.clone());
            Some(if is_fake(&provider_name) {
                scene::with_state_dir(config, &state_dir)
            } else {
                config
            })
        } else {
            None
        };
        let config_bytes: Option<Vec<u8>> = match (&config, &args.cloud_config) {
            (Some(c), _) => Some(yaml_serde::to_string(c)?.into_bytes()),
            (None, _) if scene.verbatim_config().is_some() => {
                scene.verbatim_config().map(|text| text.as_bytes().to_vec())
            }
            (None, Some(path)) => {
                let bytes = std::fs::read(path).map_err(|e| {
                    usage(format!(
                        "cannot read --cloud-config {}: {e}",
                        path.display()
                    ))
                })?;
                // The fake keeps its cloud in memory: give it a stateDir so the summary can
                // show the cloud's view from its cloud.json.
                Some(match yaml_serde::from_slice::<Value>(&bytes) {
                    Ok(v @ Value::Object(_)) if is_fake(&provider_name) => {
                        yaml_serde::to_string(&scene::with_state_dir(v, &state_dir))?.into_bytes()
                    }
                    _ => bytes,
                })
            }
            (None, None) => None,
        };
        if let Some(bytes) = &config_bytes {
            std::fs::write(&config_path, bytes)
                .with_context(|| format!("writing {}", config_path.display()))?;
        }

        // The provider, built here with the daemon's options: an unusable provider or config is
        // reported before anything starts, its capabilities say what to expect, and the daemon
        // runs the controllers with this same instance (`daemon::run_until_with`), so the
        // cloud view below asks the instance that did the work.
        let options = crate::daemon::provider_options(&settings);
        let provider = registry
            .create(&provider_name, config_bytes.as_deref(), &options)
            .map_err(|e| usage(e.to_string()))?;
        let cloud = if is_fake(&provider_name) {
            let effective: Option<Value> = config_bytes
                .as_deref()
                .and_then(|b| yaml_serde::from_slice(b).ok());
            match effective
                .as_ref()
                .and_then(|c| c.get("stateDir"))
                .and_then(Value::as_str)
            {
                // The fake's own record of its cloud (with each load balancer's hosts), when
                // it keeps one; else the calls, as for any provider.
                _ if effective
                    .as_ref()
                    .and_then(|c| c.get("cloudStateFile"))
                    .and_then(Value::as_bool)
                    == Some(false) =>
                {
                    CloudSource::Provider(provider.clone())
                }
                Some(dir) => CloudSource::FakeStateFile(Path::new(dir).join("cloud.json")),
                None => CloudSource::Provider(provider.clone()),
            }
        } else {
            CloudSource::Provider(provider.clone())
        };
        let expectations = expectations(&provider, &run_args, &settings);
        let timeout = timeout.unwrap_or_else(|| auto_timeout(&scene));
        Ok(Sandbox {
            args,
            max_log_level,
            work,
            timeout,
            duration,
            scene,
            run_args,
            settings,
            provider,
            cloud,
            expectations,
        })
    }

    async fn run(self) -> anyhow::Result<i32> {
        let server = ApiServer::start_with(ApiServerOptions {
            addr: self.args.api_address,
            ..ApiServerOptions::default()
        })
        .await
        .map_err(|e| usage(format!("--api-address {}: {e:#}", self.args.api_address)))?;
        let kubeconfig = self.work.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig)?;
        if let Some(out) = &self.args.kubeconfig_out {
            server
                .write_kubeconfig(out)
                .map_err(|e| usage(format!("--kubeconfig-out: {e:#}")))?;
        }
        let client = server.client();
        seed(&client, &self.scene).await?;
        if self.run_args.secure_port != 0 {
            // The secure port delegates to this API server: a token it accepts, allowed to get
            // every path (/metrics, /healthz/<check>).
            let ctl = server.controls();
            ctl.add_token(SANDBOX_TOKEN, "sandbox-viewer", &[]);
            ctl.allow_non_resource("sandbox-viewer", &["get"], &["*"]);
            let host = match self.run_args.bind_address {
                a if a.is_unspecified() => "127.0.0.1".to_string(),
                std::net::IpAddr::V6(a) => format!("[{a}]"),
                a => a.to_string(),
            };
            eprintln!(
                "sandbox: secure port https://{host}:{port} (self-signed certificate; /healthz and /readyz for anyone): \
                 curl -k -H 'Authorization: Bearer {SANDBOX_TOKEN}' https://{host}:{port}/metrics",
                port = self.run_args.secure_port
            );
        }
        let kubectl_config = self.args.kubeconfig_out.as_deref().unwrap_or(&kubeconfig);
        eprintln!(
            "sandbox: API server {} (kubectl --kubeconfig {} get nodes -o wide{})",
            server.url(),
            kubectl_config.display(),
            match (&self.args.kubeconfig_out, self.work.keep) {
                (Some(_), _) | (None, true) => "",
                (None, false) =>
                    "; that kubeconfig is deleted when the sandbox exits: --kubeconfig-out PATH keeps one",
            }
        );
        eprintln!(
            "sandbox: seeded {} node(s) and {} service(s) ({}); running the controllers with provider {} ({})",
            self.scene.nodes.len(),
            self.scene.services.len(),
            self.scene.source,
            self.provider.registered_name(),
            self.provider.capabilities().names().join(", ")
        );

        let interrupted = CancellationToken::new();
        let signals = tokio::spawn(watch_signals(interrupted.clone()));
        let shutdown = CancellationToken::new();
        let mut display = Display::new(self.args.progress);
        // From here on the controllers' error lines are kept (and still shown) so the summary
        // can say why they stopped.
        let mut tee = match capture::StderrTee::start() {
            Ok(tee) => {
                display.term_fd = tee.terminal_fd();
                Some(tee)
            }
            Err(e) => {
                tracing::debug!("sandbox: not capturing stderr: {e}");
                None
            }
        };
        let captured = |tee: &Option<capture::StderrTee>| {
            tee.as_ref()
                .map(capture::StderrTee::errors)
                .unwrap_or_default()
                .into_iter()
                .filter(|e| !SANDBOX_ERRORS.iter().any(|own| e.text.starts_with(own)))
                .collect::<Vec<_>>()
        };
        // The daemon runs the controllers with the sandbox's provider instance: one instance,
        // initialised once (by the daemon, on leadership), whose answers the cloud view shows.
        let mut daemon = tokio::spawn(crate::daemon::run_until_with(
            self.run_args.clone(),
            self.max_log_level,
            shutdown.clone(),
            self.provider.clone(),
        ));
        let started = Instant::now();
        let mut obs = Observation::default();
        let mut progress;
        let mut daemon_code = None;
        let mut converged_once = false;
        let outcome;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                code = &mut daemon => {
                    let code = code.unwrap_or(EXIT_NOT_CONVERGED);
                    daemon_code = Some(code);
                    progress = evaluate_now(&self, &client, &mut obs).await;
                    outcome = format!("the controller manager stopped with exit code {code}");
                    break;
                }
                _ = interrupted.cancelled() => {
                    progress = evaluate_now(&self, &client, &mut obs).await;
                    outcome = "interrupted".to_string();
                    break;
                }
            }
            // The in-memory server keeps a request log for tests; the sandbox needs none.
            server.controls().clear_requests();
            progress = evaluate_now(&self, &client, &mut obs).await;
            display.show(&progress, &self.expectations, started.elapsed());
            if progress.converged() {
                // Converged on two observations in a row: later follow-ups (e.g. the load
                // balancers' host updates after the last node is initialised) get a moment.
                if converged_once {
                    outcome = "converged".to_string();
                    break;
                }
                converged_once = true;
            } else {
                converged_once = false;
            }
            if started.elapsed() >= self.timeout {
                outcome = format!("timed out after {}", crate::duration::format(self.timeout));
                break;
            }
        }
        let elapsed = started.elapsed();
        display.finish(&progress, &self.expectations, elapsed);

        // The events as the API server holds them once the controllers' event writers have
        // caught up (they queue behind each controller's client rate limit).
        let events_settled = if interrupted.is_cancelled() {
            false
        } else {
            let (events, settled) = self
                .settle_events(&client, &interrupted, display.enabled)
                .await;
            if let Some(events) = events {
                obs.events = events;
            }
            settled
        };
        let converged = progress.converged() && outcome == "converged";
        let reason = (!converged).then(|| {
            why_not_converged(
                daemon_code,
                interrupted.is_cancelled(),
                &captured(&tee),
                &obs,
                &progress,
            )
        });

        // Summary.
        let owned: Vec<Service> = obs
            .services
            .iter()
            .filter(|s| self.expectations.policy.wants_load_balancer(s))
            .cloned()
            .collect();
        let cloud =
            report::cloud_view(&self.cloud, &self.settings.controllers.cluster_name, &owned).await;
        let lease = Api::<Lease>::namespaced(
            client.clone(),
            &self.run_args.leader_elect_resource_namespace,
        )
        .get_opt(&self.run_args.leader_elect_resource_name)
        .await
        .ok()
        .flatten();
        let report = report::build(
            ReportInput {
                scene: &self.scene,
                expectations: &self.expectations,
                progress: &progress,
                outcome: outcome.clone(),
                elapsed_seconds: elapsed.as_secs_f64(),
                provider: ProviderInfo {
                    name: self.provider.registered_name().to_string(),
                    provider_name: self.provider.provider_name().to_string(),
                    plugin: self.provider.plugin_path().to_path_buf(),
                    capabilities: self.provider.capabilities().names(),
                },
                api_server: server.url(),
                kubeconfig: self.args.kubeconfig_out.clone(),
                lease_name: format!(
                    "{}/{}",
                    self.run_args.leader_elect_resource_namespace,
                    self.run_args.leader_elect_resource_name
                ),
                lease,
                reason: reason.clone(),
                events_settled,
            },
            &obs,
            cloud,
        );
        {
            let mut out = std::io::stdout().lock();
            match self.args.output {
                SummaryFormat::Text => report.write_text(&mut out)?,
                SummaryFormat::Json => {
                    serde_json::to_writer_pretty(&mut out, &report)?;
                    writeln!(out)?;
                }
            }
            out.flush()?;
        }
        let why = reason.as_deref().unwrap_or_default();
        let code = if converged {
            0
        } else if let Some(code) = daemon_code {
            eprintln!("error: the scene did not converge: {why}");
            if code == EXIT_USAGE {
                EXIT_USAGE
            } else {
                EXIT_NOT_CONVERGED
            }
        } else if interrupted.is_cancelled() {
            EXIT_INTERRUPTED
        } else {
            eprintln!(
                "error: the scene did not converge within {}: {why}; {} item(s) open, first: {} \
                 (the controllers' own logs: rerun with -v 2)",
                crate::duration::format(self.timeout),
                progress.pending.len(),
                progress.pending.first().map(String::as_str).unwrap_or("")
            );
            EXIT_NOT_CONVERGED
        };

        // Keep serving for kubectl users.
        if daemon_code.is_none() && !interrupted.is_cancelled() && !self.duration.is_zero() {
            let seen_before = captured(&tee).len();
            eprintln!(
                "sandbox: serving {} for {} (Ctrl-C to stop): kubectl --kubeconfig {} get nodes -o wide",
                server.url(),
                crate::duration::format(self.duration),
                kubectl_config.display()
            );
            let mut clear = tokio::time::interval(Duration::from_secs(5));
            let until = tokio::time::sleep(self.duration);
            tokio::pin!(until);
            loop {
                tokio::select! {
                    _ = &mut until => break,
                    _ = interrupted.cancelled() => break,
                    code = &mut daemon => {
                        let code = code.unwrap_or(EXIT_NOT_CONVERGED);
                        let mut errors = captured(&tee);
                        let errors = errors.split_off(seen_before.min(errors.len()));
                        eprintln!(
                            "error: the controller manager stopped with exit code {code}: {}",
                            controllers_stopped(code, &errors)
                        );
                        daemon_code = Some(code);
                        break;
                    }
                    _ = clear.tick() => server.controls().clear_requests(),
                }
            }
        }

        // Stop the controllers (releasing the lease), then the API server.
        shutdown.cancel();
        if daemon_code.is_none()
            && tokio::time::timeout(Duration::from_secs(15), &mut daemon)
                .await
                .is_err()
        {
            eprintln!("sandbox: the controllers did not stop within 15s");
            daemon.abort();
        }
        signals.abort();
        server.shutdown().await;
        if let Some(tee) = tee.as_mut() {
            tee.stop();
        }
        // Say what is left of the kubeconfig the hints named.
        let address = self.args.api_address;
        let work_path = self.work.path.clone();
        let removed = self.work.remove();
        match (&self.args.kubeconfig_out, removed) {
            (Some(out), _) => eprintln!(
                "sandbox: stopped; the API server is gone, {} is kept but points at it{}",
                out.display(),
                if address.port() == 0 {
                    String::new()
                } else {
                    format!(" (a run with --api-address {address} serves that address again)")
                }
            ),
            (None, Ok(true)) => eprintln!(
                "sandbox: stopped; the API server is gone and its kubeconfig {} was deleted with the \
                 sandbox's temporary directory (--kubeconfig-out PATH keeps one)",
                kubeconfig.display()
            ),
            (None, Ok(false)) => eprintln!(
                "sandbox: stopped; the API server is gone, {} is kept (--work-dir) but points at it",
                kubeconfig.display()
            ),
            (None, Err(e)) => eprintln!(
                "sandbox: stopped; the API server is gone; could not delete the temporary directory {} \
                 (holding its kubeconfig): {e}",
                work_path.display()
            ),
        }
        Ok(code)
    }

    /// Wait until the controllers' events have reached the API server: until no event has been
    /// written for [`EVENTS_QUIET`] (or five token intervals of `--kube-api-qps`, if longer: the
    /// event writers queue behind their controller's client rate limit), at most
    /// [`EVENTS_SETTLE_MAX`]. Returns the events then (None if they cannot be listed) and whether
    /// they had settled.
    async fn settle_events(
        &self,
        client: &Client,
        interrupted: &CancellationToken,
        say_so: bool,
    ) -> (Option<Vec<Event>>, bool) {
        let api: Api<Event> = Api::all(client.clone());
        let quiet = EVENTS_QUIET.max(Duration::from_secs_f64(
            (5.0 / self.settings.kube_api_qps).min(EVENTS_SETTLE_MAX.as_secs_f64()),
        ));
        let started = Instant::now();
        let mut last: Option<((usize, u64), Instant)> = None;
        let mut said = false;
        loop {
            let events = match api.list(&ListParams::default()).await {
                Ok(list) => list.items,
                Err(e) => {
                    tracing::warn!("sandbox: listing the events failed: {e}");
                    return (None, false);
                }
            };
            let fingerprint = observe::events_fingerprint(&events);
            let unchanged_since = match last {
                Some((f, since)) if f == fingerprint => since,
                _ => {
                    last = Some((fingerprint, Instant::now()));
                    Instant::now()
                }
            };
            // The newest event's lastTimestamp has whole seconds: one more for the rounding.
            let quiet_on_server = observe::newest_event_write(&events)
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age >= quiet + Duration::from_secs(1));
            if unchanged_since.elapsed() >= quiet || quiet_on_server {
                return (Some(events), true);
            }
            if started.elapsed() >= EVENTS_SETTLE_MAX {
                return (Some(events), false);
            }
            if say_so && !said {
                // Once, when the first look shows events still arriving.
                said = true;
                eprintln!(
                    "sandbox: waiting for the controllers' events to reach the API server ({} so \
                     far; until none for {}, at most {})",
                    events.len(),
                    crate::duration::format(quiet),
                    crate::duration::format(EVENTS_SETTLE_MAX)
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = interrupted.cancelled() => return (Some(events), false),
            }
        }
    }
}

/// The summary's events are taken once none has been written for this long.
const EVENTS_QUIET: Duration = Duration::from_secs(2);
/// The longest the summary waits for the events to settle.
const EVENTS_SETTLE_MAX: Duration = Duration::from_secs(30);
/// The sandbox's own `error:` lines (not the controllers').
const SANDBOX_ERRORS: [&str; 2] = [
    "the scene did not converge",
    "the controller manager stopped",
];

/// Why the controllers stopped, from their error lines.
fn controllers_stopped(code: i32, errors: &[capture::ErrorLine]) -> String {
    let lease = errors
        .iter()
        .find(|e| e.text.starts_with("leaderelection lost"));
    match (lease, errors.first()) {
        (Some(lost), _) => format!(
            "the leader lost its lease ({}), so the controllers stopped (exit code {code})",
            lost.text
        ),
        (None, Some(first)) => {
            format!("the controllers stopped (exit code {code}): {}", first.text)
        }
        (None, None) => format!(
            "the controllers stopped (exit code {code}) without an error message (rerun with -v 2 for their logs)"
        ),
    }
}

/// Why the scene did not converge, in one sentence: the leader lost its lease, the controllers
/// stopped (with their first error), or the first error seen (an error line of the controllers
/// or a Warning event, whichever came first).
fn why_not_converged(
    daemon_code: Option<i32>,
    interrupted: bool,
    errors: &[capture::ErrorLine],
    obs: &Observation,
    progress: &Progress,
) -> String {
    if let Some(code) = daemon_code {
        return controllers_stopped(code, errors);
    }
    if interrupted {
        return "interrupted (SIGINT/SIGTERM) before the scene converged".into();
    }
    let logged = errors
        .first()
        .map(|e| (Some(e.at), format!("the controllers logged: {}", e.text)));
    let warning = obs.first_warning().map(|(e, at)| {
        let o = &e.involved_object;
        let object = match o.namespace.as_deref().filter(|n| !n.is_empty()) {
            Some(ns) => format!("{ns}/{}", o.name.as_deref().unwrap_or("")),
            None => o.name.clone().unwrap_or_default(),
        };
        (
            at,
            format!(
                "Warning {} on {} {object}: {}",
                e.reason.as_deref().unwrap_or(""),
                o.kind.as_deref().unwrap_or("object").to_lowercase(),
                e.message.as_deref().unwrap_or("").trim()
            ),
        )
    });
    let first = match (logged, warning) {
        (Some(l), Some(w)) => Some(if w.0 <= l.0 { w } else { l }),
        (l, w) => l.or(w),
    };
    match first {
        Some((_, text)) => format!("first error seen: {text}"),
        None => format!(
            "no error seen; {} item(s) still open when the wait ended",
            progress.pending.len()
        ),
    }
}

/// What to expect of the controllers given their selection, flags and the provider.
fn expectations(provider: &Provider, run_args: &RunArgs, settings: &RunSettings) -> Expectations {
    use crate::controllers::{node, route, service};
    let caps = provider.capabilities();
    let enabled = |name: &str| settings.selection.is_enabled(name);
    let disabled = |alias: &str| format!("--controllers does not enable {alias}");
    Expectations {
        nodes: if !enabled(node::NAME) {
            Err(disabled(node::ALIAS))
        } else if !caps.instances && !caps.instances_v2 {
            Err("the provider has neither InstancesV2 nor Instances".into())
        } else {
            Ok(())
        },
        routes: if !enabled(route::NAME) {
            Err(disabled(route::ALIAS))
        } else if !run_args.configure_cloud_routes {
            Err("--configure-cloud-routes=false".into())
        } else if !caps.routes {
            Err("the provider does not support Routes".into())
        } else {
            Ok(())
        },
        load_balancers: if !enabled(service::NAME) {
            Err(disabled(service::ALIAS))
        } else if !caps.load_balancer {
            Err("the provider does not support LoadBalancer".into())
        } else {
            Ok(())
        },
        policy: ClassPolicy::from_config(&settings.controllers),
    }
}

async fn evaluate_now(sb: &Sandbox, client: &Client, obs: &mut Observation) -> Progress {
    match Observation::take(client).await {
        Ok(o) => *obs = o,
        Err(e) => tracing::warn!("sandbox: listing the cluster failed: {e}"),
    }
    observe::evaluate(&sb.scene, &sb.expectations, obs)
}

/// A directory holding only the selected provider's plugin (a symlink), for the daemon: the
/// default directories may hold other libraries it would log about.
fn prepare_plugin_dir(dir: &Path, plugin: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cleaning {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    let name = plugin
        .file_name()
        .context("plugin path without a file name")?;
    std::os::unix::fs::symlink(plugin, dir.join(name))
        .with_context(|| format!("linking {} into {}", plugin.display(), dir.display()))
}

/// Seed the scene: a dry run of every object first (the API server's own validation, so a bad
/// scenario is reported as a whole and changes nothing), then the real writes.
async fn seed(client: &Client, scene: &Scene) -> anyhow::Result<()> {
    let namespaces = scene.namespaces();
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in &namespaces {
        let name = ns.metadata.name.clone().unwrap_or_default();
        ns_api
            .create(&PostParams::default(), ns)
            .await
            .map_err(|e| {
                usage(format!(
                    "namespace {name:?} of the scenario's services: {}",
                    kube_message(&e)
                ))
            })?;
    }
    let nodes = scene.node_objects();
    let services = scene.service_objects();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let node_api: Api<Node> = Api::all(client.clone());
    let mut problems = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        if let Err(e) = node_api.create(&dry, node).await {
            problems.push(format!("nodes[{i}]: {}", kube_message(&e)));
        }
    }
    for (i, svc) in services.iter().enumerate() {
        let api: Api<Service> = Api::namespaced(
            client.clone(),
            svc.metadata.namespace.as_deref().unwrap_or("default"),
        );
        if let Err(e) = api.create(&dry, svc).await {
            problems.push(format!("services[{i}]: {}", kube_message(&e)));
        }
    }
    if !problems.is_empty() {
        return Err(usage(format!(
            "the API server refused the scene ({}):\n  {}",
            scene.source,
            problems.join("\n  ")
        )));
    }
    let pp = PostParams::default();
    let created = futures::stream::iter(nodes.iter().map(|n| node_api.create(&pp, n)))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .context("seeding nodes")?;
    // Each kubelet's Lease in kube-node-lease (kubectl describe node shows it).
    let lease_api: Api<Lease> = Api::namespaced(client.clone(), scene::NODE_LEASE_NAMESPACE);
    futures::stream::iter(created.iter().map(|n| {
        let (api, lease) = (lease_api.clone(), scene::node_lease(n));
        async move { api.create(&PostParams::default(), &lease).await }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<_>>()
    .await
    .context("seeding the nodes' Leases")?;
    futures::stream::iter(services.iter().map(|s| {
        let api: Api<Service> = Api::namespaced(
            client.clone(),
            s.metadata.namespace.as_deref().unwrap_or("default"),
        );
        async move { api.create(&PostParams::default(), s).await }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<_>>()
    .await
    .context("seeding services")?;
    Ok(())
}

fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

async fn watch_signals(interrupted: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("sandbox: cannot listen for SIGINT/SIGTERM");
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    interrupted.cancel();
}

/// Progress on stderr: a live line on a terminal, plain lines otherwise.
struct Display {
    live: bool,
    enabled: bool,
    /// The terminal's descriptor, for its width (stderr, or its copy while stderr is teed).
    term_fd: std::os::fd::RawFd,
    last: String,
    last_at: Option<Instant>,
    frame: usize,
}

impl Display {
    fn new(mode: ProgressMode) -> Display {
        let tty = std::io::stderr().is_terminal();
        Display {
            live: mode == ProgressMode::Live || (mode == ProgressMode::Auto && tty),
            enabled: mode != ProgressMode::None,
            term_fd: 2,
            last: String::new(),
            last_at: None,
            frame: 0,
        }
    }

    fn bar(p: &Progress) -> String {
        let total = p.nodes_total + p.routes_total + p.lbs_total;
        let done = p.nodes_initialised + p.routes_created + p.lbs_ensured;
        let width = 20;
        let filled = (done * width)
            .checked_div(total)
            .unwrap_or(width)
            .min(width);
        format!("[{}{}]", "#".repeat(filled), ".".repeat(width - filled))
    }

    fn show(&mut self, p: &Progress, exp: &Expectations, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let line = p.line(exp);
        let mut err = std::io::stderr().lock();
        if self.live {
            const SPIN: [char; 4] = ['|', '/', '-', '\\'];
            self.frame += 1;
            let text = format!(
                "{} {} {:>5.1}s  {line}",
                SPIN[self.frame % SPIN.len()],
                Self::bar(p),
                elapsed.as_secs_f64()
            );
            // Never wrap: a wrapped line cannot be redrawn in place.
            let _ = write!(err, "\r\x1b[2K{}", fit_terminal(&text, self.term_fd));
            let _ = err.flush();
        } else {
            // A line when something changed (at most one every 2 s, so a large scene does not
            // write hundreds into a log file), and at least one every 10 s.
            let since = self.last_at.map(|t| t.elapsed());
            let changed = line != self.last && since.is_none_or(|d| d >= Duration::from_secs(2));
            let stale = since.is_none_or(|d| d >= Duration::from_secs(10));
            if changed || stale {
                let _ = writeln!(err, "sandbox: {:>5.1}s  {line}", elapsed.as_secs_f64());
                self.last = line;
                self.last_at = Some(Instant::now());
            }
        }
    }

    fn finish(&mut self, p: &Progress, exp: &Expectations, elapsed: Duration) {
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr().lock();
        let line = p.line(exp);
        if self.live {
            let text = format!("  {} {:>5.1}s  {line}", Self::bar(p), elapsed.as_secs_f64());
            let _ = writeln!(err, "\r\x1b[2K{}", fit_terminal(&text, self.term_fd));
        } else if line != self.last {
            let _ = writeln!(err, "sandbox: {:>5.1}s  {line}", elapsed.as_secs_f64());
        }
    }
}

/// `text` cut to the width of the terminal `fd` (unchanged when it is unknown).
#[allow(unsafe_code)] // ioctl(TIOCGWINSZ)
fn fit_terminal(text: &str, fd: std::os::fd::RawFd) -> String {
    // SAFETY: TIOCGWINSZ fills the winsize struct we pass; an fd that is not a terminal fails.
    let width = unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        (libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0)
            .then_some(usize::from(ws.ws_col))
    };
    match width {
        Some(w) if text.chars().count() >= w => text.chars().take(w.saturating_sub(1)).collect(),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(run_flags: &[&str]) -> Result<Vec<String>, String> {
        daemon_argv(
            &run_flags.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            Path::new("/w/plugins"),
            "fake",
            Some(Path::new("/w/cloud-config.yaml")),
            Path::new("/w/kubeconfig"),
            "10.244.0.0/16",
            false,
        )
    }

    #[test]
    fn daemon_flags_default_what_the_user_leaves_out() {
        let a = argv(&["--concurrent-node-syncs", "4", "--leader-elect=false"]).unwrap();
        let run = DaemonFlags::try_parse_from(&a).unwrap().run;
        assert!(!run.leader_elect, "the user's --leader-elect wins");
        assert_eq!(run.concurrent_node_syncs, 4);
        assert_eq!(run.secure_port, 0);
        assert!(run.configure_cloud_routes);
        assert_eq!(run.cluster_cidr, "10.244.0.0/16");
        assert_eq!(run.cloud_provider, "fake");
        assert_eq!(run.kubeconfig.as_deref(), Some(Path::new("/w/kubeconfig")));
        assert_eq!(run.plugins.plugin_dirs, [PathBuf::from("/w/plugins")]);
        let run = DaemonFlags::try_parse_from(argv(&[]).unwrap()).unwrap().run;
        assert!(run.leader_elect, "leader election on by default");
        let auth = run.upstream.auth_settings();
        assert_eq!(
            (
                auth.authentication_kubeconfig,
                auth.authorization_kubeconfig
            ),
            (
                Some(PathBuf::from("/w/kubeconfig")),
                Some(PathBuf::from("/w/kubeconfig"))
            ),
            "the secure port delegates to the sandbox's API server"
        );
    }

    #[test]
    fn flags_the_sandbox_sets_are_refused_after_the_separator() {
        let e = argv(&["--kubeconfig=/x", "--cluster-cidr", "10.0.0.0/8"]).unwrap_err();
        assert_eq!(
            e,
            "--kubeconfig after -- is set by the sandbox: the controllers talk to the sandbox's API server; use --kubeconfig-out PATH to get its kubeconfig\n\
             --cluster-cidr after -- is set by the sandbox: use `ccm-host sandbox --cluster-cidr CIDR` (before --) or clusterCIDR in the scenario"
        );
        assert!(!mentions(&["--kubeconfig-out".into()], "--kubeconfig"));
    }
}
