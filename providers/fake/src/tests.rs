//! The provider exercised through the SDK traits, as the host's call layer would.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_provider_abi::prelude::*;
use serde_json::json;

use crate::config::{GoDuration, RouteConfig};
use crate::control::{self, read_calls, write_control, CALLS_FILE, CONTROL_FILE};
use crate::*;

fn ctx() -> CallContext {
    CallContext::new(Some(Duration::from_secs(30)))
}

fn fake(config: &str) -> FakeCloud {
    FakeCloud::new(FAKE, Flavour::Fake, Some(config.as_bytes())).expect("config is valid")
}

fn fake_with(config: FakeConfig) -> FakeCloud {
    FakeCloud::from_config(FAKE, Flavour::Fake, config).expect("config is valid")
}

fn node(name: &str, provider_id: Option<&str>) -> Node {
    let mut n = json!({ "metadata": { "name": name } });
    if let Some(id) = provider_id {
        n["spec"] = json!({ "providerID": id });
    }
    serde_json::from_value(n).unwrap()
}

fn nodes(names: &[&str]) -> Vec<Node> {
    names.iter().map(|n| node(n, None)).collect()
}

fn service(ns: &str, name: &str) -> Service {
    serde_json::from_value(json!({
        "metadata": { "namespace": ns, "name": name, "uid": "1b4e28ba-2fa1-11d2-883f-0016d3cca427" },
        "spec": { "type": "LoadBalancer", "ports": [
            { "name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080 },
            { "name": "dns", "port": 53, "protocol": "UDP" }
        ] }
    }))
    .unwrap()
}

fn ip_of(status: &LoadBalancerStatus) -> String {
    status.ingress.as_ref().unwrap()[0].ip.clone().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Configuration and registration
// ---------------------------------------------------------------------------------------------

#[test]
fn yaml_and_json_configs_are_equivalent() {
    let yaml = r#"
providerName: aws
externalIP: 192.0.2.10
instances:
  - name: node-a
    providerID: aws:///zone/i-1
    instanceType: m5.large
    addresses: [{type: InternalIP, address: 10.1.0.1}]
errors:
  EnsureLoadBalancer: {kind: retry_after, retryAfter: 42s, times: 1}
latency: {"*": 1ms}
"#;
    let json = r#"{
  "providerName": "aws", "externalIP": "192.0.2.10",
  "instances": [{"name": "node-a", "providerID": "aws:///zone/i-1", "instanceType": "m5.large",
                 "addresses": [{"type": "InternalIP", "address": "10.1.0.1"}]}],
  "errors": {"EnsureLoadBalancer": {"kind": "retry_after", "retryAfter": "42s", "times": 1}},
  "latency": {"*": "1ms"}
}"#;
    let a = FakeConfig::parse(yaml.as_bytes()).unwrap();
    let b = FakeConfig::parse(json.as_bytes()).unwrap();
    assert_eq!(a, b);
    assert_eq!(
        a.errors["EnsureLoadBalancer"].retry_after,
        Some(GoDuration(Duration::from_secs(42)))
    );
    // The Serialize form parses back to the same value (what write_control relies on).
    let text = yaml_serde::to_string(&a).unwrap();
    assert_eq!(FakeConfig::parse(text.as_bytes()).unwrap(), a);
    assert_eq!(FakeConfig::parse(b"  \n").unwrap(), FakeConfig::default());
}

#[test]
fn config_errors_name_the_problem() {
    let err = |text: &str| {
        let e = FakeConfig::parse(text.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG, "{e:?}");
        e.to_string()
    };
    let e = err("instances:\n  - name: a\n    instanceTyp: x\n");
    assert!(e.contains("unknown field `instanceTyp`"), "{e}");
    assert!(e.contains("instanceType"), "lists the expected fields: {e}");
    let e = err("disableLoadbalancers: true");
    assert!(e.contains("disableLoadbalancers"), "{e}");
    let e = err("errors: {EnsureLB: {kind: other}}");
    assert!(
        e.contains("unknown method \"EnsureLB\"") && e.contains("EnsureLoadBalancer"),
        "{e}"
    );
    let e = err("errors: {EnsureLoadBalancer: {kind: retry_after}}");
    assert!(e.contains("needs retryAfter"), "{e}");
    let e = err("errors: {EnsureLoadBalancer: {kind: boom}}");
    assert!(e.contains("unknown variant `boom`"), "{e}");
    let e = err("latency: {ListRoutes: fast}");
    assert!(e.contains("is not a duration"), "{e}");
    let e = err("ipPool: 10.0.0.0");
    assert!(e.contains("not a CIDR"), "{e}");
    let e = err("instances: [{name: a}, {name: a}]");
    assert!(e.contains("listed twice"), "{e}");
}

#[test]
fn flavours_and_provider_name() {
    let full = FakeCloud::new(FAKE, Flavour::Fake, None).unwrap();
    assert_eq!(full.provider_name(), "fake");
    assert!(full.has_cluster_id());
    assert!(full.instances_v2().is_some() && full.instances().is_some());
    assert!(full.load_balancer().is_some() && full.routes().is_some());
    assert!(full.zones().is_some() && full.clusters().is_some());

    let v1 = FakeCloud::new(FAKE_V1, Flavour::FakeV1, None).unwrap();
    assert_eq!(v1.provider_name(), "fake-v1");
    assert!(v1.instances_v2().is_none());
    assert!(v1.instances().is_some() && v1.zones().is_some());

    let v1_with_v2 = FakeCloud::new(
        FAKE_V1,
        Flavour::FakeV1,
        Some(b"{disableInstancesV2: false, providerName: gce, hasClusterID: false}"),
    )
    .unwrap();
    assert!(v1_with_v2.instances_v2().is_some());
    assert_eq!(v1_with_v2.provider_name(), "gce");
    assert!(!v1_with_v2.has_cluster_id());

    let bare = fake("{disableInstances: true, disableLoadBalancers: true, disableRoutes: true, disableZones: true, disableClusters: true}");
    assert!(bare.instances().is_none() && bare.load_balancer().is_none());
    assert!(bare.routes().is_none() && bare.zones().is_none() && bare.clusters().is_none());
    assert!(bare.instances_v2().is_some());
}

#[test]
fn clusters_and_master() {
    let c = fake("{clusters: [one, two], master: 10.0.0.1}");
    assert_eq!(c.list_clusters(&ctx()).unwrap(), ["one", "two"]);
    assert_eq!(c.master(&ctx(), "one").unwrap(), "10.0.0.1");
    assert_eq!(c.call_names(), ["list-clusters", "master"]);
}

// ---------------------------------------------------------------------------------------------
// Instances
// ---------------------------------------------------------------------------------------------

const TWO_INSTANCES: &str = r#"
autoInstances: false
defaults: {instanceType: t.small, zone: z1, region: r1}
instances:
  - name: node-a
    providerID: fake://id-a
    instanceID: id-a
    zone: z2
    addresses: [{type: InternalIP, address: 10.0.0.1}]
    additionalLabels: {example.com/team: blue}
  - name: node-b
    providerID: fake://id-b
    instanceType: t.large
    shutdown: true
  - name: gone
    exists: false
  - name: nil-md
    metadataNil: true
"#;

#[test]
fn v2_lookup_prefers_provider_id_then_name() {
    let c = fake(TWO_INSTANCES);
    // providerID of node-a on a node named node-b: providerID wins.
    let md = c
        .instance_metadata(&ctx(), &node("node-b", Some("fake://id-a")))
        .unwrap()
        .unwrap();
    assert_eq!(md.provider_id, "fake://id-a");
    assert_eq!(md.zone, "z2");
    assert_eq!(md.region, "r1");
    assert_eq!(md.instance_type, "t.small");
    assert_eq!(md.additional_labels["example.com/team"], "blue");
    // Without (or with an unknown) providerID: by name.
    for pid in [None, Some("fake://unknown")] {
        let md = c
            .instance_metadata(&ctx(), &node("node-b", pid))
            .unwrap()
            .unwrap();
        assert_eq!(md.provider_id, "fake://id-b");
        assert_eq!(md.instance_type, "t.large");
        // Addresses left out: derived InternalIP + Hostname.
        assert_eq!(md.node_addresses[1].address, "node-b");
        assert!(md.node_addresses[0].address.starts_with("10."));
    }
    assert!(c.instance_shutdown(&ctx(), &node("node-b", None)).unwrap());
    assert!(!c.instance_shutdown(&ctx(), &node("node-a", None)).unwrap());
    assert!(c
        .instance_metadata(&ctx(), &node("nil-md", None))
        .unwrap()
        .is_none());
    assert!(!c.instance_exists(&ctx(), &node("gone", None)).unwrap());
    let e = c
        .instance_metadata(&ctx(), &node("gone", None))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INSTANCE_NOT_FOUND);
    let names = c.call_names();
    assert!(
        names.iter().all(|n| n.starts_with("instance-")),
        "{names:?}"
    );
    assert_eq!(names[0], "instance-metadata-by-provider-id");
}

#[test]
fn bulk_lookups_answer_like_the_per_node_methods_in_one_call() {
    let off = fake(TWO_INSTANCES);
    assert!(off.bulk_instances().is_none(), "off by default");
    // node-a fails its metadata lookups (its own errors), twice; the others are unaffected.
    let mut config: FakeConfig = yaml_serde::from_str(TWO_INSTANCES).unwrap();
    config.bulk_instances = true;
    config.instances[0].errors.insert(
        "InstanceMetadata".into(),
        ErrorSpec::new(InjectedKind::Unauthorized).times(2),
    );
    let c = fake_with(config);
    let bulk = c
        .bulk_instances()
        .expect("bulkInstances: true offers BulkInstances");
    let asked = [
        node("node-a", None),
        node("node-b", Some("fake://id-b")),
        node("gone", None),
        node("nil-md", None),
        node("unknown", None),
    ];
    let all = InstanceQuery::EXISTS
        .with(InstanceQuery::SHUTDOWN)
        .with(InstanceQuery::METADATA);
    let answers = bulk.instances_batch(&ctx(), &asked, all).unwrap();
    assert_eq!(answers.len(), 5);
    assert_eq!(
        answers[0].as_ref().unwrap_err().kind(),
        ErrorKind::UNAUTHORIZED,
        "node-a's own error fails node-a only"
    );
    let b = answers[1].as_ref().unwrap();
    assert!(b.exists && b.shutdown);
    let md = b.metadata.as_ref().unwrap();
    assert_eq!(
        (md.provider_id.as_str(), md.instance_type.as_str()),
        ("fake://id-b", "t.large")
    );
    assert_eq!(
        answers[2].as_ref().unwrap(),
        &InstanceStatus::default(),
        "exists: false is an answer, not an error"
    );
    let nil = answers[3].as_ref().unwrap();
    assert!(
        nil.exists && nil.metadata.is_none(),
        "metadataNil: exists, no metadata"
    );
    assert!(!answers[4].as_ref().unwrap().exists, "unknown instance");
    // Only what was asked: no metadata, no shutdown.
    let exists_only = bulk
        .instances_batch(&ctx(), &asked[1..2], InstanceQuery::EXISTS)
        .unwrap();
    assert_eq!(
        exists_only[0].as_ref().unwrap(),
        &InstanceStatus {
            exists: true,
            ..Default::default()
        }
    );
    // The second error of node-a, then it answers.
    assert!(bulk.instances_batch(&ctx(), &asked[..1], all).unwrap()[0].is_err());
    assert!(bulk.instances_batch(&ctx(), &asked[..1], all).unwrap()[0].is_ok());
    // One call record per batch, naming the nodes and the query.
    let calls = c.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert!(calls.iter().all(|c| c.call == "instances-batch"));
    assert_eq!(
        calls[0].args,
        json!({"nodes": ["node-a", "node-b", "gone", "nil-md", "unknown"],
               "query": ["InstanceExists", "InstanceShutdown", "InstanceMetadata"]})
    );
    // A batch-level fault fails the call.
    let mut config: FakeConfig = yaml_serde::from_str(TWO_INSTANCES).unwrap();
    config.bulk_instances = true;
    config.errors.insert(
        "InstancesBatch".into(),
        ErrorSpec::new(InjectedKind::Throttled),
    );
    let throttled = fake_with(config);
    let e = throttled
        .bulk_instances()
        .unwrap()
        .instances_batch(&ctx(), &asked, all)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::THROTTLED);
}

#[test]
fn legacy_instances_and_zones() {
    let c = fake(TWO_INSTANCES);
    let x = ctx();
    assert_eq!(c.instance_id(&x, "node-a").unwrap(), "id-a");
    assert_eq!(c.instance_id(&x, "node-b").unwrap(), "node-b");
    assert_eq!(c.instance_type(&x, "node-b").unwrap(), "t.large");
    assert_eq!(
        c.instance_type_by_provider_id(&x, "fake://id-a").unwrap(),
        "t.small"
    );
    assert_eq!(
        c.node_addresses(&x, "node-a").unwrap(),
        [NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into()
        }]
    );
    assert_eq!(
        c.node_addresses_by_provider_id(&x, "fake://id-a")
            .unwrap()
            .len(),
        1
    );
    assert!(c.instance_exists_by_provider_id(&x, "fake://id-a").unwrap());
    assert!(!c.instance_exists_by_provider_id(&x, "fake://nope").unwrap());
    assert!(c
        .instance_shutdown_by_provider_id(&x, "fake://id-b")
        .unwrap());
    assert!(c.instance_shutdown_by_provider_id(&x, "").is_err());
    for name in ["gone", "unknown"] {
        assert_eq!(
            c.instance_id(&x, name).unwrap_err().kind(),
            ErrorKind::INSTANCE_NOT_FOUND
        );
    }
    assert_eq!(c.current_node_name(&x, "h1").unwrap(), "h1");
    let z = c.get_zone_by_node_name(&x, "node-a").unwrap();
    assert_eq!((z.failure_domain.as_str(), z.region.as_str()), ("z2", "r1"));
    let z = c.get_zone_by_provider_id(&x, "fake://id-b").unwrap();
    assert_eq!(z.failure_domain, "z1");
    assert_eq!(
        c.call_names(),
        [
            "instance-id",
            "instance-id",
            "instance-type",
            "instance-type-by-provider-id",
            "node-addresses",
            "node-addresses-by-provider-id",
            "instance-exists-by-provider-id",
            "instance-exists-by-provider-id",
            "instance-shutdown-by-provider-id",
            "instance-shutdown-by-provider-id",
            "instance-id",
            "instance-id",
            "current-node-name",
            "get-zone-by-node-name",
            "get-zone-by-provider-id",
        ]
    );
    let rec = &c.calls()[0];
    assert_eq!(rec.seq, 1);
    assert_eq!(rec.provider, "fake");
    assert_eq!(rec.arg("node"), Some("node-a"));
}

#[test]
fn auto_instances_are_deterministic() {
    let a = FakeCloud::new(FAKE, Flavour::Fake, None).unwrap();
    let b = FakeCloud::new(FAKE, Flavour::Fake, None).unwrap();
    let md = |c: &FakeCloud, n: &str| {
        c.instance_metadata(&ctx(), &node(n, None))
            .unwrap()
            .unwrap()
    };
    // Different order of first use, same answers.
    let b2 = md(&b, "worker-2");
    let a1 = md(&a, "worker-1");
    let a2 = md(&a, "worker-2");
    assert_eq!(a2, b2);
    assert_eq!(a1, md(&b, "worker-1"));
    assert_ne!(a1.node_addresses[0], a2.node_addresses[0]);
    assert_eq!(a1.provider_id, "fake://worker-1");
    assert_eq!(a1.node_addresses[1].type_, "Hostname");
    assert_eq!(a1.instance_type, Defaults::default().instance_type);
    // The synthesised provider ID resolves back to the instance.
    assert_eq!(
        a.node_addresses_by_provider_id(&ctx(), "fake://worker-1")
            .unwrap(),
        a1.node_addresses
    );
    assert_eq!(a.instance_id(&ctx(), "worker-1").unwrap(), "worker-1");
    assert!(a.instance_exists(&ctx(), &node("worker-1", None)).unwrap());
    // 5,000 nodes: unique addresses.
    let mut seen = std::collections::HashSet::new();
    for i in 0..5000 {
        let md = md(&a, &format!("node-{i}"));
        assert!(seen.insert(md.node_addresses[0].address.clone()));
    }

    let strict = fake("autoInstances: false");
    assert!(!strict.instance_exists(&ctx(), &node("w", None)).unwrap());
    let e = strict
        .instance_metadata(&ctx(), &node("w", None))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INSTANCE_NOT_FOUND);
    let e = strict.instance_id(&ctx(), "w").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INSTANCE_NOT_FOUND);
    assert!(!strict
        .instance_exists_by_provider_id(&ctx(), "fake://w")
        .unwrap());
}

// ---------------------------------------------------------------------------------------------
// Load balancers
// ---------------------------------------------------------------------------------------------

#[test]
fn load_balancers_are_idempotent_with_stable_ips() {
    let c = fake("ipPool: 203.0.113.0/28\nipMode: Proxy");
    let x = ctx();
    let web = service("default", "web");
    let st = c
        .ensure_load_balancer(&x, "kubernetes", &web, &nodes(&["n2", "n1"]))
        .unwrap()
        .unwrap();
    let ingress = &st.ingress.as_ref().unwrap()[0];
    assert_eq!(ingress.ip_mode.as_deref(), Some("Proxy"));
    let ports = ingress.ports.as_ref().unwrap();
    assert_eq!((ports[0].port, ports[0].protocol.as_str()), (80, "TCP"));
    assert_eq!((ports[1].port, ports[1].protocol.as_str()), (53, "UDP"));
    let ip = ip_of(&st);
    assert!(ip.starts_with("203.0.113."), "{ip}");

    // Second ensure: same LB, same IP, hosts updated.
    let st2 = c
        .ensure_load_balancer(&x, "kubernetes", &web, &nodes(&["n3"]))
        .unwrap()
        .unwrap();
    assert_eq!(ip_of(&st2), ip);
    let state = c.state();
    assert_eq!(state.load_balancers.len(), 1);
    let lb = state.load_balancer("default/web").unwrap();
    assert_eq!(lb.hosts, ["n3"]);
    assert_eq!(lb.name, "a1b4e28ba2fa111d2883f0016d3cca42");
    assert_eq!(lb.ports[0].node_port, Some(30080));
    assert_eq!(
        c.get_load_balancer_name(&x, "kubernetes", &web).unwrap(),
        lb.name
    );

    // Another service gets another address.
    let api = service("prod", "api");
    let ip2 = ip_of(&c.ensure_load_balancer(&x, "k", &api, &[]).unwrap().unwrap());
    assert_ne!(ip2, ip);

    // Update replaces hosts; Get reports it.
    c.update_load_balancer(&x, "kubernetes", &web, &nodes(&["n1", "n2"]))
        .unwrap();
    assert_eq!(
        c.state().load_balancer("default/web").unwrap().hosts,
        ["n1", "n2"]
    );
    assert_eq!(
        ip_of(
            &c.get_load_balancer(&x, "kubernetes", &web)
                .unwrap()
                .unwrap()
        ),
        ip
    );

    // Delete releases; deleting again is fine; Update of a missing LB is NotFound.
    c.ensure_load_balancer_deleted(&x, "kubernetes", &web)
        .unwrap();
    c.ensure_load_balancer_deleted(&x, "kubernetes", &web)
        .unwrap();
    assert!(c
        .get_load_balancer(&x, "kubernetes", &web)
        .unwrap()
        .is_none());
    let e = c
        .update_load_balancer(&x, "kubernetes", &web, &[])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NOT_FOUND);
    // Re-created: the freed address is the one its hash picks again.
    let again = c
        .ensure_load_balancer(&x, "kubernetes", &web, &[])
        .unwrap()
        .unwrap();
    assert_eq!(ip_of(&again), ip);

    let names = c.call_names();
    assert_eq!(
        names,
        [
            "create",
            "create",
            "get-load-balancer-name",
            "create",
            "update",
            "get-load-balancer",
            "delete",
            "delete",
            "get-load-balancer",
            "update",
            "create"
        ]
    );
    let first = &c.calls()[0];
    assert_eq!(first.arg("service"), Some("default/web"));
    assert_eq!(first.hosts(), ["n1", "n2"]);
}

#[test]
fn pool_exhaustion_and_release() {
    let c = fake("ipPool: 192.0.2.0/30");
    let x = ctx();
    let a = service("ns", "a");
    let b = service("ns", "b");
    let d = service("ns", "d");
    c.ensure_load_balancer(&x, "k", &a, &[]).unwrap();
    c.ensure_load_balancer(&x, "k", &b, &[]).unwrap();
    let e = c.ensure_load_balancer(&x, "k", &d, &[]).unwrap_err();
    assert!(e.to_string().contains("exhausted"), "{e}");
    c.ensure_load_balancer_deleted(&x, "k", &a).unwrap();
    c.ensure_load_balancer(&x, "k", &d, &[]).unwrap();
}

#[test]
fn external_ip_requested_ip_nil_status_and_elsewhere() {
    let c =
        fake("externalIP: 192.0.2.99\nensureReturnsNil: true\nimplementedElsewhere: [other/svc]");
    let x = ctx();
    let web = service("default", "web");
    assert!(c
        .ensure_load_balancer(&x, "k", &web, &[])
        .unwrap()
        .is_none());
    assert_eq!(
        ip_of(&c.get_load_balancer(&x, "k", &web).unwrap().unwrap()),
        "192.0.2.99"
    );
    let other = service("other", "svc");
    let e = c.ensure_load_balancer(&x, "k", &other, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IMPLEMENTED_ELSEWHERE);
    let e = c.update_load_balancer(&x, "k", &other, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::IMPLEMENTED_ELSEWHERE);
    assert!(c.get_load_balancer(&x, "k", &other).unwrap().is_none());
    c.ensure_load_balancer_deleted(&x, "k", &other).unwrap();

    let pool = fake("{}");
    let mut fixed = service("default", "fixed");
    fixed.spec.as_mut().unwrap().load_balancer_ip = Some("198.51.100.7".into());
    let st = pool
        .ensure_load_balancer(&x, "k", &fixed, &[])
        .unwrap()
        .unwrap();
    assert_eq!(ip_of(&st), "198.51.100.7");
    assert_eq!(st.ingress.unwrap()[0].ip_mode, None);
}

// ---------------------------------------------------------------------------------------------
// Routes
// ---------------------------------------------------------------------------------------------

#[test]
fn routes_create_list_delete() {
    let mut config = FakeConfig {
        route_enable_node_addresses: true,
        ..FakeConfig::default()
    };
    config.routes.push(RouteConfig {
        name: Some("old".into()),
        cluster: "kubernetes".into(),
        target_node: "gone".into(),
        destination_cidr: "10.244.9.0/24".into(),
        blackhole: true,
        target_node_addresses: vec![],
    });
    let c = fake_with(config);
    let x = ctx();
    let route = Route {
        target_node: "n1".into(),
        destination_cidr: "10.244.1.0/24".into(),
        target_node_addresses: vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.1".into(),
        }],
        ..Route::default()
    };
    c.create_route(&x, "kubernetes", "uid-1", &route).unwrap();
    let e = c
        .create_route(&x, "kubernetes", "uid-1", &route)
        .unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    // Another cluster is another namespace.
    c.create_route(&x, "other", "uid-1", &route).unwrap();

    let list = c.list_routes(&x, "kubernetes").unwrap();
    assert_eq!(list.len(), 2);
    let created = list.iter().find(|r| r.target_node == "n1").unwrap();
    assert_eq!(created.name, "kubernetes-n1-10.244.1.0/24");
    assert!(created.enable_node_addresses);
    assert_eq!(created.target_node_addresses, route.target_node_addresses);
    assert!(list.iter().any(|r| r.name == "old" && r.blackhole));

    c.delete_route(&x, "kubernetes", created).unwrap();
    let e = c.delete_route(&x, "kubernetes", created).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NOT_FOUND);
    assert_eq!(c.list_routes(&x, "kubernetes").unwrap().len(), 1);
    assert_eq!(c.list_routes(&x, "other").unwrap().len(), 1);
    assert_eq!(c.state().routes.len(), 2);
    let create = c
        .calls()
        .into_iter()
        .find(|r| r.call == "create-route")
        .unwrap();
    assert_eq!(create.arg("cidr"), Some("10.244.1.0/24"));
    assert_eq!(create.arg("node"), Some("n1"));

    // Without routeEnableNodeAddresses the addresses are not reported.
    let plain = fake("{}");
    plain.create_route(&x, "k", "", &route).unwrap();
    let r = &plain.list_routes(&x, "k").unwrap()[0];
    assert!(!r.enable_node_addresses && r.target_node_addresses.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------------------------

#[test]
fn injected_errors_with_times_and_retry_after() {
    let c = fake(
        r#"
errors:
  InstanceMetadata: {kind: other, message: cloud is down, times: 2}
  EnsureLoadBalancer: {kind: retry_after, retryAfter: 42s}
  "*": {kind: not_implemented, times: 1}
instances:
  - name: flaky
    errors: {InstanceExists: {kind: other, times: 1}}
"#,
    );
    let x = ctx();
    let n = node("n", None);
    for _ in 0..2 {
        let e = c.instance_metadata(&x, &n).unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            (ErrorKind::OTHER, "cloud is down")
        );
    }
    assert!(c.instance_metadata(&x, &n).unwrap().is_some());

    let e = c
        .ensure_load_balancer(&x, "k", &service("a", "b"), &[])
        .unwrap_err();
    assert_eq!(e.retry_after_delay(), Some(Duration::from_secs(42)));
    assert!(
        c.state().load_balancers.is_empty(),
        "nothing stored on error"
    );

    // "*" applies to methods without their own entry, once.
    assert_eq!(
        c.list_routes(&x, "k").unwrap_err(),
        ProviderError::not_implemented()
    );
    c.list_routes(&x, "k").unwrap();

    // Per-instance errors only hit that instance.
    assert!(c.instance_exists(&x, &node("other", None)).unwrap());
    assert!(c.instance_exists(&x, &node("flaky", None)).is_err());
    assert!(c.instance_exists(&x, &node("flaky", None)).unwrap());
    // Failing calls are still recorded.
    assert_eq!(c.call_names()[0], "instance-metadata-by-provider-id");
    assert_eq!(c.calls().len(), 9);
}

#[test]
fn injected_abi_1_1_kinds() {
    let c = fake(
        r#"
errors:
  InstanceExists: {kind: throttled, retryAfter: 1500ms}
  InstanceShutdown: {kind: throttled}
  InstanceMetadata: {kind: unauthorized, message: "403 Forbidden: ec2:DescribeInstances"}
  ListRoutes: {kind: cancelled}
"#,
    );
    let (x, n) = (ctx(), node("n", None));
    let e = c.instance_exists(&x, &n).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::THROTTLED);
    assert_eq!(e.throttle_delay(), Some(Some(Duration::from_millis(1500))));
    assert_eq!(e.to_string(), "injected throttling in InstanceExists");
    let e = c.instance_shutdown(&x, &n).unwrap_err();
    assert_eq!(e.throttle_delay(), Some(None));
    let e = c.instance_metadata(&x, &n).unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string().as_str()),
        (
            ErrorKind::UNAUTHORIZED,
            "403 Forbidden: ec2:DescribeInstances"
        )
    );
    let e = c.list_routes(&x, "k").unwrap_err();
    assert_eq!(
        (e.kind(), e.to_string().as_str()),
        (ErrorKind::CANCELLED, "injected cancellation in ListRoutes")
    );
}

#[test]
fn latency_and_panics() {
    let c = fake("latency: {InstanceExists: 30ms}\npanics: [ListRoutes]");
    let start = Instant::now();
    c.instance_exists(&ctx(), &node("n", None)).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(30));
    let start = Instant::now();
    c.instance_shutdown(&ctx(), &node("n", None)).unwrap();
    assert!(start.elapsed() < Duration::from_millis(30));
    let c2 = c.clone();
    let r = std::panic::catch_unwind(move || c2.list_routes(&ctx(), "k"));
    assert!(r.is_err(), "ListRoutes panics");

    // Latency longer than the deadline ends at the deadline.
    let slow = fake("latency: {\"*\": 10s}");
    let short = CallContext::new(Some(Duration::from_millis(40)));
    let start = Instant::now();
    let e = slow.instance_exists(&short, &node("n", None)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DEADLINE_EXCEEDED);
    assert!(start.elapsed() < Duration::from_millis(500));
}

#[test]
fn hang_observes_cancellation_quickly() {
    let dir = tempfile::tempdir().unwrap();
    let config = FakeConfig {
        state_dir: Some(dir.path().to_path_buf()),
        hang: vec!["EnsureLoadBalancer".into()],
        ..FakeConfig::default()
    };
    let c = fake_with(config);
    let x = CallContext::background();
    let plugin_ctx = x.clone();
    let c2 = c.clone();
    let t = std::thread::spawn(move || {
        let r = c2.ensure_load_balancer(&plugin_ctx, "k", &service("a", "b"), &[]);
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(100));
    assert!(!t.is_finished(), "hangs until cancelled");
    let cancelled_at = Instant::now();
    x.cancel();
    let (r, ended_at) = t.join().unwrap();
    assert_eq!(r.unwrap_err().kind(), ErrorKind::CANCELLED);
    let took = ended_at - cancelled_at;
    assert!(took < Duration::from_millis(50), "took {took:?}");
    let calls = read_calls(dir.path()).unwrap();
    let names: Vec<_> = calls.iter().map(|c| c.call.as_str()).collect();
    assert_eq!(names, ["create", "cancel-observed"]);
    assert_eq!(calls[1].arg("method"), Some("EnsureLoadBalancer"));
    assert_eq!(calls[1].seq, 2);
}

#[test]
fn pause_gate_blocks_until_the_file_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    std::fs::write(&gate, b"").unwrap();
    let mut config = FakeConfig::default();
    config
        .pause
        .insert("UpdateLoadBalancer".into(), gate.clone());
    let c = fake_with(config);
    let svc = service("a", "b");
    c.ensure_load_balancer(&ctx(), "k", &svc, &[]).unwrap();
    let c2 = c.clone();
    let svc2 = svc.clone();
    let t =
        std::thread::spawn(move || c2.update_load_balancer(&ctx(), "k", &svc2, &nodes(&["n1"])));
    std::thread::sleep(Duration::from_millis(60));
    assert!(!t.is_finished());
    // The call is already in the log while it waits: a test can act on it.
    assert_eq!(c.call_names(), ["create", "update"]);
    assert!(c.state().load_balancer("a/b").unwrap().hosts.is_empty());
    std::fs::remove_file(&gate).unwrap();
    t.join().unwrap().unwrap();
    assert_eq!(c.state().load_balancer("a/b").unwrap().hosts, ["n1"]);

    // A paused call still ends with its context.
    std::fs::write(&gate, b"").unwrap();
    let short = CallContext::new(Some(Duration::from_millis(30)));
    let e = c.update_load_balancer(&short, "k", &svc, &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DEADLINE_EXCEEDED);
    assert_eq!(c.call_names().last().unwrap(), "cancel-observed");
}

// ---------------------------------------------------------------------------------------------
// stateDir: control file, call log, cloud.json
// ---------------------------------------------------------------------------------------------

fn state_dir_cloud(dir: &Path, extra: &str) -> FakeCloud {
    let text = format!("stateDir: {}\n{extra}", dir.display());
    fake(&text)
}

#[test]
fn control_file_reloads_and_keeps_last_good_settings() {
    let dir = tempfile::tempdir().unwrap();
    let c = state_dir_cloud(dir.path(), "autoInstances: false\n");
    let x = ctx();
    let n = node("n1", None);
    assert!(!c.instance_exists(&x, &n).unwrap());

    let mut control = FakeConfig {
        auto_instances: false,
        ..FakeConfig::default()
    };
    control.instances.push(InstanceConfig {
        instance_type: Some("big".into()),
        ..InstanceConfig::named("n1")
    });
    write_control(dir.path(), &control).unwrap();
    assert!(c.instance_exists(&x, &n).unwrap());
    assert_eq!(
        c.instance_metadata(&x, &n).unwrap().unwrap().instance_type,
        "big"
    );

    // A broken control file is ignored; the last good settings stay.
    std::fs::write(dir.path().join(CONTROL_FILE), "instances: [{nam: n1}]").unwrap();
    assert!(c.instance_exists(&x, &n).unwrap());
    std::fs::write(dir.path().join(CONTROL_FILE), "stateDir: /elsewhere").unwrap();
    assert!(c.instance_exists(&x, &n).unwrap());

    // Live fault knobs; `times` restarts with each new control file.
    control.errors.insert(
        "InstanceExists".into(),
        ErrorSpec::new(InjectedKind::InstanceNotFound).times(1),
    );
    write_control(dir.path(), &control).unwrap();
    assert_eq!(
        c.instance_exists(&x, &n).unwrap_err().kind(),
        ErrorKind::INSTANCE_NOT_FOUND
    );
    assert!(c.instance_exists(&x, &n).unwrap());

    // Creation-time settings are not live.
    control.disable_instances_v2 = Some(true);
    control.provider_name = Some("other".into());
    write_control(dir.path(), &control).unwrap();
    assert!(c.instances_v2().is_some());
    assert_eq!(
        c.instance_metadata(&x, &n).unwrap().unwrap().provider_id,
        "fake://n1"
    );

    // Removing the control file goes back to --cloud-config.
    control::remove_control(dir.path()).unwrap();
    assert!(!c.instance_exists(&x, &n).unwrap());
}

#[test]
fn control_file_present_at_start_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    write_control(
        dir.path(),
        &FakeConfig {
            external_ip: Some("192.0.2.1".into()),
            ..FakeConfig::default()
        },
    )
    .unwrap();
    let c = state_dir_cloud(dir.path(), "");
    let st = c
        .ensure_load_balancer(&ctx(), "k", &service("a", "b"), &[])
        .unwrap()
        .unwrap();
    assert_eq!(ip_of(&st), "192.0.2.1");
}

#[test]
fn reconfigure_applies_new_config_in_place_and_refuses_creation_time_changes() {
    let dir = tempfile::tempdir().unwrap();
    let c = state_dir_cloud(dir.path(), "defaults: {instanceType: small}\n");
    let x = ctx();
    let n = node("n1", None);
    let kind = |c: &FakeCloud| c.instance_metadata(&x, &n).unwrap().unwrap().instance_type;
    assert_eq!(kind(&c), "small");

    let text = |extra: &str| format!("stateDir: {}\n{extra}", dir.path().display());
    c.reconfigure(&x, text("defaults: {instanceType: large}\n").as_bytes())
        .unwrap();
    assert_eq!(
        kind(&c),
        "large",
        "the same instance answers with the new config"
    );
    assert!(read_calls(dir.path())
        .unwrap()
        .iter()
        .any(|r| r.call == "reconfigure"));

    // Bad bytes and creation-time changes are refused; the config in force stays.
    let e = c
        .reconfigure(&x, b"defaults: {instanceTyp: x}")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
    let e = c
        .reconfigure(
            &x,
            text("disableRoutes: true\nproviderName: other\n").as_bytes(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
    assert!(
        e.message().contains("disableRoutes, providerName"),
        "{}",
        e.message()
    );
    let e = c.reconfigure(&x, b"{}").unwrap_err();
    assert!(e.message().contains("stateDir"), "{}", e.message());
    assert_eq!(kind(&c), "large");

    // A control file in force stays in force; removing it goes back to the reconfigured config.
    write_control(
        dir.path(),
        &FakeConfig {
            defaults: crate::config::Defaults {
                instance_type: "control".into(),
                ..Default::default()
            },
            ..FakeConfig::default()
        },
    )
    .unwrap();
    assert_eq!(kind(&c), "control");
    c.reconfigure(&x, text("defaults: {instanceType: xl}\n").as_bytes())
        .unwrap();
    assert_eq!(kind(&c), "control");
    control::remove_control(dir.path()).unwrap();
    assert_eq!(kind(&c), "xl");

    // The switch: NOT_IMPLEMENTED, so that the host rebuilds the provider instead.
    c.reconfigure(
        &x,
        text("defaults: {instanceType: xl}\nreconfigure: notImplemented\n").as_bytes(),
    )
    .unwrap();
    let e = c
        .reconfigure(&x, text("defaults: {instanceType: xxl}\n").as_bytes())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NOT_IMPLEMENTED);
    assert_eq!(kind(&c), "xl");
}

#[test]
fn health_follows_the_health_setting() {
    let dir = tempfile::tempdir().unwrap();
    let c = state_dir_cloud(dir.path(), "");
    let x = ctx();
    c.health(&x).unwrap();
    let mut control = FakeConfig {
        health: Some(ErrorSpec::new(InjectedKind::Unauthorized).message("credentials rejected")),
        ..FakeConfig::default()
    };
    write_control(dir.path(), &control).unwrap();
    let e = c.health(&x).unwrap_err();
    assert_eq!(
        (e.kind(), e.message()),
        (ErrorKind::UNAUTHORIZED, "credentials rejected")
    );
    control.health = Some(ErrorSpec::new(InjectedKind::NotImplemented));
    write_control(dir.path(), &control).unwrap();
    assert_eq!(c.health(&x).unwrap_err().kind(), ErrorKind::NOT_IMPLEMENTED);
    control::remove_control(dir.path()).unwrap();
    c.health(&x).unwrap();
    assert!(
        !read_calls(dir.path())
            .unwrap()
            .iter()
            .any(|r| r.call == "health"),
        "probes stay out of the call log"
    );
    // `retry_after` needs its delay here too.
    assert!(FakeCloud::new(FAKE, Flavour::Fake, Some(b"health: {kind: retry_after}")).is_err());
}

/// Poll `dir/cloud.json` until `pred` holds (5 s at most).
fn wait_for_state(dir: &Path, pred: impl Fn(&FakeState) -> bool) -> FakeState {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let state = FakeState::read(dir).unwrap();
        if pred(&state) {
            return state;
        }
        assert!(
            std::time::Instant::now() < until,
            "cloud.json never matched: {state:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn cloud_json_is_written_off_the_lock_and_changes_made_meanwhile_are_one_write() {
    let dir = tempfile::tempdir().unwrap();
    let c = state_dir_cloud(dir.path(), "");
    let x = ctx();
    let route = |i: usize| Route {
        target_node: format!("n{i}"),
        destination_cidr: format!("10.{}.{}.0/24", i / 256, i % 256),
        ..Route::default()
    };
    // A lone change is on disk when its call returns.
    c.create_route(&x, "kubernetes", "uid-0", &route(0))
        .unwrap();
    assert_eq!(FakeState::read(dir.path()).unwrap(), c.state());
    // 8 threads changing the cloud at once: the calls never wait for each other's writes
    // under the state lock, changes made during a write are written together, and the file
    // ends with every change.
    let written_before = c.state_file_writes();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let (c, x) = (c.clone(), x.clone());
            scope.spawn(move || {
                for i in 0..100 {
                    let n = 1 + t * 100 + i;
                    c.create_route(&x, "kubernetes", &format!("uid-{n}"), &route(n))
                        .unwrap();
                }
            });
        }
    });
    let state = wait_for_state(dir.path(), |s| s.routes.len() == 801);
    assert_eq!(state, c.state());
    let writes = c.state_file_writes() - written_before;
    assert!(
        writes < 800,
        "{writes} writes for 800 concurrent changes: none coalesced"
    );
    // A change handed to the writer thread is written when the cloud goes, at the latest.
    c.create_route(&x, "kubernetes", "uid-last", &route(900))
        .unwrap();
    drop(c);
    wait_for_state(dir.path(), |s| s.routes.len() == 802);
}

#[test]
fn reconfigure_to_the_provider_name_in_force_is_no_change() {
    let dir = tempfile::tempdir().unwrap();
    let text = |extra: &str| format!("stateDir: {}\n{extra}", dir.path().display());
    let x = ctx();
    // Registered as `fake`, no providerName: naming `fake` changes nothing.
    let c = state_dir_cloud(dir.path(), "");
    c.reconfigure(&x, text("providerName: fake\n").as_bytes())
        .unwrap();
    c.reconfigure(&x, text("").as_bytes()).unwrap();
    let e = c
        .reconfigure(&x, text("providerName: aws\n").as_bytes())
        .unwrap_err();
    assert!(e.message().contains("providerName"), "{}", e.message());
    drop(c);
    // providerName: aws in force: naming it again, or leaving it as it is, changes nothing.
    let c = state_dir_cloud(dir.path(), "providerName: aws\n");
    c.reconfigure(&x, text("providerName: aws\n").as_bytes())
        .unwrap();
    let e = c.reconfigure(&x, text("").as_bytes()).unwrap_err();
    assert!(e.message().contains("providerName"), "{}", e.message());
}

#[test]
fn call_log_and_cloud_state_files() {
    let dir = tempfile::tempdir().unwrap();
    let c = state_dir_cloud(dir.path(), "providerName: aws\n");
    assert_eq!(FakeState::read(dir.path()).unwrap(), FakeState::default());
    let x = ctx();
    let svc = service("default", "web");
    c.ensure_load_balancer(&x, "kubernetes", &svc, &nodes(&["b", "a"]))
        .unwrap();
    c.instance_exists_by_provider_id(&x, "aws://n1").unwrap();
    c.create_route(
        &x,
        "kubernetes",
        "uid",
        &Route {
            target_node: "a".into(),
            destination_cidr: "10.244.0.0/24".into(),
            ..Route::default()
        },
    )
    .unwrap();

    let text = std::fs::read_to_string(dir.path().join(CALLS_FILE)).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    // When and by which process: checked, then left out of the exact comparison.
    let first = lines[0].as_object_mut().unwrap();
    assert!(first.remove("at_ms").unwrap().as_u64().unwrap() > 0);
    assert_eq!(first.remove("pid").unwrap(), std::process::id());
    assert_eq!(
        lines[0],
        json!({"seq": 1, "call": "create", "provider": "aws",
               "args": {"cluster": "kubernetes", "service": "default/web", "hosts": ["a", "b"]}})
    );
    assert_eq!(lines[1]["args"], json!({"providerID": "aws://n1"}));
    assert_eq!(lines[2]["call"], "create-route");

    let state = FakeState::read(dir.path()).unwrap();
    assert_eq!(state, c.state());
    assert_eq!(state.load_balancers[0].hosts, ["a", "b"]);
    assert_eq!(state.routes[0].name, "kubernetes-a-10.244.0.0/24");

    control::clear_calls(dir.path()).unwrap();
    assert!(read_calls(dir.path()).unwrap().is_empty());
    c.list_routes(&x, "kubernetes").unwrap();
    let calls = control::calls_named(dir.path(), "list-routes").unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].seq, 4);
}

#[test]
fn shared_state_is_taken_over_from_cloud_json() {
    // Initialize (once per leadership) reloads the same way; the host's soak test covers that
    // through the real binary.
    let dir = tempfile::tempdir().unwrap();
    let extra = "sharedState: true\nipPool: 10.9.0.0/30\n";
    let a = state_dir_cloud(dir.path(), extra);
    let x = ctx();
    let web = service("default", "web");
    let ip = ip_of(
        &a.ensure_load_balancer(&x, "k", &web, &nodes(&["n1"]))
            .unwrap()
            .unwrap(),
    );
    a.create_route(
        &x,
        "k",
        "uid",
        &Route {
            target_node: "n1".into(),
            destination_cidr: "10.244.1.0/24".into(),
            ..Route::default()
        },
    )
    .unwrap();
    // A process created now starts from the shared state, not from an empty cloud.
    let b = state_dir_cloud(dir.path(), extra);
    assert_eq!(b.state(), a.state());
    assert!(b.get_load_balancer(&x, "k", &web).unwrap().is_some());
    // The restored address is taken: another service gets the pool's other address.
    let other = ip_of(
        &b.ensure_load_balancer(&x, "k", &service("default", "other"), &[])
            .unwrap()
            .unwrap(),
    );
    assert_ne!(other, ip);
    b.ensure_load_balancer_deleted(&x, "k", &web).unwrap();
    let c = state_dir_cloud(dir.path(), extra);
    assert_eq!(c.state(), b.state());
    assert_eq!(c.state().load_balancers[0].service, "other");
    assert_eq!(c.state().routes.len(), 1);
    // Without sharedState a new cloud starts empty (and publishes that).
    let d = state_dir_cloud(dir.path(), "");
    assert_eq!(d.state(), FakeState::default());
    // Calls carry the process id.
    let calls = read_calls(dir.path()).unwrap();
    assert!(!calls.is_empty());
    assert!(calls.iter().all(|r| r.pid == std::process::id()));

    let Err(err) = FakeCloud::new(FAKE, Flavour::Fake, Some(b"sharedState: true")) else {
        panic!("sharedState without stateDir is refused");
    };
    assert!(
        err.message().contains("sharedState needs stateDir"),
        "{err}"
    );
}

#[test]
fn concurrent_calls_keep_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(state_dir_cloud(dir.path(), ""));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..250 {
                    let n = node(&format!("node-{t}-{i}"), None);
                    c.instance_metadata(&ctx(), &n).unwrap().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let calls = read_calls(dir.path()).unwrap();
    assert_eq!(calls.len(), 1000);
    let seqs: Vec<u64> = calls.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (1..=1000).collect::<Vec<_>>());
}

#[test]
fn documented_example_config_parses() {
    let doc = include_str!("../../../docs/fake-provider.md");
    let start = doc.find("```yaml\n").expect("doc has a yaml example") + "```yaml\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let config = FakeConfig::parse(&doc.as_bytes()[start..end]).expect("documented example parses");
    assert_eq!(config.instances[0].name, "node-a");
    assert_eq!(config.routes.len(), 1);
    assert_eq!(config.errors.len(), 4);
    assert_eq!(
        config.errors["InstanceMetadata"].kind,
        crate::config::InjectedKind::Throttled
    );
}
