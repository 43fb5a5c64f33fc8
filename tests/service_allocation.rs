//! The service core end to end: `Applications` (actors, shared watches, pod client) over
//! real HTTP against the simulated cluster. A `ManualClock` drives the rounds, so a round
//! happens only when a test advances time (or SetTotalExpected notifies); tests wait for
//! observable conditions with a bounded deadline, never sleep-then-assert.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use spark_pod_allocator::allocator::pod_builder::stable_hash;
use spark_pod_allocator::allocator::{
    AllocationPolicy, ExecutorId, ExecutorState, ResourceProfileId,
};
use spark_pod_allocator::app::{
    AppError, Applications, Clock, ManualClock, ServiceContext, ServiceOptions,
};
use spark_pod_allocator_sim::{FaultSettings, SimCluster};
use test_kit::service::{
    BATCH_DELAY, P0, id, labelled_template as template, range, snapshot_ids, start,
    start_application as request, targets, wait_seen,
};
use test_kit::sim::cluster_ids;
use test_kit::wait::until;

const NS: &str = "default";

struct Harness {
    sim: SimCluster,
    clock: ManualClock,
    apps: Applications,
}

/// A simulated cluster whose kubelet does nothing unless the test plays it.
async fn manual_cluster() -> SimCluster {
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = vec![NS.to_string(), "other".to_string()];
    test_kit::sim::start(settings).await
}

fn applications(sim: &SimCluster, clock: &ManualClock, options: ServiceOptions) -> Applications {
    test_kit::service::applications(sim.try_client().expect("sim client"), clock, options)
}

async fn harness() -> Harness {
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    let apps = applications(&sim, &clock, ServiceOptions::default());
    Harness { sim, clock, apps }
}

/// Advances the clock by `by` and waits until the application has run one more round.
async fn advance_round(h: &Harness, app: &str, by: Duration) {
    test_kit::service::advance_round(&h.apps, &h.clock, app, by).await
}

/// Sets targets and waits for the round it triggers.
async fn set_targets_and_round(h: &Harness, app: &str, n: u32) {
    test_kit::service::set_targets_and_round(&h.apps, app, targets(n)).await
}

/// Plays the kubelet: the pod of executor `exec` runs (phase Running, container running).
async fn set_running(sim: &SimCluster, app: &str, exec: u64) {
    patch_status(
        sim,
        app,
        exec,
        json!({"status": {"phase": "Running", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": true, "restartCount": 0,
            "image": "spark:4", "imageID": "",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}),
    )
    .await;
}

/// Plays the kubelet: the pod of executor `exec` failed with exit code 1.
async fn set_failed(sim: &SimCluster, app: &str, exec: u64) {
    patch_status(
        sim,
        app,
        exec,
        json!({"status": {"phase": "Failed", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": false, "restartCount": 0,
            "image": "spark:4", "imageID": "",
            "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}}),
    )
    .await;
}

async fn patch_status(sim: &SimCluster, app: &str, exec: u64, patch: serde_json::Value) {
    let api: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), NS);
    api.patch_status(
        &format!("{app}-exec-{exec}"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("status patch");
}

/// Plays the scheduler: binds the pod so that its deletion becomes graceful.
async fn bind(sim: &SimCluster, app: &str, exec: u64) {
    let client = sim.try_client().expect("sim client");
    test_kit::sim::bind(&client, NS, &format!("{app}-exec-{exec}"))
        .await
        .expect("binding");
}

#[tokio::test]
async fn batches_are_respected_and_targets_reached() {
    let h = harness().await;
    let started = start(&h.apps, request("app-a", NS)).await;
    assert!(!started.resumed);
    assert_eq!(started.last_executor_id, 0);

    // Nothing outstanding → the round runs at once; one batch of exactly 10.
    set_targets_and_round(&h, "app-a", 25).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 10));

    // The next batch only once a round has seen the previous pods (Pending is enough).
    wait_seen(&h.apps, "app-a", range(1, 10)).await;
    advance_round(&h, "app-a", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 20));
    wait_seen(&h.apps, "app-a", range(1, 20)).await;
    advance_round(&h, "app-a", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 25));
    wait_seen(&h.apps, "app-a", range(1, 25)).await;
    advance_round(&h, "app-a", BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-a").await, range(1, 25));

    let status = h.apps.status(&id("app-a")).await.unwrap();
    let p0 = &status.profiles[&P0];
    assert_eq!((p0.target, p0.pending, p0.newly_created), (25, 25, 0));
    assert_eq!(status.last_executor_id, 25);
    assert_eq!(h.apps.stop(&id("app-a")).await.unwrap(), 25);
}

#[tokio::test]
async fn unseen_creates_block_the_next_batch_and_time_out_into_new_ids() {
    let h = harness().await;
    start(&h.apps, request("app-lost", NS)).await;
    // Every create answers 201 but the pod is never stored.
    h.sim.set_faults(FaultSettings {
        lost_create_fraction: 1.0,
        ..FaultSettings::default()
    });
    set_targets_and_round(&h, "app-lost", 25).await;
    assert_eq!(
        h.apps
            .status(&id("app-lost"))
            .await
            .unwrap()
            .last_executor_id,
        10
    );
    // Rounds go by (within the 10 s executor timeout): no new batch while 10 are unseen.
    for _ in 0..5 {
        advance_round(&h, "app-lost", BATCH_DELAY).await;
    }
    let status = h.apps.status(&id("app-lost")).await.unwrap();
    assert_eq!(status.last_executor_id, 10);
    assert_eq!(status.profiles[&P0].newly_created, 10);
    assert!(cluster_ids(&h.sim, NS, "app-lost").await.is_empty());

    // After the timeout the lost ones are forgotten and re-requested with new ids.
    h.sim.set_faults(FaultSettings::default());
    advance_round(&h, "app-lost", Duration::from_secs(10)).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-lost").await, range(11, 20));
    let status = h.apps.status(&id("app-lost")).await.unwrap();
    assert_eq!(status.last_executor_id, 20);
    h.apps.stop(&id("app-lost")).await.unwrap();
}

#[tokio::test]
async fn downscale_deletes_pending_excess_and_is_deleted_until_gone() {
    let h = harness().await;
    start(&h.apps, request("app-down", NS)).await;
    set_targets_and_round(&h, "app-down", 8).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-down").await, range(1, 8));
    for exec in 1..=3 {
        set_running(&h.sim, "app-down", exec).await;
    }
    // Bound pods are deleted gracefully: they stay visible after the DELETE.
    for exec in 4..=8 {
        bind(&h.sim, "app-down", exec).await;
    }
    until("running pods seen", || async {
        let snap = h.apps.snapshot(&id("app-down")).await.unwrap();
        snap.executors
            .values()
            .filter(|e| e.state == ExecutorState::Running)
            .count()
            == 3
    })
    .await;

    // Pending pods become deletable once older than the idle timeout (60 s). (Pending
    // pods are outstanding, so the new target waits for the next round.)
    h.apps
        .set_total_expected(&id("app-down"), targets(4))
        .await
        .unwrap();
    advance_round(&h, "app-down", Duration::from_secs(61)).await;
    advance_round(&h, "app-down", BATCH_DELAY).await;
    let status = h.apps.status(&id("app-down")).await.unwrap();
    let deleted: BTreeSet<u64> = status.deleted.iter().map(|e| e.0).collect();
    assert_eq!(deleted.len(), 4, "excess of 4 pending deleted: {deleted:?}");
    assert!(
        deleted.iter().all(|d| (4..=8).contains(d)),
        "never a running one: {deleted:?}"
    );
    for d in &deleted {
        assert!(
            h.apps
                .is_deleted(&id("app-down"), ExecutorId(*d))
                .await
                .unwrap()
        );
    }
    // Running executors are never reported deleted.
    assert!(
        !h.apps
            .is_deleted(&id("app-down"), ExecutorId(1))
            .await
            .unwrap()
    );
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    for d in &deleted {
        let pod = api.get(&format!("app-down-exec-{d}")).await.unwrap();
        assert!(pod.metadata.deletion_timestamp.is_some());
    }

    // The kubelet confirms: the pods go; IsDeleted turns false once a round saw it.
    for d in &deleted {
        api.delete(
            &format!("app-down-exec-{d}"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    }
    let live: BTreeSet<u64> = range(1, 8).difference(&deleted).copied().collect();
    until("deleted pods gone from the snapshot", || async {
        let snap = h.apps.snapshot(&id("app-down")).await.unwrap();
        deleted.iter().all(|d| {
            snap.executors
                .get(&ExecutorId(*d))
                .is_none_or(|e| e.state == ExecutorState::Deleted)
        })
    })
    .await;
    advance_round(&h, "app-down", BATCH_DELAY).await;
    // Resync so the Deleted entries leave the snapshot as well.
    advance_round(&h, "app-down", Duration::from_secs(31)).await;
    wait_seen(&h.apps, "app-down", live.clone()).await;
    advance_round(&h, "app-down", BATCH_DELAY).await;
    for d in &deleted {
        assert!(
            !h.apps
                .is_deleted(&id("app-down"), ExecutorId(*d))
                .await
                .unwrap()
        );
    }
    assert_eq!(cluster_ids(&h.sim, NS, "app-down").await, live);
    h.apps.stop(&id("app-down")).await.unwrap();
}

#[tokio::test]
async fn failed_pods_are_deleted_and_replaced_with_new_ids() {
    let h = harness().await;
    start(&h.apps, request("app-fail", NS)).await;
    set_targets_and_round(&h, "app-fail", 3).await;
    for exec in 1..=3 {
        set_running(&h.sim, "app-fail", exec).await;
    }
    set_failed(&h.sim, "app-fail", 2).await;
    until("failure seen", || async {
        let snap = h.apps.snapshot(&id("app-fail")).await.unwrap();
        matches!(
            snap.executors.get(&ExecutorId(2)).map(|e| &e.state),
            Some(ExecutorState::Failed { .. })
        )
    })
    .await;
    advance_round(&h, "app-fail", BATCH_DELAY).await;
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-fail").await,
        BTreeSet::from([1, 3, 4])
    );
    assert_eq!(h.apps.stop(&id("app-fail")).await.unwrap(), 3);
}

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
    let options = ServiceOptions {
        allowed_namespaces: BTreeSet::from([NS.to_string(), "other".to_string()]),
        ..ServiceOptions::default()
    };
    let apps = applications(&sim, &clock, options);
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

    let restarted = applications(&h.sim, &h.clock, ServiceOptions::default());
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

    let restarted = applications(&h.sim, &h.clock, ServiceOptions::default());
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

    let restarted = applications(&h.sim, &h.clock, ServiceOptions::default());
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
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let mut driver = template();
    driver.metadata.name = Some("driver-rec".into());
    api.create(&PostParams::default(), &driver).await.unwrap();
    let mut req = request("app-rec", NS);
    req.driver_pod_name = Some("driver-rec".into());
    start(&h.apps, req).await;
    set_targets_and_round(&h, "app-rec", 2).await;
    let driver = api.get("driver-rec").await.unwrap();
    assert_eq!(
        driver.metadata.annotations.unwrap()["spark-pod-allocator/last-executor-id"],
        "2"
    );
    // Seen, so they no longer hold back the next batch.
    wait_seen(&h.apps, "app-rec", range(1, 2)).await;
    // The driver pod goes: the next ids cannot be recorded, so nothing is created with
    // them, and the round backs off as for refused creates.
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
    assert_eq!(status.last_executor_id, 4);
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

    let restarted = applications(&h.sim, &h.clock, ServiceOptions::default());
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
    // nothing is created with the next ids, and the round backs off as for refused creates.
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
    assert_eq!(status.last_executor_id, 4);
    assert_eq!(
        h.apps.next_round_at(&id("app-cm")).await.unwrap().0,
        h.clock.now().0 + 2000
    );
    // Once the record can be written again (here: the ConfigMap is gone and is created
    // anew), the next round creates with fresh ids.
    config_maps
        .delete(&id_config_map("app-cm"), &DeleteParams::default())
        .await
        .unwrap();
    advance_round(&h, "app-cm", Duration::from_secs(2)).await;
    assert_eq!(
        cluster_ids(&h.sim, NS, "app-cm").await,
        BTreeSet::from([1, 2, 5, 6])
    );
    let record = config_maps.get(&id_config_map("app-cm")).await.unwrap();
    assert_eq!(record.data.unwrap()["last-executor-id"], "6");
    h.apps.stop(&id("app-cm")).await.unwrap();
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
async fn kubernetes_errors_do_not_kill_the_actor() {
    let h = harness().await;
    start(&h.apps, request("app-err", NS)).await;
    // Quota refusals (403): the round's creates fail; the executors are forgotten.
    h.sim.set_faults(FaultSettings {
        quota_fraction: 1.0,
        ..FaultSettings::default()
    });
    set_targets_and_round(&h, "app-err", 3).await;
    let status = h.apps.status(&id("app-err")).await.unwrap();
    assert_eq!(status.last_executor_id, 3);
    assert!(
        !status.outstanding,
        "failed creates are forgotten: {status:?}"
    );
    assert!(cluster_ids(&h.sim, NS, "app-err").await.is_empty());
    // Every create failed: the next round backs off (2 batch delays) instead of burning
    // a batch of ids every batch delay.
    let after_secs = |secs: i64| h.clock.now().0 + secs * 1000;
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(2)
    );

    // Internal errors (500) on every request, the periodic LIST included.
    h.sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        ..FaultSettings::default()
    });
    advance_round(&h, "app-err", Duration::from_secs(2)).await;
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(4)
    );
    advance_round(&h, "app-err", Duration::from_secs(31)).await;
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(8)
    );
    assert_eq!(
        h.apps
            .status(&id("app-err"))
            .await
            .unwrap()
            .last_executor_id,
        9
    );

    // The cluster recovers: the next round creates with ids never used before, and the
    // schedule is back to one batch delay.
    h.sim.set_faults(FaultSettings::default());
    advance_round(&h, "app-err", Duration::from_secs(8)).await;
    let ids = cluster_ids(&h.sim, NS, "app-err").await;
    assert_eq!(ids, range(10, 12), "fresh ids");
    assert_eq!(
        h.apps.next_round_at(&id("app-err")).await.unwrap().0,
        after_secs(1)
    );
    assert_eq!(h.apps.stop(&id("app-err")).await.unwrap(), 3);
}

#[tokio::test]
async fn periodic_resync_recovers_dropped_watch_events() {
    let h = harness().await;
    // The simulated cluster applies a watch's faults when the watch opens.
    h.sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        ..FaultSettings::default()
    });
    // Long executor timeout: the unseen creates must not time out before the resync.
    let mut req = request("app-sync", NS);
    req.settings.executor_timeout = Duration::from_secs(600);
    start(&h.apps, req).await;
    until("namespace watch listed", || async {
        h.apps.is_namespace_synced(NS)
    })
    .await;
    set_targets_and_round(&h, "app-sync", 2).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-sync").await, range(1, 2));
    advance_round(&h, "app-sync", BATCH_DELAY).await;
    assert!(
        snapshot_ids(&h.apps, "app-sync").await.is_empty(),
        "events dropped"
    );
    // The full LIST every 30 s replaces the snapshot.
    h.clock.advance(Duration::from_secs(29));
    wait_seen(&h.apps, "app-sync", range(1, 2)).await;
    h.sim.set_faults(FaultSettings::default());
    h.apps.stop(&id("app-sync")).await.unwrap();
}

#[tokio::test]
async fn without_delete_on_termination_finished_pods_are_labelled_inactive() {
    let h = harness().await;
    let mut req = request("app-keep", NS);
    req.settings.delete_on_termination = false;
    start(&h.apps, req).await;
    set_targets_and_round(&h, "app-keep", 2).await;
    set_running(&h.sim, "app-keep", 1).await;
    set_failed(&h.sim, "app-keep", 1).await;
    until("failure seen", || async {
        let snap = h.apps.snapshot(&id("app-keep")).await.unwrap();
        matches!(
            snap.executors.get(&ExecutorId(1)).map(|e| &e.state),
            Some(ExecutorState::Failed { .. })
        )
    })
    .await;
    advance_round(&h, "app-keep", BATCH_DELAY).await;
    // Kept for inspection, labelled inactive, and replaced by executor 3.
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let kept = api.get("app-keep-exec-1").await.unwrap();
    assert_eq!(
        kept.metadata
            .labels
            .unwrap()
            .get("spark-exec-inactive")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(cluster_ids(&h.sim, NS, "app-keep").await, range(1, 3));
    // The inactive pod leaves the snapshot (the watch selector excludes it).
    until("inactive pod ignored", || async {
        let snap = h.apps.snapshot(&id("app-keep")).await.unwrap();
        snap.executors
            .get(&ExecutorId(1))
            .is_none_or(|e| e.state == ExecutorState::Deleted)
    })
    .await;
    // Stop deletes every executor pod, the inactive one too.
    assert_eq!(h.apps.stop(&id("app-keep")).await.unwrap(), 3);
    assert!(cluster_ids(&h.sim, NS, "app-keep").await.is_empty());
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
async fn the_actor_answers_while_rate_limited_creates_are_in_flight() {
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    // One create per second: 30 creates would take half a minute.
    let options = ServiceOptions {
        qps: 1,
        burst: 1,
        ..ServiceOptions::default()
    };
    let apps = applications(&sim, &clock, options);
    let mut req = request("app-slow", NS);
    req.settings.batch_size = 30;
    start(&apps, req).await;
    apps.set_total_expected(&id("app-slow"), targets(30))
        .await
        .unwrap();
    // The round has planned all 30 while their creates trickle out.
    until("round planned", || async {
        apps.status(&id("app-slow")).await.unwrap().last_executor_id == 30
    })
    .await;
    assert!(
        !apps
            .is_deleted(&id("app-slow"), ExecutorId(1))
            .await
            .unwrap()
    );
    // Stop skips the creates not yet sent and waits for those in flight: nothing is left,
    // and nothing lands afterwards (the actor has ended before the DELETE).
    let deleted = apps.stop(&id("app-slow")).await.unwrap();
    assert!(deleted < 30, "unsent creates were skipped: {deleted}");
    assert!(cluster_ids(&sim, NS, "app-slow").await.is_empty());
}

#[tokio::test]
async fn a_slow_periodic_list_does_not_undo_newer_watch_events() {
    let h = harness().await;
    start(&h.apps, request("app-slow", NS)).await;
    until("namespace watch listed", || async {
        h.apps.is_namespace_synced(NS)
    })
    .await;
    set_targets_and_round(&h, "app-slow", 2).await;
    wait_seen(&h.apps, "app-slow", range(1, 2)).await;

    // The periodic LIST is answered late: its answer still holds executor 2, which is
    // deleted meanwhile (unbound: gone at once) and whose DELETED event the watch streams.
    h.sim.hold_list_responses();
    h.clock.advance(Duration::from_secs(30));
    let resync_at = h.clock.now();
    until("the periodic LIST is held", || async {
        h.sim.held_list_responses() >= 1
    })
    .await;
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let before_delete = h.sim.resource_version().to_string();
    api.delete("app-slow-exec-2", &DeleteParams::default())
        .await
        .expect("delete");
    // The API server has streamed the DELETED event (to every watch of the namespace).
    let wp = WatchParams::default().fields("metadata.name=app-slow-exec-2");
    let mut events = api.watch(&wp, &before_delete).await.expect("watch").boxed();
    loop {
        match events.next().await {
            Some(Ok(WatchEvent::Deleted(_))) => break,
            Some(Ok(_)) => {}
            other => panic!("watch ended before DELETED: {other:?}"),
        }
    }
    h.sim.release_list_responses();

    // The late LIST is older than the deletion: after it, executor 2 must still end up
    // Deleted (the state a round counts as nothing, so it gets replaced).
    until("the resync, then executor 2 deleted", || async {
        let snapshot = h.apps.snapshot(&id("app-slow")).await.expect("snapshot");
        snapshot.full_resync_at >= resync_at
            && snapshot
                .executors
                .get(&ExecutorId(2))
                .is_none_or(|e| e.state == ExecutorState::Deleted)
    })
    .await;
    h.apps.stop(&id("app-slow")).await.unwrap();
}

#[tokio::test]
async fn a_watch_expired_by_compaction_relists_into_a_resync() {
    let h = harness().await;
    // Live watch events are lost and every watch closes after a second.
    h.sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        watch_close_after_seconds: Some(1),
        ..FaultSettings::default()
    });
    let mut req = request("app-410", NS);
    req.settings.executor_timeout = Duration::from_secs(600);
    start(&h.apps, req).await;
    until("namespace watch listed", || async {
        h.apps.is_namespace_synced(NS)
    })
    .await;
    set_targets_and_round(&h, "app-410", 2).await;
    assert_eq!(cluster_ids(&h.sim, NS, "app-410").await, range(1, 2));
    // The history is compacted: the re-watch from the last resourceVersion gets 410
    // Expired, the watcher relists, and the listing replaces the snapshot (no clock move).
    h.sim.compact_history();
    wait_seen(&h.apps, "app-410", range(1, 2)).await;
    h.sim.set_faults(FaultSettings::default());
    h.apps.stop(&id("app-410")).await.unwrap();
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

#[tokio::test]
async fn health_follows_the_api_server() {
    // Nothing listens on port 9: the API server never answers.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let unreachable = Applications::new(ServiceContext::new(
        kube::Client::try_from(config).unwrap(),
        Arc::new(ManualClock::starting_now()),
    ));
    assert!(!unreachable.is_synced());
    let err = unreachable.start(request("app-h", NS)).await.unwrap_err();
    assert!(matches!(err, AppError::Kubernetes(_)), "{err:?}");
    assert!(!unreachable.is_synced());

    // A reachable API server: healthy even before any application starts.
    let h = harness().await;
    until("synced", || async { h.apps.is_synced() }).await;
    assert!(h.apps.watched_namespaces().is_empty());
}

#[tokio::test]
async fn connect_uses_the_configured_kubeconfig() {
    let sim = manual_cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).unwrap();
    let settings = spark_pod_allocator::config::KubernetesSettings {
        kubeconfig: Some(path),
        in_cluster: spark_pod_allocator::config::InCluster::False,
        ..Default::default()
    };
    let client = spark_pod_allocator::k8s::connect(&settings).await.unwrap();
    let api: Api<Pod> = Api::namespaced(client, NS);
    assert!(
        api.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    let missing = spark_pod_allocator::config::KubernetesSettings {
        kubeconfig: Some(dir.path().join("nope")),
        ..Default::default()
    };
    let Err(err) = spark_pod_allocator::k8s::connect(&missing).await else {
        panic!("a missing kubeconfig file must be refused");
    };
    assert!(err.to_string().contains("kubeconfig"), "{err}");
}

#[tokio::test]
async fn executors_registered_with_the_driver_are_never_deleted_on_downscale() {
    let h = harness().await;
    start(&h.apps, request("app-reg", NS)).await;
    set_targets_and_round(&h, "app-reg", 4).await;
    wait_seen(&h.apps, "app-reg", range(1, 4)).await;
    h.apps
        .update_registered(
            &id("app-reg"),
            BTreeSet::from([ExecutorId(1), ExecutorId(2)]),
        )
        .await
        .unwrap();
    h.apps
        .set_total_expected(&id("app-reg"), targets(1))
        .await
        .unwrap();
    // Older than the idle timeout: the unknown pending ones may go, the registered may not.
    advance_round(&h, "app-reg", Duration::from_secs(61)).await;
    let deleted: BTreeSet<u64> = h
        .apps
        .status(&id("app-reg"))
        .await
        .unwrap()
        .deleted
        .iter()
        .map(|e| e.0)
        .collect();
    // Unbound pods go at once: their ids leave `deleted` as soon as the watch says so.
    assert!(deleted.is_subset(&BTreeSet::from([3, 4])), "{deleted:?}");
    assert_eq!(cluster_ids(&h.sim, NS, "app-reg").await, range(1, 2));
    h.apps.stop(&id("app-reg")).await.unwrap();
}

#[tokio::test]
async fn an_adaptive_application_doubles_its_requests_and_resets_on_quota_refusals() {
    let h = harness().await;
    let app = "app-adaptive";
    let mut req = request(app, NS);
    req.settings.batch_size = 2;
    req.settings.policy = AllocationPolicy::Adaptive;
    start(&h.apps, req).await;
    set_targets_and_round(&h, app, 100).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 2));
    // Every round's creates accepted, pods seen (Pending: nothing piles up beyond the
    // window): 2, then 4, then 8 per round.
    wait_seen(&h.apps, app, range(1, 2)).await;
    advance_round(&h, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 6));
    wait_seen(&h.apps, app, range(1, 6)).await;
    advance_round(&h, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 14));
    wait_seen(&h.apps, app, range(1, 14)).await;
    // The namespace's quota is full: the 16 creates of the next round are refused, the
    // window goes back to the batch size, and the round backs off as for any failed round.
    h.sim.set_faults(FaultSettings {
        quota_fraction: 1.0,
        ..FaultSettings::default()
    });
    advance_round(&h, app, BATCH_DELAY).await;
    assert_eq!(h.apps.status(&id(app)).await.unwrap().last_executor_id, 30);
    assert_eq!(cluster_ids(&h.sim, NS, app).await, range(1, 14));
    h.sim.set_faults(FaultSettings::default());
    advance_round(&h, app, Duration::from_secs(2)).await;
    let ids = cluster_ids(&h.sim, NS, app).await;
    assert_eq!(ids, range(1, 14).union(&range(31, 32)).copied().collect());
    assert_eq!(h.apps.stop(&id(app)).await.unwrap(), 16);
}
