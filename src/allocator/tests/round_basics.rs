//! The round's bookkeeping: batches, newly created requests, scheduler-known executors,
//! replacement of finished executors, outstanding, failed creates.
use super::*;

#[test]
fn start_round_without_targets_does_nothing() {
    let mut a = Allocator::new(settings(), 0);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(plan, RoundPlan::default());
    assert_eq!(a.last_executor_id(), 0);
}

#[test]
fn scale_up_goes_one_batch_per_round_and_waits_for_newly_created() {
    let mut a = allocator(settings(), &[(0, 25)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan), (1..=10).map(|i| (i, 0)).collect::<Vec<_>>());
    assert!(plan.outstanding);
    // Nothing seen yet: the unknown newly created block the profile.
    let plan = a.round(no_snapshot(), secs(1));
    assert!(plan.creates.is_empty());
    // Seen as Pending: pending pods alone do not block (SPARK-33262).
    let pods: Vec<_> = (1..=10).map(|i| pending(i, 0, 1)).collect();
    let plan = a.round(snapshot(&pods), secs(2));
    assert_eq!(
        creates(&plan),
        (11..=20).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    let mut pods: Vec<_> = (1..=20).map(|i| pending(i, 0, 2)).collect();
    let plan = a.round(snapshot(&pods), secs(3));
    assert_eq!(
        creates(&plan),
        (21..=25).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    pods.extend((21..=25).map(|i| running(i, 0, 3)));
    let plan = a.round(snapshot(&pods), secs(4));
    assert!(plan.creates.is_empty());
    assert!(plan.deletes.is_empty());
    assert_eq!(a.last_executor_id(), 25);
}

#[test]
fn ids_continue_after_last_executor_id() {
    let mut a = Allocator::new(settings(), 41);
    a.set_targets(&targets(&[(0, 2)]));
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan), vec![(42, 0), (43, 0)]);
    assert_eq!(a.last_executor_id(), 43);
}

#[test]
fn finished_executors_are_replaced() {
    let cases: Vec<(&str, ExecutorState)> = vec![
        (
            "failed",
            ExecutorState::Failed {
                exit_code: Some(52),
                reason: None,
                message: None,
            },
        ),
        ("succeeded", ExecutorState::Succeeded { exit_code: Some(0) }),
        ("deleted", ExecutorState::Deleted),
        ("terminating", ExecutorState::Terminating),
        ("unknown", ExecutorState::Unknown),
    ];
    for (name, state) in cases {
        let mut a = Allocator::new(settings(), 2);
        a.set_targets(&targets(&[(0, 2)]));
        let plan = a.round(
            snapshot(&[running(1, 0, 0), exec(2, 0, state, 0)]),
            secs(10),
        );
        assert_eq!(creates(&plan), vec![(3, 0)], "case {name}");
    }
}

#[test]
fn newly_created_registered_with_the_driver_do_not_block() {
    let mut a = allocator(settings_with(2, None, None), &[(0, 4)]);
    assert_eq!(
        creates(&a.round(snapshot(&[]), secs(0))),
        vec![(1, 0), (2, 0)]
    );
    assert!(a.round(no_snapshot(), secs(1)).creates.is_empty());
    a.set_registered(registered(&[1, 2]));
    let plan = a.round(no_snapshot(), secs(2));
    assert_eq!(creates(&plan), vec![(3, 0), (4, 0)]);
    let mut waiting: Vec<u64> = a.newly_created().map(|(id, _)| id.0).collect();
    waiting.sort_unstable();
    assert_eq!(waiting, vec![1, 2, 3, 4]);
    // Scheduler-known newly created still count toward the target.
    let plan = a.round(snapshot(&[running(3, 0, 2), running(4, 0, 2)]), secs(3));
    assert!(plan.creates.is_empty());
    assert_eq!(a.status().profiles[&rp(0)].newly_created, 2);
    // Seen in a snapshot: no longer newly created, in either map.
    let all: Vec<_> = (1..=4).map(|i| running(i, 0, 2)).collect();
    a.round(snapshot(&all), secs(4));
    assert_eq!(a.status().profiles[&rp(0)].newly_created, 0);
    assert_eq!(a.status().profiles[&rp(0)].running, 4);
}

#[test]
fn outstanding_counts_unknown_pending_and_newly_created_only() {
    // (pods, registered, expected outstanding)
    let cases: Vec<(&str, Vec<ExecutorPod>, Vec<u64>, bool)> = vec![
        (
            "all running",
            vec![running(1, 0, 0), running(2, 0, 0)],
            vec![],
            false,
        ),
        (
            "unknown pending",
            vec![running(1, 0, 0), pending(2, 0, 0)],
            vec![],
            true,
        ),
        (
            "scheduler-known pending",
            vec![running(1, 0, 0), pending(2, 0, 0)],
            vec![2],
            false,
        ),
    ];
    for (name, pods, known, expected) in cases {
        let mut a = Allocator::new(settings(), 2);
        a.set_targets(&targets(&[(0, 2)]));
        a.set_registered(registered(&known));
        let plan = a.round(snapshot(&pods), secs(0));
        assert_eq!(plan.outstanding, expected, "case {name}");
        assert_eq!(a.status().outstanding, expected, "case {name}");
        // SetTotalExpected runs a round at once only when nothing is outstanding.
        assert_eq!(a.set_targets(&targets(&[(0, 3)])), !expected, "case {name}");
    }
}

#[test]
fn set_targets_keeps_profiles_left_out() {
    let mut a = Allocator::new(settings(), 0);
    assert!(a.set_targets(&targets(&[(0, 1), (1, 1)])));
    a.set_targets(&targets(&[(1, 2)]));
    assert_eq!(a.targets(), &targets(&[(0, 1), (1, 2)]));
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan), vec![(1, 0), (2, 1), (3, 1)]);
    assert!(!a.set_targets(&targets(&[(0, 1)])));
}

#[test]
fn failed_create_is_re_requested_with_a_new_id() {
    let mut a = allocator(settings(), &[(0, 2)]);
    assert_eq!(
        creates(&a.round(snapshot(&[]), secs(0))),
        vec![(1, 0), (2, 0)]
    );
    a.create_failed(ExecutorId(2));
    // Request 1 still blocks the profile until it shows up.
    assert!(a.round(no_snapshot(), secs(1)).creates.is_empty());
    let plan = a.round(snapshot(&[pending(1, 0, 0)]), secs(2));
    assert_eq!(creates(&plan), vec![(3, 0)]);
}

#[test]
fn failed_creates_clear_outstanding() {
    let mut a = allocator(settings(), &[(0, 2)]);
    a.round(snapshot(&[]), secs(0));
    assert!(a.outstanding());
    a.create_failed(ExecutorId(1));
    a.create_failed(ExecutorId(2));
    assert!(!a.outstanding());
    assert!(a.set_targets(&targets(&[(0, 2)])));
    assert_eq!(
        creates(&a.round(no_snapshot(), secs(1))),
        vec![(3, 0), (4, 0)]
    );
}

#[test]
fn status_reports_each_profile() {
    let mut a = allocator(settings(), &[(0, 3), (5, 1)]);
    a.set_registered(registered(&[2]));
    let plan = a.round(snapshot(&[running(1, 0, 0), pending(2, 0, 0)]), secs(0));
    assert_eq!(creates(&plan), vec![(3, 0), (4, 5)]);
    let status = a.status();
    assert_eq!(
        status.profiles[&rp(0)],
        ProfileCounts {
            target: 3,
            running: 1,
            pending: 1,
            newly_created: 1,
            ..ProfileCounts::default()
        }
    );
    assert_eq!(
        status.profiles[&rp(5)],
        ProfileCounts {
            target: 1,
            running: 0,
            pending: 0,
            newly_created: 1,
            ..ProfileCounts::default()
        }
    );
    assert_eq!(status.last_executor_id, 4);
    assert!(status.outstanding);
}

#[test]
fn ids_seen_in_the_cluster_are_never_reused() {
    // A resume that reported too low a last id: the snapshot shows executor 7.
    let mut a = Allocator::new(settings(), 3);
    a.set_targets(&targets(&[(0, 2)]));
    let plan = a.round(snapshot(&[running(7, 0, 0)]), secs(0));
    assert_eq!(creates(&plan), vec![(8, 0)]);
    assert_eq!(a.last_executor_id(), 8);
}

#[test]
fn engine_state_can_move_into_an_actor_task() {
    fn send_and_sync<T: Send + Sync + 'static>() {}
    send_and_sync::<Allocator>();
    send_and_sync::<SnapshotStore>();
    send_and_sync::<SnapshotBatch>();
    send_and_sync::<ExecutorPodBuilder>();
}

#[test]
fn creates_not_sent_give_their_ids_back() {
    let mut a = allocator(settings(), &[(0, 3)]);
    assert_eq!(
        creates(&a.round(snapshot(&[]), secs(0))),
        vec![(1, 0), (2, 0), (3, 0)]
    );
    // The id record failed: none of them was sent, and the next round asks with the
    // same ids.
    a.creates_not_sent(&ids(&[1, 2, 3]));
    assert_eq!(a.last_executor_id(), 0);
    assert_eq!(a.status().last_executor_id, 0);
    assert!(!a.outstanding());
    assert_eq!(
        creates(&a.round(no_snapshot(), secs(1))),
        vec![(1, 0), (2, 0), (3, 0)]
    );
}

#[test]
fn an_unsent_id_below_a_higher_one_handed_out_stays_skipped() {
    let mut a = allocator(settings(), &[(0, 3)]);
    a.round(snapshot(&[]), secs(0));
    // 3 was sent, 1 and 2 were not (cancelled while waiting for a rate-limit slot).
    a.creates_not_sent(&ids(&[1, 2]));
    assert_eq!(a.last_executor_id(), 3);
    // 2 and 3 not sent, 1 sent: both go back.
    let mut b = allocator(settings(), &[(0, 3)]);
    b.round(snapshot(&[]), secs(0));
    b.creates_not_sent(&ids(&[2, 3]));
    assert_eq!(b.last_executor_id(), 1);
}

#[test]
fn an_id_seen_in_the_cluster_is_never_given_back() {
    let mut a = allocator(settings(), &[(0, 1)]);
    a.round(snapshot(&[]), secs(0));
    // Someone else created a pod with id 1 before our create failed to be sent.
    a.round(snapshot(&[pending(1, 0, 0)]), secs(1));
    a.creates_not_sent(&ids(&[1]));
    assert_eq!(a.last_executor_id(), 1);
}
