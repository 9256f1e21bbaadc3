//! The `aws` provider against a real moto server, through the host's loader and controllers:
//! node initialisation from EC2 instances, the lifecycle (stopped → shutdown taint, terminated →
//! Node deleted), NLBs for LoadBalancer Services (target groups and listeners per port,
//! targets following the nodes, deletion without leaks, foreign load balancers left alone,
//! unknown and invalid annotations, adoption of what the AWS CCM made, the nodes'
//! security-group rules), classic ELBs (the default: listeners, health check, attributes,
//! policies, the per-ELB security group and the nodes' rule, annotated and configured groups,
//! adoption of a boto3 set-up written from the AWS CCM's code, a refused type change), an
//! invalid value blocking only its own change, ABI 1.2 incremental host updates, routes, wrong
//! and rotated credentials, throttling, deadlines.
//!
//! moto is started by `support` (installed by `.ci/run`); a missing moto fails these tests.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use ccm_host::controllers::{node, node_lifecycle, route, service, ControllerConfig};
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
    let names: Vec<String> = instances
        .iter()
        .map(|i| env.seed_node(i, true, json!({})))
        .collect();
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));

    for (i, name) in instances.iter().zip(&names) {
        let n = eventually(&format!("node {name} initialised"), WAIT, || {
            env.node(name).filter(|n| {
                !taint_keys(n).contains(&UNINITIALIZED.to_string()) && !addresses(n).is_empty()
            })
        })
        .await;
        assert_eq!(
            n["spec"]["providerID"],
            format!("aws:///{}/{}", i.zone, i.id)
        );
        let l = labels(&n);
        assert_eq!(l["node.kubernetes.io/instance-type"], i.instance_type);
        assert_eq!(l["topology.kubernetes.io/zone"], i.zone);
        assert_eq!(l["topology.kubernetes.io/region"], REGION);
        // moto's zone IDs for us-east-1a / 1b.
        let zone_id = if i.zone == "us-east-1a" {
            "use1-az6"
        } else {
            "use1-az1"
        };
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
    assert_eq!(
        env.proxy.count("DescribeAvailabilityZones"),
        1,
        "{:?}",
        env.proxy.counts()
    );
    // At most one DescribeInstances per node; one for all three when the host batches them
    // (ABI 1.1 bulk lookups).
    let lookups = env.proxy.count("DescribeInstances");
    assert!((1..=3).contains(&lookups), "{:?}", env.proxy.counts());
}

// ---- Node lifecycle ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_is_tainted_and_a_terminated_one_deletes_its_node() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 3, 0, "m5.large").await;
    // Initialised nodes that are NotReady (the lifecycle controller looks only at those).
    let names: Vec<String> = instances
        .iter()
        .map(|i| {
            env.seed_node(
                i,
                false,
                json!({"spec": {"taints": [], "providerID": format!("aws:///{}/{}", i.zone, i.id)}}),
            )
        })
        .collect();
    ec2(
        &env.api,
        "StopInstances",
        &[("InstanceId.1", &instances[0].id)],
    )
    .await;
    ec2(
        &env.api,
        "TerminateInstances",
        &[("InstanceId.1", &instances[1].id)],
    )
    .await;
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node_lifecycle::run(ctx.clone()));

    let stopped = eventually(
        "shutdown taint on the stopped instance's node",
        WAIT,
        || {
            env.node(&names[0])
                .filter(|n| taint_keys(n).contains(&SHUTDOWN_TAINT.to_string()))
        },
    )
    .await;
    assert!(stopped["spec"]["providerID"]
        .as_str()
        .unwrap()
        .ends_with(&instances[0].id));
    eventually("the terminated instance's node deleted", WAIT, || {
        env.node(&names[1]).is_none().then_some(())
    })
    .await;
    // The running one stays, untainted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let running = env
        .node(&names[2])
        .expect("the running instance's node stays");
    assert!(taint_keys(&running).is_empty(), "{running}");
    assert!(
        env.node(&names[0]).is_some(),
        "a stopped instance still exists"
    );
}

// ---- Load balancers ---------------------------------------------------------------------------

/// A LoadBalancer Service with a TCP and a UDP port, an NLB (`aws-load-balancer-type: nlb`
/// unless `annotations` give another type).
fn lb_service(
    name: &str,
    mut annotations: serde_json::Value,
    extra_spec: serde_json::Value,
) -> Service {
    annotations
        .as_object_mut()
        .expect("annotations are an object")
        .entry("service.beta.kubernetes.io/aws-load-balancer-type")
        .or_insert(json!("nlb"));
    let mut s = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080},
                {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP", "nodePort": 30053},
            ],
        },
    });
    merge(&mut s, json!({"spec": extra_spec}));
    serde_json::from_value(s).unwrap()
}

/// Initialised, Ready nodes for `instances`.
fn ready_nodes(env: &AwsEnv, instances: &[ccm_provider_aws::api::ec2::Instance]) -> Vec<String> {
    instances
        .iter()
        .map(|i| {
            env.seed_node(
                i,
                true,
                json!({"spec": {"taints": [], "providerID": format!("aws:///{}/{}", i.zone, i.id)}}),
            )
        })
        .collect()
}

/// Wait until the targets of `arn` are exactly `want`.
async fn wait_targets(env: &AwsEnv, arn: &str, want: &BTreeSet<String>, what: &str) {
    let started = std::time::Instant::now();
    loop {
        let now: BTreeSet<String> = env
            .api
            .targets_of(arn)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        if now == *want {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "timed out waiting for: {what} (targets {now:?}, want {want:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn lb_name_of(svc: &Service) -> String {
    ccm_provider_aws::annotations::load_balancer_name(svc)
}

async fn stored_service(env: &AwsEnv, name: &str) -> Service {
    Api::<Service>::namespaced(env.client.clone(), "default")
        .get(name)
        .await
        .expect("service stored")
}

fn ingress_hostname(svc: &Service) -> Option<String> {
    svc.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .hostname
        .clone()
}

/// `(load balancers, target groups)` of the account that carry the cluster's tag.
async fn tagged_resources(env: &AwsEnv) -> (Vec<String>, Vec<String>) {
    let lbs = all(
        &elb(&env.api, "DescribeLoadBalancers", &[]).await,
        "LoadBalancerArn",
    );
    let tgs: Vec<String> = env
        .api
        .all_target_groups()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.arn)
        .collect();
    let arns: Vec<String> = lbs.iter().chain(&tgs).cloned().collect();
    let tags = env.api.describe_tags(&arns).await.unwrap();
    let key = format!("kubernetes.io/cluster/{CLUSTER}");
    let tagged = |a: &String| tags.get(a).is_some_and(|t| t.contains_key(&key));
    (
        lbs.iter().filter(|a| tagged(a)).cloned().collect(),
        tgs.iter().filter(|a| tagged(a)).cloned().collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_becomes_an_nlb_that_follows_the_nodes_and_leaves_nothing_behind() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let mut instances = run_instances(&env.api, &env.cloud, 2, 0, "m5.large").await;
    instances.extend(run_instances(&env.api, &env.cloud, 1, 1, "m5.large").await);
    let names = ready_nodes(&env, &instances);
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("web", json!({"service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags": "team=shop"}), json!({})),
        )
        .await
        .unwrap();

    let hostname = eventually_async("the Service's ingress hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "web").await)
    })
    .await;
    let svc = stored_service(&env, "web").await;
    let lb = env
        .api
        .describe_load_balancer(&lb_name_of(&svc))
        .await
        .unwrap()
        .expect("the NLB exists");
    assert_eq!(lb.dns_name, hostname);
    assert_eq!(lb.lb_type, "network");
    assert_eq!(lb.scheme, "internet-facing");
    assert_eq!(lb.vpc_id, env.cloud.vpc);
    let mut zones: Vec<String> = lb.zones.iter().map(|(z, _)| z.clone()).collect();
    zones.sort();
    assert_eq!(zones, ZONES.to_vec(), "one subnet per zone");

    // One listener and one target group per port: instance targets on the NodePort, TCP
    // health checks on the traffic port, ownership tags everywhere.
    let listeners = env.api.listeners_of(&lb.arn).await.unwrap();
    let mut ports: Vec<(u16, String)> = listeners
        .iter()
        .map(|l| (l.port, l.protocol.clone()))
        .collect();
    ports.sort();
    assert_eq!(
        ports,
        vec![(53, "UDP".to_string()), (80, "TCP".to_string())]
    );
    let groups = env.api.target_groups_of(&lb.arn).await.unwrap();
    assert_eq!(groups.len(), 2);
    let ids: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
    for g in &groups {
        let l = listeners
            .iter()
            .find(|l| l.target_group_arn.as_deref() == Some(g.arn.as_str()))
            .expect("listener forwards to it");
        let node_port = if l.port == 80 { 30080 } else { 30053 };
        assert_eq!(g.port, node_port);
        assert_eq!(g.protocol, l.protocol);
        assert_eq!(g.hc_protocol, "TCP");
        assert_eq!(g.hc_port, "traffic-port");
        // The AWS CCM's defaultNlbHealthCheckInterval / Timeout / Threshold.
        assert_eq!(
            (
                g.hc_interval,
                g.hc_timeout,
                g.healthy_threshold,
                g.unhealthy_threshold
            ),
            (Some(30), Some(10), Some(3), Some(3))
        );
        let targets = env.api.targets_of(&g.arn).await.unwrap();
        assert_eq!(
            targets
                .iter()
                .map(|t| t.id.clone())
                .collect::<BTreeSet<_>>(),
            ids
        );
        assert!(targets.iter().all(|t| t.port == node_port));
    }
    let mut arns = vec![lb.arn.clone()];
    arns.extend(groups.iter().map(|g| g.arn.clone()));
    for (arn, tags) in env.api.describe_tags(&arns).await.unwrap() {
        assert_eq!(
            tags.get(&format!("kubernetes.io/cluster/{CLUSTER}"))
                .map(String::as_str),
            Some("owned"),
            "{arn}"
        );
        assert_eq!(
            tags.get("kubernetes.io/service-name").map(String::as_str),
            Some("default/web"),
            "{arn}"
        );
        assert_eq!(tags.get("team").map(String::as_str), Some("shop"), "{arn}");
    }
    // The host-set read-back (ABI 1.1 load_balancer_hosts; only `ccm-host check` calls it, so
    // here through the crate in-process, with the same config).
    let cloud = in_process(&env).await;
    let hosts = tokio::task::spawn_blocking(move || {
        use ccm_provider_abi::sdk::CloudProvider;
        cloud.load_balancer().unwrap().load_balancer_hosts(
            &ccm_provider_abi::CallContext::background(),
            CLUSTER,
            &svc,
        )
    })
    .await
    .unwrap()
    .unwrap()
    .expect("the NLB exists");
    let mut want_hosts = names.clone();
    want_hosts.sort();
    assert_eq!(hosts, want_hosts);

    // A new node becomes a target; a node that goes away stops being one.
    let more = run_instances(&env.api, &env.cloud, 1, 1, "m5.large").await;
    ready_nodes(&env, &more);
    let with_new: BTreeSet<String> = ids.iter().cloned().chain([more[0].id.clone()]).collect();
    for g in &groups {
        wait_targets(&env, &g.arn, &with_new, "the new node registered").await;
    }
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    let without: BTreeSet<String> = with_new
        .iter()
        .filter(|id| **id != instances[0].id)
        .cloned()
        .collect();
    for g in &groups {
        wait_targets(&env, &g.arn, &without, "the deleted node deregistered").await;
    }

    // A NodePort change: a new target group, the listener switched to it (ModifyListener,
    // which moto does not record in the group's LoadBalancerArns), the old group deleted.
    let mut changed = stored_service(&env, "web").await;
    for p in changed.spec.as_mut().unwrap().ports.as_mut().unwrap() {
        if p.port == 80 {
            p.node_port = Some(30081);
        }
    }
    services
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap();
    eventually_async(
        "the port 80 listener forwards to a group on 30081",
        WAIT,
        || async {
            let l = env.api.listeners_of(&lb.arn).await.unwrap();
            let arn = l.iter().find(|l| l.port == 80)?.target_group_arn.clone()?;
            let g = env.api.target_groups_by_arn(&[arn]).await.unwrap();
            (g.first()?.port == 30081).then_some(())
        },
    )
    .await;
    eventually_async("the old group deleted", WAIT, || async {
        let n = env.api.all_target_groups().await.unwrap().len();
        (n == 2).then_some(())
    })
    .await;

    // Deleting the Service deletes the NLB, its listeners and target groups.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the Service gone (finalizer removed)", WAIT, || async {
        services
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let (lbs, tgs) = tagged_resources(&env).await;
    assert!(lbs.is_empty() && tgs.is_empty(), "leaked: {lbs:?} {tgs:?}");
    assert!(env
        .api
        .describe_load_balancer(&lb.name)
        .await
        .unwrap()
        .is_none());
}

/// Events whose message contains `needle`.
fn events_with(env: &AwsEnv, needle: &str) -> Vec<serde_json::Value> {
    env.events()
        .into_iter()
        .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(needle)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_and_external_traffic_policy_local_shape_the_nlb() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 3, 0, "m5.large").await;
    let names = ready_nodes(&env, &instances);
    // Only two nodes carry the target label.
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone());
    for n in &names[..2] {
        nodes
            .patch(
                n,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {"role": "edge"}}})),
            )
            .await
            .unwrap();
    }
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let mut svc = lb_service(
        "edge",
        json!({
            "service.beta.kubernetes.io/aws-load-balancer-internal": "true",
            "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval": "30",
            "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout": "6",
            "service.beta.kubernetes.io/aws-load-balancer-target-node-labels": "role=edge",
            "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled": "true",
        }),
        json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}),
    );
    svc.spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .truncate(1);
    services.create(&PostParams::default(), &svc).await.unwrap();
    eventually_async("the Service's ingress hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "edge").await)
    })
    .await;
    let svc = stored_service(&env, "edge").await;
    let lb = env
        .api
        .describe_load_balancer(&lb_name_of(&svc))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lb.scheme, "internal");
    let groups = env.api.target_groups_of(&lb.arn).await.unwrap();
    assert_eq!(groups.len(), 1);
    let g = &groups[0];
    assert_eq!(
        (
            g.hc_protocol.as_str(),
            g.hc_port.as_str(),
            g.hc_path.as_deref(),
            g.hc_interval,
            g.hc_timeout
        ),
        ("HTTP", "32100", Some("/healthz"), Some(30), Some(6))
    );
    let want: BTreeSet<String> = instances[..2].iter().map(|i| i.id.clone()).collect();
    wait_targets(&env, &g.arn, &want, "only the labelled nodes are targets").await;
    let attrs = env.api.load_balancer_attributes(&lb.arn).await.unwrap();
    assert_eq!(
        attrs
            .get("load_balancing.cross_zone.enabled")
            .map(String::as_str),
        Some("true")
    );

    // A port added to the Service gets its listener and target group; a port removed loses
    // them (the group is deleted).
    let mut updated = svc.clone();
    updated.spec.as_mut().unwrap().ports = Some(vec![serde_json::from_value(
        json!({"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP", "nodePort": 30443}),
    )
    .unwrap()]);
    services
        .replace("edge", &PostParams::default(), &updated)
        .await
        .unwrap();
    eventually_async("the listener moves to port 443", WAIT, || async {
        let l = env.api.listeners_of(&lb.arn).await.unwrap();
        (l.len() == 1 && l[0].port == 443).then_some(())
    })
    .await;
    eventually_async("the old target group deleted", WAIT, || async {
        let groups = env.api.target_groups_of(&lb.arn).await.unwrap();
        (groups.len() == 1 && groups[0].port == 30443).then_some(())
    })
    .await;
    let all_groups = env.api.all_target_groups().await.unwrap();
    assert_eq!(
        all_groups.len(),
        1,
        "no orphan target group: {all_groups:?}"
    );
}

/// The target groups of the Service's NLB (through its listeners: moto's ModifyListener does
/// not update a group's `LoadBalancerArns`).
async fn groups_of_service(env: &AwsEnv, name: &str) -> Vec<String> {
    let svc = stored_service(env, name).await;
    let lb = env
        .api
        .describe_load_balancer(&lb_name_of(&svc))
        .await
        .unwrap()
        .expect("the NLB exists");
    let mut arns: Vec<String> = env
        .api
        .listeners_of(&lb.arn)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|l| l.target_group_arn)
        .collect();
    arns.sort();
    arns.dedup();
    arns
}

fn events_of(env: &AwsEnv, service: &str, reason: &str) -> Vec<serde_json::Value> {
    env.events()
        .into_iter()
        .filter(|e| e["involvedObject"]["name"] == service && e["reason"] == reason)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_annotations_are_ignored_and_invalid_values_never_stop_the_targets() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 4, 0, "m5.large").await;
    let names = ready_nodes(&env, &instances[..2]);
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let interval = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    let target_type = "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type";
    let proxy_protocol = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
    env.proxy.clear_counts();
    // Invalid from the start: no load balancer, a Warning naming the key and the value.
    services
        .create(
            &PostParams::default(),
            &lb_service("bad-interval", json!({interval: "soon"}), json!({})),
        )
        .await
        .unwrap();
    // An AWS Load Balancer Controller key and a classic-ELB key: ignored (one Warning).
    services
        .create(
            &PostParams::default(),
            &lb_service(
                "unknown",
                json!({target_type: "instance", proxy_protocol: "*"}),
                json!({}),
            ),
        )
        .await
        .unwrap();
    // Valid at first, an invalid value later.
    services
        .create(
            &PostParams::default(),
            &lb_service("later", json!({}), json!({})),
        )
        .await
        .unwrap();
    for name in ["unknown", "later"] {
        eventually_async(&format!("{name}'s ingress hostname"), WAIT, || async {
            ingress_hostname(&stored_service(&env, name).await)
        })
        .await;
    }
    let e = eventually(
        "a Warning event naming the interval annotation",
        WAIT,
        || events_with(&env, interval).into_iter().next(),
    )
    .await;
    assert_eq!(e["type"], "Warning");
    assert_eq!(e["involvedObject"]["name"], "bad-interval");
    assert!(e["message"].as_str().unwrap().contains("\"soon\""), "{e}");
    assert!(ingress_hostname(&stored_service(&env, "bad-interval").await).is_none());
    assert_eq!(
        env.proxy.count("CreateLoadBalancer"),
        2,
        "{:?}",
        env.proxy.counts()
    );

    services
        .patch(
            "later",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {interval: "often"}}})),
        )
        .await
        .unwrap();
    eventually(
        "a Warning event naming later's invalid interval",
        WAIT,
        || events_with(&env, "\"often\"").into_iter().next(),
    )
    .await;

    let mut groups = groups_of_service(&env, "unknown").await;
    groups.extend(groups_of_service(&env, "later").await);
    assert_eq!(groups.len(), 4);
    let ids = |idx: &[usize]| -> BTreeSet<String> {
        idx.iter().map(|i| instances[*i].id.clone()).collect()
    };
    for g in &groups {
        wait_targets(&env, g, &ids(&[0, 1]), "the first two nodes").await;
    }
    // Node churn: a node added, a node excluded, a node deleted.
    let added = ready_nodes(&env, &instances[2..3]);
    for g in &groups {
        wait_targets(&env, g, &ids(&[0, 1, 2]), "the added node registered").await;
    }
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone());
    nodes
        .patch(
            &names[0],
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"node.kubernetes.io/exclude-from-external-load-balancers": ""}}})),
        )
        .await
        .unwrap();
    for g in &groups {
        wait_targets(&env, g, &ids(&[1, 2]), "the excluded node deregistered").await;
    }
    nodes
        .delete(&names[1], &DeleteParams::default())
        .await
        .unwrap();
    for g in &groups {
        wait_targets(&env, g, &ids(&[2]), "the deleted node deregistered").await;
    }
    // A Ready node whose instance is stopped is never sent to RegisterTargets.
    ec2(
        &env.api,
        "StopInstances",
        &[("InstanceId.1", &instances[3].id)],
    )
    .await;
    ready_nodes(&env, &instances[3..4]);
    let excluded = added[0].clone();
    nodes
        .patch(
            &excluded,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"churn": "1"}}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    for g in &groups {
        wait_targets(&env, g, &ids(&[2]), "the stopped instance is no target").await;
    }
    assert_eq!(
        env.proxy.count("!InvalidTarget"),
        0,
        "no stopped instance sent: {:?}",
        env.proxy.counts()
    );

    // The ignored keys: one Warning for the Service, naming both, however often it synced.
    let warned = events_of(&env, "unknown", "IgnoredAnnotations");
    assert_eq!(warned.len(), 1, "{warned:?}");
    let m = warned[0]["message"].as_str().unwrap();
    assert!(m.contains(target_type) && m.contains(proxy_protocol), "{m}");
    assert_eq!(warned[0]["type"], "Warning");
    assert!(events_of(&env, "later", "IgnoredAnnotations").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_this_cluster_did_not_create_is_left_alone() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 1, 0, "m5.large").await;
    ready_nodes(&env, &instances);
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let created = services
        .create(
            &PostParams::default(),
            &lb_service("clash", json!({}), json!({})),
        )
        .await
        .unwrap();
    // Someone else's NLB already has the name this Service's load balancer would get.
    let name = lb_name_of(&created);
    let body = elb(
        &env.api,
        "CreateLoadBalancer",
        &[
            ("Name", &name),
            ("Type", "network"),
            ("Subnets.member.1", &env.cloud.subnets[0].1),
        ],
    )
    .await;
    let foreign_arn = first(&body, "LoadBalancerArn");

    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let e = eventually(
        "a Warning event about the foreign load balancer",
        WAIT,
        || events_with(&env, "was not created by").into_iter().next(),
    )
    .await;
    assert!(e["message"].as_str().unwrap().contains(&name), "{e}");
    assert!(
        env.api.listeners_of(&foreign_arn).await.unwrap().is_empty(),
        "nothing added to it"
    );
    assert!(
        env.api.all_target_groups().await.unwrap().is_empty(),
        "no target group created"
    );

    services
        .delete("clash", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the Service gone", WAIT, || async {
        services
            .get_opt("clash")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let lb = env.api.describe_load_balancer(&name).await.unwrap();
    assert_eq!(
        lb.map(|l| l.arn),
        Some(foreign_arn),
        "the foreign NLB is still there"
    );
}

// ---- Routes -----------------------------------------------------------------------------------

/// `destination → instance (or gateway)` of the route table.
async fn route_table(env: &AwsEnv) -> std::collections::BTreeMap<String, String> {
    let rtb = std::slice::from_ref(&env.cloud.route_table);
    let tables = env
        .api
        .describe_route_tables(&[("route-table-id", rtb)])
        .await
        .unwrap();
    tables[0]
        .routes
        .iter()
        .map(|r| {
            (
                r.destination.clone(),
                r.instance_id
                    .clone()
                    .or(r.gateway_id.clone())
                    .unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_are_created_for_pod_cidrs_and_removed_with_their_nodes() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 3, 0, "m5.large").await;
    let names: Vec<String> = instances
        .iter()
        .enumerate()
        .map(|(k, i)| {
            env.seed_node(
                i,
                true,
                json!({"spec": {"taints": [], "providerID": format!("aws:///{}/{}", i.zone, i.id), "podCIDR": format!("10.244.{k}.0/24"), "podCIDRs": [format!("10.244.{k}.0/24")]}}),
            )
        })
        .collect();
    // A route to an instance that is then terminated (AWS: blackhole; moto keeps it active),
    // and a gateway route inside the cluster CIDR that is not the provider's to touch.
    let gone = run_instances(&env.api, &env.cloud, 1, 0, "m5.large").await;
    let rtb = env.cloud.route_table.clone();
    ec2(
        &env.api,
        "CreateRoute",
        &[
            ("RouteTableId", &rtb),
            ("DestinationCidrBlock", "10.244.99.0/24"),
            ("InstanceId", &gone[0].id),
        ],
    )
    .await;
    ec2(
        &env.api,
        "TerminateInstances",
        &[("InstanceId.1", &gone[0].id)],
    )
    .await;
    let igw = route_table(&env).await["0.0.0.0/0"].clone();
    ec2(
        &env.api,
        "CreateRoute",
        &[
            ("RouteTableId", &rtb),
            ("DestinationCidrBlock", "10.244.200.0/24"),
            ("GatewayId", &igw),
        ],
    )
    .await;

    let listed = env.provider.list_routes(CLUSTER).await.unwrap();
    assert_eq!(
        listed.len(),
        1,
        "only instance routes and blackholes are reported: {listed:?}"
    );
    assert!(
        listed[0].blackhole && listed[0].destination_cidr == "10.244.99.0/24",
        "{listed:?}"
    );

    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    let cidrs = route::parse_cluster_cidrs("10.244.0.0/16").unwrap();
    tokio::spawn(route::run(ctx.clone(), cidrs));
    let want: std::collections::BTreeMap<String, String> = instances
        .iter()
        .enumerate()
        .map(|(k, i)| (format!("10.244.{k}.0/24"), i.id.clone()))
        .chain([("10.244.200.0/24".to_string(), igw.clone())])
        .collect();
    eventually_async(
        "a route per pod CIDR, the blackhole gone, the gateway route kept",
        WAIT,
        || async {
            let t = route_table(&env).await;
            let in_cluster: std::collections::BTreeMap<String, String> = t
                .into_iter()
                .filter(|(d, _)| d.starts_with("10.244."))
                .collect();
            (in_cluster == want).then_some(())
        },
    )
    .await;
    // Source/destination checks are off on the routed instances.
    for i in &instances {
        let body = ec2(
            &env.api,
            "DescribeInstanceAttribute",
            &[("InstanceId", &i.id), ("Attribute", "sourceDestCheck")],
        )
        .await;
        assert_eq!(first(&body, "value"), "false", "{}", i.id);
    }
    let listed = env.provider.list_routes(CLUSTER).await.unwrap();
    let mut targets: Vec<String> = listed.iter().map(|r| r.target_node.clone()).collect();
    targets.sort();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(targets, sorted);
    assert!(listed.iter().all(|r| !r.blackhole));

    // A deleted node's route goes.
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the deleted node's route removed", WAIT, || async {
        (!route_table(&env).await.contains_key("10.244.0.0/24")).then_some(())
    })
    .await;
    assert_eq!(route_table(&env).await.get("10.244.200.0/24"), Some(&igw));
}

// ---- Credentials ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_error_and_delete_no_node_and_rotated_keys_are_picked_up() {
    let (moto, key, secret) = moto_with_iam().await;
    let real = client_for(&moto.url(), &key, &secret);
    let cloud = make_cloud(&real).await;
    let instances = run_instances(&real, &cloud, 2, 0, "m5.large").await;
    let env = AwsEnv::on_cloud(
        &moto,
        real,
        cloud,
        EnvOptions {
            key: ("AKIDNOTAREALKEY00000".into(), "wrong".into()),
            ..Default::default()
        },
    )
    .await;
    // One node to initialise, one initialised node that is NotReady (a lifecycle candidate).
    let fresh = env.seed_node(&instances[0], true, json!({}));
    let known = env.seed_node(
        &instances[1],
        false,
        json!({"spec": {"taints": [], "providerID": format!("aws:///{}/{}", instances[1].zone, instances[1].id)}}),
    );
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(env.node(&known).unwrap()).unwrap();
    let e = env.provider.instance_exists(&node).await.unwrap_err();
    assert_eq!(e.kind(), ccm_provider_abi::ErrorKind::UNAUTHORIZED, "{e:?}");
    assert!(
        e.message().contains("ec2 DescribeInstances") && e.message().contains("(HTTP 4"),
        "the message names the call and AWS's answer: {e}"
    );

    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));
    tokio::spawn(node_lifecycle::run(ctx.clone()));
    // Several lifecycle passes (every 500 ms) and node syncs with the wrong key.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        env.node(&known).is_some(),
        "rejected credentials never delete a Node"
    );
    assert!(taint_keys(&env.node(&fresh).unwrap()).contains(&UNINITIALIZED.to_string()));

    // The key is rotated on disk: the next calls use it.
    write_credentials(&env.credentials_path(), &key, &secret);
    eventually(
        "the fresh node initialised with the rotated key",
        WAIT,
        || {
            env.node(&fresh)
                .filter(|n| !taint_keys(n).contains(&UNINITIALIZED.to_string()))
        },
    )
    .await;
    assert!(env.provider.instance_exists(&node).await.unwrap());
    assert!(env.node(&known).is_some());
}

// ---- Throttling -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_pauses_the_host_and_everything_converges() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 4, 0, "m5.large").await;
    let names: Vec<String> = instances
        .iter()
        .map(|i| env.seed_node(i, true, json!({})))
        .collect();
    env.proxy.clear_counts();
    // EC2 answers the next three DescribeInstances with RequestLimitExceeded.
    env.proxy.throttle_next(3, "DescribeInstances");
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(node::run(ctx.clone()));
    for name in &names {
        eventually(
            &format!("node {name} initialised despite throttling"),
            WAIT,
            || {
                env.node(name)
                    .filter(|n| !taint_keys(n).contains(&UNINITIALIZED.to_string()))
            },
        )
        .await;
    }
    assert_eq!(env.proxy.throttled(), 3);
    // The host paused instead of retrying each node at once: no storm of lookups.
    let lookups = env.proxy.count("DescribeInstances");
    assert!(lookups <= 3 + 4 + 4, "DescribeInstances calls: {lookups}");
    let e = eventually("a CloudProviderThrottled event", WAIT, || {
        env.events()
            .into_iter()
            .find(|e| e["reason"] == "CloudProviderThrottled")
    })
    .await;
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("RequestLimitExceeded"),
        "{e}"
    );

    // ELBv2 throttles the load balancer's creation once (code Throttling): the Service
    // still gets its NLB.
    env.proxy.throttle_next(1, "CreateLoadBalancer");
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &lb_service("busy", json!({}), json!({})),
        )
        .await
        .unwrap();
    eventually_async(
        "the Service's ingress hostname after a throttled create",
        WAIT,
        || async { ingress_hostname(&stored_service(&env, "busy").await) },
    )
    .await;
    assert_eq!(env.proxy.throttled(), 4);
    let lbs = all(
        &elb(&env.api, "DescribeLoadBalancers", &[]).await,
        "LoadBalancerArn",
    );
    assert_eq!(lbs.len(), 1, "one NLB, not one per attempt");
}

// ---- Deadline ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_cloud_runs_into_the_call_deadline_and_the_next_call_works() {
    let moto = shared_moto();
    let env = AwsEnv::start_with(
        moto.moto,
        EnvOptions {
            call_timeout: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await;
    let instances = run_instances(&env.api, &env.cloud, 1, 0, "m5.large").await;
    let name = env.seed_node(&instances[0], true, json!({}));
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(env.node(&name).unwrap()).unwrap();
    env.proxy.set_delay(Duration::from_secs(3));
    let started = std::time::Instant::now();
    let e = env.provider.instance_metadata(&node).await.unwrap_err();
    assert_eq!(
        e.kind(),
        ccm_provider_abi::ErrorKind::DEADLINE_EXCEEDED,
        "{e:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The message names the AWS action and the endpoint it was waiting for.
    let waiting = format!(
        "no answer from ec2 DescribeInstances at {}",
        env.proxy.url()
    );
    assert!(e.message().contains(&waiting), "{e}");

    env.proxy.set_delay(Duration::ZERO);
    let md = env
        .provider
        .instance_metadata(&node)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        md.provider_id,
        format!("aws:///{}/{}", instances[0].zone, instances[0].id)
    );

    // So does the event of a load balancer sync that runs into the deadline.
    env.proxy.set_delay(Duration::from_secs(3));
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    Api::<Service>::namespaced(env.client.clone(), "default")
        .create(
            &PostParams::default(),
            &lb_service("slow", json!({}), json!({})),
        )
        .await
        .unwrap();
    let ev = eventually("a deadline event naming the AWS call", WAIT, || {
        events_with(&env, "call deadline exceeded")
            .into_iter()
            .next()
    })
    .await;
    let m = ev["message"].as_str().unwrap();
    assert!(
        m.contains("no answer from ") && m.contains(&format!(" at {}", env.proxy.url())),
        "{m}"
    );
    assert!(
        ["DescribeInstances", "DescribeLoadBalancers", "DescribeTags"]
            .iter()
            .any(|a| m.contains(a)),
        "{m}"
    );
    env.proxy.set_delay(Duration::ZERO);
}

// ---- Adoption ---------------------------------------------------------------------------------

/// The AWS CCM's `buildTargetGroupName`, computed outside the plugin (Python's hashlib in the
/// moto venv): `k8s-<ns8>-<name8>-<sha1 10 hex>` over cluster ID, namespace, name, port,
/// NodePort, target protocol, target type, health check protocol and interval, concatenated.
#[allow(clippy::too_many_arguments)]
fn aws_ccm_target_group_name(
    cluster: &str,
    ns: &str,
    name: &str,
    port: u16,
    node_port: u16,
    protocol: &str,
    hc_protocol: &str,
    hc_interval: u32,
) -> String {
    let python = moto_server_path().parent().unwrap().join("python");
    let input =
        format!("{cluster}{ns}{name}{port}{node_port}{protocol}instance{hc_protocol}{hc_interval}");
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import hashlib,re,sys; ns,n,s=sys.argv[1:4]; c=lambda x: re.sub('[^A-Za-z0-9]','',x)[:8]; print('k8s-%s-%s-%s' % (c(ns), c(n), hashlib.sha1(s.encode()).hexdigest()[:10]))",
            ns,
            name,
            &input,
        ])
        .output()
        .expect("python of the moto venv");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The state adoption must not change: load balancers, target groups (ARN and name), listeners.
async fn elb_state(env: &AwsEnv) -> (Vec<String>, Vec<(String, String)>, Vec<String>) {
    let lbs = all(
        &elb(&env.api, "DescribeLoadBalancers", &[]).await,
        "LoadBalancerArn",
    );
    let mut tgs: Vec<(String, String)> = env
        .api
        .all_target_groups()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.arn, t.name))
        .collect();
    tgs.sort();
    let mut listeners = Vec::new();
    for lb in &lbs {
        listeners.extend(
            env.api
                .listeners_of(lb)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.arn),
        );
    }
    listeners.sort();
    (lbs, tgs, listeners)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nlb_the_aws_ccm_made_is_adopted_without_creating_or_deleting_anything() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 3, 0, "m5.large").await;
    ready_nodes(&env, &instances[..2]);
    // The Service the AWS CCM served: it exists before ccm-host starts.
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    // One TCP port: the AWS CCM refuses mixed protocols.
    let mut handed = lb_service(
        "handed",
        json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
        json!({}),
    );
    handed
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .truncate(1);
    let svc = services
        .create(&PostParams::default(), &handed)
        .await
        .unwrap();
    let uid = svc.metadata.uid.clone().unwrap().replace('-', "");
    let lb_name: String = format!("a{uid}").chars().take(32).collect();
    // What the AWS CCM's ensureLoadBalancerv2 creates (aws_loadbalancer.go): the NLB with the
    // ownership tags, per port a target group named by buildTargetGroupName with its NLB
    // health check defaults (TCP, traffic-port, 30 s, 3/3; no timeout sent), the nodes
    // registered on the NodePort, a listener forwarding to it; every resource tagged the same.
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    let tag_params = |p: &mut Vec<(String, String)>| {
        for (i, (k, v)) in [
            ("kubernetes.io/service-name", "default/handed"),
            (cluster_tag.as_str(), "owned"),
        ]
        .iter()
        .enumerate()
        {
            p.push((format!("Tags.member.{}.Key", i + 1), k.to_string()));
            p.push((format!("Tags.member.{}.Value", i + 1), v.to_string()));
        }
    };
    let call = |action: &'static str, p: Vec<(String, String)>| {
        let api = &env.api;
        async move {
            let refs: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            elb(api, action, &refs).await
        }
    };
    let mut p = vec![
        ("Name".to_string(), lb_name.clone()),
        ("Type".into(), "network".into()),
        ("Scheme".into(), "internet-facing".into()),
    ];
    for (i, (_, subnet)) in env.cloud.subnets.iter().enumerate() {
        p.push((
            format!("SubnetMappings.member.{}.SubnetId", i + 1),
            subnet.clone(),
        ));
    }
    tag_params(&mut p);
    let lb_arn = first(&call("CreateLoadBalancer", p).await, "LoadBalancerArn");
    for (port, protocol, node_port) in [(80u16, "TCP", 30080u16)] {
        let name = aws_ccm_target_group_name(
            CLUSTER, "default", "handed", port, node_port, protocol, "TCP", 30,
        );
        let mut p = vec![
            ("Name".to_string(), name),
            ("Protocol".into(), protocol.into()),
            ("Port".into(), node_port.to_string()),
            ("VpcId".into(), env.cloud.vpc.clone()),
            ("HealthCheckProtocol".into(), "TCP".into()),
            ("HealthCheckPort".into(), "traffic-port".into()),
            ("HealthCheckIntervalSeconds".into(), "30".into()),
            ("HealthyThresholdCount".into(), "3".into()),
            ("UnhealthyThresholdCount".into(), "3".into()),
            ("TargetType".into(), "instance".into()),
        ];
        tag_params(&mut p);
        let tg = first(&call("CreateTargetGroup", p).await, "TargetGroupArn");
        let mut p = vec![("TargetGroupArn".to_string(), tg.clone())];
        for (i, inst) in instances[..2].iter().enumerate() {
            p.push((format!("Targets.member.{}.Id", i + 1), inst.id.clone()));
            p.push((
                format!("Targets.member.{}.Port", i + 1),
                node_port.to_string(),
            ));
        }
        call("RegisterTargets", p).await;
        let mut p = vec![
            ("LoadBalancerArn".to_string(), lb_arn.clone()),
            ("Port".into(), port.to_string()),
            ("Protocol".into(), protocol.into()),
            ("DefaultActions.member.1.Type".into(), "forward".into()),
            ("DefaultActions.member.1.TargetGroupArn".into(), tg),
        ];
        tag_params(&mut p);
        call("CreateListener", p).await;
    }
    // updateInstanceSecurityGroupsForNLB: the client rule on the nodes' group (no health rule:
    // the clients, 0.0.0.0/0 over TCP on the traffic port, cover the health checks), and the
    // MTU discovery rule.
    let sg = describe(&env.api, &[instances[0].id.clone()]).await[0].security_groups[0].clone();
    for (proto, from, to, desc) in [
        (
            "tcp",
            "30080",
            "30080",
            format!("kubernetes.io/rule/nlb/client={lb_name}"),
        ),
        ("icmp", "3", "4", "kubernetes.io/rule/nlb/mtu".to_string()),
    ]
    .iter()
    {
        ec2(
            &env.api,
            "AuthorizeSecurityGroupIngress",
            &[
                ("GroupId", &sg),
                ("IpPermissions.1.IpProtocol", proto),
                ("IpPermissions.1.FromPort", from),
                ("IpPermissions.1.ToPort", to),
                ("IpPermissions.1.IpRanges.1.CidrIp", "0.0.0.0/0"),
                ("IpPermissions.1.IpRanges.1.Description", desc),
            ],
        )
        .await;
    }
    let rules_before = sg_rules(&env, &sg).await;
    let before = elb_state(&env).await;
    assert_eq!((before.0.len(), before.1.len(), before.2.len()), (1, 1, 1));

    // ccm-host takes over (same cluster ID): the Service gets the existing NLB's hostname.
    env.proxy.clear_counts();
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let lb = env
        .api
        .describe_load_balancer(&lb_name)
        .await
        .unwrap()
        .unwrap();
    let hostname = eventually_async(
        "the adopted NLB's hostname on the Service",
        WAIT,
        || async { ingress_hostname(&stored_service(&env, "handed").await) },
    )
    .await;
    assert_eq!(hostname, lb.dns_name);
    // Targets are then maintained: a new node joins every group.
    ready_nodes(&env, &instances[2..3]);
    let all_ids: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
    for (arn, _) in &before.1 {
        wait_targets(
            &env,
            arn,
            &all_ids,
            "the new node registered in the adopted group",
        )
        .await;
    }
    let after = elb_state(&env).await;
    assert_eq!(before, after, "nothing created or deleted");
    let counts = env.proxy.counts();
    let changed: Vec<&String> = counts
        .keys()
        .filter(|k| {
            ["Create", "Delete", "Modify", "Authorize", "Revoke"]
                .iter()
                .any(|p| k.starts_with(p))
        })
        .collect();
    assert!(changed.is_empty(), "changes: {counts:?}");
    assert_eq!(
        sg_rules(&env, &sg).await,
        rules_before,
        "the AWS CCM's rules adopted as they are"
    );
    println!("adoption calls: {counts:?}");
}

// ---- Security groups --------------------------------------------------------------------------

/// The CIDR rules of security group `sg` as `(protocol, from, to, cidr, description)`.
async fn sg_rules(env: &AwsEnv, sg: &str) -> BTreeSet<(String, i32, i32, String, String)> {
    let ids = [sg.to_string()];
    env.api
        .describe_security_groups(&[("group-id", &ids[..])])
        .await
        .unwrap()
        .into_iter()
        .flat_map(|g| g.ingress)
        .map(|r| (r.protocol, r.from, r.to, r.cidr, r.description))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn source_ranges_end_as_exactly_those_cidrs_on_the_nodes_security_group() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 2, 0, "m5.large").await;
    ready_nodes(&env, &instances);
    let described = describe(&env.api, &[instances[0].id.clone()]).await;
    let sg = described[0].security_groups[0].clone();
    // A rule of someone else's: never touched.
    ec2(
        &env.api,
        "AuthorizeSecurityGroupIngress",
        &[
            ("GroupId", &sg),
            ("IpPermissions.1.IpProtocol", "tcp"),
            ("IpPermissions.1.FromPort", "22"),
            ("IpPermissions.1.ToPort", "22"),
            ("IpPermissions.1.IpRanges.1.CidrIp", "203.0.113.0/24"),
        ],
    )
    .await;
    let manual = (
        "tcp".to_string(),
        22,
        22,
        "203.0.113.0/24".to_string(),
        String::new(),
    );
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let mut svc = lb_service(
        "guarded",
        json!({"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}),
        json!({"loadBalancerSourceRanges": ["10.1.0.0/16", "192.168.5.0/24"]}),
    );
    svc.spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .truncate(1);
    services.create(&PostParams::default(), &svc).await.unwrap();
    eventually_async("the Service's ingress hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "guarded").await)
    })
    .await;
    let lb = lb_name_of(&stored_service(&env, "guarded").await);
    let client = format!("kubernetes.io/rule/nlb/client={lb}");
    let health = format!("kubernetes.io/rule/nlb/health={lb}");
    let of = |rules: &BTreeSet<(String, i32, i32, String, String)>, d: &str| -> BTreeSet<String> {
        rules
            .iter()
            .filter(|r| r.4 == d)
            .map(|r| format!("{}:{}-{}:{}", r.0, r.1, r.2, r.3))
            .collect()
    };
    let rules = sg_rules(&env, &sg).await;
    assert_eq!(
        of(&rules, &client),
        BTreeSet::from([
            "tcp:30080-30080:10.1.0.0/16".to_string(),
            "tcp:30080-30080:192.168.5.0/24".to_string()
        ]),
        "{rules:?}"
    );
    // Health checks from the NLB's subnets; MTU discovery from the clients.
    let subnets: BTreeSet<String> = env
        .api
        .describe_subnets(&[("vpc-id", &[env.cloud.vpc.clone()][..])])
        .await
        .unwrap()
        .into_iter()
        .map(|s| format!("tcp:30080-30080:{}", s.cidr))
        .collect();
    assert_eq!(of(&rules, &health), subnets, "{rules:?}");
    assert_eq!(
        of(&rules, "kubernetes.io/rule/nlb/mtu"),
        BTreeSet::from([
            "icmp:3-4:10.1.0.0/16".to_string(),
            "icmp:3-4:192.168.5.0/24".to_string()
        ])
    );
    assert!(rules.contains(&manual));

    // New ranges: exactly those afterwards.
    services
        .patch(
            "guarded",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"loadBalancerSourceRanges": ["172.16.0.0/12"]}}),
            ),
        )
        .await
        .unwrap();
    // (The MTU rule is reconciled right after the client rules, in the same pass.)
    eventually_async(
        "only the new range allowed, MTU discovery too",
        WAIT,
        || async {
            let rules = sg_rules(&env, &sg).await;
            (of(&rules, &client) == BTreeSet::from(["tcp:30080-30080:172.16.0.0/12".to_string()])
                && of(&rules, "kubernetes.io/rule/nlb/mtu")
                    == BTreeSet::from(["icmp:3-4:172.16.0.0/12".to_string()]))
            .then_some(())
        },
    )
    .await;

    // Deletion removes every rule the provider made, and nothing else.
    services
        .delete("guarded", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the Service gone", WAIT, || async {
        services
            .get_opt("guarded")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let rules = sg_rules(&env, &sg).await;
    assert!(
        rules
            .iter()
            .all(|r| !r.4.starts_with("kubernetes.io/rule/nlb/")),
        "{rules:?}"
    );
    assert!(rules.contains(&manual), "{rules:?}");
}

// ---- Classic ELB ------------------------------------------------------------------------------

/// A LoadBalancer Service without a type annotation (a classic ELB), two TCP ports.
fn classic_service(
    name: &str,
    annotations: serde_json::Value,
    extra_spec: serde_json::Value,
) -> Service {
    let mut s = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP", "nodePort": 30080},
                {"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP", "nodePort": 30443},
            ],
        },
    });
    merge(&mut s, json!({"spec": extra_spec}));
    serde_json::from_value(s).unwrap()
}

/// The security group `id` as described (`None`: gone).
async fn security_group(
    env: &AwsEnv,
    id: &str,
) -> Option<ccm_provider_aws::api::ec2::SecurityGroup> {
    let v = [env.cloud.vpc.clone()];
    env.api
        .describe_security_groups(&[("vpc-id", &v[..])])
        .await
        .unwrap()
        .into_iter()
        .find(|g| g.id == id)
}

/// Create a security group in the test VPC (untagged), return its ID.
async fn make_group(env_api: &ccm_provider_aws::api::AwsClient, vpc: &str, name: &str) -> String {
    first(
        &ec2(
            env_api,
            "CreateSecurityGroup",
            &[
                ("GroupName", name),
                ("GroupDescription", "made by the test"),
                ("VpcId", vpc),
            ],
        )
        .await,
        "groupId",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_without_a_type_gets_a_classic_elb_with_its_security_group_and_leaves_nothing_behind(
) {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let mut instances = run_instances(&env.api, &env.cloud, 2, 0, "m5.large").await;
    instances.extend(run_instances(&env.api, &env.cloud, 1, 1, "m5.large").await);
    let names = ready_nodes(&env, &instances);
    let node_sg =
        describe(&env.api, &[instances[0].id.clone()]).await[0].security_groups[0].clone();
    // A rule of someone else's on the nodes' group: never touched.
    ec2(
        &env.api,
        "AuthorizeSecurityGroupIngress",
        &[
            ("GroupId", &node_sg),
            ("IpPermissions.1.IpProtocol", "tcp"),
            ("IpPermissions.1.FromPort", "22"),
            ("IpPermissions.1.ToPort", "22"),
            ("IpPermissions.1.IpRanges.1.CidrIp", "203.0.113.0/24"),
        ],
    )
    .await;
    let foreign_rules = sg_rules(&env, &node_sg).await;
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let a = |k: &str| format!("service.beta.kubernetes.io/aws-load-balancer-{k}");
    env.proxy.clear_counts();
    services
        .create(
            &PostParams::default(),
            &classic_service(
                "shop",
                json!({
                    a("additional-resource-tags"): "team=shop",
                    a("cross-zone-load-balancing-enabled"): "true",
                    a("connection-draining-enabled"): "true",
                    a("connection-draining-timeout"): "30",
                    a("connection-idle-timeout"): "120",
                    a("proxy-protocol"): "*",
                    a("healthcheck-interval"): "20",
                }),
                json!({"loadBalancerSourceRanges": ["10.1.0.0/16", "192.168.5.0/24"]}),
            ),
        )
        .await
        .unwrap();
    let hostname = eventually_async("the Service's ingress hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "shop").await)
    })
    .await;
    let ensure_calls = env.proxy.counts();
    let svc = stored_service(&env, "shop").await;
    let name = lb_name_of(&svc);
    let lb = env
        .api
        .describe_classic(&name)
        .await
        .unwrap()
        .expect("the classic ELB exists");
    assert!(
        env.api
            .describe_load_balancer(&name)
            .await
            .unwrap()
            .is_none(),
        "no NLB"
    );
    assert_eq!(lb.dns_name, hostname);
    assert_eq!(lb.scheme, "internet-facing");
    let mut subnets = lb.subnets.clone();
    subnets.sort();
    let mut want_subnets: Vec<String> = env.cloud.subnets.iter().map(|(_, s)| s.clone()).collect();
    want_subnets.sort();
    assert_eq!(subnets, want_subnets, "one subnet per zone");
    // Listeners Service port → NodePort over TCP, the health check on the first NodePort with
    // the AWS CCM's classic defaults (2/6/5 s) and the annotated interval.
    let mut listeners: Vec<(u16, String, u16, String)> = lb
        .listeners
        .iter()
        .map(|(l, _)| {
            (
                l.port,
                l.protocol.to_ascii_lowercase(),
                l.instance_port,
                l.instance_protocol.to_ascii_lowercase(),
            )
        })
        .collect();
    listeners.sort();
    assert_eq!(
        listeners,
        vec![
            (80, "tcp".into(), 30080, "tcp".into()),
            (443, "tcp".into(), 30443, "tcp".into())
        ]
    );
    let hc = lb.health_check.clone().expect("a health check");
    assert_eq!(
        (
            hc.target.as_str(),
            hc.healthy_threshold,
            hc.unhealthy_threshold,
            hc.timeout,
            hc.interval
        ),
        ("TCP:30080", 2, 6, 5, 20)
    );
    let ids: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
    assert_eq!(lb.instances.iter().cloned().collect::<BTreeSet<_>>(), ids);
    let attrs = env.api.classic_attributes(&name).await.unwrap();
    assert!(attrs.cross_zone && attrs.draining && !attrs.access_log);
    assert_eq!(
        (attrs.draining_timeout, attrs.idle_timeout),
        (Some(30), 120)
    );
    // Proxy protocol on both backends through the AWS CCM's policy.
    assert!(lb
        .policies
        .contains(&"k8s-proxyprotocol-enabled".to_string()));
    for port in [30080u16, 30443] {
        assert_eq!(
            lb.backend_policies.get(&port).cloned().unwrap_or_default(),
            vec!["k8s-proxyprotocol-enabled".to_string()],
            "backend {port}"
        );
    }
    let tags = env
        .api
        .classic_tags(std::slice::from_ref(&name))
        .await
        .unwrap()
        .remove(&name)
        .unwrap();
    assert_eq!(
        tags.get(&format!("kubernetes.io/cluster/{CLUSTER}"))
            .map(String::as_str),
        Some("owned")
    );
    assert_eq!(
        tags.get("kubernetes.io/service-name").map(String::as_str),
        Some("default/shop")
    );
    assert_eq!(tags.get("team").map(String::as_str), Some("shop"));

    // The per-ELB security group as the AWS CCM makes it: name, description, tags (no
    // service-name), ingress exactly the Service ports and ICMP 3/4 from the source ranges.
    assert_eq!(lb.security_groups.len(), 1);
    let elb_sg = security_group(&env, &lb.security_groups[0])
        .await
        .expect("the ELB's group");
    assert_eq!(elb_sg.name, format!("k8s-elb-{name}"));
    assert_eq!(
        elb_sg.description,
        format!("Security group for Kubernetes ELB {name} (default/shop)")
    );
    assert_eq!(
        elb_sg
            .tags
            .get(&format!("kubernetes.io/cluster/{CLUSTER}"))
            .map(String::as_str),
        Some("owned")
    );
    assert_eq!(elb_sg.tags.get("team").map(String::as_str), Some("shop"));
    assert!(!elb_sg.tags.contains_key("kubernetes.io/service-name"));
    let rules: BTreeSet<String> = elb_sg
        .ingress
        .iter()
        .map(|r| {
            format!(
                "{}:{}-{}:{}:{}",
                r.protocol, r.from, r.to, r.cidr, r.description
            )
        })
        .collect();
    let mut want = BTreeSet::new();
    for cidr in ["10.1.0.0/16", "192.168.5.0/24"] {
        want.insert(format!("tcp:80-80:{cidr}:"));
        want.insert(format!("tcp:443-443:{cidr}:"));
        want.insert(format!("icmp:3-4:{cidr}:"));
    }
    assert_eq!(rules, want);
    // The nodes' group allows the ELB's group (all traffic, no description).
    let node_group = security_group(&env, &node_sg).await.unwrap();
    assert!(
        node_group
            .from_groups
            .iter()
            .any(|r| r.group_id == elb_sg.id && r.protocol == "-1"),
        "{node_group:?}"
    );
    println!("classic ensure calls: {ensure_calls:?}");

    // The host-set read-back.
    let cloud = in_process(&env).await;
    let svc2 = svc.clone();
    let hosts = tokio::task::spawn_blocking(move || {
        use ccm_provider_abi::sdk::CloudProvider;
        cloud.load_balancer().unwrap().load_balancer_hosts(
            &ccm_provider_abi::CallContext::background(),
            CLUSTER,
            &svc2,
        )
    })
    .await
    .unwrap()
    .unwrap()
    .expect("the ELB exists");
    let mut want_hosts = names.clone();
    want_hosts.sort();
    assert_eq!(hosts, want_hosts);

    // Instances follow the nodes: a new one registered, a deleted one deregistered.
    let more = run_instances(&env.api, &env.cloud, 1, 1, "m5.large").await;
    ready_nodes(&env, &more);
    let with_new: BTreeSet<String> = ids.iter().cloned().chain([more[0].id.clone()]).collect();
    eventually_async("the new node registered", WAIT, || async {
        let lb = env.api.describe_classic(&name).await.unwrap()?;
        (lb.instances.iter().cloned().collect::<BTreeSet<_>>() == with_new).then_some(())
    })
    .await;
    Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .delete(&names[0], &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the deleted node deregistered", WAIT, || async {
        let lb = env.api.describe_classic(&name).await.unwrap()?;
        // (As a set: moto lists an instance twice when a node sync and a service sync both
        // registered it; AWS keeps one.)
        let now: BTreeSet<&String> = lb.instances.iter().collect();
        (!now.contains(&instances[0].id) && now.len() == 3).then_some(())
    })
    .await;

    // New source ranges: the ELB's group allows exactly those.
    services
        .patch(
            "shop",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"loadBalancerSourceRanges": ["172.16.0.0/12"]}}),
            ),
        )
        .await
        .unwrap();
    eventually_async("only the new range in the ELB's group", WAIT, || async {
        let g = security_group(&env, &elb_sg.id).await?;
        let cidrs: BTreeSet<&str> = g.ingress.iter().map(|r| r.cidr.as_str()).collect();
        (cidrs == BTreeSet::from(["172.16.0.0/12"]) && g.ingress.len() == 3).then_some(())
    })
    .await;

    // Deletion: the ELB, its group and the nodes' rule gone; the foreign rule kept. The first
    // DeleteSecurityGroup answers DependencyViolation (the ELB's interfaces still there on
    // AWS; moto never says so): the deletion tries again.
    env.proxy.clear_counts();
    env.proxy
        .fail_next(1, "DeleteSecurityGroup", "DependencyViolation");
    services
        .delete("shop", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the Service gone (finalizer removed)", WAIT, || async {
        services
            .get_opt("shop")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let delete_calls = env.proxy.counts();
    println!("classic delete calls: {delete_calls:?}");
    assert!(env.api.describe_classic(&name).await.unwrap().is_none());
    assert!(
        security_group(&env, &elb_sg.id).await.is_none(),
        "the ELB's group deleted"
    );
    assert_eq!(delete_calls.get("!DependencyViolation"), Some(&1));
    assert_eq!(delete_calls.get("DeleteSecurityGroup"), Some(&2));
    let node_group = security_group(&env, &node_sg).await.unwrap();
    assert!(node_group.from_groups.is_empty(), "{node_group:?}");
    assert_eq!(sg_rules(&env, &node_sg).await, foreign_rules);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_security_groups_from_annotations_and_config_are_used_and_never_deleted() {
    let moto = shared_moto();
    let api = direct_client(&moto.moto.url());
    let cloud = make_cloud(&api).await;
    let global = make_group(&api, &cloud.vpc, "global-elb").await;
    let annotated = make_group(&api, &cloud.vpc, "annotated").await;
    let extra = make_group(&api, &cloud.vpc, "extra").await;
    let env = AwsEnv::on_cloud(
        moto.moto,
        api,
        cloud,
        EnvOptions {
            extra_global: format!(
                "ElbSecurityGroup = {global}\nDisableSecurityGroupIngress = true"
            ),
            ..Default::default()
        },
    )
    .await;
    let instances = run_instances(&env.api, &env.cloud, 2, 0, "m5.large").await;
    ready_nodes(&env, &instances);
    let node_sg =
        describe(&env.api, &[instances[0].id.clone()]).await[0].security_groups[0].clone();
    let groups_before: Vec<_> = futures_all(&env, &[&global, &annotated, &extra, &node_sg]).await;
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let a = |k: &str| format!("service.beta.kubernetes.io/aws-load-balancer-{k}");
    services
        .create(
            &PostParams::default(),
            &classic_service("global", json!({}), json!({})),
        )
        .await
        .unwrap();
    services
        .create(
            &PostParams::default(),
            &classic_service(
                "annotated",
                json!({a("security-groups"): annotated.clone(), a("extra-security-groups"): extra.clone()}),
                json!({}),
            ),
        )
        .await
        .unwrap();
    for name in ["global", "annotated"] {
        eventually_async(&format!("{name}'s hostname"), WAIT, || async {
            ingress_hostname(&stored_service(&env, name).await)
        })
        .await;
    }
    let lb = |n: &str| {
        let api = &env.api;
        let n = n.to_string();
        async move { api.describe_classic(&n).await.unwrap().unwrap() }
    };
    let g_name = lb_name_of(&stored_service(&env, "global").await);
    let a_name = lb_name_of(&stored_service(&env, "annotated").await);
    assert_eq!(lb(&g_name).await.security_groups, vec![global.clone()]);
    assert_eq!(
        lb(&a_name).await.security_groups,
        vec![annotated.clone(), extra.clone()]
    );
    // No per-ELB group made; the given groups and the nodes' group unchanged
    // (DisableSecurityGroupIngress: no node rule).
    let all_names: Vec<String> = env
        .api
        .describe_security_groups(&[("vpc-id", &[env.cloud.vpc.clone()][..])])
        .await
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert!(
        !all_names.iter().any(|n| n.starts_with("k8s-elb-")),
        "{all_names:?}"
    );
    assert_eq!(
        futures_all(&env, &[&global, &annotated, &extra, &node_sg]).await,
        groups_before
    );
    for name in ["global", "annotated"] {
        services
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    for name in ["global", "annotated"] {
        eventually_async(&format!("{name} gone"), WAIT, || async {
            services
                .get_opt(name)
                .await
                .unwrap()
                .is_none()
                .then_some(())
        })
        .await;
    }
    assert!(env.api.describe_classic(&g_name).await.unwrap().is_none());
    assert!(env.api.describe_classic(&a_name).await.unwrap().is_none());
    assert_eq!(
        futures_all(&env, &[&global, &annotated, &extra, &node_sg]).await,
        groups_before,
        "the given groups are never changed or deleted"
    );
}

/// The groups `ids` as described (`None` for a missing one).
async fn futures_all(
    env: &AwsEnv,
    ids: &[&String],
) -> Vec<Option<ccm_provider_aws::api::ec2::SecurityGroup>> {
    let mut out = Vec::new();
    for id in ids {
        out.push(security_group(env, id).await);
    }
    out
}

/// What the AWS CCM's `ensureLoadBalancer` (`pkg/providers/v1/aws_loadbalancer.go`, classic
/// path) leaves for a Service with two TCP ports and no annotation, made with boto3 from
/// that code, not from this provider's: the per-ELB group (`ensureSecurityGroup` with its
/// name, description and cluster tag; `setSecurityGroupIngress`: each port and ICMP 3/4 from
/// `0.0.0.0/0`), the ELB (`buildListener` tcp/tcp listeners, the cluster subnets, the group,
/// the ownership tags; no `Scheme` when internet-facing), `ensureLoadBalancerHealthCheck`
/// (`TCP:<first NodePort>`, 2/6/5/10), the default attributes, the instances, and
/// `updateInstanceSecurityGroupsForLoadBalancer` (all traffic from the ELB's group on the
/// nodes' group).
const AWS_CCM_CLASSIC_SETUP: &str = r#"
import sys, boto3
url, cluster, lb, svc, vpc, node_sg = sys.argv[1:7]
subnets = sys.argv[7].split(",")
instances = sys.argv[8].split(",")
ec2 = boto3.client("ec2", endpoint_url=url, region_name="us-east-1")
elb = boto3.client("elb", endpoint_url=url, region_name="us-east-1")
cluster_tag = {"Key": "kubernetes.io/cluster/" + cluster, "Value": "owned"}
sg = ec2.create_security_group(GroupName="k8s-elb-" + lb, VpcId=vpc,
    Description="Security group for Kubernetes ELB %s (%s)" % (lb, svc))["GroupId"]
ec2.create_tags(Resources=[sg], Tags=[cluster_tag])
perms = [{"IpProtocol": "tcp", "FromPort": p, "ToPort": p, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]} for p in (80, 443)]
perms.append({"IpProtocol": "icmp", "FromPort": 3, "ToPort": 4, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]})
ec2.authorize_security_group_ingress(GroupId=sg, IpPermissions=perms)
elb.create_load_balancer(LoadBalancerName=lb,
    Listeners=[{"Protocol": "tcp", "LoadBalancerPort": 80, "InstanceProtocol": "tcp", "InstancePort": 30080},
               {"Protocol": "tcp", "LoadBalancerPort": 443, "InstanceProtocol": "tcp", "InstancePort": 30443}],
    Subnets=subnets, SecurityGroups=[sg],
    Tags=[{"Key": "kubernetes.io/service-name", "Value": svc}, cluster_tag])
elb.configure_health_check(LoadBalancerName=lb, HealthCheck={"Target": "TCP:30080",
    "HealthyThreshold": 2, "UnhealthyThreshold": 6, "Timeout": 5, "Interval": 10})
elb.modify_load_balancer_attributes(LoadBalancerName=lb, LoadBalancerAttributes={
    "CrossZoneLoadBalancing": {"Enabled": False}, "AccessLog": {"Enabled": False},
    "ConnectionDraining": {"Enabled": False}, "ConnectionSettings": {"IdleTimeout": 60}})
elb.register_instances_with_load_balancer(LoadBalancerName=lb, Instances=[{"InstanceId": i} for i in instances])
ec2.authorize_security_group_ingress(GroupId=node_sg, IpPermissions=[{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": sg}]}])
print(sg)
"#;

/// The classic ELB state adoption must not change: the ELB (but its instances) and every
/// security group of the VPC with its rules.
async fn classic_state(env: &AwsEnv, name: &str) -> (String, Vec<String>) {
    let mut lb = env
        .api
        .describe_classic(name)
        .await
        .unwrap()
        .expect("the ELB");
    lb.instances.clear();
    let attrs = env.api.classic_attributes(name).await.unwrap();
    let tags = env.api.classic_tags(&[name.to_string()]).await.unwrap();
    let v = [env.cloud.vpc.clone()];
    let mut groups: Vec<String> = env
        .api
        .describe_security_groups(&[("vpc-id", &v[..])])
        .await
        .unwrap()
        .into_iter()
        .map(|mut g| {
            g.ingress.sort();
            g.from_groups.sort();
            format!("{g:?}")
        })
        .collect();
    groups.sort();
    (format!("{lb:?} {attrs:?} {tags:?}"), groups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_elb_the_aws_ccm_made_is_adopted_without_creating_or_deleting_anything() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 3, 0, "m5.large").await;
    ready_nodes(&env, &instances[..2]);
    let node_sg =
        describe(&env.api, &[instances[0].id.clone()]).await[0].security_groups[0].clone();
    // The Service the AWS CCM served: it exists before ccm-host starts.
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let svc = services
        .create(
            &PostParams::default(),
            &classic_service("legacy", json!({}), json!({})),
        )
        .await
        .unwrap();
    let uid = svc.metadata.uid.clone().unwrap().replace('-', "");
    let lb_name: String = format!("a{uid}").chars().take(32).collect();
    let python = moto_server_path().parent().unwrap().join("python");
    let subnets: Vec<String> = env.cloud.subnets.iter().map(|(_, s)| s.clone()).collect();
    let ids: Vec<String> = instances[..2].iter().map(|i| i.id.clone()).collect();
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(AWS_CCM_CLASSIC_SETUP)
        .args([
            &moto.moto.url(),
            CLUSTER,
            &lb_name,
            "default/legacy",
            &env.cloud.vpc,
            &node_sg,
            &subnets.join(","),
            &ids.join(","),
        ])
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env_remove("AWS_PROFILE")
        .output()
        .expect("python of the moto venv");
    assert!(
        out.status.success(),
        "boto3 set-up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let elb_sg = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let before = classic_state(&env, &lb_name).await;

    // ccm-host takes over (same cluster ID): the Service gets the existing ELB's hostname.
    env.proxy.clear_counts();
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let lb = env.api.describe_classic(&lb_name).await.unwrap().unwrap();
    let hostname = eventually_async(
        "the adopted ELB's hostname on the Service",
        WAIT,
        || async { ingress_hostname(&stored_service(&env, "legacy").await) },
    )
    .await;
    assert_eq!(hostname, lb.dns_name);
    let adopt_calls = env.proxy.counts();
    // Instances are then maintained: a new node is registered.
    ready_nodes(&env, &instances[2..3]);
    let all_ids: BTreeSet<String> = instances.iter().map(|i| i.id.clone()).collect();
    eventually_async("the new node registered", WAIT, || async {
        let lb = env.api.describe_classic(&lb_name).await.unwrap()?;
        (lb.instances.iter().cloned().collect::<BTreeSet<_>>() == all_ids).then_some(())
    })
    .await;
    assert_eq!(
        classic_state(&env, &lb_name).await,
        before,
        "nothing created, changed or deleted"
    );
    let counts = env.proxy.counts();
    let changed: Vec<(&String, &u64)> = counts
        .iter()
        .filter(|(k, _)| {
            [
                "Create",
                "Delete",
                "Modify",
                "Authorize",
                "Revoke",
                "Configure",
                "Apply",
                "Set",
                "Attach",
                "Detach",
                "Add",
            ]
            .iter()
            .any(|p| k.starts_with(p))
        })
        .collect();
    assert!(changed.is_empty(), "changes: {counts:?}");
    // The new node (a node sync and a service sync running at once may both send it).
    assert!(
        counts
            .get("RegisterInstancesWithLoadBalancer")
            .is_some_and(|n| *n >= 1),
        "{counts:?}"
    );
    let groups = env
        .api
        .describe_security_groups(&[("vpc-id", &[env.cloud.vpc.clone()][..])])
        .await
        .unwrap();
    assert!(groups.iter().any(|g| g.id == elb_sg));
    println!("classic adoption calls: {adopt_calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_annotation_value_blocks_only_its_own_change() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 2, 0, "m5.large").await;
    ready_nodes(&env, &instances[..1]);
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let interval = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    let cross_zone =
        "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
    let idle = "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";
    services
        .create(
            &PostParams::default(),
            &classic_service("tuned", json!({interval: "20"}), json!({})),
        )
        .await
        .unwrap();
    eventually_async("tuned's hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "tuned").await)
    })
    .await;
    let name = lb_name_of(&stored_service(&env, "tuned").await);
    let lb = env.api.describe_classic(&name).await.unwrap().unwrap();
    assert_eq!(lb.health_check.unwrap().interval, 20);

    // One invalid value and two valid changes at once, and a new node.
    services
        .patch(
            "tuned",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"annotations": {interval: "soon", cross_zone: "true", idle: "90"}}}),
            ),
        )
        .await
        .unwrap();
    ready_nodes(&env, &instances[1..2]);
    eventually_async(
        "the valid changes applied and the new node registered",
        WAIT,
        || async {
            let a = env.api.classic_attributes(&name).await.unwrap();
            let lb = env.api.describe_classic(&name).await.unwrap()?;
            // (A set: see the classic test; moto may list an instance twice.)
            let now: BTreeSet<&String> = lb.instances.iter().collect();
            (a.cross_zone && a.idle_timeout == 90 && now.len() == 2).then_some(())
        },
    )
    .await;
    // The invalid key's own change is held back: the interval stays the last valid one.
    let lb = env.api.describe_classic(&name).await.unwrap().unwrap();
    assert_eq!(lb.health_check.unwrap().interval, 20);
    let warned = events_of(&env, "tuned", "InvalidAnnotations");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0]["type"], "Warning");
    let m = warned[0]["message"].as_str().unwrap();
    assert!(
        m.contains(interval) && m.contains("\"soon\"") && m.contains("\"20\""),
        "{m}"
    );
    assert!(
        events_of(&env, "tuned", "SyncLoadBalancerFailed").is_empty(),
        "the ensure itself succeeds"
    );

    // Fixed: the change goes through.
    services
        .patch(
            "tuned",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {interval: "30"}}})),
        )
        .await
        .unwrap();
    eventually_async("the fixed interval applied", WAIT, || async {
        let lb = env.api.describe_classic(&name).await.unwrap()?;
        (lb.health_check?.interval == 30).then_some(())
    })
    .await;
    assert_eq!(events_of(&env, "tuned", "InvalidAnnotations").len(), 1);
}

// ---- ABI 1.2 incremental host updates ---------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_host_updates_register_and_deregister_only_the_change() {
    use ccm_provider_abi::sdk::{CloudProvider, HostChange};
    use k8s_openapi::api::core::v1::Node;
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 4, 0, "m5.large").await;
    ec2(
        &env.api,
        "StopInstances",
        &[("InstanceId.1", &instances[3].id)],
    )
    .await;
    let node = |i: &ccm_provider_aws::api::ec2::Instance| -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": i.private_dns.clone().unwrap()},
            "spec": {"providerID": format!("aws:///{}/{}", i.zone, i.id)}
        }))
        .unwrap()
    };
    let nodes: Vec<Node> = instances.iter().map(node).collect();
    let mut classic = classic_service("inc-classic", json!({}), json!({}));
    classic.metadata.uid = Some("11111111-2222-3333-4444-555555555555".into());
    let mut nlb = lb_service("inc-nlb", json!({}), json!({}));
    nlb.metadata.uid = Some("66666666-7777-8888-9999-000000000000".into());
    nlb.spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .truncate(1);
    let cloud = std::sync::Arc::new(in_process(&env).await);
    let call = |f: Box<dyn FnOnce(&ccm_provider_aws::AwsCloud) + Send>| {
        let cloud = cloud.clone();
        async move {
            tokio::task::spawn_blocking(move || f(&cloud))
                .await
                .unwrap()
        }
    };
    let ctx = ccm_provider_abi::CallContext::background;
    for svc in [&classic, &nlb] {
        let (svc, first) = (svc.clone(), nodes[..2].to_vec());
        call(Box::new(move |c| {
            let lb = c.load_balancer().unwrap();
            assert!(lb.incremental_hosts());
            lb.ensure_load_balancer(&ctx(), CLUSTER, &svc, &first)
                .unwrap();
        }))
        .await;
    }
    let classic_name = lb_name_of(&classic);
    let nlb_arn = env
        .api
        .describe_load_balancer(&lb_name_of(&nlb))
        .await
        .unwrap()
        .unwrap()
        .arn;
    let tg = env.api.target_groups_of(&nlb_arn).await.unwrap()[0]
        .arn
        .clone();
    async fn hosts(env: &AwsEnv, name: String, tg: String) -> (BTreeSet<String>, BTreeSet<String>) {
        let api = &env.api;
        {
            let c: BTreeSet<String> = api
                .describe_classic(&name)
                .await
                .unwrap()
                .unwrap()
                .instances
                .into_iter()
                .collect();
            let n: BTreeSet<String> = api
                .targets_of(&tg)
                .await
                .unwrap()
                .into_iter()
                .map(|t| t.id)
                .collect();
            (c, n)
        }
    }
    let ids = |idx: &[usize]| -> BTreeSet<String> {
        idx.iter().map(|i| instances[*i].id.clone()).collect()
    };
    assert_eq!(
        hosts(&env, classic_name.clone(), tg.clone()).await,
        (ids(&[0, 1]), ids(&[0, 1]))
    );

    // One node leaves, one joins, a stopped one joins: only the change is sent.
    env.proxy.clear_counts();
    let change = HostChange {
        replace: false,
        added: vec![nodes[2].clone(), nodes[3].clone()],
        removed: vec![nodes[0].clone()],
    };
    for _ in 0..2 {
        // Twice: both halves are idempotent.
        for svc in [&classic, &nlb] {
            let (svc, change) = (svc.clone(), change.clone());
            call(Box::new(move |c| {
                c.load_balancer()
                    .unwrap()
                    .update_load_balancer_hosts(&ctx(), CLUSTER, &svc, &change)
                    .unwrap()
            }))
            .await;
        }
    }
    assert_eq!(
        hosts(&env, classic_name.clone(), tg.clone()).await,
        (ids(&[1, 2]), ids(&[1, 2]))
    );
    let counts = env.proxy.counts();
    println!("incremental host update calls (twice each): {counts:?}");
    assert_eq!(counts.get("RegisterInstancesWithLoadBalancer"), Some(&1));
    assert_eq!(counts.get("DeregisterInstancesFromLoadBalancer"), Some(&1));
    assert_eq!(counts.get("RegisterTargets"), Some(&2));
    assert_eq!(counts.get("DeregisterTargets"), Some(&2));
    // One InvalidTarget: the repeated DeregisterTargets (the stopped instance is never sent).
    assert_eq!(counts.get("!InvalidTarget"), Some(&1));
    // The repeat finds the removed target gone (moto: InvalidTarget) and lists the targets once.
    assert_eq!(counts.get("DescribeTargetHealth"), Some(&1));

    // A whole set replaces the hosts.
    let replace = HostChange {
        replace: true,
        added: vec![nodes[0].clone()],
        removed: Vec::new(),
    };
    for svc in [&classic, &nlb] {
        let (svc, change) = (svc.clone(), replace.clone());
        call(Box::new(move |c| {
            c.load_balancer()
                .unwrap()
                .update_load_balancer_hosts(&ctx(), CLUSTER, &svc, &change)
                .unwrap()
        }))
        .await;
    }
    assert_eq!(
        hosts(&env, classic_name.clone(), tg.clone()).await,
        (ids(&[0]), ids(&[0]))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_type_change_is_refused_and_changes_nothing() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 1, 0, "m5.large").await;
    ready_nodes(&env, &instances);
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    let mut svc = lb_service("switch", json!({}), json!({}));
    svc.spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .truncate(1);
    services.create(&PostParams::default(), &svc).await.unwrap();
    eventually_async("switch's hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "switch").await)
    })
    .await;
    let name = lb_name_of(&stored_service(&env, "switch").await);
    // The type annotation removed: the Service now asks for a classic ELB.
    services
        .patch(
            "switch",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": null}}})),
        )
        .await
        .unwrap();
    let e = eventually("a Warning event about the type change", WAIT, || {
        events_with(&env, "the load balancer type cannot change")
            .into_iter()
            .next()
    })
    .await;
    assert_eq!(e["involvedObject"]["name"], "switch");
    assert!(env
        .api
        .describe_load_balancer(&name)
        .await
        .unwrap()
        .is_some());
    assert!(env.api.describe_classic(&name).await.unwrap().is_none());
    let v = [env.cloud.vpc.clone()];
    let groups = env
        .api
        .describe_security_groups(&[("vpc-id", &v[..])])
        .await
        .unwrap();
    assert!(
        !groups.iter().any(|g| g.name.starts_with("k8s-elb-")),
        "no ELB group made"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_elb_moved_to_annotated_groups_deletes_its_own_group() {
    let moto = shared_moto();
    let env = AwsEnv::start(moto.moto).await;
    let instances = run_instances(&env.api, &env.cloud, 1, 0, "m5.large").await;
    ready_nodes(&env, &instances);
    let node_sg =
        describe(&env.api, &[instances[0].id.clone()]).await[0].security_groups[0].clone();
    let ctx = env.context(cfg());
    assert!(ctx.nodes.wait_synced().await);
    assert!(ctx.services.wait_synced().await);
    tokio::spawn(service::run(ctx.clone()));
    let services = Api::<Service>::namespaced(env.client.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &classic_service("moving", json!({}), json!({})),
        )
        .await
        .unwrap();
    eventually_async("moving's hostname", WAIT, || async {
        ingress_hostname(&stored_service(&env, "moving").await)
    })
    .await;
    let name = lb_name_of(&stored_service(&env, "moving").await);
    let own = env
        .api
        .describe_classic(&name)
        .await
        .unwrap()
        .unwrap()
        .security_groups[0]
        .clone();
    let mine = make_group(&env.api, &env.cloud.vpc, "mine").await;
    services
        .patch(
            "moving",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
                "service.beta.kubernetes.io/aws-load-balancer-security-groups": mine.clone()
            }}})),
        )
        .await
        .unwrap();
    eventually_async("the ELB on the annotated group only", WAIT, || async {
        let lb = env.api.describe_classic(&name).await.unwrap()?;
        (lb.security_groups == vec![mine.clone()]).then_some(())
    })
    .await;
    // Its own group: the nodes' rule revoked, the group deleted; the nodes allow the new one.
    eventually_async("the ELB's own group deleted", WAIT, || async {
        security_group(&env, &own).await.is_none().then_some(())
    })
    .await;
    // (Later in the same ensure.)
    eventually_async("the nodes allow only the annotated group", WAIT, || async {
        let node_group = security_group(&env, &node_sg).await?;
        let sources: Vec<&str> = node_group
            .from_groups
            .iter()
            .map(|r| r.group_id.as_str())
            .collect();
        (sources == vec![mine.as_str()]).then_some(())
    })
    .await;
    services
        .delete("moving", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("moving gone", WAIT, || async {
        services
            .get_opt("moving")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(env.api.describe_classic(&name).await.unwrap().is_none());
    assert!(
        security_group(&env, &mine).await.is_some(),
        "the annotated group is never deleted"
    );
}
