//! The handlers of `spark.allocator.v1.ExecutorAllocator`: each holds only its own logic,
//! past the common path of [`AllocatorService::per_application`].
use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status};

use super::forward;
use super::messages::{executor_event, status_message, wire_id};
use super::service::{AllocatorService, AppCall, CallError, Method, Routed, answer, rpc_span};
use super::{connections, error, validate};
use crate::app::{AppError, AppId, templates};
use crate::auth::{Access, Caller};
use crate::proto;
use crate::proto::executor_allocator_server::ExecutorAllocator;

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
        let owner = self
            .owner_or_authorize(
                Method::stream("WatchExecutors"),
                Access::Read,
                caller,
                app,
                metadata,
                &message,
                |mut owner, r| async move { owner.watch_executors(r).await },
            )
            .await?;
        if let Some(owner) = owner {
            let slot = owner.extensions().get::<forward::StreamSlot>().cloned();
            return Ok(Events::Owner {
                stream: owner.into_inner(),
                _slot: slot,
            });
        }
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

/// The events of one WatchExecutors stream.
pub type ExecutorEventStream =
    Pin<Box<dyn Stream<Item = Result<proto::ExecutorEvent, Status>> + Send + 'static>>;

/// `check` of a call that reads nothing but its application id.
fn id_only<M>(_: &M) -> Result<(), AppError> {
    Ok(())
}

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
            let start_owner =
                |mut owner: forward::PeerClient, r| async move { owner.start(r).await };
            let req = match (self.to_namespace_owner(Method::unary("Start"), &caller, &app_id))
                .send(namespace, &metadata, req, start_owner)
                .await
            {
                Routed::Owner(answer) => return answer,
                Routed::Here(req) => req,
            };
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
        self.per_application(
            Method::unary("SetTotalExpected"),
            Access::Change,
            request,
            id_only,
            |mut owner, r| async move { owner.set_total_expected(r).await },
            |call| async move {
                let AppCall {
                    caller,
                    app,
                    message: req,
                    ..
                } = call;
                // Parsed and held to the pod policy where the application's pods go, as
                // Start's templates are (a placement not found is answered after the
                // templates' own errors, as the call itself would).
                let placement = self.applications.placement(&app);
                let expected = if req.resource_profile_templates.is_empty() {
                    validate::set_total_expected(req, &self.defaults, None)?
                } else {
                    let at = placement.as_ref().ok().cloned();
                    self.off_runtime(move |defaults, policy| {
                        let at = at.as_ref().map(|placement| (policy, placement));
                        validate::set_total_expected(req, defaults, at)
                    })
                    .await?
                };
                let placement = placement?;
                let ephemeral = (expected.templates.iter())
                    .find_map(|(profile, pod)| templates::ephemeral_volume(*profile, pod));
                if let Some(field) = ephemeral {
                    self.gate
                        .authorize_claims(&caller, &placement.namespace, &field)
                        .await?;
                }
                self.applications
                    .set_total_expected_with_templates(&app, expected.templates, expected.targets)
                    .await?;
                Ok(Response::new(proto::SetTotalExpectedResponse {}))
            },
        )
        .await
    }

    async fn is_deleted(
        &self,
        request: Request<proto::IsDeletedRequest>,
    ) -> Result<Response<proto::IsDeletedResponse>, Status> {
        self.per_application(
            Method::unary("IsDeleted"),
            Access::Read,
            request,
            |req| validate::is_deleted(req.clone()).map(|(_, id)| id),
            |mut owner, r| async move { owner.is_deleted(r).await },
            |call| async move {
                let deleted = self
                    .applications
                    .is_deleted(&call.app, call.checked)
                    .await?;
                Ok(Response::new(proto::IsDeletedResponse { deleted }))
            },
        )
        .await
    }

    async fn update_registered_executors(
        &self,
        request: Request<proto::UpdateRegisteredExecutorsRequest>,
    ) -> Result<Response<proto::UpdateRegisteredExecutorsResponse>, Status> {
        self.per_application(
            Method::unary("UpdateRegisteredExecutors"),
            Access::Change,
            request,
            |req| validate::update_registered(req.clone()).map(|(_, registered)| registered),
            |mut owner, r| async move { owner.update_registered_executors(r).await },
            |call| async move {
                let (ids, running_tasks) = call.checked;
                (self.applications)
                    .update_registered_with_tasks(&call.app, ids, running_tasks)
                    .await?;
                Ok(Response::new(proto::UpdateRegisteredExecutorsResponse {}))
            },
        )
        .await
    }

    async fn stop(
        &self,
        request: Request<proto::StopRequest>,
    ) -> Result<Response<proto::StopResponse>, Status> {
        self.per_application(
            Method::unary("Stop"),
            Access::Change,
            request,
            id_only,
            |mut owner, r| async move { owner.stop(r).await },
            |call| async move {
                let deleted_pods = self.applications.stop(&call.app).await?;
                tracing::info!(deleted_pods, "stopped");
                Ok(Response::new(proto::StopResponse { deleted_pods }))
            },
        )
        .await
    }

    async fn get_status(
        &self,
        request: Request<proto::GetStatusRequest>,
    ) -> Result<Response<proto::ApplicationStatus>, Status> {
        self.per_application(
            Method::unary("GetStatus"),
            Access::Read,
            request,
            id_only,
            |mut owner, r| async move { owner.get_status(r).await },
            |call| async move {
                let status = self.applications.application_status(&call.app).await?;
                Ok(Response::new(status_message(status)))
            },
        )
        .await
    }
}
