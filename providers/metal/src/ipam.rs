//! The allocator: which addresses a service gets, given the pools, the allocations of every
//! other service and the service's request. Pure (no I/O), so every rule is unit-tested here;
//! [`crate::store`] persists the result and [`crate::loadbalancer`] ties the two together.
//!
//! Rules, per wanted family (in `spec.ipFamilies` order):
//! 1. A requested address is given if it is an assignable address of a pool that serves the
//!    namespace (and is the named pool, when one is named) and nobody holds it, or every holder
//!    shares it (same sharing key, no common `PROTOCOL/port`). Otherwise: an error.
//! 2. Else the address the service already has is kept while it is still valid (same tests).
//!    This is what makes allocations stable across restarts and re-syncs.
//! 3. Else the named pool, or every `autoAssign` pool serving the namespace (pools restricted
//!    to namespaces first, then global ones, each in config order): with a sharing key, first an
//!    address it can share; then the lowest free address.
//! 4. Nothing found: an error for a required family (exhaustion names the pools and their
//!    usage); the optional second family of `PreferDualStack` is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::pool::{to_u128, Family, Placement, Pool};
use crate::service::{Request, ServiceKey, POOL_ANNOTATION, SHARING_ANNOTATION};

/// One allocated address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedAddress {
    /// The address.
    pub ip: IpAddr,
    /// The pool it came from.
    pub pool: String,
}

/// What a service holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allocation {
    /// UID of the service it was made for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Addresses in `spec.ipFamilies` order.
    pub addresses: Vec<AllocatedAddress>,
    /// Sharing key, when the service allows sharing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing_key: Option<String>,
    /// `PROTOCOL/port` of the service, kept when it shares (to check later sharers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
}

impl Allocation {
    /// The addresses, in order.
    pub fn ips(&self) -> Vec<IpAddr> {
        self.addresses.iter().map(|a| a.ip).collect()
    }
}

/// Every service's allocation.
pub type Allocations = BTreeMap<ServiceKey, Allocation>;

/// Who holds an address (other than the service being allocated for).
type Holders<'a> = BTreeMap<IpAddr, Vec<(&'a ServiceKey, &'a Allocation)>>;

/// Why `req` may not use an address held by `holders`, if it may not.
fn share_refusal(req: &Request, holders: &[(&ServiceKey, &Allocation)]) -> Option<String> {
    for (k, a) in holders {
        let reason = match (&req.sharing_key, &a.sharing_key) {
            (None, _) => format!(
                "it is allocated to service {k} (to share it, both services need the same {SHARING_ANNOTATION} annotation)"
            ),
            (Some(_), None) => {
                format!("it is allocated to service {k}, which does not allow sharing")
            }
            (Some(mine), Some(theirs)) if mine != theirs => format!(
                "it is allocated to service {k}, whose sharing key is {theirs:?}, not {mine:?}"
            ),
            _ => match req.ports.iter().find(|p| a.ports.contains(p)) {
                Some(p) => format!("port {p} is already used on it by service {k}"),
                None => continue,
            },
        };
        return Some(reason);
    }
    None
}

/// Decide the allocation of `req`. `allocations` may contain `req`'s own current allocation.
pub fn assign(
    pools: &[Pool],
    allocations: &Allocations,
    req: &Request,
) -> Result<Allocation, String> {
    let ns = req.key.namespace.as_str();
    let named = match &req.pool {
        None => None,
        Some(name) => {
            let pool = pools.iter().find(|p| &p.name == name).ok_or_else(|| {
                let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
                format!(
                    "service {}: pool {name:?} (annotation {POOL_ANNOTATION}) does not exist; pools: {}",
                    req.key,
                    names.join(", ")
                )
            })?;
            if !pool.serves(ns) {
                return Err(format!(
                    "service {}: pool {name:?} does not serve namespace {ns:?} (it serves {})",
                    req.key,
                    pool.namespaces
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            Some(pool)
        }
    };

    let mut holders: Holders<'_> = BTreeMap::new();
    let mut used: BTreeMap<Family, BTreeSet<u128>> = BTreeMap::new();
    for (k, a) in allocations {
        if *k == req.key {
            continue;
        }
        for addr in &a.addresses {
            holders.entry(addr.ip).or_default().push((k, a));
            used.entry(Family::of(addr.ip))
                .or_default()
                .insert(to_u128(addr.ip));
        }
    }
    let existing = allocations.get(&req.key);
    let empty = BTreeSet::new();

    // Is `ip` usable by `req` from `pool`? `Err` says why not.
    let usable = |ip: IpAddr| -> Result<&Pool, String> {
        let mut found = None;
        for p in pools {
            match p.placement(ip) {
                (Placement::Outside, _) => continue,
                (Placement::Assignable, _) => {
                    found = Some(p);
                    break;
                }
                (reserved, block) => {
                    let what = if reserved == Placement::Network {
                        "network"
                    } else {
                        "broadcast"
                    };
                    return Err(format!(
                        "{ip} is the {what} address of {} in pool {:?} and is never assigned",
                        block.map(|b| b.text()).unwrap_or_default(),
                        p.name
                    ));
                }
            }
        }
        let pool = found.ok_or_else(|| {
            let all: Vec<String> = pools.iter().map(Pool::describe).collect();
            format!("{ip} is outside every pool ({})", all.join("; "))
        })?;
        if let Some(n) = named {
            if n.name != pool.name {
                return Err(format!(
                    "{ip} is in pool {:?}, but the service names pool {:?}",
                    pool.name, n.name
                ));
            }
        }
        if !pool.serves(ns) {
            return Err(format!(
                "{ip} is in pool {:?}, which does not serve namespace {ns:?}",
                pool.name
            ));
        }
        if let Some(h) = holders.get(&ip) {
            if let Some(why) = share_refusal(req, h) {
                return Err(format!("{ip} is already taken: {why}"));
            }
        }
        Ok(pool)
    };

    let mut addresses = Vec::new();
    for want in &req.families {
        let family = want.family;
        if let Some(ip) = req.requested_for(family) {
            let pool =
                usable(ip).map_err(|e| format!("service {}: requested address {e}", req.key))?;
            addresses.push(AllocatedAddress {
                ip,
                pool: pool.name.clone(),
            });
            continue;
        }
        if let Some(prev) =
            existing.and_then(|a| a.addresses.iter().find(|x| Family::of(x.ip) == family))
        {
            match usable(prev.ip) {
                Ok(pool) => {
                    addresses.push(AllocatedAddress {
                        ip: prev.ip,
                        pool: pool.name.clone(),
                    });
                    continue;
                }
                Err(why) => log::info!(
                    "service {}: giving up its address {}: {why}",
                    req.key,
                    prev.ip
                ),
            }
        }
        // Automatic allocation.
        let candidates: Vec<&Pool> = match named {
            Some(p) => vec![p],
            None => {
                let auto = pools.iter().filter(|p| p.auto_assign && p.serves(ns));
                auto.clone()
                    .filter(|p| !p.namespaces.is_empty())
                    .chain(auto.filter(|p| p.namespaces.is_empty()))
                    .collect()
            }
        };
        let candidates: Vec<&Pool> = candidates
            .into_iter()
            .filter(|p| p.has_family(family))
            .collect();
        let used_f = used.get(&family).unwrap_or(&empty);
        let shared = req.sharing_key.as_ref().and_then(|_| {
            candidates.iter().find_map(|p| {
                holders
                    .iter()
                    .filter(|(ip, _)| Family::of(**ip) == family)
                    .filter(|(ip, _)| p.placement(**ip).0 == Placement::Assignable)
                    .find(|(_, h)| share_refusal(req, h).is_none())
                    .map(|(ip, _)| (*ip, *p))
            })
        });
        let chosen = shared.or_else(|| {
            candidates
                .iter()
                .find_map(|p| p.first_free(family, used_f).map(|ip| (ip, *p)))
        });
        match chosen {
            Some((ip, pool)) => addresses.push(AllocatedAddress {
                ip,
                pool: pool.name.clone(),
            }),
            None if !want.required => log::info!(
                "service {} ({}): no free {family} address, so it gets none of that family",
                req.key,
                req.policy
            ),
            None if candidates.is_empty() => {
                let why = match named {
                    Some(p) => format!("pool {:?} has no {family} addresses", p.name),
                    None => format!(
                        "no pool with {family} addresses and autoAssign serves namespace {ns:?}"
                    ),
                };
                return Err(format!(
                    "service {} ({}) needs an {family} address, but {why}",
                    req.key, req.policy
                ));
            }
            None => {
                let usage: Vec<String> = candidates
                    .iter()
                    .map(|p| {
                        format!(
                            "pool {:?} ({}) has {} of {} {family} addresses allocated",
                            p.name,
                            p.blocks
                                .iter()
                                .filter(|b| b.family() == family)
                                .map(|b| b.text())
                                .collect::<Vec<_>>()
                                .join(", "),
                            p.count_used(family, used_f),
                            p.size(family)
                        )
                    })
                    .collect();
                return Err(format!(
                    "no free {family} address for service {}: {}",
                    req.key,
                    usage.join("; ")
                ));
            }
        }
    }
    Ok(Allocation {
        uid: req.uid.clone(),
        addresses,
        sharing_key: req.sharing_key.clone(),
        ports: if req.sharing_key.is_some() {
            req.ports.clone()
        } else {
            Vec::new()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{parse_pools, PoolFile};
    use crate::service::WantedFamily;

    fn pools(spec: &[(&str, &[&str], &[&str], bool)]) -> Vec<Pool> {
        parse_pools(
            &spec
                .iter()
                .map(|(name, addrs, nss, auto)| PoolFile {
                    name: name.to_string(),
                    addresses: addrs.iter().map(|s| s.to_string()).collect(),
                    namespaces: nss.iter().map(|s| s.to_string()).collect(),
                    auto_assign: *auto,
                })
                .collect::<Vec<_>>(),
        )
        .unwrap()
    }

    fn key(s: &str) -> ServiceKey {
        let (namespace, name) = s.split_once('/').unwrap();
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn req(k: &str) -> Request {
        Request {
            key: key(k),
            uid: format!("uid-{k}"),
            families: vec![WantedFamily {
                family: Family::V4,
                required: true,
            }],
            requested: vec![],
            pool: None,
            sharing_key: None,
            ports: vec!["TCP/80".into()],
            policy: "SingleStack".into(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Assign and record, as the load balancer does.
    fn ensure(p: &[Pool], allocs: &mut Allocations, r: &Request) -> Result<Vec<IpAddr>, String> {
        let a = assign(p, allocs, r)?;
        let ips = a.ips();
        allocs.insert(r.key.clone(), a);
        Ok(ips)
    }

    #[test]
    fn lowest_free_address_then_exhaustion_then_reuse_after_release() {
        let p = pools(&[("small", &["10.0.0.0/30"], &[], true)]);
        let mut allocs = Allocations::new();
        assert_eq!(
            ensure(&p, &mut allocs, &req("a/one")).unwrap(),
            vec![ip("10.0.0.1")]
        );
        assert_eq!(
            ensure(&p, &mut allocs, &req("a/two")).unwrap(),
            vec![ip("10.0.0.2")]
        );
        let e = ensure(&p, &mut allocs, &req("a/three")).unwrap_err();
        assert_eq!(
            e,
            "no free IPv4 address for service a/three: pool \"small\" (10.0.0.0/30) has 2 of 2 IPv4 addresses allocated"
        );
        allocs.remove(&key("a/one"));
        assert_eq!(
            ensure(&p, &mut allocs, &req("a/three")).unwrap(),
            vec![ip("10.0.0.1")]
        );
    }

    #[test]
    fn an_allocation_is_kept_while_valid() {
        let p = pools(&[("a", &["10.0.0.0/29"], &[], true)]);
        let mut allocs = Allocations::new();
        ensure(&p, &mut allocs, &req("x/one")).unwrap();
        let two = ensure(&p, &mut allocs, &req("x/two")).unwrap();
        allocs.remove(&key("x/one"));
        // Re-ensuring does not move two/ to the now lower free address.
        assert_eq!(ensure(&p, &mut allocs, &req("x/two")).unwrap(), two);
        // Nor does a restart with the pools reordered or extended.
        let p2 = pools(&[
            ("b", &["10.0.1.0/29"], &[], true),
            ("a", &["10.0.0.0/29"], &[], true),
        ]);
        assert_eq!(ensure(&p2, &mut allocs, &req("x/two")).unwrap(), two);
        // Its pool gone from the config: it moves, with a log line.
        let p3 = pools(&[("b", &["10.0.1.0/29"], &[], true)]);
        assert_eq!(
            ensure(&p3, &mut allocs, &req("x/two")).unwrap(),
            vec![ip("10.0.1.1")]
        );
    }

    #[test]
    fn requested_addresses_are_honoured_or_refused_clearly() {
        let p = pools(&[
            ("pub", &["192.0.2.0/24"], &[], true),
            ("team", &["198.51.100.0/24"], &["team"], false),
        ]);
        let mut allocs = Allocations::new();
        let mut r = req("a/web");
        r.requested = vec![ip("192.0.2.77")];
        assert_eq!(ensure(&p, &mut allocs, &r).unwrap(), vec![ip("192.0.2.77")]);
        let mut other = req("a/other");
        other.requested = vec![ip("192.0.2.77")];
        let e = assign(&p, &allocs, &other).unwrap_err();
        assert!(e.starts_with("service a/other: requested address 192.0.2.77 is already taken: it is allocated to service a/web"), "{e}");
        other.requested = vec![ip("203.0.113.1")];
        let e = assign(&p, &allocs, &other).unwrap_err();
        assert!(
            e.contains(
                "203.0.113.1 is outside every pool (pub (192.0.2.0/24); team (198.51.100.0/24))"
            ),
            "{e}"
        );
        other.requested = vec![ip("192.0.2.255")];
        let e = assign(&p, &allocs, &other).unwrap_err();
        assert!(
            e.contains("192.0.2.255 is the broadcast address of 192.0.2.0/24 in pool \"pub\""),
            "{e}"
        );
        other.requested = vec![ip("192.0.2.0")];
        assert!(assign(&p, &allocs, &other)
            .unwrap_err()
            .contains("network address"));
        other.requested = vec![ip("198.51.100.5")];
        let e = assign(&p, &allocs, &other).unwrap_err();
        assert!(
            e.contains("pool \"team\", which does not serve namespace \"a\""),
            "{e}"
        );
        // A non-autoAssign pool serves explicit requests from its namespaces.
        let mut t = req("team/api");
        t.requested = vec![ip("198.51.100.5")];
        assert_eq!(
            ensure(&p, &mut allocs, &t).unwrap(),
            vec![ip("198.51.100.5")]
        );
        // Changing the request moves the service; its old address is free again.
        r.requested = vec![ip("192.0.2.78")];
        assert_eq!(ensure(&p, &mut allocs, &r).unwrap(), vec![ip("192.0.2.78")]);
        other.requested = vec![ip("192.0.2.77")];
        assert_eq!(
            ensure(&p, &mut allocs, &other).unwrap(),
            vec![ip("192.0.2.77")]
        );
    }

    #[test]
    fn named_pools_and_namespace_pools() {
        let p = pools(&[
            ("global", &["10.0.0.0/29"], &[], true),
            ("team", &["10.1.0.0/29"], &["team"], true),
            ("manual", &["10.2.0.0/29"], &[], false),
        ]);
        let mut allocs = Allocations::new();
        // Namespace pools come first for their namespaces.
        assert_eq!(
            ensure(&p, &mut allocs, &req("team/a")).unwrap(),
            vec![ip("10.1.0.1")]
        );
        assert_eq!(
            ensure(&p, &mut allocs, &req("other/a")).unwrap(),
            vec![ip("10.0.0.1")]
        );
        let mut r = req("other/b");
        r.pool = Some("manual".into());
        assert_eq!(ensure(&p, &mut allocs, &r).unwrap(), vec![ip("10.2.0.1")]);
        r.pool = Some("nope".into());
        let e = assign(&p, &allocs, &r).unwrap_err();
        assert_eq!(e, "service other/b: pool \"nope\" (annotation metal.ccm-host.io/pool) does not exist; pools: global, team, manual");
        r.pool = Some("team".into());
        let e = assign(&p, &allocs, &r).unwrap_err();
        assert_eq!(
            e,
            "service other/b: pool \"team\" does not serve namespace \"other\" (it serves team)"
        );
        // Naming another pool moves the service there.
        r.pool = Some("global".into());
        assert_eq!(ensure(&p, &mut allocs, &r).unwrap(), vec![ip("10.0.0.2")]);
        // A requested address must be in the named pool.
        r.requested = vec![ip("10.2.0.5")];
        let e = assign(&p, &allocs, &r).unwrap_err();
        assert!(
            e.contains("10.2.0.5 is in pool \"manual\", but the service names pool \"global\""),
            "{e}"
        );
    }

    #[test]
    fn ipv6_and_dual_stack() {
        let p = pools(&[
            ("v4only", &["10.0.0.0/29"], &[], true),
            ("dual", &["192.0.2.0/30", "2001:db8::/126"], &[], true),
        ]);
        let mut allocs = Allocations::new();
        let mut r = req("a/v6");
        r.families = vec![WantedFamily {
            family: Family::V6,
            required: true,
        }];
        assert_eq!(
            ensure(&p, &mut allocs, &r).unwrap(),
            vec![ip("2001:db8::1")]
        );
        let mut d = req("a/dual");
        d.families = vec![
            WantedFamily {
                family: Family::V6,
                required: true,
            },
            WantedFamily {
                family: Family::V4,
                required: true,
            },
        ];
        // Ingress order follows ipFamilies; each family from the first pool that has it.
        assert_eq!(
            ensure(&p, &mut allocs, &d).unwrap(),
            vec![ip("2001:db8::2"), ip("10.0.0.1")]
        );
        // Exhaust v6, then PreferDualStack degrades to single stack, RequireDualStack fails.
        let mut fill = req("a/fill");
        fill.families = r.families.clone();
        ensure(&p, &mut allocs, &fill).unwrap();
        let mut prefer = req("a/prefer");
        prefer.families = vec![
            WantedFamily {
                family: Family::V4,
                required: true,
            },
            WantedFamily {
                family: Family::V6,
                required: false,
            },
        ];
        assert_eq!(
            ensure(&p, &mut allocs, &prefer).unwrap(),
            vec![ip("10.0.0.2")]
        );
        let mut require = req("a/require");
        require.families = vec![
            WantedFamily {
                family: Family::V4,
                required: true,
            },
            WantedFamily {
                family: Family::V6,
                required: true,
            },
        ];
        let e = assign(&p, &allocs, &require).unwrap_err();
        assert!(e.starts_with("no free IPv6 address for service a/require: pool \"dual\" (2001:db8::/126) has 3 of 3 IPv6 addresses allocated"), "{e}");
        // A named pool without the family.
        require.pool = Some("v4only".into());
        require.policy = "RequireDualStack".into();
        let e = assign(&p, &allocs, &require).unwrap_err();
        assert_eq!(e, "service a/require (RequireDualStack) needs an IPv6 address, but pool \"v4only\" has no IPv6 addresses");
        // Releasing a v6 address lets the preferring service gain its second family.
        allocs.remove(&key("a/v6"));
        assert_eq!(
            ensure(&p, &mut allocs, &prefer).unwrap(),
            vec![ip("10.0.0.2"), ip("2001:db8::1")]
        );
        // Dual to single stack drops the extra family.
        d.families.truncate(1);
        assert_eq!(
            ensure(&p, &mut allocs, &d).unwrap(),
            vec![ip("2001:db8::2")]
        );
    }

    #[test]
    fn sharing_needs_the_same_key_and_distinct_ports() {
        let p = pools(&[("a", &["10.0.0.0/29"], &[], true)]);
        let mut allocs = Allocations::new();
        let mut web = req("n/web");
        web.sharing_key = Some("k".into());
        web.ports = vec!["TCP/80".into()];
        let ips = ensure(&p, &mut allocs, &web).unwrap();
        // Same key, other port: automatic allocation joins the shared address.
        let mut tls = req("n/tls");
        tls.sharing_key = Some("k".into());
        tls.ports = vec!["TCP/443".into()];
        assert_eq!(ensure(&p, &mut allocs, &tls).unwrap(), ips);
        // Same key, colliding port: a new address.
        let mut web2 = req("n/web2");
        web2.sharing_key = Some("k".into());
        web2.ports = vec!["TCP/80".into()];
        assert_eq!(
            ensure(&p, &mut allocs, &web2).unwrap(),
            vec![ip("10.0.0.2")]
        );
        // ...and an explicit request for the shared address says why not.
        web2.requested = ips.clone();
        let e = assign(&p, &allocs, &web2).unwrap_err();
        assert!(
            e.contains(
                "10.0.0.1 is already taken: port TCP/80 is already used on it by service n/web"
            ),
            "{e}"
        );
        // UDP/80 does not collide with TCP/80.
        let mut dns = req("n/dns");
        dns.sharing_key = Some("k".into());
        dns.ports = vec!["UDP/80".into()];
        dns.requested = ips.clone();
        assert_eq!(ensure(&p, &mut allocs, &dns).unwrap(), ips);
        // Other key, or no key: refused.
        let mut other = req("n/other");
        other.ports = vec!["TCP/8080".into()];
        other.requested = ips.clone();
        assert!(assign(&p, &allocs, &other)
            .unwrap_err()
            .contains("need the same metal.ccm-host.io/allow-shared-ip annotation"));
        other.sharing_key = Some("j".into());
        assert!(assign(&p, &allocs, &other)
            .unwrap_err()
            .contains("whose sharing key is \"k\", not \"j\""));
        // A sharer changing its ports into a collision moves away.
        tls.ports = vec!["TCP/80".into()];
        let moved = ensure(&p, &mut allocs, &tls).unwrap();
        assert_ne!(moved, ips);
        // Releasing one sharer keeps the address with the others.
        allocs.remove(&key("n/web"));
        assert_eq!(ensure(&p, &mut allocs, &dns).unwrap(), ips);
    }

    #[test]
    fn sharing_with_a_service_that_does_not_share_is_refused() {
        let p = pools(&[("a", &["10.0.0.0/29"], &[], true)]);
        let mut allocs = Allocations::new();
        let plain = ensure(&p, &mut allocs, &req("n/plain")).unwrap();
        let mut s = req("n/s");
        s.sharing_key = Some("k".into());
        s.ports = vec!["TCP/9".into()];
        // Automatic allocation does not join a non-sharing holder.
        assert_ne!(ensure(&p, &mut allocs, &s).unwrap(), plain);
        s.requested = plain.clone();
        let e = assign(&p, &allocs, &s).unwrap_err();
        assert!(
            e.contains("allocated to service n/plain, which does not allow sharing"),
            "{e}"
        );
    }

    #[test]
    fn allocations_round_trip_through_json() {
        let a = Allocation {
            uid: "u".into(),
            addresses: vec![
                AllocatedAddress {
                    ip: ip("10.0.0.1"),
                    pool: "p".into(),
                },
                AllocatedAddress {
                    ip: ip("2001:db8::1"),
                    pool: "p".into(),
                },
            ],
            sharing_key: Some("k".into()),
            ports: vec!["TCP/80".into()],
        };
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"uid":"u","addresses":[{"ip":"10.0.0.1","pool":"p"},{"ip":"2001:db8::1","pool":"p"}],"sharingKey":"k","ports":["TCP/80"]}"#
        );
        assert_eq!(serde_json::from_str::<Allocation>(&text).unwrap(), a);
    }
}
