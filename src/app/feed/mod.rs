//! The executor event feed of one application (WatchExecutors): its actor publishes every
//! change of its executor pods; each stream reads its own bounded queue. The actor never
//! waits on a reader: a reader that falls too far behind is given a fresh full state
//! instead of a growing queue, and a reader that went away is dropped at the next publish.
//!
//! The feed holds the application's one executor state: the engine's [`SnapshotStore`]
//! (what a round polls, and what GetStatus counts) and, per executor pod, only what the
//! store does not keep of it (`PodFacts`: its phase and resourceVersion). Each pod event
//! goes in once, through the feed, so the streams and the status never disagree: a status
//! read after an event counts what the event showed. A change carries the
//! JSON of the pod its watch event brought, and a full state (a new stream, one resuming
//! from too far back, a reader too slow) takes the pods' JSON from a LIST of the
//! application's executor pods, run by the actor's worker ([`Feed::take_listing_request`],
//! then [`Feed::listed`]). A full state shows the feed's state when it
//! is sent: from the moment the LIST is wanted, the feed keeps the JSON of every pod that
//! changes; a pod the LIST shows at a version the feed has not seen yet (the LIST ran
//! ahead of the watch) waits for its watch event.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use crate::allocator::claims::mounted_claims;
use crate::allocator::types::{EXECUTOR_ID_LABEL, RESOURCE_PROFILE_ID_LABEL, ROLE_LABEL};
use crate::allocator::{
    ExecutorId, ExecutorPod, ExecutorState, ResourceProfileId, SnapshotStore, StateRules,
    Timestamp, executor_pod_from,
};
use crate::k8s::Listed;
use assembly::Assembly;
use event::change_bytes;
pub use event::{EventKind, ExecutorEvent, ExecutorView, ReclaimRequest};
pub use pod::ListedPod;
use pod::{Phase, pod_json};
pub use stream::ExecutorEvents;
use stream::Queue;

mod assembly;
mod event;
mod pod;
mod stream;
#[cfg(test)]
mod tests;

/// Changes kept for resuming streams, at most: no more than the stream buffer's worth
/// are kept, since a stream that missed more is given a full state instead.
pub const KEPT_CHANGES: usize = 1024;

/// Changes a stream may have unread before it is given a fresh full state instead.
pub const STREAM_BUFFER: usize = 256;

/// Pods per page of the LIST a full state is taken from.
pub const FULL_STATE_PAGE_SIZE: u32 = 500;

/// What the feed keeps of one executor pod (by its name) besides the store's record of
/// its executor (id, profile, state, creation time): what a stream shows of the pod that
/// the engine does not need. Kept apart rather than beside the executor in the store, so
/// the engine's snapshot stays Spark's and the store stays free of Kubernetes details.
#[derive(Debug, Clone)]
struct PodFacts {
    id: ExecutorId,
    phase: Phase,
    resource_version: Option<Box<str>>,
    /// The claims its volumes mount (a claim stays in use until its pod is gone).
    claims: Box<[Box<str>]>,
}

impl PodFacts {
    fn of(id: ExecutorId, pod: &Pod) -> Self {
        Self {
            id,
            phase: Phase::of(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
            resource_version: pod.metadata.resource_version.as_deref().map(Box::from),
            claims: mounted_claims(pod).map(Box::from).collect(),
        }
    }
}

/// The feed an actor owns: its executor state (the snapshot store and the pods' facts),
/// the last changes, the streams.
#[derive(Debug)]
pub struct Feed {
    sequence: u64,
    /// The executors as the engine sees them (and polls them, at most once a batch delay).
    store: SnapshotStore,
    /// The executor pods by pod name: what the store does not keep of them.
    pods: BTreeMap<Box<str>, PodFacts>,
    /// The last changes (consecutive sequences), for resuming.
    history: VecDeque<ExecutorEvent>,
    streams: Vec<Arc<Queue>>,
    buffer: usize,
    /// Unread bytes of changes per stream, at most ([`super::tenants::STREAM_BUFFER_BYTES`]).
    buffer_bytes: usize,
    /// The full state being put together while streams wait for one.
    assembly: Option<Assembly>,
    /// LISTs asked for so far (the last one's ticket).
    listings: u64,
    /// The executors asked back, by pod name, while their pods are there: repeated after
    /// each full state.
    reclaims: BTreeMap<Box<str>, ReclaimRequest>,
}

impl Feed {
    /// A feed whose first change gets `base + 1`, showing `pods` (the executor pods found
    /// at Start, which `store` holds). A base taken from the clock keeps sequences
    /// increasing across restarts, so a `since` of an earlier service (or actor) is never
    /// mistaken for one of this feed.
    pub fn new(base: u64, store: SnapshotStore, pods: &[Pod], rules: &StateRules) -> Self {
        let mut feed = Self {
            sequence: base,
            store,
            pods: BTreeMap::new(),
            history: VecDeque::new(),
            streams: Vec::new(),
            buffer: STREAM_BUFFER,
            buffer_bytes: super::tenants::STREAM_BUFFER_BYTES,
            assembly: None,
            listings: 0,
            reclaims: BTreeMap::new(),
        };
        for pod in pods {
            if let Some(executor) = executor_pod_from(pod, rules) {
                let name = Box::from(executor.pod_name.as_str());
                feed.pods.insert(name, PodFacts::of(executor.id, pod));
            }
        }
        feed
    }

    /// The sequence base of a feed started at `now_ms`: 2^20 sequences per millisecond.
    pub fn base_at(now_ms: i64) -> u64 {
        u64::try_from(now_ms).unwrap_or(0).saturating_mul(1 << 20)
    }

    /// Limits the unread changes of each stream (tests).
    pub fn with_buffer(mut self, buffer: usize) -> Self {
        self.buffer = buffer.max(1);
        self
    }

    /// Limits the unread bytes of changes of each stream (at least one change is always
    /// taken, however large).
    pub fn with_buffer_bytes(mut self, bytes: usize) -> Self {
        self.buffer_bytes = bytes.max(1);
        self
    }

    /// The claims the application's executor pods mount (every pod still in the cluster,
    /// finished or terminating ones too: their volumes may still be attached).
    pub fn mounted_claims(&self) -> BTreeSet<String> {
        (self.pods.values())
            .flat_map(|facts| facts.claims.iter().map(|c| c.to_string()))
            .collect()
    }

    /// The number of the last change.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The executors as the engine sees them.
    pub fn store(&self) -> &SnapshotStore {
        &self.store
    }

    /// The store, for the round that polls it and the targets that make it due.
    pub fn store_mut(&mut self) -> &mut SnapshotStore {
        &mut self.store
    }

    /// A pod of the application was added or changed (one that is no executor any more,
    /// e.g. labelled inactive, is gone from the streams); returns its executor, if it is one.
    pub fn applied(&mut self, pod: &Pod, rules: &StateRules) -> Option<ExecutorPod> {
        let executor = executor_pod_from(pod, rules);
        if let Some(executor) = &executor {
            self.store.update_pod(executor.clone());
        }
        if let Some(name) = pod.metadata.name.as_deref() {
            self.publish_applied(name, pod, executor.as_ref());
        }
        executor
    }

    /// A pod of the application is gone; returns its executor id, if it was one.
    pub fn deleted(&mut self, pod: &Pod, rules: &StateRules) -> Option<ExecutorId> {
        if let Some(name) = pod.metadata.name.as_deref() {
            self.gone(name, Some(pod));
        }
        let executor = executor_pod_from(pod, rules)?;
        let id = executor.id;
        self.store.delete_pod(executor);
        Some(id)
    }

    /// A full listing of the application's executor pods at `now`: unchanged executors
    /// stay as they are, changed ones replace theirs, those not listed are gone (changes
    /// for what differs). Returns the executors gone from the store.
    pub fn relisted(
        &mut self,
        pods: &[Listed],
        rules: &StateRules,
        now: Timestamp,
    ) -> Vec<ExecutorId> {
        // The ids of unchanged pods, as the feed has them, before it takes in the
        // changed ones.
        let mut ids: Vec<ExecutorId> = pods
            .iter()
            .filter_map(|listed| match listed {
                Listed::Unchanged(name) => self.pods.get(name.as_str()).map(|facts| facts.id),
                Listed::Changed(_) => None,
            })
            .collect();
        let listed: HashSet<&str> = pods
            .iter()
            .filter_map(|listed| match listed {
                Listed::Changed(pod) => pod.metadata.name.as_deref(),
                Listed::Unchanged(name) => Some(name.as_str()),
            })
            .collect();
        let missing: Vec<Box<str>> = self
            .pods
            .keys()
            .filter(|name| {
                let name: &str = name;
                !listed.contains(name)
            })
            .cloned()
            .collect();
        for name in missing {
            self.gone(&name, None);
        }
        let mut changed: Vec<ExecutorPod> = Vec::new();
        for listed in pods {
            if let Listed::Changed(pod) = listed {
                let executor = executor_pod_from(pod, rules);
                if let Some(name) = pod.metadata.name.as_deref() {
                    self.publish_applied(name, pod, executor.as_ref());
                }
                changed.extend(executor);
            }
        }
        ids.extend(changed.iter().map(|e| e.id));
        ids.sort_unstable();
        ids.dedup();
        let gone: Vec<ExecutorId> = self
            .store
            .current()
            .executors
            .keys()
            .filter(|id| ids.binary_search(id).is_err())
            .copied()
            .collect();
        // One listing is one snapshot, as in Spark.
        self.store.resync(&ids, changed, now);
        // The watch has caught up with any LIST a full state waits on: a pod still behind
        // (which cannot be with versions that only grow) has its LIST run again.
        if let Some(assembly) = &mut self.assembly
            && assembly.answered
            && !assembly.behind.is_empty()
        {
            assembly.answered = false;
            assembly.wanted = true;
            assembly.asked = None;
            assembly.listed.clear();
            assembly.behind.clear();
        }
        gone
    }

    /// The streams' share of a pod added or changed: a change unless its version was
    /// already seen; gone from the streams when it is no (active) executor.
    fn publish_applied(&mut self, name: &str, pod: &Pod, executor: Option<&ExecutorPod>) {
        let unchanged = self.pods.get(name).is_some_and(|old| {
            old.resource_version.is_some()
                && old.resource_version.as_deref() == pod.metadata.resource_version.as_deref()
        });
        if unchanged {
            return;
        }
        let Some(executor) = executor else {
            self.gone(name, Some(pod));
            return;
        };
        let view = Arc::new(ExecutorView {
            executor: executor.clone(),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
            pod_json: pod_json(pod),
            resource_version: pod.metadata.resource_version.clone(),
        });
        let facts = PodFacts::of(executor.id, pod);
        match self.pods.get_mut(name) {
            Some(old) => *old = facts,
            None => {
                self.pods.insert(name.into(), facts);
            }
        }
        self.publish(EventKind::Updated, view);
    }

    /// The executor of the pod `name` as the store has it (state Unknown if the store has
    /// none, which only a pod sharing another's executor id could make happen).
    fn executor(&self, name: &str, facts: &PodFacts) -> ExecutorPod {
        match self.store.current().executors.get(&facts.id) {
            Some(executor) => ExecutorPod {
                pod_name: name.to_string(),
                ..executor.clone()
            },
            None => ExecutorPod {
                id: facts.id,
                profile: ResourceProfileId::default(),
                state: ExecutorState::Unknown,
                created_at: None,
                pod_name: name.to_string(),
                start_blocker: None,
            },
        }
    }

    /// The pod `name` as a stream shows it, with `pod_json`.
    fn view(&self, name: &str, facts: &PodFacts, pod_json: Arc<str>) -> ExecutorView {
        ExecutorView {
            executor: self.executor(name, facts),
            phase: facts.phase.as_str().map(str::to_string),
            pod_json,
            resource_version: facts.resource_version.as_deref().map(str::to_string),
        }
    }

    /// A new stream: the changes after `since` when they are all kept, else the full state
    /// (once the LIST it is taken from is answered).
    pub fn subscribe(&mut self, since: u64) -> ExecutorEvents {
        let queue = Arc::new(Queue::default());
        let first_kept = self
            .history
            .front()
            .map_or(self.sequence + 1, |e| e.sequence);
        let resumable = since > 0 && since <= self.sequence && since + 1 >= first_kept;
        let missed =
            usize::try_from(self.sequence - since.min(self.sequence)).unwrap_or(usize::MAX);
        let missed_bytes: usize = self
            .history
            .iter()
            .filter(|e| e.sequence > since)
            .map(change_bytes)
            .sum();
        if resumable && missed <= self.buffer && missed_bytes <= self.buffer_bytes {
            let mut state = queue.lock();
            state
                .events
                .extend(self.history.iter().filter(|e| e.sequence > since).cloned());
            state.unread_changes = state.events.len();
            state.unread_bytes = missed_bytes;
        } else {
            queue.lock().awaiting = true;
            self.assembly.get_or_insert_with(Assembly::wanted);
        }
        self.streams.push(Arc::clone(&queue));
        ExecutorEvents {
            queue,
            _slot: None,
            moving: None,
        }
    }

    /// Whether the actor is to list the application's executor pods for a full state now:
    /// the LIST's ticket, to hand back with the pods to [`Self::listed`] (once per LIST).
    /// None when the feed's own events hold every pod's JSON (a new application has no
    /// pods): the full state is sent at once, without a LIST.
    pub fn take_listing_request(&mut self) -> Option<u64> {
        let assembly = self.assembly.as_mut().filter(|a| a.wanted)?;
        if self
            .pods
            .keys()
            .all(|name| assembly.fresh.contains_key(name))
        {
            assembly.wanted = false;
            assembly.answered = true;
            self.complete_full_state();
            return None;
        }
        self.listings += 1;
        assembly.wanted = false;
        assembly.asked = Some(self.listings);
        Some(self.listings)
    }

    /// The LIST a full state is taken from was answered: the full state goes to the streams
    /// waiting for it once every pod the feed has is in it at the feed's version.
    /// An answer whose `ticket` is not the one awaited is dropped.
    pub fn listed(&mut self, ticket: u64, pods: Vec<ListedPod>) {
        let Some(assembly) = self.assembly.as_mut().filter(|a| a.asked == Some(ticket)) else {
            return;
        };
        assembly.asked = None;
        let mut by_name: HashMap<Box<str>, ListedPod> = pods
            .into_iter()
            .map(|pod| (pod.name.clone(), pod))
            .collect();
        for (name, facts) in &self.pods {
            if assembly.fresh.contains_key(name) {
                continue;
            }
            match by_name.remove(name) {
                Some(pod) if pod.resource_version == facts.resource_version => {
                    assembly.listed.insert(name.clone(), pod.pod_json);
                }
                _ => {
                    assembly.behind.insert(name.clone());
                }
            }
        }
        assembly.answered = true;
        self.complete_full_state();
    }

    /// Streams open (readers not gone).
    pub fn streams(&self) -> usize {
        self.streams
            .iter()
            .filter(|q| Arc::strong_count(q) > 1)
            .count()
    }

    /// Asks the driver, on every stream, to give executor `id` back by `request`'s
    /// deadline (a RECLAIM event, repeated in full states while its pod is there). The
    /// event shows the pod as the feed last knew it: its name, executor labels and phase.
    pub fn reclaim(&mut self, id: ExecutorId, request: ReclaimRequest) {
        let Some((name, facts)) = self.pods.iter().find(|(_, facts)| facts.id == id) else {
            return;
        };
        let name = name.clone();
        let view = self.reclaim_view(&name, facts);
        self.reclaims.insert(name, request.clone());
        self.publish_event(EventKind::Reclaim, view, Some(request));
    }

    /// The executor's pod is deleted: its RECLAIM is no longer repeated.
    pub fn reclaim_over(&mut self, id: ExecutorId) {
        let pods = &self.pods;
        self.reclaims
            .retain(|name, _| pods.get(name).is_none_or(|facts| facts.id != id));
    }

    fn reclaim_view(&self, name: &str, facts: &PodFacts) -> Arc<ExecutorView> {
        let profile = self.executor(name, facts).profile;
        Arc::new(self.view(name, facts, last_seen_json(name, facts, profile)))
    }

    /// The pod `name` is gone from the streams (before the store forgets its executor).
    fn gone(&mut self, name: &str, pod: Option<&Pod>) {
        self.reclaims.remove(name);
        let Some((name, old)) = self.pods.remove_entry(name) else {
            return;
        };
        let mut view = match pod {
            Some(pod) => ExecutorView {
                executor: self.executor(&name, &old),
                phase: pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .or_else(|| old.phase.as_str().map(str::to_string)),
                pod_json: pod_json(pod),
                resource_version: pod.metadata.resource_version.clone(),
            },
            None => {
                let profile = self.executor(&name, &old).profile;
                self.view(&name, &old, last_seen_json(&name, &old, profile))
            }
        };
        view.executor.state = ExecutorState::Deleted;
        self.publish(EventKind::Deleted, Arc::new(view));
    }

    fn publish(&mut self, kind: EventKind, view: Arc<ExecutorView>) {
        self.publish_event(kind, view, None);
    }

    fn publish_event(
        &mut self,
        kind: EventKind,
        view: Arc<ExecutorView>,
        reclaim: Option<ReclaimRequest>,
    ) {
        self.sequence += 1;
        if let Some(assembly) = &mut self.assembly
            && kind != EventKind::Reclaim
        {
            assembly.changed(kind, &view);
        }
        let event = ExecutorEvent {
            sequence: self.sequence,
            kind,
            executor: Some(view),
            reclaim,
        };
        while self.history.len() >= self.buffer.min(KEPT_CHANGES) {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        // A stream whose reader went away holds the only other reference: dropped.
        self.streams.retain(|q| Arc::strong_count(q) > 1);
        let mut too_slow = false;
        let bytes = change_bytes(&event);
        for queue in &self.streams {
            let mut state = queue.lock();
            if state.awaiting {
                continue;
            }
            let over_bytes =
                state.unread_changes > 0 && state.unread_bytes + bytes > self.buffer_bytes;
            if state.unread_changes >= self.buffer || over_bytes {
                // Too slow: what it has not read is replaced by a fresh full state; it
                // reads on meanwhile.
                state.awaiting = true;
                state.refreshes += 1;
                too_slow = true;
            } else {
                state.events.push_back(event.clone());
                state.unread_changes += 1;
                state.unread_bytes += bytes;
                drop(state);
                queue.ready.notify_one();
            }
        }
        if too_slow {
            self.assembly.get_or_insert_with(Assembly::wanted);
        }
        self.complete_full_state();
    }

    /// Sends the full state to the streams waiting for one, once its LIST is answered and
    /// no pod is behind: the current executors (ascending by id), then `Synced`.
    fn complete_full_state(&mut self) {
        let ready = self
            .assembly
            .as_ref()
            .is_some_and(|a| a.answered && a.behind.is_empty());
        if !ready {
            return;
        }
        let Some(assembly) = self.assembly.take() else {
            return;
        };
        let mut views: Vec<Arc<ExecutorView>> = self
            .pods
            .iter()
            .filter_map(|(name, facts)| {
                assembly.fresh.get(name).cloned().or_else(|| {
                    let json = assembly.listed.get(name)?;
                    Some(Arc::new(self.view(name, facts, Arc::clone(json))))
                })
            })
            .collect();
        drop(assembly);
        views.sort_by_key(|v| v.executor.id);
        let mut full: VecDeque<ExecutorEvent> = views
            .into_iter()
            .map(|view| ExecutorEvent {
                sequence: self.sequence,
                kind: EventKind::Snapshot,
                executor: Some(view),
                reclaim: None,
            })
            .collect();
        full.push_back(ExecutorEvent {
            sequence: self.sequence,
            kind: EventKind::Synced,
            executor: None,
            reclaim: None,
        });
        // The reclaims under way follow the state, counted as changes (read as such).
        let mut reclaim_bytes = 0;
        let mut reclaims = 0;
        for (name, request) in &self.reclaims {
            if let Some(facts) = self.pods.get(name) {
                let event = ExecutorEvent {
                    sequence: self.sequence,
                    kind: EventKind::Reclaim,
                    executor: Some(self.reclaim_view(name, facts)),
                    reclaim: Some(request.clone()),
                };
                reclaim_bytes += change_bytes(&event);
                reclaims += 1;
                full.push_back(event);
            }
        }
        self.streams.retain(|q| Arc::strong_count(q) > 1);
        for queue in &self.streams {
            let mut state = queue.lock();
            if state.awaiting {
                state.awaiting = false;
                state.events = full.clone();
                state.unread_changes = reclaims;
                state.unread_bytes = reclaim_bytes;
                drop(state);
                queue.ready.notify_one();
            }
        }
    }
}

impl Drop for Feed {
    /// The application's actor ended (Stop, forgotten, shutdown): every stream ends.
    fn drop(&mut self) {
        for queue in &self.streams {
            queue.lock().closed = true;
            queue.ready.notify_one();
        }
    }
}

/// A pod gone without a DELETED event (a listing no longer shows it), as JSON: the feed
/// keeps no pod, so its name, resourceVersion, executor labels and last phase.
fn last_seen_json(name: &str, facts: &PodFacts, profile: ResourceProfileId) -> Arc<str> {
    let json = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "resourceVersion": facts.resource_version.as_deref(),
            "labels": {
                ROLE_LABEL: "executor",
                EXECUTOR_ID_LABEL: facts.id.to_string(),
                RESOURCE_PROFILE_ID_LABEL: profile.to_string(),
            },
        },
        "status": { "phase": facts.phase.as_str() },
    });
    Arc::from(json.to_string())
}
