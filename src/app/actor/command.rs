//! The messages a handle sends its actor, and the report it gets back.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::oneshot;

use crate::allocator::{
    AllocatorStatus, ExecutorId, ExecutorPodsSnapshot, ResourceProfileId, Timestamp,
};
use crate::app::error::AppError;
use crate::app::failures::{CreateFailure, ExecutorFailure};
use crate::app::feed::ExecutorEvents;

/// The messages an actor answers; each carries its reply channel.
pub(super) enum Command {
    /// Registers templates of profiles (all or none), then sets targets.
    SetTargets {
        templates: BTreeMap<ResourceProfileId, Pod>,
        targets: BTreeMap<ResourceProfileId, u32>,
        reply: oneshot::Sender<Result<(), AppError>>,
    },
    IsDeleted(ExecutorId, oneshot::Sender<bool>),
    /// The registered executors, and the tasks running on them (as the driver said).
    UpdateRegistered(
        BTreeSet<ExecutorId>,
        BTreeMap<ExecutorId, u32>,
        oneshot::Sender<()>,
    ),
    Report(oneshot::Sender<ActorReport>),
    Snapshot(oneshot::Sender<ExecutorPodsSnapshot>),
    /// Opens an executor event stream resuming after a sequence (0: full state).
    WatchExecutors(u64, oneshot::Sender<ExecutorEvents>),
    Stop,
}

/// The allocator's status plus how many rounds the actor ran.
#[derive(Debug, Clone)]
pub(crate) struct ActorReport {
    pub status: AllocatorStatus,
    pub rounds: u64,
    pub next_round_at: Timestamp,
    /// The driver pod's life as the actor follows it (`None` without a driver pod).
    pub driver: Option<DriverReport>,
    /// The last failed create per profile.
    pub create_failures: BTreeMap<ResourceProfileId, CreateFailure>,
    /// No round before this while backing off after failed create rounds.
    pub backoff_until: Option<Timestamp>,
    /// Executors that failed or cannot start.
    pub failed_executors: Vec<ExecutorFailure>,
    /// The budget that held executors back in the last round, when it held any.
    pub held_by: Option<crate::app::budgets::HeldBy>,
}

/// The driver pod of an application, as its actor follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverReport {
    pub pod_name: String,
    /// Its phase as last seen (`Pending`, `Running`, `Succeeded`, `Failed`), or `Deleted`.
    pub phase: Option<String>,
    /// When the service saw it end (Succeeded, Failed or deleted).
    pub ended_at: Option<Timestamp>,
    /// When the ended application is forgotten.
    pub forget_at: Option<Timestamp>,
}
