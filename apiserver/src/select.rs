//! Label and field selectors.

use serde_json::Value;

use super::error::ApiError;
use super::resources::ResourceInfo;

#[derive(Debug, Clone)]
enum LabelReq {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    /// Parse the `labelSelector` query syntax (`a=b,c!=d,e in (x,y),!f,g`).
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top(s) {
            let t = term.trim();
            if t.is_empty() {
                continue;
            }
            let bad = || {
                ApiError::bad_request(format!(
                    "unable to parse requirement: invalid label selector {s:?}"
                ))
            };
            if let Some(k) = t.strip_prefix('!') {
                reqs.push(LabelReq::NotExists(k.trim().to_string()));
            } else if let Some((k, v)) = t.split_once("!=") {
                reqs.push(LabelReq::Ne(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = t.split_once("==") {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = t.split_once('=') {
                reqs.push(LabelReq::Eq(k.trim().into(), v.trim().into()));
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                reqs.push(LabelReq::NotIn(
                    k.trim().into(),
                    set_values(rest).ok_or_else(bad)?,
                ));
            } else if let Some((k, rest)) = t.split_once(" in ") {
                reqs.push(LabelReq::In(
                    k.trim().into(),
                    set_values(rest).ok_or_else(bad)?,
                ));
            } else if t.contains(' ') || t.contains('(') {
                return Err(bad());
            } else {
                reqs.push(LabelReq::Exists(t.to_string()));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the object's labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::Ne(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(inner.split(',').map(|v| v.trim().to_string()).collect())
}

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A parsed `fieldSelector`: `field=value`, `field==value`, `field!=value` terms.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parse and check the fields against what the resource supports (400 otherwise, as upstream).
    pub fn parse(s: &str, r: &ResourceInfo) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (k, eq, v) = if let Some((k, v)) = t.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = t.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = t.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{t}'"
                )));
            };
            let k = k.trim();
            let supported = k == "metadata.name"
                || (k == "metadata.namespace" && r.namespaced)
                || r.field_labels.contains(&k);
            if !supported {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {k}"
                )));
            }
            reqs.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object matches.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(k, eq, v)| {
            let actual = field_value(obj, k);
            (actual == *v) == *eq
        })
    }
}

fn field_value(obj: &Value, field: &str) -> String {
    let cur = field.split('.').try_fold(obj, |c, k| c.get(k));
    match cur {
        None | Some(Value::Null) => match field {
            "spec.unschedulable" | "spec.hostNetwork" => "false".into(),
            _ => String::new(),
        },
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(m)) if field == "source" => m
            .get("component")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        Some(other) => other.to_string(),
    }
}
