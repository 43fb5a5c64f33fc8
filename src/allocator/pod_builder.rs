//! Executor pods from per-profile templates.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::types::{ExecutorId, ResourceProfileId};

/// The driver pod, owner of every executor pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverOwner {
    pub name: String,
    pub uid: String,
}

/// A template that cannot make executor pods; says which profile and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("resource profile {profile}: {reason}")]
    Invalid {
        profile: ResourceProfileId,
        reason: String,
    },
    #[error("resource profile {0} has no pod template")]
    NoTemplate(ResourceProfileId),
}

/// Builds the executor pods of one application.
#[derive(Debug, Clone)]
pub struct ExecutorPodBuilder {}

impl ExecutorPodBuilder {
    /// Checks every template (reserved labels are refused) and sanitises the prefix.
    pub fn new(
        _app_id: &str,
        _pod_name_prefix: &str,
        _templates: BTreeMap<ResourceProfileId, Pod>,
        _driver: Option<DriverOwner>,
        _executor_container: &str,
    ) -> Result<Self, TemplateError> {
        todo!("engine")
    }
    /// Whether the profile has a template.
    pub fn has_profile(&self, _profile: ResourceProfileId) -> bool {
        todo!("engine")
    }
    /// The executor pod for `id` in `profile`.
    pub fn build(
        &self,
        _id: ExecutorId,
        _profile: ResourceProfileId,
    ) -> Result<Pod, TemplateError> {
        todo!("engine")
    }
}
