//! Benchmarks of the `aws` provider against moto (ignored; they assert only correctness and
//! print `BENCH aws_<name> key=value ...` lines). Run them with
//!
//! ```sh
//! cargo test --release -p ccm-provider-aws --test bench_moto -- --ignored --nocapture --test-threads 1
//! ```
//!
//! - `aws_node_init`: `BENCH_AWS_NODES` (500) instances in moto, as many tainted Nodes; the
//!   cloud-node controller (default 64 workers) initialises them through the plugin's `.so` (in
//!   bulk lookups when the host batches them). Then, with the provider built in-process, the same
//!   nodes one `InstanceMetadata` each (64 at a time: no bulk lookups), and all of them in one
//!   ABI 1.1 `instances_batch` (metadata + existence). AWS calls counted by the proxy in front
//!   of moto.
//! - `aws_load_balancers`: `BENCH_AWS_SERVICES` (50) LoadBalancer Services (one port each) on
//!   `BENCH_AWS_LB_NODES` (10) nodes, the service controller with `BENCH_AWS_SERVICE_WORKERS`
//!   (1, upstream's default) workers: time until every Service has its NLB hostname, AWS calls
//!   per Service; then every Service deleted: time until no tagged resource is left, calls per
//!   Service.

mod support;

use std::time::{Duration, Instant};

use ccm_host::controllers::{node, service, ControllerConfig};
use ccm_provider_abi::ext::InstanceQuery;
use ccm_provider_aws::api::Params;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;
use support::*;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored"]
async fn aws_node_init() {
    let n = env_usize("BENCH_AWS_NODES", 500);
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let mut instances = Vec::new();
    while instances.len() < n {
        let batch = (n - instances.len()).min(100);
        instances.extend(
            run_instances(&env.api, &env.cloud, batch, instances.len() % 2, "m5.large").await,
        );
    }
    let names: Vec<String> = instances
        .iter()
        .map(|i| env.seed_node(i, true, json!({})))
        .collect();
    let ctx = env.context(ControllerConfig {
        cluster_name: CLUSTER.into(),
        node_status_update_frequency: Duration::from_secs(3600),
        ..Default::default()
    });
    assert!(ctx.nodes.wait_synced().await);
    env.proxy.clear_counts();
    let started = Instant::now();
    tokio::spawn(node::run(ctx.clone()));
    eventually("every node initialised", Duration::from_secs(600), || {
        let done = ctx
            .nodes
            .list()
            .iter()
            .filter(|node| {
                node.provider_id().is_some() && node.taints().iter().all(|t| t.key != UNINITIALIZED)
            })
            .count();
        (done == n).then_some(())
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let calls = env.proxy.total();
    let describe = env.proxy.count("DescribeInstances");
    println!(
        "BENCH aws_node_init nodes={n} path=controller secs={secs:.2} nodes_per_sec={:.0} aws_calls={calls} describe_instances={describe} calls_per_node={:.2}",
        n as f64 / secs,
        calls as f64 / n as f64
    );
    env.stop.cancel();

    // The same nodes answered by the provider built in-process.
    let nodes: Vec<Node> = names
        .iter()
        .map(|name| serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .collect();
    let cloud = std::sync::Arc::new(in_process(&env).await);

    // Without bulk lookups: one InstanceMetadata per node, 64 at a time (the host's default
    // worker count), as a host without ABI 1.1 batching calls it.
    env.proxy.clear_counts();
    let started = Instant::now();
    let limit = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut calls = Vec::new();
    for node in nodes.clone() {
        let (cloud, limit) = (cloud.clone(), limit.clone());
        calls.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await.unwrap();
            tokio::task::spawn_blocking(move || {
                use ccm_provider_abi::sdk::CloudProvider;
                cloud
                    .instances_v2()
                    .unwrap()
                    .instance_metadata(&ccm_provider_abi::CallContext::background(), &node)
                    .unwrap()
                    .is_some()
            })
            .await
            .unwrap()
        }));
    }
    for c in calls {
        assert!(c.await.unwrap());
    }
    let secs = started.elapsed().as_secs_f64();
    let calls = env.proxy.total();
    println!(
        "BENCH aws_node_init nodes={n} path=per_node secs={secs:.2} nodes_per_sec={:.0} aws_calls={calls} describe_instances={} calls_per_node={:.3}",
        n as f64 / secs,
        env.proxy.count("DescribeInstances"),
        calls as f64 / n as f64
    );

    env.proxy.clear_counts();
    let started = Instant::now();
    let bulk = cloud.clone();
    let answers = tokio::task::spawn_blocking(move || {
        use ccm_provider_abi::sdk::CloudProvider;
        bulk.bulk_instances()
            .unwrap()
            .instances_batch(
                &ccm_provider_abi::CallContext::background(),
                &nodes,
                InstanceQuery::METADATA.with(InstanceQuery::EXISTS),
            )
            .unwrap()
    })
    .await
    .unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert!(answers
        .iter()
        .all(|a| a.as_ref().is_ok_and(|s| s.exists && s.metadata.is_some())));
    // The in-process provider's config points at the same proxy.
    let calls = env.proxy.total();
    println!(
        "BENCH aws_node_init nodes={n} path=bulk secs={secs:.2} nodes_per_sec={:.0} aws_calls={calls} describe_instances={} calls_per_node={:.3}",
        n as f64 / secs,
        env.proxy.count("DescribeInstances"),
        calls as f64 / n as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: run with --ignored"]
async fn aws_load_balancers() {
    // `BENCH_AWS_LB_TYPES`: which load balancers, in order (classic: no type annotation, the
    // AWS CCM's default; nlb: `aws-load-balancer-type: nlb`).
    let kinds = std::env::var("BENCH_AWS_LB_TYPES").unwrap_or_else(|_| "classic,nlb".into());
    let moto = shared_moto();
    for kind in kinds.split(',').map(str::trim).filter(|k| !k.is_empty()) {
        moto.moto.reset();
        load_balancers(moto.moto, kind).await;
    }
}

async fn load_balancers(moto: &Moto, kind: &str) {
    let services_n = env_usize("BENCH_AWS_SERVICES", 50);
    let nodes_n = env_usize("BENCH_AWS_LB_NODES", 10);
    let workers = env_usize("BENCH_AWS_SERVICE_WORKERS", 1);
    let env = AwsEnv::start(moto).await;
    let annotations = if kind == "nlb" {
        json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"})
    } else {
        json!({})
    };
    let instances = run_instances(&env.api, &env.cloud, nodes_n, 0, "m5.large").await;
    for i in &instances {
        env.seed_node(
            i,
            true,
            json!({"spec": {"taints": [], "providerID": format!("aws:///{}/{}", i.zone, i.id)}}),
        );
    }
    let ctx = env.context(ControllerConfig {
        cluster_name: CLUSTER.into(),
        concurrent_service_syncs: workers,
        ..Default::default()
    });
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    let api = Api::<Service>::namespaced(env.client.clone(), "default");
    for k in 0..services_n {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": format!("svc-{k}"), "namespace": "default", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "selector": {"app": "x"},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30000 + k}]},
        }))
        .unwrap();
        api.create(&PostParams::default(), &svc).await.unwrap();
    }
    env.proxy.clear_counts();
    let started = Instant::now();
    tokio::spawn(service::run(ctx.clone()));
    eventually_async(
        "every Service has its load balancer",
        Duration::from_secs(900),
        || async {
            let list = api.list(&Default::default()).await.unwrap();
            let done = list
                .items
                .iter()
                .filter(|s| {
                    s.status
                        .as_ref()
                        .and_then(|s| s.load_balancer.as_ref())
                        .and_then(|l| l.ingress.as_ref())
                        .is_some_and(|i| !i.is_empty())
                })
                .count();
            (done == services_n).then_some(())
        },
    )
    .await;
    let secs = started.elapsed().as_secs_f64();
    let counts = env.proxy.counts();
    let calls: u64 = env.proxy.total();
    let detail: Vec<String> = counts
        .iter()
        .filter(|(k, _)| !k.starts_with('@'))
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    println!(
        "BENCH aws_load_balancers type={kind} phase=ensure services={services_n} nodes={nodes_n} workers={workers} secs={secs:.2} aws_calls={calls} calls_per_service={:.1} by_action={}",
        calls as f64 / services_n as f64,
        detail.join(",")
    );

    env.proxy.clear_counts();
    let started = Instant::now();
    for k in 0..services_n {
        api.delete(&format!("svc-{k}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually_async(
        "every Service and load balancer gone",
        Duration::from_secs(900),
        || async {
            let left = api.list(&Default::default()).await.unwrap().items.len();
            (left == 0).then_some(())
        },
    )
    .await;
    let secs = started.elapsed().as_secs_f64();
    let calls = env.proxy.total();
    let lbs = all(
        &elb(&env.api, "DescribeLoadBalancers", &[]).await,
        "LoadBalancerArn",
    );
    let tgs = env.api.all_target_groups().await.unwrap();
    let classic = all(
        &env.api
            .call(
                &env.api.elb.clone(),
                "DescribeLoadBalancers",
                &Params::new(),
            )
            .await
            .unwrap(),
        "LoadBalancerName",
    );
    let v = [env.cloud.vpc.clone()];
    let elb_groups: Vec<String> = env
        .api
        .describe_security_groups(&[("vpc-id", &v[..])])
        .await
        .unwrap()
        .into_iter()
        .filter(|g| g.name.starts_with("k8s-elb-"))
        .map(|g| g.id)
        .collect();
    assert!(
        lbs.is_empty() && tgs.is_empty() && classic.is_empty() && elb_groups.is_empty(),
        "leaked: {} NLBs, {} target groups, {} classic ELBs, {} ELB security groups",
        lbs.len(),
        tgs.len(),
        classic.len(),
        elb_groups.len()
    );
    let detail: Vec<String> = env
        .proxy
        .counts()
        .iter()
        .filter(|(k, _)| !k.starts_with('@'))
        .map(|(k, v)| format!("{k}:{v}"))
        .collect();
    println!(
        "BENCH aws_load_balancers type={kind} phase=delete by_action={} services={services_n} secs={secs:.2} aws_calls={calls} calls_per_service={:.1} leaked=0",
        detail.join(","),
        calls as f64 / services_n as f64
    );
}
