//! Reclaim across a failover: three replicas of the service binary on one simulated cluster
//! (one shard, a 2 s lease) under a queue `gold` of 8 executors over team-a and team-b, 4
//! guaranteed each, with a reclaim deadline. A borrower in team-a holds all 8 (Running,
//! registered); an owner in team-b asks for 4, and the shard's holder asks the borrower's
//! driver for 4 back (RECLAIM on its stream, opened through another replica). One of them
//! exits and its pod goes; then the holder is lost before the deadline: killed (SIGKILL),
//! or paused (SIGSTOP) and woken once everything is over. Checked:
//!
//! - another replica takes the shard, resumes both applications from their registrations
//!   and asks again for the executors still borrowed, with a fresh deadline: the same ones
//!   (the newest registered), on the stream that outlived the lost holder and on one opened
//!   afterwards through a third replica;
//! - each pod goes when its executor exits, or once its new deadline passed (never before),
//!   and the owner's 4 are created;
//! - the queue never has more than 8 executor pods at once, and no executor id names two
//!   pods (the simulator's own history of every change, nothing between samples missed);
//! - every write of a replica arrived while the Lease named it; the paused holder, woken
//!   after its own deadline passed, sends not a single write (neither the deletes of its
//!   stale reclaim nor the owner's creates).
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use spark_pod_allocator::grpc::forward::ANSWERED_BY_METADATA;
use spark_pod_allocator::ha::shards::ShardMap;
use spark_pod_allocator::k8s::{RegistrationSettings, replica_user_agent};
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::proto::{self, ExecutorEventKind};
use spark_pod_allocator_sim::SimCluster;
use test_kit::grpc::{batched_start_request, quiet_cluster};
use test_kit::process::{connect_serving, pause, service_command, spawn_serving, wake};
use test_kit::requests::*;
use test_kit::service::stored_registration;
use test_kit::wait::{BOUND, until, until_progress};
use tokio::process::Child;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const IDENTITIES: [&str; 3] = ["replica-a", "replica-b", "replica-c"];
const NAMESPACES: [&str; 2] = ["team-a", "team-b"];
const BORROWER: &str = "borrower";
const OWNER: &str = "owner";
const QUEUE_MAX: usize = 8;
/// Long enough, on a loaded machine, for the test's steps before the holder is lost (an exit
/// seen and its pod deleted) and, after the takeover, for the stream forwarded to a paused
/// holder to notice it (pings unanswered: up to 10 s) and see the new asks before their
/// deadline; short enough to wait for the forced deletes.
const DEADLINE_MS: i64 = 20_000;
const LEASE: &str = "spark-pod-allocator-shard-0";

type Client = ExecutorAllocatorClient<Channel>;
type Events = tonic::Streaming<proto::ExecutorEvent>;

/// How the shard's holder is lost.
#[derive(Clone, Copy, PartialEq)]
enum Loss {
    Killed,
    Paused,
}

/// The configuration file: the queue, its guarantees and its reclaim deadline.
fn config_file(dir: &Path) -> String {
    let path = dir.join("config.yaml");
    let member = |ns: &str| {
        format!(
            "  - namespace: {ns}\n    weight: 1\n    guaranteed_executors: 4\n    max_executors: {QUEUE_MAX}\n"
        )
    };
    let text = format!(
        "budgets:\n- queue: gold\n  namespaces:\n{}{}  max_executors: {QUEUE_MAX}\n  reclaim_deadline_ms: {DEADLINE_MS}\n",
        member("team-a"),
        member("team-b"),
    );
    std::fs::write(&path, text).expect("config");
    path.to_string_lossy().into_owned()
}

/// A replica named `identity` with `config`: a 2 s lease, renewed every 250 ms, acted on
/// for 1 s after each renewal.
async fn replica(kubeconfig: &Path, config: &str, identity: &str) -> (Child, Client) {
    let mut command = service_command(
        BIN,
        &[
            "--log-format",
            "json",
            "--config",
            config,
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
    );
    command
        .env("SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig)
        .env(
            "SPARK_POD_ALLOCATOR__REGISTRATIONS__KEY_SECRET",
            RegistrationSettings::default().key_secret,
        )
        .env("SPARK_POD_ALLOCATOR__HA__IDENTITY", identity)
        .env("SPARK_POD_ALLOCATOR__HA__LEASE_DURATION_MS", "2000")
        .env("SPARK_POD_ALLOCATOR__HA__RENEW_DEADLINE_MS", "1000")
        .env("SPARK_POD_ALLOCATOR__HA__RETRY_PERIOD_MS", "250");
    let (child, address) = spawn_serving(command).await;
    (child, connect_serving(&address).await)
}

async fn holder(sim: &SimCluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(sim.try_client().expect("client"), "default");
    let lease = leases.get_opt(LEASE).await.expect("get the Lease");
    lease.and_then(|l| l.spec?.holder_identity)
}

async fn ids(sim: &SimCluster, namespace: &str, app: &str) -> BTreeSet<u64> {
    test_kit::sim::cluster_ids(sim, namespace, app).await
}

/// Sets the phase of executor `id`'s pod, as a kubelet would.
async fn set_phase(sim: &SimCluster, id: u64, phase: &str) {
    let api: Api<Pod> = Api::namespaced(sim.try_client().expect("client"), "team-a");
    api.patch_status(
        &format!("{BORROWER}-exec-{id}"),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": phase}})),
    )
    .await
    .expect("status patch");
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

/// The most executor pods of the queue alive at once over the simulator's history.
fn most_executors_at_once(sim: &SimCluster) -> usize {
    let history = sim.history();
    assert!(history.complete, "the simulator's history dropped changes");
    let (mut live, mut most) = (0usize, 0usize);
    for change in &history.changes {
        let executor = change.object["metadata"]["labels"]["spark-role"] == "executor";
        if change.resource != "pods" || !executor || !NAMESPACES.contains(&&*change.namespace) {
            continue;
        }
        match change.kind {
            "ADDED" => live += 1,
            "DELETED" => live = live.saturating_sub(1),
            _ => {}
        }
        most = most.max(live);
    }
    most
}

/// The next event of `stream`, within [`BOUND`] (a failover and a round in between).
async fn next(stream: &mut Events) -> proto::ExecutorEvent {
    tokio::time::timeout(BOUND, stream.message())
        .await
        .expect("an event")
        .expect("stream status OK")
        .expect("the stream goes on")
}

/// Reads `stream` until a full state has ended (`SYNCED`).
async fn past_synced(stream: &mut Events) {
    while next(stream).await.kind() != ExecutorEventKind::Synced {}
}

/// RECLAIM events of `stream` with a deadline after `after` (others skipped) until `n`
/// executors were asked: executor id → deadline (ms since the epoch).
async fn reclaims_after(stream: &mut Events, after: i64, n: usize) -> Vec<(u64, i64)> {
    let mut got: Vec<(u64, i64)> = Vec::new();
    while got.len() < n {
        let event = next(stream).await;
        if event.kind() != ExecutorEventKind::Reclaim {
            continue;
        }
        let id = event.executor.expect("executor").executor_id;
        let reclaim = event.reclaim.expect("reclaim");
        assert_eq!(reclaim.budget, "queue/gold");
        if reclaim.deadline_ms > after && !got.iter().any(|(seen, _)| *seen == id as u64) {
            got.push((id as u64, reclaim.deadline_ms));
        }
    }
    got.sort_unstable();
    got
}

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock");
    i64::try_from(since.as_millis()).expect("ms")
}

/// Waits until the pods of `forced` are gone; a listing answered before `deadline` must
/// still show every one of them (nothing forced before its deadline).
async fn forced_at_deadline(sim: &SimCluster, forced: &BTreeSet<u64>, deadline: i64) {
    until_progress(
        "the ignored executors deleted at their deadline",
        async || {
            let ids = ids(sim, "team-a", BORROWER).await;
            let left: BTreeSet<u64> = forced.intersection(&ids).copied().collect();
            if now_ms() < deadline {
                assert_eq!(&left, forced, "deleted before the deadline {deadline}");
            }
            left
        },
        BTreeSet::is_empty,
    )
    .await;
}

/// The replica that answered a call (`None`: the one called).
fn answered_by(metadata: &tonic::metadata::MetadataMap) -> Option<String> {
    (metadata.get(ANSWERED_BY_METADATA))
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

async fn reclaim_survives_the_loss_of_the_holder(loss: Loss) {
    let mut settings = quiet_cluster();
    settings.history = 1_000_000;
    let sim = test_kit::sim::start(settings).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let config = config_file(dir.path());
    let (mut a, client_a) = replica(&kubeconfig, &config, IDENTITIES[0]).await;
    until_progress(
        "replica-a holds the shard",
        async || holder(&sim).await,
        |h| h.as_deref() == Some(IDENTITIES[0]),
    )
    .await;
    let (_b, client_b) = replica(&kubeconfig, &config, IDENTITIES[1]).await;
    let (_c, client_c) = replica(&kubeconfig, &config, IDENTITIES[2]).await;

    // The borrower fills the queue; its 8 run and are registered with the driver.
    let mut driver = client_b.clone();
    driver
        .start(batched_start_request(BORROWER, "team-a", 8, 1000))
        .await
        .expect("Start the borrower");
    driver
        .set_total_expected(targets_request(BORROWER, 8))
        .await
        .expect("SetTotalExpected");
    until_progress(
        "the borrower's 8 pods",
        async || ids(&sim, "team-a", BORROWER).await,
        |ids| ids.len() == QUEUE_MAX,
    )
    .await;
    for id in 1..=8 {
        set_phase(&sim, id, "Running").await;
    }
    driver
        .update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
            application_id: BORROWER.into(),
            executor_ids: (1..=8).map(|id: u64| id.to_string()).collect(),
            running_tasks: Default::default(),
        })
        .await
        .expect("UpdateRegisteredExecutors");
    let client = sim.try_client().expect("client");
    until("the registered executors in the registration", async || {
        stored_registration(&client, "default", "team-a", BORROWER)
            .await
            .is_some_and(|r| r.registered.len() == QUEUE_MAX)
    })
    .await;
    let mut stream = driver
        .watch_executors(watch_request(BORROWER, 0))
        .await
        .expect("WatchExecutors through replica-b")
        .into_inner();
    past_synced(&mut stream).await;

    // The owner arrives: replica-a asks back the 4 newest (no running tasks said).
    driver
        .start(batched_start_request(OWNER, "team-b", 8, 1000))
        .await
        .expect("Start the owner");
    driver
        .set_total_expected(targets_request(OWNER, 4))
        .await
        .expect("SetTotalExpected");
    let first = reclaims_after(&mut stream, 0, 4).await;
    assert_eq!(
        first.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        [5, 6, 7, 8],
        "{first:?}"
    );
    let old_deadline = first.iter().map(|(_, d)| *d).max().expect("asked");
    // Executor 5 exits: its pod goes (graceful), the others wait for their deadline.
    set_phase(&sim, 5, "Succeeded").await;
    until_progress(
        "executor 5's pod deleted",
        async || ids(&sim, "team-a", BORROWER).await,
        |ids| !ids.contains(&5),
    )
    .await;
    let asked_left: BTreeSet<u64> = [6, 7, 8].into();
    let borrower = ids(&sim, "team-a", BORROWER).await;
    assert!(
        asked_left.is_subset(&borrower),
        "the step before the loss outlasted the deadline: {borrower:?}"
    );

    // The holder is lost before the deadline.
    match loss {
        Loss::Killed => {
            a.start_kill().expect("SIGKILL");
            a.wait().await.expect("killed");
        }
        Loss::Paused => pause(&a),
    }
    let new_holder = until_progress(
        "another replica holds the shard",
        async || holder(&sim).await,
        |h| h.is_some() && h.as_deref() != Some(IDENTITIES[0]),
    )
    .await
    .expect("a holder");
    // Counted once the lease has passed: what replica-a had on the wire has arrived.
    let writes_at_takeover = writes_of(&sim, IDENTITIES[0]);

    // The new holder asks again for what is still borrowed, with a fresh deadline; the
    // stream through replica-b outlived replica-a.
    let again = reclaims_after(&mut stream, old_deadline, 3).await;
    let again_ids: BTreeSet<u64> = again.iter().map(|(id, _)| *id).collect();
    assert_eq!(again_ids, asked_left, "{again:?}");
    let new_deadline = again.iter().map(|(_, d)| *d).min().expect("asked");
    // A stream opened now through the third replica gets them after its full state.
    let third = if new_holder == IDENTITIES[2] {
        client_b.clone()
    } else {
        client_c.clone()
    };
    let mut reopened = third
        .clone()
        .watch_executors(watch_request(BORROWER, 0))
        .await
        .expect("WatchExecutors")
        .into_inner();
    past_synced(&mut reopened).await;
    let reasked = reclaims_after(&mut reopened, old_deadline, 3).await;
    assert_eq!(reasked, again, "the same asks on a reopened stream");

    // Executor 6 exits (graceful); 7 and 8 are ignored by the driver and forced.
    set_phase(&sim, 6, "Succeeded").await;
    until_progress(
        "executor 6's pod deleted",
        async || ids(&sim, "team-a", BORROWER).await,
        |ids| !ids.contains(&6),
    )
    .await;
    forced_at_deadline(&sim, &[7, 8].into(), new_deadline).await;
    until_progress(
        "the owner's 4 executors",
        async || ids(&sim, "team-b", OWNER).await,
        |ids| ids.len() == 4,
    )
    .await;
    assert_eq!(ids(&sim, "team-a", BORROWER).await, [1, 2, 3, 4].into());

    if loss == Loss::Paused {
        // Woken after its own deadline passed, replica-a finds its ownership lapsed and
        // lets the applications go: it neither deletes its stale asks nor creates.
        assert!(now_ms() > old_deadline);
        wake(&a);
        for app in [BORROWER, OWNER] {
            until(&format!("replica-a let {app} go"), async || {
                let mut client = client_a.clone();
                client
                    .get_status(status_request(app))
                    .await
                    .is_ok_and(|s| answered_by(s.metadata()).as_deref() == Some(&*new_holder))
            })
            .await;
        }
        let status = client_a
            .clone()
            .get_status(status_request(OWNER))
            .await
            .expect("forwarded")
            .into_inner();
        assert_eq!(status.profiles[0].target, 4);
        assert_eq!(
            writes_of(&sim, IDENTITIES[0]),
            writes_at_takeover,
            "the deposed holder wrote: {:?}",
            sim.requests()
        );
        assert_eq!(ids(&sim, "team-b", OWNER).await.len(), 4);
        assert_eq!(ids(&sim, "team-a", BORROWER).await, [1, 2, 3, 4].into());
    }

    assert_eq!(
        most_executors_at_once(&sim),
        QUEUE_MAX,
        "never more than the queue's max_executors at once"
    );
    let reused = test_kit::ha::reused_executor_ids(&sim);
    assert!(reused.is_empty(), "{reused:#?}");
    let judged =
        test_kit::ha::writes_without_the_lease(&sim, &ShardMap::single(), &IDENTITIES, &NAMESPACES);
    assert!(judged.checked > 0, "no write judged");
    assert!(judged.wrong.is_empty(), "{:#?}", judged.wrong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_under_way_survives_the_holder_killed_before_its_deadline() {
    reclaim_survives_the_loss_of_the_holder(Loss::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_mid_reclaim_neither_deletes_nor_creates_once_woken() {
    reclaim_survives_the_loss_of_the_holder(Loss::Paused).await;
}
