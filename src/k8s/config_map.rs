//! The service's own ConfigMaps (the id record of an application without a driver pod, and
//! the registrations): the labels that mark them as the service's, and the one
//! create-or-patch both are written with. The `id_record` and `registrations` modules each
//! own their ConfigMap's name, data keys and deletion.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

use super::client::{ApiClient, is_status};
use crate::allocator::types::APP_ID_LABEL;

/// The standard label naming the manager of an object.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// [`MANAGED_BY_LABEL`] value of the objects the service owns (its ConfigMaps, the
/// registrations' key Secret), and the start of their names.
pub const MANAGED_BY: &str = "spark-pod-allocator";

/// The labels of the service's own ConfigMaps of `app_id`.
pub(super) fn managed_labels(app_id: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (APP_ID_LABEL.to_string(), app_id.to_string()),
        (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
    ])
}

/// Which request a write tries first: the one that usually succeeds, so a write usually
/// costs one request of the application's share of the rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FirstTry {
    /// The ConfigMap is probably there: merge-PATCH its data; on 404 create it, and on 409
    /// (another create won the race) PATCH again.
    Patch,
    /// The ConfigMap is probably not there yet: create it; on 409 PATCH its data.
    Create,
}

/// Writes the data of a ConfigMap `name` in `namespace`, creating it with `labels` when it
/// is not there. Labels are set on create only; a PATCH changes the data alone.
///
/// A blind merge PATCH, not a read-modify-write with resourceVersion: one actor is the only
/// writer of each of these ConfigMaps, so there is no concurrent update to detect.
pub(super) async fn write(
    api: &ApiClient,
    namespace: &str,
    name: &str,
    labels: BTreeMap<String, String>,
    data: BTreeMap<String, String>,
    first: FirstTry,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "data": &data });
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    };
    let patch_existing = || api.merge_patch::<ConfigMap>(namespace, name, &patch);
    let create_or_patch = || async {
        match api.create(namespace, &config_map).await {
            Err(err) if is_status(&err, 409) => patch_existing().await,
            other => other,
        }
    };
    match first {
        FirstTry::Patch => match patch_existing().await {
            Err(err) if is_status(&err, 404) => create_or_patch().await,
            other => other,
        },
        FirstTry::Create => create_or_patch().await,
    }
}
