//! A round: the engine's plan turned into work for the worker, and the results of that
//! work taken back into the engine state.
use std::collections::BTreeSet;

use super::phase::Phase;
use super::serve::ApplicationActor;
use super::work::{CreateResults, DeleteKind, UpkeepDone, UpkeepWork, Work, not_recorded};
use crate::allocator::budget::{self, BudgetClaim, ExecutorCost};
use crate::allocator::{
    AllocationUse, CreateOutcomes, DeleteRequest, ExecutorId, ExecutorState, ResourceProfileId,
    RoundPlan, SnapshotBatch, Timestamp, listed,
};
use crate::app::failures::create_failure_cause;
use crate::k8s::{CreateError, ExecutorCreate};

impl ApplicationActor {
    /// One round if the store is due: the engine's plan, then the worker sends its deletes,
    /// the clean-up of finished executors and the id record, then its creates.
    pub(super) fn round(&mut self) {
        let now = self.clock.now();
        let Some(batch) = self.feed.store_mut().poll(now) else {
            return;
        };
        self.settle_step(now);
        let plan = self.round_within_budgets(batch, now);
        self.reclaim_step(now);
        self.export_counts();
        self.note_plan(&plan);
        if plan.window_bound {
            let delay = self.engine.allocator.settings().batch_delay;
            self.schedule.window_bound(self.feed.store_mut(), delay);
        }
        let upkeep = self.upkeep(plan.deletes, &plan.creates, plan.still_wanted);
        let pods = self.build_pods(plan.creates);
        // Answered later by the worker: no downscale deletes one before its pod exists.
        (self.engine.allocator).creates_sent(pods.iter().map(|create| create.id));
        self.send_round(upkeep, pods);
        // Registered executors the driver sent since the last round.
        self.write_registration();
    }

    /// The engine's round within the room the application's budgets leave it: asked of
    /// the ledger once the round has counted, reported back with what the round asked for.
    fn round_within_budgets(&mut self, batch: SnapshotBatch, now: Timestamp) -> RoundPlan {
        let engine = &mut self.engine;
        // An executor costs the budget what the largest of the profiles asked for costs.
        let cost = (engine.allocator.targets().keys())
            .filter_map(|profile| engine.builder.template(*profile))
            .map(budget::executor_cost)
            .fold(ExecutorCost::default(), ExecutorCost::max);
        // Executors given back count until their pods are gone: the owner's creates
        // never come before the pods they replace went.
        let not_gone = self.reclaims.deleted_not_gone();
        let claim = |usage: &AllocationUse| BudgetClaim {
            weight: 1,
            wanted: usage.wanted,
            using: usage.using.saturating_add(not_gone),
            pending: usage.pending,
            seen: usage.seen.saturating_add(not_gone),
            cost,
            reclaiming: 0,
        };
        let membership = &self.budget;
        let mut bound = None;
        let plan = engine.allocator.round_within(batch, now, &mut |usage| {
            let grant = membership.room(claim(usage));
            bound = grant.bound;
            grant.room
        });
        let held: u64 = plan.held.values().map(|h| u64::from(*h)).sum();
        let created = plan.creates.len() as u64;
        membership.report(claim(&plan.usage), held, bound.as_ref(), created, now);
        if held > 0
            && self.held_by.is_none()
            && let Some(by) = &bound
        {
            tracing::info!(held, budget = %by.budget, resource = by.resource.name(), used = by.used,
                limit = by.limit, share = by.share, "executors held by a budget");
        }
        self.held_by = bound.filter(|_| held > 0);
        plan
    }

    /// Logs what the plan gave up on; timed-out requests are no longer timed. Stuck
    /// executors are counted and reported; a round that deleted any backs off as after
    /// a round whose creates all failed.
    fn note_plan(&mut self, plan: &RoundPlan) {
        let now = self.clock.now();
        let settings = self.engine.allocator.settings();
        let (timeout, delay) = (settings.stuck_pending_timeout, settings.batch_delay);
        for stuck in &plan.stuck {
            self.requests.metrics.executor_stuck(stuck.blocker.reason());
            self.failures.stuck(stuck, timeout, now);
        }
        if plan.stuck.iter().any(|s| s.deleted) {
            let backoff_ms = self.schedule.creates_all_failed(delay, now).as_millis();
            tracing::warn!(backoff_ms, "executor pods deleted as stuck; backing off");
        }
        for id in &plan.timed_out {
            self.requests.forget(*id);
        }
        if !plan.timed_out.is_empty() {
            tracing::warn!(executors = %listed(&plan.timed_out), "executors not seen within the executor timeout; forgotten and re-requested");
        }
        if !plan.refused.is_empty() {
            tracing::warn!(refused = %listed(plan.refused.iter().map(|(profile, n)| format!("{n} of profile {profile}"))), "executors refused: max_executors reached");
        }
    }

    /// The round's requests other than its creates: the plan's deletes with those to
    /// retry, the clean-up of finished executors, the id record covering `creates` (and
    /// a block ahead for the `still_wanted`).
    fn upkeep(
        &mut self,
        deletes: Vec<DeleteRequest>,
        creates: &[(ExecutorId, ResourceProfileId)],
        still_wanted: u64,
    ) -> UpkeepWork {
        for request in deletes {
            self.backlog
                .retry_deletes
                .entry(DeleteKind::of(request.only_pending))
                .or_default()
                .extend(request.ids);
        }
        let settings = self.engine.allocator.settings();
        let max_executors = settings.max_executors;
        let delete_on_termination = settings.delete_on_termination;
        let record = creates
            .iter()
            .map(|(id, _)| id.0)
            .max()
            .and_then(|highest| {
                self.engine
                    .id_blocks
                    .to_record(highest, still_wanted, max_executors)
            })
            .map(ExecutorId);
        UpkeepWork {
            deletes: std::mem::take(&mut self.backlog.retry_deletes),
            finished: self.finished_to_clean_up(),
            delete_on_termination,
            record,
            with_creates: false,
            list_claims: (self.engine.claims.listing_due(self.clock.now()))
                .then(|| self.engine.builder.claims_owner().map(str::to_string))
                .flatten(),
        }
    }

    /// The executor pods of the round's creates, with their claims (a free claim reused
    /// where it may be); one that cannot be built is forgotten. When an executor must wait
    /// for a claim to come free (`wait_to_reuse_claims`), it and the creates after it are
    /// not sent, their ids given back, as Spark's loop stops there.
    fn build_pods(&mut self, creates: Vec<(ExecutorId, ResourceProfileId)>) -> Vec<ExecutorCreate> {
        let now = self.clock.now();
        // Only an application with claim templates reads its pods' claims.
        let mounted = if self.engine.builder.claim_templates().is_empty() {
            BTreeSet::new()
        } else {
            let unseen: BTreeSet<ExecutorId> = (self.engine.allocator.newly_created())
                .map(|(id, _)| id)
                .collect();
            self.engine.claims.keep_requests(|id| unseen.contains(&id));
            self.feed.mounted_claims()
        };
        let claims_owned_by_pod = !self.engine.builder.claims_owned_by_driver();
        let mut pods = Vec::with_capacity(creates.len());
        let mut held = Vec::new();
        for (id, profile) in creates {
            if !held.is_empty() {
                held.push(id);
                continue;
            }
            let mut pod = match self.engine.builder.build(id, profile) {
                Ok(pod) => pod,
                Err(err) => {
                    tracing::error!(executor = id.0, error = %err, "cannot build executor pod");
                    self.engine.allocator.create_failed(id);
                    continue;
                }
            };
            let wanted = self.engine.builder.claims(id, &pod);
            match self
                .engine
                .claims
                .assign(id, &mut pod, wanted, &mounted, now)
            {
                Ok(claims) => {
                    self.requests.requested(id, profile);
                    pods.push(ExecutorCreate {
                        id,
                        pod,
                        claims,
                        claims_owned_by_pod,
                    });
                }
                Err(wait) => {
                    tracing::info!(
                        claims = wait.claims,
                        "waiting to reuse one of the application's claims"
                    );
                    held.push(id);
                }
            }
        }
        if !held.is_empty() {
            self.engine.allocator.creates_not_sent(&held);
        }
        pods
    }

    /// Hands a round's requests to the worker: the upkeep first, the creates once the id
    /// record they need is written. A round with nothing to send is counted at once.
    fn send_round(&mut self, upkeep: UpkeepWork, creates: Vec<ExecutorCreate>) {
        if upkeep.is_empty() {
            if creates.is_empty() {
                self.rounds += 1;
            } else {
                self.outbox.send(Work::Round {
                    upkeep: None,
                    creates,
                });
            }
            return;
        }
        if !creates.is_empty() && upkeep.record.is_some() {
            self.outbox.awaiting_record = creates.iter().map(|c| c.id).collect();
        }
        let upkeep = UpkeepWork {
            with_creates: !creates.is_empty(),
            ..upkeep
        };
        self.outbox.send(Work::Round {
            upkeep: Some(Box::new(upkeep)),
            creates,
        });
    }

    /// A round's upkeep answered: failed deletes and clean-ups wait for the next round.
    pub(super) fn upkeep_done(&mut self, upkeep: UpkeepDone) {
        self.outbox.upkeep = false;
        for (kind, ids) in upkeep.failed_deletes {
            self.backlog
                .retry_deletes
                .entry(kind)
                .or_default()
                .extend(ids);
        }
        for id in upkeep.finished_failed {
            self.backlog.finished_handled.remove(&id);
        }
        if let Some(claims) = upkeep.claims {
            self.engine.claims.listed(claims);
        }
        // A round with creates is counted once they are answered.
        if !upkeep.with_creates {
            self.rounds += 1;
        }
    }

    /// A round's id record answered: the creates waiting for it are being sent, or, when it
    /// failed, were not sent. Nothing is created with ids a restarted service could not
    /// know of: they count as failed creates (backoff included) whose ids go back.
    pub(super) fn id_recorded(&mut self, recorded: Result<Option<ExecutorId>, String>) {
        let awaiting = std::mem::take(&mut self.outbox.awaiting_record);
        match recorded {
            Ok(Some(id)) => self.engine.id_blocks.recorded(id.0),
            Ok(None) => {}
            Err(message) => {
                if !awaiting.is_empty() {
                    self.outbox.creates = self.outbox.creates.saturating_sub(1);
                    self.record_creates(not_recorded(awaiting, &message));
                }
            }
        }
    }

    /// The delete of every executor pod after the driver ended answered; a failed one is
    /// tried again when the scheduler says.
    pub(super) fn cleanup_done(&mut self, result: Result<u32, String>) {
        self.outbox.cleanup = false;
        match result {
            Ok(deleted) => {
                tracing::info!(deleted, "executor pods deleted after the driver ended");
                // Its executors are gone: the others under its budgets need not wait for
                // the application to be forgotten.
                let now = self.clock.now();
                self.budget.report(BudgetClaim::default(), 0, None, 0, now);
                self.held_by = None;
            }
            Err(_) => {
                // Logged with the reason by the worker.
                let delay = self.engine.allocator.settings().batch_delay;
                let retry_at = self.schedule.cleanup_retry_at(delay, self.clock.now());
                if let Phase::Ended(ended) = &mut self.life.phase {
                    ended.cleanup_due = Some(retry_at);
                }
            }
        }
    }

    /// The outcome of a round's creates: forget the failed ones (a later round asks again,
    /// with new ids for creates sent; the ids of creates not sent are given back). When
    /// every create sent failed (quota, invalid spec, outage, id record, shard not owned),
    /// the next round waits 2, 4, 8, … batch delays (at most a minute) instead of asking
    /// again every batch delay; and never before the longest Retry-After the API server
    /// sent.
    pub(super) fn record_creates(&mut self, results: CreateResults) {
        let requested = results.len();
        let mut failed = 0usize;
        let mut held = 0usize;
        let mut first_error = None;
        let mut retry_after = None;
        let mut not_sent = Vec::new();
        let now = self.clock.now();
        for (id, result) in results {
            let profile = self.requests.answered(id);
            match &result {
                Ok(()) => {
                    self.engine.allocator.create_accepted(id, now);
                    self.requests.metrics.pods_created(1);
                    self.failures.create_passed(profile);
                }
                Err(err) => {
                    if let Some((status, reason, _)) = create_failure_cause(err) {
                        self.requests.metrics.pod_create_failed(status, &reason);
                    }
                    if let CreateError::Kubernetes(err) = err {
                        retry_after = retry_after.max(crate::k8s::request::retry_after(err));
                    }
                    self.failures.create_failed(profile, err, now);
                }
            }
            if let Err(err) = result {
                self.requests.forget(id);
                self.engine.claims.create_failed(id);
                let unsent = matches!(
                    err,
                    CreateError::Cancelled
                        | CreateError::Shed
                        | CreateError::IdNotRecorded(_)
                        | CreateError::NotOwner(_)
                );
                if unsent {
                    not_sent.push(id);
                } else if refused(&err) {
                    self.engine.allocator.create_refused(id);
                } else {
                    self.engine.allocator.create_failed(id);
                }
                if matches!(err, CreateError::Cancelled | CreateError::Shed) {
                    held += 1;
                } else {
                    failed += 1;
                    first_error.get_or_insert(err);
                }
            }
        }
        let allocator = &mut self.engine.allocator;
        // No id is spent on a create that was not sent.
        allocator.creates_not_sent(&not_sent);
        if failed == 0 {
            tracing::info!(requested, "executor pods created");
            self.schedule.creates_went_through();
        } else if failed + held < requested {
            tracing::warn!(
                requested,
                failed,
                held,
                error = first_error.map(|e| e.to_string()),
                "some executor pod creates failed"
            );
            self.schedule.creates_went_through();
        } else {
            let delay = allocator.settings().batch_delay;
            let backoff = self.schedule.creates_all_failed(delay, now);
            let backoff_ms = backoff.as_millis();
            tracing::warn!(
                requested,
                held,
                error = first_error.map(|e| e.to_string()),
                backoff_ms,
                "every executor pod create sent failed; backing off"
            );
        }
        if let Some(wait) = retry_after {
            self.schedule.wait_at_least(wait, now);
            tracing::info!(
                retry_after_ms = wait.as_millis(),
                held,
                "the API server asked to wait before the next creates"
            );
        }
        self.rounds += 1;
    }

    /// One create's answer as it came, before its round's: the engine counts it answered
    /// and the ADAPTIVE window takes it in, so a long round paces by its first answers.
    pub(super) fn create_answered(&mut self, id: ExecutorId, outcome: &CreateOutcomes) {
        let now = self.clock.now();
        let allocator = &mut self.engine.allocator;
        if outcome.accepted > 0 {
            allocator.create_accepted(id, now);
        }
        allocator.creates_answered(outcome, now);
    }

    /// Failed and succeeded executors not handled yet (their pod to delete or label
    /// inactive), marked handled; a failure un-marks them for the next round.
    fn finished_to_clean_up(&mut self) -> Vec<(ExecutorId, String)> {
        let snapshot = &self.feed.store().current().executors;
        let handled = &mut self.backlog.finished_handled;
        handled.retain(|id| snapshot.contains_key(id));
        let finished: Vec<(ExecutorId, String)> = snapshot
            .values()
            .filter(|e| {
                matches!(
                    e.state,
                    ExecutorState::Failed { .. } | ExecutorState::Succeeded { .. }
                ) && !handled.contains(&e.id)
            })
            .map(|e| (e.id, e.pod_name.clone()))
            .collect();
        handled.extend(finished.iter().map(|(id, _)| *id));
        finished
    }
}

/// Whether the API server answered the create with a refusal, so that no pod has its id
/// (a 409 says a pod of that name exists; no answer says nothing).
fn refused(err: &CreateError) -> bool {
    matches!(err, CreateError::Kubernetes(kube::Error::Api(status)) if status.code != 409)
}
