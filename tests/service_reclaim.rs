//! Guaranteed shares, borrowing and reclaim, end to end on the simulated cluster over real
//! gRPC. A queue `gold` of 8 executors over `team-a` and `team-b`, 4 guaranteed each: a
//! borrower in team-a fills it, an owner in team-b arrives and asks for 4. With
//! `reclaim_deadline_ms` the borrower's stream gets RECLAIM events for exactly the 4
//! borrowed executors (the fewest running tasks first, pending ones before any), GetStatus
//! shows them borrowed and reclaiming, each pod is deleted once its executor exits (or at
//! the deadline when the driver ignores it; at once under a deadline of 0), and the owner's
//! executors are created. Without the setting nothing is taken back.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use spark_pod_allocator::app::BudgetPolicy;
use spark_pod_allocator::app::budgets::{BudgetEntry, QueueNamespace, WeightedNamespace};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, next_event, quiet_cluster, start_request};
use test_kit::requests::*;
use test_kit::wait::until;

const BORROWER: &str = "borrower";
const OWNER: &str = "owner";

/// The queue `gold` over team-a and team-b, each guaranteed `guaranteed` of 8.
fn gold(guaranteed: [u64; 2], reclaim_deadline_ms: Option<u64>) -> BudgetEntry {
    let member = |namespace: &str, g: u64| {
        QueueNamespace::Weighted(WeightedNamespace {
            namespace: namespace.into(),
            weight: 1,
            guaranteed_executors: Some(g),
            max_executors: None,
        })
    };
    BudgetEntry {
        name: None,
        namespace: None,
        queue: Some("gold".into()),
        namespaces: vec![
            member("team-a", guaranteed[0]),
            member("team-b", guaranteed[1]),
        ],
        max_executors: 8,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms,
    }
}

fn policy(entry: BudgetEntry) -> BudgetPolicy {
    let mut config = Settings::default();
    config.budgets = vec![entry];
    config.budget_policy().expect("budgets")
}

/// A service under `entry`, and its metrics.
async fn harness(entry: BudgetEntry) -> (Harness, Metrics) {
    let mut config = Settings::default();
    config.budgets = vec![entry];
    config.budget_policy().expect("budgets");
    let metrics = Metrics::default();
    let serve = ServeSettings {
        metrics: metrics.clone(),
        ..ServeSettings::default()
    };
    let h = Harness::start_with_config(quiet_cluster(), serve, config).await;
    (h, metrics)
}

async fn start(h: &Harness, app: &str, namespace: &str) {
    let request = proto::StartRequest {
        settings: Some(proto::AllocationSettings {
            batch_size: Some(8),
            ..Default::default()
        }),
        ..start_request(app, namespace)
    };
    h.client.clone().start(request).await.expect("Start");
}

fn app_id(app: &str) -> spark_pod_allocator::app::AppId {
    spark_pod_allocator::app::AppId::parse(app).expect("app id")
}

/// Moves the clock one batch delay and waits until each of `apps` ran a round after it.
async fn one_round(h: &Harness, apps: &[&str]) {
    let mut before = Vec::new();
    for app in apps {
        before.push(h.applications.rounds(&app_id(app)).await.expect("rounds"));
    }
    h.clock.advance(Duration::from_secs(1));
    for (app, rounds) in apps.iter().zip(before) {
        until(&format!("a round of {app}"), async || {
            h.applications.rounds(&app_id(app)).await.expect("rounds") > rounds
        })
        .await;
    }
}

/// The executor ids of `app`'s pods in `namespace`.
async fn ids(h: &Harness, namespace: &str, app: &str) -> BTreeSet<u64> {
    (h.pods(namespace, app).await.iter())
        .filter_map(|pod| {
            pod.metadata
                .labels
                .as_ref()?
                .get("spark-exec-id")?
                .parse()
                .ok()
        })
        .collect()
}

/// Rounds (at most 20) until `app` has `want` pods in `namespace`.
async fn rounds_until(h: &Harness, apps: &[&str], namespace: &str, app: &str, want: usize) {
    for _ in 0..20 {
        if h.pods(namespace, app).await.len() == want {
            return;
        }
        one_round(h, apps).await;
    }
    let has = h.pods(namespace, app).await.len();
    panic!("{app} has {has} pods, wanted {want}");
}

/// Sets the phase of executor `id`'s pod, as a kubelet would.
async fn set_phase(h: &Harness, namespace: &str, app: &str, id: u64, phase: &str) {
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), namespace);
    api.patch_status(
        &format!("{app}-exec-{id}"),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": phase}})),
    )
    .await
    .expect("status patch");
}

fn profile0(status: &proto::ApplicationStatus) -> &proto::ProfileStatus {
    (status.profiles.iter())
        .find(|p| p.resource_profile_id == 0)
        .expect("profile 0")
}

/// The borrower in team-a with 8 pods: `running` of them Running and registered with
/// `tasks` running on each, the rest Pending and unknown to the driver.
async fn borrower_fills_the_queue(h: &Harness, running: u64, tasks: &[(u64, u32)]) {
    start(h, BORROWER, "team-a").await;
    h.set_total(BORROWER, 8).await;
    rounds_until(h, &[BORROWER], "team-a", BORROWER, 8).await;
    for id in 1..=running {
        set_phase(h, "team-a", BORROWER, id, "Running").await;
    }
    h.client
        .clone()
        .update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
            application_id: BORROWER.into(),
            executor_ids: (1..=running).map(|id| id.to_string()).collect(),
            running_tasks: (tasks.iter()).map(|(id, n)| (id.to_string(), *n)).collect(),
        })
        .await
        .expect("UpdateRegisteredExecutors");
    until("the borrower's executors running", async || {
        let status = h.status(BORROWER).await.expect("GetStatus");
        u64::from(profile0(&status).running) == running
    })
    .await;
}

/// A stream of the borrower's executor events, read past its full state.
async fn borrower_stream(h: &Harness) -> tonic::Streaming<proto::ExecutorEvent> {
    let mut stream = h
        .client
        .clone()
        .watch_executors(watch_request(BORROWER, 0))
        .await
        .expect("WatchExecutors")
        .into_inner();
    while let Some(event) = next_event(&mut stream).await {
        if event.kind() == proto::ExecutorEventKind::Synced {
            break;
        }
    }
    stream
}

/// The next `n` RECLAIM events of `stream` (other events skipped): executor id → reclaim.
async fn reclaims(
    stream: &mut tonic::Streaming<proto::ExecutorEvent>,
    n: usize,
) -> BTreeMap<i64, proto::ExecutorReclaim> {
    let mut got = BTreeMap::new();
    while got.len() < n {
        let event = next_event(stream).await.expect("an event");
        if event.kind() == proto::ExecutorEventKind::Reclaim {
            let executor = event.executor.expect("executor").executor_id;
            got.insert(executor, event.reclaim.expect("reclaim"));
        }
    }
    got
}

/// The owner arrives in team-b asking for 4; both run rounds until the borrower was
/// asked.
async fn owner_arrives(h: &Harness) {
    start(h, OWNER, "team-b").await;
    h.set_total(OWNER, 4).await;
}

fn counter(metrics: &Metrics, series: &str) -> f64 {
    let text = metrics.encode();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn the_borrowed_executors_with_fewest_tasks_are_asked_back_and_deleted_once_they_exit() {
    let (h, metrics) = harness(gold([4, 4], Some(60_000))).await;
    let tasks = [
        (1, 5),
        (2, 0),
        (3, 3),
        (4, 0),
        (5, 2),
        (6, 7),
        (7, 1),
        (8, 4),
    ];
    borrower_fills_the_queue(&h, 8, &tasks).await;
    let mut stream = borrower_stream(&h).await;
    owner_arrives(&h).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    let asked_at = spark_pod_allocator::app::Clock::now(&h.clock).0;
    let asked = reclaims(&mut stream, 4).await;
    // The four with the fewest running tasks: 0, 0, 1, 2.
    assert_eq!(asked.keys().copied().collect::<Vec<_>>(), [2, 4, 5, 7]);
    for reclaim in asked.values() {
        assert_eq!(reclaim.budget, "queue/gold");
        assert!(
            (asked_at - 1000..=asked_at).contains(&(reclaim.deadline_ms - 60_000)),
            "{reclaim:?} asked at {asked_at}"
        );
    }
    let status = h.status(BORROWER).await.expect("GetStatus");
    let profile = profile0(&status);
    assert_eq!(
        (profile.borrowed, profile.reclaiming),
        (4, 4),
        "{profile:?}"
    );
    let owner = h.status(OWNER).await.expect("GetStatus");
    assert_eq!(profile0(&owner).held, 4);
    // Nothing is deleted before the executors exit; nothing more is asked.
    one_round(&h, &[BORROWER, OWNER]).await;
    assert_eq!(h.pods("team-a", BORROWER).await.len(), 8);
    assert!(h.pods("team-b", OWNER).await.is_empty());
    // A stream (re)starting while the reclaims last gets them again after its state.
    let mut again = h
        .client
        .clone()
        .watch_executors(watch_request(BORROWER, 0))
        .await
        .expect("WatchExecutors")
        .into_inner();
    assert_eq!(reclaims(&mut again, 4).await, asked);

    // The driver decommissions them: the executors exit, their pods are deleted, and the
    // owner's executors are created.
    for id in asked.keys() {
        set_phase(
            &h,
            "team-a",
            BORROWER,
            u64::try_from(*id).expect("id"),
            "Succeeded",
        )
        .await;
    }
    rounds_until(&h, &[BORROWER, OWNER], "team-b", OWNER, 4).await;
    assert_eq!(
        ids(&h, "team-a", BORROWER).await,
        BTreeSet::from([1, 3, 6, 8])
    );
    // Not replaced while the owner holds its part.
    one_round(&h, &[BORROWER, OWNER]).await;
    assert_eq!(h.pods("team-a", BORROWER).await.len(), 4);
    let status = h.status(BORROWER).await.expect("GetStatus");
    let profile = profile0(&status);
    assert_eq!(
        (profile.borrowed, profile.reclaiming),
        (0, 0),
        "{profile:?}"
    );
    let gold = "{budget=\"queue/gold\"";
    assert_eq!(
        counter(
            &metrics,
            &format!("spark_pod_allocator_reclaims_requested_total{gold}}}")
        ),
        4.0
    );
    let graceful =
        format!("spark_pod_allocator_reclaims_completed_total{gold},outcome=\"graceful\"}}");
    assert_eq!(counter(&metrics, &graceful), 4.0);
    assert_eq!(
        counter(&metrics, "spark_pod_allocator_reclaim_admit_seconds_count"),
        1.0
    );
}

#[tokio::test]
async fn a_driver_ignoring_the_reclaim_loses_the_executors_at_the_deadline() {
    let (h, metrics) = harness(gold([4, 4], Some(10_000))).await;
    borrower_fills_the_queue(&h, 8, &[]).await;
    let mut stream = borrower_stream(&h).await;
    owner_arrives(&h).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    // No running tasks said: the newest first.
    let asked = reclaims(&mut stream, 4).await;
    assert_eq!(asked.keys().copied().collect::<Vec<_>>(), [5, 6, 7, 8]);
    for _ in 0..5 {
        one_round(&h, &[BORROWER, OWNER]).await;
    }
    assert_eq!(
        h.pods("team-a", BORROWER).await.len(),
        8,
        "before the deadline"
    );
    // The deadline passes: the pods are deleted, forced, and the owner's come.
    rounds_until(&h, &[BORROWER, OWNER], "team-b", OWNER, 4).await;
    assert_eq!(
        ids(&h, "team-a", BORROWER).await,
        BTreeSet::from([1, 2, 3, 4])
    );
    let forced =
        "spark_pod_allocator_reclaims_completed_total{budget=\"queue/gold\",outcome=\"forced\"}";
    assert_eq!(counter(&metrics, forced), 4.0);
}

#[tokio::test]
async fn a_deadline_of_0_deletes_at_once_without_asking() {
    let (h, metrics) = harness(gold([4, 4], Some(0))).await;
    borrower_fills_the_queue(&h, 8, &[]).await;
    let mut stream = borrower_stream(&h).await;
    owner_arrives(&h).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    assert_eq!(
        ids(&h, "team-a", BORROWER).await,
        BTreeSet::from([1, 2, 3, 4])
    );
    rounds_until(&h, &[BORROWER, OWNER], "team-b", OWNER, 4).await;
    let forced =
        "spark_pod_allocator_reclaims_completed_total{budget=\"queue/gold\",outcome=\"forced\"}";
    assert_eq!(counter(&metrics, forced), 4.0);
    // The stream shows the deletes, and no RECLAIM.
    let mut deleted = 0;
    while deleted < 4 {
        let event = next_event(&mut stream).await.expect("an event");
        assert_ne!(event.kind(), proto::ExecutorEventKind::Reclaim);
        if event.kind() == proto::ExecutorEventKind::Deleted {
            deleted += 1;
        }
    }
}

#[tokio::test]
async fn without_reclaim_deadline_ms_nothing_is_taken_back() {
    let (h, _) = harness(gold([4, 4], None)).await;
    borrower_fills_the_queue(&h, 8, &[]).await;
    owner_arrives(&h).await;
    for _ in 0..5 {
        one_round(&h, &[BORROWER, OWNER]).await;
    }
    assert_eq!(h.pods("team-a", BORROWER).await.len(), 8);
    assert!(h.pods("team-b", OWNER).await.is_empty());
    let status = h.status(BORROWER).await.expect("GetStatus");
    let profile = profile0(&status);
    // Borrowed all the same: only the taking back is off.
    assert_eq!(
        (profile.borrowed, profile.reclaiming),
        (4, 0),
        "{profile:?}"
    );
    assert_eq!(profile0(&h.status(OWNER).await.expect("GetStatus")).held, 4);
}

#[tokio::test]
async fn pending_executors_unknown_to_the_driver_go_first_at_once() {
    let (h, _) = harness(gold([4, 4], Some(60_000))).await;
    // 6 running and registered; 7 and 8 still Pending.
    borrower_fills_the_queue(&h, 6, &[]).await;
    let mut stream = borrower_stream(&h).await;
    owner_arrives(&h).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    // 7 and 8 are deleted at once; two registered ones (the newest) are asked for.
    let asked = reclaims(&mut stream, 2).await;
    assert_eq!(asked.keys().copied().collect::<Vec<_>>(), [5, 6]);
    one_round(&h, &[BORROWER, OWNER]).await;
    assert_eq!(
        ids(&h, "team-a", BORROWER).await,
        BTreeSet::from([1, 2, 3, 4, 5, 6])
    );
    let status = h.status(BORROWER).await.expect("GetStatus");
    assert_eq!(profile0(&status).reclaiming, 2);
    // The owner gets the two freed at once.
    rounds_until(&h, &[BORROWER, OWNER], "team-b", OWNER, 2).await;
}

#[tokio::test]
async fn a_reload_lowering_the_owners_guarantee_asks_back_less() {
    let (h, _) = harness(gold([4, 4], Some(60_000))).await;
    borrower_fills_the_queue(&h, 8, &[]).await;
    let mut stream = borrower_stream(&h).await;
    (h.applications.budgets())
        .replace(policy(gold([6, 2], Some(60_000))))
        .expect("reload");
    owner_arrives(&h).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    let asked = reclaims(&mut stream, 2).await;
    assert_eq!(asked.keys().copied().collect::<Vec<_>>(), [7, 8]);
    for _ in 0..2 {
        one_round(&h, &[BORROWER, OWNER]).await;
    }
    let status = h.status(BORROWER).await.expect("GetStatus");
    let profile = profile0(&status);
    assert_eq!(
        (profile.borrowed, profile.reclaiming),
        (2, 2),
        "{profile:?}"
    );
}

#[test]
fn guarantees_beyond_the_budget_are_refused_naming_the_key() {
    let mut config = Settings::default();
    config.budgets = vec![gold([5, 4], Some(1000))];
    let err = config.budget_policy().expect_err("5 + 4 > 8").to_string();
    assert!(err.contains("budgets[0].namespaces"), "{err}");
    config.budgets = vec![gold([4, 4], Some(1000))];
    if let QueueNamespace::Weighted(w) = &mut config.budgets[0].namespaces[1] {
        w.max_executors = Some(3);
    }
    let err = config.budget_policy().expect_err("4 > 3").to_string();
    assert!(
        err.contains("budgets[0].namespaces[1].guaranteed_executors"),
        "{err}"
    );
}

#[tokio::test]
async fn in_a_namespace_budget_an_application_takes_back_its_fair_part_of_the_guarantee() {
    let budget = BudgetEntry {
        name: None,
        namespace: Some("team-a".into()),
        queue: None,
        namespaces: Vec::new(),
        max_executors: 8,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms: Some(60_000),
    };
    let (h, _) = harness(budget).await;
    borrower_fills_the_queue(&h, 8, &[]).await;
    let mut stream = borrower_stream(&h).await;
    // A second application of the same namespace: the namespace's guarantee (the whole
    // budget) is divided 4/4 between the two.
    start(&h, OWNER, "team-a").await;
    h.set_total(OWNER, 6).await;
    one_round(&h, &[BORROWER, OWNER]).await;
    let asked = reclaims(&mut stream, 4).await;
    assert_eq!(asked.keys().copied().collect::<Vec<_>>(), [5, 6, 7, 8]);
    assert_eq!(asked[&5].budget, "namespace/team-a");
    for id in 5..=8 {
        set_phase(&h, "team-a", BORROWER, id, "Failed").await;
    }
    rounds_until(&h, &[BORROWER, OWNER], "team-a", OWNER, 4).await;
    assert_eq!(
        ids(&h, "team-a", BORROWER).await,
        BTreeSet::from([1, 2, 3, 4])
    );
}
