use std::process::ExitCode;

use ccm_host::cli::{self, Cli, Command, LogFormat};
use ccm_provider_abi::abi::log_level;
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn main() -> ExitCode {
    ccm_host::malloc::tune();
    let cli = Cli::parse();
    // The sandbox shows its own progress: only warnings and errors by default.
    let quiet = matches!(cli.command, Command::Sandbox(_));
    let (filter, max_level) = match cli.verbose {
        0 if quiet => ("warn", log_level::WARN),
        0 => ("info", log_level::INFO),
        1 => ("debug", log_level::DEBUG),
        _ => ("trace", log_level::TRACE),
    };
    let env_filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    let result = match cli.command {
        Command::Plugins(args) => cli::plugins(&args, max_level, &mut std::io::stdout().lock()),
        Command::Run(args) => {
            runtime().map(|rt| rt.block_on(ccm_host::daemon::run(*args, max_level)))
        }
        Command::Sandbox(args) => {
            runtime().and_then(|rt| rt.block_on(ccm_host::sandbox::main(*args, max_level)))
        }
        Command::Check(args) => {
            runtime().and_then(|rt| rt.block_on(ccm_host::check::main(*args, max_level)))
        }
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
