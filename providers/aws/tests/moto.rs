//! The `aws` provider against a real moto server, through the host's loader and controllers:
//! node initialisation from EC2 instances, the lifecycle (stopped → shutdown taint, terminated →
//! Node deleted), NLBs for LoadBalancer Services (target groups and listeners per port,
//! targets following the nodes, deletion without leaks, foreign load balancers left alone,
//! invalid annotations), routes, wrong and rotated credentials, throttling.
//!
//! moto is started by `support` (installed by `.ci/run`); a missing moto fails these tests.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_host::controllers::node::NodeController;
use ccm_host::controllers::{node, node_lifecycle, route, service, ControllerConfig};
use ccm_provider_abi::ErrorKind;
use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::json;
use support::*;

const WAIT: Duration = Duration::from_secs(60);

fn cfg() -> ControllerConfig {
    ControllerConfig {
        cluster_name: CLUSTER.into(),
        node_status_update_frequency: Duration::from_secs(3600),
        node_monitor_period: Duration::from_millis(500),
        route_reconciliation_period: Duration::from_secs(1),
        ..Default::default()
    }
}

// ---- InstancesV2 --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_are_initialised_from_moto_instances() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let mut instances = run_instances(&env.api, &env.cloud, 2, 0, "m5.large").await;
    instances.extend(run_instances(&env.api, &env.cloud, 1, 1, "t3.small").await);
    let names: Vec<String> = instances.iter().map(|i| env.seed_node(i, true, json!({}))).collect();
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));

    for (i, name) in instances.iter().zip(&names) {
        let n = eventually(&format!("node {name} initialised"), WAIT, || {
            env.node(name).filter(|n| !taint_keys(n).contains(&UNINITIALIZED.to_string()))
        })
        .await;
        assert_eq!(n["spec"]["providerID"], format!("aws:///{}/{}", i.zone, i.id));
        let l = labels(&n);
        assert_eq!(l["node.kubernetes.io/instance-type"], i.instance_type);
        assert_eq!(l["topology.kubernetes.io/zone"], i.zone);
        assert_eq!(l["topology.kubernetes.io/region"], REGION);
        // moto's zone IDs for us-east-1a / 1b.
        let zone_id = if i.zone == "us-east-1a" { "use1-az6" } else { "use1-az1" };
        assert_eq!(l["topology.k8s.aws/zone-id"], zone_id);
        let private_ip = i.private_ip.clone().unwrap();
        let dns = i.private_dns.clone().unwrap();
        let mut want = vec![format!("InternalIP={private_ip}")];
        if let Some(public) = &i.public_ip {
            want.push(format!("ExternalIP={public}"));
        }
        want.push(format!("InternalDNS={dns}"));
        want.push(format!("Hostname={dns}"));
        if let Some(public) = &i.public_dns {
            want.push(format!("ExternalDNS={public}"));
        }
        assert_eq!(addresses(&n), want, "node {name}");
    }
    // Initialisation used DescribeInstances (by private DNS name) and one zone listing.
    assert_eq!(env.proxy.count("DescribeAvailabilityZones"), 1, "{:?}", env.proxy.counts());
    assert!(env.proxy.count("DescribeInstances") >= 3, "{:?}", env.proxy.counts());
}
