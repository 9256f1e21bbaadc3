//! The command line: `ccm-host <command>`.

use clap::{Args, Parser, Subcommand};

/// Kubernetes cloud-controller-manager that loads cloud providers from plugins.
#[derive(Debug, Parser)]
#[command(name = "ccm-host", version, about, disable_version_flag = true)]
pub struct Cli {
    /// Logging and the other global flags of upstream's cloud-controller-manager.
    #[command(flatten)]
    pub logging: LoggingArgs,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the cloud-controller-manager (upstream flags).
    #[command(allow_negative_numbers = true)]
    Run(Box<ccm_host::daemon::RunArgs>),
    /// List every plugin file, the providers it registered, its ABI version and capabilities,
    /// and every refused file with the reason.
    Plugins(ccm_host::plugin_listing::PluginsArgs),
    /// Run the real controllers against an in-memory API server and a demo cloud: no cluster needed.
    Sandbox(Box<ccm_host_tools::sandbox::SandboxArgs>),
    /// Conformance kit for provider authors: run a scripted suite against one provider.
    Check(Box<ccm_host_tools::check::CheckArgs>),
    /// Write a new provider plugin crate: the SDK dependency, the chosen capabilities, a sample
    /// cloud config, tests without the host, a Dockerfile and a CI script running `check`.
    NewProvider(Box<ccm_host_tools::scaffold::NewProviderArgs>),
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_log_format(value: &str) -> Result<LogFormat, String> {
    match value {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        _ => Err("unsupported log format (permitted formats: text, json)".into()),
    }
}

/// What `-v` without a number (ccm-host's old switch) gets.
const VERBOSITY_HINT: &str =
    "-v takes a number (klog verbosity) since ccm-host follows upstream's flags: \
     -v is now -v 4 (debug), -vv is -v 5 (trace)";

/// The commands, which a `-v` before them does not take as its number.
const COMMANDS: [&str; 5] = ["run", "plugins", "sandbox", "check", "new-provider"];

/// `-v`/`--v` with no number after it (the last argument, or another flag or a command
/// follows, as in old scripts' `sandbox -v --plugin-dir DIR`): the error with the migration
/// hint, where clap would only say that a value is required. Nothing after a bare `--`.
pub fn verbosity_without_number(args: &[std::ffi::OsString]) -> Option<String> {
    let mut rest = args.iter().skip(1).map(|a| a.to_str()).peekable();
    while let Some(arg) = rest.next() {
        match arg {
            Some("--") => return None,
            Some("-v" | "--v") => match rest.peek().copied().flatten() {
                None => return Some(format!("error: {VERBOSITY_HINT}")),
                Some(next)
                    if (next.starts_with('-') && next.parse::<i64>().is_err())
                        || COMMANDS.contains(&next) =>
                {
                    return Some(format!("error: {VERBOSITY_HINT}"))
                }
                Some(_) => {
                    rest.next();
                }
            },
            _ => {}
        }
    }
    None
}

/// klog's `--v`: an unsigned number below 2^31.
fn parse_verbosity(value: &str) -> Result<u32, String> {
    match value.parse::<u32>() {
        Ok(v) if v <= i32::MAX as u32 => Ok(v),
        Ok(_) => Err(format!("must be <= {}", i32::MAX)),
        Err(_) if !value.is_empty() && value.chars().all(|c| c == 'v') => {
            Err(VERBOSITY_HINT.into())
        }
        Err(_) => Err("not a number: -v/--v takes the klog verbosity, e.g. -v 2 or --v=4".into()),
    }
}

/// What `--version` asks for (upstream's `verflag`: `--version`, `--version=raw`,
/// `--version=false`, `--version=vX.Y.Z`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionRequest {
    /// `--version=false`: run normally.
    No,
    /// `--version`: print the version and exit 0.
    Print,
    /// `--version=raw`: print the detailed version and exit 0.
    Raw,
    /// `--version=vX.Y.Z`: upstream reports that version instead; no effect here.
    Override(String),
}

fn parse_version_request(value: &str) -> Result<VersionRequest, String> {
    if value == "raw" {
        return Ok(VersionRequest::Raw);
    }
    if value.starts_with('v') {
        return Ok(VersionRequest::Override(value.to_string()));
    }
    match ccm_host::daemon::upstream_flags::parse_go_bool(value) {
        Ok(true) => Ok(VersionRequest::Print),
        Ok(false) => Ok(VersionRequest::No),
        Err(_) => Err("expected true, false, raw or vX.Y.Z".into()),
    }
}

/// Upstream's logging and global flags (component-base `logs` and `verflag`), on every
/// command. `RUST_LOG`, when set, takes precedence over `-v`.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Logging and global flags (as upstream's; see docs/flags.md)")]
pub struct LoggingArgs {
    /// Log verbosity (klog levels): 0-2 info, 3-4 debug, 5 trace (ccm-host and plugins),
    /// 6-7 also debug of the client libraries (API requests), 8+ trace of everything. Default:
    /// info (sandbox: warnings). RUST_LOG overrides.
    #[arg(short = 'v', long = "v", global = true, value_name = "N", value_parser = parse_verbosity)]
    pub verbosity: Option<u32>,
    /// [no effect] klog's per-source-file verbosity (pattern=N,...); use RUST_LOG=module=level.
    #[arg(long, global = true, value_name = "pattern=N,...")]
    pub vmodule: Vec<String>,
    /// Log format: text or json (one JSON object per line).
    #[arg(long = "logging-format", alias = "log-format", global = true, value_name = "FORMAT",
          env = "CCM_LOG_FORMAT", default_value = "text", value_parser = parse_log_format)]
    pub logging_format: LogFormat,
    /// [no effect] Maximum time between log flushes (upstream 5s); every line is written at once.
    #[arg(long, global = true, value_name = "DURATION")]
    pub log_flush_frequency: Option<String>,
    /// [alpha: needs --feature-gates=LoggingAlphaOptions=true] Text format: errors to stderr,
    /// everything else to stdout.
    #[arg(long, global = true, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = ccm_host::daemon::upstream_flags::parse_go_bool, action = clap::ArgAction::Set)]
    pub log_text_split_stream: Option<bool>,
    /// [alpha, no effect] Buffer for info messages with split streams; lines are not buffered.
    #[arg(long, global = true, value_name = "QUANTITY")]
    pub log_text_info_buffer_size: Option<String>,
    /// [alpha: needs --feature-gates=LoggingAlphaOptions=true] JSON format: errors to stderr,
    /// everything else to stdout.
    #[arg(long, global = true, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = ccm_host::daemon::upstream_flags::parse_go_bool, action = clap::ArgAction::Set)]
    pub log_json_split_stream: Option<bool>,
    /// [alpha, no effect] Buffer for info messages with split streams; lines are not buffered.
    #[arg(long, global = true, value_name = "QUANTITY")]
    pub log_json_info_buffer_size: Option<String>,
    /// Print the version and exit (--version=raw: with details).
    #[arg(short = 'V', long, global = true, value_name = "true|raw", num_args = 0..=1,
          require_equals = true, default_missing_value = "true", value_parser = parse_version_request)]
    pub version: Option<VersionRequest>,
}

/// The validated logging settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// Text or JSON.
    pub format: LogFormat,
    /// `--v`, when given.
    pub verbosity: Option<u32>,
    /// Errors to stderr, everything else to stdout.
    pub split_stream: bool,
}

/// A Kubernetes quantity (`512`, `1k`, `2Ki`, `1.5M`, `1e3`): whether it is non-zero.
fn parse_quantity(value: &str) -> Result<bool, String> {
    let v = value.trim();
    let body = v.strip_prefix(['+', '-']).unwrap_or(v);
    let end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(end);
    let exponent = suffix
        .strip_prefix(['e', 'E'])
        .map(|e| e.strip_prefix(['+', '-']).unwrap_or(e));
    let suffix_ok = matches!(
        suffix,
        "" | "Ki"
            | "Mi"
            | "Gi"
            | "Ti"
            | "Pi"
            | "Ei"
            | "n"
            | "u"
            | "m"
            | "k"
            | "M"
            | "G"
            | "T"
            | "P"
            | "E"
    ) || exponent
        .is_some_and(|e| !e.is_empty() && e.chars().all(|c| c.is_ascii_digit()));
    match number.parse::<f64>() {
        Ok(n) if suffix_ok && n.is_finite() => Ok(n != 0.0),
        _ => Err(format!(
            "{value:?} is not a quantity (e.g. 512, 1k, 2Ki, 3M, 4Gi)"
        )),
    }
}

impl LoggingArgs {
    /// Validate the logging flags as upstream does (`gates`: `--feature-gates` of `run`, the
    /// defaults for the other commands); one message per problem.
    pub fn validate(
        &self,
        gates: &ccm_host::daemon::upstream_flags::FeatureGates,
    ) -> Result<LogSettings, Vec<String>> {
        use ccm_host::daemon::upstream_flags::{LOGGING_ALPHA_OPTIONS, LOGGING_BETA_OPTIONS};
        let mut errors = Vec::new();
        if let Some(f) = &self.log_flush_frequency {
            match ccm_host::runtime::duration::parse(f) {
                Ok(d) if d.is_zero() => errors.push(format!(
                    "--log-flush-frequency must be greater than zero, got {f:?}"
                )),
                Ok(_) => {}
                Err(e) => errors.push(format!("--log-flush-frequency: {e}")),
            }
        }
        let mut vmodule_given = false;
        for item in self.vmodule.iter().flat_map(|v| v.split(',')) {
            if item.is_empty() {
                continue;
            }
            vmodule_given = true;
            let parts: Vec<&str> = item.split('=').collect();
            match parts[..] {
                [pattern, level] if !pattern.is_empty() && !level.is_empty() => {
                    if !matches!(level.parse::<u32>(), Ok(l) if l <= i32::MAX as u32) {
                        errors.push(format!(
                            "--vmodule: parsing verbosity in {item:?}: not a number below 2^31"
                        ));
                    }
                }
                _ => errors.push(format!(
                    "--vmodule: {item:?} does not have the pattern=N format"
                )),
            }
        }
        let format = self.logging_format;
        if format == LogFormat::Json {
            if !gates.enabled(LOGGING_BETA_OPTIONS) {
                errors.push(format!(
                    "--logging-format: log format json is disabled, see the {LOGGING_BETA_OPTIONS} feature gate"
                ));
            }
            if vmodule_given {
                errors.push("--vmodule is only supported for the text log format".into());
            }
        }
        let alpha = gates.enabled(LOGGING_ALPHA_OPTIONS);
        for (flag, split, buffer) in [
            (
                "log-text",
                self.log_text_split_stream,
                &self.log_text_info_buffer_size,
            ),
            (
                "log-json",
                self.log_json_split_stream,
                &self.log_json_info_buffer_size,
            ),
        ] {
            if split == Some(true) && !alpha {
                errors.push(format!(
                    "--{flag}-split-stream: feature {LOGGING_ALPHA_OPTIONS} is disabled (--feature-gates={LOGGING_ALPHA_OPTIONS}=true)"
                ));
            }
            if let Some(size) = buffer {
                match parse_quantity(size) {
                    Ok(true) if !alpha => errors.push(format!(
                        "--{flag}-info-buffer-size: feature {LOGGING_ALPHA_OPTIONS} is disabled (--feature-gates={LOGGING_ALPHA_OPTIONS}=true)"
                    )),
                    Ok(_) => {}
                    Err(e) => errors.push(format!("--{flag}-info-buffer-size: {e}")),
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let split_stream = match format {
            LogFormat::Text => self.log_text_split_stream,
            LogFormat::Json => self.log_json_split_stream,
        } == Some(true);
        Ok(LogSettings {
            format,
            verbosity: self.verbosity,
            split_stream,
        })
    }

    /// The logging flags given that have no effect here (for the warning at start).
    pub fn no_effect(&self) -> Vec<String> {
        let mut names = Vec::new();
        if self.vmodule.iter().any(|v| !v.is_empty()) {
            names.push("--vmodule".to_string());
        }
        if self.log_flush_frequency.is_some() {
            names.push("--log-flush-frequency".into());
        }
        for (flag, size) in [
            (
                "--log-text-info-buffer-size",
                &self.log_text_info_buffer_size,
            ),
            (
                "--log-json-info-buffer-size",
                &self.log_json_info_buffer_size,
            ),
        ] {
            if size
                .as_deref()
                .is_some_and(|s| parse_quantity(s) == Ok(true))
            {
                names.push(flag.into());
            }
        }
        if let Some(VersionRequest::Override(v)) = &self.version {
            names.push(format!("--version={v}"));
        }
        names
    }
}

/// The tracing filter directives and the plugins' maximum level
/// (`ccm_provider_abi::abi::log_level`) for klog verbosity `v` (`None`: not given; `quiet`:
/// the command shows only warnings by default, as the sandbox).
///
/// klog's conventions: 0-2 steady-state information, 3 extended information about changes,
/// 4 debug, 5 trace, 6 requested resources, 7 HTTP headers, 8 HTTP bodies. The client
/// libraries (kube, hyper, rustls) stay at info below 6, as client-go logs requests from 6.
pub fn verbosity_filter(v: Option<u32>, quiet: bool) -> (&'static str, u8) {
    use ccm_provider_abi::abi::log_level;
    // kube's HTTP layer logs `failed with error client error (Connect)` at ERROR for every
    // request without an answer, naming neither the server nor the reason: the error the
    // caller logs says both (`kube_clients::TransportError`), so below 6 that line is off.
    match v {
        None if quiet => ("warn,kube_client::client::builder=off", log_level::WARN),
        None | Some(0..=2) => ("info,kube_client::client::builder=off", log_level::INFO),
        Some(3..=4) => (
            "info,ccm_host=debug,ccm_provider_abi=debug,plugin=debug,kube_client::client::builder=off",
            log_level::DEBUG,
        ),
        Some(5) => (
            "info,ccm_host=trace,ccm_provider_abi=trace,plugin=trace,kube_client::client::builder=off",
            log_level::TRACE,
        ),
        Some(6..=7) => (
            "debug,ccm_host=trace,ccm_provider_abi=trace,plugin=trace",
            log_level::TRACE,
        ),
        Some(_) => ("trace", log_level::TRACE),
    }
}

/// The plugins' maximum level for a `RUST_LOG` filter's most verbose directive.
pub fn abi_level(hint: Option<tracing_subscriber::filter::LevelFilter>) -> u8 {
    use ccm_provider_abi::abi::log_level;
    use tracing_subscriber::filter::LevelFilter;
    match hint {
        Some(LevelFilter::OFF) => log_level::OFF,
        Some(LevelFilter::ERROR) => log_level::ERROR,
        Some(LevelFilter::WARN) => log_level::WARN,
        Some(LevelFilter::INFO) => log_level::INFO,
        Some(LevelFilter::DEBUG) => log_level::DEBUG,
        _ => log_level::TRACE,
    }
}

/// Colour only on a terminal, and never with `NO_COLOR` set to a non-empty value.
pub fn use_color(is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Upstream's flag-name normalisation (component-base's `WordSepNormalizeFunc`):
/// `--leader_elect` is `--leader-elect`. Only flag names are rewritten (not values), and
/// nothing after a bare `--`.
pub fn normalize_args(
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut rest = false;
    args.into_iter()
        .map(|arg| {
            if rest {
                return arg;
            }
            let Some(s) = arg.to_str() else {
                return arg;
            };
            if s == "--" {
                rest = true;
                return arg;
            }
            match s.strip_prefix("--") {
                Some(flag) if flag.contains('_') => {
                    let (name, value) = match flag.split_once('=') {
                        Some((n, v)) => (n, Some(v)),
                        None => (flag, None),
                    };
                    let name = name.replace('_', "-");
                    match value {
                        Some(v) => format!("--{name}={v}").into(),
                        None => format!("--{name}").into(),
                    }
                }
                _ => arg,
            }
        })
        .collect()
}

/// `--version` (or `-V`) anywhere before a bare `--`, as upstream checks it before anything
/// else: what to print, if anything.
pub fn requested_version(args: &[std::ffi::OsString]) -> Option<VersionRequest> {
    let mut request = None;
    for arg in args.iter().skip(1) {
        let Some(s) = arg.to_str() else { continue };
        if s == "--" {
            break;
        }
        let value = match s {
            "--version" | "-V" => "true",
            _ => match s
                .strip_prefix("--version=")
                .or_else(|| s.strip_prefix("-V="))
            {
                Some(v) => v,
                None => continue,
            },
        };
        if let Ok(r) = parse_version_request(value) {
            request = Some(r);
        }
    }
    request.filter(|r| matches!(r, VersionRequest::Print | VersionRequest::Raw))
}

/// The text `--version` prints (`raw`: with the plugin ABI version and the build target).
pub fn version_text(request: &VersionRequest) -> String {
    let version = env!("CARGO_PKG_VERSION");
    match request {
        VersionRequest::Raw => format!(
            "ccm-host {version} (ccm-provider-abi {}, {}-{})",
            ccm_provider_abi::ABI_VERSION,
            std::env::consts::ARCH,
            std::env::consts::OS
        ),
        _ => format!("ccm-host {version}"),
    }
}

/// A command-line error as one line: clap's message with its hints, without the usage block.
pub fn one_line_error(rendered: &str) -> String {
    let mut line = String::new();
    for part in rendered
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
    {
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    line
}

#[cfg(test)]
mod tests {
    use std::ffi::{OsStr, OsString};

    use ccm_provider_abi::abi::log_level;
    use clap::CommandFactory;

    use super::*;
    use ccm_host::daemon::upstream_flags::FeatureGates;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        let mut full = vec!["ccm-host"];
        full.extend_from_slice(args);
        Cli::try_parse_from(full)
    }

    fn gates(value: &str) -> FeatureGates {
        FeatureGates::parse(&[value.to_string()]).unwrap()
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn verbosity_takes_upstreams_forms_on_every_command() {
        for args in [
            &["run", "--plugin-dir=/p", "--v=4"][..],
            &["run", "--plugin-dir=/p", "--v", "4"],
            &["run", "--plugin-dir=/p", "-v", "4"],
            &["run", "--plugin-dir=/p", "-v4"],
            &["-v", "4", "run", "--plugin-dir=/p"],
            &["plugins", "--plugin-dir=/p", "-v", "4"],
            &["check", "--plugin-dir=/p", "--cloud-provider=fake", "--v=4"],
            &["sandbox", "-v", "4"],
        ] {
            let cli = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            assert_eq!(cli.logging.verbosity, Some(4), "{args:?}");
        }
        assert_eq!(
            parse(&["plugins", "--plugin-dir=/p"])
                .unwrap()
                .logging
                .verbosity,
            None
        );
        let err = parse(&["plugins", "--plugin-dir=/p", "-vv"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("-v is now -v 4 (debug), -vv is -v 5 (trace)"),
            "{err}"
        );
        assert!(parse(&["plugins", "--plugin-dir=/p", "--v=abc"]).is_err());
        assert!(parse(&["plugins", "--plugin-dir=/p", "--v=-1"]).is_err());
        assert!(parse(&["plugins", "--plugin-dir=/p", "--v=2147483648"]).is_err());
        assert!(parse(&["plugins", "--plugin-dir=/p", "--v=2147483647"]).is_ok());
    }

    #[test]
    fn run_help_shows_upstreams_flags_apart_from_the_additions() {
        let mut cmd = Cli::command();
        let help = cmd
            .find_subcommand_mut("run")
            .unwrap()
            .render_long_help()
            .to_string();
        let at = |text: &str| {
            help.find(text)
                .unwrap_or_else(|| panic!("{text:?} not in run --help:\n{help}"))
        };
        let upstream = at("\nUpstream cloud-controller-manager flags:\n");
        let additions = at("\nccm-host additions (beyond upstream):\n");
        let compat = at("\nUpstream flags accepted for compatibility");
        let plugins = at("\nPlugins (ccm-host):\n");
        // Upstream's own flags under their heading, the additions under theirs.
        assert!(
            upstream < at("--cloud-provider <CLOUD_PROVIDER>") && at("--cluster-cidr") < additions
        );
        for added in [
            "--provider-call-timeout",
            "--load-balancer-class",
            "--cloud-api-qps",
        ] {
            let i = at(&format!("      {added} "));
            assert!(additions < i && i < compat, "{added} under the additions");
        }
        assert!(plugins < at("--plugin-dir <PLUGIN_DIRS>") && at("--plugin-dir") < upstream);
        assert!(
            help.contains("[default: /usr/lib/ccm-host/plugins]"),
            "{help}"
        );
        assert!(
            !help.contains("[default: \"\"]\n\n      --cloud-config"),
            "{help}"
        );
        let cloud_provider = &help[at("--cloud-provider <CLOUD_PROVIDER>")..at("--cloud-config <")];
        assert!(!cloud_provider.contains("[default"), "{cloud_provider}");
    }

    #[test]
    fn a_v_without_a_number_gets_the_migration_hint() {
        let args = |a: &[&str]| -> Vec<OsString> {
            std::iter::once("ccm-host")
                .chain(a.iter().copied())
                .map(OsString::from)
                .collect()
        };
        let hint = "error: -v takes a number (klog verbosity) since ccm-host follows upstream's flags: -v is now -v 4 (debug), -vv is -v 5 (trace)";
        for a in [
            &["sandbox", "-v", "--plugin-dir", "/p"][..],
            &["sandbox", "-v"],
            &["-v", "sandbox"],
            &["run", "--v", "--cloud-provider=x"],
        ] {
            assert_eq!(
                verbosity_without_number(&args(a)).as_deref(),
                Some(hint),
                "{a:?}"
            );
        }
        for a in [
            &["sandbox", "-v", "2", "--plugin-dir", "/p"][..],
            &["sandbox", "-v2"],
            &["sandbox", "--v=2"],
            &["sandbox", "--", "-v"],
            &["run", "-v", "-1"],
        ] {
            assert_eq!(verbosity_without_number(&args(a)), None, "{a:?}");
        }
    }

    #[test]
    fn negative_values_are_values_for_run_whether_separate_or_not() {
        for a in [
            &["run", "--kube-api-qps", "-1"][..],
            &["run", "--kube-api-qps=-1"],
        ] {
            let cli = parse(a).unwrap_or_else(|e| panic!("{a:?}: {e}"));
            let Command::Run(run) = cli.command else {
                panic!("not run")
            };
            assert_eq!(run.kube_api_qps, -1.0);
            let errors = run.validate().unwrap_err();
            assert!(
                errors.iter().any(|e| e.starts_with("--kube-api-qps")),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn klog_levels_map_to_tracing_directives_and_the_plugin_level() {
        let quiet_http = ",kube_client::client::builder=off";
        assert_eq!(
            verbosity_filter(None, false),
            (&*format!("info{quiet_http}"), log_level::INFO)
        );
        assert_eq!(
            verbosity_filter(None, true),
            (&*format!("warn{quiet_http}"), log_level::WARN)
        );
        assert_eq!(
            verbosity_filter(Some(0), true),
            (&*format!("info{quiet_http}"), log_level::INFO)
        );
        assert_eq!(
            verbosity_filter(Some(2), false),
            (&*format!("info{quiet_http}"), log_level::INFO)
        );
        for v in [3, 4] {
            let (directives, level) = verbosity_filter(Some(v), false);
            assert_eq!(level, log_level::DEBUG);
            assert!(directives.starts_with("info,") && directives.contains("ccm_host=debug"));
            assert!(directives.contains("plugin=debug"));
        }
        assert_eq!(verbosity_filter(Some(5), false).1, log_level::TRACE);
        assert!(verbosity_filter(Some(6), false).0.starts_with("debug,"));
        assert_eq!(
            verbosity_filter(Some(9), false),
            ("trace", log_level::TRACE)
        );
        for v in 0..12 {
            // Every mapping is a valid filter.
            tracing_subscriber::EnvFilter::try_new(verbosity_filter(Some(v), false).0).unwrap();
        }
        use tracing_subscriber::filter::LevelFilter;
        assert_eq!(abi_level(Some(LevelFilter::DEBUG)), log_level::DEBUG);
        assert_eq!(abi_level(Some(LevelFilter::OFF)), log_level::OFF);
        assert_eq!(abi_level(None), log_level::TRACE);
    }

    #[test]
    fn logging_format_with_the_old_name_as_alias() {
        let cli = parse(&["plugins", "--plugin-dir=/p", "--logging-format=json"]).unwrap();
        assert_eq!(cli.logging.logging_format, LogFormat::Json);
        let cli = parse(&["plugins", "--plugin-dir=/p", "--log-format", "json"]).unwrap();
        assert_eq!(cli.logging.logging_format, LogFormat::Json);
        let cli = parse(&["plugins", "--plugin-dir=/p"]).unwrap();
        assert_eq!(cli.logging.logging_format, LogFormat::Text);
        let err = parse(&["plugins", "--plugin-dir=/p", "--logging-format=xml"]).unwrap_err();
        assert_eq!(
            one_line_error(&err.render().to_string()),
            "error: invalid value 'xml' for '--logging-format <FORMAT>': unsupported log format (permitted formats: text, json)"
        );
    }

    #[test]
    fn logging_flags_are_validated_as_upstream() {
        let logging = |args: &[&str]| {
            let mut full = vec!["plugins", "--plugin-dir=/p"];
            full.extend_from_slice(args);
            parse(&full).unwrap().logging
        };
        let defaults = FeatureGates::default();
        assert_eq!(
            logging(&["--v=3"]).validate(&defaults),
            Ok(LogSettings {
                format: LogFormat::Text,
                verbosity: Some(3),
                split_stream: false
            })
        );
        assert_eq!(
            logging(&[
                "--log-flush-frequency=0s",
                "--vmodule=foo=2,bar,=3,baz=x",
                "--logging-format=json",
                "--log-json-split-stream",
                "--log-text-info-buffer-size=1Mi",
                "--log-json-info-buffer-size=lots",
            ])
            .validate(&defaults)
            .unwrap_err(),
            [
                "--log-flush-frequency must be greater than zero, got \"0s\"",
                "--vmodule: \"bar\" does not have the pattern=N format",
                "--vmodule: \"=3\" does not have the pattern=N format",
                "--vmodule: parsing verbosity in \"baz=x\": not a number below 2^31",
                "--vmodule is only supported for the text log format",
                "--log-text-info-buffer-size: feature LoggingAlphaOptions is disabled (--feature-gates=LoggingAlphaOptions=true)",
                "--log-json-split-stream: feature LoggingAlphaOptions is disabled (--feature-gates=LoggingAlphaOptions=true)",
                "--log-json-info-buffer-size: \"lots\" is not a quantity (e.g. 512, 1k, 2Ki, 3M, 4Gi)",
            ]
        );
        assert_eq!(
            logging(&["--logging-format=json"])
                .validate(&gates("LoggingBetaOptions=false"))
                .unwrap_err(),
            ["--logging-format: log format json is disabled, see the LoggingBetaOptions feature gate"]
        );
        let split = logging(&["--log-text-split-stream", "--log-text-info-buffer-size=0"])
            .validate(&gates("LoggingAlphaOptions=true"))
            .unwrap();
        assert!(split.split_stream);
        let split_json_only = logging(&["--log-json-split-stream"])
            .validate(&gates("AllAlpha=true"))
            .unwrap();
        assert!(!split_json_only.split_stream, "the text format is in use");
        assert_eq!(
            logging(&[
                "--vmodule=foo=2",
                "--log-flush-frequency=5s",
                "--log-text-info-buffer-size=0",
                "--version=v1.36.0"
            ])
            .no_effect(),
            ["--vmodule", "--log-flush-frequency", "--version=v1.36.0"]
        );
    }

    #[test]
    fn quantities() {
        for (q, nonzero) in [
            ("0", false),
            ("512", true),
            ("1k", true),
            ("2Ki", true),
            ("1.5M", true),
            ("1e3", true),
            ("0Mi", false),
        ] {
            assert_eq!(parse_quantity(q), Ok(nonzero), "{q}");
        }
        for q in ["", "Ki", "1K", "1Q", "1e", "x"] {
            assert!(parse_quantity(q).is_err(), "{q}");
        }
    }

    #[test]
    fn version_is_honoured_before_everything_else() {
        let args = |a: &[&str]| -> Vec<OsString> {
            std::iter::once("ccm-host")
                .chain(a.iter().copied())
                .map(OsString::from)
                .collect()
        };
        assert_eq!(
            requested_version(&args(&["--version"])),
            Some(VersionRequest::Print)
        );
        assert_eq!(
            requested_version(&args(&["run", "--cloud-provider=x", "--version"])),
            Some(VersionRequest::Print)
        );
        assert_eq!(
            requested_version(&args(&["-V"])),
            Some(VersionRequest::Print)
        );
        assert_eq!(
            requested_version(&args(&["--version=raw"])),
            Some(VersionRequest::Raw)
        );
        assert_eq!(requested_version(&args(&["--version=false"])), None);
        assert_eq!(requested_version(&args(&["--version=v1.2.3"])), None);
        assert_eq!(
            requested_version(&args(&["sandbox", "--", "--version"])),
            None
        );
        assert!(version_text(&VersionRequest::Print).starts_with("ccm-host "));
        // --version=false runs normally; a bad value is a flag error.
        let cli = parse(&["plugins", "--plugin-dir=/p", "--version=false"]).unwrap();
        assert_eq!(cli.logging.version, Some(VersionRequest::No));
        assert!(parse(&["plugins", "--plugin-dir=/p", "--version=maybe"]).is_err());
    }

    #[test]
    fn flag_names_are_normalised_like_upstream() {
        let norm = |a: &[&str]| -> Vec<String> {
            normalize_args(a.iter().map(OsString::from))
                .into_iter()
                .map(|s| s.into_string().unwrap())
                .collect()
        };
        assert_eq!(
            norm(&[
                "ccm-host",
                "run",
                "--leader_elect=false",
                "--cluster_name",
                "my_cluster",
                "--feature_gates=A_B=true"
            ]),
            [
                "ccm-host",
                "run",
                "--leader-elect=false",
                "--cluster-name",
                "my_cluster",
                "--feature-gates=A_B=true"
            ]
        );
        assert_eq!(
            norm(&["ccm-host", "sandbox", "--", "--x_y"]),
            ["ccm-host", "sandbox", "--", "--x_y"]
        );
    }

    #[test]
    fn errors_are_one_line() {
        let rendered = "error: unexpected argument '--bogus' found\n\n  tip: to pass '--bogus' as a value, use '-- --bogus'\n\nUsage: ccm-host run [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_error(rendered),
            "error: unexpected argument '--bogus' found; tip: to pass '--bogus' as a value, use '-- --bogus'"
        );
        let rendered = "error: the following required arguments were not provided:\n  --plugin-dir <PLUGIN_DIRS>\n\nUsage: ccm-host run --plugin-dir <PLUGIN_DIRS>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_error(rendered),
            "error: the following required arguments were not provided: --plugin-dir <PLUGIN_DIRS>"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_color(true, None));
        assert!(
            use_color(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!use_color(true, Some(OsStr::new("1"))));
        assert!(!use_color(false, None));
    }
}
