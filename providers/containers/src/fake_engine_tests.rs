//! The provider against a scripted Engine API ([`crate::fake_engine`]): the error paths.

use std::sync::{Arc, Mutex};

use ccm_provider_abi::prelude::*;
use serde_json::json;

use crate::fake_engine::FakeEngine;
use crate::loadbalancer::{container_name, OWNER_LABEL, PUBLISHED_LABEL, SERVICE_LABEL};
use crate::ContainersCloud;

fn cloud(engine: &FakeEngine) -> ContainersCloud {
    let config = format!("socket: {}\n", engine.socket.display());
    ContainersCloud::new(Some(config.as_bytes())).unwrap()
}

fn service() -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]},
    }))
    .unwrap()
}

fn nodes() -> Vec<Node> {
    ["kind-worker", "kind-worker2"]
        .iter()
        .enumerate()
        .map(|(i, n)| {
            serde_json::from_value(json!({
                "metadata": {"name": n},
                "status": {"addresses": [{"type": "InternalIP", "address": format!("10.89.0.{}", i + 2)}]},
            }))
            .unwrap()
        })
        .collect()
}

fn json_body(v: serde_json::Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

fn proxy(labels: serde_json::Value) -> Vec<u8> {
    json_body(json!({
        "Id": "abc", "Name": format!("/{}", container_name("kind", &service())),
        "State": {"Status": "running", "Running": true},
        "Config": {"Image": "localhost/ccm-haproxy:latest", "Labels": labels},
        "NetworkSettings": {"Networks": {"kind": {"IPAddress": "10.89.0.9"}}},
    }))
}

#[test]
fn runtime_refusals_are_unauthorized_and_never_not_found() {
    let engine = FakeEngine::start(|_| (403, json_body(json!({"message": "access denied"}))));
    let c = cloud(&engine);
    let ctx = CallContext::background();
    let node = &nodes()[0];
    let e = c
        .instances_v2()
        .unwrap()
        .instance_exists(&ctx, node)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UNAUTHORIZED);
    assert!(e.message().contains("access denied"), "{e}");
    assert!(
        e.message().contains(&engine.socket.display().to_string()),
        "{e}"
    );
    // A batch fails as a whole: no node is reported "does not exist".
    let e = c
        .bulk_instances()
        .unwrap()
        .instances_batch(&ctx, &nodes(), InstanceQuery::EXISTS)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::UNAUTHORIZED);

    let engine = FakeEngine::start(|_| (500, b"boom".to_vec()));
    let e = cloud(&engine)
        .instances_v2()
        .unwrap()
        .instance_shutdown(&ctx, node)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OTHER);
    assert!(e.message().contains("HTTP 500: boom"), "{e}");
}

#[test]
fn a_missing_proxy_image_is_named_and_nothing_is_created() {
    let engine = FakeEngine::start(|r| {
        if r.path.starts_with("/images/") {
            (404, json_body(json!({"message": "no such image"})))
        } else {
            (404, json_body(json!({"message": "no such container"})))
        }
    });
    let c = cloud(&engine);
    let e = c
        .load_balancer()
        .unwrap()
        .ensure_load_balancer(&CallContext::background(), "k", &service(), &nodes())
        .unwrap_err();
    assert!(
        e.message().contains(
            "load balancer image localhost/ccm-haproxy:latest is not in the container runtime"
        ),
        "{e}"
    );
    assert!(!e.message().contains('\n'));
    assert!(
        !engine.requests().iter().any(|r| r.starts_with("POST")),
        "{:?}",
        engine.requests()
    );
}

#[test]
fn a_container_it_did_not_make_is_never_touched() {
    let engine = FakeEngine::start(|r| {
        if r.method == "GET" && r.path.ends_with("/json") {
            (200, proxy(json!({"purpose": "someone else's"})))
        } else {
            (500, b"must not be called".to_vec())
        }
    });
    let c = cloud(&engine);
    let lb = c.load_balancer().unwrap();
    let ctx = CallContext::background();
    let e = lb
        .ensure_load_balancer(&ctx, "k", &service(), &nodes())
        .unwrap_err();
    assert!(
        e.message().contains("exists but was not made by ccm-host"),
        "{e}"
    );
    lb.ensure_load_balancer_deleted(&ctx, "k", &service())
        .unwrap();
    assert!(lb.get_load_balancer(&ctx, "k", &service()).is_err());
    let writes: Vec<String> = engine
        .requests()
        .into_iter()
        .filter(|r| !r.starts_with("GET"))
        .collect();
    assert!(writes.is_empty(), "{writes:?}");
}

#[test]
fn a_refused_reload_is_an_error_and_the_next_sync_reloads_again() {
    #[derive(Default)]
    struct State {
        file: Vec<u8>,
        log: String,
        kills: usize,
    }
    let state = Arc::new(Mutex::new(State {
        file: b"old".to_vec(),
        log: "[NOTICE]   (1) : Loading success.\n".into(),
        kills: 0,
    }));
    let st = state.clone();
    let labels = json!({OWNER_LABEL: "kind", SERVICE_LABEL: "default/web", PUBLISHED_LABEL: ""});
    let engine = FakeEngine::start(move |r| {
        let mut s = st.lock().unwrap();
        match (r.method.as_str(), r.path.split('?').next().unwrap_or("")) {
            ("GET", p) if p.ends_with("/json") => (200, proxy(labels.clone())),
            ("GET", "/containers/abc/archive") => (
                200,
                crate::tar::archive("ccm-lb", &[("haproxy.cfg", &s.file)]),
            ),
            ("PUT", "/containers/abc/archive") => {
                s.file = crate::tar::first_file(&r.body).unwrap();
                (200, Vec::new())
            }
            ("POST", "/containers/abc/kill") => {
                s.kills += 1;
                let line = if s.kills == 1 {
                    "[ALERT]    (1) : config : parsing [/etc/ccm-lb/haproxy.cfg:3] : unknown keyword\n[WARNING]  (1) : Loading failure!\n"
                } else {
                    "[NOTICE]   (1) : Loading success.\n"
                };
                s.log.push_str(line);
                (204, Vec::new())
            }
            ("GET", "/containers/abc/logs") => (200, s.log.clone().into_bytes()),
            _ => (
                500,
                format!("unexpected {} {}", r.method, r.path).into_bytes(),
            ),
        }
    });
    let c = cloud(&engine);
    let lb = c.load_balancer().unwrap();
    let ctx = CallContext::background();
    let e = lb
        .update_load_balancer(&ctx, "k", &service(), &nodes())
        .unwrap_err();
    assert!(
        e.message()
            .contains("haproxy refused the new configuration and keeps the previous one"),
        "{e}"
    );
    assert!(e.message().contains("unknown keyword"), "{e}");
    // The file in the container is the new one, but haproxy did not load it: reloaded again.
    lb.update_load_balancer(&ctx, "k", &service(), &nodes())
        .unwrap();
    assert_eq!(state.lock().unwrap().kills, 2);
    // Loaded and unchanged: no reload.
    lb.update_load_balancer(&ctx, "k", &service(), &nodes())
        .unwrap();
    assert_eq!(state.lock().unwrap().kills, 2);
    assert_eq!(
        lb.load_balancer_hosts(&ctx, "k", &service()).unwrap(),
        Some(vec!["kind-worker".to_string(), "kind-worker2".to_string()])
    );
    let status = lb
        .get_load_balancer(&ctx, "k", &service())
        .unwrap()
        .unwrap();
    assert_eq!(status.ingress.unwrap()[0].ip.as_deref(), Some("10.89.0.9"));
}

#[test]
fn only_the_exact_name_is_a_node() {
    // The Engine API finds containers by a prefix of their ID too: that is not the node.
    let engine = FakeEngine::start(|_| {
        (
            200,
            json_body(json!({
                "Id": "kind-worker0123", "Name": "/kind-control-plane",
                "State": {"Status": "running", "Running": true},
                "Config": {"Image": "kindest/node", "Labels": {"io.x-k8s.kind.cluster": "kind"}},
                "NetworkSettings": {"Networks": {"kind": {"IPAddress": "10.89.0.2"}}},
            })),
        )
    });
    let c = cloud(&engine);
    let ctx = CallContext::background();
    let i = c.instances_v2().unwrap();
    assert!(!i.instance_exists(&ctx, &nodes()[0]).unwrap());
    let e = i.instance_metadata(&ctx, &nodes()[0]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::INSTANCE_NOT_FOUND);
    let named: Node =
        serde_json::from_value(json!({"metadata": {"name": "kind-control-plane"}})).unwrap();
    let md = i.instance_metadata(&ctx, &named).unwrap().unwrap();
    assert_eq!(md.provider_id, "kind://kind/kind/kind-control-plane");
    assert_eq!(md.instance_type, "kindest-node");
}
