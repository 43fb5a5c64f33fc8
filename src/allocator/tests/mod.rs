//! Unit tests of the engine, one module per concern, on a manual clock (plain `Timestamp`s).
use std::collections::{BTreeMap, BTreeSet};

use super::*;

mod adaptive;
mod budgets;
mod claims;
mod deleted_set;
mod downscale;
mod gang;
mod id_blocks;
mod max_executors;
mod pending_caps;
mod pod_builder;
mod pod_policy;
mod pod_state;
mod profile_templates;
mod profiles;
mod properties;
mod round_basics;
mod settings;
mod snapshot_store;
mod stuck_pods;
mod timeouts;
mod tracked;

/// Test time: seconds on the manual clock, as engine milliseconds.
pub(crate) fn secs(s: i64) -> Timestamp {
    Timestamp(s * 1000)
}

pub(crate) fn rp(n: i32) -> ResourceProfileId {
    ResourceProfileId(n)
}

pub(crate) fn ids(ns: &[u64]) -> Vec<ExecutorId> {
    ns.iter().map(|n| ExecutorId(*n)).collect()
}

/// An executor pod of `profile` in `state`, created at `created` (seconds).
pub(crate) fn exec(id: u64, profile: i32, state: ExecutorState, created: i64) -> ExecutorPod {
    ExecutorPod {
        id: ExecutorId(id),
        profile: ResourceProfileId(profile),
        state,
        created_at: Some(secs(created)),
        pod_name: format!("app-exec-{id}"),
        start_blocker: None,
    }
}

pub(crate) fn pending(id: u64, profile: i32, created: i64) -> ExecutorPod {
    exec(id, profile, ExecutorState::Pending, created)
}

pub(crate) fn running(id: u64, profile: i32, created: i64) -> ExecutorPod {
    exec(id, profile, ExecutorState::Running, created)
}

/// A batch holding one snapshot with exactly `pods` (as after a full resync).
pub(crate) fn snapshot(pods: &[ExecutorPod]) -> SnapshotBatch {
    SnapshotBatch {
        snapshot_count: 1,
        seen_ids: pods.iter().map(|p| p.id).collect(),
        latest: std::sync::Arc::new(ExecutorPodsSnapshot {
            executors: pods.iter().map(|p| (p.id, p.clone())).collect(),
            full_resync_at: Timestamp(0),
        }),
    }
}

/// A batch with no snapshot at all (a tick where nothing changed).
pub(crate) fn no_snapshot() -> SnapshotBatch {
    SnapshotBatch::default()
}

pub(crate) fn targets(pairs: &[(i32, u32)]) -> BTreeMap<ResourceProfileId, u32> {
    pairs
        .iter()
        .map(|(p, t)| (ResourceProfileId(*p), *t))
        .collect()
}

pub(crate) fn registered(ns: &[u64]) -> BTreeSet<ExecutorId> {
    ns.iter().map(|n| ExecutorId(*n)).collect()
}

/// Spark's defaults, its policy asked for explicitly (the default policy is ADAPTIVE): these
/// tests mean Spark's exact pacing.
pub(crate) fn settings() -> AllocationSettings {
    AllocationSettings {
        policy: AllocationPolicy::Spark,
        ..AllocationSettings::default()
    }
}

/// Settings with the batch size and caps given, Spark defaults otherwise (its policy too).
pub(crate) fn settings_with(
    batch_size: u32,
    max_pending: Option<u32>,
    max_pending_per_profile: Option<u32>,
) -> AllocationSettings {
    AllocationSettings {
        batch_size,
        max_pending_pods: max_pending,
        max_pending_pods_per_profile: max_pending_per_profile,
        ..settings()
    }
}

/// An allocator with `targets`, already past its start round.
pub(crate) fn allocator(settings: AllocationSettings, t: &[(i32, u32)]) -> Allocator {
    let mut a = Allocator::new(settings, 0);
    a.set_targets(&targets(t));
    a
}

/// The (id, profile) pairs of a plan's creates, as plain numbers.
pub(crate) fn creates(plan: &RoundPlan) -> Vec<(u64, i32)> {
    plan.creates.iter().map(|(id, p)| (id.0, p.0)).collect()
}

pub(crate) fn delete(ns: &[u64], only_pending: bool) -> DeleteRequest {
    DeleteRequest {
        ids: ids(ns),
        only_pending,
    }
}
