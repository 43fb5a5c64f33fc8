//! Snapshot store: updates, resyncs, and the subscriber's timing.
use std::time::Duration;

use super::*;

fn store() -> SnapshotStore {
    SnapshotStore::new(Duration::from_secs(1), secs(100))
}

/// (snapshot count, seen ids) of a poll, for compact comparisons.
fn summary(batch: &Option<SnapshotBatch>) -> Option<(usize, Vec<u64>)> {
    batch
        .as_ref()
        .map(|b| (b.snapshot_count, b.seen_ids.iter().map(|id| id.0).collect()))
}

#[test]
fn start_round_is_due_at_once_with_the_empty_snapshot() {
    let mut s = store();
    assert_eq!(s.next_due(), secs(100));
    let batch = s.poll(secs(100));
    assert_eq!(summary(&batch), Some((1, vec![])));
    assert!(batch.is_some_and(|b| b.latest.executors.is_empty()));
    assert_eq!(s.next_due(), secs(101));
}

#[test]
fn at_most_once_per_batch_delay() {
    // (op, time in ms, expected poll summary when the op is a poll)
    enum Op {
        Update(u64),
        Delete(u64),
        Notify,
        Poll(i64, Option<(usize, Vec<u64>)>),
    }
    let ops = vec![
        Op::Poll(100_000, Some((1, vec![]))),
        Op::Update(1),
        Op::Poll(100_500, None),
        Op::Update(2),
        Op::Update(1),
        Op::Poll(100_999, None),
        Op::Poll(101_000, Some((3, vec![1, 2]))),
        Op::Poll(101_001, None),
        Op::Poll(102_000, Some((0, vec![]))),
        Op::Notify,
        Op::Poll(102_001, Some((0, vec![]))),
        Op::Poll(102_002, None),
        Op::Delete(2),
        Op::Poll(103_000, None),
        Op::Poll(103_001, Some((1, vec![2]))),
    ];
    let mut s = store();
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Update(id) => s.update_pod(pending(id, 0, 90)),
            Op::Delete(id) => s.delete_pod(pending(id, 0, 90)),
            Op::Notify => s.notify_now(),
            Op::Poll(ms, expected) => {
                assert_eq!(summary(&s.poll(Timestamp(ms))), expected, "step {step}")
            }
        }
    }
}

#[test]
fn notify_now_makes_the_subscriber_due_immediately() {
    let mut s = store();
    assert!(s.poll(secs(100)).is_some());
    s.update_pod(pending(1, 0, 90));
    assert!(s.poll(Timestamp(100_200)).is_none());
    s.notify_now();
    assert!(s.next_due() <= Timestamp(100_200));
    assert_eq!(summary(&s.poll(Timestamp(100_200))), Some((1, vec![1])));
    // Then one batch delay from that call.
    assert_eq!(s.next_due(), Timestamp(101_200));
}

#[test]
fn latest_snapshot_and_deletes() {
    let mut s = store();
    s.poll(secs(100));
    s.update_pod(pending(1, 0, 90));
    s.update_pod(running(1, 0, 90));
    s.update_pod(pending(2, 0, 91));
    s.delete_pod(pending(2, 0, 91));
    let batch = s.poll(secs(101)).expect("due");
    assert_eq!(batch.snapshot_count, 4);
    let states: Vec<(u64, ExecutorState)> = batch
        .latest
        .executors
        .values()
        .map(|p| (p.id.0, p.state.clone()))
        .collect();
    assert_eq!(
        states,
        vec![(1, ExecutorState::Running), (2, ExecutorState::Deleted)]
    );
    assert_eq!(s.current(), &*batch.latest);
}

#[test]
fn full_resync_replaces_everything() {
    let mut s = store();
    s.poll(secs(100));
    s.update_pod(pending(1, 0, 90));
    s.update_pod(pending(2, 0, 90));
    s.replace_all(
        vec![running(2, 0, 90), pending(3, 0, 95)],
        Timestamp(100_700),
    );
    let batch = s.poll(secs(101)).expect("due");
    assert_eq!(summary(&Some(batch.clone())), Some((3, vec![1, 2, 3])));
    assert_eq!(
        batch
            .latest
            .executors
            .keys()
            .map(|id| id.0)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
    assert_eq!(batch.latest.full_resync_at, Timestamp(100_700));
    assert_eq!(s.current().executors.len(), 2);
}

#[test]
fn empty_poll_carries_no_snapshot() {
    let mut s = store();
    s.poll(secs(100));
    let batch = s.poll(secs(101)).expect("due");
    assert_eq!(batch.snapshot_count, 0);
    assert!(batch.seen_ids.is_empty());
    assert_eq!(s.buffered(), 0);
}

#[test]
fn a_wall_clock_going_back_does_not_stall_the_subscriber() {
    let mut s = store();
    assert!(s.poll(secs(100)).is_some());
    // The clock jumps back an hour: polled at once, then every batch delay from there.
    assert!(s.poll(secs(100 - 3600)).is_some());
    assert_eq!(s.next_due(), secs(101 - 3600));
    assert!(s.poll(Timestamp((100 - 3600) * 1000 + 500)).is_none());
    assert!(s.poll(secs(101 - 3600)).is_some());
}

#[test]
fn notify_now_survives_a_clock_going_back() {
    let mut s = store();
    assert!(s.poll(secs(100)).is_some());
    s.notify_now();
    assert!(s.next_due() <= secs(100));
    assert!(s.poll(secs(99)).is_some());
    // Notification consumed: the next call is periodic again.
    assert!(s.poll(Timestamp(99_500)).is_none());
}
