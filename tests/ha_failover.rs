//! Two replicas of the service binary on one simulated cluster, sharing the applications
//! through one shard Lease (`ha.shards = 1`, a 2 s lease): only the holder acts, a call
//! that reaches the other replica is forwarded to the holder (at the address in its
//! Lease), one while the holder is gone and its lease not passed answers UNAVAILABLE with
//! a retry hint, and when the holder is killed or paused past its lease the other takes
//! over from the registration and finishes the scale-up. A paused owner woken up sends not a
//! single write: the simulator counts every request by User-Agent, which names the
//! replica.
use std::collections::BTreeSet;
use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use spark_pod_allocator::grpc::error::RETRY_PUSHBACK_METADATA;
use spark_pod_allocator::grpc::forward::ANSWERED_BY_METADATA;
use spark_pod_allocator::k8s::IdRecord;
use spark_pod_allocator::k8s::id_record::LAST_EXECUTOR_ID_KEY;
use spark_pod_allocator::k8s::{USER_AGENT, replica_user_agent};
use spark_pod_allocator_sim::SimCluster;
use test_kit::grpc::{batched_start_request, until_event};
use test_kit::process::{connect_serving, pause, serve_replica, wake};
use test_kit::requests::*;
use test_kit::service::stored_registration;
use test_kit::sim::manual_cluster;
use test_kit::wait::{until, until_progress};
use tokio::process::Child;
use tonic::Code;

const NS: &str = "default";
const APP: &str = "app-ha";
const LEASE: &str = "spark-pod-allocator-shard-0";

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

/// A replica named `identity`: a 2 s lease, renewed every 250 ms, acted on for 1 s after
/// each renewal.
async fn replica(kubeconfig: &Path, identity: &str) -> (Child, String) {
    serve_replica(BIN, kubeconfig, identity, &[]).await
}

async fn executor_ids(sim: &SimCluster) -> BTreeSet<u64> {
    test_kit::sim::executor_ids(&sim.try_client().expect("client"), NS, APP).await
}

async fn holder(sim: &SimCluster) -> (Option<String>, Option<i32>) {
    let leases: Api<Lease> = Api::namespaced(sim.try_client().expect("client"), NS);
    match leases.get_opt(LEASE).await.expect("get the Lease") {
        Some(lease) => {
            let spec = lease.spec.unwrap_or_default();
            (spec.holder_identity, spec.lease_transitions)
        }
        None => (None, None),
    }
}

/// Writes (anything but get, list and watch) the replica `identity` has sent.
fn writes_of(sim: &SimCluster, identity: &str) -> u64 {
    let agent = replica_user_agent(identity);
    sim.requests()
        .iter()
        .filter(|((by, verb, _), _)| {
            *by == agent && !matches!(verb.as_str(), "get" | "list" | "watch")
        })
        .map(|(_, count)| count)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_killed_mid_scale_up_is_replaced_by_the_other_replica_within_the_lease() {
    let sim = manual_cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let (mut a, address_a) = replica(&kubeconfig, "replica-a").await;
    let mut client_a = connect_serving(&address_a).await;
    let (_b, address_b) = replica(&kubeconfig, "replica-b").await;
    let mut client_b = connect_serving(&address_b).await;
    assert_eq!(holder(&sim).await, (Some("replica-a".into()), Some(0)));

    // The replica that does not hold the shard forwards the driver's calls to the one
    // that does, and acts on nothing itself.
    let started = client_b
        .start(batched_start_request(APP, NS, 2, 1000))
        .await
        .expect("Start through replica-b");
    assert_eq!(answered_by(started.metadata()), Some("replica-a"));
    let scaled = client_b
        .set_total_expected(targets_request(APP, 8))
        .await
        .expect("SetTotalExpected through replica-b");
    assert_eq!(answered_by(scaled.metadata()), Some("replica-a"));
    client_a
        .get_status(status_request(APP))
        .await
        .expect("the owner runs it");
    let mut events = client_b
        .watch_executors(watch_request(APP, 0))
        .await
        .expect("WatchExecutors through replica-b")
        .into_inner();
    until_event(&mut events, "the owner's full state", synced).await;
    until_progress(
        "the first batch",
        async || executor_ids(&sim).await,
        |ids| ids.len() >= 2,
    )
    .await;
    let client = sim.try_client().expect("client");
    until("the registration with the target", || async {
        stored_registration(&client, NS, NS, APP)
            .await
            .is_some_and(|r| r.targets.get(&0) == Some(&8))
    })
    .await;
    assert_eq!(writes_of(&sim, "replica-b"), 0, "{:?}", sim.requests());
    a.start_kill().expect("SIGKILL");
    a.wait().await.expect("killed");
    let at_kill = executor_ids(&sim).await;
    // Until its lease has passed, the shard's holder is gone: calls are answered
    // UNAVAILABLE with a retry hint.
    let unavailable = client_b
        .get_status(status_request(APP))
        .await
        .expect_err("the owner is gone, its lease not yet passed");
    assert_eq!(unavailable.code(), Code::Unavailable, "{unavailable:?}");
    assert!(
        unavailable
            .metadata()
            .get(RETRY_PUSHBACK_METADATA)
            .is_some(),
        "{unavailable:?}"
    );

    // No driver call: the other replica takes the shard once the lease has passed and
    // finishes the scale-up from the registration.
    until_progress(
        "8 executors",
        async || executor_ids(&sim).await,
        |ids| ids.len() == 8,
    )
    .await;
    assert_eq!(holder(&sim).await, (Some("replica-b".into()), Some(1)));
    // The forwarded stream outlived its owner: replica-b watched again where the
    // application is now (itself), and the caller reads a fresh full state.
    until_event(&mut events, "a full state from the new owner", synced).await;
    let ids = executor_ids(&sim).await;
    assert!(at_kill.is_subset(&ids), "{at_kill:?} ⊄ {ids:?}");
    assert_eq!(ids.len(), 8, "no pod beyond the target: {ids:?}");
    let status = client_b
        .get_status(status_request(APP))
        .await
        .expect("the new owner answers");
    assert_eq!(
        answered_by(status.metadata()),
        None,
        "answered by replica-b itself"
    );
    assert_eq!(status.into_inner().profiles[0].target, 8);
    let stopped = client_b
        .stop(stop_request(APP))
        .await
        .expect("Stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_woken_after_a_takeover_writes_nothing() {
    let sim = manual_cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let (a, address_a) = replica(&kubeconfig, "replica-a").await;
    let mut client_a = connect_serving(&address_a).await;
    let (_b, address_b) = replica(&kubeconfig, "replica-b").await;
    let mut client_b = connect_serving(&address_b).await;

    // Mid scale-up on `a`: it has more to create when it is paused.
    client_a
        .start(batched_start_request(APP, NS, 2, 1000))
        .await
        .expect("Start");
    client_a
        .set_total_expected(targets_request(APP, 6))
        .await
        .expect("SetTotalExpected");
    until_progress(
        "the first batch",
        async || executor_ids(&sim).await,
        |ids| ids.len() >= 2,
    )
    .await;
    pause(&a);
    // What `a` reserved (a write of it still on the wire can only raise it).
    let recorded = recorded_last_id(&sim).await;

    until_progress(
        "replica-b holds the shard",
        async || holder(&sim).await,
        |(holder, _)| holder.as_deref() == Some("replica-b"),
    )
    .await;
    // Counted once the lease has passed: a request `a` had on the wire when it was paused
    // has arrived by now.
    let writes_at_takeover = writes_of(&sim, "replica-a");
    let at_pause = executor_ids(&sim).await;
    until_progress(
        "6 executors, through replica-b",
        async || executor_ids(&sim).await,
        |ids| ids.len() == 6,
    )
    .await;
    client_b
        .set_total_expected(targets_request(APP, 8))
        .await
        .expect("the new owner takes calls");
    until_progress(
        "8 executors",
        async || executor_ids(&sim).await,
        |ids| ids.len() == 8,
    )
    .await;

    wake(&a);
    // Woken, `a` finds its ownership lapsed, lets the application go and forwards its
    // calls to the new owner.
    until("replica-a let the application go", || {
        let mut client = client_a.clone();
        async move {
            client
                .get_status(status_request(APP))
                .await
                .is_ok_and(|status| answered_by(status.metadata()) == Some("replica-b"))
        }
    })
    .await;
    client_a
        .set_total_expected(targets_request(APP, 9))
        .await
        .expect("forwarded to the new owner");
    until_progress(
        "9 executors",
        async || executor_ids(&sim).await,
        |ids| ids.len() == 9,
    )
    .await;
    assert_eq!(
        writes_of(&sim, "replica-a"),
        writes_at_takeover,
        "the deposed owner wrote: {:?}",
        sim.requests()
    );
    let ids = executor_ids(&sim).await;
    assert_eq!(ids.len(), 9, "no pod beyond the target: {ids:?}");
    // The new owner's ids are above the block the old one reserved: none used twice.
    let new: BTreeSet<u64> = ids.difference(&at_pause).copied().collect();
    assert!(
        new.iter().all(|id| *id > recorded),
        "{new:?} above {recorded}"
    );
    assert!(
        sim.requests()
            .keys()
            .any(|(agent, _, _)| agent.starts_with(USER_AGENT)),
        "the replicas name themselves"
    );
}

fn synced(event: &spark_pod_allocator::proto::ExecutorEvent) -> bool {
    event.kind == spark_pod_allocator::proto::ExecutorEventKind::Synced as i32
}

/// The replica that answered a call forwarded to it (`None`: the one called answered).
fn answered_by(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    metadata
        .get(ANSWERED_BY_METADATA)
        .and_then(|value| value.to_str().ok())
}

/// The highest executor id the application's record holds (its ConfigMap: no driver pod).
async fn recorded_last_id(sim: &SimCluster) -> u64 {
    let config_maps: Api<ConfigMap> = Api::namespaced(sim.try_client().expect("client"), NS);
    let stored = config_maps
        .get(&IdRecord::config_map_name(APP))
        .await
        .expect("the id record's ConfigMap");
    stored.data.as_ref().expect("data")[LAST_EXECUTOR_ID_KEY]
        .parse()
        .expect("a number")
}
