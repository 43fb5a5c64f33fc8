//! Every key of the service's configuration can be set through the chart's `config` block
//! (or is one the chart sets from values of its own): one `helm template` with all of them.

use std::collections::BTreeSet;

use serde_json::{Value, json};
use test_kit::cluster::{chart, helm};

use crate::chart::documents;

/// The keys of the service's configuration the chart sets from values of its own (its
/// `spa.chartConfigKeys`, which it refuses in `config`).
const CHART_SET_KEYS: &[&str] = &[
    "listen",
    "allowed_namespaces",
    "registrations.namespace",
    "registrations.key_secret",
    "ha.lease_namespace",
    "ha.peer_ca_file",
    "ha.peer_server_name",
    "tls.cert_file",
    "tls.key_file",
    "health.listen",
    "metrics.listen",
    "default_executor_pod_template",
];

/// A value the schema of `key` admits: its default, else one of its type.
fn sample(key: &spark_pod_allocator::config::reference::Key) -> Value {
    if let Some(default) = &key.default {
        return default.clone();
    }
    let schema = &key.schema;
    if let Some(first) = (schema.get("oneOf").and_then(Value::as_array))
        .and_then(|choices| choices.first()?.get("const"))
    {
        return first.clone();
    }
    if schema.get("anyOf").is_some() {
        return json!("1");
    }
    let kind = match schema.get("type") {
        Some(Value::Array(types)) => types.first().cloned().unwrap_or(Value::Null),
        Some(one) => one.clone(),
        None => json!("string"),
    };
    match kind.as_str() {
        Some("integer") => json!(1),
        Some("number") => json!(0.5),
        Some("boolean") => json!(true),
        Some("array") => json!(["x"]),
        _ => json!("x"),
    }
}

/// `path` (dotted; `name[]` is the first element of the list `name`) in `root`.
fn at<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(root, |node, part| match part.strip_suffix("[]") {
            Some(list) => node.get(list)?.get(0),
            None => node.get(part),
        })
}

/// Sets `path` (as [`at`] reads it) in `root`, making the tables and lists on the way.
fn put(root: &mut Value, path: &str, value: Value) {
    let parts: Vec<&str> = path.split('.').collect();
    let mut node = root;
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let (name, element) = match part.strip_suffix("[]") {
            Some(list) => (list, true),
            None => (*part, false),
        };
        let table = node.as_object_mut().expect("a table on the way");
        if last && !element {
            table.insert(name.to_string(), value);
            return;
        }
        node = if element {
            let list = table.entry(name).or_insert_with(|| json!([{}]));
            &mut list[0]
        } else {
            table.entry(name).or_insert_with(|| json!({}))
        };
    }
}

/// Every key the service accepts (walked from its configuration types, as the generated
/// reference is) is settable from the chart: one rendering with each key under `config`
/// (each list of tables with one element holding each of its keys), checked by the chart's
/// schema, gives the service a configuration file holding each with the value set; and
/// each key the chart sets from its own values is in that file.
#[test]
fn every_configuration_key_is_settable_from_the_chart() {
    // As the other tests here: helm is there when the real server is (`.ci/run` builds it
    // first), or when TEST_HELM names it.
    if std::env::var_os("TEST_HELM").is_none() && test_kit::apiserver::binary().is_none() {
        return;
    }
    let keys = spark_pod_allocator::config::reference::keys();
    let paths: BTreeSet<&str> = keys.iter().map(|key| key.path.as_str()).collect();
    let chart_set = |path: &str| {
        CHART_SET_KEYS
            .iter()
            .any(|key| path == *key || path.starts_with(&format!("{key}.")))
    };
    let mut config = json!({});
    let mut set = Vec::new();
    for key in &keys {
        // A list of tables is set through its elements' keys (`budgets[].namespace`).
        if key.section || chart_set(&key.path) || paths.contains(format!("{}[]", key.path).as_str())
        {
            continue;
        }
        let value = sample(key);
        put(&mut config, &key.path, value.clone());
        set.push((key.path.clone(), value));
    }
    assert!(set.len() > 100, "only {} keys walked", set.len());
    // The chart refuses an unauthenticated service on the pod's address.
    put(&mut config, "auth.mode", json!("kubernetes"));
    set.retain(|(path, _)| path != "auth.mode");
    let values = json!({
        "allowedNamespaces": ["spark"],
        "metrics": {"enabled": true},
        "defaultExecutorPodTemplate": {"apiVersion": "v1", "kind": "Pod"},
        "config": config,
    });
    let file = tempfile::Builder::new()
        .suffix(".yaml")
        .tempfile()
        .expect("a values file");
    std::fs::write(file.path(), values.to_string()).expect("values written");
    let output = std::process::Command::new(helm())
        .args(["template", "every-key"])
        .arg(chart())
        .args(["--namespace", "spark-system", "-f"])
        .arg(file.path())
        .output()
        .expect("helm runs");
    assert!(
        output.status.success(),
        "the chart refuses the configuration: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered = String::from_utf8(output.stdout).expect("UTF-8");
    let config_file = documents(&rendered)
        .into_iter()
        .find_map(|doc| {
            let text = doc.pointer("/data/config.yaml")?.as_str()?.to_string();
            (doc["kind"] == "ConfigMap").then_some(text)
        })
        .expect("the service's ConfigMap");
    let rendered_config: Value = serde_yaml::from_str(&config_file).expect("YAML");
    for (path, value) in &set {
        let rendered = at(&rendered_config, path);
        // YAML writes 0.0 as 0.
        let same = match (rendered.and_then(Value::as_f64), value.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => rendered == Some(value),
        };
        assert!(same, "config.{path}: set {value}, rendered {rendered:?}");
    }
    for key in CHART_SET_KEYS {
        assert!(paths.contains(key), "{key} is no key of the service");
        assert!(
            at(&rendered_config, key).is_some(),
            "the chart does not set {key}"
        );
    }
}
