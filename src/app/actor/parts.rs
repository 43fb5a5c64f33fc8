//! What Start hands a new actor, split between the actor and its worker.
use std::sync::Arc;
use std::time::Duration;

use crate::allocator::{Allocator, ExecutorClaims, ExecutorPodBuilder, IdBlocks, StateRules};
use crate::app::feed::Feed;
use crate::app::registration::Registration;
use crate::k8s::{ExecutorPodClient, IdRecord, RegistrationStore};
use crate::time::Clock;

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
    /// The application's per-executor claims (what reuse reads).
    pub claims: ExecutorClaims,
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
    /// Its place in the budgets' ledger (it leaves when the actor ends).
    pub budget: crate::app::budgets::BudgetMembership,
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
    pub pods: ExecutorPodClient,
    /// Where the highest executor id handed out is recorded.
    pub id_record: IdRecord,
    /// Start found no id record: the first write creates it without reading it.
    pub id_record_absent: bool,
    /// Where the registration is written (the service's namespace).
    pub registrations: RegistrationStore,
}
