//! The service's own ConfigMaps (the id record of an application without a driver pod, and
//! the registrations): the labels that mark them as the service's. The `id_record` and
//! `registrations` modules each own their ConfigMap's name, data keys, writes and deletion.
use std::collections::BTreeMap;

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
