//! Applications start, stop and stay apart: idempotent Start and its input checks, one actor
//! per id, the driver pod as owner, ids that sanitise alike, Stop and its retry.

use super::*;

#[tokio::test]
async fn stop_leaves_no_pod_and_forgets_the_application() {
    let h = harness().await;
    start(&h.apps, request("app-stop", NS)).await;
    set_targets_and_round(&h, "app-stop", 5).await;
    set_running(&h.sim, "app-stop", 1).await;
    assert_eq!(h.apps.watched_namespaces(), vec![NS.to_string()]);
    assert_eq!(h.apps.stop(&id("app-stop")).await.unwrap(), 5);
    assert!(cluster_ids(&h.sim, NS, "app-stop").await.is_empty());
    assert!(
        h.apps.watched_namespaces().is_empty(),
        "last app left: watch stopped"
    );
    for result in [
        h.apps.stop(&id("app-stop")).await.map(|_| ()),
        h.apps.set_total_expected(&id("app-stop"), targets(1)).await,
        h.apps
            .is_deleted(&id("app-stop"), ExecutorId(1))
            .await
            .map(|_| ()),
        h.apps.status(&id("app-stop")).await.map(|_| ()),
    ] {
        assert!(matches!(result, Err(AppError::NotFound(_))), "{result:?}");
    }
}

#[tokio::test]
async fn applications_in_one_namespace_share_a_watch_but_not_pods() {
    let h = harness().await;
    start(&h.apps, request("app-x", NS)).await;
    start(&h.apps, request("app-y", NS)).await;
    assert_eq!(h.apps.watched_namespaces(), vec![NS.to_string()]);
    set_targets_and_round(&h, "app-x", 3).await;
    set_targets_and_round(&h, "app-y", 2).await;
    wait_seen(&h.apps, "app-x", range(1, 3)).await;
    wait_seen(&h.apps, "app-y", range(1, 2)).await;
    // Both use ids from 1: each application has its own sequence.
    assert_eq!(cluster_ids(&h.sim, NS, "app-x").await, range(1, 3));
    assert_eq!(cluster_ids(&h.sim, NS, "app-y").await, range(1, 2));
    // A failure of y's executor 1 is y's business only.
    set_running(&h.sim, "app-y", 1).await;
    set_failed(&h.sim, "app-y", 1).await;
    until("y sees its failure", || async {
        let snap = h.apps.snapshot(&id("app-y")).await.unwrap();
        matches!(
            snap.executors.get(&ExecutorId(1)).map(|e| &e.state),
            Some(ExecutorState::Failed { .. })
        )
    })
    .await;
    let x_before = h.apps.snapshot(&id("app-x")).await.unwrap();
    assert!(
        x_before
            .executors
            .values()
            .all(|e| e.state == ExecutorState::Pending)
    );
    advance_round(&h, "app-y", BATCH_DELAY).await;
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-y").await,
        BTreeSet::from([2, 3])
    );
    assert_eq!(cluster_ids(&h.sim, NS, "app-x").await, range(1, 3));
    // Stopping x leaves y untouched.
    assert_eq!(h.apps.stop(&id("app-x")).await.unwrap(), 3);
    assert_eq!(h.apps.watched_namespaces(), vec![NS.to_string()]);
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-y").await,
        BTreeSet::from([2, 3])
    );
    advance_round(&h, "app-y", BATCH_DELAY).await;
    assert_eq!(h.apps.stop(&id("app-y")).await.unwrap(), 2);
}

#[tokio::test]
async fn start_is_idempotent_and_checks_its_inputs() {
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    let mut config = Settings::default();
    config.app.allowed_namespaces = vec![NS.to_string(), "other".to_string()];
    let apps = applications(&sim, &clock, config);
    let first = apps.start(request("app-i", NS)).await.unwrap();
    assert!(!first.resumed);
    let again = apps.start(request("app-i", NS)).await.unwrap();
    assert!(again.resumed);
    let other = apps.start(request("app-i", "other")).await.unwrap_err();
    assert!(matches!(other, AppError::AlreadyExists { .. }), "{other:?}");

    let denied = apps.start(request("app-j", "elsewhere")).await.unwrap_err();
    assert!(
        matches!(denied, AppError::PermissionDenied(_)),
        "{denied:?}"
    );

    let mut no_driver = request("app-k", NS);
    no_driver.driver_pod_name = Some("driver-0".into());
    let err = apps.start(no_driver).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "No pod was found named driver-0 in the cluster in the namespace default"
    );

    let mut imageless = request("app-k", NS);
    let mut bad = template();
    if let Some(spec) = bad.spec.as_mut() {
        spec.containers[0].image = None;
    }
    imageless.templates.insert(ResourceProfileId(2), bad);
    let err = apps.start(imageless).await.unwrap_err();
    assert!(
        matches!(&err, AppError::InvalidArgument { field, .. } if field == "resource_profile_templates[2]"),
        "{err:?}"
    );

    let err = apps
        .set_total_expected(&id("app-i"), BTreeMap::from([(ResourceProfileId(7), 1)]))
        .await
        .unwrap_err();
    assert!(matches!(err, AppError::FailedPrecondition(_)), "{err:?}");

    let mut bad_settings = request("app-k", NS);
    bad_settings.settings.batch_delay = Duration::from_millis(50);
    let err = apps.start(bad_settings).await.unwrap_err();
    assert!(
        matches!(&err, AppError::InvalidArgument { field, .. } if field == "settings.batch_delay_ms"),
        "{err:?}"
    );
}

#[tokio::test]
async fn driver_pod_owns_the_executors() {
    let h = harness().await;
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let mut driver = template();
    driver.metadata.name = Some("driver-1".into());
    let driver = api.create(&PostParams::default(), &driver).await.unwrap();
    let mut req = request("app-own", NS);
    req.driver_pod_name = Some("driver-1".into());
    start(&h.apps, req).await;
    set_targets_and_round(&h, "app-own", 1).await;
    let pod = api.get("app-own-exec-1").await.unwrap();
    let owner = &pod.metadata.owner_references.unwrap()[0];
    assert_eq!(owner.name, "driver-1");
    assert_eq!(Some(&owner.uid), driver.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    h.apps.stop(&id("app-own")).await.unwrap();
}

#[tokio::test]
async fn application_ids_that_sanitise_alike_do_not_share_pod_names() {
    let h = harness().await;
    // Both give the DNS label `spark-app-1`: without the hash of the exact id, the second
    // application's creates would all be refused 409 AlreadyExists.
    for app in ["spark-app-1", "Spark_app.1"] {
        start(&h.apps, request(app, NS)).await;
    }
    set_targets_and_round(&h, "spark-app-1", 3).await;
    set_targets_and_round(&h, "Spark_app.1", 3).await;
    for app in ["spark-app-1", "Spark_app.1"] {
        assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 3), "{app}");
        wait_seen(&h.apps, app, range(1, 3)).await;
        let status = h.apps.status(&id(app)).await.unwrap();
        assert_eq!(status.last_executor_id, 3, "{app}: no create failed");
    }
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    assert!(api.get("spark-app-1-exec-1").await.is_ok());
    assert_eq!(h.apps.stop(&id("spark-app-1")).await.unwrap(), 3);
    assert_eq!(h.apps.stop(&id("Spark_app.1")).await.unwrap(), 3);
}

#[tokio::test]
async fn application_ids_with_dots_and_underscores_select_their_pods_only() {
    let h = harness().await;
    // Spark application ids are label values: capitals, '.', '_' and '-' reach the API
    // server unescaped in every label selector (list, watch, collection delete).
    start(&h.apps, request("Spark_app.1-x", NS)).await;
    start(&h.apps, request("Spark_app.1", NS)).await;
    set_targets_and_round(&h, "Spark_app.1-x", 2).await;
    set_targets_and_round(&h, "Spark_app.1", 1).await;
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    assert!(
        api.get(&format!(
            "spark-app-1-x-{}-exec-1",
            stable_hash("Spark_app.1-x")
        ))
        .await
        .is_ok(),
        "prefix sanitised, with the hash of the exact id"
    );
    wait_seen(&h.apps, "Spark_app.1-x", range(1, 2)).await;
    wait_seen(&h.apps, "Spark_app.1", range(1, 1)).await;
    assert_eq!(h.apps.stop(&id("Spark_app.1-x")).await.unwrap(), 2);
    assert_eq!(cluster_ids(&h.sim, NS, "Spark_app.1").await, range(1, 1));
    assert_eq!(h.apps.stop(&id("Spark_app.1")).await.unwrap(), 1);
}

#[tokio::test]
async fn a_failed_stop_can_be_retried_and_loses_no_pod() {
    let h = harness().await;
    start(&h.apps, request("app-retry", NS)).await;
    set_targets_and_round(&h, "app-retry", 2).await;
    h.sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        ..FaultSettings::default()
    });
    let err = h.apps.stop(&id("app-retry")).await.unwrap_err();
    assert!(matches!(err, AppError::Kubernetes(_)), "{err:?}");
    // Stopped (no more rounds) but not forgotten: its pods are still to delete.
    assert!(matches!(
        h.apps.status(&id("app-retry")).await,
        Err(AppError::NotFound(_))
    ));
    h.sim.set_faults(FaultSettings::default());
    assert_eq!(cluster_ids(&h.sim, NS, "app-retry").await, range(1, 2));
    assert_eq!(h.apps.stop(&id("app-retry")).await.unwrap(), 2);
    assert!(cluster_ids(&h.sim, NS, "app-retry").await.is_empty());
}

#[tokio::test]
async fn concurrent_starts_of_one_application_make_one_actor() {
    let h = harness().await;
    let (a, b) = tokio::join!(
        h.apps.start(request("app-twice", NS)),
        h.apps.start(request("app-twice", NS))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    // One of them started it, the other found it running.
    assert_eq!(
        [a.resumed, b.resumed].iter().filter(|r| **r).count(),
        1,
        "{a:?} {b:?}"
    );
    until("start round", || async {
        h.apps.rounds(&id("app-twice")).await.unwrap() >= 1
    })
    .await;
    set_targets_and_round(&h, "app-twice", 2).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-twice").await, range(1, 2));
    assert_eq!(h.apps.stop(&id("app-twice")).await.unwrap(), 2);
}
