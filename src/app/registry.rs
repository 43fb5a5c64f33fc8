//! The registry of running applications: it looks applications up and passes each call
//! to its actor. Start (`start`), Stop (`stop`) and what a shard's move does to its
//! applications (`shard_moves`) act on it.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::actor::{ActorHandle, ActorReport};
use super::budgets::Budgets;
use super::error::AppError;
use super::feed::ExecutorEvents;
use super::first_start::FirstStart;
use super::options::{KubernetesParts, ServiceContext};
use super::shards::{ShardKeepers, ShardSupervisor, lock_registry};
use super::tenants::{ApplicationSlot, Tenants};
use super::types::{AppId, ApplicationStatus, Ownership, Placement};
use crate::allocator::{
    AllocatorStatus, ExecutorId, ExecutorPodsSnapshot, ResourceProfileId, Timestamp,
};
use crate::ha::{Fence, Ownerships};
use crate::k8s::{ExecutorPodClient, IdRecord, PodWatches, RegistrationStore};

/// The registry of running applications.
#[derive(Clone)]
pub struct Applications {
    pub(super) inner: Arc<Registry>,
}

pub(super) struct Registry {
    pub(super) ctx: ServiceContext,
    pub(super) pods: ExecutorPodClient,
    /// The registrations, in the service's namespace.
    pub(super) registrations: RegistrationStore,
    pub(super) watches: PodWatches,
    pub(super) apps: Mutex<HashMap<AppId, Entry>>,
    /// Start and Stop hold it shared (they run concurrently), shutdown exclusively (it
    /// waits for those under way, and none starts after it).
    pub(super) lifecycle: tokio::sync::RwLock<()>,
    /// Serialises Start and Stop of one application id (never started twice concurrently);
    /// different applications' run side by side. An entry lives while someone holds it.
    pub(super) app_locks: Mutex<HashMap<AppId, Arc<tokio::sync::Mutex<()>>>>,
    pub(super) shutting_down: AtomicBool,
    /// Numbers the actors, so a forgotten application's entry is removed only if it is
    /// still that actor's.
    pub(super) generations: AtomicU64,
    /// Applications per identity and namespace, streams per identity (`tenants`).
    pub(super) tenants: Tenants,
    /// The budgets' ledger: every application's claim on the budgets it falls under.
    pub(super) budgets: Budgets,
    /// The shards this replica holds and what it has made of each.
    pub(super) shards: ShardSupervisor,
}

/// A registered application; `actor` is `None` after a Stop whose deletes failed
/// (a retried Stop deletes again; a Start resumes it).
pub(super) struct Entry {
    pub(super) namespace: String,
    pub(super) actor: Option<ActorHandle>,
    /// Where its highest executor id is recorded (Stop deletes a ConfigMap record).
    pub(super) id_record: IdRecord,
    /// What the first Start asked for, which a repeated Start must repeat.
    pub(super) first_start: FirstStart,
    /// The actor's number ([`Registry::generations`]).
    pub(super) generation: u64,
    /// The identity that started it ([`super::StartApplication::owner`]).
    pub(super) owner: Option<String>,
    /// Counts it against its namespace's and owner's application caps while registered.
    pub(super) _tenant: ApplicationSlot,
    /// Its shard, held at the epoch it was started under: every write of it passes this.
    pub(super) fence: Fence,
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
        let tenants = Tenants::new(ctx.tenants.clone(), ctx.metrics.clone());
        let budgets = Budgets::new(ctx.budgets.clone(), ctx.metrics.clone());
        if ctx.budgets.follow_quotas {
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
                shards: ShardSupervisor::new(ownerships),
            }),
        }
    }

    /// Keeps `keepers` for as long as the registry lives (the composition root's).
    pub(crate) fn hold_shard_keepers(&self, keepers: ShardKeepers) {
        self.inner.shards.hold_keepers(keepers);
    }

    /// How long a call waits for a shard keeper's first turn (at start-up) before it is
    /// answered UNAVAILABLE.
    pub(super) fn ownership_wait(&self) -> Duration {
        self.inner.ctx.ha.timing().renew_deadline
    }

    /// The fence of `namespace`'s applications: UNAVAILABLE, naming the shard and its
    /// holder, when this replica does not own the shard now.
    pub(crate) async fn fence(&self, namespace: &str) -> Result<Fence, AppError> {
        (self.inner.shards.ownerships)
            .fence(
                namespace,
                self.ownership_wait(),
                self.inner.ctx.ha.timing().retry,
            )
            .await
            .map_err(|err| AppError::Unavailable(err.to_string()))
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

    /// [`Self::update_registered`] with the tasks running on each registered executor
    /// (a budget's reclaim asks back those with the fewest first).
    pub async fn update_registered_with_tasks(
        &self,
        app: &AppId,
        ids: BTreeSet<ExecutorId>,
        running_tasks: BTreeMap<ExecutorId, u32>,
    ) -> Result<(), AppError> {
        (self.actor(app)?)
            .update_registered_with_tasks(ids, running_tasks)
            .await
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
        &self.inner.ctx.pod_policy
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
        self.inner.shards.release_keepers().await;
    }

    async fn report(&self, app: &AppId) -> Result<ActorReport, AppError> {
        self.actor(app)?.report().await
    }

    /// Whether the service is shutting down (its actors stopped, no call taken).
    pub fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::SeqCst)
    }

    pub(super) fn check_running(&self) -> Result<(), AppError> {
        if self.is_shutting_down() {
            Err(AppError::ShuttingDown)
        } else {
            Ok(())
        }
    }

    pub(super) fn actor(&self, app: &AppId) -> Result<ActorHandle, AppError> {
        self.check_running()?;
        match self.entry(app) {
            Some((_, Some(actor), _)) => Ok(actor),
            _ => Err(self.not_here(app)),
        }
    }

    /// What a call for `app`, which does not run here, answers: NOT_FOUND, unless a shard
    /// is changing hands through this replica (see [`ShardSupervisor::not_here`]).
    pub fn not_here(&self, app: &AppId) -> AppError {
        let lease = self.inner.ctx.ha.timing().lease;
        self.inner.shards.not_here(app, lease)
    }

    /// Where a running application's pods go (its namespace and driver pod), which the
    /// template policy checks templates against; what a call for it answers when it does
    /// not run here ([`Applications::not_here`]).
    pub fn placement(&self, app: &AppId) -> Result<Placement, AppError> {
        self.check_running()?;
        let apps = self.apps();
        let Some(entry) = apps.get(app).filter(|e| e.actor.is_some()) else {
            drop(apps);
            return Err(self.not_here(app));
        };
        Ok(Placement {
            namespace: entry.namespace.clone(),
            driver_pod_name: entry.first_start.driver_pod_name().map(str::to_string),
        })
    }

    /// The shards this replica holds, as its keepers publish them.
    pub fn ownerships(&self) -> &Ownerships {
        &self.inner.shards.ownerships
    }

    /// The namespace and owner of a registered application (`None`: no such application).
    pub fn ownership(&self, app: &AppId) -> Option<Ownership> {
        self.apps().get(app).map(|e| Ownership {
            namespace: e.namespace.clone(),
            owner: e.owner.clone(),
        })
    }

    pub(super) fn entry(&self, app: &AppId) -> Option<(String, Option<ActorHandle>, IdRecord)> {
        self.apps()
            .get(app)
            .map(|e| (e.namespace.clone(), e.actor.clone(), e.id_record.clone()))
    }

    /// Holds `app`'s Start/Stop lock (see [`Registry::app_locks`]) until the guard drops.
    pub(super) async fn lock_app(&self, app: &AppId) -> AppLock {
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

    pub(super) fn apps(&self) -> MutexGuard<'_, HashMap<AppId, Entry>> {
        match self.inner.apps.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// One application's Start/Stop lock, held; its entry is removed with its last holder.
pub(super) struct AppLock {
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
