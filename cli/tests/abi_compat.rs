//! ABI compatibility across minor versions: a provider plugin built against the released
//! ccm-provider-abi 1.0.0 (frozen sources in tests/fixtures/abi-1.0/) keeps loading and working
//! in this host, next to plugins built against the current version (docs/abi-1.1.md), and a
//! changed `--cloud-config` rebuilds it (a 1.0 plugin has no `reconfigure`).
//!
//! The fixture lives outside the workspace so that its interface crate really is 1.0.0; this
//! test builds it with cargo, its own lock file and its own target directory (the first run
//! compiles abi_stable and k8s-openapi once, about a minute on 2 cores).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube_apiserver_inmem::ApiServer;
use serde_json::{json, Value};
use support::{plugin_dir, wait_until, Replica, BIN};

/// Build the 1.0 fixture plugin and return the `.so`.
fn build_abi_1_0_plugin() -> PathBuf {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/abi-1.0/plugin/Cargo.toml");
    // target/debug/deps/<test> → target/
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let target_dir = target.join("abi-1.0-fixture");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--locked", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building the ABI 1.0 fixture failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = target_dir.join("debug/libccm_fixture_abi_1_0.so");
    assert!(so.is_file(), "{} was not built", so.display());
    so
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_built_against_abi_1_0_loads_and_works_next_to_1_1_plugins() {
    let legacy_so = build_abi_1_0_plugin();
    let dir = tempfile::tempdir().unwrap();
    // The current fake plugin (1.1) and the 1.0 fixture in one directory.
    let plugins = plugin_dir(dir.path());
    std::fs::copy(&legacy_so, plugins.join("libccm_fixture_abi_1_0.so")).unwrap();

    // `ccm-host plugins` lists both, each with the ABI it was built against.
    let out = Command::new(BIN)
        .args(["plugins", "-o", "json", "--plugin-dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["refused"], json!([]), "{listing:#}");
    let abi_of = |name: &str| {
        listing["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pluginName"] == name)
            .map(|p| p["abiVersion"].as_str().unwrap_or_default().to_string())
    };
    assert_eq!(abi_of("ccm-fixture-abi-1-0").as_deref(), Some("1.0.0"));
    assert_eq!(
        abi_of("ccm-provider-fake").as_deref(),
        Some(ccm_provider_abi::ABI_VERSION)
    );

    // The real daemon runs the 1.0 provider through the controllers.
    let server = ApiServer::start().await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let ctl = server.controls();
    let taint = json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]);
    for (name, ready) in [
        ("node-1", "True"),
        ("node-2", "True"),
        ("gone-3", "False"),
        ("throttled-4", "False"),
    ] {
        ctl.seed(json!({
            "apiVersion": "v1", "kind": "Node",
            // gone-3 and throttled-4 stay out of the load balancer's hosts: the ingress counts
            // the hosts, and gone-3 would be counted or not depending on whether the lifecycle
            // controller deleted it before the Service's first sync.
            "metadata": {"name": name, "labels": if ready == "False" {
                json!({"node.kubernetes.io/exclude-from-external-load-balancers": "true"})
            } else { json!({}) }},
            "spec": {"taints": if ready == "True" { taint.clone() } else { json!([]) },
                     "providerID": if ready == "True" { Value::Null } else { json!(format!("legacy://{name}")) }},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .unwrap();
    }
    ctl.seed(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]}
    }))
    .unwrap();
    // The 1.0 fixture's config is its instance type; reloaded by rebuilding (1.0: no reconfigure).
    let cloud_config = dir.path().join("legacy.conf");
    std::fs::write(&cloud_config, "legacy.small\n").unwrap();
    let args: Vec<String> = [
        "--plugin-dir",
        plugins.to_str().unwrap(),
        "--cloud-provider",
        "legacy",
        "--cloud-config",
        cloud_config.to_str().unwrap(),
        "--cloud-config-reload-period=100ms",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--secure-port",
        "0",
        "--leader-elect=false",
        "--configure-cloud-routes=false",
        "--node-monitor-period=1s",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let log = dir.path().join("legacy.log");
    let mut replica = Replica::start("legacy", &args, log.clone(), "info");
    let converged = || {
        let node = |n: &str| ctl.get("nodes", "", n);
        let initialised = node("node-1").is_some_and(|n| {
            n["spec"]["providerID"] == "legacy://node-1"
                && n["spec"]["taints"].as_array().is_none_or(|t| t.is_empty())
                && n["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "legacy.small"
                && n["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-a"
                && n["status"]["addresses"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a["address"] == "10.99.0.1"))
        }) && node("node-2")
            .is_some_and(|n| n["spec"]["providerID"] == "legacy://node-2");
        let deleted = node("gone-3").is_none();
        let ingress = ctl
            .get("services", "default", "web")
            .is_some_and(|s| s["status"]["loadBalancer"]["ingress"][0]["ip"] == "192.0.2.2");
        // Code 10 from a 1.0 plugin is an ordinary error, not ABI 1.1 throttling.
        let shutdown_error = std::fs::read_to_string(&log).is_ok_and(|l| {
            l.contains("error checking if node throttled-4 is shutdown: 429 Too Many Requests")
        });
        initialised && deleted && ingress && shutdown_error
    };
    let type_of = |n: &str| {
        ctl.get("nodes", "", n).and_then(|n| {
            n["metadata"]["labels"]["node.kubernetes.io/instance-type"]
                .as_str()
                .map(str::to_string)
        })
    };
    let seed_tainted = |name: &str| {
        ctl.seed(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"taints": taint.clone()}}),
        )
        .unwrap();
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio::task::block_in_place(|| {
            wait_until(
                "the 1.0 provider to initialise nodes, delete the gone one and ensure the LB",
                Duration::from_secs(60),
                converged,
            );
            // A new config: the 1.0 provider is rebuilt from its factory and swapped in.
            std::fs::write(&cloud_config, "legacy.large\n").unwrap();
            wait_until("the rebuild", Duration::from_secs(30), || {
                std::fs::read_to_string(&log).is_ok_and(|l| {
                    l.contains("cloud provider rebuilt from its factory and swapped in")
                })
            });
            seed_tainted("node-5");
            wait_until("node-5 initialised", Duration::from_secs(30), || {
                type_of("node-5").as_deref() == Some("legacy.large")
            });
            // A config its factory refuses: the rebuilt provider stays.
            std::fs::write(&cloud_config, "not one word\n").unwrap();
            wait_until("the refused reload", Duration::from_secs(30), || {
                std::fs::read_to_string(&log).is_ok_and(|l| {
                    l.contains("changed but cannot be applied")
                        && l.contains("the config is one instance type")
                })
            });
            seed_tainted("node-6");
            wait_until("node-6 initialised", Duration::from_secs(30), || {
                type_of("node-6").as_deref() == Some("legacy.large")
            });
        })
    }));
    replica.kill();
    if result.is_err() {
        panic!(
            "not converged; nodes: {:#}\nservice: {:#}\nhost log tail:\n{}",
            json!(ctl.list("nodes")),
            json!(ctl.get("services", "default", "web")),
            replica.facts.tail.join("\n")
        );
    }
    assert!(
        replica.facts.host_panics.is_empty(),
        "{:?}",
        replica.facts.host_panics
    );
    let throttled: Vec<Value> = ctl
        .list("events")
        .into_iter()
        .filter(|e| e["reason"] == "CloudProviderThrottled")
        .collect();
    assert!(
        throttled.is_empty(),
        "a 1.0 plugin cannot throttle: {throttled:#?}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !log.contains("pausing every call"),
        "no throttling pause for a 1.0 plugin"
    );
}
