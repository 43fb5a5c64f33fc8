//! One actor per application: a tokio task owning its engine state, reached through an
//! [`ApplicationHandle`]; nothing else mutates it. [`Applications`] is the registry the
//! gRPC layer calls.
//!
//! CONTRACT between the service core (k8s + actors) and the gRPC edge: keep these names and
//! signatures; extend freely.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::allocator::{AllocationSettings, AllocatorStatus, ExecutorId, ResourceProfileId};

pub mod clock;
pub mod error;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::AppError;

/// A validated application id (a label value: ≤ 63 chars, alphanumeric ends, `-_.` inside).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppId(String);

impl AppId {
    /// Validates `value` as a label value; the error says why.
    pub fn parse(value: &str) -> Result<Self, String> {
        if value.is_empty() {
            return Err("must not be empty".to_string());
        }
        if value.len() > 63 {
            return Err(format!(
                "must be at most 63 characters (has {})",
                value.len()
            ));
        }
        let bytes = value.as_bytes();
        let inner_ok = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
        let ends_ok = bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
        if !ends_ok || !bytes.iter().all(inner_ok) {
            return Err(format!(
                "{value:?} is not a label value: letters, digits, '-', '_' and '.', \
                 starting and ending with a letter or digit"
            ));
        }
        Ok(Self(value.to_string()))
    }
    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
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
    /// Prefix of executor pod names; defaults to the application id.
    pub pod_name_prefix: Option<String>,
    pub settings: AllocationSettings,
}

/// What Start reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub resumed: bool,
    pub last_executor_id: u64,
}

/// Shared context of every application: the Kubernetes client, the shared watches, the clock.
#[derive(Clone)]
pub struct ServiceContext {
    pub client: kube::Client,
    pub clock: Arc<dyn Clock>,
}

/// The registry of running applications.
#[derive(Clone)]
pub struct Applications {}

impl Applications {
    /// A registry using `ctx` for every application.
    pub fn new(_ctx: ServiceContext) -> Self {
        todo!("service")
    }
    /// Starts (or resumes) an application; idempotent for the same id and namespace.
    pub async fn start(&self, _req: StartApplication) -> Result<Started, AppError> {
        todo!("service")
    }
    /// Sets targets per profile (profiles left out keep theirs).
    pub async fn set_total_expected(
        &self,
        _app: &AppId,
        _targets: BTreeMap<ResourceProfileId, u32>,
    ) -> Result<(), AppError> {
        todo!("service")
    }
    /// IsDeleted for one executor.
    pub async fn is_deleted(&self, _app: &AppId, _id: ExecutorId) -> Result<bool, AppError> {
        todo!("service")
    }
    /// Replaces the scheduler-known executors.
    pub async fn update_registered(
        &self,
        _app: &AppId,
        _ids: BTreeSet<ExecutorId>,
    ) -> Result<(), AppError> {
        todo!("service")
    }
    /// Deletes every executor pod of the application and forgets it; returns pods deleted.
    pub async fn stop(&self, _app: &AppId) -> Result<u32, AppError> {
        todo!("service")
    }
    /// The application's allocation state.
    pub async fn status(&self, _app: &AppId) -> Result<AllocatorStatus, AppError> {
        todo!("service")
    }
    /// True once the Kubernetes watches have synced at least once (health).
    pub fn is_synced(&self) -> bool {
        todo!("service")
    }
}
