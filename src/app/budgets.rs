//! Budgets shared by applications (`budgets` in the configuration): the one
//! owner of their accounting, the [`Budgets`] ledger.
//!
//! Each application is its own actor, but a budget spans applications, so one small
//! ledger per service keeps every application's last claim (what it wants, uses, has
//! pending, what an executor costs it, its weight). An actor joins at Start (its
//! [`BudgetMembership`], dropped when it ends) and, in each round, once its engine has
//! counted, asks the ledger for its room ([`BudgetMembership::room`]): the smallest over
//! the budgets it falls under of [`crate::allocator::budget::room_in`] (its share of its
//! namespace's share, never beyond what the budget has free). The room is reserved at
//! once (its use counts as if all of it were asked for), so two actors asking together
//! cannot both take what is free; the round then reports what it really asked for
//! ([`BudgetMembership::report`]). The arithmetic is pure and lives in the engine; this
//! only keeps the claims, behind one short lock that no I/O is done under.
//!
//! Who is in a queue, and with what weight, is the operator's: a queue budget lists its
//! namespaces, a namespace is in one queue at most, and a driver pod's queue label may
//! only name the queue its namespace is in ([`BudgetPolicy::check_queue_label`]).
//!
//! Scope: the ledger holds the applications of this replica, which are those of the
//! shards it owns (`ha`). The namespaces of a queue share the queue's shard
//! ([`BudgetPolicy::shard_keys`]), so one replica holds every application of a queue and
//! both namespace and queue budgets are exact whatever the replicas.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Deserialize;

use crate::allocator::budget::{
    self, BudgetClaim, BudgetLimits, BudgetResource, QuotaState, Tenancy,
};
use crate::metrics::Metrics;

/// The driver-pod annotation giving an application's weight when its Start settings give
/// none (`budget_weight`).
pub const WEIGHT_ANNOTATION: &str = "spark-pod-allocator/budget-weight";

/// One budget as the configuration gives it (`budgets[i]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetEntry {
    /// Its name in GetStatus, logs and metrics (default `namespace/NS` or `queue/Q`).
    #[serde(default)]
    pub name: Option<String>,
    /// The namespace whose applications it holds.
    #[serde(default)]
    pub namespace: Option<String>,
    /// The queue whose applications it holds: those of its `namespaces`.
    #[serde(default)]
    pub queue: Option<String>,
    /// A queue's namespaces (tenants), each with its weight in the queue (default 1).
    /// Read at start-up only: the namespaces of a queue share its shard.
    #[serde(default)]
    pub namespaces: Vec<QueueNamespace>,
    /// Executors (running, pending, requested) its applications may have at once.
    pub max_executors: u64,
    /// Of those, not running (pending, requested and not yet seen).
    #[serde(default)]
    pub max_pending: Option<u64>,
    /// CPU requests of its executors at once, a Kubernetes quantity (`64`, `500m`).
    #[serde(default)]
    pub max_cpu: Option<Quantity>,
    /// Memory requests of its executors at once, a Kubernetes quantity (`256Gi`).
    #[serde(default)]
    pub max_memory: Option<Quantity>,
}

/// A namespace of a queue: its name, or its name and weight.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum QueueNamespace {
    Name(String),
    Weighted(WeightedNamespace),
}

/// A namespace of a queue with its weight against the queue's other namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WeightedNamespace {
    pub namespace: String,
    #[serde(default = "one")]
    pub weight: u32,
}

fn one() -> u32 {
    1
}

impl QueueNamespace {
    fn parts(&self) -> (&str, u32) {
        match self {
            Self::Name(name) => (name, 1),
            Self::Weighted(w) => (&w.namespace, w.weight),
        }
    }
}

/// A Kubernetes quantity, written as a string or a number.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(from = "QuantityText")]
pub struct Quantity(pub String);

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum QuantityText {
    Text(String),
    Whole(u64),
    Real(f64),
}

impl From<QuantityText> for Quantity {
    fn from(value: QuantityText) -> Self {
        Self(match value {
            QuantityText::Text(text) => text,
            QuantityText::Whole(n) => n.to_string(),
            QuantityText::Real(x) => x.to_string(),
        })
    }
}

/// The applications a budget holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetScope {
    Namespace(String),
    Queue(String),
}

/// A budget, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    pub scope: BudgetScope,
    pub limits: BudgetLimits,
    /// A queue's namespaces and their weights (none for a namespace budget).
    pub tenants: BTreeMap<String, u32>,
    /// Where its `namespaces` are in the configuration (`budgets[i].namespaces`).
    pub key: String,
}

/// The budgets in force, checked: what the configuration (and each reload of its file)
/// gives the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetPolicy {
    pub budgets: Vec<Budget>,
    /// The driver-pod label that may name an application's queue: only the queue its
    /// namespace is in, else its Start is refused.
    pub queue_label: Option<String>,
    /// The largest weight an application may ask for (`budgets_max_weight`); a larger one
    /// counts as this.
    pub max_weight: u32,
    /// Each namespace's ResourceQuotas are divided as budgets too
    /// (`budgets_follow_quotas`; read at start-up only).
    pub follow_quotas: bool,
}

/// The default of `budgets_max_weight`.
pub const DEFAULT_MAX_WEIGHT: u32 = 10;

impl Default for BudgetPolicy {
    /// No budget.
    fn default() -> Self {
        Self {
            budgets: Vec::new(),
            queue_label: None,
            max_weight: DEFAULT_MAX_WEIGHT,
            follow_quotas: true,
        }
    }
}

impl BudgetPolicy {
    /// Checks the configuration's budgets; an error names the key (`budgets[2].max_cpu`).
    pub fn check(
        entries: &[BudgetEntry],
        queue_label: Option<&str>,
        max_weight: u32,
    ) -> Result<Self, (String, String)> {
        let queue_label = queue_label.map(str::trim).filter(|l| !l.is_empty());
        if let Some(label) = queue_label {
            crate::naming::label_key(label)
                .map_err(|reason| ("budgets_queue_label".to_string(), reason))?;
        }
        if max_weight == 0 {
            return Err(("budgets_max_weight".into(), "must be greater than 0".into()));
        }
        let mut names = BTreeSet::new();
        let mut queues = BTreeMap::new();
        // Each namespace of a queue, and the budget that lists it.
        let mut members: BTreeMap<String, usize> = BTreeMap::new();
        let mut budgets = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let key = |field: &str| format!("budgets[{index}].{field}");
            let scope = match (&entry.namespace, &entry.queue) {
                (Some(namespace), None) => {
                    if !crate::naming::is_dns_label(namespace) {
                        return Err((
                            key("namespace"),
                            format!("{namespace:?} is not a namespace name (DNS-1123 label)"),
                        ));
                    }
                    BudgetScope::Namespace(namespace.clone())
                }
                (None, Some(queue)) => {
                    crate::naming::label_value(queue).map_err(|reason| (key("queue"), reason))?;
                    if queue.is_empty() {
                        return Err((key("queue"), "must not be empty".into()));
                    }
                    if let Some(other) = queues.insert(queue.clone(), index) {
                        return Err((
                            key("queue"),
                            format!("queue {queue:?} is budgets[{other}]'s too"),
                        ));
                    }
                    BudgetScope::Queue(queue.clone())
                }
                (Some(_), Some(_)) => {
                    return Err((
                        format!("budgets[{index}]"),
                        "give namespace or queue, not both".into(),
                    ));
                }
                (None, None) => {
                    return Err((
                        format!("budgets[{index}]"),
                        "give namespace or queue".into(),
                    ));
                }
            };
            let mut tenants = BTreeMap::new();
            match &scope {
                BudgetScope::Namespace(_) if !entry.namespaces.is_empty() => {
                    return Err((
                        key("namespaces"),
                        "only a queue budget lists namespaces".into(),
                    ));
                }
                BudgetScope::Namespace(_) => {}
                BudgetScope::Queue(_) if entry.namespaces.is_empty() => {
                    return Err((
                        key("namespaces"),
                        "a queue budget lists its namespaces (the driver pod's queue label \
                         no longer puts an application in a queue)"
                            .into(),
                    ));
                }
                BudgetScope::Queue(_) => {
                    for (at, member) in entry.namespaces.iter().enumerate() {
                        let (namespace, weight) = member.parts();
                        let at = key(&format!("namespaces[{at}]"));
                        if !crate::naming::is_dns_label(namespace) {
                            return Err((
                                at,
                                format!("{namespace:?} is not a namespace name (DNS-1123 label)"),
                            ));
                        }
                        if !(1..=max_weight).contains(&weight) {
                            return Err((
                                format!("{at}.weight"),
                                format!(
                                    "must be between 1 and budgets_max_weight ({max_weight}), \
                                     got {weight}"
                                ),
                            ));
                        }
                        if let Some(other) = members.insert(namespace.to_string(), index) {
                            return Err((
                                at,
                                format!(
                                    "namespace {namespace} is in budgets[{other}]'s queue \
                                     already; a namespace is in one queue at most"
                                ),
                            ));
                        }
                        tenants.insert(namespace.to_string(), weight);
                    }
                }
            }
            let name = match (&entry.name, &scope) {
                (Some(name), _) => name.trim().to_string(),
                (None, BudgetScope::Namespace(ns)) => format!("namespace/{ns}"),
                (None, BudgetScope::Queue(q)) => format!("queue/{q}"),
            };
            if name.is_empty() || name.len() > 128 {
                return Err((key("name"), "must be 1 to 128 characters".into()));
            }
            if !names.insert(name.clone()) {
                return Err((key("name"), format!("{name:?} names another budget too")));
            }
            if entry.max_executors == 0 {
                return Err((key("max_executors"), "must be greater than 0".into()));
            }
            if entry.max_pending == Some(0) {
                return Err((key("max_pending"), "must be greater than 0 when set".into()));
            }
            let max_cpu_millis = match &entry.max_cpu {
                None => None,
                Some(q) => match budget::parse_cpu_millis(&q.0) {
                    Some(m) if m > 0 => Some(m),
                    _ => {
                        return Err((
                            key("max_cpu"),
                            format!("{:?} is not a positive CPU quantity (e.g. 64, 500m)", q.0),
                        ));
                    }
                },
            };
            let max_memory_bytes = match &entry.max_memory {
                None => None,
                Some(q) => match crate::allocator::claims::quantity_bytes(&q.0)
                    .and_then(|b| u64::try_from(b).ok())
                {
                    Some(b) if b > 0 => Some(b),
                    _ => {
                        return Err((
                            key("max_memory"),
                            format!("{:?} is not a positive memory quantity (e.g. 256Gi)", q.0),
                        ));
                    }
                },
            };
            budgets.push(Budget {
                name,
                scope,
                limits: BudgetLimits {
                    max_executors: entry.max_executors,
                    max_pending: entry.max_pending,
                    max_cpu_millis,
                    max_memory_bytes,
                },
                tenants,
                key: key("namespaces"),
            });
        }
        Ok(Self {
            budgets,
            queue_label: queue_label.map(str::to_string),
            max_weight,
            follow_quotas: true,
        })
    }
}

impl BudgetPolicy {
    /// The queue budget whose namespaces include `namespace`.
    pub fn queue_of(&self, namespace: &str) -> Option<&Budget> {
        (self.budgets.iter())
            .find(|b| matches!(b.scope, BudgetScope::Queue(_)) && b.tenants.contains_key(namespace))
    }

    /// Each namespace of a queue and its queue's name: what places it in a shard.
    pub fn membership(&self) -> BTreeMap<String, String> {
        let mut membership = BTreeMap::new();
        for budget in &self.budgets {
            if let BudgetScope::Queue(queue) = &budget.scope {
                for namespace in budget.tenants.keys() {
                    membership.insert(namespace.clone(), queue.clone());
                }
            }
        }
        membership
    }

    /// The shard key of each namespace of a queue (`queue/<name>`, which no namespace can
    /// be): the applications of a queue are in one shard, owned by one replica, whose
    /// ledger is then exact for the queue.
    pub fn shard_keys(&self) -> BTreeMap<String, String> {
        (self.membership().into_iter())
            .map(|(namespace, queue)| (namespace, format!("queue/{queue}")))
            .collect()
    }

    /// `None` when `next` puts every namespace in the queue `self` does; else the key of
    /// the first that moves and why. Membership decides shards, so it changes only with a
    /// restart of every replica.
    pub fn membership_change(&self, next: &BudgetPolicy) -> Option<(String, String)> {
        let (now, then) = (self.membership(), next.membership());
        let moved = (now.keys().chain(then.keys()))
            .find(|namespace| now.get(*namespace) != then.get(*namespace))?;
        let key = match next.queue_of(moved).or_else(|| self.queue_of(moved)) {
            Some(budget) => budget.key.clone(),
            None => "budgets".to_string(),
        };
        let queue = |q: Option<&String>| q.map_or("no queue".to_string(), |q| format!("queue {q}"));
        Some((
            key,
            format!(
                "namespace {moved} would move from {} to {}: queue membership decides shards \
                 and is read at start-up only (restart every replica to change it)",
                queue(now.get(moved)),
                queue(then.get(moved)),
            ),
        ))
    }

    /// Refuses a driver pod whose `budgets_queue_label` names a queue other than its
    /// namespace's: the label may choose only among what the operator allowed.
    pub fn check_queue_label(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        let Some(label) = &self.queue_label else {
            return Ok(());
        };
        let Some(asked) = labels.get(label) else {
            return Ok(());
        };
        let allowed = self.queue_of(namespace).and_then(|b| match &b.scope {
            BudgetScope::Queue(queue) => Some(queue),
            BudgetScope::Namespace(_) => None,
        });
        match allowed {
            Some(queue) if queue == asked => Ok(()),
            Some(queue) => Err(format!(
                "driver pod label {label}={asked}: namespace {namespace} is in queue {queue} \
                 only (the budgets' configuration decides a namespace's queue)"
            )),
            None => Err(format!(
                "driver pod label {label}={asked}: namespace {namespace} is in no queue (the \
                 budgets' configuration decides a namespace's queue)"
            )),
        }
    }
}

/// Why an application's executors are held: the budget and resource that bound its room,
/// in that resource's unit (executors, millicores, bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBy {
    pub budget: String,
    pub resource: BudgetResource,
    /// What the budget's applications use of it.
    pub used: u64,
    pub limit: u64,
    /// The application's fair share of it.
    pub share: u64,
}

/// What one budget holds now (observability, tests, the metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetUsage {
    pub name: String,
    /// Executors its applications have or asked for.
    pub executors: u64,
    pub max_executors: u64,
    /// Executors its applications' targets lack that it holds back.
    pub held: u64,
    pub applications: usize,
}

/// The ledger of every budget; cloned handles share it.
#[derive(Clone)]
pub struct Budgets {
    inner: Arc<Shared>,
}

struct Shared {
    ledger: Mutex<Ledger>,
    metrics: Metrics,
}

/// An application's place in the ledger, in its order (ties of a division go to the
/// earlier): namespace, application id, then the join's number.
type MemberKey = (String, String, u64);

struct Ledger {
    policy: BudgetPolicy,
    /// Each namespace's ResourceQuotas, as its watch last showed them.
    quotas: BTreeMap<String, Vec<QuotaState>>,
    members: BTreeMap<MemberKey, Member>,
    joined: u64,
}

struct Member {
    namespace: String,
    claim: BudgetClaim,
    /// Executors held back in its last round, and by what.
    held: u64,
    held_by: Option<String>,
}

impl Ledger {
    fn matches(&self, budget: &Budget, member: &Member) -> bool {
        match &budget.scope {
            BudgetScope::Namespace(ns) => *ns == member.namespace,
            BudgetScope::Queue(_) => budget.tenants.contains_key(&member.namespace),
        }
    }

    /// The room of `key` (`u64::MAX` under no budget) and the bound that set it.
    fn room(&self, key: &MemberKey) -> (u64, Option<HeldBy>) {
        let Some(member) = self.members.get(key) else {
            return (u64::MAX, None);
        };
        let mut best: (u64, Option<HeldBy>) = (u64::MAX, None);
        for budget in &self.policy.budgets {
            if !self.matches(budget, member) {
                continue;
            }
            let mut claims = Vec::new();
            // The namespaces are its tenants, in the members' order (by namespace).
            let (mut weights, mut of) = (Vec::new(), Vec::new());
            let mut last: Option<&str> = None;
            let mut who = 0;
            for (k, m) in &self.members {
                if self.matches(budget, m) {
                    if k == key {
                        who = claims.len();
                    }
                    if last != Some(m.namespace.as_str()) {
                        last = Some(m.namespace.as_str());
                        weights.push(budget.tenants.get(&m.namespace).copied().unwrap_or(1));
                    }
                    of.push(weights.len() - 1);
                    claims.push(m.claim);
                }
            }
            let tenancy = Tenancy {
                weights: &weights,
                of: &of,
            };
            let room = budget::room_in(&budget.limits, &claims, tenancy, who);
            if best.1.is_none() || room.executors < best.0 {
                best = (room.executors, Some(held_by(&budget.name, &room)));
            }
        }
        // The namespace's ResourceQuotas, divided as budgets over its applications: no
        // create is sent that a quota would refuse, and what it leaves is shared fairly.
        for quota in self.quotas.get(&member.namespace).into_iter().flatten() {
            let mut claims = Vec::new();
            let mut who = 0;
            for (k, m) in &self.members {
                if m.namespace == member.namespace {
                    if k == key {
                        who = claims.len();
                    }
                    claims.push(m.claim);
                }
            }
            let limits = quota.as_limits(&claims);
            let of = vec![0; claims.len()];
            let tenancy = Tenancy {
                weights: &[1],
                of: &of,
            };
            let room = budget::room_in(&limits, &claims, tenancy, who);
            if best.1.is_none() || room.executors < best.0 {
                let name = format!("quota/{}/{}", member.namespace, quota.name);
                best = (room.executors, Some(held_by(&name, &room)));
            }
        }
        best
    }

    fn usage(&self) -> Vec<BudgetUsage> {
        (self.policy.budgets.iter())
            .map(|budget| self.usage_of(budget))
            .collect()
    }

    fn usage_of(&self, budget: &Budget) -> BudgetUsage {
        let members = self.members.values().filter(|m| self.matches(budget, m));
        let mut usage = BudgetUsage {
            name: budget.name.clone(),
            executors: 0,
            max_executors: budget.limits.max_executors,
            held: 0,
            applications: 0,
        };
        for m in members {
            usage.executors = usage.executors.saturating_add(m.claim.using);
            usage.applications += 1;
            if m.held_by.as_deref() == Some(budget.name.as_str()) {
                usage.held = usage.held.saturating_add(m.held);
            }
        }
        usage
    }
}

fn held_by(budget: &str, room: &budget::Room) -> HeldBy {
    HeldBy {
        budget: budget.to_string(),
        resource: room.bound.resource,
        used: room.bound.used,
        limit: room.bound.limit,
        share: room.bound.share,
    }
}

impl crate::k8s::watch::QuotaSink for Budgets {
    /// `namespace`'s ResourceQuotas now: its applications' next rounds divide what they
    /// leave.
    fn quotas(&self, namespace: &str, quotas: Vec<QuotaState>) {
        let mut ledger = self.ledger();
        if quotas.is_empty() {
            ledger.quotas.remove(namespace);
        } else {
            ledger.quotas.insert(namespace.to_string(), quotas);
        }
    }
}

impl Budgets {
    /// A ledger of `policy`'s budgets, exporting into `metrics`.
    pub fn new(policy: BudgetPolicy, metrics: Metrics) -> Self {
        let budgets = Self {
            inner: Arc::new(Shared {
                ledger: Mutex::new(Ledger {
                    policy,
                    members: BTreeMap::new(),
                    quotas: BTreeMap::new(),
                    joined: 0,
                }),
                metrics,
            }),
        };
        budgets.export(&budgets.ledger());
        budgets
    }

    /// Puts `policy` in force (a reload of the configuration file): each application's next
    /// round asks under it. Applications keep what they have (nothing is deleted); one
    /// beyond a lowered budget creates nothing until it is within its share again. A
    /// policy that moves a namespace between queues is refused, naming the key: queue
    /// membership decides shards and is fixed for the life of the process.
    pub fn replace(&self, policy: BudgetPolicy) -> Result<(), (String, String)> {
        let mut ledger = self.ledger();
        if let Some(refused) = ledger.policy.membership_change(&policy) {
            return Err(refused);
        }
        let before: BTreeSet<String> = ledger
            .policy
            .budgets
            .iter()
            .map(|b| b.name.clone())
            .collect();
        let follow_quotas = ledger.policy.follow_quotas;
        ledger.policy = BudgetPolicy {
            follow_quotas,
            ..policy
        };
        for gone in before
            .iter()
            .filter(|name| !ledger.policy.budgets.iter().any(|b| &b.name == *name))
        {
            self.inner.metrics.forget_budget(gone);
        }
        for member in ledger.members.values_mut() {
            member.held_by = None;
        }
        self.export(&ledger);
        Ok(())
    }

    /// [`BudgetPolicy::check_queue_label`] under the budgets in force.
    pub fn check_queue_label(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), String> {
        self.ledger().policy.check_queue_label(namespace, labels)
    }

    /// The budgets in force.
    pub fn policy(&self) -> BudgetPolicy {
        self.ledger().policy.clone()
    }

    /// The ResourceQuotas of `namespace` as its watch last showed them (observability,
    /// tests).
    pub fn quotas(&self, namespace: &str) -> Vec<QuotaState> {
        self.ledger()
            .quotas
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    /// What each budget holds now, in the configuration's order.
    pub fn usage(&self) -> Vec<BudgetUsage> {
        self.ledger().usage()
    }

    /// The application `app` of `namespace` joins with `weight` (at most
    /// `budgets_max_weight`), which divides only its namespace's share; it leaves when the
    /// membership is dropped.
    pub fn join(&self, namespace: &str, app: &str, weight: u32) -> BudgetMembership {
        let mut ledger = self.ledger();
        ledger.joined += 1;
        let key = (namespace.to_string(), app.to_string(), ledger.joined);
        let weight = weight.clamp(1, ledger.policy.max_weight.max(1));
        ledger.members.insert(
            key.clone(),
            Member {
                namespace: namespace.to_string(),
                claim: BudgetClaim {
                    weight,
                    ..BudgetClaim::default()
                },
                held: 0,
                held_by: None,
            },
        );
        BudgetMembership {
            budgets: self.clone(),
            key,
        }
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        match self.inner.ledger.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Every budget's gauges.
    fn export(&self, ledger: &Ledger) {
        for usage in ledger.usage() {
            self.inner
                .metrics
                .set_budget(&usage.name, usage.executors, usage.held);
        }
    }

    /// The gauges of the budgets `member` falls under (a round changes no other's).
    fn export_of(&self, ledger: &Ledger, member: &Member) {
        for budget in &ledger.policy.budgets {
            if ledger.matches(budget, member) {
                let usage = ledger.usage_of(budget);
                self.inner
                    .metrics
                    .set_budget(&usage.name, usage.executors, usage.held);
            }
        }
    }
}

/// An application's place in the ledger, held by its actor; dropping it leaves.
pub struct BudgetMembership {
    budgets: Budgets,
    key: MemberKey,
}

/// What a round may ask for under the application's budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// More executors it may ask for (`u64::MAX`: under no budget).
    pub room: u64,
    /// The budget and resource that bound it (none under no budget).
    pub bound: Option<HeldBy>,
}

impl BudgetMembership {
    /// The application's weight in the ledger.
    pub fn weight(&self) -> u32 {
        let ledger = self.budgets.ledger();
        ledger.members.get(&self.key).map_or(1, |m| m.claim.weight)
    }

    /// The application's room now, given its `claim` (its weight is the ledger's); the
    /// room is reserved until [`Self::report`].
    pub fn room(&self, mut claim: BudgetClaim) -> Grant {
        let mut ledger = self.budgets.ledger();
        let Some(member) = ledger.members.get_mut(&self.key) else {
            return Grant {
                room: u64::MAX,
                bound: None,
            };
        };
        claim.weight = member.claim.weight;
        member.claim = claim;
        let (room, bound) = ledger.room(&self.key);
        if room != u64::MAX
            && let Some(member) = ledger.members.get_mut(&self.key)
        {
            let reserved = room.min(claim.lacking());
            member.claim.using = member.claim.using.saturating_add(reserved);
            member.claim.pending = member.claim.pending.saturating_add(reserved);
        }
        Grant { room, bound }
    }

    /// What the round asked for (its `claim` after its creates) and how many executors it
    /// held back, by what.
    pub fn report(&self, mut claim: BudgetClaim, held: u64, held_by: Option<&HeldBy>) {
        let mut ledger = self.budgets.ledger();
        let Some(member) = ledger.members.get_mut(&self.key) else {
            return;
        };
        claim.weight = member.claim.weight;
        member.claim = claim;
        member.held = held;
        member.held_by = held_by.filter(|_| held > 0).map(|h| h.budget.clone());
        if let Some(member) = ledger.members.get(&self.key) {
            self.budgets.export_of(&ledger, member);
        }
    }

    /// New targets adding up to `wanted` executors: the ledger counts them at once, so the
    /// others' rounds divide with this demand before this application's next round.
    pub fn wanting(&self, wanted: u64) {
        let mut ledger = self.budgets.ledger();
        if let Some(member) = ledger.members.get_mut(&self.key) {
            member.claim.wanted = wanted.max(member.claim.using);
        }
    }
}

impl Drop for BudgetMembership {
    fn drop(&mut self) {
        let mut ledger = self.budgets.ledger();
        if let Some(member) = ledger.members.remove(&self.key) {
            self.budgets.export_of(&ledger, &member);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(namespace: &str, max: u64) -> BudgetEntry {
        BudgetEntry {
            name: None,
            namespace: Some(namespace.into()),
            queue: None,
            namespaces: Vec::new(),
            max_executors: max,
            max_pending: None,
            max_cpu: None,
            max_memory: None,
        }
    }

    fn claim(wanted: u64, using: u64) -> BudgetClaim {
        BudgetClaim {
            weight: 1,
            wanted,
            using,
            pending: using,
            ..BudgetClaim::default()
        }
    }

    fn ledger(entries: &[BudgetEntry]) -> Budgets {
        let policy = BudgetPolicy::check(entries, Some("queue"), 10).unwrap();
        Budgets::new(policy, Metrics::new())
    }

    #[test]
    fn bad_budgets_are_refused_naming_the_key() {
        let check = |entries: &[BudgetEntry], label: Option<&str>| {
            BudgetPolicy::check(entries, label, 10).unwrap_err().0
        };
        let mut cpu = entry("c", 10);
        cpu.max_cpu = Some(Quantity("lots".into()));
        assert_eq!(
            check(&[entry("a", 1), entry("b", 1), cpu], None),
            "budgets[2].max_cpu"
        );
        let mut memory = entry("a", 10);
        memory.max_memory = Some(Quantity("0".into()));
        assert_eq!(check(&[memory], None), "budgets[0].max_memory");
        assert_eq!(check(&[entry("a", 0)], None), "budgets[0].max_executors");
        assert_eq!(check(&[entry("A_", 1)], None), "budgets[0].namespace");
        assert_eq!(
            check(&[entry("a", 1), entry("a", 2)], None),
            "budgets[1].name"
        );
        let mut queue = entry("a", 1);
        queue.namespace = None;
        queue.queue = Some("gold".into());
        // The label no longer puts anyone in a queue: the operator lists its namespaces.
        assert_eq!(
            check(std::slice::from_ref(&queue), Some("queue")),
            "budgets[0].namespaces"
        );
        queue.namespaces = vec![QueueNamespace::Name("a".into())];
        assert!(BudgetPolicy::check(std::slice::from_ref(&queue), None, 10).is_ok());
        let mut silver = queue.clone();
        silver.queue = Some("silver".into());
        silver.namespaces.push(QueueNamespace::Name("b".into()));
        assert_eq!(
            check(&[queue.clone(), silver.clone()], None),
            "budgets[1].namespaces[0]"
        );
        silver.namespaces = vec![QueueNamespace::Weighted(WeightedNamespace {
            namespace: "b".into(),
            weight: 11,
        })];
        assert_eq!(
            check(&[queue.clone(), silver], None),
            "budgets[1].namespaces[0].weight"
        );
        let mut again = queue.clone();
        again.name = Some("other".into());
        assert_eq!(check(&[queue.clone(), again], None), "budgets[1].queue");
        let mut listed = entry("a", 1);
        listed.namespaces = queue.namespaces.clone();
        assert_eq!(check(&[listed], None), "budgets[0].namespaces");
        queue.namespace = Some("a".into());
        assert_eq!(check(&[queue], Some("queue")), "budgets[0]");
        assert_eq!(check(&[], Some("bad key!")), "budgets_queue_label");
    }

    fn queue(name: &str, max: u64, namespaces: &[(&str, u32)]) -> BudgetEntry {
        BudgetEntry {
            namespace: None,
            queue: Some(name.into()),
            namespaces: (namespaces.iter())
                .map(|(namespace, weight)| {
                    QueueNamespace::Weighted(WeightedNamespace {
                        namespace: namespace.to_string(),
                        weight: *weight,
                    })
                })
                .collect(),
            ..entry("unused", max)
        }
    }

    #[test]
    fn the_queue_label_may_only_name_the_namespace_queue() {
        let policy =
            BudgetPolicy::check(&[queue("gold", 10, &[("team-a", 1)])], Some("queue"), 10).unwrap();
        let label = |value: &str| BTreeMap::from([("queue".to_string(), value.to_string())]);
        assert!(policy.check_queue_label("team-a", &label("gold")).is_ok());
        assert!(policy.check_queue_label("team-a", &BTreeMap::new()).is_ok());
        let refused = policy
            .check_queue_label("team-b", &label("gold"))
            .unwrap_err();
        assert!(
            refused.contains("queue=gold") && refused.contains("team-b"),
            "{refused}"
        );
        assert!(
            policy
                .check_queue_label("team-a", &label("silver"))
                .is_err()
        );
        assert_eq!(
            policy.shard_keys(),
            BTreeMap::from([("team-a".to_string(), "queue/gold".to_string())])
        );
    }

    #[test]
    fn a_reload_may_change_limits_and_weights_but_not_who_is_in_a_queue() {
        let check = |entries: &[BudgetEntry]| BudgetPolicy::check(entries, None, 10).unwrap();
        let budgets = Budgets::new(
            check(&[queue("gold", 10, &[("a", 1), ("b", 1)])]),
            Metrics::new(),
        );
        assert!(
            budgets
                .replace(check(&[queue("gold", 20, &[("a", 3), ("b", 1)])]))
                .is_ok()
        );
        assert_eq!(budgets.policy().budgets[0].limits.max_executors, 20);
        let (key, why) = budgets
            .replace(check(&[queue("gold", 20, &[("a", 3)])]))
            .unwrap_err();
        assert_eq!(key, "budgets[0].namespaces");
        assert!(why.contains("namespace b"), "{why}");
        assert_eq!(
            budgets.replace(check(&[])).unwrap_err().0,
            "budgets[0].namespaces"
        );
        assert_eq!(budgets.policy().budgets[0].tenants.len(), 2);
    }

    #[test]
    fn a_queue_is_divided_by_namespace_then_by_application() {
        let budgets = ledger(&[queue("gold", 12, &[("one", 1), ("five", 1)])]);
        let five: Vec<BudgetMembership> = (0..5)
            .map(|i| budgets.join("five", &format!("app-{i}"), 10))
            .collect();
        let one = budgets.join("one", "app", 1);
        for app in five.iter().chain([&one]) {
            app.report(claim(12, 0), 0, None);
        }
        let grants: Vec<u64> = (five.iter())
            .map(|app| {
                let room = app.room(claim(12, 0)).room;
                app.report(claim(12, room), 0, None);
                room
            })
            .collect();
        assert_eq!(grants.iter().sum::<u64>(), 6, "{grants:?}");
        assert_eq!(one.room(claim(12, 0)).room, 6);
    }

    #[test]
    fn three_applications_share_a_namespace_budget_and_one_ending_frees_its_share() {
        let budgets = ledger(&[entry("team", 30)]);
        let apps: Vec<BudgetMembership> = ["a", "b", "c"]
            .iter()
            .map(|app| budgets.join("team", app, 1))
            .collect();
        // Each reports what it wants before anyone asks (as after SetTotalExpected).
        for app in &apps {
            app.report(claim(30, 0), 0, None);
        }
        for app in &apps {
            let grant = app.room(claim(30, 0));
            assert_eq!(grant.room, 10);
            app.report(claim(30, 10), 20, grant.bound.as_ref());
        }
        assert_eq!(apps[0].room(claim(30, 10)).room, 0);
        apps[0].report(claim(30, 10), 20, None);
        let usage = &budgets.usage()[0];
        assert_eq!((usage.executors, usage.applications), (30, 3));
        let mut apps = apps;
        drop(apps.pop());
        // 15/15 now, and 10 are free: each may ask for 5 more.
        assert_eq!(apps[0].room(claim(30, 10)).room, 5);
        apps[0].report(claim(30, 15), 15, None);
        assert_eq!(apps[1].room(claim(30, 10)).room, 5);
        assert_eq!(budgets.usage()[0].applications, 2);
    }

    #[test]
    fn a_reserved_room_is_not_granted_twice() {
        let budgets = ledger(&[entry("team", 10)]);
        let a = budgets.join("team", "a", 1);
        let b = budgets.join("team", "b", 1);
        // a alone asks: it may take all that is free.
        assert_eq!(a.room(claim(10, 0)).room, 10);
        // b asks before a reported: a's room is counted as used.
        assert_eq!(b.room(claim(10, 0)).room, 0);
    }

    #[test]
    fn queue_budgets_hold_their_namespaces_and_the_smaller_room_wins() {
        let budgets = ledger(&[entry("team", 100), queue("gold", 4, &[("gold-team", 1)])]);
        let a = budgets.join("gold-team", "a", 1);
        let b = budgets.join("team", "b", 1);
        let grant = a.room(claim(10, 0));
        assert_eq!(grant.room, 4);
        assert_eq!(grant.bound.unwrap().budget, "queue/gold");
        // The namespace budget holds b only.
        assert_eq!(b.room(claim(100, 0)).room, 100);
        let c = budgets.join("team", "c", 1);
        assert_eq!(c.room(claim(100, 0)).room, 0);
        let none = budgets.join("elsewhere", "d", 1);
        assert_eq!(none.room(claim(10, 0)).room, u64::MAX);
    }

    #[test]
    fn weights_are_bounded_and_a_reload_takes_effect_at_the_next_ask() {
        let budgets = ledger(&[entry("team", 30)]);
        let heavy = budgets.join("team", "a", 1000);
        assert_eq!(heavy.weight(), 10);
        let light = budgets.join("team", "b", 1);
        light.report(claim(30, 0), 0, None);
        heavy.report(claim(30, 0), 0, None);
        // 30 × 10/11 = 27.3, 30 × 1/11 = 2.7: the extra unit goes to the larger fraction.
        assert_eq!(light.room(claim(30, 0)).room, 3);
        light.report(claim(30, 0), 0, None);
        (budgets.replace(BudgetPolicy::check(&[entry("team", 44)], None, 10).unwrap()))
            .expect("no queue moves");
        // 44 × 10/11 = 40 ≥ 30: the heavy one gets its 30, the light one the 14 left.
        assert_eq!(light.room(claim(30, 0)).room, 14);
        budgets.replace(BudgetPolicy::default()).expect("no queue");
        assert_eq!(light.room(claim(30, 0)).room, u64::MAX);
    }
}
