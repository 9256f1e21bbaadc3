//! A small client for the AWS Query APIs this provider calls (EC2 `2016-11-15`, ELBv2
//! `2015-12-01`, classic ELB `2012-06-01` on the ELBv2 endpoint): form-encoded POST requests signed with the SDK's SigV4 implementation
//! (aws-sigv4), sent over hyper + rustls (the HTTP stack kube already links), XML responses
//! read with roxmltree.
//!
//! Each call: credentials from [`CredentialSource`], sign, send, read; a transport failure or
//! a 5xx is tried again (at most three attempts, 100 ms then 400 ms apart) while the call's
//! deadline allows; rejected credentials are fetched again once (keys rotated on disk); every
//! other error is returned as an [`AwsError`] with the AWS code. Throttling is not retried
//! here: the host pauses every caller when a call reports `throttled`.

pub mod ec2;
pub mod elb;
pub mod elbv2;
pub mod error;
pub mod xml;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_smithy_runtime_api::client::http::SharedHttpClient;
use aws_smithy_runtime_api::client::identity::Identity;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::credentials::CredentialSource;
pub use error::AwsError;

type HttpClient = Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Full<Bytes>,
>;

/// Per-request timeout when the call has no deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts for transport failures and server errors.
const ATTEMPTS: u32 = 3;

/// The HTTPS client the SDK's credential providers use (STS, IMDS, ECS): rustls with ring.
pub fn sdk_http_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls;
    aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// One AWS service endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `ec2` or `elasticloadbalancing` (also the default signing name).
    pub service: &'static str,
    /// The Query API version.
    pub version: &'static str,
    /// Base URL, without a trailing slash.
    pub url: String,
    /// SigV4 region.
    pub signing_region: String,
    /// SigV4 service name.
    pub signing_name: String,
}

impl Endpoint {
    /// The public endpoint of `service` in `region` (`.amazonaws.com.cn` in China).
    pub fn default_for(service: &'static str, version: &'static str, region: &str) -> Self {
        let suffix = if region.starts_with("cn-") {
            "amazonaws.com.cn"
        } else {
            "amazonaws.com"
        };
        Self {
            service,
            version,
            url: format!("https://{service}.{region}.{suffix}"),
            signing_region: region.to_string(),
            signing_name: service.to_string(),
        }
    }
}

/// Query parameters of one call, in order.
#[derive(Debug, Default, Clone)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// No parameters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add `key=value`.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.0.push((key.into(), value.into()));
        self
    }

    /// EC2 list: `Key.1=a&Key.2=b`.
    pub fn ec2_list<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> &mut Self {
        for (i, v) in values.iter().enumerate() {
            self.set(format!("{key}.{}", i + 1), v.as_ref());
        }
        self
    }

    /// EC2 filters: `Filter.N.Name` and `Filter.N.Value.M`.
    pub fn ec2_filters<S: AsRef<str>>(&mut self, filters: &[(&str, &[S])]) -> &mut Self {
        for (i, (name, values)) in filters.iter().enumerate() {
            self.set(format!("Filter.{}.Name", i + 1), *name);
            for (j, v) in values.iter().enumerate() {
                self.set(format!("Filter.{}.Value.{}", i + 1, j + 1), v.as_ref());
            }
        }
        self
    }

    /// ELBv2 list: `Key.member.1=a`.
    pub fn member_list<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> &mut Self {
        for (i, v) in values.iter().enumerate() {
            self.set(format!("{key}.member.{}", i + 1), v.as_ref());
        }
        self
    }

    /// ELBv2 tags: `Tags.member.N.Key` / `.Value`.
    pub fn member_tags<'a>(
        &mut self,
        key: &str,
        tags: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> &mut Self {
        for (i, (k, v)) in tags.into_iter().enumerate() {
            self.set(format!("{key}.member.{}.Key", i + 1), k.as_str());
            self.set(format!("{key}.member.{}.Value", i + 1), v.as_str());
        }
        self
    }

    fn encode(&self, action: &str, version: &str) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        s.append_pair("Action", action);
        s.append_pair("Version", version);
        for (k, v) in &self.0 {
            s.append_pair(k, v);
        }
        s.finish()
    }
}

/// Counts of the calls made, by action (for logs and the benchmarks).
#[derive(Debug, Default)]
pub struct CallCounts {
    total: AtomicU64,
    errors: AtomicU64,
}

impl CallCounts {
    /// Calls sent (attempts included).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Calls that failed.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// The Query API client shared by every part of one provider instance.
pub struct AwsClient {
    http: HttpClient,
    credentials: Arc<CredentialSource>,
    /// The EC2 endpoint.
    pub ec2: Endpoint,
    /// The ELBv2 endpoint.
    pub elbv2: Endpoint,
    /// The classic ELB endpoint: ELBv2's URL and signing name, API version `2012-06-01`.
    pub elb: Endpoint,
    counts: CallCounts,
}

impl AwsClient {
    /// A client for these endpoints. Must be created inside the provider's runtime.
    pub fn new(credentials: Arc<CredentialSource>, ec2: Endpoint, elbv2: Endpoint) -> Self {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions");
        let roots = rustls_native_roots();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.with_root_certificates(roots).with_no_client_auth())
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(16)
            .build(https);
        let elb = Endpoint {
            service: "elb",
            version: "2012-06-01",
            ..elbv2.clone()
        };
        Self {
            http,
            credentials,
            ec2,
            elbv2,
            elb,
            counts: CallCounts::default(),
        }
    }

    /// Calls made so far.
    pub fn counts(&self) -> &CallCounts {
        &self.counts
    }

    /// The credential source.
    pub fn credentials(&self) -> &CredentialSource {
        &self.credentials
    }

    /// Call `action` on `endpoint`; returns the response body (XML).
    pub async fn call(
        &self,
        endpoint: &Endpoint,
        action: &str,
        params: &Params,
    ) -> Result<String, AwsError> {
        let body = params.encode(action, endpoint.version);
        let mut attempt = 0;
        let mut refreshed = false;
        loop {
            attempt += 1;
            let entry = crate::runtime::InFlight::start(format!(
                "{} {action} at {}",
                endpoint.service, endpoint.url
            ));
            let result = self.send(endpoint, action, &body).await;
            entry.done();
            self.counts.total.fetch_add(1, Ordering::Relaxed);
            let e = match result {
                Ok(text) => return Ok(text),
                Err(e) => e,
            };
            self.counts.errors.fetch_add(1, Ordering::Relaxed);
            if e.is_bad_credentials() && !refreshed && self.credentials.invalidate().await {
                log::warn!("aws: {e}; fetching the credentials again");
                refreshed = true;
                continue;
            }
            if e.is_transient() && attempt < ATTEMPTS {
                let pause = Duration::from_millis(100 * 4u64.pow(attempt - 1));
                log::debug!("aws: {e}; trying again in {pause:?}");
                tokio::time::sleep(pause).await;
                continue;
            }
            return Err(e);
        }
    }

    async fn send(
        &self,
        endpoint: &Endpoint,
        action: &str,
        body: &str,
    ) -> Result<String, AwsError> {
        let service = endpoint.service;
        let creds = self.credentials.get().await.map_err(|e| AwsError {
            service,
            action: action.to_string(),
            status: None,
            // None found (unauthorized) or a source that failed for now (retried).
            code: if e.kind() == ccm_provider_abi::ErrorKind::UNAUTHORIZED {
                "NoCredentials".into()
            } else {
                "CredentialsUnavailable".into()
            },
            message: e.message().to_string(),
        })?;
        let url = format!("{}/", endpoint.url);
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let identity: Identity = creds.into();
        let settings = aws_sigv4::http_request::SigningSettings::default();
        let params = aws_sigv4::sign::v4::SigningParams::builder()
            .identity(&identity)
            .region(&endpoint.signing_region)
            .name(&endpoint.signing_name)
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| AwsError::transport(service, action, format!("cannot sign: {e}")))?
            .into();
        let headers = [("content-type", content_type)];
        let signable = aws_sigv4::http_request::SignableRequest::new(
            "POST",
            &url,
            headers.iter().copied(),
            aws_sigv4::http_request::SignableBody::Bytes(body.as_bytes()),
        )
        .map_err(|e| AwsError::transport(service, action, format!("cannot sign: {e}")))?;
        let (instructions, _) = aws_sigv4::http_request::sign(signable, &params)
            .map_err(|e| AwsError::transport(service, action, format!("cannot sign: {e}")))?
            .into_parts();
        let mut req = http::Request::builder()
            .method("POST")
            .uri(&url)
            .header("content-type", content_type)
            .header(
                "user-agent",
                concat!("ccm-host-aws/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| AwsError::transport(service, action, format!("bad request: {e}")))?;
        instructions.apply_to_request_http1x(&mut req);

        let exchange = async {
            let resp = self.http.request(req).await.map_err(|e| {
                AwsError::transport(service, action, transport_message(&e, &endpoint.url))
            })?;
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| {
                    AwsError::transport(service, action, format!("reading the response: {e}"))
                })?
                .to_bytes();
            Ok::<_, AwsError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                AwsError::transport(
                    service,
                    action,
                    format!("no answer from {} in {REQUEST_TIMEOUT:?}", endpoint.url),
                )
            })??;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let (code, message) = error::parse_error_body(&text).unwrap_or_else(|| {
            let snippet: String = text.chars().take(200).collect();
            (format!("HTTP{status}"), snippet)
        });
        Err(AwsError {
            service,
            action: action.to_string(),
            status: Some(status),
            code,
            message,
        })
    }
}

fn transport_message(e: &hyper_util::client::legacy::Error, url: &str) -> String {
    use std::error::Error as _;
    let mut msg = format!("cannot reach {url}: {e}");
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// The system's trusted roots (an empty store, with a warning, when none can be read: calls
/// to https endpoints then fail with a certificate error naming the cause).
fn rustls_native_roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        log::warn!("aws: reading the system's CA certificates: {e}");
    }
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        log::warn!("aws: no system CA certificates found; https endpoints will fail verification");
    }
    roots
}

/// Parse a response body.
pub fn parse<'b>(
    service: &'static str,
    action: &str,
    body: &'b str,
) -> Result<roxmltree::Document<'b>, AwsError> {
    roxmltree::Document::parse(body).map_err(|e| AwsError {
        service,
        action: action.to_string(),
        status: Some(200),
        code: "MalformedResponse".into(),
        message: format!("the response is not XML: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_encode_in_the_query_format() {
        let mut p = Params::new();
        p.ec2_list("InstanceId", &["i-1", "i-2"])
            .ec2_filters(&[("tag:kubernetes.io/cluster/x", &["owned"][..])])
            .member_list("Names", &["a b"]);
        let tags: std::collections::BTreeMap<String, String> =
            [("k".to_string(), "v=1".to_string())].into();
        p.member_tags("Tags", &tags);
        assert_eq!(
            p.encode("DescribeInstances", "2016-11-15"),
            "Action=DescribeInstances&Version=2016-11-15&InstanceId.1=i-1&InstanceId.2=i-2\
             &Filter.1.Name=tag%3Akubernetes.io%2Fcluster%2Fx&Filter.1.Value.1=owned\
             &Names.member.1=a+b&Tags.member.1.Key=k&Tags.member.1.Value=v%3D1"
        );
        let e = Endpoint::default_for("ec2", "2016-11-15", "cn-north-1");
        assert_eq!(e.url, "https://ec2.cn-north-1.amazonaws.com.cn");
    }
}
