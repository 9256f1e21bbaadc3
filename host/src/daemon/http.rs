//! The HTTP endpoints: `/healthz` (and `/healthz/<check>`), `/readyz`, `/metrics`.
//!
//! `/healthz` has upstream's checks: `leaderElection` when leader election is on, then one
//! always-passing check per started controller (named with its canonical name), added once the
//! controllers have started; with no checks, `ping`. Beyond upstream, `/readyz` answers `ok`
//! once the provider is loaded and the API client is built (a standby replica is ready), and
//! only while its readiness checks pass: `cloud-provider`, the provider's own health probe
//! (ABI 1.1, when it offers one; see `provider_health`). `/readyz/<check>` runs one. A failing
//! `/readyz` lists every check as `[+]name ok` / `[-]name failed: reason`, as the API server does;
//! with `?verbose` a passing `/healthz` or `/readyz` lists them too, ending
//! `healthz check passed` (`readyz check passed`), as upstream's.
//!
//! They are served over HTTPS only (a self-signed certificate unless one is given, see
//! [`super::serving`]), behind delegated authentication and authorization
//! ([`super::delegated_auth`]): `/healthz`, `/readyz` and `/livez` are always allowed by default,
//! `/metrics` and `/healthz/<check>` need a token the API server authorizes.

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

    /// `/readyz` (or `/readyz/<only>`): `None` when `only` names no check; else whether every
    /// check passed and the `[+]`/`[-]` report.
    fn run_ready_checks(&self, only: Option<&str>) -> Option<(bool, String)> {
        let checks: Vec<(String, Check)> = self
            .ready_checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(n, _)| only.is_none_or(|o| o == n))
            .cloned()
            .collect();
        if only.is_some() && checks.is_empty() {
            return None;
        }
        let mut ok = true;
        let mut report = String::new();
        for (name, check) in &checks {
            match check() {
                Ok(()) => report.push_str(&format!("[+]{name} ok\n")),
                Err(why) => {
                    ok = false;
                    report.push_str(&format!("[-]{name} failed: {why}\n"));
                }
            }
        }
        Some((ok, report))
    }

    fn run_checks(&self, only: Option<&str>) -> Option<(bool, String)> {
        let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        let order = self.order.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let names: Vec<String> = if order.is_empty() {
            vec!["ping".into()]
        } else {
            order
        };
        let names: Vec<String> = match only {
            Some(one) => names.into_iter().filter(|n| n == one).collect(),
            None => names,
        };
        if names.is_empty() {
            return None;
        }
        let mut ok = true;
        let mut report = String::new();
        for name in &names {
            let result = checks.get(name).map_or(Ok(()), |c| c());
            match result {
                Ok(()) => report.push_str(&format!("[+]{name} ok\n")),
                Err(why) => {
                    ok = false;
                    report.push_str(&format!("[-]{name} failed: {why}\n"));
                }
            }
        }
        Some((ok, report))
    }
}

/// Whether the query asks for the verbose report (`?verbose`, `?verbose=true`, `?verbose=1`).
fn verbose(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "verbose" | "verbose=" | "verbose=true" | "verbose=1"))
    })
}

async fn healthz(
    State((health, _)): State<(Health, Arc<Registry>)>,
    RawQuery(query): RawQuery,
) -> impl IntoResponse {
    match health.run_checks(None) {
        Some((true, report)) if verbose(query.as_deref()) => {
            (StatusCode::OK, format!("{report}healthz check passed\n"))
        }
        Some((true, _)) => (StatusCode::OK, "ok".to_string()),
        Some((false, report)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{report}healthz check failed\n"),
        ),
        None => (StatusCode::OK, "ok".to_string()),
    }
}

async fn healthz_one(
    State((health, _)): State<(Health, Arc<Registry>)>,
    Path(name): Path<String>,
) -> impl IntoResponse {
    match health.run_checks(Some(&name)) {
        Some((true, _)) => (StatusCode::OK, "ok".to_string()),
        Some((false, report)) => (StatusCode::INTERNAL_SERVER_ERROR, report),
        None => (
            StatusCode::NOT_FOUND,
            format!("no health check named {name:?}\n"),
        ),
    }
}

async fn readyz(
    State((health, _)): State<(Health, Arc<Registry>)>,
    RawQuery(query): RawQuery,
) -> impl IntoResponse {
    if !health.ready.load(std::sync::atomic::Ordering::Acquire) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready".to_string());
    }
    match health.run_ready_checks(None) {
        Some((false, report)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{report}readyz check failed\n"),
        ),
        Some((true, report)) if verbose(query.as_deref()) => {
            (StatusCode::OK, format!("{report}readyz check passed\n"))
        }
        None if verbose(query.as_deref()) => (StatusCode::OK, "readyz check passed\n".to_string()),
        _ => (StatusCode::OK, "ok".to_string()),
    }
}

async fn readyz_one(
    State((health, _)): State<(Health, Arc<Registry>)>,
    Path(name): Path<String>,
) -> impl IntoResponse {
    match health.run_ready_checks(Some(&name)) {
        Some((true, _)) => (StatusCode::OK, "ok".to_string()),
        Some((false, report)) => (StatusCode::SERVICE_UNAVAILABLE, report),
        None => (
            StatusCode::NOT_FOUND,
            format!("no readiness check named {name:?}\n"),
        ),
    }
}

async fn metrics(State((_, registry)): State<(Health, Arc<Registry>)>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&registry),
    )
}

/// The router (exposed for tests).
pub fn router(health: Health, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/{name}", get(healthz_one))
        .route("/readyz", get(readyz))
        .route("/readyz/{name}", get(readyz_one))
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
