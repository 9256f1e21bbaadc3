//! The region and credential chains as on EC2, through the host's real loader: a cloud config
//! without `Region`/`Zone`, the region from `AWS_REGION`, `AWS_DEFAULT_REGION`, a profile, a
//! stand-in IMDSv2 on 127.0.0.1 (`AWS_EC2_METADATA_SERVICE_ENDPOINT`), and one error line when
//! nothing answers; credentials from the stand-in's instance role and from web identity
//! (AssumeRoleWithWebIdentity, served by moto), checked by moto with IAM enforcement.
//!
//! The chains read the process environment, and the plugin links its own copy of std (its own
//! environment lock), so changing the environment of a running test process is unsafe. Each
//! case runs in a child process of this test binary ([`child_probe`], ignored when run
//! directly) started with exactly the environment the case needs; moto and the IMDS stand-in
//! run in the parent.

mod support;

use std::path::Path;
use std::process::Command;

use ccm_host::plugin::{LoaderOptions, PluginRegistry};
use ccm_host::provider::ProviderOptions;
use support::*;

/// What one child reported.
#[derive(Debug)]
enum Outcome {
    /// The provider loaded and its health probe (one DescribeAvailabilityZones) passed.
    Healthy,
    /// It loaded; the probe failed with this kind and message.
    Unhealthy(String, #[allow(dead_code)] String),
    /// It did not load.
    LoadError(String),
}

/// Run [`child_probe`] with `config` and exactly the environment `vars` (plus `HOME`, an
/// empty directory, and `PATH`).
fn probe(dir: &Path, config: &str, vars: &[(&str, String)]) -> Outcome {
    let config_path = dir.join("cloud.conf");
    std::fs::write(&config_path, config).unwrap();
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--ignored",
        "--exact",
        "child_probe",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap_or_default())
    .env("HOME", &home)
    .env("CHAIN_CONFIG", &config_path)
    .env("CHAIN_DIR", dir);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.find("CHAIN-").map(|i| &l[i..]))
        .unwrap_or_else(|| {
            panic!(
                "child reported nothing (status {}):\n{stdout}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(out.status.success(), "child failed: {stdout}");
    if line == "CHAIN-HEALTHY" {
        Outcome::Healthy
    } else if let Some(rest) = line.strip_prefix("CHAIN-UNHEALTHY ") {
        let (kind, msg) = rest.split_once(' ').unwrap_or((rest, ""));
        Outcome::Unhealthy(kind.into(), msg.into())
    } else {
        Outcome::LoadError(line.trim_start_matches("CHAIN-LOAD-ERROR ").into())
    }
}

/// The child: load the provider from `$CHAIN_CONFIG` with the host's loader, probe its health,
/// print one `CHAIN-…` line. Run only by [`probe`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the chain tests"]
async fn child_probe() {
    let config = std::fs::read_to_string(std::env::var("CHAIN_CONFIG").unwrap()).unwrap();
    let dir = std::path::PathBuf::from(std::env::var("CHAIN_DIR").unwrap());
    let plugins = dir.join("plugins");
    let _ = std::fs::create_dir(&plugins);
    std::fs::copy(built_plugin(), plugins.join("libccm_provider_aws.so")).unwrap();
    let registry =
        PluginRegistry::load_dirs(&[plugins], &LoaderOptions::default()).expect("plugin dir loads");
    let line = match registry.create("aws", Some(config.as_bytes()), &ProviderOptions::default()) {
        Err(e) => format!("CHAIN-LOAD-ERROR {}", e.to_string().replace('\n', "\\n")),
        Ok(p) => match p.health().await {
            Ok(()) => "CHAIN-HEALTHY".to_string(),
            Err(e) => format!(
                "CHAIN-UNHEALTHY {:?} {}",
                e.kind(),
                e.message().replace('\n', "\\n")
            ),
        },
    };
    println!("{line}");
}

/// A cloud config without `Region`/`Zone`: EC2 of `region` goes to `url`, EC2 of the other
/// regions these tests use goes to a closed port of 127.0.0.1 (a wrong region fails, and no
/// request leaves the machine).
fn config_without_region(region: &str, url: &str, global: &str) -> String {
    let mut c = format!("[Global]\nKubernetesClusterID = {CLUSTER}\n{global}\n");
    for (i, r) in ["eu-west-1", "ap-south-1", "us-west-2", "us-east-1"]
        .iter()
        .enumerate()
    {
        let target = if *r == region {
            url
        } else {
            "http://127.0.0.1:9"
        };
        c.push_str(&format!(
            "\n[ServiceOverride \"{i}\"]\nService = ec2\nRegion = {r}\nURL = {target}\nSigningRegion = {r}\n"
        ));
    }
    c
}

fn healthy(o: Outcome, what: &str) {
    assert!(matches!(o, Outcome::Healthy), "{what}: {o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_region_in_the_config_it_comes_from_the_environment_a_profile_or_imds() {
    let moto = shared_moto();
    let url = moto.moto.url();
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    write_credentials(&creds, ACCESS_KEY, SECRET_KEY);
    let global = format!("SharedCredentialsFile = {}\nProfile = ccm", creds.display());
    let d = dir.path().to_path_buf();
    let run = move |region: &str, global: String, vars: Vec<(&'static str, String)>| {
        let (d, config) = (d.clone(), config_without_region(region, &url, &global));
        tokio::task::spawn_blocking(move || probe(&d, &config, &vars))
    };

    // 1. AWS_REGION, then AWS_DEFAULT_REGION.
    let o = run(
        "eu-west-1",
        global.clone(),
        vec![("AWS_REGION", "eu-west-1".into())],
    );
    healthy(o.await.unwrap(), "region from AWS_REGION");
    let o = run(
        "us-west-2",
        global.clone(),
        vec![("AWS_DEFAULT_REGION", "us-west-2".into())],
    );
    healthy(o.await.unwrap(), "region from AWS_DEFAULT_REGION");

    // 2. The profile of the shared config file (SharedConfigFile + Profile).
    let config_file = dir.path().join("config");
    std::fs::write(&config_file, "[profile ccm]\nregion = ap-south-1\n").unwrap();
    let with_config = format!("{global}\nSharedConfigFile = {}", config_file.display());
    let o = run("ap-south-1", with_config, vec![]);
    healthy(o.await.unwrap(), "region from the profile");

    // 3. IMDSv2 (stand-in): a session token first, then the region with it.
    let imds = ImdsStandIn::start("us-west-2").await;
    let o = run(
        "us-west-2",
        global.clone(),
        vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url())],
    );
    healthy(o.await.unwrap(), "region from IMDS");
    let seen = imds.seen();
    assert_eq!(
        seen.first().map(String::as_str),
        Some("PUT /latest/api/token"),
        "{seen:?}"
    );
    assert!(
        seen.contains(&"GET /latest/meta-data/placement/region".to_string()),
        "{seen:?}"
    );
    assert_eq!(
        imds.state
            .without_token
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "every metadata read carried the session token"
    );

    // Nothing answers: one line naming every place looked at; no panic in the plugin.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let started = std::time::Instant::now();
    let o = run(
        "us-west-2",
        global.clone(),
        vec![(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            format!("http://{closed}"),
        )],
    )
    .await
    .unwrap();
    let Outcome::LoadError(e) = o else {
        panic!("no region anywhere must fail the factory: {o:?}");
    };
    assert!(
        started.elapsed() < std::time::Duration::from_secs(14),
        "{:?}",
        started.elapsed()
    );
    assert!(!e.contains("\\n"), "one line: {e}");
    for part in [
        "no region",
        "Region and Zone",
        "AWS_REGION",
        "profile \"ccm\"",
        &format!("IMDSv2 at http://{closed}"),
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
    assert!(!e.to_lowercase().contains("panic"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_come_from_the_instance_role_and_from_web_identity() {
    let (moto, key, secret) = moto_with_iam_and_role(true).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let run = move |config: String, vars: Vec<(&'static str, String)>| {
        let d = d.clone();
        tokio::task::spawn_blocking(move || probe(&d, &config, &vars))
    };

    // The instance role from the stand-in IMDS (region from it as well): temporary
    // credentials of the role, as EC2 serves them, which moto checks.
    let sts = ccm_provider_aws::api::Endpoint {
        service: "sts",
        version: "2011-06-15",
        url: moto.url(),
        signing_region: REGION.into(),
        signing_name: "sts".into(),
    };
    let mut p = ccm_provider_aws::api::Params::new();
    p.set("RoleArn", WEB_IDENTITY_ROLE)
        .set("RoleSessionName", "i-0123456789abcdef0");
    let session = client_for(&moto.url(), &key, &secret)
        .call(&sts, "AssumeRole", &p)
        .await
        .expect("AssumeRole for the instance role");
    let imds = ImdsStandIn::start(REGION).await;
    imds.set_role_session(
        "ccm-node-role",
        &first(&session, "AccessKeyId"),
        &first(&session, "SecretAccessKey"),
        &first(&session, "SessionToken"),
    );
    let endpoint = vec![("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url())];
    let o = run(
        config_without_region(REGION, &moto.url(), ""),
        endpoint.clone(),
    );
    healthy(o.await.unwrap(), "moto accepts the instance role's key");
    let seen = imds.seen();
    assert!(
        seen.contains(&"GET /latest/meta-data/iam/security-credentials/ccm-node-role".to_string()),
        "{seen:?}"
    );
    // A role key moto does not know: unauthorized (so the key above came from IMDS).
    imds.set_role_session("ccm-node-role", "ASIAUNKNOWNKEY000000", "nope", "nope");
    let o = run(config_without_region(REGION, &moto.url(), ""), endpoint)
        .await
        .unwrap();
    assert!(
        matches!(&o, Outcome::Unhealthy(kind, _) if kind.contains("UNAUTHORIZED") || kind.contains("unauthorized")),
        "{o:?}"
    );
    drop(imds);

    // No credentials anywhere (IMDS at a closed port): one line naming what was checked; no
    // panic.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let o = run(
        config_without_region(REGION, &moto.url(), &format!("Region = {REGION}")),
        vec![(
            "AWS_EC2_METADATA_SERVICE_ENDPOINT",
            format!("http://{closed}"),
        )],
    )
    .await
    .unwrap();
    let Outcome::Unhealthy(kind, msg) = &o else {
        panic!("no credentials must fail the calls: {o:?}");
    };
    assert!(
        kind.contains("unauthorized") || kind.contains("UNAUTHORIZED"),
        "{o:?}"
    );
    assert!(
        !msg.contains("\\n") && !msg.to_lowercase().contains("panic"),
        "{msg}"
    );
    assert!(
        msg.contains("environment") && msg.contains("IMDSv2"),
        "names what was checked: {msg}"
    );

    // Web identity (IRSA): AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN, STS at moto through
    // the counting proxy. IMDS is off so nothing else can answer. moto 5.2.5 with IAM
    // enforcement fails unsigned calls (AssumeRoleWithWebIdentity is one) with HTTP 500, so
    // this part runs on a moto without enforcement: the proxy shows which key signed the EC2
    // call.
    drop(moto);
    let moto = shared_moto();
    let proxy = Proxy::start(moto.moto.addr).await;
    let token = dir.path().join("token");
    std::fs::write(&token, "eyJhbGciOiJSUzI1NiJ9.e30.c2ln").unwrap();
    let config = format!(
        "[Global]\nKubernetesClusterID = {CLUSTER}\nRegion = {REGION}\n\n[ServiceOverride \"sts\"]\nService = sts\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\n\n[ServiceOverride \"ec2\"]\nService = ec2\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\n",
        url = proxy.url()
    );
    let o = run(
        config,
        vec![
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token.display().to_string()),
            ("AWS_ROLE_ARN", WEB_IDENTITY_ROLE.into()),
        ],
    );
    healthy(
        o.await.unwrap(),
        "moto accepts the web identity role's session",
    );
    let counts = proxy.counts();
    assert_eq!(proxy.count("AssumeRoleWithWebIdentity"), 1, "{counts:?}");
    assert_eq!(proxy.count("DescribeAvailabilityZones"), 1, "{counts:?}");
    // moto's session keys start with ASIA; the EC2 call was signed with one, and nothing else.
    let keys: Vec<&String> = counts.keys().filter(|k| k.starts_with('@')).collect();
    assert_eq!(keys.len(), 1, "{counts:?}");
    assert!(keys[0].starts_with("@ASIA"), "{counts:?}");
}
