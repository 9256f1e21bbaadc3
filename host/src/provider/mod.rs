//! The selected cloud provider as the controllers see it: typed async methods over the plugin's
//! ABI, all going through one call path ([`Provider::call`]).
//!
//! The host never calls a plugin on an async worker: every call runs on tokio's blocking pool
//! with a deadline; when the deadline passes the host stops waiting, sets the call's cancellation
//! flag (which the plugin can poll through its `CallContext`) and returns `DeadlineExceeded`.
//! Dropping the returned future (e.g. on shutdown) cancels the call the same way.

mod host_services;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use abi_stable::std_types::{RResult, RString};
use ccm_provider_abi::abi::{
    CloudProviderBox, ClustersBox, InstancesBox, InstancesV2Box, LoadBalancerBox,
    ProviderFactoryBox, RoutesBox, ZonesBox,
};
use ccm_provider_abi::types::AbiRoute;
use ccm_provider_abi::{CallContext, InstanceMetadata, ProviderError, Route, Zone};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};
use serde::Serialize;

pub use host_services::HostServices;

/// Options of the provider call layer.
#[derive(Debug, Clone)]
pub struct ProviderOptions {
    /// Deadline of every provider call (default 30 s).
    pub call_timeout: Duration,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// Which optional capabilities the provider offers (upstream's `(impl, bool)` getters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// `LoadBalancer()`
    pub load_balancer: bool,
    /// `Instances()`
    pub instances: bool,
    /// `InstancesV2()`
    pub instances_v2: bool,
    /// `Zones()`
    pub zones: bool,
    /// `Clusters()`
    pub clusters: bool,
    /// `Routes()`
    pub routes: bool,
}

impl Capabilities {
    /// Names of the capabilities present, upstream spelling.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.instances_v2, "InstancesV2"),
            (self.instances, "Instances"),
            (self.zones, "Zones"),
            (self.load_balancer, "LoadBalancer"),
            (self.routes, "Routes"),
            (self.clusters, "Clusters"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// The selected provider. Cheap to clone; share it between controllers.
#[derive(Clone)]
pub struct Provider {
    inner: Arc<Inner>,
}

struct Inner {
    registered_name: String,
    provider_name: String,
    plugin_path: PathBuf,
    options: ProviderOptions,
    cloud: Arc<CloudProviderBox>,
    load_balancer: Option<Arc<LoadBalancerBox>>,
    instances: Option<Arc<InstancesBox>>,
    instances_v2: Option<Arc<InstancesV2Box>>,
    zones: Option<Arc<ZonesBox>>,
    clusters: Option<Arc<ClustersBox>>,
    routes: Option<Arc<RoutesBox>>,
}

fn unsupported(capability: &str) -> ProviderError {
    ProviderError::not_implemented()
        .context(format!("the cloud provider does not support {capability}"))
}

fn to_json<T: Serialize>(what: &str, value: &T) -> Result<String, ProviderError> {
    serde_json::to_string(value)
        .map_err(|e| ProviderError::other(format!("cannot serialise {what} for the provider: {e}")))
}

/// Sets the call's cancellation flag when dropped before the call finished.
struct CancelOnDrop(Option<CallContext>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(ctx) = self.0.take() {
            ctx.cancel();
        }
    }
}

impl Provider {
    /// Run the factory (with the deadline) and cache the capability objects.
    pub(crate) fn create(
        registered_name: &str,
        plugin_path: &Path,
        factory: &Arc<ProviderFactoryBox>,
        config: Option<&[u8]>,
        options: &ProviderOptions,
    ) -> Result<Self, ProviderError> {
        let factory = factory.clone();
        let config = config.map(<[u8]>::to_vec);
        let cloud = run_with_deadline("provider factory", options.call_timeout, move || {
            factory.create(config.as_deref().map(Into::into).into())
        })?;
        let cloud = Arc::new(cloud);
        let provider_name = cloud.provider_name().into_string();
        let inner = Inner {
            registered_name: registered_name.to_string(),
            provider_name,
            plugin_path: plugin_path.to_path_buf(),
            options: options.clone(),
            load_balancer: cloud.load_balancer().into_option().map(Arc::new),
            instances: cloud.instances().into_option().map(Arc::new),
            instances_v2: cloud.instances_v2().into_option().map(Arc::new),
            zones: cloud.zones().into_option().map(Arc::new),
            clusters: cloud.clusters().into_option().map(Arc::new),
            routes: cloud.routes().into_option().map(Arc::new),
            cloud,
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The name the provider was registered and selected under.
    pub fn registered_name(&self) -> &str {
        &self.inner.registered_name
    }

    /// `ProviderName()`: the scheme of provider IDs.
    pub fn provider_name(&self) -> &str {
        &self.inner.provider_name
    }

    /// The plugin file the provider came from.
    pub fn plugin_path(&self) -> &Path {
        &self.inner.plugin_path
    }

    /// `HasClusterID()`.
    pub fn has_cluster_id(&self) -> bool {
        self.inner.cloud.has_cluster_id()
    }

    /// The optional capabilities present.
    pub fn capabilities(&self) -> Capabilities {
        let i = &self.inner;
        Capabilities {
            load_balancer: i.load_balancer.is_some(),
            instances: i.instances.is_some(),
            instances_v2: i.instances_v2.is_some(),
            zones: i.zones.is_some(),
            clusters: i.clusters.is_some(),
            routes: i.routes.is_some(),
        }
    }

    /// The single path every provider call takes: blocking pool, deadline, cancellation.
    pub async fn call<T, F>(&self, op: &'static str, f: F) -> Result<T, ProviderError>
    where
        T: Send + 'static,
        F: FnOnce(&CallContext) -> RResult<T, ProviderError> + Send + 'static,
    {
        let timeout = self.inner.options.call_timeout;
        let ctx = CallContext::new(Some(timeout));
        let mut guard = CancelOnDrop(Some(ctx.clone()));
        let plugin_ctx = ctx.clone();
        let task = tokio::task::spawn_blocking(move || f(&plugin_ctx).into_result());
        let outcome = tokio::time::timeout(timeout, task).await;
        match outcome {
            Ok(Ok(result)) => {
                guard.0 = None;
                result
            }
            // The SDK catches plugin panics; this is a panic in the host's own closure.
            Ok(Err(join)) => Err(ProviderError::panicked(format!("{op}: {join}"))),
            Err(_) => {
                ctx.cancel();
                guard.0 = None;
                tracing::warn!(op, ?timeout, provider = %self.inner.registered_name, "provider call timed out; cancelled");
                Err(ProviderError::deadline_exceeded(format!(
                    "{op} did not return within {timeout:?}"
                )))
            }
        }
    }

    /// `Initialize`.
    pub async fn initialize(&self, host: HostServices) -> Result<(), ProviderError> {
        let cloud = self.inner.cloud.clone();
        self.call("Initialize", move |ctx| {
            cloud.initialize(ctx, host.into_abi())
        })
        .await
    }

    fn lb(&self) -> Result<Arc<LoadBalancerBox>, ProviderError> {
        self.inner
            .load_balancer
            .clone()
            .ok_or_else(|| unsupported("LoadBalancer"))
    }

    fn legacy(&self) -> Result<Arc<InstancesBox>, ProviderError> {
        self.inner
            .instances
            .clone()
            .ok_or_else(|| unsupported("Instances"))
    }

    fn v2(&self) -> Result<Arc<InstancesV2Box>, ProviderError> {
        self.inner
            .instances_v2
            .clone()
            .ok_or_else(|| unsupported("InstancesV2"))
    }

    fn zones(&self) -> Result<Arc<ZonesBox>, ProviderError> {
        self.inner.zones.clone().ok_or_else(|| unsupported("Zones"))
    }

    fn routes(&self) -> Result<Arc<RoutesBox>, ProviderError> {
        self.inner
            .routes
            .clone()
            .ok_or_else(|| unsupported("Routes"))
    }

    fn clusters(&self) -> Result<Arc<ClustersBox>, ProviderError> {
        self.inner
            .clusters
            .clone()
            .ok_or_else(|| unsupported("Clusters"))
    }

    // ---- LoadBalancer ----------------------------------------------------------------------

    /// `GetLoadBalancer`: `Some(status)` when it exists.
    pub async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        self.call("GetLoadBalancer", move |ctx| {
            lb.get_load_balancer(ctx, cluster.as_str().into(), svc.as_str().into())
                .map(|o| o.into_option().map(Into::into))
        })
        .await
    }

    /// `GetLoadBalancerName`.
    pub async fn get_load_balancer_name(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<String, ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        self.call("GetLoadBalancerName", move |ctx| {
            lb.get_load_balancer_name(ctx, cluster.as_str().into(), svc.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `EnsureLoadBalancer`: `None` is upstream's nil status.
    pub async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        let nodes = nodes_json(nodes)?;
        self.call("EnsureLoadBalancer", move |ctx| {
            lb.ensure_load_balancer(
                ctx,
                cluster.as_str().into(),
                svc.as_str().into(),
                nodes.as_slice().into(),
            )
            .map(|o| o.into_option().map(Into::into))
        })
        .await
    }

    /// `UpdateLoadBalancer`.
    pub async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        let nodes = nodes_json(nodes)?;
        self.call("UpdateLoadBalancer", move |ctx| {
            lb.update_load_balancer(
                ctx,
                cluster.as_str().into(),
                svc.as_str().into(),
                nodes.as_slice().into(),
            )
        })
        .await
    }

    /// `EnsureLoadBalancerDeleted`.
    pub async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let (lb, cluster, svc) = (
            self.lb()?,
            cluster.to_string(),
            to_json("Service", service)?,
        );
        self.call("EnsureLoadBalancerDeleted", move |ctx| {
            lb.ensure_load_balancer_deleted(ctx, cluster.as_str().into(), svc.as_str().into())
        })
        .await
    }

    // ---- Instances (legacy) ----------------------------------------------------------------

    /// `NodeAddresses`.
    pub async fn node_addresses(&self, node_name: &str) -> Result<Vec<NodeAddress>, ProviderError> {
        let (i, name) = (self.legacy()?, node_name.to_string());
        self.call("NodeAddresses", move |ctx| {
            i.node_addresses(ctx, name.as_str().into())
                .map(from_abi_addresses)
        })
        .await
    }

    /// `NodeAddressesByProviderID`.
    pub async fn node_addresses_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<Vec<NodeAddress>, ProviderError> {
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.call("NodeAddressesByProviderID", move |ctx| {
            i.node_addresses_by_provider_id(ctx, id.as_str().into())
                .map(from_abi_addresses)
        })
        .await
    }

    /// `InstanceID`.
    pub async fn instance_id(&self, node_name: &str) -> Result<String, ProviderError> {
        let (i, name) = (self.legacy()?, node_name.to_string());
        self.call("InstanceID", move |ctx| {
            i.instance_id(ctx, name.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `InstanceType`.
    pub async fn instance_type(&self, node_name: &str) -> Result<String, ProviderError> {
        let (i, name) = (self.legacy()?, node_name.to_string());
        self.call("InstanceType", move |ctx| {
            i.instance_type(ctx, name.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `InstanceTypeByProviderID`.
    pub async fn instance_type_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<String, ProviderError> {
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.call("InstanceTypeByProviderID", move |ctx| {
            i.instance_type_by_provider_id(ctx, id.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    /// `InstanceExistsByProviderID`.
    pub async fn instance_exists_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<bool, ProviderError> {
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.call("InstanceExistsByProviderID", move |ctx| {
            i.instance_exists_by_provider_id(ctx, id.as_str().into())
        })
        .await
    }

    /// `InstanceShutdownByProviderID`.
    pub async fn instance_shutdown_by_provider_id(
        &self,
        provider_id: &str,
    ) -> Result<bool, ProviderError> {
        let (i, id) = (self.legacy()?, provider_id.to_string());
        self.call("InstanceShutdownByProviderID", move |ctx| {
            i.instance_shutdown_by_provider_id(ctx, id.as_str().into())
        })
        .await
    }

    /// `CurrentNodeName`.
    pub async fn current_node_name(&self, hostname: &str) -> Result<String, ProviderError> {
        let (i, host) = (self.legacy()?, hostname.to_string());
        self.call("CurrentNodeName", move |ctx| {
            i.current_node_name(ctx, host.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    // ---- InstancesV2 -----------------------------------------------------------------------

    /// `InstanceExists`.
    pub async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        let (i, node) = (self.v2()?, to_json("Node", node)?);
        self.call("InstanceExists", move |ctx| {
            i.instance_exists(ctx, node.as_str().into())
        })
        .await
    }

    /// `InstanceShutdown`.
    pub async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        let (i, node) = (self.v2()?, to_json("Node", node)?);
        self.call("InstanceShutdown", move |ctx| {
            i.instance_shutdown(ctx, node.as_str().into())
        })
        .await
    }

    /// `InstanceMetadata`: `None` is upstream's `(nil, nil)`.
    pub async fn instance_metadata(
        &self,
        node: &Node,
    ) -> Result<Option<InstanceMetadata>, ProviderError> {
        let (i, node) = (self.v2()?, to_json("Node", node)?);
        self.call("InstanceMetadata", move |ctx| {
            i.instance_metadata(ctx, node.as_str().into())
                .map(|o| o.into_option().map(Into::into))
        })
        .await
    }

    // ---- Zones -----------------------------------------------------------------------------

    /// `GetZoneByProviderID`.
    pub async fn get_zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, ProviderError> {
        let (z, id) = (self.zones()?, provider_id.to_string());
        self.call("GetZoneByProviderID", move |ctx| {
            z.get_zone_by_provider_id(ctx, id.as_str().into())
                .map(Into::into)
        })
        .await
    }

    /// `GetZoneByNodeName`.
    pub async fn get_zone_by_node_name(&self, node_name: &str) -> Result<Zone, ProviderError> {
        let (z, name) = (self.zones()?, node_name.to_string());
        self.call("GetZoneByNodeName", move |ctx| {
            z.get_zone_by_node_name(ctx, name.as_str().into())
                .map(Into::into)
        })
        .await
    }

    // ---- Clusters --------------------------------------------------------------------------

    /// `ListClusters`.
    pub async fn list_clusters(&self) -> Result<Vec<String>, ProviderError> {
        let c = self.clusters()?;
        self.call("ListClusters", move |ctx| {
            c.list_clusters(ctx)
                .map(|v| v.into_iter().map(RString::into_string).collect())
        })
        .await
    }

    /// `Master`.
    pub async fn master(&self, cluster: &str) -> Result<String, ProviderError> {
        let (c, cluster) = (self.clusters()?, cluster.to_string());
        self.call("Master", move |ctx| {
            c.master(ctx, cluster.as_str().into())
                .map(RString::into_string)
        })
        .await
    }

    // ---- Routes ----------------------------------------------------------------------------

    /// `ListRoutes`.
    pub async fn list_routes(&self, cluster: &str) -> Result<Vec<Route>, ProviderError> {
        let (r, cluster) = (self.routes()?, cluster.to_string());
        self.call("ListRoutes", move |ctx| {
            r.list_routes(ctx, cluster.as_str().into())
                .map(|v| v.into_iter().map(Route::from).collect())
        })
        .await
    }

    /// `CreateRoute`.
    pub async fn create_route(
        &self,
        cluster: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        let (r, cluster, hint) = (self.routes()?, cluster.to_string(), name_hint.to_string());
        let route = AbiRoute::from(route.clone());
        self.call("CreateRoute", move |ctx| {
            r.create_route(ctx, cluster.as_str().into(), hint.as_str().into(), &route)
        })
        .await
    }

    /// `DeleteRoute`.
    pub async fn delete_route(&self, cluster: &str, route: &Route) -> Result<(), ProviderError> {
        let (r, cluster) = (self.routes()?, cluster.to_string());
        let route = AbiRoute::from(route.clone());
        self.call("DeleteRoute", move |ctx| {
            r.delete_route(ctx, cluster.as_str().into(), &route)
        })
        .await
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("registered_name", &self.inner.registered_name)
            .field("provider_name", &self.inner.provider_name)
            .field("plugin_path", &self.inner.plugin_path)
            .field("capabilities", &self.capabilities())
            .finish()
    }
}

fn nodes_json(nodes: &[Node]) -> Result<Vec<RString>, ProviderError> {
    nodes
        .iter()
        .map(|n| to_json("Node", n).map(RString::from))
        .collect()
}

fn from_abi_addresses(
    v: abi_stable::std_types::RVec<ccm_provider_abi::types::AbiNodeAddress>,
) -> Vec<NodeAddress> {
    v.into_iter().map(Into::into).collect()
}

/// Run a synchronous plugin call (the factory) on a helper thread with a deadline, for callers
/// that are not inside the async runtime.
fn run_with_deadline<T: Send + 'static>(
    op: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> RResult<T, ProviderError> + Send + 'static,
) -> Result<T, ProviderError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name(format!("ccm-{op}"))
        .spawn(move || {
            let _ = tx.send(f().into_result());
        })
        .map_err(|e| ProviderError::other(format!("cannot start a thread for {op}: {e}")))?;
    match rx.recv_timeout(timeout) {
        Ok(result) => result,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(ProviderError::deadline_exceeded(
            format!("{op} did not return within {timeout:?}"),
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(ProviderError::panicked(
            format!("{op} ended without an answer"),
        )),
    }
}
