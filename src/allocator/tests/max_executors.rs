//! The lifetime max_executors cap: refused and reported, never a panic, ids not consumed.
use super::*;

#[test]
fn requests_past_the_cap_are_refused() {
    // (max executors, last id, targets, expected creates, expected refused)
    type Case = (
        &'static str,
        u64,
        u64,
        Vec<(i32, u32)>,
        Vec<(u64, i32)>,
        Vec<(i32, u32)>,
    );
    let cases: Vec<Case> = vec![
        (
            "under the cap",
            5,
            0,
            vec![(0, 3)],
            vec![(1, 0), (2, 0), (3, 0)],
            vec![],
        ),
        (
            "exactly the cap",
            3,
            0,
            vec![(0, 3)],
            vec![(1, 0), (2, 0), (3, 0)],
            vec![],
        ),
        (
            "over the cap",
            3,
            0,
            vec![(0, 5)],
            vec![(1, 0), (2, 0), (3, 0)],
            vec![(0, 2)],
        ),
        (
            "cap spent across profiles",
            3,
            0,
            vec![(0, 2), (1, 2)],
            vec![(1, 0), (2, 0), (3, 1)],
            vec![(1, 1)],
        ),
        (
            "cap already spent",
            3,
            3,
            vec![(0, 2)],
            vec![],
            vec![(0, 2)],
        ),
        (
            "resume past the cap",
            3,
            9,
            vec![(0, 1), (1, 1)],
            vec![],
            vec![(0, 1), (1, 1)],
        ),
    ];
    for (name, max, last, t, want_creates, want_refused) in cases {
        let s = AllocationSettings {
            max_executors: Some(max),
            ..settings()
        };
        let mut a = Allocator::new(s, last);
        a.set_targets(&targets(&t));
        let plan = a.round(snapshot(&[]), secs(0));
        assert_eq!(creates(&plan), want_creates, "case {name}");
        let refused: Vec<(i32, u32)> = plan.refused.iter().map(|(p, n)| (p.0, *n)).collect();
        assert_eq!(refused, want_refused, "case {name}");
        assert_eq!(
            a.last_executor_id(),
            last.max(want_creates.len() as u64),
            "case {name}"
        );
    }
}

#[test]
fn replacements_are_refused_once_the_cap_is_spent() {
    let s = AllocationSettings {
        max_executors: Some(2),
        ..settings()
    };
    let mut a = allocator(s, &[(0, 2)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 2);
    let failed = ExecutorState::Failed {
        exit_code: Some(137),
        reason: None,
        message: None,
    };
    let plan = a.round(
        snapshot(&[running(1, 0, 0), exec(2, 0, failed, 0)]),
        secs(5),
    );
    assert!(plan.creates.is_empty());
    assert_eq!(plan.refused, BTreeMap::from([(rp(0), 1)]));
    assert_eq!(a.last_executor_id(), 2);
}

#[test]
fn creates_the_api_server_refused_give_their_ids_back_to_the_cap_but_not_for_reuse() {
    let s = AllocationSettings {
        max_executors: Some(3),
        ..settings()
    };
    let mut a = allocator(s, &[(0, 3)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 3);
    // Executor 2's create was refused (say 429): no pod has id 2. Executor 3's had no
    // answer: its pod may exist, so its id stays counted.
    a.create_refused(ExecutorId(2));
    a.create_failed(ExecutorId(3));
    let plan = a.round(snapshot(&[running(1, 0, 0)]), secs(1));
    let ids: Vec<u64> = plan.creates.iter().map(|(id, _)| id.0).collect();
    assert_eq!(ids, vec![4], "one more within the cap, a new id");
    assert_eq!(plan.refused, BTreeMap::from([(rp(0), 1)]));
}

#[test]
fn unsent_creates_below_a_later_round_s_ids_give_their_budget_back() {
    let s = AllocationSettings {
        max_executors: Some(4),
        batch_size: 2,
        ..settings()
    };
    let mut a = allocator(s, &[(0, 4)]);
    // Two rounds in flight at once: ids 1-2, then 3-4 (the first two seen Pending).
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 2);
    let pending = |id| exec(id, 0, ExecutorState::Pending, 0);
    assert_eq!(
        a.round(snapshot(&[pending(1), pending(2)]), secs(1))
            .creates
            .len(),
        2
    );
    // The first round's id 2 was not sent (its round shed): it stays skipped, as id 3 is
    // out, but no pod has it, so one more fits under the cap, with a new id.
    a.creates_not_sent(&[ExecutorId(2)]);
    let plan = a.round(snapshot(&[pending(1), pending(3), pending(4)]), secs(2));
    let ids: Vec<u64> = plan.creates.iter().map(|(id, _)| id.0).collect();
    assert_eq!(ids, vec![5]);
    assert!(plan.refused.is_empty(), "{:?}", plan.refused);
}

#[test]
fn ids_run_out_at_u64_max_without_wrapping() {
    // A pod labelled with the largest id pushes the counter to its end: refuse, never wrap.
    let mut a = Allocator::new(settings(), 0);
    a.set_targets(&targets(&[(0, 2)]));
    let plan = a.round(snapshot(&[running(u64::MAX, 0, 0)]), secs(0));
    assert!(plan.creates.is_empty());
    assert_eq!(plan.refused, BTreeMap::from([(rp(0), 1)]));
    assert_eq!(a.last_executor_id(), u64::MAX);
}

#[test]
fn one_round_plans_at_most_the_round_cap_over_all_profiles() {
    // Four profiles of batch size 10 would ask for 40; the cap splits 10 over them.
    let mut a = Allocator::new(settings(), 0).with_round_cap(10);
    a.set_targets(&targets(&[
        (0, u32::MAX),
        (1, u32::MAX),
        (2, u32::MAX),
        (3, u32::MAX),
    ]));
    let plan = a.round(snapshot(&[]), secs(0));
    let per_profile = |p: i32| creates(&plan).iter().filter(|(_, q)| *q == p).count();
    assert_eq!(plan.creates.len(), 10);
    assert_eq!(
        (
            per_profile(0),
            per_profile(1),
            per_profile(2),
            per_profile(3)
        ),
        (3, 3, 2, 2)
    );
    // Without a cap: the batch size per profile, as Spark.
    let mut uncapped = Allocator::new(settings(), 0);
    uncapped.set_targets(&targets(&[(0, u32::MAX), (1, u32::MAX)]));
    assert_eq!(uncapped.round(snapshot(&[]), secs(0)).creates.len(), 20);
}
