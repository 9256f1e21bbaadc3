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
use tracing::instrument::WithSubscriber;
use tracing::subscriber::NoSubscriber;

use super::report::Outcome;
use super::scene;
use super::validate::describe_status;
use super::{per_method, Suite};
use ccm_host::controllers::service::predicates::load_balancer_status_equal;
use ccm_host::provider::Provider;

/// The Service of the cancelled-EnsureLoadBalancer probe.
pub fn probe_service(plan: &super::Plan) -> Service {
    plan.service(
        "ccm-check-deadline",
        Some(&scene::uid(&plan.nonce, "deadline")),
    )
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
    /// The provider method the probe calls.
    fn method(&self) -> &'static str {
        match self {
            Self::InstanceMetadata(_) => "InstanceMetadata",
            Self::InstanceExists(_) => "InstanceExists",
            Self::InstanceShutdown(_) => "InstanceShutdown",
            Self::InstanceId(_) => "InstanceID",
            Self::NodeAddressesByProviderId(_) => "NodeAddressesByProviderID",
            Self::InstanceExistsByProviderId(_) => "InstanceExistsByProviderID",
            Self::GetZoneByProviderId(_) => "GetZoneByProviderID",
            Self::GetLoadBalancer(_) => "GetLoadBalancer",
            Self::ListRoutes(_) => "ListRoutes",
        }
    }

    /// What the call is about: a node, a provider ID, a Service, a cluster.
    fn target(&self) -> String {
        let node = |n: &Node| n.metadata.name.clone().unwrap_or_default();
        match self {
            Self::InstanceMetadata(n) | Self::InstanceExists(n) | Self::InstanceShutdown(n) => {
                node(n)
            }
            Self::InstanceId(n) => n.clone(),
            Self::NodeAddressesByProviderId(id)
            | Self::InstanceExistsByProviderId(id)
            | Self::GetZoneByProviderId(id) => id.clone(),
            Self::GetLoadBalancer(s) => s.metadata.name.clone().unwrap_or_default(),
            Self::ListRoutes(c) => c.clone(),
        }
    }

    fn label(&self) -> String {
        format!("{}({})", self.method(), self.target())
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

    /// One call of a probe. `twin`: through the handle with an expired deadline; such a call
    /// is expected to end at its deadline, so the host's "call timed out" warning is not shown
    /// (it would look like a failure on a passing run) and it is no hang. Otherwise the call is
    /// a [`Suite::direct`] one; `when` says when it happens, for the report.
    async fn run_probe(
        &self,
        provider: &Provider,
        probe: &Probe,
        twin: bool,
        when: &str,
    ) -> String {
        let cluster = &self.plan.cluster_name;
        let what = format!("{}{when}", probe.target());
        macro_rules! go {
            ($call:expr) => {
                if twin {
                    summary(self.seen($call.with_subscriber(NoSubscriber::default()).await))
                } else {
                    summary(self.direct(probe.method(), &what, $call).await)
                }
            };
        }
        match probe {
            Probe::InstanceMetadata(n) => go!(provider.instance_metadata(n)),
            Probe::InstanceExists(n) => go!(provider.instance_exists(n)),
            Probe::InstanceShutdown(n) => go!(provider.instance_shutdown(n)),
            Probe::InstanceId(n) => go!(provider.instance_id(n)),
            Probe::NodeAddressesByProviderId(id) => go!(provider.node_addresses_by_provider_id(id)),
            Probe::InstanceExistsByProviderId(id) => {
                go!(provider.instance_exists_by_provider_id(id))
            }
            Probe::GetZoneByProviderId(id) => go!(provider.get_zone_by_provider_id(id)),
            Probe::GetLoadBalancer(s) => go!(provider.get_load_balancer(cluster, s)),
            Probe::ListRoutes(c) => go!(provider.list_routes(c)),
        }
    }

    pub(super) async fn deadline(&mut self) -> Outcome {
        // Nothing else may call the provider meanwhile: the answers must be comparable.
        self.stop_controllers().await;
        let mut problems = Vec::new();
        // Calls nobody waited for (the controllers' retries in the background); a method
        // whose hang a check reported already is not reported again.
        let hit = self.background_timeouts();
        if !hit.is_empty() {
            problems.push(format!(
                "{} calls of the controllers ran into the {} call deadline during the suite: {} (a provider should answer well within it; a slow test cloud may need --provider-call-timeout)",
                hit.values().sum::<u64>(),
                ccm_host::runtime::duration::format(self.plan.call_timeout),
                per_method(&hit)
            ));
        }
        let expired = self.provider.with_call_timeout(Duration::ZERO);
        let (probes, hung): (Vec<Probe>, Vec<Probe>) = self
            .probes()
            .into_iter()
            .partition(|p| self.hang_of(p.method()).is_none());
        for probe in &probes {
            let before = self.run_probe(&self.provider, probe, false, "").await;
            if self.stalled() {
                break;
            }
            let _cancelled = self.run_probe(&expired, probe, true, "").await;
            self.absorb_timeouts(false);
            let after = self
                .run_probe(
                    &self.provider,
                    probe,
                    false,
                    ", after a twin call cancelled by its deadline",
                )
                .await;
            if self.stalled() {
                break;
            }
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
        if !hung.is_empty() {
            detail.push_str(&format!(
                " ({} not probed: {} earlier)",
                hung.iter()
                    .map(Probe::method)
                    .collect::<Vec<_>>()
                    .join(", "),
                if hung.len() == 1 {
                    "it hung"
                } else {
                    "they hung"
                }
            ));
        }
        if self.caps.load_balancer && !self.stalled() {
            detail.push_str(", EnsureLoadBalancer converges after a cancelled one");
            problems.extend(self.cancelled_ensure(&expired).await);
        }
        Outcome::from_problems(problems, detail)
    }

    /// A cancelled EnsureLoadBalancer, then a normal one: it must converge to one load
    /// balancer that GetLoadBalancer reports, and deletion must clean up.
    async fn cancelled_ensure(&self, expired: &Provider) -> Vec<String> {
        let cluster = &self.plan.cluster_name;
        let svc = probe_service(&self.plan);
        let nodes: Vec<Node> = self.initialised.values().cloned().collect();
        let mut problems = Vec::new();
        let _ = self.seen(
            expired
                .ensure_load_balancer(cluster, &svc, &nodes)
                .with_subscriber(NoSubscriber::default())
                .await,
        );
        self.absorb_timeouts(false);
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
        if let Err(e) = self
            .direct(
                "EnsureLoadBalancerDeleted",
                &super::lb::service_name(&svc),
                self.provider.ensure_load_balancer_deleted(cluster, &svc),
            )
            .await
        {
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
