//! Budgets on the real control plane: the namespace's ResourceQuota is enforced by the real
//! quota admission plugin and kept by the real resourcequota controller (the simulator
//! imitates both), and a namespace budget divides the same way there, as does a queue over
//! two namespaces (by namespace first, then by application). The service core
//! runs in process with a manual clock; the real scheduler and kwok place and run the pods.

use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, PostParams};
use serde_json::Value;
use spark_pod_allocator::app::budgets::{BudgetEntry, QueueNamespace};
use spark_pod_allocator::app::{Applications, ManualClock};
use test_kit::cluster::{Cluster, RealBackend, cluster_ids_in};
use test_kit::service::{
    BATCH_DELAY, advance_round, applications, id, set_targets_and_round, start,
    start_application as request, targets,
};
use test_kit::wait::until;

/// The pods of each of `apps`, in whichever of the scenario's namespaces it runs.
async fn counts(c: &RealBackend, apps: &[&str]) -> Vec<usize> {
    let mut counts = Vec::new();
    for app in apps {
        let mine = cluster_ids_in(c, c.namespace(), app).await.len();
        let other = cluster_ids_in(c, c.other_namespace(), app).await.len();
        counts.push(mine + other);
    }
    counts
}

/// Rounds (one batch delay each, every application) until the pod counts of `apps` are
/// `want`; then one more round of each changes nothing.
async fn rounds_until(
    c: &RealBackend,
    apps: &Applications,
    clock: &ManualClock,
    names: &[&str],
    want: &[usize],
) {
    for _ in 0..20 {
        if counts(c, names).await == want {
            for name in names {
                advance_round(apps, clock, name, BATCH_DELAY).await;
            }
            assert_eq!(counts(c, names).await, want, "after one more round");
            return;
        }
        for name in names {
            advance_round(apps, clock, name, BATCH_DELAY).await;
        }
    }
    panic!(
        "pods of {names:?}: {:?}, wanted {want:?}",
        counts(c, names).await
    );
}

/// The service account's pod creates in `namespace` the API server answered 403.
fn refused_creates(c: &RealBackend, namespace: &str) -> Vec<Value> {
    c.server()
        .audit_events()
        .into_iter()
        .filter(|e| {
            e["user"]["username"] == c.service_user()
                && e["verb"] == "create"
                && e["objectRef"]["resource"] == "pods"
                && e["objectRef"]["namespace"] == namespace
                && e["responseStatus"]["code"] == 403
        })
        .collect()
}

/// Each application's last create failure, if any (from GetStatus).
async fn create_failures(apps: &Applications, names: &[&str]) -> Vec<String> {
    let mut failures = Vec::new();
    for name in names {
        let status = apps.application_status(&id(name)).await.expect("status");
        for failure in status.create_failures.values() {
            failures.push(format!("{name}: {failure:?}"));
        }
    }
    failures
}

#[tokio::test]
async fn a_quota_of_20_pods_is_divided_10_10_with_no_create_refused() {
    let Some(c) = RealBackend::with_control_plane("budget-quota").await else {
        return;
    };
    let clock = ManualClock::starting_now();
    // No budget configured: the ResourceQuota is the budget (budgets_follow_quotas, on by
    // default).
    let apps = applications(c.service_client(), &clock, c.service_settings());
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "compute"},
        "spec": {"hard": {"pods": "20"}}
    }))
    .expect("quota");
    let quotas: Api<ResourceQuota> = Api::namespaced(c.admin_client(), c.namespace());
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota created");
    let names = ["app-a", "app-b"];
    for name in names {
        start(&apps, request(name, c.namespace())).await;
    }
    // The real resourcequota controller fills in the status; the service divides a quota
    // only once it shows its hard limit.
    until("the quota seen by the service", async || {
        apps.budgets().quotas(c.namespace()).len() == 1
    })
    .await;
    for name in names {
        set_targets_and_round(&apps, name, targets(20)).await;
    }
    rounds_until(&c, &apps, &clock, &names, &[10, 10]).await;
    assert_eq!(create_failures(&apps, &names).await, Vec::<String>::new());
    for name in names {
        let status = apps.status(&id(name)).await.expect("status");
        let profile = status.profiles.values().next().expect("profile 0");
        assert_eq!(profile.held, 10, "{name}: {profile:?}");
    }
    assert_eq!(refused_creates(&c, c.namespace()), Vec::<Value>::new());
    // The real quota counts the same 20.
    until("the quota's used pods", async || {
        let status = quotas.get("compute").await.expect("quota").status;
        status
            .and_then(|s| s.used)
            .and_then(|used| used.get("pods").map(|q| q.0.clone()))
            .as_deref()
            == Some("20")
    })
    .await;
    for name in names {
        apps.stop(&id(name)).await.expect("stop");
    }
    c.finish().await;
}

#[tokio::test]
async fn three_applications_asking_30_under_a_budget_of_30_get_10_each() {
    let Some(c) = RealBackend::with_control_plane("budget-namespace").await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let budgets = vec![BudgetEntry {
        name: None,
        namespace: Some(c.namespace().to_string()),
        queue: None,
        namespaces: Vec::new(),
        max_executors: 30,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms: None,
    }];
    let mut config = c.service_settings();
    config.budgets = budgets;
    config.budget_policy().expect("budget");
    let apps = applications(c.service_client(), &clock, config);
    let names = ["app-a", "app-b", "app-c"];
    for name in names {
        start(&apps, request(name, c.namespace())).await;
    }
    for name in names {
        set_targets_and_round(&apps, name, targets(30)).await;
    }
    rounds_until(&c, &apps, &clock, &names, &[10, 10, 10]).await;
    assert_eq!(create_failures(&apps, &names).await, Vec::<String>::new());
    let status = apps.status(&id("app-a")).await.expect("status");
    let profile = status.profiles.values().next().expect("profile 0");
    assert_eq!((profile.target, profile.held), (30, 20), "{profile:?}");
    for name in names {
        apps.stop(&id(name)).await.expect("stop");
    }
    c.finish().await;
}

#[tokio::test]
async fn a_queue_gives_five_applications_of_one_namespace_no_more_than_one_of_another() {
    let Some(c) = RealBackend::with_control_plane("budget-queue").await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let budgets = vec![BudgetEntry {
        name: None,
        namespace: None,
        queue: Some("gold".into()),
        namespaces: vec![
            QueueNamespace::Name(c.namespace().to_string()),
            QueueNamespace::Name(c.other_namespace().to_string()),
        ],
        max_executors: 12,
        max_pending: None,
        max_cpu: None,
        max_memory: None,
        reclaim_deadline_ms: None,
    }];
    let mut config = c.service_settings();
    config.budgets = budgets;
    config.budget_policy().expect("budget");
    let apps = applications(c.service_client(), &clock, config);
    let many = ["many-0", "many-1", "many-2", "many-3", "many-4"];
    // Batches of one: nothing is taken before the others ask.
    let one_at_a_time = |name: &str, namespace: &str| {
        let mut req = request(name, namespace);
        req.settings.batch_size = 1;
        req
    };
    for name in many {
        start(&apps, one_at_a_time(name, c.namespace())).await;
    }
    start(&apps, one_at_a_time("one", c.other_namespace())).await;
    let all = ["many-0", "many-1", "many-2", "many-3", "many-4", "one"];
    for name in all {
        set_targets_and_round(&apps, name, targets(12)).await;
    }
    rounds_until(&c, &apps, &clock, &all, &[2, 1, 1, 1, 1, 6]).await;
    assert_eq!(create_failures(&apps, &all).await, Vec::<String>::new());
    for name in all {
        apps.stop(&id(name)).await.expect("stop");
    }
    c.finish().await;
}
