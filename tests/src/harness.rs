//! The integration-test harness: the in-memory API server, the fake provider loaded from its
//! `.so` through the real loader (with a state directory for run-time control and
//! observation), and a `ControllerContext` wired to both, as the daemon would build it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::{Provider, ProviderOptions};
use ccm_host::runtime::metrics::Metrics;
use ccm_provider_fake::config::FakeConfig;
use ccm_provider_fake::control::{self, CallRecord, FakeState};
use kube_apiserver_inmem::ApiServer;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::{libs, PluginDir};

/// A running test environment. Dropping it stops the controllers and the API server.
pub struct Harness {
    /// The in-memory API server.
    pub server: ApiServer,
    /// A client of it.
    pub client: kube::Client,
    /// The selected fake provider, loaded from its `.so`.
    pub provider: Provider,
    /// Metrics the controllers update.
    pub metrics: Arc<Metrics>,
    /// Their registry (for rendering `/metrics`).
    pub registry: Arc<Registry>,
    /// Cancelled on drop: stops informers and controllers.
    pub stop: CancellationToken,
    state_dir: tempfile::TempDir,
    _plugins: PluginDir,
}

impl Harness {
    /// Start the API server and load provider `provider_name` (`fake` or `fake-v1`) with
    /// `config` (its `stateDir` is set by the harness).
    pub async fn start(provider_name: &str, config: FakeConfig) -> Self {
        Self::start_with(provider_name, config, ProviderOptions::default()).await
    }

    /// Like [`Harness::start`] with explicit provider-call options.
    pub async fn start_with(
        provider_name: &str,
        mut config: FakeConfig,
        options: ProviderOptions,
    ) -> Self {
        let server = ApiServer::start()
            .await
            .expect("in-memory API server starts");
        let client = server.client();
        let state_dir = tempfile::tempdir().expect("state dir");
        config.state_dir = Some(state_dir.path().to_path_buf());
        let plugins = PluginDir::new().with(libs::FAKE, "libccm_provider_fake.so");
        let registry =
            PluginRegistry::load_dirs(&[plugins.path().to_path_buf()], &LoaderOptions::default())
                .expect("plugin dir loads");
        assert!(
            registry.refused().is_empty(),
            "fake plugin refused: {:?}",
            registry.refused()
        );
        let yaml = serde_json::to_vec(&config).expect("config serialises");
        let provider = registry
            .create(provider_name, Some(&yaml), &options)
            .expect("fake provider builds");
        let mut prom = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut prom));
        Harness {
            server,
            client,
            provider,
            metrics,
            registry: Arc::new(prom),
            stop: CancellationToken::new(),
            state_dir,
            _plugins: plugins,
        }
    }

    /// A controller context with fresh shared informers (started now) and `config`.
    pub fn context(&self, config: ControllerConfig) -> ControllerContext {
        ControllerContext::new(
            &self.client,
            &self.provider,
            &self.metrics,
            config,
            "test-host",
            &self.stop,
        )
    }

    /// The fake provider's state directory.
    pub fn state_dir(&self) -> &Path {
        self.state_dir.path()
    }

    /// A path inside the state directory (e.g. for pause gate files).
    pub fn state_path(&self, name: &str) -> PathBuf {
        self.state_dir.path().join(name)
    }

    /// Every provider call recorded so far.
    pub fn calls(&self) -> Vec<CallRecord> {
        control::read_calls(self.state_dir()).unwrap_or_default()
    }

    /// The names of the recorded calls, in order.
    pub fn call_names(&self) -> Vec<String> {
        self.calls().into_iter().map(|c| c.call).collect()
    }

    /// Forget the recorded calls.
    pub fn clear_calls(&self) {
        control::clear_calls(self.state_dir()).expect("clear calls");
    }

    /// The fake cloud's load balancers and routes, once every change of the calls that returned
    /// is written (a burst the fake left to its writer thread is waited for, 5 s at most).
    pub fn cloud(&self) -> FakeState {
        FakeState::read_settled(self.state_dir(), Duration::from_secs(5)).unwrap_or_default()
    }

    /// Replace the fake provider's programmable settings while the controllers run.
    pub fn set_control(&self, config: &FakeConfig) {
        control::write_control(self.state_dir(), config).expect("write control file");
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub use ccm_test_support::{eventually, eventually_async};
