//! The result table of `ccm-host check`: one row per check, pass / fail / skip with a reason.

use std::io::Write;

use serde::Serialize;

use ccm_host::provider::Capabilities;

/// Every check of the suite, in the order it runs: `(id, what it verifies)`.
pub const CHECKS: &[(&str, &str)] = &[
    (
        "provider-name",
        "ProviderName() is usable as the scheme of provider IDs",
    ),
    ("initialize", "Initialize succeeds"),
    (
        "node-init",
        "cloud-node-controller initialises every tainted node",
    ),
    ("provider-id", "spec.providerID is <ProviderName>://<id>"),
    (
        "provider-id-stable",
        "the provider ID is the same when a node is initialised again and when looked up by it",
    ),
    (
        "node-addresses",
        "node addresses are valid IPs and host names, with at least one IP",
    ),
    (
        "zone-region",
        "zone and region labels are valid and match what the provider reports",
    ),
    ("instance-exists", "the instances of the check nodes exist"),
    (
        "instance-absent",
        "an unknown provider ID does not exist (false, no error)",
    ),
    (
        "instance-shutdown",
        "running instances are not shut down; a stopped one exists and is shut down",
    ),
    (
        "instances-batch",
        "InstancesBatch (ABI 1.1 bulk lookup) answers every node, in order, as the per-node methods do; a node without an instance is exists: false",
    ),
    (
        "node-lifecycle",
        "cloud-node-lifecycle-controller deletes the absent node and keeps the others",
    ),
    (
        "lb-ensure",
        "EnsureLoadBalancer returns a valid status that GetLoadBalancer reports",
    ),
    (
        "lb-idempotent",
        "EnsureLoadBalancer twice gives the same status and one load balancer",
    ),
    (
        "lb-update-hosts",
        "UpdateLoadBalancer with changing host sets (also none) keeps the load balancer",
    ),
    (
        "lb-hosts",
        "the load balancer targets exactly the hosts handed to Ensure/UpdateLoadBalancer (ABI 1.1 read-back)",
    ),
    (
        "lb-distinct",
        "a second Service gets its own load balancer: another name and address (unless declared shared)",
    ),
    (
        "lb-delete",
        "EnsureLoadBalancerDeleted deletes, and returns Ok for a missing load balancer",
    ),
    (
        "service-controller",
        "service-lb-controller provisions a LoadBalancer Service and cleans it up",
    ),
    (
        "routes-round-trip",
        "CreateRoute / ListRoutes / DeleteRoute round trip",
    ),
    (
        "route-controller",
        "node-route-controller creates the nodes' routes and deletes them with the nodes",
    ),
    (
        "deadline",
        "calls come back under an expired deadline and do not poison later calls",
    ),
    ("no-panics", "no provider method panicked"),
];

/// What each check depends on: when one of these failed (or was skipped because of a failure),
/// the check is skipped as "skipped: depends on <id>", so a root cause is reported once.
pub const DEPENDS: &[(&str, &[&str])] = &[
    ("node-init", &["initialize"]),
    ("provider-id", &["node-init"]),
    ("provider-id-stable", &["provider-id"]),
    ("node-addresses", &["node-init"]),
    ("zone-region", &["node-init"]),
    ("instance-exists", &["provider-id"]),
    ("instance-absent", &["initialize"]),
    ("instance-shutdown", &["provider-id"]),
    (
        "instances-batch",
        &["instance-exists", "instance-absent", "instance-shutdown"],
    ),
    (
        "node-lifecycle",
        &[
            "instance-exists",
            "instance-absent",
            "instance-shutdown",
            "instances-batch",
        ],
    ),
    ("lb-ensure", &["initialize"]),
    ("lb-idempotent", &["lb-ensure"]),
    ("lb-update-hosts", &["lb-ensure"]),
    ("lb-hosts", &["lb-update-hosts"]),
    ("lb-distinct", &["lb-ensure"]),
    ("lb-delete", &["initialize"]),
    ("service-controller", &["lb-ensure", "lb-delete"]),
    ("routes-round-trip", &["initialize"]),
    ("route-controller", &["routes-round-trip"]),
    ("deadline", &["initialize"]),
];

/// The result of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The provider passed.
    Pass,
    /// The provider failed; the detail says why.
    Fail,
    /// Not applicable (capability missing, `--skip`, or a check it depends on failed).
    Skip,
}

/// The outcome of one check: status and a one-line detail (the reason when it failed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Pass, fail or skip.
    pub status: Status,
    /// Why (for failures and skips) or what was verified (for passes).
    pub detail: String,
    /// A skip that hides a contract: the provider has what the check covers but offers no way
    /// to observe it. A failure under `--strict`.
    pub hides_contract: bool,
}

impl Outcome {
    /// A pass with what was verified.
    pub fn pass(detail: impl Into<String>) -> Self {
        Self {
            status: Status::Pass,
            detail: detail.into(),
            hides_contract: false,
        }
    }

    /// A failure with its reason.
    pub fn fail(reason: impl Into<String>) -> Self {
        Self {
            status: Status::Fail,
            detail: reason.into(),
            hides_contract: false,
        }
    }

    /// Not run, with the reason.
    pub fn skip(reason: impl Into<String>) -> Self {
        Self {
            status: Status::Skip,
            detail: reason.into(),
            hides_contract: false,
        }
    }

    /// Not run although the provider has what the check covers: it offers no way to observe
    /// it, so the contract is not verified. A failure under `--strict`.
    pub fn skip_hiding_contract(reason: impl Into<String>) -> Self {
        Self {
            hides_contract: true,
            ..Self::skip(reason)
        }
    }

    /// A failure listing every problem found, or a pass with `detail` when there was none.
    pub fn from_problems(problems: Vec<String>, detail: impl Into<String>) -> Self {
        if problems.is_empty() {
            Self::pass(detail)
        } else {
            Self::fail(problems.join("; "))
        }
    }
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct CheckResult {
    /// Check id (see [`CHECKS`]).
    pub id: &'static str,
    /// What the check verifies.
    pub title: &'static str,
    /// The result.
    pub status: Status,
    /// Reason or detail.
    pub detail: String,
}

/// Who was checked.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    /// The registered provider name (`--cloud-provider`).
    pub provider: String,
    /// `ProviderName()`.
    pub provider_name: String,
    /// `HasClusterID()`.
    pub has_cluster_id: bool,
    /// The plugin file.
    pub plugin_path: String,
    /// Plugin crate name and version.
    pub plugin: String,
    /// The ccm-provider-abi version the plugin was built against.
    pub abi_version: String,
    /// Capabilities present.
    pub capabilities: Capabilities,
    /// The check nodes.
    pub nodes: Vec<String>,
    /// `--cluster-name`.
    pub cluster_name: String,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Who was checked.
    pub subject: Subject,
    /// One row per check, in [`CHECKS`] order.
    pub checks: Vec<CheckResult>,
    /// Checks passed.
    pub passed: usize,
    /// Checks failed.
    pub failed: usize,
    /// Checks skipped.
    pub skipped: usize,
    /// `--strict`: a skip that hides a contract is a failure.
    pub strict: bool,
}

impl Report {
    /// An empty report about `subject`.
    pub fn new(subject: Subject) -> Self {
        Self {
            subject,
            checks: Vec::new(),
            passed: 0,
            failed: 0,
            skipped: 0,
            strict: false,
        }
    }

    /// The same report with `--strict` on or off.
    pub fn strict(self, strict: bool) -> Self {
        Self { strict, ..self }
    }

    /// Record the outcome of check `id` (must be one of [`CHECKS`]).
    pub fn add(&mut self, id: &'static str, mut outcome: Outcome) {
        if self.strict && outcome.status == Status::Skip && outcome.hides_contract {
            outcome = Outcome::fail(format!(
                "--strict: {} (a skip that leaves the contract unverified)",
                outcome.detail
            ));
        }
        let title = CHECKS
            .iter()
            .find(|(c, _)| *c == id)
            .map_or("", |(_, t)| *t);
        match outcome.status {
            Status::Pass => self.passed += 1,
            Status::Fail => self.failed += 1,
            Status::Skip => self.skipped += 1,
        }
        tracing::debug!(check = id, status = ?outcome.status, "{}", outcome.detail);
        self.checks.push(CheckResult {
            id,
            title,
            status: outcome.status,
            detail: outcome.detail,
        });
    }

    /// The outcome of check `id`, if it ran.
    pub fn status(&self, id: &str) -> Option<Status> {
        self.checks.iter().find(|c| c.id == id).map(|c| c.status)
    }

    /// Human-readable report: header, table, summary.
    pub fn write_text(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let s = &self.subject;
        writeln!(
            out,
            "ccm-host check: provider {:?} from {} ({}, ccm-provider-abi {})",
            s.provider, s.plugin_path, s.plugin, s.abi_version
        )?;
        writeln!(
            out,
            "  ProviderName: {}  HasClusterID: {}  capabilities: {}",
            s.provider_name,
            s.has_cluster_id,
            match s.capabilities.names() {
                names if names.is_empty() => "none".to_string(),
                names => names.join(", "),
            }
        )?;
        writeln!(
            out,
            "  nodes: {}  cluster: {}",
            s.nodes.join(", "),
            s.cluster_name
        )?;
        writeln!(out)?;
        let width = CHECKS.iter().map(|(id, _)| id.len()).max().unwrap_or(10);
        writeln!(out, "{:<width$}  {:<6}  DETAIL", "CHECK", "RESULT")?;
        for c in &self.checks {
            let result = match c.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Skip => "skip",
            };
            writeln!(out, "{:<width$}  {:<6}  {}", c.id, result, c.detail)?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{} checks: {} passed, {} failed, {} skipped",
            self.checks.len(),
            self.passed,
            self.failed,
            self.skipped
        )
    }

    /// The report as pretty JSON.
    pub fn write_json(&self, out: &mut dyn Write) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        writeln!(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> Subject {
        Subject {
            provider: "p".into(),
            provider_name: "p".into(),
            has_cluster_id: true,
            plugin_path: "/x/libp.so".into(),
            plugin: "p 1.0".into(),
            abi_version: "1.0.0".into(),
            capabilities: Capabilities::default(),
            nodes: vec!["n1".into()],
            cluster_name: "kubernetes".into(),
        }
    }

    #[test]
    fn counts_and_renders_every_row() {
        let mut r = Report::new(subject());
        r.add("provider-name", Outcome::pass("scheme p"));
        r.add("lb-idempotent", Outcome::fail("second status differs"));
        r.add("routes-round-trip", Outcome::skip("skipped (no Routes)"));
        assert_eq!((r.passed, r.failed, r.skipped), (1, 1, 1));
        assert_eq!(r.status("lb-idempotent"), Some(Status::Fail));
        assert_eq!(r.status("deadline"), None);
        let mut text = Vec::new();
        r.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("lb-idempotent       FAIL    second status differs"));
        assert!(text.contains("capabilities: none"));
        assert!(text.ends_with("3 checks: 1 passed, 1 failed, 1 skipped\n"));
        let mut json = Vec::new();
        r.write_json(&mut json).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(v["checks"][1]["status"], "fail");
        assert_eq!(v["failed"], 1);
    }

    #[test]
    fn problems_make_a_failure() {
        assert_eq!(Outcome::from_problems(vec![], "ok").status, Status::Pass);
        let o = Outcome::from_problems(vec!["a".into(), "b".into()], "ok");
        assert_eq!(o, Outcome::fail("a; b"));
    }

    #[test]
    fn dependencies_name_earlier_checks() {
        let position = |id: &str| CHECKS.iter().position(|(c, _)| *c == id);
        for (id, deps) in DEPENDS {
            let at = position(id).unwrap_or_else(|| panic!("{id} is a check"));
            for dep in *deps {
                let dep_at = position(dep).unwrap_or_else(|| panic!("{dep} is a check"));
                assert!(dep_at < at, "{id} depends on {dep}, which runs later");
            }
        }
    }

    #[test]
    fn check_ids_are_unique() {
        let mut ids: Vec<_> = CHECKS.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), CHECKS.len());
    }
}
