//! The `ccm-host` binary: parses the command line (`crate::cli`), sets up logging and runs the
//! command.

use std::io::IsTerminal;
use std::process::ExitCode;

mod cli;

use ccm_host::daemon::upstream_flags::FeatureGates;
use clap::error::ErrorKind;
use clap::Parser;
use cli::{Cli, Command, LogFormat, LogSettings};
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::EnvFilter;

/// Exit code of invalid flags, as upstream's.
const EXIT_USAGE: u8 = 2;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Install the tracing subscriber; returns the plugins' maximum log level.
fn init_logging(log: &LogSettings, quiet: bool) -> u8 {
    let (directives, verbosity_level) = cli::verbosity_filter(log.verbosity, quiet);
    // RUST_LOG takes precedence over -v; the plugins then log up to its most verbose directive.
    let (filter, max_level) = match EnvFilter::try_from_default_env() {
        Ok(filter) => {
            let level = cli::abi_level(filter.max_level_hint());
            (filter, level)
        }
        Err(_) => (EnvFilter::new(directives), verbosity_level),
    };
    let no_color = std::env::var_os("NO_COLOR");
    let (writer, terminal) = if log.split_stream {
        (
            BoxMakeWriter::new(
                std::io::stderr
                    .with_max_level(tracing::Level::ERROR)
                    .or_else(std::io::stdout),
            ),
            std::io::stderr().is_terminal() && std::io::stdout().is_terminal(),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match log.format {
        LogFormat::Json => builder.json().with_ansi(false).init(),
        LogFormat::Text => builder
            .with_ansi(cli::use_color(terminal, no_color.as_deref()))
            .init(),
    }
    max_level
}

/// How long the runtime may take to stop once the command is done. Provider calls run on the
/// runtime's blocking threads; one stuck in a plugin (ignoring its cancellation) would keep a
/// plain runtime drop waiting forever, so the host stops waiting after this and exits, leaving
/// the stuck threads to the process exit.
const RUNTIME_SHUTDOWN_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Run a command's future on a fresh runtime and stop the runtime within
/// [`RUNTIME_SHUTDOWN_LIMIT`], whatever plugin threads are stuck.
fn run_to_end(
    command: impl std::future::Future<Output = anyhow::Result<i32>>,
) -> anyhow::Result<i32> {
    let rt = runtime()?;
    let result = rt.block_on(command);
    rt.shutdown_timeout(RUNTIME_SHUTDOWN_LIMIT);
    // Calls stuck in plugins run on the providers' own threads (provider::pool), which the
    // process exit ends.
    let stuck = ccm_host::provider::pool::stuck_calls();
    if stuck > 0 {
        tracing::warn!(
            "exiting with {stuck} provider call(s) still running in plugin threads: abandoned (each was logged when it passed its deadline)"
        );
    }
    result
}

fn main() -> ExitCode {
    ccm_host::runtime::crash::install();
    ccm_host::runtime::malloc::tune();
    let argv = cli::normalize_args(std::env::args_os());
    // As upstream, --version is honoured before anything else (even missing required flags).
    if let Some(request) = cli::requested_version(&argv) {
        println!("{}", cli::version_text(&request));
        return ExitCode::SUCCESS;
    }
    if let Some(error) = cli::verbosity_without_number(&argv) {
        eprintln!("{error}");
        return ExitCode::from(EXIT_USAGE);
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => match e.kind() {
            ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => e.exit(),
            _ => {
                eprintln!("{}", cli::one_line_error(&e.render().to_string()));
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    // Logging is validated and applied first, as upstream; the logging feature gates are
    // `run`'s --feature-gates (its other problems are reported with the other run flags).
    let gates = match &cli.command {
        Command::Run(args) => args.feature_gates(),
        _ => FeatureGates::default(),
    };
    let log = match cli.logging.validate(&gates) {
        Ok(log) => log,
        Err(errors) => {
            for e in errors {
                eprintln!("error: {e}");
            }
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // The sandbox shows its own progress: only warnings and errors by default.
    let quiet = matches!(cli.command, Command::Sandbox(_));
    let max_level = init_logging(&log, quiet);
    if let Command::Run(args) = &cli.command {
        let mut no_effect = cli.logging.no_effect();
        no_effect.extend(args.no_effect_flags());
        if !no_effect.is_empty() {
            tracing::warn!(
                "flags accepted for compatibility with upstream that have no effect in ccm-host (see docs/flags.md): {}",
                no_effect.join(", ")
            );
        }
    }
    let result = match cli.command {
        Command::Plugins(args) => {
            ccm_host::plugin_listing::plugins(&args, max_level, &mut std::io::stdout().lock())
        }
        Command::Run(args) => {
            run_to_end(async move { Ok(ccm_host::daemon::run(*args, max_level).await) })
        }
        Command::Sandbox(args) => run_to_end(ccm_host_tools::sandbox::main(*args, max_level)),
        Command::Check(args) => run_to_end(ccm_host_tools::check::main(*args, max_level)),
        Command::NewProvider(args) => ccm_host_tools::scaffold::main(&args),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
