//! What `kubectl describe node`, `kubectl get pods -A` and `kubectl describe service` read from
//! the in-memory API server: the requests kubectl 1.32 makes (taken from `kubectl -v=6`), sent
//! over HTTP to the server's own paths, with the answers those commands need (pods filtered by
//! node and phase, events by involved object, the node's Lease, EndpointSlices by service, the
//! discovery documents naming them). When `kubectl` is on PATH the same commands also run for
//! real; the HTTP assertions run either way, so the test cannot pass by skipping.

mod support;

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube_apiserver_inmem::ApiServer;
use serde_json::{json, Value};
use support::obj;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A raw HTTP/1.1 GET; returns (status code, body as JSON).
async fn get(server: &ApiServer, path_and_query: &str, accept: &str) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let req = format!(
        "GET {path_and_query} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: {accept}\r\nUser-Agent: kubectl/v1.32.4 (linux/amd64) kubernetes/test\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // Lists and gets are answered with a Content-Length: the body follows the head.
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("GET {path_and_query}: {code}, not JSON ({e}): {body}"));
    (code, json)
}

const JSON: &str = "application/json";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {list:#}"))
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or(""),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn resource_names(list: &Value) -> Vec<&str> {
    list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect()
}

/// Nodes `node-a` (two pods that run, one that failed) and `node-b` (one pod), a service `web`,
/// an event about each, and `node-a`'s kubelet Lease. Returns the uids of node-a and web.
async fn seed(server: &ApiServer) -> (String, String) {
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pp = PostParams::default();
    let node_a = nodes
        .create(&pp, &obj(json!({"metadata": {"name": "node-a"}})))
        .await
        .unwrap();
    nodes
        .create(&pp, &obj(json!({"metadata": {"name": "node-b"}})))
        .await
        .unwrap();
    let svc = Api::<Service>::namespaced(client.clone(), "default")
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"type": "LoadBalancer", "selector": {"app": "web"}, "ports": [{"port": 80}]}})),
        )
        .await
        .unwrap();
    for (ns, name, node, phase) in [
        ("default", "web-1", "node-a", "Running"),
        ("kube-system", "agent-a", "node-a", "Running"),
        ("default", "done-a", "node-a", "Failed"),
        ("default", "web-2", "node-b", "Running"),
    ] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod = pods
            .create(
                &pp,
                &obj(json!({"metadata": {"name": name},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox",
                        "resources": {"requests": {"cpu": "100m"}}}]}})),
            )
            .await
            .unwrap();
        assert_eq!(
            pod.status.and_then(|s| s.phase).as_deref(),
            Some("Pending"),
            "a new pod starts Pending"
        );
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase, "podIP": "10.244.0.9",
                "containerStatuses": [{"name": "c", "image": "busybox", "imageID": "", "ready": phase == "Running",
                    "restartCount": 2, "started": true}]}})),
        )
        .await
        .unwrap();
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    for (name, kind, object, namespace, uid, reason) in [
        (
            "node-a.1",
            "Node",
            "node-a",
            None,
            node_a.metadata.uid.clone().unwrap(),
            "Synced",
        ),
        (
            "web.1",
            "Service",
            "web",
            Some("default"),
            svc.metadata.uid.clone().unwrap(),
            "EnsuredLoadBalancer",
        ),
    ] {
        events
            .create(
                &pp,
                &obj(json!({"metadata": {"name": name},
                    "involvedObject": {"apiVersion": "v1", "kind": kind, "name": object, "namespace": namespace, "uid": uid},
                    "type": "Normal", "reason": reason, "message": format!("{reason} {object}"), "count": 1,
                    "source": {"component": "ccm-test"}})),
            )
            .await
            .unwrap();
    }
    Api::<Lease>::namespaced(client, "kube-node-lease")
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "node-a"},
                "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40}})),
        )
        .await
        .unwrap();
    (node_a.metadata.uid.unwrap(), svc.metadata.uid.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_what_kubectl_describe_and_get_pods_read() {
    let server = ApiServer::start().await.unwrap();

    // Before anything runs, `kubectl get pods -A` lists nothing (not 404).
    let (code, list) = get(&server, "/api/v1/pods?limit=500", JSON).await;
    assert_eq!(code, 200, "{list:#}");
    assert_eq!(list["kind"], "PodList");
    assert_eq!(names(&list), Vec::<String>::new());

    let (node_uid, svc_uid) = seed(&server).await;

    // Discovery: kubectl resolves `pods`, `endpoints` and `endpointslices` from these.
    let (code, core) = get(&server, "/api/v1?timeout=32s", JSON).await;
    assert_eq!(code, 200);
    let core = resource_names(&core);
    for r in [
        "pods",
        "pods/status",
        "endpoints",
        "nodes",
        "services",
        "events",
    ] {
        assert!(core.contains(&r), "{r} missing from /api/v1: {core:?}");
    }
    let (_, groups) = get(&server, "/apis?timeout=32s", JSON).await;
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "discovery.k8s.io"),
        "{groups:#}"
    );
    let (code, disc) = get(&server, "/apis/discovery.k8s.io/v1?timeout=32s", JSON).await;
    assert_eq!(code, 200);
    assert_eq!(resource_names(&disc), ["endpointslices"]);

    // kubectl describe node node-a: the node's pods that have not ended, its events (by the
    // node's uid, and by its name as kubelet's events carry it), its kubelet Lease.
    let (code, pods) = get(
        &server,
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-a%2Cstatus.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed&limit=500",
        JSON,
    )
    .await;
    assert_eq!(code, 200, "{pods:#}");
    assert_eq!(names(&pods), ["default/web-1", "kube-system/agent-a"]);
    let (code, events) = get(
        &server,
        &format!("/api/v1/events?fieldSelector=involvedObject.name%3Dnode-a%2CinvolvedObject.namespace%3D%2CinvolvedObject.kind%3DNode%2CinvolvedObject.uid%3D{node_uid}&limit=500"),
        JSON,
    )
    .await;
    assert_eq!(code, 200, "{events:#}");
    assert_eq!(names(&events), ["default/node-a.1"]);
    let (code, events) = get(
        &server,
        "/api/v1/events?fieldSelector=involvedObject.name%3Dnode-a%2CinvolvedObject.namespace%3D%2CinvolvedObject.kind%3DNode%2CinvolvedObject.uid%3Dnode-a&limit=500",
        JSON,
    )
    .await;
    assert_eq!(code, 200, "{events:#}");
    assert_eq!(names(&events), Vec::<String>::new());
    let (code, lease) = get(
        &server,
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-a",
        JSON,
    )
    .await;
    assert_eq!(code, 200, "{lease:#}");
    assert_eq!(lease["spec"]["holderIdentity"], "node-a");

    // kubectl get pods -A: a Table with upstream's pod columns.
    let (code, table) = get(&server, "/api/v1/pods?limit=500", TABLE).await;
    assert_eq!(code, 200, "{table:#}");
    assert_eq!(table["kind"], "Table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Ready",
            "Status",
            "Restarts",
            "Age",
            "IP",
            "Node",
            "Nominated Node",
            "Readiness Gates"
        ]
    );
    let rows: Vec<Vec<Value>> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cells"].as_array().unwrap().clone())
        .collect();
    assert_eq!(rows.len(), 4, "{table:#}");
    let done = rows.iter().find(|r| r[0] == "done-a").unwrap();
    assert_eq!(
        (&done[1], &done[2], &done[3], &done[6]),
        (&json!("0/1"), &json!("Failed"), &json!(2), &json!("node-a"))
    );
    let web = rows.iter().find(|r| r[0] == "web-1").unwrap();
    assert_eq!((&web[1], &web[2]), (&json!("1/1"), &json!("Running")));

    // kubectl describe service web: its EndpointSlices (none: nothing creates them here) and
    // its events.
    let (code, slices) = get(
        &server,
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb",
        JSON,
    )
    .await;
    assert_eq!(code, 200, "{slices:#}");
    assert_eq!(slices["kind"], "EndpointSliceList");
    assert_eq!(names(&slices), Vec::<String>::new());
    let (code, events) = get(
        &server,
        &format!("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dweb%2CinvolvedObject.namespace%3Ddefault%2CinvolvedObject.kind%3DService%2CinvolvedObject.uid%3D{svc_uid}&limit=500"),
        JSON,
    )
    .await;
    assert_eq!(code, 200, "{events:#}");
    assert_eq!(names(&events), ["default/web.1"]);
    // Older kubectl reads the Endpoints object: served, not there.
    let (code, _) = get(&server, "/api/v1/namespaces/default/endpoints/web", JSON).await;
    assert_eq!(code, 404);

    // The requests above went through the server's routing as kubectl's would: resource and
    // verb recognised, nothing answered 404 for an unknown resource.
    let log = server.controls().requests();
    for (resource, verb) in [
        ("pods", "list"),
        ("events", "list"),
        ("leases.coordination.k8s.io", "get"),
        ("endpointslices.discovery.k8s.io", "list"),
        ("endpoints", "get"),
    ] {
        assert!(
            log.iter()
                .any(|r| r.resource == resource && r.verb == verb && r.method == "GET"),
            "no {verb} {resource} in the request log"
        );
    }

    kubectl_commands(&server).await;
    server.shutdown().await;
}

fn kubectl_on_path() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|p| p.join("kubectl"))
        .find(|p| p.is_file())
}

/// The real kubectl, when there is one.
async fn kubectl_commands(server: &ApiServer) {
    let Some(kubectl) = kubectl_on_path() else {
        eprintln!(
            "note: kubectl is not on PATH; ran the HTTP requests it makes, not kubectl itself"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let run = |args: &'static [&'static str]| {
        let (kubectl, kubeconfig, cache) = (
            kubectl.clone(),
            kubeconfig.clone(),
            dir.path().join("cache"),
        );
        // kubectl blocks; the server runs on this runtime's other worker.
        tokio::task::spawn_blocking(move || {
            let out = Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg("--cache-dir")
                .arg(cache)
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "kubectl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    };
    let node = run(&["describe", "node", "node-a"]).await.unwrap();
    for want in [
        "Name:               node-a",
        "HolderIdentity:  node-a",
        "Non-terminated Pods:          (2 in total)",
        "web-1",
        "agent-a",
        "Synced",
    ] {
        assert!(node.contains(want), "{want:?} in\n{node}");
    }
    assert!(
        !node.contains("done-a"),
        "a Failed pod is not listed:\n{node}"
    );
    let pods = run(&["get", "pods", "-A"]).await.unwrap();
    let header: Vec<&str> = pods.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{pods}"
    );
    assert_eq!(pods.lines().count(), 5, "{pods}");
    let svc = run(&["describe", "service", "web"]).await.unwrap();
    for want in [
        "Name:                     web",
        "Type:                     LoadBalancer",
        "EnsuredLoadBalancer",
    ] {
        assert!(svc.contains(want), "{want:?} in\n{svc}");
    }
}

/// A raw HTTP/1.1 POST of `body` as `content_type`; returns (status code, body as JSON).
async fn post(server: &ApiServer, path: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAccept: application/vnd.kubernetes.protobuf,application/json\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nUser-Agent: kubectl/v1.32.4 (linux/amd64) kubernetes/test\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("POST {path}: {code}, not JSON ({e}): {body}"));
    (code, json)
}

/// What `kubectl create service loadbalancer x --tcp=80:8080`, `create namespace shop2`,
/// `create configmap cm --from-literal=a=b` and `create secret generic s --from-literal=k=v`
/// (kubectl 1.32.4) send: protobuf bodies, captured byte for byte in
/// `tests/fixtures/kubectl-protobuf/`. kubectl does not fall back to JSON when refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_sends_protobuf_and_the_server_takes_it() {
    let server = ApiServer::start().await.unwrap();
    let fixture = |name: &str| {
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/kubectl-protobuf")
                .join(name),
        )
        .unwrap()
    };
    const PB: &str = "application/vnd.kubernetes.protobuf";
    for (path, file, kind) in [
        ("/api/v1/namespaces", "create-namespaces.pb", "Namespace"),
        (
            "/api/v1/namespaces/default/services",
            "create-services.pb",
            "Service",
        ),
        (
            "/api/v1/namespaces/default/configmaps",
            "create-configmaps.pb",
            "ConfigMap",
        ),
        (
            "/api/v1/namespaces/default/secrets",
            "create-secrets.pb",
            "Secret",
        ),
    ] {
        let query = "?fieldManager=kubectl-create&fieldValidation=Strict";
        let (code, created) = post(&server, &format!("{path}{query}"), PB, &fixture(file)).await;
        assert_eq!(code, 201, "{kind}: {created:#}");
        assert_eq!(created["kind"], kind);
    }
    let client = server.client();
    let svc = Api::<Service>::namespaced(client.clone(), "default")
        .get("x")
        .await
        .unwrap();
    let spec = svc.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port, port.protocol.as_deref()),
        (Some("80-8080"), 80, Some("TCP"))
    );
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8080))
    );
    assert!(port.node_port.is_some(), "defaulted as for a JSON create");
    assert_eq!(
        spec.selector.unwrap().get("app").map(String::as_str),
        Some("x")
    );
    assert_eq!(
        svc.metadata.labels.unwrap().get("app").map(String::as_str),
        Some("x")
    );
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), "default")
        .get("cm")
        .await
        .unwrap();
    assert_eq!(cm.data.unwrap().get("a").map(String::as_str), Some("b"));
    let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "default")
        .get("s")
        .await
        .unwrap();
    assert_eq!(secret.data.unwrap()["k"].0, b"v");
    assert!(Api::<k8s_openapi::api::core::v1::Namespace>::all(client)
        .get("shop2")
        .await
        .is_ok());

    // A kind not decoded from protobuf: 415 naming what is, and that JSON works.
    // runtime.Unknown{typeMeta: {apiVersion: v1, kind: Pod}, raw: empty}
    let pod = b"k8s\0\x0a\x09\x0a\x02v1\x12\x03Pod\x12\x00".to_vec();
    let (code, status) = post(&server, "/api/v1/namespaces/default/pods", PB, &pod).await;
    assert_eq!(code, 415, "{status:#}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains("protobuf bodies of v1 Service, Namespace, ConfigMap and Secret only")
            && message.contains("send JSON"),
        "{message}"
    );

    // The real kubectl, when there is one (the docs' command).
    if let Some(kubectl) = kubectl_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let cache = dir.path().join("cache");
        let out = tokio::task::spawn_blocking(move || {
            Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .arg("--cache-dir")
                .arg(cache)
                .args(["create", "service", "loadbalancer", "lb2", "--tcp=443:8443"])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "kubectl create service: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let svc = Api::<Service>::namespaced(server.client(), "default")
            .get("lb2")
            .await
            .unwrap();
        assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 443);
    }
    server.shutdown().await;
}
