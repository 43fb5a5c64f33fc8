//! Memory per WatchExecutors stream that is never read: one application with E Running
//! executors, N streams opened one after another and never read, then churn (every pod
//! annotated C times, so every change reaches every stream). This process's RSS per
//! stream after the opens and after the churn, with the byte bound of each stream's
//! unread changes (`tenants.watch_stream_buffer_bytes`) as given.
use std::time::{Duration, Instant};

use anyhow::bail;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};

use super::harness::{SimProcess, rss_bytes, running, set_target, start_app};
use spark_pod_allocator::allocator::AllocationSettings;
use spark_pod_allocator::app::TenantLimits;
use spark_pod_allocator::config::Settings;

/// What to run.
#[derive(Debug, Clone)]
pub struct StreamsBench {
    /// Running executors of the application.
    pub executors: u32,
    /// Streams opened and never read.
    pub streams: u32,
    /// Times every pod is changed.
    pub churn: u32,
    /// Unread bytes of changes per stream before a full state replaces them.
    pub buffer_bytes: usize,
}

/// Runs the scenario and prints its figures.
pub async fn run(bench: &StreamsBench) -> anyhow::Result<()> {
    let n = bench.executors;
    println!(
        "streams: {} never-read WatchExecutors streams on an application of {n} executors, \
         {} changes of each pod, {} bytes of unread changes per stream at most",
        bench.streams, bench.churn, bench.buffer_bytes
    );
    let sim = SimProcess::start(n).await?;
    let mut config = Settings::default();
    config.kubernetes.qps = 1_000_000;
    config.kubernetes.burst = 1_000_000;
    config.kubernetes.create_concurrency = 64;
    config.tenants = TenantLimits {
        max_watch_streams: usize::try_from(bench.streams).unwrap_or(usize::MAX) + 1,
        watch_stream_buffer_bytes: bench.buffer_bytes,
        ..TenantLimits::default()
    };
    let apps = sim.service(&config);
    let settings = AllocationSettings {
        batch_size: 1000,
        batch_delay: Duration::from_millis(200),
        ..AllocationSettings::default()
    };
    let app = start_app(&apps, "streams-bench", settings).await?;
    set_target(&apps, &app, n).await?;
    let started = Instant::now();
    while running(&apps, &app).await? < n {
        if started.elapsed() > Duration::from_secs(300) {
            bail!("{n} executors not Running within 5 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let baseline = rss_bytes()?;
    let mut held = Vec::new();
    for i in 0..bench.streams {
        held.push(apps.watch_executors(&app, 0, None).await?);
        // Now and then, time for the full states' LISTs (each batch shares one).
        if i % 20 == 19 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let opened = rss_bytes()?;
    let per =
        |rss: u64| rss.saturating_sub(baseline) as f64 / f64::from(bench.streams.max(1)) / 1024.0;
    println!(
        "  baseline {:.1} MiB; after the opens {:.1} MiB: {:.1} KiB per stream",
        mib(baseline),
        mib(opened),
        per(opened)
    );
    let api: Api<Pod> = Api::namespaced(sim.client.clone(), "default");
    let names: Vec<String> = api
        .list(&ListParams::default().labels("spark-app-selector=streams-bench"))
        .await?
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.name)
        .collect();
    for round in 0..bench.churn {
        for name in &names {
            let patch = serde_json::json!({"metadata": {"annotations": {"bench/churn": round.to_string()}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let churned = rss_bytes()?;
    println!(
        "  after {} changes: {:.1} MiB: {:.1} KiB per stream",
        names.len() as u64 * u64::from(bench.churn),
        mib(churned),
        per(churned)
    );
    let refreshed = held.iter().filter(|s| s.refreshes() > 0).count();
    println!("  streams given a fresh full state for reading too slowly: {refreshed}");
    drop(held);
    apps.shutdown().await;
    sim.stop().await;
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
