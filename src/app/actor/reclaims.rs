//! What an actor keeps of the executors its application gives back to a budget's owner
//! (reclaim), and of the tasks its driver runs on each; `reclaim` acts on it.
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::allocator::{ExecutorId, ResourceProfileId, Timestamp};

/// The executors the application is giving back, and what the driver says of its tasks.
#[derive(Debug, Default)]
pub(super) struct Reclaims {
    /// Asked back, until their pods are gone.
    pub(super) asked: BTreeMap<ExecutorId, Asked>,
    /// Tasks running per registered executor, as the driver last said.
    pub(super) running_tasks: BTreeMap<ExecutorId, u32>,
}

/// One executor asked back.
#[derive(Debug)]
pub(super) struct Asked {
    pub(super) profile: ResourceProfileId,
    pub(super) budget: Arc<str>,
    pub(super) deadline: Timestamp,
    /// Its pod was deleted (it exited, its deadline passed, or it was deleted at once).
    pub(super) deleted: bool,
    /// The driver was asked (a RECLAIM event): a registered executor, under a deadline.
    pub(super) asked_driver: bool,
}

impl Reclaims {
    /// The driver's running tasks per executor (replacing what it said before).
    pub fn set_running_tasks(&mut self, tasks: BTreeMap<ExecutorId, u32>) {
        self.running_tasks = tasks;
    }

    /// Asked back and not deleted yet: still counted in the application's use.
    pub fn giving_back(&self) -> u64 {
        self.asked.values().filter(|a| !a.deleted).count() as u64
    }

    /// The earliest deadline of an executor asked back and not deleted yet.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        (self.asked.values())
            .filter(|a| !a.deleted)
            .map(|a| a.deadline)
            .min()
    }

    /// Executors the driver was asked to give back whose pods are not gone yet, per
    /// profile (GetStatus).
    pub fn per_profile(&self) -> BTreeMap<ResourceProfileId, u32> {
        let mut counts = BTreeMap::new();
        for asked in self.asked.values().filter(|a| a.asked_driver) {
            *counts.entry(asked.profile).or_insert(0u32) += 1;
        }
        counts
    }
}
