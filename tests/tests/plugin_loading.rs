//! The real loader on real `.so` files: good plugins, several at once, and every bad input.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ccm_host::plugin::{LoaderOptions, PluginRegistry, Refusal, SelectError};
use ccm_host::provider::pool::Stuck;
use ccm_host::provider::ProviderOptions;
use ccm_integration_tests::{built_plugin, libs, PluginDir};
use ccm_provider_abi::ErrorKind;
use k8s_openapi::api::core::v1::Node;

fn load(dir: &Path) -> PluginRegistry {
    PluginRegistry::load_dirs(&[dir.to_path_buf()], &LoaderOptions::default())
        .expect("directory loads")
}

/// Why `file` was refused (its one line checked to be one line).
fn refused_reason(registry: &PluginRegistry, file: &str) -> Refusal {
    let r = registry
        .refused()
        .iter()
        .find(|r| r.path.file_name().is_some_and(|n| n == file))
        .unwrap_or_else(|| panic!("{file} was not refused; refused: {:?}", registry.refused()));
    let line = r.refusal.to_string();
    assert!(!line.contains('\n'), "reason must be one line: {line:?}");
    r.refusal.clone()
}

fn provider_names(registry: &PluginRegistry) -> Vec<String> {
    registry.providers().map(|p| p.name.clone()).collect()
}

fn node(name: &str) -> Node {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap()
}

#[test]
fn fake_plugin_registers_two_providers() {
    let dir = PluginDir::new().with(libs::FAKE, "fake.so");
    let registry = load(dir.path());
    assert!(registry.refused().is_empty(), "{:?}", registry.refused());
    assert_eq!(provider_names(&registry), ["fake", "fake-v1"]);
    let plugin = &registry.plugins()[0];
    assert_eq!(plugin.plugin_name, "ccm-provider-fake");
    assert_eq!(plugin.abi_version, ccm_provider_abi::ABI_VERSION);
    assert_eq!(plugin.providers, ["fake", "fake-v1"]);

    let fake = registry
        .create("fake", None, &ProviderOptions::default())
        .expect("fake builds");
    assert_eq!(fake.provider_name(), "fake");
    assert!(fake.capabilities().instances_v2);
    let legacy = registry
        .create("fake-v1", None, &ProviderOptions::default())
        .expect("fake-v1 builds");
    assert!(!legacy.capabilities().instances_v2);
    assert!(legacy.capabilities().instances);
}

#[test]
fn two_plugin_files_load_side_by_side() {
    let dir = PluginDir::new()
        .with(libs::FAKE, "10-fake.so")
        .with(libs::MISBEHAVING, "20-other.so");
    let registry = load(dir.path());
    assert!(registry.refused().is_empty(), "{:?}", registry.refused());
    assert_eq!(registry.plugins().len(), 2);
    let mut names = provider_names(&registry);
    names.sort();
    assert_eq!(
        names,
        [
            "factory-error",
            "factory-panic",
            "fake",
            "fake-v1",
            "misbehaving"
        ]
    );
    assert_eq!(
        registry
            .get("misbehaving")
            .unwrap()
            .plugin_path
            .file_name()
            .unwrap(),
        "20-other.so"
    );
}

#[test]
fn files_that_are_not_plugins_are_refused_with_the_reason() {
    let dir = PluginDir::new();
    dir.write("text.so", b"this is not a shared library");
    dir.write("short.so", b"\x7fEL");
    let real = std::fs::read(built_plugin(libs::FAKE)).unwrap();
    dir.write("truncated.so", &real[..4096]);
    dir.add(libs::NOT_A_PLUGIN, "libnot-a-plugin.so");
    dir.write("README.txt", b"ignored: not a .so");
    let registry = load(dir.path());
    assert!(registry.plugins().is_empty());
    assert_eq!(registry.refused().len(), 4, "{:?}", registry.refused());
    assert_eq!(
        refused_reason(&registry, "text.so"),
        Refusal::NotAPlugin("not an ELF shared library".into())
    );
    assert_eq!(
        refused_reason(&registry, "short.so"),
        Refusal::NotAPlugin("file too short to be a shared library".into())
    );
    let truncated = refused_reason(&registry, "truncated.so");
    assert!(
        matches!(&truncated, Refusal::NotAPlugin(why) if why.starts_with("truncated")),
        "{truncated:?}"
    );
    let not_plugin = refused_reason(&registry, "libnot-a-plugin.so");
    assert!(
        matches!(&not_plugin, Refusal::NotAPlugin(why) if why.starts_with("it exports no plugin root module")),
        "{not_plugin:?}"
    );
    assert_eq!(
        not_plugin.to_string(),
        "is not a ccm-host provider plugin (it exports no plugin root module; build it with \
         ccm_provider_abi::export_plugin!)"
    );
}

#[test]
fn abi_incompatible_plugin_is_refused_with_one_line() {
    let dir = PluginDir::new()
        .with(libs::ABI_MISMATCH, "old.so")
        .with(libs::FAKE, "fake.so");
    let registry = load(dir.path());
    let reason = refused_reason(&registry, "old.so");
    // One line from abi_stable's structured report: the type, where it is, both sides; any
    // 1.x plugin loads (docs/abi-1.1.md), so the advice names the range this host accepts.
    assert!(
        matches!(reason, Refusal::InterfaceMismatch { .. }),
        "{reason:?}"
    );
    assert_eq!(
        reason.to_string(),
        "its plugin interface does not match this host: type PluginModule (the plugin's root \
         module): package ccm-fixture-abi-mismatch in the plugin, ccm-provider-abi in this host; \
         rebuild it against ccm-provider-abi 1.x, x <= 2"
    );
    // A broken plugin that is not selected does not stop the others.
    assert_eq!(provider_names(&registry), ["fake", "fake-v1"]);
}

#[test]
fn registration_problems_name_the_files() {
    let dir = PluginDir::new()
        .with(libs::FAKE, "a-fake.so")
        .with(libs::MISBEHAVING, "b-duplicate.so")
        .with(libs::MISBEHAVING, "c-empty-name.so")
        .with(libs::MISBEHAVING, "d-panic-in-register.so")
        .with(libs::MISBEHAVING, "e-registers-nothing.so");
    let registry = load(dir.path());
    // A name registered by two files is refused for both, naming both (upstream: fatal); the
    // files' other providers stay.
    let dup = refused_reason(&registry, "b-duplicate.so");
    let Refusal::DuplicateProvider { name, files } = &dup else {
        panic!("{dup:?}");
    };
    assert_eq!(name, "fake");
    let files: Vec<_> = files.iter().map(|f| f.file_name().unwrap()).collect();
    assert_eq!(files, ["a-fake.so", "b-duplicate.so"], "names both files");
    assert_eq!(refused_reason(&registry, "a-fake.so"), dup);
    let selected = registry
        .create("fake", None, &ProviderOptions::default())
        .unwrap_err()
        .to_string();
    assert_eq!(
        selected,
        dup.to_string(),
        "selecting the duplicated name is fatal"
    );
    assert_eq!(
        refused_reason(&registry, "c-empty-name.so"),
        Refusal::InvalidProviderName(String::new())
    );
    let panic = refused_reason(&registry, "d-panic-in-register.so");
    assert_eq!(
        panic,
        Refusal::RegisterFailed(
            "provider panicked in plugin registration: fixture panic in register".into()
        )
    );
    assert_eq!(
        refused_reason(&registry, "e-registers-nothing.so"),
        Refusal::NoProviders
    );
    assert_eq!(provider_names(&registry), ["fake-v1"]);
}

/// The loader opens each file once and loads exactly what it checked: a symlink swapped
/// between a good plugin and a refused one while loading never gets the refused one loaded.
#[test]
fn a_symlink_swapped_during_loading_never_loads_the_refused_target() {
    let dir = PluginDir::new();
    let targets = tempfile::tempdir().unwrap();
    std::fs::set_permissions(targets.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let good = targets.path().join("good.so");
    let evil = targets.path().join("evil.so");
    std::fs::copy(built_plugin(libs::FAKE), &good).unwrap();
    std::fs::copy(built_plugin(libs::MISBEHAVING), &evil).unwrap();
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Refused by the checks: anyone may write it.
    std::fs::set_permissions(&evil, std::fs::Permissions::from_mode(0o666)).unwrap();
    let link = dir.path().join("plugin.so");
    std::os::unix::fs::symlink(&good, &link).unwrap();

    // The swapper counts its swaps; loading goes on until 200 loads happened and the link was
    // swapped at least 100 times meanwhile (on a busy machine the swapper may get little CPU:
    // the loop waits for it instead of asserting how much it got).
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let swaps = std::sync::Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, link, dir) = (
            stop.clone(),
            swaps.clone(),
            link.clone(),
            dir.path().to_path_buf(),
        );
        let (good, evil) = (good.clone(), evil.clone());
        std::thread::spawn(move || {
            let tmp = dir.join("swap.tmp");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let target = if n.is_multiple_of(2) { &evil } else { &good };
                let _ = std::fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp).unwrap();
                std::fs::rename(&tmp, &link).unwrap();
                n += 1;
                swaps.store(n, Ordering::Relaxed);
                std::thread::yield_now();
            }
        })
    };
    let (mut loads, mut good_loads, mut refusals) = (0u64, 0, 0);
    let start_swaps = swaps.load(Ordering::Relaxed);
    while loads < 200 || swaps.load(Ordering::Relaxed) - start_swaps < 100 {
        let registry = load(dir.path());
        let names = provider_names(&registry);
        assert!(
            !names.iter().any(|n| n == "misbehaving"),
            "the world-writable target was loaded: {names:?}"
        );
        if names.iter().any(|n| n == "fake") {
            good_loads += 1;
        } else {
            refusals += 1;
        }
        loads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed) - start_swaps;
    println!(
        "{loads} loads during {swaps} swaps: {good_loads} of the good plugin, {refusals} refusals"
    );
}

#[test]
fn parent_directories_are_checked_like_sudo_does() {
    let outer = tempfile::tempdir().unwrap();
    // Writable by others without the sticky bit: anyone could replace the plugin directory.
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let plugins = outer.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::copy(built_plugin(libs::FAKE), plugins.join("fake.so")).unwrap();
    let registry = load(&plugins);
    let reason = refused_reason(&registry, "fake.so");
    let Refusal::Insecure { problems, .. } = &reason else {
        panic!("{reason:?}");
    };
    assert_eq!(
        problems,
        &[format!(
            "the directory {} is writable by group or others (mode 777)",
            outer.path().display()
        )]
    );
    // The sticky bit (as on /tmp) makes it safe: only owners may rename or delete entries.
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    assert_eq!(provider_names(&load(&plugins)), ["fake", "fake-v1"]);
}

#[test]
fn unknown_provider_lists_what_is_available() {
    let dir = PluginDir::new().with(libs::FAKE, "fake.so");
    dir.write("junk.so", b"junk");
    let registry = load(dir.path());
    let err = registry
        .create("aws", None, &ProviderOptions::default())
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, SelectError::Unknown(_)));
    assert!(
        msg.starts_with("unknown cloud provider \"aws\". Available: fake (from "),
        "{msg}"
    );
    assert!(msg.contains("fake-v1 (from "), "{msg}");
    // The refused file is named (with its reason) in the message.
    let junk = registry
        .refused()
        .iter()
        .find(|r| r.path.ends_with("junk.so"))
        .expect("junk.so refused");
    assert!(matches!(junk.refusal, Refusal::NotAPlugin(_)), "{junk}");
    assert!(
        msg.contains(&junk.to_string()),
        "mentions refused files: {msg}"
    );
}

#[test]
fn factory_errors_and_panics_are_reported() {
    let dir = PluginDir::new().with(libs::MISBEHAVING, "m.so");
    let registry = load(dir.path());
    let err = registry
        .create("factory-error", Some(b"x: 1"), &ProviderOptions::default())
        .unwrap_err();
    assert!(matches!(err, SelectError::Factory(_)));
    let msg = err.to_string();
    assert!(
        msg.starts_with("could not init cloud provider \"factory-error\" (from "),
        "{msg}"
    );
    assert!(
        msg.ends_with("m.so): missing field `region` at line 1"),
        "{msg}"
    );
    let msg = registry
        .create("factory-panic", None, &ProviderOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("provider panicked in provider factory: fixture panic in factory"),
        "{msg}"
    );
}

#[test]
fn insecure_files_and_directories_are_refused_unless_allowed() {
    let dir = PluginDir::new();
    let plugin = dir.add(libs::FAKE, "fake.so");
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o666)).unwrap();
    let registry = load(dir.path());
    let reason = refused_reason(&registry, "fake.so");
    assert_eq!(
        reason,
        Refusal::Insecure {
            problems: vec!["the file is writable by group or others (mode 666)".into()],
            fixes: vec![format!(
                "chmod go-w {}",
                std::fs::canonicalize(&plugin).unwrap().display()
            )],
        }
    );
    assert!(
        reason.to_string().ends_with(&format!(
            "; fix it with `chmod go-w {}` or pass --allow-insecure-plugins",
            std::fs::canonicalize(&plugin).unwrap().display()
        )),
        "{reason}"
    );

    let allowed = PluginRegistry::load_dirs(
        &[dir.path().to_path_buf()],
        &LoaderOptions {
            allow_insecure: true,
            ..LoaderOptions::default()
        },
    )
    .unwrap();
    assert_eq!(provider_names(&allowed), ["fake", "fake-v1"]);

    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = PluginRegistry::load_dirs(&[dir.path().to_path_buf()], &LoaderOptions::default())
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(&err, SelectError::InsecureDirectory { path, problem, .. }
            if path == dir.path() && problem.ends_with("(mode 777)")),
        "{msg}"
    );
    // The message names the command that fixes it.
    assert!(
        msg.contains(&format!(
            "fix it with `chmod go-w {}` or pass --allow-insecure-plugins",
            dir.path().display()
        )),
        "{msg}"
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();

    let missing = PluginRegistry::load_dirs(&[dir.path().join("nope")], &LoaderOptions::default())
        .unwrap_err();
    assert!(
        missing.to_string().contains(
            "No such file or directory (os error 2); name the directory of your plugins with --plugin-dir DIR (or CCM_PLUGIN_DIR)"
        ),
        "{missing}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_method_returns_panicked_and_the_host_keeps_running() {
    let dir = PluginDir::new().with(libs::MISBEHAVING, "m.so");
    let registry = load(dir.path());
    let provider = registry
        .create("misbehaving", None, &ProviderOptions::default())
        .unwrap();
    let err = provider.instance_exists(&node("n1")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PANICKED);
    assert_eq!(
        err.to_string(),
        "provider panicked in InstanceExists: fixture panic for node Some(\"n1\")"
    );
    // The same provider keeps answering after the panic.
    let md = provider
        .instance_metadata(&node("n1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(md.provider_id, "misbehaving://n1");
    assert_eq!(
        provider
            .instance_exists(&node("n2"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::PANICKED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_method_times_out_and_the_plugin_sees_the_cancellation() {
    let dir = PluginDir::new();
    let plugin = dir.add(libs::MISBEHAVING, "hang.so");
    let registry = load(dir.path());
    let options = ProviderOptions {
        call_timeout: Duration::from_millis(200),
        ..ProviderOptions::default()
    };
    let provider = registry.create("misbehaving", None, &options).unwrap();
    let err = provider.instance_shutdown(&node("n1")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::DEADLINE_EXCEEDED);
    assert_eq!(
        err.to_string(),
        "InstanceShutdown did not return within 200ms"
    );
    // The plugin polls its context and records what it saw once the host cancels.
    let marker = plugin.with_extension("so.cancel-observed");
    let waited = Instant::now();
    while !marker.exists() && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        std::fs::read_to_string(&marker).expect("plugin saw the cancellation"),
        "cancelled"
    );
}

#[test]
fn plugins_command_lists_providers_capabilities_and_refusals() {
    let dir = PluginDir::new().with(libs::FAKE, "fake.so");
    dir.write("junk.so", b"junk");
    let args = ccm_host::plugin_listing::PluginsArgs {
        plugins: ccm_host::args::PluginDirArgs {
            plugin_dirs: vec![dir.path().to_path_buf()],
            allow_insecure_plugins: false,
        },
        output: ccm_host::args::OutputFormat::Json,
        cloud_config: None,
        cloud_provider: None,
    };
    let mut out = Vec::new();
    let code = ccm_host::plugin_listing::plugins(&args, 2, &mut out).unwrap();
    assert_eq!(code, 0);
    let listing: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let providers = &listing["plugins"][0]["providers"];
    assert_eq!(providers[0]["name"], "fake");
    assert_eq!(providers[0]["capabilities"]["instancesV2"], true);
    assert_eq!(providers[1]["name"], "fake-v1");
    assert_eq!(providers[1]["capabilities"]["instancesV2"], false);
    assert_eq!(
        listing["plugins"][0]["abiVersion"],
        ccm_provider_abi::ABI_VERSION
    );
    assert_eq!(listing["refused"][0]["kind"], "NotAPlugin", "{listing:#}");
}

fn process_threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// Containment, per method then per provider, with a provider whose calls hang and ignore
/// their cancellation. Waves of distinct calls of one method, as controllers make them, hang
/// until that method is refused on its own while the provider's other methods still get
/// threads; asking a hung question again joins its thread. Then 1,000 concurrent calls of
/// another method leave a bounded number of threads and make the provider refuse every call;
/// another provider's calls keep working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_hung_calls_stay_bounded_and_another_provider_keeps_working() {
    use ccm_host::provider::pool::{HUNG_CAP, MAX_WORKERS, METHOD_HUNG_CAP};
    let dir = PluginDir::new()
        .with(libs::FAKE, "fake.so")
        .with(libs::MISBEHAVING, "hang-calls.so");
    let registry = load(dir.path());
    let options = ProviderOptions {
        call_timeout: Duration::from_millis(300),
        ..ProviderOptions::default()
    };
    let hung = registry
        .create("hung", None, &options)
        .expect("hung builds");
    let fake = registry
        .create("fake", None, &options)
        .expect("fake builds");
    let before = process_threads();
    // Waves of 4 distinct InstanceMetadata calls until the method is refused.
    let mut asked = 0;
    while hung.method_call_health("InstanceMetadata").is_ok() {
        assert!(
            asked < 10 * METHOD_HUNG_CAP,
            "never refused after {asked} calls"
        );
        let wave = (asked..asked + 4).map(|i| {
            let hung = hung.clone();
            async move { hung.instance_metadata(&node(&format!("n{i}"))).await }
        });
        for r in futures::future::join_all(wave).await {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::DEADLINE_EXCEEDED);
        }
        asked += 4;
    }
    let stuck = hung.method_call_health("InstanceMetadata").unwrap_err();
    assert!(
        matches!(&stuck, Stuck::Method { provider, method, .. }
            if provider == "hung" && method == "InstanceMetadata"),
        "{stuck}"
    );
    assert_eq!(hung.refused_methods(), vec!["InstanceMetadata"]);
    assert!(
        hung.hung_calls() < METHOD_HUNG_CAP + 4,
        "{}",
        hung.hung_calls()
    );
    assert!(hung.call_health().is_ok(), "only the method is refused");
    // Refused at once from now on (before it reaches the pool, so not a deadline error).
    let e = hung.instance_metadata(&node("late")).await.unwrap_err();
    assert!(e.to_string().contains("are stuck in the plugin"), "{e}");
    assert_ne!(e.kind(), ErrorKind::DEADLINE_EXCEEDED);
    // Asking one of the hung questions again joins its thread: no new hung thread.
    let hung_now = hung.hung_calls();
    let again = hung.instance_metadata(&node("n0")).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::DEADLINE_EXCEEDED, "{again}");
    assert_eq!(hung.hung_calls(), hung_now);
    // Another method still gets a thread (and hangs in this plugin: a deadline, not a refusal).
    let other = hung.instance_exists(&node("other")).await.unwrap_err();
    assert_eq!(other.kind(), ErrorKind::DEADLINE_EXCEEDED, "{other}");

    // A burst of 1,000 distinct calls of another method, all at once.
    let calls = (0..1000).map(|i| {
        let hung = hung.clone();
        async move { hung.instance_shutdown(&node(&format!("s{i}"))).await }
    });
    let results = futures::future::join_all(calls).await;
    let (mut deadline, mut refused) = (0, 0);
    for r in &results {
        let e = r.as_ref().expect_err("a hung call cannot succeed");
        if e.kind() == ErrorKind::DEADLINE_EXCEEDED {
            deadline += 1;
        } else {
            assert!(e.to_string().contains("are stuck in the plugin"), "{e}");
            refused += 1;
        }
    }
    let threads = process_threads();
    println!(
        "1,000 hung calls: {deadline} timed out, {refused} refused; pool threads {}, hung {}, process threads {before} -> {threads}",
        hung.call_threads(),
        hung.hung_calls()
    );
    assert!(hung.call_threads() <= MAX_WORKERS + HUNG_CAP);
    assert!(
        threads <= before + MAX_WORKERS + HUNG_CAP,
        "{before} -> {threads} threads"
    );
    let unhealthy = hung
        .call_health()
        .expect_err("the hung provider is unhealthy");
    assert!(
        matches!(&unhealthy, Stuck::Provider { provider, .. } if provider == "hung"),
        "{unhealthy}"
    );
    // Another provider has its own threads.
    let answer = fake.instance_metadata(&node("node-1")).await;
    assert!(answer.is_ok(), "{answer:?}");
    assert!(fake.call_health().is_ok());
}
