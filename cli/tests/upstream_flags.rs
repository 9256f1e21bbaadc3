//! `ccm-host run` with the flags of upstream's manifests and vendor charts, as a real process:
//! they get past flag validation and the daemon runs its controllers; the flags without effect
//! are named in one warning; `--v` and `--logging-format=json` work; logs carry colour only on
//! a terminal; bad values exit 2 with one line each; `--version` exits 0.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube_apiserver_inmem::ApiServer;
use serde_json::Value;

mod support;

use support::{free_port, plugin_dir, BIN};

/// The warning that names the flags without effect.
const NO_EFFECT: &str = "have no effect in ccm-host";

/// `ccm-host` with the environment under the test's control (no RUST_LOG, CCM_LOG_FORMAT or
/// NO_COLOR from the caller).
fn ccm_host() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env_remove("RUST_LOG")
        .env_remove("CCM_LOG_FORMAT")
        .env_remove("NO_COLOR");
    cmd
}

/// A `ccm-host run` process against the in-memory API server; stderr goes to a file (a full
/// pipe nobody reads would block the daemon).
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Start `ccm-host run` with `flags`, adding only what a test needs: the plugin directory,
    /// the kubeconfig, a free `--secure-port`, and a cloud config (`cloud_config`, YAML) unless
    /// the flags bring their own.
    fn start(dir: &Path, server: &ApiServer, cloud_config: &str, flags: &[&str]) -> Daemon {
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        let config = dir.join("cloud.yaml");
        std::fs::write(
            &config,
            format!("stateDir: {}\n{cloud_config}", dir.display()),
        )
        .unwrap();
        let log = dir.join("ccm-host.log");
        let mut cmd = ccm_host();
        cmd.arg("run")
            .arg("--plugin-dir")
            .arg(plugin_dir(dir))
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg(format!("--secure-port={}", free_port()));
        if !flags.iter().any(|f| f.starts_with("--cloud-config")) {
            cmd.arg("--cloud-config").arg(&config);
        }
        let child = cmd
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("ccm-host starts");
        Daemon { child, log }
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// Wait until the node controller runs (the flags were accepted and the daemon started),
    /// then SIGTERM it and expect a clean exit; returns the log.
    fn run_then_stop(mut self) -> String {
        let started = Instant::now();
        loop {
            let log = self.log();
            if log
                .lines()
                .any(|l| l.contains("started") && l.contains("cloud-node-controller"))
            {
                break;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("ccm-host exited with {status} before starting its controllers:\n{log}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "ccm-host did not start its controllers within 60s:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // SAFETY: kill(2) on our own child's pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let stopping = Instant::now();
        let status = loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                break status;
            }
            assert!(
                stopping.elapsed() < Duration::from_secs(30),
                "no exit after SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = self.log();
        assert_eq!(status.code(), Some(0), "{log}");
        assert!(
            !log.lines().any(|l| l.starts_with("error")),
            "no errors expected:\n{log}"
        );
        log
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of the no-effect warning.
fn no_effect_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(NO_EFFECT)).collect()
}

/// The Kubernetes documentation's example cloud-controller-manager manifest ("Cloud Controller
/// Manager Administration"), with the provider name replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_docs_example_manifest_starts_unchanged() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        dir.path(),
        &server,
        "",
        &[
            "--cloud-provider=fake",
            "--leader-elect=true",
            "--use-service-account-credentials",
            "--allocate-node-cidrs=true",
            "--configure-cloud-routes=true",
            "--cluster-cidr=172.17.0.0/16",
        ],
    );
    let log = tokio::task::block_in_place(|| daemon.run_then_stop());
    let warnings = no_effect_lines(&log);
    assert_eq!(warnings.len(), 1, "one warning at start:\n{log}");
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(
        warnings[0].ends_with(": --use-service-account-credentials"),
        "{}",
        warnings[0]
    );
}

/// The args of openstack-cloud-controller-manager's Helm chart (templates/daemonset.yaml with the
/// chart's defaults), for a cloud without a router (OpenStack's Routes() is then off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openstack_chart_flags_start_unchanged() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cloud.conf");
    std::fs::write(
        &config,
        format!("stateDir: {}\ndisableRoutes: true\n", dir.path().display()),
    )
    .unwrap();
    let cloud_config = format!("--cloud-config={}", config.display());
    let daemon = Daemon::start(
        dir.path(),
        &server,
        "",
        &[
            "--v=2",
            &cloud_config,
            "--cluster-name=kubernetes",
            "--cloud-provider=fake",
            "--use-service-account-credentials=false",
            "--controllers=cloud-node,cloud-node-lifecycle,route,service",
            "--bind-address=127.0.0.1",
        ],
    );
    let log = tokio::task::block_in_place(|| daemon.run_then_stop());
    assert!(
        no_effect_lines(&log).is_empty(),
        "--use-service-account-credentials=false is what ccm-host does:\n{log}"
    );
    assert!(!log.contains(" DEBUG "), "--v=2 logs at info:\n{log}");
}

/// The args of hcloud-cloud-controller-manager's Helm chart (its default rendering), for a
/// project without a private network (hcloud's routes are then off) and untagged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hcloud_chart_flags_start_unchanged() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        dir.path(),
        &server,
        "hasClusterID: false\ndisableRoutes: true\n",
        &[
            "--allow-untagged-cloud",
            "--cloud-provider=fake",
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=false",
            "--route-reconciliation-period=30s",
            "--webhook-secure-port=0",
            "--leader-elect=false",
        ],
    );
    let log = tokio::task::block_in_place(|| daemon.run_then_stop());
    assert!(
        log.contains("running anyway because --allow-untagged-cloud is set"),
        "{log}"
    );
    assert!(no_effect_lines(&log).is_empty(), "{log}");
}

/// `--v=2 --logging-format=json`: every line on stderr is one JSON object, the warning included;
/// `-v 4` (the short form) turns on ccm-host's debug logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logging_and_verbosity() {
    let server = ApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        dir.path(),
        &server,
        "",
        &[
            "--cloud-provider=fake",
            "--cluster-cidr=10.244.0.0/16",
            "--v=2",
            "--logging-format=json",
            "--profiling",
        ],
    );
    let log = tokio::task::block_in_place(|| daemon.run_then_stop());
    let mut levels = Vec::new();
    for line in log.lines().filter(|l| !l.is_empty()) {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\n{log}"));
        assert!(v.is_object(), "{line}");
        levels.push(v["level"].as_str().unwrap_or_default().to_string());
    }
    assert!(levels.iter().all(|l| l != "DEBUG"), "{log}");
    let warning: Value = serde_json::from_str(no_effect_lines(&log)[0]).unwrap();
    assert_eq!(warning["level"], "WARN");
    assert!(warning["fields"]["message"]
        .as_str()
        .unwrap()
        .ends_with(": --profiling"));

    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(
        dir.path(),
        &server,
        "",
        &[
            "--cloud-provider=fake",
            "--cluster-cidr=10.244.0.0/16",
            "-v",
            "4",
        ],
    );
    let log = tokio::task::block_in_place(|| daemon.run_then_stop());
    assert!(
        log.lines()
            .any(|l| l.contains(" DEBUG ") && l.contains("ccm_host")),
        "-v 4 logs ccm-host's debug messages:\n{log}"
    );
}

/// A run that loads the fake plugin, logs, and fails on the missing kubeconfig (exit 2).
fn short_run(dir: &Path) -> Command {
    let mut cmd = ccm_host();
    cmd.arg("run")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir))
        .args([
            "--cloud-provider=fake",
            "--kubeconfig=/nonexistent/kubeconfig",
        ]);
    cmd
}

#[test]
fn logs_have_no_colour_codes_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = short_run(dir.path()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("INFO"), "{stderr}");
    assert!(!stderr.contains("\x1b["), "{stderr:?}");
}

/// `cmd` with stderr on a new pseudo-terminal; returns what it wrote there.
fn stderr_on_a_terminal(mut cmd: Command) -> String {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: plain pty calls on a descriptor this function owns; `ptsname_r` writes at most
    // `name.len()` bytes.
    #[allow(unsafe_code)]
    let (master, slave) = unsafe {
        let fd = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(fd >= 0, "posix_openpt");
        assert_eq!(libc::grantpt(fd), 0);
        assert_eq!(libc::unlockpt(fd), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(fd, name.as_mut_ptr(), name.len()), 0);
        let name = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_string();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(name)
            .unwrap();
        (std::fs::File::from_raw_fd(fd), slave)
    };
    let reader = std::thread::spawn(move || {
        let mut master = master;
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Reading ends with EIO once the last holder of the terminal closes it.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        out
    });
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(slave)
        .spawn()
        .unwrap();
    drop(cmd);
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    assert_eq!(status.code(), Some(2));
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn colour_only_on_a_terminal_and_never_with_no_color() {
    let dir = tempfile::tempdir().unwrap();
    let on_tty = stderr_on_a_terminal(short_run(dir.path()));
    assert!(on_tty.contains("INFO"), "{on_tty:?}");
    assert!(on_tty.contains("\x1b["), "colour on a terminal: {on_tty:?}");
    let mut no_color = short_run(dir.path());
    no_color.env("NO_COLOR", "1");
    let plain = stderr_on_a_terminal(no_color);
    assert!(plain.contains("INFO"), "{plain:?}");
    assert!(!plain.contains("\x1b["), "NO_COLOR: {plain:?}");
}

/// `ccm-host run` with `flags` after a valid base, expecting exit 2 and one line on stderr.
fn rejected(flags: &[&str]) -> String {
    let out: Output = ccm_host()
        .args(["run", "--plugin-dir=/nonexistent", "--cloud-provider=fake"])
        .args(flags)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{flags:?}: one line expected:\n{stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

#[test]
fn bad_values_exit_2_with_one_clear_line_each() {
    let line = rejected(&["--logging-format=xml"]);
    assert!(
        line.contains("'xml'") && line.contains("permitted formats: text, json"),
        "{line}"
    );
    let line = rejected(&["--v=abc"]);
    assert!(line.contains("'abc'") && line.contains("--v"), "{line}");
    let line = rejected(&["-vv"]);
    assert!(line.contains("-vv is -v 5"), "{line}");
    assert_eq!(
        rejected(&["--feature-gates=NoSuchGate=true"]),
        "error: --feature-gates: unrecognized feature gate: NoSuchGate"
    );
    let line = rejected(&["--leader-elect-retry-period=10s"]);
    assert!(
        line.starts_with("error: --leader-elect-retry-period (10s) must be less than --leader-elect-renew-deadline (10s) / 1.2"),
        "{line}"
    );
    let line = rejected(&[
        "--leader-elect-retry-period=2s",
        "--leader-elect-renew-deadline=2s",
    ]);
    assert!(line.contains("lose its lease"), "{line}");
    let line = rejected(&["--vmodule=route"]);
    assert!(line.contains("pattern=N"), "{line}");
    let line = rejected(&["--profiling=maybe"]);
    assert!(
        line.contains("'maybe'") && line.contains("--profiling"),
        "{line}"
    );
    let line = rejected(&["--no-such-flag"]);
    assert!(line.contains("'--no-such-flag'"), "{line}");
}

#[test]
fn version_prints_and_exits_0() {
    for args in [
        &["--version"][..],
        &["run", "--version"],
        &["run", "--cloud-provider=fake", "--version=true"],
        &["plugins", "--version"],
    ] {
        let out = ccm_host().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("ccm-host {}\n", env!("CARGO_PKG_VERSION")),
            "{args:?}"
        );
    }
    let raw = ccm_host().args(["--version=raw"]).output().unwrap();
    assert_eq!(raw.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&raw.stdout).contains("ccm-provider-abi"));
}

#[test]
fn the_numeric_verbosity_works_for_the_other_commands() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(dir.path());
    for args in [&["-v", "4", "plugins"][..], &["plugins", "--v=4"]] {
        let out = ccm_host()
            .args(args)
            .arg("--plugin-dir")
            .arg(&plugins)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("provider fake "));
    }
}
