//! Argument groups that several commands share (`run`, `plugins`, `check`), so that the
//! commands do not import each other or the top-level command line (`cli`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::plugin::LoaderOptions;

/// The plugin directory of the image (`deploy/Dockerfile`): the default of `--plugin-dir`.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/lib/ccm-host/plugins";

/// The help heading of the plugin flags.
const PLUGIN_HEADING: &str = "Plugins (ccm-host)";

/// Where plugins come from (shared by every command that loads them).
#[derive(Debug, Clone, Args)]
pub struct PluginDirArgs {
    /// Directory of provider plugin `.so` files (repeatable; every `*.so` is loaded, sorted).
    #[arg(
        long = "plugin-dir",
        env = "CCM_PLUGIN_DIR",
        value_delimiter = ':',
        default_value = DEFAULT_PLUGIN_DIR,
        help_heading = PLUGIN_HEADING
    )]
    pub plugin_dirs: Vec<PathBuf>,
    /// Load plugin files or directories writable by group/others or owned by another user.
    #[arg(long, help_heading = PLUGIN_HEADING)]
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

/// Output format of listings.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OutputFormat {
    /// A table.
    Text,
    /// JSON.
    Json,
}
