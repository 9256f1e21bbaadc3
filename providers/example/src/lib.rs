//! A complete minimal provider (InstancesV2 only), explained in docs/writing-a-provider.md.
//! The cloud is a static table given as the cloud config: one line per instance (`#` comments).
use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

const LINE: &str = "<node-name> <instance-id> <internal-ip> <zone> <region>";
/// Node name -> `[provider ID, internal IP, zone, region]`.
type Table = BTreeMap<String, [String; 4]>;
struct Example(Arc<Table>);

fn new(config: Option<&[u8]>) -> Result<Example> {
    let bad = |n: usize| ProviderError::invalid_config(format!("line {n}: want {LINE}"));
    let mut table = Table::new();
    let text = String::from_utf8_lossy(config.unwrap_or_default());
    for (line, n) in text.lines().zip(1..) {
        let line = line.split('#').next().unwrap_or_default();
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            [] => {}
            [node, id, ip, zone, region] if ip.parse::<IpAddr>().is_ok() => {
                let pid = format!("example://{id}");
                table.insert(node.into(), [pid, ip.into(), zone.into(), region.into()]);
            }
            _ => return Err(bad(n)),
        }
    }
    ccm_provider_abi::log::info!("example cloud with {} instances", table.len());
    Ok(Example(Arc::new(table)))
}

impl CloudProvider for Example {
    fn provider_name(&self) -> String {
        "example".into()
    }
    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(Arc::new(Example(self.0.clone())))
    }
}

/// By `spec.providerID` when the node has one, else by node name.
fn find<'a>(table: &'a Table, node: &Node) -> Result<(&'a String, &'a [String; 4])> {
    let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    let name = node.metadata.name.as_deref();
    match pid.filter(|p| !p.is_empty()) {
        Some(pid) => table.iter().find(|(_, i)| i[0] == pid),
        None => table.iter().find(|(n, _)| Some(n.as_str()) == name),
    }
    .ok_or_else(ProviderError::instance_not_found)
}

fn addr(type_: &str, address: &str) -> NodeAddress {
    let (type_, address) = (type_.into(), address.into());
    NodeAddress { type_, address }
}

impl InstancesV2 for Example {
    fn instance_exists(&self, _: &CallContext, node: &Node) -> Result<bool> {
        Ok(find(&self.0, node).is_ok())
    }
    fn instance_shutdown(&self, _: &CallContext, node: &Node) -> Result<bool> {
        find(&self.0, node).map(|_| false) // the table lists running instances only
    }
    fn instance_metadata(&self, _: &CallContext, node: &Node) -> Result<Option<InstanceMetadata>> {
        let (name, [provider_id, ip, zone, region]) = find(&self.0, node)?;
        Ok(Some(InstanceMetadata {
            provider_id: provider_id.clone(),
            instance_type: "example.standard".into(),
            node_addresses: vec![
                addr(address_type::INTERNAL_IP, ip),
                addr(address_type::HOSTNAME, name),
            ],
            zone: zone.clone(),
            region: region.clone(),
            additional_labels: BTreeMap::new(),
        }))
    }
}

fn register(r: &mut Registrar) -> Result<()> {
    r.register("example", new)
}
ccm_provider_abi::export_plugin!(register);
