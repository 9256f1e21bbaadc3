//! The sandbox's summary: the cluster's view (nodes, services, events, the lease) and the cloud's
//! view (load balancers and routes), as text tables or JSON.

use std::io::{self, Write};
use std::path::PathBuf;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use serde::{Deserialize, Serialize};

use super::observe::{self, Expectations, ExpectedOwner, Observation, Progress};
use super::scene::Scene;
use ccm_host::provider::Provider;
use ccm_host::runtime::well_known::{INSTANCE_TYPE_LABEL, REGION_LABEL, ZONE_LABEL};

/// Where the cloud's view comes from.
pub enum CloudSource {
    /// The fake provider's `stateDir/cloud.json` (the daemon's fake instance writes it; another
    /// instance of the fake would have its own, empty, in-memory cloud).
    FakeStateFile(PathBuf),
    /// Calls (GetLoadBalancer, ListRoutes) to the provider instance the controllers use, so a
    /// provider that keeps its cloud in memory shows what it holds.
    Provider(Provider),
    /// No view, and why.
    Unavailable(String),
}

/// The cloud's load balancers and routes.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudView {
    /// How the view was read.
    pub source: String,
    /// Why (part of) the view could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Load balancers.
    pub load_balancers: Vec<CloudLoadBalancer>,
    /// Routes of the cluster.
    pub routes: Vec<CloudRoute>,
}

/// A load balancer as the cloud reports it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CloudLoadBalancer {
    /// `namespace/name` of the service.
    pub service: String,
    /// The cloud's name for it, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its addresses.
    pub addresses: Vec<String>,
    /// Backend node names, when the cloud's view includes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// The provider whose cloud holds it (several providers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// A route as the cloud reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CloudRoute {
    /// Target node.
    pub target_node: String,
    /// Pod CIDR.
    #[serde(rename = "destinationCIDR")]
    pub destination_cidr: String,
    /// The target is gone.
    pub blackhole: bool,
    /// The provider whose cloud holds it (several providers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
}

/// The parts of the fake's `cloud.json` the summary shows (read here with serde: the host never
/// links a provider crate).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FakeCloudFile {
    #[serde(default)]
    load_balancers: Vec<FakeLb>,
    #[serde(default)]
    routes: Vec<FakeRoute>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FakeLb {
    name: String,
    cluster: String,
    namespace: String,
    service: String,
    #[serde(default)]
    hosts: Vec<String>,
    #[serde(rename = "loadBalancerIP", default)]
    load_balancer_ip: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FakeRoute {
    cluster: String,
    target_node: String,
    #[serde(rename = "destinationCIDR")]
    destination_cidr: String,
    #[serde(default)]
    blackhole: bool,
}

/// Read the cloud's view of `cluster`; `services` are the services whose load balancers to ask
/// a provider about.
pub async fn cloud_view(source: &CloudSource, cluster: &str, services: &[Service]) -> CloudView {
    let mut view = CloudView::default();
    match source {
        CloudSource::Unavailable(why) => {
            view.source = "none".into();
            view.errors.push(why.clone());
        }
        CloudSource::FakeStateFile(path) => {
            view.source = format!("fake cloud state {}", path.display());
            match std::fs::read(path) {
                Ok(bytes) => match serde_json::from_slice::<FakeCloudFile>(&bytes) {
                    Ok(file) => {
                        view.load_balancers = file
                            .load_balancers
                            .into_iter()
                            .filter(|lb| lb.cluster == cluster)
                            .map(|lb| CloudLoadBalancer {
                                service: format!("{}/{}", lb.namespace, lb.service),
                                name: Some(lb.name),
                                addresses: vec![lb.load_balancer_ip],
                                hosts: Some(lb.hosts),
                                provider: None,
                            })
                            .collect();
                        view.routes = file
                            .routes
                            .into_iter()
                            .filter(|r| r.cluster == cluster)
                            .map(|r| CloudRoute {
                                target_node: r.target_node,
                                destination_cidr: r.destination_cidr,
                                blackhole: r.blackhole,
                                provider: None,
                            })
                            .collect();
                    }
                    Err(e) => view.errors.push(format!("{}: {e}", path.display())),
                },
                // No file yet: the cloud has not changed (no LB, no route).
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => view.errors.push(format!("{}: {e}", path.display())),
            }
        }
        CloudSource::Provider(provider) => {
            let caps = provider.capabilities();
            let calls: Vec<&str> = [
                (caps.load_balancer, "GetLoadBalancer"),
                (caps.routes, "ListRoutes"),
            ]
            .into_iter()
            .filter_map(|(offered, call)| offered.then_some(call))
            .collect();
            view.source = if calls.is_empty() {
                format!(
                    "none: {} offers neither LoadBalancer nor Routes",
                    provider.registered_name()
                )
            } else {
                format!(
                    "provider calls to {} ({})",
                    provider.registered_name(),
                    calls.join(", ")
                )
            };
            if caps.routes {
                match provider.list_routes(cluster).await {
                    Ok(routes) => {
                        view.routes = routes
                            .into_iter()
                            .map(|r| CloudRoute {
                                target_node: r.target_node,
                                destination_cidr: r.destination_cidr,
                                blackhole: r.blackhole,
                                provider: None,
                            })
                            .collect()
                    }
                    Err(e) => view.errors.push(format!("ListRoutes: {e}")),
                }
            }
            if caps.load_balancer {
                for svc in services {
                    let key = format!(
                        "{}/{}",
                        svc.metadata.namespace.as_deref().unwrap_or("default"),
                        svc.metadata.name.as_deref().unwrap_or("")
                    );
                    match provider.get_load_balancer(cluster, svc).await {
                        Ok(Some(status)) => view.load_balancers.push(CloudLoadBalancer {
                            service: key,
                            name: None,
                            addresses: status
                                .ingress
                                .unwrap_or_default()
                                .into_iter()
                                .filter_map(|i| i.ip.or(i.hostname))
                                .collect(),
                            hosts: None,
                            provider: None,
                        }),
                        Ok(None) => {}
                        Err(e) => view.errors.push(format!("GetLoadBalancer {key}: {e}")),
                    }
                }
            }
        }
    }
    view.load_balancers
        .sort_by(|a, b| a.service.cmp(&b.service));
    view.routes.sort_by(|a, b| {
        (&a.target_node, &a.destination_cidr).cmp(&(&b.target_node, &b.destination_cidr))
    });
    view
}

/// The views of several providers' clouds as one: each load balancer and route names its
/// provider, the sources and errors are prefixed by the provider's name. One view is kept as
/// it is.
pub fn merge_views(mut views: Vec<(String, CloudView)>) -> CloudView {
    if views.len() == 1 {
        return views.pop().map(|(_, v)| v).unwrap_or_default();
    }
    let mut merged = CloudView::default();
    let mut sources = Vec::new();
    for (name, view) in views {
        sources.push(format!("{name}: {}", view.source));
        merged
            .errors
            .extend(view.errors.into_iter().map(|e| format!("{name}: {e}")));
        merged
            .load_balancers
            .extend(view.load_balancers.into_iter().map(|lb| CloudLoadBalancer {
                provider: Some(name.clone()),
                ..lb
            }));
        merged
            .routes
            .extend(view.routes.into_iter().map(|r| CloudRoute {
                provider: Some(name.clone()),
                ..r
            }));
    }
    merged.source = sources.join("; ");
    merged
        .load_balancers
        .sort_by(|a, b| a.service.cmp(&b.service));
    merged.routes.sort_by(|a, b| {
        (&a.target_node, &a.destination_cidr).cmp(&(&b.target_node, &b.destination_cidr))
    });
    merged
}

/// A provider the sandbox ran.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInfo {
    /// Registered name (`--cloud-provider`).
    pub name: String,
    /// `ProviderName()`.
    pub provider_name: String,
    /// The plugin file.
    pub plugin: PathBuf,
    /// Capabilities, upstream names.
    pub capabilities: Vec<&'static str>,
    /// The platforms (providerID prefixes) it owns.
    pub platforms: Vec<String>,
    /// The loadBalancerClasses it serves.
    pub load_balancer_classes: Vec<String>,
    /// It serves Services without a class.
    pub classless: bool,
    /// What its controllers were expected to do.
    pub expected: Expected,
}

/// One node row.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// Name.
    pub name: String,
    /// `spec.providerID`.
    #[serde(rename = "providerID")]
    pub provider_id: String,
    /// Instance type label.
    pub instance_type: String,
    /// Zone label.
    pub zone: String,
    /// Region label.
    pub region: String,
    /// `Type=address`, in status order.
    pub addresses: Vec<String>,
    /// `spec.podCIDR`.
    #[serde(rename = "podCIDR")]
    pub pod_cidr: String,
    /// providerID set and no uninitialized taint.
    pub initialised: bool,
    /// `NetworkUnavailable` says the route exists (None: no condition).
    pub route_created: Option<bool>,
    /// Who owns it now: a provider's name, `foreign` (a platform no provider owns) or
    /// `unclaimed` (no providerID or platform label yet).
    pub owner: String,
    /// A node expected to be foreign: whether it is still as seeded (labels, taints, addresses,
    /// providerID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub untouched: Option<bool>,
}

/// One service row.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `spec.loadBalancerClass`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// Handled by these controllers.
    pub owned: bool,
    /// The provider that serves it: the one its `ccm-host/load-balancer-provider` annotation
    /// names, else the one of its class (no class: the default provider); none when no
    /// provider takes its class.
    pub provider: Option<String>,
    /// Ingress addresses.
    pub ingress: Vec<String>,
    /// Carries the load-balancer-cleanup finalizer.
    pub finalizer: bool,
}

/// Events of one type and reason, as the API server holds them.
#[derive(Debug, Clone, Serialize)]
pub struct EventCount {
    /// `Normal` or `Warning`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Reason.
    pub reason: String,
    /// Event objects (the rows `kubectl get events` lists).
    pub objects: u64,
    /// Occurrences: the sum of their `count` fields (a repeat of an event within 10 minutes
    /// increments its `count`, kubectl's `(x3 over 2m)`, instead of adding an object).
    pub count: u64,
}

/// How many open items the text summary lists before "… and N more".
pub const LISTED_OPEN_ITEMS: usize = 20;

/// What was expected of the controllers: `on`, or `off: <why>`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Expected {
    /// Node initialisation.
    pub nodes: String,
    /// Routes.
    pub routes: String,
    /// Load balancers.
    pub load_balancers: String,
}

/// Everything the sandbox reports at the end of its wait.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The scene converged.
    pub converged: bool,
    /// `converged`, `timed out after 2m0s`, `interrupted`, or why the controllers stopped.
    pub outcome: String,
    /// Why it did not converge, in a sentence: the leader lost its lease, the controllers
    /// stopped (with their first error), or the first error seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Seconds from starting the controllers to the end of the wait.
    pub elapsed_seconds: f64,
    /// Where the scene came from.
    pub scene: String,
    /// The (default) provider.
    pub provider: ProviderInfo,
    /// Every provider, in `--cloud-provider` order (one unless the scenario names several).
    pub providers: Vec<ProviderInfo>,
    /// Each provider's controllers see only the nodes it owns (several providers, or
    /// platforms given).
    pub ownership_enforced: bool,
    /// What the controllers were expected to do.
    pub expected: Expected,
    /// The sandbox API server's URL.
    pub api_server: String,
    /// The kubeconfig written for users (`--kubeconfig-out`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// Seeded nodes as the cluster has them.
    pub nodes: Vec<NodeRow>,
    /// Seeded services as the cluster has them.
    pub services: Vec<ServiceRow>,
    /// The cloud's view.
    pub cloud: CloudView,
    /// Events by type and reason, most frequent first: what the API server holds when the
    /// summary is taken.
    pub events: Vec<EventCount>,
    /// No event had been written for a while when the summary was taken (false: the
    /// controllers were still writing events, `kubectl get events` shows later ones).
    pub events_settled: bool,
    /// The leader-election lease (`namespace/name`).
    pub lease: String,
    /// Its holder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_holder: Option<String>,
    /// Every item that did not converge, with the reason.
    pub not_converged: Vec<String>,
}

fn label(node: &Node, key: &str) -> String {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .cloned()
        .unwrap_or_default()
}

/// Everything the report needs besides the observation.
pub struct ReportInput<'a> {
    /// The scene.
    pub scene: &'a Scene,
    /// Expectations.
    pub expectations: &'a Expectations,
    /// The last progress.
    pub progress: &'a Progress,
    /// Outcome text.
    pub outcome: String,
    /// Elapsed seconds.
    pub elapsed_seconds: f64,
    /// The providers, in order.
    pub providers: Vec<ProviderInfo>,
    /// API server URL.
    pub api_server: String,
    /// `--kubeconfig-out`.
    pub kubeconfig: Option<PathBuf>,
    /// The leader-election lease, `namespace/name`.
    pub lease_name: String,
    /// The lease object.
    pub lease: Option<Lease>,
    /// Why the scene did not converge (None when it did).
    pub reason: Option<String>,
    /// Whether the events had stopped changing.
    pub events_settled: bool,
}

/// Build the report from the last observation and the cloud's view.
pub fn build(input: ReportInput<'_>, obs: &Observation, cloud: CloudView) -> Report {
    let exp = input.expectations;
    let nodes = input
        .scene
        .nodes
        .iter()
        .enumerate()
        .filter_map(|(i, sn)| obs.node(&sn.spec.name).map(|n| (i, sn, n)))
        .map(|(i, sn, n)| NodeRow {
            name: n.metadata.name.clone().unwrap_or_default(),
            provider_id: n
                .spec
                .as_ref()
                .and_then(|s| s.provider_id.clone())
                .unwrap_or_default(),
            instance_type: label(n, INSTANCE_TYPE_LABEL),
            zone: label(n, ZONE_LABEL),
            region: label(n, REGION_LABEL),
            addresses: n
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .map(|a| {
                    a.iter()
                        .map(|a| format!("{}={}", a.type_, a.address))
                        .collect()
                })
                .unwrap_or_default(),
            pod_cidr: n
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidr.clone())
                .unwrap_or_default(),
            initialised: observe::node_initialised(n),
            route_created: observe::node_routed(n),
            owner: exp.owner_name(n),
            untouched: (exp.node_owners.get(i) == Some(&ExpectedOwner::Foreign))
                .then(|| observe::changes_since_seeded(&Scene::node_object(sn), n).is_empty()),
        })
        .collect();
    let services = input
        .scene
        .services
        .iter()
        .filter_map(|s| obs.service(&s.namespace, &s.name))
        .map(|s| ServiceRow {
            namespace: s.metadata.namespace.clone().unwrap_or_default(),
            name: s.metadata.name.clone().unwrap_or_default(),
            load_balancer_class: s.spec.as_ref().and_then(|s| s.load_balancer_class.clone()),
            owned: exp.server_of(s).is_some(),
            provider: observe::lb_provider(s)
                .map(str::to_string)
                .or_else(|| exp.server_of(s).map(|k| exp.providers[k].name.clone())),
            ingress: observe::ingress(s),
            finalizer: ccm_host::controllers::service::predicates::has_lb_finalizer(s),
        })
        .collect();
    let mut events: Vec<EventCount> = obs
        .event_counts()
        .into_iter()
        .map(|((type_, reason), tally)| EventCount {
            type_,
            reason,
            objects: tally.objects,
            count: tally.count,
        })
        .collect();
    events.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    Report {
        converged: input.progress.converged(),
        outcome: input.outcome,
        reason: input.reason,
        elapsed_seconds: input.elapsed_seconds,
        scene: input.scene.source.clone(),
        provider: input.providers[0].clone(),
        providers: input.providers,
        ownership_enforced: exp.ownership.enforced(),
        expected: Expected {
            nodes: exp.describe(|p| &p.nodes),
            routes: exp.describe(|p| &p.routes),
            load_balancers: exp.describe(|p| &p.load_balancers),
        },
        api_server: input.api_server,
        kubeconfig: input.kubeconfig,
        nodes,
        services,
        cloud,
        events,
        events_settled: input.events_settled,
        lease: input.lease_name,
        lease_holder: input
            .lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()),
        not_converged: input.progress.pending.clone(),
    }
}

/// Rows a text table shows before "… and N more" (`-o json` has every row).
const LISTED_ROWS: usize = 50;

/// Print rows as an aligned table (two spaces between columns), the first [`LISTED_ROWS`] of
/// them.
fn table(out: &mut dyn Write, headers: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let (rows, more) = rows.split_at(rows.len().min(LISTED_ROWS));
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: Vec<&str>| -> io::Result<()> {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  "));
            }
        }
        writeln!(out, "  {}", s.trim_end())
    };
    line(out, headers.to_vec())?;
    for row in rows {
        line(out, row.iter().map(String::as_str).collect())?;
    }
    if !more.is_empty() {
        writeln!(out, "  … and {} more (-o json lists every row)", more.len())?;
    }
    Ok(())
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

impl Report {
    /// Several providers, or one that owns only its platforms: the tables show owners.
    pub fn hybrid(&self) -> bool {
        self.providers.len() > 1 || self.ownership_enforced
    }

    /// The human-readable summary.
    pub fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "Sandbox {} after {:.1}s: {}",
            if self.converged {
                "converged"
            } else {
                "did NOT converge"
            },
            self.elapsed_seconds,
            self.outcome
        )?;
        // Why, before anything else: a long table can push the open items off the screen.
        if !self.converged {
            if let Some(reason) = &self.reason {
                writeln!(out, "  why: {reason}")?;
            }
            if !self.not_converged.is_empty() {
                writeln!(
                    out,
                    "  open: {} item(s), first: {} (all at the end)",
                    self.not_converged.len(),
                    self.not_converged[0]
                )?;
            }
        }
        let hybrid = self.hybrid();
        if hybrid {
            writeln!(out, "  providers (the first is the default):")?;
            for p in &self.providers {
                let nodes = self.nodes.iter().filter(|n| n.owner == p.name).count();
                let services = self
                    .services
                    .iter()
                    .filter(|s| s.provider.as_deref() == Some(p.name.as_str()))
                    .count();
                let mut classes: Vec<&str> = Vec::new();
                if p.classless {
                    classes.push("no class");
                }
                classes.extend(p.load_balancer_classes.iter().map(String::as_str));
                writeln!(
                    out,
                    "    {} (ProviderName {}) from {}; capabilities: {}; platforms {}; LoadBalancer classes: {}; owns {nodes} node(s), serves {services} service(s)",
                    p.name,
                    p.provider_name,
                    p.plugin.display(),
                    p.capabilities.join(", "),
                    p.platforms.join(", "),
                    if classes.is_empty() {
                        "none".to_string()
                    } else {
                        classes.join(", ")
                    }
                )?;
            }
        } else {
            writeln!(
                out,
                "  provider {} (ProviderName {}) from {}; capabilities: {}",
                self.provider.name,
                self.provider.provider_name,
                self.provider.plugin.display(),
                self.provider.capabilities.join(", ")
            )?;
        }
        writeln!(out, "  scene: {}", self.scene)?;
        writeln!(
            out,
            "  expected: node initialisation {}; routes {}; load balancers {}",
            self.expected.nodes, self.expected.routes, self.expected.load_balancers
        )?;
        let route_of = |node: &str| -> Option<&CloudRoute> {
            self.cloud.routes.iter().find(|r| r.target_node == node)
        };
        writeln!(out, "\nNodes ({})", self.nodes.len())?;
        let rows: Vec<Vec<String>> = self
            .nodes
            .iter()
            .map(|n| {
                let route = match (route_of(&n.name), n.route_created) {
                    (Some(r), _) if r.blackhole => "blackhole".to_string(),
                    (Some(_), Some(true)) => "yes".to_string(),
                    (Some(_), _) => "in cloud".to_string(),
                    (None, Some(true)) => "yes".to_string(),
                    (None, Some(false)) => "NO".to_string(),
                    (None, None) => "-".to_string(),
                };
                let mut row = vec![n.name.clone()];
                if hybrid {
                    row.push(match n.untouched {
                        Some(true) => format!("{} (untouched)", n.owner),
                        Some(false) => format!("{} (TOUCHED)", n.owner),
                        None => n.owner.clone(),
                    });
                }
                row.extend([
                    if n.initialised { "yes" } else { "NO" }.to_string(),
                    or_dash(&n.provider_id),
                    or_dash(&n.instance_type),
                    or_dash(&n.zone),
                    or_dash(&n.pod_cidr),
                    route,
                    n.addresses.join(" "),
                ]);
                row
            })
            .collect();
        let mut headers = vec!["NAME"];
        if hybrid {
            headers.push("OWNER");
        }
        headers.extend([
            "INITIALISED",
            "PROVIDER-ID",
            "TYPE",
            "ZONE",
            "POD-CIDR",
            "ROUTE",
            "ADDRESSES",
        ]);
        table(out, &headers, &rows)?;
        writeln!(out, "\nServices ({})", self.services.len())?;
        let rows: Vec<Vec<String>> = self
            .services
            .iter()
            .map(|s| {
                let key = format!("{}/{}", s.namespace, s.name);
                let lb = self.cloud.load_balancers.iter().find(|lb| {
                    lb.service == key && (lb.provider.is_none() || lb.provider == s.provider)
                });
                let cloud = match lb {
                    Some(lb) => match &lb.hosts {
                        Some(h) => format!(
                            "{} ({} hosts)",
                            lb.name.as_deref().unwrap_or("yes"),
                            h.len()
                        ),
                        None => lb.name.clone().unwrap_or_else(|| "yes".into()),
                    },
                    None => "-".into(),
                };
                let (ours, not_ours) = if hybrid {
                    (s.provider.clone().unwrap_or_default(), "none")
                } else {
                    ("yes".to_string(), "no")
                };
                vec![
                    key,
                    s.load_balancer_class.clone().unwrap_or_else(|| "-".into()),
                    if s.owned {
                        ours
                    } else if s.finalizer || !s.ingress.is_empty() {
                        format!("{not_ours} (TOUCHED)")
                    } else {
                        format!("{not_ours} (untouched)")
                    },
                    if s.ingress.is_empty() {
                        "<pending>".into()
                    } else {
                        s.ingress.join(",")
                    },
                    cloud,
                ]
            })
            .collect();
        table(
            out,
            &[
                "SERVICE",
                "CLASS",
                if hybrid { "PROVIDER" } else { "OURS" },
                "INGRESS",
                "CLOUD-LB",
            ],
            &rows,
        )?;
        writeln!(
            out,
            "\nCloud: {} load balancer(s), {} route(s) ({})",
            self.cloud.load_balancers.len(),
            self.cloud.routes.len(),
            self.cloud.source
        )?;
        for e in &self.cloud.errors {
            writeln!(out, "  cloud view incomplete: {e}")?;
        }
        let seeded: std::collections::BTreeSet<&str> =
            self.nodes.iter().map(|n| n.name.as_str()).collect();
        let odd_routes: Vec<&CloudRoute> = self
            .cloud
            .routes
            .iter()
            .filter(|r| !seeded.contains(r.target_node.as_str()) || r.blackhole)
            .collect();
        for r in odd_routes.iter().take(LISTED_ROWS) {
            writeln!(
                out,
                "  route {} -> {}{}",
                r.destination_cidr,
                r.target_node,
                if r.blackhole { " (blackhole)" } else { "" }
            )?;
        }
        if odd_routes.len() > LISTED_ROWS {
            writeln!(
                out,
                "  … and {} more (-o json lists every route)",
                odd_routes.len() - LISTED_ROWS
            )?;
        }
        if !self.events.is_empty() {
            let objects: u64 = self.events.iter().map(|e| e.objects).sum();
            writeln!(
                out,
                "\nEvents ({objects} in the API server{}; COUNT adds up their repeats)",
                if self.events_settled {
                    ""
                } else {
                    ", still being written when this summary was taken"
                }
            )?;
            let rows: Vec<Vec<String>> = self
                .events
                .iter()
                .map(|e| {
                    vec![
                        e.type_.clone(),
                        e.reason.clone(),
                        e.objects.to_string(),
                        e.count.to_string(),
                    ]
                })
                .collect();
            table(out, &["TYPE", "REASON", "EVENTS", "COUNT"], &rows)?;
        }
        if let Some(holder) = &self.lease_holder {
            writeln!(out, "\nLease {} held by {holder}", self.lease)?;
        }
        if !self.not_converged.is_empty() {
            writeln!(out, "\nNot converged ({}):", self.not_converged.len())?;
            for p in self.not_converged.iter().take(LISTED_OPEN_ITEMS) {
                writeln!(out, "  - {p}")?;
            }
            if let Some(more) = self.not_converged.len().checked_sub(LISTED_OPEN_ITEMS) {
                if more > 0 {
                    writeln!(out, "  … and {more} more (-o json lists every item)")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_tables_stop_after_the_listed_rows() {
        let rows: Vec<Vec<String>> = (0..LISTED_ROWS + 10)
            .map(|i| vec![format!("node-{i:03}"), "yes".into()])
            .collect();
        let mut out = Vec::new();
        table(&mut out, &["NAME", "OK"], &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().count(), 1 + LISTED_ROWS + 1, "{text}");
        assert!(text.contains(&format!("node-{:03}", LISTED_ROWS - 1)));
        assert!(!text.contains(&format!("node-{LISTED_ROWS:03}")));
        assert!(
            text.ends_with("  … and 10 more (-o json lists every row)\n"),
            "{text}"
        );
    }
}
