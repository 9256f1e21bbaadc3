//! The `kind` (containers) provider against real podman, through the host's loader and
//! controllers: nodes initialised from their containers, a stopped or paused container tainted
//! shut down and a removed one deleting its Node, and HTTP requests sent through the haproxy container
//! the provider made for a LoadBalancer Service, answered by the node containers (before and
//! after a node leaves, with a steady request loop across the reload), a second Service with
//! its own proxy, deletion removing the proxy, a UDP port refused with an event.
//!
//! podman is set up by `support` (`deploy/podman-env.sh`, installed by `.ci/run`); a machine
//! without it fails these tests with the command that installs it.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_host::controllers::{node, node_lifecycle, service, ControllerConfig};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(90);

fn cfg() -> ControllerConfig {
    ControllerConfig {
        cluster_name: "kubernetes".into(),
        node_status_update_frequency: Duration::from_secs(3600),
        node_monitor_period: Duration::from_millis(500),
        ..Default::default()
    }
}

fn taint_keys(n: &serde_json::Value) -> Vec<String> {
    n["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["key"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_flow_through_the_load_balancer_to_the_node_containers() {
    let pm = tokio::task::spawn_blocking(Podman::start).await.unwrap();
    let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| pm.node(s)).collect();
    let env = Env::start(&pm.cloud_config(true)).await;
    for n in &nodes {
        env.seed_node(n);
    }
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));
    tokio::spawn(service::run(ctx.clone()));

    // Nodes initialised from their containers.
    for n in &nodes {
        let node = eventually(&format!("node {n} initialised"), WAIT, || {
            env.node(n)
                .filter(|v| !taint_keys(v).contains(&UNINITIALIZED.to_string()))
        })
        .await;
        assert_eq!(
            node["spec"]["providerID"],
            format!("kind://{}/kind/{n}", pm.cluster)
        );
        let addrs = node["status"]["addresses"].clone();
        assert_eq!(
            addrs,
            json!([{"type": "InternalIP", "address": pm.ip(n)}, {"type": "Hostname", "address": n}]),
            "node {n}"
        );
        let labels = &node["metadata"]["labels"];
        assert_eq!(labels["topology.kubernetes.io/zone"], "zone-a");
        assert_eq!(
            labels["node.kubernetes.io/instance-type"],
            "localhost-ccm-test-node-latest"
        );
    }

    // A LoadBalancer Service: the proxy publishes its port on 127.0.0.1.
    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let port = free_port();
    let created = Instant::now();
    services
        .create(&PostParams::default(), &lb_service("web", port, json!([])))
        .await
        .unwrap();
    let svc = eventually("web's ingress", WAIT, || {
        env.service("web").filter(|s| !ingress_ips(s).is_empty())
    })
    .await;
    let proxies = pm.proxies();
    assert_eq!(proxies.len(), 1, "{proxies:?}");
    assert_eq!(
        ingress_ips(&svc),
        [pm.ip(&proxies[0]), "127.0.0.1".to_string()]
    );
    assert_eq!(
        svc["status"]["loadBalancer"]["ingress"][0]["ipMode"],
        "Proxy"
    );
    let first = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        loop {
            match get(port) {
                Ok(body) => return body,
                Err(e) if started.elapsed() > Duration::from_secs(30) => {
                    panic!("no answer on 127.0.0.1:{port} within 30 s: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    })
    .await
    .unwrap();
    println!(
        "first answer from {first} {:?} after the Service was created",
        created.elapsed()
    );
    let (before, errors) = tokio::task::spawn_blocking(move || tally(port, 60))
        .await
        .unwrap();
    println!(
        "before a node leaves: 60 requests, answered per node: {before:?}, failed: {}",
        errors.len()
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        before.keys().cloned().collect::<BTreeSet<_>>(),
        nodes.iter().cloned().collect::<BTreeSet<_>>(),
        "every node answers"
    );

    // A steady request loop while node c leaves the cluster (its server is removed and
    // haproxy reloads): no request fails.
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new((0usize, Vec::<String>::new())));
    let looper = {
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
    };
    let gone = nodes[2].clone();
    let node_api: Api<Node> = Api::all(env.client.clone());
    node_api
        .delete(&gone, &DeleteParams::default())
        .await
        .unwrap();
    let settle = Instant::now();
    loop {
        let (per, _) = tokio::task::spawn_blocking(move || tally(port, 30))
            .await
            .unwrap();
        if !per.contains_key(&gone) {
            break;
        }
        assert!(
            settle.elapsed() < WAIT,
            "{gone} still answers {WAIT:?} after its Node was deleted: {per:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::SeqCst);
    looper.join().unwrap();
    let (looped, loop_errors) = seen.lock().unwrap().clone();
    println!(
        "steady loop across the reload: {looped} requests, {} failed",
        loop_errors.len()
    );
    assert!(loop_errors.is_empty(), "{loop_errors:?}");
    let (after, errors) = tokio::task::spawn_blocking(move || tally(port, 60))
        .await
        .unwrap();
    println!(
        "after {gone} left: 60 requests, answered per node: {after:?}, failed: {}",
        errors.len()
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        after.keys().cloned().collect::<BTreeSet<_>>(),
        nodes[..2].iter().cloned().collect::<BTreeSet<_>>()
    );

    // A second Service gets its own proxy.
    let port2 = free_port();
    services
        .create(
            &PostParams::default(),
            &lb_service("web2", port2, json!([])),
        )
        .await
        .unwrap();
    eventually("web2's ingress", WAIT, || {
        env.service("web2").filter(|s| !ingress_ips(s).is_empty())
    })
    .await;
    let both = pm.proxies();
    assert_eq!(both.len(), 2, "{both:?}");
    let body = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        loop {
            match get(port2) {
                Ok(b) => return b,
                Err(e) if started.elapsed() > Duration::from_secs(30) => panic!("web2: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    })
    .await
    .unwrap();
    assert!(nodes[..2].contains(&body), "{body}");

    // Deleting the first Service removes its proxy, and only that one.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let left = eventually("web's proxy removed", WAIT, || {
        let p = pm.proxies();
        (p.len() == 1).then_some(p)
    })
    .await;
    assert!(both.contains(&left[0]) && left[0] != proxies[0]);
    assert!(
        tokio::task::spawn_blocking(move || get(port))
            .await
            .unwrap()
            .is_err(),
        "nothing answers on web's port any more"
    );
    eventually("web deleted", WAIT, || {
        env.service("web").is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_udp_port_is_refused_with_an_event_and_nothing_is_made() {
    let pm = tokio::task::spawn_blocking(Podman::start).await.unwrap();
    let n = pm.node("a");
    let env = Env::start(&pm.cloud_config(false)).await;
    env.seed_node(&n);
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));
    tokio::spawn(service::run(ctx.clone()));
    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let svc = lb_service(
        "dns",
        53,
        json!([{"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]),
    );
    services.create(&PostParams::default(), &svc).await.unwrap();
    let event = eventually("a Warning event about the UDP port", WAIT, || {
        env.events().into_iter().find(|e| {
            e["involvedObject"]["name"] == "dns"
                && e["message"].as_str().is_some_and(|m| {
                    m.contains("dns 53/UDP: the haproxy load balancer carries TCP only")
                })
        })
    })
    .await;
    assert_eq!(event["type"], "Warning");
    let message = event["message"].as_str().unwrap();
    assert!(!message.contains('\n'), "{message}");
    assert!(pm.proxies().is_empty(), "{:?}", pm.proxies());
    assert!(ingress_ips(&env.service("dns").unwrap()).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_container_is_shut_down_and_a_removed_one_deletes_its_node() {
    let pm = tokio::task::spawn_blocking(Podman::start).await.unwrap();
    let nodes: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| pm.node(s)).collect();
    let env = Env::start(&pm.cloud_config(false)).await;
    // Initialised nodes that are NotReady (the lifecycle controller looks only at those).
    for n in &nodes {
        env.server
            .controls()
            .seed(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": n},
                "spec": {"providerID": format!("kind://{}/kind/{n}", pm.cluster)},
                "status": {"conditions": [{"type": "Ready", "status": "False"}]},
            }))
            .unwrap();
    }
    podman_ok(&pm.conf, &["stop", "-t", "0", &nodes[0]]);
    podman_ok(&pm.conf, &["rm", "-f", "-t", "0", &nodes[1]]);
    podman_ok(&pm.conf, &["pause", &nodes[3]]);
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node_lifecycle::run(ctx.clone()));
    eventually(
        "shutdown taint on the stopped container's node",
        WAIT,
        || {
            env.node(&nodes[0]).filter(|n| {
                taint_keys(n).contains(&"node.cloudprovider.kubernetes.io/shutdown".to_string())
            })
        },
    )
    .await;
    eventually(
        "shutdown taint on the paused container's node",
        WAIT,
        || {
            env.node(&nodes[3]).filter(|n| {
                taint_keys(n).contains(&"node.cloudprovider.kubernetes.io/shutdown".to_string())
            })
        },
    )
    .await;
    eventually("the removed container's node deleted", WAIT, || {
        env.node(&nodes[1]).is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let running = env
        .node(&nodes[2])
        .expect("the running container's node stays");
    assert!(taint_keys(&running).is_empty(), "{running}");
    assert!(
        env.node(&nodes[0]).is_some(),
        "a stopped container still exists"
    );
}

/// No runtime (a socket nobody serves): no Node is ever deleted, the error names the socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_runtime_never_deletes_a_node() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("gone.sock");
    let env = Env::start(&format!("socket: {}\ncluster: c\n", socket.display())).await;
    env.server
        .controls()
        .seed(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "c-worker"},
            "spec": {"providerID": "kind://c/kind/c-worker"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }))
        .unwrap();
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node_lifecycle::run(ctx.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.node("c-worker").is_some(), "the Node stays");
    let err = env
        .provider
        .health()
        .await
        .expect_err("no runtime: health fails");
    assert!(
        err.to_string().contains(&socket.display().to_string()),
        "{err}"
    );
}

/// At `Initialize`, the proxies of this cluster whose Service is gone are removed; a proxy of
/// an existing Service and another cluster's are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_of_deleted_services_are_removed_at_start() {
    let pm = tokio::task::spawn_blocking(Podman::start).await.unwrap();
    let env = Env::start(&pm.cloud_config(false)).await;
    let make = |suffix: &str, owner: &str, service: &str| {
        let name = format!("{}-{suffix}", pm.cluster);
        podman_ok(
            &pm.conf,
            &[
                "run",
                "-d",
                "--name",
                &name,
                "--network",
                &pm.network,
                "--label",
                &format!("{OWNER_LABEL}={owner}"),
                "--label",
                &format!("io.ccm-host.containers.service={service}"),
                &pm.node_image,
                "sleep",
                "infinity",
            ],
        );
        name
    };
    let orphan = make("orphan", &pm.cluster, "default/gone");
    let kept = make("kept", &pm.cluster, "default/web");
    let foreign = make("foreign", "another-cluster", "default/gone");
    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("web", free_port(), json!([])),
        )
        .await
        .unwrap();
    env.provider
        .initialize(ccm_host::provider::HostServices::new(
            "kubernetes",
            Some(env.client.clone()),
            Arc::new(AtomicBool::new(false)),
        ))
        .await
        .unwrap();
    assert!(pm.inspect(&orphan).is_none(), "the orphan is removed");
    assert!(pm.inspect(&kept).is_some(), "the proxy of web is kept");
    assert!(
        pm.inspect(&foreign).is_some(),
        "another cluster's proxy is kept"
    );
}
