//! Many applications: N applications start, then each asks for one executor at once (a
//! burst of SetTotalExpected) while GetStatus is called on them; then all stop at once.
//! Goals (N = 2,000): GetStatus p99 <= 10 ms under the burst; the Stops done in <= 10 s.
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::harness::{Latencies, SimProcess, ms, report, set_target, start_app};
use spark_pod_allocator::allocator::AllocationSettings;
use spark_pod_allocator::app::AppId;
use spark_pod_allocator::config::Settings;

/// What to run.
#[derive(Debug, Clone)]
pub struct ManyAppsBench {
    pub applications: u32,
    /// The shared rate limit of mutating requests (each Stop sends two).
    pub qps: u32,
}

/// Runs the scenario and prints its figures.
pub async fn run(bench: &ManyAppsBench) -> anyhow::Result<()> {
    let n = bench.applications;
    println!("many applications: {n}, rate limit {}/s", bench.qps);
    let sim = SimProcess::start(n + 100).await?;
    let mut config = Settings::default();
    config.kubernetes.qps = bench.qps;
    config.kubernetes.burst = bench.qps * 2;
    let apps = sim.service(&config);
    let started = Instant::now();
    let ids: Vec<AppId> = futures::stream::iter(0..n)
        .map(|i| {
            let apps = apps.clone();
            async move { start_app(&apps, &format!("app-{i}"), AllocationSettings::default()).await }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    println!("  {n} started in {:.1} s", started.elapsed().as_secs_f64());
    // The burst, from 64 callers at once, while GetStatus runs beside it.
    let burst_apps = apps.clone();
    let burst_ids = ids.clone();
    let burst = tokio::spawn(async move {
        let started = Instant::now();
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(burst_ids)
            .map(|app| {
                let apps = burst_apps.clone();
                async move { set_target(&apps, &app, 1).await }
            })
            .buffer_unordered(64)
            .collect()
            .await;
        results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
        anyhow::Ok(started.elapsed())
    });
    let until = Instant::now() + Duration::from_secs(10);
    let mut samples = Vec::new();
    let mut i = 0usize;
    while Instant::now() < until {
        let app = &ids[i % ids.len()];
        let call = Instant::now();
        apps.application_status(app).await?;
        samples.push(call.elapsed());
        i += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let burst_took = burst.await??;
    let status = Latencies::of(samples);
    println!(
        "  SetTotalExpected burst answered in {:.2} s; GetStatus over 10 s: {status}",
        burst_took.as_secs_f64()
    );
    report("  GetStatus p99", ms(status.p99), 10.0, "ms");
    let started = Instant::now();
    let stops: Vec<_> = ids
        .iter()
        .map(|app| {
            let apps = apps.clone();
            let app = app.clone();
            tokio::spawn(async move { apps.stop(&app).await })
        })
        .collect();
    let mut failed = 0;
    for stop in stops {
        if !matches!(stop.await, Ok(Ok(_))) {
            failed += 1;
        }
    }
    let took = started.elapsed().as_secs_f64();
    println!(
        "  {n} Stops at once: {took:.2} s ({failed} failed); the rate limit alone needs {:.1} s",
        f64::from(2 * n) / f64::from(bench.qps.max(1))
    );
    report("  Stops", took, 10.0, "s");
    apps.shutdown().await;
    sim.stop().await;
    Ok(())
}
