//! The service's fixed cost: at steady state (every application at its target, its
//! executors Running) the only requests it sends are the namespace's periodic LIST, every
//! resync interval of its clock whatever the number of applications; and the replicas that
//! do not hold a shard follow its Lease by a watch, so the Lease requests at steady state
//! are the owners' renewals alone. During a scale-up each application adds its creates and
//! Start's reads, nothing more. A test binary of its own: its 500 applications would
//! load the machine under the wall-clock tests of others.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use spark_pod_allocator::allocator::ExecutorState;
use spark_pod_allocator::app::{Applications, ManualClock};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::ha::HaSettings;
use spark_pod_allocator::k8s::leases::spawn_keepers;
use spark_pod_allocator::k8s::watch::{RESYNC_PAGE_SIZE, RESYNC_PAGE_SIZE_MIN};
use spark_pod_allocator::lifecycle::Initialize;
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::runtime::Builder;
use spark_pod_allocator_sim::SimCluster;
use test_kit::service::{id, start, start_application as request, targets};
use test_kit::wait::until;
use tokio_util::sync::CancellationToken;

const NS: &str = "default";

fn applications(sim: &SimCluster, clock: &ManualClock, settings: Settings) -> Applications {
    test_kit::service::applications(sim.try_client().expect("sim client"), clock, settings)
}

/// Periodic LISTs the service ended, from its metrics: the watch takes the end of one in
/// (and times the next from its clock) as it records its duration.
fn periodic_lists_ended(metrics: &Metrics) -> u64 {
    (metrics.encode().lines())
        .find_map(|line| line.strip_prefix("spark_pod_allocator_resync_duration_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Executors per application.
const EXECUTORS: u32 = 2;

/// Minutes of the service's clock measured at steady state.
const MINUTES: u64 = 20;

/// Applications started at once.
const STARTS_AT_ONCE: usize = 16;

/// The requests of one periodic LIST of `pods` executor pods and no driver pod: the
/// executors' pages (one per 1% of the pods, at least `RESYNC_PAGE_SIZE_MIN` and at most
/// `RESYNC_PAGE_SIZE` a page), and none of driver pods (no application names one).
fn periodic_list_requests(pods: u32) -> u64 {
    let size = (pods / 100).clamp(RESYNC_PAGE_SIZE_MIN, RESYNC_PAGE_SIZE);
    u64::from(pods.div_ceil(size).max(1))
}

/// Every request the service sent (pods, registrations, quotas: by every client) while its
/// clock moved `MINUTES` at steady state with `count` applications of one namespace, by
/// (verb, resource); each periodic LIST due meanwhile counted whole. The Lease renewals
/// aside: they follow the real clock, not the service's (the test below counts them).
async fn steady_requests(count: usize) -> BTreeMap<(String, String), u64> {
    let mut settings = test_kit::sim::manual_settings();
    settings.kubelet.mode = spark_pod_allocator_sim::KubeletMode::Auto;
    settings.namespaces = vec![NS.to_string()];
    let sim = test_kit::sim::start(settings).await;
    let clock = ManualClock::starting_now();
    // One namespace of them all: its watches and periodic LIST are the same for 1 or 500.
    let mut service = Settings::default();
    service.tenants.max_applications_per_namespace = count;
    service.tenants.max_applications_per_identity = count;
    let resync = service.resync_interval();
    let metrics = Metrics::default();
    let apps = Builder::new(
        sim.try_client().expect("sim client"),
        Arc::new(clock.clone()),
    )
    .with_settings(&service)
    .with_metrics(metrics.clone())
    .build()
    .into_applications();
    let names: Vec<String> = (0..count).map(|k| format!("app-{k}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(STARTS_AT_ONCE, async |app| {
            start(&apps, request(app, NS)).await;
            test_kit::service::set_targets_and_round(&apps, app, targets(EXECUTORS)).await;
            until(&format!("{app}'s executors Running"), async || {
                let snapshot = apps.snapshot(&id(app)).await.expect("snapshot");
                let running = (snapshot.executors.values())
                    .filter(|e| e.state == ExecutorState::Running)
                    .count();
                running == EXECUTORS as usize
            })
            .await;
        })
        .await;
    let counted = || -> BTreeMap<(String, String), u64> {
        let mut by_verb = BTreeMap::new();
        // Every client's: the test sends none meanwhile.
        for ((_, verb, resource), n) in sim.requests() {
            if resource != "leases" {
                *by_verb.entry((verb, resource)).or_default() += n;
            }
        }
        by_verb
    };
    let before = counted();
    let lists = |counts: &BTreeMap<(String, String), u64>| {
        counts
            .get(&("list".to_string(), "pods".to_string()))
            .copied()
            .unwrap_or(0)
    };
    // The clock has not moved since the namespace's watch began: a periodic LIST is due
    // each resync interval, the next one an interval after the last one ended.
    let per_listing = periodic_list_requests(EXECUTORS * count as u32);
    let steps = resync.as_secs() / 10;
    for listing in 1..=MINUTES * 60 / resync.as_secs() {
        // In steps of 10 s, as time passes for a service: every timer due fires in turn.
        for _ in 0..steps {
            clock.advance(Duration::from_secs(10));
            tokio::task::yield_now().await;
        }
        until(&format!("periodic LIST {listing}"), async || {
            lists(&counted()) >= lists(&before) + listing * per_listing
        })
        .await;
        // Its last page answered is not yet its end taken in: the clock moves on only once
        // the watch has timed the next LIST from it.
        until(&format!("periodic LIST {listing} ended"), async || {
            periodic_lists_ended(&metrics) >= listing
        })
        .await;
    }
    let mut after = counted();
    for (key, n) in before {
        if let Some(now) = after.get_mut(&key) {
            *now -= n;
        }
    }
    after.retain(|_, n| *n > 0);
    after
}

#[tokio::test]
async fn the_steady_state_requests_are_the_periodic_list_alone_whatever_the_applications() {
    let one = steady_requests(1).await;
    let many = steady_requests(500).await;
    eprintln!("steady state, {MINUTES} min: 1 application {one:?}; 500 applications {many:?}");
    let listings = MINUTES * 60 / Settings::default().resync_interval().as_secs();
    let periodic_list = |pods: u32| {
        BTreeMap::from([(
            ("list".to_string(), "pods".to_string()),
            listings * periodic_list_requests(pods),
        )])
    };
    // Nothing but the periodic LIST of the namespace, a safety net every 10 minutes
    // whatever the applications: no request per application. Its pages follow the
    // executor pods listed (1,000 here: 10 pages, and one of the drivers).
    assert_eq!(one, periodic_list(EXECUTORS), "1 application");
    assert_eq!(many, periodic_list(EXECUTORS * 500), "500 applications");
}

/// Shards and replicas, as the chart deploys them.
const SHARDS: u32 = 6;
const REPLICAS: usize = 3;

/// The Lease requests of the simulator so far, by verb.
fn lease_requests(sim: &SimCluster) -> BTreeMap<String, u64> {
    let mut by_verb = BTreeMap::new();
    for ((_, verb, resource), n) in sim.requests() {
        if resource == "leases" {
            *by_verb.entry(verb).or_default() += n;
        }
    }
    by_verb
}

#[tokio::test]
async fn the_lease_requests_at_steady_state_are_the_owners_renewals_whatever_the_replicas() {
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let cancel = CancellationToken::new();
    // Short timings, so that a few seconds hold many turns: an owner renews every 750 ms,
    // the others decide every 500 ms.
    let settings = |identity: &str| HaSettings {
        identity: Some(identity.to_string()),
        shards: SHARDS,
        lease_duration_ms: 4000,
        renew_deadline_ms: 2000,
        retry_period_ms: 500,
        rebalance: false,
        ..HaSettings::default()
    };
    let renewal = settings("any").timing().renewal();
    let mut replicas = Vec::new();
    for k in 0..REPLICAS {
        let initialize = Initialize::new();
        replicas.push(spawn_keepers(
            &client,
            NS,
            &settings(&format!("replica-{k}")),
            BTreeMap::new(),
            &cancel,
            &initialize,
        ));
        initialize.initialized().await;
    }
    // Each keeper starts its watch once its first listing was taken in: from then on its
    // watch stands in for reads.
    let watches = (REPLICAS as u64) * u64::from(SHARDS);
    until("every keeper follows its Lease by a watch", async || {
        lease_requests(&sim).get("watch").copied().unwrap_or(0) >= watches
    })
    .await;
    let held = || -> usize {
        let ownerships = replicas.iter().map(|(ownerships, _)| ownerships);
        ownerships
            .flat_map(|o| o.map().shards().map(move |shard| o.owner(shard)))
            .filter(|owner| *owner == spark_pod_allocator::ha::ShardOwner::Here)
            .count()
    };
    until("every shard held", async || held() == SHARDS as usize).await;

    let before = lease_requests(&sim);
    let began = std::time::Instant::now();
    // The window measured: long enough for six turns of every replica.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = lease_requests(&sim);
    let elapsed = began.elapsed();
    let sent = |verb: &str| after.get(verb).unwrap_or(&0) - before.get(verb).unwrap_or(&0);
    let total: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
    let per_minute = |n: u64| n as f64 * 60.0 / elapsed.as_secs_f64();
    eprintln!(
        "{REPLICAS} replicas, {SHARDS} shards, {elapsed:?}: {total} Lease requests \
         ({:.0} a minute), {} get, {} update; before {before:?}, after {after:?}",
        per_minute(total),
        sent("get"),
        sent("update"),
    );
    // Owners' renewals: one per shard each renewal period (fewer on a slow machine). A
    // refused write (a renewal answered past its deadline, the shard taken over) is read
    // again: a few reads at most.
    let renewals = u64::from(SHARDS) * (elapsed.as_millis() / renewal.as_millis() + 1) as u64;
    assert!(
        sent("get") <= u64::from(SHARDS),
        "the replicas that do not hold a shard read its Lease: {} reads in {elapsed:?}",
        sent("get")
    );
    assert!(
        total <= renewals + u64::from(SHARDS),
        "{total} Lease requests in {elapsed:?}, beyond {renewals} renewals: {after:?}"
    );
    cancel.cancel();
    for (_, tasks) in replicas {
        for task in tasks {
            task.await.expect("keeper");
        }
    }
}

/// The requests (by verb and resource, Leases aside) of a service that starts `count`
/// applications in one namespace, each with its executor stream open, and scales each up
/// to `EXECUTORS` Running.
async fn scale_up_requests(count: usize) -> BTreeMap<(String, String), u64> {
    let mut settings = test_kit::sim::manual_settings();
    settings.kubelet.mode = spark_pod_allocator_sim::KubeletMode::Auto;
    settings.namespaces = vec![NS.to_string()];
    let sim = test_kit::sim::start(settings).await;
    let clock = ManualClock::starting_now();
    let apps = applications(&sim, &clock, Settings::default());
    let mut streams = Vec::new();
    for k in 0..count {
        let app = format!("app-{k}");
        start(&apps, request(&app, NS)).await;
        // As the plugin does: the stream first, then the targets.
        let mut stream = (apps.watch_executors(&id(&app), 0, None).await).expect("stream");
        let first = stream.next().await.expect("the stream's full state");
        assert_eq!(first.kind, spark_pod_allocator::app::EventKind::Synced);
        streams.push(stream);
        test_kit::service::set_targets_and_round(&apps, &app, targets(EXECUTORS)).await;
        until(&format!("{app}'s executors Running"), async || {
            let snapshot = apps.snapshot(&id(&app)).await.expect("snapshot");
            let running = (snapshot.executors.values())
                .filter(|e| e.state == ExecutorState::Running)
                .count();
            running == EXECUTORS as usize
        })
        .await;
    }
    let mut by_verb = BTreeMap::new();
    for ((_, verb, resource), n) in sim.requests() {
        if resource != "leases" {
            *by_verb.entry((verb, resource)).or_default() += n;
        }
    }
    by_verb
}

/// What each application adds during its Start and scale-up: its executors' creates, and
/// no more reads than Start's own (one LIST of its executor pods, one read of its id
/// record; not the namespace's, which an application already there had read). A new application's first executor stream needs no LIST (it has no pods), and
/// the id record Start found missing is created without being read again.
#[tokio::test]
async fn an_application_reads_its_pods_and_id_record_once_while_it_scales_up() {
    let one = scale_up_requests(1).await;
    let two = scale_up_requests(2).await;
    let added = |verb: &str, resource: &str| {
        let key = (verb.to_string(), resource.to_string());
        two.get(&key).copied().unwrap_or(0) - one.get(&key).copied().unwrap_or(0)
    };
    eprintln!("scale-up: 1 application {one:?}; 2 applications {two:?}");
    assert_eq!(added("create", "pods"), u64::from(EXECUTORS));
    assert_eq!(added("list", "pods"), 1, "Start's LIST only: {two:?}");
    assert_eq!(added("get", "configmaps"), 1, "Start's read only: {two:?}");
    assert_eq!(
        added("create", "configmaps"),
        2,
        "its id record and registration"
    );
    // The namespace's watches: its executor pods' only, as no application names a driver
    // pod (each kube watcher's first LIST, then its WATCH).
    assert_eq!(
        one.get(&("watch".into(), "pods".into())),
        Some(&1),
        "{one:?}"
    );
    assert_eq!(added("watch", "pods"), 0, "{two:?}");
    // The namespace is read by the first application's Start only: the second finds its
    // pod watch running and listed.
    assert_eq!(added("get", "namespaces"), 0, "{two:?}");
    assert_eq!(
        one.get(&("get".into(), "namespaces".into())),
        Some(&1),
        "{one:?}"
    );
}
