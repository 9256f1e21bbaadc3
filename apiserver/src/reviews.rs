//! TokenReview (`authentication.k8s.io/v1`) and SubjectAccessReview (`authorization.k8s.io/v1`):
//! what a component's delegated authentication and authorization ask the API server, answered
//! from a small policy set through [`super::Controls`]: registered bearer tokens, and rules that
//! allow a user or group a verb on non-resource URLs (as a ClusterRole with `nonResourceURLs`
//! bound to it would). Members of `system:masters` are allowed everything, as upstream.
//!
//! Reviews are not stored: a create answers the review with its `status` filled in (201).

use serde_json::{json, Value};

use super::error::ApiError;

/// The group whose members every authorizer allows (upstream's privileged group).
pub const SYSTEM_MASTERS: &str = "system:masters";
/// Added to every authenticated user's groups by the real API server.
const SYSTEM_AUTHENTICATED: &str = "system:authenticated";

/// A bearer token the TokenReview endpoint accepts, and who it authenticates.
#[derive(Debug, Clone)]
pub(crate) struct TokenEntry {
    pub token: String,
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// One rule: `subject` (a user name or a group name) may use `verbs` on `paths`.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub subject: String,
    pub verbs: Vec<String>,
    pub paths: Vec<String>,
}

/// The review policy.
#[derive(Debug, Clone, Default)]
pub(crate) struct Policy {
    pub tokens: Vec<TokenEntry>,
    pub rules: Vec<Rule>,
}

/// A non-resource URL rule matches as RBAC's: `*` matches every path, a trailing `*` a prefix,
/// anything else the exact path.
fn path_matches(rule: &str, path: &str) -> bool {
    if rule == "*" {
        return true;
    }
    match rule.strip_suffix('*') {
        Some(prefix) => path.starts_with(prefix),
        None => rule == path,
    }
}

impl Policy {
    /// The `status` of a TokenReview.
    pub fn token_review(&self, review: &Value) -> Result<Value, ApiError> {
        let token = review
            .pointer("/spec/token")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if token.is_empty() {
            return Err(invalid("TokenReview", "spec.token", "Required value"));
        }
        let status = match self.tokens.iter().find(|t| t.token == token) {
            Some(t) => {
                let mut groups = t.groups.clone();
                if !groups.iter().any(|g| g == SYSTEM_AUTHENTICATED) {
                    groups.push(SYSTEM_AUTHENTICATED.into());
                }
                let mut user = json!({"username": t.user, "groups": groups});
                if !t.uid.is_empty() {
                    user["uid"] = json!(t.uid);
                }
                json!({"authenticated": true, "user": user})
            }
            None => json!({
                "authenticated": false,
                "user": {},
                "error": "invalid bearer token",
            }),
        };
        Ok(status)
    }

    /// The `status` of a SubjectAccessReview.
    pub fn subject_access_review(&self, review: &Value) -> Result<Value, ApiError> {
        let spec = review.get("spec").cloned().unwrap_or(Value::Null);
        let user = spec.get("user").and_then(Value::as_str).unwrap_or_default();
        let groups: Vec<&str> = spec
            .get("groups")
            .and_then(Value::as_array)
            .map(|gs| gs.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if user.is_empty() && groups.is_empty() {
            return Err(invalid(
                "SubjectAccessReview",
                "spec.user",
                "at least one of user or group must be specified",
            ));
        }
        let non_resource = spec.get("nonResourceAttributes");
        let resource = spec.get("resourceAttributes");
        if non_resource.is_some() == resource.is_some() {
            return Err(invalid(
                "SubjectAccessReview",
                "spec.nonResourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            ));
        }
        if groups.contains(&SYSTEM_MASTERS) {
            return Ok(json!({"allowed": true, "reason": "system:masters is allowed everything"}));
        }
        let Some(attrs) = non_resource else {
            return Ok(json!({
                "allowed": false,
                "reason": "the in-memory API server's policy covers non-resource URLs only",
            }));
        };
        let path = attrs
            .get("path")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let verb = attrs
            .get("verb")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let rule = self.rules.iter().find(|r| {
            (r.subject == user || groups.contains(&r.subject.as_str()))
                && r.verbs.iter().any(|v| v == "*" || v == verb)
                && r.paths.iter().any(|p| path_matches(p, path))
        });
        Ok(match rule {
            Some(r) => json!({
                "allowed": true,
                "reason": format!("allowed by the rule for {:?}", r.subject),
            }),
            None => json!({"allowed": false}),
        })
    }
}

fn invalid(kind: &str, field: &str, why: &str) -> ApiError {
    let mut e = ApiError::new(422, "Invalid", format!("{kind} is invalid: {field}: {why}"));
    e.details = Some(
        json!({"kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}]}),
    );
    e
}

/// The review kind served at `group/version/plural`, if any.
pub(crate) fn review_kind(group: &str, version: &str, rest: &[&str]) -> Option<ReviewKind> {
    match (group, version, rest) {
        ("authentication.k8s.io", "v1", ["tokenreviews"]) => Some(ReviewKind::Token),
        ("authorization.k8s.io", "v1", ["subjectaccessreviews"]) => Some(ReviewKind::SubjectAccess),
        _ => None,
    }
}

/// The two review kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReviewKind {
    /// `tokenreviews.authentication.k8s.io`
    Token,
    /// `subjectaccessreviews.authorization.k8s.io`
    SubjectAccess,
}

impl ReviewKind {
    /// The resource as the request log names it.
    pub fn qualified(self) -> &'static str {
        match self {
            ReviewKind::Token => "tokenreviews.authentication.k8s.io",
            ReviewKind::SubjectAccess => "subjectaccessreviews.authorization.k8s.io",
        }
    }

    /// Answer a review: the request with `status` filled in.
    pub fn answer(self, policy: &Policy, mut review: Value) -> Result<Value, ApiError> {
        let (api_version, kind) = match self {
            ReviewKind::Token => ("authentication.k8s.io/v1", "TokenReview"),
            ReviewKind::SubjectAccess => ("authorization.k8s.io/v1", "SubjectAccessReview"),
        };
        if !review.is_object() {
            return Err(ApiError::bad_request(format!(
                "the body of a {kind} must be a JSON object"
            )));
        }
        let status = match self {
            ReviewKind::Token => policy.token_review(&review)?,
            ReviewKind::SubjectAccess => policy.subject_access_review(&review)?,
        };
        review["apiVersion"] = json!(api_version);
        review["kind"] = json!(kind);
        if review.get("metadata").is_none() {
            review["metadata"] = json!({});
        }
        review["status"] = status;
        Ok(review)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            tokens: vec![TokenEntry {
                token: "t1".into(),
                user: "prometheus".into(),
                uid: "u-1".into(),
                groups: vec!["monitoring".into()],
            }],
            rules: vec![
                Rule {
                    subject: "monitoring".into(),
                    verbs: vec!["get".into()],
                    paths: vec!["/metrics".into()],
                },
                Rule {
                    subject: "debugger".into(),
                    verbs: vec!["*".into()],
                    paths: vec!["/debug/*".into()],
                },
            ],
        }
    }

    fn sar(user: &str, groups: &[&str], verb: &str, path: &str) -> Value {
        json!({"spec": {"user": user, "groups": groups,
                        "nonResourceAttributes": {"path": path, "verb": verb}}})
    }

    #[test]
    fn tokens_authenticate_as_registered() {
        let p = policy();
        let s = p.token_review(&json!({"spec": {"token": "t1"}})).unwrap();
        assert_eq!(s["authenticated"], true);
        assert_eq!(s["user"]["username"], "prometheus");
        assert_eq!(s["user"]["uid"], "u-1");
        assert_eq!(
            s["user"]["groups"],
            json!(["monitoring", "system:authenticated"])
        );
        let s = p.token_review(&json!({"spec": {"token": "nope"}})).unwrap();
        assert_eq!(s["authenticated"], false);
        assert!(p.token_review(&json!({"spec": {}})).is_err());
    }

    #[test]
    fn rules_allow_users_and_groups_per_verb_and_path() {
        let p = policy();
        let allowed = |v: Value| p.subject_access_review(&v).unwrap()["allowed"] == true;
        assert!(allowed(sar(
            "prometheus",
            &["monitoring"],
            "get",
            "/metrics"
        )));
        assert!(!allowed(sar(
            "prometheus",
            &["monitoring"],
            "post",
            "/metrics"
        )));
        assert!(!allowed(sar(
            "prometheus",
            &["monitoring"],
            "get",
            "/metricsx"
        )));
        assert!(!allowed(sar("system:anonymous", &[], "get", "/metrics")));
        assert!(allowed(sar("debugger", &[], "get", "/debug/pprof")));
        assert!(!allowed(sar("debugger", &[], "get", "/debugx")));
        assert!(allowed(sar("root", &["system:masters"], "delete", "/x")));
        let resource = json!({"spec": {"user": "a", "resourceAttributes": {"verb": "get", "resource": "nodes"}}});
        assert_eq!(
            p.subject_access_review(&resource).unwrap()["allowed"],
            false
        );
        assert!(p
            .subject_access_review(&json!({"spec": {"user": "a"}}))
            .is_err());
        assert!(p
            .subject_access_review(&json!({"spec": {"nonResourceAttributes": {}}}))
            .is_err());
    }
}
