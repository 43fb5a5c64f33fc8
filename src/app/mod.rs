//! The applications: [`Applications`] is the registry the gRPC layer calls (`registry`: it
//! looks applications up), one actor per application (`actor`: an `ApplicationActor` task
//! owning its engine state, reached only through its handle). `start` and `stop` are the
//! procedures that register and forget an application; `shards` supervises this replica's
//! shards and `shard_moves` acts on what it decides; `templates` is what a pod template is
//! held to, naming the request field it came in; `limits` the bounds on one request's work;
//! `registration` what a restarted service resumes from; `feed` the executor event
//! streams; `failures` what GetStatus reports of failed creates and executors. This file
//! only declares and re-exports: no module here imports it back.
mod actor;
pub mod budgets;
pub mod error;
pub mod failures;
pub mod feed;
mod first_start;
pub mod limits;
mod options;
pub mod registration;
mod registry;
mod shard_moves;
mod shards;
mod start;
mod stop;
pub mod templates;
pub mod tenants;
mod types;

pub use crate::time::{Clock, ManualClock, SystemClock};
pub use actor::DriverReport;
pub use budgets::{BudgetPolicy, Budgets, HeldBy};
pub use error::AppError;
pub use failures::{CreateFailure, ExecutorFailure, ExecutorProblem};
pub use feed::{EventKind, ExecutorEvent, ExecutorEvents, ExecutorView, Feed};
pub use options::AppSettings;
pub(crate) use options::{KubernetesParts, ServiceContext};
pub use registry::Applications;
pub use shards::ShardKeepers;
pub use tenants::{TenantLimits, Tenants};
pub use types::{AppId, ApplicationStatus, Ownership, Placement, StartApplication, Started};
