//! Watching the scene converge: what the cluster looks like now, measured against what the
//! controllers are expected to do with it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::api::ListParams;
use kube::{Api, Client};

use super::scene::Scene;
use ccm_host::controllers::service::predicates::{has_lb_finalizer, ClassPolicy};
use ccm_host::runtime::ownership::{Owner, Ownership};
use ccm_host::runtime::well_known::{
    LB_PROVIDER_ANNOTATION, NETWORK_UNAVAILABLE_CONDITION, UNINITIALIZED_TAINT,
};
use ccm_host::runtime::CachedNode;

/// What one provider's controllers are expected to do, from the enabled controllers, the flags
/// and the provider's capabilities; each `Err` says why a part is not expected.
#[derive(Debug, Clone)]
pub struct ProviderExpectations {
    /// Registered name.
    pub name: String,
    /// Its nodes get initialised (cloud-node controller running).
    pub nodes: Result<(), String>,
    /// Its nodes get a route and `NetworkUnavailable=False`.
    pub routes: Result<(), String>,
    /// The services it serves get a load balancer.
    pub load_balancers: Result<(), String>,
    /// Which services its service controller serves.
    pub policy: ClassPolicy,
    /// It declares that Services may share a load-balancer address (ABI 1.1
    /// `LB_SHARED_ADDRESSES`); otherwise two of its Services on one address are not converged,
    /// as `ccm-host check`'s `lb-distinct` rule says.
    pub shared_addresses: bool,
}

/// Who is expected to own a node of the scene.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedOwner {
    /// The provider with this index.
    Provider(usize),
    /// A platform no provider owns: the node must stay untouched.
    Foreign,
}

/// What the controllers are expected to do with the scene.
#[derive(Debug, Clone)]
pub struct Expectations {
    /// Per provider, in `--cloud-provider` order (at least one; the first is the default).
    pub providers: Vec<ProviderExpectations>,
    /// Who owns which node (ccm_host::runtime::ownership, with the daemon's platforms).
    pub ownership: Ownership,
    /// The expected owner of each scene node, in scene order.
    pub node_owners: Vec<ExpectedOwner>,
}

impl Expectations {
    /// One provider that owns every node of a scene of `nodes` nodes (ownership not enforced),
    /// as upstream runs.
    pub fn single(provider: ProviderExpectations, nodes: usize) -> Expectations {
        let ownership = Ownership::new(
            &[(
                provider.name.clone(),
                vec![ccm_host::runtime::ownership::platform_prefix(
                    &provider.name,
                )],
            )],
            false,
        )
        .expect("one provider's own platform is valid");
        Expectations {
            providers: vec![provider],
            ownership,
            node_owners: vec![ExpectedOwner::Provider(0); nodes],
        }
    }

    /// Several providers (or one that owns only its platforms): nodes have owners to show.
    pub fn hybrid(&self) -> bool {
        self.providers.len() > 1 || self.ownership.enforced()
    }

    /// The provider that serves `svc` (the first whose classes take it), if any.
    pub fn server_of(&self, svc: &Service) -> Option<usize> {
        self.providers
            .iter()
            .position(|p| p.policy.wants_load_balancer(svc))
    }

    /// Who owns `node` now: a provider's name, `foreign` or `unclaimed`.
    pub fn owner_name(&self, node: &Node) -> String {
        if !self.ownership.enforced() {
            return self.providers[0].name.clone();
        }
        match self.ownership.owner(&CachedNode::from(node.clone())) {
            Owner::Provider(i) => self.providers[i].name.clone(),
            Owner::Foreign => "foreign".into(),
            Owner::Unclaimed => "unclaimed".into(),
        }
    }

    /// A part over all providers: on if any provider's is (the first reason otherwise).
    fn any(&self, part: impl Fn(&ProviderExpectations) -> &Result<(), String>) -> bool {
        self.providers.iter().any(|p| part(p).is_ok())
    }

    /// Node initialisation, over all providers: `on`, `off: why` (one provider), or each
    /// provider's (`on (fake, metal)`, `on (fake); off (metal: why)`).
    pub fn describe(&self, part: impl Fn(&ProviderExpectations) -> &Result<(), String>) -> String {
        if let [only] = self.providers.as_slice() {
            return on_off(part(only));
        }
        let on: Vec<&str> = self
            .providers
            .iter()
            .filter(|p| part(p).is_ok())
            .map(|p| p.name.as_str())
            .collect();
        let off: Vec<String> = self
            .providers
            .iter()
            .filter_map(|p| {
                part(p)
                    .as_ref()
                    .err()
                    .map(|why| format!("{}: {why}", p.name))
            })
            .collect();
        let mut parts = Vec::new();
        if !on.is_empty() {
            parts.push(format!("on ({})", on.join(", ")));
        }
        if !off.is_empty() {
            parts.push(format!("off ({})", off.join("; ")));
        }
        parts.join("; ")
    }
}

/// `on`, or `off: <why>`.
pub fn on_off(r: &Result<(), String>) -> String {
    match r {
        Ok(()) => "on".into(),
        Err(why) => format!("off: {why}"),
    }
}

/// The cluster as listed at one moment.
#[derive(Debug, Default, Clone)]
pub struct Observation {
    /// Every node.
    pub nodes: Vec<Node>,
    /// Every service.
    pub services: Vec<Service>,
    /// Every core/v1 event.
    pub events: Vec<Event>,
}

impl Observation {
    /// List nodes, services and events.
    pub async fn take(client: &Client) -> Result<Observation, kube::Error> {
        let lp = ListParams::default();
        let (node_api, service_api, event_api) = (
            Api::<Node>::all(client.clone()),
            Api::<Service>::all(client.clone()),
            Api::<Event>::all(client.clone()),
        );
        let (nodes, services, events) = futures::try_join!(
            node_api.list(&lp),
            service_api.list(&lp),
            event_api.list(&lp),
        )?;
        Ok(Observation {
            nodes: nodes.items,
            services: services.items,
            events: events.items,
        })
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name))
    }

    /// The service `namespace/name`.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services.iter().find(|s| {
            s.metadata.name.as_deref() == Some(name)
                && s.metadata.namespace.as_deref() == Some(namespace)
        })
    }

    /// The most recent Warning event about an object (`kind`, namespace, name).
    pub fn last_warning(&self, kind: &str, namespace: &str, name: &str) -> Option<&Event> {
        self.events
            .iter()
            .filter(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(name)
                    && e.involved_object.namespace.as_deref().unwrap_or("") == namespace
            })
            .max_by_key(|e| {
                (
                    e.last_timestamp.as_ref().map(|t| t.0),
                    e.metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse::<u64>().ok()),
                )
            })
    }

    /// Events by type and reason: how many Event objects (the rows of `kubectl get events`) and
    /// how many occurrences (the sum of their `count` fields: kubectl's `(x3 over 2m)`).
    pub fn event_counts(&self) -> BTreeMap<(String, String), EventTally> {
        let mut counts: BTreeMap<(String, String), EventTally> = BTreeMap::new();
        for e in &self.events {
            let key = (
                e.type_.clone().unwrap_or_default(),
                e.reason.clone().unwrap_or_default(),
            );
            let tally = counts.entry(key).or_default();
            tally.objects += 1;
            tally.count += u64::try_from(e.count.unwrap_or(1).max(1)).unwrap_or(1);
        }
        counts
    }

    /// The first Warning event (by its first timestamp), with when it was first seen.
    pub fn first_warning(&self) -> Option<(&Event, Option<std::time::SystemTime>)> {
        self.events
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
            .map(|e| (e, event_first_seen(e)))
            .min_by_key(|(e, at)| {
                (
                    *at,
                    e.metadata
                        .resource_version
                        .as_deref()
                        .and_then(|rv| rv.parse::<u64>().ok()),
                )
            })
    }
}

/// A fingerprint of `events`: how many there are and the newest resourceVersion. It changes
/// with every event written (created, or a repeat counted).
pub fn events_fingerprint(events: &[Event]) -> (usize, u64) {
    let newest = events
        .iter()
        .filter_map(|e| e.metadata.resource_version.as_deref()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    (events.len(), newest)
}

/// When the newest of `events` was last written (its `lastTimestamp`, else `eventTime`, else
/// its creation; whole seconds, as the API serialises them).
pub fn newest_event_write(events: &[Event]) -> Option<std::time::SystemTime> {
    events
        .iter()
        .filter_map(|e| {
            let ts = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
            system_time(ts)
        })
        .max()
}

fn system_time(ts: k8s_openapi::jiff::Timestamp) -> Option<std::time::SystemTime> {
    let millis = u64::try_from(ts.as_millisecond()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_millis(millis))
}

/// Event objects and occurrences of one type and reason.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct EventTally {
    /// Event objects.
    pub objects: u64,
    /// Occurrences: the sum of their `count` fields.
    pub count: u64,
}

/// When an event was first seen: `firstTimestamp`, else `eventTime`, else its creation.
fn event_first_seen(e: &Event) -> Option<std::time::SystemTime> {
    let ts = e
        .first_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))?;
    system_time(ts)
}

/// Whether a node is initialised: it has a providerID and no `uninitialized` taint.
pub fn node_initialised(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let has_id = spec
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|id| !id.is_empty());
    let tainted = spec
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == UNINITIALIZED_TAINT));
    has_id && !tainted
}

/// The node's `NetworkUnavailable` condition: `Some(true)` when it says the network is
/// available (status False), `Some(false)` when it says unavailable, `None` when absent.
pub fn node_routed(node: &Node) -> Option<bool> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE_CONDITION))
        .map(|c| c.status == "False")
}

/// The ingress addresses (IP or hostname) of a service.
pub fn ingress(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ing| {
            ing.iter()
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The provider whose load balancer a Service has, as the service controller recorded it with
/// the cleanup finalizer (`ccm-host/load-balancer-provider`, written when ownership is
/// enforced).
pub fn lb_provider(svc: &Service) -> Option<&str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LB_PROVIDER_ANNOTATION))
        .map(String::as_str)
}

/// Counters and the items still open.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Seeded nodes.
    pub nodes_total: usize,
    /// Seeded nodes initialised.
    pub nodes_initialised: usize,
    /// Nodes expected to get a route (0 when routes are not expected).
    pub routes_total: usize,
    /// Nodes whose route is reported created.
    pub routes_created: usize,
    /// Services we own.
    pub lbs_total: usize,
    /// Services we own with an ingress.
    pub lbs_ensured: usize,
    /// Services of other classes.
    pub foreign_total: usize,
    /// Services of other classes still untouched.
    pub foreign_untouched: usize,
    /// Nodes of a platform no provider owns.
    pub foreign_nodes_total: usize,
    /// Such nodes still as they were seeded (labels, taints, addresses, providerID).
    pub foreign_nodes_untouched: usize,
    /// Warning events (with repeats).
    pub warnings: u64,
    /// Every item not converged, with the reason.
    pub pending: Vec<String>,
}

impl Progress {
    /// The scene converged.
    pub fn converged(&self) -> bool {
        self.pending.is_empty()
    }

    /// One-line status.
    pub fn line(&self, exp: &Expectations) -> String {
        let mut parts = Vec::new();
        parts.push(if exp.any(|p| &p.nodes) {
            format!(
                "nodes initialised {}/{}",
                self.nodes_initialised, self.nodes_total
            )
        } else {
            format!("nodes {} (not initialised: off)", self.nodes_total)
        });
        parts.push(if exp.any(|p| &p.routes) {
            format!("routes {}/{}", self.routes_created, self.routes_total)
        } else {
            "routes off".into()
        });
        parts.push(if exp.any(|p| &p.load_balancers) {
            format!("LBs ensured {}/{}", self.lbs_ensured, self.lbs_total)
        } else {
            "LBs off".into()
        });
        if self.foreign_nodes_total > 0 {
            parts.push(format!(
                "foreign nodes untouched {}/{}",
                self.foreign_nodes_untouched, self.foreign_nodes_total
            ));
        }
        if self.foreign_total > 0 {
            parts.push(format!(
                "other-class untouched {}/{}",
                self.foreign_untouched, self.foreign_total
            ));
        }
        parts.push(format!("warnings {}", self.warnings));
        parts.join("  ")
    }
}

/// What changed on a node since it was seeded, of what a cloud provider's controllers write
/// (labels, taints, addresses, providerID); empty when nothing did.
pub fn changes_since_seeded(seeded: &Node, now: &Node) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if seeded.metadata.labels != now.metadata.labels {
        changed.push("labels");
    }
    let taints = |n: &Node| -> Vec<(String, Option<String>, String)> {
        let mut t: Vec<_> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|ts| {
                ts.iter()
                    .map(|t| (t.key.clone(), t.value.clone(), t.effect.clone()))
                    .collect()
            })
            .unwrap_or_default();
        t.sort();
        t
    };
    if taints(seeded) != taints(now) {
        changed.push("taints");
    }
    let addresses = |n: &Node| n.status.as_ref().and_then(|s| s.addresses.clone());
    if addresses(seeded) != addresses(now) {
        changed.push("addresses");
    }
    let provider_id = |n: &Node| n.spec.as_ref().and_then(|s| s.provider_id.clone());
    if provider_id(seeded) != provider_id(now) {
        changed.push("providerID");
    }
    changed
}

/// Measure `obs` against the scene and the expectations.
pub fn evaluate(scene: &Scene, exp: &Expectations, obs: &Observation) -> Progress {
    let mut p = Progress {
        warnings: obs
            .event_counts()
            .iter()
            .filter(|((t, _), _)| t == "Warning")
            .map(|(_, n)| n.count)
            .sum(),
        ..Default::default()
    };
    let warning_of = |kind: &str, ns: &str, name: &str| {
        obs.last_warning(kind, ns, name)
            .map(|e| {
                format!(
                    "; last warning {}: {}",
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("").trim()
                )
            })
            .unwrap_or_default()
    };
    let by_name: HashMap<&str, &Node> = obs
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref().map(|name| (name, n)))
        .collect();
    let several = exp.providers.len() > 1;
    for (i, sn) in scene.nodes.iter().enumerate() {
        let name = sn.spec.name.as_str();
        let expected = exp
            .node_owners
            .get(i)
            .copied()
            .unwrap_or(ExpectedOwner::Provider(0));
        let owner = match expected {
            ExpectedOwner::Provider(k) => k,
            ExpectedOwner::Foreign => {
                // Another platform's node: nobody here may change it.
                p.foreign_nodes_total += 1;
                let Some(node) = by_name.get(name) else {
                    p.pending
                        .push(format!("node {name}: foreign, deleted from the cluster"));
                    continue;
                };
                let changed = changes_since_seeded(&Scene::node_object(sn), node);
                if changed.is_empty() {
                    p.foreign_nodes_untouched += 1;
                } else {
                    p.pending.push(format!(
                        "node {name}: foreign (its platform is no provider's) but its {} changed{}",
                        changed.join(", "),
                        warning_of("Node", "", name)
                    ));
                }
                continue;
            }
        };
        let pe = &exp.providers[owner];
        p.nodes_total += 1;
        if pe.routes.is_ok() {
            p.routes_total += 1;
        }
        let Some(node) = by_name.get(name) else {
            p.pending.push(format!(
                "node {name}: deleted from the cluster{}",
                warning_of("Node", "", name)
            ));
            continue;
        };
        // With ownership enforced the node must be the expected provider's.
        let actual = if exp.ownership.enforced() {
            exp.ownership.owner(&CachedNode::from((*node).clone()))
        } else {
            Owner::Provider(owner)
        };
        let initialised = node_initialised(node);
        match actual {
            Owner::Provider(k) if k != owner => p.pending.push(format!(
                "node {name}: owned by {}, expected {}{}",
                exp.providers[k].name,
                pe.name,
                warning_of("Node", "", name)
            )),
            _ if initialised => p.nodes_initialised += 1,
            _ if pe.nodes.is_ok() => {
                let why = if node
                    .spec
                    .as_ref()
                    .and_then(|s| s.provider_id.as_deref())
                    .is_some_and(|id| !id.is_empty())
                {
                    "still has the uninitialized taint"
                } else if actual == Owner::Unclaimed {
                    "not initialised (no providerID, still tainted), not claimed by a provider yet"
                } else {
                    "not initialised (no providerID, still tainted)"
                };
                let of = if several {
                    format!(" (provider {})", pe.name)
                } else {
                    String::new()
                };
                p.pending.push(format!(
                    "node {name}: {why}{of}{}",
                    warning_of("Node", "", name)
                ));
            }
            _ => {}
        }
        if pe.routes.is_ok() {
            match node_routed(node) {
                Some(true) => p.routes_created += 1,
                Some(false) => p.pending.push(format!(
                    "node {name}: NetworkUnavailable=True (no route for {}){}",
                    sn.pod_cidr,
                    warning_of("Node", "", name)
                )),
                None => p.pending.push(format!(
                    "node {name}: no route yet (no NetworkUnavailable condition){}",
                    warning_of("Node", "", name)
                )),
            }
        }
    }
    // `ccm-host check`'s lb-distinct rule: no two Services served by one provider on the same
    // address, unless the provider declares shared addresses.
    let mut by_address: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
    for spec in &scene.services {
        let key = format!("{}/{}", spec.namespace, spec.name);
        let Some(svc) = obs.service(&spec.namespace, &spec.name) else {
            continue;
        };
        if let Some(k) = exp
            .server_of(svc)
            .filter(|k| !exp.providers[*k].shared_addresses)
        {
            for address in ingress(svc) {
                by_address
                    .entry((k, address))
                    .or_default()
                    .push(key.clone());
            }
        }
    }
    for ((k, address), services) in by_address.into_iter().filter(|(_, s)| s.len() > 1) {
        p.pending.push(format!(
            "services {} all got {address} from provider {}: two Services must not share a load-balancer address (check's lb-distinct rule; the provider does not declare shared addresses)",
            services.join(", "),
            exp.providers[k].name
        ));
    }
    for spec in &scene.services {
        let key = format!("{}/{}", spec.namespace, spec.name);
        let Some(svc) = obs.service(&spec.namespace, &spec.name) else {
            p.pending
                .push(format!("service {key}: deleted from the cluster"));
            continue;
        };
        if let Some(k) = exp.server_of(svc) {
            let pe = &exp.providers[k];
            p.lbs_total += 1;
            let recorded = lb_provider(svc).filter(|name| *name != pe.name);
            if let Some(other) = recorded {
                p.pending.push(format!(
                    "service {key}: its load balancer is {other}'s ({LB_PROVIDER_ANNOTATION}), but its class is {}'s",
                    pe.name
                ));
            } else if !ingress(svc).is_empty() {
                p.lbs_ensured += 1;
            } else if pe.load_balancers.is_ok() {
                let of = if several {
                    format!(" (provider {})", pe.name)
                } else {
                    String::new()
                };
                p.pending.push(format!(
                    "service {key}: no load balancer ingress yet{of}{}",
                    warning_of("Service", &spec.namespace, &spec.name)
                ));
            }
        } else {
            p.foreign_total += 1;
            let class = spec.load_balancer_class.as_deref().unwrap_or("(none)");
            let mut touched = Vec::new();
            if has_lb_finalizer(svc) {
                touched.push("got the load-balancer-cleanup finalizer");
            }
            if !ingress(svc).is_empty() {
                touched.push("got an ingress");
            }
            if lb_provider(svc).is_some() {
                touched.push("got the ccm-host/load-balancer-provider annotation");
            }
            if touched.is_empty() {
                p.foreign_untouched += 1;
            } else {
                p.pending.push(format!(
                    "service {key}: class {class} is not handled by these controllers but it {}",
                    touched.join(" and ")
                ));
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        EventSource, LoadBalancerIngress, LoadBalancerStatus, NodeCondition, ObjectReference,
        ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::super::scene::{Scenario, SceneContext};
    use super::*;

    fn fake() -> ProviderExpectations {
        ProviderExpectations {
            name: "fake".into(),
            nodes: Ok(()),
            routes: Ok(()),
            load_balancers: Ok(()),
            policy: ClassPolicy::default(),
            shared_addresses: false,
        }
    }

    fn expectations() -> Expectations {
        Expectations::single(fake(), 2)
    }

    fn scene() -> Scene {
        Scenario::generate(2, 2)
            .into_scene("t".into(), None, &SceneContext::FAKE)
            .unwrap()
    }

    fn warning(kind: &str, ns: Option<&str>, name: &str, reason: &str, msg: &str) -> Event {
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.1")),
                namespace: Some(ns.unwrap_or("default").into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                kind: Some(kind.into()),
                name: Some(name.into()),
                namespace: ns.map(str::to_string),
                ..Default::default()
            },
            type_: Some("Warning".into()),
            reason: Some(reason.into()),
            message: Some(msg.into()),
            count: Some(3),
            source: Some(EventSource::default()),
            ..Default::default()
        }
    }

    #[test]
    fn seeded_scene_is_pending_until_every_part_is_done() {
        let scene = scene();
        let exp = expectations();
        let mut obs = Observation {
            nodes: scene.node_objects(),
            services: scene.service_objects(),
            events: vec![warning(
                "Service",
                Some("default"),
                "web",
                "SyncLoadBalancerFailed",
                "Error syncing load balancer: boom",
            )],
        };
        let p = evaluate(&scene, &exp, &obs);
        assert_eq!(
            (
                p.nodes_initialised,
                p.routes_created,
                p.lbs_ensured,
                p.lbs_total
            ),
            (0, 0, 0, 1)
        );
        assert_eq!(
            (p.foreign_total, p.foreign_untouched, p.warnings),
            (1, 1, 3)
        );
        assert_eq!(
            p.pending,
            [
                "node node-01: not initialised (no providerID, still tainted)",
                "node node-01: no route yet (no NetworkUnavailable condition)",
                "node node-02: not initialised (no providerID, still tainted)",
                "node node-02: no route yet (no NetworkUnavailable condition)",
                "service default/web: no load balancer ingress yet; last warning SyncLoadBalancerFailed: Error syncing load balancer: boom",
            ]
        );
        assert_eq!(
            p.line(&exp),
            "nodes initialised 0/2  routes 0/2  LBs ensured 0/1  other-class untouched 1/1  warnings 3"
        );

        // Everything done.
        for n in &mut obs.nodes {
            let spec = n.spec.as_mut().unwrap();
            spec.provider_id = Some("fake://x".into());
            spec.taints
                .as_mut()
                .unwrap()
                .retain(|t| t.key != UNINITIALIZED_TAINT);
            n.status
                .as_mut()
                .unwrap()
                .conditions
                .as_mut()
                .unwrap()
                .push(NodeCondition {
                    type_: "NetworkUnavailable".into(),
                    status: "False".into(),
                    ..Default::default()
                });
        }
        obs.services[0].status = Some(ServiceStatus {
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress {
                    ip: Some("198.18.0.1".into()),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        });
        let p = evaluate(&scene, &exp, &obs);
        assert!(p.converged(), "{:?}", p.pending);

        // The foreign service touched: not converged, and why.
        obs.services[1].metadata.finalizers =
            Some(vec!["service.kubernetes.io/load-balancer-cleanup".into()]);
        let p = evaluate(&scene, &exp, &obs);
        assert_eq!(
            p.pending,
            ["service default/other-class-lb: class example.com/other-lb is not handled by these controllers but it got the load-balancer-cleanup finalizer"]
        );

        // A node gone.
        obs.services[1].metadata.finalizers = None;
        obs.nodes.remove(1);
        let p = evaluate(&scene, &exp, &obs);
        assert_eq!(p.pending, ["node node-02: deleted from the cluster"]);
    }

    #[test]
    fn two_services_on_one_address_are_not_converged_unless_shared_addresses_are_declared() {
        let scene = Scenario::generate(2, 3)
            .into_scene("t".into(), None, &SceneContext::FAKE)
            .unwrap();
        let mut obs = Observation {
            nodes: scene.node_objects(),
            services: scene.service_objects(),
            events: vec![],
        };
        for n in &mut obs.nodes {
            let spec = n.spec.as_mut().unwrap();
            spec.provider_id = Some("fake://x".into());
            spec.taints = None;
            n.status
                .as_mut()
                .unwrap()
                .conditions
                .as_mut()
                .unwrap()
                .push(NodeCondition {
                    type_: "NetworkUnavailable".into(),
                    status: "False".into(),
                    ..Default::default()
                });
        }
        let served: Vec<usize> = (0..obs.services.len())
            .filter(|i| expectations().server_of(&obs.services[*i]).is_some())
            .collect();
        assert_eq!(served.len(), 2, "two served Services in the scene");
        for i in &served {
            obs.services[*i].status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some("198.18.0.1".into()),
                        ..Default::default()
                    }]),
                }),
                ..Default::default()
            });
        }
        let p = evaluate(&scene, &expectations(), &obs);
        assert_eq!(p.pending.len(), 1, "{:?}", p.pending);
        assert!(
            p.pending[0].contains("all got 198.18.0.1 from provider fake")
                && p.pending[0].contains("lb-distinct"),
            "{}",
            p.pending[0]
        );
        let shared = Expectations::single(
            ProviderExpectations {
                shared_addresses: true,
                ..fake()
            },
            2,
        );
        let p = evaluate(&scene, &shared, &obs);
        assert!(p.converged(), "{:?}", p.pending);
    }

    #[test]
    fn parts_that_are_not_expected_are_not_waited_for() {
        let scene = scene();
        let exp = Expectations::single(
            ProviderExpectations {
                routes: Err("the provider has no Routes".into()),
                load_balancers: Err("the service controller is disabled".into()),
                ..fake()
            },
            2,
        );
        let mut obs = Observation {
            nodes: scene.node_objects(),
            services: scene.service_objects(),
            events: vec![],
        };
        for n in &mut obs.nodes {
            let spec = n.spec.as_mut().unwrap();
            spec.provider_id = Some("fake://x".into());
            spec.taints = None;
        }
        let p = evaluate(&scene, &exp, &obs);
        assert!(p.converged(), "{:?}", p.pending);
        assert_eq!(
            p.line(&exp),
            "nodes initialised 2/2  routes off  LBs off  other-class untouched 1/1  warnings 0"
        );
    }

    #[test]
    fn nodes_are_measured_against_their_expected_owner() {
        let scene = Scenario::parse(
            "nodes:\n- {name: a}\n- {name: m, provider: metal}\n- {name: k, providerID: 'kwok://k'}\n\
             providers: [{name: fake}, {name: metal}]\n",
        )
        .unwrap()
        .into_scene("t".into(), None, &SceneContext::FAKE)
        .unwrap();
        let metal = ProviderExpectations {
            name: "metal".into(),
            routes: Err("the provider does not support Routes".into()),
            policy: ClassPolicy {
                classes: vec!["metal-lb".into()],
                ignore_classless: true,
            },
            ..fake()
        };
        let ownership = Ownership::new(
            &[
                ("fake".into(), vec!["fake://".into()]),
                ("metal".into(), vec!["metal://".into()]),
            ],
            true,
        )
        .unwrap();
        let exp = Expectations {
            providers: vec![fake(), metal],
            ownership,
            node_owners: vec![
                ExpectedOwner::Provider(0),
                ExpectedOwner::Provider(1),
                ExpectedOwner::Foreign,
            ],
        };
        assert!(exp.hybrid());
        let mut obs = Observation {
            nodes: scene.node_objects(),
            services: vec![],
            events: vec![],
        };
        let p = evaluate(&scene, &exp, &obs);
        assert_eq!(
            (
                p.nodes_total,
                p.routes_total,
                p.foreign_nodes_total,
                p.foreign_nodes_untouched
            ),
            (2, 1, 1, 1)
        );
        assert_eq!(
            p.pending,
            [
                "node a: not initialised (no providerID, still tainted), not claimed by a provider yet (provider fake)",
                "node a: no route yet (no NetworkUnavailable condition)",
                "node m: not initialised (no providerID, still tainted), not claimed by a provider yet (provider metal)",
            ]
        );
        assert_eq!(
            p.line(&exp),
            "nodes initialised 0/2  routes 0/1  LBs ensured 0/0  foreign nodes untouched 1/1  warnings 0"
        );
        assert_eq!(exp.owner_name(&obs.nodes[2]), "foreign");
        assert_eq!(exp.owner_name(&obs.nodes[0]), "unclaimed");

        // a initialised by fake, m claimed by fake instead of metal, k's taint removed.
        for n in &mut obs.nodes {
            let spec = n.spec.as_mut().unwrap();
            spec.taints = None;
            if spec.provider_id.is_none() {
                spec.provider_id = Some(format!("fake://{}", n.metadata.name.as_deref().unwrap()));
            }
        }
        let p = evaluate(&scene, &exp, &obs);
        assert_eq!(p.nodes_initialised, 1);
        assert_eq!(
            p.pending,
            [
                "node a: no route yet (no NetworkUnavailable condition)",
                "node m: owned by fake, expected metal",
                "node k: foreign (its platform is no provider's) but its taints changed",
            ]
        );
        assert_eq!(exp.owner_name(&obs.nodes[1]), "fake");
    }
}
