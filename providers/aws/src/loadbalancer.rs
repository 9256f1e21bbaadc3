//! LoadBalancer: a classic ELB per Service by default ([`classic`], the AWS CCM's default), a
//! network load balancer (NLB) with `aws-load-balancer-type: nlb` (this module).
//!
//! For an NLB of a Service `ns/name` with UID `u` and cluster ID `c`:
//! - the NLB is named `a<u without dashes>` (32 characters; upstream's default name), scheme
//!   internet-facing unless the Service asks for internal, in one subnet per zone (the
//!   `aws-load-balancer-subnets` annotation, else the VPC's subnets tagged for the cluster or
//!   for no cluster, internet-facing ones only in public subnets, preferring the
//!   `kubernetes.io/role/elb` / `…/internal-elb` tag);
//! - one target group per Service port, instance targets on the port's NodePort, named
//!   `k8s-<ns>-<name>-<hash>` exactly as the AWS CCM names them (SHA-1 of what cannot change in
//!   place: ports, protocol, health check protocol and interval), with the health check of
//!   [`crate::annotations`];
//! - one listener per Service port forwarding to its target group;
//! - the NodePorts opened in the nodes' security groups for the source ranges and the health
//!   checks, as the AWS CCM does ([`crate::securitygroups`]);
//! - every resource it creates carries `kubernetes.io/cluster/<c>=owned` and
//!   `kubernetes.io/service-name=ns/name` (plus `aws-load-balancer-additional-resource-tags`),
//!   and it changes or deletes only resources carrying both: a load balancer of the same name
//!   without them is reported and left alone.
//!
//! Ensure is idempotent and resumable: a target group left behind by an interrupted call is
//! found again by its name; deletion removes the NLB (its listeners with it) and then its
//! target groups, and when the NLB is already gone it looks for target groups of the Service
//! that an interrupted deletion left behind.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::annotations::{self, Desired, Handling, PortMapping};
use crate::api::ec2::Subnet;
use crate::api::elbv2::{
    Listener, LoadBalancer as Nlb, NewLoadBalancer, NewTargetGroup, Target, TargetGroup,
};
use crate::cloud::AwsContext;
use crate::instances::{key_of, Key};
use crate::runtime::AwsRuntime;
use crate::securitygroups::{sync_nlb_rules, NlbRules, RuleSync};
use crate::tags;

pub mod classic;

pub use classic::ClassicDesired;

/// Whether the load balancer of a Service's name is the Service's: the decision every path
/// takes before changing or deleting anything.
pub(crate) enum Ownership<T> {
    /// There is none.
    Absent,
    /// It carries the cluster's `owned` tag and the Service's name tag.
    Owned(T),
    /// It exists without them: left alone; the error says so in one line.
    Foreign(ProviderError),
}

/// The reason of the Warning event that lists the invalid annotation values kept out of a
/// change (their last valid value stays in effect).
pub const INVALID_ANNOTATIONS: &str = "InvalidAnnotations";

/// The reason of the Warning event that lists the annotations a Service carries to no effect.
pub const IGNORED_ANNOTATIONS: &str = "IgnoredAnnotations";

/// The `aws` LoadBalancer.
pub struct AwsLoadBalancer {
    inner: Arc<Nlbs>,
    rt: Arc<AwsRuntime>,
}

/// The work of [`AwsLoadBalancer`], shared with the tasks it runs on the provider's runtime.
struct Nlbs {
    cx: Arc<AwsContext>,
    vpc: Mutex<Option<String>>,
}

/// The target group name of `mapping`, computed as the AWS CCM computes it
/// (`buildTargetGroupName`), so a Service handed over keeps its groups: `k8s-<ns8>-<name8>-<h10>`,
/// `ns8`/`name8` the first 8 alphanumerics of namespace and name, `h10` the first 10 hex digits
/// of the SHA-1 of cluster ID, namespace, name, port, NodePort, target protocol, target type
/// (`instance`), health check protocol and interval, concatenated without separators.
pub fn target_group_name(cluster_id: &str, d: &Desired, m: &PortMapping) -> String {
    target_group_name_of(
        cluster_id,
        &d.namespace,
        &d.name,
        m.port,
        m.node_port,
        &m.target_protocol,
        "instance",
        &d.health_check.protocol,
        d.health_check.interval,
    )
}

/// [`target_group_name`] from its inputs.
#[allow(clippy::too_many_arguments)]
pub fn target_group_name_of(
    cluster_id: &str,
    namespace: &str,
    name: &str,
    port: u16,
    node_port: u16,
    target_protocol: &str,
    target_type: &str,
    hc_protocol: &str,
    hc_interval: u32,
) -> String {
    let input = format!(
        "{cluster_id}{namespace}{name}{port}{node_port}{target_protocol}{target_type}{hc_protocol}{hc_interval}"
    );
    let hash: String = sha1(input.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let clean = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect()
    };
    format!("k8s-{}-{}-{}", clean(namespace), clean(name), &hash[..10])
}

/// SHA-1 (FIPS 180-4), for the AWS CCM's target group names only (not for security).
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut msg = data.to_vec();
    let bits = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_be_bytes());
    for block in msg.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

/// The prefix of every target group name of the Service.
fn target_group_prefix(d: &Desired) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect()
    };
    format!("k8s-{}-{}-", clean(&d.namespace), clean(&d.name))
}

fn status_of(lb: &Nlb) -> LoadBalancerStatus {
    let usable = matches!(lb.state.as_str(), "active" | "provisioning" | "");
    LoadBalancerStatus {
        ingress: (usable && !lb.dns_name.is_empty()).then(|| {
            vec![LoadBalancerIngress {
                hostname: Some(lb.dns_name.clone()),
                ..Default::default()
            }]
        }),
    }
}

fn not_owned(name: &str, service: &str, cluster_id: &str) -> ProviderError {
    ProviderError::other(format!(
        "load balancer {name} exists but was not created by cluster {cluster_id} for service {service} (it lacks the tags {}=owned and {}={service}); it is left alone",
        tags::cluster_tag(cluster_id),
        tags::SERVICE_NAME_TAG
    ))
}

impl AwsLoadBalancer {
    /// `service` as its load balancer is to be made: an annotation whose value is invalid is
    /// replaced by its last valid value (or left out if it was absent then), so that it blocks
    /// only its own change; one line per such key for the `InvalidAnnotations` event. A key
    /// whose last valid value this process does not know (nothing applied since it started),
    /// and an error no annotation is named in, are left for the ensure to report: then nothing
    /// but the targets changes until the Service is fixed.
    fn effective_service(&self, service: &Service, handling: Handling) -> (Service, Vec<String>) {
        let probe = &self.inner.cx.config.health_probe_mode;
        let check = |s: &Service| -> Result<()> {
            match handling {
                Handling::Classic => ClassicDesired::from_service(s, probe).map(drop),
                _ => Desired::from_service(s, probe).map(drop),
            }
        };
        let mut effective = service.clone();
        let mut lines = Vec::new();
        let keys = annotations::load_balancer_annotations(service).len();
        for _ in 0..keys {
            let e = match check(&effective) {
                Ok(()) => break,
                Err(e) => e,
            };
            if e.kind() == ErrorKind::IMPLEMENTED_ELSEWHERE {
                break;
            }
            let msg = e.message().to_string();
            let current = annotations::load_balancer_annotations(&effective);
            let Some(key) = current
                .keys()
                .find(|k| msg.contains(&format!("{k}=")))
                .or_else(|| current.keys().find(|k| msg.contains(k.as_str())))
                .cloned()
            else {
                break;
            };
            let Some(good) = self.inner.cx.applied_value(service, &key) else {
                break;
            };
            if good.as_ref() == current.get(&key) {
                break;
            }
            lines.push(match &good {
                Some(v) => {
                    format!("{msg}; its last valid value {v:?} stays in effect until it is fixed")
                }
                None => format!("{msg}; it is left out (as before it was set) until it is fixed"),
            });
            let a = effective.metadata.annotations.get_or_insert_default();
            match good {
                Some(v) => a.insert(key, v),
                None => a.remove(&key),
            };
        }
        (effective, lines)
    }

    /// The load balancer over the provider's context and runtime.
    pub fn new(cx: Arc<AwsContext>, rt: Arc<AwsRuntime>) -> Self {
        Self {
            inner: Arc::new(Nlbs {
                cx,
                vpc: Mutex::new(None),
            }),
            rt,
        }
    }

    /// Run `f(work, service, nodes)` on the runtime with owned copies of the arguments.
    fn run<T, F, Fut>(
        &self,
        ctx: &CallContext,
        service: &Service,
        nodes: &[Node],
        f: F,
    ) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Nlbs>, Service, Vec<Node>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let (inner, service, nodes) = (self.inner.clone(), service.clone(), nodes.to_vec());
        self.rt
            .run(ctx, async move { f(inner, service, nodes).await })
    }
}

impl Nlbs {
    /// The NLB named `name` and whether it is the Service's.
    async fn ownership(
        &self,
        name: &str,
        cluster_id: &str,
        service: &str,
    ) -> Result<Ownership<Nlb>> {
        let Some(lb) = self.cx.api.describe_load_balancer(name).await? else {
            return Ok(Ownership::Absent);
        };
        let tags = self
            .cx
            .api
            .describe_tags(std::slice::from_ref(&lb.arn))
            .await?;
        let empty = BTreeMap::new();
        if !tags::is_owned_by(tags.get(&lb.arn).unwrap_or(&empty), cluster_id, service) {
            return Ok(Ownership::Foreign(not_owned(name, service, cluster_id)));
        }
        Ok(Ownership::Owned(lb))
    }

    /// The listeners of `lb_arn` and its target groups: those AWS lists for the load balancer
    /// and those its listeners forward to (moto's ModifyListener does not add the load
    /// balancer to the new group's `LoadBalancerArns`; AWS does).
    async fn listeners_and_groups(
        &self,
        lb_arn: &str,
    ) -> Result<(Vec<Listener>, Vec<TargetGroup>)> {
        let listeners = self.cx.api.listeners_of(lb_arn).await?;
        let mut groups = self.cx.api.target_groups_of(lb_arn).await?;
        let missing: Vec<String> = listeners
            .iter()
            .filter_map(|l| l.target_group_arn.clone())
            .filter(|a| !groups.iter().any(|g| &g.arn == a))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !missing.is_empty() {
            groups.extend(self.cx.api.target_groups_by_arn(&missing).await?);
        }
        Ok((listeners, groups))
    }

    /// The targets of `add` that RegisterTargets takes: instances EC2 reported (within the
    /// last minute, else asked now in one DescribeInstances) as `pending` or `running`.
    /// Stopped and terminated instances are never sent (AWS answers `InvalidTarget`).
    async fn registrable(&self, add: Vec<Target>) -> Result<Vec<Target>> {
        let unknown: Vec<Key> = add
            .iter()
            .filter(|t| self.cx.known_state(&t.id).is_none())
            .map(|t| t.id.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(Key::Id)
            .collect();
        if !unknown.is_empty() {
            // Records every state it reads; an ID EC2 does not know stays unknown.
            self.cx.lookup(&unknown).await?;
        }
        Ok(add
            .into_iter()
            .filter(|t| match self.cx.known_state(&t.id).as_deref() {
                Some("pending" | "running") => true,
                Some(state) => {
                    log::info!(
                        "aws: instance {} is {state}; not registered as a target",
                        t.id
                    );
                    false
                }
                None => {
                    log::warn!(
                        "aws: instance {} is unknown to EC2; not registered as a target",
                        t.id
                    );
                    false
                }
            })
            .collect())
    }

    /// The nodes' security-group rules of `lb` for `d` ([`crate::securitygroups`]).
    async fn sync_rules(
        &self,
        cluster_id: &str,
        lb: &Nlb,
        d: &Desired,
        ids: &[String],
        mode: RuleSync,
    ) -> Result<()> {
        if self.cx.config.disable_sg_ingress {
            return Ok(());
        }
        let clients: Vec<(String, u16)> = d
            .mappings
            .iter()
            .map(|m| {
                let p = if m.target_protocol == "UDP" {
                    "udp"
                } else {
                    "tcp"
                };
                (p.to_string(), m.node_port)
            })
            .collect();
        let health_ports: Vec<u16> = match d.health_check.port.parse::<u16>() {
            Ok(p) => vec![p],
            Err(_) => d
                .mappings
                .iter()
                .map(|m| m.node_port)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        let mut rules = NlbRules {
            clients,
            client_cidrs: d.source_ranges.clone(),
            health_ports,
            health_cidrs: Vec::new(),
        };
        if rules.needs_health() {
            let subnets: Vec<String> = lb.zones.iter().map(|(_, s)| s.clone()).collect();
            if !subnets.is_empty() {
                rules.health_cidrs = self
                    .cx
                    .api
                    .describe_subnets(&[("subnet-id", &subnets[..])])
                    .await?
                    .into_iter()
                    .map(|s| s.cidr)
                    .filter(|c| !c.is_empty())
                    .collect();
            }
        }
        let vpc = (!lb.vpc_id.is_empty()).then_some(lb.vpc_id.as_str());
        sync_nlb_rules(&self.cx, cluster_id, &lb.name, vpc, ids, Some(&rules), mode).await
    }

    /// The instance IDs behind `nodes` (provider IDs, else a lookup by name).
    async fn instance_ids(&self, nodes: &[Node]) -> Result<Vec<String>> {
        let mut ids = BTreeSet::new();
        let mut by_name = Vec::new();
        for n in nodes {
            match key_of(n) {
                Ok(Key::Id(id)) => {
                    if let Some(name) = &n.metadata.name {
                        self.cx.remember_node(&id, name);
                    }
                    ids.insert(id);
                }
                Ok(k @ Key::Name(_)) => by_name.push(k),
                Err(e) => log::warn!("aws: node {:?} is not a target: {e}", n.metadata.name),
            }
        }
        if !by_name.is_empty() {
            let found = self.cx.lookup(&by_name).await?;
            for k in &by_name {
                match found.get(k) {
                    Some(i) => {
                        ids.insert(i.id.clone());
                    }
                    None => log::warn!("aws: node {k:?} has no instance; not a target"),
                }
            }
        }
        Ok(ids.into_iter().collect())
    }

    /// The cluster's VPC: `VPC` from the config, else the VPC of one target instance.
    async fn vpc(&self, ids: &[String]) -> Result<String> {
        if let Some(v) = &self.cx.config.vpc {
            return Ok(v.clone());
        }
        if let Some(v) = self.vpc.lock().expect("vpc").clone() {
            return Ok(v);
        }
        let Some(first) = ids.first() else {
            return Err(ProviderError::other(
                "cannot tell the cluster's VPC: no target node, and no VPC in the cloud config",
            ));
        };
        let found = self
            .cx
            .api
            .describe_instances(&[("instance-id", std::slice::from_ref(first))])
            .await?;
        let vpc = found
            .into_iter()
            .find_map(|i| i.vpc_id)
            .ok_or_else(|| ProviderError::other(format!("instance {first} has no VPC")))?;
        *self.vpc.lock().expect("vpc") = Some(vpc.clone());
        Ok(vpc)
    }

    /// Subnets of a load balancer of `service`: `wanted` (the annotation's IDs or Name tags),
    /// else discovered as the AWS CCM does (`findELBSubnets`).
    async fn subnets(
        &self,
        wanted: Option<&[String]>,
        internal: bool,
        service: &str,
        vpc: &str,
        cluster_id: &str,
    ) -> Result<Vec<String>> {
        if let Some(wanted) = wanted {
            let ids: Vec<String> = wanted
                .iter()
                .filter(|s| s.starts_with("subnet-"))
                .cloned()
                .collect();
            let names: Vec<String> = wanted
                .iter()
                .filter(|s| !s.starts_with("subnet-"))
                .cloned()
                .collect();
            let mut found: Vec<Subnet> = Vec::new();
            if !ids.is_empty() {
                found.extend(
                    self.cx
                        .api
                        .describe_subnets(&[("subnet-id", &ids[..])])
                        .await?,
                );
            }
            if !names.is_empty() {
                let vpcs = [vpc.to_string()];
                found.extend(
                    self.cx
                        .api
                        .describe_subnets(&[("tag:Name", &names[..]), ("vpc-id", &vpcs[..])])
                        .await?,
                );
            }
            let mut out = Vec::new();
            for w in wanted {
                let s = found
                    .iter()
                    .find(|s| s.id == *w || s.tags.get("Name") == Some(w))
                    .ok_or_else(|| {
                        ProviderError::other(format!(
                            "service {}: annotation {}: no subnet {w:?} (by ID or Name tag) in {vpc}",
                            service,
                            annotations::SUBNETS
                        ))
                    })?;
                out.push(s.id.clone());
            }
            return Ok(out);
        }

        let vpcs = [vpc.to_string()];
        let all = self
            .cx
            .api
            .describe_subnets(&[("vpc-id", &vpcs[..])])
            .await?;
        let mut candidates: Vec<Subnet> = all
            .into_iter()
            .filter(|s| {
                tags::has_cluster_tag(&s.tags, cluster_id) || !tags::has_any_cluster_tag(&s.tags)
            })
            .collect();
        if candidates.is_empty() {
            if let Some(id) = &self.cx.config.subnet_id {
                return Ok(vec![id.clone()]);
            }
        }
        if !internal {
            let tables = self
                .cx
                .api
                .describe_route_tables(&[("vpc-id", &vpcs[..])])
                .await?;
            let main = tables.iter().find(|t| t.main);
            candidates.retain(|s| {
                let table = tables.iter().find(|t| t.subnets.contains(&s.id)).or(main);
                table.is_some_and(|t| {
                    t.routes.iter().any(|r| {
                        r.gateway_id
                            .as_deref()
                            .is_some_and(|g| g.starts_with("igw-"))
                    })
                })
            });
        }
        let role = if internal {
            tags::ROLE_INTERNAL_ELB_TAG
        } else {
            tags::ROLE_ELB_TAG
        };
        let mut by_zone: BTreeMap<String, Subnet> = BTreeMap::new();
        for s in candidates {
            if s.zone.is_empty() {
                continue;
            }
            let better = match by_zone.get(&s.zone) {
                None => true,
                Some(cur) => {
                    let rank = |x: &Subnet| {
                        (
                            !x.tags.contains_key(role),
                            !tags::has_cluster_tag(&x.tags, cluster_id),
                            x.id.clone(),
                        )
                    };
                    rank(&s) < rank(cur)
                }
            };
            if better {
                by_zone.insert(s.zone.clone(), s);
            }
        }
        let mut out = Vec::new();
        for (zone, s) in by_zone {
            // Local, Wavelength and Outposts zones take no NLB.
            if let Some(z) = self.cx.zone(&zone).await? {
                if z.zone_type != "availability-zone" {
                    continue;
                }
            }
            out.push(s.id);
        }
        if out.is_empty() {
            return Err(ProviderError::other(format!(
                "service {}: could not find any suitable subnets for the load balancer in {vpc} (tag {} subnets with {}=1, or set {})",
                service,
                if internal { "private" } else { "public" },
                role,
                annotations::SUBNETS
            )));
        }
        Ok(out)
    }

    /// Make the targets of `tg_arn` exactly `ids` on `port`. `known` are its current targets
    /// when already known (a new group has none).
    async fn sync_targets(
        &self,
        tg_arn: &str,
        port: u16,
        ids: &[String],
        known: Option<Vec<Target>>,
    ) -> Result<()> {
        let actual: BTreeSet<Target> = match known {
            Some(k) => k.into_iter().collect(),
            None => self.cx.api.targets_of(tg_arn).await?.into_iter().collect(),
        };
        let wanted: BTreeSet<Target> = ids
            .iter()
            .map(|id| Target {
                id: id.clone(),
                port,
            })
            .collect();
        let remove: Vec<Target> = actual.difference(&wanted).cloned().collect();
        let add: Vec<Target> = wanted.difference(&actual).cloned().collect();
        let add = if add.is_empty() {
            add
        } else {
            self.registrable(add).await?
        };
        // Deregister first: a full group can then take replacements.
        if !remove.is_empty() {
            self.cx.api.deregister_targets(tg_arn, &remove).await?;
        }
        if !add.is_empty() {
            match self.cx.api.register_targets(tg_arn, &add).await {
                Err(e) if e.code() == "InvalidTarget" => {
                    // An instance that is not running cannot be registered: keep the running ones.
                    let want: Vec<String> = add.iter().map(|t| t.id.clone()).collect();
                    let running: BTreeSet<String> = self
                        .cx
                        .api
                        .describe_instances(&[("instance-id", &want[..])])
                        .await?
                        .into_iter()
                        .filter(|i| i.state == "running")
                        .map(|i| i.id)
                        .collect();
                    let add: Vec<Target> = add
                        .into_iter()
                        .filter(|t| running.contains(&t.id))
                        .collect();
                    log::warn!(
                        "aws: {e}; registering the {} running instances only",
                        add.len()
                    );
                    if !add.is_empty() {
                        self.cx.api.register_targets(tg_arn, &add).await?;
                    }
                }
                r => r?,
            }
        }
        Ok(())
    }

    /// The target group for `m`: found by name among `attached`, else by name in the account
    /// (left by an interrupted call; it must be ours), else created.
    async fn target_group(
        &self,
        cluster_id: &str,
        d: &Desired,
        m: &PortMapping,
        vpc: &str,
        attached: &[TargetGroup],
        tags: &BTreeMap<String, String>,
    ) -> Result<(TargetGroup, bool)> {
        let name = target_group_name(cluster_id, d, m);
        if let Some(tg) = attached.iter().find(|t| t.name == name) {
            return Ok((tg.clone(), false));
        }
        if let Some(tg) = self.cx.api.target_group_named(&name).await? {
            let found = self
                .cx
                .api
                .describe_tags(std::slice::from_ref(&tg.arn))
                .await?;
            let empty = BTreeMap::new();
            if !tags::is_owned_by(found.get(&tg.arn).unwrap_or(&empty), cluster_id, &d.service) {
                return Err(ProviderError::other(format!(
                    "target group {name} exists but was not created by cluster {cluster_id} for service {}; it is left alone",
                    d.service
                )));
            }
            return Ok((tg, false));
        }
        let tg = self
            .cx
            .api
            .create_target_group(
                &NewTargetGroup {
                    name,
                    protocol: m.target_protocol.clone(),
                    port: m.node_port,
                    vpc_id: vpc.to_string(),
                    health_check: d.health_check.clone(),
                },
                tags,
            )
            .await?;
        Ok((tg, true))
    }

    /// Bring the health check and attributes of `tg` to what `d` asks.
    async fn reconcile_target_group(&self, tg: &TargetGroup, d: &Desired) -> Result<()> {
        let hc = &d.health_check;
        let differs = tg.hc_port != hc.port
            || !tg.hc_protocol.eq_ignore_ascii_case(&hc.protocol)
            || tg
                .healthy_threshold
                .is_some_and(|v| v != hc.healthy_threshold)
            || tg
                .unhealthy_threshold
                .is_some_and(|v| v != hc.unhealthy_threshold)
            || tg.hc_timeout.is_some_and(|v| v != hc.timeout)
            || (hc.protocol != "TCP" && tg.hc_path != hc.path);
        if differs {
            self.cx.api.modify_target_group(&tg.arn, hc).await?;
        }
        if !d.tg_attributes.is_empty() {
            let current = self.cx.api.target_group_attributes(&tg.arn).await?;
            let changed: BTreeMap<String, String> = d
                .tg_attributes
                .iter()
                .filter(|(k, v)| current.get(*k) != Some(*v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !changed.is_empty() {
                self.cx
                    .api
                    .modify_target_group_attributes(&tg.arn, &changed)
                    .await?;
            }
        }
        Ok(())
    }

    async fn ensure(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus> {
        let d = match Desired::from_service(service, &self.cx.config.health_probe_mode) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::IMPLEMENTED_ELSEWHERE => return Err(e),
            Err(e) => {
                // The configuration cannot be worked out until the Service is fixed; its
                // targets still follow the nodes.
                match self.follow_nodes(cluster_name, service, nodes).await {
                    Ok(()) => {}
                    Err(t) if t.kind() == ErrorKind::NOT_FOUND => {}
                    Err(t) => log::warn!("aws: {t}"),
                }
                return Err(e);
            }
        };
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let targets: Vec<Node> = nodes
            .iter()
            .filter(|n| d.targets_node(n))
            .cloned()
            .collect();
        let ids = self.instance_ids(&targets).await?;
        let mut resource_tags = d.additional_tags.clone();
        resource_tags.extend(tags::owned_tags(&cluster_id, &d.service));

        let existing = self.ownership(&name, &cluster_id, &d.service).await?;
        let (lb, created) = match existing {
            Ownership::Foreign(e) => return Err(e),
            Ownership::Owned(lb) => {
                let internal = lb.scheme == "internal";
                if internal != d.internal {
                    return Err(ProviderError::other(format!(
                        "service {}: load balancer {name} is {} and the Service asks for {}: an NLB's scheme cannot change; delete and re-create the Service",
                        d.service,
                        lb.scheme,
                        if d.internal { "internal" } else { "internet-facing" }
                    )));
                }
                (lb, false)
            }
            Ownership::Absent => {
                if self.cx.api.describe_classic(&name).await?.is_some() {
                    return Err(ProviderError::other(format!(
                        "service {}: a classic load balancer {name} exists; the load balancer type cannot change (delete and re-create the Service, or remove aws-load-balancer-type: nlb)",
                        d.service
                    )));
                }
                let vpc = self.vpc(&ids).await?;
                let subnets = self
                    .subnets(
                        d.subnets.as_deref(),
                        d.internal,
                        &d.service,
                        &vpc,
                        &cluster_id,
                    )
                    .await?;
                log::info!(
                    "aws: creating network load balancer {name} for service {} in {}",
                    d.service,
                    subnets.join(",")
                );
                let lb = self
                    .cx
                    .api
                    .create_load_balancer(
                        &NewLoadBalancer {
                            name: name.clone(),
                            internal: d.internal,
                            subnets,
                            allocations: d.allocations.clone(),
                            private_ips: d.private_ips.clone(),
                            ip_address_type: d.ip_address_type.clone(),
                        },
                        &resource_tags,
                    )
                    .await?;
                (lb, true)
            }
        };
        let vpc = if lb.vpc_id.is_empty() {
            self.vpc(&ids).await?
        } else {
            lb.vpc_id.clone()
        };

        // Listeners and target groups.
        let (listeners, attached) = if created {
            (Vec::new(), Vec::new())
        } else {
            self.listeners_and_groups(&lb.arn).await?
        };
        let mut keep_tgs: BTreeSet<String> = BTreeSet::new();
        for m in &d.mappings {
            let (tg, new_tg) = self
                .target_group(&cluster_id, &d, m, &vpc, &attached, &resource_tags)
                .await?;
            keep_tgs.insert(tg.arn.clone());
            if !new_tg || !d.tg_attributes.is_empty() {
                self.reconcile_target_group(&tg, &d).await?;
            }
            self.sync_targets(&tg.arn, m.node_port, &ids, new_tg.then(Vec::new))
                .await?;
            match listeners.iter().find(|l| l.port == m.port) {
                Some(l) => {
                    let same = l.protocol == m.frontend_protocol
                        && l.target_group_arn.as_deref() == Some(tg.arn.as_str())
                        && l.certificate == m.certificate
                        && (m.ssl_policy.is_none() || l.ssl_policy == m.ssl_policy);
                    if !same {
                        self.cx
                            .api
                            .modify_listener(
                                &l.arn,
                                &m.frontend_protocol,
                                &tg.arn,
                                m.certificate.as_deref(),
                                m.ssl_policy.as_deref(),
                            )
                            .await?;
                    }
                }
                None => {
                    self.cx
                        .api
                        .create_listener(
                            &lb.arn,
                            m.port,
                            &m.frontend_protocol,
                            &tg.arn,
                            m.certificate.as_deref(),
                            m.ssl_policy.as_deref(),
                            &resource_tags,
                        )
                        .await?;
                }
            }
        }
        // Listeners of ports the Service no longer has; then target groups nothing uses.
        for l in &listeners {
            if !d.mappings.iter().any(|m| m.port == l.port) {
                log::info!(
                    "aws: {name}: deleting the listener of port {} (no longer in the Service)",
                    l.port
                );
                self.cx.api.delete_listener(&l.arn).await?;
            }
        }
        for tg in &attached {
            if !keep_tgs.contains(&tg.arn) {
                log::info!(
                    "aws: {name}: deleting target group {} (no longer used)",
                    tg.name
                );
                self.cx.api.delete_target_group(&tg.arn).await?;
            }
        }

        // The NodePorts in the nodes' security groups, for the clients and the health checks.
        self.sync_rules(&cluster_id, &lb, &d, &ids, RuleSync::Exact)
            .await?;

        // Attributes: a new NLB has AWS's defaults (cross-zone off, no access logs).
        let defaults = d.lb_attributes.iter().all(|(k, v)| {
            (k == "load_balancing.cross_zone.enabled" || k == "access_logs.s3.enabled")
                && v == "false"
        });
        if !(created && defaults) {
            let current = self.cx.api.load_balancer_attributes(&lb.arn).await?;
            let changed: BTreeMap<String, String> = d
                .lb_attributes
                .iter()
                .filter(|(k, v)| {
                    current.get(*k).map(String::as_str).unwrap_or("false") != v.as_str()
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !changed.is_empty() {
                self.cx
                    .api
                    .modify_load_balancer_attributes(&lb.arn, &changed)
                    .await?;
            }
        }
        if !created {
            if let Some(t) = &d.ip_address_type {
                self.cx.api.set_ip_address_type(&lb.arn, t).await?;
            }
        }
        Ok(status_of(&lb))
    }

    /// UpdateLoadBalancer: the targets of every target group of the Service's NLB become the
    /// nodes (filtered by `target-node-labels`). Reads no other annotation, so an invalid or
    /// unknown one never stops it.
    async fn follow_nodes(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned(lb) => lb,
            Ownership::Absent => {
                return Err(ProviderError::not_found(format!(
                    "service {key}: load balancer {name} does not exist"
                )))
            }
            Ownership::Foreign(e) => return Err(e),
        };
        let labels = annotations::target_node_labels(service);
        let targets: Vec<Node> = nodes
            .iter()
            .filter(|n| annotations::node_matches(&labels, n))
            .cloned()
            .collect();
        let ids = self.instance_ids(&targets).await?;
        let (_, groups) = self.listeners_and_groups(&lb.arn).await?;
        for tg in groups {
            self.sync_targets(&tg.arn, tg.port, &ids, None).await?;
        }
        // The security-group rules follow the instances too, when the Service's settings can
        // be read (else the next successful ensure does it).
        if let Ok(d) = Desired::from_service(service, &self.cx.config.health_probe_mode) {
            self.sync_rules(&cluster_id, &lb, &d, &ids, RuleSync::Exact)
                .await?;
        }
        Ok(())
    }

    /// The instance IDs an incremental host update adds and removes: `added` filtered by
    /// `target-node-labels`, `removed` all of them; an instance in both (a node whose
    /// providerID changed form) is neither.
    async fn host_delta(
        &self,
        service: &Service,
        added: &[Node],
        removed: &[Node],
    ) -> Result<(Vec<String>, Vec<String>)> {
        let labels = annotations::target_node_labels(service);
        let added: Vec<Node> = added
            .iter()
            .filter(|n| annotations::node_matches(&labels, n))
            .cloned()
            .collect();
        let add = self.instance_ids(&added).await?;
        let remove: Vec<String> = self
            .instance_ids(removed)
            .await?
            .into_iter()
            .filter(|id| !add.contains(id))
            .collect();
        Ok((add, remove))
    }

    /// ABI 1.2 incremental host update of an NLB: every target group of the NLB deregisters
    /// the instances of `removed` and registers those of `added` (running ones only; both
    /// idempotent on AWS), and the groups of the added instances get the NLB's rules (never
    /// revoked here: the next full update does that).
    async fn nlb_hosts_delta(
        &self,
        cluster_name: &str,
        service: &Service,
        added: &[Node],
        removed: &[Node],
    ) -> Result<()> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned(lb) => lb,
            Ownership::Absent => {
                return Err(ProviderError::not_found(format!(
                    "service {key}: load balancer {name} does not exist"
                )))
            }
            Ownership::Foreign(e) => return Err(e),
        };
        let (add, remove) = self.host_delta(service, added, removed).await?;
        if add.is_empty() && remove.is_empty() {
            return Ok(());
        }
        let (_, groups) = self.listeners_and_groups(&lb.arn).await?;
        let add_targets = |port: u16| -> Vec<Target> {
            add.iter()
                .map(|id| Target {
                    id: id.clone(),
                    port,
                })
                .collect()
        };
        let mut registered = Vec::new();
        for tg in &groups {
            let gone: Vec<Target> = remove
                .iter()
                .map(|id| Target {
                    id: id.clone(),
                    port: tg.port,
                })
                .collect();
            if !gone.is_empty() {
                match self.cx.api.deregister_targets(&tg.arn, &gone).await {
                    // A target that is not registered (moto, and AWS for an unknown one): ask
                    // which are, and deregister those.
                    Err(e) if e.code() == "InvalidTarget" => {
                        let current = self.cx.api.targets_of(&tg.arn).await?;
                        let gone: Vec<Target> =
                            gone.into_iter().filter(|t| current.contains(t)).collect();
                        if !gone.is_empty() {
                            self.cx.api.deregister_targets(&tg.arn, &gone).await?;
                        }
                    }
                    r => r?,
                }
            }
            let new = if add.is_empty() {
                Vec::new()
            } else {
                self.registrable(add_targets(tg.port)).await?
            };
            if !new.is_empty() {
                self.cx.api.register_targets(&tg.arn, &new).await?;
                registered.extend(new.into_iter().map(|t| t.id));
            }
        }
        registered.sort();
        registered.dedup();
        if !registered.is_empty() {
            if let Ok(d) = Desired::from_service(service, &self.cx.config.health_probe_mode) {
                self.sync_rules(&cluster_id, &lb, &d, &registered, RuleSync::GrantOnly)
                    .await?;
            }
        }
        Ok(())
    }

    async fn delete(&self, cluster_name: &str, service: &Service) -> Result<()> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned(lb) => Some(lb),
            Ownership::Absent => None,
            // Not this Service's: deleting the Service leaves it in place.
            Ownership::Foreign(e) => {
                log::warn!("aws: {e}");
                return Ok(());
            }
        };
        let mut groups: Vec<TargetGroup> = Vec::new();
        if let Some(lb) = &lb {
            groups = self.listeners_and_groups(&lb.arn).await?.1;
        }
        // And by name prefix and tags: groups of the Service that neither the listeners nor
        // AWS's listing for the NLB lead to (left by an interrupted ensure or deletion, or
        // switched by a ModifyListener that moto does not record).
        let lb_arn = lb.as_ref().map(|l| l.arn.clone());
        for g in self.orphan_groups(service, lb_arn.as_deref()).await? {
            if !groups.iter().any(|h| h.arn == g.arn) {
                groups.push(g);
            }
        }
        if let Some(lb) = &lb {
            log::info!("aws: deleting network load balancer {name} of service {key}");
            self.cx.api.delete_load_balancer(&lb.arn).await?;
        }
        // The NLB's rules in the nodes' security groups (recognised by their descriptions).
        let vpc = lb
            .as_ref()
            .map(|l| l.vpc_id.clone())
            .filter(|v| !v.is_empty())
            .or_else(|| self.cx.config.vpc.clone())
            .or_else(|| self.vpc.lock().expect("vpc").clone());
        sync_nlb_rules(
            &self.cx,
            &cluster_id,
            &name,
            vpc.as_deref(),
            &[],
            None,
            RuleSync::Exact,
        )
        .await?;
        let arns: Vec<String> = groups.iter().map(|g| g.arn.clone()).collect();
        let owned = self.cx.api.describe_tags(&arns).await?;
        let empty = BTreeMap::new();
        for g in &groups {
            if !tags::is_owned_by(owned.get(&g.arn).unwrap_or(&empty), &cluster_id, &key) {
                log::warn!(
                    "aws: target group {} is not tagged as {key}'s; left alone",
                    g.name
                );
                continue;
            }
            // The listeners went with the NLB; AWS may still count the group as in use for a
            // moment.
            let mut pause = std::time::Duration::from_millis(200);
            loop {
                match self.cx.api.delete_target_group(&g.arn).await {
                    Ok(()) => break,
                    Err(e)
                        if e.code() == "ResourceInUse"
                            && pause < std::time::Duration::from_secs(10) =>
                    {
                        tokio::time::sleep(pause).await;
                        pause *= 2;
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Target groups named for `service` (the `k8s-<ns>-<name>-` prefix) that no load balancer
    /// but `lb_arn` uses; the caller checks their ownership tags.
    async fn orphan_groups(
        &self,
        service: &Service,
        lb_arn: Option<&str>,
    ) -> Result<Vec<TargetGroup>> {
        let prefix = match Desired::from_service(service, &self.cx.config.health_probe_mode) {
            Ok(d) => target_group_prefix(&d),
            Err(_) => {
                let clean = |s: &str| -> String {
                    s.chars()
                        .filter(char::is_ascii_alphanumeric)
                        .take(8)
                        .collect()
                };
                format!(
                    "k8s-{}-{}-",
                    clean(service.metadata.namespace.as_deref().unwrap_or("default")),
                    clean(service.metadata.name.as_deref().unwrap_or(""))
                )
            }
        };
        Ok(self
            .cx
            .api
            .all_target_groups()
            .await?
            .into_iter()
            .filter(|g| {
                g.name.starts_with(&prefix) && g.lb_arns.iter().all(|a| Some(a.as_str()) == lb_arn)
            })
            .collect())
    }

    async fn hosts(&self, cluster_name: &str, service: &Service) -> Result<Option<Vec<String>>> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned(lb) => lb,
            Ownership::Absent => return Ok(None),
            Ownership::Foreign(e) => return Err(e),
        };
        let mut ids = BTreeSet::new();
        for tg in self.cx.api.target_groups_of(&lb.arn).await? {
            ids.extend(
                self.cx
                    .api
                    .targets_of(&tg.arn)
                    .await?
                    .into_iter()
                    .map(|t| t.id),
            );
        }
        Ok(Some(ids.into_iter().collect()))
    }
}

impl LoadBalancer for AwsLoadBalancer {
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>> {
        let handling = annotations::handling(service)?;
        if handling == Handling::Elsewhere {
            return Ok(None);
        }
        let name = annotations::load_balancer_name(service);
        if handling == Handling::Classic {
            return self.run(ctx, service, &[], |lb, _, _| async move {
                lb.classic_status(&name).await
            });
        }
        self.run(ctx, service, &[], |lb, _, _| async move {
            Ok(lb
                .cx
                .api
                .describe_load_balancer(&name)
                .await?
                .map(|lb| status_of(&lb)))
        })
    }

    fn get_load_balancer_name(
        &self,
        _ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<String> {
        Ok(annotations::load_balancer_name(service))
    }

    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<Option<LoadBalancerStatus>> {
        let handling = annotations::handling(service)?;
        if handling == Handling::Elsewhere {
            return Err(ProviderError::implemented_elsewhere());
        }
        self.inner.cx.warn_once(
            ctx,
            service,
            IGNORED_ANNOTATIONS,
            &annotations::notices(service),
        );
        let (effective, invalid) = self.effective_service(service, handling);
        self.inner
            .cx
            .warn_once(ctx, service, INVALID_ANNOTATIONS, &invalid);
        let cluster = cluster_name.to_string();
        let status = self.run(ctx, &effective, nodes, move |lb, svc, nodes| async move {
            match handling {
                Handling::Classic => lb.ensure_classic(&cluster, &svc, &nodes).await,
                _ => lb.ensure(&cluster, &svc, &nodes).await,
            }
        })?;
        self.inner.cx.remember_applied(&effective);
        Ok(Some(status))
    }

    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()> {
        let handling = annotations::handling(service)?;
        if handling == Handling::Elsewhere {
            return Err(ProviderError::implemented_elsewhere());
        }
        self.inner.cx.warn_once(
            ctx,
            service,
            IGNORED_ANNOTATIONS,
            &annotations::notices(service),
        );
        let (effective, _) = self.effective_service(service, handling);
        let cluster = cluster_name.to_string();
        self.run(ctx, &effective, nodes, move |lb, svc, nodes| async move {
            match handling {
                Handling::Classic => lb.update_classic(&cluster, &svc, &nodes).await,
                _ => lb.follow_nodes(&cluster, &svc, &nodes).await,
            }
        })
    }

    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<()> {
        let handling = annotations::handling(service)?;
        if handling == Handling::Elsewhere {
            return Ok(());
        }
        let cluster = cluster_name.to_string();
        self.run(ctx, service, &[], move |lb, svc, _| async move {
            match handling {
                Handling::Classic => lb.delete_classic(&cluster, &svc).await,
                _ => lb.delete(&cluster, &svc).await,
            }
        })?;
        self.inner.cx.forget_applied(service);
        Ok(())
    }

    fn incremental_hosts(&self) -> bool {
        true
    }

    /// ABI 1.2: the hosts that joined and left since the set last applied (the SDK checks the
    /// base): registered / deregistered with RegisterTargets / DeregisterTargets (NLB) or
    /// Register/DeregisterInstancesWithLoadBalancer (classic), no listing of the current
    /// targets for an NLB. A whole set (`replace`) is a full `UpdateLoadBalancer`.
    fn update_load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        change: &HostChange,
    ) -> Result<()> {
        if change.replace {
            return self.update_load_balancer(ctx, cluster_name, service, &change.added);
        }
        let handling = annotations::handling(service)?;
        if handling == Handling::Elsewhere {
            return Err(ProviderError::implemented_elsewhere());
        }
        let (effective, _) = self.effective_service(service, handling);
        let cluster = cluster_name.to_string();
        let removed = change.removed.clone();
        self.run(
            ctx,
            &effective,
            &change.added,
            move |lb, svc, added| async move {
                match handling {
                    Handling::Classic => {
                        lb.classic_hosts_delta(&cluster, &svc, &added, &removed)
                            .await
                    }
                    _ => lb.nlb_hosts_delta(&cluster, &svc, &added, &removed).await,
                }
            },
        )
    }

    fn load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<Vec<String>>> {
        let cluster = cluster_name.to_string();
        let handling = annotations::handling(service)?;
        let Some(ids) = self.run(ctx, service, &[], move |lb, svc, _| async move {
            match handling {
                Handling::Classic => lb.classic_hosts(&cluster, &svc).await,
                _ => lb.hosts(&cluster, &svc).await,
            }
        })?
        else {
            return Ok(None);
        };
        let names = self.inner.cx.node_names(&self.rt, ctx, &ids)?;
        let mut out: Vec<String> = ids
            .iter()
            .map(|id| names.get(id).cloned().unwrap_or_else(|| id.clone()))
            .collect();
        out.sort();
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HealthProbeMode;
    use serde_json::json;

    #[test]
    fn target_group_names_fit_and_change_with_what_cannot_be_modified() {
        let svc: Service = serde_json::from_value(json!({
            "metadata": {"name": "very-long-service-name", "namespace": "kube-system", "uid": "u-1"},
            "spec": {"ports": [{"port": 443, "protocol": "TCP", "nodePort": 30443}]}
        }))
        .unwrap();
        let d = Desired::from_service(&svc, &HealthProbeMode::ServiceNodePort).unwrap();
        let name = target_group_name("prod", &d, &d.mappings[0]);
        assert!(name.starts_with("k8s-kubesyst-verylong-"), "{name}");
        assert_eq!(name.len(), 32);
        assert!(name.starts_with(&target_group_prefix(&d)));
        let mut m = d.mappings[0].clone();
        m.node_port = 30444;
        assert_ne!(target_group_name("prod", &d, &m), name);
        assert_ne!(target_group_name("other", &d, &d.mappings[0]), name);
        assert_eq!(target_group_name("prod", &d, &d.mappings[0]), name);
    }

    #[test]
    fn target_group_names_are_the_aws_ccms() {
        // SHA-1 itself (FIPS 180-4 examples).
        let hex = |b: [u8; 20]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(
            hex(sha1(b"abc")),
            "a9993e364706816aba3e25717850c26c9cd0d89d"
        );
        assert_eq!(
            hex(sha1(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        // The AWS CCM's own test vectors (zero health check configuration), and the default.
        let name = |hc: &str, interval: u32, target_type: &str| {
            target_group_name_of(
                "cluster-a",
                "default",
                "service-a",
                80,
                8080,
                "TCP",
                target_type,
                hc,
                interval,
            )
        };
        assert_eq!(name("", 0, "instance"), "k8s-default-servicea-7fa2e07508");
        assert_eq!(name("HTTP", 10, "ip"), "k8s-default-servicea-4028e49618");
        assert_eq!(
            name("TCP", 30, "instance"),
            "k8s-default-servicea-7dc8c715c5"
        );
    }
}
