//! The allocation engine: Spark's executor allocation rules as a pure, deterministic core.
//!
//! It imports neither tonic nor kube's client nor tokio I/O and never sleeps: the caller
//! passes snapshots, targets and the time, and carries out the returned plan.
//!
//! CONTRACT (agreed between the engine, the application actor and the gRPC layer; keep
//! these names and signatures, extend freely):
//! - [`types`]: `ExecutorId(u64)`, `ResourceProfileId(i32)`, `Timestamp` (ms since the
//!   Unix epoch, wall clock, because pod creationTimestamps are wall clock), label names.
//! - [`settings`]: `AllocationSettings` with Spark defaults and `validate()`.
//! - [`state`]: `ExecutorState`, `ExecutorPod`, `StateRules`, `executor_pod_from(&Pod, &StateRules)`.
//! - [`snapshot`]: `ExecutorPodsSnapshot`, `SnapshotStore` (watch updates, resync, subscriber timing).
//! - [`round`]: `Allocator` (one per application) and `RoundPlan`.
//! - [`pod_builder`]: `ExecutorPodBuilder` (template → executor pod).

pub mod pod_builder;
pub mod round;
pub mod settings;
pub mod snapshot;
pub mod state;
mod tracked;
pub mod types;

pub use pod_builder::{DriverOwner, ExecutorPodBuilder, TemplateError};
pub use round::{Allocator, AllocatorStatus, DeleteRequest, ProfileCounts, RoundPlan};
pub use settings::{AllocationSettings, SettingsError};
pub use snapshot::{ExecutorPodsSnapshot, SnapshotBatch, SnapshotStore};
pub use state::{ExecutorPod, ExecutorState, StateRules, executor_pod_from};
pub use types::{ExecutorId, ResourceProfileId, Timestamp};

#[cfg(test)]
mod tests;
