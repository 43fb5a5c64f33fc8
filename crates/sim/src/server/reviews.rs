//! TokenReview and SubjectAccessReview, as kube-apiserver serves them: create-only, nothing
//! stored, the request object answered 201 Created with its `status` filled in. Identities
//! and permissions come from the `access` settings instead of service-account signing keys
//! and RBAC objects.
use http::StatusCode;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use serde_json::Value;

use super::shared::{Shared, value_response};
use crate::settings::{AccessSettings, SimGrant};
use crate::status::{ApiError, Cause};
use axum::response::Response;

/// The audience of tokens issued for the API server itself (kube-apiserver's default).
pub const DEFAULT_API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`.
pub(super) fn token_review(sh: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let mut review: TokenReview = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("unable to decode TokenReview: {e}")))?;
    let token = review.spec.token.clone().unwrap_or_default();
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in package \"authentication.k8s.io\"",
        ));
    }
    review.status = Some(review_token(
        &sh.settings.access,
        &token,
        review.spec.audiences.as_deref().unwrap_or_default(),
    ));
    answer(&review)
}

/// What the API server says of `token` for a client asking about `requested` audiences.
fn review_token(access: &AccessSettings, token: &str, requested: &[String]) -> TokenReviewStatus {
    let api_audience = if access.api_audience.is_empty() {
        DEFAULT_API_AUDIENCE.to_string()
    } else {
        access.api_audience.clone()
    };
    // No requested audiences means the API server's own.
    let requested: Vec<String> = if requested.is_empty() {
        vec![api_audience.clone()]
    } else {
        requested.to_vec()
    };
    let refused = |error: &str| TokenReviewStatus {
        authenticated: None,
        user: Some(UserInfo::default()),
        error: Some(error.to_string()),
        audiences: None,
    };
    let Some(known) = access.tokens.iter().find(|t| t.token == token) else {
        return refused("[invalid bearer token, token lookup failed]");
    };
    let issued_for: Vec<String> = if known.audiences.is_empty() {
        vec![api_audience]
    } else {
        known.audiences.clone()
    };
    let matching: Vec<String> = requested
        .iter()
        .filter(|a| issued_for.contains(a))
        .cloned()
        .collect();
    if matching.is_empty() {
        return refused("[invalid bearer token, token audiences is invalid]");
    }
    TokenReviewStatus {
        authenticated: Some(true),
        user: Some(UserInfo {
            username: Some(known.username.clone()),
            uid: (!known.uid.is_empty()).then(|| known.uid.clone()),
            groups: Some(known.groups.clone()),
            extra: None,
        }),
        error: None,
        audiences: Some(matching),
    }
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
pub(super) fn subject_access_review(sh: &Shared, body: &[u8]) -> Result<Response, ApiError> {
    let mut review: SubjectAccessReview = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("unable to decode SubjectAccessReview: {e}")))?;
    let spec = &review.spec;
    let user = spec.user.clone().unwrap_or_default();
    let groups = spec.groups.clone().unwrap_or_default();
    let invalid = |field: &str, message: &str| {
        ApiError::invalid(
            "SubjectAccessReview",
            "subjectaccessreviews",
            "authorization.k8s.io",
            "",
            vec![Cause {
                reason: "FieldValueRequired",
                field: field.to_string(),
                message: message.to_string(),
            }],
        )
    };
    if user.is_empty() && groups.is_empty() {
        return Err(invalid(
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    let Some(resource) = spec.resource_attributes.clone() else {
        if spec.non_resource_attributes.is_some() {
            review.status = Some(SubjectAccessReviewStatus {
                allowed: false,
                ..SubjectAccessReviewStatus::default()
            });
            return answer(&review);
        }
        return Err(invalid(
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    };
    let namespace = resource.namespace.unwrap_or_default();
    let verb = resource.verb.unwrap_or_default();
    let plural = resource.resource.unwrap_or_default();
    let name = resource.name.unwrap_or_default();
    let grant = sh
        .settings
        .access
        .grants
        .iter()
        .find(|g| grants(g, &user, &groups, &namespace, &verb, &plural, &name));
    review.status = Some(match grant {
        Some(grant) => SubjectAccessReviewStatus {
            allowed: true,
            reason: Some(format!(
                "RBAC: allowed by the simulator's grant to {}",
                subjects(grant)
            )),
            ..SubjectAccessReviewStatus::default()
        },
        // As RBAC: no rule matched, so not allowed, and no reason given.
        None => SubjectAccessReviewStatus {
            allowed: false,
            ..SubjectAccessReviewStatus::default()
        },
    });
    answer(&review)
}

/// Whether `grant` allows the question; `name` is `""` for a question about every object
/// (which a grant naming objects does not allow, as RBAC's `resourceNames`).
fn grants(
    grant: &SimGrant,
    user: &str,
    groups: &[String],
    namespace: &str,
    verb: &str,
    resource: &str,
    name: &str,
) -> bool {
    let any_or = |list: &[String], value: &str| list.iter().any(|x| x == "*" || x == value);
    let subject = (!user.is_empty() && grant.users.iter().any(|u| u == user))
        || groups.iter().any(|g| grant.groups.contains(g));
    // A namespace-less question (cluster scope) is only granted cluster-wide.
    let in_namespace = if namespace.is_empty() {
        grant.namespaces.iter().any(|n| n == "*")
    } else {
        any_or(&grant.namespaces, namespace)
    };
    let named = grant.names.is_empty() || grant.names.iter().any(|n| n == name);
    subject
        && in_namespace
        && named
        && any_or(&grant.verbs, verb)
        && any_or(&grant.resources, resource)
}

fn subjects(grant: &SimGrant) -> String {
    let mut names: Vec<String> = grant.users.iter().map(|u| format!("User {u:?}")).collect();
    names.extend(grant.groups.iter().map(|g| format!("Group {g:?}")));
    names.join(", ")
}

fn answer<T: serde::Serialize + k8s_openapi::Resource>(review: &T) -> Result<Response, ApiError> {
    let mut value = serde_json::to_value(review)
        .map_err(|e| ApiError::internal(&format!("cannot encode the review: {e}")))?;
    if let Value::Object(map) = &mut value {
        map.insert("apiVersion".into(), Value::String(T::API_VERSION.into()));
        map.insert("kind".into(), Value::String(T::KIND.into()));
        map.entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
    }
    Ok(value_response(StatusCode::CREATED, &value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::SimToken;

    fn access() -> AccessSettings {
        AccessSettings {
            tokens: vec![SimToken {
                token: "t1".into(),
                username: "alice".into(),
                uid: String::new(),
                groups: vec!["team".into()],
                audiences: vec!["allocator".into()],
            }],
            grants: vec![SimGrant {
                users: vec![],
                groups: vec!["team".into()],
                namespaces: vec!["ns".into()],
                verbs: vec!["create".into()],
                resources: vec!["pods".into()],
                names: vec![],
            }],
            api_audience: String::new(),
        }
    }

    #[test]
    fn a_token_is_accepted_only_for_its_audiences() {
        let ok = review_token(&access(), "t1", &["allocator".into()]);
        assert_eq!(ok.authenticated, Some(true));
        assert_eq!(ok.audiences, Some(vec!["allocator".to_string()]));
        let wrong = review_token(&access(), "t1", &[]);
        assert_eq!(wrong.authenticated, None);
        assert!(wrong.error.unwrap().contains("audiences"));
        let unknown = review_token(&access(), "t2", &["allocator".into()]);
        assert!(unknown.error.unwrap().contains("invalid bearer token"));
    }

    #[test]
    fn grants_match_subject_namespace_verb_and_resource() {
        let grant = &access().grants[0];
        let team = ["team".to_string()];
        assert!(grants(grant, "bob", &team, "ns", "create", "pods", ""));
        assert!(grants(grant, "bob", &team, "ns", "create", "pods", "p1"));
        assert!(!grants(grant, "bob", &team, "other", "create", "pods", ""));
        assert!(!grants(grant, "bob", &team, "ns", "delete", "pods", ""));
        assert!(!grants(grant, "bob", &[], "ns", "create", "pods", ""));
        assert!(!grants(grant, "bob", &team, "", "create", "pods", ""));
        let named = SimGrant {
            names: vec!["p1".into()],
            ..grant.clone()
        };
        assert!(grants(&named, "bob", &team, "ns", "create", "pods", "p1"));
        assert!(!grants(&named, "bob", &team, "ns", "create", "pods", "p2"));
        assert!(!grants(&named, "bob", &team, "ns", "create", "pods", ""));
    }
}
