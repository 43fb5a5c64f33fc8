//! Allocation settings with Spark's meanings and defaults, in the one shape they have
//! everywhere: the engine computes with [`AllocationSettings`], the configuration's
//! `allocation` section deserialises into it (unset keys keep the defaults), a stored
//! registration keeps it as JSON, and the gRPC edge lays a Start request's `settings`
//! over the server's. Its serde names are the API's (`batch_delay_ms`, durations in
//! milliseconds), so the file, the JSON and the proto spell each setting alike. The proto's
//! `AllocationSettings` stays a type of its own: prost generates it, and every field of it
//! is optional (unset keeps the server's), which a setting here never is.
//!
//! A new setting costs: its proto field, its field here (with its default, its rule in
//! [`AllocationSettings::validate`] and its line in [`AllocationSettings::first_difference`],
//! which the compiler asks for), and the line that takes it from the request in the edge's
//! validation. The configuration and stored registrations get it for free.
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::state::{DEFAULT_EXECUTOR_CONTAINER, StateRules};

/// Tuning of one application's allocation (Spark's names in the doc comments).
///
/// Unknown keys are refused, so a typo in the configuration file stops start-up (a stored
/// registration leaves a newer version's settings out before it is read, see
/// `app::registration`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AllocationSettings {
    /// spark.kubernetes.allocation.batch.size (default 10; > 0).
    pub batch_size: u32,
    /// spark.kubernetes.allocation.batch.delay (default 1 s; > 100 ms).
    #[serde(rename = "batch_delay_ms", with = "millis")]
    #[schemars(with = "u64")]
    pub batch_delay: Duration,
    /// spark.kubernetes.allocation.executor.timeout (default 600 s; ≥ 5 × batch delay).
    #[serde(rename = "executor_timeout_ms", with = "millis")]
    #[schemars(with = "u64")]
    pub executor_timeout: Duration,
    /// spark.dynamicAllocation.executorIdleTimeout (default 60 s).
    #[serde(rename = "executor_idle_timeout_ms", with = "millis")]
    #[schemars(with = "u64")]
    pub executor_idle_timeout: Duration,
    /// spark.kubernetes.allocation.maxPendingPods (default unlimited).
    pub max_pending_pods: Option<u32>,
    /// Per resource profile pending cap (default unlimited).
    pub max_pending_pods_per_profile: Option<u32>,
    /// Lifetime cap on executor ids (default unlimited).
    pub max_executors: Option<u64>,
    /// Gang size per resource profile (default none): while a profile has fewer executors
    /// (running, pending or requested) than this and its target asks for more, one round
    /// asks for all it lacks up to it, whatever the batch size and policy. A gang scheduler
    /// (YuniKorn's `minMember`, Volcano's `minMember`) places none of a gang until all of
    /// it is asked for, and YuniKorn's placeholders time out meanwhile. The target,
    /// `max_executors`, both pending caps and the server's creates per round still bound
    /// it: they are limits the application or the operator set, and [`Self::validate`]
    /// refuses a gang larger than a pending cap or `max_executors`, which would never fit.
    /// The rest of a gang a round's cap left out goes in the next round, without waiting for
    /// the first requests to be seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_executors_at_once: Option<u32>,
    /// spark.kubernetes.executor.deleteOnTermination (default true).
    pub delete_on_termination: bool,
    /// spark.kubernetes.executor.podTemplateContainerName (default
    /// `spark-kubernetes-executor`; a DNS-1123 label).
    pub executor_container_name: String,
    /// spark.kubernetes.executor.checkAllContainers (default false).
    pub check_all_containers: bool,
    /// How many executors a round may request (default [`AllocationPolicy::Adaptive`]).
    pub policy: AllocationPolicy,
    /// Beyond Spark: how long a pending executor may be stuck (a container waiting for an
    /// image or its configuration, or unschedulable) before it is acted on (default
    /// 2 min; > 0). See [`super::stuck`].
    #[serde(rename = "stuck_pending_timeout_ms", with = "millis")]
    #[schemars(with = "u64")]
    pub stuck_pending_timeout: Duration,
    /// spark.kubernetes.driver.ownPersistentVolumeClaim (default true, as Spark >= 3.4):
    /// executor claims are owned by the driver pod (when there is one), else by their pod.
    pub driver_owns_claims: bool,
    /// spark.kubernetes.driver.reusePersistentVolumeClaim (default true, as Spark >= 3.4):
    /// a new executor mounts a free claim of the application (see [`super::claims`]).
    pub reuse_claims: bool,
    /// spark.kubernetes.driver.waitToReusePersistentVolumeClaim (default false): no new
    /// executor while the claims are at `max_claims` and none is free.
    pub wait_to_reuse_claims: bool,
    /// The claim count `wait_to_reuse_claims` waits at (Spark: dynamic allocation's
    /// maxExecutors, else executor.instances); unset: never waits (> 0 when set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_claims: Option<u32>,
    /// Beyond Spark: the application's weight in the fair division of the budgets it falls
    /// under (> 0; unset: the driver pod's annotation `spark-pod-allocator/budget-weight`,
    /// else 1; at most the service's `budgets_max_weight`). See [`super::budget`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_weight: Option<u32>,
}

/// How many executors one round may request.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AllocationPolicy {
    /// Spark's allocator exactly: `batch_size` per profile per round, none while one of the
    /// profile's requests is not yet seen (asked for per application to pace as Spark does).
    Spark,
    /// Slow start bounded by the API server's answers: see [`super::adaptive`]. The
    /// default: a scale-up goes at the pace the API server admits, not at Spark's fixed
    /// `batch_size / batch_delay`.
    #[default]
    Adaptive,
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
        Self {
            batch_size: 10,
            batch_delay: Duration::from_secs(1),
            executor_timeout: Duration::from_secs(600),
            executor_idle_timeout: Duration::from_secs(60),
            max_pending_pods: None,
            max_pending_pods_per_profile: None,
            max_executors: None,
            min_executors_at_once: None,
            delete_on_termination: true,
            executor_container_name: DEFAULT_EXECUTOR_CONTAINER.to_string(),
            check_all_containers: false,
            policy: AllocationPolicy::Adaptive,
            stuck_pending_timeout: Duration::from_secs(120),
            driver_owns_claims: true,
            reuse_claims: true,
            wait_to_reuse_claims: false,
            max_claims: None,
            budget_weight: None,
        }
    }
}

/// Spark refuses a batch delay of 100 ms or less (it would hammer the API server).
const MIN_BATCH_DELAY: Duration = Duration::from_millis(100);

/// The creation timeout must cover this many batch delays, or requests time out before a
/// snapshot could possibly have shown their pods.
const TIMEOUT_BATCH_DELAYS: u32 = 5;

/// Durations beyond this (about 292 million years) do not fit the engine's millisecond clock.
const MAX_DURATION_MS: u128 = i64::MAX as u128;

/// Durations as whole milliseconds, the API's unit (saturating: a duration too large for
/// `u64` milliseconds is refused by [`AllocationSettings::validate`] anyway).
mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        u64::deserialize(deserializer).map(Duration::from_millis)
    }
}

impl AllocationSettings {
    /// The first setting (its API name) whose value differs in `other`, if any: what a
    /// repeated Start must keep.
    pub fn first_difference(&self, other: &Self) -> Option<&'static str> {
        // Destructured, so a new setting cannot be forgotten here.
        let Self {
            batch_size,
            batch_delay,
            executor_timeout,
            executor_idle_timeout,
            max_pending_pods,
            max_pending_pods_per_profile,
            max_executors,
            min_executors_at_once,
            delete_on_termination,
            executor_container_name,
            check_all_containers,
            policy,
            stuck_pending_timeout,
            driver_owns_claims,
            reuse_claims,
            wait_to_reuse_claims,
            max_claims,
            budget_weight,
        } = self;
        [
            (*batch_size != other.batch_size, "batch_size"),
            (*batch_delay != other.batch_delay, "batch_delay_ms"),
            (
                *executor_timeout != other.executor_timeout,
                "executor_timeout_ms",
            ),
            (
                *executor_idle_timeout != other.executor_idle_timeout,
                "executor_idle_timeout_ms",
            ),
            (
                *max_pending_pods != other.max_pending_pods,
                "max_pending_pods",
            ),
            (
                *max_pending_pods_per_profile != other.max_pending_pods_per_profile,
                "max_pending_pods_per_profile",
            ),
            (*max_executors != other.max_executors, "max_executors"),
            (
                *min_executors_at_once != other.min_executors_at_once,
                "min_executors_at_once",
            ),
            (
                *delete_on_termination != other.delete_on_termination,
                "delete_on_termination",
            ),
            (
                *executor_container_name != other.executor_container_name,
                "executor_container_name",
            ),
            (
                *check_all_containers != other.check_all_containers,
                "check_all_containers",
            ),
            (*policy != other.policy, "policy"),
            (
                *stuck_pending_timeout != other.stuck_pending_timeout,
                "stuck_pending_timeout_ms",
            ),
            (
                *driver_owns_claims != other.driver_owns_claims,
                "driver_owns_claims",
            ),
            (*reuse_claims != other.reuse_claims, "reuse_claims"),
            (
                *wait_to_reuse_claims != other.wait_to_reuse_claims,
                "wait_to_reuse_claims",
            ),
            (*max_claims != other.max_claims, "max_claims"),
            (*budget_weight != other.budget_weight, "budget_weight"),
        ]
        .into_iter()
        .find_map(|(differs, name)| differs.then_some(name))
    }

    /// How this application's pods map to executor states.
    pub fn state_rules(&self) -> StateRules {
        StateRules {
            executor_container: self.executor_container_name.clone(),
            check_all_containers: self.check_all_containers,
        }
    }

    /// Checks every rule; the first violation names its setting.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let invalid =
            |name: &'static str, reason: String| Err(SettingsError::Invalid { name, reason });
        if self.batch_size == 0 {
            return invalid("batch_size", "must be greater than 0".into());
        }
        if self.batch_delay <= MIN_BATCH_DELAY {
            return invalid(
                "batch_delay_ms",
                format!(
                    "must be greater than 100 ms, got {} ms",
                    self.batch_delay.as_millis()
                ),
            );
        }
        if self.batch_delay.as_millis() > MAX_DURATION_MS {
            return invalid("batch_delay_ms", "is too large".into());
        }
        if self.executor_timeout.as_millis() > MAX_DURATION_MS {
            return invalid("executor_timeout_ms", "is too large".into());
        }
        let min_timeout = self.batch_delay.saturating_mul(TIMEOUT_BATCH_DELAYS);
        if self.executor_timeout < min_timeout {
            return invalid(
                "executor_timeout_ms",
                format!(
                    "must be at least 5 x batch_delay_ms ({} ms), got {} ms",
                    min_timeout.as_millis(),
                    self.executor_timeout.as_millis()
                ),
            );
        }
        if self.executor_idle_timeout.as_millis() > MAX_DURATION_MS {
            return invalid("executor_idle_timeout_ms", "is too large".into());
        }
        if self.max_pending_pods == Some(0) {
            return invalid("max_pending_pods", "must be greater than 0 when set".into());
        }
        if self.max_pending_pods_per_profile == Some(0) {
            return invalid(
                "max_pending_pods_per_profile",
                "must be greater than 0 when set".into(),
            );
        }
        if self.max_executors == Some(0) {
            return invalid("max_executors", "must be greater than 0 when set".into());
        }
        if let Some(gang) = self.min_executors_at_once {
            self.validate_gang(gang)?;
        }
        if let Err(reason) = crate::naming::dns1123_label(&self.executor_container_name) {
            return invalid("executor_container_name", reason);
        }
        if self.stuck_pending_timeout.is_zero() {
            return invalid("stuck_pending_timeout_ms", "must be greater than 0".into());
        }
        if self.stuck_pending_timeout.as_millis() > MAX_DURATION_MS {
            return invalid("stuck_pending_timeout_ms", "is too large".into());
        }
        if self.max_claims == Some(0) {
            return invalid("max_claims", "must be greater than 0 when set".into());
        }
        if self.budget_weight == Some(0) {
            return invalid("budget_weight", "must be greater than 0 when set".into());
        }
        Ok(())
    }

    /// A gang must fit every cap that bounds it, or its scheduler would never place it.
    fn validate_gang(&self, gang: u32) -> Result<(), SettingsError> {
        let invalid = |reason: String| {
            Err(SettingsError::Invalid {
                name: "min_executors_at_once",
                reason,
            })
        };
        if gang == 0 {
            return invalid("must be greater than 0 when set".into());
        }
        let caps = [
            ("max_pending_pods", self.max_pending_pods.map(u64::from)),
            (
                "max_pending_pods_per_profile",
                self.max_pending_pods_per_profile.map(u64::from),
            ),
            ("max_executors", self.max_executors),
        ];
        for (cap_name, cap) in caps {
            if let Some(cap) = cap.filter(|cap| u64::from(gang) > *cap) {
                return invalid(format!(
                    "{gang} executors at once cannot exceed {cap_name} ({cap})"
                ));
            }
        }
        Ok(())
    }

    /// The batch delay in engine milliseconds.
    pub fn batch_delay_ms(&self) -> i64 {
        duration_ms(self.batch_delay)
    }

    /// The creation timeout in engine milliseconds.
    pub fn executor_timeout_ms(&self) -> i64 {
        duration_ms(self.executor_timeout)
    }

    /// The idle timeout guarding downscale, in engine milliseconds.
    pub fn executor_idle_timeout_ms(&self) -> i64 {
        duration_ms(self.executor_idle_timeout)
    }

    /// The stuck-pending timeout in engine milliseconds.
    pub fn stuck_pending_timeout_ms(&self) -> i64 {
        duration_ms(self.stuck_pending_timeout)
    }
}

pub(crate) use crate::time::duration_ms;
