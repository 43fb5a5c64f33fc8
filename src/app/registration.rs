//! An application's registration as kept in Kubernetes, so a restarted service resumes
//! every application by itself: what Start asked for (effective settings, templates of
//! every profile, including those added later), the targets and the executors registered
//! with the driver. Stored as JSON under the data key [`REGISTRATION_KEY`] of a ConfigMap
//! in the service's own namespace ([`RegistrationStore`]), signed with the service's key.
//!
//! A registration decides where pods are created and for whom, so a restarted service
//! trusts one only when it is the service's own: signed with its key (HMAC-SHA256), kept
//! under the name and labels of the namespace and application it names, in an allowed
//! namespace ([`open`]). Both defences, because they stop different writers: the
//! service's namespace keeps tenants out entirely (they cannot write there, and the
//! service no longer lists ConfigMaps in theirs), and the signature refuses a registration
//! written or edited by anyone else who can write ConfigMaps in the service's namespace
//! (an edited owner, a planted application, a copy under another application's name).
//!
//! The signature (its "proof") also covers the uid of the ConfigMap it is kept in. A
//! ConfigMap created again from a copy (a namespace backup restored after the
//! application's Stop deleted it, a saved manifest applied again), even with the same
//! name, labels and data, has another uid and is not resumed: Stop's delete revokes it.
use std::collections::{BTreeMap, BTreeSet};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ring::hmac;
use serde::{Deserialize, Serialize};

use super::{AppId, StartApplication};
use crate::allocator::{AllocationSettings, ExecutorId, ResourceProfileId};
#[cfg(doc)]
use crate::k8s::registrations::REGISTRATION_KEY;
use crate::k8s::registrations::{RegistrationStore, SigningKey, StoredRegistration};

/// What an earlier version's signature (bound to no object) is over begins with this, so
/// a MAC made with the key for anything else is never a registration's.
const SIGNED_CONTEXT: &[u8] = b"spark-pod-allocator registration v1";

/// What a proof is over begins with this: never the same bytes as a signature's.
const PROVEN_CONTEXT: &[u8] = b"spark-pod-allocator registration v2 bound to its object";

/// What a restarted service needs to resume an application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub app_id: String,
    pub namespace: String,
    pub driver_pod_name: Option<String>,
    pub pod_name_prefix: Option<String>,
    /// The effective settings, in their serde form (the JSON of every earlier version:
    /// the same names, durations in milliseconds; `policy` absent before it existed).
    #[serde(deserialize_with = "settings_of_any_version")]
    pub settings: AllocationSettings,
    /// Pod templates per resource profile.
    pub templates: BTreeMap<i32, Pod>,
    pub targets: BTreeMap<i32, u32>,
    /// Executors registered with the driver.
    pub registered: BTreeSet<u64>,
    /// The identity that started the application (absent: started unauthenticated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// Per-executor claim templates (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<PersistentVolumeClaim>,
}

/// Settings as any version wrote them: a key this version does not know (a setting a
/// newer replica added, read by an older one during a rolling update or a rollback) is
/// logged and left out, and the application resumes with the settings it knows. The
/// configuration file's `[allocation]` refuses unknown keys instead: there a typo is the
/// operator's to fix.
fn settings_of_any_version<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<AllocationSettings, D::Error> {
    let mut written = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)?;
    let known = match serde_json::to_value(AllocationSettings::default()) {
        Ok(serde_json::Value::Object(known)) => known,
        _ => serde_json::Map::new(),
    };
    written.retain(|key, _| {
        let keep = known.contains_key(key);
        if !keep {
            tracing::warn!(setting = %key, "a registration's setting unknown to this version is left out");
        }
        keep
    });
    // Versions that wrote no policy ran every application with Spark's pacing, whatever
    // the default is now: a resumed application keeps the pacing it started with.
    written
        .entry("policy")
        .or_insert_with(|| serde_json::Value::from("spark"));
    serde_json::from_value(serde_json::Value::Object(written)).map_err(serde::de::Error::custom)
}

impl Registration {
    /// The registration of a Start request, before any target.
    pub fn of_start(req: &StartApplication) -> Self {
        Self {
            app_id: req.app_id.to_string(),
            namespace: req.namespace.clone(),
            driver_pod_name: req.driver_pod_name.clone(),
            pod_name_prefix: req.pod_name_prefix.clone(),
            settings: req.settings.clone(),
            templates: req
                .templates
                .iter()
                .map(|(p, t)| (p.0, t.clone()))
                .collect(),
            targets: BTreeMap::new(),
            registered: BTreeSet::new(),
            owner: req.owner.clone(),
            claims: req.claims.clone(),
        }
    }

    /// The Start request that resumes it; an invalid application id is an error.
    pub fn start_request(&self) -> Result<StartApplication, String> {
        // A ConfigMap is outside input: its settings get the checks a Start request gets.
        let settings = self.settings.clone();
        settings.validate().map_err(|e| format!("settings: {e}"))?;
        Ok(StartApplication {
            app_id: AppId::parse(&self.app_id).map_err(|e| format!("app_id: {e}"))?,
            namespace: self.namespace.clone(),
            driver_pod_name: self.driver_pod_name.clone(),
            templates: self
                .templates
                .iter()
                .map(|(p, t)| (ResourceProfileId(*p), t.clone()))
                .collect(),
            pod_name_prefix: self.pod_name_prefix.clone(),
            settings,
            owner: self.owner.clone(),
            claims: self.claims.clone(),
        })
    }

    /// The stored targets.
    pub fn targets(&self) -> BTreeMap<ResourceProfileId, u32> {
        self.targets
            .iter()
            .map(|(p, t)| (ResourceProfileId(*p), *t))
            .collect()
    }

    /// The stored registered executors.
    pub fn registered(&self) -> BTreeSet<ExecutorId> {
        self.registered.iter().map(|id| ExecutorId(*id)).collect()
    }
}

/// Why a stored registration is not resumed; [`Refusal::reason`] labels the metric.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No registration or no signature in the ConfigMap.
    #[error("it is not signed")]
    Unsigned,
    /// The signature is not the service's over this namespace, application and JSON.
    #[error("its signature does not match (written or edited by someone else, or moved)")]
    BadSignature,
    /// Its ConfigMap's name or labels are not those of the application it names.
    #[error("it is not where its application's registration is kept: {0}")]
    Misplaced(String),
    /// Its proof was made for another object than its ConfigMap: a copy written back (after
    /// its application's Stop deleted the original, or from a backup).
    #[error(
        "its proof was made for the ConfigMap of uid {proven}, not this one ({actual}): a copy \
         written back after its application's Stop or restored from a backup"
    )]
    Replayed { proven: String, actual: String },
    /// Signed by an earlier version without a proof, in a ConfigMap created after proofs
    /// began: a copy written back.
    #[error(
        "it has an earlier version's signature but no proof, and its ConfigMap was created \
         ({created}) after this version's first start ({since}): a copy written back"
    )]
    Unproven { created: String, since: String },
    /// Signed, but its JSON does not decode (a registration of another version).
    #[error("it does not decode: {0}")]
    Unreadable(String),
    /// Its namespace is not in `allowed_namespaces`.
    #[error("namespace {0} is not allowed by this service")]
    NamespaceNotAllowed(String),
    /// Its application id or settings break the rules a Start is held to.
    #[error("{0}")]
    Invalid(String),
    /// A template breaks the pod policy (`pod_policy`).
    #[error("a template breaks the pod policy: {0}")]
    PodPolicy(String),
}

impl Refusal {
    /// The `reason` label of `registrations_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unsigned => "unsigned",
            Self::BadSignature => "bad_signature",
            Self::Replayed { .. } => "replayed",
            Self::Unproven { .. } => "unproven",
            Self::Misplaced(_) => "misplaced",
            Self::Unreadable(_) => "unreadable",
            Self::NamespaceNotAllowed(_) => "namespace_not_allowed",
            Self::Invalid(_) => "invalid",
            Self::PodPolicy(_) => "pod_policy",
        }
    }
}

/// The registration `stored` holds, if the service may resume it: proven with `key` over
/// its labels' namespace and application id, its ConfigMap's uid and its JSON (checked
/// first, before the JSON is parsed), kept under the name of that namespace and
/// application, naming them itself, in a namespace `app` allows. A record of
/// an earlier version, signed over all but the uid, is trusted only in a ConfigMap created
/// no later than [`SigningKey::proofs_since`] (then written again with a proof).
pub fn open(
    stored: &StoredRegistration,
    key: &SigningKey,
    app: &super::AppSettings,
) -> Result<Registration, Refusal> {
    let Some(json) = &stored.json else {
        return Err(Refusal::Unsigned);
    };
    let (Some(namespace), Some(app_id)) = (&stored.namespace_label, &stored.app_label) else {
        return Err(Refusal::Misplaced(
            "its application namespace or id label is missing".into(),
        ));
    };
    let decode = |mac: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(mac)
            .map_err(|_| Refusal::BadSignature)
    };
    // The MAC first; then where it is kept; then whether it is the object it was made for.
    let bound = match (&stored.proof, &stored.proof_uid, &stored.signature) {
        (Some(proof), Some(proven), _) => {
            let bytes = mac_bytes(PROVEN_CONTEXT, &[namespace, app_id, proven, json]);
            hmac::verify(key.key(), &bytes, &decode(proof)?).map_err(|_| Refusal::BadSignature)?;
            Ok(proven)
        }
        (None, None, Some(signature)) => {
            let bytes = mac_bytes(SIGNED_CONTEXT, &[namespace, app_id, json]);
            hmac::verify(key.key(), &bytes, &decode(signature)?)
                .map_err(|_| Refusal::BadSignature)?;
            Err(())
        }
        (Some(_), None, _) | (None, Some(_), _) => return Err(Refusal::BadSignature),
        (None, None, None) => return Err(Refusal::Unsigned),
    };
    let expected = RegistrationStore::config_map_name(namespace, app_id);
    if stored.name != expected {
        return Err(Refusal::Misplaced(format!(
            "ConfigMap {} holds the registration of {namespace}/{app_id}, kept as {expected}",
            stored.name
        )));
    }
    let actual = stored.uid.as_deref().unwrap_or_default();
    match bound {
        Ok(proven) if proven != actual => {
            return Err(Refusal::Replayed {
                proven: proven.clone(),
                actual: actual.to_string(),
            });
        }
        Ok(_) => {}
        Err(()) => match (stored.created, key.proofs_since()) {
            (Some(created), Some(since)) if created <= since => {}
            (created, since) => {
                let show = |t: Option<k8s_openapi::jiff::Timestamp>| {
                    t.map_or_else(|| "unknown".to_string(), |t| t.to_string())
                };
                return Err(Refusal::Unproven {
                    created: show(created),
                    since: show(since),
                });
            }
        },
    }
    let registration: Registration =
        serde_json::from_str(json).map_err(|e| Refusal::Unreadable(e.to_string()))?;
    if &registration.namespace != namespace || &registration.app_id != app_id {
        return Err(Refusal::Misplaced(format!(
            "it names {}/{}, its labels {namespace}/{app_id}",
            registration.namespace, registration.app_id
        )));
    }
    if !app.allows(namespace) {
        return Err(Refusal::NamespaceNotAllowed(namespace.clone()));
    }
    Ok(registration)
}

/// What a registration's MAC covers, after `context`: its namespace and application id
/// (as its ConfigMap is labelled), for a proof the uid of the ConfigMap it was made for,
/// and its JSON exactly as stored (so no re-encoding can change what was signed, and it
/// is checked before the JSON is parsed); each length-prefixed so no two lists give the
/// same bytes. The JSON holds everything else that decides what a resume does: the owner,
/// the driver pod name, settings, templates, targets.
fn mac_bytes(context: &[u8], parts: &[&str]) -> Vec<u8> {
    let len = parts.iter().map(|p| 8 + p.len()).sum::<usize>();
    let mut bytes = Vec::with_capacity(context.len() + len);
    bytes.extend_from_slice(context);
    for part in parts {
        bytes.extend_from_slice(&u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
        bytes.extend_from_slice(part.as_bytes());
    }
    bytes
}

/// The base64 proof of `json` for `namespace`/`app_id` kept in the ConfigMap of `uid`.
fn proof(key: &hmac::Key, namespace: &str, app_id: &str, uid: &str, json: &str) -> String {
    let bytes = mac_bytes(PROVEN_CONTEXT, &[namespace, app_id, uid, json]);
    base64::engine::general_purpose::STANDARD.encode(hmac::sign(key, &bytes).as_ref())
}

impl Registration {
    /// Its JSON and the base64 proof of it under `key` for the ConfigMap of `uid`
    /// ([`open`] checks them).
    pub fn seal(&self, key: &hmac::Key, uid: &str) -> Result<(String, String), serde_json::Error> {
        let json = serde_json::to_string(self)?;
        let proof = proof(key, &self.namespace, &self.app_id, uid, &json);
        Ok((json, proof))
    }

    /// Writes it in `store`, proven for the ConfigMap it lands in; a failure is logged
    /// (the caller writes it again later) and is `Err`.
    pub async fn write_to(&self, store: &RegistrationStore) -> Result<(), ()> {
        let key = store.signing_key().await.map_err(|err| {
            tracing::warn!(error = %err, "cannot sign the application's registration; not written");
        })?;
        let json = serde_json::to_string(self).map_err(|err| {
            tracing::error!(error = %err, "cannot encode the application's registration");
        })?;
        let prove = |uid: &str| proof(key.key(), &self.namespace, &self.app_id, uid, &json);
        store
            .write(&self.namespace, &self.app_id, &json, prove)
            .await
            .map_err(drop)
    }
}

#[cfg(test)]
mod tests;
