//! Kubernetes events as upstream controllers emit them: core/v1 Events with the upstream
//! reasons and source components, named `<object>.<hex nanos>`, in namespace `default` for
//! cluster-scoped objects, aggregated (a repeat of the same event within 10 minutes increments
//! `count` instead of creating a new object) and spam-limited per object (burst 25, then one
//! per 5 minutes, like client-go's EventSourceObjectSpamFilter).
//!
//! Publishing never blocks a controller: events go through a bounded queue to a writer task;
//! if the queue is full the event is dropped with a debug log, as client-go does.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Service};

use crate::runtime::cached_node::NodeRef;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Normal
    Normal,
    /// Warning
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// The object reference upstream uses for a Node event (apiVersion `v1`, kind `Node`, no namespace).
pub fn node_ref(node: &impl NodeRef) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.node_name().to_string()).filter(|n| !n.is_empty()),
        uid: node.node_uid().map(String::from),
        ..Default::default()
    }
}

/// The object reference for a Service event.
pub fn service_ref(svc: &Service) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        name: svc.metadata.name.clone(),
        namespace: svc.metadata.namespace.clone(),
        uid: svc.metadata.uid.clone(),
        resource_version: svc.metadata.resource_version.clone(),
        ..Default::default()
    }
}

struct Pending {
    object: ObjectReference,
    type_: EventType,
    reason: String,
    message: String,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct AggregateKey {
    object: (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    type_: EventType,
    reason: String,
    message: String,
}

struct Seen {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

/// Emits events for one source component (e.g. `cloud-node-controller`).
#[derive(Clone)]
pub struct EventRecorder {
    component: Arc<str>,
    tx: mpsc::Sender<Pending>,
}

const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
const SPAM_BURST: f64 = 25.0;
const SPAM_REFILL_EVERY: Duration = Duration::from_secs(300);

impl EventRecorder {
    /// A recorder for `component`, writing with `client`. `host` is reported as the source host.
    pub fn new(client: Client, component: &str, host: &str) -> Self {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(writer(client, component.to_string(), host.to_string(), rx));
        Self {
            component: component.into(),
            tx,
        }
    }

    /// The source component.
    pub fn component(&self) -> &str {
        &self.component
    }

    /// Record an event about `object`.
    pub fn publish(
        &self,
        object: ObjectReference,
        type_: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let pending = Pending {
            object,
            type_,
            reason: reason.to_string(),
            message: message.into(),
        };
        if self.tx.try_send(pending).is_err() {
            tracing::debug!(component = %self.component, reason, "event queue full or closed; event dropped");
        }
    }
}

async fn writer(client: Client, component: String, host: String, mut rx: mpsc::Receiver<Pending>) {
    // Owned by this single writer task: no lock needed.
    let mut seen: HashMap<AggregateKey, Seen> = HashMap::new();
    let mut buckets: HashMap<(Option<String>, Option<String>), (f64, Instant)> = HashMap::new();
    while let Some(ev) = rx.recv().await {
        let obj_key = (ev.object.namespace.clone(), ev.object.name.clone());
        let now = Instant::now();
        let (tokens, last) = buckets.entry(obj_key).or_insert((SPAM_BURST, now));
        let refill = now.duration_since(*last).as_secs_f64() / SPAM_REFILL_EVERY.as_secs_f64();
        *tokens = (*tokens + refill).min(SPAM_BURST);
        *last = now;
        if *tokens < 1.0 {
            tracing::debug!(reason = %ev.reason, "event rate-limited for this object");
            continue;
        }
        *tokens -= 1.0;
        if let Err(e) = write_event(&client, &component, &host, &mut seen, ev).await {
            tracing::warn!(component, "could not write event: {e}");
        }
    }
}

async fn write_event(
    client: &Client,
    component: &str,
    host: &str,
    seen: &mut HashMap<AggregateKey, Seen>,
    ev: Pending,
) -> Result<(), kube::Error> {
    let key = AggregateKey {
        object: (
            ev.object.namespace.clone(),
            ev.object.name.clone(),
            ev.object.uid.clone(),
            ev.object.kind.clone(),
        ),
        type_: ev.type_,
        reason: ev.reason.clone(),
        message: ev.message.clone(),
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    seen.retain(|_, s| s.at.elapsed() < AGGREGATE_WINDOW);
    let repeat = seen.get_mut(&key).map(|s| {
        s.count += 1;
        s.at = Instant::now();
        (s.namespace.clone(), s.name.clone(), s.count)
    });
    if let Some((namespace, name, count)) = repeat {
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        let patch = serde_json::json!({"count": count, "lastTimestamp": now});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            // The aggregated event was deleted (TTL): create a new one below.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let namespace = ev
        .object
        .namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let nanos = now.0.as_nanosecond();
    let name = format!("{}.{:x}", ev.object.name.clone().unwrap_or_default(), nanos);
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        involved_object: ev.object,
        reason: Some(ev.reason),
        message: Some(ev.message),
        type_: Some(ev.type_.as_str().to_string()),
        count: Some(1),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now.clone()),
        source: Some(EventSource {
            component: Some(component.to_string()),
            host: Some(host.to_string()),
        }),
        reporting_component: Some(component.to_string()),
        reporting_instance: Some(host.to_string()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    api.create(&PostParams::default(), &event).await?;
    seen.insert(
        key,
        Seen {
            namespace,
            name,
            count: 1,
            at: Instant::now(),
        },
    );
    Ok(())
}
