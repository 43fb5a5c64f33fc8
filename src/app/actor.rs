//! The actor of one application: a tokio task owning its engine state (the `Allocator`,
//! the `SnapshotStore`, the `ExecutorPodBuilder`) and everything it follows about the
//! application. [`ActorHandle`] is the only way in. The actor answers commands, takes in
//! pod events (its executors' and its driver pod's), and runs a round whenever the
//! snapshot store is due. It never awaits Kubernetes: a round's requests run in worker
//! tasks whose results come back as messages; a Kubernetes failure is logged and retried
//! by a later round.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::failures::{CreateFailure, ExecutorFailure, Failures};
use super::feed::{ExecutorEvents, Feed, ListedPod, list_for_full_state};
use super::registration::Registration;
use super::{AppError, Clock};
use crate::allocator::{
    Allocator, AllocatorStatus, CreateOutcomes, CreateRefusal, DeleteRequest, ExecutorId,
    ExecutorPod, ExecutorPodBuilder, ExecutorPodsSnapshot, ExecutorState, IdBlocks,
    ResourceProfileId, RoundPlan, SnapshotStore, StateRules, Timestamp, executor_pod_from,
};
use crate::k8s::{
    CreateError, ExecutorPodClient, IdRecord, Listed, PodEvent, RegistrationStore, Subscription,
};
use crate::metrics::{DeleteReason, Metrics, ProfileGauges};
use tokio_util::sync::CancellationToken;

/// The messages an actor answers; each carries its reply channel.
enum Command {
    /// Registers templates of profiles (all or none), then sets targets.
    SetTargets {
        templates: BTreeMap<ResourceProfileId, Pod>,
        targets: BTreeMap<ResourceProfileId, u32>,
        reply: oneshot::Sender<Result<(), AppError>>,
    },
    IsDeleted(ExecutorId, oneshot::Sender<bool>),
    UpdateRegistered(BTreeSet<ExecutorId>, oneshot::Sender<()>),
    Report(oneshot::Sender<ActorReport>),
    Snapshot(oneshot::Sender<ExecutorPodsSnapshot>),
    /// Opens an executor event stream resuming after a sequence (0: full state).
    WatchExecutors(u64, oneshot::Sender<ExecutorEvents>),
    Stop,
}

/// The allocator's status plus how many rounds the actor ran.
#[derive(Debug, Clone)]
pub(crate) struct ActorReport {
    pub status: AllocatorStatus,
    pub rounds: u64,
    pub next_round_at: Timestamp,
    /// The driver pod's life as the actor follows it (`None` without a driver pod).
    pub driver: Option<DriverReport>,
    /// The last failed create per profile.
    pub create_failures: BTreeMap<ResourceProfileId, CreateFailure>,
    /// No round before this while backing off after failed create rounds.
    pub backoff_until: Option<Timestamp>,
    /// Executors that failed or cannot start.
    pub failed_executors: Vec<ExecutorFailure>,
}

/// The driver pod of an application, as its actor follows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverReport {
    pub pod_name: String,
    /// Its phase as last seen (`Pending`, `Running`, `Succeeded`, `Failed`), or `Deleted`.
    pub phase: Option<String>,
    /// When the service saw it end (Succeeded, Failed or deleted).
    pub ended_at: Option<Timestamp>,
    /// When the ended application is forgotten.
    pub forget_at: Option<Timestamp>,
}

/// How an actor follows its application's driver pod.
#[derive(Debug, Clone)]
pub(crate) struct DriverLife {
    pub pod_name: String,
    /// How long an application whose driver pod Failed or Succeeded is kept before it is
    /// forgotten (one whose driver pod is deleted is forgotten at once).
    pub grace: Duration,
}

/// Called once when an actor ends because its driver ended: forgets the application.
pub(crate) type ForgetHook = Box<dyn FnOnce() + Send>;

/// What Start hands a new actor: the engine state it resumes from and where its
/// application lives.
pub(crate) struct ActorParts {
    pub app_id: String,
    pub namespace: String,
    pub allocator: Allocator,
    pub store: SnapshotStore,
    pub builder: ExecutorPodBuilder,
    pub rules: StateRules,
    pub pods: ExecutorPodClient,
    pub clock: Arc<dyn Clock>,
    /// Where the highest executor id handed out is recorded.
    pub id_record: IdRecord,
    /// The ids the record covers, reserved in blocks.
    pub id_blocks: IdBlocks,
    /// The driver pod, when Start named one.
    pub driver: Option<DriverLife>,
    /// Forgets the application once its driver ended and the grace period passed.
    pub forget: ForgetHook,
    /// What a restarted service needs to resume the application, kept in Kubernetes.
    pub registration: Registration,
    /// Where the registration is written (the service's namespace).
    pub registrations: RegistrationStore,
    /// Publishes the executor pods' changes to WatchExecutors streams (ended with the actor).
    pub feed: Feed,
}

/// Reaches a running actor: the only way to ask it anything.
#[derive(Clone)]
pub(crate) struct ActorHandle {
    tx: mpsc::Sender<Command>,
    task: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
    app_id: String,
}

/// Commands queued per actor before senders wait.
const COMMAND_QUEUE: usize = 64;

impl ActorHandle {
    /// Spawns the actor of `parts`, fed by `subscription`, in a span naming the application.
    pub fn spawn(parts: ActorParts, subscription: Subscription) -> Self {
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE);
        let (workers, done) = mpsc::unbounded_channel();
        let app_id = parts.app_id.clone();
        let span = tracing::info_span!(parent: None, "application", app = %parts.app_id, namespace = %parts.namespace);
        let actor = ApplicationActor::new(parts, workers);
        let task = tokio::spawn(actor.run(rx, subscription, done).instrument(span));
        Self {
            tx,
            task: Arc::new(std::sync::Mutex::new(Some(task))),
            app_id,
        }
    }

    /// Registers `templates` (all or none), then sets `targets` (profiles left out keep
    /// theirs).
    pub async fn set_targets(
        &self,
        templates: BTreeMap<ResourceProfileId, Pod>,
        targets: BTreeMap<ResourceProfileId, u32>,
    ) -> Result<(), AppError> {
        self.call(|reply| Command::SetTargets {
            templates,
            targets,
            reply,
        })
        .await?
    }

    /// Whether the actor deleted `id` and its pod is still there.
    pub async fn is_deleted(&self, id: ExecutorId) -> Result<bool, AppError> {
        self.call(|reply| Command::IsDeleted(id, reply)).await
    }

    /// Replaces the executors registered with the driver.
    pub async fn update_registered(&self, ids: BTreeSet<ExecutorId>) -> Result<(), AppError> {
        self.call(|reply| Command::UpdateRegistered(ids, reply))
            .await
    }

    /// The application's state as the actor knows it now.
    pub async fn report(&self) -> Result<ActorReport, AppError> {
        self.call(Command::Report).await
    }

    /// The current snapshot of the application's executor pods.
    pub async fn snapshot(&self) -> Result<ExecutorPodsSnapshot, AppError> {
        self.call(Command::Snapshot).await
    }

    /// A stream of executor pod changes after `since` (0: the full state first).
    pub async fn watch_executors(&self, since: u64) -> Result<ExecutorEvents, AppError> {
        self.call(|reply| Command::WatchExecutors(since, reply))
            .await
    }

    /// Sends a command built around a reply channel and waits for the reply.
    async fn call<R>(
        &self,
        command: impl FnOnce(oneshot::Sender<R>) -> Command,
    ) -> Result<R, AppError> {
        let (reply, answer) = oneshot::channel();
        // The actor ends when the application is stopped or forgotten: a call racing that
        // finds no application, as one made just after it would.
        let gone = || AppError::NotFound(self.app_id.clone());
        self.tx.send(command(reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())
    }

    /// Stops the actor and waits until it has ended (no request of it is in flight after).
    pub async fn stop(&self) {
        // If the actor already ended, the send fails and the join below returns at once.
        let _ = self.tx.send(Command::Stop).await;
        let task = match self.task.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(task) = task
            && let Err(err) = task.await
        {
            tracing::error!(app = %self.app_id, error = %err, "application actor ended abnormally");
        }
    }
}

/// One application's actor: its engine state, what it follows of the application, and
/// the Kubernetes work of its rounds in flight. Only its own task touches it.
pub(crate) struct ApplicationActor {
    app_id: String,
    namespace: String,
    allocator: Allocator,
    store: SnapshotStore,
    builder: ExecutorPodBuilder,
    rules: StateRules,
    pods: ExecutorPodClient,
    clock: Arc<dyn Clock>,
    /// Where the highest executor id handed out is recorded.
    id_record: IdRecord,
    /// The ids the record covers, reserved in blocks.
    id_blocks: IdBlocks,
    /// The driver pod, when Start named one.
    driver: Option<DriverLife>,
    /// Forgets the application once its driver ended and the grace period passed.
    forget: Option<ForgetHook>,
    /// What a restarted service needs to resume the application, kept in Kubernetes.
    registration: Registration,
    /// Where the registration is written (the service's namespace).
    registrations: RegistrationStore,
    /// Publishes the executor pods' changes to WatchExecutors streams (ended with the actor).
    feed: Feed,
    /// Deletes that failed, retried by the next round (merged per `only_pending`).
    retry_deletes: BTreeMap<bool, BTreeSet<ExecutorId>>,
    /// Finished executors whose pod was deleted (or labelled inactive), or is being.
    finished_handled: BTreeSet<ExecutorId>,
    /// Rounds carried out completely (their requests answered).
    rounds: u64,
    /// A round's deletes, clean-up and id record are being sent: the next round waits
    /// for their results (so a failed delete is retried and ids are recorded in order).
    upkeep_in_flight: bool,
    /// Rounds whose creates are still in flight.
    creates_in_flight: usize,
    /// The creates of the round whose id record is being written, in id order: not sent
    /// yet, and not sent at all if the record fails (then their ids are given back, see
    /// [`Self::id_recorded`]).
    awaiting_record: Vec<ExecutorId>,
    /// Where the round workers report; the receiver lives in `run`.
    workers: mpsc::UnboundedSender<WorkDone>,
    /// Fired on Stop: creates not yet sent are skipped.
    cancel: CancellationToken,
    /// When the next round runs.
    schedule: RoundSchedule,
    /// The driver pod's phase as last seen.
    driver_phase: Option<String>,
    /// Set once the driver pod ended: no round runs any more.
    ended: Option<Ended>,
    /// When the delete of every executor pod (driver ended, delete-on-termination) is due.
    cleanup_due: Option<Timestamp>,
    /// That delete is in flight.
    cleanup_in_flight: bool,
    /// Failed creates and failed executors, for GetStatus.
    failures: Failures,
    /// When each executor not yet Running was requested, and whether its pod was seen
    /// (wall time, for the metrics' request-to-seen and request-to-Running latencies).
    requested_at: BTreeMap<ExecutorId, (std::time::Instant, bool)>,
    /// The profile of each create in flight.
    create_profiles: BTreeMap<ExecutorId, ResourceProfileId>,
    /// The registration changed since it was last written (the next round writes it).
    registration_dirty: bool,
}

/// The end of the driver pod as the actor saw it.
#[derive(Debug, Clone)]
struct Ended {
    phase: String,
    at: Timestamp,
    forget_at: Timestamp,
}

/// Longest backoff after failed create rounds (unless the batch delay is longer).
const MAX_CREATE_BACKOFF: Duration = Duration::from_secs(60);

/// When an actor's next round runs, decided in one place: the snapshot store's schedule
/// (a batch delay after the last poll, or at once when notified), held back while backing
/// off after rounds whose creates all failed at the API server.
#[derive(Debug, Clone, Copy, Default)]
struct RoundSchedule {
    /// Consecutive rounds whose creates all failed.
    failed_create_rounds: u32,
    /// No round before this (0 = no backoff).
    backoff_until: Timestamp,
}

impl RoundSchedule {
    /// When the next round may run.
    fn next_round_at(&self, store: &SnapshotStore) -> Timestamp {
        store.next_due().max(self.backoff_until)
    }

    /// New targets were set; `idle` (nothing outstanding, the engine's answer) calls a
    /// round at once, as Spark does, though never before a backoff ends.
    fn targets_changed(&self, store: &mut SnapshotStore, idle: bool) {
        if idle {
            store.notify_now();
        }
    }

    /// A round's creates were not all refused: no backoff.
    fn creates_went_through(&mut self) {
        self.failed_create_rounds = 0;
        self.backoff_until = Timestamp(0);
    }

    /// Every create of a round failed: the next round waits 2, 4, 8, … batch delays (at
    /// most [`MAX_CREATE_BACKOFF`], unless the batch delay is longer); returns the wait.
    fn creates_all_failed(&mut self, batch_delay: Duration, now: Timestamp) -> Duration {
        self.failed_create_rounds = self.failed_create_rounds.saturating_add(1);
        let backoff = batch_delay
            .saturating_mul(1 << self.failed_create_rounds.min(6))
            .min(MAX_CREATE_BACKOFF.max(batch_delay));
        self.backoff_until = now.plus(backoff);
        backoff
    }

    /// The end of the backoff under way at `now`, if any.
    fn backoff_until(&self, now: Timestamp) -> Option<Timestamp> {
        Some(self.backoff_until).filter(|until| *until > now)
    }
}

/// The outcome of one round's creates.
type CreateResults = Vec<(ExecutorId, Result<(), CreateError>)>;

/// What a round's worker reports back to the actor.
enum WorkDone {
    /// The round's deletes, clean-up of finished executors and id record were answered.
    Upkeep(Upkeep),
    /// The round's id record was answered (before the rest of its upkeep, and by the same
    /// worker, so always before [`WorkDone::Upkeep`], hence before the next round): the
    /// id recorded (none: none was needed), or why recording failed.
    Recorded(Result<Option<ExecutorId>, String>),
    /// The round's creates were answered (or not sent: see [`CreateError`]).
    Created(CreateResults),
    /// The delete of every executor pod after the driver ended was answered.
    CleanedUp(Result<u32, String>),
    /// The LIST of the executor pods for a WatchExecutors full state (with its ticket).
    Listed(u64, Vec<ListedPod>),
}

/// The Kubernetes requests of one round other than its creates, sent in this order.
struct UpkeepWork {
    /// Collection deletes, per `only_pending`.
    deletes: BTreeMap<bool, BTreeSet<ExecutorId>>,
    /// Finished executors (id, pod name) to delete or label inactive.
    finished: Vec<(ExecutorId, String)>,
    /// Delete finished executors (else label them inactive).
    delete_on_termination: bool,
    /// The highest id of the round's creates, to record before they are sent.
    record: Option<ExecutorId>,
    /// Whether the round has creates waiting for this (the round is counted with them).
    with_creates: bool,
    /// The application's registration to write, when it changed.
    registration: Option<Registration>,
}

/// The outcome of [`UpkeepWork`].
struct Upkeep {
    /// Deletes that failed (retried by the next round).
    failed_deletes: BTreeMap<bool, BTreeSet<ExecutorId>>,
    /// Finished executors whose clean-up failed (retried by the next round).
    finished_failed: Vec<ExecutorId>,
    /// Copied from [`UpkeepWork::with_creates`].
    with_creates: bool,
    /// Writing the registration failed (the next round writes it again).
    registration_failed: bool,
}

impl ApplicationActor {
    fn new(parts: ActorParts, workers: mpsc::UnboundedSender<WorkDone>) -> Self {
        let ActorParts {
            app_id,
            namespace,
            allocator,
            store,
            builder,
            rules,
            pods,
            clock,
            id_record,
            id_blocks,
            driver,
            forget,
            registration,
            registrations,
            feed,
        } = parts;
        Self {
            app_id,
            namespace,
            allocator,
            store,
            builder,
            rules,
            pods,
            clock,
            id_record,
            id_blocks,
            driver,
            forget: Some(forget),
            registration,
            registrations,
            feed,
            retry_deletes: BTreeMap::new(),
            finished_handled: BTreeSet::new(),
            rounds: 0,
            upkeep_in_flight: false,
            creates_in_flight: 0,
            awaiting_record: Vec::new(),
            workers,
            cancel: CancellationToken::new(),
            schedule: RoundSchedule::default(),
            driver_phase: None,
            ended: None,
            cleanup_due: None,
            cleanup_in_flight: false,
            failures: Failures::default(),
            create_profiles: BTreeMap::new(),
            requested_at: BTreeMap::new(),
            registration_dirty: true,
        }
    }

    /// The actor's life: serve until Stop (or the driver's end), then let the requests in
    /// flight finish, then forget the application if its driver ended.
    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut subscription: Subscription,
        mut done: mpsc::UnboundedReceiver<WorkDone>,
    ) {
        tracing::info!("application actor started");
        let forgotten = self
            .serve(&mut commands, &mut subscription, &mut done)
            .await;
        // No create may land after Stop's DELETE: skip unsent ones, await those in flight
        // (every request has a deadline, so this ends).
        self.cancel.cancel();
        while self.in_flight() {
            match done.recv().await {
                Some(work) => self.work_done(work),
                None => break,
            }
        }
        if forgotten && let Some(forget) = self.forget.take() {
            forget();
            tracing::info!("application forgotten: its driver pod ended");
        }
        self.pods.metrics().forget_application(&self.app_id);
        tracing::info!("application actor stopped");
    }

    /// The time from an executor's request to its pod first seen, and to Running, into the
    /// metrics (once each; a pod that ends before Running is timed as seen only).
    fn time_requested(
        requested_at: &mut BTreeMap<ExecutorId, (std::time::Instant, bool)>,
        metrics: &Metrics,
        executor: &ExecutorPod,
    ) {
        let Some((requested, seen)) = requested_at.get_mut(&executor.id) else {
            return;
        };
        let elapsed = requested.elapsed();
        if !*seen {
            *seen = true;
            metrics.executor_seen_after(elapsed);
        }
        match executor.state {
            ExecutorState::Pending => {}
            ExecutorState::Running => {
                metrics.executor_running_after(elapsed);
                requested_at.remove(&executor.id);
            }
            _ => {
                requested_at.remove(&executor.id);
            }
        }
    }

    /// The application's counts per profile into the metrics (as GetStatus reports them).
    fn export_counts(&self) {
        let status = self.allocator.status();
        self.pods.metrics().application_profiles(
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

    /// Whether any worker of the actor is still sending requests.
    fn in_flight(&self) -> bool {
        self.upkeep_in_flight || self.creates_in_flight > 0 || self.cleanup_in_flight
    }

    /// The loop: it only computes and answers; every Kubernetes request of a round runs in
    /// a worker task whose results come back on `done`, so no command ever waits on the
    /// API server. Returns true when it ended because the driver ended (forget it).
    async fn serve(
        &mut self,
        commands: &mut mpsc::Receiver<Command>,
        subscription: &mut Subscription,
        done: &mut mpsc::UnboundedReceiver<WorkDone>,
    ) -> bool {
        let mut events_open = true;
        loop {
            self.list_for_feed();
            let (due, may_wake) = match &self.ended {
                None => (self.next_round_at(), !self.upkeep_in_flight),
                Some(ended) => (
                    self.cleanup_due
                        .map_or(ended.forget_at, |at| at.min(ended.forget_at)),
                    !self.in_flight(),
                ),
            };
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    None | Some(Command::Stop) => return false,
                    Some(command) => self.handle(command),
                },
                event = subscription.events.recv(), if events_open => match event {
                    Some(event) => self.ingest(event),
                    None => {
                        tracing::error!("pod event stream closed; relying on nothing but rounds");
                        events_open = false;
                    }
                },
                Some(work) = done.recv() => self.work_done(work),
                () = self.clock.sleep_until(due), if may_wake => {
                    if self.ended.is_none() {
                        self.round();
                    } else if self.after_end() {
                        return true;
                    }
                }
            }
        }
    }

    /// The driver pod ended (`phase`): no round runs any more, creates not sent yet are
    /// skipped, every executor pod is deleted (delete-on-termination), and the application
    /// is forgotten after `grace`.
    fn driver_ended(&mut self, phase: &str, grace: Duration) {
        let now = self.clock.now();
        if let Some(ended) = &mut self.ended {
            // Deleted after it failed: forgotten at once.
            ended.forget_at = ended.forget_at.min(now.plus(grace));
            return;
        }
        self.cancel.cancel();
        let delete = self.allocator.settings().delete_on_termination;
        if delete {
            self.cleanup_due = Some(now);
        }
        let forget_at = now.plus(grace);
        let driver = self.driver.as_ref().map(|d| d.pod_name.clone());
        tracing::warn!(driver = ?driver, phase, delete_executors = delete, grace_ms = grace.as_millis(),
            "driver pod ended: no new executors; the application is forgotten after the grace period");
        self.ended = Some(Ended {
            phase: phase.to_string(),
            at: now,
            forget_at,
        });
    }

    /// A wake-up after the driver ended (nothing in flight): the executors' delete when
    /// due, then forgetting the application once the grace period passed (returns true).
    fn after_end(&mut self) -> bool {
        let now = self.clock.now();
        if let Some(due) = self.cleanup_due
            && due <= now
        {
            self.cleanup_due = None;
            self.spawn_cleanup();
            return false;
        }
        let Some(ended) = &self.ended else {
            return false;
        };
        if now < ended.forget_at {
            return false;
        }
        if self.cleanup_due.is_some() {
            tracing::warn!(
                "forgetting the application although deleting its executor pods failed; the driver pod's ownerReferences remain"
            );
        }
        true
    }

    /// Deletes every executor pod of the application (its driver ended) from a worker task.
    fn spawn_cleanup(&mut self) {
        self.cleanup_in_flight = true;
        let client = self.pods.clone();
        let namespace = self.namespace.clone();
        let app_id = self.app_id.clone();
        let done = self.workers.clone();
        tokio::spawn(
            async move {
                let result = client
                    .delete_all(&namespace, &app_id)
                    .await
                    .map_err(|err| crate::k8s::describe_error(&err));
                if let Ok(deleted) = result {
                    client
                        .metrics()
                        .pods_deleted(DeleteReason::Stop, u64::from(deleted));
                }
                let _ = done.send(WorkDone::CleanedUp(result));
            }
            .in_current_span(),
        );
    }

    /// When the next round may run (see [`RoundSchedule`]).
    fn next_round_at(&self) -> Timestamp {
        self.schedule.next_round_at(&self.store)
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
            }
            Command::IsDeleted(id, reply) => {
                let _ = reply.send(self.allocator.is_deleted(id));
            }
            Command::UpdateRegistered(ids, reply) => {
                self.update_registered(ids);
                let _ = reply.send(());
            }
            Command::Report(reply) => {
                let _ = reply.send(self.report());
            }
            Command::Snapshot(reply) => {
                let _ = reply.send(self.store.current().clone());
            }
            Command::WatchExecutors(since, reply) => {
                let _ = reply.send(self.feed.subscribe(since));
            }
            Command::Stop => {}
        }
    }

    /// The executors the driver has registered: to the engine, and into the registration.
    fn update_registered(&mut self, ids: BTreeSet<ExecutorId>) {
        let stored: BTreeSet<u64> = ids.iter().map(|id| id.0).collect();
        if stored != self.registration.registered {
            self.registration.registered = stored;
            self.registration_dirty = true;
        }
        self.allocator.set_registered(ids);
    }

    /// The application's state for GetStatus.
    fn report(&self) -> ActorReport {
        let mut status = self.allocator.status();
        // The creates waiting for their id record are not sent yet (and may never be):
        // their ids are not used.
        if let Some(lowest) = self.awaiting_record.first() {
            status.last_executor_id = status.last_executor_id.min(lowest.0.saturating_sub(1));
        }
        // A profile with a template is one the driver may ask for: listed (target 0
        // until it has one) even before it has executors.
        for profile in self.builder.profiles() {
            status.profiles.entry(profile).or_default();
        }
        ActorReport {
            status,
            rounds: self.rounds,
            next_round_at: self.next_round_at(),
            driver: self.driver_report(),
            create_failures: self.failures.creates().clone(),
            backoff_until: self.schedule.backoff_until(self.clock.now()),
            failed_executors: self.failures.executors(),
        }
    }

    fn driver_report(&self) -> Option<DriverReport> {
        let driver = self.driver.as_ref()?;
        Some(DriverReport {
            pod_name: driver.pod_name.clone(),
            phase: self
                .ended
                .as_ref()
                .map(|e| e.phase.clone())
                .or_else(|| self.driver_phase.clone()),
            ended_at: self.ended.as_ref().map(|e| e.at),
            forget_at: self.ended.as_ref().map(|e| e.forget_at),
        })
    }

    /// The templates registered and the targets set, or nothing changed at all.
    fn set_targets(
        &mut self,
        templates: BTreeMap<ResourceProfileId, Pod>,
        targets: &BTreeMap<ResourceProfileId, u32>,
    ) -> Result<(), AppError> {
        let registered = if templates.is_empty() {
            None
        } else {
            let builder = self
                .builder
                .with_templates(templates)
                .map_err(super::templates::template_error)?;
            Some(builder)
        };
        let builder = registered.as_ref().unwrap_or(&self.builder);
        if let Some(profile) = targets.keys().find(|p| !builder.has_profile(**p)) {
            return Err(AppError::FailedPrecondition(format!(
                "executors_per_profile[{profile}]: resource profile {profile} has no executor pod \
                 template (give one in resource_profile_templates, of Start or of this request)"
            )));
        }
        if let Some(builder) = registered {
            let added: Vec<ResourceProfileId> = builder
                .profiles()
                .filter(|p| !self.builder.has_profile(*p))
                .collect();
            if !added.is_empty() {
                tracing::info!(profiles = ?added, "resource profile templates registered");
            }
            self.builder = builder;
        }
        // Only new targets call a round early (a repeated Start registers templates only).
        if !targets.is_empty() {
            let idle = self.allocator.set_targets(targets);
            self.schedule.targets_changed(&mut self.store, idle);
        }
        self.update_registration();
        Ok(())
    }

    /// Brings the registration in line with the templates and targets; marks it for
    /// writing when it changed.
    fn update_registration(&mut self) {
        let templates: BTreeMap<i32, Pod> = self
            .builder
            .profiles()
            .filter_map(|p| Some((p.0, self.builder.template(p)?.clone())))
            .collect();
        let targets: BTreeMap<i32, u32> = self
            .allocator
            .targets()
            .iter()
            .map(|(p, t)| (p.0, *t))
            .collect();
        let registration = &mut self.registration;
        if registration.templates != templates || registration.targets != targets {
            registration.templates = templates;
            registration.targets = targets;
            self.registration_dirty = true;
        }
    }

    /// One pod event of the namespace's watch.
    fn ingest(&mut self, event: PodEvent) {
        match event {
            PodEvent::Applied(pod) => self.pod_applied(&pod),
            PodEvent::Deleted(pod) => self.pod_deleted(&pod),
            PodEvent::Driver(pod) => self.driver_changed(&pod),
            PodEvent::DriverDeleted => self.driver_ended("Deleted", Duration::ZERO),
            PodEvent::Resync(pods) => self.relisted(pods),
        }
    }

    /// An executor pod added or changed.
    fn pod_applied(&mut self, pod: &Pod) {
        let rules = &self.rules;
        self.feed.applied(pod, rules);
        if let Some(executor) = executor_pod_from(pod, rules) {
            self.failures.observe(pod, &executor, self.clock.now());
            Self::time_requested(&mut self.requested_at, self.pods.metrics(), &executor);
            self.store.update_pod(executor);
        }
    }

    /// An executor pod gone from the cluster.
    fn pod_deleted(&mut self, pod: &Pod) {
        let rules = &self.rules;
        self.feed.deleted(pod);
        if let Some(executor) = executor_pod_from(pod, rules) {
            self.failures.pod_gone(executor.id);
            self.requested_at.remove(&executor.id);
            self.allocator.pod_gone(executor.id);
            self.store.delete_pod(executor);
        }
    }

    /// The driver pod changed: its phase, and its end when it Failed or Succeeded.
    fn driver_changed(&mut self, pod: &Pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        if let Some(phase) = &phase
            && matches!(phase.as_str(), "Failed" | "Succeeded")
            && let Some(grace) = self.driver.as_ref().map(|d| d.grace)
        {
            self.driver_ended(phase, grace);
        }
        if self.ended.is_none() {
            self.driver_phase = phase;
        }
    }

    /// A full listing of the application's executor pods: unchanged executors stay in the
    /// snapshot as they are, changed ones replace theirs, and those not listed are gone.
    fn relisted(&mut self, pods: Vec<Listed>) {
        let rules = &self.rules;
        let now = self.clock.now();
        // The ids of unchanged pods, as the feed has them, before it takes in the
        // changed ones.
        let mut listed: Vec<ExecutorId> = pods
            .iter()
            .filter_map(|listed| match listed {
                Listed::Unchanged(name) => self.feed.executor_id(name),
                Listed::Changed(_) => None,
            })
            .collect();
        let mut executors: Vec<ExecutorPod> = Vec::new();
        self.feed.relisted(&pods, rules);
        for listed in &pods {
            if let Listed::Changed(pod) = listed
                && let Some(executor) = executor_pod_from(pod, rules)
            {
                self.failures.observe(pod, &executor, now);
                Self::time_requested(&mut self.requested_at, self.pods.metrics(), &executor);
                executors.push(executor);
            }
        }
        drop(pods);
        listed.extend(executors.iter().map(|e| e.id));
        listed.sort_unstable();
        listed.dedup();
        let gone: Vec<ExecutorId> = self
            .store
            .current()
            .executors
            .keys()
            .filter(|id| listed.binary_search(id).is_err())
            .copied()
            .collect();
        for id in gone {
            self.failures.pod_gone(id);
            self.allocator.pod_gone(id);
        }
        self.store.resync(&listed, executors, self.clock.now());
    }

    /// One round if the store is due: the engine's plan, then a worker sends its deletes,
    /// the clean-up of finished executors and the id record, then its creates.
    fn round(&mut self) {
        let now = self.clock.now();
        let Some(batch) = self.store.poll(now) else {
            return;
        };
        let plan = self.allocator.round(batch, now);
        self.export_counts();
        self.note_plan(&plan);
        let upkeep = self.upkeep(plan.deletes, &plan.creates, plan.still_wanted);
        let pods = self.build_pods(plan.creates);
        self.send_round(upkeep, pods);
    }

    /// Logs what the plan gave up on; timed-out requests are no longer timed.
    fn note_plan(&mut self, plan: &RoundPlan) {
        for id in &plan.timed_out {
            self.requested_at.remove(id);
        }
        if !plan.timed_out.is_empty() {
            tracing::warn!(executors = ?plan.timed_out, "executors not seen within the executor timeout; forgotten and re-requested");
        }
        if !plan.refused.is_empty() {
            tracing::warn!(refused = ?plan.refused, "executors refused: max_executors reached");
        }
    }

    /// The round's requests other than its creates: the plan's deletes with those to
    /// retry, the clean-up of finished executors, the id record covering `creates` (and
    /// a block ahead for the `still_wanted`), the registration when it changed.
    fn upkeep(
        &mut self,
        deletes: Vec<DeleteRequest>,
        creates: &[(ExecutorId, ResourceProfileId)],
        still_wanted: u64,
    ) -> UpkeepWork {
        for request in deletes {
            self.retry_deletes
                .entry(request.only_pending)
                .or_default()
                .extend(request.ids);
        }
        let max_executors = self.allocator.settings().max_executors;
        let record = creates
            .iter()
            .map(|(id, _)| id.0)
            .max()
            .and_then(|highest| {
                self.id_blocks
                    .to_record(highest, still_wanted, max_executors)
            })
            .map(ExecutorId);
        UpkeepWork {
            deletes: std::mem::take(&mut self.retry_deletes),
            finished: self.finished_to_clean_up(),
            delete_on_termination: self.allocator.settings().delete_on_termination,
            record,
            with_creates: false,
            registration: self.registration_to_write(),
        }
    }

    /// Sends a round's requests from worker tasks: the upkeep first, the creates once the
    /// id record they need is written. A round with nothing to send is counted at once.
    fn send_round(&mut self, upkeep: UpkeepWork, pods: Vec<(ExecutorId, Pod)>) {
        if upkeep.is_empty() {
            if pods.is_empty() {
                self.rounds += 1;
            } else {
                self.spawn_creates(pods, None);
            }
            return;
        }
        self.upkeep_in_flight = true;
        let (tx, rx) = oneshot::channel();
        let upkeep = UpkeepWork {
            with_creates: !pods.is_empty(),
            ..upkeep
        };
        if !pods.is_empty() {
            if upkeep.record.is_some() {
                self.awaiting_record = pods.iter().map(|(id, _)| *id).collect();
            }
            self.spawn_creates(pods, Some(rx));
        }
        self.spawn_upkeep(upkeep, tx);
    }

    /// Sends `upkeep` from a worker task; its id record's outcome goes to `recorded` (the
    /// creates waiting for it) and to the actor at once, the rest back to the actor once
    /// answered.
    fn spawn_upkeep(&mut self, mut upkeep: UpkeepWork, recorded: oneshot::Sender<bool>) {
        let client = self.pods.clone();
        let namespace = self.namespace.clone();
        let app_id = self.app_id.clone();
        let id_record = self.id_record.clone();
        let registrations = self.registrations.clone();
        let done = self.workers.clone();
        tokio::spawn(
            async move {
                let registration = upkeep.registration.take();
                let (mut upkeep, id_recorded) =
                    upkeep.send(&client, &namespace, &app_id, &id_record).await;
                // The creates wait for the record: none is sent with an id it does not cover.
                let _ = recorded.send(id_recorded.is_ok());
                // The actor outlives its workers (it awaits them before ending).
                let _ = done.send(WorkDone::Recorded(id_recorded));
                // The registration is written beside the creates, not before them.
                if let Some(registration) = registration {
                    upkeep.registration_failed =
                        registration.write_to(&registrations).await.is_err();
                }
                // The actor outlives its workers (it awaits them before ending).
                let _ = done.send(WorkDone::Upkeep(upkeep));
            }
            .in_current_span(),
        );
    }

    /// The registration when it must be written (then no longer dirty; a failed write
    /// marks it again). The worker encodes and signs it.
    fn registration_to_write(&mut self) -> Option<Registration> {
        std::mem::take(&mut self.registration_dirty).then(|| self.registration.clone())
    }

    /// The executor pods of the round's creates; one that cannot be built is forgotten.
    fn build_pods(
        &mut self,
        creates: Vec<(ExecutorId, ResourceProfileId)>,
    ) -> Vec<(ExecutorId, Pod)> {
        let mut pods: Vec<(ExecutorId, Pod)> = Vec::with_capacity(creates.len());
        for (id, profile) in creates {
            match self.builder.build(id, profile) {
                Ok(pod) => {
                    self.create_profiles.insert(id, profile);
                    self.requested_at
                        .insert(id, (std::time::Instant::now(), false));
                    pods.push((id, pod));
                }
                Err(err) => {
                    tracing::error!(executor = id.0, error = %err, "cannot build executor pod");
                    self.allocator.create_failed(id);
                }
            }
        }
        pods
    }

    /// Sends the round's creates from a worker task, concurrently up to the configured
    /// limit, once `recorded` (the round's id record) succeeded. If the record failed, none
    /// is sent and this worker reports nothing: the upkeep's worker reports the failure
    /// ([`WorkDone::Recorded`]), and the actor gives the ids back before any later round
    /// can hand out others.
    fn spawn_creates(
        &mut self,
        pods: Vec<(ExecutorId, Pod)>,
        recorded: Option<oneshot::Receiver<bool>>,
    ) {
        self.creates_in_flight += 1;
        let client = self.pods.clone();
        let namespace = self.namespace.clone();
        let cancel = self.cancel.clone();
        let done = self.workers.clone();
        let record_name = self.id_record.to_string();
        tokio::spawn(
            async move {
                let recorded = match recorded {
                    None => Ok(()),
                    Some(rx) => match rx.await {
                        Ok(true) => Ok(()),
                        // Reported by the upkeep's worker.
                        Ok(false) => return,
                        // The upkeep worker ended without a report: this one tells.
                        Err(_) => Err(format!("{record_name}: not written")),
                    },
                };
                let results = match recorded {
                    Ok(()) => client.create_all(&namespace, pods, &cancel).await,
                    Err(message) => not_recorded(pods.iter().map(|(id, _)| *id), &message),
                };
                let _ = done.send(WorkDone::Created(results));
            }
            .in_current_span(),
        );
    }

    /// A worker's report.
    fn work_done(&mut self, work: WorkDone) {
        match work {
            WorkDone::Upkeep(upkeep) => self.upkeep_done(upkeep),
            WorkDone::Recorded(recorded) => self.id_recorded(recorded),
            WorkDone::Created(results) => {
                self.creates_in_flight = self.creates_in_flight.saturating_sub(1);
                self.record_creates(results);
            }
            WorkDone::Listed(ticket, pods) => self.feed.listed(ticket, pods),
            WorkDone::CleanedUp(result) => self.cleanup_done(result),
        }
    }

    /// A round's upkeep answered: failed deletes and clean-ups wait for the next round.
    fn upkeep_done(&mut self, upkeep: Upkeep) {
        self.upkeep_in_flight = false;
        for (only_pending, ids) in upkeep.failed_deletes {
            self.retry_deletes
                .entry(only_pending)
                .or_default()
                .extend(ids);
        }
        for id in upkeep.finished_failed {
            self.finished_handled.remove(&id);
        }
        if upkeep.registration_failed {
            self.registration_dirty = true;
        }
        // A round with creates is counted once they are answered.
        if !upkeep.with_creates {
            self.rounds += 1;
        }
    }

    /// A round's id record answered: the creates waiting for it are being sent, or, when it
    /// failed, were not sent. Nothing is created with ids a restarted service could not
    /// know of: they count as failed creates (backoff included) whose ids go back.
    fn id_recorded(&mut self, recorded: Result<Option<ExecutorId>, String>) {
        let awaiting = std::mem::take(&mut self.awaiting_record);
        match recorded {
            Ok(Some(id)) => self.id_blocks.recorded(id.0),
            Ok(None) => {}
            Err(message) => {
                if !awaiting.is_empty() {
                    self.creates_in_flight = self.creates_in_flight.saturating_sub(1);
                    let message = format!("{}: {message}", self.id_record);
                    self.record_creates(not_recorded(awaiting, &message));
                }
            }
        }
    }

    /// The delete of every executor pod after the driver ended answered.
    fn cleanup_done(&mut self, result: Result<u32, String>) {
        self.cleanup_in_flight = false;
        match result {
            Ok(deleted) => {
                tracing::info!(deleted, "executor pods deleted after the driver ended")
            }
            Err(_) => {
                // Logged with the reason; tried again one batch delay later.
                let delay = self.allocator.settings().batch_delay;
                self.cleanup_due = Some(self.clock.now().plus(delay));
            }
        }
    }

    /// The outcome of a round's creates: forget the failed ones (a later round asks again,
    /// with new ids for creates sent; the ids of creates not sent are given back). When
    /// every create of the round failed (quota, invalid spec, outage, id record), the next
    /// round waits 2, 4, 8, … batch delays (at most a minute) instead of asking again every
    /// batch delay.
    fn record_creates(&mut self, results: CreateResults) {
        let requested = results.len();
        let mut failed = 0usize;
        let mut first_error = None;
        let mut outcomes = CreateOutcomes::default();
        let mut not_sent = Vec::new();
        let now = self.clock.now();
        let metrics = self.pods.metrics().clone();
        for (id, result) in results {
            let profile = self.create_profiles.remove(&id).unwrap_or_default();
            match &result {
                Ok(()) => {
                    outcomes.accepted += 1;
                    metrics.pods_created(1);
                    self.failures.create_passed(profile);
                }
                Err(err) => {
                    if let Some((status, reason, message)) =
                        super::failures::create_failure_cause(err)
                    {
                        metrics.pod_create_failed(status, &reason);
                        // Not sent for want of an id record: nothing the API server said.
                        if !matches!(err, CreateError::IdNotRecorded(_)) {
                            outcomes
                                .refused
                                .push(CreateRefusal::of_status(status, &message));
                        }
                    }
                    self.failures.create_failed(profile, err, now);
                }
            }
            if let Err(err) = result {
                self.requested_at.remove(&id);
                if matches!(err, CreateError::Cancelled | CreateError::IdNotRecorded(_)) {
                    not_sent.push(id);
                } else {
                    self.allocator.create_failed(id);
                }
                if !matches!(err, CreateError::Cancelled) {
                    failed += 1;
                    first_error.get_or_insert(err);
                }
            }
        }
        // No id is spent on a create that was not sent.
        self.allocator.creates_not_sent(&not_sent);
        self.allocator.creates_answered(&outcomes);
        if failed == 0 {
            tracing::info!(requested, "executor pods created");
            self.schedule.creates_went_through();
        } else if failed < requested {
            tracing::warn!(requested, failed, error = ?first_error.map(|e| e.to_string()), "some executor pod creates failed");
            self.schedule.creates_went_through();
        } else {
            let delay = self.allocator.settings().batch_delay;
            let backoff = self.schedule.creates_all_failed(delay, self.clock.now());
            let backoff_ms = backoff.as_millis();
            tracing::warn!(requested, error = ?first_error.map(|e| e.to_string()), backoff_ms, "every executor pod create failed; backing off");
        }
        self.rounds += 1;
    }

    /// Failed and succeeded executors not handled yet (their pod to delete or label
    /// inactive), marked handled; a failure un-marks them for the next round.
    fn finished_to_clean_up(&mut self) -> Vec<(ExecutorId, String)> {
        let snapshot = &self.store.current().executors;
        self.finished_handled.retain(|id| snapshot.contains_key(id));
        let finished: Vec<(ExecutorId, String)> = snapshot
            .values()
            .filter(|e| {
                matches!(
                    e.state,
                    ExecutorState::Failed { .. } | ExecutorState::Succeeded { .. }
                ) && !self.finished_handled.contains(&e.id)
            })
            .map(|e| (e.id, e.pod_name.clone()))
            .collect();
        self.finished_handled
            .extend(finished.iter().map(|(id, _)| *id));
        finished
    }
}

impl ApplicationActor {
    /// Lists the executor pods for a WatchExecutors full state when the feed wants it, in
    /// a worker whose answer comes back as [`WorkDone::Listed`].
    fn list_for_feed(&mut self) {
        let Some(ticket) = self.feed.take_listing_request() else {
            return;
        };
        let client = self.pods.clone();
        let namespace = self.namespace.clone();
        let app_id = self.app_id.clone();
        let done = self.workers.clone();
        tokio::spawn(
            async move {
                let listed =
                    list_for_full_state(&client, &namespace, &app_id, || done.is_closed()).await;
                if let Some(pods) = listed {
                    let _ = done.send(WorkDone::Listed(ticket, pods));
                }
            }
            .in_current_span(),
        );
    }
}

/// The results of creates not sent because the id record covering them failed.
fn not_recorded(ids: impl IntoIterator<Item = ExecutorId>, message: &str) -> CreateResults {
    ids.into_iter()
        .map(|id| (id, Err(CreateError::IdNotRecorded(message.to_string()))))
        .collect()
}

impl UpkeepWork {
    /// Nothing to send.
    fn is_empty(&self) -> bool {
        self.deletes.is_empty()
            && self.finished.is_empty()
            && self.record.is_none()
            && self.registration.is_none()
    }

    /// Sends the requests, in order: deletes, clean-up, id record. Each failure is logged
    /// (with the API server's reason) and reported for a retry; the id record's outcome
    /// (the id recorded, or why not) comes beside the rest.
    async fn send(
        self,
        pods: &ExecutorPodClient,
        namespace: &str,
        app_id: &str,
        id_record: &IdRecord,
    ) -> (Upkeep, Result<Option<ExecutorId>, String>) {
        let mut failed_deletes = BTreeMap::new();
        for (only_pending, ids) in self.deletes {
            let list: Vec<ExecutorId> = ids.iter().copied().collect();
            match pods
                .delete_executors(namespace, app_id, &list, only_pending)
                .await
            {
                Ok(deleted) => {
                    let reason = if only_pending {
                        DeleteReason::Downscale
                    } else {
                        DeleteReason::Timeout
                    };
                    pods.metrics().pods_deleted(reason, u64::from(deleted));
                    tracing::info!(executors = ?list, only_pending, deleted, "executor pods deleted")
                }
                // Already logged with the API server's reason; the next round retries.
                Err(_) => {
                    failed_deletes.insert(only_pending, ids);
                }
            }
        }
        let mut finished_failed = Vec::new();
        if !self.finished.is_empty() {
            if self.delete_on_termination {
                let ids: Vec<ExecutorId> = self.finished.iter().map(|(id, _)| *id).collect();
                match pods.delete_executors(namespace, app_id, &ids, false).await {
                    Ok(deleted) => {
                        pods.metrics()
                            .pods_deleted(DeleteReason::Finished, u64::from(deleted));
                        tracing::info!(executors = ?ids, "finished executor pods deleted");
                    }
                    Err(_) => finished_failed = ids,
                }
            } else {
                for (id, pod_name) in self.finished {
                    if pods.mark_inactive(namespace, &pod_name).await.is_err() {
                        finished_failed.push(id);
                    }
                }
            }
        }
        let recorded = match self.record {
            None => Ok(None),
            Some(highest) => id_record
                .write(pods.api(), namespace, highest)
                .await
                .map(|()| {
                    pods.metrics().id_record_written();
                    Some(highest)
                })
                .map_err(|err| crate::k8s::describe_error(&err)),
        };
        let upkeep = Upkeep {
            failed_deletes,
            finished_failed,
            with_creates: self.with_creates,
            registration_failed: false,
        };
        (upkeep, recorded)
    }
}
