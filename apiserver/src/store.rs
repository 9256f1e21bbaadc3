//! The object store: objects as JSON keyed by (resource, namespace, name), one global
//! resourceVersion counter, a bounded event history and a broadcast channel for watchers.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Map, Value};
use tokio::sync::broadcast;

use super::error::ApiError;
use super::patch::{self, Owners};
use super::resources::{self, Allocator, ResourceInfo, RESOURCES};
use super::select::{FieldSelector, LabelSelector};

/// Default number of events kept for watch resumption.
pub const DEFAULT_HISTORY: usize = 10_000;

/// Kind of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`
    Added,
    /// `MODIFIED`
    Modified,
    /// `DELETED`
    Deleted,
}

/// One change, as delivered to watchers.
#[derive(Debug)]
pub struct Event {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Resource index in [`RESOURCES`].
    pub rid: usize,
    /// Event type.
    pub etype: EventType,
    /// The object after the change (for DELETED: the last state, with the deletion RV).
    pub object: Arc<Value>,
    /// The object before the change (for selector transitions), if any.
    pub prev: Option<Arc<Value>>,
}

struct Entry {
    obj: Arc<Value>,
    owners: Owners,
}

type Key = (String, String);

struct State {
    rv: u64,
    objects: Vec<BTreeMap<Key, Entry>>,
    history: VecDeque<Arc<Event>>,
    history_limit: usize,
    /// Every event with rv > floor is in `history`.
    floor: u64,
    writes: HashMap<(usize, String, String), u64>,
    alloc: Allocator,
}

/// Options of a write, from the query string.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    /// Writing the `status` subresource.
    pub status: bool,
    /// Field manager (`fieldManager` or derived from the user agent).
    pub manager: String,
    /// `dryRun=All`: validate, do not persist.
    pub dry_run: bool,
}

/// Patch flavours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml`
    Apply,
}

/// `DeleteOptions` fields we honour.
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `preconditions.uid`
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`
    pub resource_version: Option<String>,
    /// `dryRun=All`
    pub dry_run: bool,
}

/// What a list request asks for.
#[derive(Debug, Default)]
pub struct ListQuery {
    /// Namespace filter (`None` = all namespaces).
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
    /// Page size.
    pub limit: Option<usize>,
    /// Continue token.
    pub cont: Option<String>,
    /// `resourceVersion`
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`
    pub rv_match: Option<String>,
}

/// The beginning of a watch.
pub struct WatchStart {
    /// Events to send first (synthetic ADDED or replayed history).
    pub initial: Vec<Arc<Event>>,
    /// Live events after `initial`.
    pub rx: broadcast::Receiver<Arc<Event>>,
    /// The store's resourceVersion when the watch started.
    pub start_rv: u64,
    /// The requested resourceVersion is older than the history window.
    pub gone: bool,
}

/// The in-memory store.
pub struct Store {
    state: Mutex<State>,
    tx: broadcast::Sender<Arc<Event>>,
}

fn now() -> String {
    let secs = k8s_openapi::jiff::Timestamp::now().as_second();
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    h.finish()
}

fn new_uid() -> String {
    let a = random_u64();
    let b = random_u64();
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

fn generate_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = random_u64();
    (0..5)
        .map(|_| {
            let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
            n /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn set_rv(obj: &mut Value, rv: u64) {
    meta_mut(obj).insert("resourceVersion".into(), json!(rv.to_string()));
}

/// Parse a resourceVersion string.
pub fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!("invalid resource version {s:?}")).tap_reason("BadRequest")
    })
}

trait Tap {
    fn tap_reason(self, r: &'static str) -> Self;
}
impl Tap for ApiError {
    fn tap_reason(mut self, r: &'static str) -> Self {
        self.reason = r;
        self
    }
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}:{ns}:{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Result<(u64, String, String), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token:?}"));
    if !token.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    let s = String::from_utf8(bytes).map_err(|_| bad())?;
    let mut it = s.splitn(3, ':');
    let rv = it.next().and_then(|r| r.parse().ok()).ok_or_else(bad)?;
    let ns = it.next().ok_or_else(bad)?.to_string();
    let name = it.next().ok_or_else(bad)?.to_string();
    Ok((rv, ns, name))
}

/// Upstream-style "spec changed" test: everything but metadata and status.
fn content_changed(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| -> Map<String, Value> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| {
                        !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    strip(a) != strip(b)
}

/// Objects equal except for resourceVersion / managedFields.
fn same_object(a: &Value, b: &Value) -> bool {
    let clean = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        v
    };
    clean(a) == clean(b)
}

impl Store {
    /// An empty store with the standard namespaces.
    pub fn new(history_limit: usize) -> Self {
        let (tx, _) = broadcast::channel(65_536);
        let store = Store {
            state: Mutex::new(State {
                rv: 0,
                objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
                history: VecDeque::new(),
                history_limit: history_limit.max(1),
                floor: 0,
                writes: HashMap::new(),
                alloc: Allocator::default(),
            }),
            tx,
        };
        let ns = resources::lookup("", "v1", "namespaces").unwrap_or(0);
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let _ = store.create(
                ns,
                "",
                json!({"metadata": {"name": name}}),
                &WriteOpts::default(),
            );
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every mutation is a single
        // insert/remove after validation), so recover from poisoning.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// Change the history window (older resourceVersions answer 410).
    pub fn set_history_limit(&self, n: usize) {
        let mut st = self.lock();
        st.history_limit = n.max(1);
        trim_history(&mut st);
    }

    /// Forget all history: watches from any resourceVersion before now answer 410.
    pub fn compact(&self) {
        let mut st = self.lock();
        st.history.clear();
        st.floor = st.rv;
    }

    /// Committed writes to one object since start.
    pub fn writes_to(&self, rid: usize, ns: &str, name: &str) -> u64 {
        self.lock()
            .writes
            .get(&(rid, ns.to_string(), name.to_string()))
            .copied()
            .unwrap_or(0)
    }

    fn emit(
        &self,
        st: &mut State,
        rid: usize,
        etype: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        let ns = meta_str(&object, "namespace")
            .unwrap_or_default()
            .to_string();
        let name = meta_str(&object, "name").unwrap_or_default().to_string();
        *st.writes.entry((rid, ns, name)).or_insert(0) += 1;
        let ev = Arc::new(Event {
            rv: st.rv,
            rid,
            etype,
            object,
            prev,
        });
        st.history.push_back(ev.clone());
        trim_history(st);
        let _ = self.tx.send(ev);
    }

    /// GET one object.
    pub fn get(&self, rid: usize, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let st = self.lock();
        let r = &RESOURCES[rid];
        st.objects[rid]
            .get(&(ns.to_string(), name.to_string()))
            .map(|e| e.obj.clone())
            .ok_or_else(|| ApiError::not_found(r.group, r.plural, name))
    }

    /// All objects of a resource (any namespace), in key order.
    pub fn all(&self, rid: usize) -> Vec<Arc<Value>> {
        self.lock().objects[rid]
            .values()
            .map(|e| e.obj.clone())
            .collect()
    }

    fn check_namespace(st: &State, r: &ResourceInfo, ns: &str) -> Result<(), ApiError> {
        if !r.namespaced {
            return Ok(());
        }
        let nsrid = resources::lookup("", "v1", "namespaces").unwrap_or(0);
        if st.objects[nsrid].contains_key(&(String::new(), ns.to_string())) {
            Ok(())
        } else {
            Err(ApiError::not_found("", "namespaces", ns))
        }
    }

    /// POST: create an object.
    pub fn create(
        &self,
        rid: usize,
        ns: &str,
        body: Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        self.create_locked(&mut st, rid, ns, body, opts)
    }

    fn check_type(r: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
        let Some(m) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        };
        let av = r.api_version();
        match m.get("apiVersion").and_then(Value::as_str) {
            None => {
                m.insert("apiVersion".into(), json!(av));
            }
            Some(a) if a == av => {}
            Some(a) => {
                return Err(ApiError::bad_request(format!(
                "the API version in the data ({a}) does not match the expected API version ({av})"
            )))
            }
        }
        match m.get("kind").and_then(Value::as_str) {
            None => {
                m.insert("kind".into(), json!(r.kind));
            }
            Some(k) if k == r.kind => {}
            Some(k) => {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({k}) does not match the expected kind ({})",
                    r.kind
                )))
            }
        }
        Ok(())
    }

    fn check_ns_matches(r: &ResourceInfo, obj: &mut Value, ns: &str) -> Result<(), ApiError> {
        let body_ns = meta_str(obj, "namespace").unwrap_or_default().to_string();
        if r.namespaced {
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            meta_mut(obj).insert("namespace".into(), json!(ns));
        } else {
            meta_mut(obj).remove("namespace");
        }
        Ok(())
    }

    fn validate(
        r: &ResourceInfo,
        name: &str,
        obj: &Value,
        live: Option<&Value>,
    ) -> Result<(), ApiError> {
        let mut causes: Vec<(String, &str, String)> = Vec::new();
        for (field, msg) in resources::validate_labels(obj) {
            causes.push((field, "FieldValueInvalid", msg));
        }
        if let Some(live) = live {
            if r.group.is_empty() && r.plural == "nodes" {
                let old = live
                    .pointer("/spec/providerID")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let new = obj
                    .pointer("/spec/providerID")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !old.is_empty() && old != new {
                    causes.push((
                        "spec.providerID".into(),
                        "FieldValueForbidden",
                        "Forbidden: node updates may not change providerID except from \"\" to valid".into(),
                    ));
                }
            }
            if live.pointer("/metadata/deletionTimestamp").is_some() {
                let old: Vec<&Value> = live
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().collect())
                    .unwrap_or_default();
                let added = obj
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|a| a.iter().any(|f| !old.contains(&f)));
                if added {
                    causes.push((
                        "metadata.finalizers".into(),
                        "FieldValueForbidden",
                        "Forbidden: no new finalizers can be added if the object is being deleted"
                            .into(),
                    ));
                }
            }
            if r.group.is_empty() && r.plural == "services" {
                let old = live
                    .pointer("/spec/clusterIP")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let new = obj
                    .pointer("/spec/clusterIP")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if !old.is_empty() && old != new {
                    causes.push((
                        "spec.clusterIPs[0]".into(),
                        "FieldValueInvalid",
                        format!("Invalid value: {:?}: may not change once set", new),
                    ));
                }
            }
        }
        if causes.is_empty() {
            return Ok(());
        }
        let causes: Vec<(&str, &str, String)> = causes
            .iter()
            .map(|(f, t, m)| (f.as_str(), *t, m.clone()))
            .collect();
        Err(ApiError::invalid(r.group, r.kind, name, &causes))
    }

    fn create_locked(
        &self,
        st: &mut State,
        rid: usize,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let r = &RESOURCES[rid];
        Self::check_type(r, &mut obj)?;
        Self::check_ns_matches(r, &mut obj, ns)?;
        let mut name = meta_str(&obj, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            let gen = meta_str(&obj, "generateName")
                .unwrap_or_default()
                .to_string();
            if gen.is_empty() {
                return Err(ApiError::invalid(
                    r.group,
                    r.kind,
                    "",
                    &[(
                        "metadata.name",
                        "FieldValueRequired",
                        "Required value: name or generateName is required".into(),
                    )],
                ));
            }
            let gen: String = gen.chars().take(58).collect();
            name = format!("{gen}{}", generate_suffix());
            meta_mut(&mut obj).insert("name".into(), json!(name));
        }
        let errs = resources::validate_name(r.name_rule, &name);
        if !errs.is_empty() {
            let causes: Vec<(&str, &str, String)> = errs
                .into_iter()
                .map(|m| {
                    (
                        "metadata.name",
                        "FieldValueInvalid",
                        format!("Invalid value: {name:?}: {m}"),
                    )
                })
                .collect();
            return Err(ApiError::invalid(r.group, r.kind, &name, &causes));
        }
        Self::check_namespace(st, r, ns)?;
        let key = (ns.to_string(), name.clone());
        if st.objects[rid].contains_key(&key) {
            return Err(ApiError::already_exists(r.group, r.plural, &name));
        }
        {
            let m = meta_mut(&mut obj);
            for f in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ] {
                m.remove(f);
            }
            m.insert("uid".into(), json!(new_uid()));
            m.insert("creationTimestamp".into(), json!(now()));
            m.insert("generation".into(), json!(1));
        }
        resources::default_on_create(rid, &mut obj, &mut st.alloc);
        let mut obj = resources::normalize(rid, obj)?;
        Self::validate(r, &name, &obj, None)?;
        if opts.dry_run {
            return Ok(obj);
        }
        st.rv += 1;
        set_rv(&mut obj, st.rv);
        let mut owners = Owners::new();
        patch::record_update(&mut owners, &opts.manager, None, &obj);
        let arc = Arc::new(obj);
        st.objects[rid].insert(
            key,
            Entry {
                obj: arc.clone(),
                owners,
            },
        );
        self.emit(st, rid, EventType::Added, arc.clone(), None);
        Ok((*arc).clone())
    }

    /// PUT. Returns the stored object and whether it was created.
    pub fn update(
        &self,
        rid: usize,
        ns: &str,
        name: &str,
        body: Value,
        opts: &WriteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let r = &RESOURCES[rid];
        let mut st = self.lock();
        let key = (ns.to_string(), name.to_string());
        if !st.objects[rid].contains_key(&key) {
            if r.create_on_update && !opts.status {
                let mut body = body;
                if let Some(n) = meta_str(&body, "name") {
                    if n != name {
                        return Err(name_mismatch(n, name));
                    }
                }
                meta_mut(&mut body).insert("name".into(), json!(name));
                return self
                    .create_locked(&mut st, rid, ns, body, opts)
                    .map(|o| (o, true));
            }
            return Err(ApiError::not_found(r.group, r.plural, name));
        }
        self.update_locked(&mut st, rid, &key, body, opts, None)
            .map(|o| (o, false))
    }

    /// The core of every update (PUT and PATCH).
    fn update_locked(
        &self,
        st: &mut State,
        rid: usize,
        key: &Key,
        mut new: Value,
        opts: &WriteOpts,
        apply_owners: Option<Owners>,
    ) -> Result<Value, ApiError> {
        let r = &RESOURCES[rid];
        let (ns, name) = (key.0.as_str(), key.1.as_str());
        let Some(entry) = st.objects[rid].get(key) else {
            return Err(ApiError::not_found(r.group, r.plural, name));
        };
        let live = entry.obj.clone();
        Self::check_type(r, &mut new)?;
        if let Some(n) = meta_str(&new, "name") {
            if n != name {
                return Err(name_mismatch(n, name));
            }
        }
        Self::check_ns_matches(r, &mut new, ns)?;
        let live_rv = meta_str(&live, "resourceVersion").unwrap_or_default();
        match meta_str(&new, "resourceVersion") {
            Some(rv) if !rv.is_empty() && rv != live_rv => {
                return Err(ApiError::stale(r.group, r.plural, name));
            }
            _ => {}
        }
        let live_uid = meta_str(&live, "uid").unwrap_or_default();
        match meta_str(&new, "uid") {
            Some(uid) if !uid.is_empty() && uid != live_uid => {
                return Err(ApiError::conflict(
                    r.group,
                    r.plural,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {live_uid}"),
                ));
            }
            _ => {}
        }
        {
            let m = meta_mut(&mut new);
            m.remove("managedFields");
            m.remove("selfLink");
            for f in [
                "name",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match live.get("metadata").and_then(|lm| lm.get(f)) {
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
        }
        let (Some(nm), Some(lm)) = (new.as_object_mut(), live.as_object()) else {
            return Err(ApiError::bad_request(
                "the request body must be a JSON object",
            ));
        };
        if opts.status {
            // Status subresource: only status and metadata may change.
            nm.retain(|k, _| matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind"));
            for (k, v) in lm {
                if !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind") {
                    nm.insert(k.clone(), v.clone());
                }
            }
        } else if r.status {
            match lm.get("status") {
                Some(s) => nm.insert("status".into(), s.clone()),
                None => nm.remove("status"),
            };
        }
        let mut new = resources::normalize(rid, new)?;
        Self::validate(r, name, &new, Some(&live))?;
        if content_changed(&live, &new) {
            let g = live
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), json!(g + 1));
        }
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let no_finalizers = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty);
        if same_object(&live, &new) && apply_owners.is_none() {
            // No-op update: upstream does not write, bump the resourceVersion or emit an event.
            return Ok((*live).clone());
        }
        if opts.dry_run {
            return Ok(new);
        }
        if same_object(&live, &new) {
            // Only ownership changed (apply of identical values).
            if let (Some(owners), Some(e)) = (apply_owners, st.objects[rid].get_mut(key)) {
                e.owners = owners;
            }
            return Ok((*live).clone());
        }
        st.rv += 1;
        set_rv(&mut new, st.rv);
        let mut owners = match apply_owners {
            Some(o) => o,
            None => st.objects[rid]
                .get(key)
                .map(|e| e.owners.clone())
                .unwrap_or_default(),
        };
        if !opts.manager.is_empty() {
            patch::record_update(&mut owners, &opts.manager, Some(&live), &new);
        }
        let arc = Arc::new(new);
        if deleting && no_finalizers {
            st.objects[rid].remove(key);
            self.emit(st, rid, EventType::Deleted, arc.clone(), Some(live));
        } else {
            st.objects[rid].insert(
                key.clone(),
                Entry {
                    obj: arc.clone(),
                    owners,
                },
            );
            self.emit(st, rid, EventType::Modified, arc.clone(), Some(live));
        }
        Ok((*arc).clone())
    }

    /// PATCH. Returns the stored object and whether it was created (apply only).
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        rid: usize,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: &[u8],
        opts: &WriteOpts,
        force: bool,
    ) -> Result<(Value, bool), ApiError> {
        let r = &RESOURCES[rid];
        let key = (ns.to_string(), name.to_string());
        let parse = |b: &[u8]| -> Result<Value, ApiError> {
            serde_json::from_slice(b)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
        };
        let mut st = self.lock();
        if ptype == PatchType::Apply {
            let applied: Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(_) => {
                    let text = std::str::from_utf8(body).map_err(|e| {
                        ApiError::bad_request(format!("apply body is not UTF-8: {e}"))
                    })?;
                    yaml_serde::from_str(text)
                        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
                }
            };
            return self.apply_locked(&mut st, rid, &key, applied, opts, force);
        }
        let Some(entry) = st.objects[rid].get(&key) else {
            return Err(ApiError::not_found(r.group, r.plural, name));
        };
        let live = entry.obj.clone();
        let new = match ptype {
            PatchType::Merge => {
                let p = parse(body)?;
                if !p.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                let mut doc = (*live).clone();
                json_patch::merge(&mut doc, &p);
                doc
            }
            PatchType::Strategic => patch::strategic_merge(r, &live, &parse(body)?)?,
            PatchType::Json => {
                let ops: json_patch::Patch = serde_json::from_slice(body).map_err(|e| {
                    ApiError::bad_request(format!("error decoding JSON patch: {e}"))
                })?;
                let mut doc = (*live).clone();
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    ApiError::unprocessable(format!(
                        "the server rejected our request due to an error in our request: {e}"
                    ))
                })?;
                doc
            }
            PatchType::Apply => unreachable!("handled above"),
        };
        self.update_locked(&mut st, rid, &key, new, opts, None)
            .map(|o| (o, false))
    }

    fn apply_locked(
        &self,
        st: &mut State,
        rid: usize,
        key: &Key,
        mut applied: Value,
        opts: &WriteOpts,
        force: bool,
    ) -> Result<(Value, bool), ApiError> {
        let r = &RESOURCES[rid];
        let (ns, name) = (key.0.as_str(), key.1.as_str());
        if opts.manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH, application/apply-patch+yaml requires fieldManager to be set",
            ));
        }
        if !applied.is_object() {
            return Err(ApiError::bad_request("apply body must be an object"));
        }
        for (field, want) in [
            ("apiVersion", r.api_version()),
            ("kind", r.kind.to_string()),
        ] {
            match applied.get(field).and_then(Value::as_str) {
                Some(v) if v == want => {}
                Some(v) => {
                    return Err(ApiError::bad_request(format!(
                        "{field} {v:?} in the applied object does not match {want:?}"
                    )))
                }
                None => {
                    return Err(ApiError::bad_request(format!(
                        "{field} must be set in an apply request"
                    )))
                }
            }
        }
        if let Some(n) = meta_str(&applied, "name") {
            if n != name {
                return Err(name_mismatch(n, name));
            }
        }
        if contains_directive(&applied) {
            return Err(ApiError::bad_request(
                "apply: patch directives ($patch, $retainKeys, ...) are not allowed in an applied configuration",
            ));
        }
        meta_mut(&mut applied).insert("name".into(), json!(name));
        let me_apply = format!("{}|Apply", opts.manager);
        let Some(entry) = st.objects[rid].get(key) else {
            let obj = self.create_locked(
                st,
                rid,
                ns,
                applied.clone(),
                &WriteOpts {
                    manager: String::new(),
                    ..opts.clone()
                },
            )?;
            if !opts.dry_run {
                let mut owners = Owners::new();
                owners.insert(me_apply, patch::leaf_paths(&applied));
                if let Some(e) = st.objects[rid].get_mut(key) {
                    e.owners = owners;
                }
            }
            return Ok((obj, true));
        };
        let live = entry.obj.clone();
        let mut owners = entry.owners.clone();
        let conflicts = patch::apply_conflicts(&owners, &opts.manager, &live, &applied);
        if !conflicts.is_empty() && !force {
            let list: Vec<String> = conflicts
                .iter()
                .map(|(m, f)| format!("conflict with {:?}: .{f}", m.split('|').next().unwrap_or(m)))
                .collect();
            let mut e = ApiError::conflict(
                r.group,
                r.plural,
                name,
                &format!(
                    "Apply failed with {} conflict{}: {}",
                    list.len(),
                    if list.len() == 1 { "" } else { "s" },
                    list.join(", ")
                ),
            );
            if let Some(Value::Object(d)) = e.details.as_mut() {
                d.insert(
                    "causes".into(),
                    Value::Array(
                        conflicts
                            .iter()
                            .map(|(m, f)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {:?}", m.split('|').next().unwrap_or(m)), "field": format!(".{f}")}))
                            .collect(),
                    ),
                );
            }
            return Err(e);
        }
        let new_paths = patch::leaf_paths(&applied);
        // Fields this manager applied before but not now, owned by nobody else, are removed.
        let previously = owners.get(&me_apply).cloned().unwrap_or_default();
        let mut merged = patch::strategic_merge(r, &live, &applied)?;
        for p in previously.difference(&new_paths) {
            let other_owner = owners.iter().any(|(k, s)| *k != me_apply && s.contains(p));
            if !other_owner {
                patch::remove_path(&mut merged, p);
            }
        }
        if force {
            for (k, set) in owners.iter_mut() {
                if *k != me_apply {
                    set.retain(|p| !new_paths.contains(p));
                }
            }
        }
        owners.insert(me_apply, new_paths);
        owners.retain(|_, s| !s.is_empty());
        let opts = WriteOpts {
            manager: String::new(),
            ..opts.clone()
        };
        self.update_locked(st, rid, key, merged, &opts, Some(owners))
            .map(|o| (o, false))
    }

    /// DELETE one object (finalizers honoured).
    pub fn delete(
        &self,
        rid: usize,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let mut st = self.lock();
        self.delete_locked(&mut st, rid, &(ns.to_string(), name.to_string()), opts)
    }

    fn delete_locked(
        &self,
        st: &mut State,
        rid: usize,
        key: &Key,
        opts: &DeleteOpts,
    ) -> Result<Value, ApiError> {
        let r = &RESOURCES[rid];
        let name = key.1.as_str();
        let Some(entry) = st.objects[rid].get(key) else {
            return Err(ApiError::not_found(r.group, r.plural, name));
        };
        let live = entry.obj.clone();
        let live_uid = meta_str(&live, "uid").unwrap_or_default();
        if let Some(uid) = &opts.uid {
            if uid != live_uid {
                return Err(ApiError::conflict(
                    r.group,
                    r.plural,
                    name,
                    &format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {live_uid}"),
                ));
            }
        }
        let live_rv = meta_str(&live, "resourceVersion").unwrap_or_default();
        if let Some(rv) = &opts.resource_version {
            if rv != live_rv {
                return Err(ApiError::conflict(
                    r.group,
                    r.plural,
                    name,
                    &format!("Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {live_rv}"),
                ));
            }
        }
        let has_finalizers = live
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        if has_finalizers {
            if live.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok((*live).clone());
            }
            let mut new = (*live).clone();
            {
                let m = meta_mut(&mut new);
                m.insert("deletionTimestamp".into(), json!(now()));
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
            }
            if opts.dry_run {
                return Ok(new);
            }
            st.rv += 1;
            set_rv(&mut new, st.rv);
            let owners = st.objects[rid]
                .get(key)
                .map(|e| e.owners.clone())
                .unwrap_or_default();
            let arc = Arc::new(new);
            st.objects[rid].insert(
                key.clone(),
                Entry {
                    obj: arc.clone(),
                    owners,
                },
            );
            self.emit(st, rid, EventType::Modified, arc.clone(), Some(live));
            return Ok((*arc).clone());
        }
        if opts.dry_run {
            return Ok((*live).clone());
        }
        st.objects[rid].remove(key);
        st.rv += 1;
        let mut gone = (*live).clone();
        set_rv(&mut gone, st.rv);
        let arc = Arc::new(gone);
        self.emit(st, rid, EventType::Deleted, arc.clone(), Some(live));
        // Deleting a namespace removes its contents (no namespace controller here).
        if r.group.is_empty() && r.plural == "namespaces" {
            for (other, info) in RESOURCES.iter().enumerate() {
                if !info.namespaced {
                    continue;
                }
                let keys: Vec<Key> = st.objects[other]
                    .keys()
                    .filter(|(ns, _)| *ns == key.1)
                    .cloned()
                    .collect();
                for k in keys {
                    if let Some(e) = st.objects[other].remove(&k) {
                        st.rv += 1;
                        let mut o = (*e.obj).clone();
                        set_rv(&mut o, st.rv);
                        self.emit(st, other, EventType::Deleted, Arc::new(o), Some(e.obj));
                    }
                }
            }
        }
        Ok((*arc).clone())
    }

    /// DELETE on a collection; returns the affected objects.
    pub fn delete_collection(
        &self,
        rid: usize,
        q: &ListQuery,
        opts: &DeleteOpts,
    ) -> Result<Vec<Value>, ApiError> {
        let mut st = self.lock();
        let keys: Vec<Key> = st.objects[rid]
            .iter()
            .filter(|((ns, _), e)| {
                q.namespace.as_ref().is_none_or(|n| n == ns)
                    && q.labels.matches(&e.obj)
                    && q.fields.matches(&e.obj)
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for k in keys {
            out.push(self.delete_locked(&mut st, rid, &k, opts)?);
        }
        Ok(out)
    }

    /// Serialize a list response directly from the store.
    pub fn list_json(&self, rid: usize, q: &ListQuery) -> Result<Vec<u8>, ApiError> {
        let r = &RESOURCES[rid];
        let st = self.lock();
        let mut list_rv = st.rv;
        let mut start: Option<Key> = None;
        if let Some(token) = q.cont.as_deref().filter(|t| !t.is_empty()) {
            let (rv, ns, name) = decode_continue(token)?;
            if rv < st.floor {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                ));
            }
            list_rv = rv;
            start = Some((ns, name));
        } else if let Some(rv) = q
            .resource_version
            .as_deref()
            .filter(|s| !s.is_empty() && *s != "0")
        {
            let n = parse_rv(rv)?;
            if q.rv_match.as_deref() == Some("Exact") && n != st.rv {
                // We keep no old snapshots; an exact read of the past is answered as expired.
                return Err(ApiError::expired(format!(
                    "too old resource version: {n} ({})",
                    st.rv
                )));
            }
        }
        let mut buf = Vec::with_capacity(4096);
        let mut count = 0usize;
        let mut next: Option<Key> = None;
        let _ = write!(
            buf,
            "{{\"kind\":\"{}List\",\"apiVersion\":\"{}\",\"metadata\":{{",
            r.kind,
            r.api_version()
        );
        let mut items = Vec::with_capacity(1024);
        let iter: Box<dyn Iterator<Item = (&Key, &Entry)>> = match &start {
            Some(k) => Box::new(
                st.objects[rid]
                    .range::<Key, _>((std::ops::Bound::Excluded(k), std::ops::Bound::Unbounded)),
            ),
            None => Box::new(st.objects[rid].iter()),
        };
        let mut remaining = 0usize;
        for (k, e) in iter {
            if let Some(ns) = &q.namespace {
                if &k.0 != ns {
                    continue;
                }
            }
            if !q.labels.matches(&e.obj) || !q.fields.matches(&e.obj) {
                continue;
            }
            if let Some(limit) = q.limit.filter(|l| *l > 0) {
                if count >= limit {
                    remaining += 1;
                    continue;
                }
            }
            if count > 0 {
                items.push(b',');
            }
            serde_json::to_writer(&mut items, &*e.obj)
                .map_err(|e| ApiError::internal(e.to_string()))?;
            count += 1;
            next = Some(k.clone());
        }
        let _ = write!(buf, "\"resourceVersion\":\"{list_rv}\"");
        if remaining > 0 {
            if let Some((ns, name)) = &next {
                let _ = write!(
                    buf,
                    ",\"continue\":\"{}\",\"remainingItemCount\":{remaining}",
                    encode_continue(list_rv, ns, name)
                );
            }
        }
        buf.extend_from_slice(b"},\"items\":[");
        buf.extend_from_slice(&items);
        buf.extend_from_slice(b"]}");
        Ok(buf)
    }

    /// Start a watch. `rv` is the request's resourceVersion; `initial` asks for the current state
    /// first (`sendInitialEvents`, or resourceVersion "" / "0").
    pub fn watch(&self, rid: usize, rv: &str, initial: bool) -> Result<WatchStart, ApiError> {
        let st = self.lock();
        let rx = self.tx.subscribe();
        let start_rv = st.rv;
        if initial || rv.is_empty() || rv == "0" {
            let events = st.objects[rid]
                .values()
                .map(|e| {
                    Arc::new(Event {
                        rv: start_rv,
                        rid,
                        etype: EventType::Added,
                        object: e.obj.clone(),
                        prev: None,
                    })
                })
                .collect();
            return Ok(WatchStart {
                initial: events,
                rx,
                start_rv,
                gone: false,
            });
        }
        let n = parse_rv(rv)?;
        if n < st.floor {
            return Ok(WatchStart {
                initial: Vec::new(),
                rx,
                start_rv,
                gone: true,
            });
        }
        let events = st
            .history
            .iter()
            .filter(|e| e.rv > n && e.rid == rid)
            .cloned()
            .collect();
        Ok(WatchStart {
            initial: events,
            rx,
            start_rv,
            gone: false,
        })
    }

    /// The oldest resourceVersion a watch can resume from.
    pub fn floor(&self) -> u64 {
        self.lock().floor
    }
}

fn trim_history(st: &mut State) {
    while st.history.len() > st.history_limit {
        if let Some(ev) = st.history.pop_front() {
            st.floor = ev.rv;
        }
    }
}

fn name_mismatch(body: &str, url: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the name of the object ({body}) does not match the name on the URL ({url})"
    ))
}

fn contains_directive(v: &Value) -> bool {
    match v {
        Value::Object(m) => m
            .iter()
            .any(|(k, c)| k.starts_with('$') || contains_directive(c)),
        Value::Array(a) => a.iter().any(contains_directive),
        _ => false,
    }
}
