//! `InstancesV2` from the inventory: a node is matched to its machine by `spec.providerID`,
//! else by name, else by any of its addresses (see [`Inventory::find`]).

use std::sync::Arc;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::inventory::{Machine, MachineState};
use crate::reload::InventorySource;

/// The `metal` InstancesV2.
pub struct MetalInstances {
    source: Arc<InventorySource>,
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

impl MetalInstances {
    /// Instances backed by `source`.
    pub fn new(source: Arc<InventorySource>) -> Self {
        Self { source }
    }

    /// The machine behind `node` (`Ok(None)`: none), from the inventory in force.
    fn machine(&self, ctx: &CallContext, node: &Node) -> Result<Option<Machine>> {
        ctx.check()?;
        let inventory = self.source.current();
        let found = inventory.find(node).map_err(|e| {
            ProviderError::other(format!(
                "metal inventory {}: {e}",
                self.source.path().display()
            ))
        })?;
        Ok(found.map(|(m, _)| m.clone()))
    }

    fn not_found(&self, node: &Node, machine: Option<&Machine>) -> ProviderError {
        let why = match machine {
            Some(m) => format!("machine {:?} is marked absent", m.name),
            None => match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
                Some(pid) if !pid.is_empty() => format!("no machine has provider ID {pid:?}"),
                _ => "no machine has its name or any of its addresses".into(),
            },
        };
        ProviderError::new(
            ErrorKind::INSTANCE_NOT_FOUND,
            format!(
                "instance not found: node {:?}: {why} in inventory {}",
                node_name(node),
                self.source.path().display()
            ),
        )
    }
}

impl InstancesV2 for MetalInstances {
    fn instance_exists(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        Ok(self
            .machine(ctx, node)?
            .is_some_and(|m| m.state != MachineState::Absent))
    }

    fn instance_shutdown(&self, ctx: &CallContext, node: &Node) -> Result<bool> {
        match self.machine(ctx, node)? {
            Some(m) if m.state != MachineState::Absent => Ok(m.state == MachineState::Shutdown),
            m => Err(self.not_found(node, m.as_ref())),
        }
    }

    fn instance_metadata(
        &self,
        ctx: &CallContext,
        node: &Node,
    ) -> Result<Option<InstanceMetadata>> {
        match self.machine(ctx, node)? {
            Some(m) if m.state != MachineState::Absent => Ok(Some(m.metadata())),
            m => Err(self.not_found(node, m.as_ref())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(v: serde_json::Value) -> Node {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn states_map_to_exists_and_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inv.yaml");
        std::fs::write(
            &path,
            "machines: [{name: up, id: '1'}, {name: off, id: '2', state: shutdown}, {name: gone, id: '3', state: absent}]",
        )
        .unwrap();
        let i = MetalInstances::new(Arc::new(InventorySource::open(&path).unwrap()));
        let ctx = CallContext::background();
        let n = |name: &str| node(json!({"metadata": {"name": name}}));
        assert!(i.instance_exists(&ctx, &n("up")).unwrap());
        assert!(!i.instance_shutdown(&ctx, &n("up")).unwrap());
        assert!(i.instance_exists(&ctx, &n("off")).unwrap());
        assert!(i.instance_shutdown(&ctx, &n("off")).unwrap());
        assert!(!i.instance_exists(&ctx, &n("gone")).unwrap());
        assert!(!i.instance_exists(&ctx, &n("unknown")).unwrap());
        let e = i.instance_metadata(&ctx, &n("gone")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::INSTANCE_NOT_FOUND);
        assert!(
            e.to_string().contains("machine \"gone\" is marked absent"),
            "{e}"
        );
        let e = i.instance_shutdown(&ctx, &n("unknown")).unwrap_err();
        assert!(
            e.to_string()
                .contains("node \"unknown\": no machine has its name or any of its addresses"),
            "{e}"
        );
        let pid = node(json!({"metadata": {"name": "x"}, "spec": {"providerID": "metal://9"}}));
        let e = i.instance_metadata(&ctx, &pid).unwrap_err();
        assert!(
            e.to_string()
                .contains("no machine has provider ID \"metal://9\""),
            "{e}"
        );
        let md = i.instance_metadata(&ctx, &n("off")).unwrap().unwrap();
        assert_eq!(md.provider_id, "metal://2");
        // A cancelled call stops.
        let c = CallContext::background();
        c.cancel();
        assert_eq!(
            i.instance_exists(&c, &n("up")).unwrap_err().kind(),
            ErrorKind::CANCELLED
        );
    }
}
