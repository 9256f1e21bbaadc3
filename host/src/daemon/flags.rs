//! `ccm-host run` flags: upstream's names, defaults and value syntax (Go durations, Go booleans
//! as `--x`, `--x=false` or `--x false`, comma lists) so an existing CCM manifest works with only
//! the image and `--plugin-dir` changed. Upstream's flags that ccm-host accepts without their
//! effect are in [`super::upstream_flags`]; the logging flags are global (`crate::cli`).
//! Values are validated together and every problem is reported on its own line (exit code 2).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args};

use super::provider_set::ProviderSet;
use super::selection::ControllerSelection;
use super::upstream_flags::{parse_go_bool, FeatureGates, UpstreamArgs};
use crate::args::PluginDirArgs;
use crate::controllers::node_lifecycle::{
    NodeDeletionMode, NodeDeletionPolicy, DEFAULT_DELETION_CONFIRMATIONS, DEFAULT_DELETION_MODE,
    DEFAULT_DELETION_ON_INSTANCE_NOT_FOUND,
};
use crate::controllers::ControllerConfig;
use crate::provider::bulk::{DEFAULT_INSTANCE_BATCH_SIZE, DEFAULT_INSTANCE_BATCH_WINDOW};

/// The `run --help` heading of the flags ccm-host adds to upstream's.
const ADDITIONS: &str = "ccm-host additions (beyond upstream)";

/// Flags of `ccm-host run`. `run --help` shows upstream's flags (this struct's, then
/// [`UpstreamArgs`]) apart from ccm-host's additions ([`ADDITIONS`], and the plugin flags).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Upstream cloud-controller-manager flags")]
pub struct RunArgs {
    /// Where the plugins come from.
    #[command(flatten)]
    pub plugins: PluginDirArgs,

    // ---- generic ----
    /// The provider to run (a name registered by a plugin). Required. Several, comma
    /// separated, run side by side in a hybrid cluster, each on the nodes it owns (beyond
    /// upstream; docs/hybrid-clusters.md); the first is the default provider.
    #[arg(
        long,
        env = "CCM_CLOUD_PROVIDER",
        default_value = "",
        hide_default_value = true
    )]
    pub cloud_provider: String,
    /// Path of the cloud provider configuration file, handed to the provider factory. With
    /// several providers: NAME=PATH, once per provider that takes a config.
    #[arg(long, env = "CCM_CLOUD_CONFIG", action = ArgAction::Append)]
    pub cloud_config: Vec<PathBuf>,
    /// The platforms (providerID prefixes, e.g. aws:// or aws) a provider owns, instead of the
    /// ones it declares; [NAME=]PLATFORM, comma separated or repeated (KEP-5778). Given, it
    /// also makes a single provider leave the nodes of other platforms alone.
    #[arg(help_heading = ADDITIONS, long, value_delimiter = ',', action = ArgAction::Append)]
    pub cloud_provider_platforms: Vec<String>,
    /// Which nodes a provider's load balancers target when ownership is enforced:
    /// [NAME=]owned (default: the nodes it owns) or [NAME=]all (beyond upstream).
    #[arg(help_heading = ADDITIONS, long, value_delimiter = ',', action = ArgAction::Append)]
    pub load_balancer_hosts: Vec<String>,
    /// With ownership enforced: how long after its creation a node without a providerID is
    /// left to the controllers that may initialise it before the lifecycle controller acts on
    /// it (KEP-5778; beyond upstream).
    #[arg(help_heading = ADDITIONS, long, default_value = "5m")]
    pub provider_id_grace_period: String,
    /// Controllers to run: '*' (all), 'name' or '-name' (canonical names or aliases).
    #[arg(long, value_delimiter = ',', default_value = "*")]
    pub controllers: Vec<String>,
    /// The instance prefix for the cluster, passed to load balancer and route calls.
    #[arg(long, default_value = "kubernetes")]
    pub cluster_name: String,
    /// CIDR range of pods in the cluster (one, or one IPv4 and one IPv6).
    #[arg(long, default_value = "")]
    pub cluster_cidr: String,
    /// Whether to configure cloud routes for the pod CIDRs of nodes.
    #[arg(long, default_value_t = true, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub configure_cloud_routes: bool,
    /// Accepted for compatibility; it no longer gates the route controller (as upstream).
    #[arg(long, default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub allocate_node_cidrs: bool,
    /// Accepted for compatibility; unused by the cloud controllers.
    #[arg(long, default_value = "RangeAllocator")]
    pub cidr_allocator_type: String,
    /// Run even if the provider has no cluster ID (HasClusterID false). Deprecated upstream.
    #[arg(long, default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub allow_untagged_cloud: bool,
    /// Period of the route controller.
    #[arg(long, default_value = "10s")]
    pub route_reconciliation_period: String,
    /// Period of the node lifecycle controller.
    #[arg(long, default_value = "5s")]
    pub node_monitor_period: String,
    /// Period of the node address loop.
    #[arg(long, default_value = "5m")]
    pub node_status_update_frequency: String,
    /// Accepted for compatibility (deprecated no-op upstream).
    #[arg(long, default_value = "0s")]
    pub node_sync_period: String,
    /// Node initialisation workers (must be > 0). Default 64, upstream's is 1: 5,000 new nodes
    /// with a 50 ms cloud take ~4.5 s instead of ~4 min (see BENCHMARKS.md).
    #[arg(long, default_value_t = 64)]
    pub concurrent_node_syncs: i64,
    /// Workers of the node address loop (0 = use --concurrent-node-syncs).
    #[arg(long, default_value_t = 0)]
    pub concurrent_node_status_updates: i64,
    /// Service workers (must be > 0).
    #[arg(long, default_value_t = 1)]
    pub concurrent_service_syncs: i64,
    /// Also handle LoadBalancer services of this class (repeatable): CLASS for the default
    /// provider, CLASS=PROVIDER for another. Beyond upstream, off by default.
    #[arg(help_heading = ADDITIONS, long = "load-balancer-class")]
    pub load_balancer_classes: Vec<String>,
    /// Leave services without a loadBalancerClass to another controller.
    #[arg(help_heading = ADDITIONS, long, default_value_t = false, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub ignore_classless_services: bool,
    /// Delete a Node only after this many "does not exist" answers in a row from the cloud,
    /// spread over at least one --node-monitor-period; any other answer starts the count again
    /// (beyond upstream; 1 = upstream).
    #[arg(help_heading = ADDITIONS, long, value_name = "N", default_value_t = i64::from(DEFAULT_DELETION_CONFIRMATIONS))]
    pub node_deletion_confirmations: i64,
    /// What a confirmed "does not exist" does: delete (upstream) the Node, or report it with a
    /// Warning event and ccm_node_deletions_withheld_total and keep the Node (beyond upstream).
    #[arg(help_heading = ADDITIONS, long, value_name = "delete|report", default_value = DEFAULT_DELETION_MODE.as_str())]
    pub node_deletion_mode: String,
    /// Count an InstancesV2 InstanceExists that fails with InstanceNotFound as "does not
    /// exist" (beyond upstream, which keeps such a Node forever; k/k#141364).
    #[arg(help_heading = ADDITIONS, long, default_value_t = DEFAULT_DELETION_ON_INSTANCE_NOT_FOUND, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub node_deletion_on_instance_not_found: bool,
    /// Deadline of every provider call.
    #[arg(help_heading = ADDITIONS, long, default_value = "30s")]
    pub provider_call_timeout: String,
    /// Host-wide budget of cloud provider calls per second, shared fairly between the
    /// controllers (beyond upstream). 0 = unlimited.
    #[arg(help_heading = ADDITIONS, long, env = "CCM_CLOUD_API_QPS", default_value_t = 0.0)]
    pub cloud_api_qps: f64,
    /// Provider calls allowed at once above --cloud-api-qps.
    #[arg(help_heading = ADDITIONS, long, env = "CCM_CLOUD_API_BURST", default_value_t = 10)]
    pub cloud_api_burst: i64,
    /// With a provider that offers bulk instance lookups (ABI 1.1): how long the first node
    /// asked about waits for others before one call asks about all of them (beyond upstream).
    #[arg(help_heading = ADDITIONS, long, default_value_t = crate::runtime::duration::format(DEFAULT_INSTANCE_BATCH_WINDOW))]
    pub instance_batch_window: String,
    /// The most nodes asked about in one bulk instance lookup (beyond upstream).
    #[arg(help_heading = ADDITIONS, long, value_name = "N", default_value_t = DEFAULT_INSTANCE_BATCH_SIZE as i64)]
    pub instance_batch_size: i64,
    /// How often the --cloud-config file is checked for changes (a mounted Secret or ConfigMap
    /// included); changed bytes are handed to the provider without a restart (beyond
    /// upstream). 0 = no hot reload.
    #[arg(help_heading = ADDITIONS, long, default_value_t = crate::runtime::duration::format(super::cloud_config::DEFAULT_RELOAD_PERIOD))]
    pub cloud_config_reload_period: String,
    /// How often the provider's health probe (ABI 1.1) runs; its last answer is the
    /// cloud-provider check of /readyz (beyond upstream). 0 = no probe.
    #[arg(help_heading = ADDITIONS, long, default_value = "30s")]
    pub provider_health_period: String,

    // ---- leader election ----
    /// Run leader election (only the lease holder runs controllers).
    #[arg(long, default_value_t = true, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true", value_parser = parse_go_bool, action = ArgAction::Set)]
    pub leader_elect: bool,
    /// Lease duration.
    #[arg(long, default_value = "15s")]
    pub leader_elect_lease_duration: String,
    /// Renew deadline.
    #[arg(long, default_value = "10s")]
    pub leader_elect_renew_deadline: String,
    /// Retry period.
    #[arg(long, default_value = "2s")]
    pub leader_elect_retry_period: String,
    /// Lock type; only `leases` is supported.
    #[arg(long, default_value = "leases")]
    pub leader_elect_resource_lock: String,
    /// Lease name.
    #[arg(long, default_value = "cloud-controller-manager")]
    pub leader_elect_resource_name: String,
    /// Lease namespace.
    #[arg(long, default_value = "kube-system")]
    pub leader_elect_resource_namespace: String,

    // ---- client ----
    /// Path to a kubeconfig (default: in-cluster config, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Address of the API server (overrides the kubeconfig's server).
    #[arg(long)]
    pub master: Option<String>,
    /// Client-side requests per second to the API server.
    #[arg(long, default_value_t = 20.0)]
    pub kube_api_qps: f64,
    /// Client-side burst to the API server.
    #[arg(long, default_value_t = 30)]
    pub kube_api_burst: i64,

    // ---- serving ----
    /// HTTPS port of the endpoints (/healthz, /readyz, /metrics), behind delegated
    /// authentication and authorization; 0 disables serving.
    #[arg(long, default_value_t = 10258)]
    pub secure_port: u16,
    /// Address the endpoints listen on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: IpAddr,
    /// PEM certificate (chain) of the endpoints; without it a self-signed certificate (see
    /// --cert-dir).
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long)]
    pub tls_private_key_file: Option<PathBuf>,

    /// Upstream flags accepted for compatibility.
    #[command(flatten)]
    pub upstream: UpstreamArgs,
}

/// Validated settings of a run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// The providers to run, with their configs, platforms and load-balancer classes.
    pub providers: ProviderSet,
    /// `--provider-id-grace-period`.
    pub provider_id_grace_period: Duration,
    /// Controller settings (the load-balancer classes are the default provider's).
    pub controllers: ControllerConfig,
    /// Selected controllers.
    pub selection: ControllerSelection,
    /// Provider call deadline.
    pub provider_call_timeout: Duration,
    /// Cloud-call budget (0 = unlimited).
    pub cloud_api_qps: f64,
    /// Cloud-call burst.
    pub cloud_api_burst: u32,
    /// `--instance-batch-window`.
    pub instance_batch_window: Duration,
    /// `--instance-batch-size`.
    pub instance_batch_size: usize,
    /// `--cloud-config-reload-period` (zero: no hot reload).
    pub cloud_config_reload_period: Duration,
    /// `--provider-health-period` (zero: no probe).
    pub provider_health_period: Duration,
    /// Client-side API request rate.
    pub kube_api_qps: f64,
    /// Client-side API burst.
    pub kube_api_burst: u32,
    /// `--tls-cert-file` and `--tls-private-key-file`, when given.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
    /// `--feature-gates`.
    pub feature_gates: FeatureGates,
}

impl RunArgs {
    /// Validate every flag; `Err` holds one message per problem.
    pub fn validate(&self) -> Result<RunSettings, Vec<String>> {
        let mut errors = Vec::new();
        let mut duration = |flag: &str, value: &str, allow_zero: bool| -> Duration {
            match crate::runtime::duration::parse(value) {
                Ok(d) if d.is_zero() && !allow_zero => {
                    errors.push(format!("--{flag} must be greater than 0, got {value:?}"));
                    d
                }
                Ok(d) => d,
                Err(e) => {
                    errors.push(format!("--{flag}: {e}"));
                    Duration::ZERO
                }
            }
        };
        let route_period = duration(
            "route-reconciliation-period",
            &self.route_reconciliation_period,
            false,
        );
        let monitor = duration("node-monitor-period", &self.node_monitor_period, false);
        let status = duration(
            "node-status-update-frequency",
            &self.node_status_update_frequency,
            false,
        );
        let _ = duration("node-sync-period", &self.node_sync_period, true);
        let call_timeout = duration("provider-call-timeout", &self.provider_call_timeout, false);
        let batch_window = duration("instance-batch-window", &self.instance_batch_window, true);
        let reload_period = duration(
            "cloud-config-reload-period",
            &self.cloud_config_reload_period,
            true,
        );
        let health_period = duration("provider-health-period", &self.provider_health_period, true);
        let lease = duration(
            "leader-elect-lease-duration",
            &self.leader_elect_lease_duration,
            false,
        );
        let renew = duration(
            "leader-elect-renew-deadline",
            &self.leader_elect_renew_deadline,
            false,
        );
        let retry = duration(
            "leader-elect-retry-period",
            &self.leader_elect_retry_period,
            false,
        );

        let grace = duration(
            "provider-id-grace-period",
            &self.provider_id_grace_period,
            true,
        );
        let providers = ProviderSet::parse(
            &self.cloud_provider,
            &self.cloud_config,
            &self.cloud_provider_platforms,
            &self.load_balancer_classes,
            &self.load_balancer_hosts,
            self.ignore_classless_services,
            &mut errors,
        );
        if self.concurrent_node_syncs <= 0 {
            errors.push(format!(
                "--concurrent-node-syncs must be greater than 0, got {} (0 would silently stop node initialisation)",
                self.concurrent_node_syncs
            ));
        }
        if self.concurrent_node_status_updates < 0 {
            errors.push(format!(
                "--concurrent-node-status-updates must be 0 or more, got {}",
                self.concurrent_node_status_updates
            ));
        }
        if self.concurrent_service_syncs <= 0 {
            errors.push(format!(
                "--concurrent-service-syncs must be greater than 0, got {} (0 would silently stop load balancer work)",
                self.concurrent_service_syncs
            ));
        }
        let deletion_confirmations = u32::try_from(self.node_deletion_confirmations)
            .ok()
            .filter(|n| *n >= 1);
        if deletion_confirmations.is_none() {
            errors.push(format!(
                "--node-deletion-confirmations must be at least 1 (1 deletes on the first \"does not exist\" answer, as upstream), got {}",
                self.node_deletion_confirmations
            ));
        }
        let deletion_mode = NodeDeletionMode::parse(&self.node_deletion_mode);
        if deletion_mode.is_none() {
            errors.push(format!(
                "--node-deletion-mode must be \"delete\" or \"report\", got {:?}",
                self.node_deletion_mode
            ));
        }
        if self.leader_elect {
            if self.leader_elect_resource_lock != "leases" {
                errors.push(format!(
                    "--leader-elect-resource-lock must be \"leases\", got {:?}",
                    self.leader_elect_resource_lock
                ));
            }
            if !lease.is_zero() && !renew.is_zero() && renew >= lease {
                errors.push(format!(
                    "--leader-elect-renew-deadline ({}) must be less than --leader-elect-lease-duration ({})",
                    self.leader_elect_renew_deadline, self.leader_elect_lease_duration
                ));
            }
            if lease.as_secs() == 0 && !lease.is_zero() {
                errors.push("--leader-elect-lease-duration must be at least 1s".into());
            }
            // client-go's elector: renewDeadline > JitterFactor (1.2) × retryPeriod, because a
            // retry can come up to 20% late. Otherwise the leader gives up its lease before its
            // next renewal attempt, every time.
            let jittered_retry = Duration::from_nanos((retry.as_nanos() as f64 * 1.2) as u64);
            if !renew.is_zero() && !retry.is_zero() && renew <= jittered_retry {
                errors.push(format!(
                    "--leader-elect-retry-period ({}) must be less than --leader-elect-renew-deadline ({}) / 1.2: \
                     retries can come 20% late (client-go's JitterFactor), and the leader would lose its lease",
                    self.leader_elect_retry_period, self.leader_elect_renew_deadline
                ));
            }
        }
        if !self.cloud_api_qps.is_finite() || self.cloud_api_qps < 0.0 {
            errors.push(format!(
                "--cloud-api-qps must be 0 (unlimited) or a positive number, got {}",
                self.cloud_api_qps
            ));
        }
        if self.cloud_api_burst <= 0 || self.cloud_api_burst > i64::from(u32::MAX) {
            errors.push(format!(
                "--cloud-api-burst must be greater than 0, got {}",
                self.cloud_api_burst
            ));
        }
        let batch_size = usize::try_from(self.instance_batch_size)
            .ok()
            .filter(|n| *n >= 1);
        if batch_size.is_none() {
            errors.push(format!(
                "--instance-batch-size must be at least 1, got {}",
                self.instance_batch_size
            ));
        }
        let tls = match (&self.tls_cert_file, &self.tls_private_key_file) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            (Some(_), None) => {
                errors.push("--tls-cert-file needs --tls-private-key-file".into());
                None
            }
            (None, Some(_)) => {
                errors.push("--tls-private-key-file needs --tls-cert-file".into());
                None
            }
        };
        if !self.kube_api_qps.is_finite() || self.kube_api_qps <= 0.0 {
            errors.push(format!(
                "--kube-api-qps must be greater than 0, got {}",
                self.kube_api_qps
            ));
        }
        if self.kube_api_burst <= 0 || self.kube_api_burst > i64::from(u32::MAX) {
            errors.push(format!(
                "--kube-api-burst must be greater than 0, got {}",
                self.kube_api_burst
            ));
        }
        let feature_gates = self.upstream.validate(self.secure_port, &mut errors);
        let selection = match ControllerSelection::parse(&self.controllers) {
            Ok(s) => Some(s),
            Err(errs) => {
                errors.extend(errs.into_iter().map(|e| format!("--controllers: {e}")));
                None
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        let to_usize = |v: i64| usize::try_from(v).unwrap_or(1);
        let default_classes = providers.default_provider().load_balancer_classes.clone();
        Ok(RunSettings {
            providers,
            provider_id_grace_period: grace,
            controllers: ControllerConfig {
                cluster_name: self.cluster_name.clone(),
                node_monitor_period: monitor,
                node_status_update_frequency: status,
                concurrent_node_syncs: to_usize(self.concurrent_node_syncs),
                concurrent_node_status_updates: to_usize(self.concurrent_node_status_updates),
                concurrent_service_syncs: to_usize(self.concurrent_service_syncs),
                route_reconciliation_period: route_period,
                configure_cloud_routes: self.configure_cloud_routes,
                cluster_cidr: self.cluster_cidr.clone(),
                load_balancer_classes: default_classes,
                ignore_classless_services: self.ignore_classless_services,
                node_deletion: NodeDeletionPolicy {
                    confirmations: deletion_confirmations.unwrap_or(DEFAULT_DELETION_CONFIRMATIONS),
                    mode: deletion_mode.unwrap_or(DEFAULT_DELETION_MODE),
                    on_instance_not_found: self.node_deletion_on_instance_not_found,
                },
                // Set by the daemon when ownership is enforced.
                provider_id_grace_period: None,
            },
            selection: selection.expect("no errors means the selection parsed"),
            provider_call_timeout: call_timeout,
            cloud_api_qps: self.cloud_api_qps,
            cloud_api_burst: u32::try_from(self.cloud_api_burst).unwrap_or(1),
            instance_batch_window: batch_window,
            instance_batch_size: batch_size.unwrap_or(DEFAULT_INSTANCE_BATCH_SIZE),
            cloud_config_reload_period: reload_period,
            provider_health_period: health_period,
            kube_api_qps: self.kube_api_qps,
            kube_api_burst: u32::try_from(self.kube_api_burst).unwrap_or(1),
            tls,
            lease_duration: lease,
            renew_deadline: renew,
            retry_period: retry,
            feature_gates,
        })
    }

    /// `--feature-gates` as far as it is valid (the defaults otherwise; [`RunArgs::validate`]
    /// reports the problems).
    pub fn feature_gates(&self) -> FeatureGates {
        FeatureGates::parse(&self.upstream.feature_gates).unwrap_or_default()
    }

    /// The flags given that have no effect in ccm-host (see [`UpstreamArgs::no_effect`]).
    pub fn no_effect_flags(&self) -> Vec<String> {
        let mut names = self.upstream.no_effect();
        if let Ok(selection) = ControllerSelection::parse(&self.controllers) {
            names.extend(selection.vendor_only());
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> RunArgs {
        let mut full = vec!["ccm-host", "--plugin-dir", "/plugins"];
        full.extend_from_slice(args);
        Wrapper::try_parse_from(full).expect("flags parse").run
    }

    #[test]
    fn defaults_match_upstream() {
        let a = parse(&["--cloud-provider", "fake"]);
        let s = a.validate().unwrap();
        assert_eq!(s.controllers.cluster_name, "kubernetes");
        assert_eq!(s.controllers.node_monitor_period, Duration::from_secs(5));
        assert_eq!(
            s.controllers.node_status_update_frequency,
            Duration::from_secs(300)
        );
        assert_eq!(
            s.controllers.route_reconciliation_period,
            Duration::from_secs(10)
        );
        // Beyond upstream (1): the figures of BENCHMARKS.md.
        assert_eq!(s.controllers.concurrent_node_syncs, 64);
        assert_eq!(s.controllers.concurrent_service_syncs, 1);
        assert_eq!(
            (s.lease_duration, s.renew_deadline, s.retry_period),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2)
            )
        );
        assert!(a.leader_elect && a.configure_cloud_routes && !a.allocate_node_cidrs);
        assert_eq!(a.secure_port, 10258);
        assert_eq!((a.kube_api_qps, a.kube_api_burst), (20.0, 30));
        assert_eq!((s.kube_api_qps, s.kube_api_burst), (20.0, 30));
        assert_eq!(
            (s.cloud_api_qps, s.cloud_api_burst),
            (0.0, 10),
            "no budget by default"
        );
        assert_eq!(s.tls, None);
        // Bulk instance lookups: the provider layer's defaults, written once.
        assert_eq!(
            (s.instance_batch_window, s.instance_batch_size),
            (Duration::from_millis(100), 500)
        );
        let provider = crate::provider::ProviderOptions::default();
        assert_eq!(
            (s.instance_batch_window, s.instance_batch_size),
            (provider.instance_batch_window, provider.instance_batch_size)
        );
        assert_eq!(a.leader_elect_resource_name, "cloud-controller-manager");
        assert_eq!(a.leader_elect_resource_namespace, "kube-system");
        assert_eq!(s.selection.enabled().len(), 4);
        // Safe node deletion: upstream's behaviour, the same value as the controllers' default.
        assert_eq!(
            s.controllers.node_deletion,
            NodeDeletionPolicy {
                confirmations: 1,
                mode: NodeDeletionMode::Delete,
                on_instance_not_found: false
            }
        );
        assert_eq!(
            s.controllers.node_deletion,
            ControllerConfig::default().node_deletion
        );
    }

    #[test]
    fn node_deletion_flags() {
        let s = parse(&[
            "--cloud-provider=fake",
            "--node-deletion-confirmations=3",
            "--node-deletion-mode",
            "report",
            "--node-deletion-on-instance-not-found",
        ])
        .validate()
        .unwrap();
        assert_eq!(
            s.controllers.node_deletion,
            NodeDeletionPolicy {
                confirmations: 3,
                mode: NodeDeletionMode::Report,
                on_instance_not_found: true
            }
        );
        let s = parse(&[
            "--cloud-provider=fake",
            "--node-deletion-mode=delete",
            "--node-deletion-on-instance-not-found=false",
        ])
        .validate()
        .unwrap();
        assert_eq!(s.controllers.node_deletion, NodeDeletionPolicy::default());
        let errs = parse(&[
            "--cloud-provider=fake",
            "--node-deletion-confirmations=0",
            "--node-deletion-mode=Report",
        ])
        .validate()
        .unwrap_err();
        assert_eq!(
            errs,
            [
                "--node-deletion-confirmations must be at least 1 (1 deletes on the first \"does not exist\" answer, as upstream), got 0",
                "--node-deletion-mode must be \"delete\" or \"report\", got \"Report\"",
            ]
        );
        let errs = parse(&["--cloud-provider=fake", "--node-deletion-confirmations=-1"])
            .validate()
            .unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        let errs = parse(&[
            "--cloud-provider=fake",
            "--node-deletion-confirmations=4294967296",
        ])
        .validate()
        .unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
    }

    #[test]
    fn every_problem_is_reported() {
        let a = parse(&[
            "--concurrent-node-syncs=0",
            "--concurrent-service-syncs=0",
            "--node-monitor-period=5",
            "--controllers=*,-bogus",
            "--leader-elect-renew-deadline=20s",
        ]);
        let errs = a.validate().unwrap_err();
        assert_eq!(errs.len(), 6, "{errs:#?}");
        assert!(errs
            .iter()
            .any(|e| e == crate::daemon::provider_set::EMPTY_CLOUD_PROVIDER));
        assert!(errs
            .iter()
            .any(|e| e.starts_with("--concurrent-node-syncs must be greater than 0")));
        assert!(errs
            .iter()
            .any(|e| e.starts_with("--concurrent-service-syncs must be greater than 0")));
        assert!(errs
            .iter()
            .any(|e| e.contains("--node-monitor-period") && e.contains("missing unit")));
        assert!(errs
            .iter()
            .any(|e| e == "--controllers: \"bogus\" is not in the list of known controllers"));
        assert!(errs
            .iter()
            .any(|e| e.contains("must be less than --leader-elect-lease-duration")));
    }

    #[test]
    fn budget_client_limits_and_tls_flags_are_validated() {
        let a = parse(&[
            "--cloud-provider=fake",
            "--cloud-api-qps=NaN",
            "--cloud-api-burst=0",
            "--kube-api-qps=0",
            "--kube-api-burst=-3",
            "--tls-private-key-file=/k.pem",
        ]);
        let errs = a.validate().unwrap_err();
        assert_eq!(
            errs,
            [
                "--cloud-api-qps must be 0 (unlimited) or a positive number, got NaN",
                "--cloud-api-burst must be greater than 0, got 0",
                "--tls-private-key-file needs --tls-cert-file",
                "--kube-api-qps must be greater than 0, got 0",
                "--kube-api-burst must be greater than 0, got -3",
            ]
        );
        let s = parse(&[
            "--cloud-provider=fake",
            "--cloud-api-qps=12.5",
            "--cloud-api-burst=3",
            "--tls-cert-file=/c.pem",
            "--tls-private-key-file=/k.pem",
        ])
        .validate()
        .unwrap();
        assert_eq!((s.cloud_api_qps, s.cloud_api_burst), (12.5, 3));
        assert_eq!(s.tls, Some(("/c.pem".into(), "/k.pem".into())));
    }

    #[test]
    fn reload_and_health_periods_default_and_zero_turns_them_off() {
        let s = parse(&["--cloud-provider=fake"]).validate().unwrap();
        assert_eq!(
            (s.cloud_config_reload_period, s.provider_health_period),
            (Duration::from_secs(5), Duration::from_secs(30))
        );
        let s = parse(&[
            "--cloud-provider=fake",
            "--cloud-config-reload-period=0",
            "--provider-health-period=250ms",
        ])
        .validate()
        .unwrap();
        assert_eq!(
            (s.cloud_config_reload_period, s.provider_health_period),
            (Duration::ZERO, Duration::from_millis(250))
        );
        let errs = parse(&["--cloud-provider=fake", "--provider-health-period=5"])
            .validate()
            .unwrap_err();
        assert!(errs[0].starts_with("--provider-health-period:"), "{errs:?}");
    }

    #[test]
    fn instance_batch_flags_are_validated() {
        let s = parse(&[
            "--cloud-provider=fake",
            "--instance-batch-window=250ms",
            "--instance-batch-size=50",
        ])
        .validate()
        .unwrap();
        assert_eq!(
            (s.instance_batch_window, s.instance_batch_size),
            (Duration::from_millis(250), 50)
        );
        let s = parse(&["--cloud-provider=fake", "--instance-batch-window=0s"])
            .validate()
            .unwrap();
        assert_eq!(s.instance_batch_window, Duration::ZERO, "0: no waiting");
        let errs = parse(&[
            "--cloud-provider=fake",
            "--instance-batch-window=100",
            "--instance-batch-size=0",
        ])
        .validate()
        .unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].starts_with("--instance-batch-window:"), "{errs:?}");
        assert_eq!(errs[1], "--instance-batch-size must be at least 1, got 0");
    }

    #[test]
    fn flags_take_go_durations_and_booleans_with_values() {
        let a = parse(&[
            "--cloud-provider=fake",
            "--node-status-update-frequency=1m30s",
            "--configure-cloud-routes=false",
            "--leader-elect=false",
            "--controllers=cloud-node,service",
        ]);
        let s = a.validate().unwrap();
        assert_eq!(
            s.controllers.node_status_update_frequency,
            Duration::from_secs(90)
        );
        assert!(!a.configure_cloud_routes && !a.leader_elect);
        assert_eq!(s.selection.enabled().len(), 2);
    }

    #[test]
    fn booleans_take_go_syntax_with_or_without_a_value() {
        // `--x` alone (as upstream's pflag), `--x=V` with Go's spellings, and `--x V` (what
        // ccm-host accepted before; `ccm-host sandbox` still passes it that way).
        let a = parse(&[
            "--cloud-provider=fake",
            "--allow-untagged-cloud",
            "--allocate-node-cidrs=T",
            "--configure-cloud-routes=0",
            "--leader-elect",
            "false",
            "--ignore-classless-services",
        ]);
        assert!(a.allow_untagged_cloud && a.allocate_node_cidrs && a.ignore_classless_services);
        assert!(!a.configure_cloud_routes && !a.leader_elect);
        let mut full = vec!["ccm-host", "--plugin-dir", "/plugins"];
        full.push("--leader-elect=maybe");
        assert!(Wrapper::try_parse_from(full).is_err());
    }

    #[test]
    fn retry_period_must_stay_below_the_renew_deadline_with_jitter() {
        let problems = |renew: &str, retry: &str| {
            let renew = format!("--leader-elect-renew-deadline={renew}");
            let retry = format!("--leader-elect-retry-period={retry}");
            parse(&["--cloud-provider=fake", &renew, &retry])
                .validate()
                .err()
                .unwrap_or_default()
        };
        let expected = "--leader-elect-retry-period (2s) must be less than \
                        --leader-elect-renew-deadline (2s) / 1.2: retries can come 20% late \
                        (client-go's JitterFactor), and the leader would lose its lease";
        assert_eq!(problems("2s", "2s"), [expected]);
        assert_eq!(problems("2s", "5s").len(), 1, "retry > renew");
        // client-go: renewDeadline must be greater than retryPeriod × 1.2.
        assert_eq!(problems("12s", "10s").len(), 1, "12s is not > 12s");
        assert!(problems("12001ms", "10s").is_empty());
        assert!(problems("10s", "2s").is_empty(), "upstream's defaults");
        assert!(problems("2s", "1s").is_empty());
        // Only with leader election, as upstream builds no elector without it.
        let off = parse(&[
            "--cloud-provider=fake",
            "--leader-elect=false",
            "--leader-elect-retry-period=20s",
        ]);
        assert!(off.validate().is_ok());
    }

    #[test]
    fn the_kubernetes_docs_example_and_vendor_chart_flags_are_accepted() {
        // The example manifest of the Kubernetes docs (cloud-controller-manager administration).
        let docs = parse(&[
            "--cloud-provider=fake",
            "--leader-elect=true",
            "--use-service-account-credentials",
            "--allocate-node-cidrs=true",
            "--configure-cloud-routes=true",
            "--cluster-cidr=172.17.0.0/16",
        ]);
        docs.validate().unwrap();
        assert_eq!(
            docs.no_effect_flags(),
            ["--use-service-account-credentials"]
        );
        // hcloud-cloud-controller-manager's chart.
        let hcloud = parse(&[
            "--allow-untagged-cloud",
            "--cloud-provider=fake",
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=false",
            "--route-reconciliation-period=30s",
            "--webhook-secure-port=0",
            "--leader-elect=false",
        ]);
        let s = hcloud.validate().unwrap();
        assert_eq!(
            s.controllers.route_reconciliation_period,
            Duration::from_secs(30)
        );
        assert!(!s
            .feature_gates
            .enabled("CloudControllerManagerWatchBasedRoutesReconciliation"));
        assert!(hcloud.no_effect_flags().is_empty());
        // openstack-cloud-controller-manager's chart (after its `--v=2`, a global flag).
        let openstack = parse(&[
            "--cloud-config=/etc/config/cloud.conf",
            "--cluster-name=kubernetes",
            "--cloud-provider=fake",
            "--use-service-account-credentials=false",
            "--controllers=cloud-node,cloud-node-lifecycle,route,service",
            "--bind-address=127.0.0.1",
        ]);
        assert_eq!(openstack.validate().unwrap().selection.enabled().len(), 4);
        assert!(openstack.no_effect_flags().is_empty());
    }

    #[test]
    fn upstream_flag_problems_are_reported_with_the_others() {
        let errs = parse(&[
            "--cloud-provider=fake",
            "--concurrent-service-syncs=0",
            "--feature-gates=NoSuchGate=true",
            "--webhooks=validate-nodes",
            "--min-resync-period=soon",
        ])
        .validate()
        .unwrap_err();
        assert_eq!(errs.len(), 4, "{errs:#?}");
        assert!(errs.contains(&"--feature-gates: unrecognized feature gate: NoSuchGate".into()));
        assert!(errs
            .iter()
            .any(|e| e.starts_with("--webhooks: \"validate-nodes\"")));
        assert!(errs.iter().any(|e| e.starts_with("--min-resync-period: ")));
    }
}
