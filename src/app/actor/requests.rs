//! The timing of executor requests, for the metrics.
use std::collections::BTreeMap;
use std::time::Instant;

use crate::allocator::{ExecutorId, ExecutorPod, ExecutorState, ResourceProfileId};
use crate::metrics::Metrics;

/// The creates in flight and the executors not yet Running, timed for the metrics'
/// request-to-seen and request-to-Running latencies (wall time).
pub(super) struct RequestTimes {
    pub metrics: Metrics,
    /// When each executor not yet Running was requested, and whether its pod was seen.
    requested_at: BTreeMap<ExecutorId, (Instant, bool)>,
    /// The profile of each create in flight.
    create_profiles: BTreeMap<ExecutorId, ResourceProfileId>,
}

impl RequestTimes {
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            requested_at: BTreeMap::new(),
            create_profiles: BTreeMap::new(),
        }
    }

    /// A create of `profile` is being sent now.
    pub fn requested(&mut self, id: ExecutorId, profile: ResourceProfileId) {
        self.create_profiles.insert(id, profile);
        self.requested_at.insert(id, (Instant::now(), false));
    }

    /// The create of `id` was answered: its profile.
    pub fn answered(&mut self, id: ExecutorId) -> ResourceProfileId {
        self.create_profiles.remove(&id).unwrap_or_default()
    }

    /// `id` is no longer timed (its create failed, it timed out, its pod went).
    pub fn forget(&mut self, id: ExecutorId) {
        self.requested_at.remove(&id);
    }

    /// The time from an executor's request to its pod first seen, and to Running, into the
    /// metrics (once each; a pod that ends before Running is timed as seen only).
    pub fn seen(&mut self, executor: &ExecutorPod) {
        let Some((requested, seen)) = self.requested_at.get_mut(&executor.id) else {
            return;
        };
        let elapsed = requested.elapsed();
        if !*seen {
            *seen = true;
            self.metrics.executor_seen_after(elapsed);
        }
        match executor.state {
            ExecutorState::Pending => {}
            ExecutorState::Running => {
                self.metrics.executor_running_after(elapsed);
                self.requested_at.remove(&executor.id);
            }
            _ => {
                self.requested_at.remove(&executor.id);
            }
        }
    }
}
