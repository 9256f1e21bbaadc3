//! Load-balancer checks: direct calls for the contract points (valid status, idempotent
//! Ensure, host-set updates, deletion of present and missing load balancers), then the real
//! service controller provisioning and cleaning up a Service.

use std::collections::BTreeSet;

use ccm_provider_abi::ext::ExtCapabilities;
use ccm_provider_abi::{ErrorKind, ProviderError};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::api::{DeleteParams, PostParams};
use kube::Api;

use super::report::Outcome;
use super::scene::{self, NAMESPACE};
use super::validate::{self, describe_status};
use super::{err_text, step, Suite};
use ccm_host::controllers::service::{self, predicates::load_balancer_status_equal};
use ccm_host::runtime::well_known::LB_CLEANUP_FINALIZER;

/// Name of the Service the service controller provisions.
pub const CONTROLLER_SERVICE: &str = "ccm-check-svc";

/// Name of the second Service handed to the provider directly (lb-distinct).
pub const SECOND_SERVICE: &str = "ccm-check-second";

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
        step!(self, "lb-hosts", self.no_lb_status(), self.lb_hosts().await);
        step!(
            self,
            "lb-distinct",
            self.no_lb_status(),
            self.lb_distinct().await
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
        let none: Vec<Node> = Vec::new();
        let svc = &self.direct_service;
        let mut problems = Vec::new();
        // An empty host set is part of the contract: the service controller updates a load
        // balancer to no hosts when no node is eligible (upstream does the same).
        for hosts in [&first, &all, &none, &all] {
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
                "hosts [{}] -> [{}] -> [] -> [{}], status unchanged",
                names(&first),
                names(&all),
                names(&all)
            ),
        )
    }

    /// The provider's read-back of the hosts the Service's load balancer targets (ABI 1.1),
    /// sorted; `Err` is the reason as text, `Ok(None)` "no load balancer".
    async fn read_hosts(&self, svc: &Service) -> Result<Option<Vec<String>>, ProviderError> {
        self.direct(
            "LoadBalancerHosts",
            &service_name(svc),
            self.provider
                .load_balancer_hosts(&self.plan.cluster_name, svc),
        )
        .await
        .map(|hosts| {
            hosts.map(|mut h| {
                h.sort();
                h.dedup();
                h
            })
        })
    }

    /// The host set handed to EnsureLoadBalancer and UpdateLoadBalancer is the one the load
    /// balancer targets, as the provider's read-back (ABI 1.1 `load_balancer_hosts`) shows.
    async fn lb_hosts(&self) -> Outcome {
        let svc = &self.direct_service;
        let all = self.current_nodes();
        let first: Vec<Node> = all.iter().take(1).cloned().collect();
        let none: Vec<Node> = Vec::new();
        let sorted = |nodes: &[Node]| {
            let mut v: Vec<String> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            v.sort();
            v
        };
        // The provider offers the read-back at all?
        match self.read_hosts(svc).await {
            Err(e) if e.kind() == ErrorKind::NOT_IMPLEMENTED => {
                return Outcome::skip_hiding_contract(format!(
                    "skipped (no host read-back: the provider does not implement LoadBalancer::load_balancer_hosts, ABI 1.1, so whether it honours the host set cannot be seen{})",
                    if self.provider.abi_generation() == "1.0" {
                        "; its plugin was built against ccm-provider-abi 1.0"
                    } else {
                        ""
                    }
                ))
            }
            Err(e) => return Outcome::fail(format!("LoadBalancerHosts: {}", err_text(&e))),
            Ok(_) => {}
        }
        let mut problems = Vec::new();
        let cluster = &self.plan.cluster_name;
        for (step, hosts) in [(0, &all), (1, &first), (1, &none), (1, &all)] {
            let method = if step == 0 {
                "EnsureLoadBalancer"
            } else {
                "UpdateLoadBalancer"
            };
            let done = if step == 0 {
                self.ensure_lb(svc, hosts).await.map(|_| ())
            } else {
                self.direct(
                    method,
                    &service_name(svc),
                    self.provider.update_load_balancer(cluster, svc, hosts),
                )
                .await
                .map_err(|e| format!("{method}: {}", err_text(&e)))
            };
            if let Err(e) = done {
                problems.push(format!("with hosts [{}]: {e}", names(hosts)));
                break;
            }
            let want = sorted(hosts);
            match self.read_hosts(svc).await {
                Err(e) => {
                    problems.push(format!(
                        "LoadBalancerHosts after {method} with hosts [{}]: {}",
                        names(hosts),
                        err_text(&e)
                    ));
                    break;
                }
                Ok(None) => {
                    problems.push(format!(
                        "after {method} with hosts [{}] the provider reads back no load balancer",
                        names(hosts)
                    ));
                    break;
                }
                Ok(Some(got)) if got != want => problems.push(format!(
                    "after {method} with hosts [{}] the load balancer targets [{}]{}",
                    want.join(","),
                    got.join(","),
                    if step == 0 {
                        ""
                    } else {
                        " (UpdateLoadBalancer must make the backends exactly the hosts it is given)"
                    }
                )),
                Ok(Some(_)) => {}
            }
        }
        Outcome::from_problems(
            problems,
            format!(
                "the load balancer targets exactly the hosts given: [{}], then [{}], [], [{}]",
                names(&all),
                names(&first),
                names(&all)
            ),
        )
    }

    async fn lb_name(&self, svc: &Service) -> Result<String, ProviderError> {
        self.direct(
            "GetLoadBalancerName",
            &service_name(svc),
            self.provider
                .get_load_balancer_name(&self.plan.cluster_name, svc),
        )
        .await
    }

    /// A second Service gets a load balancer of its own: another name and (unless the provider
    /// declares shared addresses) another address, and the first one is left as it was.
    async fn lb_distinct(&mut self) -> Outcome {
        let cluster = self.plan.cluster_name.clone();
        let first = self.direct_service.clone();
        let second = self.plan.service(
            SECOND_SERVICE,
            Some(&scene::uid(&self.plan.nonce, "second")),
        );
        self.second_service = Some(second.clone());
        let nodes = self.current_nodes();
        let before = match self.get_lb(&first).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return Outcome::fail(
                    "GetLoadBalancer reports no load balancer for the first Service",
                )
            }
            Err(e) => return Outcome::fail(e),
        };
        let status = match self.ensure_lb(&second, &nodes).await {
            Ok(s) => s,
            Err(e) => return Outcome::fail(format!("for a second Service: {e}")),
        };
        let mut problems = validate::load_balancer_status(&status);
        let shared = self
            .provider
            .ext_capabilities()
            .contains(ExtCapabilities::LB_SHARED_ADDRESSES);
        let addresses = |s: &LoadBalancerStatus| -> BTreeSet<String> {
            s.ingress
                .iter()
                .flatten()
                .flat_map(|i| i.ip.iter().chain(i.hostname.iter()).cloned())
                .collect()
        };
        let common: Vec<String> = addresses(&before)
            .intersection(&addresses(&status))
            .cloned()
            .collect();
        if !common.is_empty() && !shared {
            problems.push(format!(
                "Services {} and {} both got {}: two Services must not share a load-balancer address (if yours share addresses by design, e.g. one IP told apart by port, return true from LoadBalancer::shares_addresses)",
                service_name(&first),
                service_name(&second),
                common.join(", ")
            ));
        }
        match (self.lb_name(&first).await, self.lb_name(&second).await) {
            (Ok(a), Ok(b)) if a == b => problems.push(format!(
                "GetLoadBalancerName gives both Services the name {a:?}: one load balancer would take over the other"
            )),
            (Ok(_), Ok(_)) => {}
            (Err(e), _) | (_, Err(e)) => {
                problems.push(format!("GetLoadBalancerName: {}", err_text(&e)))
            }
        }
        match self.get_lb(&first).await {
            Err(e) => problems.push(e),
            Ok(now) if !load_balancer_status_equal(now.as_ref(), Some(&before)) => {
                problems.push(format!(
                    "EnsureLoadBalancer for a second Service changed the first Service's load balancer from {} to {}",
                    describe_status(Some(&before)),
                    describe_status(now.as_ref())
                ))
            }
            Ok(_) => {}
        }
        if let Err(e) = self
            .direct(
                "EnsureLoadBalancerDeleted",
                &service_name(&second),
                self.provider
                    .ensure_load_balancer_deleted(&cluster, &second),
            )
            .await
        {
            problems.push(format!(
                "EnsureLoadBalancerDeleted for the second Service: {}",
                err_text(&e)
            ));
        } else if let Ok(None) = self.get_lb(&first).await {
            problems.push(
                "deleting the second Service's load balancer deleted the first one too".to_string(),
            );
        }
        Outcome::from_problems(
            problems,
            format!(
                "{} {} and {} {}{}",
                service_name(&first),
                describe_status(Some(&before)),
                service_name(&second),
                describe_status(Some(&status)),
                if shared && !common.is_empty() {
                    " (shared addresses, as the provider declares)"
                } else {
                    ""
                }
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
        let never = self.plan.service(
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
                &self.plan.service(CONTROLLER_SERVICE, None),
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
                ccm_host::runtime::duration::format(self.plan.sync_timeout),
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
                ccm_host::runtime::duration::format(self.plan.sync_timeout),
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
