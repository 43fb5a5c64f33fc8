//! Memory per executor: one application scales to N Running executors, then the periodic
//! resync (a paginated LIST) runs over and over; this process's resident memory is
//! sampled throughout. Goal: <= 2 KiB per executor in steady state, peak <= 1.3 x steady.
use std::time::{Duration, Instant};

use anyhow::bail;

use super::harness::{SimProcess, report, rss_bytes, running, set_target, start_app};
use spark_pod_allocator::allocator::AllocationSettings;
use spark_pod_allocator::config::Settings;

/// What to run.
#[derive(Debug, Clone)]
pub struct MemoryBench {
    /// Running executors to reach.
    pub executors: u32,
    /// Full LISTs to run once they all run.
    pub resyncs: u32,
    /// The period of the full LIST.
    pub resync_interval: Duration,
}

/// Runs the scenario and prints its figures.
pub async fn run(bench: &MemoryBench) -> anyhow::Result<()> {
    let n = bench.executors;
    println!(
        "memory: {n} executors, {} resyncs every {:?} (simulator in its own process)",
        bench.resyncs, bench.resync_interval
    );
    let sim = SimProcess::start(n).await?;
    // LISTs back to back at the interval whatever the pods followed: their memory is the
    // figure.
    let mut config = Settings::default();
    config.resync_interval_ms =
        u64::try_from(bench.resync_interval.as_millis()).unwrap_or(u64::MAX);
    config.resync_pods_per_second = 0;
    config.kubernetes.qps = 1_000_000;
    config.kubernetes.burst = 1_000_000;
    config.kubernetes.create_concurrency = 64;
    let apps = sim.service(&config);
    let settings = AllocationSettings {
        batch_size: 1000,
        batch_delay: Duration::from_millis(200),
        ..AllocationSettings::default()
    };
    let app = start_app(&apps, "memory-bench", settings).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = rss_bytes()?;
    let started = Instant::now();
    set_target(&apps, &app, n).await?;
    let mut peak_scale_up = baseline;
    loop {
        peak_scale_up = peak_scale_up.max(rss_bytes()?);
        if running(&apps, &app).await? >= n {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("{n} executors not Running within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let scaled = rss_bytes()?;
    println!(
        "  {n} Running after {:.1} s; RSS {:.1} MiB (baseline {:.1} MiB, peak during scale-up {:.1} MiB)",
        started.elapsed().as_secs_f64(),
        mib(scaled),
        mib(baseline),
        mib(peak_scale_up)
    );
    // Sample through the resyncs; the first interval settles after the scale-up.
    let window = bench.resync_interval * bench.resyncs;
    let until = Instant::now() + window;
    let mut samples = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        samples.push(rss_bytes()?);
    }
    let still_running = running(&apps, &app).await?;
    if still_running < n {
        println!(
            "  note: {still_running} of {n} Running after the resyncs (an executor was replaced)"
        );
    }
    let peak = samples.iter().copied().max().unwrap_or(scaled);
    let mut sorted = samples.clone();
    sorted.sort_unstable();
    let steady = sorted.get(sorted.len() / 2).copied().unwrap_or(scaled);
    let last = samples.last().copied().unwrap_or(scaled);
    let per_executor = steady.saturating_sub(baseline) as f64 / f64::from(n);
    println!(
        "  over {} resyncs: RSS steady (median) {:.1} MiB, peak {:.1} MiB, last {:.1} MiB",
        bench.resyncs,
        mib(steady),
        mib(peak),
        mib(last)
    );
    report(
        "  memory per executor (steady RSS - baseline) / N",
        per_executor / 1024.0,
        2.0,
        "KiB",
    );
    report(
        "  peak / steady over the resyncs",
        peak as f64 / steady.max(1) as f64,
        1.3,
        "x",
    );
    report(
        "  drift: last / steady",
        last as f64 / steady.max(1) as f64,
        1.1,
        "x",
    );
    apps.shutdown().await;
    sim.stop().await;
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}
