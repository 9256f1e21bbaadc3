//! `ccm-host new-provider NAME --path DIR`: writes a provider plugin crate that stands on its
//! own, anywhere: `Cargo.toml` (the SDK's sources written into `sdk/` beside it, or a registry
//! version with `--sdk-version`), `src/lib.rs` with the
//! chosen capabilities over an in-memory cloud described by its config, a sample
//! `cloud-config.json`, tests that run without the host, a Dockerfile layering the `.so` onto
//! the ccm-host image, and a CI script that runs `ccm-host check`. Out of the box it builds and
//! passes `ccm-host check --cloud-config DIR/cloud-config.json`.
//!
//! The SDK is copied into the crate (`sdk/`, a relative path dependency) rather than named by an
//! absolute path or a registry version: ccm-provider-abi is not on a registry yet, and a path of
//! the machine that ran `new-provider` breaks the crate for anyone who clones it and the
//! Dockerfile's build (its context holds only the crate). The sources are this host's own SDK
//! (built into the binary), or those at `--sdk-path`.
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
    /// Copy the SDK (ccm-provider-abi) from this path into the crate's sdk/ (a checkout of
    /// ccm-host's provider-abi/, or a copy of it) [default: the SDK this host was built with].
    #[arg(long, value_name = "PATH", conflicts_with = "sdk_version")]
    pub sdk_path: Option<PathBuf>,
    /// Depend on this version of ccm-provider-abi from a registry instead of copying the SDK
    /// into the crate (once the SDK is published there).
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

/// The SDK this host was built with: the files of the ccm-provider-abi package (its
/// `Cargo.toml` `include`), written into a new crate's `sdk/`. A unit test keeps the list
/// equal to provider-abi/src.
const SDK_FILES: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../provider-abi/Cargo.toml"),
    ),
    ("README.md", include_str!("../../../provider-abi/README.md")),
    (
        "src/abi.rs",
        include_str!("../../../provider-abi/src/abi.rs"),
    ),
    (
        "src/context.rs",
        include_str!("../../../provider-abi/src/context.rs"),
    ),
    (
        "src/error.rs",
        include_str!("../../../provider-abi/src/error.rs"),
    ),
    (
        "src/ext.rs",
        include_str!("../../../provider-abi/src/ext.rs"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../provider-abi/src/lib.rs"),
    ),
    (
        "src/sdk.rs",
        include_str!("../../../provider-abi/src/sdk.rs"),
    ),
    (
        "src/types.rs",
        include_str!("../../../provider-abi/src/types.rs"),
    ),
];

/// Where the new crate's SDK comes from.
#[derive(Debug)]
enum Sdk {
    /// Files written into `sdk/` (relative path, content).
    Copied(Vec<(String, String)>),
    /// A registry version requirement.
    Registry(String),
}

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

/// The SDK of the new crate: copied from `--sdk-path` or from this host, or a registry version.
fn sdk_dependency(args: &NewProviderArgs) -> Result<Sdk, String> {
    let (host_major, host_minor) =
        major_minor(ccm_provider_abi::ABI_VERSION).expect("own version parses");
    if let Some(path) = &args.sdk_path {
        let manifest = std::fs::read_to_string(path.join("Cargo.toml")).map_err(|e| {
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
        return sdk_files_at(path).map(Sdk::Copied);
    }
    let Some(version) = args.sdk_version.clone() else {
        let files = SDK_FILES
            .iter()
            .map(|(rel, content)| (rel.to_string(), content.to_string()))
            .collect();
        return Ok(Sdk::Copied(files));
    };
    match major_minor(&version) {
        Some((major, _)) if major == host_major => Ok(Sdk::Registry(version)),
        Some(_) => Err(format!(
            "--sdk-version {version}: this host loads ccm-provider-abi {host_major}.x plugins"
        )),
        None => Err(format!(
            "--sdk-version {version:?}: not a version (e.g. {host_major}.{host_minor})"
        )),
    }
}

/// The package files of the SDK at `dir`: `Cargo.toml`, `README.md` if present, and every
/// file below `src/`.
fn sdk_files_at(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let read = |rel: &str| {
        std::fs::read_to_string(dir.join(rel))
            .map_err(|e| format!("--sdk-path {}: cannot read {rel}: {e}", dir.display()))
    };
    let mut files = vec![("Cargo.toml".to_string(), read("Cargo.toml")?)];
    if dir.join("README.md").is_file() {
        files.push(("README.md".to_string(), read("README.md")?));
    }
    let mut pending = vec![PathBuf::from("src")];
    while let Some(rel_dir) = pending.pop() {
        let entries = std::fs::read_dir(dir.join(&rel_dir)).map_err(|e| {
            format!(
                "--sdk-path {}: cannot read {}: {e}",
                dir.display(),
                rel_dir.display()
            )
        })?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("--sdk-path {}: {e}", dir.display()))?;
            let rel = rel_dir.join(entry.file_name());
            if entry.path().is_dir() {
                pending.push(rel);
            } else {
                let rel = rel.display().to_string();
                let content = read(&rel)?;
                files.push((rel, content));
            }
        }
    }
    files.sort();
    Ok(files)
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
fn files(name: &str, caps: &BTreeSet<Capability>, sdk: &Sdk) -> Vec<(String, String, bool)> {
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
    let dependency = match sdk {
        Sdk::Copied(_) => {
            flags.insert("sdk_copied");
            format!(
                "{{ path = \"sdk\", version = {} }}",
                toml_string(ccm_provider_abi::ABI_VERSION)
            )
        }
        Sdk::Registry(version) => toml_string(version),
    };
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
        ("sdk", dependency),
        ("sdk_version", ccm_provider_abi::ABI_VERSION.to_string()),
        ("host_version", env!("CARGO_PKG_VERSION").to_string()),
        ("capabilities", capabilities.join(", ")),
        ("with_flag", with_flag),
    ];
    let r = |t: &str| render(t, &vars, &flags);
    let mut files: Vec<(String, String, bool)> = [
        ("Cargo.toml", r(CARGO_TOML), false),
        ("src/lib.rs", r(LIB), false),
        ("tests/provider.rs", r(TEST), false),
        ("cloud-config.json", sample_config(caps), false),
        ("Dockerfile", r(DOCKERFILE), false),
        ("ci/check.sh", r(CHECK_SH), true),
        ("README.md", r(README), false),
        (".gitignore", r(GITIGNORE), false),
        // The Dockerfile's build context is the crate: never send target/ with it.
        (".dockerignore", "target/\n".to_string(), false),
    ]
    .into_iter()
    .map(|(rel, content, executable)| (rel.to_string(), content, executable))
    .collect();
    if let Sdk::Copied(sdk_files) = sdk {
        files.extend(
            sdk_files
                .iter()
                .map(|(rel, content)| (format!("sdk/{rel}"), content.clone(), false)),
        );
    }
    files
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
    let sdk = match sdk_dependency(args) {
        Ok(s) => s,
        Err(e) => return usage(e),
    };
    let caps: BTreeSet<Capability> = args.with.iter().copied().collect();
    let files = files(&args.name, &caps, &sdk);
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
    for (rel, _, _) in files.iter().filter(|(rel, _, _)| !rel.starts_with("sdk/")) {
        println!("  {rel}");
    }
    if let Sdk::Copied(sdk_files) = &sdk {
        println!(
            "  sdk/ (ccm-provider-abi {}, {} files)",
            ccm_provider_abi::ABI_VERSION,
            sdk_files.len()
        );
    }
    println!(
        "next:\n  cd {dir} && cargo build && cargo test\n  mkdir -p -m 0755 /tmp/plugins && cp {dir}/target/debug/{lib} /tmp/plugins/\n  ccm-host check --plugin-dir /tmp/plugins --cloud-provider {name} --cloud-config {dir}/cloud-config.json",
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
            for (rel, content, _) in files("acme", &caps, &Sdk::Registry("1.1".into())) {
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
    fn the_embedded_sdk_is_every_file_of_provider_abi_src() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../provider-abi/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(src)
            .unwrap()
            .map(|e| format!("src/{}", e.unwrap().file_name().to_string_lossy()))
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = SDK_FILES
            .iter()
            .filter(|(rel, _)| rel.starts_with("src/"))
            .map(|(rel, _)| rel.to_string())
            .collect();
        assert_eq!(
            embedded, on_disk,
            "SDK_FILES must list every file of provider-abi/src"
        );
    }

    #[test]
    fn the_crate_depends_on_its_copy_of_the_sdk_by_a_relative_path() {
        let sdk = Sdk::Copied(vec![("Cargo.toml".into(), "[package]".into())]);
        let copied = files("acme", &BTreeSet::new(), &sdk);
        let manifest = &copied
            .iter()
            .find(|(rel, _, _)| rel == "Cargo.toml")
            .unwrap()
            .1;
        assert!(
            manifest.contains(&format!(
                "ccm-provider-abi = {{ path = \"sdk\", version = \"{}\" }}",
                ccm_provider_abi::ABI_VERSION
            )),
            "{manifest}"
        );
        assert!(copied.iter().any(|(rel, _, _)| rel == "sdk/Cargo.toml"));
        let registry = files("acme", &BTreeSet::new(), &Sdk::Registry("1.1".into()));
        assert!(registry.iter().all(|(rel, _, _)| !rel.starts_with("sdk/")));
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
        let Sdk::Copied(own) = sdk_dependency(&args(None)).unwrap() else {
            panic!("without --sdk-version the host's SDK is copied");
        };
        assert_eq!(own.len(), SDK_FILES.len());
        let Sdk::Registry(version) = sdk_dependency(&args(Some("1.0"))).unwrap() else {
            panic!("--sdk-version names a registry version");
        };
        assert_eq!(version, "1.0");
        assert!(sdk_dependency(&args(Some("2.0")))
            .unwrap_err()
            .contains("this host loads ccm-provider-abi 1.x"));
        assert!(sdk_dependency(&args(Some("soon"))).is_err());
    }
}
