//! Test environment for the `metal` provider: the in-memory API server, the metal plugin's
//! `.so` loaded through the real loader with a cloud config and an inventory file in a temp
//! directory, `Initialize` called with the host's real services (so allocations go to the API
//! server), and controller contexts wired to both as the daemon builds them.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::{HostServices, Provider, ProviderOptions};
use ccm_host::runtime::metrics::Metrics;
use kube_apiserver_inmem::ApiServer;
use prometheus_client::registry::Registry;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{libs, PluginDir};

/// The registered provider name.
pub const METAL: &str = "metal";

/// A running metal test environment. Dropping it stops informers and controllers.
pub struct MetalEnv {
    /// The in-memory API server.
    pub server: ApiServer,
    /// A client of it.
    pub client: kube::Client,
    /// The metal provider, initialised.
    pub provider: Provider,
    /// The loaded plugin (to build a fresh provider instance).
    pub registry: PluginRegistry,
    /// Metrics the controllers update.
    pub metrics: Arc<Metrics>,
    /// Cancelled on drop.
    pub stop: CancellationToken,
    config: Vec<u8>,
    dir: tempfile::TempDir,
    _plugins: PluginDir,
}

impl MetalEnv {
    /// Start the API server and the metal provider. `config` is the cloud config as JSON; when
    /// `inventory` is given it is written to a temp file and `config.inventory` points at it.
    pub async fn start(mut config: Value, inventory: Option<&str>) -> Self {
        let server = ApiServer::start()
            .await
            .expect("in-memory API server starts");
        let client = server.client();
        let dir = tempfile::tempdir().expect("temp dir");
        if let Some(text) = inventory {
            let path = dir.path().join("inventory.yaml");
            std::fs::write(&path, text).expect("write inventory");
            config["inventory"] = Value::String(path.display().to_string());
        }
        let plugins = PluginDir::new().with(libs::METAL, "libccm_provider_metal.so");
        let registry =
            PluginRegistry::load_dirs(&[plugins.path().to_path_buf()], &LoaderOptions::default())
                .expect("plugin dir loads");
        assert!(
            registry.refused().is_empty(),
            "metal plugin refused: {:?}",
            registry.refused()
        );
        let config = serde_json::to_vec(&config).expect("config serialises");
        let provider = new_provider(&registry, &config, &client).await;
        let mut prom = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut prom));
        MetalEnv {
            server,
            client,
            provider,
            registry,
            metrics,
            stop: CancellationToken::new(),
            config,
            dir,
            _plugins: plugins,
        }
    }

    /// A new provider instance from the same plugin and config, initialised against the same
    /// API server: what a restarted host (or a new leader) gets. It shares no memory with the
    /// previous instance.
    pub async fn new_provider(&self) -> Provider {
        new_provider(&self.registry, &self.config, &self.client).await
    }

    /// A controller context with fresh shared informers (started now) for `provider`.
    pub fn context_for(&self, provider: &Provider, config: ControllerConfig) -> ControllerContext {
        ccm_host::controllers::ControllerContext::new(
            &self.client,
            provider,
            &self.metrics,
            config,
            "metal-test-host",
            &self.stop,
        )
    }

    /// [`MetalEnv::context_for`] the initial provider.
    pub fn context(&self, config: ControllerConfig) -> ControllerContext {
        self.context_for(&self.provider, config)
    }

    /// Path of the inventory file.
    pub fn inventory_path(&self) -> PathBuf {
        self.dir.path().join("inventory.yaml")
    }

    /// Replace the inventory file atomically (write a temp file, rename over), as editors and
    /// ConfigMap volume updates do.
    pub fn write_inventory(&self, text: &str) {
        let tmp = self.dir.path().join("inventory.yaml.tmp");
        std::fs::write(&tmp, text).expect("write inventory");
        std::fs::rename(&tmp, self.inventory_path()).expect("replace inventory");
    }
}

async fn new_provider(registry: &PluginRegistry, config: &[u8], client: &kube::Client) -> Provider {
    let provider = registry
        .create(METAL, Some(config), &ProviderOptions::default())
        .expect("metal provider builds");
    let host = HostServices::new(
        "kubernetes",
        Some(client.clone()),
        Arc::new(AtomicBool::new(false)),
    );
    provider
        .initialize(host)
        .await
        .expect("metal provider initialises");
    provider
}

impl Drop for MetalEnv {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
