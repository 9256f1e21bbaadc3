//! The flags of upstream's `cloud-controller-manager --help` beyond ccm-host's own (`flags.rs`),
//! accepted so that vendor manifests and charts start unchanged: the delegated authentication and
//! authorization flags and `--cert-dir`, which work as upstream's (`delegated_auth.rs`,
//! `serving.rs`), and flags whose effect ccm-host does not have (request-header authentication,
//! profiling, leader migration, webhooks, …). Values keep
//! upstream's syntax and are validated as upstream validates them; every flag given that asks
//! for something ccm-host does not do is named in one warning at start
//! ([`UpstreamArgs::no_effect`]). `docs/flags.md` lists every upstream flag and what it does here.
//!
//! Also here: Go's boolean syntax ([`parse_go_bool`]) and `--feature-gates` with upstream's
//! known gates ([`FeatureGates`]).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use clap::{ArgAction, Args};

/// Go's `strconv.ParseBool`, which pflag uses for boolean flags (`--x`, `--x=false`, `--x=1`).
pub fn parse_go_bool(value: &str) -> Result<bool, String> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{value:?} is not a boolean (true or false)")),
    }
}

// ---- feature gates ----

/// Maturity of a feature gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Alpha.
    Alpha,
    /// Beta.
    Beta,
    /// Generally available.
    Ga,
    /// Deprecated.
    Deprecated,
}

/// One feature gate upstream's cloud-controller-manager registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// The gate's name.
    pub name: &'static str,
    /// Its default.
    pub default: bool,
    /// Its maturity.
    pub stage: Stage,
    /// Locked to its default: setting the other value is an error.
    pub locked: bool,
}

const fn gate(name: &'static str, default: bool, stage: Stage, locked: bool) -> Gate {
    Gate {
        name,
        default,
        stage,
        locked,
    }
}

/// `AllAlpha=true` sets every alpha gate not given explicitly (upstream's special gate).
pub const ALL_ALPHA: &str = "AllAlpha";
/// `AllBeta=true` sets every beta gate not given explicitly.
pub const ALL_BETA: &str = "AllBeta";
/// Guards the alpha logging flags (`--log-text-split-stream`, `--log-*-info-buffer-size`).
pub const LOGGING_ALPHA_OPTIONS: &str = "LoggingAlphaOptions";
/// Guards `--logging-format=json`.
pub const LOGGING_BETA_OPTIONS: &str = "LoggingBetaOptions";
/// Guards the requestheader UID headers of request-header authentication (not implemented).
pub const REMOTE_REQUEST_HEADER_UID: &str = "RemoteRequestHeaderUID";

/// Every gate upstream's cloud-controller-manager registers (k8s.io/apiserver's features,
/// component-base's logging, metrics and zpages features, controller-manager's features, and the
/// two special gates), with the spec of Kubernetes 1.37, or of 1.36 for gates 1.37 removed, so
/// that manifests written for either release are accepted.
pub const KNOWN_GATES: &[Gate] = &[
    gate(ALL_ALPHA, false, Stage::Alpha, false),
    gate(ALL_BETA, false, Stage::Beta, false),
    gate("APIResponseCompression", true, Stage::Beta, false),
    gate("APIServerIdentity", true, Stage::Beta, false),
    gate("APIServerTracing", true, Stage::Ga, true),
    gate(
        "APIServerWebhookAuthenticationToken",
        false,
        Stage::Alpha,
        false,
    ),
    gate("APIServingWithRoutine", false, Stage::Alpha, false),
    gate(
        "AggregatedDiscoveryRemoveBetaType",
        true,
        Stage::Deprecated,
        true,
    ),
    gate("AllowParsingUserUIDFromCertAuth", true, Stage::Beta, false),
    gate(
        "AllowUnsafeMalformedObjectDeletion",
        true,
        Stage::Beta,
        false,
    ),
    gate("AnonymousAuthConfigurableEndpoints", true, Stage::Ga, true),
    gate("AuthorizeWithSelectors", true, Stage::Ga, true),
    gate("BtreeWatchCache", true, Stage::Ga, true),
    gate("CBORServingAndStorage", false, Stage::Alpha, false),
    gate(
        "CloudControllerManagerWatchBasedRoutesReconciliation",
        false,
        Stage::Alpha,
        false,
    ),
    gate("CloudControllerManagerWebhook", false, Stage::Alpha, false),
    gate("ComponentFlagz", true, Stage::Beta, false),
    gate("ComponentStatusz", true, Stage::Beta, false),
    gate("ConcurrentWatchObjectDecode", true, Stage::Beta, false),
    gate("ConsistentListFromCache", true, Stage::Ga, true),
    gate(
        "ConsistentListFromCacheSkipTimeoutFallback",
        false,
        Stage::Alpha,
        false,
    ),
    gate("ConstrainedImpersonation", true, Stage::Beta, false),
    gate("ContextualLogging", true, Stage::Beta, false),
    gate(
        "ControllerManagerReleaseLeaderElectionLockOnExit",
        false,
        Stage::Alpha,
        false,
    ),
    gate("CoordinatedLeaderElection", false, Stage::Beta, false),
    gate("DeclarativeValidation", true, Stage::Ga, true),
    gate("DeclarativeValidationBeta", true, Stage::Beta, false),
    gate(
        "DeclarativeValidationTakeover",
        false,
        Stage::Deprecated,
        true,
    ),
    gate("DetectCacheInconsistency", true, Stage::Beta, false),
    gate("EtcdRangeStream", true, Stage::Beta, false),
    gate(
        "ExcludeAdmissionWebhookVirtualResources",
        true,
        Stage::Beta,
        false,
    ),
    gate("KMSv1", false, Stage::Deprecated, false),
    gate("ListFromCacheSnapshot", true, Stage::Beta, false),
    gate(LOGGING_ALPHA_OPTIONS, false, Stage::Alpha, false),
    gate(LOGGING_BETA_OPTIONS, true, Stage::Beta, false),
    gate(
        "ManifestBasedAdmissionControlConfig",
        true,
        Stage::Beta,
        false,
    ),
    gate("MutatingAdmissionPolicy", true, Stage::Ga, false),
    gate("NativeHistograms", true, Stage::Beta, false),
    gate("OpenAPIEnums", true, Stage::Beta, false),
    gate(REMOTE_REQUEST_HEADER_UID, true, Stage::Beta, false),
    gate("ResilientWatchCacheInitialization", true, Stage::Ga, true),
    gate("RetryGenerateName", true, Stage::Ga, true),
    gate("SeparateCacheWatchRPC", false, Stage::Deprecated, true),
    gate("ShardedListAndWatch", false, Stage::Alpha, false),
    gate("SizeBasedListCostEstimate", true, Stage::Beta, false),
    gate("StorageVersionAPI", false, Stage::Alpha, false),
    gate("StorageVersionHash", true, Stage::Beta, false),
    gate("StreamingCollectionEncodingToJSON", true, Stage::Ga, true),
    gate(
        "StreamingCollectionEncodingToProtobuf",
        true,
        Stage::Ga,
        true,
    ),
    gate(
        "StructuredAuthenticationConfiguration",
        true,
        Stage::Ga,
        true,
    ),
    gate(
        "StructuredAuthenticationConfigurationEgressSelector",
        true,
        Stage::Beta,
        false,
    ),
    gate(
        "StructuredAuthenticationConfigurationJWKSMetrics",
        true,
        Stage::Beta,
        false,
    ),
    gate(
        "TokenRequestServiceAccountUIDValidation",
        true,
        Stage::Beta,
        false,
    ),
    gate(
        "UnauthenticatedHTTP2DOSMitigation",
        true,
        Stage::Beta,
        false,
    ),
    gate(
        "UnknownVersionInteroperabilityProxy",
        true,
        Stage::Beta,
        false,
    ),
    gate(
        "WatchCacheInitializationPostStartHook",
        true,
        Stage::Ga,
        true,
    ),
    gate("WatchList", true, Stage::Beta, false),
    gate("WatchListCompression", true, Stage::Beta, false),
    gate("WebhookRoundTripLoadBalancing", true, Stage::Beta, false),
];

/// Gates that need no note whatever their value: the logging gates are honoured; the
/// lock-release gate is unused by upstream's cloud-controller-manager too (ccm-host always
/// releases the lease on a graceful exit); the route controller always reacts to node changes
/// as the watch-based mode does, and keeps the periodic pass.
const GATES_WITHOUT_NOTE: &[&str] = &[
    LOGGING_ALPHA_OPTIONS,
    LOGGING_BETA_OPTIONS,
    "ControllerManagerReleaseLeaderElectionLockOnExit",
    "CloudControllerManagerWatchBasedRoutesReconciliation",
];

/// The value of `--feature-gates` (every occurrence; later settings win, as upstream).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FeatureGates {
    set: BTreeMap<&'static str, bool>,
}

impl FeatureGates {
    /// Parse `KEY=BOOL,KEY=BOOL` values as upstream does: unknown gates, values that are not
    /// booleans and values a locked gate cannot take are errors, one per problem.
    pub fn parse(values: &[String]) -> Result<FeatureGates, Vec<String>> {
        let mut set = BTreeMap::new();
        let mut errors = Vec::new();
        for item in values.iter().flat_map(|v| v.split(',')) {
            if item.is_empty() {
                continue;
            }
            let Some((key, raw)) = item.split_once('=') else {
                errors.push(format!(
                    "--feature-gates: missing bool value for {}",
                    item.trim()
                ));
                continue;
            };
            let (key, raw) = (key.trim(), raw.trim());
            let Ok(value) = parse_go_bool(raw) else {
                errors.push(format!(
                    "--feature-gates: invalid value of {key}={raw} (must be true or false)"
                ));
                continue;
            };
            let Some(gate) = KNOWN_GATES.iter().find(|g| g.name == key) else {
                errors.push(format!("--feature-gates: unrecognized feature gate: {key}"));
                continue;
            };
            if gate.locked && value != gate.default {
                errors.push(format!(
                    "--feature-gates: cannot set feature gate {key} to {value}, feature is locked to {}",
                    gate.default
                ));
                continue;
            }
            set.insert(gate.name, value);
        }
        if errors.is_empty() {
            Ok(FeatureGates { set })
        } else {
            Err(errors)
        }
    }

    /// Whether `name` is enabled: its explicit value, else `AllAlpha`/`AllBeta` for an alpha or
    /// beta gate, else its default. Unknown names are disabled.
    pub fn enabled(&self, name: &str) -> bool {
        let Some(gate) = KNOWN_GATES.iter().find(|g| g.name == name) else {
            return false;
        };
        if let Some(value) = self.set.get(gate.name) {
            return *value;
        }
        let all = match gate.stage {
            Stage::Alpha if gate.name != ALL_ALPHA => self.set.get(ALL_ALPHA),
            Stage::Beta if gate.name != ALL_BETA => self.set.get(ALL_BETA),
            _ => None,
        };
        all.copied().unwrap_or(gate.default)
    }

    /// `Name=value` of every gate given a value other than its default whose effect ccm-host
    /// does not have.
    pub fn without_effect(&self) -> Vec<String> {
        self.set
            .iter()
            .filter(|(name, value)| {
                !GATES_WITHOUT_NOTE.contains(name)
                    && KNOWN_GATES
                        .iter()
                        .any(|g| g.name == **name && g.default != **value)
            })
            .map(|(name, value)| format!("{name}={value}"))
            .collect()
    }
}

// ---- the flags ----

/// Upstream flags accepted for compatibility. Each field is `None`/empty when not given.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Upstream flags accepted for compatibility (see docs/flags.md)")]
pub struct UpstreamArgs {
    // ---- generic ----
    /// Enable or disable upstream's feature gates: KEY=BOOL,... (repeatable). Unknown gates are
    /// errors as upstream; only the logging gates change what ccm-host does.
    #[arg(long = "feature-gates", value_name = "KEY=BOOL,...")]
    pub feature_gates: Vec<String>,
    /// [no effect] Per-controller service account credentials; the controllers use the host's
    /// credentials.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub use_service_account_credentials: Option<bool>,
    /// [no effect] Informer resync period (upstream 12h); the shared informers do not resync.
    #[arg(long, value_name = "DURATION")]
    pub min_resync_period: Option<String>,
    /// [no effect] Content type of API requests (upstream protobuf); ccm-host sends JSON.
    #[arg(long, value_name = "TYPE")]
    pub kube_api_content_type: Option<String>,
    /// [no effect] Interval between controller starts (upstream 0).
    #[arg(long, value_name = "DURATION")]
    pub controller_start_interval: Option<String>,
    /// Unused by the cloud controllers, as upstream.
    #[arg(long, value_name = "PLUGIN")]
    pub external_cloud_volume_plugin: Option<String>,

    // ---- debugging ----
    /// [no effect] /debug/pprof is not served (upstream default true).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub profiling: Option<bool>,
    /// [no effect] Block profiling.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub contention_profiling: Option<bool>,

    // ---- leader migration ----
    /// [no effect] Leader migration from kube-controller-manager.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub enable_leader_migration: Option<bool>,
    /// [no effect] Leader migration configuration file.
    #[arg(long, value_name = "FILE")]
    pub leader_migration_config: Option<PathBuf>,

    // ---- webhooks (ccm-host has none, like upstream with a provider that registers none) ----
    /// Webhooks to enable: '*', 'name', '-name'. ccm-host has no webhooks: any name is an error.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub webhooks: Option<Vec<String>>,
    /// Webhook port (upstream 10260; 0 disables). Nothing is served: there are no webhooks.
    #[arg(long, value_name = "PORT")]
    pub webhook_secure_port: Option<i64>,
    /// Webhook address. Nothing is served: there are no webhooks.
    #[arg(long, value_name = "IP")]
    pub webhook_bind_address: Option<IpAddr>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub webhook_disable_http2_serving: Option<bool>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "DIR")]
    pub webhook_cert_dir: Option<PathBuf>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "FILE")]
    pub webhook_tls_cert_file: Option<PathBuf>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "FILE")]
    pub webhook_tls_private_key_file: Option<PathBuf>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "SUITES", value_delimiter = ',')]
    pub webhook_tls_cipher_suites: Option<Vec<String>>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub webhook_tls_curve_preferences: Option<Vec<i32>>,
    /// Webhook serving option; nothing is served.
    #[arg(long, value_name = "VERSION")]
    pub webhook_tls_min_version: Option<String>,
    /// Webhook serving option (repeatable); nothing is served.
    #[arg(long, value_name = "CERT,KEY[:NAMES]")]
    pub webhook_tls_sni_cert_key: Vec<String>,

    // ---- secure serving (beyond --bind-address, --secure-port and the TLS files) ----
    /// Without --tls-cert-file: the directory of the self-signed certificate
    /// (cloud-controller-manager.crt and .key: read when present, else generated and written).
    /// Empty: generated in memory at each start.
    #[arg(long, value_name = "DIR")]
    pub cert_dir: Option<PathBuf>,
    /// The endpoints never serve HTTP/2, as with true.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub disable_http2_serving: Option<bool>,
    /// TLS cipher suites (Go names) of the secure port: the AEAD suites with forward secrecy
    /// (rustls); others are refused. Governs TLS 1.2; TLS 1.3 suites are restricted only when
    /// the list names some.
    #[arg(long, value_name = "SUITES", value_delimiter = ',')]
    pub tls_cipher_suites: Option<Vec<String>>,
    /// [no effect] TLS key exchange groups (numeric IDs).
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    pub tls_curve_preferences: Option<Vec<i32>>,
    /// Minimum TLS version: VersionTLS12 (default) or VersionTLS13; ccm-host serves TLS 1.2 and
    /// 1.3 only, so VersionTLS10 and VersionTLS11 are refused.
    #[arg(long, value_name = "VERSION")]
    pub tls_min_version: Option<String>,
    /// [no effect] SNI certificate and key (repeatable).
    #[arg(long, value_name = "CERT,KEY[:NAMES]")]
    pub tls_sni_cert_key: Vec<String>,
    /// No HTTP/2 is served, so no stream limit applies.
    #[arg(long, value_name = "N")]
    pub http2_max_streams_per_connection: Option<i64>,
    /// [no effect] SO_REUSEPORT on the listening socket.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub permit_port_sharing: Option<bool>,
    /// The listening socket always has SO_REUSEADDR, as with true.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub permit_address_sharing: Option<bool>,

    // ---- delegated authentication ----
    /// kubeconfig of the API server that checks bearer tokens (TokenReview); default: the
    /// in-cluster configuration, else tokens are not checked (every request is anonymous).
    #[arg(long, value_name = "FILE")]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// How long token reviews are cached (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub authentication_token_webhook_cache_ttl: Option<String>,
    /// Without --client-ca-file, do not read the client CA from configmap
    /// kube-system/extension-apiserver-authentication (then client certificates are not
    /// authenticated).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub authentication_skip_lookup: Option<bool>,
    /// Start even when that configmap cannot be read (client certificates are then not
    /// authenticated).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true",
          value_parser = parse_go_bool, action = ArgAction::Set)]
    pub authentication_tolerate_lookup_failure: Option<bool>,
    /// CA bundle that client certificates are verified against (user: the common name, groups:
    /// the organizations); default: the cluster's, from the configmap above.
    #[arg(long, value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// [no effect] Request-header (front proxy) authentication is not implemented.
    #[arg(long, value_name = "FILE")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// [no effect] Request-header (front proxy) authentication is not implemented.
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub requestheader_username_headers: Option<Vec<String>>,
    /// [no effect] Request-header (front proxy) authentication is not implemented.
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub requestheader_uid_headers: Option<Vec<String>>,
    /// [no effect] Request-header (front proxy) authentication is not implemented.
    #[arg(long, value_name = "HEADERS", value_delimiter = ',')]
    pub requestheader_group_headers: Option<Vec<String>>,
    /// [no effect] Request-header (front proxy) authentication is not implemented.
    #[arg(long, value_name = "PREFIXES", value_delimiter = ',')]
    pub requestheader_extra_headers_prefix: Option<Vec<String>>,
    /// [no effect] Request-header (front proxy) authentication is not implemented.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub requestheader_allowed_names: Option<Vec<String>>,

    // ---- delegated authorization ----
    /// kubeconfig of the API server that authorizes requests (SubjectAccessReview); default:
    /// the in-cluster configuration, else only the always-allowed paths are served.
    #[arg(long, value_name = "FILE")]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// How long allowed access reviews are cached (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub authorization_webhook_cache_authorized_ttl: Option<String>,
    /// How long denied access reviews are cached (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub authorization_webhook_cache_unauthorized_ttl: Option<String>,
    /// Paths served without authorization (default /healthz,/readyz,/livez; a trailing * makes
    /// a prefix).
    #[arg(long, value_name = "PATHS", value_delimiter = ',')]
    pub authorization_always_allow_paths: Option<Vec<String>>,
}

/// Upstream's default `--webhook-secure-port`.
pub const WEBHOOK_SECURE_PORT: i64 = 10260;

/// Go's TLS cipher suite names (`crypto/tls` secure and insecure suites plus the two legacy
/// ChaCha20 names), which upstream's `--tls-cipher-suites` accepts.
const GO_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_RSA_WITH_RC4_128_SHA",
];

/// Whether Go's `crypto/tls` knows this suite name (upstream accepts it).
pub fn is_go_cipher_suite(name: &str) -> bool {
    GO_CIPHER_SUITES.contains(&name)
}

/// Upstream's `--tls-min-version` values.
const TLS_VERSIONS: &[&str] = &[
    "VersionTLS10",
    "VersionTLS11",
    "VersionTLS12",
    "VersionTLS13",
];

/// A comma list as pflag's string slices read it: `--x=` is the empty list.
fn list(value: &Option<Vec<String>>) -> &[String] {
    match value.as_deref() {
        Some([only]) if only.is_empty() => &[],
        Some(items) => items,
        None => &[],
    }
}

/// pflag's `namedCertKey`: `cert,key` or `cert,key:name,name`.
fn check_named_cert_key(value: &str) -> Result<(), &'static str> {
    let keycert = match value.split_once(':') {
        Some((keycert, names)) => {
            if names.trim().is_empty() {
                return Err("empty names list is not allowed");
            }
            keycert
        }
        None => value,
    };
    if keycert.split(',').count() != 2 {
        return Err("expected comma separated certificate and key file paths");
    }
    Ok(())
}

impl UpstreamArgs {
    /// The secure port's TLS policy of `--tls-cipher-suites` and `--tls-min-version`.
    pub fn tls_policy(&self) -> Result<super::serving::TlsPolicy, Vec<String>> {
        super::serving::TlsPolicy::from_flags(
            list(&self.tls_cipher_suites),
            self.tls_min_version.as_deref(),
        )
    }

    /// Check the values as upstream does, adding one message per problem to `errors`; returns
    /// the feature gates (the defaults when `--feature-gates` is invalid).
    pub fn validate(&self, secure_port: u16, errors: &mut Vec<String>) -> FeatureGates {
        let gates = FeatureGates::parse(&self.feature_gates).unwrap_or_else(|errs| {
            errors.extend(errs);
            FeatureGates::default()
        });
        for (flag, value) in [
            ("min-resync-period", &self.min_resync_period),
            ("controller-start-interval", &self.controller_start_interval),
            (
                "authentication-token-webhook-cache-ttl",
                &self.authentication_token_webhook_cache_ttl,
            ),
            (
                "authorization-webhook-cache-authorized-ttl",
                &self.authorization_webhook_cache_authorized_ttl,
            ),
            (
                "authorization-webhook-cache-unauthorized-ttl",
                &self.authorization_webhook_cache_unauthorized_ttl,
            ),
        ] {
            if let Some(Err(e)) = value.as_deref().map(crate::runtime::duration::parse) {
                errors.push(format!("--{flag}: {e}"));
            }
        }

        if let Err(e) = super::delegated_auth::AlwaysAllowPaths::parse(list(
            &self.authorization_always_allow_paths,
        )) {
            errors.push(e);
        }

        // Webhooks: ccm-host registers none, so every name is unknown (upstream checks names
        // against the webhooks the provider build registers).
        for name in list(&self.webhooks) {
            if name != "*" {
                errors.push(format!(
                    "--webhooks: {:?} is not in the list of known webhooks (ccm-host has no webhooks)",
                    name.trim_start_matches('-')
                ));
            }
        }
        // As upstream, the default webhook port counts too.
        let webhook_port = self.webhook_secure_port.unwrap_or(WEBHOOK_SECURE_PORT);
        if !(0..=65535).contains(&webhook_port) {
            errors.push(format!(
                "--webhook-secure-port {webhook_port} must be between 0 and 65535, inclusive. A value of 0 disables the webhook endpoint entirely."
            ));
        } else if webhook_port != 0 && webhook_port == i64::from(secure_port) {
            errors.push(format!(
                "--webhook-secure-port cannot be the same value as --secure-port ({webhook_port}; \
                 the webhook port defaults to {WEBHOOK_SECURE_PORT}, --webhook-secure-port=0 turns it off)"
            ));
        }

        // Secure serving: upstream checks these when it serves (--secure-port > 0).
        if secure_port != 0 {
            for suite in list(&self.tls_cipher_suites) {
                if !GO_CIPHER_SUITES.contains(&suite.as_str()) {
                    errors.push(format!(
                        "--tls-cipher-suites: Cipher suite {suite} not supported or doesn't exist"
                    ));
                }
            }
            let mut seen = Vec::new();
            for id in self.tls_curve_preferences.iter().flatten() {
                if !(1..=65535).contains(id) {
                    errors.push(format!(
                        "--tls-curve-preferences: curve preference {id} is out of range (must be 1-65535)"
                    ));
                } else if seen.contains(id) {
                    errors.push(format!(
                        "--tls-curve-preferences: duplicate curve preference {id}"
                    ));
                }
                seen.push(*id);
            }
            if let Some(v) = self.tls_min_version.as_deref() {
                if !v.is_empty() && !TLS_VERSIONS.contains(&v) {
                    errors.push(format!(
                        "--tls-min-version: unknown tls version {v:?} (one of {})",
                        TLS_VERSIONS.join(", ")
                    ));
                }
            }
            // Values upstream knows that ccm-host cannot serve (rustls): refused too.
            if let Err(unsupported) = self.tls_policy() {
                errors.extend(unsupported);
            }
        }
        for (flag, values) in [
            ("tls-sni-cert-key", &self.tls_sni_cert_key),
            ("webhook-tls-sni-cert-key", &self.webhook_tls_sni_cert_key),
        ] {
            for v in values {
                if let Err(e) = check_named_cert_key(v) {
                    errors.push(format!("--{flag} {v:?}: {e}"));
                }
            }
        }

        // Delegated authentication's request-header options.
        for (flag, values) in [
            (
                "requestheader-username-headers",
                &self.requestheader_username_headers,
            ),
            (
                "requestheader-group-headers",
                &self.requestheader_group_headers,
            ),
            (
                "requestheader-extra-headers-prefix",
                &self.requestheader_extra_headers_prefix,
            ),
            (
                "requestheader-allowed-names",
                &self.requestheader_allowed_names,
            ),
        ] {
            if list(values).iter().any(|v| v.trim().is_empty()) {
                errors.push(format!("empty value in {flag:?}"));
            }
        }
        let uid_headers = list(&self.requestheader_uid_headers);
        if !uid_headers.is_empty() {
            if !gates.enabled(REMOTE_REQUEST_HEADER_UID) {
                errors.push(format!(
                    "--requestheader-uid-headers requires the {REMOTE_REQUEST_HEADER_UID:?} feature to be enabled"
                ));
            } else if uid_headers.iter().any(|v| v.trim().is_empty()) {
                errors.push("empty value in \"requestheader-uid-headers\"".into());
            } else if !uid_headers
                .iter()
                .any(|h| h.eq_ignore_ascii_case("X-Remote-Uid"))
            {
                errors.push("--requestheader-uid-headers is set without specifying the standard X-Remote-Uid header - API aggregation will not work".into());
            }
        }
        gates
    }

    /// The delegated authentication and authorization settings (the values were validated).
    pub fn auth_settings(&self) -> super::delegated_auth::AuthSettings {
        let ttl = |v: &Option<String>| {
            v.as_deref()
                .and_then(|v| crate::runtime::duration::parse(v).ok())
                .unwrap_or(super::delegated_auth::DEFAULT_CACHE_TTL)
        };
        let defaults = super::delegated_auth::AuthSettings::default();
        super::delegated_auth::AuthSettings {
            authentication_kubeconfig: self
                .authentication_kubeconfig
                .clone()
                .filter(|p| !p.as_os_str().is_empty()),
            authorization_kubeconfig: self
                .authorization_kubeconfig
                .clone()
                .filter(|p| !p.as_os_str().is_empty()),
            always_allow_paths: match &self.authorization_always_allow_paths {
                Some(_) => list(&self.authorization_always_allow_paths).to_vec(),
                None => defaults.always_allow_paths,
            },
            token_cache_ttl: ttl(&self.authentication_token_webhook_cache_ttl),
            authorized_ttl: ttl(&self.authorization_webhook_cache_authorized_ttl),
            unauthorized_ttl: ttl(&self.authorization_webhook_cache_unauthorized_ttl),
            client_ca_file: self
                .client_ca_file
                .clone()
                .filter(|p| !p.as_os_str().is_empty()),
            skip_lookup: self.authentication_skip_lookup.unwrap_or(false),
            tolerate_lookup_failure: self.authentication_tolerate_lookup_failure.unwrap_or(false),
        }
    }

    /// The flags given that ask for something ccm-host does not do (`--flag` or
    /// `--feature-gates=Name=value`), for the warning at start. Flags whose value is what
    /// ccm-host does anyway (e.g. `--use-service-account-credentials=false`,
    /// `--webhook-secure-port=0`) are not named.
    pub fn no_effect(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let mut add = |given: bool, flag: &str| {
            if given {
                names.push(format!("--{flag}"));
            }
        };
        let is_true = |b: Option<bool>| b == Some(true);
        let nonzero = |v: &Option<String>| {
            v.as_deref()
                .is_some_and(|v| crate::runtime::duration::parse(v).map_or(true, |d| !d.is_zero()))
        };
        add(
            is_true(self.use_service_account_credentials),
            "use-service-account-credentials",
        );
        add(self.min_resync_period.is_some(), "min-resync-period");
        add(
            self.kube_api_content_type
                .as_deref()
                .is_some_and(|t| t != "application/json"),
            "kube-api-content-type",
        );
        add(
            nonzero(&self.controller_start_interval),
            "controller-start-interval",
        );
        add(is_true(self.profiling), "profiling");
        add(is_true(self.contention_profiling), "contention-profiling");
        add(
            is_true(self.enable_leader_migration),
            "enable-leader-migration",
        );
        add(
            self.leader_migration_config
                .as_ref()
                .is_some_and(|p| !p.as_os_str().is_empty()),
            "leader-migration-config",
        );
        add(
            self.tls_curve_preferences
                .as_ref()
                .is_some_and(|v| !v.is_empty()),
            "tls-curve-preferences",
        );
        add(!self.tls_sni_cert_key.is_empty(), "tls-sni-cert-key");
        add(is_true(self.permit_port_sharing), "permit-port-sharing");
        // Delegated authentication: request-header (front proxy) authentication is not
        // implemented.
        add(
            self.requestheader_client_ca_file.is_some(),
            "requestheader-client-ca-file",
        );
        add(
            self.requestheader_username_headers.is_some(),
            "requestheader-username-headers",
        );
        add(
            self.requestheader_uid_headers.is_some(),
            "requestheader-uid-headers",
        );
        add(
            self.requestheader_group_headers.is_some(),
            "requestheader-group-headers",
        );
        add(
            self.requestheader_extra_headers_prefix.is_some(),
            "requestheader-extra-headers-prefix",
        );
        add(
            self.requestheader_allowed_names.is_some(),
            "requestheader-allowed-names",
        );
        // An invalid --feature-gates is reported by validation; here only valid settings count.
        if let Ok(gates) = FeatureGates::parse(&self.feature_gates) {
            names.extend(
                gates
                    .without_effect()
                    .into_iter()
                    .map(|g| format!("--feature-gates={g}")),
            );
        }
        names
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        upstream: UpstreamArgs,
    }

    fn parse(args: &[&str]) -> UpstreamArgs {
        let mut full = vec!["ccm-host"];
        full.extend_from_slice(args);
        Wrapper::try_parse_from(full).expect("flags parse").upstream
    }

    fn validate(args: &[&str]) -> Vec<String> {
        let mut errors = Vec::new();
        parse(args).validate(10258, &mut errors);
        errors
    }

    #[test]
    fn go_booleans() {
        for t in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool(t), Ok(true), "{t}");
        }
        for f in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool(f), Ok(false), "{f}");
        }
        assert!(parse_go_bool("yes").is_err());
        assert!(parse_go_bool("").is_err());
    }

    #[test]
    fn bool_flags_take_no_value_an_attached_value_or_a_separate_one() {
        let a = parse(&[
            "--use-service-account-credentials",
            "--profiling=false",
            "--enable-leader-migration",
            "0",
            "--authentication-skip-lookup",
        ]);
        assert_eq!(a.use_service_account_credentials, Some(true));
        assert_eq!(a.profiling, Some(false));
        assert_eq!(a.enable_leader_migration, Some(false));
        assert_eq!(a.authentication_skip_lookup, Some(true));
        assert_eq!(a.contention_profiling, None);
        let bad = Wrapper::try_parse_from(["ccm-host", "--profiling=yes"]);
        assert!(bad.is_err());
    }

    #[test]
    fn feature_gates_follow_upstream() {
        let gates = FeatureGates::parse(&[
            "CloudControllerManagerWebhook=true, ContextualLogging=false".into(),
            "ContextualLogging=true".into(),
        ])
        .unwrap();
        assert!(gates.enabled("CloudControllerManagerWebhook"));
        assert!(gates.enabled("ContextualLogging"), "the later value wins");
        assert!(gates.enabled(LOGGING_BETA_OPTIONS), "default true");
        assert!(!gates.enabled(LOGGING_ALPHA_OPTIONS), "default false");
        assert_eq!(
            gates.without_effect(),
            ["CloudControllerManagerWebhook=true"],
            "ContextualLogging=true is its default"
        );

        let all = FeatureGates::parse(&["AllAlpha=true,LoggingBetaOptions=false".into()]).unwrap();
        assert!(all.enabled(LOGGING_ALPHA_OPTIONS));
        assert!(all.enabled("CloudControllerManagerWatchBasedRoutesReconciliation"));
        assert!(!all.enabled(LOGGING_BETA_OPTIONS));
        assert!(!all.enabled("NoSuchGate"));

        let errs = FeatureGates::parse(&[
            "Bogus=true,ContextualLogging,WatchList=maybe,APIServerTracing=false".into(),
        ])
        .unwrap_err();
        assert_eq!(
            errs,
            [
                "--feature-gates: unrecognized feature gate: Bogus",
                "--feature-gates: missing bool value for ContextualLogging",
                "--feature-gates: invalid value of WatchList=maybe (must be true or false)",
                "--feature-gates: cannot set feature gate APIServerTracing to false, feature is locked to true",
            ]
        );
        assert_eq!(
            FeatureGates::parse(&[String::new()]),
            Ok(FeatureGates::default())
        );
    }

    #[test]
    fn known_gates_are_unique_and_include_the_cloud_gates() {
        for (i, g) in KNOWN_GATES.iter().enumerate() {
            assert!(
                KNOWN_GATES[i + 1..].iter().all(|o| o.name != g.name),
                "{} listed twice",
                g.name
            );
            assert!(!g.locked || matches!(g.stage, Stage::Ga | Stage::Deprecated));
        }
        for name in [
            "CloudControllerManagerWebhook",
            "CloudControllerManagerWatchBasedRoutesReconciliation",
            "ControllerManagerReleaseLeaderElectionLockOnExit",
            LOGGING_ALPHA_OPTIONS,
            LOGGING_BETA_OPTIONS,
            "ContextualLogging",
        ] {
            assert!(KNOWN_GATES.iter().any(|g| g.name == name), "{name}");
        }
    }

    #[test]
    fn upstream_validation_is_kept() {
        assert_eq!(
            validate(&[
                "--webhooks=*,-foo",
                "--webhook-secure-port=10258",
                "--tls-cipher-suites=TLS_AES_128_GCM_SHA256,TLS_BOGUS",
                "--tls-curve-preferences=29,29,0",
                "--tls-min-version=VersionTLS14",
                "--tls-sni-cert-key=a.crt",
                "--tls-sni-cert-key=a.crt,a.key:",
                "--min-resync-period=12",
                "--requestheader-username-headers=X-Remote-User,",
                "--requestheader-uid-headers=X-Uid",
            ]),
            [
                "--min-resync-period: invalid duration \"12\": missing unit (use e.g. 10s, 5m)",
                "--webhooks: \"foo\" is not in the list of known webhooks (ccm-host has no webhooks)",
                "--webhook-secure-port cannot be the same value as --secure-port (10258; the webhook port defaults to 10260, --webhook-secure-port=0 turns it off)",
                "--tls-cipher-suites: Cipher suite TLS_BOGUS not supported or doesn't exist",
                "--tls-curve-preferences: duplicate curve preference 29",
                "--tls-curve-preferences: curve preference 0 is out of range (must be 1-65535)",
                "--tls-min-version: unknown tls version \"VersionTLS14\" (one of VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13)",
                "--tls-sni-cert-key \"a.crt\": expected comma separated certificate and key file paths",
                "--tls-sni-cert-key \"a.crt,a.key:\": empty names list is not allowed",
                "empty value in \"requestheader-username-headers\"",
                "--requestheader-uid-headers is set without specifying the standard X-Remote-Uid header - API aggregation will not work",
            ]
        );
        // As upstream: the serving options are only checked when serving, --webhook-secure-port
        // 0 never clashes, `*` and the empty list are valid webhook lists.
        let mut errors = Vec::new();
        parse(&[
            "--tls-cipher-suites=TLS_BOGUS",
            "--webhook-secure-port=0",
            "--webhooks=",
        ])
        .validate(0, &mut errors);
        assert!(errors.is_empty(), "{errors:?}");
        // As upstream, the default webhook port counts too.
        let mut errors = Vec::new();
        parse(&[]).validate(10260, &mut errors);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with(
            "--webhook-secure-port cannot be the same value as --secure-port (10260;"
        ));
        assert_eq!(
            validate(&["--webhook-secure-port=70000", "--requestheader-uid-headers=X-Remote-Uid", "--feature-gates=RemoteRequestHeaderUID=false"]),
            [
                "--webhook-secure-port 70000 must be between 0 and 65535, inclusive. A value of 0 disables the webhook endpoint entirely.",
                "--requestheader-uid-headers requires the \"RemoteRequestHeaderUID\" feature to be enabled",
            ]
        );
    }

    #[test]
    fn tls_values_rustls_cannot_serve_are_refused_one_line_each() {
        assert_eq!(
            validate(&[
                "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_AES_128_CBC_SHA",
                "--tls-min-version=VersionTLS10",
            ]),
            [
                "--tls-min-version: VersionTLS10 is not supported: ccm-host serves TLS 1.2 and 1.3 only (VersionTLS12, the default, or VersionTLS13)",
                "--tls-cipher-suites: TLS_RSA_WITH_AES_128_CBC_SHA is not supported: ccm-host serves only AEAD suites with forward secrecy (no CBC, RC4, 3DES or RSA key exchange): TLS_AES_128_GCM_SHA256, TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256, TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
            ]
        );
        let policy = parse(&[
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305,TLS_AES_256_GCM_SHA384",
            "--tls-min-version=VersionTLS13",
        ])
        .tls_policy()
        .unwrap();
        assert!(policy.tls13_only);
        assert!(validate(&["--tls-min-version=VersionTLS13"]).is_empty());
    }

    #[test]
    fn no_effect_names_only_flags_asking_for_something_ccm_host_does_not_do() {
        assert!(parse(&[]).no_effect().is_empty());
        // Values that are what ccm-host does anyway.
        assert_eq!(
            parse(&[
                "--use-service-account-credentials=false",
                "--profiling=false",
                "--webhook-secure-port=0",
                "--webhooks=*",
                "--disable-http2-serving",
                "--permit-address-sharing",
                "--kube-api-content-type=application/json",
                "--controller-start-interval=0s",
                "--tls-min-version=VersionTLS12",
                "--external-cloud-volume-plugin=",
                "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true,LoggingAlphaOptions=true",
            ])
            .no_effect(),
            Vec::<String>::new()
        );
        assert_eq!(
            parse(&[
                "--use-service-account-credentials",
                "--profiling",
                "--enable-leader-migration",
                "--authentication-skip-lookup",
                "--authorization-always-allow-paths=/healthz",
                "--authentication-kubeconfig=/kc",
                "--authorization-kubeconfig=/kc",
                "--authentication-token-webhook-cache-ttl=1m",
                "--authorization-webhook-cache-authorized-ttl=1m",
                "--authorization-webhook-cache-unauthorized-ttl=0s",
                "--cert-dir=/certs",
                "--client-ca-file=/ca.crt",
                "--requestheader-client-ca-file=/rh.crt",
                "--min-resync-period=12h",
                "--feature-gates=CloudControllerManagerWebhook=true",
            ])
            .no_effect(),
            [
                "--use-service-account-credentials",
                "--min-resync-period",
                "--profiling",
                "--enable-leader-migration",
                "--requestheader-client-ca-file",
                "--feature-gates=CloudControllerManagerWebhook=true",
            ],
            "the delegated authentication/authorization flags (but request-header authentication) and --cert-dir work"
        );
    }

    #[test]
    fn auth_settings_from_the_flags() {
        use super::super::delegated_auth::DEFAULT_CACHE_TTL;
        let s = parse(&[]).auth_settings();
        assert_eq!(s.always_allow_paths, ["/healthz", "/readyz", "/livez"]);
        assert_eq!(
            (s.token_cache_ttl, s.authorized_ttl, s.unauthorized_ttl),
            (DEFAULT_CACHE_TTL, DEFAULT_CACHE_TTL, DEFAULT_CACHE_TTL)
        );
        assert_eq!(s.authentication_kubeconfig, None);
        assert_eq!(
            (s.client_ca_file, s.skip_lookup, s.tolerate_lookup_failure),
            (None, false, false),
            "the cluster lookup is on by default, as upstream"
        );
        let s = parse(&[
            "--client-ca-file=/ca.crt",
            "--authentication-skip-lookup",
            "--authentication-tolerate-lookup-failure=true",
        ])
        .auth_settings();
        assert_eq!(
            (s.client_ca_file, s.skip_lookup, s.tolerate_lookup_failure),
            (Some("/ca.crt".into()), true, true)
        );
        let s = parse(&[
            "--authorization-always-allow-paths=/healthz,/metrics*",
            "--authentication-kubeconfig=/a.kc",
            "--authorization-kubeconfig=/b.kc",
            "--authentication-token-webhook-cache-ttl=1m",
            "--authorization-webhook-cache-authorized-ttl=2s",
            "--authorization-webhook-cache-unauthorized-ttl=0s",
        ])
        .auth_settings();
        assert_eq!(s.always_allow_paths, ["/healthz", "/metrics*"]);
        assert_eq!(s.authentication_kubeconfig, Some("/a.kc".into()));
        assert_eq!(s.authorization_kubeconfig, Some("/b.kc".into()));
        assert_eq!(
            (s.token_cache_ttl, s.authorized_ttl, s.unauthorized_ttl),
            (
                Duration::from_secs(60),
                Duration::from_secs(2),
                Duration::ZERO
            )
        );
        assert!(
            parse(&["--authorization-always-allow-paths="])
                .auth_settings()
                .always_allow_paths
                .is_empty(),
            "the empty list allows no path"
        );
        assert_eq!(
            validate(&["--authorization-always-allow-paths=/a*b"]),
            ["--authorization-always-allow-paths: only trailing * allowed in \"/a*b\""]
        );
        assert_eq!(
            validate(&["--authentication-token-webhook-cache-ttl=10"]).len(),
            1
        );
    }
}
