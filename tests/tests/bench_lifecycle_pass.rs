//! Benchmark of issue 32 item 2: one cloud-node-lifecycle pass over many NotReady nodes (a
//! zone outage), on the bulk path (`InstancesBatch`) and on the per-node path (`InstanceExists`
//! and `InstanceShutdown` per node), with the fake provider's `.so` answering every call after
//! `BENCH_LIFECYCLE_LATENCY_MS` (50). `BENCH_LIFECYCLE_NOT_READY` (6,700) NotReady nodes and
//! `BENCH_LIFECYCLE_READY` (0) Ready ones; default controller settings (64 node-status workers).
//!
//! Ignored by default; prints `BENCH lifecycle_pass ...` lines and asserts only that every
//! NotReady node was asked about and none deleted. Run with:
//! `cargo test --release -p ccm-integration-tests --test bench_lifecycle_pass -- --ignored --nocapture`

use std::time::{Duration, Instant};

use ccm_host::controllers::node_lifecycle::{self, NodeMonitor};
use ccm_host::controllers::ControllerConfig;
use ccm_integration_tests::harness::{eventually, Harness};
use ccm_provider_fake::config::FakeConfig;
use serde_json::json;

fn env_num(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}: expected a number, got {v:?}")),
        Err(_) => default,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
async fn bench_lifecycle_pass() {
    let not_ready = env_num("BENCH_LIFECYCLE_NOT_READY", 6_700);
    let ready = env_num("BENCH_LIFECYCLE_READY", 0);
    let latency = env_num("BENCH_LIFECYCLE_LATENCY_MS", 50);
    for bulk in [true, false] {
        let config: FakeConfig = serde_json::from_value(json!({
            "providerName": "fake", "bulkInstances": bulk, "cloudStateFile": false,
            "latency": {"*": format!("{latency}ms")},
        }))
        .unwrap();
        let h = Harness::start("fake", config).await;
        let ctx = h.context(ControllerConfig::default());
        for i in 0..not_ready + ready {
            let status = if i < not_ready { "Unknown" } else { "True" };
            h.server
                .controls()
                .seed(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": format!("node-{i:05}")},
                    "spec": {"providerID": format!("fake://node-{i:05}")},
                    "status": {"conditions": [{"type": "Ready", "status": status}]},
                }))
                .unwrap();
        }
        assert!(ctx.nodes.wait_synced().await);
        eventually("nodes cached", Duration::from_secs(120), || {
            (ctx.nodes.list().len() == not_ready + ready).then_some(())
        })
        .await;
        let recorder = ctx.recorder(node_lifecycle::COMPONENT);
        h.clear_calls();
        let started = Instant::now();
        NodeMonitor::default().pass(&ctx, &recorder).await;
        let elapsed = started.elapsed();
        let calls = h.calls();
        let count = |name: &str| calls.iter().filter(|c| c.call == name).count();
        let (batches, exists, shutdown) = (
            count("instances-batch"),
            count("instance-exists"),
            count("instance-shutdown"),
        );
        let most_at_once = calls.iter().map(|c| c.delayed + 1).max().unwrap_or(0);
        if bulk {
            assert!(batches > 0, "the bulk path made InstancesBatch calls");
        } else {
            assert_eq!(exists, not_ready, "one InstanceExists per NotReady node");
            assert_eq!(
                shutdown, not_ready,
                "one InstanceShutdown per NotReady node"
            );
        }
        assert_eq!(
            h.server.controls().list("nodes").len(),
            not_ready + ready,
            "no node deleted"
        );
        println!(
            "BENCH lifecycle_pass path={} not_ready={not_ready} ready={ready} latency_ms={latency} \
             workers={} pass_seconds={:.2} instances_batch_calls={batches} instance_exists_calls={exists} \
             instance_shutdown_calls={shutdown} most_calls_at_once={most_at_once}",
            if bulk { "bulk" } else { "per-node" },
            ctx.config.node_status_workers(),
            elapsed.as_secs_f64(),
        );
    }
}
