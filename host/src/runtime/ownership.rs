//! Node ownership in hybrid clusters: which of the active providers a Node belongs to
//! (KEP-5778, "explicit node ownership to allow multiple CCMs"; docs/hybrid-clusters.md).
//!
//! Every provider owns platforms: providerID prefixes such as `aws://` (ABI 1.1 `platforms`, a
//! 1.0 plugin owns `<ProviderName>://`, `--cloud-provider-platforms` overrides either). The
//! owner of a Node is decided in this order:
//!
//! 1. its `spec.providerID`: the provider with the longest platform that prefixes it; no
//!    provider → the node is foreign and never touched;
//! 2. without a providerID, the label `topology.kubernetes.io/platform` (else the annotation
//!    `cloudprovider.kubernetes.io/platform`, the KEP draft's other spelling): a platform name
//!    (`aws`) or prefix (`aws://`); a platform no provider owns → foreign;
//! 3. neither: unclaimed. The node-ownership controller (`controllers::node_ownership`) asks
//!    the providers in the configured order whether they know an unclaimed node that waits for
//!    initialisation, and labels it with the platform of the first that does.
//!
//! Ownership is *enforced* (each provider's controllers see only the nodes it owns) when
//! several providers run or `--cloud-provider-platforms` is given. One provider without that
//! flag sees every node, exactly as upstream does.

use std::sync::Arc;

use crate::runtime::cached_node::CachedNode;

/// The KEP-5778 node label naming a node's platform (e.g. `aws`).
pub const PLATFORM_LABEL: &str = "topology.kubernetes.io/platform";
/// The annotation spelling of [`PLATFORM_LABEL`] in the KEP's later draft; read, never written.
pub const PLATFORM_ANNOTATION: &str = "cloudprovider.kubernetes.io/platform";

/// Who owns a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The active provider with this index (in `--cloud-provider` order).
    Provider(usize),
    /// A platform no active provider owns: never touched.
    Foreign,
    /// No providerID and no platform label yet.
    Unclaimed,
}

/// A platform as a providerID prefix: `aws` → `aws://`; a value with `://` is kept as it is.
pub fn platform_prefix(platform: &str) -> String {
    let p = platform.trim();
    if p.contains("://") {
        p.to_string()
    } else {
        format!("{p}://")
    }
}

/// The platform name of a prefix (its scheme): `aws:///us-east-1a` → `aws`. This is the value
/// of [`PLATFORM_LABEL`].
pub fn platform_name(prefix: &str) -> &str {
    prefix.split("://").next().unwrap_or(prefix)
}

/// Is `name` a valid label value (what [`PLATFORM_LABEL`] can hold)?
fn is_label_value(name: &str) -> bool {
    name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric())
}

/// The active providers' platforms and whether ownership is enforced. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ownership {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Provider names, in `--cloud-provider` order.
    names: Vec<String>,
    /// Each provider's platforms (prefixes).
    platforms: Vec<Vec<String>>,
    enforced: bool,
}

impl Ownership {
    /// The ownership of `providers` (`(name, platforms)` in `--cloud-provider` order).
    /// Two providers claiming the same platform, or a platform that is empty or cannot be a
    /// label value, is an error naming them.
    pub fn new(providers: &[(String, Vec<String>)], enforced: bool) -> Result<Self, String> {
        let mut names = Vec::new();
        let mut platforms = Vec::new();
        let mut seen: Vec<(String, &str)> = Vec::new();
        for (name, list) in providers {
            let mut prefixes = Vec::new();
            for p in list {
                let prefix = platform_prefix(p);
                if !is_label_value(platform_name(&prefix)) {
                    return Err(format!(
                        "provider {name}: platform {p:?} is not a valid platform (its name before \
                         \"://\" must be 1-63 letters, digits, '-', '_' or '.')"
                    ));
                }
                if let Some((_, other)) = seen.iter().find(|(q, _)| *q == prefix) {
                    return Err(if other == name {
                        format!("provider {name} lists the platform {prefix} twice")
                    } else {
                        format!(
                            "providers {other} and {name} both claim the platform {prefix}: a node's \
                             owner must be unique (set --cloud-provider-platforms to split them)"
                        )
                    });
                }
                seen.push((prefix.clone(), name));
                prefixes.push(prefix);
            }
            names.push(name.clone());
            platforms.push(prefixes);
        }
        Ok(Self {
            inner: Arc::new(Inner {
                names,
                platforms,
                enforced,
            }),
        })
    }

    /// Whether each provider sees only the nodes it owns.
    pub fn enforced(&self) -> bool {
        self.inner.enforced
    }

    /// The provider names, in order.
    pub fn names(&self) -> &[String] {
        &self.inner.names
    }

    /// The platforms (prefixes) of provider `index`.
    pub fn platforms(&self, index: usize) -> &[String] {
        &self.inner.platforms[index]
    }

    /// The label value naming provider `index`'s (first) platform.
    pub fn label_value(&self, index: usize) -> &str {
        platform_name(&self.inner.platforms[index][0])
    }

    /// The provider owning `provider_id`: the longest platform prefix that matches.
    pub fn owner_of_provider_id(&self, provider_id: &str) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (i, list) in self.inner.platforms.iter().enumerate() {
            for p in list {
                if provider_id.starts_with(p.as_str()) && best.is_none_or(|(_, len)| p.len() > len)
                {
                    best = Some((i, p.len()));
                }
            }
        }
        best.map(|(i, _)| i)
    }

    /// The provider owning the platform `value` of a label or annotation: a name (`aws`)
    /// matches a platform's scheme, a prefix (`aws://`) matches it exactly; the first provider
    /// in order wins when several have platforms of the same scheme.
    pub fn owner_of_platform(&self, value: &str) -> Option<usize> {
        let value = value.trim();
        self.inner.platforms.iter().position(|list| {
            list.iter().any(|p| {
                if value.contains("://") {
                    p == value
                } else {
                    platform_name(p) == value
                }
            })
        })
    }

    /// Who owns `node` (see the module comment).
    pub fn owner(&self, node: &CachedNode) -> Owner {
        let provider_id = node.provider_id().unwrap_or_default();
        if !provider_id.is_empty() {
            return self
                .owner_of_provider_id(provider_id)
                .map_or(Owner::Foreign, Owner::Provider);
        }
        let declared = node
            .label(PLATFORM_LABEL)
            .or_else(|| node.annotation(PLATFORM_ANNOTATION))
            .filter(|v| !v.trim().is_empty());
        match declared {
            Some(value) => self
                .owner_of_platform(value)
                .map_or(Owner::Foreign, Owner::Provider),
            None => Owner::Unclaimed,
        }
    }

    /// The provider a node without a providerID names itself by its own label or annotation,
    /// and which of the two (`label topology.kubernetes.io/platform=aws`): `None` when the node
    /// has a providerID, names no platform, or a platform no provider owns.
    pub fn declared_owner(&self, node: &CachedNode) -> Option<(usize, String)> {
        let has_provider_id = node.provider_id().is_some_and(|p| !p.is_empty());
        if has_provider_id {
            return None;
        }
        let (kind, key, value) = match node.label(PLATFORM_LABEL).filter(|v| !v.trim().is_empty()) {
            Some(v) => ("label", PLATFORM_LABEL, v),
            None => (
                "annotation",
                PLATFORM_ANNOTATION,
                node.annotation(PLATFORM_ANNOTATION)
                    .filter(|v| !v.trim().is_empty())?,
            ),
        };
        let owner = self.owner_of_platform(value)?;
        Some((owner, format!("{kind} {key}={value}")))
    }

    /// Does provider `index` handle `node`? Everything when ownership is not enforced.
    pub fn handles(&self, index: usize, node: &CachedNode) -> bool {
        !self.inner.enforced || self.owner(node) == Owner::Provider(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(
        provider_id: Option<&str>,
        label: Option<&str>,
        annotation: Option<&str>,
    ) -> CachedNode {
        let mut v = json!({"metadata": {"name": "n"}, "spec": {}});
        if let Some(p) = provider_id {
            v["spec"]["providerID"] = json!(p);
        }
        if let Some(l) = label {
            v["metadata"]["labels"] = json!({ PLATFORM_LABEL: l });
        }
        if let Some(a) = annotation {
            v["metadata"]["annotations"] = json!({ PLATFORM_ANNOTATION: a });
        }
        serde_json::from_value::<k8s_openapi::api::core::v1::Node>(v)
            .unwrap()
            .into()
    }

    fn two() -> Ownership {
        Ownership::new(
            &[
                ("aws".into(), vec!["aws://".into()]),
                (
                    "metal".into(),
                    vec!["metal".into(), "aws:///on-prem".into()],
                ),
            ],
            true,
        )
        .unwrap()
    }

    #[test]
    fn provider_ids_go_to_the_longest_platform() {
        let o = two();
        assert_eq!(
            o.owner(&node(Some("aws:///eu-west-1a/i-1"), None, None)),
            Owner::Provider(0)
        );
        assert_eq!(
            o.owner(&node(Some("aws:///on-prem/box-1"), None, None)),
            Owner::Provider(1)
        );
        assert_eq!(
            o.owner(&node(Some("metal://rack1/b"), None, None)),
            Owner::Provider(1)
        );
        assert_eq!(
            o.owner(&node(Some("kwok://k-1"), None, None)),
            Owner::Foreign
        );
        // A providerID wins over a label that says otherwise.
        assert_eq!(
            o.owner(&node(Some("kwok://k-1"), Some("aws"), None)),
            Owner::Foreign
        );
    }

    #[test]
    fn labels_and_annotations_name_the_platform_of_a_node_without_provider_id() {
        let o = two();
        assert_eq!(
            o.owner(&node(None, Some("metal"), None)),
            Owner::Provider(1)
        );
        assert_eq!(
            o.owner(&node(None, Some("metal://"), None)),
            Owner::Provider(1)
        );
        assert_eq!(o.owner(&node(None, None, Some("aws"))), Owner::Provider(0));
        assert_eq!(
            o.owner(&node(None, Some("kwok"), Some("aws"))),
            Owner::Foreign
        );
        assert_eq!(o.owner(&node(None, None, None)), Owner::Unclaimed);
        assert_eq!(o.owner(&node(Some(""), Some(" "), None)), Owner::Unclaimed);
        assert!(o.handles(1, &node(None, Some("metal"), None)));
        assert!(!o.handles(0, &node(None, Some("metal"), None)));
    }

    #[test]
    fn a_platform_claimed_twice_is_refused_with_both_names() {
        let err = Ownership::new(
            &[
                ("fake".into(), vec!["fake://".into()]),
                ("fake-v1".into(), vec!["fake".into()]),
            ],
            true,
        )
        .unwrap_err();
        assert!(
            err.contains("providers fake and fake-v1 both claim the platform fake://"),
            "{err}"
        );
        assert!(Ownership::new(&[("x".into(), vec!["a b://".into()])], true).is_err());
    }

    #[test]
    fn not_enforced_handles_every_node() {
        let o = Ownership::new(&[("aws".into(), vec!["aws://".into()])], false).unwrap();
        assert!(o.handles(0, &node(Some("kwok://x"), None, None)));
        assert_eq!(o.label_value(0), "aws");
    }
}
