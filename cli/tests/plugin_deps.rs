//! A plugin's shared-library dependencies are held to the plugin's trust rules, `$ORIGIN`
//! bundles load although plugins are loaded by descriptor, and a plugin that aborts in its
//! `register` is named on stderr. The bundle is the `ccm-fixture-bundled` plugin (RUNPATH
//! `$ORIGIN:$ORIGIN/deps`, needs `libccmbundle.so`) with its C library built here with `cc`
//! from tests/fixtures/bundled/bundle.c; the library's constructor writes the file named by
//! `CCM_BUNDLE_MARKER`, which tells whether the host ran any of its code.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use support::{plugin_dir_with, BIN};

/// Build `libccmbundle.so` (SONAME libccmbundle.so) into `dir`.
fn build_bundle_library(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/bundled/bundle.c");
    let lib = dir.join("libccmbundle.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-Wl,-soname,libccmbundle.so", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(
        out.status.success(),
        "{cc} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).unwrap();
    lib
}

/// `ccm-host plugins -o json --plugin-dir <plugins>` with the bundle's marker file set.
fn list(plugins: &Path, marker: &Path) -> (Output, Value) {
    let out = Command::new(BIN)
        .args(["plugins", "-o", "json", "--plugin-dir"])
        .arg(plugins)
        .env("CCM_BUNDLE_MARKER", marker)
        .output()
        .unwrap();
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON listing ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, listing)
}

/// The refusal of `file` in a listing.
fn refusal<'a>(listing: &'a Value, file: &str) -> Option<&'a Value> {
    listing["refused"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["path"].as_str().unwrap().ends_with(file))
}

#[test]
fn an_origin_bundle_loads_with_its_library_next_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir_with(dir.path(), &["libccm_fixture_bundled.so"]);
    build_bundle_library(&plugins);
    let marker = dir.path().join("constructor-ran");

    let (out, listing) = list(&plugins, &marker);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{listing:#}");
    let loaded = listing["plugins"].as_array().unwrap();
    assert_eq!(loaded.len(), 1, "{listing:#}");
    assert!(
        loaded[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("libccm_fixture_bundled.so"),
        "{listing:#}"
    );
    // The provider name comes from the bundled library: it was resolved and called.
    assert_eq!(loaded[0]["providers"][0]["name"], "bundled", "{listing:#}");
    assert!(marker.is_file(), "the bundled library was not loaded");
    // The library itself sits in the plugin directory: scanned, and refused as no plugin.
    let lib = refusal(&listing, "libccmbundle.so").expect("the library is listed as refused");
    assert_eq!(lib["kind"], "NotAPlugin", "{lib:#}");
}

#[test]
fn a_dependency_in_a_world_writable_directory_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir_with(dir.path(), &["libccm_fixture_bundled.so"]);
    let deps = plugins.join("deps");
    build_bundle_library(&deps);
    std::fs::set_permissions(&deps, std::fs::Permissions::from_mode(0o777)).unwrap();
    let marker = dir.path().join("constructor-ran");

    let (out, listing) = list(&plugins, &marker);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{listing:#}");
    assert_eq!(listing["plugins"], serde_json::json!([]), "{listing:#}");
    let refused = refusal(&listing, "libccm_fixture_bundled.so").expect("the plugin is refused");
    assert_eq!(refused["kind"], "InsecureDependency", "{refused:#}");
    let reason = refused["reason"].as_str().unwrap();
    let deps_dir = std::fs::canonicalize(&deps).unwrap();
    assert_eq!(
        reason,
        format!(
            "its dependency libccmbundle.so ({}/libccmbundle.so, found through RUNPATH \
             $ORIGIN/deps): refusing to load it: the directory {} is writable by group or others \
             (mode 777); fix it with `chmod go-w {}` or pass --allow-insecure-plugins",
            deps_dir.display(),
            deps_dir.display(),
            deps_dir.display()
        )
    );
    assert!(
        !marker.exists(),
        "the library's constructor ran although it was refused"
    );

    // The same library, group-writable itself, next to the plugin: refused too.
    std::fs::remove_dir_all(&deps).unwrap();
    let lib = build_bundle_library(&plugins);
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (out, listing) = list(&plugins, &marker);
    assert_eq!(out.status.code(), Some(1), "{listing:#}");
    let refused = refusal(&listing, "libccm_fixture_bundled.so").unwrap();
    assert_eq!(refused["kind"], "InsecureDependency", "{refused:#}");
    let lib = std::fs::canonicalize(&lib).unwrap();
    assert_eq!(
        refused["reason"],
        format!(
            "its dependency libccmbundle.so ({}, found through RUNPATH $ORIGIN): refusing to load \
             it: the file is writable by group or others (mode 666); fix it with `chmod go-w {}` \
             or pass --allow-insecure-plugins",
            lib.display(),
            lib.display()
        )
    );
    assert!(!marker.exists());

    // With --allow-insecure-plugins it loads (a warning names the library).
    let out = Command::new(BIN)
        .args([
            "plugins",
            "-o",
            "json",
            "--allow-insecure-plugins",
            "--plugin-dir",
        ])
        .arg(&plugins)
        .env("CCM_BUNDLE_MARKER", &marker)
        .output()
        .unwrap();
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        listing["plugins"][0]["providers"][0]["name"], "bundled",
        "{listing:#}"
    );
    assert!(marker.is_file());
}

#[test]
fn a_plugin_aborting_in_register_is_named_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugin_dir_with(
        dir.path(),
        &["libccm_provider_fake.so", "libccm_fixture_misbehaving.so"],
    );
    let aborting = plugins.join("libccm_fixture_misbehaving-abort-in-register.so");
    std::fs::rename(plugins.join("libccm_fixture_misbehaving.so"), &aborting).unwrap();

    let out = Command::new(BIN)
        .args(["plugins", "--plugin-dir"])
        .arg(&plugins)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{stderr}");
    let line = format!(
        "ccm-host: fatal signal SIGABRT during register of plugin {}",
        aborting.display()
    );
    assert!(
        stderr.lines().any(|l| l == line),
        "no line {line:?} in:\n{stderr}"
    );
}
