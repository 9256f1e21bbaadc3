//! A conformance suite that runs unchanged against the in-memory API server and, when
//! `CCM_E2E_KUBECONFIG` names a kubeconfig, against that real cluster too, so the double can be
//! checked against the real thing.
//!
//! Expected objects in the suite are written by hand from the Kubernetes API conventions and the
//! k8s.io/api patch strategies, never taken from the server's own output.

mod support;

use anyhow::{anyhow, bail, ensure, Context as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Client;
use kube_apiserver_inmem::ApiServer;
use serde_json::{json, Value};
use support::{api_code, api_reason, obj};

#[tokio::test]
async fn in_memory_server_passes_the_conformance_suite() {
    let server = ApiServer::start().await.expect("start server");
    conformance_suite(server.client(), &unique_prefix("conf"))
        .await
        .expect("conformance suite");
    server.shutdown().await;
}

#[tokio::test]
async fn real_cluster_passes_the_conformance_suite() {
    let Ok(path) = std::env::var("CCM_E2E_KUBECONFIG") else {
        eprintln!("SKIPPED: set CCM_E2E_KUBECONFIG=/path/to/kubeconfig to run the conformance suite against a real cluster");
        return;
    };
    let kc = kube::config::Kubeconfig::read_from(&path).expect("read CCM_E2E_KUBECONFIG");
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("client config from CCM_E2E_KUBECONFIG");
    let client = kube::Client::try_from(config).expect("client");
    conformance_suite(client, &unique_prefix("ccm-e2e"))
        .await
        .expect("conformance suite against the real cluster");
}

fn expect_err<T: std::fmt::Debug>(
    r: Result<T, kube::Error>,
    code: u16,
    reason: &str,
    what: &str,
) -> anyhow::Result<()> {
    match r {
        Ok(v) => bail!("{what}: expected {code} {reason}, got success: {v:?}"),
        Err(e) => {
            ensure!(
                api_code(&e) == Some(code) && api_reason(&e) == reason,
                "{what}: expected {code} {reason}, got {e:?}"
            );
            Ok(())
        }
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// A unique, DNS-safe prefix for objects of one suite run.
fn unique_prefix(base: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or_default();
    format!("{base}-{}", n % 1_000_000_000)
}

/// CRUD and patch behaviour every API server must show. Creates a namespace named `prefix` and
/// nodes named `<prefix>-*`, and removes them at the end.
async fn conformance_suite(client: Client, prefix: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": prefix}})),
        )
        .await
        .context("create namespace")?;
    let result = suite_body(client.clone(), prefix).await;
    let nodes: Api<Node> = Api::all(client.clone());
    for n in ["n1", "n2"] {
        let name = format!("{prefix}-{n}");
        let _ = nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
        let _ = nodes.delete(&name, &DeleteParams::default()).await;
    }
    let _ = namespaces.delete(prefix, &DeleteParams::default()).await;
    result
}

async fn suite_body(client: Client, ns: &str) -> anyhow::Result<()> {
    configmap_crud(client.clone(), ns)
        .await
        .context("configmap CRUD")?;
    lists_and_selectors(client.clone(), ns)
        .await
        .context("lists and selectors")?;
    node_patches(client.clone(), ns)
        .await
        .context("node patches")?;
    service_status_and_finalizers(client.clone(), ns)
        .await
        .context("service status and finalizers")?;
    lease_apply(client.clone(), ns)
        .await
        .context("lease apply")?;
    errors(client.clone(), ns).await.context("errors")?;
    Ok(())
}

async fn configmap_crud(client: Client, ns: &str) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client, ns);
    let created = cms
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "c1", "labels": {"app": "x"}}, "data": {"a": "1"}})),
        )
        .await?;
    ensure!(
        created
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| !u.is_empty()),
        "uid set"
    );
    ensure!(
        created.metadata.creation_timestamp.is_some(),
        "creationTimestamp set"
    );
    let rv1 = created
        .metadata
        .resource_version
        .clone()
        .ok_or_else(|| anyhow!("no rv"))?;
    ensure!(
        created.metadata.namespace.as_deref() == Some(ns),
        "namespace set from URL"
    );
    let got = cms.get("c1").await?;
    ensure!(
        to_json(&got.data) == json!({"a": "1"}),
        "data round-trips: {:?}",
        got.data
    );

    expect_err(
        cms.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "c1"}})),
        )
        .await,
        409,
        "AlreadyExists",
        "create twice",
    )?;

    // Update with the current resourceVersion succeeds and moves it forward.
    let mut upd = got.clone();
    upd.data = Some([("a".to_string(), "2".to_string())].into());
    let updated = cms.replace("c1", &PostParams::default(), &upd).await?;
    let rv2 = updated
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    ensure!(rv2 != rv1, "resourceVersion changes on update");
    // The same stale object again: 409 Conflict.
    expect_err(
        cms.replace("c1", &PostParams::default(), &upd).await,
        409,
        "Conflict",
        "stale PUT",
    )?;
    // A patch carrying a stale resourceVersion is a precondition too.
    expect_err(
        cms.patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv1}, "data": {"b": "x"}})),
        )
        .await,
        409,
        "Conflict",
        "merge patch with stale resourceVersion",
    )?;
    // ...and a matching one passes.
    let patched = cms
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": rv2}, "data": {"b": "x"}})),
        )
        .await?;
    ensure!(
        to_json(&patched.data) == json!({"a": "2", "b": "x"}),
        "merge patch adds a key: {:?}",
        patched.data
    );

    // PUT without resourceVersion is an unconditional update for configmaps.
    let mut unconditional = patched.clone();
    unconditional.metadata.resource_version = None;
    unconditional.data = Some([("z".to_string(), "9".to_string())].into());
    let u = cms
        .replace("c1", &PostParams::default(), &unconditional)
        .await?;
    ensure!(
        to_json(&u.data) == json!({"z": "9"}),
        "unconditional PUT replaces data"
    );

    // generateName: prefix plus 5 random characters.
    let gen = cms
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"generateName": "gen-"}})),
        )
        .await?;
    let name = gen.metadata.name.clone().unwrap_or_default();
    ensure!(
        name.starts_with("gen-") && name.len() == 9,
        "generated name {name:?}"
    );

    // Delete, then 404.
    cms.delete("c1", &DeleteParams::default()).await?;
    expect_err(cms.get("c1").await, 404, "NotFound", "get after delete")?;
    expect_err(
        cms.delete("c1", &DeleteParams::default()).await,
        404,
        "NotFound",
        "delete twice",
    )?;
    cms.delete(&name, &DeleteParams::default()).await?;
    Ok(())
}

async fn lists_and_selectors(client: Client, ns: &str) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client, ns);
    for i in 0..5 {
        let tier = if i % 2 == 0 { "even" } else { "odd" };
        cms.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": format!("l{i}"), "labels": {"suite": "list", "tier": tier}}})),
        )
        .await?;
    }
    let all = cms
        .list(&ListParams::default().labels("suite=list"))
        .await?;
    ensure!(
        all.items.len() == 5,
        "label selector: {} items",
        all.items.len()
    );
    ensure!(
        all.metadata.resource_version.is_some(),
        "list has resourceVersion"
    );
    let even = cms
        .list(&ListParams::default().labels("suite=list,tier=even"))
        .await?;
    let names: Vec<String> = even
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    ensure!(names == ["l0", "l2", "l4"], "tier=even: {names:?}");
    let set = cms
        .list(&ListParams::default().labels("tier in (odd),suite"))
        .await?;
    let names: Vec<String> = set
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    ensure!(names == ["l1", "l3"], "set-based selector: {names:?}");
    let notin = cms
        .list(&ListParams::default().labels("suite=list,tier notin (odd)"))
        .await?;
    ensure!(
        notin.items.len() == 3,
        "notin selector: {}",
        notin.items.len()
    );
    let by_name = cms
        .list(&ListParams::default().fields("metadata.name=l3"))
        .await?;
    let names: Vec<String> = by_name
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    ensure!(names == ["l3"], "field selector: {names:?}");

    // Pagination: 5 items in pages of 2.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut lp = ListParams::default().labels("suite=list").limit(2);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = cms.list(&lp).await?;
        pages += 1;
        ensure!(page.items.len() <= 2, "page size");
        seen.extend(page.items.iter().filter_map(|c| c.metadata.name.clone()));
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
        ensure!(pages < 10, "pagination does not terminate");
    }
    ensure!(pages == 3, "3 pages, got {pages}");
    ensure!(
        seen == ["l0", "l1", "l2", "l3", "l4"],
        "pages cover all in order: {seen:?}"
    );

    // deletecollection with a label selector.
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("tier=odd"),
    )
    .await?;
    let left = cms
        .list(&ListParams::default().labels("suite=list"))
        .await?;
    let names: Vec<String> = left
        .items
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    ensure!(
        names == ["l0", "l2", "l4"],
        "deletecollection by label: {names:?}"
    );
    cms.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("suite=list"),
    )
    .await?;
    Ok(())
}

async fn node_patches(client: Client, prefix: &str) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client);
    let name = format!("{prefix}-n1");
    nodes
        .create(
            &PostParams::default(),
            &obj(json!({
                "metadata": {"name": name, "labels": {"a": "1", "b": "2"}},
                "spec": {
                    "providerID": "fake://n1",
                    "taints": [
                        {"key": "t1", "effect": "NoSchedule"},
                        {"key": "t2", "value": "v", "effect": "NoExecute"}
                    ]
                }
            })),
        )
        .await?;
    let pp = PatchParams::default();
    // Give the node a known status (merge patch replaces lists).
    nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Merge(json!({"status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": "h1"}],
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "Starting", "message": "old"},
                    {"type": "MemoryPressure", "status": "False", "reason": "Fine"}
                ]
            }})),
        )
        .await?;

    // spec.taints has no patch strategy: the list is replaced.
    let n = nodes
        .patch(
            &name,
            &pp,
            &Patch::Strategic(json!({"spec": {"taints": [{"key": "t3", "effect": "NoSchedule"}]}})),
        )
        .await?;
    let taints = to_json(&n.spec.as_ref().and_then(|s| s.taints.clone()));
    ensure!(
        taints == json!([{"key": "t3", "effect": "NoSchedule"}]),
        "taints replaced: {taints}"
    );

    // status.conditions merge by type: Ready is merged field-wise (message kept), the other stays.
    let n = nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"}
            ]}})),
        )
        .await?;
    let conds = to_json(&n.status.as_ref().and_then(|s| s.conditions.clone()));
    ensure!(
        conds
            == json!([
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "old"},
                {"type": "MemoryPressure", "status": "False", "reason": "Fine"}
            ]),
        "conditions merged by type: {conds}"
    );

    // A new condition type is added; upstream's element ordering puts it first.
    let n = nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Strategic(json!({"status": {"conditions": [
                {"type": "DiskPressure", "status": "False"}
            ]}})),
        )
        .await?;
    let types: Vec<String> = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.type_)
        .collect();
    ensure!(
        types == ["DiskPressure", "Ready", "MemoryPressure"],
        "new condition ordering: {types:?}"
    );

    // status.addresses merge by type (upstream's known-wrong semantics, kept for fidelity).
    let n = nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Strategic(json!({"status": {"addresses": [
                {"type": "InternalIP", "address": "10.0.0.2"}
            ]}})),
        )
        .await?;
    let addrs = to_json(&n.status.as_ref().and_then(|s| s.addresses.clone()));
    ensure!(
        addrs
            == json!([{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "h1"}]),
        "addresses merged by type: {addrs}"
    );
    // ...and with a {"$patch": "replace"} element the list is replaced, order kept.
    let n = nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Strategic(json!({"status": {"addresses": [
                {"type": "ExternalIP", "address": "1.2.3.4"},
                {"type": "InternalIP", "address": "10.0.0.3"},
                {"$patch": "replace"}
            ]}})),
        )
        .await?;
    let addrs = to_json(&n.status.as_ref().and_then(|s| s.addresses.clone()));
    ensure!(
        addrs
            == json!([{"type": "ExternalIP", "address": "1.2.3.4"}, {"type": "InternalIP", "address": "10.0.0.3"}]),
        "addresses replaced: {addrs}"
    );
    // $patch: delete removes one element by merge key.
    let n = nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Strategic(json!({"status": {"addresses": [
                {"type": "ExternalIP", "$patch": "delete"}
            ]}})),
        )
        .await?;
    let addrs = to_json(&n.status.as_ref().and_then(|s| s.addresses.clone()));
    ensure!(
        addrs == json!([{"type": "InternalIP", "address": "10.0.0.3"}]),
        "address deleted: {addrs}"
    );

    // metadata.finalizers merge as a set; a new entry goes first (upstream ordering).
    nodes
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/a"]}})),
        )
        .await?;
    let n = nodes
        .patch(
            &name,
            &pp,
            &Patch::Strategic(
                json!({"metadata": {"finalizers": ["example.com/b", "example.com/a"]}}),
            ),
        )
        .await?;
    ensure!(
        n.metadata.finalizers == Some(vec!["example.com/b".into(), "example.com/a".into()]),
        "finalizers union: {:?}",
        n.metadata.finalizers
    );
    let n = nodes
        .patch(
            &name,
            &pp,
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a"]}}),
            ),
        )
        .await?;
    ensure!(
        n.metadata.finalizers == Some(vec!["example.com/b".into()]),
        "finalizer removed: {:?}",
        n.metadata.finalizers
    );
    let n = nodes
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    ensure!(n.metadata.finalizers.is_none(), "finalizers cleared");

    // Labels: strategic and merge patches merge maps, null deletes a key.
    let n = nodes
        .patch(
            &name,
            &pp,
            &Patch::Strategic(json!({"metadata": {"labels": {"a": null, "c": "3"}}})),
        )
        .await?;
    ensure!(
        to_json(&n.metadata.labels) == json!({"b": "2", "c": "3"}),
        "labels: {:?}",
        n.metadata.labels
    );

    // JSON patch, including a failing test operation (422).
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/labels/b", "value": "2"},
        {"op": "add", "path": "/metadata/labels/d", "value": "4"},
        {"op": "remove", "path": "/metadata/labels/c"}
    ]))?;
    let n = nodes.patch(&name, &pp, &Patch::Json::<()>(ops)).await?;
    ensure!(
        to_json(&n.metadata.labels) == json!({"b": "2", "d": "4"}),
        "json patch: {:?}",
        n.metadata.labels
    );
    let failing: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/metadata/labels/b", "value": "nope"}]),
    )?;
    expect_err(
        nodes.patch(&name, &pp, &Patch::Json::<()>(failing)).await,
        422,
        "Invalid",
        "failing json patch test",
    )?;

    // Status subresource rules: the main resource ignores status, /status ignores spec.
    let n = nodes
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"spec": {"unschedulable": true}, "status": {"addresses": []}})),
        )
        .await?;
    ensure!(
        n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
        "spec written on main resource"
    );
    ensure!(
        n.status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(Vec::len)
            == Some(1),
        "status ignored on main resource: {:?}",
        n.status.as_ref().map(|s| &s.addresses)
    );
    let n = nodes
        .patch_status(
            &name,
            &pp,
            &Patch::Merge(
                json!({"spec": {"unschedulable": false}, "status": {"phase": "Running"}}),
            ),
        )
        .await?;
    ensure!(
        n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true),
        "spec ignored on /status"
    );
    ensure!(
        n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
        "status written on /status"
    );

    // providerID is immutable once set.
    expect_err(
        nodes
            .patch(
                &name,
                &pp,
                &Patch::Merge(json!({"spec": {"providerID": "fake://other"}})),
            )
            .await,
        422,
        "Invalid",
        "providerID change",
    )?;

    // A no-op patch does not bump the resourceVersion.
    let before = nodes.get(&name).await?.metadata.resource_version;
    let after = nodes
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"b": "2"}}})),
        )
        .await?
        .metadata
        .resource_version;
    ensure!(
        before == after,
        "no-op patch keeps resourceVersion ({before:?} vs {after:?})"
    );

    // Finalizer deletion flow.
    nodes
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}})),
        )
        .await?;
    nodes.delete(&name, &DeleteParams::default()).await?;
    let n = nodes.get(&name).await?;
    ensure!(
        n.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp set"
    );
    ensure!(
        n.metadata.deletion_grace_period_seconds == Some(0),
        "deletionGracePeriodSeconds 0"
    );
    expect_err(
        nodes
            .patch(
                &name,
                &pp,
                &Patch::Merge(
                    json!({"metadata": {"finalizers": ["example.com/hold", "example.com/new"]}}),
                ),
            )
            .await,
        422,
        "Invalid",
        "adding a finalizer while deleting",
    )?;
    nodes
        .patch(
            &name,
            &pp,
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    expect_err(
        nodes.get(&name).await,
        404,
        "NotFound",
        "node gone after last finalizer",
    )?;
    Ok(())
}

async fn service_status_and_finalizers(client: Client, ns: &str) -> anyhow::Result<()> {
    let svcs: Api<Service> = Api::namespaced(client, ns);
    let created = svcs
        .create(
            &PostParams::default(),
            &obj(json!({
                "metadata": {"name": "lb"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "9.9.9.9"}]}}
            })),
        )
        .await?;
    let spec = created.spec.clone().unwrap_or_default();
    ensure!(
        spec.cluster_ip.as_deref().is_some_and(|ip| !ip.is_empty()),
        "clusterIP allocated"
    );
    let port = spec
        .ports
        .clone()
        .unwrap_or_default()
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no port"))?;
    ensure!(
        port.protocol.as_deref() == Some("TCP"),
        "protocol defaulted"
    );
    ensure!(
        port.node_port.is_some_and(|p| p > 0),
        "nodePort allocated for LoadBalancer"
    );
    ensure!(
        created
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .is_none(),
        "status is cleared on create"
    );
    let pp = PatchParams::default();
    svcs.patch_status("lb", &pp, &Patch::Strategic(json!({"status": {"loadBalancer": {"ingress": [{"ip": "1.1.1.1"}, {"ip": "1.1.1.2"}]}}})))
        .await?;
    let s = svcs
        .patch_status(
            "lb",
            &pp,
            &Patch::Strategic(
                json!({"status": {"loadBalancer": {"ingress": [{"ip": "2.2.2.2"}]}}}),
            ),
        )
        .await?;
    let ingress = to_json(
        &s.status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.clone()),
    );
    ensure!(
        ingress == json!([{"ip": "2.2.2.2"}]),
        "ingress is atomic: {ingress}"
    );
    // Finalizers through services/status, as the service controller does.
    let s = svcs
        .patch_status("lb", &pp, &Patch::Strategic(json!({"metadata": {"finalizers": ["service.kubernetes.io/load-balancer-cleanup"]}})))
        .await?;
    ensure!(
        s.metadata.finalizers == Some(vec!["service.kubernetes.io/load-balancer-cleanup".into()]),
        "finalizer via status: {:?}",
        s.metadata.finalizers
    );
    svcs.delete("lb", &DeleteParams::default()).await?;
    let s = svcs.get("lb").await?;
    ensure!(
        s.metadata.deletion_timestamp.is_some(),
        "service is terminating"
    );
    svcs.patch_status("lb", &pp, &Patch::Strategic(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["service.kubernetes.io/load-balancer-cleanup"]}})))
        .await?;
    expect_err(svcs.get("lb").await, 404, "NotFound", "service gone")?;
    Ok(())
}

async fn lease_apply(client: Client, ns: &str) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client, ns);
    let apply = |holder: Option<&str>, dur: Option<i32>| {
        let mut spec = serde_json::Map::new();
        if let Some(h) = holder {
            spec.insert("holderIdentity".into(), json!(h));
        }
        if let Some(d) = dur {
            spec.insert("leaseDurationSeconds".into(), json!(d));
        }
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec})
    };
    let l = leases
        .patch(
            "l1",
            &PatchParams::apply("m1"),
            &Patch::Apply(apply(Some("a"), Some(10))),
        )
        .await?;
    ensure!(
        to_json(&l.spec) == json!({"holderIdentity": "a", "leaseDurationSeconds": 10}),
        "apply creates: {:?}",
        l.spec
    );
    // Another manager applying a different value of an owned field conflicts...
    expect_err(
        leases
            .patch(
                "l1",
                &PatchParams::apply("m2"),
                &Patch::Apply(apply(Some("b"), None)),
            )
            .await,
        409,
        "Conflict",
        "apply conflict",
    )?;
    // ...applying the same value does not...
    leases
        .patch(
            "l1",
            &PatchParams::apply("m2"),
            &Patch::Apply(apply(Some("a"), None)),
        )
        .await?;
    // ...and force takes the field over.
    let l = leases
        .patch(
            "l1",
            &PatchParams::apply("m3").force(),
            &Patch::Apply(apply(Some("c"), None)),
        )
        .await?;
    ensure!(
        to_json(&l.spec) == json!({"holderIdentity": "c", "leaseDurationSeconds": 10}),
        "forced apply: {:?}",
        l.spec
    );
    // m1 stops applying leaseDurationSeconds (it owns it alone): the field is removed.
    let l = leases
        .patch(
            "l1",
            &PatchParams::apply("m1"),
            &Patch::Apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})),
        )
        .await?;
    ensure!(
        to_json(&l.spec) == json!({"holderIdentity": "c"}),
        "unapplied field removed: {:?}",
        l.spec
    );
    // A strategic merge patch by anyone can null fields (kube-lease-manager's release).
    let l = leases
        .patch(
            "l1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"holderIdentity": null}})),
        )
        .await?;
    ensure!(
        l.spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_ref())
            .is_none(),
        "holder released"
    );
    leases.delete("l1", &DeleteParams::default()).await?;
    Ok(())
}

async fn errors(client: Client, ns: &str) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-namespace-x");
    expect_err(
        cms.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "c"}})),
        )
        .await,
        404,
        "NotFound",
        "create in a missing namespace",
    )?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    expect_err(
        cms.create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "Bad_Name"}})),
        )
        .await,
        422,
        "Invalid",
        "invalid name",
    )?;
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Widget"), "widgets");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, ns, &ar);
    match widgets.list(&ListParams::default()).await {
        Ok(_) => bail!("unknown resource listed"),
        Err(e) => ensure!(api_code(&e) == Some(404), "unknown resource: {e:?}"),
    }
    Ok(())
}
