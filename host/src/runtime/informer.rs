//! One watch per resource kind, shared by every controller (upstream's shared informer
//! factory), built on kube-runtime's `watcher` and a cache of our own ([`Store`]).
//!
//! kube-runtime's stable API gives a store and a stream of new objects; controllers here also
//! need the *previous* object of an update (upstream's `UpdateFunc(old, new)` predicates), so
//! this module fans each watcher event out as a [`Change`] carrying both. On a relist (watch
//! restart, 410 Gone) the store is replaced atomically and subscribers get the differences.
//!
//! The store is ours rather than kube-runtime's reflector `Writer` because the writer takes
//! events by reference and clones every object into its map: with thousands of nodes that
//! doubled the allocations of every list and left the heap fragmented (see BENCHMARKS.md,
//! "Memory"). Here the decoded object is trimmed and moved into its `Arc`, which the cache and
//! the change sent to subscribers share. What is cached is a [`Cache`] type: the object itself
//! (services), or a compact form of it (nodes: [`crate::runtime::cached_node::CachedNode`]).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

/// A change seen by the shared watch.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// A new object.
    Added(Arc<K>),
    /// An object changed (or was re-listed): both versions.
    Updated {
        /// The version the store held before.
        old: Arc<K>,
        /// The new version.
        new: Arc<K>,
    },
    /// An object is gone (last known version).
    Deleted(Arc<K>),
}

/// What a shared informer caches for one watched kind: the object itself (services) or a
/// compact form of it ([`crate::runtime::cached_node::CachedNode`] for nodes).
pub trait Cache: Clone + Debug + Send + Sync + Sized + 'static {
    /// The watched API object.
    type Object: Resource<DynamicType = ()>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static;
    /// The cached form of a (trimmed) object.
    fn from_object(obj: Self::Object) -> Self;
    /// The object back (used only where a view must re-apply its parent's [`Trim`]).
    fn to_object(&self) -> Self::Object;
    /// The cache key ([`cache_key`] of the object).
    fn key(&self) -> String;
}

impl Cache for k8s_openapi::api::core::v1::Service {
    type Object = Self;
    fn from_object(obj: Self) -> Self {
        obj
    }
    fn to_object(&self) -> Self {
        self.clone()
    }
    fn key(&self) -> String {
        cache_key(self)
    }
}

/// Upstream's cache key (`MetaNamespaceKeyFunc`): `namespace/name`, or `name` for a
/// cluster-scoped object.
pub fn cache_key<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// The cache of one resource kind (upstream's indexer / lister), keyed by [`cache_key`].
/// Cloning gives another handle on the same cache.
pub struct Store<K> {
    map: Arc<RwLock<HashMap<String, Arc<K>>>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Self {
            map: self.map.clone(),
        }
    }
}

impl<K> Default for Store<K> {
    fn default() -> Self {
        Self {
            map: Arc::new(RwLock::new(HashMap::new())),
        }
    }
}

impl<K> Store<K> {
    // A panic while the lock is held cannot leave the map half-written (every write is one
    // insert, remove or swap), so a poisoned lock is still safe to use.
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Arc<K>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, Arc<K>>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached object with this key (`name`, or `namespace/name`).
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.read().get(key).cloned()
    }

    /// Every cached object, in no particular order.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.read().values().cloned().collect()
    }

    fn insert(&self, key: String, obj: Arc<K>) -> Option<Arc<K>> {
        self.write().insert(key, obj)
    }

    fn remove(&self, key: &str) -> Option<Arc<K>> {
        self.write().remove(key)
    }

    /// Replace the whole content; returns the previous one.
    fn replace(&self, map: HashMap<String, Arc<K>>) -> HashMap<String, Arc<K>> {
        std::mem::replace(&mut *self.write(), map)
    }
}

/// A shared, cached watch of one resource kind.
pub struct SharedInformer<K: Cache> {
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    synced: watch::Receiver<bool>,
    /// The watch's [`Trim`] (a view's is its parent's): a view uses it to tell an update
    /// leaving the cache from one whose object the parent has since deleted.
    trim: Trim<K>,
}

impl<K: Cache> Clone for SharedInformer<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
            synced: self.synced.clone(),
            trim: self.trim,
        }
    }
}

/// What the cache keeps of each object: the function trims the object in place and returns
/// whether it is cached at all (see `controllers::cache_trim`).
///
/// An object that is not kept is invisible to subscribers, with one exception: when a cached
/// object changes into one that is not kept, subscribers get `Change::Updated` with the new
/// version (which is then dropped from the cache), so they can act on the transition; its
/// later deletion sends nothing.
pub type Trim<K> = fn(&mut <K as Cache>::Object) -> bool;

/// How many changes a slow subscriber may fall behind before it must resync from the store.
///
/// Each slot holds the `Arc`s of its change until it is overwritten, so a large buffer keeps
/// superseded versions of busy objects alive; subscribers only move keys onto their queues, so
/// they fall behind only when the process is starved, and then resync from the store (every
/// subscriber handles `Lagged`).
const CHANGE_BUFFER: usize = 4_096;

/// A relist in progress (between `Init` and `InitDone`): the new content, built as the objects
/// arrive, and the changes to send once it replaces the store.
struct Relist<K> {
    /// The relisted objects the cache keeps.
    fresh: HashMap<String, Arc<K>>,
    /// Relisted objects the cache no longer keeps that it held before: sent as `Updated` and
    /// not as `Deleted`.
    leaving: HashSet<String>,
    /// `(old, new)` for every change to send, in list order.
    changes: Vec<(Option<Arc<K>>, Arc<K>)>,
}

impl<K> Relist<K> {
    fn new() -> Self {
        Self {
            fresh: HashMap::new(),
            leaving: HashSet::new(),
            changes: Vec::new(),
        }
    }
}

impl<K: Cache> SharedInformer<K> {
    /// Start watching with `api`; the watch runs until `stop` is cancelled. `trim` is applied
    /// to every object before it is cached or sent as a change, and decides which objects are
    /// cached ([`Trim`]).
    pub fn start(
        api: Api<K::Object>,
        config: watcher::Config,
        trim: Trim<K>,
        stop: CancellationToken,
    ) -> Self {
        let store = Store::default();
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let (synced_tx, synced) = watch::channel(false);
        let cache = store.clone();
        let tx = changes.clone();
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut relist: Option<Relist<K>> = None;
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => break,
                    ev = stream.next() => ev,
                };
                let Some(event) = event else { break };
                let event = match event {
                    Ok(ev) => ev,
                    Err(e) => {
                        // The backoff wrapper retries; log and continue.
                        tracing::warn!(kind = %K::Object::kind(&()), "watch error: {e}");
                        continue;
                    }
                };
                match event {
                    Event::Apply(mut obj) => {
                        let keep = trim(&mut obj);
                        let key = cache_key(&obj);
                        let new = Arc::new(K::from_object(obj));
                        let change = if keep {
                            match cache.insert(key, new.clone()) {
                                Some(old) => Change::Updated { old, new },
                                None => Change::Added(new),
                            }
                        } else {
                            // Not cached: only leaving the cache is a change.
                            match cache.remove(&key) {
                                Some(old) => Change::Updated { old, new },
                                None => continue,
                            }
                        };
                        let _ = tx.send(change);
                    }
                    Event::Delete(obj) => {
                        // Nothing to send for an object never cached (or not kept).
                        if let Some(old) = cache.remove(&cache_key(&obj)) {
                            let _ = tx.send(Change::Deleted(old));
                        }
                    }
                    Event::Init => relist = Some(Relist::new()),
                    Event::InitApply(mut obj) => {
                        let relist = relist.get_or_insert_with(Relist::new);
                        let keep = trim(&mut obj);
                        let key = cache_key(&obj);
                        let old = cache.get(&key);
                        let new = Arc::new(K::from_object(obj));
                        if keep {
                            relist.changes.push((old, new.clone()));
                            relist.fresh.insert(key, new);
                        } else if old.is_some() {
                            relist.changes.push((old, new));
                            relist.leaving.insert(key);
                        }
                    }
                    Event::InitDone => {
                        let Relist {
                            fresh,
                            leaving,
                            changes,
                        } = relist.take().unwrap_or_else(Relist::new);
                        let before = cache.replace(fresh);
                        for (old, new) in changes {
                            let _ = tx.send(match old {
                                Some(old) => Change::Updated { old, new },
                                None => Change::Added(new),
                            });
                        }
                        let store_now = cache.read();
                        let gone: Vec<Arc<K>> = before
                            .into_iter()
                            .filter(|(key, _)| {
                                !store_now.contains_key(key) && !leaving.contains(key)
                            })
                            .map(|(_, obj)| obj)
                            .collect();
                        drop(store_now);
                        for obj in gone {
                            let _ = tx.send(Change::Deleted(obj));
                        }
                        synced_tx.send_replace(true);
                    }
                }
            }
            tracing::debug!(kind = %K::Object::kind(&()), "shared watch stopped");
        });
        Self {
            store,
            changes,
            synced,
            trim,
        }
    }
}

/// What a [`SharedInformer::view`] keeps of its parent's objects.
pub type Keep<K> = Arc<dyn Fn(&K) -> bool + Send + Sync>;

impl<K: Cache> SharedInformer<K> {
    /// A view of this informer holding only the objects `keep` accepts, with the same API: its
    /// own cache and changes, fed from this informer's (no second watch; the objects are
    /// shared). An object that stops being kept is `Deleted` from the view, one that starts
    /// being kept is `Added`; one that leaves the parent's cache leaves the view the same way
    /// (an `Updated` to the uncached version, see [`Trim`]). Hybrid clusters give each provider's controllers the view of the
    /// nodes it owns (crate::runtime::ownership).
    pub fn view(&self, keep: Keep<K>, stop: CancellationToken) -> SharedInformer<K> {
        self.view_after(keep, std::future::ready(()), stop)
    }

    /// [`Self::view`], synced only once `ready` has also completed (after this informer
    /// synced): the view is filled, and its waiters woken, from the cache as it is then. Hybrid
    /// clusters open the providers' node views after the first ownership round
    /// (controllers::node_ownership::FirstRound), so no provider starts with its unclaimed
    /// nodes missing.
    pub fn view_after(
        &self,
        keep: Keep<K>,
        ready: impl std::future::Future<Output = ()> + Send + 'static,
        stop: CancellationToken,
    ) -> SharedInformer<K> {
        let store = Store::default();
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let (synced_tx, synced) = watch::channel(false);
        let parent = self.clone();
        let (cache, tx) = (store.clone(), changes.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => return,
                ok = parent.wait_synced() => if !ok { return },
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                () = ready => {}
            }
            // Subscribed before the first list is read, so nothing falls between the two.
            let mut rx = parent.subscribe();
            resync(&parent, &cache, &tx, &keep);
            synced_tx.send_replace(true);
            loop {
                let change = tokio::select! {
                    _ = stop.cancelled() => break,
                    c = rx.recv() => c,
                };
                match change {
                    Ok(Change::Added(new) | Change::Updated { new, .. }) => {
                        let key = new.key();
                        let new = match parent.store().get(&key) {
                            // The parent's current version, not the change's: a change sent
                            // between the subscription and the first fill is older than
                            // what the fill took, and must not roll the view back.
                            Some(current) => current,
                            // An update to a version the parent does not cache (its trim's
                            // "leaving" update): the view passes the same on and drops it
                            // too.
                            None if !(parent.trim)(&mut new.to_object()) => {
                                if let Some(old) = cache.remove(&key) {
                                    let _ = tx.send(Change::Updated { old, new });
                                }
                                continue;
                            }
                            // Cached by the parent, but deleted there since: its `Deleted`
                            // follows. Taken as it is, so that the deletion removes it from
                            // the view and is passed on (as a leaving update it would
                            // have been swallowed).
                            None => new,
                        };
                        let change = if keep(&new) {
                            match cache.insert(key, new.clone()) {
                                Some(old) if Arc::ptr_eq(&old, &new) => continue,
                                Some(old) => Change::Updated { old, new },
                                None => Change::Added(new),
                            }
                        } else {
                            match cache.remove(&key) {
                                Some(old) => Change::Deleted(old),
                                None => continue,
                            }
                        };
                        let _ = tx.send(change);
                    }
                    Ok(Change::Deleted(old)) => {
                        if let Some(old) = cache.remove(&old.key()) {
                            let _ = tx.send(Change::Deleted(old));
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        resync(&parent, &cache, &tx, &keep)
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
        SharedInformer {
            store,
            changes,
            synced,
            trim: self.trim,
        }
    }
}

/// Bring a view's cache to what `keep` accepts of `parent`'s, sending the differences.
fn resync<K: Cache>(
    parent: &SharedInformer<K>,
    cache: &Store<K>,
    tx: &broadcast::Sender<Change<K>>,
    keep: &Keep<K>,
) {
    let fresh: HashMap<String, Arc<K>> = parent
        .list()
        .into_iter()
        .filter(|o| keep(o))
        .map(|o| (o.key(), o))
        .collect();
    let sends: Vec<Change<K>> = {
        let before = cache.read();
        let mut sends: Vec<Change<K>> = fresh
            .iter()
            .filter_map(|(key, new)| match before.get(key) {
                Some(old) if Arc::ptr_eq(old, new) => None,
                Some(old) => Some(Change::Updated {
                    old: old.clone(),
                    new: new.clone(),
                }),
                None => Some(Change::Added(new.clone())),
            })
            .collect();
        sends.extend(
            before
                .iter()
                .filter(|(key, _)| !fresh.contains_key(*key))
                .map(|(_, old)| Change::Deleted(old.clone())),
        );
        sends
    };
    cache.replace(fresh);
    for change in sends {
        let _ = tx.send(change);
    }
}

impl<K: Cache> SharedInformer<K> {
    /// The cache (upstream's lister).
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// Every cached object.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.store.state()
    }

    /// Subscribe to changes from now on. A receiver that lags gets `RecvError::Lagged` and
    /// must resync from [`Self::list`].
    pub fn subscribe(&self) -> broadcast::Receiver<Change<K>> {
        self.changes.subscribe()
    }

    /// Wait until the first list has completed (upstream `WaitForCacheSync`). Returns false if
    /// the watch ended first.
    ///
    /// Any number of tasks may wait at once (a watch channel wakes every waiter).
    pub async fn wait_synced(&self) -> bool {
        let mut synced = self.synced.clone();
        let ready = synced.wait_for(|ready| *ready).await.is_ok();
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::cached_node::CachedNode;
    use k8s_openapi::api::core::v1::{Node, Service, ServiceSpec};
    use std::time::Duration;

    /// A parent informer fed by hand: its store and changes are what the test says, in the
    /// order a real watch can produce them.
    fn parent<K: Cache>(trim: Trim<K>) -> (SharedInformer<K>, watch::Sender<bool>) {
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let (synced_tx, synced) = watch::channel(false);
        let informer = SharedInformer {
            store: Store::default(),
            changes,
            synced,
            trim,
        };
        (informer, synced_tx)
    }

    fn node(name: &str, version: &str) -> Arc<CachedNode> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some(version.into());
        Arc::new(n.into())
    }

    async fn next<K: Clone>(rx: &mut broadcast::Receiver<Change<K>>) -> Change<K> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("a change within 10 s")
            .expect("the channel is open")
    }

    fn version<K: Cache>(obj: &K) -> String {
        let obj = obj.to_object();
        obj.meta().resource_version.clone().unwrap_or_default()
    }

    /// The view reads an update after the parent has already deleted the object (the parent's
    /// task is ahead of the view's): the deletion that follows still reaches the view's
    /// subscribers. (Taken as a trim's "leaving" update, it was swallowed, and a provider's
    /// load balancer kept a deleted node as a host: found by tests/hybrid.rs.)
    #[tokio::test]
    async fn a_view_passes_on_a_deletion_the_parent_made_before_the_view_read_its_update() {
        let (parent, synced) = parent::<CachedNode>(|_| true);
        let v1 = node("n", "1");
        parent.store.insert("n".into(), v1.clone());
        synced.send_replace(true);
        let view = parent.view(Arc::new(|_: &CachedNode| true), CancellationToken::new());
        let mut rx = view.subscribe();
        assert!(view.wait_synced().await);
        assert!(matches!(next(&mut rx).await, Change::Added(n) if version(&*n) == "1"));
        // The parent updates and deletes n before the view task looks at either change.
        let v2 = node("n", "2");
        parent.store.remove("n");
        let _ = parent.changes.send(Change::Updated {
            old: v1,
            new: v2.clone(),
        });
        let _ = parent.changes.send(Change::Deleted(v2));
        assert!(
            matches!(next(&mut rx).await, Change::Updated { new, .. } if version(&*new) == "2")
        );
        assert!(matches!(next(&mut rx).await, Change::Deleted(n) if version(&*n) == "2"));
        assert!(view.list().is_empty());
    }

    /// A trim's "leaving" update (the object changed into one the parent does not cache) is
    /// passed on as such and drops the object from the view; no deletion follows.
    #[tokio::test]
    async fn a_view_passes_on_a_leaving_update_and_drops_the_object() {
        fn lb_only(s: &mut Service) -> bool {
            s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        }
        let svc = |version: &str, type_: &str| {
            let mut s = Service::default();
            s.metadata.name = Some("s".into());
            s.metadata.namespace = Some("ns".into());
            s.metadata.resource_version = Some(version.into());
            s.spec = Some(ServiceSpec {
                type_: Some(type_.into()),
                ..Default::default()
            });
            Arc::new(s)
        };
        let (parent, synced) = parent::<Service>(lb_only);
        let v1 = svc("1", "LoadBalancer");
        parent.store.insert("ns/s".into(), v1.clone());
        synced.send_replace(true);
        let view = parent.view(Arc::new(|_: &Service| true), CancellationToken::new());
        let mut rx = view.subscribe();
        assert!(view.wait_synced().await);
        assert!(matches!(next(&mut rx).await, Change::Added(_)));
        let v2 = svc("2", "ClusterIP");
        parent.store.remove("ns/s");
        let _ = parent.changes.send(Change::Updated { old: v1, new: v2 });
        assert!(
            matches!(next(&mut rx).await, Change::Updated { new, .. } if version(&*new) == "2")
        );
        assert!(view.list().is_empty());
    }
}
