//! Pending caps: the global max_pending_pods split across profiles with remainder, the
//! per-profile cap, and the batch size.
use super::*;

#[test]
fn global_cap_split_with_remainder() {
    // (max pending, batch size, targets, pods already there, expected creates per profile)
    type Case = (
        &'static str,
        u32,
        u32,
        Vec<(i32, u32)>,
        Vec<ExecutorPod>,
        Vec<(i32, usize)>,
    );
    let cases: Vec<Case> = vec![
        (
            "7 over 3 profiles",
            7,
            10,
            vec![(0, 10), (1, 10), (2, 10)],
            vec![],
            vec![(0, 3), (1, 2), (2, 2)],
        ),
        (
            "8 over 3 profiles",
            8,
            10,
            vec![(0, 10), (1, 10), (2, 10)],
            vec![],
            vec![(0, 3), (1, 3), (2, 2)],
        ),
        (
            "fewer slots than profiles",
            2,
            10,
            vec![(0, 10), (1, 10), (2, 10)],
            vec![],
            vec![(0, 1), (1, 1)],
        ),
        (
            "batch size below share",
            100,
            4,
            vec![(0, 10), (1, 10)],
            vec![],
            vec![(0, 4), (1, 4)],
        ),
        (
            "target below share",
            100,
            10,
            vec![(0, 1), (1, 3)],
            vec![],
            vec![(0, 1), (1, 3)],
        ),
        (
            "pending pods use slots, running do not",
            5,
            10,
            vec![(0, 10)],
            vec![pending(1, 0, 0), pending(2, 0, 0), running(3, 0, 0)],
            vec![(0, 3)],
        ),
        (
            "cap already full",
            2,
            10,
            vec![(0, 10), (1, 10)],
            vec![pending(1, 0, 0), pending(2, 1, 0)],
            vec![],
        ),
        (
            "slots go only to profiles that may ask",
            4,
            10,
            vec![(0, 1), (1, 10), (2, 10)],
            vec![running(1, 0, 0)],
            vec![(1, 2), (2, 2)],
        ),
    ];
    for (name, max_pending, batch, t, pods, expected) in cases {
        let mut a = Allocator::new(settings_with(batch, Some(max_pending), None), 100);
        a.set_targets(&targets(&t));
        let plan = a.round(snapshot(&pods), secs(0));
        assert_eq!(per_profile(&plan), expected, "case {name}");
        // Ids are handed out in profile order, one sequence across profiles.
        let got: Vec<u64> = plan.creates.iter().map(|(id, _)| id.0).collect();
        let want: Vec<u64> = (101..101 + got.len() as u64).collect();
        assert_eq!(got, want, "case {name}");
    }
}

fn per_profile(plan: &RoundPlan) -> Vec<(i32, usize)> {
    let mut counts: BTreeMap<i32, usize> = BTreeMap::new();
    for (_, p) in &plan.creates {
        *counts.entry(p.0).or_default() += 1;
    }
    counts.into_iter().collect()
}

#[test]
fn scheduler_known_pending_count_against_the_cap() {
    let mut a = Allocator::new(settings_with(10, Some(3), None), 10);
    a.set_targets(&targets(&[(0, 10)]));
    a.set_registered(registered(&[1, 2]));
    let plan = a.round(snapshot(&[pending(1, 0, 0), pending(2, 0, 0)]), secs(0));
    assert_eq!(per_profile(&plan), vec![(0, 1)]);
}

#[test]
fn newly_created_count_against_the_cap() {
    let mut a = allocator(settings_with(10, Some(5), None), &[(0, 20)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 5);
    a.set_registered(registered(&[1, 2, 3, 4, 5]));
    // Scheduler-known newly created do not block, but still fill the cap.
    assert!(a.round(no_snapshot(), secs(1)).creates.is_empty());
    let pods: Vec<_> = (1..=5).map(|i| running(i, 0, 0)).collect();
    assert_eq!(a.round(snapshot(&pods), secs(2)).creates.len(), 5);
}

#[test]
fn per_profile_cap() {
    // (per-profile cap, global cap, targets, pods, expected creates per profile)
    type Case = (
        &'static str,
        u32,
        Option<u32>,
        Vec<(i32, u32)>,
        Vec<ExecutorPod>,
        Vec<(i32, usize)>,
    );
    let cases: Vec<Case> = vec![
        (
            "cap each profile",
            2,
            None,
            vec![(0, 10), (1, 10)],
            vec![],
            vec![(0, 2), (1, 2)],
        ),
        (
            "pending uses the profile's room",
            2,
            None,
            vec![(0, 10)],
            vec![pending(1, 0, 0)],
            vec![(0, 1)],
        ),
        (
            "full profile leaves its share to others",
            2,
            Some(4),
            vec![(0, 10), (1, 10)],
            vec![pending(1, 0, 0), pending(2, 0, 0)],
            vec![(1, 2)],
        ),
        (
            "global cap below per-profile caps",
            5,
            Some(3),
            vec![(0, 10), (1, 10)],
            vec![],
            vec![(0, 2), (1, 1)],
        ),
    ];
    for (name, per_rp, global, t, pods, expected) in cases {
        let mut a = Allocator::new(settings_with(10, global, Some(per_rp)), 100);
        a.set_targets(&targets(&t));
        let plan = a.round(snapshot(&pods), secs(0));
        assert_eq!(per_profile(&plan), expected, "case {name}");
    }
}

#[test]
fn downscale_frees_slots_in_the_same_round() {
    let mut a = Allocator::new(settings_with(10, Some(3), None), 10);
    a.set_targets(&targets(&[(0, 0), (1, 3)]));
    let pods: Vec<_> = (1..=3).map(|i| pending(i, 0, 0)).collect();
    let plan = a.round(snapshot(&pods), secs(100));
    assert_eq!(plan.deletes, vec![delete(&[1, 2, 3], true)]);
    assert_eq!(per_profile(&plan), vec![(1, 3)]);
}
