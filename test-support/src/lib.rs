//! What every test tree of the workspace shares (library tests in `tests/`, process tests in
//! `cli/tests/`, the providers' tests):
//! - one way to wait for an outcome: [`eventually`] (async), [`eventually_async`] (async check)
//!   and [`wait_until`] (blocking, for tests that drive processes). Each is a bounded wait for
//!   an outcome, never a timing assertion: the bound only turns a hang into a failure;
//! - one way to find the plugins cargo built for this test run: [`built_plugin`] and
//!   [`plugin_dir_with`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a polled check returns: `true`/`Some(v)` when the outcome is there.
pub trait Outcome {
    /// What the wait returns once the outcome is there.
    type Value;
    /// `Some` once the outcome is there.
    fn ready(self) -> Option<Self::Value>;
}

impl Outcome for bool {
    type Value = ();
    fn ready(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn ready(self) -> Option<T> {
        self
    }
}

/// How often the waits poll.
const POLL: Duration = Duration::from_millis(20);

fn timed_out(what: &str, timeout: Duration) -> ! {
    panic!("timed out after {timeout:?} waiting for: {what}")
}

/// Poll `check` until its outcome is there, for at most `timeout`; panics naming `what` then.
pub async fn eventually<O: Outcome>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> O,
) -> O::Value {
    let started = Instant::now();
    loop {
        if let Some(v) = check().ready() {
            return v;
        }
        if started.elapsed() > timeout {
            timed_out(what, timeout);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] with an async check.
pub async fn eventually_async<O, F, Fut>(what: &str, timeout: Duration, mut check: F) -> O::Value
where
    O: Outcome,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = O>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = check().await.ready() {
            return v;
        }
        if started.elapsed() > timeout {
            timed_out(what, timeout);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for synchronous tests (the thread sleeps between polls).
pub fn wait_until<O: Outcome>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> O,
) -> O::Value {
    let started = Instant::now();
    loop {
        if let Some(v) = check().ready() {
            return v;
        }
        if started.elapsed() > timeout {
            timed_out(what, timeout);
        }
        std::thread::sleep(POLL);
    }
}

/// Path of a plugin cdylib cargo built for this test run: by library name (`ccm_provider_fake`)
/// or file name (`libccm_provider_fake.so`). Plugin crates are dev-dependencies of the test's
/// package, so `cargo test` builds them next to the test binaries (`target/<profile>/deps` or
/// its parent).
pub fn built_plugin(lib: &str) -> PathBuf {
    let file = if lib.ends_with(".so") {
        lib.to_string()
    } else {
        format!("lib{lib}.so")
    };
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("test binary directory");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let candidate = dir.join(&file);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "{file} was not built next to {}: it must be a dev-dependency of the test's package \
         (`cargo test --workspace` builds them all)",
        deps.display()
    );
}

/// Plugins cargo built for this test run (see [`built_plugin`]) copied into `dir/plugins`, a
/// directory the loader accepts (mode 0755, ours). Returns that directory.
///
/// Each copy is written to a new file and renamed into place, never overwritten in place: a
/// host started earlier from the same directory may be loading (or have mapped) the current
/// file, and a copy would truncate it under that host.
pub fn plugin_dir_with(dir: &Path, libs: &[&str]) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COPIES: AtomicU64 = AtomicU64::new(0);
    let plugins = dir.join("plugins");
    std::fs::create_dir_all(&plugins).expect("create the plugin directory");
    for lib in libs {
        let so = built_plugin(lib);
        let name = so.file_name().expect("a file name").to_owned();
        let n = COPIES.fetch_add(1, Ordering::Relaxed);
        let tmp = plugins.join(format!(
            ".{}.{}.{n}",
            name.to_string_lossy(),
            std::process::id()
        ));
        std::fs::copy(&so, &tmp).expect("copy the plugin");
        std::fs::rename(&tmp, plugins.join(name)).expect("rename the plugin into place");
    }
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the plugin directory");
    plugins
}
