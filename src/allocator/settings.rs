//! Allocation settings with Spark's meanings and defaults.
use std::time::Duration;

/// Tuning of one application's allocation (Spark's names in the doc comments).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationSettings {
    /// spark.kubernetes.allocation.batch.size (default 10; > 0).
    pub batch_size: u32,
    /// spark.kubernetes.allocation.batch.delay (default 1 s; > 100 ms).
    pub batch_delay: Duration,
    /// spark.kubernetes.allocation.executor.timeout (default 600 s; ≥ 5 × batch delay).
    pub executor_timeout: Duration,
    /// spark.dynamicAllocation.executorIdleTimeout (default 60 s).
    pub executor_idle_timeout: Duration,
    /// spark.kubernetes.allocation.maxPendingPods (default unlimited).
    pub max_pending_pods: Option<u32>,
    /// Per resource profile pending cap (default unlimited).
    pub max_pending_pods_per_profile: Option<u32>,
    /// Lifetime cap on executor ids (default unlimited).
    pub max_executors: Option<u64>,
    /// spark.kubernetes.executor.deleteOnTermination (default true).
    pub delete_on_termination: bool,
}

/// A setting that violates its rule; names the setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// The setting `name` is invalid for the reason given.
    #[error("{name}: {reason}")]
    Invalid {
        /// The setting's name as in the API (e.g. `batch_delay_ms`).
        name: &'static str,
        /// Why it is invalid.
        reason: String,
    },
}

impl Default for AllocationSettings {
    fn default() -> Self {
        todo!("engine: Spark defaults")
    }
}

impl AllocationSettings {
    /// Checks every rule; the first violation names its setting.
    pub fn validate(&self) -> Result<(), SettingsError> {
        todo!("engine")
    }
}
