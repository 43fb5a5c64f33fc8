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
//! - `parts`: what Start hands a new actor;
//! - `handle`: the handle; `command`: its commands and the reports it gets back;
//! - `phase`: the application's life as the actor follows it (running, driver ended, ending);
//! - `schedule`: when the actor wakes next;
//! - `serve`: the actor's loop, its commands and reports;
//! - `events`: pod events into the engine state and the feed; `requests`: their timing;
//! - `reclaims`: the executors being given back to a budget's owner; `reclaim`: choosing
//!   them, their RECLAIM events and deletes (at exit or deadline);
//! - `round`: a round's plan into work, and the results of that work;
//! - `work`: the worker and the messages between it and the actor.
mod command;
mod events;
mod handle;
mod parts;
mod phase;
mod reclaim;
mod reclaims;
mod requests;
mod round;
mod schedule;
mod serve;
#[cfg(test)]
mod tests;
mod work;

pub(crate) use command::ActorReport;
pub use command::DriverReport;
pub(crate) use handle::ActorHandle;
pub(crate) use parts::{ActorParts, ApplicationParts, DriverLife, Engine, ForgetHook, Kubernetes};
