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
