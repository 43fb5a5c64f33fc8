//! Scale-up: one application asks for N executors; how long until N are Running, under
//! Spark's policy (Spark's default batch 5 and the service's default batch 10) and under
//! ADAPTIVE, against the limit `N / QPS + pod start` measured in the same run (the time
//! from SetTotalExpected to the first executor Running: one create and one pod start).
//!
//! The simulated cluster runs in this process with its auto kubelet (pods start after a
//! seeded random delay), the service core talks to it over real HTTP. `--time-scale S`
//! runs everything S times faster (batch delay, QPS, burst and pod start divided or
//! multiplied by S) and reports times in unscaled seconds: ratios keep their meaning,
//! and the 10,000-executor Spark cases fit in minutes instead of half an hour.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;

use super::plot::{self, Series};
use spark_pod_allocator::allocator::{
    AllocationPolicy, AllocationSettings, ExecutorState, ResourceProfileId,
};
use spark_pod_allocator::app::{AppId, Applications, StartApplication, SystemClock};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::runtime::Builder;
use spark_pod_allocator_sim::{KubeletMode, SimCluster, SimSettings};

/// `bench scale-up` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Executors to scale up to.
    #[arg(long, default_value_t = 1000)]
    pub executors: u32,
    /// Runs of each case (min / median / max are printed).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Cases, comma-separated: `spark-5` (Spark's defaults: batch 5), `spark-10` (the
    /// service's default batch 10), `adaptive`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "spark-5,spark-10,adaptive"
    )]
    pub cases: Vec<Case>,
    /// Speed-up of every duration (batch delay, pod start) and rate (QPS, burst); below 10,
    /// since a batch delay must stay above 100 ms.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The service's mutating requests per second (its default: 50).
    #[arg(long, default_value_t = 50)]
    pub qps: u32,
    /// Burst above the QPS (the service's default: 100).
    #[arg(long, default_value_t = 100)]
    pub burst: u32,
    /// Shortest pod start (binding to Running), in unscaled milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub start_delay_min_ms: u64,
    /// Longest pod start, in unscaled milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub start_delay_max_ms: u64,
    /// Write a PNG of Running executors over time (the first run of each case).
    #[arg(long, value_name = "PATH")]
    pub plot: Option<std::path::PathBuf>,
    /// Give up on a run after this many unscaled seconds.
    #[arg(long, default_value_t = 3600)]
    pub max_seconds: u64,
}

/// A policy and its batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Case {
    /// SPARK policy, batch 5 (Spark's default).
    #[value(name = "spark-5")]
    Spark5,
    /// SPARK policy, batch 10 (the service's default).
    #[value(name = "spark-10")]
    Spark10,
    /// ADAPTIVE policy, batch 10.
    Adaptive,
}

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Spark5 => "SPARK batch 5 (Spark's default)",
            Case::Spark10 => "SPARK batch 10 (service default)",
            Case::Adaptive => "ADAPTIVE (from batch 10)",
        }
    }

    fn settings(self, batch_delay: Duration) -> AllocationSettings {
        let (batch_size, policy) = match self {
            Case::Spark5 => (5, AllocationPolicy::Spark),
            Case::Spark10 => (10, AllocationPolicy::Spark),
            Case::Adaptive => (10, AllocationPolicy::Adaptive),
        };
        AllocationSettings {
            batch_size,
            batch_delay,
            policy,
            ..AllocationSettings::default()
        }
    }
}

/// One run's figures, in unscaled seconds.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// SetTotalExpected to N Running.
    pub elapsed: f64,
    /// SetTotalExpected to the first executor Running.
    pub pod_start: f64,
    /// N / QPS + pod start.
    pub limit: f64,
    /// Writes of the executor-id record.
    pub id_record_writes: u64,
    /// (seconds, Running) samples.
    pub samples: Vec<(f64, u32)>,
}

impl Outcome {
    /// Time to N Running over the limit.
    pub fn ratio(&self) -> f64 {
        self.elapsed / self.limit
    }
}

/// Runs the scenario and prints its table (and writes the plot when asked).
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.time_scale >= 1.0 && args.time_scale < 10.0,
        "--time-scale must be at least 1 and below 10"
    );
    anyhow::ensure!(args.executors > 0, "--executors must be above 0");
    anyhow::ensure!(args.runs > 0, "--runs must be above 0");
    anyhow::ensure!(
        args.start_delay_min_ms <= args.start_delay_max_ms,
        "--start-delay-min-ms must not exceed --start-delay-max-ms"
    );
    println!(
        "scale-up to {} executors: qps {}, burst {}, batch delay 1 s, pod start {}-{} ms, \
         time scale {} (times below in unscaled seconds)",
        args.executors,
        args.qps,
        args.burst,
        args.start_delay_min_ms,
        args.start_delay_max_ms,
        args.time_scale
    );
    let mut series = Vec::new();
    let mut summary = Vec::new();
    for case in &args.cases {
        let mut outcomes = Vec::new();
        for run in 1..=args.runs {
            let outcome = scale_up(&args, *case)
                .await
                .with_context(|| format!("{} run {run}", case.label()))?;
            println!(
                "  {:<34} run {run}: {:>8.1} s to {} Running; limit {:>7.1} s \
                 (pod start {:.2} s); ratio {:.3}; id-record writes {}",
                case.label(),
                outcome.elapsed,
                args.executors,
                outcome.limit,
                outcome.pod_start,
                outcome.ratio(),
                outcome.id_record_writes
            );
            outcomes.push(outcome);
        }
        if let Some(first) = outcomes.first() {
            series.push(Series {
                label: case.label().to_string(),
                points: first.samples.clone(),
            });
        }
        summary.push((*case, outcomes));
    }
    println!("summary (min / median / max of {} runs):", args.runs);
    for (case, outcomes) in &summary {
        let elapsed = spread(outcomes.iter().map(|o| o.elapsed));
        let ratio = spread(outcomes.iter().map(Outcome::ratio));
        println!(
            "  {:<34} time {:.1} / {:.1} / {:.1} s; ratio to limit {:.3} / {:.3} / {:.3}",
            case.label(),
            elapsed.0,
            elapsed.1,
            elapsed.2,
            ratio.0,
            ratio.1,
            ratio.2
        );
    }
    if let Some(path) = &args.plot {
        let title = format!("Running executors, scale-up to {}", args.executors);
        plot::running_over_time(path, &title, "SetTotalExpected", &series)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// Min, median and max.
pub fn spread(values: impl Iterator<Item = f64>) -> (f64, f64, f64) {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(min), Some(max)) => (*min, v[v.len() / 2], *max),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

fn scaled_ms(ms: u64, scale: f64) -> u64 {
    (ms as f64 / scale).round() as u64
}

/// One run: a fresh simulated cluster and service, one application scaled to N.
pub async fn scale_up(args: &Args, case: Case) -> anyhow::Result<Outcome> {
    let scale = args.time_scale;
    let mut sim_settings = SimSettings::default();
    sim_settings.kubelet.mode = KubeletMode::Auto;
    sim_settings.kubelet.pods_per_node = 110;
    sim_settings.kubelet.nodes = args.executors.div_ceil(100).max(1);
    sim_settings.kubelet.start_delay_min_ms = scaled_ms(args.start_delay_min_ms, scale);
    sim_settings.kubelet.start_delay_max_ms = scaled_ms(args.start_delay_max_ms, scale);
    let sim = SimCluster::start(sim_settings)
        .await
        .context("simulated cluster")?;
    let qps = (f64::from(args.qps) * scale).round() as u32;
    let mut config = Settings::default();
    config.kubernetes.qps = qps;
    config.kubernetes.burst = (f64::from(args.burst) * scale).round() as u32;
    let metrics = Metrics::new();
    let apps = Builder::new(
        spark_pod_allocator::k8s::client(sim.kube_config())?,
        Arc::new(SystemClock),
    )
    .with_settings(&config)
    .with_metrics(metrics.clone())
    .build()
    .into_applications();
    let result = measure(args, case, &apps, &metrics, qps).await;
    apps.shutdown().await;
    sim.shutdown().await;
    result
}

async fn measure(
    args: &Args,
    case: Case,
    apps: &Applications,
    metrics: &Metrics,
    qps: u32,
) -> anyhow::Result<Outcome> {
    let scale = args.time_scale;
    let template: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}]}
    }))?;
    let app = AppId::parse("bench-scale-up").map_err(anyhow::Error::msg)?;
    let batch_delay = Duration::from_millis(scaled_ms(1000, scale));
    apps.start(StartApplication {
        app_id: app.clone(),
        namespace: "default".into(),
        driver_pod_name: None,
        templates: BTreeMap::from([(ResourceProfileId(0), template)]),
        pod_name_prefix: None,
        settings: case.settings(batch_delay),
        owner: None,
        claims: Vec::new(),
    })
    .await?;
    let n = args.executors;
    let started = Instant::now();
    apps.set_total_expected(&app, BTreeMap::from([(ResourceProfileId(0), n)]))
        .await?;
    // Counting copies the snapshot: less often for large N.
    let sample_every = Duration::from_millis(if n > 2000 { 100 } else { 50 });
    let give_up = Duration::from_secs_f64(args.max_seconds as f64 / scale);
    let mut samples = Vec::new();
    let mut first_running = None;
    loop {
        let snapshot = apps.snapshot(&app).await?;
        let running = snapshot
            .executors
            .values()
            .filter(|e| e.state == ExecutorState::Running)
            .count();
        let running = u32::try_from(running).unwrap_or(u32::MAX);
        let at = started.elapsed();
        samples.push((at.as_secs_f64() * scale, running));
        if running > 0 && first_running.is_none() {
            first_running = Some(at);
        }
        if running >= n {
            break;
        }
        anyhow::ensure!(
            at < give_up,
            "{running} of {n} Running after {} s",
            args.max_seconds
        );
        tokio::time::sleep(sample_every).await;
    }
    let elapsed = started.elapsed().as_secs_f64() * scale;
    let pod_start = first_running.unwrap_or_default().as_secs_f64() * scale;
    let limit = f64::from(n) / (f64::from(qps) / scale) + pod_start;
    let id_record_writes = counter(
        &metrics.encode(),
        "spark_pod_allocator_id_record_writes_total",
    );
    apps.stop(&app).await?;
    Ok(Outcome {
        elapsed,
        pod_start,
        limit,
        id_record_writes,
        samples,
    })
}

/// A counter's value in the Prometheus text (0 when absent).
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.strip_prefix(name))
        .filter_map(|rest| rest.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .next()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_min_median_max() {
        assert_eq!(spread([3.0, 1.0, 2.0].into_iter()), (1.0, 2.0, 3.0));
        assert_eq!(spread([5.0].into_iter()), (5.0, 5.0, 5.0));
    }

    #[test]
    fn counters_are_read_from_the_prometheus_text() {
        let text = "# HELP x\nspark_pod_allocator_id_record_writes_total 7\nother 3\n";
        assert_eq!(
            counter(text, "spark_pod_allocator_id_record_writes_total"),
            7
        );
        assert_eq!(counter(text, "missing_total"), 0);
    }
}
