//! What a pod template is held to, in one place, each failure naming the request field the
//! template came in (`executor_pod_template`, `resource_profile_templates[N]`):
//! - parsing: the size and nesting limits (checked before the parser runs), YAML or JSON,
//!   errors with line and column ([`parse`], [`start_templates`], [`profile_templates`]);
//! - the pod policy where the application's pods go ([`allowed`], [`policy_violation`]);
//! - what the engine's pod builder refuses: images, labels once the placeholders are
//!   substituted ([`builder`]; [`template_error`] names the field of its error).
//!
//! The gRPC edge parses Start's and SetTotalExpected's templates and holds Start's to the
//! policy; the application holds SetTotalExpected's and a resumed registration's to it
//! (it knows where their pods go), and builds with them. Parsing and the policy check are
//! CPU-bound: their callers run them on the blocking pool.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::limits::RequestLimits;
use super::{AppError, AppId, Placement, StartApplication};
use crate::allocator::pod_builder::substitute;
use crate::allocator::pod_policy::{PodPolicy, PolicyViolation, TemplateUse};
use crate::allocator::{ExecutorPodBuilder, ResourceProfileId, TemplateError};
use crate::naming::dns1123_subdomain;

/// The request field a profile's template came in: profile 0's is Start's
/// `executor_pod_template`, any other's `resource_profile_templates[N]`.
pub fn field(profile: ResourceProfileId) -> String {
    if profile == ResourceProfileId(0) {
        "executor_pod_template".to_string()
    } else {
        profile_field(profile.0)
    }
}

/// The entry `profile` of a request's `resource_profile_templates` (any id, as sent).
fn profile_field(profile: i32) -> String {
    format!("resource_profile_templates[{profile}]")
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> AppError {
    AppError::InvalidArgument {
        field: field.into(),
        message: message.into(),
    }
}

/// Start's templates: profile 0 from `executor_pod_template` (the server's default when
/// it is empty; required when there is none), then `resource_profile_templates`; each
/// parsed and held to `policy` where `placement` says the pods go, the lowest profile at
/// fault reported.
pub fn start_templates(
    executor_pod_template: &str,
    resource_profile_templates: HashMap<i32, String>,
    server_default: Option<&Pod>,
    limits: &RequestLimits,
    policy: &PodPolicy,
    placement: &Placement,
) -> Result<BTreeMap<ResourceProfileId, Pod>, AppError> {
    let profile_0 = ResourceProfileId(0);
    let executor = if executor_pod_template.trim().is_empty() {
        server_default.cloned().ok_or_else(|| {
            invalid(
                field(profile_0),
                "required: the server has no default executor pod template",
            )
        })?
    } else {
        parse(&field(profile_0), executor_pod_template, limits)?
    };
    allowed(policy, placement, &field(profile_0), &executor)?;
    let mut templates = BTreeMap::from([(profile_0, executor)]);
    templates.extend(profile_templates(
        resource_profile_templates,
        limits,
        Some((policy, placement)),
    )?);
    Ok(templates)
}

/// `resource_profile_templates` of Start or SetTotalExpected, parsed and, given where the
/// pods go, held to the policy there: ids above 0 (profile 0 is Start's
/// `executor_pod_template`), at most `limits.max_resource_profiles` of them, counted
/// before any is parsed.
pub fn profile_templates(
    texts: HashMap<i32, String>,
    limits: &RequestLimits,
    at: Option<(&PodPolicy, &Placement)>,
) -> Result<BTreeMap<ResourceProfileId, Pod>, AppError> {
    let max = limits.max_resource_profiles;
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
        let field = profile_field(profile);
        if profile < 0 {
            return Err(invalid(field, "a resource profile id must be >= 0"));
        }
        if profile == 0 {
            return Err(invalid(
                field,
                "resource profile 0 takes its template from Start's executor_pod_template",
            ));
        }
        let template = parse(&field, &text, limits)?;
        if let Some((policy, placement)) = at {
            allowed(policy, placement, &field, &template)?;
        }
        templates.insert(ResourceProfileId(profile), template);
    }
    Ok(templates)
}

fn template_use(placement: &Placement) -> TemplateUse<'_> {
    TemplateUse {
        namespace: Some(&placement.namespace),
        driver_pod_name: placement.driver_pod_name.as_deref(),
    }
}

/// `template` against `policy` where `placement` says the pods go, the error naming
/// `field` and the path in the template.
pub fn allowed(
    policy: &PodPolicy,
    placement: &Placement,
    field: &str,
    template: &Pod,
) -> Result<(), AppError> {
    policy
        .check(template, template_use(placement))
        .map_err(|violation| invalid(field, violation.to_string()))
}

/// Templates of profiles given to a running application, held to `policy` where its pods
/// go: the error names the field of the lowest profile that breaks it.
pub fn all_allowed(
    policy: &PodPolicy,
    placement: &Placement,
    templates: &BTreeMap<ResourceProfileId, Pod>,
) -> Result<(), AppError> {
    match policy_violation(policy, placement, templates) {
        Some((profile, violation)) => Err(invalid(field(profile), violation.to_string())),
        None => Ok(()),
    }
}

/// The first template of `templates` (lowest profile) that breaks `policy` where
/// `placement` says the application's pods go, with the rule it breaks.
pub fn policy_violation(
    policy: &PodPolicy,
    placement: &Placement,
    templates: &BTreeMap<ResourceProfileId, Pod>,
) -> Option<(ResourceProfileId, PolicyViolation)> {
    let at = template_use(placement);
    templates
        .iter()
        .find_map(|(profile, template)| policy.check(template, at).err().map(|v| (*profile, v)))
}

/// The first generic ephemeral volume of `template` (profile `profile`'s), as
/// `field: spec.volumes[i].ephemeral`: the cluster creates a claim for it.
pub fn ephemeral_volume(profile: ResourceProfileId, template: &Pod) -> Option<String> {
    let volumes = template.spec.as_ref()?.volumes.as_ref()?;
    let index = volumes.iter().position(|v| v.ephemeral.is_some())?;
    Some(format!(
        "{}: spec.volumes[{index}].ephemeral",
        field(profile)
    ))
}

/// The first claim template of `claims` that breaks `policy`, with its index and the rule
/// (a resumed registration's claims: the policy may have been tightened since).
pub fn claim_violation(
    policy: &PodPolicy,
    claims: &[PersistentVolumeClaim],
) -> Option<(usize, PolicyViolation)> {
    (claims.iter().enumerate())
        .find_map(|(index, claim)| policy.check_claim(claim).err().map(|v| (index, v)))
}

/// The executor pod builder of a Start (or a resumed registration), at most
/// `max_profiles` profiles, every template checked as its pods will be built: every
/// container has an image, every label is valid once the placeholders are substituted.
pub fn builder(
    req: &StartApplication,
    max_profiles: usize,
) -> Result<ExecutorPodBuilder, AppError> {
    let builder = ExecutorPodBuilder::for_application(
        req.app_id.as_str(),
        req.pod_name_prefix.as_deref(),
        req.templates.clone(),
        None,
        &req.settings.executor_container_name,
    )
    .map_err(template_error)?
    .with_profile_limit(max_profiles)
    .with_claims(req.claims.clone(), req.settings.driver_owns_claims);
    builder.check().map_err(template_error)?;
    Ok(builder)
}

/// A template error of the engine's pod builder names the request field it came from: a
/// template that cannot make pods is an invalid argument, another template for a known
/// profile a failed precondition.
pub fn template_error(err: TemplateError) -> AppError {
    let profile = match &err {
        TemplateError::TooManyProfiles { .. } => {
            return invalid(
                "resource_profile_templates",
                format!("{err} (the service's limits.max_resource_profiles)"),
            );
        }
        TemplateError::Invalid { profile, .. }
        | TemplateError::NoTemplate(profile)
        | TemplateError::Conflict(profile) => *profile,
    };
    let field = field(profile);
    match err {
        TemplateError::Conflict(_) => AppError::FailedPrecondition(format!(
            "{field}: {err}; a resource profile's template cannot change while the application runs"
        )),
        _ => invalid(field, err.to_string()),
    }
}

/// A Pod from YAML or JSON; errors give the line and column. A template over the size or
/// nesting limit is refused before it is parsed. JSON goes to serde_json (an order of
/// magnitude faster than reading it as YAML); anything else is YAML. CPU-bound: call it
/// off the async runtime.
pub fn parse(field: &str, text: &str, limits: &RequestLimits) -> Result<Pod, AppError> {
    parse_object(field, text, limits, "Pod")
}

/// Start's `executor_claim_templates`, each parsed (under the template limits) and checked:
/// a name that, once the placeholders are substituted with the longest executor id, is a
/// DNS-1123 subdomain, no two alike, and held to `policy` (storage class, size cap). Errors
/// name `executor_claim_templates[i]`.
pub fn claim_templates(
    texts: &[String],
    app_id: &AppId,
    limits: &RequestLimits,
    policy: &PodPolicy,
) -> Result<Vec<PersistentVolumeClaim>, AppError> {
    let mut names = BTreeSet::new();
    let mut claims = Vec::with_capacity(texts.len());
    for (index, text) in texts.iter().enumerate() {
        let field = format!("executor_claim_templates[{index}]");
        let claim: PersistentVolumeClaim =
            parse_object(&field, text, limits, "PersistentVolumeClaim")?;
        let Some(name) = claim.metadata.name.clone().filter(|n| !n.is_empty()) else {
            return Err(invalid(field, "metadata.name: required"));
        };
        let mut widest = name.clone();
        substitute(&mut widest, app_id.as_str(), &u64::MAX.to_string());
        dns1123_subdomain(&widest).map_err(|reason| {
            invalid(
                &field,
                format!("metadata.name: {name:?} once substituted ({widest:?}): {reason}"),
            )
        })?;
        if !names.insert(name.clone()) {
            return Err(invalid(
                field,
                format!("metadata.name: {name:?} is given twice"),
            ));
        }
        policy
            .check_claim(&claim)
            .map_err(|violation| invalid(&field, violation.to_string()))?;
        claims.push(claim);
    }
    Ok(claims)
}

/// An object of `kind` from YAML or JSON (see [`parse`]).
fn parse_object<T: serde::de::DeserializeOwned>(
    field: &str,
    text: &str,
    limits: &RequestLimits,
    kind: &str,
) -> Result<T, AppError> {
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
        return serde_json::from_str::<T>(text).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Data => format!("not a {kind}"),
                _ => "not valid JSON".to_string(),
            };
            invalid(field, format!("{what}: {e}"))
        });
    }
    serde_yaml::from_str::<T>(text).map_err(|pod_error| {
        // Parsed once more only to say what is wrong: not YAML at all, or not a Pod.
        let message = match serde_yaml::from_str::<serde_yaml::Value>(text) {
            Err(e) => format!("not valid YAML or JSON: {}", yaml_error(&e)),
            Ok(value) if !value.is_mapping() => {
                format!("not a {kind}: expected a YAML or JSON object")
            }
            Ok(_) => format!("not a {kind}: {}", yaml_error(&pod_error)),
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
mod tests;
