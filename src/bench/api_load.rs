//! API load on the real control plane: many applications through one service against
//! Spark drivers with their own allocator, each side in namespaces of its own, in the same
//! run. Requests are counted from the API server's audit log by User-Agent, during the
//! scale-up (the start to every executor Running) and per minute at steady state.
//!
//! The service side runs every application. The Spark side runs `--spark-drivers` real
//! drivers (a JVM each: 50 would not fit this machine's two cores); every driver watches
//! and polls for its own pods only, so the Spark figures are per driver, scaled to the
//! service side's application count.
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::control_plane::{
    AuditWindow, ClusterArgs, ControlPlane, RunningWatch, is_service, is_spark,
    prepare_spark_driver, start_application,
};
use super::scale_up::spread;
use crate::proto;

/// `bench api-load` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Applications through the service.
    #[arg(long, default_value_t = 50)]
    pub applications: u32,
    /// Spark drivers with their own allocator (a JVM each).
    #[arg(long, default_value_t = 10)]
    pub spark_drivers: u32,
    /// Executors of each application and each driver.
    #[arg(long, default_value_t = 10)]
    pub executors_each: u32,
    /// Namespaces each side's applications are spread over.
    #[arg(long, default_value_t = 5)]
    pub namespaces: u32,
    /// Seconds of steady state measured after the scale-up.
    #[arg(long, default_value_t = 120)]
    pub steady_s: u64,
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// The Spark drivers' heap (Spark refuses to start below about 470 MB).
    #[arg(long, default_value = "512m")]
    pub driver_heap: String,
}

/// One side's requests in one run.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// The start to every executor Running.
    scale_up: f64,
    /// Per minute of steady state.
    steady_per_minute: f64,
    /// Seconds to every executor Running.
    seconds: f64,
}

/// Runs the scenario and prints its figures.
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.applications > 0 && args.spark_drivers > 0 && args.namespaces > 0 && args.runs > 0,
        "--applications, --spark-drivers, --namespaces and --runs must be above 0"
    );
    prepare_spark_driver(&args.cluster.spark_driver).await?;
    let pods = (args.applications + args.spark_drivers) * args.executors_each;
    let cluster = ControlPlane::start(&args.cluster, pods).await?;
    println!(
        "api-load: {} applications through the service against {} Spark drivers (scaled to \
         {}), {} executors each, {} namespaces per side, {} s of steady state",
        args.applications,
        args.spark_drivers,
        args.applications,
        args.executors_each,
        args.namespaces,
        args.steady_s
    );
    let result = measure_runs(&args, &cluster).await;
    cluster.stop().await;
    let runs = result?;
    // The Spark side is per driver.
    let scale = f64::from(args.applications);
    println!("summary (min / median / max of {} runs):", args.runs);
    let ratio_up = spread(runs.iter().map(|(s, p)| s.scale_up / (p.scale_up * scale)));
    let ratio_steady = spread(
        runs.iter()
            .map(|(s, p)| s.steady_per_minute / (p.steady_per_minute * scale)),
    );
    let service_up = spread(runs.iter().map(|(s, _)| s.scale_up));
    let spark_up = spread(runs.iter().map(|(_, p)| p.scale_up * scale));
    let service_steady = spread(runs.iter().map(|(s, _)| s.steady_per_minute));
    let spark_steady = spread(runs.iter().map(|(_, p)| p.steady_per_minute * scale));
    println!(
        "  scale-up requests: service {:.0} / {:.0} / {:.0}; Spark drivers (scaled) {:.0} / \
         {:.0} / {:.0}; ratio {:.3} / {:.3} / {:.3}",
        service_up.0,
        service_up.1,
        service_up.2,
        spark_up.0,
        spark_up.1,
        spark_up.2,
        ratio_up.0,
        ratio_up.1,
        ratio_up.2
    );
    println!(
        "  steady requests per minute: service {:.1} / {:.1} / {:.1}; Spark drivers (scaled) \
         {:.1} / {:.1} / {:.1}; ratio {:.3} / {:.3} / {:.3}",
        service_steady.0,
        service_steady.1,
        service_steady.2,
        spark_steady.0,
        spark_steady.1,
        spark_steady.2,
        ratio_steady.0,
        ratio_steady.1,
        ratio_steady.2
    );
    for (what, ratio) in [("scale-up", ratio_up.1), ("steady state", ratio_steady.1)] {
        println!(
            "goal: {what}, the service's requests <= 1/20 of the Spark drivers': {ratio:.3} {}",
            if ratio <= 0.05 { "met" } else { "MISSED" }
        );
    }
    Ok(())
}

async fn measure_runs(args: &Args, cluster: &ControlPlane) -> anyhow::Result<Vec<(Load, Load)>> {
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        let service = service_side(args, cluster, run)
            .await
            .with_context(|| format!("the service's side, run {run}"))?;
        let spark = spark_side(args, cluster, run)
            .await
            .with_context(|| format!("the Spark drivers' side, run {run}"))?;
        for (who, load, n) in [
            ("service", service, args.applications),
            ("Spark, per driver", spark, args.spark_drivers),
        ] {
            println!(
                "  run {run} {who:<17} ({n:>3}): {:>6.1} s to every executor Running; \
                 requests during the scale-up {:>6.0}, per minute at steady state {:>6.1}",
                load.seconds, load.scale_up, load.steady_per_minute
            );
        }
        runs.push((service, spark));
    }
    Ok(runs)
}

fn namespaces(side: &str, run: u32, count: u32) -> Vec<String> {
    (0..count)
        .map(|k| format!("bench-load-{side}-{run}-{k}"))
        .collect()
}

/// One side's namespaces, each watched for its Running executors.
struct Side {
    namespaces: Vec<String>,
    watches: Vec<RunningWatch>,
}

impl Side {
    async fn open(
        cluster: &ControlPlane,
        side: &str,
        run: u32,
        count: u32,
    ) -> anyhow::Result<Self> {
        let namespaces = namespaces(side, run, count);
        for namespace in &namespaces {
            cluster.create_namespace(namespace).await?;
        }
        let watches = namespaces
            .iter()
            .map(|ns| RunningWatch::start(cluster.client.clone(), ns))
            .collect();
        Ok(Self {
            namespaces,
            watches,
        })
    }

    /// The namespace of the `k`-th application or driver (round robin).
    fn namespace(&self, k: u32) -> &str {
        &self.namespaces[k as usize % self.namespaces.len()]
    }

    /// Waits for `total` Running (`alive` fails the wait early), then counts the requests
    /// `sent` matches: during the scale-up (since `scale_up` opened, at `started`) and per
    /// minute over `steady_s` seconds after it, each divided by `per` (1, or the drivers).
    #[allow(clippy::too_many_arguments)]
    async fn measure(
        &self,
        cluster: &ControlPlane,
        scale_up: AuditWindow,
        started: Instant,
        total: u32,
        steady_s: u64,
        per: u32,
        sent: fn(&str) -> bool,
        alive: impl FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<Load> {
        wait_all(&self.watches, total, Duration::from_secs(900), alive).await?;
        let seconds = started.elapsed().as_secs_f64();
        let up = scale_up.count(sent)?.total;
        let steady = AuditWindow::open(&cluster.audit_log())?;
        tokio::time::sleep(Duration::from_secs(steady_s)).await;
        let steady = steady.count(sent)?.total;
        let per = f64::from(per);
        Ok(Load {
            scale_up: up as f64 / per,
            steady_per_minute: steady as f64 * 60.0 / steady_s as f64 / per,
            seconds,
        })
    }

    async fn close(self, cluster: &ControlPlane) -> anyhow::Result<()> {
        drop(self.watches);
        for namespace in &self.namespaces {
            cluster.delete_namespace(namespace).await?;
        }
        Ok(())
    }
}

async fn service_side(args: &Args, cluster: &ControlPlane, run: u32) -> anyhow::Result<Load> {
    let side = Side::open(cluster, "svc", run, args.namespaces).await?;
    let scale_up = AuditWindow::open(&cluster.audit_log())?;
    let started = Instant::now();
    let service = cluster.serve(&side.namespaces[0], false, 16).await?;
    let result = async {
        for app in 0..args.applications {
            start_application(
                &service,
                side.namespace(app),
                &format!("load-{app}"),
                args.executors_each,
                10,
                proto::AllocationPolicy::Adaptive,
            )
            .await?;
        }
        let total = args.applications * args.executors_each;
        side.measure(
            cluster,
            scale_up,
            started,
            total,
            args.steady_s,
            1,
            is_service,
            || Ok(()),
        )
        .await
    }
    .await;
    service.terminate(Duration::from_secs(30)).await;
    side.close(cluster).await?;
    result
}

async fn spark_side(args: &Args, cluster: &ControlPlane, run: u32) -> anyhow::Result<Load> {
    let side = Side::open(cluster, "spark", run, args.namespaces).await?;
    let scale_up = AuditWindow::open(&cluster.audit_log())?;
    let started = Instant::now();
    let mut drivers = Vec::new();
    let result = async {
        for driver in 0..args.spark_drivers {
            drivers.push(cluster.spark_driver(
                &args.cluster.spark_driver,
                side.namespace(driver),
                args.executors_each,
                &format!("load-{driver}"),
                &args.driver_heap,
            )?);
        }
        let total = args.spark_drivers * args.executors_each;
        let alive = || {
            for driver in drivers.iter_mut() {
                if let Some(status) = driver.try_wait()? {
                    bail!(
                        "a Spark driver exited ({status}) before its executors ran; its log is in {}",
                        cluster.log_dir().display()
                    );
                }
            }
            Ok(())
        };
        side.measure(
            cluster,
            scale_up,
            started,
            total,
            args.steady_s,
            args.spark_drivers,
            is_spark,
            alive,
        )
        .await
    }
    .await;
    for mut driver in drivers {
        drop(driver.stdin.take());
        if tokio::time::timeout(Duration::from_secs(60), driver.wait())
            .await
            .is_err()
        {
            let _ = driver.kill().await;
        }
    }
    side.close(cluster).await?;
    result
}

/// Waits until the watches together see `n` Running; `alive` fails the wait early (a
/// contender that exited never gets there).
async fn wait_all(
    watches: &[RunningWatch],
    n: u32,
    bound: Duration,
    mut alive: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + bound;
    loop {
        let running: u32 = watches.iter().map(RunningWatch::running).sum();
        if running >= n {
            return Ok(());
        }
        alive()?;
        if Instant::now() > deadline {
            bail!("{running} of {n} Running after {} s", bound.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
