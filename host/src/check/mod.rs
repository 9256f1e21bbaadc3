//! `ccm-host check`: the provider conformance kit (issue 8, in progress).

use clap::Args;

/// `ccm-host check` arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {}

/// Entry point of `ccm-host check`: returns the process exit code.
pub async fn main(_args: CheckArgs, _max_log_level: u8) -> anyhow::Result<i32> {
    anyhow::bail!("ccm-host check is not implemented yet")
}
