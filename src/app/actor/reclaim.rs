//! Giving executors back to a budget's owner (reclaim): which executors, the RECLAIM
//! events asking the driver, and the deletes once each executor exited or its deadline
//! passed. How many to give back is the ledger's word ([`BudgetMembership::reclaim`]).
//!
//! [`BudgetMembership::reclaim`]: crate::app::budgets::BudgetMembership::reclaim
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::reclaims::Asked;
use super::serve::ApplicationActor;
use super::work::DeleteKind;
use crate::allocator::{ExecutorId, ExecutorState, Timestamp, listed};
use crate::app::budgets::ReclaimAsk;
use crate::app::feed::ReclaimRequest;

/// An executor that may be given back, ordered as chosen: not registered first, Pending
/// first, the fewest running tasks said first (none said: after), the newest first.
type Candidate = (bool, u8, (u8, u32), std::cmp::Reverse<ExecutorId>);

impl ApplicationActor {
    /// A round's first step: executors asked back that exited, or whose deadline passed,
    /// are deleted (before the round counts, so they no longer do).
    pub(super) fn settle_step(&mut self, now: Timestamp) {
        self.settle_reclaims(now);
    }

    /// A round's last step, once it reported its use: what the ledger asks back now is
    /// chosen and asked for; the ledger counts what is being given back at once (those
    /// deleted at once too, until the next round's report leaves them out).
    pub(super) fn reclaim_step(&mut self, now: Timestamp) {
        let giving_back = self.reclaims.giving_back();
        if let Some(ask) = self.budget.reclaim(giving_back, now) {
            let at_once = self.give_back(&ask, now);
            (self.budget).giving_back(self.reclaims.giving_back().saturating_add(at_once));
        }
    }

    /// Executor `id`'s pod is gone: its reclaim is over (graceful when it went before it
    /// was deleted: the driver or someone removed it in time).
    pub(super) fn reclaim_pod_gone(&mut self, id: ExecutorId) {
        if let Some(asked) = self.reclaims.asked.remove(&id)
            && !asked.deleted
        {
            self.requests.metrics.reclaim_completed(&asked.budget, true);
        }
    }

    /// Deletes each executor asked back that exited (graceful) or whose deadline passed
    /// (forced); forgets those whose pods are gone.
    fn settle_reclaims(&mut self, now: Timestamp) {
        let executors = &self.feed.store().current().executors;
        let mut gone = Vec::new();
        let mut exited = Vec::new();
        let mut forced = Vec::new();
        for (id, asked) in &self.reclaims.asked {
            let Some(executor) = executors.get(id) else {
                gone.push(*id);
                continue;
            };
            if asked.deleted {
                continue;
            }
            let ended = matches!(
                executor.state,
                ExecutorState::Succeeded { .. }
                    | ExecutorState::Failed { .. }
                    | ExecutorState::Deleted
                    | ExecutorState::Terminating
            );
            if ended {
                exited.push(*id);
            } else if asked.deadline <= now {
                forced.push(*id);
            }
        }
        for id in gone {
            self.reclaim_pod_gone(id);
            self.feed.reclaim_over(id);
        }
        if !exited.is_empty() {
            tracing::info!(executors = %listed(&exited), "executors asked back exited; deleting their pods");
            self.delete_reclaimed(&exited, true, now);
        }
        if !forced.is_empty() {
            tracing::info!(executors = %listed(&forced), "executors asked back did not exit by their deadline; deleting their pods (forced)");
            self.delete_reclaimed(&forced, false, now);
        }
    }

    /// Deletes executors asked back (`graceful`: they exited first).
    fn delete_reclaimed(&mut self, ids: &[ExecutorId], graceful: bool, now: Timestamp) {
        for id in ids {
            if let Some(asked) = self.reclaims.asked.get_mut(id) {
                asked.deleted = true;
                self.requests
                    .metrics
                    .reclaim_completed(&asked.budget, graceful);
            }
            self.feed.reclaim_over(*id);
        }
        self.delete_now(ids, now);
    }

    /// Deletes `ids` as given back: the engine no longer counts them, and the next round
    /// sends the delete (the clean-up of finished executors leaves them to it).
    fn delete_now(&mut self, ids: &[ExecutorId], now: Timestamp) {
        self.engine.allocator.reclaimed(ids.iter().copied(), now);
        self.backlog.finished_handled.extend(ids.iter().copied());
        (self
            .backlog
            .retry_deletes
            .entry(DeleteKind::Reclaim)
            .or_default())
        .extend(ids);
    }

    /// Gives back `ask.count` executors: those the driver has not registered first (deleted
    /// at once: nothing to migrate), the newest first; then registered ones with the
    /// fewest running tasks as the driver last said (those it said nothing of last), the
    /// newest first among equals. A registered one is asked for with a RECLAIM event and
    /// deleted once it exited or at the deadline; under a deadline of 0, at once. Returns
    /// how many were deleted at once.
    fn give_back(&mut self, ask: &ReclaimAsk, now: Timestamp) -> u64 {
        let allocator = &self.engine.allocator;
        let mut candidates: Vec<Candidate> = (self.feed.store().current().executors.values())
            .filter(|e| matches!(e.state, ExecutorState::Running | ExecutorState::Pending))
            .filter(|e| !allocator.is_deleted(e.id) && !self.reclaims.asked.contains_key(&e.id))
            .map(|e| {
                let registered = allocator.is_registered(e.id);
                let pending = u8::from(e.state != ExecutorState::Pending);
                let tasks = match self.reclaims.running_tasks.get(&e.id) {
                    Some(tasks) => (0, *tasks),
                    None => (1, 0),
                };
                (registered, pending, tasks, std::cmp::Reverse(e.id))
            })
            .collect();
        candidates.sort_unstable();
        let chosen: Vec<(bool, ExecutorId)> = (candidates.into_iter())
            .take(usize::try_from(ask.count).unwrap_or(usize::MAX))
            .map(|(registered, _, _, id)| (registered, id.0))
            .collect();
        if chosen.is_empty() {
            return 0;
        }
        let budget: Arc<str> = Arc::from(ask.budget.as_str());
        let metrics = self.requests.metrics.clone();
        metrics.reclaims_requested(&ask.budget, chosen.len() as u64);
        let unregistered: Vec<ExecutorId> = (chosen.iter())
            .filter(|(registered, _)| !registered)
            .map(|(_, id)| *id)
            .collect();
        let registered: Vec<ExecutorId> = (chosen.iter())
            .filter(|(registered, _)| *registered)
            .map(|(_, id)| *id)
            .collect();
        for _ in &unregistered {
            metrics.reclaim_completed(&ask.budget, true);
        }
        let forced = ask.deadline_ms == 0;
        if forced {
            for _ in &registered {
                metrics.reclaim_completed(&ask.budget, false);
            }
        }
        let deadline = now.plus(Duration::from_millis(ask.deadline_ms));
        tracing::info!(budget = %ask.budget, deadline_ms = ask.deadline_ms, unregistered = %listed(&unregistered),
            registered = %listed(&registered), "executors asked back for a budget's owner below its guaranteed part");
        let mut at_once: BTreeSet<ExecutorId> = unregistered.into_iter().collect();
        if forced {
            at_once.extend(registered.iter().copied());
        }
        let executors = &self.feed.store().current().executors;
        for id in at_once.iter().chain(registered.iter()) {
            let Some(profile) = executors.get(id).map(|e| e.profile) else {
                continue;
            };
            let deleted = at_once.contains(id);
            self.reclaims.asked.entry(*id).or_insert(Asked {
                profile,
                budget: Arc::clone(&budget),
                deadline,
                deleted,
                asked_driver: !deleted,
            });
        }
        if !forced {
            for id in &registered {
                let request = ReclaimRequest {
                    deadline_ms: deadline.0,
                    budget: Arc::clone(&budget),
                };
                self.feed.reclaim(*id, request);
            }
        }
        let at_once: Vec<ExecutorId> = at_once.into_iter().collect();
        if !at_once.is_empty() {
            self.delete_now(&at_once, now);
        }
        at_once.len() as u64
    }
}
