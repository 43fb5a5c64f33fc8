//! The applications: [`Applications`] is the registry the gRPC layer calls, one actor per
//! application (`actor`: an `ApplicationActor` task owning its engine state, reached only
//! through its handle). `start` holds the Start procedure; `templates` what a pod template
//! is held to, naming the request field it came in; `limits` the bounds on one request's
//! work; `registration` what a restarted service resumes from; `feed` the executor event
//! streams; `failures` what GetStatus reports of failed creates and executors.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use crate::allocator::{
    AllocationSettings, AllocatorStatus, ExecutorId, ExecutorPodsSnapshot, ResourceProfileId,
    Timestamp,
};
use crate::ha::{Fence, Ownerships, ShardState, shards::Shard};
use crate::k8s::{
    ExecutorPodClient, IdRecord, PodWatches, RegistrationSettings, RegistrationStore, RequestPolicy,
};
use crate::metrics::{DeleteReason, Metrics};
use registration::Refusal;
use start::FirstStart;

mod actor;
pub mod budgets;
pub mod error;
pub mod failures;
pub mod feed;
pub mod limits;
pub mod registration;
mod start;
pub mod templates;
pub mod tenants;

pub use crate::time::{Clock, ManualClock, SystemClock};
pub use actor::DriverReport;
use actor::{ActorHandle, ActorReport};
pub use budgets::{BudgetPolicy, Budgets, HeldBy};
pub use error::AppError;
pub use failures::{CreateFailure, ExecutorFailure, ExecutorProblem};
pub use feed::{EventKind, ExecutorEvent, ExecutorEvents, ExecutorView, Feed};
use tenants::{Admission, ApplicationSlot};
pub use tenants::{TenantLimits, Tenants};

/// A validated application id (a label value: ≤ 63 chars, alphanumeric ends, `-_.` inside).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppId(String);

impl AppId {
    /// Validates `value` as a label value; the error says why.
    pub fn parse(value: &str) -> Result<Self, String> {
        crate::naming::application_id(value)?;
        Ok(Self(value.to_string()))
    }
    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for AppId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Everything Start needs, already validated and resolved against server defaults.
#[derive(Debug, Clone)]
pub struct StartApplication {
    pub app_id: AppId,
    pub namespace: String,
    pub driver_pod_name: Option<String>,
    /// Pod templates per resource profile (profile 0 always present).
    pub templates: BTreeMap<ResourceProfileId, Pod>,
    /// Prefix of executor pod names; defaults to the application id (plus a hash of it when
    /// sanitising it into a DNS label loses information, see [`crate::allocator::ExecutorPodBuilder::for_application`]).
    pub pod_name_prefix: Option<String>,
    pub settings: AllocationSettings,
    /// The identity that starts it (the authenticated user name); `None` when the service
    /// authenticates nobody. Kept in its registration, so a resumed application keeps it.
    pub owner: Option<String>,
    /// Per-executor claim templates (`executor_claim_templates`), for the executors whose
    /// pods mount them.
    pub claims: Vec<PersistentVolumeClaim>,
}

/// Where an application's pods go: its namespace and driver pod (the one owner its
/// templates may name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub namespace: String,
    pub driver_pod_name: Option<String>,
}

/// An application's state as GetStatus reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplicationStatus {
    /// The engine's counts, targets, deleted executors and last id.
    pub allocation: AllocatorStatus,
    /// The driver pod's life (`None` when Start named no driver pod).
    pub driver: Option<DriverReport>,
    /// The last failed create per profile (with how many failed in a row).
    pub create_failures: BTreeMap<ResourceProfileId, CreateFailure>,
    /// No round before this while backing off after failed create rounds, or while the
    /// API server's Retry-After lasts.
    pub backoff_until: Option<Timestamp>,
    /// Executors that failed (the last 100) or cannot start, ascending by id.
    pub failed_executors: Vec<ExecutorFailure>,
    /// Why the profiles' `held` executors are held (the budget that bounds the
    /// application), as of the last round; `None` when none is held.
    pub held_by: Option<HeldBy>,
}

/// What Start reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub resumed: bool,
    pub last_executor_id: u64,
}

/// Service-wide options of the application layer; the composition root builds them from
/// the configuration, whose defaults are these.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Least wait between the end of a namespace's full LIST and the next.
    pub resync_interval: Duration,
    /// The full LIST's executor pods per second on average: with many pods followed it
    /// waits longer than the interval (0: the interval alone; see
    /// [`crate::k8s::ResyncPace`]).
    pub resync_pods_per_second: u32,
    /// Namespaces applications may run in; empty = all.
    pub allowed_namespaces: BTreeSet<String>,
    /// Mutating requests per second, shared by all applications.
    pub qps: u32,
    /// Burst above `qps`.
    pub burst: u32,
    /// An application's creates in flight at once, over all its rounds.
    pub create_concurrency: usize,
    /// Deadline and retries of every Kubernetes request.
    pub request_policy: RequestPolicy,
    /// How long an application whose driver pod Failed or Succeeded is kept (calls still
    /// answer, nothing is created) before it is forgotten.
    pub driver_end_grace: Duration,
    /// Changes a WatchExecutors stream may leave unread before it is given a fresh full
    /// state instead (bounds each stream's memory; never blocks the actor).
    pub executor_stream_buffer: usize,
    /// What one request may cause (`limits`): the application layer holds templates given
    /// after Start to its profile count, and each round to its creates per round.
    pub limits: limits::RequestLimits,
    /// What a template may ask for (`pod_policy`), the one copy of it: Start's templates
    /// (checked at the edge, through [`Applications::pod_policy`]), SetTotalExpected's, and
    /// those of a registration before it is resumed (signed, but the policy may have been
    /// tightened since it was written).
    pub pod_policy: crate::allocator::pod_policy::PodPolicy,
    /// Where registrations are kept and the Secret of the key that signs them
    /// (`registrations`).
    pub registrations: RegistrationSettings,
    /// Applications per identity and namespace, WatchExecutors streams per identity and
    /// in all, and each stream's unread bytes (`tenants`).
    pub tenants: TenantLimits,
    /// This replica's identity, the shards and the Leases' timing (`ha`).
    pub ha: crate::ha::HaSettings,
    /// The budgets the applications share, as the service starts (`budgets`; a reload of
    /// the configuration file replaces them through [`Applications::budgets`]).
    pub budgets: BudgetPolicy,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        let kubernetes = crate::k8s::KubernetesSettings::default();
        Self {
            resync_interval: Duration::from_secs(30),
            resync_pods_per_second: 100,
            allowed_namespaces: BTreeSet::new(),
            qps: kubernetes.qps,
            burst: kubernetes.burst,
            create_concurrency: usize::try_from(kubernetes.create_concurrency)
                .unwrap_or(usize::MAX),
            request_policy: RequestPolicy::default(),
            driver_end_grace: Duration::from_secs(60),
            executor_stream_buffer: feed::STREAM_BUFFER,
            limits: limits::RequestLimits::default(),
            pod_policy: crate::allocator::pod_policy::PodPolicy::default(),
            registrations: RegistrationSettings::default(),
            tenants: TenantLimits::default(),
            ha: crate::ha::HaSettings::default(),
            budgets: BudgetPolicy::default(),
        }
    }
}

/// Shared context of every application: the clock, the options, the metrics.
#[derive(Clone)]
pub(crate) struct ServiceContext {
    pub clock: Arc<dyn Clock>,
    pub options: ServiceOptions,
    /// Where pods created and deleted, create failures and active applications are counted.
    pub metrics: Metrics,
}

/// The Kubernetes side of every application, built by the composition root
/// ([`crate::runtime::Builder`]) over one client and one rate limiter.
pub(crate) struct KubernetesParts {
    /// Executor pod creates, deletes and listings.
    pub pods: ExecutorPodClient,
    /// The registrations, in the service's namespace.
    pub registrations: RegistrationStore,
    /// The shared pod watches per namespace.
    pub watches: PodWatches,
    /// The shards this replica holds: it acts only on their applications.
    pub ownerships: Ownerships,
}

/// The registry of running applications.
#[derive(Clone)]
pub struct Applications {
    inner: Arc<Registry>,
}

struct Registry {
    ctx: ServiceContext,
    pods: ExecutorPodClient,
    /// The registrations, in the service's namespace.
    registrations: RegistrationStore,
    watches: PodWatches,
    apps: Mutex<HashMap<AppId, Entry>>,
    /// Start and Stop hold it shared (they run concurrently), shutdown exclusively (it
    /// waits for those under way, and none starts after it).
    lifecycle: tokio::sync::RwLock<()>,
    /// Serialises Start and Stop of one application id (never started twice concurrently);
    /// different applications' run side by side. An entry lives while someone holds it.
    app_locks: Mutex<HashMap<AppId, Arc<tokio::sync::Mutex<()>>>>,
    shutting_down: AtomicBool,
    /// Numbers the actors, so a forgotten application's entry is removed only if it is
    /// still that actor's.
    generations: AtomicU64,
    /// Applications per identity and namespace, streams per identity (`tenants`).
    tenants: Tenants,
    /// The budgets' ledger: every application's claim on the budgets it falls under.
    budgets: Budgets,
    /// The shards this replica holds.
    ownerships: Ownerships,
    /// Per shard, the epoch whose registrations have been resumed here (held while a
    /// shard is resumed, so two resumes of one shard never run together).
    resumed: tokio::sync::Mutex<HashMap<Shard, i32>>,
    /// Resumes of registrations under way (counted from the moment one has shards due):
    /// while one runs, any shard held may be the one it resumes.
    resumes_running: AtomicUsize,
    /// Shards held here whose last resume failed or left an application out (the
    /// registrations unreadable, a 429 or 5xx as one started): resumed again every retry
    /// period, and until then a call for an application not found here is UNAVAILABLE,
    /// never NOT_FOUND (which a driver takes for its application's end).
    unresumed: Mutex<BTreeSet<Shard>>,
    /// Per shard, once its supervisor has seen its first state, the epoch of the last
    /// taking of it the supervisor has finished acting on (its stale actors let go, its
    /// registrations resumed; `None`: never held since start-up). A shard held at another
    /// epoch is still being taken, and a call for an application not found here meanwhile
    /// is UNAVAILABLE, not NOT_FOUND.
    taken: Mutex<HashMap<Shard, Option<i32>>>,
    /// The keepers of this replica's shard Leases: released by [`Applications::shutdown`],
    /// and stopped with the registry (its Leases then expire).
    keepers: Mutex<Option<ShardKeepers>>,
    /// The last shard drained for another replica or lost to one, and when
    /// ([`Applications::not_here`]).
    handed_over: Mutex<Option<(Shard, std::time::Instant)>>,
}

/// The shard Lease keepers of a service. Released (handed to another replica at once)
/// once the service has stopped its actors; dropped, they stop renewing and release.
pub struct ShardKeepers {
    release: tokio_util::sync::DropGuard,
    keepers: Vec<tokio::task::JoinHandle<()>>,
}

impl ShardKeepers {
    /// The keepers `tasks`, which stop and release when `release` is cancelled.
    pub fn new(
        release: tokio_util::sync::CancellationToken,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    ) -> Self {
        Self {
            release: release.drop_guard(),
            keepers: tasks,
        }
    }

    async fn release(self) {
        let Self { release, keepers } = self;
        drop(release);
        for keeper in keepers {
            let _ = keeper.await;
        }
    }
}

/// A registered application; `actor` is `None` after a Stop whose deletes failed
/// (a retried Stop deletes again; a Start resumes it).
struct Entry {
    namespace: String,
    actor: Option<ActorHandle>,
    /// Where its highest executor id is recorded (Stop deletes a ConfigMap record).
    id_record: IdRecord,
    /// What the first Start asked for, which a repeated Start must repeat.
    first_start: FirstStart,
    /// The actor's number ([`Registry::generations`]).
    generation: u64,
    /// The identity that started it ([`StartApplication::owner`]).
    owner: Option<String>,
    /// Counts it against its namespace's and owner's application caps while registered.
    _tenant: ApplicationSlot,
    /// Its shard, held at the epoch it was started under: every write of it passes this.
    fence: Fence,
}

/// Where a registered application runs and whom it belongs to, for authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub namespace: String,
    pub owner: Option<String>,
}

impl Applications {
    /// A registry using `ctx` and `kubernetes` for every application.
    pub(crate) fn new(ctx: ServiceContext, kubernetes: KubernetesParts) -> Self {
        let KubernetesParts {
            pods,
            registrations,
            watches,
            ownerships,
        } = kubernetes;
        let tenants = Tenants::new(ctx.options.tenants.clone(), ctx.metrics.clone());
        let budgets = Budgets::new(ctx.options.budgets.clone(), ctx.metrics.clone());
        if ctx.options.budgets.follow_quotas {
            watches.follow_quotas(Arc::new(budgets.clone()));
        }
        Self {
            inner: Arc::new(Registry {
                ctx,
                pods,
                registrations,
                watches,
                apps: Mutex::new(HashMap::new()),
                lifecycle: tokio::sync::RwLock::new(()),
                app_locks: Mutex::new(HashMap::new()),
                shutting_down: AtomicBool::new(false),
                generations: AtomicU64::new(0),
                tenants,
                budgets,
                ownerships,
                resumed: tokio::sync::Mutex::new(HashMap::new()),
                resumes_running: AtomicUsize::new(0),
                unresumed: Mutex::new(BTreeSet::new()),
                taken: Mutex::new(HashMap::new()),
                keepers: Mutex::new(None),
                handed_over: Mutex::new(None),
            }),
        }
    }

    /// Keeps `keepers` for as long as the registry lives (the composition root's).
    pub(crate) fn hold_shard_keepers(&self, keepers: ShardKeepers) {
        *lock_registry(&self.inner.keepers) = Some(keepers);
    }

    /// Resumes every application whose registration a previous service kept in its own
    /// namespace: Start as first asked, then its targets and registered executors, so
    /// allocation goes on with no call from the driver. Only registrations the service
    /// wrote are resumed ([`registration::open`]: signed with its key for the very
    /// ConfigMap they are in, so a copy written back after Stop is not; under the name and
    /// labels of the namespace and application they name, in an allowed namespace, within
    /// the pod policy); any other is logged with the reason, counted in
    /// `registrations_refused_total`, and creates nothing. Returns the applications
    /// resumed; one that cannot be resumed is logged (and its registration deleted when
    /// its driver pod is gone or ended). Without the signing key nothing is resumed.
    ///
    /// Only the applications of the shards this replica holds are resumed (after every
    /// shard keeper's first turn); a shard taken later is resumed when it is taken.
    pub async fn resume_registered(&self) -> Result<Vec<AppId>, AppError> {
        let ownerships = &self.inner.ownerships;
        ownerships.settled(self.ownership_wait()).await;
        let owned: Vec<(Shard, i32)> = ownerships
            .map()
            .shards()
            .filter_map(|shard| match ownerships.state(shard) {
                ShardState::Owned(owned) => Some((shard, owned.epoch)),
                _ => None,
            })
            .collect();
        self.resume_shards(&owned).await
    }

    /// Resumes the registrations of `shards` (each held at its epoch) not resumed at that
    /// epoch yet.
    async fn resume_shards(&self, shards: &[(Shard, i32)]) -> Result<Vec<AppId>, AppError> {
        let mut resumed_epochs = self.inner.resumed.lock().await;
        let due: BTreeMap<Shard, i32> = shards
            .iter()
            .copied()
            .filter(|(shard, epoch)| resumed_epochs.get(shard) != Some(epoch))
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let _running = ResumeRunning::new(&self.inner.resumes_running);
        let store = &self.inner.registrations;
        // Unreadable: the shards are resumed again later (`spawn_resume_retries`).
        let unreadable = |err: AppError| {
            lock_registry(&self.inner.unresumed).extend(due.keys().copied());
            err
        };
        let key = store
            .signing_key()
            .await
            .map_err(|err| unreadable(AppError::Unavailable(err.to_string())))?;
        let stored = store.list().await.map_err(|err| unreadable(err.into()))?;
        let ownerships = &self.inner.ownerships;
        let stored: Vec<_> = stored
            .into_iter()
            .filter(|found| {
                found
                    .namespace_label
                    .as_deref()
                    .is_some_and(|ns| due.contains_key(&ownerships.shard_of(ns)))
            })
            .collect();
        resumed_epochs.extend(due.iter().map(|(shard, epoch)| (*shard, *epoch)));
        let mut left_out = BTreeSet::new();
        let allowed = &self.inner.ctx.options.allowed_namespaces;
        let mut resumed = Vec::new();
        for found in stored {
            let checked = registration::open(&found, key, allowed).and_then(|registration| {
                let req = registration.start_request().map_err(Refusal::Invalid)?;
                let placement = Placement {
                    namespace: req.namespace.clone(),
                    driver_pod_name: req.driver_pod_name.clone(),
                };
                let policy = &self.inner.ctx.options.pod_policy;
                if let Some((profile, violation)) =
                    templates::policy_violation(policy, &placement, &req.templates)
                {
                    return Err(Refusal::PodPolicy(format!(
                        "resource profile {profile}: {violation}"
                    )));
                }
                match templates::claim_violation(policy, &req.claims) {
                    Some((index, violation)) => Err(Refusal::PodPolicy(format!(
                        "executor_claim_templates[{index}]: {violation}"
                    ))),
                    None => Ok((registration, req)),
                }
            });
            let (registration, req) = match checked {
                Ok(checked) => checked,
                Err(refusal) => {
                    tracing::warn!(config_map = %found.name, namespace = store.namespace(),
                        app_namespace = found.namespace_label.as_deref(), app = found.app_label.as_deref(),
                        reason = refusal.reason(), why = %refusal,
                        "not resuming a registration; nothing of it is created");
                    self.inner
                        .ctx
                        .metrics
                        .registration_refused(refusal.reason());
                    continue;
                }
            };
            let (app, namespace) = (req.app_id.clone(), req.namespace.clone());
            // One that runs here already (its shard kept through a lapse at the same epoch)
            // is newer than its registration.
            if matches!(self.entry(&app), Some((_, Some(_), _))) {
                continue;
            }
            match self.start_admitted(req, false, Admission::Resumed).await {
                Ok(_) => {}
                Err(AppError::FailedPrecondition(reason)) => {
                    tracing::warn!(%app, %namespace, %reason, "not resuming the application; its registration is deleted");
                    let _ = store.delete(&namespace, app.as_str()).await;
                    continue;
                }
                // The API server or a dependency failed: tried again.
                Err(err @ (AppError::Kubernetes(_) | AppError::Unavailable(_))) => {
                    tracing::warn!(%app, %namespace, error = %err, "cannot resume the application yet; retried");
                    left_out.insert(ownerships.shard_of(&namespace));
                    continue;
                }
                Err(err) => {
                    tracing::warn!(%app, %namespace, error = %err, "cannot resume the application");
                    continue;
                }
            }
            // One application's failure never keeps the others from resuming.
            let targets = registration.targets();
            if !targets.is_empty()
                && let Err(err) = self.set_total_expected(&app, targets).await
            {
                tracing::warn!(%app, %namespace, error = %err, "resumed without its stored targets");
            }
            if let Err(err) = self
                .update_registered(&app, registration.registered())
                .await
            {
                tracing::warn!(%app, %namespace, error = %err, "resumed without its registered executors");
            }
            tracing::info!(%app, %namespace, "application resumed from its registration");
            resumed.push(app);
        }
        // Not resumed at this epoch after all: tried again (`spawn_resume_retries`).
        let mut unresumed = lock_registry(&self.inner.unresumed);
        for shard in due.keys() {
            if left_out.contains(shard) {
                resumed_epochs.remove(shard);
                unresumed.insert(*shard);
            } else {
                unresumed.remove(shard);
            }
        }
        Ok(resumed)
    }

    /// The shards of [`Registry::unresumed`] held here now, with their epochs; those no longer
    /// held are dropped from it.
    fn unresumed(&self) -> Vec<(Shard, i32)> {
        let ownerships = &self.inner.ownerships;
        let mut unresumed = lock_registry(&self.inner.unresumed);
        unresumed.retain(|shard| matches!(ownerships.state(*shard), ShardState::Owned(_)));
        unresumed
            .iter()
            .filter_map(|shard| match ownerships.state(*shard) {
                ShardState::Owned(owned) => Some((*shard, owned.epoch)),
                _ => None,
            })
            .collect()
    }

    /// Resumes, every `retry` period, the shards held here whose last resume failed or left
    /// an application out ([`Registry::unresumed`]), until every application of theirs runs.
    fn spawn_resume_retries(&self, retry: Duration) {
        let registry = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(retry).await;
                let Some(inner) = registry.upgrade() else {
                    return;
                };
                let applications = Applications { inner };
                let due = applications.unresumed();
                if due.is_empty() {
                    continue;
                }
                if let Err(err) = applications.resume_shards(&due).await {
                    tracing::warn!(shards = %crate::allocator::listed(due.iter().map(|(shard, _)| shard)), error = %err, "cannot resume the shards' registrations yet; retried");
                }
            }
        });
    }

    /// How long a call waits for a shard keeper's first turn (at start-up) before it is
    /// answered UNAVAILABLE.
    fn ownership_wait(&self) -> Duration {
        self.inner.ctx.options.ha.timing().renew_deadline
    }

    /// The fence of `namespace`'s applications: UNAVAILABLE, naming the shard and its
    /// holder, when this replica does not own the shard now.
    pub(crate) async fn fence(&self, namespace: &str) -> Result<Fence, AppError> {
        self.inner
            .ownerships
            .fence(
                namespace,
                self.ownership_wait(),
                self.inner.ctx.options.ha.timing().retry,
            )
            .await
            .map_err(|err| AppError::Unavailable(err.to_string()))
    }

    /// Acts on every change of this replica's shards from their first known state on:
    /// a shard taken is resumed from its registrations; a shard another replica holds, or
    /// one taken again at a new epoch (another replica may have acted in between), is let
    /// go first. Runs until the registry is dropped.
    pub(crate) fn spawn_shard_supervisor(&self) {
        self.spawn_resume_retries(self.inner.ctx.options.ha.timing().retry);
        for (shard, mut changes) in self.inner.ownerships.receivers() {
            let registry = Arc::downgrade(&self.inner);
            tokio::spawn(async move {
                // The first state is start-up's: `resume_registered` resumes it.
                if changes
                    .wait_for(|state| *state != ShardState::Unknown)
                    .await
                    .is_err()
                {
                    return;
                }
                let first = changes.borrow_and_update().clone();
                if let Some(inner) = registry.upgrade() {
                    let applications = Applications { inner };
                    applications.count_owned_shards();
                    applications.taken(shard, &first);
                }
                while changes.changed().await.is_ok() {
                    let state = changes.borrow_and_update().clone();
                    let Some(inner) = registry.upgrade() else {
                        return;
                    };
                    let applications = Applications { inner };
                    applications.count_owned_shards();
                    match state {
                        ShardState::Owned(owned) => {
                            applications.inner.ctx.metrics.shard_acquired();
                            applications.let_go(shard, Some(owned.epoch)).await;
                            if let Err(err) =
                                applications.resume_shards(&[(shard, owned.epoch)]).await
                            {
                                tracing::warn!(%shard, error = %err, "cannot resume the shard's registrations");
                                applications.inner.resumed.lock().await.remove(&shard);
                            }
                            applications.taken(shard, &state);
                        }
                        // Handed to another replica: the actors stop while the fences
                        // still pass (each writes its registration's last change), then
                        // the keeper releases the Lease.
                        ShardState::Draining(owned) => {
                            applications.drain(shard).await;
                            *lock_registry(&applications.inner.handed_over) =
                                Some((shard, std::time::Instant::now()));
                            applications.inner.ctx.metrics.shard_released();
                            applications.inner.ownerships.drained(shard, owned.epoch);
                        }
                        // Another replica holds it: it resumes the applications.
                        ShardState::NotOwned {
                            holder: Some(_), ..
                        } => applications.let_go(shard, None).await,
                        // Lapsed, or the Lease cannot be read: the actors stay, their writes
                        // refused by their fences, and go on if the shard is renewed at the
                        // same epoch (no one else held it in between); they are let go as
                        // soon as another holder is seen.
                        _ => {}
                    }
                }
            });
        }
    }

    /// Notes that the supervisor has acted on `state` of `shard`, its first or one it
    /// took (a later epoch held is a taking not acted on yet: [`Self::resuming`]).
    fn taken(&self, shard: Shard, state: &ShardState) {
        let mut taken = lock_registry(&self.inner.taken);
        match state {
            ShardState::Owned(owned) => {
                taken.insert(shard, Some(owned.epoch));
            }
            _ => {
                taken.entry(shard).or_insert(None);
            }
        }
    }

    fn count_owned_shards(&self) {
        let ownerships = &self.inner.ownerships;
        let owned = ownerships
            .map()
            .shards()
            .filter(|shard| {
                matches!(
                    ownerships.state(*shard),
                    ShardState::Owned(_) | ShardState::Draining(_)
                )
            })
            .count();
        self.inner.ctx.metrics.set_shards_owned(owned);
    }

    /// Stops the actors of `shard`'s applications that run under another epoch than
    /// `keep` (all of them when `None`) WITHOUT deleting anything: the shard's new owner
    /// resumes them from their registrations.
    async fn let_go(&self, shard: Shard, keep: Option<i32>) {
        let _shared = self.inner.lifecycle.read().await;
        let stale = self.take_entries(shard, keep);
        if keep.is_none() {
            self.inner.resumed.lock().await.remove(&shard);
            lock_registry(&self.inner.unresumed).remove(&shard);
            // Lost to another holder: a replica forwarding from an older view of the
            // Lease may still ask here for a while; it is told to retry, not NOT_FOUND.
            if !stale.is_empty() {
                *lock_registry(&self.inner.handed_over) = Some((shard, std::time::Instant::now()));
            }
        }
        Self::stop_actors(shard, stale).await;
    }

    /// Lets go of `shard`'s applications to hand the shard to another replica. A resume
    /// of it under way ends first (its Starts, finding the shard draining, fail), then,
    /// exclusively, a Start or Stop under way (a Stop's deletes never race the new
    /// owner's resume); none starts during the sweep, and one after it finds the shard
    /// draining and answers UNAVAILABLE. The locks are taken in the order a resume takes
    /// them (its registry of resumed shards, then the lifecycle).
    async fn drain(&self, shard: Shard) {
        let mut resumed = self.inner.resumed.lock().await;
        let _exclusive = self.inner.lifecycle.write().await;
        resumed.remove(&shard);
        lock_registry(&self.inner.unresumed).remove(&shard);
        drop(resumed);
        let stale = self.take_entries(shard, None);
        Self::stop_actors(shard, stale).await;
    }

    async fn stop_actors(shard: Shard, stale: Vec<(AppId, Entry)>) {
        for (app, entry) in stale {
            if let Some(actor) = entry.actor {
                actor.stop_moving().await;
            }
            tracing::info!(%app, namespace = %entry.namespace, %shard,
                "application let go: this replica no longer owns its shard");
        }
    }

    /// Removes the entries of `shard`'s applications under another epoch than `keep`.
    fn take_entries(&self, shard: Shard, keep: Option<i32>) -> Vec<(AppId, Entry)> {
        {
            let mut apps = self.apps();
            let ids: Vec<AppId> = apps
                .iter()
                .filter(|(_, e)| e.fence.shard() == shard && Some(e.fence.epoch()) != keep)
                .map(|(id, _)| id.clone())
                .collect();
            let taken = ids
                .into_iter()
                .filter_map(|id| apps.remove(&id).map(|entry| (id, entry)))
                .collect();
            self.inner.ctx.metrics.set_active_applications(apps.len());
            taken
        }
    }

    /// Sets targets per profile (profiles left out keep theirs).
    pub async fn set_total_expected(
        &self,
        app: &AppId,
        targets: BTreeMap<ResourceProfileId, u32>,
    ) -> Result<(), AppError> {
        self.set_total_expected_with_templates(app, BTreeMap::new(), targets)
            .await
    }

    /// Registers the templates of resource profiles added after Start (parsed and held to
    /// the pod policy at the edge, as Start's), then sets targets per profile; all or
    /// nothing. A profile's template given again must be the one it has
    /// (FailedPrecondition naming `resource_profile_templates[N]`).
    pub async fn set_total_expected_with_templates(
        &self,
        app: &AppId,
        templates: BTreeMap<ResourceProfileId, Pod>,
        targets: BTreeMap<ResourceProfileId, u32>,
    ) -> Result<(), AppError> {
        self.actor(app)?.set_targets(templates, targets).await
    }

    /// IsDeleted for one executor.
    pub async fn is_deleted(&self, app: &AppId, id: ExecutorId) -> Result<bool, AppError> {
        self.actor(app)?.is_deleted(id).await
    }

    /// Replaces the scheduler-known executors.
    pub async fn update_registered(
        &self,
        app: &AppId,
        ids: BTreeSet<ExecutorId>,
    ) -> Result<(), AppError> {
        self.actor(app)?.update_registered(ids).await
    }

    /// Deletes every executor pod of the application, then its registration and its id
    /// record's ConfigMap, and forgets it; returns the pods this delete deleted (not those
    /// already terminating).
    pub async fn stop(&self, app: &AppId) -> Result<u32, AppError> {
        self.check_running()?;
        let _shared = self.inner.lifecycle.read().await;
        let _serial = self.lock_app(app).await;
        let Some((namespace, actor, id_record)) = self.entry(app) else {
            return Err(self.not_here(app));
        };
        let delete_claims = self
            .apps()
            .get(app)
            .is_some_and(|e| e.first_start.stop_deletes_claims());
        let fence = self.fence(&namespace).await?;
        if let Some(actor) = actor {
            // The actor ends first, so no create of it can follow the delete.
            actor.stop().await;
        }
        let pods = (self.inner.pods)
            .for_application(&namespace, app.as_str())
            .fenced(fence.clone());
        let deleted = async {
            // The executor pods' uids, before they go: the application's claims are those
            // owned by one of them.
            let owners: BTreeSet<String> = if delete_claims {
                (pods
                    .list_executors(&namespace, app.as_str())
                    .await?
                    .into_iter())
                .filter_map(|pod| pod.metadata.uid)
                .collect()
            } else {
                BTreeSet::new()
            };
            let deleted = pods.delete_all(&namespace, app.as_str()).await?;
            // Claims the driver does not own go with the application, as Spark's clean-up
            // deletes them (a driver-owned one goes with the driver pod).
            if delete_claims {
                let claims = pods
                    .delete_claims(&namespace, app.as_str(), &owners)
                    .await?;
                tracing::info!(%app, claims, "executor claims deleted");
            }
            Ok::<u32, kube::Error>(deleted)
        }
        .await;
        let deleted = match deleted {
            // The records go only once no pod holds an id.
            Ok(deleted) => match (self.inner.registrations)
                .fenced(fence)
                .delete(&namespace, app.as_str())
                .await
            {
                Ok(()) => id_record
                    .delete(pods.api(), &namespace)
                    .await
                    .map(|()| deleted),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        match deleted {
            Ok(deleted) => {
                self.inner
                    .ctx
                    .metrics
                    .pods_deleted(DeleteReason::Stop, u64::from(deleted));
                {
                    let mut apps = self.apps();
                    apps.remove(app);
                    self.inner.ctx.metrics.set_active_applications(apps.len());
                }
                tracing::info!(%app, %namespace, deleted, "application stopped");
                Ok(deleted)
            }
            Err(err) => {
                // Keep it registered without an actor: a retried Stop deletes again.
                if let Some(entry) = self.apps().get_mut(app) {
                    entry.actor = None;
                }
                Err(AppError::Kubernetes(err))
            }
        }
    }

    /// The application's allocation state.
    pub async fn status(&self, app: &AppId) -> Result<AllocatorStatus, AppError> {
        Ok(self.report(app).await?.status)
    }

    /// What GetStatus reports: the allocation state plus the driver pod's life.
    pub async fn application_status(&self, app: &AppId) -> Result<ApplicationStatus, AppError> {
        let report = self.report(app).await?;
        Ok(ApplicationStatus {
            allocation: report.status,
            driver: report.driver,
            create_failures: report.create_failures,
            backoff_until: report.backoff_until,
            failed_executors: report.failed_executors,
            held_by: report.held_by,
        })
    }

    /// How many allocation rounds the application's actor has run (observability, tests).
    pub async fn rounds(&self, app: &AppId) -> Result<u64, AppError> {
        Ok(self.report(app).await?.rounds)
    }

    /// When the application's next round may run (the batch delay's schedule, or later
    /// while backing off after rounds whose creates all failed or for a Retry-After).
    pub async fn next_round_at(&self, app: &AppId) -> Result<Timestamp, AppError> {
        Ok(self.report(app).await?.next_round_at)
    }

    /// A stream of the application's executor pod changes after `since` (a sequence of an
    /// earlier event), or starting with the full current state (0, or when those changes
    /// are no longer kept); it ends when the application's actor ends. It counts against
    /// `identity`'s streams (none: `auth.mode = none`) and the service's while it is open:
    /// RESOURCE_EXHAUSTED naming `tenants.max_watch_streams_per_identity` or
    /// `tenants.max_watch_streams` beyond them.
    pub async fn watch_executors(
        &self,
        app: &AppId,
        since: u64,
        identity: Option<&str>,
    ) -> Result<ExecutorEvents, AppError> {
        let actor = self.actor(app)?;
        let slot = self.inner.tenants.admit_stream(identity)?;
        Ok(actor.watch_executors(since).await?.holding(slot))
    }

    /// The budgets' ledger: what each budget holds, and where a reload puts new budgets.
    pub fn budgets(&self) -> &Budgets {
        &self.inner.budgets
    }

    /// The per-tenant limits and what they count now.
    pub fn tenants(&self) -> &Tenants {
        &self.inner.tenants
    }

    /// The application's current snapshot as its actor has ingested it (observability, tests).
    pub async fn snapshot(&self, app: &AppId) -> Result<ExecutorPodsSnapshot, AppError> {
        self.actor(app)?.snapshot().await
    }

    /// What a template may ask for, where the application's pods go (`pod_policy`).
    pub fn pod_policy(&self) -> &crate::allocator::pod_policy::PodPolicy {
        &self.inner.ctx.options.pod_policy
    }

    /// True once the API server has answered and every shared watch that runs now has
    /// completed its first listing (with no application yet: once the API server answered).
    /// What health waits for at start, reported here for observability and tests (health
    /// itself waits on the readiness handles the probe and the watches release).
    pub fn is_synced(&self) -> bool {
        self.inner.watches.is_synced()
            && self
                .watched_namespaces()
                .iter()
                .all(|namespace| self.is_namespace_synced(namespace))
    }

    /// True once the shared watch of `namespace` runs and has completed its first listing.
    pub fn is_namespace_synced(&self, namespace: &str) -> bool {
        self.inner.watches.is_namespace_synced(namespace)
    }

    /// Namespaces whose shared executor pod watch is running.
    pub fn watched_namespaces(&self) -> Vec<String> {
        self.inner.watches.watched_namespaces()
    }

    /// Stops every actor WITHOUT deleting pods (a restarted service resumes them), then
    /// releases the shards' Leases so another replica takes them at once; later calls
    /// answer [`AppError::ShuttingDown`].
    pub async fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::SeqCst);
        let _exclusive = self.inner.lifecycle.write().await;
        let entries: Vec<(AppId, Entry)> = self.apps().drain().collect();
        self.inner.ctx.metrics.set_active_applications(0);
        for (app, entry) in entries {
            if let Some(actor) = entry.actor {
                actor.stop_moving().await;
            }
            tracing::info!(%app, "application left running for a later resume");
        }
        let keepers = lock_registry(&self.inner.keepers).take();
        if let Some(keepers) = keepers {
            keepers.release().await;
        }
    }

    async fn report(&self, app: &AppId) -> Result<ActorReport, AppError> {
        self.actor(app)?.report().await
    }

    /// Whether the service is shutting down (its actors stopped, no call taken).
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    fn check_running(&self) -> Result<(), AppError> {
        if self.is_shutting_down() {
            Err(AppError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    fn actor(&self, app: &AppId) -> Result<ActorHandle, AppError> {
        self.check_running()?;
        match self.entry(app) {
            Some((_, Some(actor), _)) => Ok(actor),
            _ => Err(self.not_here(app)),
        }
    }

    /// What a call for `app`, which does not run here, answers: NOT_FOUND, unless a shard
    /// is changing hands through this replica (it is resuming one just taken, draining
    /// one, or handed one over less than a lease ago, which the replica forwarding to it
    /// may not have seen yet) or has no holder it knows of: then UNAVAILABLE, retried,
    /// since the application may be that shard's and will answer from its owner in a
    /// moment.
    pub fn not_here(&self, app: &AppId) -> AppError {
        let lease = self.inner.ctx.options.ha.timing().lease;
        let handed_over = lock_registry(&self.inner.handed_over)
            .filter(|(_, at)| at.elapsed() < lease)
            .map(|(shard, _)| shard);
        let draining =
            self.inner.ownerships.map().shards().find(|shard| {
                matches!(self.inner.ownerships.state(*shard), ShardState::Draining(_))
            });
        // A shard whose holder this replica does not know (its own ownership lapsed, the
        // Lease unreadable or released, its keeper not through a first turn): its
        // applications may be anywhere, or about to be here.
        let unsettled = self.inner.ownerships.map().shards().find(|shard| {
            matches!(
                self.inner.ownerships.state(*shard),
                ShardState::Unknown | ShardState::NotOwned { holder: None, .. }
            )
        });
        match (self.resuming(), draining.or(handed_over).or(unsettled)) {
            (Some(shard), _) => AppError::Unavailable(format!(
                "this replica has just taken shard {shard} (its Lease {}) and is resuming \
                 its applications",
                shard.lease_name()
            )),
            (None, Some(shard)) => AppError::Unavailable(format!(
                "shard {shard} (its Lease {}) is changing hands; its applications answer \
                 from their owner in a moment",
                shard.lease_name()
            )),
            (None, None) => AppError::NotFound(app.to_string()),
        }
    }

    /// A shard this replica holds while a resume of registrations runs (its applications
    /// are unknown here for a moment): a call for an application not found is then
    /// UNAVAILABLE, retried, not NOT_FOUND.
    fn resuming(&self) -> Option<Shard> {
        if let Some((shard, _)) = self.unresumed().first() {
            return Some(*shard);
        }
        let ownerships = &self.inner.ownerships;
        let owned = ownerships
            .map()
            .shards()
            .filter_map(|shard| match ownerships.state(shard) {
                ShardState::Owned(owned) => Some((shard, owned.epoch)),
                _ => None,
            });
        // While a resume runs, any shard held may be the one it resumes. (Not the lock on
        // the resumed shards: calls testing it would see each other hold it.)
        if self.inner.resumes_running.load(Ordering::SeqCst) > 0 {
            return owned.map(|(shard, _)| shard).next();
        }
        // Taken at an epoch the supervisor has not finished acting on (it may still be
        // letting the stale actors go, waiting for its turn to resume).
        let taken = lock_registry(&self.inner.taken);
        owned
            .filter(|(shard, epoch)| taken.get(shard).is_some_and(|t| *t != Some(*epoch)))
            .map(|(shard, _)| shard)
            .next()
    }

    /// The shards this replica holds, as its keepers publish them.
    pub fn ownerships(&self) -> &Ownerships {
        &self.inner.ownerships
    }

    /// The namespace and owner of a registered application (`None`: no such application).
    pub fn ownership(&self, app: &AppId) -> Option<Ownership> {
        self.apps().get(app).map(|e| Ownership {
            namespace: e.namespace.clone(),
            owner: e.owner.clone(),
        })
    }

    fn entry(&self, app: &AppId) -> Option<(String, Option<ActorHandle>, IdRecord)> {
        self.apps()
            .get(app)
            .map(|e| (e.namespace.clone(), e.actor.clone(), e.id_record.clone()))
    }

    /// Holds `app`'s Start/Stop lock (see [`Registry::app_locks`]) until the guard drops.
    async fn lock_app(&self, app: &AppId) -> AppLock {
        let mutex = {
            let mut locks = lock_registry(&self.inner.app_locks);
            Arc::clone(locks.entry(app.clone()).or_default())
        };
        let guard = Arc::clone(&mutex).lock_owned().await;
        AppLock {
            registry: Arc::clone(&self.inner),
            app: app.clone(),
            guard: Some(guard),
        }
    }

    fn apps(&self) -> MutexGuard<'_, HashMap<AppId, Entry>> {
        match self.inner.apps.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// A resume of registrations counted as running ([`Registry::resumes_running`]) while it lives.
struct ResumeRunning<'a>(&'a AtomicUsize);

impl<'a> ResumeRunning<'a> {
    fn new(running: &'a AtomicUsize) -> Self {
        running.fetch_add(1, Ordering::SeqCst);
        Self(running)
    }
}

impl Drop for ResumeRunning<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One application's Start/Stop lock, held; its entry is removed with its last holder.
struct AppLock {
    registry: Arc<Registry>,
    app: AppId,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for AppLock {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = lock_registry(&self.registry.app_locks);
        // Only the map holds it: no one else waits for or holds it.
        if locks
            .get(&self.app)
            .is_some_and(|mutex| Arc::strong_count(mutex) == 1)
        {
            locks.remove(&self.app);
        }
    }
}

fn lock_registry<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_id_is_a_label_value() {
        for ok in ["a", "spark-1234", "App_1.x", &"a".repeat(63)] {
            assert!(AppId::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "é", "a/b", &"a".repeat(64), ".a"] {
            assert!(AppId::parse(bad).is_err(), "{bad}");
        }
        assert!(AppId::parse("").unwrap_err().contains("empty"));
        assert!(AppId::parse(&"a".repeat(64)).unwrap_err().contains("63"));
    }
}
