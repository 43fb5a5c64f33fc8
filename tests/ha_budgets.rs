//! Three replicas in one process on one simulated cluster (three shards, a 2 s lease), each
//! holding one shard, and a queue budget over three namespaces that would each be in a
//! shard of their own: the namespaces of a queue share the queue's shard, so one replica
//! holds every application of the queue and its ledger is exact. Each namespace's
//! application asks for more than the whole queue; the queue never has more than its
//! `max_executors` executor pods, counted over the simulator's whole history (every pod
//! added and deleted, nothing between two samples missed).
use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use spark_pod_allocator::allocator::Timestamp;
use spark_pod_allocator::app::budgets::{BudgetEntry, QueueNamespace};
use spark_pod_allocator::app::{AppId, ManualClock};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::ha::HaSettings;
use spark_pod_allocator::ha::shards::ShardMap;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::Service;
use spark_pod_allocator_sim::SimCluster;
use test_kit::grpc::{batched_start_request, quiet_cluster};
use test_kit::requests::*;
use test_kit::wait::{eventually, until, until_progress};
use tonic::transport::Channel;

const SHARDS: u32 = 3;
const MAX_EXECUTORS: usize = 6;
const TARGET: u32 = 10;

/// Three namespaces in three different shards by their names alone.
fn namespaces() -> Vec<String> {
    let map = ShardMap::new(SHARDS).expect("3 shards");
    let mut seen = BTreeSet::new();
    (0..100)
        .map(|i| format!("queued-{i}"))
        .filter(|ns| seen.insert(map.shard_of(ns)))
        .take(SHARDS as usize)
        .collect()
}

/// A replica named `identity` of three shards under `budgets`.
async fn replica(
    sim: &SimCluster,
    clock: &ManualClock,
    identity: &str,
    budgets: &[BudgetEntry],
) -> Service {
    let mut config = Settings::default();
    config.ha = HaSettings {
        identity: Some(identity.into()),
        shards: SHARDS,
        lease_duration_ms: 2000,
        renew_deadline_ms: 1000,
        retry_period_ms: 250,
        ..HaSettings::default()
    };
    config.budgets = budgets.to_vec();
    config.budget_policy().expect("budgets");
    test_kit::grpc::serve(sim, clock, ServeSettings::default(), config, None).await
}

/// Each shard's holder.
async fn holders(sim: &SimCluster) -> Vec<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(sim.try_client().expect("client"), "default");
    let mut holders = Vec::new();
    for shard in 0..SHARDS {
        let lease = leases
            .get_opt(&format!("spark-pod-allocator-shard-{shard}"))
            .await
            .expect("get the Lease");
        holders.push(lease.and_then(|l| l.spec?.holder_identity));
    }
    holders
}

/// The most executor pods of `namespaces` alive at once over the simulator's history.
fn most_executors_at_once(sim: &SimCluster, namespaces: &[String]) -> usize {
    let history = sim.history();
    assert!(history.complete, "the simulator's history dropped changes");
    let (mut live, mut most) = (0usize, 0usize);
    for change in &history.changes {
        let executor = change.object["metadata"]["labels"]["spark-role"] == "executor";
        if change.resource != "pods" || !executor || !namespaces.contains(&change.namespace) {
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

/// `Some` once answered; `None` for UNAVAILABLE (asked again); any other error fails.
fn answered<T>(reply: Result<T, tonic::Status>) -> Option<T> {
    match reply {
        Ok(reply) => Some(reply),
        Err(status) if status.code() == tonic::Code::Unavailable => None,
        Err(status) => panic!("answered {status:?}"),
    }
}

fn app_id(app: &str) -> AppId {
    AppId::parse(app).expect("app id")
}

/// The replica that runs `app`.
async fn owner<'a>(replicas: &'a [Service], app: &str) -> &'a Service {
    for replica in replicas {
        if replica.applications().rounds(&app_id(app)).await.is_ok() {
            return replica;
        }
    }
    panic!("no replica runs {app}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_over_namespaces_of_three_replicas_never_exceeds_its_budget() {
    let namespaces = namespaces();
    let mut settings = quiet_cluster();
    settings.namespaces.extend(namespaces.iter().cloned());
    settings.history = 1_000_000;
    let sim = SimCluster::start(settings)
        .await
        .expect("simulated cluster");
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let budgets = vec![BudgetEntry {
        name: None,
        namespace: None,
        queue: Some("gold".into()),
        namespaces: namespaces
            .iter()
            .cloned()
            .map(QueueNamespace::Name)
            .collect(),
        max_executors: MAX_EXECUTORS as u64,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms: None,
    }];
    let mut replicas = Vec::new();
    for identity in ["replica-a", "replica-b", "replica-c"] {
        replicas.push(replica(&sim, &clock, identity, &budgets).await);
    }
    // Each replica holds one shard: by their names alone the three namespaces would be
    // owned by three replicas, each counting only its own application.
    until_progress(
        "each replica holds one shard",
        async || holders(&sim).await,
        |holders| {
            let held: BTreeSet<&Option<String>> = holders.iter().collect();
            held.len() == SHARDS as usize && !held.contains(&None)
        },
    )
    .await;

    let mut client = test_kit::grpc::connect(replicas[0].address()).await.1;
    let apps: Vec<(String, String)> = (namespaces.iter().enumerate())
        .map(|(i, ns)| (ns.clone(), format!("app-{i}")))
        .collect();
    // A replica that has not yet seen a shard change hands answers UNAVAILABLE, and the
    // driver asks again.
    for (ns, app) in &apps {
        eventually(&format!("Start {app}"), async || {
            let request = batched_start_request(app, ns, TARGET, 1000);
            answered(client.clone().start(request).await)
        })
        .await;
    }
    for (_, app) in &apps {
        eventually(&format!("SetTotalExpected {app}"), async || {
            let request = targets_request(app.as_str(), TARGET);
            answered(client.clone().set_total_expected(request).await)
        })
        .await;
    }

    // Rounds until every application has what its budget lets it have and is held for
    // the rest (its pods seen, nothing in flight).
    let settled = async |client: &mut ExecutorAllocatorClient<Channel>| {
        for (ns, app) in &apps {
            let Some(status) = answered(client.get_status(status_request(app.as_str())).await)
            else {
                return false;
            };
            let status = status.into_inner();
            let profile = &status.profiles[0];
            let pods = test_kit::sim::cluster_ids(&sim, ns, app).await.len() as u32;
            if profile.held == 0
                || profile.held + pods != TARGET
                || profile.running + profile.pending != pods
            {
                return false;
            }
        }
        true
    };
    let mut rounds = 0;
    while !settled(&mut client).await {
        rounds += 1;
        assert!(rounds <= 20, "the applications did not settle in 20 rounds");
        let mut before = Vec::new();
        for (_, app) in &apps {
            let owner = owner(&replicas, app).await;
            before.push(
                owner
                    .applications()
                    .rounds(&app_id(app))
                    .await
                    .expect("rounds"),
            );
        }
        clock.advance(Duration::from_secs(1));
        for ((_, app), rounds) in apps.iter().zip(before) {
            let owner = owner(&replicas, app).await;
            until(&format!("a round of {app}"), async || {
                owner
                    .applications()
                    .rounds(&app_id(app))
                    .await
                    .expect("rounds")
                    > rounds
            })
            .await;
        }
    }
    assert_eq!(
        most_executors_at_once(&sim, &namespaces),
        MAX_EXECUTORS,
        "never more than the queue's max_executors at once, and all of it used"
    );
    let mut now = 0;
    for (ns, app) in &apps {
        now += test_kit::sim::cluster_ids(&sim, ns, app).await.len();
    }
    assert_eq!(now, MAX_EXECUTORS, "the queue's whole budget is used");
    let owners: BTreeSet<String> = {
        let mut owners = BTreeSet::new();
        for (_, app) in &apps {
            owners.insert(owner(&replicas, app).await.address().to_string());
        }
        owners
    };
    assert_eq!(owners.len(), 1, "one replica holds the whole queue");
}
