//! What a LoadBalancer Service asks for: its ports, health checks and the NLB subset of the
//! AWS CCM's `service.beta.kubernetes.io/aws-load-balancer-*` annotations, validated before
//! any change to the load balancer's configuration.
//!
//! As in the AWS CCM, a key this provider does not read (a typo, an AWS Load Balancer
//! Controller key such as `aws-load-balancer-nlb-target-type`, a classic-ELB key) is ignored:
//! [`notices`] lists them for one Warning event per Service. An invalid value of a key it reads
//! is one error naming the key; the load balancer then keeps that key's last valid value
//! (`AwsLoadBalancer::effective_service`), so it blocks only its own change; it never stops the
//! target updates: [`target_node_labels`] is read leniently, so the targets follow the nodes
//! whatever else the Service says.
//!
//! The table of supported keys is in `docs/aws-provider.md`.

use std::collections::{BTreeMap, BTreeSet};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::api::elbv2::HealthCheck;
use crate::config::HealthProbeMode;

/// The prefix of every AWS load-balancer annotation.
pub const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

/// `aws-load-balancer-type`.
pub const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// `aws-load-balancer-internal`.
pub const INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
/// `aws-load-balancer-scheme` (the AWS Load Balancer Controller's spelling).
pub const SCHEME: &str = "service.beta.kubernetes.io/aws-load-balancer-scheme";
/// `aws-load-balancer-cross-zone-load-balancing-enabled`.
pub const CROSS_ZONE: &str =
    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
/// `aws-load-balancer-healthcheck-protocol`.
pub const HC_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
/// `aws-load-balancer-healthcheck-port`.
pub const HC_PORT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
/// `aws-load-balancer-healthcheck-path`.
pub const HC_PATH: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
/// `aws-load-balancer-healthcheck-interval`.
pub const HC_INTERVAL: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
/// `aws-load-balancer-healthcheck-timeout`.
pub const HC_TIMEOUT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
/// `aws-load-balancer-healthcheck-healthy-threshold`.
pub const HC_HEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
/// `aws-load-balancer-healthcheck-unhealthy-threshold`.
pub const HC_UNHEALTHY: &str =
    "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
/// `aws-load-balancer-target-node-labels`.
pub const TARGET_NODE_LABELS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
/// `aws-load-balancer-additional-resource-tags`.
pub const ADDITIONAL_TAGS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
/// `aws-load-balancer-subnets`.
pub const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
/// `aws-load-balancer-eip-allocations`.
pub const EIP_ALLOCATIONS: &str = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
/// `aws-load-balancer-private-ipv4-addresses`.
pub const PRIVATE_IPS: &str = "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses";
/// `aws-load-balancer-ssl-cert`.
pub const SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
/// `aws-load-balancer-ssl-ports`.
pub const SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
/// `aws-load-balancer-ssl-negotiation-policy`.
pub const SSL_POLICY: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
/// `aws-load-balancer-backend-protocol` (`ssl` for TLS to the targets).
pub const BACKEND_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";
/// `aws-load-balancer-target-group-attributes`.
pub const TG_ATTRIBUTES: &str =
    "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
/// `aws-load-balancer-access-log-enabled`.
pub const ACCESS_LOG_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
/// `aws-load-balancer-access-log-s3-bucket-name`.
pub const ACCESS_LOG_BUCKET: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name";
/// `aws-load-balancer-access-log-s3-bucket-prefix`.
pub const ACCESS_LOG_PREFIX: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix";
/// `aws-load-balancer-proxy-protocol` (classic: `*`).
pub const PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
/// `aws-load-balancer-connection-draining-enabled` (classic).
pub const DRAINING_ENABLED: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled";
/// `aws-load-balancer-connection-draining-timeout` (classic).
pub const DRAINING_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout";
/// `aws-load-balancer-connection-idle-timeout` (classic).
pub const IDLE_TIMEOUT: &str =
    "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";
/// `aws-load-balancer-access-log-emit-interval` (classic).
pub const ACCESS_LOG_INTERVAL: &str =
    "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval";
/// `aws-load-balancer-security-groups` (classic: replaces the per-ELB group).
pub const SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
/// `aws-load-balancer-extra-security-groups` (classic: appended).
pub const EXTRA_SECURITY_GROUPS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";
/// `aws-load-balancer-ip-address-type` (`ipv4` / `dualstack`).
pub const IP_ADDRESS_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-ip-address-type";

/// Keys of the AWS CCM that have no effect on an NLB (ignored with a warning, as the AWS CCM
/// ignores them on an NLB), and what to use instead.
const NO_EFFECT: &[(&str, &str)] = &[
    ("proxy-protocol", "classic ELB only; for an NLB use aws-load-balancer-target-group-attributes: proxy_protocol_v2.enabled=true"),
    ("connection-draining-enabled", "classic ELB only"),
    ("connection-draining-timeout", "classic ELB only"),
    ("connection-idle-timeout", "classic ELB only"),
    ("access-log-emit-interval", "classic ELB only"),
];

/// Keys of an NLB that have no effect on a classic ELB (ignored with a warning).
const NLB_ONLY: &[(&str, &str)] = &[
    ("eip-allocations", "NLB only"),
    ("private-ipv4-addresses", "NLB only"),
    (
        "scheme",
        "not read for a classic ELB (use aws-load-balancer-internal)",
    ),
    ("ip-address-type", "NLB only"),
];

/// Keys whose meaning this provider cannot honour: an error (silently dropping a firewall rule
/// would open what the Service restricts).
const REFUSED: &[(&str, &str)] = &[
    (
        "security-groups",
        "this provider puts no security group on a load balancer: classic ELBs and the managed NLB security group are not implemented",
    ),
    (
        "extra-security-groups",
        "this provider puts no security group on a load balancer: classic ELBs are not implemented",
    ),
];

/// Target group attributes the annotation may set.
const TG_ATTRIBUTE_KEYS: &[&str] = &[
    "preserve_client_ip.enabled",
    "proxy_protocol_v2.enabled",
    "deregistration_delay.timeout_seconds",
    "deregistration_delay.connection_termination.enabled",
    "stickiness.enabled",
    "stickiness.type",
];

/// One listener: frontend port → NodePort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    /// The Service port.
    pub port: u16,
    /// The port's name.
    pub name: Option<String>,
    /// Listener protocol: `TCP`, `UDP`, `TLS`.
    pub frontend_protocol: String,
    /// Target group protocol: `TCP`, `UDP`, `TLS`.
    pub target_protocol: String,
    /// The NodePort (the targets' port).
    pub node_port: u16,
    /// Certificate of a TLS listener.
    pub certificate: Option<String>,
    /// SSL policy of a TLS listener.
    pub ssl_policy: Option<String>,
}

/// A Service's load balancer, as asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// `namespace/name`.
    pub service: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Internal instead of internet-facing.
    pub internal: bool,
    /// One entry per listener.
    pub mappings: Vec<PortMapping>,
    /// The health check of every target group.
    pub health_check: HealthCheck,
    /// `load_balancing.cross_zone.enabled`, `access_logs.s3.*`.
    pub lb_attributes: BTreeMap<String, String>,
    /// Target group attributes to set (empty: left as AWS made them).
    pub tg_attributes: BTreeMap<String, String>,
    /// Extra tags for everything created.
    pub additional_tags: BTreeMap<String, String>,
    /// Subnet IDs or Name tags from the annotation.
    pub subnets: Option<Vec<String>>,
    /// EIP allocations, one per subnet.
    pub allocations: Vec<String>,
    /// Private IPv4 addresses, one per subnet.
    pub private_ips: Vec<String>,
    /// `ipv4` or `dualstack`, when asked for.
    pub ip_address_type: Option<String>,
    /// Only nodes with all these labels are targets.
    pub target_node_labels: BTreeMap<String, String>,
    /// The clients allowed to the NodePorts (`spec.loadBalancerSourceRanges`, else the
    /// `load-balancer-source-ranges` annotation, else `0.0.0.0/0`).
    pub source_ranges: Vec<String>,
}

/// `service.beta.kubernetes.io/load-balancer-source-ranges` (core, not `aws-`).
pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Upstream `GetLoadBalancerSourceRanges`: the spec's ranges, else the annotation's (comma
/// list), else `0.0.0.0/0`; an unparsable range is an error. Returned normalised, sorted.
pub fn source_ranges(service: &Service, svc: &str) -> Result<Vec<String>> {
    let spec_ranges = service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.clone())
        .unwrap_or_default();
    let (list, from) = if !spec_ranges.is_empty() {
        (spec_ranges, "spec.loadBalancerSourceRanges")
    } else {
        let a = service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_RANGES))
            .map(|v| split_list(v))
            .unwrap_or_default();
        (a, SOURCE_RANGES)
    };
    if list.is_empty() {
        return Ok(vec!["0.0.0.0/0".into()]);
    }
    let mut out = BTreeSet::new();
    for r in &list {
        let net: ipnet::IpNet = r.trim().parse().map_err(|_| {
            ProviderError::other(format!(
                "service {svc}: {from}: {r:?} is not a CIDR (e.g. 10.0.0.0/8)"
            ))
        })?;
        out.insert(net.trunc().to_string());
    }
    Ok(out.into_iter().collect())
}

/// What the AWS CCM would do with the Service's type annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// `nlb`: a network load balancer.
    Nlb,
    /// No type or any other value: a classic ELB (the AWS CCM's default).
    Classic,
    /// `external` / `nlb-ip`: the AWS Load Balancer Controller's (`ImplementedElsewhere`).
    Elsewhere,
}

pub(crate) fn invalid(
    service: &str,
    key: &str,
    value: &str,
    why: impl std::fmt::Display,
) -> ProviderError {
    ProviderError::other(format!(
        "service {service}: annotation {key}={value:?}: {why}"
    ))
}

/// `service`'s type annotation, read as the AWS CCM reads it: `nlb` is an NLB; `external` /
/// `nlb-ip` are the AWS Load Balancer Controller's; nothing or any other value is a classic ELB
/// (a value other than `classic` is reported by [`notices`]).
pub fn handling(service: &Service) -> Result<Handling> {
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    match annotations.get(TYPE).map(|v| v.trim()) {
        Some("nlb") => Ok(Handling::Nlb),
        Some("external") | Some("nlb-ip") => Ok(Handling::Elsewhere),
        _ => Ok(Handling::Classic),
    }
}

/// What this provider ignores on `service` (one line each, for a Warning event): unknown
/// `aws-load-balancer-*` keys, keys without effect on its load balancer type, a type value it
/// does not know.
pub fn notices(service: &Service) -> Vec<String> {
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    let classic = matches!(handling(service), Ok(Handling::Classic));
    let mut out = Vec::new();
    for (k, v) in &annotations {
        let Some(suffix) = k.strip_prefix(PREFIX) else {
            continue;
        };
        if k == TYPE {
            let t = v.trim();
            if !matches!(t, "" | "nlb" | "external" | "nlb-ip" | "classic") {
                out.push(format!(
                    "annotation {k}={t:?} is not a type this provider knows (nlb, external, nlb-ip); the Service gets a classic ELB, as with the AWS CCM"
                ));
            }
        } else if classic {
            if let Some((_, why)) = NLB_ONLY.iter().find(|(s, _)| *s == suffix) {
                out.push(format!("annotation {k} is ignored: {why}"));
            } else if !CLASSIC_KNOWN.contains(&k.as_str()) {
                out.push(format!(
                    "annotation {k} is not read by this provider and is ignored (docs/aws-provider.md lists the supported ones)"
                ));
            }
        } else if let Some((_, why)) = NO_EFFECT.iter().find(|(s, _)| *s == suffix) {
            out.push(format!("annotation {k} is ignored: {why}"));
        } else if !KNOWN.contains(&k.as_str()) && !REFUSED.iter().any(|(s, _)| *s == suffix) {
            out.push(format!(
                "annotation {k} is not read by this provider and is ignored (docs/aws-provider.md lists the supported ones)"
            ));
        }
    }
    out
}

/// The annotations of `service` that shape its load balancer: every `aws-load-balancer-*` key
/// and `load-balancer-source-ranges`.
pub fn load_balancer_annotations(service: &Service) -> BTreeMap<String, String> {
    service
        .metadata
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with(PREFIX) || k == SOURCE_RANGES)
        .collect()
}

/// `aws-load-balancer-target-node-labels`, read leniently (parts without a key are skipped):
/// the targets follow the nodes even when other annotations are invalid.
pub fn target_node_labels(service: &Service) -> BTreeMap<String, String> {
    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    if let Some(v) = annotations.get(TARGET_NODE_LABELS) {
        for part in split_list(v) {
            let (k, val) = part.split_once('=').unwrap_or((part.as_str(), ""));
            if !k.trim().is_empty() {
                out.insert(k.trim().to_string(), val.trim().to_string());
            }
        }
    }
    out
}

/// Whether `node` carries every label of `labels` (an empty value: the key is enough, as the
/// AWS CCM reads `k` and `k=`).
pub fn node_matches(labels: &BTreeMap<String, String>, node: &Node) -> bool {
    let have = node.metadata.labels.clone().unwrap_or_default();
    labels.iter().all(|(k, v)| match have.get(k) {
        Some(h) => v.is_empty() || h == v,
        None => false,
    })
}

/// `namespace/name`.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or("")
    )
}

/// Upstream `DefaultLoadBalancerName`: `a` + the UID without dashes, at most 32 characters.
pub fn load_balancer_name(service: &Service) -> String {
    let uid: String = service
        .metadata
        .uid
        .as_deref()
        .unwrap_or("")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut name = format!("a{uid}");
    name.truncate(32);
    name
}

pub(crate) fn parse_bool(service: &str, key: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "t" => Ok(true),
        "false" | "0" | "f" => Ok(false),
        _ => Err(invalid(service, key, v, "not a boolean (true or false)")),
    }
}

pub(crate) fn parse_range(service: &str, key: &str, v: &str, lo: u32, hi: u32) -> Result<u32> {
    match v.trim().parse::<u32>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
        _ => Err(invalid(
            service,
            key,
            v,
            format!("not a whole number from {lo} to {hi}"),
        )),
    }
}

pub(crate) fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// `k1=v1,k2=v2` (a key alone has an empty value), as the AWS CCM reads it.
pub(crate) fn key_values(service: &str, key: &str, v: &str) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for part in split_list(v) {
        let (k, val) = part.split_once('=').unwrap_or((part.as_str(), ""));
        let k = k.trim();
        if k.is_empty() {
            return Err(invalid(service, key, v, format!("{part:?} has no key")));
        }
        out.insert(k.to_string(), val.trim().to_string());
    }
    Ok(out)
}

impl Desired {
    /// Read and validate everything `service` asks for. `probe` is the config's health probe
    /// mode.
    pub fn from_service(service: &Service, probe: &HealthProbeMode) -> Result<Self> {
        if handling(service)? == Handling::Elsewhere {
            return Err(ProviderError::implemented_elsewhere());
        }
        let key = service_key(service);
        let svc = key.as_str();
        let annotations = service.metadata.annotations.clone().unwrap_or_default();
        let spec = service.spec.clone().unwrap_or_default();

        for (k, v) in &annotations {
            let Some(suffix) = k.strip_prefix(PREFIX) else {
                continue;
            };
            if let Some((_, why)) = REFUSED.iter().find(|(s, _)| *s == suffix) {
                return Err(invalid(
                    svc,
                    k,
                    v,
                    format!("not supported by this provider ({why})"),
                ));
            }
        }
        let source_ranges = source_ranges(service, svc)?;
        if spec
            .session_affinity
            .as_deref()
            .is_some_and(|a| a != "None")
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
                "service {svc}: spec.loadBalancerIP cannot be specified for an AWS NLB (use {PRIVATE_IPS} or {EIP_ALLOCATIONS})"
            )));
        }
        let get = |k: &str| annotations.get(k).map(String::as_str);

        // Scheme.
        let internal_by_annotation =
            get(INTERNAL).map(|v| !v.trim().is_empty() && v.trim() != "false");
        let internal_by_scheme = match get(SCHEME).map(str::trim) {
            None => None,
            Some("internal") => Some(true),
            Some("internet-facing") => Some(false),
            Some(other) => {
                return Err(invalid(
                    svc,
                    SCHEME,
                    other,
                    "not internal or internet-facing",
                ))
            }
        };
        let internal = match (internal_by_annotation, internal_by_scheme) {
            (Some(a), Some(s)) if a != s => {
                return Err(ProviderError::other(format!(
                    "service {svc}: annotations {INTERNAL} and {SCHEME} disagree"
                )))
            }
            (a, s) => a.or(s).unwrap_or(false),
        };

        // Ports.
        let ports = spec.ports.clone().unwrap_or_default();
        if ports.is_empty() {
            return Err(ProviderError::other(format!(
                "service {svc}: requested load balancer with no ports"
            )));
        }
        let cert = get(SSL_CERT)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from);
        let ssl_ports: Option<Vec<String>> = get(SSL_PORTS).map(split_list);
        let backend_tls = match get(BACKEND_PROTOCOL).map(|v| v.trim().to_ascii_lowercase()) {
            None => false,
            Some(p) if p == "ssl" => true,
            Some(p) if p == "tcp" => false,
            Some(p) => {
                return Err(invalid(
                    svc,
                    BACKEND_PROTOCOL,
                    &p,
                    "an NLB backend protocol is tcp or ssl",
                ))
            }
        };
        let policy = get(SSL_POLICY)
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from);
        let mut mappings: Vec<PortMapping> = Vec::new();
        for p in &ports {
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            if protocol != "TCP" && protocol != "UDP" {
                return Err(ProviderError::other(format!(
                    "service {svc}: port {}: protocol {protocol} is not supported by an NLB (TCP or UDP)",
                    p.port
                )));
            }
            let Some(node_port) = p.node_port.filter(|n| *n > 0) else {
                log::warn!(
                    "aws: service {svc}: ignoring port {} without a node port",
                    p.port
                );
                continue;
            };
            if mappings.iter().any(|m| i32::from(m.port) == p.port) {
                return Err(ProviderError::other(format!(
                    "service {svc}: port {} is listed for two protocols; an NLB listener has one",
                    p.port
                )));
            }
            let tls = protocol == "TCP"
                && cert.is_some()
                && ssl_ports.as_ref().is_none_or(|list| {
                    list.iter()
                        .any(|s| *s == p.port.to_string() || Some(s) == p.name.as_ref())
                });
            mappings.push(PortMapping {
                port: p.port as u16,
                name: p.name.clone(),
                frontend_protocol: if tls { "TLS".into() } else { protocol.clone() },
                target_protocol: if tls && backend_tls {
                    "TLS".into()
                } else {
                    protocol
                },
                node_port: node_port as u16,
                certificate: if tls { cert.clone() } else { None },
                ssl_policy: if tls { policy.clone() } else { None },
            });
        }
        if mappings.is_empty() {
            return Err(ProviderError::other(format!(
                "service {svc}: no port has a node port (instance targets need allocateLoadBalancerNodePorts)"
            )));
        }

        let health_check = health_check(service, svc, &annotations, probe)?;

        // Load balancer attributes (the AWS CCM always sets cross-zone and access logs).
        let mut lb_attributes = BTreeMap::new();
        let cross_zone = match get(CROSS_ZONE) {
            Some(v) if !v.trim().is_empty() => parse_bool(svc, CROSS_ZONE, v)?,
            _ => false,
        };
        lb_attributes.insert(
            "load_balancing.cross_zone.enabled".to_string(),
            cross_zone.to_string(),
        );
        let logs = match get(ACCESS_LOG_ENABLED) {
            Some(v) if !v.trim().is_empty() => parse_bool(svc, ACCESS_LOG_ENABLED, v)?,
            _ => false,
        };
        lb_attributes.insert("access_logs.s3.enabled".to_string(), logs.to_string());
        if logs {
            let bucket = get(ACCESS_LOG_BUCKET).map(str::trim).unwrap_or_default();
            if bucket.is_empty() {
                return Err(invalid(
                    svc,
                    ACCESS_LOG_ENABLED,
                    "true",
                    format!("needs {ACCESS_LOG_BUCKET}"),
                ));
            }
            lb_attributes.insert("access_logs.s3.bucket".to_string(), bucket.to_string());
            lb_attributes.insert(
                "access_logs.s3.prefix".to_string(),
                get(ACCESS_LOG_PREFIX)
                    .map(str::trim)
                    .unwrap_or_default()
                    .to_string(),
            );
        }

        let mut tg_attributes = BTreeMap::new();
        if let Some(v) = get(TG_ATTRIBUTES) {
            for (k, val) in key_values(svc, TG_ATTRIBUTES, v)? {
                if !TG_ATTRIBUTE_KEYS.contains(&k.as_str()) {
                    return Err(invalid(
                        svc,
                        TG_ATTRIBUTES,
                        v,
                        format!(
                            "target group attribute {k:?} is not one of {}",
                            TG_ATTRIBUTE_KEYS.join(", ")
                        ),
                    ));
                }
                if val.is_empty() {
                    return Err(invalid(svc, TG_ATTRIBUTES, v, format!("{k} has no value")));
                }
                tg_attributes.insert(k, val);
            }
        }

        let additional_tags = match get(ADDITIONAL_TAGS) {
            Some(v) => key_values(svc, ADDITIONAL_TAGS, v)?,
            None => BTreeMap::new(),
        };
        for k in additional_tags.keys() {
            if k.starts_with(crate::tags::CLUSTER_TAG_PREFIX)
                || k == crate::tags::SERVICE_NAME_TAG
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
            return Err(invalid(
                svc,
                SUBNETS,
                get(SUBNETS).unwrap_or_default(),
                "lists no subnet",
            ));
        }
        let allocations = get(EIP_ALLOCATIONS).map(split_list).unwrap_or_default();
        if !allocations.is_empty() && internal {
            return Err(invalid(
                svc,
                EIP_ALLOCATIONS,
                get(EIP_ALLOCATIONS).unwrap_or_default(),
                "an internal load balancer has no Elastic IPs",
            ));
        }
        if let Some(bad) = allocations.iter().find(|a| !a.starts_with("eipalloc-")) {
            return Err(invalid(
                svc,
                EIP_ALLOCATIONS,
                get(EIP_ALLOCATIONS).unwrap_or_default(),
                format!("{bad:?} is not an allocation ID (eipalloc-...)"),
            ));
        }
        let private_ips = get(PRIVATE_IPS).map(split_list).unwrap_or_default();
        if !private_ips.is_empty() && !internal {
            return Err(invalid(
                svc,
                PRIVATE_IPS,
                get(PRIVATE_IPS).unwrap_or_default(),
                "only an internal load balancer takes private addresses",
            ));
        }
        if let Some(bad) = private_ips
            .iter()
            .find(|a| a.parse::<std::net::Ipv4Addr>().is_err())
        {
            return Err(invalid(
                svc,
                PRIVATE_IPS,
                get(PRIVATE_IPS).unwrap_or_default(),
                format!("{bad:?} is not an IPv4 address"),
            ));
        }
        if let (Some(s), false) = (&subnets, allocations.is_empty() && private_ips.is_empty()) {
            let n = allocations.len().max(private_ips.len());
            if n != s.len() {
                return Err(ProviderError::other(format!(
                    "service {svc}: {n} addresses for {} subnets: {EIP_ALLOCATIONS} / {PRIVATE_IPS} need one per subnet of {SUBNETS}",
                    s.len()
                )));
            }
        }
        let ip_address_type = match get(IP_ADDRESS_TYPE).map(str::trim) {
            None | Some("") => None,
            Some(t @ ("ipv4" | "dualstack")) => Some(t.to_string()),
            Some(other) => {
                return Err(invalid(
                    svc,
                    IP_ADDRESS_TYPE,
                    other,
                    "not ipv4 or dualstack",
                ))
            }
        };
        let target_node_labels = target_node_labels(service);
        Ok(Self {
            service: key.clone(),
            namespace: service
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: service.metadata.name.clone().unwrap_or_default(),
            internal,
            mappings,
            health_check,
            lb_attributes,
            tg_attributes,
            additional_tags,
            subnets,
            allocations,
            private_ips,
            ip_address_type,
            target_node_labels,
            source_ranges,
        })
    }

    /// Whether `node` is a target (it has every `target-node-labels` label).
    pub fn targets_node(&self, node: &Node) -> bool {
        node_matches(&self.target_node_labels, node)
    }
}

/// Every annotation key this provider reads.
const KNOWN: &[&str] = &[
    TYPE,
    INTERNAL,
    SCHEME,
    CROSS_ZONE,
    HC_PROTOCOL,
    HC_PORT,
    HC_PATH,
    HC_INTERVAL,
    HC_TIMEOUT,
    HC_HEALTHY,
    HC_UNHEALTHY,
    TARGET_NODE_LABELS,
    ADDITIONAL_TAGS,
    SUBNETS,
    EIP_ALLOCATIONS,
    PRIVATE_IPS,
    SSL_CERT,
    SSL_PORTS,
    SSL_POLICY,
    BACKEND_PROTOCOL,
    TG_ATTRIBUTES,
    ACCESS_LOG_ENABLED,
    ACCESS_LOG_BUCKET,
    ACCESS_LOG_PREFIX,
    IP_ADDRESS_TYPE,
];

/// Every annotation key this provider reads for a classic ELB.
const CLASSIC_KNOWN: &[&str] = &[
    TYPE,
    INTERNAL,
    PROXY_PROTOCOL,
    ACCESS_LOG_INTERVAL,
    ACCESS_LOG_ENABLED,
    ACCESS_LOG_BUCKET,
    ACCESS_LOG_PREFIX,
    DRAINING_ENABLED,
    DRAINING_TIMEOUT,
    IDLE_TIMEOUT,
    CROSS_ZONE,
    SECURITY_GROUPS,
    EXTRA_SECURITY_GROUPS,
    SSL_CERT,
    SSL_PORTS,
    SSL_POLICY,
    BACKEND_PROTOCOL,
    ADDITIONAL_TAGS,
    HC_PROTOCOL,
    HC_PORT,
    HC_PATH,
    HC_INTERVAL,
    HC_TIMEOUT,
    HC_HEALTHY,
    HC_UNHEALTHY,
    TARGET_NODE_LABELS,
    SUBNETS,
    TG_ATTRIBUTES,
];

/// The AWS CCM's `defaultNlbHealthCheckInterval` (`pkg/providers/v1/aws_loadbalancer.go`).
pub const NLB_HC_INTERVAL: u32 = 30;
/// `defaultNlbHealthCheckTimeout` (the AWS CCM never sends it; sent here, equal to AWS's
/// default for a TCP check of an NLB).
pub const NLB_HC_TIMEOUT: u32 = 10;
/// `defaultNlbHealthCheckThreshold` (healthy and unhealthy).
pub const NLB_HC_THRESHOLD: u32 = 3;

/// The AWS CCM's NLB health check (`buildNLBHealthCheckConfiguration`): TCP on the traffic
/// port (interval 30 s, timeout 10 s, thresholds 3/3), HTTP `/healthz` on the health check node
/// port for `externalTrafficPolicy: Local` (interval 10 s, timeout 10 s, thresholds 2/2),
/// kube-proxy's endpoint in the `Shared` probe mode, then the annotations.
fn health_check(
    service: &Service,
    svc: &str,
    annotations: &BTreeMap<String, String>,
    probe: &HealthProbeMode,
) -> Result<HealthCheck> {
    let spec = service.spec.clone().unwrap_or_default();
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let mut hc = if local {
        let port = spec
            .health_check_node_port
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                ProviderError::other(format!(
                    "service {svc}: externalTrafficPolicy Local without spec.healthCheckNodePort"
                ))
            })?;
        HealthCheck {
            protocol: "HTTP".into(),
            port: port.to_string(),
            path: Some("/healthz".into()),
            interval: 10,
            timeout: 10,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        }
    } else {
        match probe {
            HealthProbeMode::ServiceNodePort => HealthCheck {
                protocol: "TCP".into(),
                port: "traffic-port".into(),
                path: None,
                interval: NLB_HC_INTERVAL,
                timeout: NLB_HC_TIMEOUT,
                healthy_threshold: NLB_HC_THRESHOLD,
                unhealthy_threshold: NLB_HC_THRESHOLD,
            },
            HealthProbeMode::Shared { port, path } => HealthCheck {
                protocol: "HTTP".into(),
                port: port.to_string(),
                path: Some(path.clone()),
                interval: NLB_HC_INTERVAL,
                timeout: NLB_HC_TIMEOUT,
                healthy_threshold: NLB_HC_THRESHOLD,
                unhealthy_threshold: NLB_HC_THRESHOLD,
            },
        }
    };
    let get = |k: &str| {
        annotations
            .get(k)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    };
    if let Some(p) = get(HC_PROTOCOL) {
        hc.protocol = match p.to_ascii_uppercase().as_str() {
            "TCP" => "TCP".into(),
            "HTTP" => "HTTP".into(),
            "HTTPS" => "HTTPS".into(),
            _ => return Err(invalid(svc, HC_PROTOCOL, p, "not TCP, HTTP or HTTPS")),
        };
    }
    if hc.protocol == "TCP" {
        hc.path = None;
    } else {
        if let Some(path) = get(HC_PATH) {
            if !path.starts_with('/') {
                return Err(invalid(svc, HC_PATH, path, "does not start with /"));
            }
            hc.path = Some(path.to_string());
        }
        if hc.path.is_none() {
            hc.path = Some("/".into());
        }
    }
    if let Some(p) = get(HC_PORT) {
        hc.port = if p == "traffic-port" {
            p.to_string()
        } else {
            parse_range(svc, HC_PORT, p, 1, 65535)?.to_string()
        };
    }
    if let Some(v) = get(HC_INTERVAL) {
        hc.interval = parse_range(svc, HC_INTERVAL, v, 5, 300)?;
    }
    if let Some(v) = get(HC_TIMEOUT) {
        hc.timeout = parse_range(svc, HC_TIMEOUT, v, 2, 120)?;
    }
    if let Some(v) = get(HC_HEALTHY) {
        hc.healthy_threshold = parse_range(svc, HC_HEALTHY, v, 2, 10)?;
    }
    if let Some(v) = get(HC_UNHEALTHY) {
        hc.unhealthy_threshold = parse_range(svc, HC_UNHEALTHY, v, 2, 10)?;
    }
    if hc.timeout > hc.interval {
        return Err(ProviderError::other(format!(
            "service {svc}: health check timeout {} s is longer than its interval {} s ({HC_TIMEOUT}, {HC_INTERVAL})",
            hc.timeout, hc.interval
        )));
    }
    Ok(hc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(annotations: serde_json::Value, spec: serde_json::Value) -> Service {
        let mut s = json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "1234-5678-90ab-cdef-1234-5678-90ab-cdef", "annotations": annotations},
            "spec": {"type": "LoadBalancer", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}
        });
        if let serde_json::Value::Object(extra) = spec {
            for (k, v) in extra {
                s["spec"][k] = v;
            }
        }
        serde_json::from_value(s).unwrap()
    }

    fn desired(a: serde_json::Value) -> std::result::Result<Desired, String> {
        Desired::from_service(&svc(a, json!({})), &HealthProbeMode::ServiceNodePort)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_follow_the_aws_ccm() {
        let d = desired(json!({})).unwrap();
        assert!(!d.internal);
        assert_eq!(d.service, "shop/web");
        assert_eq!(d.mappings.len(), 1);
        assert_eq!(d.mappings[0].frontend_protocol, "TCP");
        assert_eq!(d.mappings[0].node_port, 30080);
        assert_eq!(d.health_check.protocol, "TCP");
        assert_eq!(d.health_check.port, "traffic-port");
        // defaultNlbHealthCheckInterval / Timeout / Threshold.
        let hc = &d.health_check;
        assert_eq!(
            (
                hc.interval,
                hc.timeout,
                hc.healthy_threshold,
                hc.unhealthy_threshold,
                hc.path.as_deref()
            ),
            (30, 10, 3, 3, None)
        );
        assert_eq!(
            d.lb_attributes["load_balancing.cross_zone.enabled"],
            "false"
        );
        assert_eq!(
            load_balancer_name(&svc(json!({}), json!({}))),
            "a1234567890abcdef1234567890abcde"
        );

        let local = Desired::from_service(
            &svc(
                json!({}),
                json!({"externalTrafficPolicy": "Local", "healthCheckNodePort": 32100}),
            ),
            &HealthProbeMode::ServiceNodePort,
        )
        .unwrap();
        assert_eq!(local.health_check.protocol, "HTTP");
        assert_eq!(local.health_check.port, "32100");
        assert_eq!(local.health_check.path.as_deref(), Some("/healthz"));
        let hc = &local.health_check;
        assert_eq!(
            (
                hc.interval,
                hc.timeout,
                hc.healthy_threshold,
                hc.unhealthy_threshold
            ),
            (10, 10, 2, 2)
        );
    }

    #[test]
    fn annotations_are_read() {
        let d = desired(json!({
            INTERNAL: "true",
            CROSS_ZONE: "true",
            HC_PROTOCOL: "http",
            HC_PATH: "/ready",
            HC_INTERVAL: "30",
            HC_TIMEOUT: "6",
            HC_HEALTHY: "5",
            TARGET_NODE_LABELS: "role=edge,zone",
            ADDITIONAL_TAGS: "team=shop, cost=42",
            SUBNETS: "subnet-1, private-a",
            PRIVATE_IPS: "10.0.1.10,10.0.2.10",
            TG_ATTRIBUTES: "proxy_protocol_v2.enabled=true",
            SSL_CERT: "arn:aws:acm:us-east-1:1:certificate/x",
            SSL_PORTS: "http",
        }))
        .unwrap();
        assert!(d.internal);
        assert_eq!(d.health_check.protocol, "HTTP");
        assert_eq!(d.health_check.path.as_deref(), Some("/ready"));
        assert_eq!(
            (
                d.health_check.interval,
                d.health_check.timeout,
                d.health_check.healthy_threshold
            ),
            (30, 6, 5)
        );
        assert_eq!(
            d.target_node_labels,
            [
                ("role".to_string(), "edge".to_string()),
                ("zone".to_string(), String::new())
            ]
            .into()
        );
        assert_eq!(d.additional_tags["cost"], "42");
        assert_eq!(
            d.subnets.as_deref(),
            Some(&["subnet-1".to_string(), "private-a".to_string()][..])
        );
        assert_eq!(d.tg_attributes["proxy_protocol_v2.enabled"], "true");
        assert_eq!(d.lb_attributes["load_balancing.cross_zone.enabled"], "true");
        assert_eq!(d.mappings[0].frontend_protocol, "TLS");
        assert_eq!(d.mappings[0].target_protocol, "TCP");
        let d = desired(json!({SCHEME: "internal"})).unwrap();
        assert!(d.internal);
    }

    #[test]
    fn invalid_and_unsupported_annotations_name_the_key() {
        let e = desired(json!({HC_INTERVAL: "soon"})).unwrap_err();
        assert!(
            e.contains(HC_INTERVAL) && e.contains("\"soon\"") && e.contains("5 to 300"),
            "{e}"
        );
        let e = desired(
            json!({"service.beta.kubernetes.io/aws-load-balancer-security-groups": "sg-1"}),
        )
        .unwrap_err();
        assert!(e.contains("aws-load-balancer-security-groups"), "{e}");
    }

    #[test]
    fn unknown_keys_and_classic_only_keys_are_ignored_with_a_notice() {
        let a = json!({
            "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "instance",
            "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol": "*",
            TYPE: "nlb",
            HC_INTERVAL: "30",
            "example.com/other": "x",
        });
        let d = desired(a.clone()).unwrap();
        assert_eq!(d.health_check.interval, 30);
        let s = svc(a, json!({}));
        assert_eq!(handling(&s).unwrap(), Handling::Nlb);
        let n = notices(&s);
        assert_eq!(n.len(), 2, "{n:?}");
        assert!(n
            .iter()
            .any(|l| l.contains("nlb-target-type") && l.contains("ignored")));
        assert!(n
            .iter()
            .any(|l| l.contains("proxy-protocol") && l.contains("proxy_protocol_v2")));
        // Without `nlb` the Service is a classic ELB, as with the AWS CCM: its keys are read,
        // NLB-only keys and unknown types are named.
        let s = svc(
            json!({
                TYPE: "clasic",
                "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol": "*",
                EIP_ALLOCATIONS: "eipalloc-1",
            }),
            json!({}),
        );
        assert_eq!(handling(&s).unwrap(), Handling::Classic);
        let n = notices(&s);
        assert_eq!(n.len(), 2, "{n:?}");
        assert!(n.iter().any(|l| l.contains("\"clasic\"")));
        assert!(n.iter().any(|l| l.contains("eip-allocations")));
        assert_eq!(
            handling(&svc(json!({}), json!({}))).unwrap(),
            Handling::Classic
        );
        assert!(notices(&svc(json!({HC_INTERVAL: "soon"}), json!({}))).is_empty());
        // Lenient label filter: a part without a key is skipped; `k` alone means "has k".
        let s = svc(json!({TARGET_NODE_LABELS: "=x,role=edge,zone"}), json!({}));
        let labels = target_node_labels(&s);
        assert_eq!(labels.len(), 2);
        let node: Node = serde_json::from_value(
            json!({"metadata": {"name": "n", "labels": {"role": "edge", "zone": "a"}}}),
        )
        .unwrap();
        assert!(node_matches(&labels, &node));
        assert_eq!(
            handling(&svc(json!({TYPE: "external"}), json!({}))).unwrap(),
            Handling::Elsewhere
        );
        let e = desired(json!({INTERNAL: "true", SCHEME: "internet-facing"})).unwrap_err();
        assert!(e.contains("disagree"), "{e}");
        let e = desired(json!({ADDITIONAL_TAGS: "kubernetes.io/cluster/x=owned"})).unwrap_err();
        assert!(e.contains("reserved"), "{e}");
        let e = desired(json!({EIP_ALLOCATIONS: "eipalloc-1", SUBNETS: "subnet-1,subnet-2"}))
            .unwrap_err();
        assert!(e.contains("1 addresses for 2 subnets"), "{e}");
        let e = desired(json!({TG_ATTRIBUTES: "bogus=1"})).unwrap_err();
        assert!(e.contains("\"bogus\""), "{e}");
        let e = desired(json!({HC_TIMEOUT: "40"})).unwrap_err();
        assert!(e.contains("longer than its interval"), "{e}");
        let e = Desired::from_service(
            &svc(
                json!({}),
                json!({"loadBalancerSourceRanges": ["10.0.0.0/8", "nope"]}),
            ),
            &HealthProbeMode::ServiceNodePort,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("loadBalancerSourceRanges: \"nope\""),
            "{e}"
        );
        let d = Desired::from_service(
            &svc(
                json!({SOURCE_RANGES: "192.168.5.7/24, 10.1.0.0/16"}),
                json!({}),
            ),
            &HealthProbeMode::ServiceNodePort,
        )
        .unwrap();
        assert_eq!(d.source_ranges, vec!["10.1.0.0/16", "192.168.5.0/24"]);
        assert_eq!(desired(json!({})).unwrap().source_ranges, vec!["0.0.0.0/0"]);
        let e = Desired::from_service(
            &svc(json!({}), json!({"ports": [{"port": 53, "protocol": "UDP", "nodePort": 30053}, {"port": 53, "protocol": "TCP", "nodePort": 30054}]})),
            &HealthProbeMode::ServiceNodePort,
        )
        .unwrap_err();
        assert!(e
            .to_string()
            .contains("port 53 is listed for two protocols"));
    }
}
