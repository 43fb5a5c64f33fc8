//! Pod → executor state, checked in Spark's order.
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use super::start_blocker::{StartBlocker, start_blocker};
use super::types::{
    EXECUTOR_ID_LABEL, EXECUTOR_INACTIVE_LABEL, ExecutorId, RESOURCE_PROFILE_ID_LABEL,
    ResourceProfileId, Timestamp,
};

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
    /// What keeps a Pending pod from starting (none for other states).
    pub start_blocker: Option<StartBlocker>,
}

/// How pods map to states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRules {
    /// The executor container's name (default `spark-kubernetes-executor`).
    pub executor_container: String,
    /// With restartPolicy Never, any container terminated non-zero → Failed.
    pub check_all_containers: bool,
}

/// Spark's executor container name.
pub const DEFAULT_EXECUTOR_CONTAINER: &str = "spark-kubernetes-executor";

impl Default for StateRules {
    fn default() -> Self {
        Self {
            executor_container: DEFAULT_EXECUTOR_CONTAINER.to_string(),
            check_all_containers: false,
        }
    }
}

impl ExecutorState {
    /// Whether the executor is gone for good (Spark replaces it with a new one).
    pub fn is_finished(&self) -> bool {
        matches!(
            self,
            Self::Succeeded { .. } | Self::Failed { .. } | Self::Deleted
        )
    }
}

/// The executor a pod stands for, or `None` when it is not an (active) executor pod:
/// no parseable `spark-exec-id`, or labelled `spark-exec-inactive=true`.
///
/// Ids must be positive (Spark starts at 1). A pod without the resource-profile label
/// belongs to the default profile 0; one whose label does not parse is not ours.
pub fn executor_pod_from(pod: &Pod, rules: &StateRules) -> Option<ExecutorPod> {
    let labels = pod.metadata.labels.as_ref()?;
    if labels
        .get(EXECUTOR_INACTIVE_LABEL)
        .is_some_and(|v| v == "true")
    {
        return None;
    }
    let id = labels
        .get(EXECUTOR_ID_LABEL)?
        .trim()
        .parse::<u64>()
        .ok()
        .filter(|id| *id > 0)?;
    let profile = match labels.get(RESOURCE_PROFILE_ID_LABEL) {
        Some(value) => value.trim().parse::<i32>().ok()?,
        None => 0,
    };
    let created_at = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| Timestamp(t.0.as_millisecond()));
    let state = state_of(pod, rules);
    let start_blocker = if state == ExecutorState::Pending {
        start_blocker(pod)
    } else {
        None
    };
    Some(ExecutorPod {
        id: ExecutorId(id),
        profile: ResourceProfileId(profile),
        state,
        created_at,
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        start_blocker,
    })
}

/// Spark's state order: deleted, then by phase (case-insensitive).
fn state_of(pod: &Pod, rules: &StateRules) -> ExecutorState {
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .map(str::to_ascii_lowercase);
    let phase = phase.as_deref();
    if pod.metadata.deletion_timestamp.is_some()
        && !matches!(phase, Some("running" | "terminating"))
    {
        return ExecutorState::Deleted;
    }
    match phase {
        Some("pending") => ExecutorState::Pending,
        Some("running") => running_state(pod, rules),
        Some("failed") => {
            let terminated = executor_terminated(pod, rules);
            failed(pod, terminated)
        }
        Some("succeeded") => ExecutorState::Succeeded {
            exit_code: executor_terminated(pod, rules).map(|t| t.exit_code),
        },
        Some("terminating") => ExecutorState::Terminating,
        other => {
            tracing::warn!(
                pod = pod.metadata.name.as_deref().unwrap_or(""),
                namespace = pod.metadata.namespace.as_deref().unwrap_or(""),
                phase = other.unwrap_or("<none>"),
                "unknown phase for executor pod"
            );
            ExecutorState::Unknown
        }
    }
}

/// A Running pod whose containers may already have exited.
fn running_state(pod: &Pod, rules: &StateRules) -> ExecutorState {
    let restart_never =
        pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) == Some("Never");
    if rules.check_all_containers && restart_never {
        let failed_container = container_statuses(pod)
            .filter_map(|cs| cs.state.as_ref().and_then(|s| s.terminated.as_ref()))
            .find(|t| t.exit_code != 0);
        if let Some(terminated) = failed_container {
            return failed(pod, Some(terminated));
        }
    }
    match executor_terminated(pod, rules) {
        Some(t) if t.exit_code == 0 => ExecutorState::Succeeded { exit_code: Some(0) },
        Some(t) => failed(pod, Some(t)),
        None => ExecutorState::Running,
    }
}

fn failed(pod: &Pod, terminated: Option<&ContainerStateTerminated>) -> ExecutorState {
    let status = pod.status.as_ref();
    ExecutorState::Failed {
        exit_code: terminated.map(|t| t.exit_code),
        reason: terminated
            .and_then(|t| t.reason.clone())
            .or_else(|| status.and_then(|s| s.reason.clone())),
        message: terminated
            .and_then(|t| t.message.clone())
            .or_else(|| status.and_then(|s| s.message.clone())),
    }
}

fn container_statuses(
    pod: &Pod,
) -> impl Iterator<Item = &k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
}

/// The terminated state of the executor container, if it has exited.
fn executor_terminated<'a>(
    pod: &'a Pod,
    rules: &StateRules,
) -> Option<&'a ContainerStateTerminated> {
    container_statuses(pod)
        .find(|cs| cs.name == rules.executor_container)
        .and_then(|cs| cs.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
}
