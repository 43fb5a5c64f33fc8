//! The feed alone: full states, resumes, slow readers, listings racing the watch.
use super::event::CHANGE_OVERHEAD_BYTES;
use super::*;
use serde_json::json;
use std::time::Duration;

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

/// A feed whose first change gets `base + 1`, showing `pods`, as Start makes one.
fn feed_of(base: u64, pods: &[Pod]) -> Feed {
    let mut store = SnapshotStore::new(Duration::from_secs(1), Timestamp(0));
    let executors = pods
        .iter()
        .filter_map(|pod| executor_pod_from(pod, &rules()))
        .collect();
    store.replace_all(executors, Timestamp(0));
    Feed::new(base, store, pods, &rules())
}

fn drain(events: &mut ExecutorEvents) -> Vec<(u64, EventKind, Option<u64>)> {
    let mut out = Vec::new();
    let mut state = events.queue.lock();
    while let Some(e) = state.events.pop_front() {
        out.push((e.sequence, e.kind, e.executor.map(|v| v.executor.id.0)));
    }
    state.unread_changes = 0;
    state.unread_bytes = 0;
    out
}

/// Answers the LIST the feed asks for with `pods` (none is asked for when the feed's own
/// events hold every pod: the full state is sent already).
fn list(feed: &mut Feed, pods: &[Pod]) {
    if let Some(ticket) = feed.take_listing_request() {
        feed.listed(ticket, pods.iter().filter_map(ListedPod::of).collect());
    }
}

/// Answers the LIST the feed asks for with the pods as the feed has them.
fn list_current(feed: &mut Feed) {
    let pods: Vec<ListedPod> = feed
        .pods
        .iter()
        .map(|(name, facts)| ListedPod {
            name: name.clone(),
            resource_version: facts.resource_version.clone(),
            pod_json: Arc::from("{}"),
        })
        .collect();
    if let Some(ticket) = feed.take_listing_request() {
        feed.listed(ticket, pods);
    }
}

/// The full-state or change events with their pod's resourceVersion.
fn versions(events: &mut ExecutorEvents) -> Vec<(EventKind, Option<u64>, Option<String>)> {
    let mut state = events.queue.lock();
    state
        .events
        .drain(..)
        .map(|e| {
            let version = e.executor.as_ref().and_then(|v| {
                let pod: Pod = serde_json::from_str(&v.pod_json).ok()?;
                pod.metadata.resource_version
            });
            (e.kind, e.executor.map(|v| v.executor.id.0), version)
        })
        .collect()
}

#[test]
fn a_stream_starts_with_the_full_state_then_follows_changes() {
    let mut feed = feed_of(100, &[pod(2, "Running", 1), pod(1, "Pending", 1)]);
    let mut stream = feed.subscribe(0);
    list(&mut feed, &[pod(2, "Running", 1), pod(1, "Pending", 1)]);
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
    feed.deleted(&pod(2, "Running", 3), &rules());
    assert_eq!(
        drain(&mut stream),
        vec![
            (101, EventKind::Updated, Some(1)),
            (102, EventKind::Deleted, Some(2))
        ]
    );
}

#[test]
fn a_full_state_the_feeds_own_events_hold_needs_no_list() {
    // A new application: no pods, so its first stream's full state is sent at once.
    let mut feed = feed_of(100, &[]);
    let mut stream = feed.subscribe(0);
    assert_eq!(
        feed.take_listing_request(),
        None,
        "no LIST for a feed with no pods"
    );
    assert_eq!(drain(&mut stream), vec![(100, EventKind::Synced, None)]);
    feed.applied(&pod(1, "Pending", 1), &rules());
    assert_eq!(drain(&mut stream), vec![(101, EventKind::Updated, Some(1))]);

    // Every pod changed since the full state was wanted: their events carry their JSON.
    let mut feed = feed_of(200, &[pod(1, "Pending", 1)]);
    let mut stream = feed.subscribe(0);
    feed.applied(&pod(1, "Running", 2), &rules());
    assert_eq!(
        feed.take_listing_request(),
        None,
        "pod 1's event holds its JSON"
    );
    assert_eq!(
        versions(&mut stream),
        vec![
            (EventKind::Snapshot, Some(1), Some("2".to_string())),
            (EventKind::Synced, None, None),
        ]
    );

    // A pod known only from Start: its JSON comes from a LIST.
    let mut feed = feed_of(300, &[pod(1, "Pending", 1), pod(2, "Pending", 1)]);
    let _stream = feed.subscribe(0);
    feed.applied(&pod(1, "Running", 2), &rules());
    assert!(
        feed.take_listing_request().is_some(),
        "pod 2 needs the LIST"
    );
}

#[test]
fn resume_gives_the_missed_changes_or_a_full_state_when_too_old() {
    let mut feed = feed_of(0, &[]);
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
    list_current(&mut feed);
    let events = drain(&mut too_old);
    assert_eq!(events.last().map(|e| e.1), Some(EventKind::Synced));
    assert_eq!(events.len(), 2);
    let mut ahead = feed.subscribe(feed.sequence() + 5);
    list_current(&mut feed);
    assert_eq!(
        drain(&mut ahead).last().map(|e| e.1),
        Some(EventKind::Synced)
    );
}

#[test]
fn a_slow_reader_gets_a_fresh_full_state_instead_of_a_growing_queue() {
    let mut feed = feed_of(0, &[]).with_buffer(4);
    let mut slow = feed.subscribe(0);
    list_current(&mut feed);
    for version in 1..=20 {
        feed.applied(
            &pod(u64::from(version % 3 + 1), "Pending", version),
            &rules(),
        );
    }
    assert!(slow.refreshes() > 0);
    list_current(&mut feed);
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
fn a_stream_over_its_byte_budget_gets_a_full_state() {
    let one = CHANGE_OVERHEAD_BYTES + pod_json(&pod(1, "Pending", 10)).len();
    // Room for three changes' bytes, far fewer than the 256 changes of the count.
    let mut feed = feed_of(0, &[]).with_buffer_bytes(one * 3 + one / 2);
    let mut slow = feed.subscribe(0);
    let mut reader = feed.subscribe(0);
    list_current(&mut feed);
    drain(&mut slow);
    drain(&mut reader);
    for version in 10..20 {
        feed.applied(&pod(1, "Pending", version), &rules());
        // This one reads as changes come: it is never refreshed.
        drain(&mut reader);
    }
    assert_eq!(
        slow.refreshes(),
        1,
        "the fourth change went over the budget"
    );
    assert_eq!(reader.refreshes(), 0);
    {
        let state = slow.queue.lock();
        assert!(state.awaiting && state.unread_changes == 3, "{state:?}");
        assert!(state.unread_bytes <= one * 3 + one / 2, "{state:?}");
    }
    // Its full state replaces what it had not read.
    list_current(&mut feed);
    let events = drain(&mut slow);
    assert_eq!(
        events.iter().map(|e| e.1).collect::<Vec<_>>(),
        [EventKind::Snapshot, EventKind::Synced]
    );
    // A resume that would need more bytes than the budget is a full state too.
    let resumed = feed.subscribe(2);
    assert!(resumed.queue.lock().awaiting);
    let mut near = feed.subscribe(feed.sequence() - 2);
    assert_eq!(drain(&mut near).len(), 2);
}

#[test]
fn an_inactive_or_relisted_away_pod_is_deleted() {
    let mut feed = feed_of(0, &[pod(1, "Failed", 1), pod(2, "Running", 1)]);
    let mut stream = feed.subscribe(0);
    list_current(&mut feed);
    drain(&mut stream);
    let mut inactive = pod(1, "Failed", 2);
    if let Some(labels) = inactive.metadata.labels.as_mut() {
        labels.insert("spark-exec-inactive".into(), "true".into());
    }
    feed.applied(&inactive, &rules());
    feed.relisted(&[], &rules(), Timestamp(0));
    let events = drain(&mut stream);
    assert_eq!(
        events,
        vec![
            (1, EventKind::Deleted, Some(1)),
            (2, EventKind::Deleted, Some(2))
        ]
    );
    assert_eq!(feed.pods.len(), 0);
}

#[tokio::test]
async fn streams_end_when_the_feed_goes_and_gone_readers_are_dropped() {
    let mut feed = feed_of(0, &[]);
    let mut stream = feed.subscribe(0);
    let gone = feed.subscribe(0);
    list_current(&mut feed);
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

#[test]
fn a_full_state_shows_each_pod_at_the_feeds_version_with_its_json() {
    let mut feed = feed_of(
        0,
        &[
            pod(1, "Pending", 1),
            pod(2, "Pending", 1),
            pod(3, "Pending", 1),
        ],
    );
    let mut stream = feed.subscribe(0);
    let ticket = feed.take_listing_request().expect("a LIST asked for");
    assert_eq!(feed.take_listing_request(), None, "one LIST at a time");
    // While the LIST runs: 2 moves on and 3 goes (the feed has their JSON from the
    // watch); 4 is created, and the LIST sees it before the watch does.
    feed.applied(&pod(2, "Running", 2), &rules());
    feed.deleted(&pod(3, "Pending", 3), &rules());
    let listing = [
        pod(1, "Pending", 1),
        pod(2, "Running", 2),
        pod(4, "Pending", 4),
    ];
    assert!(
        versions(&mut stream).is_empty(),
        "nothing before the full state"
    );
    feed.listed(ticket, listing.iter().filter_map(ListedPod::of).collect());
    assert_eq!(
        versions(&mut stream),
        vec![
            (EventKind::Snapshot, Some(1), Some("1".to_string())),
            (EventKind::Snapshot, Some(2), Some("2".to_string())),
            (EventKind::Synced, None, None),
        ]
    );
    feed.applied(&pod(4, "Pending", 4), &rules());
    assert_eq!(
        versions(&mut stream),
        vec![(EventKind::Updated, Some(4), Some("4".to_string()))]
    );
}

#[test]
fn a_full_state_waits_for_the_watch_when_the_list_ran_ahead() {
    let mut feed = feed_of(0, &[pod(1, "Pending", 1), pod(2, "Pending", 1)]);
    let mut stream = feed.subscribe(0);
    // The LIST shows 1 Running at version 2 and no 2 (deleted): the watch has not
    // told the feed yet.
    list(&mut feed, &[pod(1, "Running", 2)]);
    assert!(versions(&mut stream).is_empty());
    feed.applied(&pod(1, "Running", 2), &rules());
    assert!(versions(&mut stream).is_empty(), "2 still behind");
    feed.deleted(&pod(2, "Pending", 3), &rules());
    assert_eq!(
        versions(&mut stream),
        vec![
            (EventKind::Snapshot, Some(1), Some("2".to_string())),
            (EventKind::Synced, None, None),
        ]
    );
    let state = &feed.store().current().executors[&ExecutorId(1)];
    assert_eq!(state.state, ExecutorState::Running);
}

#[test]
fn a_stale_listing_is_dropped_and_a_resync_asks_again() {
    let mut feed = feed_of(0, &[pod(1, "Pending", 1)]);
    let mut stream = feed.subscribe(0);
    let first = feed.take_listing_request().expect("a LIST asked for");
    // The LIST ran ahead of a watch event that never comes (the watch restarted):
    // the next resync lists the pod unchanged, and the full state is asked again.
    feed.listed(
        first,
        ListedPod::of(&pod(1, "Running", 5)).into_iter().collect(),
    );
    feed.relisted(
        &[Listed::Unchanged("app-exec-1".into())],
        &rules(),
        Timestamp(0),
    );
    let second = feed.take_listing_request().expect("asked again");
    feed.listed(
        first,
        ListedPod::of(&pod(1, "Pending", 1)).into_iter().collect(),
    );
    assert!(
        versions(&mut stream).is_empty(),
        "the first answer is stale"
    );
    feed.listed(
        second,
        ListedPod::of(&pod(1, "Pending", 1)).into_iter().collect(),
    );
    assert_eq!(
        versions(&mut stream),
        vec![
            (EventKind::Snapshot, Some(1), Some("1".to_string())),
            (EventKind::Synced, None, None),
        ]
    );
}
