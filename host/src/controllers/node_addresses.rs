//! Pure helpers of the cloud-node controller for node addresses and labels
//! (docs/upstream-compat.md#node-addresses): the `alpha.kubernetes.io/provided-node-ip`
//! annotation (parsing and the ordering rules), the merge of cloud addresses with the kubelet's
//! Hostname, address change detection, the AdditionalLabels key filter and the beta → GA label
//! reconciliation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};

use k8s_openapi::api::core::v1::NodeAddress;

use crate::runtime::well_known::{
    INSTANCE_TYPE_BETA_LABEL, INSTANCE_TYPE_LABEL, REGION_BETA_LABEL, REGION_LABEL,
    ZONE_BETA_LABEL, ZONE_LABEL,
};

/// The `Hostname` address type.
pub const HOSTNAME: &str = "Hostname";

/// Parse an IP the way Go's `netutils.ParseIPSloppy` does: like the standard parser, but IPv4
/// octets may carry leading zeros (read as decimal). IPv4-mapped IPv6 addresses are returned as
/// IPv4, because Go's `net.IP` treats both forms as the same (IPv4) address.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    let ip = match s.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            let parts: Vec<&str> = s.split('.').collect();
            if parts.len() != 4 {
                return None;
            }
            let mut octets = [0u8; 4];
            for (o, p) in octets.iter_mut().zip(&parts) {
                if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                *o = p.parse().ok()?;
            }
            IpAddr::V4(Ipv4Addr::from(octets))
        }
    };
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    })
}

/// Parse the node-IP annotation (upstream `ParseNodeIPAnnotation`): split on `,` without
/// trimming; each element must be an IP; one IP, or a dual-stack pair without `0.0.0.0`/`::`.
pub fn parse_node_ip_annotation(value: &str) -> Result<Vec<IpAddr>, String> {
    let mut ips = Vec::new();
    for part in value.split(',') {
        ips.push(parse_ip_sloppy(part).ok_or_else(|| format!("could not parse {part:?}"))?);
    }
    if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv6() == ips[1].is_ipv6()) {
        return Err("must contain either a single IP or a dual-stack pair of IPs".into());
    }
    if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
        return Err("dual-stack node IP cannot include '0.0.0.0' or '::'".into());
    }
    Ok(ips)
}

/// Apply the node-IP annotation to the cloud's addresses (upstream
/// `GetNodeAddressesFromNodeIP`): for each annotated IP in order, every cloud address equal to
/// it (IP equality, the cloud's text kept) comes first; then every cloud address whose type is
/// not one of the matched types, in cloud order.
pub fn addresses_from_node_ip(
    annotation: &str,
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, String> {
    let node_ips = parse_node_ip_annotation(annotation)
        .map_err(|e| format!("failed to parse node IP {annotation:?}: {e}"))?;
    let mut out = Vec::with_capacity(cloud.len());
    let mut matched_types: HashSet<&str> = HashSet::new();
    for ip in &node_ips {
        let mut matched = false;
        for a in cloud {
            if parse_ip_sloppy(&a.address).as_ref() == Some(ip) {
                out.push(a.clone());
                matched_types.insert(a.type_.as_str());
                matched = true;
            }
        }
        if !matched {
            return Err(format!(
                "failed to get node address from cloud provider that matches ip: {ip}"
            ));
        }
    }
    out.extend(
        cloud
            .iter()
            .filter(|a| !matched_types.contains(a.type_.as_str()))
            .cloned(),
    );
    Ok(out)
}

/// Apply the node's [`PROVIDED_NODE_IP_ANNOTATION`] if present (`node_ip`: its value; upstream
/// `updateNodeAddressesFromNodeIP`).
pub fn apply_node_ip(
    node_ip: Option<&str>,
    addresses: Vec<NodeAddress>,
) -> Result<Vec<NodeAddress>, String> {
    match node_ip {
        Some(value) => addresses_from_node_ip(value, &addresses),
        None => Ok(addresses),
    }
}

/// The addresses the node should have after an address update, or `None` when the cloud
/// returned none (the existing addresses are kept). When the cloud has no `Hostname`, the
/// node's existing Hostname address(es) are appended; then the node-IP rules apply.
pub fn desired_addresses(
    cloud: &[NodeAddress],
    current: &[NodeAddress],
    node_ip: Option<&str>,
) -> Option<Result<Vec<NodeAddress>, String>> {
    if cloud.is_empty() {
        return None;
    }
    let mut addresses = cloud.to_vec();
    if !cloud.iter().any(|a| a.type_ == HOSTNAME) {
        addresses.extend(current.iter().filter(|a| a.type_ == HOSTNAME).cloned());
    }
    Some(apply_node_ip(node_ip, addresses))
}

/// Whether `new` differs from `current` (upstream `nodeAddressesChangeDetected`): a different
/// length, or an entry of `new` whose address differs from the last entry of its type in
/// `current`. Reordering entries of distinct types is not a change.
///
/// Deliberate difference from upstream: upstream's type map misses changes inside one type when
/// a type repeats (e.g. `[InternalIP a, InternalIP b]` → `[InternalIP b, InternalIP b]` is "no
/// change" there, so address `a` would stay published forever). We additionally report a change
/// when the two lists do not hold the same (type, address) pairs. Every case upstream reports
/// as a change is still a change, and pure reorderings are still not.
pub fn addresses_changed(current: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if current.len() != new.len() {
        return true;
    }
    let by_type: HashMap<&str, &str> = current
        .iter()
        .map(|a| (a.type_.as_str(), a.address.as_str()))
        .collect();
    if new
        .iter()
        .any(|a| by_type.get(a.type_.as_str()).copied().unwrap_or("") != a.address)
    {
        return true;
    }
    let pairs = |l: &[NodeAddress]| {
        let mut v: Vec<(String, String)> = l
            .iter()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect();
        v.sort();
        v
    };
    pairs(current) != pairs(new)
}

/// Whether an AdditionalLabels key is in a reserved namespace (upstream regex
/// `(^|\.)(kubernetes|k8s)\.io/`): `kubernetes.io/x`, `k8s.io/x`, `topology.kubernetes.io/x` are
/// reserved; `topology.k8s.cp/x`, `app.k8snio/x` are not.
pub fn is_reserved_label_key(key: &str) -> bool {
    ["kubernetes.io/", "k8s.io/"].iter().any(|ns| {
        key.match_indices(ns)
            .any(|(i, _)| i == 0 || key.as_bytes()[i - 1] == b'.')
    })
}

/// Label pairs reconciled on initialised nodes: the beta (primary) label is the source of truth.
pub const LABEL_PAIRS: [(&str, &str); 3] = [
    (ZONE_BETA_LABEL, ZONE_LABEL),
    (REGION_BETA_LABEL, REGION_LABEL),
    (INSTANCE_TYPE_BETA_LABEL, INSTANCE_TYPE_LABEL),
];

/// The labels to write so every GA label equals its beta label (upstream
/// `reconcileNodeLabels`); empty when consistent or when the node has no labels. `label` reads
/// one of the node's labels.
pub fn label_reconciliation<'a>(
    label: impl Fn(&str) -> Option<&'a str>,
) -> BTreeMap<String, String> {
    let mut update = BTreeMap::new();
    for (primary, secondary) in LABEL_PAIRS {
        let Some(value) = label(primary) else {
            continue;
        };
        if label(secondary) != Some(value) {
            update.insert(secondary.to_string(), value.to_string());
        }
    }
    update
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(t: &str, addr: &str) -> NodeAddress {
        NodeAddress {
            type_: t.into(),
            address: addr.into(),
        }
    }

    #[test]
    fn parses_single_and_dual_stack_node_ips() {
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1").unwrap(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1,fd00::1").unwrap().len(),
            2
        );
        assert_eq!(
            parse_node_ip_annotation("fd00::1,10.0.0.1").unwrap().len(),
            2
        );
        // Sloppy IPv4: leading zeros are decimal.
        assert_eq!(
            parse_node_ip_annotation("010.000.000.001").unwrap(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn rejects_bad_node_ip_annotations_with_upstream_messages() {
        assert_eq!(
            parse_node_ip_annotation("not-an-ip").unwrap_err(),
            "could not parse \"not-an-ip\""
        );
        // No trimming.
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1, fd00::1").unwrap_err(),
            "could not parse \" fd00::1\""
        );
        assert_eq!(
            parse_node_ip_annotation("").unwrap_err(),
            "could not parse \"\""
        );
        let pair = "must contain either a single IP or a dual-stack pair of IPs";
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1,10.0.0.2").unwrap_err(),
            pair
        );
        assert_eq!(
            parse_node_ip_annotation("fd00::1,fd00::2").unwrap_err(),
            pair
        );
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1,fd00::1,10.0.0.2").unwrap_err(),
            pair
        );
        assert_eq!(
            parse_node_ip_annotation("0.0.0.0,fd00::1").unwrap_err(),
            "dual-stack node IP cannot include '0.0.0.0' or '::'"
        );
        assert_eq!(
            parse_node_ip_annotation("10.0.0.1,::").unwrap_err(),
            "dual-stack node IP cannot include '0.0.0.0' or '::'"
        );
        // A single unspecified address is accepted by the parser (it then matches nothing).
        assert!(parse_node_ip_annotation("0.0.0.0").is_ok());
    }

    #[test]
    fn node_ip_comes_first_and_drops_other_addresses_of_its_type() {
        let cloud = vec![
            a("InternalIP", "10.0.0.1"),
            a("InternalIP", "10.0.0.2"),
            a("ExternalIP", "132.143.154.163"),
            a("Hostname", "node0.cloud"),
        ];
        let out = addresses_from_node_ip("10.0.0.2", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                a("InternalIP", "10.0.0.2"),
                a("ExternalIP", "132.143.154.163"),
                a("Hostname", "node0.cloud"),
            ]
        );
    }

    #[test]
    fn node_ip_matching_internal_and_external_drops_both_types() {
        let cloud = vec![
            a("InternalIP", "10.0.0.1"),
            a("ExternalIP", "10.0.0.1"),
            a("InternalIP", "10.0.0.2"),
            a("ExternalIP", "132.143.154.163"),
            a("Hostname", "h"),
        ];
        let out = addresses_from_node_ip("10.0.0.1", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                a("InternalIP", "10.0.0.1"),
                a("ExternalIP", "10.0.0.1"),
                a("Hostname", "h")
            ]
        );
    }

    #[test]
    fn node_ip_matches_by_ip_equality_and_keeps_cloud_text() {
        let cloud = vec![
            a("InternalIP", "2600:1f14:1d4:d101::ba3d"),
            a("InternalIP", "10.0.0.1"),
            a("ExternalIP", "132.143.154.163"),
        ];
        let out = addresses_from_node_ip("2600:1f14:1d4:d101:0:0:0:ba3d,10.0.0.1", &cloud).unwrap();
        assert_eq!(
            out,
            vec![
                a("InternalIP", "2600:1f14:1d4:d101::ba3d"),
                a("InternalIP", "10.0.0.1"),
                a("ExternalIP", "132.143.154.163"),
            ]
        );
    }

    #[test]
    fn node_ip_not_among_cloud_addresses_is_an_error() {
        let cloud = vec![a("InternalIP", "10.0.0.1")];
        assert_eq!(
            addresses_from_node_ip("10.0.0.9", &cloud).unwrap_err(),
            "failed to get node address from cloud provider that matches ip: 10.0.0.9"
        );
        assert_eq!(
            addresses_from_node_ip("bogus", &cloud).unwrap_err(),
            "failed to parse node IP \"bogus\": could not parse \"bogus\""
        );
        // docs/upstream-compat.md#upstream-sharp-edges: annotation present and the cloud has no addresses ⇒ error.
        assert!(addresses_from_node_ip("10.0.0.1", &[]).is_err());
    }

    #[test]
    fn desired_addresses_appends_kubelet_hostname_only_when_cloud_has_none() {
        let current = vec![a("InternalIP", "10.0.0.9"), a("Hostname", "kubelet-host")];
        let cloud = vec![a("InternalIP", "10.0.0.1"), a("ExternalIP", "1.2.3.4")];
        assert_eq!(
            desired_addresses(&cloud, &current, None).unwrap().unwrap(),
            vec![
                a("InternalIP", "10.0.0.1"),
                a("ExternalIP", "1.2.3.4"),
                a("Hostname", "kubelet-host")
            ]
        );
        let cloud = vec![a("InternalIP", "10.0.0.1"), a("Hostname", "cloud-host")];
        assert_eq!(
            desired_addresses(&cloud, &current, None).unwrap().unwrap(),
            cloud
        );
        assert!(desired_addresses(&[], &current, None).is_none());
        let with_ip = desired_addresses(
            &[a("ExternalIP", "1.2.3.4"), a("InternalIP", "10.0.0.1")],
            &current,
            Some("10.0.0.1"),
        );
        assert_eq!(
            with_ip.unwrap().unwrap(),
            vec![
                a("InternalIP", "10.0.0.1"),
                a("ExternalIP", "1.2.3.4"),
                a("Hostname", "kubelet-host")
            ]
        );
        assert!(
            desired_addresses(&[a("InternalIP", "10.0.0.1")], &current, Some("10.0.0.2"))
                .unwrap()
                .is_err()
        );
    }

    #[test]
    fn change_detection_matches_upstream_cases() {
        let base = vec![
            a("InternalIP", "10.0.0.1"),
            a("ExternalIP", "132.143.154.163"),
            a("Hostname", "h"),
        ];
        assert!(!addresses_changed(&base, &base.clone()));
        // Reordering distinct types is not a change.
        let reordered = vec![base[2].clone(), base[0].clone(), base[1].clone()];
        assert!(!addresses_changed(&base, &reordered));
        // Different IP.
        let mut other = base.clone();
        other[0].address = "10.0.0.2".into();
        assert!(addresses_changed(&base, &other));
        // Missing / extra Hostname.
        assert!(addresses_changed(&base, &base[..2]));
        assert!(addresses_changed(&base[..2], &base));
        // Swapped types.
        let swapped = vec![
            a("InternalIP", "132.143.154.163"),
            a("ExternalIP", "10.0.0.1"),
            a("Hostname", "h"),
        ];
        assert!(addresses_changed(&base, &swapped));
        assert!(!addresses_changed(&[], &[]));
    }

    #[test]
    fn change_detection_catches_changes_within_a_repeated_type() {
        let cur = vec![a("InternalIP", "10.0.0.1"), a("InternalIP", "10.0.0.2")];
        let new = vec![a("InternalIP", "10.0.0.2"), a("InternalIP", "10.0.0.2")];
        assert!(addresses_changed(&cur, &new), "upstream misses this one");
        // Reordering within a type is a change upstream too.
        let rev = vec![cur[1].clone(), cur[0].clone()];
        assert!(addresses_changed(&cur, &rev));
    }

    #[test]
    fn reserved_label_keys_follow_the_upstream_regex() {
        for k in [
            "kubernetes.io/x",
            "k8s.io/x",
            "topology.kubernetes.io/x",
            "topology.k8s.io/x",
            "node.kubernetes.io/instance-type",
            "a.b.k8s.io/y",
        ] {
            assert!(is_reserved_label_key(k), "{k} should be reserved");
        }
        for k in [
            "topology.k8s.cp/x",
            "app.k8snio/x",
            "k8snio/x",
            "example.com/kubernetes.io",
            "mykubernetes.io/x",
            "custom",
        ] {
            assert!(!is_reserved_label_key(k), "{k} should be allowed");
        }
    }

    #[test]
    fn label_reconciliation_copies_beta_to_ga() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // Missing GA labels are added.
        let l = labels(&[
            ("failure-domain.beta.kubernetes.io/zone", "zone-a"),
            ("failure-domain.beta.kubernetes.io/region", "region-a"),
            ("beta.kubernetes.io/instance-type", "the-type"),
        ]);
        assert_eq!(
            label_reconciliation(|k| l.get(k).map(String::as_str)),
            labels(&[
                ("topology.kubernetes.io/zone", "zone-a"),
                ("topology.kubernetes.io/region", "region-a"),
                ("node.kubernetes.io/instance-type", "the-type"),
            ])
        );
        // Consistent: nothing.
        let l = labels(&[
            ("failure-domain.beta.kubernetes.io/zone", "zone-a"),
            ("topology.kubernetes.io/zone", "zone-a"),
        ]);
        assert!(label_reconciliation(|k| l.get(k).map(String::as_str)).is_empty());
        // GA differs from beta: overwritten.
        let l = labels(&[
            ("beta.kubernetes.io/instance-type", "new"),
            ("node.kubernetes.io/instance-type", "old"),
        ]);
        assert_eq!(
            label_reconciliation(|k| l.get(k).map(String::as_str)),
            labels(&[("node.kubernetes.io/instance-type", "new")])
        );
        // Only GA present: beta is the source of truth, nothing to do.
        let l = labels(&[("topology.kubernetes.io/zone", "zone-a")]);
        assert!(label_reconciliation(|k| l.get(k).map(String::as_str)).is_empty());
        assert!(label_reconciliation(|_| None).is_empty());
    }
}
