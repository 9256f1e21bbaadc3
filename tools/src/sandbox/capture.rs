//! The sandbox's stderr, teed while the controllers run: every byte still reaches the original
//! stderr as it is written (the live progress line included), and the error lines of the
//! embedded controller manager are kept so the summary can say why it stopped or what failed
//! first. The daemon reports fatal problems as `error: …` lines and logs errors at ERROR level
//! (`leaderelection lost: …`); both are recognised, in the text and the JSON log formats.
//!
//! Implementation: fd 2 is pointed at a pipe whose reader thread copies everything to a
//! duplicate of the original stderr; [`StderrTee::stop`] points fd 2 back, which closes the
//! pipe, and joins the thread, so nothing written before `stop` is lost or reordered.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::SystemTime;

/// How many error lines are kept (the first ones; the summary needs only the first).
const KEPT: usize = 32;
/// Longest line examined; the rest of a longer line is still forwarded.
const MAX_LINE: usize = 16 * 1024;

/// An error line written to stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorLine {
    /// When the tee read it.
    pub at: SystemTime,
    /// The message, without the `error: ` prefix or the log line's timestamp, level and target.
    pub text: String,
}

/// Teeing stderr; see the module docs.
pub struct StderrTee {
    saved: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
    errors: Arc<Mutex<Vec<ErrorLine>>>,
}

impl StderrTee {
    /// Start teeing fd 2. Fails (and changes nothing) when fd 2 is not open or no pipe can be
    /// made.
    #[allow(unsafe_code)] // pipe2, fcntl and dup2 on raw file descriptors
    pub fn start() -> io::Result<StderrTee> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two new file descriptors into `fds` on success.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: F_DUPFD_CLOEXEC duplicates fd 2 into a new descriptor (>= 3) or fails.
        let saved = unsafe { libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3) };
        if saved < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `saved` is a new descriptor owned by nobody else.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        let out = saved.try_clone()?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        let thread = std::thread::Builder::new()
            .name("sandbox-stderr".into())
            .spawn(move || pump(read, out, &sink))?;
        // SAFETY: dup2 atomically makes fd 2 refer to the pipe's write end.
        if unsafe { libc::dup2(write.as_raw_fd(), 2) } < 0 {
            let e = io::Error::last_os_error();
            drop(write);
            let _ = thread.join();
            return Err(e);
        }
        // fd 2 is now the pipe's only writer.
        drop(write);
        Ok(StderrTee {
            saved: Some(saved),
            thread: Some(thread),
            errors,
        })
    }

    /// The original stderr (for terminal queries such as its width).
    pub fn terminal_fd(&self) -> RawFd {
        self.saved.as_ref().map_or(2, AsRawFd::as_raw_fd)
    }

    /// The error lines seen so far, oldest first.
    pub fn errors(&self) -> Vec<ErrorLine> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Point fd 2 back at the original stderr and wait until everything written before has been
    /// copied there.
    #[allow(unsafe_code)] // dup2 on raw file descriptors
    pub fn stop(&mut self) {
        if let Some(saved) = self.saved.take() {
            // SAFETY: `saved` is open; dup2 closes fd 2 (the pipe's last writer) atomically.
            unsafe { libc::dup2(saved.as_raw_fd(), 2) };
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for StderrTee {
    fn drop(&mut self) {
        self.stop();
    }
}

fn pump(read: OwnedFd, out: OwnedFd, errors: &Mutex<Vec<ErrorLine>>) {
    let mut read = std::fs::File::from(read);
    let mut out = std::fs::File::from(out);
    let mut buf = [0u8; 8192];
    let mut line = Vec::new();
    loop {
        let n = match read.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        // Forward at once (a live line has no newline); keep draining even if stderr is gone,
        // so writers never block on a full pipe.
        let _ = out.write_all(&buf[..n]);
        for &b in &buf[..n] {
            if b == b'\n' {
                if let Some(text) = error_text(&String::from_utf8_lossy(&line)) {
                    if let Ok(mut kept) = errors.lock() {
                        if kept.len() < KEPT {
                            kept.push(ErrorLine {
                                at: SystemTime::now(),
                                text,
                            });
                        }
                    }
                }
                line.clear();
            } else if line.len() < MAX_LINE {
                line.push(b);
            }
        }
    }
}

/// `text` without ANSI escape sequences (the text log format colours its level).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters... final byte in @..~
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The message of an error line: `error: MESSAGE` (the daemon's fatal problems), a text-format
/// log line `TIMESTAMP ERROR TARGET: MESSAGE`, or a JSON log line with `"level":"ERROR"`.
pub fn error_text(line: &str) -> Option<String> {
    let line = strip_ansi(line);
    let line = line.trim_end_matches('\r').trim();
    if let Some(rest) = line.strip_prefix("error: ") {
        return Some(rest.trim().to_string());
    }
    if line.starts_with('{') {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        if v.get("level").and_then(|l| l.as_str()) != Some("ERROR") {
            return None;
        }
        let fields = v.get("fields")?.as_object()?;
        let mut text = fields.get("message")?.as_str()?.to_string();
        for (k, val) in fields.iter().filter(|(k, _)| *k != "message") {
            let val = val.as_str().map_or_else(|| val.to_string(), str::to_string);
            text.push_str(&format!(" {k}={val}"));
        }
        return Some(text);
    }
    // `2026-01-01T00:00:00.000000Z ERROR ccm_host::daemon: leaderelection lost: ...`
    let mut words = line.splitn(3, ' ');
    let (_time, level, rest) = (words.next()?, words.next()?, words.next()?);
    if level != "ERROR" {
        return None;
    }
    let message = rest.split_once(": ").map_or(rest, |(_target, m)| m);
    Some(message.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_lines_in_every_format() {
        assert_eq!(
            error_text("error: cloud provider Initialize failed: no credentials").as_deref(),
            Some("cloud provider Initialize failed: no credentials")
        );
        let text = "\x1b[2m2026-11-24T06:46:36.397377Z\x1b[0m \x1b[31mERROR\x1b[0m \x1b[2mccm_host::daemon\x1b[0m\x1b[2m:\x1b[0m leaderelection lost: the lease is held by other-1";
        assert_eq!(
            error_text(text).as_deref(),
            Some("leaderelection lost: the lease is held by other-1")
        );
        assert_eq!(
            error_text("2026-11-24T06:46:36Z ERROR ccm_host::daemon: leaderelection lost")
                .as_deref(),
            Some("leaderelection lost")
        );
        let json = r#"{"timestamp":"2026-11-24T06:46:36Z","level":"ERROR","fields":{"message":"leaderelection lost","reason":"renew deadline"},"target":"ccm_host::daemon"}"#;
        assert_eq!(
            error_text(json).as_deref(),
            Some("leaderelection lost reason=renew deadline")
        );
        for not_an_error in [
            "2026-11-24T06:46:36Z  WARN ccm_host::events: could not write event",
            r#"{"level":"WARN","fields":{"message":"x"}}"#,
            "sandbox:   0.3s  nodes initialised 20/20",
            "",
        ] {
            assert_eq!(error_text(not_an_error), None, "{not_an_error:?}");
        }
    }
}
