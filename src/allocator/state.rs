//! Pod → executor state, checked in Spark's order.
use k8s_openapi::api::core::v1::Pod;

use super::types::{ExecutorId, ResourceProfileId, Timestamp};

/// What the engine knows about one executor's pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorState {
    /// Phase Pending.
    Pending,
    /// Phase Running and the executor container is alive.
    Running,
    /// Finished with exit code 0.
    Succeeded { exit_code: Option<i32> },
    /// Finished with a non-zero exit code (or phase Failed).
    Failed {
        exit_code: Option<i32>,
        reason: Option<String>,
        message: Option<String>,
    },
    /// Deleted (deletionTimestamp set and not Running), or seen as a DELETED watch event.
    Deleted,
    /// Phase Terminating.
    Terminating,
    /// Anything else.
    Unknown,
}

/// One executor as seen in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorPod {
    pub id: ExecutorId,
    pub profile: ResourceProfileId,
    pub state: ExecutorState,
    /// The pod's creationTimestamp, if any.
    pub created_at: Option<Timestamp>,
    /// The pod's name.
    pub pod_name: String,
}

/// How pods map to states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRules {
    /// The executor container's name (default `spark-kubernetes-executor`).
    pub executor_container: String,
    /// With restartPolicy Never, any container terminated non-zero → Failed.
    pub check_all_containers: bool,
}

/// The executor a pod stands for, or `None` when it is not an (active) executor pod:
/// no parseable `spark-exec-id`, or labelled `spark-exec-inactive=true`.
pub fn executor_pod_from(_pod: &Pod, _rules: &StateRules) -> Option<ExecutorPod> {
    todo!("engine")
}
