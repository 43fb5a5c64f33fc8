//! The application layer's options and the shared parts every application uses.
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::budgets::BudgetPolicy;
use super::tenants::TenantLimits;
use super::{feed, limits};
use crate::ha::Ownerships;
use crate::k8s::{
    ExecutorPodClient, PodWatches, RegistrationSettings, RegistrationStore, RequestPolicy,
};
use crate::metrics::Metrics;
use crate::time::Clock;

/// Service-wide options of the application layer; the composition root builds them from
/// the configuration, whose defaults are these.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// Least wait between the end of a namespace's full LIST and the next.
    pub resync_interval: Duration,
    /// The full LIST's executor pods per second on average: with many pods followed it
    /// waits longer than the interval (0: the interval alone; see
    /// [`crate::k8s::ResyncPace`]).
    pub resync_pods_per_second: u32,
    /// Namespaces applications may run in; empty = all.
    pub allowed_namespaces: BTreeSet<String>,
    /// Mutating requests per second, shared by all applications.
    pub qps: u32,
    /// Burst above `qps`.
    pub burst: u32,
    /// An application's creates in flight at once, over all its rounds.
    pub create_concurrency: usize,
    /// Deadline and retries of every Kubernetes request.
    pub request_policy: RequestPolicy,
    /// How long an application whose driver pod Failed or Succeeded is kept (calls still
    /// answer, nothing is created) before it is forgotten.
    pub driver_end_grace: Duration,
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
    /// Where registrations are kept and the Secret of the key that signs them
    /// (`registrations`).
    pub registrations: RegistrationSettings,
    /// Applications per identity and namespace, WatchExecutors streams per identity and
    /// in all, and each stream's unread bytes (`tenants`).
    pub tenants: TenantLimits,
    /// This replica's identity, the shards and the Leases' timing (`ha`).
    pub ha: crate::ha::HaSettings,
    /// The budgets the applications share, as the service starts (`budgets`; a reload of
    /// the configuration file replaces them through [`super::Applications::budgets`]).
    pub budgets: BudgetPolicy,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        let kubernetes = crate::k8s::KubernetesSettings::default();
        Self {
            resync_interval: Duration::from_secs(600),
            resync_pods_per_second: 100,
            allowed_namespaces: BTreeSet::new(),
            qps: kubernetes.qps,
            burst: kubernetes.burst,
            create_concurrency: usize::try_from(kubernetes.create_concurrency)
                .unwrap_or(usize::MAX),
            request_policy: RequestPolicy::default(),
            driver_end_grace: Duration::from_secs(60),
            executor_stream_buffer: feed::STREAM_BUFFER,
            limits: limits::RequestLimits::default(),
            pod_policy: crate::allocator::pod_policy::PodPolicy::default(),
            registrations: RegistrationSettings::default(),
            tenants: TenantLimits::default(),
            ha: crate::ha::HaSettings::default(),
            budgets: BudgetPolicy::default(),
        }
    }
}

/// Shared context of every application: the clock, the options, the metrics.
#[derive(Clone)]
pub(crate) struct ServiceContext {
    pub clock: Arc<dyn Clock>,
    pub options: ServiceOptions,
    /// Where pods created and deleted, create failures and active applications are counted.
    pub metrics: Metrics,
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
