//! The tonic service: validates requests at the edge ([`validate`]), calls the application
//! registry, maps errors in one place ([`error`]). No allocation logic lives here.
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::allocator::ExecutorState;
use crate::allocator::pod_policy::PodPolicy;
use crate::app::failures::STUCK;
use crate::app::templates;
use crate::app::{
    AppError, AppId, ApplicationStatus, Applications, CreateFailure, EventKind, ExecutorEvent,
    ExecutorProblem, ExecutorView,
};
use crate::auth::{Access, Caller, Gate};
use crate::proto;
use crate::proto::executor_allocator_server::ExecutorAllocator;
use forward::{Forwarder, Route};

pub mod codec;
pub mod connections;
pub mod error;
pub mod forward;
pub mod limits;
pub mod observe;
pub mod server;
pub mod tls;
pub mod validate;

pub use error::to_status;
pub use server::{ServeError, ServeSettings, serve};
pub use validate::StartDefaults;

/// The `spark.allocator.v1.ExecutorAllocator` service over the application registry.
#[derive(Clone)]
pub struct AllocatorService {
    applications: Applications,
    defaults: Arc<StartDefaults>,
    gate: Gate,
    /// Requests whose templates are being parsed, at most `limits.template_parsers`.
    parsers: Arc<tokio::sync::Semaphore>,
    /// Where calls for other replicas' applications go.
    forwarder: Forwarder,
}

/// Why a call failed: this replica's own error (mapped to a status in one place), or the
/// answer of the replica it was forwarded to (passed on as it came).
enum CallError {
    Here(AppError),
    Owner(Status),
}

impl From<AppError> for CallError {
    fn from(err: AppError) -> Self {
        Self::Here(err)
    }
}

type CallResult<T> = Result<Response<T>, CallError>;

impl AllocatorService {
    /// A service answering for `applications`, filling unset Start fields from `defaults`,
    /// letting every caller do everything (see [`AllocatorService::with_gate`]).
    pub fn new(applications: Applications, defaults: StartDefaults) -> Self {
        let parsers = defaults.limits.parsers();
        Self {
            applications,
            defaults: Arc::new(defaults),
            gate: Gate::open(),
            parsers: Arc::new(tokio::sync::Semaphore::new(parsers)),
            forwarder: Forwarder::off(),
        }
    }

    /// Forwards calls for applications another replica owns through `forwarder`.
    pub fn with_forwarder(mut self, forwarder: Forwarder) -> Self {
        self.forwarder = forwarder;
        self
    }

    /// The owner's answer when another replica runs `app` (`None`: answer here), sent
    /// with `deadline` (none for a stream).
    async fn forwarded<M, R, F, Fut>(
        &self,
        method: Method,
        caller: &Caller,
        app: &AppId,
        metadata: &tonic::metadata::MetadataMap,
        message: &M,
        call: F,
    ) -> Option<CallResult<R>>
    where
        M: Clone,
        F: Fn(forward::PeerClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let here = self.applications.ownership(app).is_some();
        match self
            .forwarder
            .route_application(app.as_str(), here, metadata)
            .await
        {
            Route::Here => None,
            Route::Unowned(why) => Some(Err(CallError::Owner(forward::unavailable(&why)))),
            Route::Peers { peers, unowned } => {
                let forward = forward::Forward {
                    method: method.name,
                    app: app.as_str(),
                    identity: caller.user.as_deref().unwrap_or_default(),
                    peers,
                    unowned,
                    deadline: method.deadline,
                };
                match self
                    .forwarder
                    .send(forward, metadata, message.clone(), call)
                    .await
                {
                    // No peer runs it. It may have come here meanwhile (a shard taken
                    // and resumed), or be about to (a resume under way, or retried).
                    Err(status) if status.code() == tonic::Code::NotFound => {
                        if self.applications.ownership(app).is_some() {
                            return None;
                        }
                        Some(Err(match self.applications.not_here(app) {
                            AppError::NotFound(_) => CallError::Owner(status),
                            unavailable => CallError::Here(unavailable),
                        }))
                    }
                    answer => Some(answer.map_err(CallError::Owner)),
                }
            }
        }
    }

    /// Authenticates and authorizes every call through `gate`.
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// The caller of a request that came from `peer`; UNAUTHENTICATED without valid
    /// credentials. The first thing every call does: nothing of the message is read before.
    async fn caller(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Caller, AppError> {
        let caller = self.gate.authenticate(metadata, peer).await?;
        // Its connection leaves the unauthenticated pool (grpc::connections).
        connections::mark_authenticated();
        Ok(caller)
    }

    /// Checks that `caller` owns `app` (or is an admin) and may still do `access` in its
    /// namespace. An unknown application answers NOT_FOUND here, as the call itself would,
    /// so that nothing more of the request (its templates) is read for it.
    async fn authorize(
        &self,
        caller: &Caller,
        app: &AppId,
        access: Access,
    ) -> Result<(), AppError> {
        if !self.gate.authenticates() {
            return Ok(());
        }
        let Some(ownership) = self.applications.ownership(app) else {
            return Err(self.applications.not_here(app));
        };
        self.gate
            .check_owner(caller, app, ownership.owner.as_deref())?;
        self.gate
            .authorize(caller, &ownership.namespace, access)
            .await
    }

    /// Runs `check` (template parsing: CPU-bound, up to the size and depth limits) on the
    /// blocking pool, a bounded number at once, so calls without templates — health checks
    /// included — never wait behind it.
    async fn off_runtime<T: Send + 'static>(
        &self,
        check: impl FnOnce(&StartDefaults, &PodPolicy) -> Result<T, AppError> + Send + 'static,
    ) -> Result<T, AppError> {
        let permit = Arc::clone(&self.parsers)
            .acquire_owned()
            .await
            .map_err(|_| AppError::ShuttingDown)?;
        let defaults = Arc::clone(&self.defaults);
        let applications = self.applications.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            check(&defaults, applications.pod_policy())
        })
        .await
        .map_err(|err| AppError::Internal(format!("checking the request's templates: {err}")))?
    }
}

/// A method as forwarding sees it: its name, and the deadline of a unary call (none for a
/// stream, which lasts as long as the owner's).
#[derive(Clone, Copy)]
struct Method {
    name: &'static str,
    deadline: Option<std::time::Duration>,
}

impl Method {
    const fn unary(name: &'static str) -> Self {
        Self {
            name,
            deadline: Some(forward::UNARY_DEADLINE),
        }
    }

    const fn stream(name: &'static str) -> Self {
        Self {
            name,
            deadline: None,
        }
    }
}

/// One open stream of an application's events: its actor's here, or its owner's (with
/// its place on the forwarding connection, held while it lasts).
enum Events {
    Here(crate::app::ExecutorEvents),
    Owner {
        stream: tonic::Streaming<proto::ExecutorEvent>,
        _slot: Option<forward::StreamSlot>,
    },
}

/// What a WatchExecutors stream needs to be opened again elsewhere.
struct Watch {
    caller: Caller,
    app: AppId,
    metadata: tonic::metadata::MetadataMap,
    since: u64,
}

/// How long a forwarded stream whose owner went away is tried again (wherever its
/// application is then) before the caller gets the error: a failover, with room.
const REWATCH_WINDOW: std::time::Duration = std::time::Duration::from_secs(30);
const REWATCH_PAUSE: std::time::Duration = std::time::Duration::from_millis(250);

impl AllocatorService {
    /// The application's events from `since`: from its actor if this replica runs it,
    /// else from its owner's stream.
    async fn open_events(
        &self,
        caller: &Caller,
        app: &AppId,
        metadata: &tonic::metadata::MetadataMap,
        since: u64,
    ) -> Result<Events, CallError> {
        let message = proto::WatchExecutorsRequest {
            application_id: app.to_string(),
            since,
        };
        let forwarded = self
            .forwarded(
                Method::stream("WatchExecutors"),
                caller,
                app,
                metadata,
                &message,
                |mut owner, r| async move { owner.watch_executors(r).await },
            )
            .await;
        if let Some(owner) = forwarded {
            let owner = owner?;
            let slot = owner.extensions().get::<forward::StreamSlot>().cloned();
            return Ok(Events::Owner {
                stream: owner.into_inner(),
                _slot: slot,
            });
        }
        self.authorize(caller, app, Access::Read).await?;
        let events = self
            .applications
            .watch_executors(app, since, caller.user.as_deref())
            .await?;
        Ok(Events::Here(events))
    }

    /// The stream a caller reads. A forwarded stream whose owner goes away (killed,
    /// partitioned, or its application moved with its shard) is opened again from its last
    /// event, wherever the application is then (another replica, or this one after taking
    /// the shard): the caller reads on, with a fresh full state if the new owner cannot
    /// resume from that event. So is a stream of an application this replica ran until its
    /// shard moved; one forwarded here ends UNAVAILABLE instead, for the forwarding replica
    /// to follow (one hop), as does any on a replica shutting down.
    fn follow(&self, first: Events, mut watch: Watch, span: tracing::Span) -> ExecutorEventStream {
        let service = self.clone();
        Box::pin(async_stream::stream! {
            let mut events = first;
            loop {
                let failed = match &mut events {
                    Events::Here(local) => {
                        // An application this replica runs: its stream ends with its actor.
                        while let Some(event) = local.next().await {
                            watch.since = event.sequence;
                            yield Ok(executor_event(event));
                        }
                        if !local.ended_by_move() {
                            span.in_scope(|| tracing::debug!("executor event stream ended: the application's actor ended"));
                            break;
                        }
                        let moved = forward::unavailable(&format!(
                            "application {} moved to another replica with its shard",
                            watch.app
                        ));
                        if forward::is_forwarded(&watch.metadata)
                            || service.applications.is_shutting_down()
                        {
                            yield Err(moved);
                            break;
                        }
                        moved
                    }
                    Events::Owner { stream: remote, .. } => match remote.message().await {
                        Ok(Some(event)) => {
                            watch.since = event.sequence;
                            yield Ok(event);
                            continue;
                        }
                        Ok(None) => {
                            span.in_scope(|| tracing::debug!("executor event stream ended by the owner"));
                            break;
                        }
                        Err(status) => status,
                    },
                };
                span.in_scope(|| tracing::info!(code = error::code_name(failed.code()), detail = failed.message(),
                    since = watch.since, "the event stream's owner went away or its application moved; watching again where the application is"));
                match service.rewatch(&watch).await {
                    Some(next) => events = next,
                    None => {
                        yield Err(failed);
                        break;
                    }
                }
            }
        })
    }

    /// Opens `watch` again, trying for up to [`REWATCH_WINDOW`].
    async fn rewatch(&self, watch: &Watch) -> Option<Events> {
        let deadline = tokio::time::Instant::now() + REWATCH_WINDOW;
        loop {
            match self
                .open_events(&watch.caller, &watch.app, &watch.metadata, watch.since)
                .await
            {
                Ok(events) => return Some(events),
                Err(_) if tokio::time::Instant::now() + REWATCH_PAUSE < deadline => {
                    tokio::time::sleep(REWATCH_PAUSE).await;
                }
                Err(_) => return None,
            }
        }
    }
}

/// The span of one call: every log line of it carries the method and application.
fn rpc_span(method: &'static str, application_id: &str) -> tracing::Span {
    tracing::info_span!("rpc", method, app = %application_id)
}

/// Ids are `u64` inside and `int64` on the wire; they never come near `i64::MAX` in practice,
/// but saturating keeps a corrupt label from turning into a negative id.
fn wire_id(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

fn status_message(app: ApplicationStatus) -> proto::ApplicationStatus {
    let status = app.allocation;
    let mut create_failures = app.create_failures;
    let backoff_until_ms = app.backoff_until.map_or(0, |t| t.0);
    let held_by = app.held_by.map(|by| proto::BudgetHold {
        budget: by.budget,
        resource: by.resource.name().into(),
        used: by.used,
        limit: by.limit,
        share: by.share,
    });
    proto::ApplicationStatus {
        failed_executors: app
            .failed_executors
            .into_iter()
            .map(|f| proto::ExecutorFailure {
                executor_id: wire_id(f.executor_id.0),
                resource_profile_id: f.profile.0,
                pod_name: f.pod_name,
                state: match f.problem {
                    ExecutorProblem::Failed => "Failed",
                    ExecutorProblem::Waiting => "Waiting",
                    ExecutorProblem::Stuck => "Stuck",
                    ExecutorProblem::Unschedulable => "Unschedulable",
                }
                .into(),
                exit_code: f.exit_code,
                reason: f.reason.unwrap_or_default(),
                message: f.message.unwrap_or_default(),
                time_ms: f.at.0,
            })
            .collect(),
        driver: app.driver.map(|d| proto::DriverStatus {
            pod_name: d.pod_name,
            phase: d.phase.unwrap_or_default(),
            // Every driver pod named at Start is followed (Start labels it, or is refused).
            followed: true,
            ended_at_ms: d.ended_at.map_or(0, |t| t.0),
            forget_at_ms: d.forget_at.map_or(0, |t| t.0),
        }),
        profiles: status
            .profiles
            .into_iter()
            .map(|(profile, c)| proto::ProfileStatus {
                resource_profile_id: profile.0,
                target: c.target,
                running: c.running,
                pending: c.pending,
                newly_created: c.newly_created,
                held: c.held,
                held_by: held_by.clone().filter(|_| c.held > 0),
                backoff_until_ms: create_failures
                    .get(&profile)
                    .filter(|f| f.consecutive > 0)
                    .map_or(0, |_| backoff_until_ms),
                last_create_failure: create_failures.remove(&profile).map(create_failure),
            })
            .collect(),
        deleted_executor_ids: status.deleted.into_iter().map(|id| wire_id(id.0)).collect(),
        last_executor_id: wire_id(status.last_executor_id),
        outstanding: status.outstanding,
    }
}

fn create_failure(f: CreateFailure) -> proto::CreateFailure {
    let code = match f.http_code {
        Some(http) => error::api_code(http, &f.reason),
        None if f.reason == "IdNotRecorded" || f.reason == STUCK => tonic::Code::FailedPrecondition,
        None => tonic::Code::Unavailable,
    };
    proto::CreateFailure {
        http_code: f.http_code.map_or(0, u32::from),
        code: error::code_name(code).into(),
        reason: f.reason,
        message: f.message,
        time_ms: f.at.0,
        consecutive_failures: f.consecutive,
        total_failures: f.total,
    }
}

/// One executor event on the wire.
fn executor_event(event: ExecutorEvent) -> proto::ExecutorEvent {
    let kind = match event.kind {
        EventKind::Snapshot => proto::ExecutorEventKind::Snapshot,
        EventKind::Synced => proto::ExecutorEventKind::Synced,
        EventKind::Updated => proto::ExecutorEventKind::Updated,
        EventKind::Deleted => proto::ExecutorEventKind::Deleted,
    };
    proto::ExecutorEvent {
        sequence: event.sequence,
        kind: kind.into(),
        executor: event.executor.map(|view| executor_pod(&view)),
    }
}

fn executor_pod(view: &ExecutorView) -> proto::ExecutorPod {
    use proto::ExecutorPodState as Wire;
    let executor = &view.executor;
    let (state, exit_code, reason, message) = match &executor.state {
        ExecutorState::Pending => match &executor.start_blocker {
            Some(blocker) => (
                Wire::Pending,
                None,
                Some(blocker.reason().to_string()),
                blocker.message().map(str::to_string),
            ),
            None => (Wire::Pending, None, None, None),
        },
        ExecutorState::Running => (Wire::Running, None, None, None),
        ExecutorState::Succeeded { exit_code } => (Wire::Succeeded, *exit_code, None, None),
        ExecutorState::Failed {
            exit_code,
            reason,
            message,
        } => (Wire::Failed, *exit_code, reason.clone(), message.clone()),
        ExecutorState::Deleted => (Wire::Deleted, None, None, None),
        ExecutorState::Terminating => (Wire::Terminating, None, None, None),
        ExecutorState::Unknown => (Wire::Unknown, None, None, None),
    };
    let pod_json = view.pod_json.to_string();
    proto::ExecutorPod {
        executor_id: wire_id(executor.id.0),
        resource_profile_id: executor.profile.0,
        pod_name: executor.pod_name.clone(),
        phase: view.phase.clone().unwrap_or_default(),
        state: state.into(),
        exit_code,
        reason: reason.unwrap_or_default(),
        message: message.unwrap_or_default(),
        pod_json,
    }
}

/// Runs one call inside its span and turns its error into a status (logged once here;
/// an owner's answer to a forward was logged by the owner).
async fn answer<T>(
    method: &'static str,
    application_id: &str,
    call: impl Future<Output = CallResult<T>>,
) -> Result<Response<T>, Status> {
    let span = rpc_span(method, application_id);
    match call.instrument(span.clone()).await {
        Ok(reply) => Ok(reply),
        Err(CallError::Here(err)) => Err(span.in_scope(|| error::failed_call(err))),
        Err(CallError::Owner(status)) => {
            span.in_scope(|| {
                tracing::debug!(
                    code = error::code_name(status.code()),
                    detail = status.message(),
                    "answered by the owner"
                )
            });
            Err(status)
        }
    }
}

/// The events of one WatchExecutors stream.
pub type ExecutorEventStream =
    Pin<Box<dyn Stream<Item = Result<proto::ExecutorEvent, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExecutorAllocator for AllocatorService {
    type WatchExecutorsStream = ExecutorEventStream;

    async fn watch_executors(
        &self,
        request: Request<proto::WatchExecutorsRequest>,
    ) -> Result<Response<Self::WatchExecutorsStream>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        let span = rpc_span("WatchExecutors", &app_id);
        let response = answer("WatchExecutors", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let app = validate::application_id(&req.application_id)?;
            let first = self
                .open_events(&caller, &app, &metadata, req.since)
                .await?;
            tracing::debug!(since = req.since, "executor event stream opened");
            let watch = Watch {
                caller,
                app,
                metadata,
                since: req.since,
            };
            Ok(Response::new(self.follow(first, watch, span.clone())))
        })
        .await?;
        Ok(response)
    }

    async fn start(
        &self,
        request: Request<proto::StartRequest>,
    ) -> Result<Response<proto::StartResponse>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        answer("Start", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            // Authorized before any template is read: a caller without rights costs one
            // (cached) review, never a parse.
            let target = validate::start_target(&req)?;
            // Never more than the caller could do itself: it must be able to create and
            // delete pods in the namespace, and get and patch the driver pod it names; the
            // owner check is under the lifecycle lock.
            let namespace = &target.placement.namespace;
            self.gate
                .authorize(&caller, namespace, Access::Change)
                .await?;
            if let Some(pod) = &target.placement.driver_pod_name {
                self.gate
                    .authorize_driver_pod(&caller, namespace, pod)
                    .await?;
            }
            if !req.executor_claim_templates.is_empty() {
                self.gate
                    .authorize_claims(&caller, namespace, "executor_claim_templates")
                    .await?;
            }
            // The namespace's shard owner parses the templates and starts it.
            if let Route::Peers { peers, unowned } =
                self.forwarder.route_namespace(namespace, &metadata).await
            {
                let forward = forward::Forward {
                    method: "Start",
                    app: &app_id,
                    identity: caller.user.as_deref().unwrap_or_default(),
                    peers,
                    unowned,
                    deadline: Some(forward::UNARY_DEADLINE),
                };
                return self
                    .forwarder
                    .send(forward, &metadata, req, |mut owner, r| async move {
                        owner.start(r).await
                    })
                    .await
                    .map_err(CallError::Owner);
            }
            // The server's default template is the operator's; only the caller's own
            // templates need the caller's claim rights for their ephemeral volumes.
            let own_executor_template = !req.executor_pod_template.trim().is_empty();
            let mut start = self
                .off_runtime(move |defaults, policy| validate::start(req, target, defaults, policy))
                .await?;
            let ephemeral = start
                .templates
                .iter()
                .filter(|(profile, _)| own_executor_template || profile.0 != 0)
                .find_map(|(profile, pod)| templates::ephemeral_volume(*profile, pod));
            if let Some(field) = ephemeral {
                self.gate
                    .authorize_claims(&caller, &start.namespace, &field)
                    .await?;
            }
            start.owner = caller.user.clone();
            let may_act_on_any = self.gate.is_admin(&caller);
            // In a task of its own, so a Start whose client gives up half-way still finishes
            // (never an application half started).
            let applications = self.applications.clone();
            let started =
                tokio::spawn(async move { applications.start_by(start, may_act_on_any).await })
                    .await
                    .map_err(|err| AppError::Internal(format!("Start did not finish: {err}")))??;
            tracing::info!(
                resumed = started.resumed,
                last_executor_id = started.last_executor_id,
                "started"
            );
            Ok(Response::new(proto::StartResponse {
                resumed: started.resumed,
                last_executor_id: wire_id(started.last_executor_id),
            }))
        })
        .await
    }

    async fn set_total_expected(
        &self,
        request: Request<proto::SetTotalExpectedRequest>,
    ) -> Result<Response<proto::SetTotalExpectedResponse>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        answer("SetTotalExpected", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let app = validate::application_id(&req.application_id)?;
            let forwarded = self
                .forwarded(
                    Method::unary("SetTotalExpected"),
                    &caller,
                    &app,
                    &metadata,
                    &req,
                    |mut owner, r| async move { owner.set_total_expected(r).await },
                )
                .await;
            if let Some(owner) = forwarded {
                return owner;
            }
            self.authorize(&caller, &app, Access::Change).await?;
            // The application layer holds the templates to the policy where its pods go.
            let expected = if req.resource_profile_templates.is_empty() {
                validate::set_total_expected(req, &self.defaults)?
            } else {
                self.off_runtime(move |defaults, _| validate::set_total_expected(req, defaults))
                    .await?
            };
            let ephemeral = (expected.templates.iter())
                .find_map(|(profile, pod)| templates::ephemeral_volume(*profile, pod));
            if let (Some(field), Some(ownership)) = (ephemeral, self.applications.ownership(&app)) {
                self.gate
                    .authorize_claims(&caller, &ownership.namespace, &field)
                    .await?;
            }
            self.applications
                .set_total_expected_with_templates(&app, expected.templates, expected.targets)
                .await?;
            Ok(Response::new(proto::SetTotalExpectedResponse {}))
        })
        .await
    }

    async fn is_deleted(
        &self,
        request: Request<proto::IsDeletedRequest>,
    ) -> Result<Response<proto::IsDeletedResponse>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        answer("IsDeleted", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let message = req.clone();
            let (app, id) = validate::is_deleted(req)?;
            let forwarded = self
                .forwarded(
                    Method::unary("IsDeleted"),
                    &caller,
                    &app,
                    &metadata,
                    &message,
                    |mut owner, r| async move { owner.is_deleted(r).await },
                )
                .await;
            if let Some(owner) = forwarded {
                return owner;
            }
            self.authorize(&caller, &app, Access::Read).await?;
            let deleted = self.applications.is_deleted(&app, id).await?;
            Ok(Response::new(proto::IsDeletedResponse { deleted }))
        })
        .await
    }

    async fn update_registered_executors(
        &self,
        request: Request<proto::UpdateRegisteredExecutorsRequest>,
    ) -> Result<Response<proto::UpdateRegisteredExecutorsResponse>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        answer("UpdateRegisteredExecutors", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let message = req.clone();
            let (app, ids) = validate::update_registered(req)?;
            let forwarded = self
                .forwarded(
                    Method::unary("UpdateRegisteredExecutors"),
                    &caller,
                    &app,
                    &metadata,
                    &message,
                    |mut owner, r| async move { owner.update_registered_executors(r).await },
                )
                .await;
            if let Some(owner) = forwarded {
                return owner;
            }
            self.authorize(&caller, &app, Access::Change).await?;
            self.applications.update_registered(&app, ids).await?;
            Ok(Response::new(proto::UpdateRegisteredExecutorsResponse {}))
        })
        .await
    }

    async fn stop(
        &self,
        request: Request<proto::StopRequest>,
    ) -> Result<Response<proto::StopResponse>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        answer("Stop", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let app = validate::application_id(&app_id)?;
            let forwarded = self
                .forwarded(
                    Method::unary("Stop"),
                    &caller,
                    &app,
                    &metadata,
                    &req,
                    |mut owner, r| async move { owner.stop(r).await },
                )
                .await;
            if let Some(owner) = forwarded {
                return owner;
            }
            self.authorize(&caller, &app, Access::Change).await?;
            let deleted_pods = self.applications.stop(&app).await?;
            tracing::info!(deleted_pods, "stopped");
            Ok(Response::new(proto::StopResponse { deleted_pods }))
        })
        .await
    }

    async fn get_status(
        &self,
        request: Request<proto::GetStatusRequest>,
    ) -> Result<Response<proto::ApplicationStatus>, Status> {
        let peer = connections::peer_addr(&request);
        let (metadata, _, req) = request.into_parts();
        let app_id = req.application_id.clone();
        answer("GetStatus", &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let app = validate::application_id(&app_id)?;
            let forwarded = self
                .forwarded(
                    Method::unary("GetStatus"),
                    &caller,
                    &app,
                    &metadata,
                    &req,
                    |mut owner, r| async move { owner.get_status(r).await },
                )
                .await;
            if let Some(owner) = forwarded {
                return owner;
            }
            self.authorize(&caller, &app, Access::Read).await?;
            Ok(Response::new(status_message(
                self.applications.application_status(&app).await?,
            )))
        })
        .await
    }
}
