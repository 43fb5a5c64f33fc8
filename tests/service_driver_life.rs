//! The service follows each application's driver pod through the namespace's shared watch:
//! when it Fails or Succeeds no executor is created any more, the executors are deleted
//! (delete-on-termination) and the application is forgotten after the grace period; when
//! it is deleted, all that at once. Over real gRPC against the simulated cluster; the grace
//! period runs on the injected clock.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use spark_pod_allocator::app::ServiceOptions;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, quiet_cluster, start_request};
use test_kit::wait::until;

const NS: &str = "default";
const GRACE: Duration = Duration::from_secs(300);

async fn harness() -> Harness {
    let options = ServiceOptions {
        driver_end_grace: GRACE,
        ..ServiceOptions::default()
    };
    Harness::start_with_options(quiet_cluster(), ServeSettings::default(), options).await
}

fn pods_api(h: &Harness) -> Api<Pod> {
    Api::namespaced(h.sim.try_client().expect("sim client"), NS)
}

/// A driver pod as spark-submit makes it (labels `spark-app-selector`, `spark-role`).
async fn create_driver(h: &Harness, name: &str, app: &str, role_label: bool) {
    let mut labels = json!({"spark-app-selector": app});
    if role_label {
        labels["spark-role"] = json!("driver");
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .unwrap();
    pods_api(h)
        .create(&PostParams::default(), &pod)
        .await
        .expect("driver pod");
}

/// Plays the kubelet: the driver pod's phase becomes `phase`.
async fn set_driver_phase(h: &Harness, name: &str, phase: &str) {
    pods_api(h)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": phase}})),
        )
        .await
        .expect("status patch");
}

async fn start(h: &Harness, app: &str, driver: &str, delete_on_termination: bool) {
    let mut request = start_request(app, NS);
    request.driver_pod_name = driver.into();
    request.settings = Some(proto::AllocationSettings {
        delete_on_termination: Some(delete_on_termination),
        ..Default::default()
    });
    h.client.clone().start(request).await.expect("Start");
}

async fn executor_pods(h: &Harness, app: &str) -> usize {
    h.pods(NS, app).await.len()
}

#[tokio::test]
async fn a_failed_driver_stops_allocation_deletes_its_executors_and_is_forgotten_after_the_grace() {
    let h = harness().await;
    create_driver(&h, "driver-f", "app-f", true).await;
    start(&h, "app-f", "driver-f", true).await;
    let driver = h
        .status("app-f")
        .await
        .unwrap()
        .driver
        .expect("driver status");
    assert_eq!(driver.pod_name, "driver-f");
    assert!(driver.followed);
    assert_eq!(driver.ended_at_ms, 0);
    h.set_total("app-f", 3).await;
    until("3 executor pods", async || {
        executor_pods(&h, "app-f").await == 3
    })
    .await;
    until("the driver seen Pending", async || {
        h.clock.advance(Duration::from_secs(1));
        h.status("app-f").await.unwrap().driver.unwrap().phase == "Pending"
    })
    .await;

    set_driver_phase(&h, "driver-f", "Failed").await;
    until("the driver's end in GetStatus", async || {
        h.status("app-f").await.unwrap().driver.unwrap().phase == "Failed"
    })
    .await;
    let driver = h.status("app-f").await.unwrap().driver.unwrap();
    assert!(driver.ended_at_ms > 0);
    assert_eq!(
        driver.forget_at_ms - driver.ended_at_ms,
        GRACE.as_millis() as i64
    );
    until("its executors deleted", async || {
        executor_pods(&h, "app-f").await == 0
    })
    .await;

    // No executor is created any more, whatever the driver asks.
    let last_id = h.status("app-f").await.unwrap().last_executor_id;
    h.set_total("app-f", 5).await;
    for _ in 0..5 {
        h.clock.advance(Duration::from_secs(2));
        // A window for a round that must not come (a round would ask at once: nothing is
        // outstanding).
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    let during_grace = h
        .status("app-f")
        .await
        .expect("still known during the grace");
    assert_eq!(during_grace.last_executor_id, last_id);
    assert_eq!(executor_pods(&h, "app-f").await, 0);

    // After the grace period the application is forgotten.
    h.clock.advance(GRACE);
    until(
        "the application forgotten",
        async || matches!(h.status("app-f").await, Err(s) if s.code() == tonic::Code::NotFound),
    )
    .await;
    assert_eq!(executor_pods(&h, "app-f").await, 0);
    until("its namespace watch stopped", async || {
        h.applications.watched_namespaces().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_deleted_driver_ends_its_application_at_once() {
    let h = harness().await;
    create_driver(&h, "driver-d", "app-d", true).await;
    start(&h, "app-d", "driver-d", true).await;
    h.set_total("app-d", 2).await;
    until("2 executor pods", async || {
        executor_pods(&h, "app-d").await == 2
    })
    .await;

    pods_api(&h)
        .delete("driver-d", &DeleteParams::default())
        .await
        .expect("driver deleted");
    // No time passes on the service's clock: deleted means forgotten at once.
    until(
        "the application forgotten",
        async || matches!(h.status("app-d").await, Err(s) if s.code() == tonic::Code::NotFound),
    )
    .await;
    assert_eq!(
        executor_pods(&h, "app-d").await,
        0,
        "its executors deleted first"
    );
}

#[tokio::test]
async fn without_delete_on_termination_a_succeeded_driver_keeps_its_executor_pods() {
    let h = harness().await;
    create_driver(&h, "driver-s", "app-s", true).await;
    start(&h, "app-s", "driver-s", false).await;
    h.set_total("app-s", 2).await;
    until("2 executor pods", async || {
        executor_pods(&h, "app-s").await == 2
    })
    .await;

    set_driver_phase(&h, "driver-s", "Succeeded").await;
    until("the driver's end in GetStatus", async || {
        h.status("app-s").await.unwrap().driver.unwrap().phase == "Succeeded"
    })
    .await;
    h.clock.advance(GRACE);
    until(
        "the application forgotten",
        async || matches!(h.status("app-s").await, Err(s) if s.code() == tonic::Code::NotFound),
    )
    .await;
    assert_eq!(executor_pods(&h, "app-s").await, 2, "pods kept");
}

#[tokio::test]
async fn a_driver_pod_without_the_role_label_is_not_followed_and_an_ended_one_is_refused() {
    let h = harness().await;
    create_driver(&h, "driver-n", "app-n", false).await;
    start(&h, "app-n", "driver-n", true).await;
    let driver = h.status("app-n").await.unwrap().driver.unwrap();
    assert!(!driver.followed);
    pods_api(&h)
        .delete("driver-n", &DeleteParams::default())
        .await
        .expect("driver deleted");
    // Not followed: the application stays until Stop (a later round's id record fails).
    h.clock.advance(Duration::from_secs(1));
    assert!(h.status("app-n").await.is_ok());

    create_driver(&h, "driver-e", "app-e", true).await;
    set_driver_phase(&h, "driver-e", "Succeeded").await;
    let mut request = start_request("app-e", NS);
    request.driver_pod_name = "driver-e".into();
    let err = h.client.clone().start(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().starts_with("driver_pod_name: "), "{err:?}");
}
