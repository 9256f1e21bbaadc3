//! Watching the scene converge: what the cluster looks like now, measured against what the
//! controllers are expected to do with it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::api::ListParams;
use kube::{Api, Client};

use super::scene::Scene;
use crate::controllers::service::predicates::{has_lb_finalizer, ClassPolicy};
use crate::well_known::{NETWORK_UNAVAILABLE_CONDITION, UNINITIALIZED_TAINT};

/// What the controllers are expected to do, from the enabled controllers, the flags and the
/// provider's capabilities; each `Err` says why a part is not expected.
#[derive(Debug, Clone)]
pub struct Expectations {
    /// Nodes get initialised (cloud-node controller running).
    pub nodes: Result<(), String>,
    /// Every node gets a route and `NetworkUnavailable=False`.
    pub routes: Result<(), String>,
    /// Services we own get a load balancer.
    pub load_balancers: Result<(), String>,
    /// Which services the service controller owns.
    pub policy: ClassPolicy,
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
        parts.push(match &exp.nodes {
            Ok(()) => format!(
                "nodes initialised {}/{}",
                self.nodes_initialised, self.nodes_total
            ),
            Err(_) => format!("nodes {} (not initialised: off)", self.nodes_total),
        });
        parts.push(match &exp.routes {
            Ok(()) => format!("routes {}/{}", self.routes_created, self.routes_total),
            Err(_) => "routes off".into(),
        });
        parts.push(match &exp.load_balancers {
            Ok(()) => format!("LBs ensured {}/{}", self.lbs_ensured, self.lbs_total),
            Err(_) => "LBs off".into(),
        });
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

/// Measure `obs` against the scene and the expectations.
pub fn evaluate(scene: &Scene, exp: &Expectations, obs: &Observation) -> Progress {
    let mut p = Progress {
        nodes_total: scene.nodes.len(),
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
    if exp.routes.is_ok() {
        p.routes_total = scene.nodes.len();
    }
    for sn in &scene.nodes {
        let name = sn.spec.name.as_str();
        let Some(node) = by_name.get(name) else {
            p.pending.push(format!(
                "node {name}: deleted from the cluster{}",
                warning_of("Node", "", name)
            ));
            continue;
        };
        let initialised = node_initialised(node);
        if initialised {
            p.nodes_initialised += 1;
        } else if exp.nodes.is_ok() {
            let why = if node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.as_deref())
                .is_some_and(|id| !id.is_empty())
            {
                "still has the uninitialized taint"
            } else {
                "not initialised (no providerID, still tainted)"
            };
            p.pending.push(format!(
                "node {name}: {why}{}",
                warning_of("Node", "", name)
            ));
        }
        if exp.routes.is_ok() {
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
    for spec in &scene.services {
        let key = format!("{}/{}", spec.namespace, spec.name);
        let Some(svc) = obs.service(&spec.namespace, &spec.name) else {
            p.pending
                .push(format!("service {key}: deleted from the cluster"));
            continue;
        };
        if exp.policy.wants_load_balancer(svc) {
            p.lbs_total += 1;
            if !ingress(svc).is_empty() {
                p.lbs_ensured += 1;
            } else if exp.load_balancers.is_ok() {
                p.pending.push(format!(
                    "service {key}: no load balancer ingress yet{}",
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

    use super::super::scene::Scenario;
    use super::*;

    fn expectations() -> Expectations {
        Expectations {
            nodes: Ok(()),
            routes: Ok(()),
            load_balancers: Ok(()),
            policy: ClassPolicy::default(),
        }
    }

    fn scene() -> Scene {
        Scenario::generate(2, 2)
            .into_scene("t".into(), None, true)
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
    fn parts_that_are_not_expected_are_not_waited_for() {
        let scene = scene();
        let exp = Expectations {
            routes: Err("the provider has no Routes".into()),
            load_balancers: Err("the service controller is disabled".into()),
            ..expectations()
        };
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
}
