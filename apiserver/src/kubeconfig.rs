//! Kubeconfig generation for the in-memory server.

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

/// Context, cluster and user name used in generated kubeconfigs.
pub const CONTEXT: &str = "ccm-inmemory";

/// The bearer token of kubeconfigs for HTTPS (the server accepts any).
pub const TOKEN: &str = "kube-apiserver-inmem-accepts-any-token";

/// A kubeconfig whose current context points at `url`, with no credentials over HTTP; over
/// HTTPS (`ca_pem`: the server's CA) it trusts that CA and sends [`TOKEN`].
pub fn kubeconfig_for(url: &str, ca_pem: Option<&str>) -> Kubeconfig {
    use base64::Engine as _;
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: CONTEXT.into(),
            cluster: Some(Cluster {
                server: Some(url.to_string()),
                certificate_authority_data: ca_pem
                    .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem)),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: CONTEXT.into(),
            // Over HTTPS kubectl asks for a user name and password when the user has no
            // credentials at all; the server accepts any token, so one is named.
            auth_info: Some(AuthInfo {
                token: ca_pem.map(|_| TOKEN.to_string().into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        contexts: vec![NamedContext {
            name: CONTEXT.into(),
            context: Some(Context {
                cluster: CONTEXT.into(),
                user: Some(CONTEXT.into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        current_context: Some(CONTEXT.into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    }
}
