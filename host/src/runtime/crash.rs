//! Crashes name their plugin: when a fatal signal (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT)
//! or `exit` ends the process during a provider call, one line on stderr names the plugin file
//! and the call before the process dies, e.g.
//! `ccm-host: fatal signal SIGSEGV during provider call InstanceMetadata into plugin /plugins/libacme.so`;
//! the same while a plugin is loaded (its and its dependencies' constructors) and registers
//! (`... during register of plugin /plugins/libacme.so`).
//!
//! Plugins run in the host's process (a `.so` cannot be isolated from its loader), so a plugin
//! bug that is not a Rust panic still ends the host; this only makes the cause visible. The
//! isolation recipe is one host per vendor (docs/writing-a-provider.md).
//!
//! How: [`in_call`] records the line to print in a thread-local while the plugin runs; the
//! signal handler only reads it and calls `write(2)` (async-signal-safe), then puts the previous
//! handler back and returns, so the fault happens again under it (Rust's stack-overflow report,
//! or the default action: the process dies with the same signal and exit status as before).
//! An `atexit` hook does the same for a plugin calling `exit`.
#![allow(unsafe_code)] // sigaction(2), write(2), atexit(3)

use std::cell::Cell;
use std::sync::Once;

thread_local! {
    /// The line to print if the process dies now: (pointer, length) of a string owned by the
    /// [`in_call`] frame on this thread, or (null, 0).
    static CURRENT: Cell<(*const u8, usize)> = const { Cell::new((std::ptr::null(), 0)) };
}

const SIGNALS: [(libc::c_int, &str); 5] = [
    (libc::SIGSEGV, "SIGSEGV"),
    (libc::SIGBUS, "SIGBUS"),
    (libc::SIGILL, "SIGILL"),
    (libc::SIGFPE, "SIGFPE"),
    (libc::SIGABRT, "SIGABRT"),
];

/// The handlers in place before [`install`], restored by the handler before it returns.
static mut PREVIOUS: [std::mem::MaybeUninit<libc::sigaction>; 5] =
    [const { std::mem::MaybeUninit::uninit() }; 5];
static INSTALL: Once = Once::new();

/// Install the handlers (once per process; later calls do nothing).
pub fn install() {
    INSTALL.call_once(|| {
        for (i, (signal, _)) in SIGNALS.iter().enumerate() {
            // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe; PREVIOUS
            // is written once here, before any handler can run, and only read by handlers.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_fatal_signal as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let previous = std::ptr::addr_of_mut!(PREVIOUS[i]);
                libc::sigaction(*signal, &action, (*previous).as_mut_ptr());
            }
        }
        // SAFETY: registering a plain extern "C" fn.
        unsafe {
            libc::atexit(on_exit);
        }
    });
}

/// Run `f` (a call into the plugin `plugin`) with the crash line for `call` recorded on this
/// thread.
pub fn in_call<T>(plugin: &std::path::Path, call: &str, f: impl FnOnce() -> T) -> T {
    with_line(
        format!(
            " during provider call {call} into plugin {}\n",
            plugin.display()
        ),
        f,
    )
}

/// Run `f`, a step of loading the plugin `plugin` (`what`: "loading", "register"), with the
/// crash line `during <what> of plugin <file>` recorded on this thread: a plugin whose
/// constructors or `register` abort or fault is named, whether or not it was selected.
pub fn in_plugin<T>(plugin: &std::path::Path, what: &str, f: impl FnOnce() -> T) -> T {
    with_line(
        format!(" during {what} of plugin {}\n", plugin.display()),
        f,
    )
}

fn with_line<T>(line: String, f: impl FnOnce() -> T) -> T {
    let previous = CURRENT.with(|c| c.replace((line.as_ptr(), line.len())));
    struct Restore((*const u8, usize));
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(previous);
    let out = f();
    drop(_restore);
    drop(line);
    out
}

/// Write `ccm-host: <what><the current call's line>` with one write(2) (async-signal-safe; one
/// write of at most PIPE_BUF bytes is not interleaved with other threads' log lines).
fn report(what: &[u8]) {
    let (ptr, len) = CURRENT.with(Cell::get);
    if ptr.is_null() {
        return;
    }
    // SAFETY: the line lives while the call frame does (the process is ending inside it).
    let line = unsafe { std::slice::from_raw_parts(ptr, len) };
    let mut buf = [0u8; 4096];
    let mut n = 0;
    for part in [b"ccm-host: ".as_slice(), what, line] {
        let take = part.len().min(buf.len() - n);
        buf[n..n + take].copy_from_slice(&part[..take]);
        n += take;
    }
    if n == buf.len() {
        buf[n - 1] = b'\n';
    }
    // SAFETY: write(2) is async-signal-safe and the buffer is ours.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
    }
}

extern "C" fn on_fatal_signal(
    signal: libc::c_int,
    _info: *mut libc::siginfo_t,
    _context: *mut libc::c_void,
) {
    let Some(i) = SIGNALS.iter().position(|(s, _)| *s == signal) else {
        return;
    };
    let mut what = [0u8; 32];
    let text = b"fatal signal ";
    let name = SIGNALS[i].1.as_bytes();
    what[..text.len()].copy_from_slice(text);
    what[text.len()..text.len() + name.len()].copy_from_slice(name);
    report(&what[..text.len() + name.len()]);
    // Put the previous handler back and return: a fault re-executes and reaches it; abort()
    // re-raises SIGABRT itself.
    // SAFETY: PREVIOUS[i] was initialised by `install` before this handler was installed.
    unsafe {
        let previous = std::ptr::addr_of!(PREVIOUS[i]);
        libc::sigaction(signal, (*previous).as_ptr(), std::ptr::null_mut());
    }
}

extern "C" fn on_exit() {
    report(b"exit() called");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_recorded_only_during_the_call() {
        assert!(CURRENT.with(Cell::get).0.is_null());
        let seen = in_call(
            std::path::Path::new("/p/libx.so"),
            "InstanceMetadata",
            || {
                let (ptr, len) = CURRENT.with(Cell::get);
                // SAFETY: the line lives for the duration of the call.
                let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
                String::from_utf8(bytes.to_vec()).unwrap()
            },
        );
        assert_eq!(
            seen,
            " during provider call InstanceMetadata into plugin /p/libx.so\n"
        );
        assert!(CURRENT.with(Cell::get).0.is_null());
    }
}
