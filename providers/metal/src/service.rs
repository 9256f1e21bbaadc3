//! What a Service asks of the allocator: its identity, its IP families, the addresses it
//! requests (`spec.loadBalancerIP` and the `load-balancer-ips` annotation), the pool it names,
//! its sharing key and its ports. Every malformed value is an error naming the service and field.

use std::fmt;
use std::net::IpAddr;

use ccm_provider_abi::prelude::*;
use serde::{Deserialize, Serialize};

use crate::pool::Family;

/// Annotation naming the pool to allocate from.
pub const POOL_ANNOTATION: &str = "metal.ccm-host.io/pool";
/// Annotation requesting addresses: one, or an IPv4 and an IPv6 address, comma-separated.
pub const IPS_ANNOTATION: &str = "metal.ccm-host.io/load-balancer-ips";
/// Annotation opting in to sharing an address with services of the same key.
pub const SHARING_ANNOTATION: &str = "metal.ccm-host.io/allow-shared-ip";

/// `namespace/name` of a service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ServiceKey {
    /// Key of `svc` (namespace `default` when unset).
    pub fn of(svc: &Service) -> Self {
        Self {
            namespace: svc
                .metadata
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".into()),
            name: svc.metadata.name.clone().unwrap_or_default(),
        }
    }

    /// `namespace.name`: a valid ConfigMap data key, unambiguous because neither a namespace
    /// (DNS-1123 label) nor a service name (DNS-1035 label) contains a dot.
    pub fn data_key(&self) -> String {
        format!("{}.{}", self.namespace, self.name)
    }

    /// Inverse of [`ServiceKey::data_key`].
    pub fn from_data_key(key: &str) -> Option<Self> {
        let (ns, name) = key.split_once('.')?;
        (!ns.is_empty() && !name.is_empty() && !name.contains('.')).then(|| Self {
            namespace: ns.into(),
            name: name.into(),
        })
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One IP family the service wants, and whether it must get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WantedFamily {
    /// The family.
    pub family: Family,
    /// `false` for the second family of `PreferDualStack`: given when a pool has one free.
    pub required: bool,
}

/// What one service asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The service.
    pub key: ServiceKey,
    /// Its UID (recorded with the allocation).
    pub uid: String,
    /// Families in `spec.ipFamilies` order (the order of the published ingress).
    pub families: Vec<WantedFamily>,
    /// Requested addresses, at most one per family.
    pub requested: Vec<IpAddr>,
    /// The pool named by the pool annotation.
    pub pool: Option<String>,
    /// The sharing key, when the service allows sharing.
    pub sharing_key: Option<String>,
    /// Its ports as `PROTOCOL/port`, sorted.
    pub ports: Vec<String>,
    /// The policy as written, for messages.
    pub policy: String,
}

impl Request {
    /// The requested address of `family`, if any.
    pub fn requested_for(&self, family: Family) -> Option<IpAddr> {
        self.requested
            .iter()
            .copied()
            .find(|ip| Family::of(*ip) == family)
    }

    /// Read the request from `svc`.
    pub fn from_service(svc: &Service) -> Result<Self, String> {
        let key = ServiceKey::of(svc);
        let fail = |m: String| format!("service {key}: {m}");
        let spec = svc.spec.clone().unwrap_or_default();
        let annotations = svc.metadata.annotations.clone().unwrap_or_default();

        let requested = requested_addresses(
            spec.load_balancer_ip.as_deref(),
            annotations.get(IPS_ANNOTATION).map(String::as_str),
        )
        .map_err(fail)?;

        let mut spec_families = Vec::new();
        for f in spec.ip_families.as_deref().unwrap_or(&[]) {
            let fam = Family::parse(f)
                .ok_or_else(|| fail(format!("spec.ipFamilies has {f:?}; expected IPv4 or IPv6")))?;
            if spec_families.contains(&fam) {
                return Err(fail(format!("spec.ipFamilies lists {f} twice")));
            }
            spec_families.push(fam);
        }
        let primary = spec_families
            .first()
            .copied()
            .or_else(|| requested.first().map(|ip| Family::of(*ip)))
            .unwrap_or(Family::V4);
        let secondary = spec_families.get(1).copied().unwrap_or(primary.other());
        let policy = spec
            .ip_family_policy
            .clone()
            .unwrap_or_else(|| "SingleStack".into());
        let families = match policy.as_str() {
            "SingleStack" => vec![WantedFamily {
                family: primary,
                required: true,
            }],
            "PreferDualStack" | "RequireDualStack" => vec![
                WantedFamily {
                    family: primary,
                    required: true,
                },
                WantedFamily {
                    family: secondary,
                    required: policy == "RequireDualStack",
                },
            ],
            other => {
                return Err(fail(format!(
                    "spec.ipFamilyPolicy is {other:?}; expected SingleStack, PreferDualStack or RequireDualStack"
                )))
            }
        };
        for ip in &requested {
            let fam = Family::of(*ip);
            if !families.iter().any(|w| w.family == fam) {
                return Err(fail(format!(
                    "requested address {ip} is {fam}, but the service is {policy} {primary}"
                )));
            }
        }

        let pool = match annotations.get(POOL_ANNOTATION).map(|s| s.trim()) {
            None => None,
            Some("") => {
                return Err(fail(format!(
                    "annotation {POOL_ANNOTATION} is empty; name a pool or remove it"
                )))
            }
            Some(p) => Some(p.to_string()),
        };
        let sharing_key = match annotations.get(SHARING_ANNOTATION).map(|s| s.trim()) {
            None => None,
            Some(k) => {
                let ok = !k.is_empty()
                    && k.len() <= 63
                    && k.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
                if !ok {
                    return Err(fail(format!(
                        "annotation {SHARING_ANNOTATION} is {k:?}; a sharing key is 1-63 letters, digits, '-', '_' or '.'"
                    )));
                }
                Some(k.to_string())
            }
        };
        let mut ports: Vec<String> = spec
            .ports
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .map(|p| format!("{}/{}", p.protocol.as_deref().unwrap_or("TCP"), p.port))
            .collect();
        ports.sort();
        ports.dedup();

        Ok(Self {
            uid: svc.metadata.uid.clone().unwrap_or_default(),
            key,
            families,
            requested,
            pool,
            sharing_key,
            ports,
            policy,
        })
    }
}

/// The addresses asked for by `spec.loadBalancerIP` and the annotation: at most one per family;
/// when both are set, `spec.loadBalancerIP` must be one of the annotation's.
pub fn requested_addresses(
    load_balancer_ip: Option<&str>,
    annotation: Option<&str>,
) -> Result<Vec<IpAddr>, String> {
    let mut out: Vec<IpAddr> = Vec::new();
    if let Some(text) = annotation {
        for part in text.split(',').map(str::trim) {
            if part.is_empty() {
                continue;
            }
            let ip: IpAddr = part.parse().map_err(|_| {
                format!("annotation {IPS_ANNOTATION}: {part:?} is not an IP address")
            })?;
            if out.iter().any(|o| Family::of(*o) == Family::of(ip)) {
                return Err(format!(
                    "annotation {IPS_ANNOTATION} has two {} addresses ({text:?}); give at most one per family",
                    Family::of(ip)
                ));
            }
            out.push(ip);
        }
        if out.is_empty() {
            return Err(format!(
                "annotation {IPS_ANNOTATION} is empty; give an address or remove it"
            ));
        }
    }
    if let Some(text) = load_balancer_ip.map(str::trim).filter(|t| !t.is_empty()) {
        let ip: IpAddr = text
            .parse()
            .map_err(|_| format!("spec.loadBalancerIP {text:?} is not an IP address"))?;
        if annotation.is_some() {
            if !out.contains(&ip) {
                return Err(format!(
                    "spec.loadBalancerIP {ip} is not among the addresses of annotation {IPS_ANNOTATION} ({}); set one of them",
                    annotation.unwrap_or_default()
                ));
            }
        } else {
            out.push(ip);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(extra: serde_json::Value) -> Service {
        let mut v = json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
                           "spec": {"type": "LoadBalancer",
                                    "ports": [{"port": 443}, {"port": 80, "protocol": "TCP"}, {"port": 53, "protocol": "UDP"}]}});
        merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn req(extra: serde_json::Value) -> Result<Request, String> {
        Request::from_service(&svc(extra))
    }

    fn fams(r: &Request) -> Vec<(Family, bool)> {
        r.families.iter().map(|w| (w.family, w.required)).collect()
    }

    #[test]
    fn defaults_are_single_stack_ipv4() {
        let r = req(json!({})).unwrap();
        assert_eq!(r.key.to_string(), "shop/web");
        assert_eq!(r.uid, "u-1");
        assert_eq!(fams(&r), vec![(Family::V4, true)]);
        assert_eq!(r.ports, vec!["TCP/443", "TCP/80", "UDP/53"]);
        assert!(r.requested.is_empty() && r.pool.is_none() && r.sharing_key.is_none());
    }

    #[test]
    fn families_follow_ip_families_and_policy() {
        let r = req(
            json!({"spec": {"ipFamilies": ["IPv6", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}}),
        )
        .unwrap();
        assert_eq!(fams(&r), vec![(Family::V6, true), (Family::V4, true)]);
        let r = req(json!({"spec": {"ipFamilies": ["IPv4"], "ipFamilyPolicy": "PreferDualStack"}}))
            .unwrap();
        assert_eq!(fams(&r), vec![(Family::V4, true), (Family::V6, false)]);
        let r = req(json!({"spec": {"ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}}))
            .unwrap();
        assert_eq!(fams(&r), vec![(Family::V6, true)]);
        // No ipFamilies: the family of the requested address.
        let r = req(json!({"spec": {"loadBalancerIP": "2001:db8::5"}})).unwrap();
        assert_eq!(fams(&r), vec![(Family::V6, true)]);
    }

    #[test]
    fn requested_addresses_from_field_and_annotation() {
        let r = req(json!({"spec": {"loadBalancerIP": "192.0.2.9"}})).unwrap();
        assert_eq!(r.requested, vec!["192.0.2.9".parse::<IpAddr>().unwrap()]);
        let r = req(
            json!({"metadata": {"annotations": {IPS_ANNOTATION: "192.0.2.9, 2001:db8::9"}},
                           "spec": {"loadBalancerIP": "192.0.2.9", "ipFamilies": ["IPv4", "IPv6"],
                                    "ipFamilyPolicy": "RequireDualStack"}}),
        )
        .unwrap();
        assert_eq!(r.requested.len(), 2);
        assert_eq!(
            r.requested_for(Family::V6),
            Some("2001:db8::9".parse().unwrap())
        );
    }

    #[test]
    fn bad_values_name_the_service_and_the_field() {
        let cases = [
            (
                json!({"spec": {"loadBalancerIP": "not-an-ip"}}),
                "service shop/web: spec.loadBalancerIP \"not-an-ip\" is not an IP address",
            ),
            (
                json!({"metadata": {"annotations": {IPS_ANNOTATION: "1.2.3.4,1.2.3.5"}}}),
                "two IPv4 addresses",
            ),
            (
                json!({"metadata": {"annotations": {IPS_ANNOTATION: "x"}}}),
                "\"x\" is not an IP address",
            ),
            (
                json!({"metadata": {"annotations": {IPS_ANNOTATION: " , "}}}),
                "is empty",
            ),
            (
                json!({"metadata": {"annotations": {IPS_ANNOTATION: "1.2.3.4"}}, "spec": {"loadBalancerIP": "1.2.3.5"}}),
                "not among the addresses",
            ),
            (
                json!({"spec": {"ipFamilies": ["IPv5"]}}),
                "expected IPv4 or IPv6",
            ),
            (json!({"spec": {"ipFamilies": ["IPv4", "IPv4"]}}), "twice"),
            (
                json!({"spec": {"ipFamilyPolicy": "Sometimes"}}),
                "spec.ipFamilyPolicy is \"Sometimes\"",
            ),
            (
                json!({"spec": {"loadBalancerIP": "2001:db8::1", "ipFamilies": ["IPv4"]}}),
                "requested address 2001:db8::1 is IPv6, but the service is SingleStack IPv4",
            ),
            (
                json!({"metadata": {"annotations": {POOL_ANNOTATION: " "}}}),
                "annotation metal.ccm-host.io/pool is empty",
            ),
            (
                json!({"metadata": {"annotations": {SHARING_ANNOTATION: "a b"}}}),
                "a sharing key is",
            ),
        ];
        for (extra, want) in cases {
            let e = req(extra.clone()).unwrap_err();
            assert!(e.contains(want), "{extra}: {e:?} should contain {want:?}");
        }
    }

    #[test]
    fn data_keys_round_trip() {
        let k = ServiceKey {
            namespace: "kube-system".into(),
            name: "dns".into(),
        };
        assert_eq!(k.data_key(), "kube-system.dns");
        assert_eq!(ServiceKey::from_data_key("kube-system.dns"), Some(k));
        assert_eq!(ServiceKey::from_data_key("nodot"), None);
        assert_eq!(ServiceKey::from_data_key("a.b.c"), None);
        assert_eq!(ServiceKey::from_data_key(".b"), None);
    }
}
