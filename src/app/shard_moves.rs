//! What a move of a shard does to its applications: a shard taken is resumed from its
//! registrations, one drained or lost lets its applications go (their actors stopped,
//! nothing deleted). [`ShardSupervisor`](super::shards::ShardSupervisor) decides the move;
//! this acts on it.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::error::AppError;
use super::registration::{self, Refusal};
use super::registry::{Applications, Entry};
use super::shards::{Move, ShardPhase, lock_registry};
use super::templates;
use super::tenants::Admission;
use super::types::{AppId, Placement};
use crate::ha::{ShardState, shards::Shard};

impl Applications {
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
        let shards = &self.inner.shards;
        shards.ownerships.settled(self.ownership_wait()).await;
        let owned: Vec<(Shard, i32)> = shards.owned().collect();
        self.resume_shards(&owned).await
    }

    /// Resumes the registrations of `shards` (each held at its epoch) not resumed at that
    /// epoch yet.
    async fn resume_shards(&self, shards: &[(Shard, i32)]) -> Result<Vec<AppId>, AppError> {
        let mut resumed_epochs = self.inner.shards.resumed.lock().await;
        let due: BTreeMap<Shard, i32> = shards
            .iter()
            .copied()
            .filter(|(shard, epoch)| resumed_epochs.get(shard) != Some(epoch))
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let _running = self.inner.shards.resume_running();
        // Every application of the shards joins its budgets before any is given room.
        let _joining = self.inner.budgets.resuming();
        let store = &self.inner.registrations;
        // Unreadable: the shards are resumed again later (`spawn_resume_retries`).
        let unreadable = |err: AppError| {
            lock_registry(&self.inner.shards.unresumed).extend(due.keys().copied());
            err
        };
        let key = store
            .signing_key()
            .await
            .map_err(|err| unreadable(AppError::Unavailable(err.to_string())))?;
        let stored = store.list().await.map_err(|err| unreadable(err.into()))?;
        let ownerships = &self.inner.shards.ownerships;
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
        let app = &self.inner.ctx.app;
        let mut resumed = Vec::new();
        for found in stored {
            let checked = registration::open(&found, key, app).and_then(|registration| {
                let req = registration.start_request().map_err(Refusal::Invalid)?;
                let placement = Placement {
                    namespace: req.namespace.clone(),
                    driver_pod_name: req.driver_pod_name.clone(),
                };
                let policy = &self.inner.ctx.pod_policy;
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
        let mut unresumed = lock_registry(&self.inner.shards.unresumed);
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

    /// Resumes, every `retry` period, the shards held here whose last resume failed or left
    /// an application out (`ShardSupervisor::unresumed`), until every application of theirs runs.
    fn spawn_resume_retries(&self, retry: Duration) {
        let registry = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(retry).await;
                let Some(inner) = registry.upgrade() else {
                    return;
                };
                let applications = Applications { inner };
                let due = applications.inner.shards.unresumed();
                if due.is_empty() {
                    continue;
                }
                if let Err(err) = applications.resume_shards(&due).await {
                    tracing::warn!(shards = %crate::allocator::listed(due.iter().map(|(shard, _)| shard)), error = %err, "cannot resume the shards' registrations yet; retried");
                }
            }
        });
    }

    /// Acts on every change of this replica's shards from their first known state on:
    /// a shard taken is resumed from its registrations; a shard another replica holds, or
    /// one taken again at a new epoch (another replica may have acted in between), is let
    /// go first. Runs until the registry is dropped.
    pub(crate) fn spawn_shard_supervisor(&self) {
        self.spawn_resume_retries(self.inner.ctx.ha.timing().retry);
        for (shard, mut changes) in self.inner.shards.ownerships.receivers() {
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
                    applications.inner.shards.first_seen(shard, &first);
                }
                while changes.changed().await.is_ok() {
                    let state = changes.borrow_and_update().clone();
                    let Some(inner) = registry.upgrade() else {
                        return;
                    };
                    let applications = Applications { inner };
                    applications.count_owned_shards();
                    applications.make(shard, Move::of(&state)).await;
                }
            });
        }
    }

    /// Acts on one move of `shard`, through the phases it passes.
    async fn make(&self, shard: Shard, next: Move) {
        let shards = &self.inner.shards;
        match next {
            Move::Take { epoch } => {
                self.inner.ctx.metrics.shard_acquired();
                shards.enter(shard, |taken| ShardPhase::Taking { epoch, taken });
                self.let_go(shard, Some(epoch)).await;
                if let Err(err) = self.resume_shards(&[(shard, epoch)]).await {
                    tracing::warn!(%shard, error = %err, "cannot resume the shard's registrations");
                    shards.resumed.lock().await.remove(&shard);
                }
                shards.enter(shard, |_| ShardPhase::Owned { epoch });
            }
            Move::Drain { epoch } => {
                shards.enter(shard, |taken| ShardPhase::Draining { taken });
                self.drain(shard).await;
                shards.handed_over(shard);
                self.inner.ctx.metrics.shard_released();
                shards.ownerships.drained(shard, epoch);
            }
            Move::LetGo => {
                shards.enter(shard, |taken| ShardPhase::Lost { taken });
                self.let_go(shard, None).await;
            }
            Move::Keep => {}
        }
    }

    fn count_owned_shards(&self) {
        let ownerships = &self.inner.shards.ownerships;
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
            self.inner.shards.resumed.lock().await.remove(&shard);
            lock_registry(&self.inner.shards.unresumed).remove(&shard);
            // Lost to another holder: a replica forwarding from an older view of the
            // Lease may still ask here for a while; it is told to retry, not NOT_FOUND.
            if !stale.is_empty() {
                self.inner.shards.handed_over(shard);
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
        let mut resumed = self.inner.shards.resumed.lock().await;
        let _exclusive = self.inner.lifecycle.write().await;
        resumed.remove(&shard);
        lock_registry(&self.inner.shards.unresumed).remove(&shard);
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
}
