//! The configuration reference (`docs/configuration.md`), generated from the configuration
//! types: their doc comments, defaults and types, through their JSON Schema. A test fails
//! when the file differs; `UPDATE_GENERATED=1 cargo test --lib config::reference`
//! writes it again.
use serde_json::Value;

use super::{ENV_PREFIX, ENV_SEPARATOR, Settings};

/// The JSON Schema of the configuration file, as draft-07 (the draft of the chart's
/// values.schema.json, which holds it as its `config`).
pub fn schema() -> Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    serde_json::to_value(generator.into_root_schema_for::<Settings>()).unwrap_or_default()
}

/// Where the types' definitions are in [`schema`] and in the chart's schema.
const DEFINITIONS: &str = "definitions";

/// The chart's `values.schema.json` (`current`) with the configuration's types as its
/// root `definitions`, the last member of the file: `config` refers to `Settings`, so the
/// chart checks the block it passes through as the service would (keys and types; the
/// service's rules on values are checked when it starts). `None` when `current` has no
/// root `definitions` last.
pub fn chart_values_schema(current: &str) -> Option<String> {
    let marker = format!("\n  \"{DEFINITIONS}\": ");
    let start = current.rfind(&marker)?;
    let mut root = schema();
    let mut definitions = root.get(DEFINITIONS).cloned()?;
    if let Some(settings) = root.as_object_mut() {
        for field in ["$schema", DEFINITIONS, "title"] {
            settings.remove(field);
        }
    }
    definitions
        .as_object_mut()?
        .insert("Settings".to_string(), root);
    let text = serde_json::to_string_pretty(&definitions).ok()?;
    Some(format!(
        "{}{marker}{}\n}}\n",
        &current[..start],
        text.replace('\n', "\n  ")
    ))
}

/// One key of the configuration, as the file spells it.
#[derive(Debug, Clone, PartialEq)]
pub struct Key {
    /// Dotted path, e.g. `kubernetes.qps`; `[]` stands for any element of a list, e.g.
    /// `budgets[].namespace`.
    pub path: String,
    /// The key's schema, references resolved one level.
    pub schema: Value,
    /// Its default, `None` when the key is unset by default.
    pub default: Option<Value>,
    /// Whether a table that has the key must give it (elements of lists of tables).
    pub required: bool,
    /// Whether it is a section (a table of keys of its own).
    pub section: bool,
}

/// Every key, sections included, in the order of the reference.
pub fn keys() -> Vec<Key> {
    let schema = schema();
    let mut keys = Vec::new();
    let root = Walk { schema: &schema };
    root.object("", &schema, None, &mut keys);
    keys
}

struct Walk<'a> {
    schema: &'a Value,
}

impl Walk<'_> {
    /// `node` with a `$ref` replaced by its definition (other fields of `node` kept).
    fn resolve(&self, node: &Value) -> Value {
        // Draft 7 ignores a `$ref`'s siblings, so a described reference is `allOf: [$ref]`.
        let reference = node.get("$ref").or_else(|| match node.get("allOf") {
            Some(Value::Array(one)) if one.len() == 1 => one[0].get("$ref"),
            _ => None,
        });
        let Some(reference) = reference.and_then(Value::as_str) else {
            return node.clone();
        };
        let name = reference.trim_start_matches(&format!("#/{DEFINITIONS}/"));
        let mut resolved = self
            .schema
            .pointer(&format!("/{DEFINITIONS}/{name}"))
            .cloned()
            .unwrap_or(Value::Null);
        if let (Some(target), Some(own)) = (resolved.as_object_mut(), node.as_object()) {
            for (field, value) in own {
                if field != "$ref" && field != "allOf" {
                    target.insert(field.clone(), value.clone());
                }
            }
        }
        resolved
    }

    /// The keys of an object schema, depth first; `defaults` is the object's own default
    /// when its fields carry none (a section that is not `Serialize`).
    fn object(&self, prefix: &str, node: &Value, defaults: Option<&Value>, keys: &mut Vec<Key>) {
        let Some(properties) = node.get("properties").and_then(Value::as_object) else {
            return;
        };
        let required: Vec<&str> = (node.get("required").and_then(Value::as_array))
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut leaves = Vec::new();
        let mut sections = Vec::new();
        for (name, property) in properties {
            let path = format!("{prefix}{name}");
            let property = self.resolve(property);
            let default = property
                .get("default")
                .or_else(|| defaults.and_then(|d| d.get(name)))
                .filter(|value| !value.is_null())
                .cloned();
            if property.get("properties").is_some() {
                sections.push((path, property, default));
            } else if let Some(item) = self.object_items(&property) {
                leaves.push(Key {
                    path: path.clone(),
                    schema: property.clone(),
                    default,
                    required: required.contains(&name.as_str()),
                    section: false,
                });
                sections.push((format!("{path}[]"), item, None));
            } else {
                leaves.push(Key {
                    path,
                    schema: property,
                    default,
                    required: required.contains(&name.as_str()),
                    section: false,
                });
            }
        }
        keys.extend(leaves);
        for (path, property, default) in sections {
            keys.push(Key {
                path: path.clone(),
                schema: property.clone(),
                default: default.clone(),
                required: false,
                section: true,
            });
            self.object(&format!("{path}."), &property, default.as_ref(), keys);
        }
    }

    /// The element schema of a list of tables.
    fn object_items(&self, node: &Value) -> Option<Value> {
        let item = self.resolve(node.get("items")?);
        item.get("properties").is_some().then_some(item)
    }
}

/// A type as a reader of the reference says it.
fn type_name(schema: &Value) -> String {
    if let Some(choices) = schema.get("oneOf").and_then(Value::as_array) {
        let names: Vec<String> = choices
            .iter()
            .filter_map(|choice| choice.get("const"))
            .map(|value| format!("`{}`", plain(value)))
            .collect();
        if names.len() == choices.len() {
            return names.join(", ");
        }
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let named: Vec<String> = any
            .iter()
            .filter(|choice| choice.get("type") != Some(&Value::from("null")))
            .map(|choice| match choice.get("$ref").and_then(Value::as_str) {
                Some(reference) => reference.rsplit('/').next().unwrap_or("").to_lowercase(),
                None => type_name(choice),
            })
            .collect();
        return named.join(" or ");
    }
    let types: Vec<&str> = match schema.get("type") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect(),
        _ => Vec::new(),
    };
    let names: Vec<String> = types
        .iter()
        .map(|t| match *t {
            "integer" => match schema.get("minimum").and_then(Value::as_f64) {
                Some(min) if min >= 0.0 => "integer ≥ 0".to_string(),
                _ => "integer".to_string(),
            },
            "number" => "number".to_string(),
            "array" => match schema.get("items") {
                Some(items) if items.get("$ref").is_some() || items.get("properties").is_some() => {
                    "list of tables".to_string()
                }
                Some(items) => format!("list of {}", type_name(items)),
                None => "list".to_string(),
            },
            "object" => "table".to_string(),
            other => other.to_string(),
        })
        .collect();
    if names.is_empty() {
        "string".to_string()
    } else {
        names.join(" or ")
    }
}

/// A value as TOML-ish text: strings bare, lists bracketed.
fn plain(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// A default for a table cell.
fn default_cell(key: &Key) -> String {
    match &key.default {
        None if key.required => "required".to_string(),
        None => "unset".to_string(),
        Some(Value::String(text)) if text.is_empty() => "`\"\"`".to_string(),
        Some(Value::Array(items)) if items.is_empty() => "`[]`".to_string(),
        Some(value) => format!("`{}`", plain(value)),
    }
}

/// A doc comment as one table cell: lines joined, Rust paths and pipes made readable.
fn description(schema: &Value) -> String {
    let text = schema
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut out = String::new();
    for paragraph in text.split("\n\n") {
        if !out.is_empty() {
            out.push_str("<br><br>");
        }
        out.push_str(&paragraph.split('\n').collect::<Vec<_>>().join(" "));
    }
    // Intra-doc links name Rust items: a pointer to one is for the code's readers; the
    // text of any other is kept.
    let out = drop_between(&out, " See [`", "`].");
    let out = drop_between(&out, " (see [`", "`])");
    let mut readable = String::with_capacity(out.len());
    let mut rest = out.as_str();
    while let Some(start) = rest.find("[`") {
        let Some(end) = rest[start..].find("`]") else {
            break;
        };
        readable.push_str(&rest[..start]);
        readable.push_str(&rest[start + 1..start + end + 1]);
        rest = &rest[start + end + 2..];
    }
    readable.push_str(rest);
    readable.replace('|', "\\|")
}

/// `text` without each run from `start` to the first `end` after it (both included).
fn drop_between(text: &str, start: &str, end: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(start) {
        let Some(length) = rest[at..].find(end) else {
            break;
        };
        out.push_str(&rest[..at]);
        rest = &rest[at + length + end.len()..];
    }
    out.push_str(rest);
    out
}

/// The environment variable of a key (none inside lists).
fn env_name(path: &str) -> Option<String> {
    if path.contains("[]") {
        return None;
    }
    let keys: Vec<String> = path.split('.').map(str::to_ascii_uppercase).collect();
    Some(format!(
        "{ENV_PREFIX}{ENV_SEPARATOR}{}",
        keys.join(ENV_SEPARATOR)
    ))
}

/// `docs/configuration.md`.
pub fn markdown() -> String {
    let keys = keys();
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from the configuration types (src/config.rs and the sections' own types) \
         by `UPDATE_GENERATED=1 cargo test --lib config::reference`; a test fails when this file \
         differs. Edit the doc comments, not this file. -->\n\n\
         `spark-pod-allocator serve --config FILE` reads a TOML (`.toml`) or YAML (`.yaml`, \
         `.yml`) file; every key is optional. Sources, last wins: the defaults below, the \
         file, then environment variables named `SPARK_POD_ALLOCATOR__` and the key's path in \
         capitals with `__` between sections, e.g. `SPARK_POD_ALLOCATOR__KUBERNETES__QPS=100` \
         for `kubernetes.qps` (lists in the environment are comma-separated: \
         `allowed_namespaces`, `auth.audiences`, `auth.admin_groups`). An unknown key or a \
         value that breaks a rule stops start-up with a message naming the key.\n\n\
         The Helm chart passes its `config` value through as this file, so every key below \
         is set there under `config:` with the same name (see \
         [the chart's README](../helm/spark-pod-allocator/README.md)).\n\n\
         Durations are in milliseconds (keys ending in `_ms`). \"unset\" means the key has no \
         value unless given one; the description says what then holds.\n",
    );
    let mut section_rows = |title: &str, intro: &str, rows: &[&Key]| {
        out.push_str(&format!("\n## {title}\n\n"));
        if !intro.is_empty() {
            out.push_str(&intro.replace("<br><br>", "\n\n").replace("\\|", "|"));
            out.push_str("\n\n");
        }
        out.push_str("| Key | Type | Default | Description |\n|---|---|---|---|\n");
        for key in rows {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                key.path,
                type_name(&key.schema),
                default_cell(key),
                description(&key.schema)
            ));
        }
    };
    let top: Vec<&Key> = keys
        .iter()
        .filter(|key| !key.section && !key.path.contains('.'))
        .collect();
    section_rows("Top-level keys", "", &top);
    for section in keys.iter().filter(|key| key.section) {
        let prefix = format!("{}.", section.path);
        let rows: Vec<&Key> = keys
            .iter()
            .filter(|key| {
                !key.section
                    && key
                        .path
                        .strip_prefix(&prefix)
                        .is_some_and(|rest| !rest.contains('.'))
            })
            .collect();
        let mut intro = description(&section.schema);
        if let Some(env) = env_name(&section.path) {
            intro.push_str(&format!(
                "<br><br>Environment: `{env}{ENV_SEPARATOR}<KEY>`."
            ));
        } else {
            intro
                .push_str("<br><br>Each element of the list is a table of these keys (file only).");
        }
        section_rows(&format!("`{}`", section.path), &intro, &rows);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn repository_file(relative: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
    }

    /// Writes `text` to `relative` under `UPDATE_GENERATED=1`, else fails if it differs.
    fn check_generated(relative: &str, text: &str) {
        let path = repository_file(relative);
        if std::env::var_os("UPDATE_GENERATED").is_some() {
            std::fs::write(&path, text).expect("write the generated file");
            return;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            on_disk == text,
            "{relative} is not what the configuration types give: run \
             `UPDATE_GENERATED=1 cargo test --lib config::reference` and commit the result"
        );
    }

    #[test]
    fn the_configuration_reference_is_generated_from_the_types() {
        check_generated("docs/configuration.md", &markdown());
    }

    #[test]
    fn the_chart_schema_holds_the_configuration_types() {
        let relative = "helm/spark-pod-allocator/values.schema.json";
        let current = std::fs::read_to_string(repository_file(relative)).expect("the chart schema");
        let generated = chart_values_schema(&current).expect("root definitions, last");
        let parsed: Value = serde_json::from_str(&generated).expect("JSON");
        assert_eq!(
            parsed.pointer("/properties/config/$ref"),
            Some(&Value::from("#/definitions/Settings"))
        );
        check_generated(relative, &generated);
    }

    #[test]
    fn every_key_the_binary_accepts_is_in_the_reference_with_its_default() {
        let reference = markdown();
        let keys = keys();
        for key in &keys {
            assert!(
                reference.contains(&format!("`{}`", key.path)),
                "{} is not in the reference",
                key.path
            );
            let described = key.schema.get("description").and_then(Value::as_str);
            assert!(
                described.is_some_and(|text| !text.trim().is_empty()),
                "{} has no doc comment to say what it does",
                key.path
            );
        }
        // Keys the tests of this module set: the walk finds sections, lists of tables and
        // keys the serialiser leaves out.
        let default_of = |path: &str| {
            let key = keys.iter().find(|key| key.path == path);
            key.unwrap_or_else(|| panic!("{path} not walked"))
                .default
                .clone()
        };
        assert_eq!(default_of("kubernetes.qps"), Some(Value::from(1_000_000)));
        assert_eq!(default_of("listen"), Some(Value::from("127.0.0.1:50051")));
        assert_eq!(default_of("allocation.budget_weight"), None);
        assert_eq!(default_of("allocation.min_executors_at_once"), None);
        assert_eq!(default_of("simulator.kubelet.nodes"), Some(Value::from(10)));
        assert_eq!(
            default_of("pod_policy.max_claim_size"),
            Some(Value::from("1Ti"))
        );
        assert_eq!(default_of("log.format"), Some(Value::from("text")));
        assert!(keys.iter().any(|key| key.path == "budgets[].namespace"));
        assert!(keys.iter().all(|key| !key.path.contains("loaded_template")));
    }

    #[test]
    fn every_walked_key_is_accepted_by_the_loader() {
        // Each key set to its default, one at a time, in a YAML file: the loader knows it.
        for key in keys() {
            let (false, Some(default)) = (key.section || key.path.contains("[]"), &key.default)
            else {
                continue;
            };
            let mut value = default.clone();
            for part in key.path.rsplit('.') {
                let mut map = Map::new();
                map.insert(part.to_string(), value);
                value = Value::Object(map);
            }
            let file = tempfile::Builder::new()
                .suffix(".yaml")
                .tempfile()
                .expect("temp file");
            std::fs::write(file.path(), serde_yaml::to_string(&value).expect("yaml"))
                .expect("write");
            Settings::load_with_env(Some(file.path()), Some(Default::default()))
                .unwrap_or_else(|e| panic!("{}: {e}", key.path));
        }
    }
}
