//! Bounds on what a plugin may return. Every answer that crosses the ABI is checked in
//! [`super::Provider::call`] before the host uses it; one over a limit is refused as an error
//! naming the limit, so a buggy or hostile plugin cannot make the host copy, serialise and write
//! to the API server ever larger objects (a probe's plugin returned 200 MB per node).
//!
//! | what | limit |
//! |---|---|
//! | any string (provider ID, address, name, label, hostname, CIDR, error message) | [`MAX_STRING`] bytes |
//! | addresses of one instance or route | [`MAX_ADDRESSES`] |
//! | additional labels of one instance | [`MAX_LABELS`] |
//! | load-balancer ingress entries, ports of one entry | [`MAX_INGRESS`], [`MAX_PORTS`] |
//! | routes listed, hosts read back, answers of a bulk lookup, other lists | [`MAX_LIST`] |
//!
//! The limits are far above what a real cloud returns (upstream has none; Kubernetes objects
//! cannot hold more anyway).

use ccm_provider_abi::{InstanceMetadata, InstanceStatus, ProviderError, Route, Zone};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, NodeAddress};

/// Longest string accepted (bytes).
pub const MAX_STRING: usize = 64 * 1024;
/// Most addresses of one instance or route.
pub const MAX_ADDRESSES: usize = 256;
/// Most additional labels of one instance.
pub const MAX_LABELS: usize = 256;
/// Most ingress entries of one load balancer.
pub const MAX_INGRESS: usize = 256;
/// Most ports of one ingress entry.
pub const MAX_PORTS: usize = 1024;
/// Most entries of any other list (routes, hosts, batch answers, clusters).
pub const MAX_LIST: usize = 1_000_000;

/// What in a plugin's answer is over which limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverLimit {
    /// A string longer than [`MAX_STRING`].
    #[error("{what} of {len} bytes (at most {MAX_STRING})")]
    String {
        /// What the string is ("a provider ID").
        what: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// A list longer than its limit.
    #[error("{len} {what} (at most {max})")]
    List {
        /// What the entries are ("node addresses").
        what: &'static str,
        /// How many there are.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// A value a plugin returned, checked against the limits.
pub trait Bounded {
    /// `Err` names what is over which limit.
    fn check(&self) -> Result<(), OverLimit>;
}

fn string(what: &'static str, s: &str) -> Result<(), OverLimit> {
    if s.len() > MAX_STRING {
        return Err(OverLimit::String { what, len: s.len() });
    }
    Ok(())
}

fn opt_string(what: &'static str, s: &Option<String>) -> Result<(), OverLimit> {
    s.as_deref().map_or(Ok(()), |s| string(what, s))
}

fn list<T>(what: &'static str, v: &[T], max: usize) -> Result<(), OverLimit> {
    if v.len() > max {
        return Err(OverLimit::List {
            what,
            len: v.len(),
            max,
        });
    }
    Ok(())
}

impl Bounded for () {
    fn check(&self) -> Result<(), OverLimit> {
        Ok(())
    }
}

impl Bounded for bool {
    fn check(&self) -> Result<(), OverLimit> {
        Ok(())
    }
}

impl Bounded for String {
    fn check(&self) -> Result<(), OverLimit> {
        string("a string", self)
    }
}

impl<T: Bounded> Bounded for Option<T> {
    fn check(&self) -> Result<(), OverLimit> {
        self.as_ref().map_or(Ok(()), Bounded::check)
    }
}

impl<T: Bounded> Bounded for Vec<T> {
    fn check(&self) -> Result<(), OverLimit> {
        list("entries", self, MAX_LIST)?;
        self.iter().try_for_each(Bounded::check)
    }
}

impl<T: Bounded> Bounded for Result<T, ProviderError> {
    fn check(&self) -> Result<(), OverLimit> {
        match self {
            Ok(v) => v.check(),
            Err(e) => string("an error message", e.message()),
        }
    }
}

impl Bounded for NodeAddress {
    fn check(&self) -> Result<(), OverLimit> {
        string("an address type", &self.type_)?;
        string("an address", &self.address)
    }
}

fn addresses(what: &'static str, v: &[NodeAddress]) -> Result<(), OverLimit> {
    list(what, v, MAX_ADDRESSES)?;
    v.iter().try_for_each(Bounded::check)
}

impl Bounded for InstanceMetadata {
    fn check(&self) -> Result<(), OverLimit> {
        string("a provider ID", &self.provider_id)?;
        string("an instance type", &self.instance_type)?;
        string("a zone", &self.zone)?;
        string("a region", &self.region)?;
        addresses("node addresses", &self.node_addresses)?;
        list(
            "additional labels",
            &self.additional_labels.iter().collect::<Vec<_>>(),
            MAX_LABELS,
        )?;
        for (k, v) in &self.additional_labels {
            string("a label key", k)?;
            string("a label value", v)?;
        }
        Ok(())
    }
}

impl Bounded for InstanceStatus {
    fn check(&self) -> Result<(), OverLimit> {
        self.metadata.check()
    }
}

impl Bounded for Zone {
    fn check(&self) -> Result<(), OverLimit> {
        string("a zone", &self.failure_domain)?;
        string("a region", &self.region)
    }
}

impl Bounded for Route {
    fn check(&self) -> Result<(), OverLimit> {
        string("a route name", &self.name)?;
        string("a route's target node", &self.target_node)?;
        string("a route's destination", &self.destination_cidr)?;
        addresses("route addresses", &self.target_node_addresses)
    }
}

impl Bounded for LoadBalancerStatus {
    fn check(&self) -> Result<(), OverLimit> {
        let Some(ingress) = &self.ingress else {
            return Ok(());
        };
        list("load-balancer ingress entries", ingress, MAX_INGRESS)?;
        for i in ingress {
            opt_string("an ingress IP", &i.ip)?;
            opt_string("an ingress hostname", &i.hostname)?;
            opt_string("an ingress ipMode", &i.ip_mode)?;
            if let Some(ports) = &i.ports {
                list("ports of an ingress entry", ports, MAX_PORTS)?;
                for p in ports {
                    string("a port protocol", &p.protocol)?;
                    opt_string("a port error", &p.error)?;
                }
            }
        }
        Ok(())
    }
}

/// Check an answer of `op`, turning a value over the limits into an error naming them.
pub fn check<T: Bounded>(op: &str, value: T) -> Result<T, ProviderError> {
    match value.check() {
        Ok(()) => Ok(value),
        Err(what) => Err(ProviderError::other(format!(
            "{op}: the plugin returned {what}; refused (limits in the host's provider/limits.rs)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_over_the_limits_are_refused_with_what_and_which_limit() {
        let mut m = InstanceMetadata {
            provider_id: "fake://n1".into(),
            ..Default::default()
        };
        assert!(check("InstanceMetadata", Some(m.clone())).is_ok());
        m.node_addresses = (0..MAX_ADDRESSES + 1)
            .map(|i| NodeAddress {
                type_: "InternalIP".into(),
                address: format!("10.0.{}.{}", i / 256, i % 256),
            })
            .collect();
        let e = check("InstanceMetadata", Some(m.clone())).unwrap_err();
        assert_eq!(
            e.to_string(),
            "InstanceMetadata: the plugin returned 257 node addresses (at most 256); refused (limits in the host's provider/limits.rs)"
        );
        m.node_addresses = Vec::new();
        m.provider_id = "x".repeat(MAX_STRING + 1);
        let e = check("InstanceMetadata", Some(m)).unwrap_err();
        assert!(
            e.to_string().contains("a provider ID of 65537 bytes"),
            "{e}"
        );
    }
}
