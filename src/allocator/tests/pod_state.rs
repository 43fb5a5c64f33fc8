//! Pod → executor state, in Spark's order, on real k8s-openapi pods.
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;

fn pod(labels: Value, deleting: bool, phase: Option<&str>, statuses: Value, restart: &str) -> Pod {
    let mut meta = json!({
        "name": "app-exec-7",
        "namespace": "ns",
        "labels": labels,
        "creationTimestamp": "2026-01-02T03:04:05Z",
    });
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-02T03:05:00Z");
    }
    let mut status = json!({ "containerStatuses": statuses });
    if let Some(phase) = phase {
        status["phase"] = json!(phase);
    }
    serde_json::from_value(json!({
        "metadata": meta,
        "spec": { "restartPolicy": restart, "containers": [{ "name": "spark-kubernetes-executor" }] },
        "status": status,
    }))
    .expect("test pod")
}

fn labels() -> Value {
    json!({ "spark-exec-id": "7", "spark-exec-resourceprofile-id": "2", "spark-role": "executor" })
}

fn terminated(name: &str, code: i32) -> Value {
    json!({ "name": name, "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": code, "reason": "Error", "message": "boom" } } })
}

fn alive(name: &str) -> Value {
    json!({ "name": name, "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "state": { "running": {} } })
}

fn failed(code: i32) -> ExecutorState {
    ExecutorState::Failed {
        exit_code: Some(code),
        reason: Some("Error".into()),
        message: Some("boom".into()),
    }
}

#[test]
fn states_in_sparks_order() {
    let exec = "spark-kubernetes-executor";
    // (name, deleting, phase, container statuses, restart policy, check all, expected)
    type Case = (
        &'static str,
        bool,
        Option<&'static str>,
        Value,
        &'static str,
        bool,
        ExecutorState,
    );
    let cases: Vec<Case> = vec![
        (
            "pending",
            false,
            Some("Pending"),
            json!([]),
            "Never",
            false,
            ExecutorState::Pending,
        ),
        (
            "phase is case-insensitive",
            false,
            Some("pending"),
            json!([]),
            "Never",
            false,
            ExecutorState::Pending,
        ),
        (
            "running",
            false,
            Some("Running"),
            json!([alive(exec)]),
            "Never",
            false,
            ExecutorState::Running,
        ),
        (
            "running, no statuses",
            false,
            Some("Running"),
            json!([]),
            "Never",
            false,
            ExecutorState::Running,
        ),
        (
            "deleting a pending pod",
            true,
            Some("Pending"),
            json!([]),
            "Never",
            false,
            ExecutorState::Deleted,
        ),
        (
            "deleting without phase",
            true,
            None,
            json!([]),
            "Never",
            false,
            ExecutorState::Deleted,
        ),
        (
            "deleting a running pod keeps it running",
            true,
            Some("Running"),
            json!([]),
            "Never",
            false,
            ExecutorState::Running,
        ),
        (
            "deleting a terminating pod",
            true,
            Some("Terminating"),
            json!([]),
            "Never",
            false,
            ExecutorState::Terminating,
        ),
        (
            "executor exited 0",
            false,
            Some("Running"),
            json!([terminated(exec, 0)]),
            "Never",
            false,
            ExecutorState::Succeeded { exit_code: Some(0) },
        ),
        (
            "executor exited 52",
            false,
            Some("Running"),
            json!([terminated(exec, 52)]),
            "Never",
            false,
            failed(52),
        ),
        (
            "sidecar failed, check off",
            false,
            Some("Running"),
            json!([alive(exec), terminated("sidecar", 1)]),
            "Never",
            false,
            ExecutorState::Running,
        ),
        (
            "sidecar failed, check on",
            false,
            Some("Running"),
            json!([alive(exec), terminated("sidecar", 137)]),
            "Never",
            true,
            failed(137),
        ),
        (
            "sidecar failed, check on, restart Always",
            false,
            Some("Running"),
            json!([alive(exec), terminated("sidecar", 1)]),
            "Always",
            true,
            ExecutorState::Running,
        ),
        (
            "sidecar exited 0, check on",
            false,
            Some("Running"),
            json!([alive(exec), terminated("sidecar", 0)]),
            "Never",
            true,
            ExecutorState::Running,
        ),
        (
            "phase failed",
            false,
            Some("Failed"),
            json!([terminated(exec, 139)]),
            "Never",
            false,
            failed(139),
        ),
        (
            "phase failed, no statuses",
            false,
            Some("Failed"),
            json!([]),
            "Never",
            false,
            ExecutorState::Failed {
                exit_code: None,
                reason: None,
                message: None,
            },
        ),
        (
            "phase succeeded",
            false,
            Some("Succeeded"),
            json!([terminated(exec, 0)]),
            "Never",
            false,
            ExecutorState::Succeeded { exit_code: Some(0) },
        ),
        (
            "phase terminating",
            false,
            Some("Terminating"),
            json!([]),
            "Never",
            false,
            ExecutorState::Terminating,
        ),
        (
            "phase unknown",
            false,
            Some("Unknown"),
            json!([]),
            "Never",
            false,
            ExecutorState::Unknown,
        ),
        (
            "no phase",
            false,
            None,
            json!([]),
            "Never",
            false,
            ExecutorState::Unknown,
        ),
    ];
    for (name, deleting, phase, statuses, restart, check_all, expected) in cases {
        let rules = StateRules {
            check_all_containers: check_all,
            ..StateRules::default()
        };
        let got = executor_pod_from(&pod(labels(), deleting, phase, statuses, restart), &rules);
        assert_eq!(got.map(|e| e.state), Some(expected), "case {name}");
    }
}

#[test]
fn failed_falls_back_to_the_pod_reason() {
    let mut p = pod(labels(), false, Some("Failed"), json!([]), "Never");
    if let Some(status) = p.status.as_mut() {
        status.reason = Some("Evicted".into());
        status.message = Some("low on memory".into());
    }
    let got = executor_pod_from(&p, &StateRules::default()).map(|e| e.state);
    assert_eq!(
        got,
        Some(ExecutorState::Failed {
            exit_code: None,
            reason: Some("Evicted".into()),
            message: Some("low on memory".into())
        })
    );
}

#[test]
fn configured_executor_container_name() {
    let statuses = json!([
        terminated("spark-kubernetes-executor", 1),
        terminated("main", 0)
    ]);
    let rules = StateRules {
        executor_container: "main".into(),
        check_all_containers: false,
    };
    let got = executor_pod_from(
        &pod(labels(), false, Some("Running"), statuses, "Never"),
        &rules,
    );
    assert_eq!(
        got.map(|e| e.state),
        Some(ExecutorState::Succeeded { exit_code: Some(0) })
    );
}

#[test]
fn identity_fields() {
    let got = executor_pod_from(
        &pod(labels(), false, Some("Pending"), json!([]), "Never"),
        &StateRules::default(),
    );
    let want = ExecutorPod {
        id: ExecutorId(7),
        profile: ResourceProfileId(2),
        state: ExecutorState::Pending,
        created_at: Some(Timestamp(1_767_323_045_000)),
        pod_name: "app-exec-7".into(),
        start_blocker: None,
    };
    assert_eq!(got, Some(want));
}

#[test]
fn which_pods_are_executors() {
    type Case = (&'static str, Value, Option<(u64, i32)>);
    let cases: Vec<Case> = vec![
        ("labelled", labels(), Some((7, 2))),
        (
            "no profile label means profile 0",
            json!({ "spark-exec-id": "7" }),
            Some((7, 0)),
        ),
        (
            "no id",
            json!({ "spark-exec-resourceprofile-id": "2" }),
            None,
        ),
        ("id not a number", json!({ "spark-exec-id": "seven" }), None),
        ("id zero", json!({ "spark-exec-id": "0" }), None),
        ("id negative", json!({ "spark-exec-id": "-3" }), None),
        (
            "profile not a number",
            json!({ "spark-exec-id": "7", "spark-exec-resourceprofile-id": "x" }),
            None,
        ),
        (
            "inactive",
            json!({ "spark-exec-id": "7", "spark-exec-inactive": "true" }),
            None,
        ),
        (
            "inactive false is active",
            json!({ "spark-exec-id": "7", "spark-exec-inactive": "false" }),
            Some((7, 0)),
        ),
        ("no labels at all", json!(null), None),
    ];
    for (name, labels, expected) in cases {
        let got = executor_pod_from(
            &pod(labels, false, Some("Pending"), json!([]), "Never"),
            &StateRules::default(),
        );
        assert_eq!(got.map(|e| (e.id.0, e.profile.0)), expected, "case {name}");
    }
}

#[test]
fn default_rules() {
    let rules = StateRules::default();
    assert_eq!(rules.executor_container, "spark-kubernetes-executor");
    assert!(!rules.check_all_containers);
}

#[test]
fn finished_states() {
    let cases = [
        (ExecutorState::Pending, false),
        (ExecutorState::Running, false),
        (ExecutorState::Terminating, false),
        (ExecutorState::Unknown, false),
        (ExecutorState::Deleted, true),
        (ExecutorState::Succeeded { exit_code: Some(0) }, true),
        (
            ExecutorState::Failed {
                exit_code: Some(52),
                reason: None,
                message: None,
            },
            true,
        ),
    ];
    for (state, finished) in cases {
        assert_eq!(state.is_finished(), finished, "{state:?}");
    }
}
