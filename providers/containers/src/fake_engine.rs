//! A scripted Engine API on a unix socket in a temporary directory, for unit tests of the
//! error paths real podman does not produce on demand (401/403, a refused reload, foreign
//! containers). Every request is recorded; `handler` answers `(status, body)`.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

type Handler = dyn Fn(&Seen) -> (u16, Vec<u8>) + Send + Sync;

/// The fake engine; it serves until dropped with its directory.
pub struct FakeEngine {
    pub socket: PathBuf,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _dir: tempfile::TempDir,
}

impl FakeEngine {
    pub fn start(handler: impl Fn(&Seen) -> (u16, Vec<u8>) + Send + Sync + 'static) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("engine.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let handler: Arc<Handler> = Arc::new(handler);
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut raw = Vec::new();
                let mut buf = [0u8; 8192];
                let (head_end, len) = loop {
                    let n = conn.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break (0, 0);
                    }
                    raw.extend_from_slice(&buf[..n]);
                    if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&raw[..p]).to_ascii_lowercase();
                        let len = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        break (p + 4, len);
                    }
                };
                if head_end == 0 {
                    continue;
                }
                while raw.len() < head_end + len {
                    let n = conn.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    raw.extend_from_slice(&buf[..n]);
                }
                let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
                let mut words = head.split_whitespace();
                let req = Seen {
                    method: words.next().unwrap_or_default().to_string(),
                    path: words.next().unwrap_or_default().to_string(),
                    body: raw[head_end..].to_vec(),
                };
                log.lock().unwrap().push(req.clone());
                let (status, body) = handler(&req);
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(&body);
            }
        });
        FakeEngine {
            socket,
            seen,
            _dir: dir,
        }
    }

    /// `METHOD path` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| format!("{} {}", s.method, s.path))
            .collect()
    }
}
