//! The actor through its channels, as its worker and the watches see it: commands and pod
//! events in, work requests out, their results back, with a manual clock and no Kubernetes.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::command::ActorReport;
use super::handle::ActorHandle;
use super::parts::{ApplicationParts, DriverLife, Engine};
use super::serve::ApplicationActor;
use super::work::{Outbox, UpkeepDone, Work, WorkDone};
use crate::allocator::{
    AllocationSettings, Allocator, CreateOutcomes, ExecutorId, ExecutorPodBuilder, IdBlocks,
    ResourceProfileId, SnapshotStore, Timestamp,
};
use crate::app::feed::Feed;
use crate::app::registration::Registration;
use crate::app::{AppError, AppId, ManualClock, StartApplication};
use crate::k8s::{CreateError, PodEvent};
use crate::metrics::Metrics;

mod rounds;

const START: Timestamp = Timestamp(1_700_000_000_000);

/// An actor driven by the test: its handle, the ends of its channels, its clock.
struct Driven {
    handle: ActorHandle,
    events: mpsc::UnboundedSender<PodEvent>,
    work: mpsc::UnboundedReceiver<Work>,
    done: mpsc::UnboundedSender<WorkDone>,
    clock: ManualClock,
    cancel: CancellationToken,
    forgotten: Arc<AtomicBool>,
    /// Work taken off the channel by [`Driven::set_target`] while it looked for the
    /// registration's write, in order.
    queued: std::collections::VecDeque<Work>,
}

fn template() -> Pod {
    serde_json::from_value(json!({
        "spec": { "containers": [{ "name": "spark-kubernetes-executor", "image": "spark:4" }] }
    }))
    .expect("template")
}

fn executor(id: u64, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("app-exec-{id}"),
            "resourceVersion": format!("{id}{}", phase.len()),
            "labels": {
                "spark-app-selector": "app",
                "spark-role": "executor",
                "spark-exec-id": id.to_string(),
            }
        },
        "status": { "phase": phase }
    }))
    .expect("executor pod")
}

fn driver_pod(phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": "app-driver" },
        "status": { "phase": phase }
    }))
    .expect("driver pod")
}

fn kubernetes_error() -> CreateError {
    CreateError::Kubernetes(kube::Error::Api(Box::new(
        kube::core::Status::failure("exceeded quota", "Forbidden").with_code(403),
    )))
}

impl Driven {
    fn start(driver: Option<DriverLife>) -> Self {
        let settings = AllocationSettings::default();
        let clock = ManualClock::new(START);
        let rules = settings.state_rules();
        let templates = BTreeMap::from([(ResourceProfileId(0), template())]);
        let builder = ExecutorPodBuilder::for_application("app", None, templates.clone(), None, "")
            .expect("builder");
        let start = StartApplication {
            app_id: AppId::parse("app").expect("app id"),
            namespace: "ns".into(),
            driver_pod_name: driver.as_ref().map(|d| d.pod_name.clone()),
            templates,
            pod_name_prefix: None,
            settings: settings.clone(),
            owner: None,
            claims: Vec::new(),
        };
        let forgotten = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&forgotten);
        let app = ApplicationParts {
            app_id: "app".into(),
            budget: crate::app::Budgets::new(Default::default(), Metrics::default())
                .join("ns", "app", 1),
            namespace: "ns".into(),
            engine: Engine {
                allocator: Allocator::new(settings.clone(), 0),
                builder,
                rules: rules.clone(),
                id_blocks: IdBlocks::new(0),
                claims: Default::default(),
            },
            clock: Arc::new(clock.clone()),
            driver,
            forget: Box::new(move || flag.store(true, Ordering::SeqCst)),
            registration: Registration::of_start(&start),
            feed: Feed::new(
                Feed::base_at(START.0),
                SnapshotStore::new(settings.batch_delay, START),
                &[],
                &rules,
            ),
        };
        let (work_tx, work) = mpsc::unbounded_channel();
        let (done, results) = mpsc::unbounded_channel();
        let (events, mut pod_events) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let actor = ApplicationActor::new(
            app,
            Metrics::default(),
            Outbox::new(work_tx, cancel.clone()),
        );
        let handle = ActorHandle::serving(
            actor,
            tracing::Span::none(),
            move |actor, commands| async move {
                actor.run(commands, &mut pod_events, results).await;
            },
        );
        Self {
            handle,
            events,
            work,
            done,
            clock,
            cancel,
            forgotten,
            queued: Default::default(),
        }
    }

    /// Lets the actor take in everything sent to it (the test runtime has one thread).
    async fn settle(&self) {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    /// The next work the actor asks for.
    async fn next_work(&mut self) -> Work {
        if let Some(work) = self.queued.pop_front() {
            return work;
        }
        tokio::time::timeout(Duration::from_secs(5), self.work.recv())
            .await
            .expect("work within 5 s")
            .expect("the actor is running")
    }

    /// Asserts the actor asks for nothing now.
    async fn no_work(&mut self) {
        self.settle().await;
        if let Some(work) = self.queued.pop_front() {
            panic!("unexpected work: {work:?}");
        }
        if let Ok(work) = self.work.try_recv() {
            panic!("unexpected work: {work:?}");
        }
    }

    fn answer(&self, done: WorkDone) {
        self.done.send(done).expect("the actor takes results");
    }

    fn event(&self, event: PodEvent) {
        self.events.send(event).expect("the actor takes events");
    }

    async fn report(&self) -> ActorReport {
        self.settle().await;
        self.handle.report().await.expect("report")
    }

    /// Sets the default profile's target and answers the registration's write it sends
    /// (when it changed the registration); the other work the actor asked for meanwhile
    /// stays next.
    async fn set_target(&mut self, n: u32) {
        let handle = self.handle.clone();
        let targets = BTreeMap::from([(ResourceProfileId(0), n)]);
        let mut set =
            tokio::spawn(async move { handle.set_targets(BTreeMap::new(), targets).await });
        self.settle().await;
        while let Ok(work) = self.work.try_recv() {
            self.queued.push_back(work);
        }
        if let Some(at) = (self.queued.iter()).position(|w| matches!(w, Work::Register(_))) {
            self.queued.remove(at);
            self.answer(WorkDone::Registered(true));
        }
        tokio::time::timeout(Duration::from_secs(5), &mut set)
            .await
            .expect("answered within 5 s")
            .expect("the call")
            .expect("targets set");
    }

    fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    /// The first round (at once, with no target: nothing to send) writes the registration;
    /// answered.
    async fn first_round_answered(&mut self) {
        match self.next_work().await {
            Work::Register(registration) => assert!(registration.targets.is_empty()),
            other => panic!("not the first round's registration: {other:?}"),
        }
        self.answer(WorkDone::Registered(true));
        assert_eq!(self.report().await.rounds, 1);
    }

    /// Stop, asked while a round of two creates waits for its id record: the Stop waits
    /// for that work.
    async fn stopping_with_work_in_flight(&mut self) -> tokio::task::JoinHandle<()> {
        self.first_round_answered().await;
        self.set_target(2).await;
        self.round_with_creates().await;
        let handle = self.handle.clone();
        let stopped = tokio::spawn(async move { handle.stop().await });
        self.settle().await;
        stopped
    }

    /// The next work, which must be a round with creates waiting for an id record: the
    /// ids it creates and the id it records.
    async fn round_with_creates(&mut self) -> (Vec<u64>, Option<u64>) {
        match self.next_work().await {
            Work::Round {
                upkeep: Some(upkeep),
                creates,
            } => {
                assert!(upkeep.with_creates, "{upkeep:?}");
                let ids = creates.iter().map(|c| c.id.0).collect();
                (ids, upkeep.record.map(|id| id.0))
            }
            other => panic!("not a round with creates: {other:?}"),
        }
    }

    fn created(&self, ids: &[u64]) {
        let results = ids.iter().map(|id| (ExecutorId(*id), Ok(()))).collect();
        self.answer(WorkDone::Created(results));
    }

    fn upkeep_answered(&self) {
        self.answer(WorkDone::Upkeep(UpkeepDone {
            with_creates: true,
            ..UpkeepDone::default()
        }));
    }
}

fn profile0(report: &ActorReport) -> (u32, u32, u32) {
    let counts = report.status.profiles[&ResourceProfileId(0)].clone();
    (counts.running, counts.pending, counts.newly_created)
}

#[tokio::test]
async fn the_driver_ending_deletes_the_executors_retries_and_forgets_after_the_grace() {
    let mut actor = Driven::start(Some(DriverLife {
        pod_name: "app-driver".into(),
        grace: Duration::from_secs(30),
    }));
    actor.first_round_answered().await;
    actor.event(PodEvent::Driver(driver_pod("Running")));
    let report = actor.report().await;
    let driver = report.driver.expect("driver");
    assert_eq!(
        (driver.phase.as_deref(), driver.ended_at),
        (Some("Running"), None)
    );

    actor.event(PodEvent::Driver(driver_pod("Failed")));
    assert!(matches!(actor.next_work().await, Work::CleanUp));
    assert!(
        actor.cancel.is_cancelled(),
        "creates not sent yet are skipped"
    );
    let driver = actor.report().await.driver.expect("driver");
    assert_eq!(driver.phase.as_deref(), Some("Failed"));
    assert_eq!(driver.ended_at, Some(START));
    assert_eq!(driver.forget_at, Some(START.plus(Duration::from_secs(30))));

    // No round any more, whatever the targets; a failed clean-up is tried again one
    // batch delay later.
    actor.set_target(3).await;
    actor.answer(WorkDone::CleanedUp(Err("unavailable".into())));
    actor.no_work().await;
    actor.advance(Duration::from_secs(1));
    assert!(matches!(actor.next_work().await, Work::CleanUp));
    actor.answer(WorkDone::CleanedUp(Ok(2)));
    actor.advance(Duration::from_secs(28));
    actor.no_work().await;
    assert!(!actor.forgotten.load(Ordering::SeqCst));

    actor.advance(Duration::from_secs(1));
    actor.settle().await;
    assert!(actor.forgotten.load(Ordering::SeqCst));
    assert!(matches!(
        actor.handle.report().await,
        Err(AppError::NotFound(_))
    ));
}

#[tokio::test]
async fn stop_skips_unsent_creates_and_waits_for_the_work_in_flight() {
    let mut actor = Driven::start(None);
    let stopped = actor.stopping_with_work_in_flight().await;
    assert!(actor.cancel.is_cancelled());
    assert!(!stopped.is_finished(), "the round's work is unanswered");

    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(2)))));
    actor.upkeep_answered();
    actor.settle().await;
    assert!(!stopped.is_finished(), "its creates are unanswered");
    actor.answer(WorkDone::Created(vec![
        (ExecutorId(1), Err(CreateError::Cancelled)),
        (ExecutorId(2), Err(CreateError::Cancelled)),
    ]));
    tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("stopped within 5 s")
        .expect("stop");
    assert!(
        !actor.forgotten.load(Ordering::SeqCst),
        "a stopped application is not forgotten"
    );
}

#[tokio::test]
async fn calls_made_while_the_actor_ends_find_the_application_gone_at_once() {
    let mut actor = Driven::start(None);
    let stopped = actor.stopping_with_work_in_flight().await;
    assert!(!stopped.is_finished(), "the round's work is unanswered");

    // The work stays unanswered: the calls do not wait for it.
    let targets = BTreeMap::from([(ResourceProfileId(0), 1)]);
    let set = tokio::time::timeout(
        Duration::from_secs(5),
        actor.handle.set_targets(BTreeMap::new(), targets),
    )
    .await
    .expect("answered while the work is in flight");
    assert!(matches!(set, Err(AppError::NotFound(_))), "{set:?}");
    let status = tokio::time::timeout(Duration::from_secs(5), actor.handle.report())
        .await
        .expect("answered while the work is in flight");
    assert!(matches!(status, Err(AppError::NotFound(_))));
    assert!(!stopped.is_finished(), "still waiting for its work");
}

#[tokio::test]
async fn a_stopped_actor_writes_what_the_driver_said_since_its_last_round() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    // Registered executors go into the registration with the next round, which has not
    // come yet when the actor is stopped (a replica shutting down, handing its shard over).
    actor
        .handle
        .update_registered(BTreeSet::from([ExecutorId(7)]))
        .await
        .expect("registered");
    actor.no_work().await;
    let handle = actor.handle.clone();
    let stopped = tokio::spawn(async move { handle.stop().await });
    match actor.next_work().await {
        Work::Register(registration) => {
            assert_eq!(registration.registered, BTreeSet::from([7]));
        }
        other => panic!("expected the registration's write, got {other:?}"),
    }
    actor.settle().await;
    assert!(!stopped.is_finished(), "the write is awaited");
    actor.answer(WorkDone::Registered(false));
    tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("a refused last write is not tried again: stopped within 5 s")
        .expect("stop");
    actor.no_work().await;
}

#[tokio::test]
async fn a_watch_asks_the_worker_for_its_listing() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.event(PodEvent::Applied(executor(1, "Pending")));
    // Taken in before the stream: the feed holds the pod, and a full state needs its JSON.
    actor.settle().await;
    let mut stream = actor.handle.watch_executors(0).await.expect("stream");
    let Work::List(ticket) = actor.next_work().await else {
        panic!("not a LIST");
    };
    let listed = crate::app::feed::ListedPod::of(&executor(1, "Pending"))
        .into_iter()
        .collect();
    actor.answer(WorkDone::Listed(ticket, listed));
    let first = stream.next().await.expect("an event");
    assert_eq!(first.kind, crate::app::feed::EventKind::Snapshot);
    assert_eq!(first.executor.map(|e| e.executor.id), Some(ExecutorId(1)));
}

#[tokio::test]
async fn a_status_read_after_pod_events_counts_what_they_showed() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.set_target(2).await;
    actor.round_with_creates().await;
    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(2)))));
    actor.upkeep_answered();
    actor.created(&[1, 2]);
    let rounds = actor.report().await.rounds;

    actor.event(PodEvent::Applied(executor(1, "Running")));
    actor.event(PodEvent::Applied(executor(2, "Pending")));
    let report = actor.report().await;
    assert_eq!(report.rounds, rounds, "no round ran since");
    assert_eq!(profile0(&report), (1, 1, 0));
    actor.event(PodEvent::Deleted(executor(2, "Pending")));
    assert_eq!(profile0(&actor.report().await), (1, 0, 0));
}

#[tokio::test]
async fn a_call_finding_the_actor_stopped_for_another_owner_is_unavailable_not_not_found() {
    // Each actor's first round is answered first: a stop waits for the work in flight.
    // Stopped for good (the driver's Stop): the application is gone.
    let mut stopped = Driven::start(None);
    stopped.first_round_answered().await;
    tokio::time::timeout(Duration::from_secs(5), stopped.handle.stop())
        .await
        .expect("stopped within 5 s");
    assert!(matches!(
        stopped.handle.report().await,
        Err(AppError::NotFound(_))
    ));
    // Stopped because its shard moves to another replica: the driver retries there.
    let mut moved = Driven::start(None);
    moved.first_round_answered().await;
    tokio::time::timeout(Duration::from_secs(5), moved.handle.stop_moving())
        .await
        .expect("stopped within 5 s");
    assert!(
        matches!(moved.handle.report().await, Err(AppError::Unavailable(_))),
        "a driver must not take a move for its application's end"
    );
}

/// The next work the actor asks for, which must be a write of its registration: its targets.
async fn registration_write(actor: &mut Driven) -> BTreeMap<i32, u32> {
    match actor.next_work().await {
        Work::Register(registration) => registration.targets,
        other => panic!("expected the registration's write, got {other:?}"),
    }
}

#[tokio::test]
async fn a_new_target_is_written_at_once_not_with_the_next_round() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;

    // Before the round it calls: a replica taking the application over resumes from the
    // registration, and a driver sends a target only when it changes.
    let handle = actor.handle.clone();
    let three = BTreeMap::from([(ResourceProfileId(0), 3)]);
    handle
        .set_targets(BTreeMap::new(), three)
        .await
        .expect("answered at once, the write in flight");
    assert_eq!(
        registration_write(&mut actor).await,
        BTreeMap::from([(0, 3)])
    );
    let (ids, _) = actor.round_with_creates().await;
    assert_eq!(ids.len(), 3);
    // One write at a time: a target set while one is in flight is written once it is
    // answered.
    let five = BTreeMap::from([(ResourceProfileId(0), 5)]);
    handle
        .set_targets(BTreeMap::new(), five)
        .await
        .expect("set");
    actor.no_work().await;
    actor.answer(WorkDone::Registered(true));
    assert_eq!(
        registration_write(&mut actor).await,
        BTreeMap::from([(0, 5)])
    );

    // A failed write is sent again by the next round, not at once.
    actor.answer(WorkDone::Registered(false));
    actor.no_work().await;
    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(2)))));
    actor.created(&ids);
    actor.upkeep_answered();
    actor.advance(Duration::from_secs(1));
    let mut rewritten = None;
    while rewritten.is_none() {
        match actor.next_work().await {
            Work::Register(registration) => rewritten = Some(registration.targets),
            Work::Round { .. } => {}
            other => panic!("unexpected work: {other:?}"),
        }
    }
    assert_eq!(rewritten, Some(BTreeMap::from([(0, 5)])));
}
