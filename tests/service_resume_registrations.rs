//! The registrations a service keeps in Kubernetes, over real HTTP against the simulated
//! cluster: what they hold and where (the service's namespace, signed, labelled with the
//! application's namespace and id, never owned by a pod of another namespace), a new
//! service resuming them by itself (targets and registered executors included), and a
//! registration whose driver pod ended meanwhile deleted instead of resumed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use spark_pod_allocator::allocator::{AllocationSettings, ExecutorId};
use spark_pod_allocator::app::registration::Registration;
use spark_pod_allocator::app::{AppId, Applications, ManualClock, StartApplication};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::k8s::IdRecord;
use spark_pod_allocator::k8s::registrations::{
    APPLICATION_NAMESPACE_LABEL, PROOF_KEY, PROOF_UID_KEY,
};
use spark_pod_allocator_sim::SimCluster;
use test_kit::service::{P0, registration_config_map, stored_registration, template_pod};
use test_kit::wait::until;

const NS: &str = "team-a";
/// The service's own namespace, where it keeps the registrations.
const SERVICE_NS: &str = "spark-system";

fn request(app: &str, driver: Option<&str>) -> StartApplication {
    StartApplication {
        app_id: AppId::parse(app).unwrap(),
        namespace: NS.into(),
        driver_pod_name: driver.map(str::to_string),
        templates: BTreeMap::from([(P0, template_pod())]),
        pod_name_prefix: None,
        settings: AllocationSettings {
            batch_delay: Duration::from_secs(1),
            max_executors: Some(50),
            ..AllocationSettings::default()
        },
        owner: None,
        claims: Vec::new(),
    }
}

fn applications(sim: &SimCluster, clock: &ManualClock) -> Applications {
    let client = sim.try_client().expect("sim client");
    let mut options = Settings::default();
    options.registrations.namespace = Some(SERVICE_NS.into());
    test_kit::service::applications(client, clock, options)
}

async fn registration(sim: &SimCluster, app: &str) -> Option<Registration> {
    let client = sim.try_client().expect("client");
    stored_registration(&client, SERVICE_NS, NS, app).await
}

#[tokio::test]
async fn a_new_service_resumes_registrations_and_drops_those_of_ended_drivers() {
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = vec![NS.into(), SERVICE_NS.into()];
    let sim = test_kit::sim::start(settings).await;
    let clock = ManualClock::starting_now();
    let apps = applications(&sim, &clock);
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("client"), NS);

    // app-a without a driver pod; app-b with one (spark-submit's labels).
    apps.start(request("app-a", None)).await.expect("start a");
    let driver: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "driver-b", "labels": {"spark-role": "driver", "spark-app-selector": "app-b"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .unwrap();
    let driver = pods
        .create(&PostParams::default(), &driver)
        .await
        .expect("driver");
    apps.start(request("app-b", Some("driver-b")))
        .await
        .expect("start b");
    let a = AppId::parse("app-a").unwrap();
    apps.set_total_expected(&a, BTreeMap::from([(P0, 3)]))
        .await
        .unwrap();
    apps.update_registered(&a, BTreeSet::from([ExecutorId(1)]))
        .await
        .unwrap();
    until("app-a's registration written", || async {
        clock.advance(Duration::from_secs(1));
        registration(&sim, "app-a")
            .await
            .is_some_and(|r| r.targets.get(&0) == Some(&3) && r.registered.contains(&1))
    })
    .await;
    let stored = registration(&sim, "app-a").await.unwrap();
    assert_eq!(stored.settings.max_executors, Some(50));
    assert_eq!(stored.driver_pod_name, None);
    until("app-b's registration written", || async {
        registration(&sim, "app-b").await.is_some()
    })
    .await;
    // Kept in the service's namespace, signed, labelled with where the application runs;
    // owned by no pod: an owner in another namespace would have the garbage collector
    // delete it (the service deletes it when the driver ends).
    let client = sim.try_client().expect("client");
    let kept = registration_config_map(&client, SERVICE_NS, NS, "app-b")
        .await
        .unwrap();
    assert!(
        kept.metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );
    let labels = kept.metadata.labels.unwrap_or_default();
    assert_eq!(labels[APPLICATION_NAMESPACE_LABEL], NS);
    assert_eq!(labels["spark-app-selector"], "app-b");
    // Proven for the ConfigMap it is kept in.
    let data = kept.data.unwrap_or_default();
    assert!(!data[PROOF_KEY].is_empty());
    assert_eq!(Some(&data[PROOF_UID_KEY]), kept.metadata.uid.as_ref());
    assert!(driver.metadata.uid.is_some());
    // Nothing of it in the application's namespace: app-b's id record is on its driver pod.
    let tenant: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    assert!(
        tenant
            .get_opt(&IdRecord::config_map_name("app-b"))
            .await
            .unwrap()
            .is_none()
    );
    until("app-a's id record written in its namespace", || async {
        clock.advance(Duration::from_secs(1));
        tenant
            .get_opt(&IdRecord::config_map_name("app-a"))
            .await
            .unwrap()
            .is_some()
    })
    .await;

    // The service goes; meanwhile app-b's driver succeeds.
    apps.shutdown().await;
    pods.patch_status(
        "driver-b",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": "Succeeded"}})),
    )
    .await
    .unwrap();

    let apps = applications(&sim, &clock);
    let resumed = apps.resume_registered().await.expect("resume");
    assert_eq!(resumed, vec![a.clone()]);
    let status = apps.status(&a).await.expect("app-a runs again");
    assert_eq!(status.profiles[&P0].target, 3);
    assert!(
        registration(&sim, "app-b").await.is_none(),
        "an ended driver's registration is deleted"
    );
    assert!(matches!(
        apps.status(&AppId::parse("app-b").unwrap()).await,
        Err(spark_pod_allocator::app::AppError::NotFound(_))
    ));
    apps.stop(&a).await.expect("stop");
    assert!(registration(&sim, "app-a").await.is_none());
    assert!(
        tenant
            .get_opt(&IdRecord::config_map_name("app-a"))
            .await
            .unwrap()
            .is_none(),
        "Stop deleted app-a's id record too"
    );
}
