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

/// The largest `--cloud-config` or `--scenario` file read (16 MiB): a cloud config is a few KB,
/// a fake cloud of 5,000 instances about 500 KB; a 100 MB file cost about 240 MB of memory to
/// parse, near a 256 Mi container limit.
pub const MAX_INPUT_FILE: u64 = 16 * 1024 * 1024;

/// Read an input file of at most [`MAX_INPUT_FILE`] bytes; a larger one is an error saying so
/// (without reading more than one byte past the limit).
pub fn read_input_file(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_INPUT_FILE + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > MAX_INPUT_FILE {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB, the most accepted",
                MAX_INPUT_FILE / (1024 * 1024)
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod input_file_tests {
    use super::*;

    #[test]
    fn input_files_over_the_limit_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, "stateDir: /x\n").unwrap();
        assert_eq!(read_input_file(&small).unwrap(), b"stateDir: /x\n");
        let big = dir.path().join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_INPUT_FILE + 1).unwrap();
        let e = read_input_file(&big).unwrap_err();
        assert_eq!(e.to_string(), "larger than 16 MiB, the most accepted");
    }
}
