//! Property tests of the pool and inventory parsers and of the allocator.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use crate::config::{parse_pools, PoolFile};
use crate::inventory::{AddressFile, Inventory, InventoryFile, MachineFile, MachineState};
use crate::ipam::{assign, Allocation, Allocations};
use crate::pool::{to_u128, AddressBlock, Family, Placement};
use crate::service::{Request, ServiceKey, WantedFamily};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Arbitrary text never panics the address parser.
    #[test]
    fn address_parser_never_panics(s in "[0-9a-fA-F:./ -]{0,40}") {
        let _ = AddressBlock::parse(&s);
    }

    /// Every IPv4 CIDR parses to the expected assignable bounds.
    #[test]
    fn ipv4_cidrs_have_the_expected_assignable_set(addr in any::<u32>(), prefix in 0u8..=32) {
        let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
        let network = addr & mask;
        let text = format!("{}/{prefix}", Ipv4Addr::from(network));
        let b = AddressBlock::parse(&text).unwrap();
        let total = 1u128 << (32 - prefix);
        let expected = if prefix <= 30 { total - 2 } else { total };
        prop_assert_eq!(b.size(), expected);
        let first = b.first_free(&Default::default()).unwrap();
        let want_first = u128::from(network) + u128::from(prefix <= 30);
        prop_assert_eq!(to_u128(first), want_first);
        prop_assert_eq!(b.placement(first), Placement::Assignable);
        // Host bits set: refused with the network named.
        if prefix < 32 && addr != network {
            let bad = format!("{}/{prefix}", Ipv4Addr::from(addr));
            prop_assert!(AddressBlock::parse(&bad).unwrap_err().contains(&text));
        }
    }

    /// Every IPv6 CIDR: only the subnet-router anycast address is skipped (up to /126).
    #[test]
    fn ipv6_cidrs_have_the_expected_size(addr in any::<u128>(), prefix in 0u8..=128) {
        let mask = if prefix == 0 { 0 } else { u128::MAX << (128 - prefix) };
        let network = addr & mask;
        let b = AddressBlock::parse(&format!("{}/{prefix}", Ipv6Addr::from(network))).unwrap();
        let expected = if prefix == 0 {
            u128::MAX
        } else {
            let total = 1u128 << (128 - prefix);
            if prefix <= 126 { total - 1 } else { total }
        };
        prop_assert_eq!(b.size(), expected);
        prop_assert_eq!(b.family(), Family::V6);
    }

    /// A range parses iff first <= last; its size is last - first + 1.
    #[test]
    fn ranges_parse_iff_ordered(a in any::<u32>(), b in any::<u32>()) {
        let text = format!("{}-{}", Ipv4Addr::from(a), Ipv4Addr::from(b));
        match AddressBlock::parse(&text) {
            Ok(block) => {
                prop_assert!(a <= b);
                prop_assert_eq!(block.size(), u128::from(b - a) + 1);
            }
            Err(e) => {
                prop_assert!(a > b);
                prop_assert!(e.contains("is empty"));
            }
        }
    }

    /// Pools are accepted iff no two entries overlap.
    #[test]
    fn pool_overlap_detection_is_exact(starts in prop::collection::vec((0u32..64, 0u32..8), 1..6)) {
        let files: Vec<PoolFile> = starts
            .iter()
            .enumerate()
            .map(|(i, (s, len))| PoolFile {
                name: format!("p{i}"),
                addresses: vec![format!("{}-{}", Ipv4Addr::from(0x0a00_0000 + s), Ipv4Addr::from(0x0a00_0000 + s + len))],
                namespaces: vec![],
                auto_assign: true,
            })
            .collect();
        let overlapping = starts.iter().enumerate().any(|(i, (s1, l1))| {
            starts.iter().skip(i + 1).any(|(s2, l2)| s1 <= &(s2 + l2) && s2 <= &(s1 + l1))
        });
        let result = parse_pools(&files);
        prop_assert_eq!(result.is_err(), overlapping, "{:?}", result.err());
    }

    /// Arbitrary text never panics the inventory parser.
    #[test]
    fn inventory_parser_never_panics(s in "[a-z:{}\\[\\], \n\\-0-9.'\"]{0,120}") {
        let _ = Inventory::parse(&s);
    }

    /// Generated valid inventories round-trip through YAML; every machine is found by its
    /// provider ID, its name and each of its addresses. A duplicated provider ID is refused.
    #[test]
    fn valid_inventories_round_trip(n in 1usize..12, states in prop::collection::vec(0u8..3, 12), dup in 0usize..12) {
        let machines: Vec<MachineFile> = (0..n)
            .map(|i| MachineFile {
                name: format!("node-{i}"),
                id: (i % 2 == 0).then(|| format!("id-{i}")),
                provider_id: (i % 2 == 1).then(|| format!("metal://id-{i}")),
                instance_type: "t1".into(),
                zone: format!("z{}", i % 3),
                region: "r".into(),
                addresses: vec![
                    AddressFile { type_: "InternalIP".into(), address: format!("10.0.{}.{}", i / 200, i % 200 + 1) },
                    AddressFile { type_: "InternalIP".into(), address: format!("fd00::{:x}", i + 1) },
                    AddressFile { type_: "Hostname".into(), address: format!("host-{i}.example") },
                ],
                labels: BTreeMap::from([("example.com/idx".to_string(), i.to_string())]),
                state: [MachineState::Running, MachineState::Shutdown, MachineState::Absent][states[i] as usize],
            })
            .collect();
        let file = InventoryFile { machines: machines.clone() };
        let text = yaml_serde::to_string(&file).unwrap();
        let inv = Inventory::parse(&text).unwrap();
        prop_assert_eq!(inv.machines().len(), n);
        for (i, m) in inv.machines().iter().enumerate() {
            prop_assert_eq!(&m.provider_id, &format!("metal://id-{i}"));
            prop_assert_eq!(&inv.by_provider_id(&m.provider_id).unwrap().name, &m.name);
            for a in &m.addresses {
                let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "unrelated"},
                    "status": {"addresses": [{"type": a.type_, "address": a.address}]}
                })).unwrap();
                prop_assert_eq!(&inv.find(&node).unwrap().unwrap().0.name, &m.name);
            }
        }
        if n > 1 {
            let mut bad = machines;
            let j = dup % n;
            let k = (j + 1) % n;
            bad[k].id = None;
            bad[k].provider_id = Some(format!("metal://id-{j}"));
            let e = Inventory::from_file(InventoryFile { machines: bad }).unwrap_err();
            prop_assert!(e.contains("duplicate provider ID"), "{}", e);
        }
    }
}

/// One step of an allocator scenario.
#[derive(Debug, Clone)]
enum Op {
    Ensure {
        svc: usize,
        shared: Option<u8>,
        port: u16,
        policy: u8,
        request: Option<u8>,
    },
    Delete(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..10, prop::option::of(0u8..2), 1u16..4, 0u8..4, prop::option::weighted(0.2, 0u8..8))
            .prop_map(|(svc, shared, port, policy, request)| Op::Ensure { svc, shared, port, policy, request }),
        1 => (0usize..10).prop_map(Op::Delete),
    ]
}

fn request(
    svc: usize,
    shared: Option<u8>,
    port: u16,
    policy: u8,
    requested: Option<u8>,
) -> Request {
    let f = |family, required| WantedFamily { family, required };
    let (families, policy_name) = match policy {
        0 => (vec![f(Family::V4, true)], "SingleStack"),
        1 => (vec![f(Family::V6, true)], "SingleStack"),
        2 => (
            vec![f(Family::V4, true), f(Family::V6, false)],
            "PreferDualStack",
        ),
        _ => (
            vec![f(Family::V6, true), f(Family::V4, true)],
            "RequireDualStack",
        ),
    };
    let requested = requested
        .map(|n| {
            let fam = families[0].family;
            match fam {
                Family::V4 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, n)),
                Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n))),
            }
        })
        .into_iter()
        .collect();
    Request {
        key: ServiceKey {
            namespace: if svc.is_multiple_of(3) {
                "team".into()
            } else {
                "ns".into()
            },
            name: format!("s{svc}"),
        },
        uid: format!("u{svc}"),
        families,
        requested,
        pool: None,
        sharing_key: shared.map(|k| format!("k{k}")),
        ports: vec![format!("TCP/{port}")],
        policy: policy_name.into(),
    }
}

fn check_invariants(
    pools: &[crate::pool::Pool],
    allocs: &Allocations,
) -> Result<(), TestCaseError> {
    let mut holders: BTreeMap<IpAddr, Vec<(&ServiceKey, &Allocation)>> = BTreeMap::new();
    for (k, a) in allocs {
        prop_assert!(!a.addresses.is_empty());
        let mut fams: Vec<Family> = a.addresses.iter().map(|x| Family::of(x.ip)).collect();
        fams.dedup();
        prop_assert_eq!(fams.len(), a.addresses.len(), "one address per family");
        for x in &a.addresses {
            let pool = pools.iter().find(|p| p.name == x.pool).unwrap();
            prop_assert_eq!(pool.placement(x.ip).0, Placement::Assignable);
            prop_assert!(pool.serves(&k.namespace));
            holders.entry(x.ip).or_default().push((k, a));
        }
    }
    for (ip, hs) in &holders {
        if hs.len() > 1 {
            let key = &hs[0].1.sharing_key;
            prop_assert!(key.is_some(), "{} shared without a key", ip);
            for (i, (_, a)) in hs.iter().enumerate() {
                prop_assert_eq!(&a.sharing_key, key);
                for (_, b) in hs.iter().skip(i + 1) {
                    prop_assert!(
                        a.ports.iter().all(|p| !b.ports.contains(p)),
                        "port collision on {}",
                        ip
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Random sequences of ensures and deletes: no address is ever held against the rules, an
    /// ensure is idempotent, and a restart (allocations through JSON, pools re-parsed) changes
    /// nothing. Exhaustion is reported only when the pool is really full.
    #[test]
    fn allocator_keeps_its_invariants(ops in prop::collection::vec(op(), 1..40)) {
        let files = vec![
            PoolFile { name: "team".into(), addresses: vec!["10.0.0.0/30".into()], namespaces: vec!["team".into()], auto_assign: true },
            PoolFile { name: "main".into(), addresses: vec!["10.0.0.4-10.0.0.7".into(), "fd00::/125".into()], namespaces: vec![], auto_assign: true },
        ];
        let pools = parse_pools(&files).unwrap();
        let mut allocs = Allocations::new();
        for op in ops {
            match op {
                Op::Delete(svc) => {
                    allocs.retain(|k, _| k.name != format!("s{svc}"));
                }
                Op::Ensure { svc, shared, port, policy, request: requested } => {
                    let r = request(svc, shared, port, policy, requested);
                    match assign(&pools, &allocs, &r) {
                        Ok(a) => {
                            allocs.insert(r.key.clone(), a.clone());
                            // Idempotent.
                            prop_assert_eq!(assign(&pools, &allocs, &r).unwrap(), a.clone());
                            // Restart: allocations through their stored form, pools re-parsed.
                            let stored: BTreeMap<String, String> = allocs
                                .iter()
                                .map(|(k, v)| (k.data_key(), serde_json::to_string(v).unwrap()))
                                .collect();
                            let reloaded: Allocations = stored
                                .iter()
                                .map(|(k, v)| (ServiceKey::from_data_key(k).unwrap(), serde_json::from_str(v).unwrap()))
                                .collect();
                            prop_assert_eq!(&reloaded, &allocs);
                            let pools2 = parse_pools(&files).unwrap();
                            prop_assert_eq!(assign(&pools2, &reloaded, &r).unwrap(), a);
                        }
                        Err(e) => {
                            if e.starts_with("no free ") && r.requested.is_empty() && r.sharing_key.is_none() {
                                // The family that failed really is full in every candidate pool.
                                let fam = if e.starts_with("no free IPv4") { Family::V4 } else { Family::V6 };
                                let used: std::collections::BTreeSet<u128> = allocs
                                    .iter()
                                    .filter(|(k, _)| **k != r.key)
                                    .flat_map(|(_, a)| a.addresses.iter().map(|x| to_u128(x.ip)))
                                    .collect();
                                for p in pools.iter().filter(|p| p.serves(&r.key.namespace)) {
                                    prop_assert!(p.first_free(fam, &used).is_none(), "{} but pool {} has room", e, p.name);
                                }
                            }
                            prop_assert!(e.contains(&r.key.to_string()), "error names the service: {}", e);
                        }
                    }
                }
            }
            check_invariants(&pools, &allocs)?;
        }
    }
}
