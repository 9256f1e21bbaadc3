//! Shared helpers for the integration tests: where cargo put the plugin `.so` files, and plugin
//! directories assembled from them.

pub mod harness;
pub mod metal;

use std::path::{Path, PathBuf};

pub use ccm_test_support::built_plugin;

/// A fresh plugin directory holding copies of built plugins under chosen file names.
pub struct PluginDir {
    dir: tempfile::TempDir,
}

impl PluginDir {
    /// An empty directory (mode 0700, owned by the current user).
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("temp dir"),
        }
    }

    /// Copy the built plugin `lib_name` into the directory as `file_name`.
    pub fn with(self, lib_name: &str, file_name: &str) -> Self {
        self.add(lib_name, file_name);
        self
    }

    /// Copy the built plugin `lib_name` into the directory as `file_name`; returns its path.
    pub fn add(&self, lib_name: &str, file_name: &str) -> PathBuf {
        let dest = self.dir.path().join(file_name);
        std::fs::copy(built_plugin(lib_name), &dest).expect("copy plugin");
        dest
    }

    /// Write arbitrary bytes as `file_name`; returns its path.
    pub fn write(&self, file_name: &str, bytes: &[u8]) -> PathBuf {
        let dest = self.dir.path().join(file_name);
        std::fs::write(&dest, bytes).expect("write file");
        dest
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Default for PluginDir {
    fn default() -> Self {
        Self::new()
    }
}

/// The library names of the plugins built by this workspace.
pub mod libs {
    /// The fake provider (`fake`, `fake-v1`).
    pub const FAKE: &str = "ccm_provider_fake";
    /// The misbehaving fixture (behaviour chosen by file name).
    pub const MISBEHAVING: &str = "ccm_fixture_misbehaving";
    /// A plugin built against another interface layout.
    pub const ABI_MISMATCH: &str = "ccm_fixture_abi_mismatch";
    /// A shared library that is not a plugin.
    pub const NOT_A_PLUGIN: &str = "ccm_fixture_not_a_plugin";
    /// A provider that breaks the provider contract on purpose (for `ccm-host check`).
    pub const BROKEN: &str = "ccm_fixture_broken";
    /// The bare-metal provider (`metal`).
    pub const METAL: &str = "ccm_provider_metal";
    /// The minimal example provider of docs/writing-a-provider.md.
    pub const EXAMPLE: &str = "ccm_provider_example";
}
