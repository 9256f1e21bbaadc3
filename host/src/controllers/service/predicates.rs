//! The pure decisions of the service controller (docs/upstream-compat.md#service-controller):
//! which services want a load balancer, `needsCleanup`, `needsUpdate`, the node predicates
//! (with Go's `strconv.ParseBool`), node-set comparison, status equality and the node-name
//! formatting of the `UpdateLoadBalancerFailed` event.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, PortStatus, Service, ServicePort,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::controllers::ControllerConfig;
use crate::runtime::well_known::{
    EXCLUDE_LB_LABEL, LB_CLEANUP_FINALIZER, READY_CONDITION, TO_BE_DELETED_TAINT,
};
use crate::runtime::{CachedNode, NodeRef};

/// At most this many node names appear in an `UpdateLoadBalancerFailed` event.
pub const MAX_NODE_NAMES_TO_LOG: usize = 20;

/// Which services this host provisions load balancers for.
///
/// Upstream (the default): `type: LoadBalancer` without `spec.loadBalancerClass`. Beyond
/// upstream, `--load-balancer-class` adds classes, and `--ignore-classless-services` drops the
/// classless ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassPolicy {
    /// Classes handled in addition to classless services.
    pub classes: Vec<String>,
    /// Leave classless services to another controller.
    pub ignore_classless: bool,
}

impl ClassPolicy {
    /// The policy of `config`.
    pub fn from_config(config: &ControllerConfig) -> Self {
        Self {
            classes: config.load_balancer_classes.clone(),
            ignore_classless: config.ignore_classless_services,
        }
    }

    /// Upstream `wantsLoadBalancer`, extended by the class routing.
    pub fn wants_load_balancer(&self, svc: &Service) -> bool {
        let Some(spec) = svc.spec.as_ref() else {
            return false;
        };
        if spec.type_.as_deref() != Some("LoadBalancer") {
            return false;
        }
        match spec.load_balancer_class.as_deref() {
            None => !self.ignore_classless,
            Some(class) => self.classes.iter().any(|c| c == class),
        }
    }

    /// Whether the class of `svc` (or its lack of one) is this policy's, whatever its type.
    pub fn claims(&self, svc: &Service) -> bool {
        match svc
            .spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref())
        {
            None => !self.ignore_classless,
            Some(class) => self.classes.iter().any(|c| c == class),
        }
    }
}

/// Whether `svc` carries the load-balancer cleanup finalizer.
pub fn has_lb_finalizer(svc: &Service) -> bool {
    svc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == LB_CLEANUP_FINALIZER))
}

/// Whether `svc` shows a load-balancer ingress.
pub fn has_lb_ingress(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|ingress| !ingress.is_empty())
}

/// Upstream `needsCleanup`: the finalizer is present and the service is being deleted or is no
/// longer of type LoadBalancer.
pub fn needs_cleanup(svc: &Service) -> bool {
    if !has_lb_finalizer(svc) {
        return false;
    }
    if svc.metadata.deletion_timestamp.is_some() {
        return true;
    }
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer")
}

fn s(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or_default()
}

fn target_port(p: &ServicePort) -> IntOrString {
    // Go's zero IntOrString is the integer 0.
    p.target_port.clone().unwrap_or(IntOrString::Int(0))
}

fn port_equal_for_lb(x: &ServicePort, y: &ServicePort) -> bool {
    s(&x.name) == s(&y.name)
        && s(&x.protocol) == s(&y.protocol)
        && x.port == y.port
        && x.node_port.unwrap_or(0) == y.node_port.unwrap_or(0)
        && target_port(x) == target_port(y)
        && x.app_protocol == y.app_protocol
}

/// Upstream `needsUpdate`: whether a change of a service matters to its load balancer.
pub fn needs_update(policy: &ClassPolicy, old: &Service, new: &Service) -> bool {
    let (old_wants, new_wants) = (
        policy.wants_load_balancer(old),
        policy.wants_load_balancer(new),
    );
    if !old_wants && !new_wants {
        return false;
    }
    if old_wants != new_wants {
        return true;
    }
    let default = Default::default();
    let o = old.spec.as_ref().unwrap_or(&default);
    let n = new.spec.as_ref().unwrap_or(&default);
    // reflect.DeepEqual: nil and empty differ.
    if new_wants && o.load_balancer_source_ranges != n.load_balancer_source_ranges {
        return true;
    }
    let no_ports = Vec::new();
    let (op, np) = (
        o.ports.as_ref().unwrap_or(&no_ports),
        n.ports.as_ref().unwrap_or(&no_ports),
    );
    if op.len() != np.len() || op.iter().zip(np).any(|(x, y)| !port_equal_for_lb(x, y)) {
        return true;
    }
    if s(&o.session_affinity) != s(&n.session_affinity) {
        return true;
    }
    if o.session_affinity_config != n.session_affinity_config {
        return true;
    }
    if s(&o.load_balancer_ip) != s(&n.load_balancer_ip) {
        return true;
    }
    let (oe, ne) = (
        o.external_ips.as_deref().unwrap_or_default(),
        n.external_ips.as_deref().unwrap_or_default(),
    );
    if oe != ne {
        return true;
    }
    if old.metadata.annotations != new.metadata.annotations {
        return true;
    }
    if s(&old.metadata.uid) != s(&new.metadata.uid) {
        return true;
    }
    if s(&o.external_traffic_policy) != s(&n.external_traffic_policy) {
        return true;
    }
    if o.health_check_node_port.unwrap_or(0) != n.health_check_node_port.unwrap_or(0) {
        return true;
    }
    let families = |v: &Option<Vec<String>>| v.as_ref().map_or(0, Vec::len);
    families(&o.ip_families) != families(&n.ip_families)
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Upstream `nodeIncludedPredicate`: a node is excluded when the exclusion label is present and
/// its value is not a Go boolean or is true.
pub fn node_included(node: &CachedNode) -> bool {
    match node.label(EXCLUDE_LB_LABEL) {
        None => true,
        Some(v) => parse_go_bool(v) == Some(false),
    }
}

/// Upstream `nodeUnTaintedPredicate`: no `ToBeDeletedByClusterAutoscaler` taint.
pub fn node_untainted(node: &CachedNode) -> bool {
    !node.taints().iter().any(|t| t.key == TO_BE_DELETED_TAINT)
}

/// Upstream `nodeReadyPredicate` (part of `allNodePredicates`, not of LB host sets).
pub fn node_ready(node: &CachedNode) -> bool {
    node.condition(READY_CONDITION)
        .is_some_and(|c| c.status == "True")
}

/// Upstream `nodeNotDeletedPredicate`.
pub fn node_not_deleted(node: &CachedNode) -> bool {
    node.deletion_timestamp().is_none()
}

/// Upstream `stableNodeSetPredicates`: every LB host list is filtered with these.
pub fn stable_node_set(node: &CachedNode) -> bool {
    node_not_deleted(node) && node_included(node) && node_untainted(node)
}

/// Upstream `allNodePredicates` (included, untainted, Ready); kept for parity, unused for hosts.
pub fn all_node_predicates(node: &CachedNode) -> bool {
    node_included(node) && node_untainted(node) && node_ready(node)
}

/// Upstream `shouldSyncUpdatedNode`: only an exclusion flip or a providerID change.
pub fn should_sync_updated_node(old: &CachedNode, new: &CachedNode) -> bool {
    if node_included(old) != node_included(new) {
        return true;
    }
    let pid = |n: &CachedNode| n.provider_id().unwrap_or_default().to_string();
    pid(old) != pid(new)
}

/// Upstream `nodesSufficientlyEqual`: same size and same name -> providerID mapping.
pub fn nodes_sufficiently_equal(old: &[Arc<CachedNode>], new: &[Arc<CachedNode>]) -> bool {
    if old.len() != new.len() {
        return false;
    }
    fn distill(nodes: &[Arc<CachedNode>]) -> std::collections::BTreeMap<&str, &str> {
        nodes
            .iter()
            .map(|n| (n.name(), n.provider_id().unwrap_or_default()))
            .collect()
    }
    distill(old) == distill(new)
}

/// Upstream `loggableNodeNames`: the sorted names of the first 20 nodes, then `<K more>`.
pub fn loggable_node_names<N: NodeRef>(nodes: &[N]) -> Vec<String> {
    let names = |ns: &[N]| -> Vec<String> {
        ns.iter()
            .map(|n| n.node_name().to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    };
    if nodes.len() > MAX_NODE_NAMES_TO_LOG {
        let mut out = names(&nodes[..MAX_NODE_NAMES_TO_LOG]);
        out.push(format!("<{} more>", nodes.len() - MAX_NODE_NAMES_TO_LOG));
        out
    } else {
        names(nodes)
    }
}

/// Go's `%v` of a `[]string`: `[a b c]`.
pub fn go_string_list(items: &[String]) -> String {
    format!("[{}]", items.join(" "))
}

/// The `UpdateLoadBalancerFailed` event message.
pub fn update_failed_message<N: NodeRef>(hosts: &[N], err: &impl std::fmt::Display) -> String {
    format!(
        "Error updating load balancer with new hosts {} [node names limited, total number of nodes: {}], error: {}",
        go_string_list(&loggable_node_names(hosts)),
        hosts.len(),
        err
    )
}

fn port_status_equal(a: &PortStatus, b: &PortStatus) -> bool {
    a.port == b.port && a.protocol == b.protocol && a.error == b.error
}

fn ingress_equal(a: &LoadBalancerIngress, b: &LoadBalancerIngress) -> bool {
    let no_ports = Vec::new();
    let (ap, bp) = (
        a.ports.as_ref().unwrap_or(&no_ports),
        b.ports.as_ref().unwrap_or(&no_ports),
    );
    s(&a.ip) == s(&b.ip)
        && s(&a.hostname) == s(&b.hostname)
        && a.ip_mode == b.ip_mode
        && ap.len() == bp.len()
        && ap.iter().zip(bp).all(|(x, y)| port_status_equal(x, y))
}

/// Upstream `LoadBalancerStatusEqual` (semantic deep equality of the ingress lists: nil and
/// empty are equal; ip, hostname, ipMode and ports are significant).
pub fn load_balancer_status_equal(
    a: Option<&LoadBalancerStatus>,
    b: Option<&LoadBalancerStatus>,
) -> bool {
    let no_ingress = Vec::new();
    let ingress = |s: Option<&LoadBalancerStatus>| {
        s.and_then(|s| s.ingress.as_ref())
            .map_or(&no_ingress, |v| v)
            .clone()
    };
    let (ai, bi) = (ingress(a), ingress(b));
    ai.len() == bi.len() && ai.iter().zip(&bi).all(|(x, y)| ingress_equal(x, y))
}

/// client-go `SplitMetaNamespaceKey`: `name` or `namespace/name`.
pub fn split_key(key: &str) -> Result<(String, String), String> {
    let parts: Vec<&str> = key.split('/').collect();
    match parts.as_slice() {
        [name] => Ok((String::new(), (*name).to_string())),
        [ns, name] => Ok(((*ns).to_string(), (*name).to_string())),
        _ => Err(format!("unexpected key format: {key:?}")),
    }
}

#[cfg(test)]
mod tests;
