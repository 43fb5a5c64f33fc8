//! The driver pod and claims a Start names need the caller's own rights to them.
use super::*;

const DORA: &str = "system:serviceaccount:team-a:dora";
const PAUL: &str = "system:serviceaccount:team-a:paul";

/// alice may also get and patch pods in team-a; dora may create, delete and list pods in
/// team-a but get and patch only her own driver pod; paul may get pods but not patch them.
fn driver_cluster() -> SimSettings {
    let mut settings = cluster();
    settings.access.tokens.extend([
        token("dora-token", DORA, &[], &[AUDIENCE]),
        token("paul-token", PAUL, &[], &[AUDIENCE]),
    ]);
    settings.access.grants.extend([
        grant(&[ALICE], &[], "team-a", &["get", "patch"]),
        grant(&[DORA, PAUL], &[], "team-a", &["create", "delete", "list"]),
        SimGrant {
            names: vec!["dora-driver".into()],
            ..grant(&[DORA], &[], "team-a", &["get", "patch"])
        },
        grant(&[PAUL], &[], "team-a", &["get"]),
    ]);
    settings
}

async fn create_driver_pod(h: &Harness, name: &str) -> k8s_openapi::api::core::v1::Pod {
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(h.sim.try_client().expect("client"), "team-a");
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .expect("pod");
    pods.create(&Default::default(), &pod)
        .await
        .expect("driver pod")
}

fn start_with_driver(app: &str, driver: &str) -> proto::StartRequest {
    let mut request = start_request(app, "team-a");
    request.driver_pod_name = driver.into();
    request
}

#[tokio::test]
async fn a_driver_pod_the_caller_may_not_get_answers_as_a_missing_one() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(driver_cluster(), auth()).await;
    let victim = create_driver_pod(&h, "alice-driver").await;
    create_driver_pod(&h, "dora-driver").await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(h.sim.try_client().expect("client"), "team-a");

    // dora names alice's driver pod, then one that does not exist: the same answer.
    let app = "spark-dora";
    let hidden = h
        .client
        .start(as_caller(
            "dora-token",
            start_with_driver(app, "alice-driver"),
        ))
        .await
        .unwrap_err();
    let missing = h
        .client
        .start(as_caller(
            "dora-token",
            start_with_driver(app, "ghost-driver"),
        ))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::FailedPrecondition, "{hidden:?}");
    assert_eq!(missing.code(), hidden.code());
    assert_eq!(
        hidden.message(),
        "No pod was found named alice-driver in the cluster in the namespace team-a"
    );
    assert_eq!(
        missing.message().replace("ghost-driver", "alice-driver"),
        hidden.message()
    );
    // Nothing was done with alice's pod, and nothing was started for dora.
    let after = pods.get("alice-driver").await.expect("alice's driver");
    assert_eq!(
        after.metadata.resource_version, victim.metadata.resource_version,
        "alice's driver pod was not patched"
    );
    assert!(h.applications.ownership(&app_id(app)).is_none());
    h.client
        .set_total_expected(as_caller("dora-token", targets_request(app, 2)))
        .await
        .expect_err("dora's application does not run");
    assert!(h.pods("team-a", app).await.is_empty());

    // paul may see alice's pod but not patch it: refused, naming the verb.
    let err = h
        .client
        .start(as_caller(
            "paul-token",
            start_with_driver("spark-paul", "alice-driver"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&format!(
            "{PAUL} may not patch pod alice-driver in namespace team-a"
        )],
    );
    assert!(h.applications.ownership(&app_id("spark-paul")).is_none());

    // With the rights on that one pod (a grant naming it), dora's own driver is taken; so
    // is alice's, by alice.
    h.client
        .start(as_caller(
            "dora-token",
            start_with_driver(app, "dora-driver"),
        ))
        .await
        .expect("dora names her own driver pod");
    alice_starts_with(&mut h, "spark-alice", "alice-driver").await;
    let status = h
        .client
        .get_status(as_caller("alice-token", status_request("spark-alice")))
        .await
        .expect("alice's status")
        .into_inner();
    assert_eq!(
        status.driver.map(|d| d.pod_name).as_deref(),
        Some("alice-driver")
    );
}

async fn alice_starts_with(h: &mut Harness, app: &str, driver: &str) {
    h.client
        .start(as_caller("alice-token", start_with_driver(app, driver)))
        .await
        .expect("alice starts with her driver pod");
}

/// A pod template whose executors get a generic ephemeral volume (a claim the cluster
/// creates for the pod).
const EPHEMERAL_TEMPLATE: &str = r#"{"spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}],
  "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}]}}"#;

#[tokio::test]
async fn claims_need_the_callers_own_right_to_create_claims() {
    let _serial = SERIAL.lock().await;
    // alice may also create claims in team-a; mallory, with the same pod rights, may not.
    let mut settings = cluster();
    settings.access.grants.push(SimGrant {
        resources: vec!["persistentvolumeclaims".into()],
        ..grant(&[ALICE], &[], "team-a", &["create"])
    });
    let mut h = Harness::start_with_auth(settings, auth()).await;
    let denied = format!("{MALLORY} may not create persistentvolumeclaims in namespace team-a");
    // Refused before its claim template is read: a broken one is not even reported.
    let with_claims = |app: &str, claim: &str| proto::StartRequest {
        executor_claim_templates: vec![claim.into()],
        ..start_request(app, "team-a")
    };
    let err = h
        .client
        .start(as_caller(
            "mallory-token",
            with_claims("spark-m1", "{{{ not yaml"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&denied, "executor_claim_templates"],
    );
    // A generic ephemeral volume makes the cluster create a claim for the pod.
    let err = h
        .client
        .start(as_caller(
            "mallory-token",
            proto::StartRequest {
                executor_pod_template: EPHEMERAL_TEMPLATE.into(),
                ..start_request("spark-m2", "team-a")
            },
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&denied, "executor_pod_template: spec.volumes[0].ephemeral"],
    );
    // Nor through a profile added later.
    h.client
        .start(as_caller(
            "mallory-token",
            start_request("spark-m3", "team-a"),
        ))
        .await
        .expect("mallory may start without claims");
    let err = h
        .client
        .set_total_expected(as_caller(
            "mallory-token",
            proto::SetTotalExpectedRequest {
                application_id: "spark-m3".into(),
                executors_per_profile: [(1, 2)].into(),
                resource_profile_templates: [(1, EPHEMERAL_TEMPLATE.to_string())].into(),
            },
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[
            &denied,
            "resource_profile_templates[1]: spec.volumes[0].ephemeral",
        ],
    );
    for app in ["spark-m1", "spark-m2"] {
        assert!(h.applications.ownership(&app_id(app)).is_none(), "{app}");
    }
    assert!(h.pods("team-a", "spark-m3").await.is_empty());
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(h.sim.try_client().expect("sim client"), "team-a");
    assert!(
        claims
            .list(&Default::default())
            .await
            .expect("claims")
            .items
            .is_empty()
    );

    // With the right, the same calls go through.
    let claim = r#"{"metadata": {"name": "{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}"#;
    h.client
        .start(as_caller(
            "alice-token",
            proto::StartRequest {
                executor_pod_template: EPHEMERAL_TEMPLATE.into(),
                ..with_claims("spark-alice", claim)
            },
        ))
        .await
        .expect("alice may create claims in team-a");
    h.client
        .set_total_expected(as_caller("alice-token", targets_request("spark-alice", 1)))
        .await
        .expect("alice scales");
    until("alice's executor", async || {
        h.pods("team-a", "spark-alice").await.len() == 1
    })
    .await;
}
