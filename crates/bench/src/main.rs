//! `spark-pod-allocator-bench <scenario>`: measurements of the service against the simulated
//! cluster or the real control plane, each printed with its goal and its ratio to a baseline
//! or limit measured in the same run (docs/benchmarks.md). One file per scenario; `harness`
//! holds what they share (the simulator and the service binary as child processes, RSS,
//! latency summaries). A crate of its own so that the service's binary carries no plotting.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use spark_pod_allocator::jemalloc;

mod api_load;
mod budgets;
mod control_plane;
mod failover;
mod fairness;
mod harness;
mod many_apps;
mod memory;
mod plot;
mod scale_up;
mod streams;
mod summary;

/// The service's allocator, so that what the scenarios in this process measure is what the
/// service keeps (`spark_pod_allocator::jemalloc`).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Measures one scenario (see docs/benchmarks.md).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

/// The scenarios.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Time to N executors Running, per allocation policy, against N / QPS + pod start.
    ScaleUp(scale_up::Args),
    /// On the real control plane (the test API server with a scheduler and kwok nodes):
    /// time to N executors Running for the service at its defaults, Spark's own allocator
    /// and a bare client swept over concurrencies (its best is the limit), in the same run,
    /// the cases' order rotated per run, with their requests.
    ControlPlane(control_plane::Args),
    /// On the real control plane: real Spark drivers through the service (the plugin at its
    /// defaults) against as many with their own allocator: requests, bytes of pods served
    /// and the API server's CPU, during the scale-up and at steady state.
    ApiLoad(api_load::Args),
    /// Memory per executor at N Running executors over repeated resyncs (the simulator in a
    /// child process, so the memory measured is the service's alone).
    Memory {
        #[arg(long, default_value_t = 10_000)]
        executors: u32,
        #[arg(long, default_value_t = 10)]
        resyncs: u32,
        /// Seconds between two full LISTs.
        #[arg(long, default_value_t = 3)]
        resync_interval_s: u64,
    },
    /// IsDeleted latency while applications scale up together, and a small application's
    /// time to its first executor.
    Fairness {
        #[arg(long, default_value_t = 50)]
        applications: u32,
        #[arg(long, default_value_t = 200)]
        executors_each: u32,
        /// Seconds IsDeleted is measured while they scale.
        #[arg(long, default_value_t = 20)]
        window_s: u64,
        /// Executors of the big application a small one runs beside.
        #[arg(long, default_value_t = 10_000)]
        big_executors: u32,
    },
    /// Memory per WatchExecutors stream that is never read, before and after churn.
    Streams {
        #[arg(long, default_value_t = 100)]
        executors: u32,
        #[arg(long, default_value_t = 500)]
        streams: u32,
        #[arg(long, default_value_t = 5)]
        churn: u32,
        /// `tenants.watch_stream_buffer_bytes`.
        #[arg(long, default_value_t = spark_pod_allocator::app::tenants::STREAM_BUFFER_BYTES)]
        buffer_bytes: usize,
    },
    /// Two replicas: forwarding's cost (IsDeleted through the non-owner against the owner),
    /// and the time from the owner's kill, and from its Lease's expiry, to the other
    /// replica's first create.
    Failover {
        /// `ha.lease_duration_ms` (whole seconds).
        #[arg(long, default_value_t = 15_000)]
        lease_ms: u64,
        #[arg(long, default_value_t = 10_000)]
        renew_deadline_ms: u64,
        #[arg(long, default_value_t = 2_000)]
        retry_ms: u64,
        /// IsDeleted calls through each replica.
        #[arg(long, default_value_t = 1_000)]
        calls: u32,
        #[arg(long, default_value_t = 200)]
        executors: u32,
        /// `sim` (the simulator, a child process) or `real` (the test control plane, with
        /// kube-scheduler at 5,000 QPS and room for every pod).
        #[arg(long, default_value = "sim", value_parser = ["sim", "real"])]
        cluster: String,
        /// The test API server binary, with `--cluster real`
        /// (`scripts/build-test-apiserver.sh` prints its path).
        #[arg(long, env = "TEST_APISERVER_BIN")]
        apiserver_bin: Option<std::path::PathBuf>,
    },
    /// Applications with changing demand over a namespace budget, against the same demand
    /// racing for a ResourceQuota of the same pods: Jain's fairness index over time, the
    /// time for held demand to be admitted, and the creates refused 403/429.
    Budgets {
        #[arg(long, default_value_t = 20)]
        applications: u32,
        /// The namespace budget (and the quota's pods in the run without it).
        #[arg(long, default_value_t = 200)]
        max_executors: u32,
        /// The largest target an application asks for.
        #[arg(long, default_value_t = 40)]
        max_target: u32,
        #[arg(long, default_value_t = 8)]
        phases: u32,
        /// Seconds of each phase of constant demand.
        #[arg(long, default_value_t = 8)]
        phase_s: u64,
        /// Milliseconds between two drivers' first targets.
        #[arg(long, default_value_t = 100)]
        arrival_ms: u64,
        /// Milliseconds between two measurements.
        #[arg(long, default_value_t = 250)]
        sample_ms: u64,
        #[arg(long, default_value_t = 24)]
        seed: u64,
    },
    /// GetStatus latency under a burst of SetTotalExpected over many applications, then
    /// every application stopped at once.
    ManyApps {
        #[arg(long, default_value_t = 2_000)]
        applications: u32,
        /// The shared rate limit of mutating requests.
        #[arg(long, default_value_t = 1_000)]
        qps: u32,
    },
}

/// Runs one scenario, printing its results.
pub async fn run(scenario: Scenario) -> anyhow::Result<()> {
    match scenario {
        Scenario::ScaleUp(args) => scale_up::run(args).await,
        Scenario::ControlPlane(args) => control_plane::run(args).await,
        Scenario::ApiLoad(args) => api_load::run(args).await,
        Scenario::Memory {
            executors,
            resyncs,
            resync_interval_s,
        } => {
            memory::run(&memory::MemoryBench {
                executors,
                resyncs,
                resync_interval: Duration::from_secs(resync_interval_s.max(1)),
            })
            .await
        }
        Scenario::Fairness {
            applications,
            executors_each,
            window_s,
            big_executors,
        } => {
            fairness::run(&fairness::FairnessBench {
                applications: applications.max(1),
                executors_each,
                window: Duration::from_secs(window_s.max(3)),
                big_executors,
            })
            .await
        }
        Scenario::Streams {
            executors,
            streams,
            churn,
            buffer_bytes,
        } => {
            streams::run(&streams::StreamsBench {
                executors,
                streams,
                churn,
                buffer_bytes,
            })
            .await
        }
        Scenario::Failover {
            lease_ms,
            renew_deadline_ms,
            retry_ms,
            calls,
            executors,
            cluster,
            apiserver_bin,
        } => {
            let real = match (cluster.as_str(), apiserver_bin) {
                ("real", Some(apiserver_bin)) => Some(control_plane::ClusterArgs {
                    apiserver_bin,
                    kwok_nodes: None,
                    scheduler_qps: 5000,
                    apiserver_args: Vec::new(),
                    spark_driver: "clients/spark/own-allocator-driver.sh".into(),
                }),
                ("real", None) => anyhow::bail!(
                    "--cluster real needs --apiserver-bin (or TEST_APISERVER_BIN): \
                     scripts/build-test-apiserver.sh prints its path"
                ),
                _ => None,
            };
            failover::run(&failover::FailoverBench {
                lease_ms,
                renew_deadline_ms,
                retry_ms,
                calls: calls.max(1),
                executors: executors.max(30),
                real,
            })
            .await
        }
        Scenario::Budgets {
            applications,
            max_executors,
            max_target,
            phases,
            phase_s,
            arrival_ms,
            sample_ms,
            seed,
        } => {
            budgets::run(&budgets::BudgetsBench {
                applications: applications.max(1),
                max_executors: max_executors.max(1),
                max_target,
                phases: phases.max(1),
                phase: Duration::from_secs(phase_s.max(1)),
                arrival: Duration::from_millis(arrival_ms),
                sample: Duration::from_millis(sample_ms.max(10)),
                seed,
            })
            .await
        }
        Scenario::ManyApps { applications, qps } => {
            many_apps::run(&many_apps::ManyAppsBench {
                applications: applications.max(1),
                qps,
            })
            .await
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = init_tracing() {
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
    match runtime.block_on(run(cli.scenario)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Warnings only, on stderr (the figures go to stdout), unless `RUST_LOG` asks for more.
fn init_tracing() -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(value) if !value.trim().is_empty() => tracing_subscriber::EnvFilter::try_new(&value)
            .with_context(|| format!("RUST_LOG={value:?} is not a valid filter"))?,
        _ => tracing_subscriber::EnvFilter::new("warn"),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init()
        .map_err(|err| anyhow::anyhow!("cannot install the logger: {err}"))
}
