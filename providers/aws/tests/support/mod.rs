//! Test environment for the `aws` provider against a real moto server.
//!
//! - [`Moto`]: `moto_server -H 127.0.0.1 -p <free port>` from the venv `.ci/run` installs
//!   (`$CCM_MOTO_SERVER`, else `target/moto-venv/bin/moto_server`). Missing moto fails the test
//!   with the command that installs it, never a skip. One server per test binary, shared by
//!   its tests one at a time ([`shared_moto`] holds a lock and resets moto with
//!   `POST /moto-api/reset`); a watchdog ends it when the test process exits.
//! - [`Proxy`]: a small HTTP proxy in front of moto that counts the calls by action and can
//!   answer the next calls with `RequestLimitExceeded` / `Throttling` (moto never throttles).
//! - [`AwsEnv`]: a VPC with two public subnets and a cluster-tagged route table in moto, the
//!   in-memory Kubernetes API server, and the plugin's `.so` loaded by the host's real loader
//!   with a cloud config that points EC2 and ELBv2 at the proxy.

#![allow(dead_code, missing_docs)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use ccm_host::controllers::{ControllerConfig, ControllerContext};
use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::{HostServices, Provider, ProviderOptions};
use ccm_host::runtime::metrics::Metrics;
use ccm_provider_aws::api::ec2::Instance;
use ccm_provider_aws::api::{AwsClient, Endpoint, Params};
use ccm_provider_aws::credentials::CredentialSource;
use kube_apiserver_inmem::ApiServer;
use prometheus_client::registry::Registry;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub const REGION: &str = "us-east-1";
pub const ZONES: [&str; 2] = ["us-east-1a", "us-east-1b"];
pub const CLUSTER: &str = "ccm-test";
pub const ACCESS_KEY: &str = "AKIDCCMTEST";
pub const SECRET_KEY: &str = "ccm-test-secret";
pub const UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
pub const SHUTDOWN_TAINT: &str = "node.cloudprovider.kubernetes.io/shutdown";

// ---------------------------------------------------------------------------------------------
// moto
// ---------------------------------------------------------------------------------------------

/// Where moto_server is: `$CCM_MOTO_SERVER`, else `<workspace>/target/moto-venv/bin/moto_server`.
pub fn moto_server_path() -> PathBuf {
    if let Some(p) = std::env::var_os("CCM_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    target.join("moto-venv/bin/moto_server")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a free port")
        .local_addr()
        .unwrap()
        .port()
}

/// A running moto_server, stopped on drop (and by its watchdog when this process ends).
pub struct Moto {
    pub addr: SocketAddr,
    child: Child,
}

impl Moto {
    /// Start moto with extra environment variables (e.g. `INITIAL_NO_AUTH_ACTION_COUNT`).
    pub fn start(env: &[(&str, &str)]) -> Self {
        let bin = moto_server_path();
        if !bin.is_file() {
            panic!(
                "moto is not installed: {} does not exist. The aws provider's tests need a real moto \
                 server: run `bash .ci/run` (it installs moto into target/moto-venv), or \
                 `python3 -m venv target/moto-venv && target/moto-venv/bin/pip install 'moto[server]==5.2.5'`, \
                 or set CCM_MOTO_SERVER to a moto_server executable",
                bin.display()
            );
        }
        let port = free_port();
        // The watchdog ends moto when this test process is gone, even if it is killed.
        let script = format!(
            "\"$0\" -H 127.0.0.1 -p {port} >/dev/null 2>&1 & child=$!; \
             while kill -0 {parent} 2>/dev/null && kill -0 $child 2>/dev/null; do sleep 0.5; done; \
             kill $child 2>/dev/null; wait $child 2>/dev/null",
            parent = std::process::id()
        );
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).arg(&bin);
        // Its own process group: dropping the handle ends the shell and moto together.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let started = Instant::now();
        loop {
            if let Ok((200, _)) = blocking_http(addr, "GET", "/moto-api/", "") {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                panic!(
                    "moto_server ({}) did not answer on {addr} within 60 s",
                    bin.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { addr, child }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `POST /moto-api/reset`: every service's state wiped.
    pub fn reset(&self) {
        let (status, body) =
            blocking_http(self.addr, "POST", "/moto-api/reset", "").expect("reset moto");
        assert_eq!(status, 200, "moto reset: {body}");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// The test binary's shared moto, locked for one test and reset.
pub struct SharedMoto {
    _guard: MutexGuard<'static, ()>,
    pub moto: &'static Moto,
}

static SHARED: OnceLock<Moto> = OnceLock::new();
static LOCK: Mutex<()> = Mutex::new(());

/// Lock the shared moto for this test and reset it.
pub fn shared_moto() -> SharedMoto {
    let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let moto = SHARED.get_or_init(|| Moto::start(&[]));
    moto.reset();
    SharedMoto {
        _guard: guard,
        moto,
    }
}

/// One HTTP/1.1 exchange without keep-alive (setup and readiness checks).
pub fn blocking_http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let (status, body) =
        split_response(&raw).ok_or_else(|| std::io::Error::other("bad HTTP response"))?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn split_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = &raw[end + 4..];
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    if !chunked {
        return Some((status, body.to_vec()));
    }
    let mut out = Vec::new();
    let mut rest = body;
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).ok()?.trim(), 16).ok()?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Some((status, out));
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy: call counts and injected throttling
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct ProxyState {
    counts: Mutex<BTreeMap<String, u64>>,
    /// Answer this many of the next matching calls with a throttling error.
    throttle: AtomicU32,
    /// Only actions starting with this prefix are throttled (empty: every action).
    throttle_prefix: Mutex<String>,
    throttled: AtomicU32,
    /// The error code the next throttled calls get instead (`fail_next`).
    fail_code: Mutex<Option<String>>,
    /// Added latency per call.
    delay_ms: AtomicU32,
    stopped: AtomicBool,
}

/// An HTTP proxy in front of moto.
pub struct Proxy {
    pub addr: SocketAddr,
    state: Arc<ProxyState>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = serve(conn, upstream, st).await;
                });
            }
        });
        Proxy { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Calls seen, by action; error answers as `!<Code>`, signing keys as `@<access key id>`.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.state.counts.lock().unwrap().clone()
    }

    /// Calls seen of `action`.
    pub fn count(&self, action: &str) -> u64 {
        self.counts().get(action).copied().unwrap_or(0)
    }

    /// Every call seen (error answers and signing keys, counted as `!<Code>` and `@<key>`
    /// too, are not added).
    pub fn total(&self) -> u64 {
        self.counts()
            .iter()
            .filter(|(k, _)| !k.starts_with('!') && !k.starts_with('@'))
            .map(|(_, v)| v)
            .sum()
    }

    pub fn clear_counts(&self) {
        self.state.counts.lock().unwrap().clear();
    }

    /// Throttle the next `n` calls whose action starts with `prefix` ("" = any).
    pub fn throttle_next(&self, n: u32, prefix: &str) {
        *self.state.fail_code.lock().unwrap() = None;
        *self.state.throttle_prefix.lock().unwrap() = prefix.to_string();
        self.state.throttle.store(n, Ordering::SeqCst);
    }

    /// Answer the next `n` calls whose action starts with `prefix` with the error `code`
    /// (HTTP 400), as AWS answers what moto does not (e.g. `DependencyViolation`).
    pub fn fail_next(&self, n: u32, prefix: &str, code: &str) {
        *self.state.fail_code.lock().unwrap() = Some(code.to_string());
        *self.state.throttle_prefix.lock().unwrap() = prefix.to_string();
        self.state.throttle.store(n, Ordering::SeqCst);
    }

    /// Throttled answers sent so far.
    pub fn throttled(&self) -> u32 {
        self.state.throttled.load(Ordering::SeqCst)
    }

    /// Delay every call by `d`.
    pub fn set_delay(&self, d: Duration) {
        self.state
            .delay_ms
            .store(d.as_millis() as u32, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stopped.store(true, Ordering::SeqCst);
        self.task.abort();
    }
}

async fn read_request(conn: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = buf[head_end..].to_vec();
    let mut head_bytes = buf[..head_end].to_vec();
    // One request per connection: ask for the connection to be closed.
    let text = String::from_utf8_lossy(&head_bytes).into_owned();
    let kept: Vec<&str> = text
        .split("\r\n")
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .filter(|l| !l.is_empty())
        .collect();
    head_bytes = format!("{}\r\nConnection: close\r\n\r\n", kept.join("\r\n")).into_bytes();
    Ok(Some((head_bytes, body)))
}

async fn serve(
    mut conn: TcpStream,
    upstream: SocketAddr,
    st: Arc<ProxyState>,
) -> std::io::Result<()> {
    let Some((head, body)) = read_request(&mut conn).await? else {
        return Ok(());
    };
    let form = String::from_utf8_lossy(&body).into_owned();
    let action = form
        .split('&')
        .find_map(|kv| kv.strip_prefix("Action="))
        .unwrap_or("?")
        .to_string();
    *st.counts.lock().unwrap().entry(action.clone()).or_default() += 1;
    // The access key each call was signed with, counted as `@<key id>`.
    let head_text = String::from_utf8_lossy(&head);
    if let Some(key) = head_text
        .split_once("Credential=")
        .and_then(|(_, rest)| rest.split_once('/'))
        .map(|(k, _)| k.to_string())
    {
        *st.counts
            .lock()
            .unwrap()
            .entry(format!("@{key}"))
            .or_default() += 1;
    }
    let delay = st.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay.into())).await;
    }
    let prefix = st.throttle_prefix.lock().unwrap().clone();
    let throttle = action.starts_with(&prefix)
        && st
            .throttle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
    if throttle {
        st.throttled.fetch_add(1, Ordering::SeqCst);
        if let Some(code) = st.fail_code.lock().unwrap().clone() {
            *st.counts
                .lock()
                .unwrap()
                .entry(format!("!{code}"))
                .or_default() += 1;
        }
        let elb = String::from_utf8_lossy(&head).contains("/elasticloadbalancing/");
        let custom = st.fail_code.lock().unwrap().clone().map(|code| {
            format!("<?xml version=\"1.0\"?><Response><Errors><Error><Code>{code}</Code><Message>injected by the test proxy</Message></Error></Errors><RequestID>x</RequestID></Response>")
        });
        let (status, xml) = if let Some(x) = custom.as_deref() {
            (400, x)
        } else if elb {
            (
                400,
                "<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>x</RequestId></ErrorResponse>",
            )
        } else {
            (
                503,
                "<?xml version=\"1.0\"?><Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>x</RequestID></Response>",
            )
        };
        let resp = format!(
            "HTTP/1.1 {status} Throttled\r\nContent-Type: text/xml\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{xml}",
            xml.len()
        );
        conn.write_all(resp.as_bytes()).await?;
        return conn.shutdown().await;
    }
    let mut up = TcpStream::connect(upstream).await?;
    up.write_all(&head).await?;
    up.write_all(&body).await?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp).await?;
    // Error answers are counted as `!<Code>` (e.g. `!InvalidTarget`).
    let text = String::from_utf8_lossy(&resp);
    let failed = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .is_some_and(|s| s >= 400);
    if let Some(code) = failed
        .then_some(&text)
        .and_then(|text| text.split_once("<Code>"))
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(c, _)| c.to_string())
    {
        *st.counts
            .lock()
            .unwrap()
            .entry(format!("!{code}"))
            .or_default() += 1;
    }
    conn.write_all(&resp).await?;
    conn.shutdown().await
}

/// moto with IAM enforcement: the first four calls are free (they create a user with an
/// allow-all policy and its access key); every later call needs that key.
pub async fn moto_with_iam() -> (Moto, String, String) {
    moto_with_iam_and_role(false).await
}

/// The role that a web identity token, and the user `ccm` (standing in for EC2 handing out
/// the instance role), may assume (allow-all policy); created by [`moto_with_iam_and_role`].
pub const WEB_IDENTITY_ROLE: &str = "arn:aws:iam::123456789012:role/ccm-irsa";

/// [`moto_with_iam`], plus (with `role`) the role [`WEB_IDENTITY_ROLE`] with the same policy.
pub async fn moto_with_iam_and_role(role: bool) -> (Moto, String, String) {
    let free = if role { "6" } else { "4" };
    let moto = Moto::start(&[("INITIAL_NO_AUTH_ACTION_COUNT", free)]);
    let api = direct_client(&moto.url());
    let iam = ccm_provider_aws::api::Endpoint {
        service: "iam",
        version: "2010-05-08",
        url: moto.url(),
        signing_region: REGION.into(),
        signing_name: "iam".into(),
    };
    let call = |action: &'static str, params: Vec<(&'static str, String)>| {
        let (api, iam) = (&api, iam.clone());
        async move {
            let mut p = ccm_provider_aws::api::Params::new();
            for (k, v) in params {
                p.set(k, v);
            }
            api.call(&iam, action, &p)
                .await
                .unwrap_or_else(|e| panic!("{action}: {e}"))
        }
    };
    call("CreateUser", vec![("UserName", "ccm".into())]).await;
    let key = call("CreateAccessKey", vec![("UserName", "ccm".into())]).await;
    let policy =
        r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":"*","Resource":"*"}]}"#;
    let arn = first(
        &call(
            "CreatePolicy",
            vec![
                ("PolicyName", "all".into()),
                ("PolicyDocument", policy.into()),
            ],
        )
        .await,
        "Arn",
    );
    call(
        "AttachUserPolicy",
        vec![("UserName", "ccm".into()), ("PolicyArn", arn.clone())],
    )
    .await;
    if role {
        let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"arn:aws:iam::123456789012:oidc-provider/oidc.example"},"Action":"sts:AssumeRoleWithWebIdentity"},{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::123456789012:user/ccm"},"Action":"sts:AssumeRole"}]}"#;
        call(
            "CreateRole",
            vec![
                ("RoleName", "ccm-irsa".into()),
                ("AssumeRolePolicyDocument", trust.into()),
            ],
        )
        .await;
        call(
            "AttachRolePolicy",
            vec![("RoleName", "ccm-irsa".into()), ("PolicyArn", arn)],
        )
        .await;
    }
    (
        moto,
        first(&key, "AccessKeyId"),
        first(&key, "SecretAccessKey"),
    )
}

// ---------------------------------------------------------------------------------------------
// A stand-in for the EC2 instance metadata service (IMDSv2)
// ---------------------------------------------------------------------------------------------

/// What the stand-in serves.
#[derive(Default)]
pub struct ImdsState {
    pub region: Mutex<String>,
    /// `(role, access key, secret, session token)` of the instance profile.
    pub role: Mutex<Option<(String, String, String, String)>>,
    /// Requests seen, `METHOD path` (token requests included).
    pub seen: Mutex<Vec<String>>,
    /// Metadata requests that came without a valid session token (refused with 401).
    pub without_token: AtomicU32,
}

/// IMDSv2 on 127.0.0.1: `PUT /latest/api/token` (with the TTL header) gives a session token;
/// every `GET` must carry it in `x-aws-ec2-metadata-token` (else 401, as EC2 answers).
pub struct ImdsStandIn {
    pub addr: SocketAddr,
    pub state: Arc<ImdsState>,
    task: tokio::task::JoinHandle<()>,
}

const IMDS_TOKEN: &str = "stand-in-session-token";

impl ImdsStandIn {
    pub async fn start(region: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind IMDS");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ImdsState::default());
        *state.region.lock().unwrap() = region.to_string();
        let st = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let st = st.clone();
                tokio::spawn(async move {
                    let _ = imds_serve(conn, st).await;
                });
            }
        });
        Self { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_role_session(&self, role: &str, key: &str, secret: &str, token: &str) {
        *self.state.role.lock().unwrap() =
            Some((role.into(), key.into(), secret.into(), token.into()));
    }

    pub fn seen(&self) -> Vec<String> {
        self.state.seen.lock().unwrap().clone()
    }
}

impl Drop for ImdsStandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn imds_serve(mut conn: TcpStream, st: Arc<ImdsState>) -> std::io::Result<()> {
    let Some((head, _body)) = read_request(&mut conn).await? else {
        return Ok(());
    };
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default().to_string();
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let path = parts.next().unwrap_or_default().to_string();
    let header = |name: &str| {
        head.split("\r\n").find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    st.seen.lock().unwrap().push(format!("{method} {path}"));
    let (status, body) = if method == "PUT" && path == "/latest/api/token" {
        if header("x-aws-ec2-metadata-token-ttl-seconds").is_some() {
            (200, IMDS_TOKEN.to_string())
        } else {
            (400, String::new())
        }
    } else if header("x-aws-ec2-metadata-token").as_deref() != Some(IMDS_TOKEN) {
        st.without_token.fetch_add(1, Ordering::SeqCst);
        (401, String::new())
    } else if path == "/latest/meta-data/placement/region" {
        (200, st.region.lock().unwrap().clone())
    } else if let Some(rest) = path.strip_prefix("/latest/meta-data/iam/security-credentials/") {
        match st.role.lock().unwrap().clone() {
            None => (404, String::new()),
            Some((role, _, _, _)) if rest.is_empty() => (200, role),
            Some((role, key, secret, token)) if rest == role => {
                let expires = "2099-01-01T00:00:00Z";
                (
                    200,
                    json!({
                        "Code": "Success", "LastUpdated": "2026-01-01T00:00:00Z",
                        "Type": "AWS-HMAC", "AccessKeyId": key, "SecretAccessKey": secret,
                        "Token": token, "Expiration": expires,
                    })
                    .to_string(),
                )
            }
            Some(_) => (404, String::new()),
        }
    } else {
        (404, String::new())
    };
    let resp = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nx-aws-ec2-metadata-token-ttl-seconds: 21600\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(resp.as_bytes()).await?;
    conn.shutdown().await
}

// ---------------------------------------------------------------------------------------------
// Cloud setup through the Query APIs (signed with static keys)
// ---------------------------------------------------------------------------------------------

/// A client straight to moto (setup and verification), with the test's static keys.
pub fn direct_client(moto_url: &str) -> AwsClient {
    client_for(moto_url, ACCESS_KEY, SECRET_KEY)
}

pub fn client_for(url: &str, key: &str, secret: &str) -> AwsClient {
    let creds = Arc::new(CredentialSource::from_static(
        key,
        secret,
        ccm_provider_aws::api::sdk_http_client(),
    ));
    let ep = |service, version| Endpoint {
        service,
        version,
        url: url.to_string(),
        signing_region: REGION.into(),
        signing_name: service.to_string(),
    };
    AwsClient::new(
        creds,
        ep("ec2", "2016-11-15"),
        ep("elasticloadbalancing", "2015-12-01"),
    )
}

/// Call an EC2 action, return the body; panics on an error (setup).
pub async fn ec2(api: &AwsClient, action: &str, params: &[(&str, &str)]) -> String {
    let mut p = Params::new();
    for (k, v) in params {
        p.set(*k, *v);
    }
    let ep = api.ec2.clone();
    api.call(&ep, action, &p)
        .await
        .unwrap_or_else(|e| panic!("{action}: {e}"))
}

/// Call an ELBv2 action, return the body; panics on an error.
pub async fn elb(api: &AwsClient, action: &str, params: &[(&str, &str)]) -> String {
    let mut p = Params::new();
    for (k, v) in params {
        p.set(*k, *v);
    }
    let ep = api.elbv2.clone();
    api.call(&ep, action, &p)
        .await
        .unwrap_or_else(|e| panic!("{action}: {e}"))
}

/// The text of the first element named `name` in `xml`.
pub fn first(xml: &str, name: &str) -> String {
    all(xml, name)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no <{name}> in {xml}"))
}

/// The texts of every element named `name` in `xml`.
pub fn all(xml: &str, name: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse(xml).expect("XML");
    doc.descendants()
        .filter(|n| n.is_element() && n.tag_name().name() == name)
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

/// The VPC the tests use.
#[derive(Debug, Clone)]
pub struct Cloud {
    pub vpc: String,
    /// `(zone, subnet)`.
    pub subnets: Vec<(String, String)>,
    pub route_table: String,
}

/// A VPC with one public subnet per zone (tagged for the cluster and for internet-facing
/// load balancers, public IPs on launch), an internet gateway and a cluster-tagged route table.
pub async fn make_cloud(api: &AwsClient) -> Cloud {
    let vpc = first(
        &ec2(api, "CreateVpc", &[("CidrBlock", "10.0.0.0/16")]).await,
        "vpcId",
    );
    let mut subnets = Vec::new();
    for (i, zone) in ZONES.iter().enumerate() {
        let cidr = format!("10.0.{}.0/20", i * 16);
        let id = first(
            &ec2(
                api,
                "CreateSubnet",
                &[
                    ("VpcId", &vpc),
                    ("CidrBlock", &cidr),
                    ("AvailabilityZone", zone),
                ],
            )
            .await,
            "subnetId",
        );
        ec2(
            api,
            "ModifySubnetAttribute",
            &[("SubnetId", &id), ("MapPublicIpOnLaunch.Value", "true")],
        )
        .await;
        let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
        ec2(
            api,
            "CreateTags",
            &[
                ("ResourceId.1", &id),
                ("Tag.1.Key", &cluster_tag),
                ("Tag.1.Value", "shared"),
                ("Tag.2.Key", "kubernetes.io/role/elb"),
                ("Tag.2.Value", "1"),
                ("Tag.3.Key", "Name"),
                ("Tag.3.Value", &format!("public-{zone}")),
            ],
        )
        .await;
        subnets.push((zone.to_string(), id));
    }
    let igw = first(
        &ec2(api, "CreateInternetGateway", &[]).await,
        "internetGatewayId",
    );
    ec2(
        api,
        "AttachInternetGateway",
        &[("InternetGatewayId", &igw), ("VpcId", &vpc)],
    )
    .await;
    let rtb = first(
        &ec2(api, "CreateRouteTable", &[("VpcId", &vpc)]).await,
        "routeTableId",
    );
    ec2(
        api,
        "CreateRoute",
        &[
            ("RouteTableId", &rtb),
            ("DestinationCidrBlock", "0.0.0.0/0"),
            ("GatewayId", &igw),
        ],
    )
    .await;
    for (_, s) in &subnets {
        ec2(
            api,
            "AssociateRouteTable",
            &[("RouteTableId", &rtb), ("SubnetId", s)],
        )
        .await;
    }
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    ec2(
        api,
        "CreateTags",
        &[
            ("ResourceId.1", &rtb),
            ("Tag.1.Key", &cluster_tag),
            ("Tag.1.Value", "owned"),
        ],
    )
    .await;
    Cloud {
        vpc,
        subnets,
        route_table: rtb,
    }
}

/// Run `n` cluster-tagged instances of `instance_type` in the subnet of `zone_index`.
pub async fn run_instances(
    api: &AwsClient,
    cloud: &Cloud,
    n: usize,
    zone_index: usize,
    instance_type: &str,
) -> Vec<Instance> {
    let subnet = &cloud.subnets[zone_index].1;
    let cluster_tag = format!("kubernetes.io/cluster/{CLUSTER}");
    let body = ec2(
        api,
        "RunInstances",
        &[
            ("ImageId", "ami-12c6146b"),
            ("MinCount", &n.to_string()),
            ("MaxCount", &n.to_string()),
            ("InstanceType", instance_type),
            ("SubnetId", subnet),
            ("TagSpecification.1.ResourceType", "instance"),
            ("TagSpecification.1.Tag.1.Key", &cluster_tag),
            ("TagSpecification.1.Tag.1.Value", "owned"),
        ],
    )
    .await;
    let ids: Vec<String> = all(&body, "instanceId");
    describe(api, &ids).await
}

/// The instances `ids`, in that order.
pub async fn describe(api: &AwsClient, ids: &[String]) -> Vec<Instance> {
    let found = api
        .describe_instances(&[("instance-id", ids)])
        .await
        .expect("describe instances");
    ids.iter()
        .map(|id| {
            found
                .iter()
                .find(|i| i.id == *id)
                .cloned()
                .unwrap_or_else(|| panic!("{id} not described"))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The provider through the host's loader, and the in-memory API server
// ---------------------------------------------------------------------------------------------

/// The plugin's `.so` as cargo built it for this test run.
pub fn built_plugin() -> PathBuf {
    ccm_test_support::built_plugin("ccm_provider_aws")
}

/// The cloud config pointing EC2 and ELBv2 at `url`, credentials from `credentials_file`.
pub fn cloud_config(url: &str, credentials_file: &Path, extra_global: &str) -> String {
    format!(
        r#"[Global]
Zone = {zone}
KubernetesClusterID = {CLUSTER}
SharedCredentialsFile = {creds}
Profile = ccm
{extra_global}

[ServiceOverride "ec2"]
Service = ec2
Region = {REGION}
URL = {url}
SigningRegion = {REGION}

[ServiceOverride "elb"]
Service = elasticloadbalancing
Region = {REGION}
URL = {url}
SigningRegion = {REGION}
"#,
        zone = ZONES[0],
        creds = credentials_file.display(),
    )
}

/// Write a shared credentials file with profile `ccm` (temp file renamed over, as rotation
/// tools do).
pub fn write_credentials(path: &Path, key: &str, secret: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!("[ccm]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"),
    )
    .unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Options of [`AwsEnv::start_with`].
pub struct EnvOptions {
    pub extra_global: String,
    pub call_timeout: Duration,
    /// Credentials written to the provider's shared credentials file.
    pub key: (String, String),
}

impl Default for EnvOptions {
    fn default() -> Self {
        Self {
            extra_global: String::new(),
            call_timeout: Duration::from_secs(30),
            key: (ACCESS_KEY.into(), SECRET_KEY.into()),
        }
    }
}

/// A running test environment.
pub struct AwsEnv {
    pub proxy: Proxy,
    /// Straight to moto.
    pub api: AwsClient,
    pub cloud: Cloud,
    pub server: ApiServer,
    pub client: kube::Client,
    pub provider: Provider,
    pub registry: PluginRegistry,
    pub metrics: Arc<Metrics>,
    pub stop: CancellationToken,
    pub dir: tempfile::TempDir,
    pub config: String,
}

impl AwsEnv {
    /// The environment on `moto` (already reset) with default options.
    pub async fn start(moto: &Moto) -> Self {
        Self::start_with(moto, EnvOptions::default()).await
    }

    pub async fn start_with(moto: &Moto, opts: EnvOptions) -> Self {
        let api = direct_client(&moto.url());
        let cloud = make_cloud(&api).await;
        Self::on_cloud(moto, api, cloud, opts).await
    }

    /// The environment on an existing cloud.
    pub async fn on_cloud(moto: &Moto, api: AwsClient, cloud: Cloud, opts: EnvOptions) -> Self {
        let proxy = Proxy::start(moto.addr).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let creds = dir.path().join("credentials");
        write_credentials(&creds, &opts.key.0, &opts.key.1);
        let config = cloud_config(&proxy.url(), &creds, &opts.extra_global);
        let server = ApiServer::start()
            .await
            .expect("in-memory API server starts");
        let client = server.client();
        let plugins = dir.path().join("plugins");
        std::fs::create_dir(&plugins).unwrap();
        std::fs::copy(built_plugin(), plugins.join("libccm_provider_aws.so")).unwrap();
        let registry = PluginRegistry::load_dirs(&[plugins], &LoaderOptions::default())
            .expect("plugin dir loads");
        assert!(
            registry.refused().is_empty(),
            "aws plugin refused: {:?}",
            registry.refused()
        );
        // The factory gets the default deadline (a loaded machine can take over a second to
        // start the plugin's runtime); the calls get the test's.
        let provider = registry
            .create("aws", Some(config.as_bytes()), &ProviderOptions::default())
            .expect("aws provider builds")
            .with_call_timeout(opts.call_timeout);
        provider
            .initialize(HostServices::new(
                CLUSTER,
                Some(client.clone()),
                Arc::new(AtomicBool::new(false)),
            ))
            .await
            .expect("aws provider initialises");
        let mut prom = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut prom));
        AwsEnv {
            proxy,
            api,
            cloud,
            server,
            client,
            provider,
            registry,
            metrics,
            stop: CancellationToken::new(),
            dir,
            config,
        }
    }

    /// A controller context with fresh shared informers (started now).
    pub fn context(&self, config: ControllerConfig) -> ControllerContext {
        ControllerContext::new(
            &self.client,
            &self.provider,
            &self.metrics,
            config,
            "aws-test-host",
            &self.stop,
        )
    }

    /// The provider's credentials file.
    pub fn credentials_path(&self) -> PathBuf {
        self.dir.path().join("credentials")
    }

    /// Seed a kubelet-style Node for `instance` (named after its private DNS name): the
    /// uninitialised taint, Ready as given, plus `extra` merged in.
    pub fn seed_node(&self, instance: &Instance, ready: bool, extra: Value) -> String {
        let name = instance
            .private_dns
            .clone()
            .expect("instance has a private DNS name");
        let mut n = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name},
            "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        });
        merge(&mut n, extra);
        self.server.controls().seed(n).expect("seed node");
        name
    }

    /// A Node as stored.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.server.controls().get("nodes", "", name)
    }

    /// Events stored (all namespaces).
    pub fn events(&self) -> Vec<Value> {
        self.server.controls().list("events")
    }
}

/// The provider built in this process from the environment's config (for the ABI 1.1
/// methods the host does not call yet). Use it from a blocking thread.
pub async fn in_process(env: &AwsEnv) -> ccm_provider_aws::AwsCloud {
    let config = env.config.clone();
    tokio::task::spawn_blocking(move || {
        ccm_provider_aws::AwsCloud::new(Some(config.as_bytes())).expect("provider builds")
    })
    .await
    .unwrap()
}

impl Drop for AwsEnv {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

pub fn labels(n: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(n["metadata"]["labels"].clone()).unwrap_or_default()
}

pub fn taint_keys(n: &Value) -> Vec<String> {
    n["spec"]["taints"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["key"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

pub fn addresses(n: &Value) -> Vec<String> {
    n["status"]["addresses"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    format!(
                        "{}={}",
                        x["type"].as_str().unwrap_or_default(),
                        x["address"].as_str().unwrap_or_default()
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[allow(unused_imports)] // not every test file of this crate waits
pub use ccm_test_support::{eventually, eventually_async};
