//! The shards' Leases (`coordination.k8s.io/v1`) in the lease namespace: reading, creating
//! and renewing them for a [`ShardClaim`], every write under a resourceVersion
//! precondition (a create is refused with 409 if the Lease exists), so two replicas never
//! both believe a write of theirs made them the owner.
//!
//! A replica follows each shard's Lease by a watch of it (by name), not by reading it every
//! retry period: what it does not hold costs it no request at steady state. The watch only
//! stands in for a read; a decision taken on a late event is safe because every write is
//! under the resourceVersion it was taken on (a stale one is refused with 409, then read).
use std::sync::Mutex;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::RequestPolicy;
use crate::ha::ShardState;
use crate::ha::claim::{LeaseTiming, LeaseView, Ownership, ShardClaim, Step, Write};
use crate::ha::rebalance::{self, Answer, Seen};
use crate::ha::shards::Shard;
use crate::lifecycle::{InitHandle, Initialize};

/// Label of every shard Lease the service writes (`kubectl get lease -l …`).
pub const SHARD_LEASE_LABEL: &str = "spark-pod-allocator/shard";

/// Annotation of a shard Lease: where its holder serves gRPC (`ha.advertise_address`), so
/// the other replicas forward its applications' calls there.
pub const ADDRESS_ANNOTATION: &str = "spark-pod-allocator/address";

/// Annotation of a shard Lease: whose address [`ADDRESS_ANNOTATION`] is. An address is
/// believed only for that holder (a Lease written by anyone else may keep an old one).
pub const ADDRESS_HOLDER_ANNOTATION: &str = "spark-pod-allocator/address-holder";

/// Annotation of a shard Lease: the replica that asks for the shard (rebalancing, see
/// [`crate::ha::rebalance`]). Written by the requester under the resourceVersion it read;
/// kept by the holder's renewals and its release, cleared by the holder when the move is
/// not due and by whoever acquires the Lease next.
pub const REQUESTED_BY_ANNOTATION: &str = "spark-pod-allocator/requested-by";

/// Every shard as this replica's keepers last saw it (`None`: not read yet, or its last
/// request failed): what the rebalancing decisions are made from.
#[derive(Clone, Debug)]
pub struct Layout {
    shards: Arc<Mutex<Vec<Option<Seen>>>>,
}

impl Layout {
    /// A layout of `shards` shards, none seen yet.
    pub fn new(shards: u32) -> Self {
        Self {
            shards: Arc::new(Mutex::new(vec![None; shards as usize])),
        }
    }

    fn set(&self, shard: Shard, seen: Option<Seen>) {
        let mut shards = self.lock();
        if let Some(entry) = shards.get_mut(shard.0 as usize) {
            *entry = seen;
        }
    }

    /// Every shard, when every one is known.
    fn complete(&self) -> Option<Vec<Seen>> {
        self.lock().iter().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Seen>>> {
        match self.shards.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// A drain under way: the epoch whose actors are stopping, since when, and for whom.
#[derive(Debug, Clone)]
struct Drain {
    epoch: i32,
    since: Instant,
    to: String,
}

/// Fresh reads and writes after a refused one within a turn: each follows another
/// writer's change, which a process of the same identity may make again.
const SAME_IDENTITY_RETRIES: usize = 3;

/// Releases sent on a fresh read after a refused one: each follows a requester's write,
/// which leaves this replica the holder.
const RELEASE_ATTEMPTS: usize = 3;

/// What one turn of a [`ShardLeaseKeeper`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Turn {
    /// It holds the shard (created, renewed or took over the Lease).
    Holds(Ownership),
    /// Another replica holds it, serving at the address it advertises (if any).
    HeldBy {
        holder: String,
        address: Option<String>,
    },
    /// Its write was refused (409, 404): someone else wrote the Lease first.
    Refused,
    /// Released for `requester`, which alone may take it for now.
    Reserved { requester: String },
    /// The API server did not answer as it should; the ownership lapses by itself.
    Failed(String),
}

/// The shard's Lease as this replica's watch of it last delivered it.
#[derive(Debug, Clone)]
struct Watched {
    /// Counts the deliveries (a change, a deletion, a relisting): a keeper takes in only
    /// what it has not yet.
    generation: u64,
    /// The Lease (`None`: there is none), and when it arrived here.
    lease: Option<Lease>,
    seen_at: Instant,
    /// Listed at least once, and no error since the last delivery: the watch stands in
    /// for a read.
    healthy: bool,
}

impl Watched {
    /// No holder: whoever may take it can do so now.
    fn is_free(&self) -> bool {
        let holder = (self.lease.as_ref())
            .and_then(|lease| lease.spec.as_ref())
            .and_then(|spec| spec.holder_identity.as_deref());
        holder.is_none_or(str::is_empty)
    }
}

/// The watch of one shard's Lease, kept by a task that ends with it. The kube-runtime
/// watcher relists after a 410 and watches again with backoff after an error.
struct LeaseWatch {
    rx: watch::Receiver<Watched>,
    /// The generation the claim last took in.
    taken: u64,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LeaseWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaseWatch {
    fn start(api: Api<Lease>, name: &str, shard: Shard) -> Self {
        let (tx, rx) = watch::channel(Watched {
            generation: 0,
            lease: None,
            seen_at: Instant::now(),
            healthy: false,
        });
        // By name: the chart grants list and watch of the shards' Leases only.
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config).default_backoff());
            // A relisting under way (Init … InitDone): the Lease listed, if any.
            let mut listing: Option<Lease> = None;
            // Warned of a failure since the last delivery: the backoff's retries are not.
            let mut warned = false;
            while let Some(event) = events.next().await {
                let delivered = match event {
                    Ok(watcher::Event::Init) => {
                        listing = None;
                        None
                    }
                    Ok(watcher::Event::InitApply(lease)) => {
                        listing = Some(lease);
                        None
                    }
                    Ok(watcher::Event::InitDone) => Some(listing.take()),
                    Ok(watcher::Event::Apply(lease)) => Some(Some(lease)),
                    Ok(watcher::Event::Delete(_)) => Some(None),
                    Err(err) => {
                        if warned {
                            tracing::debug!(%shard, error = %err, "the shard's Lease watch failed again");
                        } else {
                            tracing::warn!(%shard, error = %err, "the shard's Lease watch failed; the Lease is read every retry period until the watch is back");
                            warned = true;
                        }
                        tx.send_modify(|watched| watched.healthy = false);
                        None
                    }
                };
                if let Some(lease) = delivered {
                    warned = false;
                    tx.send_modify(|watched| {
                        watched.generation += 1;
                        watched.lease = lease;
                        watched.seen_at = Instant::now();
                        watched.healthy = true;
                    });
                }
            }
        });
        Self { rx, taken: 0, task }
    }
}

/// Keeps one shard's Lease for this replica.
pub struct ShardLeaseKeeper {
    api: Api<Lease>,
    shard: Shard,
    name: String,
    claim: ShardClaim,
    timing: LeaseTiming,
    policy: RequestPolicy,
    /// The Lease as last read or written: a write keeps what it does not change
    /// (`acquireTime`, others' labels).
    last_seen: Option<Lease>,
    /// The Lease as this replica last wrote it: the next renewal needs no read first.
    just_written: bool,
    /// Where this replica serves, written into the Lease while it holds it.
    address: Option<String>,
    /// Every shard as this replica sees them, when it rebalances.
    layout: Option<Layout>,
    /// The epoch whose actors have stopped for a drain ([`crate::ha::Ownerships::drained`]).
    drained: Option<watch::Receiver<Option<i32>>>,
    draining: Option<Drain>,
    /// The next renewal clears the request on the Lease (the move is not due).
    withdraw: bool,
    /// The watch of the Lease, when it follows it ([`Self::watching`]); none: it reads it.
    watch: Option<LeaseWatch>,
    /// The next turn reads the Lease whatever the watch says (a write was refused).
    fresh_read: bool,
}

impl ShardLeaseKeeper {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        shard: Shard,
        identity: &str,
        timing: LeaseTiming,
        policy: RequestPolicy,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            shard,
            name: shard.lease_name(),
            claim: ShardClaim::new(identity, timing),
            timing,
            policy,
            last_seen: None,
            just_written: false,
            address: None,
            layout: None,
            drained: None,
            draining: None,
            withdraw: false,
            watch: None,
            fresh_read: false,
        }
    }

    /// Follows the Lease by a watch instead of reading it each turn: a turn takes in what
    /// the watch delivered (as seen when it arrived) and sends nothing unless it writes.
    /// The Lease is still read while the watch has not listed it or has failed since its
    /// last event, and after a refused write.
    pub fn watching(mut self) -> Self {
        self.watch = Some(LeaseWatch::start(self.api.clone(), &self.name, self.shard));
        self
    }

    /// When another's hold of the shard, as last seen, has lasted a whole lease on this
    /// replica's clock.
    pub fn expires_at(&self) -> Option<Instant> {
        self.claim.expires_at()
    }

    /// True while the watch stands in for reads of the Lease.
    pub fn is_following(&self) -> bool {
        (self.watch.as_ref()).is_some_and(|w| w.rx.borrow().healthy)
    }

    /// Takes part in rebalancing: asks for a shard when this replica holds too few of
    /// `layout`, and drains and releases this one when asked and the move is due, once
    /// `drained` says its actors have stopped.
    pub fn rebalancing(
        mut self,
        layout: Layout,
        drained: Option<watch::Receiver<Option<i32>>>,
    ) -> Self {
        self.layout = Some(layout);
        self.drained = drained;
        self
    }

    /// True while this replica drains the shard for another.
    pub fn is_draining(&self) -> bool {
        self.draining.is_some()
    }

    /// Writes `address` (where this replica serves gRPC) into the Lease while it holds it.
    pub fn advertising(mut self, address: Option<String>) -> Self {
        self.address = address;
        self
    }

    /// The ownership at `now`, if this replica may still act on the shard.
    pub fn ownership(&self, now: Instant) -> Option<Ownership> {
        self.claim.ownership(now)
    }

    /// One turn at `now`: take in the Lease ([`Self::observe`]) unless this replica wrote
    /// it last and still owns the shard (one that lapsed, a paused process woken up, reads
    /// it first and so never writes over a newer holder), then create, renew or take it
    /// over when the claim says.
    ///
    /// A write refused because the Lease changed since it was read is tried once more in
    /// the same turn, on a fresh read: the change may have been this replica's own, a
    /// restarted process of the same identity, which keeps the shard.
    pub async fn turn(&mut self, now: Instant) -> Turn {
        let mut turn = self.turn_once(now).await;
        for _ in 0..SAME_IDENTITY_RETRIES {
            if turn != Turn::Refused {
                break;
            }
            turn = self.turn_once(Instant::now()).await;
        }
        turn
    }

    async fn turn_once(&mut self, now: Instant) -> Turn {
        if !(self.just_written && self.claim.ownership(now).is_some())
            && let Err(err) = self.observe(now).await
        {
            return Turn::Failed(err.to_string());
        }
        self.just_written = false;
        let step = self.claim.step(now);
        let requested_by = self.requested_by();
        let seen = match &step {
            Step::Write(Write::Replace {
                acquired: false, ..
            }) => Some(Seen {
                holder: Some(self.claim.identity().to_string()),
                requested_by,
            }),
            Step::HeldBy { holder } => Some(Seen {
                holder: Some(holder.clone()),
                requested_by,
            }),
            Step::Write(_) | Step::Reserved { .. } => Some(Seen {
                holder: None,
                requested_by,
            }),
            Step::Read => None,
        };
        self.note(seen);
        let write = match step {
            Step::Write(write) => write,
            Step::HeldBy { holder } => {
                let annotations = self
                    .last_seen
                    .as_ref()
                    .and_then(|lease| lease.metadata.annotations.as_ref());
                let address = annotations
                    .filter(|a| a.get(ADDRESS_HOLDER_ANNOTATION) == Some(&holder))
                    .and_then(|a| a.get(ADDRESS_ANNOTATION))
                    .cloned();
                if self.asks_for_it() {
                    self.write_request().await;
                }
                return Turn::HeldBy { holder, address };
            }
            Step::Reserved { requester } => return Turn::Reserved { requester },
            Step::Read => return Turn::Failed("the Lease was not read".into()),
        };
        self.withdraw = false;
        if let Write::Replace {
            acquired: false,
            epoch,
            ..
        } = &write
        {
            self.answer_request(*epoch, now);
        }
        let sent_at = now;
        let lease = self.lease_to_write(&write);
        let post = PostParams::default();
        let result = match &write {
            Write::Create => {
                let api = &self.api;
                self.policy.run(|_| api.create(&post, &lease)).await
            }
            Write::Replace { .. } => {
                let (api, name) = (&self.api, self.name.as_str());
                self.policy.run(|_| api.replace(name, &post, &lease)).await
            }
        };
        match result {
            Ok(written) => match view(&written) {
                Some(view) => {
                    self.note(Some(Seen {
                        holder: Some(self.claim.identity().to_string()),
                        requested_by: view.requested_by.clone(),
                    }));
                    self.claim.written(view, sent_at, Instant::now());
                    self.last_seen = Some(written);
                    self.just_written = true;
                    match self.claim.ownership(Instant::now()) {
                        Some(ownership) => Turn::Holds(ownership),
                        None => Turn::Failed("the renewal answered after its deadline".into()),
                    }
                }
                None => {
                    self.claim.refused();
                    Turn::Failed("the API server returned a Lease without a resourceVersion".into())
                }
            },
            Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                self.claim.refused();
                self.fresh_read = true;
                Turn::Refused
            }
            Err(err) => Turn::Failed(err.to_string()),
        }
    }

    /// Takes in the Lease as it is now: what the watch delivered since the last turn when
    /// it is healthy, else a read at `now`. An owner whose renewal lapsed or failed (a
    /// paused process woken up) reads too, as after a refused write: its watch may not
    /// have delivered yet what happened meanwhile, and it writes nothing on a stale view.
    /// A read is linearizable, so the watch's deliveries before it are no newer: they are
    /// skipped.
    async fn observe(&mut self, now: Instant) -> Result<(), kube::Error> {
        let held = (self.last_seen.as_ref())
            .and_then(|lease| lease.spec.as_ref())
            .and_then(|spec| spec.holder_identity.as_deref())
            == Some(self.claim.identity());
        if !self.fresh_read
            && !held
            && let Some(lease_watch) = self.watch.as_mut()
        {
            let watched = lease_watch.rx.borrow_and_update().clone();
            if watched.healthy {
                if watched.generation != lease_watch.taken {
                    lease_watch.taken = watched.generation;
                    self.claim
                        .read(watched.lease.as_ref().and_then(view), watched.seen_at);
                    self.last_seen = watched.lease;
                }
                return Ok(());
            }
        }
        let delivered = self.watch.as_ref().map(|w| w.rx.borrow().generation);
        let lease = self.read().await?;
        self.claim.read(lease.as_ref().and_then(view), now);
        self.last_seen = lease;
        self.fresh_read = false;
        if let (Some(lease_watch), Some(delivered)) = (self.watch.as_mut(), delivered) {
            lease_watch.taken = delivered;
        }
        Ok(())
    }

    /// What to wait on for a change of the Lease that lets this replica take it now (it
    /// was released or deleted), when it follows it by a watch.
    fn freed(&self) -> Option<(watch::Receiver<Watched>, u64)> {
        (self.watch.as_ref()).map(|w| (w.rx.clone(), w.taken))
    }

    /// Who asks for the shard, on the Lease as last seen.
    fn requested_by(&self) -> Option<String> {
        self.last_seen
            .as_ref()
            .and_then(|lease| lease.metadata.annotations.as_ref())
            .and_then(|a| a.get(REQUESTED_BY_ANNOTATION))
            .filter(|r| !r.is_empty())
            .cloned()
    }

    /// Records what this turn saw of the shard for the rebalancing decisions.
    fn note(&self, seen: Option<Seen>) {
        if let Some(layout) = &self.layout {
            layout.set(self.shard, seen);
        }
    }

    /// True when this replica should ask for this shard now.
    fn asks_for_it(&self) -> bool {
        let Some(layout) = self.layout.as_ref().and_then(Layout::complete) else {
            return false;
        };
        rebalance::request(self.claim.identity(), &layout) == Some(self.shard.0 as usize)
    }

    /// Writes this replica's request into the Lease read last (the holder's next renewal
    /// sees it). Refused (409: the Lease changed since) is fine: the next turn decides
    /// again from a fresh read.
    async fn write_request(&mut self) {
        let Some(mut lease) = self.last_seen.clone() else {
            return;
        };
        let identity = self.claim.identity().to_string();
        lease
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(REQUESTED_BY_ANNOTATION.to_string(), identity.clone());
        let (api, name, post) = (&self.api, self.name.as_str(), PostParams::default());
        match self.policy.run(|_| api.replace(name, &post, &lease)).await {
            Ok(written) => {
                tracing::info!(shard = %self.shard, identity, "asked for the shard: this replica holds too few");
                // Not a renewal: the holder's expiry is judged as before.
                self.claim.read(view(&written), Instant::now());
                self.last_seen = Some(written);
                let holder = self.last_seen.as_ref().and_then(|l| l.spec.as_ref());
                let holder = holder.and_then(|spec| spec.holder_identity.clone());
                self.note(Some(Seen {
                    holder,
                    requested_by: Some(identity),
                }));
            }
            Err(err) => {
                tracing::debug!(shard = %self.shard, error = %err, "the request for the shard was not written");
            }
        }
    }

    /// The holder's answer to a request on its Lease, before it renews at `epoch`: start
    /// a drain when the move is due, clear the request when it is not.
    fn answer_request(&mut self, epoch: i32, now: Instant) {
        if self.draining.is_some() {
            return;
        }
        let Some(layout) = self.layout.as_ref().and_then(Layout::complete) else {
            return;
        };
        match rebalance::answer(self.claim.identity(), self.shard.0 as usize, &layout) {
            Some(Answer::Release { to }) => {
                tracing::info!(shard = %self.shard, epoch, requester = %to,
                    "draining the shard for another replica: this one holds more than its share");
                self.draining = Some(Drain {
                    epoch,
                    since: now,
                    to,
                });
            }
            Some(Answer::Withdraw) => self.withdraw = true,
            Some(Answer::Wait) | None => {}
        }
    }

    /// After a turn: the drain ends with the shard lost, or, once the shard's actors have
    /// stopped (or a lease has passed, their writes then refused by their fences), with the
    /// Lease released for the requester. True when it was released.
    async fn finish_drain(&mut self, turn: &Turn, tx: &watch::Sender<ShardState>) -> bool {
        let Some(drain) = self.draining.clone() else {
            return false;
        };
        let held = matches!(turn, Turn::Holds(owned) if owned.epoch == drain.epoch);
        if !held {
            self.draining = None;
            return false;
        }
        // Marked seen: the wait for the next change is for a later ack.
        let drained =
            (self.drained.as_mut()).is_some_and(|rx| *rx.borrow_and_update() == Some(drain.epoch));
        if !drained && Instant::now() < drain.since + self.timing.lease {
            return false;
        }
        // The fences close before the release is sent.
        publish(
            tx,
            ShardState::not_owned(),
            self.shard,
            self.claim.identity(),
        );
        self.draining = None;
        match self.release().await {
            Ok(()) => {
                tracing::info!(shard = %self.shard, requester = %drain.to, drained,
                    "released the shard for another replica");
                self.note(Some(Seen::released_to(&drain.to)));
                true
            }
            Err(err) => {
                tracing::warn!(shard = %self.shard, error = %err, "cannot release the shard's Lease; it expires by itself");
                self.note(None);
                false
            }
        }
    }

    /// Gives the shard up at once (on shutdown), so another replica takes it without
    /// waiting for the Lease to expire: the holder is cleared under the precondition of
    /// the version this replica saw last. A write since that left this replica the holder
    /// at its epoch (a replica asking for the shard, `requested-by`) is read and the
    /// release sent again on it; another holder or epoch leaves nothing to give.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let holds = self.claim.ownership(Instant::now()).is_some();
        self.claim.step_down();
        let Some(mut lease) = self.last_seen.take().filter(|_| holds) else {
            return Ok(());
        };
        let ours = view(&lease).map(|v| (v.holder, v.transitions));
        let (api, name, post) = (&self.api, self.name.as_str(), PostParams::default());
        for _ in 0..RELEASE_ATTEMPTS {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            match self.policy.run(|_| api.replace(name, &post, &lease)).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 409 => match self.read().await? {
                    Some(now) if view(&now).map(|v| (v.holder, v.transitions)) == ours => {
                        lease = now;
                    }
                    _ => return Ok(()),
                },
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    async fn read(&self) -> Result<Option<Lease>, kube::Error> {
        let (api, name) = (&self.api, self.name.as_str());
        self.policy.run(|_| api.get_opt(name)).await
    }

    fn lease_to_write(&self, write: &Write) -> Lease {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let (mut lease, epoch, acquired) = match write {
            Write::Create => (Lease::default(), 0, true),
            Write::Replace {
                resource_version,
                epoch,
                acquired,
            } => {
                let mut lease = self.last_seen.clone().unwrap_or_default();
                lease.metadata.resource_version = Some(resource_version.clone());
                (lease, *epoch, *acquired)
            }
        };
        lease.metadata.name = Some(self.name.clone());
        lease
            .metadata
            .labels
            .get_or_insert_default()
            .insert(SHARD_LEASE_LABEL.to_string(), self.shard.to_string());
        // The previous holder's address goes with its hold.
        let annotations = lease.metadata.annotations.get_or_insert_default();
        // A request is answered by this acquisition, or found not due.
        if acquired || self.withdraw {
            annotations.remove(REQUESTED_BY_ANNOTATION);
        }
        match &self.address {
            Some(address) => {
                annotations.insert(ADDRESS_ANNOTATION.to_string(), address.clone());
                annotations.insert(
                    ADDRESS_HOLDER_ANNOTATION.to_string(),
                    self.claim.identity().to_string(),
                );
            }
            None => {
                annotations.remove(ADDRESS_ANNOTATION);
                annotations.remove(ADDRESS_HOLDER_ANNOTATION);
            }
        }
        let spec = lease.spec.get_or_insert_default();
        spec.holder_identity = Some(self.claim.identity().to_string());
        spec.lease_duration_seconds = i32::try_from(self.timing.lease.as_secs()).ok();
        spec.lease_transitions = Some(epoch);
        if acquired {
            spec.acquire_time = Some(now.clone());
        }
        spec.renew_time = Some(now);
        lease
    }
}

/// What the claim needs of a Lease; `None` without a resourceVersion (not from an API server).
fn view(lease: &Lease) -> Option<LeaseView> {
    let spec = lease.spec.clone().unwrap_or_default();
    let requested_by = (lease.metadata.annotations.as_ref())
        .and_then(|a| a.get(REQUESTED_BY_ANNOTATION))
        .cloned();
    Some(LeaseView {
        renewed: spec.renew_time.as_ref().map(|t| t.0.to_string()),
        requested_by,
        holder: spec.holder_identity,
        duration: std::time::Duration::from_secs(
            u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        ),
        transitions: spec.lease_transitions.unwrap_or(0),
        resource_version: lease.metadata.resource_version.clone()?,
    })
}

/// Runs `keeper` until `cancel`, a turn every retry period (every
/// [`LeaseTiming::renewal`] while it holds the shard; when another's hold expires on this
/// replica's clock; at once when its watch shows another's hold released), publishing the
/// shard's state (and [`ShardState::NotOwned`] as soon as an ownership lapses, even while
/// a request hangs). Writers still check their [`crate::ha::Fence`] right before each
/// write: the published value may be a moment old. On `cancel` the Lease is released.
pub fn spawn_keeper(
    mut keeper: ShardLeaseKeeper,
    cancel: CancellationToken,
    first_turn: Option<InitHandle>,
    poke: Arc<Notify>,
) -> (watch::Receiver<ShardState>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(ShardState::Unknown);
    let task = tokio::spawn(async move {
        // Readiness waits for the first turn: a call never finds the shard not known yet.
        let mut first_turn = first_turn;
        let retry = keeper.timing.retry;
        loop {
            let started = tokio::time::Instant::now();
            let turn = tokio::select! {
                turn = keeper.turn(started.into_std()) => turn,
                () = lapse(&tx) => continue,
                () = cancel.cancelled() => break,
            };
            let next = match &turn {
                Turn::Holds(ownership) if keeper.is_draining() => {
                    Some(ShardState::Draining(*ownership))
                }
                Turn::Holds(ownership) => Some(ShardState::Owned(*ownership)),
                Turn::Reserved { .. } => Some(ShardState::not_owned()),
                Turn::HeldBy { holder, address } => Some(ShardState::NotOwned {
                    holder: Some(holder.clone()),
                    address: address.clone(),
                    error: None,
                }),
                Turn::Refused => Some(ShardState::not_owned()),
                Turn::Failed(why) => {
                    tracing::warn!(shard = %keeper.shard, error = %why, "cannot renew or read the shard's Lease");
                    // An owner stays one until its deadline (`lapse` ends it).
                    let owned =
                        matches!(*tx.borrow(), ShardState::Owned(_) | ShardState::Draining(_));
                    (!owned).then(|| ShardState::NotOwned {
                        holder: None,
                        address: None,
                        error: Some(why.clone()),
                    })
                }
            };
            if let Some(next) = next {
                publish(&tx, next, keeper.shard, keeper.claim.identity());
            }
            drop(first_turn.take());
            keeper.finish_drain(&turn, &tx).await;
            let draining = keeper.is_draining();
            // An owner renews at its own pace; a drain, a failure or a non-owner's read
            // comes again every retry period.
            let wait = match &turn {
                Turn::Holds(_) if !draining => keeper.timing.renewal(),
                _ => retry,
            };
            // Another's hold, seen: a release is taken at once, and its expiry when it
            // comes, not at the next turn.
            let held_by_another = matches!(turn, Turn::HeldBy { .. } | Turn::Reserved { .. });
            let freed = held_by_another.then(|| keeper.freed()).flatten();
            let next = match keeper.expires_at().filter(|_| held_by_another) {
                Some(expiry) => (started + wait).min(expiry.into()),
                None => started + wait,
            };
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = lapse(&tx) => {}
                () = poke.notified() => {}
                () = released(freed) => {}
                // The actors stopped: renew once more, then release.
                () = changed(keeper.drained.as_mut().filter(|_| draining)) => {}
                () = cancel.cancelled() => break,
            }
        }
        // A shutdown, not a lost Lease: no warning.
        if matches!(
            tx.send_replace(ShardState::not_owned()),
            ShardState::Owned(_) | ShardState::Draining(_)
        ) {
            tracing::info!(shard = %keeper.shard, identity = keeper.claim.identity(), "shutting down: this replica releases the shard");
        }
        if let Err(err) = keeper.release().await {
            tracing::warn!(shard = %keeper.shard, error = %err, "cannot release the shard's Lease; it expires by itself");
        }
    });
    (rx, task)
}

/// Publishes `next` when it changes what writers may do (an owner's renewal only moves
/// its deadline: published without waking anyone), logging each change of hands.
fn publish(tx: &watch::Sender<ShardState>, next: ShardState, shard: Shard, identity: &str) {
    tx.send_if_modified(|state| {
        let woke = match (&*state, &next) {
            (ShardState::Owned(was), ShardState::Owned(now))
            | (ShardState::Draining(was), ShardState::Draining(now)) => was.epoch != now.epoch,
            // Only a new holder matters to the writers (an error's words do not); its
            // address is published without waking anyone.
            (ShardState::NotOwned { holder: was, .. }, ShardState::NotOwned { holder: now, .. }) => {
                was != now
            }
            (was, now) => was != now,
        };
        if woke {
            match &next {
                ShardState::Owned(owned) => {
                    tracing::info!(%shard, identity, epoch = owned.epoch, "this replica owns the shard");
                }
                ShardState::Draining(owned) => {
                    tracing::info!(%shard, identity, epoch = owned.epoch, "this replica hands the shard over: its applications stop here");
                }
                ShardState::NotOwned { holder, .. } if matches!(state, ShardState::Owned(_) | ShardState::Draining(_)) => {
                    tracing::warn!(%shard, identity, holder = holder.as_deref(), "this replica no longer owns the shard; it stops acting on it");
                }
                _ => {}
            }
        }
        *state = next;
        woke
    });
}

/// Resolves when a published ownership lapses (publishing [`ShardState::NotOwned`]);
/// never without one.
async fn lapse(tx: &watch::Sender<ShardState>) {
    let owned = match &*tx.borrow() {
        ShardState::Owned(held) | ShardState::Draining(held) => Some(*held),
        _ => None,
    };
    let Some(held) = owned else {
        return std::future::pending().await;
    };
    tokio::time::sleep_until(held.valid_until.into()).await;
    tx.send_replace(ShardState::NotOwned {
        holder: None,
        address: None,
        error: Some("no renewal within ha.renew_deadline_ms".into()),
    });
    tracing::warn!("a shard's ownership lapsed: no renewal within ha.renew_deadline_ms");
}

/// Resolves when the watch delivers, after the generation given, a healthy view of the
/// Lease with no holder; never without a watch.
async fn released(freed: Option<(watch::Receiver<Watched>, u64)>) {
    if let Some((mut rx, taken)) = freed
        && rx
            .wait_for(|w| w.generation != taken && w.healthy && w.is_free())
            .await
            .is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Resolves when `rx` changes; never without one (or once its sender is gone).
async fn changed(rx: Option<&mut watch::Receiver<Option<i32>>>) {
    if let Some(rx) = rx
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// The keepers of every shard of `settings` in `namespace`, each renewing over `client`
/// with requests bounded by the retry period; `cancel` releases them all. A namespace of
/// `keys` is placed by its key (a queue's namespaces by the queue). A renewal takes no
/// share of the client-side rate limit, so it never waits behind pod creates here; at the
/// API server it shares the creates' user, so API Priority and Fairness queues both in one
/// flow unless a FlowSchema gives the Lease requests their own priority level (the chart's
/// `ha.leaseFlowSchema`).
pub fn spawn_keepers(
    client: &kube::Client,
    namespace: &str,
    settings: &crate::ha::HaSettings,
    keys: std::collections::BTreeMap<String, String>,
    cancel: &CancellationToken,
    initialize: &Initialize,
) -> (crate::ha::Ownerships, Vec<tokio::task::JoinHandle<()>>) {
    let timing = settings.timing();
    let policy = RequestPolicy {
        // Long enough for a loaded API server, short enough to try twice before the
        // renew deadline (a hung request never holds an ownership: `lapse` ends it).
        timeout: (timing.renew_deadline / 2)
            .max(timing.retry)
            .max(std::time::Duration::from_millis(500)),
        attempts: 1,
        ..RequestPolicy::default()
    };
    let map = match crate::ha::shards::ShardMap::new(settings.shards) {
        Ok(map) => map,
        // Checked with the configuration; a library caller's bad count is one shard.
        Err(_) => crate::ha::shards::ShardMap::single(),
    }
    .with_keys(keys);
    let identity = settings.identity();
    let pokes: Vec<Arc<Notify>> = map.shards().map(|_| Arc::default()).collect();
    let drains: Vec<watch::Sender<Option<i32>>> =
        map.shards().map(|_| watch::Sender::new(None)).collect();
    let layout = Layout::new(map.count());
    let (states, tasks) = map
        .shards()
        .zip(pokes.iter().zip(&drains))
        .map(|(shard, (poke, drained))| {
            let mut keeper =
                ShardLeaseKeeper::new(client.clone(), namespace, shard, identity, timing, policy)
                    .advertising(settings.advertise_address.clone())
                    .watching();
            if settings.rebalance {
                keeper = keeper.rebalancing(layout.clone(), Some(drained.subscribe()));
            }
            let first_turn = Some(initialize.add_handle());
            spawn_keeper(keeper, cancel.child_token(), first_turn, Arc::clone(poke))
        })
        .unzip();
    (
        crate::ha::Ownerships::new(map, identity, states, pokes).with_drains(drains),
        tasks,
    )
}
