//! The one place where application errors become gRPC statuses, so every RPC answers the
//! same failure with the same code.
use tonic::{Code, Status};

use crate::app::AppError;

/// The status a driver sees for `err`; Kubernetes failures keep the API server's message.
pub fn to_status(err: AppError) -> Status {
    match err {
        AppError::NotFound(_) => Status::not_found(err.to_string()),
        AppError::AlreadyExists { .. } => Status::already_exists(err.to_string()),
        AppError::FailedPrecondition(message) => Status::failed_precondition(message),
        AppError::InvalidArgument { .. } => Status::invalid_argument(err.to_string()),
        AppError::PermissionDenied(message) => Status::permission_denied(message),
        AppError::ShuttingDown => Status::unavailable(err.to_string()),
        AppError::Internal(_) => Status::internal(err.to_string()),
        AppError::Kubernetes(kube_err) => kubernetes_status(&kube_err),
    }
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
    fn an_unreachable_api_server_is_unavailable() {
        let err = kube::Error::LinesCodecMaxLineLengthExceeded;
        let s = to_status(AppError::Kubernetes(err));
        assert_eq!(s.code(), Code::Unavailable);
    }
}
