//! The HTTP endpoints: `/healthz`, `/readyz`, `/livez` (each also `/<endpoint>/<check>`) and
//! `/metrics`.
//!
//! `/healthz` has upstream's checks: `leaderElection` when leader election is on, then one
//! always-passing check per started controller (named with its canonical name), added once the
//! controllers have started; with no checks, `ping`. Beyond upstream: `cloud-provider-calls`
//! (the provider's calls are all refused because too many hung, see `provider::pool`).
//! `/readyz` answers once the provider is loaded and the API client is built (a standby replica
//! is ready), and only while its checks pass: `cloud-provider`, the provider's own health probe
//! (ABI 1.1, when it offers one; see `provider_health`), and `cloud-provider-calls-<Method>`
//! for each method whose calls were refused because they hung. `/livez`: `ping` and
//! `cloud-provider-calls` (a process only a restart can free).
//!
//! The three answer as the API server's health handlers do: `ok`, or with `?verbose` every
//! check as `[+]name ok` and `<endpoint> check passed`; a failing check is listed as
//! `[-]name failed: reason withheld` (the root paths answer anyone by default, and a cloud's
//! error can carry account IDs and role ARNs), `?exclude=<name>` skips one. The reason is at
//! `/<endpoint>/<name>` (`internal server error: <reason>`), which needs authorization.
//! Differences: `/readyz` fails with 503 (upstream: 500).
//!
//! They are served over HTTPS only (a self-signed certificate unless one is given, see
//! [`super::serving`]), behind delegated authentication and authorization
//! ([`super::delegated_auth`]): `/healthz`, `/readyz` and `/livez` are always allowed by default,
//! `/metrics` and `/<endpoint>/<check>` need a token the API server authorizes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// A health check: `Ok(())` or the reason it fails.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Shared state of the endpoints.
#[derive(Clone, Default)]
pub struct Health {
    checks: Arc<Mutex<BTreeMap<String, Check>>>,
    order: Arc<Mutex<Vec<String>>>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    /// `/readyz` checks, in the order they were added.
    ready_checks: Arc<Mutex<Vec<(String, Check)>>>,
    /// `/livez` checks after `ping`, in the order they were added.
    live_checks: Arc<Mutex<Vec<(String, Check)>>>,
}

impl Health {
    /// Register a named check.
    pub fn add_check(&self, name: &str, check: Check) {
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        if checks.insert(name.to_string(), check).is_none() {
            self.order
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(name.to_string());
        }
    }

    /// Mark the process ready (`/readyz`).
    pub fn set_ready(&self) {
        self.ready.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Add (or replace) a named `/readyz` check.
    pub fn add_ready_check(&self, name: &str, check: Check) {
        let mut checks = self.ready_checks.lock().unwrap_or_else(|p| p.into_inner());
        match checks.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = check,
            None => checks.push((name.to_string(), check)),
        }
    }

    /// Remove a `/readyz` check (no-op when absent).
    pub fn remove_ready_check(&self, name: &str) {
        self.ready_checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(n, _)| n != name);
    }

    /// Add (or replace) a named `/livez` check (beyond `ping`, which always passes).
    pub fn add_live_check(&self, name: &str, check: Check) {
        let mut checks = self.live_checks.lock().unwrap_or_else(|p| p.into_inner());
        match checks.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = check,
            None => checks.push((name.to_string(), check)),
        }
    }

    /// The checks of `endpoint`, in order.
    fn checks_of(&self, endpoint: Endpoint) -> Vec<(String, Check)> {
        match endpoint {
            Endpoint::Healthz => {
                let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
                let order = self.order.lock().unwrap_or_else(|p| p.into_inner());
                if order.is_empty() {
                    return vec![ping()];
                }
                order
                    .iter()
                    .map(|n| {
                        let check = checks.get(n).cloned().unwrap_or_else(|| ping().1);
                        (n.clone(), check)
                    })
                    .collect()
            }
            Endpoint::Readyz => self
                .ready_checks
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            Endpoint::Livez => std::iter::once(ping())
                .chain(
                    self.live_checks
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .iter()
                        .cloned(),
                )
                .collect(),
        }
    }
}

fn ping() -> (String, Check) {
    ("ping".to_string(), Arc::new(|| Ok(())))
}

/// The three health endpoints, as the API server's: `/healthz`, `/readyz`, `/livez`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Healthz,
    Readyz,
    Livez,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Readyz => "readyz",
            Self::Livez => "livez",
        }
    }

    /// The status of a failing answer (`/readyz`: 503, what a readiness probe and a load
    /// balancer read as "not ready"; the others 500, as upstream).
    fn failure(self) -> StatusCode {
        match self {
            Self::Readyz => StatusCode::SERVICE_UNAVAILABLE,
            Self::Healthz | Self::Livez => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// `?verbose` and `?exclude=<check>` (repeatable), as upstream's health handlers read them.
#[derive(Debug, Default)]
struct HealthQuery {
    verbose: bool,
    exclude: Vec<String>,
}

impl HealthQuery {
    fn parse(query: Option<&str>) -> Self {
        let mut q = Self::default();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "verbose" => q.verbose = true,
                "exclude" => q.exclude.push(value.to_string()),
                _ => {}
            }
        }
        q
    }
}

/// Upstream's root health handler: every check runs; a failing check is listed as
/// `[-]<name> failed: reason withheld` (the reason goes to the log at debug level: this path
/// answers anyone by default; the reason is at `/<endpoint>/<name>`, which needs
/// authorization), the body ends with `<endpoint> check failed`. When all pass: `ok`, or with
/// `?verbose` every check as `[+]<name> ok` and `<endpoint> check passed`.
fn root(
    endpoint: Endpoint,
    checks: &[(String, Check)],
    query: &HealthQuery,
) -> (StatusCode, String) {
    let mut report = String::new();
    let mut failed = Vec::new();
    for (name, check) in checks {
        if query.exclude.iter().any(|e| e == name) {
            report.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match check() {
            Ok(()) => report.push_str(&format!("[+]{name} ok\n")),
            Err(why) => {
                tracing::debug!(check = %name, "/{} check {name} failed: {why}", endpoint.name());
                report.push_str(&format!("[-]{name} failed: reason withheld\n"));
                failed.push(name.as_str());
            }
        }
    }
    if !failed.is_empty() {
        return (
            endpoint.failure(),
            format!("{report}{} check failed\n", endpoint.name()),
        );
    }
    if query.verbose {
        (
            StatusCode::OK,
            format!("{report}{} check passed\n", endpoint.name()),
        )
    } else {
        (StatusCode::OK, "ok".to_string())
    }
}

/// Upstream's handler of one check, `/<endpoint>/<name>` (authorized callers only, unless
/// `--authorization-always-allow-paths` says otherwise): `ok`, or the reason.
fn one(endpoint: Endpoint, checks: &[(String, Check)], name: &str) -> (StatusCode, String) {
    match checks.iter().find(|(n, _)| n == name) {
        None => (
            StatusCode::NOT_FOUND,
            format!("no {} check named {name:?}\n", endpoint.name()),
        ),
        Some((_, check)) => match check() {
            Ok(()) => (StatusCode::OK, "ok".to_string()),
            Err(why) => (
                endpoint.failure(),
                format!("internal server error: {why}\n"),
            ),
        },
    }
}

type AppState = State<(Health, Arc<Registry>)>;

async fn healthz(State((health, _)): AppState, RawQuery(q): RawQuery) -> impl IntoResponse {
    let checks = health.checks_of(Endpoint::Healthz);
    root(
        Endpoint::Healthz,
        &checks,
        &HealthQuery::parse(q.as_deref()),
    )
}

async fn healthz_one(State((health, _)): AppState, Path(name): Path<String>) -> impl IntoResponse {
    one(
        Endpoint::Healthz,
        &health.checks_of(Endpoint::Healthz),
        &name,
    )
}

async fn livez(State((health, _)): AppState, RawQuery(q): RawQuery) -> impl IntoResponse {
    let checks = health.checks_of(Endpoint::Livez);
    root(Endpoint::Livez, &checks, &HealthQuery::parse(q.as_deref()))
}

async fn livez_one(State((health, _)): AppState, Path(name): Path<String>) -> impl IntoResponse {
    one(Endpoint::Livez, &health.checks_of(Endpoint::Livez), &name)
}

async fn readyz(State((health, _)): AppState, RawQuery(q): RawQuery) -> impl IntoResponse {
    if !health.ready.load(std::sync::atomic::Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_string());
    }
    let checks = health.checks_of(Endpoint::Readyz);
    root(Endpoint::Readyz, &checks, &HealthQuery::parse(q.as_deref()))
}

async fn readyz_one(State((health, _)): AppState, Path(name): Path<String>) -> impl IntoResponse {
    one(Endpoint::Readyz, &health.checks_of(Endpoint::Readyz), &name)
}

async fn metrics(State((_, registry)): State<(Health, Arc<Registry>)>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::runtime::metrics::render(&registry),
    )
}

/// The router (exposed for tests).
pub fn router(health: Health, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/{name}", get(healthz_one))
        .route("/readyz", get(readyz))
        .route("/readyz/{name}", get(readyz_one))
        .route("/livez", get(livez))
        .route("/livez/{name}", get(livez_one))
        .route("/metrics", get(metrics))
        .with_state((health, registry))
}

/// Serve the endpoints on `addr` over HTTPS (`tls`) behind delegated authentication and
/// authorization, with the connection `limits`, until `stop` is cancelled; returns the bound
/// address.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    auth: Arc<super::delegated_auth::DelegatedAuth>,
    limits: super::serving::Limits,
    health: Health,
    registry: Arc<Registry>,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let app = router(health, registry).layer(axum::middleware::from_fn_with_state(
        auth,
        super::delegated_auth::middleware,
    ));
    super::serving::serve(addr, tls, app, limits, stop).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checks() -> Vec<(String, Check)> {
        vec![
            ("leaderElection".to_string(), Arc::new(|| Ok(())) as Check),
            (
                "cloud-provider".to_string(),
                Arc::new(|| Err("role arn:aws:iam::123456789012:role/ccm denied".to_string())),
            ),
        ]
    }

    #[test]
    fn root_paths_withhold_reasons_and_one_check_tells_it() {
        let (code, body) = root(Endpoint::Readyz, &checks(), &HealthQuery::parse(None));
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "[+]leaderElection ok\n[-]cloud-provider failed: reason withheld\nreadyz check failed\n"
        );
        let (code, body) = one(Endpoint::Readyz, &checks(), "cloud-provider");
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("123456789012"), "{body}");
        let (code, _) = one(Endpoint::Readyz, &checks(), "nope");
        assert_eq!(code, StatusCode::NOT_FOUND);
        // Excluded, the rest passes; verbose lists each check.
        let q = HealthQuery::parse(Some("verbose&exclude=cloud-provider"));
        let (code, body) = root(Endpoint::Healthz, &checks(), &q);
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "[+]leaderElection ok\n[+]cloud-provider excluded: ok\nhealthz check passed\n"
        );
        let q = HealthQuery::parse(Some("exclude=cloud-provider"));
        assert_eq!(
            root(Endpoint::Livez, &checks(), &q),
            (StatusCode::OK, "ok".into())
        );
    }

    #[test]
    fn livez_has_ping_and_its_checks() {
        let health = Health::default();
        let names = |h: &Health| -> Vec<String> {
            h.checks_of(Endpoint::Livez)
                .into_iter()
                .map(|(n, _)| n)
                .collect()
        };
        assert_eq!(names(&health), ["ping"]);
        health.add_live_check("cloud-provider-calls", Arc::new(|| Err("stuck".into())));
        assert_eq!(names(&health), ["ping", "cloud-provider-calls"]);
        let (code, body) = root(
            Endpoint::Livez,
            &health.checks_of(Endpoint::Livez),
            &HealthQuery::parse(Some("verbose")),
        );
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            body,
            "[+]ping ok\n[-]cloud-provider-calls failed: reason withheld\nlivez check failed\n"
        );
    }
}
