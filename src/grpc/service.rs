//! The path every call for one application takes at the edge, written once: authenticate,
//! validate the id, forward to the owner or answer here, authorize; then the handler's own
//! logic ([`super::handlers`]).
use std::future::Future;
use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::forward::{self, Forwarder, Route};
use super::validate::{self, StartDefaults};
use super::{connections, error};
use crate::allocator::pod_policy::PodPolicy;
use crate::app::{AppError, AppId, Applications};
use crate::auth::{Access, Caller, Gate};
use crate::proto;

/// The `spark.allocator.v1.ExecutorAllocator` service over the application registry.
#[derive(Clone)]
pub struct AllocatorService {
    pub(super) applications: Applications,
    pub(super) defaults: Arc<StartDefaults>,
    pub(super) gate: Gate,
    /// Requests whose templates are being parsed, at most `limits.template_parsers`.
    parsers: Arc<tokio::sync::Semaphore>,
    /// Where calls for other replicas' applications go.
    pub(super) forwarder: Forwarder,
}

/// Why a call failed: this replica's own error (mapped to a status in one place), or the
/// answer of the replica it was forwarded to (passed on as it came).
pub(super) enum CallError {
    Here(AppError),
    Owner(Status),
}

impl From<AppError> for CallError {
    fn from(err: AppError) -> Self {
        Self::Here(err)
    }
}

pub(super) type CallResult<T> = Result<Response<T>, CallError>;

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
        metadata: &MetadataMap,
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
    pub(super) async fn caller(
        &self,
        metadata: &MetadataMap,
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
    pub(super) async fn off_runtime<T: Send + 'static>(
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
pub(super) struct Method {
    pub(super) name: &'static str,
    deadline: Option<std::time::Duration>,
}

impl Method {
    pub(super) const fn unary(name: &'static str) -> Self {
        Self {
            name,
            deadline: Some(forward::UNARY_DEADLINE),
        }
    }

    pub(super) const fn stream(name: &'static str) -> Self {
        Self {
            name,
            deadline: None,
        }
    }
}

/// The span of one call: every log line of it carries the method and application.
pub(super) fn rpc_span(method: &'static str, application_id: &str) -> tracing::Span {
    tracing::info_span!("rpc", method, app = %application_id)
}

/// Runs one call inside its span and turns its error into a status (logged once here;
/// an owner's answer to a forward was logged by the owner).
pub(super) async fn answer<T>(
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

/// Where a call keyed by a namespace goes: its shard owner's answer, or its message back to
/// be answered here.
pub(super) enum Routed<M, R> {
    Owner(CallResult<R>),
    Here(M),
}

/// A call about to go to the owner of a namespace's shard ([`AllocatorService::to_namespace_owner`]).
pub(super) struct NamespaceForward<'a> {
    service: &'a AllocatorService,
    method: Method,
    caller: &'a Caller,
    app: &'a str,
}

impl NamespaceForward<'_> {
    /// Sends `message` through `call` when another replica owns `namespace`'s shard.
    pub(super) async fn send<M, R, F, Fut>(
        self,
        namespace: &str,
        metadata: &MetadataMap,
        message: M,
        call: F,
    ) -> Routed<M, R>
    where
        M: Clone,
        F: Fn(forward::PeerClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let forwarder = &self.service.forwarder;
        let Route::Peers { peers, unowned } = forwarder.route_namespace(namespace, metadata).await
        else {
            return Routed::Here(message);
        };
        let forward = forward::Forward {
            method: self.method.name,
            app: self.app,
            identity: self.caller.user.as_deref().unwrap_or_default(),
            peers,
            unowned,
            deadline: self.method.deadline,
        };
        let answer = forwarder.send(forward, metadata, message, call).await;
        Routed::Owner(answer.map_err(CallError::Owner))
    }
}

/// A request about one application: what the common path reads of it before the handler.
pub(super) trait AppRequest: Clone + Send + Sync + 'static {
    fn application_id(&self) -> &str;
}

macro_rules! app_requests {
    ($($message:ty),*) => {$(
        impl AppRequest for $message {
            fn application_id(&self) -> &str {
                &self.application_id
            }
        }
    )*};
}

app_requests!(
    proto::SetTotalExpectedRequest,
    proto::IsDeletedRequest,
    proto::UpdateRegisteredExecutorsRequest,
    proto::StopRequest,
    proto::GetStatusRequest
);

/// A call past the common path: its caller, allowed to act on `app` here, and its message
/// with what `check` read of it.
pub(super) struct AppCall<M, V> {
    pub caller: Caller,
    pub app: AppId,
    pub message: M,
    pub checked: V,
}

impl AllocatorService {
    /// The owner's answer when another replica runs `app`; else `None`, once `caller` is
    /// authorized to do `access` on it here.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn owner_or_authorize<M, R, F, Fut>(
        &self,
        method: Method,
        access: Access,
        caller: &Caller,
        app: &AppId,
        metadata: &MetadataMap,
        message: &M,
        to_owner: F,
    ) -> Result<Option<Response<R>>, CallError>
    where
        M: Clone,
        F: Fn(forward::PeerClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let forwarded = self
            .forwarded(method, caller, app, metadata, message, to_owner)
            .await;
        if let Some(owner) = forwarded {
            return owner.map(Some);
        }
        self.authorize(caller, app, access).await?;
        Ok(None)
    }

    /// A call for `app` routed by its namespace (Start: the application may not exist yet).
    pub(super) fn to_namespace_owner<'a>(
        &'a self,
        method: Method,
        caller: &'a Caller,
        app: &'a str,
    ) -> NamespaceForward<'a> {
        NamespaceForward {
            service: self,
            method,
            caller,
            app,
        }
    }

    /// One unary call about one application: authenticates the caller (nothing of the
    /// message is read before), validates its `application_id`, then whatever else `check`
    /// reads without templates, forwards it through `to_owner` when another replica runs
    /// the application, else authorizes `access` and answers with `here`.
    pub(super) async fn per_application<M, V, R, O, OFut, H, HFut>(
        &self,
        method: Method,
        access: Access,
        request: Request<M>,
        check: impl FnOnce(&M) -> Result<V, AppError>,
        to_owner: O,
        here: H,
    ) -> Result<Response<R>, Status>
    where
        M: AppRequest,
        O: Fn(forward::PeerClient, Request<M>) -> OFut,
        OFut: Future<Output = Result<Response<R>, Status>>,
        H: FnOnce(AppCall<M, V>) -> HFut,
        HFut: Future<Output = CallResult<R>>,
    {
        let peer = connections::peer_addr(&request);
        let (metadata, _, message) = request.into_parts();
        let app_id = message.application_id().to_owned();
        answer(method.name, &app_id, async {
            let caller = self.caller(&metadata, peer).await?;
            let app = validate::application_id(&app_id)?;
            let checked = check(&message)?;
            let owner = self
                .owner_or_authorize(method, access, &caller, &app, &metadata, &message, to_owner)
                .await?;
            if let Some(answer) = owner {
                return Ok(answer);
            }
            here(AppCall {
                caller,
                app,
                message,
                checked,
            })
            .await
        })
        .await
    }
}
