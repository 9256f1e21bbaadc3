//! `ccm-host new-provider NAME --path DIR`: writes a provider plugin crate that stands on its
//! own, anywhere: `Cargo.toml` (the SDK by path or by registry version), `src/lib.rs` with the
//! chosen capabilities over an in-memory cloud described by its config, a sample
//! `cloud-config.json`, tests that run without the host, a Dockerfile layering the `.so` onto
//! the ccm-host image, and a CI script that runs `ccm-host check`. Out of the box it builds and
//! passes `ccm-host check --cloud-config DIR/cloud-config.json`.
//!
//! The files come from the templates in `templates/`: `{{var}}` placeholders, and lines between
//! `@@if FLAG` (or `@@if !FLAG`) and `@@end` kept only when the flag is set (or not).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

/// Exit code of a usage error (bad name, directory not empty, SDK not found).
pub const EXIT_USAGE: i32 = 2;

/// An optional capability of the scaffolded provider (InstancesV2 is always there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Capability {
    /// `LoadBalancer`: load balancers with addresses from the config, and the host read-back.
    Loadbalancer,
    /// `Routes`: pod-network routes.
    Routes,
    /// Zones and regions: instances report them (the topology labels of the Nodes).
    Zones,
}

impl Capability {
    fn flag(self) -> &'static str {
        match self {
            Self::Loadbalancer => "loadbalancer",
            Self::Routes => "routes",
            Self::Zones => "zones",
        }
    }
}

/// `ccm-host new-provider` arguments.
#[derive(Debug, Args)]
pub struct NewProviderArgs {
    /// The provider's name: the value of --cloud-provider and the scheme of its provider IDs
    /// (lowercase letters, digits and '-', starting with a letter).
    #[arg(value_name = "NAME")]
    pub name: String,
    /// Where to write the crate: a directory that does not exist yet, or is empty.
    #[arg(long, value_name = "DIR")]
    pub path: PathBuf,
    /// Use the SDK (ccm-provider-abi) at this path: a checkout of ccm-host's provider-abi/, or a
    /// copy of it.
    #[arg(long, value_name = "PATH", conflicts_with = "sdk_version")]
    pub sdk_path: Option<PathBuf>,
    /// Use this version of ccm-provider-abi from the registry [default: the ABI version of this
    /// host, e.g. 1.1].
    #[arg(long, value_name = "VERSION")]
    pub sdk_version: Option<String>,
    /// Capabilities beyond InstancesV2, comma-separated: loadbalancer, routes, zones.
    #[arg(long, value_name = "CAPABILITY,...", value_delimiter = ',')]
    pub with: Vec<Capability>,
}

const LIB: &str = include_str!("templates/lib.rs.tmpl");
const TEST: &str = include_str!("templates/provider_test.rs.tmpl");
const CARGO_TOML: &str = include_str!("templates/Cargo.toml.tmpl");
const DOCKERFILE: &str = include_str!("templates/Dockerfile.tmpl");
const CHECK_SH: &str = include_str!("templates/check.sh.tmpl");
const README: &str = include_str!("templates/README.md.tmpl");
const GITIGNORE: &str = include_str!("templates/gitignore.tmpl");

/// A provider name: a URL scheme made of lowercase letters, digits and '-', starting with a
/// letter (it is also a crate name and a label value).
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 40
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "provider name {name:?}: use lowercase letters, digits and '-', starting with a letter, at most 40 characters (it is the scheme of provider IDs: {name}://<id>)"
        ))
    }
}

/// `acme-cloud` -> `AcmeCloud`.
fn camel_case(name: &str) -> String {
    name.split('-')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// `(major, minor)` of a version string.
fn major_minor(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.trim().trim_start_matches(['=', '^', '~']).split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().map_or(Some(0), |m| m.parse().ok())?;
    Some((major, minor))
}

/// The `ccm-provider-abi = ...` dependency, and the SDK path when it is one.
fn sdk_dependency(args: &NewProviderArgs) -> Result<(String, Option<PathBuf>), String> {
    let (host_major, host_minor) =
        major_minor(ccm_provider_abi::ABI_VERSION).expect("own version parses");
    if let Some(path) = &args.sdk_path {
        let dir = std::fs::canonicalize(path)
            .map_err(|e| format!("--sdk-path {}: {e}", path.display()))?;
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).map_err(|e| {
            format!(
                "--sdk-path {}: no Cargo.toml there ({e}); point it at ccm-host's provider-abi/",
                path.display()
            )
        })?;
        let field = |key: &str| {
            manifest.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
            })
        };
        if field("name").as_deref() != Some("ccm-provider-abi") {
            return Err(format!(
                "--sdk-path {}: its Cargo.toml is not the ccm-provider-abi package",
                path.display()
            ));
        }
        let inherits = manifest
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .any(|l| l.contains("workspace = true"));
        if inherits {
            return Err(format!(
                "--sdk-path {}: this ccm-provider-abi inherits settings from its workspace, so it cannot be used outside it; use the provider-abi/ of ccm-host {} or newer",
                path.display(),
                env!("CARGO_PKG_VERSION")
            ));
        }
        match field("version").as_deref().and_then(major_minor) {
            Some((major, _)) if major == host_major => {}
            other => {
                return Err(format!(
                "--sdk-path {}: ccm-provider-abi {} there; this host loads {host_major}.x plugins",
                path.display(),
                other.map_or("of unknown version".to_string(), |(a, b)| format!(
                    "{a}.{b}"
                ))
            ))
            }
        }
        let shown = dir.display().to_string();
        return Ok((format!("{{ path = {} }}", toml_string(&shown)), Some(dir)));
    }
    let version = args
        .sdk_version
        .clone()
        .unwrap_or_else(|| format!("{host_major}.{host_minor}"));
    match major_minor(&version) {
        Some((major, _)) if major == host_major => Ok((toml_string(&version), None)),
        Some(_) => Err(format!(
            "--sdk-version {version}: this host loads ccm-provider-abi {host_major}.x plugins"
        )),
        None => Err(format!(
            "--sdk-version {version:?}: not a version (e.g. {host_major}.{host_minor})"
        )),
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Render a template: conditional lines by `flags`, then `{{var}}` placeholders.
pub fn render(template: &str, vars: &[(&str, String)], flags: &BTreeSet<&str>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut stack: Vec<bool> = Vec::new();
    for line in template.lines() {
        let trimmed = line.trim();
        if let Some(cond) = trimmed.strip_prefix("@@if ") {
            let cond = cond.trim();
            let on = match cond.strip_prefix('!') {
                Some(flag) => !flags.contains(flag),
                None => flags.contains(cond),
            };
            stack.push(on);
            continue;
        }
        if trimmed == "@@end" {
            stack.pop();
            continue;
        }
        if stack.iter().all(|on| *on) {
            out.push_str(line);
            out.push('\n');
        }
    }
    for (name, value) in vars {
        out = out.replace(&format!("{{{{{name}}}}}"), value);
    }
    out
}

/// The sample cloud config: the nodes `ccm-host check` seeds by default, a stopped instance,
/// and (with load balancers) addresses for them.
fn sample_config(caps: &BTreeSet<Capability>) -> String {
    let zones = caps.contains(&Capability::Zones);
    let mut out = String::from("{\n");
    if zones {
        out.push_str("  \"region\": \"region-1\",\n");
    }
    out.push_str("  \"credentialsFile\": null,\n  \"instances\": [\n");
    let instances = [
        ("ccm-check-1", "i-0001", "10.0.0.1", "zone-a", false),
        ("ccm-check-2", "i-0002", "10.0.0.2", "zone-a", false),
        ("ccm-check-3", "i-0003", "10.0.0.3", "zone-b", false),
        ("ccm-check-stopped", "i-0004", "10.0.0.4", "zone-b", true),
    ];
    let lines: Vec<String> = instances
        .iter()
        .map(|(name, id, ip, zone, stopped)| {
            let mut line = format!(
                "    {{\"name\": \"{name}\", \"id\": \"{id}\", \"internalIP\": \"{ip}\", \"type\": \"standard-2\""
            );
            if zones {
                line.push_str(&format!(", \"zone\": \"{zone}\""));
            }
            if *stopped {
                line.push_str(", \"stopped\": true");
            }
            line.push('}');
            line
        })
        .collect();
    out.push_str(&lines.join(",\n"));
    out.push_str("\n  ]");
    if caps.contains(&Capability::Loadbalancer) {
        let addresses: Vec<String> = (10..20).map(|n| format!("\"192.0.2.{n}\"")).collect();
        out.push_str(&format!(
            ",\n  \"loadBalancerAddresses\": [{}]",
            addresses.join(", ")
        ));
    }
    out.push_str("\n}\n");
    out
}

/// The crate's files: path relative to the crate root, content, executable.
pub fn files(
    name: &str,
    caps: &BTreeSet<Capability>,
    sdk: &str,
    sdk_path: Option<&Path>,
) -> Vec<(&'static str, String, bool)> {
    let crate_name = format!("ccm-provider-{name}");
    let lib = crate_name.replace('-', "_");
    let mut capabilities = vec!["InstancesV2"];
    let mut flags: BTreeSet<&str> = caps.iter().map(|c| c.flag()).collect();
    if caps.contains(&Capability::Loadbalancer) {
        capabilities.push("LoadBalancer (with the host read-back)");
    }
    if caps.contains(&Capability::Routes) {
        capabilities.push("Routes");
    }
    if caps.contains(&Capability::Zones) {
        capabilities.push("zones and regions");
    }
    if sdk_path.is_some() {
        flags.insert("sdk_path");
    }
    let with_flag = if caps.is_empty() {
        String::new()
    } else {
        format!(
            " --with {}",
            caps.iter().map(|c| c.flag()).collect::<Vec<_>>().join(",")
        )
    };
    let vars = [
        ("name", name.to_string()),
        ("Name", format!("{}Cloud", camel_case(name))),
        ("crate", crate_name.clone()),
        ("lib", lib),
        ("sdk", sdk.to_string()),
        (
            "sdk_path",
            sdk_path
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        ),
        ("host_version", env!("CARGO_PKG_VERSION").to_string()),
        ("capabilities", capabilities.join(", ")),
        ("with_flag", with_flag),
    ];
    let r = |t: &str| render(t, &vars, &flags);
    vec![
        ("Cargo.toml", r(CARGO_TOML), false),
        ("src/lib.rs", r(LIB), false),
        ("tests/provider.rs", r(TEST), false),
        ("cloud-config.json", sample_config(caps), false),
        ("Dockerfile", r(DOCKERFILE), false),
        ("ci/check.sh", r(CHECK_SH), true),
        ("README.md", r(README), false),
        (".gitignore", r(GITIGNORE), false),
    ]
}

fn usage(e: impl std::fmt::Display) -> anyhow::Result<i32> {
    eprintln!("error: {e}");
    Ok(EXIT_USAGE)
}

/// Entry point of `ccm-host new-provider`: returns the process exit code.
pub fn main(args: &NewProviderArgs) -> anyhow::Result<i32> {
    if let Err(e) = validate_name(&args.name) {
        return usage(e);
    }
    let dir = &args.path;
    if let Ok(mut entries) = std::fs::read_dir(dir) {
        if entries.next().is_some() {
            return usage(format!(
                "--path {}: the directory exists and is not empty",
                dir.display()
            ));
        }
    } else if dir.exists() {
        return usage(format!("--path {}: not a directory", dir.display()));
    }
    let (sdk, sdk_path) = match sdk_dependency(args) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let caps: BTreeSet<Capability> = args.with.iter().copied().collect();
    let files = files(&args.name, &caps, &sdk, sdk_path.as_deref());
    for (rel, content, executable) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, content)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        if *executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    let lib = format!("libccm_provider_{}.so", args.name.replace('-', "_"));
    println!(
        "wrote the {} provider crate ccm-provider-{} to {}:",
        args.name,
        args.name,
        dir.display()
    );
    for (rel, _, _) in &files {
        println!("  {rel}");
    }
    println!(
        "next:\n  cd {dir} && cargo build && cargo test\n  mkdir -p /tmp/plugins && cp {dir}/target/debug/{lib} /tmp/plugins/\n  ccm-host check --plugin-dir /tmp/plugins --cloud-provider {name} --cloud-config {dir}/cloud-config.json",
        dir = dir.display(),
        name = args.name,
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_url_schemes_and_crate_names() {
        assert!(validate_name("acme").is_ok());
        assert!(validate_name("acme-cloud2").is_ok());
        for bad in [
            "",
            "Acme",
            "1acme",
            "acme_cloud",
            "acme-",
            "a b",
            &"a".repeat(41),
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(camel_case("acme-cloud2"), "AcmeCloud2");
    }

    #[test]
    fn templates_keep_the_lines_of_the_flags_set() {
        let t = "a {{x}}\n@@if lb\nlb\n@@if !zones\nno zones\n@@end\n@@end\n@@if !lb\nno lb\n@@end\nz\n";
        let vars = [("x", "1".to_string())];
        let on: BTreeSet<&str> = ["lb"].into_iter().collect();
        assert_eq!(render(t, &vars, &on), "a 1\nlb\nno zones\nz\n");
        assert_eq!(render(t, &vars, &BTreeSet::new()), "a 1\nno lb\nz\n");
        let both: BTreeSet<&str> = ["lb", "zones"].into_iter().collect();
        assert_eq!(render(t, &vars, &both), "a 1\nlb\nz\n");
    }

    #[test]
    fn every_placeholder_is_filled_and_every_block_closed() {
        for caps in [
            BTreeSet::new(),
            [
                Capability::Loadbalancer,
                Capability::Routes,
                Capability::Zones,
            ]
            .into_iter()
            .collect(),
        ] {
            for (rel, content, _) in files("acme", &caps, "\"1.1\"", None) {
                assert!(!content.contains("{{"), "{rel}: {content}");
                assert!(!content.contains("@@"), "{rel}: {content}");
            }
        }
        for t in [LIB, TEST, CARGO_TOML, DOCKERFILE, CHECK_SH, README] {
            let opened = t.lines().filter(|l| l.trim().starts_with("@@if ")).count();
            let closed = t.lines().filter(|l| l.trim() == "@@end").count();
            assert_eq!(opened, closed);
        }
    }

    #[test]
    fn the_sample_config_is_json_with_the_check_nodes() {
        let all: BTreeSet<Capability> = [Capability::Loadbalancer, Capability::Zones]
            .into_iter()
            .collect();
        let v: serde_json::Value = serde_json::from_str(&sample_config(&all)).unwrap();
        assert_eq!(v["instances"][0]["name"], "ccm-check-1");
        assert_eq!(v["instances"][3]["stopped"], true);
        assert_eq!(v["region"], "region-1");
        assert_eq!(v["loadBalancerAddresses"][0], "192.0.2.10");
        let v: serde_json::Value = serde_json::from_str(&sample_config(&BTreeSet::new())).unwrap();
        assert!(v.get("region").is_none() && v.get("loadBalancerAddresses").is_none());
    }

    #[test]
    fn the_sdk_dependency_by_version() {
        let args = |v: Option<&str>| NewProviderArgs {
            name: "acme".into(),
            path: PathBuf::from("/nonexistent"),
            sdk_path: None,
            sdk_version: v.map(str::to_string),
            with: Vec::new(),
        };
        let (major, minor) = major_minor(ccm_provider_abi::ABI_VERSION).unwrap();
        assert_eq!(
            sdk_dependency(&args(None)).unwrap().0,
            format!("\"{major}.{minor}\"")
        );
        assert_eq!(sdk_dependency(&args(Some("1.0"))).unwrap().0, "\"1.0\"");
        assert!(sdk_dependency(&args(Some("2.0")))
            .unwrap_err()
            .contains("this host loads ccm-provider-abi 1.x"));
        assert!(sdk_dependency(&args(Some("soon"))).is_err());
    }
}
