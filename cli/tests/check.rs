//! `ccm-host check` as a real process: it passes on the fake provider (V2 and legacy) and on
//! the example provider, fails with the right reasons on each broken fixture provider, and
//! exits 2 on usage errors.

mod support;

use support::BIN;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The plugins cargo built for this test run, in a directory the loader accepts.
fn plugin_dir(dir: &Path) -> PathBuf {
    support::plugin_dir_with(
        dir,
        &[
            "libccm_provider_fake.so",
            "libccm_provider_example.so",
            "libccm_fixture_broken.so",
        ],
    )
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not the JSON report ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Check id -> (status, detail).
    fn checks(&self) -> BTreeMap<String, (String, String)> {
        self.json()["checks"]
            .as_array()
            .expect("checks array")
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap().to_string(),
                    (
                        c["status"].as_str().unwrap().to_string(),
                        c["detail"].as_str().unwrap().to_string(),
                    ),
                )
            })
            .collect()
    }

    /// Ids of the checks with `status`, in report order.
    fn with_status(&self, status: &str) -> Vec<String> {
        self.json()["checks"]
            .as_array()
            .expect("checks array")
            .iter()
            .filter(|c| c["status"] == status)
            .map(|c| c["id"].as_str().unwrap().to_string())
            .collect()
    }
}

fn check(dir: &Path, args: &[&str]) -> Run {
    check_in(dir, dir, args)
}

/// `ccm-host check` run in the working directory `cwd`.
fn check_in(dir: &Path, cwd: &Path, args: &[&str]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .current_dir(cwd)
        .arg("check")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("ccm-host runs");
    Run {
        code: status.code().expect("exited normally"),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The fake cloud with exactly the check nodes and a stopped instance (no synthesised ones).
const FAKE_CONFIG: &str = "\
autoInstances: false
defaults: {instanceType: fake.small, zone: zone-a, region: region-1}
instances:
  - {name: ccm-check-1}
  - {name: ccm-check-2}
  - {name: ccm-check-3}
  - {name: stopped-1, shutdown: true}
";

/// The cloud config the example provider ships for the default check nodes (the file the guide
/// and the README name).
const EXAMPLE_CONFIG: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../providers/example/example.conf"
);

#[test]
fn fake_provider_passes_every_check_v2_and_legacy() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(dir.path(), "fake.yaml", FAKE_CONFIG);
    // The same cloud with bulk instance lookups (ABI 1.1): the instances-batch check runs.
    let bulk_config = write(
        dir.path(),
        "fake-bulk.yaml",
        &format!("{FAKE_CONFIG}bulkInstances: true\n"),
    );
    for (provider, bulk) in [
        ("fake", false),
        ("fake-v1", false),
        ("fake", true),
        ("fake-v1", true),
    ] {
        let run = check(
            dir.path(),
            &[
                "--cloud-provider",
                provider,
                "--cloud-config",
                if bulk { &bulk_config } else { &config },
                "--shutdown-node",
                "stopped-1",
                "-o",
                "json",
            ],
        );
        let case = format!("{provider} (bulkInstances: {bulk})");
        assert_eq!(run.code, 0, "{case}: {}\n{}", run.stdout, run.stderr);
        let checks = run.checks();
        assert_eq!(checks.len(), 23, "{case}: every check reported");
        if bulk {
            assert_eq!(run.with_status("pass").len(), 23, "{case}: {checks:#?}");
            assert!(
                checks["instances-batch"]
                    .1
                    .starts_with("one InstancesBatch about 5 nodes answers as"),
                "{case}: {}",
                checks["instances-batch"].1
            );
        } else {
            assert_eq!(run.with_status("pass").len(), 22, "{case}: {checks:#?}");
            assert_eq!(run.with_status("skip"), ["instances-batch"], "{case}");
        }
        let report = run.json();
        assert_eq!(report["subject"]["providerName"], provider);
        assert_eq!(report["failed"], 0);
        // The details say what was verified, with the real values.
        assert!(checks["provider-id"]
            .1
            .contains(&format!("{provider}://ccm-check-1")));
        assert!(checks["instance-shutdown"]
            .1
            .contains("true for stopped node stopped-1"));
        assert!(checks["zone-region"].1.contains("zone-a/region-1"));
        assert!(checks["node-lifecycle"]
            .1
            .contains("stopped node stopped-1 tainted"));
        let method = if provider == "fake" {
            "InstanceExists"
        } else {
            "InstanceExistsByProviderID"
        };
        assert!(
            checks["instance-absent"].1.starts_with(method),
            "{provider}: {}",
            checks["instance-absent"].1
        );
    }
}

#[test]
fn example_provider_passes_with_its_shipped_config() {
    let dir = tempfile::tempdir().unwrap();
    // The command of docs/writing-a-provider.md and the README, run from the repository root.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    assert!(Path::new(EXAMPLE_CONFIG).is_file(), "{EXAMPLE_CONFIG}");
    let run = check_in(
        dir.path(),
        root,
        &[
            "--cloud-provider",
            "example",
            "--cloud-config",
            "providers/example/example.conf",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    // The text table: header, one row per check, summary.
    assert!(
        run.stdout.contains("capabilities: InstancesV2\n"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("CHECK               RESULT  DETAIL\n"));
    assert!(run
        .stdout
        .contains("provider-id         pass    3 nodes, e.g. example://i-001\n"));
    assert!(run
        .stdout
        .contains("lb-idempotent       skip    skipped (no LoadBalancer)\n"));
    assert!(run
        .stdout
        .contains("route-controller    skip    skipped (no Routes)\n"));
    assert!(
        run.stdout
            .ends_with("23 checks: 13 passed, 0 failed, 10 skipped\n"),
        "{}",
        run.stdout
    );
}

#[test]
fn files_that_are_not_plugins_get_one_line_not_an_error_each() {
    // The README runs check on target/debug, where cargo puts the test fixtures too.
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir(dir.path());
    std::fs::write(plugins.join("libnot_a_plugin.so"), b"not an ELF file").unwrap();
    std::fs::write(plugins.join("libalso_not.so"), b"").unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new(BIN)
        .current_dir(root)
        .args(["check", "--plugin-dir"])
        .arg(&plugins)
        .args([
            "--cloud-provider",
            "example",
            "--cloud-config",
            "providers/example/example.conf",
        ])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("ERROR"), "{stderr}");
    assert!(!stderr.contains("refused plugin"), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "check: skipped 2 file(s) of the plugin directories that are not loadable plugins \
             (`ccm-host plugins --plugin-dir {}` says why)",
            plugins.display()
        )),
        "{stderr}"
    );
    // An unknown provider's error still names every refused file with its reason.
    let out = Command::new(BIN)
        .args(["check", "--plugin-dir"])
        .arg(&plugins)
        .args(["--cloud-provider", "nope"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("2 plugin file(s) were refused") && stderr.contains("libnot_a_plugin.so"),
        "{stderr}"
    );
}

/// Checks failed and skipped: `(id, reason)`.
type Expected<'a> = &'a [(&'a str, &'a str)];

#[test]
fn broken_providers_fail_exactly_the_checks_they_break() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "broken.conf",
        "ccm-check-1\nccm-check-2\nccm-check-3\n",
    );
    // (provider, failed checks, skipped checks): a root cause fails one check, the checks that
    // depend on it are skipped naming it.
    // Without bulk lookups the instances-batch check skips.
    const NO_BULK: (&str, &str) = (
        "instances-batch",
        "skipped (no BULK_INSTANCES: the controllers ask node by node)",
    );
    let cases: [(&str, Expected, Expected); 6] = [
        (
            "broken-lb",
            &[(
                "lb-idempotent",
                "the second EnsureLoadBalancer with the same Service and nodes returned [192.0.2.2] after [192.0.2.1]: not idempotent",
            )],
            &[NO_BULK],
        ),
        (
            "broken-panic",
            &[
                (
                    "instance-shutdown",
                    "nodes ccm-check-1, ccm-check-2, ccm-check-3: InstanceShutdown: panicked error: provider panicked in InstanceShutdown: broken-panic: InstanceShutdown is not written yet",
                ),
                (
                    "no-panics",
                    "InstanceShutdown×",
                ),
            ],
            &[
                ("instances-batch", "skipped: depends on instance-shutdown"),
                ("node-lifecycle", "skipped: depends on instance-shutdown"),
            ],
        ),
        (
            "broken-providerid",
            &[(
                "provider-id",
                "node ccm-check-1: providerID \"i-ccm-check-1\" does not have the form broken-providerid://<id>",
            )],
            &[
                ("provider-id-stable", "skipped: depends on provider-id"),
                ("instance-exists", "skipped: depends on provider-id"),
                ("instance-shutdown", "skipped: depends on provider-id"),
                ("instances-batch", "skipped: depends on provider-id"),
                ("node-lifecycle", "skipped: depends on provider-id"),
            ],
        ),
        (
            "broken-same-ip",
            &[(
                "lb-distinct",
                "Services default/ccm-check-direct and default/ccm-check-second both got 192.0.2.1: two Services must not share a load-balancer address",
            )],
            &[NO_BULK],
        ),
        (
            "broken-ignores-hosts",
            &[(
                "lb-hosts",
                "after UpdateLoadBalancer with hosts [ccm-check-1] the load balancer targets [ccm-check-1,ccm-check-2,ccm-check-3]",
            )],
            &[NO_BULK],
        ),
        (
            "broken-batch",
            &[
                (
                    "instances-batch",
                    "nodes ccm-check-1, ccm-check-2, ccm-check-3: metadata differs (InstancesBatch / InstanceMetadata): instance type \"broken.large\" / \"broken.small\"",
                ),
                (
                    "instances-batch",
                    "node ccm-check-absent-",
                ),
                (
                    "instances-batch",
                    "InstancesBatch answered instance_not_found error: instance not found for providerID \"broken-batch://ccm-check-absent-",
                ),
                (
                    "instances-batch",
                    "the contract is exists: false, not an error",
                ),
            ],
            &[("node-lifecycle", "skipped: depends on instances-batch")],
        ),
    ];
    for (provider, failed, skipped) in cases {
        let run = check(
            dir.path(),
            &[
                "--cloud-provider",
                provider,
                "--cloud-config",
                &config,
                "-o",
                "json",
            ],
        );
        assert_eq!(run.code, 1, "{provider}: {}\n{}", run.stdout, run.stderr);
        let checks = run.checks();
        for (status, expected) in [("fail", failed), ("skip", skipped)] {
            let mut want: Vec<String> = expected.iter().map(|(id, _)| id.to_string()).collect();
            want.dedup();
            assert_eq!(
                run.with_status(status),
                want,
                "{provider}: exactly these checks {status}: {checks:#?}"
            );
            for (id, reason) in expected {
                let detail = &checks[*id].1;
                assert!(
                    detail.contains(reason),
                    "{provider}/{id}: reason {detail:?} should contain {reason:?}"
                );
            }
        }
    }
}

/// A plugin whose UpdateLoadBalancer ignores its hosts and that offers no host read-back (as
/// a plugin that never wrote one) passes `check`, with `lb-hosts` skipped; `--strict` fails
/// that skip (exit 1) and nothing else.
#[test]
fn strict_fails_a_skip_that_hides_the_hosts_contract() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "broken.conf",
        "ccm-check-1\nccm-check-2\nccm-check-3\n",
    );
    let args = [
        "--cloud-provider",
        "broken-no-readback",
        "--cloud-config",
        &config,
        "-o",
        "json",
    ];
    let run = check(dir.path(), &args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.with_status("skip"), ["instances-batch", "lb-hosts"]);
    assert!(run.checks()["lb-hosts"].1.contains("no host read-back"));
    let strict: Vec<&str> = args.iter().copied().chain(["--strict"]).collect();
    let run = check(dir.path(), &strict);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.with_status("fail"), ["lb-hosts"]);
    // Bulk lookups are an optimisation, not a contract: still a skip.
    assert_eq!(run.with_status("skip"), ["instances-batch"]);
    let detail = &run.checks()["lb-hosts"].1;
    assert!(
        detail.starts_with("--strict: skipped (no host read-back"),
        "{detail}"
    );
}

/// `ccm-host check` with a call deadline of `deadline`, timed.
fn timed_check(dir: &Path, provider: &str, config: &str, deadline: &str) -> (Run, Duration) {
    let started = Instant::now();
    let run = check(
        dir,
        &[
            "--cloud-provider",
            provider,
            "--cloud-config",
            config,
            "--call-timeout",
            deadline,
            "-o",
            "json",
        ],
    );
    (run, started.elapsed())
}

#[test]
fn a_hung_call_costs_one_deadline_is_named_and_the_checks_that_need_it_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "broken.conf",
        "ccm-check-1\nccm-check-2\nccm-check-3\n",
    );
    // broken-hang: InstanceMetadata never returns (the node controller's calls hang);
    // broken-slow: InstanceShutdown takes 60 s (the kit's own calls, one per node).
    // Both ignore their context. Run side by side: each must end within deadline + 10 s.
    let deadline = Duration::from_secs(5);
    let runs: Vec<(&str, (Run, Duration))> = std::thread::scope(|s| {
        let handles: Vec<_> = ["broken-hang", "broken-slow"]
            .into_iter()
            .map(|p| {
                let (dir, config) = (dir.path(), config.as_str());
                (p, s.spawn(move || timed_check(dir, p, config, "5s")))
            })
            .collect();
        handles
            .into_iter()
            .map(|(p, h)| (p, h.join().unwrap()))
            .collect()
    });
    for (provider, (run, took)) in runs {
        assert!(
            took < deadline + Duration::from_secs(10),
            "{provider}: check took {took:?} with a {deadline:?} call deadline"
        );
        assert_eq!(run.code, 1, "{provider}: {}\n{}", run.stdout, run.stderr);
        let checks = run.checks();
        let (check, call, dependents): (&str, &str, &[&str]) = match provider {
            "broken-hang" => (
                "node-init",
                "InstanceMetadata (called by cloud-node-controller) did not return within 5s",
                &[
                    "provider-id",
                    "provider-id-stable",
                    "node-addresses",
                    "zone-region",
                    "instance-exists",
                    "instance-shutdown",
                    "instances-batch",
                    "node-lifecycle",
                ],
            ),
            _ => (
                "instance-shutdown",
                "InstanceShutdown(ccm-check-1) did not return within 5s",
                &["instances-batch", "node-lifecycle"],
            ),
        };
        assert_eq!(run.with_status("fail"), [check], "{provider}: {checks:#?}");
        assert!(
            checks[check].1.starts_with(call),
            "{provider}: {:?} should name the hung call {call:?}",
            checks[check].1
        );
        assert_eq!(
            run.with_status("skip"),
            dependents,
            "{provider}: {checks:#?}"
        );
        for id in dependents {
            assert_eq!(
                checks[*id].1,
                format!("skipped: depends on {check}"),
                "{provider}/{id}"
            );
        }
        // The probe does not call the hung method again, and does not report it twice.
        assert_eq!(checks["deadline"].0, "pass", "{provider}: {checks:#?}");
        let method = call.split(['(', ' ']).next().unwrap();
        assert!(
            checks["deadline"]
                .1
                .contains(&format!("({method} not probed: it hung earlier)")),
            "{provider}: {}",
            checks["deadline"].1
        );
    }
}

#[test]
fn a_passing_run_prints_no_warning() {
    // ok-slow answers every call correctly, in 20 ms: the deadline probe's twin calls, whose
    // deadline has passed already, end in the host before the plugin answers. That is what
    // the probe wants, not a problem to warn about.
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "broken.conf",
        "ccm-check-1\nccm-check-2\nccm-check-3\n",
    );
    let run = check(
        dir.path(),
        &["--cloud-provider", "ok-slow", "--cloud-config", &config],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let warnings: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.starts_with("warning"))
        .collect();
    assert!(warnings.is_empty(), "{warnings:#?}");
}

#[test]
fn load_balancers_may_share_an_address_when_the_provider_says_so() {
    // The fake with externalIP gives every load balancer one address, and declares it
    // (LoadBalancer::shares_addresses, ABI 1.1 LB_SHARED_ADDRESSES): lb-distinct passes.
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        dir.path(),
        "fake.yaml",
        &format!("{FAKE_CONFIG}externalIP: 192.0.2.10\n"),
    );
    let run = check(
        dir.path(),
        &[
            "--cloud-provider",
            "fake",
            "--cloud-config",
            &config,
            "--shutdown-node",
            "stopped-1",
            "-o",
            "json",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let checks = run.checks();
    let (status, detail) = &checks["lb-distinct"];
    assert_eq!(status, "pass");
    assert!(
        detail.ends_with(
            "default/ccm-check-second [192.0.2.10] (shared addresses, as the provider declares)"
        ),
        "{detail}"
    );
    // The host read-back of the fake (ABI 1.1) shows every host set the kit handed over.
    assert_eq!(checks["lb-hosts"].0, "pass", "{checks:#?}");
}

#[test]
fn a_cloud_that_synthesises_every_instance_fails_the_absent_instance_checks() {
    // The fake's default config (autoInstances) claims that any provider ID exists: the
    // lifecycle controller could never delete the Node of a deleted instance.
    let dir = tempfile::tempdir().unwrap();
    let run = check(dir.path(), &["--cloud-provider", "fake", "-o", "json"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.with_status("fail"), ["instance-absent"]);
    let checks = run.checks();
    assert!(checks["instance-absent"]
        .1
        .contains("exists, but no instance has that ID"));
    assert!(checks["instance-absent"].1.contains("autoInstances"));
    // The lifecycle controller's pass would fail for the same reason: reported once.
    assert_eq!(
        checks["node-lifecycle"],
        (
            "skip".to_string(),
            "skipped: depends on instance-absent".to_string()
        )
    );
    // --skip turns them into skips, and the run passes.
    let run = check(
        dir.path(),
        &[
            "--cloud-provider",
            "fake",
            "--skip",
            "instance-absent",
            "--skip",
            "node-lifecycle",
            "-o",
            "json",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.with_status("skip"),
        ["instance-absent", "instances-batch", "node-lifecycle"]
    );
    assert_eq!(run.checks()["node-lifecycle"].1, "skipped (--skip)");
}

#[test]
fn usage_errors_exit_2_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--cloud-provider".into(), "nope".into()],
            "error: unknown cloud provider \"nope\". Available: broken-batch (from ",
        ),
        (
            vec![
                "--cloud-provider".into(),
                "example".into(),
                "--cloud-config".into(),
                write(
                    dir.path(),
                    "bad.conf",
                    "ccm-check-1 i-1 not-an-ip zone region\n",
                ),
            ],
            "error: could not init cloud provider \"example\" (from ",
        ),
        (
            vec![
                "--cloud-provider".into(),
                "fake".into(),
                "--cloud-config".into(),
                dir.path().join("missing.yaml").display().to_string(),
            ],
            "error: --cloud-config ",
        ),
        (
            vec![
                "--cloud-provider".into(),
                "fake".into(),
                "--skip".into(),
                "everything".into(),
            ],
            "error: --skip \"everything\": no such check; the checks are: provider-name, ",
        ),
        (
            vec![
                "--cloud-provider".into(),
                "fake".into(),
                "--node".into(),
                "Not_A_Node".into(),
            ],
            "error: --node \"Not_A_Node\": \"Not_A_Node\" is not a valid node name",
        ),
    ];
    for (args, message) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = check(dir.path(), &args);
        assert_eq!(run.code, 2, "{args:?}: {}\n{}", run.stdout, run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: no report: {}", run.stdout);
        let errors: Vec<&str> = run
            .stderr
            .lines()
            .filter(|l| l.starts_with("error: "))
            .collect();
        assert_eq!(errors.len(), 1, "{args:?}: {}", run.stderr);
        assert!(
            errors[0].starts_with(message),
            "{args:?}: {:?} should start with {message:?}",
            errors[0]
        );
    }
    // The factory error names the bad line.
    let run = check(
        dir.path(),
        &[
            "--cloud-provider",
            "example",
            "--cloud-config",
            &write(dir.path(), "bad2.conf", "just-a-name\n"),
        ],
    );
    assert!(run
        .stderr
        .contains("line 1: want <node-name> <instance-id> <internal-ip> <zone> <region>"));
    // An unreadable plugin directory.
    let out = Command::new(BIN)
        .args([
            "check",
            "--plugin-dir",
            "/nonexistent/plugins",
            "--cloud-provider",
            "fake",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("error: plugin directory /nonexistent/plugins"));
}
