//! The service binary (`serve`) on the real API server with the chart's service account only:
//! SIGKILLed in the middle of a scale-up, started again, it finishes the scale-up from the
//! registration it kept in Kubernetes (listing registrations across namespaces at start); the
//! audit log shows it used nothing the chart does not grant (checked by `finish`).
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use spark_pod_allocator::k8s::IdRecord;
use spark_pod_allocator::k8s::id_record::LAST_EXECUTOR_ID_KEY;

use test_kit::cluster::{Cluster, RealBackend};
use test_kit::grpc::{batched_start_request, start_scaled};
use test_kit::process::{connect_serving, serve_against, serve_at};
use test_kit::requests::*;
use test_kit::service::stored_registration;
use test_kit::wait::{until, until_progress};

const APP: &str = "app-binary";

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

async fn executor_ids(c: &RealBackend) -> BTreeSet<u64> {
    test_kit::sim::executor_ids(&c.admin_client(), c.namespace(), APP).await
}

#[tokio::test]
async fn the_service_binary_resumes_with_the_charts_rights_only() {
    let Some(c) = RealBackend::start("binary").await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    c.write_service_kubeconfig(&kubeconfig);

    let (mut first, mut client) =
        serve_against(BIN, &kubeconfig, &c.service_settings().registrations).await;
    start_scaled(
        &mut client,
        batched_start_request(APP, c.namespace(), 2, 5000),
        6,
    )
    .await;
    // The whole first batch, so that no create is in flight at the kill (the batch delay
    // holds the next one back); a create cut off by SIGKILL may never land, and its id is
    // then skipped, which is right but not this test's point.
    until_progress(
        "the first batch",
        async || executor_ids(&c).await,
        |ids| ids.len() == 2,
    )
    .await;
    // The registration is written beside the first round's creates, not before them; a
    // crash loses at most what came after the last write, so the kill waits for it.
    until("the registration with the target", || async {
        stored_registration(&c.admin_client(), c.service_namespace(), c.namespace(), APP)
            .await
            .is_some_and(|r| r.targets.get(&0) == Some(&6))
    })
    .await;
    first.start_kill().expect("SIGKILL");
    first.wait().await.expect("killed");
    let at_kill = executor_ids(&c).await;
    // The id record reserved a block (ids up to what the target lacks may be in use),
    // possibly more than the killed service created.
    let config_maps: Api<ConfigMap> = Api::namespaced(c.admin_client(), c.namespace());
    let stored = config_maps
        .get(&IdRecord::config_map_name(APP))
        .await
        .expect("the id record's ConfigMap");
    let recorded = stored.data.as_ref().expect("data")[LAST_EXECUTOR_ID_KEY]
        .parse::<u64>()
        .expect("a number");
    let highest_at_kill = at_kill.iter().max().copied().unwrap_or(0);
    assert!(
        recorded >= highest_at_kill,
        "record {recorded}, created {at_kill:?}"
    );

    let (_second, address) = serve_at(BIN, &kubeconfig, &c.service_settings().registrations).await;
    until_progress(
        "6 executors",
        async || executor_ids(&c).await,
        |ids| ids.len() == 6,
    )
    .await;
    // Connected only now: the scale-up took a batch delay (5 s), as long as a connection
    // that has made no authenticated call is kept open.
    let mut client = connect_serving(&address).await;
    let ids = executor_ids(&c).await;
    assert!(at_kill.is_subset(&ids), "{at_kill:?} ⊄ {ids:?}");
    // The new ids start above the reserved block: none of it is used again.
    let new: BTreeSet<u64> = ids.difference(&at_kill).copied().collect();
    let expected: BTreeSet<u64> = (recorded + 1..=recorded + new.len() as u64).collect();
    assert_eq!(new, expected, "ids continue after the block, none reused");
    let stopped = client
        .stop(stop_request(APP))
        .await
        .expect("Stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 6);
    c.finish().await;
}
