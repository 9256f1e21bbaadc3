//! Address pools: parsing of CIDRs, ranges and single addresses, which addresses of them are
//! assignable, and the search for the lowest free one.
//!
//! Addresses are handled as `u128` numbers within their family, so an IPv6 `/64` costs no more
//! than an IPv4 `/30`: the free-address search walks the *allocated* addresses, never the pool.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// An IP family, spelled as Kubernetes spells it in `spec.ipFamilies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `IPv4`
    V4,
    /// `IPv6`
    V6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::V4,
            IpAddr::V6(_) => Self::V6,
        }
    }

    /// `IPv4` / `IPv6`.
    pub fn name(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }

    /// The other family.
    pub fn other(self) -> Self {
        match self {
            Self::V4 => Self::V6,
            Self::V6 => Self::V4,
        }
    }

    /// Parse `IPv4` / `IPv6`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "IPv4" => Some(Self::V4),
            "IPv6" => Some(Self::V6),
            _ => None,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `ip` as a number within its family.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address numbered `n` in `family` (`n` must fit the family).
pub fn from_u128(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// One entry of a pool's `addresses`: a CIDR, an inclusive range `first-last`, or one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressBlock {
    text: String,
    family: Family,
    /// The whole block (a CIDR's network and broadcast addresses included).
    start: u128,
    end: u128,
    /// The assignable part of it.
    first: u128,
    last: u128,
}

/// Where an address falls relative to a block or a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Not in it.
    Outside,
    /// In it and assignable.
    Assignable,
    /// The network address of a CIDR (not assigned).
    Network,
    /// The broadcast address of an IPv4 CIDR (not assigned).
    Broadcast,
}

impl AddressBlock {
    /// Parse one `addresses` entry: `192.0.2.0/24`, `192.0.2.10-192.0.2.20`, `2001:db8::/64`,
    /// `192.0.2.7`. In a CIDR the network address is skipped (IPv4 up to /30 and IPv6 up to
    /// /126: the IPv6 subnet-router anycast address) and so is the IPv4 broadcast address; /31,
    /// /32, /127 and /128 are used whole (RFC 3021). Ranges and single addresses are used as
    /// written.
    pub fn parse(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.is_empty() {
            return Err("an empty address entry".into());
        }
        if t.contains('/') {
            let net: IpNet = t.parse().map_err(|_| {
                format!("{t:?} is not a CIDR (expected e.g. 192.0.2.0/24 or 2001:db8::/120)")
            })?;
            if net.addr() != net.network() {
                return Err(format!(
                    "{t:?} has host bits set: the network is {}/{}",
                    net.network(),
                    net.prefix_len()
                ));
            }
            let family = Family::of(net.addr());
            let start = to_u128(net.network());
            let end = to_u128(net.broadcast());
            let (skip_network, skip_broadcast) = match family {
                Family::V4 => (net.prefix_len() <= 30, net.prefix_len() <= 30),
                Family::V6 => (net.prefix_len() <= 126, false),
            };
            return Ok(Self {
                text: t.to_string(),
                family,
                start,
                end,
                first: start + u128::from(skip_network),
                last: end - u128::from(skip_broadcast),
            });
        }
        if let Some((a, b)) = t.split_once('-') {
            let parse = |s: &str| -> Result<IpAddr, String> {
                s.trim().parse().map_err(|_| {
                    format!(
                        "{t:?}: {:?} is not an IP address (a range is first-last)",
                        s.trim()
                    )
                })
            };
            let (first, last) = (parse(a)?, parse(b)?);
            if Family::of(first) != Family::of(last) {
                return Err(format!("{t:?} mixes an IPv4 and an IPv6 address"));
            }
            let (start, end) = (to_u128(first), to_u128(last));
            if start > end {
                return Err(format!("{t:?} is empty: {first} comes after {last}"));
            }
            return Ok(Self {
                text: t.to_string(),
                family: Family::of(first),
                start,
                end,
                first: start,
                last: end,
            });
        }
        let ip: IpAddr = t.parse().map_err(|_| {
            format!("{t:?} is neither a CIDR, a range (first-last) nor an IP address")
        })?;
        let n = to_u128(ip);
        Ok(Self {
            text: t.to_string(),
            family: Family::of(ip),
            start: n,
            end: n,
            first: n,
            last: n,
        })
    }

    /// The entry as written (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Its family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Whole extent, network and broadcast included: `(start, end)`.
    pub fn extent(&self) -> (u128, u128) {
        (self.start, self.end)
    }

    /// Number of assignable addresses (saturating at `u128::MAX`).
    pub fn size(&self) -> u128 {
        if self.first > self.last {
            return 0;
        }
        (self.last - self.first).saturating_add(1)
    }

    /// Where `ip` falls in this block.
    pub fn placement(&self, ip: IpAddr) -> Placement {
        if Family::of(ip) != self.family {
            return Placement::Outside;
        }
        let n = to_u128(ip);
        if n < self.start || n > self.end {
            Placement::Outside
        } else if n < self.first {
            Placement::Network
        } else if n > self.last {
            Placement::Broadcast
        } else {
            Placement::Assignable
        }
    }

    /// The lowest assignable address not in `used` (numbers of this block's family).
    pub fn first_free(&self, used: &BTreeSet<u128>) -> Option<IpAddr> {
        if self.first > self.last {
            return None;
        }
        let mut candidate = self.first;
        for &u in used.range(self.first..=self.last) {
            if u != candidate {
                break;
            }
            if candidate == self.last {
                return None;
            }
            candidate += 1;
        }
        Some(from_u128(self.family, candidate))
    }

    /// Does this block share an address with `other`?
    pub fn overlaps(&self, other: &Self) -> bool {
        self.family == other.family && self.start <= other.end && other.start <= self.end
    }
}

/// A named pool of addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// Its name (what the pool annotation names).
    pub name: String,
    /// Its address blocks, in the order they are searched.
    pub blocks: Vec<AddressBlock>,
    /// Namespaces it serves; empty = every namespace.
    pub namespaces: BTreeSet<String>,
    /// Whether services that name no pool and request no address get addresses from it.
    pub auto_assign: bool,
}

impl Pool {
    /// Does this pool serve services of `namespace`?
    pub fn serves(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.contains(namespace)
    }

    /// Does it have addresses of `family`?
    pub fn has_family(&self, family: Family) -> bool {
        self.blocks
            .iter()
            .any(|b| b.family == family && b.size() > 0)
    }

    /// Where `ip` falls in this pool, with the block it falls in.
    pub fn placement(&self, ip: IpAddr) -> (Placement, Option<&AddressBlock>) {
        for b in &self.blocks {
            match b.placement(ip) {
                Placement::Outside => continue,
                p => return (p, Some(b)),
            }
        }
        (Placement::Outside, None)
    }

    /// Assignable addresses of `family` (saturating).
    pub fn size(&self, family: Family) -> u128 {
        self.blocks
            .iter()
            .filter(|b| b.family == family)
            .fold(0u128, |acc, b| acc.saturating_add(b.size()))
    }

    /// How many of `used` (numbers of `family`) are assignable addresses of this pool.
    pub fn count_used(&self, family: Family, used: &BTreeSet<u128>) -> u128 {
        self.blocks
            .iter()
            .filter(|b| b.family == family && b.first <= b.last)
            .map(|b| used.range(b.first..=b.last).count() as u128)
            .sum()
    }

    /// The lowest free address of `family`, blocks in order.
    pub fn first_free(&self, family: Family, used: &BTreeSet<u128>) -> Option<IpAddr> {
        self.blocks
            .iter()
            .filter(|b| b.family == family)
            .find_map(|b| b.first_free(used))
    }

    /// `name (a, b, c)` for messages.
    pub fn describe(&self) -> String {
        let blocks: Vec<&str> = self.blocks.iter().map(|b| b.text()).collect();
        format!("{} ({})", self.name, blocks.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn all_free(b: &AddressBlock) -> Vec<IpAddr> {
        let mut used = BTreeSet::new();
        let mut out = Vec::new();
        while let Some(a) = b.first_free(&used) {
            out.push(a);
            used.insert(to_u128(a));
        }
        out
    }

    #[test]
    fn cidrs_skip_network_and_broadcast() {
        let b = AddressBlock::parse("192.0.2.0/29").unwrap();
        assert_eq!(b.size(), 6);
        let got = all_free(&b);
        assert_eq!(got.first(), Some(&ip("192.0.2.1")));
        assert_eq!(got.last(), Some(&ip("192.0.2.6")));
        assert_eq!(got.len(), 6);
        assert_eq!(b.placement(ip("192.0.2.0")), Placement::Network);
        assert_eq!(b.placement(ip("192.0.2.7")), Placement::Broadcast);
        assert_eq!(b.placement(ip("192.0.2.8")), Placement::Outside);
        assert_eq!(b.placement(ip("2001:db8::1")), Placement::Outside);
    }

    #[test]
    fn point_to_point_and_host_cidrs_are_used_whole() {
        let b = AddressBlock::parse("192.0.2.4/31").unwrap();
        assert_eq!(all_free(&b), vec![ip("192.0.2.4"), ip("192.0.2.5")]);
        let b = AddressBlock::parse("192.0.2.9/32").unwrap();
        assert_eq!(all_free(&b), vec![ip("192.0.2.9")]);
        let b = AddressBlock::parse("2001:db8::/127").unwrap();
        assert_eq!(all_free(&b), vec![ip("2001:db8::"), ip("2001:db8::1")]);
        let b = AddressBlock::parse("192.0.2.0/30").unwrap();
        assert_eq!(all_free(&b), vec![ip("192.0.2.1"), ip("192.0.2.2")]);
    }

    #[test]
    fn ipv6_cidrs_skip_only_the_subnet_router_anycast_address() {
        let b = AddressBlock::parse("2001:db8::/126").unwrap();
        assert_eq!(
            all_free(&b),
            vec![ip("2001:db8::1"), ip("2001:db8::2"), ip("2001:db8::3")]
        );
        assert_eq!(b.placement(ip("2001:db8::")), Placement::Network);
        let big = AddressBlock::parse("2001:db8::/64").unwrap();
        assert_eq!(big.size(), (1u128 << 64) - 1);
        assert_eq!(big.first_free(&BTreeSet::new()), Some(ip("2001:db8::1")));
        let all = AddressBlock::parse("::/0").unwrap();
        assert_eq!(all.size(), u128::MAX);
    }

    #[test]
    fn ranges_and_single_addresses_are_used_as_written() {
        let b = AddressBlock::parse(" 192.0.2.10 - 192.0.2.12 ").unwrap();
        assert_eq!(b.text(), "192.0.2.10 - 192.0.2.12");
        assert_eq!(
            all_free(&b),
            vec![ip("192.0.2.10"), ip("192.0.2.11"), ip("192.0.2.12")]
        );
        let b = AddressBlock::parse("192.0.2.255").unwrap();
        assert_eq!(all_free(&b), vec![ip("192.0.2.255")]);
        let b = AddressBlock::parse("2001:db8::ffff-2001:db8::1:1").unwrap();
        assert_eq!(b.size(), 3);
    }

    #[test]
    fn bad_entries_say_what_is_wrong() {
        let err = |s: &str| AddressBlock::parse(s).unwrap_err();
        assert!(err("").contains("empty"));
        assert!(err("192.0.2.5/24").contains("host bits set: the network is 192.0.2.0/24"));
        assert!(err("192.0.2.0/33").contains("is not a CIDR"));
        assert!(err("192.0.2.9-192.0.2.1").contains("is empty"));
        assert!(err("192.0.2.1-2001:db8::1").contains("mixes"));
        assert!(err("192.0.2.1-x").contains("\"x\" is not an IP address"));
        assert!(err("pool-a").contains("is not an IP address"));
        assert!(err("example.com").contains("neither a CIDR"));
    }

    #[test]
    fn first_free_skips_used_addresses_and_wraps_to_none() {
        let b = AddressBlock::parse("10.0.0.0/30").unwrap();
        let used: BTreeSet<u128> = [to_u128(ip("10.0.0.1"))].into();
        assert_eq!(b.first_free(&used), Some(ip("10.0.0.2")));
        let used: BTreeSet<u128> = [to_u128(ip("10.0.0.2"))].into();
        assert_eq!(b.first_free(&used), Some(ip("10.0.0.1")));
        let used: BTreeSet<u128> = [ip("10.0.0.1"), ip("10.0.0.2")]
            .into_iter()
            .map(to_u128)
            .collect();
        assert_eq!(b.first_free(&used), None);
        // The top of the IPv6 space does not overflow.
        let top = AddressBlock::parse("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff").unwrap();
        let used: BTreeSet<u128> = [u128::MAX].into();
        assert_eq!(top.first_free(&used), None);
    }

    #[test]
    fn pools_search_blocks_in_order_and_count_usage() {
        let pool = Pool {
            name: "p".into(),
            blocks: vec![
                AddressBlock::parse("10.0.0.5").unwrap(),
                AddressBlock::parse("10.0.1.0/30").unwrap(),
                AddressBlock::parse("fd00::/126").unwrap(),
            ],
            namespaces: BTreeSet::new(),
            auto_assign: true,
        };
        assert_eq!(pool.size(Family::V4), 3);
        assert_eq!(pool.size(Family::V6), 3);
        let mut used = BTreeSet::new();
        assert_eq!(pool.first_free(Family::V4, &used), Some(ip("10.0.0.5")));
        used.insert(to_u128(ip("10.0.0.5")));
        assert_eq!(pool.first_free(Family::V4, &used), Some(ip("10.0.1.1")));
        assert_eq!(pool.count_used(Family::V4, &used), 1);
        assert!(pool.serves("any"));
        assert_eq!(pool.describe(), "p (10.0.0.5, 10.0.1.0/30, fd00::/126)");
        assert_eq!(pool.placement(ip("10.0.1.3")).0, Placement::Broadcast);
    }
}
