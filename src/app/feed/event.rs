//! What a stream carries: events and the executor pods they show.
use std::sync::Arc;

use crate::allocator::ExecutorPod;

/// What an event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// One executor of a full state (the first after a `Synced`, or of a stream, begins it).
    Snapshot,
    /// Closes a full state: its executors replace everything known.
    Synced,
    /// An executor pod was added or changed.
    Updated,
    /// An executor pod is gone.
    Deleted,
    /// The service asks the driver to give the executor back by a deadline (a budget's
    /// owner wants its guaranteed part): a change, and again after the `Synced` of a full
    /// state while the reclaim lasts.
    Reclaim,
}

/// Why and by when an executor is asked back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimRequest {
    /// When its pod is deleted if its executor has not exited (ms since the Unix epoch).
    pub deadline_ms: i64,
    /// The budget asking.
    pub budget: Arc<str>,
}

/// An executor pod as the feed shows it.
#[derive(Debug, Clone)]
pub struct ExecutorView {
    /// Its id, profile, state (as Spark classifies it) and pod name.
    pub executor: ExecutorPod,
    /// The pod's phase (`None` when it has none yet).
    pub phase: Option<String>,
    /// The pod as last seen (as it went, for a deleted one), as JSON: what the stream
    /// sends, and a fraction of the decoded pod's memory.
    pub pod_json: Arc<str>,
    /// The pod's resourceVersion (a replayed version is no change).
    pub resource_version: Option<String>,
}

/// One event of a stream.
#[derive(Debug, Clone)]
pub struct ExecutorEvent {
    /// The change's number; a full state's events carry the number of the state they show.
    pub sequence: u64,
    pub kind: EventKind,
    /// The executor (none for `Synced`).
    pub executor: Option<Arc<ExecutorView>>,
    /// Set for `Reclaim`.
    pub reclaim: Option<ReclaimRequest>,
}

/// What one queued change costs besides its pod's JSON: the event, its view (shared with
/// the history and the other streams, counted here in full so the bound holds for a
/// stream alone) and its slot in the queue.
pub(super) const CHANGE_OVERHEAD_BYTES: usize =
    std::mem::size_of::<ExecutorEvent>() + std::mem::size_of::<ExecutorView>() + 64;

/// What a queued change holds: its pod's JSON and [`CHANGE_OVERHEAD_BYTES`].
pub(super) fn change_bytes(event: &ExecutorEvent) -> usize {
    CHANGE_OVERHEAD_BYTES
        + event
            .executor
            .as_ref()
            .map_or(0, |view| view.pod_json.len())
}
