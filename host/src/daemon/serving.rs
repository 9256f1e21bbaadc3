//! The secure port as upstream's: always HTTPS, with `--tls-cert-file`/`--tls-private-key-file`
//! when given, else a self-signed certificate for `localhost`/`127.0.0.1` (kept in memory, or
//! written to and read back from `--cert-dir`), and limits that keep clients from holding the
//! port ([`Limits`]): a TLS handshake timeout, a request header timeout that also ends idle
//! kept-alive connections (slow clients are dropped), an idle timeout for everything else, and a
//! connection cap that makes room for a new connection by closing, in this order, the oldest
//! *silent* one (accepted, not a byte sent yet), else the longest idle one after its handshake;
//! a connection in its TLS handshake is never closed in favour of a newer one (at the cap with
//! every connection handshaking or in a request, the new one is closed). A connection counts as
//! in its handshake from the client's first byte, looked for already when it is accepted (a
//! non-blocking peek: under a flood a connection waits in the accept queue, and the probe's
//! ClientHello is there by the time it is accepted, so it is never taken for a silent one while
//! its task has not run yet). The listen backlog is the kernel's somaxconn, as Go's. So
//! thousands of idle or half-open connections, or a flood of new ones that send nothing, never
//! starve the kubelet's `/healthz` probe, whose ClientHello follows its connect at once.
//! Upstream (Go's net/http) has no connection cap.
//!
//! Requests are authenticated and authorized by [`super::delegated_auth`] before the endpoints
//! of [`super::http`] see them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use rustls_pki_types::CertificateDer;
use tokio_util::sync::CancellationToken;

use super::delegated_auth::PeerCertificate;

/// Upstream's `PairName` for the cloud-controller-manager: `--cert-dir` holds
/// `cloud-controller-manager.crt` and `cloud-controller-manager.key`.
pub const PAIR_NAME: &str = "cloud-controller-manager";

/// Limits of the endpoint server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// How long a client may take to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a client may take to send a request's headers, counted from when the server
    /// starts waiting for them: after the handshake, and after each response on a kept-alive
    /// connection (so it is also the keep-alive idle time). Then the connection is closed.
    pub header_read_timeout: Duration,
    /// A connection with no request in a handler for this long is closed, whatever it is doing
    /// (e.g. a client that stopped reading a response larger than the socket buffers).
    pub idle_timeout: Duration,
    /// Connections held at once. At the cap a new connection closes the longest idle one
    /// (handshaking, waiting for headers or between requests); when every connection is in
    /// a request, the new one is closed.
    pub max_connections: usize,
}

/// The limits `ccm-host run` uses. Upstream's Go server has a 32 s header timeout, keeps idle
/// connections 90 s and has no cap; the endpoints here answer in milliseconds, so a client that
/// needs 10 s to send its headers is not one to wait for (a scraper reconnects for its next
/// scrape instead of reusing the connection), and 256 connections are far more than the kubelet
/// and a few scrapers use while staying well inside a 1024 file descriptor limit.
pub const DEFAULT_LIMITS: Limits = Limits {
    handshake_timeout: Duration::from_secs(10),
    header_read_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(90),
    max_connections: 256,
};

/// The serving certificate and key (PEM), and where they came from (for the start-up log).
pub struct ServingCert {
    /// Certificate chain, PEM.
    pub cert_pem: Vec<u8>,
    /// Private key, PEM.
    pub key_pem: Vec<u8>,
    /// E.g. `self-signed, in memory`.
    pub origin: String,
}

/// The certificate to serve, as upstream's `MaybeDefaultWithSelfSignedCerts`: the given files;
/// else, with `cert_dir`, `<cert_dir>/cloud-controller-manager.{crt,key}` when both can be read,
/// otherwise a new self-signed pair written there; else a new self-signed pair in memory. The
/// generated certificate is valid for a year for `localhost`, `127.0.0.1` and `bind` (when it is
/// a specific address).
pub fn serving_cert(
    files: Option<(&Path, &Path)>,
    cert_dir: Option<&Path>,
    bind: IpAddr,
) -> Result<ServingCert, String> {
    if let Some((cert, key)) = files {
        let read = |flag: &str, p: &Path| {
            std::fs::read(p).map_err(|e| format!("{flag} {}: {e}", p.display()))
        };
        return Ok(ServingCert {
            cert_pem: read("--tls-cert-file", cert)?,
            key_pem: read("--tls-private-key-file", key)?,
            origin: format!("{} (--tls-cert-file)", cert.display()),
        });
    }
    let Some(dir) = cert_dir.filter(|d| !d.as_os_str().is_empty()) else {
        let (cert_pem, key_pem) = self_signed(bind)?;
        return Ok(ServingCert {
            cert_pem,
            key_pem,
            origin: "self-signed, in memory".into(),
        });
    };
    let cert: PathBuf = dir.join(format!("{PAIR_NAME}.crt"));
    let key: PathBuf = dir.join(format!("{PAIR_NAME}.key"));
    if cert.is_file() && key.is_file() {
        // Never through a symlink (a planted one would hand us another file).
        let read = |p: &Path| {
            use std::io::Read;
            use std::os::unix::fs::OpenOptionsExt;
            let mut out = Vec::new();
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(p)
                .and_then(|mut f| f.read_to_end(&mut out))
                .map(|_| out)
                .map_err(|e| format!("--cert-dir: cannot read {}: {e}", p.display()))
        };
        return Ok(ServingCert {
            cert_pem: read(&cert)?,
            key_pem: read(&key)?,
            origin: format!("{} (--cert-dir)", cert.display()),
        });
    }
    let (cert_pem, key_pem) = self_signed(bind)?;
    write_pair(dir, &cert, &cert_pem, &key, &key_pem)
        .map_err(|e| format!("--cert-dir {}: {e}", dir.display()))?;
    Ok(ServingCert {
        cert_pem,
        key_pem,
        origin: format!("self-signed, written to {}", cert.display()),
    })
}

fn write_pair(
    dir: &Path,
    cert: &Path,
    cert_pem: &[u8],
    key: &Path,
    key_pem: &[u8],
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    // The key is written first and never readable by others, as upstream's keyutil.WriteKey:
    // never through a symlink (O_NOFOLLOW), only into a regular file, and with its mode set
    // whatever a file that was there had (a pre-created 0666 key file becomes 0600 before the
    // key is written into it).
    for (path, pem, mode) in [(key, key_pem, 0o600), (cert, cert_pem, 0o644)] {
        use std::os::unix::fs::PermissionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(mode)
            .open(path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        if !f.metadata()?.is_file() {
            return Err(std::io::Error::other(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.set_len(0)?;
        f.write_all(pem)?;
        f.sync_all()?;
    }
    Ok(())
}

/// A self-signed certificate (ECDSA P-256, a year from an hour ago) and its key, PEM. The
/// subject is `localhost@<unix time>`, as upstream names its generated certificates.
pub fn self_signed(bind: IpAddr) -> Result<(Vec<u8>, Vec<u8>), String> {
    let fail = |e: rcgen::Error| format!("cannot generate a self-signed certificate: {e}");
    let mut names = vec!["localhost".to_string(), Ipv4Addr::LOCALHOST.to_string()];
    if !bind.is_unspecified() && !bind.is_loopback() {
        names.push(bind.to_string());
    }
    let mut params = rcgen::CertificateParams::new(names).map_err(fail)?;
    let now = time::OffsetDateTime::now_utc();
    let mut subject = rcgen::DistinguishedName::new();
    subject.push(
        rcgen::DnType::CommonName,
        format!("localhost@{}", now.unix_timestamp()),
    );
    params.distinguished_name = subject;
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365);
    params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate().map_err(fail)?;
    let cert = params.self_signed(&key).map_err(fail)?;
    Ok((cert.pem().into_bytes(), key.serialize_pem().into_bytes()))
}

/// The secure port's TLS versions and cipher suites, from `--tls-min-version` and
/// `--tls-cipher-suites` (Go names). rustls serves TLS 1.2 and 1.3 and, of Go's suites, only
/// the AEAD ones with forward secrecy: asking for anything else is a start-up error (one line
/// per value, exit 2) rather than a flag silently not applied. As in Go, the suite list
/// governs TLS 1.2; TLS 1.3 suites stay all enabled unless the list names some of them
/// (then only those: stricter than Go, which cannot restrict TLS 1.3 suites).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// `--tls-min-version=VersionTLS13`.
    pub tls13_only: bool,
    /// The Go names asked for (empty: rustls's defaults).
    pub suites: Vec<String>,
}

/// Go's names of the suites rustls (ring) serves, and rustls's suite.
fn rustls_suite(go_name: &str) -> Option<rustls::SupportedCipherSuite> {
    use rustls::crypto::ring::cipher_suite as cs;
    Some(match go_name {
        "TLS_AES_128_GCM_SHA256" => cs::TLS13_AES_128_GCM_SHA256,
        "TLS_AES_256_GCM_SHA384" => cs::TLS13_AES_256_GCM_SHA384,
        "TLS_CHACHA20_POLY1305_SHA256" => cs::TLS13_CHACHA20_POLY1305_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305"
        | "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305" | "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ => return None,
    })
}

/// The Go suite names ccm-host serves, for messages.
pub const SERVED_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
];

impl TlsPolicy {
    /// The policy of the flags; `Err` holds one line per value ccm-host cannot serve (names
    /// Go does not know are reported by the caller, as upstream words it).
    pub fn from_flags(suites: &[String], min_version: Option<&str>) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();
        let tls13_only = match min_version.unwrap_or("") {
            "" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            old @ ("VersionTLS10" | "VersionTLS11") => {
                errors.push(format!(
                    "--tls-min-version: {old} is not supported: ccm-host serves TLS 1.2 and 1.3 \
                     only (VersionTLS12, the default, or VersionTLS13)"
                ));
                false
            }
            // Unknown names: reported by the flag validation as upstream does.
            _ => false,
        };
        for suite in suites {
            if rustls_suite(suite).is_none() && super::upstream_flags::is_go_cipher_suite(suite) {
                errors.push(format!(
                    "--tls-cipher-suites: {suite} is not supported: ccm-host serves only AEAD \
                     suites with forward secrecy (no CBC, RC4, 3DES or RSA key exchange): {}",
                    SERVED_SUITES.join(", ")
                ));
            }
        }
        if errors.is_empty() {
            Ok(TlsPolicy {
                tls13_only,
                suites: suites.to_vec(),
            })
        } else {
            Err(errors)
        }
    }

    /// The ring provider with this policy's suites.
    fn provider(&self) -> rustls::crypto::CryptoProvider {
        let mut provider = rustls::crypto::ring::default_provider();
        if self.suites.is_empty() {
            return provider;
        }
        let named: Vec<rustls::SupportedCipherSuite> =
            self.suites.iter().filter_map(|s| rustls_suite(s)).collect();
        let names_tls13 = named
            .iter()
            .any(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)));
        provider.cipher_suites.retain(|suite| match suite {
            rustls::SupportedCipherSuite::Tls13(_) if !names_tls13 => true,
            _ => named.iter().any(|n| n.suite() == suite.suite()),
        });
        provider
    }

    /// The protocol versions served: those at or above the minimum that have a suite.
    fn versions(
        &self,
        provider: &rustls::crypto::CryptoProvider,
    ) -> Vec<&'static rustls::SupportedProtocolVersion> {
        let has_tls12 = provider
            .cipher_suites
            .iter()
            .any(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)));
        let mut versions = vec![&rustls::version::TLS13];
        if has_tls12 && !self.tls13_only {
            versions.push(&rustls::version::TLS12);
        }
        versions
    }
}

/// The rustls server configuration for a certificate chain and key (PEM): TLS 1.2 and 1.3 (or
/// what `policy` narrows them to), HTTP/1.1 only; with a `client_ca`, client certificates are
/// asked for (not required) and must chain to it (a client certificate for client
/// authentication, or the handshake fails).
pub fn tls_config(
    cert: &ServingCert,
    client_ca: &[CertificateDer<'static>],
    policy: &TlsPolicy,
) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let certs = CertificateDer::pem_slice_iter(&cert.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", cert.origin))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in the file", cert.origin));
    }
    let key = PrivateKeyDer::from_pem_slice(&cert.key_pem)
        .map_err(|e| format!("the private key of {}: {e}", cert.origin))?;
    let provider = Arc::new(policy.provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&policy.versions(&provider))
        .map_err(|e| format!("--tls-cipher-suites / --tls-min-version: {e}"))?;
    let builder = if client_ca.is_empty() {
        builder.with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for ca in client_ca {
            roots
                .add(ca.clone())
                .map_err(|e| format!("client CA: {e}"))?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("client CA: {e}"))?;
        builder.with_client_cert_verifier(verifier)
    };
    builder
        .with_single_cert(certs, key)
        .map(|mut config| {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Arc::new(config)
        })
        .map_err(|e| format!("{}: {e}", cert.origin))
}

/// Start serving the endpoints on `--bind-address:--secure-port` (the caller checked the port is
/// not 0): the certificate, delegated authentication and authorization from the flags, the
/// default limits. Errors are start-up errors (exit 2).
pub async fn start(
    args: &super::RunArgs,
    settings: &super::RunSettings,
    health: super::http::Health,
    registry: Arc<prometheus_client::registry::Registry>,
    stop: &CancellationToken,
) -> Result<SocketAddr, String> {
    let addr = SocketAddr::new(args.bind_address, args.secure_port);
    let files = settings
        .tls
        .as_ref()
        .map(|(cert, key)| (cert.as_path(), key.as_path()));
    let cert = serving_cert(files, args.upstream.cert_dir.as_deref(), args.bind_address)?;
    let auth = super::delegated_auth::DelegatedAuth::new(args.upstream.auth_settings()).await?;
    let policy = args
        .upstream
        .tls_policy()
        .map_err(|errors| errors.join("; "))?;
    let tls = tls_config(&cert, auth.client_ca(), &policy)?;
    let auth_summary = auth.describe();
    let bound = super::http::serve(
        addr,
        tls,
        Arc::new(auth),
        DEFAULT_LIMITS,
        health,
        registry,
        stop.clone(),
    )
    .await
    .map_err(|e| format!("cannot listen on {addr} (--bind-address/--secure-port): {e}"))?;
    tracing::info!(
        certificate = cert.origin,
        "serving /healthz, /readyz and /metrics on https://{bound} ({auth_summary})"
    );
    Ok(bound)
}

// ---- connections ----

/// Where a connection is, for the cap's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Accepted; the client has not sent a byte yet.
    Silent,
    /// The client spoke: TLS handshake in progress. Never closed for a newer connection.
    Handshake,
    /// Handshake done: serving requests, or idle between them.
    Established,
}

struct Conn {
    stage: Stage,
    /// When the connection was accepted or last started or finished a request.
    last_active: Instant,
    /// Requests in a handler right now.
    busy: u32,
    /// Cancelled to close the connection at once.
    close: CancellationToken,
}

/// The live connections, for the cap and the idle timeout.
struct Conns {
    live: Mutex<HashMap<u64, Conn>>,
    /// Ids of connections admitted silent, oldest first (locked after `live`): the cap's
    /// victim in O(1) under a flood. Entries that left the silent stage or closed are skipped
    /// when met, and dropped when the queue outgrows twice the cap.
    silent: Mutex<std::collections::VecDeque<u64>>,
    next_id: std::sync::atomic::AtomicU64,
    max: usize,
    /// When the cap last made us close a connection (for a rate-limited warning).
    last_cap_warning: Mutex<Option<Instant>>,
}

impl Conns {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Register a new connection; at the cap, first close the oldest silent one, else the
    /// longest idle established one. `None` when every connection is in its handshake or in a
    /// request: those are never closed for a newer connection.
    fn admit(self: &Arc<Self>, spoke: bool) -> Option<ConnHandle> {
        let mut live = self.lock();
        if live.len() >= self.max {
            let oldest = |stage: Stage| {
                live.iter()
                    .filter(|(_, c)| c.stage == stage && c.busy == 0)
                    .min_by_key(|(_, c)| c.last_active)
                    .map(|(id, _)| *id)
            };
            let oldest_silent = {
                let mut silent = self.silent.lock().unwrap_or_else(|p| p.into_inner());
                std::iter::from_fn(|| silent.pop_front()).find(|id| {
                    live.get(id)
                        .is_some_and(|c| c.stage == Stage::Silent && c.busy == 0)
                })
            };
            let victim = oldest_silent
                .map(|id| (id, "closed the oldest silent connection to admit a new one"))
                .or_else(|| {
                    oldest(Stage::Established)
                        .map(|id| (id, "closed the longest idle connection to admit a new one"))
                });
            let Some((victim, what)) = victim else {
                let handshaking = live
                    .values()
                    .filter(|c| c.stage == Stage::Handshake)
                    .count();
                drop(live);
                self.warn_cap(&format!(
                    "every connection is in its handshake ({handshaking}) or in a request: refused a new connection"
                ));
                return None;
            };
            if let Some(c) = live.remove(&victim) {
                c.close.cancel();
            }
            drop(live);
            self.warn_cap(what);
            live = self.lock();
        }
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let close = CancellationToken::new();
        live.insert(
            id,
            Conn {
                stage: if spoke {
                    Stage::Handshake
                } else {
                    Stage::Silent
                },
                last_active: Instant::now(),
                busy: 0,
                close: close.clone(),
            },
        );
        if !spoke {
            let mut silent = self.silent.lock().unwrap_or_else(|p| p.into_inner());
            silent.push_back(id);
            if silent.len() > 2 * self.max {
                silent.retain(|id| live.get(id).is_some_and(|c| c.stage == Stage::Silent));
            }
        }
        Some(ConnHandle {
            conns: self.clone(),
            id,
            close,
        })
    }

    fn warn_cap(&self, what: &str) {
        let mut last = self
            .last_cap_warning
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            *last = Some(Instant::now());
            tracing::warn!(
                "secure port: {} connections open (the cap): {what} (logged at most once a minute)",
                self.max
            );
        } else {
            tracing::debug!("secure port: connection cap: {what}");
        }
    }
}

/// Whether the client of the just-accepted socket `fd` has sent something (a non-blocking
/// `MSG_PEEK` of one byte).
#[allow(unsafe_code)] // recv(2) with MSG_PEEK on a descriptor number
fn has_spoken(fd: std::os::fd::RawFd) -> bool {
    let mut byte = 0u8;
    // SAFETY: `fd` is the open socket of a TcpStream the caller holds; a one-byte buffer of
    // ours; MSG_PEEK | MSG_DONTWAIT neither consumes data nor blocks.
    let n = unsafe {
        libc::recv(
            fd,
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// One admitted connection; dropping it forgets the connection.
struct ConnHandle {
    conns: Arc<Conns>,
    id: u64,
    close: CancellationToken,
}

impl ConnHandle {
    fn update(&self, f: impl FnOnce(&mut Conn)) {
        if let Some(c) = self.conns.lock().get_mut(&self.id) {
            f(c);
        }
    }

    /// How long the connection has been idle (`None` while a request is in a handler).
    fn idle_for(&self) -> Option<Duration> {
        self.conns
            .lock()
            .get(&self.id)
            .and_then(|c| (c.busy == 0).then(|| c.last_active.elapsed()))
    }

    /// Mark a request in a handler until the guard is dropped.
    fn request(self: &Arc<Self>) -> RequestGuard {
        self.update(|c| {
            c.busy += 1;
            c.last_active = Instant::now();
        });
        RequestGuard(self.clone())
    }
}

impl Drop for ConnHandle {
    fn drop(&mut self) {
        self.conns.lock().remove(&self.id);
    }
}

struct RequestGuard(Arc<ConnHandle>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.update(|c| {
            c.busy = c.busy.saturating_sub(1);
            c.last_active = Instant::now();
        });
    }
}

/// TCP_DEFER_ACCEPT of 1 s on the listening socket: the kernel hands a connection to the
/// accept loop when its client has sent data (a TLS client's ClientHello follows its connect
/// at once), or after about a second of silence; connections closed before that never reach
/// the host. A flood of new connections that send nothing then costs the kernel, not the
/// accept loop, and cannot fill the accept queue ahead of the kubelet's probe. A silent client
/// is accepted after that second and then gets the handshake timeout as before. Not set by
/// Go (upstream); failing to set it (another OS) only loses the protection.
#[allow(unsafe_code)] // setsockopt(2)
fn defer_accept(socket: &tokio::net::TcpSocket) {
    use std::os::fd::AsRawFd;
    let seconds: libc::c_int = 1;
    // SAFETY: an int option on the socket's own open descriptor.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const seconds).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "secure port: TCP_DEFER_ACCEPT not set: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The kernel's `net.core.somaxconn` (the longest accept queue it allows), 4096 when unreadable.
fn listen_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(4096)
}

/// Serve `app` over HTTPS on `addr` until `stop` is cancelled; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
) -> std::io::Result<SocketAddr> {
    // The listen backlog as Go's net package sets it (upstream): the kernel's somaxconn, not
    // tokio's 1024. A full accept queue drops new SYNs, and a dropped SYN costs the client a
    // 1 s retransmission, the kubelet's whole probe timeout: under a flood of new connections
    // the longer queue keeps the probe's connect from failing while the accept loop catches up.
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    defer_accept(&socket);
    socket.bind(addr)?;
    let listener = socket.listen(listen_backlog())?;
    let local = listener.local_addr()?;
    let conns = Arc::new(Conns {
        live: Mutex::new(HashMap::new()),
        silent: Mutex::new(std::collections::VecDeque::new()),
        next_id: std::sync::atomic::AtomicU64::new(0),
        max: limits.max_connections.max(1),
        last_cap_warning: Mutex::new(None),
    });
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = stop.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // E.g. out of file descriptors: back off instead of spinning.
                        tracing::warn!("secure port: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            use std::os::fd::AsRawFd;
            let fd = tcp.as_raw_fd();
            let Some(handle) = conns.admit(has_spoken(fd)) else {
                drop(tcp);
                continue;
            };
            tokio::spawn(connection(
                tcp,
                peer,
                acceptor.clone(),
                app.clone(),
                limits,
                Arc::new(handle),
                stop.clone(),
            ));
        }
    });
    Ok(local)
}

async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    limits: Limits,
    handle: Arc<ConnHandle>,
    stop: CancellationToken,
) {
    let close = handle.close.clone();
    let handshake_deadline = tokio::time::Instant::now() + limits.handshake_timeout;
    // Silent until the client's first byte (its ClientHello): at the cap silent connections
    // are closed first. (`peek`, not `readable`: a just-accepted socket reads as readable.)
    let mut first = [0u8; 1];
    tokio::select! {
        _ = close.cancelled() => return,
        _ = stop.cancelled() => return,
        spoke = tokio::time::timeout_at(handshake_deadline, tcp.peek(&mut first)) => match spoke {
            Ok(Ok(0)) => return,
            Ok(Ok(_)) => handle.update(|c| c.stage = Stage::Handshake),
            Ok(Err(e)) => {
                tracing::debug!(%peer, "secure port: connection failed before the handshake: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "secure port: TLS handshake timed out (nothing sent)");
                return;
            }
        },
    }
    let stream = tokio::select! {
        _ = close.cancelled() => return,
        _ = stop.cancelled() => return,
        accepted = tokio::time::timeout_at(handshake_deadline, acceptor.accept(tcp)) => match accepted {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                tracing::debug!(%peer, "secure port: TLS handshake failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "secure port: TLS handshake timed out");
                return;
            }
        },
    };
    handle.update(|c| {
        c.stage = Stage::Established;
        c.last_active = Instant::now();
    });
    // The client certificate the handshake verified, for authentication.
    let peer_certificate = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|c| PeerCertificate(c.clone().into_owned()));
    let service = {
        let handle = handle.clone();
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            let guard = handle.request();
            if let Some(c) = &peer_certificate {
                req.extensions_mut().insert(c.clone());
            }
            let app = app.clone();
            async move {
                let response = tower::ServiceExt::oneshot(app, req).await;
                drop(guard);
                response
            }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut tick = tokio::time::interval((limits.idle_timeout / 4).max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(%peer, "secure port: connection closed: {e}");
                }
                return;
            }
            // Closed to admit another (the cap): dropping the connection closes it.
            _ = close.cancelled() => {
                tracing::debug!(%peer, "secure port: closed an idle connection (connection cap)");
                return;
            }
            _ = stop.cancelled() => {
                conn.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(Duration::from_secs(2), conn.as_mut()).await;
                return;
            }
            _ = tick.tick() => {
                if handle.idle_for().is_some_and(|idle| idle >= limits.idle_timeout) {
                    tracing::debug!(%peer, "secure port: closed an idle connection (idle timeout)");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conns(max: usize) -> Arc<Conns> {
        Arc::new(Conns {
            live: Mutex::new(HashMap::new()),
            silent: Mutex::new(std::collections::VecDeque::new()),
            next_id: std::sync::atomic::AtomicU64::new(0),
            max,
            last_cap_warning: Mutex::new(None),
        })
    }

    fn stage(h: &ConnHandle, stage: Stage) {
        h.update(|c| c.stage = stage);
    }

    #[test]
    fn the_cap_closes_silent_connections_first_and_never_one_in_its_handshake() {
        let conns = conns(3);
        let kubelet = conns.admit(false).unwrap();
        stage(&kubelet, Stage::Handshake);
        let flood: Vec<ConnHandle> = (0..2).map(|_| conns.admit(false).unwrap()).collect();
        // Newer silent connections go first, oldest first; the handshake stays.
        let newer = conns.admit(false).unwrap();
        assert!(flood[0].close.is_cancelled() && !flood[1].close.is_cancelled());
        let _newest = conns.admit(false).unwrap();
        assert!(flood[1].close.is_cancelled());
        assert!(!kubelet.close.is_cancelled());
        // Only handshakes left (and silent ones turned into handshakes): refused.
        stage(&newer, Stage::Handshake);
        stage(&_newest, Stage::Handshake);
        assert!(conns.admit(false).is_none());
        assert!(!kubelet.close.is_cancelled());
    }

    #[test]
    fn a_connection_whose_client_spoke_before_its_accept_is_never_the_silent_victim() {
        let conns = conns(2);
        // The probe's ClientHello was waiting when it was accepted: admitted in its handshake.
        let probe = conns.admit(true).unwrap();
        let flood: Vec<ConnHandle> = (0..100).map(|_| conns.admit(false).unwrap()).collect();
        assert!(!probe.close.is_cancelled());
        assert!(flood[..99].iter().all(|f| f.close.is_cancelled()));
        assert!(!flood[99].close.is_cancelled());
        // The queue of silent ids stays bounded although most of it is stale.
        assert!(conns.silent.lock().unwrap().len() <= 4);
    }

    #[test]
    fn the_cap_closes_the_longest_idle_connection_and_never_a_busy_one() {
        let conns = conns(2);
        let a = Arc::new(conns.admit(false).unwrap());
        let b = Arc::new(conns.admit(false).unwrap());
        stage(&a, Stage::Established);
        stage(&b, Stage::Established);
        // `a` is in a request, so `b` is the one to close although it is newer.
        let in_request = a.request();
        let c = conns.admit(false).unwrap();
        assert!(b.close.is_cancelled());
        assert!(!a.close.is_cancelled());
        assert!(b.idle_for().is_none(), "forgotten once closed");
        assert!(a.idle_for().is_none(), "busy");
        // Both remaining connections busy: a new one is refused.
        stage(&c, Stage::Established);
        let _c_busy = Arc::new(c).request();
        assert!(conns.admit(false).is_none());
        drop(in_request);
        assert!(a.idle_for().is_some());
        let d = conns.admit(false).unwrap();
        stage(&d, Stage::Established);
        assert!(a.close.is_cancelled());
        drop(d);
        assert_eq!(conns.lock().len(), 1);
    }

    #[test]
    fn generated_certificates_load_and_cert_dir_keeps_its_pair() {
        let (cert, key) = self_signed(IpAddr::from([10, 1, 2, 3])).unwrap();
        let generated = ServingCert {
            cert_pem: cert,
            key_pem: key,
            origin: "test".into(),
        };
        tls_config(&generated, &[], &TlsPolicy::default()).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        let unspecified = IpAddr::from([0, 0, 0, 0]);
        let first = serving_cert(None, Some(&certs), unspecified).unwrap();
        assert!(
            first.origin.starts_with("self-signed, written to"),
            "{}",
            first.origin
        );
        use std::os::unix::fs::PermissionsExt;
        let key_mode = std::fs::metadata(certs.join("cloud-controller-manager.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(key_mode & 0o777, 0o600);
        let second = serving_cert(None, Some(&certs), unspecified).unwrap();
        assert!(second.origin.ends_with("(--cert-dir)"), "{}", second.origin);
        assert_eq!(
            first.cert_pem, second.cert_pem,
            "read back, not regenerated"
        );
        tls_config(&second, &[], &TlsPolicy::default()).unwrap();
        let in_memory = serving_cert(None, None, unspecified).unwrap();
        assert_eq!(in_memory.origin, "self-signed, in memory");
        assert_ne!(in_memory.cert_pem, first.cert_pem);

        // A planted symlink is not followed, and a pre-created world-writable key file ends
        // up 0600.
        let planted = dir.path().join("planted");
        std::fs::create_dir(&planted).unwrap();
        let target = dir.path().join("elsewhere.crt");
        std::os::unix::fs::symlink(&target, planted.join("cloud-controller-manager.crt")).unwrap();
        let e = serving_cert(None, Some(&planted), unspecified)
            .err()
            .unwrap();
        assert!(e.contains("cloud-controller-manager.crt"), "{e}");
        assert!(!target.exists(), "the symlink's target was not written");
        let open = dir.path().join("open");
        std::fs::create_dir(&open).unwrap();
        let key = open.join("cloud-controller-manager.key");
        std::fs::write(&key, "").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o666)).unwrap();
        serving_cert(None, Some(&open), unspecified).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let garbage = dir.path().join("garbage.pem");
        std::fs::write(&garbage, "hello").unwrap();
        let bad = serving_cert(Some((&garbage, &garbage)), None, unspecified).unwrap();
        assert!(tls_config(&bad, &[], &TlsPolicy::default())
            .unwrap_err()
            .contains("no PEM certificate"));
    }
}
