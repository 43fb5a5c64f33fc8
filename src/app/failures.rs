//! What an application's actor remembers of failures so GetStatus can show a driver why
//! nothing starts: per resource profile the last failed create (with how many failed in a
//! row), and executors that failed or cannot start (exit code, reason such as OOMKilled,
//! ImagePullBackOff).
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use crate::allocator::{ExecutorId, ExecutorPod, ExecutorState, ResourceProfileId, Timestamp};
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

/// Container waiting reasons that mean the executor will not start without a change.
const STUCK_REASONS: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
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
                None => self.drop_waiting(executor.id),
            },
            _ => self.drop_waiting(executor.id),
        }
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

    fn drop_waiting(&mut self, id: ExecutorId) {
        if self
            .executors
            .get(&id)
            .is_some_and(|f| f.problem == ExecutorProblem::Waiting)
        {
            self.executors.remove(&id);
        }
    }
}

/// The first container (init containers included) waiting for a reason that will not
/// pass by itself: (reason, message).
fn stuck_container(pod: &Pod) -> Option<(String, Option<String>)> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|cs| cs.state.as_ref()?.waiting.as_ref())
        .find(|w| {
            w.reason
                .as_deref()
                .is_some_and(|r| STUCK_REASONS.contains(&r))
        })
        .map(|w| (w.reason.clone().unwrap_or_default(), w.message.clone()))
}

/// A failed create's HTTP status (none when the API server did not answer), reason and
/// message; none for a create that was not sent because the application stopped.
pub fn create_failure_cause(err: &CreateError) -> Option<(Option<u16>, String, String)> {
    Some(match err {
        CreateError::Cancelled => return None,
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
