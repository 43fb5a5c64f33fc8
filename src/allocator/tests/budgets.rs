//! Budgets over several allocators (one per application), as the service's ledger runs
//! them: each round asks `budget::room` over every application's last claim, on a manual
//! clock (plain `Timestamp`s).
use super::*;
use crate::allocator::budget::{self, BudgetClaim, BudgetLimits};

/// Applications under one budget, each with its allocator and its pods (all Running once
/// created, as a quick cluster would have them by the next round).
struct Tenancy {
    limits: BudgetLimits,
    apps: Vec<Option<App>>,
}

struct App {
    allocator: Allocator,
    weight: u32,
    claim: BudgetClaim,
    pods: Vec<ExecutorPod>,
}

impl Tenancy {
    fn new(max_executors: u64, weights: &[u32], settings: AllocationSettings) -> Self {
        let apps = weights
            .iter()
            .map(|w| {
                Some(App {
                    allocator: Allocator::new(settings.clone(), 0),
                    weight: *w,
                    claim: BudgetClaim {
                        weight: *w,
                        ..BudgetClaim::default()
                    },
                    pods: Vec::new(),
                })
            })
            .collect();
        Self {
            limits: BudgetLimits {
                max_executors,
                ..BudgetLimits::default()
            },
            apps,
        }
    }

    /// The claims of the applications still there, and where `who`'s is among them.
    fn claims(&self, who: usize) -> (Vec<BudgetClaim>, usize) {
        let mut claims = Vec::new();
        let mut at = 0;
        for (i, app) in self.apps.iter().enumerate() {
            if let Some(app) = app {
                if i == who {
                    at = claims.len();
                }
                claims.push(app.claim);
            }
        }
        (claims, at)
    }

    fn set_target(&mut self, who: usize, target: u32) {
        let app = self.apps[who].as_mut().unwrap();
        app.allocator.set_targets(&targets(&[(0, target)]));
        app.claim.wanted = u64::from(target).max(app.claim.using);
    }

    /// One round of `who` at `now`; returns its plan.
    fn round(&mut self, who: usize, now: Timestamp) -> RoundPlan {
        let mut app = self.apps[who].take().unwrap();
        let limits = self.limits;
        let weight = app.weight;
        let to_claim = |u: &AllocationUse| BudgetClaim {
            weight,
            wanted: u.wanted,
            using: u.using,
            pending: u.pending,
            seen: u.seen,
            cost: Default::default(),
            reclaiming: 0,
        };
        let batch = snapshot(&app.pods);
        let plan = {
            let others = &*self;
            app.allocator.round_within(batch, now, &mut |usage| {
                let (mut claims, at) = others.claims_with(who, to_claim(usage));
                claims[at] = to_claim(usage);
                budget::room(&limits, &claims, at).executors
            })
        };
        app.claim = to_claim(&plan.usage);
        for (id, profile) in &plan.creates {
            app.pods
                .push(exec(id.0, profile.0, ExecutorState::Running, now.0 / 1000));
        }
        self.apps[who] = Some(app);
        plan
    }

    /// The claims with `who`'s (taken out for its round) as `claim`.
    fn claims_with(&self, who: usize, claim: BudgetClaim) -> (Vec<BudgetClaim>, usize) {
        let mut claims = Vec::new();
        let mut at = 0;
        for (i, app) in self.apps.iter().enumerate() {
            if i == who {
                at = claims.len();
                claims.push(claim);
            } else if let Some(app) = app {
                claims.push(app.claim);
            }
        }
        (claims, at)
    }

    fn running(&self, who: usize) -> usize {
        self.apps[who].as_ref().map_or(0, |a| a.pods.len())
    }

    fn end(&mut self, who: usize) {
        self.apps[who] = None;
    }
}

#[test]
fn three_applications_asking_30_under_30_get_10_each_and_15_each_once_one_ends() {
    let mut t = Tenancy::new(30, &[1, 1, 1], settings());
    // Each asks as its SetTotalExpected arrives, with the others' targets not yet known.
    for who in 0..3 {
        t.set_target(who, 30);
        t.round(who, secs(0));
    }
    for second in 1..5 {
        for who in 0..3 {
            t.round(who, secs(second));
        }
    }
    assert_eq!([t.running(0), t.running(1), t.running(2)], [10, 10, 10]);
    let plan = t.round(0, secs(5));
    assert_eq!(plan.held, BTreeMap::from([(rp(0), 20)]));
    assert!(plan.creates.is_empty());
    let (claims, _) = t.claims(0);
    assert_eq!(claims.iter().map(|c| c.using).sum::<u64>(), 30);
    t.end(2);
    // One round each: 15/15.
    t.round(0, secs(6));
    t.round(1, secs(6));
    assert_eq!([t.running(0), t.running(1)], [15, 15]);
    assert_eq!(t.round(0, secs(7)).held, BTreeMap::from([(rp(0), 15)]));
}

#[test]
fn weights_2_1_1_divide_30_as_15_8_7() {
    // Targets known before the first round (as a restart resumes them), batch wide enough
    // that one round reaches the share.
    let mut t = Tenancy::new(30, &[2, 1, 1], settings_with(100, None, None));
    for who in 0..3 {
        t.set_target(who, 30);
    }
    for who in 0..3 {
        t.round(who, secs(0));
    }
    assert_eq!([t.running(0), t.running(1), t.running(2)], [15, 8, 7]);
}

#[test]
fn a_first_comer_keeps_what_it_has_and_the_others_get_what_is_free() {
    let mut t = Tenancy::new(30, &[1, 1], settings_with(100, None, None));
    t.set_target(0, 25);
    t.round(0, secs(0));
    t.set_target(1, 30);
    for second in 1..4 {
        t.round(0, secs(second));
        t.round(1, secs(second));
    }
    // Admission, not preemption: 25 stay, the other gets the 5 free.
    assert_eq!([t.running(0), t.running(1)], [25, 5]);
    // The first shrinks to 10: the other reaches its share, 15, then the rest.
    t.set_target(0, 10);
    let shrunk = {
        let app = t.apps[0].as_mut().unwrap();
        app.pods.truncate(10);
        t.round(0, secs(10))
    };
    assert!(shrunk.creates.is_empty());
    t.round(1, secs(10));
    assert_eq!(t.running(1), 20);
}

#[test]
fn held_executors_are_reported_per_profile_lowest_profile_first() {
    let mut a = allocator(settings(), &[(0, 4), (1, 6)]);
    let plan = a.round_within(snapshot(&[]), secs(0), &mut |usage| {
        assert_eq!(
            *usage,
            AllocationUse {
                wanted: 10,
                using: 0,
                pending: 0,
                seen: 0,
            }
        );
        7
    });
    assert_eq!(
        creates(&plan),
        vec![(1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (6, 1), (7, 1)]
    );
    assert_eq!(plan.held, BTreeMap::from([(rp(1), 3)]));
    assert_eq!(a.status().profiles[&rp(1)].held, 3);
    assert_eq!(plan.usage.using, 7);
    // Without a budget nothing is held.
    let mut b = allocator(settings(), &[(0, 4)]);
    let plan = b.round(snapshot(&[]), secs(0));
    assert!(plan.held.is_empty());
}

#[test]
fn a_gang_is_asked_for_whole_or_not_at_all() {
    let gang = AllocationSettings {
        min_executors_at_once: Some(8),
        ..settings()
    };
    let mut a = allocator(gang.clone(), &[(0, 8)]);
    let plan = a.round_within(snapshot(&[]), secs(0), &mut |_| 5);
    assert!(plan.creates.is_empty());
    assert_eq!(plan.held, BTreeMap::from([(rp(0), 8)]));
    let mut b = allocator(gang, &[(0, 8)]);
    let plan = b.round_within(snapshot(&[]), secs(0), &mut |_| 8);
    assert_eq!(plan.creates.len(), 8);
}
