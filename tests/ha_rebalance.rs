//! Rebalancing on the simulator: replica A alone takes all four shards (a 2 s lease), then
//! replica B joins and the shards move to it one at a time by the drain handshake in the
//! Leases (B's request, A's drain and release, B's acquisition) until each holds two. The
//! applications of the moved shards go on: their executors stay, a target sent after the
//! move reaches the new owner, and no executor id is handed out twice. A driver calling
//! all along (through either replica) is answered or told UNAVAILABLE, never anything
//! else, and no application goes unanswered for as long as a failover would take (a whole
//! lease without a renewal). Then three replicas: two joining at once end one shard apart,
//! and when one of them leaves, the two left take its shards and end two and two.
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use spark_pod_allocator::grpc::forward::ANSWERED_BY_METADATA;
use spark_pod_allocator::ha::shards::ShardMap;
use spark_pod_allocator::k8s::leases::REQUESTED_BY_ANNOTATION;
use spark_pod_allocator::proto::ExecutorEventKind;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator_sim::SimCluster;
use test_kit::grpc::batched_start_request;
use test_kit::process::{connect_serving, serve_replica, terminate};
use test_kit::requests::*;
use test_kit::wait::until_progress;
use tokio::process::Child;
use tokio_util::sync::CancellationToken;
use tonic::Code;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const SHARDS: u32 = 4;
/// `serve_replica`'s lease: no failover can take less (a takeover waits a whole lease
/// from the last renewal it saw).
const LEASE: Duration = Duration::from_millis(2000);

async fn replica(kubeconfig: &Path, identity: &str) -> (Child, String) {
    serve_replica(
        BIN,
        kubeconfig,
        identity,
        &[("SPARK_POD_ALLOCATOR__HA__SHARDS", "4")],
    )
    .await
}

/// One namespace per shard (the first `ns-<n>` that maps to it), each with one application.
fn applications() -> Vec<(String, String, u32)> {
    let map = ShardMap::new(SHARDS).expect("4 shards");
    let mut per_shard = BTreeMap::new();
    for n in 0.. {
        let namespace = format!("ns-{n}");
        per_shard
            .entry(map.shard_of(&namespace).0)
            .or_insert(namespace);
        if per_shard.len() == SHARDS as usize {
            break;
        }
    }
    per_shard
        .into_iter()
        .map(|(shard, ns)| (ns.clone(), format!("app-{ns}"), shard))
        .collect()
}

/// Per shard, its Lease's holder and whether it carries a request.
async fn leases(sim: &SimCluster) -> Vec<(Option<String>, bool, i32)> {
    let api: Api<Lease> = Api::namespaced(sim.try_client().expect("client"), "default");
    let mut all = Vec::new();
    for shard in 0..SHARDS {
        let lease = api
            .get_opt(&format!("spark-pod-allocator-shard-{shard}"))
            .await
            .expect("get the Lease");
        let requested = lease
            .as_ref()
            .and_then(|l| l.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(REQUESTED_BY_ANNOTATION));
        let spec = lease.and_then(|l| l.spec).unwrap_or_default();
        let holder = spec.holder_identity.filter(|h| !h.is_empty());
        all.push((holder, requested, spec.lease_transitions.unwrap_or(0)));
    }
    all
}

async fn executors(sim: &SimCluster) -> BTreeMap<String, BTreeSet<u64>> {
    let client = sim.try_client().expect("client");
    let mut all = BTreeMap::new();
    for (ns, app, _) in applications() {
        all.insert(
            app.clone(),
            test_kit::sim::executor_ids(&client, &ns, &app).await,
        );
    }
    all
}

/// What moves while the replicas work: the Leases and every application's executors. A
/// wait fails once none of it has moved for a while, not after a fixed time.
async fn state(
    sim: &SimCluster,
) -> (
    Vec<(Option<String>, bool, i32)>,
    BTreeMap<String, BTreeSet<u64>>,
) {
    (leases(sim).await, executors(sim).await)
}

async fn all_at(sim: &SimCluster, target: usize) {
    until_progress(
        &format!("every application at {target}"),
        async || state(sim).await,
        |(_, executors)| executors.values().all(|ids| ids.len() >= target),
    )
    .await;
    for (app, ids) in executors(sim).await {
        assert_eq!(
            ids.len(),
            target,
            "{app}: no pod beyond the target: {ids:?}"
        );
    }
}

/// Sends `call` to `address` until it is answered (UNAVAILABLE is retried, as the driver's
/// plugin does, while the Leases move); returns who answered.
async fn send<T, F, Fut>(sim: &SimCluster, address: &str, what: &str, call: F) -> String
where
    F: Fn(ExecutorAllocatorClient<tonic::transport::Channel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let client = connect_serving(address).await;
    let answer = async || match call(client.clone()).await {
        Ok(reply) => Some(
            reply
                .metadata()
                .get(ANSWERED_BY_METADATA)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("called")
                .to_string(),
        ),
        Err(status) if status.code() == Code::Unavailable => None,
        Err(status) => panic!("{what}: answered {status:?}"),
    };
    let answered = until_progress(
        &format!("{what} answered"),
        async || match answer().await {
            Some(answer) => (Some(answer), None),
            None => (None, Some(leases(sim).await)),
        },
        |(answer, _)| answer.is_some(),
    )
    .await;
    answered.0.expect("answered")
}

async fn scale(sim: &SimCluster, address: &str, app: &str, target: u32) -> String {
    send(sim, address, &format!("SetTotalExpected {app}"), |mut c| {
        let request = targets_request(app, target);
        async move { c.set_total_expected(request).await }
    })
    .await
}

/// What a driver calling all along saw: the longest it went unanswered (from a call told
/// UNAVAILABLE to the next answered one), and how many calls were answered and refused.
#[derive(Debug, Default)]
struct Stalls {
    longest: Duration,
    answered: usize,
    unavailable: usize,
}

/// Sends `app`'s target to `address` every 50 ms, as a driver whose plugin retries
/// UNAVAILABLE, until `stop` and then until a call is answered: any other error fails the
/// test, and so does an application unanswered for 30 s.
async fn probe(address: String, app: String, target: u32, stop: CancellationToken) -> Stalls {
    let client = connect_serving(&address).await;
    let mut stalls = Stalls::default();
    let mut refused_since: Option<tokio::time::Instant> = None;
    while !(stop.is_cancelled() && stalls.answered > 0 && refused_since.is_none()) {
        let sent = tokio::time::Instant::now();
        match client
            .clone()
            .set_total_expected(targets_request(&app, target))
            .await
        {
            Ok(_) => {
                stalls.answered += 1;
                if let Some(since) = refused_since.take() {
                    stalls.longest = stalls.longest.max(since.elapsed());
                }
            }
            Err(status) if status.code() == Code::Unavailable => {
                stalls.unavailable += 1;
                let since = *refused_since.get_or_insert(sent);
                assert!(
                    since.elapsed() < Duration::from_secs(30),
                    "{app} through {address}: unanswered since {:?}: {stalls:?}",
                    since.elapsed()
                );
            }
            Err(status) => panic!("{app} through {address}: answered {status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stalls
}

/// A driver calling every application all along, through `addresses` in turn.
fn probes(
    addresses: &[&String],
    target: u32,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<Stalls>> {
    applications()
        .into_iter()
        .enumerate()
        .map(|(n, (_, app, _))| {
            let through = addresses[n % addresses.len()].clone();
            tokio::spawn(probe(through, app, target, stop.clone()))
        })
        .collect()
}

/// Stops the probes once each is answered; no application went unanswered as long as a
/// failover takes.
async fn stalls_bounded(
    probes: Vec<tokio::task::JoinHandle<Stalls>>,
    stop: &CancellationToken,
    when: &str,
) {
    stop.cancel();
    for (probe, (_, app, _)) in probes.into_iter().zip(applications()) {
        let stalls = probe.await.expect("the probe");
        eprintln!("{app} {when}: {stalls:?}");
        // A move stalls an application for its drain and the new owner's resume: less
        // than the lease a failover waits before it may even start.
        assert!(
            stalls.longest < LEASE,
            "{app} went unanswered longer than a failover {when}: {stalls:?}"
        );
    }
}

/// Waits until the shards are spread over `members` at most one apart, none in flight,
/// checking all along that at most one is asked for and, unless a replica is `leaving`
/// (it releases all of its shards at once), at most one is in flight (asked for, or
/// without a holder).
async fn balanced_over(sim: &SimCluster, members: &[&str], leaving: bool) {
    let in_flight = |now: &[(Option<String>, bool, i32)]| {
        now.iter().filter(|(h, r, _)| h.is_none() || *r).count()
    };
    let observe = async || {
        let now = leases(sim).await;
        let requested = now.iter().filter(|(_, r, _)| *r).count();
        assert!(requested <= 1, "one request at a time: {now:?}");
        assert!(
            leaving || in_flight(&now) <= 1,
            "one move at a time: {now:?}"
        );
        now
    };
    let balanced = |now: &Vec<(Option<String>, bool, i32)>| {
        let loads: Vec<usize> = members
            .iter()
            .map(|m| {
                now.iter()
                    .filter(|(h, _, _)| h.as_deref() == Some(*m))
                    .count()
            })
            .collect();
        let (max, min) = (loads.iter().max().copied(), loads.iter().min().copied());
        in_flight(now) == 0
            && loads.iter().sum::<usize>() == SHARDS as usize
            && max.zip(min).is_some_and(|(x, n)| x - n <= 1)
    };
    until_progress(
        &format!("the shards balanced over {members:?}"),
        observe,
        balanced,
    )
    .await;
}

/// Every executor of `before` still there, and every new one above its application's
/// highest id then (no id handed out twice).
fn kept_and_not_reused(
    before: &BTreeMap<String, BTreeSet<u64>>,
    after: &BTreeMap<String, BTreeSet<u64>>,
) {
    for (app, ids) in after {
        assert!(
            before[app].is_subset(ids),
            "{app}: {:?} ⊄ {ids:?}",
            before[app]
        );
        let old_max = before[app].iter().max().copied().unwrap_or(0);
        assert!(
            ids.difference(&before[app]).all(|id| *id > old_max),
            "{app}: no id handed out twice: {ids:?} after {:?}",
            before[app]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_joining_at_once_then_one_leaving_the_shards_end_balanced_and_the_applications_go_on()
 {
    let (sim, _dir, kubeconfig, _a, address_a) = every_application_at_3_on_replica_a().await;
    let before = executors(&sim).await;

    // Two join at once: their requests may race for one Lease; one move at a time still.
    let stop = CancellationToken::new();
    let (joined_b, joined_c) = tokio::join!(
        replica(&kubeconfig, "replica-b"),
        replica(&kubeconfig, "replica-c")
    );
    let ((mut b, address_b), (_c, address_c)) = (joined_b, joined_c);
    let probing = probes(&[&address_a, &address_b, &address_c], 4, &stop);
    balanced_over(&sim, &["replica-a", "replica-b", "replica-c"], false).await;
    stalls_bounded(probing, &stop, "while b and c joined").await;
    all_at(&sim, 4).await;
    kept_and_not_reused(&before, &executors(&sim).await);

    // b leaves (SIGTERM: it drains and releases its shards); a and c take them and end
    // two and two. The driver calls a and c.
    let before = executors(&sim).await;
    let stop = CancellationToken::new();
    let probing = probes(&[&address_a, &address_c], 4, &stop);
    terminate(&b);
    b.wait().await.expect("b stopped");
    balanced_over(&sim, &["replica-a", "replica-c"], true).await;
    stalls_bounded(probing, &stop, "while b left").await;
    for (n, (_, app, _)) in applications().into_iter().enumerate() {
        let through = if n % 2 == 0 { &address_a } else { &address_c };
        scale(&sim, through, &app, 5).await;
    }
    all_at(&sim, 5).await;
    kept_and_not_reused(&before, &executors(&sim).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_joining_takes_half_the_shards_one_at_a_time_and_the_applications_go_on() {
    let (sim, _dir, kubeconfig, _a, address_a) = every_application_at_3_on_replica_a().await;
    let before = executors(&sim).await;
    // A WatchExecutors stream of every application, on replica-a, which runs them all now.
    let mut streams = Vec::new();
    for (_, app, _) in applications() {
        let mut stream = connect_serving(&address_a)
            .await
            .watch_executors(watch_request(&app, 0))
            .await
            .expect("WatchExecutors on replica-a")
            .into_inner();
        test_kit::grpc::until_event(&mut stream, "the full state", |e| {
            e.kind == ExecutorEventKind::Synced as i32
        })
        .await;
        streams.push((app, stream));
    }

    let (_b, address_b) = replica(&kubeconfig, "replica-b").await;
    // Targets sent while the shards move (to the old owner, or forwarded to the new one)
    // are not lost: a draining actor writes its registration's last change.
    let stop = CancellationToken::new();
    let probing = probes(&[&address_a, &address_b], 4, &stop);
    // One shard in flight at a time: at most one Lease asked for or without a holder.
    let in_flight = |now: &[(Option<String>, bool, i32)]| {
        now.iter().filter(|(h, r, _)| h.is_none() || *r).count()
    };
    until_progress(
        "each replica holds two shards",
        async || {
            let now = leases(&sim).await;
            assert!(in_flight(&now) <= 1, "one move at a time: {now:?}");
            now
        },
        |now| {
            let of = |who: &str| {
                now.iter()
                    .filter(|(h, _, _)| h.as_deref() == Some(who))
                    .count()
            };
            of("replica-a") == 2 && of("replica-b") == 2 && in_flight(now) == 0
        },
    )
    .await;
    stalls_bounded(probing, &stop, "while the shards moved").await;
    // Two moves, each one change of hands.
    let transitions: i32 = leases(&sim).await.iter().map(|(_, _, t)| t).sum();
    assert_eq!(transitions, 2);

    // Every target reached, every executor running before the move still there.
    all_at(&sim, 4).await;
    let moved = executors(&sim).await;
    for (app, ids) in &moved {
        assert!(
            before[app].is_subset(ids),
            "{app}: {:?} ⊄ {ids:?}",
            before[app]
        );
    }

    // A target sent after the move, through either replica, reaches the new owner.
    let holders = leases(&sim).await;
    for (n, (_, app, shard)) in applications().into_iter().enumerate() {
        let owner = holders[shard as usize].0.clone().expect("held");
        let through = if n % 2 == 0 { &address_a } else { &address_b };
        let owner_address = if owner == "replica-a" {
            &address_a
        } else {
            &address_b
        };
        let answered = scale(&sim, through, &app, 5).await;
        // Called on the owner, it answers itself; else the owner answers the forward.
        assert!(
            answered == owner || (answered == "called" && through == owner_address),
            "{app} (shard {shard}, held by {owner}) answered by {answered}"
        );
    }
    all_at(&sim, 5).await;
    let after = executors(&sim).await;
    // Each stream went on across its application's move: replica-a watched again where
    // the application went, and the caller reads the executor its owner created for the
    // target sent after the move.
    for (app, mut stream) in streams {
        let newest = after[&app].iter().max().copied().unwrap_or(0);
        test_kit::grpc::until_event(&mut stream, &format!("{app}'s executor {newest}"), |e| {
            e.executor
                .as_ref()
                .is_some_and(|x| u64::try_from(x.executor_id) == Ok(newest))
        })
        .await;
    }
    for (app, ids) in &after {
        assert!(
            before[app].is_subset(ids),
            "{app}: {:?} ⊄ {ids:?}",
            before[app]
        );
        let old_max = before[app].iter().max().copied().unwrap_or(0);
        let new: Vec<_> = ids.difference(&before[app]).collect();
        assert!(
            new.iter().all(|id| **id > old_max),
            "{app}: no id handed out twice: {ids:?} after {:?}",
            before[app]
        );
    }
    // Balanced layouts stay: no move since.
    let now = leases(&sim).await;
    assert_eq!(now.iter().map(|(_, _, t)| t).sum::<i32>(), 2, "{now:?}");
}

/// The cluster of these tests with replica-a holding every shard and every application
/// started on it and Running 3 executors; the temporary directory holds the kubeconfig.
async fn every_application_at_3_on_replica_a()
-> (SimCluster, tempfile::TempDir, PathBuf, Child, String) {
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = applications().into_iter().map(|(ns, _, _)| ns).collect();
    let sim = test_kit::sim::start(settings).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let (a, address_a) = replica(&kubeconfig, "replica-a").await;
    until_progress(
        "replica-a holds every shard",
        async || leases(&sim).await,
        |now| {
            now.iter()
                .all(|(h, _, _)| h.as_deref() == Some("replica-a"))
        },
    )
    .await;
    for (ns, app, _) in applications() {
        send(&sim, &address_a, &format!("Start {app}"), |mut c| {
            let request = batched_start_request(&app, &ns, 2, 200);
            async move { c.start(request).await }
        })
        .await;
        scale(&sim, &address_a, &app, 3).await;
    }
    all_at(&sim, 3).await;
    (sim, dir, kubeconfig, a, address_a)
}
