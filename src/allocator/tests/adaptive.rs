//! The ADAPTIVE policy: the window's slow start and back-off, and rounds bounded by the
//! window, the target and the pending caps, with Spark's guarantees kept.
use super::*;
use crate::allocator::adaptive::{CreateOutcomes, CreateRefusal, CreateWindow};
use crate::allocator::settings::AllocationPolicy;

fn adaptive(batch_size: u32, max_pending: Option<u32>) -> AllocationSettings {
    AllocationSettings {
        policy: AllocationPolicy::Adaptive,
        ..settings_with(batch_size, max_pending, None)
    }
}

fn accepted(n: u32) -> CreateOutcomes {
    CreateOutcomes {
        accepted: n,
        refused: Vec::new(),
    }
}

fn refused(accepted: u32, refused: &[CreateRefusal]) -> CreateOutcomes {
    CreateOutcomes {
        accepted,
        refused: refused.to_vec(),
    }
}

#[test]
fn refusals_are_classified_by_status() {
    let cases: Vec<(Option<u16>, &str, CreateRefusal)> = vec![
        (Some(429), "too many requests", CreateRefusal::Throttled),
        (Some(500), "internal error", CreateRefusal::ServerError),
        (Some(503), "unavailable", CreateRefusal::ServerError),
        (None, "timed out", CreateRefusal::ServerError),
        (
            Some(403),
            "pods \"x\" is forbidden: exceeded quota: q, requested: pods=1",
            CreateRefusal::QuotaExceeded,
        ),
        (Some(403), "forbidden: RBAC", CreateRefusal::Other),
        (Some(422), "invalid", CreateRefusal::Other),
        (Some(409), "already exists", CreateRefusal::Other),
    ];
    for (status, message, expected) in cases {
        assert_eq!(
            CreateRefusal::of_status(status, message),
            expected,
            "{status:?} {message}"
        );
    }
}

#[test]
fn the_window_doubles_to_its_ceiling_and_backs_off() {
    // (step, answer, window after)
    let steps: Vec<(&str, CreateOutcomes, u64)> = vec![
        ("accepted", accepted(10), 20),
        ("accepted again", accepted(20), 40),
        // The scheduler and kubelets say nothing of what the API server accepts.
        ("accepted while no pod has started", accepted(40), 80),
        ("capped at the ceiling", accepted(80), 100),
        ("429 halves", refused(70, &[CreateRefusal::Throttled]), 50),
        ("5xx halves", refused(0, &[CreateRefusal::ServerError]), 25),
        ("halves again", refused(0, &[CreateRefusal::Throttled]), 12),
        (
            "never below batch size",
            refused(0, &[CreateRefusal::Throttled]),
            10,
        ),
        ("grows again", accepted(10), 20),
        (
            "an invalid pod neither grows nor shrinks",
            refused(5, &[CreateRefusal::Other]),
            20,
        ),
        (
            "past the threshold (10, what the 429s left) by a batch",
            accepted(20),
            30,
        ),
        (
            "quota resets",
            refused(3, &[CreateRefusal::QuotaExceeded]),
            10,
        ),
        ("nothing accepted, nothing refused", accepted(0), 10),
    ];
    // batch 10, 1 s delay, 50 creates/s: ceiling 2 s of creates = 100.
    let mut window = CreateWindow::new(10, 1000, 50);
    assert_eq!((window.size(), window.ceiling()), (10, 100));
    // A step a batch delay after the last: each refusal is a burst of its own.
    for (at, (step, outcome, expected)) in (0..).zip(steps) {
        window.answered(&outcome, secs(at));
        assert_eq!(window.size(), expected, "{step}");
    }
}

#[test]
fn the_refusals_of_one_burst_halve_the_window_once() {
    // batch 10, 1 s delay, 500 creates/s: ceiling 1,000.
    let mut window = CreateWindow::new(10, 1000, 500);
    window.answered(&accepted(150), secs(0));
    assert_eq!(window.size(), 160);
    // Every create in flight meets the same overload; their answers come one by one.
    for _ in 0..20 {
        window.answered(&refused(0, &[CreateRefusal::Throttled]), secs(1));
    }
    assert_eq!(window.size(), 80, "halved once, not 20 times");
    window.answered(
        &refused(0, &[CreateRefusal::ServerError]),
        secs(1).plus(std::time::Duration::from_millis(999)),
    );
    assert_eq!(window.size(), 80, "still the same burst");
    window.answered(&refused(0, &[CreateRefusal::Throttled]), secs(2));
    assert_eq!(window.size(), 40, "a batch delay later: a new burst");
}

#[test]
fn after_an_overload_the_window_doubles_up_to_the_halved_size_then_grows_by_a_batch() {
    // batch 10, 1 s delay, 500 creates/s: ceiling 1,000.
    let mut window = CreateWindow::new(10, 1000, 500);
    let mut sizes = Vec::new();
    let mut answer = |window: &mut CreateWindow, outcome: CreateOutcomes| {
        window.answered(&outcome, secs(0));
        sizes.push(window.size());
    };
    // Slow start: each create accepted adds one, however many answers carry them.
    for n in [10, 5, 5, 20, 40] {
        answer(&mut window, accepted(n));
    }
    // A 429 halves to 45, the threshold; a quota refusal resets to the batch.
    answer(&mut window, refused(5, &[CreateRefusal::Throttled]));
    answer(&mut window, refused(0, &[CreateRefusal::QuotaExceeded]));
    // Slow start again stops at 45; past it, a batch per window's worth accepted.
    for n in [10, 20, 20, 20, 30, 50] {
        answer(&mut window, accepted(n));
    }
    assert_eq!(sizes, [20, 25, 30, 50, 90, 45, 10, 20, 40, 45, 45, 55, 65]);
}

#[test]
fn the_ceiling_follows_rate_and_delay_and_never_drops_below_the_batch() {
    let cases = [
        // (batch, delay ms, rate, ceiling)
        (10, 1000, 50, 100),
        (5, 1000, 50, 100),
        (10, 2000, 50, 200),
        (10, 500, 20, 20),
        (500, 1000, 50, 500),
        (10, 1000, 0, 10),
    ];
    for (batch, delay, rate, ceiling) in cases {
        let window = CreateWindow::new(batch, delay, rate);
        assert_eq!(window.ceiling(), ceiling, "{batch} {delay} {rate}");
        assert_eq!(window.size(), u64::from(batch));
    }
}

#[test]
fn rounds_ask_while_requests_are_unseen_up_to_the_window() {
    let mut a = allocator(adaptive(10, None), &[(0, 1000)]);
    a.set_create_rate(50);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan), (1..=10).map(|i| (i, 0)).collect::<Vec<_>>());
    a.creates_answered(&accepted(10), secs(0));
    assert_eq!(a.create_window().size(), 20);
    // Unlike SPARK, unseen requests do not block the profile; the window bounds them.
    let plan = a.round(no_snapshot(), secs(1));
    assert_eq!(
        creates(&plan),
        (11..=20).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    a.creates_answered(&accepted(10), secs(1));
    assert_eq!(a.create_window().size(), 30);
    // All 20 seen Pending: none unseen, a whole window of 30 may go.
    let pods: Vec<_> = (1..=20).map(|i| pending(i, 0, 1)).collect();
    let plan = a.round(snapshot(&pods), secs(2));
    assert_eq!(creates(&plan).len(), 30);
    assert_eq!(a.last_executor_id(), 50);
    // Nothing seen since: the window is full, nothing more.
    let plan = a.round(no_snapshot(), secs(3));
    assert!(plan.creates.is_empty());
    assert!(plan.outstanding);
    // The window, not the target, held both rounds back: the actor comes back soon.
    assert!(plan.window_bound);
}

#[test]
fn a_round_is_window_bound_only_when_the_window_holds_back_what_the_target_wants() {
    // (case, max pending, target, pods seen Pending, window bound)
    let cases: Vec<(&str, Option<u32>, u32, u64, bool)> = vec![
        ("target above the window", None, 1000, 0, true),
        ("target fits the window", None, 10, 0, false),
        ("target fits exactly", None, 20, 10, false),
        ("max pending below the window", Some(5), 1000, 0, false),
        ("target reached", None, 10, 10, false),
    ];
    for (case, max_pending, target, seen, expected) in cases {
        let mut a = allocator(adaptive(10, max_pending), &[(0, target)]);
        a.set_create_rate(50);
        let pods: Vec<_> = (1..=seen).map(|i| pending(i, 0, 1)).collect();
        if seen > 0 {
            a.round(snapshot(&[]), secs(0));
            a.creates_answered(&accepted(10), secs(0));
        }
        let plan = a.round(snapshot(&pods), secs(1));
        assert_eq!(plan.window_bound, expected, "{case}");
    }
    // SPARK has no window.
    let mut a = allocator(settings(), &[(0, 1000)]);
    assert!(!a.round(snapshot(&[]), secs(0)).window_bound);
}

#[test]
fn rounds_stay_within_target_and_max_pending_pods() {
    // (case, max pending, target, window growth answers, expected creates in the round)
    let cases: Vec<(&str, Option<u32>, u32, u32, usize)> = vec![
        ("target below the window", None, 15, 3, 15),
        ("max pending below the window", Some(25), 1000, 3, 25),
        ("window below both", Some(500), 1000, 2, 40),
    ];
    for (case, max_pending, target, answers, expected) in cases {
        let mut a = allocator(adaptive(10, max_pending), &[(0, target)]);
        a.set_create_rate(50);
        for _ in 0..answers {
            let whole_window = u32::try_from(a.create_window().size()).expect("small");
            a.creates_answered(&accepted(whole_window), secs(0));
        }
        let plan = a.round(snapshot(&[]), secs(0));
        assert_eq!(creates(&plan).len(), expected, "{case}");
    }
}

#[test]
fn the_default_settings_grow_past_a_batch_as_the_api_server_accepts_creates() {
    let mut a = allocator(AllocationSettings::default(), &[(0, 1000)]);
    // The service's default rate: no cap in practice.
    a.set_create_rate(1_000_000);
    let first = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&first).len(), 10, "a batch to begin with");
    a.creates_answered(&accepted(10), secs(0));
    let second = a.round(snapshot(&[]), secs(0));
    assert_eq!(
        creates(&second).len(),
        10,
        "the window grew by the 10 accepted to 20, 10 of them still unseen"
    );
    a.creates_answered(&accepted(10), secs(0));
    assert_eq!(a.create_window().size(), 30);
    // Asked for per application, SPARK keeps one batch per round whatever the answers.
    let mut spark = allocator(settings(), &[(0, 1000)]);
    spark.set_create_rate(1_000_000);
    spark.round(snapshot(&[]), secs(0));
    spark.creates_answered(&accepted(10), secs(0));
    assert_eq!(spark.create_window().size(), 10);
}

#[test]
fn spark_policy_ignores_answers_and_keeps_one_batch_per_round() {
    let mut a = allocator(settings(), &[(0, 100)]);
    a.set_create_rate(50);
    for _ in 0..5 {
        a.creates_answered(&accepted(10), secs(0));
    }
    assert_eq!(a.create_window().size(), 10);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan).len(), 10);
    // Unseen requests block the profile, as in Spark.
    let plan = a.round(no_snapshot(), secs(1));
    assert!(plan.creates.is_empty());
}

#[test]
fn failed_creates_free_the_window_with_new_ids_never_reused() {
    let mut a = allocator(adaptive(10, None), &[(0, 30)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan).len(), 10);
    for (id, _) in &plan.creates {
        a.create_failed(*id);
    }
    a.creates_answered(&refused(0, &[CreateRefusal::Throttled; 10]), secs(0));
    assert_eq!(a.create_window().size(), 10);
    let plan = a.round(no_snapshot(), secs(1));
    assert_eq!(
        creates(&plan),
        (11..=20).map(|i| (i, 0)).collect::<Vec<_>>()
    );
}

#[test]
fn creation_timeout_and_downscale_keep_their_rules() {
    let mut a = allocator(adaptive(10, None), &[(0, 10)]);
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(creates(&plan).len(), 10);
    // 1..=5 Running, 6..=10 never seen: forgotten after the creation timeout (600 s),
    // deleted by label and re-requested with new ids.
    let pods: Vec<_> = (1..=5).map(|i| running(i, 0, 0)).collect();
    let plan = a.round(snapshot(&pods), secs(601));
    assert_eq!(plan.timed_out, ids(&[6, 7, 8, 9, 10]));
    assert_eq!(
        creates(&plan),
        (11..=15).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    // Downscale to 2: the 5 Running are never deleted; the unseen requests are once idle.
    a.set_targets(&targets(&[(0, 2)]));
    let plan = a.round(snapshot(&pods), secs(700));
    let deleted: Vec<u64> = plan
        .deletes
        .iter()
        .flat_map(|d| d.ids.iter().map(|i| i.0))
        .collect();
    assert_eq!(deleted, vec![11, 12, 13, 14, 15]);
    assert!(plan.creates.is_empty());
    for id in 1..=5 {
        assert!(!a.is_deleted(ExecutorId(id)));
    }
    for id in 11..=15 {
        assert!(a.is_deleted(ExecutorId(id)), "{id}");
    }
}

#[test]
fn requests_left_unanswered_are_bounded_by_what_the_server_answered_lately() {
    // batch 10, 1 s delay: twice the answers of the last 2 s, and a batch.
    let mut window = CreateWindow::new(10, 1000, 100_000);
    assert_eq!(
        window.unanswered_limit(secs(0)),
        10,
        "no answer yet: a batch"
    );
    window.answered(&accepted(30), secs(0));
    window.answered(&refused(5, &[CreateRefusal::Throttled; 5]), secs(1));
    assert_eq!(window.unanswered_limit(secs(1)), 90);
    assert_eq!(
        window.unanswered_limit(secs(2)),
        30,
        "the first 30 are 2 s old"
    );
    assert_eq!(window.unanswered_limit(secs(3)), 10);
}

#[test]
fn a_server_slower_than_the_window_gets_no_more_creates_than_its_pace() {
    let mut a = allocator(adaptive(10, None), &[(0, 100_000)]);
    // A lifted client rate: the window's ceiling is far away.
    a.set_create_rate(100_000);
    let answer = |a: &mut Allocator, from: u64, to: u64, at: Timestamp| {
        for id in from..=to {
            a.create_accepted(ExecutorId(id), at);
        }
        let n = u32::try_from(to + 1 - from).expect("small");
        a.creates_answered(&accepted(n), at);
    };
    let sent = |a: &mut Allocator, plan: &RoundPlan| {
        a.creates_sent(plan.creates.iter().map(|(id, _)| *id));
        plan.creates
            .iter()
            .map(|(id, _)| id.0)
            .collect::<Vec<u64>>()
    };
    let seen = |to: u64| (1..=to).map(|i| pending(i, 0, 1)).collect::<Vec<_>>();
    let ids = |from: u64, to: u64| (from..=to).collect::<Vec<u64>>();
    // While the server keeps up, the window's slow start: 10, 10, 30, 60.
    let plan = a.round(snapshot(&[]), secs(0));
    assert_eq!(sent(&mut a, &plan), ids(1, 10));
    let plan = a.round(no_snapshot(), Timestamp(100));
    assert!(
        plan.creates.is_empty(),
        "a batch unanswered is all that may wait"
    );
    assert!(plan.window_bound, "the actor comes back soon");
    answer(&mut a, 1, 10, Timestamp(500));
    let plan = a.round(no_snapshot(), Timestamp(500));
    assert_eq!(sent(&mut a, &plan), ids(11, 20));
    answer(&mut a, 11, 20, secs(1));
    let plan = a.round(snapshot(&seen(20)), secs(1));
    assert_eq!(sent(&mut a, &plan), ids(21, 50));
    answer(&mut a, 21, 50, Timestamp(1500));
    let plan = a.round(snapshot(&seen(50)), Timestamp(1500));
    assert_eq!(sent(&mut a, &plan), ids(51, 110));
    // Then the server slows down: 2.5 s later it has answered 10 of the 60, seen at
    // once. The window (grown to 70) has room for 20 more; the 50 unanswered are more
    // than twice the 10 answered lately and a batch: nothing more is sent.
    answer(&mut a, 51, 60, secs(4));
    assert_eq!(a.create_window().size(), 70);
    let plan = a.round(snapshot(&seen(60)), secs(4));
    assert!(plan.creates.is_empty(), "{:?}", creates(&plan));
    assert!(plan.window_bound);
    // It answers the rest: rounds go on.
    answer(&mut a, 61, 110, secs(5));
    let plan = a.round(snapshot(&seen(110)), secs(5));
    assert!(!sent(&mut a, &plan).is_empty());
}
