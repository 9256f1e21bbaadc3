//! `LoadBalancer` as IP address management: `EnsureLoadBalancer` allocates (or confirms) the
//! service's addresses in the allocation ConfigMap and publishes them; deletion releases them.
//! The provider programs no data plane: announcing the addresses (ARP/NDP, BGP, static routes)
//! is left to the network, e.g. kube-vip or a router configuration (see docs/metal-provider.md).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, RwLock};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde_json::Value;

use crate::config::LoadBalancerConfig;
use crate::ipam::{self, Allocation};
use crate::service::{Request, ServiceKey};
use crate::store::{AllocationStore, KubeApi};

/// The `metal` load balancer.
pub struct MetalLoadBalancer {
    config: LoadBalancerConfig,
    store: RwLock<Option<Arc<AllocationStore>>>,
    /// Serialises this process's allocation decisions (other writers are caught by the
    /// ConfigMap's resourceVersion).
    allocating: Mutex<()>,
}

/// Upstream `DefaultLoadBalancerName`: `"a"` + the UID without dashes, at most 32 characters.
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid: String = service
        .metadata
        .uid
        .as_deref()
        .unwrap_or("")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut name = format!("a{uid}");
    name.truncate(32);
    name
}

impl MetalLoadBalancer {
    /// A load balancer with `config`; it needs [`MetalLoadBalancer::connect`] before use.
    pub fn new(config: LoadBalancerConfig) -> Self {
        Self {
            config,
            store: RwLock::new(None),
            allocating: Mutex::new(()),
        }
    }

    /// Give it the Kubernetes API (at `Initialize`).
    pub fn connect(&self, api: Arc<dyn KubeApi>) {
        let store =
            AllocationStore::new(api, &self.config.state.namespace, &self.config.state.name);
        *self.store.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(store));
    }

    fn store(&self) -> Result<Arc<AllocationStore>> {
        self.store
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| {
                ProviderError::other(
                    "metal load balancer: no Kubernetes API yet (the host has not called Initialize); allocations are kept in a ConfigMap",
                )
            })
    }

    fn status(&self, allocation: &Allocation) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(
                allocation
                    .addresses
                    .iter()
                    .map(|a| LoadBalancerIngress {
                        ip: Some(a.ip.to_string()),
                        hostname: None,
                        ip_mode: self.config.ip_mode.clone(),
                        ports: None,
                    })
                    .collect(),
            ),
        }
    }

    /// Release allocations whose Service no longer exists (deleted while no host ran, or its
    /// finalizer removed by hand). Run at `Initialize`, before the controllers start. Each
    /// candidate is confirmed gone with a GET of the service, and released only if its entry
    /// has not changed meanwhile. Returns the released keys.
    pub fn collect_garbage(&self, ctx: &CallContext) -> Result<Vec<ServiceKey>> {
        let store = self.store()?;
        let api = store.api();
        let (status, body) = api.request(ctx, "GET", "/api/v1/services", &[])?;
        if !(200..300).contains(&status) {
            return Err(ProviderError::other(format!(
                "metal load balancer: cannot list services (HTTP {status}) to release allocations of deleted services"
            )));
        }
        let list: Value = serde_json::from_slice(&body).map_err(|e| {
            ProviderError::other(format!(
                "metal load balancer: service list is not JSON: {e}"
            ))
        })?;
        let existing: BTreeSet<ServiceKey> = list["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .map(|s| ServiceKey {
                namespace: s["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                name: s["metadata"]["name"].as_str().unwrap_or("").to_string(),
            })
            .collect();
        let _guard = self.allocating.lock().unwrap_or_else(|p| p.into_inner());
        let snapshot = store.load(ctx)?;
        let mut gone = Vec::new();
        for (key, alloc) in &snapshot.allocations {
            if existing.contains(key) {
                continue;
            }
            let path = format!("/api/v1/namespaces/{}/services/{}", key.namespace, key.name);
            let (status, _) = api.request(ctx, "GET", &path, &[])?;
            if status == 404 {
                gone.push((key.clone(), alloc.clone()));
            }
        }
        if gone.is_empty() {
            return Ok(Vec::new());
        }
        store
            .update(ctx, |allocations| {
                let mut released = Vec::new();
                for (key, alloc) in &gone {
                    if allocations.get(key) == Some(alloc) {
                        allocations.remove(key);
                        released.push(key.clone());
                    }
                }
                Ok(released)
            })
            .inspect(|released| {
                for key in released {
                    log::info!(
                        "metal load balancer: released the addresses of deleted service {key}"
                    );
                }
            })
    }
}

impl LoadBalancer for MetalLoadBalancer {
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>> {
        let key = ServiceKey::of(service);
        let snapshot = self.store()?.load(ctx)?;
        Ok(snapshot.allocations.get(&key).map(|a| self.status(a)))
    }

    fn get_load_balancer_name(
        &self,
        _ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<String> {
        Ok(default_load_balancer_name(service))
    }

    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        _nodes: &[Node],
    ) -> Result<Option<LoadBalancerStatus>> {
        let request = Request::from_service(service).map_err(ProviderError::other)?;
        let store = self.store()?;
        let _guard = self.allocating.lock().unwrap_or_else(|p| p.into_inner());
        let (allocation, previous) = store.update(ctx, |allocations| {
            let previous = allocations.get(&request.key).cloned();
            let allocation = ipam::assign(&self.config.pools, allocations, &request)
                .map_err(ProviderError::other)?;
            allocations.insert(request.key.clone(), allocation.clone());
            Ok((allocation, previous))
        })?;
        let ips = allocation.ips();
        match previous {
            None => log::info!("metal load balancer: service {} got {ips:?}", request.key),
            Some(p) if p.ips() != ips => log::info!(
                "metal load balancer: service {} moved from {:?} to {ips:?}",
                request.key,
                p.ips()
            ),
            Some(_) => {}
        }
        Ok(Some(self.status(&allocation)))
    }

    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        _nodes: &[Node],
    ) -> Result<()> {
        // Addresses do not depend on the nodes; only check that the service has them.
        let key = ServiceKey::of(service);
        let snapshot = self.store()?.load(ctx)?;
        if snapshot.allocations.contains_key(&key) {
            Ok(())
        } else {
            Err(ProviderError::not_found(format!(
                "metal load balancer: service {key} has no addresses allocated"
            )))
        }
    }

    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<()> {
        let key = ServiceKey::of(service);
        let store = self.store()?;
        let _guard = self.allocating.lock().unwrap_or_else(|p| p.into_inner());
        let released = store.update(ctx, |allocations| Ok(allocations.remove(&key)))?;
        if let Some(a) = released {
            log::info!(
                "metal load balancer: released {:?} of service {key}",
                a.ips()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::MetalConfig;
    use crate::store::memory::MemoryApi;
    use serde_json::json;

    const CM: &str = "/api/v1/namespaces/kube-system/configmaps/ccm-metal-ipam";

    fn lb(api: &Arc<MemoryApi>, yaml: &str) -> MetalLoadBalancer {
        let c = MetalConfig::parse(Some(yaml.as_bytes())).unwrap();
        let lb = MetalLoadBalancer::new(c.load_balancer.unwrap());
        lb.connect(api.clone());
        lb
    }

    const SMALL: &str =
        "loadBalancer: {pools: [{name: p, addresses: ['10.0.0.0/29', 'fd00::/125']}]}";

    fn svc(name: &str, extra: Value) -> Service {
        let mut v = json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid-0000-1111-2222-333344445555")},
                           "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        if let (Value::Object(a), Value::Object(b)) = (&mut v, extra) {
            for (k, val) in b {
                a.insert(k, val);
            }
        }
        serde_json::from_value(v).unwrap()
    }

    fn ips(status: &LoadBalancerStatus) -> Vec<String> {
        status
            .ingress
            .as_ref()
            .unwrap()
            .iter()
            .map(|i| i.ip.clone().unwrap())
            .collect()
    }

    fn ctx() -> CallContext {
        CallContext::background()
    }

    #[test]
    fn ensure_get_update_delete() {
        let api = Arc::new(MemoryApi::default());
        let lb = lb(&api, SMALL);
        let s = svc("web", json!({}));
        assert_eq!(lb.get_load_balancer(&ctx(), "k", &s).unwrap(), None);
        assert!(lb
            .update_load_balancer(&ctx(), "k", &s, &[])
            .unwrap_err()
            .is_not_found());
        let st = lb
            .ensure_load_balancer(&ctx(), "k", &s, &[])
            .unwrap()
            .unwrap();
        assert_eq!(ips(&st), vec!["10.0.0.1"]);
        assert_eq!(lb.get_load_balancer(&ctx(), "k", &s).unwrap(), Some(st));
        lb.update_load_balancer(&ctx(), "k", &s, &[]).unwrap();
        lb.ensure_load_balancer_deleted(&ctx(), "k", &s).unwrap();
        assert_eq!(lb.get_load_balancer(&ctx(), "k", &s).unwrap(), None);
        // Deleting again is fine.
        lb.ensure_load_balancer_deleted(&ctx(), "k", &s).unwrap();
        assert_eq!(
            lb.get_load_balancer_name(&ctx(), "k", &s).unwrap(),
            "awebuid000011112222333344445555"
        );
    }

    #[test]
    fn allocations_survive_a_new_provider_instance() {
        let api = Arc::new(MemoryApi::default());
        let first = lb(&api, SMALL);
        let names = ["a", "b", "c", "d"];
        let mut before = Vec::new();
        for n in names {
            before.push(ips(&first
                .ensure_load_balancer(&ctx(), "k", &svc(n, json!({})), &[])
                .unwrap()
                .unwrap()));
        }
        first
            .ensure_load_balancer_deleted(&ctx(), "k", &svc("a", json!({})))
            .unwrap();
        drop(first);
        // A new instance (a restart) ensures them in the reverse order: same addresses.
        let second = lb(&api, SMALL);
        for (i, n) in names.iter().enumerate().rev().filter(|(_, n)| **n != "a") {
            let got = ips(&second
                .ensure_load_balancer(&ctx(), "k", &svc(n, json!({})), &[])
                .unwrap()
                .unwrap());
            assert_eq!(got, before[i], "service {n}");
        }
        // The released address goes to the next new service.
        let e = ips(&second
            .ensure_load_balancer(&ctx(), "k", &svc("e", json!({})), &[])
            .unwrap()
            .unwrap());
        assert_eq!(e, before[0]);
    }

    #[test]
    fn errors_reach_the_caller_and_write_nothing() {
        let api = Arc::new(MemoryApi::default());
        let lb = lb(
            &api,
            "loadBalancer: {ipMode: Proxy, pools: [{name: p, addresses: ['10.0.0.1']}]}",
        );
        let st = lb
            .ensure_load_balancer(&ctx(), "k", &svc("one", json!({})), &[])
            .unwrap()
            .unwrap();
        assert_eq!(st.ingress.unwrap()[0].ip_mode.as_deref(), Some("Proxy"));
        let e = lb
            .ensure_load_balancer(&ctx(), "k", &svc("two", json!({})), &[])
            .unwrap_err();
        assert_eq!(e.to_string(), "no free IPv4 address for service ns/two: pool \"p\" (10.0.0.1) has 1 of 1 IPv4 addresses allocated");
        let e = lb
            .ensure_load_balancer(&ctx(), "k", &svc("bad", json!({"metadata": {"name": "bad", "namespace": "ns", "annotations": {"metal.ccm-host.io/pool": "nope"}}})), &[])
            .unwrap_err();
        assert!(e.to_string().contains("pool \"nope\""), "{e}");
        let cm = api.objects.lock().unwrap()[CM].clone();
        assert_eq!(cm["data"].as_object().unwrap().len(), 1);
    }

    #[test]
    fn without_initialize_calls_fail_clearly() {
        let c = MetalConfig::parse(Some(SMALL.as_bytes())).unwrap();
        let lb = MetalLoadBalancer::new(c.load_balancer.unwrap());
        let e = lb
            .ensure_load_balancer(&ctx(), "k", &svc("x", json!({})), &[])
            .unwrap_err();
        assert!(e.to_string().contains("has not called Initialize"), "{e}");
    }

    #[test]
    fn garbage_collection_releases_only_deleted_services() {
        let api = Arc::new(MemoryApi::default());
        let lb = lb(&api, SMALL);
        for n in ["kept", "gone"] {
            lb.ensure_load_balancer(&ctx(), "k", &svc(n, json!({})), &[])
                .unwrap();
        }
        api.put(
            "/api/v1/namespaces/ns/services/kept",
            json!({"metadata": {"name": "kept", "namespace": "ns"}}),
        );
        let released = lb.collect_garbage(&ctx()).unwrap();
        assert_eq!(
            released,
            vec![ServiceKey {
                namespace: "ns".into(),
                name: "gone".into()
            }]
        );
        assert!(lb
            .get_load_balancer(&ctx(), "k", &svc("kept", json!({})))
            .unwrap()
            .is_some());
        assert!(lb
            .get_load_balancer(&ctx(), "k", &svc("gone", json!({})))
            .unwrap()
            .is_none());
    }
}
