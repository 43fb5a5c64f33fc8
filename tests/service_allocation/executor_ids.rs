//! A restarted service resumes and never reuses an executor id: the record in the driver pod or
//! in a ConfigMap is written before a pod is created.

use super::*;

#[tokio::test]
async fn a_restarted_service_resumes_without_reusing_ids() {
    let h = harness().await;
    start(&h.apps, request("app-r", NS)).await;
    set_targets_and_round(&h, "app-r", 5).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-r").await, range(1, 5));
    h.apps.shutdown().await;
    assert!(matches!(
        h.apps.status(&id("app-r")).await,
        Err(AppError::ShuttingDown)
    ));
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-r").await,
        range(1, 5),
        "shutdown keeps pods"
    );

    let restarted = applications(&h.sim, &h.clock, Settings::default());
    let started = restarted.start(request("app-r", NS)).await.unwrap();
    assert!(started.resumed);
    assert_eq!(started.last_executor_id, 5);
    // The start round runs at once; the resumed pods are outstanding, so the new target
    // waits for the next round.
    until("start round", || async {
        restarted.rounds(&id("app-r")).await.unwrap() >= 1
    })
    .await;
    let before = restarted.rounds(&id("app-r")).await.unwrap();
    restarted
        .set_total_expected(&id("app-r"), targets(7))
        .await
        .unwrap();
    h.clock.advance(BATCH_DELAY);
    until("resumed round", || async {
        restarted.rounds(&id("app-r")).await.unwrap() > before
    })
    .await;
    // The existing 5 count: only 2 more, with fresh ids.
    assert_eq!(cluster_ids(&h.sim, NS, "app-r").await, range(1, 7));
    assert_eq!(restarted.stop(&id("app-r")).await.unwrap(), 7);
}

#[tokio::test]
async fn a_resumed_application_reports_its_executors_before_any_target() {
    let h = harness().await;
    let app = "app-status";
    let p2 = ResourceProfileId(2);
    let mut req = request(app, NS);
    req.templates.insert(p2, template());
    start(&h.apps, req.clone()).await;
    set_targets_and_round(&h, app, 3).await;
    set_running(&h.sim, app, 1).await;
    set_running(&h.sim, app, 2).await;
    until("executors 1 and 2 running", || async {
        let snapshot = h.apps.snapshot(&id(app)).await.expect("snapshot");
        snapshot
            .executors
            .values()
            .filter(|e| e.state == ExecutorState::Running)
            .count()
            == 2
    })
    .await;
    h.apps.shutdown().await;

    let restarted = applications(&h.sim, &h.clock, Settings::default());
    let started = start(&restarted, req).await;
    assert!(started.resumed);
    // Once the resumed pods are in a round's snapshot, GetStatus shows them (profile 0 has
    // no target in this service yet), and the template-only profile 2 with zeros.
    until("the resumed pods in the snapshot", || async {
        restarted
            .snapshot(&id(app))
            .await
            .expect("snapshot")
            .executors
            .len()
            == 3
    })
    .await;
    let before = restarted.rounds(&id(app)).await.expect("rounds");
    h.clock.advance(BATCH_DELAY);
    until("a round of the resumed application", || async {
        restarted.rounds(&id(app)).await.expect("rounds") > before
    })
    .await;
    let status = restarted.status(&id(app)).await.expect("status");
    let summary: Vec<(i32, u32, u32, u32, u32)> = status
        .profiles
        .iter()
        .map(|(p, c)| (p.0, c.target, c.running, c.pending, c.newly_created))
        .collect();
    assert_eq!(summary, vec![(0, 0, 2, 1, 0), (2, 0, 0, 0, 0)]);
    assert_eq!(status.last_executor_id, 3);
    // Without a target the profile is left alone: nothing created, nothing deleted.
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 3));
    assert!(status.deleted.is_empty());
    assert_eq!(restarted.stop(&id(app)).await.expect("stop"), 3);
}

#[tokio::test]
async fn a_restarted_service_never_reuses_the_ids_of_pods_already_gone() {
    let h = harness().await;
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let mut driver = template();
    driver.metadata.name = Some("driver-gone".into());
    api.create(&PostParams::default(), &driver).await.unwrap();
    let mut req = request("app-gone", NS);
    req.driver_pod_name = Some("driver-gone".into());
    start(&h.apps, req.clone()).await;
    set_targets_and_round(&h, "app-gone", 5).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-gone").await, range(1, 5));
    h.apps.shutdown().await;
    // While no service runs, the pods of the highest ids go (deleted on termination,
    // evicted, removed by hand).
    for exec in [4, 5] {
        api.delete(&format!("app-gone-exec-{exec}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    assert_eq!(cluster_ids(&h.sim, NS, "app-gone").await, range(1, 3));

    let restarted = applications(&h.sim, &h.clock, Settings::default());
    let started = restarted.start(req).await.unwrap();
    assert!(started.resumed);
    assert_eq!(started.last_executor_id, 5, "ids 4 and 5 were handed out");
    until("start round", || async {
        restarted.rounds(&id("app-gone")).await.unwrap() >= 1
    })
    .await;
    let before = restarted.rounds(&id("app-gone")).await.unwrap();
    restarted
        .set_total_expected(&id("app-gone"), targets(5))
        .await
        .unwrap();
    h.clock.advance(BATCH_DELAY);
    until("resumed round", || async {
        restarted.rounds(&id("app-gone")).await.unwrap() > before
    })
    .await;
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-gone").await,
        BTreeSet::from([1, 2, 3, 6, 7])
    );
    assert_eq!(restarted.stop(&id("app-gone")).await.unwrap(), 5);
}

#[tokio::test]
async fn no_executor_is_created_with_an_id_the_driver_pod_does_not_record() {
    let h = harness().await;
    // Watch events are dropped, so the service does not see the driver pod go (it would
    // end the application): only the periodic LIST, every 30 s, shows it the pods.
    h.sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        ..FaultSettings::default()
    });
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let mut driver = template();
    driver.metadata.name = Some("driver-rec".into());
    api.create(&PostParams::default(), &driver).await.unwrap();
    let mut req = request("app-rec", NS);
    req.driver_pod_name = Some("driver-rec".into());
    // The executors must not time out before the periodic LIST shows them.
    req.settings.executor_timeout = Duration::from_secs(600);
    start(&h.apps, req).await;
    set_targets_and_round(&h, "app-rec", 2).await;
    let driver = api.get("driver-rec").await.unwrap();
    assert_eq!(
        driver.metadata.annotations.unwrap()["spark-pod-allocator/last-executor-id"],
        "2"
    );
    // Seen (by the periodic LIST), so they no longer hold back the next batch.
    h.clock.advance(Duration::from_secs(30));
    wait_seen(&h.apps, "app-rec", range(1, 2)).await;
    // The driver pod goes, unseen: the next ids cannot be recorded, so nothing is created
    // with them and no id is spent, and the round backs off as for refused creates.
    api.delete("driver-rec", &DeleteParams::default())
        .await
        .unwrap();
    h.apps
        .set_total_expected(&id("app-rec"), targets(4))
        .await
        .unwrap();
    advance_round(&h, "app-rec", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-rec").await, range(1, 2));
    let status = h.apps.status(&id("app-rec")).await.unwrap();
    assert_eq!(status.last_executor_id, 2);
    assert_eq!(
        h.apps.next_round_at(&id("app-rec")).await.unwrap().0,
        h.clock.now().0 + 2000
    );
    h.apps.stop(&id("app-rec")).await.unwrap();
}

/// The ConfigMap recording the last executor id of an application without a driver pod.
fn id_config_map(app: &str) -> String {
    let sanitised: String = app
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!("spark-pod-allocator-{sanitised}-{}", stable_hash(app))
}

#[tokio::test]
async fn without_a_driver_pod_a_restarted_service_never_reuses_the_ids_of_pods_already_gone() {
    let h = harness().await;
    let pods: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let config_maps: Api<ConfigMap> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let app = "App_nodriver";
    start(&h.apps, request(app, NS)).await;
    set_targets_and_round(&h, app, 5).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 5));
    let record = config_maps.get(&id_config_map(app)).await.unwrap();
    assert_eq!(record.data.unwrap()["last-executor-id"], "5");
    let labels = record.metadata.labels.unwrap();
    assert_eq!(labels["spark-app-selector"], app);
    assert_eq!(
        labels["app.kubernetes.io/managed-by"],
        "spark-pod-allocator"
    );
    h.apps.shutdown().await;
    // While no service runs, the pods of the highest ids go.
    for exec in [4, 5] {
        let name = format!("app-nodriver-{}-exec-{exec}", stable_hash(app));
        pods.delete(&name, &DeleteParams::default()).await.unwrap();
    }
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 3));

    let restarted = applications(&h.sim, &h.clock, Settings::default());
    let started = restarted.start(request(app, NS)).await.unwrap();
    assert!(started.resumed);
    assert_eq!(started.last_executor_id, 5, "ids 4 and 5 were handed out");
    until("start round", || async {
        restarted.rounds(&id(app)).await.unwrap() >= 1
    })
    .await;
    let before = restarted.rounds(&id(app)).await.unwrap();
    restarted
        .set_total_expected(&id(app), targets(5))
        .await
        .unwrap();
    h.clock.advance(BATCH_DELAY);
    until("resumed round", || async {
        restarted.rounds(&id(app)).await.unwrap() > before
    })
    .await;
    assert_eq!(
        cluster_ids(&h.sim, NS, app).await,
        BTreeSet::from([1, 2, 3, 6, 7])
    );
    let record = config_maps.get(&id_config_map(app)).await.unwrap();
    assert_eq!(record.data.unwrap()["last-executor-id"], "7");
    // Stop deletes the pods, then the record.
    assert_eq!(restarted.stop(&id(app)).await.unwrap(), 5);
    assert!(
        config_maps
            .get_opt(&id_config_map(app))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn no_executor_is_created_with_an_id_the_config_map_does_not_record() {
    let h = harness().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    start(&h.apps, request("app-cm", NS)).await;
    set_targets_and_round(&h, "app-cm", 2).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-cm").await, range(1, 2));
    // Seen, so they no longer hold back the next batch.
    wait_seen(&h.apps, "app-cm", range(1, 2)).await;
    // The record can no longer be written (an immutable ConfigMap refuses new data), so
    // nothing is created with the next ids and none is spent, and the round backs off as
    // for refused creates.
    config_maps
        .patch(
            &id_config_map("app-cm"),
            &PatchParams::default(),
            &Patch::Merge(json!({"immutable": true})),
        )
        .await
        .unwrap();
    h.apps
        .set_total_expected(&id("app-cm"), targets(4))
        .await
        .unwrap();
    advance_round(&h, "app-cm", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-cm").await, range(1, 2));
    let status = h.apps.status(&id("app-cm")).await.unwrap();
    assert_eq!(status.last_executor_id, 2);
    assert_eq!(
        h.apps.next_round_at(&id("app-cm")).await.unwrap().0,
        h.clock.now().0 + 2000
    );
    // Once the record can be written again (here: the ConfigMap is gone and is created
    // anew), the next round creates with the ids never sent, each once.
    config_maps
        .delete(&id_config_map("app-cm"), &DeleteParams::default())
        .await
        .unwrap();
    advance_round(&h, "app-cm", Duration::from_secs(2)).await;
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-cm").await,
        BTreeSet::from([1, 2, 3, 4])
    );
    let record = config_maps.get(&id_config_map("app-cm")).await.unwrap();
    assert_eq!(record.data.unwrap()["last-executor-id"], "4");
    h.apps.stop(&id("app-cm")).await.unwrap();
}
