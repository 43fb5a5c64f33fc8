//! Resource profiles: each has its own target and counts; ids are shared across them.
use super::*;

#[test]
fn each_profile_counts_its_own_executors() {
    // Profile 0 is full, profile 1 is short by 2, profile 2 is blocked by a request.
    let mut a = Allocator::new(settings(), 0);
    a.set_targets(&targets(&[(2, 1)]));
    assert_eq!(creates(&a.round(snapshot(&[]), secs(0))), vec![(1, 2)]);
    a.set_targets(&targets(&[(0, 2), (1, 3), (2, 2)]));
    let pods = vec![running(2, 0, 0), running(3, 0, 0), running(4, 1, 0)];
    let plan = a.round(snapshot(&pods), secs(1));
    assert_eq!(creates(&plan), vec![(5, 1), (6, 1)]);
    let status = a.status();
    let summary: Vec<(i32, u32, u32, u32, u32)> = status
        .profiles
        .iter()
        .map(|(p, c)| (p.0, c.target, c.running, c.pending, c.newly_created))
        .collect();
    assert_eq!(
        summary,
        vec![(0, 2, 2, 0, 0), (1, 3, 1, 0, 2), (2, 2, 0, 0, 1)]
    );
}

#[test]
fn a_blocked_profile_does_not_block_the_others() {
    let mut a = allocator(settings_with(1, None, None), &[(0, 3), (1, 3)]);
    assert_eq!(
        creates(&a.round(snapshot(&[]), secs(0))),
        vec![(1, 0), (2, 1)]
    );
    // Only profile 1's request shows up.
    let plan = a.round(snapshot(&[pending(2, 1, 0)]), secs(1));
    assert_eq!(creates(&plan), vec![(3, 1)]);
}

#[test]
fn ids_increase_across_profiles_in_profile_order() {
    let mut a = allocator(settings_with(2, None, None), &[(7, 2), (-1, 2), (0, 2)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(
        creates(&plan),
        vec![(1, -1), (2, -1), (3, 0), (4, 0), (5, 7), (6, 7)]
    );
}

/// (profile, target, running, pending, newly created) of every profile the status lists.
fn summary(a: &Allocator) -> Vec<(i32, u32, u32, u32, u32)> {
    a.status()
        .profiles
        .iter()
        .map(|(p, c)| (p.0, c.target, c.running, c.pending, c.newly_created))
        .collect()
}

#[test]
fn status_lists_profiles_without_a_target() {
    let failed = ExecutorState::Failed {
        exit_code: Some(1),
        reason: None,
        message: None,
    };
    // (case, targets before the round, snapshot, targets set after it, expected summary)
    type Case = (
        &'static str,
        Vec<(i32, u32)>,
        Vec<ExecutorPod>,
        Vec<(i32, u32)>,
        Vec<(i32, u32, u32, u32, u32)>,
    );
    let cases: Vec<Case> = vec![
        (
            "resumed, no target yet",
            vec![],
            vec![running(1, 0, 0), running(2, 0, 0), pending(3, 0, 0)],
            vec![],
            vec![(0, 0, 2, 1, 0)],
        ),
        (
            "an untargeted profile beside a targeted one",
            vec![(0, 1)],
            vec![running(1, 0, 0), running(2, 3, 0), pending(3, 3, 0)],
            vec![],
            vec![(0, 1, 1, 0, 0), (3, 0, 1, 1, 0)],
        ),
        (
            "a target set after the round shows at once",
            vec![],
            vec![running(1, 0, 0), running(2, 0, 0)],
            vec![(0, 2), (4, 0)],
            vec![(0, 2, 2, 0, 0), (4, 0, 0, 0, 0)],
        ),
        (
            "finished executors only: not listed",
            vec![],
            vec![exec(1, 2, failed.clone(), 0), running(2, 0, 0)],
            vec![],
            vec![(0, 0, 1, 0, 0)],
        ),
        ("nothing at all", vec![], vec![], vec![], vec![]),
    ];
    for (name, before, pods, after, expected) in cases {
        let mut a = Allocator::new(settings(), 3);
        a.set_targets(&targets(&before));
        let plan = a.round(snapshot(&pods), secs(0));
        assert!(plan.creates.is_empty(), "case {name}");
        assert!(plan.deletes.is_empty(), "case {name}");
        a.set_targets(&targets(&after));
        assert_eq!(summary(&a), expected, "case {name}");
    }
}

#[test]
fn a_profile_without_a_target_is_never_downscaled() {
    // Profile 0 has target 0, profile 1 none: both hold old pending pods the driver does not
    // know. Only profile 0's are excess; profile 1 is left alone round after round (Spark
    // ignores profiles without a target) and its counts stay visible.
    let mut a = Allocator::new(settings(), 0);
    a.set_targets(&targets(&[(0, 0)]));
    let pods = vec![pending(1, 0, 0), pending(2, 1, 0), running(3, 1, 0)];
    let plan = a.round(snapshot(&pods), secs(100));
    assert_eq!(plan.deletes, vec![delete(&[1], true)]);
    assert!(plan.creates.is_empty());
    assert_eq!(summary(&a), vec![(0, 0, 0, 0, 0), (1, 0, 1, 1, 0)]);
    for at in [200, 1000, 5000] {
        let plan = a.round(snapshot(&pods[1..]), secs(at));
        assert!(plan.deletes.is_empty(), "at {at}s");
        assert!(plan.creates.is_empty(), "at {at}s");
        assert!(!a.is_deleted(ExecutorId(2)), "at {at}s");
        assert_eq!(
            summary(&a),
            vec![(0, 0, 0, 0, 0), (1, 0, 1, 1, 0)],
            "at {at}s"
        );
    }
}
