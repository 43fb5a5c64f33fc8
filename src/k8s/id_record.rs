//! The record of the highest executor id handed out for each application ([`IdRecord`]):
//! an annotation on its driver pod, or, for an application without one, a ConfigMap of the
//! service in the application's namespace. This module owns both: the ConfigMap's name, its
//! data key, its write, read and deletion (sent through the [`ApiClient`] of the
//! application, rate-limited and retried like every request).
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};

use kube::api::ObjectMeta;

use super::client::{ApiClient, is_status};
use super::config_map::{MANAGED_BY, managed_labels};
use super::request::describe_error;
use crate::allocator::ExecutorId;
use crate::ha::OwnerEpoch;
use crate::naming::{sanitize_prefix, stable_hash};

/// Annotation on the driver pod holding the highest executor id the service has handed
/// out for the application: a restarted service continues after it even when the pods of
/// the highest ids are gone (deleted on downscale or termination).
pub const LAST_EXECUTOR_ID_ANNOTATION: &str = "spark-pod-allocator/last-executor-id";

/// Data key of the ConfigMap that records the highest executor id of an application
/// started without a driver pod (same meaning as [`LAST_EXECUTOR_ID_ANNOTATION`]).
pub const LAST_EXECUTOR_ID_KEY: &str = "last-executor-id";

/// Where the highest executor id handed out for an application is recorded, so a
/// restarted service never hands out an id again, even one whose pod is gone (deleted on
/// downscale or termination). It says "ids up to X may be in use": written, one block of
/// ids at a time, before creates with ids it does not cover ([`crate::allocator::IdBlocks`]);
/// read by Start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdRecord {
    /// The [`LAST_EXECUTOR_ID_ANNOTATION`] annotation on the named driver pod (kept when
    /// the application stops: the driver pod belongs to the driver).
    DriverPod(String),
    /// The [`LAST_EXECUTOR_ID_KEY`] key of a ConfigMap of the service, for an application
    /// without a driver pod: created on first need, deleted by Stop.
    ConfigMap {
        /// [`IdRecord::config_map_name`] of the application id.
        name: String,
        app_id: String,
    },
}

impl IdRecord {
    /// The record of an application: on its driver pod if it has one, else in its ConfigMap.
    pub fn for_application(app_id: &str, driver_pod: Option<&str>) -> Self {
        match driver_pod {
            Some(driver) => Self::DriverPod(driver.to_string()),
            None => Self::ConfigMap {
                name: Self::config_map_name(app_id),
                app_id: app_id.to_string(),
            },
        }
    }

    /// `spark-pod-allocator-<sanitised id>-<hash of the exact id>`: a valid object name
    /// (at most 92 characters) that no other application id gives.
    pub fn config_map_name(app_id: &str) -> String {
        format!(
            "{MANAGED_BY}-{}-{}",
            sanitize_prefix(app_id),
            stable_hash(app_id)
        )
    }

    /// Records `id` as the application's highest executor id (before executors with ids
    /// up to it are created): a read, then a compare-and-set on the object's
    /// resourceVersion that never lowers the recorded id and carries the owner's epoch
    /// ([`OWNER_EPOCH_ANNOTATION`]); for a ConfigMap not there yet, a create instead.
    ///
    /// Several replicas may believe for a moment that they own an application (a paused
    /// one that woke up): a record written since it was read is read again (a driver pod's
    /// status changes its resourceVersion too), and a record a newer owner of the shard
    /// wrote refuses the write ([`Superseded`]), so a deposed owner never hands out ids
    /// the new one may use.
    ///
    /// `absent`: the record was found missing (Start read it), so the first attempt
    /// creates it without reading it again; a 409 (it is there after all) reads it.
    pub async fn write(
        &self,
        api: &ApiClient,
        namespace: &str,
        id: ExecutorId,
        absent: bool,
    ) -> Result<(), kube::Error> {
        let mut result = Err(conflict_exhausted());
        for attempt in 0..WRITE_ATTEMPTS {
            result = self
                .write_once(api, namespace, id, absent && attempt == 0)
                .await;
            match &result {
                Err(err) if is_status(err, 409) => continue,
                _ => break,
            }
        }
        result.inspect_err(|err| {
            tracing::warn!(namespace, record = %self, error = %describe_error(err), "recording the last executor id failed");
        })
    }

    async fn write_once(
        &self,
        api: &ApiClient,
        namespace: &str,
        id: ExecutorId,
        absent: bool,
    ) -> Result<(), kube::Error> {
        let mine = api.owner_epoch();
        // Only a ConfigMap is created: a driver pod's record is always read.
        let current = match self {
            Self::ConfigMap { .. } if absent => None,
            _ => self.current(api, namespace).await?,
        };
        if let (Some(current), Some(mine)) = (&current, mine)
            && let Some(theirs) = current.epoch
            && theirs.supersedes(&mine)
        {
            return Err(kube::Error::Service(Box::new(Superseded {
                record: self.to_string(),
                theirs,
                mine,
            })));
        }
        let recorded = current.as_ref().and_then(|c| c.last_id).unwrap_or(0);
        let value = id.0.max(recorded).to_string();
        let mut annotations = serde_json::Map::new();
        if let Some(mine) = mine {
            annotations.insert(OWNER_EPOCH_ANNOTATION.into(), mine.to_string().into());
        }
        match (self, current) {
            (Self::DriverPod(driver), Some(current)) => {
                annotations.insert(LAST_EXECUTOR_ID_ANNOTATION.into(), value.into());
                let patch = serde_json::json!({"metadata": {
                    "resourceVersion": current.resource_version,
                    "annotations": annotations,
                }});
                api.merge_patch::<Pod>(namespace, driver, &patch).await
            }
            (Self::ConfigMap { name, .. }, Some(current)) => {
                let patch = serde_json::json!({
                    "metadata": {
                        "resourceVersion": current.resource_version,
                        "annotations": annotations,
                    },
                    "data": {LAST_EXECUTOR_ID_KEY: value},
                });
                api.merge_patch::<ConfigMap>(namespace, name, &patch).await
            }
            (Self::ConfigMap { name, app_id }, None) => {
                let config_map = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(managed_labels(app_id)),
                        annotations: Some(
                            annotations
                                .into_iter()
                                .filter_map(|(k, v)| Some((k, v.as_str()?.to_string())))
                                .collect(),
                        ),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(LAST_EXECUTOR_ID_KEY.to_string(), value)])),
                    ..ConfigMap::default()
                };
                // A 409: another writer created it first; read it and try again.
                api.create(namespace, &config_map).await
            }
            (Self::DriverPod(driver), None) => Err(kube::Error::Api(Box::new(
                kube::core::Status::failure(&format!("pods \"{driver}\" not found"), "NotFound")
                    .with_code(404),
            ))),
        }
    }

    /// The record's object as it is now: its resourceVersion, id and owner epoch; `None`
    /// when it does not exist.
    async fn current(
        &self,
        api: &ApiClient,
        namespace: &str,
    ) -> Result<Option<Current>, kube::Error> {
        let (meta, last_id) = match self {
            Self::DriverPod(driver) => match api.get_opt::<Pod>(namespace, driver).await? {
                Some(pod) => {
                    let value = pod
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(LAST_EXECUTOR_ID_ANNOTATION).cloned());
                    (pod.metadata, value)
                }
                None => return Ok(None),
            },
            Self::ConfigMap { name, .. } => {
                match api.get_opt::<ConfigMap>(namespace, name).await? {
                    Some(cm) => {
                        let value = cm
                            .data
                            .as_ref()
                            .and_then(|d| d.get(LAST_EXECUTOR_ID_KEY).cloned());
                        (cm.metadata, value)
                    }
                    None => return Ok(None),
                }
            }
        };
        let epoch = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(OWNER_EPOCH_ANNOTATION))
            .and_then(|value| OwnerEpoch::parse(value));
        Ok(Some(Current {
            resource_version: meta.resource_version.unwrap_or_default(),
            last_id: parse_recorded_id(last_id.as_deref(), self),
            epoch,
        }))
    }

    /// The id the record holds; `None` when there is none yet (no ConfigMap, no
    /// annotation, a driver pod gone) or it is not a number.
    pub async fn read(&self, api: &ApiClient, namespace: &str) -> Result<Option<u64>, kube::Error> {
        let value = match self {
            Self::DriverPod(driver) => {
                api.get_opt::<Pod>(namespace, driver)
                    .await?
                    .and_then(|pod| {
                        pod.metadata
                            .annotations?
                            .remove(LAST_EXECUTOR_ID_ANNOTATION)
                    })
            }
            Self::ConfigMap { name, .. } => api
                .get_opt::<ConfigMap>(namespace, name)
                .await?
                .and_then(|cm| cm.data?.remove(LAST_EXECUTOR_ID_KEY)),
        };
        Ok(parse_recorded_id(value.as_deref(), self))
    }

    /// Removes the record once the application has stopped: its ConfigMap is deleted
    /// (gone already is fine); a driver pod's annotation stays with the driver pod.
    pub async fn delete(&self, api: &ApiClient, namespace: &str) -> Result<(), kube::Error> {
        let Self::ConfigMap { name, .. } = self else {
            return Ok(());
        };
        api.delete::<ConfigMap>(namespace, name)
            .await
            .inspect_err(|err| {
                tracing::warn!(namespace, record = %self, error = %describe_error(err), "deleting the executor id record failed");
            })
    }
}

impl fmt::Display for IdRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DriverPod(name) => write!(f, "driver pod {name}"),
            Self::ConfigMap { name, .. } => write!(f, "ConfigMap {name}"),
        }
    }
}

/// Reads and compare-and-sets of one record write before it gives up (each retry
/// follows another writer's change).
const WRITE_ATTEMPTS: usize = 4;

/// Annotation on the record's object (driver pod or ConfigMap): the epoch of the owner
/// that last wrote it ([`OwnerEpoch`]).
pub const OWNER_EPOCH_ANNOTATION: &str = "spark-pod-allocator/owner-epoch";

/// A record's object as read before its compare-and-set.
struct Current {
    resource_version: String,
    last_id: Option<u64>,
    epoch: Option<OwnerEpoch>,
}

/// The record was written by a newer owner of the application's shard: this replica is
/// deposed and must not hand out ids.
#[derive(Debug, thiserror::Error)]
#[error(
    "{record} was written by a newer owner of the shard (epoch {theirs}; this replica's is \
     {mine}): this replica no longer owns the application"
)]
pub struct Superseded {
    pub record: String,
    pub theirs: OwnerEpoch,
    pub mine: OwnerEpoch,
}

fn conflict_exhausted() -> kube::Error {
    kube::Error::Api(Box::new(
        kube::core::Status::failure("the id record kept changing", "Conflict").with_code(409),
    ))
}

/// A recorded last executor id; an unparseable one is ignored (and logged).
fn parse_recorded_id(value: Option<&str>, record: &IdRecord) -> Option<u64> {
    let value = value?;
    match value.parse::<u64>() {
        Ok(id) => Some(id),
        Err(_) => {
            tracing::warn!(value = %value, %record, "ignoring an unparseable recorded last executor id");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_last_id_ignores_garbage() {
        let record = IdRecord::for_application("app", Some("driver"));
        assert_eq!(parse_recorded_id(None, &record), None);
        assert_eq!(parse_recorded_id(Some("41"), &record), Some(41));
        assert_eq!(parse_recorded_id(Some("-1"), &record), None);
        assert_eq!(parse_recorded_id(Some(""), &record), None);
    }

    #[test]
    fn id_config_maps_have_valid_distinct_names() {
        let names: BTreeMap<String, &str> = ["Spark_app.1", "spark-app-1", "spark_app_1"]
            .into_iter()
            .map(|id| (IdRecord::config_map_name(id), id))
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        assert!(names.contains_key(&format!(
            "spark-pod-allocator-spark-app-1-{}",
            stable_hash("spark-app-1")
        )));
        let longest = IdRecord::config_map_name(&"A".repeat(63));
        assert!(longest.len() <= 253);
        assert!(
            longest
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        );
        assert_eq!(
            IdRecord::for_application("app", Some("driver")),
            IdRecord::DriverPod("driver".into())
        );
    }
}
