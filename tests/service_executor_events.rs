//! WatchExecutors over real gRPC against the simulated cluster: the full state first, then
//! executor pods as they move (the test plays the kubelet), failure with exit code and
//! reason, deletion, resume from a sequence, a slow reader given a fresh full state, and
//! the stream ending on Stop.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use spark_pod_allocator::app::AppId;
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::{ExecutorEventKind as Kind, ExecutorPodState as State};
use test_kit::grpc::{
    Harness, assert_invalid, next_event, quiet_cluster, start_request, until_event,
};
use test_kit::requests::*;
use test_kit::sim::executor_container;
use test_kit::wait::until;
use tonic::Streaming;

const NS: &str = "default";

async fn watch(h: &Harness, app: &str, since: u64) -> Streaming<proto::ExecutorEvent> {
    h.client
        .clone()
        .watch_executors(proto::WatchExecutorsRequest {
            application_id: app.into(),
            since,
        })
        .await
        .expect("WatchExecutors")
        .into_inner()
}

/// Reads a full state: the SNAPSHOT events up to SYNCED; returns them and SYNCED's sequence.
async fn full_state(
    stream: &mut Streaming<proto::ExecutorEvent>,
) -> (Vec<proto::ExecutorPod>, u64) {
    let mut executors = Vec::new();
    loop {
        let event = next_event(stream).await.expect("a full state");
        match event.kind() {
            Kind::Snapshot => executors.push(event.executor.expect("executor")),
            Kind::Synced => return (executors, event.sequence),
            other => panic!("{other:?} inside a full state: {event:?}"),
        }
    }
}

fn is(event: &proto::ExecutorEvent, kind: Kind, id: i64, state: State) -> bool {
    event.kind() == kind
        && event
            .executor
            .as_ref()
            .is_some_and(|e| e.executor_id == id && e.state() == state)
}

fn pods_api(h: &Harness) -> Api<Pod> {
    Api::namespaced(h.sim.try_client().expect("sim client"), NS)
}

/// Plays the kubelet: the status of executor `exec`'s pod.
async fn set_pod_status(h: &Harness, app: &str, exec: u64, status: serde_json::Value) {
    let client = h.sim.try_client().expect("sim client");
    test_kit::sim::set_pod_status(&client, NS, &format!("{app}-exec-{exec}"), status).await;
}

fn running() -> serde_json::Value {
    json!({"phase": "Running", "containerStatuses": executor_container(
        json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}))})
}

/// Starts `app` and waits until the service has seen `n` executor pods.
async fn started_with(h: &Harness, app: &str, n: u32) {
    h.client
        .clone()
        .start(start_request(app, NS))
        .await
        .expect("Start");
    h.set_total(app, n).await;
    let app = AppId::parse(app).expect("app id");
    until("the executor pods seen by the service", async || {
        let snapshot = h.applications.snapshot(&app).await.expect("snapshot");
        snapshot.executors.len() == n as usize
    })
    .await;
}

#[tokio::test]
async fn the_stream_shows_the_state_then_pods_moving_failing_and_going() {
    let h = Harness::start().await;
    started_with(&h, "app-ev", 2).await;
    let mut stream = watch(&h, "app-ev", 0).await;
    let (executors, synced) = full_state(&mut stream).await;
    let ids: Vec<i64> = executors.iter().map(|e| e.executor_id).collect();
    assert_eq!(ids, vec![1, 2]);
    for executor in &executors {
        assert_eq!(executor.state(), State::Pending);
        assert_eq!(executor.resource_profile_id, 0);
        assert_eq!(
            executor.pod_name,
            format!("app-ev-exec-{}", executor.executor_id)
        );
        let pod: Pod = serde_json::from_str(&executor.pod_json).expect("the pod as JSON");
        assert_eq!(
            pod.metadata.name.as_deref(),
            Some(executor.pod_name.as_str())
        );
        assert_eq!(
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("spark-exec-id")),
            Some(&executor.executor_id.to_string())
        );
    }

    set_pod_status(&h, "app-ev", 1, running()).await;
    let event = until_event(&mut stream, "executor 1 running", |e| {
        is(e, Kind::Updated, 1, State::Running)
    })
    .await;
    assert!(event.sequence > synced, "{event:?} after {synced}");
    let executor = event.executor.expect("executor");
    assert_eq!(executor.phase, "Running");
    let pod: Pod = serde_json::from_str(&executor.pod_json).expect("pod JSON");
    assert_eq!(pod.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    set_pod_status(
        &h,
        "app-ev",
        2,
        json!({"phase": "Failed", "containerStatuses": executor_container(
            json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "message": "out of memory"}}))}),
    )
    .await;
    let failed = until_event(&mut stream, "executor 2 failed", |e| {
        is(e, Kind::Updated, 2, State::Failed)
    })
    .await
    .executor
    .expect("executor");
    assert_eq!(failed.exit_code, Some(137));
    assert_eq!(failed.reason, "OOMKilled");
    assert_eq!(failed.phase, "Failed");

    pods_api(&h)
        .delete("app-ev-exec-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete pod");
    let gone = until_event(&mut stream, "executor 1 deleted", |e| {
        e.kind() == Kind::Deleted && e.executor.as_ref().is_some_and(|x| x.executor_id == 1)
    })
    .await
    .executor
    .expect("executor");
    assert_eq!(gone.state(), State::Deleted);
    assert_eq!(gone.pod_name, "app-ev-exec-1");
    let pod: Pod = serde_json::from_str(&gone.pod_json).expect("pod JSON");
    assert_eq!(pod.metadata.name.as_deref(), Some("app-ev-exec-1"));
}

#[tokio::test]
async fn a_stream_resumes_after_a_sequence_or_starts_again_from_the_full_state() {
    let h = Harness::start().await;
    started_with(&h, "app-resume", 2).await;
    let mut first = watch(&h, "app-resume", 0).await;
    let (_, synced) = full_state(&mut first).await;
    set_pod_status(&h, "app-resume", 1, running()).await;
    let seen = until_event(&mut first, "executor 1 running", |e| {
        is(e, Kind::Updated, 1, State::Running)
    })
    .await
    .sequence;
    drop(first);

    // Missed while no stream was open.
    set_pod_status(&h, "app-resume", 2, running()).await;
    let mut resumed = watch(&h, "app-resume", seen).await;
    let event = next_event(&mut resumed).await.expect("the missed change");
    assert!(is(&event, Kind::Updated, 2, State::Running), "{event:?}");
    assert_eq!(event.sequence, seen + 1);

    // From a point before this service's numbering: the full state again.
    let mut too_old = watch(&h, "app-resume", synced - 1_000_000).await;
    let (executors, at) = full_state(&mut too_old).await;
    assert_eq!(at, seen + 1);
    assert!(
        executors.iter().all(|e| e.state() == State::Running),
        "{executors:?}"
    );
    assert_eq!(executors.len(), 2);
}

#[tokio::test]
async fn a_slow_reader_gets_a_fresh_full_state() {
    let h = Harness::start_tuned(quiet_cluster(), Settings::default(), |builder| {
        builder.with_executor_stream_buffer(4)
    })
    .await;
    started_with(&h, "app-slow", 1).await;
    let mut stream = watch(&h, "app-slow", 0).await;
    full_state(&mut stream).await;

    // Large pods fill the HTTP/2 windows quickly; then the service's per-stream buffer.
    let filler = "x".repeat(32 * 1024);
    let changes = 120;
    for n in 1..=changes {
        pods_api(&h)
            .patch(
                "app-slow-exec-1",
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {
                    "filler": filler, "n": n.to_string()}}})),
            )
            .await
            .expect("annotate");
    }
    let last = |e: &proto::ExecutorPod| {
        serde_json::from_str::<Pod>(&e.pod_json)
            .ok()
            .and_then(|p| p.metadata.annotations)
            .and_then(|a| a.get("n").cloned())
            == Some(changes.to_string())
    };
    let mut read = 0;
    let mut fresh_states = 0;
    loop {
        let event = next_event(&mut stream).await.expect("events");
        read += 1;
        if event.kind() == Kind::Synced {
            fresh_states += 1;
        }
        if event.executor.as_ref().is_some_and(last) {
            if event.kind() == Kind::Snapshot {
                assert_eq!(
                    next_event(&mut stream).await.map(|e| e.kind()),
                    Some(Kind::Synced)
                );
                fresh_states += 1;
            }
            break;
        }
    }
    assert!(fresh_states >= 1, "no fresh full state after {read} events");
    assert!(read < changes, "read {read} events for {changes} changes");
}

#[tokio::test]
async fn the_stream_ends_when_the_application_stops() {
    let h = Harness::start().await;
    started_with(&h, "app-stop", 1).await;
    let mut stream = watch(&h, "app-stop", 0).await;
    full_state(&mut stream).await;
    h.client
        .clone()
        .stop(stop_request("app-stop"))
        .await
        .expect("Stop");
    // Deletes may be seen before the end; then the stream ends cleanly.
    while let Some(event) = next_event(&mut stream).await {
        assert_ne!(event.kind(), Kind::Snapshot, "{event:?}");
    }
}

#[tokio::test]
async fn bad_requests_name_the_field_and_unknown_applications_are_not_found() {
    let h = Harness::start().await;
    let status = h
        .client
        .clone()
        .watch_executors(watch_request("-bad-", 0))
        .await
        .expect_err("invalid id");
    assert_invalid(&status, "application_id");
    let status = h
        .client
        .clone()
        .watch_executors(watch_request("nobody", 0))
        .await
        .expect_err("unknown app");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}

#[tokio::test]
async fn the_stream_ends_when_the_application_is_forgotten_after_its_driver_pod_goes() {
    let h = Harness::start().await;
    let driver: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "app-gone-driver",
                     "labels": {"spark-app-selector": "app-gone", "spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .expect("driver pod");
    pods_api(&h)
        .create(&kube::api::PostParams::default(), &driver)
        .await
        .expect("create driver pod");
    let mut request = start_request("app-gone", NS);
    request.driver_pod_name = "app-gone-driver".into();
    h.client.clone().start(request).await.expect("Start");
    let mut stream = watch(&h, "app-gone", 0).await;
    full_state(&mut stream).await;
    pods_api(&h)
        .delete("app-gone-driver", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete driver pod");
    while let Some(event) = next_event(&mut stream).await {
        assert_ne!(event.kind(), Kind::Snapshot, "{event:?}");
    }
    let status = h
        .client
        .clone()
        .watch_executors(watch_request("app-gone", 0))
        .await
        .expect_err("a forgotten application");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}

/// Reads the stream until `n` distinct executors were updated into `state`, in any order.
async fn updated_in_state(
    stream: &mut tonic::Streaming<proto::ExecutorEvent>,
    n: u32,
    state: State,
) {
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < n as usize {
        let event = until_event(stream, &format!("an executor {state:?}"), |e| {
            e.kind() == Kind::Updated && e.executor.as_ref().is_some_and(|x| x.state() == state)
        })
        .await;
        seen.extend(event.executor.map(|x| x.executor_id));
    }
}

#[tokio::test]
async fn get_status_right_after_the_stream_shows_executors_running_counts_them_running() {
    const N: u32 = 3;
    let h = Harness::start().await;
    h.client
        .clone()
        .start(start_request("app-status", NS))
        .await
        .expect("Start");
    let mut stream = watch(&h, "app-status", 0).await;
    full_state(&mut stream).await;
    h.set_total("app-status", N).await;
    // The creates go out concurrently: their pods come in any order.
    updated_in_state(&mut stream, N, State::Pending).await;
    for exec in 1..=N {
        set_pod_status(&h, "app-status", u64::from(exec), running()).await;
    }
    updated_in_state(&mut stream, N, State::Running).await;
    // The harness's clock stands still: no round has run since the pods were created, so
    // this reads the state the stream shows, not the last round's.
    let status = h.status("app-status").await.expect("GetStatus");
    let profile = status
        .profiles
        .iter()
        .find(|p| p.resource_profile_id == 0)
        .expect("profile 0");
    assert_eq!(
        (profile.running, profile.pending, profile.newly_created),
        (N, 0, 0),
        "{status:?}"
    );
}
