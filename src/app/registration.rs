//! An application's registration as kept in Kubernetes, so a restarted service resumes
//! every application by itself: what Start asked for (effective settings, templates of
//! every profile, including those added later), the targets and the executors registered
//! with the driver. Stored as JSON under the data key [`REGISTRATION_KEY`] of the
//! application's ConfigMap ([`crate::k8s::IdRecord::config_map_name`]), owned by the
//! driver pod when there is one.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use super::{AppId, StartApplication};
use crate::allocator::{AllocationPolicy, AllocationSettings, ExecutorId, ResourceProfileId};

/// Data key of the registration in the application's ConfigMap.
pub const REGISTRATION_KEY: &str = "registration";

/// What a restarted service needs to resume an application.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub app_id: String,
    pub namespace: String,
    pub driver_pod_name: Option<String>,
    pub pod_name_prefix: Option<String>,
    pub settings: StoredSettings,
    /// Pod templates per resource profile.
    pub templates: BTreeMap<i32, Pod>,
    pub targets: BTreeMap<i32, u32>,
    /// Executors registered with the driver.
    pub registered: BTreeSet<u64>,
    /// The identity that started the application (absent: started unauthenticated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// [`AllocationSettings`] as stored (durations in milliseconds).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSettings {
    pub batch_size: u32,
    pub batch_delay_ms: u64,
    pub executor_timeout_ms: u64,
    pub executor_idle_timeout_ms: u64,
    pub max_pending_pods: Option<u32>,
    pub max_pending_pods_per_profile: Option<u32>,
    pub max_executors: Option<u64>,
    pub delete_on_termination: bool,
    pub executor_container_name: String,
    pub check_all_containers: bool,
    /// Absent in registrations written before the policy existed: SPARK.
    #[serde(default)]
    pub policy: AllocationPolicy,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl From<&AllocationSettings> for StoredSettings {
    fn from(s: &AllocationSettings) -> Self {
        Self {
            batch_size: s.batch_size,
            batch_delay_ms: ms(s.batch_delay),
            executor_timeout_ms: ms(s.executor_timeout),
            executor_idle_timeout_ms: ms(s.executor_idle_timeout),
            max_pending_pods: s.max_pending_pods,
            max_pending_pods_per_profile: s.max_pending_pods_per_profile,
            max_executors: s.max_executors,
            delete_on_termination: s.delete_on_termination,
            executor_container_name: s.executor_container_name.clone(),
            check_all_containers: s.check_all_containers,
            policy: s.policy,
        }
    }
}

impl From<&StoredSettings> for AllocationSettings {
    fn from(s: &StoredSettings) -> Self {
        Self {
            batch_size: s.batch_size,
            batch_delay: Duration::from_millis(s.batch_delay_ms),
            executor_timeout: Duration::from_millis(s.executor_timeout_ms),
            executor_idle_timeout: Duration::from_millis(s.executor_idle_timeout_ms),
            max_pending_pods: s.max_pending_pods,
            max_pending_pods_per_profile: s.max_pending_pods_per_profile,
            max_executors: s.max_executors,
            delete_on_termination: s.delete_on_termination,
            executor_container_name: s.executor_container_name.clone(),
            check_all_containers: s.check_all_containers,
            policy: s.policy,
        }
    }
}

impl Registration {
    /// The registration of a Start request, before any target.
    pub fn of_start(req: &StartApplication) -> Self {
        Self {
            app_id: req.app_id.to_string(),
            namespace: req.namespace.clone(),
            driver_pod_name: req.driver_pod_name.clone(),
            pod_name_prefix: req.pod_name_prefix.clone(),
            settings: StoredSettings::from(&req.settings),
            templates: req
                .templates
                .iter()
                .map(|(p, t)| (p.0, t.clone()))
                .collect(),
            targets: BTreeMap::new(),
            registered: BTreeSet::new(),
            owner: req.owner.clone(),
        }
    }

    /// The Start request that resumes it; an invalid application id is an error.
    pub fn start_request(&self) -> Result<StartApplication, String> {
        // A ConfigMap is outside input: its settings get the checks a Start request gets.
        let settings = AllocationSettings::from(&self.settings);
        settings.validate().map_err(|e| format!("settings: {e}"))?;
        Ok(StartApplication {
            app_id: AppId::parse(&self.app_id).map_err(|e| format!("app_id: {e}"))?,
            namespace: self.namespace.clone(),
            driver_pod_name: self.driver_pod_name.clone(),
            templates: self
                .templates
                .iter()
                .map(|(p, t)| (ResourceProfileId(*p), t.clone()))
                .collect(),
            pod_name_prefix: self.pod_name_prefix.clone(),
            settings,
            owner: self.owner.clone(),
        })
    }

    /// The stored targets.
    pub fn targets(&self) -> BTreeMap<ResourceProfileId, u32> {
        self.targets
            .iter()
            .map(|(p, t)| (ResourceProfileId(*p), *t))
            .collect()
    }

    /// The stored registered executors.
    pub fn registered(&self) -> BTreeSet<ExecutorId> {
        self.registered.iter().map(|id| ExecutorId(*id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_round_trips_through_json() {
        let template: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}]}
        }))
        .unwrap();
        let req = StartApplication {
            app_id: AppId::parse("app-1").unwrap(),
            namespace: "ns".into(),
            driver_pod_name: Some("driver".into()),
            templates: BTreeMap::from([(ResourceProfileId(0), template)]),
            pod_name_prefix: None,
            settings: AllocationSettings {
                max_executors: Some(9),
                ..AllocationSettings::default()
            },
            owner: Some("system:serviceaccount:ns:driver".into()),
        };
        let mut registration = Registration::of_start(&req);
        registration.targets.insert(0, 4);
        registration.registered.insert(2);
        let json = serde_json::to_string(&registration).unwrap();
        let back: Registration = serde_json::from_str(&json).unwrap();
        assert_eq!(back, registration);
        let again = back.start_request().unwrap();
        assert_eq!(again.settings, req.settings);
        assert_eq!(again.templates, req.templates);
        assert_eq!(again.owner, req.owner);
        assert_eq!(back.targets(), BTreeMap::from([(ResourceProfileId(0), 4)]));
        assert_eq!(back.registered(), BTreeSet::from([ExecutorId(2)]));
    }

    #[test]
    fn a_stored_registration_with_invalid_settings_is_refused_naming_the_setting() {
        let req = StartApplication {
            app_id: AppId::parse("app-1").unwrap(),
            namespace: "ns".into(),
            driver_pod_name: None,
            templates: BTreeMap::new(),
            pod_name_prefix: None,
            settings: AllocationSettings::default(),
            owner: None,
        };
        let mut registration = Registration::of_start(&req);
        registration.settings.batch_size = 0;
        let err = registration.start_request().unwrap_err();
        assert!(err.contains("batch_size"), "{err}");
        registration.settings.batch_size = 5;
        registration.settings.batch_delay_ms = 1;
        let err = registration.start_request().unwrap_err();
        assert!(err.contains("batch_delay_ms"), "{err}");
    }
}
