//! The deleted set behind IsDeleted: what the allocator deleted and the last snapshot holds.
use super::*;

/// Allocator that has just deleted pending pods 1 and 2 (target 0, old enough).
fn after_downscale() -> Allocator {
    let mut a = Allocator::new(settings(), 2);
    a.set_targets(&targets(&[(0, 0)]));
    let plan = a.round(snapshot(&[pending(1, 0, 0), pending(2, 0, 0)]), secs(100));
    assert_eq!(plan.deletes, vec![delete(&[1, 2], true)]);
    a
}

#[test]
fn pruned_to_the_last_snapshot() {
    // (next round's batch, expected is_deleted for 1 and 2)
    let cases: Vec<(&str, SnapshotBatch, [bool; 2])> = vec![
        ("no snapshot keeps the set", no_snapshot(), [true, true]),
        (
            "both still there",
            snapshot(&[pending(1, 0, 0), pending(2, 0, 0)]),
            [true, true],
        ),
        (
            "still there as Deleted",
            snapshot(&[exec(1, 0, ExecutorState::Deleted, 0), pending(2, 0, 0)]),
            [true, true],
        ),
        ("one gone", snapshot(&[running(2, 0, 0)]), [false, true]),
        ("both gone", snapshot(&[]), [false, false]),
    ];
    for (name, batch, expected) in cases {
        let mut a = after_downscale();
        a.round(batch, secs(101));
        let got = [a.is_deleted(ExecutorId(1)), a.is_deleted(ExecutorId(2))];
        assert_eq!(got, expected, "case {name}");
        let in_status: Vec<bool> = [1, 2]
            .iter()
            .map(|i| a.status().deleted.contains(&ExecutorId(*i)))
            .collect();
        assert_eq!(in_status, expected.to_vec(), "case {name}");
    }
}

#[test]
fn never_deleted_executors_are_not_deleted() {
    let a = after_downscale();
    assert!(!a.is_deleted(ExecutorId(3)));
    assert!(!a.is_deleted(ExecutorId(0)));
    assert!(!Allocator::new(settings(), 0).is_deleted(ExecutorId(1)));
}

#[test]
fn deleted_pods_that_started_anyway_do_not_count() {
    // Spark leaves deleted executors out of the counts, so a pod that started despite the
    // delete is replaced; IsDeleted lets the driver refuse it.
    let mut a = after_downscale();
    a.set_targets(&targets(&[(0, 1)]));
    let plan = a.round(snapshot(&[running(1, 0, 0), pending(2, 0, 0)]), secs(101));
    assert_eq!(creates(&plan), vec![(3, 0)]);
    assert!(a.is_deleted(ExecutorId(1)));
}

#[test]
fn a_delete_that_missed_its_pod_is_retried() {
    // Request 1 is deleted as excess before its pod exists; the pod shows up Pending after.
    let mut a = allocator(settings(), &[(0, 1)]);
    assert_eq!(creates(&a.round(snapshot(&[]), secs(0))), vec![(1, 0)]);
    a.set_targets(&targets(&[(0, 0)]));
    assert_eq!(
        a.round(no_snapshot(), secs(61)).deletes,
        vec![delete(&[1], true)]
    );
    // (time, state of pod 1 in the snapshot, registered, expected deletes)
    let late = |state: ExecutorState| snapshot(&[exec(1, 0, state, 61)]);
    let steps: Vec<(i64, SnapshotBatch, Vec<u64>, Vec<DeleteRequest>)> = vec![
        (62, late(ExecutorState::Pending), vec![], vec![]),
        (65, no_snapshot(), vec![], vec![]),
        (66, no_snapshot(), vec![], vec![delete(&[1], true)]),
        (67, late(ExecutorState::Pending), vec![], vec![]),
        (71, no_snapshot(), vec![], vec![delete(&[1], true)]),
        (80, late(ExecutorState::Deleted), vec![], vec![]),
        (90, late(ExecutorState::Running), vec![], vec![]),
        (100, late(ExecutorState::Pending), vec![1], vec![]),
        (110, no_snapshot(), vec![], vec![delete(&[1], true)]),
    ];
    for (at, batch, known, deletes) in steps {
        a.set_registered(registered(&known));
        let plan = a.round(batch, secs(at));
        assert_eq!(plan.deletes, deletes, "at {at}s");
        assert!(plan.creates.is_empty(), "at {at}s");
        assert!(a.is_deleted(ExecutorId(1)), "at {at}s");
    }
}
