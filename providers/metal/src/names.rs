//! Kubernetes name rules the config and the inventory are checked against, so a bad value is
//! refused with a clear message when the file is read instead of failing later at the API server.

/// DNS-1123 label: at most 63 characters of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 63 {
        return Err(format!("{s:?} is longer than 63 characters"));
    }
    let ok_inner = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if !ok_inner || !ends(s.as_bytes()[0]) || !ends(s.as_bytes()[s.len() - 1]) {
        return Err(format!(
            "{s:?} is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// DNS-1123 subdomain: at most 253 characters, dot-separated DNS-1123 labels.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.len() > 253 {
        return Err(format!("{s:?} is longer than 253 characters"));
    }
    for part in s.split('.') {
        dns1123_label(part).map_err(|_| {
            format!("{s:?} is not a DNS-1123 subdomain (dot-separated lower-case labels)")
        })?;
    }
    Ok(())
}

/// The name part of a label key, or a label value when non-empty: at most 63 characters of
/// `[A-Za-z0-9_.-]`, starting and ending alphanumeric.
fn qualified_name_part(s: &str) -> bool {
    let ends = |b: u8| b.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && ends(s.as_bytes()[0])
        && ends(s.as_bytes()[s.len() - 1])
}

/// A label key: `[prefix/]name`, prefix a DNS-1123 subdomain.
pub fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        dns1123_subdomain(p).map_err(|e| format!("label key {key:?}: prefix {e}"))?;
    }
    if !qualified_name_part(name) {
        return Err(format!(
            "label key {key:?}: the name part must be 1-63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or like the name part of a key.
pub fn label_value(key: &str, value: &str) -> Result<(), String> {
    if value.is_empty() || qualified_name_part(value) {
        Ok(())
    } else {
        Err(format!(
            "label {key:?} value {value:?}: at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit"
        ))
    }
}

/// Keys in the `kubernetes.io` / `k8s.io` namespaces, which the node controller drops from
/// additional labels (upstream's `(^|\.)(kubernetes|k8s)\.io/`).
pub fn reserved_label_key(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return false;
    };
    ["kubernetes.io", "k8s.io"]
        .iter()
        .any(|d| prefix == *d || prefix.ends_with(&format!(".{d}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_subdomains() {
        assert!(dns1123_label("kube-system").is_ok());
        assert!(dns1123_label("a").is_ok());
        assert!(dns1123_label("-a").is_err());
        assert!(dns1123_label("a-").is_err());
        assert!(dns1123_label("A").is_err());
        assert!(dns1123_label(&"a".repeat(64)).is_err());
        assert!(dns1123_subdomain("ccm-metal.ipam").is_ok());
        assert!(dns1123_subdomain("a..b").is_err());
    }

    #[test]
    fn label_keys_values_and_reserved_namespaces() {
        assert!(label_key("rack").is_ok());
        assert!(label_key("example.com/rack_Row.1").is_ok());
        assert!(label_key("Example.com/rack").is_err());
        assert!(label_key("example.com/").is_err());
        assert!(label_key("a/b/c").is_err());
        assert!(label_value("k", "").is_ok());
        assert!(label_value("k", "R7-u12").is_ok());
        assert!(label_value("k", "has space").is_err());
        assert!(reserved_label_key("kubernetes.io/x"));
        assert!(reserved_label_key("topology.k8s.io/x"));
        assert!(!reserved_label_key("mykubernetes.io/x"));
        assert!(!reserved_label_key("k8snio/x"));
        assert!(!reserved_label_key("rack"));
    }
}
