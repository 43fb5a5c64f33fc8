//! What keeps a Pending executor pod from starting, as the pod shows it: a container
//! waiting for its image or configuration, or no node that fits. The executor's state
//! carries it; what is done about it, and when, is `stuck`'s.
use k8s_openapi::api::core::v1::Pod;

/// Container waiting reasons that no retry of the kubelet fixes: the pod is deleted once
/// stuck past the timeout.
pub const DELETED_WAITING_REASONS: &[&str] = &[
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
];

/// The reason of the PodScheduled condition when no node fits the pod.
pub const UNSCHEDULABLE: &str = "Unschedulable";

/// Why a Pending executor pod does not start, as the pod shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartBlocker {
    /// A container (init containers included) waits for one of [`DELETED_WAITING_REASONS`].
    ContainerWaiting {
        reason: String,
        message: Option<String>,
    },
    /// PodScheduled is False with reason Unschedulable.
    Unschedulable { message: Option<String> },
}

impl StartBlocker {
    /// The reason as Kubernetes gives it (`ImagePullBackOff`, …, `Unschedulable`).
    pub fn reason(&self) -> &str {
        match self {
            Self::ContainerWaiting { reason, .. } => reason,
            Self::Unschedulable { .. } => UNSCHEDULABLE,
        }
    }

    /// Kubernetes' message, if it gave one.
    pub fn message(&self) -> Option<&str> {
        match self {
            Self::ContainerWaiting { message, .. } | Self::Unschedulable { message } => {
                message.as_deref()
            }
        }
    }

    /// Whether a pod stuck so is deleted past the timeout (else only reported).
    pub fn deletes_pod(&self) -> bool {
        matches!(self, Self::ContainerWaiting { .. })
    }

    pub(crate) fn same_kind(&self, other: &Self) -> bool {
        self.deletes_pod() == other.deletes_pod()
    }
}

/// What keeps a Pending pod from starting, if anything (a waiting container first: a pod
/// that has containers waiting was scheduled).
pub fn start_blocker(pod: &Pod) -> Option<StartBlocker> {
    if let Some((reason, message)) =
        container_waiting_for(pod, |r| DELETED_WAITING_REASONS.contains(&r))
    {
        return Some(StartBlocker::ContainerWaiting { reason, message });
    }
    pod.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some(UNSCHEDULABLE)
        })
        .map(|c| StartBlocker::Unschedulable {
            message: c.message.clone(),
        })
}

/// The first container (init containers included) waiting for a reason `matches`:
/// (reason, message).
pub fn container_waiting_for(
    pod: &Pod,
    matches: impl Fn(&str) -> bool,
) -> Option<(String, Option<String>)> {
    let status = pod.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|cs| cs.state.as_ref()?.waiting.as_ref())
        .find(|w| w.reason.as_deref().is_some_and(&matches))
        .map(|w| (w.reason.clone().unwrap_or_default(), w.message.clone()))
}
