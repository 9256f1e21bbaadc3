//! The `--cloud-config` of the `metal` provider (YAML or JSON, camelCase keys, unknown keys
//! refused; see `docs/metal-provider.md`).
//!
//! ```yaml
//! inventory: /etc/kubernetes/metal/inventory.yaml
//! loadBalancer:
//!   pools:
//!     - name: public
//!       addresses: [192.0.2.0/27, 2001:db8:1::/120]
//! ```

use std::collections::{BTreeSet, HashSet};
use std::path::PathBuf;

use ccm_provider_abi::ProviderError;
use serde::{Deserialize, Serialize};

use crate::names;
use crate::pool::{AddressBlock, Pool};

/// Default namespace of the allocation ConfigMap.
pub const DEFAULT_STATE_NAMESPACE: &str = "kube-system";
/// Default name of the allocation ConfigMap.
pub const DEFAULT_STATE_NAME: &str = "ccm-metal-ipam";

fn yes() -> bool {
    true
}

/// The config file as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MetalConfigFile {
    /// Path of the machine inventory (enables InstancesV2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<PathBuf>,
    /// Load-balancer IP address management (enables LoadBalancer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerFile>,
}

/// `loadBalancer` as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerFile {
    /// The pools, in the order automatic allocation tries them.
    #[serde(default)]
    pub pools: Vec<PoolFile>,
    /// Where allocations are kept.
    #[serde(default)]
    pub state_config_map: StateConfigMap,
    /// `ipMode` of the published ingress (`VIP` or `Proxy`); unset by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_mode: Option<String>,
}

/// The ConfigMap that keeps the allocations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateConfigMap {
    /// Namespace (default `kube-system`).
    #[serde(default = "default_state_namespace")]
    pub namespace: String,
    /// Name (default `ccm-metal-ipam`).
    #[serde(default = "default_state_name")]
    pub name: String,
}

fn default_state_namespace() -> String {
    DEFAULT_STATE_NAMESPACE.into()
}

fn default_state_name() -> String {
    DEFAULT_STATE_NAME.into()
}

impl Default for StateConfigMap {
    fn default() -> Self {
        Self {
            namespace: default_state_namespace(),
            name: default_state_name(),
        }
    }
}

/// One pool as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolFile {
    /// Pool name.
    pub name: String,
    /// CIDRs, ranges `first-last` and single addresses, IPv4 and IPv6.
    pub addresses: Vec<String>,
    /// Namespaces served; empty or absent = every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Used for services that name no pool and request no address (default true).
    #[serde(default = "yes")]
    pub auto_assign: bool,
}

/// The validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct MetalConfig {
    /// Inventory path, when InstancesV2 is wanted.
    pub inventory: Option<PathBuf>,
    /// Load-balancer settings, when LoadBalancer is wanted.
    pub load_balancer: Option<LoadBalancerConfig>,
}

/// Validated `loadBalancer`.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadBalancerConfig {
    /// The pools, validated (names unique, no address in two blocks).
    pub pools: Vec<Pool>,
    /// Where allocations are kept.
    pub state: StateConfigMap,
    /// `ipMode` of the published ingress.
    pub ip_mode: Option<String>,
}

fn invalid(message: impl std::fmt::Display) -> ProviderError {
    ProviderError::invalid_config(format!(
        "metal cloud config: {message} (see docs/metal-provider.md)"
    ))
}

impl MetalConfig {
    /// Parse and validate the `--cloud-config` bytes (`None`: no config was given).
    pub fn parse(bytes: Option<&[u8]>) -> Result<Self, ProviderError> {
        let Some(bytes) = bytes else {
            return Err(invalid(
                "the metal provider needs a --cloud-config naming an inventory file and/or load-balancer pools",
            ));
        };
        let text = std::str::from_utf8(bytes)
            .map_err(|e| invalid(format!("the file is not UTF-8 text: {e}")))?;
        if text.trim().is_empty() {
            return Err(invalid(
                "the file is empty; it must name an inventory file and/or load-balancer pools",
            ));
        }
        let file: MetalConfigFile = yaml_serde::from_str(text)
            .map_err(|e| invalid(format!("does not parse as YAML or JSON: {e}")))?;
        Self::from_file(file)
    }

    /// Validate a parsed file.
    pub fn from_file(file: MetalConfigFile) -> Result<Self, ProviderError> {
        if file.inventory.is_none() && file.load_balancer.is_none() {
            return Err(invalid(
                "neither `inventory` nor `loadBalancer` is set: the provider would offer nothing",
            ));
        }
        if let Some(p) = &file.inventory {
            if p.as_os_str().is_empty() {
                return Err(invalid("`inventory` is an empty path"));
            }
        }
        let load_balancer = file
            .load_balancer
            .map(LoadBalancerConfig::from_file)
            .transpose()?;
        Ok(Self {
            inventory: file.inventory,
            load_balancer,
        })
    }
}

impl LoadBalancerConfig {
    fn from_file(lb: LoadBalancerFile) -> Result<Self, ProviderError> {
        if lb.pools.is_empty() {
            return Err(invalid(
                "`loadBalancer.pools` is empty: no address to give out",
            ));
        }
        if let Some(mode) = &lb.ip_mode {
            if mode != "VIP" && mode != "Proxy" {
                return Err(invalid(format!(
                    "`loadBalancer.ipMode` is {mode:?}; it must be VIP or Proxy"
                )));
            }
        }
        names::dns1123_label(&lb.state_config_map.namespace)
            .map_err(|e| invalid(format!("`loadBalancer.stateConfigMap.namespace`: {e}")))?;
        names::dns1123_subdomain(&lb.state_config_map.name)
            .map_err(|e| invalid(format!("`loadBalancer.stateConfigMap.name`: {e}")))?;
        let pools = parse_pools(&lb.pools).map_err(invalid)?;
        Ok(Self {
            pools,
            state: lb.state_config_map,
            ip_mode: lb.ip_mode,
        })
    }
}

/// Validate pools: names (DNS-1123 labels, unique), namespaces, address entries, and that no
/// address belongs to two entries (of one pool or of two).
pub fn parse_pools(files: &[PoolFile]) -> Result<Vec<Pool>, String> {
    let mut seen = HashSet::new();
    let mut pools = Vec::with_capacity(files.len());
    for (i, p) in files.iter().enumerate() {
        names::dns1123_label(&p.name)
            .map_err(|e| format!("pool #{} name {:?}: {e}", i + 1, p.name))?;
        if !seen.insert(p.name.clone()) {
            return Err(format!("pool name {:?} is used twice", p.name));
        }
        if p.addresses.is_empty() {
            return Err(format!("pool {:?} has no addresses", p.name));
        }
        let blocks = p
            .addresses
            .iter()
            .map(|a| AddressBlock::parse(a).map_err(|e| format!("pool {:?}: {e}", p.name)))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(b) = blocks.iter().find(|b| b.size() == 0) {
            return Err(format!(
                "pool {:?}: {} has no assignable address",
                p.name,
                b.text()
            ));
        }
        let mut namespaces = BTreeSet::new();
        for ns in &p.namespaces {
            names::dns1123_label(ns)
                .map_err(|e| format!("pool {:?} namespace {ns:?}: {e}", p.name))?;
            namespaces.insert(ns.clone());
        }
        pools.push(Pool {
            name: p.name.clone(),
            blocks,
            namespaces,
            auto_assign: p.auto_assign,
        });
    }
    // Overlaps: sort every block by (family, start) and compare neighbours.
    let mut all: Vec<(&str, &AddressBlock)> = pools
        .iter()
        .flat_map(|p| p.blocks.iter().map(move |b| (p.name.as_str(), b)))
        .collect();
    all.sort_by_key(|(_, b)| (b.family(), b.extent().0));
    let mut widest: Option<(&str, &AddressBlock)> = None;
    for &(pool, block) in &all {
        if let Some((wp, wb)) = widest {
            if wb.overlaps(block) {
                return Err(format!(
                    "{} (pool {wp:?}) and {} (pool {pool:?}) overlap: an address can belong to one pool entry only",
                    wb.text(),
                    block.text()
                ));
            }
            if wb.family() == block.family() && wb.extent().1 >= block.extent().1 {
                continue;
            }
        }
        widest = Some((pool, block));
    }
    Ok(pools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_provider_abi::ErrorKind;

    fn parse(text: &str) -> Result<MetalConfig, ProviderError> {
        MetalConfig::parse(Some(text.as_bytes()))
    }

    fn err(text: &str) -> String {
        let e = parse(text).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::INVALID_CONFIG);
        e.to_string()
    }

    #[test]
    fn full_config_parses_with_defaults() {
        let c = parse(
            r#"
inventory: /etc/metal/inventory.yaml
loadBalancer:
  ipMode: VIP
  pools:
    - name: public
      addresses: [192.0.2.0/28, "192.0.2.100-192.0.2.110", "2001:db8::/120"]
    - name: team-a
      addresses: [198.51.100.7]
      namespaces: [team-a]
      autoAssign: false
"#,
        )
        .unwrap();
        assert_eq!(
            c.inventory.as_deref(),
            Some(std::path::Path::new("/etc/metal/inventory.yaml"))
        );
        let lb = c.load_balancer.unwrap();
        assert_eq!(lb.state, StateConfigMap::default());
        assert_eq!(lb.ip_mode.as_deref(), Some("VIP"));
        assert_eq!(lb.pools.len(), 2);
        assert!(lb.pools[0].auto_assign && lb.pools[0].serves("x"));
        assert!(!lb.pools[1].auto_assign && !lb.pools[1].serves("x"));
        assert!(lb.pools[1].serves("team-a"));
    }

    #[test]
    fn json_is_accepted_and_each_half_is_optional() {
        let c = parse(r#"{"inventory": "inv.yaml"}"#).unwrap();
        assert!(c.load_balancer.is_none());
        let c = parse(
            r#"{"loadBalancer": {"pools": [{"name": "a", "addresses": ["10.0.0.0/30"]}],
                          "stateConfigMap": {"namespace": "metal", "name": "ipam.v1"}}}"#,
        )
        .unwrap();
        assert!(c.inventory.is_none());
        assert_eq!(c.load_balancer.unwrap().state.name, "ipam.v1");
    }

    #[test]
    fn every_bad_input_gets_a_clear_error() {
        assert!(MetalConfig::parse(None)
            .unwrap_err()
            .to_string()
            .contains("needs a --cloud-config"));
        assert!(err("  ").contains("the file is empty"));
        assert!(err("{}").contains("neither `inventory` nor `loadBalancer`"));
        assert!(err("inventory: ''").contains("empty path"));
        assert!(err("inventroy: x").contains("unknown field `inventroy`"));
        assert!(err("loadBalancer: {pools: []}").contains("pools` is empty"));
        assert!(
            err("loadBalancer: {ipMode: Direct, pools: [{name: a, addresses: [10.0.0.1]}]}")
                .contains("must be VIP or Proxy")
        );
        assert!(
            err("loadBalancer: {pools: [{name: A, addresses: [10.0.0.1]}]}")
                .contains("pool #1 name \"A\"")
        );
        assert!(err("loadBalancer: {pools: [{name: a, addresses: []}]}")
            .contains("pool \"a\" has no addresses"));
        assert!(err("loadBalancer: {pools: [{name: a, addresses: [10.0.0.1]}, {name: a, addresses: [10.0.0.2]}]}")
            .contains("\"a\" is used twice"));
        assert!(
            err("loadBalancer: {pools: [{name: a, addresses: [10.0.0.1/24]}]}")
                .contains("host bits set")
        );
        assert!(err(
            "loadBalancer: {pools: [{name: a, addresses: [10.0.0.1], namespaces: [Bad_NS]}]}"
        )
        .contains("namespace \"Bad_NS\""));
        assert!(err("loadBalancer: {stateConfigMap: {namespace: ''}, pools: [{name: a, addresses: [10.0.0.1]}]}")
            .contains("stateConfigMap.namespace"));
        let overlap = err("loadBalancer: {pools: [{name: a, addresses: [10.0.0.0/24]}, {name: b, addresses: [10.0.0.200-10.0.1.5]}]}");
        assert!(
            overlap
                .contains("10.0.0.0/24 (pool \"a\") and 10.0.0.200-10.0.1.5 (pool \"b\") overlap"),
            "{overlap}"
        );
        let inner = err(
            "loadBalancer: {pools: [{name: a, addresses: [10.0.0.0/16, 10.0.9.9, 10.0.200.0/24]}]}",
        );
        assert!(inner.contains("overlap"), "{inner}");
    }

    /// The yaml block following `<!-- marker -->` in docs/metal-provider.md.
    fn doc_example(marker: &str) -> String {
        let doc = include_str!("../../../docs/metal-provider.md");
        let start = doc
            .find(&format!("<!-- {marker} -->"))
            .unwrap_or_else(|| panic!("marker {marker} in the doc"));
        let rest = &doc[start..];
        let body = &rest[rest.find("```yaml\n").unwrap() + 8..];
        body[..body.find("```").unwrap()].to_string()
    }

    #[test]
    fn the_documented_examples_are_valid() {
        let c = parse(&doc_example("cloud-config")).unwrap();
        let lb = c.load_balancer.unwrap();
        assert_eq!(lb.pools.len(), 3);
        // The sizes the doc states.
        assert_eq!(lb.pools[0].size(crate::pool::Family::V4), 83);
        assert_eq!(lb.pools[0].size(crate::pool::Family::V6), 255);
        assert!(!lb.pools[2].auto_assign);
        let inv = crate::inventory::Inventory::parse(&doc_example("inventory")).unwrap();
        assert_eq!(inv.machines().len(), 3);
        assert_eq!(
            inv.by_name("node-a").unwrap().provider_id,
            "metal://rack1-07"
        );
    }

    #[test]
    fn disjoint_pools_of_both_families_are_accepted() {
        let pools = parse_pools(&[
            PoolFile {
                name: "a".into(),
                addresses: vec!["10.0.0.0/24".into(), "fd00::/64".into()],
                namespaces: vec![],
                auto_assign: true,
            },
            PoolFile {
                name: "b".into(),
                addresses: vec!["10.0.1.0-10.0.1.9".into(), "fd00:0:0:1::/64".into()],
                namespaces: vec![],
                auto_assign: true,
            },
        ])
        .unwrap();
        assert_eq!(pools.len(), 2);
    }
}
