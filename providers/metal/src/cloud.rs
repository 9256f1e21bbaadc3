//! The `metal` provider: InstancesV2 when an inventory is configured, LoadBalancer when pools
//! are; nothing else (no routes, zones come from the inventory through InstancesV2).

use std::sync::Arc;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::config::MetalConfig;
use crate::instances::MetalInstances;
use crate::loadbalancer::MetalLoadBalancer;
use crate::reload::InventorySource;

/// The provider object.
pub struct MetalCloud {
    instances: Option<Arc<MetalInstances>>,
    load_balancer: Option<Arc<MetalLoadBalancer>>,
}

impl MetalCloud {
    /// Build from the `--cloud-config` bytes: the config and the inventory must be valid.
    pub fn new(config: Option<&[u8]>) -> Result<Self> {
        let config = MetalConfig::parse(config)?;
        let instances = match &config.inventory {
            Some(path) => Some(Arc::new(MetalInstances::new(Arc::new(
                InventorySource::open(path)?,
            )))),
            None => None,
        };
        let load_balancer = config
            .load_balancer
            .map(|lb| Arc::new(MetalLoadBalancer::new(lb)));
        Ok(Self {
            instances,
            load_balancer,
        })
    }
}

impl CloudProvider for MetalCloud {
    fn provider_name(&self) -> String {
        crate::METAL.into()
    }

    fn initialize(&self, ctx: &CallContext, host: Host) -> Result<()> {
        let Some(lb) = &self.load_balancer else {
            return Ok(());
        };
        lb.connect(Arc::new(host));
        // Best effort: a failure here only delays the release of leaked addresses.
        match lb.collect_garbage(ctx) {
            Ok(released) if !released.is_empty() => log::info!(
                "metal load balancer: released the addresses of {} deleted services",
                released.len()
            ),
            Ok(_) => {}
            Err(e) => log::warn!(
                "metal load balancer: could not check for allocations of deleted services: {e}"
            ),
        }
        Ok(())
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        self.load_balancer
            .clone()
            .map(|lb| lb as Arc<dyn LoadBalancer>)
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        self.instances.clone().map(|i| i as Arc<dyn InstancesV2>)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_follow_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let inv = dir.path().join("inv.yaml");
        std::fs::write(&inv, "machines: []").unwrap();
        let only_inv = format!("inventory: {}", inv.display());
        let c = MetalCloud::new(Some(only_inv.as_bytes())).unwrap();
        assert!(c.instances_v2().is_some() && c.load_balancer().is_none());
        assert_eq!(c.provider_name(), "metal");
        let only_lb = "loadBalancer: {pools: [{name: p, addresses: [10.0.0.1]}]}";
        let c = MetalCloud::new(Some(only_lb.as_bytes())).unwrap();
        assert!(c.instances_v2().is_none() && c.load_balancer().is_some());
        assert!(c.routes().is_none() && c.zones().is_none() && c.instances().is_none());
        // A missing inventory file fails at start-up.
        let missing = format!("inventory: {}", dir.path().join("nope.yaml").display());
        let e = MetalCloud::new(Some(missing.as_bytes())).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
        assert!(e.to_string().contains("nope.yaml: cannot be read"), "{e}");
    }
}
