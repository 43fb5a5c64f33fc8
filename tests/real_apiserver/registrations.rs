//! Registrations that Stop revokes, on the simulator and on a real kube-apiserver (with the
//! chart's rights only): a registration copied before its application's Stop and written
//! back afterwards by an admin, with the same name, labels and data (as a backup restore
//! does), is a new object with a new uid. A restarted service does not resume it, creates
//! nothing of it and counts it `replayed`, while a live application beside it resumes.
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use spark_pod_allocator::app::{Applications, ManualClock};
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::runtime::Builder;
use test_kit::cluster::{Cluster, cluster_ids};
use test_kit::service::{
    id, range, registration_config_map, start, start_application as request, stored_registration,
    targets,
};
use test_kit::wait::until;

mod a_registration_written_back_after_stop_is_not_resumed {
    #[tokio::test]
    async fn simulator() {
        let cluster = test_kit::cluster::SimBackend::start().await;
        super::a_registration_written_back_after_stop_is_not_resumed(&cluster).await;
        test_kit::cluster::Cluster::finish(&cluster).await;
    }

    #[tokio::test]
    async fn real_api_server() {
        let Some(cluster) = test_kit::cluster::RealBackend::start("replayed").await else {
            return;
        };
        super::a_registration_written_back_after_stop_is_not_resumed(&cluster).await;
        test_kit::cluster::Cluster::finish(&cluster).await;
    }
}

/// The service core on `c`, recording into `metrics`.
fn service(c: &impl Cluster, clock: &ManualClock, metrics: &Metrics) -> Applications {
    Builder::new(c.service_client(), Arc::new(clock.clone()))
        .with_settings(&c.service_settings())
        .with_metrics(metrics.clone())
        .build()
        .into_applications()
}

async fn a_registration_written_back_after_stop_is_not_resumed(c: &impl Cluster) {
    let clock = ManualClock::starting_now();
    let apps = service(c, &clock, &Metrics::new());
    let (admin, service_ns, ns) = (c.admin_client(), c.service_namespace(), c.namespace());
    for app in ["rv-kept", "rv-stopped"] {
        start(&apps, request(app, ns)).await;
        apps.set_total_expected(&id(app), targets(2))
            .await
            .expect("targets");
    }
    for app in ["rv-kept", "rv-stopped"] {
        until(
            &format!("{app}'s pods and proven registration"),
            async || {
                clock.advance(std::time::Duration::from_secs(1));
                cluster_ids(c, app).await == range(1, 2)
                    && stored_registration(&admin, service_ns, ns, app)
                        .await
                        .is_some_and(|r| r.targets.get(&0) == Some(&2))
            },
        )
        .await;
    }
    let copy = registration_config_map(&admin, service_ns, ns, "rv-stopped")
        .await
        .expect("rv-stopped's registration");
    apps.stop(&id("rv-stopped")).await.expect("Stop");
    assert!(
        registration_config_map(&admin, service_ns, ns, "rv-stopped")
            .await
            .is_none(),
        "Stop deletes the registration"
    );
    // Written back as a backup restore writes it: the same name, labels and data.
    let api: Api<ConfigMap> = Api::namespaced(admin.clone(), service_ns);
    let restored = api
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: copy.metadata.name.clone(),
                    labels: copy.metadata.labels.clone(),
                    ..ObjectMeta::default()
                },
                data: copy.data.clone(),
                ..ConfigMap::default()
            },
        )
        .await
        .expect("write the copy back");
    assert_eq!(restored.data, copy.data);
    assert_ne!(restored.metadata.uid, copy.metadata.uid);
    apps.shutdown().await;

    let metrics = Metrics::new();
    let restarted = service(c, &clock, &metrics);
    let resumed = restarted.resume_registered().await.expect("resume");
    assert_eq!(resumed, [id("rv-kept")], "{}", c.backend());
    assert!(
        metrics
            .encode()
            .contains("spark_pod_allocator_registrations_refused_total{reason=\"replayed\"} 1"),
        "{}",
        metrics.encode()
    );
    // Rounds run: the live one keeps its pods; none of the stopped one's is made again.
    let before = restarted.rounds(&id("rv-kept")).await.expect("rounds");
    until("two rounds of the resumed service", async || {
        clock.advance(std::time::Duration::from_secs(1));
        restarted.rounds(&id("rv-kept")).await.expect("rounds") >= before + 2
    })
    .await;
    assert!(cluster_ids(c, "rv-stopped").await.is_empty());
    assert!(restarted.status(&id("rv-stopped")).await.is_err());
    assert_eq!(cluster_ids(c, "rv-kept").await, range(1, 2));
    restarted.stop(&id("rv-kept")).await.expect("Stop");
}
