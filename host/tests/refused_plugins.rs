//! Plugins the loader refuses although they are valid ccm-host plugins in every other way: one
//! built with `panic = "abort"` (tests/fixtures/panic-abort, outside the workspace because the
//! panic strategy is a profile setting; built here with cargo, its lock file and its own target
//! directory: the first run compiles abi_stable and k8s-openapi once, about two minutes on 2
//! cores).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::BIN;

/// Build the panic=abort fixture plugin and return the `.so`.
fn build_panic_abort_plugin() -> PathBuf {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/panic-abort/Cargo.toml");
    // target/debug/deps/<test> → target/
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let target_dir = target.join("panic-abort-fixture");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--locked", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building the panic=abort fixture failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let so = target_dir.join("debug/libccm_fixture_panic_abort.so");
    assert!(so.is_file(), "{} was not built", so.display());
    so
}

/// A plugin directory holding only `so`, as the loader wants it (ours, not group/other
/// writable).
fn dir_with(dir: &Path, so: &Path) -> PathBuf {
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    std::fs::copy(so, plugins.join(so.file_name().unwrap())).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o755)).unwrap();
    plugins
}

const REASON: &str = "was built with panic = \"abort\": its first panic would end the whole host; \
                      rebuild it with panic = \"unwind\" (the default) so the SDK can catch panics";

#[test]
fn a_plugin_built_with_panic_abort_is_refused_with_one_clear_line() {
    let so = build_panic_abort_plugin();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir_with(dir.path(), &so);

    // `ccm-host plugins`: not loaded, refused with the reason.
    let out = Command::new(BIN)
        .args(["plugins", "-o", "json", "--plugin-dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["plugins"], Value::Array(vec![]), "{listing:#}");
    let refused = listing["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{listing:#}");
    assert_eq!(refused[0]["reason"], REASON);
    // One log line says so, naming the file.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("panic")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("refused plugin") && lines[0].contains("libccm_fixture_panic_abort.so"),
        "{stderr}"
    );

    // Selecting its provider is a usage error naming the refusal (exit 2), before any call.
    let out = Command::new(BIN)
        .args(["check", "--cloud-provider", "abort", "--plugin-dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let error = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        error.starts_with("error: unknown cloud provider \"abort\". No plugin registered any provider. 1 plugin file(s) were refused: "),
        "{error}"
    );
    assert!(error.ends_with(REASON), "{error}");
}
