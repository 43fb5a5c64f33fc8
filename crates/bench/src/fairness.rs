//! Fair and non-blocking, at the service's default rate limit (50/s, burst 100). First,
//! 50 applications scale up together while IsDeleted is called on them one after another
//! (goal: p99 <= 5 ms, max <= 50 ms; baseline in the same run: the same calls while they
//! are idle). Then one application scales to 10,000 and, once its creates queue at the
//! rate limit, a small application asks for one executor (goal: its pod seen <= 2 s
//! after it asked; its Start-to-pod chain is three rate-limited requests: the id record,
//! then the create, beside the registration write).
use std::time::{Duration, Instant};

use super::harness::{Latencies, SimProcess, ms, report, set_target, start_app};
use spark_pod_allocator::allocator::{AllocationSettings, ExecutorId};
use spark_pod_allocator::app::{AppId, Applications};
use spark_pod_allocator::config::Settings;

/// What to run.
#[derive(Debug, Clone)]
pub struct FairnessBench {
    /// Applications scaling together.
    pub applications: u32,
    /// Executors each asks for.
    pub executors_each: u32,
    /// How long IsDeleted is measured while they scale.
    pub window: Duration,
    /// Executors of the big application the small one runs beside.
    pub big_executors: u32,
}

/// Runs the scenario and prints its figures.
pub async fn run(bench: &FairnessBench) -> anyhow::Result<()> {
    let total = bench.applications * bench.executors_each;
    println!(
        "fairness: {} applications x {} executors at the default rate limit (50/s, burst 100)",
        bench.applications, bench.executors_each
    );
    let sim = SimProcess::start(total + 100).await?;
    let apps = sim.service(&Settings::default());
    let settings = AllocationSettings::default();
    let mut ids = Vec::new();
    for i in 0..bench.applications {
        ids.push(start_app(&apps, &format!("big-{i}"), settings.clone()).await?);
    }
    let idle = is_deleted_for(&apps, &ids, Duration::from_secs(2)).await?;
    println!("  IsDeleted, idle (baseline): {idle}");
    for app in &ids {
        set_target(&apps, app, bench.executors_each).await?;
    }
    let busy = is_deleted_for(&apps, &ids, bench.window).await?;
    println!(
        "  IsDeleted, {} applications scaling: {busy}",
        bench.applications
    );
    report("  IsDeleted p99", ms(busy.p99), 5.0, "ms");
    report("  IsDeleted max", ms(busy.max), 50.0, "ms");
    if idle.p99 > Duration::ZERO {
        println!(
            "  p99 ratio to idle (same run): {:.2}",
            busy.p99.as_secs_f64() / idle.p99.as_secs_f64()
        );
    }
    let mut created = 0;
    for app in &ids {
        created += apps.status(app).await?.last_executor_id;
    }
    println!(
        "  executors requested by the {} applications in the window: {created} (the rate limit allows ~{})",
        bench.applications,
        100 + 50 * bench.window.as_secs()
    );
    apps.shutdown().await;
    sim.stop().await;
    small_behind_big(bench.big_executors).await
}

/// One application scales to `big`; a small one asks for one executor once the big one's
/// creates queue at the rate limit. Prints the small one's time to its first pod.
async fn small_behind_big(big: u32) -> anyhow::Result<()> {
    let sim = SimProcess::start(big + 100).await?;
    let apps = sim.service(&Settings::default());
    let settings = AllocationSettings {
        batch_size: 1000,
        ..AllocationSettings::default()
    };
    let big_app = start_app(&apps, "big", settings).await?;
    let small = start_app(&apps, "small", AllocationSettings::default()).await?;
    set_target(&apps, &big_app, big).await?;
    // The burst is spent and the big application's creates wait at the rate limit.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = Instant::now();
    set_target(&apps, &small, 1).await?;
    let first = loop {
        if !apps.snapshot(&small).await?.executors.is_empty() {
            break asked.elapsed();
        }
        if asked.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("the small application's executor not seen within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let big_requested = apps.status(&big_app).await?.last_executor_id;
    println!(
        "  one application scaling to {big} ({big_requested} requested so far); a small one asks for 1:"
    );
    report(
        "  small application: its first executor pod seen after",
        first.as_secs_f64(),
        2.0,
        "s",
    );
    apps.shutdown().await;
    sim.stop().await;
    Ok(())
}

/// IsDeleted called back to back, round-robin over `apps`, for `window`.
async fn is_deleted_for(
    apps: &Applications,
    ids: &[AppId],
    window: Duration,
) -> anyhow::Result<Latencies> {
    let until = Instant::now() + window;
    let mut samples = Vec::new();
    let mut i = 0usize;
    while Instant::now() < until {
        let app = &ids[i % ids.len()];
        let started = Instant::now();
        apps.is_deleted(app, ExecutorId(1)).await?;
        samples.push(started.elapsed());
        i += 1;
        // A caller, not a load generator: one call per millisecond at most.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(Latencies::of(samples))
}
