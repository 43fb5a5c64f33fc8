//! One WatchExecutors stream: its bounded queue, written by the feed and read by the stream.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::event::{EventKind, ExecutorEvent, change_bytes};

/// One stream's queue, shared by the feed (writer) and the stream (reader).
#[derive(Debug, Default)]
pub(super) struct Queue {
    pub(super) state: Mutex<QueueState>,
    pub(super) ready: Notify,
}

#[derive(Debug, Default)]
pub(super) struct QueueState {
    pub(super) events: VecDeque<ExecutorEvent>,
    /// Changes (not full-state events) in `events`.
    pub(super) unread_changes: usize,
    /// What those changes hold ([`change_bytes`]).
    pub(super) unread_bytes: usize,
    /// Waiting for a full state: no change is added until it replaces `events`.
    pub(super) awaiting: bool,
    /// The feed ended: the stream ends once `events` is read.
    pub(super) closed: bool,
    /// How often the reader was too slow and given a fresh full state.
    pub(super) refreshes: u64,
}

impl Queue {
    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// The reading end of one stream.
#[derive(Debug)]
pub struct ExecutorEvents {
    pub(super) queue: Arc<Queue>,
    /// Counts the stream against the tenant limits while it is open.
    pub(super) _slot: Option<crate::app::tenants::StreamSlot>,
    /// Set when the application's actor stops because its shard moves to another replica.
    pub(super) moving: Option<Arc<AtomicBool>>,
}

impl ExecutorEvents {
    /// The next event, waiting for one; `None` once the application's actor ended and
    /// everything was read.
    pub async fn next(&mut self) -> Option<ExecutorEvent> {
        loop {
            {
                let mut state = self.queue.lock();
                if let Some(event) = state.events.pop_front() {
                    if matches!(
                        event.kind,
                        EventKind::Updated | EventKind::Deleted | EventKind::Reclaim
                    ) {
                        state.unread_changes = state.unread_changes.saturating_sub(1);
                        state.unread_bytes =
                            state.unread_bytes.saturating_sub(change_bytes(&event));
                    }
                    return Some(event);
                }
                if state.closed {
                    return None;
                }
            }
            // A notify without a waiter leaves a permit, so none is lost in between.
            self.queue.ready.notified().await;
        }
    }

    /// The same stream, holding `slot` (given back when the stream is dropped).
    pub fn holding(mut self, slot: crate::app::tenants::StreamSlot) -> Self {
        self._slot = Some(slot);
        self
    }

    /// The same stream, ending for a move when `moving` is set by the time it ends.
    pub fn noting_moves(mut self, moving: Arc<AtomicBool>) -> Self {
        self.moving = Some(moving);
        self
    }

    /// Whether the stream ended because its application moved to another replica (its
    /// events go on there), not because the application ended.
    pub fn ended_by_move(&self) -> bool {
        self.queue.lock().closed
            && (self.moving.as_ref()).is_some_and(|moving| moving.load(Ordering::SeqCst))
    }

    /// How often this stream was given a fresh full state because it read too slowly.
    pub fn refreshes(&self) -> u64 {
        self.queue.lock().refreshes
    }
}
