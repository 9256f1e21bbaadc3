//! Benchmark of the in-memory API server (ignored by default; prints figures, asserts nothing
//! about time). Run with:
//! `cargo test --release -p kube-apiserver-inmem --test bench -- --ignored --nocapture`

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube_apiserver_inmem::ApiServer;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
async fn bench_list_and_writes() {
    let server = ApiServer::start().await.unwrap();
    let ctl = server.controls();
    let t = Instant::now();
    for i in 0..10_000 {
        ctl.seed(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("node-{i:05}"), "labels": {"kubernetes.io/hostname": format!("node-{i:05}")}},
            "spec": {"providerID": format!("fake://node-{i:05}")},
            "status": {"addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)}],
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        ctl.seed(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{i:05}"), "namespace": "default"},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}
        }))
        .unwrap();
    }
    println!("seed 10,000 nodes + 10,000 services: {:?}", t.elapsed());
    assert_eq!(ctl.list("nodes").len(), 10_000);

    let nodes: Api<Node> = Api::all(server.client());
    // Watchers on nodes, counting events.
    let mut watchers = Vec::new();
    for _ in 0..4 {
        let rv = ctl.resource_version().to_string();
        let stream = nodes
            .watch(&WatchParams::default().timeout(120), &rv)
            .await
            .unwrap();
        watchers.push(tokio::spawn(async move {
            futures::pin_mut!(stream);
            let mut n = 0usize;
            while let Some(Ok(ev)) = stream.next().await {
                if matches!(ev, WatchEvent::Modified(_)) {
                    n += 1;
                    if n == 4_000 {
                        break;
                    }
                }
            }
            n
        }));
    }
    for _ in 0..3 {
        let t = Instant::now();
        let list = nodes
            .list(&ListParams::default().limit(5_000))
            .await
            .unwrap();
        println!(
            "list 5,000 of 10,000 nodes: {:?} ({} items)",
            t.elapsed(),
            list.items.len()
        );
    }
    let t = Instant::now();
    for i in 0..2_000 {
        nodes
            .patch(
                &format!("node-{i:05}"),
                &PatchParams::default(),
                &Patch::Strategic(json!({"metadata": {"labels": {"bench": "1"}}})),
            )
            .await
            .unwrap();
    }
    let el = t.elapsed();
    println!(
        "2,000 sequential strategic patches with 4 watchers: {el:?} ({:.0} writes/s)",
        2_000.0 / el.as_secs_f64()
    );
    let t = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..8 {
        let nodes = nodes.clone();
        tasks.push(tokio::spawn(async move {
            for i in (w..2_000).step_by(8) {
                nodes
                    .patch_status(
                        &format!("node-{i:05}"),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"status": {"phase": "Running"}})),
                    )
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let el = t.elapsed();
    println!(
        "2,000 status patches from 8 concurrent clients: {el:?} ({:.0} writes/s)",
        2_000.0 / el.as_secs_f64()
    );
    for w in watchers {
        let n = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .unwrap()
            .unwrap();
        println!("a watcher received {n} MODIFIED events");
    }
    server.shutdown().await;
}
