//! The budgets as configured (`budgets`): who is in which queue, with what weight, and
//! what each budget bounds.
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::allocator::budget::{self, BudgetLimits, TenantBounds};

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
    /// A queue's namespaces (tenants): each a name, or a table with `namespace`, `weight`
    /// in the queue (default 1), `guaranteed_executors` (default its weighted part, floor,
    /// of `max_executors` less the guarantees set) and `max_executors` (its most, borrowing
    /// included; default the budget's). Which namespaces is read at start-up only (the
    /// namespaces of a queue share its shard); weights, guarantees and maximums reload.
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
    /// Take borrowed executors back for a tenant held below its guaranteed part: how long a
    /// driver has to give one back (RECLAIM event) before its pod is deleted; 0 deletes at
    /// once (as a scheduler's preemption). Absent: never reclaim (admission only).
    #[serde(default)]
    pub reclaim_deadline_ms: Option<u64>,
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
    /// Executors of the budget kept for this namespace's applications whenever they ask
    /// (default: its weighted part, floor, of the budget's `max_executors` less the
    /// guarantees set for the others); lent to the others meanwhile.
    #[serde(default)]
    pub guaranteed_executors: Option<u64>,
    /// Executors its applications may have at once, borrowing included (default: the
    /// budget's `max_executors`).
    #[serde(default)]
    pub max_executors: Option<u64>,
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

    /// Its `guaranteed_executors` and `max_executors`, as set.
    fn bounds(&self) -> (Option<u64>, Option<u64>) {
        match self {
            Self::Name(_) => (None, None),
            Self::Weighted(w) => (w.guaranteed_executors, w.max_executors),
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
    /// Each tenant's guaranteed part and maximum: a queue's namespaces', or a namespace
    /// budget's one namespace's (the whole budget).
    pub bounds: BTreeMap<String, TenantBounds>,
    /// Divide by guarantees first (some are set, or the budget reclaims); else by weight
    /// alone, which comes to the same up to rounding.
    pub guaranteed: bool,
    /// How long a borrower has to give an executor back (`reclaim_deadline_ms`); `None`:
    /// never reclaim.
    pub reclaim_deadline_ms: Option<u64>,
    /// Where its `namespaces` are in the configuration (`budgets[i].namespaces`).
    pub key: String,
}

impl Budget {
    /// The bounds of tenant `namespace` (the whole budget for one not listed).
    pub fn bounds_of(&self, namespace: &str) -> TenantBounds {
        self.bounds.get(namespace).copied().unwrap_or(TenantBounds {
            guaranteed: self.limits.max_executors,
            max: self.limits.max_executors,
        })
    }
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
            let bounds = tenant_bounds(entry, &scope, &key)?;
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
                guaranteed: entry.reclaim_deadline_ms.is_some()
                    || (entry.namespaces.iter()).any(|n| n.bounds() != (None, None)),
                bounds,
                reclaim_deadline_ms: entry.reclaim_deadline_ms,
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

/// The guaranteed part and maximum of each tenant of `entry` (checked: a maximum is 1 to
/// the budget's, a guarantee at most its maximum, the guarantees at most the budget's);
/// an error names the key.
fn tenant_bounds(
    entry: &BudgetEntry,
    scope: &BudgetScope,
    key: &dyn Fn(&str) -> String,
) -> Result<BTreeMap<String, TenantBounds>, (String, String)> {
    let max = entry.max_executors;
    let mut bounds = BTreeMap::new();
    if let BudgetScope::Namespace(namespace) = scope {
        let whole = TenantBounds {
            guaranteed: max,
            max,
        };
        bounds.insert(namespace.clone(), whole);
        return Ok(bounds);
    }
    let mut set = 0u64;
    let mut unset_weights = 0u64;
    for (at, member) in entry.namespaces.iter().enumerate() {
        let at = key(&format!("namespaces[{at}]"));
        let (guaranteed, most) = member.bounds();
        let most = most.unwrap_or(max);
        if most == 0 || most > max {
            return Err((
                format!("{at}.max_executors"),
                format!("must be between 1 and the budget's max_executors ({max}), got {most}"),
            ));
        }
        match guaranteed {
            Some(g) if g > most => {
                return Err((
                    format!("{at}.guaranteed_executors"),
                    format!("{g} is more than the namespace's max_executors ({most})"),
                ));
            }
            Some(g) => set = set.saturating_add(g),
            None => unset_weights += u64::from(member.parts().1),
        }
    }
    if set > max {
        return Err((
            key("namespaces"),
            format!(
                "the namespaces' guaranteed_executors add up to {set}, more than the budget's \
                 max_executors ({max})"
            ),
        ));
    }
    let left = max - set;
    for member in &entry.namespaces {
        let (namespace, weight) = member.parts();
        let (guaranteed, most) = member.bounds();
        let most = most.unwrap_or(max);
        let guaranteed = guaranteed.unwrap_or_else(|| {
            let part = u128::from(left) * u128::from(weight) / u128::from(unset_weights.max(1));
            u64::try_from(part).unwrap_or(u64::MAX).min(most)
        });
        bounds.insert(
            namespace.to_string(),
            TenantBounds {
                guaranteed,
                max: most,
            },
        );
    }
    Ok(bounds)
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
