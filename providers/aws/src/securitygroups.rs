//! The nodes' security-group rules of an NLB, as the AWS CCM manages them
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

use crate::api::ec2::{IngressRule, SecurityGroup};
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

/// Make the nodes' security groups carry exactly `rules` for the NLB `lb_name` reaching
/// `instances` (`None`: remove the NLB's rules everywhere).
pub async fn sync_nlb_rules(
    cx: &AwsContext,
    cluster_id: &str,
    lb_name: &str,
    vpc: Option<&str>,
    instances: &[String],
    rules: Option<&NlbRules>,
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
    let mut used: BTreeSet<String> = BTreeSet::new();
    if rules.is_some() && !instances.is_empty() {
        // Groups read within the last minute (by any lookup of the provider), else asked now.
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
                    "aws: instance {id} has several security groups and none is tagged for the cluster; its NodePorts are not opened"
                ),
                _ => {
                    return Err(ProviderError::other(format!(
                        "Multiple tagged security groups found for instance {id}: {}",
                        mine.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                    )))
                }
            }
        }
    }
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
        let remove: Vec<IngressRule> = actual.difference(&wanted).cloned().collect();
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

/// AuthorizeSecurityGroupIngress; when AWS answers `InvalidPermission.Duplicate` (the same
/// protocol, ports and source already allowed, e.g. by another rule description), the rules are
/// sent one by one and the duplicates skipped.
async fn authorize(cx: &AwsContext, group: &str, rules: &[IngressRule]) -> Result<()> {
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
