//! AWS API errors and their mapping to the host's error kinds.

use std::fmt;

use ccm_provider_abi::ProviderError;

/// Error codes AWS uses for "slow down" (the SDKs' list of throttling codes).
const THROTTLING: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottled",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "BandwidthLimitExceeded",
    "EC2ThrottledException",
    "PriorRequestNotComplete",
    "SlowDown",
];

/// Codes of rejected credentials: fetching the credentials again may help (rotated keys).
const BAD_CREDENTIALS: &[&str] = &[
    "AuthFailure",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidAccessKeyId",
    "InvalidSecurity",
    "MissingAuthenticationToken",
];

/// Codes of missing permissions (the credentials are valid).
const NO_PERMISSION: &[&str] = &[
    "UnauthorizedOperation",
    "AccessDenied",
    "AccessDeniedException",
    "OptInRequired",
    "Blocked",
    // No credentials found by the chain (set by the client, not by AWS).
    "NoCredentials",
];

/// Codes of server-side trouble worth one more try.
const TRANSIENT: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "ServiceUnavailable",
    "Unavailable",
    "InternalServerError",
];

/// One failed AWS call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AwsError {
    /// `ec2` or `elasticloadbalancing`.
    pub service: &'static str,
    /// The API action, e.g. `DescribeInstances`.
    pub action: String,
    /// The HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// The AWS error code (`InvalidInstanceID.NotFound`), or a short description of a
    /// transport failure (`transport`).
    pub code: String,
    /// The AWS error message.
    pub message: String,
}

impl AwsError {
    /// A failure before a response arrived (connection, TLS, timeout).
    pub fn transport(service: &'static str, action: &str, message: impl Into<String>) -> Self {
        Self {
            service,
            action: action.to_string(),
            status: None,
            code: "transport".into(),
            message: message.into(),
        }
    }

    /// The error code.
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The cloud refused the call for rate.
    pub fn is_throttling(&self) -> bool {
        self.status == Some(429) || THROTTLING.contains(&self.code.as_str())
    }

    /// The credentials were rejected (not merely lacking a permission).
    pub fn is_bad_credentials(&self) -> bool {
        BAD_CREDENTIALS.contains(&self.code.as_str())
            || (self.status == Some(401) && !self.is_throttling())
    }

    /// Credentials rejected or a permission missing.
    pub fn is_unauthorized(&self) -> bool {
        self.is_bad_credentials()
            || NO_PERMISSION.contains(&self.code.as_str())
            || (self.status == Some(403) && !self.is_throttling())
    }

    /// A transport failure or a server error worth retrying.
    pub fn is_transient(&self) -> bool {
        !self.is_throttling()
            && !self.is_unauthorized()
            && (self.status.is_none()
                || self.status.is_some_and(|s| s >= 500)
                || TRANSIENT.contains(&self.code.as_str()))
    }
}

impl fmt::Display for AwsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: ", self.service, self.action)?;
        match self.status {
            Some(s) => write!(f, "{}: {} (HTTP {s})", self.code, self.message),
            None => write!(f, "{}", self.message),
        }
    }
}

impl std::error::Error for AwsError {}

impl From<AwsError> for ProviderError {
    /// Throttling → `throttled` (no delay: AWS sends none; the host backs off), rejected
    /// credentials or missing permissions → `unauthorized`, everything else → `other`. Never
    /// "not found": callers that know what a missing resource means map those codes themselves.
    fn from(e: AwsError) -> Self {
        if e.is_throttling() {
            ProviderError::throttled(e.to_string(), None)
        } else if e.is_unauthorized() {
            ProviderError::unauthorized(e.to_string())
        } else {
            ProviderError::other(e.to_string())
        }
    }
}

/// Parse an error response body (EC2: `<Response><Errors><Error>`; ELBv2/STS:
/// `<ErrorResponse><Error>`). `None` when the body is not an AWS error document.
pub fn parse_error_body(body: &str) -> Option<(String, String)> {
    let doc = roxmltree::Document::parse(body).ok()?;
    let error = doc
        .descendants()
        .find(|n| n.is_element() && n.tag_name().name() == "Error")?;
    let code = crate::api::xml::string(error, "Code")?;
    let message = crate::api::xml::string(error, "Message").unwrap_or_default();
    Some((code, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ccm_provider_abi::ErrorKind;

    fn err(code: &str, status: u16) -> AwsError {
        AwsError {
            service: "ec2",
            action: "DescribeInstances".into(),
            status: Some(status),
            code: code.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn codes_map_to_kinds() {
        let kind = |e: AwsError| ProviderError::from(e).kind();
        assert_eq!(kind(err("RequestLimitExceeded", 503)), ErrorKind::THROTTLED);
        assert_eq!(kind(err("Throttling", 400)), ErrorKind::THROTTLED);
        assert_eq!(kind(err("Whatever", 429)), ErrorKind::THROTTLED);
        assert_eq!(
            kind(err("UnauthorizedOperation", 403)),
            ErrorKind::UNAUTHORIZED
        );
        assert_eq!(kind(err("AccessDenied", 403)), ErrorKind::UNAUTHORIZED);
        assert_eq!(kind(err("AuthFailure", 401)), ErrorKind::UNAUTHORIZED);
        assert_eq!(
            kind(err("InvalidInstanceID.NotFound", 400)),
            ErrorKind::OTHER
        );
        assert_eq!(kind(err("InternalError", 500)), ErrorKind::OTHER);
        assert!(err("AuthFailure", 401).is_bad_credentials());
        assert!(!err("AccessDenied", 403).is_bad_credentials());
        assert!(err("InternalError", 500).is_transient());
        assert!(AwsError::transport("ec2", "X", "refused").is_transient());
        assert!(!err("RequestLimitExceeded", 503).is_transient());
        assert_eq!(
            err("AuthFailure", 401).to_string(),
            "ec2 DescribeInstances: AuthFailure: m (HTTP 401)"
        );
    }

    #[test]
    fn both_error_documents_parse() {
        let ec2 = r#"<?xml version="1.0"?><Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance ID 'i-1' does not exist</Message></Error></Errors><RequestID>r</RequestID></Response>"#;
        assert_eq!(
            parse_error_body(ec2),
            Some((
                "InvalidInstanceID.NotFound".into(),
                "The instance ID 'i-1' does not exist".into()
            ))
        );
        let elb = r#"<ErrorResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"><Error><Type>Sender</Type><Code>LoadBalancerNotFound</Code><Message>nope</Message></Error></ErrorResponse>"#;
        assert_eq!(
            parse_error_body(elb),
            Some(("LoadBalancerNotFound".into(), "nope".into()))
        );
        assert_eq!(parse_error_body("<html>bad gateway</html>"), None);
        assert_eq!(parse_error_body("not xml"), None);
    }
}
