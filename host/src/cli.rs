//! The command line: `ccm-host <command>`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;

use crate::plugin::{LoaderOptions, PluginRegistry};
use crate::provider::{Capabilities, ProviderOptions};

/// Kubernetes cloud-controller-manager that loads cloud providers from plugins.
#[derive(Debug, Parser)]
#[command(name = "ccm-host", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "CCM_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Verbosity: -v info, -vv debug, -vvv trace (RUST_LOG overrides).
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the cloud-controller-manager (upstream flags).
    Run(Box<crate::daemon::RunArgs>),
    /// List every plugin file, the providers it registered, its ABI version and capabilities,
    /// and every refused file with the reason.
    Plugins(PluginsArgs),
    /// Run the real controllers against an in-memory API server and a demo cloud: no cluster needed.
    Sandbox(Box<crate::sandbox::SandboxArgs>),
    /// Conformance kit for provider authors: run a scripted suite against one provider.
    Check(Box<crate::check::CheckArgs>),
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where plugins come from (shared by every command that loads them).
#[derive(Debug, Clone, Args)]
pub struct PluginDirArgs {
    /// Directory of provider plugin `.so` files (repeatable; every `*.so` is loaded, sorted).
    #[arg(
        long = "plugin-dir",
        env = "CCM_PLUGIN_DIR",
        value_delimiter = ':',
        required = true
    )]
    pub plugin_dirs: Vec<PathBuf>,
    /// Load plugin files or directories writable by group/others or owned by another user.
    #[arg(long)]
    pub allow_insecure_plugins: bool,
}

impl PluginDirArgs {
    /// Loader options for these arguments at the given host log level.
    pub fn loader_options(&self, max_log_level: u8) -> LoaderOptions {
        LoaderOptions {
            allow_insecure: self.allow_insecure_plugins,
            max_log_level,
        }
    }
}

/// `ccm-host plugins`.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    #[command(flatten)]
    pub plugins: PluginDirArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Output format of listings.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// A table.
    Text,
    /// JSON.
    Json,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PluginListing {
    plugins: Vec<PluginEntry>,
    refused: Vec<crate::plugin::RefusedPlugin>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct PluginEntry {
    path: PathBuf,
    plugin_name: String,
    plugin_version: String,
    abi_version: String,
    providers: Vec<ProviderEntry>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ProviderEntry {
    name: String,
    provider_name: Option<String>,
    capabilities: Option<Capabilities>,
    /// Why the capabilities are unknown (the factory needs a cloud config, or failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `ccm-host plugins`: returns the process exit code.
pub fn plugins(args: &PluginsArgs, max_log_level: u8, out: &mut dyn Write) -> anyhow::Result<i32> {
    let registry = match PluginRegistry::load_dirs(
        &args.plugins.plugin_dirs,
        &args.plugins.loader_options(max_log_level),
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    // Capabilities are only known once a provider exists: build each with no cloud config.
    let options = ProviderOptions {
        call_timeout: Duration::from_secs(10),
        ..ProviderOptions::default()
    };
    let listing = PluginListing {
        plugins: registry
            .plugins()
            .iter()
            .map(|p| PluginEntry {
                path: p.path.clone(),
                plugin_name: p.plugin_name.clone(),
                plugin_version: p.plugin_version.clone(),
                abi_version: p.abi_version.clone(),
                providers: p
                    .providers
                    .iter()
                    .map(|name| match registry.create(name, None, &options) {
                        Ok(provider) => ProviderEntry {
                            name: name.clone(),
                            provider_name: Some(provider.provider_name().to_string()),
                            capabilities: Some(provider.capabilities()),
                            error: None,
                        },
                        Err(e) => ProviderEntry {
                            name: name.clone(),
                            provider_name: None,
                            capabilities: None,
                            error: Some(e.to_string()),
                        },
                    })
                    .collect(),
            })
            .collect(),
        refused: registry.refused().to_vec(),
    };
    match args.output {
        OutputFormat::Json => {
            serde_json::to_writer_pretty(&mut *out, &listing)?;
            writeln!(out)?;
        }
        OutputFormat::Text => write_text(&listing, out)?,
    }
    Ok(0)
}

fn write_text(listing: &PluginListing, out: &mut dyn Write) -> std::io::Result<()> {
    if listing.plugins.is_empty() {
        writeln!(out, "no plugins loaded")?;
    }
    for p in &listing.plugins {
        writeln!(
            out,
            "{}\n  plugin {} {} (ccm-provider-abi {})",
            p.path.display(),
            p.plugin_name,
            p.plugin_version,
            p.abi_version
        )?;
        for prov in &p.providers {
            match (&prov.capabilities, &prov.error) {
                (Some(caps), _) => writeln!(
                    out,
                    "  provider {:<12} ProviderName={} capabilities: {}",
                    prov.name,
                    prov.provider_name.as_deref().unwrap_or(""),
                    caps.names().join(", ")
                )?,
                (None, err) => writeln!(
                    out,
                    "  provider {:<12} capabilities unknown without a cloud config: {}",
                    prov.name,
                    err.as_deref().unwrap_or("")
                )?,
            }
        }
    }
    if !listing.refused.is_empty() {
        writeln!(out, "refused:")?;
        for r in &listing.refused {
            writeln!(out, "  {r}")?;
        }
    }
    Ok(())
}
