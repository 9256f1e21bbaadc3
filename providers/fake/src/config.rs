//! The fake cloud's configuration: the `--cloud-config` file and the run-time control file share
//! this schema (see `docs/fake-provider.md`). YAML or JSON, camelCase keys, unknown keys refused.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ccm_provider_abi::ProviderError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every method name accepted as a key of `errors`, `latency`, `pause` and in `panics` / `hang` / `stuck`
/// (the upstream Go method names), plus `"*"` for "every method".
pub const METHODS: &[&str] = &[
    "Initialize",
    "GetLoadBalancer",
    "GetLoadBalancerName",
    "EnsureLoadBalancer",
    "UpdateLoadBalancer",
    "EnsureLoadBalancerDeleted",
    "NodeAddresses",
    "NodeAddressesByProviderID",
    "InstanceID",
    "InstanceType",
    "InstanceTypeByProviderID",
    "InstanceExistsByProviderID",
    "InstanceShutdownByProviderID",
    "CurrentNodeName",
    "InstanceExists",
    "InstanceShutdown",
    "InstanceMetadata",
    "InstancesBatch",
    "GetZoneByProviderID",
    "GetZoneByNodeName",
    "ListClusters",
    "Master",
    "ListRoutes",
    "CreateRoute",
    "DeleteRoute",
];

/// The wildcard method key.
pub const ALL_METHODS: &str = "*";

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The whole configuration of one fake cloud.
///
/// Every field has a default, so `{}` (or no config at all) is a valid, empty cloud that
/// synthesises an instance for every node it is asked about (`autoInstances`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FakeConfig {
    /// `ProviderName()` and the scheme of synthesised provider IDs; default: the registered name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_name: Option<String>,
    /// `HasClusterID()` (creation time only).
    #[serde(rename = "hasClusterID", skip_serializing_if = "is_true")]
    pub has_cluster_id: bool,

    /// Capability switches (creation time only). `None` = the registered provider's default:
    /// `fake` offers everything, `fake-v1` everything but InstancesV2 (upstream's defaults).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_instances: Option<bool>,
    /// See [`FakeConfig::disable_instances`].
    #[serde(rename = "disableInstancesV2", skip_serializing_if = "Option::is_none")]
    pub disable_instances_v2: Option<bool>,
    /// See [`FakeConfig::disable_instances`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_load_balancers: Option<bool>,
    /// See [`FakeConfig::disable_instances`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_routes: Option<bool>,
    /// See [`FakeConfig::disable_instances`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_zones: Option<bool>,
    /// See [`FakeConfig::disable_instances`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_clusters: Option<bool>,
    /// Offer ABI 1.1 bulk instance lookups (`BulkInstances`: one `InstancesBatch` call answers
    /// many nodes) in addition to the per-node methods (creation time only; off by default, so
    /// the per-node calls every other test counts stay as they are).
    #[serde(skip_serializing_if = "is_false")]
    pub bulk_instances: bool,
    /// Offer the ABI 1.2 incremental host update (`LoadBalancer::update_load_balancer_hosts`,
    /// logged as `update-hosts` with the `added` and `removed` node names, `replace` when the
    /// whole set came). Creation time only; off by default, so the fake then acts as a 1.1
    /// plugin for load balancers and the `update` calls other tests count stay as they are.
    #[serde(skip_serializing_if = "is_false")]
    pub incremental_hosts: bool,

    /// Directory for the control file, the call log and the cloud state (config file only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Write `stateDir/cloud.json` after every change of the cloud (turn off for big benchmarks).
    #[serde(skip_serializing_if = "is_true")]
    pub cloud_state_file: bool,
    /// Several processes (host replicas) share one cloud through `stateDir/cloud.json`: the
    /// state is loaded from it when the cloud is created and on every `Initialize` (once per
    /// leadership), and written after every change (config file only).
    #[serde(skip_serializing_if = "is_false")]
    pub shared_state: bool,
    /// Record every call (in memory, and in `stateDir/calls.jsonl`). Turn off for big
    /// benchmarks: a load-balancer call's record holds every host name (creation time only).
    #[serde(skip_serializing_if = "is_true")]
    pub call_log: bool,
    /// Write the plugin's own heap figures ([`crate::heap`]) to `stateDir/heap.json` every
    /// 200 ms and whenever its footprint moves by 1 MiB (within 10 ms), for benchmarks that
    /// separate the provider's memory from the host's (config file only).
    #[serde(skip_serializing_if = "is_false")]
    pub heap_file: bool,

    /// Instances known to the cloud.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceConfig>,
    /// Unknown nodes get a synthesised, deterministic instance.
    #[serde(skip_serializing_if = "is_true")]
    pub auto_instances: bool,
    /// Defaults for instances that leave a field out, and for synthesised ones.
    pub defaults: Defaults,

    /// `ListClusters()`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// `Master()`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub master: String,

    /// Every load balancer gets this address (instead of one from `ipPool`).
    #[serde(rename = "externalIP", skip_serializing_if = "Option::is_none")]
    pub external_ip: Option<String>,
    /// IPv4 CIDR from which each service gets a stable address.
    pub ip_pool: IpPool,
    /// `ipMode` of the returned ingress (`VIP` or `Proxy`); none by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_mode: Option<String>,
    /// EnsureLoadBalancer stores the load balancer but returns no status (upstream's nil status).
    #[serde(skip_serializing_if = "is_false")]
    pub ensure_returns_nil: bool,
    /// Services (`namespace/name`) whose load balancer is implemented elsewhere.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub implemented_elsewhere: Vec<String>,

    /// Routes that exist when the cloud is created (config file only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
    /// Routes returned by ListRoutes carry `EnableNodeAddresses = true` and their addresses.
    #[serde(skip_serializing_if = "is_false")]
    pub route_enable_node_addresses: bool,

    /// Injected errors per method (`"*"` = every method).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, ErrorSpec>,
    /// Injected latency per method (`"*"` = every method without its own entry).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub latency: BTreeMap<String, GoDuration>,
    /// Methods that panic.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub panics: Vec<String>,
    /// Methods that block until the call is cancelled or past its deadline.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hang: Vec<String>,
    /// Methods that block *ignoring* their cancellation and deadline, while the method stays
    /// listed here (a control-file change that drops it releases them): a plugin thread the
    /// host cannot get back.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<String>,
    /// Methods that block at their start while the given file exists.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pause: BTreeMap<String, PathBuf>,

    /// What the ABI 1.1 health probe answers: left out, healthy; an error spec, that error
    /// (`{kind: not_implemented}`: the provider offers no probe).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<ErrorSpec>,
    /// What the ABI 1.1 `reconfigure` does with new `--cloud-config` bytes.
    #[serde(skip_serializing_if = "ReconfigureMode::is_in_place")]
    pub reconfigure: ReconfigureMode,
}

/// What the fake's `reconfigure` does (`reconfigure:` in the config).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReconfigureMode {
    /// Apply the new config to the running cloud (the fields fixed at creation must not change).
    #[default]
    InPlace,
    /// Answer `NOT_IMPLEMENTED`: the host rebuilds the provider from its factory instead.
    NotImplemented,
}

impl ReconfigureMode {
    fn is_in_place(&self) -> bool {
        *self == Self::InPlace
    }
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            provider_name: None,
            has_cluster_id: true,
            disable_instances: None,
            disable_instances_v2: None,
            disable_load_balancers: None,
            disable_routes: None,
            disable_zones: None,
            disable_clusters: None,
            bulk_instances: false,
            incremental_hosts: false,
            state_dir: None,
            cloud_state_file: true,
            shared_state: false,
            call_log: true,
            heap_file: false,
            instances: Vec::new(),
            auto_instances: true,
            defaults: Defaults::default(),
            clusters: Vec::new(),
            master: String::new(),
            external_ip: None,
            ip_pool: IpPool::default(),
            ip_mode: None,
            ensure_returns_nil: false,
            implemented_elsewhere: Vec::new(),
            routes: Vec::new(),
            route_enable_node_addresses: false,
            errors: BTreeMap::new(),
            latency: BTreeMap::new(),
            panics: Vec::new(),
            hang: Vec::new(),
            stuck: Vec::new(),
            pause: BTreeMap::new(),
            health: None,
            reconfigure: ReconfigureMode::InPlace,
        }
    }
}

/// Defaults applied to instances.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Defaults {
    /// Instance type.
    pub instance_type: String,
    /// Zone (failure domain).
    pub zone: String,
    /// Region.
    pub region: String,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            instance_type: "fake.medium".into(),
            zone: "fake-zone-a".into(),
            region: "fake-region-1".into(),
        }
    }
}

/// One instance of the cloud.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceConfig {
    /// The node name this instance backs.
    pub name: String,
    /// Provider ID; default `<providerName>://<instanceID>`. `""` = the cloud reports none.
    #[serde(
        rename = "providerID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Legacy `InstanceID`; default: the name. `""` is returned as is.
    #[serde(
        rename = "instanceID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub instance_id: Option<String>,
    /// Default: `defaults.instanceType`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Default: `defaults.zone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Default: `defaults.region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Addresses, in order. Left out: an InternalIP derived from the name and `Hostname` = name.
    /// `[]`: the cloud knows no address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<AddressConfig>>,
    /// False: the instance is gone (exists = false, metadata and ID lookups are InstanceNotFound).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub exists: bool,
    /// The instance is shut down.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shutdown: bool,
    /// `InstanceMetadata.AdditionalLabels`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_labels: BTreeMap<String, String>,
    /// `InstanceMetadata` returns no metadata (upstream `(nil, nil)`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub metadata_nil: bool,
    /// Errors for calls about this instance only (checked after the global `errors`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, ErrorSpec>,
}

impl InstanceConfig {
    /// An existing instance with every other field defaulted.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            provider_id: None,
            instance_id: None,
            instance_type: None,
            zone: None,
            region: None,
            addresses: None,
            exists: true,
            shutdown: false,
            additional_labels: BTreeMap::new(),
            metadata_nil: false,
            errors: BTreeMap::new(),
        }
    }
}

/// A node address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressConfig {
    /// `InternalIP`, `ExternalIP`, `Hostname`, `InternalDNS`, `ExternalDNS`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The address.
    pub address: String,
}

impl AddressConfig {
    /// An address of `type_`.
    pub fn new(type_: &str, address: &str) -> Self {
        Self {
            type_: type_.into(),
            address: address.into(),
        }
    }
}

/// A route present at start-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    /// The route's name; default `<cluster>-<targetNode>-<destinationCIDR>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Cluster the route belongs to; default `kubernetes`.
    #[serde(default = "default_cluster")]
    pub cluster: String,
    /// Node name.
    pub target_node: String,
    /// Pod CIDR.
    #[serde(rename = "destinationCIDR")]
    pub destination_cidr: String,
    /// The target is gone.
    #[serde(default, skip_serializing_if = "is_false")]
    pub blackhole: bool,
    /// Addresses the route was created with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_node_addresses: Vec<AddressConfig>,
}

fn default_cluster() -> String {
    "kubernetes".into()
}

/// The kind of an injected error (the `ErrorKind` names of the ABI).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InjectedKind {
    /// A generic failure.
    Other,
    /// A non-instance resource was not found.
    NotFound,
    /// Upstream `InstanceNotFound`.
    InstanceNotFound,
    /// Upstream `NotImplemented`.
    NotImplemented,
    /// Upstream `ImplementedElsewhere`.
    ImplementedElsewhere,
    /// Upstream `RetryError` with `retryAfter`.
    RetryAfter,
    /// `InvalidConfig`.
    InvalidConfig,
    /// ABI 1.1 `Throttled`, with `retryAfter` as the delay the cloud asked for (optional).
    Throttled,
    /// ABI 1.1 `Unauthorized` (credentials rejected, access denied).
    Unauthorized,
    /// `Cancelled`, as a plugin returns it when it sees its call cancelled.
    Cancelled,
}

/// An injected error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ErrorSpec {
    /// What kind of error.
    #[serde(default = "default_kind")]
    pub kind: InjectedKind,
    /// Message; default: upstream's sentinel message for the kind, or "injected error".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Delay of a `retry_after` error (required for that kind); of a `throttled` error, the
    /// delay the cloud asked for (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<GoDuration>,
    /// Only the next N calls fail; left out: every call fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
}

fn default_kind() -> InjectedKind {
    InjectedKind::Other
}

impl ErrorSpec {
    /// An error of `kind` on every call.
    pub fn new(kind: InjectedKind) -> Self {
        Self {
            kind,
            message: None,
            retry_after: None,
            times: None,
        }
    }

    /// Fail only the next `n` calls.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Use `message`.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// A `retry_after` error with `after`.
    pub fn retry_after(after: Duration) -> Self {
        Self {
            retry_after: Some(GoDuration(after)),
            ..Self::new(InjectedKind::RetryAfter)
        }
    }

    /// The error to return.
    pub fn to_error(&self, method: &str) -> ProviderError {
        let msg = |default: &str| self.message.clone().unwrap_or_else(|| default.to_string());
        match self.kind {
            InjectedKind::Other => {
                ProviderError::other(msg(&format!("injected error in {method}")))
            }
            InjectedKind::NotFound => {
                ProviderError::not_found(msg(&format!("injected not found in {method}")))
            }
            InjectedKind::InstanceNotFound => match &self.message {
                Some(m) => ProviderError::new(ccm_provider_abi::ErrorKind::INSTANCE_NOT_FOUND, m),
                None => ProviderError::instance_not_found(),
            },
            InjectedKind::NotImplemented => match &self.message {
                Some(m) => ProviderError::new(ccm_provider_abi::ErrorKind::NOT_IMPLEMENTED, m),
                None => ProviderError::not_implemented(),
            },
            InjectedKind::ImplementedElsewhere => match &self.message {
                Some(m) => {
                    ProviderError::new(ccm_provider_abi::ErrorKind::IMPLEMENTED_ELSEWHERE, m)
                }
                None => ProviderError::implemented_elsewhere(),
            },
            InjectedKind::RetryAfter => ProviderError::retry_after(
                self.retry_after.map(|d| d.0).unwrap_or_default(),
                msg(&format!("injected retry in {method}")),
            ),
            InjectedKind::InvalidConfig => {
                ProviderError::invalid_config(msg(&format!("injected invalid config in {method}")))
            }
            InjectedKind::Throttled => ProviderError::throttled(
                msg(&format!("injected throttling in {method}")),
                self.retry_after.map(|d| d.0),
            ),
            InjectedKind::Unauthorized => {
                ProviderError::unauthorized(msg(&format!("injected unauthorized in {method}")))
            }
            InjectedKind::Cancelled => {
                ProviderError::cancelled(msg(&format!("injected cancellation in {method}")))
            }
        }
    }
}

/// The pool load-balancer addresses come from: an IPv4 CIDR such as `198.18.0.0/15`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPool {
    /// First address of the network.
    pub network: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
}

impl IpPool {
    /// Number of usable addresses (network and broadcast excluded for prefixes < 31).
    pub fn size(&self) -> u32 {
        let total = 1u64 << (32 - u32::from(self.prefix));
        let usable = if self.prefix < 31 { total - 2 } else { total };
        u32::try_from(usable).unwrap_or(u32::MAX)
    }

    /// The `i`-th usable address (`i < size()`).
    pub fn nth(&self, i: u32) -> Ipv4Addr {
        let skip = u32::from(self.prefix < 31);
        Ipv4Addr::from(u32::from(self.network).wrapping_add(i).wrapping_add(skip))
    }
}

impl Default for IpPool {
    /// `198.18.0.0/15` (RFC 2544 benchmarking space, 131,070 addresses).
    fn default() -> Self {
        Self {
            network: Ipv4Addr::new(198, 18, 0, 0),
            prefix: 15,
        }
    }
}

impl FromStr for IpPool {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (ip, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("ipPool {s:?} is not a CIDR such as 198.18.0.0/15"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| {
            format!("ipPool {s:?}: {ip:?} is not an IPv4 address (only IPv4 pools are supported)")
        })?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("ipPool {s:?}: the prefix length must be 0..=32"))?;
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(prefix))
        };
        Ok(Self {
            network: Ipv4Addr::from(u32::from(ip) & mask),
            prefix,
        })
    }
}

impl fmt::Display for IpPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Serialize for IpPool {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IpPool {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A duration written as Go does: `42s`, `50ms`, `1m30s`, `1.5s`, `250us`, `0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GoDuration(pub Duration);

impl From<Duration> for GoDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl FromStr for GoDuration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a duration such as \"50ms\", \"42s\" or \"1m30s\"");
        let t = s.trim();
        if t == "0" {
            return Ok(Self(Duration::ZERO));
        }
        if t.is_empty() {
            return Err(bad());
        }
        let mut rest = t;
        let mut total = 0f64;
        while !rest.is_empty() {
            let num_len = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .ok_or_else(bad)?;
            if num_len == 0 {
                return Err(bad());
            }
            let value: f64 = rest[..num_len].parse().map_err(|_| bad())?;
            rest = &rest[num_len..];
            let unit_len = rest
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(rest.len());
            let scale = match &rest[..unit_len] {
                "ns" => 1e-9,
                "us" | "µs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                _ => return Err(bad()),
            };
            total += value * scale;
            rest = &rest[unit_len..];
        }
        Duration::try_from_secs_f64(total)
            .map(Self)
            .map_err(|_| bad())
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            write!(f, "{}s", d.as_secs())
        } else if d.as_nanos().is_multiple_of(1_000_000) {
            write!(f, "{}ms", d.as_millis())
        } else {
            write!(f, "{}ns", d.as_nanos())
        }
    }
}

impl Serialize for GoDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl FakeConfig {
    /// Parse `--cloud-config` bytes (YAML or JSON). Empty or whitespace-only input is `{}`.
    pub fn parse(bytes: &[u8]) -> Result<Self, ProviderError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            ProviderError::invalid_config(format!("fake cloud config is not UTF-8 text: {e}"))
        })?;
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let config: Self = yaml_serde::from_str(text).map_err(|e| {
            ProviderError::invalid_config(format!(
                "fake cloud config (YAML or JSON) does not parse: {e} (see docs/fake-provider.md for the schema)"
            ))
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks that serde cannot express: method names, required fields, duplicates.
    pub fn validate(&self) -> Result<(), ProviderError> {
        let bad = |m: String| {
            Err(ProviderError::invalid_config(format!(
                "fake cloud config: {m}"
            )))
        };
        let check_method = |field: &str, m: &str| {
            if m == ALL_METHODS || METHODS.contains(&m) {
                Ok(())
            } else {
                bad(format!(
                    "{field}: unknown method {m:?}; expected \"*\" or one of {}",
                    METHODS.join(", ")
                ))
            }
        };
        for m in self.errors.keys() {
            check_method("errors", m)?;
        }
        for m in self.latency.keys() {
            check_method("latency", m)?;
        }
        for m in self.pause.keys() {
            check_method("pause", m)?;
        }
        for m in &self.panics {
            check_method("panics", m)?;
        }
        for m in &self.hang {
            check_method("hang", m)?;
        }
        for m in &self.stuck {
            check_method("stuck", m)?;
        }
        let specs = self
            .errors
            .iter()
            .map(|(m, spec)| (format!("errors.{m}"), spec))
            .chain(self.health.iter().map(|spec| ("health".to_string(), spec)));
        for (field, spec) in specs {
            if spec.kind == InjectedKind::RetryAfter && spec.retry_after.is_none() {
                return bad(format!(
                    "{field}: kind retry_after needs retryAfter (for example \"42s\")"
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        let mut ids = std::collections::HashMap::new();
        for (i, inst) in self.instances.iter().enumerate() {
            if inst.name.is_empty() {
                return bad(format!("instances[{i}]: name must not be empty"));
            }
            if !names.insert(inst.name.as_str()) {
                return bad(format!(
                    "instances[{i}]: instance {:?} is listed twice",
                    inst.name
                ));
            }
            if let Some(id) = inst.provider_id.as_deref().filter(|id| !id.is_empty()) {
                if let Some(other) = ids.insert(id, inst.name.as_str()) {
                    return bad(format!(
                        "instances[{i}]: providerID {id:?} is used by {other:?} and {:?}",
                        inst.name
                    ));
                }
            }
            for (m, spec) in &inst.errors {
                check_method(&format!("instances[{i}].errors"), m)?;
                if spec.kind == InjectedKind::RetryAfter && spec.retry_after.is_none() {
                    return bad(format!(
                        "instances[{i}].errors.{m}: kind retry_after needs retryAfter"
                    ));
                }
            }
        }
        if self.shared_state && (self.state_dir.is_none() || !self.cloud_state_file) {
            return bad(
                "sharedState needs stateDir and cloudStateFile (the cloud is shared through stateDir/cloud.json)".into(),
            );
        }
        if self.heap_file && self.state_dir.is_none() {
            return bad(
                "heapFile needs stateDir (the figures are written to stateDir/heap.json)".into(),
            );
        }
        if let Some(ip) = &self.external_ip {
            if ip.parse::<std::net::IpAddr>().is_err() {
                return bad(format!("externalIP {ip:?} is not an IP address"));
            }
        }
        for key in &self.implemented_elsewhere {
            if !key.contains('/') {
                return bad(format!(
                    "implementedElsewhere: {key:?} must be a service key namespace/name"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go() {
        let d = |s: &str| s.parse::<GoDuration>().unwrap().0;
        assert_eq!(d("42s"), Duration::from_secs(42));
        assert_eq!(d("50ms"), Duration::from_millis(50));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("0"), Duration::ZERO);
        assert!("5".parse::<GoDuration>().is_err());
        assert!("5 parsecs".parse::<GoDuration>().is_err());
        assert_eq!(GoDuration(Duration::from_secs(42)).to_string(), "42s");
        assert_eq!(GoDuration(Duration::from_millis(50)).to_string(), "50ms");
    }

    #[test]
    fn pools_parse_and_count() {
        let p: IpPool = "10.1.2.3/24".parse().unwrap();
        assert_eq!(p.to_string(), "10.1.2.0/24");
        assert_eq!(p.size(), 254);
        assert_eq!(p.nth(0), Ipv4Addr::new(10, 1, 2, 1));
        assert!("fd00::/64".parse::<IpPool>().is_err());
        assert_eq!(IpPool::default().size(), 131_070);
    }
}
