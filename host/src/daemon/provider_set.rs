//! Which providers a run starts, and what each one gets (docs/hybrid-clusters.md): the flags
//! `--cloud-provider`, `--cloud-config`, `--cloud-provider-platforms`, `--load-balancer-class`
//! and `--load-balancer-hosts` read together.
//!
//! With one provider every flag keeps its upstream form (`--cloud-provider X --cloud-config F`);
//! with several (`--cloud-provider aws,metal`) the per-provider values name their provider:
//! `--cloud-config aws=/etc/aws.conf`, `--cloud-provider-platforms metal=metal`,
//! `--load-balancer-class nlb=aws`, `--load-balancer-hosts metal=all`.

use std::path::PathBuf;

/// The error of a missing `--cloud-provider`, with where the names come from.
pub const EMPTY_CLOUD_PROVIDER: &str =
    "--cloud-provider cannot be empty: name the provider to run \
     (`ccm-host plugins --plugin-dir DIR` lists the names the plugins in DIR registered)";

/// The load-balancer hosts handed to a provider's load-balancer calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbHosts {
    /// The nodes the provider owns (the default when ownership is enforced: a cloud load
    /// balancer cannot target another platform's machines).
    Owned,
    /// Every node the upstream host predicates accept, whoever owns it.
    All,
}

/// One provider of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSpec {
    /// Registered name.
    pub name: String,
    /// Its `--cloud-config`.
    pub cloud_config: Option<PathBuf>,
    /// Its `--cloud-provider-platforms` (empty: the platforms the provider declares).
    pub platforms: Vec<String>,
    /// The loadBalancerClasses it serves.
    pub load_balancer_classes: Vec<String>,
    /// Whether it serves Services without a class (the first provider, unless
    /// `--ignore-classless-services`).
    pub classless: bool,
    /// Its `--load-balancer-hosts`.
    pub lb_hosts: LbHosts,
}

/// The providers of a run, in `--cloud-provider` order (the first is the default provider).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderSet {
    /// The providers.
    pub providers: Vec<ProviderSpec>,
    /// Whether each provider's controllers see only the nodes it owns: several providers, or
    /// `--cloud-provider-platforms` given.
    pub ownership_enforced: bool,
}

/// `NAME=VALUE` with `NAME` one of `names`, else `None`.
fn named<'a>(item: &'a str, names: &[String]) -> Option<(&'a str, &'a str)> {
    let (name, value) = item.split_once('=')?;
    names
        .iter()
        .any(|n| n == name.trim())
        .then(|| (name.trim(), value.trim()))
}

impl ProviderSet {
    /// Read the provider flags; every problem is pushed to `errors`.
    pub fn parse(
        cloud_provider: &str,
        cloud_config: &[PathBuf],
        platforms: &[String],
        classes: &[String],
        hosts: &[String],
        ignore_classless: bool,
        errors: &mut Vec<String>,
    ) -> ProviderSet {
        let names: Vec<String> = cloud_provider
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            errors.push(EMPTY_CLOUD_PROVIDER.into());
        }
        for (i, n) in names.iter().enumerate() {
            if names[..i].contains(n) {
                errors.push(format!("--cloud-provider names {n} twice"));
            }
        }
        let several = names.len() > 1;
        let list = names.join(",");
        let mut specs: Vec<ProviderSpec> = names
            .iter()
            .enumerate()
            .map(|(i, name)| ProviderSpec {
                name: name.clone(),
                cloud_config: None,
                platforms: Vec::new(),
                load_balancer_classes: Vec::new(),
                classless: i == 0 && !ignore_classless,
                lb_hosts: LbHosts::Owned,
            })
            .collect();
        // Where a per-provider value goes: `NAME=VALUE`, or the only provider's.
        let target = |flag: &str,
                      item: &str,
                      errors: &mut Vec<String>|
         -> Option<(usize, String)> {
            if let Some((name, value)) = named(item, &names) {
                let i = names.iter().position(|n| n == name)?;
                return Some((i, value.to_string()));
            }
            if several {
                errors.push(format!(
                    "{flag} {item:?}: with several providers ({list}) write NAME=VALUE, NAME one of them"
                ));
                return None;
            }
            (!names.is_empty()).then(|| (0, item.trim().to_string()))
        };

        for path in cloud_config {
            let item = path.to_string_lossy();
            let Some((i, value)) = target("--cloud-config", &item, errors) else {
                continue;
            };
            if value.is_empty() {
                errors.push(format!("--cloud-config {item:?} names no file"));
            } else if specs[i].cloud_config.is_some() {
                errors.push(format!(
                    "--cloud-config is given twice for provider {}",
                    specs[i].name
                ));
            } else {
                // One provider: the value is the path as written (it may hold a '=').
                specs[i].cloud_config = Some(if several || named(&item, &names).is_some() {
                    PathBuf::from(value)
                } else {
                    path.clone()
                });
            }
        }
        for item in platforms {
            if let Some((i, value)) = target("--cloud-provider-platforms", item, errors) {
                if value.is_empty() {
                    errors.push(format!(
                        "--cloud-provider-platforms {item:?} names no platform"
                    ));
                } else {
                    specs[i].platforms.push(value);
                }
            }
        }
        for item in classes {
            // CLASS or CLASS=PROVIDER: a class may itself hold no '=' (it is a label-like name).
            let (class, provider) = match item.split_once('=') {
                Some((c, p)) => (c.trim(), Some(p.trim())),
                None => (item.trim(), None),
            };
            if class.is_empty() {
                errors.push("--load-balancer-class cannot be empty".into());
                continue;
            }
            let index = match provider {
                None => 0,
                Some(p) => match names.iter().position(|n| n == p) {
                    Some(i) => i,
                    None => {
                        errors.push(format!(
                            "--load-balancer-class {item}: {p} is not one of --cloud-provider ({list})"
                        ));
                        continue;
                    }
                },
            };
            if let Some(other) = specs
                .iter()
                .find(|s| s.load_balancer_classes.iter().any(|c| c == class))
            {
                if other.name != names.get(index).cloned().unwrap_or_default() {
                    errors.push(format!(
                        "--load-balancer-class {class} is given to both {} and {}",
                        other.name, names[index]
                    ));
                }
                continue;
            }
            if let Some(spec) = specs.get_mut(index) {
                spec.load_balancer_classes.push(class.to_string());
            }
        }
        for item in hosts {
            if let Some((i, value)) = target("--load-balancer-hosts", item, errors) {
                specs[i].lb_hosts = match value.as_str() {
                    "owned" => LbHosts::Owned,
                    "all" => LbHosts::All,
                    other => {
                        errors.push(format!(
                            "--load-balancer-hosts {item:?}: {other:?} is not \"owned\" or \"all\""
                        ));
                        continue;
                    }
                };
            }
        }
        ProviderSet {
            ownership_enforced: several || !platforms.is_empty(),
            providers: specs,
        }
    }

    /// The default provider (the first).
    pub fn default_provider(&self) -> &ProviderSpec {
        &self.providers[0]
    }

    /// Whether more than one provider runs.
    pub fn several(&self) -> bool {
        self.providers.len() > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(
        provider: &str,
        config: &[&str],
        platforms: &[&str],
        classes: &[&str],
        hosts: &[&str],
    ) -> Result<ProviderSet, Vec<String>> {
        let mut errors = Vec::new();
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let set = ProviderSet::parse(
            provider,
            &config.iter().map(PathBuf::from).collect::<Vec<_>>(),
            &strings(platforms),
            &strings(classes),
            &strings(hosts),
            false,
            &mut errors,
        );
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(errors)
        }
    }

    #[test]
    fn one_provider_keeps_the_upstream_forms() {
        let set = parse("aws", &["/etc/a=b.conf"], &[], &["nlb"], &[]).unwrap();
        assert!(!set.ownership_enforced);
        let aws = set.default_provider();
        assert_eq!(
            aws.cloud_config.as_deref(),
            Some(std::path::Path::new("/etc/a=b.conf"))
        );
        assert_eq!(aws.load_balancer_classes, ["nlb"]);
        assert!(aws.classless);
        // NAME=PATH is also understood for the one provider.
        let set = parse("aws", &["aws=/etc/aws.conf"], &["aws://"], &[], &[]).unwrap();
        assert!(
            set.ownership_enforced,
            "--cloud-provider-platforms enforces ownership"
        );
        assert_eq!(
            set.providers[0].cloud_config.as_deref(),
            Some(std::path::Path::new("/etc/aws.conf"))
        );
        assert_eq!(set.providers[0].platforms, ["aws://"]);
    }

    #[test]
    fn several_providers_name_their_values() {
        let set = parse(
            "aws, metal",
            &["aws=/etc/aws.conf", "metal=/etc/metal.yaml"],
            &["metal=metal", "metal=bm://"],
            &["nlb=aws", "metallb=metal", "shared"],
            &["metal=all"],
        )
        .unwrap();
        assert!(set.ownership_enforced && set.several());
        let (aws, metal) = (&set.providers[0], &set.providers[1]);
        assert_eq!(aws.load_balancer_classes, ["nlb", "shared"]);
        assert_eq!(metal.load_balancer_classes, ["metallb"]);
        assert!(aws.classless && !metal.classless);
        assert_eq!(metal.platforms, ["metal", "bm://"]);
        assert_eq!(
            (aws.lb_hosts, metal.lb_hosts),
            (LbHosts::Owned, LbHosts::All)
        );
        assert_eq!(
            metal.cloud_config.as_deref(),
            Some(std::path::Path::new("/etc/metal.yaml"))
        );
    }

    #[test]
    fn every_mistake_is_one_line() {
        let errors = parse(
            "aws,metal,aws",
            &["/etc/aws.conf", "gcp=/x"],
            &["aws://"],
            &["nlb=gcp", "x=aws", "x=metal", "=aws"],
            &["metal=some"],
        )
        .unwrap_err();
        let expected = [
            "--cloud-provider names aws twice",
            "--cloud-config \"/etc/aws.conf\": with several providers (aws,metal,aws) write NAME=VALUE",
            "--cloud-config \"gcp=/x\": with several providers",
            "--cloud-provider-platforms \"aws://\": with several providers",
            "--load-balancer-class nlb=gcp: gcp is not one of --cloud-provider",
            "--load-balancer-class x is given to both aws and metal",
            "--load-balancer-class cannot be empty",
            "--load-balancer-hosts \"metal=some\": \"some\" is not \"owned\" or \"all\"",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (e, want) in errors.iter().zip(expected) {
            assert!(e.starts_with(want), "{e:?} should start with {want:?}");
        }
        assert_eq!(
            parse(" ", &[], &[], &[], &[]).unwrap_err(),
            [EMPTY_CLOUD_PROVIDER]
        );
    }
}
