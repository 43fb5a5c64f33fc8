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

use crate::allocator::Timestamp;
use crate::allocator::budget::{
    self, BudgetClaim, BudgetResource, QuotaState, Tenancy, TenantBounds,
};
use crate::metrics::Metrics;

mod policy;

pub use policy::{
    Budget, BudgetEntry, BudgetPolicy, BudgetScope, DEFAULT_MAX_WEIGHT, Quantity, QueueNamespace,
    WEIGHT_ANNOTATION, WeightedNamespace,
};
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
    /// Executors it holds beyond its guaranteed part (the most over its budgets), as of
    /// its last round.
    borrowed: u64,
    /// Since when it waits for executors asked back for it (below its guaranteed part),
    /// until its next creates.
    owed_since: Option<Timestamp>,
}

/// The claims of one budget's members, grouped by tenant (namespace) in the members'
/// order, as the pure arithmetic takes them.
struct Division<'l> {
    keys: Vec<&'l MemberKey>,
    claims: Vec<BudgetClaim>,
    weights: Vec<u32>,
    of: Vec<usize>,
    bounds: Vec<TenantBounds>,
}

impl Division<'_> {
    fn tenancy(&self, guaranteed: bool) -> Tenancy<'_> {
        Tenancy {
            weights: &self.weights,
            of: &self.of,
            bounds: guaranteed.then_some(self.bounds.as_slice()),
        }
    }

    fn position(&self, key: &MemberKey) -> Option<usize> {
        self.keys.iter().position(|k| *k == key)
    }
}

/// Executors a borrower is asked to give back now, and for which budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimAsk {
    pub count: u64,
    pub budget: String,
    /// `reclaim_deadline_ms` of the budget (0: delete at once).
    pub deadline_ms: u64,
}

impl Ledger {
    fn matches(&self, budget: &Budget, member: &Member) -> bool {
        match &budget.scope {
            BudgetScope::Namespace(ns) => *ns == member.namespace,
            BudgetScope::Queue(_) => budget.tenants.contains_key(&member.namespace),
        }
    }

    /// The members of `budget`, its namespaces as its tenants, in the members' order (by
    /// namespace).
    fn division(&self, budget: &Budget) -> Division<'_> {
        let mut division = Division {
            keys: Vec::new(),
            claims: Vec::new(),
            weights: Vec::new(),
            of: Vec::new(),
            bounds: Vec::new(),
        };
        let mut last: Option<&str> = None;
        for (k, m) in &self.members {
            if self.matches(budget, m) {
                if last != Some(m.namespace.as_str()) {
                    last = Some(m.namespace.as_str());
                    (division.weights).push(budget.tenants.get(&m.namespace).copied().unwrap_or(1));
                    division.bounds.push(budget.bounds_of(&m.namespace));
                }
                division.of.push(division.weights.len() - 1);
                division.claims.push(m.claim);
                division.keys.push(k);
            }
        }
        division
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
            let division = self.division(budget);
            let who = division.position(key).unwrap_or(0);
            let tenancy = division.tenancy(budget.guaranteed);
            let room = budget::room_in(&budget.limits, &division.claims, tenancy, who);
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
                bounds: None,
            };
            let room = budget::room_in(&limits, &claims, tenancy, who);
            if best.1.is_none() || room.executors < best.0 {
                let name = format!("quota/{}/{}", member.namespace, quota.name);
                best = (room.executors, Some(held_by(&name, &room)));
            }
        }
        best
    }

    /// What `key` holds beyond its guaranteed part: the most over its budgets.
    fn borrowed(&self, key: &MemberKey) -> u64 {
        let Some(member) = self.members.get(key) else {
            return 0;
        };
        let mut most = 0;
        for budget in &self.policy.budgets {
            if self.matches(budget, member) {
                let division = self.division(budget);
                let lent = budget::borrowed(&division.claims, division.tenancy(true));
                if let Some(at) = division.position(key) {
                    most = most.max(lent[at]);
                }
            }
        }
        most
    }

    /// What `key` is asked to give back now (the largest ask over the budgets it falls
    /// under that reclaim), and the owners waiting for it, from `now`.
    fn reclaim(&mut self, key: &MemberKey, now: Timestamp) -> Option<ReclaimAsk> {
        let member = self.members.get(key)?;
        let mut best: Option<ReclaimAsk> = None;
        let mut owed: Vec<MemberKey> = Vec::new();
        for budget in &self.policy.budgets {
            let Some(deadline_ms) = budget.reclaim_deadline_ms else {
                continue;
            };
            if !self.matches(budget, member) {
                continue;
            }
            let division = self.division(budget);
            let reclaims = budget::reclaims(
                budget.limits.max_executors,
                &division.claims,
                division.tenancy(true),
            );
            let Some(at) = division.position(key) else {
                continue;
            };
            let count = reclaims.asked[at];
            if count > 0 {
                owed.extend(
                    (division.keys.iter().zip(&reclaims.owners))
                        .filter(|(_, owner)| **owner)
                        .map(|(k, _)| (*k).clone()),
                );
                if best.as_ref().is_none_or(|b| count > b.count) {
                    best = Some(ReclaimAsk {
                        count,
                        budget: budget.name.clone(),
                        deadline_ms,
                    });
                }
            }
        }
        for owner in owed {
            if let Some(m) = self.members.get_mut(&owner) {
                m.owed_since.get_or_insert(now);
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
                borrowed: 0,
                owed_since: None,
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
        claim.reclaiming = member.claim.reclaiming;
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

    /// What the round asked for (its `claim` after its `created` creates, at `now`) and
    /// how many executors it held back, by what. An application waiting for executors
    /// asked back for it is waiting no more once it creates (the wait is measured) or is
    /// held no more.
    pub fn report(
        &self,
        mut claim: BudgetClaim,
        held: u64,
        held_by: Option<&HeldBy>,
        created: u64,
        now: Timestamp,
    ) {
        let mut ledger = self.budgets.ledger();
        let Some(member) = ledger.members.get_mut(&self.key) else {
            return;
        };
        claim.weight = member.claim.weight;
        claim.reclaiming = member.claim.reclaiming;
        member.claim = claim;
        member.held = held;
        member.held_by = held_by.filter(|_| held > 0).map(|h| h.budget.clone());
        if let Some(since) = member.owed_since {
            if created > 0 {
                let waited = now.millis_since(since).max(0);
                (self.budgets.inner.metrics)
                    .reclaim_admitted(std::time::Duration::from_millis(waited.unsigned_abs()));
            }
            if created > 0 || held == 0 {
                member.owed_since = None;
            }
        }
        let borrowed = ledger.borrowed(&self.key);
        if let Some(member) = ledger.members.get_mut(&self.key) {
            member.borrowed = borrowed;
        }
        if let Some(member) = ledger.members.get(&self.key) {
            self.budgets.export_of(&ledger, member);
        }
    }

    /// What the application is asked to give back now for an owner below its guaranteed
    /// part, given the executors it is giving back already (`reclaiming`, still counted in
    /// its use); `None` when nothing.
    pub fn reclaim(&self, reclaiming: u64, now: Timestamp) -> Option<ReclaimAsk> {
        let mut ledger = self.budgets.ledger();
        let member = ledger.members.get_mut(&self.key)?;
        member.claim.reclaiming = reclaiming;
        ledger.reclaim(&self.key, now)
    }

    /// The application is giving back `count` executors it still counts in its use: the
    /// others' reclaims leave them to it.
    pub fn giving_back(&self, count: u64) {
        let mut ledger = self.budgets.ledger();
        if let Some(member) = ledger.members.get_mut(&self.key) {
            member.claim.reclaiming = count;
        }
    }

    /// Executors the application holds beyond its guaranteed part, as of its last round.
    pub fn borrowed(&self) -> u64 {
        let ledger = self.budgets.ledger();
        ledger.members.get(&self.key).map_or(0, |m| m.borrowed)
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
mod tests;
