//! Security groups as the AWS CCM manages them: the classic ELB's own group (`k8s-elb-<lb>`,
//! [`ensure_elb_group`], [`sync_elb_group_ingress`], [`delete_owned_group`]) and the rule allowing
//! it on the nodes' groups ([`sync_classic_rules`]); and the nodes' security-group rules of an NLB
//! (`updateInstanceSecurityGroupsForNLB` in `pkg/providers/v1/aws_loadbalancer.go`):
//!
//! - **Which groups.** The security groups of the load balancer's VPC (the cluster's tagged
//!   groups when the VPC is unknown), and per target instance the group it is reached through: its one cluster-tagged group, else
//!   its only group (two tagged groups: an error, as upstream; several untagged ones: skipped
//!   with a warning). `ElbSecurityGroup` is never changed; `DisableSecurityGroupIngress`
//!   turns all of this off.
//! - **Client rules** `kubernetes.io/rule/nlb/client=<lb name>`: each NodePort (its protocol)
//!   from each source range (`spec.loadBalancerSourceRanges`, else the
//!   `service.beta.kubernetes.io/load-balancer-source-ranges` annotation, else `0.0.0.0/0`).
//! - **Health rules** `kubernetes.io/rule/nlb/health=<lb name>`: TCP on each health check port
//!   from the CIDRs of the NLB's subnets; left out when the clients are exactly `0.0.0.0/0`, all
//!   TCP, on the same ports.
//! - **MTU rule** `kubernetes.io/rule/nlb/mtu` (shared by every NLB): ICMP type 3 code 4 from
//!   each IPv4 CIDR that has a client rule in the group, reconciled when a pass changed it.
//!
//! Rules are recognised by these descriptions only, exactly as upstream writes them, so rules the
//! AWS CCM made are adopted and nothing else in a group is touched. Groups used by the target
//! instances get exactly the wanted rules; every other group of the VPC loses this NLB's rules
//! (upstream: every other cluster-tagged group); deletion removes this NLB's rules everywhere.
//!
//! Differs from upstream: per-port protocols (upstream refuses mixed protocols and uses one for
//! all client rules); the MTU rule only for IPv4 sources.

use std::collections::{BTreeMap, BTreeSet};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::api::ec2::{GroupRule, IngressRule, SecurityGroup};
use crate::cloud::AwsContext;
use crate::instances::Key;
use crate::tags;

/// `NLBClientRuleDescription`.
pub const NLB_CLIENT_RULE: &str = "kubernetes.io/rule/nlb/client";
/// `NLBHealthCheckRuleDescription`.
pub const NLB_HEALTH_RULE: &str = "kubernetes.io/rule/nlb/health";
/// `NLBMtuDiscoveryRuleDescription`.
pub const NLB_MTU_RULE: &str = "kubernetes.io/rule/nlb/mtu";

/// What one NLB needs open on its nodes.
#[derive(Debug, Clone)]
pub struct NlbRules {
    /// `(protocol: tcp/udp, NodePort)` per listener.
    pub clients: Vec<(String, u16)>,
    /// The source ranges.
    pub client_cidrs: Vec<String>,
    /// Health check ports (TCP).
    pub health_ports: Vec<u16>,
    /// The CIDRs of the NLB's subnets.
    pub health_cidrs: Vec<String>,
}

impl NlbRules {
    /// Whether the health rules are needed (upstream skips them when the client rules cover
    /// the health checks).
    pub fn needs_health(&self) -> bool {
        let open = self.client_cidrs == ["0.0.0.0/0"];
        let tcp = self.clients.iter().all(|(p, _)| p == "tcp");
        let client_ports: BTreeSet<u16> = self.clients.iter().map(|(_, p)| *p).collect();
        let health_ports: BTreeSet<u16> = self.health_ports.iter().copied().collect();
        !(open && tcp && client_ports == health_ports)
    }

    fn wanted(&self, lb_name: &str) -> BTreeSet<IngressRule> {
        let client = format!("{NLB_CLIENT_RULE}={lb_name}");
        let health = format!("{NLB_HEALTH_RULE}={lb_name}");
        let mut out = BTreeSet::new();
        for (protocol, port) in &self.clients {
            for cidr in &self.client_cidrs {
                out.insert(IngressRule {
                    protocol: protocol.clone(),
                    from: i32::from(*port),
                    to: i32::from(*port),
                    cidr: cidr.clone(),
                    description: client.clone(),
                });
            }
        }
        if self.needs_health() {
            for port in &self.health_ports {
                for cidr in &self.health_cidrs {
                    out.insert(IngressRule {
                        protocol: "tcp".into(),
                        from: i32::from(*port),
                        to: i32::from(*port),
                        cidr: cidr.clone(),
                        description: health.clone(),
                    });
                }
            }
        }
        out
    }
}

/// How far a rules pass goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleSync {
    /// The groups `instances` are reached through get exactly the rules; other groups lose
    /// them (`instances` is the whole set).
    Exact,
    /// Only add what the groups of `instances` lack (an incremental host update: `instances`
    /// are the hosts that joined, not the whole set; the next full pass removes the rest).
    GrantOnly,
}

/// Make the nodes' security groups carry exactly `rules` for the NLB `lb_name` reaching
/// `instances` (`None`: remove the NLB's rules everywhere); with [`RuleSync::GrantOnly`] only
/// add the rules the groups of `instances` lack.
pub async fn sync_nlb_rules(
    cx: &AwsContext,
    cluster_id: &str,
    lb_name: &str,
    vpc: Option<&str>,
    instances: &[String],
    rules: Option<&NlbRules>,
    mode: RuleSync,
) -> Result<()> {
    if cx.config.disable_sg_ingress {
        return Ok(());
    }
    // Every group of the VPC when it is known (so a rule left in a group that is no longer
    // used, tagged or not, is found), else the cluster's groups.
    let cluster_tag = [tags::cluster_tag(cluster_id)];
    let listed = match vpc {
        Some(v) => {
            let v = [v.to_string()];
            cx.api
                .describe_security_groups(&[("vpc-id", &v[..])])
                .await?
        }
        None => {
            cx.api
                .describe_security_groups(&[("tag-key", &cluster_tag[..])])
                .await?
        }
    };
    let mut groups: BTreeMap<String, SecurityGroup> =
        listed.into_iter().map(|g| (g.id.clone(), g)).collect();
    let tagged: BTreeSet<String> = groups
        .values()
        .filter(|g| tags::has_cluster_tag(&g.tags, cluster_id))
        .map(|g| g.id.clone())
        .collect();

    // The group each target instance is reached through.
    let used = if rules.is_some() {
        reached_through(cx, instances, &tagged).await?
    } else {
        BTreeSet::new()
    };
    let untagged: Vec<String> = used
        .iter()
        .filter(|g| !groups.contains_key(*g))
        .cloned()
        .collect();
    if !untagged.is_empty() {
        for g in cx
            .api
            .describe_security_groups(&[("group-id", &untagged[..])])
            .await?
        {
            groups.insert(g.id.clone(), g);
        }
    }

    let client = format!("{NLB_CLIENT_RULE}={lb_name}");
    let health = format!("{NLB_HEALTH_RULE}={lb_name}");
    let wanted_here = rules.map(|r| r.wanted(lb_name)).unwrap_or_default();
    for (id, g) in &groups {
        if cx.config.elb_security_group.as_deref() == Some(id.as_str()) {
            continue;
        }
        let wanted: BTreeSet<IngressRule> = if used.contains(id) {
            wanted_here.clone()
        } else if mode == RuleSync::GrantOnly {
            continue;
        } else {
            BTreeSet::new()
        };
        let actual: BTreeSet<IngressRule> = g
            .ingress
            .iter()
            .filter(|r| r.description == client || r.description == health)
            .cloned()
            .collect();
        let add: Vec<IngressRule> = wanted.difference(&actual).cloned().collect();
        let remove: Vec<IngressRule> = if mode == RuleSync::GrantOnly {
            Vec::new()
        } else {
            actual.difference(&wanted).cloned().collect()
        };
        if add.is_empty() && remove.is_empty() {
            continue;
        }
        log::info!(
            "aws: security group {id}: {} rules added, {} removed for load balancer {lb_name}",
            add.len(),
            remove.len()
        );
        cx.api.revoke_ingress(id, &remove).await?;
        authorize(cx, id, &add).await?;

        // The MTU discovery rule: from every IPv4 CIDR with a client rule of any NLB.
        let after: BTreeSet<IngressRule> = g
            .ingress
            .iter()
            .filter(|r| !remove.contains(r))
            .chain(add.iter())
            .cloned()
            .collect();
        let mtu_wanted: BTreeSet<IngressRule> = after
            .iter()
            .filter(|r| r.description.starts_with(&format!("{NLB_CLIENT_RULE}=")))
            .filter(|r| !r.cidr.contains(':'))
            .map(|r| IngressRule {
                protocol: "icmp".into(),
                from: 3,
                to: 4,
                cidr: r.cidr.clone(),
                description: NLB_MTU_RULE.into(),
            })
            .collect();
        let mtu_actual: BTreeSet<IngressRule> = after
            .iter()
            .filter(|r| r.description == NLB_MTU_RULE)
            .cloned()
            .collect();
        let add: Vec<IngressRule> = mtu_wanted.difference(&mtu_actual).cloned().collect();
        let remove: Vec<IngressRule> = mtu_actual.difference(&mtu_wanted).cloned().collect();
        cx.api.revoke_ingress(id, &remove).await?;
        authorize(cx, id, &add).await?;
    }
    Ok(())
}

/// The security group each of `instances` is reached through, as the AWS CCM picks it
/// (`findSecurityGroupForInstance`): its one group in `tagged` (the cluster's), else its only
/// group; two tagged groups are an error, several untagged ones are skipped with a warning.
/// The instances' groups come from what EC2 reported within the last minute, else one lookup.
pub async fn reached_through(
    cx: &AwsContext,
    instances: &[String],
    tagged: &BTreeSet<String>,
) -> Result<BTreeSet<String>> {
    let mut used: BTreeSet<String> = BTreeSet::new();
    if instances.is_empty() {
        return Ok(used);
    }
    let unknown: Vec<Key> = instances
        .iter()
        .filter(|id| cx.known_groups(id).is_none())
        .cloned()
        .map(Key::Id)
        .collect();
    if !unknown.is_empty() {
        cx.lookup(&unknown).await?;
    }
    for id in instances {
        let Some(attached) = cx.known_groups(id) else {
            continue;
        };
        let mine: Vec<&String> = attached.iter().filter(|g| tagged.contains(*g)).collect();
        match (mine.len(), attached.len()) {
            (1, _) => {
                used.insert(mine[0].clone());
            }
            (0, 1) => {
                used.insert(attached[0].clone());
            }
            (0, 0) => log::warn!("aws: instance {id} has no security group"),
            (0, _) => log::warn!(
                "aws: instance {id} has several security groups and none is tagged for the cluster; its load balancer rules are not added"
            ),
            _ => {
                return Err(ProviderError::other(format!(
                    "Multiple tagged security groups found for instance {id}: {}",
                    mine.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )))
            }
        }
    }
    Ok(used)
}

/// The classic ELB's rule on the nodes' groups (`updateInstanceSecurityGroupsForLoadBalancer`):
/// every group `instances` are reached through allows all traffic (protocol `-1`, no ports, no
/// description) from `lb_group`; a cluster-tagged group of the VPC that is no longer used loses
/// it (`instances` empty and `deleting`: every group of the VPC referencing `lb_group` loses it,
/// tagged or not, so that the group can be deleted). Rules are recognised by their source group
/// only, as the AWS CCM recognises them. `ElbSecurityGroup` and `lb_group` itself are never
/// changed; `DisableSecurityGroupIngress` turns it off.
/// With [`RuleSync::GrantOnly`] only the groups of `instances` missing the rule get it.
pub async fn sync_classic_rules(
    cx: &AwsContext,
    cluster_id: &str,
    lb_group: &str,
    vpc: &str,
    instances: &[String],
    deleting: bool,
    mode: RuleSync,
) -> Result<()> {
    if cx.config.disable_sg_ingress {
        return Ok(());
    }
    let v = [vpc.to_string()];
    let groups = cx
        .api
        .describe_security_groups(&[("vpc-id", &v[..])])
        .await?;
    let tagged: BTreeSet<String> = groups
        .iter()
        .filter(|g| tags::has_cluster_tag(&g.tags, cluster_id))
        .map(|g| g.id.clone())
        .collect();
    let used = if deleting {
        BTreeSet::new()
    } else {
        reached_through(cx, instances, &tagged).await?
    };
    let rule = GroupRule {
        protocol: "-1".into(),
        from: -1,
        to: -1,
        group_id: lb_group.to_string(),
    };
    for g in &groups {
        if g.id == lb_group || cx.config.elb_security_group.as_deref() == Some(g.id.as_str()) {
            continue;
        }
        let has = g
            .from_groups
            .iter()
            .any(|r| r.group_id == lb_group && r.protocol == "-1");
        let want = used.contains(&g.id);
        if want && !has {
            log::info!(
                "aws: security group {}: allowing load balancer group {lb_group}",
                g.id
            );
            match cx
                .api
                .authorize_group_ingress(&g.id, std::slice::from_ref(&rule))
                .await
            {
                Err(e) if e.code() == "InvalidPermission.Duplicate" => {}
                other => other?,
            }
        } else if !want && has && mode == RuleSync::Exact && (deleting || tagged.contains(&g.id)) {
            log::info!(
                "aws: security group {}: removing the rule of load balancer group {lb_group}",
                g.id
            );
            match cx
                .api
                .revoke_group_ingress(&g.id, std::slice::from_ref(&rule))
                .await
            {
                Err(e) if e.code() == "InvalidPermission.NotFound" => {}
                other => other?,
            }
        }
    }
    Ok(())
}

/// The name of the AWS CCM's per-ELB security group of a classic ELB.
pub fn elb_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

/// The description the AWS CCM gives it.
pub fn elb_group_description(lb_name: &str, service: &str) -> String {
    format!("Security group for Kubernetes ELB {lb_name} ({service})")
}

/// The per-ELB security group `k8s-elb-<lb_name>` of a classic ELB in `vpc`, found by name
/// (its cluster tag read-repaired, as the AWS CCM does; a group tagged for the cluster with
/// another value than `owned`, e.g. `shared`, is an error) or created with the AWS CCM's
/// description and tags (`kubernetes.io/cluster/<id>=owned` + `additional`). Returns the group
/// and whether it was created.
pub async fn ensure_elb_group(
    cx: &AwsContext,
    cluster_id: &str,
    lb_name: &str,
    service: &str,
    vpc: &str,
    additional: &BTreeMap<String, String>,
) -> Result<(SecurityGroup, bool)> {
    let name = elb_group_name(lb_name);
    if let Some(g) = find_group(cx, &name, vpc).await? {
        let key = tags::cluster_tag(cluster_id);
        match g.tags.get(&key).map(String::as_str) {
            Some(tags::OWNED) => {}
            None => {
                let add: BTreeMap<String, String> = [(key, tags::OWNED.to_string())].into();
                cx.api.create_tags(&g.id, &add).await?;
            }
            Some(other) => {
                return Err(ProviderError::other(format!(
                    "security group {name} ({}) is tagged {key}={other}: resource has tag belonging to another cluster; it is left alone",
                    g.id
                )))
            }
        }
        return Ok((g, false));
    }
    let mut group_tags = additional.clone();
    group_tags.insert(tags::cluster_tag(cluster_id), tags::OWNED.to_string());
    log::info!("aws: creating security group {name} for service {service} in {vpc}");
    let id = match cx
        .api
        .create_security_group(
            &name,
            &elb_group_description(lb_name, service),
            vpc,
            &group_tags,
        )
        .await
    {
        Ok(id) => id,
        // Made meanwhile (another ensure of the same Service): use it.
        Err(e) if e.code() == "InvalidGroup.Duplicate" => {
            return match find_group(cx, &name, vpc).await? {
                Some(g) => Ok((g, false)),
                None => Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    Ok((
        SecurityGroup {
            id,
            name,
            description: elb_group_description(lb_name, service),
            vpc_id: vpc.to_string(),
            ingress: Vec::new(),
            from_groups: Vec::new(),
            tags: group_tags,
        },
        true,
    ))
}

/// The security group named `name` in `vpc`.
pub async fn find_group(cx: &AwsContext, name: &str, vpc: &str) -> Result<Option<SecurityGroup>> {
    let n = [name.to_string()];
    let v = [vpc.to_string()];
    Ok(cx
        .api
        .describe_security_groups(&[("group-name", &n[..]), ("vpc-id", &v[..])])
        .await?
        .into_iter()
        .find(|g| g.name == name))
}

/// Make the ingress of the per-ELB group `g` exactly: each `(protocol, port)` from each of
/// `ranges`, plus ICMP type 3 code 4 ("fragmentation needed", for path MTU discovery) from the
/// same ranges, without descriptions; anything else on it is revoked (the AWS CCM owns the
/// group whole).
pub async fn sync_elb_group_ingress(
    cx: &AwsContext,
    g: &SecurityGroup,
    ports: &[(String, u16)],
    ranges: &[String],
) -> Result<()> {
    let mut wanted: BTreeSet<IngressRule> = BTreeSet::new();
    for cidr in ranges {
        for (protocol, port) in ports {
            wanted.insert(IngressRule {
                protocol: protocol.clone(),
                from: i32::from(*port),
                to: i32::from(*port),
                cidr: cidr.clone(),
                description: String::new(),
            });
        }
        wanted.insert(IngressRule {
            protocol: "icmp".into(),
            from: 3,
            to: 4,
            cidr: cidr.clone(),
            description: String::new(),
        });
    }
    let actual: BTreeSet<IngressRule> = g.ingress.iter().cloned().collect();
    let add: Vec<IngressRule> = wanted.difference(&actual).cloned().collect();
    let remove: Vec<IngressRule> = actual.difference(&wanted).cloned().collect();
    if !add.is_empty() || !remove.is_empty() || !g.from_groups.is_empty() {
        log::info!(
            "aws: security group {}: {} rules added, {} removed",
            g.id,
            add.len(),
            remove.len() + g.from_groups.len()
        );
    }
    cx.api.revoke_ingress(&g.id, &remove).await?;
    cx.api.revoke_group_ingress(&g.id, &g.from_groups).await?;
    authorize(cx, &g.id, &add).await
}

/// Delete the security group `id` if it carries `kubernetes.io/cluster/<id>=owned` (or the
/// legacy tag), trying again every 5 s while AWS answers `DependencyViolation` (the ELB's
/// network interfaces go away a little after the ELB), as the AWS CCM does; the host's call
/// deadline bounds the wait (the next deletion attempt finds the group by name).
pub async fn delete_owned_group(
    cx: &AwsContext,
    cluster_id: &str,
    g: &SecurityGroup,
) -> Result<()> {
    let owned = g
        .tags
        .get(&tags::cluster_tag(cluster_id))
        .map(String::as_str)
        == Some(tags::OWNED)
        || g.tags.get(tags::LEGACY_CLUSTER_TAG).map(String::as_str) == Some(cluster_id);
    if !owned {
        log::info!(
            "aws: security group {} ({}) is not owned by cluster {cluster_id}; left alone",
            g.id,
            g.name
        );
        return Ok(());
    }
    loop {
        match cx.api.delete_security_group(&g.id).await {
            Ok(()) => {
                log::info!("aws: deleted security group {} ({})", g.id, g.name);
                return Ok(());
            }
            Err(e) if e.code() == "DependencyViolation" => {
                log::info!(
                    "aws: security group {} is still in use ({e}); trying again in 5 s",
                    g.id
                );
                tokio::time::sleep(DELETE_RETRY).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Pause between attempts to delete a security group still in use (the AWS CCM's 5 s poll).
pub const DELETE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// AuthorizeSecurityGroupIngress; when AWS answers `InvalidPermission.Duplicate` (the same
/// protocol, ports and source already allowed, e.g. by another rule description), the rules are
/// sent one by one and the duplicates skipped.
pub async fn authorize(cx: &AwsContext, group: &str, rules: &[IngressRule]) -> Result<()> {
    match cx.api.authorize_ingress(group, rules).await {
        Err(e) if e.code() == "InvalidPermission.Duplicate" => {
            for r in rules {
                match cx.api.authorize_ingress(group, std::slice::from_ref(r)).await {
                    Err(e) if e.code() == "InvalidPermission.Duplicate" => log::info!(
                        "aws: security group {group} already allows {} {}-{} from {}; not added as {}",
                        r.protocol,
                        r.from,
                        r.to,
                        r.cidr,
                        r.description
                    ),
                    other => other?,
                }
            }
            Ok(())
        }
        other => Ok(other?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_rules_only_when_the_clients_do_not_cover_them() {
        let mut r = NlbRules {
            clients: vec![("tcp".into(), 30080)],
            client_cidrs: vec!["0.0.0.0/0".into()],
            health_ports: vec![30080],
            health_cidrs: vec!["10.0.1.0/24".into()],
        };
        assert!(!r.needs_health());
        assert_eq!(r.wanted("a1").len(), 1);
        r.client_cidrs = vec!["10.1.0.0/16".into(), "192.168.5.0/24".into()];
        assert!(r.needs_health());
        let w = r.wanted("a1");
        assert_eq!(w.len(), 3);
        assert!(w.iter().any(
            |x| x.description == "kubernetes.io/rule/nlb/health=a1" && x.cidr == "10.0.1.0/24"
        ));
        assert!(w
            .iter()
            .all(|x| x.description.starts_with("kubernetes.io/rule/nlb/")));
    }
}
