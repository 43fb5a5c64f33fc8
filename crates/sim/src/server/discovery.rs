//! Discovery: the version, API group and resource lists, and the minimal OpenAPI v3
//! documents kubectl reads before it sends anything.

use serde_json::{Value, json};

use crate::store::Kind;

/// The discovery document at `segs` (for a GET), if the path is one.
pub(super) fn document(segs: &[&str], address: &str) -> Option<Value> {
    Some(match segs {
        ["version"] => version(),
        ["api"] => api_versions(address),
        ["apis"] => api_groups(),
        ["apis", "coordination.k8s.io"] => coordination_group(),
        ["api", "v1"] => resource_list(""),
        ["apis", "coordination.k8s.io", "v1"] => resource_list("coordination.k8s.io"),
        ["openapi", "v3"] => openapi_v3_index(),
        ["openapi", "v3", "api", "v1"] => openapi_v3_group(""),
        ["openapi", "v3", "apis", "coordination.k8s.io", "v1"] => {
            openapi_v3_group("coordination.k8s.io")
        }
        _ => return None,
    })
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "33", "gitVersion": "v1.33.0-sim", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24.0", "compiler": "gc",
        "platform": "linux/amd64"
    })
}

fn api_versions(address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}]})
}

fn coordination_group() -> Value {
    json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": "coordination.k8s.io",
        "versions": [{"groupVersion": "coordination.k8s.io/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "coordination.k8s.io/v1", "version": "v1"}
    })
}

fn api_groups() -> Value {
    let mut group = coordination_group();
    if let Some(g) = group.as_object_mut() {
        g.remove("kind");
        g.remove("apiVersion");
    }
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})
}

/// The OpenAPI v3 index kubectl reads to learn which group versions are described.
fn openapi_v3_index() -> Value {
    json!({"paths": {
        "api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=sim"},
        "apis/coordination.k8s.io/v1": {"serverRelativeURL": "/openapi/v3/apis/coordination.k8s.io/v1?hash=sim"}
    }})
}

/// A minimal OpenAPI v3 document for one group version: only the PATCH operations with
/// their group-version-kind and the `fieldValidation` parameter, which is what kubectl
/// checks to choose server-side validation. No schemas are published.
fn openapi_v3_group(group: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
        let prefix = if group.is_empty() {
            "/api/v1".to_string()
        } else {
            format!("/apis/{group}/v1")
        };
        let path = if kind.namespaced() {
            format!(
                "{prefix}/namespaces/{{namespace}}/{}/{{name}}",
                kind.plural()
            )
        } else {
            format!("{prefix}/{}/{{name}}", kind.plural())
        };
        let op = json!({
            "operationId": format!("patch{}", kind.kind()),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": "v1", "kind": kind.kind()},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
            ],
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(path, json!({"patch": op}));
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": paths, "components": {}})
}

fn resource_list(group: &str) -> Value {
    let verbs = json!([
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch"
    ]);
    let mut resources = Vec::new();
    for kind in Kind::ALL.into_iter().filter(|k| k.group() == group) {
        let mut r = json!({
            "name": kind.plural(), "singularName": kind.kind().to_lowercase(), "namespaced": kind.namespaced(),
            "kind": kind.kind(), "verbs": verbs, "shortNames": kind.short_names(),
            "storageVersionHash": ""
        });
        if kind == Kind::Pod {
            r["categories"] = json!(["all"]);
            resources.push(r);
            resources.push(json!({"name": "pods/status", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get", "patch", "update"]}));
            resources.push(json!({"name": "pods/binding", "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]}));
        } else {
            if kind == Kind::Service {
                r["categories"] = json!(["all"]);
            }
            if kind == Kind::Namespace {
                r["verbs"] = json!([
                    "create", "delete", "get", "list", "patch", "update", "watch"
                ]);
            }
            resources.push(r);
        }
    }
    let group_version = if group.is_empty() {
        "v1".to_string()
    } else {
        format!("{group}/v1")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources})
}
