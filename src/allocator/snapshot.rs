//! The snapshot store of one application: fed by watch events and full resyncs, drained
//! by the allocation loop at most once per batch delay.
use std::collections::BTreeMap;
use std::time::Duration;

use super::state::ExecutorPod;
use super::types::{ExecutorId, Timestamp};

/// Executor id → executor, as last seen from the Kubernetes API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutorPodsSnapshot {
    pub executors: BTreeMap<ExecutorId, ExecutorPod>,
    /// When the last full resync happened.
    pub full_resync_at: Timestamp,
}

/// Everything buffered since the subscriber's last call.
#[derive(Debug, Clone, Default)]
pub struct SnapshotBatch {
    /// How many snapshots (pod updates or resyncs) were buffered; 0 = none.
    pub snapshot_count: usize,
    /// Every executor id present in any buffered snapshot.
    pub seen_ids: std::collections::BTreeSet<ExecutorId>,
    /// The latest snapshot (meaningful when `snapshot_count > 0`).
    pub latest: ExecutorPodsSnapshot,
}

/// Per-application snapshot store and subscriber timing.
#[derive(Debug)]
pub struct SnapshotStore {}

impl SnapshotStore {
    /// A store whose subscriber is due at once (the start round, with no snapshot).
    pub fn new(_batch_delay: Duration, _now: Timestamp) -> Self {
        todo!("engine")
    }
    /// One pod changed (watch ADDED/MODIFIED).
    pub fn update_pod(&mut self, _pod: ExecutorPod) {
        todo!("engine")
    }
    /// One pod was deleted (watch DELETED): recorded as state Deleted.
    pub fn delete_pod(&mut self, _pod: ExecutorPod) {
        todo!("engine")
    }
    /// A full LIST replaces the snapshot wholesale.
    pub fn replace_all(&mut self, _pods: Vec<ExecutorPod>, _now: Timestamp) {
        todo!("engine")
    }
    /// Makes the subscriber due immediately ("notify now").
    pub fn notify_now(&mut self) {
        todo!("engine")
    }
    /// When the subscriber is next due.
    pub fn next_due(&self) -> Timestamp {
        todo!("engine")
    }
    /// If the subscriber is due at `now`, drains the buffer and restarts the delay.
    pub fn poll(&mut self, _now: Timestamp) -> Option<SnapshotBatch> {
        todo!("engine")
    }
    /// The current snapshot.
    pub fn current(&self) -> &ExecutorPodsSnapshot {
        todo!("engine")
    }
}
