//! The secure port of `ccm-host run` as a real process, as upstream's: HTTPS with a self-signed
//! certificate (or `--cert-dir`'s), delegated authentication (TokenReview) and authorization
//! (SubjectAccessReview) through the in-memory API server with the caches and always-allowed
//! paths of the flags, and clients that cannot hold the port: a slow client is dropped at the
//! header or handshake timeout, and 2,000 idle connections at a 1024 file descriptor limit do
//! not keep `/healthz` from answering.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube_apiserver_inmem::ApiServer;
use serde_json::Value;

mod support;

use support::{free_port, https, plugin_dir, BIN};

const TOKEN_REVIEWS: &str = "tokenreviews.authentication.k8s.io";
const ACCESS_REVIEWS: &str = "subjectaccessreviews.authorization.k8s.io";

/// A `ccm-host run` process (fake provider, no leader election, only the node controller)
/// whose secure port answers.
struct Host {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Host {
    /// Start with `flags` (after `--kubeconfig` and the port); `fd_limit` runs it under
    /// `ulimit -n`. Returns once `/healthz` answers 200.
    fn start(
        dir: &Path,
        name: &str,
        kubeconfig: &Path,
        flags: &[&str],
        fd_limit: Option<u32>,
    ) -> Host {
        Self::start_bin(BIN, dir, name, kubeconfig, flags, fd_limit)
    }

    /// [`Host::start`] with another `ccm-host` binary.
    fn start_bin(
        bin: &str,
        dir: &Path,
        name: &str,
        kubeconfig: &Path,
        flags: &[&str],
        fd_limit: Option<u32>,
    ) -> Host {
        let port = free_port();
        let log = dir.join(format!("{name}.log"));
        let config = dir.join(format!("cloud-{name}.yaml"));
        let state = dir.join(format!("state-{name}"));
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(&config, format!("stateDir: {}\n", state.display())).unwrap();
        let mut cmd = match fd_limit {
            Some(n) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\""), bin]);
                sh
            }
            None => Command::new(bin),
        };
        cmd.arg("run")
            .arg("--plugin-dir")
            .arg(plugin_dir(dir))
            .args(["--cloud-provider", "fake", "--cloud-config"])
            .arg(&config)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &port.to_string(),
            ])
            .args(["--leader-elect=false", "--controllers=cloud-node"])
            .args(flags)
            // Not in a cluster, whatever the environment says: without the kubeconfig flags,
            // delegated authentication and authorization are off.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("RUST_LOG", "info,ccm_host::daemon=debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let mut host = Host {
            child: cmd.spawn().expect("ccm-host starts"),
            port,
            log,
        };
        let started = Instant::now();
        loop {
            if let Ok((200, _)) = https::get(port, "/healthz", None) {
                return host;
            }
            if let Ok(Some(status)) = host.child.try_wait() {
                panic!("ccm-host exited with {status}:\n{}", host.log());
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no /healthz within 60s:\n{}",
                host.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        https::get(self.port, path, token).unwrap_or_else(|e| {
            panic!("GET {path}: {e}\n{}", self.log());
        })
    }

    /// Open file descriptors of the process.
    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    (dir, kubeconfig)
}

fn reviews(server: &ApiServer, resource: &str) -> usize {
    server
        .controls()
        .requests()
        .iter()
        .filter(|r| r.resource == resource && r.verb == "create")
        .count()
}

fn status_json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not a Status ({e}): {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_metrics_are_refused_and_authorized_metrics_served() {
    let server = ApiServer::start().await.unwrap();
    let (dir, kubeconfig) = setup();
    server.write_kubeconfig(&kubeconfig).unwrap();
    let ctl = server.controls();
    ctl.add_token("prometheus-token", "prometheus", &["monitoring"]);
    ctl.allow_non_resource("monitoring", &["get"], &["/metrics"]);
    ctl.add_token("other-token", "someone", &[]);
    let kc = kubeconfig.to_str().unwrap();
    let auth_flags = [
        format!("--authentication-kubeconfig={kc}"),
        format!("--authorization-kubeconfig={kc}"),
    ];
    let mut flags: Vec<&str> = auth_flags.iter().map(String::as_str).collect();
    flags.extend([
        "--authentication-token-webhook-cache-ttl=5m",
        "--authorization-webhook-cache-authorized-ttl=5m",
        "--authorization-webhook-cache-unauthorized-ttl=5m",
    ]);
    let host = tokio::task::block_in_place(|| {
        Host::start(dir.path(), "cached", &kubeconfig, &flags, None)
    });
    tokio::task::block_in_place(|| {
        // The always-allowed paths need nothing.
        assert_eq!(host.get("/healthz", None), (200, "ok".into()));
        assert_eq!(host.get("/readyz", None).0, 200);
        // ?verbose lists the checks, as upstream's.
        let (code, body) = host.get("/healthz?verbose", None);
        assert_eq!(code, 200, "{body}");
        assert!(
            body.starts_with("[+]") && body.contains("[+]cloud-node-controller ok\n"),
            "{body}"
        );
        assert!(body.ends_with("healthz check passed\n"), "{body}");
        let (code, body) = host.get("/readyz?verbose", None);
        assert_eq!(code, 200, "{body}");
        assert!(body.ends_with("readyz check passed\n"), "{body}");
        // Anonymous: asked, denied, 403 with upstream's Status.
        let (code, body) = host.get("/metrics", None);
        assert_eq!(code, 403, "{body}");
        let status = status_json(&body);
        assert_eq!(status["reason"], "Forbidden");
        assert_eq!(
            status["message"],
            "forbidden: User \"system:anonymous\" cannot get path \"/metrics\""
        );
        assert!(!body.contains("ccm_provider"), "no metrics leak: {body}");
        // A token the API server does not accept: 401, on every path (as upstream).
        for path in ["/metrics", "/healthz"] {
            let (code, body) = host.get(path, Some("wrong-token"));
            assert_eq!(code, 401, "{path}: {body}");
            assert_eq!(status_json(&body)["reason"], "Unauthorized");
        }
        // Authenticated but not allowed.
        let (code, body) = host.get("/metrics", Some("other-token"));
        assert_eq!(code, 403);
        assert!(
            body.contains("User \\\"someone\\\" cannot get path"),
            "{body}"
        );

        // Allowed: served. Reviewed once, then answered from the caches.
        ctl.clear_requests();
        for _ in 0..5 {
            let (code, body) = host.get("/metrics", Some("prometheus-token"));
            assert_eq!(code, 200, "{body}");
            assert!(
                body.contains("# TYPE node_controller_initial_node_sync_delay_seconds histogram"),
                "{body}"
            );
        }
        assert_eq!(reviews(&server, TOKEN_REVIEWS), 1);
        assert_eq!(reviews(&server, ACCESS_REVIEWS), 1);
        let review = ctl
            .requests()
            .into_iter()
            .find(|r| r.resource == ACCESS_REVIEWS)
            .unwrap();
        let spec = &review.json()["spec"];
        assert_eq!(spec["user"], "prometheus");
        assert_eq!(
            spec["groups"],
            serde_json::json!(["monitoring", "system:authenticated"])
        );
        assert_eq!(
            spec["nonResourceAttributes"],
            serde_json::json!({"path": "/metrics", "verb": "get"})
        );
        assert!(
            review
                .user_agent
                .ends_with("ccm-host/delegated-authorization"),
            "{}",
            review.user_agent
        );
        // A revoked token keeps working until its cached review expires (5m here).
        ctl.remove_token("prometheus-token");
        assert_eq!(host.get("/metrics", Some("prometheus-token")).0, 200);
        let (code, _) = host.get("/healthz/cloud-node-controller", Some("prometheus-token"));
        assert_eq!(code, 403, "the rule allows /metrics only");
    });
    drop(host);

    // No caches, /metrics always allowed, /readyz not.
    flags.truncate(2);
    flags.extend([
        "--authentication-token-webhook-cache-ttl=0s",
        "--authorization-webhook-cache-authorized-ttl=0s",
        "--authorization-webhook-cache-unauthorized-ttl=0s",
        "--authorization-always-allow-paths=/healthz,/metrics",
    ]);
    let host = tokio::task::block_in_place(|| {
        Host::start(dir.path(), "uncached", &kubeconfig, &flags, None)
    });
    tokio::task::block_in_place(|| {
        assert_eq!(host.get("/metrics", None).0, 200, "always allowed");
        assert_eq!(host.get("/readyz", None).0, 403, "no longer always allowed");
        ctl.add_token("fresh-token", "prometheus", &["monitoring"]);
        ctl.allow_non_resource("monitoring", &["get"], &["/readyz"]);
        ctl.clear_requests();
        for _ in 0..3 {
            assert_eq!(host.get("/readyz", Some("fresh-token")).0, 200);
        }
        assert_eq!(reviews(&server, TOKEN_REVIEWS), 3, "no token cache");
        assert_eq!(reviews(&server, ACCESS_REVIEWS), 3, "no access cache");
        // The API server failing: authentication fails closed (401), authorization is an
        // error (500), as upstream.
        ctl.fail_next(1, "create", TOKEN_REVIEWS, 500);
        assert_eq!(host.get("/readyz", Some("fresh-token")).0, 401);
        ctl.fail_next(1, "create", ACCESS_REVIEWS, 500);
        assert_eq!(host.get("/readyz", Some("fresh-token")).0, 500);
        assert_eq!(host.get("/readyz", Some("fresh-token")).0, 200);
        ctl.remove_token("fresh-token");
        assert_eq!(
            host.get("/readyz", Some("fresh-token")).0,
            401,
            "revoked at once"
        );
    });
    drop(host);

    // Without the kubeconfig flags, outside a cluster: tokens are not checked, nothing is
    // asked, only the always-allowed paths are served.
    let host =
        tokio::task::block_in_place(|| Host::start(dir.path(), "off", &kubeconfig, &[], None));
    tokio::task::block_in_place(|| {
        ctl.clear_requests();
        assert_eq!(host.get("/healthz", Some("other-token")).0, 200);
        assert_eq!(host.get("/metrics", Some("other-token")).0, 403);
        assert_eq!(host.get("/metrics", None).0, 403);
        assert_eq!(
            reviews(&server, TOKEN_REVIEWS) + reviews(&server, ACCESS_REVIEWS),
            0
        );
        let log = host.log();
        assert!(
            log.contains("no --authentication-kubeconfig given and not running in a cluster"),
            "{log}"
        );
    });
}

/// PEM certificates in a file, as DER.
fn pem_certs(path: &Path) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_by_default_with_a_self_signed_certificate_or_cert_dirs() {
    let server = ApiServer::start().await.unwrap();
    let (dir, kubeconfig) = setup();
    server.write_kubeconfig(&kubeconfig).unwrap();
    tokio::task::block_in_place(|| {
        // In memory: a certificate valid for localhost and 127.0.0.1, new at each start.
        let host = Host::start(dir.path(), "memory", &kubeconfig, &[], None);
        let cert = https::server_cert(host.port).unwrap();
        let trusting = https::trusting(std::slice::from_ref(&cert));
        for name in ["localhost", "127.0.0.1"] {
            let answer = https::get_with(host.port, trusting.clone(), name, "/healthz", None);
            assert_eq!(answer.unwrap().0, 200, "valid for {name}");
        }
        assert!(
            https::get_with(host.port, trusting, "example.com", "/healthz", None).is_err(),
            "not valid for another name"
        );
        // Plain HTTP gets no HTTP answer.
        let mut plain = std::net::TcpStream::connect(("127.0.0.1", host.port)).unwrap();
        plain
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        plain
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut out = Vec::new();
        let _ = plain.read_to_end(&mut out);
        assert!(
            !out.starts_with(b"HTTP/"),
            "{:?}",
            String::from_utf8_lossy(&out)
        );
        assert!(
            host.log()
                .contains("certificate=\"self-signed, in memory\""),
            "{}",
            host.log()
        );
        let again = Host::start(dir.path(), "memory-2", &kubeconfig, &[], None);
        assert_ne!(
            https::server_cert(again.port).unwrap(),
            cert,
            "a new one each start"
        );
        drop((host, again));

        // --cert-dir: generated and written once (key 0600), then read back.
        let certs = dir.path().join("certs");
        let flag = format!("--cert-dir={}", certs.display());
        let first = Host::start(dir.path(), "dir-1", &kubeconfig, &[&flag], None);
        let file = certs.join("cloud-controller-manager.crt");
        let served = https::server_cert(first.port).unwrap();
        assert_eq!(pem_certs(&file), std::slice::from_ref(&served));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(certs.join("cloud-controller-manager.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        drop(first);
        let second = Host::start(dir.path(), "dir-2", &kubeconfig, &[&flag], None);
        assert_eq!(
            https::server_cert(second.port).unwrap(),
            served,
            "the same pair"
        );
    });
}

/// Whether the server closed `stream` (EOF or reset) within `within`.
fn closed_within(stream: &mut impl Read, within: Duration) -> bool {
    let started = Instant::now();
    let mut buf = [0u8; 256];
    while started.elapsed() < within {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_cannot_hold_the_port() {
    let server = ApiServer::start().await.unwrap();
    let (dir, kubeconfig) = setup();
    server.write_kubeconfig(&kubeconfig).unwrap();
    // The file descriptor limit at which the unprotected port stopped answering.
    let host = tokio::task::block_in_place(|| {
        Host::start(dir.path(), "limits", &kubeconfig, &[], Some(1024))
    });
    let port = host.port;

    // A slowloris: handshake done, then a header line every second, never the end of the
    // headers. Dropped at the 10 s header timeout.
    let slowloris = std::thread::spawn(move || {
        let mut tls = https::connect(port, https::any_cert(), "localhost").unwrap();
        tls.sock
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let started = Instant::now();
        let _ = tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n");
        let _ = tls.flush();
        let mut line = 0;
        while started.elapsed() < Duration::from_secs(30) {
            if closed_within(&mut tls, Duration::from_secs(1)) {
                return started.elapsed();
            }
            line += 1;
            if write!(tls, "X-Slow-{line}: x\r\n")
                .and_then(|()| tls.flush())
                .is_err()
            {
                return started.elapsed();
            }
        }
        started.elapsed()
    });
    // A client that connects and never starts TLS: dropped at the 10 s handshake timeout.
    let silent = std::thread::spawn(move || {
        let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let started = Instant::now();
        closed_within(&mut tcp, Duration::from_secs(30));
        started.elapsed()
    });
    let slow = tokio::task::block_in_place(|| slowloris.join().unwrap());
    let silent = tokio::task::block_in_place(|| silent.join().unwrap());
    for (what, took) in [("slowloris", slow), ("silent client", silent)] {
        assert!(
            took >= Duration::from_secs(9) && took < Duration::from_secs(20),
            "{what} dropped after {took:?} (expected the 10 s timeout)"
        );
    }

    // 2,000 idle connections at a 1024 file descriptor limit: /healthz still answers at once
    // and the process holds no more than the cap.
    tokio::task::block_in_place(|| {
        let mut idle = Vec::new();
        for i in 0..2000 {
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)) {
                Ok(s) => idle.push(s),
                Err(e) => panic!("connection {i}: {e}"),
            }
        }
        let started = Instant::now();
        let (code, body) = host.get("/healthz", None);
        assert_eq!((code, body.as_str()), (200, "ok"));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "/healthz took {:?} behind 2,000 idle connections",
            started.elapsed()
        );
        // The kernel hands silent connections to the host after about a second
        // (TCP_DEFER_ACCEPT): wait for the cap to be reached, then count.
        let waiting = Instant::now();
        while !host.log().contains("connections open (the cap)") {
            assert!(
                waiting.elapsed() < Duration::from_secs(60),
                "the cap is reported:\n{}",
                host.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // The deferred connections arrive in a burst; the ones the cap closes are closed by
        // their tasks, a moment later: the count settles under the cap plus the host's own.
        let settling = Instant::now();
        loop {
            let fds = host.open_fds();
            if fds < 256 + 100 {
                break;
            }
            assert!(
                settling.elapsed() < Duration::from_secs(30),
                "{fds} open file descriptors with a cap of 256"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(idle);
    });
}

/// Kubelet-style probes survive a flood of new connections that send nothing (issue 28):
/// `CCM_FLOOD_RATE` new TCP connections per second (default 2,000), each held silent for 1 s,
/// for `CCM_FLOOD_SECS` (default 10), while a probe every 100 ms opens a new connection, does
/// the TLS handshake and GETs `/healthz`, all within 1 s (the kubelet's default timeout). At
/// least 99 % succeed. `CCM_FLOOD_BIN` runs another `ccm-host` build, to measure before and
/// after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_style_probes_survive_a_flood_of_new_connections() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    let env = |name: &str, default: u64| -> u64 {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (rate, secs) = (env("CCM_FLOOD_RATE", 2000), env("CCM_FLOOD_SECS", 10));
    const FLOODERS: u64 = 2;
    // The kubelet probes every 10 s by default (periodSeconds); the manifests every 2 s. The
    // test probes every 100 ms unless told otherwise, for more samples.
    let every = Duration::from_millis(env("CCM_PROBE_EVERY_MS", 100));
    let bin = std::env::var("CCM_FLOOD_BIN").unwrap_or_else(|_| BIN.to_string());
    let server = ApiServer::start().await.unwrap();
    let (dir, kubeconfig) = setup();
    server.write_kubeconfig(&kubeconfig).unwrap();
    let host = tokio::task::block_in_place(|| {
        Host::start_bin(&bin, dir.path(), "flood", &kubeconfig, &[], None)
    });
    let port = host.port;
    let stop = Arc::new(AtomicBool::new(false));
    let made = Arc::new(AtomicUsize::new(0));
    let hold = Duration::from_millis(env("CCM_FLOOD_HOLD_MS", 1000));
    let flooders: Vec<_> = (0..FLOODERS)
        .map(|_| {
            let (stop, made) = (stop.clone(), made.clone());
            let rate = rate / FLOODERS;
            std::thread::spawn(move || flood(port, rate, hold, &stop, &made))
        })
        .collect();
    // Let the flood reach its rate, then probe.
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let (mut ok, mut failed) = (0, Vec::new());
    tokio::task::block_in_place(|| {
        while started.elapsed() < Duration::from_secs(secs) {
            let tick = Instant::now();
            let (tx, rx) = std::sync::mpsc::channel();
            // The phase each probe is in, for the failures' description.
            let phase = Arc::new(std::sync::Mutex::new("connect"));
            {
                let phase = phase.clone();
                std::thread::spawn(move || {
                    let set = |p| *phase.lock().unwrap() = p;
                    let result = (|| {
                        let tcp = std::net::TcpStream::connect(("127.0.0.1", port))?;
                        set("TLS handshake");
                        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
                        let conn = rustls::ClientConnection::new(
                            https::any_cert(),
                            "localhost".try_into().unwrap(),
                        )
                        .map_err(std::io::Error::other)?;
                        let mut tls = rustls::StreamOwned::new(conn, tcp);
                        while tls.conn.is_handshaking() {
                            tls.conn.complete_io(&mut tls.sock)?;
                        }
                        set("request");
                        tls.write_all(
                            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
                        )?;
                        let mut out = Vec::new();
                        let _ = tls.read_to_end(&mut out);
                        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
                    })();
                    let _ = tx.send(result);
                });
            }
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(Ok(response))
                    if response.starts_with("HTTP/1.1 200") && response.ends_with("ok") =>
                {
                    ok += 1
                }
                Ok(other) => failed.push(format!("{other:?}")),
                Err(_) => failed.push(format!(
                    "no answer within 1s (in the {})",
                    phase.lock().unwrap()
                )),
            }
            if let Some(left) = every.checked_sub(tick.elapsed()) {
                std::thread::sleep(left);
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64() + 1.0;
    let probes = ok + failed.len();
    let achieved = made.load(Ordering::Relaxed) as f64 / elapsed;
    println!(
        "flood of {achieved:.0} established new connections/s (asked {rate}/s, each held {hold:?}) for {secs}s: {ok}/{probes} probes succeeded ({:.1} %); failures: {:?}",
        100.0 * ok as f64 / probes as f64,
        failed.iter().take(5).collect::<Vec<_>>()
    );
    let log = host.log();
    let cap_lines: std::collections::BTreeMap<&str, usize> = log
        .lines()
        .filter_map(|l| l.split_once("connection cap: ").map(|(_, w)| w))
        .fold(Default::default(), |mut m, w| {
            *m.entry(w).or_default() += 1;
            m
        });
    assert!(
        ok * 100 >= probes * 99,
        "{ok}/{probes} probes succeeded under the flood: {:?}; the cap: {cap_lines:?}",
        failed.iter().take(3).collect::<Vec<_>>()
    );
}

/// One thread of the flood: `rate` new TCP connections a second to `127.0.0.1:port`, each
/// opened with a non-blocking connect (so a full accept queue never blocks the generator, as
/// `TcpStream::connect` does for a second on a dropped SYN), held `hold` and then closed with an
/// RST (SO_LINGER 0: no TIME_WAIT left behind); with `hold` 0 closed at once. Connections that
/// were established when closed are counted in `made`. Pacing: every millisecond the connects
/// due so far are made.
#[allow(unsafe_code)] // socket(2), connect(2), setsockopt(2), getpeername(2), close(2)
fn flood(
    port: u16,
    rate: u64,
    hold: Duration,
    stop: &std::sync::atomic::AtomicBool,
    made: &std::sync::atomic::AtomicUsize,
) {
    use std::sync::atomic::Ordering;
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY (all blocks below): plain socket calls on descriptors this function owns, with
    // pointers to locals of the right sizes.
    let close = |fd: libc::c_int| {
        let mut peer: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        let established = unsafe { libc::getpeername(fd, (&raw mut peer).cast(), &mut len) == 0 };
        unsafe { libc::close(fd) };
        established
    };
    let mut held: std::collections::VecDeque<(Instant, libc::c_int)> = Default::default();
    let started = Instant::now();
    let mut opened = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while held.front().is_some_and(|(until, _)| *until <= now) {
            let (_, fd) = held.pop_front().unwrap();
            if close(fd) {
                made.fetch_add(1, Ordering::Relaxed);
            }
        }
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while opened < due {
            opened += 1;
            let fd = unsafe {
                libc::socket(
                    libc::AF_INET,
                    libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                )
            };
            if fd < 0 {
                continue;
            }
            let linger = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&raw const linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
                libc::connect(
                    fd,
                    (&raw const addr).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                );
            }
            if hold.is_zero() {
                // Give the handshake a moment (it completes in the kernel) before the RST.
                held.push_back((Instant::now() + Duration::from_millis(1), fd));
            } else {
                held.push_back((Instant::now() + hold, fd));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for (_, fd) in held {
        if close(fd) {
            made.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A CA (PEM) and a client certificate it signs for `cn` in `org` (chain, key).
fn client_pki(
    cn: &str,
    org: &str,
) -> (
    String,
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "test client CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client.distinguished_name.push(DnType::CommonName, cn);
    client
        .distinguished_name
        .push(DnType::OrganizationName, org);
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = client.signed_by(&key, &issuer).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    (ca_pem, vec![cert.der().clone()], key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_from_client_ca_file_or_the_cluster_lookup() {
    let server = ApiServer::start().await.unwrap();
    let (dir, kubeconfig) = setup();
    server.write_kubeconfig(&kubeconfig).unwrap();
    let ctl = server.controls();
    ctl.allow_non_resource("monitoring", &["get"], &["/metrics"]);
    let (ca, chain, key) = client_pki("prometheus", "monitoring");
    let (_, other_chain, other_key) = client_pki("prometheus", "monitoring");
    let ca_file = dir.path().join("client-ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let kc = kubeconfig.to_str().unwrap().to_string();
    let authz = format!("--authorization-kubeconfig={kc}");
    let authn = format!("--authentication-kubeconfig={kc}");
    let client = https::any_cert_with_client_cert(chain.clone(), key.clone_key());
    tokio::task::block_in_place(|| {
        // --client-ca-file: the certificate's CN and O are the user; no TokenReview.
        let flag = format!("--client-ca-file={}", ca_file.display());
        let host = Host::start(dir.path(), "ca-file", &kubeconfig, &[&authz, &flag], None);
        ctl.clear_requests();
        let (code, body) =
            https::get_with(host.port, client.clone(), "localhost", "/metrics", None).unwrap();
        assert_eq!(code, 200, "{body}");
        assert_eq!(reviews(&server, TOKEN_REVIEWS), 0);
        let review = ctl
            .requests()
            .into_iter()
            .find(|r| r.resource == ACCESS_REVIEWS)
            .unwrap();
        assert_eq!(review.json()["spec"]["user"], "prometheus");
        assert_eq!(
            review.json()["spec"]["groups"],
            serde_json::json!(["monitoring", "system:authenticated"])
        );
        // Without a certificate: anonymous, as before.
        assert_eq!(host.get("/metrics", None).0, 403);
        // A certificate of another CA: the handshake fails.
        let stranger = https::any_cert_with_client_cert(other_chain.clone(), other_key.clone_key());
        assert!(https::get_with(host.port, stranger, "localhost", "/metrics", None).is_err());
        drop(host);

        // The cluster lookup (the default): the CA of configmap
        // kube-system/extension-apiserver-authentication.
        ctl.seed(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {"client-ca-file": ca}
        }))
        .unwrap();
        let host = Host::start(dir.path(), "lookup", &kubeconfig, &[&authz, &authn], None);
        let (code, _) =
            https::get_with(host.port, client.clone(), "localhost", "/metrics", None).unwrap();
        assert_eq!(code, 200);
        assert!(
            host.log().contains(
                "client certificates (configmap kube-system/extension-apiserver-authentication)"
            ),
            "{}",
            host.log()
        );
        drop(host);

        // --authentication-skip-lookup: no client CA, so the certificate is not asked for.
        let host = Host::start(
            dir.path(),
            "skip",
            &kubeconfig,
            &[&authz, &authn, "--authentication-skip-lookup"],
            None,
        );
        let (code, _) =
            https::get_with(host.port, client.clone(), "localhost", "/metrics", None).unwrap();
        assert_eq!(code, 403);
        drop(host);
    });

    // A failing lookup is fatal (exit 2, naming the way out) unless tolerated.
    let failing = |tolerate: bool| {
        ctl.fail_next(1, "get", "configmaps", 500);
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .arg("--plugin-dir")
            .arg(plugin_dir(dir.path()))
            .args(["--cloud-provider", "fake", "--leader-elect=false"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &free_port().to_string(),
            ])
            .arg(&authn)
            .env_remove("KUBERNETES_SERVICE_HOST");
        if tolerate {
            cmd.arg("--authentication-tolerate-lookup-failure");
        }
        cmd
    };
    let out = tokio::task::block_in_place(|| failing(false).output().unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "error: cannot read configmap kube-system/extension-apiserver-authentication"
        ) && stderr.contains("--authentication-tolerate-lookup-failure starts anyway"),
        "{stderr}"
    );
    let tolerated = tokio::task::block_in_place(|| {
        let mut child = failing(true)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let started = Instant::now();
        let mut text = String::new();
        let mut buf = [0u8; 4096];
        while !text.contains("serving /healthz") && started.elapsed() < Duration::from_secs(60) {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        text
    });
    assert!(
        tolerated.contains(
            "client certificates are not authenticated (--authentication-tolerate-lookup-failure)"
        ) && tolerated.contains("serving /healthz"),
        "{tolerated}"
    );
}

/// `--tls-min-version` and `--tls-cipher-suites` are applied to the secure port, checked with
/// real handshakes; values rustls cannot serve are refused at start-up, one line each, exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_flags_are_applied_or_refused() {
    use rustls::crypto::ring::cipher_suite as cs;
    use rustls::version::{TLS12, TLS13};
    let server = ApiServer::start().await.unwrap();
    let (dir, kubeconfig) = setup();
    server.write_kubeconfig(&kubeconfig).unwrap();
    tokio::task::block_in_place(|| {
        let handshake = |port: u16,
                         versions: &[&'static rustls::SupportedProtocolVersion],
                         suites: &[rustls::SupportedCipherSuite]| {
            https::connect(
                port,
                https::any_cert_offering(versions, suites),
                "localhost",
            )
            .map(|tls| {
                (
                    tls.conn.protocol_version(),
                    tls.conn.negotiated_cipher_suite().map(|s| s.suite()),
                )
            })
        };
        let tls12_suite = cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256;
        let tls13_suite = cs::TLS13_AES_128_GCM_SHA256;

        // Default: TLS 1.2 and 1.3.
        let host = Host::start(dir.path(), "default", &kubeconfig, &[], None);
        assert_eq!(
            handshake(host.port, &[&TLS12], &[tls12_suite]).unwrap().0,
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
        drop(host);

        // VersionTLS13: a TLS 1.2 client is refused in the handshake, TLS 1.3 is served.
        let host = Host::start(
            dir.path(),
            "tls13",
            &kubeconfig,
            &["--tls-min-version=VersionTLS13"],
            None,
        );
        assert!(
            handshake(host.port, &[&TLS12], &[tls12_suite]).is_err(),
            "TLS 1.2 refused"
        );
        assert_eq!(
            handshake(host.port, &[&TLS13], &[tls13_suite]).unwrap().0,
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        assert_eq!(host.get("/healthz", None).0, 200);
        drop(host);

        // One TLS 1.2 suite: a client offering only another one is refused; TLS 1.3 stays.
        let host = Host::start(
            dir.path(),
            "suites",
            &kubeconfig,
            &["--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"],
            None,
        );
        assert!(
            handshake(host.port, &[&TLS12], &[tls12_suite]).is_err(),
            "a suite not listed is refused"
        );
        assert_eq!(
            handshake(
                host.port,
                &[&TLS12],
                &[tls12_suite, cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]
            )
            .unwrap(),
            (
                Some(rustls::ProtocolVersion::TLSv1_2),
                Some(rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
            )
        );
        assert_eq!(
            handshake(host.port, &[&TLS13], &[tls13_suite]).unwrap().0,
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        drop(host);

        // What rustls cannot serve: one line each, exit 2, before anything starts.
        for (flag, line) in [
            (
                "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
                "error: --tls-cipher-suites: TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA is not supported: ccm-host serves only AEAD suites with forward secrecy",
            ),
            (
                "--tls-min-version=VersionTLS10",
                "error: --tls-min-version: VersionTLS10 is not supported: ccm-host serves TLS 1.2 and 1.3 only (VersionTLS12, the default, or VersionTLS13)",
            ),
        ] {
            let out = Command::new(BIN)
                .args(["run", "--cloud-provider", "fake", "--kubeconfig"])
                .arg(&kubeconfig)
                .arg(flag)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{flag}: {stderr}");
            let lines: Vec<&str> = stderr.lines().filter(|l| !l.is_empty()).collect();
            assert_eq!(lines.len(), 1, "{flag}: {stderr}");
            assert!(lines[0].starts_with(line), "{flag}: {stderr}");
        }
    });
}
