//! The resources served, their metadata, name rules, defaulting and schema checks.

use serde_json::{json, Map, Value};

use super::error::ApiError;

/// How a list field merges under strategic merge patch (the `patchStrategy` /
/// `patchMergeKey` tags of k8s.io/api).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// No patch strategy: the patch list replaces the live list.
    Atomic,
    /// `patchStrategy:"merge"` on a list of scalars: set union, ordered as upstream does.
    MergePrimitive,
    /// `patchStrategy:"merge"` with `patchMergeKey`.
    MergeByKey(&'static str),
}

/// Name validation rule for `metadata.name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// DNS-1123 subdomain (most kinds).
    Subdomain,
    /// DNS-1123 label (namespaces).
    Label,
    /// DNS-1035 label (services).
    Dns1035,
}

/// Static description of one served resource.
#[derive(Debug)]
pub struct ResourceInfo {
    /// API group, `""` for core.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// Plural resource name used in URLs.
    pub plural: &'static str,
    /// Singular name for discovery.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Whether a `status` subresource exists.
    pub status: bool,
    /// PUT creates a missing object (upstream `AllowCreateOnUpdate`).
    pub create_on_update: bool,
    /// Short names for discovery.
    pub short_names: &'static [&'static str],
    /// Name rule.
    pub name_rule: NameRule,
    /// Strategic merge list strategies by dotted path (metadata ones are shared).
    pub lists: &'static [(&'static str, ListStrategy)],
    /// Field selectors accepted besides metadata.name/metadata.namespace.
    pub field_labels: &'static [&'static str],
}

impl ResourceInfo {
    /// `apiVersion` string (`v1` or `group/version`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Resource name qualified with its group (`events.events.k8s.io`), as kubectl spells it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// Strategic-merge strategy of the list at `path` (dotted, no indices).
    pub fn list_strategy(&self, path: &str) -> ListStrategy {
        match path {
            "metadata.finalizers" => return ListStrategy::MergePrimitive,
            "metadata.ownerReferences" => return ListStrategy::MergeByKey("uid"),
            _ => {}
        }
        self.lists
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, s)| *s)
            .unwrap_or(ListStrategy::Atomic)
    }
}

use ListStrategy::*;

/// Every resource this server serves.
pub static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        status: true,
        create_on_update: false,
        short_names: &["ns"],
        name_rule: NameRule::Label,
        lists: &[("status.conditions", MergeByKey("type"))],
        field_labels: &["status.phase"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        status: true,
        create_on_update: false,
        short_names: &["no"],
        name_rule: NameRule::Subdomain,
        // k8s.io/api core/v1 NodeSpec.Taints carries no patchStrategy: the list is replaced.
        lists: &[
            ("spec.podCIDRs", MergePrimitive),
            ("status.conditions", MergeByKey("type")),
            ("status.addresses", MergeByKey("type")),
        ],
        field_labels: &["spec.unschedulable"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        status: true,
        create_on_update: false,
        short_names: &["svc"],
        name_rule: NameRule::Dns1035,
        // status.loadBalancer.ingress has no patchStrategy: replaced.
        lists: &[
            ("spec.ports", MergeByKey("port")),
            ("status.conditions", MergeByKey("type")),
        ],
        field_labels: &["spec.clusterIP", "spec.type"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status: false,
        create_on_update: true,
        short_names: &["ev"],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        status: false,
        create_on_update: false,
        short_names: &["cm"],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &[],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        status: false,
        create_on_update: false,
        short_names: &[],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &["type"],
    },
    // Pods, Endpoints and EndpointSlices: nobody in the sandbox creates them, but kubectl reads
    // them (`describe node` lists the node's pods, `describe service` its endpoints, `get pods`),
    // so they are served, empty until someone writes one.
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        status: true,
        create_on_update: false,
        short_names: &["po"],
        name_rule: NameRule::Subdomain,
        lists: &[
            ("spec.containers", MergeByKey("name")),
            ("spec.initContainers", MergeByKey("name")),
            ("spec.ephemeralContainers", MergeByKey("name")),
            ("spec.volumes", MergeByKey("name")),
            ("spec.imagePullSecrets", MergeByKey("name")),
            ("status.conditions", MergeByKey("type")),
            ("status.podIPs", MergeByKey("ip")),
        ],
        // Upstream's pod field labels (pkg/registry/core/pod/strategy.go PodToSelectableFields).
        field_labels: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "endpoints",
        singular: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        status: false,
        create_on_update: true,
        short_names: &["ep"],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &[],
    },
    ResourceInfo {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        status: false,
        create_on_update: true,
        short_names: &[],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &[],
    },
    ResourceInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        status: false,
        create_on_update: true,
        short_names: &["ev"],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &["reason", "type", "reportingController"],
    },
    ResourceInfo {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        singular: "endpointslice",
        kind: "EndpointSlice",
        namespaced: true,
        status: false,
        create_on_update: false,
        short_names: &[],
        name_rule: NameRule::Subdomain,
        lists: &[],
        field_labels: &[],
    },
];

/// Index of the resource served at `group/version/plural`.
pub fn lookup(group: &str, version: &str, plural: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.group == group && r.version == version && r.plural == plural)
}

/// Index of a resource named the kubectl way: `nodes`, `leases`, `events.events.k8s.io`.
pub fn lookup_name(name: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.qualified() == name)
        .or_else(|| {
            let mut matching = RESOURCES
                .iter()
                .enumerate()
                .filter(|(_, r)| r.plural == name || r.kind.eq_ignore_ascii_case(name));
            let first = matching.next()?;
            // Prefer the core group when ambiguous (`events`).
            Some(first.0)
        })
}

/// Index of the resource for an `apiVersion` + `kind`.
pub fn lookup_kind(api_version: &str, kind: &str) -> Option<usize> {
    RESOURCES
        .iter()
        .position(|r| r.api_version() == api_version && r.kind == kind)
}

/// Validate `metadata.name` (or a namespace name); returns the error messages upstream gives.
pub fn validate_name(rule: NameRule, name: &str) -> Vec<String> {
    let mut errs = Vec::new();
    match rule {
        NameRule::Subdomain => {
            if name.len() > 253 {
                errs.push("must be no more than 253 characters".to_string());
            }
            let ok = !name.is_empty() && name.split('.').all(|part| is_label(part, false));
            if !ok {
                errs.push(
                    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')".to_string(),
                );
            }
        }
        NameRule::Label => {
            if name.len() > 63 {
                errs.push("must be no more than 63 characters".to_string());
            }
            if !is_label(name, false) {
                errs.push(
                    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')".to_string(),
                );
            }
        }
        NameRule::Dns1035 => {
            if name.len() > 63 {
                errs.push("must be no more than 63 characters".to_string());
            }
            if !is_label(name, true) {
                errs.push(
                    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')".to_string(),
                );
            }
        }
    }
    errs
}

fn is_label(s: &str, alpha_start: bool) -> bool {
    let b = s.as_bytes();
    if b.is_empty() {
        return false;
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let first_ok = if alpha_start {
        b[0].is_ascii_lowercase()
    } else {
        alnum(b[0])
    };
    first_ok && alnum(b[b.len() - 1]) && b.iter().all(|&c| alnum(c) || c == b'-')
}

/// Label keys/values validation (`metadata.labels`): qualified names and values of <= 63 chars.
pub fn validate_labels(obj: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let (prefix, name) = match k.rsplit_once('/') {
                Some((p, n)) => (Some(p), n),
                None => (None, k.as_str()),
            };
            let name_ok = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
                && name.as_bytes()[0].is_ascii_alphanumeric()
                && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
            let prefix_ok = prefix
                .map(|p| validate_name(NameRule::Subdomain, p).is_empty())
                .unwrap_or(true);
            if !name_ok || !prefix_ok {
                errs.push((
                    "metadata.labels".to_string(),
                    format!("Invalid value: \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                ));
            }
            let v = v.as_str().unwrap_or_default();
            let value_ok = v.is_empty()
                || (v.len() <= 63
                    && v.bytes()
                        .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c))
                    && v.as_bytes()[0].is_ascii_alphanumeric()
                    && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric());
            if !value_ok {
                errs.push((
                    "metadata.labels".to_string(),
                    format!("Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
                ));
            }
        }
    }
    errs
}

/// Decode the object into its k8s-openapi type and encode it back. This rejects wrongly typed
/// fields (400, as upstream's decoder does) and drops unknown fields (upstream's default
/// `fieldValidation=Warn` drops them too). Timestamps come back in upstream's formats.
pub fn normalize(rid: usize, obj: Value) -> Result<Value, ApiError> {
    use k8s_openapi::api::{
        coordination::v1 as coord, core::v1 as core, discovery::v1 as disc, events::v1 as ev,
    };
    fn rt<T: serde::de::DeserializeOwned + serde::Serialize>(
        kind: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let typed: T = serde_json::from_value(obj)
            .map_err(|e| ApiError::bad_request(format!("unable to decode {kind}: {e}")))?;
        serde_json::to_value(typed).map_err(|e| ApiError::internal(e.to_string()))
    }
    let r = &RESOURCES[rid];
    match (r.group, r.plural) {
        ("", "namespaces") => rt::<core::Namespace>(r.kind, obj),
        ("", "nodes") => rt::<core::Node>(r.kind, obj),
        ("", "services") => rt::<core::Service>(r.kind, obj),
        ("", "events") => rt::<core::Event>(r.kind, obj),
        ("", "configmaps") => rt::<core::ConfigMap>(r.kind, obj),
        ("", "secrets") => rt::<core::Secret>(r.kind, obj),
        ("", "pods") => rt::<core::Pod>(r.kind, obj),
        ("", "endpoints") => rt::<core::Endpoints>(r.kind, obj),
        ("discovery.k8s.io", "endpointslices") => rt::<disc::EndpointSlice>(r.kind, obj),
        ("coordination.k8s.io", "leases") => rt::<coord::Lease>(r.kind, obj),
        ("events.k8s.io", "events") => rt::<ev::Event>(r.kind, obj),
        _ => Ok(obj),
    }
    .map(strip_empty)
}

/// Remove empty maps that upstream's `omitempty` would not write (labels: {}, annotations: {}).
fn strip_empty(mut v: Value) -> Value {
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["labels", "annotations"] {
            if meta
                .get(k)
                .and_then(Value::as_object)
                .is_some_and(Map::is_empty)
            {
                meta.remove(k);
            }
        }
        for k in ["finalizers", "ownerReferences"] {
            if meta
                .get(k)
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty)
            {
                meta.remove(k);
            }
        }
    }
    v
}

/// Allocation state for defaulting (service cluster IPs and node ports).
#[derive(Debug, Default)]
pub struct Allocator {
    next_ip: u32,
    next_port: u32,
}

impl Allocator {
    fn cluster_ip(&mut self) -> String {
        // 10.96.0.0/12; .0 and .1 are reserved (kubernetes service takes .1).
        self.next_ip += 1;
        let n = 1 + self.next_ip;
        format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff)
    }
    fn node_port(&mut self) -> u32 {
        let p = 30000 + (self.next_port % 2768);
        self.next_port += 1;
        p
    }
}

/// Defaulting done on create by upstream's defaulters and registry strategies.
pub fn default_on_create(rid: usize, obj: &mut Value, alloc: &mut Allocator) {
    let r = &RESOURCES[rid];
    match (r.group, r.plural) {
        ("", "namespaces") => {
            let name = obj
                .pointer("/metadata/name")
                .cloned()
                .unwrap_or(Value::Null);
            if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert("kubernetes.io/metadata.name".into(), name);
                }
            }
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        ("", "secrets") if obj.get("type").is_none() => {
            obj["type"] = json!("Opaque");
        }
        // The pod registry resets the status of a new pod to Pending (here nobody moves it on:
        // write `/status` to change it).
        ("", "pods") => {
            obj["status"] = json!({"phase": "Pending"});
        }
        ("", "services") => {
            // The service registry clears status on create.
            obj.as_object_mut().map(|o| o.remove("status"));
            obj["status"] = json!({"loadBalancer": {}});
            let spec = obj
                .as_object_mut()
                .map(|o| o.entry("spec").or_insert_with(|| json!({})));
            let Some(Value::Object(spec)) = spec else {
                return;
            };
            let ty = spec
                .entry("type")
                .or_insert_with(|| json!("ClusterIP"))
                .as_str()
                .unwrap_or("ClusterIP")
                .to_string();
            spec.entry("sessionAffinity").or_insert(json!("None"));
            if ty != "ExternalName" {
                let has_ip = spec
                    .get("clusterIP")
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty());
                if !has_ip {
                    let ip = alloc.cluster_ip();
                    spec.insert("clusterIP".into(), json!(ip));
                }
                let ip = spec.get("clusterIP").cloned().unwrap_or(Value::Null);
                if ip.as_str() != Some("None") {
                    spec.entry("clusterIPs").or_insert_with(|| json!([ip]));
                }
                spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
                spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
                spec.entry("internalTrafficPolicy")
                    .or_insert(json!("Cluster"));
            }
            let node_ports = ty == "NodePort" || ty == "LoadBalancer";
            if node_ports {
                spec.entry("externalTrafficPolicy")
                    .or_insert(json!("Cluster"));
            }
            if ty == "LoadBalancer" {
                spec.entry("allocateLoadBalancerNodePorts")
                    .or_insert(json!(true));
            }
            let alloc_ports = node_ports
                && spec
                    .get("allocateLoadBalancerNodePorts")
                    .and_then(Value::as_bool)
                    .unwrap_or(true);
            if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    p.entry("protocol").or_insert(json!("TCP"));
                    if let Some(port) = p.get("port").cloned() {
                        p.entry("targetPort").or_insert(port);
                    }
                    if alloc_ports && p.get("nodePort").is_none() {
                        p.insert("nodePort".into(), json!(alloc.node_port()));
                    }
                }
            }
        }
        _ => {}
    }
}
