//! Load balancers: one per service (`namespace/name`), with a stable address from `externalIP`,
//! the service's `spec.loadBalancerIP`, or the `ipPool`.

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde_json::json;

use crate::cloud::{FakeCloud, Settings};
use crate::control::{LoadBalancerRecord, PortRecord};

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

    fn load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<Vec<String>>> {
        let key = service_key(service);
        let args = Self::lb_args(cluster_name, &key, None);
        self.begin("LoadBalancerHosts", "get-load-balancer-hosts", args, ctx)?;
        let state = crate::cloud::lock(&self.inner.state);
        Ok(state.lbs.get(&key).map(|lb| lb.hosts.clone()))
    }

    fn shares_addresses(&self) -> bool {
        // `externalIP` gives every load balancer the same address.
        self.settings().config.external_ip.is_some()
    }

    fn incremental_hosts(&self) -> bool {
        self.capabilities().incremental_hosts
    }

    fn update_load_balancer_hosts(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        service: &Service,
        change: &HostChange,
    ) -> Result<()> {
        let key = service_key(service);
        let (added, removed) = (host_names(&change.added), host_names(&change.removed));
        let args = json!({
            "cluster": cluster_name,
            "service": key,
            "replace": change.replace,
            "added": added,
            "removed": removed,
        });
        let s = self.begin("UpdateLoadBalancerHosts", "update-hosts", args, ctx)?;
        Self::elsewhere(&s, &key)?;
        self.mutate(|state| match state.lbs.get_mut(&key) {
            None => (
                Err(ProviderError::not_found(format!(
                    "load balancer for service {key} does not exist"
                ))),
                false,
            ),
            Some(lb) if change.replace => {
                let changed = lb.hosts != added;
                lb.hosts = added;
                (Ok(()), changed)
            }
            // In place, in the sorted list: the cost of a change is the change's (an
            // incremental cloud API's), not a copy of every host of the load balancer.
            Some(lb) => {
                let mut changed = false;
                for r in &removed {
                    if let Ok(i) = lb.hosts.binary_search(r) {
                        lb.hosts.remove(i);
                        changed = true;
                    }
                }
                for a in added {
                    if let Err(i) = lb.hosts.binary_search(&a) {
                        lb.hosts.insert(i, a);
                        changed = true;
                    }
                }
                (Ok(()), changed)
            }
        })
    }
}
