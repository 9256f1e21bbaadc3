//! The region when the cloud config names none (neither `Region` nor `Zone` in `[Global]`),
//! found as the AWS SDKs and the AWS CCM find it on EC2, in this order:
//!
//! 1. the environment: `AWS_REGION`, then `AWS_DEFAULT_REGION`;
//! 2. the shared config file's profile (`SharedConfigFile` / `AWS_CONFIG_FILE` /
//!    `~/.aws/config`; profile `Profile` / `AWS_PROFILE` / `default`): its `region`;
//! 3. the instance metadata service, IMDSv2 (a session token first, then
//!    `/latest/meta-data/placement/region`), at `AWS_EC2_METADATA_SERVICE_ENDPOINT` or the
//!    link-local address; skipped when `AWS_EC2_METADATA_DISABLED=true`.
//!
//! Each step is the SDK's own provider (aws-config), built with the plugin's HTTPS client: the
//! SDK's default region chain has no HTTP client in this build (the `default-https-client`
//! feature pulls in aws-lc) and panics when it reaches IMDS. When no step answers, the error is
//! one line naming every place looked at and why each gave nothing.
//!
//! Differs from the AWS CCM only in order of sources: the AWS CCM reads the zone from IMDS
//! first and the environment not at all; here a configured environment wins (as in every SDK).

use std::path::PathBuf;
use std::time::Duration;

use aws_config::meta::region::ProvideRegion;
use aws_config::provider_config::ProviderConfig;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_smithy_runtime_api::client::http::SharedHttpClient;

/// Where to look, from the cloud config.
#[derive(Debug, Clone, Default)]
pub struct RegionSources {
    /// `SharedConfigFile`.
    pub config_file: Option<PathBuf>,
    /// `SharedCredentialsFile` (profiles may carry a region there too).
    pub credentials_file: Option<PathBuf>,
    /// `Profile`.
    pub profile: Option<String>,
}

/// IMDS attempts and timeouts: off EC2 nothing answers, and the factory should say so quickly.
const IMDS_ATTEMPTS: u32 = 2;
const IMDS_TIMEOUT: Duration = Duration::from_secs(2);

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The region, or one line naming what was tried.
pub async fn find_region(
    sources: &RegionSources,
    http: SharedHttpClient,
) -> Result<String, String> {
    let mut tried: Vec<String> = vec!["[Global] Region and Zone are not set".into()];

    // 1. Environment.
    for var in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
        if let Some(r) = env_nonempty(var) {
            log::info!("aws: region {r} from {var}");
            return Ok(r);
        }
    }
    tried.push("AWS_REGION and AWS_DEFAULT_REGION are not set".into());

    // 2. Profile.
    let pc = ProviderConfig::without_region().with_http_client(http);
    let profile = sources
        .profile
        .clone()
        .or_else(|| env_nonempty("AWS_PROFILE"))
        .unwrap_or_else(|| "default".into());
    let config_file = sources
        .config_file
        .clone()
        .or_else(|| std::env::var_os("AWS_CONFIG_FILE").map(PathBuf::from))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws/config")));
    let mut files = EnvConfigFiles::builder();
    files = match &sources.credentials_file {
        Some(p) => files.with_file(EnvConfigFileKind::Credentials, p),
        None => files.include_default_credentials_file(true),
    };
    files = match &sources.config_file {
        Some(p) => files.with_file(EnvConfigFileKind::Config, p),
        None => files.include_default_config_file(true),
    };
    let from_profile = aws_config::profile::region::ProfileFileRegionProvider::builder()
        .configure(&pc)
        .profile_name(&profile)
        .profile_files(files.build())
        .build()
        .region()
        .await;
    if let Some(r) = from_profile {
        log::info!("aws: region {r} from profile {profile}");
        return Ok(r.to_string());
    }
    tried.push(format!(
        "profile {profile:?} ({}) has no region",
        config_file
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "no config file".into())
    ));

    // 3. IMDSv2.
    let endpoint = env_nonempty("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or_else(|| "http://169.254.169.254".into());
    if env_nonempty("AWS_EC2_METADATA_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        tried.push("the instance metadata service is disabled (AWS_EC2_METADATA_DISABLED)".into());
        return Err(tried.join("; "));
    }
    let imds = aws_config::imds::Client::builder()
        .configure(&pc)
        .max_attempts(IMDS_ATTEMPTS)
        .connect_timeout(IMDS_TIMEOUT)
        .read_timeout(IMDS_TIMEOUT)
        .build();
    match imds.get("/latest/meta-data/placement/region").await {
        Ok(r) if !r.as_ref().trim().is_empty() => {
            let r = r.as_ref().trim().to_string();
            log::info!("aws: region {r} from the instance metadata service at {endpoint}");
            Ok(r)
        }
        Ok(_) => {
            tried.push(format!(
                "the instance metadata service (IMDSv2 at {endpoint}) answered an empty region"
            ));
            Err(tried.join("; "))
        }
        Err(e) => {
            use std::error::Error as _;
            let mut msg = e.to_string();
            let mut src = e.source();
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            tried.push(format!(
                "the instance metadata service (IMDSv2 at {endpoint}) failed: {}",
                msg.replace('\n', " ")
            ));
            Err(tried.join("; "))
        }
    }
}
