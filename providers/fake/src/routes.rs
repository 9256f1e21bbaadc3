//! Routes, per cluster name, keyed by (target node, destination CIDR).

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde_json::json;

use crate::cloud::{lock, FakeCloud};
use crate::config::AddressConfig;
use crate::control::{route_name, RouteRecord};

impl RouteRecord {
    fn to_route(&self, with_addresses: bool) -> Route {
        Route {
            name: self.name.clone(),
            target_node: self.target_node.clone(),
            target_node_addresses: if with_addresses {
                self.target_node_addresses
                    .iter()
                    .map(|a| NodeAddress {
                        type_: a.type_.clone(),
                        address: a.address.clone(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            enable_node_addresses: with_addresses,
            destination_cidr: self.destination_cidr.clone(),
            blackhole: self.blackhole,
        }
    }
}

impl Routes for FakeCloud {
    fn list_routes(&self, ctx: &CallContext, cluster_name: &str) -> Result<Vec<Route>> {
        let args = json!({ "cluster": cluster_name });
        let s = self.begin("ListRoutes", "list-routes", args, ctx)?;
        let with_addresses = s.config.route_enable_node_addresses;
        let state = lock(&self.inner.state);
        let mut routes: Vec<Route> = state
            .routes
            .get(cluster_name)
            .map(|r| r.values().map(|r| r.to_route(with_addresses)).collect())
            .unwrap_or_default();
        routes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(routes)
    }

    fn create_route(
        &self,
        ctx: &CallContext,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<()> {
        let args = json!({
            "cluster": cluster_name,
            "nameHint": name_hint,
            "node": route.target_node,
            "cidr": route.destination_cidr,
        });
        self.begin("CreateRoute", "create-route", args, ctx)?;
        let record = RouteRecord {
            name: route_name(cluster_name, &route.target_node, &route.destination_cidr),
            cluster: cluster_name.to_string(),
            target_node: route.target_node.clone(),
            destination_cidr: route.destination_cidr.clone(),
            blackhole: false,
            target_node_addresses: route
                .target_node_addresses
                .iter()
                .map(|a| AddressConfig::new(&a.type_, &a.address))
                .collect(),
            name_hint: name_hint.to_string(),
        };
        self.mutate(|state| {
            let routes = state.routes.entry(cluster_name.to_string()).or_default();
            let key = record.key();
            if let Some(existing) = routes.get(&key) {
                let msg = format!(
                    "route {} for node {} and CIDR {} already exists",
                    existing.name, route.target_node, route.destination_cidr
                );
                return (Err(ProviderError::other(msg)), false);
            }
            routes.insert(key, record);
            (Ok(()), true)
        })
    }

    fn delete_route(&self, ctx: &CallContext, cluster_name: &str, route: &Route) -> Result<()> {
        let args = json!({
            "cluster": cluster_name,
            "node": route.target_node,
            "cidr": route.destination_cidr,
        });
        self.begin("DeleteRoute", "delete-route", args, ctx)?;
        let key = (route.target_node.clone(), route.destination_cidr.clone());
        self.mutate(|state| {
            let removed = state
                .routes
                .get_mut(cluster_name)
                .and_then(|r| r.remove(&key))
                .is_some();
            if removed {
                (Ok(()), true)
            } else {
                let msg = format!(
                    "no route for node {} and CIDR {} in cluster {cluster_name}",
                    route.target_node, route.destination_cidr
                );
                (Err(ProviderError::not_found(msg)), false)
            }
        })
    }
}
