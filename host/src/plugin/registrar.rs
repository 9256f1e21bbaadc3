//! The host's implementation of the plugin-facing registrar and log sink.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use abi_stable::sabi_trait::TD_Opaque;
use abi_stable::std_types::{RResult, RStr, RString};
use ccm_provider_abi::abi::{
    log_level, AbiLogger, AbiRegistrar, AbiResult, LoggerBox, ProviderFactoryBox, RegistrarBox,
};
use ccm_provider_abi::ext::{AbiExtRegistrar, ExtRegistrarBox, ProviderFactoryV1_1Box};
use ccm_provider_abi::ext_v1_2::{
    AbiExtRegistrarV1_2, ExtRegistrarV1_2Box, ProviderFactoryV1_2Box,
};

use super::Factory;

type Registrations = Arc<Mutex<Vec<(String, Factory)>>>;

/// Collects what one plugin registers during its `register` call.
pub(super) struct HostRegistrar {
    path: PathBuf,
    max_log_level: u8,
    registrations: Registrations,
}

impl HostRegistrar {
    pub fn new(path: &Path, max_log_level: u8) -> Self {
        Self {
            path: path.to_path_buf(),
            max_log_level,
            registrations: Arc::default(),
        }
    }

    fn side(&self) -> AbiSide {
        AbiSide {
            path: self.path.clone(),
            max_log_level: self.max_log_level,
            registrations: self.registrations.clone(),
        }
    }

    /// The FFI object handed to a 1.0 plugin's `register`; it shares the registration list
    /// with `self`.
    pub fn to_abi(&self) -> RegistrarBox {
        RegistrarBox::from_value(self.side(), TD_Opaque)
    }

    /// The same for the ABI 1.1 extension's `register` (1.1 factories).
    pub fn to_abi_v1_1(&self) -> ExtRegistrarBox {
        ExtRegistrarBox::from_value(self.side(), TD_Opaque)
    }

    /// The same for the ABI 1.2 extension's `register` (1.2 factories).
    pub fn to_abi_v1_2(&self) -> ExtRegistrarV1_2Box {
        ExtRegistrarV1_2Box::from_value(self.side(), TD_Opaque)
    }

    pub fn take(&self) -> Vec<(String, Factory)> {
        std::mem::take(&mut *self.registrations.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

struct AbiSide {
    path: PathBuf,
    max_log_level: u8,
    registrations: Registrations,
}

impl AbiSide {
    fn plugin_path(&self) -> RString {
        self.path.to_string_lossy().into_owned().into()
    }

    fn logger(&self) -> LoggerBox {
        let plugin = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        LoggerBox::from_value(PluginLogger { plugin }, TD_Opaque)
    }

    fn register(&self, name: RStr<'_>, factory: Factory) -> AbiResult<()> {
        // Names are validated once the plugin returns, so that the reason names the file.
        self.registrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.to_string(), factory));
        RResult::ROk(())
    }
}

impl AbiRegistrar for AbiSide {
    fn plugin_path(&self) -> RString {
        AbiSide::plugin_path(self)
    }

    fn max_log_level(&self) -> u8 {
        self.max_log_level
    }

    fn logger(&self) -> LoggerBox {
        AbiSide::logger(self)
    }

    fn register_provider(&mut self, name: RStr<'_>, factory: ProviderFactoryBox) -> AbiResult<()> {
        self.register(name, Factory::V1_0(factory))
    }
}

impl AbiExtRegistrar for AbiSide {
    fn plugin_path(&self) -> RString {
        AbiSide::plugin_path(self)
    }

    fn max_log_level(&self) -> u8 {
        self.max_log_level
    }

    fn logger(&self) -> LoggerBox {
        AbiSide::logger(self)
    }

    fn register_provider(
        &mut self,
        name: RStr<'_>,
        factory: ProviderFactoryV1_1Box,
    ) -> AbiResult<()> {
        self.register(name, Factory::V1_1(factory))
    }
}

impl AbiExtRegistrarV1_2 for AbiSide {
    fn plugin_path(&self) -> RString {
        AbiSide::plugin_path(self)
    }

    fn max_log_level(&self) -> u8 {
        self.max_log_level
    }

    fn logger(&self) -> LoggerBox {
        AbiSide::logger(self)
    }

    fn register_provider(
        &mut self,
        name: RStr<'_>,
        factory: ProviderFactoryV1_2Box,
    ) -> AbiResult<()> {
        self.register(name, Factory::V1_2(factory))
    }
}

/// Re-emits a plugin's log records as host tracing events tagged with the plugin file name.
struct PluginLogger {
    plugin: String,
}

impl AbiLogger for PluginLogger {
    fn log(&self, level: u8, target: RStr<'_>, message: RStr<'_>) {
        let (plugin, target, message) = (self.plugin.as_str(), target.as_str(), message.as_str());
        match level {
            log_level::ERROR => {
                tracing::error!(target: "plugin", plugin, plugin_target = target, "{message}")
            }
            log_level::WARN => {
                tracing::warn!(target: "plugin", plugin, plugin_target = target, "{message}")
            }
            log_level::INFO => {
                tracing::info!(target: "plugin", plugin, plugin_target = target, "{message}")
            }
            log_level::DEBUG => {
                tracing::debug!(target: "plugin", plugin, plugin_target = target, "{message}")
            }
            _ => tracing::trace!(target: "plugin", plugin, plugin_target = target, "{message}"),
        }
    }
}
