//! The cloud-node-lifecycle controller (canonical `cloud-node-lifecycle-controller`, alias
//! `cloud-node-lifecycle`; docs/upstream-compat.md#node-lifecycle-controller): every
//! `--node-monitor-period`, for every node: a Ready node loses the shutdown taint; a node that
//! is not Ready is deleted when its instance no longer exists in the cloud, and gets the
//! shutdown taint when its instance is shut down.
//!
//! Deliberate differences from upstream:
//! - the loop waits for the node cache to sync before its first pass (upstream starts at once
//!   and its first pass may see an empty cache; the outcome is the same, one period later);
//! - `getProviderID` with a V2 provider that returns nil metadata yields `""` (upstream
//!   dereferences nil).

use ccm_provider_abi::{ErrorKind, ProviderError};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::DeleteParams;
use kube::Api;

use super::node::{get_instance_provider_id, kube_error_text};
use super::{ControllerContext, NotStarted};
use crate::events::{node_ref, EventRecorder, EventType};
use crate::patches::{add_node_taint, remove_node_taint};
use crate::provider::Provider;

/// Canonical controller name.
pub const NAME: &str = "cloud-node-lifecycle-controller";
/// Alias (also the `running_managed_controllers` name).
pub const ALIAS: &str = "cloud-node-lifecycle";
/// Event source component.
pub const COMPONENT: &str = "cloud-node-lifecycle-controller";
/// The taint of nodes whose instance is shut down.
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Event reason of a deletion.
pub const DELETING_NODE: &str = "DeletingNode";
/// Event reason of a failed deletion.
pub const DELETING_NODE_FAILED: &str = "DeletingNodeFailed";

/// The shutdown taint: key, effect NoSchedule, nothing else.
pub fn shutdown_taint() -> Taint {
    Taint {
        key: SHUTDOWN_TAINT.into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    }
}

/// Start conditions: the provider must offer Instances or InstancesV2.
pub fn check(ctx: &ControllerContext) -> Result<(), NotStarted> {
    let caps = ctx.provider.capabilities();
    if !caps.instances && !caps.instances_v2 {
        return Err(NotStarted(
            "cloud provider does not support instances".into(),
        ));
    }
    Ok(())
}

/// Run until `ctx.stop` is cancelled: [`monitor_nodes`] every `node_monitor_period`, measured
/// from the end of one pass to the start of the next.
pub async fn run(ctx: ControllerContext) {
    tokio::select! {
        _ = ctx.stop.cancelled() => return,
        synced = ctx.nodes.wait_synced() => if !synced { return },
    }
    ctx.metrics.set_running(ALIAS, true);
    let recorder = ctx.recorder(COMPONENT);
    loop {
        tokio::select! {
            _ = ctx.stop.cancelled() => break,
            _ = monitor_nodes(&ctx, &recorder) => {}
        }
        tokio::select! {
            _ = ctx.stop.cancelled() => break,
            _ = tokio::time::sleep(ctx.config.node_monitor_period) => {}
        }
    }
    ctx.metrics.set_running(ALIAS, false);
}

fn ready_status(node: &Node) -> &str {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .map_or("Unknown", |c| c.status.as_str())
}

fn spec_provider_id(node: &Node) -> &str {
    node.spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .unwrap_or_default()
}

/// One pass over every cached node, sequentially (upstream `MonitorNodes`). No node is
/// excluded: control-plane, uninitialised and provider-ID-less nodes are all examined.
pub async fn monitor_nodes(ctx: &ControllerContext, recorder: &EventRecorder) {
    for node in ctx.nodes.list() {
        let name = node.metadata.name.clone().unwrap_or_default();
        if ready_status(&node) == "True" {
            // Ready nodes are never deleted, even when the cloud says the instance is gone.
            if let Err(e) =
                remove_node_taint(&ctx.client, &node, SHUTDOWN_TAINT, "NoSchedule").await
            {
                tracing::error!(controller = NAME, node = %name, "error patching node taints: {}", kube_error_text(&e));
            }
            continue;
        }
        let exists = match ensure_node_exists(&ctx.provider, &node).await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(controller = NAME, node = %name, "error checking if node {name} exists: {e}");
                continue;
            }
        };
        if !exists {
            tracing::info!(controller = NAME, node = %name, "deleting node since it is no longer present in cloud provider: {name}");
            recorder.publish(
                node_ref(&node),
                EventType::Normal,
                DELETING_NODE,
                format!("Deleting node {name} because it does not exist in the cloud provider"),
            );
            let api: Api<Node> = Api::all(ctx.client.clone());
            if let Err(e) = api.delete(&name, &DeleteParams::default()).await {
                let err = kube_error_text(&e);
                tracing::error!(controller = NAME, node = %name, "unable to delete node {name:?}: {err}");
                recorder.publish(
                    node_ref(&node),
                    EventType::Warning,
                    DELETING_NODE_FAILED,
                    format!("Failed deleting node {name}: {err}"),
                );
            }
            continue;
        }
        match shutdown_in_cloud_provider(&ctx.provider, &node).await {
            Ok(true) => {
                if let Err(e) = add_node_taint(&ctx.client, &name, &shutdown_taint()).await {
                    tracing::error!(controller = NAME, node = %name, "failed to apply shutdown taint to node {name}, it may have been deleted: {}", kube_error_text(&e));
                }
            }
            // Not shut down: the taint is only removed once the node is Ready again.
            Ok(false) => {}
            Err(e) => {
                tracing::error!(controller = NAME, node = %name, "error checking if node {name} is shutdown: {e}");
            }
        }
    }
}

/// Upstream `getProviderID`: the spec value; else (V2) the metadata's provider ID, which may be
/// `""`; else `GetInstanceProviderID` (InstanceNotFound propagated unchanged, other errors
/// wrapped "failed to get instance ID from cloud provider: …").
pub async fn get_provider_id(provider: &Provider, node: &Node) -> Result<String, ProviderError> {
    let pid = spec_provider_id(node);
    if !pid.is_empty() {
        return Ok(pid.to_string());
    }
    if provider.capabilities().instances_v2 {
        // Better than upstream: nil metadata is "no provider ID" instead of a nil dereference.
        return Ok(provider
            .instance_metadata(node)
            .await?
            .map(|m| m.provider_id)
            .unwrap_or_default());
    }
    get_instance_provider_id(provider, node.metadata.name.as_deref().unwrap_or_default()).await
}

/// The provider ID for legacy existence/shutdown checks: `Ok(None)` when the instance is not
/// found by name.
async fn legacy_provider_id(
    provider: &Provider,
    node: &Node,
) -> Result<Option<String>, ProviderError> {
    let pid = spec_provider_id(node);
    if !pid.is_empty() {
        return Ok(Some(pid.to_string()));
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    match get_instance_provider_id(provider, name).await {
        Ok(id) => Ok(Some(id)),
        Err(e) if e.kind() == ErrorKind::INSTANCE_NOT_FOUND => Ok(None),
        Err(e) => Err(e),
    }
}

/// Upstream `ensureNodeExistsByProviderID`.
pub async fn ensure_node_exists(provider: &Provider, node: &Node) -> Result<bool, ProviderError> {
    let caps = provider.capabilities();
    if caps.instances_v2 {
        return provider.instance_exists(node).await;
    }
    if !caps.instances {
        return Err(ProviderError::other(
            "instances interface not supported in the cloud provider",
        ));
    }
    match legacy_provider_id(provider, node).await? {
        None => Ok(false),
        Some(id) => provider.instance_exists_by_provider_id(&id).await,
    }
}

/// Upstream `shutdownInCloudProvider`.
pub async fn shutdown_in_cloud_provider(
    provider: &Provider,
    node: &Node,
) -> Result<bool, ProviderError> {
    let caps = provider.capabilities();
    if caps.instances_v2 {
        return provider.instance_shutdown(node).await;
    }
    if !caps.instances {
        return Err(ProviderError::other(
            "cloud provider does not support instances",
        ));
    }
    let Some(id) = legacy_provider_id(provider, node).await? else {
        return Ok(false);
    };
    match provider.instance_shutdown_by_provider_id(&id).await {
        Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => Ok(false),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn with_ready(status: Option<&str>) -> Node {
        Node {
            status: Some(NodeStatus {
                conditions: status.map(|s| {
                    vec![
                        NodeCondition {
                            type_: "MemoryPressure".into(),
                            status: "True".into(),
                            ..Default::default()
                        },
                        NodeCondition {
                            type_: "Ready".into(),
                            status: s.into(),
                            ..Default::default()
                        },
                    ]
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn ready_status_defaults_to_unknown() {
        assert_eq!(ready_status(&with_ready(Some("True"))), "True");
        assert_eq!(ready_status(&with_ready(Some("False"))), "False");
        assert_eq!(ready_status(&with_ready(None)), "Unknown");
        assert_eq!(ready_status(&Node::default()), "Unknown");
    }

    #[test]
    fn shutdown_taint_is_exact() {
        let t = shutdown_taint();
        assert_eq!(t.key, "node.cloudprovider.kubernetes.io/shutdown");
        assert_eq!(t.effect, "NoSchedule");
        assert_eq!(t.value, None);
        assert_eq!(t.time_added, None);
    }
}
