//! Budgets shared by applications: the pure arithmetic of fair division.
//!
//! A budget caps what the applications under it (a namespace's, or a queue's) may have at
//! once: executors, and optionally pending executors, CPU and memory requests. When their
//! demand adds up to more, the budget is divided in two levels ([`tenant_shares`]): among
//! its tenants (namespaces) by the operator's weights, then each tenant's part among its
//! applications by theirs, each level a weighted max-min fair division ([`fair_shares`]).
//! So a tenant's applications divide the tenant's share: more applications, or heavier
//! ones, never get a tenant more. [`room_in`] says how many more executors one
//! application may ask for now: up to its share, and never beyond what the budget has
//! free. A tenant may have a guaranteed part and a maximum ([`TenantBounds`]): guarantees
//! are met first ([`guaranteed_shares`]), and what an application holds beyond its part of
//! its tenant's guarantee is borrowed ([`borrowed`]). Admission never takes back; a
//! budget that reclaims asks borrowers to give back what an owner below its part lacks
//! ([`reclaims`]), which the application's actor carries out.
//!
//! Everything here is a function of the numbers given: the owner of a budget's
//! accounting (`app::budgets`) keeps each application's last claim and asks this module.
use k8s_openapi::api::core::v1::{Container, Pod};

use super::claims::quantity_bytes;

/// What a budget allows at once over its applications (units: executors, millicores,
/// bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetLimits {
    pub max_executors: u64,
    pub max_pending: Option<u64>,
    pub max_cpu_millis: Option<u64>,
    pub max_memory_bytes: Option<u64>,
}

/// What one executor of an application costs a budget: the CPU and memory requests of its
/// pod, as the API server's quota counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExecutorCost {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl ExecutorCost {
    /// The larger of each (an application with profiles of several shapes is counted at
    /// its largest, so it never goes over).
    pub fn max(self, other: Self) -> Self {
        Self {
            cpu_millis: self.cpu_millis.max(other.cpu_millis),
            memory_bytes: self.memory_bytes.max(other.memory_bytes),
        }
    }
}

/// The requests of one pod, as the quota counts them: the sum over its containers, or the
/// largest init container's if larger, plus the pod's overhead. A container that sets a
/// limit and no request requests its limit (the API server defaults it so).
pub fn executor_cost(pod: &Pod) -> ExecutorCost {
    let Some(spec) = &pod.spec else {
        return ExecutorCost::default();
    };
    let sum = spec
        .containers
        .iter()
        .fold(ExecutorCost::default(), |acc, c| {
            let one = container_requests(c);
            ExecutorCost {
                cpu_millis: acc.cpu_millis.saturating_add(one.cpu_millis),
                memory_bytes: acc.memory_bytes.saturating_add(one.memory_bytes),
            }
        });
    let init = (spec.init_containers.iter().flatten())
        .map(container_requests)
        .fold(ExecutorCost::default(), ExecutorCost::max);
    let mut cost = sum.max(init);
    if let Some(overhead) = &spec.overhead {
        cost.cpu_millis = cost
            .cpu_millis
            .saturating_add(overhead.get("cpu").map_or(0, |q| cpu_millis(&q.0)));
        cost.memory_bytes = cost
            .memory_bytes
            .saturating_add(overhead.get("memory").map_or(0, |q| memory_bytes(&q.0)));
    }
    cost
}

fn container_requests(container: &Container) -> ExecutorCost {
    let Some(resources) = &container.resources else {
        return ExecutorCost::default();
    };
    let get = |name: &str| {
        resources
            .requests
            .as_ref()
            .and_then(|r| r.get(name))
            .or_else(|| resources.limits.as_ref().and_then(|l| l.get(name)))
    };
    ExecutorCost {
        cpu_millis: get("cpu").map_or(0, |q| cpu_millis(&q.0)),
        memory_bytes: get("memory").map_or(0, |q| memory_bytes(&q.0)),
    }
}

/// A CPU quantity (`2`, `500m`, `1.5`) in millicores, rounded up; 0 when it does not parse.
pub fn cpu_millis(text: &str) -> u64 {
    parse_cpu_millis(text).unwrap_or(0)
}

/// A CPU quantity in millicores, rounded up; `None` when it does not parse or fit.
pub fn parse_cpu_millis(text: &str) -> Option<u64> {
    let text = text.trim();
    let millis = match text.strip_suffix('m') {
        Some(m) => quantity_bytes(m)?,
        // `quantity_bytes` rounds up a fraction of a unit; scale first.
        None => quantity_bytes(&format!("{text}e3")).or_else(|| {
            let units = quantity_bytes(text)?;
            units.checked_mul(1000)
        })?,
    };
    u64::try_from(millis).ok()
}

/// A memory quantity (`4Gi`, `512M`) in bytes; 0 when it does not parse.
pub fn memory_bytes(text: &str) -> u64 {
    quantity_bytes(text)
        .and_then(|b| u64::try_from(b).ok())
        .unwrap_or(0)
}

/// Weighted max-min fair division of `capacity` units among demands `(weight, demand)`
/// (weights ≥ 1), in the order given. Water-filling: an application asking no more than
/// its weighted part of what is left gets all it asks, and what it leaves is divided
/// again among the others; once every remaining one asks more, each gets
/// `floor(left × weight / Σ weights)`, and the units those floors leave over (fewer than
/// the applications) go one each to the largest fractional parts, ties to the earlier in
/// the order given (the ledger orders by namespace, then application id, so the same
/// application gets the extra unit every round). So 30 over three equal demands of 30 is
/// 10/10/10; over weights 2:1:1 it is 15/8/7. A share never exceeds its demand, and the
/// shares add up to `min(capacity, Σ demands)`.
pub fn fair_shares(capacity: u64, claims: &[(u32, u64)]) -> Vec<u64> {
    let mut shares = vec![0u64; claims.len()];
    let mut open: Vec<usize> = (0..claims.len()).filter(|i| claims[*i].1 > 0).collect();
    let mut left = capacity;
    loop {
        if open.is_empty() || left == 0 {
            return shares;
        }
        let weights: u128 = open.iter().map(|i| u128::from(claims[*i].0.max(1))).sum();
        // Those asking no more than their part of what is left get all they ask.
        let (satisfied, rest): (Vec<usize>, Vec<usize>) = open.iter().partition(|i| {
            let (weight, demand) = claims[**i];
            u128::from(demand) * weights <= u128::from(left) * u128::from(weight.max(1))
        });
        if satisfied.is_empty() {
            break;
        }
        for i in satisfied {
            shares[i] = claims[i].1;
            left -= claims[i].1;
        }
        open = rest;
    }
    let weights: u128 = open.iter().map(|i| u128::from(claims[*i].0.max(1))).sum();
    let mut fractions = Vec::with_capacity(open.len());
    let mut given = 0u64;
    for (position, i) in open.iter().enumerate() {
        let part = u128::from(left) * u128::from(claims[*i].0.max(1));
        let whole = u64::try_from(part / weights).unwrap_or(u64::MAX);
        shares[*i] = whole;
        given += whole;
        fractions.push((part % weights, position, *i));
    }
    fractions.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, _, i) in fractions
        .into_iter()
        .take(usize::try_from(left - given).unwrap_or(0))
    {
        shares[i] += 1;
    }
    shares
}

/// Who the applications of a budget belong to: claim `i` is tenant `of[i]`'s, and tenant
/// `t` weighs `weights[t]` (≥ 1) against the others and, when `bounds` are given, has
/// `bounds[t]` of the budget's executors.
#[derive(Debug, Clone, Copy)]
pub struct Tenancy<'a> {
    pub weights: &'a [u32],
    pub of: &'a [usize],
    pub bounds: Option<&'a [TenantBounds]>,
}

/// A tenant's guaranteed part of a budget's executors and its maximum (borrowing
/// included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantBounds {
    pub guaranteed: u64,
    pub max: u64,
}

/// The tenants' parts of `capacity` when each has `bounds`: each first gets
/// `min(demand, guaranteed)`; what is left is divided by weight ([`fair_shares`]) among
/// those asking more, each up to its maximum. Guarantees adding up to more than the
/// capacity (never so once configured, see the budgets' check) are divided as demands.
pub fn guaranteed_shares(
    capacity: u64,
    demands: &[(u32, u64)],
    bounds: &[TenantBounds],
) -> Vec<u64> {
    let bound = |t: usize| {
        bounds.get(t).copied().unwrap_or(TenantBounds {
            guaranteed: 0,
            max: u64::MAX,
        })
    };
    let mut parts: Vec<u64> = (demands.iter().enumerate())
        .map(|(t, (_, demand))| (*demand).min(bound(t).guaranteed).min(bound(t).max))
        .collect();
    let given = parts.iter().fold(0u64, |a, p| a.saturating_add(*p));
    if given > capacity {
        let asked: Vec<(u32, u64)> = (demands.iter().zip(&parts))
            .map(|((w, _), p)| (*w, *p))
            .collect();
        return fair_shares(capacity, &asked);
    }
    let more: Vec<(u32, u64)> = (demands.iter().enumerate())
        .map(|(t, (w, demand))| (*w, (*demand).min(bound(t).max).saturating_sub(parts[t])))
        .collect();
    for (part, extra) in parts.iter_mut().zip(fair_shares(capacity - given, &more)) {
        *part += extra;
    }
    parts
}

/// Each application's guaranteed part of its tenant's guarantee: the tenant's guarantee
/// divided among its applications as [`fair_shares`] divides (by weight, none beyond its
/// demand). 0 for every application without `tenancy.bounds`.
pub fn guaranteed_parts(claims: &[(u32, u64)], tenancy: Tenancy<'_>) -> Vec<u64> {
    let mut parts = vec![0u64; claims.len()];
    let Some(bounds) = tenancy.bounds else {
        return parts;
    };
    let tenant = |i: usize| tenancy.of.get(i).copied().unwrap_or(usize::MAX);
    for (t, bound) in bounds.iter().enumerate() {
        let members: Vec<usize> = (0..claims.len()).filter(|i| tenant(*i) == t).collect();
        let theirs: Vec<(u32, u64)> = members.iter().map(|i| claims[*i]).collect();
        for (i, part) in members
            .into_iter()
            .zip(fair_shares(bound.guaranteed, &theirs))
        {
            parts[i] = part;
        }
    }
    parts
}

/// What a budget's applications hold beyond their guaranteed parts
/// ([`guaranteed_parts`]): executors borrowed, which an owner below its own part may ask
/// back.
pub fn borrowed(claims: &[BudgetClaim], tenancy: Tenancy<'_>) -> Vec<u64> {
    let demands: Vec<(u32, u64)> = claims.iter().map(|c| (c.weight, c.demand())).collect();
    (guaranteed_parts(&demands, tenancy).into_iter().zip(claims))
        .map(|(part, c)| c.using.saturating_sub(part))
        .collect()
}

/// What each application of a budget of `capacity` executors is to give back now, and
/// whose wait it is for. An application below its guaranteed part with its demand unmet
/// (an owner) lacks `min(demand, part) − use`; what the budget has free and what is
/// being given back already (`reclaiming`) count toward that; the rest is asked of the
/// applications holding more than their parts (borrowers), never beyond what each
/// borrows and not yet gives back, the largest borrowings first (levelled: each gives
/// until it borrows no more than the next; ties to the earlier in the order given).
pub fn reclaims(capacity: u64, claims: &[BudgetClaim], tenancy: Tenancy<'_>) -> Reclaims {
    let demands: Vec<(u32, u64)> = claims.iter().map(|c| (c.weight, c.demand())).collect();
    let parts = guaranteed_parts(&demands, tenancy);
    let lacking: Vec<u64> = (claims.iter().zip(&parts))
        .map(|(c, part)| c.demand().min(*part).saturating_sub(c.using))
        .collect();
    let sum = |it: &mut dyn Iterator<Item = u64>| it.fold(0u64, u64::saturating_add);
    let lack = sum(&mut lacking.iter().copied());
    let used = sum(&mut claims.iter().map(|c| c.using));
    let given_back = sum(&mut claims.iter().map(|c| c.reclaiming));
    let needed = lack
        .saturating_sub(capacity.saturating_sub(used))
        .saturating_sub(given_back);
    let lendable: Vec<u64> = (claims.iter().zip(&parts))
        .map(|(c, part)| c.using.saturating_sub(c.reclaiming).saturating_sub(*part))
        .collect();
    let asked = level_down(&lendable, needed);
    let owners = if asked.iter().any(|a| *a > 0) {
        lacking.iter().map(|l| *l > 0).collect()
    } else {
        vec![false; claims.len()]
    };
    Reclaims { asked, owners }
}

/// What [`reclaims`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reclaims {
    /// Executors each application is to give back now (beyond those it gives back).
    pub asked: Vec<u64>,
    /// The applications whose guaranteed part is being asked back for.
    pub owners: Vec<bool>,
}

/// Takes `needed` units (at most their sum) from `amounts`, the largest first: the
/// largest are brought down to a common level; the units that level leaves go one each to
/// the earlier of those at it.
fn level_down(amounts: &[u64], needed: u64) -> Vec<u64> {
    let total = amounts.iter().fold(0u64, |a, b| a.saturating_add(*b));
    let needed = needed.min(total);
    let mut taken = vec![0u64; amounts.len()];
    if needed == 0 {
        return taken;
    }
    let above = |level: u64| -> u64 {
        (amounts.iter())
            .map(|a| a.saturating_sub(level))
            .fold(0u64, u64::saturating_add)
    };
    // The lowest level taking no more than `needed`.
    let (mut low, mut high) = (0u64, amounts.iter().copied().max().unwrap_or(0));
    while low < high {
        let mid = low + (high - low) / 2;
        if above(mid) <= needed {
            high = mid;
        } else {
            low = mid + 1;
        }
    }
    let level = low;
    let mut left = needed - above(level);
    for (take, amount) in taken.iter_mut().zip(amounts) {
        *take = amount.saturating_sub(level);
        if left > 0 && level > 0 && *amount >= level {
            *take += 1;
            left -= 1;
        }
    }
    taken
}

/// Two-level weighted max-min fair division of `capacity` over `claims` (`(weight,
/// demand)`, as [`fair_shares`]) grouped by `tenancy`: the tenants divide `capacity` by
/// their weights, each asking what its applications ask in all; then each tenant's part is
/// divided among its applications by theirs. A tenant's shares add up to its part whatever
/// the number or weights of its applications. Ties go to the earlier tenant, then the
/// earlier application, in the order given.
pub fn tenant_shares(capacity: u64, claims: &[(u32, u64)], tenancy: Tenancy<'_>) -> Vec<u64> {
    let tenant = |i: usize| tenancy.of.get(i).copied().unwrap_or(usize::MAX);
    let mut demands: Vec<(u32, u64)> = (tenancy.weights.iter())
        .map(|w| ((*w).max(1), 0u64))
        .collect();
    for (i, (_, demand)) in claims.iter().enumerate() {
        if let Some(t) = demands.get_mut(tenant(i)) {
            t.1 = t.1.saturating_add(*demand);
        }
    }
    let parts = match tenancy.bounds {
        Some(bounds) => guaranteed_shares(capacity, &demands, bounds),
        None => fair_shares(capacity, &demands),
    };
    let mut shares = vec![0u64; claims.len()];
    for (t, part) in parts.into_iter().enumerate() {
        let members: Vec<usize> = (0..claims.len()).filter(|i| tenant(*i) == t).collect();
        let theirs: Vec<(u32, u64)> = members.iter().map(|i| claims[*i]).collect();
        for (i, share) in members.into_iter().zip(fair_shares(part, &theirs)) {
            shares[i] = share;
        }
    }
    shares
}

/// A namespace's ResourceQuota as its status shows it, for the resources a budget counts
/// (`pods`; `requests.cpu` or `cpu` in millicores; `requests.memory` or `memory` in
/// bytes); `None` where the quota does not limit it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct QuotaState {
    pub name: String,
    pub hard_pods: Option<u64>,
    pub hard_cpu_millis: Option<u64>,
    pub hard_memory_bytes: Option<u64>,
    pub used_pods: u64,
    pub used_cpu_millis: u64,
    pub used_memory_bytes: u64,
}

impl QuotaState {
    /// The quota of `status` (`hard`, `used`: resource name → quantity text); `None` when
    /// it limits none of the resources counted here (or its status is not known yet).
    pub fn of<'a>(
        name: &str,
        hard: impl Iterator<Item = (&'a str, &'a str)>,
        used: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Option<Self> {
        let mut quota = Self {
            name: name.to_string(),
            ..Self::default()
        };
        for (key, value) in hard {
            match key {
                "pods" => quota.hard_pods = Some(memory_bytes(value)),
                "requests.cpu" | "cpu" => quota.hard_cpu_millis = parse_cpu_millis(value),
                "requests.memory" | "memory" => quota.hard_memory_bytes = Some(memory_bytes(value)),
                _ => {}
            }
        }
        for (key, value) in used {
            match key {
                "pods" => quota.used_pods = memory_bytes(value),
                "requests.cpu" | "cpu" => quota.used_cpu_millis = cpu_millis(value),
                "requests.memory" | "memory" => quota.used_memory_bytes = memory_bytes(value),
                _ => {}
            }
        }
        (quota.hard_pods.is_some()
            || quota.hard_cpu_millis.is_some()
            || quota.hard_memory_bytes.is_some())
        .then_some(quota)
    }

    /// The quota as a budget over the service's applications of its namespace, whose
    /// `claims` are those: what the quota leaves them is its hard limit less what others
    /// use (its `used` less the applications' executors already seen, which it counts;
    /// executors asked for and not yet seen count as others too until they are seen, so
    /// the estimate errs on the side of creating less).
    pub fn as_limits(&self, claims: &[BudgetClaim]) -> BudgetLimits {
        let seen: u64 = claims.iter().map(|c| c.seen).sum();
        let seen_cpu: u64 = (claims.iter())
            .map(|c| c.seen.saturating_mul(c.cost.cpu_millis))
            .sum();
        let seen_memory: u64 = (claims.iter())
            .map(|c| c.seen.saturating_mul(c.cost.memory_bytes))
            .sum();
        let left = |hard: u64, used: u64, ours: u64| hard.saturating_sub(used.saturating_sub(ours));
        BudgetLimits {
            max_executors: self
                .hard_pods
                .map_or(u64::MAX, |hard| left(hard, self.used_pods, seen)),
            max_pending: None,
            max_cpu_millis: self
                .hard_cpu_millis
                .map(|hard| left(hard, self.used_cpu_millis, seen_cpu)),
            max_memory_bytes: self
                .hard_memory_bytes
                .map(|hard| left(hard, self.used_memory_bytes, seen_memory)),
        }
    }
}

/// One application's claim on a budget, in executors (a round's counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BudgetClaim {
    /// Its weight (≥ 1).
    pub weight: u32,
    /// Executors it wants: per profile the larger of its target and what it has.
    pub wanted: u64,
    /// Executors it has or asked for (running, pending, requested and not seen).
    pub using: u64,
    /// Of those, not running (pending, requested and not seen).
    pub pending: u64,
    /// Of `using`, those whose pods have been seen (a ResourceQuota counts them).
    pub seen: u64,
    /// What one of its executors costs.
    pub cost: ExecutorCost,
    /// Of `using`, executors asked back (reclaim) whose pods are still there.
    pub reclaiming: u64,
}

impl BudgetClaim {
    /// Its demand on the budget: what it wants, or has if more.
    pub fn demand(&self) -> u64 {
        self.wanted.max(self.using)
    }

    /// What its targets still lack.
    pub fn lacking(&self) -> u64 {
        self.wanted.saturating_sub(self.using)
    }
}

/// A resource of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum BudgetResource {
    Executors,
    Pending,
    Cpu,
    Memory,
}

impl BudgetResource {
    /// Its name in the configuration's and GetStatus's words.
    pub fn name(self) -> &'static str {
        match self {
            Self::Executors => "executors",
            Self::Pending => "pending",
            Self::Cpu => "cpu",
            Self::Memory => "memory",
        }
    }
}

/// How many more executors one application may ask for under one budget, and which of the
/// budget's resources bounds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Room {
    /// More executors it may ask for now.
    pub executors: u64,
    /// The resource that bounds it most (in that resource's unit: executors, millicores,
    /// bytes), with the budget's use, limit and the application's share of it.
    pub bound: Bound,
}

/// The resource of a budget that bounds an application's room, in its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub resource: BudgetResource,
    /// What the budget's applications use of it now.
    pub used: u64,
    pub limit: u64,
    /// The application's fair share of it.
    pub share: u64,
}

/// [`room_in`] with each application a tenant of its own, weighing its own weight.
pub fn room(limits: &BudgetLimits, claims: &[BudgetClaim], who: usize) -> Room {
    let weights: Vec<u32> = claims.iter().map(|c| c.weight).collect();
    let of: Vec<usize> = (0..claims.len()).collect();
    room_in(
        limits,
        claims,
        Tenancy {
            weights: &weights,
            of: &of,
            bounds: None,
        },
        who,
    )
}

/// The room of `claims[who]` under `limits`, with every application of the budget's claim
/// in `claims`, grouped by `tenancy` (the order decides ties, see [`tenant_shares`]). Per
/// resource: its fair share of the limit, bounded by what it uses plus what the budget has
/// free (what the others use is never taken back), in executors at its own cost; the room
/// is the smallest.
pub fn room_in(
    limits: &BudgetLimits,
    claims: &[BudgetClaim],
    tenancy: Tenancy<'_>,
    who: usize,
) -> Room {
    let mut best: Option<Room> = None;
    // Guarantees and maximums are in executors: they bound that resource only.
    let plain = Tenancy {
        bounds: None,
        ..tenancy
    };
    let mut consider =
        |resource: BudgetResource, limit: u64, per: fn(&BudgetClaim) -> (u64, u64), unit: u64| {
            let tenancy = if resource == BudgetResource::Executors {
                tenancy
            } else {
                plain
            };
            // (demand, use) of each claim in the resource's unit.
            let amounts: Vec<(u64, u64)> = claims.iter().map(per).collect();
            let demands: Vec<(u32, u64)> = claims
                .iter()
                .zip(&amounts)
                .map(|(c, (demand, _))| (c.weight, *demand))
                .collect();
            let share = tenant_shares(limit, &demands, tenancy)[who];
            let used: u64 = amounts.iter().map(|(_, u)| *u).fold(0, u64::saturating_add);
            let free = limit.saturating_sub(used);
            let mine = amounts[who].1;
            let grant = share.min(mine.saturating_add(free));
            // A resource the application's executors do not ask for never bounds it.
            let executors = grant
                .saturating_sub(mine)
                .checked_div(unit)
                .unwrap_or(u64::MAX);
            if best.is_none_or(|b| executors < b.executors) {
                best = Some(Room {
                    executors,
                    bound: Bound {
                        resource,
                        used,
                        limit,
                        share,
                    },
                });
            }
        };
    consider(
        BudgetResource::Executors,
        limits.max_executors,
        |c| (c.wanted.max(c.using), c.using),
        1,
    );
    if let Some(limit) = limits.max_pending {
        consider(
            BudgetResource::Pending,
            limit,
            |c| (c.pending.saturating_add(c.lacking()), c.pending),
            1,
        );
    }
    let cost = claims[who].cost;
    if let Some(limit) = limits.max_cpu_millis {
        consider(
            BudgetResource::Cpu,
            limit,
            |c| {
                let each = c.cost.cpu_millis;
                (
                    c.wanted.max(c.using).saturating_mul(each),
                    c.using.saturating_mul(each),
                )
            },
            cost.cpu_millis,
        );
    }
    if let Some(limit) = limits.max_memory_bytes {
        consider(
            BudgetResource::Memory,
            limit,
            |c| {
                let each = c.cost.memory_bytes;
                (
                    c.wanted.max(c.using).saturating_mul(each),
                    c.using.saturating_mul(each),
                )
            },
            cost.memory_bytes,
        );
    }
    // `consider` ran at least once (executors).
    best.unwrap_or(Room {
        executors: 0,
        bound: Bound {
            resource: BudgetResource::Executors,
            used: 0,
            limit: limits.max_executors,
            share: 0,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_demands_over_capacity_share_it_equally() {
        assert_eq!(fair_shares(30, &[(1, 30), (1, 30), (1, 30)]), [10, 10, 10]);
        assert_eq!(fair_shares(30, &[(1, 30), (1, 30)]), [15, 15]);
        assert_eq!(fair_shares(31, &[(1, 30), (1, 30), (1, 30)]), [11, 10, 10]);
    }

    #[test]
    fn weights_divide_in_proportion_and_the_extra_unit_goes_to_the_first_of_a_tie() {
        assert_eq!(fair_shares(30, &[(2, 30), (1, 30), (1, 30)]), [15, 8, 7]);
        assert_eq!(fair_shares(30, &[(1, 30), (1, 30), (2, 30)]), [8, 7, 15]);
        // The largest fraction first: 10 × 3/7 = 4.29, 10 × 4/7 = 5.71.
        assert_eq!(fair_shares(10, &[(3, 10), (4, 10)]), [4, 6]);
    }

    #[test]
    fn a_small_demand_is_met_and_what_it_leaves_goes_to_the_others() {
        assert_eq!(fair_shares(30, &[(1, 4), (1, 30), (1, 30)]), [4, 13, 13]);
        assert_eq!(fair_shares(30, &[(1, 4), (1, 12), (1, 30)]), [4, 12, 14]);
        assert_eq!(fair_shares(30, &[(1, 0), (1, 30)]), [0, 30]);
        assert_eq!(fair_shares(100, &[(1, 10), (5, 20)]), [10, 20]);
        assert_eq!(fair_shares(0, &[(1, 10)]), [0]);
    }

    #[test]
    fn shares_add_up_and_never_exceed_demands() {
        let cases: &[(u64, &[(u32, u64)])] = &[
            (17, &[(1, 5), (3, 9), (2, 40), (1, 1)]),
            (1000, &[(7, 999), (1, 3), (100, 2000)]),
            (5, &[(1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1)]),
        ];
        for (capacity, claims) in cases {
            let shares = fair_shares(*capacity, claims);
            let total: u64 = claims.iter().map(|c| c.1).sum();
            assert_eq!(
                shares.iter().sum::<u64>(),
                (*capacity).min(total),
                "{claims:?}"
            );
            for (share, (_, demand)) in shares.iter().zip(claims.iter()) {
                assert!(share <= demand, "{shares:?} {claims:?}");
            }
        }
    }

    fn tenancy<'a>(weights: &'a [u32], of: &'a [usize]) -> Tenancy<'a> {
        Tenancy {
            weights,
            of,
            bounds: None,
        }
    }

    #[test]
    fn a_tenant_with_five_applications_gets_no_more_than_one_with_one() {
        let five_and_one = [(1, 12); 6];
        let shares = tenant_shares(12, &five_and_one, tenancy(&[1, 1], &[0, 0, 0, 0, 0, 1]));
        assert_eq!(shares, [2, 1, 1, 1, 1, 6]);
        // Per application, as without tenants, the five would take 10 of 12.
        assert_eq!(fair_shares(12, &five_and_one)[5], 2);
    }

    #[test]
    fn tenant_weights_divide_the_budget_and_application_weights_the_tenant_part() {
        let both = [(1, 12), (1, 12)];
        assert_eq!(tenant_shares(12, &both, tenancy(&[3, 1], &[0, 1])), [9, 3]);
        // An application's weight, however large, stays within its tenant's part.
        let heavy = [(u32::MAX, 12), (1, 12)];
        assert_eq!(tenant_shares(12, &heavy, tenancy(&[1, 1], &[0, 1])), [6, 6]);
        // Within a tenant, application weights 2:1 divide its 9.
        let three = [(2, 12), (1, 12), (1, 12)];
        assert_eq!(
            tenant_shares(12, &three, tenancy(&[3, 1], &[0, 0, 1])),
            [6, 3, 3]
        );
        // What a tenant does not ask for goes to the others.
        let small = [(1, 2), (1, 12), (1, 12)];
        assert_eq!(
            tenant_shares(12, &small, tenancy(&[1, 1], &[0, 1, 1])),
            [2, 5, 5]
        );
    }

    #[test]
    fn the_room_of_an_application_is_bounded_by_its_tenant_part() {
        let claims = [claim(12, 0), claim(12, 0), claim(12, 0)];
        let tenants = tenancy(&[1, 1], &[0, 0, 1]);
        assert_eq!(room_in(&limits(12), &claims, tenants, 0).executors, 3);
        assert_eq!(room_in(&limits(12), &claims, tenants, 2).executors, 6);
        let bound = room_in(&limits(12), &claims, tenants, 2).bound;
        assert_eq!(bound.share, 6);
    }

    proptest::proptest! {
        /// Whatever the applications, a tenant's shares add up to what it would get were
        /// all its demand one application of weight 1; the total is what the budget can
        /// give; no share exceeds its demand.
        #[test]
        fn more_or_heavier_applications_never_get_a_tenant_more(
            capacity in 0u64..200,
            claims in proptest::collection::vec((0usize..3, 1u32..1000, 0u64..60), 1..12),
            weights in proptest::collection::vec(1u32..5, 3),
        ) {
            let of: Vec<usize> = claims.iter().map(|c| c.0).collect();
            let flat: Vec<(u32, u64)> = claims.iter().map(|c| (c.1, c.2)).collect();
            let shares = tenant_shares(capacity, &flat, tenancy(&weights, &of));
            let total: u64 = flat.iter().map(|c| c.1).sum();
            proptest::prop_assert_eq!(shares.iter().sum::<u64>(), capacity.min(total));
            for (share, (_, demand)) in shares.iter().zip(&flat) {
                proptest::prop_assert!(share <= demand);
            }
            let mut merged = vec![(0u32, 0u64); 3];
            for (t, merged) in merged.iter_mut().enumerate() {
                let demand = (flat.iter().zip(&of))
                    .filter(|(_, o)| **o == t)
                    .map(|(c, _)| c.1)
                    .sum();
                *merged = (1, demand);
            }
            let alone = tenant_shares(capacity, &merged, tenancy(&weights, &[0, 1, 2]));
            for (t, alone) in alone.iter().enumerate() {
                let got: u64 = (shares.iter().zip(&of))
                    .filter(|(_, o)| **o == t)
                    .map(|(s, _)| s)
                    .sum();
                proptest::prop_assert_eq!(got, *alone, "tenant {}", t);
            }
        }
    }

    fn claim(wanted: u64, using: u64) -> BudgetClaim {
        BudgetClaim {
            weight: 1,
            wanted,
            using,
            pending: 0,
            seen: using,
            cost: ExecutorCost::default(),
            reclaiming: 0,
        }
    }

    fn limits(max_executors: u64) -> BudgetLimits {
        BudgetLimits {
            max_executors,
            ..BudgetLimits::default()
        }
    }

    #[test]
    fn room_is_the_share_less_the_use_bounded_by_what_is_free() {
        let claims = [claim(30, 0), claim(30, 0), claim(30, 0)];
        assert_eq!(room(&limits(30), &claims, 0).executors, 10);
        // One took 25 before the others asked: it keeps them (no preemption), and the
        // others get only what is free.
        let claims = [claim(30, 25), claim(30, 0), claim(30, 0)];
        assert_eq!(room(&limits(30), &claims, 0).executors, 0);
        assert_eq!(room(&limits(30), &claims, 1).executors, 5);
        let bound = room(&limits(30), &claims, 1).bound;
        assert_eq!(
            (bound.resource, bound.used, bound.limit, bound.share),
            (BudgetResource::Executors, 25, 30, 10)
        );
    }

    #[test]
    fn one_application_ending_lets_the_others_reach_the_new_share() {
        let claims = [claim(30, 10), claim(30, 10)];
        assert_eq!(room(&limits(30), &claims, 0).executors, 5);
        assert_eq!(room(&limits(30), &claims, 1).executors, 5);
    }

    #[test]
    fn pending_cpu_and_memory_bound_the_room_at_the_application_cost() {
        let cost = ExecutorCost {
            cpu_millis: 2000,
            memory_bytes: 4 << 30,
        };
        let mut a = claim(30, 0);
        a.cost = cost;
        let mut b = a;
        b.using = 4;
        b.pending = 4;
        let budget = BudgetLimits {
            max_executors: 100,
            max_pending: Some(10),
            max_cpu_millis: Some(40_000),
            max_memory_bytes: Some(64 << 30),
        };
        // Pending: shares of 10 over demands 30 and 30 (4 + 26) are 5/5; b has 4 → 1.
        let r = room(&budget, &[a, b], 1);
        assert_eq!(r.executors, 1);
        assert_eq!(r.bound.resource, BudgetResource::Pending);
        // Memory: 64 GiB is 16 executors of 4 GiB, 8 each; a has none, and 16 − 4 are free.
        let budget = BudgetLimits {
            max_pending: None,
            ..budget
        };
        let r = room(&budget, &[a, b], 0);
        assert_eq!((r.executors, r.bound.resource), (8, BudgetResource::Memory));
        assert_eq!(r.bound.share, 32 << 30);
    }

    #[test]
    fn a_quota_leaves_its_hard_limit_less_what_others_use() {
        let quota = QuotaState::of(
            "compute",
            [("pods", "20"), ("requests.cpu", "10"), ("services", "5")].into_iter(),
            [("pods", "14"), ("requests.cpu", "3500m")].into_iter(),
        )
        .unwrap();
        assert_eq!(
            (
                quota.hard_pods,
                quota.hard_cpu_millis,
                quota.hard_memory_bytes
            ),
            (Some(20), Some(10_000), None)
        );
        // 10 of the 14 pods are the applications' (seen); 4 are others'.
        let mut a = claim(20, 6);
        a.cost.cpu_millis = 250;
        let mut b = claim(20, 4);
        b.cost.cpu_millis = 250;
        let limits = quota.as_limits(&[a, b]);
        assert_eq!(limits.max_executors, 16);
        assert_eq!(limits.max_cpu_millis, Some(10_000 - 1000));
        assert_eq!(room(&limits, &[a, b], 1).executors, 4);
        // A quota limiting nothing counted here is none.
        assert!(QuotaState::of("x", [("services", "5")].into_iter(), std::iter::empty()).is_none());
    }

    #[test]
    fn the_cost_of_a_pod_is_what_the_quota_counts() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "1", "memory": "512Mi"}}}
                ],
                "initContainers": [
                    {"name": "i", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}
                ],
                "overhead": {"cpu": "250m"}
            }
        }))
        .unwrap();
        let cost = executor_cost(&pod);
        assert_eq!(cost.cpu_millis, 4250);
        assert_eq!(cost.memory_bytes, (2 << 30) + (512 << 20));
        assert_eq!(parse_cpu_millis("0.5"), Some(500));
        assert_eq!(parse_cpu_millis("2"), Some(2000));
        assert_eq!(parse_cpu_millis("100m"), Some(100));
        assert_eq!(parse_cpu_millis("x"), None);
    }

    fn bounded<'a>(weights: &'a [u32], of: &'a [usize], bounds: &'a [TenantBounds]) -> Tenancy<'a> {
        Tenancy {
            weights,
            of,
            bounds: Some(bounds),
        }
    }

    fn bounds(guaranteed: u64, max: u64) -> TenantBounds {
        TenantBounds { guaranteed, max }
    }

    #[test]
    fn guarantees_come_first_then_the_rest_by_weight_up_to_each_maximum() {
        let b = [bounds(4, 8), bounds(4, 8)];
        // Guarantees first: an owner asking 4 gets them whoever asked first.
        assert_eq!(guaranteed_shares(8, &[(1, 8), (1, 4)], &b), [4, 4]);
        // What an owner does not ask for is lent, up to the borrower's maximum.
        assert_eq!(guaranteed_shares(8, &[(1, 8), (1, 0)], &b), [8, 0]);
        assert_eq!(guaranteed_shares(8, &[(1, 8), (1, 1)], &b), [7, 1]);
        let capped = [bounds(2, 5), bounds(2, 8)];
        assert_eq!(guaranteed_shares(8, &[(1, 8), (1, 0)], &capped), [5, 0]);
        // Unequal guarantees, the rest by weight 3:1: 2 + 3 and 6 + 1 of 12.
        let unequal = [bounds(2, 12), bounds(6, 12)];
        assert_eq!(guaranteed_shares(12, &[(3, 12), (1, 12)], &unequal), [5, 7]);
        // Through the two levels: the tenant part is divided among its applications.
        let claims = [(1, 8), (1, 8), (1, 8)];
        let shares = tenant_shares(8, &claims, bounded(&[1, 1], &[0, 0, 1], &b));
        assert_eq!(shares, [2, 2, 4]);
    }

    #[test]
    fn an_application_borrows_what_it_holds_beyond_its_part_of_its_tenant_guarantee() {
        let b = [bounds(4, 8), bounds(4, 8)];
        let claims = [claim(8, 8), claim(4, 0)];
        let tenants = bounded(&[1, 1], &[0, 1], &b);
        assert_eq!(borrowed(&claims, tenants), [4, 0]);
        // Two applications of one tenant divide its guarantee: 2 each.
        let claims = [claim(4, 3), claim(4, 1), claim(0, 0)];
        let tenants = bounded(&[1, 1], &[0, 0, 1], &b);
        assert_eq!(borrowed(&claims, tenants), [1, 0, 0]);
        // Without bounds nothing is guaranteed (and nothing is reclaimed).
        let plain = tenancy(&[1, 1], &[0, 1]);
        assert_eq!(borrowed(&[claim(8, 8), claim(4, 0)], plain), [8, 0]);
    }

    #[test]
    fn an_owner_held_below_its_guarantee_asks_back_only_what_is_borrowed_and_lacking() {
        let b = [bounds(4, 8), bounds(4, 8)];
        let tenants = bounded(&[1, 1], &[0, 1], &b);
        // The borrower fills the budget; the owner wants its 4.
        let r = reclaims(8, &[claim(8, 8), claim(4, 0)], tenants);
        assert_eq!(r.asked, [4, 0]);
        assert_eq!(r.owners, [false, true]);
        // Wanting 3 asks back 3; 2 free leave 1 to ask back.
        assert_eq!(
            reclaims(8, &[claim(8, 8), claim(3, 0)], tenants).asked,
            [3, 0]
        );
        assert_eq!(
            reclaims(8, &[claim(8, 6), claim(3, 0)], tenants).asked,
            [1, 0]
        );
        // Wanting more than the guarantee asks back no more than the guarantee.
        assert_eq!(
            reclaims(8, &[claim(8, 8), claim(8, 0)], tenants).asked,
            [4, 0]
        );
        // Those given back already count: asked once, not again.
        let mut giving = claim(8, 8);
        giving.reclaiming = 4;
        assert_eq!(reclaims(8, &[giving, claim(4, 0)], tenants).asked, [0, 0]);
        giving.reclaiming = 3;
        assert_eq!(reclaims(8, &[giving, claim(4, 0)], tenants).asked, [1, 0]);
        // Room free for the owner: nothing is asked back.
        assert_eq!(
            reclaims(12, &[claim(8, 8), claim(4, 0)], tenants).asked,
            [0, 0]
        );
        // Nobody below its guarantee: nothing.
        let r = reclaims(8, &[claim(8, 4), claim(4, 4)], tenants);
        assert_eq!((r.asked, r.owners), (vec![0, 0], vec![false, false]));
    }

    #[test]
    fn never_from_an_application_at_or_below_its_guarantee_the_largest_borrowing_first() {
        let b = [bounds(4, 12), bounds(4, 12), bounds(4, 12)];
        let tenants = bounded(&[1, 1, 1], &[0, 1, 2], &b);
        // Borrowing 5 and 3; the owner lacks 4: 3 from the first (down to 2), 1 from the
        // second (down to 2).
        let r = reclaims(12, &[claim(12, 9), claim(12, 7), claim(4, 0)], tenants);
        assert_eq!(r.asked, [3, 1, 0]);
        // An application within its part (4 of 4) gives nothing.
        let r = reclaims(12, &[claim(12, 8), claim(4, 4), claim(4, 0)], tenants);
        assert_eq!(r.asked, [4, 0, 0]);
        // Within one tenant: an application above its part of the tenant's guarantee
        // gives back to its sibling below its own.
        let one = [bounds(8, 8)];
        let r = reclaims(8, &[claim(8, 8), claim(8, 0)], bounded(&[1], &[0, 0], &one));
        assert_eq!(r.asked, [4, 0]);
    }

    #[test]
    fn levelling_takes_the_largest_first_and_no_more_than_there_is() {
        assert_eq!(level_down(&[5, 3], 3), [3, 0]);
        assert_eq!(level_down(&[5, 3], 4), [3, 1]);
        assert_eq!(level_down(&[4, 4], 3), [2, 1]);
        assert_eq!(level_down(&[1, 2], 10), [1, 2]);
        assert_eq!(level_down(&[], 3), Vec::<u64>::new());
    }

    proptest::proptest! {
        /// Whatever the claims, nobody gives back beyond what it borrows, and no more is
        /// asked back than the owners lack.
        #[test]
        fn reclaims_stay_within_borrowing_and_lack(
            capacity in 1u64..40,
            claims in proptest::collection::vec((0usize..3, 0u64..20, 0u64..20), 1..8),
        ) {
            let b = [bounds(capacity / 3, capacity); 3];
            let of: Vec<usize> = claims.iter().map(|c| c.0).collect();
            let claims: Vec<BudgetClaim> = claims.iter().map(|c| claim(c.1, c.2)).collect();
            let tenants = bounded(&[1, 1, 1], &of, &b);
            let r = reclaims(capacity, &claims, tenants);
            let lent = borrowed(&claims, tenants);
            for (asked, lent) in r.asked.iter().zip(&lent) {
                proptest::prop_assert!(asked <= lent);
            }
            let demands: Vec<(u32, u64)> = claims.iter().map(|c| (1, c.demand())).collect();
            let parts = guaranteed_parts(&demands, tenants);
            let lack: u64 = (claims.iter().zip(&parts))
                .map(|(c, p)| c.demand().min(*p).saturating_sub(c.using))
                .sum();
            proptest::prop_assert!(r.asked.iter().sum::<u64>() <= lack);
        }
    }
}
