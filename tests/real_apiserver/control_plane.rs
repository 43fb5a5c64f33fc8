//! The service on a real control plane (the test API server with `--control-plane`): a real
//! kube-scheduler binds the executors to kwok's fake nodes, kwok plays their kubelets (pods go
//! Running, or fail as their labels ask), and the real kube-controller-manager collects the
//! executors of a deleted driver and finalizes deleted namespaces. Nothing here plays
//! scheduler or kubelet.

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use spark_pod_allocator::allocator::{ExecutorState, ResourceProfileId};
use spark_pod_allocator::app::{Applications, ManualClock};
use test_kit::apiserver::{KWOK_EXIT_CODE, KWOK_OUTCOME};
use test_kit::cluster::{Cluster, RealBackend, cluster_ids, pod_name};
use test_kit::service::{
    applications, id, labelled_template, range, set_targets_and_round, start,
    start_application as request, targets, wait_executor,
};
use test_kit::wait::until;

/// The user the garbage collector acts as (the controller-manager runs each controller with
/// its own service account, as a kubeadm cluster does).
pub(crate) const GARBAGE_COLLECTOR: &str =
    "system:serviceaccount:kube-system:generic-garbage-collector";

/// The user the scheduler acts as.
pub(crate) const SCHEDULER: &str = "system:kube-scheduler";

fn service(c: &RealBackend) -> Applications {
    applications(
        c.service_client(),
        &ManualClock::starting_now(),
        c.service_settings(),
    )
}

async fn wait_running(apps: &Applications, app: &str, execs: std::ops::RangeInclusive<u64>) {
    for exec in execs {
        wait_executor(apps, app, exec, |e| e.state == ExecutorState::Running).await;
    }
}

/// Whether the audit log has `user`'s `verb` on pod `name` (or on its `subresource`) in
/// `namespace`.
fn audited(
    events: &[Value],
    user: &str,
    verb: &str,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
) -> bool {
    events.iter().any(|e| {
        let r = &e["objectRef"];
        e["user"]["username"] == user
            && e["verb"] == verb
            && r["resource"] == "pods"
            && r["namespace"] == namespace
            && r["name"] == name
            && r["subresource"].as_str() == subresource
    })
}

#[tokio::test]
async fn executors_are_scheduled_by_the_scheduler_and_run_on_kwok_nodes() {
    let Some(c) = RealBackend::with_control_plane("scheduled").await else {
        return;
    };
    let apps = service(&c);
    start(&apps, request("app-run", c.namespace())).await;
    set_targets_and_round(&apps, "app-run", targets(3)).await;
    assert_eq!(cluster_ids(&c, "app-run").await, range(1, 3));
    wait_running(&apps, "app-run", 1..=3).await;
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let events = c.server().audit_events();
    for exec in 1..=3 {
        let name = pod_name("app-run", exec);
        let pod = pods.get(&name).await.expect("executor");
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        assert!(node.starts_with("kwok-node-"), "{name} is on {node:?}");
        let phase = pod.status.and_then(|s| s.phase);
        assert_eq!(phase.as_deref(), Some("Running"), "{name}");
        assert!(
            audited(
                &events,
                SCHEDULER,
                "create",
                c.namespace(),
                &name,
                Some("binding")
            ),
            "the scheduler bound {name}"
        );
    }
    assert_eq!(apps.stop(&id("app-run")).await.expect("stop"), 3);
    until("the stopped application's pods are gone", async || {
        cluster_ids(&c, "app-run").await.is_empty()
    })
    .await;
    c.finish().await;
}

/// The safety net: with the service down, deleting the driver pod makes the garbage
/// collector delete its executors (their ownerReference names the driver).
#[tokio::test]
async fn the_garbage_collector_deletes_the_executors_of_a_deleted_driver() {
    let Some(c) = RealBackend::with_control_plane("garbage").await else {
        return;
    };
    let apps = service(&c);
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let mut driver = labelled_template();
    driver.metadata.name = Some("driver-gc".into());
    pods.create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");
    let mut req = request("app-gc", c.namespace());
    req.driver_pod_name = Some("driver-gc".into());
    start(&apps, req).await;
    set_targets_and_round(&apps, "app-gc", targets(3)).await;
    wait_running(&apps, "app-gc", 1..=3).await;
    // Only the garbage collector is left to act on the driver's deletion.
    apps.shutdown().await;
    pods.delete("driver-gc", &DeleteParams::default())
        .await
        .expect("driver deleted");
    until("the deleted driver's executors are gone", async || {
        cluster_ids(&c, "app-gc").await.is_empty()
    })
    .await;
    let events = c.server().audit_events();
    for exec in 1..=3 {
        let name = pod_name("app-gc", exec);
        assert!(
            audited(
                &events,
                GARBAGE_COLLECTOR,
                "delete",
                c.namespace(),
                &name,
                None
            ),
            "the garbage collector deleted {name}"
        );
    }
    c.finish().await;
}

/// kwok's failure stages reach the service as a kubelet's reports would: a container that
/// exits with a code fails its executor with that code, and an image that cannot be pulled
/// shows as what keeps the executor from starting.
#[tokio::test]
async fn kwok_fails_pods_as_their_labels_ask() {
    let Some(c) = RealBackend::with_control_plane("kwok-failures").await else {
        return;
    };
    let apps = service(&c);
    let mut req = request("app-exit", c.namespace());
    let template = req.templates.get_mut(&ResourceProfileId(0)).expect("P0");
    template.metadata.labels = Some([(KWOK_OUTCOME.to_string(), "exit".to_string())].into());
    template.metadata.annotations = Some([(KWOK_EXIT_CODE.to_string(), "137".to_string())].into());
    start(&apps, req).await;
    set_targets_and_round(&apps, "app-exit", targets(1)).await;
    wait_executor(&apps, "app-exit", 1, |e| {
        matches!(
            e.state,
            ExecutorState::Failed {
                exit_code: Some(137),
                ..
            }
        )
    })
    .await;

    let mut req = request("app-pull", c.namespace());
    let template = req.templates.get_mut(&ResourceProfileId(0)).expect("P0");
    template.metadata.labels =
        Some([(KWOK_OUTCOME.to_string(), "image-pull-backoff".to_string())].into());
    start(&apps, req).await;
    set_targets_and_round(&apps, "app-pull", targets(1)).await;
    wait_executor(&apps, "app-pull", 1, |e| {
        e.state == ExecutorState::Pending
            && e.start_blocker
                .as_ref()
                .is_some_and(|b| b.reason() == "ImagePullBackOff")
    })
    .await;
    for app in ["app-exit", "app-pull"] {
        apps.stop(&id(app)).await.expect("stop");
    }
    c.finish().await;
}

/// The controller-manager gives a new namespace its `default` ServiceAccount, and a deleted
/// namespace's pods go with it.
#[tokio::test]
async fn a_namespace_gets_its_service_account_and_goes_with_its_pods() {
    let Some(c) = RealBackend::with_control_plane("namespaces").await else {
        return;
    };
    let admin = c.admin_client();
    let name = "control-plane-lifecycle";
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("namespace");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), name);
    until("the namespace's default ServiceAccount", async || {
        matches!(accounts.get_opt("default").await, Ok(Some(_)))
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), name);
    let mut pod = labelled_template();
    pod.metadata.name = Some("lonely".into());
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod admitted with the default ServiceAccount");
    until("the pod runs on a kwok node", async || {
        let pod = pods.get_opt("lonely").await.ok().flatten();
        pod.and_then(|p| p.status).and_then(|s| s.phase).as_deref() == Some("Running")
    })
    .await;
    namespaces
        .delete(name, &DeleteParams::default())
        .await
        .expect("namespace deleted");
    until("the namespace and its pod are gone", async || {
        matches!(namespaces.get_opt(name).await, Ok(None))
    })
    .await;
    // The service took no part: no audit check of its requests.
}
