//! LoadBalancer: one haproxy container per Service on the cluster's network.
//!
//! - **Name** `ccmlb-<first 12 hex digits of SHA-256("<cluster>/<namespace>/<name>")>`, labels
//!   [`OWNER_LABEL`] = the cluster and [`SERVICE_LABEL`] = `namespace/name`. A container of
//!   that name without both labels is someone else's: it is never changed or removed.
//! - **Ensure**: every port must be TCP with a NodePort (UDP and SCTP are refused with one
//!   error naming the ports, and nothing changes). The configuration ([`crate::haproxy`]) is
//!   rendered from the hosts' InternalIPs (a Node without one yet: its container's address on
//!   the cluster's network); a missing container is created from the proxy image
//!   (missing image: one error naming it), the file put in with the archive endpoint, and the
//!   container started. A running one whose file differs gets the new file and `SIGUSR2`
//!   (haproxy's seamless reload), and the call returns when haproxy's log reports the load's
//!   result (`Loading success.`; `Loading failure!` is an error quoting its alerts; a signal
//!   without an answer is sent once more). A file that matches is reloaded anyway unless this
//!   provider saw haproxy load it, so a failed or lost reload is never mistaken for a done one.
//!   One that is not running, or whose image or published ports differ, is re-created.
//! - **Status**: the container's IPv4 address on the cluster network, `ipMode: Proxy` (the
//!   proxy terminates connections: clients' addresses are not preserved), every port; with
//!   `publishOnLoopback` a second entry `127.0.0.1` (each Service port published on the
//!   machine's loopback at the same port number).
//! - **Delete**: the container is removed (a foreign one of that name is left alone).
//! - **Garbage**: at `Initialize`, this cluster's proxies whose Service is gone (404) are removed.
//!
//! Differences from cloud-provider-kind: haproxy configured by a file and reloaded by signal
//! instead of Envoy with file-based xDS; health checks on the NodePort (or
//! healthCheckNodePort) rather than kube-proxy's 10256; not privileged (only the namespaced
//! sysctl `net.ipv4.ip_unprivileged_port_start=0`); create-time properties (image, published
//! ports) are reconciled by re-creating the container; UDP is refused instead of proxied.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::cloud::Shared;
use crate::engine::Container;
use crate::haproxy::{self, Backend, Plan, Port, CONFIG_DIR, CONFIG_FILE};

/// Ownership label: the cluster whose load balancer this container is.
pub const OWNER_LABEL: &str = "io.ccm-host.containers.load-balancer-of";
/// The Service (`namespace/name`) the container serves.
pub const SERVICE_LABEL: &str = "io.ccm-host.containers.service";
/// The published ports at creation (`80/TCP,443/TCP`; empty when not published).
pub const PUBLISHED_LABEL: &str = "io.ccm-host.containers.published";
/// How long a new proxy may take to report that it loaded its configuration.
const START_WAIT: Duration = Duration::from_secs(10);
/// The least time between two reloads of one proxy (see `reload`).
const RELOAD_SPACING: Duration = Duration::from_millis(300);
/// How long a reload signal may go unanswered before it is sent again.
const RELOAD_RESEND: Duration = Duration::from_secs(1);
/// The loopback address ports are published on.
pub const LOOPBACK: &str = "127.0.0.1";

/// The `containers` LoadBalancer.
pub struct ContainerLoadBalancer {
    shared: Arc<Shared>,
    /// Per proxy container ID: the configuration haproxy confirmed it loaded (`Loading
    /// success.` after its start or a reload). A file that matches but is not confirmed (a
    /// reload that failed or whose signal was lost, or a provider started anew) is reloaded.
    loaded: Mutex<HashMap<String, String>>,
    /// One change at a time per proxy container name.
    locks: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Per proxy container ID: when haproxy last reported a load.
    last_load: Mutex<HashMap<String, Instant>>,
}

/// Lines of a haproxy log that end a configuration load (start or reload).
fn load_results(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("Loading success.") || l.contains("Loading failure!"))
        .collect()
}

/// The last `n` `[ALERT]` lines of a haproxy log, joined (one line).
fn last_alerts(log: &str, n: usize) -> String {
    let alerts: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("[ALERT]"))
        .map(str::trim)
        .collect();
    alerts[alerts.len().saturating_sub(n)..].join(" | ")
}

fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or("default"),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

/// The proxy container's name for a Service.
pub fn container_name(cluster: &str, service: &Service) -> String {
    let digest = Sha256::digest(format!("{cluster}/{}", service_key(service)).as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("ccmlb-{hex}")
}

/// The InternalIP a host is reached at (IPv4 first).
fn host_address(node: &Node) -> Option<IpAddr> {
    let addrs: Vec<IpAddr> = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == address_type::INTERNAL_IP)
        .filter_map(|a| a.address.parse().ok())
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
}

fn valid_range(r: &str) -> bool {
    let Some((ip, len)) = r.split_once('/') else {
        return false;
    };
    let (Ok(ip), Ok(len)) = (ip.parse::<IpAddr>(), len.parse::<u8>()) else {
        return false;
    };
    len <= if ip.is_ipv4() { 32 } else { 128 }
}

impl ContainerLoadBalancer {
    /// The load balancer of the shared runtime client.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            loaded: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            last_load: Mutex::new(HashMap::new()),
        }
    }

    /// The lock of one proxy container name.
    fn lock_for(&self, name: &str) -> Arc<Mutex<()>> {
        self.locks
            .lock()
            .expect("proxy locks")
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// `SIGUSR2` to haproxy's master and wait for the load's result in its log; `Err` with
    /// haproxy's alerts when it refused the file.
    ///
    /// haproxy's master logs `Loading success.` a moment before it handles signals again, and a
    /// `SIGUSR2` in that moment is lost (measured: back-to-back reloads lost signals now and
    /// then). So a reload starts at least [`RELOAD_SPACING`] after the previous one this
    /// provider saw, and a signal without an answer is sent again every [`RELOAD_RESEND`].
    fn reload(&self, ctx: &CallContext, id: &str, name: &str) -> Result<()> {
        let engine = &self.shared.engine;
        let last = self.last_load.lock().expect("last load").get(id).copied();
        if let Some(wait) = last.and_then(|t| RELOAD_SPACING.checked_sub(t.elapsed())) {
            std::thread::sleep(wait);
        }
        let before = load_results(&engine.logs(ctx, id, None)?).len();
        engine.kill(ctx, id, "SIGUSR2")?;
        let started = Instant::now();
        let mut sent = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let log = engine.logs(ctx, id, None)?;
            let results = load_results(&log);
            if results.len() > before {
                self.last_load
                    .lock()
                    .expect("last load")
                    .insert(id.to_string(), Instant::now());
                if results
                    .last()
                    .is_some_and(|l| l.contains("Loading success."))
                {
                    return Ok(());
                }
                return Err(ProviderError::other(format!(
                    "load balancer container {name}: haproxy refused the new configuration and keeps the previous one: {}",
                    last_alerts(&log, 3)
                )));
            }
            if sent.elapsed() > RELOAD_RESEND {
                log::warn!("containers load balancer: {name} did not report its reload within {RELOAD_RESEND:?}; sending SIGUSR2 again");
                engine.kill(ctx, id, "SIGUSR2")?;
                sent = Instant::now();
            }
            if started.elapsed() > START_WAIT {
                return Err(ProviderError::other(format!(
                    "load balancer container {name}: haproxy did not report a reload within {START_WAIT:?} of SIGUSR2"
                )));
            }
        }
    }

    fn name(&self, svc: &Service) -> String {
        container_name(&self.shared.config.cluster, svc)
    }

    fn is_ours(&self, c: &Container, svc: &Service) -> bool {
        let labels = c.labels();
        labels.get(OWNER_LABEL) == Some(&self.shared.config.cluster)
            && labels.get(SERVICE_LABEL) == Some(&service_key(svc))
    }

    /// The Service's container if it is ours; `Err` if a foreign container has its name.
    fn ours(&self, ctx: &CallContext, svc: &Service) -> Result<Option<Container>> {
        let name = self.name(svc);
        match self.shared.engine.inspect(ctx, &name)? {
            Some(c) if self.is_ours(&c, svc) => Ok(Some(c)),
            Some(_) => Err(ProviderError::other(format!(
                "container {name} exists but was not made by ccm-host for Service {} (labels {OWNER_LABEL}, {SERVICE_LABEL}): it is left alone; remove or rename it",
                service_key(svc)
            ))),
            None => Ok(None),
        }
    }

    /// The plan for a Service and its hosts; refuses what the proxy cannot carry.
    fn plan(&self, ctx: &CallContext, svc: &Service, nodes: &[Node]) -> Result<Plan> {
        let key = service_key(svc);
        let spec = svc.spec.clone().unwrap_or_default();
        let mut ports = Vec::new();
        let mut refused = Vec::new();
        for p in spec.ports.iter().flatten() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let label = match &p.name {
                Some(n) if !n.is_empty() => format!("{n} {}/{proto}", p.port),
                _ => format!("{}/{proto}", p.port),
            };
            if proto != "TCP" {
                refused.push(format!(
                    "{label}: the haproxy load balancer carries TCP only"
                ));
                continue;
            }
            match p.node_port {
                Some(np) if np > 0 => ports.push(Port {
                    port: p.port,
                    node_port: np,
                }),
                _ => refused.push(format!(
                    "{label}: no nodePort (allocateLoadBalancerNodePorts: false is not supported)"
                )),
            }
        }
        if !refused.is_empty() {
            return Err(ProviderError::other(format!(
                "Service {key}: ports refused, load balancer left as it was: {}",
                refused.join("; ")
            )));
        }
        if ports.is_empty() {
            return Err(ProviderError::other(format!(
                "Service {key} has no ports to balance"
            )));
        }
        let mut ranges = Vec::new();
        for r in spec.load_balancer_source_ranges.iter().flatten() {
            let r = r.trim();
            if !valid_range(r) {
                return Err(ProviderError::other(format!(
                    "Service {key}: loadBalancerSourceRanges entry {r:?} is not a CIDR (e.g. 10.0.0.0/8)"
                )));
            }
            ranges.push(r.to_string());
        }
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let mut backends = Vec::new();
        for n in nodes {
            let name = n.metadata.name.clone().unwrap_or_default();
            // A Node not initialised yet has no address: its container's, on the cluster's network.
            let address = match host_address(n) {
                Some(a) => Some(a),
                None => self.container_address(ctx, &name)?,
            };
            match address {
                Some(address) => backends.push(Backend { name, address }),
                None => log::warn!(
                    "containers load balancer {key}: node {name} has no InternalIP and no container address; it gets no traffic"
                ),
            }
        }
        backends.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Plan {
            service: key,
            ports,
            backends,
            health_check_node_port: spec.health_check_node_port.filter(|hc| local && *hc > 0),
            client_ip_affinity: spec.session_affinity.as_deref() == Some("ClientIP"),
            source_ranges: ranges,
            check_interval: self
                .shared
                .config
                .health_check_interval()
                .unwrap_or(Duration::from_secs(2)),
        })
    }

    /// The IPv4 address on the cluster's network of the cluster's container named `name`.
    fn container_address(&self, ctx: &CallContext, name: &str) -> Result<Option<IpAddr>> {
        let cfg = &self.shared.config;
        let Some(c) = self.shared.engine.inspect(ctx, name)? else {
            return Ok(None);
        };
        if c.short_name() != name || c.labels().get(&cfg.cluster_label) != Some(&cfg.cluster) {
            return Ok(None);
        }
        Ok(c.network_settings
            .networks
            .get(&cfg.network)
            .and_then(|ep| ep.ip_address.parse().ok()))
    }

    /// `80/TCP,443/TCP` when published, else "".
    fn published(&self, plan: &Plan) -> String {
        if !self.shared.config.load_balancer.publish_on_loopback {
            return String::new();
        }
        plan.ports
            .iter()
            .map(|p| format!("{}/TCP", p.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn create(&self, ctx: &CallContext, svc: &Service, plan: &Plan, config: &str) -> Result<()> {
        let engine = &self.shared.engine;
        let cfg = &self.shared.config;
        let image = &cfg.load_balancer.image;
        let name = self.name(svc);
        if !engine.image_exists(ctx, image)? {
            return Err(ProviderError::other(format!(
                "load balancer image {image} is not in the container runtime ({}): build or pull it, or set loadBalancer.image in the cloud config",
                engine.socket().display()
            )));
        }
        let published = self.published(plan);
        let mut exposed = serde_json::Map::new();
        let mut bindings = serde_json::Map::new();
        if !published.is_empty() {
            for p in &plan.ports {
                exposed.insert(format!("{}/tcp", p.port), json!({}));
                bindings.insert(
                    format!("{}/tcp", p.port),
                    json!([{"HostIp": LOOPBACK, "HostPort": p.port.to_string()}]),
                );
            }
        }
        let labels: BTreeMap<&str, String> = [
            (OWNER_LABEL, cfg.cluster.clone()),
            (SERVICE_LABEL, plan.service.clone()),
            (PUBLISHED_LABEL, published),
        ]
        .into_iter()
        .collect();
        let spec = json!({
            "Image": image,
            "Hostname": name,
            "Entrypoint": ["haproxy"],
            "Cmd": ["-W", "-db", "-f", format!("{CONFIG_DIR}/{CONFIG_FILE}")],
            "Labels": labels,
            "ExposedPorts": exposed,
            "HostConfig": {
                "NetworkMode": cfg.network,
                "PortBindings": bindings,
                "Sysctls": {"net.ipv4.ip_unprivileged_port_start": "0"},
            },
            "NetworkingConfig": {"EndpointsConfig": {cfg.network.clone(): {}}},
        });
        let id = engine.create(ctx, &name, &spec).map_err(|e| {
            e.context(format!(
                "creating load balancer container {name} on network {}",
                cfg.network
            ))
        })?;
        let result = (|| {
            self.put_config(ctx, &id, config)?;
            engine.start(ctx, &id)?;
            self.wait_started(ctx, &id, &name)
        })();
        if let Err(e) = result {
            // Nothing half-made stays behind.
            let _ = engine.remove(&CallContext::background(), &id);
            return Err(e.context(format!("starting load balancer container {name}")));
        }
        self.loaded
            .lock()
            .expect("loaded")
            .insert(id.clone(), config.to_string());
        self.last_load
            .lock()
            .expect("last load")
            .insert(id.clone(), Instant::now());
        log::info!(
            "containers load balancer {}: created {name} ({} ports, {} hosts)",
            plan.service,
            plan.ports.len(),
            plan.backends.len()
        );
        Ok(())
    }

    /// Wait until haproxy says `Loading success.` (at most [`START_WAIT`]); a proxy that exits
    /// instead is an error quoting its last log lines.
    fn wait_started(&self, ctx: &CallContext, id: &str, name: &str) -> Result<()> {
        let engine = &self.shared.engine;
        let started = Instant::now();
        loop {
            let logs = engine.logs(ctx, id, Some(20))?;
            if logs.contains("Loading success") {
                return Ok(());
            }
            let running = engine.inspect(ctx, id)?.is_some_and(|c| c.is_up());
            if !running {
                let last: Vec<&str> = logs
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .collect();
                let tail = last[last.len().saturating_sub(3)..].join(" | ");
                return Err(ProviderError::other(format!(
                    "load balancer container {name} exited at start: {tail}"
                )));
            }
            if started.elapsed() > START_WAIT {
                log::warn!("containers load balancer: {name} runs but haproxy did not report `Loading success.` within {START_WAIT:?}");
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn put_config(&self, ctx: &CallContext, id: &str, config: &str) -> Result<()> {
        let dir = CONFIG_DIR.trim_start_matches('/');
        let (parent, leaf) = dir.rsplit_once('/').unwrap_or(("", dir));
        let tar = crate::tar::archive(leaf, &[(CONFIG_FILE, config.as_bytes())]);
        self.shared
            .engine
            .put_archive(ctx, id, &format!("/{parent}"), &tar)
    }

    fn current_config(&self, ctx: &CallContext, c: &Container) -> Result<Option<String>> {
        Ok(self
            .shared
            .engine
            .read_file(ctx, &c.id, &format!("{CONFIG_DIR}/{CONFIG_FILE}"))?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Bring the Service's container to `plan`.
    fn apply(&self, ctx: &CallContext, svc: &Service, plan: &Plan) -> Result<()> {
        let lock = self.lock_for(&self.name(svc));
        let _one_at_a_time = lock.lock().unwrap_or_else(|e| e.into_inner());
        let engine = &self.shared.engine;
        let config = haproxy::render(plan);
        let existing = self.ours(ctx, svc)?;
        if let Some(c) = &existing {
            let labels = c.labels();
            let stale = !c.is_up()
                || c.config.image != self.shared.config.load_balancer.image
                || labels
                    .get(PUBLISHED_LABEL)
                    .map(String::as_str)
                    .unwrap_or("")
                    != self.published(plan);
            if stale {
                log::info!(
                    "containers load balancer {}: re-creating {} (state {}, image {})",
                    plan.service,
                    c.short_name(),
                    c.state.status,
                    c.config.image
                );
                engine.remove(ctx, &c.id)?;
                self.loaded.lock().expect("loaded").remove(&c.id);
            } else {
                let confirmed = self.loaded.lock().expect("loaded").get(&c.id) == Some(&config);
                if confirmed && self.current_config(ctx, c)?.as_deref() == Some(config.as_str()) {
                    return Ok(());
                }
                self.loaded.lock().expect("loaded").remove(&c.id);
                self.put_config(ctx, &c.id, &config)?;
                self.reload(ctx, &c.id, c.short_name())?;
                self.loaded
                    .lock()
                    .expect("loaded")
                    .insert(c.id.clone(), config.clone());
                log::info!(
                    "containers load balancer {}: reloaded {} ({} hosts)",
                    plan.service,
                    c.short_name(),
                    plan.backends.len()
                );
                return Ok(());
            }
        }
        self.create(ctx, svc, plan, &config)
    }

    fn status(&self, svc: &Service, c: &Container) -> Result<LoadBalancerStatus> {
        let cfg = &self.shared.config;
        let ip = c
            .network_settings
            .networks
            .get(&cfg.network)
            .map(|ep| ep.ip_address.clone())
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                ProviderError::other(format!(
                    "load balancer container {} has no IPv4 address on network {} (state {})",
                    c.short_name(),
                    cfg.network,
                    c.state.status
                ))
            })?;
        let ports: Vec<PortStatus> = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
            .map(|p| PortStatus {
                port: p.port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                error: None,
            })
            .collect();
        let entry = |ip: String| LoadBalancerIngress {
            ip: Some(ip),
            ip_mode: Some("Proxy".into()),
            ports: Some(ports.clone()),
            ..Default::default()
        };
        let mut ingress = vec![entry(ip)];
        if !c
            .labels()
            .get(PUBLISHED_LABEL)
            .map(String::is_empty)
            .unwrap_or(true)
        {
            ingress.push(entry(LOOPBACK.into()));
        }
        Ok(LoadBalancerStatus {
            ingress: Some(ingress),
        })
    }
}

impl ContainerLoadBalancer {
    /// Remove the proxies of this cluster whose Service no longer exists (deleted while no
    /// host ran): containers with [`OWNER_LABEL`] = the cluster and a [`SERVICE_LABEL`] naming a
    /// Service the API server answers 404 for. Any other answer keeps the container. Returns the
    /// names removed.
    pub fn collect_garbage(&self, ctx: &CallContext, host: &Host) -> Result<Vec<String>> {
        let cluster = &self.shared.config.cluster;
        let mut removed = Vec::new();
        for c in self
            .shared
            .engine
            .list_by_label(ctx, &format!("{OWNER_LABEL}={cluster}"))?
        {
            let c = Container::from(c);
            let labels = c.labels();
            if labels.get(OWNER_LABEL) != Some(cluster) {
                continue;
            }
            let Some((ns, name)) = labels.get(SERVICE_LABEL).and_then(|k| k.split_once('/')) else {
                continue;
            };
            let path = format!("/api/v1/namespaces/{ns}/services/{name}");
            match host.kube_request(ctx, "GET", &path, "", &[]) {
                Ok((404, _)) => {
                    self.shared.engine.remove(ctx, &c.id)?;
                    self.loaded.lock().expect("loaded").remove(&c.id);
                    log::info!(
                        "containers load balancer: removed {} (Service {ns}/{name} no longer exists)",
                        c.short_name()
                    );
                    removed.push(c.short_name().to_string());
                }
                Ok(_) => {}
                Err(e) => log::warn!(
                    "containers load balancer: could not look up Service {ns}/{name} of {}: {e}; kept",
                    c.short_name()
                ),
            }
        }
        Ok(removed)
    }
}

impl LoadBalancer for ContainerLoadBalancer {
    fn get_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>> {
        match self.ours(ctx, service)? {
            Some(c) if c.is_up() => self.status(service, &c).map(Some),
            // Exists but stopped: no address to publish; Ensure re-creates it.
            Some(_) => Ok(Some(LoadBalancerStatus::default())),
            None => Ok(None),
        }
    }

    fn get_load_balancer_name(
        &self,
        _ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<String> {
        Ok(self.name(service))
    }

    fn ensure_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<Option<LoadBalancerStatus>> {
        let plan = self.plan(ctx, service, nodes)?;
        self.apply(ctx, service, &plan)?;
        let c = self.ours(ctx, service)?.ok_or_else(|| {
            ProviderError::other(format!(
                "load balancer container {} vanished right after it was made",
                self.name(service)
            ))
        })?;
        if !c.is_up() {
            return Err(ProviderError::other(format!(
                "load balancer container {} is {} right after its start (see `podman logs {}`)",
                c.short_name(),
                c.state.status,
                c.short_name()
            )));
        }
        self.status(service, &c).map(Some)
    }

    fn update_load_balancer(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<()> {
        let plan = self.plan(ctx, service, nodes)?;
        self.apply(ctx, service, &plan)
    }

    fn ensure_load_balancer_deleted(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<()> {
        let name = self.name(service);
        match self.shared.engine.inspect(ctx, &name)? {
            Some(c) if self.is_ours(&c, service) => {
                self.shared.engine.remove(ctx, &c.id)?;
                self.loaded.lock().expect("loaded").remove(&c.id);
                log::info!(
                    "containers load balancer {}: removed {name}",
                    service_key(service)
                );
                Ok(())
            }
            Some(_) => {
                log::warn!(
                    "containers load balancer {}: container {name} was not made by ccm-host; left alone",
                    service_key(service)
                );
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn load_balancer_hosts(
        &self,
        ctx: &CallContext,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<Vec<String>>> {
        let Some(c) = self.ours(ctx, service)? else {
            return Ok(None);
        };
        Ok(Some(
            self.current_config(ctx, &c)?
                .map(|t| haproxy::hosts(&t))
                .unwrap_or_default(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_short() {
        let svc: Service = serde_json::from_value(
            json!({"metadata": {"name": "lb-service-local", "namespace": "default"}}),
        )
        .unwrap();
        let a = container_name("kind", &svc);
        assert_eq!(a, container_name("kind", &svc));
        assert_eq!(a.len(), "ccmlb-".len() + 12);
        assert_ne!(a, container_name("other", &svc));
    }

    #[test]
    fn load_results_and_alerts_are_read_from_the_log() {
        let log = "[NOTICE]   (1) : New worker (7) forked\n[NOTICE]   (1) : Loading success.\n[ALERT]    (7) : backend 'x' has no server available!\n[NOTICE]   (1) : Reloading HAProxy\n[ALERT]    (1) : config : parsing [/etc/ccm-lb/haproxy.cfg:21] : unknown keyword 'garbage'\n[ALERT]    (1) : config : Fatal errors found in configuration.\n[WARNING]  (1) : Loading failure!\n";
        let r = load_results(log);
        assert_eq!(r.len(), 2);
        assert!(r[1].contains("failure"));
        assert_eq!(
            last_alerts(log, 2),
            "[ALERT]    (1) : config : parsing [/etc/ccm-lb/haproxy.cfg:21] : unknown keyword 'garbage' | [ALERT]    (1) : config : Fatal errors found in configuration."
        );
    }

    #[test]
    fn ranges_are_checked() {
        assert!(valid_range("10.0.0.0/8"));
        assert!(valid_range("fd00::/64"));
        assert!(!valid_range("10.0.0.0/33"));
        assert!(!valid_range("10.0.0.0"));
        assert!(!valid_range("x/8"));
    }
}
