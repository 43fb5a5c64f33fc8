//! Budgets shared by applications, end to end on the simulated cluster over real gRPC:
//! fair division of a namespace budget (10/10/10, then 15/15 once one stops), weights,
//! held executors in GetStatus; a queue divided by namespace first (more or heavier
//! applications never get a tenant more) and a driver label that names a queue its
//! namespace is not in refused; and, with the binary, a budget changed in the
//! configuration file taking effect without a restart, read back from `/metrics`.
use std::time::Duration;

use spark_pod_allocator::app::budgets;
use spark_pod_allocator::app::budgets::{BudgetEntry, QueueNamespace, WeightedNamespace};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, TEMPLATE, quiet_cluster, start_request};
use test_kit::process::{
    HANG_GUARD, SERVE_SIMULATE, connect_serving, service_command, spawn_logged, until_logged,
};
use test_kit::requests::*;
use test_kit::wait::until;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const NAMESPACE: &str = "team-a";

fn namespace_budget(namespace: &str, max_executors: u64) -> BudgetEntry {
    BudgetEntry {
        name: None,
        namespace: Some(namespace.into()),
        queue: None,
        namespaces: Vec::new(),
        max_executors,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms: None,
    }
}

/// A queue budget `gold` of `max_executors` over `namespaces` (name, weight).
fn gold(max_executors: u64, namespaces: &[(&str, u32)]) -> BudgetEntry {
    BudgetEntry {
        namespace: None,
        queue: Some("gold".into()),
        namespaces: (namespaces.iter())
            .map(|(namespace, weight)| {
                QueueNamespace::Weighted(WeightedNamespace {
                    namespace: namespace.to_string(),
                    weight: *weight,
                    guaranteed_executors: None,
                    max_executors: None,
                })
            })
            .collect(),
        ..namespace_budget("unused", max_executors)
    }
}

/// A service under `budgets`, whose driver label `queue` may name a queue.
async fn harness_with(budgets: &[BudgetEntry]) -> Harness {
    let mut config = Settings::default();
    config.budgets = budgets.to_vec();
    config.budgets_queue_label = Some("queue".into());
    config.budget_policy().expect("budgets");
    Harness::start_with_config(quiet_cluster(), ServeSettings::default(), config).await
}

/// A service whose applications in `team-a` share a budget of `max_executors`.
async fn harness(max_executors: u64) -> Harness {
    let mut config = Settings::default();
    config.budgets = vec![namespace_budget(NAMESPACE, max_executors)];
    config.budget_policy().expect("budget");
    Harness::start_with_config(quiet_cluster(), ServeSettings::default(), config).await
}

/// Starts `app` in `team-a` with `batch_size` and `weight`.
async fn start(h: &Harness, app: &str, batch_size: u32, weight: Option<u32>) {
    start_in(h, NAMESPACE, app, batch_size, weight).await;
}

/// Starts `app` in `namespace` with `batch_size` and `weight`.
async fn start_in(h: &Harness, namespace: &str, app: &str, batch_size: u32, weight: Option<u32>) {
    let request = proto::StartRequest {
        settings: Some(proto::AllocationSettings {
            batch_size: Some(batch_size),
            budget_weight: weight,
            ..Default::default()
        }),
        ..start_request(app, namespace)
    };
    h.client.clone().start(request).await.expect("Start");
}

/// The application's pods, in whichever of the cluster's namespaces it runs.
async fn pod_count(h: &Harness, app: &str) -> usize {
    h.pods(NAMESPACE, app).await.len() + h.pods("team-b", app).await.len()
}

/// Moves the clock one batch delay and waits until every one of `apps` ran a round
/// after it (its requests answered).
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

fn app_id(app: &str) -> spark_pod_allocator::app::AppId {
    spark_pod_allocator::app::AppId::parse(app).expect("app id")
}

/// Rounds until the pod counts of `apps` are `want` (each round needs the pods of the
/// last one seen first, as Spark does); then one more round changes nothing.
async fn rounds_until(h: &Harness, apps: &[&str], want: &[usize]) {
    for _ in 0..20 {
        let mut counts = Vec::new();
        for app in apps {
            counts.push(pod_count(h, app).await);
        }
        if counts == want {
            one_round(h, apps).await;
            for (app, n) in apps.iter().zip(want) {
                assert_eq!(pod_count(h, app).await, *n, "{app} after one more round");
            }
            return;
        }
        one_round(h, apps).await;
    }
    let mut counts = Vec::new();
    for app in apps {
        counts.push(pod_count(h, app).await);
    }
    panic!("pods of {apps:?}: {counts:?}, wanted {want:?}");
}

fn profile0(status: &proto::ApplicationStatus) -> &proto::ProfileStatus {
    status
        .profiles
        .iter()
        .find(|p| p.resource_profile_id == 0)
        .expect("profile 0")
}

#[tokio::test]
async fn three_applications_asking_30_under_30_get_10_each_then_15_each_when_one_stops() {
    let h = harness(30).await;
    let apps = ["app-a", "app-b", "app-c"];
    for app in apps {
        start(&h, app, 10, None).await;
    }
    // Each asks as its driver's SetTotalExpected arrives.
    for app in apps {
        h.set_total(app, 30).await;
        until(&format!("{app}'s first batch"), async || {
            pod_count(&h, app).await == 10
        })
        .await;
    }
    rounds_until(&h, &apps, &[10, 10, 10]).await;

    let status = h.status("app-a").await.expect("GetStatus");
    let profile = profile0(&status);
    assert_eq!((profile.target, profile.held), (30, 20), "{profile:?}");
    let held_by = profile.held_by.as_ref().expect("held_by");
    assert_eq!(
        (
            held_by.budget.as_str(),
            held_by.resource.as_str(),
            held_by.used,
            held_by.limit,
            held_by.share
        ),
        ("namespace/team-a", "executors", 30, 30, 10)
    );
    let usage = &h.applications.budgets().usage()[0];
    assert_eq!(
        (usage.executors, usage.held, usage.applications),
        (30, 60, 3)
    );

    // One stops: within one round the two others reach the new share.
    h.client
        .clone()
        .stop(stop_request("app-c"))
        .await
        .expect("Stop");
    one_round(&h, &apps[..2]).await;
    assert_eq!(pod_count(&h, "app-a").await, 15);
    assert_eq!(pod_count(&h, "app-b").await, 15);
    rounds_until(&h, &apps[..2], &[15, 15]).await;
    let status = h.status("app-b").await.expect("GetStatus");
    assert_eq!(profile0(&status).held, 15);
    assert_eq!(
        profile0(&status).held_by.as_ref().expect("held_by").share,
        15
    );
}

#[tokio::test]
async fn weights_2_1_1_divide_30_as_15_8_7() {
    let h = harness(30).await;
    let apps = ["heavy", "light-1", "light-2"];
    // Batches no larger than the smallest share: what an application takes before the
    // others ask never exceeds its share, and nothing is taken back.
    start(&h, "heavy", 7, Some(2)).await;
    start(&h, "light-1", 7, Some(1)).await;
    start(&h, "light-2", 7, None).await;
    for app in apps {
        h.set_total(app, 30).await;
    }
    rounds_until(&h, &apps, &[15, 8, 7]).await;
    let status = h.status("light-2").await.expect("GetStatus");
    assert_eq!(profile0(&status).held, 23);
    assert_eq!(
        profile0(&status).held_by.as_ref().expect("held_by").share,
        7
    );
}

#[tokio::test]
async fn an_application_outside_every_budget_holds_nothing() {
    let h = harness(1).await;
    h.client
        .clone()
        .start(start_request("free", "team-b"))
        .await
        .expect("Start");
    h.set_total("free", 5).await;
    until("5 pods", async || h.pods("team-b", "free").await.len() == 5).await;
    let status = h.status("free").await.expect("GetStatus");
    assert_eq!(profile0(&status).held, 0);
    assert!(profile0(&status).held_by.is_none());
}

/// The value of the sample `series` in a scrape, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// `GET /metrics` over plain HTTP/1.1; returns the body.
async fn scrape(address: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// Scrapes until `series` is `want`.
async fn until_sample(address: &str, series: &str, want: f64) {
    let wait = async {
        loop {
            if sample(&scrape(address).await, series) == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    if tokio::time::timeout(HANG_GUARD, wait).await.is_err() {
        panic!(
            "{series} never reached {want}; last scrape:\n{}",
            scrape(address).await
        );
    }
}

#[tokio::test]
async fn a_budget_changed_in_the_configuration_file_takes_effect_without_a_restart() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("config.yaml");
    let config = |max: u32| {
        format!(
            "metrics:\n  listen: \"127.0.0.1:0\"\nbudgets_reload_interval_ms: 100\n\
             budgets:\n- namespace: default\n  max_executors: {max}\n"
        )
    };
    std::fs::write(&path, config(4)).expect("config");
    let path_arg = path.to_string_lossy().to_string();
    let mut args = vec!["--config", path_arg.as_str()];
    args.extend_from_slice(SERVE_SIMULATE);
    let (_child, mut lines) = spawn_logged(service_command(BIN, &args));
    let metrics = until_logged(&mut lines, "serving metrics at /metrics").await["address"]
        .as_str()
        .expect("metrics address")
        .to_string();
    let grpc = until_logged(&mut lines, "serving gRPC").await["address"]
        .as_str()
        .expect("gRPC address")
        .to_string();
    let mut client = connect_serving(&grpc).await;
    client
        .start(proto::StartRequest {
            application_id: "reloaded".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("Start");
    client
        .set_total_expected(targets_request("reloaded", 10))
        .await
        .expect("SetTotalExpected");
    let held = "spark_pod_allocator_executors_held{budget=\"namespace/default\"}";
    let used = "spark_pod_allocator_budget_executors{budget=\"namespace/default\"}";
    until_sample(&metrics, held, 6.0).await;
    let text = scrape(&metrics).await;
    assert_eq!(sample(&text, used), Some(4.0), "{text}");
    let status = client
        .get_status(status_request("reloaded"))
        .await
        .expect("GetStatus")
        .into_inner();
    assert_eq!(profile0(&status).held, 6);
    assert_eq!(
        profile0(&status).held_by.as_ref().expect("held_by").limit,
        4
    );

    // A bad file is refused, logged, and the budget in force stays.
    std::fs::write(&path, config(0)).expect("config");
    let refused = until_logged(
        &mut lines,
        "configuration file changed but is refused; the budgets in force stay",
    )
    .await;
    assert!(
        refused["error"]
            .as_str()
            .is_some_and(|e| e.contains("budgets[0].max_executors")),
        "{refused}"
    );
    // Raised: the held executors are created, with no restart.
    std::fs::write(&path, config(10)).expect("config");
    until_logged(
        &mut lines,
        "configuration file changed: budgets reloaded (other settings need a restart)",
    )
    .await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    until_sample(&metrics, used, 10.0).await;
    until_sample(&metrics, held, 0.0).await;
}

/// A driver pod in `team-a` in queue `gold`, with a budget weight annotation if given.
async fn create_driver(h: &Harness, name: &str, weight: Option<&str>) {
    create_driver_in(h, NAMESPACE, name, weight).await;
}

/// A driver pod in `namespace` labelled `queue=gold`, with a budget weight annotation if
/// given.
async fn create_driver_in(h: &Harness, namespace: &str, name: &str, weight: Option<&str>) {
    use kube::api::{Api, PostParams};
    let mut metadata = serde_json::json!({"name": name, "labels": {"queue": "gold"}});
    if let Some(weight) = weight {
        metadata["annotations"] = serde_json::json!({ budgets::WEIGHT_ANNOTATION: weight });
    }
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .expect("pod");
    let api: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(h.sim.try_client().expect("sim client"), namespace);
    api.create(&PostParams::default(), &pod)
        .await
        .expect("driver pod");
}

#[tokio::test]
async fn a_queue_budget_divides_its_namespace_share_by_driver_weight_and_an_ended_driver_frees_it()
{
    // The driver label names the namespace's own queue: allowed.
    let h = harness_with(&[gold(8, &[(NAMESPACE, 1)])]).await;
    create_driver(&h, "driver-a", Some("3")).await;
    create_driver(&h, "driver-b", None).await;
    for (app, driver) in [("app-a", "driver-a"), ("app-b", "driver-b")] {
        let mut request = start_request(app, NAMESPACE);
        request.driver_pod_name = driver.into();
        request.settings = Some(proto::AllocationSettings {
            batch_size: Some(2),
            ..Default::default()
        });
        h.client.clone().start(request).await.expect("Start");
    }
    for app in ["app-a", "app-b"] {
        h.set_total(app, 8).await;
    }
    // Weights 3:1 of team-a's 8.
    rounds_until(&h, &["app-a", "app-b"], &[6, 2]).await;
    let status = h.status("app-b").await.expect("GetStatus");
    let held_by = profile0(&status).held_by.clone().expect("held_by");
    assert_eq!((held_by.budget.as_str(), held_by.share), ("queue/gold", 2));

    // a's driver ends: its executors are deleted, and b gets the whole budget before a
    // is forgotten.
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(h.sim.try_client().expect("sim client"), NAMESPACE);
    api.patch_status(
        "driver-a",
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({"status": {"phase": "Failed"}})),
    )
    .await
    .expect("driver phase");
    until("a's executors deleted", async || {
        pod_count(&h, "app-a").await == 0
    })
    .await;
    rounds_until(&h, &["app-b"], &[8]).await;
    assert!(h.status("app-a").await.is_ok(), "a is still known (grace)");
}

#[tokio::test]
async fn a_quota_of_20_pods_is_divided_10_10_with_no_create_refused() {
    use k8s_openapi::api::core::v1::ResourceQuota;
    use kube::api::{Api, PostParams};
    // No budget configured: the namespace's ResourceQuota is the budget.
    let h = Harness::start_with_config(
        quiet_cluster(),
        ServeSettings::default(),
        Settings::default(),
    )
    .await;
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "compute"},
        "spec": {"hard": {"pods": "20"}}
    }))
    .expect("quota");
    let quotas: Api<ResourceQuota> =
        Api::namespaced(h.sim.try_client().expect("sim client"), NAMESPACE);
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota created");
    let apps = ["app-a", "app-b"];
    for app in apps {
        start(&h, app, 10, None).await;
    }
    until("the quota seen by the service", async || {
        h.applications.budgets().quotas(NAMESPACE).len() == 1
    })
    .await;
    for app in apps {
        h.set_total(app, 20).await;
    }
    rounds_until(&h, &apps, &[10, 10]).await;
    for app in apps {
        let status = h.status(app).await.expect("GetStatus");
        let profile = profile0(&status);
        assert!(
            profile.last_create_failure.is_none(),
            "{app}: {:?}",
            profile.last_create_failure
        );
        assert_eq!(profile.held, 10, "{app}");
        // The limit shown is what the quota leaves the service's applications, estimated
        // from the executors each had seen at its last round (it errs low, never high).
        let held_by = profile.held_by.as_ref().expect("held_by");
        assert_eq!(
            (held_by.budget.as_str(), held_by.resource.as_str()),
            ("quota/team-a/compute", "executors")
        );
        assert!(held_by.limit <= 20 && held_by.share <= 10, "{held_by:?}");
    }
    // What the quota counts agrees.
    let used = quotas
        .get("compute")
        .await
        .expect("quota")
        .status
        .expect("status");
    assert_eq!(used.used.expect("used")["pods"].0, "20");
}

#[tokio::test]
async fn a_driver_label_naming_a_queue_its_namespace_is_not_in_is_refused() {
    // gold holds team-a only; a tenant of team-b labels its driver queue=gold.
    let h = harness_with(&[gold(10, &[(NAMESPACE, 1)])]).await;
    create_driver_in(&h, "team-b", "driver-b", Some("10")).await;
    let mut request = start_request("intruder", "team-b");
    request.driver_pod_name = "driver-b".into();
    let refused = h.client.clone().start(request).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("queue=gold") && refused.message().contains("team-b"),
        "names the label and the namespace: {refused:?}"
    );
    assert_eq!(
        h.status("intruder").await.expect_err("not started").code(),
        tonic::Code::NotFound
    );
    assert_eq!(pod_count(&h, "intruder").await, 0);
    assert_eq!(h.applications.budgets().usage()[0].applications, 0);
}

#[tokio::test]
async fn five_applications_of_one_tenant_get_no_more_of_a_queue_than_one_of_another() {
    let h = harness_with(&[gold(12, &[(NAMESPACE, 1), ("team-b", 1)])]).await;
    let many = ["many-0", "many-1", "many-2", "many-3", "many-4"];
    // Batches no larger than the smallest share: nothing is taken before the others ask.
    for app in many {
        start_in(&h, NAMESPACE, app, 1, None).await;
    }
    start_in(&h, "team-b", "one", 1, None).await;
    let all = ["many-0", "many-1", "many-2", "many-3", "many-4", "one"];
    for app in all {
        h.set_total(app, 12).await;
    }
    // team-a's 6 divided among its five (the extra unit to the first), team-b's 6 to its
    // one; per application it would be 2 each, 10 to team-a.
    rounds_until(&h, &all, &[2, 1, 1, 1, 1, 6]).await;
    let status = h.status("one").await.expect("GetStatus");
    let held_by = profile0(&status).held_by.clone().expect("held_by");
    assert_eq!((held_by.budget.as_str(), held_by.share), ("queue/gold", 6));
}

#[tokio::test]
async fn a_huge_budget_weight_gets_no_more_than_its_tenant_share() {
    let h = harness_with(&[gold(12, &[(NAMESPACE, 1), ("team-b", 1)])]).await;
    start_in(&h, NAMESPACE, "greedy", 1, Some(u32::MAX)).await;
    start_in(&h, "team-b", "modest", 1, None).await;
    for app in ["greedy", "modest"] {
        h.set_total(app, 12).await;
    }
    // Per application, weights 10 (the cap) and 1 would give 11/1.
    rounds_until(&h, &["greedy", "modest"], &[6, 6]).await;
}

#[tokio::test]
async fn the_operator_weights_divide_a_queue_between_namespaces() {
    let h = harness_with(&[gold(12, &[(NAMESPACE, 3), ("team-b", 1)])]).await;
    start_in(&h, NAMESPACE, "heavy", 1, None).await;
    start_in(&h, "team-b", "light", 1, Some(10)).await;
    for app in ["heavy", "light"] {
        h.set_total(app, 12).await;
    }
    rounds_until(&h, &["heavy", "light"], &[9, 3]).await;
}
