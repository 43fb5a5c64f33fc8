//! What a repeated Start must repeat of an application's first Start.
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use super::types::StartApplication;
use crate::allocator::AllocationSettings;

/// The fields of an application's first Start (other than templates, which the actor
/// keeps) that a repeated Start may not change.
#[derive(Debug, Clone)]
pub(super) struct FirstStart {
    driver_pod_name: Option<String>,
    pod_name_prefix: Option<String>,
    settings: AllocationSettings,
    claims: Vec<PersistentVolumeClaim>,
}

impl FirstStart {
    /// The driver pod it named (the one owner its templates may name).
    pub(super) fn driver_pod_name(&self) -> Option<&str> {
        self.driver_pod_name.as_deref()
    }

    pub(super) fn of(req: &StartApplication) -> Self {
        Self {
            driver_pod_name: req.driver_pod_name.clone(),
            pod_name_prefix: req.pod_name_prefix.clone(),
            settings: req.settings.clone(),
            claims: req.claims.clone(),
        }
    }

    /// Whether Stop deletes the application's claims: it has claim templates and its
    /// claims are not the driver pod's (those go with it).
    pub(super) fn stop_deletes_claims(&self) -> bool {
        let driver_owned = self.settings.driver_owns_claims && self.driver_pod_name.is_some();
        !self.claims.is_empty() && !driver_owned
    }

    /// The first field (as the API names it) a repeated Start would change, if any.
    pub(super) fn changed_by(&self, req: &StartApplication) -> Option<String> {
        if self.driver_pod_name != req.driver_pod_name {
            return Some("driver_pod_name".into());
        }
        if self.pod_name_prefix != req.pod_name_prefix {
            return Some("pod_name_prefix".into());
        }
        if self.claims != req.claims {
            return Some("executor_claim_templates".into());
        }
        self.settings
            .first_difference(&req.settings)
            .map(|name| format!("settings.{name}"))
    }
}
