//! When an actor wakes next, decided in one place: the [`Scheduler`].
use std::time::Duration;

use super::phase::Phase;
use crate::allocator::{ADAPTIVE_PACE_PER_BATCH_DELAY, SnapshotStore, Timestamp};

/// Longest backoff after failed create rounds (unless the batch delay is longer).
const MAX_CREATE_BACKOFF: Duration = Duration::from_secs(60);

/// Owns the actor's next wake-up. While running: the next round, when the snapshot store
/// is due (a batch delay after the last poll, or at once when notified) and no backoff
/// after rounds whose creates all failed holds it back. Once the driver ended: the
/// executors' clean-up (and its retries), then forgetting the application.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Scheduler {
    /// Consecutive rounds whose creates all failed.
    failed_create_rounds: u32,
    /// No round before this (0 = no backoff).
    backoff_until: Timestamp,
}

impl Scheduler {
    /// When the actor is next to wake by itself, in `phase`, while `upkeep_in_flight` (a
    /// round's upkeep is unanswered: the next round waits for it, so a failed delete is
    /// retried and ids are recorded in order) or `work_in_flight` (any of its work). `None`:
    /// only a message wakes it.
    pub fn next_wake(
        &self,
        store: &SnapshotStore,
        phase: &Phase,
        upkeep_in_flight: bool,
        work_in_flight: bool,
    ) -> Option<Timestamp> {
        match phase {
            Phase::Running { .. } => (!upkeep_in_flight).then(|| self.next_round_at(store)),
            Phase::Ended(ended) => (!work_in_flight).then(|| {
                ended
                    .cleanup_due
                    .map_or(ended.forget_at, |at| at.min(ended.forget_at))
            }),
            Phase::Ending { .. } => None,
        }
    }

    /// When the next round may run.
    pub fn next_round_at(&self, store: &SnapshotStore) -> Timestamp {
        store.next_due().max(self.backoff_until)
    }

    /// New targets were set; `idle` (nothing outstanding: the engine's answer) calls a
    /// round at once, as Spark does, though never before a backoff ends.
    pub fn targets_changed(&self, store: &mut SnapshotStore, idle: bool) {
        if idle {
            store.notify_now();
        }
    }

    /// The ADAPTIVE window held the last round back: the next comes a tenth of a batch
    /// delay after it (see [`ADAPTIVE_PACE_PER_BATCH_DELAY`]), though never before a
    /// backoff ends.
    pub fn window_bound(&self, store: &mut SnapshotStore, batch_delay: Duration) {
        let pace = batch_delay / ADAPTIVE_PACE_PER_BATCH_DELAY;
        store.due_within(pace);
    }

    /// A round's creates were not all refused: no backoff.
    pub fn creates_went_through(&mut self) {
        self.failed_create_rounds = 0;
        self.backoff_until = Timestamp(0);
    }

    /// Every create of a round failed, or a round deleted pods stuck past the timeout
    /// (creates that gave no executor): the next round waits 2, 4, 8, … batch delays (at
    /// most [`MAX_CREATE_BACKOFF`], unless the batch delay is longer); returns the wait.
    pub fn creates_all_failed(&mut self, batch_delay: Duration, now: Timestamp) -> Duration {
        self.failed_create_rounds = self.failed_create_rounds.saturating_add(1);
        let backoff = batch_delay
            .saturating_mul(1 << self.failed_create_rounds.min(6))
            .min(MAX_CREATE_BACKOFF.max(batch_delay));
        self.backoff_until = now.plus(backoff);
        backoff
    }

    /// The API server asked for `wait` before the next request (Retry-After): no round
    /// before `now + wait` (at most [`MAX_CREATE_BACKOFF`]), whatever a backoff says.
    pub fn wait_at_least(&mut self, wait: Duration, now: Timestamp) {
        let until = now.plus(wait.min(MAX_CREATE_BACKOFF));
        self.backoff_until = self.backoff_until.max(until);
    }

    /// The end of the backoff under way at `now`, if any.
    pub fn backoff_until(&self, now: Timestamp) -> Option<Timestamp> {
        Some(self.backoff_until).filter(|until| *until > now)
    }

    /// When a failed clean-up after the driver ended is tried again: one batch delay later.
    pub fn cleanup_retry_at(&self, batch_delay: Duration, now: Timestamp) -> Timestamp {
        now.plus(batch_delay)
    }
}
