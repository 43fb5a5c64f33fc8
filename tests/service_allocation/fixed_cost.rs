//! The service's cost in requests: at steady state (every application at its target, its
//! executors Running) the requests it sends per minute of its clock do not grow with the
//! number of applications; during a scale-up each application adds its creates and
//! Start's reads, nothing more.
use super::*;
use spark_pod_allocator::allocator::ExecutorState;

/// Executors per application.
const EXECUTORS: u32 = 2;

/// Minutes of the service's clock measured at steady state.
const MINUTES: u64 = 20;

/// The requests the service sent (Lease requests aside: they follow the real clock, one
/// renewal per retry period whatever the applications) while its clock moved `MINUTES`
/// at steady state with `count` applications of one namespace, by (verb, resource).
async fn steady_requests(count: usize) -> BTreeMap<(String, String), u64> {
    let mut settings = test_kit::sim::manual_settings();
    settings.kubelet.mode = spark_pod_allocator_sim::KubeletMode::Auto;
    settings.namespaces = vec![NS.to_string()];
    let sim = test_kit::sim::start(settings).await;
    let clock = ManualClock::starting_now();
    let apps = applications(&sim, &clock, ServiceOptions::default());
    let names: Vec<String> = (0..count).map(|k| format!("app-{k}")).collect();
    for app in &names {
        start(&apps, request(app, NS)).await;
        test_kit::service::set_targets_and_round(&apps, app, targets(EXECUTORS)).await;
    }
    for app in &names {
        until(&format!("{app}'s executors Running"), async || {
            let snapshot = apps.snapshot(&id(app)).await.expect("snapshot");
            let running = (snapshot.executors.values())
                .filter(|e| e.state == ExecutorState::Running)
                .count();
            running == EXECUTORS as usize
        })
        .await;
    }
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
    // In steps of 10 s, as time passes for a service: every timer due fires in turn.
    for _ in 0..MINUTES * 6 {
        clock.advance(Duration::from_secs(10));
        tokio::task::yield_now().await;
    }
    // At least one periodic LIST came (it is due within the time moved).
    until("a periodic LIST", async || {
        lists(&counted()) > lists(&before)
    })
    .await;
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
async fn the_steady_state_requests_do_not_grow_with_the_applications() {
    let one = steady_requests(1).await;
    let fifty = steady_requests(50).await;
    let total = |counts: &BTreeMap<(String, String), u64>| counts.values().sum::<u64>();
    eprintln!("steady state, {MINUTES} min: 1 application {one:?}; 50 applications {fifty:?}");
    // A periodic LIST under way when counting stopped may be missed by either side.
    assert!(
        total(&fifty) <= total(&one) + 4,
        "50 applications: {fifty:?}; 1 application: {one:?}"
    );
    // The periodic LIST is a safety net: a few in 20 minutes (each of two selections).
    assert!(
        total(&one) <= 2 * (MINUTES / 5 + 1),
        "1 application: {one:?}"
    );
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
    let apps = applications(&sim, &clock, ServiceOptions::default());
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
/// record). A new application's first executor stream needs no LIST (it has no pods), and
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
}
