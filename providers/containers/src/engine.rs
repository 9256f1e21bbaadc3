//! A small client of the Docker-compatible Engine API over a unix socket (Docker's
//! `/var/run/docker.sock`, podman's `/run/podman/podman.sock`, `podman system service`).
//!
//! One HTTP/1.1 request per connection (`Connection: close`), written and read on the host's
//! calling thread with `std::os::unix::net::UnixStream`: a local socket needs no connection
//! pool and no async runtime in the plugin. Reads wait in short slices so that the call's
//! deadline and the host's cancellation end a request early. Responses with a length, chunked
//! or read to the end of the connection are all understood.
//!
//! Errors name the socket: a missing socket or a refused connection is `OTHER`, a socket the
//! host may not open (permission denied) is `UNAUTHORIZED`; neither ever means "instance not
//! found". Only the calls this provider needs are wrapped; the Engine API paths carry no
//! version prefix (Docker and podman both serve unversioned paths).

use std::collections::BTreeMap;
use std::io::{ErrorKind as IoKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ccm_provider_abi::prelude::*;
use ccm_provider_abi::sdk::Result;
use serde::Deserialize;
use serde_json::Value;

/// How long one read or write may block before the call's deadline and cancellation are looked at.
const SLICE: Duration = Duration::from_millis(200);
/// The limit of a call without a deadline (the host always sets one; tests may not).
const NO_DEADLINE_LIMIT: Duration = Duration::from_secs(120);
/// Largest response body accepted (a container listing of a big host is a few MB).
const MAX_BODY: usize = 64 << 20;

/// The sockets tried, in order, when the cloud config names none.
pub const DEFAULT_SOCKETS: [&str; 2] = ["/var/run/docker.sock", "/run/podman/podman.sock"];

/// An HTTP answer of the Engine API.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text (errors, logs).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }

    /// The Engine API's error message (`{"message": ...}`), else the body.
    pub fn message(&self) -> String {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| self.text())
    }
}

/// The Engine API client of one socket.
#[derive(Debug, Clone)]
pub struct Engine {
    socket: PathBuf,
}

/// Percent-encode a query value (RFC 3986 unreserved characters kept).
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Engine {
    /// A client of `socket` (nothing is opened until the first call).
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
        }
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn connect_error(&self, e: std::io::Error) -> ProviderError {
        let path = self.socket.display();
        match e.kind() {
            IoKind::PermissionDenied => ProviderError::unauthorized(format!(
                "container runtime socket {path}: permission denied (run as a user that may open it)"
            )),
            IoKind::NotFound => ProviderError::other(format!(
                "container runtime socket {path} does not exist (is docker or `podman system service` running? set socket in the cloud config)"
            )),
            IoKind::ConnectionRefused => ProviderError::other(format!(
                "container runtime socket {path}: connection refused (the runtime's service is not running)"
            )),
            _ => ProviderError::other(format!("container runtime socket {path}: {e}")),
        }
    }

    /// One request; any HTTP status is returned (callers decide what 404 means).
    pub fn request(
        &self,
        ctx: &CallContext,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Response> {
        ctx.check()?;
        let what = || format!("{method} {path}");
        let mut stream = UnixStream::connect(&self.socket).map_err(|e| self.connect_error(e))?;
        stream
            .set_read_timeout(Some(SLICE))
            .and_then(|()| stream.set_write_timeout(Some(SLICE)))
            .map_err(|e| self.io_error(&what(), e))?;
        let limit = ctx.remaining().unwrap_or(NO_DEADLINE_LIMIT);
        let started = std::time::Instant::now();
        let over = |ctx: &CallContext| -> Result<()> {
            ctx.check()?;
            if started.elapsed() > limit {
                return Err(ProviderError::deadline_exceeded(format!(
                    "container runtime {}: {} took longer than {limit:?}",
                    self.socket.display(),
                    what()
                )));
            }
            Ok(())
        };
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n");
        if !body.is_empty() || matches!(method, "POST" | "PUT") {
            if !content_type.is_empty() {
                head.push_str(&format!("Content-Type: {content_type}\r\n"));
            }
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(body);
        let mut written = 0;
        while written < out.len() {
            match stream.write(&out[written..]) {
                Ok(0) => return Err(self.io_error(&what(), IoKind::WriteZero.into())),
                Ok(n) => written += n,
                Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => over(ctx)?,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(self.io_error(&what(), e)),
            }
        }
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Some(done) = parse_response(&raw).map_err(|e| self.protocol_error(&what(), e))? {
                return Ok(done);
            }
            match stream.read(&mut buf) {
                Ok(0) => {
                    return match parse_complete(&raw) {
                        Ok(r) => Ok(r),
                        Err(e) => Err(self.protocol_error(&what(), e)),
                    }
                }
                Ok(n) => {
                    raw.extend_from_slice(&buf[..n]);
                    if raw.len() > MAX_BODY {
                        return Err(self.protocol_error(&what(), "response too large".into()));
                    }
                }
                Err(e) if matches!(e.kind(), IoKind::WouldBlock | IoKind::TimedOut) => over(ctx)?,
                Err(e) if e.kind() == IoKind::Interrupted => {}
                Err(e) => return Err(self.io_error(&what(), e)),
            }
        }
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> ProviderError {
        ProviderError::other(format!(
            "container runtime socket {}: {what}: {e}",
            self.socket.display()
        ))
    }

    fn protocol_error(&self, what: &str, e: String) -> ProviderError {
        ProviderError::other(format!(
            "container runtime socket {}: {what}: bad HTTP answer: {e}",
            self.socket.display()
        ))
    }

    /// A request whose answer must be 2xx; else an error with the runtime's message.
    pub fn expect_ok(
        &self,
        ctx: &CallContext,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> Result<Response> {
        let r = self.request(ctx, method, path, content_type, body)?;
        if (200..300).contains(&r.status) {
            Ok(r)
        } else {
            Err(self.status_error(method, path, &r))
        }
    }

    /// The error for an unexpected status (401/403 = unauthorized).
    pub fn status_error(&self, method: &str, path: &str, r: &Response) -> ProviderError {
        let msg = format!(
            "container runtime {}: {method} {path}: HTTP {}: {}",
            self.socket.display(),
            r.status,
            r.message()
        );
        if matches!(r.status, 401 | 403) {
            ProviderError::unauthorized(msg)
        } else {
            ProviderError::other(msg)
        }
    }

    /// `GET /_ping`: the runtime answers.
    pub fn ping(&self, ctx: &CallContext) -> Result<()> {
        self.expect_ok(ctx, "GET", "/_ping", "", &[]).map(drop)
    }

    /// `GET /containers/json?all=true` filtered by a label (`key=value` or `key`).
    pub fn list_by_label(&self, ctx: &CallContext, label: &str) -> Result<Vec<ContainerSummary>> {
        let filters = serde_json::json!({ "label": [label] }).to_string();
        let path = format!("/containers/json?all=true&filters={}", encode(&filters));
        let r = self.expect_ok(ctx, "GET", &path, "", &[])?;
        serde_json::from_slice(&r.body).map_err(|e| {
            ProviderError::other(format!(
                "container runtime {}: container list: {e}",
                self.socket.display()
            ))
        })
    }

    /// `GET /containers/{name}/json`: `None` when there is no such container.
    pub fn inspect(&self, ctx: &CallContext, name: &str) -> Result<Option<Container>> {
        let path = format!("/containers/{}/json", encode(name));
        let r = self.request(ctx, "GET", &path, "", &[])?;
        if r.status == 404 {
            return Ok(None);
        }
        if r.status != 200 {
            return Err(self.status_error("GET", &path, &r));
        }
        serde_json::from_slice(&r.body).map(Some).map_err(|e| {
            ProviderError::other(format!(
                "container runtime {}: inspect of {name}: {e}",
                self.socket.display()
            ))
        })
    }

    /// `GET /images/{name}/json`: whether the image is present.
    pub fn image_exists(&self, ctx: &CallContext, image: &str) -> Result<bool> {
        let path = format!("/images/{}/json", encode(image));
        let r = self.request(ctx, "GET", &path, "", &[])?;
        match r.status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(self.status_error("GET", &path, &r)),
        }
    }

    /// `POST /containers/create?name=`: the new container's ID.
    pub fn create(&self, ctx: &CallContext, name: &str, spec: &Value) -> Result<String> {
        let path = format!("/containers/create?name={}", encode(name));
        let r = self.expect_ok(
            ctx,
            "POST",
            &path,
            "application/json",
            spec.to_string().as_bytes(),
        )?;
        let v: Value = serde_json::from_slice(&r.body).unwrap_or_default();
        Ok(v["Id"].as_str().unwrap_or(name).to_string())
    }

    /// `POST /containers/{id}/start` (304 = already running is fine).
    pub fn start(&self, ctx: &CallContext, id: &str) -> Result<()> {
        let path = format!("/containers/{}/start", encode(id));
        let r = self.request(ctx, "POST", &path, "", &[])?;
        if (200..300).contains(&r.status) || r.status == 304 {
            Ok(())
        } else {
            Err(self.status_error("POST", &path, &r))
        }
    }

    /// `POST /containers/{id}/kill?signal=`.
    pub fn kill(&self, ctx: &CallContext, id: &str, signal: &str) -> Result<()> {
        let path = format!("/containers/{}/kill?signal={}", encode(id), encode(signal));
        self.expect_ok(ctx, "POST", &path, "", &[]).map(drop)
    }

    /// `DELETE /containers/{id}?force=true`; a missing container is fine.
    pub fn remove(&self, ctx: &CallContext, id: &str) -> Result<()> {
        let path = format!("/containers/{}?force=true&v=true", encode(id));
        let r = self.request(ctx, "DELETE", &path, "", &[])?;
        if (200..300).contains(&r.status) || r.status == 404 {
            Ok(())
        } else {
            Err(self.status_error("DELETE", &path, &r))
        }
    }

    /// The last `tail` lines (`None`: all) of a container's stdout and stderr
    /// (`GET /containers/{id}/logs`).
    pub fn logs(&self, ctx: &CallContext, id: &str, tail: Option<usize>) -> Result<String> {
        let tail = tail.map_or_else(|| "all".to_string(), |n| n.to_string());
        let path = format!(
            "/containers/{}/logs?stdout=true&stderr=true&tail={tail}",
            encode(id)
        );
        let r = self.expect_ok(ctx, "GET", &path, "", &[])?;
        Ok(demux(&r.body))
    }

    /// `PUT /containers/{id}/archive?path=`: unpack a tar into the container's `dir`.
    pub fn put_archive(&self, ctx: &CallContext, id: &str, dir: &str, tar: &[u8]) -> Result<()> {
        let path = format!("/containers/{}/archive?path={}", encode(id), encode(dir));
        self.expect_ok(ctx, "PUT", &path, "application/x-tar", tar)
            .map(drop)
    }

    /// `GET /containers/{id}/archive?path=`: the first regular file of the tar answer (`None`
    /// when the path does not exist).
    pub fn read_file(&self, ctx: &CallContext, id: &str, file: &str) -> Result<Option<Vec<u8>>> {
        let path = format!("/containers/{}/archive?path={}", encode(id), encode(file));
        let r = self.request(ctx, "GET", &path, "", &[])?;
        match r.status {
            200 => Ok(crate::tar::first_file(&r.body)),
            404 => Ok(None),
            _ => Err(self.status_error("GET", &path, &r)),
        }
    }
}

/// The text of a log stream: the Engine API multiplexes stdout and stderr of a container
/// without a terminal in frames (`[stream, 0, 0, 0, size as u32 big-endian]` + data); a stream
/// that is not framed is returned as it is.
pub fn demux(raw: &[u8]) -> String {
    let framed = raw.len() >= 8 && raw[0] <= 2 && raw[1..4] == [0, 0, 0];
    if !framed {
        return String::from_utf8_lossy(raw).into_owned();
    }
    let mut out = Vec::new();
    let mut rest = raw;
    while rest.len() >= 8 {
        let size = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
        let end = (8 + size).min(rest.len());
        out.extend_from_slice(&rest[8..end]);
        rest = &rest[end..];
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse a complete response out of `raw` if it is complete (by length or chunked end).
fn parse_response(raw: &[u8]) -> std::result::Result<Option<Response>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut headers);
    let head_len = match res.parse(raw).map_err(|e| e.to_string())? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let status = res.code.unwrap_or(0);
    let mut length = None;
    let mut chunked = false;
    for h in res.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked");
        }
    }
    let body = &raw[head_len..];
    if status == 204 || status == 304 {
        return Ok(Some(Response {
            status,
            body: Vec::new(),
        }));
    }
    if chunked {
        return Ok(dechunk(body)?.map(|body| Response { status, body }));
    }
    match length {
        Some(n) if body.len() >= n => Ok(Some(Response {
            status,
            body: body[..n].to_vec(),
        })),
        _ => Ok(None),
    }
}

/// The response at the end of the connection (no length: the body is the rest).
fn parse_complete(raw: &[u8]) -> std::result::Result<Response, String> {
    if let Some(r) = parse_response(raw)? {
        return Ok(r);
    }
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut res = httparse::Response::new(&mut headers);
    match res.parse(raw).map_err(|e| e.to_string())? {
        httparse::Status::Complete(n) => {
            let chunked_or_sized = res.headers.iter().any(|h| {
                h.name.eq_ignore_ascii_case("content-length")
                    || h.name.eq_ignore_ascii_case("transfer-encoding")
            });
            if chunked_or_sized {
                return Err("connection closed before the end of the body".into());
            }
            Ok(Response {
                status: res.code.unwrap_or(0),
                body: raw[n..].to_vec(),
            })
        }
        httparse::Status::Partial => Err("connection closed before the end of the head".into()),
    }
}

/// The de-chunked body, or `None` while the last chunk has not arrived.
fn dechunk(mut rest: &[u8]) -> std::result::Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&rest[..eol]).map_err(|e| e.to_string())?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Ok(Some(out));
        }
        if rest.len() < size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// One network of a container (the fields used here).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Endpoint {
    /// IPv4 address on the network ("" when none).
    #[serde(rename = "IPAddress")]
    pub ip_address: String,
    /// IPv6 address on the network ("" when none).
    #[serde(rename = "GlobalIPv6Address")]
    pub global_ipv6_address: String,
}

/// `NetworkSettings` (inspect and list share these fields).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct NetworkSettings {
    /// By network name.
    pub networks: BTreeMap<String, Endpoint>,
    /// Published ports (inspect only): `"80/tcp"` → host bindings.
    pub ports: Option<BTreeMap<String, Option<Vec<PortBinding>>>>,
}

/// A published port's host side.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct PortBinding {
    /// Host address.
    pub host_ip: String,
    /// Host port.
    pub host_port: String,
}

/// An entry of `GET /containers/json`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct ContainerSummary {
    /// Container ID.
    pub id: String,
    /// Names with a leading `/`.
    pub names: Vec<String>,
    /// Image as given at creation.
    pub image: String,
    /// `running`, `exited`, `created`, `paused`, ...
    pub state: String,
    /// Labels.
    pub labels: Option<BTreeMap<String, String>>,
    /// Networks.
    pub network_settings: Option<NetworkSettings>,
}

impl ContainerSummary {
    /// The name without the leading `/`.
    pub fn name(&self) -> &str {
        self.names
            .first()
            .map(|n| n.trim_start_matches('/'))
            .unwrap_or("")
    }
}

/// `State` of an inspected container.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct State {
    /// `running`, `exited`, `created`, ...
    pub status: String,
    /// The container runs.
    pub running: bool,
}

/// `Config` of an inspected container.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Config {
    /// Image as given at creation.
    pub image: String,
    /// Labels.
    pub labels: Option<BTreeMap<String, String>>,
}

/// `GET /containers/{name}/json` (the fields used here).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct Container {
    /// Container ID.
    pub id: String,
    /// The name with a leading `/`.
    pub name: String,
    /// State.
    pub state: State,
    /// Config.
    pub config: Config,
    /// Networks and published ports.
    pub network_settings: NetworkSettings,
}

impl Container {
    /// The name without the leading `/`.
    pub fn short_name(&self) -> &str {
        self.name.trim_start_matches('/')
    }

    /// Running and not paused (Docker and podman report a paused container as `Running`).
    pub fn is_up(&self) -> bool {
        self.state.status == "running"
    }

    /// The labels (empty map when none).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.config.labels.clone().unwrap_or_default()
    }
}

impl From<ContainerSummary> for Container {
    fn from(s: ContainerSummary) -> Self {
        let name = format!("/{}", s.name());
        Container {
            id: s.id,
            name,
            state: State {
                running: s.state == "running",
                status: s.state,
            },
            config: Config {
                image: s.image,
                labels: s.labels,
            },
            network_settings: s.network_settings.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_by_length_chunks_and_close() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"hi"[..]));
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi")
                .unwrap()
                .is_none()
        );
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        let r = parse_response(chunked).unwrap().unwrap();
        assert_eq!(r.body, b"abcde");
        assert!(parse_response(&chunked[..chunked.len() - 8])
            .unwrap()
            .is_none());
        let r =
            parse_complete(b"HTTP/1.0 404 Not Found\r\n\r\n{\"message\":\"no such container\"}")
                .unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.message(), "no such container");
        assert!(parse_complete(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        let r = parse_response(b"HTTP/1.1 204 No Content\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.status, 204);
    }

    #[test]
    fn a_missing_socket_is_one_line_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nothing.sock");
        let e = Engine::new(&path)
            .ping(&CallContext::background())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OTHER);
        assert!(e.message().contains(&path.display().to_string()), "{e}");
        assert!(!e.message().contains('\n'));
        // A socket file nobody listens on: refused.
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(l);
        let e = Engine::new(&path)
            .ping(&CallContext::background())
            .unwrap_err();
        assert!(e.message().contains("connection refused"), "{e}");
    }

    #[test]
    fn log_frames_are_joined() {
        let mut raw = vec![2, 0, 0, 0, 0, 0, 0, 6];
        raw.extend_from_slice(b"alert\n");
        raw.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 3]);
        raw.extend_from_slice(b"ok\n");
        assert_eq!(demux(&raw), "alert\nok\n");
        assert_eq!(demux(b"plain text"), "plain text");
    }

    #[test]
    fn query_values_are_encoded() {
        assert_eq!(encode("a=b/c d"), "a%3Db%2Fc%20d");
        assert_eq!(encode("kind-worker_2.x~"), "kind-worker_2.x~");
    }
}
