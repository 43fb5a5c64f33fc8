//! Rounds and their creates: id records, backoff, the fence, the ADAPTIVE window's pace.
use super::*;

#[tokio::test]
async fn new_targets_call_a_round_whose_creates_wait_for_their_id_record() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.no_work().await;

    actor.set_target(2).await;
    let (ids, record) = actor.round_with_creates().await;
    assert_eq!((ids, record), (vec![1, 2], Some(2)));
    let report = actor.report().await;
    assert_eq!(
        report.status.last_executor_id, 0,
        "no id is used before it is recorded"
    );
    assert_eq!(profile0(&report), (0, 0, 2));

    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(2)))));
    assert_eq!(actor.report().await.status.last_executor_id, 2);
    actor.upkeep_answered();
    assert_eq!(
        actor.report().await.rounds,
        1,
        "counted once its creates are answered"
    );
    actor.created(&[1, 2]);
    assert_eq!(actor.report().await.rounds, 2);

    // Under SPARK nothing more is asked while the requests are unseen; a round runs one
    // batch delay after the last, and has nothing to send.
    actor.no_work().await;
    actor.advance(Duration::from_secs(1));
    actor.no_work().await;
    assert_eq!(actor.report().await.rounds, 3);
}

#[tokio::test]
async fn a_failed_id_record_sends_no_create_gives_the_ids_back_and_backs_off() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.set_target(2).await;
    assert_eq!(actor.round_with_creates().await, (vec![1, 2], Some(2)));
    actor.answer(WorkDone::Recorded(Err(
        "ConfigMap app-ids: unavailable".into()
    )));
    actor.upkeep_answered();
    let report = actor.report().await;
    assert_eq!(report.status.last_executor_id, 0);
    assert_eq!(profile0(&report), (0, 0, 0));
    assert!(report.create_failures.contains_key(&ResourceProfileId(0)));
    let backoff = START.plus(Duration::from_secs(2));
    assert_eq!(report.backoff_until, Some(backoff));
    assert_eq!(report.next_round_at, backoff);

    actor.advance(Duration::from_secs(1));
    actor.no_work().await;
    actor.advance(Duration::from_secs(1));
    assert_eq!(actor.round_with_creates().await, (vec![1, 2], Some(2)));
}

#[tokio::test]
async fn creates_all_refused_back_off_and_one_that_passes_ends_the_backoff() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.set_target(1).await;
    assert_eq!(actor.round_with_creates().await.0, vec![1]);
    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(1)))));
    actor.upkeep_answered();
    actor.answer(WorkDone::Created(vec![(
        ExecutorId(1),
        Err(kubernetes_error()),
    )]));
    let report = actor.report().await;
    assert_eq!(
        report.backoff_until,
        Some(START.plus(Duration::from_secs(2)))
    );
    assert_eq!(profile0(&report), (0, 0, 0));

    actor.advance(Duration::from_secs(2));
    // Id 1 was sent (and refused): never used again.
    assert_eq!(actor.round_with_creates().await, (vec![2], Some(2)));
    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(2)))));
    actor.upkeep_answered();
    actor.created(&[2]);
    let report = actor.report().await;
    assert_eq!(report.backoff_until, None);
    assert_eq!(profile0(&report), (0, 0, 1));
}

#[tokio::test]
async fn creates_the_fence_refused_give_their_ids_back_and_are_no_create_failure() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.set_target(2).await;
    assert_eq!(actor.round_with_creates().await.0, vec![1, 2]);
    actor.answer(WorkDone::Recorded(Ok(Some(ExecutorId(2)))));
    actor.upkeep_answered();
    let lapsed = || {
        CreateError::NotOwner(crate::ha::NotOwner {
            shard: crate::ha::shards::Shard(0),
            holder: None,
            error: Some("no renewal within ha.renew_deadline_ms".into()),
        })
    };
    actor.answer(WorkDone::Created(vec![
        (ExecutorId(1), Err(lapsed())),
        (ExecutorId(2), Err(lapsed())),
    ]));
    let report = actor.report().await;
    assert_eq!(profile0(&report), (0, 0, 0));
    assert!(
        report.create_failures.is_empty(),
        "a driver must not count a lost Lease as pod creation failures: {:?}",
        report.create_failures
    );
    let backoff = START.plus(Duration::from_secs(2));
    assert_eq!(
        report.backoff_until,
        Some(backoff),
        "no spinning while not owner"
    );

    // Nothing was sent: the same ids go out again (recorded already), and none counts
    // against max_executors.
    actor.advance(Duration::from_secs(2));
    match actor.next_work().await {
        Work::Round { upkeep, creates } => {
            let ids: Vec<u64> = creates.iter().map(|c| c.id.0).collect();
            assert_eq!(ids, vec![1, 2]);
            assert_eq!(upkeep.and_then(|u| u.record), None);
        }
        other => panic!("not a round: {other:?}"),
    }
}

#[tokio::test]
async fn each_create_answered_paces_the_window_before_its_round_is_answered() {
    let mut actor = Driven::start(None);
    actor.first_round_answered().await;
    actor.set_target(100).await;
    // ADAPTIVE (the default) starts at one batch: 10.
    let (ids, record) = actor.round_with_creates().await;
    assert_eq!(ids, (1..=10).collect::<Vec<_>>());
    actor.answer(WorkDone::Recorded(Ok(record.map(ExecutorId))));
    actor.upkeep_answered();
    // Every create of the round is answered, the round itself not yet (its slowest
    // create would still be on its way in a longer round).
    for id in 1..=10 {
        let accepted = CreateOutcomes {
            accepted: 1,
            refused: Vec::new(),
        };
        actor.answer(WorkDone::Answered(ExecutorId(id), accepted));
    }
    actor.settle().await;
    // The window doubled on those answers: the round a tenth of a batch delay later asks
    // for ten more while the first ten are neither seen nor their round answered.
    actor.advance(Duration::from_millis(100));
    let Work::Round { creates, .. } = actor.next_work().await else {
        panic!("a round");
    };
    let ids: Vec<u64> = creates.iter().map(|c| c.id.0).collect();
    assert_eq!(ids, (11..=20).collect::<Vec<_>>());
}
