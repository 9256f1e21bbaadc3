//! Benchmark 4 of issue 10: the cost of the plugin boundary and of the host's call path, on the
//! same provider code (the fake cloud, no injected latency, no state directory):
//!
//! - `direct`: the fake's SDK trait (`InstancesV2::instance_metadata`) called on the rlib,
//!   in-process, with a parsed `Node` (what a statically linked provider would cost);
//! - `raw_abi`: the same method through the `.so`'s ABI-stable trait object, loaded with
//!   abi_stable as the host's loader does, with the node JSON prepared once (boundary + the
//!   SDK adapter's JSON parse + catch_unwind);
//! - `host_serialise`: the host's per-call preparation of that argument (the node to JSON);
//! - `provider`: the host's typed `Provider::instance_metadata` (serialisation, read
//!   coalescing, call pool, deadline, metrics) awaited one at a time;
//! - `wrapper`: `Provider::call` with a closure that does nothing (the host wrapper alone:
//!   spawn_blocking + deadline + metrics);
//! - `load`: plugin load time per `.so` (ELF checks, dlopen, ABI checks, registration), each
//!   load from a fresh copy so the dynamic loader cannot reuse a loaded image.
//!
//! Ignored by default; prints figures, asserts only that the calls answer. Run with:
//! `cargo test --release -p ccm-integration-tests --test bench_provider_calls -- --ignored --nocapture`
//! Environment: `BENCH_CALL_ITERS` (20000: calls per batch for the in-process paths; the
//! provider paths use a fifth of it), `BENCH_BATCHES` (7), `BENCH_LOADS` (10).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::{Provider, ProviderOptions};
use ccm_integration_tests::{libs, PluginDir};
use ccm_provider_abi::abi::{
    AbiLogger, AbiRegistrar, AbiResult, LoggerBox, PluginModule_Ref, ProviderFactoryBox,
    RegistrarBox,
};
use ccm_provider_abi::abi_stable::library::lib_header_from_path;
use ccm_provider_abi::abi_stable::sabi_trait::TD_Opaque;
use ccm_provider_abi::abi_stable::std_types::{RNone, ROk, RResult, RStr, RString};
use ccm_provider_abi::prelude::CloudProvider;
use ccm_provider_abi::CallContext;
use ccm_provider_fake::{FakeCloud, FakeConfig, Flavour};
use k8s_openapi::api::core::v1::Node;
use serde_json::json;

fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{name}: expected a positive number, got {v:?}")),
        Err(_) => default,
    }
}

/// A node like kubelet reports it: labels, addresses, capacity, conditions, node info.
fn sample_node() -> Node {
    let conditions: Vec<_> = [
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "NetworkUnavailable",
    ]
    .iter()
    .map(|t| json!({"type": t, "status": "False", "reason": "KubeletHasSufficient", "message": "ok",
                     "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}))
    .chain(std::iter::once(json!({"type": "Ready", "status": "True", "reason": "KubeletReady",
        "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2026-01-01T00:00:00Z"})))
    .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-00042", "uid": "0b6f1d9e-4a3c-4d5e-9f00-000000000042",
                     "resourceVersion": "123456",
                     "labels": {"kubernetes.io/hostname": "node-00042", "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "fake.medium",
                                "topology.kubernetes.io/zone": "fake-zone-a", "topology.kubernetes.io/region": "fake-region-1"},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                     "volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        "spec": {"providerID": "fake://node-00042", "podCIDR": "10.244.42.0/24", "podCIDRs": ["10.244.42.0/24"]},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "10.0.0.42"}, {"type": "Hostname", "address": "node-00042"}],
            "capacity": {"cpu": "8", "memory": "32859496Ki", "pods": "110", "ephemeral-storage": "101430960Ki"},
            "allocatable": {"cpu": "7910m", "memory": "31708520Ki", "pods": "110", "ephemeral-storage": "93478772582"},
            "conditions": conditions,
            "nodeInfo": {"machineID": "ec2a", "systemUUID": "ec2a", "bootID": "b00t", "kernelVersion": "6.1.0",
                         "osImage": "Debian GNU/Linux 12", "containerRuntimeVersion": "containerd://1.7.0",
                         "kubeletVersion": "v1.35.0", "kubeProxyVersion": "v1.35.0",
                         "operatingSystem": "linux", "architecture": "amd64"},
        },
    }))
    .expect("sample node")
}

/// Median of `batches` timings of `iters` calls of `f`, in nanoseconds per call.
fn median_ns(batches: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    // Warm-up.
    for _ in 0..iters.min(1000) {
        f();
    }
    let mut per_call: Vec<f64> = (0..batches)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

async fn median_ns_async<F, Fut>(batches: usize, iters: usize, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..iters.min(500) {
        f().await;
    }
    let mut per_call = Vec::with_capacity(batches);
    for _ in 0..batches {
        let t = Instant::now();
        for _ in 0..iters {
            f().await;
        }
        per_call.push(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    per_call.sort_by(f64::total_cmp);
    per_call[per_call.len() / 2]
}

// ---- a minimal host side of the registrar, for the raw ABI path ------------------------------

type Registered = Arc<Mutex<Vec<(String, ProviderFactoryBox)>>>;

struct BenchRegistrar {
    path: String,
    registered: Registered,
}

struct SilentLogger;

impl AbiLogger for SilentLogger {
    fn log(&self, _level: u8, _target: RStr<'_>, _message: RStr<'_>) {}
}

impl AbiRegistrar for BenchRegistrar {
    fn plugin_path(&self) -> RString {
        self.path.clone().into()
    }

    fn max_log_level(&self) -> u8 {
        ccm_provider_abi::abi::log_level::OFF
    }

    fn logger(&self) -> LoggerBox {
        LoggerBox::from_value(SilentLogger, TD_Opaque)
    }

    fn register_provider(&mut self, name: RStr<'_>, factory: ProviderFactoryBox) -> AbiResult<()> {
        self.registered
            .lock()
            .unwrap()
            .push((name.to_string(), factory));
        ROk(())
    }
}

/// The `fake` factory of the `.so` at `path`, loaded with abi_stable (no host wrapper).
fn raw_fake_factory(path: &Path) -> ProviderFactoryBox {
    let header = lib_header_from_path(path).expect("fake .so loads");
    let module = header
        .init_root_module::<PluginModule_Ref>()
        .expect("fake root module");
    let registered = Registered::default();
    let registrar = RegistrarBox::from_value(
        BenchRegistrar {
            path: path.display().to_string(),
            registered: registered.clone(),
        },
        TD_Opaque,
    );
    (module.register())(registrar)
        .into_result()
        .expect("fake registers");
    let mut list = std::mem::take(&mut *registered.lock().unwrap());
    let idx = list
        .iter()
        .position(|(n, _)| n == ccm_provider_fake::FAKE)
        .expect("fake registered");
    list.swap_remove(idx).1
}

fn registry_provider(dir: &PluginDir) -> Provider {
    let registry =
        PluginRegistry::load_dirs(&[dir.path().to_path_buf()], &LoaderOptions::default())
            .expect("plugin dir loads");
    assert!(registry.refused().is_empty(), "{:?}", registry.refused());
    registry
        .create("fake", Some(b"{}"), &ProviderOptions::default())
        .expect("fake provider")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture (see bench/run.sh)"]
async fn bench_provider_calls() {
    let iters = env_num("BENCH_CALL_ITERS", 20_000);
    let batches = env_num("BENCH_BATCHES", 7);
    let loads = env_num("BENCH_LOADS", 10);
    let node = sample_node();
    let node_json = serde_json::to_string(&node).unwrap();
    println!(
        "provider call overhead: InstanceMetadata on a {}-byte node, {batches} batches of {iters} \
         (host paths: {}) calls, median batch",
        node_json.len(),
        iters / 5
    );

    // direct: the SDK trait on the rlib.
    let cloud =
        FakeCloud::from_config("fake", Flavour::Fake, FakeConfig::default()).expect("fake cloud");
    let v2 = CloudProvider::instances_v2(&cloud).expect("InstancesV2");
    let ctx = CallContext::new(None);
    assert!(v2.instance_metadata(&ctx, &node).unwrap().is_some());
    let direct = median_ns(batches, iters, || {
        let md = v2.instance_metadata(&ctx, &node).unwrap();
        std::hint::black_box(md);
    });

    // raw ABI: the .so's trait object, JSON prepared once.
    let dir = PluginDir::new();
    let so = dir.add(libs::FAKE, "libccm_bench_raw.so");
    let factory = raw_fake_factory(&so);
    let raw_cloud = factory
        .create(RNone)
        .into_result()
        .expect("fake from the .so");
    let raw_v2 = raw_cloud.instances_v2().into_option().expect("InstancesV2");
    let json_arg = RStr::from_str(&node_json);
    assert!(matches!(
        raw_v2.instance_metadata(&ctx, json_arg),
        RResult::ROk(ccm_provider_abi::abi_stable::std_types::RSome(_))
    ));
    let raw_abi = median_ns(batches, iters, || {
        let md = raw_v2.instance_metadata(&ctx, json_arg);
        std::hint::black_box(md);
    });
    let serialise = median_ns(batches, iters, || {
        std::hint::black_box(serde_json::to_string(&node).unwrap());
    });

    // The host's typed call through the real loader and `Provider`.
    let plugins = PluginDir::new().with(libs::FAKE, "libccm_provider_fake.so");
    let provider = registry_provider(&plugins);
    assert!(provider.instance_metadata(&node).await.unwrap().is_some());
    let host_iters = (iters / 5).max(1);
    let typed = median_ns_async(batches, host_iters, || async {
        let md = provider.instance_metadata(&node).await.unwrap();
        std::hint::black_box(md);
    })
    .await;
    let wrapper = median_ns_async(batches, host_iters, || async {
        provider
            .call("BenchNoop", |_ctx| ROk(()))
            .await
            .expect("no-op call");
    })
    .await;

    let us = |ns: f64| ns / 1000.0;
    println!(
        "BENCH provider_calls node_json_bytes={} direct_us={:.2} raw_abi_us={:.2} \
         host_serialise_us={:.2} provider_us={:.2} wrapper_us={:.2} abi_over_direct_us={:.2} \
         provider_over_raw_abi_us={:.2}",
        node_json.len(),
        us(direct),
        us(raw_abi),
        us(serialise),
        us(typed),
        us(wrapper),
        us(raw_abi - direct),
        us(typed - raw_abi),
    );

    // Plugin load time per .so, each from a fresh copy.
    for (lib, label) in [
        (libs::FAKE, "fake"),
        (libs::METAL, "metal"),
        (libs::EXAMPLE, "example"),
    ] {
        let size = std::fs::metadata(ccm_integration_tests::built_plugin(lib))
            .map(|m| m.len())
            .unwrap_or(0);
        // A plugin crate that is still a work in progress may not load yet: say so, go on.
        let probe = PluginDir::new();
        probe.add(lib, &format!("libbench_{label}_probe.so"));
        let registry =
            PluginRegistry::load_dirs(&[probe.path().to_path_buf()], &LoaderOptions::default())
                .expect("plugin dir loads");
        if let Some(refused) = registry.refused().first() {
            println!(
                "plugin_load plugin={label} skipped: refused by the loader: {}",
                refused.refusal
            );
            continue;
        }
        let mut times: Vec<Duration> = Vec::with_capacity(loads);
        for i in 0..loads {
            let dir = PluginDir::new();
            dir.add(lib, &format!("libbench_{label}_{i}.so"));
            let t = Instant::now();
            let registry =
                PluginRegistry::load_dirs(&[dir.path().to_path_buf()], &LoaderOptions::default())
                    .expect("plugin dir loads");
            times.push(t.elapsed());
            assert!(
                registry.refused().is_empty() && registry.plugins().len() == 1,
                "{label}: {:?}",
                registry.refused()
            );
        }
        times.sort();
        println!(
            "BENCH plugin_load plugin={label} so_bytes={size} median_ms={:.3} min_ms={:.3} max_ms={:.3}",
            times[times.len() / 2].as_secs_f64() * 1000.0,
            times[0].as_secs_f64() * 1000.0,
            times[times.len() - 1].as_secs_f64() * 1000.0,
        );
    }
}
