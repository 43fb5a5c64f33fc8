//! Authorization of an application's calls: pod rights, its owner, an admin, a restart.
use super::*;

#[tokio::test]
async fn start_needs_create_and_delete_pods_in_the_namespace() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let err = h
        .client
        .start(as_caller("eve-token", start_request("spark-eve", "team-a")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &["eve may not create pods in namespace team-a"],
    );
    let err = h
        .client
        .start(as_caller(
            "carol-token",
            start_request("spark-carol", "team-b"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &["carol may not delete pods in namespace team-b"],
    );
    // Rights in one namespace give none in another (the confused deputy).
    let err = h
        .client
        .start(as_caller(
            "mallory-token",
            start_request("spark-m", "team-b"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&format!(
            "{MALLORY} may not create pods in namespace team-b"
        )],
    );
    for (app, namespace) in [
        ("spark-eve", "team-a"),
        ("spark-carol", "team-b"),
        ("spark-m", "team-b"),
    ] {
        assert!(h.pods(namespace, app).await.is_empty());
        assert!(h.applications.ownership(&app_id(app)).is_none());
    }
    // With the rights, the same call goes through.
    let started = h
        .client
        .start(as_caller(
            "alice-token",
            start_request("spark-alice", "team-a"),
        ))
        .await
        .expect("alice may start in team-a")
        .into_inner();
    assert!(!started.resumed);
}

#[tokio::test]
async fn only_the_owner_or_an_admin_may_call_an_application() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-alice";
    alice_starts(&mut h, app, 2).await;
    let owned = ["started by another identity"];
    let denied = Code::PermissionDenied;
    // mallory has every pod right in team-a, but the application is not hers.
    let m = "mallory-token";
    assert_code(
        &h.client
            .get_status(as_caller(m, status_request(app)))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .set_total_expected(as_caller(m, targets_request(app, 50)))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .is_deleted(as_caller(m, is_deleted_request(app, "1")))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .update_registered_executors(as_caller(
                m,
                proto::UpdateRegisteredExecutorsRequest {
                    application_id: app.into(),
                    executor_ids: vec![],
                    running_tasks: Default::default(),
                },
            ))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .watch_executors(as_caller(m, watch_request(app, 0)))
            .await
            .expect_err("watch refused"),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .stop(as_caller(m, stop_request(app)))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    // Nothing mallory asked for happened.
    let status = h
        .client
        .get_status(as_caller("alice-token", status_request(app)))
        .await
        .expect("alice reads her application")
        .into_inner();
    assert_eq!(status.profiles[0].target, 2);
    // An admin may act on any application.
    h.client
        .get_status(as_caller("ops-token", status_request(app)))
        .await
        .expect("the admin reads it");
    h.client
        .stop(as_caller("ops-token", stop_request(app)))
        .await
        .expect("the admin stops it");
}

#[tokio::test]
async fn a_hijacker_starting_first_never_hands_its_template_to_the_victim() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-victim";
    let mut evil = start_request(app, "team-a");
    evil.executor_pod_template = TEMPLATE.replace("spark:4", "evil:latest");
    h.client
        .start(as_caller("mallory-token", evil))
        .await
        .expect("mallory may start an application in team-a");
    // The victim's Start is refused, never answered `resumed` with mallory's template.
    let err = h
        .client
        .start(as_caller("alice-token", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &["spark-victim", "another identity"],
    );
    // Nor can the victim be led to scale mallory's pods.
    assert_code(
        &h.client
            .set_total_expected(as_caller("alice-token", targets_request(app, 3)))
            .await
            .unwrap_err(),
        Code::PermissionDenied,
        &["another identity"],
    );
    assert!(h.pods("team-a", app).await.is_empty());
    assert_eq!(
        h.applications.ownership(&app_id(app)).and_then(|o| o.owner),
        Some(MALLORY.to_string())
    );
}

#[tokio::test]
async fn the_owner_is_kept_in_the_registration_and_survives_a_restart() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-kept";
    alice_starts(&mut h, app, 1).await;
    let client = h.sim.try_client().expect("client");
    let service_ns = h.settings.registrations.namespace().to_string();
    let clock = h.clock.clone();
    until("the registration is written with its owner", || {
        let (client, service_ns, clock) = (client.clone(), service_ns.clone(), clock.clone());
        async move {
            clock.advance(Duration::from_secs(1));
            test_kit::service::stored_registration(&client, &service_ns, "team-a", app)
                .await
                .is_some_and(|r| r.owner.as_deref() == Some(ALICE) && r.targets.get(&0) == Some(&1))
        }
    })
    .await;
    h.restart().await;
    let resumed = h.applications.resume_registered().await.expect("resume");
    assert_eq!(resumed, vec![app_id(app)]);
    let err = h
        .client
        .start(as_caller("mallory-token", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(&err, Code::PermissionDenied, &["another identity"]);
    let again = h
        .client
        .start(as_caller("alice-token", start_request(app, "team-a")))
        .await
        .expect("the owner starts it again")
        .into_inner();
    assert!(again.resumed);
}
