//! The haproxy configuration of one Service's proxy container.
//!
//! One `frontend`/`backend` pair per Service port (TCP only: haproxy 2.x does not proxy UDP),
//! listening on the Service port on every IPv4 address of the container, forwarding to every
//! host's InternalIP at the port's NodePort, round-robin (`sessionAffinity: ClientIP`: by source
//! address). Health checks: a TCP connect to the NodePort (`externalTrafficPolicy: Cluster`), or
//! `GET /healthz` on `healthCheckNodePort` (`Local`, so that only nodes with a ready endpoint get
//! traffic, as kube-proxy answers there). `loadBalancerSourceRanges` become a
//! `tcp-request connection reject` rule (upstream semantics: empty = everyone).
//!
//! haproxy runs in master-worker mode (`-W`); a reload is `SIGUSR2` to the master, which starts
//! new workers with the new file and hands them the listening sockets through the stats socket
//! declared with `expose-fd listeners` (so no connection is refused while the old workers close
//! their listeners), and the old workers finish their established connections (at most
//! `hard-stop-after`). The header lines `# host <node> <address>` record the hosts for
//! read-back (`load_balancer_hosts`).

use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

/// Where the configuration lives in the proxy container.
pub const CONFIG_DIR: &str = "/etc/ccm-lb";
/// The file name in [`CONFIG_DIR`].
pub const CONFIG_FILE: &str = "haproxy.cfg";
/// How long old workers may keep established connections after a reload.
pub const HARD_STOP_AFTER: &str = "15m";

/// One forwarded port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The Service port.
    pub port: i32,
    /// The NodePort every host serves it on.
    pub node_port: i32,
}

/// A backend host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    /// The Node's name.
    pub name: String,
    /// Its address.
    pub address: IpAddr,
}

/// Everything the configuration is made of.
#[derive(Debug, Clone)]
pub struct Plan {
    /// `namespace/name`.
    pub service: String,
    /// Ports.
    pub ports: Vec<Port>,
    /// Hosts.
    pub backends: Vec<Backend>,
    /// `healthCheckNodePort` when `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<i32>,
    /// `sessionAffinity: ClientIP`.
    pub client_ip_affinity: bool,
    /// Normalised `loadBalancerSourceRanges` (empty: everyone).
    pub source_ranges: Vec<String>,
    /// Health-check interval.
    pub check_interval: Duration,
}

/// The configuration text.
pub fn render(plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Written by ccm-host's containers provider for Service {}; rewritten on every change.",
        plan.service
    );
    for b in &plan.backends {
        let _ = writeln!(s, "# host {} {}", b.name, b.address);
    }
    let _ = writeln!(
        s,
        "global\n    stats socket /tmp/ccm-haproxy.sock mode 600 expose-fd listeners level user\n    hard-stop-after {HARD_STOP_AFTER}\n"
    );
    let _ = writeln!(
        s,
        "defaults\n    mode tcp\n    timeout connect 3s\n    timeout client 1h\n    timeout server 1h\n    timeout client-fin 30s\n    timeout server-fin 30s\n"
    );
    let inter = plan.check_interval.as_millis().max(100);
    for p in &plan.ports {
        let _ = writeln!(s, "frontend port-{}", p.port);
        let _ = writeln!(s, "    bind :{}", p.port);
        if !plan.source_ranges.is_empty() {
            let _ = writeln!(
                s,
                "    tcp-request connection reject unless {{ src {} }}",
                plan.source_ranges.join(" ")
            );
        }
        let _ = writeln!(s, "    default_backend nodeport-{}\n", p.node_port);
    }
    let mut node_ports: Vec<i32> = plan.ports.iter().map(|p| p.node_port).collect();
    node_ports.sort_unstable();
    node_ports.dedup();
    for np in node_ports {
        let _ = writeln!(s, "backend nodeport-{np}");
        let balance = if plan.client_ip_affinity {
            "source"
        } else {
            "roundrobin"
        };
        let _ = writeln!(s, "    balance {balance}");
        if plan.health_check_node_port.is_some() {
            let _ = writeln!(s, "    option httpchk GET /healthz");
        }
        let _ = writeln!(s, "    default-server inter {inter}ms fall 2 rise 1");
        for b in &plan.backends {
            let check = match plan.health_check_node_port {
                Some(hc) => format!("check port {hc}"),
                None => "check".to_string(),
            };
            let addr = match b.address {
                IpAddr::V4(a) => format!("{a}:{np}"),
                IpAddr::V6(a) => format!("ipv6@{a}:{np}"),
            };
            let _ = writeln!(s, "    server {} {addr} {check}", b.name);
        }
        s.push('\n');
    }
    s
}

/// The host names recorded in a configuration's header.
pub fn hosts(config: &str) -> Vec<String> {
    config
        .lines()
        .filter_map(|l| l.strip_prefix("# host "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            service: "default/web".into(),
            ports: vec![
                Port {
                    port: 80,
                    node_port: 30080,
                },
                Port {
                    port: 443,
                    node_port: 30443,
                },
            ],
            backends: vec![
                Backend {
                    name: "kind-worker".into(),
                    address: "10.89.0.2".parse().unwrap(),
                },
                Backend {
                    name: "kind-worker2".into(),
                    address: "fd00::3".parse().unwrap(),
                },
            ],
            health_check_node_port: None,
            client_ip_affinity: false,
            source_ranges: vec![],
            check_interval: Duration::from_secs(2),
        }
    }

    #[test]
    fn every_port_forwards_to_every_host() {
        let text = render(&plan());
        assert!(text.contains("frontend port-80\n    bind :80\n    default_backend nodeport-30080"));
        assert!(text.contains("    server kind-worker 10.89.0.2:30443 check\n"));
        assert!(text.contains("    server kind-worker2 ipv6@fd00::3:30080 check\n"));
        assert!(text.contains("expose-fd listeners"));
        assert!(text.contains("balance roundrobin"));
        assert!(!text.contains("httpchk"));
        assert_eq!(hosts(&text), ["kind-worker", "kind-worker2"]);
    }

    #[test]
    fn local_policy_affinity_and_ranges() {
        let mut p = plan();
        p.health_check_node_port = Some(32000);
        p.client_ip_affinity = true;
        p.source_ranges = vec!["10.0.0.0/8".into(), "192.168.1.0/24".into()];
        let text = render(&p);
        assert!(text.contains("option httpchk GET /healthz"));
        assert!(text.contains("10.89.0.2:30080 check port 32000"));
        assert!(text.contains("balance source"));
        assert!(
            text.contains("tcp-request connection reject unless { src 10.0.0.0/8 192.168.1.0/24 }")
        );
        p.backends.clear();
        assert!(hosts(&render(&p)).is_empty());
    }
}
