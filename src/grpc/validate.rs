//! Requests → typed values. Every invalid field becomes [`AppError::InvalidArgument`] naming
//! the field as the client spelled it (`settings.batch_delay_ms`, `executor_ids[2]`), so a
//! driver can tell what to fix without reading server logs. Templates are parsed and
//! checked by [`crate::app::templates`], which names their fields the same way.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::allocator::pod_policy::PodPolicy;
use crate::allocator::{AllocationPolicy, AllocationSettings, ExecutorId, ResourceProfileId};
use crate::app::limits::RequestLimits;
use crate::app::{AppError, AppId, Placement, StartApplication, templates};
use crate::naming::{dns1123_label, dns1123_subdomain, pod_name_prefix};
use crate::proto;

/// What the server fills in when a Start request leaves a field unset, and the limits
/// every request is held to. (What a template may ask for is the application layer's
/// `pod_policy`, [`crate::app::Applications::pod_policy`].)
#[derive(Debug, Clone, Default)]
pub struct StartDefaults {
    /// Allocation settings under the request's `settings`.
    pub settings: AllocationSettings,
    /// The executor pod template used when `executor_pod_template` is empty.
    pub executor_pod_template: Option<Pod>,
    /// How much work one request may cause.
    pub limits: RequestLimits,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> AppError {
    AppError::InvalidArgument {
        field: field.into(),
        message: message.into(),
    }
}

/// The `application_id` of any request.
pub fn application_id(value: &str) -> Result<AppId, AppError> {
    AppId::parse(value).map_err(|reason| invalid("application_id", reason))
}

/// What a Start is about, read before anything else of it so that it can be authorized
/// before its templates are: the application, its namespace and its driver pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartTarget {
    pub app_id: AppId,
    pub placement: Placement,
}

/// Start's `application_id`, `namespace` and `driver_pod_name`, checked without reading
/// any other field (no template is touched).
pub fn start_target(req: &proto::StartRequest) -> Result<StartTarget, AppError> {
    let app_id = application_id(&req.application_id)?;
    if req.namespace.is_empty() {
        return Err(invalid("namespace", "must not be empty"));
    }
    dns1123_label(&req.namespace).map_err(|reason| invalid("namespace", reason))?;
    let driver_pod_name = if req.driver_pod_name.is_empty() {
        None
    } else {
        dns1123_subdomain(&req.driver_pod_name)
            .map_err(|reason| invalid("driver_pod_name", reason))?;
        Some(req.driver_pod_name.clone())
    };
    Ok(StartTarget {
        app_id,
        placement: Placement {
            namespace: req.namespace.clone(),
            driver_pod_name,
        },
    })
}

/// Start, once `target` (from [`start_target`]) is authorized: every other field checked,
/// templates parsed and held to `policy` where the pods go, settings merged over the
/// server defaults.
pub fn start(
    req: proto::StartRequest,
    target: StartTarget,
    defaults: &StartDefaults,
    policy: &PodPolicy,
) -> Result<StartApplication, AppError> {
    let StartTarget { app_id, placement } = target;
    let pod_name_prefix = if req.pod_name_prefix.is_empty() {
        None
    } else {
        pod_name_prefix(&req.pod_name_prefix)
            .map_err(|reason| invalid("pod_name_prefix", reason))?;
        Some(req.pod_name_prefix)
    };

    // Before the templates: a bad setting is refused without parsing any YAML.
    let settings = settings(req.settings.as_ref(), defaults)?;
    let templates = templates::start_templates(
        &req.executor_pod_template,
        req.resource_profile_templates,
        defaults.executor_pod_template.as_ref(),
        &defaults.limits,
        policy,
        &placement,
    )?;
    let claims = templates::claim_templates(
        &req.executor_claim_templates,
        &app_id,
        &defaults.limits,
        policy,
    )?;

    Ok(StartApplication {
        app_id,
        namespace: placement.namespace,
        driver_pod_name: placement.driver_pod_name,
        templates,
        pod_name_prefix,
        settings,
        owner: None,
        claims,
    })
}

/// The request's settings over the server's, then checked by the engine's rules; the
/// lifetime executor cap defaults to, and may not exceed,
/// `limits.max_executors_per_application`.
pub fn settings(
    requested: Option<&proto::AllocationSettings>,
    server: &StartDefaults,
) -> Result<AllocationSettings, AppError> {
    let mut merged = server.settings.clone();
    if let Some(requested) = requested {
        requested_over(requested, &mut merged)?;
    }
    merged.validate()?;
    let cap = server.limits.max_executors_per_application;
    match merged.max_executors {
        None => merged.max_executors = Some(cap),
        Some(asked) if asked > cap => {
            return Err(invalid(
                "settings.max_executors",
                format!(
                    "must be at most {cap} (the service's limits.max_executors_per_application)"
                ),
            ));
        }
        Some(_) => {}
    }
    Ok(merged)
}

/// Every setting the request gives replaces the server's (the proto's optional fields:
/// unset keeps the server's). Destructured, so a new proto field cannot be forgotten here.
fn requested_over(
    requested: &proto::AllocationSettings,
    settings: &mut AllocationSettings,
) -> Result<(), AppError> {
    let proto::AllocationSettings {
        batch_size,
        batch_delay_ms,
        executor_timeout_ms,
        executor_idle_timeout_ms,
        max_pending_pods,
        max_pending_pods_per_profile,
        max_executors,
        delete_on_termination,
        executor_container_name,
        check_all_containers,
        policy: requested_policy,
        min_executors_at_once,
        stuck_pending_timeout_ms,
        driver_owns_claims,
        reuse_claims,
        wait_to_reuse_claims,
        max_claims,
        budget_weight,
    } = requested;
    let millis = |ms: &u64| Duration::from_millis(*ms);
    if let Some(v) = policy(*requested_policy)? {
        settings.policy = v;
    }
    set(&mut settings.batch_size, *batch_size);
    set(
        &mut settings.batch_delay,
        batch_delay_ms.as_ref().map(millis),
    );
    set(
        &mut settings.executor_timeout,
        executor_timeout_ms.as_ref().map(millis),
    );
    set(
        &mut settings.executor_idle_timeout,
        executor_idle_timeout_ms.as_ref().map(millis),
    );
    // A cap the request gives replaces the server's (the proto cannot say "no cap").
    set(&mut settings.max_pending_pods, max_pending_pods.map(Some));
    set(
        &mut settings.max_pending_pods_per_profile,
        max_pending_pods_per_profile.map(Some),
    );
    set(&mut settings.max_executors, max_executors.map(Some));
    set(
        &mut settings.min_executors_at_once,
        min_executors_at_once.map(Some),
    );
    set(&mut settings.delete_on_termination, *delete_on_termination);
    set(
        &mut settings.executor_container_name,
        executor_container_name.clone(),
    );
    set(&mut settings.check_all_containers, *check_all_containers);
    set(
        &mut settings.stuck_pending_timeout,
        stuck_pending_timeout_ms.as_ref().map(millis),
    );
    set(&mut settings.driver_owns_claims, *driver_owns_claims);
    set(&mut settings.reuse_claims, *reuse_claims);
    set(&mut settings.wait_to_reuse_claims, *wait_to_reuse_claims);
    set(&mut settings.max_claims, max_claims.map(Some));
    set(&mut settings.budget_weight, budget_weight.map(Some));
    Ok(())
}

/// `value`, when the request gives it (unset keeps the server's).
fn set<T>(setting: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *setting = value;
    }
}

/// `settings.policy`: unset or UNSPECIFIED keeps the default; a number outside the enum
/// is refused (a newer client's policy this server does not know).
fn policy(value: Option<i32>) -> Result<Option<AllocationPolicy>, AppError> {
    let Some(number) = value else {
        return Ok(None);
    };
    match proto::AllocationPolicy::try_from(number) {
        Ok(proto::AllocationPolicy::Unspecified) => Ok(None),
        Ok(proto::AllocationPolicy::Spark) => Ok(Some(AllocationPolicy::Spark)),
        Ok(proto::AllocationPolicy::Adaptive) => Ok(Some(AllocationPolicy::Adaptive)),
        Err(_) => Err(invalid(
            "settings.policy",
            format!("unknown allocation policy {number}; expected SPARK (1) or ADAPTIVE (2)"),
        )),
    }
}

/// A SetTotalExpected request, checked (its `application_id` is checked first, alone, by
/// [`application_id`], so that the call is authorized before any template is read).
#[derive(Debug, Clone)]
pub struct TotalExpected {
    /// Templates of profiles to register before the targets apply.
    pub templates: BTreeMap<ResourceProfileId, Pod>,
    /// Executors wanted, by profile.
    pub targets: BTreeMap<ResourceProfileId, u32>,
}

/// SetTotalExpected: templates of profiles added since Start, parsed and, given where the
/// application's pods go, held to the pod policy there as Start's are; and its targets per
/// resource profile.
pub fn set_total_expected(
    req: proto::SetTotalExpectedRequest,
    defaults: &StartDefaults,
    at: Option<(&PodPolicy, &Placement)>,
) -> Result<TotalExpected, AppError> {
    let max = defaults.limits.max_resource_profiles;
    if req.executors_per_profile.len() > max {
        return Err(invalid(
            "executors_per_profile",
            format!(
                "{} profiles: an application may have at most {max} resource profiles \
                 (the service's limits.max_resource_profiles)",
                req.executors_per_profile.len()
            ),
        ));
    }
    let mut targets = BTreeMap::new();
    let sorted: BTreeMap<i32, u32> = req.executors_per_profile.into_iter().collect();
    for (profile, count) in sorted {
        if profile < 0 {
            return Err(invalid(
                format!("executors_per_profile[{profile}]"),
                "a resource profile id must be >= 0",
            ));
        }
        targets.insert(ResourceProfileId(profile), count);
    }
    let templates =
        templates::profile_templates(req.resource_profile_templates, &defaults.limits, at)?;
    Ok(TotalExpected { templates, targets })
}

/// IsDeleted: the application and one executor id.
pub fn is_deleted(req: proto::IsDeletedRequest) -> Result<(AppId, ExecutorId), AppError> {
    let app_id = application_id(&req.application_id)?;
    let id = executor_id(&req.executor_id).map_err(|reason| invalid("executor_id", reason))?;
    Ok((app_id, id))
}

/// UpdateRegisteredExecutors: the application, the full set of registered executors and
/// the tasks running on them.
pub fn update_registered(
    req: proto::UpdateRegisteredExecutorsRequest,
) -> Result<(AppId, Registered), AppError> {
    let app_id = application_id(&req.application_id)?;
    let ids = req
        .executor_ids
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            executor_id(raw).map_err(|reason| invalid(format!("executor_ids[{i}]"), reason))
        })
        .collect::<Result<BTreeSet<_>, _>>()?;
    let running_tasks = req
        .running_tasks
        .iter()
        .map(|(raw, tasks)| {
            let id = executor_id(raw)
                .map_err(|reason| invalid(format!("running_tasks[{raw:?}]"), reason))?;
            Ok((id, *tasks))
        })
        .collect::<Result<BTreeMap<_, _>, AppError>>()?;
    Ok((app_id, (ids, running_tasks)))
}

/// The registered executors and the tasks running on them (by executor id).
pub type Registered = (BTreeSet<ExecutorId>, BTreeMap<ExecutorId, u32>);

/// An executor id as the driver sends it: a positive decimal number, nothing around it.
pub fn executor_id(raw: &str) -> Result<ExecutorId, String> {
    if raw.is_empty() {
        return Err("must not be empty".to_string());
    }
    if !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{raw:?} is not an executor id (a positive decimal number)"
        ));
    }
    match raw.parse::<u64>() {
        Ok(0) => Err("executor ids start at 1".to_string()),
        Ok(id) => Ok(ExecutorId(id)),
        Err(_) => Err(format!("{raw:?} is too large for an executor id")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::naming::MAX_POD_NAME_PREFIX;
    use std::collections::HashMap;

    /// Start under the default pod policy (the service's default).
    fn start(
        req: proto::StartRequest,
        defaults: &StartDefaults,
    ) -> Result<StartApplication, AppError> {
        let target = start_target(&req)?;
        super::start(req, target, defaults, &PodPolicy::default())
    }

    const TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n";

    fn field_of(err: AppError) -> (String, String) {
        match err {
            AppError::InvalidArgument { field, message } => (field, message),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    fn start_req() -> proto::StartRequest {
        proto::StartRequest {
            application_id: "spark-app-1".into(),
            namespace: "team-a".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        }
    }

    #[test]
    fn claim_templates_are_parsed_checked_and_refused_naming_their_entry() {
        const CLAIM: &str = "metadata:\n  name: spark-app-1-exec-{{EXECUTOR_ID}}-pvc-0\nspec:\n  storageClassName: gp3\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 10Gi\n";
        let with = |claims: &[&str]| proto::StartRequest {
            executor_claim_templates: claims.iter().map(|c| c.to_string()).collect(),
            ..start_req()
        };
        let started = start(with(&[CLAIM]), &StartDefaults::default()).unwrap();
        assert_eq!(
            started.claims[0].metadata.name.as_deref(),
            Some("spark-app-1-exec-{{EXECUTOR_ID}}-pvc-0")
        );
        let refused =
            |claims: &[&str]| field_of(start(with(claims), &StartDefaults::default()).unwrap_err());
        let (field, reason) = refused(&[CLAIM, "spec: {}"]);
        assert_eq!(field, "executor_claim_templates[1]");
        assert!(reason.contains("metadata.name"), "{reason}");
        let (field, reason) = refused(&[CLAIM, CLAIM]);
        assert_eq!(field, "executor_claim_templates[1]");
        assert!(reason.contains("twice"), "{reason}");
        let (field, reason) = refused(&["metadata:\n  name: Bad_Name\n"]);
        assert_eq!(field, "executor_claim_templates[0]");
        assert!(reason.contains("Bad_Name"), "{reason}");
        let (field, reason) = refused(&["[1, 2]"]);
        assert_eq!(field, "executor_claim_templates[0]");
        assert!(reason.contains("PersistentVolumeClaim"), "{reason}");
        let huge = CLAIM.replace("10Gi", "5Ti");
        let (field, reason) = refused(&[&huge]);
        assert_eq!(field, "executor_claim_templates[0]");
        assert!(reason.contains("max_claim_size"), "{reason}");
    }

    #[test]
    fn a_budget_weight_must_be_positive() {
        let req = proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                budget_weight: Some(0),
                ..Default::default()
            }),
            ..start_req()
        };
        let (field, _) = field_of(start(req, &StartDefaults::default()).unwrap_err());
        assert_eq!(field, "settings.budget_weight");
    }

    #[test]
    fn max_claims_must_be_positive() {
        let req = proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                max_claims: Some(0),
                ..Default::default()
            }),
            ..start_req()
        };
        let (field, _) = field_of(start(req, &StartDefaults::default()).unwrap_err());
        assert_eq!(field, "settings.max_claims");
    }

    #[test]
    fn application_id_follows_the_label_value_rule() {
        for ok in ["a", "spark-1234.x_y", "A9", &"a".repeat(63)] {
            assert!(application_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "ü", ".a", &"a".repeat(64)] {
            let (field, _) = field_of(application_id(bad).unwrap_err());
            assert_eq!(field, "application_id", "{bad}");
        }
    }

    #[test]
    fn namespace_and_driver_pod_name_follow_dns_rules() {
        assert!(dns1123_label("team-a1").is_ok());
        for bad in ["Team", "a_b", "-a", "a.b", &"a".repeat(64)] {
            assert!(dns1123_label(bad).is_err(), "{bad}");
        }
        assert!(dns1123_subdomain("driver-0.x").is_ok());
        for bad in ["Driver", "a..b", ".a", "a_b", &"a".repeat(254)] {
            assert!(dns1123_subdomain(bad).is_err(), "{bad}");
        }
        let (field, _) = field_of(
            start(
                proto::StartRequest {
                    namespace: "".into(),
                    ..start_req()
                },
                &StartDefaults::default(),
            )
            .unwrap_err(),
        );
        assert_eq!(field, "namespace");
        let (field, _) = field_of(
            start(
                proto::StartRequest {
                    namespace: "Bad_NS".into(),
                    ..start_req()
                },
                &StartDefaults::default(),
            )
            .unwrap_err(),
        );
        assert_eq!(field, "namespace");
        let (field, _) = field_of(
            start(
                proto::StartRequest {
                    driver_pod_name: "Driver!".into(),
                    ..start_req()
                },
                &StartDefaults::default(),
            )
            .unwrap_err(),
        );
        assert_eq!(field, "driver_pod_name");
    }

    #[test]
    fn a_valid_start_becomes_typed_values() {
        let mut req = start_req();
        req.driver_pod_name = "driver-0".into();
        req.pod_name_prefix = "My App".into();
        req.resource_profile_templates = HashMap::from([(2, TEMPLATE.to_string())]);
        req.settings = Some(proto::AllocationSettings {
            batch_size: Some(5),
            max_pending_pods: Some(40),
            ..Default::default()
        });
        let defaults = StartDefaults::default();
        let s = start(req, &defaults).unwrap();
        assert_eq!(s.app_id.as_str(), "spark-app-1");
        assert_eq!(s.namespace, "team-a");
        assert_eq!(s.driver_pod_name.as_deref(), Some("driver-0"));
        assert_eq!(s.pod_name_prefix.as_deref(), Some("My App"));
        assert_eq!(
            s.templates.keys().copied().collect::<Vec<_>>(),
            vec![ResourceProfileId(0), ResourceProfileId(2)]
        );
        assert_eq!(s.settings.batch_size, 5);
        assert_eq!(s.settings.max_pending_pods, Some(40));
        assert_eq!(s.settings.batch_delay, defaults.settings.batch_delay);
    }

    #[test]
    fn the_template_is_required_unless_the_server_has_one() {
        let req = proto::StartRequest {
            executor_pod_template: String::new(),
            ..start_req()
        };
        let (field, message) = field_of(start(req.clone(), &StartDefaults::default()).unwrap_err());
        assert_eq!(field, "executor_pod_template");
        assert!(message.contains("required"), "{message}");

        let default_pod = templates::parse("t", TEMPLATE, &RequestLimits::default()).unwrap();
        let defaults = StartDefaults {
            executor_pod_template: Some(default_pod.clone()),
            ..Default::default()
        };
        let s = start(req, &defaults).unwrap();
        assert_eq!(s.templates[&ResourceProfileId(0)], default_pod);
    }

    #[test]
    fn profile_templates_need_a_positive_profile_and_name_it() {
        for (profile, text) in [(-1, TEMPLATE), (0, TEMPLATE), (3, "kind: Service\n")] {
            let req = proto::StartRequest {
                resource_profile_templates: HashMap::from([(profile, text.to_string())]),
                ..start_req()
            };
            let (field, _) = field_of(start(req, &StartDefaults::default()).unwrap_err());
            assert_eq!(field, format!("resource_profile_templates[{profile}]"));
        }
    }

    #[test]
    fn settings_are_merged_then_checked_and_named() {
        let req = proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                batch_delay_ms: Some(50),
                ..Default::default()
            }),
            ..start_req()
        };
        let (field, _) = field_of(start(req, &StartDefaults::default()).unwrap_err());
        assert_eq!(field, "settings.batch_delay_ms");

        let req = proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                batch_size: Some(0),
                ..Default::default()
            }),
            ..start_req()
        };
        let (field, _) = field_of(start(req, &StartDefaults::default()).unwrap_err());
        assert_eq!(field, "settings.batch_size");

        let req = proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                max_pending_pods_per_profile: Some(3),
                min_executors_at_once: Some(4),
                ..Default::default()
            }),
            ..start_req()
        };
        let (field, reason) = field_of(start(req, &StartDefaults::default()).unwrap_err());
        assert_eq!(field, "settings.min_executors_at_once");
        assert!(reason.contains("max_pending_pods_per_profile"), "{reason}");
    }

    #[test]
    fn every_setting_given_replaces_the_servers() {
        let requested = proto::AllocationSettings {
            batch_size: Some(3),
            batch_delay_ms: Some(2_000),
            executor_timeout_ms: Some(20_000),
            executor_idle_timeout_ms: Some(7_000),
            max_pending_pods: Some(11),
            max_pending_pods_per_profile: Some(4),
            max_executors: Some(99),
            delete_on_termination: Some(false),
            executor_container_name: Some("main".into()),
            check_all_containers: Some(true),
            policy: Some(proto::AllocationPolicy::Adaptive as i32),
            min_executors_at_once: Some(4),
            stuck_pending_timeout_ms: Some(30_000),
            driver_owns_claims: Some(false),
            reuse_claims: Some(false),
            wait_to_reuse_claims: Some(true),
            max_claims: Some(8),
            budget_weight: Some(3),
        };
        let merged = settings(Some(&requested), &StartDefaults::default()).unwrap();
        assert_eq!(
            merged,
            AllocationSettings {
                batch_size: 3,
                batch_delay: Duration::from_secs(2),
                executor_timeout: Duration::from_secs(20),
                executor_idle_timeout: Duration::from_secs(7),
                max_pending_pods: Some(11),
                max_pending_pods_per_profile: Some(4),
                max_executors: Some(99),
                min_executors_at_once: Some(4),
                delete_on_termination: false,
                executor_container_name: "main".into(),
                check_all_containers: true,
                policy: AllocationPolicy::Adaptive,
                stuck_pending_timeout: Duration::from_secs(30),
                driver_owns_claims: false,
                reuse_claims: false,
                wait_to_reuse_claims: true,
                max_claims: Some(8),
                budget_weight: Some(3),
            }
        );
        let unset = settings(
            Some(&proto::AllocationSettings::default()),
            &StartDefaults::default(),
        );
        let cap = RequestLimits::default().max_executors_per_application;
        assert_eq!(
            unset.unwrap(),
            AllocationSettings {
                max_executors: Some(cap),
                ..AllocationSettings::default()
            }
        );
    }

    #[test]
    fn the_policy_is_optional_and_an_unknown_one_is_refused() {
        let with = |policy: Option<i32>| proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                policy,
                ..Default::default()
            }),
            ..start_req()
        };
        let spark_default = StartDefaults {
            settings: AllocationSettings {
                policy: AllocationPolicy::Spark,
                ..AllocationSettings::default()
            },
            ..StartDefaults::default()
        };
        // (requested, server default, effective)
        let cases = [
            (None, &StartDefaults::default(), AllocationPolicy::Adaptive),
            (
                Some(0),
                &StartDefaults::default(),
                AllocationPolicy::Adaptive,
            ),
            (Some(0), &spark_default, AllocationPolicy::Spark),
            (Some(1), &StartDefaults::default(), AllocationPolicy::Spark),
            (Some(2), &spark_default, AllocationPolicy::Adaptive),
        ];
        for (requested, defaults, expected) in cases {
            let s = start(with(requested), defaults).unwrap().settings;
            assert_eq!(s.policy, expected, "{requested:?}");
        }
        for bad in [3, -1, 99] {
            let err = start(with(Some(bad)), &StartDefaults::default()).unwrap_err();
            let (field, message) = field_of(err);
            assert_eq!(field, "settings.policy");
            assert!(message.contains(&bad.to_string()), "{message}");
        }
    }

    #[test]
    fn executor_container_settings_are_per_application() {
        let with = |name: Option<&str>, check_all: Option<bool>| proto::StartRequest {
            settings: Some(proto::AllocationSettings {
                executor_container_name: name.map(str::to_string),
                check_all_containers: check_all,
                ..Default::default()
            }),
            ..start_req()
        };
        let defaults = StartDefaults {
            settings: AllocationSettings {
                executor_container_name: "server-default".into(),
                check_all_containers: true,
                ..AllocationSettings::default()
            },
            ..Default::default()
        };
        let s = start(with(None, None), &defaults).unwrap().settings;
        assert_eq!(
            (s.executor_container_name.as_str(), s.check_all_containers),
            ("server-default", true)
        );
        let s = start(with(Some("main"), Some(false)), &defaults)
            .unwrap()
            .settings;
        assert_eq!(
            (s.executor_container_name.as_str(), s.check_all_containers),
            ("main", false)
        );
        for bad in ["", "Main", "main_1", "-main", &"m".repeat(64)] {
            let (field, _) = field_of(start(with(Some(bad), None), &defaults).unwrap_err());
            assert_eq!(field, "settings.executor_container_name", "{bad:?}");
        }
    }

    #[test]
    fn pod_name_prefix_must_leave_a_name() {
        for bad in ["---", &"a".repeat(MAX_POD_NAME_PREFIX + 1)] {
            let req = proto::StartRequest {
                pod_name_prefix: bad.to_string(),
                ..start_req()
            };
            let (field, _) = field_of(start(req, &StartDefaults::default()).unwrap_err());
            assert_eq!(field, "pod_name_prefix");
        }
    }

    #[test]
    fn executor_ids_are_positive_decimals() {
        assert_eq!(executor_id("7"), Ok(ExecutorId(7)));
        for bad in [
            "",
            "0",
            "-1",
            "+1",
            " 1",
            "1e3",
            "abc",
            "99999999999999999999999",
        ] {
            assert!(executor_id(bad).is_err(), "{bad}");
        }
        let (field, _) = field_of(
            is_deleted(proto::IsDeletedRequest {
                application_id: "a".into(),
                executor_id: "x".into(),
            })
            .unwrap_err(),
        );
        assert_eq!(field, "executor_id");
        let (field, _) = field_of(
            update_registered(proto::UpdateRegisteredExecutorsRequest {
                application_id: "a".into(),
                executor_ids: vec!["1".into(), "2".into(), "two".into()],
                running_tasks: Default::default(),
            })
            .unwrap_err(),
        );
        assert_eq!(field, "executor_ids[2]");
        let (_, (ids, tasks)) = update_registered(proto::UpdateRegisteredExecutorsRequest {
            application_id: "a".into(),
            executor_ids: vec!["3".into(), "1".into()],
            running_tasks: [("3".to_string(), 2)].into(),
        })
        .unwrap();
        assert_eq!(ids, BTreeSet::from([ExecutorId(1), ExecutorId(3)]));
        assert_eq!(tasks, BTreeMap::from([(ExecutorId(3), 2)]));
        let (field, _) = field_of(
            update_registered(proto::UpdateRegisteredExecutorsRequest {
                application_id: "a".into(),
                executor_ids: vec!["1".into()],
                running_tasks: [("x1".to_string(), 2)].into(),
            })
            .unwrap_err(),
        );
        assert_eq!(field, "running_tasks[\"x1\"]");
    }

    #[test]
    fn targets_need_non_negative_profiles() {
        let (field, _) = field_of(
            set_total_expected(
                proto::SetTotalExpectedRequest {
                    application_id: "a".into(),
                    executors_per_profile: HashMap::from([(0, 3), (-2, 1)]),
                    ..Default::default()
                },
                &StartDefaults::default(),
                None,
            )
            .unwrap_err(),
        );
        assert_eq!(field, "executors_per_profile[-2]");
        let expected = set_total_expected(
            proto::SetTotalExpectedRequest {
                application_id: "a".into(),
                executors_per_profile: HashMap::from([(0, 3), (1, 0)]),
                ..Default::default()
            },
            &StartDefaults::default(),
            None,
        )
        .unwrap();
        assert_eq!(
            expected.targets,
            BTreeMap::from([(ResourceProfileId(0), 3), (ResourceProfileId(1), 0)])
        );
        assert!(expected.templates.is_empty());
    }

    #[test]
    fn templates_given_with_targets_follow_starts_rules() {
        let request = |templates: Vec<(i32, &str)>| proto::SetTotalExpectedRequest {
            application_id: "a".into(),
            executors_per_profile: HashMap::from([(1, 2)]),
            resource_profile_templates: templates
                .into_iter()
                .map(|(p, t)| (p, t.to_string()))
                .collect(),
        };
        // (templates, the field refused, or None when accepted)
        type Case = (Vec<(i32, &'static str)>, Option<&'static str>);
        let cases: Vec<Case> = vec![
            (vec![(1, TEMPLATE), (2, TEMPLATE)], None),
            (vec![(0, TEMPLATE)], Some("resource_profile_templates[0]")),
            (vec![(-1, TEMPLATE)], Some("resource_profile_templates[-1]")),
            (
                vec![(1, TEMPLATE), (3, "kind: [")],
                Some("resource_profile_templates[3]"),
            ),
            (
                vec![(4, "spec: 7"), (3, "kind: [")],
                Some("resource_profile_templates[3]"),
            ),
        ];
        for (templates, refused) in cases {
            let what = format!("{templates:?}");
            let checked = set_total_expected(request(templates), &StartDefaults::default(), None);
            match (checked, refused) {
                (Ok(expected), None) => {
                    assert_eq!(
                        expected.templates.keys().copied().collect::<Vec<_>>(),
                        vec![ResourceProfileId(1), ResourceProfileId(2)],
                        "{what}"
                    );
                }
                (Err(err), Some(field)) => assert_eq!(field_of(err).0, field, "{what}"),
                (result, _) => panic!("{what}: unexpected {result:?}"),
            }
        }
    }
}
