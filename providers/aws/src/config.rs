//! The cloud config: the AWS cloud-controller-manager's INI format (gcfg), read strictly.
//!
//! ```ini
//! [Global]
//! Zone = us-east-1a
//! KubernetesClusterID = prod
//! RouteTableID = rtb-0123456789abcdef0
//! NodeIPFamilies = ipv4
//!
//! [ServiceOverride "ec2"]
//! Service = ec2
//! Region = us-east-1
//! URL = http://127.0.0.1:5000
//! SigningRegion = us-east-1
//! ```
//!
//! Names of sections and keys are case-insensitive, as in gcfg. A key this provider does not
//! know, a section other than `[Global]` and `[ServiceOverride "N"]`, a malformed line or an
//! invalid value is one error naming the key and its line. Keys of the AWS CCM that configure
//! something this provider does not do (classic ELB security groups, instance topology) are
//! accepted and reported by [`AwsConfig::ignored`], so an existing AWS CCM config keeps working.
//! Reference: `docs/aws-provider.md`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ccm_provider_abi::ProviderError;

/// Address families of the node addresses, in order (`NodeIPFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// `ipv4`: private IPs of the in-use interfaces, public IP, DNS names.
    V4,
    /// `ipv6`: the first IPv6 address of each in-use interface.
    V6,
}

/// `ClusterServiceLoadBalancerHealthProbeMode`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthProbeMode {
    /// `ServiceNodePort` (default): TCP on each port's NodePort (HTTP on the health check node
    /// port for `externalTrafficPolicy: Local`).
    ServiceNodePort,
    /// `Shared`: every cluster-policy service probes kube-proxy's health endpoint over HTTP.
    Shared {
        /// `ClusterServiceSharedLoadBalancerHealthProbePort` (default 10256).
        port: u16,
        /// `ClusterServiceSharedLoadBalancerHealthProbePath` (default `/healthz`).
        path: String,
    },
}

/// One `[ServiceOverride "N"]` section: a custom endpoint for one AWS service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOverride {
    /// The section's label (`N`).
    pub label: String,
    /// `Service`: `ec2`, `elasticloadbalancing` (or `elbv2`), `sts`.
    pub service: String,
    /// `Region`: the override applies when the provider's region is this one.
    pub region: String,
    /// `URL`: the endpoint (`http://` is allowed, for emulators such as moto).
    pub url: String,
    /// `SigningRegion`.
    pub signing_region: String,
    /// `SigningName`: the SigV4 service name, when it differs from the service's own.
    pub signing_name: Option<String>,
}

/// The parsed cloud config.
#[derive(Debug, Clone, PartialEq)]
pub struct AwsConfig {
    /// `Zone`: the zone of the cluster (its region is the zone without its last letter).
    pub zone: Option<String>,
    /// `Region`: the AWS region; else derived from `Zone`, else the SDK's region chain
    /// (`AWS_REGION`, profile, IMDS).
    pub region: Option<String>,
    /// `VPC`: the cluster's VPC (subnet discovery); else the VPC of the first target instance.
    pub vpc: Option<String>,
    /// `SubnetID`: the subnet used for load balancers when no tagged subnet is found.
    pub subnet_id: Option<String>,
    /// `DisableSecurityGroupIngress`: never add or remove rules in the nodes' security groups.
    pub disable_sg_ingress: bool,
    /// `ElbSecurityGroup`: a security group whose rules are never changed.
    pub elb_security_group: Option<String>,
    /// `RouteTableID`: the route table(s) of the pod routes (comma-separated list allowed);
    /// else every table of the VPC tagged with the cluster tag.
    pub route_table_ids: Vec<String>,
    /// `RoleARN`: assume this IAM role with the chain's credentials.
    pub role_arn: Option<String>,
    /// `KubernetesClusterID` (or the legacy `KubernetesClusterTag`): the cluster's tag value.
    pub cluster_id: Option<String>,
    /// `NodeIPFamilies` (default `ipv4`).
    pub node_ip_families: Vec<IpFamily>,
    /// `ClusterServiceLoadBalancerHealthProbeMode` and its port and path.
    pub health_probe_mode: HealthProbeMode,
    /// `[ServiceOverride "N"]` sections.
    pub overrides: Vec<ServiceOverride>,
    /// ccm-host addition `SharedCredentialsFile`: the shared credentials file to read instead
    /// of `AWS_SHARED_CREDENTIALS_FILE` / `~/.aws/credentials`.
    pub shared_credentials_file: Option<PathBuf>,
    /// ccm-host addition `SharedConfigFile`: instead of `AWS_CONFIG_FILE` / `~/.aws/config`.
    pub shared_config_file: Option<PathBuf>,
    /// ccm-host addition `Profile`: the profile to use instead of `AWS_PROFILE` / `default`.
    pub profile: Option<String>,
    /// AWS CCM keys accepted without effect, with the reason (logged at start).
    ignored: Vec<String>,
}

impl Default for AwsConfig {
    fn default() -> Self {
        Self {
            zone: None,
            region: None,
            vpc: None,
            subnet_id: None,
            disable_sg_ingress: false,
            elb_security_group: None,
            route_table_ids: Vec::new(),
            role_arn: None,
            cluster_id: None,
            node_ip_families: vec![IpFamily::V4],
            health_probe_mode: HealthProbeMode::ServiceNodePort,
            overrides: Vec::new(),
            shared_credentials_file: None,
            shared_config_file: None,
            profile: None,
            ignored: Vec::new(),
        }
    }
}

/// Keys of the AWS CCM's `[Global]` accepted without effect here, and why.
const IGNORED_GLOBAL: &[(&str, &str)] = &[
    (
        "nlbsecuritygroupmode",
        "this provider never creates security groups for NLBs",
    ),
    (
        "supportedtopologyinstancetypepattern",
        "instance topology labels are not implemented",
    ),
];

fn bad(line: usize, msg: impl std::fmt::Display) -> ProviderError {
    ProviderError::invalid_config(format!("aws cloud config line {line}: {msg}"))
}

/// One `key = value` of the file, with its line.
struct Entry {
    line: usize,
    key: String,
    value: String,
}

enum Section {
    Global,
    Override,
}

impl AwsConfig {
    /// Parse the `--cloud-config` bytes (`None` or empty: every default).
    pub fn parse(bytes: Option<&[u8]>) -> Result<Self, ProviderError> {
        let Some(bytes) = bytes else {
            return Ok(Self::default());
        };
        let text = std::str::from_utf8(bytes).map_err(|e| {
            ProviderError::invalid_config(format!("aws cloud config is not UTF-8: {e}"))
        })?;
        let mut global: Vec<Entry> = Vec::new();
        let mut overrides: Vec<(String, usize, Vec<Entry>)> = Vec::new();
        let mut section: Option<Section> = None;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let l = raw.trim();
            if l.is_empty() || l.starts_with(';') || l.starts_with('#') {
                continue;
            }
            if let Some(rest) = l.strip_prefix('[') {
                let inner = strip_comment(rest)
                    .trim_end()
                    .strip_suffix(']')
                    .ok_or_else(|| bad(line, format!("section header {l:?} does not end with ]")))?
                    .trim();
                let (name, label) = match inner.split_once(char::is_whitespace) {
                    Some((n, rest)) => (n, Some(rest.trim())),
                    None => (inner, None),
                };
                section = Some(match (name.to_ascii_lowercase().as_str(), label) {
                    ("global", None) => Section::Global,
                    ("serviceoverride", Some(label)) => {
                        let label = unquote(label)
                            .filter(|s| !s.is_empty())
                            .ok_or_else(|| {
                                bad(line, format!("section [{inner}]: the label must be a quoted name, as in [ServiceOverride \"1\"]"))
                            })?;
                        if overrides.iter().any(|(l, _, _)| *l == label) {
                            return Err(bad(
                                line,
                                format!("section [ServiceOverride {label:?}] appears twice"),
                            ));
                        }
                        overrides.push((label.clone(), line, Vec::new()));
                        Section::Override
                    }
                    ("serviceoverride", None) => return Err(bad(
                        line,
                        "section [ServiceOverride] needs a label, as in [ServiceOverride \"1\"]",
                    )),
                    _ => {
                        return Err(bad(
                            line,
                            format!(
                            "unknown section [{inner}] (known: [Global], [ServiceOverride \"N\"])"
                        ),
                        ))
                    }
                });
                continue;
            }
            let Some(current) = &section else {
                return Err(bad(
                    line,
                    format!("{l:?} is outside any section (start with [Global])"),
                ));
            };
            let (key, value) = match l.split_once('=') {
                Some((k, v)) => (k.trim(), parse_value(v).map_err(|e| bad(line, e))?),
                // gcfg: a key alone is a boolean true.
                None => (strip_comment(l).trim(), "true".to_string()),
            };
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(bad(line, format!("{key:?} is not a key name")));
            }
            let entry = Entry {
                line,
                key: key.to_string(),
                value,
            };
            match current {
                Section::Global => global.push(entry),
                Section::Override => overrides.last_mut().expect("section pushed").2.push(entry),
            }
        }

        let mut cfg = Self::default();
        cfg.apply_global(global)?;
        for (label, line, entries) in overrides {
            cfg.overrides.push(parse_override(label, line, entries)?);
        }
        let mut seen = BTreeMap::new();
        for o in &cfg.overrides {
            if let Some(other) = seen.insert((o.service.clone(), o.region.clone()), o.label.clone())
            {
                return Err(ProviderError::invalid_config(format!(
                    "aws cloud config: [ServiceOverride {:?}] and [ServiceOverride {other:?}] both override {} in {}",
                    o.label, o.service, o.region
                )));
            }
        }
        Ok(cfg)
    }

    fn apply_global(&mut self, entries: Vec<Entry>) -> Result<(), ProviderError> {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut families: Option<Vec<IpFamily>> = None;
        let mut probe_mode: Option<(usize, String)> = None;
        let mut probe_port: Option<u16> = None;
        let mut probe_path: Option<String> = None;
        for Entry { line, key, value } in entries {
            let lower = key.to_ascii_lowercase();
            // Every key but the multi-valued NodeIPFamilies is given once.
            if lower != "nodeipfamilies" {
                if let Some(first) = seen.insert(lower.clone(), line) {
                    return Err(bad(line, format!("{key} is already set on line {first}")));
                }
            }
            let text = |v: String| (!v.is_empty()).then_some(v);
            match lower.as_str() {
                "zone" => self.zone = text(value),
                "region" => self.region = text(value),
                "vpc" => self.vpc = text(value),
                "subnetid" => self.subnet_id = text(value),
                "disablesecuritygroupingress" => {
                    self.disable_sg_ingress = match value.to_ascii_lowercase().as_str() {
                        // gcfg: a key without a value is true.
                        "" | "true" | "yes" | "on" | "1" => true,
                        "false" | "no" | "off" | "0" => false,
                        other => {
                            return Err(bad(
                                line,
                                format!("DisableSecurityGroupIngress: {other:?} is not a boolean"),
                            ))
                        }
                    }
                }
                "elbsecuritygroup" => self.elb_security_group = text(value),
                "routetableid" => {
                    self.route_table_ids = value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect();
                    if let Some(bad_id) = self
                        .route_table_ids
                        .iter()
                        .find(|id| !id.starts_with("rtb-"))
                    {
                        return Err(bad(
                            line,
                            format!("RouteTableID: {bad_id:?} is not a route table ID (rtb-...)"),
                        ));
                    }
                }
                "rolearn" => {
                    if !value.is_empty() && !value.starts_with("arn:") {
                        return Err(bad(line, format!("RoleARN: {value:?} is not an ARN")));
                    }
                    self.role_arn = text(value);
                }
                "sourcearn" => {
                    if !value.is_empty() {
                        return Err(bad(line, "SourceARN is not supported by this provider (the SDK's assume-role provider sends no source ARN)"));
                    }
                }
                "kubernetesclusterid" => {
                    if value.is_empty() {
                        continue;
                    }
                    if let Some(other) = &self.cluster_id {
                        if *other != value {
                            return Err(bad(line, format!("KubernetesClusterID {value:?} differs from KubernetesClusterTag {other:?}")));
                        }
                    }
                    self.cluster_id = Some(value);
                }
                "kubernetesclustertag" => {
                    if value.is_empty() {
                        continue;
                    }
                    if let Some(other) = &self.cluster_id {
                        if *other != value {
                            return Err(bad(line, format!("KubernetesClusterTag {value:?} differs from KubernetesClusterID {other:?}")));
                        }
                    }
                    self.cluster_id = Some(value);
                }
                "nodeipfamilies" => {
                    let list = families.get_or_insert_with(Vec::new);
                    for f in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        let fam = match f.to_ascii_lowercase().as_str() {
                            "ipv4" => IpFamily::V4,
                            "ipv6" => IpFamily::V6,
                            _ => {
                                return Err(bad(
                                    line,
                                    format!("NodeIPFamilies: {f:?} is not ipv4 or ipv6"),
                                ))
                            }
                        };
                        if list.contains(&fam) {
                            return Err(bad(line, format!("NodeIPFamilies: {f} is listed twice")));
                        }
                        list.push(fam);
                    }
                }
                "clusterserviceloadbalancerhealthprobemode" => probe_mode = Some((line, value)),
                "clusterservicesharedloadbalancerhealthprobeport" => {
                    probe_port = Some(value.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                        bad(line, format!("ClusterServiceSharedLoadBalancerHealthProbePort: {value:?} is not a port number"))
                    })?);
                }
                "clusterservicesharedloadbalancerhealthprobepath" => {
                    if !value.starts_with('/') {
                        return Err(bad(line, format!("ClusterServiceSharedLoadBalancerHealthProbePath: {value:?} does not start with /")));
                    }
                    probe_path = Some(value);
                }
                "sharedcredentialsfile" => {
                    self.shared_credentials_file = text(value).map(PathBuf::from)
                }
                "sharedconfigfile" => self.shared_config_file = text(value).map(PathBuf::from),
                "profile" => self.profile = text(value),
                other => match IGNORED_GLOBAL.iter().find(|(k, _)| *k == other) {
                    Some((_, why)) => self.ignored.push(format!("{key} (line {line}): {why}")),
                    None => {
                        return Err(bad(
                            line,
                            format!(
                            "unknown key {key:?} in [Global] (docs/aws-provider.md lists the keys)"
                        ),
                        ))
                    }
                },
            }
        }
        if let Some(f) = families {
            if f.is_empty() {
                return Err(ProviderError::invalid_config(
                    "aws cloud config: NodeIPFamilies is empty",
                ));
            }
            self.node_ip_families = f;
        }
        self.health_probe_mode = match probe_mode {
            None => HealthProbeMode::ServiceNodePort,
            Some((line, m)) => match m.to_ascii_lowercase().as_str() {
                "" | "servicenodeport" => HealthProbeMode::ServiceNodePort,
                "shared" => HealthProbeMode::Shared {
                    port: probe_port.unwrap_or(10256),
                    path: probe_path.unwrap_or_else(|| "/healthz".into()),
                },
                _ => {
                    return Err(bad(
                        line,
                        format!("ClusterServiceLoadBalancerHealthProbeMode: {m:?} is not Shared or ServiceNodePort"),
                    ))
                }
            },
        };
        if let Some(zone) = &self.zone {
            if !zone.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                return Err(ProviderError::invalid_config(format!(
                    "aws cloud config: Zone {zone:?} is not a zone name"
                )));
            }
        }
        Ok(())
    }

    /// The region: `Region`, else `Zone` without its last letter.
    pub fn configured_region(&self) -> Option<String> {
        if let Some(r) = &self.region {
            return Some(r.clone());
        }
        let zone = self.zone.as_deref()?;
        let last = zone.chars().last()?;
        last.is_ascii_alphabetic()
            .then(|| zone[..zone.len() - 1].to_string())
    }

    /// The override for `service` (`ec2`, `elasticloadbalancing`, `sts`) in `region`.
    pub fn override_for(&self, service: &str, region: &str) -> Option<&ServiceOverride> {
        self.overrides
            .iter()
            .find(|o| o.service == service && o.region == region)
    }

    /// AWS CCM keys that were given but have no effect here, each with the reason.
    pub fn ignored(&self) -> &[String] {
        &self.ignored
    }
}

fn parse_override(
    label: String,
    header_line: usize,
    entries: Vec<Entry>,
) -> Result<ServiceOverride, ProviderError> {
    let mut fields: BTreeMap<&'static str, (usize, String)> = BTreeMap::new();
    for Entry { line, key, value } in entries {
        let name = match key.to_ascii_lowercase().as_str() {
            "service" => "Service",
            "region" => "Region",
            "url" => "URL",
            "signingregion" => "SigningRegion",
            "signingname" => "SigningName",
            "signingmethod" => "SigningMethod",
            _ => {
                return Err(bad(
                    line,
                    format!("unknown key {key:?} in [ServiceOverride {label:?}] (known: Service, Region, URL, SigningRegion, SigningName, SigningMethod)"),
                ))
            }
        };
        if let Some((first, _)) = fields.insert(name, (line, value)) {
            return Err(bad(line, format!("{name} is already set on line {first}")));
        }
    }
    let mut take = |name: &'static str| -> Result<(usize, String), ProviderError> {
        match fields.remove(name) {
            Some((l, v)) if !v.trim().is_empty() => Ok((l, v.trim().to_string())),
            _ => Err(bad(
                header_line,
                format!("[ServiceOverride {label:?}] has no {name}"),
            )),
        }
    };
    let (sl, service) = take("Service")?;
    let service = match service.to_ascii_lowercase().as_str() {
        "ec2" => "ec2".to_string(),
        "elasticloadbalancing" | "elbv2" | "elasticloadbalancingv2" => "elasticloadbalancing".to_string(),
        "sts" => "sts".to_string(),
        // Services the AWS CCM uses and this provider does not: accepted, never used.
        "elb" | "autoscaling" | "kms" | "s3" => service.to_ascii_lowercase(),
        other => return Err(bad(sl, format!("Service: {other:?} is not an AWS service this provider calls (ec2, elasticloadbalancing, sts)"))),
    };
    let (_, region) = take("Region")?;
    let (ul, url) = take("URL")?;
    let parsed: http::Uri = url
        .parse()
        .map_err(|e| bad(ul, format!("URL: {url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) || parsed.host().is_none() {
        return Err(bad(
            ul,
            format!("URL: {url:?} is not an http:// or https:// URL"),
        ));
    }
    let (_, signing_region) = take("SigningRegion")?;
    let signing_name = fields
        .remove("SigningName")
        .map(|(_, v)| v)
        .filter(|v| !v.is_empty());
    if let Some((l, m)) = fields.remove("SigningMethod") {
        if !matches!(m.to_ascii_lowercase().as_str(), "" | "v4" | "sigv4") {
            return Err(bad(
                l,
                format!("SigningMethod: {m:?} is not supported (only v4)"),
            ));
        }
    }
    Ok(ServiceOverride {
        label,
        service,
        region,
        url: url.trim_end_matches('/').to_string(),
        signing_region,
        signing_name,
    })
}

/// The text before a `;` or `#` comment (outside quotes).
fn strip_comment(s: &str) -> &str {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ';' | '#' if !quoted => return &s[..i],
            _ => {}
        }
    }
    s
}

/// A gcfg value: trimmed, comments removed, double-quoted parts unquoted with `\"`, `\\`,
/// `\n` and `\t` escapes.
fn parse_value(raw: &str) -> Result<String, String> {
    let s = strip_comment(raw).trim();
    let mut out = String::new();
    let mut chars = s.chars();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' => match chars.next() {
                Some('"') => out.push('"'),
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('t') => out.push('\t'),
                Some(o) => return Err(format!("unknown escape \\{o} in {s:?}")),
                None => return Err(format!("{s:?} ends with a backslash")),
            },
            c => out.push(c),
        }
    }
    if quoted {
        return Err(format!("unterminated quote in {s:?}"));
    }
    Ok(out)
}

fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    parse_value(&format!("\"{inner}\"")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<AwsConfig, String> {
        AwsConfig::parse(Some(s.as_bytes())).map_err(|e| e.to_string())
    }

    #[test]
    fn the_aws_ccm_format_parses() {
        let c = parse(
            r#"
; comment
[Global]
Zone = us-east-1a
KubernetesClusterID = prod   # trailing comment
kubernetesclustertag = prod
RouteTableID = rtb-1, rtb-2
NodeIPFamilies = ipv6
NodeIPFamilies = ipv4
DisableSecurityGroupIngress
ClusterServiceLoadBalancerHealthProbeMode = Shared
ClusterServiceSharedLoadBalancerHealthProbePort = 10999

[ServiceOverride "1"]
Service = ec2
Region = us-east-1
URL = http://127.0.0.1:5000/
SigningRegion = us-east-1

[serviceoverride "elb"]
service = elasticloadbalancing
region = us-east-1
url = "http://127.0.0.1:5000"
signingregion = us-east-1
SigningName = elasticloadbalancing
"#,
        )
        .unwrap();
        assert_eq!(c.zone.as_deref(), Some("us-east-1a"));
        assert_eq!(c.configured_region().as_deref(), Some("us-east-1"));
        assert_eq!(c.cluster_id.as_deref(), Some("prod"));
        assert_eq!(c.route_table_ids, vec!["rtb-1", "rtb-2"]);
        assert_eq!(c.node_ip_families, vec![IpFamily::V6, IpFamily::V4]);
        assert_eq!(
            c.health_probe_mode,
            HealthProbeMode::Shared {
                port: 10999,
                path: "/healthz".into()
            }
        );
        assert!(c.ignored().is_empty(), "{:?}", c.ignored());
        assert!(c.disable_sg_ingress);
        let ec2 = c.override_for("ec2", "us-east-1").unwrap();
        assert_eq!(ec2.url, "http://127.0.0.1:5000");
        let elb = c.override_for("elasticloadbalancing", "us-east-1").unwrap();
        assert_eq!(elb.label, "elb");
        assert!(c.override_for("ec2", "eu-west-1").is_none());
        assert_eq!(AwsConfig::parse(None).unwrap(), AwsConfig::default());
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = parse("[Global]\nZone = a\nZonee = b\n").unwrap_err();
        assert!(
            e.contains("line 3") && e.contains("unknown key \"Zonee\""),
            "{e}"
        );
        let e = parse("[Globals]\n").unwrap_err();
        assert!(e.contains("line 1: unknown section [Globals]"), "{e}");
        let e = parse("Zone = a\n").unwrap_err();
        assert!(
            e.contains("line 1") && e.contains("outside any section"),
            "{e}"
        );
        let e = parse("[Global]\nNodeIPFamilies = ipv5\n").unwrap_err();
        assert!(e.contains("line 2: NodeIPFamilies: \"ipv5\""), "{e}");
        let e = parse("[Global]\nZone = a\nzone = b\n").unwrap_err();
        assert!(e.contains("line 3: zone is already set on line 2"), "{e}");
        let e = parse("[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = ftp://x\nSigningRegion = r\n").unwrap_err();
        assert!(e.contains("line 4: URL"), "{e}");
        let e = parse("[ServiceOverride \"1\"]\nService = ec2\nRegion = r\n").unwrap_err();
        assert!(
            e.contains("line 1: [ServiceOverride \"1\"] has no URL"),
            "{e}"
        );
        let e = parse("[ServiceOverride \"1\"]\nService = ec2\nBogus = r\n").unwrap_err();
        assert!(
            e.contains("line 3: unknown key \"Bogus\" in [ServiceOverride \"1\"]"),
            "{e}"
        );
        let e = parse("[Global]\nKubernetesClusterID = a\nKubernetesClusterTag = b\n").unwrap_err();
        assert!(e.contains("line 3"), "{e}");
        let e = parse("[Global]\nRouteTableID = 123\n").unwrap_err();
        assert!(e.contains("line 2: RouteTableID"), "{e}");
        let e = parse("[Global]\nZone = \"a\n").unwrap_err();
        assert!(e.contains("line 2: unterminated quote"), "{e}");
        let dup = "[ServiceOverride \"a\"]\nService=ec2\nRegion=r\nURL=http://x\nSigningRegion=r\n[ServiceOverride \"b\"]\nService=ec2\nRegion=r\nURL=http://y\nSigningRegion=r\n";
        let e = parse(dup).unwrap_err();
        assert!(e.contains("both override ec2 in r"), "{e}");
    }
}
