//! The actor's Kubernetes work: what it asks for ([`Work`]), what comes back
//! ([`WorkDone`]), and the [`Worker`] that sends the requests. The worker is the only part
//! of an application that holds Kubernetes clients; each piece of work runs in a task of
//! its own, so the actor never waits on the API server.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::parts::{ApplicationParts, Kubernetes};
use crate::allocator::claims::owned_claim;
use crate::allocator::{CreateOutcomes, ExecutorId, ListedClaim, listed};
use crate::app::failures::pace_outcome;
use crate::app::feed::{FULL_STATE_PAGE_SIZE, ListedPod};
use crate::app::registration::Registration;
use crate::k8s::{CreateError, ExecutorCreate, ExecutorPodClient, IdRecord, RegistrationStore};
use crate::metrics::DeleteReason;

/// What the actor asks its worker to do.
#[derive(Debug)]
pub(super) enum Work {
    /// A round's requests: its upkeep first (when it has any), then its creates once the
    /// upkeep's id record is written (none is sent with an id the record does not cover).
    Round {
        upkeep: Option<Box<UpkeepWork>>,
        creates: Vec<ExecutorCreate>,
    },
    /// Delete every executor pod of the application (its driver ended).
    CleanUp,
    /// List the executor pods for a WatchExecutors full state (with its ticket).
    List(u64),
    /// Write the application's registration (one write in flight at a time).
    Register(Box<Registration>),
}

/// What the worker reports back to the actor.
#[derive(Debug)]
pub(super) enum WorkDone {
    /// The round's deletes and clean-up of finished executors were answered.
    Upkeep(UpkeepDone),
    /// The round's id record was answered (before the rest of its upkeep, and by the same
    /// task, so always before [`WorkDone::Upkeep`], hence before the next round): the id
    /// recorded (none: none was needed), or why recording failed (naming the record).
    Recorded(Result<Option<ExecutorId>, String>),
    /// One create of a round the API server answered, as it came (before the round's
    /// [`WorkDone::Created`]): what it says of the server's pace.
    Answered(ExecutorId, CreateOutcomes),
    /// The round's creates were answered (or not sent: see [`CreateError`]).
    Created(CreateResults),
    /// The delete of every executor pod after the driver ended was answered.
    CleanedUp(Result<u32, String>),
    /// The LIST of the executor pods for a WatchExecutors full state (with its ticket).
    Listed(u64, Vec<ListedPod>),
    /// The registration's write was answered: `false` when it failed (logged).
    Registered(bool),
}

/// The outcome of one round's creates.
pub(super) type CreateResults = Vec<(ExecutorId, Result<(), CreateError>)>;

/// The Kubernetes requests of one round other than its creates, sent in this order.
#[derive(Debug, Default)]
pub(super) struct UpkeepWork {
    /// Collection deletes, per kind.
    pub deletes: BTreeMap<DeleteKind, BTreeSet<ExecutorId>>,
    /// Finished executors (id, pod name) to delete or label inactive.
    pub finished: Vec<(ExecutorId, String)>,
    /// Delete finished executors (else label them inactive).
    pub delete_on_termination: bool,
    /// The highest id of the round's creates, to record before they are sent.
    pub record: Option<ExecutorId>,
    /// Whether the round has creates waiting for this (the round is counted with them).
    pub with_creates: bool,
    /// List the application's executor claims (for reuse by the next round's creates):
    /// those owned by this uid (the driver pod's) only.
    pub list_claims: Option<String>,
}

impl UpkeepWork {
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty()
            && self.finished.is_empty()
            && self.record.is_none()
            && self.list_claims.is_none()
    }
}

/// Why executor pods are deleted by a round, which decides how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum DeleteKind {
    /// Beyond the target, or stuck: only while Pending, so a pod that just started stays.
    Downscale,
    /// Not seen within the executor timeout.
    Timeout,
    /// Given back to a budget (reclaim): whatever its phase.
    Reclaim,
}

impl DeleteKind {
    /// The kind of an engine's delete request.
    pub fn of(only_pending: bool) -> Self {
        if only_pending {
            Self::Downscale
        } else {
            Self::Timeout
        }
    }

    fn only_pending(self) -> bool {
        self == Self::Downscale
    }

    fn reason(self) -> DeleteReason {
        match self {
            Self::Downscale => DeleteReason::Downscale,
            Self::Timeout => DeleteReason::Timeout,
            Self::Reclaim => DeleteReason::Reclaim,
        }
    }
}

/// The outcome of [`UpkeepWork`].
#[derive(Debug, Default)]
pub(super) struct UpkeepDone {
    /// Deletes that failed (retried by the next round).
    pub failed_deletes: BTreeMap<DeleteKind, BTreeSet<ExecutorId>>,
    /// Finished executors whose clean-up failed (retried by the next round).
    pub finished_failed: Vec<ExecutorId>,
    /// Copied from [`UpkeepWork::with_creates`].
    pub with_creates: bool,
    /// The application's executor claims, when listed (none: not asked, or it failed).
    pub claims: Option<Vec<ListedClaim>>,
}

/// The results of creates not sent because the id record covering them failed.
pub(super) fn not_recorded(
    ids: impl IntoIterator<Item = ExecutorId>,
    message: &str,
) -> CreateResults {
    ids.into_iter()
        .map(|id| (id, Err(CreateError::IdNotRecorded(message.to_string()))))
        .collect()
}

/// The actor's end of its work: where it sends work, and what of it is unanswered.
pub(super) struct Outbox {
    requests: mpsc::UnboundedSender<Work>,
    /// Fired on Stop and when the driver ends: creates not yet sent are skipped.
    cancel: CancellationToken,
    /// A round's upkeep is unanswered: the next round waits for its results.
    pub upkeep: bool,
    /// Rounds whose creates are unanswered.
    pub creates: usize,
    /// The creates of the round whose id record is being written, in id order: not sent
    /// yet, and not sent at all if the record fails (then their ids are given back).
    pub awaiting_record: Vec<ExecutorId>,
    /// The delete of every executor pod after the driver ended is unanswered.
    pub cleanup: bool,
    /// A write of the registration is unanswered.
    pub registering: bool,
}

impl Outbox {
    pub fn new(requests: mpsc::UnboundedSender<Work>, cancel: CancellationToken) -> Self {
        Self {
            requests,
            cancel,
            upkeep: false,
            creates: 0,
            awaiting_record: Vec::new(),
            cleanup: false,
            registering: false,
        }
    }

    /// Hands `work` to the worker, counting it as in flight until its answer.
    pub fn send(&mut self, work: Work) {
        match &work {
            Work::Round { upkeep, creates } => {
                if upkeep.is_some() {
                    self.upkeep = true;
                }
                if !creates.is_empty() {
                    self.creates += 1;
                }
            }
            Work::CleanUp => self.cleanup = true,
            Work::Register(_) => self.registering = true,
            Work::List(_) => {}
        }
        if self.requests.send(work).is_err() {
            // Only when the worker is gone, which it is not while the actor runs.
            tracing::error!("the application's worker is gone; its work is not sent");
        }
    }

    /// Whether any work of the actor is unanswered (a LIST for the feed is not waited for).
    pub fn in_flight(&self) -> bool {
        self.upkeep || self.creates > 0 || self.cleanup || self.registering
    }

    /// Creates not sent yet are skipped from now on.
    pub fn cancel_creates(&self) {
        self.cancel.cancel();
    }
}

/// Sends an application's Kubernetes requests, each piece of work in a task of its own.
pub(super) struct Worker {
    pods: ExecutorPodClient,
    id_record: IdRecord,
    /// No id record was found and none written since (see [`IdRecord::write`]).
    id_record_absent: AtomicBool,
    registrations: RegistrationStore,
    namespace: String,
    app_id: String,
    /// Fired by the actor: creates not yet sent are skipped.
    cancel: CancellationToken,
    done: mpsc::UnboundedSender<WorkDone>,
}

impl Worker {
    pub fn new(
        kubernetes: Kubernetes,
        app: &ApplicationParts,
        done: mpsc::UnboundedSender<WorkDone>,
        cancel: CancellationToken,
    ) -> Self {
        let Kubernetes {
            pods,
            id_record,
            id_record_absent,
            registrations,
        } = kubernetes;
        Self {
            pods,
            id_record,
            id_record_absent: AtomicBool::new(id_record_absent),
            registrations,
            namespace: app.namespace.clone(),
            app_id: app.app_id.clone(),
            cancel,
            done,
        }
    }

    /// Takes work until the actor drops its end; tasks already started finish on their own
    /// (the actor awaits their answers before it ends).
    pub async fn run(self, mut requests: mpsc::UnboundedReceiver<Work>) {
        // Shared by the tasks of the work in flight.
        let worker = Arc::new(self);
        while let Some(work) = requests.recv().await {
            let this = &worker;
            match work {
                Work::Round { upkeep, creates } => Self::round(this, upkeep, creates),
                Work::CleanUp => Self::clean_up(this),
                Work::List(ticket) => Self::list(this, ticket),
                Work::Register(registration) => Self::register(this, *registration),
            }
        }
    }

    /// A round's upkeep, then its creates once the id record they need is written.
    fn round(this: &Arc<Self>, upkeep: Option<Box<UpkeepWork>>, creates: Vec<ExecutorCreate>) {
        let Some(upkeep) = upkeep else {
            Self::create(this, creates, None);
            return;
        };
        let (recorded, record_written) = oneshot::channel();
        if !creates.is_empty() {
            Self::create(this, creates, Some(record_written));
        }
        Self::upkeep(this, *upkeep, recorded);
    }

    /// Sends `upkeep`; its id record's outcome goes to `recorded` (the creates waiting for
    /// it) and to the actor at once, the rest to the actor once answered.
    fn upkeep(this: &Arc<Self>, upkeep: UpkeepWork, recorded: oneshot::Sender<bool>) {
        let worker = Arc::clone(this);
        tokio::spawn(
            async move {
                let Self {
                    pods,
                    id_record,
                    id_record_absent,
                    namespace,
                    app_id,
                    done,
                    ..
                } = &*worker;
                let record = (id_record, id_record_absent);
                let (outcome, id_recorded) =
                    send_upkeep(upkeep, pods, namespace, app_id, record).await;
                // The creates wait for the record: none is sent with an id it does not cover.
                let _ = recorded.send(id_recorded.is_ok());
                // The actor outlives the work it waits for (it awaits it before ending).
                let _ = done.send(WorkDone::Recorded(id_recorded));
                let _ = done.send(WorkDone::Upkeep(outcome));
            }
            .in_current_span(),
        );
    }

    /// Sends the round's creates, concurrently up to the configured limit, once `recorded`
    /// (the round's id record) succeeded. If the record failed, none is sent and this task
    /// reports nothing: the upkeep's task reports the failure ([`WorkDone::Recorded`]), and
    /// the actor gives the ids back before any later round can hand out others.
    fn create(
        this: &Arc<Self>,
        creates: Vec<ExecutorCreate>,
        recorded: Option<oneshot::Receiver<bool>>,
    ) {
        let worker = Arc::clone(this);
        tokio::spawn(
            async move {
                let Self {
                    pods,
                    id_record,
                    namespace,
                    cancel,
                    done,
                    ..
                } = &*worker;
                let recorded = match recorded {
                    None => Ok(()),
                    Some(rx) => match rx.await {
                        Ok(true) => Ok(()),
                        // Reported by the upkeep's task.
                        Ok(false) => return,
                        // The upkeep's task ended without a report: this one tells.
                        Err(_) => Err(format!("{id_record}: not written")),
                    },
                };
                let results = match recorded {
                    Ok(()) => {
                        let answered = |id, result: &Result<(), CreateError>| {
                            if let Some(outcome) = pace_outcome(result) {
                                let _ = done.send(WorkDone::Answered(id, outcome));
                            }
                        };
                        pods.create_all(namespace, creates, cancel, answered).await
                    }
                    Err(message) => not_recorded(creates.iter().map(|c| c.id), &message),
                };
                let _ = done.send(WorkDone::Created(results));
            }
            .in_current_span(),
        );
    }

    /// Deletes every executor pod of the application (its driver ended).
    fn clean_up(this: &Arc<Self>) {
        let worker = Arc::clone(this);
        tokio::spawn(
            async move {
                let Self {
                    pods,
                    namespace,
                    app_id,
                    done,
                    ..
                } = &*worker;
                let result = pods
                    .delete_all(namespace, app_id)
                    .await
                    .map_err(|err| crate::k8s::describe_error(&err));
                if let Ok(deleted) = result {
                    pods.metrics()
                        .pods_deleted(DeleteReason::Stop, u64::from(deleted));
                }
                let _ = done.send(WorkDone::CleanedUp(result));
            }
            .in_current_span(),
        );
    }

    /// Lists the executor pods for a WatchExecutors full state.
    fn list(this: &Arc<Self>, ticket: u64) {
        let worker = Arc::clone(this);
        tokio::spawn(
            async move {
                let Self {
                    pods,
                    namespace,
                    app_id,
                    done,
                    ..
                } = &*worker;
                let listed =
                    list_for_full_state(pods, namespace, app_id, || done.is_closed()).await;
                if let Some(listed) = listed {
                    let _ = done.send(WorkDone::Listed(ticket, listed));
                }
            }
            .in_current_span(),
        );
    }

    /// Writes the registration (a failure is logged by the write).
    fn register(this: &Arc<Self>, registration: Registration) {
        let worker = Arc::clone(this);
        tokio::spawn(
            async move {
                let written = registration.write_to(&worker.registrations).await.is_ok();
                // The actor outlives the work it waits for (it awaits it before ending).
                let _ = worker.done.send(WorkDone::Registered(written));
            }
            .in_current_span(),
        );
    }
}

/// Sends an upkeep's requests, in order: deletes, clean-up, id record. Each failure is
/// logged (with the API server's reason) and reported for a retry; the id record's outcome
/// (the id recorded, or why not, naming the record) comes beside the rest.
async fn send_upkeep(
    upkeep: UpkeepWork,
    pods: &ExecutorPodClient,
    namespace: &str,
    app_id: &str,
    (id_record, absent): (&IdRecord, &AtomicBool),
) -> (UpkeepDone, Result<Option<ExecutorId>, String>) {
    let mut failed_deletes = BTreeMap::new();
    for (kind, ids) in upkeep.deletes {
        let list: Vec<ExecutorId> = ids.iter().copied().collect();
        let only_pending = kind.only_pending();
        match pods
            .delete_executors(namespace, app_id, &list, only_pending)
            .await
        {
            Ok(deleted) => {
                pods.metrics()
                    .pods_deleted(kind.reason(), u64::from(deleted));
                tracing::info!(executors = %listed(&list), only_pending, deleted, "executor pods deleted")
            }
            // Already logged with the API server's reason; the next round retries.
            Err(_) => {
                failed_deletes.insert(kind, ids);
            }
        }
    }
    let mut finished_failed = Vec::new();
    if !upkeep.finished.is_empty() {
        if upkeep.delete_on_termination {
            let ids: Vec<ExecutorId> = upkeep.finished.iter().map(|(id, _)| *id).collect();
            match pods.delete_executors(namespace, app_id, &ids, false).await {
                Ok(deleted) => {
                    pods.metrics()
                        .pods_deleted(DeleteReason::Finished, u64::from(deleted));
                    tracing::info!(executors = %listed(&ids), "finished executor pods deleted");
                }
                Err(_) => finished_failed = ids,
            }
        } else {
            for (id, pod_name) in upkeep.finished {
                if pods.mark_inactive(namespace, &pod_name).await.is_err() {
                    finished_failed.push(id);
                }
            }
        }
    }
    let claims = if let Some(owner) = &upkeep.list_claims {
        // Logged by the client; the next round lists again. A claim with the labels but
        // not the owner is someone else's: never reused.
        (pods.list_claims(namespace, app_id).await.ok()).map(|claims| {
            (claims.iter())
                .filter(|claim| owned_claim(claim, app_id, owner))
                .filter_map(ListedClaim::of)
                .collect()
        })
    } else {
        None
    };
    let recorded = match upkeep.record {
        None => Ok(None),
        Some(highest) => id_record
            // Only the first write may take Start's word that there is none.
            .write(
                pods.api(),
                namespace,
                highest,
                absent.swap(false, Ordering::Relaxed),
            )
            .await
            .map(|()| {
                pods.metrics().id_record_written();
                Some(highest)
            })
            .map_err(|err| format!("{id_record}: {}", crate::k8s::describe_error(&err))),
    };
    let outcome = UpkeepDone {
        failed_deletes,
        finished_failed,
        with_creates: upkeep.with_creates,
        claims,
    };
    (outcome, recorded)
}

/// The executor pods of `app_id` for a full state, listed page by page and each page
/// turned into JSON before the next is asked for. A failed LIST is logged and run again
/// after a backoff (100 ms doubling to 5 s) until it passes or `gone` says nobody waits
/// for it any more.
pub(super) async fn list_for_full_state(
    pods: &ExecutorPodClient,
    namespace: &str,
    app_id: &str,
    gone: impl Fn() -> bool,
) -> Option<Vec<ListedPod>> {
    let mut backoff = Duration::from_millis(100);
    loop {
        let mut listed = Vec::new();
        let result = pods
            .list_executors_by_page(namespace, app_id, FULL_STATE_PAGE_SIZE, |page| {
                listed.extend(page.iter().filter_map(ListedPod::of));
            })
            .await;
        match result {
            Ok(()) => return Some(listed),
            Err(err) => {
                tracing::warn!(error = %crate::k8s::describe_error(&err), retry_ms = backoff.as_millis(),
                    "cannot list the executor pods for a WatchExecutors full state; trying again");
            }
        }
        if gone() {
            return None;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
