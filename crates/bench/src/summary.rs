//! The arithmetic of the control-plane benches, kept apart from the cluster so it can be
//! tested: the order of the cases in each run, the clock every case is timed by, the bare
//! limit picked from a sweep, and the ratios printed as the goals' figures.
use std::time::{Duration, Instant};

pub use super::scale_up::spread;

/// The order of `cases` cases in run `run` (0-based) of `runs`: run 0 in the given order,
/// each later run starting `cases / runs` places further (at least one), so across the runs
/// no case is always first or always last, and a control plane that slows from case to case
/// is not held against one case only.
pub fn rotation(cases: usize, runs: u32, run: u32) -> Vec<usize> {
    if cases == 0 {
        return Vec::new();
    }
    let step = (cases / runs.max(1) as usize).max(1);
    let offset = (run as usize * step) % cases;
    (0..cases).map(|k| (k + offset) % cases).collect()
}

/// One case's clock, the same for every case: it starts at the first executor pod a watch
/// of the case's fresh namespace sees (its create answered by the API server) and stops
/// when the same watch sees N Running. What comes before the first pod (a JVM's start, the
/// service's registration of the application) is reported apart, not timed; a bound
/// (`--max-seconds`) counts on this clock too.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// The contender was started (its process, or its Start).
    pub started: Instant,
    /// The first executor pod seen.
    pub first_pod: Instant,
}

impl Clock {
    /// Seconds from the first pod to `reached`.
    pub fn seconds(&self, reached: Instant) -> f64 {
        reached
            .saturating_duration_since(self.first_pod)
            .as_secs_f64()
    }

    /// Seconds from the contender's start to its first pod (not timed).
    pub fn before_first_pod(&self) -> f64 {
        self.first_pod
            .saturating_duration_since(self.started)
            .as_secs_f64()
    }

    /// What is left of `bound` (on this clock) at `now`; `None` when there is no bound.
    pub fn remaining(&self, bound: Option<Duration>, now: Instant) -> Option<Duration> {
        bound.map(|bound| bound.saturating_sub(now.saturating_duration_since(self.first_pod)))
    }
}

/// The bare limit of one run: the fastest of the sweep's concurrencies that reached N
/// (`None` for one that a bound stopped), as (its index in `times`, its seconds).
pub fn bare_limit(times: &[Option<f64>]) -> Option<(usize, f64)> {
    times
        .iter()
        .enumerate()
        .filter_map(|(k, t)| t.map(|t| (k, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// Per-run ratios `a[r] / b[r]` over the runs both have, with their min / median / max.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratios {
    pub per_run: Vec<f64>,
    /// (min, median, max) of `per_run`.
    pub spread: (f64, f64, f64),
}

impl Ratios {
    /// `None` when no run has both (a run where either is missing is left out).
    pub fn of(a: &[Option<f64>], b: &[Option<f64>]) -> Option<Self> {
        let per_run: Vec<f64> = a
            .iter()
            .zip(b)
            .filter_map(|(a, b)| match (a, b) {
                (Some(a), Some(b)) if *b > 0.0 => Some(a / b),
                _ => None,
            })
            .collect();
        if per_run.is_empty() {
            return None;
        }
        let spread = spread(per_run.iter().copied());
        Some(Self { per_run, spread })
    }

    /// The median of the per-run ratios (the goals' figure).
    pub fn median(&self) -> f64 {
        self.spread.1
    }

    /// `1.16 / 1.20 / 1.31` (per run, in run order).
    pub fn runs(&self) -> String {
        self.per_run
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

/// `met` or `MISSED`.
pub fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_takes_a_different_place_in_each_run() {
        assert_eq!(rotation(7, 3, 0), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(rotation(7, 3, 1), vec![2, 3, 4, 5, 6, 0, 1]);
        assert_eq!(rotation(7, 3, 2), vec![4, 5, 6, 0, 1, 2, 3]);
        // The last case of the first run (Spark's own, by default) is not last again.
        let lasts: Vec<usize> = (0..3).map(|r| *rotation(7, 3, r).last().unwrap()).collect();
        assert_eq!(lasts, vec![6, 1, 3]);
        // More runs than cases: one place further each run, wrapping.
        assert_eq!(rotation(2, 5, 1), vec![1, 0]);
        assert_eq!(rotation(2, 5, 2), vec![0, 1]);
        assert!(rotation(0, 3, 1).is_empty());
        for run in 0..4 {
            let mut order = rotation(5, 4, run);
            order.sort_unstable();
            assert_eq!(order, vec![0, 1, 2, 3, 4], "run {run} runs every case once");
        }
    }

    #[test]
    fn the_clock_starts_at_the_first_pod_for_the_time_and_the_bound_alike() {
        let started = Instant::now();
        let clock = Clock {
            started,
            first_pod: started + Duration::from_secs(9),
        };
        assert_eq!(clock.before_first_pod(), 9.0);
        assert_eq!(clock.seconds(started + Duration::from_secs(69)), 60.0);
        let bound = Some(Duration::from_secs(600));
        // The JVM's 9 s before its first pod do not eat into the bound.
        assert_eq!(
            clock.remaining(bound, started + Duration::from_secs(9)),
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            clock.remaining(bound, started + Duration::from_secs(109)),
            Some(Duration::from_secs(500))
        );
        assert_eq!(
            clock.remaining(bound, started + Duration::from_secs(700)),
            Some(Duration::ZERO)
        );
        assert_eq!(clock.remaining(None, started), None);
    }

    #[test]
    fn the_bare_limit_is_the_fastest_concurrency_that_finished() {
        assert_eq!(
            bare_limit(&[Some(6.1), Some(5.2), Some(5.9), None]),
            Some((1, 5.2))
        );
        assert_eq!(bare_limit(&[None, Some(7.0)]), Some((1, 7.0)));
        assert_eq!(bare_limit(&[None, None]), None);
        assert_eq!(bare_limit(&[]), None);
    }

    #[test]
    fn ratios_are_taken_per_run_then_summarised() {
        let service = [Some(6.0), Some(9.0), Some(8.0)];
        let limit = [Some(5.0), Some(6.0), Some(8.0)];
        let ratios = Ratios::of(&service, &limit).unwrap();
        assert_eq!(ratios.per_run, vec![1.2, 1.5, 1.0]);
        assert_eq!(ratios.spread, (1.0, 1.2, 1.5));
        assert_eq!(ratios.median(), 1.2);
        assert_eq!(ratios.runs(), "1.20 / 1.50 / 1.00");
        // Not the ratio of the medians (8.0 / 6.0).
        assert_ne!(ratios.median(), 8.0 / 6.0);
        // A run missing on either side is left out; none at all gives nothing.
        let partial = Ratios::of(&[Some(4.0), None], &[Some(2.0), Some(1.0)]).unwrap();
        assert_eq!(partial.per_run, vec![2.0]);
        assert_eq!(Ratios::of(&[None], &[Some(1.0)]), None);
        assert_eq!(verdict(true), "met");
        assert_eq!(verdict(false), "MISSED");
    }
}
