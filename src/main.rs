//! CLI wiring only: configuration, logging, signals, and which parts to start.
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use tokio::net::TcpListener;

use spark_pod_allocator::app::SystemClock;
use spark_pod_allocator::auth::Gate;
use spark_pod_allocator::config::{LogFormat, Settings};
use spark_pod_allocator::grpc::forward::{Forwarder, PeerSettings};
use spark_pod_allocator::grpc::{ServeSettings, StartDefaults};
use spark_pod_allocator::metrics::{self, Metrics};
use spark_pod_allocator::{config, jemalloc, k8s, runtime};
use spark_pod_allocator_sim::{self as sim, SimCluster};

mod demo;

/// jemalloc rather than the system's malloc: glibc keeps what a load freed (per-thread
/// arenas, no trim without unsafe FFI), jemalloc's background thread hands it back to the
/// kernel after [`jemalloc::FREED_MEMORY_DECAY_MS`] (docs/security.md, "Memory under load").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Executor-pod allocation for Spark drivers on Kubernetes, as a gRPC service.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Configuration file (TOML or YAML); environment `SPARK_POD_ALLOCATOR__…` overrides it.
    #[arg(long, global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    /// Log line format (default: the configuration's `log.format`, else text).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormatArg>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormatArg {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the gRPC API until SIGINT or SIGTERM (executor pods are left in place).
    Serve {
        /// Run against an embedded simulated cluster instead of a real one.
        #[arg(long)]
        simulate: bool,
        /// Listen address, e.g. 0.0.0.0:50051 (overrides the configuration's `listen`).
        #[arg(long, value_name = "IP:PORT", value_parser = socket_address)]
        listen: Option<SocketAddr>,
        /// With --simulate: where to write a kubeconfig for the simulated cluster (default:
        /// a file in the temporary directory, removed at exit; the log names it).
        #[arg(long, value_name = "PATH", requires = "simulate")]
        kubeconfig: Option<PathBuf>,
    },
    /// Run the simulated cluster alone, for kubectl or a separately started service.
    Simulate {
        /// Address of the simulated API server (overrides `simulator.listen`).
        #[arg(long)]
        listen: Option<String>,
        /// Where to write a kubeconfig pointing at it.
        #[arg(long, value_name = "PATH")]
        kubeconfig: PathBuf,
    },
    /// A test node for a real API server: registers a Node and runs the pods bound to it as
    /// local processes (the configuration's `simulator.kubelet.process_images`, `work_dir`),
    /// writing their status back as a kubelet does (docs/process-runtime.md).
    ProcessNode {
        /// The Node's name (pods select it with `kubernetes.io/hostname`).
        #[arg(long, default_value = "process-node")]
        node: String,
    },
    /// The simulated cluster, the service and a scripted driver, in one process.
    Demo,
}

/// `--listen`, with the expected form in the error.
fn socket_address(value: &str) -> Result<SocketAddr, String> {
    value.trim().parse().map_err(|_| {
        "expected an IP address and port such as 127.0.0.1:50051 or 0.0.0.0:50051 \
         (host names are not resolved)"
            .to_string()
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::load(cli.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let format = match cli.log_format {
        Some(LogFormatArg::Json) => LogFormat::Json,
        Some(LogFormatArg::Text) => LogFormat::Text,
        None => settings.log.format,
    };
    // The demo's table owns the terminal: only warnings unless RUST_LOG asks for more.
    let default_filter = match cli.command {
        Command::Demo => "warn",
        _ => settings.log.filter.as_str(),
    };
    if let Err(err) = init_tracing(format, default_filter) {
        eprintln!("error: {err:#}");
        return ExitCode::from(2);
    }
    if let Err(err) = jemalloc::return_freed_memory_promptly() {
        tracing::warn!(%err, "freed memory stays with the allocator until it is reused");
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve {
                simulate,
                listen,
                kubeconfig,
            } => {
                let simulate = simulate.then(|| SimulatedKubeconfig::at(kubeconfig));
                serve(settings, cli.config.clone(), simulate, listen).await
            }
            Command::Simulate { listen, kubeconfig } => {
                simulate(settings, listen, &kubeconfig).await
            }
            Command::ProcessNode { node } => process_node(settings, &node).await,
            Command::Demo => demo::run().await.map(|_| ()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each said once: many errors (kube's among them)
/// already repeat their source in their own message.
fn describe(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let message = cause.to_string();
        if line.contains(&message) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&message);
    }
    line
}

/// `RUST_LOG` wins over the configured filter.
fn init_tracing(format: LogFormat, default_filter: &str) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => tracing_subscriber::EnvFilter::try_new(&value)
            .with_context(|| format!("RUST_LOG={value:?} is not a valid filter"))?,
        _ => tracing_subscriber::EnvFilter::try_new(default_filter)
            .with_context(|| format!("log.filter {default_filter:?} is not a valid filter"))?,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    installed.map_err(|err| anyhow::anyhow!("cannot install the logger: {err}"))
}

/// Resolves on the first SIGINT or SIGTERM. The signals are listened to from the call on
/// (none is missed while starting up); a second one exits at once, for a user who will not
/// wait for open calls to drain (executor pods are left in place either way).
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    let mut signals = StopSignals::new().context("cannot listen for SIGINT")?;
    Ok(async move {
        signals.next().await;
        tokio::spawn(async move {
            signals.next().await;
            tracing::warn!("second signal: exiting at once; executor pods are left in place");
            std::process::exit(130);
        });
        tracing::info!("signal received (another one exits at once)");
    })
}

/// SIGINT and SIGTERM, as one stream of stop requests.
struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn new() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let interrupt = signal(SignalKind::interrupt())?;
            let terminate = match signal(SignalKind::terminate()) {
                Ok(terminate) => Some(terminate),
                Err(err) => {
                    tracing::warn!(%err, "cannot listen for SIGTERM; only SIGINT stops the service");
                    None
                }
            };
            Ok(Self {
                interrupt,
                terminate,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    async fn next(&mut self) {
        #[cfg(unix)]
        match &mut self.terminate {
            Some(terminate) => {
                tokio::select! {
                    _ = self.interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            }
            None => {
                self.interrupt.recv().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Where `serve --simulate` writes the simulated cluster's kubeconfig, so that kubectl can
/// look at the pods the service makes.
struct SimulatedKubeconfig {
    path: PathBuf,
    /// Chosen by the service (not `--kubeconfig`): removed when it stops.
    remove_at_exit: bool,
}

impl SimulatedKubeconfig {
    fn at(path: Option<PathBuf>) -> Self {
        match path {
            Some(path) => Self {
                path,
                remove_at_exit: false,
            },
            None => Self {
                path: std::env::temp_dir().join(format!(
                    "spark-pod-allocator-simulate-{}.kubeconfig",
                    std::process::id()
                )),
                remove_at_exit: true,
            },
        }
    }
}

async fn serve(
    settings: Settings,
    config_file: Option<PathBuf>,
    simulate: Option<SimulatedKubeconfig>,
    listen: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let stop = shutdown_signal()?;
    let address = listen.unwrap_or(settings.listen);
    settings
        .auth
        .check_listen(address)
        .map_err(anyhow::Error::msg)?;
    let defaults = StartDefaults {
        settings: settings.allocation.clone(),
        executor_pod_template: settings.default_template()?,
        limits: settings.limits.clone(),
    };
    let user_agent = k8s::replica_user_agent(settings.ha.identity());
    // Bound first: the address the replica advertises in its Leases is the one it serves.
    let listener = TcpListener::bind(address)
        .await
        .with_context(|| format!("cannot listen on {address}"))?;
    let bound = listener.local_addr().unwrap_or(address);
    let mut settings = settings;
    let peers = peer_settings(&mut settings, bound)?;
    // The simulated cluster, if any, lives as long as the service.
    let (client, sim) = if let Some(kubeconfig) = simulate {
        let cluster = SimCluster::start(settings.simulator.clone())
            .await
            .context("starting the simulated cluster")?;
        cluster.publish_kubeconfig(&kubeconfig.path)?;
        tracing::info!(api_server = %cluster.base_url(), kubeconfig = %kubeconfig.path.display(),
            "simulated cluster started");
        // As `k8s::connect`: the service's RequestPolicy retries, not kube's retry layer.
        let mut config = cluster.kube_config();
        config.default_retry = false;
        let client =
            k8s::client_as(config, &user_agent).context("a client for the simulated cluster")?;
        (client, Some((cluster, kubeconfig)))
    } else {
        let client = k8s::connect_as(&settings.kubernetes, &user_agent)
            .await
            .context("connecting to Kubernetes")?;
        (client, None)
    };
    // The one metrics handle: the gRPC layer, the applications and the pod client record
    // into it; its endpoint has an address of its own.
    let metrics = Metrics::with_application_labels(settings.metrics.application_labels);
    if let Some(address) = settings.metrics.listen {
        let bound = metrics::spawn(metrics.clone(), address)
            .await
            .with_context(|| format!("cannot serve metrics on {address} (metrics.listen)"))?;
        tracing::info!(address = %bound, "serving metrics at /metrics");
    }
    let gate = Gate::from_settings(&settings.auth, client.clone());
    tracing::info!(mode = settings.auth.mode.as_str(), "authentication");
    tracing::info!(
        identity = settings.ha.identity(),
        shards = settings.ha.shards,
        lease_namespace = settings
            .ha
            .lease_namespace
            .as_deref()
            .unwrap_or(settings.registrations.namespace()),
        "replica: acting on the shards whose Lease it holds"
    );
    let core = runtime::Builder::new(client, Arc::new(SystemClock))
        .with_settings(&settings)
        .with_metrics(metrics.clone())
        .build();
    // Budgets follow the configuration file while the service runs.
    let _budget_reloader = config_file.map(|path| {
        let interval = Duration::from_millis(settings.budgets_reload_interval_ms);
        tracing::info!(file = %path.display(), interval_ms = settings.budgets_reload_interval_ms,
            budgets = settings.budgets.len(), "budgets reloaded from the configuration file when it changes");
        config::watch_budgets(path, interval, core.applications().budgets().clone())
    });
    // Applications a previous service ran go on before the first call is taken.
    match core.applications().resume_registered().await {
        Ok(resumed) if !resumed.is_empty() => {
            tracing::info!(
                applications = resumed.len(),
                "applications resumed from their registrations"
            )
        }
        Ok(_) => {}
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the registrations of applications to resume (or their signing key); they resume on their driver's next Start")
        }
    }
    tracing::info!(address = %bound, tls = settings.tls.enabled(), "serving gRPC");
    let forwarder = Forwarder::new(
        core.applications().ownerships().clone(),
        peers,
        metrics.clone(),
    );
    let serve_settings = ServeSettings {
        defaults,
        metrics,
        gate,
        forwarder,
        tls: settings.tls.clone(),
        limits: settings.grpc.clone(),
        health_listen: settings.health.listen,
        ..ServeSettings::default()
    };
    let service = core
        .serve(serve_settings, listener)
        .context("starting the gRPC server")?;
    if let Some(address) = service.health_address() {
        tracing::info!(%address, "serving gRPC health for probes");
    }
    stop.await;
    service.shutdown().await?;
    match sim {
        Some((cluster, kubeconfig)) => {
            cluster.shutdown().await;
            if kubeconfig.remove_at_exit
                && let Err(err) = std::fs::remove_file(&kubeconfig.path)
            {
                tracing::warn!(path = %kubeconfig.path.display(), %err, "cannot remove the simulated cluster's kubeconfig");
            }
            tracing::info!("stopped, and the simulated cluster with its pods");
        }
        None => tracing::info!("stopped; executor pods left in place"),
    }
    Ok(())
}

/// Where this replica is reached by the others (`ha.advertise_address`, else `POD_IP` and
/// the port it is bound to, else that address unless a wildcard), and how it reaches them.
/// With TLS and no `ha.peer_ca_file` it advertises nothing: its applications' calls that
/// reach another replica are answered UNAVAILABLE there, naming it.
fn peer_settings(settings: &mut Settings, bound: SocketAddr) -> anyhow::Result<PeerSettings> {
    settings
        .ha
        .resolve_advertise_address(std::env::var("POD_IP").ok(), bound);
    let peers = PeerSettings {
        streams_per_connection: settings.grpc.max_concurrent_streams,
        streams_per_identity: settings.tenants.max_watch_streams_per_identity,
        ..PeerSettings::load(&settings.ha).map_err(anyhow::Error::msg)?
    };
    if settings.tls.enabled()
        && peers.ca_pem.is_none()
        && settings.ha.advertise_address.take().is_some()
    {
        tracing::warn!(
            "tls is on without ha.peer_ca_file: the other replicas cannot forward calls here"
        );
    }
    tracing::info!(
        advertise_address = settings.ha.advertise_address.as_deref(),
        "where the other replicas forward this replica's applications' calls"
    );
    Ok(peers)
}

async fn simulate(
    settings: Settings,
    listen: Option<String>,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let stop = shutdown_signal()?;
    let mut sim_settings = settings.simulator.clone();
    if let Some(listen) = listen {
        sim_settings.listen = listen;
    }
    sim::run_until(sim_settings, Some(kubeconfig), stop)
        .await
        .context("simulated cluster")
}

/// `process-node`: the Kubernetes connection of `serve` (`kubernetes.*`), the process
/// runtime of `simulator.kubelet`.
async fn process_node(settings: Settings, node: &str) -> anyhow::Result<()> {
    let stop = shutdown_signal()?;
    let config = k8s::config(&settings.kubernetes)
        .await
        .context("connecting to Kubernetes")?;
    let api_server = config.cluster_url.clone();
    let client = k8s::client_as(config, "spark-pod-allocator-process-node")
        .context("connecting to Kubernetes")?;
    sim::run_process_node(client, &api_server, &settings.simulator.kubelet, node, stop)
        .await
        .context("process node")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn describe_says_each_cause_once() {
        let inner = std::io::Error::other("no such file");
        let err = anyhow::Error::new(Repeats(inner)).context("connecting to Kubernetes");
        assert_eq!(
            describe(&err),
            "connecting to Kubernetes: outer: no such file"
        );
        let err = anyhow::anyhow!("plain").context("reading");
        assert_eq!(describe(&err), "reading: plain");
    }
}
