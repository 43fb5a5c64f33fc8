//! The one error type of the application layer; the gRPC edge maps it to a status code.

use crate::allocator::SettingsError;

/// Why an application call failed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// No application with this id runs here.
    #[error("application {0} is not running in this service")]
    NotFound(String),
    /// The id is already used by an application in another namespace.
    #[error("application {app_id} already runs in namespace {namespace}")]
    AlreadyExists { app_id: String, namespace: String },
    /// The request cannot be served in the current state (e.g. missing driver pod).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A field is invalid.
    #[error("{field}: {message}")]
    InvalidArgument { field: String, message: String },
    /// The namespace is not in the service's `allowed_namespaces`.
    #[error("{0}")]
    PermissionDenied(String),
    /// The Kubernetes API failed.
    #[error("kubernetes: {}", crate::k8s::describe_error(.0))]
    Kubernetes(#[from] kube::Error),
    /// The caller sent no valid credentials (auth.mode = kubernetes).
    #[error("{0}")]
    Unauthenticated(String),
    /// A dependency of the call (TokenReview, SubjectAccessReview) did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// A limit of the service would be exceeded; the message starts with its configuration
    /// key (`tenants.max_applications_per_identity: …`).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The service is shutting down.
    #[error("the service is shutting down")]
    ShuttingDown,
    /// A task of the service failed (a bug). An actor that ended is `NotFound`: it ends
    /// when its application is stopped or forgotten.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A broken allocation setting names its request field (`settings.batch_size`).
impl From<SettingsError> for AppError {
    fn from(SettingsError::Invalid { name, reason }: SettingsError) -> Self {
        AppError::InvalidArgument {
            field: format!("settings.{name}"),
            message: reason,
        }
    }
}

impl AppError {
    /// The answer to a Start naming a driver pod that does not exist, or that the caller may
    /// not `get` (the same words, so the answer tells no pod name the caller could not read).
    pub fn no_driver_pod(name: &str, namespace: &str) -> Self {
        AppError::FailedPrecondition(format!(
            "No pod was found named {name} in the cluster in the namespace {namespace}"
        ))
    }
}
