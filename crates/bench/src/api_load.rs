//! API load on the real control plane: real Spark drivers on both sides, in the same run.
//! On one side every driver allocates through one service (`serve` at its defaults) with the
//! plugin at its two required settings; on the other every driver uses Spark's own
//! allocator. Each side has namespaces of its own, and the sides take turns (their order
//! rotated from run to run), so the API server serves one side at a time.
//!
//! Three measures per side, during the scale-up (the side's first driver started to every
//! executor Running) and over a fixed window of steady state after it. The service is
//! started, and serving, before its side's window opens, as a deployed service runs before
//! drivers come:
//! - requests, from the audit log by User-Agent (the service's and the drivers' on the
//!   service's side, the drivers' on the other);
//! - bytes of pod objects the API server served, from its own metrics: the sum of
//!   `apiserver_response_sizes` (GET, LIST…, not WATCH: a watch's size is recorded whole
//!   when it ends) and `apiserver_watch_events_sizes` (watch events, as they come) for pods;
//! - the API server process's CPU seconds (`process_cpu_seconds_total` from its metrics).
//!
//! The API server counts no event of a watch served over WebSocket (its WebSocket handler
//! records no `apiserver_watch_events_sizes`), and Spark's client (fabric8) watches pods so:
//! on a side whose clients opened pod watches over WebSocket (answered 101 in the audit
//! log), the bytes of one more watch of every pod of its namespaces are added, as the
//! bench's own watch of those namespaces received them (each driver's watch selects its own
//! executors: together, every executor pod once). Printed apart as "WebSocket".
//!
//! The bytes and CPU are the whole API server's. The bench first measures the fresh control
//! plane idle (no contender) over a window as long as the steady state's, and the summary
//! is printed above that idle rate; the scheduler, kwok and the bench's own watch of each
//! namespace are left in both sides' figures alike (the same pods, the same namespaces).
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::control_plane::{
    AuditWindow, ClusterArgs, ControlPlane, RunningWatch, is_service, is_spark, load_average,
    prepare_spark_driver,
};
use super::summary::{self, Ratios, spread, verdict};

/// `bench api-load` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Real Spark drivers per side (a JVM each).
    #[arg(long, default_value_t = 10)]
    pub drivers: u32,
    /// The applications the figures are scaled to (linearly, from `--drivers`).
    #[arg(long, default_value_t = 50)]
    pub scale_to: u32,
    /// Executors of each driver.
    #[arg(long, default_value_t = 10)]
    pub executors_each: u32,
    /// Namespaces each side's drivers are spread over.
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

/// The two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SideKind {
    /// Drivers through the service.
    Service,
    /// Drivers with Spark's own allocator.
    SparkOwn,
}

impl SideKind {
    fn label(self) -> &'static str {
        match self {
            SideKind::Service => "drivers through the service",
            SideKind::SparkOwn => "drivers with Spark's own allocator",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            SideKind::Service => "svc",
            SideKind::SparkOwn => "spark",
        }
    }

    /// Whether a request with this User-Agent is this side's.
    fn sent(self, user_agent: &str) -> bool {
        match self {
            SideKind::Service => is_service(user_agent) || is_spark(user_agent),
            SideKind::SparkOwn => is_spark(user_agent),
        }
    }
}

/// What the API server spent on one side over one window.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    pub requests: f64,
    /// Bytes of pod objects served (responses and watch events).
    pub pod_bytes: f64,
    /// The API server process's CPU seconds.
    pub cpu_seconds: f64,
}

impl Cost {
    /// `self` per minute of a window of `seconds`.
    fn per_minute(self, seconds: f64) -> Self {
        let k = 60.0 / seconds.max(f64::MIN_POSITIVE);
        self.scaled(k)
    }

    fn scaled(self, k: f64) -> Self {
        Self {
            requests: self.requests * k,
            pod_bytes: self.pod_bytes * k,
            cpu_seconds: self.cpu_seconds * k,
        }
    }
}

/// One run: the idle control plane's cost per minute (measured once), and each side's.
#[derive(Debug, Clone, Copy)]
struct Run {
    idle: Cost,
    service: Load,
    spark: Load,
}

impl Run {
    /// A side's cost in `phase` above the idle rate over the phase's length.
    fn above_idle(&self, load: &Load, phase: Phase) -> Cost {
        let (cost, minutes) = match phase {
            Phase::ScaleUp => (load.scale_up, load.seconds / 60.0),
            Phase::Steady => (load.steady, 1.0),
        };
        Cost {
            requests: cost.requests,
            pod_bytes: cost.pod_bytes - self.idle.pod_bytes * minutes,
            cpu_seconds: cost.cpu_seconds - self.idle.cpu_seconds * minutes,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    ScaleUp,
    /// Per minute.
    Steady,
}

/// One side's run.
#[derive(Debug, Clone, Copy)]
struct Load {
    /// The start to every executor Running.
    scale_up: Cost,
    /// Per minute of steady state.
    steady: Cost,
    /// Seconds to every executor Running.
    seconds: f64,
    /// Of the pod bytes: those of the side's WebSocket watches (scale-up; steady, per
    /// minute), estimated as above.
    websocket_bytes: (f64, f64),
}

/// The API server's counters read from its metrics at one moment.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    pod_bytes: f64,
    cpu_seconds: f64,
}

impl Counters {
    async fn read(cluster: &ControlPlane) -> anyhow::Result<Self> {
        let request = http::Request::get("/metrics").body(Vec::new())?;
        let text = cluster
            .client
            .request_text(request)
            .await
            .context("the API server's /metrics")?;
        Ok(Self::parse(&text))
    }

    fn parse(text: &str) -> Self {
        // A WATCH's response size is its whole stream, recorded when the watch ends: the
        // events are counted as they come (below), and a watch of the whole cluster (the
        // scheduler's, kwok's) would dump its history into whichever window it ends in.
        let pods = |labels: &[(&str, &str)]| {
            labels.contains(&("resource", "pods"))
                && !(labels.iter())
                    .any(|(k, v)| *k == "verb" && matches!(*v, "WATCH" | "WATCHLIST"))
        };
        let watched = |labels: &[(&str, &str)]| {
            labels.contains(&("resource", "pods")) || labels.contains(&("kind", "Pod"))
        };
        Self {
            pod_bytes: metric_sum(text, "apiserver_response_sizes_sum", pods)
                + metric_sum(text, "apiserver_watch_events_sizes_sum", watched),
            cpu_seconds: metric_sum(text, "process_cpu_seconds_total", |_| true),
        }
    }

    fn since(self, before: Self) -> (f64, f64) {
        (
            self.pod_bytes - before.pod_bytes,
            self.cpu_seconds - before.cpu_seconds,
        )
    }
}

/// The sum of the samples of `name` (Prometheus text format) whose labels `pick` accepts.
pub fn metric_sum(text: &str, name: &str, pick: impl Fn(&[(&str, &str)]) -> bool) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(rest) => {
                    let (labels, value) = rest.split_once('}')?;
                    (labels, value)
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            let labels: Vec<(&str, &str)> = labels
                .split(',')
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key.trim(), value.trim().trim_matches('"')))
                })
                .collect();
            let value: f64 = value.split_whitespace().next()?.parse().ok()?;
            pick(&labels).then_some(value)
        })
        .sum()
}

/// Runs the scenario and prints its figures.
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.drivers > 0 && args.namespaces > 0 && args.runs > 0 && args.steady_s > 0,
        "--drivers, --namespaces, --runs and --steady-s must be above 0"
    );
    prepare_spark_driver(&args.cluster.spark_driver).await?;
    let pods = args.drivers * args.executors_each;
    let cluster = ControlPlane::start(&args.cluster, 2 * pods).await?;
    println!(
        "api-load: {} real Spark drivers per side, {} executors each, {} namespaces per side, \
         {} s of steady state, {} runs (the sides' order rotated per run); figures also scaled \
         linearly to {} applications",
        args.drivers, args.executors_each, args.namespaces, args.steady_s, args.runs, args.scale_to
    );
    let result = measure_runs(&args, &cluster).await;
    cluster.stop().await;
    let runs = result?;
    summarise(&args, &runs);
    Ok(())
}

fn summarise(args: &Args, runs: &[Run]) {
    let scale = f64::from(args.scale_to) / f64::from(args.drivers);
    println!(
        "summary (min / median / max of {} runs, above the idle control plane; at {} drivers \
         per side, and x{scale:.1} for {}):",
        args.runs, args.drivers, args.scale_to
    );
    let idle = (
        spread(runs.iter().map(|r| r.idle.pod_bytes / 1e6)),
        spread(runs.iter().map(|r| r.idle.cpu_seconds)),
    );
    println!(
        "  idle, per minute: pod bytes {:.3} / {:.3} / {:.3} MB, API server CPU {:.2} / {:.2} \
         / {:.2} s",
        idle.0.0, idle.0.1, idle.0.2, idle.1.0, idle.1.1, idle.1.2
    );
    type Pick = fn(&Cost) -> f64;
    let measures: [(&str, Pick, &str); 3] = [
        ("requests", |c| c.requests, ""),
        ("pod bytes served", |c| c.pod_bytes / 1e6, " MB"),
        ("API server CPU", |c| c.cpu_seconds, " s"),
    ];
    for (phase, name, goal) in [
        (Phase::ScaleUp, "scale-up", 1.0),
        (Phase::Steady, "steady state, per minute", 0.1),
    ] {
        for (what, pick, unit) in measures {
            let service: Vec<Option<f64>> = runs
                .iter()
                .map(|r| Some(pick(&r.above_idle(&r.service, phase))))
                .collect();
            let spark: Vec<Option<f64>> = runs
                .iter()
                .map(|r| Some(pick(&r.above_idle(&r.spark, phase))))
                .collect();
            let s = spread(service.iter().flatten().copied());
            let p = spread(spark.iter().flatten().copied());
            let ratio = Ratios::of(&service, &spark);
            println!(
                "  {name}, {what}: service side {:.2} / {:.2} / {:.2}{unit} (x{scale:.1}: \
                 {:.1}); Spark's own {:.2} / {:.2} / {:.2}{unit} (x{scale:.1}: {:.1}); ratio \
                 per run {} (median {:.3}; goal <= {goal}: {})",
                s.0,
                s.1,
                s.2,
                s.1 * scale,
                p.0,
                p.1,
                p.2,
                p.1 * scale,
                ratio.as_ref().map_or("-".into(), Ratios::runs),
                ratio.as_ref().map_or(f64::NAN, Ratios::median),
                verdict(ratio.as_ref().is_some_and(|r| r.median() <= goal))
            );
        }
    }
}

/// The control plane's cost per minute with no contender, over `seconds`.
async fn idle(cluster: &ControlPlane, seconds: u64) -> anyhow::Result<Cost> {
    let before = Counters::read(cluster).await?;
    let start = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (pod_bytes, cpu_seconds) = Counters::read(cluster).await?.since(before);
    Ok(Cost {
        requests: 0.0,
        pod_bytes,
        cpu_seconds,
    }
    .per_minute(start.elapsed().as_secs_f64()))
}

async fn measure_runs(args: &Args, cluster: &ControlPlane) -> anyhow::Result<Vec<Run>> {
    let sides = [SideKind::Service, SideKind::SparkOwn];
    // Once, on the fresh control plane: after a side, its pods' deletion goes on showing in
    // the metrics for a while (a window there once read 10.8 MB of pods a minute).
    let idle = idle(cluster, args.steady_s).await?;
    println!(
        "  idle control plane, per minute: {:.3} MB of pods, {:.2} CPU s; load average {}",
        idle.pod_bytes / 1e6,
        idle.cpu_seconds,
        load_average()
    );
    let mut runs = Vec::new();
    for run in 0..args.runs {
        let mut loads = [None, None];
        for k in summary::rotation(sides.len(), args.runs, run) {
            let kind = sides[k];
            let load = side(args, cluster, kind, run + 1)
                .await
                .with_context(|| format!("the {}, run {}", kind.label(), run + 1))?;
            println!(
                "  run {} {:<36}: {:>6.1} s to every executor Running; scale-up {:.0} requests, \
                 {:.2} MB of pods ({:.2} MB of it WebSocket watches), {:.2} CPU s; steady, per \
                 minute {:.1} requests, {:.3} MB, {:.2} CPU s; load average {}",
                run + 1,
                kind.label(),
                load.seconds,
                load.scale_up.requests,
                load.scale_up.pod_bytes / 1e6,
                load.websocket_bytes.0 / 1e6,
                load.scale_up.cpu_seconds,
                load.steady.requests,
                load.steady.pod_bytes / 1e6,
                load.steady.cpu_seconds,
                load_average()
            );
            loads[k] = Some(load);
        }
        match loads {
            [Some(service), Some(spark)] => runs.push(Run {
                idle,
                service,
                spark,
            }),
            _ => bail!("run {} measured only one side", run + 1),
        }
    }
    Ok(runs)
}

/// One side's run: its namespaces, each watched for Running executors; for the service's
/// side the service; its drivers; then the two windows.
async fn side(
    args: &Args,
    cluster: &ControlPlane,
    kind: SideKind,
    run: u32,
) -> anyhow::Result<Load> {
    let namespaces: Vec<String> = (0..args.namespaces)
        .map(|k| format!("bench-load-{}-{run}-{k}", kind.slug()))
        .collect();
    for namespace in &namespaces {
        cluster.create_namespace(namespace).await?;
    }
    let watches: Vec<RunningWatch> = namespaces
        .iter()
        .map(|ns| RunningWatch::start(cluster.client.clone(), ns))
        .collect();
    let watched =
        |watches: &[RunningWatch]| -> f64 { watches.iter().map(|w| w.event_bytes() as f64).sum() };
    let mut service = None;
    let mut drivers = Vec::new();
    let mut logs = Vec::new();
    let result = async {
        // The service runs as deployed: serving, its shard Lease held, before the side's
        // window opens, as a Deployment's pod runs before drivers come. Its start is a
        // cost once per replica, not per scale-up; its Lease renewals during the window
        // are counted.
        let address = match kind {
            SideKind::Service => {
                let serve = cluster.serve(&namespaces[0], None).await?;
                let address = serve.address.to_string();
                service = Some(serve);
                Some(address)
            }
            SideKind::SparkOwn => None,
        };
        let audit = AuditWindow::open(&cluster.audit_log())?;
        let before = Counters::read(cluster).await?;
        let watched_before = watched(&watches);
        let started = Instant::now();
        for driver in 0..args.drivers {
            let namespace = &namespaces[driver as usize % namespaces.len()];
            let app = format!("load-{driver}");
            drivers.push(cluster.spark_driver(
                &args.cluster.spark_driver,
                namespace,
                args.executors_each,
                &app,
                &args.driver_heap,
                address.as_deref(),
            )?);
            logs.push(cluster.spark_driver_log(namespace, &app));
        }
        let total = args.drivers * args.executors_each;
        wait_all(&watches, total, Duration::from_secs(900), || {
            for (driver, log) in drivers.iter_mut().zip(&logs) {
                if let Some(status) = driver.try_wait()? {
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    let tail: String = text
                        .chars()
                        .rev()
                        .take(3000)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect();
                    bail!(
                        "a Spark driver exited ({status}) before its executors ran; the end of \
                         its log ({}):\n{tail}",
                        log.display()
                    );
                }
            }
            Ok(())
        })
        .await?;
        let seconds = started.elapsed().as_secs_f64();
        let up_counters = Counters::read(cluster).await?;
        let watched_up = watched(&watches);
        let up_requests = audit.count(|ua| kind.sent(ua))?;
        // Its WebSocket watches stay open into the steady state.
        let websocket = up_requests.websocket_pod_watches > 0;
        let steady_audit = AuditWindow::open(&cluster.audit_log())?;
        let steady_start = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.steady_s)).await;
        let steady_counters = Counters::read(cluster).await?;
        let watched_steady = watched(&watches);
        let steady_seconds = steady_start.elapsed().as_secs_f64();
        let steady_requests = steady_audit.count(|ua| kind.sent(ua))?.total;
        let (up_bytes, up_cpu) = up_counters.since(before);
        let (steady_bytes, steady_cpu) = steady_counters.since(up_counters);
        let unmetered = |bytes: f64| if websocket { bytes } else { 0.0 };
        let up_websocket = unmetered(watched_up - watched_before);
        let steady_websocket = unmetered(watched_steady - watched_up);
        anyhow::Ok(Load {
            scale_up: Cost {
                requests: up_requests.total as f64,
                pod_bytes: up_bytes + up_websocket,
                cpu_seconds: up_cpu,
            },
            steady: Cost {
                requests: steady_requests as f64,
                pod_bytes: steady_bytes + steady_websocket,
                cpu_seconds: steady_cpu,
            }
            .per_minute(steady_seconds),
            seconds,
            websocket_bytes: (
                up_websocket,
                steady_websocket * 60.0 / steady_seconds.max(f64::MIN_POSITIVE),
            ),
        })
    }
    .await;
    // Every driver told to stop first, so they stop together.
    for driver in drivers.iter_mut() {
        drop(driver.stdin.take());
    }
    for mut driver in drivers {
        if tokio::time::timeout(Duration::from_secs(60), driver.wait())
            .await
            .is_err()
        {
            let _ = driver.kill().await;
        }
    }
    if let Some(service) = service {
        service.terminate(Duration::from_secs(30)).await;
    }
    drop(watches);
    for namespace in &namespaces {
        cluster.delete_namespace(namespace).await?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = r#"# HELP apiserver_response_sizes Response size distribution in bytes
# TYPE apiserver_response_sizes histogram
apiserver_response_sizes_bucket{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1",le="1000"} 3
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 120000
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="resource",subresource="",verb="GET",version="v1"} 5000
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 9999
apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="cluster",subresource="",verb="WATCHLIST",version="v1"} 8888
apiserver_response_sizes_sum{component="apiserver",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="GET",version="v1"} 777
apiserver_response_sizes_count{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 3
apiserver_watch_events_sizes_sum{group="",resource="pods",version="v1"} 40000
apiserver_watch_events_sizes_sum{group="",resource="configmaps",version="v1"} 999
apiserver_watch_events_sizes_sum{group="",kind="Pod",version="v1"} 1000
process_cpu_seconds_total 12.5
process_cpu_seconds_total_other 3
"#;

    #[test]
    fn pod_bytes_and_cpu_are_read_from_the_api_servers_metrics() {
        let counters = Counters::parse(METRICS);
        // Pod responses (LIST and GET, not a watch's whole stream) and pod watch events;
        // not Leases, not ConfigMaps, not the histogram's buckets or counts.
        assert_eq!(counters.pod_bytes, 120000.0 + 5000.0 + 40000.0 + 1000.0);
        assert_eq!(counters.cpu_seconds, 12.5);
        let later = Counters {
            pod_bytes: counters.pod_bytes + 2000.0,
            cpu_seconds: 14.0,
        };
        assert_eq!(later.since(counters), (2000.0, 1.5));
        assert_eq!(metric_sum(METRICS, "absent", |_| true), 0.0);
    }

    #[test]
    fn a_window_is_scaled_to_a_minute() {
        let cost = Cost {
            requests: 30.0,
            pod_bytes: 1000.0,
            cpu_seconds: 2.0,
        };
        assert_eq!(
            cost.per_minute(120.0),
            Cost {
                requests: 15.0,
                pod_bytes: 500.0,
                cpu_seconds: 1.0
            }
        );
    }

    #[test]
    fn costs_are_taken_above_the_idle_rate_over_the_phases_length() {
        let load = Load {
            scale_up: Cost {
                requests: 100.0,
                pod_bytes: 5000.0,
                cpu_seconds: 3.0,
            },
            steady: Cost {
                requests: 20.0,
                pod_bytes: 1500.0,
                cpu_seconds: 1.5,
            },
            seconds: 30.0,
            websocket_bytes: (0.0, 0.0),
        };
        let run = Run {
            idle: Cost {
                requests: 0.0,
                pod_bytes: 1000.0,
                cpu_seconds: 1.0,
            },
            service: load,
            spark: load,
        };
        // Half a minute of scale-up: half a minute of the idle rate.
        assert_eq!(
            run.above_idle(&load, Phase::ScaleUp),
            Cost {
                requests: 100.0,
                pod_bytes: 4500.0,
                cpu_seconds: 2.5
            }
        );
        assert_eq!(
            run.above_idle(&load, Phase::Steady),
            Cost {
                requests: 20.0,
                pod_bytes: 500.0,
                cpu_seconds: 0.5
            }
        );
    }

    #[test]
    fn the_service_side_counts_the_service_and_its_drivers() {
        let service = spark_pod_allocator::k8s::replica_user_agent("bench-load-svc-1-0-0");
        let driver = "fabric8-kubernetes-client/7.1.0";
        assert!(SideKind::Service.sent(&service));
        assert!(SideKind::Service.sent(driver));
        assert!(SideKind::SparkOwn.sent(driver));
        assert!(!SideKind::SparkOwn.sent(&service));
        assert!(!SideKind::Service.sent("spark-pod-allocator-bench/observer"));
    }
}
