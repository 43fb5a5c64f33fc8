//! Executor pod requests of every application: creates, collection deletes by label (and
//! `status.phase=Pending` for a downscale), delete-all for Stop, the listing used to resume,
//! the driver pod lookup, and the record of the highest executor id handed out
//! ([`IdRecord`]). Every mutating request first takes a slot of the shared [`RateLimiter`];
//! every failure is logged with the API server's reason and returned.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::describe_error;
use super::rate_limit::{RateLimiter, SERVICE_SHARE};
use super::request::RequestPolicy;
use crate::allocator::pod_builder::{sanitize_prefix, stable_hash};
use crate::allocator::types::{
    APP_ID_LABEL, EXECUTOR_ID_LABEL, EXECUTOR_INACTIVE_LABEL, EXECUTOR_ROLE, ROLE_LABEL,
};
use crate::allocator::{DriverOwner, ExecutorId};
use crate::metrics::Metrics;

/// Why one executor pod was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The API server refused or failed the create.
    #[error("{}", describe_error(.0))]
    Kubernetes(#[from] kube::Error),
    /// Not sent: the executor id could not be recorded first ([`IdRecord`]).
    #[error("not sent: recording the last executor id failed: {0}")]
    IdNotRecorded(String),
    /// The application stopped before the create was sent.
    #[error("not sent: the application is stopping")]
    Cancelled,
}

/// Annotation on the driver pod holding the highest executor id the service has handed
/// out for the application: a restarted service continues after it even when the pods of
/// the highest ids are gone (deleted on downscale or termination).
pub const LAST_EXECUTOR_ID_ANNOTATION: &str = "spark-pod-allocator/last-executor-id";

/// Data key of the ConfigMap that records the highest executor id of an application
/// started without a driver pod (same meaning as [`LAST_EXECUTOR_ID_ANNOTATION`]).
pub const LAST_EXECUTOR_ID_KEY: &str = "last-executor-id";

/// `app.kubernetes.io/managed-by` value of the objects the service owns (id ConfigMaps).
pub const MANAGED_BY: &str = "spark-pod-allocator";

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

/// Ids per collection delete, so the label selector stays well under URL limits.
const IDS_PER_DELETE: usize = 200;

/// The pod client shared by all applications.
#[derive(Clone)]
pub struct ExecutorPods {
    client: kube::Client,
    limiter: RateLimiter,
    create_concurrency: usize,
    policy: RequestPolicy,
    metrics: Metrics,
    /// Whose share of the rate limit this client's requests take.
    share: Arc<str>,
}

impl ExecutorPods {
    /// A client whose mutating requests share `limiter`; at most `create_concurrency`
    /// creates of one round are in flight at once.
    pub fn new(client: kube::Client, limiter: RateLimiter, create_concurrency: usize) -> Self {
        Self {
            client,
            limiter,
            create_concurrency: create_concurrency.max(1),
            policy: RequestPolicy::default(),
            metrics: Metrics::default(),
            share: Arc::from(SERVICE_SHARE),
        }
    }

    /// The same client, its requests queued in `app_id`'s share of the rate limit (slots
    /// go round-robin between applications, see [`RateLimiter`]).
    pub fn for_application(&self, app_id: &str) -> Self {
        Self {
            share: Arc::from(app_id),
            ..self.clone()
        }
    }

    /// The same client with every request under `policy` (deadline, retries).
    pub fn with_policy(mut self, policy: RequestPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A token of the shared rate limiter; the wait is recorded.
    async fn acquire(&self) {
        let started = std::time::Instant::now();
        self.limiter.acquire(&self.share).await;
        self.metrics.rate_limit_waited(started.elapsed());
    }

    /// Records into `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where the callers count the pods they create and delete.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The deadline and retries of every request.
    pub fn policy(&self) -> RequestPolicy {
        self.policy
    }

    fn api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Creates `pods` concurrently (up to the configured limit); one result per executor,
    /// in completion order (the caller logs a summary of the failures). Once `cancel` fires, creates not yet sent are skipped
    /// ([`CreateError::Cancelled`]); those already sent are awaited, so none lands later.
    pub async fn create_all(
        &self,
        namespace: &str,
        pods: Vec<(ExecutorId, Pod)>,
        cancel: &CancellationToken,
    ) -> Vec<(ExecutorId, Result<(), CreateError>)> {
        let api = self.api(namespace);
        futures::stream::iter(pods)
            .map(|(id, pod)| {
                let api = api.clone();
                async move {
                    tokio::select! {
                        biased;
                        () = cancel.cancelled() => return (id, Err(CreateError::Cancelled)),
                        () = self.acquire() => {}
                    }
                    if cancel.is_cancelled() {
                        return (id, Err(CreateError::Cancelled));
                    }
                    let mut first = true;
                    let result = self
                        .policy
                        .run(|unknown_outcome| {
                            let (api, pod) = (api.clone(), &pod);
                            let retry = !std::mem::take(&mut first);
                            async move {
                                // A retry is a new request: none is sent once Stop began.
                                if retry {
                                    if cancel.is_cancelled() {
                                        return Err(stopping());
                                    }
                                    self.acquire().await;
                                }
                                match api.create(&PostParams::default(), pod).await {
                                    // An earlier attempt with no answer did create it.
                                    Err(err) if unknown_outcome && is_status(&err, 409) => Ok(()),
                                    other => other.map(drop),
                                }
                            }
                        })
                        .await;
                    if let Err(err) = &result {
                        tracing::debug!(executor = id.0, namespace, error = %describe_error(err), "executor pod create failed");
                    }
                    (id, result.map_err(CreateError::from))
                }
            })
            .buffer_unordered(self.create_concurrency)
            .collect()
            .await
    }

    /// Deletes the application's executors `ids` with collection deletes by label; with
    /// `only_pending`, only pods still Pending at that moment. Returns pods deleted.
    pub async fn delete_executors(
        &self,
        namespace: &str,
        app_id: &str,
        ids: &[ExecutorId],
        only_pending: bool,
    ) -> Result<u32, kube::Error> {
        let mut deleted = 0;
        for chunk in ids.chunks(IDS_PER_DELETE) {
            let list = chunk
                .iter()
                .map(|id| id.0.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let mut lp = ListParams::default().labels(&format!(
                "{},{EXECUTOR_ID_LABEL} in ({list})",
                app_selector(app_id)
            ));
            if only_pending {
                lp = lp.fields("status.phase=Pending");
            }
            deleted += self.delete_collection(namespace, &lp).await?;
        }
        Ok(deleted)
    }

    /// Deletes every executor pod of the application (Stop); returns the pods this delete
    /// deleted: pods already terminating (a deletionTimestamp, as a LIST just before
    /// shows) are deleted again but not counted.
    pub async fn delete_all(&self, namespace: &str, app_id: &str) -> Result<u32, kube::Error> {
        let terminating: BTreeSet<String> = self
            .list_executors(namespace, app_id)
            .await?
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_some())
            .filter_map(|pod| pod.metadata.name)
            .collect();
        let lp = ListParams::default().labels(&app_selector(app_id));
        let deleted = self.delete_collection_names(namespace, &lp).await?;
        let newly = deleted.iter().filter(|name| !terminating.contains(*name));
        Ok(u32::try_from(newly.count()).unwrap_or(u32::MAX))
    }

    async fn delete_collection(
        &self,
        namespace: &str,
        lp: &ListParams,
    ) -> Result<u32, kube::Error> {
        let names = self.delete_collection_names(namespace, lp).await?;
        Ok(u32::try_from(names.len()).unwrap_or(u32::MAX))
    }

    /// One collection delete; the names of the pods it returned.
    async fn delete_collection_names(
        &self,
        namespace: &str,
        lp: &ListParams,
    ) -> Result<Vec<String>, kube::Error> {
        let api = self.api(namespace);
        let answer = self
            .policy
            .run(|_| async {
                self.acquire().await;
                api.delete_collection(&DeleteParams::default(), lp).await
            })
            .await;
        match answer {
            Ok(either) => Ok(either.left().map_or_else(Vec::new, |list| {
                list.items
                    .into_iter()
                    .map(|pod| pod.metadata.name.unwrap_or_default())
                    .collect()
            })),
            Err(err) => {
                tracing::warn!(namespace, selector = ?lp.label_selector, error = %describe_error(&err), "executor pod delete failed");
                Err(err)
            }
        }
    }

    /// Labels one executor pod `spark-exec-inactive=true` (kept for inspection, ignored
    /// everywhere), used instead of deleting when delete-on-termination is off.
    pub async fn mark_inactive(&self, namespace: &str, pod_name: &str) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"labels": {EXECUTOR_INACTIVE_LABEL: "true"}}});
        self.merge_patch::<Pod>(namespace, pod_name, &patch)
            .await
            .inspect_err(|err| {
                tracing::warn!(namespace, pod = pod_name, error = %describe_error(err), "labelling executor pod inactive failed");
            })
    }

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

    /// Writes an application's registration (JSON) under `key` of its ConfigMap: one merge
    /// PATCH; for a ConfigMap not there yet a create, owned by the driver pod when there
    /// is one (so it goes with it), and the PATCH again if another create won the race.
    pub async fn write_registration(
        &self,
        namespace: &str,
        app_id: &str,
        owner: Option<&DriverOwner>,
        key: &str,
        value: &str,
    ) -> Result<(), kube::Error> {
        let name = IdRecord::config_map_name(app_id);
        let patch = serde_json::json!({"data": {key: value}});
        let result = match self
            .merge_patch::<ConfigMap>(namespace, &name, &patch)
            .await
        {
            Err(err) if is_status(&err, 404) => {
                let config_map = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(managed_labels(app_id)),
                        owner_references: owner.map(|owner| {
                            vec![OwnerReference {
                                api_version: "v1".into(),
                                kind: "Pod".into(),
                                name: owner.name.clone(),
                                uid: owner.uid.clone(),
                                ..OwnerReference::default()
                            }]
                        }),
                        ..ObjectMeta::default()
                    },
                    data: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
                    ..ConfigMap::default()
                };
                match self.create_config_map(namespace, &config_map).await {
                    Err(err) if is_status(&err, 409) => {
                        self.merge_patch::<ConfigMap>(namespace, &name, &patch)
                            .await
                    }
                    other => other,
                }
            }
            other => other,
        };
        result.inspect_err(|err| {
            tracing::warn!(namespace, config_map = %name, error = %describe_error(err), "writing the application's registration failed");
        })
    }

    /// The values under `key` of every ConfigMap of the service, in `namespaces` (all
    /// namespaces when empty).
    pub async fn list_registrations(
        &self,
        namespaces: &[String],
        key: &str,
    ) -> Result<Vec<String>, kube::Error> {
        let lp =
            ListParams::default().labels(&format!("app.kubernetes.io/managed-by={MANAGED_BY}"));
        let apis: Vec<Api<ConfigMap>> = if namespaces.is_empty() {
            vec![Api::all(self.client.clone())]
        } else {
            namespaces
                .iter()
                .map(|ns| Api::namespaced(self.client.clone(), ns))
                .collect()
        };
        let mut values = Vec::new();
        for api in apis {
            let list = self.policy.run(|_| api.list(&lp)).await?;
            values.extend(list.items.into_iter().filter_map(|cm| cm.data?.remove(key)));
        }
        Ok(values)
    }

    /// Deletes the application's ConfigMap (registration and, without a driver pod, id
    /// record) once it has stopped; gone already is fine.
    pub async fn delete_registration(
        &self,
        namespace: &str,
        app_id: &str,
    ) -> Result<(), kube::Error> {
        let record = IdRecord::ConfigMap {
            name: IdRecord::config_map_name(app_id),
            app_id: app_id.to_string(),
        };
        self.delete_id_record(namespace, &record).await
    }

    async fn create_config_map(
        &self,
        namespace: &str,
        config_map: &ConfigMap,
    ) -> Result<(), kube::Error> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        self.policy
            .run(|unknown_outcome| {
                let api = &api;
                async move {
                    self.acquire().await;
                    match api.create(&PostParams::default(), config_map).await {
                        Err(err) if unknown_outcome && is_status(&err, 409) => Ok(()),
                        other => other.map(drop),
                    }
                }
            })
            .await
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
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), namespace);
        self.policy
            .run(|unknown_outcome| {
                let (api, config_map) = (&api, &config_map);
                async move {
                    self.acquire().await;
                    match api.create(&PostParams::default(), config_map).await {
                        // An earlier attempt with no answer did create it (with this value).
                        Err(err) if unknown_outcome && is_status(&err, 409) => Ok(()),
                        other => other.map(drop),
                    }
                }
            })
            .await
    }

    /// One rate-limited merge PATCH of a namespaced object.
    async fn merge_patch<K>(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error>
    where
        K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + fmt::Debug,
    {
        let api = Api::<K>::namespaced(self.client.clone(), namespace);
        self.policy
            .run(|_| async {
                self.acquire().await;
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .map(drop)
            })
            .await
    }

    /// Every executor pod of the application, inactive ones included (they hold ids too).
    pub async fn list_executors(
        &self,
        namespace: &str,
        app_id: &str,
    ) -> Result<Vec<Pod>, kube::Error> {
        let lp = ListParams::default().labels(&app_selector(app_id));
        let api = self.api(namespace);
        self.policy
            .run(|_| api.list(&lp))
            .await
            .map(|list| list.items)
    }

    /// The application's executor pods, `page_size` at a time (`limit`/`continue`: one
    /// consistent listing), each page handed to `page` before the next is asked for, so
    /// no more than a page of decoded pods is held at once.
    pub async fn list_executors_by_page(
        &self,
        namespace: &str,
        app_id: &str,
        page_size: u32,
        mut page: impl FnMut(Vec<Pod>),
    ) -> Result<(), kube::Error> {
        let api = self.api(namespace);
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default()
                .labels(&app_selector(app_id))
                .limit(page_size);
            if let Some(token) = &token {
                lp = lp.continue_token(token);
            }
            let list = self.policy.run(|_| api.list(&lp)).await?;
            token = list.metadata.continue_.filter(|t| !t.is_empty());
            page(list.items);
            if token.is_none() {
                return Ok(());
            }
        }
    }

    /// Whether `namespace` exists; `None` when the service may not read namespaces (403),
    /// so it cannot tell. (A LIST of pods in a missing namespace is an empty list, and only
    /// the creates would fail, each with 404, for as long as the application runs.)
    pub async fn namespace_exists(&self, namespace: &str) -> Result<Option<bool>, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        match self.policy.run(|_| api.get_opt(namespace)).await {
            Ok(found) => Ok(Some(found.is_some())),
            Err(err) if is_status(&err, 403) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The driver pod, or `None` when it does not exist.
    pub async fn driver_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Pod>, kube::Error> {
        let api = self.api(namespace);
        self.policy.run(|_| api.get_opt(name)).await
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

/// The labels of the service's own ConfigMaps.
fn managed_labels(app_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_ID_LABEL.to_string(), app_id.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            MANAGED_BY.to_string(),
        ),
    ])
}

/// The error of a retry not sent because the application is stopping.
fn stopping() -> kube::Error {
    kube::Error::Service("not retried: the application is stopping".into())
}

/// Whether `err` is the API server answering `code`.
fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}

/// The pod's labels (empty when none).
pub fn labels(pod: &Pod) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    pod.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

fn app_selector(app_id: &str) -> String {
    format!("{APP_ID_LABEL}={app_id},{ROLE_LABEL}={EXECUTOR_ROLE}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

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
