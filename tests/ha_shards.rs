//! Three replicas of the service binary on one simulated cluster, four shards (a 2 s
//! lease), twenty applications in five namespaces, every driver call sent to one address
//! as a Service would: the owner of every shard killed mid scale-up, and a rolling restart
//! of every replica under load. The invariants: every scale-up completes, no pod beyond a
//! target, every executor running at a failure is still there, no executor id handed out
//! twice, and every call is answered or refused UNAVAILABLE.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use spark_pod_allocator::grpc::forward::ANSWERED_BY_METADATA;
use spark_pod_allocator::k8s::IdRecord;
use spark_pod_allocator::k8s::id_record::LAST_EXECUTOR_ID_KEY;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator_sim::SimCluster;
use test_kit::grpc::batched_start_request;
use test_kit::process::{connect_serving, serve_replica, terminate};
use test_kit::requests::*;
use test_kit::wait::until_progress;
use tokio::process::Child;
use tonic::Code;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const SHARDS: u32 = 4;
const NAMESPACES: [&str; 5] = ["ns-1", "ns-2", "ns-3", "ns-4", "ns-5"];

/// A replica named `identity` of an installation of four shards.
async fn replica(kubeconfig: &Path, identity: &str) -> (Child, String) {
    serve_replica(
        BIN,
        kubeconfig,
        identity,
        &[("SPARK_POD_ALLOCATOR__HA__SHARDS", "4")],
    )
    .await
}

async fn cluster() -> SimCluster {
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = NAMESPACES.iter().map(|ns| ns.to_string()).collect();
    test_kit::sim::start(settings).await
}

/// The applications: four per namespace.
fn applications() -> Vec<(&'static str, String)> {
    NAMESPACES
        .iter()
        .flat_map(|ns| (0..4).map(move |i| (*ns, format!("app-{ns}-{i}"))))
        .collect()
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

/// Every application's executor ids, as the API server has them.
async fn executors(sim: &SimCluster) -> BTreeMap<String, BTreeSet<u64>> {
    let client = sim.try_client().expect("client");
    let mut all = BTreeMap::new();
    for (ns, app) in applications() {
        let ids = test_kit::sim::executor_ids(&client, ns, &app).await;
        all.insert(app, ids);
    }
    all
}

/// What moves while the replicas work: each shard's holder and every application's
/// executors. A wait fails once none of it has moved for a while, not after a fixed time.
async fn state(sim: &SimCluster) -> (Vec<Option<String>>, BTreeMap<String, BTreeSet<u64>>) {
    (holders(sim).await, executors(sim).await)
}

/// Every application's Stop removed all of its `live` executor pods. The pods are the
/// measure: a Stop retried after a shard move (UNAVAILABLE) answers only what its last try
/// removed, the first try's deletes being already under way, so the answers' sum
/// (`reported`) may fall short of `live`, never above it.
async fn stopped(sim: &SimCluster, reported: i64, live: i64) {
    until_progress(
        "every executor pod deleted",
        async || executors(sim).await,
        |executors| executors.values().all(BTreeSet::is_empty),
    )
    .await;
    assert!(
        (1..=live).contains(&reported),
        "Stop answered {reported} pods deleted, of {live}"
    );
}

/// Every application at `target` executors, none beyond it.
async fn all_at(sim: &SimCluster, target: u32) {
    let target = usize::try_from(target).expect("a small target");
    until_progress(
        &format!("every application at {target} executors"),
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

/// Every application's id record is at or above its highest executor id: whoever owns it
/// next hands out ids above every one used (none twice).
async fn ids_recorded(sim: &SimCluster) {
    let client = sim.try_client().expect("client");
    let all = executors(sim).await;
    for (ns, app) in applications() {
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let record = config_maps
            .get(&IdRecord::config_map_name(&app))
            .await
            .expect("the id record's ConfigMap");
        let recorded: u64 = record.data.as_ref().expect("data")[LAST_EXECUTOR_ID_KEY]
            .parse()
            .expect("a number");
        let highest = all[&app].iter().max().copied().unwrap_or(0);
        assert!(
            recorded >= highest,
            "{app}: recorded {recorded} < {highest}"
        );
    }
}

/// `before` (the executors at a failure) are all still there, in `after`.
#[track_caller]
fn untouched(before: &BTreeMap<String, BTreeSet<u64>>, after: &BTreeMap<String, BTreeSet<u64>>) {
    for (app, ids) in before {
        assert!(
            ids.is_subset(&after[app]),
            "{app}: {ids:?} ⊄ {:?}",
            after[app]
        );
    }
}

/// The driver calls of a Service in front of the replicas: each call goes to the first
/// replica that takes it; a replica that cannot be reached, or answers UNAVAILABLE, is
/// skipped (a refused connection is what a driver sees of a replica gone). Any other code
/// fails the test, and so does a call unanswered while nothing moves on the cluster.
struct Drivers<'a> {
    sim: &'a SimCluster,
    addresses: Vec<String>,
}

impl Drivers<'_> {
    async fn client(address: &str) -> Option<ExecutorAllocatorClient<Channel>> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}")).ok()?;
        let channel = tokio::time::timeout(std::time::Duration::from_secs(2), endpoint.connect())
            .await
            .ok()?
            .ok()?;
        Some(ExecutorAllocatorClient::new(channel))
    }

    /// Sends `call` until a replica answers it; returns who answered (the forward's owner,
    /// else the replica called).
    async fn send<T, F, Fut>(&self, what: &str, call: F) -> String
    where
        F: Fn(ExecutorAllocatorClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let answered = until_progress(
            &format!("{what} answered by a replica"),
            async || match self.answer(what, &call).await {
                Some(answer) => (Some(answer), None),
                None => (None, Some(state(self.sim).await)),
            },
            |(answer, _)| answer.is_some(),
        )
        .await;
        answered.0.expect("answered")
    }

    /// `call` sent to each replica in turn: who answered, `None` if none did.
    async fn answer<T, F, Fut>(&self, what: &str, call: &F) -> Option<String>
    where
        F: Fn(ExecutorAllocatorClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        for address in &self.addresses {
            let Some(client) = Self::client(address).await else {
                continue;
            };
            match call(client).await {
                Ok(reply) => {
                    return Some(
                        reply
                            .metadata()
                            .get(ANSWERED_BY_METADATA)
                            .and_then(|v| v.to_str().ok())
                            .map_or_else(|| address.clone(), str::to_string),
                    );
                }
                Err(status) if status.code() == Code::Unavailable => {}
                Err(status) => panic!("{what}: answered {status:?}"),
            }
        }
        None
    }

    async fn start_all(&self, target: u32) {
        for (ns, app) in applications() {
            self.send(&format!("Start {app}"), |mut c| {
                let request = batched_start_request(&app, ns, 2, 500);
                async move { c.start(request).await }
            })
            .await;
            self.scale(&app, target).await;
        }
    }

    async fn scale(&self, app: &str, target: u32) -> String {
        self.send(&format!("SetTotalExpected {app}"), |mut c| {
            let request = targets_request(app, target);
            async move { c.set_total_expected(request).await }
        })
        .await
    }

    async fn stop_all(&self) -> i64 {
        let mut deleted = 0;
        for (_, app) in applications() {
            let stopped = std::sync::Mutex::new(0);
            self.send(&format!("Stop {app}"), |mut c| {
                let request = stop_request(&app);
                let stopped = &stopped;
                async move {
                    let reply = c.stop(request).await?;
                    *stopped.lock().expect("lock") = reply.get_ref().deleted_pods;
                    Ok(reply)
                }
            })
            .await;
            deleted += i64::from(stopped.into_inner().expect("lock"));
        }
        deleted
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_of_every_shard_killed_mid_scale_up_its_applications_finish_on_the_others() {
    let sim = cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let (mut a, _) = replica(&kubeconfig, "replica-a").await;
    until_progress(
        "replica-a holds every shard",
        async || holders(&sim).await,
        |holders| holders.iter().all(|h| h.as_deref() == Some("replica-a")),
    )
    .await;
    let (_b, address_b) = replica(&kubeconfig, "replica-b").await;
    let (_c, address_c) = replica(&kubeconfig, "replica-c").await;
    connect_serving(&address_b).await;
    connect_serving(&address_c).await;
    // The driver's one address is a replica that holds nothing now.
    let drivers = Drivers {
        sim: &sim,
        addresses: vec![address_c.clone()],
    };
    drivers.start_all(6).await;
    until_progress(
        "the first batches",
        async || state(&sim).await,
        |(_, executors)| executors.values().all(|ids| !ids.is_empty()),
    )
    .await;
    a.start_kill().expect("SIGKILL");
    a.wait().await.expect("killed");
    let at_kill = executors(&sim).await;

    all_at(&sim, 6).await;
    untouched(&at_kill, &executors(&sim).await);
    ids_recorded(&sim).await;
    // Held by the others (a rebalancing move between them may be under way).
    until_progress(
        "every shard held by replica-b or replica-c",
        async || holders(&sim).await,
        |holders| (holders.iter()).all(|h| matches!(h.as_deref(), Some("replica-b" | "replica-c"))),
    )
    .await;
    // Every application answers through the one address, by whichever replica owns it.
    let mut answered = BTreeSet::new();
    for (_, app) in applications() {
        answered.insert(drivers.scale(&app, 6).await);
    }
    assert!(!answered.contains("replica-a"), "{answered:?}");
    stopped(&sim, drivers.stop_all().await, 20 * 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_replica_under_load_loses_nothing() {
    let sim = cluster().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let identities = ["replica-a", "replica-b", "replica-c"];
    let mut replicas = Vec::new();
    for identity in identities {
        replicas.push(replica(&kubeconfig, identity).await);
    }
    let drivers = Drivers {
        sim: &sim,
        addresses: replicas
            .iter()
            .map(|(_, address)| address.clone())
            .collect(),
    };
    drivers.start_all(4).await;
    let mut target = 4;
    for (n, identity) in identities.iter().enumerate() {
        // Under load: every application grows while a replica restarts.
        target += 2;
        for (_, app) in applications() {
            drivers.scale(&app, target).await;
        }
        let before = executors(&sim).await;
        let (mut old, _) = replicas.remove(0);
        terminate(&old);
        old.wait().await.expect("stopped");
        let restarted = replica(&kubeconfig, identity).await;
        untouched(&before, &executors(&sim).await);
        replicas.push(restarted);
        let drivers_now = Drivers {
            sim: &sim,
            addresses: replicas
                .iter()
                .map(|(_, address)| address.clone())
                .collect(),
        };
        all_at(&sim, target).await;
        ids_recorded(&sim).await;
        // Every shard held (a rebalancing move may be under way: its Lease is held again
        // in a moment).
        until_progress(
            &format!("every shard held after restart {n}"),
            async || holders(&sim).await,
            |holders| holders.iter().all(Option::is_some),
        )
        .await;
        // The restarted replica answers too (itself, or through a forward; UNAVAILABLE,
        // retried, while the application's shard moves).
        let restarted_address = &replicas[replicas.len() - 1].1;
        connect_serving(restarted_address).await;
        let restarted_only = Drivers {
            sim: &sim,
            addresses: vec![restarted_address.clone()],
        };
        restarted_only
            .send("GetStatus through the restarted replica", |mut c| {
                let request = status_request(applications()[0].1.clone());
                async move { c.get_status(request).await }
            })
            .await;
        drop(drivers_now);
    }
    let drivers = Drivers {
        sim: &sim,
        addresses: replicas
            .iter()
            .map(|(_, address)| address.clone())
            .collect(),
    };
    stopped(&sim, drivers.stop_all().await, 20 * i64::from(target)).await;
}
