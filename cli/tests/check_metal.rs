//! `ccm-host check` as a real process on the metal provider: with an inventory that knows the
//! check nodes (one of them shut down, one dual-stack) and a small pool, every check passes
//! except the route checks (metal offers no Routes) and the host read-back (it has none); and
//! `ccm-host plugins --cloud-config` shows what metal offers (it needs a config to say).

mod support;

use support::BIN;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The plugins cargo built for this test run, in a directory the loader accepts.
fn plugin_dir(dir: &Path) -> PathBuf {
    support::plugin_dir_with(dir, &["libccm_provider_metal.so"])
}

const INVENTORY: &str = "\
machines:
  - {name: ccm-check-1, id: c1, instanceType: t1, zone: rack1, region: dc1,
     addresses: [{type: InternalIP, address: 10.0.0.1}]}
  - {name: ccm-check-2, id: c2, instanceType: t1, zone: rack1, region: dc1,
     addresses: [{type: InternalIP, address: 10.0.0.2}]}
  - {name: ccm-check-3, id: c3, instanceType: t1, zone: rack2, region: dc1,
     addresses: [{type: InternalIP, address: 10.0.0.3}, {type: InternalIP, address: 'fd00::3'}]}
  - {name: stopped-1, id: s1, state: shutdown, addresses: [{type: InternalIP, address: 10.0.0.9}]}
";

#[test]
fn metal_passes_every_check_but_the_route_ones() {
    let dir = tempfile::tempdir().unwrap();
    let inventory = dir.path().join("inventory.yaml");
    std::fs::write(&inventory, INVENTORY).unwrap();
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        format!(
            "inventory: {}\nloadBalancer:\n  pools:\n    - {{name: public, addresses: [192.0.2.0/28, '2001:db8::/124']}}\n",
            inventory.display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir.path()))
        .args(["--cloud-provider", "metal", "--cloud-config"])
        .arg(&config)
        .args(["--shutdown-node", "stopped-1", "-o", "json"])
        .env("RUST_LOG", "warn")
        .output()
        .expect("ccm-host runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not the JSON report ({e}):\n{stdout}\n{stderr}"));
    let checks: BTreeMap<String, (String, String)> = report["checks"]
        .as_array()
        .expect("checks array")
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                (
                    c["status"].as_str().unwrap().to_string(),
                    c["detail"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect();
    let skipped: Vec<&str> = checks
        .iter()
        .filter(|(_, (s, _))| s != "pass")
        .map(|(id, (s, _))| {
            assert_eq!(s, "skip", "{id}: {checks:#?}");
            id.as_str()
        })
        .collect();
    assert_eq!(
        skipped,
        vec![
            "instances-batch",
            "lb-hosts",
            "route-controller",
            "routes-round-trip"
        ]
    );
    // Metal hands out addresses only (the nodes announce them): it has no host read-back, and
    // the kit says why it cannot check the host set.
    assert!(
        checks["lb-hosts"]
            .1
            .starts_with("skipped (no host read-back: the provider does not implement LoadBalancer::load_balancer_hosts"),
        "{checks:#?}"
    );
    assert_eq!(report["subject"]["providerName"], "metal");
    assert!(
        checks["provider-id"].1.contains("metal://c1"),
        "{checks:#?}"
    );
    assert!(checks["zone-region"].1.contains("rack1/dc1"), "{checks:#?}");
    assert!(
        checks["instance-shutdown"]
            .1
            .contains("true for stopped node stopped-1"),
        "{checks:#?}"
    );
    assert!(checks["lb-ensure"].1.contains("192.0.2.1"), "{checks:#?}");
}

#[test]
fn plugins_shows_the_capabilities_of_a_provider_that_needs_a_cloud_config() {
    // metal's factory refuses to build without a config: `plugins` can only show what it offers
    // when given one (--cloud-config, here to metal only with --cloud-provider).
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.yaml");
    std::fs::write(
        &config,
        "loadBalancer:\n  pools:\n    - {name: public, addresses: [192.0.2.0/28]}\n",
    )
    .unwrap();
    let plugins = plugin_dir(dir.path());
    let listing = |extra: &[&str]| -> Value {
        let out = Command::new(BIN)
            .args(["plugins", "-o", "json", "--plugin-dir"])
            .arg(&plugins)
            .args(extra)
            .output()
            .expect("ccm-host runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["plugins"][0]["providers"][0].clone()
    };
    let without = listing(&[]);
    assert_eq!(without["capabilities"], Value::Null, "{without:#}");
    assert_eq!(without["withCloudConfig"], false);
    assert!(without["error"]
        .as_str()
        .unwrap()
        .contains("the metal provider needs a --cloud-config"));
    let config = config.display().to_string();
    let with = listing(&["--cloud-config", &config, "--cloud-provider", "metal"]);
    assert_eq!(with["withCloudConfig"], true, "{with:#}");
    assert_eq!(with["providerName"], "metal");
    assert_eq!(with["capabilities"]["loadBalancer"], true, "{with:#}");
    assert_eq!(with["capabilities"]["routes"], false);
    // A provider name no plugin registered is a usage error.
    let out = Command::new(BIN)
        .args(["plugins", "--plugin-dir"])
        .arg(&plugins)
        .args(["--cloud-config", &config, "--cloud-provider", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("error: --cloud-provider \"nope\": no plugin in the directory registered it"));
}
