//! The AWS CCM's cluster and ownership tags.

use std::collections::BTreeMap;

/// `kubernetes.io/cluster/<id>`: `owned` on what the cluster created, `shared` on what it uses.
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// The legacy cluster tag (`KubernetesCluster = <id>`).
pub const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";
/// `kubernetes.io/service-name = <namespace>/<name>` on load-balancer resources.
pub const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";
/// Subnets for internet-facing load balancers.
pub const ROLE_ELB_TAG: &str = "kubernetes.io/role/elb";
/// Subnets for internal load balancers.
pub const ROLE_INTERNAL_ELB_TAG: &str = "kubernetes.io/role/internal-elb";
/// The value of the cluster tag on resources this provider creates.
pub const OWNED: &str = "owned";

/// The cluster tag key for `cluster_id`.
pub fn cluster_tag(cluster_id: &str) -> String {
    format!("{CLUSTER_TAG_PREFIX}{cluster_id}")
}

/// Whether `tags` carry the cluster's tag (any value) or its legacy tag.
pub fn has_cluster_tag(tags: &BTreeMap<String, String>, cluster_id: &str) -> bool {
    tags.contains_key(&cluster_tag(cluster_id))
        || tags
            .get(LEGACY_CLUSTER_TAG)
            .is_some_and(|v| v == cluster_id)
}

/// Whether `tags` carry some cluster's tag (the AWS CCM's "no cluster prefix" test negated).
pub fn has_any_cluster_tag(tags: &BTreeMap<String, String>) -> bool {
    tags.keys().any(|k| k.starts_with(CLUSTER_TAG_PREFIX)) || tags.contains_key(LEGACY_CLUSTER_TAG)
}

/// The tags this provider puts on every load-balancer resource it creates for `service`
/// (`namespace/name`).
pub fn owned_tags(cluster_id: &str, service: &str) -> BTreeMap<String, String> {
    [
        (cluster_tag(cluster_id), OWNED.to_string()),
        (SERVICE_NAME_TAG.to_string(), service.to_string()),
    ]
    .into()
}

/// Whether a resource with `tags` was created by this cluster for `service`.
pub fn is_owned_by(tags: &BTreeMap<String, String>, cluster_id: &str, service: &str) -> bool {
    tags.get(&cluster_tag(cluster_id))
        .is_some_and(|v| v == OWNED)
        && tags.get(SERVICE_NAME_TAG).is_some_and(|v| v == service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_needs_both_tags() {
        let mut t = owned_tags("c1", "ns/svc");
        assert!(is_owned_by(&t, "c1", "ns/svc"));
        assert!(!is_owned_by(&t, "c2", "ns/svc"));
        assert!(!is_owned_by(&t, "c1", "ns/other"));
        assert!(has_cluster_tag(&t, "c1") && has_any_cluster_tag(&t));
        t.insert(cluster_tag("c1"), "shared".into());
        assert!(!is_owned_by(&t, "c1", "ns/svc"));
        let legacy: BTreeMap<String, String> =
            [(LEGACY_CLUSTER_TAG.to_string(), "c1".to_string())].into();
        assert!(has_cluster_tag(&legacy, "c1") && !has_cluster_tag(&legacy, "c2"));
    }
}
