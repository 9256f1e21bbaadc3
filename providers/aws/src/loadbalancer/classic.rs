//! LoadBalancer as a classic ELB per Service: the AWS CCM's default (a Service without
//! `service.beta.kubernetes.io/aws-load-balancer-type: nlb`), made as
//! `ensureLoadBalancer` in `pkg/providers/v1/aws_loadbalancer.go` makes it.
//!
//! For a Service `ns/name` with UID `u` and cluster ID `c`:
//! - the ELB is named `a<u without dashes>` (32 characters), in one subnet per zone (as for an
//!   NLB), internal when `aws-load-balancer-internal` is set to anything but `false`;
//! - one listener per TCP port, Service port → NodePort, `tcp`/`tcp`, or with
//!   `aws-load-balancer-ssl-cert` on the `ssl-ports` `ssl`/`tcp` (or the `backend-protocol`
//!   mapping); `backend-protocol: http` without a certificate gives `http`/`http`;
//! - the health check on the first listener's NodePort (`TCP`, `SSL` for an `https`/`ssl`
//!   backend, `HTTP:<healthCheckNodePort>/healthz` for `externalTrafficPolicy: Local`), 2/6/5 s/10 s,
//!   then the `healthcheck-*` annotations;
//! - the attributes: cross-zone off, no access log, no draining, idle timeout 60 s unless the
//!   annotations say otherwise; proxy protocol (`k8s-proxyprotocol-enabled`) and the SSL
//!   negotiation policy (`k8s-SSLNegotiationPolicy-<v>`) as policies;
//! - its security group: the `security-groups` annotation's, else `ElbSecurityGroup`, else the
//!   per-ELB group `k8s-elb-<lb name>` (tags `kubernetes.io/cluster/c=owned` + additional;
//!   ingress exactly the Service ports and ICMP 3/4 from the source ranges); then the
//!   `extra-security-groups`; the nodes' groups allow all traffic from the first of them
//!   ([`crate::securitygroups`]);
//! - the instances registered with `RegisterInstancesWithLoadBalancer` (stopped and terminated
//!   ones never), extra ones deregistered;
//! - tags `kubernetes.io/cluster/c=owned`, `kubernetes.io/service-name=ns/name` and the
//!   additional tags; an ELB of the same name without both ownership tags is left alone.
//!
//! A group the ELB stops using (the annotations changed) is deleted when the cluster owns it.
//! Deletion revokes the nodes' rules, deletes the ELB, then the security groups it used that
//! carry `kubernetes.io/cluster/c=owned` and are neither `ElbSecurityGroup` nor named in the
//! annotations (retrying `DependencyViolation`); a group left by an interrupted deletion is
//! found by its name.
//!
//! Differs from the AWS CCM: an ELB of the same name must carry the ownership tags (the AWS
//! CCM adopts any); `ssl-ports` entries are trimmed; a type change (classic ↔ NLB) is detected
//! when the load balancer is about to be created (the AWS CCM reads the status hostname).

use std::collections::{BTreeMap, BTreeSet};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use super::{Nlbs, Ownership};
use crate::annotations::{
    self, invalid, key_values, parse_bool, parse_range, split_list, ACCESS_LOG_BUCKET,
    ACCESS_LOG_ENABLED, ACCESS_LOG_INTERVAL, ACCESS_LOG_PREFIX, ADDITIONAL_TAGS, BACKEND_PROTOCOL,
    CROSS_ZONE, DRAINING_ENABLED, DRAINING_TIMEOUT, EXTRA_SECURITY_GROUPS, HC_HEALTHY, HC_INTERVAL,
    HC_PATH, HC_PORT, HC_PROTOCOL, HC_TIMEOUT, HC_UNHEALTHY, IDLE_TIMEOUT, INTERNAL,
    PROXY_PROTOCOL, SECURITY_GROUPS, SSL_CERT, SSL_POLICY, SSL_PORTS, SUBNETS, TG_ATTRIBUTES,
};
use crate::api::elb::{
    ClassicAttributes, ClassicElb, ClassicHealthCheck, ClassicListener, NewClassicElb,
};
use crate::config::HealthProbeMode;
use crate::securitygroups::{
    delete_owned_group, elb_group_name, ensure_elb_group, find_group, sync_classic_rules,
    sync_elb_group_ingress, RuleSync,
};
use crate::tags;

/// `defaultElbHCHealthyThreshold`.
pub const ELB_HC_HEALTHY: u32 = 2;
/// `defaultElbHCUnhealthyThreshold`.
pub const ELB_HC_UNHEALTHY: u32 = 6;
/// `defaultElbHCTimeout` (seconds).
pub const ELB_HC_TIMEOUT: u32 = 5;
/// `defaultElbHCInterval` (seconds).
pub const ELB_HC_INTERVAL: u32 = 10;
/// The classic ELB's idle timeout when not annotated (seconds).
pub const ELB_IDLE_TIMEOUT: u32 = 60;
/// `ProxyProtocolPolicyName`.
pub const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";
/// `SSLNegotiationPolicyNameFormat` without its value.
pub const SSL_POLICY_PREFIX: &str = "k8s-SSLNegotiationPolicy-";

/// A Service's classic ELB, as asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassicDesired {
    /// `namespace/name`.
    pub service: String,
    /// Internal instead of internet-facing (at creation only, as with the AWS CCM).
    pub internal: bool,
    /// One listener per port with a NodePort.
    pub listeners: Vec<ClassicListener>,
    /// `(protocol, port)` of every Service port, for the per-ELB group's ingress.
    pub ports: Vec<(String, u16)>,
    /// The health check.
    pub health_check: ClassicHealthCheck,
    /// The attributes.
    pub attributes: ClassicAttributes,
    /// `aws-load-balancer-proxy-protocol: *`.
    pub proxy_protocol: bool,
    /// `aws-load-balancer-ssl-negotiation-policy`.
    pub ssl_policy: Option<String>,
    /// `aws-load-balancer-security-groups` (replace the per-ELB group).
    pub security_groups: Vec<String>,
    /// `aws-load-balancer-extra-security-groups` (appended).
    pub extra_security_groups: Vec<String>,
    /// Extra tags.
    pub additional_tags: BTreeMap<String, String>,
    /// Subnet IDs or Name tags from the annotation.
    pub subnets: Option<Vec<String>>,
    /// Only nodes with all these labels are instances of the ELB.
    pub target_node_labels: BTreeMap<String, String>,
    /// The clients allowed in the per-ELB group.
    pub source_ranges: Vec<String>,
}

/// The AWS CCM's `backendProtocolMapping` (front protocol of an SSL listener by backend).
fn front_protocol(backend: &str) -> Option<&'static str> {
    match backend {
        "https" | "http" => Some("https"),
        "ssl" | "tcp" => Some("ssl"),
        _ => None,
    }
}

impl ClassicDesired {
    /// Read and validate what `service` asks for (`probe`: the config's health probe mode).
    pub fn from_service(service: &Service, probe: &HealthProbeMode) -> Result<Self> {
        let key = annotations::service_key(service);
        let svc = key.as_str();
        let a = service.metadata.annotations.clone().unwrap_or_default();
        let get = |k: &str| a.get(k).map(String::as_str);
        let spec = service.spec.clone().unwrap_or_default();
        let source_ranges = annotations::source_ranges(service, svc)?;
        if spec
            .session_affinity
            .as_deref()
            .is_some_and(|x| x != "None")
        {
            return Err(ProviderError::other(format!(
                "service {svc}: unsupported load balancer affinity: {}",
                spec.session_affinity.as_deref().unwrap_or_default()
            )));
        }
        if spec
            .load_balancer_ip
            .as_deref()
            .is_some_and(|ip| !ip.is_empty())
        {
            return Err(ProviderError::other(format!(
                "service {svc}: LoadBalancerIP cannot be specified for AWS ELB"
            )));
        }
        if let Some(v) = get(TG_ATTRIBUTES) {
            return Err(invalid(
                svc,
                TG_ATTRIBUTES,
                v,
                "target group attributes are for an NLB (aws-load-balancer-type: nlb), not a classic ELB",
            ));
        }
        let internal = get(INTERNAL).is_some_and(|v| !v.is_empty() && v != "false");
        let ports = spec.ports.clone().unwrap_or_default();
        if ports.is_empty() {
            return Err(ProviderError::other(format!(
                "service {svc}: requested load balancer with no ports"
            )));
        }

        // Listeners (buildListener).
        let cert = get(SSL_CERT).filter(|c| !c.is_empty()).map(String::from);
        let ssl_ports: Option<Vec<String>> = get(SSL_PORTS)
            .filter(|v| !v.is_empty() && *v != "*")
            .map(split_list);
        let backend = get(BACKEND_PROTOCOL).unwrap_or("").to_string();
        let mut listeners = Vec::new();
        let mut sg_ports = Vec::new();
        for p in &ports {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            if protocol != "TCP" {
                return Err(ProviderError::other(format!(
                    "service {svc}: Protocol {protocol} not supported by LoadBalancer (a classic ELB takes TCP; use aws-load-balancer-type: nlb for UDP)"
                )));
            }
            sg_ports.push(("tcp".to_string(), p.port as u16));
            let Some(node_port) = p.node_port.filter(|n| *n > 0) else {
                log::warn!(
                    "aws: service {svc}: ignoring port {} without a node port",
                    p.port
                );
                continue;
            };
            let selected = ssl_ports.as_ref().is_none_or(|list| {
                list.iter().any(|s| {
                    *s == p.port.to_string()
                        || p.name.as_ref().is_some_and(|n| *s == n.to_lowercase())
                })
            });
            let (front, back, certificate) = match &cert {
                Some(c) if selected => {
                    if backend.is_empty() {
                        ("ssl".to_string(), "tcp".to_string(), Some(c.clone()))
                    } else {
                        let front = front_protocol(&backend).ok_or_else(|| {
                            invalid(
                                svc,
                                BACKEND_PROTOCOL,
                                &backend,
                                "Invalid backend protocol (https, http, ssl or tcp)",
                            )
                        })?;
                        (front.to_string(), backend.clone(), Some(c.clone()))
                    }
                }
                _ if backend == "http" => ("http".to_string(), "http".to_string(), None),
                _ => ("tcp".to_string(), "tcp".to_string(), None),
            };
            listeners.push(ClassicListener {
                port: p.port as u16,
                protocol: front,
                instance_port: node_port as u16,
                instance_protocol: back,
                certificate,
            });
        }
        let Some(first) = listeners.first() else {
            return Err(ProviderError::other(format!(
                "service {svc}: no port has a node port (instance targets need allocateLoadBalancerNodePorts)"
            )));
        };

        // Health check (ensureLoadBalancerHealthCheck).
        let first_port = first.instance_port;
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let hc_port_annotation = get(HC_PORT).map(str::trim).filter(|v| !v.is_empty());
        let (mut protocol, mut port, mut path) = match (local, spec.health_check_node_port) {
            (true, Some(p)) if p > 0 && hc_port_annotation != Some("traffic-port") => {
                ("HTTP".to_string(), p as u16, "/healthz".to_string())
            }
            _ => match probe {
                HealthProbeMode::Shared { port, path } if !local => {
                    ("HTTP".to_string(), *port, path.clone())
                }
                _ => {
                    let b = backend.to_ascii_lowercase();
                    let p = if b == "https" || b == "ssl" {
                        "SSL"
                    } else {
                        "TCP"
                    };
                    (p.to_string(), first_port, String::new())
                }
            },
        };
        if let Some(p) = get(HC_PROTOCOL).map(str::trim).filter(|v| !v.is_empty()) {
            protocol = match p.to_ascii_uppercase().as_str() {
                x @ ("TCP" | "SSL" | "HTTP" | "HTTPS") => x.to_string(),
                _ => return Err(invalid(svc, HC_PROTOCOL, p, "not TCP, SSL, HTTP or HTTPS")),
            };
        }
        if let Some(p) = hc_port_annotation {
            port = if p == "traffic-port" {
                first_port
            } else {
                parse_range(svc, HC_PORT, p, 1, 65535)? as u16
            };
        }
        if let Some(p) = get(HC_PATH).map(str::trim).filter(|v| !v.is_empty()) {
            if !p.starts_with('/') {
                return Err(invalid(svc, HC_PATH, p, "does not start with /"));
            }
            path = p.to_string();
        }
        let target = if protocol == "HTTP" || protocol == "HTTPS" {
            if path.is_empty() {
                path = "/".into();
            }
            format!("{protocol}:{port}{path}")
        } else {
            format!("{protocol}:{port}")
        };
        let num = |k: &str, lo: u32, hi: u32, default: u32| -> Result<u32> {
            match get(k).map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => parse_range(svc, k, v, lo, hi),
                None => Ok(default),
            }
        };
        let health_check = ClassicHealthCheck {
            target,
            healthy_threshold: num(HC_HEALTHY, 2, 10, ELB_HC_HEALTHY)?,
            unhealthy_threshold: num(HC_UNHEALTHY, 2, 10, ELB_HC_UNHEALTHY)?,
            timeout: num(HC_TIMEOUT, 2, 60, ELB_HC_TIMEOUT)?,
            interval: num(HC_INTERVAL, 5, 300, ELB_HC_INTERVAL)?,
        };
        if health_check.timeout >= health_check.interval {
            return Err(ProviderError::other(format!(
                "service {svc}: health check timeout {} s must be shorter than its interval {} s ({HC_TIMEOUT}, {HC_INTERVAL})",
                health_check.timeout, health_check.interval
            )));
        }

        // Attributes.
        let flag = |k: &str| -> Result<Option<bool>> {
            match get(k).map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => parse_bool(svc, k, v).map(Some),
                None => Ok(None),
            }
        };
        let access_log = flag(ACCESS_LOG_ENABLED)?.unwrap_or(false);
        let draining = flag(DRAINING_ENABLED)?.unwrap_or(false);
        let opt_num = |k: &str, lo: u32, hi: u32| -> Result<Option<u32>> {
            match get(k).map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => parse_range(svc, k, v, lo, hi).map(Some),
                None => Ok(None),
            }
        };
        let access_log_interval = opt_num(ACCESS_LOG_INTERVAL, 5, 60)?;
        if let Some(i) = access_log_interval {
            if i != 5 && i != 60 {
                return Err(invalid(
                    svc,
                    ACCESS_LOG_INTERVAL,
                    &i.to_string(),
                    "the emit interval is 5 or 60 (minutes)",
                ));
            }
        }
        let attributes = ClassicAttributes {
            cross_zone: flag(CROSS_ZONE)?.unwrap_or(false),
            access_log,
            access_log_bucket: get(ACCESS_LOG_BUCKET)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(String::from),
            access_log_prefix: get(ACCESS_LOG_PREFIX)
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(String::from),
            access_log_interval,
            draining,
            draining_timeout: opt_num(DRAINING_TIMEOUT, 1, 3600)?,
            idle_timeout: opt_num(IDLE_TIMEOUT, 1, 4000)?.unwrap_or(ELB_IDLE_TIMEOUT),
        };
        if access_log && attributes.access_log_bucket.is_none() {
            return Err(invalid(
                svc,
                ACCESS_LOG_ENABLED,
                "true",
                format!("needs {ACCESS_LOG_BUCKET}"),
            ));
        }

        let proxy_protocol = match get(PROXY_PROTOCOL) {
            None | Some("") => false,
            Some("*") => true,
            Some(v) => {
                return Err(invalid(
                    svc,
                    PROXY_PROTOCOL,
                    v,
                    "only \"*\" (every backend) is supported",
                ))
            }
        };
        let ssl_policy = get(SSL_POLICY)
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from);
        let sg_list = |k: &str| -> Result<Vec<String>> {
            let list = get(k).map(split_list).unwrap_or_default();
            if let Some(bad) = list.iter().find(|g| !g.starts_with("sg-")) {
                return Err(invalid(
                    svc,
                    k,
                    get(k).unwrap_or_default(),
                    format!("{bad:?} is not a security group ID (sg-...)"),
                ));
            }
            Ok(list)
        };
        let security_groups = sg_list(SECURITY_GROUPS)?;
        let extra_security_groups = sg_list(EXTRA_SECURITY_GROUPS)?;
        let additional_tags = match get(ADDITIONAL_TAGS) {
            Some(v) => key_values(svc, ADDITIONAL_TAGS, v)?,
            None => BTreeMap::new(),
        };
        for k in additional_tags.keys() {
            if k.starts_with(tags::CLUSTER_TAG_PREFIX)
                || k == tags::SERVICE_NAME_TAG
                || k.starts_with("aws:")
            {
                return Err(invalid(
                    svc,
                    ADDITIONAL_TAGS,
                    get(ADDITIONAL_TAGS).unwrap_or_default(),
                    format!("tag {k:?} is reserved (ownership tags are set by the provider)"),
                ));
            }
        }
        let subnets = get(SUBNETS).map(split_list);
        if subnets.as_ref().is_some_and(Vec::is_empty) {
            return Err(invalid(svc, SUBNETS, "", "lists no subnet"));
        }
        Ok(Self {
            service: key.clone(),
            internal,
            listeners,
            ports: sg_ports,
            health_check,
            attributes,
            proxy_protocol,
            ssl_policy,
            security_groups,
            extra_security_groups,
            additional_tags,
            subnets,
            target_node_labels: annotations::target_node_labels(service),
            source_ranges,
        })
    }

    /// Whether `node` is an instance of the ELB.
    pub fn targets_node(&self, node: &Node) -> bool {
        annotations::node_matches(&self.target_node_labels, node)
    }
}

/// Whether the attributes `have` already are what `want` asks (fields `want` leaves unset are
/// not compared).
fn attributes_match(want: &ClassicAttributes, have: &ClassicAttributes) -> bool {
    want.cross_zone == have.cross_zone
        && want.access_log == have.access_log
        && want.draining == have.draining
        && want.idle_timeout == have.idle_timeout
        && (!want.access_log
            || (want.access_log_bucket == have.access_log_bucket
                && (want.access_log_prefix.is_none()
                    || want.access_log_prefix == have.access_log_prefix)
                && (want.access_log_interval.is_none()
                    || want.access_log_interval == have.access_log_interval)))
        && (want.draining_timeout.is_none() || want.draining_timeout == have.draining_timeout)
}

fn status_of(lb: &ClassicElb) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: (!lb.dns_name.is_empty()).then(|| {
            vec![LoadBalancerIngress {
                hostname: Some(lb.dns_name.clone()),
                ..Default::default()
            }]
        }),
    }
}

impl Nlbs {
    /// The classic ELB named `name` and whether it is the Service's.
    pub(super) async fn classic_ownership(
        &self,
        name: &str,
        cluster_id: &str,
        service: &str,
    ) -> Result<Ownership<(ClassicElb, BTreeMap<String, String>)>> {
        let Some(lb) = self.cx.api.describe_classic(name).await? else {
            return Ok(Ownership::Absent);
        };
        let tags = self
            .cx
            .api
            .classic_tags(std::slice::from_ref(&lb.name))
            .await?
            .remove(name)
            .unwrap_or_default();
        if !tags::is_owned_by(&tags, cluster_id, service) {
            return Ok(Ownership::Foreign(super::not_owned(
                name, service, cluster_id,
            )));
        }
        Ok(Ownership::Owned((lb, tags)))
    }

    /// Register the ELB's instances to be exactly `ids` (only `pending`/`running` ones sent).
    async fn sync_classic_instances(&self, lb: &ClassicElb, ids: &[String]) -> Result<()> {
        let have: BTreeSet<&String> = lb.instances.iter().collect();
        let want: BTreeSet<&String> = ids.iter().collect();
        let remove: Vec<String> = have.difference(&want).map(|s| s.to_string()).collect();
        let add: Vec<String> = want.difference(&have).map(|s| s.to_string()).collect();
        if !remove.is_empty() {
            self.cx
                .api
                .deregister_classic_instances(&lb.name, &remove)
                .await?;
        }
        if !add.is_empty() {
            let add: Vec<String> = self
                .registrable(
                    add.into_iter()
                        .map(|id| crate::api::elbv2::Target { id, port: 0 })
                        .collect(),
                )
                .await?
                .into_iter()
                .map(|t| t.id)
                .collect();
            if !add.is_empty() {
                self.cx
                    .api
                    .register_classic_instances(&lb.name, &add)
                    .await?;
            }
        }
        Ok(())
    }

    /// The ELB's security groups and the one the nodes allow (`security-groups` annotation,
    /// else `ElbSecurityGroup`, else the per-ELB group, made exact; then the extras).
    async fn classic_groups(
        &self,
        d: &ClassicDesired,
        cluster_id: &str,
        lb_name: &str,
        vpc: &str,
    ) -> Result<(Vec<String>, String)> {
        let mut groups: Vec<String> = if !d.security_groups.is_empty() {
            d.security_groups.clone()
        } else if let Some(g) = &self.cx.config.elb_security_group {
            vec![g.clone()]
        } else {
            let (g, _) = ensure_elb_group(
                &self.cx,
                cluster_id,
                lb_name,
                &d.service,
                vpc,
                &d.additional_tags,
            )
            .await?;
            sync_elb_group_ingress(&self.cx, &g, &d.ports, &d.source_ranges).await?;
            vec![g.id]
        };
        let lb_group = groups[0].clone();
        for g in &d.extra_security_groups {
            if !groups.contains(g) {
                groups.push(g.clone());
            }
        }
        Ok((groups, lb_group))
    }

    pub(super) async fn ensure_classic(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus> {
        let d = match ClassicDesired::from_service(service, &self.cx.config.health_probe_mode) {
            Ok(d) => d,
            Err(e) => {
                // The configuration cannot be worked out until the Service is fixed; its
                // instances still follow the nodes.
                match self.update_classic(cluster_name, service, nodes).await {
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
        let existing = match self
            .classic_ownership(&name, &cluster_id, &d.service)
            .await?
        {
            Ownership::Owned(found) => Some(found),
            Ownership::Absent => None,
            Ownership::Foreign(e) => return Err(e),
        };
        let vpc = match existing.as_ref().map(|(lb, _)| lb.vpc_id.clone()) {
            Some(v) if !v.is_empty() => v,
            _ => self.vpc(&ids).await?,
        };
        // A type change: nothing is made (not even the ELB's group) while the NLB exists.
        if existing.is_none() && self.cx.api.describe_load_balancer(&name).await?.is_some() {
            return Err(ProviderError::other(format!(
                "service {}: a network load balancer {name} exists; the load balancer type cannot change (delete and re-create the Service, or set aws-load-balancer-type: nlb again)",
                d.service
            )));
        }
        let (groups, lb_group) = self.classic_groups(&d, &cluster_id, &name, &vpc).await?;

        let (lb, created) = match existing {
            None => {
                let subnets = self
                    .subnets(
                        d.subnets.as_deref(),
                        d.internal,
                        &d.service,
                        &vpc,
                        &cluster_id,
                    )
                    .await?;
                let mut resource_tags = d.additional_tags.clone();
                resource_tags.extend(tags::owned_tags(&cluster_id, &d.service));
                log::info!(
                    "aws: creating classic load balancer {name} for service {} in {}",
                    d.service,
                    subnets.join(",")
                );
                let dns_name = self
                    .cx
                    .api
                    .create_classic(
                        &NewClassicElb {
                            name: name.clone(),
                            internal: d.internal,
                            subnets: subnets.clone(),
                            security_groups: groups.clone(),
                            listeners: d.listeners.clone(),
                        },
                        &resource_tags,
                    )
                    .await?;
                let lb = ClassicElb {
                    name: name.clone(),
                    dns_name,
                    scheme: if d.internal {
                        "internal".into()
                    } else {
                        "internet-facing".into()
                    },
                    vpc_id: vpc.clone(),
                    subnets,
                    security_groups: groups.clone(),
                    listeners: d
                        .listeners
                        .iter()
                        .map(|l| (l.clone(), Vec::new()))
                        .collect(),
                    ..Default::default()
                };
                (lb, true)
            }
            Some((mut lb, lb_tags)) => {
                self.sync_classic_config(&d, &mut lb, &lb_tags, &groups, &vpc, &cluster_id)
                    .await?;
                (lb, false)
            }
        };

        // Policies: proxy protocol on the backends, SSL negotiation on the SSL listeners.
        self.sync_classic_policies(&d, &lb).await?;
        if lb.health_check.as_ref() != Some(&d.health_check) {
            self.cx
                .api
                .configure_classic_health_check(&name, &d.health_check)
                .await?;
        }
        let defaults = ClassicAttributes {
            idle_timeout: ELB_IDLE_TIMEOUT,
            ..Default::default()
        };
        if !(created && d.attributes == defaults) {
            let have = self.cx.api.classic_attributes(&name).await?;
            if !attributes_match(&d.attributes, &have) {
                self.cx
                    .api
                    .modify_classic_attributes(&name, &d.attributes)
                    .await?;
            }
        }
        sync_classic_rules(
            &self.cx,
            &cluster_id,
            &lb_group,
            &vpc,
            &ids,
            false,
            RuleSync::Exact,
        )
        .await?;
        self.sync_classic_instances(&lb, &ids).await?;
        Ok(status_of(&lb))
    }

    /// An existing ELB: listeners, subnets, security groups, additional tags.
    async fn sync_classic_config(
        &self,
        d: &ClassicDesired,
        lb: &mut ClassicElb,
        lb_tags: &BTreeMap<String, String>,
        groups: &[String],
        vpc: &str,
        cluster_id: &str,
    ) -> Result<()> {
        let name = lb.name.clone();
        let stale: Vec<u16> = lb
            .listeners
            .iter()
            .filter(|(l, _)| !d.listeners.iter().any(|w| w.same_as(l)))
            .map(|(l, _)| l.port)
            .collect();
        let missing: Vec<ClassicListener> = d
            .listeners
            .iter()
            .filter(|w| !lb.listeners.iter().any(|(l, _)| w.same_as(l)))
            .cloned()
            .collect();
        if !stale.is_empty() {
            log::info!("aws: {name}: deleting the listeners of ports {stale:?}");
            self.cx.api.delete_classic_listeners(&name, &stale).await?;
        }
        if !missing.is_empty() {
            log::info!(
                "aws: {name}: creating {} listeners for service {}",
                missing.len(),
                d.service
            );
            self.cx
                .api
                .create_classic_listeners(&name, &missing)
                .await?;
        }
        if !stale.is_empty() || !missing.is_empty() {
            lb.listeners.retain(|(l, _)| !stale.contains(&l.port));
            lb.listeners
                .extend(missing.into_iter().map(|l| (l, Vec::new())));
        }

        let subnets = self
            .subnets(
                d.subnets.as_deref(),
                d.internal,
                &d.service,
                vpc,
                cluster_id,
            )
            .await?;
        let attach: Vec<String> = subnets
            .iter()
            .filter(|s| !lb.subnets.contains(s))
            .cloned()
            .collect();
        let detach: Vec<String> = lb
            .subnets
            .iter()
            .filter(|s| !subnets.contains(s))
            .cloned()
            .collect();
        self.cx.api.classic_subnets(&name, true, &attach).await?;
        self.cx.api.classic_subnets(&name, false, &detach).await?;

        let have: BTreeSet<&String> = lb.security_groups.iter().collect();
        let want: BTreeSet<&String> = groups.iter().collect();
        if have != want {
            log::info!(
                "aws: {name}: security groups {:?} → {groups:?}",
                lb.security_groups
            );
            self.cx
                .api
                .apply_classic_security_groups(&name, groups)
                .await?;
            // The groups it no longer uses (removeOwnedSecurityGroups): those owned by the
            // cluster lose the nodes' rules referencing them and are deleted; others (given by
            // an annotation or the config) are left as they are.
            let dropped: Vec<String> = lb
                .security_groups
                .iter()
                .filter(|g| !groups.contains(g))
                .cloned()
                .collect();
            lb.security_groups = groups.to_vec();
            if !dropped.is_empty() {
                let found = self
                    .cx
                    .api
                    .describe_security_groups(&[("group-id", &dropped[..])])
                    .await?;
                for g in found.iter().filter(|g| {
                    g.tags
                        .get(&tags::cluster_tag(cluster_id))
                        .map(String::as_str)
                        == Some(tags::OWNED)
                }) {
                    sync_classic_rules(
                        &self.cx,
                        cluster_id,
                        &g.id,
                        vpc,
                        &[],
                        true,
                        RuleSync::Exact,
                    )
                    .await?;
                    delete_owned_group(&self.cx, cluster_id, g).await?;
                }
            }
        }
        let add: BTreeMap<String, String> = d
            .additional_tags
            .iter()
            .filter(|(k, v)| lb_tags.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.cx.api.add_classic_tags(&name, &add).await?;
        Ok(())
    }

    async fn sync_classic_policies(&self, d: &ClassicDesired, lb: &ClassicElb) -> Result<()> {
        let name = &lb.name;
        let proxy = [PROXY_PROTOCOL_POLICY.to_string()];
        if d.proxy_protocol && !lb.policies.iter().any(|p| p == PROXY_PROTOCOL_POLICY) {
            self.cx
                .api
                .create_classic_policy(
                    name,
                    PROXY_PROTOCOL_POLICY,
                    "ProxyProtocolPolicyType",
                    &[("ProxyProtocol", "true")],
                )
                .await?;
        }
        let instance_ports: BTreeSet<u16> = d.listeners.iter().map(|l| l.instance_port).collect();
        for port in &instance_ports {
            let have = lb.backend_policies.get(port).cloned().unwrap_or_default();
            let want: &[String] = if d.proxy_protocol { &proxy } else { &[] };
            if have != want {
                self.cx
                    .api
                    .set_classic_backend_policies(name, *port, want)
                    .await?;
            }
        }
        for (port, have) in &lb.backend_policies {
            if !instance_ports.contains(port) && have.iter().any(|p| p == PROXY_PROTOCOL_POLICY) {
                self.cx
                    .api
                    .set_classic_backend_policies(name, *port, &[])
                    .await?;
            }
        }
        if let Some(v) = &d.ssl_policy {
            let policy = format!("{SSL_POLICY_PREFIX}{v}");
            if !lb.policies.contains(&policy) {
                self.cx
                    .api
                    .create_classic_policy(
                        name,
                        &policy,
                        "SSLNegotiationPolicyType",
                        &[("Reference-Security-Policy", v.as_str())],
                    )
                    .await?;
            }
            let want = [policy];
            for (l, have) in &lb.listeners {
                let secure = l.protocol.eq_ignore_ascii_case("ssl")
                    || l.protocol.eq_ignore_ascii_case("https");
                if secure && have.as_slice() != want {
                    self.cx
                        .api
                        .set_classic_listener_policies(name, l.port, &want)
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// UpdateLoadBalancer of a classic ELB: instances and the nodes' rules follow the nodes.
    /// Reads no annotation but `target-node-labels` (leniently) and the security-group ones.
    pub(super) async fn update_classic(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.classic_ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned((lb, _)) => lb,
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
        self.sync_classic_instances(&lb, &ids).await?;
        if let Some(lb_group) = self.classic_lb_group(service, &lb) {
            sync_classic_rules(
                &self.cx,
                &cluster_id,
                &lb_group,
                &lb.vpc_id,
                &ids,
                false,
                RuleSync::Exact,
            )
            .await?;
        }
        Ok(())
    }

    /// ABI 1.2 incremental host update of a classic ELB: deregister the instances of `removed`,
    /// register those of `added` (with every `target-node-labels` label; running ones only),
    /// against the instances the ELB reports (so both halves are idempotent), and give the
    /// groups of the added instances the rule allowing the ELB (never revoked here: the next
    /// full update does that).
    pub(super) async fn classic_hosts_delta(
        &self,
        cluster_name: &str,
        service: &Service,
        added: &[Node],
        removed: &[Node],
    ) -> Result<()> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.classic_ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned((lb, _)) => lb,
            Ownership::Absent => {
                return Err(ProviderError::not_found(format!(
                    "service {key}: load balancer {name} does not exist"
                )))
            }
            Ownership::Foreign(e) => return Err(e),
        };
        let (add, remove) = self.host_delta(service, added, removed).await?;
        let remove: Vec<String> = remove
            .into_iter()
            .filter(|id| lb.instances.contains(id))
            .collect();
        let add: Vec<String> = add
            .into_iter()
            .filter(|id| !lb.instances.contains(id))
            .collect();
        if !remove.is_empty() {
            self.cx
                .api
                .deregister_classic_instances(&name, &remove)
                .await?;
        }
        if add.is_empty() {
            return Ok(());
        }
        let add: Vec<String> = self
            .registrable(
                add.into_iter()
                    .map(|id| crate::api::elbv2::Target { id, port: 0 })
                    .collect(),
            )
            .await?
            .into_iter()
            .map(|t| t.id)
            .collect();
        if add.is_empty() {
            return Ok(());
        }
        self.cx.api.register_classic_instances(&name, &add).await?;
        if let Some(lb_group) = self.classic_lb_group(service, &lb) {
            sync_classic_rules(
                &self.cx,
                &cluster_id,
                &lb_group,
                &lb.vpc_id,
                &add,
                false,
                RuleSync::GrantOnly,
            )
            .await?;
        }
        Ok(())
    }

    /// The group the nodes allow: the first annotated one, else the first of the ELB's that
    /// is not an extra one.
    fn classic_lb_group(&self, service: &Service, lb: &ClassicElb) -> Option<String> {
        let a = service.metadata.annotations.clone().unwrap_or_default();
        let annotated = a
            .get(SECURITY_GROUPS)
            .map(|v| split_list(v))
            .unwrap_or_default();
        if let Some(g) = annotated.first() {
            return Some(g.clone());
        }
        let extra = a
            .get(EXTRA_SECURITY_GROUPS)
            .map(|v| split_list(v))
            .unwrap_or_default();
        lb.security_groups
            .iter()
            .find(|g| !extra.contains(g))
            .cloned()
    }

    /// EnsureLoadBalancerDeleted of a classic ELB.
    pub(super) async fn delete_classic(&self, cluster_name: &str, service: &Service) -> Result<()> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        let lb = match self.classic_ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned((lb, _)) => Some(lb),
            Ownership::Absent => None,
            Ownership::Foreign(e) => {
                log::warn!("aws: {e}");
                return Ok(());
            }
        };
        let a = service.metadata.annotations.clone().unwrap_or_default();
        let mut keep: BTreeSet<String> = a
            .get(SECURITY_GROUPS)
            .map(|v| split_list(v))
            .unwrap_or_default()
            .into_iter()
            .collect();
        keep.extend(
            a.get(EXTRA_SECURITY_GROUPS)
                .map(|v| split_list(v))
                .unwrap_or_default(),
        );
        keep.extend(self.cx.config.elb_security_group.clone());
        let vpc = lb
            .as_ref()
            .map(|l| l.vpc_id.clone())
            .filter(|v| !v.is_empty())
            .or_else(|| self.cx.config.vpc.clone())
            .or_else(|| self.vpc.lock().expect("vpc").clone());
        // The groups to delete: the ELB's (not kept, owned), and the per-ELB group by name
        // (left by an interrupted deletion).
        let mut candidates = Vec::new();
        if let Some(vpc) = &vpc {
            let ids: Vec<String> = lb
                .as_ref()
                .map(|l| {
                    l.security_groups
                        .iter()
                        .filter(|g| !keep.contains(*g))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            if !ids.is_empty() {
                candidates.extend(
                    self.cx
                        .api
                        .describe_security_groups(&[("group-id", &ids[..])])
                        .await?,
                );
            }
            // (Not asked again when the ELB's groups include it.)
            let own = elb_group_name(&name);
            if !candidates.iter().any(|c| c.name == own) {
                if let Some(g) = find_group(&self.cx, &own, vpc).await? {
                    if !keep.contains(&g.id) {
                        candidates.push(g);
                    }
                }
            }
            // The nodes' rules referencing the groups about to go (all groups of the VPC, so
            // the groups can be deleted), and those of a kept group (tagged groups only).
            let lb_group = lb.as_ref().and_then(|l| self.classic_lb_group(service, l));
            for g in &candidates {
                if tags::has_cluster_tag(&g.tags, &cluster_id) {
                    sync_classic_rules(
                        &self.cx,
                        &cluster_id,
                        &g.id,
                        vpc,
                        &[],
                        true,
                        RuleSync::Exact,
                    )
                    .await?;
                }
            }
            if let Some(lg) = lb_group.filter(|g| !candidates.iter().any(|c| c.id == *g)) {
                sync_classic_rules(&self.cx, &cluster_id, &lg, vpc, &[], false, RuleSync::Exact)
                    .await?;
            }
        }
        if let Some(lb) = &lb {
            log::info!("aws: deleting classic load balancer {name} of service {key}");
            self.cx.api.delete_classic(&lb.name).await?;
        }
        for g in &candidates {
            delete_owned_group(&self.cx, &cluster_id, g).await?;
        }
        Ok(())
    }

    /// The instances of the Service's classic ELB (`None`: no ELB).
    pub(super) async fn classic_hosts(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<Vec<String>>> {
        let key = annotations::service_key(service);
        let cluster_id = self.cx.cluster_id_or(cluster_name).to_string();
        let name = annotations::load_balancer_name(service);
        match self.classic_ownership(&name, &cluster_id, &key).await? {
            Ownership::Owned((lb, _)) => Ok(Some(lb.instances)),
            Ownership::Absent => Ok(None),
            Ownership::Foreign(e) => Err(e),
        }
    }

    /// The status of the Service's classic ELB, if there is one.
    pub(super) async fn classic_status(&self, name: &str) -> Result<Option<LoadBalancerStatus>> {
        Ok(self
            .cx
            .api
            .describe_classic(name)
            .await?
            .map(|lb| status_of(&lb)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(annotations: serde_json::Value, spec: serde_json::Value) -> Service {
        let mut s = json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": [
                {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                {"name": "https", "port": 443, "protocol": "TCP", "nodePort": 30443}
            ]}
        });
        if let serde_json::Value::Object(extra) = spec {
            for (k, v) in extra {
                s["spec"][k] = v;
            }
        }
        serde_json::from_value(s).unwrap()
    }

    fn desired(a: serde_json::Value) -> std::result::Result<ClassicDesired, String> {
        ClassicDesired::from_service(&svc(a, json!({})), &HealthProbeMode::ServiceNodePort)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn classic_defaults_are_the_aws_ccms() {
        let d = desired(json!({})).unwrap();
        assert!(!d.internal);
        assert_eq!(
            d.listeners
                .iter()
                .map(|l| (
                    l.port,
                    l.protocol.as_str(),
                    l.instance_port,
                    l.instance_protocol.as_str()
                ))
                .collect::<Vec<_>>(),
            vec![(80, "tcp", 30080, "tcp"), (443, "tcp", 30443, "tcp")]
        );
        // defaultElbHC*: healthy 2, unhealthy 6, timeout 5, interval 10, TCP on the first
        // listener's NodePort.
        assert_eq!(
            d.health_check,
            ClassicHealthCheck {
                target: "TCP:30080".into(),
                interval: 10,
                timeout: 5,
                healthy_threshold: 2,
                unhealthy_threshold: 6
            }
        );
        assert_eq!(
            d.attributes,
            ClassicAttributes {
                idle_timeout: 60,
                ..Default::default()
            }
        );
        assert!(!d.proxy_protocol && d.ssl_policy.is_none());
        assert_eq!(d.source_ranges, vec!["0.0.0.0/0"]);
        assert_eq!(
            d.ports,
            vec![("tcp".to_string(), 80), ("tcp".to_string(), 443)]
        );
        let local = ClassicDesired::from_service(
            &svc(
                json!({}),
                json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}),
            ),
            &HealthProbeMode::ServiceNodePort,
        )
        .unwrap();
        assert_eq!(local.health_check.target, "HTTP:32100/healthz");
        assert_eq!(
            (
                local.health_check.interval,
                local.health_check.healthy_threshold,
                local.health_check.unhealthy_threshold
            ),
            (10, 2, 6)
        );
        let shared = ClassicDesired::from_service(
            &svc(json!({}), json!({})),
            &HealthProbeMode::Shared {
                port: 10256,
                path: "/healthz".into(),
            },
        )
        .unwrap();
        assert_eq!(shared.health_check.target, "HTTP:10256/healthz");
    }

    #[test]
    fn classic_annotations_are_read_as_the_aws_ccm_reads_them() {
        let d = desired(json!({
            SSL_CERT: "arn:aws:acm:us-east-1:1:certificate/x",
            SSL_PORTS: "https",
            BACKEND_PROTOCOL: "http",
            SSL_POLICY: "ELBSecurityPolicy-TLS-1-2-2017-01",
            PROXY_PROTOCOL: "*",
            CROSS_ZONE: "true",
            DRAINING_ENABLED: "true",
            DRAINING_TIMEOUT: "30",
            IDLE_TIMEOUT: "120",
            ACCESS_LOG_ENABLED: "true",
            ACCESS_LOG_BUCKET: "logs",
            ACCESS_LOG_INTERVAL: "5",
            INTERNAL: "yes",
            HC_PROTOCOL: "http",
            HC_PATH: "/ready",
            HC_INTERVAL: "20",
            EXTRA_SECURITY_GROUPS: "sg-1, sg-2",
        }))
        .unwrap();
        assert!(d.internal);
        // https → https/http with the cert; http (not in ssl-ports) → http/http.
        assert_eq!(d.listeners[0].protocol, "http");
        assert_eq!(d.listeners[0].certificate, None);
        assert_eq!(d.listeners[1].protocol, "https");
        assert_eq!(d.listeners[1].instance_protocol, "http");
        assert!(d.listeners[1].certificate.is_some());
        assert_eq!(d.health_check.target, "HTTP:30080/ready");
        assert_eq!(d.health_check.interval, 20);
        assert!(d.proxy_protocol);
        assert_eq!(
            d.ssl_policy.as_deref(),
            Some("ELBSecurityPolicy-TLS-1-2-2017-01")
        );
        assert!(d.attributes.cross_zone && d.attributes.draining && d.attributes.access_log);
        assert_eq!(d.attributes.draining_timeout, Some(30));
        assert_eq!(d.attributes.idle_timeout, 120);
        assert_eq!(d.extra_security_groups, vec!["sg-1", "sg-2"]);
        // A certificate without backend protocol: ssl/tcp on every port, SSL health check
        // only for an ssl/https backend.
        let d = desired(json!({SSL_CERT: "arn:c"})).unwrap();
        assert!(d
            .listeners
            .iter()
            .all(|l| l.protocol == "ssl" && l.instance_protocol == "tcp"));
        assert_eq!(d.health_check.target, "TCP:30080");
        let d = desired(json!({SSL_CERT: "arn:c", BACKEND_PROTOCOL: "ssl"})).unwrap();
        assert_eq!(d.health_check.target, "SSL:30080");
        // internal=false is internet-facing.
        assert!(!desired(json!({INTERNAL: "false"})).unwrap().internal);

        for (a, needle) in [
            (json!({PROXY_PROTOCOL: "80"}), "only \"*\""),
            (
                json!({SSL_CERT: "arn:c", BACKEND_PROTOCOL: "grpc"}),
                "Invalid backend protocol",
            ),
            (json!({IDLE_TIMEOUT: "soon"}), IDLE_TIMEOUT),
            (json!({HC_INTERVAL: "4"}), "5 to 300"),
            (json!({HC_TIMEOUT: "10"}), "shorter than its interval"),
            (json!({TG_ATTRIBUTES: "x=y"}), "for an NLB"),
            (
                json!({EXTRA_SECURITY_GROUPS: "web"}),
                "not a security group",
            ),
            (json!({DRAINING_ENABLED: "maybe"}), "not a boolean"),
        ] {
            let e = desired(a.clone()).unwrap_err();
            assert!(e.contains(needle), "{a}: {e}");
        }
        let e = ClassicDesired::from_service(
            &svc(
                json!({}),
                json!({"ports": [{"port": 53, "protocol": "UDP", "nodePort": 30053}]}),
            ),
            &HealthProbeMode::ServiceNodePort,
        )
        .unwrap_err();
        assert!(e.to_string().contains("Protocol UDP not supported"), "{e}");
    }

    #[test]
    fn attributes_compare_only_what_is_asked() {
        let want = ClassicAttributes {
            idle_timeout: 60,
            ..Default::default()
        };
        let mut have = want.clone();
        have.draining_timeout = Some(300);
        assert!(attributes_match(&want, &have));
        have.cross_zone = true;
        assert!(!attributes_match(&want, &have));
    }
}
