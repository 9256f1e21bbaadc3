//! Helpers shared by the test files of this crate (each test binary uses some of them).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use serde_json::Value;

/// Build a typed object from JSON (panics on a malformed literal in a test).
pub fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("test object literal must decode")
}

/// Poll `f` until it returns true or `timeout` passes.
pub async fn wait_until<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The HTTP code of a kube error, if it is an API error.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// The `Status.reason` of a kube error.
pub fn api_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.reason.clone(),
        other => format!("not an API error: {other}"),
    }
}

/// A client built the way users build one: from the kubeconfig the server writes to a file.
pub async fn client_from_written_kubeconfig(
    server: &kube_apiserver_inmem::ApiServer,
) -> kube::Client {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// The names of every namespace, as listed through `client`.
pub async fn namespace_names(client: kube::Client) -> Vec<String> {
    let namespaces: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client);
    namespaces
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}
