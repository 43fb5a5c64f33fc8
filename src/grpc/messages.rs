//! The application layer's answers as wire messages.
use super::error;
use crate::allocator::ExecutorState;
use crate::app::failures::STUCK;
use crate::app::{
    ApplicationStatus, CreateFailure, EventKind, ExecutorEvent, ExecutorProblem, ExecutorView,
};
use crate::proto;

/// Ids are `u64` inside and `int64` on the wire; they never come near `i64::MAX` in practice,
/// but saturating keeps a corrupt label from turning into a negative id.
pub(super) fn wire_id(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

pub(super) fn status_message(app: ApplicationStatus) -> proto::ApplicationStatus {
    let status = app.allocation;
    let mut create_failures = app.create_failures;
    let backoff_until_ms = app.backoff_until.map_or(0, |t| t.0);
    let held_by = app.held_by.map(|by| proto::BudgetHold {
        budget: by.budget,
        resource: by.resource.name().into(),
        used: by.used,
        limit: by.limit,
        share: by.share,
    });
    proto::ApplicationStatus {
        failed_executors: app
            .failed_executors
            .into_iter()
            .map(|f| proto::ExecutorFailure {
                executor_id: wire_id(f.executor_id.0),
                resource_profile_id: f.profile.0,
                pod_name: f.pod_name,
                state: match f.problem {
                    ExecutorProblem::Failed => "Failed",
                    ExecutorProblem::Waiting => "Waiting",
                    ExecutorProblem::Stuck => "Stuck",
                    ExecutorProblem::Unschedulable => "Unschedulable",
                }
                .into(),
                exit_code: f.exit_code,
                reason: f.reason.unwrap_or_default(),
                message: f.message.unwrap_or_default(),
                time_ms: f.at.0,
            })
            .collect(),
        driver: app.driver.map(|d| proto::DriverStatus {
            pod_name: d.pod_name,
            phase: d.phase.unwrap_or_default(),
            // Every driver pod named at Start is followed (Start labels it, or is refused).
            followed: true,
            ended_at_ms: d.ended_at.map_or(0, |t| t.0),
            forget_at_ms: d.forget_at.map_or(0, |t| t.0),
        }),
        profiles: status
            .profiles
            .into_iter()
            .map(|(profile, c)| proto::ProfileStatus {
                resource_profile_id: profile.0,
                target: c.target,
                running: c.running,
                pending: c.pending,
                newly_created: c.newly_created,
                held: c.held,
                held_by: held_by.clone().filter(|_| c.held > 0),
                borrowed: c.borrowed,
                reclaiming: c.reclaiming,
                backoff_until_ms: create_failures
                    .get(&profile)
                    .filter(|f| f.consecutive > 0)
                    .map_or(0, |_| backoff_until_ms),
                last_create_failure: create_failures.remove(&profile).map(create_failure),
            })
            .collect(),
        deleted_executor_ids: status.deleted.into_iter().map(|id| wire_id(id.0)).collect(),
        last_executor_id: wire_id(status.last_executor_id),
        outstanding: status.outstanding,
    }
}

fn create_failure(f: CreateFailure) -> proto::CreateFailure {
    let code = match f.http_code {
        Some(http) => error::api_code(http, &f.reason),
        None if f.reason == "IdNotRecorded" || f.reason == STUCK => tonic::Code::FailedPrecondition,
        None => tonic::Code::Unavailable,
    };
    proto::CreateFailure {
        http_code: f.http_code.map_or(0, u32::from),
        code: error::code_name(code).into(),
        reason: f.reason,
        message: f.message,
        time_ms: f.at.0,
        consecutive_failures: f.consecutive,
        total_failures: f.total,
    }
}

/// One executor event on the wire.
pub(super) fn executor_event(event: ExecutorEvent) -> proto::ExecutorEvent {
    let kind = match event.kind {
        EventKind::Snapshot => proto::ExecutorEventKind::Snapshot,
        EventKind::Synced => proto::ExecutorEventKind::Synced,
        EventKind::Updated => proto::ExecutorEventKind::Updated,
        EventKind::Deleted => proto::ExecutorEventKind::Deleted,
        EventKind::Reclaim => proto::ExecutorEventKind::Reclaim,
    };
    proto::ExecutorEvent {
        sequence: event.sequence,
        kind: kind.into(),
        executor: event.executor.map(|view| executor_pod(&view)),
        reclaim: event.reclaim.map(|r| proto::ExecutorReclaim {
            deadline_ms: r.deadline_ms,
            budget: r.budget.to_string(),
        }),
    }
}

fn executor_pod(view: &ExecutorView) -> proto::ExecutorPod {
    use proto::ExecutorPodState as Wire;
    let executor = &view.executor;
    let (state, exit_code, reason, message) = match &executor.state {
        ExecutorState::Pending => match &executor.start_blocker {
            Some(blocker) => (
                Wire::Pending,
                None,
                Some(blocker.reason().to_string()),
                blocker.message().map(str::to_string),
            ),
            None => (Wire::Pending, None, None, None),
        },
        ExecutorState::Running => (Wire::Running, None, None, None),
        ExecutorState::Succeeded { exit_code } => (Wire::Succeeded, *exit_code, None, None),
        ExecutorState::Failed {
            exit_code,
            reason,
            message,
        } => (Wire::Failed, *exit_code, reason.clone(), message.clone()),
        ExecutorState::Deleted => (Wire::Deleted, None, None, None),
        ExecutorState::Terminating => (Wire::Terminating, None, None, None),
        ExecutorState::Unknown => (Wire::Unknown, None, None, None),
    };
    let pod_json = view.pod_json.to_string();
    proto::ExecutorPod {
        executor_id: wire_id(executor.id.0),
        resource_profile_id: executor.profile.0,
        pod_name: executor.pod_name.clone(),
        phase: view.phase.clone().unwrap_or_default(),
        state: state.into(),
        exit_code,
        reason: reason.unwrap_or_default(),
        message: message.unwrap_or_default(),
        pod_json,
    }
}
