//! AWS credentials: the SDK's own default chain (aws-config), cached, and rebuilt when the
//! shared files change.
//!
//! The chain is the standard one, in the standard order: environment (`AWS_ACCESS_KEY_ID`,
//! ...), shared profile files (`~/.aws/credentials`, `~/.aws/config`; profile from
//! `AWS_PROFILE`), web identity / IRSA (`AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`), ECS
//! container credentials, and IMDSv2 (the instance role). With `RoleARN` in the cloud config the
//! chain's credentials assume that role through STS. SSO profiles are not built in (the SSO
//! crates would add two generated SDKs to the build).
//!
//! Caching and rotation: credentials are reused until five minutes before they expire
//! (credentials without an expiry, e.g. static keys, until something says otherwise). The
//! profile provider of aws-config parses the shared files once, so this source looks at their
//! modification time and size on every call and rebuilds the chain when they changed: keys
//! rotated on disk are used by the next call. A call the cloud rejects for its credentials
//! (`AuthFailure`, `InvalidClientTokenId`, `ExpiredToken`, ...) drops the cached credentials,
//! so the next call fetches them again ([`CredentialSource::invalidate`]).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use aws_config::{BehaviorVersion, Region};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_smithy_runtime_api::client::http::SharedHttpClient;
use ccm_provider_abi::ProviderError;

/// Refresh this long before the credentials expire.
const EXPIRY_MARGIN: Duration = Duration::from_secs(300);

/// Where the chain looks, from the cloud config.
#[derive(Debug, Clone, Default)]
pub struct CredentialSettings {
    /// The region (STS for web identity and `RoleARN` is regional).
    pub region: Option<String>,
    /// `SharedCredentialsFile`, instead of the default location.
    pub credentials_file: Option<PathBuf>,
    /// `SharedConfigFile`, instead of the default location.
    pub config_file: Option<PathBuf>,
    /// `Profile`, instead of `AWS_PROFILE` / `default`.
    pub profile: Option<String>,
    /// `RoleARN`: assume this role with the chain's credentials.
    pub role_arn: Option<String>,
    /// A `[ServiceOverride]` URL for STS.
    pub sts_url: Option<String>,
}

/// Modification time, length and inode of the files the profile provider reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct FileStamp(Vec<Option<(SystemTime, u64, u64)>>);

struct State {
    chain: Option<SharedCredentialsProvider>,
    stamp: FileStamp,
    current: Option<Credentials>,
}

/// The provider's credentials.
pub struct CredentialSource {
    settings: CredentialSettings,
    http: SharedHttpClient,
    files: Vec<PathBuf>,
    fixed: bool,
    state: tokio::sync::Mutex<State>,
}

fn home_file(rel: &str) -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(rel))
}

impl CredentialSource {
    /// A source that resolves lazily (the first call builds the chain).
    pub fn new(settings: CredentialSettings, http: SharedHttpClient) -> Self {
        let credentials = settings
            .credentials_file
            .clone()
            .or_else(|| std::env::var_os("AWS_SHARED_CREDENTIALS_FILE").map(PathBuf::from))
            .or_else(|| home_file(".aws/credentials"));
        let config = settings
            .config_file
            .clone()
            .or_else(|| std::env::var_os("AWS_CONFIG_FILE").map(PathBuf::from))
            .or_else(|| home_file(".aws/config"));
        Self {
            settings,
            http,
            files: credentials.into_iter().chain(config).collect(),
            fixed: false,
            state: tokio::sync::Mutex::new(State {
                chain: None,
                stamp: FileStamp::default(),
                current: None,
            }),
        }
    }

    /// Fixed credentials, no chain (tools and tests that talk to an emulator).
    pub fn from_static(
        access_key_id: &str,
        secret_access_key: &str,
        http: SharedHttpClient,
    ) -> Self {
        let creds = Credentials::new(access_key_id, secret_access_key, None, None, "static");
        Self {
            settings: CredentialSettings::default(),
            http,
            files: Vec::new(),
            fixed: true,
            state: tokio::sync::Mutex::new(State {
                chain: Some(SharedCredentialsProvider::new(creds.clone())),
                stamp: FileStamp(Vec::new()),
                current: Some(creds),
            }),
        }
    }

    fn stamp(&self) -> FileStamp {
        FileStamp(
            self.files
                .iter()
                .map(|f| {
                    std::fs::metadata(f).ok().map(|m| {
                        use std::os::unix::fs::MetadataExt;
                        (
                            m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                            m.len(),
                            m.ino(),
                        )
                    })
                })
                .collect(),
        )
    }

    async fn build_chain(&self) -> SharedCredentialsProvider {
        let s = &self.settings;
        let mut loader =
            aws_config::defaults(BehaviorVersion::latest()).http_client(self.http.clone());
        if let Some(r) = &s.region {
            loader = loader.region(Region::new(r.clone()));
        }
        if s.credentials_file.is_some() || s.config_file.is_some() {
            let mut files = EnvConfigFiles::builder();
            files = match &s.credentials_file {
                Some(p) => files.with_file(EnvConfigFileKind::Credentials, p),
                None => files.include_default_credentials_file(true),
            };
            files = match &s.config_file {
                Some(p) => files.with_file(EnvConfigFileKind::Config, p),
                None => files.include_default_config_file(true),
            };
            loader = loader.profile_files(files.build());
        }
        if let Some(p) = &s.profile {
            loader = loader.profile_name(p);
        }
        if let Some(url) = &s.sts_url {
            // Only the credential providers' STS client uses this configuration.
            loader = loader.endpoint_url(url);
        }
        let sdk = loader.load().await;
        let mut base = sdk
            .credentials_provider()
            .unwrap_or_else(|| SharedCredentialsProvider::new(NoCredentials));
        // aws-config's web identity provider builds its STS client without the loader's
        // endpoint; with an STS override, web identity is done here (after the environment,
        // before the rest of the chain).
        if let (Some(url), Some(token_file), Some(role)) = (
            &s.sts_url,
            std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE"),
            std::env::var("AWS_ROLE_ARN").ok().filter(|r| !r.is_empty()),
        ) {
            let region = s.region.clone().unwrap_or_else(|| "us-east-1".into());
            let conf = aws_sdk_sts::Config::builder()
                .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
                .region(Region::new(region))
                .endpoint_url(url)
                .http_client(self.http.clone())
                .build();
            let web = WebIdentity {
                sts: aws_sdk_sts::Client::from_conf(conf),
                token_file: PathBuf::from(token_file),
                role_arn: role,
                session_name: std::env::var("AWS_ROLE_SESSION_NAME")
                    .ok()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| "ccm-host-aws".into()),
            };
            base = SharedCredentialsProvider::new(
                aws_config::meta::credentials::CredentialsProviderChain::first_try(
                    "Environment",
                    aws_config::environment::credentials::EnvironmentVariableCredentialsProvider::new(),
                )
                .or_else("WebIdentityToken", web)
                .or_else("Default", base),
            );
        }
        match &s.role_arn {
            Some(arn) => SharedCredentialsProvider::new(
                aws_config::sts::AssumeRoleProvider::builder(arn.clone())
                    .session_name("ccm-host-aws")
                    .configure(&sdk)
                    .build_from_provider(base)
                    .await,
            ),
            None => base,
        }
    }

    /// Credentials for the next request.
    pub async fn get(&self) -> Result<Credentials, ProviderError> {
        let mut st = self.state.lock().await;
        let stamp = self.stamp();
        if stamp != st.stamp {
            if st.chain.is_some() {
                log::info!(
                    "aws: the shared credentials or config file changed; reading them again"
                );
            }
            st.chain = None;
            st.current = None;
            st.stamp = stamp;
        }
        if let Some(c) = &st.current {
            let fresh = c
                .expiry()
                .is_none_or(|exp| exp > SystemTime::now() + EXPIRY_MARGIN);
            if fresh {
                return Ok(c.clone());
            }
        }
        if st.chain.is_none() {
            st.chain = Some(self.build_chain().await);
        }
        let chain = st.chain.clone().expect("built above");
        let creds = chain
            .provide_credentials()
            .await
            .map_err(credentials_error)?;
        st.current = Some(creds.clone());
        Ok(creds)
    }

    /// Forget the cached credentials (the cloud rejected them): the next call resolves the
    /// chain again. Returns whether anything was cached.
    pub async fn invalidate(&self) -> bool {
        if self.fixed {
            return false;
        }
        let mut st = self.state.lock().await;
        st.chain = None;
        st.current.take().is_some()
    }
}

fn credentials_error(e: CredentialsError) -> ProviderError {
    use std::error::Error as _;
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    // The SDK's chain lists each provider on its own line: one line here.
    let msg = msg
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    match e {
        CredentialsError::ProviderTimedOut(_) | CredentialsError::ProviderError(_) => {
            ProviderError::other(format!("aws credentials: {msg}"))
        }
        _ => ProviderError::unauthorized(format!(
            "aws credentials: {msg} (checked: environment, shared profile files, web identity, ECS, IMDSv2)"
        )),
    }
}

/// AssumeRoleWithWebIdentity with the token read from its file on every call (the kubelet
/// rotates it), against the configured STS endpoint.
#[derive(Debug)]
struct WebIdentity {
    sts: aws_sdk_sts::Client,
    token_file: PathBuf,
    role_arn: String,
    session_name: String,
}

impl WebIdentity {
    async fn fetch(&self) -> aws_credential_types::provider::Result {
        let token = std::fs::read_to_string(&self.token_file).map_err(|e| {
            CredentialsError::provider_error(format!(
                "web identity token {}: {e}",
                self.token_file.display()
            ))
        })?;
        let out = self
            .sts
            .assume_role_with_web_identity()
            .role_arn(&self.role_arn)
            .role_session_name(&self.session_name)
            .web_identity_token(token.trim())
            .send()
            .await
            .map_err(|e| {
                use std::error::Error as _;
                let mut msg = format!("AssumeRoleWithWebIdentity {}: {e}", self.role_arn);
                let mut src = e.source();
                while let Some(s) = src {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    src = s.source();
                }
                CredentialsError::provider_error(msg)
            })?;
        let c = out.credentials.ok_or_else(|| {
            CredentialsError::provider_error("AssumeRoleWithWebIdentity answered no credentials")
        })?;
        let expiry = SystemTime::try_from(c.expiration).ok();
        Ok(Credentials::new(
            c.access_key_id,
            c.secret_access_key,
            Some(c.session_token),
            expiry,
            "WebIdentityToken",
        ))
    }
}

impl ProvideCredentials for WebIdentity {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::new(self.fetch())
    }
}

/// The end of an empty chain.
#[derive(Debug)]
struct NoCredentials;

impl ProvideCredentials for NoCredentials {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            CredentialsError::not_loaded("no credential provider is configured"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::AwsRuntime;

    fn profile(dir: &std::path::Path, key: &str) {
        // Written to a temp file and renamed over, as rotation tools do.
        let tmp = dir.join("credentials.tmp");
        std::fs::write(
            &tmp,
            format!("[ccm]\naws_access_key_id = {key}\naws_secret_access_key = secret-{key}\n"),
        )
        .unwrap();
        std::fs::rename(&tmp, dir.join("credentials")).unwrap();
    }

    #[test]
    fn rotated_keys_on_disk_are_read_again() {
        if std::env::var_os("AWS_ACCESS_KEY_ID").is_some() {
            // The environment comes first in the chain; this test needs the profile file.
            return;
        }
        let rt = AwsRuntime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        profile(dir.path(), "AKIDFIRST");
        let settings = CredentialSettings {
            region: Some("us-east-1".into()),
            credentials_file: Some(dir.path().join("credentials")),
            profile: Some("ccm".into()),
            ..Default::default()
        };
        let http = crate::api::sdk_http_client();
        let src = std::sync::Arc::new(CredentialSource::new(settings, http));
        let timeout = Duration::from_secs(20);
        let get = || {
            let src = src.clone();
            rt.run_for(timeout, async move { src.get().await }).unwrap()
        };
        let c = get();
        assert_eq!(c.access_key_id(), "AKIDFIRST");
        // Cached while unchanged.
        let c = get();
        assert_eq!(c.access_key_id(), "AKIDFIRST");
        // Same length, new content: the mtime changes (sleep past coarse timestamps).
        std::thread::sleep(Duration::from_millis(20));
        profile(dir.path(), "AKIDSECND");
        let c = get();
        assert_eq!(c.access_key_id(), "AKIDSECND");
    }
}
