//! Kubeconfig generation for the in-memory server.

use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

/// Context, cluster and user name used in generated kubeconfigs.
pub const CONTEXT: &str = "ccm-inmemory";

/// A kubeconfig whose current context points at `url` with no credentials.
pub fn kubeconfig_for(url: &str) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: CONTEXT.into(),
            cluster: Some(Cluster {
                server: Some(url.to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: CONTEXT.into(),
            auth_info: Some(AuthInfo::default()),
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
