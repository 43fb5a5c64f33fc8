//! What the scenarios share: the simulated cluster as a child process, the service core
//! against it, a template, latency summaries and this process's resident memory.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use tonic::transport::{Channel, Endpoint};

use spark_pod_allocator::allocator::{AllocationSettings, ResourceProfileId};
use spark_pod_allocator::app::{AppId, Applications, StartApplication, SystemClock};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::Builder;

/// The service's binary, which the scenarios run in child processes: `SPARK_POD_ALLOCATOR_BIN`,
/// else `spark-pod-allocator` beside this binary (`cargo build --release --workspace --bins`
/// builds both into `target/release`).
pub fn service_binary() -> anyhow::Result<PathBuf> {
    let path = match std::env::var_os("SPARK_POD_ALLOCATOR_BIN") {
        Some(path) => PathBuf::from(path),
        None => std::env::current_exe()
            .context("this binary's path")?
            .with_file_name(format!(
                "spark-pod-allocator{}",
                std::env::consts::EXE_SUFFIX
            )),
    };
    if !path.is_file() {
        bail!(
            "the service binary {} is missing: build it beside this one \
             (`cargo build --release --workspace --bins`) or name it in SPARK_POD_ALLOCATOR_BIN",
            path.display()
        );
    }
    Ok(path)
}

/// The simulated cluster, run by the service binary's `simulate` in a child process (killed
/// when dropped).
pub struct SimProcess {
    child: tokio::process::Child,
    dir: tempfile::TempDir,
    /// A client of its API server.
    pub client: kube::Client,
}

impl SimProcess {
    /// Starts a cluster with room for `pods` Running pods (auto kubelet) and waits until
    /// its API server answers.
    pub async fn start(pods: u32) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("temporary directory")?;
        let kubeconfig: PathBuf = dir.path().join("kubeconfig");
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").context("free port")?;
            listener.local_addr()?.port()
        };
        let nodes = pods.div_ceil(500).max(1);
        let child = tokio::process::Command::new(service_binary()?)
            .args(["simulate", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env(
                "SPARK_POD_ALLOCATOR__SIMULATOR__KUBELET__NODES",
                nodes.to_string(),
            )
            .env(
                "SPARK_POD_ALLOCATOR__SIMULATOR__KUBELET__PODS_PER_NODE",
                "500",
            )
            .env("SPARK_POD_ALLOCATOR__LOG__FILTER", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting the simulated cluster")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let client = loop {
            if Instant::now() > deadline {
                bail!("the simulated cluster did not answer within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            let Ok(config) = kube::config::Kubeconfig::read_from(&kubeconfig) else {
                continue;
            };
            let Ok(config) =
                kube::Config::from_custom_kubeconfig(config, &Default::default()).await
            else {
                continue;
            };
            let client = spark_pod_allocator::k8s::client(config)?;
            if client.apiserver_version().await.is_ok() {
                break client;
            }
        };
        Ok(Self { child, dir, client })
    }

    /// Its kubeconfig, for services in processes of their own.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The service core (applications, shared watches, rate limit) against this cluster.
    pub fn service(&self, config: &Settings) -> Applications {
        self.service_with_metrics(config, Metrics::default())
    }

    /// [`Self::service`] recording into `metrics`, for a scenario that reads the service's
    /// counters (its refused creates).
    pub fn service_with_metrics(&self, config: &Settings, metrics: Metrics) -> Applications {
        Builder::new(self.client.clone(), Arc::new(SystemClock))
            .with_settings(config)
            .with_metrics(metrics)
            .build()
            .into_applications()
    }

    /// Stops the child process.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The service binary's `serve` in a child process (killed when dropped): loopback, no
/// authentication, its kubeconfig and any other settings from the environment.
pub struct ServeProcess {
    pub child: tokio::process::Child,
    pub client: ExecutorAllocatorClient<Channel>,
    /// Where it serves gRPC (loopback).
    pub address: std::net::SocketAddr,
}

impl ServeProcess {
    /// Starts it against `kubeconfig` with the `SPARK_POD_ALLOCATOR__…` settings in `env`
    /// and waits until it serves.
    pub async fn start(kubeconfig: &Path, env: &[(&str, String)]) -> anyhow::Result<Self> {
        let address = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").context("free port")?;
            listener.local_addr()?
        };
        // Its log (filter info, or `BENCH_SERVE_LOG_FILTER`) goes to the file
        // `BENCH_SERVE_LOG` names, else nowhere.
        let (filter, log) = match std::env::var_os("BENCH_SERVE_LOG") {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("opening {}", Path::new(&path).display()))?;
                let filter = std::env::var("BENCH_SERVE_LOG_FILTER");
                (filter.unwrap_or_else(|_| "info".into()), Some(file))
            }
            None => ("warn".into(), None),
        };
        let output = |log: &Option<std::fs::File>| -> anyhow::Result<Stdio> {
            Ok(match log {
                Some(file) => Stdio::from(file.try_clone()?),
                None => Stdio::null(),
            })
        };
        let child = tokio::process::Command::new(service_binary()?)
            .args(["serve", "--listen", &address.to_string()])
            .env("SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig)
            .env("SPARK_POD_ALLOCATOR__LOG__FILTER", &filter)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .stdout(output(&log)?)
            .stderr(output(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting `serve`")?;
        let channel = Endpoint::from_shared(format!("http://{address}"))?.connect_lazy();
        // Until it listens, a health watch fails at once: ask again.
        wait_for("`serve` to serve", Duration::from_secs(60), || {
            let channel = channel.clone();
            async move {
                let watch = spark_pod_allocator::runtime::wait_until_serving(channel);
                Ok(tokio::time::timeout(Duration::from_secs(5), watch)
                    .await
                    .is_ok_and(|served| served.is_ok()))
            }
        })
        .await?;
        Ok(Self {
            child,
            client: ExecutorAllocatorClient::new(channel),
            address,
        })
    }

    /// Its resident memory in bytes.
    pub fn rss_bytes(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().context("`serve` has exited")?;
        vm_rss(&format!("/proc/{pid}/status"))
    }

    /// Stops it as Kubernetes would (SIGTERM: its applications hand over, its Leases are
    /// released), and kills it after `grace`.
    pub async fn terminate(mut self, grace: Duration) {
        if let Some(pid) = self.child.id() {
            let _ = tokio::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// Polls `done` every 20 ms until it says so, for at most `bound`.
pub async fn wait_for<F, Fut>(what: &str, bound: Duration, done: F) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    wait_every(what, bound, Duration::from_millis(20), done).await
}

/// Polls `done` every `every` until it says so, for at most `bound`.
pub async fn wait_every<F, Fut>(
    what: &str,
    bound: Duration,
    every: Duration,
    done: F,
) -> anyhow::Result<()>
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + bound;
    while !done().await? {
        if Instant::now() > deadline {
            bail!("waited {} s for {what}", bound.as_secs());
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// A small executor pod template.
pub fn template() -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    }))?)
}

/// Starts application `id` in `default` with `settings`.
pub async fn start_app(
    apps: &Applications,
    id: &str,
    settings: AllocationSettings,
) -> anyhow::Result<AppId> {
    let app = AppId::parse(id).map_err(anyhow::Error::msg)?;
    apps.start(StartApplication {
        app_id: app.clone(),
        namespace: "default".into(),
        driver_pod_name: None,
        templates: BTreeMap::from([(ResourceProfileId(0), template()?)]),
        pod_name_prefix: None,
        settings,
        owner: None,
        claims: Vec::new(),
    })
    .await?;
    Ok(app)
}

/// Sets profile 0's target.
pub async fn set_target(apps: &Applications, app: &AppId, target: u32) -> anyhow::Result<()> {
    apps.set_total_expected(app, BTreeMap::from([(ResourceProfileId(0), target)]))
        .await?;
    Ok(())
}

/// Running executors of profile 0.
pub async fn running(apps: &Applications, app: &AppId) -> anyhow::Result<u32> {
    let status = apps.status(app).await?;
    Ok(status
        .profiles
        .get(&ResourceProfileId(0))
        .map_or(0, |p| p.running))
}

/// This process's resident memory in bytes (Linux `/proc/self/status`).
pub fn rss_bytes() -> anyhow::Result<u64> {
    vm_rss("/proc/self/status")
}

/// `VmRSS` of a `/proc/<pid>/status` file, in bytes.
fn vm_rss(path: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(path).with_context(|| path.to_string())?;
    let kb = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .with_context(|| format!("no VmRSS in {path}"))?;
    Ok(kb * 1024)
}

/// Latencies summarised: count, p50, p99, max.
pub struct Latencies {
    pub count: usize,
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

impl Latencies {
    /// The summary of `samples` (all zero when empty).
    pub fn of(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        let at = |q: f64| {
            if samples.is_empty() {
                return Duration::ZERO;
            }
            let index = ((samples.len() - 1) as f64 * q).round() as usize;
            samples[index.min(samples.len() - 1)]
        };
        Self {
            count: samples.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: samples.last().copied().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for Latencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "n={} p50={:.2} ms p99={:.2} ms max={:.2} ms",
            self.count,
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One goal line: `goal`, measured, ratio measured/goal and whether it is met.
pub fn report(what: &str, measured: f64, goal: f64, unit: &str) {
    let ratio = if goal > 0.0 {
        measured / goal
    } else {
        f64::NAN
    };
    let verdict = if measured <= goal { "met" } else { "MISSED" };
    println!("{what}: {measured:.2} {unit} (goal <= {goal} {unit}; ratio {ratio:.2}) {verdict}");
}
