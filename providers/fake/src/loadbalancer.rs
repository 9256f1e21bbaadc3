//! Load balancers: one per service (`namespace/name`), with a stable address from `externalIP`,
//! the service's `spec.loadBalancerIP`, or the `ipPool`.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::cloud::{fnv1a, FakeCloud, Settings};
use crate::config::IpPool;

/// A load balancer of the fake cloud (as in `cloud.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerRecord {
    /// Upstream `DefaultLoadBalancerName`: `"a"` + the UID without dashes, at most 32 characters.
    pub name: String,
    /// The `--cluster-name` it was ensured for.
    pub cluster: String,
    /// Service namespace.
    pub namespace: String,
    /// Service name.
    pub service: String,
    /// Service UID.
    pub uid: String,
    /// The service's ports.
    pub ports: Vec<PortRecord>,
    /// Names of the backend nodes, sorted.
    pub hosts: Vec<String>,
    /// The address published in the ingress.
    #[serde(rename = "loadBalancerIP")]
    pub load_balancer_ip: String,
    /// `ipMode` published in the ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_mode: Option<String>,
}

impl LoadBalancerRecord {
    /// `namespace/name`.
    pub fn service_key(&self) -> String {
        format!("{}/{}", self.namespace, self.service)
    }

    /// The status the cloud reports for this load balancer.
    pub fn status(&self) -> LoadBalancerStatus {
        LoadBalancerStatus {
            ingress: Some(vec![LoadBalancerIngress {
                ip: Some(self.load_balancer_ip.clone()),
                hostname: None,
                ip_mode: self.ip_mode.clone(),
                ports: Some(
                    self.ports
                        .iter()
                        .map(|p| PortStatus {
                            port: p.port,
                            protocol: p.protocol.clone(),
                            error: None,
                        })
                        .collect(),
                ),
            }]),
        }
    }
}

/// One port of a load balancer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortRecord {
    /// Port name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `TCP`, `UDP`, `SCTP`.
    pub protocol: String,
    /// Service port.
    pub port: i32,
    /// Node port, if allocated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_port: Option<i32>,
}

/// Upstream `DefaultLoadBalancerName`.
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

/// `namespace/name` of a service (namespace defaults to `default`).
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or("")
    )
}

/// Pool addresses handed out, by service key. An address stays with its service until the load
/// balancer is deleted.
#[derive(Default)]
pub(crate) struct PoolAlloc {
    by_key: HashMap<String, Ipv4Addr>,
    used: HashSet<Ipv4Addr>,
}

impl PoolAlloc {
    fn get_or_alloc(&mut self, key: &str, pool: IpPool) -> Result<Ipv4Addr> {
        if let Some(ip) = self.by_key.get(key) {
            return Ok(*ip);
        }
        let size = pool.size();
        if size == 0 {
            return Err(ProviderError::other(format!(
                "ipPool {pool} has no addresses"
            )));
        }
        // Start at a hash of the key so the address does not depend on the order of creation.
        let start = (fnv1a(key.as_bytes()) % u64::from(size)) as u32;
        for step in 0..size {
            let ip = pool.nth((start + step) % size);
            if self.used.insert(ip) {
                self.by_key.insert(key.to_string(), ip);
                return Ok(ip);
            }
        }
        Err(ProviderError::other(format!(
            "ipPool {pool} is exhausted ({size} load balancers)"
        )))
    }

    /// Record the address of a load balancer loaded from a shared `cloud.json` (only addresses
    /// of `pool` are the pool's to hand out and release).
    pub(crate) fn restore(&mut self, key: &str, ip: Ipv4Addr, pool: IpPool) {
        let offset = u64::from(u32::from(ip)).wrapping_sub(u64::from(u32::from(pool.network)));
        if u32::from(ip) >= u32::from(pool.network)
            && offset < 1u64 << (32 - u32::from(pool.prefix))
        {
            self.by_key.insert(key.to_string(), ip);
            self.used.insert(ip);
        }
    }

    fn release(&mut self, key: &str) {
        if let Some(ip) = self.by_key.remove(key) {
            self.used.remove(&ip);
        }
    }
}

fn host_names(nodes: &[Node]) -> Vec<String> {
    let mut hosts: Vec<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

fn ports(service: &Service) -> Vec<PortRecord> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map(|ports| {
            ports
                .iter()
                .map(|p| PortRecord {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: p.port,
                    node_port: p.node_port,
                })
                .collect()
        })
        .unwrap_or_default()
}

fn requested_ip(service: &Service) -> Option<String> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_ip.clone())
        .filter(|ip| !ip.is_empty())
}

impl FakeCloud {
    fn lb_args(cluster: &str, key: &str, nodes: Option<&[String]>) -> serde_json::Value {
        match nodes {
            Some(hosts) => json!({ "cluster": cluster, "service": key, "hosts": hosts }),
            None => json!({ "cluster": cluster, "service": key }),
        }
    }

    fn elsewhere(s: &Settings, key: &str) -> Result<()> {
        if s.elsewhere.contains(key) {
            Err(ProviderError::implemented_elsewhere())
        } else {
            Ok(())
        }
    }
}

impl LoadBalancer for FakeCloud {
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>> {
        let key = service_key(service);
        let args = Self::lb_args(cluster_name, &key, None);
        self.begin("GetLoadBalancer", "get-load-balancer", args, ctx)?;
        // For implementedElsewhere services this reports only what this cloud created itself.
        let state = crate::cloud::lock(&self.inner.state);
        Ok(state.lbs.get(&key).map(LoadBalancerRecord::status))
    }

    fn get_load_balancer_name(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<String> {
        let args = Self::lb_args(cluster_name, &service_key(service), None);
        self.begin("GetLoadBalancerName", "get-load-balancer-name", args, ctx)?;
        Ok(default_load_balancer_name(service))
    }

    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<Option<LoadBalancerStatus>> {
        let key = service_key(service);
        let hosts = host_names(nodes);
        let args = Self::lb_args(cluster_name, &key, Some(&hosts));
        let s = self.begin("EnsureLoadBalancer", "create", args, ctx)?;
        Self::elsewhere(&s, &key)?;
        let c = &s.config;
        let record = self.mutate(|state| {
            let ip = match (&c.external_ip, requested_ip(service)) {
                (Some(ip), _) => ip.clone(),
                (None, Some(ip)) => ip,
                (None, None) => match state.pool.get_or_alloc(&key, c.ip_pool) {
                    Ok(ip) => ip.to_string(),
                    Err(e) => return (Err(e), false),
                },
            };
            let record = LoadBalancerRecord {
                name: default_load_balancer_name(service),
                cluster: cluster_name.to_string(),
                namespace: service
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
                service: service.metadata.name.clone().unwrap_or_default(),
                uid: service.metadata.uid.clone().unwrap_or_default(),
                ports: ports(service),
                hosts,
                load_balancer_ip: ip,
                ip_mode: c.ip_mode.clone(),
            };
            let changed = state.lbs.get(&key) != Some(&record);
            if changed {
                state.lbs.insert(key.clone(), record.clone());
            }
            (Ok(record), changed)
        })?;
        if c.ensure_returns_nil {
            return Ok(None);
        }
        Ok(Some(record.status()))
    }

    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()> {
        let key = service_key(service);
        let hosts = host_names(nodes);
        let args = Self::lb_args(cluster_name, &key, Some(&hosts));
        let s = self.begin("UpdateLoadBalancer", "update", args, ctx)?;
        Self::elsewhere(&s, &key)?;
        self.mutate(|state| match state.lbs.get_mut(&key) {
            None => (
                Err(ProviderError::not_found(format!(
                    "load balancer for service {key} does not exist"
                ))),
                false,
            ),
            Some(lb) if lb.hosts == hosts => (Ok(()), false),
            Some(lb) => {
                lb.hosts = hosts;
                (Ok(()), true)
            }
        })
    }

    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<()> {
        let key = service_key(service);
        let args = Self::lb_args(cluster_name, &key, None);
        self.begin("EnsureLoadBalancerDeleted", "delete", args, ctx)?;
        // Never ImplementedElsewhere here (upstream contract): delete what exists, if anything.
        self.mutate(|state| {
            let removed = state.lbs.remove(&key).is_some();
            state.pool.release(&key);
            ((), removed)
        });
        Ok(())
    }
}
