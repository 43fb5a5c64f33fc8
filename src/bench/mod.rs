//! `spark-pod-allocator bench <scenario>`: measurements against the simulated cluster, each
//! printed with its ratio to a limit measured in the same run. One file per scenario.
use clap::Subcommand;

mod plot;
pub mod scale_up;

/// The scenarios.
#[derive(Debug, Subcommand)]
pub enum Scenario {
    /// Time to N executors Running, per allocation policy, against N / QPS + pod start.
    ScaleUp(scale_up::Args),
}

/// Runs one scenario, printing its results.
pub async fn run(scenario: Scenario) -> anyhow::Result<()> {
    match scenario {
        Scenario::ScaleUp(args) => scale_up::run(args).await,
    }
}
