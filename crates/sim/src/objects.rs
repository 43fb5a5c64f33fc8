//! What the API server does to objects besides storing them: validation (422 causes),
//! defaulting on create, the patch formats, and the pod deletion rules.

use serde_json::{Map, Value, json};

use super::quantity::quantity;
use super::selector::{is_dns_label, is_dns_subdomain};
use super::status::{ApiError, Cause};
use super::store::{Deletion, Kind};

/// The current time as the API server writes it (RFC 3339, whole seconds).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn required(field: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired",
        field: field.to_string(),
        message: "Required value".into(),
    }
}

fn invalid(field: &str, value: &str, why: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.to_string(),
        message: format!("Invalid value: \"{value}\": {why}"),
    }
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";

/// Checks the object decodes as its Kubernetes type (field types, not just JSON), as the
/// real server's decoder does: a wrongly typed field is a 400 and nothing is stored. This
/// also guarantees every stored object decodes in kube-rs clients.
pub fn check_schema(kind: Kind, obj: &Value) -> Result<(), ApiError> {
    use k8s_openapi::api::{coordination::v1::Lease, core::v1};
    let result = match kind {
        Kind::Pod => serde_json::from_value::<v1::Pod>(obj.clone()).map(drop),
        Kind::Namespace => serde_json::from_value::<v1::Namespace>(obj.clone()).map(drop),
        Kind::ConfigMap => serde_json::from_value::<v1::ConfigMap>(obj.clone()).map(drop),
        Kind::Service => serde_json::from_value::<v1::Service>(obj.clone()).map(drop),
        Kind::PersistentVolumeClaim => {
            serde_json::from_value::<v1::PersistentVolumeClaim>(obj.clone()).map(drop)
        }
        Kind::Lease => serde_json::from_value::<Lease>(obj.clone()).map(drop),
        Kind::Secret => serde_json::from_value::<v1::Secret>(obj.clone()).map(drop),
        Kind::ResourceQuota => serde_json::from_value::<v1::ResourceQuota>(obj.clone()).map(drop),
        Kind::Node => serde_json::from_value::<v1::Node>(obj.clone()).map(drop),
    };
    result.map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"v1\" cannot be handled as a {}: {e}",
            kind.kind(),
            kind.kind()
        ))
    })
}

/// Field-level problems of an object about to be stored (empty when valid).
pub fn validate(kind: Kind, obj: &Value, name: &str) -> Vec<Cause> {
    let mut causes = Vec::new();
    let (name_ok, name_msg) = match kind {
        Kind::Namespace => (is_dns_label(name), LABEL_MSG),
        Kind::Service => (
            is_dns_label(name) && name.starts_with(|c: char| c.is_ascii_lowercase()),
            DNS1035_MSG,
        ),
        _ => (is_dns_subdomain(name), SUBDOMAIN_MSG),
    };
    if !name_ok {
        causes.push(invalid("metadata.name", name, name_msg));
    }
    if let Some(labels) = obj.pointer("/metadata/labels") {
        match labels.as_object() {
            Some(map) => {
                for (k, v) in map {
                    if super::selector::validate_key(k).is_err() {
                        causes.push(invalid("metadata.labels", k, "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
                    }
                    match v.as_str() {
                        Some(s) if s.len() <= 63 && LabelValue(s).ok() => {}
                        _ => causes.push(invalid("metadata.labels", &v.to_string(), "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")),
                    }
                }
            }
            None => causes.push(invalid(
                "metadata.labels",
                &labels.to_string(),
                "must be a map of strings",
            )),
        }
    }
    match kind {
        Kind::Pod => validate_pod_spec(obj, &mut causes),
        Kind::Service => validate_service_spec(obj, &mut causes),
        Kind::PersistentVolumeClaim => validate_claim_spec(obj, &mut causes),
        _ => {}
    }
    causes
}

const DNS1035_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";

/// A Service: a known type, and ports (1..=65535, known protocol) unless
/// headless (`clusterIP: None`) or `ExternalName`.
fn validate_service_spec(obj: &Value, causes: &mut Vec<Cause>) {
    let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
    let service_type = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&service_type) {
        causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: "spec.type".into(),
            message: format!("Unsupported value: \"{service_type}\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""),
        });
    }
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && !headless && service_type != "ExternalName" {
        causes.push(required("spec.ports"));
    }
    for (i, port) in ports.iter().enumerate() {
        let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&number) {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                field: format!("spec.ports[{i}].port"),
                message: format!("Invalid value: {number}: must be between 1 and 65535, inclusive"),
            });
        }
        let protocol = port
            .get("protocol")
            .and_then(Value::as_str)
            .unwrap_or("TCP");
        if !["TCP", "UDP", "SCTP"].contains(&protocol) {
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                field: format!("spec.ports[{i}].protocol"),
                message: format!("Unsupported value: \"{protocol}\": supported values: \"SCTP\", \"TCP\", \"UDP\""),
            });
        }
    }
}

/// A PersistentVolumeClaim needs at least one access mode and a storage request.
fn validate_claim_spec(obj: &Value, causes: &mut Vec<Cause>) {
    let modes = obj
        .pointer("/spec/accessModes")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if modes == 0 {
        causes.push(Cause {
            reason: "FieldValueRequired",
            field: "spec.accessModes".into(),
            message: "Required value: at least 1 access mode is required".into(),
        });
    }
    if obj.pointer("/spec/resources/requests/storage").is_none() {
        causes.push(Cause {
            reason: "FieldValueRequired",
            field: "spec.resources[storage]".into(),
            message: "Required value".into(),
        });
    }
}

struct LabelValue<'a>(&'a str);

impl LabelValue<'_> {
    fn ok(&self) -> bool {
        let v = self.0;
        v.is_empty()
            || (v
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
    }
}

fn validate_pod_spec(obj: &Value, causes: &mut Vec<Cause>) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        causes.push(required("spec.containers"));
        return;
    };
    let containers = spec.get("containers").and_then(Value::as_array);
    match containers {
        None => causes.push(required("spec.containers")),
        Some(list) if list.is_empty() => causes.push(required("spec.containers")),
        Some(list) => {
            let mut seen = std::collections::HashSet::new();
            for (i, c) in list.iter().enumerate() {
                let cname = c.get("name").and_then(Value::as_str).unwrap_or("");
                if cname.is_empty() {
                    causes.push(required(&format!("spec.containers[{i}].name")));
                } else if !is_dns_label(cname) {
                    causes.push(invalid(
                        &format!("spec.containers[{i}].name"),
                        cname,
                        LABEL_MSG,
                    ));
                } else if !seen.insert(cname.to_string()) {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        field: format!("spec.containers[{i}].name"),
                        message: format!("Duplicate value: \"{cname}\""),
                    });
                }
                if c.get("image")
                    .and_then(Value::as_str)
                    .is_none_or(|s| s.trim().is_empty())
                {
                    causes.push(required(&format!("spec.containers[{i}].image")));
                }
            }
        }
    }
    if let Some(policy) = spec.get("restartPolicy").and_then(Value::as_str)
        && !["Always", "OnFailure", "Never"].contains(&policy)
    {
        causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: "spec.restartPolicy".into(),
            message: format!("Unsupported value: \"{policy}\": supported values: \"Always\", \"OnFailure\", \"Never\""),
        });
    }
}

/// The pod's QoS class, computed from its containers' requests and limits.
pub fn qos_class(spec: &Value) -> &'static str {
    let containers = spec
        .get("containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in &containers {
        let requests = c.pointer("/resources/requests").and_then(Value::as_object);
        let limits = c.pointer("/resources/limits").and_then(Value::as_object);
        if requests.is_some_and(|r| !r.is_empty()) || limits.is_some_and(|l| !l.is_empty()) {
            any = true;
        }
        for res in ["cpu", "memory"] {
            let limit = limits.and_then(|l| l.get(res)).and_then(quantity);
            let request = requests
                .and_then(|r| r.get(res))
                .and_then(quantity)
                .or(limit);
            match (limit, request) {
                (Some(l), Some(r)) if (l - r).abs() < f64::EPSILON * l.abs().max(1.0) => {}
                _ => guaranteed = false,
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// The object's metadata map, created when missing (`None` only for a non-object value).
fn meta_mut(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    let map = obj.as_object_mut()?;
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), json!({}));
    }
    map.get_mut("metadata").and_then(Value::as_object_mut)
}

/// Completes a new object as the API server does on create: system metadata, defaults, and
/// for pods a fresh `Pending` status (a client cannot create a pod with a status).
pub fn prepare_create(kind: Kind, obj: &mut Value, ns: &str, name: &str, uid: &str, now: &str) {
    obj["kind"] = Value::String(kind.kind().to_string());
    obj["apiVersion"] = Value::String(kind.api_version().to_string());
    let Some(meta) = meta_mut(obj) else { return };
    meta.insert("name".into(), Value::String(name.to_string()));
    if kind.namespaced() {
        meta.insert("namespace".into(), Value::String(ns.to_string()));
    } else {
        meta.remove("namespace");
    }
    meta.insert("uid".into(), Value::String(uid.to_string()));
    meta.insert("creationTimestamp".into(), Value::String(now.to_string()));
    for system in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
    ] {
        meta.remove(system);
    }
    if kind != Kind::Namespace {
        meta.insert("generation".into(), json!(1));
    }
    match kind {
        Kind::Pod => default_pod(obj, now),
        Kind::Namespace => {
            if let Some(meta) = meta_mut(obj) {
                let labels = meta.entry("labels").or_insert_with(|| json!({}));
                if let Some(l) = labels.as_object_mut() {
                    l.insert(
                        "kubernetes.io/metadata.name".into(),
                        Value::String(name.to_string()),
                    );
                }
            }
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        Kind::Service => default_service(obj, uid),
        Kind::PersistentVolumeClaim => bind_claim(obj, uid),
        Kind::Secret => default_secret(obj),
        Kind::ConfigMap | Kind::Lease | Kind::ResourceQuota | Kind::Node => {}
    }
}

/// A claim bound at once, as a dynamic provisioner with `volumeBindingMode: Immediate`
/// leaves it: a volume `pvc-<uid>` named in its spec, its status Bound with the access
/// modes and the capacity it asked for (no PersistentVolume object is made).
fn bind_claim(obj: &mut Value, uid: &str) {
    let volume = format!("pvc-{uid}");
    let spec = &mut obj["spec"];
    let Some(s) = spec.as_object_mut() else {
        return;
    };
    s.entry("volumeMode").or_insert(json!("Filesystem"));
    s.entry("volumeName").or_insert(json!(volume));
    let modes = s.get("accessModes").cloned().unwrap_or(json!([]));
    let storage = s
        .get("resources")
        .and_then(|r| r.get("requests"))
        .and_then(|r| r.get("storage"))
        .cloned();
    let mut status = json!({"phase": "Bound", "accessModes": modes});
    if let Some(storage) = storage {
        status["capacity"] = json!({"storage": storage});
    }
    obj["status"] = status;
}

/// A Secret's defaults as the real registry fills them: `type: Opaque`, and `stringData`
/// folded into `data` (base64), never stored itself.
fn default_secret(obj: &mut Value) {
    use base64::Engine as _;
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    map.entry("type").or_insert(json!("Opaque"));
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    if !map.get("data").is_some_and(Value::is_object) {
        map.insert("data".into(), json!({}));
    }
    if let Some(data) = map.get_mut("data").and_then(Value::as_object_mut) {
        for (key, value) in strings {
            let text = value.as_str().unwrap_or_default();
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            data.insert(key, Value::String(encoded));
        }
    }
}

/// A Service's defaults as the real registry fills them: `ClusterIP` type with an address
/// allocated from the service range (here derived from the uid), single-stack IPv4, and
/// per port `protocol: TCP` and `targetPort` = `port`.
fn default_service(obj: &mut Value, uid: &str) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        obj["status"] = json!({"loadBalancer": {}});
        return;
    };
    let service_type = spec
        .entry("type")
        .or_insert(json!("ClusterIP"))
        .as_str()
        .unwrap_or("ClusterIP")
        .to_string();
    spec.entry("sessionAffinity").or_insert(json!("None"));
    if service_type != "ExternalName" {
        let digits: Vec<u8> = uid
            .bytes()
            .filter(u8::is_ascii_hexdigit)
            .take(4)
            .map(|b| (b as char).to_digit(16).unwrap_or(0) as u8)
            .collect();
        let (a, b) = match digits.as_slice() {
            [w, x, y, z, ..] => (w * 16 + x, (y * 16 + z).max(1)),
            _ => (0, 1),
        };
        let ip = spec
            .entry("clusterIP")
            .or_insert(json!(format!("10.96.{a}.{b}")))
            .clone();
        spec.entry("clusterIPs").or_insert(json!([ip]));
        spec.entry("ipFamilies").or_insert(json!(["IPv4"]));
        spec.entry("ipFamilyPolicy").or_insert(json!("SingleStack"));
        spec.entry("internalTrafficPolicy")
            .or_insert(json!("Cluster"));
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for port in ports.iter_mut().filter_map(Value::as_object_mut) {
            port.entry("protocol").or_insert(json!("TCP"));
            if let Some(number) = port.get("port").cloned() {
                port.entry("targetPort").or_insert(number);
            }
        }
    }
    obj["status"] = json!({"loadBalancer": {}});
}

fn default_pod(obj: &mut Value, _now: &str) {
    let spec = &mut obj["spec"];
    let defaults = [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ];
    if let Some(s) = spec.as_object_mut() {
        for (k, v) in defaults {
            s.entry(k).or_insert(v);
        }
    }
    if let Some(containers) = spec.get_mut("containers").and_then(Value::as_array_mut) {
        for c in containers {
            let image = c
                .get("image")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let tag_latest =
                !image.rsplit('/').next().unwrap_or("").contains(':') || image.ends_with(":latest");
            if let Some(c) = c.as_object_mut() {
                c.entry("imagePullPolicy").or_insert(json!(if tag_latest {
                    "Always"
                } else {
                    "IfNotPresent"
                }));
                c.entry("terminationMessagePath")
                    .or_insert(json!("/dev/termination-log"));
                c.entry("terminationMessagePolicy").or_insert(json!("File"));
                c.entry("resources").or_insert(json!({}));
            }
        }
    }
    let qos = qos_class(&obj["spec"]);
    obj["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// RFC 7386 merge patch, extended like a strategic merge patch for lists of objects that
/// carry a merge key (`name`, or `type` for conditions): such lists merge element-wise.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, pv) in p {
                if pv.is_null() {
                    t.remove(k);
                    continue;
                }
                match t.get_mut(k) {
                    Some(tv) => strategic_merge(tv, pv),
                    None => {
                        let mut fresh = Value::Null;
                        strategic_merge(&mut fresh, pv);
                        t.insert(k.clone(), fresh);
                    }
                }
            }
        }
        (Value::Array(t), Value::Array(p)) => {
            let key = ["name", "type", "containerPort"].into_iter().find(|key| {
                !p.is_empty() && p.iter().chain(t.iter()).all(|e| e.get(key).is_some())
            });
            match key {
                Some(key) => {
                    for pe in p {
                        match t.iter_mut().find(|te| te.get(key) == pe.get(key)) {
                            Some(te) => strategic_merge(te, pe),
                            None => t.push(pe.clone()),
                        }
                    }
                }
                None => *t = p.clone(),
            }
        }
        (t, p) => {
            if p.is_object() {
                *t = json!({});
                strategic_merge(t, p);
            } else {
                *t = p.clone();
            }
        }
    }
}

/// The patch formats a real API server accepts, by `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply, approximated).
    Apply,
}

impl PatchType {
    /// The patch type of a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Result<PatchType, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchType::Apply),
            other => Err(ApiError::unsupported_media_type(
                other,
                "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml",
            )),
        }
    }

    /// Parses the body of this patch type.
    pub fn parse(self, body: &[u8]) -> Result<Value, ApiError> {
        let parsed = match self {
            PatchType::Apply => serde_yaml::from_slice::<Value>(body).map_err(|e| e.to_string()),
            _ => serde_json::from_slice::<Value>(body).map_err(|e| e.to_string()),
        };
        parsed.map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))
    }

    /// Applies a parsed patch to a copy of `current`.
    pub fn apply(self, current: &Value, patch: &Value) -> Result<Value, ApiError> {
        let mut out = current.clone();
        match self {
            PatchType::Merge => json_patch::merge(&mut out, patch),
            PatchType::Strategic | PatchType::Apply => strategic_merge(&mut out, patch),
            PatchType::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                    .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
                json_patch::patch(&mut out, &ops).map_err(|e| ApiError {
                    code: 422,
                    reason: "Invalid",
                    message: format!(
                        "the server rejected our request due to an error in our request: {e}"
                    ),
                    details: None,
                    retry_after: None,
                    plain_text: false,
                })?;
            }
        }
        Ok(out)
    }
}

/// Whether a pod is bound to a node.
pub fn is_bound(pod: &Value) -> bool {
    pod.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
}

/// The pod's phase (`Pending` when unset).
pub fn phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("Pending")
}

/// The pod deletion rules of the real registry: an unbound or finished pod goes at once
/// (MODIFIED with `deletionTimestamp`, then DELETED); a bound one gets `deletionTimestamp`
/// and a grace period and waits for its kubelet; `gracePeriodSeconds: 0` removes at once;
/// a second delete may only shorten the grace period.
pub fn pod_deletion(pod: &Value, requested_grace: Option<i64>, now: &str) -> Deletion {
    let default_grace = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    let mut grace = requested_grace.unwrap_or(default_grace).max(0);
    if !is_bound(pod) || matches!(phase(pod), "Succeeded" | "Failed") {
        grace = 0;
    }
    let existing = pod
        .pointer("/metadata/deletionGracePeriodSeconds")
        .and_then(Value::as_i64);
    let already = pod.pointer("/metadata/deletionTimestamp").is_some();
    if already && existing.is_some_and(|e| e <= grace) {
        return Deletion::Unchanged;
    }
    let mut marked = pod.clone();
    let Some(meta) = meta_mut(&mut marked) else {
        return Deletion::Now(None);
    };
    if !already || grace == 0 {
        // The real registry stamps the moment the grace period ends.
        let at = now
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|t| t.checked_add(jiff::SignedDuration::from_secs(grace)).ok())
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
            .unwrap_or_else(|| now.to_string());
        meta.insert("deletionTimestamp".into(), Value::String(at));
    }
    meta.insert("deletionGracePeriodSeconds".into(), json!(grace));
    if grace == 0 {
        Deletion::Now(Some(marked))
    } else {
        Deletion::Graceful(marked)
    }
}

/// Builds a 422 Invalid for a kind from causes (helper for handlers).
pub fn invalid_error(kind: Kind, name: &str, causes: Vec<Cause>) -> ApiError {
    ApiError::invalid(kind.kind(), kind.plural(), kind.group(), name, causes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qos_class_follows_requests_and_limits() {
        assert_eq!(
            qos_class(&json!({"containers": [{"name": "a"}]})),
            "BestEffort"
        );
        let guaranteed =
            json!({"containers": [{"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&guaranteed), "Guaranteed");
        let mixed = json!({"containers": [{"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&mixed), "Burstable");
        let equal_units = json!({"containers": [{"resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}]});
        assert_eq!(qos_class(&equal_units), "Guaranteed");
    }

    #[test]
    fn strategic_merge_merges_conditions_by_type_and_containers_by_name() {
        let mut status = json!({"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]});
        strategic_merge(
            &mut status,
            &json!({"conditions": [{"type": "Ready", "status": "True"}]}),
        );
        assert_eq!(status["conditions"].as_array().map(Vec::len), Some(2));
        assert_eq!(status["conditions"][0]["status"], "True");
        let mut plain = json!({"args": ["a", "b"]});
        strategic_merge(&mut plain, &json!({"args": ["c"]}));
        assert_eq!(plain["args"], json!(["c"]));
    }

    #[test]
    fn pod_deletion_depends_on_binding_and_phase() {
        let unbound =
            json!({"metadata": {"name": "p"}, "spec": {}, "status": {"phase": "Running"}});
        assert!(matches!(
            pod_deletion(&unbound, None, "t"),
            Deletion::Now(Some(_))
        ));
        let bound = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n", "terminationGracePeriodSeconds": 7}, "status": {"phase": "Running"}});
        match pod_deletion(&bound, None, "t") {
            Deletion::Graceful(v) => assert_eq!(v["metadata"]["deletionGracePeriodSeconds"], 7),
            _ => panic!("a bound running pod is deleted gracefully"),
        }
        assert!(matches!(
            pod_deletion(&bound, Some(0), "t"),
            Deletion::Now(Some(_))
        ));
        let finished = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Failed"}});
        assert!(matches!(
            pod_deletion(&finished, None, "t"),
            Deletion::Now(Some(_))
        ));
        let pending_delete = json!({"metadata": {"name": "p", "deletionTimestamp": "t", "deletionGracePeriodSeconds": 30}, "spec": {"nodeName": "n"}});
        assert!(matches!(
            pod_deletion(&pending_delete, Some(60), "t"),
            Deletion::Unchanged
        ));
        assert!(matches!(
            pod_deletion(&pending_delete, Some(5), "t"),
            Deletion::Graceful(_)
        ));
    }

    #[test]
    fn validation_lists_every_bad_field() {
        let causes = validate(Kind::Pod, &json!({"spec": {"containers": []}}), "Bad_Name");
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["metadata.name", "spec.containers"]);
        let causes = validate(
            Kind::Pod,
            &json!({"spec": {"containers": [{"name": "c"}]}}),
            "ok",
        );
        assert_eq!(causes[0].field, "spec.containers[0].image");
    }
}
