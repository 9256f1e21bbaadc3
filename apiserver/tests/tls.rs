//! The server over HTTPS: clients from its kubeconfig trust its CA; others are refused.

mod support;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use kube_apiserver_inmem::{ApiServer, ApiServerOptions, ServingIdentity};

async fn https_server() -> ApiServer {
    ApiServer::start_with(ApiServerOptions {
        tls: Some(ServingIdentity::generate().unwrap()),
        ..Default::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_client_from_the_kubeconfig_trusts_the_servers_ca() {
    let server = https_server().await;
    assert!(
        server.url().starts_with("https://127.0.0.1:"),
        "{}",
        server.url()
    );
    let client = support::client_from_written_kubeconfig(&server).await;
    let names = support::namespace_names(client).await;
    assert!(names.contains(&"kube-system".to_string()), "{names:?}");
    server.shutdown().await;
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_is_refused() {
    let server = https_server().await;
    // Another server's CA: the handshake must fail.
    let other = ServingIdentity::generate().unwrap();
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.root_cert = Some(vec![pem_to_der(other.ca_pem())]);
    let client = kube::Client::try_from(config).unwrap();
    let err = Api::<Namespace>::all(client)
        .list(&ListParams::default())
        .await
        .expect_err("a server whose certificate the client's CA did not sign");
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "{err:?}"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn in_cluster_files_are_written_as_the_kubelet_mounts_them() {
    let server = https_server().await;
    let dir = tempfile::tempdir().unwrap();
    server.write_in_cluster_files(dir.path(), "t0ken").unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("token")).unwrap(),
        "t0ken"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("namespace")).unwrap(),
        "kube-system"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(),
        server.ca_pem().unwrap()
    );
    server.shutdown().await;
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}
