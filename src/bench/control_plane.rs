//! Scale-up on the real control plane: the test API server (`tests/kube-apiserver`:
//! kube-apiserver over etcd, kube-scheduler, kube-controller-manager and kwok nodes, built
//! from Go modules) in a child process, and in the same run, one after another in fresh
//! namespaces:
//!
//! - the bare limit: a client that creates N pods, 100 at a time, with no client-side cap,
//!   retrying what the API server refuses (429, 5xx) after a second;
//! - the service (`serve` in a child process, as deployed) with ADAPTIVE, at its default
//!   QPS cap and with the cap lifted, and with the SPARK policy at Spark 4.2's batch of 20;
//! - a real Spark driver with Spark's own `ExecutorPodsAllocator`
//!   (`clients/spark/own-allocator-driver.sh`: client mode, Spark's defaults).
//!
//! Time is measured from the first executor pod the API server reports to N Running, from a
//! watch of the namespace (so a JVM's start-up is not counted against Spark). Every
//! contender acts as the same ordinary user (`alice`, bound to `cluster-admin`), so API
//! Priority and Fairness treats them alike (an admin in `system:masters` would be exempt).
//! Their requests are counted from the API server's audit log by User-Agent.
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::harness::{ServeProcess, wait_every};
use super::plot::{self, Series};
use super::scale_up::spread;
use crate::proto;

/// The User-Agent of the bench's own requests (namespaces, the watch); not counted.
const OBSERVER_USER_AGENT: &str = "spark-pod-allocator-bench/observer";
/// The User-Agent of the bare client.
pub const BARE_USER_AGENT: &str = "spark-pod-allocator-bench/bare";
/// What Spark's Kubernetes client (fabric8) puts in its User-Agent.
const SPARK_USER_AGENT: &str = "fabric8-kubernetes-client";
/// The ordinary user every contender acts as.
const CONTENDER_USER: &str = "alice";

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
    /// The Spark driver with Spark's own allocator.
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
    /// Runs of each case (min / median / max are printed).
    #[arg(long, default_value_t = 3)]
    pub runs: u32,
    /// Cases, comma-separated, run in this order within each run.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bare,adaptive-uncapped,adaptive,spark,spark-own"
    )]
    pub cases: Vec<Case>,
    /// Creates the bare client (and the uncapped service) keeps in flight.
    #[arg(long, default_value_t = 100)]
    pub concurrency: u32,
    /// Write a PNG of Running executors over time (the first run of each case).
    #[arg(long, value_name = "PATH")]
    pub plot: Option<PathBuf>,
    /// Give up on a case after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub max_seconds: u64,
}

/// Who creates the pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Case {
    /// The bare client: the API server's limit.
    Bare,
    /// The service, ADAPTIVE, at its default QPS cap (50, burst 100).
    Adaptive,
    /// The service, ADAPTIVE, with its QPS cap lifted: the API server's answers alone
    /// (429 with Retry-After, latency) pace it.
    AdaptiveUncapped,
    /// The service, SPARK policy, batch 20 every second (Spark 4.2's defaults).
    Spark,
    /// A Spark driver with Spark's own allocator.
    SparkOwn,
}

impl Case {
    fn label(self) -> &'static str {
        match self {
            Case::Bare => "bare client (the limit)",
            Case::Adaptive => "service ADAPTIVE (QPS 50)",
            Case::AdaptiveUncapped => "service ADAPTIVE (no QPS cap)",
            Case::Spark => "service SPARK (batch 20)",
            Case::SparkOwn => "Spark's own allocator",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Case::Bare => "bare",
            Case::Adaptive => "adaptive",
            Case::AdaptiveUncapped => "uncapped",
            Case::Spark => "spark",
            Case::SparkOwn => "spark-own",
        }
    }

    /// Whether a request with this User-Agent is this contender's.
    fn sent(self, user_agent: &str) -> bool {
        match self {
            Case::Bare => user_agent == BARE_USER_AGENT,
            Case::Adaptive | Case::AdaptiveUncapped | Case::Spark => is_service(user_agent),
            Case::SparkOwn => is_spark(user_agent),
        }
    }
}

/// The service's User-Agent (`spark-pod-allocator/<version>`, with a replica's identity),
/// not the bench's (`spark-pod-allocator-bench/…`).
pub fn is_service(user_agent: &str) -> bool {
    user_agent.starts_with(concat!(env!("CARGO_PKG_NAME"), "/"))
}

/// Spark's Kubernetes client.
pub fn is_spark(user_agent: &str) -> bool {
    user_agent.contains(SPARK_USER_AGENT)
}

/// Runs the scenario and prints its table (and writes the plot when asked).
pub async fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.executors > 0, "--executors must be above 0");
    anyhow::ensure!(args.runs > 0, "--runs must be above 0");
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be above 0");
    if args.cases.contains(&Case::SparkOwn) {
        prepare_spark_driver(&args.cluster.spark_driver).await?;
    }
    let cluster = ControlPlane::start(&args.cluster, args.executors).await?;
    println!(
        "control plane: {} with {} kwok nodes, scheduler QPS {}, kube-apiserver args {:?}; \
         {} executors, {} runs",
        cluster.url,
        cluster.nodes,
        match args.cluster.scheduler_qps {
            0 => "50 (default)".to_string(),
            qps => qps.to_string(),
        },
        args.cluster.apiserver_args,
        args.executors,
        args.runs
    );
    let result = measure_all(&args, &cluster).await;
    cluster.stop().await;
    let outcomes = result?;
    summarise(&args, &outcomes)
}

async fn measure_all(
    args: &Args,
    cluster: &ControlPlane,
) -> anyhow::Result<BTreeMap<usize, Vec<Outcome>>> {
    let mut outcomes: BTreeMap<usize, Vec<Outcome>> = BTreeMap::new();
    for run in 1..=args.runs {
        for (index, case) in args.cases.iter().enumerate() {
            let outcome = scale_up(args, cluster, *case, run)
                .await
                .with_context(|| format!("{} run {run}", case.label()))?;
            let reached = if outcome.running < args.executors {
                format!(
                    "{} of {} Running at the bound,",
                    outcome.running, args.executors
                )
            } else {
                format!("to {} Running", args.executors)
            };
            println!(
                "  {:<30} run {run}: {:>7.1} s {reached} (first pod {:.1} s after the \
                 start); requests {} ({}), 429s {}{}",
                case.label(),
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
                    .unwrap_or_default()
            );
            outcomes.entry(index).or_default().push(outcome);
        }
    }
    Ok(outcomes)
}

fn summarise(args: &Args, outcomes: &BTreeMap<usize, Vec<Outcome>>) -> anyhow::Result<()> {
    let of = |case: Case| {
        args.cases
            .iter()
            .position(|c| *c == case)
            .and_then(|i| outcomes.get(&i))
    };
    println!(
        "summary, {} executors (min / median / max of {} runs):",
        args.executors, args.runs
    );
    let bare = of(Case::Bare);
    for (index, case) in args.cases.iter().enumerate() {
        let Some(runs) = outcomes.get(&index) else {
            continue;
        };
        let time = spread(runs.iter().map(|o| o.seconds));
        let requests = spread(runs.iter().map(|o| o.requests.total as f64));
        let mut line = format!(
            "  {:<30} {:>7.1} / {:>7.1} / {:>7.1} s; requests {:.0} / {:.0} / {:.0}",
            case.label(),
            time.0,
            time.1,
            time.2,
            requests.0,
            requests.1,
            requests.2
        );
        if let Some(bare) = bare {
            let ratio = spread(
                runs.iter()
                    .zip(bare)
                    .map(|(o, b)| o.seconds / b.seconds.max(f64::MIN_POSITIVE)),
            );
            line += &format!("; x bare {:.2} / {:.2} / {:.2}", ratio.0, ratio.1, ratio.2);
        }
        if let Some(short) = runs.iter().map(|o| o.running).min()
            && short < args.executors
        {
            line += &format!(
                "; stopped by the bound with as few as {short} Running (its times and ratios \
                 are lower bounds)"
            );
        }
        if runs.iter().all(|o| o.rss.is_some()) {
            let per = spread(
                runs.iter()
                    .filter_map(|o| o.rss)
                    .map(|rss| rss as f64 / f64::from(args.executors)),
            );
            line += &format!(
                "; RSS/executor {:.0} / {:.0} / {:.0} B",
                per.0, per.1, per.2
            );
        }
        println!("{line}");
    }
    if let (Some(bare), Some(adaptive)) = (bare, of(Case::AdaptiveUncapped)) {
        let ratio = median_ratio(adaptive, bare);
        println!(
            "goal: ADAPTIVE (no QPS cap) within 1.2x the bare limit: {ratio:.2}x (median of \
             per-run ratios) {}",
            verdict(ratio <= 1.2)
        );
    }
    let fastest_adaptive = [Case::AdaptiveUncapped, Case::Adaptive]
        .into_iter()
        .find_map(|case| of(case).map(|runs| (case, runs)));
    if let (Some(spark), Some((case, adaptive))) = (of(Case::SparkOwn), fastest_adaptive) {
        let ratio = median_ratio(spark, adaptive);
        let bound = if spark.iter().any(|o| o.running < args.executors) {
            " (Spark's own stopped by the bound: at least this)"
        } else {
            ""
        };
        println!(
            "goal: {} at least 5x faster than Spark's own allocator: {ratio:.2}x{bound} {}",
            case.label(),
            verdict(ratio >= 5.0)
        );
    }
    if let Some(path) = &args.plot {
        let series: Vec<Series> = args
            .cases
            .iter()
            .enumerate()
            .filter_map(|(index, case)| {
                let first = outcomes.get(&index)?.first()?;
                Some(Series {
                    label: case.label().to_string(),
                    points: first.samples.clone(),
                })
            })
            .collect();
        let title = format!(
            "Running executors on the control plane, scale-up to {}",
            args.executors
        );
        plot::running_over_time(path, &title, &series)?;
        println!("plot: {}", path.display());
    }
    Ok(())
}

/// The median over runs of `a`'s time over `b`'s in the same run.
fn median_ratio(a: &[Outcome], b: &[Outcome]) -> f64 {
    spread(
        a.iter()
            .zip(b)
            .map(|(a, b)| a.seconds / b.seconds.max(f64::MIN_POSITIVE)),
    )
    .1
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// One case's run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The first executor pod seen to N Running, or to the bound (`--max-seconds`).
    pub seconds: f64,
    /// Pods Running at the end: N, or fewer when the bound stopped the contender.
    pub running: u32,
    /// The contender's start to its first pod seen.
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
    case: Case,
    run: u32,
) -> anyhow::Result<Outcome> {
    let namespace = format!("bench-{}-{run}", case.slug());
    cluster.create_namespace(&namespace).await?;
    let result = measure(args, cluster, case, &namespace).await;
    let cleaned = cluster.delete_namespace(&namespace).await;
    let outcome = result?;
    cleaned?;
    Ok(outcome)
}

async fn measure(
    args: &Args,
    cluster: &ControlPlane,
    case: Case,
    namespace: &str,
) -> anyhow::Result<Outcome> {
    let n = args.executors;
    let watch = RunningWatch::start(cluster.client.clone(), namespace);
    let audit = AuditWindow::open(&cluster.audit_log())?;
    let started = Instant::now();
    let contender = Contender::start(args, cluster, case, namespace).await?;
    let reached = watch
        .wait_for(n, Duration::from_secs(args.max_seconds))
        .await;
    let rss = match &contender {
        Contender::Service(service) => service.rss_bytes().ok(),
        _ => None,
    };
    let requests = audit.count(|user_agent| case.sent(user_agent));
    contender.stop().await;
    let reached = reached?;
    let requests = requests?;
    let first = watch.first_seen().context("no pod seen")?;
    // A contender stopped by the bound is measured up to it, with the pods it had Running.
    let (reached, running) = match reached {
        Some(at) => (at, n),
        None => (Instant::now(), watch.running()),
    };
    let seconds = reached.saturating_duration_since(first).as_secs_f64();
    // The scale-up only: the samples after N (the contender's teardown) are not plotted.
    let mut samples = watch.samples(first);
    samples.retain(|(at, _)| *at <= seconds);
    Ok(Outcome {
        seconds,
        running,
        first_pod: first.saturating_duration_since(started).as_secs_f64(),
        requests,
        rss,
        samples,
    })
}

/// A contender while it holds its executors.
enum Contender {
    Bare(tokio::task::JoinHandle<anyhow::Result<()>>),
    Service(ServeProcess),
    Spark(tokio::process::Child),
}

impl Contender {
    async fn start(
        args: &Args,
        cluster: &ControlPlane,
        case: Case,
        namespace: &str,
    ) -> anyhow::Result<Self> {
        let n = args.executors;
        Ok(match case {
            Case::Bare => {
                let client = cluster.contender_client(BARE_USER_AGENT).await?;
                let namespace = namespace.to_string();
                let concurrency = args.concurrency as usize;
                Contender::Bare(tokio::spawn(async move {
                    bare_create(client, &namespace, n, concurrency).await
                }))
            }
            Case::Adaptive | Case::AdaptiveUncapped | Case::Spark => {
                let service = cluster
                    .serve(namespace, case == Case::AdaptiveUncapped, args.concurrency)
                    .await?;
                let (batch_size, policy) = match case {
                    Case::Spark => (20, proto::AllocationPolicy::Spark),
                    _ => (10, proto::AllocationPolicy::Adaptive),
                };
                start_application(&service, namespace, "bench", n, batch_size, policy).await?;
                Contender::Service(service)
            }
            Case::SparkOwn => Contender::Spark(cluster.spark_driver(
                &args.cluster.spark_driver,
                namespace,
                n,
                "bench",
                "512m",
            )?),
        })
    }

    /// Lets go of the executors: the bare client is done, the service is stopped
    /// (SIGTERM), the Spark driver's stdin closed (it stops its SparkContext). The
    /// namespace's deletion removes the pods.
    async fn stop(self) {
        match self {
            Contender::Bare(task) => {
                task.abort();
                let _ = task.await;
            }
            Contender::Service(service) => service.terminate(Duration::from_secs(30)).await,
            Contender::Spark(mut driver) => {
                drop(driver.stdin.take());
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
    batch_size: u32,
    policy: proto::AllocationPolicy,
) -> anyhow::Result<()> {
    let mut client = service.client.clone();
    client
        .start(proto::StartRequest {
            application_id: app.into(),
            namespace: namespace.into(),
            executor_pod_template: EXECUTOR_TEMPLATE.into(),
            settings: Some(proto::AllocationSettings {
                batch_size: Some(batch_size),
                batch_delay_ms: Some(1000),
                policy: Some(policy as i32),
                ..Default::default()
            }),
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

/// The executors' pod: the requests of the Spark driver's executors (100m CPU; 512m heap
/// and Spark's 384 MiB overhead).
pub const EXECUTOR_TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  \
- name: spark-kubernetes-executor\n    image: spark:4\n    resources:\n      requests:\n        \
cpu: 100m\n        memory: 896Mi\n      limits:\n        memory: 896Mi\n";

/// Creates `n` executor pods, `concurrency` at a time, each retried after a second while the
/// API server refuses it for now (429, 5xx, a broken connection).
async fn bare_create(
    client: kube::Client,
    namespace: &str,
    n: u32,
    concurrency: usize,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let template: Pod = serde_yaml::from_str(EXECUTOR_TEMPLATE)?;
    futures::stream::iter(1..=n)
        .map(|id| {
            let pods = pods.clone();
            let mut pod = template.clone();
            async move {
                pod.metadata.name = Some(format!("bare-exec-{id}"));
                pod.metadata.labels = Some(BTreeMap::from([
                    ("spark-role".to_string(), "executor".to_string()),
                    ("spark-exec-id".to_string(), id.to_string()),
                ]));
                loop {
                    match pods.create(&PostParams::default(), &pod).await {
                        Ok(_) => return Ok(()),
                        Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
                        Err(kube::Error::Api(status))
                            if status.code != 429 && status.code < 500 =>
                        {
                            bail!("create bare-exec-{id}: {status:?}")
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

    /// Where the API server's and the Spark drivers' logs are.
    pub fn log_dir(&self) -> &Path {
        self.dir.path()
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

    /// The service (`serve`) as the contenders' user, its shard Leases in `namespace`.
    /// `uncapped`: its QPS cap lifted, `concurrency` creates in flight.
    pub async fn serve(
        &self,
        namespace: &str,
        uncapped: bool,
        concurrency: u32,
    ) -> anyhow::Result<ServeProcess> {
        let mut env = vec![
            (
                "SPARK_POD_ALLOCATOR__HA__IDENTITY",
                format!("{namespace}-0"),
            ),
            ("SPARK_POD_ALLOCATOR__HA__LEASE_NAMESPACE", namespace.into()),
        ];
        if uncapped {
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
        ServeProcess::start(&self.contender_kubeconfig(), &env).await
    }

    /// A Spark driver with Spark's own allocator, as the contenders' user, asking for `n`
    /// executors of application `app` in `namespace`; its output goes to a log beside the
    /// cluster's.
    pub fn spark_driver(
        &self,
        script: &Path,
        namespace: &str,
        n: u32,
        app: &str,
        heap: &str,
    ) -> anyhow::Result<tokio::process::Child> {
        let log_path = self.dir.path().join(format!("spark-{namespace}-{app}.log"));
        let log = std::fs::File::create(&log_path)?;
        tokio::process::Command::new("bash")
            .arg(script)
            .arg(&self.url)
            .arg(self.ca_cert())
            .arg(&self.token)
            .arg(namespace)
            .arg(n.to_string())
            .arg(app)
            .env("DRIVER_HEAP", heap)
            .stdin(Stdio::piped())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", script.display()))
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
    Ok(crate::k8s::client_as(config, user_agent)?)
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
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut events = watcher(pods, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let (pod, present) = match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => (pod, true),
                    Ok(watcher::Event::Delete(pod)) => (pod, false),
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
                state.first_seen.get_or_insert(now);
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
        Self { state, count, task }
    }

    /// Waits until `n` pods are Running, for at most `bound`: when they were, or `None`
    /// when the bound passed first.
    pub async fn wait_for(&self, n: u32, bound: Duration) -> anyhow::Result<Option<Instant>> {
        let mut count = self.count.clone();
        match tokio::time::timeout(bound, count.wait_for(|running| *running >= n)).await {
            Ok(Ok(_)) => Ok(Some(Instant::now())),
            Ok(Err(_)) => bail!("the watch ended"),
            Err(_) => Ok(None),
        }
    }

    /// Pods Running now.
    pub fn running(&self) -> u32 {
        *self.count.borrow()
    }

    /// When the first pod was seen.
    pub fn first_seen(&self) -> Option<Instant> {
        self.state.lock().ok()?.first_seen
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

/// Requests counted from the audit log.
#[derive(Debug, Clone, Default)]
pub struct Requests {
    pub total: u64,
    pub by_verb: BTreeMap<String, u64>,
    /// Answered 429 (API Priority and Fairness, or max-inflight).
    pub throttled: u64,
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
            *requests.by_verb.entry(event.verb).or_default() += 1;
            if event.code == Some(429) {
                requests.throttled += 1;
            }
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
        let service = crate::k8s::replica_user_agent("bench-uncapped-1-0");
        let spark = "fabric8-kubernetes-client/7.1.0";
        for (case, mine) in [
            (Case::Bare, BARE_USER_AGENT),
            (Case::AdaptiveUncapped, service.as_str()),
            (Case::Adaptive, crate::k8s::USER_AGENT),
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
        assert_eq!(window.count(|ua| ua == "b").unwrap().total, 1);
    }
}
