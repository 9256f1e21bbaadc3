//! The scene the sandbox seeds: kubelet-style nodes and LoadBalancer services, either generated
//! (`--nodes N --services M`) or read from a scenario file (`--scenario FILE`, YAML), the
//! providers that run it (`--cloud-provider`, or the scenario's `providers:` list for a hybrid
//! cluster), and the built-in demo clouds the fake and metal providers run with when no cloud
//! config of their own is given.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;

use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeAddress, NodeCondition, NodeSpec as K8sNodeSpec, NodeStatus,
    NodeSystemInfo, Service, ServicePort, ServiceSpec as K8sServiceSpec, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use ccm_host::runtime::well_known::{
    EXCLUDE_LB_LABEL, PROVIDED_NODE_IP_ANNOTATION, UNINITIALIZED_TAINT,
};

/// Default pod network of the sandbox cluster.
pub const DEFAULT_CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The class of the generated service that belongs to another controller.
pub const FOREIGN_CLASS: &str = "example.com/other-lb";
/// Name of the generated service with [`FOREIGN_CLASS`].
pub const FOREIGN_SERVICE: &str = "other-class-lb";
/// Control-plane role label (kubeadm).
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Where kubelets keep their node Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Namespaces that exist in the in-memory API server from the start.
const BUILT_IN_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];
/// The address pool of the metal provider's demo cloud (addresses are given out in this order:
/// the /24 first, readable in a summary; the /16 for large scenes).
pub const METAL_DEMO_POOL: [&str; 2] = ["192.0.2.0/24", "172.20.0.0/16"];

/// Whether the sandbox has a built-in demo cloud for the provider `name` (the providers of this
/// repository: the fake's programmable cloud, metal's inventory and address pool).
pub fn has_demo_cloud(name: &str) -> bool {
    is_fake(name) || is_metal(name)
}

/// The fake provider (`fake`, or its 1.0-style twin `fake-v1`).
pub fn is_fake(name: &str) -> bool {
    matches!(name, "fake" | "fake-v1")
}

/// The metal provider.
pub fn is_metal(name: &str) -> bool {
    name == "metal"
}

/// A scenario file (`--scenario FILE`). Every key is optional; unknown keys are errors.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Scenario {
    /// Pod network of the cluster (`--cluster-cidr` of the controllers); podCIDRs are cut from it.
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    /// Nodes, registered as a kubelet with `--cloud-provider=external` does.
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    /// Services of type LoadBalancer.
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    /// The provider's cloud config: a mapping of its keys (with the fake and metal providers
    /// laid over the built-in demo cloud key by key, so `errors:` alone injects faults into the
    /// fake's demo cloud), or a string handed over verbatim. Not with `providers:`.
    pub cloud_config: Option<Value>,
    /// Several providers in one host (a hybrid cluster, `ccm-host run --cloud-provider a,b`),
    /// in order: the first is the default provider (it serves classless services). Empty: the
    /// one provider of `--cloud-provider`.
    #[serde(default)]
    pub providers: Vec<ProviderEntry>,
}

/// One provider of a scenario's `providers:` list.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderEntry {
    /// The registered provider name (`--cloud-provider`), required.
    pub name: String,
    /// Its cloud config, as the top-level `cloudConfig` of a one-provider scenario.
    pub cloud_config: Option<Value>,
    /// `--cloud-provider-platforms NAME=PLATFORM`: the providerID prefixes it owns (default:
    /// the ones the provider declares, `<name>://` for the fake and metal).
    #[serde(default)]
    pub platforms: Vec<String>,
    /// `--load-balancer-class CLASS=NAME`: the loadBalancerClasses it serves.
    #[serde(default)]
    pub load_balancer_classes: Vec<String>,
    /// `--load-balancer-hosts NAME=owned|all`.
    pub load_balancer_hosts: Option<String>,
}

/// One node of a scenario.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeSpec {
    /// Node name (a DNS-1123 subdomain), required.
    pub name: String,
    /// Extra labels (the kubelet's own `kubernetes.io/hostname`, `kubernetes.io/os` and
    /// `kubernetes.io/arch` are always set).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Extra annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Taints besides the cloud provider's `uninitialized` taint.
    #[serde(default)]
    pub taints: Vec<TaintSpec>,
    /// The kubelet's `--node-ip`: sets the `alpha.kubernetes.io/provided-node-ip` annotation
    /// and the node's first InternalIP address.
    #[serde(rename = "providedIP")]
    pub provided_ip: Option<String>,
    /// The node's pod CIDR; default: the next free range of the cluster CIDR.
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    /// Demo cloud only: instance type.
    pub instance_type: Option<String>,
    /// Demo cloud only: zone.
    pub zone: Option<String>,
    /// Demo cloud only: region.
    pub region: Option<String>,
    /// Demo cloud only: the instance's ExternalIP.
    #[serde(rename = "externalIP")]
    pub external_ip: Option<String>,
    /// The provider whose cloud has this node's machine (its demo cloud describes it); default:
    /// the first provider, or none when the node has a `providerID`.
    pub provider: Option<String>,
    /// `spec.providerID` as registered (a kubelet's `--provider-id`, or a kwok node's); a
    /// platform no provider owns makes the node foreign: it must stay untouched.
    #[serde(rename = "providerID")]
    pub provider_id: Option<String>,
}

/// A taint of a scenario node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default)]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// One service of a scenario (always `type: LoadBalancer`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceSpec {
    /// Service name (a DNS-1035 label), required.
    pub name: String,
    /// Namespace (created if missing); default `default`.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// `spec.loadBalancerClass`: a class the controllers do not handle must stay untouched.
    pub load_balancer_class: Option<String>,
    /// `spec.loadBalancerIP`.
    #[serde(rename = "loadBalancerIP")]
    pub load_balancer_ip: Option<String>,
    /// Ports; default one port `http` 80 -> 8080/TCP.
    #[serde(default = "default_ports")]
    pub ports: Vec<PortSpec>,
}

/// A service port.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortSpec {
    /// Port name (required when a service has more than one port).
    pub name: Option<String>,
    /// Port number.
    pub port: i64,
    /// Target port number; default: `port`.
    pub target_port: Option<i64>,
    /// `TCP` (default), `UDP` or `SCTP`.
    #[serde(default = "default_protocol")]
    pub protocol: String,
}

fn default_namespace() -> String {
    "default".into()
}

fn default_protocol() -> String {
    "TCP".into()
}

fn default_ports() -> Vec<PortSpec> {
    vec![PortSpec {
        name: Some("http".into()),
        port: 80,
        target_port: Some(8080),
        protocol: default_protocol(),
    }]
}

/// A validated scene: every node has its pod CIDR and (for the demo cloud) its InternalIP.
#[derive(Debug, Clone)]
pub struct Scene {
    /// Where the scene came from, for messages.
    pub source: String,
    /// The cluster's pod network.
    pub cluster_cidr: IpNet,
    /// Nodes in order.
    pub nodes: Vec<SceneNode>,
    /// Services in order.
    pub services: Vec<ServiceSpec>,
    /// The providers, in order (one unless the scenario has `providers:`).
    pub providers: Vec<SceneProvider>,
    /// The scenario names its providers (`providers:`); false: `--cloud-provider`.
    pub named_providers: bool,
}

/// A provider of a validated scene.
#[derive(Debug, Clone, PartialEq)]
pub struct SceneProvider {
    /// Registered name.
    pub name: String,
    /// Its cloud config from the scenario.
    pub cloud_config: Option<SceneCloudConfig>,
    /// It runs the sandbox's demo cloud (the scenario's mapping, if any, laid over it).
    pub demo: bool,
    /// `--cloud-provider-platforms` values.
    pub platforms: Vec<String>,
    /// `--load-balancer-class` values.
    pub load_balancer_classes: Vec<String>,
    /// `--load-balancer-hosts` value.
    pub load_balancer_hosts: Option<String>,
}

/// What a scene needs to know of the run besides the scenario.
#[derive(Debug, Clone, Copy)]
pub struct SceneContext<'a> {
    /// The provider of a scenario without `providers:` (`--cloud-provider`).
    pub provider: &'a str,
    /// `--cloud-config FILE` was given: that file is the provider's config (no demo cloud).
    pub config_file: bool,
}

impl SceneContext<'static> {
    /// The fake provider with its demo cloud (the sandbox's default).
    pub const FAKE: SceneContext<'static> = SceneContext {
        provider: "fake",
        config_file: false,
    };
}

/// A scenario's `cloudConfig`.
#[derive(Debug, Clone, PartialEq)]
pub enum SceneCloudConfig {
    /// A mapping of the provider's configuration keys: written as YAML (a YAML or JSON config
    /// reads it), and laid over the fake provider's demo cloud.
    Mapping(Map<String, Value>),
    /// A string: the config file's content, handed to the provider verbatim (any format: INI,
    /// JSON, a list of lines, ...). With the fake provider it replaces the demo cloud.
    Verbatim(String),
}

impl SceneProvider {
    /// Whether the scenario gives the config file's content verbatim.
    pub fn verbatim_config(&self) -> Option<&str> {
        match &self.cloud_config {
            Some(SceneCloudConfig::Verbatim(text)) => Some(text),
            _ => None,
        }
    }
}

impl Scene {
    /// The default (first) provider's verbatim config.
    pub fn verbatim_config(&self) -> Option<&str> {
        self.providers
            .first()
            .and_then(SceneProvider::verbatim_config)
    }

    /// The nodes whose machine is in the cloud of provider `index`.
    pub fn nodes_of(&self, index: usize) -> impl Iterator<Item = &SceneNode> {
        self.nodes.iter().filter(move |n| n.cloud == Some(index))
    }
}

/// A node of a validated scene.
#[derive(Debug, Clone)]
pub struct SceneNode {
    /// The scenario entry.
    pub spec: NodeSpec,
    /// Provided node IP, parsed.
    pub provided_ip: Option<IpAddr>,
    /// Pod CIDR, resolved.
    pub pod_cidr: IpNet,
    /// The demo cloud's InternalIP for this node (the provided IP when there is one).
    pub internal_ip: IpAddr,
    /// The provider (index) whose cloud has the node's machine: its `provider`, else the first
    /// provider unless the node has a providerID.
    pub cloud: Option<usize>,
}

/// Everything wrong with a scenario, one message per problem.
#[derive(Debug)]
pub struct SceneErrors(pub Vec<String>);

impl std::fmt::Display for SceneErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {e}")?;
        }
        Ok(())
    }
}

/// The pod network of a generated scene: the default /16 while its 256 /24 ranges suffice, else
/// the smallest block under 10.128.0.0/9 with a /24 for every node (2,000 nodes: a /13).
fn generated_cluster_cidr(nodes: usize) -> Option<String> {
    if nodes <= 256 {
        return None;
    }
    let bits = usize::BITS - (nodes - 1).leading_zeros();
    let prefix = 24u32.saturating_sub(bits).max(9);
    Some(format!("10.128.0.0/{prefix}"))
}

impl Scenario {
    /// Read and parse a scenario file (YAML or JSON).
    pub fn read(path: &Path) -> Result<Scenario, String> {
        let text = ccm_host::args::read_input_file(path)
            .and_then(|b| {
                String::from_utf8(b).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, e.utf8_error())
                })
            })
            .map_err(|e| format!("cannot read --scenario {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("invalid scenario {}: {e}", path.display()))
    }

    /// Parse scenario text.
    pub fn parse(text: &str) -> Result<Scenario, String> {
        if text.trim().is_empty() {
            return Err(
                "the file is empty (expected keys nodes, services, clusterCIDR, cloudConfig, providers)"
                    .into(),
            );
        }
        yaml_serde::from_str(text).map_err(|e| e.to_string())
    }

    /// The generated scene of `--nodes N --services M`: the first node is a control-plane node
    /// (excluded from load balancers, as kubeadm labels it) when there are two or more; every
    /// third node and the control plane have a provided node IP; nodes spread over three zones;
    /// the last service (when there are two or more) has a class the controllers do not own.
    pub fn generate(nodes: usize, services: usize) -> Scenario {
        let width = nodes.to_string().len().max(2);
        let zones = ["fake-zone-a", "fake-zone-b", "fake-zone-c"];
        let node_specs = (1..=nodes)
            .map(|i| {
                let control_plane = i == 1 && nodes >= 2;
                let mut spec = NodeSpec {
                    name: format!("node-{i:0width$}"),
                    zone: Some(zones[(i - 1) % zones.len()].to_string()),
                    region: Some("fake-region-1".into()),
                    instance_type: Some(
                        if control_plane || i % 4 == 0 {
                            "fake.large"
                        } else {
                            "fake.medium"
                        }
                        .into(),
                    ),
                    ..Default::default()
                };
                if control_plane {
                    spec.labels
                        .insert(CONTROL_PLANE_LABEL.into(), String::new());
                    spec.labels.insert(EXCLUDE_LB_LABEL.into(), String::new());
                    spec.taints.push(TaintSpec {
                        key: CONTROL_PLANE_LABEL.into(),
                        value: None,
                        effect: "NoSchedule".into(),
                    });
                } else if i % 2 == 0 && i < 240 {
                    spec.external_ip = Some(format!("198.51.100.{}", i + 10));
                }
                if control_plane || i % 3 == 0 {
                    // The demo cloud's InternalIP of node i (see `internal_ips`).
                    spec.provided_ip = Some(nth_internal_ip(i - 1).to_string());
                }
                spec
            })
            .collect();
        let names = [
            "web", "api", "shop", "search", "media", "chat", "auth", "docs",
        ];
        let service_specs = (0..services)
            .map(|i| {
                if services >= 2 && i == services - 1 {
                    return ServiceSpec {
                        name: FOREIGN_SERVICE.into(),
                        namespace: default_namespace(),
                        labels: BTreeMap::from([("app".into(), FOREIGN_SERVICE.into())]),
                        annotations: BTreeMap::new(),
                        load_balancer_class: Some(FOREIGN_CLASS.into()),
                        load_balancer_ip: None,
                        ports: default_ports(),
                    };
                }
                let name = names
                    .get(i)
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| format!("svc-{:02}", i + 1));
                let mut ports = default_ports();
                if i == 0 {
                    ports.push(PortSpec {
                        name: Some("https".into()),
                        port: 443,
                        target_port: Some(8443),
                        protocol: default_protocol(),
                    });
                }
                ServiceSpec {
                    labels: BTreeMap::from([("app".into(), name.clone())]),
                    name,
                    namespace: default_namespace(),
                    annotations: BTreeMap::new(),
                    load_balancer_class: None,
                    load_balancer_ip: None,
                    ports,
                }
            })
            .collect();
        Scenario {
            cluster_cidr: generated_cluster_cidr(nodes),
            nodes: node_specs,
            services: service_specs,
            cloud_config: None,
            providers: Vec::new(),
        }
    }

    /// The generated scene for a cloud other than the demo cloud: the instances' types, zones
    /// and addresses are the cloud's own, so the nodes carry no demo-cloud fields and no
    /// provided node IP (it would have to match an address the cloud reports).
    pub fn without_demo_cloud(mut self) -> Scenario {
        for n in &mut self.nodes {
            n.instance_type = None;
            n.zone = None;
            n.region = None;
            n.external_ip = None;
            n.provided_ip = None;
        }
        self
    }

    /// Validate and resolve. `cluster_cidr` (the flag) wins over the scenario's `clusterCIDR`;
    /// `ctx` names the provider of a scenario without `providers:` and says whether it runs a
    /// demo cloud (the demo-cloud-only node fields need one).
    pub fn into_scene(
        self,
        source: String,
        cluster_cidr: Option<&str>,
        ctx: &SceneContext<'_>,
    ) -> Result<Scene, SceneErrors> {
        let mut errors = Vec::new();
        let (cidr_text, cidr_origin) = match (cluster_cidr, self.cluster_cidr.as_deref()) {
            (Some(flag), _) => (flag.to_string(), "--cluster-cidr"),
            (None, Some(s)) => (s.to_string(), "clusterCIDR"),
            (None, None) => (DEFAULT_CLUSTER_CIDR.to_string(), "the default cluster CIDR"),
        };
        let cluster = match cidr_text.trim().parse::<IpNet>() {
            Ok(net) if net.trunc() == net => Some(net),
            Ok(net) => {
                errors.push(format!(
                    "{cidr_origin}: {cidr_text:?} has host bits set (did you mean {}?)",
                    net.trunc()
                ));
                None
            }
            Err(_) if cidr_text.contains(',') => {
                errors.push(format!(
                    "{cidr_origin}: {cidr_text:?}: the sandbox builds single-stack scenes; give one CIDR"
                ));
                None
            }
            Err(e) => {
                errors.push(format!(
                    "{cidr_origin}: {cidr_text:?} is not a CIDR (e.g. 10.244.0.0/16): {e}"
                ));
                None
            }
        };
        let (providers, named_providers) = self.scene_providers(ctx, &mut errors);

        // Nodes: names, IPs, pod CIDRs.
        let mut names = BTreeSet::new();
        let mut parsed = Vec::with_capacity(self.nodes.len());
        for (i, node) in self.nodes.iter().enumerate() {
            let at = format!("nodes[{i}]");
            if node.name.is_empty() {
                errors.push(format!("{at}.name: required"));
            } else if !names.insert(node.name.clone()) {
                errors.push(format!("{at}.name: duplicate node name {:?}", node.name));
            }
            let provided_ip = node.provided_ip.as_deref().and_then(|ip| {
                ip.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| {
                        errors.push(format!(
                            "{at}.providedIP: {ip:?} is not an IP address (one address, as the kubelet's --node-ip)"
                        ))
                    })
                    .ok()
            });
            let pod_cidr = node
                .pod_cidr
                .as_deref()
                .and_then(|c| match c.trim().parse::<IpNet>() {
                    Ok(net) if net.trunc() != net => {
                        errors.push(format!(
                            "{at}.podCIDR: {c:?} has host bits set (did you mean {}?)",
                            net.trunc()
                        ));
                        None
                    }
                    Ok(net) => {
                        if let Some(cluster) = cluster {
                            if !cluster.contains(&net) {
                                errors.push(format!(
                                    "{at}.podCIDR: {net} is not inside the cluster CIDR {cluster}"
                                ));
                            }
                        }
                        Some(net)
                    }
                    Err(e) => {
                        errors.push(format!("{at}.podCIDR: {c:?} is not a CIDR: {e}"));
                        None
                    }
                });
            // The provider whose cloud has the node's machine.
            let cloud = match node.provider.as_deref().map(str::trim) {
                Some(name) => {
                    let found = providers.iter().position(|p| p.name == name);
                    if found.is_none() {
                        let names: Vec<&str> = providers.iter().map(|p| p.name.as_str()).collect();
                        errors.push(if named_providers {
                            format!(
                                "{at}.provider: {name:?} is not one of the scenario's providers ({})",
                                names.join(", ")
                            )
                        } else {
                            format!(
                                "{at}.provider: {name:?} is not the provider of this run ({}; a scenario names several in providers:)",
                                names.join(", ")
                            )
                        });
                    }
                    found
                }
                None if node.provider_id.is_some() => None,
                None => Some(0),
            };
            if let Some(id) = &node.provider_id {
                if id.trim().is_empty() {
                    errors.push(format!(
                        "{at}.providerID: cannot be empty (leave it out: the cloud provider sets it)"
                    ));
                } else if id.chars().any(char::is_whitespace) {
                    errors.push(format!("{at}.providerID: {id:?} cannot hold spaces"));
                }
            }
            let demo = cloud.and_then(|k| providers.get(k)).filter(|p| p.demo);
            if demo.is_none() {
                for (field, set) in [
                    ("instanceType", node.instance_type.is_some()),
                    ("zone", node.zone.is_some()),
                    ("region", node.region.is_some()),
                    ("externalIP", node.external_ip.is_some()),
                ] {
                    if !set {
                        continue;
                    }
                    errors.push(match cloud.and_then(|k| providers.get(k)) {
                        None if node.provider.is_none() => format!(
                            "{at}.{field}: only applies to the built-in demo cloud, and a node with a providerID is in none unless it names its provider (provider: NAME)"
                        ),
                        _ => format!(
                            "{at}.{field}: only applies to the built-in demo cloud (the fake or metal provider without --cloud-config or a string cloudConfig); describe the instance in the provider's cloud config instead"
                        ),
                    });
                }
            }
            if let Some(ip) = &node.external_ip {
                if ip.trim().parse::<IpAddr>().is_err() {
                    errors.push(format!("{at}.externalIP: {ip:?} is not an IP address"));
                }
            }
            for (j, taint) in node.taints.iter().enumerate() {
                if !matches!(
                    taint.effect.as_str(),
                    "NoSchedule" | "PreferNoSchedule" | "NoExecute"
                ) {
                    errors.push(format!(
                        "{at}.taints[{j}].effect: {:?} is not one of NoSchedule, PreferNoSchedule, NoExecute",
                        taint.effect
                    ));
                }
                if taint.key == UNINITIALIZED_TAINT {
                    errors.push(format!(
                        "{at}.taints[{j}]: {UNINITIALIZED_TAINT} is added to every node already"
                    ));
                }
            }
            parsed.push((provided_ip, pod_cidr, cloud));
        }

        // Pod CIDRs: explicit ones must not overlap; the others get the next free range.
        let mut pod_cidrs: Vec<Option<IpNet>> = parsed.iter().map(|(_, c, _)| *c).collect();
        for i in 0..pod_cidrs.len() {
            for j in 0..i {
                if let (Some(a), Some(b)) = (pod_cidrs[i], pod_cidrs[j]) {
                    if a.contains(&b) || b.contains(&a) {
                        errors.push(format!(
                            "nodes[{i}].podCIDR: {a} overlaps {b} of nodes[{j}] ({})",
                            self.nodes[j].name
                        ));
                    }
                }
            }
        }
        if let Some(cluster) = cluster {
            let missing = pod_cidrs.iter().filter(|c| c.is_none()).count();
            if missing > 0 {
                let per_node = match cluster {
                    IpNet::V4(_) => 24,
                    IpNet::V6(_) => 64,
                }
                .max(cluster.prefix_len());
                let taken: Vec<IpNet> = pod_cidrs.iter().flatten().copied().collect();
                let mut free = cluster
                    .subnets(per_node)
                    .into_iter()
                    .flatten()
                    .filter(|s| !taken.iter().any(|t| t.contains(s) || s.contains(t)));
                let mut short = 0;
                for slot in pod_cidrs.iter_mut().filter(|c| c.is_none()) {
                    match free.next() {
                        Some(s) => *slot = Some(s),
                        None => short += 1,
                    }
                }
                if short > 0 {
                    errors.push(format!(
                        "{cidr_origin} {cluster} has room for {} more /{per_node} pod ranges, but {missing} nodes need one; use a larger cluster CIDR",
                        missing - short
                    ));
                }
            }
        }

        // Services.
        let mut keys = BTreeSet::new();
        for (i, svc) in self.services.iter().enumerate() {
            let at = format!("services[{i}]");
            if svc.name.is_empty() {
                errors.push(format!("{at}.name: required"));
            } else if !keys.insert((svc.namespace.clone(), svc.name.clone())) {
                errors.push(format!(
                    "{at}.name: duplicate service {}/{}",
                    svc.namespace, svc.name
                ));
            }
            if svc.ports.is_empty() {
                errors.push(format!(
                    "{at}.ports: a LoadBalancer service needs at least one port"
                ));
            }
            let mut port_names = BTreeSet::new();
            for (j, p) in svc.ports.iter().enumerate() {
                if !(1..=65535).contains(&p.port) {
                    errors.push(format!(
                        "{at}.ports[{j}].port: {} is not between 1 and 65535",
                        p.port
                    ));
                }
                if let Some(t) = p.target_port {
                    if !(1..=65535).contains(&t) {
                        errors.push(format!(
                            "{at}.ports[{j}].targetPort: {t} is not between 1 and 65535"
                        ));
                    }
                }
                if !matches!(p.protocol.as_str(), "TCP" | "UDP" | "SCTP") {
                    errors.push(format!(
                        "{at}.ports[{j}].protocol: {:?} is not one of TCP, UDP, SCTP",
                        p.protocol
                    ));
                }
                match &p.name {
                    None if svc.ports.len() > 1 => errors.push(format!(
                        "{at}.ports[{j}].name: required when a service has more than one port"
                    )),
                    Some(n) if !port_names.insert(n.clone()) => {
                        errors.push(format!("{at}.ports[{j}].name: duplicate port name {n:?}"))
                    }
                    _ => {}
                }
            }
            if svc.load_balancer_class.as_deref() == Some("") {
                errors.push(format!(
                    "{at}.loadBalancerClass: cannot be empty (leave it out for the default class)"
                ));
            }
        }

        if !errors.is_empty() {
            return Err(SceneErrors(errors));
        }
        let cluster = cluster.expect("no errors means the cluster CIDR parsed");
        let internal = internal_ips(&parsed.iter().map(|(ip, _, _)| *ip).collect::<Vec<_>>());
        let nodes = self
            .nodes
            .into_iter()
            .zip(parsed)
            .zip(pod_cidrs)
            .zip(internal)
            .map(
                |(((spec, (provided_ip, _, cloud)), pod_cidr), internal_ip)| SceneNode {
                    spec,
                    provided_ip,
                    pod_cidr: pod_cidr.expect("every node got a pod CIDR"),
                    internal_ip,
                    cloud,
                },
            )
            .collect();
        Ok(Scene {
            source,
            cluster_cidr: cluster,
            nodes,
            services: self.services,
            providers,
            named_providers,
        })
    }

    /// The providers of the scene: the scenario's `providers:`, else the one of `ctx` with the
    /// top-level `cloudConfig`. Problems go to `errors`; the bool says whether the scenario
    /// named them.
    fn scene_providers(
        &self,
        ctx: &SceneContext<'_>,
        errors: &mut Vec<String>,
    ) -> (Vec<SceneProvider>, bool) {
        let config = |at: &str, v: &Option<Value>, errors: &mut Vec<String>| match v {
            None => None,
            Some(Value::Object(m)) => Some(SceneCloudConfig::Mapping(m.clone())),
            Some(Value::String(text)) => Some(SceneCloudConfig::Verbatim(text.clone())),
            Some(other) => {
                errors.push(format!(
                    "{at}: must be a mapping of the provider's configuration keys, or a string (the file's content, verbatim), got {}",
                    json_kind(other)
                ));
                None
            }
        };
        // A verbatim config replaces the demo cloud: its node fields have no cloud to go to.
        let demo = |name: &str, config: &Option<SceneCloudConfig>| {
            has_demo_cloud(name) && !matches!(config, Some(SceneCloudConfig::Verbatim(_)))
        };
        if self.providers.is_empty() {
            let cloud_config = config("cloudConfig", &self.cloud_config, errors);
            let provider = SceneProvider {
                name: ctx.provider.to_string(),
                demo: !ctx.config_file && demo(ctx.provider, &cloud_config),
                cloud_config,
                platforms: Vec::new(),
                load_balancer_classes: Vec::new(),
                load_balancer_hosts: None,
            };
            return (vec![provider], false);
        }
        if self.cloud_config.is_some() {
            errors.push(
                "cloudConfig: with providers:, each provider has its own (providers[N].cloudConfig)"
                    .into(),
            );
        }
        let mut names = BTreeSet::new();
        let mut classes: BTreeMap<&str, usize> = BTreeMap::new();
        let mut providers = Vec::new();
        for (i, p) in self.providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            let name = p.name.trim();
            if name.is_empty() {
                errors.push(format!("{at}.name: required"));
            } else if name.contains([',', '=']) || name.chars().any(char::is_whitespace) {
                errors.push(format!(
                    "{at}.name: {name:?} is not a provider name (no ',', '=' or spaces)"
                ));
            } else if !names.insert(name) {
                errors.push(format!("{at}.name: duplicate provider {name:?}"));
            }
            let cloud_config = config(&format!("{at}.cloudConfig"), &p.cloud_config, errors);
            for (j, platform) in p.platforms.iter().enumerate() {
                if platform.trim().is_empty() {
                    errors.push(format!("{at}.platforms[{j}]: cannot be empty"));
                }
            }
            for (j, class) in p.load_balancer_classes.iter().enumerate() {
                let class = class.trim();
                if class.is_empty() {
                    errors.push(format!("{at}.loadBalancerClasses[{j}]: cannot be empty"));
                } else if class.contains('=') {
                    errors.push(format!(
                        "{at}.loadBalancerClasses[{j}]: {class:?} cannot hold '='"
                    ));
                } else if let Some(k) = classes.insert(class, i) {
                    errors.push(if k == i {
                        format!("{at}.loadBalancerClasses[{j}]: {class:?} is listed twice")
                    } else {
                        format!(
                            "{at}.loadBalancerClasses[{j}]: {class:?} is a class of providers[{k}] ({}) already: a class has one provider",
                            self.providers[k].name.trim()
                        )
                    });
                }
            }
            if let Some(hosts) = &p.load_balancer_hosts {
                if !matches!(hosts.trim(), "owned" | "all") {
                    errors.push(format!(
                        "{at}.loadBalancerHosts: {hosts:?} is not owned or all"
                    ));
                }
            }
            providers.push(SceneProvider {
                name: name.to_string(),
                demo: demo(name, &cloud_config),
                cloud_config,
                platforms: p.platforms.iter().map(|s| s.trim().to_string()).collect(),
                load_balancer_classes: p
                    .load_balancer_classes
                    .iter()
                    .map(|s| s.trim().to_string())
                    .collect(),
                load_balancer_hosts: p.load_balancer_hosts.as_ref().map(|s| s.trim().to_string()),
            });
        }
        (providers, true)
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// The demo cloud's n-th generated InternalIP (10.0.0.11, 10.0.0.12, ...).
fn nth_internal_ip(n: usize) -> IpAddr {
    let host = u32::try_from(n).unwrap_or(u32::MAX - 11).saturating_add(11);
    IpAddr::V4(std::net::Ipv4Addr::from(
        (10u32 << 24) | (host & 0x00ff_ffff),
    ))
}

/// InternalIPs of the demo cloud: the provided IP, else the next generated address that no
/// other node uses.
fn internal_ips(provided: &[Option<IpAddr>]) -> Vec<IpAddr> {
    let used: BTreeSet<IpAddr> = provided.iter().flatten().copied().collect();
    let mut next = 0usize;
    provided
        .iter()
        .enumerate()
        .map(|(i, p)| match p {
            Some(ip) => *ip,
            None => {
                next = next.max(i);
                loop {
                    let ip = nth_internal_ip(next);
                    next += 1;
                    if !used.contains(&ip) {
                        break ip;
                    }
                }
            }
        })
        .collect()
}

impl Scene {
    /// Namespaces the services need that the API server does not have from the start.
    pub fn namespaces(&self) -> Vec<Namespace> {
        let names: BTreeSet<&str> = self
            .services
            .iter()
            .map(|s| s.namespace.as_str())
            .filter(|ns| !BUILT_IN_NAMESPACES.contains(ns))
            .collect();
        names
            .into_iter()
            .map(|n| Namespace {
                metadata: ObjectMeta {
                    name: Some(n.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .collect()
    }

    /// The Node objects as a kubelet with `--cloud-provider=external` registers them.
    pub fn node_objects(&self) -> Vec<Node> {
        self.nodes.iter().map(kubelet_node).collect()
    }

    /// The Service objects.
    pub fn service_objects(&self) -> Vec<Service> {
        self.services.iter().map(service_object).collect()
    }

    /// The built-in demo cloud of the fake provider `index`: one instance per node of its cloud
    /// (type, zone, region, addresses, the node's providerID when it names one), unknown nodes
    /// synthesised (`autoInstances`) when it is the only provider (with several, a node it does
    /// not know is another's), the default LB address pool, routes on, state written to
    /// `state_dir`. The provider's `cloudConfig` mapping is laid over it key by key.
    pub fn fake_demo_cloud(&self, index: usize, cluster_name: &str, state_dir: &Path) -> Value {
        let instances: Vec<Value> = self
            .nodes_of(index)
            .map(|n| {
                let mut inst = json!({"name": n.spec.name, "addresses": demo_addresses(n)});
                for (key, v) in [
                    ("instanceType", &n.spec.instance_type),
                    ("zone", &n.spec.zone),
                    ("region", &n.spec.region),
                    ("providerID", &n.spec.provider_id),
                ] {
                    if let Some(v) = v {
                        inst[key] = json!(v.trim());
                    }
                }
                inst
            })
            .collect();
        let config = json!({
            "autoInstances": self.providers.len() == 1,
            "defaults": {"instanceType": "fake.medium", "zone": "fake-zone-a", "region": "fake-region-1"},
            "instances": instances,
            "clusters": [cluster_name],
            "ipPool": "198.18.0.0/15",
        });
        with_state_dir(self.overlay(index, config), state_dir)
    }

    /// The built-in demo cloud of the metal provider `index`: its config (the inventory at
    /// `inventory_path`, one address pool `sandbox` of [`METAL_DEMO_POOL`]) with the provider's
    /// `cloudConfig` mapping laid over it key by key, and the inventory to write there: a
    /// machine per node of its cloud (id = node name unless the node names its providerID; type,
    /// zone, region, addresses). No inventory when the mapping names its own.
    pub fn metal_demo_cloud(&self, index: usize, inventory_path: &Path) -> (Value, Option<Value>) {
        let machines: Vec<Value> = self
            .nodes_of(index)
            .map(|n| {
                let mut m = json!({"name": n.spec.name, "addresses": demo_addresses(n)});
                match &n.spec.provider_id {
                    Some(id) => m["providerID"] = json!(id.trim()),
                    None => m["id"] = json!(n.spec.name),
                }
                for (key, v) in [
                    ("instanceType", &n.spec.instance_type),
                    ("zone", &n.spec.zone),
                    ("region", &n.spec.region),
                ] {
                    if let Some(v) = v {
                        m[key] = json!(v.trim());
                    }
                }
                m
            })
            .collect();
        let config = self.overlay(
            index,
            json!({
                "inventory": inventory_path.display().to_string(),
                "loadBalancer": {"pools": [{"name": "sandbox", "addresses": METAL_DEMO_POOL}]},
            }),
        );
        let own_inventory = config.get("inventory").and_then(Value::as_str)
            != Some(inventory_path.display().to_string().as_str());
        (
            config,
            (!own_inventory).then(|| json!({ "machines": machines })),
        )
    }

    /// `base` with provider `index`'s `cloudConfig` mapping laid over it key by key.
    fn overlay(&self, index: usize, mut base: Value) -> Value {
        if let (Value::Object(base), Some(SceneCloudConfig::Mapping(overlay))) = (
            &mut base,
            self.providers
                .get(index)
                .and_then(|p| p.cloud_config.as_ref()),
        ) {
            for (k, v) in overlay {
                base.insert(k.clone(), v.clone());
            }
        }
        base
    }

    /// The Node object of `node` as its kubelet registers it.
    pub fn node_object(node: &SceneNode) -> Node {
        kubelet_node(node)
    }
}

/// A demo cloud's addresses of a node: its InternalIP, ExternalIP (if any) and Hostname.
fn demo_addresses(n: &SceneNode) -> Vec<Value> {
    let mut addresses = vec![json!({"type": "InternalIP", "address": n.internal_ip.to_string()})];
    if let Some(ext) = &n.spec.external_ip {
        addresses.push(json!({"type": "ExternalIP", "address": ext.trim()}));
    }
    addresses.push(json!({"type": "Hostname", "address": n.spec.name}));
    addresses
}

/// The Lease a kubelet keeps for its node in `kube-node-lease` (its heartbeat; `kubectl describe
/// node` shows it), owned by the Node as the kubelet makes it. Nobody renews it in the sandbox.
pub fn node_lease(node: &Node) -> Lease {
    let name = node.metadata.name.clone().unwrap_or_default();
    Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(NODE_LEASE_NAMESPACE.into()),
            owner_references: node.metadata.uid.clone().map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: name.clone(),
                    uid,
                    ..Default::default()
                }]
            }),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }),
    }
}

/// `config` with `stateDir` set to `state_dir` unless it names one already (the sandbox reads
/// the fake cloud's `cloud.json` from there for its summary).
pub fn with_state_dir(mut config: Value, state_dir: &Path) -> Value {
    if let Value::Object(m) = &mut config {
        m.entry("stateDir")
            .or_insert_with(|| json!(state_dir.display().to_string()));
    }
    config
}

fn kubelet_node(n: &SceneNode) -> Node {
    let name = n.spec.name.clone();
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_string(), name.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), "amd64".to_string()),
    ]);
    labels.extend(n.spec.labels.clone());
    let mut annotations = BTreeMap::from([(
        "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
        "true".to_string(),
    )]);
    annotations.extend(n.spec.annotations.clone());
    let mut addresses = Vec::new();
    if let Some(ip) = n.provided_ip {
        annotations.insert(PROVIDED_NODE_IP_ANNOTATION.to_string(), ip.to_string());
        addresses.push(NodeAddress {
            type_: "InternalIP".into(),
            address: ip.to_string(),
        });
    }
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: name.clone(),
    });
    let mut taints = vec![Taint {
        key: UNINITIALIZED_TAINT.into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    }];
    taints.extend(n.spec.taints.iter().map(|t| Taint {
        key: t.key.clone(),
        value: t.value.clone(),
        effect: t.effect.clone(),
        time_added: None,
    }));
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity("4".into())),
        ("memory".to_string(), Quantity("16374584Ki".into())),
        ("pods".to_string(), Quantity("110".into())),
        (
            "ephemeral-storage".to_string(),
            Quantity("101430960Ki".into()),
        ),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(K8sNodeSpec {
            pod_cidr: Some(n.pod_cidr.to_string()),
            pod_cidrs: Some(vec![n.pod_cidr.to_string()]),
            provider_id: n.spec.provider_id.as_ref().map(|id| id.trim().to_string()),
            taints: Some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(addresses),
            conditions: Some(vec![
                condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                condition(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "kubelet is posting ready status",
                ),
            ]),
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                boot_id: format!("boot-{name}"),
                container_runtime_version: "containerd://2.0.5".into(),
                kernel_version: "6.8.0-sandbox".into(),
                kube_proxy_version: String::new(),
                kubelet_version: "v1.35.0".into(),
                machine_id: format!("machine-{name}"),
                operating_system: "linux".into(),
                os_image: "Ubuntu 24.04.2 LTS".into(),
                system_uuid: format!("uuid-{name}"),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

fn service_object(s: &ServiceSpec) -> Service {
    let selector = if s.labels.contains_key("app") {
        BTreeMap::from([("app".to_string(), s.labels["app"].clone())])
    } else {
        BTreeMap::from([("app".to_string(), s.name.clone())])
    };
    Service {
        metadata: ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            labels: (!s.labels.is_empty()).then(|| s.labels.clone()),
            annotations: (!s.annotations.is_empty()).then(|| s.annotations.clone()),
            ..Default::default()
        },
        spec: Some(K8sServiceSpec {
            type_: Some("LoadBalancer".into()),
            selector: Some(selector),
            load_balancer_class: s.load_balancer_class.clone(),
            load_balancer_ip: s.load_balancer_ip.clone(),
            ports: Some(
                s.ports
                    .iter()
                    .map(|p| ServicePort {
                        name: p.name.clone(),
                        port: p.port as i32,
                        target_port: Some(IntOrString::Int(p.target_port.unwrap_or(p.port) as i32)),
                        protocol: Some(p.protocol.clone()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider without a demo cloud.
    const OTHER: SceneContext<'static> = SceneContext {
        provider: "aws",
        config_file: false,
    };

    fn scene(text: &str) -> Result<Scene, Vec<String>> {
        Scenario::parse(text)
            .map_err(|e| vec![e])?
            .into_scene("test".into(), None, &SceneContext::FAKE)
            .map_err(|e| e.0)
    }

    #[test]
    fn a_large_generated_scene_gets_a_pod_network_that_fits() {
        assert_eq!(generated_cluster_cidr(256), None);
        assert_eq!(
            generated_cluster_cidr(257).as_deref(),
            Some("10.128.0.0/15")
        );
        assert_eq!(
            generated_cluster_cidr(2000).as_deref(),
            Some("10.128.0.0/13")
        );
        let scene = Scenario::generate(2000, 10)
            .into_scene("generated".into(), None, &SceneContext::FAKE)
            .expect("2,000 generated nodes fit");
        assert_eq!(scene.cluster_cidr.to_string(), "10.128.0.0/13");
    }

    #[test]
    fn generated_scene_is_valid_and_realistic() {
        let s = Scenario::generate(20, 5)
            .into_scene("generated".into(), None, &SceneContext::FAKE)
            .unwrap();
        assert_eq!(s.nodes.len(), 20);
        assert_eq!(s.services.len(), 5);
        let cidrs: BTreeSet<String> = s.nodes.iter().map(|n| n.pod_cidr.to_string()).collect();
        assert_eq!(cidrs.len(), 20, "distinct pod CIDRs");
        assert!(cidrs.contains("10.244.0.0/24") && cidrs.contains("10.244.19.0/24"));
        let provided = s.nodes.iter().filter(|n| n.provided_ip.is_some()).count();
        assert!(
            provided > 0 && provided < 20,
            "some nodes have a provided IP: {provided}"
        );
        for n in &s.nodes {
            if let Some(ip) = n.provided_ip {
                assert_eq!(
                    ip, n.internal_ip,
                    "{}: the demo cloud knows the provided IP",
                    n.spec.name
                );
            }
        }
        let ips: BTreeSet<IpAddr> = s.nodes.iter().map(|n| n.internal_ip).collect();
        assert_eq!(ips.len(), 20, "distinct InternalIPs");
        let foreign: Vec<_> = s
            .services
            .iter()
            .filter(|s| s.load_balancer_class.is_some())
            .collect();
        assert_eq!(foreign.len(), 1);
        assert_eq!(foreign[0].name, FOREIGN_SERVICE);
        let nodes = s.node_objects();
        let cp = &nodes[0];
        assert!(cp
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(EXCLUDE_LB_LABEL));
        let taints = cp.spec.as_ref().unwrap().taints.as_ref().unwrap();
        assert_eq!(taints[0].key, UNINITIALIZED_TAINT);
        assert_eq!(taints[0].effect, "NoSchedule");
        let other = Scenario::generate(3, 1)
            .without_demo_cloud()
            .into_scene("g".into(), None, &OTHER)
            .unwrap();
        assert!(other
            .nodes
            .iter()
            .all(|n| n.provided_ip.is_none() && n.spec.zone.is_none()));
        // One service, one node: no foreign class, no control plane.
        let small = Scenario::generate(1, 1)
            .into_scene("g".into(), None, &SceneContext::FAKE)
            .unwrap();
        assert!(small.services[0].load_balancer_class.is_none());
        assert!(small.nodes[0].spec.labels.is_empty());
    }

    #[test]
    fn explicit_pod_cidrs_are_kept_and_the_rest_fill_free_ranges() {
        let s = scene(
            "clusterCIDR: 10.8.0.0/22\nnodes:\n- {name: a, podCIDR: 10.8.0.0/24}\n- {name: b}\n- {name: c, podCIDR: 10.8.1.0/24}\n",
        )
        .unwrap();
        let got: Vec<String> = s.nodes.iter().map(|n| n.pod_cidr.to_string()).collect();
        assert_eq!(got, ["10.8.0.0/24", "10.8.2.0/24", "10.8.1.0/24"]);
    }

    #[test]
    fn every_problem_is_reported_with_its_place() {
        let errs = scene(
            r#"
clusterCIDR: 10.8.0.0/23
nodes:
- {name: a, providedIP: 10.0.0.300, podCIDR: 10.9.0.0/24}
- {name: a, taints: [{key: x, effect: Sometimes}]}
- {name: c}
- {name: d}
services:
- {name: web, ports: []}
- {name: web}
- name: api
  loadBalancerClass: ""
  ports: [{port: 0, protocol: ICMP}, {port: 80}]
cloudConfig: [1, 2]
"#,
        )
        .unwrap_err();
        let expected = [
            "cloudConfig: must be a mapping of the provider's configuration keys, or a string (the file's content, verbatim), got a list",
            "nodes[0].providedIP: \"10.0.0.300\" is not an IP address (one address, as the kubelet's --node-ip)",
            "nodes[0].podCIDR: 10.9.0.0/24 is not inside the cluster CIDR 10.8.0.0/23",
            "nodes[1].name: duplicate node name \"a\"",
            "nodes[1].taints[0].effect: \"Sometimes\" is not one of NoSchedule, PreferNoSchedule, NoExecute",
            "clusterCIDR 10.8.0.0/23 has room for 2 more /24 pod ranges, but 3 nodes need one; use a larger cluster CIDR",
            "services[0].ports: a LoadBalancer service needs at least one port",
            "services[1].name: duplicate service default/web",
            "services[2].ports[0].port: 0 is not between 1 and 65535",
            "services[2].ports[0].protocol: \"ICMP\" is not one of TCP, UDP, SCTP",
            "services[2].ports[0].name: required when a service has more than one port",
            "services[2].ports[1].name: required when a service has more than one port",
            "services[2].loadBalancerClass: cannot be empty (leave it out for the default class)",
        ];
        assert_eq!(errs, expected);
    }

    #[test]
    fn unknown_keys_and_demo_only_fields_are_refused() {
        let e = Scenario::parse("nodes:\n- name: a\n  zoen: x\n").unwrap_err();
        assert!(e.contains("unknown field `zoen`"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let e = Scenario::parse("nodez: []\n").unwrap_err();
        assert!(e.contains("unknown field `nodez`, expected one of"), "{e}");
        let errs = Scenario::parse("nodes:\n- {name: a, zone: z1}\n")
            .unwrap()
            .into_scene("s".into(), None, &OTHER)
            .unwrap_err()
            .0;
        assert_eq!(errs.len(), 1);
        assert!(errs[0].starts_with("nodes[0].zone: only applies to the built-in demo cloud"));
        let errs = Scenario::default()
            .into_scene("s".into(), Some("10.244.0.1/16"), &SceneContext::FAKE)
            .unwrap_err()
            .0;
        assert_eq!(
            errs,
            ["--cluster-cidr: \"10.244.0.1/16\" has host bits set (did you mean 10.244.0.0/16?)"]
        );
    }

    #[test]
    fn the_example_scenario_is_valid() {
        let s = Scenario::parse(include_str!("example-scenario.yaml"))
            .unwrap()
            .into_scene("example".into(), None, &SceneContext::FAKE)
            .unwrap();
        assert_eq!(s.cluster_cidr.to_string(), "10.100.0.0/16");
        assert_eq!(s.nodes.len(), 4);
        assert_eq!(s.services.len(), 3);
        assert_eq!(s.namespaces()[0].metadata.name.as_deref(), Some("shop"));
        let worker_a = &s.nodes[1];
        assert_eq!(worker_a.pod_cidr.to_string(), "10.100.21.0/24");
        assert_eq!(worker_a.internal_ip.to_string(), "10.1.0.21");
        match s.providers[0].cloud_config.as_ref().unwrap() {
            SceneCloudConfig::Mapping(m) => assert_eq!(m["ipPool"], "198.18.0.0/16"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_string_cloud_config_is_kept_verbatim_and_replaces_the_demo_cloud() {
        let text = "[Global]\nZone = a\n";
        let s = scene(&format!(
            "nodes:\n- {{name: a}}\ncloudConfig: {}\n",
            serde_json::to_string(text).unwrap()
        ))
        .unwrap();
        assert_eq!(s.verbatim_config(), Some(text));
        // The demo cloud's node fields need the demo cloud, which a verbatim config replaces.
        let err = scene("nodes:\n- {name: a, zone: z}\ncloudConfig: 'x = 1'\n").unwrap_err();
        assert!(err.iter().any(|e| e.contains("zone")), "{err:?}");
    }

    #[test]
    fn demo_cloud_describes_every_node_and_takes_the_overlay() {
        let mut s = scene(
            "nodes:\n- {name: a, providedIP: 10.0.0.12, zone: z9, externalIP: 203.0.113.5}\n- {name: b}\ncloudConfig:\n  errors:\n    EnsureLoadBalancer: {kind: other}\n",
        )
        .unwrap();
        let c = s.fake_demo_cloud(0, "kubernetes", Path::new("/state"));
        assert_eq!(c["stateDir"], "/state");
        assert_eq!(c["instances"][0]["zone"], "z9");
        assert_eq!(c["instances"][0]["addresses"][0]["address"], "10.0.0.12");
        assert_eq!(c["instances"][0]["addresses"][1]["address"], "203.0.113.5");
        // b's generated address skips a's provided one.
        assert_eq!(c["instances"][1]["addresses"][0]["address"], "10.0.0.13");
        assert_eq!(c["errors"]["EnsureLoadBalancer"]["kind"], "other");
        assert_eq!(c["autoInstances"], true);
        s.providers[0].cloud_config = Some(SceneCloudConfig::Mapping(
            serde_json::from_value(json!({"stateDir": "/mine"})).unwrap(),
        ));
        assert_eq!(
            s.fake_demo_cloud(0, "k", Path::new("/state"))["stateDir"],
            "/mine"
        );
    }

    #[test]
    fn the_hybrid_scenario_names_two_providers_and_a_foreign_node() {
        let s = Scenario::parse(include_str!("../../../docs/scenarios/hybrid.yaml"))
            .unwrap()
            .into_scene("hybrid".into(), None, &SceneContext::FAKE)
            .unwrap();
        assert!(s.named_providers);
        let names: Vec<&str> = s.providers.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["fake", "metal"]);
        assert!(s.providers.iter().all(|p| p.demo));
        assert_eq!(s.providers[1].load_balancer_classes, ["metal-lb"]);
        let clouds: Vec<(&str, Option<usize>)> = s
            .nodes
            .iter()
            .map(|n| (n.spec.name.as_str(), n.cloud))
            .collect();
        assert_eq!(
            clouds,
            [
                ("cloud-a", Some(0)),
                ("cloud-b", Some(0)),
                ("rack1-node-1", Some(1)),
                ("rack2-node-1", Some(1)),
                ("kwok-node-1", None),
            ]
        );
        let kwok = Scene::node_object(&s.nodes[4]);
        assert_eq!(
            kwok.spec.unwrap().provider_id.as_deref(),
            Some("kwok://kwok-node-1")
        );

        // The fake's demo cloud describes its own nodes only and synthesises no others (they
        // may be another provider's).
        let fake = s.fake_demo_cloud(0, "kubernetes", Path::new("/state"));
        let instances: Vec<&str> = fake["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap())
            .collect();
        assert_eq!(instances, ["cloud-a", "cloud-b"]);
        assert_eq!(fake["autoInstances"], false);
        // metal's: an inventory of its machines, the scenario's pool laid over the demo's.
        let (config, inventory) = s.metal_demo_cloud(1, Path::new("/w/inventory-metal.yaml"));
        assert_eq!(config["inventory"], "/w/inventory-metal.yaml");
        assert_eq!(config["loadBalancer"]["pools"][0]["name"], "rack-vips");
        let inventory = inventory.expect("the demo's inventory");
        let machines = inventory["machines"].as_array().unwrap();
        assert_eq!(machines.len(), 2);
        assert_eq!(machines[0]["name"], "rack1-node-1");
        assert_eq!(machines[0]["id"], "rack1-node-1");
        assert_eq!(machines[0]["zone"], "rack1");
        assert_eq!(machines[1]["addresses"][0]["address"], "10.0.0.14");
    }

    #[test]
    fn metal_without_a_config_runs_the_demo_and_its_own_inventory_wins() {
        let s = scene_for(
            "nodes:\n- {name: m1, zone: r1}\n- {name: m2, providerID: 'metal://rack/m2', provider: metal}\n",
            "metal",
        )
        .unwrap();
        assert!(s.providers[0].demo);
        let (config, inventory) = s.metal_demo_cloud(0, Path::new("/w/inv.yaml"));
        assert_eq!(
            config["loadBalancer"]["pools"][0]["addresses"],
            json!(METAL_DEMO_POOL)
        );
        let machines = inventory.unwrap()["machines"].clone();
        assert_eq!(machines[1]["providerID"], "metal://rack/m2");
        assert!(machines[1].get("id").is_none());
        let s = scene_for(
            "nodes:\n- {name: m1}\ncloudConfig: {inventory: /etc/inv.yaml}\n",
            "metal",
        )
        .unwrap();
        let (config, inventory) = s.metal_demo_cloud(0, Path::new("/w/inv.yaml"));
        assert_eq!(config["inventory"], "/etc/inv.yaml");
        assert!(inventory.is_none(), "the scenario's inventory is used");
    }

    fn scene_for(text: &str, provider: &str) -> Result<Scene, Vec<String>> {
        Scenario::parse(text)
            .map_err(|e| vec![e])?
            .into_scene(
                "test".into(),
                None,
                &SceneContext {
                    provider,
                    config_file: false,
                },
            )
            .map_err(|e| e.0)
    }

    #[test]
    fn every_provider_problem_is_reported_with_its_place() {
        let errs = scene(
            r#"
cloudConfig: {ipPool: 10.0.0.0/8}
providers:
- name: fake
  loadBalancerClasses: [a, a, ""]
- name: fake
  cloudConfig: 3
- name: "x,y"
  platforms: [" "]
  loadBalancerClasses: [a, "b=c"]
  loadBalancerHosts: some
nodes:
- {name: n1, provider: gcp}
- {name: n2, providerID: "", zone: z}
- {name: n3, providerID: "kwok://n3", zone: z}
- {name: n4, provider: fake, providerID: "fake://n 4"}
"#,
        )
        .unwrap_err();
        let expected = [
            "cloudConfig: with providers:, each provider has its own (providers[N].cloudConfig)",
            "providers[0].loadBalancerClasses[1]: \"a\" is listed twice",
            "providers[0].loadBalancerClasses[2]: cannot be empty",
            "providers[1].name: duplicate provider \"fake\"",
            "providers[1].cloudConfig: must be a mapping of the provider's configuration keys, or a string (the file's content, verbatim), got a number",
            "providers[2].name: \"x,y\" is not a provider name (no ',', '=' or spaces)",
            "providers[2].platforms[0]: cannot be empty",
            "providers[2].loadBalancerClasses[0]: \"a\" is a class of providers[0] (fake) already: a class has one provider",
            "providers[2].loadBalancerClasses[1]: \"b=c\" cannot hold '='",
            "providers[2].loadBalancerHosts: \"some\" is not owned or all",
            "nodes[0].provider: \"gcp\" is not one of the scenario's providers (fake, fake, x,y)",
            "nodes[1].providerID: cannot be empty (leave it out: the cloud provider sets it)",
            "nodes[1].zone: only applies to the built-in demo cloud, and a node with a providerID is in none unless it names its provider (provider: NAME)",
            "nodes[2].zone: only applies to the built-in demo cloud, and a node with a providerID is in none unless it names its provider (provider: NAME)",
            "nodes[3].providerID: \"fake://n 4\" cannot hold spaces",
        ];
        assert_eq!(errs, expected);
        // Without providers:, a node's provider must be the run's.
        let errs = scene_for("nodes:\n- {name: a, provider: metal}\n", "fake").unwrap_err();
        assert_eq!(
            errs,
            ["nodes[0].provider: \"metal\" is not the provider of this run (fake; a scenario names several in providers:)"]
        );
    }
}
