//! Equivalents of upstream's pure-function tests: `TestNeedsCleanup`, `TestNeedsUpdate`,
//! `Test_respectsPredicates`, `Test_shouldSyncUpdatedNode_*`, `TestNodesNotEqual`,
//! `TestLoadBalancerStatusEqual`, the key format of `TestSyncService`, plus class routing and
//! the `UpdateLoadBalancerFailed` message.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, LoadBalancerIngress, LoadBalancerStatus, Node, NodeCondition, NodeSpec,
    NodeStatus, PortStatus, Service, ServicePort, ServiceSpec, SessionAffinityConfig, Taint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::*;

fn svc(type_: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("svc".into()),
            namespace: Some("default".into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some(type_.into()),
            ports: Some(vec![ServicePort {
                port: 80,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(8080)),
                node_port: Some(30080),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn lb() -> Service {
    svc("LoadBalancer")
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn with_finalizer(mut s: Service) -> Service {
    s.metadata.finalizers = Some(vec![LB_CLEANUP_FINALIZER.into()]);
    s
}

fn spec(s: &mut Service) -> &mut ServiceSpec {
    s.spec.as_mut().unwrap()
}

fn upstream() -> ClassPolicy {
    ClassPolicy::default()
}

#[test]
fn needs_cleanup_truth_table() {
    // No finalizer: never.
    assert!(!needs_cleanup(&lb()));
    let mut deleting = lb();
    deleting.metadata.deletion_timestamp = Some(now());
    assert!(!needs_cleanup(&deleting));
    // Finalizer + deletionTimestamp.
    assert!(needs_cleanup(&with_finalizer(deleting)));
    // Finalizer + no longer LoadBalancer.
    assert!(needs_cleanup(&with_finalizer(svc("ClusterIP"))));
    assert!(needs_cleanup(&with_finalizer(svc("NodePort"))));
    // Finalizer + LoadBalancer, not deleting.
    assert!(!needs_cleanup(&with_finalizer(lb())));
    // Finalizer + LoadBalancer + a class: not needsCleanup (the sync still deletes).
    let mut classed = with_finalizer(lb());
    spec(&mut classed).load_balancer_class = Some("other".into());
    assert!(!needs_cleanup(&classed));
    assert!(!upstream().wants_load_balancer(&classed));
}

#[test]
fn wants_load_balancer_and_class_routing() {
    let p = upstream();
    assert!(p.wants_load_balancer(&lb()));
    assert!(!p.wants_load_balancer(&svc("ClusterIP")));
    assert!(!p.wants_load_balancer(&Service::default()));
    let mut classed = lb();
    spec(&mut classed).load_balancer_class = Some("example.com/lb".into());
    assert!(
        !p.wants_load_balancer(&classed),
        "any class opts out upstream"
    );
    let mut empty_class = lb();
    spec(&mut empty_class).load_balancer_class = Some(String::new());
    assert!(!p.wants_load_balancer(&empty_class));

    let routed = ClassPolicy {
        classes: vec!["example.com/lb".into()],
        ignore_classless: false,
    };
    assert!(routed.wants_load_balancer(&classed));
    assert!(routed.wants_load_balancer(&lb()));
    assert!(!routed.wants_load_balancer(&empty_class));
    let mut classed_cip = classed.clone();
    spec(&mut classed_cip).type_ = Some("ClusterIP".into());
    assert!(!routed.wants_load_balancer(&classed_cip));

    let only_classes = ClassPolicy {
        classes: vec!["example.com/lb".into()],
        ignore_classless: true,
    };
    assert!(only_classes.wants_load_balancer(&classed));
    assert!(!only_classes.wants_load_balancer(&lb()));

    let cfg = crate::controllers::ControllerConfig {
        load_balancer_classes: vec!["a".into(), "b".into()],
        ignore_classless_services: true,
        ..Default::default()
    };
    assert_eq!(
        ClassPolicy::from_config(&cfg),
        ClassPolicy {
            classes: vec!["a".into(), "b".into()],
            ignore_classless: true
        }
    );
    assert_eq!(
        ClassPolicy::from_config(&Default::default()),
        upstream(),
        "off by default"
    );
}

fn changed(f: impl FnOnce(&mut Service)) -> bool {
    let old = lb();
    let mut new = old.clone();
    f(&mut new);
    needs_update(&upstream(), &old, &new)
}

#[test]
fn needs_update_triggers() {
    assert!(!changed(|_| {}), "identical (resync)");
    assert!(
        changed(|s| spec(s).type_ = Some("ClusterIP".into())),
        "type"
    );
    let old = svc("ClusterIP");
    assert!(
        needs_update(&upstream(), &old, &lb()),
        "became LoadBalancer"
    );
    assert!(
        !needs_update(&upstream(), &old, &svc("NodePort")),
        "neither wants an LB"
    );
    assert!(
        changed(|s| spec(s).load_balancer_source_ranges = Some(vec![])),
        "nil != empty ranges"
    );
    assert!(changed(
        |s| spec(s).load_balancer_source_ranges = Some(vec!["10.0.0.0/8".into()])
    ));
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap()[0].port = 81),
        "port"
    );
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap().push(ServicePort {
            port: 443,
            ..Default::default()
        })),
        "port count"
    );
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap()[0].name = Some("http".into())),
        "port name"
    );
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap()[0].protocol = Some("UDP".into())),
        "protocol"
    );
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap()[0].node_port = Some(30081)),
        "nodePort"
    );
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap()[0].target_port =
            Some(IntOrString::String("http".into()))),
        "targetPort int -> named"
    );
    assert!(
        changed(|s| spec(s).ports.as_mut().unwrap()[0].app_protocol = Some("http".into())),
        "appProtocol set"
    );
    assert!(
        changed(|s| spec(s).session_affinity = Some("ClientIP".into())),
        "sessionAffinity"
    );
    assert!(
        changed(
            |s| spec(s).session_affinity_config = Some(SessionAffinityConfig {
                client_ip: Some(ClientIPConfig {
                    timeout_seconds: Some(10)
                })
            })
        ),
        "sessionAffinityConfig"
    );
    assert!(
        changed(|s| spec(s).load_balancer_ip = Some("1.2.3.4".into())),
        "loadBalancerIP"
    );
    assert!(
        changed(|s| spec(s).external_ips = Some(vec!["1.1.1.1".into()])),
        "externalIPs count"
    );
    assert!(
        !changed(|s| spec(s).external_ips = Some(vec![])),
        "externalIPs nil == empty (count)"
    );
    assert!(
        changed(|s| s.metadata.annotations = Some(BTreeMap::new())),
        "annotations nil != empty"
    );
    assert!(changed(
        |s| s.metadata.annotations = Some([("a".to_string(), "b".to_string())].into())
    ));
    assert!(changed(|s| s.metadata.uid = Some("uid-2".into())), "UID");
    assert!(
        changed(|s| spec(s).external_traffic_policy = Some("Local".into())),
        "ETP"
    );
    assert!(
        changed(|s| spec(s).health_check_node_port = Some(30000)),
        "healthCheckNodePort"
    );
    assert!(
        changed(|s| spec(s).ip_families = Some(vec!["IPv4".into()])),
        "ipFamilies count"
    );

    // Not triggering.
    assert!(
        !changed(|s| s.metadata.labels = Some([("a".to_string(), "b".to_string())].into())),
        "labels"
    );
    assert!(
        !changed(|s| s.metadata.finalizers = Some(vec![LB_CLEANUP_FINALIZER.into()])),
        "finalizers"
    );
    assert!(!changed(|s| s.status = Some(Default::default())), "status");
    assert!(
        !changed(|s| spec(s).ip_family_policy = Some("PreferDualStack".into())),
        "ipFamilyPolicy"
    );
    assert!(
        !changed(|s| spec(s).cluster_ips = Some(vec!["10.0.0.1".into()])),
        "clusterIPs"
    );
    assert!(
        !changed(|s| spec(s).allocate_load_balancer_node_ports = Some(false)),
        "allocateLoadBalancerNodePorts"
    );
    assert!(
        !changed(|s| spec(s).internal_traffic_policy = Some("Local".into())),
        "internalTrafficPolicy"
    );
}

#[test]
fn needs_update_external_ip_values_app_protocol_and_families() {
    let mut old = lb();
    spec(&mut old).external_ips = Some(vec!["1.1.1.1".into(), "2.2.2.2".into()]);
    spec(&mut old).ports.as_mut().unwrap()[0].app_protocol = Some("http".into());
    spec(&mut old).ip_families = Some(vec!["IPv4".into()]);
    let mut new = old.clone();
    assert!(
        !needs_update(&upstream(), &old, &new),
        "same appProtocol, same ipFamilies"
    );
    spec(&mut new).external_ips = Some(vec!["1.1.1.1".into(), "3.3.3.3".into()]);
    assert!(needs_update(&upstream(), &old, &new), "externalIP value");
    let mut new = old.clone();
    spec(&mut new).ports.as_mut().unwrap()[0].app_protocol = Some("https".into());
    assert!(needs_update(&upstream(), &old, &new), "appProtocol changed");
    let mut new = old.clone();
    spec(&mut new).ip_families = Some(vec!["IPv6".into()]);
    assert!(
        !needs_update(&upstream(), &old, &new),
        "only the count of ipFamilies matters"
    );
    // Source ranges only matter when the new service wants an LB (it does here), and are
    // compared with nil != empty even when both sides are otherwise equal.
    let mut a = lb();
    spec(&mut a).load_balancer_source_ranges = Some(vec![]);
    let b = lb();
    assert!(needs_update(&upstream(), &a, &b));
}

#[test]
fn needs_update_follows_class_routing() {
    let mut old = lb();
    spec(&mut old).load_balancer_class = Some("x".into());
    let mut new = old.clone();
    spec(&mut new).load_balancer_ip = Some("1.2.3.4".into());
    assert!(
        !needs_update(&upstream(), &old, &new),
        "upstream ignores classed services"
    );
    let routed = ClassPolicy {
        classes: vec!["x".into()],
        ignore_classless: false,
    };
    assert!(needs_update(&routed, &old, &new));
}

/// The cache's form of a node.
fn c(n: &Node) -> CachedNode {
    CachedNode::from(n.clone())
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("fake://{name}")),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

fn labelled(v: &str) -> Node {
    let mut n = node("n");
    n.metadata.labels = Some([(EXCLUDE_LB_LABEL.to_string(), v.to_string())].into());
    n
}

fn tainted(key: &str) -> Node {
    let mut n = node("n");
    n.spec.as_mut().unwrap().taints = Some(vec![Taint {
        key: key.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }]);
    n
}

#[test]
fn go_bool_parsing() {
    for t in ["1", "t", "T", "TRUE", "true", "True"] {
        assert_eq!(parse_go_bool(t), Some(true), "{t}");
    }
    for f in ["0", "f", "F", "FALSE", "false", "False"] {
        assert_eq!(parse_go_bool(f), Some(false), "{f}");
    }
    for bad in ["", "foo", "yes", "no", "tRUE", " true", "2"] {
        assert_eq!(parse_go_bool(bad), None, "{bad:?}");
    }
}

#[test]
fn respects_predicates() {
    // An empty node is not Ready (allNodePredicates), but belongs to the stable host set.
    assert!(!all_node_predicates(&c(&Node::default())));
    assert!(stable_node_set(&c(&Node::default())));
    assert!(all_node_predicates(&c(&node("n"))));
    for v in ["", "true", "foo", "1", "T"] {
        assert!(
            !node_included(&c(&labelled(v))),
            "exclude label {v:?} excludes"
        );
        assert!(!stable_node_set(&c(&labelled(v))));
    }
    for v in ["false", "0", "f", "F", "FALSE", "False"] {
        assert!(
            node_included(&c(&labelled(v))),
            "exclude label {v:?} includes"
        );
        assert!(stable_node_set(&c(&labelled(v))));
    }
    assert!(!node_untainted(&c(&tainted(TO_BE_DELETED_TAINT))));
    assert!(!stable_node_set(&c(&tainted(TO_BE_DELETED_TAINT))));
    assert!(stable_node_set(&c(&tainted("other"))));
    let mut deleting = node("n");
    deleting.metadata.deletion_timestamp = Some(now());
    assert!(!stable_node_set(&c(&deleting)));
    // Readiness is not part of the host set.
    let mut not_ready = node("n");
    not_ready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    assert!(stable_node_set(&c(&not_ready)));
    assert!(!all_node_predicates(&c(&not_ready)));
}

#[test]
fn should_sync_updated_node_only_on_exclusion_flip_or_provider_id() {
    let base = node("n");
    assert!(!should_sync_updated_node(&c(&base), &c(&base.clone())));
    let mut not_ready = base.clone();
    not_ready
        .status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()[0]
        .status = "False".into();
    assert!(
        !should_sync_updated_node(&c(&base), &c(&not_ready)),
        "readiness"
    );
    let mut other_label = base.clone();
    other_label.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
    assert!(
        !should_sync_updated_node(&c(&base), &c(&other_label)),
        "other labels"
    );
    let mut to_be_deleted = base.clone();
    to_be_deleted.spec = tainted(TO_BE_DELETED_TAINT).spec;
    to_be_deleted.spec.as_mut().unwrap().provider_id =
        base.spec.as_ref().unwrap().provider_id.clone();
    assert!(
        !should_sync_updated_node(&c(&base), &c(&to_be_deleted)),
        "autoscaler taint alone"
    );
    let mut deleting = base.clone();
    deleting.metadata.deletion_timestamp = Some(now());
    assert!(
        !should_sync_updated_node(&c(&base), &c(&deleting)),
        "deletionTimestamp alone"
    );

    let mut excluded = base.clone();
    excluded.metadata.labels = Some([(EXCLUDE_LB_LABEL.to_string(), "true".to_string())].into());
    assert!(
        should_sync_updated_node(&c(&base), &c(&excluded)),
        "exclusion added"
    );
    assert!(
        should_sync_updated_node(&c(&excluded), &c(&base)),
        "exclusion removed"
    );
    let mut still_included = base.clone();
    still_included.metadata.labels =
        Some([(EXCLUDE_LB_LABEL.to_string(), "false".to_string())].into());
    assert!(
        !should_sync_updated_node(&c(&base), &c(&still_included)),
        "label present but false"
    );
    let mut excluded_other_value = excluded.clone();
    excluded_other_value.metadata.labels =
        Some([(EXCLUDE_LB_LABEL.to_string(), "".to_string())].into());
    assert!(
        !should_sync_updated_node(&c(&excluded), &c(&excluded_other_value)),
        "excluded both ways"
    );

    let mut moved = base.clone();
    moved.spec.as_mut().unwrap().provider_id = Some("fake://other".into());
    assert!(
        should_sync_updated_node(&c(&base), &c(&moved)),
        "providerID"
    );
}

#[test]
fn nodes_not_equal() {
    let a = |names: &[&str]| -> Vec<Arc<CachedNode>> {
        names.iter().map(|n| Arc::new(c(&node(n)))).collect()
    };
    assert!(
        nodes_sufficiently_equal(&a(&["n1", "n2"]), &a(&["n2", "n1"])),
        "same set"
    );
    assert!(
        !nodes_sufficiently_equal(&a(&["n1", "n2"]), &a(&["n1", "n3"])),
        "same size, other node"
    );
    assert!(!nodes_sufficiently_equal(&a(&["n1"]), &a(&["n1", "n2"])));
    let mut moved = node("n2");
    moved.spec.as_mut().unwrap().provider_id = Some("fake://moved".into());
    assert!(
        !nodes_sufficiently_equal(
            &a(&["n1", "n2"]),
            &[Arc::new(c(&node("n1"))), Arc::new(c(&moved))]
        ),
        "providerID"
    );
    // Readiness does not count.
    let mut nr = node("n1");
    nr.status = None;
    assert!(nodes_sufficiently_equal(&a(&["n1"]), &[Arc::new(c(&nr))]));
}

#[test]
fn update_failed_message_limits_node_names() {
    let few: Vec<Node> = ["b", "a", "c"].iter().map(|n| node(n)).collect();
    assert_eq!(
        update_failed_message(&few, &"boom"),
        "Error updating load balancer with new hosts [a b c] [node names limited, total number of nodes: 3], error: boom"
    );
    // 25 nodes named n24..n00 (descending): the first 20 given (n24..n05), sorted, then "<5 more>".
    let many: Vec<Node> = (0..25).rev().map(|i| node(&format!("n{i:02}"))).collect();
    let names = loggable_node_names(&many);
    assert_eq!(names.len(), 21);
    assert_eq!(names[0], "n05");
    assert_eq!(names[19], "n24");
    assert_eq!(names[20], "<5 more>");
    let msg = update_failed_message(&many, &"x");
    assert!(
        msg.starts_with("Error updating load balancer with new hosts [n05 n06 "),
        "{msg}"
    );
    assert!(
        msg.ends_with("n24 <5 more>] [node names limited, total number of nodes: 25], error: x"),
        "{msg}"
    );
    // Exactly 20: no "more" marker.
    assert_eq!(loggable_node_names(&many[..20]).len(), 20);
    assert_eq!(update_failed_message(&Vec::<Node>::new(), &"e"),
        "Error updating load balancer with new hosts [] [node names limited, total number of nodes: 0], error: e");
}

fn ingress(ip: &str) -> LoadBalancerIngress {
    LoadBalancerIngress {
        ip: Some(ip.into()),
        ..Default::default()
    }
}

fn status(list: Option<Vec<LoadBalancerIngress>>) -> LoadBalancerStatus {
    LoadBalancerStatus { ingress: list }
}

#[test]
fn load_balancer_status_equality() {
    let eq = |a: &LoadBalancerStatus, b: &LoadBalancerStatus| {
        load_balancer_status_equal(Some(a), Some(b))
    };
    assert!(eq(&status(None), &status(Some(vec![]))), "nil == empty");
    assert!(load_balancer_status_equal(
        None,
        Some(&status(Some(vec![])))
    ));
    assert!(!load_balancer_status_equal(
        None,
        Some(&status(Some(vec![ingress("1.1.1.1")])))
    ));
    assert!(eq(
        &status(Some(vec![ingress("1.1.1.1")])),
        &status(Some(vec![ingress("1.1.1.1")]))
    ));
    assert!(
        !eq(
            &status(Some(vec![ingress("1.1.1.1")])),
            &status(Some(vec![ingress("1.1.1.2")]))
        ),
        "ip"
    );
    let mut vip = ingress("1.1.1.1");
    vip.ip_mode = Some("VIP".into());
    assert!(
        !eq(
            &status(Some(vec![ingress("1.1.1.1")])),
            &status(Some(vec![vip.clone()]))
        ),
        "ipMode"
    );
    let mut proxy = vip.clone();
    proxy.ip_mode = Some("Proxy".into());
    assert!(
        !eq(&status(Some(vec![vip.clone()])), &status(Some(vec![proxy]))),
        "ipMode value"
    );
    let mut ports = ingress("1.1.1.1");
    ports.ports = Some(vec![PortStatus {
        port: 80,
        protocol: "TCP".into(),
        error: None,
    }]);
    assert!(
        !eq(
            &status(Some(vec![ingress("1.1.1.1")])),
            &status(Some(vec![ports.clone()]))
        ),
        "ports"
    );
    let mut other_port = ports.clone();
    other_port.ports.as_mut().unwrap()[0].port = 81;
    assert!(
        !eq(
            &status(Some(vec![ports.clone()])),
            &status(Some(vec![other_port]))
        ),
        "port value"
    );
    let mut empty_ports = ingress("1.1.1.1");
    empty_ports.ports = Some(vec![]);
    assert!(
        eq(
            &status(Some(vec![ingress("1.1.1.1")])),
            &status(Some(vec![empty_ports]))
        ),
        "nil == empty ports"
    );
    let mut host = ingress("1.1.1.1");
    host.hostname = Some("lb.example".into());
    assert!(
        !eq(
            &status(Some(vec![ingress("1.1.1.1")])),
            &status(Some(vec![host]))
        ),
        "hostname"
    );
}

#[test]
fn keys() {
    assert_eq!(split_key("ns/name"), Ok(("ns".into(), "name".into())));
    assert_eq!(split_key("name"), Ok((String::new(), "name".into())));
    assert_eq!(
        split_key("a/b/c"),
        Err("unexpected key format: \"a/b/c\"".into())
    );
    assert_eq!(crate::runtime::informer::cache_key(&lb()), "default/svc");
}
