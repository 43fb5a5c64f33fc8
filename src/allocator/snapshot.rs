//! The snapshot store of one application: fed by watch events and full resyncs, drained
//! by the allocation loop at most once per batch delay.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::settings::duration_ms;
use super::state::{ExecutorPod, ExecutorState};
use super::types::{ExecutorId, Timestamp};

/// Executor id → executor, as last seen from the Kubernetes API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutorPodsSnapshot {
    pub executors: BTreeMap<ExecutorId, ExecutorPod>,
    /// When the last full resync happened.
    pub full_resync_at: Timestamp,
}

/// Everything buffered since the subscriber's last call.
///
/// `latest` is shared with the store: drop the batch (or at least its `latest`) before the
/// store's next update, or that update has to copy the whole snapshot.
#[derive(Debug, Clone, Default)]
pub struct SnapshotBatch {
    /// How many snapshots (pod updates or resyncs) were buffered; 0 = none.
    pub snapshot_count: usize,
    /// Every executor id present in any buffered snapshot.
    pub seen_ids: BTreeSet<ExecutorId>,
    /// The latest snapshot (meaningful when `snapshot_count > 0`).
    pub latest: Arc<ExecutorPodsSnapshot>,
}

/// Per-application snapshot store and subscriber timing.
///
/// Every watch event or resync counts as one buffered snapshot, as in Spark; instead of
/// keeping each snapshot, the store keeps the latest one and the ids seen since the last
/// poll, which is all a round reads. An update is O(log n) and a poll O(1): the batch
/// shares the snapshot (copy-on-write) instead of copying it.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    batch_delay_ms: i64,
    current: Arc<ExecutorPodsSnapshot>,
    buffered: usize,
    seen_ids: BTreeSet<ExecutorId>,
    next_due: Timestamp,
    last_poll: Timestamp,
    /// "Notify now" was called since the last poll.
    notified: bool,
}

impl SnapshotStore {
    /// A store whose subscriber is due at once (the start round, with the empty snapshot).
    pub fn new(batch_delay: Duration, now: Timestamp) -> Self {
        Self {
            batch_delay_ms: duration_ms(batch_delay),
            current: Arc::new(ExecutorPodsSnapshot {
                executors: BTreeMap::new(),
                full_resync_at: now,
            }),
            buffered: 1,
            seen_ids: BTreeSet::new(),
            next_due: now,
            last_poll: now,
            notified: false,
        }
    }
    /// One pod changed (watch ADDED/MODIFIED).
    pub fn update_pod(&mut self, pod: ExecutorPod) {
        self.seen_ids.insert(pod.id);
        Arc::make_mut(&mut self.current)
            .executors
            .insert(pod.id, pod);
        self.buffered += 1;
    }
    /// One pod was deleted (watch DELETED): recorded as state Deleted.
    pub fn delete_pod(&mut self, mut pod: ExecutorPod) {
        pod.state = ExecutorState::Deleted;
        self.update_pod(pod);
    }
    /// A full LIST replaces the snapshot wholesale.
    pub fn replace_all(&mut self, pods: Vec<ExecutorPod>, now: Timestamp) {
        let executors: BTreeMap<ExecutorId, ExecutorPod> =
            pods.into_iter().map(|p| (p.id, p)).collect();
        self.seen_ids.extend(executors.keys().copied());
        self.current = Arc::new(ExecutorPodsSnapshot {
            executors,
            full_resync_at: now,
        });
        self.buffered += 1;
    }
    /// A full LIST, taken in place: the executors of `listed` (ascending ids) stay as they
    /// are, `changed` ones are replaced, every other one is dropped. The same snapshot as
    /// [`Self::replace_all`] with the unchanged executors, without building a second one.
    pub fn resync(&mut self, listed: &[ExecutorId], changed: Vec<ExecutorPod>, now: Timestamp) {
        let snapshot = Arc::make_mut(&mut self.current);
        snapshot
            .executors
            .retain(|id, _| listed.binary_search(id).is_ok());
        for pod in changed {
            snapshot.executors.insert(pod.id, pod);
        }
        snapshot.full_resync_at = now;
        self.seen_ids.extend(snapshot.executors.keys().copied());
        self.buffered += 1;
    }
    /// Makes the subscriber due `delay_ms` after its last poll, if not sooner.
    pub fn due_within(&mut self, delay: Duration) {
        let at = Timestamp(self.last_poll.0.saturating_add(duration_ms(delay)));
        self.next_due = self.next_due.min(at);
    }
    /// Makes the subscriber due immediately ("notify now").
    pub fn notify_now(&mut self) {
        self.notified = true;
    }
    /// When the subscriber is next due.
    pub fn next_due(&self) -> Timestamp {
        if self.notified {
            self.next_due.min(self.last_poll)
        } else {
            self.next_due
        }
    }
    /// If the subscriber is due at `now`, drains the buffer and restarts the delay.
    pub fn poll(&mut self, now: Timestamp) -> Option<SnapshotBatch> {
        // The clock is wall time: if it went back before the last poll, start over from now
        // rather than wait for a due time that may be far ahead.
        let due = self.notified || now >= self.next_due || now < self.last_poll;
        if !due {
            return None;
        }
        self.last_poll = now;
        self.notified = false;
        self.next_due = Timestamp(now.0.saturating_add(self.batch_delay_ms));
        let snapshot_count = std::mem::take(&mut self.buffered);
        let latest = if snapshot_count > 0 {
            Arc::clone(&self.current)
        } else {
            Arc::default()
        };
        Some(SnapshotBatch {
            snapshot_count,
            seen_ids: std::mem::take(&mut self.seen_ids),
            latest,
        })
    }
    /// The current snapshot.
    pub fn current(&self) -> &ExecutorPodsSnapshot {
        &self.current
    }
    /// Every executor id changed since the last poll (the next batch's `seen_ids`).
    pub fn seen_since_poll(&self) -> &BTreeSet<ExecutorId> {
        &self.seen_ids
    }
    /// How many snapshots are buffered for the next poll.
    pub fn buffered(&self) -> usize {
        self.buffered
    }
}
