//! One watch per resource kind, shared by every controller (upstream's shared informer
//! factory), built on kube-runtime's `watcher` and reflector `Store`.
//!
//! kube-runtime's stable API gives a store and a stream of new objects; controllers here also
//! need the *previous* object of an update (upstream's `UpdateFunc(old, new)` predicates), so
//! this module fans each watcher event out as a [`Change`] carrying both. On a relist (watch
//! restart, 410 Gone) the store is replaced atomically and subscribers get the differences.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
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

/// A shared, cached watch of one resource kind.
pub struct SharedInformer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    changes: broadcast::Sender<Change<K>>,
    synced: watch::Receiver<bool>,
}

impl<K> Clone for SharedInformer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + Hash + Clone,
{
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            changes: self.changes.clone(),
            synced: self.synced.clone(),
        }
    }
}

/// A change held back while a relist is in progress: the key, the version the store held
/// before, and, for an object the cache does not keep, its new version.
type Pending<K> = (ObjectRef<K>, Option<Arc<K>>, Option<Arc<K>>);

/// Objects seen, and the changes held back, while a relist is in progress.
type Relist<K> = (HashSet<ObjectRef<K>>, Vec<Pending<K>>);

/// What the cache keeps of each object: the function trims the object in place and returns
/// whether it is cached at all (see `controllers::cache_trim`).
///
/// An object that is not kept is invisible to subscribers, with one exception: when a cached
/// object changes into one that is not kept, subscribers get `Change::Updated` with the new
/// version (which is then dropped from the cache), so they can act on the transition; its
/// later deletion sends nothing.
pub type Trim<K> = fn(&mut K) -> bool;

/// How many changes a slow subscriber may fall behind before it must resync from the store.
const CHANGE_BUFFER: usize = 16_384;

impl<K> SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    /// Start watching with `api`; the watch runs until `stop` is cancelled. `trim` is applied
    /// to every object before it is cached or sent as a change, and decides which objects are
    /// cached ([`Trim`]).
    pub fn start(
        api: Api<K>,
        config: watcher::Config,
        trim: Trim<K>,
        stop: CancellationToken,
    ) -> Self {
        let mut writer = reflector::store::Writer::<K>::default();
        let store = writer.as_reader();
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let tx = changes.clone();
        let (synced_tx, synced) = watch::channel(false);
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
                        tracing::warn!(kind = %K::kind(&()), "watch error: {e}");
                        continue;
                    }
                };
                let reader = writer.as_reader();
                match event {
                    // Changes carry the store's own `Arc`s (read back after applying), so the
                    // cache and the change buffer share one copy of each object.
                    Event::Apply(mut obj) => {
                        let keep = trim(&mut obj);
                        let key = ObjectRef::from_obj(&obj);
                        let old = reader.get(&key);
                        if !keep {
                            // Not cached: only leaving the cache is a change.
                            if let Some(old) = old {
                                let new = Arc::new(obj);
                                writer.apply_watcher_event(&Event::Delete((*new).clone()));
                                let _ = tx.send(Change::Updated { old, new });
                            }
                            continue;
                        }
                        writer.apply_watcher_event(&Event::Apply(obj));
                        let Some(new) = reader.get(&key) else {
                            continue;
                        };
                        let _ = tx.send(match old {
                            Some(old) => Change::Updated { old, new },
                            None => Change::Added(new),
                        });
                    }
                    Event::Delete(obj) => {
                        let Some(old) = reader.get(&ObjectRef::from_obj(&obj)) else {
                            // Never cached (or not kept).
                            continue;
                        };
                        writer.apply_watcher_event(&Event::Delete(obj));
                        let _ = tx.send(Change::Deleted(old));
                    }
                    Event::Init => {
                        relist = Some((HashSet::new(), Vec::new()));
                        writer.apply_watcher_event(&Event::Init);
                    }
                    Event::InitApply(mut obj) => {
                        // The store buffers relisted objects until InitDone; the change is
                        // built then, from the store's copy.
                        let keep = trim(&mut obj);
                        let key = ObjectRef::from_obj(&obj);
                        let old = reader.get(&key);
                        if let Some((seen, pending)) = relist.as_mut() {
                            seen.insert(key.clone());
                            match (keep, old) {
                                (true, old) => pending.push((key, old, None)),
                                (false, Some(old)) => {
                                    pending.push((key, Some(old), Some(Arc::new(obj.clone()))))
                                }
                                (false, None) => {}
                            }
                        }
                        if keep {
                            writer.apply_watcher_event(&Event::InitApply(obj));
                        }
                    }
                    Event::InitDone => {
                        let (seen, pending) = relist.take().unwrap_or_default();
                        let gone: Vec<_> = reader
                            .state()
                            .into_iter()
                            .filter(|o| !seen.contains(&ObjectRef::from_obj(o.as_ref())))
                            .collect();
                        writer.apply_watcher_event(&Event::InitDone);
                        for (key, old, uncached) in pending {
                            let Some(new) = uncached.or_else(|| reader.get(&key)) else {
                                continue;
                            };
                            let _ = tx.send(match old {
                                Some(old) => Change::Updated { old, new },
                                None => Change::Added(new),
                            });
                        }
                        for obj in gone {
                            let _ = tx.send(Change::Deleted(obj));
                        }
                        synced_tx.send_replace(true);
                    }
                }
            }
            tracing::debug!(kind = %K::kind(&()), "shared watch stopped");
        });
        Self {
            store,
            changes,
            synced,
        }
    }

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
    /// Any number of tasks may wait at once. (kube-runtime's `Store::wait_until_ready` polls a
    /// oneshot receiver that keeps only the last waker, so with several concurrent waiters some
    /// were never woken; a watch channel wakes them all.)
    pub async fn wait_synced(&self) -> bool {
        let mut synced = self.synced.clone();
        let ready = synced.wait_for(|ready| *ready).await.is_ok();
        ready
    }
}
