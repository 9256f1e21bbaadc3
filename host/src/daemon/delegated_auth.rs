//! Delegated authentication and authorization of the secure port, as upstream's
//! (k8s.io/apiserver's `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions`):
//!
//! 1. **Authentication.** A client certificate the TLS handshake verified against the client CA
//!    (`--client-ca-file`, else unless `--authentication-skip-lookup` the `client-ca-file` of
//!    configmap `kube-system/extension-apiserver-authentication`, read at start) is the user of
//!    its common name in the groups of its organizations. Else a request with
//!    `Authorization: Bearer <token>` is authenticated with a TokenReview through
//!    `--authentication-kubeconfig` (else the in-cluster configuration). A token the API server
//!    does not accept, or a review that fails, is `401 Unauthorized` (also on the always-allowed
//!    paths, as upstream). A request with neither is `system:anonymous` in
//!    `system:unauthenticated`. Request-header (front proxy) authentication is not implemented.
//! 2. **Authorization.** Members of `system:masters` are allowed; the paths of
//!    `--authorization-always-allow-paths` (default `/healthz`, `/readyz`, `/livez`; a trailing
//!    `*` matches a prefix) are allowed; anything else is asked with a SubjectAccessReview
//!    (non-resource URL, the lower-cased method as the verb, e.g. `get /metrics`) through
//!    `--authorization-kubeconfig` (else in-cluster). Denied is `403 Forbidden`; a review that
//!    fails is `500`.
//! 3. **Caches.** Token reviews (authenticated or not) are cached for
//!    `--authentication-token-webhook-cache-ttl` (default 10s), keyed by the token's SHA-256;
//!    access reviews for `--authorization-webhook-cache-authorized-ttl` /
//!    `-unauthorized-ttl` (10s each). Failed reviews are not cached. Each cache holds at most
//!    4,096 entries. A review call is given 10 s, as upstream's webhook client.
//!
//! Without a kubeconfig for a side (no flag and not in a cluster), that side is off as upstream's
//! (`RemoteKubeConfigFileOptional`): bearer tokens are not checked (every request is anonymous),
//! or nothing is asked, so only the always-allowed paths and `system:masters` are served.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use rustls_pki_types::CertificateDer;
use serde_json::json;

/// Upstream's default `--authorization-always-allow-paths`.
pub const DEFAULT_ALWAYS_ALLOW_PATHS: &[&str] = &["/healthz", "/readyz", "/livez"];
/// Upstream's default for the three cache TTLs.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(10);
/// The group every authorizer allows (upstream's `AlwaysAllowGroups`).
pub const SYSTEM_MASTERS: &str = "system:masters";
/// How long one review may take (upstream's webhook client timeout).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Entries per cache.
const CACHE_ENTRIES: usize = 4096;

/// The settings from the flags.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// `--authentication-kubeconfig`.
    pub authentication_kubeconfig: Option<PathBuf>,
    /// `--authorization-kubeconfig`.
    pub authorization_kubeconfig: Option<PathBuf>,
    /// `--authorization-always-allow-paths`.
    pub always_allow_paths: Vec<String>,
    /// `--authentication-token-webhook-cache-ttl`.
    pub token_cache_ttl: Duration,
    /// `--authorization-webhook-cache-authorized-ttl`.
    pub authorized_ttl: Duration,
    /// `--authorization-webhook-cache-unauthorized-ttl`.
    pub unauthorized_ttl: Duration,
    /// `--client-ca-file`.
    pub client_ca_file: Option<PathBuf>,
    /// `--authentication-skip-lookup`.
    pub skip_lookup: bool,
    /// `--authentication-tolerate-lookup-failure`.
    pub tolerate_lookup_failure: bool,
}

impl Default for AuthSettings {
    fn default() -> Self {
        AuthSettings {
            authentication_kubeconfig: None,
            authorization_kubeconfig: None,
            always_allow_paths: DEFAULT_ALWAYS_ALLOW_PATHS
                .iter()
                .map(|p| p.to_string())
                .collect(),
            token_cache_ttl: DEFAULT_CACHE_TTL,
            authorized_ttl: DEFAULT_CACHE_TTL,
            unauthorized_ttl: DEFAULT_CACHE_TTL,
            client_ca_file: None,
            skip_lookup: false,
            tolerate_lookup_failure: false,
        }
    }
}

/// `--authorization-always-allow-paths` as upstream's path authorizer reads it: the leading `/`
/// is ignored, a trailing `*` makes a prefix, `*` anywhere else is an error.
#[derive(Debug, Clone, Default)]
pub struct AlwaysAllowPaths {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl AlwaysAllowPaths {
    /// Parse the flag's entries.
    pub fn parse(paths: &[String]) -> Result<AlwaysAllowPaths, String> {
        let mut out = AlwaysAllowPaths::default();
        for p in paths {
            let p = p.strip_prefix('/').unwrap_or(p);
            if p.is_empty() {
                out.exact.push(String::new());
                continue;
            }
            if p[..p.len() - 1].contains('*') {
                return Err(format!(
                    "--authorization-always-allow-paths: only trailing * allowed in {:?}",
                    format!("/{p}")
                ));
            }
            match p.strip_suffix('*') {
                Some(prefix) => out.prefixes.push(prefix.to_string()),
                None => out.exact.push(p.to_string()),
            }
        }
        Ok(out)
    }

    /// Whether `path` is always allowed.
    pub fn allows(&self, path: &str) -> bool {
        let path = path.strip_prefix('/').unwrap_or(path);
        self.exact.iter().any(|p| p == path) || self.prefixes.iter().any(|p| path.starts_with(p))
    }
}

/// Who made a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// User name.
    pub name: String,
    /// UID (may be empty).
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

/// A small map whose entries expire.
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(expires, _)| *expires > Instant::now())
            .map(|(_, v)| v.clone())
    }

    fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if entries.len() >= CACHE_ENTRIES && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= CACHE_ENTRIES {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| k.clone());
                if let Some(k) = soonest {
                    entries.remove(&k);
                }
            }
        }
        entries.insert(key, (now + ttl, value));
    }
}

/// What authorization decided.
enum Decision {
    Allow,
    Deny(String),
}

/// The authenticator and authorizer of the secure port.
pub struct DelegatedAuth {
    authn: Option<kube::Client>,
    client_ca: Vec<CertificateDer<'static>>,
    client_ca_origin: String,
    authz: Option<kube::Client>,
    paths: AlwaysAllowPaths,
    settings: AuthSettings,
    tokens: TtlCache<[u8; 32], Option<User>>,
    access: TtlCache<String, (bool, String)>,
}

/// A client for the API server of `--<flag>` (a kubeconfig file), else the in-cluster
/// configuration; `None` (with a warning) when neither exists, as upstream's optional remote
/// kubeconfig.
async fn remote_client(
    flag: &str,
    path: Option<&Path>,
    off: &str,
) -> Result<Option<kube::Client>, String> {
    let config = match path {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read --{flag} {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| format!("invalid --{flag} {}: {e}", path.display()))?
        }
        None => {
            if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
                tracing::warn!("no --{flag} given and not running in a cluster: {off}");
                return Ok(None);
            }
            match kube::Config::incluster() {
                Ok(config) => config,
                Err(e) => {
                    tracing::error!(
                        "no --{flag} given and the in-cluster configuration failed ({e}): {off}"
                    );
                    return Ok(None);
                }
            }
        }
    };
    // Upstream's delegated authentication and authorization clients allow 200 requests/s
    // (burst 400); each has its own limiter and names itself in its User-Agent.
    crate::runtime::kube_clients::KubeClients::new(config, 200.0, 400)
        .and_then(|clients| {
            clients.client(&format!(
                "delegated-{}",
                flag.trim_end_matches("-kubeconfig")
            ))
        })
        .map(Some)
        .map_err(|e| format!("--{flag}: {e}"))
}

impl DelegatedAuth {
    /// Build from the settings: reads the kubeconfigs (an unreadable one given by flag is an
    /// error, as upstream) and validates the always-allowed paths.
    pub async fn new(settings: AuthSettings) -> Result<DelegatedAuth, String> {
        let paths = AlwaysAllowPaths::parse(&settings.always_allow_paths)?;
        let authn = remote_client(
            "authentication-kubeconfig",
            settings.authentication_kubeconfig.as_deref(),
            "bearer tokens are not checked (every request is anonymous)",
        )
        .await?;
        let authz = remote_client(
            "authorization-kubeconfig",
            settings.authorization_kubeconfig.as_deref(),
            &format!(
                "no SubjectAccessReview is asked: only the always-allowed paths ({}) are served",
                settings.always_allow_paths.join(",")
            ),
        )
        .await?;
        let (client_ca, client_ca_origin) = client_ca(&settings, authn.as_ref()).await?;
        Ok(DelegatedAuth {
            authn,
            client_ca,
            client_ca_origin,
            authz,
            paths,
            settings,
            tokens: TtlCache::new(),
            access: TtlCache::new(),
        })
    }

    /// The CA bundle client certificates are verified against (empty: client certificates are
    /// not asked for).
    pub fn client_ca(&self) -> &[CertificateDer<'static>] {
        &self.client_ca
    }

    /// Whether tokens are checked and access asked (for the start-up log).
    pub fn describe(&self) -> String {
        format!(
            "authentication {}{}, authorization {}, always allowed: {}",
            if self.authn.is_some() {
                "by TokenReview"
            } else {
                "of tokens off"
            },
            if self.client_ca.is_empty() {
                String::new()
            } else {
                format!(" and client certificates ({})", self.client_ca_origin)
            },
            if self.authz.is_some() {
                "by SubjectAccessReview"
            } else {
                "off"
            },
            self.settings.always_allow_paths.join(",")
        )
    }

    /// Authenticate the request: `Ok(user)`, or `Err` with the reason for a 401. As upstream's
    /// union, a verified client certificate with a common name comes first, then a bearer token.
    async fn authenticate(
        &self,
        headers: &HeaderMap,
        certificate: Option<&PeerCertificate>,
    ) -> Result<User, String> {
        if let Some(user) = certificate.and_then(|c| user_from_certificate(&c.0)) {
            return Ok(user);
        }
        let Some(token) = bearer_token(headers) else {
            return Ok(User::anonymous());
        };
        let Some(client) = &self.authn else {
            // Upstream without a token authenticator: the token is not looked at.
            return Ok(User::anonymous());
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        if let Some(cached) = self.tokens.get(&key) {
            return cached.ok_or_else(|| "invalid bearer token (cached)".to_string());
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(client.clone());
        let answered =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("TokenReview timed out after {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| format!("TokenReview failed: {e}"))?;
        let status = answered.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Some(User {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            _ => None,
        };
        self.tokens
            .insert(key, user.clone(), self.settings.token_cache_ttl);
        user.ok_or_else(|| match status.error {
            Some(e) if !e.is_empty() => format!("invalid bearer token: {e}"),
            _ => "invalid bearer token".to_string(),
        })
    }

    /// Authorize `verb` on `path` for `user`.
    async fn authorize(&self, user: &User, verb: &str, path: &str) -> Result<Decision, String> {
        if user.groups.iter().any(|g| g == SYSTEM_MASTERS) || self.paths.allows(path) {
            return Ok(Decision::Allow);
        }
        let Some(client) = &self.authz else {
            return Ok(Decision::Deny(String::new()));
        };
        let spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_string()),
                verb: Some(verb.to_string()),
            }),
            resource_attributes: None,
        };
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if let Some((allowed, reason)) = self.access.get(&key) {
            return Ok(if allowed {
                Decision::Allow
            } else {
                Decision::Deny(reason)
            });
        }
        let api: Api<SubjectAccessReview> = Api::all(client.clone());
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let answered =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| format!("SubjectAccessReview timed out after {REVIEW_TIMEOUT:?}"))?
                .map_err(|e| format!("SubjectAccessReview failed: {e}"))?;
        let status = answered.status.unwrap_or_default();
        let allowed = status.allowed && status.denied != Some(true);
        let reason = status.reason.unwrap_or_default();
        let ttl = if allowed {
            self.settings.authorized_ttl
        } else {
            self.settings.unauthorized_ttl
        };
        self.access.insert(key, (allowed, reason.clone()), ttl);
        Ok(if allowed {
            Decision::Allow
        } else {
            Decision::Deny(reason)
        })
    }
}

/// The ConfigMap the API server publishes its client CA in (upstream's cluster lookup).
const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// The client CA bundle and where it came from: `--client-ca-file`; else, unless
/// `--authentication-skip-lookup`, the `client-ca-file` of configmap
/// `kube-system/extension-apiserver-authentication` (read once, at start) through the
/// authentication client. A missing ConfigMap or key is no CA; any other failure to read it is
/// fatal unless `--authentication-tolerate-lookup-failure`, as upstream.
async fn client_ca(
    settings: &AuthSettings,
    authn: Option<&kube::Client>,
) -> Result<(Vec<CertificateDer<'static>>, String), String> {
    let none = || Ok((Vec::new(), String::new()));
    let (pem, origin) = if let Some(path) = &settings.client_ca_file {
        let pem =
            std::fs::read(path).map_err(|e| format!("--client-ca-file {}: {e}", path.display()))?;
        (pem, format!("--client-ca-file {}", path.display()))
    } else if settings.skip_lookup {
        return none();
    } else if let Some(client) = authn {
        let origin = format!("configmap kube-system/{AUTHENTICATION_CONFIGMAP}");
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
        let read = tokio::time::timeout(REVIEW_TIMEOUT, api.get_opt(AUTHENTICATION_CONFIGMAP));
        match read.await {
            Ok(Ok(found)) => {
                let pem = found
                    .and_then(|cm| cm.data)
                    .and_then(|mut data| data.remove("client-ca-file"));
                match pem {
                    Some(pem) => (pem.into_bytes(), origin),
                    None => return none(),
                }
            }
            Ok(Err(e)) => {
                let hint = match &e {
                    kube::Error::Api(status) if status.code == 403 => {
                        " (grant the Role kube-system/extension-apiserver-authentication-reader, see deploy/base/rbac.yaml)"
                    }
                    _ => "",
                };
                return lookup_failed(settings, format!("cannot read {origin}: {e}{hint}"));
            }
            Err(_) => {
                return lookup_failed(
                    settings,
                    format!("cannot read {origin}: no answer within {REVIEW_TIMEOUT:?}"),
                )
            }
        }
    } else {
        return none();
    };
    use rustls_pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{origin}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{origin}: no PEM certificate"));
    }
    Ok((certs, origin))
}

fn lookup_failed(
    settings: &AuthSettings,
    why: String,
) -> Result<(Vec<CertificateDer<'static>>, String), String> {
    if settings.tolerate_lookup_failure {
        tracing::warn!(
            "{why}; client certificates are not authenticated (--authentication-tolerate-lookup-failure)"
        );
        Ok((Vec::new(), String::new()))
    } else {
        Err(format!(
            "{why} (--authentication-skip-lookup does without it, --authentication-tolerate-lookup-failure starts anyway)"
        ))
    }
}

/// A client certificate the TLS handshake verified against the client CA (the first of the chain
/// the client sent), handed to the endpoints' requests by the server.
#[derive(Debug, Clone)]
pub struct PeerCertificate(pub CertificateDer<'static>);

/// The user of a verified client certificate, as upstream's `CommonNameUserConversion`: the
/// subject's common name (the last one) is the name, its organizations are the groups (plus
/// `system:authenticated`); no common name is no user.
fn user_from_certificate(der: &CertificateDer<'_>) -> Option<User> {
    let cert = webpki::EndEntityCert::try_from(der).ok()?;
    let (name, mut groups) = subject_names(cert.subject())?;
    let name = name.filter(|n| !n.is_empty())?;
    groups.push("system:authenticated".into());
    Some(User {
        name,
        uid: String::new(),
        groups,
        extra: BTreeMap::new(),
    })
}

/// One DER element: (tag, contents, what follows).
fn der_element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |len, b| (len << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The common name and organizations of an X.509 Name, given as the contents of its SEQUENCE
/// (webpki hands the subject out so): SETs of (OID, string) SEQUENCEs. webpki has checked the
/// certificate's structure; this reads only the two attributes upstream uses.
fn subject_names(mut name: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
    const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
    let (mut cn, mut orgs) = (None, Vec::new());
    while !name.is_empty() {
        let (tag, mut set, rest) = der_element(name)?;
        name = rest;
        if tag != 0x31 {
            return None;
        }
        while !set.is_empty() {
            let (tag, attribute, rest) = der_element(set)?;
            set = rest;
            let (oid_tag, oid, value) = der_element(attribute)?;
            let (value_tag, value, _) = der_element(value)?;
            if tag != 0x30 || oid_tag != 0x06 {
                return None;
            }
            let text = match value_tag {
                // UTF8String, PrintableString, IA5String, TeletexString (read as UTF-8).
                0x0c | 0x13 | 0x16 | 0x14 => String::from_utf8_lossy(value).into_owned(),
                // BMPString: UTF-16BE.
                0x1e => String::from_utf16_lossy(
                    &value
                        .chunks(2)
                        .map(|c| u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]))
                        .collect::<Vec<_>>(),
                ),
                _ => continue,
            };
            if oid == COMMON_NAME {
                cn = Some(text);
            } else if oid == ORGANIZATION {
                orgs.push(text);
            }
        }
    }
    Some((cn, orgs))
}

/// The token of `Authorization: Bearer <token>`, as upstream's bearer token authenticator reads
/// it (scheme case-insensitive; anything else is no token).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = value.splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A `metav1.Status` response, as upstream's filters write them.
fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": {},
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The axum middleware: authenticate, authorize, then run the endpoint.
pub async fn middleware(
    State(auth): State<Arc<DelegatedAuth>>,
    req: Request<Body>,
    next: Next,
) -> Response {
    let path = req.uri().path().to_string();
    let verb = req.method().as_str().to_ascii_lowercase();
    let user = match auth
        .authenticate(req.headers(), req.extensions().get::<PeerCertificate>())
        .await
    {
        Ok(user) => user,
        Err(why) => {
            tracing::debug!(path, "secure port: unauthorized: {why}");
            return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
        }
    };
    match auth.authorize(&user, &verb, &path).await {
        Ok(Decision::Allow) => next.run(req).await,
        Ok(Decision::Deny(reason)) => {
            let mut message = format!(
                "forbidden: User {:?} cannot {verb} path {path:?}",
                user.name
            );
            if !reason.is_empty() {
                message.push_str(": ");
                message.push_str(&reason);
            }
            tracing::debug!(user = user.name, "secure port: {message}");
            status(StatusCode::FORBIDDEN, "Forbidden", &message)
        }
        Err(e) => {
            tracing::warn!(user = user.name, path, "secure port: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Server Error: {path:?}: {e}"),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(p: &[&str]) -> Result<AlwaysAllowPaths, String> {
        AlwaysAllowPaths::parse(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn always_allow_paths_as_upstreams_path_authorizer() {
        let p = paths(DEFAULT_ALWAYS_ALLOW_PATHS).unwrap();
        assert!(p.allows("/healthz") && p.allows("/readyz") && p.allows("/livez"));
        assert!(!p.allows("/healthz/leaderElection"), "exact, as upstream");
        assert!(!p.allows("/metrics") && !p.allows("/"));
        let p = paths(&["/healthz*", "metrics", "/"]).unwrap();
        assert!(p.allows("/healthz/leaderElection") && p.allows("/healthzz"));
        assert!(p.allows("/metrics") && p.allows("/"));
        assert!(!p.allows("/readyz"));
        assert_eq!(
            paths(&["/he*lthz"]).unwrap_err(),
            "--authorization-always-allow-paths: only trailing * allowed in \"/he*lthz\""
        );
        assert!(paths(&[]).unwrap().exact.is_empty());
    }

    #[test]
    fn bearer_tokens_as_upstream() {
        let h = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer_token(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("  Bearer abc  ")), Some("abc"));
        assert_eq!(bearer_token(&h("Basic abc")), None);
        assert_eq!(bearer_token(&h("Bearer")), None);
        assert_eq!(bearer_token(&h("Bearer  abc")), None, "empty token");
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn subject_common_name_and_organizations_as_gos_pkix_name() {
        let name: &[u8] = &[
            0x31, 0x0a, 0x30, 0x08, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x0c, 0x01, b'a', // O=a
            0x31, 0x0a, 0x30, 0x08, 0x06, 0x03, 0x55, 0x04, 0x03, 0x13, 0x01, b'x', // CN=x
            0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x1e, 0x02, 0x00,
            b'b', // O=b (BMPString)
            0x31, 0x0d, 0x30, 0x0b, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x04, b'l', b'a', b's',
            b't', // CN=last
            0x31, 0x0a, 0x30, 0x08, 0x06, 0x03, 0x55, 0x04, 0x07, 0x0c, 0x01, b'z', // L=z
        ];
        assert_eq!(
            subject_names(name),
            Some((
                Some("last".to_string()),
                vec!["a".to_string(), "b".to_string()]
            )),
            "the last common name wins, every organization is a group"
        );
        assert_eq!(subject_names(&name[..5]), None, "truncated");
        assert_eq!(subject_names(&[]), Some((None, vec![])));
        // A real certificate: rcgen's, with CN and O.
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "prometheus");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "monitoring");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let user = user_from_certificate(cert.der()).unwrap();
        assert_eq!(user.name, "prometheus");
        assert_eq!(user.groups, ["monitoring", "system:authenticated"]);
        let mut nameless = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        nameless.distinguished_name = rcgen::DistinguishedName::new();
        let cert = nameless.self_signed(&key).unwrap();
        assert_eq!(
            user_from_certificate(cert.der()),
            None,
            "no common name, no user"
        );
    }

    #[test]
    fn cache_entries_expire_and_stay_bounded() {
        let cache: TtlCache<u32, bool> = TtlCache::new();
        cache.insert(1, true, Duration::from_secs(60));
        assert_eq!(cache.get(&1), Some(true));
        cache.insert(2, true, Duration::ZERO);
        assert_eq!(cache.get(&2), None, "a zero TTL caches nothing");
        cache.insert(3, false, Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(cache.get(&3), None, "expired");
        for i in 10..(10 + 2 * CACHE_ENTRIES as u32) {
            cache.insert(i, true, Duration::from_secs(60));
        }
        assert_eq!(
            cache.entries.lock().unwrap().len(),
            CACHE_ENTRIES,
            "bounded"
        );
    }
}
