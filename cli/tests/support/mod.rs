//! Helpers for tests that run `ccm-host` as real processes: the fake plugin built by cargo, a
//! seeded random generator, and host replicas whose log goes to a file and is parsed as it
//! grows.

// Shared by test targets that each use only part of it.
#![allow(dead_code)]

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Instant;

#[allow(unused_imports)] // not every process test waits
pub use ccm_test_support::{built_plugin, plugin_dir_with, wait_until};

/// The `ccm-host` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_ccm-host");

/// The fake plugin cargo built for this test run (a dev-dependency), copied into `dir/plugins`.
pub fn plugin_dir(dir: &Path) -> PathBuf {
    plugin_dir_with(dir, &["libccm_provider_fake.so"])
}

/// SplitMix64: a small, seedable generator whose sequence never changes between versions, so a
/// printed seed replays the same scenario.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        self.next_u64() % n
    }

    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// An index chosen with the given weights (not all zero).
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut x = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        unreachable!("weights sum to {total}")
    }
}

/// A seed from the clock, for runs that do not ask for one.
pub fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    Rng::new(nanos ^ u64::from(std::process::id())).next_u64()
}

/// What a replica's JSON log said so far.
#[derive(Debug, Default, Clone)]
pub struct LogFacts {
    /// The leader-election identity (from "waiting for the lease").
    pub identity: Option<String>,
    /// It logged "became leader".
    pub became_leader: bool,
    /// It logged "leaderelection lost".
    pub lost_lease: bool,
    /// Lines that report a panic of the host itself (not a provider panic caught at the ABI).
    pub host_panics: Vec<String>,
    /// ERROR-level lines.
    pub errors: u64,
    /// The last lines, for reports.
    pub tail: Vec<String>,
}

/// One `ccm-host run` process with its stderr in a file.
pub struct Replica {
    /// Name used in reports (`a1`, `b3`, ...).
    pub name: String,
    /// The process.
    pub child: Child,
    /// Its stderr.
    pub log: PathBuf,
    /// When it was started.
    pub started: Instant,
    /// How it ended, once it has.
    pub exit: Option<ExitStatus>,
    /// The test killed it.
    pub killed: bool,
    /// What its log said.
    pub facts: LogFacts,
    offset: u64,
    partial: String,
    panic_pending: bool,
}

impl Replica {
    /// Start `ccm-host run` with `args`; stderr goes to `log`, logs are JSON.
    pub fn start(name: &str, args: &[String], log: PathBuf, rust_log: &str) -> Replica {
        let stderr = File::create(&log).expect("create replica log");
        let child = Command::new(BIN)
            .arg("run")
            .args(args)
            .env("RUST_LOG", rust_log)
            .env("CCM_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("ccm-host starts");
        Replica {
            name: name.to_string(),
            child,
            log,
            started: Instant::now(),
            exit: None,
            killed: false,
            facts: LogFacts::default(),
            offset: 0,
            partial: String::new(),
            panic_pending: false,
        }
    }

    /// Still running (as far as the last [`Replica::poll`] knows).
    pub fn alive(&self) -> bool {
        self.exit.is_none()
    }

    /// Read new log lines and notice an exit.
    pub fn poll(&mut self) {
        self.read_log();
        if self.exit.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
                self.read_log();
            }
        }
    }

    /// SIGKILL (no chance to release the lease) and wait for the process to end.
    pub fn kill(&mut self) {
        if self.exit.is_none() {
            self.killed = true;
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
        self.read_log();
    }

    fn read_log(&mut self) {
        let Ok(mut f) = File::open(&self.log) else {
            return;
        };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = Vec::new();
        if f.read_to_end(&mut buf).is_err() {
            return;
        }
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let complete: String = self.partial.drain(..=end).collect();
        for line in complete.lines() {
            self.line(line);
        }
    }

    fn line(&mut self, line: &str) {
        if self.facts.tail.len() == 40 {
            self.facts.tail.remove(0);
        }
        self.facts.tail.push(line.chars().take(400).collect());
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            // Not a log record: the default panic hook of the host (a task or thread panic) prints
            // "thread '...' panicked at file:line:" and the message on the next line.
            if self.panic_pending {
                self.panic_pending = false;
                if let Some(last) = self.facts.host_panics.last_mut() {
                    last.push_str(" | ");
                    last.push_str(line);
                }
            } else if line.contains("panicked at") {
                self.facts.host_panics.push(line.to_string());
                self.panic_pending = true;
            }
            return;
        };
        let message = v["fields"]["message"].as_str().unwrap_or_default();
        if v["level"] == "ERROR" {
            self.facts.errors += 1;
        }
        if message.starts_with("waiting for the lease") {
            self.facts.identity = v["fields"]["identity"].as_str().map(str::to_string);
        } else if message.starts_with("became leader") {
            self.facts.became_leader = true;
        } else if message.starts_with("leaderelection lost") {
            self.facts.lost_lease = true;
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// HTTPS requests to a host's secure port, as the kubelet's probes and a metrics scraper make
/// them: the server's certificate is not verified (it is self-signed unless a test gives one), or
/// verified against given roots.
pub mod https {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::time::Duration;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};

    /// The bearer token tests register with the in-memory API server (see
    /// [`allow_test_token`]).
    pub const TEST_TOKEN: &str = "ccm-host-test-token";

    /// Register [`TEST_TOKEN`] as user `ccm-test`, allowed to get every path, with the API
    /// server the host delegates authentication and authorization to.
    pub fn allow_test_token(server: &kube_apiserver_inmem::ApiServer) {
        let ctl = server.controls();
        ctl.add_token(TEST_TOKEN, "ccm-test", &[]);
        ctl.allow_non_resource("ccm-test", &["get"], &["*"]);
    }

    /// Accepts any server certificate (like `curl -k` or a probe with scheme HTTPS).
    #[derive(Debug)]
    struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

    impl ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// A client configuration that accepts any server certificate.
    pub fn any_cert() -> Arc<rustls::ClientConfig> {
        let provider = provider();
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_no_client_auth();
        Arc::new(config)
    }

    /// Like [`any_cert`], offering only the TLS `versions` and the cipher `suites` of ring.
    pub fn any_cert_offering(
        versions: &[&'static rustls::SupportedProtocolVersion],
        suites: &[rustls::SupportedCipherSuite],
    ) -> Arc<rustls::ClientConfig> {
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = suites.to_vec();
        let provider = Arc::new(provider);
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_no_client_auth();
        Arc::new(config)
    }

    /// Like [`any_cert`], presenting a client certificate (chain and key).
    pub fn any_cert_with_client_cert(
        chain: Vec<CertificateDer<'static>>,
        key: rustls::pki_types::PrivateKeyDer<'static>,
    ) -> Arc<rustls::ClientConfig> {
        let provider = provider();
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
            .with_client_auth_cert(chain, key)
            .unwrap();
        Arc::new(config)
    }

    /// A client configuration that trusts only `roots`.
    pub fn trusting(roots: &[CertificateDer<'static>]) -> Arc<rustls::ClientConfig> {
        let mut store = rustls::RootCertStore::empty();
        for cert in roots {
            store.add(cert.clone()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(store)
            .with_no_client_auth();
        Arc::new(config)
    }

    /// A TLS connection to `127.0.0.1:port`, handshake done, presenting `name` (SNI and the
    /// name the certificate is checked against).
    pub fn connect(
        port: u16,
        config: Arc<rustls::ClientConfig>,
        name: &str,
    ) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>> {
        let tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let conn = rustls::ClientConnection::new(config, name)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock)?;
        }
        Ok(tls)
    }

    /// The certificate the server presents.
    pub fn server_cert(port: u16) -> std::io::Result<CertificateDer<'static>> {
        let tls = connect(port, any_cert(), "localhost")?;
        tls.conn
            .peer_certificates()
            .and_then(|certs| certs.first().cloned())
            .ok_or_else(|| std::io::Error::other("no server certificate"))
    }

    /// GET `path` over `config`'s TLS with an optional bearer token; (status, body).
    pub fn get_with(
        port: u16,
        config: Arc<rustls::ClientConfig>,
        name: &str,
        path: &str,
        token: Option<&str>,
    ) -> std::io::Result<(u16, String)> {
        let mut tls = connect(port, config, name)?;
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
        )?;
        tls.flush()?;
        let mut out = Vec::new();
        // The server may close without a TLS close_notify once the response is written.
        if let Err(e) = tls.read_to_end(&mut out) {
            if out.is_empty() {
                return Err(e);
            }
        }
        let out = String::from_utf8_lossy(&out).into_owned();
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {out:?}")))?;
        let body = out
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    /// GET `path` accepting any server certificate, with an optional bearer token.
    pub fn get(port: u16, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
        get_with(port, any_cert(), "localhost", path, token)
    }
}

/// A TCP port free on 127.0.0.1 right now (for a daemon's --secure-port).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
