//! The executor event feed of one application (WatchExecutors): its actor publishes every
//! change of its executor pods; each stream reads its own bounded queue. The actor never
//! waits on a reader: a queue that would grow past its bound is replaced by a fresh full
//! state, and a reader that went away is dropped at the next publish.
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;

use crate::allocator::{ExecutorPod, ExecutorState, StateRules, executor_pod_from};
use crate::k8s::Listed;

/// Changes kept for resuming streams.
pub const KEPT_CHANGES: usize = 1024;

/// Changes a stream may have unread before it is given a fresh full state instead.
pub const STREAM_BUFFER: usize = 256;

/// What an event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// One executor of a full state (the first after a `Synced`, or of a stream, begins it).
    Snapshot,
    /// Closes a full state: its executors replace everything known.
    Synced,
    /// An executor pod was added or changed.
    Updated,
    /// An executor pod is gone.
    Deleted,
}

/// An executor pod as the feed shows it.
#[derive(Debug, Clone)]
pub struct ExecutorView {
    /// Its id, profile, state (as Spark classifies it) and pod name.
    pub executor: ExecutorPod,
    /// The pod's phase (`None` when it has none yet).
    pub phase: Option<String>,
    /// The pod as last seen (as it went, for a deleted one), as JSON: what the stream
    /// sends, and a fraction of the decoded pod's memory.
    pub pod_json: Arc<str>,
    /// The pod's resourceVersion (a replayed version is no change).
    pub resource_version: Option<String>,
}

/// One event of a stream.
#[derive(Debug, Clone)]
pub struct ExecutorEvent {
    /// The change's number; a full state's events carry the number of the state they show.
    pub sequence: u64,
    pub kind: EventKind,
    /// The executor (none for `Synced`).
    pub executor: Option<Arc<ExecutorView>>,
}

/// The feed an actor owns: the current executor pods, the last changes, the streams.
#[derive(Debug)]
pub struct Feed {
    sequence: u64,
    /// The executor pods by pod name.
    current: BTreeMap<String, Arc<ExecutorView>>,
    /// The last changes (consecutive sequences), for resuming.
    history: VecDeque<ExecutorEvent>,
    streams: Vec<Arc<Queue>>,
    buffer: usize,
}

impl Feed {
    /// A feed whose first change gets `base + 1`, showing `pods` (the executor pods found
    /// at Start). A base taken from the clock keeps sequences increasing across restarts,
    /// so a `since` of an earlier service (or actor) is never mistaken for one of this feed.
    pub fn new(base: u64, pods: &[Pod], rules: &StateRules) -> Self {
        let mut feed = Self {
            sequence: base,
            current: BTreeMap::new(),
            history: VecDeque::new(),
            streams: Vec::new(),
            buffer: STREAM_BUFFER,
        };
        for pod in pods {
            if let Some(view) = view_of(pod, rules) {
                feed.current
                    .insert(view.executor.pod_name.clone(), Arc::new(view));
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

    /// The number of the last change.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// A pod of the application was added or changed (one that is no executor any more,
    /// e.g. labelled inactive, is gone from the feed).
    pub fn applied(&mut self, pod: &Pod, rules: &StateRules) {
        let unchanged = pod.metadata.name.as_deref().is_some_and(|name| {
            self.current.get(name).is_some_and(|old| {
                old.resource_version.is_some()
                    && old.resource_version == pod.metadata.resource_version
            })
        });
        if unchanged {
            return;
        }
        match view_of(pod, rules) {
            Some(view) => {
                let view = Arc::new(view);
                self.current
                    .insert(view.executor.pod_name.clone(), Arc::clone(&view));
                self.publish(EventKind::Updated, view);
            }
            None => {
                if let Some(name) = pod.metadata.name.as_deref() {
                    self.gone(name, Some(pod));
                }
            }
        }
    }

    /// A pod of the application is gone.
    pub fn deleted(&mut self, pod: &Pod) {
        if let Some(name) = pod.metadata.name.as_deref() {
            self.gone(name, Some(pod));
        }
    }

    /// A full listing of the application's executor pods: changes for what differs.
    pub fn relisted(&mut self, pods: &[Listed], rules: &StateRules) {
        let listed: std::collections::BTreeSet<&str> = pods
            .iter()
            .filter_map(|listed| match listed {
                Listed::Changed(pod) => pod.metadata.name.as_deref(),
                Listed::Unchanged(name) => Some(name.as_str()),
            })
            .collect();
        let missing: Vec<String> = self
            .current
            .keys()
            .filter(|name| !listed.contains(name.as_str()))
            .cloned()
            .collect();
        for name in missing {
            self.gone(&name, None);
        }
        for listed in pods {
            if let Listed::Changed(pod) = listed {
                self.applied(pod, rules);
            }
        }
    }

    /// The executor of the pod `name` as last seen, if it is one.
    pub fn executor(&self, name: &str) -> Option<&ExecutorPod> {
        self.current.get(name).map(|view| &view.executor)
    }

    /// A new stream: the changes after `since` when they are all kept, else the full state.
    pub fn subscribe(&mut self, since: u64) -> ExecutorEvents {
        let queue = Arc::new(Queue::default());
        {
            let mut state = queue.lock();
            let first_kept = self
                .history
                .front()
                .map_or(self.sequence + 1, |e| e.sequence);
            let resumable = since > 0 && since <= self.sequence && since + 1 >= first_kept;
            let missed =
                usize::try_from(self.sequence - since.min(self.sequence)).unwrap_or(usize::MAX);
            if resumable && missed <= self.buffer {
                state
                    .events
                    .extend(self.history.iter().filter(|e| e.sequence > since).cloned());
                state.unread_changes = state.events.len();
            } else {
                state.events = self.full_state();
            }
        }
        self.streams.push(Arc::clone(&queue));
        ExecutorEvents { queue }
    }

    /// Streams open (readers not gone).
    pub fn streams(&self) -> usize {
        self.streams
            .iter()
            .filter(|q| Arc::strong_count(q) > 1)
            .count()
    }

    fn gone(&mut self, name: &str, pod: Option<&Pod>) {
        let Some(old) = self.current.remove(name) else {
            return;
        };
        let mut view = ExecutorView {
            executor: old.executor.clone(),
            phase: old.phase.clone(),
            pod_json: pod.map_or_else(|| Arc::clone(&old.pod_json), pod_json),
            resource_version: pod.map_or_else(
                || old.resource_version.clone(),
                |p| p.metadata.resource_version.clone(),
            ),
        };
        view.executor.state = ExecutorState::Deleted;
        if let Some(phase) = pod.and_then(|p| p.status.as_ref()?.phase.clone()) {
            view.phase = Some(phase);
        }
        self.publish(EventKind::Deleted, Arc::new(view));
    }

    fn publish(&mut self, kind: EventKind, view: Arc<ExecutorView>) {
        self.sequence += 1;
        let event = ExecutorEvent {
            sequence: self.sequence,
            kind,
            executor: Some(view),
        };
        if self.history.len() == KEPT_CHANGES {
            self.history.pop_front();
        }
        self.history.push_back(event.clone());
        // A stream whose reader went away holds the only other reference: dropped.
        self.streams.retain(|q| Arc::strong_count(q) > 1);
        let mut full = None;
        for queue in &self.streams {
            let mut state = queue.lock();
            if state.unread_changes >= self.buffer {
                // Too slow: what it has not read is replaced by the state now.
                let events = full.get_or_insert_with(|| self.full_state()).clone();
                state.events = events;
                state.unread_changes = 0;
                state.refreshes += 1;
            } else {
                state.events.push_back(event.clone());
                state.unread_changes += 1;
            }
            drop(state);
            queue.ready.notify_one();
        }
    }

    /// The current executors (ascending by id), then `Synced`.
    fn full_state(&self) -> VecDeque<ExecutorEvent> {
        let mut views: Vec<&Arc<ExecutorView>> = self.current.values().collect();
        views.sort_by_key(|v| v.executor.id);
        let mut events: VecDeque<ExecutorEvent> = views
            .into_iter()
            .map(|view| ExecutorEvent {
                sequence: self.sequence,
                kind: EventKind::Snapshot,
                executor: Some(Arc::clone(view)),
            })
            .collect();
        events.push_back(ExecutorEvent {
            sequence: self.sequence,
            kind: EventKind::Synced,
            executor: None,
        });
        events
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

/// The executor of `pod` with its phase, when the pod is one of the application's executors.
fn view_of(pod: &Pod, rules: &StateRules) -> Option<ExecutorView> {
    let executor = executor_pod_from(pod, rules)?;
    Some(ExecutorView {
        executor,
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        pod_json: pod_json(pod),
        resource_version: pod.metadata.resource_version.clone(),
    })
}

/// `pod` as JSON (empty if it cannot be encoded, which a decoded pod always can).
fn pod_json(pod: &Pod) -> Arc<str> {
    match serde_json::to_string(pod) {
        Ok(json) => Arc::from(json),
        Err(err) => {
            tracing::error!(error = %err, "cannot encode an executor pod as JSON");
            Arc::from("")
        }
    }
}

/// One stream's queue, shared by the feed (writer) and the stream (reader).
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Notify,
}

#[derive(Debug, Default)]
struct QueueState {
    events: VecDeque<ExecutorEvent>,
    /// Changes (not full-state events) in `events`.
    unread_changes: usize,
    /// The feed ended: the stream ends once `events` is read.
    closed: bool,
    /// How often the reader was too slow and given a fresh full state.
    refreshes: u64,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        match self.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// The reading end of one stream.
#[derive(Debug)]
pub struct ExecutorEvents {
    queue: Arc<Queue>,
}

impl ExecutorEvents {
    /// The next event, waiting for one; `None` once the application's actor ended and
    /// everything was read.
    pub async fn next(&mut self) -> Option<ExecutorEvent> {
        loop {
            {
                let mut state = self.queue.lock();
                if let Some(event) = state.events.pop_front() {
                    if matches!(event.kind, EventKind::Updated | EventKind::Deleted) {
                        state.unread_changes = state.unread_changes.saturating_sub(1);
                    }
                    return Some(event);
                }
                if state.closed {
                    return None;
                }
            }
            // A notify without a waiter leaves a permit, so none is lost in between.
            self.queue.ready.notified().await;
        }
    }

    /// How often this stream was given a fresh full state because it read too slowly.
    pub fn refreshes(&self) -> u64 {
        self.queue.lock().refreshes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(id: u64, phase: &str, version: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": format!("app-exec-{id}"),
                "resourceVersion": version.to_string(),
                "labels": {
                    "spark-app-selector": "app",
                    "spark-role": "executor",
                    "spark-exec-id": id.to_string(),
                }
            },
            "status": { "phase": phase }
        }))
        .expect("pod")
    }

    fn rules() -> StateRules {
        StateRules::default()
    }

    fn drain(events: &mut ExecutorEvents) -> Vec<(u64, EventKind, Option<u64>)> {
        let mut out = Vec::new();
        let mut state = events.queue.lock();
        while let Some(e) = state.events.pop_front() {
            out.push((e.sequence, e.kind, e.executor.map(|v| v.executor.id.0)));
        }
        state.unread_changes = 0;
        out
    }

    #[test]
    fn a_stream_starts_with_the_full_state_then_follows_changes() {
        let mut feed = Feed::new(100, &[pod(2, "Running", 1), pod(1, "Pending", 1)], &rules());
        let mut stream = feed.subscribe(0);
        assert_eq!(
            drain(&mut stream),
            vec![
                (100, EventKind::Snapshot, Some(1)),
                (100, EventKind::Snapshot, Some(2)),
                (100, EventKind::Synced, None)
            ]
        );
        feed.applied(&pod(1, "Running", 2), &rules());
        feed.applied(&pod(1, "Running", 2), &rules()); // a replay: no change
        feed.deleted(&pod(2, "Running", 3));
        assert_eq!(
            drain(&mut stream),
            vec![
                (101, EventKind::Updated, Some(1)),
                (102, EventKind::Deleted, Some(2))
            ]
        );
    }

    #[test]
    fn resume_gives_the_missed_changes_or_a_full_state_when_too_old() {
        let mut feed = Feed::new(0, &[], &rules());
        for version in 1..=3 {
            feed.applied(&pod(1, "Pending", version), &rules());
        }
        let mut resumed = feed.subscribe(1);
        assert_eq!(
            drain(&mut resumed),
            vec![
                (2, EventKind::Updated, Some(1)),
                (3, EventKind::Updated, Some(1))
            ]
        );
        let mut current = feed.subscribe(3);
        assert!(drain(&mut current).is_empty());
        for version in 4..(KEPT_CHANGES as u32 + 10) {
            feed.applied(&pod(1, "Pending", version), &rules());
        }
        let mut too_old = feed.subscribe(2);
        let events = drain(&mut too_old);
        assert_eq!(events.last().map(|e| e.1), Some(EventKind::Synced));
        assert_eq!(events.len(), 2);
        let mut ahead = feed.subscribe(feed.sequence() + 5);
        assert_eq!(
            drain(&mut ahead).last().map(|e| e.1),
            Some(EventKind::Synced)
        );
    }

    #[test]
    fn a_slow_reader_gets_a_fresh_full_state_instead_of_a_growing_queue() {
        let mut feed = Feed::new(0, &[], &rules()).with_buffer(4);
        let mut slow = feed.subscribe(0);
        for version in 1..=20 {
            feed.applied(
                &pod(u64::from(version % 3 + 1), "Pending", version),
                &rules(),
            );
        }
        assert!(slow.refreshes() > 0);
        let events = drain(&mut slow);
        assert!(events.len() <= 4 + 3 + 1, "{events:?}");
        let last_synced = events
            .iter()
            .rposition(|e| e.1 == EventKind::Synced)
            .expect("a full state");
        assert_eq!(
            events[..last_synced]
                .iter()
                .filter(|e| e.1 == EventKind::Snapshot)
                .count(),
            3
        );
        assert_eq!(events.last().map(|e| e.0), Some(20));
    }

    #[test]
    fn an_inactive_or_relisted_away_pod_is_deleted() {
        let mut feed = Feed::new(0, &[pod(1, "Failed", 1), pod(2, "Running", 1)], &rules());
        let mut stream = feed.subscribe(0);
        drain(&mut stream);
        let mut inactive = pod(1, "Failed", 2);
        if let Some(labels) = inactive.metadata.labels.as_mut() {
            labels.insert("spark-exec-inactive".into(), "true".into());
        }
        feed.applied(&inactive, &rules());
        feed.relisted(&[], &rules());
        let events = drain(&mut stream);
        assert_eq!(
            events,
            vec![
                (1, EventKind::Deleted, Some(1)),
                (2, EventKind::Deleted, Some(2))
            ]
        );
        assert_eq!(feed.current.len(), 0);
    }

    #[tokio::test]
    async fn streams_end_when_the_feed_goes_and_gone_readers_are_dropped() {
        let mut feed = Feed::new(0, &[], &rules());
        let mut stream = feed.subscribe(0);
        let gone = feed.subscribe(0);
        drop(gone);
        feed.applied(&pod(1, "Pending", 1), &rules());
        assert_eq!(feed.streams(), 1);
        assert_eq!(stream.next().await.map(|e| e.kind), Some(EventKind::Synced));
        assert_eq!(
            stream.next().await.map(|e| e.kind),
            Some(EventKind::Updated)
        );
        let waiter = tokio::spawn(async move { stream.next().await.is_none() });
        tokio::task::yield_now().await;
        drop(feed);
        assert!(waiter.await.expect("reader"));
    }
}
