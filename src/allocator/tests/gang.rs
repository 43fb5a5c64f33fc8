//! Gangs (`min_executors_at_once`): a profile short of its gang asks for all it lacks in
//! one round, whatever the batch size and policy, within the target, the pending caps,
//! the round's cap and `max_executors`.
use super::*;

fn gang_settings(batch_size: u32, gang: u32) -> AllocationSettings {
    AllocationSettings {
        batch_size,
        min_executors_at_once: Some(gang),
        ..AllocationSettings::default()
    }
}

fn per_profile(plan: &RoundPlan, profile: i32) -> usize {
    creates(plan).iter().filter(|(_, p)| *p == profile).count()
}

#[test]
fn a_gang_is_asked_for_in_one_round_whatever_the_batch_size() {
    let mut a = allocator(gang_settings(3, 8), &[(0, 20)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(
        creates(&plan),
        (1..=8).map(|id| (id, 0)).collect::<Vec<_>>()
    );
    // Past its gang the profile is Spark's again: nothing while requests are unseen, then
    // batches of 3.
    assert!(a.round(no_snapshot(), secs(1)).creates.is_empty());
    let seen: Vec<ExecutorPod> = (1..=8).map(|id| pending(id, 0, 0)).collect();
    let plan = a.round(snapshot(&seen), secs(2));
    assert_eq!(creates(&plan), vec![(9, 0), (10, 0), (11, 0)]);
}

#[test]
fn the_target_bounds_the_gang() {
    let mut a = allocator(gang_settings(2, 8), &[(0, 5)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 5);
    // The target grows: the gang's rest goes at once, though requests are unseen.
    a.set_targets(&targets(&[(0, 20)]));
    let plan = a.round(no_snapshot(), secs(1));
    assert_eq!(creates(&plan), vec![(6, 0), (7, 0), (8, 0)]);
}

#[test]
fn each_profile_has_its_gang() {
    let mut a = allocator(gang_settings(1, 4), &[(0, 10), (1, 10), (2, 2)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(
        (
            per_profile(&plan, 0),
            per_profile(&plan, 1),
            per_profile(&plan, 2)
        ),
        (4, 4, 2)
    );
}

#[test]
fn a_lost_member_is_replaced_at_once() {
    let mut a = allocator(gang_settings(1, 4), &[(0, 4)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 4);
    let all: Vec<ExecutorPod> = (1..=4).map(|id| running(id, 0, 0)).collect();
    assert!(a.round(snapshot(&all), secs(1)).creates.is_empty());
    // Executor 2 failed and is gone: the gang lacks one.
    let pods = [running(1, 0, 0), running(3, 0, 0), running(4, 0, 0)];
    let plan = a.round(snapshot(&pods), secs(2));
    assert_eq!(creates(&plan), vec![(5, 0)]);
}

#[test]
fn the_adaptive_window_does_not_bound_the_gang() {
    let settings = AllocationSettings {
        policy: AllocationPolicy::Adaptive,
        ..gang_settings(2, 8)
    };
    let mut a = allocator(settings, &[(0, 20)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(plan.creates.len(), 8, "{:?}", creates(&plan));
    // The window (2) is full of the gang's requests: nothing more until they are seen.
    assert!(a.round(no_snapshot(), secs(1)).creates.is_empty());
}

#[test]
fn the_round_cap_splits_a_gang_whose_rest_follows_without_waiting() {
    let mut a = Allocator::new(gang_settings(1, 8), 0).with_round_cap(5);
    a.set_targets(&targets(&[(0, 20)]));
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 5);
    let plan = a.round(no_snapshot(), secs(1));
    assert_eq!(creates(&plan), vec![(6, 0), (7, 0), (8, 0)]);
    assert!(a.round(no_snapshot(), secs(2)).creates.is_empty());
}

#[test]
fn the_gangs_leave_the_others_what_the_caps_have_left() {
    // 10 pending at most: profile 0 has 4 pending, so its gang of 6 fits; profile 1's gang
    // gets the rest of the round's room, and the next round, once the first are seen,
    // completes it.
    let settings = AllocationSettings {
        max_pending_pods: Some(10),
        ..gang_settings(2, 6)
    };
    let mut a = allocator(settings, &[(0, 6), (1, 6)]);
    let before: Vec<ExecutorPod> = (1..=4).map(|id| pending(id, 0, 0)).collect();
    let plan = a.round(snapshot(&before), secs(0));
    assert_eq!((per_profile(&plan, 0), per_profile(&plan, 1)), (2, 4));
    let mut now: Vec<ExecutorPod> = (1..=6).map(|id| running(id, 0, 0)).collect();
    now.extend((7..=10).map(|id| pending(id, 1, 0)));
    let plan = a.round(snapshot(&now), secs(1));
    assert_eq!(creates(&plan), vec![(11, 1), (12, 1)]);
}

#[test]
fn ids_past_max_executors_are_refused_once() {
    let settings = AllocationSettings {
        max_executors: Some(4),
        policy: AllocationPolicy::Adaptive,
        ..gang_settings(1, 4)
    };
    let mut a = allocator(settings, &[(0, 4)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 4);
    let all: Vec<ExecutorPod> = (1..=4).map(|id| running(id, 0, 0)).collect();
    assert!(a.round(snapshot(&all), secs(1)).creates.is_empty());
    // Executor 4 is gone, and no id is left for its replacement.
    let pods = [running(1, 0, 0), running(2, 0, 0), running(3, 0, 0)];
    let plan = a.round(snapshot(&pods), secs(2));
    assert!(plan.creates.is_empty());
    assert_eq!(plan.refused, BTreeMap::from([(rp(0), 1)]));
}

#[test]
fn without_a_gang_the_batch_size_rules() {
    let mut a = allocator(settings_with(3, None, None), &[(0, 20)]);
    assert_eq!(a.round(snapshot(&[]), secs(0)).creates.len(), 3);
}
