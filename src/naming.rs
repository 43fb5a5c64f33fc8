//! Every naming rule of the service in one place: the application id (a label value),
//! Kubernetes' DNS-1123 labels and subdomains, label keys and values, the executor pod-name
//! prefix, and the stable hash that keeps names derived from an application id distinct.
//! The gRPC edge, the configuration, the engine's pod builder and the id record all check
//! and build names through these functions, so a rule and its message exist once.

/// Longest DNS-1123 label (and label value, and label key name).
pub const MAX_LABEL_LEN: usize = 63;

/// Longest DNS-1123 subdomain (object names such as pod names).
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Longest `pod_name_prefix` a driver may send: it still leaves room for `-exec-<u64>` in
/// a pod name (the prefix is sanitised and cut to a label when pods are named).
pub const MAX_POD_NAME_PREFIX: usize = MAX_SUBDOMAIN_LEN - "-exec-".len() - 20;

/// True for a DNS-1123 label: 1 to 63 lowercase letters, digits or `-`, with a letter or
/// digit at both ends.
pub fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_LABEL_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(|b| *b != b'-')
        && bytes.last().is_some_and(|b| *b != b'-')
}

/// True for a DNS-1123 subdomain: at most 253 characters of dot-separated labels.
pub fn is_dns_subdomain(value: &str) -> bool {
    value.len() <= MAX_SUBDOMAIN_LEN && value.split('.').all(is_dns_label)
}

/// A DNS-1123 label (namespaces, container names); the error says why not.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    if value.len() > MAX_LABEL_LEN {
        return Err(format!(
            "must be at most {MAX_LABEL_LEN} characters (has {})",
            value.len()
        ));
    }
    if !is_dns_label(value) {
        return Err(format!(
            "{value:?} is not a DNS-1123 label: lowercase letters, digits and '-', \
             starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A DNS-1123 subdomain (pod names); the error says why not.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    if value.len() > MAX_SUBDOMAIN_LEN {
        return Err(format!(
            "must be at most {MAX_SUBDOMAIN_LEN} characters (has {})",
            value.len()
        ));
    }
    if !is_dns_subdomain(value) {
        return Err(format!(
            "{value:?} is not a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', \
             starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_` and `.` with a letter or
/// digit at both ends; the error says why not.
pub fn label_value(value: &str) -> Result<(), String> {
    if value.len() > MAX_LABEL_LEN {
        return Err(format!(
            "must be at most {MAX_LABEL_LEN} characters (has {})",
            value.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if let Some(bad) = value.chars().find(|c| !allowed(*c)) {
        return Err(format!(
            "{bad:?} is not allowed: use letters, digits, '-', '_' and '.' only"
        ));
    }
    let bytes = value.as_bytes();
    let ends_ok = bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric);
    if !ends_ok {
        return Err("must start and end with a letter or digit".to_string());
    }
    Ok(())
}

/// A label key: an optional DNS-1123 subdomain prefix and `/`, then a name that follows
/// the label value rule and is not empty.
pub fn label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "has a prefix {prefix:?} that is not a DNS-1123 subdomain"
        ));
    }
    if name.is_empty() {
        return Err("has an empty name".into());
    }
    label_value(name)
}

/// An application id: it labels every executor pod (`spark-app-selector`), so it is a
/// label value that is not empty.
pub fn application_id(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".to_string());
    }
    label_value(value)
}

/// A driver's `pod_name_prefix`: it is sanitised to a DNS label when pods are named
/// ([`sanitize_prefix`]), so it must leave something to sanitise and fit in a pod name.
pub fn pod_name_prefix(value: &str) -> Result<(), String> {
    if value.len() > MAX_POD_NAME_PREFIX {
        return Err(format!(
            "must be at most {MAX_POD_NAME_PREFIX} characters (has {})",
            value.len()
        ));
    }
    if !value.chars().any(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "{value:?} has no letter or digit to build pod names from"
        ));
    }
    Ok(())
}

/// A DNS-1123 label from a driver's prefix (or an application id): lowercase, other
/// characters → `-`, no leading or trailing `-`; empty → `spark`. Its length is cut per
/// name ([`truncate_label`]).
pub fn sanitize_prefix(prefix: &str) -> String {
    let mapped: String = prefix
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches('-');
    if trimmed.is_empty() {
        "spark".to_string()
    } else {
        trimmed.to_string()
    }
}

/// At most `max` characters of an ASCII label, not ending in `-`.
pub fn truncate_label(label: &str, max: usize) -> &str {
    let cut = &label[..label.len().min(max)];
    cut.trim_end_matches('-')
}

/// A short hash of `value` that never changes across versions and platforms (8 lowercase
/// hex digits of 32-bit FNV-1a over the UTF-8 bytes), for names derived from an
/// application id that must stay distinct and stable across service restarts.
pub fn stable_hash(value: &str) -> String {
    format!("{:08x}", stable_hash_u32(value))
}

/// The number behind [`stable_hash`]: 32-bit FNV-1a over the UTF-8 bytes, the same on
/// every replica and version (it places a namespace in its HA shard).
pub fn stable_hash_u32(value: &str) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    value.bytes().fold(OFFSET_BASIS, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn application_ids_are_non_empty_label_values() {
        for ok in ["a", "spark-1234.x_y", "A9", "App_1.x", &"a".repeat(63)] {
            assert_eq!(application_id(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "é", "a/b", ".a", &"a".repeat(64)] {
            assert!(application_id(bad).is_err(), "{bad}");
        }
        assert_eq!(application_id(""), Err("must not be empty".into()));
        assert_eq!(
            application_id(&"a".repeat(64)),
            Err("must be at most 63 characters (has 64)".into())
        );
        assert_eq!(
            application_id("a b"),
            Err("' ' is not allowed: use letters, digits, '-', '_' and '.' only".into())
        );
        assert_eq!(
            application_id("a-"),
            Err("must start and end with a letter or digit".into())
        );
        assert_eq!(label_value(""), Ok(()));
    }

    #[test]
    fn dns_labels_and_subdomains() {
        assert!(dns1123_label("team-a1").is_ok());
        for bad in ["", "Team", "a_b", "-a", "a-", "a.b", &"a".repeat(64)] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(dns1123_subdomain("driver-0.x").is_ok());
        for bad in ["Driver", "a..b", ".a", "a_b", &"a".repeat(254)] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys_have_an_optional_subdomain_prefix() {
        assert_eq!(label_key("team"), Ok(()));
        assert_eq!(label_key("example.com/team_1"), Ok(()));
        assert!(
            label_key("Example.com/team")
                .unwrap_err()
                .contains("prefix")
        );
        assert_eq!(label_key("example.com/"), Err("has an empty name".into()));
        assert!(label_key("a/-x").is_err());
    }

    #[test]
    fn prefixes_are_sanitised_into_labels() {
        assert_eq!(sanitize_prefix("Spark_App.1"), "spark-app-1");
        assert_eq!(sanitize_prefix("--"), "spark");
        assert_eq!(truncate_label("abc-def", 4), "abc");
        assert!(pod_name_prefix("---").is_err());
        assert!(pod_name_prefix(&"a".repeat(MAX_POD_NAME_PREFIX + 1)).is_err());
        assert_eq!(pod_name_prefix("spark-1"), Ok(()));
    }
}
