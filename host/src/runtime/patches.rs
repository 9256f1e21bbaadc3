//! The API write helpers upstream controllers use, with the same wire behaviour
//! (docs/upstream-compat.md#api-writes): label patch, taint patch with optimistic
//! concurrency, node status (addresses) patch with `$patch: replace`, node condition patch, and
//! service patches through the `status` subresource.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, Service, Taint};

use crate::runtime::cached_node::CachedNode;
use kube::api::{GetParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// Retries of label/taint/condition writes on Conflict (upstream: 5 steps, 100 ms, jitter 1.0).
const CONFLICT_RETRIES: u32 = 5;
const CONFLICT_BASE: Duration = Duration::from_millis(100);

/// True for a 409 Conflict from the API server.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// True for a 404 Not Found from the API server.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

async fn conflict_backoff(attempt: u32) {
    // Jitter 1.0: wait between base and 2 x base.
    let jitter = f64::from(std::process::id().wrapping_add(attempt) % 100) / 100.0;
    tokio::time::sleep(CONFLICT_BASE.mul_f64(1.0 + jitter)).await;
}

fn strategic() -> PatchParams {
    PatchParams::default()
}

/// Patch only the given labels of a node (strategic merge, no resourceVersion precondition),
/// retried on Conflict. Nothing is sent when `labels` is empty.
pub async fn patch_node_labels(
    client: &Client,
    node_name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    if labels.is_empty() {
        return Ok(());
    }
    let api: Api<Node> = Api::all(client.clone());
    let body = json!({"metadata": {"labels": labels}});
    let mut attempt = 0;
    loop {
        match api
            .patch(node_name, &strategic(), &Patch::Strategic(&body))
            .await
        {
            Err(e) if is_conflict(&e) && attempt + 1 < CONFLICT_RETRIES => {
                attempt += 1;
                conflict_backoff(attempt).await;
            }
            other => return other.map(|_| ()),
        }
    }
}

fn same_key_effect(t: &Taint, key: &str, effect: &str) -> bool {
    t.key == key && t.effect == effect
}

async fn update_taints(
    client: &Client,
    node_name: &str,
    change: impl Fn(&[Taint]) -> Option<Vec<Taint>>,
) -> Result<bool, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut attempt = 0;
    loop {
        // First try from the API server's cache (resourceVersion=0), retries read fresh.
        let node = if attempt == 0 {
            api.get_with(node_name, &GetParams::any()).await?
        } else {
            api.get(node_name).await?
        };
        let current = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let Some(new) = change(&current) else {
            return Ok(false);
        };
        let body = json!({
            "metadata": {"resourceVersion": node.metadata.resource_version},
            "spec": {"taints": new},
        });
        match api
            .patch(node_name, &strategic(), &Patch::Strategic(&body))
            .await
        {
            Ok(_) => return Ok(true),
            Err(e) if is_conflict(&e) && attempt + 1 < CONFLICT_RETRIES => {
                attempt += 1;
                conflict_backoff(attempt).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Add `taint` (replacing a taint with the same key and effect unless identical). The whole
/// taint list is written with the node's resourceVersion as a precondition; no call is made
/// when nothing changes. Returns whether the node was patched.
pub async fn add_node_taint(
    client: &Client,
    node_name: &str,
    taint: &Taint,
) -> Result<bool, kube::Error> {
    update_taints(client, node_name, |current| {
        let mut new: Vec<Taint> = Vec::with_capacity(current.len() + 1);
        let mut found = false;
        for t in current {
            if same_key_effect(t, &taint.key, &taint.effect) {
                if found {
                    continue;
                }
                found = true;
                if t.value == taint.value && t.time_added == taint.time_added {
                    return None;
                }
                new.push(taint.clone());
            } else {
                new.push(t.clone());
            }
        }
        if !found {
            new.push(taint.clone());
        }
        Some(new)
    })
    .await
}

/// Remove every taint with `key` and `effect`. Short-circuits without any API call when `node`
/// (the caller's cached copy) has no such taint. Returns whether the node was patched.
pub async fn remove_node_taint(
    client: &Client,
    node: &CachedNode,
    key: &str,
    effect: &str,
) -> Result<bool, kube::Error> {
    let has = node
        .taints()
        .iter()
        .any(|t| same_key_effect(t, key, effect));
    if !has {
        return Ok(false);
    }
    let name = node.name().to_string();
    update_taints(client, &name, |current| {
        if !current.iter().any(|t| same_key_effect(t, key, effect)) {
            return None;
        }
        Some(
            current
                .iter()
                .filter(|t| !same_key_effect(t, key, effect))
                .cloned()
                .collect(),
        )
    })
    .await
}

/// Write `status.addresses` through the status subresource. When the list differs from the old
/// one (even an empty one), it is replaced wholesale (a trailing `{"$patch":"replace"}`
/// element), because the default merge-by-type of addresses would mangle it: two addresses of
/// one type (dual-stack InternalIPs) would collapse into one (k8s.io/api: "use a
/// full-replacement patch", kubernetes PR 79391).
pub async fn patch_node_addresses(
    client: &Client,
    node_name: &str,
    old: &[NodeAddress],
    new: &[NodeAddress],
) -> Result<(), kube::Error> {
    let mut list: Vec<Value> = new
        .iter()
        .map(|a| json!({"type": a.type_, "address": a.address}))
        .collect();
    if old != new {
        list.push(json!({"$patch": "replace"}));
    }
    let body = json!({"status": {"addresses": list}});
    let api: Api<Node> = Api::all(client.clone());
    api.patch_status(node_name, &strategic(), &Patch::Strategic(&body))
        .await
        .map(|_| ())
}

/// Write one node condition (merged by `type` on the server), retried on Conflict.
pub async fn patch_node_condition(
    client: &Client,
    node_name: &str,
    condition: &NodeCondition,
) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let body = json!({"status": {"conditions": [condition]}});
    let mut attempt = 0;
    loop {
        match api
            .patch_status(node_name, &strategic(), &Patch::Strategic(&body))
            .await
        {
            Err(e) if is_conflict(&e) && attempt + 1 < CONFLICT_RETRIES => {
                attempt += 1;
                conflict_backoff(attempt).await;
            }
            other => return other.map(|_| ()),
        }
    }
}

/// Strategic-merge patch of a Service through `services/status` (upstream sends both
/// finalizer and `status.loadBalancer` changes there), no resourceVersion precondition.
pub async fn patch_service_status(
    client: &Client,
    svc: &Service,
    body: &Value,
) -> Result<Service, kube::Error> {
    let ns = svc.metadata.namespace.as_deref().unwrap_or("default");
    let name = svc.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    api.patch_status(name, &strategic(), &Patch::Strategic(body))
        .await
}
