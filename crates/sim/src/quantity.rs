//! Resource quantities (`500m`, `1Gi`, `2`) as numbers: for the QoS class, the quotas and
//! the process runtime's `resourceFieldRef`s.

use serde_json::Value;

/// Parses a resource quantity (`500m`, `1Gi`, `2`) to a number.
pub(crate) fn quantity(v: &Value) -> Option<f64> {
    let s = match v {
        Value::String(s) => s.as_str(),
        Value::Number(n) => return n.as_f64(),
        _ => return None,
    };
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, mult) in suffixes {
        if let Some(num) = s.strip_suffix(suffix) {
            return num.parse::<f64>().ok().map(|n| n * mult);
        }
    }
    s.parse().ok()
}
