//! The values the registry and its callers pass: the application id, a validated Start,
//! where an application's pods go, and what Start and GetStatus report.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::actor::DriverReport;
use super::budgets::HeldBy;
use super::failures::{CreateFailure, ExecutorFailure};
use crate::allocator::{AllocationSettings, AllocatorStatus, ResourceProfileId, Timestamp};

/// A validated application id (a label value: ≤ 63 chars, alphanumeric ends, `-_.` inside).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppId(String);

impl AppId {
    /// Validates `value` as a label value; the error says why.
    pub fn parse(value: &str) -> Result<Self, String> {
        crate::naming::application_id(value)?;
        Ok(Self(value.to_string()))
    }
    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for AppId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything Start needs, already validated and resolved against server defaults.
#[derive(Debug, Clone)]
pub struct StartApplication {
    pub app_id: AppId,
    pub namespace: String,
    pub driver_pod_name: Option<String>,
    /// Pod templates per resource profile (profile 0 always present).
    pub templates: BTreeMap<ResourceProfileId, Pod>,
    /// Prefix of executor pod names; defaults to the application id (plus a hash of it when
    /// sanitising it into a DNS label loses information, see [`crate::allocator::ExecutorPodBuilder::for_application`]).
    pub pod_name_prefix: Option<String>,
    pub settings: AllocationSettings,
    /// The identity that starts it (the authenticated user name); `None` when the service
    /// authenticates nobody. Kept in its registration, so a resumed application keeps it.
    pub owner: Option<String>,
    /// Per-executor claim templates (`executor_claim_templates`), for the executors whose
    /// pods mount them.
    pub claims: Vec<PersistentVolumeClaim>,
}

/// Where an application's pods go: its namespace and driver pod (the one owner its
/// templates may name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub namespace: String,
    pub driver_pod_name: Option<String>,
}

/// An application's state as GetStatus reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationStatus {
    /// The engine's counts, targets, deleted executors and last id.
    pub allocation: AllocatorStatus,
    /// The driver pod's life (`None` when Start named no driver pod).
    pub driver: Option<DriverReport>,
    /// The last failed create per profile (with how many failed in a row).
    pub create_failures: BTreeMap<ResourceProfileId, CreateFailure>,
    /// No round before this while backing off after failed create rounds, or while the
    /// API server's Retry-After lasts.
    pub backoff_until: Option<Timestamp>,
    /// Executors that failed (the last 100) or cannot start, ascending by id.
    pub failed_executors: Vec<ExecutorFailure>,
    /// Why the profiles' `held` executors are held (the budget that bounds the
    /// application), as of the last round; `None` when none is held.
    pub held_by: Option<HeldBy>,
}

/// What Start reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub resumed: bool,
    pub last_executor_id: u64,
}

/// Where a registered application runs and whom it belongs to, for authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub namespace: String,
    pub owner: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_id_is_a_label_value() {
        for ok in ["a", "spark-1234", "App_1.x", &"a".repeat(63)] {
            assert!(AppId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "é", "a/b", &"a".repeat(64), ".a"] {
            assert!(AppId::parse(bad).is_err(), "{bad}");
        }
        assert!(AppId::parse("").unwrap_err().contains("empty"));
        assert!(AppId::parse(&"a".repeat(64)).unwrap_err().contains("63"));
    }
}
