//! Shard supervision: what this replica has made of each shard it may hold ([`ShardPhase`]:
//! taking it, owning it, draining it, lost to another holder), what a change of a shard's
//! Lease means for its applications ([`Move`]), and what a call for an application not
//! found here answers meanwhile. The registry acts on the moves (`shard_moves`); it only
//! looks applications up.
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::error::AppError;
use super::types::AppId;
use crate::ha::{Ownerships, ShardState, shards::Shard};

/// What the supervisor has made of one shard, from its first known state on. Each phase
/// keeps the epoch of the last taking of the shard acted on to the end (`None`: never held
/// since start-up): a shard held at another epoch is still being taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ShardPhase {
    /// Held at `epoch`: its stale actors being let go and its registrations resumed.
    Taking { epoch: i32, taken: Option<i32> },
    /// Held at `epoch`, acted on: its applications run here.
    Owned { epoch: i32 },
    /// Being handed to another replica: its actors stop, then the Lease is released.
    Draining { taken: Option<i32> },
    /// Held by another replica (its applications let go), or not held here yet.
    Lost { taken: Option<i32> },
}

impl ShardPhase {
    /// The phase of a shard's first known state (start-up resumes the shards held then).
    fn first(state: &ShardState) -> Self {
        match state {
            ShardState::Owned(owned) => Self::Owned { epoch: owned.epoch },
            ShardState::Draining(_) => Self::Draining { taken: None },
            _ => Self::Lost { taken: None },
        }
    }

    /// The epoch of the last taking acted on to the end.
    fn taken(self) -> Option<i32> {
        match self {
            Self::Taking { taken, .. } | Self::Draining { taken } | Self::Lost { taken } => taken,
            Self::Owned { epoch } => Some(epoch),
        }
    }
}

/// What a change of a shard's Lease means for its applications.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Move {
    /// Taken at `epoch`: actors of other epochs let go (another replica may have acted in
    /// between), then its registrations resumed.
    Take { epoch: i32 },
    /// Handed to another replica: the actors stop while the fences still pass (each writes
    /// its registration's last change), then the keeper releases the Lease.
    Drain { epoch: i32 },
    /// Another replica holds it: it resumes the applications; they are let go here.
    LetGo,
    /// Lapsed, or the Lease cannot be read: the actors stay, their writes refused by their
    /// fences, and go on if the shard is renewed at the same epoch (no one else held it in
    /// between); they are let go as soon as another holder is seen.
    Keep,
}

impl Move {
    pub(super) fn of(state: &ShardState) -> Self {
        match state {
            ShardState::Owned(owned) => Self::Take { epoch: owned.epoch },
            ShardState::Draining(owned) => Self::Drain { epoch: owned.epoch },
            ShardState::NotOwned {
                holder: Some(_), ..
            } => Self::LetGo,
            _ => Self::Keep,
        }
    }
}

/// The supervision of this replica's shards: each shard's phase, which epochs' registrations
/// have been resumed, which must be resumed again, and the Lease keepers.
pub(super) struct ShardSupervisor {
    /// The shards this replica holds.
    pub(super) ownerships: Ownerships,
    /// Each shard's phase, once the supervisor has seen its first state.
    phases: Mutex<HashMap<Shard, ShardPhase>>,
    /// Per shard, the epoch whose registrations have been resumed here (held while a
    /// shard is resumed, so two resumes of one shard never run together).
    pub(super) resumed: tokio::sync::Mutex<HashMap<Shard, i32>>,
    /// Resumes of registrations under way (counted from the moment one has shards due):
    /// while one runs, any shard held may be the one it resumes.
    resumes_running: AtomicUsize,
    /// Shards held here whose last resume failed or left an application out (the
    /// registrations unreadable, a 429 or 5xx as one started): resumed again every retry
    /// period, and until then a call for an application not found here is UNAVAILABLE,
    /// never NOT_FOUND (which a driver takes for its application's end).
    pub(super) unresumed: Mutex<BTreeSet<Shard>>,
    /// The keepers of this replica's shard Leases: released at shutdown, and stopped with
    /// the registry (its Leases then expire).
    keepers: Mutex<Option<ShardKeepers>>,
    /// The last shard drained for another replica or lost to one, and when.
    handed_over: Mutex<Option<(Shard, Instant)>>,
}

impl ShardSupervisor {
    pub(super) fn new(ownerships: Ownerships) -> Self {
        Self {
            ownerships,
            phases: Mutex::new(HashMap::new()),
            resumed: tokio::sync::Mutex::new(HashMap::new()),
            resumes_running: AtomicUsize::new(0),
            unresumed: Mutex::new(BTreeSet::new()),
            keepers: Mutex::new(None),
            handed_over: Mutex::new(None),
        }
    }

    pub(super) fn hold_keepers(&self, keepers: ShardKeepers) {
        *lock_registry(&self.keepers) = Some(keepers);
    }

    /// Releases the shards' Leases (another replica takes them at once).
    pub(super) async fn release_keepers(&self) {
        let keepers = lock_registry(&self.keepers).take();
        if let Some(keepers) = keepers {
            keepers.release().await;
        }
    }

    /// Notes the first known state of `shard`.
    pub(super) fn first_seen(&self, shard: Shard, state: &ShardState) {
        lock_registry(&self.phases).insert(shard, ShardPhase::first(state));
    }

    /// Moves `shard` to the phase `next` makes of the last taking acted on.
    pub(super) fn enter(&self, shard: Shard, next: impl FnOnce(Option<i32>) -> ShardPhase) {
        let mut phases = lock_registry(&self.phases);
        let taken = phases.get(&shard).and_then(|phase| phase.taken());
        phases.insert(shard, next(taken));
    }

    /// Notes `shard` handed to another replica now (drained for it, or lost to it).
    pub(super) fn handed_over(&self, shard: Shard) {
        *lock_registry(&self.handed_over) = Some((shard, Instant::now()));
    }

    /// A resume of registrations counted as running while the guard lives.
    pub(super) fn resume_running(&self) -> ResumeRunning<'_> {
        ResumeRunning::new(&self.resumes_running)
    }

    /// The shards held here now, with their epochs.
    pub(super) fn owned(&self) -> impl Iterator<Item = (Shard, i32)> + '_ {
        let ownerships = &self.ownerships;
        ownerships
            .map()
            .shards()
            .filter_map(|shard| match ownerships.state(shard) {
                ShardState::Owned(owned) => Some((shard, owned.epoch)),
                _ => None,
            })
    }

    /// The unresumed shards held here now, with their epochs; those no longer held are
    /// dropped.
    pub(super) fn unresumed(&self) -> Vec<(Shard, i32)> {
        let ownerships = &self.ownerships;
        let mut unresumed = lock_registry(&self.unresumed);
        unresumed.retain(|shard| matches!(ownerships.state(*shard), ShardState::Owned(_)));
        unresumed
            .iter()
            .filter_map(|shard| match ownerships.state(*shard) {
                ShardState::Owned(owned) => Some((*shard, owned.epoch)),
                _ => None,
            })
            .collect()
    }

    /// What a call for `app`, which does not run here, answers: NOT_FOUND, unless a shard
    /// is changing hands through this replica (it is resuming one just taken, draining
    /// one, or handed one over less than `lease` ago, which the replica forwarding to it
    /// may not have seen yet) or has no holder it knows of: then UNAVAILABLE, retried,
    /// since the application may be that shard's and will answer from its owner in a
    /// moment.
    pub(super) fn not_here(&self, app: &AppId, lease: Duration) -> AppError {
        let handed_over = lock_registry(&self.handed_over)
            .filter(|(_, at)| at.elapsed() < lease)
            .map(|(shard, _)| shard);
        let draining = self
            .ownerships
            .map()
            .shards()
            .find(|shard| matches!(self.ownerships.state(*shard), ShardState::Draining(_)));
        // A shard whose holder this replica does not know (its own ownership lapsed, the
        // Lease unreadable or released, its keeper not through a first turn): its
        // applications may be anywhere, or about to be here.
        let unsettled = self.ownerships.map().shards().find(|shard| {
            matches!(
                self.ownerships.state(*shard),
                ShardState::Unknown | ShardState::NotOwned { holder: None, .. }
            )
        });
        match (self.resuming(), draining.or(handed_over).or(unsettled)) {
            (Some(shard), _) => AppError::Unavailable(format!(
                "this replica has just taken shard {shard} (its Lease {}) and is resuming \
                 its applications",
                shard.lease_name()
            )),
            (None, Some(shard)) => AppError::Unavailable(format!(
                "shard {shard} (its Lease {}) is changing hands; its applications answer \
                 from their owner in a moment",
                shard.lease_name()
            )),
            (None, None) => AppError::NotFound(app.to_string()),
        }
    }

    /// A shard this replica holds while a resume of registrations runs (its applications
    /// are unknown here for a moment): a call for an application not found is then
    /// UNAVAILABLE, retried, not NOT_FOUND.
    fn resuming(&self) -> Option<Shard> {
        if let Some((shard, _)) = self.unresumed().first() {
            return Some(*shard);
        }
        // While a resume runs, any shard held may be the one it resumes. (Not the lock on
        // the resumed shards: calls testing it would see each other hold it.)
        if self.resumes_running.load(Ordering::SeqCst) > 0 {
            return self.owned().map(|(shard, _)| shard).next();
        }
        // Taken at an epoch the supervisor has not finished acting on (it may still be
        // letting the stale actors go, waiting for its turn to resume).
        let phases = lock_registry(&self.phases);
        self.owned()
            .filter(|(shard, epoch)| {
                phases
                    .get(shard)
                    .is_some_and(|phase| phase.taken() != Some(*epoch))
            })
            .map(|(shard, _)| shard)
            .next()
    }
}

/// The shard Lease keepers of a service. Released (handed to another replica at once)
/// once the service has stopped its actors; dropped, they stop renewing and release.
pub struct ShardKeepers {
    release: tokio_util::sync::DropGuard,
    keepers: Vec<tokio::task::JoinHandle<()>>,
}

impl ShardKeepers {
    /// The keepers `tasks`, which stop and release when `release` is cancelled.
    pub fn new(
        release: tokio_util::sync::CancellationToken,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    ) -> Self {
        Self {
            release: release.drop_guard(),
            keepers: tasks,
        }
    }

    async fn release(self) {
        let Self { release, keepers } = self;
        drop(release);
        for keeper in keepers {
            let _ = keeper.await;
        }
    }
}

/// A resume of registrations counted as running while it lives.
pub(super) struct ResumeRunning<'a>(&'a AtomicUsize);

impl<'a> ResumeRunning<'a> {
    fn new(running: &'a AtomicUsize) -> Self {
        running.fetch_add(1, Ordering::SeqCst);
        Self(running)
    }
}

impl Drop for ResumeRunning<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A registry lock, taken even if a holder panicked (the state it guards stays usable).
pub(super) fn lock_registry<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ha::claim::Ownership;

    fn owned(epoch: i32) -> Ownership {
        Ownership {
            epoch,
            valid_until: Instant::now(),
        }
    }

    #[test]
    fn each_lease_change_is_one_move() {
        assert_eq!(
            Move::of(&ShardState::Owned(owned(3))),
            Move::Take { epoch: 3 }
        );
        assert_eq!(
            Move::of(&ShardState::Draining(owned(3))),
            Move::Drain { epoch: 3 }
        );
        let held_by = |holder: Option<&str>| ShardState::NotOwned {
            holder: holder.map(str::to_string),
            address: None,
            error: None,
        };
        assert_eq!(Move::of(&held_by(Some("replica-b"))), Move::LetGo);
        // Lapsed or unreadable: the actors stay, fenced.
        assert_eq!(Move::of(&held_by(None)), Move::Keep);
        assert_eq!(Move::of(&ShardState::Unknown), Move::Keep);
    }

    #[test]
    fn a_shard_is_taken_once_its_taking_is_acted_on_to_the_end() {
        assert_eq!(
            ShardPhase::first(&ShardState::Owned(owned(4))).taken(),
            Some(4)
        );
        assert_eq!(ShardPhase::first(&ShardState::Unknown).taken(), None);
        // Taking epoch 5 after 4: still 4 until the resume is done.
        let taking = ShardPhase::Taking {
            epoch: 5,
            taken: Some(4),
        };
        assert_eq!(taking.taken(), Some(4));
        assert_eq!(ShardPhase::Owned { epoch: 5 }.taken(), Some(5));
        // Drained or lost: the last taking is kept.
        assert_eq!(ShardPhase::Draining { taken: Some(5) }.taken(), Some(5));
        assert_eq!(ShardPhase::Lost { taken: None }.taken(), None);
    }
}
