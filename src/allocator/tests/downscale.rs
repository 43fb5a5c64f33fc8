//! Downscale: which excess requests and pending pods are deleted, and which never are.
use super::*;

/// Allocator that created executors 1..=n of profile 0 at time 0 (none seen yet).
fn with_requests(n: u32) -> Allocator {
    let mut a = allocator(settings(), &[(0, n)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(plan.creates.len(), n as usize);
    a
}

#[test]
fn newly_created_are_protected_during_the_idle_timeout() {
    // (time of the downscale round, expected deleted ids); idle timeout is 60 s, strict.
    let cases: Vec<(i64, Vec<u64>)> = vec![(30, vec![]), (60, vec![]), (61, vec![1, 2, 3])];
    for (at, expected) in cases {
        let mut a = with_requests(5);
        a.set_targets(&targets(&[(0, 2)]));
        let plan = a.round(no_snapshot(), secs(at));
        let want = if expected.is_empty() {
            vec![]
        } else {
            vec![delete(&expected, true)]
        };
        assert_eq!(plan.deletes, want, "at {at}s");
        assert!(plan.creates.is_empty(), "at {at}s");
    }
}

#[test]
fn a_request_whose_create_is_unanswered_is_not_deleted_and_its_idle_timeout_counts_from_the_answer()
{
    let mut a = with_requests(5);
    a.creates_sent(ids(&[1, 2, 3, 4, 5]));
    // 1 and 2 answered at 10 s; 3 to 5 still on their way at 100 s (a queue, a slow server).
    a.create_accepted(ExecutorId(1), secs(10));
    a.create_accepted(ExecutorId(2), secs(10));
    a.set_targets(&targets(&[(0, 1)]));
    // Excess 4, but only the answered ones have a pod to delete, and not before the idle
    // timeout has passed from their answer.
    let plan = a.round(no_snapshot(), secs(70));
    assert_eq!(plan.deletes, vec![]);
    let plan = a.round(no_snapshot(), secs(71));
    assert_eq!(plan.deletes, vec![delete(&[1, 2], true)]);
    assert!(!a.is_deleted(ExecutorId(3)), "its create has no answer yet");
    // Nor do the unanswered ones time out while they wait for their answer.
    let plan = a.round(no_snapshot(), secs(10_000));
    assert!(plan.timed_out.is_empty(), "{plan:?}");
    a.create_accepted(ExecutorId(3), secs(10_000));
    let plan = a.round(no_snapshot(), secs(10_061));
    assert_eq!(plan.deletes, vec![delete(&[3], true)]);
    assert!(plan.creates.is_empty(), "4 and 5 still count: {plan:?}");
}

#[test]
fn deletes_newly_created_first_then_unknown_pending() {
    // Target 1; running 1; pending 10 (unknown, old), 11 (scheduler-known, old),
    // 12 (unknown, young), 13 (unknown, no creation time); newly created 14 (old).
    let mut a = Allocator::new(settings(), 13);
    a.set_targets(&targets(&[(0, 6)]));
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(
        creates(&plan),
        (14..=19).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    // 15..=19 show up as running later; only 14 stays unseen.
    a.set_targets(&targets(&[(0, 1)]));
    a.set_registered(registered(&[11]));
    let mut no_time = pending(13, 0, 0);
    no_time.created_at = None;
    let mut pods = vec![
        running(1, 0, 0),
        pending(10, 0, 0),
        pending(11, 0, 0),
        pending(12, 0, 190),
        no_time,
    ];
    pods.extend((15..=19).map(|i| running(i, 0, 1)));
    let plan = a.round(snapshot(&pods), secs(200));
    // excess = 6 running + 4 pending + 1 newly created - 1 = 10, but only 14 and 10 qualify.
    assert_eq!(plan.deletes, vec![delete(&[10, 14], true)]);
    assert!(a.is_deleted(ExecutorId(10)));
    assert!(a.is_deleted(ExecutorId(14)));
    for never in [1, 11, 12, 13, 15] {
        assert!(!a.is_deleted(ExecutorId(never)), "executor {never}");
    }
}

#[test]
fn takes_only_the_excess_oldest_first() {
    let mut a = Allocator::new(settings(), 20);
    a.set_targets(&targets(&[(0, 2)]));
    let pods: Vec<_> = (1..=5).map(|i| pending(i, 0, 0)).collect();
    let plan = a.round(snapshot(&pods), secs(100));
    assert_eq!(plan.deletes, vec![delete(&[1, 2, 3], true)]);
    assert!(plan.creates.is_empty());
    // Deleted pods no longer count: the next round (pods still Pending) deletes nothing more
    // and asks for nothing.
    let plan = a.round(snapshot(&pods), secs(101));
    assert_eq!(
        plan,
        RoundPlan {
            outstanding: true,
            // What a budget counts: the 2 pending pods not deleted.
            usage: AllocationUse {
                wanted: 2,
                using: 2,
                pending: 2,
                seen: 2,
            },
            ..RoundPlan::default()
        }
    );
}

#[test]
fn running_and_scheduler_known_are_never_deleted() {
    let mut a = Allocator::new(settings(), 10);
    a.set_targets(&targets(&[(0, 0)]));
    a.set_registered(registered(&[3, 4]));
    let pods = vec![
        running(1, 0, 0),
        running(2, 0, 0),
        pending(3, 0, 0),
        pending(4, 0, 0),
    ];
    let plan = a.round(snapshot(&pods), secs(1000));
    assert!(plan.deletes.is_empty());
    assert!(!plan.outstanding);
}

#[test]
fn one_delete_request_across_profiles() {
    let mut a = Allocator::new(settings(), 10);
    a.set_targets(&targets(&[(0, 1), (1, 0), (2, 5)]));
    let pods = vec![
        pending(1, 0, 0),
        pending(2, 0, 0),
        pending(3, 1, 0),
        pending(4, 2, 0),
    ];
    let plan = a.round(snapshot(&pods), secs(100));
    assert_eq!(plan.deletes, vec![delete(&[1, 3], true)]);
    // Profile 2 is below target and has no unknown newly created: it asks for more.
    assert_eq!(
        creates(&plan),
        (11..=14).map(|i| (i, 2)).collect::<Vec<_>>()
    );
}

#[test]
fn profiles_without_target_are_left_alone() {
    let mut a = Allocator::new(settings(), 10);
    a.set_targets(&targets(&[(0, 0)]));
    let plan = a.round(snapshot(&[pending(1, 3, 0), pending(2, 3, 0)]), secs(100));
    assert!(plan.deletes.is_empty());
    assert!(!plan.outstanding);
}
