//! The record of the highest executor id handed out for each application ([`IdRecord`]),
//! on its driver pod or in a ConfigMap of the service, and the requests that write, read
//! and delete it (rate-limited and retried like every request of [`ExecutorPods`]).
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ObjectMeta};

use super::describe_error;
use super::pods::{ExecutorPods, MANAGED_BY, is_status, labels, managed_labels};
use crate::allocator::ExecutorId;
use crate::allocator::types::EXECUTOR_ID_LABEL;
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
}

impl fmt::Display for IdRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DriverPod(name) => write!(f, "driver pod {name}"),
            Self::ConfigMap { name, .. } => write!(f, "ConfigMap {name}"),
        }
    }
}

impl ExecutorPods {
    /// Records `id` as the application's highest executor id in `record` (before executors
    /// with ids up to it are created): one merge PATCH; for a ConfigMap not there yet, a
    /// create instead (and the PATCH again if another create won the race).
    ///
    /// A blind merge PATCH, not a read-modify-write with resourceVersion: one actor is the
    /// only writer of an application's record and only ever raises it, so there is no
    /// concurrent update to detect, and a round costs one request instead of two.
    pub async fn record_last_executor_id(
        &self,
        namespace: &str,
        record: &IdRecord,
        id: ExecutorId,
    ) -> Result<(), kube::Error> {
        let value = id.to_string();
        let result = match record {
            IdRecord::DriverPod(driver) => {
                let patch = serde_json::json!({"metadata": {"annotations": {LAST_EXECUTOR_ID_ANNOTATION: value}}});
                self.merge_patch::<Pod>(namespace, driver, &patch).await
            }
            IdRecord::ConfigMap { name, app_id } => {
                let patch = serde_json::json!({"data": {LAST_EXECUTOR_ID_KEY: value}});
                match self.merge_patch::<ConfigMap>(namespace, name, &patch).await {
                    Err(err) if is_status(&err, 404) => {
                        match self
                            .create_id_config_map(namespace, name, app_id, &value)
                            .await
                        {
                            Err(err) if is_status(&err, 409) => {
                                self.merge_patch::<ConfigMap>(namespace, name, &patch).await
                            }
                            other => other,
                        }
                    }
                    other => other,
                }
            }
        };
        result.inspect_err(|err| {
            tracing::warn!(namespace, %record, error = %describe_error(err), "recording the last executor id failed");
        })
    }

    /// The id `record` holds; `None` when there is none yet (no ConfigMap, no annotation,
    /// a driver pod gone) or it is not a number.
    pub async fn recorded_last_executor_id(
        &self,
        namespace: &str,
        record: &IdRecord,
    ) -> Result<Option<u64>, kube::Error> {
        let value = match record {
            IdRecord::DriverPod(driver) => {
                let api = self.api(namespace);
                self.policy
                    .run(|_| api.get_opt(driver))
                    .await?
                    .and_then(|pod| {
                        pod.metadata
                            .annotations?
                            .remove(LAST_EXECUTOR_ID_ANNOTATION)
                    })
            }
            IdRecord::ConfigMap { name, .. } => {
                let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
                self.policy
                    .run(|_| api.get_opt(name))
                    .await?
                    .and_then(|cm| cm.data?.remove(LAST_EXECUTOR_ID_KEY))
            }
        };
        Ok(parse_recorded_id(value.as_deref(), record))
    }

    /// Removes `record` once the application has stopped: its ConfigMap is deleted (gone
    /// already is fine); a driver pod's annotation stays with the driver pod.
    pub async fn delete_id_record(
        &self,
        namespace: &str,
        record: &IdRecord,
    ) -> Result<(), kube::Error> {
        let IdRecord::ConfigMap { name, .. } = record else {
            return Ok(());
        };
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        let answer = self
            .policy
            .run(|_| async {
                self.acquire().await;
                api.delete(name, &DeleteParams::default()).await
            })
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(err) if is_status(&err, 404) => Ok(()),
            Err(err) => {
                tracing::warn!(namespace, %record, error = %describe_error(&err), "deleting the executor id record failed");
                Err(err)
            }
        }
    }

    async fn create_id_config_map(
        &self,
        namespace: &str,
        name: &str,
        app_id: &str,
        value: &str,
    ) -> Result<(), kube::Error> {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(managed_labels(app_id)),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                LAST_EXECUTOR_ID_KEY.to_string(),
                value.to_string(),
            )])),
            ..ConfigMap::default()
        };
        self.create_config_map(namespace, &config_map).await
    }
}

/// The highest `spark-exec-id` among `pods` (unparseable ids ignored).
pub fn highest_executor_id(pods: &[Pod]) -> Option<u64> {
    pods.iter()
        .filter_map(|pod| labels(pod).get(EXECUTOR_ID_LABEL)?.parse::<u64>().ok())
        .max()
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
    use crate::allocator::types::EXECUTOR_INACTIVE_LABEL;

    fn pod(labels: &[(&str, &str)]) -> Pod {
        Pod {
            metadata: ObjectMeta {
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn highest_id_ignores_unparseable_and_counts_inactive() {
        let pods = vec![
            pod(&[(EXECUTOR_ID_LABEL, "7")]),
            pod(&[(EXECUTOR_ID_LABEL, "12"), (EXECUTOR_INACTIVE_LABEL, "true")]),
            pod(&[(EXECUTOR_ID_LABEL, "x99")]),
            pod(&[]),
        ];
        assert_eq!(highest_executor_id(&pods), Some(12));
        assert_eq!(highest_executor_id(&[]), None);
    }

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
