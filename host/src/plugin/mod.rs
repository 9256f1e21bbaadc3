//! Plugin loading: every `*.so` in the plugin directories is opened, checked, and asked to
//! register its providers — the host-side half of upstream's `RegisterCloudProvider`.
//!
//! A broken plugin never takes the host down by itself: it is recorded as refused with a
//! one-line reason naming the file, and only becomes fatal if the user selected one of its
//! providers (see [`PluginRegistry::create`]).

mod deps;
mod loader;
mod refusal;
mod registrar;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ccm_provider_abi::abi::ProviderFactoryBox;
use ccm_provider_abi::ext::ProviderFactoryV1_1Box;
use ccm_provider_abi::ext_v1_2::ProviderFactoryV1_2Box;
use serde::Serialize;

pub use loader::LoaderOptions;
pub use refusal::Refusal;

/// A plugin file that loaded and registered at least one provider.
#[derive(Debug, Clone, Serialize)]
pub struct LoadedPlugin {
    /// The `.so` file.
    pub path: PathBuf,
    /// The plugin crate's package name.
    pub plugin_name: String,
    /// The plugin crate's version.
    pub plugin_version: String,
    /// The ccm-provider-abi version the plugin was built against.
    pub abi_version: String,
    /// Provider names it registered, in registration order.
    pub providers: Vec<String>,
}

/// A plugin file that was refused, with the reason. Serialized as `{path, kind, reason}`:
/// the refusal's variant name and its one line.
#[derive(Debug, Clone)]
pub struct RefusedPlugin {
    /// The file.
    pub path: PathBuf,
    /// Why; its `Display` is one line a user can act on.
    pub refusal: Refusal,
}

impl Serialize for RefusedPlugin {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut s = serializer.serialize_struct("RefusedPlugin", 3)?;
        s.serialize_field("path", &self.path)?;
        s.serialize_field("kind", self.refusal.kind())?;
        s.serialize_field("reason", &self.refusal.to_string())?;
        s.end()
    }
}

impl fmt::Display for RefusedPlugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.refusal)
    }
}

/// A provider factory as the plugin registered it: through the 1.0 root module, or through the
/// newest extension module the plugin has (ABI 1.1: its providers also carry the 1.1 additions;
/// ABI 1.2: the 1.1 and the 1.2 additions).
pub enum Factory {
    /// Registered by a plugin without the 1.1 extension.
    V1_0(ProviderFactoryBox),
    /// Registered through the 1.1 extension module.
    V1_1(ProviderFactoryV1_1Box),
    /// Registered through the 1.2 extension module.
    V1_2(ProviderFactoryV1_2Box),
}

/// A registered provider factory and where it came from.
#[derive(Clone)]
pub struct ProviderRegistration {
    /// Registered name (the value of `--cloud-provider`).
    pub name: String,
    /// The plugin file that registered it.
    pub plugin_path: PathBuf,
    /// The factory the plugin registered (1.0, or 1.1 with the extension).
    pub(crate) factory: Arc<Factory>,
}

impl fmt::Debug for ProviderRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderRegistration")
            .field("name", &self.name)
            .field("plugin_path", &self.plugin_path)
            .finish()
    }
}

/// Everything found in the plugin directories.
#[derive(Debug, Default)]
pub struct PluginRegistry {
    plugins: Vec<LoadedPlugin>,
    refused: Vec<RefusedPlugin>,
    providers: BTreeMap<String, ProviderRegistration>,
    /// Provider names registered by more than one file: refused for all of them.
    duplicates: BTreeMap<String, Vec<PathBuf>>,
    /// Log each loaded and refused file at debug level only (the command reports them).
    quiet: bool,
}

/// The longest provider name accepted (names are flag values and metric labels).
pub const MAX_PROVIDER_NAME: usize = 128;

/// A provider name must be a short, printable word.
fn check_provider_name(name: &str) -> Result<(), Refusal> {
    if name.trim().is_empty()
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
        || name.len() > MAX_PROVIDER_NAME
    {
        return Err(Refusal::InvalidProviderName(name.to_string()));
    }
    Ok(())
}

fn duplicate_reason(name: &str, files: &[PathBuf]) -> Refusal {
    Refusal::DuplicateProvider {
        name: name.to_string(),
        files: files.to_vec(),
    }
}

/// Errors that stop the host: the selected provider cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// A plugin directory could not be read.
    #[error("plugin directory {path}: {reason}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A plugin directory could be changed by someone other than root or the current user.
    #[error(
        "plugin directory {path}: {problem}; fix it with `{fix}` or pass --allow-insecure-plugins"
    )]
    InsecureDirectory {
        /// The directory.
        path: PathBuf,
        /// What is wrong (`is writable by group or others (mode 777)`).
        problem: String,
        /// The command that fixes it.
        fix: String,
    },
    /// No provider has that name.
    #[error("{0}")]
    Unknown(String),
    /// The provider's factory failed.
    #[error("{0}")]
    Factory(String),
}

impl PluginRegistry {
    /// Load every `*.so` of every directory, each directory in sorted file-name order.
    ///
    /// Only an unreadable directory is an error; broken files are recorded in [`Self::refused`].
    pub fn load_dirs(dirs: &[PathBuf], options: &LoaderOptions) -> Result<Self, SelectError> {
        Self::load_dirs_with(dirs, options, false)
    }

    /// [`Self::load_dirs`] without a log line per loaded or refused file (debug level only),
    /// for the commands that report them themselves: `plugins` lists them, `check` and the
    /// sandbox say once that files were skipped ([`Self::skipped_note`]), since a directory
    /// cargo builds into holds test fixtures besides the plugins.
    pub fn load_dirs_quietly(
        dirs: &[PathBuf],
        options: &LoaderOptions,
    ) -> Result<Self, SelectError> {
        Self::load_dirs_with(dirs, options, true)
    }

    fn load_dirs_with(
        dirs: &[PathBuf],
        options: &LoaderOptions,
        quiet: bool,
    ) -> Result<Self, SelectError> {
        let mut registry = PluginRegistry {
            quiet,
            ..PluginRegistry::default()
        };
        for dir in dirs {
            for file in loader::plugin_files(dir, options)? {
                registry.load_file(&file, options);
            }
        }
        Ok(registry)
    }

    /// Load one plugin file (also used for a file given directly).
    pub fn load_file(&mut self, path: &Path, options: &LoaderOptions) {
        let outcome = loader::load(path, options);
        match outcome {
            Err(refusal) => {
                self.log_refused(path, &refusal);
                self.refused.push(RefusedPlugin {
                    path: path.to_path_buf(),
                    refusal,
                });
            }
            Ok(loaded) => self.accept(loaded),
        }
    }

    fn accept(&mut self, loaded: loader::Loaded) {
        let path = loaded.info.path.clone();
        let refuse = |this: &mut Self, refusal: Refusal| {
            this.log_refused(&path, &refusal);
            this.refused.push(RefusedPlugin {
                path: path.clone(),
                refusal,
            });
        };
        if loaded.registrations.is_empty() {
            return refuse(self, Refusal::NoProviders);
        }
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &loaded.registrations {
            if let Err(why) = check_provider_name(name) {
                return refuse(self, why);
            }
            if !seen.insert(name.as_str()) {
                return refuse(self, Refusal::RegisteredTwice(name.clone()));
            }
        }
        let mut info = loaded.info;
        for (name, factory) in loaded.registrations {
            // A name registered by two files is refused for both (upstream: fatal): which one
            // would run must never depend on file names sorting.
            if let Some(files) = self.duplicates.get_mut(&name) {
                files.push(info.path.clone());
                refuse(self, duplicate_reason(&name, &self.duplicates[&name]));
                continue;
            }
            if let Some(existing) = self.providers.remove(&name) {
                let files = vec![existing.plugin_path.clone(), info.path.clone()];
                let reason = duplicate_reason(&name, &files);
                if self.quiet {
                    tracing::debug!(plugin = %existing.plugin_path.display(), "refused provider: {reason}");
                } else {
                    tracing::error!(plugin = %existing.plugin_path.display(), "refused provider: {reason}");
                }
                self.refused.push(RefusedPlugin {
                    path: existing.plugin_path.clone(),
                    refusal: reason.clone(),
                });
                for p in &mut self.plugins {
                    p.providers.retain(|n| n != &name);
                }
                refuse(self, reason);
                self.duplicates.insert(name, files);
                continue;
            }
            info.providers.push(name.clone());
            self.providers.insert(
                name.clone(),
                ProviderRegistration {
                    name,
                    plugin_path: info.path.clone(),
                    factory: Arc::new(factory),
                },
            );
        }
        if info.providers.is_empty() {
            return;
        }
        if self.quiet {
            tracing::debug!(
                plugin = %info.path.display(),
                providers = ?info.providers,
                abi = %info.abi_version,
                "loaded plugin {} {}",
                info.plugin_name,
                info.plugin_version
            );
        } else {
            tracing::info!(
                plugin = %info.path.display(),
                providers = ?info.providers,
                abi = %info.abi_version,
                "loaded plugin {} {}",
                info.plugin_name,
                info.plugin_version
            );
        }
        self.plugins.push(info);
    }

    fn log_refused(&self, path: &Path, reason: &Refusal) {
        let kind = reason.kind();
        if self.quiet {
            tracing::debug!(plugin = %path.display(), kind, "refused plugin: {reason}");
        } else {
            tracing::error!(plugin = %path.display(), kind, "refused plugin: {reason}");
        }
    }

    /// One line saying how many files of `dirs` were skipped, and how to see why (`None` when
    /// none was).
    pub fn skipped_note(&self, dirs: &[PathBuf]) -> Option<String> {
        if self.refused.is_empty() {
            return None;
        }
        let dirs: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        Some(format!(
            "skipped {} file(s) of the plugin directories that are not loadable plugins \
             (`ccm-host plugins --plugin-dir {}` says why)",
            self.refused.len(),
            dirs.join(":")
        ))
    }

    /// Plugins that loaded.
    pub fn plugins(&self) -> &[LoadedPlugin] {
        &self.plugins
    }

    /// Files that were refused.
    pub fn refused(&self) -> &[RefusedPlugin] {
        &self.refused
    }

    /// Every registered provider, by name.
    pub fn providers(&self) -> impl Iterator<Item = &ProviderRegistration> {
        self.providers.values()
    }

    /// Look up a provider by name.
    pub fn get(&self, name: &str) -> Option<&ProviderRegistration> {
        self.providers.get(name)
    }

    /// The registration of provider `name`, or why there is none to select: no plugin
    /// registered it, or two files did. Building the provider is `provider`'s (see
    /// `PluginRegistry::create` there), so that this module does not depend on it.
    pub fn registration(&self, name: &str) -> Result<&ProviderRegistration, SelectError> {
        if let Some(files) = self.duplicates.get(name) {
            return Err(SelectError::Unknown(
                duplicate_reason(name, files).to_string(),
            ));
        }
        self.providers
            .get(name)
            .ok_or_else(|| SelectError::Unknown(self.unknown_provider_message(name)))
    }

    fn unknown_provider_message(&self, name: &str) -> String {
        let mut msg = format!("unknown cloud provider {name:?}.");
        if self.providers.is_empty() {
            msg.push_str(" No plugin registered any provider.");
        } else {
            msg.push_str(" Available:");
            for reg in self.providers.values() {
                msg.push_str(&format!(
                    " {} (from {});",
                    reg.name,
                    reg.plugin_path.display()
                ));
            }
            msg.pop();
            msg.push('.');
        }
        if !self.refused.is_empty() {
            msg.push_str(&format!(
                " {} plugin file(s) were refused: {}",
                self.refused.len(),
                self.refused
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
        msg
    }
}
