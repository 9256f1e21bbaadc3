//! HTTPS serving for the in-memory API server: a CA made at start and a serving certificate it
//! signs, as a cluster's API server has (kubeadm's `ca.crt` and `apiserver.crt`).
//!
//! With it a client can be configured exactly as in a pod: the CA at
//! `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt`, a token beside it and
//! `KUBERNETES_SERVICE_HOST`/`_PORT` (see [`crate::ApiServer::write_in_cluster_files`]). The
//! serving certificate names `127.0.0.1`, `::1`, `localhost` and the in-cluster service names
//! (`kubernetes`, `kubernetes.default`, `kubernetes.default.svc`,
//! `kubernetes.default.svc.cluster.local`). HTTP/1.1 only (kube and kubectl fall back to it).

use std::sync::Arc;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

/// A CA and a serving certificate signed by it (PEM).
#[derive(Clone)]
pub struct ServingIdentity {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ServingIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingIdentity").finish_non_exhaustive()
    }
}

impl ServingIdentity {
    /// A new CA (`ccm-inmemory-ca`) and a serving certificate for the local and in-cluster names.
    ///
    /// # Errors
    /// When the key pairs or certificates cannot be generated.
    pub fn generate() -> anyhow::Result<Self> {
        let ca_key = rcgen::KeyPair::generate().context("generating the CA key")?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "ccm-inmemory-ca");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).context("signing the CA")?;
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let key = rcgen::KeyPair::generate().context("generating the serving key")?;
        let names = [
            "localhost",
            "127.0.0.1",
            "::1",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ];
        let mut serving = rcgen::CertificateParams::new(names.map(String::from).to_vec())?;
        serving
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver");
        serving.key_usages = vec![
            rcgen::KeyUsagePurpose::DigitalSignature,
            rcgen::KeyUsagePurpose::KeyEncipherment,
        ];
        serving.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = serving
            .signed_by(&key, &issuer)
            .context("signing the serving certificate")?;
        Ok(Self {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA certificate (PEM): what clients trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn server_config(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .context("reading the serving certificate")?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .context("reading the serving key")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .context("the serving certificate")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Serves `app` over HTTPS on `listener` until `stop` is cancelled.
pub(crate) fn serve(
    listener: tokio::net::TcpListener,
    identity: &ServingIdentity,
    app: axum::Router,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let acceptor = tokio_rustls::TlsAcceptor::from(identity.server_config()?);
    Ok(tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let tcp = tokio::select! {
                _ = stop.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((tcp, _)) => tcp,
                    Err(e) => {
                        tracing::warn!("in-memory API server: accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop.clone());
            connections.spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        tower::ServiceExt::oneshot(app.clone(), request)
                    },
                );
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    _ = stop.cancelled() => conn.as_mut().graceful_shutdown(),
                }
            });
            // Reap finished connections so the set does not grow with every connection made.
            while connections.try_join_next().is_some() {}
        }
        connections.shutdown().await;
    }))
}
