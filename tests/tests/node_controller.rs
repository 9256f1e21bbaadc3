//! Cloud-node controller against the in-memory API server and the fake provider's `.so`
//! (docs/upstream-compat.md#node-controller, with the cases of upstream's
//! `controllers/node/node_controller_test.go`), V1 (`fake-v1`: Instances + Zones) and V2 (`fake`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_host::controllers::node::{self, NodeController};
use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use serde_json::{json, Value};

const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const WAIT: Duration = Duration::from_secs(20);

fn fake(config: Value) -> FakeConfig {
    serde_json::from_value(config).expect("fake config")
}

fn cloud_taint() -> Value {
    json!({"key": TAINT, "value": "true", "effect": "NoSchedule"})
}

/// A node as kubelet registers it with an external cloud provider.
fn node(name: &str, taints: Value, extra: Value) -> Value {
    let mut n = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "spec": {"taints": taints},
        "status": {
            "addresses": [{"type": "Hostname", "address": "kubelet-hostname"}],
            "conditions": [{"type": "Ready", "status": "Unknown"}],
        },
    });
    merge(&mut n, extra);
    n
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn cfg() -> ControllerConfig {
    ControllerConfig {
        // The periodic loop's first pass runs at start; later passes only where a test wants them.
        node_status_update_frequency: Duration::from_secs(3600),
        concurrent_node_syncs: 2,
        ..Default::default()
    }
}

async fn synced(h: &Harness, config: ControllerConfig) -> ControllerContext {
    let ctx = h.context(config);
    assert!(ctx.nodes.wait_synced().await);
    ctx
}

fn stored(h: &Harness, name: &str) -> Value {
    h.server
        .controls()
        .get("nodes", "", name)
        .unwrap_or_else(|| panic!("node {name} is stored"))
}

fn labels(n: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(n["metadata"]["labels"].clone()).unwrap_or_default()
}

fn owned(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn addresses(n: &Value) -> Vec<(String, String)> {
    n["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            (
                a["type"].as_str().unwrap().to_string(),
                a["address"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn addrs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(t, a)| (t.to_string(), a.to_string()))
        .collect()
}

fn taint_keys(n: &Value) -> Option<Vec<String>> {
    n["spec"]["taints"].as_array().map(|ts| {
        ts.iter()
            .map(|t| {
                format!(
                    "{}:{}",
                    t["key"].as_str().unwrap(),
                    t["effect"].as_str().unwrap()
                )
            })
            .collect()
    })
}

fn events(h: &Harness, node: &str) -> Vec<Value> {
    h.server
        .controls()
        .list("events")
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == node)
        .collect()
}

/// (update count, status patch count) of successful writes to the node from the request log.
fn writes(h: &Harness, name: &str) -> (usize, usize) {
    let reqs = h.server.controls().requests();
    let count = |verb: &str, sub: &str| {
        reqs.iter()
            .filter(|r| {
                r.resource == "nodes"
                    && r.name == name
                    && r.verb == verb
                    && r.subresource == sub
                    && r.code < 300
            })
            .count()
    };
    (count("update", ""), count("patch", "status"))
}

fn all_node_writes(h: &Harness, name: &str) -> usize {
    h.server
        .controls()
        .requests()
        .iter()
        .filter(|r| {
            r.resource == "nodes"
                && r.name == name
                && matches!(r.verb.as_str(), "update" | "patch" | "delete" | "create")
        })
        .count()
}

/// Start the controller and wait until the node carries the `Synced` event.
async fn initialise(h: &Harness, name: &str) -> (Value, tokio::task::JoinHandle<()>) {
    let ctx = synced(h, cfg()).await;
    let task = tokio::spawn(node::run(ctx));
    eventually("Synced event", WAIT, || {
        events(h, name)
            .iter()
            .any(|e| e["reason"] == "Synced")
            .then_some(())
    })
    .await;
    (stored(h, name), task)
}

fn assert_synced_event(h: &Harness, name: &str) {
    let evs = events(h, name);
    assert_eq!(evs.len(), 1, "exactly one event: {evs:#?}");
    let e = &evs[0];
    assert_eq!(e["type"], "Normal");
    assert_eq!(e["reason"], "Synced");
    assert_eq!(e["message"], "Node synced successfully");
    assert_eq!(e["source"]["component"], "cloud-node-controller");
    assert_eq!(e["involvedObject"]["apiVersion"], "v1");
    assert_eq!(e["involvedObject"]["kind"], "Node");
    assert!(e["involvedObject"]["uid"]
        .as_str()
        .is_some_and(|u| !u.is_empty()));
}

/// Run `sync_node` once on a cached node; returns its result.
async fn sync_once(h: &Harness, name: &str) -> Result<(), String> {
    let ctx = synced(h, cfg()).await;
    eventually("node cached", WAIT, || {
        ctx.nodes
            .list()
            .iter()
            .any(|n| n.name() == name)
            .then_some(())
    })
    .await;
    NodeController::new(ctx)
        .sync_node(name)
        .await
        .map_err(|e| e.to_string())
}

fn v1_cloud(instance: Value) -> FakeConfig {
    fake(json!({"providerName": "fake", "autoInstances": false, "instances": [instance]}))
}

fn v2_cloud(instance: Value) -> FakeConfig {
    fake(json!({"providerName": "fake", "autoInstances": false, "instances": [instance]}))
}

fn cloud_addresses() -> Value {
    json!([
        {"type": "InternalIP", "address": "10.0.0.1"},
        {"type": "ExternalIP", "address": "132.143.154.163"},
        {"type": "Hostname", "address": "node0.cloud.internal"},
    ])
}

fn default_labels(itype: &str, zone: &str, region: &str) -> BTreeMap<String, String> {
    owned(&[
        ("beta.kubernetes.io/instance-type", itype),
        ("node.kubernetes.io/instance-type", itype),
        ("failure-domain.beta.kubernetes.io/zone", zone),
        ("topology.kubernetes.io/zone", zone),
        ("failure-domain.beta.kubernetes.io/region", region),
        ("topology.kubernetes.io/region", region),
    ])
}

// ---- Test_syncNode, legacy Instances (fake-v1) -------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_node_initialized_with_hostname() {
    let h = Harness::start(
        "fake-v1",
        v1_cloud(
            json!({"name": "node0", "instanceID": "12345", "instanceType": "t1.micro",
                        "zone": "us-west-1a", "region": "us-west", "addresses": cloud_addresses()}),
        ),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(n["spec"]["providerID"], "fake://12345");
    assert_eq!(taint_keys(&n), Some(vec![]));
    assert_eq!(
        labels(&n),
        default_labels("t1.micro", "us-west-1a", "us-west")
    );
    // The cloud's Hostname wins over kubelet's.
    assert_eq!(
        addresses(&n),
        addrs(&[
            ("InternalIP", "10.0.0.1"),
            ("ExternalIP", "132.143.154.163"),
            ("Hostname", "node0.cloud.internal")
        ])
    );
    assert_synced_event(&h, "node0");
    assert_eq!(
        h.call_names(),
        [
            "instance-id",
            "node-addresses-by-provider-id",
            "instance-type-by-provider-id",
            "get-zone-by-provider-id"
        ]
    );
    assert_eq!(h.calls()[1].arg("providerID"), Some("fake://12345"));
    // One PUT of the node and one status patch.
    assert_eq!(writes(&h, "node0"), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_cloud_provider_missing_hostname_keeps_kubelet_hostname_last() {
    let h = Harness::start(
        "fake-v1",
        v1_cloud(
            json!({"name": "node0", "instanceID": "12345", "addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "ExternalIP", "address": "132.143.154.163"}]}),
        ),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(
        addresses(&n),
        addrs(&[
            ("InternalIP", "10.0.0.1"),
            ("ExternalIP", "132.143.154.163"),
            ("Hostname", "kubelet-hostname")
        ])
    );
    assert_eq!(n["spec"]["providerID"], "fake://12345");
    assert_eq!(
        labels(&n),
        default_labels("fake.medium", "fake-zone-a", "fake-region-1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_node_ignored_without_cloud_taint() {
    let h = Harness::start("fake-v1", v1_cloud(json!({"name": "node0"}))).await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([{"key": "other", "effect": "NoSchedule"}]),
            json!({}),
        ))
        .unwrap();
    let before = stored(&h, "node0");
    sync_once(&h, "node0").await.expect("sync succeeds");
    let after = stored(&h, "node0");
    assert_eq!(before, after, "untouched");
    assert!(
        h.call_names().is_empty(),
        "no cloud call: {:?}",
        h.call_names()
    );
    assert_eq!(all_node_writes(&h, "node0"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_zone_region_labels_use_provider_name() {
    let h = Harness::start(
        "fake-v1",
        fake(json!({"providerName": "aws", "autoInstances": false, "instances": [
            {"name": "node0", "instanceID": "12345", "zone": "us-west-1a", "region": "us-west", "instanceType": ""}]})),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(n["spec"]["providerID"], "aws://12345");
    assert_eq!(
        labels(&n),
        owned(&[
            ("failure-domain.beta.kubernetes.io/zone", "us-west-1a"),
            ("topology.kubernetes.io/zone", "us-west-1a"),
            ("failure-domain.beta.kubernetes.io/region", "us-west"),
            ("topology.kubernetes.io/region", "us-west"),
        ]),
        "an empty instance type writes no type labels"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_node_addresses_applied_and_other_taints_kept() {
    let h = Harness::start(
        "fake-v1",
        v1_cloud(json!({"name": "node0", "instanceID": "12345", "addresses": cloud_addresses()})),
    )
    .await;
    let taints = json!([{"key": "ImproveCoverageTaint", "value": "true", "effect": "NoSchedule"}, cloud_taint(),
                        {"key": "other", "effect": "NoExecute"}]);
    h.server
        .controls()
        .seed(node("node0", taints, json!({"status": {"addresses": [
            {"type": "InternalIP", "address": "10.0.0.99"}, {"type": "Hostname", "address": "kubelet-hostname"}]}})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(
        taint_keys(&n),
        Some(vec![
            "ImproveCoverageTaint:NoSchedule".into(),
            "other:NoExecute".into()
        ])
    );
    assert_eq!(n["spec"]["taints"][0]["value"], "true");
    assert_eq!(
        addresses(&n),
        addrs(&[
            ("InternalIP", "10.0.0.1"),
            ("ExternalIP", "132.143.154.163"),
            ("Hostname", "node0.cloud.internal")
        ])
    );
    // The replaced list went out with `$patch: replace`.
    let patch = h
        .server
        .controls()
        .requests()
        .into_iter()
        .find(|r| r.resource == "nodes" && r.subresource == "status" && r.verb == "patch")
        .expect("status patch");
    assert_eq!(
        patch.json()["status"]["addresses"][3],
        json!({"$patch": "replace"})
    );
    assert_eq!(writes(&h, "node0"), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_provided_node_ip_goes_first() {
    let h = Harness::start(
        "fake-v1",
        v1_cloud(
            json!({"name": "node0", "instanceID": "12345", "addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "10.0.0.2"},
            {"type": "ExternalIP", "address": "132.143.154.163"}]}),
        ),
    )
    .await;
    let taints = json!([{"key": "ImproveCoverageTaint", "value": "true", "effect": "NoSchedule"}, cloud_taint()]);
    h.server
        .controls()
        .seed(node("node0", taints, json!({"metadata": {"annotations": {"alpha.kubernetes.io/provided-node-ip": "10.0.0.2"}}})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(
        addresses(&n),
        addrs(&[
            ("InternalIP", "10.0.0.2"),
            ("ExternalIP", "132.143.154.163"),
            ("Hostname", "kubelet-hostname")
        ])
    );
    assert_eq!(
        taint_keys(&n),
        Some(vec!["ImproveCoverageTaint:NoSchedule".into()])
    );
}

async fn assert_sync_fails_unchanged(h: &Harness, name: &str, expected_error: &str) {
    let before = stored(h, name);
    let err = sync_once(h, name).await.expect_err("sync fails");
    assert!(
        err.contains(expected_error),
        "error {err:?} should contain {expected_error:?}"
    );
    assert_eq!(stored(h, name), before, "node unchanged");
    assert_eq!(all_node_writes(h, name), 0);
    assert!(events(h, name).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_provided_node_ip_not_valid_or_not_present_fails() {
    for (annotation, expected) in [
        ("10.0.0.1.1", "provided node ip for node \"node0\" is not valid: failed to parse node IP \"10.0.0.1.1\""),
        ("10.0.0.9", "provided node ip for node \"node0\" is not valid: failed to get node address from cloud provider that matches ip: 10.0.0.9"),
    ] {
        let h = Harness::start(
            "fake-v1",
            v1_cloud(json!({"name": "node0", "instanceID": "12345", "addresses": cloud_addresses()})),
        )
        .await;
        h.server
            .controls()
            .seed(node("node0", json!([cloud_taint()]), json!({"metadata": {"annotations": {"alpha.kubernetes.io/provided-node-ip": annotation}}})))
            .unwrap();
        assert_sync_fails_unchanged(&h, "node0", expected).await;
        assert!(
            h.call_names().iter().all(|c| c != "instance-exists-by-provider-id"),
            "only metadata calls"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_provider_id_already_set_is_kept() {
    let h = Harness::start(
        "fake-v1",
        v1_cloud(json!({"name": "node0", "providerID": "fake://12345", "instanceID": "other"})),
    )
    .await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([cloud_taint()]),
            json!({"spec": {"providerID": "fake://12345"}}),
        ))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(n["spec"]["providerID"], "fake://12345");
    assert_eq!(taint_keys(&n), Some(vec![]));
    assert!(
        !h.call_names().contains(&"instance-id".to_string()),
        "no InstanceID when the node has an ID"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_provider_id_not_implemented_still_initialises() {
    let mut config = fake(
        json!({"providerName": "fake", "instances": [{"name": "node0"}],
                                 "errors": {"InstanceID": {"kind": "not_implemented"}}}),
    );
    config.auto_instances = false;
    let h = Harness::start("fake-v1", config).await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(taint_keys(&n), Some(vec![]), "taints []");
    assert!(
        n["spec"].get("providerID").is_none(),
        "no provider ID: {n:#}"
    );
    // Addresses by provider ID "" fail, by name succeed.
    let calls = h.call_names();
    assert_eq!(
        &calls[..3],
        [
            "instance-id",
            "node-addresses-by-provider-id",
            "node-addresses"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_instance_id_error_keeps_the_taint() {
    let h = Harness::start(
        "fake-v1",
        fake(
            json!({"providerName": "fake", "instances": [{"name": "node0"}],
                    "errors": {"InstanceID": {"kind": "other", "message": "unknown error"}}}),
        ),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    assert_sync_fails_unchanged(
        &h,
        "node0",
        "failed to get instance metadata for node node0: failed to get instance ID from cloud provider: unknown error",
    )
    .await;
}

// ---- Test_syncNode, InstancesV2 (fake) ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_provider_id_and_topology_labels_from_metadata() {
    let h = Harness::start(
        "fake",
        v2_cloud(
            json!({"name": "node0", "providerID": "fake://12345", "instanceType": "t1.micro",
                        "zone": "us-west-1a", "region": "us-west", "addresses": cloud_addresses()}),
        ),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(n["spec"]["providerID"], "fake://12345");
    assert_eq!(
        labels(&n),
        default_labels("t1.micro", "us-west-1a", "us-west")
    );
    assert_eq!(taint_keys(&n), Some(vec![]));
    assert_eq!(
        addresses(&n),
        addrs(&[
            ("InternalIP", "10.0.0.1"),
            ("ExternalIP", "132.143.154.163"),
            ("Hostname", "node0.cloud.internal")
        ])
    );
    assert_synced_event(&h, "node0");
    // One metadata call for the initialisation (+ possibly the periodic first pass, which
    // skips tainted nodes, so none); Zones are never consulted with V2.
    assert_eq!(h.call_names(), ["instance-metadata-by-provider-id"]);
    assert_eq!(writes(&h, "node0"), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_provided_node_ip_ordering() {
    let h = Harness::start(
        "fake",
        v2_cloud(json!({"name": "node0", "addresses": [
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "ExternalIP", "address": "132.143.154.163"},
            {"type": "InternalIP", "address": "2600:1f14:1d4:d101::ba3d"},
            {"type": "Hostname", "address": "node0.cloud"}]})),
    )
    .await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([cloud_taint()]),
            json!({"metadata": {"annotations": {
            "alpha.kubernetes.io/provided-node-ip": "2600:1f14:1d4:d101:0:0:0:ba3d"}}}),
        ))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(
        addresses(&n),
        addrs(&[
            ("InternalIP", "2600:1f14:1d4:d101::ba3d"),
            ("ExternalIP", "132.143.154.163"),
            ("Hostname", "node0.cloud")
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_additional_labels_added_filtered_and_never_overwrite() {
    let h = Harness::start(
        "fake",
        v2_cloud(json!({"name": "node0", "instanceType": "", "zone": "", "region": "", "additionalLabels": {
            "my.custom.label/foo": "bar",
            "my.custom.label/bar": "foo",
            "kubernetes.io/forbidden": "x",
            "k8s.io/forbidden": "x",
            "topology.kubernetes.io/forbidden": "x",
            "topology.k8s.io/forbidden": "x",
            "topology.k8s.cp/allowed": "yes",
            "app.k8snio/allowed": "yes",
            "k8snio/allowed": "yes",
            "existing": "from-cloud"}})),
    )
    .await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([cloud_taint()]),
            json!({"metadata": {"labels": {"existing": "from-node"}}}),
        ))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(
        labels(&n),
        owned(&[
            ("my.custom.label/foo", "bar"),
            ("my.custom.label/bar", "foo"),
            ("topology.k8s.cp/allowed", "yes"),
            ("app.k8snio/allowed", "yes"),
            ("k8snio/allowed", "yes"),
            ("existing", "from-node"),
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_provider_id_already_set_is_kept() {
    let h = Harness::start(
        "fake",
        v2_cloud(json!({"name": "node0", "providerID": "fake://other"})),
    )
    .await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([cloud_taint()]),
            json!({"spec": {"providerID": "fake://12345"}}),
        ))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(n["spec"]["providerID"], "fake://12345");
    assert_eq!(taint_keys(&n), Some(vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_cloud_without_provider_id_uses_the_nodes_or_fails() {
    // Node has an ID: it is used.
    let h = Harness::start("fake", v2_cloud(json!({"name": "node0", "providerID": ""}))).await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([cloud_taint()]),
            json!({"spec": {"providerID": "fake://12345"}}),
        ))
        .unwrap();
    let (n, _t) = initialise(&h, "node0").await;
    assert_eq!(n["spec"]["providerID"], "fake://12345");
    assert_eq!(taint_keys(&n), Some(vec![]));

    // Neither has one: error, taint kept.
    let h = Harness::start("fake", v2_cloud(json!({"name": "node0", "providerID": ""}))).await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    assert_sync_fails_unchanged(
        &h,
        "node0",
        "failed to get instance metadata for node node0: cloud provider does not set node provider ID for node node0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_error_getting_instance_metadata_keeps_the_taint() {
    let h = Harness::start(
        "fake",
        fake(json!({"instances": [{"name": "node0"}],
                    "errors": {"InstanceMetadata": {"kind": "other", "message": "metadata is down"}}})),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    assert_sync_fails_unchanged(
        &h,
        "node0",
        "failed to get instance metadata for node node0: metadata is down",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_nil_instance_metadata_changes_nothing_and_is_not_an_error() {
    let h = Harness::start(
        "fake",
        v2_cloud(json!({"name": "node0", "metadataNil": true})),
    )
    .await;
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let before = stored(&h, "node0");
    sync_once(&h, "node0")
        .await
        .expect("nil metadata is not an error");
    assert_eq!(stored(&h, "node0"), before);
    assert_eq!(all_node_writes(&h, "node0"), 0);

    // With the whole controller: nil metadata in the periodic loop is skipped (no crash), the
    // node stays tainted and there is no retry storm (no requeue).
    h.server
        .controls()
        .seed(node(
            "node1",
            json!([]),
            json!({"spec": {"providerID": "fake://node1"}}),
        ))
        .unwrap();
    h.set_control(&v2_cloud(json!({"name": "node0", "metadataNil": true})));
    h.clear_calls();
    let ctx = synced(&h, cfg()).await;
    let task = tokio::spawn(node::run(ctx));
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!task.is_finished(), "controller still running");
    let n0 = h
        .calls()
        .iter()
        .filter(|c| c.arg("node") == Some("node0"))
        .count();
    assert!(n0 <= 2, "node0 is not retried without an event: {n0} calls");
    assert_eq!(
        taint_keys(&stored(&h, "node0")),
        Some(vec![format!("{TAINT}:NoSchedule")])
    );
}

// ---- Label reconciliation, periodic address loop -------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialised_node_gets_ga_labels_from_beta_labels() {
    let h = Harness::start("fake", fake(json!({}))).await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([]),
            json!({"metadata": {"labels": {
            "failure-domain.beta.kubernetes.io/zone": "zone-a",
            "failure-domain.beta.kubernetes.io/region": "region-a",
            "beta.kubernetes.io/instance-type": "the-type",
            "node.kubernetes.io/instance-type": "stale"}}}),
        ))
        .unwrap();
    let ctx = synced(&h, cfg()).await;
    let _t = tokio::spawn(node::run(ctx));
    let n = eventually("GA labels", WAIT, || {
        let n = stored(&h, "node0");
        labels(&n)
            .contains_key("topology.kubernetes.io/zone")
            .then_some(n)
    })
    .await;
    assert_eq!(
        labels(&n),
        owned(&[
            ("failure-domain.beta.kubernetes.io/zone", "zone-a"),
            ("topology.kubernetes.io/zone", "zone-a"),
            ("failure-domain.beta.kubernetes.io/region", "region-a"),
            ("topology.kubernetes.io/region", "region-a"),
            ("beta.kubernetes.io/instance-type", "the-type"),
            ("node.kubernetes.io/instance-type", "the-type"),
        ])
    );
    let label_patches: Vec<_> = h
        .server
        .controls()
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.verb == "patch" && r.subresource.is_empty())
        .collect();
    // One patch as a rule. A second, identical one is possible when another write (the address
    // loop's status patch) re-queues the node while the first patch is in flight and the cache
    // has not seen it yet (upstream has the same window); it must then be the same patch.
    assert!(!label_patches.is_empty(), "a label patch");
    for p in &label_patches {
        assert_eq!(
            p.json(),
            json!({"metadata": {"labels": {
                "topology.kubernetes.io/zone": "zone-a",
                "topology.kubernetes.io/region": "region-a",
                "node.kubernetes.io/instance-type": "the-type"}}})
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_loop_follows_cloud_addresses_and_skips_tainted_nodes() {
    let cloud = |ip: &str| {
        fake(json!({"providerName": "fake", "instances": [
            {"name": "node0", "addresses": [{"type": "InternalIP", "address": ip}]},
            {"name": "tainted", "addresses": [{"type": "InternalIP", "address": "10.9.9.9"}], "metadataNil": true}]}))
    };
    let h = Harness::start("fake", cloud("10.0.0.1")).await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([]),
            json!({"spec": {"providerID": "fake://node0"}}),
        ))
        .unwrap();
    h.server
        .controls()
        .seed(node("tainted", json!([cloud_taint()]), json!({})))
        .unwrap();
    let ctx = synced(
        &h,
        ControllerConfig {
            node_status_update_frequency: Duration::from_millis(150),
            ..cfg()
        },
    )
    .await;
    let _t = tokio::spawn(node::run(ctx));
    eventually("cloud address with kubelet hostname", WAIT, || {
        (addresses(&stored(&h, "node0"))
            == addrs(&[("InternalIP", "10.0.0.1"), ("Hostname", "kubelet-hostname")]))
        .then_some(())
    })
    .await;
    // Several passes with nothing changed: no further writes.
    let calls_before = h
        .calls()
        .iter()
        .filter(|c| c.arg("node") == Some("node0"))
        .count();
    eventually("two more passes", WAIT, || {
        (h.calls()
            .iter()
            .filter(|c| c.arg("node") == Some("node0"))
            .count()
            >= calls_before + 2)
            .then_some(())
    })
    .await;
    assert_eq!(
        writes(&h, "node0"),
        (0, 1),
        "one status patch, nothing while unchanged"
    );
    // The cloud changes the address: the next pass follows it.
    h.set_control(&cloud("10.0.0.2"));
    eventually("new address", WAIT, || {
        (addresses(&stored(&h, "node0"))
            == addrs(&[("InternalIP", "10.0.0.2"), ("Hostname", "kubelet-hostname")]))
        .then_some(())
    })
    .await;
    // The tainted node is left to syncNode (nil metadata keeps it tainted); the loop never
    // touched it and did not crash on nil metadata.
    let t = stored(&h, "tainted");
    assert_eq!(addresses(&t), addrs(&[("Hostname", "kubelet-hostname")]));
    assert_eq!(all_node_writes(&h, "tainted"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_periodic_loop_uses_addresses_by_provider_id() {
    let h = Harness::start("fake-v1", fake(json!({"providerName": "fake"}))).await;
    h.server
        .controls()
        .seed(node(
            "node0",
            json!([]),
            json!({"spec": {"providerID": "fake://node0"}}),
        ))
        .unwrap();
    let ctx = synced(&h, cfg()).await;
    let _t = tokio::spawn(node::run(ctx));
    eventually("addresses", WAIT, || {
        (addresses(&stored(&h, "node0")).len() == 2).then_some(())
    })
    .await;
    assert_eq!(h.call_names(), ["node-addresses-by-provider-id"]);
    assert_eq!(h.calls()[0].arg("providerID"), Some("fake://node0"));
    assert_eq!(
        addresses(&stored(&h, "node0"))[1],
        ("Hostname".to_string(), "node0".to_string())
    );
}

/// TestUpdateNodeStatus: 100 untainted nodes, N workers ⇒ exactly 100 cloud calls per pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_nodes_one_cloud_call_each_per_address_pass() {
    for workers in [1usize, 5, 10, 30] {
        let h = Harness::start("fake", fake(json!({"cloudStateFile": false}))).await;
        for i in 0..100 {
            let name = format!("node-{i}");
            h.server
                .controls()
                .seed(node(
                    &name,
                    json!([]),
                    json!({"spec": {"providerID": format!("fake://{name}")}}),
                ))
                .unwrap();
        }
        let ctx = synced(
            &h,
            ControllerConfig {
                concurrent_node_status_updates: workers,
                ..cfg()
            },
        )
        .await;
        eventually("100 cached", WAIT, || {
            (ctx.nodes.list().len() == 100).then_some(())
        })
        .await;
        let controller = Arc::new(NodeController::new(ctx));
        controller.update_node_status().await;
        let calls = h.calls();
        assert_eq!(calls.len(), 100, "{workers} workers: one call per node");
        let mut nodes: Vec<_> = calls
            .iter()
            .map(|c| c.arg("node").unwrap().to_string())
            .collect();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), 100, "every node exactly once");
        assert!(calls
            .iter()
            .all(|c| c.call == "instance-metadata-by-provider-id"));
        // Every node got its addresses.
        for i in [0, 42, 99] {
            assert_eq!(addresses(&stored(&h, &format!("node-{i}"))).len(), 2);
        }
    }
}

// ---- Robustness ---------------------------------------------------------------------------

/// A sync of a node its cache still shows tainted after an earlier sync initialised it (the
/// informer lags; here it is stopped after the first list) ends at the Conflict: the API shows
/// the node initialised, so there is no second update and no second `Synced` event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cache_does_not_initialise_a_node_twice() {
    let h = Harness::start(
        "fake",
        fake(
            json!({"providerName": "fake", "autoInstances": false, "instances": [
            {"name": "node0", "instanceType": "t1.micro"},
            {"name": "node1", "instanceType": "t1.micro"}]}),
        ),
    )
    .await;
    for name in ["node0", "node1"] {
        h.server
            .controls()
            .seed(node(name, json!([cloud_taint()]), json!({})))
            .unwrap();
    }
    let informers = tokio_util::sync::CancellationToken::new();
    let ctx = ControllerContext::new(
        &h.client,
        &h.provider,
        &h.metrics,
        cfg(),
        "test-host",
        &informers,
    );
    assert!(ctx.nodes.wait_synced().await);
    informers.cancel();
    let controller = NodeController::new(ctx.clone());
    controller.sync_node("node0").await.unwrap();
    assert_eq!(writes(&h, "node0").0, 1);
    assert!(
        ctx.nodes
            .store()
            .get("node0")
            .is_some_and(|n| n.taints().iter().any(|t| t.key == TAINT)),
        "the stopped cache still shows the node tainted"
    );
    controller.sync_node("node0").await.unwrap();
    assert_eq!(writes(&h, "node0").0, 1, "a second successful update");
    assert_eq!(stored(&h, "node0")["spec"]["providerID"], "fake://node0");
    eventually("the Synced event", WAIT, || {
        (!events(&h, "node0").is_empty()).then_some(())
    })
    .await;
    // Events are sent in the background: give a second one time to arrive (as a second Event
    // or as a count of 2 on the first).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_synced_event(&h, "node0");
    assert_eq!(events(&h, "node0")[0]["count"], 1);

    // A taint removed by hand (no providerID) while the cache still shows it is no earlier
    // initialisation: after the Conflict the node is initialised.
    kube::Api::<k8s_openapi::api::core::v1::Node>::all(h.client.clone())
        .patch(
            "node1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await
        .unwrap();
    controller.sync_node("node1").await.unwrap();
    assert_eq!(stored(&h, "node1")["spec"]["providerID"], "fake://node1");
    assert_eq!(writes(&h, "node1").0, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_node_is_retried_with_backoff_while_others_proceed() {
    let h = Harness::start(
        "fake",
        fake(json!({"instances": [
            {"name": "bad", "errors": {"InstanceMetadata": {"kind": "other", "message": "boom"}}}]})),
    )
    .await;
    h.server
        .controls()
        .seed(node("bad", json!([cloud_taint()]), json!({})))
        .unwrap();
    for i in 0..5 {
        h.server
            .controls()
            .seed(node(
                &format!("good-{i}"),
                json!([cloud_taint()]),
                json!({}),
            ))
            .unwrap();
    }
    let ctx = synced(
        &h,
        ControllerConfig {
            concurrent_node_syncs: 1,
            ..cfg()
        },
    )
    .await;
    let _t = tokio::spawn(node::run(ctx));
    // With one worker, the good nodes are initialised although "bad" keeps failing.
    for i in 0..5 {
        let name = format!("good-{i}");
        eventually("good node initialised", WAIT, || {
            (taint_keys(&stored(&h, &name)) == Some(vec![])).then_some(())
        })
        .await;
    }
    let bad_calls = || {
        h.calls()
            .iter()
            .filter(|c| c.arg("node") == Some("bad"))
            .count()
    };
    eventually("bad node retried", WAIT, || {
        (bad_calls() >= 5).then_some(())
    })
    .await;
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let elapsed = started.elapsed();
    // Exponential backoff (5ms · 2^n): the retries thin out. Without backoff a failing node
    // would be retried hundreds of times in this window; with it, a handful at most
    // (cumulative delay of k more retries from the 5th on is ≥ 80ms · (2^k − 1)).
    let total = bad_calls();
    assert!(
        total < 5 + 12,
        "{total} calls for the failing node after {elapsed:?}: not backing off"
    );
    assert_eq!(
        taint_keys(&stored(&h, "bad")),
        Some(vec![format!("{TAINT}:NoSchedule")])
    );
    assert!(events(&h, "bad").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_deleted_mid_sync_ends_quietly() {
    let h = Harness::start("fake", fake(json!({}))).await;
    let gate = h.state_path("pause-metadata");
    std::fs::write(&gate, b"").unwrap();
    let mut live = fake(json!({}));
    live.pause.insert("InstanceMetadata".into(), gate.clone());
    h.set_control(&live);
    h.server
        .controls()
        .seed(node("node0", json!([cloud_taint()]), json!({})))
        .unwrap();
    let ctx = synced(&h, cfg()).await;
    let _t = tokio::spawn(node::run(ctx));
    eventually("metadata call in progress", WAIT, || {
        (!h.calls().is_empty()).then_some(())
    })
    .await;
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(h.client.clone());
    api.delete("node0", &Default::default()).await.unwrap();
    std::fs::remove_file(&gate).unwrap();
    // The update finds the node gone; the sync ends without requeueing.
    eventually("update attempted", WAIT, || {
        h.server
            .controls()
            .requests()
            .iter()
            .any(|r| r.resource == "nodes" && r.verb == "update")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let updates: Vec<_> = h
        .server
        .controls()
        .requests()
        .into_iter()
        .filter(|r| r.resource == "nodes" && r.verb == "update")
        .collect();
    assert_eq!(updates.len(), 1, "no retry storm: {updates:?}");
    assert_eq!(updates[0].code, 404);
    assert_eq!(
        h.calls().len(),
        1,
        "no further cloud calls: {:?}",
        h.call_names()
    );
    assert!(
        h.server.controls().get("nodes", "", "node0").is_none(),
        "not recreated"
    );
    assert!(
        events(&h, "node0").is_empty(),
        "no Synced event for a deleted node"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_conditions() {
    let h = Harness::start(
        "fake",
        fake(json!({"disableInstances": true, "disableInstancesV2": true})),
    )
    .await;
    let ctx = h.context(cfg());
    assert_eq!(
        node::check(&ctx).unwrap_err().0,
        "cloud provider does not support instances"
    );
    let h = Harness::start("fake-v1", fake(json!({}))).await;
    assert!(node::check(&h.context(cfg())).is_ok());
    let zero = h.context(ControllerConfig {
        concurrent_node_syncs: 0,
        ..cfg()
    });
    assert!(node::check(&zero)
        .unwrap_err()
        .0
        .contains("--concurrent-node-syncs"));
}
