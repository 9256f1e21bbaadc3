//! The daemon's Kubernetes API clients: one per user, each with its own client-side rate limit
//! and User-Agent, as upstream's client builder makes them.
//!
//! Upstream's cloud-controller-manager builds every client from the same kubeconfig but as a
//! separate clientset: one for leader election (user agent `…/leader-election`), one for the
//! shared informers (`…/shared-informers`) and one per controller (`ClientBuilder.ClientOrDie`
//! with the controller's client identity, e.g. `…/node-controller`). Each clientset gets its own
//! token bucket of `--kube-api-qps`/`--kube-api-burst`. Two things follow, and ccm-host keeps
//! both:
//! - a controller's backlog never delays a lease renewal (with one shared queue, 200 new nodes
//!   at the default 20 qps held renewals back past the 10 s renew deadline and the leader
//!   stepped down before anything converged);
//! - the API server's audit log, metrics and priority-and-fairness rules can tell the clients
//!   apart by User-Agent.
//!
//! As upstream, the client-side limit is per client, not per process: the process as a whole
//! may send (controllers + 2) × `--kube-api-qps` requests per second at most.
//!
//! What the clients share is the HTTP stack below the limit: connections, the TLS
//! configuration and authentication, built once per configuration (client-go likewise shares
//! one transport between the clientsets of one configuration). A kube stack of its own per
//! client parsed the system's root certificates into a TLS verifier of its own (~90 KB each,
//! a dozen clients) and kept connections and read buffers of its own: about 1 MiB of the
//! host's memory target (BENCHMARKS.md, memory).
//!
//! A request that never got an answer (no connection, TLS, a timeout) fails with an error that
//! names the API server's URL and the whole cause chain down to the operating system's reason
//! ([`TransportError`]), where kube's own says only `client error (Connect)`.

use kube::Client;

use crate::runtime::rate_limit::{FairLimiter, RateLimitLayer};

/// Client name of leader election (upstream's `leader-election` user agent suffix).
pub const LEADER_ELECTION: &str = "leader-election";
/// Client name of the shared node and service informers.
pub const SHARED_INFORMERS: &str = "shared-informers";

/// Why an API client cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The configuration makes no client (e.g. unreadable TLS material).
    #[error("cannot build the Kubernetes client: {0}")]
    Build(#[source] kube::Error),
    /// The client's name is not a valid User-Agent.
    #[error("invalid client name {name:?}: {source}")]
    Name {
        /// The name given.
        name: String,
        /// Why it is not a header value.
        source: http::header::InvalidHeaderValue,
    },
}

/// Builds the daemon's clients from one API configuration and one client-side limit.
#[derive(Clone)]
pub struct KubeClients {
    config: kube::Config,
    /// The HTTP stack every client sends through (connections, TLS, authentication).
    base: Client,
    qps: f64,
    burst: u32,
}

impl std::fmt::Debug for KubeClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClients")
            .field("cluster_url", &self.config.cluster_url)
            .field("qps", &self.qps)
            .field("burst", &self.burst)
            .finish()
    }
}

impl KubeClients {
    /// Clients of `config`, each limited to `qps` requests per second with bursts of `burst`.
    ///
    /// # Errors
    /// When no client can be built from `config` (checked once here, so [`Self::client`] only
    /// fails for the same reasons).
    pub fn new(config: kube::Config, qps: f64, burst: u32) -> Result<Self, ClientError> {
        let mut base = without_system_roots_for_http(config.clone());
        base.headers
            .retain(|(header, _)| header != http::header::USER_AGENT);
        let base = kube::client::ClientBuilder::try_from(base)
            .map_err(ClientError::Build)?
            .build();
        Ok(Self {
            config,
            base,
            qps,
            burst,
        })
    }

    /// A new client named `name`: its own token bucket and the User-Agent
    /// [`user_agent`]`(name)` on every request, over the shared HTTP stack.
    ///
    /// # Errors
    /// When the configuration cannot make a client (e.g. unreadable TLS material).
    pub fn client(&self, name: &str) -> Result<Client, ClientError> {
        let agent =
            http::HeaderValue::from_str(&user_agent(name)).map_err(|source| ClientError::Name {
                name: name.to_string(),
                source,
            })?;
        let base = self.base.clone();
        let url = self.config.cluster_url.to_string();
        let service = tower::service_fn(move |mut request: http::Request<kube::client::Body>| {
            let base = base.clone();
            let url = url.clone();
            request
                .headers_mut()
                .insert(http::header::USER_AGENT, agent.clone());
            async move {
                base.send(request).await.map_err(|e| {
                    kube::Error::Service(Box::new(TransportError::new(
                        url.trim_end_matches('/'),
                        &e,
                    )))
                })
            }
        });
        let limiter = FairLimiter::new(self.qps, self.burst);
        let service = tower::Layer::layer(&RateLimitLayer::new(limiter, "kube-api"), service);
        Ok(Client::new(service, self.config.default_namespace.clone()))
    }
}

/// `config` with an empty trust store when its server is plain `http://` and it names no CA.
///
/// kube builds a TLS configuration for every client, whatever the URL's scheme, and without
/// CA data in the configuration that means the system's roots: in an image without a CA bundle
/// (e.g. `debian:*-slim`), or wherever the bundle is unreadable, building a client for a plain
/// HTTP server (the sandbox's, `check`'s) failed with "No CA certificates were loaded from the
/// system" although no TLS would ever be spoken. HTTPS configurations are left as they are.
pub fn without_system_roots_for_http(mut config: kube::Config) -> kube::Config {
    if config.cluster_url.scheme() == Some(&http::uri::Scheme::HTTP) && config.root_cert.is_none() {
        config.root_cert = Some(Vec::new());
    }
    config
}

/// A request to the API server that got no answer: the server's URL and every cause down to
/// the operating system's (`cannot reach the API server https://10.0.0.1:6443: client error
/// (Connect): tcp connect error: Connection refused (os error 111)`).
#[derive(Debug)]
pub struct TransportError(String);

impl TransportError {
    /// The error of a request to `url` that failed with `error`.
    pub fn new(url: &str, error: &(dyn std::error::Error + 'static)) -> Self {
        let chain = error_chain(error);
        // kube's wrapper of the HTTP stack's error adds only its own name.
        let chain = chain.strip_prefix("ServiceError: ").unwrap_or(&chain);
        Self(format!("cannot reach the API server {url}: {chain}"))
    }
}

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TransportError {}

/// `error` and its sources, `: `-separated, each once (a source whose text its parent already
/// contains is left out).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = e.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    text
}

/// Upstream's User-Agent shape for the client `name`:
/// `cloud-controller-manager/v<version> (<os>/<arch>) ccm-host/<name>` (upstream has
/// `kubernetes/<commit>` where this names the host).
pub fn user_agent(name: &str) -> String {
    // Go's GOARCH spelling, as upstream's agent has it.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64",
        other => other,
    };
    format!(
        "cloud-controller-manager/v{} ({}/{arch}) ccm-host/{name}",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_http_configurations_need_no_system_roots() {
        let http = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        assert_eq!(
            without_system_roots_for_http(http).root_cert,
            Some(Vec::new())
        );
        let https = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        assert_eq!(without_system_roots_for_http(https).root_cert, None);
        let mut with_ca = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        with_ca.root_cert = Some(vec![vec![1, 2, 3]]);
        assert_eq!(
            without_system_roots_for_http(with_ca).root_cert,
            Some(vec![vec![1, 2, 3]])
        );
    }

    #[test]
    fn user_agent_has_upstreams_shape_and_names_the_client() {
        let agent = user_agent(LEADER_ELECTION);
        assert!(
            agent.starts_with(&format!(
                "cloud-controller-manager/v{} (linux/",
                env!("CARGO_PKG_VERSION")
            )),
            "{agent}"
        );
        assert!(agent.ends_with(") ccm-host/leader-election"), "{agent}");
        assert!(!agent.contains("x86_64"), "Go's arch names: {agent}");
    }

    #[tokio::test]
    async fn an_unreachable_api_server_is_named_with_the_os_reason() {
        // A port nothing listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let config = kube::Config::new(url.parse().unwrap());
        let client = KubeClients::new(config, 100.0, 100)
            .unwrap()
            .client(LEADER_ELECTION)
            .unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
        let error = api.list(&Default::default()).await.unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains(&format!(
                "cannot reach the API server {url}: client error (Connect)"
            )),
            "{text}"
        );
        assert!(text.contains("Connection refused (os error 111)"), "{text}");
    }
}
