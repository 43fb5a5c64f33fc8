//! Where the applications' registrations are kept ([`RegistrationStore`]): one ConfigMap
//! per application in the service's OWN namespace (`registrations.namespace`), never in
//! the application's, and the HMAC key that signs them, a Secret beside them
//! (`registrations.key_secret`). What a registration holds and how it is signed and
//! checked is the application layer's (`app::registration`); this module only stores the bytes.
//!
//! Why both the own namespace and a signature: tenants cannot write in the service's
//! namespace (RBAC), so a ConfigMap planted by a driver in its own namespace is never even
//! listed, and the service needs no LIST of ConfigMaps in tenant namespaces. The
//! signature covers what RBAC does not: anyone else who may write ConfigMaps in the
//! service's namespace (another controller, an operator's typo, a copy moved to another
//! application's name) cannot write or edit a registration the service will resume.
//!
//! The signature (the "proof") also covers the uid of the ConfigMap it was written to, so
//! a copy written back after the application's Stop deleted it (a namespace backup
//! restored, a saved manifest applied again) is a new object with a new uid and is not
//! resumed. A record an earlier version signed without a uid is resumed only when its
//! ConfigMap is older than the proofs' marker ([`PROOFS_MARKER`]).
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ListParams, ObjectMeta, PostParams};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::Deserialize;
use tokio::sync::OnceCell;

use super::client::{ApiClient, is_status};
use super::config_map::{MANAGED_BY, MANAGED_BY_LABEL, managed_labels};
use super::request::describe_error;
use crate::naming::{sanitize_prefix, stable_hash, truncate_label};

/// Data key of the registration (JSON) in its ConfigMap.
pub const REGISTRATION_KEY: &str = "registration";

/// Data key of the registration's proof (base64 of HMAC-SHA256 over its namespace,
/// application id, [`PROOF_UID_KEY`] and JSON) in its ConfigMap.
pub const PROOF_KEY: &str = "registration-proof";

/// Data key of the uid of the ConfigMap the proof was made for: a proof whose uid is not
/// its ConfigMap's own is a copy.
pub const PROOF_UID_KEY: &str = "registration-uid";

/// Data key of the signature earlier versions wrote instead of a proof (bound to no
/// object). A write of this version removes it.
pub const SIGNATURE_KEY: &str = "registration-signature";

/// ConfigMap in the service's namespace created by the first service that writes proofs:
/// its `creationTimestamp` (the API server's clock) tells the records an earlier version
/// wrote (resumed, then proven) from copies of them written back since (refused).
pub const PROOFS_MARKER: &str = "spark-pod-allocator.registration-proofs";

/// Label of a registration's ConfigMap naming the application's namespace (the
/// application id is in [`crate::allocator::types::APP_ID_LABEL`]).
pub const APPLICATION_NAMESPACE_LABEL: &str = "spark-pod-allocator/application-namespace";

/// Data key of the signing key in the key Secret.
pub const KEY_DATA_KEY: &str = "key";

/// Bytes of a key the service generates, and the fewest it accepts from a Secret.
pub const KEY_LEN: usize = 32;

/// Registrations listed per page.
const PAGE_SIZE: u32 = 100;

/// Where registrations are kept (the configuration's `registrations` section).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrationSettings {
    /// The service's own namespace, which holds the registrations and the key Secret.
    /// Unset: the `POD_NAMESPACE` environment variable (the chart sets it from the
    /// downward API), else `default`.
    pub namespace: Option<String>,
    /// Name of the Secret (in `namespace`) whose data key `key` holds the signing key, at
    /// least 32 bytes. Created with 32 random bytes when missing.
    pub key_secret: String,
}

impl Default for RegistrationSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            key_secret: "spark-pod-allocator-registration-key".to_string(),
        }
    }
}

impl RegistrationSettings {
    /// The namespace in use: `namespace`, else `default`.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }

    /// The rule a value breaks, as (key under `registrations.`, reason).
    pub fn check(&self) -> Result<(), (String, String)> {
        if let Some(namespace) = &self.namespace {
            crate::naming::dns1123_label(namespace)
                .map_err(|reason| ("namespace".to_string(), reason))?;
        }
        crate::naming::dns1123_subdomain(&self.key_secret)
            .map_err(|reason| ("key_secret".to_string(), reason))
    }
}

/// Why the signing key cannot be had; the message names the Secret and the setting.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("reading or creating the Secret {namespace}/{name} (registrations.key_secret): {}", describe_error(.source))]
    Kubernetes {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(
        "the Secret {namespace}/{name} (registrations.key_secret) has no data key `{KEY_DATA_KEY}` \
         of at least {KEY_LEN} bytes (has {len})"
    )]
    Weak {
        namespace: String,
        name: String,
        len: usize,
    },
    #[error("no random bytes for a new registration key")]
    Random,
    #[error("reading or creating the ConfigMap {namespace}/{PROOFS_MARKER} (registrations.namespace): {}", describe_error(.source))]
    Marker {
        namespace: String,
        source: kube::Error,
    },
}

/// A registration as found in the service's namespace, before anything of it is trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRegistration {
    /// The ConfigMap's name.
    pub name: String,
    /// Its [`APPLICATION_NAMESPACE_LABEL`].
    pub namespace_label: Option<String>,
    /// Its application id label.
    pub app_label: Option<String>,
    /// The registration JSON ([`REGISTRATION_KEY`]).
    pub json: Option<String>,
    /// The proof ([`PROOF_KEY`]).
    pub proof: Option<String>,
    /// The uid the proof was made for ([`PROOF_UID_KEY`]).
    pub proof_uid: Option<String>,
    /// An earlier version's signature ([`SIGNATURE_KEY`]).
    pub signature: Option<String>,
    /// The ConfigMap's own uid.
    pub uid: Option<String>,
    /// The ConfigMap's `creationTimestamp`.
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

/// The key that signs registrations, and the moment records without a proof stop being
/// trusted.
pub struct SigningKey {
    key: hmac::Key,
    proofs_since: Option<k8s_openapi::jiff::Timestamp>,
}

impl SigningKey {
    /// `key`; a record without a proof is trusted when its ConfigMap was created at or
    /// before `proofs_since` (`None`: never).
    pub fn new(key: hmac::Key, proofs_since: Option<k8s_openapi::jiff::Timestamp>) -> Self {
        Self { key, proofs_since }
    }

    pub fn key(&self) -> &hmac::Key {
        &self.key
    }

    /// The [`PROOFS_MARKER`]'s creation.
    pub fn proofs_since(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        self.proofs_since
    }
}

/// The registrations' ConfigMaps and their signing key, in the service's namespace.
/// Requests go through the [`ApiClient`] (rate limit, deadline, retries) of the
/// application they are for.
#[derive(Clone)]
pub struct RegistrationStore {
    api: ApiClient,
    namespace: Arc<str>,
    key_secret: Arc<str>,
    /// Read (or created) once, at first need; a failure is tried again at the next need.
    key: Arc<OnceCell<SigningKey>>,
    /// The uid of this application's ConfigMap as this store last wrote it: later writes
    /// patch it with a proof over that uid in one request. Until then a write creates it
    /// first (a new application's usual case).
    written: Arc<Mutex<Option<String>>>,
}

impl RegistrationStore {
    /// The store of `settings`, sending through `api`.
    pub fn new(api: ApiClient, settings: &RegistrationSettings) -> Self {
        Self {
            api,
            namespace: Arc::from(settings.namespace()),
            key_secret: Arc::from(settings.key_secret.as_str()),
            key: Arc::new(OnceCell::new()),
            written: Arc::default(),
        }
    }

    /// The same store, its requests in the share of the rate limit of `app_id` in
    /// `namespace` (the tenant's, not the service's namespace where they are kept).
    pub fn for_application(&self, namespace: &str, app_id: &str) -> Self {
        Self {
            api: self.api.for_application(namespace, app_id),
            written: Arc::default(),
            ..self.clone()
        }
    }

    /// The same store, its writes sent only while `fence` passes ([`ApiClient::fenced`]).
    pub fn fenced(&self, fence: crate::ha::Fence) -> Self {
        Self {
            api: self.api.fenced(fence),
            ..self.clone()
        }
    }

    /// The service's namespace, where registrations are kept.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `spark-pod-allocator.<namespace>.<sanitised id>-<hash of namespace/id>`: a valid
    /// ConfigMap name, one per application, that no id record's name (no dot) and no
    /// other (namespace, application id) gives.
    pub fn config_map_name(app_namespace: &str, app_id: &str) -> String {
        let hash = stable_hash(&format!("{app_namespace}/{app_id}"));
        let namespace = sanitize_prefix(app_namespace);
        let app = sanitize_prefix(app_id);
        format!(
            "{MANAGED_BY}.{}.{}-{hash}",
            truncate_label(&namespace, crate::naming::MAX_LABEL_LEN),
            truncate_label(&app, crate::naming::MAX_LABEL_LEN - hash.len() - 1),
        )
    }

    /// The signing key: the Secret's `key`, or, when there is no such Secret, a new one of
    /// [`KEY_LEN`] random bytes (GET, on 404 CREATE, on 409 GET again: replicas may race);
    /// with the [`PROOFS_MARKER`]'s creation. Read once per service.
    pub async fn signing_key(&self) -> Result<&SigningKey, KeyError> {
        self.key
            .get_or_try_init(|| async {
                let key = self.read_or_create_key().await?;
                let proofs_since =
                    self.proofs_since()
                        .await
                        .map_err(|source| KeyError::Marker {
                            namespace: self.namespace.to_string(),
                            source,
                        })?;
                Ok(SigningKey { key, proofs_since })
            })
            .await
    }

    /// The [`PROOFS_MARKER`]'s `creationTimestamp`, the marker created when missing (the
    /// first start of a version that writes proofs; GET, on 404 CREATE, on 409 GET again).
    async fn proofs_since(&self) -> Result<Option<k8s_openapi::jiff::Timestamp>, kube::Error> {
        let created = |marker: ConfigMap| marker.metadata.creation_timestamp.map(|t| t.0);
        let namespace = &*self.namespace;
        if let Some(marker) = self.api.get_opt(namespace, PROOFS_MARKER).await? {
            return Ok(created(marker));
        }
        let marker = ConfigMap {
            metadata: ObjectMeta {
                name: Some(PROOFS_MARKER.to_string()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.to_string(),
                    MANAGED_BY.to_string(),
                )])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        match self.api.create_answered(namespace, &marker).await {
            Ok(Some(marker)) => {
                tracing::info!(
                    namespace,
                    config_map = PROOFS_MARKER,
                    "created the registration proofs' marker"
                );
                Ok(created(marker))
            }
            Ok(None) => Ok(self
                .api
                .get_opt(namespace, PROOFS_MARKER)
                .await?
                .and_then(created)),
            Err(err) if is_status(&err, 409) => Ok(self
                .api
                .get_opt(namespace, PROOFS_MARKER)
                .await?
                .and_then(created)),
            Err(err) => Err(err),
        }
    }

    async fn read_or_create_key(&self) -> Result<hmac::Key, KeyError> {
        let api = self.api.namespaced::<Secret>(&self.namespace);
        let in_kubernetes = |source| KeyError::Kubernetes {
            namespace: self.namespace.to_string(),
            name: self.key_secret.to_string(),
            source,
        };
        let policy = self.api.policy();
        let found = policy
            .run(|_| api.get_opt(&self.key_secret))
            .await
            .map_err(in_kubernetes)?;
        let secret = match found {
            Some(secret) => secret,
            None => {
                let mut bytes = vec![0u8; KEY_LEN];
                SystemRandom::new()
                    .fill(&mut bytes)
                    .map_err(|_| KeyError::Random)?;
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.key_secret.to_string()),
                        labels: Some(BTreeMap::from([(
                            MANAGED_BY_LABEL.to_string(),
                            MANAGED_BY.to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(
                        KEY_DATA_KEY.to_string(),
                        ByteString(bytes),
                    )])),
                    type_: Some("Opaque".to_string()),
                    ..Secret::default()
                };
                let created = policy
                    .run(|_| async {
                        self.api.acquire().await?;
                        api.create(&PostParams::default(), &secret).await
                    })
                    .await;
                match created {
                    Ok(created) => {
                        tracing::info!(namespace = %self.namespace, secret = %self.key_secret, "created the registration signing key");
                        created
                    }
                    // Another replica (or a lost answer of ours) created it first: use that.
                    Err(err) if is_status(&err, 409) => policy
                        .run(|_| api.get(&self.key_secret))
                        .await
                        .map_err(in_kubernetes)?,
                    Err(err) => return Err(in_kubernetes(err)),
                }
            }
        };
        let key = secret
            .data
            .and_then(|mut data| data.remove(KEY_DATA_KEY))
            .map(|bytes| bytes.0)
            .unwrap_or_default();
        if key.len() < KEY_LEN {
            return Err(KeyError::Weak {
                namespace: self.namespace.to_string(),
                name: self.key_secret.to_string(),
                len: key.len(),
            });
        }
        Ok(hmac::Key::new(hmac::HMAC_SHA256, &key))
    }

    /// Writes an application's registration, `proof` making its proof for the uid of the
    /// ConfigMap it lands in. Its first write creates the ConfigMap (labelled with the
    /// application's namespace and id) without a proof, then patches the proof in for the
    /// uid the create answered: two requests. Later writes merge-PATCH the JSON and the
    /// proof for the uid last written in one request. Whenever a write lands in another
    /// object than the one its proof names (it was there already: a resumed application's;
    /// or it was deleted and created again meanwhile), the proof is written again for that
    /// object's uid. No owner reference: owners in another namespace are not allowed (the
    /// garbage collector would delete it); the service deletes it when the application ends.
    pub async fn write(
        &self,
        app_namespace: &str,
        app_id: &str,
        json: &str,
        proof: impl Fn(&str) -> String,
    ) -> Result<(), kube::Error> {
        let name = Self::config_map_name(app_namespace, app_id);
        let result = self
            .write_proven(app_namespace, app_id, &name, json, proof)
            .await;
        let namespace = &*self.namespace;
        result.inspect_err(|err| {
            tracing::warn!(namespace, config_map = %name, app_namespace, error = %describe_error(err), "writing the application's registration failed");
        })
    }

    async fn write_proven(
        &self,
        app_namespace: &str,
        app_id: &str,
        name: &str,
        json: &str,
        proof: impl Fn(&str) -> String,
    ) -> Result<(), kube::Error> {
        let namespace = &*self.namespace;
        let mut uid = self.written_uid();
        // Each turn writes a proof for `uid` (or, unknown, creates); done when the answer
        // is the object of that uid. Three turns cover a create and an object replaced
        // between two writes; more is someone replacing it on purpose: tried next round.
        for _ in 0..3 {
            let answered: Option<ConfigMap> = match &uid {
                Some(target) => {
                    let patch = serde_json::json!({"data": {
                        REGISTRATION_KEY: json,
                        PROOF_UID_KEY: target,
                        PROOF_KEY: proof(target),
                        SIGNATURE_KEY: null,
                    }});
                    match self.api.merge_patch_answered(namespace, name, &patch).await {
                        Err(err) if is_status(&err, 404) => None,
                        other => Some(other?),
                    }
                }
                None => {
                    let mut labels = managed_labels(app_id);
                    labels.insert(
                        APPLICATION_NAMESPACE_LABEL.to_string(),
                        app_namespace.to_string(),
                    );
                    let config_map = ConfigMap {
                        metadata: ObjectMeta {
                            name: Some(name.to_string()),
                            labels: Some(labels),
                            ..ObjectMeta::default()
                        },
                        data: Some(BTreeMap::from([(
                            REGISTRATION_KEY.to_string(),
                            json.to_string(),
                        )])),
                        ..ConfigMap::default()
                    };
                    match self.api.create_answered(namespace, &config_map).await {
                        Ok(Some(created)) => Some(created),
                        // There already: read which object it is.
                        Ok(None) => self.api.get_opt(namespace, name).await?,
                        Err(err) if is_status(&err, 409) => {
                            self.api.get_opt(namespace, name).await?
                        }
                        Err(err) => return Err(err),
                    }
                }
            };
            let landed = answered.and_then(|config_map| config_map.metadata.uid);
            if landed.is_some() && landed == uid {
                self.set_written_uid(landed);
                return Ok(());
            }
            uid = landed;
        }
        self.set_written_uid(None);
        Err(kube::Error::Api(Box::new(
            kube::core::Status::failure(
                &format!("the ConfigMap {namespace}/{name} was replaced while its registration was written"),
                "Conflict",
            )
            .with_code(409),
        )))
    }

    fn written_uid(&self) -> Option<String> {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_written_uid(&self, uid: Option<String>) {
        *self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = uid;
    }

    /// Every registration in the service's namespace (ConfigMaps of the service that name
    /// an application namespace), a page at a time.
    pub async fn list(&self) -> Result<Vec<StoredRegistration>, kube::Error> {
        let api = self.api.namespaced::<ConfigMap>(&self.namespace);
        let selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY},{APPLICATION_NAMESPACE_LABEL}");
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().labels(&selector).limit(PAGE_SIZE);
            if let Some(token) = &token {
                lp = lp.continue_token(token);
            }
            let list = self.api.policy().run(|_| api.list(&lp)).await?;
            token = list.metadata.continue_.filter(|t| !t.is_empty());
            found.extend(list.items.into_iter().map(stored));
            if token.is_none() {
                return Ok(found);
            }
        }
    }

    /// Deletes an application's registration (Stop, its driver ended, a resume of a gone
    /// driver); gone already is fine.
    pub async fn delete(&self, app_namespace: &str, app_id: &str) -> Result<(), kube::Error> {
        let name = Self::config_map_name(app_namespace, app_id);
        self.api
            .delete::<ConfigMap>(&self.namespace, &name)
            .await
            .inspect_err(|err| {
                tracing::warn!(namespace = %self.namespace, config_map = %name, app_namespace, error = %describe_error(err), "deleting the application's registration failed");
            })
    }
}

fn stored(config_map: ConfigMap) -> StoredRegistration {
    let mut labels = config_map.metadata.labels.unwrap_or_default();
    let mut data = config_map.data.unwrap_or_default();
    StoredRegistration {
        name: config_map.metadata.name.unwrap_or_default(),
        namespace_label: labels.remove(APPLICATION_NAMESPACE_LABEL),
        app_label: labels.remove(crate::allocator::types::APP_ID_LABEL),
        json: data.remove(REGISTRATION_KEY),
        proof: data.remove(PROOF_KEY),
        proof_uid: data.remove(PROOF_UID_KEY),
        signature: data.remove(SIGNATURE_KEY),
        uid: config_map.metadata.uid,
        created: config_map.metadata.creation_timestamp.map(|t| t.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_names_are_valid_distinct_and_never_an_id_records() {
        let pairs = [
            ("team-a", "spark-1"),
            ("team-b", "spark-1"),
            ("team-a", "Spark_1"),
            ("team", "a-spark-1"),
            ("team-a", &"A".repeat(63)),
        ];
        let names: std::collections::BTreeSet<String> = pairs
            .iter()
            .map(|(ns, app)| RegistrationStore::config_map_name(ns, app))
            .collect();
        assert_eq!(names.len(), pairs.len(), "{names:?}");
        for name in &names {
            assert!(crate::naming::is_dns_subdomain(name), "{name}");
            assert!(name.contains('.'), "an id record's name has no dot: {name}");
        }
        assert_eq!(
            RegistrationStore::config_map_name("team-a", "spark-1"),
            format!(
                "spark-pod-allocator.team-a.spark-1-{}",
                stable_hash("team-a/spark-1")
            )
        );
    }

    #[test]
    fn settings_name_the_key_they_break() {
        let defaults = RegistrationSettings::default();
        assert_eq!(defaults.namespace(), "default");
        assert_eq!(defaults.key_secret, "spark-pod-allocator-registration-key");
        assert_eq!(defaults.check(), Ok(()));
        let bad = RegistrationSettings {
            namespace: Some("Team_A".into()),
            ..RegistrationSettings::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "namespace");
        let bad = RegistrationSettings {
            key_secret: "no/slash".into(),
            ..RegistrationSettings::default()
        };
        assert_eq!(bad.check().unwrap_err().0, "key_secret");
    }
}
