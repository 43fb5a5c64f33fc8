//! What an application's actor remembers of failures so GetStatus can show a driver why
//! nothing starts: per resource profile the last failed create (with how many failed in a
//! row), and executors that failed or cannot start (exit code, reason such as OOMKilled,
//! ImagePullBackOff), or that the engine found stuck (see `allocator::stuck`).
use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::allocator::start_blocker::{DELETED_WAITING_REASONS, container_waiting_for};
use crate::allocator::{
    CreateOutcomes, CreateRefusal, ExecutorId, ExecutorPod, ExecutorState, ResourceProfileId,
    StartBlocker, StuckExecutor, Timestamp,
};
use crate::k8s::CreateError;

/// The last executor pod create of a profile that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateFailure {
    /// The API server's HTTP status; `None` when it gave none (timed out, not reachable,
    /// not sent because the id record failed).
    pub http_code: Option<u16>,
    /// The API server's reason (`Forbidden`, `Invalid`, …), or the service's own:
    /// `Timeout`, `Unreachable`, `IdNotRecorded`.
    pub reason: String,
    pub message: String,
    pub at: Timestamp,
    /// Creates of the profile that failed in a row since the last one that passed (0 once
    /// one passed again; the failure stays as the last one seen).
    pub consecutive: u32,
    /// Creates of the profile that failed since the actor took the application in, passed
    /// or not since: a driver adds its increase to its own failure count (Spark 4.2 counts
    /// pod-creation failures towards `spark.executor.maxNumFailures`).
    pub total: u64,
}

/// Whether an executor ended failing or cannot start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutorProblem {
    /// Its pod or executor container failed (kept after the pod is gone).
    Failed,
    /// A container of its Pending pod waits for a reason that will not pass by itself
    /// (ImagePullBackOff, …); dropped once the pod runs or is gone.
    Waiting,
    /// Its pod waited so longer than the stuck-pending timeout and was deleted (kept
    /// after the pod is gone, as a failure).
    Stuck,
    /// Its pod found no node for longer than the stuck-pending timeout; dropped once it is
    /// scheduled or gone.
    Unschedulable,
}

impl ExecutorProblem {
    /// Whether it lasts only while the pod shows it.
    fn passes(self) -> bool {
        matches!(self, Self::Waiting | Self::Unschedulable)
    }
}

/// An executor that failed or cannot start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorFailure {
    pub executor_id: ExecutorId,
    pub profile: ResourceProfileId,
    pub pod_name: String,
    pub problem: ExecutorProblem,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// When the service first saw it.
    pub at: Timestamp,
}

/// Container waiting reasons, beyond those the engine deletes a pod for
/// ([`DELETED_WAITING_REASONS`]), that mean the executor will not start without a change.
const REPORTED_WAITING_REASONS: &[&str] = &[
    "ErrImageNeverPull",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
];

/// Failed executors kept (the most recent ids).
const KEPT_FAILURES: usize = 100;

/// The failures of one application.
#[derive(Debug, Default)]
pub struct Failures {
    creates: BTreeMap<ResourceProfileId, CreateFailure>,
    executors: BTreeMap<ExecutorId, ExecutorFailure>,
}

impl Failures {
    /// A create of `profile` passed: its failures in a row start again from 0.
    pub fn create_passed(&mut self, profile: ResourceProfileId) {
        if let Some(last) = self.creates.get_mut(&profile) {
            last.consecutive = 0;
        }
    }

    /// A create of `profile` failed with `err` at `at` (a create not sent because the
    /// application stops is not a failure).
    pub fn create_failed(&mut self, profile: ResourceProfileId, err: &CreateError, at: Timestamp) {
        let Some((http_code, reason, message)) = create_failure_cause(err) else {
            return;
        };
        self.record_create_failure(profile, http_code, reason, message, at);
    }

    /// One more failed create of `profile`, counted in a row and in all.
    fn record_create_failure(
        &mut self,
        profile: ResourceProfileId,
        http_code: Option<u16>,
        reason: String,
        message: String,
        at: Timestamp,
    ) {
        let (consecutive, total) = self
            .creates
            .get(&profile)
            .map_or((0, 0), |last| (last.consecutive, last.total));
        let (consecutive, total) = (consecutive.saturating_add(1), total.saturating_add(1));
        self.creates.insert(
            profile,
            CreateFailure {
                http_code,
                reason,
                message,
                at,
                consecutive,
                total,
            },
        );
    }

    /// Takes in one executor pod as the watch shows it.
    pub fn observe(&mut self, pod: &Pod, executor: &ExecutorPod, at: Timestamp) {
        match &executor.state {
            ExecutorState::Failed {
                exit_code,
                reason,
                message,
            } => {
                let known = self
                    .executors
                    .get(&executor.id)
                    .is_some_and(|f| f.problem == ExecutorProblem::Failed);
                if !known {
                    self.record(ExecutorFailure {
                        executor_id: executor.id,
                        profile: executor.profile,
                        pod_name: executor.pod_name.clone(),
                        problem: ExecutorProblem::Failed,
                        exit_code: *exit_code,
                        reason: reason.clone(),
                        message: message.clone(),
                        at,
                    });
                }
            }
            // Deleted as stuck: the report stays whatever the pod shows until it is gone.
            _ if self.problem_of(executor.id) == Some(ExecutorProblem::Stuck) => {}
            ExecutorState::Pending => match stuck_container(pod) {
                Some((reason, message)) => {
                    let since = self
                        .executors
                        .get(&executor.id)
                        .filter(|f| f.problem == ExecutorProblem::Waiting)
                        .map_or(at, |f| f.at);
                    self.record(ExecutorFailure {
                        executor_id: executor.id,
                        profile: executor.profile,
                        pod_name: executor.pod_name.clone(),
                        problem: ExecutorProblem::Waiting,
                        exit_code: None,
                        reason: Some(reason),
                        message,
                        at: since,
                    });
                }
                None if matches!(
                    executor.start_blocker,
                    Some(StartBlocker::Unschedulable { .. })
                ) => {}
                None => self.drop_waiting(executor.id),
            },
            _ => self.drop_waiting(executor.id),
        }
    }

    /// The engine found `stuck` past `timeout`: reported as such; one whose pod it deleted
    /// also counts as a failed create of its profile (a create that did not give an
    /// executor), so the profile's failures in a row grow as with refused creates.
    pub fn stuck(&mut self, stuck: &StuckExecutor, timeout: Duration, at: Timestamp) {
        let reason = stuck.blocker.reason();
        let message = stuck.blocker.message().map(str::to_string);
        self.record(ExecutorFailure {
            executor_id: stuck.id,
            profile: stuck.profile,
            pod_name: stuck.pod_name.clone(),
            problem: if stuck.deleted {
                ExecutorProblem::Stuck
            } else {
                ExecutorProblem::Unschedulable
            },
            exit_code: None,
            reason: Some(reason.to_string()),
            message: message.clone(),
            at: stuck.since,
        });
        if !stuck.deleted {
            return;
        }
        // A pod that never started counts as a failed create, for the backoff and for the
        // driver's failure count (`total`).
        let detail = message.map_or_else(String::new, |m| format!(": {m}"));
        let message = format!(
            "pod {} deleted: {reason} for longer than stuck_pending_timeout_ms ({} ms){detail}",
            stuck.pod_name,
            timeout.as_millis()
        );
        self.record_create_failure(stuck.profile, None, STUCK.into(), message, at);
    }

    /// The executor's pod is gone: a waiting problem goes with it, a failure stays.
    pub fn pod_gone(&mut self, id: ExecutorId) {
        self.drop_waiting(id);
    }

    /// The last failed create per profile.
    pub fn creates(&self) -> &BTreeMap<ResourceProfileId, CreateFailure> {
        &self.creates
    }

    /// Failed or stuck executors, ascending by id.
    pub fn executors(&self) -> Vec<ExecutorFailure> {
        self.executors.values().cloned().collect()
    }

    fn record(&mut self, failure: ExecutorFailure) {
        self.executors.insert(failure.executor_id, failure);
        while self.executors.len() > KEPT_FAILURES {
            self.executors.pop_first();
        }
    }

    fn problem_of(&self, id: ExecutorId) -> Option<ExecutorProblem> {
        self.executors.get(&id).map(|f| f.problem)
    }

    fn drop_waiting(&mut self, id: ExecutorId) {
        if self.problem_of(id).is_some_and(ExecutorProblem::passes) {
            self.executors.remove(&id);
        }
    }
}

/// The reason of a profile's last failed create when it was a pod deleted as stuck.
pub const STUCK: &str = "Stuck";

/// The first container (init containers included) waiting for a reason that will not
/// pass by itself: (reason, message).
fn stuck_container(pod: &Pod) -> Option<(String, Option<String>)> {
    container_waiting_for(pod, |r| {
        DELETED_WAITING_REASONS.contains(&r) || REPORTED_WAITING_REASONS.contains(&r)
    })
}

/// A failed create's HTTP status (none when the API server did not answer), reason and
/// message; none for a create that was not sent because the application stopped or an
/// earlier create of its round was refused as overloaded.
pub fn create_failure_cause(err: &CreateError) -> Option<(Option<u16>, String, String)> {
    Some(match err {
        // Not sent, and nothing wrong with the create: not the driver's failure to count.
        CreateError::Cancelled | CreateError::Shed | CreateError::NotOwner(_) => return None,
        CreateError::IdNotRecorded(message) => (None, "IdNotRecorded".into(), message.clone()),
        CreateError::Kubernetes(kube::Error::Api(status)) => (
            Some(status.code),
            status.reason.clone(),
            status.message.clone(),
        ),
        CreateError::Kubernetes(other) => {
            let reason = if crate::k8s::request::is_timeout(other) {
                "Timeout"
            } else {
                "Unreachable"
            };
            (None, reason.into(), crate::k8s::describe_error(other))
        }
    })
}

/// What one create's result says of the API server's pace: accepted, or refused and why;
/// `None` when it was not sent (stopped, shed, its id not recorded, the shard not owned).
pub fn pace_outcome(result: &Result<(), CreateError>) -> Option<CreateOutcomes> {
    match result {
        Ok(()) => Some(CreateOutcomes {
            accepted: 1,
            refused: Vec::new(),
        }),
        // Not sent for want of an id record: nothing the API server said.
        Err(CreateError::IdNotRecorded(_)) => None,
        Err(err) => create_failure_cause(err).map(|(status, _, message)| CreateOutcomes {
            accepted: 0,
            refused: vec![CreateRefusal::of_status(status, &message)],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::{StateRules, executor_pod_from};
    use serde_json::json;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "a-exec-3", "labels": {"spark-exec-id": "3", "spark-role": "executor"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "spark-kubernetes-executor"}]},
            "status": status
        }))
        .unwrap()
    }

    fn observe(failures: &mut Failures, pod: &Pod, at: i64) {
        let executor = executor_pod_from(pod, &StateRules::default()).unwrap();
        failures.observe(pod, &executor, Timestamp(at));
    }

    #[test]
    fn a_stuck_pod_is_reported_until_it_runs_and_a_failure_stays() {
        let mut failures = Failures::default();
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}));
        observe(&mut failures, &pulling, 10);
        observe(&mut failures, &pulling, 20);
        let stuck = failures.executors();
        assert_eq!(stuck.len(), 1);
        assert_eq!(stuck[0].problem, ExecutorProblem::Waiting);
        assert_eq!(stuck[0].reason.as_deref(), Some("ImagePullBackOff"));
        assert_eq!(stuck[0].at, Timestamp(10), "since it was first seen");
        observe(&mut failures, &pod(json!({"phase": "Pending"})), 30);
        assert!(failures.executors().is_empty());

        let oom = pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}));
        observe(&mut failures, &oom, 40);
        failures.pod_gone(ExecutorId(3));
        let failed = failures.executors();
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].problem, ExecutorProblem::Failed);
        assert_eq!(failed[0].exit_code, Some(137));
        assert_eq!(failed[0].reason.as_deref(), Some("OOMKilled"));
    }

    #[test]
    fn a_pod_deleted_as_stuck_stays_a_failure_and_counts_as_a_failed_create() {
        let mut failures = Failures::default();
        let pulling = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}));
        observe(&mut failures, &pulling, 10);
        let executor = executor_pod_from(&pulling, &StateRules::default()).unwrap();
        let blocker = executor.start_blocker.clone().unwrap();
        let stuck = StuckExecutor {
            id: executor.id,
            profile: executor.profile,
            pod_name: executor.pod_name.clone(),
            blocker,
            since: Timestamp(10),
            deleted: true,
        };
        failures.stuck(&stuck, Duration::from_millis(100), Timestamp(111));
        observe(&mut failures, &pulling, 112);
        failures.pod_gone(ExecutorId(3));
        let kept = failures.executors();
        assert_eq!(kept.len(), 1);
        assert_eq!(
            (kept[0].problem, kept[0].reason.as_deref(), kept[0].at),
            (
                ExecutorProblem::Stuck,
                Some("ImagePullBackOff"),
                Timestamp(10)
            )
        );
        let create = &failures.creates()[&ResourceProfileId(0)];
        assert_eq!(
            (
                create.http_code,
                create.reason.as_str(),
                create.consecutive,
                create.at
            ),
            (None, STUCK, 1, Timestamp(111))
        );
        assert_eq!(
            create.message,
            "pod a-exec-3 deleted: ImagePullBackOff for longer than stuck_pending_timeout_ms \
             (100 ms): Back-off pulling image"
        );
    }

    #[test]
    fn an_unschedulable_pod_is_reported_until_it_is_scheduled() {
        let mut failures = Failures::default();
        let no_node = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
            "status": "False", "reason": "Unschedulable", "message": "0/3 nodes"}]}),
        );
        let executor = executor_pod_from(&no_node, &StateRules::default()).unwrap();
        let stuck = StuckExecutor {
            id: executor.id,
            profile: executor.profile,
            pod_name: executor.pod_name.clone(),
            blocker: executor.start_blocker.clone().unwrap(),
            since: Timestamp(10),
            deleted: false,
        };
        failures.stuck(&stuck, Duration::from_millis(100), Timestamp(111));
        observe(&mut failures, &no_node, 112);
        let shown = failures.executors();
        assert_eq!(
            (
                shown[0].problem,
                shown[0].reason.as_deref(),
                shown[0].message.as_deref()
            ),
            (
                ExecutorProblem::Unschedulable,
                Some("Unschedulable"),
                Some("0/3 nodes")
            )
        );
        assert!(failures.creates().is_empty(), "kept, so no failed create");
        observe(&mut failures, &pod(json!({"phase": "Pending"})), 113);
        assert!(failures.executors().is_empty());
    }

    #[test]
    fn create_failures_count_in_a_row_per_profile() {
        let mut failures = Failures::default();
        let p1 = ResourceProfileId(1);
        let quota = CreateError::Kubernetes(kube::Error::Api(
            kube::core::Status::failure("exceeded quota", "Forbidden")
                .with_code(403)
                .boxed(),
        ));
        failures.create_failed(p1, &quota, Timestamp(1));
        failures.create_failed(p1, &quota, Timestamp(2));
        failures.create_failed(p1, &CreateError::Cancelled, Timestamp(3));
        let last = &failures.creates()[&p1];
        assert_eq!(
            (
                last.http_code,
                last.reason.as_str(),
                last.consecutive,
                last.total,
                last.at
            ),
            (Some(403), "Forbidden", 2, 2, Timestamp(2))
        );
        failures.create_passed(p1);
        assert_eq!(failures.creates()[&p1].consecutive, 0);
        assert_eq!(failures.creates()[&p1].total, 2);
        failures.create_failed(p1, &CreateError::IdNotRecorded("x".into()), Timestamp(4));
        let last = &failures.creates()[&p1];
        assert_eq!((last.http_code, last.consecutive, last.total), (None, 1, 3));
        assert_eq!(last.reason, "IdNotRecorded");
    }
}
