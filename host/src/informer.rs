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

/// Objects seen, and the keys (with their previous version) of the changes held back, while a
/// relist is in progress.
type Relist<K> = (HashSet<ObjectRef<K>>, Vec<(ObjectRef<K>, Option<Arc<K>>)>);

/// How many changes a slow subscriber may fall behind before it must resync from the store.
const CHANGE_BUFFER: usize = 16_384;

impl<K> SharedInformer<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    /// Start watching with `api`; the watch runs until `stop` is cancelled. `trim` is applied
    /// to every object before it is cached or sent as a change (see
    /// `controllers::cache_trim`).
    pub fn start(
        api: Api<K>,
        config: watcher::Config,
        trim: fn(&mut K),
        stop: CancellationToken,
    ) -> Self {
        let mut writer = reflector::store::Writer::<K>::default();
        let store = writer.as_reader();
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        let tx = changes.clone();
        let (synced_tx, synced) = watch::channel(false);
        tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config)
                .default_backoff()
                .modify(trim)
                .boxed();
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
                match &event {
                    // Changes carry the store's own `Arc`s (read back after applying), so the
                    // cache and the change buffer share one copy of each object.
                    Event::Apply(obj) => {
                        let key = ObjectRef::from_obj(obj);
                        let old = reader.get(&key);
                        writer.apply_watcher_event(&event);
                        let new = reader.get(&key).unwrap_or_else(|| Arc::new(obj.clone()));
                        let _ = tx.send(match old {
                            Some(old) => Change::Updated { old, new },
                            None => Change::Added(new),
                        });
                    }
                    Event::Delete(obj) => {
                        let old = reader.get(&ObjectRef::from_obj(obj));
                        writer.apply_watcher_event(&event);
                        let _ = tx.send(Change::Deleted(
                            old.unwrap_or_else(|| Arc::new(obj.clone())),
                        ));
                    }
                    Event::Init => {
                        relist = Some((HashSet::new(), Vec::new()));
                        writer.apply_watcher_event(&event);
                    }
                    Event::InitApply(obj) => {
                        // The store buffers relisted objects until InitDone; the change is
                        // built then, from the store's copy.
                        let key = ObjectRef::from_obj(obj);
                        if let Some((seen, pending)) = relist.as_mut() {
                            pending.push((key.clone(), reader.get(&key)));
                            seen.insert(key);
                        }
                        writer.apply_watcher_event(&event);
                    }
                    Event::InitDone => {
                        let (seen, pending) = relist.take().unwrap_or_default();
                        let gone: Vec<_> = reader
                            .state()
                            .into_iter()
                            .filter(|o| !seen.contains(&ObjectRef::from_obj(o.as_ref())))
                            .collect();
                        writer.apply_watcher_event(&event);
                        for (key, old) in pending {
                            let Some(new) = reader.get(&key) else {
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
