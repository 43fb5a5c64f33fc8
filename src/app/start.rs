//! Start: registering an application (or resuming one) and spawning its actor.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;

use super::actor::{
    self, ActorHandle, ActorParts, ApplicationParts, DriverLife, Engine, Kubernetes,
};
use super::error::AppError;
use super::feed::Feed;
use super::first_start::FirstStart;
use super::registration::Registration;
use super::registry::{Applications, Entry};
use super::templates;
use super::tenants::{Admission, ApplicationSlot};
use super::types::{AppId, StartApplication, Started};
use crate::allocator::{
    Allocator, ClaimRules, DriverOwner, ExecutorClaims, ExecutorPodBuilder, IdBlocks,
    SnapshotStore, executor_pod_from,
};
use crate::ha::Fence;
use crate::k8s::IdRecord;
use crate::k8s::executor_pods::highest_executor_id;
use crate::k8s::placement;
#[cfg(doc)]
use crate::k8s::watch::FOLLOWED_DRIVER_LABEL;

impl Applications {
    /// Starts (or resumes) an application. A repeated Start of a running application is
    /// answered `resumed` when it repeats the first one: same namespace (else
    /// AlreadyExists), driver pod, prefix and effective settings, and for every profile it
    /// gives a template of, the template the application has (else FailedPrecondition
    /// naming the field); profiles the application does not have yet are registered.
    pub async fn start(&self, req: StartApplication) -> Result<Started, AppError> {
        self.start_by(req, false).await
    }

    /// As [`Self::start`], checking ownership under the lifecycle lock: an application
    /// another identity started is PermissionDenied, unless `may_act_on_any` (an admin, or
    /// a service that authenticates nobody); it keeps its first owner either way. A new
    /// application beyond its owner's or namespace's cap is RESOURCE_EXHAUSTED naming
    /// `tenants.max_applications_per_identity` or `tenants.max_applications_per_namespace`.
    pub async fn start_by(
        &self,
        req: StartApplication,
        may_act_on_any: bool,
    ) -> Result<Started, AppError> {
        self.start_admitted(req, may_act_on_any, Admission::Enforced)
            .await
    }

    /// [`Self::start_by`], the application counted against the tenant caps as `admission`
    /// says (a registration resumed at start-up is counted, never refused).
    pub(super) async fn start_admitted(
        &self,
        req: StartApplication,
        may_act_on_any: bool,
        admission: Admission,
    ) -> Result<Started, AppError> {
        Start { applications: self }
            .run(req, may_act_on_any, admission)
            .await
    }
}

/// The Start procedure, as named steps over the registry it registers the application in
/// (whose lookups it reaches through `Deref`).
struct Start<'a> {
    applications: &'a Applications,
}

impl std::ops::Deref for Start<'_> {
    type Target = Applications;

    fn deref(&self) -> &Applications {
        self.applications
    }
}

impl Start<'_> {
    /// Checks, finds the application in the cluster, spawns its actor and registers it.
    async fn run(
        &self,
        mut req: StartApplication,
        may_act_on_any: bool,
        admission: Admission,
    ) -> Result<Started, AppError> {
        self.check_running()?;
        let _shared = self.inner.lifecycle.read().await;
        let _serial = self.lock_app(&req.app_id).await;
        self.check_running()?;
        self.check_owner(&mut req, may_act_on_any)?;
        // Whoever calls: the edge checks them too, but before it parses templates, and a
        // caller of this library has no edge.
        req.settings.validate()?;
        // Templates are checked even when the application already runs: a repeated Start
        // with a template that could never make a pod is refused, not answered `resumed`.
        let builder = self.pod_builder(&req)?;
        // Only the owner of the namespace's shard acts on its applications.
        let fence = self.fence(&req.namespace).await?;
        if let Some(actor) = self.running(&req)? {
            return self.start_again(&req, &actor).await;
        }
        self.check_namespace(&req.namespace)?;
        // Counted before any request to Kubernetes; given back if the Start fails.
        let slot = self.application_slot(&req, admission)?;
        self.check_namespace_exists(&req.namespace).await?;
        let driver = self.driver(&req).await?;
        if let Some(driver) = &driver {
            (self.inner.budgets)
                .check_queue_label(&req.namespace, &driver.labels)
                .map_err(AppError::PermissionDenied)?;
        }
        let builder = builder.with_driver(driver.as_ref().and_then(|d| d.owner.clone()));
        // Labelled before the subscription: every listing sent to the application is then
        // answered after the label is on, so none reports a live driver pod gone.
        if let Some(driver) = &driver {
            self.follow_driver(&req.namespace, driver, &fence).await?;
        }
        // Subscribe before listing so no event between the LIST and the actor is lost.
        let subscription = self.inner.watches.subscribe_with_driver(
            &req.namespace,
            req.app_id.as_str(),
            driver.as_ref().map(|d| d.name.as_str()),
        );
        let found = self.found(&req, driver.as_ref()).await?;
        let started = Started {
            resumed: !found.pods.is_empty(),
            last_executor_id: found.last_executor_id(),
        };
        let generation = self.inner.generations.fetch_add(1, Ordering::Relaxed);
        let parts = self.actor_parts(&req, builder, driver, &found, generation, &fence);
        let handle = ActorHandle::spawn(parts, subscription);
        self.register(
            &req,
            handle.clone(),
            found.id_record,
            generation,
            slot,
            fence.clone(),
        );
        // Registered after its shard began to drain (the drain's sweep may have passed):
        // it goes with the shard, and the driver asks the new owner again.
        if !fence.is_current() {
            let removed = {
                let mut apps = self.apps();
                let ours = apps
                    .get(&req.app_id)
                    .is_some_and(|e| e.generation == generation);
                let removed = if ours { apps.remove(&req.app_id) } else { None };
                self.inner.ctx.metrics.set_active_applications(apps.len());
                removed
            };
            if removed.is_some() {
                handle.stop().await;
            }
            return Err(AppError::Unavailable(format!(
                "shard {} (its Lease {}) is moving to another replica; start the \
                 application again there",
                fence.shard(),
                fence.shard().lease_name()
            )));
        }
        Ok(started)
    }

    /// The application's slot under the tenant caps. The caps' check and count are one
    /// step (see [`super::Tenants`]), and this runs under the application's Start lock, so
    /// neither concurrent Starts of other applications nor a repeated Start of this one
    /// can pass a cap together. An application left registered by a failed Stop holds a
    /// slot already, which its new entry replaces: it is not refused.
    fn application_slot(
        &self,
        req: &StartApplication,
        admission: Admission,
    ) -> Result<ApplicationSlot, AppError> {
        let admission = if self.apps().contains_key(&req.app_id) {
            Admission::Replacing
        } else {
            admission
        };
        self.inner
            .tenants
            .admit_application(&req.namespace, req.owner.as_deref(), admission)
    }

    /// An application another identity started is PermissionDenied, unless
    /// `may_act_on_any`; a Start allowed keeps the first owner.
    fn check_owner(
        &self,
        req: &mut StartApplication,
        may_act_on_any: bool,
    ) -> Result<(), AppError> {
        if let Some(existing) = self.ownership(&req.app_id) {
            if existing.owner != req.owner && !may_act_on_any {
                return Err(AppError::PermissionDenied(format!(
                    "application {} was started by another identity; only that identity \
                     (or a member of auth.admin_groups) may call it",
                    req.app_id
                )));
            }
            req.owner = existing.owner;
        }
        Ok(())
    }

    /// The actor of the application when it already runs here (a repeated Start);
    /// AlreadyExists when it runs in another namespace.
    fn running(&self, req: &StartApplication) -> Result<Option<ActorHandle>, AppError> {
        match self.entry(&req.app_id) {
            Some((namespace, _, _)) if namespace != req.namespace => Err(AppError::AlreadyExists {
                app_id: req.app_id.to_string(),
                namespace,
            }),
            Some((_, actor, _)) => Ok(actor),
            None => Ok(None),
        }
    }

    /// FailedPrecondition when the cluster says the namespace does not exist. Not asked
    /// again while the namespace's pod watch runs and has listed: another application
    /// there passed this check and is still running, and its watch's listing answered.
    async fn check_namespace_exists(&self, namespace: &str) -> Result<(), AppError> {
        if self.inner.watches.is_namespace_synced(namespace) {
            return Ok(());
        }
        if placement::namespace_exists(self.inner.pods.api(), namespace).await? == Some(false) {
            return Err(AppError::FailedPrecondition(format!(
                "namespace {namespace} does not exist in the cluster"
            )));
        }
        Ok(())
    }

    /// What the cluster holds of the application: its executor pods and its id record.
    async fn found(
        &self,
        req: &StartApplication,
        driver: Option<&Driver>,
    ) -> Result<Found, AppError> {
        let pods = self
            .inner
            .pods
            .list_executors(&req.namespace, req.app_id.as_str())
            .await?;
        // Pods of the highest ids may be gone (downscaled, finished): the recorded id
        // covers them.
        let id_record =
            IdRecord::for_application(req.app_id.as_str(), driver.map(|d| d.name.as_str()));
        let read = id_record
            .read(self.inner.pods.api(), &req.namespace)
            .await?;
        Ok(Found {
            pods,
            id_record,
            recorded: read.unwrap_or(0),
            record_absent: read.is_none(),
        })
    }

    /// The engine state, feed and settings of a new actor, resuming from what `found`
    /// holds.
    fn actor_parts(
        &self,
        req: &StartApplication,
        builder: ExecutorPodBuilder,
        driver: Option<Driver>,
        found: &Found,
        generation: u64,
        fence: &Fence,
    ) -> ActorParts {
        let ctx = &self.inner.ctx;
        let rules = req.settings.state_rules();
        let last_executor_id = found.last_executor_id();
        let now = self.inner.ctx.clock.now();
        let mut store = SnapshotStore::new(req.settings.batch_delay, now);
        let mut allocator = Allocator::new(req.settings.clone(), last_executor_id)
            .with_round_cap(ctx.limits.max_creates_per_round);
        allocator.set_create_rate(ctx.qps);
        // Pods being deleted when the service stopped count as deleted again (IsDeleted).
        allocator.restore_deleted(
            found
                .pods
                .iter()
                .filter(|pod| pod.metadata.deletion_timestamp.is_some())
                .filter_map(|pod| executor_pod_from(pod, &rules))
                .map(|executor| executor.id),
            now,
        );
        if !found.pods.is_empty() {
            let executors = found
                .pods
                .iter()
                .filter_map(|pod| executor_pod_from(pod, &rules))
                .collect();
            store.replace_all(executors, now);
            tracing::info!(app = %req.app_id, namespace = %req.namespace, pods = found.pods.len(), last_executor_id, "resuming application from its executor pods");
        }
        let feed = Feed::new(Feed::base_at(now.0), store, &found.pods, &rules)
            .with_buffer(ctx.executor_stream_buffer)
            .with_buffer_bytes(ctx.tenants.watch_stream_buffer_bytes);
        // Reuse reads only claims that outlive their executor: the driver pod's. An
        // application without claim templates has none to read (nor to list).
        let claim_rules = if builder.claim_templates().is_empty() {
            ClaimRules::default()
        } else {
            ClaimRules::of(&req.settings, builder.claims_owned_by_driver())
        };
        let claims = ExecutorClaims::new(claim_rules);
        let engine = Engine {
            allocator,
            builder,
            rules,
            id_blocks: IdBlocks::new(found.recorded),
            claims,
        };
        let budget = self.inner.budgets.join(
            &req.namespace,
            req.app_id.as_str(),
            (req.settings.budget_weight)
                .or(driver.as_ref().and_then(|d| d.weight))
                .unwrap_or(1),
        );
        let live = (found.pods.iter())
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .count();
        budget.resumed_with(live as u64);
        let app = ApplicationParts {
            app_id: req.app_id.to_string(),
            budget,
            namespace: req.namespace.clone(),
            engine,
            clock: Arc::clone(&self.inner.ctx.clock),
            driver: driver.as_ref().map(|d| DriverLife {
                pod_name: d.name.clone(),
                grace: ctx.app.driver_end_grace(),
            }),
            forget: self.forget_hook(&req.app_id, generation),
            registration: Registration::of_start(req),
            feed,
        };
        let kubernetes = Kubernetes {
            pods: (self.inner.pods)
                .for_application(&req.namespace, req.app_id.as_str())
                .fenced(fence.clone()),
            id_record: found.id_record.clone(),
            id_record_absent: found.record_absent,
            registrations: (self.inner.registrations)
                .for_application(&req.namespace, req.app_id.as_str())
                .fenced(fence.clone()),
        };
        ActorParts { app, kubernetes }
    }

    /// Registers the started application with its actor.
    fn register(
        &self,
        req: &StartApplication,
        actor: ActorHandle,
        id_record: IdRecord,
        generation: u64,
        slot: ApplicationSlot,
        fence: Fence,
    ) {
        let mut apps = self.apps();
        apps.insert(
            req.app_id.clone(),
            Entry {
                namespace: req.namespace.clone(),
                actor: Some(actor),
                id_record,
                first_start: FirstStart::of(req),
                generation,
                owner: req.owner.clone(),
                _tenant: slot,
                fence,
            },
        );
        self.inner.ctx.metrics.set_active_applications(apps.len());
    }

    /// A repeated Start of a running application (see [`Applications::start`]).
    async fn start_again(
        &self,
        req: &StartApplication,
        actor: &ActorHandle,
    ) -> Result<Started, AppError> {
        let first = self.apps().get(&req.app_id).map(|e| e.first_start.clone());
        if let Some(field) = first.and_then(|first| first.changed_by(req)) {
            return Err(AppError::FailedPrecondition(format!(
                "{field}: differs from the first Start of application {}, which is running; \
                 Stop it first, or start under another application id",
                req.app_id
            )));
        }
        let templates = req.templates.clone();
        actor.set_targets(templates, BTreeMap::new()).await?;
        let report = actor.report().await?;
        Ok(Started {
            resumed: true,
            last_executor_id: report.status.last_executor_id,
        })
    }

    /// Removes the application's entry once its actor ended because the driver ended
    /// (unless a Stop or a new Start replaced it meanwhile).
    fn forget_hook(&self, app: &AppId, generation: u64) -> actor::ForgetHook {
        let registry = Arc::downgrade(&self.inner);
        let app = app.clone();
        Box::new(move || {
            let Some(registry) = registry.upgrade() else {
                return;
            };
            let mut apps = match registry.apps.lock() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Some(entry) = apps.remove(&app) {
                if entry.generation != generation {
                    apps.insert(app, entry);
                    return;
                }
                registry.ctx.metrics.set_active_applications(apps.len());
                // A restarted service must not resume it.
                let registrations = registry.registrations.fenced(entry.fence.clone());
                tokio::spawn(async move {
                    let _ = registrations.delete(&entry.namespace, app.as_str()).await;
                });
            }
        })
    }

    fn check_namespace(&self, namespace: &str) -> Result<(), AppError> {
        let app = &self.inner.ctx.app;
        if app.allows(namespace) {
            Ok(())
        } else {
            Err(AppError::PermissionDenied(format!(
                "namespace {namespace} is not allowed by this service (allowed: {})",
                app.allowed_namespaces.join(", ")
            )))
        }
    }

    async fn driver(&self, req: &StartApplication) -> Result<Option<Driver>, AppError> {
        let Some(name) = &req.driver_pod_name else {
            return Ok(None);
        };
        let pod = placement::driver_pod(self.inner.pods.api(), &req.namespace, name)
            .await?
            .ok_or_else(|| AppError::no_driver_pod(name, &req.namespace))?;
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if let Some(phase @ ("Failed" | "Succeeded")) = phase {
            return Err(AppError::FailedPrecondition(format!(
                "driver_pod_name: the driver pod {name} has ended (phase {phase})"
            )));
        }
        let labelled = placement::is_followed_driver(&pod);
        let owner = match pod.metadata.uid {
            Some(uid) => Some(DriverOwner {
                name: name.clone(),
                uid,
            }),
            None => {
                tracing::warn!(driver = %name, "driver pod has no uid; executors get no owner");
                None
            }
        };
        let weight = (pod.metadata.annotations.as_ref())
            .and_then(|a| a.get(super::budgets::WEIGHT_ANNOTATION))
            .and_then(|w| match w.trim().parse::<u32>() {
                Ok(weight) if weight > 0 => Some(weight),
                _ => {
                    tracing::warn!(driver = %name, annotation = super::budgets::WEIGHT_ANNOTATION, value = %w,
                        "not a weight (a whole number > 0); the application's weight is 1");
                    None
                }
            });
        Ok(Some(Driver {
            name: name.clone(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            weight,
            owner,
            labelled,
        }))
    }

    /// Labels the driver pod [`FOLLOWED_DRIVER_LABEL`] (unless it is already), so that the
    /// namespace's driver watch follows it whatever its other labels: a notebook's or a
    /// client-mode driver's pod carries none of Spark's.
    ///
    /// A PATCH the API server refuses (403) refuses the Start (FailedPrecondition naming
    /// `driver_pod_name` and the missing right) rather than running the application
    /// unfollowed: the same right (`patch pods`) writes the executor id record on that pod
    /// before every create, so such an application could never create an executor, and an
    /// unfollowed one would keep its executors after its driver is gone.
    async fn follow_driver(
        &self,
        namespace: &str,
        driver: &Driver,
        fence: &Fence,
    ) -> Result<(), AppError> {
        if driver.labelled {
            return Ok(());
        }
        let api = self.inner.pods.api().fenced(fence.clone());
        match placement::follow_driver(&api, namespace, &driver.name).await {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                Err(AppError::no_driver_pod(&driver.name, namespace))
            }
            Err(err) if matches!(&err, kube::Error::Api(status) if status.code == 403) => {
                Err(AppError::FailedPrecondition(format!(
                    "driver_pod_name: the service may not label the driver pod {} to follow it \
                     ({}); grant its service account `patch pods` in namespace {namespace} (the \
                     executor id record on that pod needs it too)",
                    driver.name,
                    crate::k8s::describe_error(&err)
                )))
            }
            Err(err) => Err(err.into()),
        }
    }

    /// The executor pod builder of a Start request, its templates checked
    /// ([`templates::builder`]); its pods get their owner once the driver pod is found
    /// ([`ExecutorPodBuilder::with_driver`]).
    fn pod_builder(&self, req: &StartApplication) -> Result<ExecutorPodBuilder, AppError> {
        templates::builder(req, self.inner.ctx.limits.max_resource_profiles)
    }
}

/// What Start finds of an application in the cluster.
struct Found {
    /// Its executor pods.
    pods: Vec<Pod>,
    /// Where its highest executor id is recorded.
    id_record: IdRecord,
    /// The id recorded there (0: none).
    recorded: u64,
    /// No id was recorded there (for a ConfigMap record: most likely no ConfigMap).
    record_absent: bool,
}

impl Found {
    /// The highest executor id in use: of a pod found, or recorded.
    fn last_executor_id(&self) -> u64 {
        highest_executor_id(&self.pods)
            .unwrap_or(0)
            .max(self.recorded)
    }
}

/// The application's driver pod as Start found it.
struct Driver {
    name: String,
    /// Its labels (its queue label may name only its namespace's queue).
    labels: BTreeMap<String, String>,
    /// Its budget weight annotation, when it gives a valid one.
    weight: Option<u32>,
    /// The executors' controller owner (none when the pod has no uid).
    owner: Option<DriverOwner>,
    /// It carries [`FOLLOWED_DRIVER_LABEL`] already.
    labelled: bool,
}
