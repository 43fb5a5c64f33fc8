//! The service's contract, written once and run against two backends: the simulator and a
//! real kube-apiserver (over etcd; `TEST_APISERVER_BIN`, see crates/test-kit/src/apiserver.rs). Each
//! scenario drives the service core (`Applications` with a `ManualClock`) over real HTTP;
//! the test plays scheduler and kubelet. On the real server the service's client carries a
//! service-account token bound to the Helm chart's RBAC only, and each scenario ends by
//! checking the audit log for anything else it used.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use spark_pod_allocator::allocator::{ExecutorId, ExecutorState, ResourceProfileId};
use spark_pod_allocator::app::{AppError, Applications, ManualClock};
use test_kit::cluster::{
    Cluster, bind, cluster_ids, cluster_ids_in, delete_now, pod_name, set_failed, set_running,
};
use test_kit::service::{
    BATCH_DELAY, P0, applications, id, labelled_template as template, range, start,
    start_application as request, targets, wait_seen,
};
use test_kit::wait::until;

/// Each scenario as three tests: `<scenario>::simulator`, `<scenario>::real_api_server`
/// and `<scenario>::real_scheduler_and_controllers` (the real server with kube-scheduler
/// and kube-controller-manager running beside it, no nodes: the scheduler marks each pod
/// Unschedulable until the scenario binds it, the garbage collector acts).
macro_rules! contract {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn simulator() {
                let cluster = test_kit::cluster::SimBackend::start().await;
                super::$scenario(&cluster).await;
                test_kit::cluster::Cluster::finish(&cluster).await;
            }

            #[tokio::test]
            async fn real_api_server() {
                let Some(cluster) =
                    test_kit::cluster::RealBackend::start(stringify!($scenario)).await
                else {
                    return;
                };
                super::$scenario(&cluster).await;
                test_kit::cluster::Cluster::finish(&cluster).await;
            }

            #[tokio::test]
            async fn real_scheduler_and_controllers() {
                let Some(cluster) = test_kit::cluster::RealBackend::with_controllers(
                    &format!("{}-cp", stringify!($scenario)),
                )
                .await
                else {
                    return;
                };
                super::$scenario(&cluster).await;
                test_kit::cluster::Cluster::finish(&cluster).await;
            }
        }
    )*};
}

contract!(
    batches_are_respected_and_targets_reached,
    pending_pods_are_capped,
    downscale_deletes_pending_excess_and_is_deleted_until_gone,
    executors_registered_with_the_driver_are_kept_on_downscale,
    failed_executors_are_replaced_with_new_ids,
    deleted_executors_are_replaced_with_new_ids,
    stop_removes_one_application_only,
    each_resource_profile_gets_its_own_pods,
    the_driver_pod_owns_the_executors,
    a_deleted_driver_pod_without_spark_labels_stops_its_application,
    a_restarted_service_resumes_without_reusing_ids,
    an_executors_claim_is_created_with_it_and_reused_by_its_replacement,
    a_claim_under_an_executors_name_made_by_another_is_never_mounted_or_deleted,
);

struct Service {
    clock: ManualClock,
    apps: Applications,
}

/// The service of the scenarios, whose periodic LIST comes every 30 s of the clock: they
/// count on it (the default is a rarer safety net).
fn service(c: &impl Cluster, clock: &ManualClock) -> Service {
    let mut config = c.service_settings();
    config.resync_interval_ms = 30_000;
    Service {
        clock: clock.clone(),
        apps: applications(c.service_client(), clock, config),
    }
}

async fn wait_state(s: &Service, app: &str, exec: u64, wanted: fn(&ExecutorState) -> bool) {
    test_kit::service::wait_executor(&s.apps, app, exec, |e| wanted(&e.state)).await
}

async fn advance_round(s: &Service, app: &str, by: Duration) {
    test_kit::service::advance_round(&s.apps, &s.clock, app, by).await
}

async fn set_targets_and_round(s: &Service, app: &str, t: BTreeMap<ResourceProfileId, u32>) {
    test_kit::service::set_targets_and_round(&s.apps, app, t).await
}

async fn batches_are_respected_and_targets_reached(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let started = start(&s.apps, request("app-a", c.namespace())).await;
    assert!(!started.resumed);
    set_targets_and_round(&s, "app-a", targets(25)).await;
    assert_eq!(cluster_ids(c, "app-a").await, range(1, 10));
    // The next batch only once a round has seen the previous pods (Pending is enough).
    for (seen, then) in [(10, 20), (20, 25), (25, 25)] {
        wait_seen(&s.apps, "app-a", range(1, seen)).await;
        advance_round(&s, "app-a", BATCH_DELAY).await;
        assert_eq!(cluster_ids(c, "app-a").await, range(1, then));
    }
    let status = s.apps.status(&id("app-a")).await.expect("status");
    assert_eq!(status.profiles[&P0].target, 25);
    assert_eq!(status.last_executor_id, 25);
    assert_eq!(s.apps.stop(&id("app-a")).await.expect("stop"), 25);
    assert!(cluster_ids(c, "app-a").await.is_empty());
}

async fn pending_pods_are_capped(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let mut req = request("app-cap", c.namespace());
    req.settings.max_pending_pods = Some(4);
    start(&s.apps, req).await;
    set_targets_and_round(&s, "app-cap", targets(10)).await;
    assert_eq!(cluster_ids(c, "app-cap").await, range(1, 4));
    wait_seen(&s.apps, "app-cap", range(1, 4)).await;
    advance_round(&s, "app-cap", BATCH_DELAY).await;
    assert_eq!(
        cluster_ids(c, "app-cap").await,
        range(1, 4),
        "4 pending: no room"
    );
    set_running(c, "app-cap", 1).await;
    set_running(c, "app-cap", 2).await;
    wait_state(&s, "app-cap", 2, |st| *st == ExecutorState::Running).await;
    wait_state(&s, "app-cap", 1, |st| *st == ExecutorState::Running).await;
    advance_round(&s, "app-cap", BATCH_DELAY).await;
    assert_eq!(cluster_ids(c, "app-cap").await, range(1, 6));
    s.apps.stop(&id("app-cap")).await.expect("stop");
}

async fn downscale_deletes_pending_excess_and_is_deleted_until_gone(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-down";
    start(&s.apps, request(app, c.namespace())).await;
    set_targets_and_round(&s, app, targets(8)).await;
    assert_eq!(cluster_ids(c, app).await, range(1, 8));
    for exec in 1..=3 {
        set_running(c, app, exec).await;
    }
    // Bound pods are deleted gracefully: they stay (terminating) after the DELETE.
    for exec in 4..=8 {
        bind(c, app, exec).await;
    }
    for exec in 1..=3 {
        wait_state(&s, app, exec, |st| *st == ExecutorState::Running).await;
    }
    s.apps
        .set_total_expected(&id(app), targets(4))
        .await
        .expect("targets");
    // Pending pods older than the idle timeout (60 s) may go.
    advance_round(&s, app, Duration::from_secs(61)).await;
    advance_round(&s, app, BATCH_DELAY).await;
    let status = s.apps.status(&id(app)).await.expect("status");
    let deleted: BTreeSet<u64> = status.deleted.iter().map(|e| e.0).collect();
    assert_eq!(
        deleted.len(),
        4,
        "an excess of 4 pending deleted: {deleted:?}"
    );
    assert!(deleted.iter().all(|d| (4..=8).contains(d)), "{deleted:?}");
    for d in &deleted {
        assert!(
            s.apps
                .is_deleted(&id(app), ExecutorId(*d))
                .await
                .expect("is deleted")
        );
    }
    assert!(
        !s.apps
            .is_deleted(&id(app), ExecutorId(1))
            .await
            .expect("is deleted")
    );
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    for d in &deleted {
        let pod = pods.get(&pod_name(app, *d)).await.expect("terminating pod");
        assert!(
            pod.metadata.deletion_timestamp.is_some(),
            "{d} is terminating"
        );
    }
    // The kubelet confirms: the pods go, and IsDeleted turns false.
    for d in &deleted {
        delete_now(c, app, *d).await;
    }
    let live: BTreeSet<u64> = range(1, 8).difference(&deleted).copied().collect();
    advance_round(&s, app, BATCH_DELAY).await;
    advance_round(&s, app, Duration::from_secs(31)).await;
    wait_seen(&s.apps, app, live.clone()).await;
    advance_round(&s, app, BATCH_DELAY).await;
    for d in &deleted {
        assert!(
            !s.apps
                .is_deleted(&id(app), ExecutorId(*d))
                .await
                .expect("is deleted")
        );
    }
    assert_eq!(cluster_ids(c, app).await, live);
    s.apps.stop(&id(app)).await.expect("stop");
}

async fn executors_registered_with_the_driver_are_kept_on_downscale(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-reg";
    start(&s.apps, request(app, c.namespace())).await;
    set_targets_and_round(&s, app, targets(4)).await;
    wait_seen(&s.apps, app, range(1, 4)).await;
    s.apps
        .update_registered(&id(app), BTreeSet::from([ExecutorId(1), ExecutorId(2)]))
        .await
        .expect("registered");
    s.apps
        .set_total_expected(&id(app), targets(1))
        .await
        .expect("targets");
    advance_round(&s, app, Duration::from_secs(61)).await;
    // Unbound pods go at once.
    until("the unregistered excess gone", || async {
        cluster_ids(c, app).await == range(1, 2)
    })
    .await;
    s.apps.stop(&id(app)).await.expect("stop");
}

async fn failed_executors_are_replaced_with_new_ids(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-fail";
    start(&s.apps, request(app, c.namespace())).await;
    set_targets_and_round(&s, app, targets(3)).await;
    for exec in 1..=3 {
        set_running(c, app, exec).await;
    }
    set_failed(c, app, 2).await;
    wait_state(&s, app, 2, |st| matches!(st, ExecutorState::Failed { .. })).await;
    advance_round(&s, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(c, app).await, BTreeSet::from([1, 3, 4]));
    assert_eq!(s.apps.stop(&id(app)).await.expect("stop"), 3);
}

async fn deleted_executors_are_replaced_with_new_ids(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-gone";
    start(&s.apps, request(app, c.namespace())).await;
    set_targets_and_round(&s, app, targets(3)).await;
    for exec in 1..=3 {
        set_running(c, app, exec).await;
    }
    for exec in 1..=3 {
        wait_state(&s, app, exec, |st| *st == ExecutorState::Running).await;
    }
    // Removed by someone else (an eviction, a user): the executor is lost.
    delete_now(c, app, 3).await;
    until("the deletion seen", || async {
        let snapshot = s.apps.snapshot(&id(app)).await.expect("snapshot");
        snapshot
            .executors
            .get(&ExecutorId(3))
            .is_none_or(|e| e.state == ExecutorState::Deleted)
    })
    .await;
    advance_round(&s, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(c, app).await, BTreeSet::from([1, 2, 4]));
    s.apps.stop(&id(app)).await.expect("stop");
}

async fn stop_removes_one_application_only(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    start(&s.apps, request("app-x", c.namespace())).await;
    start(&s.apps, request("app-y", c.namespace())).await;
    start(&s.apps, request("app-z", c.other_namespace())).await;
    set_targets_and_round(&s, "app-x", targets(3)).await;
    set_targets_and_round(&s, "app-y", targets(2)).await;
    set_targets_and_round(&s, "app-z", targets(2)).await;
    wait_seen(&s.apps, "app-x", range(1, 3)).await;
    wait_seen(&s.apps, "app-y", range(1, 2)).await;
    wait_seen(&s.apps, "app-z", range(1, 2)).await;
    set_running(c, "app-x", 1).await;
    assert_eq!(s.apps.stop(&id("app-x")).await.expect("stop"), 3);
    // The running (bound) pod is deleted gracefully: terminating until its kubelet confirms.
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let terminating = pods
        .get(&pod_name("app-x", 1))
        .await
        .expect("terminating pod");
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert_eq!(cluster_ids(c, "app-x").await, range(1, 1));
    delete_now(c, "app-x", 1).await;
    assert!(cluster_ids(c, "app-x").await.is_empty());
    assert_eq!(cluster_ids(c, "app-y").await, range(1, 2));
    assert_eq!(
        cluster_ids_in(c, c.other_namespace(), "app-z").await,
        range(1, 2)
    );
    let gone = s.apps.status(&id("app-x")).await.map(|_| ());
    assert!(matches!(gone, Err(AppError::NotFound(_))), "{gone:?}");
    // y goes on working after x's stop.
    set_running(c, "app-y", 1).await;
    set_failed(c, "app-y", 1).await;
    wait_state(&s, "app-y", 1, |st| {
        matches!(st, ExecutorState::Failed { .. })
    })
    .await;
    advance_round(&s, "app-y", BATCH_DELAY).await;
    assert_eq!(cluster_ids(c, "app-y").await, BTreeSet::from([2, 3]));
    assert_eq!(s.apps.stop(&id("app-y")).await.expect("stop"), 2);
    assert_eq!(s.apps.stop(&id("app-z")).await.expect("stop"), 2);
    assert!(s.apps.watched_namespaces().is_empty());
}

async fn each_resource_profile_gets_its_own_pods(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-prof";
    let p1 = ResourceProfileId(1);
    let mut req = request(app, c.namespace());
    let mut big = template();
    if let Some(spec) = big.spec.as_mut() {
        spec.containers[0].image = Some("spark:4-big".into());
    }
    req.templates.insert(p1, big);
    start(&s.apps, req).await;
    set_targets_and_round(&s, app, BTreeMap::from([(P0, 2), (p1, 3)])).await;
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let listed = pods
        .list(&kube::api::ListParams::default().labels(&format!("spark-app-selector={app}")))
        .await
        .expect("list");
    let mut by_profile: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in &listed.items {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].image.clone());
        by_profile
            .entry(labels["spark-exec-resourceprofile-id"].clone())
            .or_default()
            .push(image.unwrap_or_default());
    }
    assert_eq!(by_profile["0"], vec!["spark:4"; 2]);
    assert_eq!(by_profile["1"], vec!["spark:4-big"; 3]);
    let status = s.apps.status(&id(app)).await.expect("status");
    assert_eq!(status.profiles[&p1].target, 3);
    assert_eq!(s.apps.stop(&id(app)).await.expect("stop"), 5);
}

async fn the_driver_pod_owns_the_executors(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let mut driver = template();
    driver.metadata.name = Some("driver-1".into());
    let driver = pods
        .create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");
    let mut req = request("app-own", c.namespace());
    req.driver_pod_name = Some("driver-1".into());
    start(&s.apps, req).await;
    set_targets_and_round(&s, "app-own", targets(1)).await;
    let pod = pods.get("app-own-exec-1").await.expect("executor");
    let owners = pod.metadata.owner_references.expect("owner references");
    assert_eq!(owners[0].name, "driver-1");
    assert_eq!(Some(&owners[0].uid), driver.metadata.uid.as_ref());
    assert_eq!(owners[0].controller, Some(true));
    let driver = pods.get("driver-1").await.expect("driver");
    assert_eq!(
        driver.metadata.annotations.expect("annotations")["spark-pod-allocator/last-executor-id"],
        "1"
    );
    s.apps.stop(&id("app-own")).await.expect("stop");
}

/// A notebook's driver pod (no Spark label): Start labels it, the namespace's driver watch
/// (a label selector the real API server evaluates) follows it, and its deletion stops the
/// application and deletes its executors.
async fn a_deleted_driver_pod_without_spark_labels_stops_its_application(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let mut driver = template();
    driver.metadata.name = Some("notebook-1".into());
    pods.create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");
    let mut req = request("app-nb", c.namespace());
    req.driver_pod_name = Some("notebook-1".into());
    start(&s.apps, req).await;
    let labelled = pods.get("notebook-1").await.expect("driver");
    assert_eq!(
        labelled.metadata.labels.unwrap_or_default()["spark-pod-allocator/driver"],
        "true"
    );
    set_targets_and_round(&s, "app-nb", targets(2)).await;
    assert_eq!(cluster_ids(c, "app-nb").await, range(1, 2));
    pods.delete("notebook-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("driver deleted");
    until("the application forgotten", || async {
        matches!(
            s.apps.status(&id("app-nb")).await,
            Err(AppError::NotFound(_))
        )
    })
    .await;
    assert!(cluster_ids(c, "app-nb").await.is_empty());
}

async fn a_restarted_service_resumes_without_reusing_ids(c: &impl Cluster) {
    let clock = ManualClock::starting_now();
    let s = service(c, &clock);
    let app = "app-r";
    start(&s.apps, request(app, c.namespace())).await;
    set_targets_and_round(&s, app, targets(5)).await;
    assert_eq!(cluster_ids(c, app).await, range(1, 5));
    s.apps.shutdown().await;
    assert_eq!(
        cluster_ids(c, app).await,
        range(1, 5),
        "shutdown keeps pods"
    );
    // While no service runs, the pod of the highest id goes.
    delete_now(c, app, 5).await;

    let restarted = service(c, &clock);
    let started = start(&restarted.apps, request(app, c.namespace())).await;
    assert!(started.resumed);
    assert_eq!(started.last_executor_id, 5, "id 5 was handed out");
    wait_seen(&restarted.apps, app, range(1, 4)).await;
    restarted
        .apps
        .set_total_expected(&id(app), targets(7))
        .await
        .expect("targets");
    // A round counted is no sign that an earlier round's creates were answered: the pods
    // are awaited.
    until("7 executors, no id reused", async || {
        restarted.clock.advance(BATCH_DELAY);
        cluster_ids(c, app).await == BTreeSet::from([1, 2, 3, 4, 6, 7, 8])
    })
    .await;
    assert_eq!(restarted.apps.stop(&id(app)).await.expect("stop"), 7);
}

/// Spark's `OnDemand` claims: the executor's claim is created, named, labelled and owned by
/// the driver pod as Spark does, the pod mounts it, and a lost executor's replacement mounts
/// it again instead of creating one (the real server without a volume controller leaves
/// claims Pending, which does not matter to either). Stop leaves driver-owned claims to the
/// driver pod.
async fn an_executors_claim_is_created_with_it_and_reused_by_its_replacement(c: &impl Cluster) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-pvc";
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.admin_client(), c.namespace());
    let mut driver = template();
    driver.metadata.name = Some("driver-pvc".into());
    let driver = pods
        .create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");
    let mut req = request(app, c.namespace());
    req.driver_pod_name = Some("driver-pvc".into());
    let claim_name = "{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0";
    let mut pod = template();
    pod.spec.as_mut().expect("spec").volumes = Some(vec![
        serde_json::from_value(serde_json::json!({
            "name": "spark-local-dir-1", "persistentVolumeClaim": {"claimName": claim_name}
        }))
        .expect("volume"),
    ]);
    req.templates = BTreeMap::from([(P0, pod)]);
    req.claims = vec![
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": claim_name},
            "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("claim"),
    ];
    start(&s.apps, req).await;
    set_targets_and_round(&s, app, targets(1)).await;
    let claim = claims
        .get("app-pvc-exec-1-pvc-0")
        .await
        .expect("executor 1's claim");
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["spark-app-selector"], app);
    assert_eq!(labels["spark-role"], "executor");
    let owners = claim.metadata.owner_references.expect("owner references");
    assert_eq!(owners[0].name, "driver-pvc");
    assert_eq!(Some(&owners[0].uid), driver.metadata.uid.as_ref());
    let mounted = |pod: Pod| -> String {
        pod.spec.and_then(|s| s.volumes).unwrap_or_default()[0]
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.clone())
            .unwrap_or_default()
    };
    let pod = pods.get("app-pvc-exec-1").await.expect("executor 1");
    assert_eq!(mounted(pod), "app-pvc-exec-1-pvc-0");
    set_running(c, app, 1).await;
    wait_state(&s, app, 1, |st| *st == ExecutorState::Running).await;
    // The executor runs a while: a claim younger than a batch delay is never reused.
    advance_round(&s, app, BATCH_DELAY * 2).await;
    delete_now(c, app, 1).await;
    until("the deletion seen", || async {
        let snapshot = s.apps.snapshot(&id(app)).await.expect("snapshot");
        snapshot
            .executors
            .get(&ExecutorId(1))
            .is_none_or(|e| e.state == ExecutorState::Deleted)
    })
    .await;
    advance_round(&s, app, BATCH_DELAY).await;
    assert_eq!(cluster_ids(c, app).await, BTreeSet::from([2]));
    let pod = pods.get("app-pvc-exec-2").await.expect("executor 2");
    assert_eq!(mounted(pod), "app-pvc-exec-1-pvc-0");
    let names: Vec<String> = claims
        .list(&Default::default())
        .await
        .expect("claims")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    assert_eq!(names, ["app-pvc-exec-1-pvc-0"]);
    s.apps.stop(&id(app)).await.expect("stop");
    assert_eq!(
        claims
            .list(&Default::default())
            .await
            .expect("claims")
            .items
            .len(),
        1,
        "the driver pod owns its claims"
    );
}

/// Name squatting: a claim made by someone else (the application's labels, no owner the
/// service set) under the name executor 1's claim would take is not adopted: executor 1's
/// create fails naming it, no pod mounts it, executor 2 gets a claim of its own (not a
/// spare claim labelled alike, which reuse would take were it the application's), and
/// neither the squatter's claim nor its uid changes.
async fn a_claim_under_an_executors_name_made_by_another_is_never_mounted_or_deleted(
    c: &impl Cluster,
) {
    let s = service(c, &ManualClock::starting_now());
    let app = "app-sq";
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.admin_client(), c.namespace());
    let squatted: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app-sq-exec-1-pvc-0",
                     "labels": {"spark-app-selector": app, "spark-role": "executor"}},
        "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("claim");
    let mut spare = squatted.clone();
    spare.metadata.name = Some("spare".into());
    let squatted = claims
        .create(&PostParams::default(), &squatted)
        .await
        .expect("the squatter's claim");
    // With the application's labels too, free to reuse were it the application's.
    claims
        .create(&PostParams::default(), &spare)
        .await
        .expect("a spare claim labelled alike");
    let mut driver = template();
    driver.metadata.name = Some("driver-sq".into());
    pods.create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");
    let mut req = request(app, c.namespace());
    req.driver_pod_name = Some("driver-sq".into());
    let claim_name = "{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0";
    let mut pod = template();
    pod.spec.as_mut().expect("spec").volumes = Some(vec![
        serde_json::from_value(serde_json::json!({
            "name": "spark-local-dir-1", "persistentVolumeClaim": {"claimName": claim_name}
        }))
        .expect("volume"),
    ]);
    req.templates = BTreeMap::from([(P0, pod)]);
    req.claims = vec![
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": claim_name},
            "spec": {"storageClassName": "standard", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("claim"),
    ];
    start(&s.apps, req).await;
    set_targets_and_round(&s, app, targets(1)).await;
    assert!(
        cluster_ids(c, app).await.is_empty(),
        "no pod for executor 1"
    );
    let status = s.apps.application_status(&id(app)).await.expect("status");
    let failure = &status.create_failures[&P0];
    assert_eq!(failure.http_code, Some(409), "{failure:?}");
    assert!(
        failure.message.contains("app-sq-exec-1-pvc-0"),
        "{failure:?}"
    );
    // After the back-off, the next id gets a claim of its own.
    for _ in 0..20 {
        if !cluster_ids(c, app).await.is_empty() {
            break;
        }
        advance_round(&s, app, BATCH_DELAY * 10).await;
    }
    assert_eq!(cluster_ids(c, app).await, BTreeSet::from([2]));
    let pod = pods.get("app-sq-exec-2").await.expect("executor 2");
    let mounted = pod.spec.and_then(|s| s.volumes).unwrap_or_default()[0]
        .persistent_volume_claim
        .as_ref()
        .map(|c| c.claim_name.clone());
    assert_eq!(mounted.as_deref(), Some("app-sq-exec-2-pvc-0"));
    s.apps.stop(&id(app)).await.expect("stop");
    let after = claims
        .get("app-sq-exec-1-pvc-0")
        .await
        .expect("the squatter's claim stays");
    assert_eq!(after.metadata.uid, squatted.metadata.uid);
    assert_eq!(after.metadata.owner_references, None);
}
