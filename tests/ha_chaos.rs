//! A seeded chaos run: three replicas of the service binary on the simulator (four shards,
//! a 2 s lease), six applications in three namespaces, a driver per application calling
//! SetTotalExpected (random targets, up and down) and IsDeleted through a random live
//! replica as a Service would, while a schedule drawn from the seed kills replicas
//! (SIGKILL, then a restart under the same identity), pauses them (SIGSTOP for less or
//! more than the lease, then SIGCONT) and injects API faults (500s, 429s, latency, watches
//! closed). Checked, with the seed in every message:
//!
//! - no executor id names two pods, over the whole run (the simulator's history of every
//!   pod created);
//! - no application has more executor pods than a target it may be acting on (sampled all
//!   along; see [`WINDOW`]), and at the end each has exactly its last target;
//! - no replica writes for a shard whose Lease names another holder or none (every write
//!   the simulator received, judged against the Lease as stored when it arrived): a
//!   paused owner, once woken, writes nothing for the shard it lost;
//! - every driver call is answered or refused UNAVAILABLE (a call to a replica killed or
//!   paused under it excepted: that is what a driver sees of a replica gone), no attempt
//!   takes longer than [`CALL_BOUND`], and each call is answered within [`ANSWER_BOUND`].
//!
//! Seeds: `HA_CHAOS_SEEDS=1,2,3` runs those, `HA_CHAOS_RUNS=50` runs seeds 1 to 50; by
//! default [`DEFAULT_SEEDS`].
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spark_pod_allocator::ha::shards::ShardMap;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator_sim::{FaultSettings, SimCluster};
use test_kit::grpc::batched_start_request;
use test_kit::process::{pause, serve_replica, wake};
use test_kit::requests::*;
use test_kit::wait::progressing;
use tokio::process::Child;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const SHARDS: u32 = 4;
const IDENTITIES: [&str; 3] = ["chaos-0", "chaos-1", "chaos-2"];
const APPS_PER_NAMESPACE: usize = 2;
/// The seeds run when no variable names others: enough to exercise every kind of event,
/// few enough for the suite (about 25 s each on the 2-core build machine).
const DEFAULT_SEEDS: [u64; 2] = [1, 2];
/// Chaos events per seed.
const EVENTS: usize = 6;
/// Highest target a driver sends.
const MAX_TARGET: u64 = 8;
/// `serve_replica`'s lease.
const LEASE: Duration = Duration::from_millis(2000);
/// The longest a replica is paused.
const LONGEST_PAUSE: Duration = Duration::from_millis(4500);
/// A failover: the lease passing unrenewed, the new owner's takeover and resume, under
/// injected latency and errors (a Lease write refused is retried 250 ms later).
const FAILOVER: Duration = LEASE.saturating_add(Duration::from_millis(2000));
/// How long one attempt (one call to one replica) may take before it counts as hanging: a
/// call forwarded to an owner that is then paused waits for it (forwards have a 30 s
/// deadline), so up to the longest pause, then a failover.
const CALL_BOUND: Duration = LONGEST_PAUSE.saturating_add(FAILOVER);
/// How long a driver's call, retried on UNAVAILABLE as the Spark plugin does, may go
/// unanswered: the longest disturbance (a pause), then a failover, then a restart of the
/// replica (start-up).
const ANSWER_BOUND: Duration = Duration::from_secs(20);
/// The pod bound's window. An application's owner acts on a target the driver sent: the
/// last one it was told, or, after a takeover, the one its registration held (written each
/// round, so at most a round or two behind the driver while writes fail). Pods beyond a
/// lowered target go only once older than the idle timeout, at a round, and a new owner
/// acts only after a failover. So at any moment an application has at most the highest
/// target sent within the last longest pause plus a failover plus a few rounds, or the one
/// in force when that window began.
const WINDOW: Duration = CALL_BOUND.saturating_add(Duration::from_millis(1500));

/// A tiny deterministic generator (splitmix64): the schedule and each driver's choices
/// come from the seed.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in `lo..=hi` milliseconds.
    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn seeds() -> Vec<u64> {
    if let Ok(list) = std::env::var("HA_CHAOS_SEEDS") {
        return list
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("HA_CHAOS_SEEDS: {s:?} is not a seed"))
            })
            .collect();
    }
    if let Ok(runs) = std::env::var("HA_CHAOS_RUNS") {
        let runs: u64 = runs
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("HA_CHAOS_RUNS: {runs:?} is not a number"));
        return (1..=runs).collect();
    }
    DEFAULT_SEEDS.to_vec()
}

/// Three namespaces on three different shards (the first `chaos-<n>` of each).
fn namespaces() -> Vec<String> {
    let map = ShardMap::new(SHARDS).expect("4 shards");
    let mut per_shard = BTreeMap::new();
    for n in 0.. {
        let namespace = format!("chaos-{n}");
        per_shard
            .entry(map.shard_of(&namespace).0)
            .or_insert(namespace);
        if per_shard.len() == 3 {
            break;
        }
    }
    per_shard.into_values().collect()
}

/// (namespace, application) of every application.
fn applications() -> Vec<(String, String)> {
    namespaces()
        .into_iter()
        .flat_map(|ns| (0..APPS_PER_NAMESPACE).map(move |i| (ns.clone(), format!("app-{ns}-{i}"))))
        .collect()
}

/// One replica as the Service sees it: its address while it is up, and a count of the
/// disturbances that began or ended (a call that spans a change was disturbed).
struct Slot {
    child: Option<Child>,
    address: Option<String>,
    changes: u64,
}

/// What every task of a run shares: the replicas, the targets sent, what went wrong.
struct Run {
    seed: u64,
    slots: Mutex<Vec<Slot>>,
    /// Per application, every target sent (when it was sent), oldest first.
    targets: Mutex<BTreeMap<String, Vec<(Instant, u64)>>>,
    violations: Mutex<Vec<String>>,
    /// The longest attempt to a replica not disturbed under it (answered or refused
    /// UNAVAILABLE), and the longest call (attempts retried until answered).
    longest_attempt: Mutex<Duration>,
    longest_answer: Mutex<Duration>,
    /// Attempts by outcome: what the run exercised.
    calls: Mutex<BTreeMap<&'static str, u64>>,
    /// Per application, the most executor pods seen at once.
    most_live: Mutex<BTreeMap<String, u64>>,
}

impl Run {
    fn violation(&self, what: String) {
        eprintln!("seed {}: VIOLATION {what}", self.seed);
        self.violations.lock().expect("lock").push(what);
    }

    /// A replica that is up, as a Service picks one: (index, address, changes now).
    fn pick(&self, rng: &mut Rng) -> Option<(usize, String, u64)> {
        let slots = self.slots.lock().expect("lock");
        let up: Vec<usize> = (0..slots.len())
            .filter(|i| slots[*i].address.is_some())
            .collect();
        if up.is_empty() {
            return None;
        }
        let i = up[rng.below(up.len() as u64) as usize];
        Some((i, slots[i].address.clone()?, slots[i].changes))
    }

    fn changes(&self, i: usize) -> u64 {
        self.slots.lock().expect("lock")[i].changes
    }

    fn sent(&self, app: &str, target: u64) {
        self.targets
            .lock()
            .expect("lock")
            .entry(app.to_string())
            .or_default()
            .push((Instant::now(), target));
    }

    /// The most executors `app` may have now (see [`WINDOW`]).
    fn bound(&self, app: &str) -> u64 {
        let targets = self.targets.lock().expect("lock");
        let Some(sent) = targets.get(app) else {
            return 0;
        };
        let since = Instant::now().checked_sub(WINDOW);
        let in_window = sent
            .iter()
            .filter(|(at, _)| since.is_none_or(|s| *at >= s))
            .map(|(_, t)| *t);
        let before = sent
            .iter()
            .rev()
            .find(|(at, _)| since.is_some_and(|s| *at < s))
            .map(|(_, t)| *t);
        in_window.chain(before).max().unwrap_or(0)
    }
}

async fn client(address: &str) -> Option<ExecutorAllocatorClient<Channel>> {
    let endpoint = Endpoint::from_shared(format!("http://{address}"))
        .ok()?
        .connect_timeout(Duration::from_secs(1));
    let channel = tokio::time::timeout(Duration::from_secs(2), endpoint.connect())
        .await
        .ok()?
        .ok()?;
    Some(ExecutorAllocatorClient::new(channel))
}

/// Sends `call` through a random live replica until one answers it (UNAVAILABLE retried,
/// as the Spark plugin does); records as violations any other code from a replica that
/// was not disturbed under the call, an attempt beyond [`CALL_BOUND`], and a call
/// unanswered for [`ANSWER_BOUND`]. `None` if `stop` came first or it was never answered.
async fn send<T, F, Fut>(
    run: &Run,
    rng: &mut Rng,
    what: &str,
    stop: Option<&CancellationToken>,
    call: F,
) -> Option<T>
where
    F: Fn(ExecutorAllocatorClient<Channel>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let first = Instant::now();
    loop {
        if stop.is_some_and(CancellationToken::is_cancelled) {
            return None;
        }
        if first.elapsed() > ANSWER_BOUND {
            run.violation(format!("{what}: unanswered for {:?}", first.elapsed()));
            return None;
        }
        let Some((i, address, changes)) = run.pick(rng) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let started = Instant::now();
        let outcome = match client(&address).await {
            Some(client) => tokio::time::timeout(CALL_BOUND, call(client)).await,
            // Not reachable: a replica gone under the pick (or just restarted elsewhere).
            None => Ok(Err(tonic::Status::unavailable("not reachable"))),
        };
        let took = started.elapsed();
        let disturbed = run.changes(i) != changes;
        if !disturbed && took > FAILOVER {
            eprintln!(
                "seed {}: {what} through {}: an attempt took {took:?} ({:?})",
                run.seed,
                IDENTITIES[i],
                outcome
                    .as_ref()
                    .map(|o| o.as_ref().map(|_| ()).map_err(|s| s.code()))
            );
        }
        let kind = match &outcome {
            _ if disturbed => "disturbed",
            Ok(Ok(_)) => "answered",
            Ok(Err(status)) if status.code() == Code::Unavailable => "unavailable",
            Ok(Err(_)) => "other code",
            Err(_) => "hung",
        };
        *run.calls.lock().expect("lock").entry(kind).or_default() += 1;
        if !disturbed {
            note_longest(&run.longest_attempt, took);
        }
        match outcome {
            Ok(Ok(reply)) => {
                note_longest(&run.longest_answer, first.elapsed());
                return Some(reply.into_inner());
            }
            Ok(Err(status)) if status.code() == Code::Unavailable => {}
            _ if disturbed => {}
            Ok(Err(status)) => {
                run.violation(format!(
                    "{what} through {} ({address}): answered {status:?}",
                    IDENTITIES[i]
                ));
                return None;
            }
            Err(_) => {
                run.violation(format!(
                    "{what} through {} ({address}): no answer within {CALL_BOUND:?}",
                    IDENTITIES[i]
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn note_longest(longest: &Mutex<Duration>, took: Duration) {
    let mut longest = longest.lock().expect("lock");
    *longest = (*longest).max(took);
}

async fn set_target(
    run: &Run,
    rng: &mut Rng,
    app: &str,
    target: u64,
    stop: Option<&CancellationToken>,
) -> bool {
    run.sent(app, target);
    let n = u32::try_from(target).expect("a small target");
    send(
        run,
        rng,
        &format!("SetTotalExpected {app} {target}"),
        stop,
        |mut c| {
            let request = targets_request(app, n);
            async move { c.set_total_expected(request).await }
        },
    )
    .await
    .is_some()
}

/// A driver: random targets up and down, now and then IsDeleted of a random executor id,
/// until `stop`.
async fn drive(run: Arc<Run>, mut rng: Rng, app: String, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let target = rng.below(MAX_TARGET + 1);
        set_target(&run, &mut rng, &app, target, Some(&stop)).await;
        if rng.chance(40) {
            let id = (1 + rng.below(20)).to_string();
            send(
                &run,
                &mut rng,
                &format!("IsDeleted {app} {id}"),
                Some(&stop),
                |mut c| {
                    let request = is_deleted_request(&app, &id);
                    async move { c.is_deleted(request).await }
                },
            )
            .await;
        }
        tokio::select! {
            () = tokio::time::sleep(rng.millis(150, 700)) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// Each application's executor pods not being deleted, as stored now.
fn live_executors(sim: &SimCluster) -> BTreeMap<String, u64> {
    let mut live: BTreeMap<String, u64> = applications()
        .into_iter()
        .map(|(_, app)| (app, 0))
        .collect();
    for ns in namespaces() {
        for pod in sim.objects("pods", &ns) {
            let labels = &pod["metadata"]["labels"];
            if labels["spark-role"] != "executor" || !pod["metadata"]["deletionTimestamp"].is_null()
            {
                continue;
            }
            if let Some(n) = labels["spark-app-selector"]
                .as_str()
                .and_then(|app| live.get_mut(app))
            {
                *n += 1;
            }
        }
    }
    live
}

/// Samples every application's pods against its bound until `stop`.
async fn watch_bounds(run: Arc<Run>, sim: Arc<SimCluster>, stop: CancellationToken) {
    while !stop.is_cancelled() {
        for (app, live) in live_executors(&sim) {
            let bound = run.bound(&app);
            let mut most = run.most_live.lock().expect("lock");
            let most = most.entry(app.clone()).or_default();
            *most = (*most).max(live);
            if live > bound {
                run.violation(format!(
                    "{app}: {live} executor pods, beyond every target it may act on ({bound}; sent: {:?})",
                    run.targets.lock().expect("lock").get(&app).map(|t| t.iter().map(|(_, t)| *t).collect::<Vec<_>>())
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start_replica(run: &Run, kubeconfig: &Path, i: usize) {
    let identity = IDENTITIES[i];
    let (child, address) = serve_replica(
        BIN,
        kubeconfig,
        identity,
        &[("SPARK_POD_ALLOCATOR__HA__SHARDS", "4")],
    )
    .await;
    let mut slots = run.slots.lock().expect("lock");
    let slot = &mut slots[i];
    slot.child = Some(child);
    slot.address = Some(address);
    slot.changes += 1;
}

/// Takes replica `i` out of the Service's endpoints (before it is disturbed).
fn out_of_service(run: &Run, i: usize) {
    let mut slots = run.slots.lock().expect("lock");
    slots[i].address = None;
    slots[i].changes += 1;
}

fn random_faults(rng: &mut Rng) -> FaultSettings {
    FaultSettings {
        error_500_fraction: rng.below(16) as f64 / 100.0,
        error_429_fraction: rng.below(8) as f64 / 100.0,
        retry_after_seconds: 1,
        latency_ms: rng.below(40),
        watch_close_after_seconds: rng.chance(50).then(|| 1 + rng.below(3)),
        ..Default::default()
    }
}

/// One seed's run; returns what went wrong.
async fn chaos(seed: u64) -> Vec<String> {
    let begun = Instant::now();
    let mut rng = Rng(seed);
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = namespaces();
    settings.seed = seed;
    // Every change kept: the checks read the whole run from it.
    settings.history = 10_000_000;
    let sim = Arc::new(test_kit::sim::start(settings).await);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = test_kit::sim::kubeconfig_in(&sim, &dir);
    let run = Arc::new(Run {
        seed,
        slots: Mutex::new(
            IDENTITIES
                .iter()
                .map(|_| Slot {
                    child: None,
                    address: None,
                    changes: 0,
                })
                .collect(),
        ),
        targets: Mutex::new(BTreeMap::new()),
        violations: Mutex::new(Vec::new()),
        longest_attempt: Mutex::new(Duration::ZERO),
        longest_answer: Mutex::new(Duration::ZERO),
        calls: Mutex::new(BTreeMap::new()),
        most_live: Mutex::new(BTreeMap::new()),
    });
    for i in 0..IDENTITIES.len() {
        start_replica(&run, &kubeconfig, i).await;
    }
    for (ns, app) in applications() {
        let started = send(&run, &mut rng, &format!("Start {app}"), None, |mut c| {
            let mut request = batched_start_request(&app, &ns, 2, 200);
            if let Some(settings) = request.settings.as_mut() {
                settings.executor_idle_timeout_ms = Some(300);
            }
            async move { c.start(request).await }
        })
        .await;
        assert!(started.is_some(), "seed {seed}: Start {app}");
    }

    let stop = CancellationToken::new();
    let bounds = tokio::spawn(watch_bounds(run.clone(), sim.clone(), stop.clone()));
    let drivers: Vec<_> = applications()
        .into_iter()
        .enumerate()
        .map(|(n, (_, app))| {
            let rng = Rng(seed.wrapping_mul(1000).wrapping_add(n as u64));
            tokio::spawn(drive(run.clone(), rng, app, stop.clone()))
        })
        .collect();

    let mut schedule = Vec::new();
    for _ in 0..EVENTS {
        tokio::time::sleep(rng.millis(300, 1200)).await;
        let faults = rng.chance(40).then(|| random_faults(&mut rng));
        if let Some(faults) = &faults {
            sim.set_faults(faults.clone());
        }
        let i = rng.below(IDENTITIES.len() as u64) as usize;
        let identity = IDENTITIES[i];
        match rng.below(3) {
            0 => {
                let down = rng.millis(100, 1500);
                schedule.push(format!(
                    "kill -9 {identity}, restart after {down:?}, faults {faults:?}"
                ));
                out_of_service(&run, i);
                let child = run.slots.lock().expect("lock")[i].child.take();
                if let Some(mut child) = child {
                    child.start_kill().expect("SIGKILL");
                    child.wait().await.expect("killed");
                }
                tokio::time::sleep(down).await;
                start_replica(&run, &kubeconfig, i).await;
            }
            1 => {
                // Some shorter than the lease, some longer.
                let paused = if rng.chance(50) {
                    rng.millis(200, 1500)
                } else {
                    rng.millis(2500, LONGEST_PAUSE.as_millis() as u64)
                };
                schedule.push(format!(
                    "SIGSTOP {identity} for {paused:?}, faults {faults:?}"
                ));
                let address = run.slots.lock().expect("lock")[i].address.clone();
                out_of_service(&run, i);
                if let Some(child) = &run.slots.lock().expect("lock")[i].child {
                    pause(child);
                }
                tokio::time::sleep(paused).await;
                let mut slots = run.slots.lock().expect("lock");
                if let Some(child) = &slots[i].child {
                    wake(child);
                }
                slots[i].address = address;
                slots[i].changes += 1;
            }
            _ => {
                let faults = random_faults(&mut rng);
                let lasting = rng.millis(1000, 3000);
                schedule.push(format!("faults {faults:?} for {lasting:?}"));
                sim.set_faults(faults);
                tokio::time::sleep(lasting).await;
            }
        }
        sim.set_faults(FaultSettings::default());
    }
    eprintln!("seed {seed}: schedule {schedule:#?}");

    // Quiescence: faults off, every replica up and awake; each driver's last call.
    sim.set_faults(FaultSettings::default());
    stop.cancel();
    for driver in drivers {
        driver.await.expect("driver");
    }
    bounds.await.expect("bounds");
    let mut finals = BTreeMap::new();
    for (_, app) in applications() {
        let target = rng.below(MAX_TARGET + 1);
        if set_target(&run, &mut rng, &app, target, None).await {
            finals.insert(app, target);
        }
    }
    // Waited for while the pods move; a stall ends the wait, and the check below names it.
    let _ = progressing(
        async || live_executors(&sim),
        |now| (now.iter()).all(|(app, live)| finals.get(app).is_none_or(|t| t == live)),
    )
    .await;
    for (app, live) in live_executors(&sim) {
        let target = finals.get(&app).copied();
        if target != Some(live) {
            run.violation(format!(
                "{app}: {live} executor pods at the end, its last target {target:?}"
            ));
        }
    }

    let map = ShardMap::new(SHARDS).expect("4 shards");
    let names = namespaces();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let judged = test_kit::ha::writes_without_the_lease(&sim, &map, &IDENTITIES, &names);
    for wrong in judged.wrong {
        run.violation(format!("a write without the Lease: {wrong}"));
    }
    for reused in test_kit::ha::reused_executor_ids(&sim) {
        run.violation(format!("reused: {reused}"));
    }
    eprintln!(
        "seed {seed}: {:?}, {} writes of the replicas checked against the Leases, \
         most executors seen {:?}, calls {:?}, longest attempt {:?}, longest call {:?}",
        begun.elapsed(),
        judged.checked,
        run.most_live.lock().expect("lock"),
        run.calls.lock().expect("lock"),
        run.longest_attempt.lock().expect("lock"),
        run.longest_answer.lock().expect("lock"),
    );
    let violations = run.violations.lock().expect("lock").clone();
    violations
        .into_iter()
        .map(|v| format!("seed {seed}: {v} (schedule: {schedule:?})"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_kills_pauses_and_api_faults_keep_every_invariant() {
    let mut failed = Vec::new();
    for seed in seeds() {
        failed.extend(chaos(seed).await);
    }
    assert!(
        failed.is_empty(),
        "{} violations (rerun with HA_CHAOS_SEEDS=<seed>):\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// The run's record checks can fail: a write from a replica the Lease does not name, and
/// an executor id (and a pod name) created twice, are each reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_checks_report_a_write_without_the_lease_and_an_id_used_twice() {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::Api;
    use kube::api::{DeleteParams, PostParams};
    use spark_pod_allocator::k8s::{client_as, replica_user_agent};

    let ns = namespaces()[0].clone();
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = vec![ns.clone()];
    let sim = test_kit::sim::start(settings).await;
    let map = ShardMap::new(SHARDS).expect("4 shards");
    let lease: Lease = serde_json::from_value(serde_json::json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": map.shard_of(&ns).lease_name()},
        "spec": {"holderIdentity": "chaos-1"}
    }))
    .expect("a Lease");
    Api::<Lease>::namespaced(
        sim.try_client().expect("client"),
        test_kit::ha::LEASE_NAMESPACE,
    )
    .create(&PostParams::default(), &lease)
    .await
    .expect("the Lease");
    let as_replica = |identity: &str| {
        client_as(sim.kube_config(), &replica_user_agent(identity)).expect("client")
    };
    // chaos-0, not the holder: a pod, deleted, created again under the same id.
    let pods: Api<Pod> = Api::namespaced(as_replica("chaos-0"), &ns);
    let pod = test_kit::sim::executor_pod("app-1-exec-1", 1);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create");
    pods.delete("app-1-exec-1", &DeleteParams::default())
        .await
        .expect("delete");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create again");
    // chaos-1, the holder: its write is in order.
    let config_map: ConfigMap = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "record"}
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(as_replica("chaos-1"), &ns)
        .create(&PostParams::default(), &config_map)
        .await
        .expect("the holder's write");

    let judged = test_kit::ha::writes_without_the_lease(&sim, &map, &IDENTITIES, &[&ns]);
    assert_eq!(judged.checked, 4, "{judged:?}");
    assert_eq!(judged.wrong.len(), 3, "{judged:?}");
    assert!(
        judged.wrong.iter().all(|w| w.starts_with("chaos-0 sent")),
        "{judged:?}"
    );
    let reused = test_kit::ha::reused_executor_ids(&sim);
    assert_eq!(reused.len(), 2, "the id and the name: {reused:?}");
}
