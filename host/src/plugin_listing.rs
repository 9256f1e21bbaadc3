//! `ccm-host plugins`: every plugin file of the plugin directories, the providers each one
//! registered with their capabilities and platforms, and every refused file with the reason.
//! The operator's first look at what a host would load; `run` loads the same way.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::args::{OutputFormat, PluginDirArgs};
use crate::plugin::PluginRegistry;
use crate::provider::{Capabilities, ProviderOptions};

/// `ccm-host plugins`.
#[derive(Debug, Args)]
pub struct PluginsArgs {
    /// Where the plugins come from.
    #[command(flatten)]
    pub plugins: PluginDirArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Cloud config file handed to the providers' factories (as `run --cloud-config`), so that
    /// the capabilities of a provider that needs a config can be shown.
    #[arg(long, value_name = "FILE")]
    pub cloud_config: Option<PathBuf>,
    /// With --cloud-config: hand it to this provider only (the others are built without one).
    #[arg(long, value_name = "NAME", requires = "cloud_config")]
    pub cloud_provider: Option<String>,
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
    /// The platforms (providerID prefixes, KEP-5778) whose nodes it owns in a hybrid cluster.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    platforms: Vec<String>,
    /// Whether the factory got the --cloud-config.
    with_cloud_config: bool,
    /// Why the capabilities are unknown (the factory needs a cloud config, or failed).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// `ccm-host plugins`: returns the process exit code.
pub fn plugins(args: &PluginsArgs, max_log_level: u8, out: &mut dyn Write) -> anyhow::Result<i32> {
    // The listing names every loaded and refused file: no log line per file besides.
    let registry = match PluginRegistry::load_dirs_quietly(
        &args.plugins.plugin_dirs,
        &args.plugins.loader_options(max_log_level),
    ) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(2);
        }
    };
    // Capabilities are only known once a provider exists: build each, with --cloud-config when
    // given (to --cloud-provider's only, when named).
    let config = match &args.cloud_config {
        None => None,
        Some(path) => match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) => {
                eprintln!("error: --cloud-config {}: {e}", path.display());
                return Ok(2);
            }
        },
    };
    if let Some(name) = &args.cloud_provider {
        if registry.get(name).is_none() {
            eprintln!("error: --cloud-provider {name:?}: no plugin in the directory registered it");
            return Ok(2);
        }
    }
    let config_for = |name: &str| {
        config
            .as_deref()
            .filter(|_| args.cloud_provider.as_deref().is_none_or(|p| p == name))
    };
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
                    .map(|name| {
                        let config = config_for(name);
                        let with_cloud_config = config.is_some();
                        match registry.create(name, config, &options) {
                            Ok(provider) => ProviderEntry {
                                name: name.clone(),
                                provider_name: Some(provider.provider_name().to_string()),
                                capabilities: Some(provider.capabilities()),
                                platforms: provider.platforms().to_vec(),
                                with_cloud_config,
                                error: None,
                            },
                            Err(e) => ProviderEntry {
                                name: name.clone(),
                                provider_name: None,
                                capabilities: None,
                                platforms: Vec::new(),
                                with_cloud_config,
                                error: Some(e.to_string()),
                            },
                        }
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
    // Nothing usable in the directories: a failure (for scripts and CI), said on stderr too.
    if listing.plugins.is_empty() {
        eprintln!(
            "error: no plugin loaded from {}{}",
            args.plugins
                .plugin_dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
            if listing.refused.is_empty() {
                " (no *.so file there)".to_string()
            } else {
                format!(
                    " ({} file(s) refused, each listed with the reason)",
                    listing.refused.len()
                )
            }
        );
        return Ok(EXIT_NO_PLUGIN);
    }
    Ok(0)
}

/// `ccm-host plugins`' exit code when no plugin loaded.
pub const EXIT_NO_PLUGIN: i32 = 1;

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
                    "  provider {:<12} ProviderName={} platforms: {} capabilities: {}",
                    prov.name,
                    prov.provider_name.as_deref().unwrap_or(""),
                    prov.platforms.join(","),
                    caps.names().join(", ")
                )?,
                (None, err) => writeln!(
                    out,
                    "  provider {:<12} capabilities unknown {}: {}",
                    prov.name,
                    if prov.with_cloud_config {
                        "(its factory refused --cloud-config)"
                    } else {
                        "without a cloud config (give one with --cloud-config)"
                    },
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
