//! Benchmark (ignored by default) of the `kind` (containers) provider's load balancers against
//! real podman, through the host's loader and controllers:
//!
//! - **first answer**: Service created → first HTTP request answered through its proxy on
//!   127.0.0.1, for `BENCH_SERVICES` (default 3) Services one after the other;
//! - **host changes**: `BENCH_CHANGES` (default 10) host changes (the Node of one node container
//!   deleted, then created again, alternately) under a steady request loop (`BENCH_LOOPERS`
//!   threads, default 4, each sending sequential requests on new connections) plus connections
//!   opened before each change and used after it; reports the requests sent and failed, the
//!   time from each change until the answers reflect it, and the time of the provider's
//!   `UpdateLoadBalancer` alone (file written into the container, `SIGUSR2`, haproxy's
//!   `Loading success.` read back from its log), called directly on the plugin's rlib, 0.5 s
//!   apart.
//!
//!   cargo test -p ccm-provider-containers --test bench_podman -- --ignored --nocapture
//!
//! Prints `BENCH containers_lb key=value ...`; asserts only correctness (every request
//! answered, each change reflected), never time.

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_host::controllers::{node, service, ControllerConfig};
use ccm_provider_abi::prelude::*;
use k8s_openapi::api::core::v1::{Node as KNode, Service as KService};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(90);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A connection opened now, its request sent later: established across a reload.
fn open(port: i32) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(("127.0.0.1", port as u16)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn finish(mut s: std::net::TcpStream) -> Result<String, String> {
    s.write_all(b"GET / HTTP/1.1\r\nHost: lb\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("read: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.contains(" 200 ") => Ok(body.trim().to_string()),
        _ => Err(format!("answer: {:?}", text.lines().next())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: needs podman, run with --ignored"]
async fn bench_containers_lb() {
    let services_n = env_usize("BENCH_SERVICES", 3);
    let changes = env_usize("BENCH_CHANGES", 10);
    let loopers = env_usize("BENCH_LOOPERS", 4);
    let pm = tokio::task::spawn_blocking(Podman::start).await.unwrap();
    let nodes: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| pm.node(s)).collect();
    let config = pm.cloud_config(true);
    let env = Env::start(&config).await;
    for n in &nodes {
        env.seed_node(n);
    }
    let ctx = env.context(ControllerConfig {
        node_status_update_frequency: Duration::from_secs(3600),
        ..Default::default()
    });
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));
    tokio::spawn(service::run(ctx.clone()));
    for n in &nodes {
        eventually(&format!("{n} initialised"), WAIT, || {
            env.node(n).filter(|v| v["spec"]["providerID"].is_string())
        })
        .await;
    }

    // Service created → first answer.
    let services: Api<KService> = Api::namespaced(env.client.clone(), "default");
    let mut first = Vec::new();
    let mut ports = Vec::new();
    for i in 0..services_n {
        let port = free_port();
        let started = Instant::now();
        services
            .create(
                &PostParams::default(),
                &lb_service(&format!("web{i}"), port, json!([])),
            )
            .await
            .unwrap();
        tokio::task::spawn_blocking(move || loop {
            if get(port).is_ok() {
                return;
            }
            assert!(started.elapsed() < WAIT, "no answer on {port}");
            std::thread::sleep(Duration::from_millis(5));
        })
        .await
        .unwrap();
        first.push(started.elapsed().as_secs_f64() * 1000.0);
        ports.push(port);
    }
    let port = ports[0];

    // Host changes under a steady loop.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new((0usize, Vec::<String>::new())));
    let threads: Vec<_> = (0..loopers)
        .map(|_| {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let r = get(port);
                    let mut s = seen.lock().unwrap();
                    s.0 += 1;
                    if let Err(e) = r {
                        s.1.push(e);
                    }
                }
            })
        })
        .collect();
    let node_api: Api<KNode> = Api::all(env.client.clone());
    let moving = nodes[3].clone();
    let mut converge = Vec::new();
    let mut held = (0usize, Vec::<String>::new());
    for change in 0..changes {
        let early: Vec<_> = (0..4).map(|_| open(port)).collect();
        let removing = change % 2 == 0;
        let started = Instant::now();
        if removing {
            node_api
                .delete(&moving, &DeleteParams::default())
                .await
                .unwrap();
        } else {
            env.server
                .controls()
                .seed(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": moving},
                    "spec": {"providerID": format!("kind://{}/kind/{moving}", pm.cluster)},
                    "status": {
                        "conditions": [{"type": "Ready", "status": "True"}],
                        "addresses": [{"type": "InternalIP", "address": pm.ip(&moving)}],
                    },
                }))
                .unwrap();
        }
        let m = moving.clone();
        let reflected = tokio::task::spawn_blocking(move || loop {
            let (per, _) = tally(port, 12);
            if per.contains_key(&m) != removing {
                return true;
            }
            if started.elapsed() > WAIT {
                return false;
            }
        })
        .await
        .unwrap();
        assert!(
            reflected,
            "change {change} ({} {moving}) not reflected after {WAIT:?}; node: {:?}\n{}",
            if removing { "delete" } else { "re-create" },
            env.node(&moving),
            pm.describe_proxies()
        );
        converge.push(started.elapsed().as_secs_f64() * 1000.0);
        for s in early {
            held.0 += 1;
            if let Err(e) = finish(s) {
                held.1.push(e);
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    let (sent, failed) = seen.lock().unwrap().clone();

    // The provider's UpdateLoadBalancer alone (direct calls on the rlib, same container).
    let svc: KService = serde_json::from_value(env.service("web0").unwrap()).unwrap();
    let node_objs: Vec<Node> = nodes
        .iter()
        .map(|n| {
            serde_json::from_value(env.node(n).unwrap_or(json!({"metadata": {"name": n}}))).unwrap()
        })
        .collect();
    let cloud = ccm_provider_containers::ContainersCloud::new(Some(config.as_bytes())).unwrap();
    let lb = cloud.load_balancer().unwrap();
    let ctx = CallContext::background();
    let mut update = Vec::new();
    for i in 0..changes {
        let hosts: Vec<Node> = node_objs
            .iter()
            .filter(|n| i % 2 == 1 || n.metadata.name.as_deref() != Some(&moving))
            .filter(|n| n.status.is_some())
            .cloned()
            .collect();
        // Apart by more than the provider's reload spacing: the figure is the reload alone.
        std::thread::sleep(Duration::from_millis(500));
        let started = Instant::now();
        lb.update_load_balancer(&ctx, "kubernetes", &svc, &hosts)
            .unwrap();
        update.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "BENCH containers_lb services={services_n} first_answer_ms_median={:.0} first_answer_ms_max={:.0} changes={changes} loopers={loopers} requests={sent} failed={} held_connections={} held_failed={} converge_ms_median={:.0} converge_ms_max={:.0} update_call_ms_median={:.0} update_call_ms_max={:.0} load=\"{}\"",
        median(&mut first.clone()),
        first.iter().cloned().fold(0.0, f64::max),
        failed.len(),
        held.0,
        held.1.len(),
        median(&mut converge.clone()),
        converge.iter().cloned().fold(0.0, f64::max),
        median(&mut update.clone()),
        update.iter().cloned().fold(0.0, f64::max),
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(held.1.is_empty(), "{:?}", held.1);
    let answered: BTreeSet<String> = tally(port, 40).0.into_keys().collect();
    assert!(answered.len() >= 3, "{answered:?}");
}
