//! Kubernetes failures seen by a driver over real gRPC: the matching code with the API
//! server's own message, and nothing lost — the same call succeeds once the API server
//! recovers.

use spark_pod_allocator_sim::FaultSettings;
use test_kit::grpc::{Harness, start_request};
use test_kit::requests::*;
use tonic::Code;

/// Every API request answered 500 InternalError.
fn failing() -> FaultSettings {
    FaultSettings {
        error_500_fraction: 1.0,
        ..FaultSettings::default()
    }
}

#[tokio::test]
async fn start_reports_the_api_server_failure_and_succeeds_after_it_recovers() {
    let mut h = Harness::start().await;

    h.sim.set_faults(failing());
    let status = h
        .client
        .start(start_request("spark-k8s", "team-a"))
        .await
        .expect_err("500");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("Internal error occurred: injected fault"),
        "{status:?}"
    );

    // (429 is retried by kube's client, honouring Retry-After, before it could surface:
    // its mapping to RESOURCE_EXHAUSTED is covered by the unit tests of grpc::error.)

    // The failed Starts left nothing behind: the application is unknown, then starts fresh.
    // While the service reads its registrations again after the outage it cannot tell yet
    // and answers UNAVAILABLE (which clients retry); then NOT_FOUND.
    h.sim.set_faults(FaultSettings::default());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let unknown = loop {
        let status = h
            .client
            .get_status(status_request("spark-k8s"))
            .await
            .expect_err("not started");
        if status.code() != Code::Unavailable || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let started = h
        .client
        .start(start_request("spark-k8s", "team-a"))
        .await
        .expect("start")
        .into_inner();
    assert_eq!((started.resumed, started.last_executor_id), (false, 0));
    h.stop_server().await;
}

#[tokio::test]
async fn a_stop_that_kubernetes_refused_can_be_retried() {
    let mut h = Harness::start().await;
    h.client
        .start(start_request("spark-stop", "team-a"))
        .await
        .expect("start");

    h.sim.set_faults(failing());
    let status = h
        .client
        .stop(stop_request("spark-stop"))
        .await
        .expect_err("500");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("injected fault"), "{status:?}");

    h.sim.set_faults(FaultSettings::default());
    let stopped = h
        .client
        .stop(stop_request("spark-stop"))
        .await
        .expect("retried stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 0);
    let status = h
        .client
        .stop(stop_request("spark-stop"))
        .await
        .expect_err("already stopped");
    assert_eq!(status.code(), Code::NotFound);
    h.stop_server().await;
}
