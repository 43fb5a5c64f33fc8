//! Failures visible in GetStatus, over real gRPC against the simulated cluster: per
//! profile the last failed create (HTTP status, gRPC code, reason, message, time, how many
//! in a row and in all) and the backoff deadline; executors that failed (exit code, OOMKilled) or
//! cannot start (ImagePullBackOff).

use std::time::Duration;

use serde_json::json;
use spark_pod_allocator::app::Clock;
use spark_pod_allocator::proto;
use spark_pod_allocator_sim::FaultSettings;
use test_kit::grpc::{Harness, start_request};
use test_kit::sim::executor_container;
use test_kit::wait::until;

const NS: &str = "default";

async fn status(h: &Harness, app: &str) -> proto::ApplicationStatus {
    h.status(app).await.expect("GetStatus")
}

/// Plays the kubelet: the status of executor `exec`'s pod.
async fn set_pod_status(h: &Harness, app: &str, exec: u64, status: serde_json::Value) {
    let client = h.sim.try_client().expect("sim client");
    test_kit::sim::set_pod_status(&client, NS, &format!("{app}-exec-{exec}"), status).await;
}

#[tokio::test]
async fn refused_creates_show_their_reason_count_and_backoff() {
    let h = Harness::start().await;
    h.client
        .clone()
        .start(start_request("app-quota", NS))
        .await
        .expect("Start");
    h.sim.set_faults(FaultSettings {
        quota_fraction: 1.0,
        ..FaultSettings::default()
    });
    h.set_total("app-quota", 2).await;
    until("the refused creates in GetStatus", async || {
        status(&h, "app-quota").await.profiles[0]
            .last_create_failure
            .is_some()
    })
    .await;
    let p0 = status(&h, "app-quota").await.profiles.remove(0);
    let failure = p0.last_create_failure.clone().expect("last create failure");
    assert_eq!(failure.http_code, 403);
    assert_eq!(failure.code, "PERMISSION_DENIED");
    assert_eq!(failure.reason, "Forbidden");
    assert!(failure.message.contains("exceeded quota"), "{failure:?}");
    assert_eq!(failure.consecutive_failures, 2);
    assert_eq!(failure.total_failures, 2);
    assert_eq!(failure.time_ms, h.clock.now().0);
    assert!(
        p0.backoff_until_ms > h.clock.now().0,
        "backing off: {p0:?} at {:?}",
        h.clock.now()
    );

    // The next round, after the backoff, fails again: four in a row.
    h.clock.advance(Duration::from_millis(
        u64::try_from(p0.backoff_until_ms - h.clock.now().0).unwrap(),
    ));
    until("the second refused round", async || {
        status(&h, "app-quota").await.profiles[0]
            .last_create_failure
            .as_ref()
            .is_some_and(|f| f.consecutive_failures == 4 && f.total_failures == 4)
    })
    .await;

    // The quota is lifted: creates pass, the count starts again, no more backoff.
    h.sim.set_faults(FaultSettings::default());
    until("two executor pods", async || {
        h.clock.advance(Duration::from_secs(5));
        h.pods(NS, "app-quota").await.len() == 2
    })
    .await;
    until("creates passed in GetStatus", async || {
        let p0 = status(&h, "app-quota").await.profiles.remove(0);
        p0.last_create_failure.is_some_and(|f| {
            f.consecutive_failures == 0 && f.total_failures == 4 && f.http_code == 403
        }) && p0.backoff_until_ms == 0
    })
    .await;
}

#[tokio::test]
async fn failed_and_stuck_executors_are_reported() {
    let h = Harness::start().await;
    h.client
        .clone()
        .start(start_request("app-oom", NS))
        .await
        .expect("Start");
    h.set_total("app-oom", 2).await;
    until("two executor pods", async || {
        h.pods(NS, "app-oom").await.len() == 2
    })
    .await;

    set_pod_status(
        &h,
        "app-oom",
        2,
        json!({"phase": "Pending", "containerStatuses": executor_container(
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"spark:4\""}}))}),
    )
    .await;
    until("the stuck executor reported", async || {
        let failed = status(&h, "app-oom").await.failed_executors;
        failed.len() == 1 && failed[0].state == "Waiting"
    })
    .await;
    let stuck = status(&h, "app-oom").await.failed_executors.remove(0);
    assert_eq!(stuck.executor_id, 2);
    assert_eq!(stuck.pod_name, "app-oom-exec-2");
    assert_eq!(stuck.reason, "ImagePullBackOff");
    assert!(stuck.message.contains("Back-off pulling image"));
    assert_eq!(stuck.exit_code, None);

    set_pod_status(
        &h,
        "app-oom",
        1,
        json!({"phase": "Failed", "containerStatuses": executor_container(
            json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}))}),
    )
    .await;
    set_pod_status(
        &h,
        "app-oom",
        2,
        json!({"phase": "Running", "containerStatuses": executor_container(
            json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}))}),
    )
    .await;
    until(
        "the OOMKilled executor reported, the stuck one no longer",
        async || {
            let failed = status(&h, "app-oom").await.failed_executors;
            failed.len() == 1 && failed[0].state == "Failed"
        },
    )
    .await;
    // The failed pod is deleted (delete-on-termination) and replaced; the failure stays.
    until("the failed pod deleted and replaced", async || {
        h.clock.advance(Duration::from_secs(1));
        let names: Vec<String> = h
            .pods(NS, "app-oom")
            .await
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        !names.contains(&"app-oom-exec-1".to_string()) && names.len() == 2
    })
    .await;
    let failed = status(&h, "app-oom").await.failed_executors;
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(
        (
            failed[0].executor_id,
            failed[0].exit_code,
            failed[0].reason.as_str()
        ),
        (1, Some(137), "OOMKilled")
    );
}
