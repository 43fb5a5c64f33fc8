//! Prometheus metrics: one [`Metrics`] handle, created by the composition root and passed to
//! the gRPC, application and Kubernetes layers (the allocation engine records none), and
//! the `/metrics` endpoint that serves them on an address of its own.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// Every metric name starts with this.
pub const PREFIX: &str = "spark_pod_allocator";

/// Why executor pods were deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteReason {
    /// Pending pods beyond the target (downscale).
    Downscale,
    /// Pods not seen within the executor creation timeout.
    Timeout,
    /// Failed or succeeded executors' pods.
    Finished,
    /// Every pod of an application, on Stop or after its driver ended.
    Stop,
    /// Executors given back to a budget's owner (reclaim).
    Reclaim,
}

impl DeleteReason {
    fn label(self) -> &'static str {
        match self {
            Self::Downscale => "downscale",
            Self::Timeout => "timeout",
            Self::Finished => "finished",
            Self::Stop => "stop",
            Self::Reclaim => "reclaim",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    method: String,
    code: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ForwardLabels {
    method: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CreateFailureLabels {
    status: String,
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReclaimLabels {
    budget: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProfileLabels {
    application: String,
    profile: String,
}

/// Applications whose per-profile gauges are exported at most (with
/// `metrics.application_labels`); the ones beyond are left out (counted in
/// `applications_unexported`) so the label set stays bounded.
pub const MAX_EXPORTED_APPLICATIONS: usize = 500;

/// The executor gauges (`executors_target`, `_running`, `_pending`, `_newly_created`).
enum ExecutorGauges {
    /// Per application and resource profile (`metrics.application_labels`): whoever may
    /// scrape reads every tenant's application ids.
    PerApplication {
        target: Family<ProfileLabels, Gauge>,
        running: Family<ProfileLabels, Gauge>,
        pending: Family<ProfileLabels, Gauge>,
        newly_created: Family<ProfileLabels, Gauge>,
        /// The applications whose gauges are exported, with their profiles.
        exported: std::sync::Mutex<HashMap<String, BTreeSet<i32>>>,
    },
    /// Summed over every application and profile, with no label (the default).
    Summed {
        target: Gauge,
        running: Gauge,
        pending: Gauge,
        newly_created: Gauge,
        /// Each application's counts as last added in, summed over its profiles.
        added: std::sync::Mutex<HashMap<String, [i64; 4]>>,
    },
}

/// Locks `mutex`, whose data stays consistent even if a holder panicked.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One resource profile's executor counts, as GetStatus reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileGauges {
    pub target: u32,
    pub running: u32,
    pub pending: u32,
    pub newly_created: u32,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// The service's metrics; cheap to clone (every clone records into the same registry).
/// `Metrics::default()` is a registry nobody serves, for tests and embedders.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    rpcs: Family<RpcLabels, Counter>,
    rpc_seconds: HistogramFamily<MethodLabels>,
    pods_created: Counter,
    id_record_writes: Counter,
    pods_deleted: Family<ReasonLabels, Counter>,
    create_failures: Family<CreateFailureLabels, Counter>,
    stuck: Family<ReasonLabels, Counter>,
    applications: Gauge,
    rate_limit_wait: Histogram,
    seen_after: Histogram,
    running_after: Histogram,
    watch_events: Family<KindLabels, Counter>,
    watch_relists: Counter,
    watch_errors: Family<StatusLabels, Counter>,
    registrations_refused: Family<ReasonLabels, Counter>,
    resync_seconds: Histogram,
    executors: ExecutorGauges,
    unexported: Gauge,
    tenant_refusals: Family<LimitLabels, Counter>,
    watch_streams: Gauge,
    shards_owned: Gauge,
    shard_acquisitions: Counter,
    shards_released: Counter,
    writes_fenced: Counter,
    forwards: Family<ForwardLabels, Counter>,
    budget_executors: Family<BudgetLabels, Gauge>,
    executors_held: Family<BudgetLabels, Gauge>,
    reclaims_requested: Family<BudgetLabels, Counter>,
    reclaims_completed: Family<ReclaimLabels, Counter>,
    reclaim_admit: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry holding every metric of the service, naming no application (the
    /// executor gauges summed over applications).
    pub fn new() -> Self {
        Self::with_application_labels(false)
    }

    /// A registry holding every metric of the service; with `application_labels`
    /// (`metrics.application_labels`) the executor gauges are per application and
    /// resource profile, labelled with the application id.
    pub fn with_application_labels(application_labels: bool) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let rpcs = Family::<RpcLabels, Counter>::default();
        registry.register(
            "grpc_requests",
            "gRPC calls answered, by method and status code",
            rpcs.clone(),
        );
        let rpc_seconds: HistogramFamily<MethodLabels> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "grpc_request_duration_seconds",
            "Time from a gRPC call's arrival to its response headers, by method",
            rpc_seconds.clone(),
        );
        let pods_created = Counter::default();
        registry.register(
            "executor_pods_created",
            "Executor pods the API server accepted",
            pods_created.clone(),
        );
        let id_record_writes = Counter::default();
        registry.register(
            "id_record_writes",
            "Writes of the executor-id records (one reserves a block of ids)",
            id_record_writes.clone(),
        );
        let pods_deleted = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "executor_pods_deleted",
            "Executor pods deleted, by reason (downscale, timeout, finished, stop)",
            pods_deleted.clone(),
        );
        let create_failures = Family::<CreateFailureLabels, Counter>::default();
        registry.register(
            "executor_pod_create_failures",
            "Executor pod creates that failed, by HTTP status (empty when none came back) and reason",
            create_failures.clone(),
        );
        let stuck = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "executors_stuck",
            "Pending executors stuck past stuck_pending_timeout_ms, by reason (ImagePullBackOff, ErrImagePull, InvalidImageName, CreateContainerConfigError: deleted; Unschedulable: kept)",
            stuck.clone(),
        );
        let applications = Gauge::default();
        registry.register(
            "applications_active",
            "Applications the service allocates for",
            applications.clone(),
        );
        let rate_limit_wait = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "rate_limit_wait_seconds",
            "Time a mutating Kubernetes request (create, delete, patch) waited for the shared rate limiter (kubernetes.qps, kubernetes.burst)",
            rate_limit_wait.clone(),
        );
        // 10 ms .. ~11 min.
        let seen_after = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register(
            "executor_seen_seconds",
            "Time from an executor's request (its pod built for a create) to its pod first seen by the watch or a LIST",
            seen_after.clone(),
        );
        let running_after = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register(
            "executor_running_seconds",
            "Time from an executor's request to its pod first seen Running",
            running_after.clone(),
        );
        let watch_events = Family::<KindLabels, Counter>::default();
        registry.register(
            "watch_events",
            "Executor pod watch events, by kind (apply: added or modified; delete)",
            watch_events.clone(),
        );
        let watch_relists = Counter::default();
        registry.register(
            "watch_relists",
            "Full relists of a namespace's pod watch (its start, and after 410 Gone or a failure)",
            watch_relists.clone(),
        );
        let watch_errors = Family::<StatusLabels, Counter>::default();
        registry.register(
            "watch_errors",
            "Pod watch failures, by HTTP status (410: the resource version expired; empty when none came back)",
            watch_errors.clone(),
        );
        let registrations_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "registrations_refused",
            "Stored registrations a restarted service did not resume, by reason (unsigned, bad_signature, replayed, unproven, misplaced, unreadable, namespace_not_allowed, invalid, pod_policy)",
            registrations_refused.clone(),
        );
        let resync_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "resync_duration_seconds",
            "Duration of the periodic full LIST of a namespace's executor pods (resync_interval_ms)",
            resync_seconds.clone(),
        );
        let helps = [
            ("executors_target", "Executors wanted"),
            ("executors_running", "Executors whose pod is Running"),
            ("executors_pending", "Executors whose pod is Pending"),
            (
                "executors_newly_created",
                "Executors requested but not yet seen in the cluster",
            ),
        ];
        let executors = if application_labels {
            let [target, running, pending, newly_created] = helps.map(|(name, help)| {
                let family = Family::<ProfileLabels, Gauge>::default();
                registry.register(
                    name,
                    format!("{help}, by application and resource profile"),
                    family.clone(),
                );
                family
            });
            ExecutorGauges::PerApplication {
                target,
                running,
                pending,
                newly_created,
                exported: std::sync::Mutex::new(HashMap::new()),
            }
        } else {
            let [target, running, pending, newly_created] = helps.map(|(name, help)| {
                let gauge = Gauge::default();
                registry.register(
                    name,
                    format!("{help}, summed over applications and resource profiles (per application with metrics.application_labels)"),
                    gauge.clone(),
                );
                gauge
            });
            ExecutorGauges::Summed {
                target,
                running,
                pending,
                newly_created,
                added: std::sync::Mutex::new(HashMap::new()),
            }
        };
        let unexported = Gauge::default();
        registry.register(
            "applications_unexported",
            "Applications left out of the per-profile gauges (beyond the first 500)",
            unexported.clone(),
        );
        let tenant_refusals = Family::<LimitLabels, Counter>::default();
        registry.register(
            "tenant_limit_refusals",
            "Calls refused RESOURCE_EXHAUSTED by a per-tenant limit, by its configuration key (tenants.*)",
            tenant_refusals.clone(),
        );
        let watch_streams = Gauge::default();
        registry.register(
            "watch_streams_open",
            "WatchExecutors streams open (tenants.max_watch_streams)",
            watch_streams.clone(),
        );
        let shards_owned = Gauge::default();
        registry.register(
            "shards_owned",
            "Shards (ha.shards) whose Lease this replica holds now",
            shards_owned.clone(),
        );
        let shard_acquisitions = Counter::default();
        registry.register(
            "shard_acquisitions",
            "Times this replica took a shard (its Lease changed hands to it, or it was created)",
            shard_acquisitions.clone(),
        );
        let shards_released = Counter::default();
        registry.register(
            "shards_released",
            "Shards this replica drained and released for another replica to take (rebalancing)",
            shards_released.clone(),
        );
        let writes_fenced = Counter::default();
        registry.register(
            "writes_fenced",
            "Writes not sent because this replica no longer owned the application's shard",
            writes_fenced.clone(),
        );
        let forwards = Family::<ForwardLabels, Counter>::default();
        registry.register(
            "forwards",
            "Calls forwarded to the replica owning their application's shard, by method and outcome (the owner's code, or unreachable)",
            forwards.clone(),
        );
        let budget_executors = Family::<BudgetLabels, Gauge>::default();
        registry.register(
            "budget_executors",
            "Executors (running, pending, requested) the applications under a budget have, by budget",
            budget_executors.clone(),
        );
        let executors_held = Family::<BudgetLabels, Gauge>::default();
        registry.register(
            "executors_held",
            "Executors the applications' targets lack that a budget holds back (beyond their fair share or what it has free), by budget",
            executors_held.clone(),
        );
        let reclaims_requested = Family::<BudgetLabels, Counter>::default();
        registry.register(
            "reclaims_requested",
            "Executors a budget asked back from borrowers for an owner below its guaranteed part, by budget",
            reclaims_requested.clone(),
        );
        let reclaims_completed = Family::<ReclaimLabels, Counter>::default();
        registry.register(
            "reclaims_completed",
            "Executors asked back whose pods were deleted, by budget and outcome (graceful: the executor exited before the deadline, or was not registered yet; forced: deleted at the deadline, or at once under a deadline of 0)",
            reclaims_completed.clone(),
        );
        // 10 ms .. ~11 min.
        let reclaim_admit = Histogram::new(exponential_buckets(0.01, 2.0, 17));
        registry.register(
            "reclaim_admit_seconds",
            "Time from an application held below its guaranteed part having executors asked back for it to its next executors asked for",
            reclaim_admit.clone(),
        );
        registry.register(
            "build",
            "The service's version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                rpcs,
                rpc_seconds,
                pods_created,
                id_record_writes,
                pods_deleted,
                create_failures,
                stuck,
                applications,
                rate_limit_wait,
                seen_after,
                running_after,
                watch_events,
                watch_relists,
                watch_errors,
                registrations_refused,
                resync_seconds,
                executors,
                unexported,
                tenant_refusals,
                watch_streams,
                shards_owned,
                shard_acquisitions,
                shards_released,
                writes_fenced,
                forwards,
                budget_executors,
                executors_held,
                reclaims_requested,
                reclaims_completed,
                reclaim_admit,
            }),
        }
    }

    /// One call forwarded to its owner: `outcome` is the owner's code as the gRPC spec
    /// spells it, or `unreachable`.
    pub fn forwarded(&self, method: &'static str, outcome: &'static str) {
        self.inner
            .forwards
            .get_or_create(&ForwardLabels {
                method: method.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// One answered gRPC call; `method` is the call's path (`/package.Service/Method`), `code`
    /// the status code's name as the gRPC spec spells it.
    pub fn rpc_answered(&self, method: &str, code: &str, elapsed: Duration) {
        let method = bounded_method(method).to_string();
        self.inner
            .rpcs
            .get_or_create(&RpcLabels {
                method: method.clone(),
                code: code.to_string(),
            })
            .inc();
        self.inner
            .rpc_seconds
            .get_or_create(&MethodLabels { method })
            .observe(elapsed.as_secs_f64());
    }

    /// Executor pods the API server accepted.
    pub fn pods_created(&self, count: u64) {
        self.inner.pods_created.inc_by(count);
    }

    /// How many shards this replica holds now.
    pub fn set_shards_owned(&self, shards: usize) {
        self.inner
            .shards_owned
            .set(i64::try_from(shards).unwrap_or(i64::MAX));
    }

    /// A budget's executors and the executors it holds back now.
    pub fn set_budget(&self, budget: &str, executors: u64, held: u64) {
        let labels = BudgetLabels {
            budget: budget.to_string(),
        };
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner
            .budget_executors
            .get_or_create(&labels)
            .set(gauge(executors));
        self.inner
            .executors_held
            .get_or_create(&labels)
            .set(gauge(held));
    }

    /// A budget no longer configured: its series go.
    pub fn forget_budget(&self, budget: &str) {
        let labels = BudgetLabels {
            budget: budget.to_string(),
        };
        self.inner.budget_executors.remove(&labels);
        self.inner.executors_held.remove(&labels);
    }

    /// `count` executors asked back under `budget`.
    pub fn reclaims_requested(&self, budget: &str, count: u64) {
        let labels = BudgetLabels {
            budget: budget.to_string(),
        };
        self.inner
            .reclaims_requested
            .get_or_create(&labels)
            .inc_by(count);
    }

    /// An executor asked back under `budget` deleted: `graceful` (it exited first, or was
    /// not registered) or forced.
    pub fn reclaim_completed(&self, budget: &str, graceful: bool) {
        let outcome = if graceful { "graceful" } else { "forced" };
        self.inner
            .reclaims_completed
            .get_or_create(&ReclaimLabels {
                budget: budget.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// An application below its guaranteed part asked for executors `waited` after
    /// executors were first asked back for it.
    pub fn reclaim_admitted(&self, waited: Duration) {
        self.inner.reclaim_admit.observe(waited.as_secs_f64());
    }

    /// This replica took a shard.
    pub fn shard_acquired(&self) {
        self.inner.shard_acquisitions.inc();
    }

    /// A shard drained and released for another replica (rebalancing).
    pub fn shard_released(&self) {
        self.inner.shards_released.inc();
    }

    /// A write refused by its fence (the shard is not this replica's any more).
    pub fn write_fenced(&self) {
        self.inner.writes_fenced.inc();
    }

    /// An executor-id record written (a block of ids reserved).
    pub fn id_record_written(&self) {
        self.inner.id_record_writes.inc();
    }

    /// Executor pods the API server deleted.
    pub fn pods_deleted(&self, reason: DeleteReason, count: u64) {
        if count > 0 {
            self.inner
                .pods_deleted
                .get_or_create(&ReasonLabels {
                    reason: reason.label().to_string(),
                })
                .inc_by(count);
        }
    }

    /// One executor pod create that failed with `status` (none when the API server never
    /// answered) and `reason` (the API server's, or `Timeout`, `Unreachable`, `IdNotRecorded`).
    pub fn pod_create_failed(&self, status: Option<u16>, reason: &str) {
        self.inner
            .create_failures
            .get_or_create(&CreateFailureLabels {
                status: status.map(|s| s.to_string()).unwrap_or_default(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// A pending executor stuck past the timeout for `reason` (the container's waiting
    /// reason, or `Unschedulable`).
    pub fn executor_stuck(&self, reason: &str) {
        self.inner
            .stuck
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The number of applications the service allocates for.
    pub fn set_active_applications(&self, count: usize) {
        self.inner
            .applications
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self.set_unexported(count);
    }

    /// A call refused by the per-tenant limit named by its configuration key.
    pub fn tenant_limit_refused(&self, key: &'static str) {
        self.inner
            .tenant_refusals
            .get_or_create(&LimitLabels {
                limit: key.to_string(),
            })
            .inc();
    }

    /// The number of WatchExecutors streams open.
    pub fn set_watch_streams(&self, count: usize) {
        self.inner
            .watch_streams
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// One wait for the shared rate limiter of mutating Kubernetes requests.
    pub fn rate_limit_waited(&self, waited: Duration) {
        self.inner.rate_limit_wait.observe(waited.as_secs_f64());
    }

    /// An application's executor counts per resource profile, after one of its rounds.
    /// Per application: profiles it no longer reports lose their series, and an
    /// application beyond the first [`MAX_EXPORTED_APPLICATIONS`] is not exported. Summed:
    /// its last counts are replaced in the sums.
    pub fn application_profiles(
        &self,
        application: &str,
        profiles: impl IntoIterator<Item = (i32, ProfileGauges)>,
    ) {
        let now: BTreeMap<i32, ProfileGauges> = profiles.into_iter().collect();
        match &self.inner.executors {
            ExecutorGauges::PerApplication {
                target,
                running,
                pending,
                newly_created,
                exported,
            } => {
                let mut exported = lock(exported);
                if !exported.contains_key(application)
                    && exported.len() >= MAX_EXPORTED_APPLICATIONS
                {
                    return;
                }
                let before = exported
                    .insert(application.to_string(), now.keys().copied().collect())
                    .unwrap_or_default();
                for gone in before.iter().filter(|p| !now.contains_key(p)) {
                    self.remove_profile(application, *gone);
                }
                for (profile, counts) in now {
                    let labels = ProfileLabels {
                        application: application.to_string(),
                        profile: profile.to_string(),
                    };
                    let set = |family: &Family<ProfileLabels, Gauge>, value: u32| {
                        family.get_or_create(&labels).set(i64::from(value));
                    };
                    set(target, counts.target);
                    set(running, counts.running);
                    set(pending, counts.pending);
                    set(newly_created, counts.newly_created);
                }
            }
            ExecutorGauges::Summed { added, .. } => {
                let mut sums = [0i64; 4];
                for counts in now.values() {
                    let values = [
                        counts.target,
                        counts.running,
                        counts.pending,
                        counts.newly_created,
                    ];
                    for (sum, value) in sums.iter_mut().zip(values) {
                        *sum += i64::from(value);
                    }
                }
                let mut added = lock(added);
                let before = added
                    .insert(application.to_string(), sums)
                    .unwrap_or_default();
                self.add_to_sums(sums, before);
            }
        }
    }

    /// An application's actor ended: its per-profile series go, or its counts leave the
    /// sums.
    pub fn forget_application(&self, application: &str) {
        match &self.inner.executors {
            ExecutorGauges::PerApplication { exported, .. } => {
                if let Some(profiles) = lock(exported).remove(application) {
                    for profile in profiles {
                        self.remove_profile(application, profile);
                    }
                }
            }
            ExecutorGauges::Summed { added, .. } => {
                if let Some(before) = lock(added).remove(application) {
                    self.add_to_sums([0; 4], before);
                }
            }
        }
    }

    /// Replaces `before` by `now` in the summed gauges (called holding `added`'s lock).
    fn add_to_sums(&self, now: [i64; 4], before: [i64; 4]) {
        if let ExecutorGauges::Summed {
            target,
            running,
            pending,
            newly_created,
            ..
        } = &self.inner.executors
        {
            for (i, gauge) in [target, running, pending, newly_created]
                .into_iter()
                .enumerate()
            {
                gauge.inc_by(now[i] - before[i]);
            }
        }
    }

    /// Applications the service has beyond the exported ones (none when summed).
    fn set_unexported(&self, active: usize) {
        let exported = match &self.inner.executors {
            ExecutorGauges::PerApplication { exported, .. } => lock(exported).len(),
            ExecutorGauges::Summed { .. } => active,
        };
        self.inner
            .unexported
            .set(i64::try_from(active.saturating_sub(exported)).unwrap_or(i64::MAX));
    }

    fn remove_profile(&self, application: &str, profile: i32) {
        let ExecutorGauges::PerApplication {
            target,
            running,
            pending,
            newly_created,
            ..
        } = &self.inner.executors
        else {
            return;
        };
        let labels = ProfileLabels {
            application: application.to_string(),
            profile: profile.to_string(),
        };
        for family in [target, running, pending, newly_created] {
            family.remove(&labels);
        }
    }

    /// An executor's pod was first seen `elapsed` after its request.
    pub fn executor_seen_after(&self, elapsed: Duration) {
        self.inner.seen_after.observe(elapsed.as_secs_f64());
    }

    /// An executor's pod was first seen Running `elapsed` after its request.
    pub fn executor_running_after(&self, elapsed: Duration) {
        self.inner.running_after.observe(elapsed.as_secs_f64());
    }

    /// One pod watch event (`apply` or `delete`).
    pub fn watch_event(&self, kind: &'static str) {
        self.inner
            .watch_events
            .get_or_create(&KindLabels {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// A pod watch began a full relist.
    pub fn watch_relisted(&self) {
        self.inner.watch_relists.inc();
    }

    /// A pod watch failed with `status` (none when no answer came back).
    pub fn watch_failed(&self, status: Option<u16>) {
        self.inner
            .watch_errors
            .get_or_create(&StatusLabels {
                status: status.map(|s| s.to_string()).unwrap_or_default(),
            })
            .inc();
    }

    /// A stored registration not resumed, for `reason` ([`crate::app::registration::Refusal::reason`]).
    pub fn registration_refused(&self, reason: &'static str) {
        self.inner
            .registrations_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// One periodic full LIST took `elapsed`.
    pub fn resync_listed(&self, elapsed: Duration) {
        self.inner.resync_seconds.observe(elapsed.as_secs_f64());
    }

    /// The registry in Prometheus' text exposition format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.inner.registry);
        text
    }
}

/// The methods of the services this server has keep their name; any other path is one
/// `unknown` label, so a client probing paths cannot grow the label set.
fn bounded_method(path: &str) -> &str {
    const SERVICES: [&str; 4] = [
        "/spark.allocator.v1.ExecutorAllocator/",
        "/grpc.health.v1.Health/",
        "/grpc.reflection.v1.ServerReflection/",
        "/grpc.reflection.v1alpha.ServerReflection/",
    ];
    let known = SERVICES.iter().any(|service| {
        path.strip_prefix(service).is_some_and(|method| {
            !method.is_empty()
                && method.len() <= 64
                && method.chars().all(|c| c.is_ascii_alphanumeric())
        })
    });
    if known { path } else { "unknown" }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    metrics: Metrics,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode(),
                )
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Binds `address` and serves the metrics there in a background task; returns the bound
/// address (port 0 picks a free one).
pub async fn spawn(metrics: Metrics, address: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(err) = serve(metrics, listener, std::future::pending()).await {
            tracing::warn!(%err, "the metrics endpoint stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_paths_share_one_label() {
        assert_eq!(
            bounded_method("/spark.allocator.v1.ExecutorAllocator/Start"),
            "/spark.allocator.v1.ExecutorAllocator/Start"
        );
        assert_eq!(bounded_method("/evil/x"), "unknown");
        assert_eq!(
            bounded_method("/grpc.health.v1.Health/a-b"),
            "unknown",
            "only plain method names"
        );
    }

    #[test]
    fn by_default_executor_gauges_are_summed_and_name_no_application() {
        let metrics = Metrics::new();
        let counts = |target, running| ProfileGauges {
            target,
            running,
            pending: 1,
            newly_created: 0,
        };
        metrics.application_profiles("app-a", [(0, counts(4, 1)), (1, counts(2, 2))]);
        metrics.application_profiles("app-b", [(0, counts(3, 0))]);
        metrics.set_active_applications(2);
        let text = metrics.encode();
        assert!(!text.contains("app-"), "{text}");
        assert!(!text.contains("application=\""), "{text}");
        for line in [
            "spark_pod_allocator_executors_target 9",
            "spark_pod_allocator_executors_running 3",
            "spark_pod_allocator_executors_pending 3",
            "spark_pod_allocator_executors_newly_created 0",
            "spark_pod_allocator_applications_unexported 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}: {text}");
        }
        // A round replaces the application's counts; its end takes them out.
        metrics.application_profiles("app-a", [(0, counts(1, 1))]);
        metrics.forget_application("app-b");
        metrics.forget_application("app-b");
        let text = metrics.encode();
        assert!(
            text.lines()
                .any(|l| l == "spark_pod_allocator_executors_target 1"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l == "spark_pod_allocator_executors_pending 1"),
            "{text}"
        );
    }

    #[test]
    fn per_profile_gauges_are_bounded_and_forgotten() {
        let metrics = Metrics::with_application_labels(true);
        let counts = ProfileGauges {
            target: 4,
            running: 1,
            pending: 2,
            newly_created: 1,
        };
        for app in 0..MAX_EXPORTED_APPLICATIONS + 2 {
            metrics.application_profiles(&format!("app-{app}"), [(0, counts)]);
        }
        metrics.set_active_applications(MAX_EXPORTED_APPLICATIONS + 2);
        let text = metrics.encode();
        assert!(
            text.contains(
                "spark_pod_allocator_executors_pending{application=\"app-0\",profile=\"0\"} 2"
            ),
            "{text}"
        );
        assert!(!text.contains("application=\"app-500\""), "beyond the cap");
        assert!(
            text.contains("spark_pod_allocator_applications_unexported 2"),
            "{text}"
        );
        metrics.application_profiles("app-0", [(1, counts)]);
        metrics.forget_application("app-1");
        let text = metrics.encode();
        assert!(
            !text.contains("application=\"app-0\",profile=\"0\""),
            "{text}"
        );
        assert!(
            text.contains(
                "spark_pod_allocator_executors_target{application=\"app-0\",profile=\"1\"} 4"
            ),
            "{text}"
        );
        assert!(!text.contains("application=\"app-1\""), "{text}");
    }

    #[test]
    fn encodes_counts_by_label() {
        let metrics = Metrics::new();
        metrics.pods_created(3);
        metrics.pods_deleted(DeleteReason::Downscale, 2);
        metrics.pods_deleted(DeleteReason::Stop, 0);
        metrics.pod_create_failed(Some(403), "Forbidden");
        metrics.executor_stuck("ImagePullBackOff");
        metrics.rpc_answered(
            "/spark.allocator.v1.ExecutorAllocator/Start",
            "OK",
            Duration::from_millis(3),
        );
        let text = metrics.encode();
        assert!(
            text.contains("spark_pod_allocator_executor_pods_created_total 3"),
            "{text}"
        );
        assert!(
            text.contains(
                "spark_pod_allocator_executor_pods_deleted_total{reason=\"downscale\"} 2"
            ),
            "{text}"
        );
        assert!(!text.contains("reason=\"stop\""), "{text}");
        assert!(text.contains("spark_pod_allocator_executor_pod_create_failures_total{status=\"403\",reason=\"Forbidden\"} 1"), "{text}");
        assert!(
            text.contains(
                "spark_pod_allocator_executors_stuck_total{reason=\"ImagePullBackOff\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("spark_pod_allocator_grpc_requests_total{method=\"/spark.allocator.v1.ExecutorAllocator/Start\",code=\"OK\"} 1"), "{text}");
        assert!(text.contains("spark_pod_allocator_grpc_request_duration_seconds_count{method=\"/spark.allocator.v1.ExecutorAllocator/Start\"} 1"), "{text}");
        assert!(
            text.contains("spark_pod_allocator_build_info{version=\""),
            "{text}"
        );
    }
}
