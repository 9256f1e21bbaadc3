//! The provider instance behind a [`Provider`], and how it is replaced while the host runs
//! (`--cloud-config` hot reload), initialised and probed for health.
//!
//! A [`Provider`] keeps the objects one factory call made (the cloud, its capability objects and
//! its ABI 1.1 extension: a [`Plugin`]) behind one `RwLock<Arc<Plugin>>`. Every call clones the
//! object it needs out of the current `Plugin` at its start (a read lock held for one reference
//! count increment), so a reload never waits for calls and calls never wait for a reload: calls
//! that started before a swap finish on the old instance, which is dropped (on a blocking
//! thread) once the last of them returned. Everything that is the host's rather than the
//! plugin's (call budget, throttling pause, metrics, coalesced reads, caches, the call pool)
//! lives in `Inner` and survives a reload.
//!
//! A reload with new cloud-config bytes ([`Provider::reload`]):
//! 1. an ABI 1.1 provider gets them through `reconfigure` (in place; the same instance stays);
//! 2. a 1.0 plugin, or a provider whose `reconfigure` answers `NOT_IMPLEMENTED`, is *rebuilt*:
//!    the factory makes a new instance from the new bytes, which must offer exactly what the
//!    current one offers ([`Identity`]: provider name, capabilities, ABI 1.1 features,
//!    platforms, HasClusterID — the controllers decided what to run from them at start), is
//!    initialised with the [`HostServices`] the first instance got (when the host initialised
//!    it already), and only then replaces the current instance.
//!
//! Any failure (a `reconfigure` error, a factory error, different capabilities, an `Initialize`
//! error) keeps the current instance as it was; `ccm_cloud_config_reloads_total{result,method}`
//! counts each outcome. Reloads and `Initialize` are serialised by one async mutex, so a rebuilt
//! instance can never miss the `Initialize` of a host that becomes leader during the reload.

use std::sync::Arc;
use std::time::Duration;

use abi_stable::std_types::RString;
use ccm_provider_abi::abi::{
    CloudProviderBox, ClustersBox, InstancesBox, InstancesV2Box, LoadBalancerBox, RoutesBox,
    ZonesBox,
};
use ccm_provider_abi::ext::{ExtCapabilities, ProviderExtBox};
use ccm_provider_abi::ext_v1_2::{ExtCapabilitiesV1_2, ProviderExtV1_2Box};
use ccm_provider_abi::{ErrorKind, ProviderError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{run_with_deadline, Capabilities, HostServices, Provider};
use crate::plugin::Factory;

/// The objects of one provider instance, made by one factory call.
pub(super) struct Plugin {
    pub(super) cloud: Arc<CloudProviderBox>,
    pub(super) load_balancer: Option<Arc<LoadBalancerBox>>,
    pub(super) instances: Option<Arc<InstancesBox>>,
    pub(super) instances_v2: Option<Arc<InstancesV2Box>>,
    pub(super) zones: Option<Arc<ZonesBox>>,
    pub(super) clusters: Option<Arc<ClustersBox>>,
    pub(super) routes: Option<Arc<RoutesBox>>,
    /// The ABI 1.1 additions, when the plugin offers them.
    pub(super) ext: Option<Arc<ProviderExtBox>>,
    /// The ABI 1.2 additions, when the plugin offers them.
    pub(super) ext_v1_2: Option<Arc<ProviderExtV1_2Box>>,
    /// What this instance offers (read once, when it was made).
    pub(super) identity: Identity,
}

/// What a provider instance offers, as the host read it when the instance was made. Fixed for
/// the life of a [`Provider`]: a rebuilt instance must offer the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    /// `ProviderName()`.
    pub(super) provider_name: String,
    /// `HasClusterID()`.
    pub(super) has_cluster_id: bool,
    /// The 1.0 capability objects present.
    pub(super) capabilities: Capabilities,
    /// The plugin offers the ABI 1.1 extension.
    pub(super) abi_1_1: bool,
    /// What the extension declared (empty without one).
    pub(super) ext_capabilities: ExtCapabilities,
    /// The plugin offers the ABI 1.2 extension.
    pub(super) abi_1_2: bool,
    /// What the 1.2 extension declared (empty without one).
    pub(super) ext_v1_2_capabilities: ExtCapabilitiesV1_2,
    /// The platforms (providerID prefixes) the provider owns.
    pub(super) platforms: Vec<String>,
}

impl Identity {
    /// What differs from `new`, in words (empty when nothing does).
    fn changes(&self, new: &Identity) -> Vec<String> {
        let mut out = Vec::new();
        if self.provider_name != new.provider_name {
            out.push(format!(
                "ProviderName {:?} → {:?}",
                self.provider_name, new.provider_name
            ));
        }
        if self.capabilities != new.capabilities {
            out.push(format!(
                "capabilities [{}] → [{}]",
                self.capabilities.names().join(", "),
                new.capabilities.names().join(", ")
            ));
        }
        if self.abi_1_1 != new.abi_1_1 || self.ext_capabilities != new.ext_capabilities {
            out.push(format!(
                "ABI 1.1 features {:?} → {:?}",
                self.abi_1_1.then_some(self.ext_capabilities.0),
                new.abi_1_1.then_some(new.ext_capabilities.0)
            ));
        }
        if self.abi_1_2 != new.abi_1_2 || self.ext_v1_2_capabilities != new.ext_v1_2_capabilities {
            out.push(format!(
                "ABI 1.2 features {:?} → {:?}",
                self.abi_1_2.then_some(self.ext_v1_2_capabilities.0),
                new.abi_1_2.then_some(new.ext_v1_2_capabilities.0)
            ));
        }
        if self.platforms != new.platforms {
            out.push(format!(
                "platforms {:?} → {:?}",
                self.platforms, new.platforms
            ));
        }
        if self.has_cluster_id != new.has_cluster_id {
            out.push(format!(
                "HasClusterID {} → {}",
                self.has_cluster_id, new.has_cluster_id
            ));
        }
        out
    }
}

impl Plugin {
    /// Run the factory with `config` (on a helper thread, with the deadline) and read what the
    /// new instance offers.
    pub(super) fn build(
        factory: &Arc<Factory>,
        config: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Self, ProviderError> {
        let factory = factory.clone();
        let config = config.map(<[u8]>::to_vec);
        let (cloud, ext, ext_v1_2) = run_with_deadline("provider factory", timeout, move || {
            let config = config.as_deref().map(Into::into).into();
            match &*factory {
                Factory::V1_0(f) => f.create(config).map(|cloud| (cloud, None, None)),
                Factory::V1_1(f) => f.create(config).map(|p| (p.base, Some(p.ext), None)),
                Factory::V1_2(f) => f
                    .create(config)
                    .map(|p| (p.base, Some(p.ext), Some(p.ext_v1_2))),
            }
        })?;
        let ext_v1_2_capabilities = ext_v1_2
            .as_ref()
            .map_or(ExtCapabilitiesV1_2::empty(), |e| e.capabilities());
        let cloud = Arc::new(cloud);
        let provider_name = cloud.provider_name().into_string();
        let ext_capabilities = ext
            .as_ref()
            .map_or(ExtCapabilities::empty(), |e| e.capabilities());
        let mut platforms: Vec<String> = ext
            .as_ref()
            .map(|e| {
                e.platforms()
                    .into_iter()
                    .map(RString::into_string)
                    .collect()
            })
            .unwrap_or_default();
        if platforms.is_empty() {
            // A 1.0 plugin, or a 1.1 provider that declared none: its ProviderName's scheme.
            platforms.push(format!("{provider_name}://"));
        }
        let load_balancer = cloud.load_balancer().into_option().map(Arc::new);
        let instances = cloud.instances().into_option().map(Arc::new);
        let instances_v2 = cloud.instances_v2().into_option().map(Arc::new);
        let zones = cloud.zones().into_option().map(Arc::new);
        let clusters = cloud.clusters().into_option().map(Arc::new);
        let routes = cloud.routes().into_option().map(Arc::new);
        let identity = Identity {
            has_cluster_id: cloud.has_cluster_id(),
            provider_name,
            capabilities: Capabilities {
                load_balancer: load_balancer.is_some(),
                instances: instances.is_some(),
                instances_v2: instances_v2.is_some(),
                zones: zones.is_some(),
                clusters: clusters.is_some(),
                routes: routes.is_some(),
            },
            abi_1_1: ext.is_some(),
            ext_capabilities,
            abi_1_2: ext_v1_2.is_some(),
            ext_v1_2_capabilities,
            platforms,
        };
        Ok(Plugin {
            cloud,
            load_balancer,
            instances,
            instances_v2,
            zones,
            clusters,
            routes,
            ext: ext.map(Arc::new),
            ext_v1_2: ext_v1_2.map(Arc::new),
            identity,
        })
    }
}

/// Drop a provider instance (or anything holding plugin objects) on a blocking thread: the
/// plugin's destructors may take their time (join a thread, close connections).
fn drop_off_runtime<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(move || drop(value));
        }
        Err(_) => drop(value),
    }
}

/// How a reload was (or was to be) applied: the `method` label of
/// `ccm_cloud_config_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReloadMethod {
    /// The provider's own `reconfigure` (ABI 1.1), in place.
    Reconfigure,
    /// A new instance from the factory, initialised and swapped in.
    Rebuild,
    /// The file could not be read (counted by the watcher, never by [`Provider::reload`]).
    Read,
}

impl ReloadMethod {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reconfigure => "reconfigure",
            Self::Rebuild => "rebuild",
            Self::Read => "read",
        }
    }
}

/// A reload that was refused: the current instance stays, unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadError {
    /// The step that failed.
    pub method: ReloadMethod,
    /// Why, in one line.
    pub message: String,
}

impl std::fmt::Display for ReloadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ReloadError {}

/// `{result, method}` of `ccm_cloud_config_reloads_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
    method: &'static str,
}

/// `ccm_cloud_config_reloads_total{result="success|failure", method="reconfigure|rebuild|read"}`.
/// Clones share the same series.
#[derive(Clone, Default)]
pub struct ReloadMetrics {
    reloads: Family<ReloadLabels, Counter>,
}

impl ReloadMetrics {
    /// Register the series.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "ccm_cloud_config_reloads",
            "Reloads of --cloud-config after the file changed, by result (success, failure) and method (reconfigure: the provider's own, in place; rebuild: a new instance from the factory; read: the file could not be read)",
            self.reloads.clone(),
        );
    }

    /// Count one reload.
    pub fn count(&self, method: ReloadMethod, ok: bool) {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: if ok { "success" } else { "failure" },
                method: method.as_str(),
            })
            .inc();
    }

    /// The count of one series (tests, reports).
    pub fn get(&self, method: ReloadMethod, ok: bool) -> u64 {
        self.reloads
            .get_or_create(&ReloadLabels {
                result: if ok { "success" } else { "failure" },
                method: method.as_str(),
            })
            .get()
    }
}

/// What reloads and `Initialize` share (under one async mutex).
#[derive(Default)]
pub(super) struct Lifecycle {
    /// What `Initialize` was given, once it succeeded: a rebuilt instance gets the same.
    host: Option<HostServices>,
}

impl Provider {
    /// The current provider instance.
    pub(super) fn plugin(&self) -> Arc<Plugin> {
        self.inner
            .plugin
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// `Initialize` the current instance; a later rebuilt instance is initialised with the same
    /// `host`.
    pub async fn initialize(&self, host: HostServices) -> Result<(), ProviderError> {
        let mut lifecycle = self.inner.lifecycle.lock().await;
        let cloud = self.plugin().cloud.clone();
        let services = host.clone();
        self.call("Initialize", move |ctx| {
            cloud.initialize(ctx, services.into_abi())
        })
        .await?;
        lifecycle.host = Some(host);
        Ok(())
    }

    /// The provider's health probe (ABI 1.1 `health`): `Ok` when it can do its work now.
    /// `NOT_IMPLEMENTED` (also for a 1.0 plugin, without a call) means it offers no probe.
    pub async fn health(&self) -> Result<(), ProviderError> {
        let Some(ext) = self.plugin().ext.clone() else {
            return Err(ProviderError::not_implemented());
        };
        self.call("Health", move |ctx| ext.health(ctx)).await
    }

    /// The reload counters (register them with [`ReloadMetrics::register`]).
    pub fn reload_metrics(&self) -> &ReloadMetrics {
        &self.inner.reload_metrics
    }

    /// Apply new cloud-config bytes: the provider's `reconfigure`, else a rebuilt instance
    /// swapped in once initialised (see the module documentation). On `Err` the current
    /// instance stays as it was. Counted in `ccm_cloud_config_reloads_total`.
    ///
    /// Once the new configuration is in force the instance cache is emptied: answers learned
    /// under the old credentials or settings are not served after a reload, nor kept when
    /// their call was under way during it ([`super::instance_cache`]).
    pub async fn reload(&self, config: &[u8]) -> Result<ReloadMethod, ReloadError> {
        let lifecycle = self.inner.lifecycle.lock().await;
        let result = self.try_reload(&lifecycle, config).await;
        match &result {
            Ok(method) => {
                self.inner.instance_cache.clear();
                self.inner.reload_metrics.count(*method, true);
            }
            Err(e) => self.inner.reload_metrics.count(e.method, false),
        }
        result
    }

    async fn try_reload(
        &self,
        lifecycle: &Lifecycle,
        config: &[u8],
    ) -> Result<ReloadMethod, ReloadError> {
        let current = self.plugin();
        if let Some(ext) = current.ext.clone() {
            let bytes = config.to_vec();
            let answer = self
                .call("Reconfigure", move |ctx| {
                    ext.reconfigure(ctx, bytes.as_slice().into())
                })
                .await;
            match answer {
                Ok(()) => return Ok(ReloadMethod::Reconfigure),
                Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => {}
                Err(e) => {
                    return Err(ReloadError {
                        method: ReloadMethod::Reconfigure,
                        message: format!("the provider's reconfigure refused it: {e}"),
                    })
                }
            }
        }
        drop(current);
        let failed = |message: String| ReloadError {
            method: ReloadMethod::Rebuild,
            message,
        };
        let factory = self.inner.factory.clone();
        let bytes = config.to_vec();
        let timeout = self.inner.options.call_timeout;
        let built =
            tokio::task::spawn_blocking(move || Plugin::build(&factory, Some(&bytes), timeout))
                .await
                .map_err(|e| failed(format!("the provider factory did not answer: {e}")))?;
        let new = built.map_err(|e| failed(format!("the provider factory refused it: {e}")))?;
        let changes = self.inner.identity.changes(&new.identity);
        if !changes.is_empty() {
            drop_off_runtime(new);
            return Err(failed(format!(
                "it changes what the provider offers ({}); the controllers were started for the old one, restart ccm-host to apply it",
                changes.join("; ")
            )));
        }
        if let Some(host) = lifecycle.host.clone() {
            let cloud = new.cloud.clone();
            let initialized = self
                .call("Initialize", move |ctx| {
                    cloud.initialize(ctx, host.into_abi())
                })
                .await;
            if let Err(e) = initialized {
                drop_off_runtime(new);
                return Err(failed(format!(
                    "Initialize of the new instance failed: {e}"
                )));
            }
        }
        let old = std::mem::replace(
            &mut *self.inner.plugin.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(new),
        );
        drop_off_runtime(old);
        Ok(ReloadMethod::Rebuild)
    }
}
