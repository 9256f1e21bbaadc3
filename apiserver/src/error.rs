//! `metav1.Status` errors as the real API server writes them.

use serde_json::{json, Value};

/// An API error, rendered as a `metav1.Status` body with the matching HTTP code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (also `Status.code`).
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `Conflict`, `Invalid`.
    pub reason: &'static str,
    /// Human readable message, worded like the real API server.
    pub message: String,
    /// `Status.details` (name, group, kind, causes), if any.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429 and friends).
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// A bare error with a code, reason and message.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        let mut d = serde_json::Map::new();
        if !name.is_empty() {
            d.insert("name".into(), json!(name));
        }
        if !group.is_empty() {
            d.insert("group".into(), json!(group));
        }
        d.insert("kind".into(), json!(kind));
        self.details = Some(Value::Object(d));
        self
    }

    /// `resource "name" not found` (404).
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{}\" not found", qualified(group, resource), name),
        )
        .with_details(group, resource, name)
    }

    /// `resource "name" already exists` (409).
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{}\" already exists", qualified(group, resource), name),
        )
        .with_details(group, resource, name)
    }

    /// Optimistic-concurrency conflict (409), worded as upstream's `NewConflict`.
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                qualified(group, resource),
                name,
                why
            ),
        )
        .with_details(group, resource, name)
    }

    /// The standard stale-resourceVersion conflict.
    pub fn stale(group: &str, resource: &str, name: &str) -> Self {
        Self::conflict(
            group,
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid with field causes `(field, type, message)`; `kind` is the object kind.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[(&str, &str, String)]) -> Self {
        let summary: Vec<String> = causes
            .iter()
            .map(|(field, _, msg)| format!("{field}: {msg}"))
            .collect();
        let gk = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{gk} \"{name}\" is invalid: {}", summary.join(", ")),
        )
        .with_details(group, kind, name);
        if let Some(Value::Object(d)) = e.details.as_mut() {
            d.insert(
                "causes".into(),
                Value::Array(
                    causes
                        .iter()
                        .map(|(field, ty, msg)| json!({"reason": ty, "message": msg, "field": field}))
                        .collect(),
                ),
            );
        }
        e
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// 422 without field causes (used for patches that cannot be applied).
    pub fn unprocessable(message: impl Into<String>) -> Self {
        ApiError::new(422, "Invalid", message)
    }

    /// 410 Gone / Expired.
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// An error for an arbitrary injected code, with the reason upstream uses for that code.
    pub fn for_code(code: u16, message: impl Into<String>) -> Self {
        let reason = reason_for_code(code);
        let mut e = ApiError::new(code, reason, message);
        if code == 429 {
            e.retry_after = Some(1);
        }
        e
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        if let Some(s) = self.retry_after {
            let d = v
                .as_object_mut()
                .map(|o| o.entry("details").or_insert_with(|| json!({})));
            if let Some(Value::Object(d)) = d {
                d.insert("retryAfterSeconds".into(), json!(s));
            }
        }
        v
    }
}

/// `Status.reason` for an HTTP code, as `apimachinery/pkg/api/errors` picks it.
pub fn reason_for_code(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        406 => "NotAcceptable",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}
