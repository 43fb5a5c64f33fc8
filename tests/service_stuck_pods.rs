//! Stuck pending pods over real gRPC against the simulated cluster, on the manual clock
//! (the test plays the kubelet and the scheduler): a pod whose container waits with
//! ImagePullBackOff past `stuck_pending_timeout_ms` is deleted and replaced, and GetStatus
//! and WatchExecutors show why; an Unschedulable pod is reported, kept, and holds its
//! profile's creates until it finds a node.

use std::time::Duration;

use serde_json::{Value, json};
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::{ExecutorEventKind as Kind, ExecutorPodState as State};
use test_kit::grpc::{Harness, start_request, until_event};
use test_kit::sim::executor_container;
use test_kit::wait::until;

const NS: &str = "default";
const TIMEOUT_MS: u64 = 30_000;

async fn start(h: &Harness, app: &str) {
    h.client
        .clone()
        .start(proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                stuck_pending_timeout_ms: Some(TIMEOUT_MS),
                ..Default::default()
            }),
            ..start_request(app, NS)
        })
        .await
        .expect("Start");
}

async fn status(h: &Harness, app: &str) -> proto::ApplicationStatus {
    h.status(app).await.expect("GetStatus")
}

/// Plays the kubelet: the status of executor `exec`'s pod.
async fn set_pod_status(h: &Harness, app: &str, exec: u64, status: Value) {
    let client = h.sim.try_client().expect("sim client");
    test_kit::sim::set_pod_status(&client, NS, &format!("{app}-exec-{exec}"), status).await;
}

async fn pod_names(h: &Harness, app: &str) -> Vec<String> {
    let mut names: Vec<String> = h
        .pods(NS, app)
        .await
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_pod_waiting_for_its_image_past_the_timeout_is_deleted_replaced_and_reported() {
    let h = Harness::start().await;
    let app = "app-pull";
    start(&h, app).await;
    h.set_total(app, 2).await;
    until("two executor pods", async || {
        pod_names(&h, app).await.len() == 2
    })
    .await;
    let mut events = h
        .client
        .clone()
        .watch_executors(proto::WatchExecutorsRequest {
            application_id: app.into(),
            since: 0,
        })
        .await
        .expect("WatchExecutors")
        .into_inner();

    set_pod_status(
        &h,
        app,
        2,
        json!({"phase": "Pending", "containerStatuses": executor_container(
            json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"spark:nope\""}}))}),
    )
    .await;
    let event = until_event(&mut events, "the pod's waiting reason", |e| {
        e.kind() == Kind::Updated
            && e.executor
                .as_ref()
                .is_some_and(|x| x.executor_id == 2 && !x.reason.is_empty())
    })
    .await;
    let executor = event.executor.expect("executor");
    assert_eq!(executor.state(), State::Pending);
    assert_eq!(executor.reason, "ImagePullBackOff");
    assert!(executor.message.contains("spark:nope"), "{executor:?}");
    assert!(executor.pod_json.contains("ImagePullBackOff"));

    // A round takes it in (the wait starts then), then the timeout passes on the clock.
    until("a round saw it waiting", async || {
        h.clock.advance(Duration::from_secs(1));
        status(&h, app)
            .await
            .failed_executors
            .iter()
            .any(|f| f.state == "Waiting")
    })
    .await;
    h.clock.advance(Duration::from_millis(TIMEOUT_MS - 5_000));
    assert_eq!(
        pod_names(&h, app).await,
        ["app-pull-exec-1", "app-pull-exec-2"],
        "not deleted before the timeout"
    );
    until("the stuck pod deleted and replaced", async || {
        h.clock.advance(Duration::from_secs(1));
        pod_names(&h, app).await == ["app-pull-exec-1", "app-pull-exec-3"]
    })
    .await;
    until_event(&mut events, "the stuck pod's DELETED event", |e| {
        e.kind() == Kind::Deleted && e.executor.as_ref().is_some_and(|x| x.executor_id == 2)
    })
    .await;

    let report = status(&h, app).await;
    let stuck = report
        .failed_executors
        .iter()
        .find(|f| f.executor_id == 2)
        .expect("the stuck executor reported");
    assert_eq!(stuck.state, "Stuck");
    assert_eq!(stuck.reason, "ImagePullBackOff");
    assert_eq!(stuck.pod_name, "app-pull-exec-2");
    assert!(stuck.message.contains("spark:nope"), "{stuck:?}");
    let failure = report.profiles[0]
        .last_create_failure
        .clone()
        .expect("counted as a failed create of the profile");
    assert_eq!(failure.reason, "Stuck");
    assert_eq!(failure.code, "FAILED_PRECONDITION");
    assert_eq!(failure.http_code, 0);
    assert!(
        failure.message.contains("app-pull-exec-2")
            && failure.message.contains("ImagePullBackOff")
            && failure.message.contains("30000 ms"),
        "{failure:?}"
    );
    assert_eq!(report.profiles[0].pending, 2, "{report:?}");
}

fn unschedulable() -> Value {
    json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
        "reason": "Unschedulable", "message": "0/3 nodes are available: 3 Insufficient cpu."}]})
}

#[tokio::test]
async fn an_unschedulable_pod_is_reported_kept_and_holds_its_profiles_creates() {
    let h = Harness::start().await;
    let app = "app-full";
    start(&h, app).await;
    h.set_total(app, 2).await;
    until("two executor pods", async || {
        pod_names(&h, app).await.len() == 2
    })
    .await;
    for exec in [1, 2] {
        set_pod_status(&h, app, exec, unschedulable()).await;
    }
    until("a round saw them unschedulable", async || {
        h.clock.advance(Duration::from_secs(1));
        status(&h, app).await.profiles[0].pending == 2
    })
    .await;
    h.clock.advance(Duration::from_millis(TIMEOUT_MS + 1_000));
    until("both reported unschedulable", async || {
        h.clock.advance(Duration::from_secs(1));
        status(&h, app)
            .await
            .failed_executors
            .iter()
            .filter(|f| f.state == "Unschedulable")
            .count()
            == 2
    })
    .await;
    let report = status(&h, app).await;
    let first = &report.failed_executors[0];
    assert_eq!(
        (first.executor_id, first.reason.as_str()),
        (1, "Unschedulable")
    );
    assert!(first.message.contains("Insufficient cpu"), "{first:?}");
    assert!(
        report.profiles[0].last_create_failure.is_none(),
        "kept, not a failed create"
    );

    // More executors wanted: none created while the oldest pending pod is unschedulable.
    h.set_total(app, 4).await;
    for _ in 0..5 {
        h.clock.advance(Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        pod_names(&h, app).await,
        ["app-full-exec-1", "app-full-exec-2"],
        "kept, and no pending storm"
    );
    assert_eq!(status(&h, app).await.profiles[0].newly_created, 0);

    // The cluster found room: the pods are scheduled, creates go on, the reports go.
    let scheduled =
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]});
    for exec in [1, 2] {
        set_pod_status(&h, app, exec, scheduled.clone()).await;
    }
    until("four executor pods", async || {
        h.clock.advance(Duration::from_secs(1));
        pod_names(&h, app).await.len() == 4
    })
    .await;
    assert!(status(&h, app).await.failed_executors.is_empty());
}
