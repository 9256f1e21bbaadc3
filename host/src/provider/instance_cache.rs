//! The per-provider cache of instance answers: what the cloud said about a node's instance
//! (exists, shut down, metadata) and when, read by every controller with a max-age of its own
//! ([`CacheUse`]).
//!
//! What is kept, and for how long, is chosen by the caller that learned the answer
//! ([`CacheUse::keep_for`]). The controllers keep only what another caller will read
//! (docs/writing-a-provider.md#bulk-instance-lookups-implement-bulkinstances):
//! - node initialisation keeps the metadata it learned for one `--node-status-update-frequency`,
//!   so the address loop's next pass does not ask again for a node just initialised;
//! - the address loop and the lifecycle checks read the cache but keep nothing: each pass wants
//!   answers younger than its period, and passes are at least a period apart, so their own
//!   answers would never be read again (and not keeping them keeps the host's memory flat).
//!
//! Errors are never kept, nor is "no metadata" (upstream's `(nil, nil)`: the provider cannot
//! describe the instance yet), nor "does not exist" (it removes what was kept about the
//! instance): whoever needs a negative answer asks the cloud, so a deletion or a retried
//! initialisation never rests on one from the cache.
//!
//! An entry belongs to one Node object (its UID) and the provider ID it was asked about; an
//! answer learned before the node had a provider ID also serves the node once it carries the
//! provider ID of that answer's metadata (initialisation sets it).
//!
//! A `--cloud-config` reload empties the cache ([`InstanceCache::clear`], called by
//! `Provider::reload` once the new configuration is in force): what the cloud said under the old
//! credentials, account or region is not served after it. Each clear starts a new
//! *generation*; an answer whose call started in an older one (a lookup in flight during the
//! reload) is not kept either.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::runtime::cached_node::NodeRef;
use ccm_provider_abi::InstanceMetadata;
use tokio::time::Instant;

use super::InstanceQuery;

/// How a caller uses the cache of instance answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheUse {
    /// Accept answers younger than this (zero: always ask the cloud).
    pub max_age: Duration,
    /// Keep the answers this call learns for this long (zero: keep nothing).
    pub keep_for: Duration,
}

impl CacheUse {
    /// Always ask, keep nothing.
    pub const NONE: Self = Self {
        max_age: Duration::ZERO,
        keep_for: Duration::ZERO,
    };

    /// Accept answers younger than `max_age`; keep nothing.
    pub const fn read(max_age: Duration) -> Self {
        Self {
            max_age,
            keep_for: Duration::ZERO,
        }
    }
}

/// What the cloud said about one node's instance: the parts that were asked, each `None` when
/// not asked (or not applicable: no shutdown or metadata for an instance that does not exist).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceAnswer {
    /// Whether the instance exists; `Some(false)` is the explicit "does not exist".
    pub exists: Option<bool>,
    /// Whether it is shut down.
    pub shutdown: Option<bool>,
    /// Its metadata; `Some(None)` is upstream's `(nil, nil)`.
    pub metadata: Option<Option<InstanceMetadata>>,
}

impl InstanceAnswer {
    /// Whether every part of `query` is answered.
    pub fn answers(&self, query: InstanceQuery) -> bool {
        (!query.contains(InstanceQuery::EXISTS) || self.exists.is_some())
            && (!query.contains(InstanceQuery::SHUTDOWN)
                || self.shutdown.is_some()
                || self.exists == Some(false))
            && (!query.contains(InstanceQuery::METADATA)
                || self.metadata.is_some()
                || self.exists == Some(false))
    }
}

#[derive(Debug, Clone)]
struct Stamped<T> {
    value: T,
    at: Instant,
}

impl<T: Clone> Stamped<T> {
    fn fresh(part: &Option<Self>, now: Instant, max_age: Duration) -> Option<T> {
        part.as_ref()
            .filter(|p| now.saturating_duration_since(p.at) < max_age)
            .map(|p| p.value.clone())
    }
}

#[derive(Debug)]
struct Entry {
    uid: Option<String>,
    /// `spec.providerID` of the node when it was asked about (`""`: none).
    provider_id: String,
    exists: Option<Stamped<bool>>,
    shutdown: Option<Stamped<bool>>,
    metadata: Option<Stamped<InstanceMetadata>>,
    expires: Instant,
}

impl Entry {
    /// Whether the entry is about `node` as it is now.
    fn is_about(&self, node: &impl NodeRef) -> bool {
        if self.uid.as_deref() != node.node_uid() {
            return false;
        }
        let pid = provider_id(node);
        pid == self.provider_id
            || (self.provider_id.is_empty()
                && !pid.is_empty()
                && self
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.value.provider_id == pid))
    }
}

fn provider_id(node: &impl NodeRef) -> &str {
    node.node_provider_id()
}

/// Sweep expired entries every this many insertions.
const SWEEP_EVERY: u32 = 256;

/// The cache (one per provider; see the module documentation).
#[derive(Debug, Default)]
pub(crate) struct InstanceCache {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// By node name.
    entries: HashMap<String, Entry>,
    puts: u32,
    /// Bumped by every [`InstanceCache::clear`].
    generation: u64,
}

impl InstanceCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to `query` about `node` when every part of it is younger than `max_age`.
    pub(crate) fn get(
        &self,
        node: &impl NodeRef,
        query: InstanceQuery,
        max_age: Duration,
    ) -> Option<InstanceAnswer> {
        if max_age.is_zero() {
            return None;
        }
        let name = Some(node.node_name()).filter(|n| !n.is_empty())?;
        let now = Instant::now();
        let state = self.lock();
        let entry = state
            .entries
            .get(name)
            .filter(|e| e.expires > now && e.is_about(node))?;
        let answer = InstanceAnswer {
            exists: Stamped::fresh(&entry.exists, now, max_age),
            shutdown: Stamped::fresh(&entry.shutdown, now, max_age),
            metadata: Stamped::fresh(&entry.metadata, now, max_age).map(Some),
        };
        answer.answers(query).then_some(answer)
    }

    /// The generation now: read it before asking the cloud, hand it to [`InstanceCache::put`]
    /// with the answer.
    pub(crate) fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Forget every answer and start a new generation (a `--cloud-config` reload).
    pub(crate) fn clear(&self) {
        let mut state = self.lock();
        state.entries = HashMap::new();
        state.generation = state.generation.wrapping_add(1);
    }

    /// Keep what `answer` says about `node` for `keep_for` (nothing when zero, nor when the
    /// call that learned it started in another `generation` than the current one).
    pub(crate) fn put(
        &self,
        node: &impl NodeRef,
        answer: &InstanceAnswer,
        keep_for: Duration,
        generation: u64,
    ) {
        let name = node.node_name();
        if name.is_empty() {
            return;
        }
        if keep_for.is_zero() {
            return;
        }
        let metadata = answer.metadata.clone().flatten();
        let mut state = self.lock();
        if state.generation != generation {
            // Learned under a configuration that is no longer in force.
            return;
        }
        if answer.exists == Some(false) {
            // Never kept (a caller that needs "does not exist" asks the cloud), and whatever
            // was kept about the instance is no longer true.
            if state.entries.get(name).is_some_and(|e| e.is_about(node)) {
                state.entries.remove(name);
            }
            return;
        }
        if answer.exists.is_none() && answer.shutdown.is_none() && metadata.is_none() {
            return;
        }
        let now = Instant::now();
        let stamp = |value| Stamped { value, at: now };
        state.puts = state.puts.wrapping_add(1);
        if state.puts.is_multiple_of(SWEEP_EVERY) {
            state.entries.retain(|_, e| e.expires > now);
        }
        let fresh = || Entry {
            uid: node.node_uid().map(String::from),
            provider_id: provider_id(node).to_string(),
            exists: None,
            shutdown: None,
            metadata: None,
            expires: now,
        };
        let entry = state.entries.entry(name.to_string()).or_insert_with(fresh);
        if entry.expires <= now || !entry.is_about(node) {
            *entry = fresh();
        }
        if let Some(exists) = answer.exists {
            entry.exists = Some(stamp(exists));
        }
        if let Some(shutdown) = answer.shutdown {
            entry.shutdown = Some(stamp(shutdown));
        }
        if let Some(md) = metadata {
            entry.metadata = Some(Stamped { value: md, at: now });
        }
        entry.expires = entry.expires.max(now + keep_for);
    }

    /// Entries held (expired ones included until the next sweep).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;

    fn node(name: &str, uid: &str, pid: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": uid},
            "spec": {"providerID": pid},
        }))
        .unwrap()
    }

    fn md(pid: &str) -> InstanceMetadata {
        InstanceMetadata {
            provider_id: pid.into(),
            instance_type: "t1".into(),
            ..Default::default()
        }
    }

    const MIN: Duration = Duration::from_secs(60);
    const MD: InstanceQuery = InstanceQuery::METADATA;

    #[tokio::test(start_paused = true)]
    async fn answers_are_served_while_younger_than_the_readers_max_age() {
        let c = InstanceCache::default();
        let n = node("a", "u1", "fake://a");
        let answer = InstanceAnswer {
            metadata: Some(Some(md("fake://a"))),
            ..Default::default()
        };
        c.put(&n, &answer, 5 * MIN, 0);
        assert_eq!(c.get(&n, MD, MIN), Some(answer.clone()));
        assert_eq!(c.get(&n, MD, Duration::ZERO), None, "max-age 0: always ask");
        assert_eq!(c.get(&n, InstanceQuery::EXISTS, MIN), None, "not asked");
        tokio::time::advance(MIN).await;
        assert_eq!(c.get(&n, MD, MIN), None, "a minute old: too old for 1m");
        assert_eq!(c.get(&n, MD, 2 * MIN), Some(answer));
        tokio::time::advance(4 * MIN).await;
        assert_eq!(c.get(&n, MD, 10 * MIN), None, "expired after keep_for");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_kept_without_keep_for_nor_nil_metadata() {
        let c = InstanceCache::default();
        let n = node("a", "u1", "fake://a");
        let answer = InstanceAnswer {
            metadata: Some(Some(md("fake://a"))),
            ..Default::default()
        };
        c.put(&n, &answer, Duration::ZERO, 0);
        assert_eq!(c.len(), 0);
        c.put(
            &n,
            &InstanceAnswer {
                metadata: Some(None),
                ..Default::default()
            },
            MIN,
            0,
        );
        assert_eq!(c.len(), 0, "(nil, nil) is not an answer to keep");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_belongs_to_one_node_object_and_provider_id() {
        let c = InstanceCache::default();
        // Learned while initialising: no provider ID yet.
        let tainted = node("a", "u1", "");
        let answer = InstanceAnswer {
            exists: Some(true),
            metadata: Some(Some(md("fake://a"))),
            ..Default::default()
        };
        c.put(&tainted, &answer, MIN, 0);
        assert!(c.get(&tainted, MD, MIN).is_some());
        // Initialised with the answer's provider ID: still about it.
        assert_eq!(c.get(&node("a", "u1", "fake://a"), MD, MIN), Some(answer));
        // Another provider ID, or the node created again: not about it.
        assert_eq!(c.get(&node("a", "u1", "fake://other"), MD, MIN), None);
        assert_eq!(c.get(&node("a", "u2", "fake://a"), MD, MIN), None);
        // An answer about the new object replaces the old one.
        let again = node("a", "u2", "");
        let shut = InstanceAnswer {
            exists: Some(true),
            shutdown: Some(true),
            ..Default::default()
        };
        c.put(&again, &shut, MIN, 0);
        assert_eq!(c.get(&tainted, InstanceQuery::EXISTS, MIN), None);
        assert_eq!(c.get(&again, InstanceQuery::SHUTDOWN, MIN), Some(shut));
    }

    #[tokio::test(start_paused = true)]
    async fn does_not_exist_is_never_kept_and_forgets_the_instance() {
        let c = InstanceCache::default();
        let n = node("a", "u1", "fake://a");
        let gone = InstanceAnswer {
            exists: Some(false),
            ..Default::default()
        };
        assert!(
            gone.answers(MD.with(InstanceQuery::SHUTDOWN)),
            "does not exist answers metadata and shutdown too"
        );
        c.put(&n, &gone, MIN, 0);
        assert_eq!(c.len(), 0);
        c.put(
            &n,
            &InstanceAnswer {
                exists: Some(true),
                metadata: Some(Some(md("fake://a"))),
                ..Default::default()
            },
            MIN,
            0,
        );
        assert!(c.get(&n, MD, MIN).is_some());
        c.put(&n, &gone, MIN, 0);
        assert_eq!(c.get(&n, MD, MIN), None, "forgotten");
        assert_eq!(c.get(&n, InstanceQuery::EXISTS, MIN), None);
    }

    #[tokio::test(start_paused = true)]
    async fn parts_merge_and_each_has_its_own_age() {
        let c = InstanceCache::default();
        let n = node("a", "u1", "fake://a");
        c.put(
            &n,
            &InstanceAnswer {
                exists: Some(true),
                metadata: Some(Some(md("fake://a"))),
                ..Default::default()
            },
            MIN,
            0,
        );
        tokio::time::advance(Duration::from_secs(10)).await;
        c.put(
            &n,
            &InstanceAnswer {
                exists: Some(true),
                shutdown: Some(true),
                ..Default::default()
            },
            MIN,
            0,
        );
        let both = InstanceQuery::EXISTS.with(InstanceQuery::SHUTDOWN);
        let five = Duration::from_secs(5);
        assert_eq!(c.get(&n, both, five).unwrap().shutdown, Some(true));
        assert_eq!(c.get(&n, MD, five), None, "metadata is 10 s old");
        assert!(c.get(&n, MD, MIN).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn expired_entries_are_swept() {
        let c = InstanceCache::default();
        let answer = InstanceAnswer {
            exists: Some(true),
            ..Default::default()
        };
        for i in 0..SWEEP_EVERY - 1 {
            c.put(&node(&format!("n{i}"), "u", ""), &answer, MIN, 0);
        }
        tokio::time::advance(2 * MIN).await;
        c.put(&node("last", "u", ""), &answer, MIN, 0);
        assert_eq!(c.len(), 1, "only the fresh entry is left");
    }

    #[tokio::test(start_paused = true)]
    async fn a_clear_forgets_every_answer_and_refuses_answers_of_calls_started_before_it() {
        let c = InstanceCache::default();
        let n = node("a", "u1", "fake://a");
        let answer = InstanceAnswer {
            metadata: Some(Some(md("fake://a"))),
            ..Default::default()
        };
        let before = c.generation();
        c.put(&n, &answer, MIN, before);
        assert!(c.get(&n, MD, MIN).is_some());
        c.clear();
        assert_eq!(c.get(&n, MD, MIN), None, "cleared");
        // A call that started before the clear answers after it: not kept.
        c.put(&n, &answer, MIN, before);
        assert_eq!(c.len(), 0);
        // A call of the new generation: kept.
        c.put(&n, &answer, MIN, c.generation());
        assert!(c.get(&n, MD, MIN).is_some());
    }
}
