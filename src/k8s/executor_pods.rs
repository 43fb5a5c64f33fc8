//! The executor pods' requests of every application ([`ExecutorPodClient`]): creates,
//! collection deletes by label (and `status.phase=Pending` for a downscale), delete-all for
//! Stop, the inactive label, and the listings used to resume and for a WatchExecutors full
//! state. Every mutating request first takes a slot of the shared rate limit (see
//! [`ApiClient`]); every failure is logged with the API server's reason and returned.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::client::{ApiClient, is_status, not_owner};
use super::request::{describe_error, is_transient, outcome_unknown};
use crate::allocator::ExecutorId;
use crate::allocator::types::{
    APP_ID_LABEL, EXECUTOR_ID_LABEL, EXECUTOR_INACTIVE_LABEL, EXECUTOR_ROLE, ROLE_LABEL,
};
use crate::ha::NotOwner;
use crate::metrics::Metrics;

/// Why one executor pod was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// The API server refused or failed the create.
    #[error("{}", describe_error(.0))]
    Kubernetes(#[from] kube::Error),
    /// Not sent: the executor id could not be recorded first ([`super::IdRecord`]).
    #[error("not sent: recording the last executor id failed: {0}")]
    IdNotRecorded(String),
    /// The application stopped before the create was sent.
    #[error("not sent: the application is stopping")]
    Cancelled,
    /// Not sent: the API server answered an earlier create of the same round as
    /// overloaded (429, 5xx, no answer), so the rest of the round waits for a later one.
    #[error("not sent: the API server refused an earlier create of this round as overloaded")]
    Shed,
    /// Not sent: this replica's fence refused it (the application's shard is not, or no
    /// longer, owned here). An attempt refused after one went unanswered is not this: it
    /// stays [`Self::Kubernetes`], as that one may have created the pod.
    #[error("not sent: {0}")]
    NotOwner(NotOwner),
}

impl CreateError {
    /// The error of a create that had sent nothing yet when `err` stopped it.
    fn before_sending(err: kube::Error) -> Self {
        match not_owner(&err) {
            Some(refused) => Self::NotOwner(refused.clone()),
            None => Self::Kubernetes(err),
        }
    }
}

/// One executor to create: its pod and the claims created with it.
#[derive(Debug, Clone)]
pub struct ExecutorCreate {
    pub id: ExecutorId,
    pub pod: Pod,
    /// Claims the pod mounts that do not exist yet.
    pub claims: Vec<PersistentVolumeClaim>,
    /// The claims are owned by the pod: created just after it (its uid exists only then),
    /// the pod deleted again when one cannot be. Otherwise (owned by the driver pod) they
    /// are created before it, so the pod never waits for them.
    pub claims_owned_by_pod: bool,
}

/// Ids per collection delete, so the label selector stays well under URL limits.
const IDS_PER_DELETE: usize = 200;

/// The executor pods' client, shared by all applications.
#[derive(Clone)]
pub struct ExecutorPodClient {
    api: ApiClient,
    create_concurrency: usize,
    /// Creates in flight, at most `create_concurrency`, over every round sent through
    /// this client (rounds overlap: ADAPTIVE sends while earlier creates are unanswered).
    in_flight: Arc<Semaphore>,
}

impl ExecutorPodClient {
    /// The executor pod requests sent through `api`; at most `create_concurrency` creates
    /// in flight at once.
    pub fn new(api: ApiClient, create_concurrency: usize) -> Self {
        let create_concurrency = create_concurrency.max(1);
        Self {
            api,
            create_concurrency,
            in_flight: Arc::new(Semaphore::new(create_concurrency)),
        }
    }

    /// The same client, its requests in `app_id`'s share of the rate limit within
    /// `namespace`'s ([`ApiClient::for_application`]), with its own `create_concurrency`
    /// creates in flight.
    pub fn for_application(&self, namespace: &str, app_id: &str) -> Self {
        Self {
            api: self.api.for_application(namespace, app_id),
            in_flight: Arc::new(Semaphore::new(self.create_concurrency)),
            ..self.clone()
        }
    }

    /// The same client, its writes sent only while `fence` passes ([`ApiClient::fenced`]).
    pub fn fenced(&self, fence: crate::ha::Fence) -> Self {
        Self {
            api: self.api.fenced(fence),
            ..self.clone()
        }
    }

    /// The client its requests go through (the application's id record is written
    /// through the same one, in the same share of the rate limit).
    pub fn api(&self) -> &ApiClient {
        &self.api
    }

    /// Where the callers count the pods they create and delete.
    pub fn metrics(&self) -> &Metrics {
        self.api.metrics()
    }

    fn pods(&self, namespace: &str) -> Api<Pod> {
        self.api.namespaced(namespace)
    }

    /// Creates `pods` concurrently (up to the configured limit); one result per executor,
    /// in completion order (the caller logs a summary of the failures). Once `cancel`
    /// fires, creates not yet sent are skipped ([`CreateError::Cancelled`]); those already
    /// sent are awaited, so none lands later. The first create the API server answers as
    /// overloaded ends the round the same way ([`CreateError::Shed`]), and no refused
    /// create of it is retried: a server shedding load is not sent the rest of a round,
    /// which would only meet the same refusal (the caller waits for its Retry-After).
    /// Each result is also handed to `on_answer` as it comes, so that the caller can pace
    /// by the answers of a round still in flight.
    pub async fn create_all(
        &self,
        namespace: &str,
        creates: Vec<ExecutorCreate>,
        cancel: &CancellationToken,
        mut on_answer: impl FnMut(ExecutorId, &Result<(), CreateError>),
    ) -> Vec<(ExecutorId, Result<(), CreateError>)> {
        let api = self.pods(namespace);
        let shed = CancellationToken::new();
        futures::stream::iter(creates)
            .map(|create| {
                let (api, shed) = (api.clone(), &shed);
                async move {
                    let ExecutorCreate {
                        id,
                        pod,
                        claims,
                        claims_owned_by_pod,
                    } = create;
                    // A place among the application's creates in flight (held until this
                    // one and its claims are answered; the semaphore is never closed),
                    // then a slot of the rate limit.
                    let slot = async {
                        let in_flight = self.in_flight.acquire().await.ok();
                        self.api.acquire().await.map(|()| in_flight)
                    };
                    let _in_flight = tokio::select! {
                        biased;
                        () = cancel.cancelled() => return (id, Err(CreateError::Cancelled)),
                        () = shed.cancelled() => return (id, Err(CreateError::Shed)),
                        acquired = slot => match acquired {
                            Ok(in_flight) => in_flight,
                            Err(err) => return (id, Err(CreateError::before_sending(err))),
                        }
                    };
                    if cancel.is_cancelled() {
                        return (id, Err(CreateError::Cancelled));
                    }
                    if shed.is_cancelled() {
                        return (id, Err(CreateError::Shed));
                    }
                    if !claims_owned_by_pod {
                        for claim in &claims {
                            if let Err(err) = self.create_claim(namespace, claim).await {
                                return (id, Err(CreateError::before_sending(err)));
                            }
                        }
                    } else if let Err(err) = self.check_claim_names_free(namespace, &claims).await
                    {
                        return (id, Err(CreateError::before_sending(err)));
                    }
                    let mut first = true;
                    // A refusal is tried again only to learn whether an unanswered
                    // attempt created the pod, once the server sheds load.
                    let retry_refused = |err: &kube::Error| {
                        if is_transient(err) {
                            shed.cancel();
                        }
                        outcome_unknown(err)
                    };
                    let result = self
                        .api
                        .policy()
                        .run_while(retry_refused, |unknown_outcome| {
                            let (api, pod) = (api.clone(), &pod);
                            let retry = !std::mem::take(&mut first);
                            async move {
                                // A retry is a new request: none is sent once Stop began.
                                if retry {
                                    if cancel.is_cancelled() {
                                        return Err(stopping());
                                    }
                                    self.api.acquire().await?;
                                }
                                match api.create(&PostParams::default(), pod).await {
                                    // An earlier attempt with no answer did create it.
                                    Err(err) if unknown_outcome && is_status(&err, 409) => {
                                        Ok(None)
                                    }
                                    other => other.map(Some),
                                }
                            }
                        })
                        .await;
                    if result.as_ref().is_err_and(is_transient) {
                        shed.cancel();
                    }
                    let result = match result {
                        Ok(created) if claims_owned_by_pod && !claims.is_empty() => {
                            self.create_pod_claims(namespace, id, &pod, created, claims)
                                .await
                        }
                        other => other.map(drop),
                    };
                    if let Err(err) = &result {
                        tracing::debug!(executor = id.0, namespace, error = %describe_error(err), "executor pod create failed");
                    }
                    (id, result.map_err(CreateError::from))
                }
            })
            .buffer_unordered(self.create_concurrency)
            .inspect(|(id, result)| on_answer(*id, result))
            .collect()
            .await
    }

    /// Creates `claims` owned by `pod`, just created (`created`, or `None` when an earlier
    /// attempt created it: then it is read back for its uid). When one fails the pod is
    /// deleted again, so that no pod waits for a claim that will not come.
    async fn create_pod_claims(
        &self,
        namespace: &str,
        id: ExecutorId,
        pod: &Pod,
        created: Option<Pod>,
        claims: Vec<PersistentVolumeClaim>,
    ) -> Result<(), kube::Error> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let created = match created {
            Some(created) => Some(created),
            None => self.api.get_opt::<Pod>(namespace, &name).await?,
        };
        let uid = created.and_then(|p| p.metadata.uid).unwrap_or_default();
        for mut claim in claims {
            claim.metadata.owner_references =
                Some(vec![crate::allocator::pod_builder::pod_owner(&name, &uid)]);
            if let Err(err) = self.create_claim(namespace, &claim).await {
                // By label, as every executor delete (logged by it when it fails).
                let app_id = labels(pod).get(APP_ID_LABEL).cloned().unwrap_or_default();
                let _ = self
                    .delete_executors(namespace, &app_id, &[id], false)
                    .await;
                return Err(err);
            }
        }
        Ok(())
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
        let api = self.pods(namespace);
        let answer = self
            .api
            .policy()
            .run(|_| async {
                self.api.acquire().await?;
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
                tracing::warn!(namespace, selector = lp.label_selector.as_deref(), error = %describe_error(&err), "executor pod delete failed");
                Err(err)
            }
        }
    }

    /// Labels one executor pod `spark-exec-inactive=true` (kept for inspection, ignored
    /// everywhere), used instead of deleting when delete-on-termination is off.
    pub async fn mark_inactive(&self, namespace: &str, pod_name: &str) -> Result<(), kube::Error> {
        let patch = serde_json::json!({"metadata": {"labels": {EXECUTOR_INACTIVE_LABEL: "true"}}});
        self.api
            .merge_patch::<Pod>(namespace, pod_name, &patch)
            .await
            .inspect_err(|err| {
                tracing::warn!(namespace, pod = pod_name, error = %describe_error(err), "labelling executor pod inactive failed");
            })
    }

    /// Every executor pod of the application, inactive ones included (they hold ids too).
    pub async fn list_executors(
        &self,
        namespace: &str,
        app_id: &str,
    ) -> Result<Vec<Pod>, kube::Error> {
        let lp = ListParams::default().labels(&app_selector(app_id));
        let api = self.pods(namespace);
        self.api
            .policy()
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
        let api = self.pods(namespace);
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default()
                .labels(&app_selector(app_id))
                .limit(page_size);
            if let Some(token) = &token {
                lp = lp.continue_token(token);
            }
            let list = self.api.policy().run(|_| api.list(&lp)).await?;
            token = list.metadata.continue_.filter(|t| !t.is_empty());
            page(list.items);
            if token.is_none() {
                return Ok(());
            }
        }
    }
}

/// The highest `spark-exec-id` among `pods` (unparseable ids ignored).
pub fn highest_executor_id(pods: &[Pod]) -> Option<u64> {
    pods.iter()
        .filter_map(|pod| labels(pod).get(EXECUTOR_ID_LABEL)?.parse::<u64>().ok())
        .max()
}

/// The error of a retry not sent because the application is stopping.
fn stopping() -> kube::Error {
    kube::Error::Service("not retried: the application is stopping".into())
}

/// The label selector of the application's executor pods and claims.
pub(super) fn app_selector(app_id: &str) -> String {
    format!("{APP_ID_LABEL}={app_id},{ROLE_LABEL}={EXECUTOR_ROLE}")
}

/// The pod's labels (empty when none).
pub fn labels(pod: &Pod) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    pod.metadata.labels.as_ref().unwrap_or(&EMPTY)
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

    fn executor(id: u64) -> ExecutorCreate {
        let pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("app-exec-{id}")},
            "spec": {"containers": [{"name": "executor", "image": "spark"}]}
        }))
        .expect("pod manifest");
        ExecutorCreate {
            id: ExecutorId(id),
            pod,
            claims: Vec::new(),
            claims_owned_by_pod: false,
        }
    }

    #[tokio::test]
    async fn creates_queued_when_the_shard_lapses_are_not_sent_and_say_so() {
        use crate::ha::claim::Ownership;
        use crate::ha::shards::ShardMap;
        use crate::ha::{Ownerships, ShardState};
        use spark_pod_allocator_sim::{SimCluster, SimSettings};
        use std::time::{Duration, Instant};
        let sim = SimCluster::start(SimSettings::default())
            .await
            .expect("cluster");
        let (state, rx) = tokio::sync::watch::channel(ShardState::Owned(Ownership {
            epoch: 1,
            valid_until: Instant::now() + Duration::from_secs(60),
        }));
        let ownerships = Ownerships::new(
            ShardMap::new(1).expect("one shard"),
            "a",
            vec![rx],
            vec![Arc::default()],
        );
        let fence = (ownerships
            .fence("default", Duration::ZERO, Duration::ZERO)
            .await)
            .expect("owned");
        let api = ApiClient::new(
            sim.try_client().expect("client"),
            crate::k8s::RateLimiter::new(1000, 1000),
        );
        // One create in flight: the other two wait for its place.
        let pods = ExecutorPodClient::new(api, 1)
            .for_application("default", "app")
            .fenced(fence);
        sim.hold_pod_creates();
        let round = tokio::spawn(async move {
            let cancel = CancellationToken::new();
            pods.create_all(
                "default",
                (1..=3).map(executor).collect(),
                &cancel,
                |_, _| {},
            )
            .await
        });
        tokio::time::timeout(Duration::from_secs(10), async {
            while sim.held_pod_creates() < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("a create in flight");
        state.send_replace(ShardState::NotOwned {
            holder: None,
            address: None,
            error: Some("no renewal within ha.renew_deadline_ms".into()),
        });
        sim.release_pod_creates();
        let mut answers = tokio::time::timeout(Duration::from_secs(10), round)
            .await
            .expect("answered")
            .expect("joined");
        answers.sort_by_key(|(id, _)| *id);
        let sent = answers.iter().filter(|(_, r)| r.is_ok()).count();
        let fenced: Vec<ExecutorId> = (answers.iter())
            .filter(|(_, r)| matches!(r, Err(CreateError::NotOwner(_))))
            .map(|(id, _)| *id)
            .collect();
        assert_eq!((sent, fenced.len()), (1, 2), "{answers:?}");
        assert_eq!(sim.objects("pods", "default").len(), 1);
        let message = answers
            .iter()
            .find_map(|(_, r)| r.as_ref().err())
            .map(ToString::to_string)
            .unwrap_or_default();
        assert!(
            message.starts_with("not sent: this replica does not own shard 0"),
            "{message}"
        );
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn an_applications_overlapping_rounds_share_its_creates_in_flight() {
        use spark_pod_allocator_sim::{SimCluster, SimSettings};
        use std::time::Duration;
        let sim = SimCluster::start(SimSettings::default())
            .await
            .expect("cluster");
        let api = ApiClient::new(
            sim.try_client().expect("client"),
            crate::k8s::RateLimiter::new(1000, 1000),
        );
        let service = ExecutorPodClient::new(api, 2);
        let held = async |n: usize| {
            tokio::time::timeout(Duration::from_secs(10), async {
                while sim.held_pod_creates() < n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{n} creates in flight"));
        };
        sim.hold_pod_creates();
        let rounds = |pods: ExecutorPodClient, ids: Vec<std::ops::RangeInclusive<u64>>| {
            tokio::spawn(async move {
                let cancel = CancellationToken::new();
                let sent = ids.into_iter().map(|ids| {
                    pods.create_all("default", ids.map(executor).collect(), &cancel, |_, _| {})
                });
                let answers = futures::future::join_all(sent).await;
                answers
                    .into_iter()
                    .flatten()
                    .filter(|(_, r)| r.is_ok())
                    .count()
            })
        };
        // Two rounds of three of one application: two creates in flight over both, not
        // two per round.
        let app = rounds(
            service.for_application("default", "app"),
            vec![1..=3, 4..=6],
        );
        held(2).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(sim.held_pod_creates(), 2);
        // Another application has its own two.
        let other = rounds(service.for_application("default", "other"), vec![7..=8]);
        held(4).await;
        sim.release_pod_creates();
        for (round, created) in [(app, 6), (other, 2)] {
            let answered = tokio::time::timeout(Duration::from_secs(10), round)
                .await
                .expect("answered")
                .expect("joined");
            assert_eq!(answered, created);
        }
        sim.shutdown().await;
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
