//! The shared parts every application uses.
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::budgets::BudgetPolicy;
use super::limits;
use super::tenants::TenantLimits;
use crate::ha::Ownerships;
use crate::k8s::{ExecutorPodClient, PodWatches, RegistrationStore};
use crate::metrics::Metrics;
use crate::time::Clock;

/// The top-level configuration keys the application layer reads. The configuration holds
/// them flattened, so a file writes `allowed_namespaces`, not a table of its own; a new
/// such key is a field here and its user.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct AppSettings {
    /// How long an application whose driver pod Failed or Succeeded is kept before it is
    /// forgotten (its executors are deleted at once, per delete-on-termination).
    pub driver_end_grace_ms: u64,
    /// Namespaces applications may run in; empty = all.
    pub allowed_namespaces: Vec<String>,
}

impl Default for AppSettings {
    fn default() -> Self {
        Self {
            driver_end_grace_ms: 60_000,
            allowed_namespaces: Vec::new(),
        }
    }
}

impl AppSettings {
    /// The rules a deserialised value can still break, as (key, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        match (self.allowed_namespaces.iter()).find(|ns| !crate::naming::is_dns_label(ns)) {
            Some(bad) => Err((
                "allowed_namespaces".to_string(),
                format!("{bad:?} is not a namespace name (DNS-1123 label)"),
            )),
            None => Ok(()),
        }
    }

    /// Whether applications may run in `namespace`.
    pub fn allows(&self, namespace: &str) -> bool {
        self.allowed_namespaces.is_empty()
            || self.allowed_namespaces.iter().any(|ns| ns == namespace)
    }

    pub fn driver_end_grace(&self) -> Duration {
        Duration::from_millis(self.driver_end_grace_ms)
    }
}

/// What every application shares: the clock, the metrics, and the configuration's sections
/// the application layer takes, as the composition root ([`crate::runtime::Builder`])
/// gives them from the configuration.
#[derive(Clone)]
pub(crate) struct ServiceContext {
    pub clock: Arc<dyn Clock>,
    /// Where pods created and deleted, create failures and active applications are counted.
    pub metrics: Metrics,
    /// The configuration's top-level keys of the application layer.
    pub app: AppSettings,
    /// Mutating requests per second, shared by all applications (`kubernetes.qps`).
    pub qps: u32,
    /// Changes a WatchExecutors stream may leave unread before it is given a fresh full
    /// state instead (bounds each stream's memory; never blocks the actor).
    pub executor_stream_buffer: usize,
    /// What one request may cause (`limits`): the application layer holds templates given
    /// after Start to its profile count, and each round to its creates per round.
    pub limits: limits::RequestLimits,
    /// What a template may ask for (`pod_policy`), the one copy of it: Start's templates
    /// (checked at the edge, through [`super::Applications::pod_policy`]), SetTotalExpected's, and
    /// those of a registration before it is resumed (signed, but the policy may have been
    /// tightened since it was written).
    pub pod_policy: crate::allocator::pod_policy::PodPolicy,
    /// Applications per identity and namespace, WatchExecutors streams per identity and
    /// in all, and each stream's unread bytes (`tenants`).
    pub tenants: TenantLimits,
    /// This replica's identity, the shards and the Leases' timing (`ha`).
    pub ha: crate::ha::HaSettings,
    /// The budgets the applications share, as the service starts (`budgets`; a reload of
    /// the configuration file replaces them through [`super::Applications::budgets`]).
    pub budgets: BudgetPolicy,
}

/// The Kubernetes side of every application, built by the composition root
/// ([`crate::runtime::Builder`]) over one client and one rate limiter.
pub(crate) struct KubernetesParts {
    /// Executor pod creates, deletes and listings.
    pub pods: ExecutorPodClient,
    /// The registrations, in the service's namespace.
    pub registrations: RegistrationStore,
    /// The shared pod watches per namespace.
    pub watches: PodWatches,
    /// The shards this replica holds: it acts only on their applications.
    pub ownerships: Ownerships,
}
