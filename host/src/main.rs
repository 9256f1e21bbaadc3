use std::process::ExitCode;

use ccm_host::cli::{self, Cli, Command, LogFormat};
use ccm_provider_abi::abi::log_level;
use clap::Parser;
use tracing_subscriber::EnvFilter;

fn run_daemon(args: ccm_host::daemon::RunArgs, max_level: u8) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(ccm_host::daemon::run(args, max_level)))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (filter, max_level) = match cli.verbose {
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
        Command::Run(args) => run_daemon(*args, max_level),
    };
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
