//! `--cloud-config` hot reload and the provider's health in `/readyz`, with `ccm-host run` as a
//! real process, the fake provider's `.so` and the in-memory API server:
//!
//! - a kubelet-style Secret update (`..data` symlink swapped to a new directory) reaches the
//!   provider's `reconfigure`, and the node controller's next node sees the new config;
//! - a bad config keeps the provider (nodes keep being initialised with the old config), with one
//!   ERROR line and `ccm_cloud_config_reloads_total{result="failure"} 1`;
//! - without `reconfigure` the provider is rebuilt, initialised and swapped in, and a config that
//!   would change its capabilities is refused;
//! - the fake's health switch flips `/readyz` (check `cloud-provider`), and a provider without a
//!   probe has no check.

use std::io::{Read, Write};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use kube_apiserver_inmem::ApiServer;
use serde_json::{json, Value};

mod support;

use support::{free_port, plugin_dir, wait_until, BIN};

const WAIT: Duration = Duration::from_secs(30);
const TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";
const TYPE_LABEL: &str = "node.kubernetes.io/instance-type";
/// Registered with the API server the host may delegate authentication to.
const TOKEN: &str = "config-reload-test-token";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls")
}

/// Write `text` as a new version of a kubelet Secret volume in `dir`: a new timestamped
/// directory, `..data` swapped to it by a rename, `cloud.conf -> ..data/cloud.conf`.
fn kubelet_write(dir: &Path, version: u32, text: &str) {
    let data = format!("..2026_01_01_00_00_{version:02}.{version}");
    std::fs::create_dir_all(dir.join(&data)).unwrap();
    std::fs::write(dir.join(&data).join("cloud.conf"), text).unwrap();
    let tmp = dir.join("..data_tmp");
    symlink(&data, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    if std::fs::symlink_metadata(dir.join("cloud.conf")).is_err() {
        symlink("..data/cloud.conf", dir.join("cloud.conf")).unwrap();
    }
    // kubelet removes the old version once the new one is in place.
    if version > 1 {
        let old = format!("..2026_01_01_00_00_{:02}.{}", version - 1, version - 1);
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

struct Daemon {
    child: Child,
    port: u16,
    log: PathBuf,
    state_dir: PathBuf,
    tls: Arc<rustls::ClientConfig>,
}

impl Daemon {
    /// `ccm-host run` without leader election (controllers start at once), the endpoints on a
    /// free port with the fixture certificate, JSON logs, and 100 ms reload and health periods.
    fn start(dir: &Path, kubeconfig: &Path, config: &Path, state_dir: &Path) -> Daemon {
        let port = free_port();
        let log = dir.join("ccm-host.log");
        let child = Command::new(BIN)
            .arg("run")
            .arg("--plugin-dir")
            .arg(plugin_dir(dir))
            .args(["--cloud-provider", "fake", "--cloud-config"])
            .arg(config)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            // Who may read /metrics and /readyz/<check>: asked of the same API server.
            .arg("--authentication-kubeconfig")
            .arg(kubeconfig)
            .arg("--authorization-kubeconfig")
            .arg(kubeconfig)
            .args(["--leader-elect=false", "--controllers", "cloud-node"])
            .args(["--bind-address", "127.0.0.1", "--secure-port"])
            .arg(port.to_string())
            .arg("--tls-cert-file")
            .arg(fixtures().join("cert.pem"))
            .arg("--tls-private-key-file")
            .arg(fixtures().join("key.pem"))
            .args(["--cloud-config-reload-period", "100ms"])
            .args(["--provider-health-period", "100ms"])
            .env("RUST_LOG", "info")
            .env("CCM_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("ccm-host starts");
        Daemon {
            child,
            port,
            log,
            state_dir: state_dir.to_path_buf(),
            tls: client_tls(),
        }
    }

    /// The log records so far (JSON lines).
    fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Log records at `level` whose message contains `text`.
    fn logged(&self, level: &str, text: &str) -> usize {
        self.records()
            .iter()
            .filter(|r| {
                r["level"] == level
                    && r["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(text))
            })
            .count()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The fake's recorded calls named `call`.
    fn calls(&self, call: &str) -> usize {
        ccm_provider_fake::control::calls_named(&self.state_dir, call)
            .unwrap_or_default()
            .len()
    }

    /// GET `path` over HTTPS (with a bearer token); `None` until the port answers.
    fn get(&self, path: &str) -> Option<(u16, String)> {
        let tcp = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        tcp.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let name = rustls_pki_types::ServerName::try_from("localhost").ok()?;
        let conn = rustls::ClientConnection::new(self.tls.clone(), name).ok()?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        write!(
            tls,
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out);
        let out = String::from_utf8_lossy(&out).into_owned();
        let code = out.split_whitespace().nth(1)?.parse().ok()?;
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    }

    fn metric(&self, series: &str) -> Option<u64> {
        let (code, body) = self.get("/metrics")?;
        if code != 200 {
            return None;
        }
        Some(
            body.lines()
                .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
                .unwrap_or(0),
        )
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Trusts the fixture certificate (issued for `localhost`).
fn client_tls() -> Arc<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        rustls_pki_types::CertificateDer::pem_file_iter(fixtures().join("cert.pem")).unwrap()
    {
        roots.add(cert.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

struct Cluster {
    server: ApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    state_dir: PathBuf,
}

impl Cluster {
    async fn start() -> Cluster {
        let server = ApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let ctl = server.controls();
        ctl.add_token(TOKEN, "config-reload-test", &[]);
        ctl.allow_non_resource("config-reload-test", &["get"], &["*"]);
        let state_dir = dir.path().join("state");
        std::fs::create_dir_all(&state_dir).unwrap();
        Cluster {
            server,
            dir,
            kubeconfig,
            state_dir,
        }
    }

    /// The fake's config: its state directory and `extra` (YAML lines).
    fn config(&self, extra: &str) -> String {
        format!("stateDir: {}\n{extra}", self.state_dir.display())
    }

    /// A kubelet-registered node; returns its instance-type label once initialised.
    fn initialised_type(&self, name: &str) -> String {
        self.server
            .controls()
            .seed(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                "spec": {"taints": [{"key": TAINT, "value": "true", "effect": "NoSchedule"}]}}),
            )
            .unwrap();
        wait_until(&format!("node {name} initialised"), WAIT, || {
            self.server.controls().get("nodes", "", name).and_then(|n| {
                n["metadata"]["labels"][TYPE_LABEL]
                    .as_str()
                    .map(str::to_string)
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_secret_update_reconfigures_the_provider_and_a_bad_one_keeps_it() {
    let c = Cluster::start().await;
    let secret = c.dir.path().join("secret");
    std::fs::create_dir_all(&secret).unwrap();
    kubelet_write(&secret, 1, &c.config("defaults: {instanceType: small}\n"));
    let d = Daemon::start(
        c.dir.path(),
        &c.kubeconfig,
        &secret.join("cloud.conf"),
        &c.state_dir,
    );
    tokio::task::block_in_place(|| {
        assert_eq!(c.initialised_type("a"), "small");

        // The Secret changes: kubelet swaps ..data to a new directory.
        kubelet_write(&secret, 2, &c.config("defaults: {instanceType: large}\n"));
        wait_until("the reload", WAIT, || {
            (d.logged("INFO", "cloud provider reconfigured in place") == 1).then_some(())
        });
        assert_eq!(c.initialised_type("b"), "large");
        assert_eq!(d.calls("reconfigure"), 1);
        assert_eq!(d.calls("initialize"), 1, "in place: no second instance");

        // A bad version: one ERROR line, the provider stays as it was.
        kubelet_write(&secret, 3, &c.config("defaults: {instanceTyp: huge}\n"));
        wait_until("the refused reload", WAIT, || {
            (d.logged("ERROR", "changed but cannot be applied") == 1).then_some(())
        });
        let line = d
            .records()
            .into_iter()
            .find(|r| r["level"] == "ERROR")
            .unwrap();
        let message = line["fields"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains(&secret.join("cloud.conf").display().to_string())
                && message.contains("keeping the cloud provider as it was")
                && message.contains("unknown field `instanceTyp`"),
            "{message}"
        );
        // Another key of the Secret changes: same bytes for us, not tried again. Nodes keep
        // being initialised with the config in force meanwhile.
        kubelet_write(&secret, 4, &c.config("defaults: {instanceTyp: huge}\n"));
        assert_eq!(c.initialised_type("c"), "large");
        assert_eq!(
            d.metric("ccm_cloud_config_reloads_total{result=\"failure\",method=\"reconfigure\"}"),
            Some(1)
        );
        assert_eq!(
            d.metric("ccm_cloud_config_reloads_total{result=\"success\",method=\"reconfigure\"}"),
            Some(1)
        );

        // Fixed: applied.
        kubelet_write(&secret, 5, &c.config("defaults: {instanceType: xl}\n"));
        wait_until("the second reload", WAIT, || {
            (d.logged("INFO", "cloud provider reconfigured in place") == 2).then_some(())
        });
        assert_eq!(c.initialised_type("d"), "xl");
        let errors = d.records().iter().filter(|r| r["level"] == "ERROR").count();
        assert_eq!(errors, 1, "{}", d.log_text());
        assert_eq!(
            d.calls("reconfigure"),
            3,
            "good, bad (once), good: the bad bytes were not retried"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_reconfigure_the_provider_is_rebuilt_but_never_with_other_capabilities() {
    let c = Cluster::start().await;
    let config = c.dir.path().join("cloud.yaml");
    let write = |text: &str| {
        // As an editor or a ConfigMap mounted with subPath would: the file itself replaced.
        let tmp = c.dir.path().join("cloud.yaml.tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &config).unwrap();
    };
    write(&c.config("defaults: {instanceType: small}\nreconfigure: notImplemented\n"));
    let d = Daemon::start(c.dir.path(), &c.kubeconfig, &config, &c.state_dir);
    tokio::task::block_in_place(|| {
        assert_eq!(c.initialised_type("a"), "small");
        write(&c.config("defaults: {instanceType: large}\nreconfigure: notImplemented\n"));
        wait_until("the rebuild", WAIT, || {
            (d.logged("INFO", "rebuilt from its factory and swapped in") == 1).then_some(())
        });
        assert_eq!(d.calls("initialize"), 2, "the new instance was initialised");
        assert_eq!(c.initialised_type("b"), "large");

        // Turning off load balancers would change what the controllers were started with.
        write(&c.config(
            "defaults: {instanceType: xl}\nreconfigure: notImplemented\ndisableLoadBalancers: true\n",
        ));
        wait_until("the refused rebuild", WAIT, || {
            (d.logged("ERROR", "changes what the provider offers") == 1).then_some(())
        });
        assert_eq!(c.initialised_type("c"), "large");
        assert_eq!(
            d.metric("ccm_cloud_config_reloads_total{result=\"failure\",method=\"rebuild\"}"),
            Some(1)
        );
        assert_eq!(
            d.metric("ccm_cloud_config_reloads_total{result=\"success\",method=\"rebuild\"}"),
            Some(1)
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_providers_health_is_the_cloud_provider_check_of_readyz() {
    let c = Cluster::start().await;
    let config = c.dir.path().join("cloud.yaml");
    std::fs::write(&config, c.config("")).unwrap();
    let d = Daemon::start(c.dir.path(), &c.kubeconfig, &config, &c.state_dir);
    let control = |v: Value| {
        let live: ccm_provider_fake::FakeConfig = serde_json::from_value(v).unwrap();
        ccm_provider_fake::control::write_control(&c.state_dir, &live).unwrap();
    };
    tokio::task::block_in_place(|| {
        wait_until("/readyz/cloud-provider ok", WAIT, || {
            d.get("/readyz/cloud-provider")
                .filter(|(code, _)| *code == 200)
        });
        assert_eq!(d.get("/readyz"), Some((200, "ok".into())));

        control(json!({"health": {"kind": "unauthorized", "message": "credentials rejected"}}));
        let (_, body) = wait_until("/readyz fails", WAIT, || {
            d.get("/readyz").filter(|(code, _)| *code == 503)
        });
        // The reason is withheld at the root path and told at the check's own (the test's
        // token is authorized for it).
        assert_eq!(
            body,
            "[-]cloud-provider failed: reason withheld\nreadyz check failed\n"
        );
        assert_eq!(
            d.get("/readyz/cloud-provider"),
            Some((
                503,
                "internal server error: cloud provider fake: credentials rejected\n".into()
            ))
        );
        assert_eq!(
            d.get("/healthz").map(|(code, _)| code),
            Some(200),
            "liveness is not the cloud's health"
        );
        wait_until("the change logged", WAIT, || {
            (d.logged("WARN", "health probe failed: credentials rejected") == 1).then_some(())
        });

        control(json!({}));
        wait_until("/readyz ok again", WAIT, || {
            d.get("/readyz").filter(|(code, _)| *code == 200)
        });

        // A provider that offers no probe has no check.
        control(json!({"health": {"kind": "not_implemented"}}));
        wait_until("no cloud-provider check", WAIT, || {
            d.get("/readyz/cloud-provider")
                .filter(|(code, _)| *code == 404)
        });
        assert_eq!(d.get("/readyz"), Some((200, "ok".into())));
    });
}
