//! Restart without the driver's help: the service binary, killed with SIGKILL in the middle
//! of a scale-up, is started again against the same (simulated) cluster and finishes the
//! scale-up from the registration it kept in Kubernetes, with no call from the driver; the
//! next call just works, and Stop deletes the registration (kept in the service's
//! namespace, `default` here as no `POD_NAMESPACE` is set) and the id record. A restart
//! that cannot read the registrations yet answers UNAVAILABLE for the application (never
//! NOT_FOUND, which a driver takes for its end) and resumes it once it can.
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use spark_pod_allocator::k8s::IdRecord;
use spark_pod_allocator::k8s::id_record::LAST_EXECUTOR_ID_KEY;
use spark_pod_allocator_sim::{FaultSettings, SimCluster};

use test_kit::grpc::{batched_start_request, start_scaled};
use test_kit::process::{connect_serving, serve_against, serve_at};
use test_kit::requests::*;
use test_kit::service::stored_registration;
use test_kit::sim::manual_cluster;
use test_kit::wait::until;

const NS: &str = "default";
/// The service's namespace (no `POD_NAMESPACE`, no `registrations.namespace`).
const SERVICE_NS: &str = "default";
const APP: &str = "app-restart";

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

async fn executor_ids(sim: &SimCluster) -> BTreeSet<u64> {
    test_kit::sim::executor_ids(&sim.try_client().expect("client"), NS, APP).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_killed_during_a_scale_up_finishes_it_after_a_restart_without_the_driver() {
    let sim = manual_cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");

    let (mut first, mut client) = serve_against(BIN, &kubeconfig, &Default::default()).await;
    start_scaled(&mut client, batched_start_request(APP, NS, 2, 1000), 6).await;
    until("the first batch", async || {
        !executor_ids(&sim).await.is_empty()
    })
    .await;
    // The registration is written beside the first round's creates, not before them; a
    // crash loses at most what came after the last write, so the kill waits for it.
    let admin = sim.try_client().expect("client");
    until("the registration with the target", async || {
        stored_registration(&admin, SERVICE_NS, NS, APP)
            .await
            .is_some_and(|r| r.targets.get(&0) == Some(&6))
    })
    .await;
    first.start_kill().expect("SIGKILL");
    first.wait().await.expect("killed");
    let at_kill = executor_ids(&sim).await;
    assert!(at_kill.len() < 6, "killed mid scale-up: {at_kill:?}");

    // What the killed service left: its registration, with the target, and the id record.
    let cluster = sim.try_client().expect("client");
    let registration = stored_registration(&cluster, SERVICE_NS, NS, APP)
        .await
        .expect("the registration");
    assert_eq!(registration.targets.get(&0), Some(&6));
    let config_maps: Api<ConfigMap> = Api::namespaced(cluster.clone(), NS);
    let stored = config_maps
        .get(&IdRecord::config_map_name(APP))
        .await
        .expect("the id record's ConfigMap");
    // The id record reserved a block: ids up to what the target lacks may be in use,
    // more than the killed service created.
    let recorded = stored.data.as_ref().expect("data")[LAST_EXECUTOR_ID_KEY]
        .parse::<u64>()
        .expect("a number");
    let highest_at_kill = at_kill.iter().max().copied().unwrap_or(0);
    assert!(
        recorded >= highest_at_kill && recorded == 6,
        "record {recorded}, created {at_kill:?}"
    );

    // A new service, and no call from the driver: the scale-up completes.
    let (_second, address) = serve_at(BIN, &kubeconfig, &Default::default()).await;
    until("6 executors", async || executor_ids(&sim).await.len() == 6).await;
    // Connected only now: the scale-up took a batch delay (5 s), as long as a connection
    // that has made no authenticated call is kept open.
    let mut client = connect_serving(&address).await;
    let ids = executor_ids(&sim).await;
    assert!(at_kill.is_subset(&ids), "{at_kill:?} ⊄ {ids:?}");
    // The new ids start above the reserved block: none of the block is used again, even
    // the ids the killed service never created.
    let new: BTreeSet<u64> = ids.difference(&at_kill).copied().collect();
    let expected: BTreeSet<u64> = (recorded + 1..=recorded + new.len() as u64).collect();
    assert_eq!(new, expected, "ids continue after the block, none reused");

    // The next call just works.
    let status = client
        .get_status(status_request(APP))
        .await
        .expect("GetStatus")
        .into_inner();
    assert_eq!(status.profiles[0].target, 6);
    assert_eq!(
        u64::try_from(status.last_executor_id).ok(),
        ids.iter().max().copied()
    );
    let stopped = client
        .stop(stop_request(APP))
        .await
        .expect("Stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 6);
    assert!(
        stored_registration(&cluster, SERVICE_NS, NS, APP)
            .await
            .is_none(),
        "Stop deleted the registration"
    );
    assert!(
        config_maps
            .get_opt(&IdRecord::config_map_name(APP))
            .await
            .expect("get")
            .is_none(),
        "Stop deleted the id record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_the_api_server_refuses_is_retried_and_its_calls_are_unavailable_meanwhile() {
    let sim = manual_cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    let (mut first, mut client) = serve_against(BIN, &kubeconfig, &Default::default()).await;
    start_scaled(&mut client, batched_start_request(APP, NS, 2, 1000), 4).await;
    let admin = sim.try_client().expect("client");
    until("the registration with the target", async || {
        stored_registration(&admin, SERVICE_NS, NS, APP)
            .await
            .is_some_and(|r| r.targets.get(&0) == Some(&4))
    })
    .await;
    first.start_kill().expect("SIGKILL");
    first.wait().await.expect("killed");

    // The registrations (ConfigMaps) answer 500 while the next service starts.
    sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        only_resources: vec!["configmaps".into()],
        ..FaultSettings::default()
    });
    let (_second, address) = serve_at(BIN, &kubeconfig, &Default::default()).await;
    let mut client = connect_serving(&address).await;
    let refused = client
        .get_status(status_request(APP))
        .await
        .expect_err("not resumed yet");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // Readable again: resumed with no call from the driver, its target kept.
    sim.set_faults(FaultSettings::default());
    until("resumed by itself", async || {
        client
            .clone()
            .get_status(status_request(APP))
            .await
            .is_ok_and(|status| status.into_inner().profiles[0].target == 4)
    })
    .await;
    until("4 executors", async || executor_ids(&sim).await.len() == 4).await;
}
