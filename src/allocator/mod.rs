//! The allocation engine: Spark's executor allocation rules as a pure, deterministic core.
//!
//! It imports neither tonic nor kube's client nor tokio I/O and never sleeps: the caller
//! passes snapshots, targets and the time, and carries out the returned plan.
//!
//! The parts:
//! - [`types`]: `ExecutorId(u64)`, `ResourceProfileId(i32)`, `Timestamp` (ms since the
//!   Unix epoch, wall clock, because pod creationTimestamps are wall clock), label names.
//! - [`settings`]: `AllocationSettings` with Spark defaults and `validate()`.
//! - [`state`]: `ExecutorState`, `ExecutorPod`, `StateRules`, `executor_pod_from(&Pod, &StateRules)`.
//! - [`snapshot`]: `ExecutorPodsSnapshot`, `SnapshotStore` (watch updates, resync, subscriber
//!   timing). A poll's `SnapshotBatch::latest` is an `Arc<ExecutorPodsSnapshot>` shared with
//!   the store (copy-on-write), so a poll does not copy the snapshot; drop the batch before
//!   the store's next update.
//! - [`engine`]: `Allocator`, one per application: its allocation state and its rounds,
//!   each returning a `RoundPlan`.
//! - [`pod_builder`]: `ExecutorPodBuilder` (template → executor pod).
//! - [`claims`]: per-executor PersistentVolumeClaims: reuse of a free claim, waiting for one.
//! - [`budget`]: beyond Spark, budgets shared by applications: weighted max-min fair
//!   division and the room one application has (`Allocator::round_within` stays in it).
//! - [`stuck`]: beyond Spark, pending pods that will not start (`StartBlocker`): deleted
//!   or reported past `stuck_pending_timeout_ms`.
//!
//! Decisions where the spec leaves room (each has a test):
//! - The store's first poll carries one snapshot (the current one, empty at start), as
//!   Spark's subscriber does; after `notify_now` the next periodic poll is one batch delay
//!   after the notified one.
//! - Batches must be applied in order from one store: the allocator indexes the last
//!   snapshot incrementally from `seen_ids` (ids gone without being seen are caught by size).
//! - A pod without `spark-exec-resourceprofile-id` is in profile 0; a label that does not
//!   parse, or an id of 0, makes it "not an executor". Phases compare case-insensitively.
//!   With "check all containers", a non-zero exit of any container wins over the executor
//!   container's state (Spark's order). Failed without a container exit uses the pod's
//!   status reason and message.
//! - Per-profile pending cap: a profile may ask for at most `cap − its not-running`; a
//!   profile with no room takes no share of `max_pending_pods`, so the split goes to others.
//! - Downscale deletes of all profiles go in one `DeleteRequest` (Spark sends one per profile).
//! - Beyond Spark: a downscale delete that missed its pod (created just after the delete)
//!   is sent again while the pod still shows Pending, at most every 5 batch delays.
//! - Ids seen in any snapshot raise `last_executor_id` (no reuse even after a resume that
//!   under-reported it); refused requests consume no id; at `u64::MAX` requests are refused.
//! - Built pods carry no namespace (the create request's namespace applies) and none of
//!   the template's server-set fields; the driver replaces any controller owner.
//! - Templates may carry Spark's labels (overwritten; `spark-exec-inactive` dropped) and the
//!   placeholders `{{APP_ID}}` / `{{EXECUTOR_ID}}` (substituted per executor where Spark
//!   does). Labels are checked once substituted with the widest id (20 digits).
//! - The executor container and check-all-containers are per application settings
//!   (`AllocationSettings::state_rules`), not service-wide.
//! - The store's clock is wall time: a poll at a time before the last poll is due at once.
//! - Pods count toward the profile in their label even when only one profile has a target
//!   (Spark lumps everything into profile 0 in that case).
//! - Not here, by design: Stop's collection delete, lifecycle reports to the driver (states
//!   carry exit code, reason and message for them), and any backoff for failing creates
//!   (`create_failed` just forgets the request, as Spark does; the service owns retries).
//! - Beyond Spark, opt-in: the ADAPTIVE policy ([`adaptive`]) bounds the requests not yet
//!   seen by a window fed by `creates_answered` instead of `batch_size` per round.

pub mod adaptive;
pub mod budget;
pub mod claims;
pub mod engine;
pub mod id_block;
pub mod pod_builder;
pub mod pod_policy;
pub mod settings;
pub mod snapshot;
pub mod start_blocker;
pub mod state;
pub mod stuck;
mod tracked;
pub mod types;

pub use adaptive::{CreateOutcomes, CreateRefusal, CreateWindow};
pub use budget::{BudgetClaim, BudgetLimits, BudgetResource, ExecutorCost};
pub use claims::{ClaimRules, ExecutorClaims, ListedClaim, WaitForClaim};
pub use engine::{
    ADAPTIVE_PACE_PER_BATCH_DELAY, AllocationUse, Allocator, AllocatorStatus, DeleteRequest,
    ProfileCounts, RoundPlan,
};
pub use id_block::IdBlocks;
pub use pod_builder::{DriverOwner, ExecutorPodBuilder, TemplateError};
pub use settings::{AllocationPolicy, AllocationSettings, SettingsError};
pub use snapshot::{ExecutorPodsSnapshot, SnapshotBatch, SnapshotStore};
pub use start_blocker::StartBlocker;
pub use state::{ExecutorPod, ExecutorState, StateRules, executor_pod_from};
pub use stuck::StuckExecutor;
pub use types::{ExecutorId, ResourceProfileId, Timestamp, listed};

#[cfg(test)]
mod tests;
