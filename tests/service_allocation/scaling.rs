//! Scaling up and down: batches, lost creates timing out, pending excess deleted, failed pods
//! replaced, registered executors kept, the adaptive policy, finished pods labelled instead of
//! deleted.

use super::*;

#[tokio::test]
async fn batches_are_respected_and_targets_reached() {
    let h = harness().await;
    let started = start(&h.apps, request("app-a", NS)).await;
    assert!(!started.resumed);
    assert_eq!(started.last_executor_id, 0);

    // Nothing outstanding → the round runs at once; one batch of exactly 10.
    set_targets_and_round(&h, "app-a", 25).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 10));

    // The next batch only once a round has seen the previous pods (Pending is enough).
    wait_seen(&h.apps, "app-a", range(1, 10)).await;
    advance_round(&h, "app-a", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 20));
    wait_seen(&h.apps, "app-a", range(1, 20)).await;
    advance_round(&h, "app-a", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 25));
    wait_seen(&h.apps, "app-a", range(1, 25)).await;
    advance_round(&h, "app-a", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 25));

    let status = h.apps.status(&id("app-a")).await.unwrap();
    let p0 = &status.profiles[&P0];
    assert_eq!((p0.target, p0.pending, p0.newly_created), (25, 25, 0));
    assert_eq!(status.last_executor_id, 25);
    assert_eq!(h.apps.stop(&id("app-a")).await.unwrap(), 25);
}

#[tokio::test]
async fn unseen_creates_block_the_next_batch_and_time_out_into_new_ids() {
    let h = harness().await;
    start(&h.apps, request("app-lost", NS)).await;
    // Every create answers 201 but the pod is never stored.
    h.sim.set_faults(FaultSettings {
        lost_create_fraction: 1.0,
        ..FaultSettings::default()
    });
    set_targets_and_round(&h, "app-lost", 25).await;
    assert_eq!(
        h.apps
            .status(&id("app-lost"))
            .await
            .unwrap()
            .last_executor_id,
        10
    );
    // Rounds go by (within the 10 s executor timeout): no new batch while 10 are unseen.
    for _ in 0..5 {
        advance_round(&h, "app-lost", BATCH_DELAY).await;
    }
    let status = h.apps.status(&id("app-lost")).await.unwrap();
    assert_eq!(status.last_executor_id, 10);
    assert_eq!(status.profiles[&P0].newly_created, 10);
    assert!(cluster_ids(&h.sim, NS, "app-lost").await.is_empty());

    // After the timeout the lost ones are forgotten and re-requested with new ids.
    h.sim.set_faults(FaultSettings::default());
    advance_round(&h, "app-lost", Duration::from_secs(10)).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-lost").await, range(11, 20));
    let status = h.apps.status(&id("app-lost")).await.unwrap();
    assert_eq!(status.last_executor_id, 20);
    h.apps.stop(&id("app-lost")).await.unwrap();
}

#[tokio::test]
async fn downscale_deletes_pending_excess_and_is_deleted_until_gone() {
    let h = harness().await;
    start(&h.apps, request("app-down", NS)).await;
    set_targets_and_round(&h, "app-down", 8).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-down").await, range(1, 8));
    for exec in 1..=3 {
        set_running(&h.sim, "app-down", exec).await;
    }
    // Bound pods are deleted gracefully: they stay visible after the DELETE.
    for exec in 4..=8 {
        bind(&h.sim, "app-down", exec).await;
    }
    until("running pods seen", || async {
        let snap = h.apps.snapshot(&id("app-down")).await.unwrap();
        snap.executors
            .values()
            .filter(|e| e.state == ExecutorState::Running)
            .count()
            == 3
    })
    .await;

    // Pending pods become deletable once older than the idle timeout (60 s). (Pending
    // pods are outstanding, so the new target waits for the next round.)
    h.apps
        .set_total_expected(&id("app-down"), targets(4))
        .await
        .unwrap();
    advance_round(&h, "app-down", Duration::from_secs(61)).await;
    advance_round(&h, "app-down", BATCH_DELAY).await;
    let status = h.apps.status(&id("app-down")).await.unwrap();
    let deleted: BTreeSet<u64> = status.deleted.iter().map(|e| e.0).collect();
    assert_eq!(deleted.len(), 4, "excess of 4 pending deleted: {deleted:?}");
    assert!(
        deleted.iter().all(|d| (4..=8).contains(d)),
        "never a running one: {deleted:?}"
    );
    for d in &deleted {
        assert!(
            h.apps
                .is_deleted(&id("app-down"), ExecutorId(*d))
                .await
                .unwrap()
        );
    }
    // Running executors are never reported deleted.
    assert!(
        !h.apps
            .is_deleted(&id("app-down"), ExecutorId(1))
            .await
            .unwrap()
    );
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    for d in &deleted {
        let pod = api.get(&format!("app-down-exec-{d}")).await.unwrap();
        assert!(pod.metadata.deletion_timestamp.is_some());
    }

    // The kubelet confirms: the pods go; IsDeleted turns false once a round saw it.
    for d in &deleted {
        api.delete(
            &format!("app-down-exec-{d}"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    }
    let live: BTreeSet<u64> = range(1, 8).difference(&deleted).copied().collect();
    until("deleted pods gone from the snapshot", || async {
        let snap = h.apps.snapshot(&id("app-down")).await.unwrap();
        deleted.iter().all(|d| {
            snap.executors
                .get(&ExecutorId(*d))
                .is_none_or(|e| e.state == ExecutorState::Deleted)
        })
    })
    .await;
    advance_round(&h, "app-down", BATCH_DELAY).await;
    // Resync so the Deleted entries leave the snapshot as well.
    advance_round(&h, "app-down", Duration::from_secs(31)).await;
    wait_seen(&h.apps, "app-down", live.clone()).await;
    advance_round(&h, "app-down", BATCH_DELAY).await;
    for d in &deleted {
        assert!(
            !h.apps
                .is_deleted(&id("app-down"), ExecutorId(*d))
                .await
                .unwrap()
        );
    }
    assert_eq!(cluster_ids(&h.sim, NS, "app-down").await, live);
    h.apps.stop(&id("app-down")).await.unwrap();
}

#[tokio::test]
async fn failed_pods_are_deleted_and_replaced_with_new_ids() {
    let h = harness().await;
    start(&h.apps, request("app-fail", NS)).await;
    set_targets_and_round(&h, "app-fail", 3).await;
    for exec in 1..=3 {
        set_running(&h.sim, "app-fail", exec).await;
    }
    set_failed(&h.sim, "app-fail", 2).await;
    until("failure seen", || async {
        let snap = h.apps.snapshot(&id("app-fail")).await.unwrap();
        matches!(
            snap.executors.get(&ExecutorId(2)).map(|e| &e.state),
            Some(ExecutorState::Failed { .. })
        )
    })
    .await;
    advance_round(&h, "app-fail", BATCH_DELAY).await;
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-fail").await,
        BTreeSet::from([1, 3, 4])
    );
    assert_eq!(h.apps.stop(&id("app-fail")).await.unwrap(), 3);
}

#[tokio::test]
async fn executors_registered_with_the_driver_are_never_deleted_on_downscale() {
    let h = harness().await;
    start(&h.apps, request("app-reg", NS)).await;
    set_targets_and_round(&h, "app-reg", 4).await;
    wait_seen(&h.apps, "app-reg", range(1, 4)).await;
    h.apps
        .update_registered(
            &id("app-reg"),
            BTreeSet::from([ExecutorId(1), ExecutorId(2)]),
        )
        .await
        .unwrap();
    h.apps
        .set_total_expected(&id("app-reg"), targets(1))
        .await
        .unwrap();
    // Older than the idle timeout: the unknown pending ones may go, the registered may not.
    advance_round(&h, "app-reg", Duration::from_secs(61)).await;
    let deleted: BTreeSet<u64> = h
        .apps
        .status(&id("app-reg"))
        .await
        .unwrap()
        .deleted
        .iter()
        .map(|e| e.0)
        .collect();
    // Unbound pods go at once: their ids leave `deleted` as soon as the watch says so.
    assert!(deleted.is_subset(&BTreeSet::from([3, 4])), "{deleted:?}");
    assert_eq!(cluster_ids(&h.sim, NS, "app-reg").await, range(1, 2));
    h.apps.stop(&id("app-reg")).await.unwrap();
}

#[tokio::test]
async fn an_adaptive_application_doubles_its_requests_and_resets_on_quota_refusals() {
    let h = harness().await;
    let app = "app-adaptive";
    let mut req = request(app, NS);
    req.settings.batch_size = 2;
    req.settings.policy = AllocationPolicy::Adaptive;
    start(&h.apps, req).await;
    set_targets_and_round(&h, app, 100).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 2));
    // Every round's creates accepted, pods seen (Pending: nothing piles up beyond the
    // window): 2, then 4, then 8 per round.
    wait_seen(&h.apps, app, range(1, 2)).await;
    advance_round(&h, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 6));
    wait_seen(&h.apps, app, range(1, 6)).await;
    advance_round(&h, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 14));
    wait_seen(&h.apps, app, range(1, 14)).await;
    // The namespace's quota is full: the 16 creates of the next round are refused, the
    // window goes back to the batch size, and the round backs off as for any failed round.
    h.sim.set_faults(FaultSettings {
        quota_fraction: 1.0,
        ..FaultSettings::default()
    });
    advance_round(&h, app, BATCH_DELAY).await;
    assert_eq!(h.apps.status(&id(app)).await.unwrap().last_executor_id, 30);
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 14));
    h.sim.set_faults(FaultSettings::default());
    advance_round(&h, app, Duration::from_secs(2)).await;
    let ids = cluster_ids(&h.sim, NS, app).await;
    assert_eq!(ids, range(1, 14).union(&range(31, 32)).copied().collect());
    assert_eq!(h.apps.stop(&id(app)).await.unwrap(), 16);
}

#[tokio::test]
async fn an_adaptive_window_is_refilled_a_tenth_of_a_batch_delay_after_its_pods_are_seen() {
    let h = harness().await;
    let app = "app-adaptive-pace";
    let mut req = request(app, NS);
    req.settings.batch_size = 2;
    req.settings.policy = AllocationPolicy::Adaptive;
    start(&h.apps, req).await;
    set_targets_and_round(&h, app, 100).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 2));
    // The window (now 4) held the round back: once its pods are seen, the next round
    // comes after a tenth of the batch delay, not a whole one.
    wait_seen(&h.apps, app, range(1, 2)).await;
    advance_round(&h, app, BATCH_DELAY / 10).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 6));
    wait_seen(&h.apps, app, range(1, 6)).await;
    advance_round(&h, app, BATCH_DELAY / 10).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 14));
    assert_eq!(h.apps.stop(&id(app)).await.unwrap(), 14);
}

#[tokio::test]
async fn without_delete_on_termination_finished_pods_are_labelled_inactive() {
    let h = harness().await;
    let mut req = request("app-keep", NS);
    req.settings.delete_on_termination = false;
    start(&h.apps, req).await;
    set_targets_and_round(&h, "app-keep", 2).await;
    set_running(&h.sim, "app-keep", 1).await;
    set_failed(&h.sim, "app-keep", 1).await;
    until("failure seen", || async {
        let snap = h.apps.snapshot(&id("app-keep")).await.unwrap();
        matches!(
            snap.executors.get(&ExecutorId(1)).map(|e| &e.state),
            Some(ExecutorState::Failed { .. })
        )
    })
    .await;
    advance_round(&h, "app-keep", BATCH_DELAY).await;
    // Kept for inspection, labelled inactive, and replaced by executor 3.
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let kept = api.get("app-keep-exec-1").await.unwrap();
    assert_eq!(
        kept.metadata
            .labels
            .unwrap()
            .get("spark-exec-inactive")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(cluster_ids(&h.sim, NS, "app-keep").await, range(1, 3));
    // The inactive pod leaves the snapshot (the watch selector excludes it).
    until("inactive pod ignored", || async {
        let snap = h.apps.snapshot(&id("app-keep")).await.unwrap();
        snap.executors
            .get(&ExecutorId(1))
            .is_none_or(|e| e.state == ExecutorState::Deleted)
    })
    .await;
    // Stop deletes every executor pod, the inactive one too.
    assert_eq!(h.apps.stop(&id("app-keep")).await.unwrap(), 3);
    assert!(cluster_ids(&h.sim, NS, "app-keep").await.is_empty());
}
