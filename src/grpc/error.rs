//! The one place where application errors become gRPC statuses, so every RPC answers the
//! same failure with the same code.
use tonic::{Code, Status};

use crate::app::AppError;

/// Trailer of an UNAVAILABLE answer: when to try again, in ms (gRPC's retry pushback).
pub const RETRY_PUSHBACK_METADATA: &str = "grpc-retry-pushback-ms";

/// The retry hint of an UNAVAILABLE answer of this service's own (a shard changing hands, a
/// replica shutting down): a second, well within a failover's lease.
pub fn retry_pushback() -> tonic::metadata::MetadataValue<tonic::metadata::Ascii> {
    tonic::metadata::MetadataValue::from_static("1000")
}

/// The status a driver sees for `err`; Kubernetes failures keep the API server's message.
pub fn to_status(err: AppError) -> Status {
    let retry_hint = matches!(err, AppError::Unavailable(_) | AppError::ShuttingDown);
    let mut status = status_of(err);
    if retry_hint {
        status
            .metadata_mut()
            .insert(RETRY_PUSHBACK_METADATA, retry_pushback());
    }
    status
}

fn status_of(err: AppError) -> Status {
    match err {
        AppError::NotFound(_) => Status::not_found(err.to_string()),
        AppError::AlreadyExists { .. } => Status::already_exists(err.to_string()),
        AppError::FailedPrecondition(message) => Status::failed_precondition(message),
        AppError::InvalidArgument { .. } => Status::invalid_argument(err.to_string()),
        AppError::PermissionDenied(message) => Status::permission_denied(message),
        AppError::Unauthenticated(message) => Status::unauthenticated(message),
        AppError::Unavailable(message) => Status::unavailable(message),
        AppError::ResourceExhausted(message) => Status::resource_exhausted(message),
        AppError::ShuttingDown => Status::unavailable(err.to_string()),
        AppError::Internal(_) => Status::internal(err.to_string()),
        AppError::Kubernetes(kube_err) => kubernetes_status(&kube_err),
    }
}

/// The status of a failed call, logged once: a client's mistake at info with the request
/// field it concerns (visible at the default level without alarming anyone), a failure of
/// ours or of Kubernetes at warn.
pub fn failed_call(err: AppError) -> Status {
    let blame = blame(&err);
    let status = to_status(err);
    let code = code_name(status.code());
    match blame {
        Blame::Client { field } => {
            tracing::info!(code, field, detail = status.message(), "refused")
        }
        Blame::Service => tracing::warn!(code, detail = status.message(), "failed"),
    }
    status
}

/// Whose mistake a failed call is.
#[derive(Debug, PartialEq, Eq)]
enum Blame {
    /// The request is wrong for this service or its state; `field` is the request field it
    /// concerns, when one can be named.
    Client { field: Option<String> },
    /// The service or the Kubernetes API failed.
    Service,
}

fn blame(err: &AppError) -> Blame {
    let field = match err {
        AppError::InvalidArgument { field, .. } => Some(field.clone()),
        AppError::NotFound(_) | AppError::AlreadyExists { .. } => {
            Some("application_id".to_string())
        }
        AppError::PermissionDenied(_) => Some("namespace".to_string()),
        AppError::Unauthenticated(_) => Some("authorization".to_string()),
        AppError::FailedPrecondition(message) | AppError::ResourceExhausted(message) => {
            field_prefix(message).map(str::to_string)
        }
        AppError::Kubernetes(_)
        | AppError::ShuttingDown
        | AppError::Unavailable(_)
        | AppError::Internal(_) => {
            return Blame::Service;
        }
    };
    Blame::Client { field }
}

/// `executors_per_profile[1]` of `executors_per_profile[1]: resource profile 1 has no …`:
/// the field path a message starts with, if it starts with one.
fn field_prefix(message: &str) -> Option<&str> {
    let (head, _) = message.split_once(": ")?;
    let is_path = !head.is_empty()
        && head.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'[' | b']')
        });
    is_path.then_some(head)
}

/// The gRPC code of an API server answer (HTTP status and reason).
pub fn api_code(http_code: u16, reason: &str) -> Code {
    match (http_code, reason) {
        (403, _) => Code::PermissionDenied,
        (404, _) => Code::NotFound,
        (409, "AlreadyExists") => Code::AlreadyExists,
        (409, _) => Code::Aborted,
        (422, _) => Code::InvalidArgument,
        (429, _) => Code::ResourceExhausted,
        _ => Code::Unavailable,
    }
}

/// A code's name as the gRPC spec spells it (`PERMISSION_DENIED`).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn kubernetes_status(err: &kube::Error) -> Status {
    match err {
        kube::Error::Api(status) => {
            let code = api_code(status.code, &status.reason);
            let message = if status.message.is_empty() {
                "no message"
            } else {
                &status.message
            };
            Status::new(
                code,
                format!(
                    "kubernetes API {} {}: {message}",
                    status.code, status.reason
                ),
            )
        }
        other => Status::unavailable(format!("kubernetes API unreachable: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, reason: &str, message: &str) -> AppError {
        AppError::Kubernetes(kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        ))
    }

    #[test]
    fn application_errors_get_their_codes() {
        assert_eq!(
            to_status(AppError::NotFound("a".into())).code(),
            Code::NotFound
        );
        assert_eq!(
            to_status(AppError::AlreadyExists {
                app_id: "a".into(),
                namespace: "n".into()
            })
            .code(),
            Code::AlreadyExists
        );
        let s = to_status(AppError::FailedPrecondition(
            "No pod was found named d".into(),
        ));
        assert_eq!(
            (s.code(), s.message()),
            (Code::FailedPrecondition, "No pod was found named d")
        );
        let s = to_status(AppError::InvalidArgument {
            field: "settings.batch_size".into(),
            message: "must be > 0".into(),
        });
        assert_eq!(
            (s.code(), s.message()),
            (Code::InvalidArgument, "settings.batch_size: must be > 0")
        );
        assert_eq!(to_status(AppError::ShuttingDown).code(), Code::Unavailable);
        let s = to_status(AppError::PermissionDenied(
            "namespace kube-system is not allowed".into(),
        ));
        assert_eq!(
            (s.code(), s.message()),
            (
                Code::PermissionDenied,
                "namespace kube-system is not allowed"
            )
        );
        assert_eq!(
            to_status(AppError::Internal("actor ended".into())).code(),
            Code::Internal
        );
    }

    #[test]
    fn kubernetes_errors_keep_the_api_servers_message() {
        let quota = "pods \"q4\" is forbidden: exceeded quota: rq, requested: pods=1, used: pods=1, limited: pods=1";
        let cases = [
            (403, "Forbidden", Code::PermissionDenied),
            (404, "NotFound", Code::NotFound),
            (409, "AlreadyExists", Code::AlreadyExists),
            (409, "Conflict", Code::Aborted),
            (422, "Invalid", Code::InvalidArgument),
            (429, "TooManyRequests", Code::ResourceExhausted),
            (500, "InternalError", Code::Unavailable),
            (410, "Expired", Code::Unavailable),
        ];
        for (http, reason, code) in cases {
            let s = to_status(api(http, reason, quota));
            assert_eq!(s.code(), code, "{http} {reason}");
            assert!(s.message().contains(quota), "{}", s.message());
        }
    }

    #[test]
    fn client_mistakes_name_their_field_and_failures_are_the_services() {
        let client = |field: Option<&str>| Blame::Client {
            field: field.map(str::to_string),
        };
        let cases = [
            (
                AppError::InvalidArgument {
                    field: "settings.batch_size".into(),
                    message: "must be greater than 0".into(),
                },
                client(Some("settings.batch_size")),
            ),
            (
                AppError::NotFound("a".into()),
                client(Some("application_id")),
            ),
            (
                AppError::AlreadyExists {
                    app_id: "a".into(),
                    namespace: "n".into(),
                },
                client(Some("application_id")),
            ),
            (
                AppError::PermissionDenied("namespace x is not allowed".into()),
                client(Some("namespace")),
            ),
            (
                AppError::FailedPrecondition(
                    "executors_per_profile[1]: resource profile 1 has no executor pod template"
                        .into(),
                ),
                client(Some("executors_per_profile[1]")),
            ),
            (
                AppError::FailedPrecondition(
                    "No pod was found named d in the cluster in the namespace n".into(),
                ),
                client(None),
            ),
            (AppError::ShuttingDown, Blame::Service),
            (AppError::Internal("actor ended".into()), Blame::Service),
            (api(422, "Invalid", "bad pod"), Blame::Service),
        ];
        for (err, expected) in cases {
            let shown = err.to_string();
            assert_eq!(blame(&err), expected, "{shown}");
        }
    }

    #[test]
    fn an_unreachable_api_server_is_unavailable() {
        let err = kube::Error::LinesCodecMaxLineLengthExceeded;
        let s = to_status(AppError::Kubernetes(err));
        assert_eq!(s.code(), Code::Unavailable);
    }
}
