//! Executor pods from per-profile templates.
//!
//! A template may be the pod Spark itself builds for an executor (with the literal id
//! `{{EXECUTOR_ID}}`): whatever Spark put in the service-owned places (name, hostname,
//! Spark's labels, the executor container's identity env) is overwritten, and
//! `{{APP_ID}}` / `{{EXECUTOR_ID}}` are substituted per executor wherever Spark does.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, PersistentVolumeClaim, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::claims::mounted_claims;
use super::state::DEFAULT_EXECUTOR_CONTAINER;
use super::types::{
    APP_ID_LABEL, EXECUTOR_ID_LABEL, EXECUTOR_INACTIVE_LABEL, EXECUTOR_ROLE, ExecutorId,
    RESOURCE_PROFILE_ID_LABEL, ROLE_LABEL, ResourceProfileId,
};
use crate::naming::{
    MAX_LABEL_LEN, label_key, label_value, sanitize_prefix, stable_hash, truncate_label,
};

/// The driver pod, owner of every executor pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverOwner {
    pub name: String,
    pub uid: String,
}

/// A template that cannot make executor pods; says which profile and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("resource profile {profile}: {reason}")]
    Invalid {
        profile: ResourceProfileId,
        reason: String,
    },
    #[error("resource profile {0} has no pod template")]
    NoTemplate(ResourceProfileId),
    /// A known profile given another template: a profile's pods never change shape.
    #[error("resource profile {0} already has a different pod template")]
    Conflict(ResourceProfileId),
    /// More profiles than an application may have.
    #[error("an application may have at most {limit} resource profiles")]
    TooManyProfiles { limit: usize },
}

/// Replaced by the application id in the places Spark substitutes it.
pub const APP_ID_PLACEHOLDER: &str = "{{APP_ID}}";
/// Replaced by the executor id in the places Spark substitutes it.
pub const EXECUTOR_ID_PLACEHOLDER: &str = "{{EXECUTOR_ID}}";

/// Longest DNS-1123 label, hence longest pod name that can also be its hostname.
const MAX_NAME_LEN: usize = MAX_LABEL_LEN;

/// Builds the executor pods of one application.
///
/// The executor container of a template is the one named like `executor_container`; if
/// there is none and the template has exactly one container, that container is the
/// executor container (as in Spark, which takes the first container) and is renamed; if
/// there are none or several, a new container with that name is added (others kept).
#[derive(Debug, Clone)]
pub struct ExecutorPodBuilder {
    app_id: String,
    prefix: String,
    templates: BTreeMap<ResourceProfileId, Pod>,
    driver: Option<DriverOwner>,
    executor_container: String,
    /// With the default prefix: [`stable_hash`] of the application id, put into pod names
    /// whenever the prefix alone would not tell this application from another.
    id_hash: Option<String>,
    /// Whether sanitising the application id into the prefix lost information.
    lossy_prefix: bool,
    /// The most templates (resource profiles) it takes.
    profile_limit: usize,
    /// Per-executor claim templates (Start's `executor_claim_templates`), for every profile
    /// whose pods mount them.
    claims: Vec<PersistentVolumeClaim>,
    /// Claims are owned by the driver pod (when there is one), else by their executor's pod.
    driver_owns_claims: bool,
}

impl ExecutorPodBuilder {
    /// A builder over `templates` with the prefix sanitised. Templates are taken as given:
    /// [`Self::check`] tells whether they make valid pods.
    pub fn new(
        app_id: &str,
        pod_name_prefix: &str,
        templates: BTreeMap<ResourceProfileId, Pod>,
        driver: Option<DriverOwner>,
        executor_container: &str,
    ) -> Result<Self, TemplateError> {
        let executor_container = if executor_container.is_empty() {
            DEFAULT_EXECUTOR_CONTAINER
        } else {
            executor_container
        };
        Ok(Self {
            app_id: app_id.to_string(),
            prefix: sanitize_prefix(pod_name_prefix),
            templates,
            driver,
            executor_container: executor_container.to_string(),
            id_hash: None,
            lossy_prefix: false,
            profile_limit: usize::MAX,
            claims: Vec::new(),
            driver_owns_claims: true,
        })
    }
    /// The builder of an application: an explicit `pod_name_prefix` is used as given
    /// (sanitised: the driver asked for it); without one the prefix is the application id,
    /// and when sanitising it is lossy (`Spark_app.1` and `spark-app-1` both give
    /// `spark-app-1`) or it must be cut to fit a name, pod names also carry
    /// [`stable_hash`] of the exact id, so two applications never share pod names.
    pub fn for_application(
        app_id: &str,
        pod_name_prefix: Option<&str>,
        templates: BTreeMap<ResourceProfileId, Pod>,
        driver: Option<DriverOwner>,
        executor_container: &str,
    ) -> Result<Self, TemplateError> {
        if let Some(prefix) = pod_name_prefix {
            return Self::new(app_id, prefix, templates, driver, executor_container);
        }
        let mut builder = Self::new(app_id, app_id, templates, driver, executor_container)?;
        builder.lossy_prefix = builder.prefix != app_id;
        builder.id_hash = Some(stable_hash(app_id));
        Ok(builder)
    }
    /// The same builder with `driver` as the owner of its pods (known only once the driver
    /// pod was looked up, after the templates were checked).
    pub fn with_driver(mut self, driver: Option<DriverOwner>) -> Self {
        self.driver = driver;
        self
    }
    /// The same builder taking at most `limit` profiles ([`Self::check`] and
    /// [`Self::with_templates`] refuse more).
    pub fn with_profile_limit(mut self, limit: usize) -> Self {
        self.profile_limit = limit;
        self
    }
    /// The same builder making `claims` for the executors whose pods mount them, owned by
    /// the driver pod when `driver_owns` (and there is one).
    pub fn with_claims(mut self, claims: Vec<PersistentVolumeClaim>, driver_owns: bool) -> Self {
        self.claims = claims;
        self.driver_owns_claims = driver_owns;
        self
    }
    /// The claim templates, as given.
    pub fn claim_templates(&self) -> &[PersistentVolumeClaim] {
        &self.claims
    }
    /// Whether the claims it makes carry the driver pod as their owner (else the caller
    /// makes the executor's pod their owner once it exists).
    pub fn claims_owned_by_driver(&self) -> bool {
        self.driver_owns_claims && self.driver.is_some()
    }
    /// The uid of the driver pod when the claims it makes carry it as their owner.
    pub fn claims_owner(&self) -> Option<&str> {
        (self.driver.as_ref())
            .filter(|_| self.driver_owns_claims)
            .map(|driver| driver.uid.as_str())
    }
    /// The claims of executor `id` whose `pod` (as [`Self::build`] made it) mounts them:
    /// each claim template whose name, substituted like the pod's claim names, a volume of
    /// the pod names. Labelled with the application and `spark-role=executor` (what Stop
    /// and the reuse listing select), owned by the driver pod when
    /// [`Self::claims_owned_by_driver`], and clean create bodies otherwise.
    pub fn claims(&self, id: ExecutorId, pod: &Pod) -> Vec<PersistentVolumeClaim> {
        if self.claims.is_empty() {
            return Vec::new();
        }
        let mounted: std::collections::BTreeSet<&str> = mounted_claims(pod).collect();
        let owner = self
            .driver
            .as_ref()
            .filter(|_| self.driver_owns_claims)
            .map(driver_reference);
        let id_text = id.to_string();
        let substitute = |text: &mut String| substitute(text, &self.app_id, &id_text);
        let mut claims = Vec::new();
        for template in &self.claims {
            let mut claim = template.clone();
            let meta = &mut claim.metadata;
            let Some(name) = meta.name.as_mut() else {
                continue;
            };
            substitute(name);
            if !mounted.contains(name.as_str()) {
                continue;
            }
            for value in meta.labels.iter_mut().flatten().map(|(_, v)| v) {
                substitute(value);
            }
            for value in meta.annotations.iter_mut().flatten().map(|(_, v)| v) {
                substitute(value);
            }
            clear_server_fields(meta);
            meta.finalizers = None;
            meta.owner_references = owner.clone().map(|o| vec![o]);
            let labels = meta.labels.get_or_insert_with(BTreeMap::new);
            labels.insert(APP_ID_LABEL.into(), self.app_id.clone());
            labels.insert(ROLE_LABEL.into(), EXECUTOR_ROLE.into());
            claim.status = None;
            claims.push(claim);
        }
        claims
    }
    /// Whether the profile has a template.
    pub fn has_profile(&self, profile: ResourceProfileId) -> bool {
        self.templates.contains_key(&profile)
    }
    /// The resource profiles that have a template.
    pub fn profiles(&self) -> impl Iterator<Item = ResourceProfileId> + '_ {
        self.templates.keys().copied()
    }
    /// The template of `profile`, as given (before any stamping).
    pub fn template(&self, profile: ResourceProfileId) -> Option<&Pod> {
        self.templates.get(&profile)
    }
    /// This builder with `templates` registered, all or none: a profile it already has
    /// must come with an equal template (as parsed, so formatting does not matter; else
    /// [`TemplateError::Conflict`]), a new one must pass [`Self::check_template`]. The
    /// lowest profile at fault is reported.
    pub fn with_templates(
        &self,
        templates: BTreeMap<ResourceProfileId, Pod>,
    ) -> Result<Self, TemplateError> {
        let mut next = self.clone();
        for (profile, template) in templates {
            match self.templates.get(&profile) {
                Some(known) if *known == template => {}
                Some(_) => return Err(TemplateError::Conflict(profile)),
                None => {
                    next.templates.insert(profile, template);
                    if next.templates.len() > self.profile_limit {
                        return Err(TemplateError::TooManyProfiles {
                            limit: self.profile_limit,
                        });
                    }
                    next.check_template(profile)?;
                }
            }
        }
        Ok(next)
    }
    /// Checks every template: see [`Self::check_template`].
    pub fn check(&self) -> Result<(), TemplateError> {
        if self.templates.len() > self.profile_limit {
            return Err(TemplateError::TooManyProfiles {
                limit: self.profile_limit,
            });
        }
        self.profiles()
            .try_for_each(|profile| self.check_template(profile))
    }
    /// Whether the pods of `profile` can be created, so a template the API server would
    /// refuse (422) on every create is refused once, up front: every container (init
    /// containers too) needs an image, and every label must stay a valid label once the
    /// placeholders are substituted, checked with the longest executor id there can be.
    pub fn check_template(&self, profile: ResourceProfileId) -> Result<(), TemplateError> {
        let given = self
            .template(profile)
            .and_then(|t| t.spec.as_ref())
            .map_or(0, |spec| spec.containers.len());
        let pod = self.build(ExecutorId(u64::MAX), profile)?;
        let invalid = |reason: String| TemplateError::Invalid { profile, reason };
        for (key, value) in pod.metadata.labels.iter().flatten() {
            if let Err(reason) = label_key(key) {
                return Err(invalid(format!("label key `{key}` {reason}")));
            }
            if let Err(reason) = label_value(value) {
                let given = self
                    .template(profile)
                    .and_then(|t| t.metadata.labels.as_ref())
                    .and_then(|labels| labels.get(key))
                    .map_or(value.as_str(), String::as_str);
                return Err(invalid(format!(
                    "label `{key}`: {given:?} is not a label value once {APP_ID_PLACEHOLDER} and \
                     {EXECUTOR_ID_PLACEHOLDER} are substituted ({value:?}): {reason}"
                )));
            }
        }
        let Some(spec) = pod.spec else {
            return Ok(());
        };
        let added = spec.containers.len() > given;
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers);
        for container in containers {
            if container
                .image
                .as_deref()
                .is_some_and(|i| !i.trim().is_empty())
            {
                continue;
            }
            let reason = if added && spec.containers.last() == Some(container) {
                format!(
                    "the template has no executor container (one named `{}`, or a single \
                     container), so one without an image would be added: give it, with its image",
                    container.name
                )
            } else {
                format!("container `{}` has no image", container.name)
            };
            return Err(invalid(reason));
        }
        Ok(())
    }
    /// The sanitised pod name prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The pod name of executor `id`: `<prefix>-exec-<id>`, or `<prefix>-<hash>-exec-<id>`
    /// when the default prefix needs the id hash (see [`Self::for_application`]); at most
    /// 63 characters.
    pub fn pod_name(&self, id: ExecutorId) -> String {
        let suffix = format!("-exec-{id}");
        let room = MAX_NAME_LEN.saturating_sub(suffix.len());
        if let Some(hash) = &self.id_hash
            && (self.lossy_prefix || self.prefix.len() > room)
        {
            let prefix = truncate_label(&self.prefix, room.saturating_sub(hash.len() + 1));
            let prefix = if prefix.is_empty() { "spark" } else { prefix };
            return format!("{prefix}-{hash}{suffix}");
        }
        let prefix = truncate_label(&self.prefix, room);
        let prefix = if prefix.is_empty() { "spark" } else { prefix };
        format!("{prefix}{suffix}")
    }
    /// The executor pod for `id` in `profile`.
    pub fn build(&self, id: ExecutorId, profile: ResourceProfileId) -> Result<Pod, TemplateError> {
        let mut pod = self
            .templates
            .get(&profile)
            .cloned()
            .ok_or(TemplateError::NoTemplate(profile))?;
        let name = self.pod_name(id);
        substitute_ids(&mut pod, &self.app_id, id);

        // Metadata: a clean create body.
        let meta = &mut pod.metadata;
        meta.name = Some(name.clone());
        clear_server_fields(meta);
        // Spark's labels are the service's: a template's values (Spark's own pod carries
        // them, with `{{EXECUTOR_ID}}`) are overwritten.
        let labels = meta.labels.get_or_insert_with(BTreeMap::new);
        // A pod created inactive would be invisible to the engine and asked for again and
        // again; the service alone marks finished executors inactive.
        labels.remove(EXECUTOR_INACTIVE_LABEL);
        labels.insert(APP_ID_LABEL.into(), self.app_id.clone());
        labels.insert(ROLE_LABEL.into(), EXECUTOR_ROLE.into());
        labels.insert(EXECUTOR_ID_LABEL.into(), id.to_string());
        labels.insert(RESOURCE_PROFILE_ID_LABEL.into(), profile.to_string());
        if let Some(driver) = &self.driver {
            let owners = meta.owner_references.get_or_insert_with(Vec::new);
            // Only one controller is allowed: the driver pod.
            owners.retain(|o| o.controller != Some(true));
            owners.push(driver_reference(driver));
        }
        pod.status = None;

        // Spec: hostname, restart policy, the executor container's env.
        let spec = pod.spec.get_or_insert_with(PodSpec::default);
        spec.hostname = Some(name);
        spec.restart_policy = Some("Never".into());
        let index = match spec
            .containers
            .iter()
            .position(|c| c.name == self.executor_container)
        {
            Some(index) => index,
            None if spec.containers.len() == 1 => {
                spec.containers[0].name = self.executor_container.clone();
                0
            }
            None => {
                spec.containers.push(Container {
                    name: self.executor_container.clone(),
                    ..Container::default()
                });
                spec.containers.len() - 1
            }
        };
        let container = &mut spec.containers[index];
        let env = container.env.get_or_insert_with(Vec::new);
        set_env(env, "SPARK_EXECUTOR_ID", Some(id.to_string()), None);
        set_env(env, "SPARK_APPLICATION_ID", Some(self.app_id.clone()), None);
        set_env(
            env,
            "SPARK_RESOURCE_PROFILE_ID",
            Some(profile.to_string()),
            None,
        );
        set_env(env, "SPARK_EXECUTOR_POD_IP", None, Some("status.podIP"));
        set_env(env, "SPARK_EXECUTOR_POD_NAME", None, Some("metadata.name"));
        Ok(pod)
    }
}

/// The driver pod as the controller owner of an executor's pod or claims.
fn driver_reference(driver: &DriverOwner) -> OwnerReference {
    pod_owner(&driver.name, &driver.uid)
}

/// Pod `name` (`uid`) as the controller owner of an object.
pub fn pod_owner(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: name.to_string(),
        uid: uid.to_string(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// Replaces the placeholders where Spark does (its `Utils.substituteAppNExecIds`): label and
/// annotation values, the env values and args of every container and init container, and
/// the claim names of PersistentVolumeClaim volumes.
fn substitute_ids(pod: &mut Pod, app_id: &str, id: ExecutorId) {
    let id = id.to_string();
    let substitute = |text: &mut String| substitute(text, app_id, &id);
    let meta = &mut pod.metadata;
    for value in meta.labels.iter_mut().flatten().map(|(_, v)| v) {
        substitute(value);
    }
    for value in meta.annotations.iter_mut().flatten().map(|(_, v)| v) {
        substitute(value);
    }
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    let containers = spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut());
    for container in containers {
        let values = container
            .env
            .iter_mut()
            .flatten()
            .filter_map(|e| e.value.as_mut());
        for value in values {
            substitute(value);
        }
        for arg in container.args.iter_mut().flatten() {
            substitute(arg);
        }
    }
    let claims = spec
        .volumes
        .iter_mut()
        .flatten()
        .filter_map(|v| v.persistent_volume_claim.as_mut());
    for claim in claims {
        substitute(&mut claim.claim_name);
    }
}

/// `{{APP_ID}}` and `{{EXECUTOR_ID}}` in `text` replaced by `app_id` and `id`.
pub fn substitute(text: &mut String, app_id: &str, id: &str) {
    if text.contains("{{") {
        *text = text
            .replace(APP_ID_PLACEHOLDER, app_id)
            .replace(EXECUTOR_ID_PLACEHOLDER, id);
    }
}

/// Sets `name` (replacing any value from the template) to a value or a downward-API field.
fn set_env(env: &mut Vec<EnvVar>, name: &str, value: Option<String>, field_path: Option<&str>) {
    let value_from = field_path.map(|path| EnvVarSource {
        field_ref: Some(ObjectFieldSelector {
            api_version: Some("v1".into()),
            field_path: path.into(),
        }),
        ..EnvVarSource::default()
    });
    let var = EnvVar {
        name: name.into(),
        value,
        value_from,
    };
    match env.iter_mut().find(|e| e.name == name) {
        Some(existing) => *existing = var,
        None => env.push(var),
    }
}

/// Clears what the API server sets, or what a create body must not carry, from a template's
/// metadata: a clean create body. The create request's URL decides the namespace (a
/// different one would be refused).
fn clear_server_fields(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.generate_name = None;
    meta.namespace = None;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.managed_fields = None;
}
