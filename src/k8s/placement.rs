//! What Start asks the cluster about where an application runs: whether its namespace
//! exists, and its driver pod, which Start labels so that the namespace's driver watch
//! follows it ([`FOLLOWED_DRIVER_LABEL`]). Sent through the service's [`ApiClient`].
use k8s_openapi::api::core::v1::{Namespace, Pod};

use super::client::{ApiClient, is_status};
use super::watch::{FOLLOWED_DRIVER_LABEL, FOLLOWED_DRIVER_VALUE};
use super::{describe_error, labels};

/// Whether `namespace` exists; `None` when the service may not read namespaces (403),
/// so it cannot tell. (A LIST of pods in a missing namespace is an empty list, and only
/// the creates would fail, each with 404, for as long as the application runs.)
pub async fn namespace_exists(
    api: &ApiClient,
    namespace: &str,
) -> Result<Option<bool>, kube::Error> {
    let namespaces = api.cluster::<Namespace>();
    match api.policy().run(|_| namespaces.get_opt(namespace)).await {
        Ok(found) => Ok(Some(found.is_some())),
        Err(err) if is_status(&err, 403) => Ok(None),
        Err(err) => Err(err),
    }
}

/// The driver pod, or `None` when it does not exist.
pub async fn driver_pod(
    api: &ApiClient,
    namespace: &str,
    name: &str,
) -> Result<Option<Pod>, kube::Error> {
    api.get_opt::<Pod>(namespace, name).await
}

/// Puts [`FOLLOWED_DRIVER_LABEL`] on the driver pod `name` (one merge PATCH, as the id
/// record's annotation), so that the namespace's driver watch follows it.
pub async fn follow_driver(
    api: &ApiClient,
    namespace: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let patch =
        serde_json::json!({"metadata": {"labels": {FOLLOWED_DRIVER_LABEL: FOLLOWED_DRIVER_VALUE}}});
    api.merge_patch::<Pod>(namespace, name, &patch)
        .await
        .inspect_err(|err| {
            tracing::warn!(namespace, driver = name, error = %describe_error(err), "labelling the driver pod failed");
        })
}

/// Whether the driver pod carries [`FOLLOWED_DRIVER_LABEL`] already (a resumed or repeated
/// Start: no PATCH needed).
pub fn is_followed_driver(pod: &Pod) -> bool {
    labels(pod)
        .get(FOLLOWED_DRIVER_LABEL)
        .is_some_and(|v| v == FOLLOWED_DRIVER_VALUE)
}
