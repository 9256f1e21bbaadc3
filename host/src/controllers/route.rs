//! The route controller (canonical `node-route-controller`, alias `route`): makes the cloud's
//! pod-network routes match the nodes' `spec.podCIDRs` and reports the result in each node's
//! `NetworkUnavailable` condition (docs/upstream-compat.md#route-controller).
//!
//! Triggers (beyond upstream's default timer-only mode, like its alpha watch mode): node add,
//! delete, podCIDRs change or address change start a reconcile at once, but never more than one
//! per `--route-reconciliation-period`; a full pass also runs every period when nothing
//! happens, so drift in the cloud is repaired.
//!
//! Deliberate difference from upstream (docs/upstream-compat.md#route-controller): an empty or
//! invalid `--cluster-cidr` while routes are enabled is a clear start-up error naming the flag
//! and how to turn routes off, instead of a crash.
//!
//! Beyond upstream: a `CreateRoute` the cloud throttled (ABI 1.1 `THROTTLED`) gives the node a
//! `CloudProviderThrottled` Warning event instead of `FailedToCreateRoute`. There is no per-item
//! back-off to spare: the next reconcile (at most one period later) creates the route, its calls
//! waiting for the provider's pause.
//!
//! Beyond upstream, which starts a goroutine per route and per node condition at once: a pass
//! makes each cloud call's future only when one of the [`MAX_CONCURRENT_ROUTE_CALLS`] slots is
//! free, and writes at most [`CONDITION_UPDATES_IN_FLIGHT`] `NetworkUnavailable` conditions at a
//! time (the writes wait for the client's rate limit anyway). With every future made up front, a
//! first pass over 20,000 nodes held 20,000 route calls and 20,000 condition patches at once and
//! peaked near 800 MiB; a pass that created routes or wrote conditions for [`RELEASE_AFTER`] or
//! more nodes ends by returning the freed memory (`malloc_trim`).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use ccm_provider_abi::{ProviderError, Route};
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeAddress, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::{broadcast, Semaphore};

use super::{publish_throttled, Controller, ControllerContext, ControllerName, NotStarted, Start};
use crate::provider::Throttled;
use crate::runtime::events::{node_ref, EventRecorder, EventType};
use crate::runtime::informer::Change;
use crate::runtime::patches::patch_node_condition;
use crate::runtime::well_known::NETWORK_UNAVAILABLE_CONDITION;
use crate::runtime::CachedNode;

/// Canonical controller name.
pub const NAME: &str = "node-route-controller";
/// Alias.
pub const ALIAS: &str = "route";
/// Event source component (upstream spells it with an underscore).
pub const COMPONENT: &str = "route_controller";
/// Upstream's bound on concurrent cloud route calls.
const MAX_CONCURRENT_ROUTE_CALLS: usize = 200;
/// `NetworkUnavailable` writes in flight at once (beyond upstream, which starts one goroutine
/// per node): about the client's default burst (`--kube-api-burst` 30).
const CONDITION_UPDATES_IN_FLIGHT: usize = 32;
/// Route creations or condition writes in one pass from which the pass ends by returning the
/// freed memory to the system.
const RELEASE_AFTER: usize = 500;

/// Parse `--cluster-cidr` as upstream does: the whole value is trimmed, split on `,` (elements
/// are not trimmed), at most two CIDRs, and two only as one IPv4 plus one IPv6.
pub fn parse_cluster_cidrs(value: &str) -> Result<Vec<IpNet>, String> {
    let value = value.trim();
    if value.is_empty() {
        return Err("--cluster-cidr is empty".into());
    }
    let mut cidrs = Vec::new();
    for part in value.split(',') {
        let net: IpNet = part
            .parse()
            .map_err(|e| format!("--cluster-cidr: invalid CIDR {part:?}: {e}"))?;
        cidrs.push(net);
    }
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if a.addr().is_ipv4() != b.addr().is_ipv4() => Ok(cidrs),
        [_, _] => Err(format!(
            "--cluster-cidr {value:?} is not configured as dual stack: two CIDRs must be one IPv4 and one IPv6"
        )),
        _ => Err(format!("--cluster-cidr {value:?}: at most two CIDRs (one IPv4, one IPv6) are allowed")),
    }
}

/// The route controller in the start-up table ([`super::CONTROLLERS`]).
pub const CONTROLLER: Controller = Controller {
    name: ControllerName {
        canonical: NAME,
        alias: ALIAS,
        client: "route-controller",
    },
    start,
};

/// Start conditions (evaluated at start-up): routes configured (`--configure-cloud-routes`),
/// provider supports Routes (else skipped, as upstream), and a valid `--cluster-cidr` (else a
/// fatal start error).
fn start(ctx: &ControllerContext) -> Start {
    if !ctx.config.configure_cloud_routes {
        return Start::Skipped(NotStarted(
            "--configure-cloud-routes is set to false".into(),
        ));
    }
    if !ctx.provider.capabilities().routes {
        return Start::Skipped(NotStarted(
            "the cloud provider does not support routes".into(),
        ));
    }
    match parse_cluster_cidrs(&ctx.config.cluster_cidr) {
        Ok(cidrs) => Start::when(Ok(()), || run(ctx.clone(), cidrs)),
        Err(e) => Start::Fatal(format!(
            "the route controller needs the pod network range: {e}. Set --cluster-cidr (e.g. \
             10.244.0.0/16 or 10.244.0.0/16,fd00:10:244::/56), or turn routes off with \
             --configure-cloud-routes=false or --controllers=*,-route"
        )),
    }
}

/// Whether a node change should trigger a reconcile (upstream's watch-mode predicate).
pub fn should_reconcile(change: &Change<CachedNode>) -> bool {
    match change {
        Change::Added(_) | Change::Deleted(_) => true,
        Change::Updated { old, new } => {
            old.pod_cidrs() != new.pod_cidrs()
                || old.addresses() != new.addresses()
                || old.resource_version() == new.resource_version()
        }
    }
}

/// Run until `ctx.stop` is cancelled.
pub async fn run(ctx: ControllerContext, cluster_cidrs: Vec<IpNet>) {
    let recorder = ctx.recorder(COMPONENT);
    let period = ctx.config.route_reconciliation_period;
    let mut changes = ctx.nodes.subscribe();
    if !ctx.nodes.wait_synced().await {
        return;
    }
    ctx.metrics.set_running(ALIAS, true);
    let mut last_start: Option<Instant> = None;
    let mut pending = true; // first pass right after the cache syncs
    loop {
        if pending {
            // At most one reconcile per period, whatever the event rate.
            if let Some(start) = last_start {
                let next = start + period;
                tokio::select! {
                    _ = ctx.stop.cancelled() => break,
                    _ = tokio::time::sleep_until(next.into()) => {}
                }
            }
            pending = false;
            last_start = Some(Instant::now());
            match reconcile(&ctx, &recorder, &cluster_cidrs).await {
                Ok(()) => {}
                // Retried by the next reconcile, whose calls wait for the pause.
                Err(e) if Throttled::of(&e).is_some() => {
                    tracing::warn!(controller = NAME, "route reconciliation throttled: {e}");
                }
                Err(e) => tracing::error!(controller = NAME, "route reconciliation failed: {e}"),
            }
            continue;
        }
        let deadline = last_start.map_or_else(Instant::now, |s| s + period);
        tokio::select! {
            _ = ctx.stop.cancelled() => break,
            _ = tokio::time::sleep_until(deadline.into()) => pending = true,
            change = changes.recv() => match change {
                Ok(change) => pending = should_reconcile(&change),
                Err(broadcast::error::RecvError::Lagged(_)) => pending = true,
                Err(broadcast::error::RecvError::Closed) => break,
            },
        }
    }
    ctx.metrics.set_running(ALIAS, false);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Keep,
    Add,
    Update,
}

fn addresses_equal(a: &[NodeAddress], b: &[NodeAddress]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

/// Whether the controller owns `route`: its CIDR parses and its first or last address lies in
/// a cluster CIDR.
fn is_responsible(route: &Route, cluster_cidrs: &[IpNet]) -> Option<bool> {
    let net: IpNet = route.destination_cidr.parse().ok()?;
    let (first, last): (IpAddr, IpAddr) = (net.network(), net.broadcast());
    Some(
        cluster_cidrs
            .iter()
            .any(|c| c.contains(&first) || c.contains(&last)),
    )
}

/// One full reconcile: routes against nodes, then the NetworkUnavailable conditions. Only a
/// failure to list routes fails the pass; individual cloud errors are reported per route.
pub async fn reconcile(
    ctx: &ControllerContext,
    recorder: &EventRecorder,
    cluster_cidrs: &[IpNet],
) -> Result<(), ProviderError> {
    ctx.metrics.route_sync_total.inc();
    let cluster = ctx.config.cluster_name.clone();
    let routes = ctx.provider.list_routes(&cluster).await?;
    let nodes = ctx.nodes.list();

    let mut routes_by_node: HashMap<&str, Vec<&Route>> = HashMap::new();
    for r in &routes {
        if !r.target_node.is_empty() {
            routes_by_node
                .entry(r.target_node.as_str())
                .or_default()
                .push(r);
        }
    }

    // Per node with podCIDRs: the action for each of its CIDRs (ordered as in the spec).
    let mut actions: HashMap<String, Vec<(String, Action)>> = HashMap::new();
    for node in &nodes {
        let name = node.name().to_string();
        let cidrs = node.pod_cidrs().unwrap_or_default();
        if cidrs.is_empty() {
            continue;
        }
        let addrs = node.addresses().unwrap_or_default();
        let existing = routes_by_node.get(name.as_str());
        let mut per_node = Vec::new();
        for cidr in cidrs {
            let cidr = cidr.to_string();
            let action =
                match existing.and_then(|rs| rs.iter().find(|r| r.destination_cidr == cidr)) {
                    Some(r)
                        if !r.enable_node_addresses
                            || addresses_equal(&r.target_node_addresses, addrs) =>
                    {
                        Action::Keep
                    }
                    Some(_) => Action::Update,
                    None => Action::Add,
                };
            per_node.push((cidr, action));
        }
        actions.insert(name, per_node);
    }

    let limit = Arc::new(Semaphore::new(MAX_CONCURRENT_ROUTE_CALLS));

    // Deletions: the routes to delete, called at most MAX_CONCURRENT_ROUTE_CALLS at a time
    // (together with the creations). Each call's future is made when its turn comes, so the
    // memory of a pass does not grow with the number of routes (see the module documentation).
    let mut stale_routes = Vec::new();
    for route in &routes {
        match is_responsible(route, cluster_cidrs) {
            None => {
                tracing::warn!(controller = NAME, cidr = %route.destination_cidr, "ignoring route with an unparsable CIDR");
                continue;
            }
            Some(false) => continue,
            Some(true) => {}
        }
        let stale = match actions.get(&route.target_node) {
            None => true,
            Some(per_node) => match per_node.iter().find(|(c, _)| *c == route.destination_cidr) {
                None => true,
                Some((_, action)) => *action == Action::Update,
            },
        };
        if route.blackhole || stale {
            stale_routes.push(route.clone());
        }
    }
    let deletions = {
        let (provider, cluster, limit) = (ctx.provider.clone(), cluster.clone(), limit.clone());
        futures::stream::iter(stale_routes).for_each_concurrent(
            MAX_CONCURRENT_ROUTE_CALLS,
            move |route| {
                let (provider, cluster, limit) = (provider.clone(), cluster.clone(), limit.clone());
                async move {
                    let _permit = limit.acquire_owned().await;
                    let started = Instant::now();
                    match provider.delete_route(&cluster, &route).await {
                        Ok(()) => tracing::info!(
                            controller = NAME,
                            node = %route.target_node,
                            cidr = %route.destination_cidr,
                            blackhole = route.blackhole,
                            "deleted route after {:?}",
                            started.elapsed()
                        ),
                        Err(e) => tracing::error!(
                            controller = NAME,
                            node = %route.target_node,
                            cidr = %route.destination_cidr,
                            "could not delete route: {e}"
                        ),
                    }
                }
            },
        )
    };
    let deletions = tokio::spawn(tracing::Instrument::in_current_span(deletions));
    // Address-aware providers: never create before the stale route is gone.
    let serialise = routes.first().is_some_and(|r| r.enable_node_addresses);
    let mut deletions = Some(deletions);
    if serialise {
        if let Some(d) = deletions.take() {
            let _ = d.await;
        }
    }

    // Creations, made lazily and bounded as the deletions.
    let by_name: HashMap<&str, &Arc<CachedNode>> = nodes.iter().map(|n| (n.name(), n)).collect();
    let mut to_create: Vec<(Arc<CachedNode>, usize, String)> = Vec::new();
    for (name, per_node) in &actions {
        let Some(node) = by_name.get(name.as_str()) else {
            continue;
        };
        for (index, (cidr, action)) in per_node.iter().enumerate() {
            if *action != Action::Keep {
                to_create.push((Arc::clone(node), index, cidr.clone()));
            }
        }
    }
    let created: Vec<(String, usize, bool)> = futures::stream::iter(to_create)
        .map(|(node, index, cidr)| {
            let (provider, cluster, limit, recorder) = (
                ctx.provider.clone(),
                cluster.clone(),
                limit.clone(),
                recorder.clone(),
            );
            async move {
                let route = Route {
                    target_node: node.name().to_string(),
                    target_node_addresses: node.addresses().unwrap_or_default().to_vec(),
                    destination_cidr: cidr,
                    ..Default::default()
                };
                let uid = node.uid().unwrap_or_default().to_string();
                let _permit = limit.acquire_owned().await;
                let started = Instant::now();
                match provider.create_route(&cluster, &uid, &route).await {
                    Ok(()) => {
                        tracing::info!(controller = NAME, node = %route.target_node, cidr = %route.destination_cidr, "created route after {:?}", started.elapsed());
                        (route.target_node, index, true)
                    }
                    Err(e) => {
                        if let Some(throttled) = Throttled::of(&e) {
                            publish_throttled(&recorder, node_ref(&node), &throttled);
                            return (route.target_node, index, false);
                        }
                        let msg = format!(
                            "Could not create route {uid} {} for node {} after {}: {e}",
                            route.destination_cidr,
                            route.target_node,
                            crate::runtime::duration::format(started.elapsed())
                        );
                        tracing::error!(controller = NAME, "{msg}");
                        recorder.publish(node_ref(&node), EventType::Warning, "FailedToCreateRoute", msg);
                        (route.target_node, index, false)
                    }
                }
            }
        })
        .buffer_unordered(MAX_CONCURRENT_ROUTE_CALLS)
        .collect()
        .await;
    let busy = created.len() >= RELEASE_AFTER;
    for (node, index, ok) in created {
        if ok {
            if let Some(per_node) = actions.get_mut(&node) {
                per_node[index].1 = Action::Keep;
            }
        }
    }
    if let Some(d) = deletions.take() {
        let _ = d.await;
    }

    // Conditions: CONDITION_UPDATES_IN_FLIGHT at a time. The writes go through the client's
    // rate limit (`--kube-api-qps`); more in flight would only wait there, each holding its
    // request, which with every node's condition to write was most of a large pass's memory.
    let routed: HashSet<&str> = routes_by_node.keys().copied().collect();
    let mut to_update: Vec<(Arc<CachedNode>, bool)> = Vec::new();
    for node in &nodes {
        let name = node.name();
        let unavailable = match actions.get(name) {
            Some(per_node) => per_node.iter().any(|(_, a)| *a != Action::Keep),
            None if routed.contains(name) => true,
            None => continue,
        };
        to_update.push((Arc::clone(node), unavailable));
    }
    let updates = futures::stream::iter(to_update)
        .map(|(node, unavailable)| {
            let client = ctx.client.clone();
            async move {
                let name = node.name();
                match update_network_condition(&client, &node, unavailable).await {
                    Err(e) => {
                        tracing::error!(controller = NAME, node = %name, "could not update NetworkUnavailable: {e}");
                        false
                    }
                    Ok(wrote) => wrote,
                }
            }
        })
        .buffer_unordered(CONDITION_UPDATES_IN_FLIGHT)
        .fold(0usize, |n, wrote| async move { n + usize::from(wrote) })
        .await;
    if busy || updates >= RELEASE_AFTER {
        // A pass that created routes or wrote conditions for many nodes freed as much; give
        // the pages back instead of keeping them as the process's new floor.
        crate::runtime::malloc::release_free_memory();
    }
    Ok(())
}

/// The `NetworkUnavailable` condition the controller would write, or `None` when the existing
/// condition already says so with the controller's own reason (upstream's skip rules: a
/// condition set by someone else, e.g. a CNI's `CalicoIsUp`, is overwritten).
pub fn desired_condition(node: &CachedNode, unavailable: bool, now: Time) -> Option<NodeCondition> {
    let existing = node.condition(NETWORK_UNAVAILABLE_CONDITION);
    if let Some(c) = existing {
        let reason = c.reason.as_deref().unwrap_or("");
        if !unavailable && c.status == "False" && reason == "RouteCreated" {
            return None;
        }
        if unavailable && c.status == "True" && reason == "NoRouteCreated" {
            return None;
        }
    }
    let (status, reason, message) = if unavailable {
        (
            "True",
            "NoRouteCreated",
            "RouteController failed to create a route",
        )
    } else {
        ("False", "RouteCreated", "RouteController created a route")
    };
    Some(NodeCondition {
        type_: NETWORK_UNAVAILABLE_CONDITION.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_transition_time: Some(now.clone()),
        last_heartbeat_time: Some(now),
    })
}

async fn update_network_condition(
    client: &kube::Client,
    node: &CachedNode,
    unavailable: bool,
) -> Result<bool, kube::Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let Some(condition) = desired_condition(node, unavailable, now) else {
        return Ok(false);
    };
    patch_node_condition(client, node.name(), &condition).await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(node: &str, cidr: &str) -> Route {
        Route {
            target_node: node.into(),
            destination_cidr: cidr.into(),
            ..Default::default()
        }
    }

    #[test]
    fn cluster_cidr_parsing_matches_upstream() {
        assert_eq!(parse_cluster_cidrs(" 10.244.0.0/16 ").unwrap().len(), 1);
        assert_eq!(
            parse_cluster_cidrs("10.244.0.0/16,fd00::/56")
                .unwrap()
                .len(),
            2
        );
        assert!(parse_cluster_cidrs("10.244.0.0/16, fd00::/56")
            .unwrap_err()
            .contains("invalid CIDR"));
        assert!(parse_cluster_cidrs("10.0.0.0/16,10.1.0.0/16")
            .unwrap_err()
            .contains("not configured as dual stack"));
        assert!(parse_cluster_cidrs("10.0.0.0/16,fd00::/56,10.2.0.0/16")
            .unwrap_err()
            .contains("at most two"));
        assert!(parse_cluster_cidrs("").unwrap_err().contains("empty"));
        assert!(
            parse_cluster_cidrs("10.0.0.1").is_err(),
            "a bare IP is not a CIDR"
        );
    }

    #[test]
    fn responsibility_uses_first_or_last_address() {
        let cluster = parse_cluster_cidrs("10.120.0.0/14,fd00:10:244::/56").unwrap();
        assert_eq!(
            is_responsible(&route("n", "10.120.0.0/24"), &cluster),
            Some(true)
        );
        assert_eq!(
            is_responsible(&route("n", "10.123.255.0/24"), &cluster),
            Some(true)
        );
        assert_eq!(
            is_responsible(&route("n", "10.124.0.0/24"), &cluster),
            Some(false)
        );
        assert_eq!(
            is_responsible(&route("n", "10.119.255.0/24"), &cluster),
            Some(false)
        );
        // Upstream looks only at the range's first and last address: a wider range that merely
        // contains the cluster CIDR is not ours.
        assert_eq!(
            is_responsible(&route("n", "10.112.0.0/12"), &cluster),
            Some(false)
        );
        assert_eq!(
            is_responsible(&route("n", "fd00:10:244::/64"), &cluster),
            Some(true)
        );
        assert_eq!(
            is_responsible(&route("n", "fd00:10:245::/64"), &cluster),
            Some(false)
        );
        assert_eq!(is_responsible(&route("n", "garbage"), &cluster), None);
    }

    #[test]
    fn condition_skip_rules_and_calico_override() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let node_with = |status: &str, reason: &str| -> CachedNode {
            serde_json::from_value::<k8s_openapi::api::core::v1::Node>(serde_json::json!({
                "metadata": {"name": "n"},
                "status": {"conditions": [{"type": "NetworkUnavailable", "status": status, "reason": reason}]}
            }))
            .unwrap()
            .into()
        };
        assert!(
            desired_condition(&node_with("False", "RouteCreated"), false, now.clone()).is_none()
        );
        assert!(
            desired_condition(&node_with("True", "NoRouteCreated"), true, now.clone()).is_none()
        );
        let calico =
            desired_condition(&node_with("False", "CalicoIsUp"), false, now.clone()).unwrap();
        assert_eq!(calico.reason.as_deref(), Some("RouteCreated"));
        assert_eq!(
            calico.message.as_deref(),
            Some("RouteController created a route")
        );
        assert_eq!(calico.status, "False");
        let flip =
            desired_condition(&node_with("False", "RouteCreated"), true, now.clone()).unwrap();
        assert_eq!(
            (flip.status.as_str(), flip.reason.as_deref()),
            ("True", Some("NoRouteCreated"))
        );
        let fresh = desired_condition(&CachedNode::default(), false, now.clone()).unwrap();
        assert_eq!(fresh.last_transition_time, Some(now.clone()));
        assert_eq!(fresh.last_heartbeat_time, Some(now));
    }

    #[test]
    fn update_predicate() {
        let node = |rv: &str, cidr: &str, image: &str| -> Arc<CachedNode> {
            Arc::new(
                serde_json::from_value::<k8s_openapi::api::core::v1::Node>(serde_json::json!({
                    "metadata": {"name": "n", "resourceVersion": rv},
                    "spec": {"podCIDRs": [cidr]},
                    "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}], "images": [{"names": [image]}]}
                }))
                .unwrap()
                .into(),
            )
        };
        let upd = |old, new| Change::Updated { old, new };
        assert!(should_reconcile(&upd(
            node("1", "10.0.0.0/24", "a"),
            node("2", "10.0.1.0/24", "a")
        )));
        assert!(
            should_reconcile(&upd(
                node("1", "10.0.0.0/24", "a"),
                node("1", "10.0.0.0/24", "a")
            )),
            "resync"
        );
        assert!(!should_reconcile(&upd(
            node("1", "10.0.0.0/24", "a"),
            node("2", "10.0.0.0/24", "b")
        )));
        assert!(should_reconcile(&Change::Added(node(
            "1",
            "10.0.0.0/24",
            "a"
        ))));
    }
}
