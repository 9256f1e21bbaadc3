//! `--controllers`: which controllers run, with upstream's exact semantics
//! (docs/upstream-compat.md#controller-selection).
//!
//! Beyond upstream's generic manager: the names of controllers that only a vendor's own CCM
//! has ([`VENDOR_ONLY`], e.g. GCE's chart passes `--controllers=*,-nodeipam`) are accepted
//! and have no effect (named in the start-up warning), so those charts run unchanged; any
//! other unknown name is an error, as upstream's.

pub use crate::controllers::ControllerName;
use crate::controllers::{Controller, CONTROLLERS};

/// Controllers of vendors' own cloud-controller-managers that ccm-host does not have, with
/// whose they are: accepted in `--controllers` without effect.
pub const VENDOR_ONLY: [(&str, &str); 5] = [
    (
        "nodeipam",
        "GCE (cloud-provider-gcp) and upstream's node IPAM",
    ),
    ("node-ipam", "Azure (cloud-provider-azure)"),
    ("node-ipam-controller", "upstream's node IPAM"),
    ("tagging", "AWS (cloud-provider-aws)"),
    ("tagging-controller", "AWS (cloud-provider-aws)"),
];

/// The parsed `--controllers` list (aliases rewritten to canonical names, dashes kept).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    items: Vec<String>,
    /// Items naming a vendor-only controller ([`VENDOR_ONLY`]), as given.
    vendor_only: Vec<String>,
}

impl ControllerSelection {
    /// Parse a comma list of `*`, `name` and `-name` items. Unknown names give upstream's error
    /// text, one per unknown item.
    pub fn parse(items: &[String]) -> Result<Self, Vec<String>> {
        let mut resolved = Vec::new();
        let mut vendor_only = Vec::new();
        let mut errors = Vec::new();
        for raw in items.iter().flat_map(|i| i.split(',')) {
            let item = raw.trim();
            if item == "*" {
                resolved.push(item.to_string());
                continue;
            }
            let (dash, name) = match item.strip_prefix('-') {
                Some(rest) => ("-", rest),
                None => ("", item),
            };
            match CONTROLLERS
                .iter()
                .map(|c| c.name)
                .find(|c| c.canonical == name || c.alias == name)
            {
                Some(c) => resolved.push(format!("{dash}{}", c.canonical)),
                None if VENDOR_ONLY.iter().any(|(v, _)| *v == name) => {
                    vendor_only.push(item.to_string());
                }
                None => errors.push(format!("{name:?} is not in the list of known controllers")),
            }
        }
        if errors.is_empty() {
            Ok(Self {
                items: resolved,
                vendor_only,
            })
        } else {
            Err(errors)
        }
    }

    /// Upstream's rule: the first item equal to `name` enables it, the first equal to `-name`
    /// disables it; if neither appears, it is enabled iff `*` appears anywhere.
    pub fn is_enabled(&self, canonical: &str) -> bool {
        for item in &self.items {
            if item == canonical {
                return true;
            }
            if item.strip_prefix('-') == Some(canonical) {
                return false;
            }
        }
        self.items.iter().any(|i| i == "*")
    }

    /// The enabled controllers, in start order.
    pub fn enabled(&self) -> Vec<&'static Controller> {
        CONTROLLERS
            .iter()
            .filter(|c| self.is_enabled(c.name.canonical))
            .collect()
    }

    /// The vendor-only items given (for the no-effect warning), each with whose controller it is.
    pub fn vendor_only(&self) -> Vec<String> {
        self.vendor_only
            .iter()
            .map(|item| {
                let name = item.trim_start_matches('-');
                let whose = VENDOR_ONLY
                    .iter()
                    .find(|(v, _)| *v == name)
                    .map_or("", |(_, w)| w);
                format!("--controllers {item} (a controller of {whose}; none here)")
            })
            .collect()
    }

    /// A warning for selections that are almost certainly a mistake: only `-name` items
    /// disable everything (upstream semantics), where `*,-name` was meant.
    pub fn warning(&self) -> Option<String> {
        if !self.items.is_empty() && self.items.iter().all(|i| i.starts_with('-')) {
            let list = self.items.join(",");
            return Some(format!(
                "--controllers={list} disables every controller (only '-name' items and no '*'); \
                 did you mean --controllers=*,{list}?"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(s: &str) -> ControllerSelection {
        ControllerSelection::parse(&[s.to_string()]).unwrap()
    }

    fn names(s: &ControllerSelection) -> Vec<&'static str> {
        s.enabled().iter().map(|c| c.name.alias).collect()
    }

    #[test]
    fn upstream_matrix() {
        assert_eq!(
            names(&sel("*")),
            ["cloud-node", "cloud-node-lifecycle", "service", "route"]
        );
        assert_eq!(
            names(&sel("*,-route")),
            ["cloud-node", "cloud-node-lifecycle", "service"]
        );
        assert_eq!(
            names(&sel("*,-node-route-controller")),
            ["cloud-node", "cloud-node-lifecycle", "service"]
        );
        assert_eq!(names(&sel("service,route")), ["service", "route"]);
        assert!(
            names(&sel("-route")).is_empty(),
            "a lone -name disables everything"
        );
        assert!(sel("-route")
            .warning()
            .unwrap()
            .contains("did you mean --controllers=*,-node-route-controller"));
        assert!(sel("*,-route").warning().is_none());
        // The first occurrence wins.
        assert_eq!(
            names(&sel("-service,service,*")),
            ["cloud-node", "cloud-node-lifecycle", "route"]
        );
        assert_eq!(names(&sel("service,-service")), ["service"]);
    }

    #[test]
    fn unknown_names_use_upstream_text() {
        let err = ControllerSelection::parse(&["*,-bogus,nodeipm".to_string()]).unwrap_err();
        assert_eq!(
            err,
            [
                "\"bogus\" is not in the list of known controllers",
                "\"nodeipm\" is not in the list of known controllers"
            ]
        );
    }

    #[test]
    fn vendor_charts_controller_names_are_accepted_without_effect() {
        // GCE's chart, AWS's and Azure's names.
        let s = sel("*,-nodeipam,tagging,-node-ipam");
        assert_eq!(
            names(&s),
            ["cloud-node", "cloud-node-lifecycle", "service", "route"]
        );
        assert_eq!(
            s.vendor_only(),
            [
                "--controllers -nodeipam (a controller of GCE (cloud-provider-gcp) and upstream's node IPAM; none here)",
                "--controllers tagging (a controller of AWS (cloud-provider-aws); none here)",
                "--controllers -node-ipam (a controller of Azure (cloud-provider-azure); none here)",
            ]
        );
        assert!(sel("*,-route").vendor_only().is_empty());
        // A vendor name alone still selects nothing of ours, as upstream's "-name" rule.
        assert!(names(&sel("tagging")).is_empty());
    }

    #[test]
    fn names_follow_upstream_conventions() {
        for c in CONTROLLERS.iter().map(|c| c.name) {
            assert!(c.canonical.ends_with("-controller"));
            assert!(c
                .canonical
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch == '-'));
        }
    }
}
