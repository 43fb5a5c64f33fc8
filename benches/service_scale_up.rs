//! Scale-up throughput of the service core: one application asks for N executors in one
//! round, created through the shared pod client against the simulated cluster over real
//! HTTP. Baseline (same run): creates one at a time (`create_concurrency = 1`); measured:
//! the default concurrency (16). Prints pods/s and the ratio.
//!
//! Run: `cargo bench --bench service_scale_up` (N from `SERVICE_BENCH_PODS`, default 2000).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use spark_pod_allocator::allocator::{AllocationSettings, ResourceProfileId};
use spark_pod_allocator::app::limits::RequestLimits;
use spark_pod_allocator::app::{AppId, ManualClock, StartApplication};
use spark_pod_allocator::config::Settings;

async fn scale_up(pods: u32, create_concurrency: u32) -> Duration {
    let sim = test_kit::sim::manual_cluster().await;
    let clock = ManualClock::starting_now();
    let mut config = Settings::default();
    config.kubernetes.qps = 1_000_000;
    config.kubernetes.burst = 1_000_000;
    config.kubernetes.create_concurrency = create_concurrency;
    config.limits = RequestLimits {
        max_creates_per_round: pods,
        ..RequestLimits::default()
    };
    let apps =
        test_kit::service::applications(sim.try_client().expect("sim client"), &clock, config);
    let app = AppId::parse("bench").expect("app id");
    apps.start(StartApplication {
        app_id: app.clone(),
        namespace: "default".into(),
        driver_pod_name: None,
        templates: BTreeMap::from([(ResourceProfileId(0), test_kit::service::template_pod())]),
        pod_name_prefix: None,
        settings: AllocationSettings {
            batch_size: pods,
            ..AllocationSettings::default()
        },
        owner: None,
        claims: Vec::new(),
    })
    .await
    .expect("start");
    while apps.rounds(&app).await.expect("rounds") < 1 {
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    apps.set_total_expected(&app, BTreeMap::from([(ResourceProfileId(0), pods)]))
        .await
        .expect("targets");
    // The notified round returns once every create has been answered.
    while apps.rounds(&app).await.expect("rounds") < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    let api: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let created = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .len();
    assert_eq!(created, pods as usize, "every create reached the cluster");
    apps.stop(&app).await.expect("stop");
    sim.shutdown().await;
    elapsed
}

fn main() {
    let pods: u32 = std::env::var("SERVICE_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // Warm-up (connections, allocator paths), not reported.
        scale_up(pods / 10 + 1, 16).await;
        let serial = scale_up(pods, 1).await;
        let concurrent = scale_up(pods, 16).await;
        let rate = |d: Duration| f64::from(pods) / d.as_secs_f64();
        println!("service_scale_up: {pods} executor pods in one round");
        println!(
            "  baseline create_concurrency=1 : {:>8.1} ms  {:>8.0} pods/s",
            serial.as_secs_f64() * 1e3,
            rate(serial)
        );
        println!(
            "  create_concurrency=16        : {:>8.1} ms  {:>8.0} pods/s",
            concurrent.as_secs_f64() * 1e3,
            rate(concurrent)
        );
        println!(
            "  ratio (concurrent / baseline throughput): {:.2}x",
            serial.as_secs_f64() / concurrent.as_secs_f64()
        );
    });
}
