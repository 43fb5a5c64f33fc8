//! Scale-up on the real control plane: the test API server (`tests/kube-apiserver`:
//! kube-apiserver over etcd, kube-scheduler, kube-controller-manager and kwok nodes, built
//! from Go modules) in a child process, and in the same run, each case in a fresh namespace:
//!
//! - the bare client, once per concurrency of a sweep (`--bare-concurrency`, by default 25,
//!   50, 100, 200 and 400 creates in flight): a client that creates N pods with no
//!   client-side cap, retrying what the API server refuses (429, 5xx) after a second. Its
//!   pods are the service's, byte for byte (built by the service's own pod builder from the
//!   same template for an application of the same id), so both cases ask the API server to
//!   store and send the same objects. The fastest of the sweep in a run is that run's
//!   **bare limit**;
//! - the service (`serve` in a child process, as deployed) at its defaults: no setting of
//!   the service overridden, and the application started as the Spark plugin starts it at
//!   Spark 4.2's defaults (batch 20, batch delay 1 s, no policy: the service's default);
//!   optionally with the ADAPTIVE or SPARK policy asked per application, or with the
//!   service's QPS cap lifted;
//! - a real Spark driver with Spark's own `ExecutorPodsAllocator`
//!   (`clients/spark/own-allocator-driver.sh`: client mode, Spark's defaults), with no bound
//!   on its time unless `--max-seconds` sets one.
//!
//! The cases' order is rotated from run to run ([`summary::rotation`]), and
//! `--fresh-control-plane` gives every case a control plane of its own. Every case is timed
//! by the same [`summary::Clock`]: from the first executor pod a watch of its namespace sees
//! to N Running seen by that watch. Every contender acts as the same ordinary user (`alice`,
//! bound to `cluster-admin`), so API Priority and Fairness treats them alike (an admin in
//! `system:masters` would be exempt). Their requests are counted from the API server's audit
//! log by User-Agent.
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::harness::{ServeProcess, wait_every};
use super::plot::{self, Series};
use super::summary::{self, Clock, Ratios, spread, verdict};
use spark_pod_allocator::allocator::{ExecutorId, ExecutorPodBuilder, ResourceProfileId};
use spark_pod_allocator::ha::HaSettings;
use spark_pod_allocator::proto;

/// The User-Agent of the bench's own requests (namespaces, the watch); not counted.
const OBSERVER_USER_AGENT: &str = "spark-pod-allocator-bench/observer";
/// The User-Agent of the bare client.
pub const BARE_USER_AGENT: &str = "spark-pod-allocator-bench/bare";
/// What Spark's Kubernetes client (fabric8) puts in its User-Agent.
const SPARK_USER_AGENT: &str = "fabric8-kubernetes-client";
/// The ordinary user every contender acts as.
const CONTENDER_USER: &str = "alice";
/// How long a contender may take from its start to its first pod (a JVM's start included).
const FIRST_POD_BOUND: Duration = Duration::from_secs(900);

/// The cluster's options, shared by the scenarios on the real control plane.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    /// The test API server binary (`scripts/build-test-apiserver.sh` prints its path).
    #[arg(long, env = "TEST_APISERVER_BIN")]
    pub apiserver_bin: PathBuf,
    /// kwok nodes (110 pods, 32 CPUs, 256 GiB each); default: room for every pod of a run.
    #[arg(long)]
    pub kwok_nodes: Option<u32>,
    /// The kube-scheduler's client QPS; 0 keeps its default (50), which then bounds binds
    /// (one request each) and with them how fast any contender's pods start.
    #[arg(long, default_value_t = 5000)]
    pub scheduler_qps: u32,
    /// An argument for kube-apiserver, repeatable (e.g.
    /// `--apiserver-arg=--max-mutating-requests-inflight=20`).
    #[arg(long = "apiserver-arg", allow_hyphen_values = true)]
    pub apiserver_args: Vec<String>,
    /// The Spark driver with Spark's own allocator (and, given a service address, with the
    /// plugin).
    #[arg(long, default_value = "clients/spark/own-allocator-driver.sh")]
    pub spark_driver: PathBuf,
}

/// `bench control-plane` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Executors to scale up to.
    #[arg(long, default_value_t = 1000)]
    pub executors: u32,
    /// Runs of every case (min / median / max are printed); the cases' order is rotated
    /// from run to run.
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Cases, comma-separated (the first run's order; `bare` stands for the whole sweep).
    #[arg(long, value_delimiter = ',', default_value = "bare,service,spark-own")]
    pub cases: Vec<Case>,
    /// The bare client's sweep: creates in flight, one bare case each.
    #[arg(long, value_delimiter = ',', default_value = "25,50,100,200,400")]
    pub bare_concurrency: Vec<u32>,
    /// `create_concurrency` of the service with its QPS cap lifted (`service-uncapped`).
    #[arg(long, default_value_t = 100)]
    pub uncapped_concurrency: u32,
    /// A control plane of its own for every case of every run (slower; nothing one case
    /// leaves behind can slow the next).
    #[arg(long)]
    pub fresh_control_plane: bool,
    /// Write a PNG of Running executors over time (the first run of each case).
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    /// Stop a case this many seconds after its first pod (reported as a bound, its time
    /// then a lower bound). None by default: every case runs to N Running.
    #[arg(long)]
    pub max_seconds: Option<u64>,
    /// The heap of Spark's own driver (`spark-own`): it holds every executor pod of its
    /// snapshots, so 10,000 executors need more than the 512m enough for 1,000 (with
    /// 512m its pod polling runs out of heap at about 5,000).
    #[arg(long, default_value = "512m")]
    pub spark_driver_heap: String,
}

/// Who creates the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Case {
    /// The bare client, once per concurrency of the sweep: the API server's limit.
    Bare,
    /// The service at its defaults, the application started as the plugin does at Spark's
    /// defaults.
    Service,
    /// The same, asking for the ADAPTIVE policy.
    Adaptive,
    /// The service with its QPS cap lifted (`qps`, `burst` 1,000,000), ADAPTIVE.
    #[value(alias = "adaptive-uncapped")]
    ServiceUncapped,
    /// The same as `service`, asking for the SPARK policy.
    Spark,
    /// A Spark driver with Spark's own allocator.
    SparkOwn,
}

impl Case {
    fn slug(self) -> &'static str {
        match self {
            Case::Bare => "bare",
            Case::Service => "service",
            Case::Adaptive => "adaptive",
            Case::ServiceUncapped => "uncapped",
            Case::Spark => "spark",
            Case::SparkOwn => "spark-own",
        }
    }

    /// Whether a request with this User-Agent is this contender's.
    fn sent(self, user_agent: &str) -> bool {
        match self {
            Case::Bare => user_agent == BARE_USER_AGENT,
            Case::Service | Case::Adaptive | Case::ServiceUncapped | Case::Spark => {
                is_service(user_agent)
            }
            Case::SparkOwn => is_spark(user_agent),
        }
    }

    /// The settings of the application's Start: what the plugin sends at Spark 4.2's
    /// defaults (batch 20, batch delay 1 s), with the policy the case asks for.
    fn settings(self) -> proto::AllocationSettings {
        let policy = match self {
            Case::Adaptive | Case::ServiceUncapped => Some(proto::AllocationPolicy::Adaptive),
            Case::Spark => Some(proto::AllocationPolicy::Spark),
            _ => None,
        };
        proto::AllocationSettings {
            batch_size: Some(20),
            batch_delay_ms: Some(1000),
            policy: policy.map(|p| p as i32),
            ..Default::default()
        }
    }
}

/// One case as run: a case, and for the bare client its concurrency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub case: Case,
    /// Creates in flight (the bare client's; the uncapped service's `create_concurrency`).
    pub concurrency: u32,
}

impl Entry {
    /// The cases of `args`, the bare client expanded into its sweep.
    pub fn all(args: &Args) -> Vec<Entry> {
        args.cases
            .iter()
            .flat_map(|case| match case {
                Case::Bare => args
                    .bare_concurrency
                    .iter()
                    .map(|c| Entry {
                        case: Case::Bare,
                        concurrency: *c,
                    })
                    .collect::<Vec<_>>(),
                Case::ServiceUncapped => vec![Entry {
                    case: *case,
                    concurrency: args.uncapped_concurrency,
                }],
                _ => vec![Entry {
                    case: *case,
                    concurrency: 0,
                }],
            })
            .collect()
    }

    pub fn label(self) -> String {
        match self.case {
            Case::Bare => format!("bare client, {} in flight", self.concurrency),
            Case::Service => "service at its defaults".into(),
            Case::Adaptive => "service, ADAPTIVE asked".into(),
            Case::ServiceUncapped => "service ADAPTIVE, no QPS cap".into(),
            Case::Spark => "service, SPARK asked".into(),
            Case::SparkOwn => "Spark's own allocator".into(),
        }
    }

    fn slug(self) -> String {
        match self.case {
            Case::Bare => format!("bare{}", self.concurrency),
            case => case.slug().into(),
        }
    }
}

/// The service's User-Agent (`spark-pod-allocator/<version>`, with a replica's identity),
/// not the bench's (`spark-pod-allocator-bench/…`).
pub fn is_service(user_agent: &str) -> bool {
    user_agent.starts_with("spark-pod-allocator/")
}

/// Spark's Kubernetes client.
pub fn is_spark(user_agent: &str) -> bool {
    user_agent.contains(SPARK_USER_AGENT)
}

/// Runs the scenario and prints its table (and writes the plot when asked).
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.executors > 0, "--executors must be above 0");
    anyhow::ensure!(args.runs > 0, "--runs must be above 0");
    anyhow::ensure!(
        args.bare_concurrency.iter().all(|c| *c > 0) && args.uncapped_concurrency > 0,
        "--bare-concurrency and --uncapped-concurrency must be above 0"
    );
    if args.cases.contains(&Case::SparkOwn) {
        prepare_spark_driver(&args.cluster.spark_driver).await?;
    }
    let entries = Entry::all(&args);
    anyhow::ensure!(!entries.is_empty(), "--cases names no case");
    println!(
        "control plane: scheduler QPS {}, kube-apiserver args {:?}; {} executors, {} runs, \
         {}; clock: the first executor pod seen to N Running seen, by one watch of the \
         case's namespace; bound: {}",
        match args.cluster.scheduler_qps {
            0 => "50 (default)".to_string(),
            qps => qps.to_string(),
        },
        args.cluster.apiserver_args,
        args.executors,
        args.runs,
        if args.fresh_control_plane {
            "a fresh control plane per case"
        } else {
            "one control plane, the case order rotated per run"
        },
        args.max_seconds
            .map_or("none".to_string(), |s| format!("{s} s on that clock")),
    );
    let shared = if args.fresh_control_plane {
        None
    } else {
        let cluster = ControlPlane::start(&args.cluster, args.executors).await?;
        println!("  {} with {} kwok nodes", cluster.url, cluster.nodes);
        Some(cluster)
    };
    let result = measure_all(&args, &entries, shared.as_ref()).await;
    if let Some(cluster) = shared {
        cluster.stop().await;
    }
    let outcomes = result?;
    summarise(&args, &entries, &outcomes)
}

/// Every entry's outcome per run: `[entry][run]`.
async fn measure_all(
    args: &Args,
    entries: &[Entry],
    shared: Option<&ControlPlane>,
) -> anyhow::Result<Vec<Vec<Outcome>>> {
    let mut outcomes: Vec<Vec<Outcome>> = vec![Vec::new(); entries.len()];
    for run in 0..args.runs {
        let order = summary::rotation(entries.len(), args.runs, run);
        println!(
            "run {}: {}",
            run + 1,
            order
                .iter()
                .map(|k| entries[*k].label())
                .collect::<Vec<_>>()
                .join(", ")
        );
        for k in order {
            let entry = entries[k];
            let outcome = match shared {
                Some(cluster) => scale_up(args, cluster, entry, run + 1).await,
                None => {
                    let cluster = ControlPlane::start(&args.cluster, args.executors).await?;
                    let outcome = scale_up(args, &cluster, entry, run + 1).await;
                    cluster.stop().await;
                    outcome
                }
            }
            .with_context(|| format!("{} run {}", entry.label(), run + 1))?;
            let reached = if outcome.running < args.executors {
                format!(
                    "{} of {} Running at the bound,",
                    outcome.running, args.executors
                )
            } else {
                format!("to {} Running", args.executors)
            };
            println!(
                "  {:<30} run {}: {:>7.1} s {reached} (first pod {:.1} s after the start); \
                 requests {} ({}), 429s {}{}; load average {}",
                entry.label(),
                run + 1,
                outcome.seconds,
                outcome.first_pod,
                outcome.requests.total,
                outcome.requests.verbs(),
                outcome.requests.throttled,
                outcome
                    .rss
                    .map(|rss| format!(
                        "; RSS {:.1} MiB, {:.0} B per executor",
                        rss as f64 / 1048576.0,
                        rss as f64 / f64::from(args.executors)
                    ))
                    .unwrap_or_default(),
                load_average()
            );
            outcomes[k].push(outcome);
        }
    }
    Ok(outcomes)
}

/// The 1-, 5- and 15-minute load averages (`/proc/loadavg`), or `?`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "?".into())
}

fn summarise(args: &Args, entries: &[Entry], outcomes: &[Vec<Outcome>]) -> anyhow::Result<()> {
    let n = args.executors;
    // Per run, the seconds of an entry that reached N (None when a bound stopped it).
    let finished = |k: usize| -> Vec<Option<f64>> {
        outcomes[k]
            .iter()
            .map(|o| (o.running >= n).then_some(o.seconds))
            .collect()
    };
    let bare: Vec<usize> = (0..entries.len())
        .filter(|k| entries[*k].case == Case::Bare)
        .collect();
    let limits: Vec<Option<(usize, f64)>> = (0..args.runs as usize)
        .map(|run| {
            let times: Vec<Option<f64>> = bare
                .iter()
                .map(|k| finished(*k).get(run).copied().flatten())
                .collect();
            summary::bare_limit(&times).map(|(i, t)| (bare[i], t))
        })
        .collect();
    let limit: Vec<Option<f64>> = limits.iter().map(|l| l.map(|(_, t)| t)).collect();
    let spark_own = entries.iter().position(|e| e.case == Case::SparkOwn);
    println!(
        "summary, {n} executors (min / median / max of {} runs; ratios per run, in run order, \
         then their median):",
        args.runs
    );
    for (k, entry) in entries.iter().enumerate() {
        let runs = &outcomes[k];
        let time = spread(runs.iter().map(|o| o.seconds));
        let first = spread(runs.iter().map(|o| o.first_pod));
        let requests = spread(runs.iter().map(|o| o.requests.total as f64));
        let mut line = format!(
            "  {:<30} {:>7.1} / {:>7.1} / {:>7.1} s (start to first pod {:.1} / {:.1} / {:.1} \
             s); requests {:.0} / {:.0} / {:.0}",
            entry.label(),
            time.0,
            time.1,
            time.2,
            first.0,
            first.1,
            first.2,
            requests.0,
            requests.1,
            requests.2
        );
        if let Some(ratios) = Ratios::of(&finished(k), &limit) {
            line += &format!(
                "; x bare limit {} (median {:.2})",
                ratios.runs(),
                ratios.median()
            );
        }
        if let Some(spark) = spark_own
            && spark != k
            && let Some(ratios) = Ratios::of(&finished(spark), &finished(k))
        {
            line += &format!(
                "; faster than Spark's own {} (median {:.2})",
                ratios.runs(),
                ratios.median()
            );
        }
        if let Some(short) = runs.iter().map(|o| o.running).min()
            && short < n
        {
            line += &format!(
                "; stopped by the {} s bound in {} run(s), with as few as {short} Running \
                 (those runs are left out of its ratios)",
                args.max_seconds.unwrap_or_default(),
                runs.iter().filter(|o| o.running < n).count()
            );
        }
        if runs.iter().all(|o| o.rss.is_some()) {
            let per = spread(
                runs.iter()
                    .filter_map(|o| o.rss)
                    .map(|rss| rss as f64 / f64::from(n)),
            );
            line += &format!(
                "; RSS/executor {:.0} / {:.0} / {:.0} B",
                per.0, per.1, per.2
            );
        }
        println!("{line}");
    }
    println!(
        "  the bare limit per run: {}",
        limits
            .iter()
            .map(|l| match l {
                Some((k, t)) => format!("{t:.1} s ({})", entries[*k].label()),
                None => "none (no bare case finished)".into(),
            })
            .collect::<Vec<_>>()
            .join("; ")
    );
    for (k, entry) in entries.iter().enumerate() {
        if entry.case == Case::Bare || entry.case == Case::SparkOwn {
            continue;
        }
        if let Some(ratios) = Ratios::of(&finished(k), &limit) {
            println!(
                "goal: {} within 1.25x the bare limit: {:.2}x (median of per-run ratios) {}",
                entry.label(),
                ratios.median(),
                verdict(ratios.median() <= 1.25)
            );
        }
        if let Some(spark) = spark_own {
            match Ratios::of(&finished(spark), &finished(k)) {
                Some(ratios) => println!(
                    "goal: {} at least 5x faster than Spark's own allocator: {:.2}x (median \
                     of per-run ratios) {}",
                    entry.label(),
                    ratios.median(),
                    verdict(ratios.median() >= 5.0)
                ),
                None => println!(
                    "goal: {} at least 5x faster than Spark's own allocator: not measured \
                     (Spark's own did not reach {n} in any run)",
                    entry.label()
                ),
            }
        }
    }
    if let Some(path) = &args.plot {
        let series: Vec<Series> = entries
            .iter()
            .enumerate()
            .filter_map(|(k, entry)| {
                let first = outcomes[k].first()?;
                Some(Series {
                    label: entry.label(),
                    points: first.samples.clone(),
                })
            })
            .collect();
        let title = format!("Running executors on the control plane, scale-up to {n}");
        plot::running_over_time(path, &title, "the first executor pod", &series)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// One case's run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// On the [`Clock`]: the first executor pod seen to N Running, or to the bound.
    pub seconds: f64,
    /// Pods Running at the end: N, or fewer when the bound stopped the contender.
    pub running: u32,
    /// The contender's start to its first pod seen (not timed).
    pub first_pod: f64,
    /// The contender's requests from its start to N Running.
    pub requests: Requests,
    /// The service's resident memory at N Running.
    pub rss: Option<u64>,
    /// (seconds since the first pod, Running) samples.
    pub samples: Vec<(f64, u32)>,
}

/// One run of one case in its own namespace, which is deleted after.
async fn scale_up(
    args: &Args,
    cluster: &ControlPlane,
    entry: Entry,
    run: u32,
) -> anyhow::Result<Outcome> {
    let namespace = format!("bench-{}-{run}", entry.slug());
    cluster.create_namespace(&namespace).await?;
    let result = measure(args, cluster, entry, &namespace).await;
    let cleaned = cluster.delete_namespace(&namespace).await;
    let outcome = result?;
    cleaned?;
    Ok(outcome)
}

async fn measure(
    args: &Args,
    cluster: &ControlPlane,
    entry: Entry,
    namespace: &str,
) -> anyhow::Result<Outcome> {
    let n = args.executors;
    let watch = RunningWatch::start(cluster.client.clone(), namespace);
    let audit = AuditWindow::open(&cluster.audit_log())?;
    let started = Instant::now();
    let mut contender = Contender::start(args, cluster, entry, namespace).await?;
    let timed = async {
        let first_pod = watch.wait_for_first(FIRST_POD_BOUND).await?;
        let clock = Clock { started, first_pod };
        let bound = clock.remaining(args.max_seconds.map(Duration::from_secs), Instant::now());
        let reached = watch.wait_for(n, bound).await?;
        anyhow::Ok((clock, reached))
    };
    let timed = tokio::select! {
        timed = timed => timed,
        exited = contender.exited() => Err(exited),
    };
    let rss = match &contender {
        Contender::Service(service) => service.rss_bytes().ok(),
        _ => None,
    };
    let requests = audit.count(|user_agent| entry.case.sent(user_agent));
    contender.stop().await;
    let (clock, reached) = timed?;
    let requests = requests?;
    // A contender stopped by the bound is measured up to it, with the pods it had Running.
    let (reached, running) = match reached {
        Some(at) => (at, n),
        None => (Instant::now(), watch.running()),
    };
    let seconds = clock.seconds(reached);
    // The scale-up only: the samples after N (the contender's teardown) are not plotted.
    let mut samples = watch.samples(clock.first_pod);
    samples.retain(|(at, _)| *at <= seconds);
    Ok(Outcome {
        seconds,
        running,
        first_pod: clock.before_first_pod(),
        requests,
        rss,
        samples,
    })
}

/// A contender while it holds its executors.
enum Contender {
    /// The bare client's task, until it has been awaited.
    Bare(Option<tokio::task::JoinHandle<anyhow::Result<()>>>),
    Service(ServeProcess),
    /// The driver, and its stdin (held apart: waiting on a child closes the stdin it holds,
    /// which stops the driver).
    Spark(tokio::process::Child, Option<tokio::process::ChildStdin>),
}

impl Contender {
    async fn start(
        args: &Args,
        cluster: &ControlPlane,
        entry: Entry,
        namespace: &str,
    ) -> anyhow::Result<Self> {
        let n = args.executors;
        Ok(match entry.case {
            Case::Bare => {
                let client = cluster.contender_client(BARE_USER_AGENT).await?;
                let namespace = namespace.to_string();
                let concurrency = entry.concurrency as usize;
                Contender::Bare(Some(tokio::spawn(async move {
                    bare_create(client, &namespace, n, concurrency).await
                })))
            }
            Case::Service | Case::Adaptive | Case::ServiceUncapped | Case::Spark => {
                let uncapped = (entry.case == Case::ServiceUncapped).then_some(entry.concurrency);
                let service = cluster.serve(namespace, uncapped).await?;
                start_application(&service, namespace, BENCH_APP, n, entry.case.settings()).await?;
                Contender::Service(service)
            }
            Case::SparkOwn => {
                let mut driver = cluster.spark_driver(
                    &args.cluster.spark_driver,
                    namespace,
                    n,
                    "bench",
                    &args.spark_driver_heap,
                    None,
                )?;
                let stdin = driver.stdin.take();
                Contender::Spark(driver, stdin)
            }
        })
    }

    /// Resolves (with an error) when the contender ends before its executors are Running:
    /// a Spark driver or a service that exited, a bare client that failed. Never resolves
    /// while it runs.
    async fn exited(&mut self) -> anyhow::Error {
        match self {
            Contender::Bare(slot) => {
                let Some(task) = slot.as_mut() else {
                    return std::future::pending().await;
                };
                let result = task.await;
                *slot = None;
                match result {
                    Ok(Err(error)) => error.context("the bare client failed"),
                    // Every create answered: its pods have yet to go Running.
                    Ok(Ok(())) => std::future::pending().await,
                    Err(error) => anyhow::anyhow!("the bare client panicked: {error}"),
                }
            }
            Contender::Service(service) => match service.child.wait().await {
                Ok(status) => anyhow::anyhow!("`serve` exited ({status})"),
                Err(error) => anyhow::anyhow!("`serve`: {error}"),
            },
            Contender::Spark(driver, _) => match driver.wait().await {
                Ok(status) => anyhow::anyhow!("the Spark driver exited ({status})"),
                Err(error) => anyhow::anyhow!("the Spark driver: {error}"),
            },
        }
    }

    /// Lets go of the executors: the bare client is done, the service is stopped
    /// (SIGTERM), the Spark driver's stdin closed (it stops its SparkContext). The
    /// namespace's deletion removes the pods.
    async fn stop(self) {
        match self {
            Contender::Bare(Some(task)) => {
                task.abort();
                let _ = task.await;
            }
            Contender::Bare(None) => {}
            Contender::Service(service) => service.terminate(Duration::from_secs(30)).await,
            Contender::Spark(mut driver, stdin) => {
                drop(stdin);
                if tokio::time::timeout(Duration::from_secs(60), driver.wait())
                    .await
                    .is_err()
                {
                    let _ = driver.kill().await;
                }
            }
        }
    }
}

/// Starts application `app` in `namespace` through `service` and asks for `n` executors.
pub async fn start_application(
    service: &ServeProcess,
    namespace: &str,
    app: &str,
    n: u32,
    settings: proto::AllocationSettings,
) -> anyhow::Result<()> {
    let mut client = service.client.clone();
    client
        .start(proto::StartRequest {
            application_id: app.into(),
            namespace: namespace.into(),
            executor_pod_template: EXECUTOR_TEMPLATE.into(),
            settings: Some(settings),
            ..Default::default()
        })
        .await
        .context("Start")?;
    client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: app.into(),
            executors_per_profile: [(0, n)].into(),
            ..Default::default()
        })
        .await
        .context("SetTotalExpected")?;
    Ok(())
}

/// The application id of the service's case, whose pods the bare client creates too.
const BENCH_APP: &str = "bench";

/// The executors' pod: the requests of the Spark driver's executors (100m CPU; 512m heap
/// and Spark's 384 MiB overhead).
pub const EXECUTOR_TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  \
- name: spark-kubernetes-executor\n    image: spark:4\n    resources:\n      requests:\n        \
cpu: 100m\n        memory: 896Mi\n      limits:\n        memory: 896Mi\n";

/// Creates `n` executor pods, `concurrency` at a time, each retried after a second while the
/// API server refuses it for now (429, 5xx, a broken connection). The pods are those the
/// service builds for application [`BENCH_APP`] from [`EXECUTOR_TEMPLATE`].
async fn bare_create(
    client: kube::Client,
    namespace: &str,
    n: u32,
    concurrency: usize,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let builder = ExecutorPodBuilder::for_application(
        BENCH_APP,
        None,
        BTreeMap::from([(
            ResourceProfileId(0),
            serde_yaml::from_str(EXECUTOR_TEMPLATE)?,
        )]),
        None,
        "",
    )?;
    futures::stream::iter(1..=n)
        .map(|id| {
            let pods = pods.clone();
            let pod = builder.build(ExecutorId(u64::from(id)), ResourceProfileId(0));
            async move {
                let pod = pod?;
                loop {
                    match pods.create(&PostParams::default(), &pod).await {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
                        Err(kube::Error::Api(status))
                            if status.code != 429 && status.code < 500 =>
                        {
                            bail!("create executor {id}: {status:?}")
                        }
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                }
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
}

/// The test API server with its control plane, in a child process that stops when this
/// process's end of its stdin closes.
pub struct ControlPlane {
    child: tokio::process::Child,
    dir: tempfile::TempDir,
    pub url: String,
    pub nodes: u32,
    /// The admin (exempt from API Priority and Fairness): the bench's own requests.
    pub client: kube::Client,
    /// The contenders' user's token.
    pub token: String,
}

impl ControlPlane {
    /// Starts it with room for `pods` pods and waits until it is ready.
    pub async fn start(args: &ClusterArgs, pods: u32) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("bench-control-plane-")
            .tempdir()
            .context("temporary directory")?;
        let nodes = args.kwok_nodes.unwrap_or(pods.div_ceil(100)).max(1);
        let log_path = dir.path().join("test-apiserver.log");
        let log = std::fs::File::create(&log_path).context("the test API server's log")?;
        let mut command = tokio::process::Command::new(&args.apiserver_bin);
        command
            .arg("--dir")
            .arg(dir.path().join("cluster"))
            .args(["--exit-with-stdin", "--control-plane"])
            .arg(format!("--kwok-nodes={nodes}"));
        if args.scheduler_qps > 0 {
            command.arg(format!("--scheduler-qps={}", args.scheduler_qps));
        }
        let mut child = command
            .arg("--")
            .args(&args.apiserver_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", args.apiserver_bin.display()))?;
        let stdout = child
            .stdout
            .take()
            .context("the test API server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let ready = tokio::time::timeout(Duration::from_secs(600), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("ready ") {
                    return Ok(url.trim().to_string());
                }
            }
            bail!(
                "the test API server exited before it was ready (see {})",
                log_path.display()
            )
        })
        .await;
        let url = match ready {
            Ok(url) => url?,
            Err(_) => bail!("the test API server was not ready within 600 s"),
        };
        // Its stdout stays open (a write to a closed pipe would kill it).
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let cluster = dir.path().join("cluster");
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(cluster.join("state.json")).context("state.json")?,
        )?;
        let token = state["tokens"][CONTENDER_USER]
            .as_str()
            .context("no token for the contenders' user in state.json")?
            .to_string();
        let client = client_of(&cluster.join("kubeconfig"), OBSERVER_USER_AGENT).await?;
        let plane = Self {
            child,
            dir,
            url,
            nodes,
            client,
            token,
        };
        plane.write_contender_kubeconfig()?;
        plane.grant_contender().await?;
        Ok(plane)
    }

    fn cluster_dir(&self) -> PathBuf {
        self.dir.path().join("cluster")
    }

    /// The CA that signed the API server's certificate.
    pub fn ca_cert(&self) -> PathBuf {
        self.cluster_dir().join("ca.crt")
    }

    /// Every request but the API server's own, one JSON event per line.
    pub fn audit_log(&self) -> PathBuf {
        self.cluster_dir().join("audit.log")
    }

    /// The kubeconfig of the contenders' user (an ordinary user, under API Priority and
    /// Fairness).
    pub fn contender_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig-contender")
    }

    fn write_contender_kubeconfig(&self) -> anyhow::Result<()> {
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "bench", "cluster": {
                "server": self.url, "certificate-authority": self.ca_cert()}}],
            "users": [{"name": CONTENDER_USER, "user": {"token": self.token}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": CONTENDER_USER}}],
            "current-context": "bench",
        });
        std::fs::write(
            self.contender_kubeconfig(),
            serde_yaml::to_string(&kubeconfig)?,
        )
        .context("the contenders' kubeconfig")
    }

    /// Binds `cluster-admin` to the contenders' user: every right, but not the admin's
    /// exemption from API Priority and Fairness.
    async fn grant_contender(&self) -> anyhow::Result<()> {
        use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "bench-contender"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                "name": CONTENDER_USER}],
        }))?;
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        match bindings.create(&PostParams::default(), &binding).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(error) => Err(error).context("binding cluster-admin to the contenders' user"),
        }
    }

    /// A client acting as the contenders' user.
    pub async fn contender_client(&self, user_agent: &str) -> anyhow::Result<kube::Client> {
        client_of(&self.contender_kubeconfig(), user_agent).await
    }

    /// The service (`serve`) as the contenders' user, its shard Leases and its
    /// applications' registrations in `namespace` (so a later case's service resumes none
    /// of an earlier case's applications), at its defaults; `uncapped`: its QPS cap lifted,
    /// that many creates in flight. Returned serving and holding every shard's Lease (as a
    /// deployed replica is before drivers come), so its start is over before a case or
    /// window begins.
    pub async fn serve(
        &self,
        namespace: &str,
        uncapped: Option<u32>,
    ) -> anyhow::Result<ServeProcess> {
        let identity = format!("{namespace}-0");
        let mut env = vec![
            ("SPARK_POD_ALLOCATOR__HA__IDENTITY", identity.clone()),
            ("SPARK_POD_ALLOCATOR__HA__LEASE_NAMESPACE", namespace.into()),
            (
                "SPARK_POD_ALLOCATOR__REGISTRATIONS__NAMESPACE",
                namespace.into(),
            ),
        ];
        if let Some(concurrency) = uncapped {
            env.extend([
                (
                    "SPARK_POD_ALLOCATOR__KUBERNETES__QPS",
                    "1000000".to_string(),
                ),
                (
                    "SPARK_POD_ALLOCATOR__KUBERNETES__BURST",
                    "1000000".to_string(),
                ),
                (
                    "SPARK_POD_ALLOCATOR__KUBERNETES__CREATE_CONCURRENCY",
                    concurrency.to_string(),
                ),
            ]);
        }
        let service = ServeProcess::start(&self.contender_kubeconfig(), &env).await?;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let shards = HaSettings::default().shards;
        wait_every(
            "`serve` to hold its shard Leases",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || {
                let leases = leases.clone();
                let identity = identity.clone();
                async move {
                    let held = leases
                        .list(&ListParams::default())
                        .await?
                        .items
                        .iter()
                        .filter(|lease| {
                            lease.metadata.name.as_deref().is_some_and(|name| {
                                name.starts_with(spark_pod_allocator::ha::shards::LEASE_NAME_PREFIX)
                            }) && lease
                                .spec
                                .as_ref()
                                .and_then(|spec| spec.holder_identity.as_deref())
                                == Some(identity.as_str())
                        })
                        .count();
                    Ok(held >= shards as usize)
                }
            },
        )
        .await?;
        Ok(service)
    }

    /// A Spark driver as the contenders' user, asking for `n` executors of application
    /// `app` in `namespace`: with Spark's own allocator, or given `service` (a gRPC address)
    /// with the plugin at its two required settings. Its output goes to a log beside the
    /// cluster's.
    pub fn spark_driver(
        &self,
        script: &Path,
        namespace: &str,
        n: u32,
        app: &str,
        heap: &str,
        service: Option<&str>,
    ) -> anyhow::Result<tokio::process::Child> {
        let log_path = self.spark_driver_log(namespace, app);
        let log = std::fs::File::create(&log_path)?;
        tokio::process::Command::new("bash")
            .arg(script)
            .arg(&self.url)
            .arg(self.ca_cert())
            .arg(&self.token)
            .arg(namespace)
            .arg(n.to_string())
            .arg(app)
            .args(service)
            .env("DRIVER_HEAP", heap)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", script.display()))
    }

    /// Where [`Self::spark_driver`] writes the output of the driver of `app` in `namespace`.
    pub fn spark_driver_log(&self, namespace: &str, app: &str) -> PathBuf {
        self.dir.path().join(format!("spark-{namespace}-{app}.log"))
    }

    /// Creates `name` and waits for its `default` ServiceAccount (pods need it).
    pub async fn create_namespace(&self, name: &str) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        wait_every(
            "the namespace's default ServiceAccount",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async { Ok(accounts.get_opt("default").await?.is_some()) },
        )
        .await
    }

    /// Deletes `name` with its pods (at once, no grace) and waits until it is gone.
    pub async fn delete_namespace(&self, name: &str) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), name);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        // Only speeds the namespace's deletion up (no grace): when the one big request is
        // cut off (seen at 10,000 pods), the namespace controller deletes what is left.
        if let Err(err) = pods.delete_collection(&now, &ListParams::default()).await {
            eprintln!("deleting the pods of {name} at once failed ({err}); deleting the namespace");
        }
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting namespace {name}"))?;
        wait_every(
            "the namespace's deletion",
            Duration::from_secs(900),
            Duration::from_millis(500),
            || async { Ok(namespaces.get_opt(name).await?.is_none()) },
        )
        .await
    }

    /// Stops it (stdin closed: a clean shutdown), killing it after 30 s.
    pub async fn stop(mut self) {
        drop(self.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

async fn client_of(kubeconfig: &Path, user_agent: &str) -> anyhow::Result<kube::Client> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(spark_pod_allocator::k8s::client_as(config, user_agent)?)
}

/// Resolves Spark's jars and compiles the driver (once per Spark version).
pub async fn prepare_spark_driver(script: &Path) -> anyhow::Result<()> {
    let status = tokio::process::Command::new("bash")
        .arg(script)
        .arg("--prepare")
        .status()
        .await
        .with_context(|| format!("running {} --prepare", script.display()))?;
    anyhow::ensure!(status.success(), "{} --prepare: {status}", script.display());
    Ok(())
}

/// Running pods of one namespace, from a watch (as the API server reports them).
pub struct RunningWatch {
    state: Arc<Mutex<WatchState>>,
    count: tokio::sync::watch::Receiver<u32>,
    /// When the first pod was seen.
    seen: tokio::sync::watch::Receiver<Option<Instant>>,
    /// Bytes of the watch events received, as the API server frames them in JSON.
    event_bytes: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct WatchState {
    running: HashSet<String>,
    first_seen: Option<Instant>,
    /// (when, Running), at most one every 100 ms (the last of each stretch).
    samples: Vec<(Instant, u32)>,
}

impl RunningWatch {
    pub fn start(client: kube::Client, namespace: &str) -> Self {
        let pods: Api<Pod> = Api::namespaced(client, namespace);
        let state = Arc::new(Mutex::new(WatchState::default()));
        let (count_tx, count) = tokio::sync::watch::channel(0);
        let (seen_tx, seen) = tokio::sync::watch::channel(None);
        let shared = state.clone();
        let event_bytes = Arc::new(AtomicU64::new(0));
        let bytes = Arc::clone(&event_bytes);
        let task = tokio::spawn(async move {
            let mut events = watcher(pods, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let (pod, present) = match event {
                    Ok(watcher::Event::Apply(pod)) => {
                        bytes.fetch_add(watch_event_bytes("MODIFIED", &pod), Ordering::Relaxed);
                        (pod, true)
                    }
                    Ok(watcher::Event::InitApply(pod)) => (pod, true),
                    Ok(watcher::Event::Delete(pod)) => {
                        bytes.fetch_add(watch_event_bytes("DELETED", &pod), Ordering::Relaxed);
                        (pod, false)
                    }
                    Ok(_) | Err(_) => continue,
                };
                let Some(name) = pod.metadata.name.clone() else {
                    continue;
                };
                let running = present
                    && pod.metadata.deletion_timestamp.is_none()
                    && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                let now = Instant::now();
                let Ok(mut state) = shared.lock() else {
                    return;
                };
                if state.first_seen.is_none() {
                    state.first_seen = Some(now);
                    seen_tx.send_replace(Some(now));
                }
                if running {
                    state.running.insert(name);
                } else {
                    state.running.remove(&name);
                }
                let count = u32::try_from(state.running.len()).unwrap_or(u32::MAX);
                match state.samples.last_mut() {
                    Some((at, last)) if now.duration_since(*at) < Duration::from_millis(100) => {
                        *last = count;
                    }
                    _ => state.samples.push((now, count)),
                }
                drop(state);
                count_tx.send_replace(count);
            }
        });
        Self {
            state,
            count,
            seen,
            event_bytes,
            task,
        }
    }

    /// Bytes of the watch events this watch received so far (not its listings), as the
    /// API server sends them in JSON: what one more watch of the same pods costs it.
    pub fn event_bytes(&self) -> u64 {
        self.event_bytes.load(Ordering::Relaxed)
    }

    /// Waits until `n` pods are Running, for at most `bound` (`None`: no bound): when they
    /// were, or `None` when the bound passed first.
    pub async fn wait_for(
        &self,
        n: u32,
        bound: Option<Duration>,
    ) -> anyhow::Result<Option<Instant>> {
        let mut count = self.count.clone();
        let reached = count.wait_for(|running| *running >= n);
        let reached = match bound {
            Some(bound) => match tokio::time::timeout(bound, reached).await {
                Ok(reached) => reached,
                Err(_) => return Ok(None),
            },
            None => reached.await,
        };
        match reached {
            Ok(_) => Ok(Some(Instant::now())),
            Err(_) => bail!("the watch ended"),
        }
    }

    /// Waits for the first pod, for at most `bound`: when it was seen.
    pub async fn wait_for_first(&self, bound: Duration) -> anyhow::Result<Instant> {
        let mut seen = self.seen.clone();
        match tokio::time::timeout(bound, seen.wait_for(Option::is_some)).await {
            Ok(Ok(first)) => first.context("no pod seen"),
            Ok(Err(_)) => bail!("the watch ended"),
            Err(_) => bail!("no executor pod within {} s of the start", bound.as_secs()),
        }
    }

    /// Pods Running now.
    pub fn running(&self) -> u32 {
        *self.count.borrow()
    }

    /// (seconds since `origin`, Running) samples.
    pub fn samples(&self, origin: Instant) -> Vec<(f64, u32)> {
        self.state
            .lock()
            .map(|state| {
                state
                    .samples
                    .iter()
                    .map(|(at, n)| (at.saturating_duration_since(origin).as_secs_f64(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for RunningWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bytes of a JSON watch event of `pod` as the API server frames it
/// (`{"type":…,"object":…}` and a newline); ADDED and MODIFIED differ by three bytes, and
/// kube's watcher tells them apart no more.
fn watch_event_bytes(kind: &str, pod: &Pod) -> u64 {
    let object = serde_json::to_vec(pod).map_or(0, |json| json.len());
    let framing = r#"{"type":"","object":}"#.len() + kind.len() + 1;
    u64::try_from(object + framing).unwrap_or(u64::MAX)
}

/// Requests counted from the audit log.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    pub total: u64,
    pub by_verb: BTreeMap<String, u64>,
    /// Answered 429 (API Priority and Fairness, or max-inflight).
    pub throttled: u64,
    /// Pod watches served over WebSocket (answered 101): the API server counts no event of
    /// those in `apiserver_watch_events_sizes` (fabric8, Spark's client, watches so).
    pub websocket_pod_watches: u64,
}

impl Requests {
    /// `create 1000, watch 2, …`, most first.
    pub fn verbs(&self) -> String {
        let mut verbs: Vec<_> = self.by_verb.iter().collect();
        verbs.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        verbs
            .iter()
            .map(|(verb, n)| format!("{verb} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The audit log from a point on: the requests received after it was opened.
pub struct AuditWindow {
    path: PathBuf,
    offset: u64,
}

impl AuditWindow {
    /// From the log's current end.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let offset = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        Ok(Self {
            path: path.to_path_buf(),
            offset,
        })
    }

    /// Requests logged since it was opened whose User-Agent `sent` picks: each request
    /// once (a watch logs a start and an end under one audit id).
    pub fn count(&self, sent: impl Fn(&str) -> bool) -> anyhow::Result<Requests> {
        let mut file = std::fs::File::open(&self.path)
            .with_context(|| format!("the audit log {}", self.path.display()))?;
        file.seek(std::io::SeekFrom::Start(self.offset))?;
        let mut seen = HashSet::new();
        let mut requests = Requests::default();
        for line in std::io::BufReader::new(file).lines() {
            let line = line?;
            let Some(event) = AuditEvent::parse(&line) else {
                continue;
            };
            if !sent(&event.user_agent) || !seen.insert(event.audit_id) {
                continue;
            }
            requests.total += 1;
            if event.code == Some(429) {
                requests.throttled += 1;
            }
            if event.verb == "watch" && event.resource == "pods" && event.code == Some(101) {
                requests.websocket_pod_watches += 1;
            }
            *requests.by_verb.entry(event.verb).or_default() += 1;
        }
        Ok(requests)
    }
}

/// What the bench reads of one audit event.
#[derive(Debug, PartialEq)]
struct AuditEvent {
    audit_id: String,
    user_agent: String,
    verb: String,
    /// The resource named (`objectRef.resource`), empty when none.
    resource: String,
    code: Option<u64>,
}

impl AuditEvent {
    fn parse(line: &str) -> Option<Self> {
        let event: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |key: &str| event.get(key)?.as_str().map(str::to_string);
        Some(Self {
            audit_id: text("auditID")?,
            user_agent: text("userAgent").unwrap_or_default(),
            verb: text("verb").unwrap_or_default(),
            resource: (event.get("objectRef"))
                .and_then(|o| o.get("resource"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_string(),
            code: event
                .get("responseStatus")
                .and_then(|status| status.get("code"))
                .and_then(serde_json::Value::as_u64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_contender_is_told_apart_by_its_user_agent() {
        let service = spark_pod_allocator::k8s::replica_user_agent("bench-uncapped-1-0");
        let spark = "fabric8-kubernetes-client/7.1.0";
        for (case, mine) in [
            (Case::Bare, BARE_USER_AGENT),
            (Case::ServiceUncapped, service.as_str()),
            (Case::Adaptive, spark_pod_allocator::k8s::USER_AGENT),
            (Case::SparkOwn, spark),
        ] {
            assert!(case.sent(mine), "{case:?} sends as {mine}");
            for other in [
                BARE_USER_AGENT,
                service.as_str(),
                spark,
                OBSERVER_USER_AGENT,
            ] {
                if other != mine && !(is_service(other) && is_service(mine)) {
                    assert!(!case.sent(other), "{case:?} does not send as {other}");
                }
            }
        }
        assert!(!is_service(OBSERVER_USER_AGENT));
        assert!(!is_service(BARE_USER_AGENT));
    }

    #[test]
    fn the_default_run_sweeps_the_bare_client_and_leaves_the_service_at_its_defaults() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        let args = Cli::parse_from(["bench", "--apiserver-bin", "/x"]).args;
        assert_eq!(args.max_seconds, None, "no bound unless asked");
        assert!(!args.fresh_control_plane);
        let entries = Entry::all(&args);
        let labels: Vec<String> = entries.iter().map(|e| e.label()).collect();
        assert_eq!(
            labels,
            [
                "bare client, 25 in flight",
                "bare client, 50 in flight",
                "bare client, 100 in flight",
                "bare client, 200 in flight",
                "bare client, 400 in flight",
                "service at its defaults",
                "Spark's own allocator",
            ]
        );
        // Spark 4.2's batch and delay, as the plugin sends them; the policy is the service's.
        let settings = Case::Service.settings();
        assert_eq!(settings.batch_size, Some(20));
        assert_eq!(settings.batch_delay_ms, Some(1000));
        assert_eq!(settings.policy, None);
        assert_eq!(
            Case::Spark.settings().policy,
            Some(proto::AllocationPolicy::Spark as i32)
        );
        let swept = Cli::parse_from([
            "bench",
            "--apiserver-bin",
            "/x",
            "--cases",
            "spark-own,bare,adaptive-uncapped",
            "--bare-concurrency",
            "10,20",
            "--max-seconds",
            "600",
        ])
        .args;
        assert_eq!(swept.max_seconds, Some(600));
        let entries = Entry::all(&swept);
        assert_eq!(
            entries
                .iter()
                .map(|e| (e.case, e.concurrency))
                .collect::<Vec<_>>(),
            [
                (Case::SparkOwn, 0),
                (Case::Bare, 10),
                (Case::Bare, 20),
                (Case::ServiceUncapped, 100),
            ]
        );
    }

    #[test]
    fn a_watch_counts_once_and_429s_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(
            &path,
            "{\"auditID\":\"old\",\"userAgent\":\"a\",\"verb\":\"create\"}\n",
        )
        .unwrap();
        let window = AuditWindow::open(&path).unwrap();
        let lines = [
            r#"{"auditID":"1","stage":"ResponseStarted","userAgent":"a","verb":"watch","responseStatus":{"code":200}}"#,
            r#"{"auditID":"1","stage":"ResponseComplete","userAgent":"a","verb":"watch","responseStatus":{"code":200}}"#,
            r#"{"auditID":"2","stage":"ResponseComplete","userAgent":"a","verb":"create","responseStatus":{"code":429}}"#,
            r#"{"auditID":"3","stage":"ResponseComplete","userAgent":"b","verb":"create","responseStatus":{"code":201}}"#,
            r#"{"auditID":"4","stage":"ResponseStarted","userAgent":"b","verb":"watch","objectRef":{"resource":"pods"},"responseStatus":{"code":101}}"#,
            r#"{"auditID":"5","stage":"ResponseStarted","userAgent":"b","verb":"watch","objectRef":{"resource":"configmaps"},"responseStatus":{"code":101}}"#,
            r#"{"auditID":"6","stage":"ResponseStarted","userAgent":"b","verb":"watch","objectRef":{"resource":"pods"},"responseStatus":{"code":200}}"#,
            "not json",
        ];
        let mut text = std::fs::read_to_string(&path).unwrap();
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(&path, text).unwrap();
        let counted = window.count(|ua| ua == "a").unwrap();
        assert_eq!(counted.total, 2);
        assert_eq!(counted.throttled, 1);
        assert_eq!(counted.verbs(), "create 1, watch 1");
        let b = window.count(|ua| ua == "b").unwrap();
        assert_eq!(b.total, 4);
        // Only the pod watch upgraded to a WebSocket escapes the server's event metrics.
        assert_eq!(b.websocket_pod_watches, 1);
        assert_eq!(counted.websocket_pod_watches, 0);
    }
}
