//! Allocations kept in the cluster: one ConfigMap (default `kube-system/ccm-metal-ipam`), one
//! data entry per service (`<namespace>.<name>` → JSON [`Allocation`]), written with optimistic
//! concurrency (the `resourceVersion` read is sent back; a 409 means re-read and decide again).
//!
//! Everything goes through the host's `kube_request` ([`KubeApi`]), so the plugin needs no
//! Kubernetes client of its own, and tests can substitute an in-memory API.

use std::sync::Arc;

use ccm_provider_abi::prelude::*;
use serde_json::{json, Map, Value};

use crate::ipam::{Allocation, Allocations};
use crate::service::ServiceKey;

/// Label put on a ConfigMap this provider creates.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "ccm-host-metal");

/// How many times one change is retried after conflicting writes.
const MAX_ATTEMPTS: usize = 8;

/// One request to the Kubernetes API: `(HTTP status, body)`.
pub trait KubeApi: Send + Sync {
    /// Send `method path` with a JSON `body` (empty: none).
    fn request(
        &self,
        ctx: &CallContext,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), ProviderError>;
}

impl KubeApi for Host {
    fn request(
        &self,
        ctx: &CallContext,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<(u16, Vec<u8>), ProviderError> {
        self.kube_request(ctx, method, path, "application/json", body)
    }
}

/// The ConfigMap as last read.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The object (None: it does not exist yet).
    pub object: Option<Value>,
    /// Its decoded entries.
    pub allocations: Allocations,
}

/// Outcome of one write.
enum Write {
    Done,
    Conflict,
}

/// The allocation ConfigMap.
pub struct AllocationStore {
    api: Arc<dyn KubeApi>,
    namespace: String,
    name: String,
}

/// The `message` of a Kubernetes `Status` body, or the body itself.
fn status_message(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v.get("message").and_then(Value::as_str).map(String::from))
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect())
}

impl AllocationStore {
    /// The store `namespace/name`, reached through `api`.
    pub fn new(api: Arc<dyn KubeApi>, namespace: &str, name: &str) -> Self {
        Self {
            api,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The API it goes through.
    pub fn api(&self) -> Arc<dyn KubeApi> {
        self.api.clone()
    }

    /// `namespace/name` for messages.
    pub fn describe(&self) -> String {
        format!("configmap {}/{}", self.namespace, self.name)
    }

    fn collection_path(&self) -> String {
        format!("/api/v1/namespaces/{}/configmaps", self.namespace)
    }

    fn path(&self) -> String {
        format!("{}/{}", self.collection_path(), self.name)
    }

    fn failure(&self, verb: &str, status: u16, body: &[u8]) -> ProviderError {
        let hint = if status == 401 || status == 403 {
            format!(
                " (the host's credentials need get, create and update on configmaps in namespace {})",
                self.namespace
            )
        } else {
            String::new()
        };
        ProviderError::other(format!(
            "metal load balancer: cannot {verb} {}: HTTP {status}: {}{hint}",
            self.describe(),
            status_message(body)
        ))
    }

    /// Read the ConfigMap (absent = no allocations).
    pub fn load(&self, ctx: &CallContext) -> Result<Snapshot, ProviderError> {
        let (status, body) = self
            .api
            .request(ctx, "GET", &self.path(), &[])
            .map_err(|e| e.context(format!("metal load balancer: reading {}", self.describe())))?;
        match status {
            404 => Ok(Snapshot::default()),
            200..=299 => {
                let object: Value = serde_json::from_slice(&body).map_err(|e| {
                    ProviderError::other(format!(
                        "metal load balancer: {} is not JSON: {e}",
                        self.describe()
                    ))
                })?;
                let allocations = self.decode(&object)?;
                Ok(Snapshot {
                    object: Some(object),
                    allocations,
                })
            }
            _ => Err(self.failure("read", status, &body)),
        }
    }

    fn decode(&self, object: &Value) -> Result<Allocations, ProviderError> {
        let mut out = Allocations::new();
        let Some(data) = object.get("data").and_then(Value::as_object) else {
            return Ok(out);
        };
        for (k, v) in data {
            let bad = |why: String| {
                ProviderError::other(format!(
                    "metal load balancer: {} entry {k:?} {why}; fix or delete the entry (allocations are not made while it is unreadable, so no address is given twice)",
                    self.describe()
                ))
            };
            let key = ServiceKey::from_data_key(k)
                .ok_or_else(|| bad("is not a <namespace>.<service> key".into()))?;
            let text = v.as_str().ok_or_else(|| bad("is not a string".into()))?;
            let alloc: Allocation =
                serde_json::from_str(text).map_err(|e| bad(format!("does not parse: {e}")))?;
            out.insert(key, alloc);
        }
        Ok(out)
    }

    fn encode(allocations: &Allocations) -> Map<String, Value> {
        allocations
            .iter()
            .map(|(k, a)| {
                let text = serde_json::to_string(a).expect("an allocation serialises");
                (k.data_key(), Value::String(text))
            })
            .collect()
    }

    fn write(
        &self,
        ctx: &CallContext,
        snapshot: &Snapshot,
        allocations: &Allocations,
    ) -> Result<Write, ProviderError> {
        let data = Value::Object(Self::encode(allocations));
        let (verb, method, path, object) = match &snapshot.object {
            Some(object) => {
                let mut object = object.clone();
                object["data"] = data;
                ("update", "PUT", self.path(), object)
            }
            None => (
                "create",
                "POST",
                self.collection_path(),
                json!({
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "labels": {MANAGED_BY.0: MANAGED_BY.1},
                    },
                    "data": data,
                }),
            ),
        };
        let body = serde_json::to_vec(&object).expect("a ConfigMap serialises");
        let (status, reply) = self
            .api
            .request(ctx, method, &path, &body)
            .map_err(|e| e.context(format!("metal load balancer: writing {}", self.describe())))?;
        match status {
            200..=299 => Ok(Write::Done),
            // Changed (or deleted, or created) by someone else since it was read.
            409 => Ok(Write::Conflict),
            404 if method == "PUT" => Ok(Write::Conflict),
            _ => Err(self.failure(verb, status, &reply)),
        }
    }

    /// Read, let `change` edit the allocations, and write them back if they changed; on a
    /// conflicting write, start again from a fresh read. `change` may run several times and
    /// should only compute; its `Err` aborts without writing.
    pub fn update<T>(
        &self,
        ctx: &CallContext,
        mut change: impl FnMut(&mut Allocations) -> Result<T, ProviderError>,
    ) -> Result<T, ProviderError> {
        for attempt in 1..=MAX_ATTEMPTS {
            ctx.check()?;
            let snapshot = self.load(ctx)?;
            let mut allocations = snapshot.allocations.clone();
            let out = change(&mut allocations)?;
            if allocations == snapshot.allocations {
                return Ok(out);
            }
            match self.write(ctx, &snapshot, &allocations)? {
                Write::Done => return Ok(out),
                Write::Conflict => log::debug!(
                    "metal load balancer: {} changed while being updated (attempt {attempt}); re-reading",
                    self.describe()
                ),
            }
        }
        Err(ProviderError::other(format!(
            "metal load balancer: {} changed under every one of {MAX_ATTEMPTS} attempts to update it; will retry",
            self.describe()
        )))
    }
}

/// An in-memory stand-in for the API server's ConfigMap endpoints and service lookups, with
/// resourceVersion checks, for unit tests.
#[cfg(test)]
pub mod memory {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// The fake API's state.
    #[derive(Default)]
    pub struct MemoryApi {
        /// Objects by path.
        pub objects: Mutex<BTreeMap<String, Value>>,
        /// The next `n` writes answer 409.
        pub conflicts: Mutex<usize>,
        /// Requests seen: `METHOD path`.
        pub log: Mutex<Vec<String>>,
        rv: Mutex<u64>,
    }

    impl MemoryApi {
        /// Store an object at `path`.
        pub fn put(&self, path: &str, mut v: Value) {
            let mut rv = self.rv.lock().unwrap();
            *rv += 1;
            v["metadata"]["resourceVersion"] = json!(rv.to_string());
            self.objects.lock().unwrap().insert(path.into(), v);
        }
    }

    impl KubeApi for MemoryApi {
        fn request(
            &self,
            _ctx: &CallContext,
            method: &str,
            path: &str,
            body: &[u8],
        ) -> Result<(u16, Vec<u8>), ProviderError> {
            self.log.lock().unwrap().push(format!("{method} {path}"));
            let not_found = (404, br#"{"message":"not found"}"#.to_vec());
            if method != "GET" {
                let mut c = self.conflicts.lock().unwrap();
                if *c > 0 {
                    *c -= 1;
                    return Ok((409, br#"{"message":"conflict"}"#.to_vec()));
                }
            }
            match method {
                "GET" => {
                    let objects = self.objects.lock().unwrap();
                    if let Some(v) = objects.get(path) {
                        return Ok((200, serde_json::to_vec(v).unwrap()));
                    }
                    if path == "/api/v1/services" {
                        let items: Vec<&Value> = objects
                            .iter()
                            .filter(|(k, _)| {
                                k.starts_with("/api/v1/namespaces/") && k.contains("/services/")
                            })
                            .map(|(_, v)| v)
                            .collect();
                        return Ok((200, serde_json::to_vec(&json!({"items": items})).unwrap()));
                    }
                    Ok(not_found)
                }
                "PUT" => {
                    let v: Value = serde_json::from_slice(body).unwrap();
                    let current = self.objects.lock().unwrap().get(path).cloned();
                    match current {
                        None => Ok(not_found),
                        Some(c)
                            if c["metadata"]["resourceVersion"]
                                != v["metadata"]["resourceVersion"] =>
                        {
                            Ok((
                                409,
                                br#"{"message":"the object has been modified"}"#.to_vec(),
                            ))
                        }
                        Some(_) => {
                            self.put(path, v);
                            Ok((200, Vec::new()))
                        }
                    }
                }
                "POST" => {
                    let v: Value = serde_json::from_slice(body).unwrap();
                    let p = format!("{path}/{}", v["metadata"]["name"].as_str().unwrap());
                    if self.objects.lock().unwrap().contains_key(&p) {
                        return Ok((409, br#"{"message":"already exists"}"#.to_vec()));
                    }
                    self.put(&p, v);
                    Ok((201, Vec::new()))
                }
                "DELETE" => {
                    self.objects.lock().unwrap().remove(path);
                    Ok((200, Vec::new()))
                }
                _ => Ok((405, Vec::new())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory::MemoryApi;
    use super::*;
    use crate::ipam::AllocatedAddress;

    const PATH: &str = "/api/v1/namespaces/kube-system/configmaps/ipam";

    fn alloc(ip: &str) -> Allocation {
        Allocation {
            uid: "u".into(),
            addresses: vec![AllocatedAddress {
                ip: ip.parse().unwrap(),
                pool: "p".into(),
            }],
            sharing_key: None,
            ports: vec![],
        }
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn store(api: &Arc<MemoryApi>) -> AllocationStore {
        AllocationStore::new(api.clone(), "kube-system", "ipam")
    }

    #[test]
    fn creates_then_updates_the_config_map() {
        let api = Arc::new(MemoryApi::default());
        let s = store(&api);
        let ctx = CallContext::background();
        assert!(s.load(&ctx).unwrap().allocations.is_empty());
        s.update(&ctx, |a| {
            a.insert(key("web"), alloc("10.0.0.1"));
            Ok(())
        })
        .unwrap();
        let cm = api.objects.lock().unwrap()[PATH].clone();
        assert_eq!(cm["metadata"]["labels"][MANAGED_BY.0], MANAGED_BY.1);
        assert_eq!(
            cm["data"]["ns.web"],
            r#"{"uid":"u","addresses":[{"ip":"10.0.0.1","pool":"p"}]}"#
        );
        s.update(&ctx, |a| {
            a.insert(key("api"), alloc("10.0.0.2"));
            Ok(())
        })
        .unwrap();
        let loaded = s.load(&ctx).unwrap().allocations;
        assert_eq!(loaded.len(), 2);
        assert_eq!(loaded[&key("api")], alloc("10.0.0.2"));
        // No change, no write.
        let writes = |api: &MemoryApi| {
            api.log
                .lock()
                .unwrap()
                .iter()
                .filter(|l| !l.starts_with("GET"))
                .count()
        };
        let before = writes(&api);
        s.update(&ctx, |_| Ok(())).unwrap();
        assert_eq!(writes(&api), before);
    }

    #[test]
    fn conflicts_are_retried_from_a_fresh_read() {
        let api = Arc::new(MemoryApi::default());
        let s = store(&api);
        let ctx = CallContext::background();
        s.update(&ctx, |a| {
            a.insert(key("one"), alloc("10.0.0.1"));
            Ok(())
        })
        .unwrap();
        // Someone else writes between our read and our write: our first PUT is stale.
        let mut first = true;
        s.update(&ctx, |a| {
            if first {
                first = false;
                let other = AllocationStore::new(api.clone(), "kube-system", "ipam");
                other
                    .update(&CallContext::background(), |b| {
                        b.insert(key("theirs"), alloc("10.0.0.9"));
                        Ok(())
                    })
                    .unwrap();
            }
            a.insert(key("mine"), alloc("10.0.0.2"));
            Ok(())
        })
        .unwrap();
        let loaded = s.load(&ctx).unwrap().allocations;
        assert!(loaded.contains_key(&key("theirs")) && loaded.contains_key(&key("mine")));
        // Endless conflicts end in a clear error.
        *api.conflicts.lock().unwrap() = 100;
        let e = s
            .update(&ctx, |a| {
                a.insert(key("x"), alloc("10.0.0.3"));
                Ok(())
            })
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("changed under every one of 8 attempts"),
            "{e}"
        );
    }

    #[test]
    fn unreadable_entries_stop_allocation_with_a_clear_error() {
        let api = Arc::new(MemoryApi::default());
        api.put(
            PATH,
            json!({"metadata": {"name": "ipam"}, "data": {"ns.web": "{not json"}}),
        );
        let e = store(&api).load(&CallContext::background()).unwrap_err();
        assert!(
            e.to_string()
                .contains("configmap kube-system/ipam entry \"ns.web\" does not parse"),
            "{e}"
        );
        api.put(
            PATH,
            json!({"metadata": {"name": "ipam"}, "data": {"web": "{}"}}),
        );
        let e = store(&api).load(&CallContext::background()).unwrap_err();
        assert!(
            e.to_string().contains("is not a <namespace>.<service> key"),
            "{e}"
        );
    }

    struct Forbidden;
    impl KubeApi for Forbidden {
        fn request(
            &self,
            _: &CallContext,
            _: &str,
            _: &str,
            _: &[u8],
        ) -> Result<(u16, Vec<u8>), ProviderError> {
            Ok((
                403,
                br#"{"kind":"Status","message":"configmaps \"ipam\" is forbidden"}"#.to_vec(),
            ))
        }
    }

    #[test]
    fn permission_errors_say_what_to_grant() {
        let s = AllocationStore::new(Arc::new(Forbidden), "kube-system", "ipam");
        let e = s.load(&CallContext::background()).unwrap_err().to_string();
        assert_eq!(
            e,
            "metal load balancer: cannot read configmap kube-system/ipam: HTTP 403: configmaps \"ipam\" is forbidden (the host's credentials need get, create and update on configmaps in namespace kube-system)"
        );
    }
}
