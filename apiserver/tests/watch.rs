//! kube-runtime watchers and reflectors against the in-memory API server: convergence after
//! dropped watches, after a 410 (history window exceeded), with streaming lists and selectors.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube_apiserver_inmem::{ApiServer, ApiServerOptions};
use serde_json::json;
use support::{obj, wait_until};

fn names(store: &Store<Node>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn create(nodes: &Api<Node>, name: &str, labels: serde_json::Value) {
    nodes
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": name, "labels": labels}})),
        )
        .await
        .expect("create node");
}

fn spawn_reflector(nodes: Api<Node>, cfg: watcher::Config) -> Store<Node> {
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(nodes, cfg))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader
}

#[tokio::test]
async fn reflector_converges_after_dropped_watches_and_after_410() {
    let server = ApiServer::start_with(ApiServerOptions {
        history_limit: 5,
        ..Default::default()
    })
    .await
    .unwrap();
    let ctl = server.controls();
    let nodes: Api<Node> = Api::all(server.client());
    for n in ["n1", "n2", "n3"] {
        create(&nodes, n, json!({})).await;
    }
    let store = spawn_reflector(nodes.clone(), watcher::Config::default());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            names(&store) == set(&["n1", "n2", "n3"])
        })
        .await
    );

    // Dropped watch: the watcher resumes from its resourceVersion (inside the history window).
    ctl.drop_watches();
    create(&nodes, "n4", json!({})).await;
    nodes.delete("n1", &DeleteParams::default()).await.unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            names(&store) == set(&["n2", "n3", "n4"])
        })
        .await,
        "after drop_watches: {:?}",
        names(&store)
    );

    // 410: keep watches failing while more changes than the history window happen, then let the
    // watcher resume from its now too-old resourceVersion.
    let lists_before = ctl
        .requests()
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "nodes")
        .count();
    ctl.fail_next(1_000, "watch", "nodes", 500);
    ctl.drop_watches();
    for i in 0..8 {
        create(&nodes, &format!("x{i}"), json!({})).await;
    }
    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    ctl.clear_faults();
    let want = set(&["n3", "n4", "x0", "x1", "x2", "x3", "x4", "x5", "x6", "x7"]);
    assert!(
        wait_until(Duration::from_secs(30), || async { names(&store) == want }).await,
        "after 410: {:?}",
        names(&store)
    );
    let log = ctl.requests();
    assert!(
        log.iter().any(|r| r.verb == "watch" && r.code == 410),
        "a watch was answered with 410 Expired"
    );
    let lists_after = log
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "nodes")
        .count();
    assert!(lists_after > lists_before, "the watcher relisted after 410");
    server.shutdown().await;
}

#[tokio::test]
async fn streaming_list_watcher_converges() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let nodes: Api<Node> = Api::all(server.client());
    create(&nodes, "a", json!({})).await;
    create(&nodes, "b", json!({})).await;
    let store = spawn_reflector(nodes.clone(), watcher::Config::default().streaming_lists());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            names(&store) == set(&["a", "b"])
        })
        .await
    );
    create(&nodes, "c", json!({})).await;
    assert!(
        wait_until(Duration::from_secs(10), || async {
            names(&store) == set(&["a", "b", "c"])
        })
        .await
    );
    let log = ctl.requests();
    assert!(log
        .iter()
        .any(|r| r.verb == "watch" && r.query.contains("sendInitialEvents=true")));
    assert!(
        !log.iter()
            .any(|r| r.verb == "list" && r.resource == "nodes"),
        "no list in streaming mode"
    );
    server.shutdown().await;
}

#[tokio::test]
async fn label_selected_watch_sees_objects_leave_and_enter() {
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    create(&nodes, "in", json!({"role": "edge"})).await;
    create(&nodes, "out", json!({"role": "core"})).await;
    let store = spawn_reflector(
        nodes.clone(),
        watcher::Config::default().labels("role=edge"),
    );
    assert!(
        wait_until(Duration::from_secs(10), || async {
            names(&store) == set(&["in"])
        })
        .await
    );
    let pp = PatchParams::default();
    nodes
        .patch(
            "in",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"role": "core"}}})),
        )
        .await
        .unwrap();
    nodes
        .patch(
            "out",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"role": "edge"}}})),
        )
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            names(&store) == set(&["out"])
        })
        .await,
        "selector transitions: {:?}",
        names(&store)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn raw_watch_stream_reports_types_and_timeout() {
    use kube::api::WatchEvent;
    use kube::api::WatchParams;
    let server = ApiServer::start().await.unwrap();
    let nodes: Api<Node> = Api::all(server.client());
    create(&nodes, "w1", json!({})).await;
    let rv = server.controls().resource_version().to_string();
    let stream = nodes
        .watch(&WatchParams::default().timeout(2), &rv)
        .await
        .unwrap();
    futures::pin_mut!(stream);
    let n2 = nodes.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        create(&n2, "w2", json!({})).await;
        n2.patch(
            "w2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
        n2.delete("w2", &DeleteParams::default()).await.unwrap();
    });
    let mut seen = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev.unwrap() {
            WatchEvent::Added(n) => {
                seen.push(format!("ADDED {}", n.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Modified(n) => {
                seen.push(format!("MODIFIED {}", n.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Deleted(n) => {
                seen.push(format!("DELETED {}", n.metadata.name.unwrap_or_default()))
            }
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
        }
    }
    // The stream ended by itself (timeoutSeconds=2), after exactly these events.
    assert_eq!(seen, ["ADDED w2", "MODIFIED w2", "DELETED w2"]);
    server.shutdown().await;
}
