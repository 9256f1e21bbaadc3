//! `ccm-host sandbox` as a real process: a small generated scene and the example scenario
//! converge (exit 0) with the fake provider, bad input exits 2 with the reason, a scene whose
//! load balancers cannot be created exits 1 naming them, and kubectl works against the
//! sandbox while it serves.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

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
    assert!(
        stderr.contains("sandbox: API server http://127.0.0.1:"),
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
    assert!(cloud["source"]
        .as_str()
        .unwrap()
        .starts_with("fake cloud state"));
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
fn example_scenario_converges() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sandbox/example-scenario.yaml");
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
    assert!(
        stderr.contains("error: the scene did not converge within 15s"),
        "{stderr}"
    );
}

/// `kubectl` against the sandbox while it serves (skipped without kubectl on PATH).
#[test]
fn kubectl_works_against_the_running_sandbox() {
    let Some(kubectl) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("kubectl"))
            .find(|p| p.is_file())
    }) else {
        eprintln!("note: kubectl is not on PATH; skipping the kubectl test");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("sandbox.kubeconfig");
    let mut child = Command::new(BIN)
        .arg("sandbox")
        .arg("--plugin-dir")
        .arg(plugin_dir(dir.path()))
        .args(["--nodes", "4", "--services", "2", "--duration", "10m"])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    let started = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let serving = line.starts_with("sandbox: serving");
                seen.push(line);
                if serving {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the sandbox ended early:\n{}", seen.join("\n"))
            }
        }
        if started.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("the sandbox did not start serving:\n{}", seen.join("\n"));
        }
    }
    let kubectl_get = |args: &[&str]| -> String {
        let out = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--cache-dir")
            .arg(dir.path().join("kube-cache"))
            .arg("get")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl get {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let nodes = kubectl_get(&["nodes", "-o", "wide"]);
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

    let ids = kubectl_get(&["nodes", "-o", "jsonpath={.items[*].spec.providerID}"]);
    assert_eq!(
        ids,
        "fake://node-01 fake://node-02 fake://node-03 fake://node-04"
    );

    let services = kubectl_get(&["services", "-A"]);
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

    // Events are written by a queue of their own: wait for the load balancer's.
    let started = Instant::now();
    loop {
        let events = kubectl_get(&["events", "-A"]);
        if events.contains("EnsuredLoadBalancer") && events.contains("service/web") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{events}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // SIGINT ends the serving period; the scene had converged: exit 0.
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    let mut summary = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut summary)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{summary}");
    assert!(summary.starts_with("Sandbox converged"), "{summary}");
    assert!(summary.contains("fake://node-04"), "{summary}");
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
    assert!(
        stderr.contains("error: cloud provider Initialize failed: no credentials"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "error: the controller manager stopped (exit code 1) before the scene converged"
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
