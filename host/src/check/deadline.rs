//! Behaviour under the call deadline, and the panic summary.
//!
//! The host never waits past a call's deadline (it cancels the call and returns
//! `DeadlineExceeded`), so what a provider can get wrong is what the abandoned call leaves
//! behind: a lock still held, a broken connection, a half-written cache. The probe calls each
//! method once normally, once through a handle whose deadline has already passed (the plugin
//! sees an expired, cancelled context), and once normally again: the last answer must equal
//! the first. A cancelled EnsureLoadBalancer must not stop the next one from converging.

use std::fmt::Debug;
use std::time::Duration;

use ccm_provider_abi::ProviderError;
use k8s_openapi::api::core::v1::{Node, Service};

use super::report::Outcome;
use super::scene;
use super::validate::describe_status;
use super::{per_method, Suite};
use crate::controllers::service::predicates::load_balancer_status_equal;
use crate::provider::Provider;

/// The Service of the cancelled-EnsureLoadBalancer probe.
pub fn probe_service(nonce: &str) -> Service {
    scene::service("ccm-check-deadline", Some(&scene::uid(nonce, "deadline")))
}

/// One read call of the probe.
enum Probe {
    InstanceMetadata(Node),
    InstanceExists(Node),
    InstanceShutdown(Node),
    InstanceId(String),
    NodeAddressesByProviderId(String),
    InstanceExistsByProviderId(String),
    GetZoneByProviderId(String),
    GetLoadBalancer(Service),
    ListRoutes(String),
}

impl Probe {
    fn label(&self) -> String {
        let node = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match self {
            Self::InstanceMetadata(n) => format!("InstanceMetadata({})", node(n)),
            Self::InstanceExists(n) => format!("InstanceExists({})", node(n)),
            Self::InstanceShutdown(n) => format!("InstanceShutdown({})", node(n)),
            Self::InstanceId(n) => format!("InstanceID({n})"),
            Self::NodeAddressesByProviderId(id) => format!("NodeAddressesByProviderID({id})"),
            Self::InstanceExistsByProviderId(id) => format!("InstanceExistsByProviderID({id})"),
            Self::GetZoneByProviderId(id) => format!("GetZoneByProviderID({id})"),
            Self::GetLoadBalancer(s) => format!(
                "GetLoadBalancer({})",
                s.metadata.name.as_deref().unwrap_or_default()
            ),
            Self::ListRoutes(c) => format!("ListRoutes({c})"),
        }
    }
}

/// A comparable summary of a call's result: the value, or the error kind.
fn summary<T: Debug>(result: Result<T, ProviderError>) -> String {
    match result {
        Ok(v) => {
            let mut s = format!("{v:?}");
            if s.len() > 160 {
                let mut cut = 157;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                s.truncate(cut);
                s.push_str("...");
            }
            s
        }
        Err(e) => format!("{} error", e.kind().name()),
    }
}

impl Suite {
    /// A node to probe with: an initialised one (with its provider ID), else as seeded.
    fn probe_node(&self) -> Option<Node> {
        self.initialised.values().next().cloned().or_else(|| {
            self.plan
                .nodes
                .first()
                .map(|s| scene::typed_node(&scene::node(s, "Unknown", false)))
        })
    }

    fn probes(&self) -> Vec<Probe> {
        let mut probes = Vec::new();
        if let Some(node) = self.probe_node() {
            let name = node.metadata.name.clone().unwrap_or_default();
            let id = node
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default();
            if self.caps.instances_v2 {
                probes.push(Probe::InstanceMetadata(node.clone()));
                probes.push(Probe::InstanceExists(node.clone()));
                probes.push(Probe::InstanceShutdown(node));
            } else if self.caps.instances {
                probes.push(Probe::InstanceId(name));
                if !id.is_empty() {
                    probes.push(Probe::NodeAddressesByProviderId(id.clone()));
                    probes.push(Probe::InstanceExistsByProviderId(id.clone()));
                    if self.caps.zones {
                        probes.push(Probe::GetZoneByProviderId(id));
                    }
                }
            }
        }
        if self.caps.load_balancer {
            probes.push(Probe::GetLoadBalancer(self.direct_service.clone()));
        }
        if self.caps.routes {
            probes.push(Probe::ListRoutes(self.plan.cluster_name.clone()));
        }
        probes
    }

    async fn run_probe(&self, provider: &Provider, probe: &Probe) -> String {
        let cluster = &self.plan.cluster_name;
        match probe {
            Probe::InstanceMetadata(n) => summary(self.seen(provider.instance_metadata(n).await)),
            Probe::InstanceExists(n) => summary(self.seen(provider.instance_exists(n).await)),
            Probe::InstanceShutdown(n) => summary(self.seen(provider.instance_shutdown(n).await)),
            Probe::InstanceId(n) => summary(self.seen(provider.instance_id(n).await)),
            Probe::NodeAddressesByProviderId(id) => {
                summary(self.seen(provider.node_addresses_by_provider_id(id).await))
            }
            Probe::InstanceExistsByProviderId(id) => {
                summary(self.seen(provider.instance_exists_by_provider_id(id).await))
            }
            Probe::GetZoneByProviderId(id) => {
                summary(self.seen(provider.get_zone_by_provider_id(id).await))
            }
            Probe::GetLoadBalancer(s) => {
                summary(self.seen(provider.get_load_balancer(cluster, s).await))
            }
            Probe::ListRoutes(c) => summary(self.seen(provider.list_routes(c).await)),
        }
    }

    pub(super) async fn deadline(&mut self) -> Outcome {
        // Nothing else may call the provider meanwhile: the answers must be comparable.
        self.stop_controllers().await;
        let mut problems = Vec::new();
        let hit = self.counter_by_method("ccm_provider_call_timeouts_total");
        if !hit.is_empty() {
            problems.push(format!(
                "{} calls ran into the {} call deadline during the suite: {} (a provider should answer well within it; a slow test cloud may need --provider-call-timeout)",
                hit.values().sum::<u64>(),
                crate::duration::format(self.plan.call_timeout),
                per_method(&hit)
            ));
        }
        let expired = self.provider.with_call_timeout(Duration::ZERO);
        let probes = self.probes();
        for probe in &probes {
            let before = self.run_probe(&self.provider, probe).await;
            let _cancelled = self.run_probe(&expired, probe).await;
            let after = self.run_probe(&self.provider, probe).await;
            if after != before {
                problems.push(format!(
                    "{}: {before} before, {after} after the same call was cancelled by its deadline (the cancelled call left the provider in another state)",
                    probe.label()
                ));
            }
        }
        let mut detail = format!(
            "{} answer the same after a cancelled twin",
            super::nodes::count(probes.len(), "call")
        );
        if self.caps.load_balancer {
            detail.push_str(", EnsureLoadBalancer converges after a cancelled one");
            problems.extend(self.cancelled_ensure(&expired).await);
        }
        Outcome::from_problems(problems, detail)
    }

    /// A cancelled EnsureLoadBalancer, then a normal one: it must converge to one load
    /// balancer that GetLoadBalancer reports, and deletion must clean up.
    async fn cancelled_ensure(&self, expired: &Provider) -> Vec<String> {
        let cluster = &self.plan.cluster_name;
        let svc = probe_service(&self.plan.nonce);
        let nodes: Vec<Node> = self.initialised.values().cloned().collect();
        let mut problems = Vec::new();
        let _ = self.seen(expired.ensure_load_balancer(cluster, &svc, &nodes).await);
        match self.ensure_lb(&svc, &nodes).await {
            Err(e) => problems.push(format!(
                "after an EnsureLoadBalancer cancelled by its deadline: {e}"
            )),
            Ok(status) => match self.get_lb(&svc).await {
                Err(e) => problems.push(e),
                Ok(got) if !load_balancer_status_equal(got.as_ref(), Some(&status)) => {
                    problems.push(format!(
                        "after a cancelled EnsureLoadBalancer and a normal one, GetLoadBalancer reports {} but EnsureLoadBalancer returned {}",
                        describe_status(got.as_ref()),
                        describe_status(Some(&status))
                    ))
                }
                Ok(_) => {}
            },
        }
        if let Err(e) = self.seen(
            self.provider
                .ensure_load_balancer_deleted(cluster, &svc)
                .await,
        ) {
            problems.push(format!(
                "EnsureLoadBalancerDeleted after a cancelled EnsureLoadBalancer: {}",
                super::err_text(&e)
            ));
        }
        problems
    }

    pub(super) fn no_panics(&self) -> Outcome {
        let panics = self.counter_by_method("ccm_provider_call_panics_total");
        let calls: u64 = self
            .counter_by_method("ccm_provider_calls_total")
            .values()
            .sum();
        if panics.is_empty() {
            return Outcome::pass(format!("no panic in {calls} provider calls"));
        }
        let messages = self.panics.lock().unwrap_or_else(|p| p.into_inner());
        let mut reason = format!(
            "methods panicked (caught at the plugin boundary, reported as errors): {}",
            per_method(&panics)
        );
        if !messages.is_empty() {
            reason.push_str(&format!(": {}", messages.join("; ")));
        }
        Outcome::fail(reason)
    }
}
