//! The record of the highest executor id handed out for each application ([`IdRecord`]):
//! an annotation on its driver pod, or, for an application without one, a ConfigMap of the
//! service in the application's namespace. This module owns both: the ConfigMap's name, its
//! data key, its write, read and deletion (sent through the [`ApiClient`] of the
//! application, rate-limited and retried like every request).
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};

use super::client::ApiClient;
use super::config_map::{self, FirstTry, MANAGED_BY, managed_labels};
use super::describe_error;
use crate::allocator::ExecutorId;
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
    /// up to it are created): one merge PATCH; for a ConfigMap not there yet, a create
    /// instead (and the PATCH again if another create won the race).
    ///
    /// A blind merge PATCH, not a read-modify-write with resourceVersion: one actor is the
    /// only writer of an application's record and only ever raises it, so there is no
    /// concurrent update to detect, and a round costs one request instead of two.
    pub async fn write(
        &self,
        api: &ApiClient,
        namespace: &str,
        id: ExecutorId,
    ) -> Result<(), kube::Error> {
        let value = id.to_string();
        let result = match self {
            Self::DriverPod(driver) => {
                let patch = serde_json::json!({"metadata": {"annotations": {LAST_EXECUTOR_ID_ANNOTATION: value}}});
                api.merge_patch::<Pod>(namespace, driver, &patch).await
            }
            Self::ConfigMap { name, app_id } => {
                let data = BTreeMap::from([(LAST_EXECUTOR_ID_KEY.to_string(), value)]);
                let labels = managed_labels(app_id);
                config_map::write(api, namespace, name, labels, data, FirstTry::Patch).await
            }
        };
        result.inspect_err(|err| {
            tracing::warn!(namespace, record = %self, error = %describe_error(err), "recording the last executor id failed");
        })
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
