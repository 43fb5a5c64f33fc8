//! Exact deletion state over real HTTP against the simulated cluster: IsDeleted and the
//! deleted executors follow the watch (false as soon as the pod is gone, with no round and
//! no resync in between), are rebuilt by a restarted service from pods that carry a
//! deletionTimestamp, and Stop counts only the pods it deleted itself.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use spark_pod_allocator::allocator::{AllocationSettings, ExecutorId};
use spark_pod_allocator::app::{AppId, Applications, ManualClock, StartApplication};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator_sim::SimCluster;
use test_kit::service::{P0, template_pod};
use test_kit::sim::manual_cluster;
use test_kit::wait::until;

const NS: &str = "default";
const APP: &str = "app-del";

fn app() -> AppId {
    AppId::parse(APP).unwrap()
}

fn request() -> StartApplication {
    StartApplication {
        app_id: app(),
        namespace: NS.into(),
        driver_pod_name: None,
        templates: BTreeMap::from([(P0, template_pod())]),
        pod_name_prefix: None,
        settings: AllocationSettings {
            batch_delay: Duration::from_secs(1),
            ..AllocationSettings::default()
        },
        owner: None,
        claims: Vec::new(),
    }
}

fn applications(sim: &SimCluster, clock: &ManualClock) -> Applications {
    let client = sim.try_client().expect("sim client");
    test_kit::service::applications(client, clock, Settings::default())
}

/// Plays the scheduler: a bound pod's deletion is graceful (it stays, terminating).
async fn bind(sim: &SimCluster, exec: u64) {
    let client = sim.try_client().expect("sim client");
    test_kit::sim::bind(&client, NS, &format!("{APP}-exec-{exec}"))
        .await
        .expect("binding");
}

fn pods(sim: &SimCluster) -> Api<Pod> {
    Api::namespaced(sim.try_client().expect("sim client"), NS)
}

async fn deleted_ids(apps: &Applications) -> BTreeSet<u64> {
    let status = apps.status(&app()).await.expect("status");
    status.deleted.iter().map(|id| id.0).collect()
}

async fn is_deleted(apps: &Applications, exec: u64) -> bool {
    apps.is_deleted(&app(), ExecutorId(exec))
        .await
        .expect("is_deleted")
}

#[tokio::test]
async fn deletion_state_follows_the_watch_survives_a_restart_and_stop_counts_its_own() {
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    let apps = applications(&sim, &clock);
    apps.start(request()).await.expect("start");
    apps.set_total_expected(&app(), BTreeMap::from([(P0, 4)]))
        .await
        .unwrap();
    until("4 pods", || async {
        pods(&sim)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len()
            == 4
    })
    .await;
    for exec in 1..=4 {
        bind(&sim, exec).await;
    }
    // Downscale to 1 once the pending pods are past the idle timeout (60 s).
    apps.set_total_expected(&app(), BTreeMap::from([(P0, 1)]))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(61));
    until("3 executors deleted", || async {
        deleted_ids(&apps).await.len() == 3
    })
    .await;
    let deleted = deleted_ids(&apps).await;
    let kept = *BTreeSet::from([1, 2, 3, 4])
        .difference(&deleted)
        .next()
        .unwrap();
    for exec in &deleted {
        assert!(is_deleted(&apps, *exec).await);
    }
    until("the deletes carried out (pods terminating)", || async {
        let list = pods(&sim).list(&Default::default()).await.unwrap().items;
        list.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
            .count()
            == 3
    })
    .await;

    // The kubelet finishes one: IsDeleted turns false as soon as the watch says it is
    // gone; no time passes on the service's clock (no round, no resync).
    let mut terminating = deleted.iter().copied();
    let gone = terminating.next().unwrap();
    let still: BTreeSet<u64> = terminating.collect();
    pods(&sim)
        .delete(
            &format!("{APP}-exec-{gone}"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .unwrap();
    until("the gone pod no longer deleted", || async {
        !is_deleted(&apps, gone).await
    })
    .await;
    assert_eq!(deleted_ids(&apps).await, still);
    for exec in &still {
        assert!(is_deleted(&apps, *exec).await);
    }

    // A restarted service knows which executors are being deleted, before any round.
    apps.shutdown().await;
    let apps = applications(&sim, &clock);
    let started = apps.start(request()).await.expect("resume");
    assert!(started.resumed);
    assert_eq!(deleted_ids(&apps).await, still);
    for exec in &still {
        assert!(is_deleted(&apps, *exec).await, "executor {exec}");
    }
    assert!(!is_deleted(&apps, kept).await);

    // Stop deletes all; it reports only the pod it deleted, not those already terminating.
    let stopped = apps.stop(&app()).await.expect("stop");
    assert_eq!(stopped, 1, "only executor {kept} was deleted by Stop");
}
