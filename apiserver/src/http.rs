//! HTTP layer: routing, content negotiation, discovery, handlers and watch streaming.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::controls::{RequestRecord, Shared};
use super::error::ApiError;
use super::resources::{self, ResourceInfo, RESOURCES};
use super::reviews;
use super::select::{FieldSelector, LabelSelector};
use super::store::{DeleteOpts, Event, EventType, ListQuery, PatchType, WatchStart, WriteOpts};
use super::table;

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// Interval between BOOKMARK events on watches that allow them.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);
/// Server-side cap on watch duration when the client sends no timeoutSeconds (upstream picks a
/// random value in [30m, 60m)).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// What the URL names.
#[derive(Debug, Default, Clone)]
struct Target {
    rid: usize,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

struct Query(Vec<(String, String)>);

impl Query {
    fn get(&self, k: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("1" | "true" | "True"))
    }
}

fn json_response(code: u16, v: &Value) -> Response {
    bytes_response(code, serde_json::to_vec(v).unwrap_or_default())
}

fn bytes_response(code: u16, body: Vec<u8>) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .unwrap_or_default()
}

fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after {
        if let Ok(v) = header::HeaderValue::from_str(&s.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
    }
    resp
}

/// Whether the client accepts JSON.
fn accepts_json(headers: &HeaderMap) -> bool {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if accept.trim().is_empty() {
        return true;
    }
    accept.split(',').any(|part| {
        let mt = part.split(';').next().unwrap_or("").trim();
        matches!(mt, "application/json" | "*/*" | "application/*" | "")
    })
}

/// The single axum handler: every request comes here.
pub(crate) async fn handle(State(shared): State<Arc<Shared>>, req: Request<Body>) -> Response {
    let received_at = std::time::SystemTime::now();
    let latency = shared.ctl().latency;
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let query = Query(
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map(|q| q.0)
            .unwrap_or_default(),
    );
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut rec = RequestRecord {
        verb: String::new(),
        method: parts.method.to_string(),
        path: path.clone(),
        query: raw_query,
        resource: String::new(),
        subresource: String::new(),
        namespace: String::new(),
        name: String::new(),
        content_type: content_type.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
        user_agent: parts
            .headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string(),
        received_at,
        code: 0,
    };
    let (resp, code) = route(
        &shared,
        &parts.method,
        &parts.headers,
        &path,
        &query,
        &content_type,
        body,
        &mut rec,
    )
    .await;
    rec.code = code;
    shared.ctl().requests.push(rec);
    resp
}

fn finish(r: Result<Response, ApiError>) -> (Response, u16) {
    match r {
        Ok(resp) => {
            let code = resp.status().as_u16();
            (resp, code)
        }
        Err(e) => (error_response(&e), e.code),
    }
}

#[allow(clippy::too_many_arguments)]
async fn route(
    shared: &Arc<Shared>,
    method: &Method,
    headers: &HeaderMap,
    path: &str,
    query: &Query,
    content_type: &str,
    body: Bytes,
    rec: &mut RequestRecord,
) -> (Response, u16) {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    // Non-resource URLs.
    match segs.as_slice() {
        ["healthz"] | ["readyz"] | ["livez"] => {
            rec.verb = "other".into();
            let resp = Response::builder()
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(Body::from("ok"))
                .unwrap_or_default();
            return (resp, 200);
        }
        ["version"] => {
            rec.verb = "discovery".into();
            return finish(Ok(json_response(200, &version())));
        }
        _ => {}
    }
    if !accepts_json(headers) {
        rec.verb = "other".into();
        let e = ApiError::new(
            406,
            "NotAcceptable",
            "the server was unable to respond with a content type that the client supports (only application/json is served)",
        );
        return (error_response(&e), 406);
    }
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api"] => {
            rec.verb = "discovery".into();
            return finish(Ok(json_response(
                200,
                &json!({
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]
                }),
            )));
        }
        ["apis"] => {
            rec.verb = "discovery".into();
            return finish(Ok(json_response(200, &group_list())));
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g] => {
            rec.verb = "discovery".into();
            return finish(api_group(g).map(|v| json_response(200, &v)));
        }
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => {
            rec.verb = "other".into();
            return finish(Err(ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )));
        }
    };
    if rest.is_empty() {
        rec.verb = "discovery".into();
        return finish(resource_list(group, version).map(|v| json_response(200, &v)));
    }
    if let Some(kind) = reviews::review_kind(group, version, rest) {
        rec.resource = kind.qualified().into();
        if method != Method::POST {
            rec.verb = method.as_str().to_lowercase();
            let e = ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            );
            return (error_response(&e), 405);
        }
        rec.verb = "create".into();
        if let Some(e) = shared.take_fault("create", kind.qualified()) {
            return (error_response(&e), e.code);
        }
        let answered = parse_body(content_type, &body).and_then(|review| {
            let policy = shared.ctl().policy.clone();
            kind.answer(&policy, review)
        });
        return finish(answered.map(|v| json_response(201, &v)));
    }
    let target = match parse_target(group, version, rest) {
        Ok(t) => t,
        Err(e) => {
            rec.verb = "other".into();
            return finish(Err(e));
        }
    };
    let r = &RESOURCES[target.rid];
    rec.resource = r.qualified();
    rec.namespace = target.namespace.clone().unwrap_or_default();
    rec.name = target.name.clone().unwrap_or_default();
    rec.subresource = if target.status {
        "status".into()
    } else {
        String::new()
    };
    let verb = match (method.as_str(), target.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if query.flag("watch") => "watch",
        ("GET", false) => "list",
        ("POST", false) => "create",
        ("PUT", true) => "update",
        ("PATCH", true) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => {
            rec.verb = method.as_str().to_lowercase();
            let e = ApiError::new(
                405,
                "MethodNotAllowed",
                "the server does not allow this method on the requested resource",
            );
            return (error_response(&e), 405);
        }
    };
    rec.verb = verb.into();
    if let Some(e) = shared.take_fault(verb, &r.qualified()) {
        return (error_response(&e), e.code);
    }
    if matches!(verb, "update" | "patch" | "delete") && shared.take_conflict(&r.qualified()) {
        let e = ApiError::stale(
            r.group,
            r.plural,
            target.name.as_deref().unwrap_or_default(),
        );
        return (error_response(&e), 409);
    }
    if matches!(verb, "get" | "list") && !target.status {
        if let Some(version) = table::wanted_version(headers) {
            return finish(table_response(shared, &target, query, version));
        }
    }
    if verb == "watch" {
        return match start_watch(shared, &target, query) {
            Ok((resp, gone)) => (resp, if gone { 410 } else { 200 }),
            Err(e) => (error_response(&e), e.code),
        };
    }
    let manager = query
        .get("fieldManager")
        .map(str::to_string)
        .unwrap_or_else(|| {
            headers
                .get(header::USER_AGENT)
                .and_then(|v| v.to_str().ok())
                .and_then(|ua| ua.split('/').next())
                .unwrap_or("unknown")
                .to_string()
        });
    let dry_run = match query.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return finish(Err(ApiError::bad_request(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            ))))
        }
    };
    let wopts = WriteOpts {
        status: target.status,
        manager,
        dry_run,
    };
    finish(dispatch(
        shared,
        verb,
        &target,
        query,
        content_type,
        &body,
        &wopts,
    ))
}

fn parse_target(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let (ns, plural, name, sub) = match rest {
        ["namespaces", ns, "status"] => (None, "namespaces", Some(*ns), Some("status")),
        ["namespaces", ns, plural, tail @ ..] if tail.len() <= 2 => (
            Some(*ns),
            *plural,
            tail.first().copied(),
            tail.get(1).copied(),
        ),
        [plural, tail @ ..] if tail.len() <= 2 => {
            (None, *plural, tail.first().copied(), tail.get(1).copied())
        }
        _ => return Err(not_found()),
    };
    let rid = resources::lookup(group, version, plural).ok_or_else(not_found)?;
    let r = &RESOURCES[rid];
    if ns.is_some() && !r.namespaced {
        return Err(not_found());
    }
    if r.namespaced && ns.is_none() && name.is_some() {
        return Err(not_found());
    }
    let status = match sub {
        None => false,
        Some("status") if r.status => true,
        Some(_) => return Err(not_found()),
    };
    Ok(Target {
        rid,
        namespace: ns.map(str::to_string),
        name: name.map(str::to_string),
        status,
    })
}

fn parse_body(content_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    let mt = content_type.split(';').next().unwrap_or("").trim();
    match mt {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding request body as JSON: {e}"))),
        "application/yaml" => {
            let text = std::str::from_utf8(body)
                .map_err(|e| ApiError::bad_request(format!("request body is not UTF-8: {e}")))?;
            yaml_serde::from_str(text).map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))
        }
        crate::protobuf::MEDIA_TYPE => crate::protobuf::decode(body).map_err(|e| match e {
            Some(broken) => ApiError::bad_request(format!("error decoding the protobuf request body: {broken}")),
            None => ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "this in-memory API server decodes protobuf bodies of {} only - send JSON (kubectl create -f FILE does), accepted media types include: application/json, application/yaml",
                    crate::protobuf::KINDS
                ),
            ),
        }),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format ({other}) - accepted media types include: application/json, application/yaml, {} (for {})", crate::protobuf::MEDIA_TYPE, crate::protobuf::KINDS),
        )),
    }
}

fn list_query(r: &ResourceInfo, t: &Target, q: &Query) -> Result<ListQuery, ApiError> {
    Ok(ListQuery {
        namespace: t.namespace.clone(),
        labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?,
        fields: FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), r)?,
        limit: match q.get("limit") {
            None | Some("") => None,
            Some(l) => Some(
                l.parse::<usize>()
                    .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
            ),
        },
        cont: q.get("continue").map(str::to_string),
        resource_version: q.get("resourceVersion").map(str::to_string),
        rv_match: q.get("resourceVersionMatch").map(str::to_string),
    })
}

fn dispatch(
    shared: &Arc<Shared>,
    verb: &str,
    t: &Target,
    q: &Query,
    content_type: &str,
    body: &[u8],
    wopts: &WriteOpts,
) -> Result<Response, ApiError> {
    let store = &shared.store;
    let r = &RESOURCES[t.rid];
    let ns = t.namespace.clone().unwrap_or_default();
    let name = t.name.clone().unwrap_or_default();
    match verb {
        "get" => store.get(t.rid, &ns, &name).map(|o| json_response(200, &o)),
        "list" => {
            let lq = list_query(r, t, q)?;
            store.list_json(t.rid, &lq).map(|b| bytes_response(200, b))
        }
        "create" => {
            if t.status {
                return Err(ApiError::new(
                    405,
                    "MethodNotAllowed",
                    "create is not allowed on the status subresource",
                ));
            }
            if r.namespaced && t.namespace.is_none() {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    "the server could not find the requested resource",
                ));
            }
            let obj = parse_body(content_type, body)?;
            store
                .create(t.rid, &ns, obj, wopts)
                .map(|o| json_response(201, &o))
        }
        "update" => {
            let obj = parse_body(content_type, body)?;
            store
                .update(t.rid, &ns, &name, obj, wopts)
                .map(|(o, created)| json_response(if created { 201 } else { 200 }, &o))
        }
        "patch" => {
            let mt = content_type.split(';').next().unwrap_or("").trim();
            let ptype = match mt {
                "application/json-patch+json" => PatchType::Json,
                "application/merge-patch+json" => PatchType::Merge,
                "application/strategic-merge-patch+json" => PatchType::Strategic,
                "application/apply-patch+yaml" => PatchType::Apply,
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"),
                    ))
                }
            };
            if ptype == PatchType::Apply && t.status {
                // Apply to status is allowed upstream; we treat it like apply on the main resource
                // restricted to status by the update path.
            }
            let force = q.flag("force");
            if force && ptype != PatchType::Apply {
                return Err(ApiError::bad_request(
                    "force is only allowed for apply patches",
                ));
            }
            store
                .patch(t.rid, &ns, &name, ptype, body, wopts, force)
                .map(|(o, created)| json_response(if created { 201 } else { 200 }, &o))
        }
        "delete" | "deletecollection" => {
            let mut dopts = DeleteOpts {
                dry_run: wopts.dry_run,
                ..Default::default()
            };
            let mut policy = q.get("propagationPolicy").map(str::to_string);
            if !body.is_empty() {
                let v: Value = serde_json::from_slice(body).map_err(|e| {
                    ApiError::bad_request(format!("error decoding DeleteOptions: {e}"))
                })?;
                dopts.uid = v
                    .pointer("/preconditions/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                dopts.resource_version = v
                    .pointer("/preconditions/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
                    policy = Some(p.to_string());
                }
                if v.get("dryRun")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|x| x == "All"))
                {
                    dopts.dry_run = true;
                }
            }
            if let Some(p) = policy {
                if !matches!(p.as_str(), "Orphan" | "Background" | "Foreground") {
                    return Err(ApiError::invalid(
                        "",
                        "DeleteOptions",
                        "",
                        &[(
                            "propagationPolicy",
                            "FieldValueNotSupported",
                            format!("Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\""),
                        )],
                    ));
                }
            }
            if verb == "delete" {
                store
                    .delete(t.rid, &ns, &name, &dopts)
                    .map(|o| json_response(200, &o))
            } else {
                let lq = list_query(r, t, q)?;
                let items = store.delete_collection(t.rid, &lq, &dopts)?;
                Ok(json_response(
                    200,
                    &json!({
                        "kind": format!("{}List", r.kind),
                        "apiVersion": r.api_version(),
                        "metadata": {"resourceVersion": store.resource_version().to_string()},
                        "items": items,
                    }),
                ))
            }
        }
        _ => Err(ApiError::new(405, "MethodNotAllowed", "unsupported verb")),
    }
}

/// `kubectl get`: the object or list as a `meta.k8s.io` Table.
fn table_response(
    shared: &Arc<Shared>,
    t: &Target,
    q: &Query,
    version: &str,
) -> Result<Response, ApiError> {
    let r = &RESOURCES[t.rid];
    let (objects, metadata) = match &t.name {
        Some(name) => {
            let ns = t.namespace.clone().unwrap_or_default();
            let obj = shared.store.get(t.rid, &ns, name)?;
            let rv = obj.pointer("/metadata/resourceVersion").cloned();
            (vec![(*obj).clone()], json!({"resourceVersion": rv}))
        }
        None => {
            let lq = list_query(r, t, q)?;
            let bytes = shared.store.list_json(t.rid, &lq)?;
            let mut list: Value =
                serde_json::from_slice(&bytes).map_err(|e| ApiError::internal(e.to_string()))?;
            let items = match list.get_mut("items").map(Value::take) {
                Some(Value::Array(items)) => items,
                _ => Vec::new(),
            };
            (items, list.get("metadata").cloned().unwrap_or(json!({})))
        }
    };
    let body = table::table(
        r,
        &objects,
        metadata,
        version,
        q.get("includeObject"),
        k8s_openapi::jiff::Timestamp::now(),
    )?;
    let mut resp = json_response(200, &body);
    if let Ok(v) = header::HeaderValue::from_str(&table::content_type(version)) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    Ok(resp)
}

fn event_line(etype: &str, obj: &Value) -> Bytes {
    let mut buf = Vec::with_capacity(1024);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(etype.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    let _ = serde_json::to_writer(&mut buf, obj);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

fn bookmark(r: &ResourceInfo, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": meta}),
    )
}

struct Filter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj.pointer("/metadata/namespace").and_then(Value::as_str) != Some(ns.as_str()) {
                return false;
            }
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The event this watcher sees, with selector transitions turned into ADDED/DELETED.
    fn translate(&self, ev: &Event) -> Option<&'static str> {
        let now = self.matches(&ev.object);
        let before = ev.prev.as_deref().map(|p| self.matches(p)).unwrap_or(false);
        match ev.etype {
            EventType::Added => now.then_some("ADDED"),
            EventType::Modified => match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
            EventType::Deleted => (before || now).then_some("DELETED"),
        }
    }
}

fn start_watch(shared: &Arc<Shared>, t: &Target, q: &Query) -> Result<(Response, bool), ApiError> {
    let r = &RESOURCES[t.rid];
    let rid = t.rid;
    let lq = list_query(r, t, q)?;
    let send_initial = match q.get("sendInitialEvents") {
        Some("true" | "1") => true,
        None | Some("false" | "0" | "") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid sendInitialEvents {other:?}"
            )))
        }
    };
    let bookmarks = q.flag("allowWatchBookmarks");
    if send_initial && (!bookmarks || q.get("resourceVersionMatch") != Some("NotOlderThan")) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "ListOptions",
            "",
            &[(
                "sendInitialEvents",
                "FieldValueForbidden",
                "Forbidden: sendInitialEvents requires allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan".into(),
            )],
        ));
    }
    let timeout = match q.get("timeoutSeconds") {
        None | Some("") => DEFAULT_WATCH_TIMEOUT,
        Some(s) => Duration::from_secs(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {s:?}")))?,
        ),
    };
    let rv = q.get("resourceVersion").unwrap_or("");
    let WatchStart {
        initial,
        mut rx,
        start_rv,
        gone,
    } = shared.store.watch(rid, rv, send_initial)?;
    let filter = Filter {
        namespace: lq.namespace,
        labels: lq.labels,
        fields: lq.fields,
    };
    let (tx, out) = tokio::sync::mpsc::channel::<Bytes>(256);
    let kill = shared.watch_token();
    let shutdown = shared.shutdown.clone();
    let floor = shared.store.floor();
    let requested = rv.to_string();
    tokio::spawn(async move {
        if gone {
            let e = ApiError::expired(format!("too old resource version: {requested} ({floor})"));
            let _ = tx.send(event_line("ERROR", &e.to_status())).await;
            return;
        }
        let mut last_rv = start_rv;
        for ev in &initial {
            if let Some(ty) = filter.translate(ev) {
                if tx.send(event_line(ty, &ev.object)).await.is_err() {
                    return;
                }
            }
        }
        if send_initial
            && tx
                .send(bookmark(&RESOURCES[rid], start_rv, true))
                .await
                .is_err()
        {
            return;
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(BOOKMARK_INTERVAL);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = kill.cancelled() => break,
                _ = shutdown.cancelled() => break,
                _ = &mut deadline => break,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(&RESOURCES[rid], last_rv, false)).await.is_err() {
                        break;
                    }
                }
                _ = tx.closed() => break,
                msg = rx.recv() => match msg {
                    Ok(ev) => {
                        last_rv = ev.rv;
                        if ev.rid != rid {
                            continue;
                        }
                        if let Some(ty) = filter.translate(&ev) {
                            if tx.send(event_line(ty, &ev.object)).await.is_err() {
                                break;
                            }
                        }
                    }
                    // A watcher that falls too far behind is closed; the client resumes.
                    Err(_) => break,
                },
            }
        }
    });
    let stream = futures::stream::unfold(out, |mut out| async move {
        out.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), out))
    });
    let resp = Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    Ok((resp, gone))
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "35",
        "emulationMajor": "1",
        "emulationMinor": "35",
        "gitVersion": "v1.35.0-ccm-inmemory",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn groups() -> Vec<&'static str> {
    let mut gs: Vec<&'static str> = RESOURCES
        .iter()
        .map(|r| r.group)
        .filter(|g| !g.is_empty())
        .collect();
    gs.dedup();
    gs
}

fn group_json(g: &str) -> Value {
    let gv = format!("{g}/v1");
    json!({
        "name": g,
        "versions": [{"groupVersion": gv, "version": "v1"}],
        "preferredVersion": {"groupVersion": gv, "version": "v1"}
    })
}

fn group_list() -> Value {
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups().into_iter().map(group_json).collect::<Vec<_>>()
    })
}

fn api_group(g: &str) -> Result<Value, ApiError> {
    if !groups().contains(&g) {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let mut v = group_json(g);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Ok(v)
}

fn resource_list(group: &str, version: &str) -> Result<Value, ApiError> {
    let rs: Vec<&ResourceInfo> = RESOURCES
        .iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        return Err(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let mut out = Vec::new();
    for r in rs {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        out.push(entry);
        if r.status {
            out.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": out,
    }))
}
