//! The actor of one application: a tokio task owning its engine state and everything it
//! follows about the application, reached only through its [`ActorHandle`].
//!
//! The actor only computes and answers: it takes commands, pod events (its executors' and
//! its driver pod's) and the results of its Kubernetes work, and runs a round when its
//! [`Scheduler`](schedule::Scheduler) says one is due. Every Kubernetes request (creates,
//! deletes, the id record, the registration, the feed's LIST) is sent by its
//! [`Worker`](work::Worker), a task of its own that answers with [`WorkDone`](work::WorkDone)
//! messages: no command ever waits on the API server, and the actor can be driven through
//! its channels with a manual clock and no Kubernetes at all (see `tests.rs`).
//!
//! - `handle`: the handle and its commands;
//! - `phase`: the application's life as the actor follows it (running, driver ended, ending);
//! - `schedule`: when the actor wakes next;
//! - `serve`: the actor's loop, its commands and reports;
//! - `events`: pod events into the engine state and the feed;
//! - `round`: a round's plan into work, and the results of that work;
//! - `work`: the worker and the messages between it and the actor.
use std::sync::Arc;
use std::time::Duration;

use super::Clock;
use super::feed::Feed;
use super::registration::Registration;
use crate::allocator::{Allocator, ExecutorPodBuilder, IdBlocks, StateRules};
use crate::k8s::id_record::IdRecord;
use crate::k8s::{ExecutorPods, RegistrationStore};

mod events;
mod handle;
mod phase;
mod round;
mod schedule;
mod serve;
#[cfg(test)]
mod tests;
mod work;

pub use handle::DriverReport;
pub(crate) use handle::{ActorHandle, ActorReport};

/// How an actor follows its application's driver pod.
#[derive(Debug, Clone)]
pub(crate) struct DriverLife {
    pub pod_name: String,
    /// How long an application whose driver pod Failed or Succeeded is kept before it is
    /// forgotten (one whose driver pod is deleted is forgotten at once).
    pub grace: Duration,
}

/// Called once when an actor ends because its driver ended: forgets the application.
pub(crate) type ForgetHook = Box<dyn FnOnce() + Send>;

/// The engine state of one application, which only its actor touches (its snapshot store
/// is the feed's: the one executor state, see [`Feed`]).
pub(crate) struct Engine {
    pub allocator: Allocator,
    pub builder: ExecutorPodBuilder,
    pub rules: StateRules,
    /// The ids the id record covers, reserved in blocks.
    pub id_blocks: IdBlocks,
}

/// What Start hands a new actor: what the actor computes with, and what its worker sends
/// Kubernetes requests with (kept apart, so the actor never holds a client).
pub(crate) struct ActorParts {
    pub app: ApplicationParts,
    pub kubernetes: Kubernetes,
}

/// The actor's share of [`ActorParts`]: the engine state it resumes from and where its
/// application lives.
pub(crate) struct ApplicationParts {
    pub app_id: String,
    pub namespace: String,
    pub engine: Engine,
    pub clock: Arc<dyn Clock>,
    /// The driver pod, when Start named one.
    pub driver: Option<DriverLife>,
    /// Forgets the application once its driver ended and the grace period passed.
    pub forget: ForgetHook,
    /// What a restarted service needs to resume the application, kept in Kubernetes.
    pub registration: Registration,
    /// The executor state (with the snapshot store rounds poll), and its WatchExecutors
    /// streams (ended with the actor).
    pub feed: Feed,
}

/// The worker's share of [`ActorParts`]: the clients of the application's Kubernetes objects.
pub(crate) struct Kubernetes {
    pub pods: ExecutorPods,
    /// Where the highest executor id handed out is recorded.
    pub id_record: IdRecord,
    /// Where the registration is written (the service's namespace).
    pub registrations: RegistrationStore,
}
