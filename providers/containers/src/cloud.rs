//! The `kind` provider object and what its parts share: the runtime client and the config.

use std::sync::Arc;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;

use crate::config::ContainersConfig;
use crate::engine::Engine;
use crate::instances::ContainerInstances;
use crate::loadbalancer::ContainerLoadBalancer;

/// What the instances and the load balancer share.
pub struct Shared {
    /// The Engine API client.
    pub engine: Engine,
    /// The cloud config.
    pub config: ContainersConfig,
}

/// The provider object.
pub struct ContainersCloud {
    shared: Arc<Shared>,
    instances: Arc<ContainerInstances>,
    load_balancer: Arc<ContainerLoadBalancer>,
}

impl ContainersCloud {
    /// The factory: parse the cloud config and pick the socket. No runtime call is made here
    /// (the first call, or the health probe, reports a missing runtime).
    pub fn new(config: Option<&[u8]>) -> Result<Self> {
        let config = ContainersConfig::parse(config)?;
        let engine = Engine::new(config.socket_path());
        log::info!(
            "containers provider: runtime {}, cluster {:?} (label {}), network {}, proxy image {}",
            engine.socket().display(),
            config.cluster,
            config.cluster_label,
            config.network,
            config.load_balancer.image
        );
        let shared = Arc::new(Shared { engine, config });
        Ok(Self {
            instances: Arc::new(ContainerInstances::new(shared.clone())),
            load_balancer: Arc::new(ContainerLoadBalancer::new(shared.clone())),
            shared,
        })
    }

    /// The shared state (tests).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

impl CloudProvider for ContainersCloud {
    fn provider_name(&self) -> String {
        crate::KIND.into()
    }

    /// Removes this cluster's proxies of Services deleted while no host ran (best effort: a
    /// failure is logged and only delays that clean-up).
    fn initialize(&self, ctx: &CallContext, host: Host) -> Result<()> {
        match self.load_balancer.collect_garbage(ctx, &host) {
            Ok(removed) if !removed.is_empty() => log::info!(
                "containers provider: removed {} proxies of deleted Services",
                removed.len()
            ),
            Ok(_) => {}
            Err(e) => log::warn!(
                "containers provider: could not look for proxies of deleted Services: {e}"
            ),
        }
        Ok(())
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(self.instances.clone())
    }

    fn bulk_instances(&self) -> Option<Arc<dyn BulkInstances>> {
        Some(self.instances.clone())
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.load_balancer.clone())
    }

    fn platforms(&self) -> Vec<String> {
        vec![format!("{}://", crate::KIND)]
    }

    /// `GET /_ping` on the runtime's socket.
    fn health(&self, ctx: &CallContext) -> Result<()> {
        self.shared.engine.ping(ctx)
    }
}
