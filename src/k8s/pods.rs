//! Executor pod requests of every application: creates, collection deletes by label (and
//! `status.phase=Pending` for a downscale), delete-all for Stop, the listing used to resume,
//! and the driver pod lookup. Every mutating request first takes a slot of the shared
//! [`RateLimiter`]; every failure is logged with the API server's reason and returned.
use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use super::describe_error;
use super::rate_limit::RateLimiter;
use crate::allocator::ExecutorId;
use crate::allocator::types::{
    APP_ID_LABEL, EXECUTOR_ID_LABEL, EXECUTOR_INACTIVE_LABEL, EXECUTOR_ROLE, ROLE_LABEL,
};

/// Why one executor pod was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The API server refused or failed the create.
    #[error("{}", describe_error(.0))]
    Kubernetes(#[from] kube::Error),
    /// The application stopped before the create was sent.
    #[error("not sent: the application is stopping")]
    Cancelled,
}

/// Ids per collection delete, so the label selector stays well under URL limits.
const IDS_PER_DELETE: usize = 200;

/// The pod client shared by all applications.
#[derive(Clone)]
pub struct ExecutorPods {
    client: kube::Client,
    limiter: RateLimiter,
    create_concurrency: usize,
}

impl ExecutorPods {
    /// A client whose mutating requests share `limiter`; at most `create_concurrency`
    /// creates of one round are in flight at once.
    pub fn new(client: kube::Client, limiter: RateLimiter, create_concurrency: usize) -> Self {
        Self {
            client,
            limiter,
            create_concurrency: create_concurrency.max(1),
        }
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
                        () = self.limiter.acquire() => {}
                    }
                    if cancel.is_cancelled() {
                        return (id, Err(CreateError::Cancelled));
                    }
                    let result = api.create(&PostParams::default(), &pod).await.map(|_| ());
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

    /// Deletes every executor pod of the application (Stop); returns pods deleted.
    pub async fn delete_all(&self, namespace: &str, app_id: &str) -> Result<u32, kube::Error> {
        let lp = ListParams::default().labels(&app_selector(app_id));
        self.delete_collection(namespace, &lp).await
    }

    async fn delete_collection(
        &self,
        namespace: &str,
        lp: &ListParams,
    ) -> Result<u32, kube::Error> {
        self.limiter.acquire().await;
        match self
            .api(namespace)
            .delete_collection(&DeleteParams::default(), lp)
            .await
        {
            Ok(either) => Ok(either.left().map_or(0, |list| {
                u32::try_from(list.items.len()).unwrap_or(u32::MAX)
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
        self.limiter.acquire().await;
        let patch = serde_json::json!({"metadata": {"labels": {EXECUTOR_INACTIVE_LABEL: "true"}}});
        match self
            .api(namespace)
            .patch(pod_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => {
                tracing::warn!(namespace, pod = pod_name, error = %describe_error(&err), "labelling executor pod inactive failed");
                Err(err)
            }
        }
    }

    /// Every executor pod of the application, inactive ones included (they hold ids too).
    pub async fn list_executors(
        &self,
        namespace: &str,
        app_id: &str,
    ) -> Result<Vec<Pod>, kube::Error> {
        let lp = ListParams::default().labels(&app_selector(app_id));
        self.api(namespace).list(&lp).await.map(|list| list.items)
    }

    /// Whether `namespace` exists; `None` when the service may not read namespaces (403),
    /// so it cannot tell. (A LIST of pods in a missing namespace is an empty list, and only
    /// the creates would fail, each with 404, for as long as the application runs.)
    pub async fn namespace_exists(&self, namespace: &str) -> Result<Option<bool>, kube::Error> {
        let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        match api.get_opt(namespace).await {
            Ok(found) => Ok(Some(found.is_some())),
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The driver pod, or `None` when it does not exist.
    pub async fn driver_pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Pod>, kube::Error> {
        self.api(namespace).get_opt(name).await
    }
}

/// The highest `spark-exec-id` among `pods` (unparseable ids ignored).
pub fn highest_executor_id(pods: &[Pod]) -> Option<u64> {
    pods.iter()
        .filter_map(|pod| labels(pod).get(EXECUTOR_ID_LABEL)?.parse::<u64>().ok())
        .max()
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
}
