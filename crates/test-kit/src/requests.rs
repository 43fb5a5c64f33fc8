//! The gRPC requests the tests send most, built one way (the Start request is
//! `grpc::start_request`, beside the template it is built on).

use std::collections::HashMap;

use spark_pod_allocator::proto;

/// SetTotalExpected of `app`: `n` executors of the default profile.
pub fn targets_request(app: impl Into<String>, n: u32) -> proto::SetTotalExpectedRequest {
    proto::SetTotalExpectedRequest {
        application_id: app.into(),
        executors_per_profile: [(0, n)].into(),
        ..Default::default()
    }
}

/// SetTotalExpected of `app` that registers profile templates and changes no target.
pub fn profiles_request(
    app: impl Into<String>,
    templates: HashMap<i32, String>,
) -> proto::SetTotalExpectedRequest {
    proto::SetTotalExpectedRequest {
        application_id: app.into(),
        executors_per_profile: Default::default(),
        resource_profile_templates: templates,
    }
}

/// GetStatus of `app`.
pub fn status_request(app: impl Into<String>) -> proto::GetStatusRequest {
    proto::GetStatusRequest {
        application_id: app.into(),
    }
}

/// IsDeleted of executor `executor_id` (as the driver sends it, a decimal string) of `app`.
pub fn is_deleted_request(
    app: impl Into<String>,
    executor_id: impl Into<String>,
) -> proto::IsDeletedRequest {
    proto::IsDeletedRequest {
        application_id: app.into(),
        executor_id: executor_id.into(),
    }
}

/// WatchExecutors of `app` from event `since`.
pub fn watch_request(app: impl Into<String>, since: u64) -> proto::WatchExecutorsRequest {
    proto::WatchExecutorsRequest {
        application_id: app.into(),
        since,
    }
}

/// Stop of `app`.
pub fn stop_request(app: impl Into<String>) -> proto::StopRequest {
    proto::StopRequest {
        application_id: app.into(),
    }
}

/// `message` sent with `authorization: Bearer <token>`.
pub fn as_caller<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("metadata value"),
    );
    request
}
