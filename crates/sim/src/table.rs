//! Server-side printing: the `meta.k8s.io/v1` Table kubectl asks for (`Accept: ...;as=Table`),
//! so `kubectl get pods` shows READY, STATUS, RESTARTS and AGE (and `kubectl get nodes`
//! STATUS, ROLES, AGE and VERSION) as against a real cluster.

use serde_json::{Value, json};

use crate::store::Kind;

/// Whether the server prints `kind` as a Table (the kinds kubectl users look at).
pub fn printed(kind: Kind) -> bool {
    matches!(kind, Kind::Pod | Kind::Node)
}

/// A Table of `objects` of `kind` (one of [`printed`]) with kubectl's columns.
pub fn table(kind: Kind, objects: &[&Value], include: IncludeObject, metadata: Value) -> Value {
    match kind {
        Kind::Node => node_table(objects, include, metadata),
        _ => pod_table(objects, include, metadata),
    }
}

/// What each row carries besides its cells (`includeObject`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// From the `includeObject` query parameter.
    pub fn parse(v: Option<&str>) -> IncludeObject {
        match v {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        }
    }
}

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table") && first.contains("g=meta.k8s.io"))
}

fn column(name: &str, format: &str, priority: u8, description: &str) -> Value {
    json!({"name": name, "type": "string", "format": format, "description": description, "priority": priority})
}

/// Age as kubectl prints it (`42s`, `5m3s`, `3h`, `2d`).
pub fn human_age(created: &str) -> String {
    let Ok(ts) = created.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn pod_cells(pod: &Value) -> Vec<Value> {
    let statuses = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let total = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let ready = statuses
        .iter()
        .filter(|s| s.get("ready").and_then(Value::as_bool) == Some(true))
        .count();
    let restarts: i64 = statuses
        .iter()
        .filter_map(|s| s.get("restartCount").and_then(Value::as_i64))
        .sum();
    let mut status = pod
        .pointer("/status/reason")
        .and_then(Value::as_str)
        .unwrap_or_else(|| {
            pod.pointer("/status/phase")
                .and_then(Value::as_str)
                .unwrap_or("Pending")
        })
        .to_string();
    for s in &statuses {
        if let Some(r) = s
            .pointer("/state/waiting/reason")
            .and_then(Value::as_str)
            .filter(|r| *r != "PodInitializing")
        {
            status = r.to_string();
        } else if let Some(r) = s
            .pointer("/state/terminated/reason")
            .and_then(Value::as_str)
        {
            status = r.to_string();
        }
    }
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        status = "Terminating".into();
    }
    let text = |p: &str| {
        pod.pointer(p)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or("<none>")
            .to_string()
    };
    vec![
        json!(
            pod.pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("")
        ),
        json!(format!("{ready}/{total}")),
        json!(status),
        json!(restarts.to_string()),
        json!(human_age(
            pod.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("")
        )),
        json!(text("/status/podIP")),
        json!(text("/spec/nodeName")),
        json!(text("/status/nominatedNodeName")),
        json!("<none>"),
    ]
}

fn row_object(obj: &Value, include: IncludeObject) -> Value {
    match include {
        IncludeObject::None => Value::Null,
        IncludeObject::Object => obj.clone(),
        IncludeObject::Metadata => json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        }),
    }
}

/// A Table of pods with kubectl's columns.
pub fn pod_table(pods: &[&Value], include: IncludeObject, metadata: Value) -> Value {
    let columns = vec![
        column("Name", "name", 0, "Name must be unique within a namespace."),
        column(
            "Ready",
            "",
            0,
            "The aggregate readiness state of this pod for accepting traffic.",
        ),
        column(
            "Status",
            "",
            0,
            "The aggregate status of the containers in this pod.",
        ),
        column(
            "Restarts",
            "",
            0,
            "The number of times the containers in this pod have been restarted.",
        ),
        column("Age", "", 0, "CreationTimestamp of the object."),
        column("IP", "", 1, "IP address allocated to the pod."),
        column("Node", "", 1, "Name of the node the pod is assigned to."),
        column(
            "Nominated Node",
            "",
            1,
            "Node the pod is nominated to by the scheduler.",
        ),
        column("Readiness Gates", "", 1, "Readiness gates of the pod."),
    ];
    let rows: Vec<Value> = pods
        .iter()
        .map(|p| {
            let mut row = json!({"cells": pod_cells(p)});
            let obj = row_object(p, include);
            if !obj.is_null() {
                row["object"] = obj;
            }
            row
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns, "rows": rows})
}

fn node_cells(node: &Value) -> Vec<Value> {
    let text = |p: &str| node.pointer(p).and_then(Value::as_str).unwrap_or("");
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"));
    let mut status = match ready.and_then(|c| c["status"].as_str()) {
        Some("True") => "Ready".to_string(),
        Some(_) => "NotReady".to_string(),
        None => "Unknown".to_string(),
    };
    if node.pointer("/spec/unschedulable") == Some(&Value::Bool(true)) {
        status.push_str(",SchedulingDisabled");
    }
    let mut roles: Vec<&str> = node
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|labels| {
            labels
                .keys()
                .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default();
    roles.sort_unstable();
    let roles = if roles.is_empty() {
        "<none>".to_string()
    } else {
        roles.join(",")
    };
    vec![
        json!(text("/metadata/name")),
        json!(status),
        json!(roles),
        json!(human_age(text("/metadata/creationTimestamp"))),
        json!(text("/status/nodeInfo/kubeletVersion")),
    ]
}

/// A Table of nodes with kubectl's columns.
fn node_table(nodes: &[&Value], include: IncludeObject, metadata: Value) -> Value {
    let columns = vec![
        column("Name", "name", 0, "Name must be unique within a namespace."),
        column("Status", "", 0, "The status of the node"),
        column("Roles", "", 0, "The roles of the node"),
        column("Age", "", 0, "CreationTimestamp of the object."),
        column("Version", "", 0, "Kubelet Version reported by the node."),
    ];
    let rows: Vec<Value> = nodes
        .iter()
        .map(|n| {
            let mut row = json!({"cells": node_cells(n)});
            let obj = row_object(n, include);
            if !obj.is_null() {
                row["object"] = obj;
            }
            row
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_rows_show_what_kubectl_shows() {
        let pod = json!({
            "metadata": {"name": "p", "creationTimestamp": "2020-01-01T00:00:00Z", "deletionTimestamp": null},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}], "nodeName": "sim-node-1"},
            "status": {"phase": "Pending", "containerStatuses": [
                {"ready": true, "restartCount": 1, "state": {"running": {}}},
                {"ready": false, "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}
        });
        let cells = pod_cells(&pod);
        assert_eq!(cells[0], "p");
        assert_eq!(cells[1], "1/2");
        assert_eq!(cells[3], "1");
        assert!(cells[4].as_str().unwrap().ends_with('d'));
        assert_eq!(cells[6], "sim-node-1");
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
    }

    #[test]
    fn node_rows_show_status_roles_and_version_as_kubectl_does() {
        let mut node = crate::nodes::node_object(0, 110, "2020-01-01T00:00:00Z");
        node["metadata"]["creationTimestamp"] = json!("2020-01-01T00:00:00Z");
        let cells = node_cells(&node);
        assert_eq!(
            cells[..3],
            [json!("sim-node-0"), json!("Ready"), json!("<none>")]
        );
        assert_eq!(cells[4], "v1.33.0-sim");
        node["spec"]["unschedulable"] = json!(true);
        node["metadata"]["labels"]["node-role.kubernetes.io/worker"] = json!("");
        node["status"]["conditions"][0]["status"] = json!("False");
        let cells = node_cells(&node);
        assert_eq!(cells[1], "NotReady,SchedulingDisabled");
        assert_eq!(cells[2], "worker");
    }
}
