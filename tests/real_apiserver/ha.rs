//! Two replicas of the service binary on a real API server of their own, with the chart's
//! rights only: the owner is paused (SIGSTOP) past its lease, the other takes the shard and
//! finishes the scale-up, and the owner, woken up (SIGCONT), sends not one write. The
//! proof is the API server's audit log: every request names its replica in its User-Agent.
use std::collections::BTreeSet;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::Value;
use spark_pod_allocator::grpc::forward::ANSWERED_BY_METADATA;
use spark_pod_allocator::k8s::replica_user_agent;
use test_kit::cluster::{Cluster, RealBackend};
use test_kit::grpc::batched_start_request;
use test_kit::process::{connect_serving, pause, serve_with, wake};
use test_kit::requests::*;
use test_kit::wait::until;
use tokio::process::Child;

const APP: &str = "app-ha";
const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

async fn replica(c: &RealBackend, kubeconfig: &std::path::Path, identity: &str) -> (Child, String) {
    serve_with(
        BIN,
        kubeconfig,
        &c.service_options().registrations,
        &[
            ("SPARK_POD_ALLOCATOR__HA__IDENTITY", identity),
            ("SPARK_POD_ALLOCATOR__HA__LEASE_DURATION_MS", "3000"),
            ("SPARK_POD_ALLOCATOR__HA__RENEW_DEADLINE_MS", "2000"),
            ("SPARK_POD_ALLOCATOR__HA__RETRY_PERIOD_MS", "500"),
        ],
    )
    .await
}

async fn executor_ids(c: &RealBackend) -> BTreeSet<u64> {
    test_kit::sim::executor_ids(&c.admin_client(), c.namespace(), APP).await
}

async fn holder(c: &RealBackend) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.admin_client(), c.service_namespace());
    leases
        .get_opt("spark-pod-allocator-shard-0")
        .await
        .expect("get the Lease")
        .and_then(|lease| lease.spec?.holder_identity)
}

/// The writes (anything but get, list and watch) of `identity` in the audit log.
fn writes_of(c: &RealBackend, identity: &str) -> Vec<Value> {
    let agent = replica_user_agent(identity);
    c.server()
        .audit_events()
        .into_iter()
        .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "Panic")
        .filter(|e| e["userAgent"] == agent.as_str())
        .filter(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_woken_after_a_takeover_writes_nothing_by_the_audit_log() {
    let Some(c) = RealBackend::start_own("ha-pause", &[]).await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    c.write_service_kubeconfig(&kubeconfig);
    let (a, address_a) = replica(&c, &kubeconfig, "replica-a").await;
    let mut client_a = connect_serving(&address_a).await;
    let (_b, address_b) = replica(&c, &kubeconfig, "replica-b").await;
    let mut client_b = connect_serving(&address_b).await;
    assert_eq!(holder(&c).await.as_deref(), Some("replica-a"));

    client_a
        .start(batched_start_request(APP, c.namespace(), 2, 1000))
        .await
        .expect("Start on the owner");
    client_a
        .set_total_expected(targets_request(APP, 6))
        .await
        .expect("SetTotalExpected");
    until("the first batch", || async {
        executor_ids(&c).await.len() >= 2
    })
    .await;
    assert!(
        !writes_of(&c, "replica-a").is_empty(),
        "the owner's writes are in the log"
    );
    pause(&a);

    until("replica-b holds the shard", || async {
        holder(&c).await.as_deref() == Some("replica-b")
    })
    .await;
    // Once the lease has passed, anything `a` had on the wire has been answered.
    let at_takeover = writes_of(&c, "replica-a").len();
    until("6 executors, through replica-b", || async {
        executor_ids(&c).await.len() == 6
    })
    .await;
    client_b
        .set_total_expected(targets_request(APP, 8))
        .await
        .expect("the new owner takes calls");
    until("8 executors", || async {
        executor_ids(&c).await.len() == 8
    })
    .await;

    wake(&a);
    // Woken, `a` lets the application go and forwards its calls to the new owner.
    until("replica-a let the application go", || {
        let mut client = client_a.clone();
        async move {
            client
                .get_status(status_request(APP))
                .await
                .is_ok_and(|status| {
                    status
                        .metadata()
                        .get(ANSWERED_BY_METADATA)
                        .is_some_and(|by| by.to_str().ok() == Some("replica-b"))
                })
        }
    })
    .await;
    let writes = writes_of(&c, "replica-a");
    assert_eq!(
        writes.len(),
        at_takeover,
        "the deposed owner wrote: {:?}",
        &writes[at_takeover.min(writes.len())..]
    );
    assert_eq!(executor_ids(&c).await.len(), 8, "no pod beyond the target");
    let stopped = client_b
        .stop(stop_request(APP))
        .await
        .expect("Stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 8);
    c.finish().await;
}
