//! The verbs of every resource: create, get, list (with continue tokens), update, patch,
//! delete (graceful, with preconditions), delete-collection, and pod binding and conditions.

use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use http::StatusCode;
use serde_json::{Value, json};

use super::shared::{Query, Shared, json_response, parse_u64, value_response};
use crate::objects::{self, PatchType, now_rfc3339};
use crate::selector::{FieldSelector, LabelSelector, Selector};
use crate::status::ApiError;
use crate::store::{Deletion, Kind, Store, Stored};
use crate::table::{IncludeObject, table as printed_table};

pub(super) fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(body).or_else(|json_err| {
        // kubectl and most clients send JSON; YAML is accepted as a convenience.
        serde_yaml::from_slice::<Value>(body).map_err(|_| {
            ApiError::bad_request(format!(
                "the object provided is unrecognized (must be JSON): {json_err}"
            ))
        })
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be a JSON object)",
        ));
    }
    Ok(v)
}

fn check_type(kind: Kind, obj: &Value) -> Result<(), ApiError> {
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && av != kind.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({})",
            kind.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str)
        && k != kind.kind()
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            kind.kind()
        )));
    }
    if obj.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request("metadata must be an object"));
    }
    Ok(())
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

pub(super) fn create(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    mut obj: Value,
    faults_apply: bool,
) -> Result<Response, ApiError> {
    check_type(kind, &obj)?;
    if kind.namespaced()
        && let Some(body_ns) = meta_str(&obj, "namespace")
        && body_ns != ns
    {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let fixed = meta_str(&obj, "name").map(str::to_string);
    let generate = meta_str(&obj, "generateName").map(str::to_string);
    let (mut name_for, generated): (Box<dyn FnMut() -> String + '_>, bool) = match (fixed, generate)
    {
        (Some(name), _) => (Box::new(move || name.clone()), false),
        (None, Some(prefix)) => (
            Box::new(move || format!("{prefix}{}", sh.name_suffix())),
            true,
        ),
        (None, None) => {
            return Err(objects::invalid_error(
                kind,
                "",
                vec![crate::status::Cause {
                    reason: "FieldValueRequired",
                    field: "metadata.name".into(),
                    message: "Required value: name or generateName is required".into(),
                }],
            ));
        }
    };
    let probe = name_for();
    objects::check_schema(kind, &obj)?;
    let causes = objects::validate(kind, &obj, &probe);
    if !causes.is_empty() {
        return Err(objects::invalid_error(kind, &probe, causes));
    }
    if kind.namespaced() && !sh.store.namespace_exists(ns) {
        return Err(ApiError::not_found("namespaces", "", ns));
    }
    let uid = sh.uid();
    let now = now_rfc3339();
    if faults_apply && kind == Kind::Pod {
        let faults = sh.faults();
        if faults.quota_fraction > 0.0 || faults.lost_create_fraction > 0.0 {
            let roll = sh.roll();
            if roll < faults.quota_fraction {
                return Err(ApiError::exceeded_quota(
                    &probe,
                    sh.store.count(Kind::Pod, Some(ns)),
                ));
            }
            if roll < faults.quota_fraction + faults.lost_create_fraction {
                let rv = sh.store.burn_resource_version();
                objects::prepare_create(kind, &mut obj, ns, &probe, &uid, &now);
                obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                return Ok(value_response(StatusCode::CREATED, &obj));
            }
        }
    }
    let mut first = Some(probe);
    let stored = sh.store.create(
        kind,
        ns,
        || first.take().unwrap_or_else(&mut name_for),
        generated,
        |name| {
            objects::prepare_create(kind, &mut obj, ns, name, &uid, &now);
            obj
        },
    )?;
    Ok(json_response(StatusCode::CREATED, stored.json))
}

pub(super) fn get(sh: &Shared, kind: Kind, ns: &str, name: &str) -> Result<Response, ApiError> {
    sh.store
        .get(kind, ns, name)
        .map(|s| json_response(StatusCode::OK, s.json))
        .ok_or_else(|| ApiError::not_found(kind.plural(), kind.group(), name))
}

pub(super) fn selector_of(kind: Kind, q: &Query) -> Result<Selector, ApiError> {
    Ok(Selector {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?,
        fields: FieldSelector::parse(
            q.get("fieldSelector").map(String::as_str).unwrap_or(""),
            kind.field_labels(),
        )?,
    })
}

fn list_kind(kind: Kind) -> String {
    format!("{}List", kind.kind())
}

/// A `continue` token: the list's version and the last key returned, hex-encoded.
fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    format!("{rv}/{ns}/{name}")
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn decode_continue(token: &str) -> Option<(u64, String, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..token.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok())
        .collect();
    let text = String::from_utf8(bytes?).ok()?;
    let mut parts = text.splitn(3, '/');
    let rv = parts.next()?.parse().ok()?;
    Some((rv, parts.next()?.to_string(), parts.next()?.to_string()))
}

pub(super) fn list(
    sh: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &Query,
    table: Option<IncludeObject>,
) -> Result<Response, ApiError> {
    let sel = selector_of(kind, q)?;
    let limit = parse_u64(q, "limit")?.unwrap_or(0) as usize;
    let rv_param = parse_u64(q, "resourceVersion")?;
    if q.get("resourceVersionMatch").is_some_and(|m| m == "Exact")
        && let Some(rv) = rv_param
        && rv < sh.store.compacted()
    {
        return Err(ApiError::expired(format!(
            "too old resource version: {rv} ({})",
            sh.store.compacted() + 1
        )));
    }
    let cont = match q.get("continue").filter(|c| !c.is_empty()) {
        None => None,
        Some(token) => {
            let (rv, cns, cname) = decode_continue(token)
                .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
            if rv < sh.store.compacted() {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
                ));
            }
            Some((rv, (cns, cname)))
        }
    };
    let (items, store_rv, more) =
        sh.store
            .list(kind, ns, cont.as_ref().map(|(_, k)| k), limit, |v| {
                sel.is_empty() || sel.matches(v)
            });
    let list_rv = cont.as_ref().map(|(rv, _)| *rv).unwrap_or(store_rv);
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if more && let Some(last) = items.last() {
        let lns = last
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("");
        let lname = last
            .value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        meta["continue"] = Value::String(encode_continue(list_rv, lns, lname));
    }
    if let Some(include) = table {
        let values: Vec<&Value> = items.iter().map(|s| &*s.value).collect();
        return Ok(value_response(
            StatusCode::OK,
            &printed_table(kind, &values, include, meta),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        list_body(kind, &meta, items.iter().map(|s| &s.json)),
    ))
}

fn list_body<'a>(kind: Kind, meta: &Value, items: impl Iterator<Item = &'a Bytes>) -> Bytes {
    let mut out = BytesMut::with_capacity(256);
    out.extend_from_slice(
        format!(
            "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{meta},\"items\":[",
            list_kind(kind),
            kind.api_version()
        )
        .as_bytes(),
    );
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.extend_from_slice(b",");
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    out.freeze()
}

/// Applies the API server's rules to a proposed new state of an object: immutable system
/// metadata, resourceVersion precondition, status only through `/status`, validation.
fn finish_update(
    kind: Kind,
    sub: Option<&str>,
    current: &Value,
    mut proposed: Value,
) -> Result<Value, ApiError> {
    let name = current
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if !proposed.is_object() || proposed.get("metadata").is_some_and(|m| !m.is_object()) {
        return Err(ApiError::bad_request(
            "the object provided is unrecognized (must be a JSON object)",
        ));
    }
    check_type(kind, &proposed)?;
    if let Some(n) = meta_str(&proposed, "name")
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    let current_rv = current
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(rv) = meta_str(&proposed, "resourceVersion")
        && rv != current_rv
    {
        return Err(ApiError::conflict(kind.plural(), kind.group(), &name));
    }
    if sub == Some("status") {
        let mut next = current.clone();
        next["status"] = proposed.get("status").cloned().unwrap_or_else(|| json!({}));
        if !next["status"].is_object() {
            return Err(ApiError::bad_request("status must be an object"));
        }
        objects::check_schema(kind, &next)?;
        return Ok(next);
    }
    proposed["kind"] = Value::String(kind.kind().to_string());
    proposed["apiVersion"] = Value::String(kind.api_version().to_string());
    if proposed.get("metadata").is_none() {
        proposed["metadata"] = json!({});
    }
    for system in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match current.pointer(&format!("/metadata/{system}")) {
            Some(v) => proposed["metadata"][system] = v.clone(),
            None => {
                if let Some(m) = proposed["metadata"].as_object_mut() {
                    m.remove(system);
                }
            }
        }
    }
    if kind == Kind::Pod {
        proposed["status"] = current.get("status").cloned().unwrap_or_else(|| json!({}));
        check_pod_spec_update(current, &proposed, &name)?;
    }
    if kind == Kind::Namespace {
        proposed["status"] = current.get("status").cloned().unwrap_or(Value::Null);
    }
    if kind == Kind::ConfigMap {
        check_config_map_update(current, &proposed, &name)?;
    }
    if proposed.get("spec") != current.get("spec")
        && let Some(g) = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
    {
        proposed["metadata"]["generation"] = json!(g + 1);
    }
    let causes = objects::validate(kind, &proposed, &name);
    if !causes.is_empty() {
        return Err(objects::invalid_error(kind, &name, causes));
    }
    objects::check_schema(kind, &proposed)?;
    Ok(proposed)
}

/// A pod's spec is immutable except container images (and scheduling gates, not modelled).
fn check_pod_spec_update(current: &Value, proposed: &Value, name: &str) -> Result<(), ApiError> {
    let strip = |v: &Value| {
        let mut spec = v.get("spec").cloned().unwrap_or(Value::Null);
        if let Some(cs) = spec.get_mut("containers").and_then(Value::as_array_mut) {
            for c in cs {
                if let Some(c) = c.as_object_mut() {
                    c.remove("image");
                }
            }
        }
        spec
    };
    if strip(current) != strip(proposed) {
        return Err(objects::invalid_error(
            Kind::Pod,
            name,
            vec![crate::status::Cause {
                reason: "FieldValueForbidden",
                field: "spec".into(),
                message: "Forbidden: pod updates may not change fields other than `spec.containers[*].image`".into(),
            }],
        ));
    }
    Ok(())
}

/// A ConfigMap marked `immutable: true` keeps its data, binaryData and the mark itself.
fn check_config_map_update(current: &Value, proposed: &Value, name: &str) -> Result<(), ApiError> {
    if current.get("immutable") != Some(&Value::Bool(true)) {
        return Ok(());
    }
    let causes: Vec<crate::status::Cause> = ["immutable", "data", "binaryData"]
        .into_iter()
        .filter(|field| current.get(*field) != proposed.get(*field))
        .map(|field| crate::status::Cause {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: "Forbidden: field is immutable when `immutable` is set".into(),
        })
        .collect();
    if causes.is_empty() {
        Ok(())
    } else {
        Err(objects::invalid_error(Kind::ConfigMap, name, causes))
    }
}

pub(super) fn replace(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    body: &[u8],
) -> Result<Response, ApiError> {
    let proposed = parse_object(body)?;
    let stored = sh.store.update(
        kind,
        ns,
        name,
        Box::new(|cur| finish_update(kind, sub, cur, proposed).map(Some)),
    )?;
    Ok(json_response(StatusCode::OK, stored.json))
}

pub(super) fn patch(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    ct: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let patch_type = PatchType::from_content_type(ct)?;
    let patch = patch_type.parse(body)?;
    if patch_type == PatchType::Apply && sub.is_none() && sh.store.get(kind, ns, name).is_none() {
        let mut obj = patch;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the object provided is unrecognized (must be an object)",
            ));
        }
        if obj.get("metadata").is_none_or(|m| !m.is_object()) {
            obj["metadata"] = json!({});
        }
        obj["metadata"]["name"] = Value::String(name.to_string());
        return create(sh, kind, if kind.namespaced() { ns } else { "" }, obj, true)
            .map(|r| (StatusCode::CREATED, r).into_response());
    }
    let stored = sh.store.update(
        kind,
        ns,
        name,
        Box::new(|cur| {
            let proposed = patch_type.apply(cur, &patch)?;
            finish_update(kind, sub, cur, proposed).map(Some)
        }),
    )?;
    Ok(json_response(StatusCode::OK, stored.json))
}

/// `DeleteOptions` as sent in a DELETE body or query.
struct DeleteOptions {
    grace: Option<i64>,
    uid: Option<String>,
    resource_version: Option<String>,
}

fn delete_options(q: &Query, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions {
        grace: None,
        uid: None,
        resource_version: None,
    };
    if let Some(g) = q.get("gracePeriodSeconds") {
        opts.grace = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
        );
    }
    if !body.iter().all(u8::is_ascii_whitespace) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("unable to decode DeleteOptions: {e}")))?;
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            opts.grace = Some(g);
        }
        opts.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        opts.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    Ok(opts)
}

fn check_preconditions(
    kind: Kind,
    name: &str,
    obj: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let uid = obj
        .pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(want) = &opts.uid
        && want != uid
    {
        return Err(ApiError::conflict_message(
            kind.plural(),
            kind.group(),
            name,
            format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
        ));
    }
    let rv = obj
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(want) = &opts.resource_version
        && want != rv
    {
        return Err(ApiError::conflict_message(
            kind.plural(),
            kind.group(),
            name,
            format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {rv}"
            ),
        ));
    }
    Ok(())
}

/// Deletes one object with the real server's rules; returns its last state.
pub(crate) fn delete_object(
    store: &Store,
    kind: Kind,
    ns: &str,
    name: &str,
    opts_grace: Option<i64>,
    check: impl FnOnce(&Value) -> Result<(), ApiError>,
) -> Result<(Stored, bool), ApiError> {
    if kind == Kind::Namespace {
        if ["default", "kube-system", "kube-public"].contains(&name) {
            return Err(ApiError::forbidden(
                "namespaces",
                "",
                name,
                "this namespace may not be deleted".into(),
            ));
        }
        return store.delete_namespace(name).map(|s| (s, true));
    }
    store.delete(kind, ns, name, |cur| {
        check(cur)?;
        if kind == Kind::Pod {
            Ok(objects::pod_deletion(cur, opts_grace, &now_rfc3339()))
        } else {
            Ok(Deletion::Now(None))
        }
    })
}

pub(super) fn delete(
    sh: &Shared,
    kind: Kind,
    ns: &str,
    name: &str,
    q: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let opts = delete_options(q, body)?;
    let (stored, _) = delete_object(&sh.store, kind, ns, name, opts.grace, |cur| {
        check_preconditions(kind, name, cur, &opts)
    })?;
    if matches!(kind, Kind::Pod | Kind::Namespace) {
        return Ok(json_response(StatusCode::OK, stored.json));
    }
    let mut details = json!({"name": name, "kind": kind.plural(), "uid": stored.uid()});
    if !kind.group().is_empty() {
        details["group"] = Value::String(kind.group().to_string());
    }
    Ok(value_response(
        StatusCode::OK,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
    ))
}

pub(super) fn delete_collection(
    sh: &Shared,
    kind: Kind,
    ns: Option<&str>,
    q: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let sel = selector_of(kind, q)?;
    let opts = delete_options(q, body)?;
    let (items, _, _) = sh.store.list(kind, ns, None, 0, |v| sel.matches(v));
    let mut deleted = Vec::with_capacity(items.len());
    for item in items {
        let ins = item
            .value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let iname = item
            .value
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        // The object may have changed since the list: re-check the selector under the lock.
        match delete_object(&sh.store, kind, &ins, &iname, opts.grace, |cur| {
            if sel.matches(cur) {
                Ok(())
            } else {
                Err(ApiError::no_route())
            }
        }) {
            Ok((stored, _)) => deleted.push(stored.json),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    let meta = json!({"resourceVersion": sh.store.resource_version().to_string()});
    Ok(json_response(
        StatusCode::OK,
        list_body(kind, &meta, deleted.iter()),
    ))
}

pub(super) fn bind(sh: &Shared, ns: &str, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let binding = parse_object(body)?;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if node.is_empty() {
        return Err(objects::invalid_error(
            Kind::Pod,
            name,
            vec![crate::status::Cause {
                reason: "FieldValueRequired",
                field: "target.name".into(),
                message: "Required value".into(),
            }],
        ));
    }
    bind_pod(&sh.store, ns, name, &node)?;
    Ok(value_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

/// Binds a pod to a node as `pods/binding` does (also used by the simulated scheduler).
pub(crate) fn bind_pod(
    store: &Store,
    ns: &str,
    name: &str,
    node: &str,
) -> Result<Stored, ApiError> {
    store.update(
        Kind::Pod,
        ns,
        name,
        Box::new(|cur| {
            if cur.pointer("/metadata/deletionTimestamp").is_some() {
                return Err(ApiError::conflict_message(
                    "pods",
                    "",
                    name,
                    "pod is being deleted, cannot be assigned to a host".into(),
                ));
            }
            if let Some(existing) = cur
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict_message(
                    "pods",
                    "",
                    name,
                    format!("pod {name} is already assigned to node \"{existing}\""),
                ));
            }
            let mut next = cur.clone();
            next["spec"]["nodeName"] = Value::String(node.to_string());
            set_condition(&mut next, "PodScheduled", "True", None, None);
            Ok(Some(next))
        }),
    )
}

/// Sets (or replaces) one pod condition.
pub(crate) fn set_condition(
    pod: &mut Value,
    kind: &str,
    status: &str,
    reason: Option<&str>,
    message: Option<&str>,
) {
    let mut cond = json!({"type": kind, "status": status, "lastProbeTime": null, "lastTransitionTime": now_rfc3339()});
    if let Some(r) = reason {
        cond["reason"] = Value::String(r.to_string());
    }
    if let Some(m) = message {
        cond["message"] = Value::String(m.to_string());
    }
    if !pod.get("status").is_some_and(Value::is_object) {
        pod["status"] = json!({});
    }
    let conditions = pod["status"]
        .as_object_mut()
        .map(|s| s.entry("conditions").or_insert_with(|| json!([])));
    if let Some(Value::Array(list)) = conditions {
        match list
            .iter_mut()
            .find(|c| c.get("type").and_then(Value::as_str) == Some(kind))
        {
            Some(existing) => {
                if existing.get("status") == cond.get("status") {
                    cond["lastTransitionTime"] = existing
                        .get("lastTransitionTime")
                        .cloned()
                        .unwrap_or(Value::Null);
                }
                *existing = cond;
            }
            None => list.push(cond),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "default", "exec-1");
        assert_eq!(
            decode_continue(&t),
            Some((42, "default".into(), "exec-1".into()))
        );
        assert_eq!(decode_continue("zz"), None);
    }
}
