//! Beyond Spark: pending executors that will not start by themselves. Spark lets such a
//! pod hold its pending slot until the creation or idle timeout; here, past
//! `stuck_pending_timeout_ms`:
//! - a pod whose container waits for an image or its configuration
//!   ([`super::start_blocker::DELETED_WAITING_REASONS`]) is deleted, its slot freed, and reported;
//! - an unschedulable pod is reported but kept (the cluster may free room), and its profile
//!   creates no more pods while its oldest pending pod is unschedulable past the timeout.
//!
//! When a pod became stuck is the time of the first round whose snapshot showed it so,
//! on the engine's injected clock: a container's waiting state carries no time, and the
//! pod's own times (conditions, creationTimestamp) are the API server's clock, not the
//! engine's. So the rule is deterministic under a manual clock; a restarted service starts
//! the wait again (a stuck pod is acted on at most one timeout late).
use std::collections::BTreeMap;

use super::snapshot::SnapshotBatch;
use super::start_blocker::StartBlocker;
use super::state::ExecutorState;
use super::types::{ExecutorId, ResourceProfileId, Timestamp};

/// A pending executor stuck past the timeout, reported by the round that found it so
/// (once per executor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StuckExecutor {
    pub id: ExecutorId,
    pub profile: ResourceProfileId,
    pub pod_name: String,
    pub blocker: StartBlocker,
    /// When the engine first saw it stuck.
    pub since: Timestamp,
    /// The round deletes its pod (and freed its slot).
    pub deleted: bool,
}

/// One stuck pending executor the engine follows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stuck {
    profile: ResourceProfileId,
    pod_name: String,
    blocker: StartBlocker,
    since: Timestamp,
    reported: bool,
}

/// The pending executors whose pods show a [`StartBlocker`], with when each was first seen so.
#[derive(Debug, Clone, Default)]
pub(crate) struct StuckPods {
    executors: BTreeMap<ExecutorId, Stuck>,
}

impl StuckPods {
    /// Whether no executor is stuck.
    pub(crate) fn is_empty(&self) -> bool {
        self.executors.is_empty()
    }

    /// Takes in the batch's changed executors at `now` (the engine's clock); `tracked`
    /// says which executors the last snapshot still holds (ids gone without being seen).
    pub(crate) fn take_in(
        &mut self,
        batch: &SnapshotBatch,
        now: Timestamp,
        tracked: impl Fn(ExecutorId) -> bool,
    ) {
        for id in &batch.seen_ids {
            let pod = batch.latest.executors.get(id);
            let blocker = pod
                .filter(|p| p.state == ExecutorState::Pending)
                .and_then(|p| p.start_blocker.clone().map(|b| (p, b)));
            let Some((pod, blocker)) = blocker else {
                self.executors.remove(id);
                continue;
            };
            match self.executors.get_mut(id) {
                Some(stuck) if stuck.blocker.same_kind(&blocker) => stuck.blocker = blocker,
                _ => {
                    self.executors.insert(
                        *id,
                        Stuck {
                            profile: pod.profile,
                            pod_name: pod.pod_name.clone(),
                            blocker,
                            since: now,
                            reported: false,
                        },
                    );
                }
            }
        }
        if !self.executors.is_empty() {
            self.executors.retain(|id, _| tracked(*id));
        }
    }

    /// The executors stuck longer than `timeout_ms` at `now` not reported yet, marked
    /// reported, leaving out those `skip` names (deleted already).
    pub(crate) fn newly_past(
        &mut self,
        now: Timestamp,
        timeout_ms: i64,
        skip: impl Fn(ExecutorId) -> bool,
    ) -> Vec<StuckExecutor> {
        let mut past = Vec::new();
        for (id, stuck) in &mut self.executors {
            if stuck.reported || now.millis_since(stuck.since) <= timeout_ms || skip(*id) {
                continue;
            }
            stuck.reported = true;
            past.push(StuckExecutor {
                id: *id,
                profile: stuck.profile,
                pod_name: stuck.pod_name.clone(),
                blocker: stuck.blocker.clone(),
                since: stuck.since,
                deleted: stuck.blocker.deletes_pod(),
            });
        }
        past
    }

    /// Whether `id` is unschedulable for longer than `timeout_ms` at `now`.
    pub(crate) fn unschedulable_past(
        &self,
        id: ExecutorId,
        now: Timestamp,
        timeout_ms: i64,
    ) -> bool {
        self.executors.get(&id).is_some_and(|stuck| {
            !stuck.blocker.deletes_pod() && now.millis_since(stuck.since) > timeout_ms
        })
    }
}
