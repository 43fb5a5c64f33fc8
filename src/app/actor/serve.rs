//! The actor itself: its state, its loop, and its answers to commands.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use super::command::{ActorReport, Command};
use super::parts::{ApplicationParts, Engine};
use super::phase::{Life, Phase};
use super::reclaims::Reclaims;
use super::requests::RequestTimes;
use super::schedule::Scheduler;
use super::work::{DeleteKind, Outbox, Work, WorkDone};
use crate::allocator::{ExecutorId, ResourceProfileId};
use crate::app::budgets::{BudgetMembership, HeldBy};
use crate::app::error::AppError;
use crate::app::failures::Failures;
use crate::app::feed::Feed;
use crate::app::registration::Registration;
use crate::k8s::PodEvent;
use crate::metrics::{Metrics, ProfileGauges};
use crate::time::Clock;

/// One application's actor: its engine state, what it follows of the application, and
/// its work in flight. Only its own task touches it.
pub(crate) struct ApplicationActor {
    pub(super) app_id: String,
    /// Its place in the budgets' ledger; dropped with the actor, which leaves it.
    pub(super) budget: BudgetMembership,
    /// The budget that held executors back in the last round, when it held any.
    pub(super) held_by: Option<HeldBy>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) engine: Engine,
    /// The driver's life and the application's phase.
    pub(super) life: Life,
    /// When the actor wakes next.
    pub(super) schedule: Scheduler,
    /// Where its work goes, and what of it is unanswered.
    pub(super) outbox: Outbox,
    /// Deletes and clean-ups the next round sends again.
    pub(super) backlog: Backlog,
    /// What a restarted service resumes the application from.
    pub(super) registration: RegistrationState,
    /// Publishes the executor pods' changes to WatchExecutors streams (ended with the actor).
    pub(super) feed: Feed,
    /// Failed creates and failed executors, for GetStatus.
    pub(super) failures: Failures,
    /// When each executor not yet Running was requested, into the metrics.
    pub(super) requests: RequestTimes,
    /// Rounds carried out completely (their requests answered).
    pub(super) rounds: u64,
    /// Executors being given back to a budget's owner.
    pub(super) reclaims: Reclaims,
}

/// What earlier rounds left for the next one to send again.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    /// Deletes the next round sends: those that failed, and the reclaims' (merged per
    /// kind).
    pub retry_deletes: BTreeMap<DeleteKind, BTreeSet<ExecutorId>>,
    /// Finished executors whose pod was deleted (or labelled inactive), or is being.
    pub finished_handled: BTreeSet<ExecutorId>,
}

/// The application's registration as the actor keeps it up to date.
pub(super) struct RegistrationState {
    pub current: Registration,
    /// It changed since it was last written.
    pub dirty: bool,
    /// The actor is ending and has sent its last write of it (see
    /// [`ApplicationActor::write_last_registration`]).
    pub last_sent: bool,
    /// Targets or templates changed since the last write was sent: written as soon as no
    /// write is in flight, not with the next round.
    pub targets_unwritten: bool,
}

impl ApplicationActor {
    /// The actor of `app`, recording into `metrics` and sending its work to `outbox`.
    pub(super) fn new(app: ApplicationParts, metrics: Metrics, outbox: Outbox) -> Self {
        let ApplicationParts {
            app_id,
            budget,
            namespace: _,
            engine,
            clock,
            driver,
            forget,
            registration,
            feed,
        } = app;
        Self {
            app_id,
            budget,
            held_by: None,
            clock,
            engine,
            life: Life::new(driver, forget),
            schedule: Scheduler::default(),
            outbox,
            backlog: Backlog::default(),
            registration: RegistrationState {
                last_sent: false,
                current: registration,
                dirty: true,
                targets_unwritten: false,
            },
            feed,
            failures: Failures::default(),
            requests: RequestTimes::new(metrics),
            rounds: 0,
            reclaims: Reclaims::default(),
        }
    }

    /// The application's id.
    pub(super) fn app_id(&self) -> &str {
        &self.app_id
    }

    /// The actor's life: serve until Stop (or the driver's end), then wait for the work in
    /// flight, then forget the application if its driver ended. The loop only computes and
    /// answers: the work's results come back on `done`, so no command ever waits on the
    /// API server.
    pub(super) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        events: &mut mpsc::UnboundedReceiver<PodEvent>,
        mut done: mpsc::UnboundedReceiver<WorkDone>,
    ) {
        tracing::info!("application actor started");
        let mut events_open = true;
        loop {
            if let Phase::Ending { .. } = self.life.phase {
                // A call racing the end finds the application gone at once (its reply
                // dropped, see `ActorHandle::call`) instead of waiting behind the work in
                // flight, which is bounded only by the API server's deadlines.
                commands.close();
                while commands.try_recv().is_ok() {}
                // No create may land after Stop's DELETE: unsent ones are skipped, those in
                // flight awaited (every request has a deadline, so this ends).
                self.write_last_registration();
                if !self.outbox.in_flight() {
                    break;
                }
                match done.recv().await {
                    Some(work) => self.work_done(work),
                    None => break,
                }
                continue;
            }
            self.list_for_feed();
            let mut wake = self.schedule.next_wake(
                self.feed.store(),
                &self.life.phase,
                self.outbox.upkeep,
                self.outbox.in_flight(),
            );
            // A reclaim's deadline wakes a running actor too (its round deletes the pod).
            if let (Phase::Running { .. }, Some(at)) = (&self.life.phase, wake) {
                wake = Some(self.reclaims.next_deadline().map_or(at, |d| d.min(at)));
            }
            let due = wake.unwrap_or_default();
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    None | Some(Command::Stop) => self.stop(),
                    Some(command) => self.handle(command),
                },
                event = events.recv(), if events_open => match event {
                    Some(event) => self.ingest(event),
                    None => {
                        tracing::error!("pod event stream closed; relying on nothing but rounds");
                        events_open = false;
                    }
                },
                Some(work) = done.recv() => self.work_done(work),
                () = self.clock.sleep_until(due), if wake.is_some() => self.wake(),
            }
        }
        if let Some(forget) = self.life.take_forget() {
            forget();
            tracing::info!("application forgotten: its driver pod ended");
        }
        self.requests.metrics.forget_application(&self.app_id);
        tracing::info!("application actor stopped");
    }

    /// Stop: creates not sent yet are skipped, and the actor ends once its work in flight
    /// is answered.
    fn stop(&mut self) {
        self.outbox.cancel_creates();
        self.life.end(false);
    }

    /// An actor stopped (not forgotten: its driver did not end) writes what its
    /// registration lacks (registered executors the driver sent since the last round, a
    /// target whose write failed) once, as soon as no write of it is in flight: whoever resumes the application next (this service restarted, or the
    /// replica taking its shard) starts from what the driver last said. A write its fence
    /// refuses (the shard already gone) is not tried again.
    fn write_last_registration(&mut self) {
        let left_for_later = matches!(self.life.phase, Phase::Ending { forget: false });
        if !left_for_later
            || self.registration.last_sent
            || !self.registration.dirty
            || self.outbox.registering
        {
            return;
        }
        self.registration.last_sent = true;
        self.send_registration();
    }

    /// Writes the registration when it changed and no write of it is in flight. A running
    /// actor writes new targets at once and the executors the driver registered with its
    /// next round.
    pub(super) fn write_registration(&mut self) {
        if matches!(self.life.phase, Phase::Running { .. })
            && self.registration.dirty
            && !self.outbox.registering
        {
            self.send_registration();
        }
    }

    fn send_registration(&mut self) {
        let registration = &mut self.registration;
        registration.dirty = false;
        registration.targets_unwritten = false;
        let current = Box::new(registration.current.clone());
        self.outbox.send(Work::Register(current));
    }

    /// The registration's write was answered. Targets set while it was in flight are
    /// written at once; a failed write is sent again with the next change or round.
    fn registration_written(&mut self, written: bool) {
        self.outbox.registering = false;
        if !written {
            self.registration.dirty = true;
        } else if self.registration.targets_unwritten {
            self.write_registration();
        }
    }

    /// A wake-up the scheduler asked for: a round while running; after the driver ended,
    /// the executors' delete when due, then forgetting the application once the grace
    /// period passed.
    fn wake(&mut self) {
        let now = self.clock.now();
        let Phase::Ended(ended) = &mut self.life.phase else {
            if self.reclaims.next_deadline().is_some_and(|d| d <= now) {
                self.feed.store_mut().notify_now();
            }
            self.round();
            return;
        };
        if let Some(due) = ended.cleanup_due
            && due <= now
        {
            ended.cleanup_due = None;
            self.outbox.send(Work::CleanUp);
            return;
        }
        if now < ended.forget_at {
            return;
        }
        if ended.cleanup_due.is_some() {
            tracing::warn!(
                "forgetting the application although deleting its executor pods failed; the driver pod's ownerReferences remain"
            );
        }
        self.outbox.cancel_creates();
        self.life.end(true);
    }

    /// Answers one command (Stop is the loop's).
    fn handle(&mut self, command: Command) {
        match command {
            Command::SetTargets {
                templates,
                targets,
                reply,
            } => {
                let _ = reply.send(self.set_targets(templates, &targets));
                // At once: the replica that takes the application over (its owner lost,
                // paused or cut off) resumes from the registration.
                self.write_registration();
            }
            Command::IsDeleted(id, reply) => {
                let _ = reply.send(self.engine.allocator.is_deleted(id));
            }
            Command::UpdateRegistered(ids, running_tasks, reply) => {
                self.update_registered(ids);
                self.reclaims.set_running_tasks(running_tasks);
                let _ = reply.send(());
            }
            Command::Report(reply) => {
                let _ = reply.send(self.report());
            }
            Command::Snapshot(reply) => {
                let _ = reply.send(self.feed.store().current().clone());
            }
            Command::WatchExecutors(since, reply) => {
                let _ = reply.send(self.feed.subscribe(since));
            }
            Command::Stop => {}
        }
    }

    /// A worker's report.
    fn work_done(&mut self, work: WorkDone) {
        match work {
            WorkDone::Upkeep(upkeep) => self.upkeep_done(upkeep),
            WorkDone::Recorded(recorded) => self.id_recorded(recorded),
            WorkDone::Answered(id, outcome) => self.create_answered(id, &outcome),
            WorkDone::Created(results) => {
                self.outbox.creates = self.outbox.creates.saturating_sub(1);
                self.record_creates(results);
            }
            WorkDone::Listed(ticket, pods) => self.feed.listed(ticket, pods),
            WorkDone::CleanedUp(result) => self.cleanup_done(result),
            WorkDone::Registered(written) => self.registration_written(written),
        }
    }

    /// Asks the worker for the LIST of a WatchExecutors full state when the feed wants one.
    fn list_for_feed(&mut self) {
        if let Some(ticket) = self.feed.take_listing_request() {
            self.outbox.send(Work::List(ticket));
        }
    }

    /// The executors the driver has registered: to the engine, and into the registration.
    fn update_registered(&mut self, ids: BTreeSet<ExecutorId>) {
        let stored: BTreeSet<u64> = ids.iter().map(|id| id.0).collect();
        if stored != self.registration.current.registered {
            self.registration.current.registered = stored;
            self.registration.dirty = true;
        }
        self.engine.allocator.set_registered(ids);
    }

    /// The application's state for GetStatus.
    fn report(&self) -> ActorReport {
        // Counted from the executor state the streams show, not the last round's.
        let mut status = self.engine.allocator.status_now(self.feed.store());
        // The creates waiting for their id record are not sent yet (and may never be):
        // their ids are not used.
        if let Some(lowest) = self.outbox.awaiting_record.first() {
            status.last_executor_id = status.last_executor_id.min(lowest.0.saturating_sub(1));
        }
        // A profile with a template is one the driver may ask for: listed (target 0
        // until it has one) even before it has executors.
        for profile in self.engine.builder.profiles() {
            status.profiles.entry(profile).or_default();
        }
        for (profile, reclaiming) in self.reclaims.per_profile() {
            status.profiles.entry(profile).or_default().reclaiming = reclaiming;
        }
        // What the application borrows, on its highest profiles first (the room goes to
        // the lowest first, so theirs are the executors beyond its part).
        let mut borrowed = self.budget.borrowed();
        for counts in status.profiles.values_mut().rev() {
            let has = u64::from(counts.running) + u64::from(counts.pending);
            let here = borrowed.min(has);
            counts.borrowed = u32::try_from(here).unwrap_or(u32::MAX);
            borrowed -= here;
        }
        let now = self.clock.now();
        ActorReport {
            status,
            rounds: self.rounds,
            next_round_at: self.schedule.next_round_at(self.feed.store()),
            driver: self.life.driver_report(),
            create_failures: self.failures.creates().clone(),
            backoff_until: self.schedule.backoff_until(now),
            failed_executors: self.failures.executors(),
            held_by: self.held_by.clone(),
        }
    }

    /// The application's counts per profile into the metrics, right after a round: as
    /// GetStatus reports them then (the store was just polled, so the round's counts are
    /// the current ones), without another pass over the executors.
    pub(super) fn export_counts(&self) {
        let status = self.engine.allocator.status();
        self.requests.metrics.application_profiles(
            &self.app_id,
            status.profiles.iter().map(|(profile, counts)| {
                (
                    profile.0,
                    ProfileGauges {
                        target: counts.target,
                        running: counts.running,
                        pending: counts.pending,
                        newly_created: counts.newly_created,
                    },
                )
            }),
        );
    }

    /// The templates registered and the targets set, or nothing changed at all.
    fn set_targets(
        &mut self,
        templates: BTreeMap<ResourceProfileId, Pod>,
        targets: &BTreeMap<ResourceProfileId, u32>,
    ) -> Result<(), AppError> {
        let engine = &mut self.engine;
        let registered = if templates.is_empty() {
            None
        } else {
            let builder = engine
                .builder
                .with_templates(templates)
                .map_err(crate::app::templates::template_error)?;
            Some(builder)
        };
        let builder = registered.as_ref().unwrap_or(&engine.builder);
        if let Some(profile) = targets.keys().find(|p| !builder.has_profile(**p)) {
            return Err(AppError::FailedPrecondition(format!(
                "executors_per_profile[{profile}]: resource profile {profile} has no executor pod \
                 template (give one in resource_profile_templates, of Start or of this request)"
            )));
        }
        if let Some(builder) = registered {
            let added: Vec<ResourceProfileId> = builder
                .profiles()
                .filter(|p| !engine.builder.has_profile(*p))
                .collect();
            if !added.is_empty() {
                tracing::info!(profiles = %crate::allocator::listed(&added), "resource profile templates registered");
            }
            engine.builder = builder;
        }
        // Only new targets call a round early (a repeated Start registers templates only).
        if !targets.is_empty() {
            let idle = engine.allocator.set_targets(targets);
            let wanted = engine.allocator.targets().values().map(|t| u64::from(*t));
            self.budget.wanting(wanted.sum());
            self.schedule.targets_changed(self.feed.store_mut(), idle);
        }
        self.update_registration();
        Ok(())
    }

    /// Brings the registration in line with the templates and targets; marks it for
    /// writing when it changed.
    fn update_registration(&mut self) {
        let builder = &self.engine.builder;
        let templates: BTreeMap<i32, Pod> = builder
            .profiles()
            .filter_map(|p| Some((p.0, builder.template(p)?.clone())))
            .collect();
        let targets: BTreeMap<i32, u32> = self
            .engine
            .allocator
            .targets()
            .iter()
            .map(|(p, t)| (p.0, *t))
            .collect();
        let registration = &mut self.registration.current;
        if registration.templates != templates || registration.targets != targets {
            registration.templates = templates;
            registration.targets = targets;
            self.registration.dirty = true;
            self.registration.targets_unwritten = true;
        }
    }
}
