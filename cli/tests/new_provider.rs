//! `ccm-host new-provider` end to end, as a vendor would use it: the SDK copied out of this
//! repository (it must stand alone), a provider scaffolded against that copy, built with cargo
//! outside the workspace (own target directory; this repository's Cargo.lock copied in so the
//! dependency versions are the host's, and no network is needed), its own tests run, and
//! `ccm-host check` run against the built `.so` with the sample config: exit code 0. The first
//! run compiles abi_stable, k8s-openapi and serde once, a few minutes on 2 cores.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::BIN;

/// `target/` of this build (target/debug/deps/<test> → target/).
fn target() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dst = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dst);
        } else {
            std::fs::copy(entry.path(), dst).unwrap();
        }
    }
}

fn ok(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cargo(dir: &Path, target_dir: &Path, args: &[&str]) -> Output {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    Command::new(cargo)
        .current_dir(dir)
        .args(args)
        .args(["--offline", "--target-dir"])
        .arg(target_dir)
        .output()
        .expect("cargo runs")
}

fn new_provider(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("new-provider")
        .args(args)
        .output()
        .expect("ccm-host runs")
}

#[test]
fn a_scaffolded_provider_builds_on_its_own_and_passes_check() {
    let work = target().join("new-provider-test");
    let src = work.join("src");
    let _ = std::fs::remove_dir_all(&src);
    // The SDK, copied out of the repository: only the package's own files.
    let sdk = src.join("sdk");
    copy_dir(&repo().join("provider-abi/src"), &sdk.join("src"));
    for file in ["Cargo.toml", "README.md"] {
        std::fs::copy(repo().join("provider-abi").join(file), sdk.join(file)).unwrap();
    }
    let sdk_arg = sdk.display().to_string();
    let target_dir = work.join("target");
    let plugins = work.join("plugins");
    let _ = std::fs::remove_dir_all(&plugins);
    std::fs::create_dir_all(&plugins).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o755)).unwrap();

    // (name, --with, the summary check prints)
    let cases = [
        (
            "acme",
            Some("loadbalancer,routes,zones"),
            "23 checks: 22 passed, 0 failed, 1 skipped",
        ),
        ("tiny", None, "23 checks: 13 passed, 0 failed, 10 skipped"),
    ];
    for (name, with, summary) in cases {
        let dir = src.join(name);
        let dir_arg = dir.display().to_string();
        // acme copies the SDK from --sdk-path, tiny gets the host's own copy.
        let mut args = vec![name, "--path", &dir_arg];
        if name == "acme" {
            args.extend(["--sdk-path", &sdk_arg]);
        }
        if let Some(with) = with {
            args.extend(["--with", with]);
        }
        let out = new_provider(&args);
        ok("ccm-host new-provider", &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains(&format!(
                "wrote the {name} provider crate ccm-provider-{name}"
            )),
            "{stdout}"
        );
        for file in [
            "Cargo.toml",
            "src/lib.rs",
            "tests/provider.rs",
            "cloud-config.json",
            "Dockerfile",
            "ci/check.sh",
            "README.md",
        ] {
            assert!(dir.join(file).is_file(), "{name}: {file} written");
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(
            manifest.contains("ccm-provider-abi = { path = \"sdk\", version = "),
            "{manifest}"
        );
        assert!(
            !manifest.contains(&*work.display().to_string()),
            "no absolute path in {manifest}"
        );
        assert!(
            dir.join("sdk/src/lib.rs").is_file(),
            "{name}: the SDK copied into sdk/"
        );
        let dockerfile = std::fs::read_to_string(dir.join("Dockerfile")).unwrap();
        assert!(
            dockerfile.contains(&format!(
                "COPY --from=build --chown=0:0 --chmod=0644 /libccm_provider_{name}.so /usr/lib/ccm-host/plugins/"
            )),
            "{dockerfile}"
        );
        assert!(std::fs::read_to_string(dir.join("ci/check.sh"))
            .unwrap()
            .contains(&format!(
                "check \\\n  --plugin-dir \"$plugins\" \\\n  --cloud-provider {name}"
            )));

        // Standalone build and tests, with the host's dependency versions.
        std::fs::copy(repo().join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
        ok(
            &format!("{name}: cargo build"),
            &cargo(&dir, &target_dir, &["build"]),
        );
        ok(
            &format!("{name}: cargo test"),
            &cargo(&dir, &target_dir, &["test"]),
        );
        let so = format!("libccm_provider_{name}.so");
        std::fs::copy(target_dir.join("debug").join(&so), plugins.join(&so)).unwrap();

        // The conformance kit with the sample config, as written.
        let config = dir.join("cloud-config.json");
        let out = Command::new(BIN)
            .args(["check", "--cloud-provider", name, "--plugin-dir"])
            .arg(&plugins)
            .arg("--cloud-config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        ok(&format!("{name}: ccm-host check"), &out);
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(
            report.ends_with(&format!("{summary}\n")),
            "{name}:\n{report}"
        );
    }
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken");
    std::fs::create_dir_all(&taken).unwrap();
    std::fs::write(taken.join("file"), "x").unwrap();
    let not_sdk = dir.path().join("not-sdk");
    std::fs::create_dir_all(&not_sdk).unwrap();
    std::fs::write(not_sdk.join("Cargo.toml"), "[package]\nname = \"other\"\n").unwrap();
    let fresh = dir.path().join("fresh").display().to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["Acme".into(), "--path".into(), fresh.clone()],
            "error: provider name \"Acme\": use lowercase letters",
        ),
        (
            vec!["acme".into(), "--path".into(), taken.display().to_string()],
            "error: --path ",
        ),
        (
            vec![
                "acme".into(),
                "--path".into(),
                fresh.clone(),
                "--sdk-path".into(),
                not_sdk.display().to_string(),
            ],
            "error: --sdk-path ",
        ),
        (
            vec![
                "acme".into(),
                "--path".into(),
                fresh.clone(),
                "--sdk-version".into(),
                "2.0".into(),
            ],
            "error: --sdk-version 2.0: this host loads ccm-provider-abi 1.x plugins",
        ),
        (
            vec![
                "acme".into(),
                "--path".into(),
                fresh.clone(),
                "--with".into(),
                "gpus".into(),
            ],
            "error: invalid value 'gpus' for '--with <CAPABILITY,...>'",
        ),
    ];
    for (args, message) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = new_provider(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {stderr}");
        assert!(
            errors[0].starts_with(message),
            "{args:?}: {:?} should start with {message:?}",
            errors[0]
        );
    }
    assert!(
        !dir.path().join("fresh").exists(),
        "nothing is written on a usage error"
    );
    // By default the crate carries this host's SDK in sdk/, by a relative path.
    let out = new_provider(&["acme", "--path", &fresh]);
    ok("new-provider", &out);
    let manifest = std::fs::read_to_string(dir.path().join("fresh/Cargo.toml")).unwrap();
    let abi = ccm_provider_abi::ABI_VERSION;
    assert!(
        manifest.contains(&format!(
            "ccm-provider-abi = {{ path = \"sdk\", version = \"{abi}\" }}"
        )),
        "{manifest}"
    );
    let sdk_manifest = std::fs::read_to_string(dir.path().join("fresh/sdk/Cargo.toml")).unwrap();
    assert!(
        sdk_manifest.contains(&format!("version = \"{abi}\"")),
        "{sdk_manifest}"
    );
}
