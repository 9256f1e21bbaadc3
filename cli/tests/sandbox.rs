//! `ccm-host sandbox` as a real process: a small generated scene and the example scenario
//! converge (exit 0) with the fake provider, bad input exits 2 with the reason, a scene whose
//! load balancers cannot be created exits 1 naming them and why (first, with a capped list),
//! a lost lease is named as the reason, the summary's events are the API server's, the
//! kubeconfig the hints name exists while the server runs and is deleted (or kept) as the last
//! line says, kubectl (or, without it, the requests kubectl makes) works against the
//! sandbox while it serves, and the hybrid scenario (fake and metal in one host, a kwok node
//! neither owns) converges with each node's owner and each service's provider in the summary.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod support;

use support::{plugin_dir, BIN};

fn sandbox(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("sandbox")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir))
        .args(["--progress", "lines"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ccm-host runs")
}

fn json_report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not a JSON report ({e}):\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Write `yaml` as a scenario file in `dir` and run the sandbox on it with a JSON report.
fn sandbox_scenario(dir: &Path, yaml: &str, timeout: &str) -> (Output, Value, String) {
    let scenario = dir.join("scenario.yaml");
    std::fs::write(&scenario, yaml).unwrap();
    let out = sandbox(
        dir,
        &[
            "--scenario",
            scenario.to_str().unwrap(),
            "--timeout",
            timeout,
            "-o",
            "json",
        ],
    );
    let report = json_report(&out);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    (out, report, stderr)
}

fn find<'a>(items: &'a Value, key: &str, value: &str) -> &'a Value {
    items
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i[key] == value)
        .unwrap_or_else(|| panic!("no item with {key}={value} in {items:#}"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// A sandbox process whose stderr lines arrive on a channel and whose stdout is collected as it
/// is written (the summary comes before the serving period ends).
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Vec<String>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stdout_done: mpsc::Receiver<()>,
}

impl Running {
    fn spawn(dir: &Path, args: &[&str]) -> Running {
        let mut child = Command::new(BIN)
            .arg("sandbox")
            .arg("--plugin-dir")
            .arg(plugin_dir(dir))
            .args(["--progress", "lines"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let (done, stdout_done) = mpsc::channel();
        let (sink, mut pipe) = (stdout.clone(), child.stdout.take().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            let _ = done.send(());
        });
        Running {
            child,
            lines,
            stderr: Vec::new(),
            stdout,
            stdout_done,
        }
    }

    /// The first stderr line (from now on) for which `want` holds.
    fn wait_line(&mut self, what: &str, timeout: Duration, want: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            match self.lines.recv_timeout(Duration::from_secs(1)) {
                Ok(line) => {
                    self.stderr.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the sandbox ended before {what}:\n{}",
                        self.stderr.join("\n")
                    )
                }
            }
            if started.elapsed() > timeout {
                let _ = self.child.kill();
                panic!("no {what} within {timeout:?}:\n{}", self.stderr.join("\n"));
            }
        }
    }

    /// The summary on stdout as JSON, once it has been written completely.
    fn json_summary(&self, timeout: Duration) -> Value {
        let started = Instant::now();
        loop {
            let bytes = self.stdout.lock().unwrap().clone();
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                return v;
            }
            assert!(
                started.elapsed() < timeout,
                "no JSON summary: {}",
                String::from_utf8_lossy(&bytes)
            );
            // Wait for more output (or its end) rather than spinning.
            let _ = self.stdout_done.recv_timeout(Duration::from_millis(100));
        }
    }

    fn interrupt(&self) {
        // SAFETY: kill(2) on our own child's pid.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGINT);
        }
    }

    /// Wait for the exit; returns the status, stdout and every stderr line.
    fn finish(mut self) -> (ExitStatus, String, Vec<String>) {
        let status = self.child.wait().unwrap();
        let _ = self.stdout_done.recv_timeout(Duration::from_secs(30));
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(30)) {
            self.stderr.push(line);
        }
        let stdout = String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned();
        (status, stdout, self.stderr)
    }
}

/// `http://127.0.0.1:PORT` from the sandbox's first line.
fn api_url(line: &str) -> String {
    line.strip_prefix("sandbox: API server ")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no API server URL in {line:?}"))
        .to_string()
}

/// The kubeconfig the first line tells kubectl to use.
fn hinted_kubeconfig(line: &str) -> PathBuf {
    let rest = line
        .split("kubectl --kubeconfig ")
        .nth(1)
        .unwrap_or_else(|| panic!("no kubectl hint in {line:?}"));
    PathBuf::from(rest.split_whitespace().next().unwrap())
}

/// The kubeconfig the last line says was deleted with the temporary directory.
fn deleted_kubeconfig(line: &str) -> PathBuf {
    let path = line
        .strip_prefix("sandbox: stopped; the API server is gone and its kubeconfig ")
        .and_then(|rest| {
            rest.strip_suffix(
                " was deleted with the sandbox's temporary directory (--kubeconfig-out PATH keeps one)",
            )
        })
        .unwrap_or_else(|| panic!("not the last line of a temporary sandbox: {line:?}"));
    PathBuf::from(path)
}

/// One HTTP/1.1 request to the sandbox's API server; returns the status code and the JSON body.
fn http(url: &str, method: &str, path: &str, patch: Option<&Value>) -> (u16, Value) {
    let addr = url.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let body = patch.map(Value::to_string).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAccept: application/json\r\n\
         Content-Type: application/merge-patch+json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("{method} {path}: {code}, not JSON ({e}): {body}"));
    (code, json)
}

/// The server's core/v1 events by (type, reason): (objects, sum of their counts).
fn server_event_counts(url: &str) -> BTreeMap<(String, String), (u64, u64)> {
    let (code, list) = http(url, "GET", "/api/v1/events", None);
    assert_eq!(code, 200, "{list:#}");
    let mut counts = BTreeMap::new();
    for e in list["items"].as_array().unwrap() {
        let key = (
            e["type"].as_str().unwrap().to_string(),
            e["reason"].as_str().unwrap().to_string(),
        );
        let entry = counts.entry(key).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += e["count"].as_u64().unwrap_or(1);
    }
    counts
}

/// The summary's events in the same shape.
fn summary_event_counts(report: &Value) -> BTreeMap<(String, String), (u64, u64)> {
    report["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                (
                    e["type"].as_str().unwrap().to_string(),
                    e["reason"].as_str().unwrap().to_string(),
                ),
                (e["objects"].as_u64().unwrap(), e["count"].as_u64().unwrap()),
            )
        })
        .collect()
}

#[test]
fn small_generated_scene_converges() {
    let dir = tempfile::tempdir().unwrap();
    let out = sandbox(
        dir.path(),
        &[
            "--nodes",
            "3",
            "--services",
            "2",
            "--timeout",
            "3m",
            "-o",
            "json",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["converged"], true);
    assert_eq!(report["outcome"], "converged");
    assert!(report["notConverged"].as_array().unwrap().is_empty());
    assert_eq!(report["provider"]["name"], "fake");
    assert_eq!(report["expected"]["routes"], "on");
    let first = stderr
        .lines()
        .find(|l| l.starts_with("sandbox: API server http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("{stderr}"));
    // Without --duration the sandbox is gone seconds later: the hint names no temporary file
    // but the flags that keep one serving; the last line says the temporary kubeconfig went,
    // and it did.
    assert!(
        first.ends_with(
            "(the sandbox exits once the scene converged; to use kubectl, rerun with --duration 10m \
             --kubeconfig-out PATH, then kubectl --kubeconfig PATH get nodes -o wide)"
        ),
        "{first}"
    );
    let kubeconfig = deleted_kubeconfig(stderr.lines().last().unwrap());
    assert!(!kubeconfig.exists(), "{}", kubeconfig.display());
    // Every node's Synced event is in the summary (the events settle before it is taken).
    assert_eq!(report["eventsSettled"], true);
    let synced = find(&report["events"], "reason", "Synced");
    assert_eq!(
        (&synced["objects"], &synced["count"]),
        (&json!(3), &json!(3)),
        "{stderr}"
    );

    let nodes = &report["nodes"];
    assert_eq!(nodes.as_array().unwrap().len(), 3);
    for n in nodes.as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        assert_eq!(n["initialised"], true, "{n:#}");
        assert_eq!(n["providerID"], format!("fake://{name}"));
        assert_eq!(n["routeCreated"], true, "{n:#}");
        assert_eq!(n["region"], "fake-region-1");
        assert!(n["zone"].as_str().unwrap().starts_with("fake-zone-"));
    }
    // node-03 registered with a provided node IP: it stays the first address.
    let node3 = find(nodes, "name", "node-03");
    assert_eq!(node3["addresses"][0], "InternalIP=10.0.0.13");
    assert_eq!(find(nodes, "name", "node-01")["instanceType"], "fake.large");

    let services = &report["services"];
    let web = find(services, "name", "web");
    assert_eq!(web["owned"], true);
    let ingress = strings(&web["ingress"]);
    assert_eq!(ingress.len(), 1);
    assert!(ingress[0].starts_with("198.1"), "{ingress:?}");
    let foreign = find(services, "name", "other-class-lb");
    assert_eq!(foreign["owned"], false);
    assert_eq!(foreign["loadBalancerClass"], "example.com/other-lb");
    assert!(foreign["ingress"].as_array().unwrap().is_empty());
    assert_eq!(foreign["finalizer"], false);

    // The cloud's view: one LB backed by the workers (the control plane is excluded), one route
    // per node inside the cluster CIDR.
    let cloud = &report["cloud"];
    // Read from cloud.json, which is deleted with the temporary directory: not named.
    assert_eq!(
        cloud["source"],
        "fake cloud state: cloud.json in the sandbox's temporary directory, deleted at exit \
         (--work-dir DIR keeps it)"
    );
    let lbs = cloud["loadBalancers"].as_array().unwrap();
    assert_eq!(lbs.len(), 1, "{cloud:#}");
    assert_eq!(lbs[0]["service"], "default/web");
    assert_eq!(strings(&lbs[0]["addresses"]), ingress);
    assert_eq!(strings(&lbs[0]["hosts"]), ["node-02", "node-03"]);
    let mut routes: Vec<(String, String)> = cloud["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["targetNode"].as_str().unwrap().to_string(),
                r["destinationCIDR"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    routes.sort();
    assert_eq!(
        routes,
        [
            ("node-01".to_string(), "10.244.0.0/24".to_string()),
            ("node-02".to_string(), "10.244.1.0/24".to_string()),
            ("node-03".to_string(), "10.244.2.0/24".to_string()),
        ]
    );
    // Leader election ran: the sandbox's daemon held the lease.
    assert_eq!(report["lease"], "kube-system/cloud-controller-manager");
    assert!(report["leaseHolder"]
        .as_str()
        .is_some_and(|h| !h.is_empty()));
}

#[test]
fn the_kubeconfig_the_hint_names_exists_while_the_hint_is_true() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = Running::spawn(
        dir.path(),
        &["--nodes", "2", "--services", "1", "--duration", "5m"],
    );
    let first = run.wait_line("the API server line", Duration::from_secs(120), |l| {
        l.starts_with("sandbox: API server ")
    });
    // With --duration the hint names the temporary kubeconfig, for as long as it serves.
    assert!(
        first.contains(" get nodes -o wide, until 5m0s after the scene converged; that kubeconfig is deleted when the sandbox exits: --kubeconfig-out PATH keeps one)"),
        "{first}"
    );
    let url = api_url(&first);
    let kubeconfig = hinted_kubeconfig(&first);
    run.wait_line("the serving line", Duration::from_secs(240), |l| {
        l.starts_with("sandbox: serving")
    });
    // Still there while it serves, and it reaches the server.
    let text = std::fs::read_to_string(&kubeconfig)
        .unwrap_or_else(|e| panic!("{}: {e}", kubeconfig.display()));
    assert!(text.contains(&url), "{text}");
    assert_eq!(http(&url, "GET", "/api/v1/nodes", None).0, 200);
    // The summary names no file of the temporary directory.
    let summary = String::from_utf8_lossy(&run.stdout.lock().unwrap()).into_owned();
    assert!(
        !summary.contains("/ccm-sandbox-") && !summary.contains("/cloud.json"),
        "{summary}"
    );
    run.interrupt();
    let (status, _, stderr) = run.finish();
    assert_eq!(status.code(), Some(0), "{}", stderr.join("\n"));
    assert_eq!(deleted_kubeconfig(stderr.last().unwrap()), kubeconfig);
    assert!(!kubeconfig.exists());
}

/// The README's "for another provider": a provider without a demo cloud (example) does not know
/// the generated node names; the why line says what it answered and where to look, and the
/// scenario docs/sandbox.md shows for it converges.
#[test]
fn another_provider_says_what_it_answered_and_its_scenario_converges() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = support::plugin_dir_with(
        dir.path(),
        &["libccm_provider_fake.so", "libccm_provider_example.so"],
    );
    let run = |args: &[&str]| {
        Command::new(BIN)
            .arg("sandbox")
            .arg("--plugin-dir")
            .arg(&plugins)
            .args(["--progress", "none", "--cloud-provider", "example"])
            .args(args)
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run(&["--nodes", "2", "--services", "0", "--timeout", "3s"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let why = stdout
        .lines()
        .find(|l| l.starts_with("  why: "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(
        why,
        "  why: no error seen; 2 item(s) still open when the wait ended; provider example answers \
         for node node-01: instance not found (the generated nodes are named node-01…: does your \
         cloud know these names? give it a scenario with your instances' names, see \
         docs/sandbox.md#another-provider)"
    );
    let out = run(&[
        "--scenario",
        "docs/scenarios/example.yaml",
        "--timeout",
        "2m",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A scenario of `cloudConfig:` only (faults for the demo cloud, as docs/sandbox.md suggests)
/// applies to the generated scene, and says so.
#[test]
fn a_scenario_of_cloud_config_only_runs_over_the_generated_scene() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report, stderr) = sandbox_scenario(
        dir.path(),
        "cloudConfig:\n  errors:\n    EnsureLoadBalancer: {kind: other, message: quota exceeded, times: 1}\n",
        "3m",
    );
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{stderr}");
    assert!(
        stderr.contains("has no nodes: and no services:, so its keys apply to the generated scene (20 nodes, 5 LoadBalancer services)"),
        "{stderr}"
    );
    assert_eq!(report["nodes"].as_array().unwrap().len(), 20);
    assert_eq!(report["services"].as_array().unwrap().len(), 5);
    // The cloudConfig is in force: the first EnsureLoadBalancer failed.
    let failed = find(&report["events"], "reason", "SyncLoadBalancerFailed");
    assert_eq!(failed["type"], "Warning", "{failed:#}");
}

#[test]
fn example_scenario_converges() {
    let dir = tempfile::tempdir().unwrap();
    let scenario =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/src/sandbox/example-scenario.yaml");
    let out = sandbox(
        dir.path(),
        &[
            "--scenario",
            scenario.to_str().unwrap(),
            "--timeout",
            "3m",
            "-o",
            "json",
            "--",
            "--concurrent-node-syncs",
            "2",
        ],
    );
    let report = json_report(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(report["scene"].as_str().unwrap().starts_with("scenario "));
    let nodes = &report["nodes"];
    let names: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cp-1", "worker-a", "worker-b", "worker-c"]);
    let a = find(nodes, "name", "worker-a");
    assert_eq!(
        strings(&a["addresses"]),
        [
            "InternalIP=10.1.0.21",
            "ExternalIP=203.0.113.21",
            "Hostname=worker-a"
        ]
    );
    assert_eq!(a["instanceType"], "fake.xlarge");
    assert_eq!(a["zone"], "eu-west-1a");
    assert_eq!(a["podCIDR"], "10.100.21.0/24");
    let c = find(nodes, "name", "worker-c");
    assert_eq!(c["instanceType"], "fake.medium", "the demo cloud's default");
    assert_eq!(c["zone"], "eu-west-1b");

    let services = &report["services"];
    let payments = find(services, "name", "payments");
    assert_eq!(payments["namespace"], "shop");
    assert_eq!(strings(&payments["ingress"]), ["198.18.10.10"]);
    let storefront = find(services, "name", "storefront");
    assert!(strings(&storefront["ingress"])[0].starts_with("198.18."));
    let gateway = find(services, "name", "metrics-gateway");
    assert_eq!(gateway["owned"], false);
    assert!(gateway["ingress"].as_array().unwrap().is_empty());
    let hosts = strings(
        &find(
            &report["cloud"]["loadBalancers"],
            "service",
            "shop/payments",
        )["hosts"],
    );
    assert_eq!(hosts, ["worker-a", "worker-b", "worker-c"]);
}

#[test]
fn bad_input_exits_2_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (
            vec!["--scenario".into(), write("typo.yaml", "nodes:\n- name: a\nservicez: []\n")],
            vec!["invalid scenario", "typo.yaml", "unknown field `servicez`, expected one of"],
        ),
        (
            vec![
                "--scenario".into(),
                write(
                    "semantic.yaml",
                    "clusterCIDR: 10.8.0.0/16\nnodes:\n- {name: a, podCIDR: 10.9.0.0/24}\n- {name: a}\nservices:\n- {name: web, ports: [{port: 70000}]}\n",
                ),
            ],
            vec![
                "nodes[0].podCIDR: 10.9.0.0/24 is not inside the cluster CIDR 10.8.0.0/16",
                "nodes[1].name: duplicate node name \"a\"",
                "services[0].ports[0].port: 70000 is not between 1 and 65535",
            ],
        ),
        (
            // Refused by the API server's own validation (dry run), nothing seeded.
            vec![
                "--scenario".into(),
                write(
                    "api.yaml",
                    "nodes:\n- {name: ok-node}\n- {name: Bad_Node}\nservices:\n- {name: web, labels: {app: \"not valid!\"}}\n",
                ),
            ],
            vec!["the API server refused the scene", "nodes[1]:", "Bad_Node", "services[0]:", "not valid!"],
        ),
        (
            vec!["--cloud-provider".into(), "nope".into()],
            vec!["unknown cloud provider \"nope\"", "fake"],
        ),
        (
            vec!["--nodes".into(), "2".into(), "--".into(), "--kubeconfig".into(), "/x".into()],
            vec!["--kubeconfig after -- is set by the sandbox"],
        ),
        (
            vec!["--".into(), "--concurrent-service-syncs".into(), "0".into()],
            vec!["flags after --", "--concurrent-service-syncs must be greater than 0"],
        ),
        (
            vec!["--timeout".into(), "soon".into()],
            vec!["--timeout: invalid duration \"soon\""],
        ),
        (
            vec!["--nodes".into(), "300".into(), "--cluster-cidr".into(), "10.0.0.0/24".into()],
            vec!["invalid scene", "--cluster-cidr 10.0.0.0/24 has room for 1 more /24 pod ranges, but 300 nodes need one"],
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = sandbox(dir.path(), &args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}\n{stderr}");
        assert!(stderr.contains("error: "), "{args:?}\n{stderr}");
        for e in expected {
            assert!(stderr.contains(e), "{args:?}: expected {e:?} in\n{stderr}");
        }
        assert!(out.stdout.is_empty(), "no summary for bad input: {args:?}");
    }
}

#[test]
fn scene_that_cannot_converge_exits_1_naming_what_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report, stderr) = sandbox_scenario(
        dir.path(),
        "nodes:\n- {name: n1}\n- {name: n2}\nservices:\n- {name: web}\ncloudConfig:\n  errors:\n    EnsureLoadBalancer: {kind: other, message: quota exceeded}\n",
        "15s",
    );
    assert_eq!(out.status.code(), Some(1), "{report:#}\n{stderr}");
    assert_eq!(report["converged"], false);
    assert_eq!(report["outcome"], "timed out after 15s");
    let open = strings(&report["notConverged"]);
    let web: Vec<&&str> = open
        .iter()
        .filter(|p| p.starts_with("service default/web: no load balancer ingress yet"))
        .collect();
    assert_eq!(web.len(), 1, "{open:#?}");
    assert!(
        web[0].contains("quota exceeded"),
        "the last warning is named: {open:#?}"
    );
    assert_eq!(
        report["reason"],
        "first error seen: Warning SyncLoadBalancerFailed on service default/web: Error syncing load balancer: failed to ensure load balancer: quota exceeded"
    );
    assert!(
        stderr.contains(
            "error: the scene did not converge within 15s: first error seen: Warning SyncLoadBalancerFailed on service default/web"
        ),
        "{stderr}"
    );
}

/// The text summary of a scene that does not converge: the first lines say why (before the
/// tables and the list of open items), and a long list of open items is capped.
#[test]
fn not_converged_summary_says_why_first_and_caps_the_list() {
    let dir = tempfile::tempdir().unwrap();
    // 25 nodes the cloud cannot describe (25 open items) and a service it cannot serve.
    let mut yaml = String::from("nodes:\n");
    for i in 1..=25 {
        yaml.push_str(&format!("- {{name: n{i:02}}}\n"));
    }
    yaml.push_str(
        "services:\n- {name: web}\ncloudConfig:\n  errors:\n    InstanceMetadata: {kind: other, message: metadata service down}\n    EnsureLoadBalancer: {kind: other, message: quota exceeded}\n",
    );
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(&scenario, yaml).unwrap();
    let out = sandbox(
        dir.path(),
        &["--scenario", scenario.to_str().unwrap(), "--timeout", "10s"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("Sandbox did NOT converge after ")
            && lines[0].ends_with(": timed out after 10s"),
        "{stdout}"
    );
    assert_eq!(
        lines[1],
        "  why: first error seen: Warning SyncLoadBalancerFailed on service default/web: Error syncing load balancer: failed to ensure load balancer: quota exceeded",
        "{stdout}"
    );
    assert_eq!(
        lines[2],
        "  open: 26 item(s), first: node n01: not initialised (no providerID, still tainted) (all at the end)",
        "{stdout}"
    );
    // The list at the end: 20 items, then how many more.
    let list = lines
        .iter()
        .position(|l| *l == "Not converged (26):")
        .unwrap_or_else(|| panic!("{stdout}"));
    let items: Vec<&&str> = lines[list + 1..]
        .iter()
        .take_while(|l| l.starts_with("  - "))
        .collect();
    assert_eq!(items.len(), 20, "{stdout}");
    assert_eq!(
        lines[list + 21],
        "  … and 6 more (-o json lists every item)",
        "{stdout}"
    );
    assert_eq!(
        lines.len(),
        list + 22,
        "the list ends the summary: {stdout}"
    );
}

/// A leader that loses its lease stops its controllers; the summary's first lines say so.
/// Also: the kubeconfig the first line names exists while the server runs, and is gone after.
#[test]
fn a_lost_lease_is_named_as_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("stuck.yaml");
    std::fs::write(
        &scenario,
        "nodes:\n- {name: n1}\nservices:\n- {name: web}\ncloudConfig:\n  ensureReturnsNil: true\n",
    )
    .unwrap();
    let mut run = Running::spawn(
        dir.path(),
        &["--timeout", "10m", "--scenario", scenario.to_str().unwrap()],
    );
    let first = run.wait_line("the API server line", Duration::from_secs(120), |l| {
        l.starts_with("sandbox: API server ")
    });
    let url = api_url(&first);
    // Wait for the sandbox's controller manager to lead (its node controller did its work: a
    // holder in the Lease alone is not enough, the elector may not have confirmed it yet and
    // would then stay a standby), then give the lease to someone else.
    let lease =
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/cloud-controller-manager";
    run.wait_line("the node initialised", Duration::from_secs(60), |l| {
        l.contains("nodes initialised 1/1")
    });
    let started = Instant::now();
    while !http(&url, "GET", lease, None).1["spec"]["holderIdentity"].is_string() {
        assert!(started.elapsed() < Duration::from_secs(60), "nobody leads");
        std::thread::sleep(Duration::from_millis(100));
    }
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let (code, body) = http(
        &url,
        "PATCH",
        lease,
        Some(
            &json!({"spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
            "renewTime": now}}),
        ),
    );
    assert_eq!(code, 200, "{body:#}");
    let (status, stdout, stderr) = run.finish();
    let stderr = stderr.join("\n");
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].ends_with(": the controller manager stopped with exit code 1"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("  why: the leader lost its lease (leaderelection lost")
            && lines[1].ends_with("), so the controllers stopped (exit code 1)"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("error: the scene did not converge: the leader lost its lease"),
        "{stderr}"
    );
    let kubeconfig = deleted_kubeconfig(stderr.lines().last().unwrap());
    assert!(!kubeconfig.exists(), "{}", kubeconfig.display());
    assert!(
        stderr.ends_with(&format!(
            "its kubeconfig {} was deleted with the sandbox's temporary directory (--kubeconfig-out PATH keeps one)",
            kubeconfig.display()
        )),
        "{stderr}"
    );
}

fn kubectl_on_path() -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|p| p.join("kubectl"))
        .find(|p| p.is_file())
}

/// While the sandbox serves: the summary's events are what the API server holds; the requests
/// `kubectl describe node`, `kubectl get pods -A` and `kubectl describe service` make (taken
/// from kubectl 1.32's `-v=6`) are answered, checked over HTTP whether or not kubectl is
/// installed; kubectl itself works when it is on PATH; `--kubeconfig-out` keeps its file and
/// the last line says so.
#[test]
fn kubectl_and_the_summary_agree_with_the_running_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("sandbox.kubeconfig");
    let mut run = Running::spawn(
        dir.path(),
        &[
            "--nodes",
            "4",
            "--services",
            "2",
            "--duration",
            "10m",
            "-o",
            "json",
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
        ],
    );
    let first = run.wait_line("the API server line", Duration::from_secs(120), |l| {
        l.starts_with("sandbox: API server ")
    });
    let url = api_url(&first);
    assert_eq!(hinted_kubeconfig(&first), kubeconfig, "{first}");
    run.wait_line("the serving line", Duration::from_secs(240), |l| {
        l.starts_with("sandbox: serving")
    });
    let report = run.json_summary(Duration::from_secs(30));
    assert_eq!(report["converged"], true, "{report:#}");
    let ids: Vec<&str> = report["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["providerID"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "fake://node-01",
            "fake://node-02",
            "fake://node-03",
            "fake://node-04"
        ]
    );

    // The summary's events are the server's: every event object and every repeat, among them
    // one Synced event per node.
    assert_eq!(report["eventsSettled"], true, "{report:#}");
    let summary = summary_event_counts(&report);
    assert_eq!(summary, server_event_counts(&url));
    assert_eq!(summary[&("Normal".to_string(), "Synced".to_string())].0, 4);

    // Discovery names what the verbs below read.
    let resources = |v: &Value| -> Vec<String> {
        v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (_, core) = http(&url, "GET", "/api/v1?timeout=32s", None);
    for r in ["pods", "endpoints", "nodes", "services", "events"] {
        assert!(resources(&core).iter().any(|n| n == r), "{r}: {core:#}");
    }
    let (code, disc) = http(&url, "GET", "/apis/discovery.k8s.io/v1?timeout=32s", None);
    assert_eq!(
        (code, resources(&disc)),
        (200, vec!["endpointslices".to_string()])
    );

    // kubectl describe node node-02: its pods (none run here), its events, its kubelet Lease.
    let (code, node) = http(&url, "GET", "/api/v1/nodes/node-02", None);
    assert_eq!(code, 200);
    let node_uid = node["metadata"]["uid"].as_str().unwrap();
    let (code, pods) = http(
        &url,
        "GET",
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-02%2Cstatus.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed&limit=500",
        None,
    );
    assert_eq!(
        (code, &pods["kind"], &pods["items"]),
        (200, &json!("PodList"), &json!([]))
    );
    let (code, events) = http(
        &url,
        "GET",
        &format!("/api/v1/events?fieldSelector=involvedObject.name%3Dnode-02%2CinvolvedObject.namespace%3D%2CinvolvedObject.kind%3DNode%2CinvolvedObject.uid%3D{node_uid}&limit=500"),
        None,
    );
    assert_eq!(code, 200, "{events:#}");
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["Synced"], "{events:#}");
    let (code, lease) = http(
        &url,
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-02",
        None,
    );
    assert_eq!(code, 200, "{lease:#}");
    assert_eq!(lease["spec"]["holderIdentity"], "node-02");
    assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], node_uid);

    // kubectl get pods -A: an empty list, not a 404.
    let (code, pods) = http(&url, "GET", "/api/v1/pods?limit=500", None);
    assert_eq!((code, &pods["items"]), (200, &json!([])));

    // kubectl describe service web: its EndpointSlices (none) and its events.
    let (code, web) = http(&url, "GET", "/api/v1/namespaces/default/services/web", None);
    assert_eq!(code, 200);
    let web_uid = web["metadata"]["uid"].as_str().unwrap();
    let (code, slices) = http(
        &url,
        "GET",
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb",
        None,
    );
    assert_eq!((code, &slices["items"]), (200, &json!([])), "{slices:#}");
    let (code, events) = http(
        &url,
        "GET",
        &format!("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dweb%2CinvolvedObject.namespace%3Ddefault%2CinvolvedObject.kind%3DService%2CinvolvedObject.uid%3D{web_uid}&limit=500"),
        None,
    );
    assert_eq!(code, 200, "{events:#}");
    assert!(
        events["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["reason"] == "EnsuredLoadBalancer"),
        "{events:#}"
    );

    match kubectl_on_path() {
        Some(kubectl) => run_kubectl(&kubectl, &kubeconfig, dir.path(), &summary),
        None => eprintln!(
            "note: kubectl is not on PATH: checked the requests it makes, not kubectl itself"
        ),
    }

    // SIGINT ends the serving period; the scene had converged: exit 0. --kubeconfig-out keeps
    // its file, and the last line says the server it names is gone.
    run.interrupt();
    let (status, _, stderr) = run.finish();
    assert_eq!(status.code(), Some(0), "{stderr:#?}");
    assert_eq!(
        stderr.last().map(String::as_str),
        Some(
            format!(
                "sandbox: stopped; the API server is gone, {} is kept but points at it",
                kubeconfig.display()
            )
            .as_str()
        ),
        "{stderr:#?}"
    );
    assert!(kubeconfig.is_file());
}

/// The real kubectl against the serving sandbox.
fn run_kubectl(
    kubectl: &Path,
    kubeconfig: &Path,
    dir: &Path,
    events: &BTreeMap<(String, String), (u64, u64)>,
) {
    let kubectl_run = |args: &[&str]| -> String {
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(dir.join("kube-cache"))
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let nodes = kubectl_run(&["get", "nodes", "-o", "wide"]);
    let header: Vec<&str> = nodes.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "STATUS",
            "ROLES",
            "AGE",
            "VERSION",
            "INTERNAL-IP",
            "EXTERNAL-IP",
            "OS-IMAGE",
            "KERNEL-VERSION",
            "CONTAINER-RUNTIME"
        ],
        "{nodes}"
    );
    let rows: Vec<Vec<&str>> = nodes
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "{nodes}");
    assert_eq!(
        &rows[0][..3],
        ["node-01", "Ready", "control-plane"],
        "{nodes}"
    );
    // Initialised by the cloud-node controller: addresses from the demo cloud.
    assert_eq!(rows[0][5], "10.0.0.11", "{nodes}");
    assert_eq!(rows[1][..2], ["node-02", "Ready"], "{nodes}");
    assert_eq!(rows[1][6], "198.51.100.12", "{nodes}");

    let ids = kubectl_run(&["get", "nodes", "-o", "jsonpath={.items[*].spec.providerID}"]);
    assert_eq!(
        ids,
        "fake://node-01 fake://node-02 fake://node-03 fake://node-04"
    );

    let services = kubectl_run(&["get", "services", "-A"]);
    let web = services
        .lines()
        .find(|l| l.contains(" web "))
        .unwrap_or_else(|| panic!("{services}"));
    let cols: Vec<&str> = web.split_whitespace().collect();
    assert_eq!(cols[..3], ["default", "web", "LoadBalancer"], "{services}");
    assert!(cols[4].starts_with("198.1"), "{services}");
    let other = services
        .lines()
        .find(|l| l.contains("other-class-lb"))
        .unwrap();
    assert!(other.contains("<pending>"), "{services}");

    // `kubectl get events -A` lists as many events as the summary counted.
    let listed = kubectl_run(&["get", "events", "-A", "--no-headers"]);
    let objects: u64 = events.values().map(|(objects, _)| objects).sum();
    assert_eq!(listed.lines().count() as u64, objects, "{listed}");

    let node = kubectl_run(&["describe", "node", "node-02"]);
    for want in [
        "ProviderID:                   fake://node-02",
        "HolderIdentity:  node-02",
        "Non-terminated Pods:          (0 in total)",
        "Synced",
    ] {
        assert!(node.contains(want), "{want:?} in\n{node}");
    }
    assert_eq!(kubectl_run(&["get", "pods", "-A"]), "", "no pods");
    let svc = kubectl_run(&["describe", "service", "web"]);
    for want in ["LoadBalancer Ingress:     198.1", "EnsuredLoadBalancer"] {
        assert!(svc.contains(want), "{want:?} in\n{svc}");
    }
}

#[test]
fn controllers_that_stop_end_the_wait_with_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let (out, report, stderr) = sandbox_scenario(
        dir.path(),
        "nodes:\n- {name: n1}\ncloudConfig:\n  errors:\n    Initialize: {kind: other, message: no credentials}\n",
        "10m",
    );
    assert_eq!(out.status.code(), Some(1), "{report:#}\n{stderr}");
    assert_eq!(
        report["outcome"],
        "the controller manager stopped with exit code 1"
    );
    assert_eq!(
        report["reason"],
        "the controllers stopped (exit code 1): cloud provider Initialize failed: no credentials"
    );
    assert!(
        stderr.contains("error: cloud provider Initialize failed: no credentials"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "error: the scene did not converge: the controllers stopped (exit code 1): cloud provider Initialize failed: no credentials"
        ),
        "{stderr}"
    );
}

#[test]
fn interrupt_before_convergence_exits_130_with_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("stuck.yaml");
    std::fs::write(
        &scenario,
        "nodes:\n- {name: n1}\nservices:\n- {name: web}\ncloudConfig:\n  ensureReturnsNil: true\n",
    )
    .unwrap();
    let mut child = Command::new(BIN)
        .arg("sandbox")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir.path()))
        .args([
            "--progress",
            "lines",
            "-o",
            "json",
            "--timeout",
            "10m",
            "--scenario",
        ])
        .arg(&scenario)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first progress line: the controllers are running.
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let progress = line.contains("nodes initialised");
        seen.push(line);
        if progress {
            break;
        }
    }
    assert!(
        seen.last().is_some_and(|l| l.contains("nodes initialised")),
        "{seen:#?}"
    );
    // SAFETY: kill(2) on our own child's pid.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert_eq!(out.status.code(), Some(130), "{seen:#?}\n{rest:#?}");
    let report = json_report(&out);
    assert_eq!(report["outcome"], "interrupted");
    assert_eq!(report["converged"], false);
    let open = strings(&report["notConverged"]);
    assert!(
        open.iter()
            .any(|p| p.starts_with("service default/web: no load balancer ingress yet")),
        "{open:#?}"
    );
}

/// `-- --secure-port N`: the embedded daemon's secure port delegates to the sandbox's API server,
/// which accepts the token the sandbox prints: anonymous `/metrics` is refused, the token's is
/// served.
#[test]
fn the_secure_port_delegates_to_the_sandboxs_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let mut running = Running::spawn(
        dir.path(),
        &[
            "--nodes",
            "2",
            "--services",
            "1",
            "--duration",
            "5m",
            "--",
            "--secure-port",
            &port,
            "--bind-address",
            "127.0.0.1",
        ],
    );
    let line = running.wait_line("the secure port's line", Duration::from_secs(60), |l| {
        l.starts_with("sandbox: secure port https://127.0.0.1:")
    });
    let token = line
        .split("Authorization: Bearer ")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .to_string();
    assert!(
        line.contains(&format!("https://127.0.0.1:{port}/metrics")),
        "{line}"
    );
    let port: u16 = port.parse().unwrap();
    let started = Instant::now();
    while !matches!(support::https::get(port, "/healthz", None), Ok((200, _))) {
        assert!(started.elapsed() < Duration::from_secs(60), "no /healthz");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(support::https::get(port, "/metrics", None).unwrap().0, 403);
    let (code, body) = support::https::get(port, "/metrics", Some(&token)).unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("# TYPE node_controller_initial_node_sync_delay_seconds histogram"),
        "{body}"
    );
    running.interrupt();
    let (status, _, stderr) = running.finish();
    assert!(status.code().is_some(), "{}", stderr.join("\n"));
}

/// A plugin directory with the broken-provider fixture (its `ok-slow` provider is correct and
/// keeps its cloud in memory), as cargo built it for this test run.
fn broken_fixture_dir(dir: &Path) -> PathBuf {
    support::plugin_dir_with(&dir.join("broken"), &["libccm_fixture_broken.so"])
}

#[test]
fn the_cloud_view_is_the_controllers_provider_and_a_string_cloud_config_is_verbatim() {
    // ok-slow's cloud config is a list of node names, one per line: neither YAML nor JSON, so
    // the scenario gives it as a string, handed over verbatim. Its load balancers and routes
    // live in the provider instance's memory: the summary's cloud view must come from the
    // instance the controllers used (another instance would hold none).
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(
        &scenario,
        "nodes:\n  - {name: ccm-check-1}\n  - {name: ccm-check-2}\n\
         services:\n  - {name: web, ports: [{port: 80}]}\n  - {name: api, ports: [{port: 80}]}\n\
         cloudConfig: |\n  ccm-check-1\n  ccm-check-2\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("sandbox")
        .arg("--plugin-dir")
        .arg(broken_fixture_dir(dir.path()))
        .args(["--cloud-provider", "ok-slow", "--scenario"])
        .arg(&scenario)
        .args(["--progress", "lines", "--timeout", "60s", "-o", "json"])
        .stdin(Stdio::null())
        .output()
        .expect("ccm-host runs");
    let report = json_report(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{report:#}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cloud = &report["cloud"];
    assert_eq!(
        cloud["source"],
        "provider calls to ok-slow (GetLoadBalancer, ListRoutes)"
    );
    let services: Vec<&str> = cloud["loadBalancers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lb| lb["service"].as_str().unwrap())
        .collect();
    assert_eq!(services, ["default/api", "default/web"], "{cloud:#}");
    let routed: Vec<&str> = cloud["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["targetNode"].as_str().unwrap())
        .collect();
    assert_eq!(routed, ["ccm-check-1", "ccm-check-2"], "{cloud:#}");
}

/// `ccm-host check`'s distinct-address rule in the sandbox: a provider that gives every
/// Service the same address without declaring shared addresses does not converge, and the
/// summary says why (exit 1).
#[test]
fn services_sharing_an_address_do_not_converge_unless_the_provider_declares_it() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.yaml");
    std::fs::write(
        &scenario,
        "nodes:\n  - {name: ccm-check-1}\n\
         services:\n  - {name: web, ports: [{port: 80}]}\n  - {name: api, ports: [{port: 80}]}\n\
         cloudConfig: |\n  ccm-check-1\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("sandbox")
        .arg("--plugin-dir")
        .arg(broken_fixture_dir(dir.path()))
        .args(["--cloud-provider", "broken-same-ip", "--scenario"])
        .arg(&scenario)
        .args(["--progress", "lines", "--timeout", "20s"])
        .stdin(Stdio::null())
        .output()
        .expect("ccm-host runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let all = format!("{stdout}{stderr}");
    assert!(
        all.contains(
            "services default/web, default/api all got 192.0.2.1 from provider broken-same-ip"
        ) && all.contains("lb-distinct"),
        "{all}"
    );
}

/// A plugin directory with the fake and metal plugins, as cargo built them for this test run.
fn fake_and_metal_dir(dir: &Path) -> PathBuf {
    support::plugin_dir_with(
        dir,
        &["libccm_provider_fake.so", "libccm_provider_metal.so"],
    )
}

#[test]
fn the_hybrid_scenario_converges_with_each_provider_on_its_own() {
    // docs/scenarios/hybrid.yaml: fake and metal in one host, each initialising the nodes of
    // its platform and serving the Services of its classes, and a kwok node of a platform
    // neither owns that must stay untouched.
    let dir = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/scenarios/hybrid.yaml");
    let out = Command::new(BIN)
        .arg("sandbox")
        .arg("--plugin-dir")
        .arg(fake_and_metal_dir(dir.path()))
        .arg("--scenario")
        .arg(&scenario)
        .args(["--progress", "lines", "--timeout", "3m", "-o", "json"])
        .stdin(Stdio::null())
        .output()
        .expect("ccm-host runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report = json_report(&out);
    assert_eq!(out.status.code(), Some(0), "{report:#}\n{stderr}");
    assert_eq!(report["converged"], true);
    assert_eq!(report["ownershipEnforced"], true);
    let providers: Vec<&str> = report["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(providers, ["fake", "metal"]);
    assert_eq!(report["provider"]["name"], "fake", "the default provider");
    let metal = &report["providers"][1];
    assert_eq!(strings(&metal["platforms"]), ["metal://"]);
    assert_eq!(strings(&metal["loadBalancerClasses"]), ["metal-lb"]);
    assert_eq!(metal["classless"], false);
    assert_eq!(
        metal["expected"]["routes"],
        "off: the provider does not support Routes"
    );
    assert!(
        stderr.contains("running the controllers with providers fake ("),
        "{stderr}"
    );

    // Every node of a loaded provider's platform initialised by that provider.
    let nodes = &report["nodes"];
    for (name, owner) in [
        ("cloud-a", "fake"),
        ("cloud-b", "fake"),
        ("rack1-node-1", "metal"),
        ("rack2-node-1", "metal"),
    ] {
        let n = find(nodes, "name", name);
        assert_eq!(n["initialised"], true, "{n:#}");
        assert_eq!(n["owner"], owner, "{n:#}");
        assert_eq!(n["providerID"], format!("{owner}://{name}"), "{n:#}");
        assert!(n.get("untouched").is_none(), "{n:#}");
    }
    // The fake's nodes got routes; metal has none to give.
    assert_eq!(find(nodes, "name", "cloud-a")["routeCreated"], true);
    assert_eq!(
        find(nodes, "name", "rack1-node-1")["routeCreated"],
        Value::Null
    );
    let rack2 = find(nodes, "name", "rack2-node-1");
    assert_eq!(rack2["zone"], "rack2");
    assert_eq!(rack2["instanceType"], "r650");
    // cloud-b registered with a provided node IP: it stays the first address.
    assert_eq!(
        find(nodes, "name", "cloud-b")["addresses"][0],
        "InternalIP=10.0.0.42"
    );
    // The kwok node: foreign, and exactly as seeded (providerID, tainted, no cloud labels).
    let kwok = find(nodes, "name", "kwok-node-1");
    assert_eq!(kwok["owner"], "foreign");
    assert_eq!(kwok["untouched"], true);
    assert_eq!(kwok["initialised"], false);
    assert_eq!(kwok["providerID"], "kwok://kwok-node-1");
    assert_eq!(kwok["zone"], "");
    assert_eq!(kwok["instanceType"], "");
    assert_eq!(strings(&kwok["addresses"]), ["Hostname=kwok-node-1"]);

    // Each Service served by the provider of its class (classless: the default provider).
    let services = &report["services"];
    for (name, provider, pool) in [
        ("web", "fake", "198.18."),
        ("checkout", "fake", "198.18."),
        ("ledger", "metal", "192.0.2."),
    ] {
        let svc = find(services, "name", name);
        assert_eq!(svc["provider"], provider, "{svc:#}");
        assert_eq!(svc["owned"], true);
        let ingress = strings(&svc["ingress"]);
        assert_eq!(ingress.len(), 1, "{svc:#}");
        assert!(ingress[0].starts_with(pool), "{svc:#}");
    }
    let ledger_ip = strings(&find(services, "name", "ledger")["ingress"])[0].to_string();
    let last: u8 = ledger_ip.rsplit('.').next().unwrap().parse().unwrap();
    assert!(
        (17..=30).contains(&last),
        "{ledger_ip} is from the scenario's pool 192.0.2.16/28"
    );
    let gateway = find(services, "name", "metrics-gateway");
    assert_eq!(gateway["provider"], Value::Null);
    assert_eq!(gateway["owned"], false);
    assert!(gateway["ingress"].as_array().unwrap().is_empty());
    assert_eq!(gateway["finalizer"], false);

    // The cloud view: each load balancer in its provider's cloud, the fake's backed by the
    // fake's own nodes only.
    let lbs = &report["cloud"]["loadBalancers"];
    let web = find(lbs, "service", "default/web");
    assert_eq!(web["provider"], "fake");
    assert_eq!(strings(&web["hosts"]), ["cloud-a", "cloud-b"]);
    let ledger = find(lbs, "service", "shop/ledger");
    assert_eq!(ledger["provider"], "metal");
    assert_eq!(strings(&ledger["addresses"]), [ledger_ip.as_str()]);
    let routed: Vec<&str> = report["cloud"]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["targetNode"].as_str().unwrap())
        .collect();
    assert_eq!(routed, ["cloud-a", "cloud-b"]);
    // The unclaimed nodes were claimed by the provider that knows them.
    let claimed = find(&report["events"], "reason", "CloudProviderClaimedNode");
    assert_eq!(claimed["objects"], 4, "{:#}", report["events"]);
    assert!(
        report["events"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["type"] != "Warning"),
        "{:#}\n{stderr}",
        report["events"]
    );
}

/// Sizes are checked before anything is allocated for them: one line, exit 2.
#[test]
fn oversized_generated_scenes_are_refused_before_allocation() {
    for (flag, value) in [("--nodes", "100000000"), ("--services", "100001")] {
        let out = Command::new(BIN)
            .args(["sandbox", flag, value])
            .stdin(Stdio::null())
            .output()
            .expect("ccm-host runs");
        assert_eq!(out.status.code(), Some(2), "{flag} {value}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(
            errors,
            [format!(
                "error: {flag} {value}: at most 100000 (the sandbox holds the whole scene in memory)"
            )],
            "{stderr}"
        );
    }
}
