//! Load-balancer checks: direct calls for the contract points (valid status, idempotent
//! Ensure, host-set updates, deletion of present and missing load balancers), then the real
//! service controller provisioning and cleaning up a Service.

use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::api::{DeleteParams, PostParams};
use kube::Api;

use super::report::Outcome;
use super::scene::{self, NAMESPACE};
use super::validate::{self, describe_status};
use super::{err_text, step, Suite};
use crate::controllers::service::{self, predicates::load_balancer_status_equal};
use crate::well_known::LB_CLEANUP_FINALIZER;

/// Name of the Service the service controller provisions.
pub const CONTROLLER_SERVICE: &str = "ccm-check-svc";

/// `namespace/name` of a Service, for the report.
pub(super) fn service_name(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or(NAMESPACE),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn names(nodes: &[Node]) -> String {
    nodes
        .iter()
        .map(|n| n.metadata.name.clone().unwrap_or_default())
        .collect::<Vec<_>>()
        .join(",")
}

impl Suite {
    fn no_lb(&self) -> Option<String> {
        (!self.caps.load_balancer).then(|| "skipped (no LoadBalancer)".to_string())
    }

    fn no_lb_status(&self) -> Option<String> {
        self.no_lb().or_else(|| {
            self.lb_status
                .is_none()
                .then(|| "skipped (lb-ensure did not create a load balancer)".to_string())
        })
    }

    pub(super) async fn lb_checks(&mut self) {
        step!(self, "lb-ensure", self.no_lb(), self.lb_ensure().await);
        step!(
            self,
            "lb-idempotent",
            self.no_lb_status(),
            self.lb_idempotent().await
        );
        step!(
            self,
            "lb-update-hosts",
            self.no_lb_status(),
            self.lb_update_hosts().await
        );
        step!(self, "lb-delete", self.no_lb(), self.lb_delete().await);
        step!(
            self,
            "service-controller",
            self.no_lb(),
            self.service_controller().await
        );
    }

    /// GetLoadBalancer of `svc`, as a reason on error.
    pub(super) async fn get_lb(&self, svc: &Service) -> Result<Option<LoadBalancerStatus>, String> {
        self.direct(
            "GetLoadBalancer",
            &service_name(svc),
            self.provider
                .get_load_balancer(&self.plan.cluster_name, svc),
        )
        .await
        .map_err(|e| format!("GetLoadBalancer: {}", err_text(&e)))
    }

    pub(super) async fn ensure_lb(
        &self,
        svc: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, String> {
        match self
            .direct(
                "EnsureLoadBalancer",
                &service_name(svc),
                self.provider
                    .ensure_load_balancer(&self.plan.cluster_name, svc, nodes),
            )
            .await
        {
            Ok(Some(status)) => Ok(status),
            Ok(None) => Err(
                "EnsureLoadBalancer returned no status (upstream's nil status, which the service controller reports as an error)"
                    .to_string(),
            ),
            Err(e) => Err(format!("EnsureLoadBalancer: {}", err_text(&e))),
        }
    }

    async fn lb_ensure(&mut self) -> Outcome {
        let nodes = self.current_nodes();
        let svc = self.direct_service.clone();
        let status = match self.ensure_lb(&svc, &nodes).await {
            Ok(s) => s,
            Err(e) => return Outcome::fail(e),
        };
        let mut problems = validate::load_balancer_status(&status);
        match self.get_lb(&svc).await {
            Err(e) => problems.push(e),
            Ok(None) => problems.push(
                "GetLoadBalancer says the load balancer EnsureLoadBalancer just created does not exist"
                    .to_string(),
            ),
            Ok(Some(got)) if !load_balancer_status_equal(Some(&got), Some(&status)) => {
                problems.push(format!(
                    "GetLoadBalancer reports {} but EnsureLoadBalancer returned {}",
                    describe_status(Some(&got)),
                    describe_status(Some(&status))
                ))
            }
            Ok(Some(_)) => {}
        }
        let detail = format!(
            "status {} for {}",
            describe_status(Some(&status)),
            super::nodes::count(nodes.len(), "host")
        );
        self.lb_status = Some(status);
        Outcome::from_problems(problems, detail)
    }

    async fn lb_idempotent(&self) -> Outcome {
        let Some(first) = self.lb_status.clone() else {
            return Outcome::skip("skipped (no first status)");
        };
        let nodes = self.current_nodes();
        let svc = &self.direct_service;
        let mut problems = Vec::new();
        match self.ensure_lb(svc, &nodes).await {
            Err(e) => problems.push(format!("second call: {e}")),
            Ok(second) => {
                if !load_balancer_status_equal(Some(&first), Some(&second)) {
                    problems.push(format!(
                        "the second EnsureLoadBalancer with the same Service and nodes returned {} after {}: not idempotent (it must update the existing load balancer, not create another)",
                        describe_status(Some(&second)),
                        describe_status(Some(&first))
                    ));
                }
                match self.get_lb(svc).await {
                    Err(e) => problems.push(e),
                    Ok(got) if !load_balancer_status_equal(got.as_ref(), Some(&second)) => {
                        problems.push(format!(
                            "after two EnsureLoadBalancer calls GetLoadBalancer reports {}, the last call returned {}",
                            describe_status(got.as_ref()),
                            describe_status(Some(&second))
                        ))
                    }
                    Ok(_) => {}
                }
            }
        }
        let cluster = &self.plan.cluster_name;
        let name1 = self
            .direct(
                "GetLoadBalancerName",
                &service_name(svc),
                self.provider.get_load_balancer_name(cluster, svc),
            )
            .await;
        let name2 = self
            .direct(
                "GetLoadBalancerName",
                &service_name(svc),
                self.provider.get_load_balancer_name(cluster, svc),
            )
            .await;
        match (name1, name2) {
            (Ok(a), Ok(_)) if a.is_empty() => {
                problems.push("GetLoadBalancerName returned an empty name".to_string())
            }
            (Ok(a), Ok(b)) if a != b => problems.push(format!(
                "GetLoadBalancerName returned {a:?}, then {b:?} for the same Service"
            )),
            (Ok(_), Ok(_)) => {}
            (Err(e), _) | (_, Err(e)) => {
                problems.push(format!("GetLoadBalancerName: {}", err_text(&e)))
            }
        }
        Outcome::from_problems(
            problems,
            format!(
                "same status {} twice, GetLoadBalancer agrees",
                describe_status(Some(&first))
            ),
        )
    }

    async fn lb_update_hosts(&self) -> Outcome {
        // Compared with what GetLoadBalancer says now (not with lb-ensure's status, which a
        // non-idempotent second EnsureLoadBalancer may already have changed).
        let status = match self.get_lb(&self.direct_service).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Outcome::fail("GetLoadBalancer reports no load balancer before the updates")
            }
            Err(e) => return Outcome::fail(e),
        };
        let all = self.current_nodes();
        let first: Vec<Node> = all.iter().take(1).cloned().collect();
        let svc = &self.direct_service;
        let mut problems = Vec::new();
        for hosts in [&first, &all, &first, &all] {
            if let Err(e) = self
                .direct(
                    "UpdateLoadBalancer",
                    &service_name(svc),
                    self.provider
                        .update_load_balancer(&self.plan.cluster_name, svc, hosts),
                )
                .await
            {
                problems.push(format!(
                    "UpdateLoadBalancer with hosts [{}]: {}",
                    names(hosts),
                    err_text(&e)
                ));
            }
        }
        match self.get_lb(svc).await {
            Err(e) => problems.push(e),
            Ok(None) => problems.push(
                "the load balancer is gone after UpdateLoadBalancer (it must only change the hosts)"
                    .to_string(),
            ),
            Ok(Some(now)) if !load_balancer_status_equal(Some(&now), Some(&status)) => {
                problems.push(format!(
                    "UpdateLoadBalancer changed the status from {} to {} (it must only change the hosts)",
                    describe_status(Some(&status)),
                    describe_status(Some(&now))
                ))
            }
            Ok(Some(_)) => {}
        }
        Outcome::from_problems(
            problems,
            format!(
                "hosts [{}] -> [{}] -> [{}] -> [{}], status unchanged",
                names(&first),
                names(&all),
                names(&first),
                names(&all)
            ),
        )
    }

    async fn lb_delete(&self) -> Outcome {
        let cluster = &self.plan.cluster_name;
        let svc = &self.direct_service;
        let mut problems = Vec::new();
        let existed = self.lb_status.is_some();
        let delete = |svc: Service| async move {
            self.direct(
                "EnsureLoadBalancerDeleted",
                &service_name(&svc),
                self.provider.ensure_load_balancer_deleted(cluster, &svc),
            )
            .await
        };
        if let Err(e) = delete(svc.clone()).await {
            problems.push(format!("EnsureLoadBalancerDeleted: {}", err_text(&e)));
        }
        match self.get_lb(svc).await {
            Err(e) => problems.push(e),
            Ok(Some(s)) => problems.push(format!(
                "GetLoadBalancer still reports {} after EnsureLoadBalancerDeleted",
                describe_status(Some(&s))
            )),
            Ok(None) => {}
        }
        if let Err(e) = delete(svc.clone()).await {
            problems.push(format!(
                "EnsureLoadBalancerDeleted on an already deleted load balancer: {} (it must return Ok)",
                err_text(&e)
            ));
        }
        let never = scene::service(
            "ccm-check-never-created",
            Some(&scene::uid(&self.plan.nonce, "never")),
        );
        if let Err(e) = delete(never).await {
            problems.push(format!(
                "EnsureLoadBalancerDeleted for a Service that never had a load balancer: {} (it must return Ok)",
                err_text(&e)
            ));
        }
        let detail = if existed {
            "deleted; deleting it again and deleting a never-created one return Ok"
        } else {
            "deleting missing load balancers returns Ok (none was created)"
        };
        Outcome::from_problems(problems, detail)
    }

    /// The real service controller: provision a LoadBalancer Service, then clean it up when
    /// the Service is deleted (the finalizer goes only after EnsureLoadBalancerDeleted).
    async fn service_controller(&mut self) -> Outcome {
        let api: Api<Service> = Api::namespaced(self.client.clone(), NAMESPACE);
        match api
            .create(
                &PostParams::default(),
                &scene::service(CONTROLLER_SERVICE, None),
            )
            .await
        {
            // Kept for the cleanup: providers may name load balancers after the UID.
            Ok(created) => self.controller_service = Some(created),
            Err(e) => {
                return Outcome::fail(format!(
                    "could not create Service {CONTROLLER_SERVICE}: {e}"
                ))
            }
        }
        self.start_controller(service::NAME, service::run);
        let provisioned = self
            .wait_for(|| {
                let svc: Option<Service> = self
                    .stored("services", NAMESPACE, CONTROLLER_SERVICE)
                    .and_then(|v| serde_json::from_value(v).ok());
                let done = svc.filter(|s| {
                    let has_finalizer = s
                        .metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.iter().any(|f| f == LB_CLEANUP_FINALIZER));
                    let has_ingress = s
                        .status
                        .as_ref()
                        .and_then(|st| st.load_balancer.as_ref())
                        .and_then(|lb| lb.ingress.as_ref())
                        .is_some_and(|i| !i.is_empty());
                    has_finalizer && has_ingress
                });
                async move { done }
            })
            .await;
        let Some(svc) = provisioned else {
            let warnings = self.warnings_about(CONTROLLER_SERVICE);
            return Outcome::fail(format!(
                "Service {NAMESPACE}/{CONTROLLER_SERVICE} got no load-balancer address within {}{}",
                crate::duration::format(self.plan.sync_timeout),
                if warnings.is_empty() {
                    String::new()
                } else {
                    format!(": {}", warnings.join("; "))
                }
            ));
        };
        let mut problems = Vec::new();
        let published = svc.status.as_ref().and_then(|s| s.load_balancer.clone());
        match self.get_lb(&svc).await {
            Err(e) => problems.push(e),
            Ok(got) if !load_balancer_status_equal(got.as_ref(), published.as_ref()) => problems
                .push(format!(
                    "the Service shows {} but GetLoadBalancer reports {}",
                    describe_status(published.as_ref()),
                    describe_status(got.as_ref())
                )),
            Ok(_) => {}
        }
        if let Err(e) = api
            .delete(CONTROLLER_SERVICE, &DeleteParams::default())
            .await
        {
            problems.push(format!(
                "could not delete Service {CONTROLLER_SERVICE}: {e}"
            ));
            return Outcome::fail(problems.join("; "));
        }
        let gone = self
            .wait_for(|| {
                let gone = self
                    .stored("services", NAMESPACE, CONTROLLER_SERVICE)
                    .is_none();
                async move { gone.then_some(()) }
            })
            .await;
        if gone.is_none() {
            let warnings = self.warnings_about(CONTROLLER_SERVICE);
            problems.push(format!(
                "the deleted Service kept its finalizer for {} (the load balancer was not deleted){}",
                crate::duration::format(self.plan.sync_timeout),
                if warnings.is_empty() {
                    String::new()
                } else {
                    format!(": {}", warnings.join("; "))
                }
            ));
        } else {
            match self.get_lb(&svc).await {
                Err(e) => problems.push(e),
                Ok(Some(s)) => problems.push(format!(
                    "GetLoadBalancer still reports {} after the controller cleaned up",
                    describe_status(Some(&s))
                )),
                Ok(None) => {}
            }
        }
        Outcome::from_problems(
            problems,
            format!(
                "{} published {} and removed the load balancer with the Service",
                service::NAME,
                describe_status(published.as_ref())
            ),
        )
    }
}
