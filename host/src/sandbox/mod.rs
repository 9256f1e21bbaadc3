//! `ccm-host sandbox`: the real controllers against the in-memory API server (issue 8, in progress).

use clap::Args;

/// `ccm-host sandbox` arguments.
#[derive(Debug, Args)]
pub struct SandboxArgs {}

/// Entry point of `ccm-host sandbox`: returns the process exit code.
pub async fn main(_args: SandboxArgs, _max_log_level: u8) -> anyhow::Result<i32> {
    anyhow::bail!("ccm-host sandbox is not implemented yet")
}
