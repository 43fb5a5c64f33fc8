//! The engine of one application: its allocation state ([`Allocator`]) and its rounds,
//! Spark's rules, each returning a plan ([`RoundPlan`]) for the caller to carry out.
use std::collections::{BTreeMap, BTreeSet};

use super::adaptive::{CreateOutcomes, CreateWindow};
use super::settings::{AllocationPolicy, AllocationSettings};
use super::snapshot::{SnapshotBatch, SnapshotStore};
use super::state::ExecutorState;
use super::stuck::{StuckExecutor, StuckPods};
use super::tracked::TrackedExecutors;
use super::types::{ExecutorId, ResourceProfileId, Timestamp, listed};

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
    /// Executors the targets still lack after this round's creates (what the id record
    /// may reserve ahead, see [`super::id_block`]).
    pub still_wanted: u64,
    /// Pending executors stuck past `stuck_pending_timeout_ms`, reported once each; those
    /// `deleted` are in `deletes` (see [`super::stuck`]).
    pub stuck: Vec<StuckExecutor>,
    /// Executors per profile the targets lack that a budget's room kept from being asked
    /// for (see [`Allocator::round_within`]); profiles with none are left out.
    pub held: BTreeMap<ResourceProfileId, u32>,
    /// The application's use after this round's creates (what it reports to its budgets).
    pub usage: AllocationUse,
    /// ADAPTIVE only: the window, not the targets or a cap, kept this round from asking
    /// for more. The window frees as its requests are seen, so the next round is due
    /// within [`ADAPTIVE_PACE_PER_BATCH_DELAY`] of a batch delay, not a whole one.
    pub window_bound: bool,
}

/// While the ADAPTIVE window holds requests back, rounds come this many times per batch
/// delay: the window is refilled as its pods are seen (clocked by the watch, as a
/// congestion window is by its acknowledgements), not once per batch delay.
pub const ADAPTIVE_PACE_PER_BATCH_DELAY: u32 = 10;

/// An application's executors as a budget counts them, over the profiles with a target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocationUse {
    /// Per profile the larger of its target and what it has.
    pub wanted: u64,
    /// Running, pending, and requested not yet seen (not those deleted).
    pub using: u64,
    /// Of those, not running.
    pub pending: u64,
    /// Of those, the pods seen (running or pending; not the requests not yet seen).
    pub seen: u64,
}

/// Counts of one resource profile, for status reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileCounts {
    pub target: u32,
    pub running: u32,
    pub pending: u32,
    pub newly_created: u32,
    /// Executors the target lacks that a budget holds back (as of the last round).
    pub held: u32,
    /// Executors held beyond the application's guaranteed part of a budget.
    pub borrowed: u32,
    /// Executors asked back (reclaim) whose pods are not gone yet.
    pub reclaiming: u32,
}

/// A report of an application's allocation state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatorStatus {
    pub profiles: BTreeMap<ResourceProfileId, ProfileCounts>,
    pub deleted: BTreeSet<ExecutorId>,
    pub last_executor_id: u64,
    pub outstanding: bool,
}

/// How many batch delays a downscale delete gets to show in a snapshot before it is retried.
pub const DELETE_RETRY_BATCH_DELAYS: i64 = 5;

/// A request created but not yet seen in any snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NewlyCreated {
    profile: ResourceProfileId,
    /// When it was asked for, or when its create was answered once that came.
    created_at: Timestamp,
    /// Its create is sent and not answered yet ([`Allocator::creates_sent`]): there is no
    /// pod to delete yet, so a downscale leaves it and its timeouts have not begun.
    unanswered: bool,
}

/// Per-profile tallies of one round.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    profile: ResourceProfileId,
    target: u32,
    running: u64,
    /// Pending pods the driver does not know.
    unknown_pending: u64,
    /// Pending pods the driver knows.
    known_pending: u64,
    unknown_newly_created: u64,
    known_newly_created: u64,
}

impl Tally {
    fn not_running(&self) -> u64 {
        self.unknown_pending
            + self.known_pending
            + self.unknown_newly_created
            + self.known_newly_created
    }

    /// Executors the profile has or has asked for.
    fn count(&self) -> u64 {
        self.running + self.not_running()
    }
}

/// Sums over the profiles with a target, after downscale.
#[derive(Debug, Clone, Copy, Default)]
struct Totals {
    unknown_pending: u64,
    not_running: u64,
    running: u64,
    /// Executors the targets lack.
    lacking: u64,
}

impl Totals {
    fn of(tallies: &[Tally]) -> Self {
        let mut totals = Self::default();
        for tally in tallies {
            totals.unknown_pending += tally.unknown_pending;
            totals.not_running += tally.not_running();
            totals.running += tally.running;
            totals.lacking = totals
                .lacking
                .saturating_add(u64::from(tally.target).saturating_sub(tally.count()));
        }
        totals
    }
}

/// The allocation state of one application.
#[derive(Debug, Clone)]
pub struct Allocator {
    settings: AllocationSettings,
    targets: BTreeMap<ResourceProfileId, u32>,
    /// Executors registered with the driver (scheduler-known).
    registered: BTreeSet<ExecutorId>,
    /// Requested, not yet in any snapshot, unknown to the driver.
    newly_created: BTreeMap<ExecutorId, NewlyCreated>,
    /// Requested, not yet in any snapshot, already registered with the driver.
    known_newly_created: BTreeMap<ExecutorId, ResourceProfileId>,
    /// Executors this allocator deleted (read by IsDeleted), with when it last asked.
    deleted: BTreeMap<ExecutorId, Timestamp>,
    /// The last snapshot, indexed.
    tracked: TrackedExecutors,
    /// Its pending executors that do not start, since when.
    stuck: StuckPods,
    last_executor_id: u64,
    /// Ids of creates the API server refused (an answer, so no pod) or never sent but
    /// skipped: spent, never handed out again, but given back to the `max_executors`
    /// budget, which counts executors that may exist. Not kept across a restart (the
    /// budget is then the stricter).
    refused_ids: u64,
    /// Pending pods unknown to the driver, as of the last round.
    unknown_pending: u64,
    /// Executors Running (not deleted), as of the last round.
    running: u64,
    outstanding: bool,
    /// Creates one round may plan over all profiles.
    round_cap: u64,
    /// The ADAPTIVE policy's window (kept, unused, under SPARK).
    window: CreateWindow,
    /// Executors per profile a budget held back in the last round.
    held: BTreeMap<ResourceProfileId, u32>,
}

/// The create rate the ADAPTIVE window assumes until [`Allocator::set_create_rate`] tells
/// the service's own (the service's default QPS).
pub const DEFAULT_CREATE_RATE: u32 = 50;

impl Allocator {
    /// Starts after `last_executor_id` (0 for a new application, the highest id found on resume).
    pub fn new(settings: AllocationSettings, last_executor_id: u64) -> Self {
        let window = CreateWindow::new(
            settings.batch_size,
            settings.batch_delay_ms(),
            DEFAULT_CREATE_RATE,
        );
        Self {
            settings,
            targets: BTreeMap::new(),
            registered: BTreeSet::new(),
            newly_created: BTreeMap::new(),
            known_newly_created: BTreeMap::new(),
            deleted: BTreeMap::new(),
            tracked: TrackedExecutors::default(),
            stuck: StuckPods::default(),
            last_executor_id,
            refused_ids: 0,
            unknown_pending: 0,
            running: 0,
            outstanding: false,
            round_cap: u64::MAX,
            window,
            held: BTreeMap::new(),
        }
    }

    /// The same allocator planning at most `cap` creates per round over all profiles
    /// (beyond Spark, whose batch size caps each profile alone: an application with many
    /// profiles would otherwise plan profiles × batch size creates at once).
    pub fn with_round_cap(mut self, cap: u32) -> Self {
        self.round_cap = u64::from(cap.max(1));
        self
    }

    /// The creates per second the service sends for this application: the ADAPTIVE
    /// window's ceiling (resets the window).
    pub fn set_create_rate(&mut self, per_second: u32) {
        self.window = CreateWindow::new(
            self.settings.batch_size,
            self.settings.batch_delay_ms(),
            per_second,
        );
    }

    /// The answers to a round's creates (accepted and refused by cause): under ADAPTIVE
    /// they grow or shrink the window; under SPARK they change nothing. Failed requests
    /// are forgotten by [`Self::create_failed`] as before.
    pub fn creates_answered(&mut self, outcomes: &CreateOutcomes, now: Timestamp) {
        if self.settings.policy == AllocationPolicy::Adaptive {
            self.window.answered(outcomes, now);
        }
    }

    /// The ADAPTIVE window: requests that may be sent and not yet seen at once.
    pub fn create_window(&self) -> &CreateWindow {
        &self.window
    }

    /// Stores the targets (profiles left out keep theirs). Returns true when nothing is
    /// outstanding, i.e. the caller should run a round now (notify now).
    pub fn set_targets(&mut self, targets: &BTreeMap<ResourceProfileId, u32>) -> bool {
        self.targets.extend(targets.iter().map(|(rp, t)| (*rp, *t)));
        !self.outstanding
    }

    /// Replaces the set of executors registered with the driver (scheduler-known).
    pub fn set_registered(&mut self, ids: BTreeSet<ExecutorId>) {
        self.registered = ids;
    }

    /// One allocation round: take in the batch, count, downscale, ask for the gangs, then
    /// for more within the caps. Each step below is a method named after what it does.
    pub fn round(&mut self, batch: SnapshotBatch, now: Timestamp) -> RoundPlan {
        self.round_within(batch, now, &mut |_| u64::MAX)
    }

    /// [`Self::round`] under budgets: once the round has counted (after its downscale),
    /// `room` is told the application's use and answers how many more executors it may ask
    /// for in all ([`super::budget::room`] over its budgets; `u64::MAX`: no budget). The
    /// gangs and the profiles' asks stay within it, in profile order; what the targets
    /// lack beyond it is `held` (reported per profile). Nothing already asked for is taken
    /// back: budgets admit, they never delete.
    pub fn round_within(
        &mut self,
        batch: SnapshotBatch,
        now: Timestamp,
        room: &mut dyn FnMut(&AllocationUse) -> u64,
    ) -> RoundPlan {
        let mut plan = RoundPlan::default();
        self.forget_seen_requests(&batch);
        self.promote_registered_requests();
        self.expire_requests(now, &mut plan);
        self.take_in_snapshot(batch, now);
        let held = self.act_on_stuck(now, &mut plan);
        let mut tallies = self.tallies();
        self.downscale(&mut tallies, now, &mut plan);
        let totals = Totals::of(&tallies);
        let usage = AllocationUse {
            wanted: (tallies.iter())
                .map(|t| u64::from(t.target).max(t.count()))
                .sum(),
            using: totals.running + totals.not_running,
            pending: totals.not_running,
            seen: (tallies.iter())
                .map(|t| t.running + t.unknown_pending + t.known_pending)
                .sum(),
        };
        let budget_room = room(&usage);
        // Gangs are not held by an unschedulable pod: a gang scheduler places none of an
        // incomplete gang, so its first members wait unschedulable until all are asked for.
        self.allocate_gangs(&tallies, totals.not_running, budget_room, now, &mut plan);
        let askers = self.askers(&tallies, &held);
        let left = budget_room.saturating_sub(plan.creates.len() as u64);
        self.allocate(&tallies, askers, totals.not_running, left, now, &mut plan);
        self.hold_beyond(&tallies, budget_room, &mut plan);
        let created = plan.creates.len() as u64;
        plan.usage = AllocationUse {
            using: usage.using + created,
            pending: usage.pending + created,
            ..usage
        };
        self.publish(totals, &mut plan);
        plan
    }

    /// What the targets lack beyond the budget's room after this round's asks, per profile
    /// in profile order (the room goes to the lower profiles first, as the asks do).
    fn hold_beyond(&mut self, tallies: &[Tally], budget_room: u64, plan: &mut RoundPlan) {
        self.held.clear();
        if budget_room == u64::MAX {
            return;
        }
        let mut planned: BTreeMap<ResourceProfileId, u64> = BTreeMap::new();
        for (_, profile) in &plan.creates {
            *planned.entry(*profile).or_default() += 1;
        }
        let mut left = budget_room.saturating_sub(plan.creates.len() as u64);
        for tally in tallies {
            let planned = planned.get(&tally.profile).copied().unwrap_or(0);
            let lacking = u64::from(tally.target).saturating_sub(tally.count() + planned);
            // A gang that did not fit is held whole (it takes no part of the room).
            let gang_held = planned == 0 && self.gang_lacking(tally) > left;
            let fits = if gang_held { 0 } else { lacking.min(left) };
            left -= fits;
            if lacking > fits {
                self.held.insert(tally.profile, saturate(lacking - fits));
            }
        }
        plan.held = self.held.clone();
    }

    /// Everything seen in a snapshot is no longer "newly created".
    fn forget_seen_requests(&mut self, batch: &SnapshotBatch) {
        if batch.seen_ids.len() < self.newly_created.len() + self.known_newly_created.len() {
            for id in &batch.seen_ids {
                self.newly_created.remove(id);
                self.known_newly_created.remove(id);
            }
        } else {
            self.newly_created
                .retain(|id, _| !batch.seen_ids.contains(id));
            self.known_newly_created
                .retain(|id, _| !batch.seen_ids.contains(id));
        }
    }

    /// Requests the driver has registered become scheduler-known.
    fn promote_registered_requests(&mut self) {
        if self.registered.is_empty() {
            return;
        }
        let registered = &self.registered;
        let known = &mut self.known_newly_created;
        self.newly_created.retain(|id, nc| {
            if registered.contains(id) {
                known.insert(*id, nc.profile);
                false
            } else {
                true
            }
        });
    }

    /// Creation timeout: forget, delete by label, re-request later with a new id.
    fn expire_requests(&mut self, now: Timestamp, plan: &mut RoundPlan) {
        let timeout = self.settings.executor_timeout_ms();
        self.newly_created.retain(|id, nc| {
            let timed_out = !nc.unanswered && now.millis_since(nc.created_at) > timeout;
            if timed_out {
                plan.timed_out.push(*id);
            }
            !timed_out
        });
        if plan.timed_out.is_empty() {
            return;
        }
        tracing::warn!(
            executors = %listed(&plan.timed_out),
            timeout_ms = timeout,
            "executors not seen within the creation timeout; they will be re-requested"
        );
        if self.settings.delete_on_termination {
            plan.deletes.push(DeleteRequest {
                ids: plan.timed_out.clone(),
                only_pending: false,
            });
        }
    }

    /// Keeps the last snapshot; prunes the deleted set to what it still holds.
    fn take_in_snapshot(&mut self, batch: SnapshotBatch, now: Timestamp) {
        if batch.snapshot_count > 0 {
            self.tracked.apply(&batch);
            let tracked = &self.tracked;
            self.deleted.retain(|id, _| tracked.contains(*id));
            self.stuck.take_in(&batch, now, |id| tracked.contains(id));
        }
        drop(batch);
        // Never reuse an id that exists in the cluster, even one this allocator did not
        // hand out (e.g. a resume that under-reported the last id).
        if let Some(highest) = self.tracked.highest_id() {
            self.last_executor_id = self.last_executor_id.max(highest.0);
        }
    }

    /// Beyond Spark (see [`super::stuck`]): pending executors stuck past the timeout are
    /// reported; those waiting for an image or their configuration are deleted, which frees
    /// their slots. Returns the profiles that ask for nothing this round: one that lost a
    /// stuck pod (its replacement waits for the next round, which the service may back
    /// off), and one whose oldest pending pod (the lowest id: ids go out in order) is
    /// unschedulable past the timeout, so a full cluster gets no storm of pending pods.
    fn act_on_stuck(
        &mut self,
        now: Timestamp,
        plan: &mut RoundPlan,
    ) -> BTreeSet<ResourceProfileId> {
        let mut held = BTreeSet::new();
        if self.stuck.is_empty() {
            return held;
        }
        let timeout = self.settings.stuck_pending_timeout_ms();
        let deleted = &self.deleted;
        plan.stuck = self
            .stuck
            .newly_past(now, timeout, |id| deleted.contains_key(&id));
        let ids: Vec<ExecutorId> = plan
            .stuck
            .iter()
            .filter(|s| s.deleted)
            .map(|s| s.id)
            .collect();
        for stuck in plan.stuck.iter().filter(|s| s.deleted) {
            self.deleted.insert(stuck.id, now);
            held.insert(stuck.profile);
        }
        if !plan.stuck.is_empty() {
            tracing::warn!(executors = %listed(plan.stuck.iter().map(|s| format!("{} ({})", s.id, s.blocker.reason()))),
                timeout_ms = timeout, deleted = %listed(&ids), "pending executors stuck past the timeout");
        }
        if !ids.is_empty() {
            plan.deletes.push(DeleteRequest {
                ids,
                only_pending: true,
            });
        }
        for (profile, index) in self.tracked.profiles() {
            let oldest = index
                .pending
                .keys()
                .find(|id| !self.deleted.contains_key(id));
            if oldest.is_some_and(|id| self.stuck.unschedulable_past(*id, now, timeout)) {
                held.insert(profile);
            }
        }
        held
    }

    /// The tallies of every profile with a target (ascending id): the last snapshot's
    /// executors and the requests not yet seen.
    fn tallies(&self) -> Vec<Tally> {
        let mut tallies: Vec<Tally> = self
            .targets
            .iter()
            .map(|(rp, t)| Tally {
                profile: *rp,
                target: *t,
                ..Tally::default()
            })
            .collect();
        self.tally_snapshot(&mut tallies);
        for nc in self.newly_created.values() {
            if let Some(t) = tally_of(&mut tallies, nc.profile) {
                t.unknown_newly_created += 1;
            }
        }
        for rp in self.known_newly_created.values() {
            if let Some(t) = tally_of(&mut tallies, *rp) {
                t.known_newly_created += 1;
            }
        }
        tallies
    }

    /// Profiles above their target delete requests and pending pods the driver does not
    /// know, older than the idle timeout (requests first); deletes that missed their pod
    /// are sent again. The tallies lose what is deleted.
    fn downscale(&mut self, tallies: &mut [Tally], now: Timestamp, plan: &mut RoundPlan) {
        let idle = self.settings.executor_idle_timeout_ms();
        let mut to_delete: Vec<ExecutorId> = Vec::new();
        for tally in tallies.iter_mut() {
            let target = u64::from(tally.target);
            let count = tally.count();
            if count <= target {
                continue;
            }
            let excess = usize::try_from(count - target).unwrap_or(usize::MAX);
            let newly: Vec<ExecutorId> = self
                .newly_created
                .iter()
                .filter(|(_, nc)| {
                    nc.profile == tally.profile
                        && !nc.unanswered
                        && now.millis_since(nc.created_at) > idle
                })
                .map(|(id, _)| *id)
                .take(excess)
                .collect();
            let pending: Vec<ExecutorId> = match self.tracked.profile(tally.profile) {
                Some(index) if newly.len() < excess && tally.unknown_pending > 0 => index
                    .pending
                    .iter()
                    .filter(|(id, created_at)| {
                        !self.deleted.contains_key(id)
                            && !self.registered.contains(id)
                            && created_at.is_some_and(|c| now.millis_since(c) > idle)
                    })
                    .map(|(id, _)| *id)
                    .take(excess - newly.len())
                    .collect(),
                _ => Vec::new(),
            };
            for id in &newly {
                self.newly_created.remove(id);
            }
            tally.unknown_newly_created -= newly.len() as u64;
            tally.unknown_pending -= pending.len() as u64;
            self.deleted
                .extend(newly.iter().chain(&pending).map(|id| (*id, now)));
            to_delete.extend(newly);
            to_delete.extend(pending);
        }
        self.retry_deletes(now, &mut to_delete);
        if !to_delete.is_empty() {
            to_delete.sort_unstable();
            tracing::info!(executors = %listed(&to_delete), "deleting excess pod requests");
            plan.deletes.push(DeleteRequest {
                ids: to_delete,
                only_pending: true,
            });
        }
    }

    /// Profiles short of their gang (`min_executors_at_once`) ask for all they lack of it
    /// at once, whatever the batch size, the policy and requests not yet seen, in profile
    /// order within the pending caps and the round's cap. A gang scheduler places none of
    /// a gang until all of it exists, so batches would only make it wait.
    /// Under a budget a gang is asked for only when all of it fits the budget's room
    /// (`budget_room`): part of a gang would only wait.
    fn allocate_gangs(
        &mut self,
        tallies: &[Tally],
        not_running: u64,
        budget_room: u64,
        now: Timestamp,
        plan: &mut RoundPlan,
    ) {
        if self.settings.min_executors_at_once.is_none() {
            return;
        }
        let mut remaining = self.room_in_application(not_running).min(self.round_cap);
        let mut budget_left = budget_room;
        for tally in tallies {
            let lacking = self.gang_lacking(tally);
            if lacking > budget_left {
                continue;
            }
            budget_left -= lacking;
            let wanted = lacking.min(self.room_in_profile(tally)).min(remaining);
            if wanted == 0 {
                continue;
            }
            let planned = plan.creates.len();
            self.request(tally.profile, wanted, now, plan);
            remaining -= (plan.creates.len() - planned) as u64;
        }
    }

    /// Executors `tally`'s profile lacks to reach its gang, bounded by its target.
    fn gang_lacking(&self, tally: &Tally) -> u64 {
        (self.settings.min_executors_at_once)
            .map_or(0, |gang| u64::from(gang.min(tally.target)))
            .saturating_sub(tally.count())
    }

    /// The profiles that may ask for more, as (tally index, count so far): below their
    /// target, with room under their pending cap, not short of their gang (the gangs'
    /// step asked for those), not `held` by a stuck pod and, under SPARK, with no request
    /// unseen (ADAPTIVE asks while requests are unseen: the window bounds them instead).
    fn askers(&self, tallies: &[Tally], held: &BTreeSet<ResourceProfileId>) -> Vec<(usize, u64)> {
        let adaptive = self.settings.policy == AllocationPolicy::Adaptive;
        tallies
            .iter()
            .enumerate()
            .filter(|(_, tally)| {
                (adaptive || tally.unknown_newly_created == 0)
                    && self.gang_lacking(tally) == 0
                    && !held.contains(&tally.profile)
                    && tally.count() < u64::from(tally.target)
                    && self.room_in_profile(tally) > 0
            })
            .map(|(index, tally)| (index, tally.count()))
            .collect()
    }

    /// Allocates within the pending caps, what the round has left after the gangs and the
    /// budget's room left (`budget_left`), splitting the free slots over the askers.
    fn allocate(
        &mut self,
        tallies: &[Tally],
        askers: Vec<(usize, u64)>,
        not_running: u64,
        budget_left: u64,
        now: Timestamp,
        plan: &mut RoundPlan,
    ) {
        let planned = plan.creates.len() as u64;
        let mut remaining = (self.room_in_application(not_running.saturating_add(planned)))
            .min(self.round_cap.saturating_sub(planned))
            .min(budget_left);
        let per_round = if self.settings.policy == AllocationPolicy::Adaptive {
            let unseen = self.newly_created.len() as u64;
            let unanswered = self
                .newly_created
                .values()
                .filter(|nc| nc.unanswered)
                .count();
            let room = (self.window.size().saturating_sub(unseen))
                .min((self.window.unanswered_limit(now)).saturating_sub(unanswered as u64));
            let lacking: u64 = (askers.iter())
                .map(|(index, count)| {
                    let tally = &tallies[*index];
                    (u64::from(tally.target) - count).min(self.room_in_profile(tally))
                })
                .fold(0, u64::saturating_add);
            plan.window_bound = room < remaining.min(lacking);
            tracing::debug!(
                window = self.window.size(),
                unseen,
                unanswered,
                unanswered_limit = self.window.unanswered_limit(now),
                room,
                lacking,
                "ADAPTIVE round"
            );
            remaining = remaining.min(room);
            u64::MAX
        } else {
            u64::from(self.settings.batch_size)
        };
        if remaining == 0 || askers.is_empty() {
            return;
        }
        let k = askers.len() as u64;
        let (share, extra) = if remaining == u64::MAX {
            (u64::MAX, 0)
        } else {
            (remaining / k, remaining % k)
        };
        for (position, (index, count)) in askers.into_iter().enumerate() {
            let tally = &tallies[index];
            let slots = if (position as u64) < extra {
                share + 1
            } else {
                share
            };
            let wanted = (u64::from(tally.target) - count)
                .min(per_round)
                .min(slots)
                .min(self.room_in_profile(tally));
            self.request(tally.profile, wanted, now, plan);
        }
        if !plan.refused.is_empty() {
            tracing::warn!(refused = %listed(plan.refused.iter().map(|(profile, n)| format!("{n} of profile {profile}"))),
                max_executors = self.settings.max_executors,
                "executor requests refused: lifetime max_executors reached");
        }
    }

    /// Requests `wanted` executors of `profile`, each taking the next id, unless past the
    /// lifetime cap (then the rest are refused).
    fn request(
        &mut self,
        profile: ResourceProfileId,
        wanted: u64,
        now: Timestamp,
        plan: &mut RoundPlan,
    ) {
        let max = self
            .settings
            .max_executors
            .map_or(u64::MAX, |max| max.saturating_add(self.refused_ids));
        for created in 0..wanted {
            let Some(next) = self.last_executor_id.checked_add(1).filter(|n| *n <= max) else {
                let refused = u32::try_from(wanted - created).unwrap_or(u32::MAX);
                *plan.refused.entry(profile).or_insert(0) += refused;
                break;
            };
            self.last_executor_id = next;
            let id = ExecutorId(next);
            self.newly_created.insert(
                id,
                NewlyCreated {
                    profile,
                    created_at: now,
                    unanswered: false,
                },
            );
            plan.creates.push((id, profile));
        }
    }

    /// Publishes the round's counts: into the plan, and as the state between rounds.
    fn publish(&mut self, totals: Totals, plan: &mut RoundPlan) {
        plan.still_wanted = totals.lacking.saturating_sub(plan.creates.len() as u64);
        self.unknown_pending = totals.unknown_pending;
        self.running = totals.running;
        self.outstanding = totals.unknown_pending + self.newly_created.len() as u64 > 0;
        plan.outstanding = self.outstanding;
    }

    /// How many more pods the application may have not running (`max_pending_pods`),
    /// with `not_running` not running or planned.
    fn room_in_application(&self, not_running: u64) -> u64 {
        match self.settings.max_pending_pods {
            Some(cap) => u64::from(cap).saturating_sub(not_running),
            None => u64::MAX,
        }
    }

    /// How many more pods `tally`'s profile may have not running (its pending cap).
    fn room_in_profile(&self, tally: &Tally) -> u64 {
        match self.settings.max_pending_pods_per_profile {
            Some(cap) => u64::from(cap).saturating_sub(tally.not_running()),
            None => u64::MAX,
        }
    }

    /// Beyond Spark: a downscale delete finds nothing when the pod is created just after it
    /// (the request was still in flight), and the pod would then stay Pending, uncounted,
    /// until Stop. Executors deleted at least [`DELETE_RETRY_BATCH_DELAYS`] batch delays ago
    /// that the last snapshot still shows Pending (so without a deletionTimestamp) and the
    /// driver does not know are deleted again.
    fn retry_deletes(&mut self, now: Timestamp, to_delete: &mut Vec<ExecutorId>) {
        let wait = self
            .settings
            .batch_delay_ms()
            .saturating_mul(DELETE_RETRY_BATCH_DELAYS);
        for (id, asked_at) in &mut self.deleted {
            let stale = now.millis_since(*asked_at) >= wait;
            if stale && self.tracked.is_pending(*id) && !self.registered.contains(id) {
                *asked_at = now;
                to_delete.push(*id);
            }
        }
    }

    /// Counts the last snapshot's executors per profile, leaving out those we deleted.
    fn tally_snapshot(&self, tallies: &mut [Tally]) {
        let deleted_running = if self.deleted.is_empty() {
            BTreeMap::new()
        } else {
            self.tracked.running_among(self.deleted.keys())
        };
        for tally in tallies {
            let Some(index) = self.tracked.profile(tally.profile) else {
                continue;
            };
            let gone = deleted_running.get(&tally.profile).copied().unwrap_or(0);
            tally.running = index.running.saturating_sub(gone);
            for id in index.pending.keys() {
                if self.deleted.contains_key(id) {
                    continue;
                }
                if self.registered.contains(id) {
                    tally.known_pending += 1;
                } else {
                    tally.unknown_pending += 1;
                }
            }
        }
    }

    /// The creates of `ids` (requests of a plan) are sent and their answers will come
    /// later ([`Self::create_accepted`], [`Self::create_failed`], …): until then a downscale
    /// leaves them (a delete sent before its create landed would find nothing, and the pod
    /// created after it would stay beyond the target) and their creation and idle
    /// timeouts wait. Requests no caller says this of are taken as answered when planned,
    /// as Spark's creates are, answered within its round.
    pub fn creates_sent(&mut self, ids: impl IntoIterator<Item = ExecutorId>) {
        for id in ids {
            if let Some(nc) = self.newly_created.get_mut(&id) {
                nc.unanswered = true;
            }
        }
    }

    /// The API server accepted the create of `id` at `now`: its timeouts count from now
    /// (from the first time it is told, when it is told again).
    pub fn create_accepted(&mut self, id: ExecutorId, now: Timestamp) {
        if let Some(nc) = self.newly_created.get_mut(&id)
            && nc.unanswered
        {
            nc.unanswered = false;
            nc.created_at = now;
        }
    }

    /// A create the API server answered with a refusal (429, quota, invalid pod, …): no
    /// pod has the id. Forgotten as a failed create, and its id no longer counts against
    /// `max_executors`: a server shedding load must not use up an application's lifetime
    /// budget, or the application would stop short of its target for good.
    pub fn create_refused(&mut self, id: ExecutorId) {
        self.create_failed(id);
        self.refused_ids = self.refused_ids.saturating_add(1);
    }

    /// A create of the plan failed: forget the request so a later round asks again (new id).
    pub fn create_failed(&mut self, id: ExecutorId) {
        self.newly_created.remove(&id);
        self.known_newly_created.remove(&id);
        self.outstanding = self.unknown_pending + self.newly_created.len() as u64 > 0;
    }

    /// Creates of a plan that were never sent (their ids could not be recorded first, or
    /// the application stopped): forgotten as failed creates, and the highest ids given
    /// back, so that `last_executor_id` stays the highest id of a create sent (or of a
    /// pod seen) and a later round hands them out again. Ids are handed out in order, so
    /// only those above every id handed out since can go back; one below a higher id
    /// stays skipped (never reused, as before). An id never sent was never in the
    /// cluster, so handing it out again reuses nothing; the id record only ever covers
    /// more than was sent, so a restarted service still starts above every id used.
    pub fn creates_not_sent(&mut self, ids: &[ExecutorId]) {
        for id in ids {
            self.create_failed(*id);
        }
        let unsent: BTreeSet<ExecutorId> = ids.iter().copied().collect();
        let seen = self.tracked.highest_id().map_or(0, |id| id.0);
        while self.last_executor_id > seen && unsent.contains(&ExecutorId(self.last_executor_id)) {
            self.last_executor_id -= 1;
        }
        // Those that stay skipped (a later round handed out higher ids) made no pod either:
        // they go back to the `max_executors` budget.
        let skipped = unsent
            .iter()
            .filter(|id| id.0 <= self.last_executor_id)
            .count() as u64;
        self.refused_ids = self.refused_ids.saturating_add(skipped);
    }

    /// The pod of `id` is gone from the cluster (a DELETED watch event, or a full listing
    /// without it): the executor is no longer one "deleted and still there".
    pub fn pod_gone(&mut self, id: ExecutorId) {
        self.deleted.remove(&id);
    }

    /// Executors whose pods were being deleted (they carry a deletionTimestamp) when the
    /// application resumed: deleted as if this allocator had asked at `now`.
    pub fn restore_deleted(&mut self, ids: impl IntoIterator<Item = ExecutorId>, now: Timestamp) {
        self.deleted.extend(ids.into_iter().map(|id| (id, now)));
    }

    /// Executors given back to a budget (reclaim), deleted at `now` as this allocator's
    /// own: they no longer count, and IsDeleted says so (their loss is no failure).
    pub fn reclaimed(&mut self, ids: impl IntoIterator<Item = ExecutorId>, now: Timestamp) {
        self.deleted.extend(ids.into_iter().map(|id| (id, now)));
    }

    /// Whether the driver has `id` registered (as it last said).
    pub fn is_registered(&self, id: ExecutorId) -> bool {
        self.registered.contains(&id)
    }

    /// True iff the allocator deleted `id` and its pod is still there.
    pub fn is_deleted(&self, id: ExecutorId) -> bool {
        self.deleted.contains_key(&id)
    }

    /// The highest executor id handed out so far (ids of creates not sent are given back,
    /// see [`Self::creates_not_sent`]).
    pub fn last_executor_id(&self) -> u64 {
        self.last_executor_id
    }

    /// A report for GetStatus, computed when asked: targets and requests are current, pod
    /// counts those of the last snapshot a round took in. Lists every profile with a target
    /// and every profile with executors running, pending or requested; one without a target
    /// reports target 0 (rounds leave it alone, as Spark does). Deleted executors are left
    /// out of the counts, as in a round. Costs O(profiles + deleted · log n + requests).
    pub fn status(&self) -> AllocatorStatus {
        let mut profiles = self.target_counts();
        for (rp, index) in self.tracked.profiles() {
            if index.running > 0 || !index.pending.is_empty() {
                let counts = profiles.entry(rp).or_default();
                counts.running = saturate(index.running);
                counts.pending = saturate(index.pending.len() as u64);
            }
        }
        if !self.deleted.is_empty() {
            let running = self.tracked.running_among(self.deleted.keys());
            let pending = self.tracked.pending_among(self.deleted.keys());
            for (rp, counts) in &mut profiles {
                let gone = running.get(rp).copied().map_or(0, saturate);
                counts.running = counts.running.saturating_sub(gone);
                let gone = pending.get(rp).copied().map_or(0, saturate);
                counts.pending = counts.pending.saturating_sub(gone);
            }
        }
        for (_, rp) in self.newly_created() {
            let counts = profiles.entry(rp).or_default();
            counts.newly_created = counts.newly_created.saturating_add(1);
        }
        self.status_of(profiles)
    }

    /// GetStatus's report: [`Self::status`] with the pod counts of `store`'s current
    /// snapshot instead of the last round's, so a status read after a pod event never
    /// contradicts it (WatchExecutors shows the same state). A request whose pod the store
    /// has seen since the last round counts as its pod does, no longer as newly created.
    /// Rounds still work from the store's batches. Costs a pass over the executors.
    pub fn status_now(&self, store: &SnapshotStore) -> AllocatorStatus {
        let mut profiles = self.target_counts();
        for executor in store.current().executors.values() {
            let running = match executor.state {
                ExecutorState::Running => true,
                ExecutorState::Pending => false,
                _ => continue,
            };
            let counts = profiles.entry(executor.profile).or_default();
            if self.deleted.contains_key(&executor.id) {
                continue;
            }
            if running {
                counts.running = counts.running.saturating_add(1);
            } else {
                counts.pending = counts.pending.saturating_add(1);
            }
        }
        let seen = store.seen_since_poll();
        for (id, rp) in self.newly_created() {
            let counts = profiles.entry(rp).or_default();
            if !seen.contains(&id) {
                counts.newly_created = counts.newly_created.saturating_add(1);
            }
        }
        self.status_of(profiles)
    }

    /// Every profile with a target, with only its target counted.
    fn target_counts(&self) -> BTreeMap<ResourceProfileId, ProfileCounts> {
        self.targets
            .iter()
            .map(|(rp, target)| {
                let counts = ProfileCounts {
                    target: *target,
                    ..ProfileCounts::default()
                };
                (*rp, counts)
            })
            .collect()
    }

    /// The status with `profiles` counted.
    fn status_of(
        &self,
        mut profiles: BTreeMap<ResourceProfileId, ProfileCounts>,
    ) -> AllocatorStatus {
        for (profile, held) in &self.held {
            profiles.entry(*profile).or_default().held = *held;
        }
        AllocatorStatus {
            profiles,
            deleted: self.deleted.keys().copied().collect(),
            last_executor_id: self.last_executor_id,
            outstanding: self.outstanding,
        }
    }

    /// The settings this allocator runs with.
    pub fn settings(&self) -> &AllocationSettings {
        &self.settings
    }

    /// The targets per profile.
    pub fn targets(&self) -> &BTreeMap<ResourceProfileId, u32> {
        &self.targets
    }

    /// Whether unknown pending pods or newly created requests remain (as of the last round).
    pub fn outstanding(&self) -> bool {
        self.outstanding
    }

    /// Requests not yet seen in any snapshot (both unknown and scheduler-known), with profile.
    pub fn newly_created(&self) -> impl Iterator<Item = (ExecutorId, ResourceProfileId)> + '_ {
        self.newly_created
            .iter()
            .map(|(id, nc)| (*id, nc.profile))
            .chain(self.known_newly_created.iter().map(|(id, rp)| (*id, *rp)))
    }
}

/// The tally of `profile`, if it has a target (few profiles: a linear scan is fastest).
fn tally_of(tallies: &mut [Tally], profile: ResourceProfileId) -> Option<&mut Tally> {
    tallies.iter_mut().find(|t| t.profile == profile)
}

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
