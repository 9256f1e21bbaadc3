//! Pure validators of what a provider returns: provider IDs, addresses, label values.

use std::net::IpAddr;

use ccm_provider_abi::types::address_type;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, NodeAddress};

/// `ProviderName()` must be usable as a URL scheme (RFC 3986: a letter, then letters, digits,
/// `+`, `-` or `.`), since provider IDs are `<ProviderName>://<id>`.
pub fn provider_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("ProviderName() is empty".into()),
        Some(c) if !c.is_ascii_alphabetic() => {
            return Err(format!(
                "ProviderName() {name:?} does not start with a letter, so `{name}://...` is not a valid provider ID scheme"
            ))
        }
        Some(_) => {}
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))) {
        return Err(format!(
            "ProviderName() {name:?} contains {c:?}; a provider ID scheme may only hold letters, digits, '+', '-' and '.'"
        ));
    }
    Ok(())
}

/// A provider ID must be `<provider_name>://<id>` with a non-empty id and no whitespace.
pub fn provider_id(provider_name: &str, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("empty providerID".into());
    }
    let Some(rest) = id.strip_prefix(&format!("{provider_name}://")) else {
        return Err(format!(
            "providerID {id:?} does not have the form {provider_name}://<id> (the scheme must be ProviderName())"
        ));
    };
    if rest.is_empty() {
        return Err(format!(
            "providerID {id:?} has nothing after {provider_name}://"
        ));
    }
    if id.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "providerID {id:?} contains whitespace or control characters"
        ));
    }
    Ok(())
}

/// An IP address of a node or load balancer: parses, and is not the unspecified address.
pub fn ip(value: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = value
        .parse()
        .map_err(|_| format!("{value:?} is not a valid IP address"))?;
    if ip.is_unspecified() {
        return Err(format!("{value:?} is the unspecified address"));
    }
    Ok(ip)
}

/// An RFC 1123 host name: dot-separated labels of letters, digits and `-` (not at either end
/// of a label), labels of at most 63 and names of at most 253 characters.
pub fn hostname(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("empty host name".into());
    }
    if value.len() > 253 {
        return Err(format!("host name {value:?} is longer than 253 characters"));
    }
    for label in value.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!("{value:?} is not a valid RFC 1123 host name"));
        }
    }
    Ok(())
}

/// A Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        return Err(format!(
            "label value {value:?} is longer than 63 characters"
        ));
    }
    let inner_ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ends_ok = value.is_empty()
        || (value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()));
    if inner_ok && ends_ok {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a valid label value (alphanumerics, '-', '_', '.', starting and ending alphanumeric)"
        ))
    }
}

/// The addresses of one node: at least one, known types, valid IPs and host names, no
/// duplicates, and at least one InternalIP or ExternalIP (kubelet and everything that talks
/// to a node need one).
pub fn node_addresses(addresses: &[NodeAddress]) -> Vec<String> {
    let mut problems = Vec::new();
    if addresses.is_empty() {
        problems.push("no addresses".to_string());
        return problems;
    }
    for (i, a) in addresses.iter().enumerate() {
        let result = match a.type_.as_str() {
            address_type::INTERNAL_IP | address_type::EXTERNAL_IP => ip(&a.address).map(|_| ()),
            address_type::HOSTNAME | address_type::INTERNAL_DNS | address_type::EXTERNAL_DNS => {
                hostname(&a.address)
            }
            other => Err(format!(
                "unknown address type {other:?} (want Hostname, InternalIP, ExternalIP, InternalDNS or ExternalDNS)"
            )),
        };
        if let Err(e) = result {
            problems.push(format!("{} {}", a.type_, e));
        }
        if addresses[..i].contains(a) {
            problems.push(format!("duplicate address {} {}", a.type_, a.address));
        }
    }
    let has_ip = addresses.iter().any(|a| {
        matches!(
            a.type_.as_str(),
            address_type::INTERNAL_IP | address_type::EXTERNAL_IP
        )
    });
    if !has_ip {
        problems.push("no InternalIP or ExternalIP address".to_string());
    }
    problems
}

/// A load-balancer status to publish: at least one ingress, each with a valid IP or host name.
pub fn load_balancer_status(status: &LoadBalancerStatus) -> Vec<String> {
    let ingress = status.ingress.as_deref().unwrap_or_default();
    if ingress.is_empty() {
        return vec!["the status has no ingress (no address for the Service)".to_string()];
    }
    let mut problems = Vec::new();
    for i in ingress {
        match (i.ip.as_deref(), i.hostname.as_deref()) {
            (None | Some(""), None | Some("")) => {
                problems.push("an ingress has neither ip nor hostname".to_string())
            }
            (ip_value, host) => {
                if let Some(v) = ip_value.filter(|v| !v.is_empty()) {
                    if let Err(e) = ip(v) {
                        problems.push(format!("ingress ip: {e}"));
                    }
                }
                if let Some(h) = host.filter(|h| !h.is_empty()) {
                    if let Err(e) = hostname(h) {
                        problems.push(format!("ingress hostname: {e}"));
                    }
                }
            }
        }
        if let Some(mode) = i.ip_mode.as_deref() {
            if !matches!(mode, "VIP" | "Proxy") {
                problems.push(format!("ingress ipMode {mode:?} is neither VIP nor Proxy"));
            }
        }
    }
    problems
}

/// A short rendering of a load-balancer status for messages: the ingress addresses.
pub fn describe_status(status: Option<&LoadBalancerStatus>) -> String {
    let Some(status) = status else {
        return "no status".into();
    };
    let items: Vec<String> = status
        .ingress
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|i| {
            let addr =
                i.ip.clone()
                    .or_else(|| i.hostname.clone())
                    .unwrap_or_default();
            match &i.ip_mode {
                Some(mode) => format!("{addr} ({mode})"),
                None => addr,
            }
        })
        .collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::LoadBalancerIngress;

    fn a(t: &str, v: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: v.into(),
        }
    }

    #[test]
    fn provider_names() {
        for ok in ["aws", "fake-v1", "k8s.io+x", "Gce2"] {
            assert!(provider_name(ok).is_ok(), "{ok}");
        }
        assert!(provider_name("").unwrap_err().contains("empty"));
        assert!(provider_name("1cloud").unwrap_err().contains("letter"));
        assert!(provider_name("my cloud").unwrap_err().contains("' '"));
        assert!(provider_name("a/b").is_err());
    }

    #[test]
    fn provider_ids() {
        assert!(provider_id("aws", "aws:///us-east-1a/i-0abc").is_ok());
        assert!(provider_id("fake", "fake://node-1").is_ok());
        assert!(provider_id("fake", "i-123")
            .unwrap_err()
            .contains("does not have the form fake://<id>"));
        assert!(provider_id("fake", "other://x").is_err());
        assert!(provider_id("fake", "fake://")
            .unwrap_err()
            .contains("nothing after"));
        assert!(provider_id("fake", "").unwrap_err().contains("empty"));
        assert!(provider_id("fake", "fake://a b")
            .unwrap_err()
            .contains("whitespace"));
        // The scheme must match exactly, not just be a prefix.
        assert!(provider_id("fake", "fakes://x").is_err());
    }

    #[test]
    fn ips_and_hostnames() {
        assert!(ip("10.0.0.1").is_ok());
        assert!(ip("fd00::1").is_ok());
        assert!(ip("0.0.0.0").unwrap_err().contains("unspecified"));
        assert!(ip("10.0.0").is_err());
        assert!(ip("010.0.0.1").is_err());
        assert!(hostname("node-1.example.com").is_ok());
        assert!(hostname("IP-10-0-0-1.ec2.internal").is_ok());
        assert!(hostname("-bad").is_err());
        assert!(hostname("a..b").is_err());
        assert!(hostname("under_score").is_err());
        assert!(hostname(&"a".repeat(64)).is_err());
        assert!(hostname("").is_err());
    }

    #[test]
    fn label_values() {
        for ok in ["", "zone-a", "us-east-1", "a.b_c-d", "Z9"] {
            assert!(label_value(ok).is_ok(), "{ok}");
        }
        for bad in ["-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_address_lists() {
        assert!(node_addresses(&[a("InternalIP", "10.0.0.1"), a("Hostname", "n1")]).is_empty());
        assert_eq!(node_addresses(&[]), vec!["no addresses"]);
        let p = node_addresses(&[a("Hostname", "n1")]);
        assert_eq!(p, vec!["no InternalIP or ExternalIP address"]);
        let p = node_addresses(&[a("InternalIP", "10.0.0.300"), a("Weird", "x")]);
        assert!(
            p[0].starts_with("InternalIP \"10.0.0.300\" is not a valid IP"),
            "{p:?}"
        );
        assert!(p[1].contains("unknown address type \"Weird\""), "{p:?}");
        let p = node_addresses(&[a("InternalIP", "10.0.0.1"), a("InternalIP", "10.0.0.1")]);
        assert_eq!(p, vec!["duplicate address InternalIP 10.0.0.1"]);
    }

    #[test]
    fn load_balancer_statuses() {
        let ingress = |ip: Option<&str>, host: Option<&str>| LoadBalancerIngress {
            ip: ip.map(Into::into),
            hostname: host.map(Into::into),
            ..Default::default()
        };
        let status = |v: Vec<LoadBalancerIngress>| LoadBalancerStatus { ingress: Some(v) };
        assert!(load_balancer_status(&status(vec![ingress(Some("192.0.2.1"), None)])).is_empty());
        assert!(
            load_balancer_status(&status(vec![ingress(None, Some("lb.example.com"))])).is_empty()
        );
        assert!(
            load_balancer_status(&LoadBalancerStatus { ingress: None })[0].contains("no ingress")
        );
        assert!(load_balancer_status(&status(vec![ingress(None, None)]))[0].contains("neither"));
        assert!(
            load_balancer_status(&status(vec![ingress(Some("x"), None)]))[0].contains("ingress ip")
        );
        assert_eq!(
            describe_status(Some(&status(vec![ingress(Some("192.0.2.1"), None)]))),
            "[192.0.2.1]"
        );
        assert_eq!(describe_status(None), "no status");
    }
}
