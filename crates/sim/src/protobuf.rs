//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`), as kubectl sends for
//! `create namespace` and `create configmap`: the Kubernetes envelope (the 4-byte magic
//! `k8s\0` then a `runtime.Unknown` whose `raw` is the object's message), decoded into
//! the JSON the rest of the server works on. Only Namespace and ConfigMap are understood
//! (their metadata: name, generateName, namespace, labels, annotations, ownerReferences,
//! finalizers; a ConfigMap's data, binaryData and immutable).

use std::collections::BTreeMap;

use base64::Engine;
use prost::Message;
use serde_json::{Map, Value, json};

use super::status::ApiError;
use super::store::Kind;

/// The media type of Kubernetes protobuf bodies.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", optional, tag = "2")]
    raw: Option<Vec<u8>>,
    #[prost(string, optional, tag = "3")]
    content_encoding: Option<String>,
    #[prost(string, optional, tag = "4")]
    content_type: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct OwnerReference {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    api_version: Option<String>,
    #[prost(bool, optional, tag = "6")]
    controller: Option<bool>,
    #[prost(bool, optional, tag = "7")]
    block_owner_deletion: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    generate_name: Option<String>,
    #[prost(string, optional, tag = "3")]
    namespace: Option<String>,
    #[prost(btree_map = "string, string", tag = "11")]
    labels: BTreeMap<String, String>,
    #[prost(btree_map = "string, string", tag = "12")]
    annotations: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "13")]
    owner_references: Vec<OwnerReference>,
    #[prost(string, repeated, tag = "14")]
    finalizers: Vec<String>,
}

/// `v1.Namespace`; its spec and status are left out (the server sets both).
#[derive(Clone, PartialEq, Message)]
struct Namespace {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

#[derive(Clone, PartialEq, Message)]
struct ConfigMap {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(btree_map = "string, string", tag = "2")]
    data: BTreeMap<String, String>,
    #[prost(btree_map = "string, bytes", tag = "3")]
    binary_data: BTreeMap<String, Vec<u8>>,
    #[prost(bool, optional, tag = "4")]
    immutable: Option<bool>,
}

/// Whether a `Content-Type` is the Kubernetes protobuf media type.
pub(crate) fn is_protobuf(content_type: &str) -> bool {
    content_type.split(';').next().unwrap_or("").trim() == MEDIA_TYPE
}

/// Whether protobuf bodies of this kind can be decoded.
pub(crate) fn understands(kind: Kind) -> bool {
    matches!(kind, Kind::Namespace | Kind::ConfigMap)
}

fn cannot_handle(kind: Kind, why: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!(
        "{} in version \"v1\" cannot be handled as a {}: {why}",
        kind.kind(),
        kind.kind()
    ))
}

/// Decodes a protobuf body of `kind` into its JSON object.
pub(crate) fn decode(kind: Kind, body: &[u8]) -> Result<Value, ApiError> {
    let envelope = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| cannot_handle(kind, "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"))?;
    let unknown = Unknown::decode(envelope).map_err(|e| cannot_handle(kind, e))?;
    if unknown
        .content_encoding
        .as_deref()
        .is_some_and(|e| !e.is_empty())
    {
        return Err(cannot_handle(kind, "content encodings are not supported"));
    }
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind_name = type_meta.kind.unwrap_or_default();
    if api_version != kind.api_version() || kind_name != kind.kind() {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({api_version}, Kind={kind_name}) does not match the expected kind ({}, Kind={})",
            kind.api_version(),
            kind.kind()
        )));
    }
    let raw = unknown.raw.unwrap_or_default();
    let mut obj = json!({"apiVersion": kind.api_version(), "kind": kind.kind()});
    match kind {
        Kind::Namespace => {
            let ns = Namespace::decode(raw.as_slice()).map_err(|e| cannot_handle(kind, e))?;
            obj["metadata"] = metadata(ns.metadata.unwrap_or_default());
        }
        Kind::ConfigMap => {
            let cm = ConfigMap::decode(raw.as_slice()).map_err(|e| cannot_handle(kind, e))?;
            obj["metadata"] = metadata(cm.metadata.unwrap_or_default());
            if !cm.data.is_empty() {
                obj["data"] = json!(cm.data);
            }
            if !cm.binary_data.is_empty() {
                let encoded: Map<String, Value> = cm
                    .binary_data
                    .into_iter()
                    .map(|(k, v)| {
                        (
                            k,
                            Value::String(base64::engine::general_purpose::STANDARD.encode(v)),
                        )
                    })
                    .collect();
                obj["binaryData"] = Value::Object(encoded);
            }
            if let Some(immutable) = cm.immutable {
                obj["immutable"] = json!(immutable);
            }
        }
        _ => {
            return Err(ApiError::unsupported_media_type(
                MEDIA_TYPE,
                "application/json, application/yaml",
            ));
        }
    }
    Ok(obj)
}

fn metadata(meta: ObjectMeta) -> Value {
    let mut out = Map::new();
    let mut put = |key: &str, value: Option<String>| {
        if let Some(v) = value.filter(|v| !v.is_empty()) {
            out.insert(key.into(), Value::String(v));
        }
    };
    put("name", meta.name);
    put("generateName", meta.generate_name);
    put("namespace", meta.namespace);
    if !meta.labels.is_empty() {
        out.insert("labels".into(), json!(meta.labels));
    }
    if !meta.annotations.is_empty() {
        out.insert("annotations".into(), json!(meta.annotations));
    }
    if !meta.owner_references.is_empty() {
        let owners: Vec<Value> = meta
            .owner_references
            .into_iter()
            .map(|o| {
                let mut r = json!({
                    "apiVersion": o.api_version.unwrap_or_default(),
                    "kind": o.kind.unwrap_or_default(),
                    "name": o.name.unwrap_or_default(),
                    "uid": o.uid.unwrap_or_default(),
                });
                if let Some(c) = o.controller {
                    r["controller"] = json!(c);
                }
                if let Some(b) = o.block_owner_deletion {
                    r["blockOwnerDeletion"] = json!(b);
                }
                r
            })
            .collect();
        out.insert("ownerReferences".into(), Value::Array(owners));
    }
    if !meta.finalizers.is_empty() {
        out.insert("finalizers".into(), json!(meta.finalizers));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        let mut out = MAGIC.to_vec();
        out.extend(unknown.encode_to_vec());
        out
    }

    #[test]
    fn a_namespace_decodes_with_its_metadata() {
        let ns = Namespace {
            metadata: Some(ObjectMeta {
                name: Some("team-a".into()),
                labels: [("env".to_string(), "test".to_string())].into(),
                ..Default::default()
            }),
        };
        let v = decode(Kind::Namespace, &envelope("Namespace", ns.encode_to_vec())).unwrap();
        assert_eq!(v["metadata"]["name"], "team-a");
        assert_eq!(v["metadata"]["labels"]["env"], "test");
        assert_eq!(v["kind"], "Namespace");
        let err = decode(Kind::Namespace, &envelope("Pod", Vec::new())).unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(decode(Kind::Namespace, b"{}").unwrap_err().code, 400);
    }
}
