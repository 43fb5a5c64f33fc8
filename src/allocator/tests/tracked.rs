//! The allocator's incremental index of the last snapshot must equal one rebuilt from
//! scratch, whatever the store saw (updates, deletes, resyncs that drop pods).
use std::time::Duration;

use proptest::prelude::*;

use super::super::tracked::TrackedExecutors;
use super::*;

/// (profile → (running, pending ids)) with empty profiles left out.
fn view(t: &TrackedExecutors) -> BTreeMap<i32, (u64, Vec<u64>)> {
    (0..4)
        .filter_map(|p| {
            let index = t.profile(rp(p))?;
            let pending: Vec<u64> = index.pending.keys().map(|id| id.0).collect();
            (index.running > 0 || !pending.is_empty()).then_some((p, (index.running, pending)))
        })
        .collect()
}

#[derive(Debug, Clone)]
enum StoreOp {
    Update(u64, i32, u8),
    Delete(u64),
    /// Resync keeping only the pods whose id is not divisible by this.
    Resync(u64),
    Poll,
}

fn arb_store_op() -> impl Strategy<Value = StoreOp> {
    prop_oneof![
        8 => (1u64..200, 0i32..4, 0u8..4).prop_map(|(id, p, s)| StoreOp::Update(id, p, s)),
        2 => (1u64..200).prop_map(StoreOp::Delete),
        1 => (2u64..10).prop_map(StoreOp::Resync),
        3 => Just(StoreOp::Poll),
    ]
}

fn state(n: u8) -> ExecutorState {
    match n {
        0 => ExecutorState::Pending,
        1 => ExecutorState::Running,
        2 => ExecutorState::Failed {
            exit_code: Some(1),
            reason: None,
            message: None,
        },
        _ => ExecutorState::Succeeded { exit_code: Some(0) },
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn incremental_index_equals_a_rebuild(ops in proptest::collection::vec(arb_store_op(), 1..200)) {
        let mut store = SnapshotStore::new(Duration::from_secs(1), secs(0));
        // Start with many pods so later batches take the incremental path.
        store.replace_all((1..=150).map(|id| exec(id, (id % 4) as i32, state((id % 3) as u8), 0)).collect(), secs(0));
        let mut incremental = TrackedExecutors::default();
        let mut now = 0;
        for op in ops {
            match op {
                StoreOp::Update(id, p, s) => store.update_pod(exec(id, p, state(s), 0)),
                StoreOp::Delete(id) => {
                    if let Some(pod) = store.current().executors.get(&ExecutorId(id)).cloned() {
                        store.delete_pod(pod);
                    }
                }
                StoreOp::Resync(k) => {
                    let kept = store.current().executors.values().filter(|p| p.id.0 % k != 0).cloned().collect();
                    store.replace_all(kept, secs(now));
                }
                StoreOp::Poll => {
                    now += 1;
                    let batch = store.poll(secs(now)).expect("due every second");
                    if batch.snapshot_count > 0 {
                        incremental.apply(&batch);
                        let mut rebuilt = TrackedExecutors::default();
                        rebuilt.apply(&SnapshotBatch {
                            snapshot_count: 1,
                            seen_ids: batch.latest.executors.keys().copied().collect(),
                            latest: batch.latest.clone(),
                        });
                        prop_assert_eq!(view(&incremental), view(&rebuilt));
                        for id in 1..200 {
                            prop_assert_eq!(incremental.contains(ExecutorId(id)), batch.latest.executors.contains_key(&ExecutorId(id)));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_batch_is_a_snapshot_later_updates_do_not_change_it() {
    let mut store = SnapshotStore::new(Duration::from_secs(1), secs(0));
    store.update_pod(pending(1, 0, 0));
    let batch = store.poll(secs(0)).expect("due");
    store.update_pod(running(1, 0, 0));
    store.update_pod(pending(2, 0, 0));
    assert_eq!(batch.latest.executors.len(), 1);
    assert_eq!(
        batch.latest.executors[&ExecutorId(1)].state,
        ExecutorState::Pending
    );
    assert_eq!(
        store.current().executors[&ExecutorId(1)].state,
        ExecutorState::Running
    );
}

#[test]
fn pods_missing_from_a_batch_are_dropped_even_when_not_reported_as_seen() {
    let all: Vec<ExecutorPod> = (1..=10).map(|id| running(id, 0, 0)).collect();
    let mut t = TrackedExecutors::default();
    t.apply(&snapshot(&all));
    // Pod 10 vanished and pod 3 went pending; only 3 is reported as seen.
    let mut latest: BTreeMap<ExecutorId, ExecutorPod> =
        all[..9].iter().map(|p| (p.id, p.clone())).collect();
    latest.insert(ExecutorId(3), pending(3, 0, 0));
    t.apply(&SnapshotBatch {
        snapshot_count: 1,
        seen_ids: registered(&[3]),
        latest: std::sync::Arc::new(ExecutorPodsSnapshot {
            executors: latest,
            full_resync_at: secs(0),
        }),
    });
    assert!(!t.contains(ExecutorId(10)));
    assert_eq!(view(&t), BTreeMap::from([(0, (8, vec![3]))]));
}
