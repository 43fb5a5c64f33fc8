//! Real faults against a real kube-apiserver (each test has a server of its own): etcd
//! compaction forcing 410 Gone on the service's watch, an API server restart in the middle of
//! a scale-up, and etcd stopped for a few seconds. After each, the service converges: the
//! cluster holds exactly the target, the service's snapshot matches the cluster, no id twice.
//! Skipped (with the reason printed) when `TEST_APISERVER_BIN` is not set.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;
use spark_pod_allocator::app::{Applications, ManualClock, StartApplication};
use test_kit::cluster::{Cluster, RealBackend, cluster_ids};
use test_kit::service::{
    BATCH_DELAY, P0, applications, id, snapshot_ids, start, start_application, targets,
    template_pod,
};
use test_kit::wait::until;

/// Bound on convergence after a fault: restarts on a loaded two-core machine are slow.
const CONVERGE_GUARD: Duration = Duration::from_secs(180);

fn request(app: &str, namespace: &str) -> StartApplication {
    let mut req = start_application(app, namespace);
    req.templates = BTreeMap::from([(P0, template_pod())]);
    // Creates lost in a fault time out after this much clock (60 rounds of converge).
    req.settings.executor_timeout = Duration::from_secs(60);
    req
}

fn service(c: &RealBackend, clock: &ManualClock) -> Applications {
    applications(c.service_client(), clock, c.service_settings())
}

/// Moves the clock a batch delay at a time until the cluster has `n` executors of `app` and the
/// service's snapshot holds exactly those; returns their ids.
async fn converge(
    c: &RealBackend,
    apps: &Applications,
    clock: &ManualClock,
    app: &str,
    n: usize,
) -> BTreeSet<u64> {
    let deadline = tokio::time::Instant::now() + CONVERGE_GUARD;
    loop {
        let in_cluster = cluster_ids(c, app).await;
        if in_cluster.len() == n && snapshot_ids(apps, app).await == in_cluster {
            return in_cluster;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{app} did not converge to {n} executors: cluster {in_cluster:?}, snapshot {:?}",
            snapshot_ids(apps, app).await
        );
        clock.advance(BATCH_DELAY);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The service's LIST requests of pods in `namespace`, from the audit log.
fn pod_lists(c: &RealBackend, namespace: &str) -> usize {
    c.server()
        .audit_events()
        .iter()
        .filter(|e| {
            e["user"]["username"] == c.service_user()
                && e["verb"] == "list"
                && e["objectRef"]["resource"] == "pods"
                && e["objectRef"]["namespace"] == namespace
        })
        .count()
}

async fn restart_server(c: &RealBackend) {
    tokio::task::block_in_place(|| c.server().restart());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_expired_by_etcd_compaction_relists_without_duplicates() {
    // Without the watch cache every watch reads etcd, where compaction is what 410 means.
    let Some(c) = RealBackend::start_own("compaction", &["--watch-cache=false"]).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let apps = service(&c, &clock);
    let app = "app-410";
    start(&apps, request(app, c.namespace())).await;
    apps.set_total_expected(&id(app), targets(2))
        .await
        .expect("targets");
    assert_eq!(
        converge(&c, &apps, &clock, app, 2).await,
        BTreeSet::from([1, 2])
    );
    let pods: Api<Pod> = Api::namespaced(c.admin_client(), c.namespace());
    let seen_rv = pods
        .get("app-410-exec-2")
        .await
        .expect("pod")
        .metadata
        .resource_version
        .expect("resourceVersion");

    // Other writes move etcd's revision past what the service saw; then history goes.
    let maps: Api<ConfigMap> = Api::namespaced(c.admin_client(), c.other_namespace());
    for i in 0..3 {
        let map: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("bump-{i}")}}))
                .expect("configmap");
        maps.create(&PostParams::default(), &map)
            .await
            .expect("bump");
    }
    let compacted = c.server().compact();
    assert!(compacted > seen_rv.parse::<u64>().expect("numeric resourceVersion"));
    // A watch from the old resourceVersion is expired: 410 Gone (as an ERROR event).
    let (code, events) = test_kit::sim::raw_watch_events(
        c.admin_client(),
        format!(
            "/api/v1/namespaces/{}/pods?watch=true&resourceVersion={seen_rv}&timeoutSeconds=5",
            c.namespace()
        ),
    )
    .await;
    let expired = code == 410
        || events
            .iter()
            .any(|e| e["type"] == "ERROR" && e["object"]["code"] == 410);
    assert!(expired, "{code} {events:?}");

    // The service's watch breaks with the restart, re-watches from its old resourceVersion,
    // gets 410 and lists again.
    let lists_before = pod_lists(&c, c.namespace());
    restart_server(&c).await;
    let deadline = tokio::time::Instant::now() + CONVERGE_GUARD;
    while pod_lists(&c, c.namespace()) <= lists_before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no relist after 410"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    apps.set_total_expected(&id(app), targets(4))
        .await
        .expect("targets");
    assert_eq!(
        converge(&c, &apps, &clock, app, 4).await,
        BTreeSet::from([1, 2, 3, 4])
    );
    assert_eq!(apps.stop(&id(app)).await.expect("stop"), 4);
    c.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_restart_in_the_middle_of_a_scale_up_converges() {
    let Some(c) = RealBackend::start_own("restart", &[]).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let apps = service(&c, &clock);
    let app = "app-restart";
    start(&apps, request(app, c.namespace())).await;
    apps.set_total_expected(&id(app), targets(25))
        .await
        .expect("targets");
    until("the first batch", || async {
        cluster_ids(&c, app).await.len() >= 10
    })
    .await;
    restart_server(&c).await;
    let ids = converge(&c, &apps, &clock, app, 25).await;
    // Creates lost in the restart time out into new ids; none is used twice.
    assert_eq!(ids.len(), 25);
    assert_eq!(apps.stop(&id(app)).await.expect("stop") as usize, 25);
    c.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_stopped_for_seconds_converges() {
    let Some(c) = RealBackend::start_own("etcd-stop", &[]).await else {
        return;
    };
    let clock = ManualClock::starting_now();
    let apps = service(&c, &clock);
    let app = "app-etcd";
    start(&apps, request(app, c.namespace())).await;
    apps.set_total_expected(&id(app), targets(3))
        .await
        .expect("targets");
    converge(&c, &apps, &clock, app, 3).await;
    tokio::task::block_in_place(|| c.server().stop_etcd(3));
    apps.set_total_expected(&id(app), targets(6))
        .await
        .expect("targets");
    let ids = converge(&c, &apps, &clock, app, 6).await;
    assert_eq!(ids.len(), 6);
    apps.stop(&id(app)).await.expect("stop");
    c.finish().await;
}
