//! The allocator's own index of the last snapshot: per profile, the running count and the
//! pending pods. Kept up to date from each batch's changed ids, so a round costs
//! O(changes · log n) instead of a pass over every executor.
use std::collections::{BTreeMap, BTreeSet};

use super::snapshot::SnapshotBatch;
use super::state::{ExecutorPod, ExecutorState};
use super::types::{ExecutorId, ResourceProfileId, Timestamp};

/// What a round needs to know about one executor of the last snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tracked {
    profile: ResourceProfileId,
    kind: Kind,
    created_at: Option<Timestamp>,
}

/// Only Running and Pending executors count toward a target; the rest get replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Running,
    Pending,
    Other,
}

/// One profile's executors in the last snapshot.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProfileIndex {
    /// Running executors, including any the allocator deleted.
    pub(crate) running: u64,
    /// Pending executors (with their creation time), including any the allocator deleted.
    pub(crate) pending: BTreeMap<ExecutorId, Option<Timestamp>>,
}

/// The last snapshot, indexed for rounds.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrackedExecutors {
    executors: BTreeMap<ExecutorId, Tracked>,
    profiles: BTreeMap<ResourceProfileId, ProfileIndex>,
}

impl TrackedExecutors {
    /// Takes over the batch's latest snapshot. Batches must come, in order, from one
    /// [`SnapshotStore`](super::SnapshotStore): every id that changed since the previous
    /// batch is in `seen_ids`; ids that vanished (a resync dropped them) are detected by size.
    pub(crate) fn apply(&mut self, batch: &SnapshotBatch) {
        let latest = &batch.latest.executors;
        if self.executors.is_empty() {
            self.rebuild(latest);
        } else if batch.seen_ids.len() >= latest.len() / 2 {
            self.resync(latest);
        } else {
            for id in &batch.seen_ids {
                match latest.get(id) {
                    Some(pod) => self.track(pod),
                    None => self.untrack(*id),
                }
            }
            if self.executors.len() != latest.len() {
                self.resync(latest);
            }
        }
    }

    /// Brings the index in line with `latest` by one ordered walk of both, touching only
    /// what differs (a resync usually changes little).
    fn resync(&mut self, latest: &BTreeMap<ExecutorId, ExecutorPod>) {
        let mut changed: Vec<&ExecutorPod> = Vec::new();
        let mut removed: Vec<ExecutorId> = Vec::new();
        let mut old = self.executors.iter().peekable();
        for pod in latest.values() {
            while let Some((id, _)) = old.next_if(|(id, _)| **id < pod.id) {
                removed.push(*id);
            }
            match old.next_if(|(id, _)| **id == pod.id) {
                Some((_, tracked)) if *tracked == tracked_of(pod) => {}
                _ => changed.push(pod),
            }
        }
        removed.extend(old.map(|(id, _)| *id));
        for id in removed {
            self.untrack(id);
        }
        for pod in changed {
            self.track(pod);
        }
    }

    /// Builds the index from scratch in one ordered pass (bulk-loaded maps, no rebalancing).
    fn rebuild(&mut self, latest: &BTreeMap<ExecutorId, ExecutorPod>) {
        let mut running: BTreeMap<ResourceProfileId, u64> = BTreeMap::new();
        let mut pending: BTreeMap<ResourceProfileId, Vec<(ExecutorId, Option<Timestamp>)>> =
            BTreeMap::new();
        self.executors = latest
            .values()
            .map(|pod| {
                let tracked = tracked_of(pod);
                match tracked.kind {
                    Kind::Running => *running.entry(pod.profile).or_insert(0) += 1,
                    Kind::Pending => pending
                        .entry(pod.profile)
                        .or_default()
                        .push((pod.id, pod.created_at)),
                    Kind::Other => {}
                }
                (pod.id, tracked)
            })
            .collect();
        self.profiles = running
            .keys()
            .chain(pending.keys())
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|profile| {
                let index = ProfileIndex {
                    running: running.get(&profile).copied().unwrap_or(0),
                    pending: pending
                        .remove(&profile)
                        .unwrap_or_default()
                        .into_iter()
                        .collect(),
                };
                (profile, index)
            })
            .collect();
    }

    fn track(&mut self, pod: &ExecutorPod) {
        let tracked = tracked_of(pod);
        match self.executors.insert(pod.id, tracked) {
            Some(old) if old == tracked => return,
            Some(old) => self.account(pod.id, old, false),
            None => {}
        }
        self.account(pod.id, tracked, true);
    }

    fn untrack(&mut self, id: ExecutorId) {
        if let Some(old) = self.executors.remove(&id) {
            self.account(id, old, false);
        }
    }

    fn account(&mut self, id: ExecutorId, tracked: Tracked, add: bool) {
        if tracked.kind == Kind::Other {
            return;
        }
        let profile = self.profiles.entry(tracked.profile).or_default();
        match (tracked.kind, add) {
            (Kind::Running, true) => profile.running += 1,
            (Kind::Running, false) => profile.running = profile.running.saturating_sub(1),
            (_, true) => {
                profile.pending.insert(id, tracked.created_at);
            }
            (_, false) => {
                profile.pending.remove(&id);
            }
        }
    }

    /// Whether the last snapshot shows `id` Pending.
    pub(crate) fn is_pending(&self, id: ExecutorId) -> bool {
        self.executors
            .get(&id)
            .is_some_and(|t| t.kind == Kind::Pending)
    }

    /// Whether the last snapshot holds `id` (in any state).
    pub(crate) fn contains(&self, id: ExecutorId) -> bool {
        self.executors.contains_key(&id)
    }

    /// The highest id in the last snapshot.
    pub(crate) fn highest_id(&self) -> Option<ExecutorId> {
        self.executors.last_key_value().map(|(id, _)| *id)
    }

    /// One profile's index (empty if it has no executors).
    pub(crate) fn profile(&self, profile: ResourceProfileId) -> Option<&ProfileIndex> {
        self.profiles.get(&profile)
    }

    /// Running executors among `ids`, per profile (to leave deleted ones out of the counts).
    pub(crate) fn running_among<'a>(
        &self,
        ids: impl Iterator<Item = &'a ExecutorId>,
    ) -> BTreeMap<ResourceProfileId, u64> {
        self.among(ids, Kind::Running)
    }

    /// Pending executors among `ids`, per profile (to leave deleted ones out of the counts).
    pub(crate) fn pending_among<'a>(
        &self,
        ids: impl Iterator<Item = &'a ExecutorId>,
    ) -> BTreeMap<ResourceProfileId, u64> {
        self.among(ids, Kind::Pending)
    }

    /// Every profile with an index (some may have dropped back to no executors).
    pub(crate) fn profiles(&self) -> impl Iterator<Item = (ResourceProfileId, &ProfileIndex)> {
        self.profiles.iter().map(|(rp, index)| (*rp, index))
    }

    fn among<'a>(
        &self,
        ids: impl Iterator<Item = &'a ExecutorId>,
        kind: Kind,
    ) -> BTreeMap<ResourceProfileId, u64> {
        let mut counts = BTreeMap::new();
        for id in ids {
            if let Some(t) = self.executors.get(id).filter(|t| t.kind == kind) {
                *counts.entry(t.profile).or_insert(0) += 1;
            }
        }
        counts
    }
}

fn tracked_of(pod: &ExecutorPod) -> Tracked {
    let kind = match pod.state {
        ExecutorState::Running => Kind::Running,
        ExecutorState::Pending => Kind::Pending,
        _ => Kind::Other,
    };
    Tracked {
        profile: pod.profile,
        kind,
        created_at: pod.created_at,
    }
}
