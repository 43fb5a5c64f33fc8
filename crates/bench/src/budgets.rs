//! Budgets against first come, first served: 20 applications in one namespace with demand
//! like Spark's dynamic allocation (each application's target changes at phase
//! boundaries, from a seeded pattern, so both runs see the same demand), over a namespace
//! budget of `max_executors` well below the sum of the demand. The same demand runs twice
//! in one invocation, each against a fresh simulated cluster:
//!
//! - **with the budget**: `budgets: [{namespace: default, max_executors: B}]`;
//! - **without**: no budget, a ResourceQuota of `pods: B` on the namespace instead, and
//!   `budgets_follow_quotas` off, so the applications race for the quota and the API
//!   server refuses (403) every create beyond it.
//!
//! An application's driver plays Spark's part in a shrink: it lowers its target, then
//! deletes its executors beyond the target (Spark kills idle executors itself; the service
//! never deletes a Running executor to make room). Measured every `sample` from a LIST of
//! the namespace's executor pods (not terminating, not ended):
//!
//! - **Jain's fairness index** `J = (Σ xᵢ)² / (n · Σ xᵢ²)` over the `n` applications with
//!   demand, where `xᵢ = aᵢ / sᵢ`, `aᵢ` the application's pods (Running or Pending) and
//!   `sᵢ` its max-min fair share of `B` given every application's current target (equal
//!   weights, water-filling, `sᵢ = dᵢ` when the demand fits). 1 when every application has
//!   the same fraction of its share; 1/n when one has everything. Reported min and median.
//! - **Time to admit held demand**: at a phase boundary, each application whose target
//!   did not change, which had less than its new share, and whose share rose (others shrank
//!   or went to 0): the time until its pods reach its new share (rounded down). Those not
//!   reaching it before the next boundary are counted as not admitted.
//! - **Refused requests**: executor pod creates answered 403 or 429, from the service's
//!   metrics (`executor_pod_create_failures`).
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use super::harness::{Latencies, SimProcess, set_target, start_app};
use spark_pod_allocator::allocator::AllocationSettings;
use spark_pod_allocator::allocator::types::{APP_ID_LABEL, EXECUTOR_ID_LABEL};
use spark_pod_allocator::app::budgets::BudgetEntry;
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::metrics::Metrics;

/// The namespace the applications share ([`start_app`] starts them there).
const NAMESPACE: &str = "default";

/// What to run.
#[derive(Debug, Clone)]
pub struct BudgetsBench {
    /// Applications sharing the namespace.
    pub applications: u32,
    /// The budget (and, without it, the quota's pods).
    pub max_executors: u32,
    /// The largest target an application asks for.
    pub max_target: u32,
    /// Phases of constant demand.
    pub phases: u32,
    /// How long each phase lasts.
    pub phase: Duration,
    /// Time between two applications' first targets (drivers arriving one after another).
    pub arrival: Duration,
    /// Time between two measurements.
    pub sample: Duration,
    /// Seed of the demand pattern.
    pub seed: u64,
}

/// The figures of one run.
struct RunResult {
    fairness: Vec<f64>,
    /// The median of Jain's index in each phase.
    phase_fairness: Vec<f64>,
    admissions: Vec<Duration>,
    not_admitted: usize,
    refused_403: u64,
    refused_429: u64,
    created: u64,
}

/// Runs the scenario twice (with and without the budget) and prints both and their ratios.
pub async fn run(bench: &BudgetsBench) -> anyhow::Result<()> {
    let demand = demand(bench);
    let peak: u32 = (0..bench.phases as usize)
        .map(|p| demand.iter().map(|d| d[p]).sum::<u32>())
        .max()
        .unwrap_or(0);
    println!(
        "budgets: {} applications in one namespace, budget {} executors, {} phases of {} s \
         (seed {}), peak total demand {peak} ({:.1}x the budget)",
        bench.applications,
        bench.max_executors,
        bench.phases,
        bench.phase.as_secs_f64(),
        bench.seed,
        f64::from(peak) / f64::from(bench.max_executors.max(1)),
    );
    let with = run_once(bench, &demand, true).await?;
    print_run("with the budget", &with);
    let without = run_once(bench, &demand, false).await?;
    print_run(
        "without (a ResourceQuota of the same pods, budgets_follow_quotas off)",
        &without,
    );
    let (with_min, with_median) = min_median(&with.fairness);
    let (without_min, without_median) = min_median(&without.fairness);
    println!(
        "  Jain's index with/without: median {with_median:.3} / {without_median:.3} ({:.2}x), \
         min {with_min:.3} / {without_min:.3} ({:.2}x)",
        with_median / without_median,
        with_min / without_min
    );
    let with_admit = Latencies::of(with.admissions.clone());
    let without_admit = Latencies::of(without.admissions.clone());
    let median = |l: &Latencies| {
        if l.count == 0 {
            "-".to_string()
        } else {
            format!("{:.2} s", l.p50.as_secs_f64())
        }
    };
    println!(
        "  held demand admitted within its phase with/without: {}/{} of {}/{} cases; median {} / {}",
        with_admit.count,
        without_admit.count,
        with_admit.count + with.not_admitted,
        without_admit.count + without.not_admitted,
        median(&with_admit),
        median(&without_admit),
    );
    println!(
        "  creates refused (403+429) with/without: {} / {}",
        with.refused_403 + with.refused_429,
        without.refused_403 + without.refused_429
    );
    Ok(())
}

fn print_run(what: &str, r: &RunResult) {
    let (min, median) = min_median(&r.fairness);
    let admit = Latencies::of(r.admissions.clone());
    println!("  {what}:");
    println!(
        "    Jain's index over {} samples: min {min:.3}, median {median:.3}",
        r.fairness.len()
    );
    let phases: Vec<String> = r.phase_fairness.iter().map(|j| format!("{j:.2}")).collect();
    println!("    its median per phase: {}", phases.join(" "));
    if admit.count > 0 {
        println!(
            "    held demand admitted after another shrank: {} cases, median {:.2} s, max {:.2} s; \
             {} not admitted within their phase",
            admit.count,
            admit.p50.as_secs_f64(),
            admit.max.as_secs_f64(),
            r.not_admitted
        );
    } else {
        println!(
            "    held demand admitted after another shrank: none; {} not admitted within their phase",
            r.not_admitted
        );
    }
    println!(
        "    creates refused: {} x 403, {} x 429 ({} pods created)",
        r.refused_403, r.refused_429, r.created
    );
}

/// Each application's target in each phase: a random start in `[5, max]`, then at each
/// boundary a change with probability 0.4 to a value in `[0, max]` (0: idle, as an
/// application between jobs), from `seed`.
fn demand(bench: &BudgetsBench) -> Vec<Vec<u32>> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(bench.seed);
    let max = bench.max_target.max(5);
    (0..bench.applications)
        .map(|_| {
            let mut targets = vec![rng.gen_range(5..=max)];
            for _ in 1..bench.phases {
                let last = targets.last().copied().unwrap_or(0);
                let next = if rng.gen_bool(0.4) {
                    rng.gen_range(0..=max)
                } else {
                    last
                };
                targets.push(next);
            }
            targets
        })
        .collect()
}

/// Max-min fair shares of `budget` for `demand` (equal weights): water-filling.
fn fair_shares(demand: &[u32], budget: u32) -> Vec<f64> {
    let mut shares = vec![0.0; demand.len()];
    let mut left = f64::from(budget);
    let mut open: Vec<usize> = (0..demand.len()).filter(|&i| demand[i] > 0).collect();
    open.sort_by_key(|&i| demand[i]);
    let mut remaining = open.len();
    for &i in &open {
        let even = left / remaining as f64;
        let take = f64::from(demand[i]).min(even);
        shares[i] = take;
        left -= take;
        remaining -= 1;
    }
    shares
}

/// Jain's index of each application's pods relative to its fair share, over those with
/// demand; `None` when none has any pod yet.
fn jain(counts: &[u32], shares: &[f64]) -> Option<f64> {
    let x: Vec<f64> = counts
        .iter()
        .zip(shares)
        .filter(|(_, s)| **s > 0.0)
        .map(|(a, s)| f64::from(*a) / s)
        .collect();
    let sum: f64 = x.iter().sum();
    let squares: f64 = x.iter().map(|v| v * v).sum();
    (sum > 0.0).then(|| sum * sum / (x.len() as f64 * squares))
}

fn min_median(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let min = sorted.first().copied().unwrap_or(f64::NAN);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN);
    (min, median)
}

/// An application whose held demand waits to be admitted.
struct Waiting {
    app: usize,
    share: u32,
    since: Instant,
}

async fn run_once(
    bench: &BudgetsBench,
    demand: &[Vec<u32>],
    with_budget: bool,
) -> anyhow::Result<RunResult> {
    let n = demand.len();
    let capacity = bench.max_target * bench.applications + 100;
    let sim = SimProcess::start(capacity).await?;
    let mut config = Settings::default();
    if with_budget {
        config.budgets = vec![BudgetEntry {
            name: None,
            namespace: Some(NAMESPACE.into()),
            queue: None,
            namespaces: Vec::new(),
            max_executors: u64::from(bench.max_executors),
            max_pending: None,
            max_cpu: None,
            max_memory: None,
            reclaim_deadline_ms: None,
        }];
        config.budget_policy()?;
    } else {
        config.budgets_follow_quotas = false;
        let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "executors"},
            "spec": {"hard": {"pods": bench.max_executors.to_string()}}
        }))?;
        Api::<ResourceQuota>::namespaced(sim.client.clone(), NAMESPACE)
            .create(&PostParams::default(), &quota)
            .await
            .context("creating the ResourceQuota")?;
    }
    let metrics = Metrics::new();
    let apps = sim.service_with_metrics(&config, metrics.clone());
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(start_app(&apps, &format!("app-{i:02}"), AllocationSettings::default()).await?);
    }
    let pods: Api<Pod> = Api::namespaced(sim.client.clone(), NAMESPACE);
    let mut fairness = Vec::new();
    let mut phase_fairness = Vec::new();
    let mut admissions = Vec::new();
    let mut not_admitted = 0;
    let mut targets = vec![0u32; n];
    let mut counts = vec![0u32; n];
    for phase in 0..bench.phases as usize {
        let boundary = Instant::now();
        let old_shares = fair_shares(&targets, bench.max_executors);
        let new_targets: Vec<u32> = demand.iter().map(|d| d[phase]).collect();
        let new_shares = fair_shares(&new_targets, bench.max_executors);
        let mut waiting: Vec<Waiting> = Vec::new();
        if phase > 0 {
            for i in 0..n {
                let share = new_shares[i].floor() as u32;
                if new_targets[i] == targets[i]
                    && new_shares[i] > old_shares[i] + 0.5
                    && counts[i] < share
                {
                    waiting.push(Waiting {
                        app: i,
                        share,
                        since: boundary,
                    });
                }
            }
        }
        // The drivers' new targets; in the first phase they arrive one after another.
        for i in 0..n {
            if phase == 0 {
                tokio::time::sleep(bench.arrival).await;
            }
            if new_targets[i] != targets[i] || phase == 0 {
                set_target(&apps, &ids[i], new_targets[i]).await?;
            }
        }
        targets = new_targets;
        let shares = new_shares;
        let until = boundary + bench.phase;
        let mut in_phase = Vec::new();
        while Instant::now() < until {
            tokio::time::sleep(bench.sample).await;
            let by_app = executors(&pods).await?;
            for (i, id) in ids.iter().enumerate() {
                let mine = by_app.get(id.as_str()).map_or(&[][..], Vec::as_slice);
                counts[i] = u32::try_from(mine.len()).unwrap_or(u32::MAX);
                // The driver kills its executors beyond its target, newest first.
                if counts[i] > targets[i] {
                    for (_, name) in mine.iter().rev().take((counts[i] - targets[i]) as usize) {
                        // Gone already, or the next sample retries it.
                        let _ = pods
                            .delete(name, &DeleteParams::default().grace_period(0))
                            .await;
                    }
                    counts[i] = targets[i];
                }
            }
            // Sampled once every driver has asked (the arrivals come before the first
            // sample); an application with no pod at all yet still counts, as 0.
            if let Some(j) = jain(&counts, &shares) {
                fairness.push(j);
                in_phase.push(j);
            }
            waiting.retain(|w| {
                if counts[w.app] >= w.share {
                    admissions.push(w.since.elapsed());
                    false
                } else {
                    true
                }
            });
        }
        not_admitted += waiting.len();
        phase_fairness.push(min_median(&in_phase).1);
    }
    let text = metrics.encode();
    let result = RunResult {
        fairness,
        phase_fairness,
        admissions,
        not_admitted,
        refused_403: create_failures(&text, "403"),
        refused_429: create_failures(&text, "429"),
        created: counter(&text, "spark_pod_allocator_executor_pods_created_total"),
    };
    for id in &ids {
        let _ = apps.stop(id).await;
    }
    apps.shutdown().await;
    sim.stop().await;
    Ok(result)
}

/// The live executors (not terminating, not ended) of each application: (id, pod name),
/// by id ascending.
async fn executors(pods: &Api<Pod>) -> anyhow::Result<BTreeMap<String, Vec<(u64, String)>>> {
    let list = pods
        .list(&ListParams::default().labels("spark-role=executor"))
        .await
        .context("listing the executor pods")?;
    let mut by_app: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    for pod in list.items {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let name = pod.metadata.name.unwrap_or_default();
        let labels = pod.metadata.labels.unwrap_or_default();
        let (Some(app), Some(exec)) = (
            labels.get(APP_ID_LABEL),
            labels
                .get(EXECUTOR_ID_LABEL)
                .and_then(|e| e.parse::<u64>().ok()),
        ) else {
            continue;
        };
        by_app.entry(app.clone()).or_default().push((exec, name));
    }
    for execs in by_app.values_mut() {
        execs.sort_unstable();
    }
    Ok(by_app)
}

/// The sum of the create failures with HTTP `status` in the metrics' text.
fn create_failures(text: &str, status: &str) -> u64 {
    let needle = format!("status=\"{status}\"");
    text.lines()
        .filter(|l| l.starts_with("spark_pod_allocator_executor_pod_create_failures_total{"))
        .filter(|l| l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A counter without labels in the metrics' text (0 when absent).
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_shares_fill_the_small_demands_and_split_the_rest() {
        assert_eq!(fair_shares(&[5, 30, 30, 0], 45), vec![5.0, 20.0, 20.0, 0.0]);
        assert_eq!(fair_shares(&[5, 10], 100), vec![5.0, 10.0]);
    }

    #[test]
    fn jain_is_one_when_fair_and_one_over_n_when_one_has_all() {
        let shares = [10.0, 10.0, 10.0, 10.0];
        assert_eq!(jain(&[10, 10, 10, 10], &shares), Some(1.0));
        assert_eq!(jain(&[40, 0, 0, 0], &shares), Some(0.25));
        assert_eq!(jain(&[0, 0, 0, 0], &shares), None);
    }
}
