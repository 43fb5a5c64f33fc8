//! The service follows each application's driver pod through the namespace's shared
//! watches, whatever the pod's labels (Start labels it): when it Fails or Succeeds no
//! executor is created any more, the executors are deleted (delete-on-termination) and the
//! application is forgotten after the grace period; when it is deleted, all that at once.
//! An id record that cannot be written spends no executor id. Over real gRPC against the
//! simulated cluster; the grace period runs on the injected clock.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use spark_pod_allocator::app::Clock;
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::k8s::id_record::LAST_EXECUTOR_ID_ANNOTATION;
use spark_pod_allocator::k8s::watch::FOLLOWED_DRIVER_LABEL;
use spark_pod_allocator::proto;
use spark_pod_allocator_sim::FaultSettings;
use test_kit::grpc::{Harness, quiet_cluster, start_request};
use test_kit::service::id;
use test_kit::wait::until;

const NS: &str = "default";
const GRACE: Duration = Duration::from_secs(300);

async fn harness() -> Harness {
    let mut config = Settings::default();
    config.app.driver_end_grace_ms = u64::try_from(GRACE.as_millis()).expect("grace in ms");
    Harness::start_with_config(quiet_cluster(), ServeSettings::default(), config).await
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
    create_pod(h, name, labels).await;
}

/// A pod with none of Spark's labels, as a notebook's.
async fn create_plain_pod(h: &Harness, name: &str) {
    create_pod(h, name, json!({"app": "notebook"})).await;
}

async fn create_pod(h: &Harness, name: &str, labels: serde_json::Value) {
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

/// Moves the clock to the application's next round (after its backoff, if any) and waits
/// for the round to be carried out.
async fn next_round(h: &Harness, app: &str) {
    let app = id(app);
    let before = h.applications.rounds(&app).await.expect("rounds");
    let due = h
        .applications
        .next_round_at(&app)
        .await
        .expect("next round");
    h.clock.set(due.max(h.clock.now()));
    until("the next round", async || {
        h.applications.rounds(&app).await.expect("rounds") > before
    })
    .await;
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
async fn an_unlabelled_driver_pod_is_followed_and_its_deletion_stops_its_application() {
    let h = harness().await;
    // A notebook's or a client-mode driver's pod: none of Spark's labels.
    create_plain_pod(&h, "notebook-0").await;
    start(&h, "app-n", "notebook-0", true).await;
    let driver = h.status("app-n").await.unwrap().driver.unwrap();
    assert!(driver.followed);
    let labelled = pods_api(&h).get("notebook-0").await.expect("driver pod");
    assert_eq!(
        labelled
            .metadata
            .labels
            .unwrap_or_default()
            .get(FOLLOWED_DRIVER_LABEL),
        Some(&"true".to_string()),
        "Start labels the driver pod for the namespace's driver watch"
    );
    h.set_total("app-n", 2).await;
    until("2 executor pods", async || {
        executor_pods(&h, "app-n").await == 2
    })
    .await;

    pods_api(&h)
        .delete("notebook-0", &DeleteParams::default())
        .await
        .expect("driver deleted");
    // As for a Spark-labelled driver: forgotten at once, its executors deleted first.
    until(
        "the application forgotten",
        async || matches!(h.status("app-n").await, Err(s) if s.code() == tonic::Code::NotFound),
    )
    .await;
    assert_eq!(executor_pods(&h, "app-n").await, 0, "its executors deleted");
}

#[tokio::test]
async fn a_failed_id_record_spends_no_executor_id_and_ids_stay_unique() {
    let h = harness().await;
    // Every watch event is dropped (from the watches opened now on): the service does not
    // see the driver pod go, only the periodic LIST (an interval away on the test's clock)
    // would.
    h.sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        ..FaultSettings::default()
    });
    create_plain_pod(&h, "notebook-1").await;
    start(&h, "app-r", "notebook-1", true).await;
    pods_api(&h)
        .delete("notebook-1", &DeleteParams::default())
        .await
        .expect("driver deleted");

    // Every round now plans 3 creates whose id record (the driver pod's annotation) is
    // answered 404: none is sent, and no id is spent.
    h.set_total("app-r", 3).await;
    let failures = |status: &proto::ApplicationStatus| {
        status
            .profiles
            .iter()
            .filter_map(|p| p.last_create_failure.as_ref())
            .map(|f| (f.reason.clone(), f.consecutive_failures))
            .next()
    };
    until("the first round's record failed", async || {
        failures(&h.status("app-r").await.expect("status")).is_some()
    })
    .await;
    for round in 1..=3 {
        let status = h.status("app-r").await.expect("status");
        assert_eq!(status.last_executor_id, 0, "no id spent: {status:?}");
        assert_eq!(executor_pods(&h, "app-r").await, 0);
        // Each of the round's 3 creates counts as failed.
        assert_eq!(
            failures(&status),
            Some(("IdNotRecorded".to_string(), 3 * round)),
            "{status:?}"
        );
        if round < 3 {
            next_round(&h, "app-r").await;
        }
    }

    // The driver pod is back (as Start labelled it): the record is written, and the
    // creates go out with the ids never sent, each once.
    create_pod(&h, "notebook-1", json!({FOLLOWED_DRIVER_LABEL: "true"})).await;
    next_round(&h, "app-r").await;
    until("3 executor pods", async || {
        executor_pods(&h, "app-r").await == 3
    })
    .await;
    let mut ids: Vec<u64> = h
        .pods(NS, "app-r")
        .await
        .iter()
        .map(|pod| {
            pod.metadata.labels.as_ref().unwrap()["spark-exec-id"]
                .parse()
                .unwrap()
        })
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(h.status("app-r").await.unwrap().last_executor_id, 3);
    let recorded = pods_api(&h).get("notebook-1").await.expect("driver pod");
    assert_eq!(
        recorded.metadata.annotations.unwrap_or_default()[LAST_EXECUTOR_ID_ANNOTATION],
        "3",
        "a restarted service starts above every id sent"
    );
}

#[tokio::test]
async fn an_ended_driver_pod_is_refused() {
    let h = harness().await;
    create_driver(&h, "driver-e", "app-e", true).await;
    set_driver_phase(&h, "driver-e", "Succeeded").await;
    let mut request = start_request("app-e", NS);
    request.driver_pod_name = "driver-e".into();
    let err = h.client.clone().start(request).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().starts_with("driver_pod_name: "), "{err:?}");
}
