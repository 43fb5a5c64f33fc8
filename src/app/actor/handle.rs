//! The only way into an actor: its handle.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::command::{ActorReport, Command};
use super::parts::ActorParts;
use super::serve::ApplicationActor;
use super::work::{Outbox, Worker};
use crate::allocator::{ExecutorId, ExecutorPodsSnapshot, ResourceProfileId};
use crate::app::error::AppError;
use crate::app::feed::ExecutorEvents;
use crate::k8s::Subscription;

/// Reaches a running actor: the only way to ask it anything.
#[derive(Clone)]
pub(crate) struct ActorHandle {
    tx: mpsc::Sender<Command>,
    task: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
    app_id: String,
    /// Set when the actor is stopped because the application moves to another replica
    /// (its shard let go or handed over): a call that finds it gone is then UNAVAILABLE,
    /// retried and answered by the new owner, not NOT_FOUND, which a driver takes for
    /// its application's end.
    moving: Arc<std::sync::atomic::AtomicBool>,
}

/// Commands queued per actor before senders wait.
const COMMAND_QUEUE: usize = 64;

impl ActorHandle {
    /// Spawns the actor of `parts` and its worker, fed by `subscription`, in a span naming
    /// the application.
    pub fn spawn(parts: ActorParts, subscription: Subscription) -> Self {
        let ActorParts { app, kubernetes } = parts;
        let span = tracing::info_span!(parent: None, "application", app = %app.app_id, namespace = %app.namespace);
        let (work, requests) = mpsc::unbounded_channel();
        let (done, results) = mpsc::unbounded_channel();
        let cancel = CancellationToken::new();
        let metrics = kubernetes.pods.metrics().clone();
        let worker = Worker::new(kubernetes, &app, done, cancel.clone());
        tokio::spawn(worker.run(requests).instrument(span.clone()));
        let actor = ApplicationActor::new(app, metrics, Outbox::new(work, cancel));
        Self::serving(actor, span, move |actor, commands| async move {
            let mut subscription = subscription;
            actor.run(commands, &mut subscription.events, results).await;
        })
    }

    /// Spawns `actor`'s task (`run` its life, given the commands) and hands out its handle.
    pub(super) fn serving<F>(
        actor: ApplicationActor,
        span: tracing::Span,
        run: impl FnOnce(ApplicationActor, mpsc::Receiver<Command>) -> F,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (tx, commands) = mpsc::channel(COMMAND_QUEUE);
        let app_id = actor.app_id().to_string();
        let task = tokio::spawn(run(actor, commands).instrument(span));
        Self {
            tx,
            task: Arc::new(std::sync::Mutex::new(Some(task))),
            app_id,
            moving: Arc::new(std::sync::atomic::AtomicBool::new(false)),
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
        self.update_registered_with_tasks(ids, BTreeMap::new())
            .await
    }

    /// The registered executors with the tasks running on each (by executor id).
    pub async fn update_registered_with_tasks(
        &self,
        ids: BTreeSet<ExecutorId>,
        running_tasks: BTreeMap<ExecutorId, u32>,
    ) -> Result<(), AppError> {
        self.call(|reply| Command::UpdateRegistered(ids, running_tasks, reply))
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
        let events = self
            .call(|reply| Command::WatchExecutors(since, reply))
            .await?;
        Ok(events.noting_moves(Arc::clone(&self.moving)))
    }

    /// Sends a command built around a reply channel and waits for the reply.
    async fn call<R>(
        &self,
        command: impl FnOnce(oneshot::Sender<R>) -> Command,
    ) -> Result<R, AppError> {
        let (reply, answer) = oneshot::channel();
        // The actor ends when the application is stopped or forgotten: a call racing that
        // finds no application, as one made just after it would. One racing a move to
        // another replica is retried there.
        let gone = || {
            if self.moving.load(std::sync::atomic::Ordering::SeqCst) {
                AppError::Unavailable(format!(
                    "application {} is moving to another replica (this one let its shard \
                     go); retry",
                    self.app_id
                ))
            } else {
                AppError::NotFound(self.app_id.clone())
            }
        };
        self.tx.send(command(reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())
    }

    /// As [`Self::stop`], for an application that goes on at another replica: calls that
    /// find the actor gone answer UNAVAILABLE.
    pub async fn stop_moving(&self) {
        self.moving.store(true, std::sync::atomic::Ordering::SeqCst);
        self.stop().await;
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
