//! Property-based fuzzing (proptest) of every parser that reads input the host does not
//! control: flag values (`--controllers`, Go durations, `--cluster-cidr`), what kubelets and
//! users put on nodes and services (the `alpha.kubernetes.io/provided-node-ip` annotation, the
//! load-balancer exclusion label, object keys), and the fake provider's cloud config (and its
//! durations and IP pools).
//!
//! Properties: no input makes a parser panic; valid inputs are accepted and round-trip;
//! invalid inputs get an error that names the offending input. More cases:
//! `PROPTEST_CASES=20000 cargo test -p ccm-integration-tests --test fuzz_inputs`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use ccm_host::controllers::node_addresses::{
    addresses_from_node_ip, parse_ip_sloppy, parse_node_ip_annotation,
};
use ccm_host::controllers::route::parse_cluster_cidrs;
use ccm_host::controllers::service::predicates::{node_included, parse_go_bool, split_key};
use ccm_host::controllers::{ControllerName, CONTROLLERS};
use ccm_host::daemon::selection::ControllerSelection;
use ccm_host::runtime::duration;
use ccm_host::runtime::well_known::EXCLUDE_LB_LABEL;
use ccm_provider_abi::ErrorKind;
use ccm_provider_fake::config::{GoDuration, IpPool, METHODS};
use ccm_provider_fake::{ErrorSpec, FakeConfig, InjectedKind, InstanceConfig};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use proptest::prelude::*;

/// The names of every controller the host has.
fn controller_names() -> [ControllerName; 4] {
    CONTROLLERS.each_ref().map(|c| c.name)
}

/// `n` cases per property, or `PROPTEST_CASES` when set (for long local runs).
fn cases(n: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(n);
    ProptestConfig::with_cases(n)
}

/// Go's `net.IP` treats an IPv4-mapped IPv6 address as the IPv4 address.
fn go_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn any_ipv4() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>().prop_map(Ipv4Addr::from)
}

fn any_ipv6() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(Ipv6Addr::from)
}

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any_ipv4().prop_map(IpAddr::V4),
        any_ipv6().prop_map(IpAddr::V6)
    ]
}

// ---------------------------------------------------------------------------------------------
// --controllers
// ---------------------------------------------------------------------------------------------

/// A known item as a user may write it: `*`, a canonical name or alias, maybe `-`, maybe spaces.
fn known_item() -> impl Strategy<Value = String> {
    let names: Vec<&'static str> = controller_names()
        .iter()
        .flat_map(|c| [c.canonical, c.alias])
        .collect();
    prop_oneof![
        1 => Just("*".to_string()),
        6 => (proptest::sample::select(names), any::<bool>(), " {0,2}", " {0,2}").prop_map(
            |(name, minus, pre, post)| format!("{pre}{}{name}{post}", if minus { "-" } else { "" })
        ),
    ]
}

/// Upstream's rule, written from the spec rather than from the implementation: per controller,
/// the first item naming it (by canonical name or alias) decides; else `*` anywhere enables it.
fn upstream_enabled(items: &[String], canonical: &str) -> bool {
    let c = controller_names()
        .into_iter()
        .find(|c| c.canonical == canonical)
        .unwrap();
    for raw in items {
        let item = raw.trim();
        let (negated, name) = match item.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, item),
        };
        if name == c.canonical || name == c.alias {
            return !negated;
        }
    }
    items.iter().any(|i| i.trim() == "*")
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn controllers_any_text_is_accepted_or_each_unknown_item_is_named(s in "\\PC{0,40}") {
        match ControllerSelection::parse(std::slice::from_ref(&s)) {
            Ok(sel) => {
                for c in controller_names() {
                    prop_assert_eq!(sel.is_enabled(c.canonical), upstream_enabled(&s.split(',').map(str::to_string).collect::<Vec<_>>(), c.canonical));
                }
            }
            Err(errors) => {
                let unknown: Vec<String> = s
                    .split(',')
                    .map(|i| i.trim())
                    .filter(|i| *i != "*")
                    .map(|i| i.strip_prefix('-').unwrap_or(i).to_string())
                    .filter(|n| !controller_names().iter().any(|c| c.canonical == n || c.alias == n))
                    .collect();
                prop_assert_eq!(errors.len(), unknown.len());
                for (e, name) in errors.iter().zip(&unknown) {
                    prop_assert_eq!(e, &format!("{name:?} is not in the list of known controllers"));
                }
            }
        }
    }

    #[test]
    fn controllers_valid_lists_follow_upstream(items in prop::collection::vec(known_item(), 1..8), split in any::<bool>()) {
        // As one comma list, or as repeated flags.
        let args = if split { items.clone() } else { vec![items.join(",")] };
        let sel = ControllerSelection::parse(&args).expect("known names parse");
        for c in controller_names() {
            prop_assert_eq!(sel.is_enabled(c.canonical), upstream_enabled(&items, c.canonical), "{}", c.canonical);
        }
        let enabled: Vec<&str> = sel.enabled().iter().map(|c| c.name.canonical).collect();
        let expected: Vec<&str> = controller_names().iter().map(|c| c.canonical).filter(|c| upstream_enabled(&items, c)).collect();
        prop_assert_eq!(enabled, expected);
    }
}

// ---------------------------------------------------------------------------------------------
// alpha.kubernetes.io/provided-node-ip
// ---------------------------------------------------------------------------------------------

fn address(type_: &str, address: &str) -> NodeAddress {
    NodeAddress {
        type_: type_.into(),
        address: address.into(),
    }
}

fn cloud_addresses() -> impl Strategy<Value = Vec<NodeAddress>> {
    let entry = (
        proptest::sample::select(vec!["InternalIP", "ExternalIP", "Hostname", "InternalDNS"]),
        prop_oneof![
            any_ip().prop_map(|ip| ip.to_string()),
            "[a-z0-9.:-]{0,20}",
            any_ipv4().prop_map(|ip| {
                let o = ip.octets();
                format!("{:03}.{:03}.{}.{}", o[0], o[1], o[2], o[3])
            }),
        ],
    )
        .prop_map(|(t, a)| address(t, &a));
    prop::collection::vec(entry, 0..6)
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn node_ip_any_text_parses_or_names_the_bad_part(s in "\\PC{0,48}") {
        match parse_node_ip_annotation(&s) {
            Ok(ips) => {
                prop_assert!(ips.len() == 1 || ips.len() == 2);
                let parts: Vec<&str> = s.split(',').collect();
                prop_assert_eq!(parts.len(), ips.len());
                for (ip, part) in ips.iter().zip(parts) {
                    prop_assert_eq!(Some(*ip), parse_ip_sloppy(part));
                }
            }
            Err(e) => prop_assert!(
                e.starts_with("could not parse ") && s.split(',').any(|p| e == format!("could not parse {p:?}"))
                    || e.contains("single IP or a dual-stack pair")
                    || e.contains("cannot include '0.0.0.0' or '::'"),
                "unexpected error for {:?}: {}", s, e
            ),
        }
    }

    #[test]
    fn node_ip_single_addresses_round_trip(ip in any_ip()) {
        prop_assert_eq!(parse_node_ip_annotation(&ip.to_string()), Ok(vec![go_ip(ip)]));
    }

    #[test]
    fn node_ip_leading_zeros_are_decimal(ip in any_ipv4()) {
        let o = ip.octets();
        let padded = format!("{:03}.{:03}.{:03}.{:03}", o[0], o[1], o[2], o[3]);
        prop_assert_eq!(parse_ip_sloppy(&padded), Some(IpAddr::V4(ip)));
    }

    #[test]
    fn node_ip_sloppy_agrees_with_the_standard_parser(s in "[0-9a-fA-F.:]{0,24}") {
        if let Ok(ip) = s.parse::<IpAddr>() {
            prop_assert_eq!(parse_ip_sloppy(&s), Some(go_ip(ip)));
        }
    }

    #[test]
    fn node_ip_pairs_need_both_families(a in any_ipv4(), b in any_ipv6(), c in any_ipv4(), v4_first in any::<bool>()) {
        let b_is_v4 = b.to_ipv4_mapped().is_some();
        let (x, y) = if v4_first { (a.to_string(), b.to_string()) } else { (b.to_string(), a.to_string()) };
        let pair = parse_node_ip_annotation(&format!("{x},{y}"));
        if b_is_v4 {
            prop_assert!(pair.unwrap_err().contains("dual-stack pair"));
        } else if a.is_unspecified() || b.is_unspecified() {
            prop_assert!(pair.unwrap_err().contains("cannot include"));
        } else {
            prop_assert_eq!(pair.unwrap().len(), 2);
        }
        let same_family = format!("{a},{c}");
        let three = format!("{a},{b},{c}");
        prop_assert!(parse_node_ip_annotation(&same_family).unwrap_err().contains("dual-stack pair"));
        prop_assert!(parse_node_ip_annotation(&three).is_err());
    }

    #[test]
    fn node_ip_applied_to_cloud_addresses(annotation in prop_oneof![any_ip().prop_map(|i| i.to_string()), "\\PC{0,20}"], cloud in cloud_addresses()) {
        if let Ok(out) = addresses_from_node_ip(&annotation, &cloud) {
            // Only the cloud's own entries, the matching one first.
            for a in &out {
                prop_assert!(cloud.contains(a));
            }
            let ip = parse_node_ip_annotation(&annotation).unwrap()[0];
            prop_assert_eq!(parse_ip_sloppy(&out[0].address), Some(ip));
        } else {
            let e = addresses_from_node_ip(&annotation, &cloud).unwrap_err();
            prop_assert!(e.contains(&format!("{annotation:?}")) || e.contains("matches ip"), "{}", e);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Go durations (host flags) and the fake cloud's durations
// ---------------------------------------------------------------------------------------------

/// Text shaped like a Go duration, valid or nearly so.
fn duration_like() -> impl Strategy<Value = String> {
    "[ +-]?([0-9]{0,5}(\\.[0-9]{0,5})?(ns|us|µs|μs|ms|s|m|h|d|x|)){0,4} ?"
}

proptest! {
    #![proptest_config(cases(1024))]

    #[test]
    fn duration_any_text_parses_or_names_the_input(s in prop_oneof![duration_like(), "\\PC{0,24}"]) {
        if let Err(e) = duration::parse(&s) {
            prop_assert!(e.contains(&format!("{s:?}")) || (s.trim().is_empty() && e == "empty duration"), "{:?}: {}", s, e);
        }
        if let Err(e) = s.parse::<GoDuration>() {
            prop_assert!(e.contains(&format!("{s:?}")), "{:?}: {}", s, e);
        }
    }

    #[test]
    fn duration_format_round_trips(nanos in 0u64..(1u64 << 50)) {
        let d = Duration::from_nanos(nanos);
        prop_assert_eq!(duration::parse(&duration::format(d)), Ok(d), "{}", duration::format(d));
    }

    #[test]
    fn duration_go_compositions(h in 0u64..1000, m in 0u64..60, s in 0u64..60, ms in 0u64..1000) {
        let text = format!("{h}h{m}m{s}s{ms}ms");
        let want = Duration::from_millis(((h * 60 + m) * 60 + s) * 1000 + ms);
        prop_assert_eq!(duration::parse(&text), Ok(want));
        prop_assert_eq!(text.parse::<GoDuration>(), Ok(GoDuration(want)));
    }

    #[test]
    fn fake_durations_round_trip(nanos in 0u64..(1u64 << 50)) {
        let d = GoDuration(Duration::from_nanos(nanos));
        prop_assert_eq!(d.to_string().parse::<GoDuration>(), Ok(d), "{}", d);
    }
}

// ---------------------------------------------------------------------------------------------
// --cluster-cidr, IP pools
// ---------------------------------------------------------------------------------------------

fn cidr() -> impl Strategy<Value = (IpAddr, u8)> {
    prop_oneof![
        (any_ipv4(), 0u8..=32).prop_map(|(ip, p)| (IpAddr::V4(ip), p)),
        (any_ipv6(), 0u8..=128).prop_map(|(ip, p)| (IpAddr::V6(ip), p)),
    ]
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn cluster_cidr_any_text_parses_or_names_the_bad_part(s in prop_oneof!["[0-9a-f.:/, ]{0,40}", "\\PC{0,40}"]) {
        match parse_cluster_cidrs(&s) {
            Ok(nets) => {
                prop_assert!(nets.len() == 1 || nets.len() == 2);
                if nets.len() == 2 {
                    prop_assert_ne!(nets[0].addr().is_ipv4(), nets[1].addr().is_ipv4());
                }
            }
            Err(e) => {
                let named_part = s.trim().split(',').any(|p| e.contains(&format!("{p:?}")));
                prop_assert!(
                    named_part || e.contains(&format!("{:?}", s.trim())) || (s.trim().is_empty() && e.contains("empty")),
                    "{:?}: {}", s, e
                );
            }
        }
    }

    #[test]
    fn cluster_cidr_valid_values(a in cidr(), b in cidr()) {
        let one = format!("{}/{}", a.0, a.1);
        prop_assert_eq!(parse_cluster_cidrs(&format!(" {one} ")).map(|n| n.len()), Ok(1));
        let two = parse_cluster_cidrs(&format!("{one},{}/{}", b.0, b.1));
        if a.0.is_ipv4() == b.0.is_ipv4() {
            prop_assert!(two.unwrap_err().contains("dual stack"));
        } else {
            prop_assert_eq!(two.map(|n| n.len()), Ok(2));
        }
    }

    #[test]
    fn ip_pool_any_text_parses_or_names_the_input(s in prop_oneof!["[0-9./]{0,20}", "\\PC{0,24}"]) {
        match s.parse::<IpPool>() {
            Ok(pool) => {
                // Usable addresses are inside the network.
                let size = pool.size();
                prop_assert!(size >= 1);
                let last = u64::from(u32::from(pool.nth(size - 1)));
                prop_assert!(last < u64::from(u32::from(pool.network)) + (1u64 << (32 - u32::from(pool.prefix))));
            }
            Err(e) => prop_assert!(e.contains(&format!("{s:?}")), "{:?}: {}", s, e),
        }
    }

    #[test]
    fn ip_pool_round_trips(ip in any_ipv4(), prefix in 0u8..=32) {
        let pool: IpPool = format!("{ip}/{prefix}").parse().unwrap();
        prop_assert_eq!(pool.prefix, prefix);
        prop_assert_eq!(pool.to_string().parse::<IpPool>(), Ok(pool));
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
        prop_assert_eq!(u32::from(pool.network), u32::from(ip) & mask);
    }
}

// ---------------------------------------------------------------------------------------------
// Labels and keys the controllers read
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn go_bools_and_the_exclusion_label(v in prop_oneof![
        proptest::sample::select(vec!["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False", "yes", "tRUE", ""]).prop_map(str::to_string),
        "\\PC{0,8}",
    ]) {
        let expected = match v.as_str() {
            "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
            "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
            _ => None,
        };
        prop_assert_eq!(parse_go_bool(&v), expected);
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "labels": {EXCLUDE_LB_LABEL: v}}
        })).unwrap();
        // Upstream: excluded unless the value is a Go boolean false.
        prop_assert_eq!(node_included(&node.into()), expected == Some(false));
    }

    #[test]
    fn object_keys(key in "\\PC{0,30}", ns in "[a-z0-9-]{1,20}", name in "[a-z0-9.-]{1,30}") {
        match split_key(&key) {
            // `name` or `namespace/name` (`/name` gives an empty namespace, as client-go).
            Ok((n, m)) => prop_assert_eq!(if key.contains('/') { format!("{n}/{m}") } else { m.clone() }, key),
            Err(e) => {
                prop_assert!(key.matches('/').count() >= 2);
                let quoted = format!("{key:?}");
                prop_assert!(e.contains(&quoted), "{}", e);
            }
        }
        prop_assert_eq!(split_key(&format!("{ns}/{name}")), Ok((ns, name.clone())));
        prop_assert_eq!(split_key(&name), Ok((String::new(), name)));
    }
}

// ---------------------------------------------------------------------------------------------
// The fake provider's cloud config
// ---------------------------------------------------------------------------------------------

/// YAML-ish documents built from the schema's keys, values of the wrong and right shapes, and
/// junk.
fn yamlish() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        proptest::sample::select(vec![
            "providerName",
            "hasClusterID",
            "disableInstances",
            "disableInstancesV2",
            "stateDir",
            "cloudStateFile",
            "sharedState",
            "instances",
            "autoInstances",
            "defaults",
            "clusters",
            "master",
            "externalIP",
            "ipPool",
            "ipMode",
            "ensureReturnsNil",
            "implementedElsewhere",
            "routes",
            "routeEnableNodeAddresses",
            "errors",
            "latency",
            "panics",
            "hang",
            "pause",
        ])
        .prop_map(str::to_string),
        "[a-zA-Z*]{1,10}",
    ];
    let value = prop_oneof![
        Just("true".to_string()),
        Just("\"\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("null".to_string()),
        Just("[{name: n1}, {name: n1}]".to_string()),
        Just("[{name: ''}]".to_string()),
        Just("{EnsureLoadBalancer: {kind: retry_after}}".to_string()),
        Just("{Bogus: 5ms}".to_string()),
        Just("{\"*\": 1.5s}".to_string()),
        Just("198.18.0.0/15".to_string()),
        Just("fd00::/64".to_string()),
        Just("[Initialize, Nope]".to_string()),
        "[0-9]{1,12}(ms|s|x|)",
        "\\PC{0,16}",
    ];
    prop::collection::vec((key, value), 0..6).prop_map(|kv| {
        kv.into_iter()
            .map(|(k, v)| format!("{k}: {v}\n"))
            .collect::<String>()
    })
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("*".to_string()),
        proptest::sample::select(METHODS.to_vec()).prop_map(str::to_string)
    ]
}

/// Valid configurations (the fields with the most structure).
fn valid_config() -> impl Strategy<Value = FakeConfig> {
    let kind = proptest::sample::select(vec![
        InjectedKind::Other,
        InjectedKind::NotFound,
        InjectedKind::InstanceNotFound,
        InjectedKind::NotImplemented,
        InjectedKind::ImplementedElsewhere,
        InjectedKind::InvalidConfig,
        InjectedKind::Throttled,
        InjectedKind::Unauthorized,
        InjectedKind::Cancelled,
    ]);
    let error = (
        kind,
        proptest::option::of(0u32..5),
        proptest::option::of("[a-z ]{0,12}"),
        any::<bool>(),
        0u64..100_000,
    )
        .prop_map(|(kind, times, message, retry, ms)| {
            let mut e = if retry {
                ErrorSpec::retry_after(Duration::from_millis(ms))
            } else {
                ErrorSpec::new(kind)
            };
            e.times = times;
            e.message = message;
            e
        });
    (
        proptest::option::of("[a-z][a-z0-9-]{0,10}"),
        any::<bool>(),
        prop::collection::btree_set("[a-z][a-z0-9-]{0,8}", 0..4),
        (any_ipv4(), 8u8..=30),
        prop::collection::btree_map(method(), error, 0..4),
        prop::collection::btree_map(method(), 0u64..10_000_000, 0..4),
        prop::collection::vec(method(), 0..3),
        prop::collection::vec(method(), 0..3),
    )
        .prop_map(
            |(provider_name, auto, names, (net, prefix), errors, latency, panics, hang)| {
                let mut c = FakeConfig {
                    provider_name,
                    auto_instances: auto,
                    ip_pool: format!("{net}/{prefix}").parse().unwrap(),
                    errors,
                    latency: latency
                        .into_iter()
                        .map(|(m, us)| (m, GoDuration(Duration::from_micros(us))))
                        .collect::<BTreeMap<_, _>>(),
                    panics,
                    hang,
                    ..FakeConfig::default()
                };
                c.instances = names.into_iter().map(InstanceConfig::named).collect();
                c
            },
        )
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn fake_config_any_bytes_parse_or_give_an_invalid_config_error(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Err(e) = FakeConfig::parse(&bytes) {
            prop_assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
            prop_assert!(!e.message().is_empty());
        }
    }

    #[test]
    fn fake_config_yamlish_documents(doc in yamlish()) {
        if let Err(e) = FakeConfig::parse(doc.as_bytes()) {
            prop_assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
            prop_assert!(e.message().starts_with("fake cloud config"), "{}", e.message());
        }
    }

    #[test]
    fn fake_config_valid_configs_round_trip(config in valid_config(), compact in any::<bool>()) {
        // JSON, one line or indented over many (the parser reads it as YAML either way).
        let text = if compact {
            serde_json::to_string(&config).unwrap()
        } else {
            serde_json::to_string_pretty(&config).unwrap()
        };
        prop_assert_eq!(FakeConfig::parse(text.as_bytes()).map_err(|e| e.to_string()), Ok(config));
    }
}
