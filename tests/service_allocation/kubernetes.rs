//! The API server as it behaves: errors, dropped watch events and the periodic resync, rate
//! limits, slow lists, 410 Gone, health and the kubeconfig.

use super::*;

#[tokio::test]
async fn kubernetes_errors_do_not_kill_the_actor() {
    let h = harness().await;
    start(&h.apps, request("app-err", NS)).await;
    // Quota refusals (403): the round's creates fail; the executors are forgotten.
    h.sim.set_faults(FaultSettings {
        quota_fraction: 1.0,
        ..FaultSettings::default()
    });
    set_targets_and_round(&h, "app-err", 3).await;
    let status = h.apps.status(&id("app-err")).await.unwrap();
    assert_eq!(status.last_executor_id, 3);
    assert!(
        !status.outstanding,
        "failed creates are forgotten: {status:?}"
    );
    assert!(cluster_ids(&h.sim, NS, "app-err").await.is_empty());
    // Every create failed: the next round backs off (2 batch delays) instead of burning
    // a batch of ids every batch delay.
    let after_secs = |secs: i64| h.clock.now().0 + secs * 1000;
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(2)
    );

    // Internal errors (500) on every request, the periodic LIST included.
    h.sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        ..FaultSettings::default()
    });
    advance_round(&h, "app-err", Duration::from_secs(2)).await;
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(4)
    );
    advance_round(&h, "app-err", Duration::from_secs(31)).await;
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(8)
    );
    // Ids 1–3 were sent (and refused); the creates of the rounds under 500s were not
    // sent (their id record failed first): no id spent on them.
    assert_eq!(
        h.apps
            .status(&id("app-err"))
            .await
            .unwrap()
            .last_executor_id,
        3
    );

    // The cluster recovers: the next round creates with ids never sent before, and the
    // schedule is back to one batch delay.
    h.sim.set_faults(FaultSettings::default());
    advance_round(&h, "app-err", Duration::from_secs(8)).await;
    let ids = cluster_ids(&h.sim, NS, "app-err").await;
    assert_eq!(ids, range(4, 6), "fresh ids");
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(1)
    );
    assert_eq!(h.apps.stop(&id("app-err")).await.unwrap(), 3);
}

#[tokio::test]
async fn periodic_resync_recovers_dropped_watch_events() {
    let h = harness().await;
    // The simulated cluster applies a watch's faults when the watch opens.
    h.sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        ..FaultSettings::default()
    });
    // Long executor timeout: the unseen creates must not time out before the resync.
    let mut req = request("app-sync", NS);
    req.settings.executor_timeout = Duration::from_secs(600);
    start(&h.apps, req).await;
    until("namespace watch listed", || async {
        h.apps.is_namespace_synced(NS)
    })
    .await;
    set_targets_and_round(&h, "app-sync", 2).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-sync").await, range(1, 2));
    advance_round(&h, "app-sync", BATCH_DELAY).await;
    assert!(
        snapshot_ids(&h.apps, "app-sync").await.is_empty(),
        "events dropped"
    );
    // The full LIST every 30 s replaces the snapshot.
    h.clock.advance(RESYNC - BATCH_DELAY);
    wait_seen(&h.apps, "app-sync", range(1, 2)).await;
    h.sim.set_faults(FaultSettings::default());
    h.apps.stop(&id("app-sync")).await.unwrap();
}

#[tokio::test]
async fn the_actor_answers_while_rate_limited_creates_are_in_flight() {
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    // One create per second: 30 creates would take half a minute.
    let mut config = Settings::default();
    config.kubernetes.qps = 1;
    config.kubernetes.burst = 1;
    let apps = applications(&sim, &clock, config);
    let mut req = request("app-slow", NS);
    req.settings.batch_size = 30;
    start(&apps, req).await;
    apps.set_total_expected(&id("app-slow"), targets(30))
        .await
        .unwrap();
    // The round has planned all 30 while their creates trickle out.
    until("round planned", || async {
        apps.status(&id("app-slow")).await.unwrap().last_executor_id == 30
    })
    .await;
    assert!(
        !apps
            .is_deleted(&id("app-slow"), ExecutorId(1))
            .await
            .unwrap()
    );
    // Stop skips the creates not yet sent and waits for those in flight: nothing is left,
    // and nothing lands afterwards (the actor has ended before the DELETE).
    let deleted = apps.stop(&id("app-slow")).await.unwrap();
    assert!(deleted < 30, "unsent creates were skipped: {deleted}");
    assert!(cluster_ids(&sim, NS, "app-slow").await.is_empty());
}

#[tokio::test]
async fn a_slow_periodic_list_does_not_undo_newer_watch_events() {
    let h = harness().await;
    start(&h.apps, request("app-slow", NS)).await;
    until("namespace watch listed", || async {
        h.apps.is_namespace_synced(NS)
    })
    .await;
    set_targets_and_round(&h, "app-slow", 2).await;
    wait_seen(&h.apps, "app-slow", range(1, 2)).await;

    // The periodic LIST is answered late: its answer still holds executor 2, which is
    // deleted meanwhile (unbound: gone at once) and whose DELETED event the watch streams.
    h.sim.hold_list_responses();
    h.clock.advance(RESYNC);
    let resync_at = h.clock.now();
    until("the periodic LIST is held", || async {
        h.sim.held_list_responses() >= 1
    })
    .await;
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let before_delete = h.sim.resource_version().to_string();
    api.delete("app-slow-exec-2", &DeleteParams::default())
        .await
        .expect("delete");
    // The API server has streamed the DELETED event (to every watch of the namespace).
    let wp = WatchParams::default().fields("metadata.name=app-slow-exec-2");
    let mut events = api.watch(&wp, &before_delete).await.expect("watch").boxed();
    loop {
        match events.next().await {
            Some(Ok(WatchEvent::Deleted(_))) => break,
            Some(Ok(_)) => {}
            other => panic!("watch ended before DELETED: {other:?}"),
        }
    }
    h.sim.release_list_responses();

    // The late LIST is older than the deletion: after it, executor 2 must still end up
    // Deleted (the state a round counts as nothing, so it gets replaced).
    until("the resync, then executor 2 deleted", || async {
        let snapshot = h.apps.snapshot(&id("app-slow")).await.expect("snapshot");
        snapshot.full_resync_at >= resync_at
            && snapshot
                .executors
                .get(&ExecutorId(2))
                .is_none_or(|e| e.state == ExecutorState::Deleted)
    })
    .await;
    h.apps.stop(&id("app-slow")).await.unwrap();
}

#[tokio::test]
async fn a_watch_expired_by_compaction_relists_into_a_resync() {
    let h = harness().await;
    // Live watch events are lost and every watch closes after a second.
    h.sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        watch_close_after_seconds: Some(1),
        ..FaultSettings::default()
    });
    let mut req = request("app-410", NS);
    req.settings.executor_timeout = Duration::from_secs(600);
    start(&h.apps, req).await;
    until("namespace watch listed", || async {
        h.apps.is_namespace_synced(NS)
    })
    .await;
    set_targets_and_round(&h, "app-410", 2).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-410").await, range(1, 2));
    // The history is compacted: the re-watch from the last resourceVersion gets 410
    // Expired, the watcher relists, and the listing replaces the snapshot (no clock move).
    h.sim.compact_history();
    wait_seen(&h.apps, "app-410", range(1, 2)).await;
    h.sim.set_faults(FaultSettings::default());
    h.apps.stop(&id("app-410")).await.unwrap();
}

#[tokio::test]
async fn health_follows_the_api_server() {
    // Nothing listens on port 9: the API server never answers.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let unreachable = Builder::new(
        kube::Client::try_from(config).unwrap(),
        Arc::new(ManualClock::starting_now()),
    )
    .build()
    .into_applications();
    assert!(!unreachable.is_synced());
    // The first thing a Start needs is its namespace's shard, whose Lease cannot be had.
    let err = unreachable.start(request("app-h", NS)).await.unwrap_err();
    assert!(
        matches!(&err, AppError::Unavailable(m) if m.contains("cannot be read or written")),
        "{err:?}"
    );
    assert!(!unreachable.is_synced());

    // A reachable API server: healthy even before any application starts.
    let h = harness().await;
    until("synced", || async { h.apps.is_synced() }).await;
    assert!(h.apps.watched_namespaces().is_empty());
}

#[tokio::test]
async fn connect_uses_the_configured_kubeconfig() {
    let sim = manual_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).unwrap();
    let settings = spark_pod_allocator::config::KubernetesSettings {
        kubeconfig: Some(path),
        in_cluster: spark_pod_allocator::config::InCluster::False,
        ..Default::default()
    };
    let client = spark_pod_allocator::k8s::connect(&settings).await.unwrap();
    let api: Api<Pod> = Api::namespaced(client, NS);
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    let missing = spark_pod_allocator::config::KubernetesSettings {
        kubeconfig: Some(dir.path().join("nope")),
        ..Default::default()
    };
    let Err(err) = spark_pod_allocator::k8s::connect(&missing).await else {
        panic!("a missing kubeconfig file must be refused");
    };
    assert!(err.to_string().contains("kubeconfig"), "{err}");
}

/// Creates sent to the API server so far (refused ones included), by every client.
fn pod_creates_sent(sim: &SimCluster) -> u64 {
    sim.requests()
        .iter()
        .filter(|((_, verb, resource), _)| verb == "create" && resource == "pods")
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test]
async fn a_create_refused_429_ends_its_round_and_the_next_waits_for_retry_after() {
    use spark_pod_allocator::k8s::request::DEFAULT_RETRY_AFTER;
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    // No client-side cap: only the API server's answers hold the creates back.
    let mut settings = Settings::default();
    settings.kubernetes.qps = 1_000_000;
    settings.kubernetes.burst = 1_000_000;
    settings.kubernetes.create_concurrency = 8;
    // Built as the service builds its client: kube's own retry layer off, so a 429 is
    // answered to the service and not retried behind its back.
    let mut config = sim.kube_config();
    config.default_retry = false;
    let client = spark_pod_allocator::k8s::client(config).expect("client");
    let apps = test_kit::service::applications(client, &clock, settings);
    let app = "app-shed";
    let mut req = request(app, NS);
    req.settings.batch_size = 200;
    req.settings.policy = AllocationPolicy::Adaptive;
    start(&apps, req).await;
    // The API server admits 20 writes a second and sheds the rest as API Priority and
    // Fairness does: a plain-text 429 whose Retry-After header kube does not keep, so the
    // service waits its default second.
    sim.set_faults(FaultSettings {
        max_writes_per_second: 20,
        retry_after_seconds: 3,
        ..FaultSettings::default()
    });
    test_kit::service::set_targets_and_round(&apps, app, targets(200)).await;

    let sent = pod_creates_sent(&sim);
    let accepted = cluster_ids(&sim, NS, app).await;
    let refused = sent - accepted.len() as u64;
    assert!(sim.writes_shed() >= 1, "the API server shed writes");
    assert!(
        !accepted.is_empty() && accepted.len() <= 25,
        "about a second's worth admitted: {accepted:?}"
    );
    // Only the creates in flight when the first 429 came back were refused: none of the
    // round was sent after it, and none refused was tried again.
    assert!(
        (1..=8).contains(&refused),
        "{refused} creates refused of {sent} sent ({} accepted)",
        accepted.len()
    );
    let status = apps.status(&id(app)).await.unwrap();
    // Ids of creates never sent were given back; those refused stay spent.
    assert_eq!(status.last_executor_id, sent, "{status:?}");
    // No round before the wait is over.
    let retry_at = clock.now().plus(DEFAULT_RETRY_AFTER);
    let reported = apps.application_status(&id(app)).await.unwrap();
    assert_eq!(reported.backoff_until, Some(retry_at));
    assert_eq!(apps.next_round_at(&id(app)).await.unwrap(), retry_at);

    // The server admits everything again: once the wait is over, the next round creates
    // the rest with new ids, none reusing one a refused create had.
    sim.set_faults(FaultSettings::default());
    test_kit::service::advance_round(&apps, &clock, app, DEFAULT_RETRY_AFTER).await;
    let ids = cluster_ids(&sim, NS, app).await;
    assert_eq!(ids.len(), 200);
    let refused_ids: BTreeSet<u64> = (1..=sent).filter(|i| !accepted.contains(i)).collect();
    assert!(ids.is_disjoint(&refused_ids), "{refused_ids:?} reused");
    assert_eq!(ids.last().copied(), Some(200 + refused));
    apps.stop(&id(app)).await.unwrap();
}
