//! Results that cross the plugin boundary, in two forms: the ABI-stable `Abi*` structs that travel
//! through the FFI, and the plain Rust types plugin authors and the host work with.
//!
//! Kubernetes objects given *to* a provider (Node, Service) cross as JSON text; results coming
//! back are typed. Addresses and load-balancer statuses use the k8s-openapi types so that both
//! sides speak Kubernetes' own vocabulary.

use std::collections::BTreeMap;

use abi_stable::{
    std_types::{ROption, RString, RVec, Tuple2},
    StableAbi,
};
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, NodeAddress, PortStatus,
};

/// Address types of `status.addresses`.
pub mod address_type {
    /// `Hostname`
    pub const HOSTNAME: &str = "Hostname";
    /// `InternalIP`
    pub const INTERNAL_IP: &str = "InternalIP";
    /// `ExternalIP`
    pub const EXTERNAL_IP: &str = "ExternalIP";
    /// `InternalDNS`
    pub const INTERNAL_DNS: &str = "InternalDNS";
    /// `ExternalDNS`
    pub const EXTERNAL_DNS: &str = "ExternalDNS";
}

/// Metadata of an instance, returned by `InstancesV2::instance_metadata` (upstream `InstanceMetadata`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// Written to `spec.providerID` when the node has none; conventionally `<provider>://<id>`.
    pub provider_id: String,
    /// Instance type label value.
    pub instance_type: String,
    /// The node's addresses, in the order they should appear in `status.addresses`.
    pub node_addresses: Vec<NodeAddress>,
    /// Zone label value.
    pub zone: String,
    /// Region label value.
    pub region: String,
    /// Extra labels; keys in the kubernetes.io / k8s.io namespaces are dropped by the host.
    pub additional_labels: BTreeMap<String, String>,
}

/// ABI 1.1: one node's answer to a bulk lookup ([`crate::sdk::BulkInstances`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceStatus {
    /// The instance exists; `false` is the explicit "does not exist" answer.
    pub exists: bool,
    /// The instance is shut down.
    pub shutdown: bool,
    /// Its metadata, when asked for and the instance exists.
    pub metadata: Option<InstanceMetadata>,
}

impl From<InstanceStatus> for crate::ext::AbiInstanceStatus {
    fn from(s: InstanceStatus) -> Self {
        Self {
            exists: s.exists,
            shutdown: s.shutdown,
            metadata: s.metadata.map(AbiInstanceMetadata::from).into(),
        }
    }
}

impl From<crate::ext::AbiInstanceStatus> for InstanceStatus {
    fn from(s: crate::ext::AbiInstanceStatus) -> Self {
        Self {
            exists: s.exists,
            shutdown: s.shutdown,
            metadata: s.metadata.into_option().map(InstanceMetadata::from),
        }
    }
}

/// A failure domain (upstream `cloudprovider.Zone`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// Zone name.
    pub failure_domain: String,
    /// Region name.
    pub region: String,
}

/// A pod-network route (upstream `cloudprovider.Route`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Route {
    /// The provider's name for the route; ignored on create.
    pub name: String,
    /// Name of the node the route points at.
    pub target_node: String,
    /// Addresses of the target node (considered only when `enable_node_addresses`).
    pub target_node_addresses: Vec<NodeAddress>,
    /// The provider opts in to address-aware reconciliation.
    pub enable_node_addresses: bool,
    /// Pod CIDR.
    pub destination_cidr: String,
    /// The route's target is gone.
    pub blackhole: bool,
}

// ---------------------------------------------------------------------------------------------
// ABI-stable forms
// ---------------------------------------------------------------------------------------------

/// ABI form of a `NodeAddress`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiNodeAddress {
    /// `Hostname`, `InternalIP`, ...
    pub address_type: RString,
    /// The address text.
    pub address: RString,
}

/// ABI form of [`InstanceMetadata`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiInstanceMetadata {
    /// See [`InstanceMetadata::provider_id`].
    pub provider_id: RString,
    /// See [`InstanceMetadata::instance_type`].
    pub instance_type: RString,
    /// See [`InstanceMetadata::node_addresses`].
    pub node_addresses: RVec<AbiNodeAddress>,
    /// See [`InstanceMetadata::zone`].
    pub zone: RString,
    /// See [`InstanceMetadata::region`].
    pub region: RString,
    /// See [`InstanceMetadata::additional_labels`].
    pub additional_labels: RVec<Tuple2<RString, RString>>,
}

/// ABI form of [`Zone`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiZone {
    /// Zone name.
    pub failure_domain: RString,
    /// Region name.
    pub region: RString,
}

/// ABI form of [`Route`].
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiRoute {
    /// See [`Route::name`].
    pub name: RString,
    /// See [`Route::target_node`].
    pub target_node: RString,
    /// See [`Route::target_node_addresses`].
    pub target_node_addresses: RVec<AbiNodeAddress>,
    /// See [`Route::enable_node_addresses`].
    pub enable_node_addresses: bool,
    /// See [`Route::destination_cidr`].
    pub destination_cidr: RString,
    /// See [`Route::blackhole`].
    pub blackhole: bool,
}

/// ABI form of a `PortStatus`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiPortStatus {
    /// Port number.
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: RString,
    /// Error condition of the port, if any.
    pub error: ROption<RString>,
}

/// ABI form of a `LoadBalancerIngress`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiLoadBalancerIngress {
    /// IP address.
    pub ip: ROption<RString>,
    /// Host name.
    pub hostname: ROption<RString>,
    /// `VIP` or `Proxy`.
    pub ip_mode: ROption<RString>,
    /// Per-port status.
    pub ports: ROption<RVec<AbiPortStatus>>,
}

/// ABI form of a `LoadBalancerStatus`.
#[repr(C)]
#[derive(StableAbi, Debug, Clone, PartialEq, Eq)]
pub struct AbiLoadBalancerStatus {
    /// `None` and an empty list are distinct on the wire but equal for the controllers.
    pub ingress: ROption<RVec<AbiLoadBalancerIngress>>,
}

// ---------------------------------------------------------------------------------------------
// Conversions
// ---------------------------------------------------------------------------------------------

fn rs(s: String) -> RString {
    RString::from(s)
}

fn opt(o: Option<String>) -> ROption<RString> {
    o.map(RString::from).into()
}

fn unopt(o: ROption<RString>) -> Option<String> {
    o.into_option().map(RString::into_string)
}

impl From<NodeAddress> for AbiNodeAddress {
    fn from(a: NodeAddress) -> Self {
        Self {
            address_type: rs(a.type_),
            address: rs(a.address),
        }
    }
}

impl From<AbiNodeAddress> for NodeAddress {
    fn from(a: AbiNodeAddress) -> Self {
        Self {
            type_: a.address_type.into_string(),
            address: a.address.into_string(),
        }
    }
}

fn addrs_to_abi(v: Vec<NodeAddress>) -> RVec<AbiNodeAddress> {
    v.into_iter().map(AbiNodeAddress::from).collect()
}

fn addrs_from_abi(v: RVec<AbiNodeAddress>) -> Vec<NodeAddress> {
    v.into_iter().map(NodeAddress::from).collect()
}

impl From<InstanceMetadata> for AbiInstanceMetadata {
    fn from(m: InstanceMetadata) -> Self {
        Self {
            provider_id: rs(m.provider_id),
            instance_type: rs(m.instance_type),
            node_addresses: addrs_to_abi(m.node_addresses),
            zone: rs(m.zone),
            region: rs(m.region),
            additional_labels: m
                .additional_labels
                .into_iter()
                .map(|(k, v)| Tuple2(rs(k), rs(v)))
                .collect(),
        }
    }
}

impl From<AbiInstanceMetadata> for InstanceMetadata {
    fn from(m: AbiInstanceMetadata) -> Self {
        Self {
            provider_id: m.provider_id.into_string(),
            instance_type: m.instance_type.into_string(),
            node_addresses: addrs_from_abi(m.node_addresses),
            zone: m.zone.into_string(),
            region: m.region.into_string(),
            additional_labels: m
                .additional_labels
                .into_iter()
                .map(|Tuple2(k, v)| (k.into_string(), v.into_string()))
                .collect(),
        }
    }
}

impl From<Zone> for AbiZone {
    fn from(z: Zone) -> Self {
        Self {
            failure_domain: rs(z.failure_domain),
            region: rs(z.region),
        }
    }
}

impl From<AbiZone> for Zone {
    fn from(z: AbiZone) -> Self {
        Self {
            failure_domain: z.failure_domain.into_string(),
            region: z.region.into_string(),
        }
    }
}

impl From<Route> for AbiRoute {
    fn from(r: Route) -> Self {
        Self {
            name: rs(r.name),
            target_node: rs(r.target_node),
            target_node_addresses: addrs_to_abi(r.target_node_addresses),
            enable_node_addresses: r.enable_node_addresses,
            destination_cidr: rs(r.destination_cidr),
            blackhole: r.blackhole,
        }
    }
}

impl From<AbiRoute> for Route {
    fn from(r: AbiRoute) -> Self {
        Self {
            name: r.name.into_string(),
            target_node: r.target_node.into_string(),
            target_node_addresses: addrs_from_abi(r.target_node_addresses),
            enable_node_addresses: r.enable_node_addresses,
            destination_cidr: r.destination_cidr.into_string(),
            blackhole: r.blackhole,
        }
    }
}

impl From<LoadBalancerStatus> for AbiLoadBalancerStatus {
    fn from(s: LoadBalancerStatus) -> Self {
        Self {
            ingress: s
                .ingress
                .map(|v| {
                    v.into_iter()
                        .map(|i| AbiLoadBalancerIngress {
                            ip: opt(i.ip),
                            hostname: opt(i.hostname),
                            ip_mode: opt(i.ip_mode),
                            ports: i
                                .ports
                                .map(|p| {
                                    p.into_iter()
                                        .map(|p| AbiPortStatus {
                                            port: p.port,
                                            protocol: rs(p.protocol),
                                            error: opt(p.error),
                                        })
                                        .collect()
                                })
                                .into(),
                        })
                        .collect()
                })
                .into(),
        }
    }
}

impl From<AbiLoadBalancerStatus> for LoadBalancerStatus {
    fn from(s: AbiLoadBalancerStatus) -> Self {
        Self {
            ingress: s.ingress.into_option().map(|v| {
                v.into_iter()
                    .map(|i| LoadBalancerIngress {
                        ip: unopt(i.ip),
                        hostname: unopt(i.hostname),
                        ip_mode: unopt(i.ip_mode),
                        ports: i.ports.into_option().map(|p| {
                            p.into_iter()
                                .map(|p| PortStatus {
                                    port: p.port,
                                    protocol: p.protocol.into_string(),
                                    error: unopt(p.error),
                                })
                                .collect()
                        }),
                    })
                    .collect()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_keep_every_field() {
        let md = InstanceMetadata {
            provider_id: "fake://1".into(),
            instance_type: "m1".into(),
            node_addresses: vec![NodeAddress {
                type_: address_type::INTERNAL_IP.into(),
                address: "10.0.0.1".into(),
            }],
            zone: "z".into(),
            region: "r".into(),
            additional_labels: [("a/b".to_string(), "c".to_string())].into(),
        };
        assert_eq!(
            InstanceMetadata::from(AbiInstanceMetadata::from(md.clone())),
            md
        );

        let route = Route {
            name: "n".into(),
            target_node: "node".into(),
            target_node_addresses: md.node_addresses.clone(),
            enable_node_addresses: true,
            destination_cidr: "10.244.0.0/24".into(),
            blackhole: true,
        };
        assert_eq!(Route::from(AbiRoute::from(route.clone())), route);

        let status = LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some("1.2.3.4".into()),
                hostname: None,
                ip_mode: Some("VIP".into()),
                ports: Some(vec![PortStatus {
                    port: 80,
                    protocol: "TCP".into(),
                    error: None,
                }]),
            }]),
        };
        assert_eq!(
            LoadBalancerStatus::from(AbiLoadBalancerStatus::from(status.clone())),
            status
        );
        let empty = LoadBalancerStatus { ingress: None };
        assert_eq!(
            LoadBalancerStatus::from(AbiLoadBalancerStatus::from(empty.clone())),
            empty
        );
    }
}
