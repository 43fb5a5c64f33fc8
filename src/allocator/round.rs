//! One allocation round per application: Spark's rules, returning a plan to carry out.
use std::collections::{BTreeMap, BTreeSet};

use super::settings::AllocationSettings;
use super::snapshot::SnapshotBatch;
use super::types::{ExecutorId, ResourceProfileId, Timestamp};

/// A collection delete to carry out by label `spark-exec-id in (ids)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRequest {
    pub ids: Vec<ExecutorId>,
    /// Add `fieldSelector=status.phase=Pending` (downscale), so a pod that just started is spared.
    pub only_pending: bool,
}

/// What a round decided; the caller creates and deletes accordingly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundPlan {
    /// Executors to create, in id order.
    pub creates: Vec<(ExecutorId, ResourceProfileId)>,
    /// Collection deletes to issue.
    pub deletes: Vec<DeleteRequest>,
    /// Executors requested beyond `max_executors`: refused, per profile count.
    pub refused: BTreeMap<ResourceProfileId, u32>,
    /// Newly created executors forgotten after the creation timeout.
    pub timed_out: Vec<ExecutorId>,
    /// Unknown pending + newly created executors remain.
    pub outstanding: bool,
}

/// Counts of one resource profile, for status reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileCounts {
    pub target: u32,
    pub running: u32,
    pub pending: u32,
    pub newly_created: u32,
}

/// A report of an application's allocation state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatorStatus {
    pub profiles: BTreeMap<ResourceProfileId, ProfileCounts>,
    pub deleted: BTreeSet<ExecutorId>,
    pub last_executor_id: u64,
    pub outstanding: bool,
}

/// The allocation state of one application.
#[derive(Debug)]
pub struct Allocator {}

impl Allocator {
    /// Starts after `last_executor_id` (0 for a new application, the highest id found on resume).
    pub fn new(_settings: AllocationSettings, _last_executor_id: u64) -> Self {
        todo!("engine")
    }
    /// Stores the targets (profiles left out keep theirs). Returns true when nothing is
    /// outstanding, i.e. the caller should run a round now (notify now).
    pub fn set_targets(&mut self, _targets: &BTreeMap<ResourceProfileId, u32>) -> bool {
        todo!("engine")
    }
    /// Replaces the set of executors registered with the driver (scheduler-known).
    pub fn set_registered(&mut self, _ids: BTreeSet<ExecutorId>) {
        todo!("engine")
    }
    /// One allocation round.
    pub fn round(&mut self, _batch: SnapshotBatch, _now: Timestamp) -> RoundPlan {
        todo!("engine")
    }
    /// A create of the plan failed: forget the request so a later round asks again (new id).
    pub fn create_failed(&mut self, _id: ExecutorId) {
        todo!("engine")
    }
    /// True iff the allocator deleted `id` and it is still in the last snapshot.
    pub fn is_deleted(&self, _id: ExecutorId) -> bool {
        todo!("engine")
    }
    /// The highest executor id used so far.
    pub fn last_executor_id(&self) -> u64 {
        todo!("engine")
    }
    /// A report for GetStatus.
    pub fn status(&self) -> AllocatorStatus {
        todo!("engine")
    }
}
