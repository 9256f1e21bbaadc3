//! What the suite seeds: kubelet-style Nodes (tainted, not yet Ready, with pod CIDRs) for the
//! check instances, a Node whose instance does not exist, an optional stopped instance, and
//! LoadBalancer Services.

use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};
use serde_json::{json, Value};

use ccm_host::runtime::well_known::UNINITIALIZED_TAINT;

/// Node names used when no `--node` is given.
pub const DEFAULT_NODES: [&str; 3] = ["ccm-check-1", "ccm-check-2", "ccm-check-3"];

/// Namespace of the check Services.
pub const NAMESPACE: &str = "default";

/// One node of the scene.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// `metadata.name`.
    pub name: String,
    /// `spec.providerID` set by "kubelet" (`--node NAME=ID`), if any.
    pub provider_id: Option<String>,
    /// `spec.podCIDR`, if the node gets one.
    pub pod_cidr: Option<String>,
}

impl NodeSpec {
    /// Parse `NAME` or `NAME=PROVIDER_ID`.
    pub fn parse(flag: &str, value: &str) -> Result<Self, String> {
        let (name, provider_id) = match value.split_once('=') {
            Some((n, id)) => (n, Some(id)),
            None => (value, None),
        };
        dns_subdomain(name).map_err(|e| format!("{flag} {value:?}: {e}"))?;
        if provider_id.is_some_and(str::is_empty) {
            return Err(format!(
                "{flag} {value:?}: empty provider ID after '=' (leave out '=' to let the provider set it)"
            ));
        }
        Ok(Self {
            name: name.to_string(),
            provider_id: provider_id.map(str::to_string),
            pod_cidr: None,
        })
    }
}

/// A Node name must be a DNS-1123 subdomain (the API server refuses anything else).
pub fn dns_subdomain(name: &str) -> Result<(), String> {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "{name:?} is not a valid node name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.')"
        ));
    }
    Ok(())
}

/// `n` pod CIDRs for the nodes plus one spare for the route round trip, carved out of the
/// cluster CIDR (/24 subnets of IPv4, /64 of IPv6).
pub fn pod_cidrs(cluster: &IpNet, n: usize) -> Result<(Vec<String>, String), String> {
    let prefix = match cluster.addr() {
        IpAddr::V4(_) => 24,
        IpAddr::V6(_) => 64,
    };
    let too_small = || {
        format!(
            "--cluster-cidr {cluster} is too small: the check needs {} /{prefix} subnets (one per node and one spare)",
            n + 1
        )
    };
    let subnets: Vec<String> = cluster
        .subnets(prefix)
        .map_err(|_| too_small())?
        .take(n + 1)
        .map(|s| s.to_string())
        .collect();
    if subnets.len() < n + 1 {
        return Err(too_small());
    }
    let spare = subnets[n].clone();
    Ok((subnets[..n].to_vec(), spare))
}

/// A short token unique to this run (time and process id), for names and UIDs.
pub fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!(
        "{:x}",
        (nanos as u64) ^ (u64::from(std::process::id()) << 40)
    )
}

/// A UUID-shaped UID derived from `nonce` and a salt (for objects the suite builds itself).
pub fn uid(nonce: &str, salt: &str) -> String {
    // FNV-1a over nonce and salt, twice with different seeds: 128 bits.
    let hash = |seed: u64| {
        nonce
            .bytes()
            .chain([0])
            .chain(salt.bytes())
            .fold(seed, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
            })
    };
    let h = format!(
        "{:016x}{:016x}",
        hash(0xcbf2_9ce4_8422_2325),
        hash(0x8422_2325_cbf2_9ce4)
    );
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

/// A Node as kubelet registers it with `--cloud-provider=external`: the uninitialised taint
/// (when `tainted`), the Ready condition `ready`, hostname labels, the pod CIDR, and a provider
/// ID only when kubelet was given one.
pub fn node(spec: &NodeSpec, ready: &str, tainted: bool) -> Value {
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
            },
        },
        "spec": {},
        "status": {
            "conditions": [{
                "type": "Ready",
                "status": ready,
                "reason": "KubeletNotReady",
                "message": "ccm-host check: the node is not ready, so the lifecycle controller examines it",
            }],
        },
    });
    if tainted {
        node["spec"]["taints"] =
            json!([{"key": UNINITIALIZED_TAINT, "value": "true", "effect": "NoSchedule"}]);
    }
    if let Some(id) = &spec.provider_id {
        node["spec"]["providerID"] = json!(id);
    }
    if let Some(cidr) = &spec.pod_cidr {
        node["spec"]["podCIDR"] = json!(cidr);
        node["spec"]["podCIDRs"] = json!([cidr]);
    }
    node
}

/// The same node as a typed object (for direct provider calls).
pub fn typed_node(value: &Value) -> Node {
    serde_json::from_value(value.clone()).expect("the scene's nodes are valid Node objects")
}

/// A LoadBalancer Service with one TCP port. `uid` is set for Services the suite hands to the
/// provider directly (the API server assigns one to those it stores).
pub fn service(name: &str, uid: Option<&str>) -> Service {
    let mut svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "type": "LoadBalancer",
            "selector": {"app": name},
            "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080, "nodePort": 30080}],
            "externalTrafficPolicy": "Cluster",
            "sessionAffinity": "None",
        },
    });
    if let Some(uid) = uid {
        svc["metadata"]["uid"] = json!(uid);
        svc["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
        svc["spec"]["clusterIP"] = json!("10.96.0.100");
        svc["spec"]["clusterIPs"] = json!(["10.96.0.100"]);
    }
    serde_json::from_value(svc).expect("the scene's services are valid Service objects")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_flags() {
        let s = NodeSpec::parse("--node", "n1").unwrap();
        assert_eq!((s.name.as_str(), s.provider_id), ("n1", None));
        let s = NodeSpec::parse("--node", "n1=aws:///zone/i-1").unwrap();
        assert_eq!(s.provider_id.as_deref(), Some("aws:///zone/i-1"));
        assert!(NodeSpec::parse("--node", "N1")
            .unwrap_err()
            .contains("not a valid node name"));
        assert!(NodeSpec::parse("--node", "n1=")
            .unwrap_err()
            .contains("empty provider ID"));
        assert!(NodeSpec::parse("--node", "").is_err());
    }

    #[test]
    fn cidrs_are_carved_from_the_cluster_cidr() {
        let (nodes, spare) = pod_cidrs(&"10.244.0.0/16".parse().unwrap(), 3).unwrap();
        assert_eq!(nodes, ["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"]);
        assert_eq!(spare, "10.244.3.0/24");
        let (nodes, _) = pod_cidrs(&"fd00:10:244::/56".parse().unwrap(), 1).unwrap();
        assert_eq!(nodes, ["fd00:10:244::/64"]);
        assert!(pod_cidrs(&"10.0.0.0/24".parse().unwrap(), 1)
            .unwrap_err()
            .contains("too small"));
        assert!(pod_cidrs(&"10.0.0.0/25".parse().unwrap(), 1).is_err());
    }

    #[test]
    fn seeded_objects_parse() {
        let spec = NodeSpec {
            name: "n1".into(),
            provider_id: Some("p://1".into()),
            pod_cidr: Some("10.244.0.0/24".into()),
        };
        let n = typed_node(&node(&spec, "Unknown", true));
        let nspec = n.spec.unwrap();
        assert_eq!(nspec.taints.unwrap()[0].key, UNINITIALIZED_TAINT);
        assert_eq!(nspec.provider_id.as_deref(), Some("p://1"));
        assert_eq!(nspec.pod_cidrs.unwrap(), ["10.244.0.0/24"]);
        let svc = service("web", Some(&uid("abc", "direct")));
        assert_eq!(svc.spec.unwrap().type_.as_deref(), Some("LoadBalancer"));
        let u = svc.metadata.uid.unwrap();
        assert_eq!(u.len(), 36);
        assert_ne!(u, uid("abc", "other"));
        assert_eq!(u, uid("abc", "direct"));
    }
}
