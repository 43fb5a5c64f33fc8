//! Creation timeout: forget, delete by label (when deleting on termination), re-request.
use std::time::Duration;

use super::*;

#[test]
fn unseen_requests_time_out_strictly_after_the_timeout() {
    // (time of the round, delete on termination, expected timed out, expected deletes, expected creates)
    type Case = (i64, bool, Vec<u64>, Vec<DeleteRequest>, Vec<(u64, i32)>);
    let cases: Vec<Case> = vec![
        (600, true, vec![], vec![], vec![]),
        (
            601,
            true,
            vec![1, 2],
            vec![delete(&[1, 2], false)],
            vec![(3, 0), (4, 0)],
        ),
        (601, false, vec![1, 2], vec![], vec![(3, 0), (4, 0)]),
    ];
    for (at, delete_on_termination, timed_out, deletes, want_creates) in cases {
        let s = AllocationSettings {
            delete_on_termination,
            ..settings()
        };
        let mut a = allocator(s, &[(0, 2)]);
        assert_eq!(
            creates(&a.round(snapshot(&[]), secs(0))),
            vec![(1, 0), (2, 0)]
        );
        let plan = a.round(no_snapshot(), secs(at));
        let case = format!("at {at}s, delete {delete_on_termination}");
        assert_eq!(plan.timed_out, ids(&timed_out), "{case}");
        assert_eq!(plan.deletes, deletes, "{case}");
        assert_eq!(creates(&plan), want_creates, "{case}");
    }
}

#[test]
fn seen_and_scheduler_known_requests_never_time_out() {
    let mut a = allocator(settings(), &[(0, 3)]);
    a.round(snapshot(&[]), secs(0));
    a.set_registered(registered(&[2]));
    a.round(snapshot(&[pending(1, 0, 1)]), secs(1));
    let plan = a.round(no_snapshot(), secs(10_000));
    assert_eq!(plan.timed_out, ids(&[3]));
    assert_eq!(plan.deletes, vec![delete(&[3], false)]);
    assert_eq!(creates(&plan), vec![(4, 0)]);
}

#[test]
fn configured_timeout() {
    let s = AllocationSettings {
        executor_timeout: Duration::from_secs(10),
        ..settings()
    };
    let mut a = allocator(s, &[(0, 1)]);
    a.round(snapshot(&[]), secs(0));
    assert!(a.round(no_snapshot(), secs(10)).timed_out.is_empty());
    assert_eq!(a.round(no_snapshot(), secs(11)).timed_out, ids(&[1]));
}
