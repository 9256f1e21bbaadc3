//! Test controls: request log and fault injection. Reached through [`super::ApiServer::controls`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::resources::{self, RESOURCES};
use super::reviews::{Policy, Rule, TokenEntry};
use super::store::{Store, WriteOpts};

/// One request as the server saw it.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// Kubernetes verb: get, list, watch, create, update, patch, delete, deletecollection, or
    /// `discovery` / `other` for non-resource URLs.
    pub verb: String,
    /// HTTP method.
    pub method: String,
    /// URL path.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Resource (plural, `resource.group` for non-core groups), empty for non-resource URLs.
    pub resource: String,
    /// Subresource (`status`) if any.
    pub subresource: String,
    /// Namespace, empty if none.
    pub namespace: String,
    /// Object name, empty for collections.
    pub name: String,
    /// `Content-Type` of the request body (the patch type for PATCH).
    pub content_type: String,
    /// Request body (lossy UTF-8).
    pub body: String,
    /// `User-Agent` header, empty if none: tells the host's clients apart (leader election,
    /// each controller, the shared informers).
    pub user_agent: String,
    /// When the server received the request (before any injected latency).
    #[serde(with = "received_at_millis")]
    pub received_at: std::time::SystemTime,
    /// HTTP status code answered. Watches record the code of their start; a watch started from a
    /// too-old resourceVersion records 410 (the wire answer is 200 with an ERROR event, as
    /// upstream does).
    pub code: u16,
}

/// `received_at` as milliseconds since the Unix epoch in the JSON form of a record.
mod received_at_millis {
    use std::time::{SystemTime, UNIX_EPOCH};

    pub fn serialize<S: serde::Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
        let millis = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
        s.serialize_u128(millis)
    }
}

impl RequestRecord {
    /// Body parsed as JSON (Null if empty or not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

#[derive(Debug, Clone)]
struct Fault {
    remaining: u32,
    verb: String,
    resource: String,
    code: u16,
}

pub(crate) struct ControlState {
    pub requests: Vec<RequestRecord>,
    faults: Vec<Fault>,
    conflicts: Vec<(u32, String)>,
    pub latency: Duration,
    pub retry_after: u64,
    pub policy: Policy,
}

impl Default for ControlState {
    fn default() -> Self {
        ControlState {
            requests: Vec::new(),
            faults: Vec::new(),
            conflicts: Vec::new(),
            latency: Duration::ZERO,
            retry_after: 1,
            policy: Policy::default(),
        }
    }
}

/// Shared between the HTTP layer and [`Controls`].
pub(crate) struct Shared {
    pub store: Store,
    pub ctl: Mutex<ControlState>,
    pub watch_kill: Mutex<CancellationToken>,
    pub shutdown: CancellationToken,
}

impl Shared {
    pub fn ctl(&self) -> MutexGuard<'_, ControlState> {
        self.ctl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Token cancelled by the next `drop_watches`.
    pub fn watch_token(&self) -> CancellationToken {
        self.watch_kill
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// An injected failure for this request, if one is armed.
    pub fn take_fault(&self, verb: &str, resource: &str) -> Option<ApiError> {
        let mut ctl = self.ctl();
        let retry_after = ctl.retry_after;
        let idx = ctl.faults.iter().position(|f| {
            f.remaining > 0
                && (f.verb == "*" || f.verb == verb)
                && (f.resource == "*" || f.resource == resource)
        })?;
        let f = &mut ctl.faults[idx];
        f.remaining -= 1;
        let code = f.code;
        ctl.faults.retain(|f| f.remaining > 0);
        let mut e = ApiError::for_code(
            code,
            format!("injected failure ({code}) for {verb} {resource}"),
        );
        if code == 429 {
            e.message = "Too many requests, please try again later.".into();
            e.retry_after = Some(retry_after);
        }
        if code == 500 {
            e = ApiError::internal(format!("injected failure for {verb} {resource}"));
        }
        Some(e)
    }

    /// A forced conflict for this write, if armed.
    pub fn take_conflict(&self, resource: &str) -> bool {
        let mut ctl = self.ctl();
        let Some(idx) = ctl
            .conflicts
            .iter()
            .position(|(n, r)| *n > 0 && (r == "*" || r == resource))
        else {
            return false;
        };
        ctl.conflicts[idx].0 -= 1;
        ctl.conflicts.retain(|(n, _)| *n > 0);
        true
    }
}

/// Controls for tests and the sandbox.
#[derive(Clone)]
pub struct Controls {
    pub(crate) shared: Arc<Shared>,
}

fn rid_of(resource: &str) -> anyhow::Result<usize> {
    resources::lookup_name(resource).ok_or_else(|| anyhow::anyhow!("unknown resource {resource:?}"))
}

impl Controls {
    /// Store an object (any served kind, chosen by its apiVersion and kind) as if created through
    /// the API (defaulting and validation apply). Returns the stored object.
    pub fn seed(&self, obj: impl Serialize) -> anyhow::Result<Value> {
        let obj = serde_json::to_value(obj)?;
        let av = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
        let rid = resources::lookup_kind(av, kind).ok_or_else(|| {
            anyhow::anyhow!("seed: unknown apiVersion/kind {av:?}/{kind:?} (set both)")
        })?;
        let ns = if RESOURCES[rid].namespaced {
            obj.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or("default")
                .to_string()
        } else {
            String::new()
        };
        let opts = WriteOpts {
            manager: "seed".into(),
            ..Default::default()
        };
        self.shared
            .store
            .create(rid, &ns, obj, &opts)
            .map_err(|e| anyhow::anyhow!("seed failed: {e}"))
    }

    /// Current state of one object (`resource` as kubectl names it: `nodes`, `leases`,
    /// `events.events.k8s.io`). `namespace` is `""` for cluster-scoped objects.
    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let rid = rid_of(resource).ok()?;
        self.shared
            .store
            .get(rid, namespace, name)
            .ok()
            .map(|a| (*a).clone())
    }

    /// Every object of a resource, across namespaces, in (namespace, name) order.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        rid_of(resource)
            .map(|rid| {
                self.shared
                    .store
                    .all(rid)
                    .iter()
                    .map(|a| (**a).clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    /// Every request received since start (or the last [`Controls::clear_requests`]).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.ctl().requests.clone()
    }

    /// Forget the request log.
    pub fn clear_requests(&self) {
        self.shared.ctl().requests.clear();
    }

    /// Committed writes (create, update, patch, delete that changed state) to one object.
    pub fn writes_to(&self, resource: &str, namespace: &str, name: &str) -> u64 {
        rid_of(resource)
            .map(|rid| self.shared.store.writes_to(rid, namespace, name))
            .unwrap_or(0)
    }

    /// Close every open watch connection (clients see the stream end and re-watch).
    pub fn drop_watches(&self) {
        let mut tok = self
            .shared
            .watch_kill
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        tok.cancel();
        *tok = CancellationToken::new();
    }

    /// Fail the next `n` requests with `verb` (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection` or `*`) on `resource` (or `*`) with `code`.
    /// 429 answers carry `Retry-After` (see [`Controls::set_retry_after`]).
    pub fn fail_next(&self, n: u32, verb: &str, resource: &str, code: u16) {
        self.shared.ctl().faults.push(Fault {
            remaining: n,
            verb: verb.into(),
            resource: resource.into(),
            code,
        });
    }

    /// Disarm all injected failures and forced conflicts.
    pub fn clear_faults(&self) {
        let mut ctl = self.shared.ctl();
        ctl.faults.clear();
        ctl.conflicts.clear();
    }

    /// Seconds sent in `Retry-After` with injected 429s (default 1).
    pub fn set_retry_after(&self, secs: u64) {
        self.shared.ctl().retry_after = secs;
    }

    /// Delay every request by `d` before it is handled.
    pub fn set_latency(&self, d: Duration) {
        self.shared.ctl().latency = d;
    }

    /// Answer the next `n` writes (update, patch, delete) to `resource` (or `*`) with 409 Conflict.
    pub fn force_conflicts(&self, n: u32, resource: &str) {
        self.shared.ctl().conflicts.push((n, resource.into()));
    }

    /// Keep only the last `n` events for watch resumption (default 10,000); older
    /// resourceVersions answer 410 Gone.
    pub fn set_history_limit(&self, n: usize) {
        self.shared.store.set_history_limit(n);
    }

    /// Forget the whole event history, like an etcd compaction: watches resuming from a
    /// resourceVersion older than now get 410 Gone.
    pub fn compact(&self) {
        self.shared.store.compact();
    }

    /// Make TokenReview (`authentication.k8s.io/v1`) authenticate the bearer `token` as `user`
    /// with `groups` (plus `system:authenticated`, as the real API server adds). Registering a
    /// token again replaces its user. Unknown tokens are answered `authenticated: false`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut ctl = self.shared.ctl();
        ctl.policy.tokens.retain(|t| t.token != token);
        ctl.policy.tokens.push(TokenEntry {
            token: token.into(),
            user: user.into(),
            uid: format!("uid-{user}"),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        });
    }

    /// Forget a token registered with [`Controls::add_token`]: its reviews answer
    /// `authenticated: false` from now on.
    pub fn remove_token(&self, token: &str) {
        self.shared.ctl().policy.tokens.retain(|t| t.token != token);
    }

    /// Make SubjectAccessReview (`authorization.k8s.io/v1`) allow `subject`, a user name or a
    /// group name, the `verbs` (`*`: all) on the non-resource `paths` (`/metrics`; a trailing
    /// `*` matches a prefix; `*` alone every path), as a ClusterRole with `nonResourceURLs`
    /// bound to it would. Everything no rule allows is denied, except for members of
    /// `system:masters`, who are allowed everything; reviews of resource attributes are denied.
    pub fn allow_non_resource(&self, subject: &str, verbs: &[&str], paths: &[&str]) {
        self.shared.ctl().policy.rules.push(Rule {
            subject: subject.into(),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            paths: paths.iter().map(|p| p.to_string()).collect(),
        });
    }

    /// Remove every rule added with [`Controls::allow_non_resource`] (tokens stay).
    pub fn clear_access_rules(&self) {
        self.shared.ctl().policy.rules.clear();
    }
}
