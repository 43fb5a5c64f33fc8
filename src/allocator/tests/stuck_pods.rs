//! Beyond Spark: pending pods that do not start, past `stuck_pending_timeout_ms` (default
//! 120 s): a container waiting for an image or its configuration is deleted and its slot
//! freed; an unschedulable pod is reported and holds its profile's creates.
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use super::*;
use crate::allocator::start_blocker::{StartBlocker, start_blocker};

fn waiting(id: u64, profile: i32, reason: &str) -> ExecutorPod {
    ExecutorPod {
        start_blocker: Some(StartBlocker::ContainerWaiting {
            reason: reason.into(),
            message: Some(format!("{reason} for image spark:nope")),
        }),
        ..pending(id, profile, 0)
    }
}

fn unschedulable(id: u64, profile: i32) -> ExecutorPod {
    ExecutorPod {
        start_blocker: Some(StartBlocker::Unschedulable {
            message: Some("0/3 nodes are available: 3 Insufficient cpu.".into()),
        }),
        ..pending(id, profile, 0)
    }
}

/// A batch whose latest snapshot is `all`, in which only `changed` changed.
fn update(all: &[ExecutorPod], changed: &[u64]) -> SnapshotBatch {
    SnapshotBatch {
        seen_ids: ids(changed).into_iter().collect(),
        ..snapshot(all)
    }
}

fn stuck_ids(plan: &RoundPlan) -> Vec<(u64, bool)> {
    plan.stuck.iter().map(|s| (s.id.0, s.deleted)).collect()
}

#[test]
fn a_pod_waiting_for_its_image_past_the_timeout_is_deleted_its_slot_freed_and_replaced() {
    let mut a = allocator(settings(), &[(0, 2)]);
    assert_eq!(
        creates(&a.round(snapshot(&[]), secs(0))),
        vec![(1, 0), (2, 0)]
    );
    let pods = [waiting(1, 0, "ImagePullBackOff"), pending(2, 0, 0)];
    assert!(a.round(snapshot(&pods), secs(1)).stuck.is_empty());
    let plan = a.round(no_snapshot(), secs(121));
    assert!(plan.stuck.is_empty(), "not before the timeout has passed");
    assert!(plan.deletes.is_empty());

    let plan = a.round(no_snapshot(), secs(122));
    assert_eq!(stuck_ids(&plan), vec![(1, true)]);
    let stuck = &plan.stuck[0];
    assert_eq!(
        (
            stuck.blocker.reason(),
            stuck.since,
            stuck.profile,
            stuck.pod_name.as_str()
        ),
        ("ImagePullBackOff", secs(1), rp(0), "app-exec-1")
    );
    assert_eq!(plan.deletes, vec![delete(&[1], true)]);
    assert!(
        plan.creates.is_empty(),
        "the replacement waits for the next round (which the service may back off)"
    );
    assert!(a.is_deleted(ExecutorId(1)));
    assert_eq!(a.status().profiles[&rp(0)].pending, 1, "its slot is free");

    let plan = a.round(no_snapshot(), secs(123));
    assert_eq!(creates(&plan), vec![(3, 0)]);
    assert!(plan.stuck.is_empty(), "reported once");
    assert!(plan.deletes.is_empty());
}

#[test]
fn every_reason_that_needs_a_change_to_the_pod_deletes_it_and_others_wait() {
    for reason in [
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
    ] {
        let mut a = allocator(settings(), &[(0, 1)]);
        a.round(snapshot(&[]), secs(0));
        a.round(snapshot(&[waiting(1, 0, reason)]), secs(1));
        let plan = a.round(no_snapshot(), secs(200));
        assert_eq!(stuck_ids(&plan), vec![(1, true)], "{reason}");
        assert_eq!(plan.deletes, vec![delete(&[1], true)], "{reason}");
    }
    // A pod merely pending (or pulling its image slowly) waits for Spark's own timeouts.
    let mut a = allocator(settings(), &[(0, 1)]);
    a.round(snapshot(&[]), secs(0));
    a.round(snapshot(&[pending(1, 0, 0)]), secs(1));
    let plan = a.round(no_snapshot(), secs(10_000));
    assert!(plan.stuck.is_empty());
    assert!(plan.deletes.is_empty());
}

#[test]
fn the_wait_counts_from_the_first_round_that_saw_it_stuck_on_the_engines_clock() {
    let s = AllocationSettings {
        stuck_pending_timeout: Duration::from_secs(30),
        ..settings()
    };
    let mut a = allocator(s, &[(0, 1)]);
    a.round(snapshot(&[]), secs(0));
    // Created long ago by the pod's own clock: that does not shorten the wait.
    let old = ExecutorPod {
        created_at: Some(secs(-5_000)),
        ..waiting(1, 0, "ErrImagePull")
    };
    a.round(snapshot(std::slice::from_ref(&old)), secs(10));
    // Another reason of the same kind keeps the wait going.
    let backoff = ExecutorPod {
        created_at: Some(secs(-5_000)),
        ..waiting(1, 0, "ImagePullBackOff")
    };
    a.round(update(std::slice::from_ref(&backoff), &[1]), secs(20));
    assert!(a.round(no_snapshot(), secs(40)).stuck.is_empty());
    // It pulled after all, then failed again: the wait starts again.
    a.round(update(&[pending(1, 0, 0)], &[1]), secs(41));
    a.round(update(std::slice::from_ref(&backoff), &[1]), secs(50));
    assert!(a.round(no_snapshot(), secs(80)).stuck.is_empty());
    let plan = a.round(no_snapshot(), secs(81));
    assert_eq!(stuck_ids(&plan), vec![(1, true)]);
    assert_eq!(plan.stuck[0].since, secs(50));
}

#[test]
fn a_stuck_pod_gone_or_running_is_forgotten() {
    let s = AllocationSettings {
        stuck_pending_timeout: Duration::from_secs(30),
        ..settings()
    };
    let mut a = allocator(s, &[(0, 2)]);
    a.round(snapshot(&[]), secs(0));
    a.round(
        snapshot(&[waiting(1, 0, "ErrImagePull"), unschedulable(2, 0)]),
        secs(1),
    );
    // A resync without 1, and 2 started.
    a.round(snapshot(&[running(2, 0, 0)]), secs(2));
    let plan = a.round(no_snapshot(), secs(100));
    assert!(plan.stuck.is_empty());
    assert!(plan.deletes.is_empty());
}

#[test]
fn an_unschedulable_pod_is_reported_kept_and_holds_its_profile_while_the_oldest() {
    let s = AllocationSettings {
        batch_size: 2,
        ..settings()
    };
    let mut a = allocator(s, &[(0, 4), (1, 1)]);
    assert_eq!(
        creates(&a.round(snapshot(&[]), secs(0))),
        vec![(1, 0), (2, 0), (3, 1)]
    );
    let full = [unschedulable(1, 0), unschedulable(2, 0), running(3, 1, 0)];
    assert_eq!(
        creates(&a.round(snapshot(&full), secs(1))),
        vec![(4, 0), (5, 0)],
        "before the timeout, Spark's rules alone"
    );
    let mut pods = full.to_vec();
    pods.extend([unschedulable(4, 0), unschedulable(5, 0)]);
    a.round(update(&pods, &[4, 5]), secs(2));
    a.set_targets(&targets(&[(0, 8), (1, 2)]));

    let plan = a.round(no_snapshot(), secs(122));
    assert_eq!(stuck_ids(&plan), vec![(1, false), (2, false)]);
    assert_eq!(plan.stuck[0].blocker.reason(), "Unschedulable");
    assert!(plan.deletes.is_empty(), "kept: the cluster may free room");
    assert_eq!(
        creates(&plan),
        vec![(6, 1)],
        "profile 0 creates nothing more, profile 1 goes on"
    );
    assert!(!a.is_deleted(ExecutorId(1)));
    let plan = a.round(no_snapshot(), secs(123));
    assert_eq!(stuck_ids(&plan), vec![(4, false), (5, false)]);
    assert!(plan.creates.is_empty());

    // The oldest starts; the next oldest (2) is unschedulable past the timeout as well.
    pods[0] = running(1, 0, 0);
    assert!(a.round(update(&pods, &[1]), secs(124)).creates.is_empty());
    // Every pod found a node: creates go on.
    let scheduled: Vec<ExecutorPod> = pods
        .iter()
        .map(|p| ExecutorPod {
            start_blocker: None,
            ..p.clone()
        })
        .collect();
    let plan = a.round(update(&scheduled, &[2, 4, 5]), secs(125));
    assert_eq!(creates(&plan), vec![(7, 0), (8, 0)]);
    assert!(plan.stuck.is_empty());
}

#[test]
fn a_younger_unschedulable_pod_does_not_hold_its_profile() {
    let s = AllocationSettings {
        stuck_pending_timeout: Duration::from_secs(30),
        ..settings()
    };
    let mut a = allocator(s, &[(0, 2)]);
    a.round(snapshot(&[]), secs(0));
    a.round(snapshot(&[pending(1, 0, 0), unschedulable(2, 0)]), secs(1));
    a.set_targets(&targets(&[(0, 3)]));
    let plan = a.round(no_snapshot(), secs(40));
    assert_eq!(stuck_ids(&plan), vec![(2, false)]);
    assert_eq!(
        creates(&plan),
        vec![(3, 0)],
        "the oldest pending pod is not stuck"
    );
}

fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "app-exec-1", "labels": {"spark-exec-id": "1", "spark-role": "executor"}},
        "spec": {"containers": [{"name": "spark-kubernetes-executor"}]},
        "status": status
    }))
    .unwrap()
}

#[test]
fn the_pod_shows_what_blocks_it_while_pending() {
    let container = |name: &str, reason: &str| {
        json!({"name": name, "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"waiting": {"reason": reason, "message": "m"}}})
    };
    let init_pulling = pod(json!({"phase": "Pending",
        "initContainerStatuses": [container("init", "ErrImagePull")],
        "containerStatuses": [container("spark-kubernetes-executor", "PodInitializing")]}));
    assert_eq!(
        start_blocker(&init_pulling),
        Some(StartBlocker::ContainerWaiting {
            reason: "ErrImagePull".into(),
            message: Some("m".into())
        })
    );
    let no_node = pod(
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
        "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}]}),
    );
    assert_eq!(
        start_blocker(&no_node),
        Some(StartBlocker::Unschedulable {
            message: Some("0/3 nodes are available".into())
        })
    );
    let crash_loop = pod(json!({"phase": "Pending",
        "containerStatuses": [container("spark-kubernetes-executor", "CrashLoopBackOff")]}));
    assert_eq!(start_blocker(&crash_loop), None);

    let rules = StateRules::default();
    let executor = executor_pod_from(&no_node, &rules).unwrap();
    assert!(executor.start_blocker.is_some());
    let mut running = no_node.clone();
    if let Some(status) = running.status.as_mut() {
        status.phase = Some("Running".into());
    }
    assert_eq!(
        executor_pod_from(&running, &rules).unwrap().start_blocker,
        None
    );
}
