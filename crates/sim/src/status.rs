//! Kubernetes `Status` errors: every failure the simulated API server answers is one of these,
//! with the `reason` and `code` a real kube-apiserver uses.

use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::{Value, json};

/// One field-level problem of a 422 Invalid answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    /// e.g. `FieldValueRequired`, `FieldValueInvalid`.
    pub reason: &'static str,
    /// The field path, e.g. `spec.containers`.
    pub field: String,
    /// What is wrong, e.g. `Required value`.
    pub message: String,
}

/// A failure answered as a Kubernetes `Status` object.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// HTTP status code, repeated in the body's `code`.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message in the real server's wording.
    pub message: String,
    /// The `details` object, when the real server sends one.
    pub details: Option<Value>,
    /// Seconds for a `Retry-After` header (429).
    pub retry_after: Option<u64>,
    /// Sent as a plain-text body, not a `Status`: API Priority and Fairness rejects so.
    pub plain_text: bool,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> ApiError {
        ApiError {
            code,
            reason,
            message,
            details: None,
            retry_after: None,
            plain_text: false,
        }
    }

    fn with_details(mut self, details: Value) -> ApiError {
        self.details = Some(details);
        self
    }

    /// 404 for a named object of a resource (`pods "x" not found`).
    pub fn not_found(resource: &str, group: &str, name: &str) -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(resource, group)),
        )
        .with_details(named_details(resource, group, name))
    }

    /// 404 for a path the server does not serve.
    pub fn no_route() -> ApiError {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource".into(),
        )
        .with_details(json!({}))
    }

    /// 409 when creating a name that is taken.
    pub fn already_exists(resource: &str, group: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(resource, group)),
        )
        .with_details(named_details(resource, group, name))
    }

    /// 409 when an update carries a stale resourceVersion.
    pub fn conflict(resource: &str, group: &str, name: &str) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                qualified(resource, group)
            ),
        )
        .with_details(named_details(resource, group, name))
    }

    /// 409 with a free message (e.g. binding an already bound pod).
    pub fn conflict_message(resource: &str, group: &str, name: &str, message: String) -> ApiError {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {message}",
                qualified(resource, group)
            ),
        )
        .with_details(named_details(resource, group, name))
    }

    /// 422 with one cause per invalid field.
    pub fn invalid(
        kind: &str,
        resource: &str,
        group: &str,
        name: &str,
        causes: Vec<Cause>,
    ) -> ApiError {
        let summary: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if summary.len() == 1 {
            summary[0].clone()
        } else {
            format!("[{}]", summary.join(", "))
        };
        let mut details = named_details(resource, group, name);
        details["kind"] = Value::String(kind.to_string());
        details["causes"] = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {joined}"),
        )
        .with_details(details)
    }

    /// 400 for a malformed request (bad selector, bad body, name mismatch).
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message.into())
    }

    /// 405 for a verb a resource does not support.
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource".into(),
        )
        .with_details(json!({}))
    }

    /// 415 for a body format the server does not understand (protobuf, unknown patch type).
    pub fn unsupported_media_type(content_type: &str, accepted: &str) -> ApiError {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {accepted} (got {content_type:?})"
            ),
        )
    }

    /// 401 for a missing or unknown bearer token.
    pub fn unauthorized() -> ApiError {
        ApiError::new(401, "Unauthorized", "Unauthorized".into())
    }

    /// 403 as a ResourceQuota admission refusal.
    pub fn exceeded_quota(name: &str, used: usize) -> ApiError {
        ApiError::new(
            403,
            "Forbidden",
            format!("pods \"{name}\" is forbidden: exceeded quota: sim-quota, requested: pods=1, used: pods={used}, limited: pods={used}"),
        )
        .with_details(json!({"name": name, "kind": "pods"}))
    }

    /// 403 for a creation in a namespace being deleted.
    pub fn forbidden(resource: &str, group: &str, name: &str, message: String) -> ApiError {
        ApiError::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {message}",
                qualified(resource, group)
            ),
        )
        .with_details(named_details(resource, group, name))
    }

    /// 410 for a list at a compacted resourceVersion or an expired continue token.
    pub fn expired(message: String) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 429 with `Retry-After`, as the API priority and fairness filter sends.
    pub fn too_many_requests(retry_after: u64) -> ApiError {
        let mut e = ApiError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.".into(),
        )
        .with_details(json!({"retryAfterSeconds": retry_after}));
        e.retry_after = Some(retry_after);
        e
    }

    /// 429 as API Priority and Fairness rejects a request it will not queue: a plain-text
    /// body (no `Status`, so no `retryAfterSeconds`) and a `Retry-After` header.
    pub fn flow_control_rejected(retry_after: u64) -> ApiError {
        let mut e = ApiError::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.".into(),
        );
        e.retry_after = Some(retry_after);
        e.plain_text = true;
        e
    }

    /// 500 as an injected internal error.
    pub fn internal(message: &str) -> ApiError {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
        .with_details(json!({"causes": [{"message": message}]}))
    }

    /// The `Status` object itself (also sent inside a watch ERROR event).
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

fn named_details(resource: &str, group: &str, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": resource});
    if !group.is_empty() {
        d["group"] = Value::String(group.to_string());
    }
    d
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (body, content_type) = if self.plain_text {
            (format!("{}\n", self.message), "text/plain; charset=utf-8")
        } else {
            (self.to_status().to_string(), "application/json")
        };
        let mut resp = (code, body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        if let Some(secs) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}
