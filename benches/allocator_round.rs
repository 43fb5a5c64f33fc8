//! Allocation engine speed: one round over many tracked executors, and single-pod snapshot
//! updates, and a status report. Each figure is printed as a ratio against a baseline measured in the same run:
//! the same round shape with 100 executors, and a plain `BTreeMap` insert of the same pods.
//!
//! Run: `cargo bench --bench allocator_round -- --warm-up-time 1 --measurement-time 3`
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use spark_pod_allocator::allocator::{
    AllocationSettings, Allocator, ExecutorId, ExecutorPod, ExecutorPodsSnapshot, ExecutorState,
    ResourceProfileId, SnapshotBatch, SnapshotStore, Timestamp,
};

const PROFILES: i32 = 4;
const T0: Timestamp = Timestamp(1_700_000_000_000);

/// Mean time per element of everything a benchmark timed (warm-up included), for ratios.
#[derive(Default, Clone)]
struct Mean(Rc<RefCell<(Duration, u64)>>);

impl Mean {
    fn add(&self, elapsed: Duration, elements: u64) {
        let mut m = self.0.borrow_mut();
        m.0 += elapsed;
        m.1 += elements;
    }
    fn nanos(&self) -> f64 {
        let m = self.0.borrow();
        if m.1 == 0 {
            f64::NAN
        } else {
            m.0.as_nanos() as f64 / m.1 as f64
        }
    }
}

fn pod(id: u64, profile: i32, state: ExecutorState, created_at: Timestamp) -> ExecutorPod {
    ExecutorPod {
        id: ExecutorId(id),
        profile: ResourceProfileId(profile),
        state,
        created_at: Some(created_at),
        pod_name: format!("spark-pi-3f2a9c-exec-{id}"),
        start_blocker: None,
    }
}

/// An allocator tracking `total` executors over four profiles (92% running, 6% pending, 2%
/// newly created and unseen), and the next tick's batch: a snapshot with 100 changed pods.
/// In that round profile 0 is on target, 1 is short but waits for its requests, 2 is over
/// target and deletes old pending pods, 3 is short and asks for a batch.
fn round_setup(total: u64) -> (Allocator, SnapshotBatch) {
    let per_profile = total / PROFILES as u64;
    let newly = (per_profile / 50).max(1);
    let pending = (per_profile * 6 / 100).max(1);
    let existing = per_profile - newly;
    let mut executors = BTreeMap::new();
    let mut registered = BTreeSet::new();
    let mut id = 0;
    for profile in 0..PROFILES {
        for i in 0..existing {
            id += 1;
            let state = if i < pending {
                ExecutorState::Pending
            } else {
                ExecutorState::Running
            };
            if i % 2 == 1 || state == ExecutorState::Running {
                registered.insert(ExecutorId(id));
            }
            executors.insert(
                ExecutorId(id),
                pod(id, profile, state, Timestamp(T0.0 - 600_000)),
            );
        }
    }
    let settings = AllocationSettings {
        batch_size: newly as u32,
        ..AllocationSettings::default()
    };
    let mut allocator = Allocator::new(settings, id);
    allocator.set_registered(registered);
    // Profiles 0..=2 request `newly` executors each; profile 3 is on target.
    let first: BTreeMap<_, _> = (0..PROFILES)
        .map(|p| {
            (
                ResourceProfileId(p),
                if p < 3 {
                    per_profile as u32
                } else {
                    existing as u32
                },
            )
        })
        .collect();
    allocator.set_targets(&first);
    let snapshot = ExecutorPodsSnapshot {
        executors,
        full_resync_at: T0,
    };
    let start = SnapshotBatch {
        snapshot_count: 1,
        seen_ids: snapshot.executors.keys().copied().collect(),
        latest: Arc::new(snapshot.clone()),
    };
    let plan = allocator.round(start, T0);
    assert_eq!(plan.creates.len() as u64, 3 * newly);
    let excess = (pending / 2).max(1) as u32;
    let second: BTreeMap<_, _> = [
        (0, per_profile as u32),
        (1, per_profile as u32 + 5),
        (2, per_profile as u32 - excess),
        (3, per_profile as u32),
    ]
    .into_iter()
    .map(|(p, t)| (ResourceProfileId(p), t))
    .collect();
    allocator.set_targets(&second);
    let changed = snapshot
        .executors
        .keys()
        .step_by((total as usize / 100).max(1))
        .copied()
        .collect();
    let batch = SnapshotBatch {
        snapshot_count: 100,
        seen_ids: changed,
        latest: Arc::new(snapshot),
    };
    (allocator, batch)
}

/// Which batch the measured round gets.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tick {
    /// 100 pods changed since the last round (the usual tick).
    Changes,
    /// Nothing changed: no snapshot.
    Quiet,
    /// A full resync happened: every id is seen and the index is rebuilt (every 30 s).
    Resync,
}

fn bench_round(c: &mut Criterion, total: u64, mean: &Mean, tick: Tick) {
    let (allocator, mut batch) = round_setup(total);
    let name = match tick {
        Tick::Changes => format!("round_{total}_executors"),
        Tick::Quiet => {
            batch = SnapshotBatch::default();
            format!("round_{total}_executors_no_snapshot")
        }
        Tick::Resync => {
            batch.seen_ids = batch.latest.executors.keys().copied().collect();
            format!("round_{total}_executors_after_resync")
        }
    };
    let changed = tick != Tick::Quiet;
    // Check the shape once: the round both deletes and creates.
    let plan = allocator
        .clone()
        .round(batch.clone(), Timestamp(T0.0 + 1_000));
    assert!(!plan.creates.is_empty(), "{plan:?}");
    assert!(!changed || !plan.deletes.is_empty(), "{plan:?}");
    let mut group = c.benchmark_group("allocator_round");
    group.throughput(Throughput::Elements(1));
    group.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                let (mut a, batch) = (allocator.clone(), batch.clone());
                let start = Instant::now();
                let plan = a.round(batch, Timestamp(T0.0 + 1_000));
                elapsed += start.elapsed();
                black_box(plan);
            }
            mean.add(elapsed, iters);
            elapsed
        })
    });
    group.finish();
}

/// GetStatus of the 10,000-executor application right after the measured round (so with
/// deletes and requests outstanding): computed on demand from the engine's index.
fn bench_status(c: &mut Criterion, mean: &Mean) {
    let (mut allocator, batch) = round_setup(10_000);
    allocator.round(batch, Timestamp(T0.0 + 1_000));
    let status = allocator.status();
    assert_eq!(status.profiles.len(), PROFILES as usize);
    assert!(!status.deleted.is_empty());
    let mut group = c.benchmark_group("allocator_status");
    group.throughput(Throughput::Elements(1));
    group.bench_function("status_10000_executors", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                black_box(allocator.status());
            }
            let elapsed = start.elapsed();
            mean.add(elapsed, iters);
            elapsed
        })
    });
    group.finish();
}

const UPDATES: u64 = 1_000;

/// Updates flipping pods between Pending and Running, cycling through a 10,000-pod snapshot.
fn updates(round: u64) -> Vec<ExecutorPod> {
    (0..UPDATES)
        .map(|i| {
            let id = (round * UPDATES + i) % 10_000 + 1;
            let state = if round.is_multiple_of(2) {
                ExecutorState::Running
            } else {
                ExecutorState::Pending
            };
            pod(id, (id % 4) as i32, state, T0)
        })
        .collect()
}

fn bench_ingest(c: &mut Criterion, store_mean: &Mean, map_mean: &Mean) {
    let initial: Vec<ExecutorPod> = (1..=10_000)
        .map(|id| pod(id, (id % 4) as i32, ExecutorState::Pending, T0))
        .collect();
    let mut group = c.benchmark_group("allocator_ingest");
    group.throughput(Throughput::Elements(UPDATES));
    group.bench_function("snapshot_store_update_pod", |b| {
        let mut store = SnapshotStore::new(Duration::from_secs(1), T0);
        store.replace_all(initial.clone(), T0);
        let mut round = 0;
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let pods = updates(round);
                let start = Instant::now();
                for pod in pods {
                    store.update_pod(pod);
                }
                elapsed += start.elapsed();
                // The subscriber drains the store once per batch delay.
                if round.is_multiple_of(50) {
                    black_box(store.poll(Timestamp(T0.0 + round as i64 * 1_000)));
                }
            }
            store_mean.add(elapsed, iters * UPDATES);
            elapsed
        })
    });
    group.bench_function("baseline_btreemap_insert", |b| {
        let mut map: BTreeMap<ExecutorId, ExecutorPod> =
            initial.iter().map(|p| (p.id, p.clone())).collect();
        let mut round = 0;
        b.iter_custom(|iters| {
            let mut elapsed = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                let pods = updates(round);
                let start = Instant::now();
                for pod in pods {
                    map.insert(pod.id, pod);
                }
                elapsed += start.elapsed();
            }
            map_mean.add(elapsed, iters * UPDATES);
            elapsed
        })
    });
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let (small, large, quiet, resync) = (
        Mean::default(),
        Mean::default(),
        Mean::default(),
        Mean::default(),
    );
    bench_round(&mut c, 100, &small, Tick::Changes);
    bench_round(&mut c, 10_000, &large, Tick::Changes);
    bench_round(&mut c, 10_000, &quiet, Tick::Quiet);
    bench_round(&mut c, 10_000, &resync, Tick::Resync);
    let status = Mean::default();
    bench_status(&mut c, &status);
    let (store, map) = (Mean::default(), Mean::default());
    bench_ingest(&mut c, &store, &map);
    c.final_summary();

    println!("\n== allocation engine: summary (means over every timed iteration) ==");
    let lines = [
        ("round, 100 executors (baseline)", small.nanos() / 1e3, "us"),
        (
            "round, 10,000 executors (goal <= 200 us)",
            large.nanos() / 1e3,
            "us",
        ),
        ("round, 10,000, no new snapshot", quiet.nanos() / 1e3, "us"),
        (
            "round, 10,000, after a full resync",
            resync.nanos() / 1e3,
            "us",
        ),
        (
            "ratio round 10,000 / round 100",
            large.nanos() / small.nanos(),
            "x",
        ),
        ("status, 10,000 executors", status.nanos() / 1e3, "us"),
        (
            "ratio status 10,000 / round 100",
            status.nanos() / small.nanos(),
            "x",
        ),
        (
            "store update_pod (goal >= 500,000/s)",
            1e9 / store.nanos(),
            "updates/s",
        ),
        ("baseline BTreeMap insert", 1e9 / map.nanos(), "inserts/s"),
        (
            "ratio update_pod / BTreeMap insert",
            store.nanos() / map.nanos(),
            "x time per update",
        ),
    ];
    for (what, value, unit) in lines {
        if value.is_finite() {
            println!("{what:<42} {value:>12.1} {unit}");
        }
    }
}
