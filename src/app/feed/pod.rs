//! What the feed takes of a pod: its phase without a string for the usual ones, its JSON,
//! and what a LIST brings of it.
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// One pod of the LIST a full state is taken from: what the feed needs of it.
#[derive(Debug, Clone)]
pub struct ListedPod {
    pub(super) name: Box<str>,
    pub(super) resource_version: Option<Box<str>>,
    pub(super) pod_json: Arc<str>,
}

impl ListedPod {
    /// `pod` as a full state shows it (`None` for a pod without a name).
    pub fn of(pod: &Pod) -> Option<Self> {
        Some(Self {
            name: pod.metadata.name.as_deref()?.into(),
            resource_version: pod.metadata.resource_version.as_deref().map(Box::from),
            pod_json: pod_json(pod),
        })
    }
}

/// A pod's phase, as the feed keeps it (no string for the usual ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    None,
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
    Other(Box<str>),
}

impl Phase {
    pub(super) fn of(phase: Option<&str>) -> Self {
        match phase {
            None => Self::None,
            Some("Pending") => Self::Pending,
            Some("Running") => Self::Running,
            Some("Succeeded") => Self::Succeeded,
            Some("Failed") => Self::Failed,
            Some("Unknown") => Self::Unknown,
            Some(other) => Self::Other(other.into()),
        }
    }

    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Self::None => None,
            Self::Pending => Some("Pending"),
            Self::Running => Some("Running"),
            Self::Succeeded => Some("Succeeded"),
            Self::Failed => Some("Failed"),
            Self::Unknown => Some("Unknown"),
            Self::Other(phase) => Some(phase),
        }
    }
}

/// `pod` as JSON (empty if it cannot be encoded, which a decoded pod always can).
pub(super) fn pod_json(pod: &Pod) -> Arc<str> {
    match serde_json::to_string(pod) {
        Ok(json) => Arc::from(json),
        Err(err) => {
            tracing::error!(error = %err, "cannot encode an executor pod as JSON");
            Arc::from("")
        }
    }
}
