//! An in-memory Kubernetes API server that speaks the real HTTP protocol, so `kube::Client`,
//! kube-runtime watchers, kube-lease-manager and `kubectl` talk to it unchanged.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use kube_apiserver_inmem::ApiServer;
//! let server = ApiServer::start().await?;
//! let client = server.client(); // a real kube::Client over HTTP, built from a kubeconfig
//! server.controls().fail_next(1, "patch", "nodes", 500);
//! # drop(client); server.shutdown().await; Ok(()) }
//! ```
//!
//! # Served
//! core/v1 `namespaces` (`default`, `kube-system`, `kube-public`, `kube-node-lease` exist at
//! start), `nodes` and `services` (with `status`), `events`, `configmaps`, `secrets`, `pods`
//! (with `status`) and `endpoints`; coordination.k8s.io/v1 `leases`; events.k8s.io/v1 `events`;
//! discovery.k8s.io/v1 `endpointslices` (what `kubectl describe node`/`describe service` read:
//! nothing creates pods or endpoints here, so they list empty); discovery (`/api`, `/apis`,
//! group versions), `/version`, `/healthz`, `/readyz`, `/livez`. Answers are JSON: a client that
//! accepts only protobuf gets 406. Request bodies are JSON or YAML, and protobuf for the kinds
//! kubectl's typed `create` commands send that way (v1 Service, Namespace, ConfigMap, Secret;
//! `protobuf.rs`). Server-side printing for `kubectl get`: a get or list asked
//! for with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io` answers a Table with
//! upstream's columns for nodes, services, events, namespaces, leases and pods (`Name`/`Created At`
//! for the rest), so `kubectl get nodes -o wide` looks as against a real cluster.
//!
//! # Semantics (as upstream)
//! - Verbs get, list, watch, create, update, patch, delete, deletecollection; namespaced and
//!   cluster-scoped paths; unknown resources and namespaced objects in a missing namespace are 404.
//! - `generateName`; uid, creationTimestamp; `generation` starts at 1 and grows when anything but
//!   metadata/status changes. One global resourceVersion counter; stale PUTs and patches carrying a
//!   stale `metadata.resourceVersion` get 409 Conflict. Updates that change nothing are not written
//!   (no new resourceVersion, no event), as upstream.
//! - Objects are decoded into their k8s-openapi types and re-encoded on every write: wrongly typed
//!   fields are 400, unknown fields are dropped (upstream's default `fieldValidation=Warn`).
//! - Validation: DNS-1123 subdomain names (namespaces: DNS-1123 label; services: DNS-1035 label),
//!   label keys/values, `metadata.name` must match the URL, `spec.providerID` of a node cannot
//!   change once set, service `spec.clusterIP` cannot change, no new finalizers on a deleting object.
//! - Defaulting: services get a cluster IP (10.96.0.0/12), ipFamilies, protocol/targetPort,
//!   node ports for NodePort/LoadBalancer and an empty status on create; namespaces get
//!   phase Active; secrets type Opaque.
//! - Status subresources (nodes, services, namespaces): writes to `/status` change only status
//!   and metadata (upstream's status strategies reset only `spec`); writes to the main resource keep
//!   the live status.
//! - Deletion: an object with finalizers gets `deletionTimestamp` + `deletionGracePeriodSeconds: 0`
//!   (MODIFIED); removing its last finalizer deletes it (DELETED). Preconditions (uid,
//!   resourceVersion) are checked. deletecollection honours label/field selectors.
//! - Lists: `labelSelector` (=, ==, !=, in, notin, exists, !exists), `fieldSelector`
//!   (metadata.name, metadata.namespace and the per-kind fields upstream supports; others are
//!   400), `limit`/`continue` with `remainingItemCount`; every page reports the resourceVersion of
//!   the first page.
//! - Watches: newline-delimited `{"type","object"}` events over chunked HTTP; resume from a
//!   resourceVersion inside the bounded history (default 10,000 events), otherwise an `ERROR`
//!   event with a 410 Expired Status; `resourceVersion` ""/"0" sends the current state first;
//!   `sendInitialEvents` ends the initial state with a BOOKMARK annotated
//!   `k8s.io/initial-events-end`; `allowWatchBookmarks` (every 5 s); `timeoutSeconds`; objects
//!   moving in/out of a watch's selector arrive as ADDED/DELETED.
//! - Patches: JSON merge, JSON patch, strategic merge (see [`patch`] for the supported list
//!   strategies and directives; unsupported ones are 422) and server-side apply.
//! - Errors are `metav1.Status` with upstream reasons; 429 carries `Retry-After`.
//!
//! # HTTPS
//! [`ApiServerOptions::tls`] with a [`ServingIdentity`] serves HTTPS with a CA made at start;
//! [`ApiServer::kubeconfig`] then carries the CA, and [`ApiServer::write_in_cluster_files`]
//! writes what a pod's in-cluster configuration reads. The `kube-apiserver-inmem` binary serves
//! this server on its own (e.g. for a CCM in a container: deploy/image-test.sh).
//!
//! # Reviews for delegated authentication and authorization
//! `POST /apis/authentication.k8s.io/v1/tokenreviews` and
//! `POST /apis/authorization.k8s.io/v1/subjectaccessreviews` answer from a small policy set
//! through [`Controls`]: tokens registered with [`Controls::add_token`] authenticate as their
//! user (groups plus `system:authenticated`), others are `authenticated: false`; a review is
//! allowed when a rule of [`Controls::allow_non_resource`] matches the user or one of its groups,
//! the verb and the non-resource path, or when the groups include `system:masters`. Reviews are
//! answered (201), not stored; they are logged and take injected faults as `create` on
//! `tokenreviews.authentication.k8s.io` / `subjectaccessreviews.authorization.k8s.io`. They
//! are not listed in discovery.
//!
//! # Server-side apply (simplified)
//! Apply merges the applied object onto the live one (creating it if absent) with the strategic
//! merge rules, requires `fieldManager` and accepts `force`. Ownership is tracked per leaf field
//! (a list is one leaf) per manager and is not exposed (`managedFields` are omitted). Applying a
//! value different from the live one of a field owned by another manager is a 409 Conflict
//! unless `force`; non-apply writes take ownership of the fields they change; fields a manager
//! stops applying are removed if nobody else owns them. Not modelled: per-element ownership in
//! lists, conflicts between a manager's own Apply and Update entries, `managedFields` in
//! responses.
//!
//! # Not supported (documented gaps)
//! - No garbage collector: `propagationPolicy` is validated but every deletion behaves like
//!   Background without cascading to dependents; deleting a namespace deletes its contents at once
//!   (no Terminating phase).
//! - Lists read the latest state: `resourceVersionMatch=Exact` for an older version answers 410;
//!   continued lists are not a snapshot (objects changed between pages may appear in their new
//!   state; the reported resourceVersion is the first page's, so a watch from it replays them).
//! - List items keep their `kind`/`apiVersion` (upstream omits them in lists).
//! - No authentication or authorization of its own clients (every request is served; the
//!   reviews above answer for other components), admission, protobuf, CBOR, or
//!   `resourceVersion` waits for future versions; watches are never Tables.

mod controls;
mod error;
mod http;
mod kubeconfig;
pub mod patch;
mod protobuf;
mod resources;
mod reviews;
mod select;
mod store;
mod table;
mod tls;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

pub use controls::{Controls, RequestRecord};
pub use error::ApiError;
pub use kubeconfig::TOKEN as KUBECONFIG_TOKEN;
pub use resources::{ListStrategy, ResourceInfo, RESOURCES};
pub use store::DEFAULT_HISTORY;
pub use tls::ServingIdentity;

/// Options for [`ApiServer::start_with`].
#[derive(Debug, Clone)]
pub struct ApiServerOptions {
    /// Address to bind (default `127.0.0.1:0`, a random port).
    pub addr: SocketAddr,
    /// Events kept for watch resumption (default [`DEFAULT_HISTORY`]).
    pub history_limit: usize,
    /// Serve HTTPS with this identity instead of plain HTTP (default: plain HTTP).
    pub tls: Option<ServingIdentity>,
}

impl Default for ApiServerOptions {
    fn default() -> Self {
        ApiServerOptions {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_limit: DEFAULT_HISTORY,
            tls: None,
        }
    }
}

/// A running in-memory API server. Dropping it stops serving (like [`ApiServer::shutdown`]
/// without waiting).
pub struct ApiServer {
    shared: Arc<controls::Shared>,
    addr: SocketAddr,
    tls: Option<ServingIdentity>,
    client: kube::Client,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl ApiServer {
    /// Start on 127.0.0.1 with a random port.
    pub async fn start() -> anyhow::Result<ApiServer> {
        Self::start_with(ApiServerOptions::default()).await
    }

    /// Start on a given address.
    pub async fn start_on(addr: SocketAddr) -> anyhow::Result<ApiServer> {
        Self::start_with(ApiServerOptions {
            addr,
            ..Default::default()
        })
        .await
    }

    /// Start with options.
    pub async fn start_with(opts: ApiServerOptions) -> anyhow::Result<ApiServer> {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .with_context(|| format!("binding the in-memory API server to {}", opts.addr))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(controls::Shared {
            store: store::Store::new(opts.history_limit),
            ctl: Mutex::new(controls::ControlState::default()),
            watch_kill: Mutex::new(CancellationToken::new()),
            shutdown: CancellationToken::new(),
        });
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let stop = shared.shutdown.clone();
        let task = match &opts.tls {
            Some(identity) => tls::serve(listener, identity, app, stop)?,
            None => tokio::spawn(async move {
                let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                    stop.cancelled().await;
                });
                if let Err(e) = serve.await {
                    tracing::error!(error = %e, "in-memory API server stopped with an error");
                }
            }),
        };
        let url = url_of(addr, opts.tls.is_some());
        let kc = kubeconfig::kubeconfig_for(&url, opts.tls.as_ref().map(|t| t.ca_pem()));
        let mut config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .context("building a client config from the generated kubeconfig")?;
        if config.root_cert.is_none() {
            // Plain HTTP: an empty trust store, so that building the client does not need the
            // system's roots (kube loads them for any scheme; images without a CA bundle have
            // none).
            config.root_cert = Some(Vec::new());
        }
        let client = kube::Client::try_from(config).context("building kube::Client")?;
        tracing::debug!(%url, "in-memory API server started");
        Ok(ApiServer {
            shared,
            addr,
            tls: opts.tls,
            client,
            task: Some(task),
        })
    }

    /// `http://127.0.0.1:<port>`, or `https://…` when serving TLS.
    pub fn url(&self) -> String {
        url_of(self.addr, self.tls.is_some())
    }

    /// The CA that signed the serving certificate (PEM), when serving TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(ServingIdentity::ca_pem)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `kube::Client` talking HTTP to this server (built from [`ApiServer::kubeconfig`]).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A kubeconfig (context `ccm-inmemory`, namespace `default`, no credentials; the CA when
    /// serving TLS).
    pub fn kubeconfig(&self) -> kube::config::Kubeconfig {
        kubeconfig::kubeconfig_for(&self.url(), self.ca_pem())
    }

    /// Write a pod's service-account files into `dir` as the kubelet mounts them at
    /// `/var/run/secrets/kubernetes.io/serviceaccount`: `ca.crt` (when serving TLS), `token`
    /// (the given one: this server accepts any) and `namespace`. With
    /// `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT` set to [`Self::addr`], a client's
    /// in-cluster configuration then reaches this server.
    pub fn write_in_cluster_files(&self, dir: impl AsRef<Path>, token: &str) -> anyhow::Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut files = vec![("token", token), ("namespace", "kube-system")];
        if let Some(ca) = self.ca_pem() {
            files.push(("ca.crt", ca));
        }
        for (name, content) in files {
            let path = dir.join(name);
            std::fs::write(&path, content)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    }

    /// Write the kubeconfig as YAML, e.g. for `kubectl --kubeconfig`.
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let yaml = yaml_serde::to_string(&self.kubeconfig()).context("serializing kubeconfig")?;
        std::fs::write(path.as_ref(), yaml)
            .with_context(|| format!("writing kubeconfig to {}", path.as_ref().display()))
    }

    /// Test controls: seed/read state, request log, fault injection.
    pub fn controls(&self) -> Controls {
        Controls {
            shared: self.shared.clone(),
        }
    }

    /// Stop serving: open watches end, the listener closes.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

fn url_of(addr: SocketAddr, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}
