//! Plugins the loader refuses although they are valid ccm-host plugins in every other way, built
//! here with cargo outside the workspace, each with its lock file and its own target directory
//! (the first run compiles abi_stable and k8s-openapi once per fixture, about two minutes on 2
//! cores):
//! - one built with `panic = "abort"` (tests/fixtures/panic-abort; outside the workspace because
//!   the panic strategy is a profile setting);
//! - one built against an SDK whose `CallContext` has a field more than this host's: the frozen
//!   1.0 sources of tests/fixtures/abi-1.0 with that one change, the layout mismatch of a plugin
//!   built against another (e.g. an unreleased) ccm-provider-abi.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::BIN;

/// `target/` of this build (target/debug/deps/<test> → target/).
fn target() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

/// Build a fixture plugin outside the workspace with its lock file; returns the `.so`.
fn build(manifest: &Path, target_dir: &Path, so: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--locked", "--manifest-path"])
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building {} failed:\n{}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let so = target_dir.join("debug").join(so);
    assert!(so.is_file(), "{} was not built", so.display());
    so
}

/// Build the panic=abort fixture plugin and return the `.so`.
fn build_panic_abort_plugin() -> PathBuf {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/panic-abort/Cargo.toml");
    build(
        &manifest,
        &target().join("panic-abort-fixture"),
        "libccm_fixture_panic_abort.so",
    )
}

/// Copy `from` to `to` recursively, writing only files whose content differs (so cargo does
/// not rebuild what did not change), with `edit` applied to each file's text.
fn copy_tree(from: &Path, to: &Path, edit: &dyn Fn(&Path, String) -> String) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst, edit);
            continue;
        }
        let text = edit(&src, std::fs::read_to_string(&src).unwrap());
        if std::fs::read_to_string(&dst).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&dst, text).unwrap();
        }
    }
}

/// The 1.0 fixture plugin built against its frozen SDK with one change, a third field in
/// `CallContext`: what a plugin built against an SDK of another layout looks like.
fn build_layout_mismatch_plugin() -> PathBuf {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/abi-1.0");
    let dir = target().join("abi-mismatch-fixture");
    let edit = |path: &Path, text: String| {
        if !path.ends_with("src/context.rs") {
            return text;
        }
        let changed = text
            .replacen(
                "    cancelled: RArc<AtomicBool>,\n}",
                "    cancelled: RArc<AtomicBool>,\n    trace_id: u64,\n}",
                1,
            )
            .replacen(
                "            cancelled: RArc::new(AtomicBool::new(false)),\n        }",
                "            cancelled: RArc::new(AtomicBool::new(false)),\n            trace_id: 0,\n        }",
                1,
            );
        assert_eq!(
            changed.matches("trace_id").count(),
            2,
            "the frozen context.rs changed: update this edit"
        );
        changed
    };
    copy_tree(&fixture, &dir.join("src"), &edit);
    build(
        &dir.join("src/plugin/Cargo.toml"),
        &dir.join("target"),
        "libccm_fixture_abi_1_0.so",
    )
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

    // `ccm-host plugins`: not loaded, refused with the reason; nothing loaded is exit 1.
    let out = Command::new(BIN)
        .args(["plugins", "-o", "json", "--plugin-dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listing["plugins"], Value::Array(vec![]), "{listing:#}");
    let refused = listing["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{listing:#}");
    assert_eq!(refused[0]["kind"], "PanicAbort", "{listing:#}");
    assert_eq!(refused[0]["reason"], REASON);
    assert!(
        refused[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("libccm_fixture_panic_abort.so"),
        "{listing:#}"
    );
    // The listing names the file; stderr says once that nothing loaded.
    assert_eq!(
        stderr,
        format!(
            "error: no plugin loaded from {} (1 file(s) refused, each listed with the reason)\n",
            plugins.display()
        )
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

#[test]
fn a_plugin_of_another_layout_is_refused_naming_the_type_and_both_sides() {
    let so = build_layout_mismatch_plugin();
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir_with(dir.path(), &so);
    let out = Command::new(BIN)
        .args(["plugins", "-o", "json", "--plugin-dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "nothing loaded: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    let refused = listing["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{listing:#}");
    assert_eq!(refused[0]["kind"], "InterfaceMismatch", "{listing:#}");
    // abi_stable's report of this is 2,000 lines; the reason is one, from its structured form.
    assert_eq!(
        refused[0]["reason"],
        "its plugin interface does not match this host: type CallContext (an argument of \
         AbiCloudProvider::initialize): 3 fields in the plugin, 2 in this host; rebuild it \
         against ccm-provider-abi 1.x, x <= 2"
    );
}
