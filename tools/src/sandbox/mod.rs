//! `ccm-host sandbox`: the real controllers against the in-memory API server and a provider
//! plugin (by default the fake provider with a built-in demo cloud): no cluster needed.
//!
//! 1. Load the plugins, select the provider (or the scenario's `providers:`, several in one
//!    host: a hybrid cluster), build the scene (generated, or `--scenario FILE`), each
//!    provider's cloud config (for the fake and metal without one: the demo cloud) and the
//!    provider instances themselves.
//! 2. Start [`kube_apiserver_inmem::ApiServer`], write a kubeconfig (also to `--kubeconfig-out`),
//!    seed namespaces, kubelet-style nodes (with their Leases) and LoadBalancer services
//!    (validated by the API server with a dry run first, so a bad scenario changes nothing).
//! 3. Run the real daemon in-process with those instances
//!    ([`ccm_host::daemon::run_until_with_providers`], leader election on) and flags built from
//!    ours plus any `ccm-host run` flags given after `--`.
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

use ccm_host::controllers::service::predicates::ClassPolicy;
use ccm_host::daemon::provider_set::ProviderSpec;
use ccm_host::daemon::{RunArgs, RunSettings};
use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::{Provider, ProviderOptions};
use ccm_host::runtime::ownership::{Owner, Ownership};
use ccm_host::runtime::CachedNode;
use observe::{Expectations, ExpectedOwner, Observation, Progress, ProviderExpectations};
use report::{CloudSource, ProviderInfo, ReportInput};
use scene::{Scenario, Scene, SceneCloudConfig, SceneContext};

/// Exit code for bad input (flags, scenario, provider).
pub const EXIT_USAGE: i32 = 2;

/// The most nodes, and the most services, of a generated scene (`--nodes`, `--services`).
pub const MAX_GENERATED: usize = 100_000;
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
    /// The provider to run [default: fake]. A scenario with `providers:` names its own
    /// (several: a hybrid cluster).
    #[arg(long, env = "CCM_CLOUD_PROVIDER")]
    pub cloud_provider: Option<String>,
    /// The provider's cloud config file. Without it the fake and metal providers run the
    /// sandbox's demo cloud (the fake: one instance per node, an LB address pool, routes;
    /// metal: an inventory of the nodes and an address pool).
    #[arg(long, env = "CCM_CLOUD_CONFIG")]
    pub cloud_config: Option<PathBuf>,
    /// Nodes of the generated scene.
    #[arg(long, default_value_t = 20, conflicts_with = "scenario")]
    pub nodes: usize,
    /// LoadBalancer services of the generated scene (the last of two or more has a
    /// loadBalancerClass the controllers do not own).
    #[arg(long, default_value_t = 5, conflicts_with = "scenario")]
    pub services: usize,
    /// A scenario file (YAML): nodes, services, clusterCIDR, cloudConfig, providers (see
    /// docs/sandbox.md).
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
#[command(
    name = "ccm-host sandbox --",
    no_binary_name = false,
    allow_negative_numbers = true
)]
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

/// One provider on the embedded daemon's command line.
#[derive(Debug, Clone, Copy)]
struct DaemonProvider<'a> {
    name: &'a str,
    cloud_config: Option<&'a Path>,
    platforms: &'a [String],
    load_balancer_classes: &'a [String],
    load_balancer_hosts: Option<&'a str>,
}

impl<'a> DaemonProvider<'a> {
    /// A provider with a config file and nothing else.
    fn plain(name: &'a str, cloud_config: Option<&'a Path>) -> Self {
        DaemonProvider {
            name,
            cloud_config,
            platforms: &[],
            load_balancer_classes: &[],
            load_balancer_hosts: None,
        }
    }
}

/// The `ccm-host run` command line of the embedded daemon. With one provider every flag has
/// its upstream form; with several the per-provider values name theirs (`NAME=VALUE`,
/// `CLASS=NAME`), as `run` reads them (daemon::provider_set).
fn daemon_argv(
    run_flags: &[String],
    plugin_dir: &Path,
    providers: &[DaemonProvider<'_>],
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
    let names: Vec<&str> = providers.iter().map(|p| p.name).collect();
    push("--cloud-provider", &names.join(","));
    let several = providers.len() > 1;
    for p in providers {
        let named = |value: &str| {
            if several {
                format!("{}={value}", p.name)
            } else {
                value.to_string()
            }
        };
        if let Some(c) = p.cloud_config {
            push("--cloud-config", &named(&c.display().to_string()));
        }
        for platform in p.platforms {
            push("--cloud-provider-platforms", &named(platform));
        }
        for class in p.load_balancer_classes {
            let value = if several {
                format!("{class}={}", p.name)
            } else {
                class.clone()
            };
            push("--load-balancer-class", &value);
        }
        if let Some(hosts) = p.load_balancer_hosts {
            push("--load-balancer-hosts", &named(hosts));
        }
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

struct Sandbox {
    args: SandboxArgs,
    max_log_level: u8,
    work: WorkDir,
    timeout: Duration,
    duration: Duration,
    scene: Scene,
    run_args: RunArgs,
    settings: RunSettings,
    /// The providers, in `--cloud-provider` order, each with where its cloud's view comes from.
    providers: Vec<(Provider, CloudSource)>,
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
            ccm_host::runtime::duration::parse(value).map_err(|e| usage(format!("--{flag}: {e}")))
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

        // The scene, and the providers: the scenario's `providers:`, else --cloud-provider.
        let scenario = match &args.scenario {
            Some(path) => Some(Scenario::read(path).map_err(usage)?),
            None => None,
        };
        let named: Vec<String> = scenario
            .iter()
            .flat_map(|s| &s.providers)
            .map(|p| p.name.trim().to_string())
            .collect();
        let provider_name = if named.is_empty() {
            let name = args.cloud_provider.as_deref().unwrap_or("fake").trim();
            if name.is_empty() {
                return Err(usage("--cloud-provider cannot be empty"));
            }
            if name.contains(',') {
                return Err(usage(format!(
                    "--cloud-provider {name}: several providers run from a scenario that names them \
                     in providers:, each with the nodes of its cloud (docs/sandbox.md, hybrid clusters)"
                )));
            }
            name.to_string()
        } else {
            let list = named.join(",");
            if let Some(flag) = &args.cloud_provider {
                let given: Vec<&str> = flag.split(',').map(str::trim).collect();
                if given != named.iter().map(String::as_str).collect::<Vec<_>>() {
                    return Err(usage(format!(
                        "--cloud-provider {flag}: the scenario names its providers ({list}) in \
                         providers:; leave --cloud-provider out"
                    )));
                }
            }
            if let Some(file) = &args.cloud_config {
                return Err(usage(format!(
                    "--cloud-config {}: the scenario names its providers ({list}); give each its \
                     cloudConfig in providers:",
                    file.display()
                )));
            }
            named[0].clone()
        };
        let context = SceneContext {
            provider: &provider_name,
            config_file: args.cloud_config.is_some(),
        };
        let generated = || {
            format!(
                "generated: {} nodes, {} LoadBalancer services",
                args.nodes, args.services
            )
        };
        // Checked before anything is allocated for them (a typo of 100000000 nodes asked for
        // 28.8 GB and aborted).
        if args.scenario.is_none() {
            for (flag, n) in [("--nodes", args.nodes), ("--services", args.services)] {
                if n > MAX_GENERATED {
                    return Err(usage(format!(
                        "{flag} {n}: at most {MAX_GENERATED} (the sandbox holds the whole scene in memory)"
                    )));
                }
            }
        }
        let (scenario, source) = match (scenario, &args.scenario) {
            // A scenario of cloudConfig (or clusterCIDR) only, e.g. faults for the demo cloud:
            // its keys over the generated scene, rather than a scene of nothing that converges
            // at once.
            (Some(s), Some(path))
                if s.nodes.is_empty() && s.services.is_empty() && s.providers.is_empty() =>
            {
                let mut g = Scenario::generate(args.nodes, args.services);
                let verbatim = matches!(s.cloud_config, Some(Value::String(_)));
                if !scene::has_demo_cloud(&provider_name) || args.cloud_config.is_some() || verbatim
                {
                    g = g.without_demo_cloud();
                }
                g.cloud_config = s.cloud_config;
                if s.cluster_cidr.is_some() {
                    g.cluster_cidr = s.cluster_cidr;
                }
                eprintln!(
                    "sandbox: scenario {} has no nodes: and no services:, so its keys apply to the \
                     generated scene ({} nodes, {} LoadBalancer services)",
                    path.display(),
                    args.nodes,
                    args.services
                );
                (
                    g,
                    format!("scenario {} over the {}", path.display(), generated()),
                )
            }
            (Some(s), Some(path)) => (s, format!("scenario {}", path.display())),
            _ if scene::has_demo_cloud(&provider_name) && args.cloud_config.is_none() => {
                (Scenario::generate(args.nodes, args.services), generated())
            }
            _ => (
                Scenario::generate(args.nodes, args.services).without_demo_cloud(),
                generated(),
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
            .into_scene(source, args.cluster_cidr.as_deref(), &context)
            .map_err(|e| usage(format!("{what}:\n{e}")))?;
        let several = scene.providers.len() > 1;
        if scene.nodes.is_empty() && scene.services.is_empty() {
            eprintln!(
                "sandbox: the scene seeds nothing (no nodes, no services): it converges at once; \
                 add nodes: or services: to the scenario"
            );
        }

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
            PluginRegistry::load_dirs_quietly(&dirs, &loader)
        } else {
            PluginRegistry::load_dirs(&dirs, &loader)
        }
        .map_err(|e| usage(e.to_string()))?;
        let mut plugin_paths = Vec::new();
        for p in &scene.providers {
            let Some(registration) = registry.get(&p.name) else {
                let msg = registry
                    .create(&p.name, None, &ProviderOptions::default())
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
            let path = registration.plugin_path.canonicalize()?;
            if !plugin_paths.contains(&path) {
                plugin_paths.push(path);
            }
        }
        let plugin_dir = work.join("plugins");
        prepare_plugin_dir(&plugin_dir, &plugin_paths)?;
        // Each provider's files: one provider keeps the names of a one-provider sandbox.
        let file_of = |base: &str, ext: &str, name: &str| {
            if several {
                work.join(&format!("{base}-{name}{ext}"))
            } else {
                work.join(&format!("{base}{ext}"))
            }
        };
        let config_paths: Vec<Option<PathBuf>> = scene
            .providers
            .iter()
            .map(|p| {
                let has_config = p.demo
                    || p.cloud_config.is_some()
                    || (!scene.named_providers && args.cloud_config.is_some());
                has_config.then(|| file_of("cloud-config", ".yaml", &p.name))
            })
            .collect();
        let kubeconfig = work.join("kubeconfig");
        let daemon_providers: Vec<DaemonProvider<'_>> = scene
            .providers
            .iter()
            .zip(&config_paths)
            .map(|(p, config)| DaemonProvider {
                load_balancer_classes: &p.load_balancer_classes,
                platforms: &p.platforms,
                load_balancer_hosts: p.load_balancer_hosts.as_deref(),
                ..DaemonProvider::plain(&p.name, config.as_deref())
            })
            .collect();
        let argv = daemon_argv(
            &args.run_flags,
            &plugin_dir,
            &daemon_providers,
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

        // Each provider's cloud config, then the provider, built here with the daemon's
        // options: an unusable provider or config is reported before anything starts, its
        // capabilities say what to expect, and the daemon runs the controllers with these same
        // instances (`daemon::run_until_with_providers`), so the cloud view below asks the
        // instances that did the work.
        let options = ccm_host::daemon::provider_options(&settings);
        let cluster_name = settings.controllers.cluster_name.clone();
        let mut providers = Vec::new();
        for (i, (p, config_path)) in scene.providers.iter().zip(&config_paths).enumerate() {
            let state_dir = file_of("cloud", "", &p.name);
            let config: Option<Value> = if p.demo && scene::is_fake(&p.name) {
                Some(scene.fake_demo_cloud(i, &cluster_name, &state_dir))
            } else if p.demo {
                // metal: its inventory of the scene's nodes and an address pool.
                let inventory_path = work.join(&format!("inventory-{}.yaml", p.name));
                let (config, inventory) = scene.metal_demo_cloud(i, &inventory_path);
                if let Some(inventory) = inventory {
                    std::fs::write(&inventory_path, yaml_serde::to_string(&inventory)?)
                        .with_context(|| format!("writing {}", inventory_path.display()))?;
                }
                Some(config)
            } else if let Some(SceneCloudConfig::Mapping(overlay)) = &p.cloud_config {
                let config = Value::Object(overlay.clone());
                Some(if scene::is_fake(&p.name) {
                    scene::with_state_dir(config, &state_dir)
                } else {
                    config
                })
            } else {
                None
            };
            let cli_file = args
                .cloud_config
                .as_ref()
                .filter(|_| !scene.named_providers);
            let config_bytes: Option<Vec<u8>> = match (&config, cli_file) {
                (Some(c), _) => Some(yaml_serde::to_string(c)?.into_bytes()),
                (None, _) if p.verbatim_config().is_some() => {
                    p.verbatim_config().map(|text| text.as_bytes().to_vec())
                }
                (None, Some(path)) => {
                    let bytes = ccm_host::args::read_input_file(path).map_err(|e| {
                        usage(format!(
                            "cannot read --cloud-config {}: {e}",
                            path.display()
                        ))
                    })?;
                    // The fake keeps its cloud in memory: give it a stateDir so the summary can
                    // show the cloud's view from its cloud.json.
                    Some(match yaml_serde::from_slice::<Value>(&bytes) {
                        Ok(v @ Value::Object(_)) if scene::is_fake(&p.name) => {
                            yaml_serde::to_string(&scene::with_state_dir(v, &state_dir))?
                                .into_bytes()
                        }
                        _ => bytes,
                    })
                }
                (None, None) => None,
            };
            if let (Some(bytes), Some(path)) = (&config_bytes, config_path) {
                std::fs::write(path, bytes)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            let provider = registry
                .create(&p.name, config_bytes.as_deref(), &options)
                .map_err(|e| {
                    usage(if several {
                        format!("provider {}: {e}", p.name)
                    } else {
                        e.to_string()
                    })
                })?;
            let cloud = cloud_source(&p.name, &provider, config_bytes.as_deref());
            providers.push((provider, cloud));
        }
        let expectations = expectations(&scene, &providers, &run_args, &settings)?;
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
            providers,
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
            "sandbox: API server {} ({})",
            server.url(),
            kubectl_hint(
                kubectl_config,
                self.args.kubeconfig_out.is_some(),
                self.work.keep,
                self.duration
            )
        );
        let running: Vec<String> = self
            .providers
            .iter()
            .map(|(p, _)| {
                format!(
                    "{} ({})",
                    p.registered_name(),
                    p.capabilities().names().join(", ")
                )
            })
            .collect();
        eprintln!(
            "sandbox: seeded {} node(s) and {} service(s) ({}); running the controllers with provider{} {}",
            self.scene.nodes.len(),
            self.scene.services.len(),
            self.scene.source,
            if running.len() > 1 { "s" } else { "" },
            running.join(", ")
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
        // The daemon runs the controllers with the sandbox's provider instances: one instance
        // each, initialised once (by the daemon, on leadership), whose answers the cloud view
        // shows.
        let mut daemon = tokio::spawn(ccm_host::daemon::run_until_with_providers(
            self.run_args.clone(),
            self.max_log_level,
            shutdown.clone(),
            self.providers.iter().map(|(p, _)| p.clone()).collect(),
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
                outcome = format!(
                    "timed out after {}",
                    ccm_host::runtime::duration::format(self.timeout)
                );
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
        let mut reason = (!converged).then(|| {
            why_not_converged(
                daemon_code,
                interrupted.is_cancelled(),
                &captured(&tee),
                &obs,
                &progress,
            )
        });
        if let Some(why) = reason.as_mut().filter(|w| w.starts_with(NO_ERROR_SEEN)) {
            if let Some(seen) = self.ask_about_open_node(&progress).await {
                why.push_str(&seen);
            }
        }

        // Summary: each provider's cloud, asked about the services it serves.
        let mut views = Vec::new();
        for (i, (provider, source)) in self.providers.iter().enumerate() {
            let served: Vec<Service> = obs
                .services
                .iter()
                .filter(|s| self.expectations.server_of(s) == Some(i))
                .cloned()
                .collect();
            let mut view =
                report::cloud_view(source, &self.settings.controllers.cluster_name, &served).await;
            // The summary is read after the sandbox exited: never name a file it deleted.
            if let CloudSource::FakeStateFile(path) = source {
                if !self.work.keep && path.starts_with(&self.work.path) {
                    view.source = format!(
                        "fake cloud state: {} in the sandbox's temporary directory, deleted at exit \
                         (--work-dir DIR keeps it)",
                        path.file_name().unwrap_or_default().to_string_lossy()
                    );
                }
            }
            views.push((provider.registered_name().to_string(), view));
        }
        let cloud = report::merge_views(views);
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
                providers: self.provider_infos(),
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
                ccm_host::runtime::duration::format(self.timeout),
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
                ccm_host::runtime::duration::format(self.duration),
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

    /// When nothing was reported and a node is still not initialised: what its provider says
    /// about it (the controllers log "instance not found" at info level only), and for a
    /// generated scene with a provider without a demo cloud, that the generated names may be
    /// unknown to that cloud. `None` when no node is open.
    async fn ask_about_open_node(&self, progress: &Progress) -> Option<String> {
        let node_name = progress.pending.iter().find_map(|item| {
            let (name, what) = item.strip_prefix("node ")?.split_once(": ")?;
            what.starts_with("not initialised").then_some(name)
        })?;
        let seeded = self.scene.nodes.iter().find(|n| n.spec.name == node_name)?;
        let node = Scene::node_object(seeded);
        let (provider, _) = self.providers.first()?;
        let caps = provider.capabilities();
        let answer = if caps.instances_v2 {
            match provider.instance_metadata(&node).await {
                Ok(Some(_)) => return None,
                Ok(None) => "no instance metadata".to_string(),
                Err(e) => e.to_string(),
            }
        } else if caps.instances {
            match provider.instance_id(node_name).await {
                Ok(_) => return None,
                Err(e) => e.to_string(),
            }
        } else {
            return None;
        };
        let generated =
            self.args.scenario.is_none() && !self.scene.providers.iter().any(|p| p.demo);
        Some(format!(
            "; provider {} answers for node {node_name}: {answer}{}",
            provider.registered_name(),
            if generated {
                " (the generated nodes are named node-01…: does your cloud know these names? \
                 give it a scenario with your instances' names, see docs/sandbox.md#another-provider)"
            } else {
                ""
            }
        ))
    }

    /// What the summary says of each provider.
    fn provider_infos(&self) -> Vec<ProviderInfo> {
        self.providers
            .iter()
            .enumerate()
            .map(|(i, (p, _))| {
                let spec = &self.settings.providers.providers[i];
                let exp = &self.expectations.providers[i];
                ProviderInfo {
                    name: p.registered_name().to_string(),
                    provider_name: p.provider_name().to_string(),
                    plugin: p.plugin_path().to_path_buf(),
                    capabilities: p.capabilities().names(),
                    platforms: self.expectations.ownership.platforms(i).to_vec(),
                    load_balancer_classes: spec.load_balancer_classes.clone(),
                    classless: spec.classless,
                    expected: report::Expected {
                        nodes: observe::on_off(&exp.nodes),
                        routes: observe::on_off(&exp.routes),
                        load_balancers: observe::on_off(&exp.load_balancers),
                    },
                }
            })
            .collect()
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
                    ccm_host::runtime::duration::format(quiet),
                    ccm_host::runtime::duration::format(EVENTS_SETTLE_MAX)
                );
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                _ = interrupted.cancelled() => return (Some(events), false),
            }
        }
    }
}

/// What the first line says about kubectl: a command that works while the server runs, and
/// for how long it runs; without `--duration` the sandbox exits as soon as the scene converged
/// (seconds), so the hint is the flag that keeps it serving.
fn kubectl_hint(kubeconfig: &Path, kept: bool, work_kept: bool, duration: Duration) -> String {
    if duration.is_zero() {
        // A file that stays can be named; a temporary one would be gone before it is used.
        return if kept || work_kept {
            format!(
                "kubectl --kubeconfig {} get nodes -o wide, while the sandbox runs: it exits once \
                 the scene converged, --duration 10m keeps it serving",
                kubeconfig.display()
            )
        } else {
            "the sandbox exits once the scene converged; to use kubectl, rerun with --duration 10m \
             --kubeconfig-out PATH, then kubectl --kubeconfig PATH get nodes -o wide"
                .to_string()
        };
    }
    format!(
        "kubectl --kubeconfig {} get nodes -o wide, until {} after the scene converged{}",
        kubeconfig.display(),
        ccm_host::runtime::duration::format(duration),
        if kept || work_kept {
            ""
        } else {
            "; that kubeconfig is deleted when the sandbox exits: --kubeconfig-out PATH keeps one"
        }
    )
}

/// The summary's events are taken once none has been written for this long.
const EVENTS_QUIET: Duration = Duration::from_secs(2);
/// The longest the summary waits for the events to settle.
const EVENTS_SETTLE_MAX: Duration = Duration::from_secs(30);
/// How the reason starts when the controllers reported no error.
const NO_ERROR_SEEN: &str = "no error seen";

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
            "{NO_ERROR_SEEN}; {} item(s) still open when the wait ended",
            progress.pending.len()
        ),
    }
}

/// Where the summary's view of a provider's cloud comes from: the fake's own record of its
/// cloud (with each load balancer's hosts) when it keeps one, else calls to the instance the
/// controllers use.
fn cloud_source(name: &str, provider: &Provider, config: Option<&[u8]>) -> CloudSource {
    if !scene::is_fake(name) {
        return CloudSource::Provider(provider.clone());
    }
    let effective: Option<Value> = config.and_then(|b| yaml_serde::from_slice(b).ok());
    let keeps_file = effective
        .as_ref()
        .and_then(|c| c.get("cloudStateFile"))
        .and_then(Value::as_bool)
        != Some(false);
    match effective
        .as_ref()
        .and_then(|c| c.get("stateDir"))
        .and_then(Value::as_str)
    {
        Some(dir) if keeps_file => CloudSource::FakeStateFile(Path::new(dir).join("cloud.json")),
        _ => CloudSource::Provider(provider.clone()),
    }
}

/// What to expect of one provider's controllers given their selection, flags and the
/// provider's capabilities.
fn provider_expectations(
    provider: &Provider,
    spec: &ProviderSpec,
    run_args: &RunArgs,
    settings: &RunSettings,
) -> ProviderExpectations {
    use ccm_host::controllers::{node, route, service};
    let caps = provider.capabilities();
    let enabled = |name: &str| settings.selection.is_enabled(name);
    let disabled = |alias: &str| format!("--controllers does not enable {alias}");
    ProviderExpectations {
        name: spec.name.clone(),
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
        policy: ClassPolicy {
            classes: spec.load_balancer_classes.clone(),
            ignore_classless: !spec.classless,
        },
        shared_addresses: provider
            .ext_capabilities()
            .contains(ccm_provider_abi::ext::ExtCapabilities::LB_SHARED_ADDRESSES),
    }
}

/// What to expect of the controllers: each provider's part, and who owns each node of the
/// scene (ccm_host::runtime::ownership with the platforms the daemon uses: `--cloud-provider-platforms`,
/// else the provider's own). A node whose providerID or platform label says another owner
/// than the cloud the scenario put it in is an input error.
fn expectations(
    scene: &Scene,
    providers: &[(Provider, CloudSource)],
    run_args: &RunArgs,
    settings: &RunSettings,
) -> anyhow::Result<Expectations> {
    let specs = &settings.providers.providers;
    let per_provider: Vec<ProviderExpectations> = providers
        .iter()
        .zip(specs)
        .map(|((provider, _), spec)| provider_expectations(provider, spec, run_args, settings))
        .collect();
    let platforms: Vec<(String, Vec<String>)> = providers
        .iter()
        .zip(specs)
        .map(|((provider, _), spec)| {
            let list = if spec.platforms.is_empty() {
                provider.platforms().to_vec()
            } else {
                spec.platforms.clone()
            };
            (spec.name.clone(), list)
        })
        .collect();
    let ownership =
        Ownership::new(&platforms, settings.providers.ownership_enforced).map_err(usage)?;
    let mut problems = Vec::new();
    let mut node_owners = Vec::with_capacity(scene.nodes.len());
    for (i, sn) in scene.nodes.iter().enumerate() {
        if !ownership.enforced() {
            node_owners.push(ExpectedOwner::Provider(0));
            continue;
        }
        let name = &sn.spec.name;
        let what = match &sn.spec.provider_id {
            Some(id) => format!("providerID {}", id.trim()),
            None => {
                let (key, value) = [
                    (
                        ccm_host::runtime::ownership::PLATFORM_LABEL,
                        &sn.spec.labels,
                    ),
                    (
                        ccm_host::runtime::ownership::PLATFORM_ANNOTATION,
                        &sn.spec.annotations,
                    ),
                ]
                .into_iter()
                .find_map(|(key, map)| map.get(key).map(|v| (key, v.as_str())))
                .unwrap_or((ccm_host::runtime::ownership::PLATFORM_LABEL, ""));
                format!("platform {key}={value}")
            }
        };
        node_owners.push(match ownership.owner(&CachedNode::from(Scene::node_object(sn))) {
            Owner::Provider(k) => {
                if let Some(c) = sn.cloud.filter(|c| *c != k) {
                    problems.push(format!(
                        "nodes[{i}] ({name}): its {what} makes it {}'s, but its machine is in {}'s cloud{}",
                        specs[k].name,
                        specs[c].name,
                        if sn.spec.provider.is_none() {
                            format!(" (the default; add provider: {})", specs[k].name)
                        } else {
                            String::new()
                        }
                    ));
                }
                ExpectedOwner::Provider(k)
            }
            Owner::Foreign => {
                if let Some(c) = &sn.spec.provider {
                    problems.push(format!(
                        "nodes[{i}] ({name}).provider: {c}, but its {what} is a platform no provider of this run owns (a foreign node, left untouched); leave provider out"
                    ));
                }
                ExpectedOwner::Foreign
            }
            Owner::Unclaimed => ExpectedOwner::Provider(sn.cloud.unwrap_or(0)),
        });
    }
    if !problems.is_empty() {
        return Err(usage(format!(
            "invalid scene ({}):\n  {}",
            scene.source,
            problems.join("\n  ")
        )));
    }
    Ok(Expectations {
        providers: per_provider,
        ownership,
        node_owners,
    })
}

async fn evaluate_now(sb: &Sandbox, client: &Client, obs: &mut Observation) -> Progress {
    match Observation::take(client).await {
        Ok(o) => *obs = o,
        Err(e) => tracing::warn!("sandbox: listing the cluster failed: {e}"),
    }
    observe::evaluate(&sb.scene, &sb.expectations, obs)
}

/// A directory holding only the selected providers' plugins (symlinks), for the daemon: the
/// default directories may hold other libraries it would log about.
fn prepare_plugin_dir(dir: &Path, plugins: &[PathBuf]) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cleaning {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    for plugin in plugins {
        let name = plugin
            .file_name()
            .context("plugin path without a file name")?;
        std::os::unix::fs::symlink(plugin, dir.join(name))
            .with_context(|| format!("linking {} into {}", plugin.display(), dir.display()))?;
    }
    Ok(())
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
            &[DaemonProvider::plain(
                "fake",
                Some(Path::new("/w/cloud-config.yaml")),
            )],
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

    #[test]
    fn several_providers_name_their_values_on_the_daemons_command_line() {
        let fake_classes = vec!["example.com/fake-lb".to_string()];
        let metal_classes = vec!["metal-lb".to_string()];
        let metal_platforms = vec!["metal".to_string(), "bm://".to_string()];
        let a = daemon_argv(
            &[],
            Path::new("/w/plugins"),
            &[
                DaemonProvider {
                    load_balancer_classes: &fake_classes,
                    ..DaemonProvider::plain("fake", Some(Path::new("/w/cloud-config-fake.yaml")))
                },
                DaemonProvider {
                    load_balancer_classes: &metal_classes,
                    platforms: &metal_platforms,
                    load_balancer_hosts: Some("all"),
                    ..DaemonProvider::plain("metal", Some(Path::new("/w/cloud-config-metal.yaml")))
                },
            ],
            Path::new("/w/kubeconfig"),
            "10.244.0.0/16",
            false,
        )
        .unwrap();
        let run = DaemonFlags::try_parse_from(&a).unwrap().run;
        assert_eq!(run.cloud_provider, "fake,metal");
        let settings = run.validate().unwrap();
        let set = &settings.providers;
        assert!(set.ownership_enforced);
        let (fake, metal) = (&set.providers[0], &set.providers[1]);
        assert_eq!(
            fake.cloud_config.as_deref(),
            Some(Path::new("/w/cloud-config-fake.yaml"))
        );
        assert_eq!(
            metal.cloud_config.as_deref(),
            Some(Path::new("/w/cloud-config-metal.yaml"))
        );
        assert_eq!(fake.load_balancer_classes, ["example.com/fake-lb"]);
        assert_eq!(metal.load_balancer_classes, ["metal-lb"]);
        assert!(fake.classless && !metal.classless);
        assert_eq!(metal.platforms, ["metal", "bm://"]);
        assert!(fake.platforms.is_empty());
        assert_eq!(
            (fake.lb_hosts, metal.lb_hosts),
            (
                ccm_host::daemon::provider_set::LbHosts::Owned,
                ccm_host::daemon::provider_set::LbHosts::All
            )
        );
    }
}
