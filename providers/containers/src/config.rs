//! The cloud config (YAML or JSON; every key optional, unknown keys refused):
//!
//! ```yaml
//! socket: /run/podman/podman.sock     # default: the first of /var/run/docker.sock, /run/podman/podman.sock that answers
//! cluster: kind                       # the cluster's name: value of clusterLabel on its node containers
//! clusterLabel: io.x-k8s.kind.cluster # kind's label
//! network: kind                       # the cluster's container network (first InternalIP, proxies join it)
//! instanceTypeLabel: ""               # container label giving the instance type; default: the image name
//! zoneLabel: topology.kubernetes.io/zone
//! regionLabel: topology.kubernetes.io/region
//! loadBalancer:
//!   image: localhost/ccm-haproxy:latest   # an image with haproxy (2.x) on PATH
//!   publishOnLoopback: false              # also publish each Service port on 127.0.0.1:<port>
//!   healthCheckInterval: 2s
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde::Deserialize;

use crate::engine::DEFAULT_SOCKETS;

/// kind's node label (value: the cluster name).
pub const KIND_CLUSTER_LABEL: &str = "io.x-k8s.kind.cluster";
/// The proxy image when none is configured (build it with the Containerfile of
/// `providers/containers/images/`).
pub const DEFAULT_PROXY_IMAGE: &str = "localhost/ccm-haproxy:latest";

/// The parsed cloud config.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ContainersConfig {
    /// The runtime's socket; `None`: the default paths.
    pub socket: Option<PathBuf>,
    /// The cluster's name.
    pub cluster: String,
    /// The label whose value is the cluster's name on node containers.
    pub cluster_label: String,
    /// The cluster's network.
    pub network: String,
    /// Label with the instance type; empty: the image name.
    pub instance_type_label: String,
    /// Label with the zone.
    pub zone_label: String,
    /// Label with the region.
    pub region_label: String,
    /// Load balancers.
    pub load_balancer: LoadBalancerConfig,
}

/// `loadBalancer:`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadBalancerConfig {
    /// The proxy image (haproxy on PATH).
    pub image: String,
    /// Publish every Service port on 127.0.0.1 of the machine too.
    pub publish_on_loopback: bool,
    /// Health-check interval (Go duration: `2s`, `500ms`).
    pub health_check_interval: String,
}

impl Default for ContainersConfig {
    fn default() -> Self {
        Self {
            socket: None,
            cluster: "kind".into(),
            cluster_label: KIND_CLUSTER_LABEL.into(),
            network: "kind".into(),
            instance_type_label: String::new(),
            zone_label: "topology.kubernetes.io/zone".into(),
            region_label: "topology.kubernetes.io/region".into(),
            load_balancer: LoadBalancerConfig::default(),
        }
    }
}

impl Default for LoadBalancerConfig {
    fn default() -> Self {
        Self {
            image: DEFAULT_PROXY_IMAGE.into(),
            publish_on_loopback: false,
            health_check_interval: "2s".into(),
        }
    }
}

/// A Go-style duration of whole milliseconds or seconds (`500ms`, `2s`, `1m`).
fn parse_duration(text: &str) -> Option<Duration> {
    let t = text.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n * 60)),
        _ => None,
    }
}

impl ContainersConfig {
    /// Parse and validate; `None` (no `--cloud-config`) = every default.
    pub fn parse(bytes: Option<&[u8]>) -> Result<Self> {
        let cfg: Self = match bytes {
            None => Self::default(),
            Some(b) if String::from_utf8_lossy(b).trim().is_empty() => Self::default(),
            Some(b) => yaml_serde::from_slice(b).map_err(|e| {
                ProviderError::invalid_config(format!(
                    "containers cloud config: {}",
                    e.to_string().replace('\n', " ")
                ))
            })?,
        };
        let mut problems = Vec::new();
        for (key, value) in [
            ("cluster", &cfg.cluster),
            ("clusterLabel", &cfg.cluster_label),
            ("network", &cfg.network),
            ("loadBalancer.image", &cfg.load_balancer.image),
        ] {
            if value.trim().is_empty() {
                problems.push(format!("{key} must not be empty"));
            }
        }
        match cfg.health_check_interval() {
            Some(d) if d >= Duration::from_millis(100) => {}
            _ => problems.push(format!(
                "loadBalancer.healthCheckInterval {:?} is not a duration of at least 100ms (e.g. 2s)",
                cfg.load_balancer.health_check_interval
            )),
        }
        if let Some(s) = &cfg.socket {
            if !s.is_absolute() {
                problems.push(format!("socket {:?} must be an absolute path", s.display()));
            }
        }
        if !problems.is_empty() {
            return Err(ProviderError::invalid_config(format!(
                "containers cloud config: {}",
                problems.join("; ")
            )));
        }
        Ok(cfg)
    }

    /// The health-check interval.
    pub fn health_check_interval(&self) -> Option<Duration> {
        parse_duration(&self.load_balancer.health_check_interval)
    }

    /// The socket to use: the configured one, else the first default that accepts a
    /// connection, else the first that exists, else the first default (whose absence the first
    /// call reports).
    pub fn socket_path(&self) -> PathBuf {
        if let Some(s) = &self.socket {
            return s.clone();
        }
        let defaults = || DEFAULT_SOCKETS.iter().map(Path::new);
        defaults()
            .find(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
            .or_else(|| defaults().find(|p| p.exists()))
            .unwrap_or(Path::new(DEFAULT_SOCKETS[0]))
            .to_path_buf()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_kind_s() {
        let c = ContainersConfig::parse(None).unwrap();
        assert_eq!(c.cluster, "kind");
        assert_eq!(c.cluster_label, KIND_CLUSTER_LABEL);
        assert_eq!(c.network, "kind");
        assert_eq!(c.health_check_interval(), Some(Duration::from_secs(2)));
        let c = ContainersConfig::parse(Some(
            b"socket: /tmp/x.sock\ncluster: dev\nloadBalancer: {publishOnLoopback: true, healthCheckInterval: 500ms}\n",
        ))
        .unwrap();
        assert_eq!(c.socket_path(), PathBuf::from("/tmp/x.sock"));
        assert!(c.load_balancer.publish_on_loopback);
        assert_eq!(c.health_check_interval(), Some(Duration::from_millis(500)));
    }

    #[test]
    fn every_bad_key_is_one_line() {
        let e = ContainersConfig::parse(Some(b"sockett: /x\n")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
        assert!(e.message().contains("sockett"), "{e}");
        assert!(!e.message().contains('\n'), "{e}");
        let e = ContainersConfig::parse(Some(
            b"socket: rel.sock\ncluster: ''\nloadBalancer: {healthCheckInterval: soon}\n",
        ))
        .unwrap_err();
        let m = e.message();
        assert!(m.contains("cluster must not be empty"), "{m}");
        assert!(m.contains("healthCheckInterval \"soon\""), "{m}");
        assert!(m.contains("\"rel.sock\" must be an absolute path"), "{m}");
    }
}
