//! The machine inventory: the file's schema, its validation, and the lookup of the machine
//! behind a Node (by `spec.providerID`, else by name, else by any of its addresses).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;

use ccm_provider_abi::prelude::*;
use serde::{Deserialize, Serialize};

use crate::names;

/// Scheme of the provider IDs of this provider.
pub const PROVIDER_ID_SCHEME: &str = "metal://";

/// Address types accepted in the inventory (the upstream `NodeAddressType`s).
pub const ADDRESS_TYPES: &[&str] = &[
    address_type::INTERNAL_IP,
    address_type::EXTERNAL_IP,
    address_type::HOSTNAME,
    address_type::INTERNAL_DNS,
    address_type::EXTERNAL_DNS,
];

/// What the machine is doing, as the inventory says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineState {
    /// Powered on (the default).
    #[default]
    Running,
    /// Powered off but still racked: the node gets the shutdown taint.
    Shutdown,
    /// Decommissioned: `InstanceExists` is false, so a NotReady node is deleted.
    Absent,
}

impl fmt::Display for MachineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Running => "running",
            Self::Shutdown => "shutdown",
            Self::Absent => "absent",
        })
    }
}

/// The inventory file as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InventoryFile {
    /// The machines.
    #[serde(default)]
    pub machines: Vec<MachineFile>,
}

/// One machine as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MachineFile {
    /// Node name of the machine.
    pub name: String,
    /// Machine ID; the provider ID is `metal://<id>`. Give `id` or `providerID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Full provider ID, `metal://<id>`.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Instance type label value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_type: String,
    /// Zone label value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    /// Region label value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub region: String,
    /// Node addresses, in the order they appear in `status.addresses`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<AddressFile>,
    /// Additional node labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// `running` (default), `shutdown` or `absent`.
    #[serde(default)]
    pub state: MachineState,
}

/// One address as written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressFile {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS` or `ExternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

/// A validated machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    /// Node name.
    pub name: String,
    /// `metal://<id>`.
    pub provider_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Region.
    pub region: String,
    /// Addresses, in file order (IP addresses in canonical form).
    pub addresses: Vec<NodeAddress>,
    /// Additional labels.
    pub labels: BTreeMap<String, String>,
    /// State.
    pub state: MachineState,
}

impl Machine {
    /// The metadata the node controller applies.
    pub fn metadata(&self) -> InstanceMetadata {
        InstanceMetadata {
            provider_id: self.provider_id.clone(),
            instance_type: self.instance_type.clone(),
            node_addresses: self.addresses.clone(),
            zone: self.zone.clone(),
            region: self.region.clone(),
            additional_labels: self.labels.clone(),
        }
    }
}

/// How a node was matched to a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MatchedBy {
    /// `spec.providerID`.
    ProviderId,
    /// The node name.
    Name,
    /// One of the node's addresses.
    Address(String),
}

/// A validated, indexed inventory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    machines: Vec<Machine>,
    by_provider_id: HashMap<String, usize>,
    by_name: HashMap<String, usize>,
    by_ip: HashMap<IpAddr, usize>,
    /// Hostname / DNS addresses, lower-cased.
    by_host: HashMap<String, usize>,
}

fn is_ip_type(t: &str) -> bool {
    t == address_type::INTERNAL_IP || t == address_type::EXTERNAL_IP
}

impl Inventory {
    /// Parse and validate inventory text (YAML or JSON).
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: InventoryFile = if text.trim().is_empty() {
            InventoryFile::default()
        } else {
            yaml_serde::from_str(text).map_err(|e| format!("does not parse: {e}"))?
        };
        Self::from_file(file)
    }

    /// Validate a parsed file: names and provider IDs present and unique, addresses well formed
    /// and not shared between machines, labels valid and outside the reserved namespaces.
    pub fn from_file(file: InventoryFile) -> Result<Self, String> {
        let mut inv = Inventory::default();
        for (i, m) in file.machines.into_iter().enumerate() {
            let what = if m.name.is_empty() {
                format!("machine #{}", i + 1)
            } else {
                format!("machine #{} ({:?})", i + 1, m.name)
            };
            let machine = validate_machine(m).map_err(|e| format!("{what}: {e}"))?;
            let idx = inv.machines.len();
            if let Some(&j) = inv.by_name.get(&machine.name) {
                return Err(format!(
                    "{what}: name {:?} is also used by machine #{}",
                    machine.name,
                    j + 1
                ));
            }
            if let Some(&j) = inv.by_provider_id.get(&machine.provider_id) {
                return Err(format!(
                    "duplicate provider ID {:?}: machines {:?} and {:?}",
                    machine.provider_id, inv.machines[j].name, machine.name
                ));
            }
            inv.by_name.insert(machine.name.clone(), idx);
            inv.by_provider_id.insert(machine.provider_id.clone(), idx);
            for a in &machine.addresses {
                let other = if is_ip_type(&a.type_) {
                    let ip: IpAddr = a.address.parse().expect("validated");
                    *inv.by_ip.entry(ip).or_insert(idx)
                } else {
                    *inv.by_host
                        .entry(a.address.to_ascii_lowercase())
                        .or_insert(idx)
                };
                if other != idx {
                    return Err(format!(
                        "address {} is listed for machines {:?} and {:?}: a node could not be matched by it",
                        a.address, inv.machines[other].name, machine.name
                    ));
                }
            }
            inv.machines.push(machine);
        }
        Ok(inv)
    }

    /// The machines, in file order.
    pub fn machines(&self) -> &[Machine] {
        &self.machines
    }

    /// The machine with this provider ID.
    pub fn by_provider_id(&self, provider_id: &str) -> Option<&Machine> {
        self.by_provider_id
            .get(provider_id)
            .map(|&i| &self.machines[i])
    }

    /// The machine with this name.
    pub fn by_name(&self, name: &str) -> Option<&Machine> {
        self.by_name.get(name).map(|&i| &self.machines[i])
    }

    /// The machine behind `node`: by `spec.providerID` when the node has one (and then only by
    /// it: a provider ID names one machine for the life of the node), else by name, else by any
    /// of its `status.addresses`. `Err` when its addresses point at two different machines.
    pub fn find(&self, node: &Node) -> Result<Option<(&Machine, MatchedBy)>, String> {
        let provider_id = node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .unwrap_or("");
        if !provider_id.is_empty() {
            return Ok(self
                .by_provider_id(provider_id)
                .map(|m| (m, MatchedBy::ProviderId)));
        }
        let name = node.metadata.name.as_deref().unwrap_or("");
        if let Some(m) = self.by_name(name) {
            return Ok(Some((m, MatchedBy::Name)));
        }
        let mut found: Option<(usize, String)> = None;
        let addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_deref())
            .unwrap_or(&[]);
        for a in addresses {
            let idx = match a.address.parse::<IpAddr>() {
                Ok(ip) => self.by_ip.get(&ip),
                Err(_) => self.by_host.get(&a.address.to_ascii_lowercase()),
            };
            let Some(&idx) = idx else { continue };
            match &found {
                None => found = Some((idx, a.address.clone())),
                Some((prev, prev_addr)) if *prev != idx => {
                    return Err(format!(
                        "node {name:?} has addresses of two machines: {prev_addr} ({:?}) and {} ({:?})",
                        self.machines[*prev].name, a.address, self.machines[idx].name
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(found.map(|(i, addr)| (&self.machines[i], MatchedBy::Address(addr))))
    }
}

fn validate_machine(m: MachineFile) -> Result<Machine, String> {
    if m.name.is_empty() {
        return Err("`name` is missing or empty".into());
    }
    names::dns1123_subdomain(&m.name).map_err(|e| format!("name: {e}"))?;
    let provider_id = match (&m.id, &m.provider_id) {
        (Some(_), Some(_)) => return Err("give `id` or `providerID`, not both".into()),
        (None, None) => {
            return Err("needs an `id` (provider ID metal://<id>) or a `providerID`".into())
        }
        (Some(id), None) => {
            if id.is_empty() || id.chars().any(char::is_whitespace) {
                return Err(format!("id {id:?} must be non-empty and without spaces"));
            }
            format!("{PROVIDER_ID_SCHEME}{id}")
        }
        (None, Some(pid)) => {
            let id = pid.strip_prefix(PROVIDER_ID_SCHEME).ok_or_else(|| {
                format!("providerID {pid:?} must start with {PROVIDER_ID_SCHEME}")
            })?;
            if id.is_empty() || id.chars().any(char::is_whitespace) {
                return Err(format!(
                    "providerID {pid:?} needs a non-empty ID without spaces after {PROVIDER_ID_SCHEME}"
                ));
            }
            pid.clone()
        }
    };
    for (field, v) in [
        ("instanceType", &m.instance_type),
        ("zone", &m.zone),
        ("region", &m.region),
    ] {
        names::label_value(field, v).map_err(|e| format!("{field}: {e}"))?;
    }
    let mut addresses = Vec::with_capacity(m.addresses.len());
    for a in &m.addresses {
        if !ADDRESS_TYPES.contains(&a.type_.as_str()) {
            return Err(format!(
                "address {:?} has type {:?}; expected one of {}",
                a.address,
                a.type_,
                ADDRESS_TYPES.join(", ")
            ));
        }
        let address = if is_ip_type(&a.type_) {
            let ip: IpAddr =
                a.address.trim().parse().map_err(|_| {
                    format!("{} address {:?} is not an IP address", a.type_, a.address)
                })?;
            ip.to_string()
        } else {
            let h = a.address.trim();
            if h.is_empty() || h.chars().any(char::is_whitespace) {
                return Err(format!(
                    "{} address {:?} must be non-empty and without spaces",
                    a.type_, a.address
                ));
            }
            h.to_string()
        };
        let na = NodeAddress {
            type_: a.type_.clone(),
            address,
        };
        if addresses.contains(&na) {
            return Err(format!("{} {} is listed twice", na.type_, na.address));
        }
        addresses.push(na);
    }
    for (k, v) in &m.labels {
        names::label_key(k)?;
        names::label_value(k, v)?;
        if names::reserved_label_key(k) {
            return Err(format!(
                "label {k:?} is in the kubernetes.io / k8s.io namespaces, which the node controller does not let a provider set"
            ));
        }
    }
    Ok(Machine {
        name: m.name,
        provider_id,
        instance_type: m.instance_type,
        zone: m.zone,
        region: m.region,
        addresses,
        labels: m.labels,
        state: m.state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SAMPLE: &str = r#"
machines:
  - name: node-a
    id: rack1-07
    instanceType: r640
    zone: rack1
    region: dc1
    addresses:
      - {type: InternalIP, address: 10.0.0.7}
      - {type: InternalIP, address: "fd00::7"}
      - {type: ExternalIP, address: 203.0.113.7}
      - {type: Hostname, address: node-a.example}
    labels: {example.com/row: "r1"}
  - name: node-b
    providerID: metal://rack2-01
    state: shutdown
    addresses:
      - {type: InternalIP, address: 10.0.0.8}
  - name: node-c
    id: gone
    state: absent
"#;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    fn err(text: &str) -> String {
        Inventory::parse(text).unwrap_err()
    }

    #[test]
    fn sample_parses_and_indexes() {
        let inv = Inventory::parse(SAMPLE).unwrap();
        assert_eq!(inv.machines().len(), 3);
        let a = inv.by_provider_id("metal://rack1-07").unwrap();
        assert_eq!(a.name, "node-a");
        let md = a.metadata();
        assert_eq!(md.instance_type, "r640");
        assert_eq!((md.zone.as_str(), md.region.as_str()), ("rack1", "dc1"));
        assert_eq!(md.node_addresses.len(), 4);
        assert_eq!(md.node_addresses[1].address, "fd00::7");
        assert_eq!(md.additional_labels["example.com/row"], "r1");
        assert_eq!(inv.by_name("node-b").unwrap().state, MachineState::Shutdown);
        assert_eq!(inv.by_name("node-c").unwrap().provider_id, "metal://gone");
        assert_eq!(Inventory::parse("").unwrap().machines().len(), 0);
        assert_eq!(
            Inventory::parse("machines: []").unwrap().machines().len(),
            0
        );
    }

    #[test]
    fn nodes_match_by_provider_id_then_name_then_address() {
        let inv = Inventory::parse(SAMPLE).unwrap();
        let by_pid = node(
            json!({"metadata": {"name": "node-b"}, "spec": {"providerID": "metal://rack1-07"}}),
        );
        let (m, by) = inv.find(&by_pid).unwrap().unwrap();
        assert_eq!((m.name.as_str(), by), ("node-a", MatchedBy::ProviderId));
        // A provider ID is authoritative: no fallback to the name.
        let stale =
            node(json!({"metadata": {"name": "node-a"}, "spec": {"providerID": "metal://other"}}));
        assert_eq!(inv.find(&stale).unwrap(), None);
        let by_name = node(json!({"metadata": {"name": "node-b"}}));
        assert_eq!(inv.find(&by_name).unwrap().unwrap().1, MatchedBy::Name);
        let by_addr = node(json!({"metadata": {"name": "kubelet-name"},
            "status": {"addresses": [{"type": "Hostname", "address": "x"},
                                     {"type": "InternalIP", "address": "fd00:0::7"}]}}));
        let (m, by) = inv.find(&by_addr).unwrap().unwrap();
        assert_eq!(m.name, "node-a");
        assert_eq!(by, MatchedBy::Address("fd00:0::7".into()));
        let by_host = node(json!({"metadata": {"name": "k"},
            "status": {"addresses": [{"type": "Hostname", "address": "NODE-A.example"}]}}));
        assert_eq!(inv.find(&by_host).unwrap().unwrap().0.name, "node-a");
        let unknown = node(json!({"metadata": {"name": "nope"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}));
        assert_eq!(inv.find(&unknown).unwrap(), None);
        let ambiguous = node(json!({"metadata": {"name": "k"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.7"},
                                     {"type": "InternalIP", "address": "10.0.0.8"}]}}));
        let e = inv.find(&ambiguous).unwrap_err();
        assert!(
            e.contains("two machines: 10.0.0.7 (\"node-a\") and 10.0.0.8 (\"node-b\")"),
            "{e}"
        );
    }

    #[test]
    fn duplicate_provider_ids_and_names_are_refused() {
        let e = err("machines: [{name: a, id: x}, {name: b, providerID: 'metal://x'}]");
        assert!(
            e.contains("duplicate provider ID \"metal://x\": machines \"a\" and \"b\""),
            "{e}"
        );
        let e = err("machines: [{name: a, id: x}, {name: a, id: y}]");
        assert!(
            e.contains("machine #2 (\"a\"): name \"a\" is also used by machine #1"),
            "{e}"
        );
    }

    #[test]
    fn every_bad_machine_gets_a_clear_error() {
        let cases = [
            ("machines: [{id: x}]", "missing field `name`"),
            ("machines: [{name: '', id: x}]", "`name` is missing or empty"),
            ("machines: [{name: Node_A, id: x}]", "not a DNS-1123 subdomain"),
            ("machines: [{name: a}]", "needs an `id`"),
            ("machines: [{name: a, id: x, providerID: 'metal://x'}]", "not both"),
            ("machines: [{name: a, providerID: 'aws://x'}]", "must start with metal://"),
            ("machines: [{name: a, providerID: 'metal://'}]", "non-empty ID"),
            ("machines: [{name: a, id: 'x y'}]", "without spaces"),
            ("machines: [{name: a, id: x, state: off}]", "unknown variant `off`"),
            ("machines: [{name: a, id: x, zone: 'rack 1'}]", "zone"),
            ("machines: [{name: a, id: x, addresses: [{type: PublicIP, address: 1.2.3.4}]}]", "expected one of InternalIP"),
            ("machines: [{name: a, id: x, addresses: [{type: InternalIP, address: 10.0.0.300}]}]", "is not an IP address"),
            ("machines: [{name: a, id: x, addresses: [{type: Hostname, address: ''}]}]", "must be non-empty"),
            ("machines: [{name: a, id: x, addresses: [{type: InternalIP, address: 10.0.0.1}, {type: InternalIP, address: 10.0.0.1}]}]", "listed twice"),
            ("machines: [{name: a, id: x, addresses: [{type: InternalIP, address: 10.0.0.1}]}, {name: b, id: y, addresses: [{type: ExternalIP, address: 10.0.0.1}]}]", "listed for machines \"a\" and \"b\""),
            ("machines: [{name: a, id: x, labels: {'bad key!': v}}]", "label key \"bad key!\""),
            ("machines: [{name: a, id: x, labels: {k: 'bad value!'}}]", "value \"bad value!\""),
            ("machines: [{name: a, id: x, labels: {topology.kubernetes.io/zone: z}}]", "kubernetes.io / k8s.io"),
            ("machines: [{name: a, id: x, colour: red}]", "unknown field `colour`"),
            ("machines: {name: a}", "does not parse"),
            ("- a\n- b", "does not parse"),
        ];
        for (text, want) in cases {
            let e = err(text);
            assert!(e.contains(want), "{text}: {e:?} should mention {want:?}");
        }
        // The same IP under two types of one machine is fine.
        Inventory::parse("machines: [{name: a, id: x, addresses: [{type: InternalIP, address: 10.0.0.1}, {type: ExternalIP, address: 10.0.0.1}]}]").unwrap();
    }
}
