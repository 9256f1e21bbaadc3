//! The conformance suite (tests/src/apiserver_support.rs) against the in-memory API server, and,
//! when `CCM_E2E_KUBECONFIG` names a kubeconfig, against that real cluster too, so the double
//! can be checked against the real thing.

use ccm_host::apiserver::ApiServer;
use ccm_integration_tests::apiserver_support::{conformance_suite, unique_prefix};

#[tokio::test]
async fn in_memory_server_passes_the_conformance_suite() {
    let server = ApiServer::start().await.expect("start server");
    conformance_suite(server.client(), &unique_prefix("conf"))
        .await
        .expect("conformance suite");
    server.shutdown().await;
}

#[tokio::test]
async fn real_cluster_passes_the_conformance_suite() {
    let Ok(path) = std::env::var("CCM_E2E_KUBECONFIG") else {
        eprintln!("SKIPPED: set CCM_E2E_KUBECONFIG=/path/to/kubeconfig to run the conformance suite against a real cluster");
        return;
    };
    let kc = kube::config::Kubeconfig::read_from(&path).expect("read CCM_E2E_KUBECONFIG");
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("client config from CCM_E2E_KUBECONFIG");
    let client = kube::Client::try_from(config).expect("client");
    conformance_suite(client, &unique_prefix("ccm-e2e"))
        .await
        .expect("conformance suite against the real cluster");
}
