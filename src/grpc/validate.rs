//! Requests → typed values. Every invalid field becomes [`AppError::InvalidArgument`] naming
//! the field as the client spelled it (`settings.batch_delay_ms`, `executor_ids[2]`), so a
//! driver can tell what to fix without reading server logs.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Pod;

use serde::Deserialize;

use crate::allocator::pod_policy::{PodPolicy, TemplateUse};
use crate::allocator::{
    AllocationOverrides, AllocationPolicy, AllocationSettings, ExecutorId, ResourceProfileId,
};
use crate::app::{AppError, AppId, Placement, StartApplication};
use crate::naming::{dns1123_label, dns1123_subdomain, pod_name_prefix};
use crate::proto;

/// What the server fills in when a Start request leaves a field unset, and the limits
/// every request is held to. (What a template may ask for is the application layer's
/// `ServiceOptions::pod_policy`.)
#[derive(Debug, Clone, Default)]
pub struct StartDefaults {
    /// Allocation settings under the request's `settings`.
    pub settings: AllocationSettings,
    /// The executor pod template used when `executor_pod_template` is empty.
    pub executor_pod_template: Option<Pod>,
    /// How much work one request may cause.
    pub limits: RequestLimits,
}

/// Bounds on the work one request can cause (`limits` in the configuration), so that no
/// request can stall the service or hold memory without bound.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RequestLimits {
    /// Longest pod template, in bytes (default 256 KiB).
    pub max_template_bytes: usize,
    /// Deepest nesting of a template (block indentation levels plus open `[`/`{`), checked
    /// by a linear scan before the YAML parser, whose time grows with the square of the
    /// depth (default 32; a Spark executor pod nests about 10 deep).
    pub max_template_depth: usize,
    /// Resource profiles (templates) an application may have, its executor template
    /// included (default 64).
    pub max_resource_profiles: usize,
    /// Lifetime cap on the executors of an application: what `settings.max_executors`
    /// defaults to, and the most it may be set to (default 10,000).
    pub max_executors_per_application: u64,
    /// Creates one allocation round of an application may plan, over all its profiles
    /// (default 500; Spark's batch size applies per profile under it).
    pub max_creates_per_round: u32,
    /// Templates parsed at once, off the async runtime (0 = one per CPU).
    pub template_parsers: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        let service = crate::app::ServiceOptions::default();
        Self {
            max_template_bytes: 256 * 1024,
            max_template_depth: 32,
            max_resource_profiles: service.max_resource_profiles,
            max_executors_per_application: 10_000,
            max_creates_per_round: service.max_creates_per_round,
            template_parsers: 0,
        }
    }
}

impl RequestLimits {
    /// The rule a value breaks, as `(key, reason)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let positive = [
            ("max_template_bytes", self.max_template_bytes as u64),
            ("max_template_depth", self.max_template_depth as u64),
            ("max_resource_profiles", self.max_resource_profiles as u64),
            (
                "max_executors_per_application",
                self.max_executors_per_application,
            ),
            (
                "max_creates_per_round",
                u64::from(self.max_creates_per_round),
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err((key, "must be greater than 0".into()));
            }
        }
        Ok(())
    }

    /// How many templates may be parsed at once.
    pub fn parsers(&self) -> usize {
        if self.template_parsers > 0 {
            return self.template_parsers;
        }
        std::thread::available_parallelism().map_or(2, usize::from)
    }
}

fn template_use(placement: &Placement) -> TemplateUse<'_> {
    TemplateUse {
        namespace: Some(&placement.namespace),
        driver_pod_name: placement.driver_pod_name.as_deref(),
    }
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
    let field = "executor_pod_template";
    let mut templates = BTreeMap::new();
    let default_template = if req.executor_pod_template.trim().is_empty() {
        defaults.executor_pod_template.clone().ok_or_else(|| {
            invalid(
                field,
                "required: the server has no default executor pod template",
            )
        })?
    } else {
        pod_template_within(field, &req.executor_pod_template, &defaults.limits)?
    };
    allowed(field, &default_template, policy, &placement)?;
    templates.insert(ResourceProfileId(0), default_template);
    templates.extend(profile_templates(
        req.resource_profile_templates,
        defaults,
        Some((&placement, policy)),
    )?);

    Ok(StartApplication {
        app_id,
        namespace: placement.namespace,
        driver_pod_name: placement.driver_pod_name,
        templates,
        pod_name_prefix,
        settings,
        owner: None,
    })
}

/// The request's settings over the server's, then checked by the engine's rules; the
/// lifetime executor cap defaults to, and may not exceed,
/// `limits.max_executors_per_application`.
pub fn settings(
    requested: Option<&proto::AllocationSettings>,
    server: &StartDefaults,
) -> Result<AllocationSettings, AppError> {
    let defaults = &server.settings;
    let mut merged = match requested {
        Some(s) => defaults.clone().with_overrides(&AllocationOverrides {
            policy: policy(s.policy)?,
            batch_size: s.batch_size,
            batch_delay_ms: s.batch_delay_ms,
            executor_timeout_ms: s.executor_timeout_ms,
            executor_idle_timeout_ms: s.executor_idle_timeout_ms,
            max_pending_pods: s.max_pending_pods,
            max_pending_pods_per_profile: s.max_pending_pods_per_profile,
            max_executors: s.max_executors,
            delete_on_termination: s.delete_on_termination,
            executor_container_name: s.executor_container_name.clone(),
            check_all_containers: s.check_all_containers,
        }),
        None => defaults.clone(),
    };
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

/// `template` against `policy`, the error naming `field` and the path in the template.
fn allowed(
    field: &str,
    template: &Pod,
    policy: &PodPolicy,
    placement: &Placement,
) -> Result<(), AppError> {
    policy
        .check(template, template_use(placement))
        .map_err(|violation| invalid(field, violation.to_string()))
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

/// `resource_profile_templates` of Start or SetTotalExpected, parsed and, with a
/// placement (Start's), checked against the policy where the application's pods go
/// (SetTotalExpected's are checked by the application, which knows where that is): ids
/// above 0 (profile 0 is Start's `executor_pod_template`), at most
/// `limits.max_resource_profiles` of them, counted before any is parsed.
fn profile_templates(
    texts: std::collections::HashMap<i32, String>,
    defaults: &StartDefaults,
    placement: Option<(&Placement, &PodPolicy)>,
) -> Result<BTreeMap<ResourceProfileId, Pod>, AppError> {
    let max = defaults.limits.max_resource_profiles;
    if texts.len() >= max {
        return Err(invalid(
            "resource_profile_templates",
            format!(
                "{} templates: an application may have at most {max} resource profiles, \
                 profile 0 included (the service's limits.max_resource_profiles)",
                texts.len()
            ),
        ));
    }
    // Sorted, so that with several bad entries the error is always about the lowest id.
    let sorted: BTreeMap<i32, String> = texts.into_iter().collect();
    let mut templates = BTreeMap::new();
    for (profile, text) in sorted {
        let field = format!("resource_profile_templates[{profile}]");
        if profile < 0 {
            return Err(invalid(field, "a resource profile id must be >= 0"));
        }
        if profile == 0 {
            return Err(invalid(
                field,
                "resource profile 0 takes its template from Start's executor_pod_template",
            ));
        }
        let template = pod_template_within(&field, &text, &defaults.limits)?;
        if let Some((placement, policy)) = placement {
            allowed(&field, &template, policy, placement)?;
        }
        templates.insert(ResourceProfileId(profile), template);
    }
    Ok(templates)
}

/// A SetTotalExpected request, checked.
#[derive(Debug, Clone)]
pub struct TotalExpected {
    pub app_id: AppId,
    /// Templates of profiles to register before the targets apply.
    pub templates: BTreeMap<ResourceProfileId, Pod>,
    /// Executors wanted, by profile.
    pub targets: BTreeMap<ResourceProfileId, u32>,
}

/// SetTotalExpected: the application, templates of profiles added since Start (parsed;
/// the application holds them to the pod policy where its pods go), and its targets per
/// resource profile.
pub fn set_total_expected(
    req: proto::SetTotalExpectedRequest,
    defaults: &StartDefaults,
) -> Result<TotalExpected, AppError> {
    let app_id = application_id(&req.application_id)?;
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
    let templates = profile_templates(req.resource_profile_templates, defaults, None)?;
    Ok(TotalExpected {
        app_id,
        templates,
        targets,
    })
}

/// IsDeleted: the application and one executor id.
pub fn is_deleted(req: proto::IsDeletedRequest) -> Result<(AppId, ExecutorId), AppError> {
    let app_id = application_id(&req.application_id)?;
    let id = executor_id(&req.executor_id).map_err(|reason| invalid("executor_id", reason))?;
    Ok((app_id, id))
}

/// UpdateRegisteredExecutors: the application and the full set of registered executors.
pub fn update_registered(
    req: proto::UpdateRegisteredExecutorsRequest,
) -> Result<(AppId, BTreeSet<ExecutorId>), AppError> {
    let app_id = application_id(&req.application_id)?;
    let ids = req
        .executor_ids
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            executor_id(raw).map_err(|reason| invalid(format!("executor_ids[{i}]"), reason))
        })
        .collect::<Result<BTreeSet<_>, _>>()?;
    Ok((app_id, ids))
}

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

/// A Pod from YAML or JSON within the default [`RequestLimits`].
pub fn pod_template(field: &str, text: &str) -> Result<Pod, AppError> {
    pod_template_within(field, text, &RequestLimits::default())
}

/// A Pod from YAML or JSON; errors give the line and column. A template over the size or
/// nesting limit is refused before it is parsed. JSON goes to serde_json (an order of
/// magnitude faster than reading it as YAML); anything else is YAML. CPU-bound: call it
/// off the async runtime.
pub fn pod_template_within(
    field: &str,
    text: &str,
    limits: &RequestLimits,
) -> Result<Pod, AppError> {
    if text.len() > limits.max_template_bytes {
        return Err(invalid(
            field,
            format!(
                "{} bytes: a template may have at most {} (the service's limits.max_template_bytes)",
                text.len(),
                limits.max_template_bytes
            ),
        ));
    }
    if let Some(line) = too_deep(text, limits.max_template_depth) {
        return Err(invalid(
            field,
            format!(
                "nested more than {} levels deep (line {line}; the service's \
                 limits.max_template_depth)",
                limits.max_template_depth
            ),
        ));
    }
    if text.trim_start().starts_with('{') {
        return serde_json::from_str::<Pod>(text).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Data => "not a Pod",
                _ => "not valid JSON",
            };
            invalid(field, format!("{what}: {e}"))
        });
    }
    serde_yaml::from_str::<Pod>(text).map_err(|pod_error| {
        // Parsed once more only to say what is wrong: not YAML at all, or not a Pod.
        let message = match serde_yaml::from_str::<serde_yaml::Value>(text) {
            Err(e) => format!("not valid YAML or JSON: {}", yaml_error(&e)),
            Ok(value) if !value.is_mapping() => {
                "not a Pod: expected a YAML or JSON object".to_string()
            }
            Ok(_) => format!("not a Pod: {}", yaml_error(&pod_error)),
        };
        invalid(field, message)
    })
}

/// The first line (1-based) at which `text` nests deeper than `max`: block levels (by
/// indentation, and `- ` markers that open a sequence on the same line) plus open flow
/// brackets, outside quotes, comments and block scalars. A linear scan, not a parser: it
/// may count one level more than YAML does (the line a flow collection opens on) or miss
/// the sequence a key opens at its own indentation (`a:` then `- b`), so it sees at least
/// half of any real nesting, which is what keeps the parser's quadratic time bounded.
pub fn too_deep(text: &str, max: usize) -> Option<usize> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    let mut quote: Option<u8> = None;
    let mut escaped = false;
    // The indentation of the line that opened a block scalar (`|`, `>`): lines indented
    // deeper are its text.
    let mut block_scalar: Option<usize> = None;
    for (number, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let indent = bytes.iter().take_while(|b| **b == b' ').count();
        let blank = bytes[indent..].iter().all(u8::is_ascii_whitespace);
        if let Some(parent) = block_scalar {
            if blank || indent > parent {
                continue;
            }
            block_scalar = None;
        }
        let in_block = flow == 0 && quote.is_none();
        if in_block {
            if blank || bytes[indent] == b'#' {
                continue;
            }
            while indents.last().is_some_and(|top| *top >= indent) {
                indents.pop();
            }
            indents.push(indent);
        }
        // The previous byte that is not a space, on this line (none at its start).
        let mut previous: Option<u8> = None;
        let mut markers_only = true;
        let mut last = 0usize;
        for (column, &byte) in bytes.iter().enumerate().skip(indent) {
            if let Some(open) = quote {
                if escaped {
                    escaped = false;
                } else if open == b'"' && byte == b'\\' {
                    escaped = true;
                } else if byte == open {
                    quote = None;
                }
                previous = Some(byte);
                last = column;
                continue;
            }
            match byte {
                b' ' | b'\t' => continue,
                b'#' if column == 0 || bytes[column - 1] == b' ' || bytes[column - 1] == b'\t' => {
                    break;
                }
                b'"' | b'\''
                    if matches!(
                        previous,
                        None | Some(b':' | b'-' | b'[' | b'{' | b',' | b'?')
                    ) =>
                {
                    quote = Some(byte);
                }
                b'[' | b'{' => flow += 1,
                b']' | b'}' => flow = flow.saturating_sub(1),
                b'-' if flow == 0
                    && markers_only
                    && bytes.get(column + 1).is_none_or(|b| *b == b' ') =>
                {
                    if indents.last().is_some_and(|top| *top < column) {
                        indents.push(column);
                    }
                }
                _ => markers_only = false,
            }
            if matches!(byte, b'[' | b'{' | b'"' | b'\'') {
                markers_only = false;
            }
            if indents.len() + flow > max {
                return Some(number + 1);
            }
            previous = Some(byte);
            last = column;
        }
        if indents.len() + flow > max {
            return Some(number + 1);
        }
        // `key: |-` or `- >`: the following deeper lines are text.
        if flow == 0 && quote.is_none() && !blank {
            let mut tail = &bytes[..=last.min(bytes.len() - 1)];
            while let [rest @ .., b'-' | b'+' | b'0'..=b'9'] = tail {
                tail = rest;
            }
            if let [before @ .., b'|' | b'>'] = tail
                && matches!(before.last(), None | Some(b' ' | b':' | b'-'))
            {
                block_scalar = Some(indent);
            }
        }
    }
    None
}

/// serde_yaml's message with the position spelt out the same way every time.
fn yaml_error(e: &serde_yaml::Error) -> String {
    let message = e.to_string();
    match e.location() {
        Some(loc) if !message.contains("line ") => {
            format!("{message} (line {}, column {})", loc.line(), loc.column())
        }
        _ => message,
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
    fn templates_accept_json_and_report_the_line_of_an_error() {
        let json =
            r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"x","image":"y"}]}}"#;
        let pod = pod_template("executor_pod_template", json).unwrap();
        assert_eq!(pod.spec.unwrap().containers[0].name, "x");

        let broken = "apiVersion: v1\nkind: Pod\nspec:\n  containers: [\n";
        let (field, message) = field_of(pod_template("executor_pod_template", broken).unwrap_err());
        assert_eq!(field, "executor_pod_template");
        assert!(message.contains("line "), "{message}");

        let json_wrong_type =
            "{\"apiVersion\": \"v1\",\n \"kind\": \"Pod\",\n \"spec\": {\"containers\": 7}}";
        let (_, message) =
            field_of(pod_template("executor_pod_template", json_wrong_type).unwrap_err());
        assert!(
            message.contains("not a Pod") && message.contains("line 3"),
            "{message}"
        );
        let (_, message) = field_of(pod_template("t", "{\"kind\": \"Pod\",\n").unwrap_err());
        assert!(
            message.contains("not valid JSON") && message.contains("line 2"),
            "{message}"
        );

        let wrong_type = "apiVersion: v1\nkind: Pod\nspec:\n  containers: 7\n";
        let (_, message) = field_of(pod_template("executor_pod_template", wrong_type).unwrap_err());
        assert!(
            message.contains("not a Pod") && message.contains("line 4"),
            "{message}"
        );
    }

    #[test]
    fn a_template_that_is_not_a_pod_is_refused() {
        for text in [
            "apiVersion: apps/v1\nkind: Deployment\n",
            "just text",
            "[1, 2]",
        ] {
            let (field, message) =
                field_of(pod_template("executor_pod_template", text).unwrap_err());
            assert_eq!(field, "executor_pod_template");
            assert!(message.contains("not a Pod"), "{text}: {message}");
        }
    }

    #[test]
    fn hostile_templates_are_refused_not_expanded() {
        // A billion laughs: nine levels of nine aliases each.
        let mut bomb = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
        for (prev, next) in ('a'..='h').zip('b'..='i') {
            let refs = vec![format!("*{prev}"); 9].join(", ");
            bomb.push_str(&format!("{next}: &{next} [{refs}]\n"));
        }
        bomb.push_str("metadata:\n  labels: *i\n");
        let (field, message) = field_of(pod_template("executor_pod_template", &bomb).unwrap_err());
        assert_eq!(field, "executor_pod_template");
        assert!(message.starts_with("not valid"), "{message}");
        // Nesting is refused by the scan, before the parser (quadratic in the depth) runs.
        let deep_flow = "[".repeat(100_000);
        let deep_json = "{\"a\":".repeat(10_000);
        let deep_block: String = (0..40)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        let deep_dashes = format!("{}x\n", "- ".repeat(40));
        for text in [&deep_flow, &deep_json, &deep_block, &deep_dashes] {
            let started = std::time::Instant::now();
            let (field, message) =
                field_of(pod_template("executor_pod_template", text).unwrap_err());
            assert_eq!(field, "executor_pod_template");
            assert!(message.contains("nested more than 32 levels"), "{message}");
            assert!(started.elapsed() < std::time::Duration::from_millis(500));
        }
        let big = format!("{TEMPLATE}# {}\n", "x".repeat(300 * 1024));
        let (_, message) = field_of(pod_template("executor_pod_template", &big).unwrap_err());
        assert!(message.contains("limits.max_template_bytes"), "{message}");
    }

    #[test]
    fn the_depth_scan_counts_what_nests_and_skips_what_does_not() {
        // (text, depth the scan must accept, one less it must refuse)
        let rows: &[(&str, usize)] = &[
            ("a: 1\n", 1),
            ("a:\n  b:\n    c: 1\n", 3),
            ("a: [[1], {b: [2]}]\n", 4),
            ("- - - x\n", 3),
            ("a:\n- b: 1\n  c:\n    d: 1\n", 3),
            ("a: \"[[[[[\"\nb: '{{{{'\n", 1),
            ("a: x # [[[[[[\n", 1),
            ("s: |\n  [[[[[[\n  {{{{{{\nb: 1\n", 1),
            ("{\"a\": {\n  \"b\": {\n    \"c\": 1}}}\n", 4),
            ("it: it's [x]\n", 2),
        ];
        for (text, depth) in rows {
            assert_eq!(too_deep(text, *depth), None, "{text:?} at {depth}");
            assert!(
                too_deep(text, depth - 1).is_some(),
                "{text:?} under {depth}"
            );
        }
        let spark_like = "apiVersion: v1\nkind: Pod\nspec:\n  affinity:\n    nodeAffinity:\n      \
            requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        \
            - matchExpressions:\n          - key: zone\n            operator: In\n            \
            values: [a, b]\n";
        assert_eq!(too_deep(spark_like, 32), None);
    }

    proptest::proptest! {
        /// Any text, however broken, is scanned without a panic, and a deeper limit never
        /// refuses what a shallower one accepts.
        #[test]
        fn the_depth_scan_takes_any_text(text in "[ -~\\n\\t\u{e9}\u{1f600}]{0,200}", max in 1usize..8) {
            let shallow = too_deep(&text, max);
            if shallow.is_none() {
                proptest::prop_assert!(too_deep(&text, max + 1).is_none());
            }
        }
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

        let default_pod = pod_template("t", TEMPLATE).unwrap();
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
        let adaptive_default = StartDefaults {
            settings: AllocationSettings {
                policy: AllocationPolicy::Adaptive,
                ..AllocationSettings::default()
            },
            ..StartDefaults::default()
        };
        // (requested, server default, effective)
        let cases = [
            (None, &StartDefaults::default(), AllocationPolicy::Spark),
            (Some(0), &StartDefaults::default(), AllocationPolicy::Spark),
            (Some(0), &adaptive_default, AllocationPolicy::Adaptive),
            (Some(1), &adaptive_default, AllocationPolicy::Spark),
            (
                Some(2),
                &StartDefaults::default(),
                AllocationPolicy::Adaptive,
            ),
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
            })
            .unwrap_err(),
        );
        assert_eq!(field, "executor_ids[2]");
        let (_, ids) = update_registered(proto::UpdateRegisteredExecutorsRequest {
            application_id: "a".into(),
            executor_ids: vec!["3".into(), "1".into()],
        })
        .unwrap();
        assert_eq!(ids, BTreeSet::from([ExecutorId(1), ExecutorId(3)]));
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
            let checked = set_total_expected(request(templates), &StartDefaults::default());
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
