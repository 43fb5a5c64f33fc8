//! Property tests: random sequences of targets, cluster changes, registrations, failures
//! and clock steps, checked against an independent model of what the engine may do, and
//! convergence against a cooperative cluster.
use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::*;

const PROFILES: i32 = 3;

/// Settings drawn from the valid space, small enough to hit every cap.
fn arb_settings(max_executors: bool) -> impl Strategy<Value = AllocationSettings> {
    (
        1u32..6,
        prop_oneof![Just(None), (1u32..12).prop_map(Some)],
        prop_oneof![Just(None), (1u32..6).prop_map(Some)],
        5u64..40,
        0u64..30,
        any::<bool>(),
        prop_oneof![Just(None), (1u64..60).prop_map(Some)],
        prop_oneof![Just(None), (1u32..9).prop_map(Some)],
    )
        .prop_map(
            move |(batch, max_pending, per_rp, timeout, idle, delete, max_exec, gang)| {
                let max_exec = if max_executors { max_exec } else { None };
                // A gang within every cap, as validation requires.
                let gang = gang.map(|g| {
                    let caps = [max_pending, per_rp, max_exec.map(|m| m as u32)];
                    caps.into_iter().flatten().fold(g, u32::min)
                });
                AllocationSettings {
                    batch_size: batch,
                    batch_delay: Duration::from_secs(1),
                    executor_timeout: Duration::from_secs(timeout),
                    executor_idle_timeout: Duration::from_secs(idle),
                    max_pending_pods: max_pending,
                    max_pending_pods_per_profile: per_rp,
                    max_executors: max_exec,
                    min_executors_at_once: gang,
                    delete_on_termination: delete,
                    ..AllocationSettings::default()
                }
            },
        )
}

#[derive(Debug, Clone)]
enum Op {
    Targets(Vec<(i32, u32)>),
    /// Advance the clock by this many ms, then poll the store and run a round if due.
    Tick(i64),
    NotifyNow,
    Resync,
    /// Start some pending pods, fail some running ones, lose some (watch DELETED).
    Churn,
    /// The driver's registered set: a random subset of running and pending pods.
    Register,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => proptest::collection::vec((0..PROFILES, 0u32..15), 1..3).prop_map(Op::Targets),
        6 => prop_oneof![0i64..1500, 1000i64..70_000].prop_map(Op::Tick),
        1 => Just(Op::NotifyNow),
        1 => Just(Op::Resync),
        3 => Just(Op::Churn),
        2 => Just(Op::Register),
    ]
}

/// The cluster, the store, the allocator, and the model's own bookkeeping.
struct World {
    now: Timestamp,
    rng: SmallRng,
    settings: AllocationSettings,
    cluster: BTreeMap<ExecutorId, ExecutorPod>,
    store: SnapshotStore,
    allocator: Allocator,
    targets: BTreeMap<ResourceProfileId, u32>,
    registered: BTreeSet<ExecutorId>,
    /// Requested and not yet seen in a batch, timed out, failed or deleted.
    in_flight: BTreeMap<ExecutorId, ResourceProfileId>,
    /// The snapshot the allocator last received.
    last_snapshot: BTreeMap<ExecutorId, ExecutorPod>,
    highest_id: u64,
    /// Probabilities of a create failing or being lost (never showing up).
    fail_creates: f64,
    lose_creates: f64,
}

impl World {
    fn new(settings: AllocationSettings, seed: u64, faults: bool, last_id: u64) -> Self {
        let now = secs(1_000);
        Self {
            now,
            rng: SmallRng::seed_from_u64(seed),
            store: SnapshotStore::new(settings.batch_delay, now),
            allocator: Allocator::new(settings.clone(), last_id),
            settings,
            cluster: BTreeMap::new(),
            targets: BTreeMap::new(),
            registered: BTreeSet::new(),
            in_flight: BTreeMap::new(),
            last_snapshot: BTreeMap::new(),
            highest_id: last_id,
            fail_creates: if faults { 0.1 } else { 0.0 },
            lose_creates: if faults { 0.1 } else { 0.0 },
        }
    }

    fn set_pod(&mut self, pod: ExecutorPod) {
        self.cluster.insert(pod.id, pod.clone());
        self.store.update_pod(pod);
    }

    fn remove_pod(&mut self, id: ExecutorId) {
        if let Some(pod) = self.cluster.remove(&id) {
            self.store.delete_pod(pod);
        }
    }

    fn set_targets(&mut self, t: &[(i32, u32)]) {
        let t = targets(t);
        self.targets.extend(t.iter().map(|(k, v)| (*k, *v)));
        if self.allocator.set_targets(&t) {
            self.store.notify_now();
        }
    }

    fn churn(&mut self) {
        let ids: Vec<ExecutorId> = self.cluster.keys().copied().collect();
        for id in ids {
            let Some(pod) = self.cluster.get(&id).cloned() else {
                continue;
            };
            let roll: f64 = self.rng.r#gen();
            match pod.state {
                ExecutorState::Pending if roll < 0.5 => self.set_pod(ExecutorPod {
                    state: ExecutorState::Running,
                    ..pod
                }),
                ExecutorState::Running if roll < 0.1 => self.set_pod(ExecutorPod {
                    state: ExecutorState::Failed {
                        exit_code: Some(52),
                        reason: None,
                        message: None,
                    },
                    ..pod
                }),
                _ if roll > 0.95 => self.remove_pod(id),
                _ => {}
            }
        }
    }

    fn register_random(&mut self) {
        let mut set = BTreeSet::new();
        for pod in self.cluster.values() {
            let live = matches!(pod.state, ExecutorState::Running | ExecutorState::Pending);
            if live && self.rng.gen_bool(0.6) {
                set.insert(pod.id);
            }
        }
        self.registered = set.clone();
        self.allocator.set_registered(set);
    }

    /// Polls the store; if due, runs a round, checks every invariant and carries the plan out.
    fn tick(&mut self, advance_ms: i64) -> Result<Option<RoundPlan>, TestCaseError> {
        self.now = Timestamp(self.now.0 + advance_ms);
        let Some(batch) = self.store.poll(self.now) else {
            return Ok(None);
        };
        for id in &batch.seen_ids {
            self.in_flight.remove(id);
            self.highest_id = self.highest_id.max(id.0);
        }
        if batch.snapshot_count > 0 {
            self.last_snapshot = batch.latest.executors.clone();
        }
        let in_flight_before = self.in_flight.clone();
        let plan = self.allocator.round(batch, self.now);
        prop_assert_eq!(plan.outstanding, self.allocator.outstanding());
        self.check_plan(&plan, &in_flight_before)?;
        self.carry_out(&plan);
        self.check_counts(&plan)?;
        Ok(Some(plan))
    }

    fn check_plan(
        &mut self,
        plan: &RoundPlan,
        in_flight_before: &BTreeMap<ExecutorId, ResourceProfileId>,
    ) -> Result<(), TestCaseError> {
        // Ids strictly increase, never reused, never past the lifetime cap.
        for (id, profile) in &plan.creates {
            prop_assert!(
                id.0 > self.highest_id,
                "id {} reused (highest {})",
                id,
                self.highest_id
            );
            prop_assert!(
                self.settings.max_executors.is_none_or(|m| id.0 <= m),
                "id {} past max",
                id
            );
            prop_assert!(self.targets.contains_key(profile));
            self.highest_id = id.0;
        }
        prop_assert_eq!(self.allocator.last_executor_id(), self.highest_id);
        if !plan.refused.is_empty() {
            prop_assert!(
                self.settings
                    .max_executors
                    .is_some_and(|m| self.highest_id >= m)
            );
        }
        // Per profile: never more than the batch size, or the gang.
        let per_round =
            (self.settings.batch_size).max(self.settings.min_executors_at_once.unwrap_or(0));
        for profile in self.targets.keys() {
            let n = plan.creates.iter().filter(|(_, p)| p == profile).count();
            prop_assert!(n <= per_round as usize);
        }
        // Deletes: never Running, never scheduler-known; timeouts only for unseen requests.
        for request in &plan.deletes {
            for id in &request.ids {
                prop_assert!(
                    !self.registered.contains(id),
                    "deleted scheduler-known {}",
                    id
                );
                if request.only_pending {
                    let state = self.last_snapshot.get(id).map(|p| &p.state);
                    prop_assert!(
                        state.is_none() || state == Some(&ExecutorState::Pending),
                        "deleted {} in {:?}",
                        id,
                        state
                    );
                    prop_assert!(state.is_some() || in_flight_before.contains_key(id));
                    prop_assert!(self.allocator.is_deleted(*id));
                } else {
                    prop_assert!(plan.timed_out.contains(id));
                }
            }
        }
        for id in &plan.timed_out {
            prop_assert!(
                in_flight_before.contains_key(id),
                "timed out {} was not in flight",
                id
            );
            prop_assert!(!self.registered.contains(id));
        }
        Ok(())
    }

    fn carry_out(&mut self, plan: &RoundPlan) {
        for id in &plan.timed_out {
            self.in_flight.remove(id);
        }
        for request in &plan.deletes {
            for id in &request.ids {
                self.in_flight.remove(id);
                let pending = self
                    .cluster
                    .get(id)
                    .is_some_and(|p| p.state == ExecutorState::Pending);
                if !request.only_pending || pending {
                    self.remove_pod(*id);
                }
            }
        }
        for (id, profile) in &plan.creates {
            self.in_flight.insert(*id, *profile);
            let roll: f64 = self.rng.r#gen();
            if roll < self.fail_creates {
                self.in_flight.remove(id);
                self.allocator.create_failed(*id);
            } else if roll < self.fail_creates + self.lose_creates {
                // Lost: the allocator thinks it was created; it never shows up.
            } else {
                let pod = ExecutorPod {
                    id: *id,
                    profile: *profile,
                    state: ExecutorState::Pending,
                    created_at: Some(self.now),
                    pod_name: format!("app-exec-{id}"),
                    start_blocker: None,
                };
                self.set_pod(pod);
            }
        }
    }

    /// Requests never exceed the target, and the pending caps hold, counted by the model.
    fn check_counts(&self, plan: &RoundPlan) -> Result<(), TestCaseError> {
        let live = |state: &ExecutorState, id: &ExecutorId| {
            let counted = matches!(state, ExecutorState::Running | ExecutorState::Pending);
            counted && !self.allocator.is_deleted(*id)
        };
        let mut total_not_running = 0u64;
        let mut any_creates = false;
        for (profile, target) in &self.targets {
            let pods = self
                .last_snapshot
                .values()
                .filter(|p| p.profile == *profile && live(&p.state, &p.id));
            let (running, pending) = pods.fold((0u64, 0u64), |(r, p), pod| match pod.state {
                ExecutorState::Running => (r + 1, p),
                _ => (r, p + 1),
            });
            let in_flight = self.in_flight.values().filter(|p| *p == profile).count() as u64;
            let created = plan.creates.iter().filter(|(_, p)| p == profile).count();
            let not_running = pending + in_flight;
            total_not_running += not_running;
            if created > 0 {
                any_creates = true;
                prop_assert!(
                    running + not_running <= u64::from(*target),
                    "profile {}: {} running + {} not running > target {}",
                    profile,
                    running,
                    not_running,
                    target
                );
                if let Some(cap) = self.settings.max_pending_pods_per_profile {
                    prop_assert!(
                        not_running <= u64::from(cap),
                        "profile {} pending cap",
                        profile
                    );
                }
            }
        }
        if any_creates && let Some(cap) = self.settings.max_pending_pods {
            prop_assert!(
                total_not_running <= u64::from(cap),
                "{} not running > cap {}",
                total_not_running,
                cap
            );
        }
        Ok(())
    }

    /// GetStatus, at any time, matches the model: every profile with a target, a request in
    /// flight or a running/pending executor in the last snapshot, counted without the
    /// executors the allocator deleted.
    fn check_status(&self) -> Result<(), TestCaseError> {
        let mut expected: BTreeMap<ResourceProfileId, ProfileCounts> = self
            .targets
            .iter()
            .map(|(rp, target)| {
                let counts = ProfileCounts {
                    target: *target,
                    ..ProfileCounts::default()
                };
                (*rp, counts)
            })
            .collect();
        for pod in self.last_snapshot.values() {
            let counted = !self.allocator.is_deleted(pod.id);
            match pod.state {
                ExecutorState::Running => {
                    expected.entry(pod.profile).or_default().running += u32::from(counted);
                }
                ExecutorState::Pending => {
                    expected.entry(pod.profile).or_default().pending += u32::from(counted);
                }
                _ => {}
            }
        }
        for profile in self.in_flight.values() {
            expected.entry(*profile).or_default().newly_created += 1;
        }
        prop_assert_eq!(self.allocator.status().profiles, expected);
        Ok(())
    }

    /// The cooperative cluster: pending pods start, registered executors are the running ones,
    /// and the driver retires running executors beyond its target (as dynamic allocation does).
    fn cooperate(&mut self) {
        let ids: Vec<ExecutorId> = self.cluster.keys().copied().collect();
        for id in ids {
            let Some(pod) = self.cluster.get(&id).cloned() else {
                continue;
            };
            if !matches!(pod.state, ExecutorState::Pending | ExecutorState::Running) {
                self.remove_pod(id);
            } else if pod.state == ExecutorState::Pending {
                self.set_pod(ExecutorPod {
                    state: ExecutorState::Running,
                    ..pod
                });
            }
        }
        for (profile, target) in self.targets.clone() {
            let running: Vec<ExecutorId> = self
                .cluster
                .values()
                .filter(|p| p.profile == profile)
                .map(|p| p.id)
                .collect();
            for id in running.iter().skip(target as usize) {
                self.remove_pod(*id);
            }
        }
        let running: BTreeSet<ExecutorId> = self.cluster.keys().copied().collect();
        self.registered = running.clone();
        self.allocator.set_registered(running);
    }

    fn converged(&self) -> bool {
        let on_target = self.targets.iter().all(|(profile, target)| {
            let running = self
                .cluster
                .values()
                .filter(|p| p.profile == *profile && p.state == ExecutorState::Running)
                .count();
            running == *target as usize
        });
        let all_running = self
            .cluster
            .values()
            .all(|p| p.state == ExecutorState::Running);
        on_target && all_running && self.in_flight.is_empty() && !self.allocator.outstanding()
    }
}

fn run(world: &mut World, ops: &[Op]) -> Result<(), TestCaseError> {
    for op in ops {
        match op {
            Op::Targets(t) => world.set_targets(t),
            Op::Tick(ms) => {
                world.tick(*ms)?;
            }
            Op::NotifyNow => world.store.notify_now(),
            Op::Resync => {
                let pods: Vec<ExecutorPod> = world.cluster.values().cloned().collect();
                world.store.replace_all(pods, world.now);
            }
            Op::Churn => world.churn(),
            Op::Register => world.register_random(),
        }
        world.check_status()?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every invariant holds after every round, whatever the cluster and the driver do.
    #[test]
    fn invariants_hold_under_random_sequences(
        settings in arb_settings(true),
        seed in any::<u64>(),
        last_id in prop_oneof![Just(0u64), 0u64..20],
        ops in proptest::collection::vec(arb_op(), 1..120),
    ) {
        let mut world = World::new(settings, seed, true, last_id);
        run(&mut world, &ops)?;
    }

    /// After any history, a cooperative cluster brings every profile to exactly its target.
    #[test]
    fn converges_to_the_target_on_a_cooperative_cluster(
        settings in arb_settings(false),
        seed in any::<u64>(),
        ops in proptest::collection::vec(arb_op(), 0..60),
        final_targets in proptest::collection::vec((0..PROFILES, 0u32..15), 1..4),
    ) {
        let mut world = World::new(settings, seed, true, 0);
        run(&mut world, &ops)?;
        world.fail_creates = 0.0;
        world.lose_creates = 0.0;
        world.set_targets(&final_targets);
        // Long enough for lost requests to time out and excess pending pods to pass the idle timeout.
        let mut steps = 0;
        while !world.converged() {
            prop_assert!(steps < 2_000, "no convergence: targets {:?}, cluster {:?}", world.targets, world.cluster.len());
            world.cooperate();
            world.store.replace_all(world.cluster.values().cloned().collect(), world.now);
            world.tick(1_000)?;
            steps += 1;
        }
        // And it stays there: a further round asks for nothing and deletes nothing.
        world.cooperate();
        let plan = world.tick(1_000)?;
        prop_assert!(plan.is_some_and(|p| p.creates.is_empty() && p.deletes.is_empty()));
    }
}
