//! Executor pod requests of every application: creates, collection deletes by label (and
//! `status.phase=Pending` for a downscale), delete-all for Stop, the listing used to resume,
//! the driver pod lookup, and the ConfigMap requests the id record ([`super::id_record`])
//! and the registrations ([`super::registrations`]) are written through. Every mutating request first takes a slot of the shared [`RateLimiter`];
//! every failure is logged with the API server's reason and returned.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::describe_error;
pub use super::id_record::{IdRecord, LAST_EXECUTOR_ID_KEY};
use super::rate_limit::{RateLimiter, Share};
use super::request::RequestPolicy;
use super::watch::{FOLLOWED_DRIVER_LABEL, FOLLOWED_DRIVER_VALUE};
use crate::allocator::ExecutorId;
use crate::allocator::types::{
    APP_ID_LABEL, EXECUTOR_ID_LABEL, EXECUTOR_INACTIVE_LABEL, EXECUTOR_ROLE, ROLE_LABEL,
};
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

/// The standard label naming the manager of an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// [`MANAGED_BY_LABEL`] value of the objects the service owns (its ConfigMaps).
pub const MANAGED_BY: &str = "spark-pod-allocator";

/// Ids per collection delete, so the label selector stays well under URL limits.
const IDS_PER_DELETE: usize = 200;

/// The pod client shared by all applications.
#[derive(Clone)]
pub struct ExecutorPods {
    pub(super) client: kube::Client,
    limiter: RateLimiter,
    create_concurrency: usize,
    pub(super) policy: RequestPolicy,
    metrics: Metrics,
    /// Whose share of the rate limit this client's requests take.
    share: Share,
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
            share: Share::service(),
        }
    }

    /// The same client, its requests queued in `app_id`'s share of the rate limit within
    /// `namespace`'s (slots go round-robin between namespaces, then between applications,
    /// see [`RateLimiter`]).
    pub fn for_application(&self, namespace: &str, app_id: &str) -> Self {
        Self {
            share: Share::new(namespace, app_id),
            ..self.clone()
        }
    }

    /// The same client with every request under `policy` (deadline, retries).
    pub fn with_policy(mut self, policy: RequestPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// A token of the shared rate limiter; the wait is recorded.
    pub(super) async fn acquire(&self) {
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

    pub(super) fn api(&self, namespace: &str) -> Api<Pod> {
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

    /// Creates `config_map` (rate-limited, retried); a retry that finds it already created
    /// by an attempt whose answer was lost succeeds.
    pub(super) async fn create_config_map(
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

    /// One rate-limited merge PATCH of a namespaced object.
    pub(super) async fn merge_patch<K>(
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

    /// Puts [`FOLLOWED_DRIVER_LABEL`] on the driver pod `name` (one merge PATCH, as the id
    /// record's annotation), so that the namespace's driver watch follows it.
    pub async fn label_driver(&self, namespace: &str, name: &str) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"labels": {FOLLOWED_DRIVER_LABEL: FOLLOWED_DRIVER_VALUE}}});
        self.merge_patch::<Pod>(namespace, name, &patch)
            .await
            .inspect_err(|err| {
                tracing::warn!(namespace, driver = name, error = %describe_error(err), "labelling the driver pod failed");
            })
    }
}

/// Whether the driver pod carries [`FOLLOWED_DRIVER_LABEL`] already (a resumed or repeated
/// Start: no PATCH needed).
pub fn is_labelled_driver(pod: &Pod) -> bool {
    labels(pod)
        .get(FOLLOWED_DRIVER_LABEL)
        .is_some_and(|v| v == FOLLOWED_DRIVER_VALUE)
}

/// The labels of the service's own ConfigMaps.
pub(super) fn managed_labels(app_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_ID_LABEL.to_string(), app_id.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ])
}

/// The error of a retry not sent because the application is stopping.
fn stopping() -> kube::Error {
    kube::Error::Service("not retried: the application is stopping".into())
}

/// Whether `err` is the API server answering `code`.
pub(super) fn is_status(err: &kube::Error, code: u16) -> bool {
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
