//! Route checks: a direct CreateRoute / ListRoutes / DeleteRoute round trip, then the real
//! route controller creating the nodes' routes and deleting them with the nodes.

use std::time::{Duration, Instant};

use ccm_provider_abi::Route;
use k8s_openapi::api::core::v1::Node;
use kube::api::DeleteParams;
use kube::Api;

use super::report::Outcome;
use super::{err_text, step, Suite};
use ccm_host::controllers::route;
use ccm_host::runtime::well_known::NETWORK_UNAVAILABLE_CONDITION;

/// How often the provider's routes are listed while waiting for the controller.
const POLL: Duration = Duration::from_millis(200);

fn describe(routes: &[&Route]) -> String {
    routes
        .iter()
        .map(|r| format!("{} -> {}", r.destination_cidr, r.target_node))
        .collect::<Vec<_>>()
        .join(", ")
}

fn network_available(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == NETWORK_UNAVAILABLE_CONDITION))
        .is_some_and(|c| c.status == "False")
}

impl Suite {
    fn no_routes(&self) -> Option<String> {
        (!self.caps.routes).then(|| "skipped (no Routes)".to_string())
    }

    pub(super) async fn route_checks(&mut self) {
        step!(
            self,
            "routes-round-trip",
            self.no_routes(),
            self.routes_round_trip().await
        );
        step!(
            self,
            "route-controller",
            self.no_routes(),
            self.route_controller().await
        );
    }

    async fn list_routes(&self) -> Result<Vec<Route>, String> {
        self.direct(
            "ListRoutes",
            &self.plan.cluster_name,
            self.provider.list_routes(&self.plan.cluster_name),
        )
        .await
        .map_err(|e| format!("ListRoutes: {}", err_text(&e)))
    }

    async fn routes_round_trip(&self) -> Outcome {
        let cluster = &self.plan.cluster_name;
        let cidr = self.plan.spare_cidr.clone();
        let Some(target) = self.current_nodes().into_iter().next() else {
            return Outcome::skip("skipped (no node left to route to)");
        };
        let target_name = target.metadata.name.clone().unwrap_or_default();
        let matching = |routes: &[Route]| -> Vec<Route> {
            routes
                .iter()
                .filter(|r| r.destination_cidr == cidr)
                .cloned()
                .collect()
        };
        let before = match self.list_routes().await {
            Ok(r) => r,
            Err(e) => return Outcome::fail(e),
        };
        let mut problems = Vec::new();
        // Left over from an interrupted run: remove it first (part of the round trip too).
        for stale in matching(&before) {
            if let Err(e) = self
                .direct(
                    "DeleteRoute",
                    &stale.destination_cidr,
                    self.provider.delete_route(cluster, &stale),
                )
                .await
            {
                return Outcome::fail(format!(
                    "a route for {cidr} already exists and DeleteRoute failed: {}",
                    err_text(&e)
                ));
            }
        }
        let route = Route {
            target_node: target_name.clone(),
            target_node_addresses: target
                .status
                .as_ref()
                .and_then(|s| s.addresses.clone())
                .unwrap_or_default(),
            destination_cidr: cidr.clone(),
            ..Route::default()
        };
        let hint = target.metadata.uid.clone().unwrap_or_default();
        if let Err(e) = self
            .direct(
                "CreateRoute",
                &cidr,
                self.provider.create_route(cluster, &hint, &route),
            )
            .await
        {
            return Outcome::fail(format!(
                "CreateRoute({cidr} -> {target_name}): {}",
                err_text(&e)
            ));
        }
        let listed = match self.list_routes().await {
            Ok(r) => matching(&r),
            Err(e) => return Outcome::fail(format!("after CreateRoute: {e}")),
        };
        let created = match listed.as_slice() {
            [] => {
                return Outcome::fail(format!(
                    "ListRoutes does not show the route {cidr} -> {target_name} CreateRoute just created"
                ))
            }
            [one] => one.clone(),
            many => {
                problems.push(format!(
                    "ListRoutes shows {} routes for {cidr} after one CreateRoute: {}",
                    many.len(),
                    describe(&many.iter().collect::<Vec<_>>())
                ));
                many[0].clone()
            }
        };
        if created.target_node != target_name {
            problems.push(format!(
                "the listed route for {cidr} targets {:?}, CreateRoute asked for {target_name:?}",
                created.target_node
            ));
        }
        if created.blackhole {
            problems.push(format!(
                "the new route for {cidr} is listed as a blackhole although its node exists"
            ));
        }
        for r in &listed {
            if let Err(e) = self
                .direct(
                    "DeleteRoute",
                    &r.destination_cidr,
                    self.provider.delete_route(cluster, r),
                )
                .await
            {
                problems.push(format!("DeleteRoute({cidr}): {}", err_text(&e)));
            }
        }
        match self.list_routes().await {
            Err(e) => problems.push(format!("after DeleteRoute: {e}")),
            Ok(r) if !matching(&r).is_empty() => problems.push(format!(
                "ListRoutes still shows the route for {cidr} after DeleteRoute"
            )),
            Ok(_) => {}
        }
        Outcome::from_problems(
            problems,
            format!(
                "created, listed (name {:?}) and deleted {cidr} -> {target_name}",
                created.name
            ),
        )
    }

    /// The real route controller: routes for every check node's pod CIDR and the
    /// NetworkUnavailable condition cleared; then the nodes are deleted and so are their routes.
    async fn route_controller(&mut self) -> Outcome {
        let cidrs = match route::parse_cluster_cidrs(&self.plan.cluster_cidr.to_string()) {
            Ok(c) => c,
            Err(e) => return Outcome::fail(e),
        };
        let nodes = self.current_nodes();
        if nodes.is_empty() {
            return Outcome::skip("skipped (no node left to route to)");
        }
        let wanted: Vec<(String, String)> = self
            .plan
            .nodes
            .iter()
            .filter(|s| {
                nodes
                    .iter()
                    .any(|n| n.metadata.name.as_ref() == Some(&s.name))
            })
            .filter_map(|s| Some((s.name.clone(), s.pod_cidr.clone()?)))
            .collect();
        self.start_controller(route::NAME, move |ctx| route::run(ctx, cidrs));
        let deadline = Instant::now() + self.plan.sync_timeout;
        let (mut missing, mut last_error) = (wanted.clone(), None);
        let mut created = false;
        while Instant::now() < deadline {
            if self.controller_call_hung() || self.stalled() {
                break;
            }
            match self.list_routes().await {
                Err(e) => last_error = Some(e),
                Ok(routes) => {
                    missing = wanted
                        .iter()
                        .filter(|(node, cidr)| {
                            let routed = routes
                                .iter()
                                .any(|r| &r.target_node == node && &r.destination_cidr == cidr);
                            let available = self
                                .stored_node(node)
                                .is_some_and(|n| network_available(&n));
                            !(routed && available)
                        })
                        .cloned()
                        .collect();
                    if missing.is_empty() {
                        created = true;
                        break;
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
        if !created {
            let mut reasons: Vec<String> = missing
                .iter()
                .map(|(node, cidr)| {
                    format!("no route {cidr} -> {node} (or NetworkUnavailable not cleared)")
                })
                .collect();
            reasons.extend(last_error);
            for (node, _) in &missing {
                reasons.extend(self.warnings_about(node));
            }
            return Outcome::fail(format!(
                "{} did not converge within {}: {}",
                route::NAME,
                ccm_host::runtime::duration::format(self.plan.sync_timeout),
                reasons.join("; ")
            ));
        }
        // Delete the nodes: the controller must delete their routes.
        let api: Api<Node> = Api::all(self.client.clone());
        for (node, _) in &wanted {
            if let Err(e) = api.delete(node, &DeleteParams::default()).await {
                return Outcome::fail(format!("could not delete node {node}: {e}"));
            }
        }
        let deadline = Instant::now() + self.plan.sync_timeout;
        let mut left = Vec::new();
        let mut deleted = false;
        while Instant::now() < deadline {
            if self.controller_call_hung() || self.stalled() {
                break;
            }
            if let Ok(routes) = self.list_routes().await {
                left = routes
                    .into_iter()
                    .filter(|r| {
                        wanted
                            .iter()
                            .any(|(n, c)| &r.target_node == n && &r.destination_cidr == c)
                    })
                    .collect();
                if left.is_empty() {
                    deleted = true;
                    break;
                }
            }
            tokio::time::sleep(POLL).await;
        }
        if !deleted {
            return Outcome::fail(format!(
                "routes of deleted nodes were not deleted within {}: {}",
                ccm_host::runtime::duration::format(self.plan.sync_timeout),
                describe(&left.iter().collect::<Vec<_>>())
            ));
        }
        Outcome::pass(format!(
            "{} created {} and deleted them with their nodes",
            route::NAME,
            super::nodes::count(wanted.len(), "route")
        ))
    }
}
