//! What this replica owns now, as its shard keepers publish it ([`Ownerships`]), and the
//! [`Fence`] every write of an application passes right before it is sent: a write goes
//! out only while the replica still holds the application's shard at the epoch the
//! application was started under.
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};

use super::claim::Ownership;
use super::shards::{Shard, ShardMap};

/// One shard as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardState {
    /// Its keeper has not finished a first turn yet.
    Unknown,
    /// This replica holds it, with this epoch, until `valid_until` unless it renews.
    Owned(Ownership),
    /// This replica holds it still but is handing it to another (rebalancing): its
    /// actors stop (their last writes pass the fences they have) and no new fence is
    /// given; once they have stopped ([`Ownerships::drained`]) the Lease is released.
    Draining(Ownership),
    /// Another replica holds it (`holder`, reachable at `address` when it advertises
    /// one), or this one could not read or win its Lease (`error`: why, when a request
    /// failed).
    NotOwned {
        holder: Option<String>,
        address: Option<String>,
        error: Option<String>,
    },
}

impl ShardState {
    /// Not owned, by nobody known.
    pub fn not_owned() -> Self {
        Self::NotOwned {
            holder: None,
            address: None,
            error: None,
        }
    }
}

/// Another replica that holds a shard now, and where it serves.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    pub identity: String,
    pub address: String,
}

/// Who acts on a shard's applications now, as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardOwner {
    /// This replica.
    Here,
    /// Another replica, reachable at its advertised address.
    Peer(Peer),
    /// Nobody known to be reachable: the shard is changing hands, its keeper has not
    /// finished a first turn, or its holder advertises no address (`holder`).
    Unknown { holder: Option<String> },
}

/// This replica's shards: the map every replica shares and each shard's published state.
#[derive(Clone)]
pub struct Ownerships {
    map: ShardMap,
    identity: Arc<str>,
    states: Arc<Vec<watch::Receiver<ShardState>>>,
    /// Per shard, wakes its keeper for a turn now (a call found the Lease unreachable).
    pokes: Arc<Vec<Arc<Notify>>>,
    /// Per shard, the epoch whose actors have stopped for a drain: its keeper then
    /// releases the Lease.
    drained: Arc<Vec<watch::Sender<Option<i32>>>>,
}

/// A write refused here because this replica does not own the application's shard (any
/// more, or at that epoch). Never sent, so never retried.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "this replica does not own shard {shard} (its Lease {lease}){}{}; \
     the owner acts on its applications",
    holder.as_ref().map(|h| format!(", held by {h}")).unwrap_or_default(),
    error.as_ref().map(|e| format!(": the Lease cannot be read or written: {e}")).unwrap_or_default(),
    lease = shard.lease_name()
)]
pub struct NotOwner {
    pub shard: Shard,
    pub holder: Option<String>,
    /// Why the Lease could not be had, when a request failed.
    pub error: Option<String>,
}

impl Ownerships {
    /// The shards of `map`, each state from its keeper (`states[n]` for shard `n`).
    /// `pokes[n]` wakes shard `n`'s keeper.
    pub fn new(
        map: ShardMap,
        identity: &str,
        states: Vec<watch::Receiver<ShardState>>,
        pokes: Vec<Arc<Notify>>,
    ) -> Self {
        let drained = map.shards().map(|_| watch::Sender::new(None)).collect();
        Self {
            map,
            identity: identity.into(),
            states: Arc::new(states),
            pokes: Arc::new(pokes),
            drained: Arc::new(drained),
        }
    }

    /// Says that the actors of `shard` held at `epoch` have stopped for its drain.
    pub fn drained(&self, shard: Shard, epoch: i32) {
        if let Some(tx) = usize::try_from(shard.0)
            .ok()
            .and_then(|n| self.drained.get(n))
        {
            tx.send_replace(Some(epoch));
        }
    }

    /// Signals its drains through `drained` (`drained[n]` for shard `n`), which the
    /// shards' keepers wait on before they release.
    pub fn with_drains(mut self, drained: Vec<watch::Sender<Option<i32>>>) -> Self {
        self.drained = Arc::new(drained);
        self
    }

    /// This replica's name in the Leases.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The shard map.
    pub fn map(&self) -> ShardMap {
        self.map.clone()
    }

    /// The shard of `namespace`.
    pub fn shard_of(&self, namespace: &str) -> Shard {
        self.map.shard_of(namespace)
    }

    /// What this replica knows of `shard` now.
    pub fn state(&self, shard: Shard) -> ShardState {
        match self.receiver(shard) {
            Some(rx) => rx.borrow().clone(),
            None => ShardState::not_owned(),
        }
    }

    /// Who acts on `shard` now.
    pub fn owner(&self, shard: Shard) -> ShardOwner {
        match self.state(shard) {
            ShardState::Owned(owned) if owned.is_valid(Instant::now()) => ShardOwner::Here,
            // Changing hands: its applications are stopping here, the next owner has not
            // taken it yet.
            ShardState::Draining(_) => ShardOwner::Unknown {
                holder: Some(self.identity.to_string()),
            },
            ShardState::NotOwned {
                holder: Some(identity),
                address: Some(address),
                ..
            } if identity != *self.identity => ShardOwner::Peer(Peer { identity, address }),
            ShardState::NotOwned { holder, .. } => ShardOwner::Unknown { holder },
            _ => ShardOwner::Unknown { holder: None },
        }
    }

    /// Who acts on `shard`, after trying its Lease again at once (waiting at most `retry`)
    /// when its keeper's last request failed: the API server may be back.
    pub async fn owner_now(&self, shard: Shard, retry: Duration) -> ShardOwner {
        let failed = matches!(
            self.state(shard),
            ShardState::NotOwned { error: Some(_), .. }
        );
        if failed
            && let (Some(poke), Some(rx)) = (self.pokes.get(shard.0 as usize), self.receiver(shard))
        {
            let mut rx = rx.clone();
            rx.borrow_and_update();
            poke.notify_one();
            let _ = tokio::time::timeout(retry, rx.changed()).await;
        }
        self.owner(shard)
    }

    /// Every shard with its changes, for whoever acts on them.
    pub fn receivers(&self) -> Vec<(Shard, watch::Receiver<ShardState>)> {
        self.map
            .shards()
            .filter_map(|shard| Some((shard, self.receiver(shard)?.clone())))
            .collect()
    }

    /// Waits (at most `bound`) until every keeper has finished its first turn.
    pub async fn settled(&self, bound: Duration) {
        let all = async {
            for (_, mut rx) in self.receivers() {
                let _ = rx.wait_for(|state| *state != ShardState::Unknown).await;
            }
        };
        let _ = tokio::time::timeout(bound, all).await;
    }

    /// The fence of `namespace`'s applications when this replica owns its shard now;
    /// waits (at most `bound`) for a keeper that has not finished its first turn. A shard
    /// not owned because its Lease could not be read or written is tried again at once
    /// (waiting at most `retry` for it): the API server may be back.
    pub async fn fence(
        &self,
        namespace: &str,
        bound: Duration,
        retry: Duration,
    ) -> Result<Fence, NotOwner> {
        let shard = self.shard_of(namespace);
        let not_owner = |holder, error| NotOwner {
            shard,
            holder,
            error,
        };
        let Some(rx) = self.receiver(shard) else {
            return Err(not_owner(None, None));
        };
        let mut rx = rx.clone();
        let _ =
            tokio::time::timeout(bound, rx.wait_for(|state| *state != ShardState::Unknown)).await;
        let failed = matches!(&*rx.borrow(), ShardState::NotOwned { error: Some(_), .. });
        if failed && let Some(poke) = self.pokes.get(shard.0 as usize) {
            poke.notify_one();
            let _ = tokio::time::timeout(
                retry.min(bound),
                rx.wait_for(|state| matches!(state, ShardState::Owned(_))),
            )
            .await;
        }
        let state = rx.borrow().clone();
        match state {
            ShardState::Owned(owned) if owned.is_valid(Instant::now()) => Ok(Fence {
                shard,
                shards: self.map.count(),
                epoch: owned.epoch,
                state: rx,
            }),
            ShardState::NotOwned { holder, error, .. } => Err(not_owner(holder, error)),
            ShardState::Draining(_) => Err(not_owner(
                Some(self.identity.to_string()),
                Some("the shard is being handed to another replica".into()),
            )),
            _ => Err(not_owner(None, None)),
        }
    }

    fn receiver(&self, shard: Shard) -> Option<&watch::Receiver<ShardState>> {
        usize::try_from(shard.0)
            .ok()
            .and_then(|index| self.states.get(index))
    }
}

/// The right to write for one application: its shard, held at `epoch`. Checked right
/// before each request is sent (after its rate-limit wait), so a replica that lost the
/// shard, or lost and won it again (another replica may have acted in between), sends
/// nothing more.
#[derive(Debug, Clone)]
pub struct Fence {
    shard: Shard,
    /// How many shards there are (`ha.shards`): epochs compare only within one layout.
    shards: u32,
    epoch: i32,
    state: watch::Receiver<ShardState>,
}

impl Fence {
    /// A fence that always passes, for a service of one replica without Leases (tests of
    /// the engine's wiring that run no keeper).
    pub fn unfenced() -> Self {
        let (_, state) = watch::channel(ShardState::Owned(Ownership {
            epoch: 0,
            valid_until: far_future(),
        }));
        Self {
            shard: Shard(0),
            shards: 1,
            epoch: 0,
            state,
        }
    }

    /// Ok while this replica still holds the shard at the fence's epoch.
    pub fn check(&self) -> Result<(), NotOwner> {
        match &*self.state.borrow() {
            // A draining shard's actors still write their last changes.
            ShardState::Owned(owned) | ShardState::Draining(owned)
                if owned.epoch == self.epoch && owned.is_valid(Instant::now()) =>
            {
                Ok(())
            }
            ShardState::NotOwned { holder, error, .. } => Err(NotOwner {
                shard: self.shard,
                holder: holder.clone(),
                error: error.clone(),
            }),
            _ => Err(NotOwner {
                shard: self.shard,
                holder: None,
                error: None,
            }),
        }
    }

    /// True while the shard is held at the fence's epoch and not being handed over: an
    /// application registered once its shard drains would escape the drain's sweep.
    pub fn is_current(&self) -> bool {
        matches!(&*self.state.borrow(),
            ShardState::Owned(owned) if owned.epoch == self.epoch && owned.is_valid(Instant::now()))
    }

    /// The shard it fences.
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// The epoch (the shard Lease's `leaseTransitions`) it was taken at.
    pub fn epoch(&self) -> i32 {
        self.epoch
    }

    /// What the owner's writes of a record carry: its shard (of how many) and epoch.
    pub fn owner_epoch(&self) -> OwnerEpoch {
        OwnerEpoch {
            shard: self.shard.0,
            shards: self.shards,
            epoch: self.epoch,
        }
    }
}

/// The epoch an owner writes into the records it keeps (`<epoch>@<shard>/<shards>`), so
/// a record written by a newer owner of the shard refuses an older one's write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerEpoch {
    pub shard: u32,
    pub shards: u32,
    pub epoch: i32,
}

impl OwnerEpoch {
    /// Parses what [`std::fmt::Display`] wrote; `None` for anything else.
    pub fn parse(value: &str) -> Option<Self> {
        let (epoch, layout) = value.split_once('@')?;
        let (shard, shards) = layout.split_once('/')?;
        Some(Self {
            shard: shard.parse().ok()?,
            shards: shards.parse().ok()?,
            epoch: epoch.parse().ok()?,
        })
    }

    /// True when `self` was written by a later owner of the same shard than `other`
    /// (epochs of different shard layouts do not compare).
    pub fn supersedes(&self, other: &OwnerEpoch) -> bool {
        self.shard == other.shard && self.shards == other.shards && self.epoch > other.epoch
    }
}

impl std::fmt::Display for OwnerEpoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}/{}", self.epoch, self.shard, self.shards)
    }
}

fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(epoch: i32, for_secs: u64) -> ShardState {
        ShardState::Owned(Ownership {
            epoch,
            valid_until: Instant::now() + Duration::from_secs(for_secs),
        })
    }

    #[tokio::test]
    async fn a_fence_passes_only_while_the_shard_is_held_at_its_epoch() {
        let (tx, rx) = watch::channel(ShardState::Unknown);
        let ownerships = Ownerships::new(
            ShardMap::new(1).unwrap(),
            "a",
            vec![rx],
            vec![Arc::default()],
        );
        tx.send_replace(owned(3, 10));
        let fence = ownerships
            .fence("ns", Duration::from_millis(10), Duration::from_millis(10))
            .await
            .expect("owned");
        assert_eq!((fence.shard(), fence.epoch()), (Shard(0), 3));
        assert!(fence.check().is_ok());
        // Lost and won again: another replica may have acted in between.
        tx.send_replace(owned(4, 10));
        assert!(fence.check().is_err());
        tx.send_replace(ShardState::NotOwned {
            holder: Some("b".into()),
            address: None,
            error: None,
        });
        let err = fence.check().unwrap_err();
        assert_eq!(err.holder.as_deref(), Some("b"));
        assert!(
            err.to_string().contains("spark-pod-allocator-shard-0"),
            "{err}"
        );
        assert!(
            ownerships
                .fence("ns", Duration::from_millis(10), Duration::from_millis(10))
                .await
                .is_err()
        );
        // Lapsed: past its renew deadline, even if nothing was published yet.
        tx.send_replace(owned(5, 0));
        assert!(
            ownerships
                .fence("ns", Duration::from_millis(10), Duration::from_millis(10))
                .await
                .is_err()
        );
    }

    #[test]
    fn owner_epochs_compare_within_one_shard_layout_only() {
        let at = |epoch, shard, shards| OwnerEpoch {
            shard,
            shards,
            epoch,
        };
        let written = at(4, 2, 8);
        assert_eq!(written.to_string(), "4@2/8");
        assert_eq!(OwnerEpoch::parse("4@2/8"), Some(written));
        assert_eq!(OwnerEpoch::parse("four"), None);
        assert!(written.supersedes(&at(3, 2, 8)));
        assert!(!written.supersedes(&at(4, 2, 8)));
        assert!(!written.supersedes(&at(0, 2, 4)), "another layout");
    }

    #[tokio::test]
    async fn a_fence_waits_for_the_first_turn_of_its_keeper() {
        let (tx, rx) = watch::channel(ShardState::Unknown);
        let ownerships = Ownerships::new(
            ShardMap::new(1).unwrap(),
            "a",
            vec![rx],
            vec![Arc::default()],
        );
        let waiting = tokio::spawn({
            let ownerships = ownerships.clone();
            async move {
                ownerships
                    .fence("ns", Duration::from_secs(10), Duration::from_millis(10))
                    .await
            }
        });
        tokio::task::yield_now().await;
        tx.send_replace(owned(0, 10));
        assert!(waiting.await.unwrap().is_ok());
    }
}
