//! Server-side printing: `meta.k8s.io` Table responses for `kubectl get` (which asks with
//! `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`). Nodes, services, events,
//! namespaces, leases and pods get upstream's columns (`pkg/printers/internalversion`, generated
//! with `Wide: true` as the API server does, so `kubectl get -o wide` shows the priority-1
//! columns); other resources get upstream's default `Name` / `Created At` columns.

use axum::http::{header, HeaderMap};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::error::ApiError;
use super::resources::ResourceInfo;

/// The Table version the client accepts (`v1` or `v1beta1`), if it prefers a Table to plain
/// JSON: the first media range of `Accept` that can be served decides.
pub fn wanted_version(headers: &HeaderMap) -> Option<&'static str> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok())?;
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        if !matches!(media, "application/json" | "*/*" | "application/*" | "") {
            continue;
        }
        let (mut as_, mut g, mut v) = (None, None, None);
        for p in parts {
            if let Some((k, val)) = p.split_once('=') {
                match k.trim() {
                    "as" => as_ = Some(val.trim()),
                    "g" => g = Some(val.trim()),
                    "v" => v = Some(val.trim()),
                    _ => {}
                }
            }
        }
        match (as_, g, v) {
            (None, _, _) => return None,
            (Some("Table"), Some("meta.k8s.io"), Some("v1")) => return Some("v1"),
            (Some("Table"), Some("meta.k8s.io"), Some("v1beta1")) => return Some("v1beta1"),
            // Another representation (e.g. PartialObjectMetadata): not a Table.
            _ => continue,
        }
    }
    None
}

/// The `Content-Type` of a Table response.
pub fn content_type(version: &str) -> String {
    format!("application/json;as=Table;v={version};g=meta.k8s.io")
}

fn column(name: &str, type_: &str, format: &str, priority: i32, description: &str) -> Value {
    json!({
        "name": name,
        "type": type_,
        "format": format,
        "description": description,
        "priority": priority,
    })
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Upstream `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 60 * 2 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Upstream `translateTimestampSince`: `<unknown>` for an absent time.
fn since(ts: &str, now: Timestamp) -> String {
    match ts.parse::<Timestamp>() {
        Ok(t) if !ts.is_empty() => human_duration(now.as_second() - t.as_second()),
        _ => "<unknown>".into(),
    }
}

fn none_if_empty(s: String) -> String {
    if s.is_empty() {
        "<none>".into()
    } else {
        s
    }
}

fn columns(r: &ResourceInfo) -> Vec<Value> {
    let name = column(
        "Name",
        "string",
        "name",
        0,
        "Name must be unique within a namespace.",
    );
    let age = column(
        "Age",
        "string",
        "",
        0,
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
    );
    match (r.group, r.plural) {
        ("", "nodes") => vec![
            name,
            column("Status", "string", "", 0, "The status of the node"),
            column("Roles", "string", "", 0, "The roles of the node"),
            age,
            column("Version", "string", "", 0, "Kubelet Version reported by the node."),
            column("Internal-IP", "string", "", 1, "List of addresses reachable to the node."),
            column("External-IP", "string", "", 1, "List of addresses reachable to the node."),
            column("OS-Image", "string", "", 1, "OS Image reported by the node."),
            column("Kernel-Version", "string", "", 1, "Kernel Version reported by the node."),
            column("Container-Runtime", "string", "", 1, "ContainerRuntime Version reported by the node."),
        ],
        ("", "services") => vec![
            name,
            column("Type", "string", "", 0, "type determines how the Service is exposed."),
            column("Cluster-IP", "string", "", 0, "clusterIP is the IP address of the service."),
            column("External-IP", "string", "", 0, "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service."),
            column("Port(s)", "string", "", 0, "The list of ports that are exposed by this service."),
            age,
            column("Selector", "string", "", 1, "Route service traffic to pods with label keys and values matching this selector."),
        ],
        ("", "events") => vec![
            column("Last Seen", "string", "", 0, "The time at which the most recent occurrence of this event was recorded."),
            column("Type", "string", "", 0, "Type of this event (Normal, Warning), new types could be added in the future."),
            column("Reason", "string", "", 0, "This should be a short, machine understandable string that gives the reason for the transition into the object's current status."),
            column("Object", "string", "", 0, "The object that this event is about."),
            column("Subobject", "string", "", 1, "The field of the object that this event is about."),
            column("Source", "string", "", 1, "The component reporting this event."),
            column("Message", "string", "", 0, "A human-readable description of the status of this operation."),
            column("First Seen", "string", "", 1, "The time at which the event was first recorded."),
            column("Count", "string", "", 1, "The number of times this event has occurred."),
            column("Name", "string", "name", 1, "Name must be unique within a namespace."),
        ],
        ("", "namespaces") => vec![
            name,
            column("Status", "string", "", 0, "The status of the namespace"),
            age,
        ],
        ("coordination.k8s.io", "leases") => vec![
            name,
            column("Holder", "string", "", 0, "The holder of the lease."),
            age,
        ],
        ("", "pods") => vec![
            name,
            column("Ready", "string", "", 0, "The aggregate readiness state of this pod for accepting traffic."),
            column("Status", "string", "", 0, "The aggregate status of the containers in this pod."),
            column("Restarts", "string", "", 0, "The number of times the containers in this pod have been restarted and when the last container in this pod has restarted."),
            age,
            column("IP", "string", "", 1, "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated."),
            column("Node", "string", "", 1, "NodeName is a request to schedule this pod onto a specific node."),
            column("Nominated Node", "string", "", 1, "nominatedNodeName is set only when this pod preempts other pods on the node, but it cannot be scheduled right away as preemption victims receive their graceful termination periods."),
            column("Readiness Gates", "string", "", 1, "If specified, all readiness gates will be evaluated for pod readiness."),
        ],
        _ => vec![
            name,
            column("Created At", "date", "", 0, "CreationTimestamp is a timestamp representing the server time when this object was created."),
        ],
    }
}

fn node_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let conditions = o
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ready = conditions.iter().find(|c| s(c, "/type") == "Ready");
    let mut status = vec![match ready.map(|c| s(c, "/status")) {
        Some("True") => "Ready",
        Some("False") => "NotReady",
        _ => "Unknown",
    }
    .to_string()];
    if o.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
        status.push("SchedulingDisabled".into());
    }
    let mut roles: Vec<String> = o
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|(k, v)| {
                    if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                        (!role.is_empty()).then(|| role.to_string())
                    } else if k == "kubernetes.io/role" {
                        v.as_str().filter(|r| !r.is_empty()).map(str::to_string)
                    } else {
                        None
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    roles.sort();
    roles.dedup();
    let address = |t: &str| -> String {
        o.pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|a| s(a, "/type") == t))
            .map(|a| s(a, "/address").to_string())
            .unwrap_or_else(|| "<none>".into())
    };
    let info = |field: &str| -> String {
        let v = s(o, &format!("/status/nodeInfo/{field}"));
        if v.is_empty() {
            "<unknown>".into()
        } else {
            v.to_string()
        }
    };
    vec![
        json!(s(o, "/metadata/name")),
        json!(status.join(",")),
        json!(none_if_empty(roles.join(","))),
        json!(since(s(o, "/metadata/creationTimestamp"), now)),
        json!(s(o, "/status/nodeInfo/kubeletVersion")),
        json!(address("InternalIP")),
        json!(address("ExternalIP")),
        json!(info("osImage")),
        json!(info("kernelVersion")),
        json!(info("containerRuntimeVersion")),
    ]
}

fn service_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let type_ = s(o, "/spec/type");
    let type_ = if type_.is_empty() { "ClusterIP" } else { type_ };
    let cluster_ip = o
        .pointer("/spec/clusterIPs/0")
        .and_then(Value::as_str)
        .or_else(|| o.pointer("/spec/clusterIP").and_then(Value::as_str))
        .filter(|ip| !ip.is_empty())
        .unwrap_or("<none>");
    let external_ips: Vec<String> = o
        .pointer("/spec/externalIPs")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let lb_ips: Vec<String> = o
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|i| {
                    [s(i, "/ip"), s(i, "/hostname")]
                        .into_iter()
                        .find(|x| !x.is_empty())
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    let external = match type_ {
        "LoadBalancer" => {
            let mut all = lb_ips;
            all.extend(external_ips);
            if all.is_empty() {
                "<pending>".to_string()
            } else {
                all.join(",")
            }
        }
        "ExternalName" => s(o, "/spec/externalName").to_string(),
        _ => none_if_empty(external_ips.join(",")),
    };
    let ports: Vec<String> = o
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|p| {
                    let port = p.get("port").and_then(Value::as_i64).unwrap_or(0);
                    let proto = s(p, "/protocol");
                    match p
                        .get("nodePort")
                        .and_then(Value::as_i64)
                        .filter(|n| *n != 0)
                    {
                        Some(np) => format!("{port}:{np}/{proto}"),
                        None => format!("{port}/{proto}"),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let mut selector: Vec<String> = o
        .pointer("/spec/selector")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    selector.sort();
    vec![
        json!(s(o, "/metadata/name")),
        json!(type_),
        json!(cluster_ip),
        json!(external),
        json!(ports.join(",")),
        json!(since(s(o, "/metadata/creationTimestamp"), now)),
        json!(none_if_empty(selector.join(","))),
    ]
}

fn event_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let mut first = since(s(o, "/firstTimestamp"), now);
    if s(o, "/firstTimestamp").is_empty() {
        first = since(s(o, "/eventTime"), now);
    }
    let mut last = since(s(o, "/lastTimestamp"), now);
    if s(o, "/lastTimestamp").is_empty() {
        last = first.clone();
    }
    let mut count = o.get("count").and_then(Value::as_i64).unwrap_or(0);
    if o.get("series").is_some_and(|v| !v.is_null()) {
        last = since(s(o, "/series/lastObservedTime"), now);
        count = o
            .pointer("/series/count")
            .and_then(Value::as_i64)
            .unwrap_or(count);
    } else if count == 0 {
        count = 1;
    }
    let kind = s(o, "/involvedObject/kind").to_lowercase();
    let name = s(o, "/involvedObject/name");
    let target = if name.is_empty() {
        kind
    } else {
        format!("{kind}/{name}")
    };
    let component = [s(o, "/source/component"), s(o, "/reportingComponent")]
        .into_iter()
        .find(|x| !x.is_empty())
        .unwrap_or("");
    let instance = [s(o, "/source/host"), s(o, "/reportingInstance")]
        .into_iter()
        .find(|x| !x.is_empty())
        .unwrap_or("");
    let source = match (component.is_empty(), instance.is_empty()) {
        (true, _) => String::new(),
        (false, true) => component.to_string(),
        (false, false) => format!("{component}, {instance}"),
    };
    let last_seen = if count > 1 {
        format!("{last} (x{count} over {first})")
    } else {
        last
    };
    vec![
        json!(last_seen),
        json!(s(o, "/type")),
        json!(s(o, "/reason")),
        json!(target),
        json!(s(o, "/involvedObject/fieldPath")),
        json!(source),
        json!(s(o, "/message").trim()),
        json!(first),
        json!(count),
        json!(s(o, "/metadata/name")),
    ]
}

/// Upstream's pod row, simplified: the status is `Terminating`, else `status.reason`, else the
/// phase (upstream also looks at each container's state).
fn pod_cells(o: &Value, now: Timestamp) -> Vec<Value> {
    let array = |pointer: &str| {
        o.pointer(pointer)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let statuses = array("/status/containerStatuses");
    let ready = statuses
        .iter()
        .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|c| c.get("restartCount").and_then(Value::as_i64))
        .sum();
    let status = if !s(o, "/metadata/deletionTimestamp").is_empty() {
        "Terminating"
    } else if !s(o, "/status/reason").is_empty() {
        s(o, "/status/reason")
    } else {
        s(o, "/status/phase")
    };
    let gates = array("/spec/readinessGates");
    let conditions = array("/status/conditions");
    let gates = if gates.is_empty() {
        "<none>".to_string()
    } else {
        let met = gates
            .iter()
            .filter(|g| {
                conditions
                    .iter()
                    .any(|c| s(c, "/type") == s(g, "/conditionType") && s(c, "/status") == "True")
            })
            .count();
        format!("{met}/{}", gates.len())
    };
    vec![
        json!(s(o, "/metadata/name")),
        json!(format!("{ready}/{}", array("/spec/containers").len())),
        json!(status),
        json!(restarts),
        json!(since(s(o, "/metadata/creationTimestamp"), now)),
        json!(none_if_empty(s(o, "/status/podIP").to_string())),
        json!(none_if_empty(s(o, "/spec/nodeName").to_string())),
        json!(none_if_empty(s(o, "/status/nominatedNodeName").to_string())),
        json!(gates),
    ]
}

fn cells(r: &ResourceInfo, o: &Value, now: Timestamp) -> Vec<Value> {
    let name = json!(s(o, "/metadata/name"));
    let age = || json!(since(s(o, "/metadata/creationTimestamp"), now));
    match (r.group, r.plural) {
        ("", "nodes") => node_cells(o, now),
        ("", "services") => service_cells(o, now),
        ("", "events") => event_cells(o, now),
        ("", "pods") => pod_cells(o, now),
        ("", "namespaces") => vec![name, json!(s(o, "/status/phase")), age()],
        ("coordination.k8s.io", "leases") => {
            vec![name, json!(s(o, "/spec/holderIdentity")), age()]
        }
        _ => vec![name, json!(s(o, "/metadata/creationTimestamp"))],
    }
}

/// A Table of `objects` (the items of a list, or the one object of a get). `include_object`
/// is the `includeObject` query parameter: `None`, `Metadata` (default) or `Object`.
pub fn table(
    r: &ResourceInfo,
    objects: &[Value],
    list_metadata: Value,
    version: &str,
    include_object: Option<&str>,
    now: Timestamp,
) -> Result<Value, ApiError> {
    let include = include_object
        .filter(|v| !v.is_empty())
        .unwrap_or("Metadata");
    if !matches!(include, "None" | "Metadata" | "Object") {
        return Err(ApiError::bad_request(format!(
            "includeObject: Unsupported value: {include:?}: supported values: \"None\", \"Metadata\", \"Object\""
        )));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = json!({"cells": cells(r, o, now)});
            match include {
                "Object" => row["object"] = o.clone(),
                "Metadata" => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": format!("meta.k8s.io/{version}"),
                        "metadata": o.get("metadata").cloned().unwrap_or(Value::Null),
                    })
                }
                _ => {}
            }
            row
        })
        .collect();
    Ok(json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": list_metadata,
        "columnDefinitions": columns(r),
        "rows": rows,
    }))
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::super::resources::{lookup_name, RESOURCES};
    use super::*;

    fn headers(accept: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        h
    }

    fn now() -> Timestamp {
        "2025-06-01T12:00:00Z".parse().unwrap()
    }

    #[test]
    fn negotiation_follows_the_order_of_accept() {
        let kubectl = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(wanted_version(&headers(kubectl)), Some("v1"));
        assert_eq!(
            wanted_version(&headers(
                "application/json;as=Table;v=v1beta1;g=meta.k8s.io"
            )),
            Some("v1beta1")
        );
        assert_eq!(wanted_version(&headers("application/json")), None);
        assert_eq!(
            wanted_version(&headers(
                "application/json, application/json;as=Table;v=v1;g=meta.k8s.io"
            )),
            None,
            "plain JSON first wins"
        );
        assert_eq!(
            wanted_version(&headers(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            None
        );
        assert_eq!(wanted_version(&HeaderMap::new()), None);
    }

    #[test]
    fn human_durations_match_upstream() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 300, "3h5m"),
            (47 * 3600, "47h"),
            (50 * 3600, "2d2h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn node_rows_have_the_upstream_columns() {
        let r = &RESOURCES[lookup_name("nodes").unwrap()];
        let node = json!({
            "metadata": {"name": "n1", "creationTimestamp": "2025-06-01T11:55:00Z",
                "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "edge"}},
            "spec": {"unschedulable": true},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "10.0.0.1"}],
                "nodeInfo": {"kubeletVersion": "v1.35.0", "osImage": "Ubuntu", "kernelVersion": "", "containerRuntimeVersion": "containerd://2"}
            }
        });
        let t = table(
            r,
            &[node],
            json!({"resourceVersion": "9"}),
            "v1",
            None,
            now(),
        )
        .unwrap();
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        let names: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Name",
                "Status",
                "Roles",
                "Age",
                "Version",
                "Internal-IP",
                "External-IP",
                "OS-Image",
                "Kernel-Version",
                "Container-Runtime"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "n1",
                "Ready,SchedulingDisabled",
                "control-plane,edge",
                "5m",
                "v1.35.0",
                "10.0.0.1",
                "<none>",
                "Ubuntu",
                "<unknown>",
                "containerd://2"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["name"], "n1");
        assert_eq!(t["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn service_and_event_rows() {
        let svcs = &RESOURCES[lookup_name("services").unwrap()];
        let pending = json!({
            "metadata": {"name": "web", "creationTimestamp": "2025-06-01T11:59:30Z"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "selector": {"b": "2", "a": "1"},
                "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}, {"port": 53, "protocol": "UDP"}]},
        });
        let mut ready = pending.clone();
        ready["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.18.0.7"}, {"hostname": "lb.example"}]}});
        let t = table(
            svcs,
            &[pending, ready],
            json!({}),
            "v1",
            Some("None"),
            now(),
        )
        .unwrap();
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "web",
                "LoadBalancer",
                "10.96.0.10",
                "<pending>",
                "80:30080/TCP,53/UDP",
                "30s",
                "a=1,b=2"
            ])
        );
        assert_eq!(t["rows"][1]["cells"][3], "198.18.0.7,lb.example");
        assert!(t["rows"][0].get("object").is_none());

        let events = &RESOURCES[lookup_name("events").unwrap()];
        let ev = json!({
            "metadata": {"name": "web.1"},
            "involvedObject": {"kind": "Service", "name": "web"},
            "type": "Normal", "reason": "EnsuredLoadBalancer", "message": "Ensured load balancer ",
            "source": {"component": "service-controller"},
            "firstTimestamp": "2025-06-01T11:50:00Z", "lastTimestamp": "2025-06-01T11:58:00Z", "count": 3
        });
        let t = table(events, &[ev], json!({}), "v1", Some("Object"), now()).unwrap();
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "2m (x3 over 10m)",
                "Normal",
                "EnsuredLoadBalancer",
                "service/web",
                "",
                "service-controller",
                "Ensured load balancer",
                "10m",
                3,
                "web.1"
            ])
        );
        assert_eq!(t["rows"][0]["object"]["reason"], "EnsuredLoadBalancer");
        let e = table(events, &[], json!({}), "v1", Some("Everything"), now()).unwrap_err();
        assert_eq!(e.code, 400);
    }
}
