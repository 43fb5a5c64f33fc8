//! What an executor pod template may ask for. The service creates pods with its own
//! identity, so a template must not get more than a driver's own pods would: the policy
//! refuses, before any pod is built, what would let a caller escape the pod (the Pod
//! Security Standards controls below), run elsewhere or as someone else (`nodeName`,
//! another service account, another namespace) or hold objects it does not own (foreign
//! owner references, finalizers, `blockOwnerDeletion`). The namespace's Pod Security
//! admission still applies on a real cluster; this refuses early, naming the template path
//! at fault.
//!
//! # Pod Security Standards
//!
//! The controls follow the Kubernetes page "Pod Security Standards"
//! (<https://kubernetes.io/docs/concepts/security/pod-security-standards/>) as enforced by
//! current Kubernetes (pod-security-admission's `policy/check_*.go`, through v1.37): one
//! function per control, named as on the page and called in its order ([`PodPolicy::check`]).
//! `baseline` is the default; `pod_policy.level = "restricted"` adds the restricted
//! controls. Every container kind is checked (`c` below): `spec.initContainers[i]`
//! (sidecars, `restartPolicy: Always`, included), `spec.containers[i]` and
//! `spec.ephemeralContainers[i]`. Each check accepts only known values, so a placeholder
//! substituted later (`{{APP_ID}}` in an annotation value) cannot make an accepted template
//! a refused pod.
//!
//! | Control (page order) | Fields checked (the path a refusal names) | Allowed values | Loosened by |
//! |---|---|---|---|
//! | **Baseline** | | | |
//! | HostProcess | `spec.securityContext.windowsOptions.hostProcess`, `c.securityContext.windowsOptions.hostProcess` | unset, `false` | — |
//! | Host Namespaces | `spec.hostNetwork`, `spec.hostPID`, `spec.hostIPC` | unset, `false` | `allow_host_namespaces` |
//! | Privileged Containers | `c.securityContext.privileged` | unset, `false` | `allow_privileged` |
//! | Capabilities | `c.securityContext.capabilities.add[j]` | [`BASELINE_CAPABILITIES`] | `allowed_capabilities` |
//! | HostPath Volumes | `spec.volumes[i].hostPath` | unset | `allow_host_path` |
//! | Host Ports | `c.ports[j].hostPort` | unset, `0` | — |
//! | Host Probes / Lifecycle Hooks (v1.34+) | `c.{livenessProbe,readinessProbe,startupProbe}.{httpGet,tcpSocket}.host`, `c.lifecycle.{postStart,preStop}.{httpGet,tcpSocket}.host` | unset, `""` | — |
//! | AppArmor | `spec.securityContext.appArmorProfile.type`, `c.securityContext.appArmorProfile.type`, `metadata.annotations[container.apparmor.security.beta.kubernetes.io/*]` | fields: unset, `RuntimeDefault`, `Localhost`; annotations: `""`, `runtime/default`, `localhost/*` | — |
//! | SELinux | `spec.securityContext.seLinuxOptions.{type,user,role}`, `c.securityContext.seLinuxOptions.{type,user,role}` | type: unset, [`BASELINE_SELINUX_TYPES`]; user, role: unset, `""` | — |
//! | /proc Mount Type | `c.securityContext.procMount` | unset, `Default`; any value when `spec.hostUsers: false` (v1.35+; not under restricted) | — |
//! | Seccomp | `spec.securityContext.seccompProfile.type`, `c.securityContext.seccompProfile.type`; the older annotations `metadata.annotations[seccomp.security.alpha.kubernetes.io/pod]`, `metadata.annotations[container.seccomp.security.alpha.kubernetes.io/*]` | fields: unset, `RuntimeDefault`, `Localhost`; annotations: `runtime/default`, `docker/default`, `localhost/*` | — |
//! | Sysctls | `spec.securityContext.sysctls[i].name` | unset, [`BASELINE_SYSCTLS`] | — |
//! | **Restricted** (`level = "restricted"`: everything above, and) | | | |
//! | Volume Types | `spec.volumes[i].<type>` for the 21 types the page lists | only `configMap`, `csi`, `downwardAPI`, `emptyDir`, `ephemeral`, `image`, `persistentVolumeClaim`, `projected`, `secret` | — |
//! | Privilege Escalation (v1.8+) | `c.securityContext.allowPrivilegeEscalation` | `false` (`spec.os.name: windows` exempt) | — |
//! | Running as Non-root | `spec.securityContext.runAsNonRoot`, `c.securityContext.runAsNonRoot` | `true` at the pod level or in every container, never `false`; any with `spec.hostUsers: false` | — |
//! | Running as Non-root user (v1.23+) | `spec.securityContext.runAsUser`, `c.securityContext.runAsUser` | unset, non-zero; any with `spec.hostUsers: false` | — |
//! | Seccomp (v1.19+) | `spec.securityContext.seccompProfile.type`, `c.securityContext.seccompProfile.type` | `RuntimeDefault` or `Localhost` at the pod level or in every container (windows exempt) | — |
//! | Capabilities (v1.22+) | `c.securityContext.capabilities.drop`, `c.securityContext.capabilities.add[j]` | drop includes `ALL`; add only `NET_BIND_SERVICE` (windows exempt) | — |
//!
//! The service's own rules, beyond the page: no explicit `allowPrivilegeEscalation: true`
//! even under baseline (`allow_privilege_escalation`), no `spec.nodeName`, service accounts
//! from `allowed_service_accounts`, owner references to the driver pod only, finalizers
//! from `allowed_finalizers`, no other namespace, and a `spec.schedulerName` from
//! `scheduler_names` (gang schedulers place pods by their own rules and quotas, so only
//! those the cluster's operator names may be asked for; their labels and annotations,
//! such as Volcano's `scheduling.k8s.io/group-name`, YuniKorn's `yunikorn.apache.org/*` or
//! Kueue's `kueue.x-k8s.io/queue-name`, pass as any other). Claims the service or the
//! cluster creates for executors (claim templates, generic ephemeral volumes) are held to
//! the claim rules ([`PodPolicy::check_claim`]): nothing that reaches existing volumes or
//! another namespace unless a key allows it.
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerPort, Lifecycle, LifecycleHandler, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    Pod, PodSecurityContext, PodSpec, Probe, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

/// Rules every template is checked against; Pod Security `baseline` and the service's own
/// rules unless configured otherwise (`pod_policy` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PodPolicy {
    /// `false` accepts every template as given (a cluster whose admission control does the
    /// same job); default `true`.
    pub enforce: bool,
    /// The Pod Security Standards profile templates are held to; default `baseline`.
    pub level: PodSecurityLevel,
    /// Containers with `securityContext.privileged: true`.
    pub allow_privileged: bool,
    /// Containers with an explicit `securityContext.allowPrivilegeEscalation: true` (unset is
    /// accepted under baseline: it is Kubernetes' default and Spark's pods leave it unset).
    pub allow_privilege_escalation: bool,
    /// Capabilities a container may add (`CAP_` prefix and case ignored); default Pod
    /// Security's `baseline` list.
    pub allowed_capabilities: Vec<String>,
    /// `hostPath` volumes.
    pub allow_host_path: bool,
    /// `hostNetwork`, `hostPID` and `hostIPC`.
    pub allow_host_namespaces: bool,
    /// `spec.nodeName` (bypasses the scheduler and its quotas of placement).
    pub allow_node_name: bool,
    /// Service accounts executor pods may run as (`spec.serviceAccountName`, unset = the
    /// namespace's `default`); default `["default"]`.
    pub allowed_service_accounts: Vec<String>,
    /// Finalizers a template may carry; default none.
    pub allowed_finalizers: Vec<String>,
    /// Schedulers executor pods may ask for (`spec.schedulerName`; unset, the cluster's
    /// default scheduler, is always accepted); default [`DEFAULT_SCHEDULER_NAMES`].
    pub scheduler_names: Vec<String>,
    /// Storage classes a per-executor claim may ask for (`spec.storageClassName`; `"*"`
    /// is any, an unset class is the cluster's default and always accepted); default
    /// `["*"]`: the namespace's quotas per storage class govern claims.
    pub allowed_storage_classes: Vec<String>,
    /// The largest storage request a per-executor claim may make
    /// (`spec.resources.requests.storage`); default [`DEFAULT_MAX_CLAIM_SIZE`].
    pub max_claim_size: ClaimSize,
    /// Claims (per-executor, or a pod's generic ephemeral volumes) naming a
    /// PersistentVolume (`spec.volumeName`): it can bind a volume released by another
    /// tenant, or one the pod policy keeps out (a hostPath PersistentVolume).
    pub allow_claim_volume_name: bool,
    /// Claims with `spec.selector`, which picks among existing PersistentVolumes by label.
    pub allow_claim_selector: bool,
    /// Claims with `spec.dataSourceRef.namespace`: populated from another namespace's
    /// object (the cross-namespace data source feature; ReferenceGrants still apply).
    pub allow_claim_data_source_namespace: bool,
}

/// The size cap of a per-executor claim unless configured otherwise: large enough for any
/// executor's shuffle disk, small enough that a typo (`100Ti`) is refused.
pub const DEFAULT_MAX_CLAIM_SIZE: &str = "1Ti";

/// A storage size as configured (a Kubernetes quantity such as `500Gi`), with its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(try_from = "String", into = "String")]
pub struct ClaimSize {
    pub text: String,
    pub bytes: u128,
}

impl From<ClaimSize> for String {
    fn from(size: ClaimSize) -> String {
        size.text
    }
}

impl TryFrom<String> for ClaimSize {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        match super::claims::quantity_bytes(&text) {
            Some(bytes) => Ok(Self { text, bytes }),
            None => Err(format!(
                "expected a storage quantity such as `500Gi`, got {text:?}"
            )),
        }
    }
}

/// The schedulers a template may name unless configured otherwise: Kubernetes' own and
/// the gang schedulers Spark has feature steps for (Kueue admits pods of the default
/// scheduler, so it needs no name of its own).
pub const DEFAULT_SCHEDULER_NAMES: &[&str] = &["default-scheduler", "volcano", "yunikorn"];

/// A Pod Security Standards profile (`privileged` is `enforce = false`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum PodSecurityLevel {
    #[default]
    Baseline,
    Restricted,
}

impl TryFrom<String> for PodSecurityLevel {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "baseline" => Ok(PodSecurityLevel::Baseline),
            "restricted" => Ok(PodSecurityLevel::Restricted),
            _ => Err(format!(
                "expected `baseline` or `restricted` (`enforce = false` for none), got {value:?}"
            )),
        }
    }
}

impl PodSecurityLevel {
    fn name(self) -> &'static str {
        match self {
            PodSecurityLevel::Baseline => "baseline",
            PodSecurityLevel::Restricted => "restricted",
        }
    }
}

/// Pod Security Standards, `baseline` profile: the capabilities it lets a container add.
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Pod Security Standards, `baseline` profile: the "safe" sysctls a pod may set, with the
/// Kubernetes version that made each safe (the kubelet refuses them on older nodes).
pub const BASELINE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    // v1.27
    "net.ipv4.ip_local_reserved_ports",
    // v1.29
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    // v1.32
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    // v1.37
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

/// Pod Security Standards, `baseline` profile: the SELinux types a pod or container may
/// ask for (`container_engine_t` since v1.31).
pub const BASELINE_SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The storage class annotation older clients set; it takes precedence over
/// `spec.storageClassName` where both are given.
pub const BETA_STORAGE_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";
const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";
const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";
/// Profile types (AppArmor and seccomp) baseline accepts when set.
const CONFINED_PROFILE_TYPES: &[&str] = &["RuntimeDefault", "Localhost"];

impl Default for PodPolicy {
    fn default() -> Self {
        Self {
            enforce: true,
            level: PodSecurityLevel::Baseline,
            allow_privileged: false,
            allow_privilege_escalation: false,
            allowed_capabilities: BASELINE_CAPABILITIES
                .iter()
                .map(|c| c.to_string())
                .collect(),
            allow_host_path: false,
            allow_host_namespaces: false,
            allow_node_name: false,
            allowed_service_accounts: vec!["default".to_string()],
            allowed_finalizers: Vec::new(),
            scheduler_names: DEFAULT_SCHEDULER_NAMES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            allowed_storage_classes: vec!["*".to_string()],
            max_claim_size: ClaimSize {
                text: DEFAULT_MAX_CLAIM_SIZE.to_string(),
                bytes: 1 << 40,
            },
            allow_claim_volume_name: false,
            allow_claim_selector: false,
            allow_claim_data_source_namespace: false,
        }
    }
}

/// Where a template is used: the application's namespace and driver pod.
#[derive(Debug, Clone, Copy)]
pub struct TemplateUse<'a> {
    /// The namespace its pods are created in; `None` when checking a configured default
    /// template, which no namespace is known for yet (a namespace in it is then refused).
    pub namespace: Option<&'a str>,
    /// The driver pod, the one owner a template may name (Spark's own executor pods are
    /// owned by it).
    pub driver_pod_name: Option<&'a str>,
}

/// A rule a template breaks: the path in the template (`spec.hostNetwork`) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct PolicyViolation {
    pub path: String,
    pub reason: String,
}

fn violation(path: impl Into<String>, reason: impl Into<String>) -> Result<(), PolicyViolation> {
    Err(PolicyViolation {
        path: path.into(),
        reason: reason.into(),
    })
}

/// A control of the Pod Security Standards page, named in refusals.
#[derive(Clone, Copy)]
struct Control {
    level: PodSecurityLevel,
    name: &'static str,
    /// The `pod_policy` key that loosens it, if any.
    key: Option<&'static str>,
}

impl Control {
    const fn baseline(name: &'static str, key: Option<&'static str>) -> Self {
        Self {
            level: PodSecurityLevel::Baseline,
            name,
            key,
        }
    }

    const fn restricted(name: &'static str) -> Self {
        Self {
            level: PodSecurityLevel::Restricted,
            name,
            key: None,
        }
    }

    /// Refuses `path`: `detail`, then the profile and control, and what to configure.
    fn refuse(
        self,
        path: impl Into<String>,
        detail: impl std::fmt::Display,
    ) -> Result<(), PolicyViolation> {
        let key = match (self.key, self.level) {
            (Some(key), _) => format!("; pod_policy.{key}"),
            (None, PodSecurityLevel::Restricted) => "; pod_policy.level".to_string(),
            (None, PodSecurityLevel::Baseline) => String::new(),
        };
        violation(
            path,
            format!(
                "{detail} (Pod Security {}: {}{key})",
                self.level.name(),
                self.name
            ),
        )
    }
}

const HOST_PROCESS: Control = Control::baseline("HostProcess", None);
const HOST_NAMESPACES: Control =
    Control::baseline("Host Namespaces", Some("allow_host_namespaces"));
const PRIVILEGED_CONTAINERS: Control =
    Control::baseline("Privileged Containers", Some("allow_privileged"));
const CAPABILITIES: Control = Control::baseline("Capabilities", Some("allowed_capabilities"));
const HOST_PATH_VOLUMES: Control = Control::baseline("HostPath Volumes", Some("allow_host_path"));
const HOST_PORTS: Control = Control::baseline("Host Ports", None);
const HOST_PROBES: Control = Control::baseline("Host Probes / Lifecycle Hooks", None);
const APPARMOR: Control = Control::baseline("AppArmor", None);
const SELINUX: Control = Control::baseline("SELinux", None);
const PROC_MOUNT: Control = Control::baseline("/proc Mount Type", None);
const SECCOMP: Control = Control::baseline("Seccomp", None);
const SYSCTLS: Control = Control::baseline("Sysctls", None);
const VOLUME_TYPES: Control = Control::restricted("Volume Types");
const PRIVILEGE_ESCALATION: Control = Control::restricted("Privilege Escalation");
const RUNNING_AS_NON_ROOT: Control = Control::restricted("Running as Non-root");
const RUNNING_AS_NON_ROOT_USER: Control = Control::restricted("Running as Non-root user");
const RESTRICTED_SECCOMP: Control = Control::restricted("Seccomp");
const RESTRICTED_CAPABILITIES: Control = Control::restricted("Capabilities");

/// `CAP_SYS_ADMIN` and `sys_admin` are the same capability.
fn capability_name(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    upper
        .strip_prefix("CAP_")
        .map_or(upper.clone(), str::to_string)
}

/// One container of any kind, with the path it is named by in refusals.
struct ContainerView<'a> {
    /// `spec.initContainers[1]`.
    path: String,
    context: Option<&'a SecurityContext>,
    ports: &'a [ContainerPort],
    /// (field, probe): `livenessProbe`, `readinessProbe`, `startupProbe`.
    probes: [(&'static str, Option<&'a Probe>); 3],
    lifecycle: Option<&'a Lifecycle>,
}

/// Containers, init containers and ephemeral containers share these fields under two types.
macro_rules! container_view {
    ($path:expr, $c:expr) => {
        ContainerView {
            path: $path,
            context: $c.security_context.as_ref(),
            ports: $c.ports.as_deref().unwrap_or_default(),
            probes: [
                ("livenessProbe", $c.liveness_probe.as_ref()),
                ("readinessProbe", $c.readiness_probe.as_ref()),
                ("startupProbe", $c.startup_probe.as_ref()),
            ],
            lifecycle: $c.lifecycle.as_ref(),
        }
    };
}

/// What the controls read: the pod's annotations, spec and security context, and every
/// container in the order init, regular, ephemeral.
struct Template<'a> {
    annotations: Option<&'a BTreeMap<String, String>>,
    spec: &'a PodSpec,
    pod_context: Option<&'a PodSecurityContext>,
    containers: Vec<ContainerView<'a>>,
}

impl<'a> Template<'a> {
    fn new(pod: &'a Pod, spec: &'a PodSpec) -> Self {
        let init = (spec.init_containers.iter().flatten().enumerate())
            .map(|(i, c)| container_view!(format!("spec.initContainers[{i}]"), c));
        let regular = (spec.containers.iter().enumerate())
            .map(|(i, c)| container_view!(format!("spec.containers[{i}]"), c));
        let ephemeral = (spec.ephemeral_containers.iter().flatten().enumerate())
            .map(|(i, c)| container_view!(format!("spec.ephemeralContainers[{i}]"), c));
        Self {
            annotations: pod.metadata.annotations.as_ref(),
            spec,
            pod_context: spec.security_context.as_ref(),
            containers: init.chain(regular).chain(ephemeral).collect(),
        }
    }

    /// Each container's security context, if it has one.
    fn contexts(&self) -> impl Iterator<Item = (&str, &'a SecurityContext)> + '_ {
        (self.containers.iter()).filter_map(|c| c.context.map(|context| (c.path.as_str(), context)))
    }

    /// Annotations whose key starts with `prefix` (or is `exact`).
    fn annotations_of(
        &self,
        exact: Option<&'static str>,
        prefix: &'static str,
    ) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        (self.annotations.into_iter().flatten())
            .filter(move |(k, _)| k.starts_with(prefix) || Some(k.as_str()) == exact)
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// `spec.hostUsers: false`: the pod runs in a user namespace, where some controls are
    /// relaxed (v1.35+).
    fn in_user_namespace(&self) -> bool {
        self.spec.host_users == Some(false)
    }

    /// `spec.os.name: windows`, exempt from some restricted controls (v1.25+).
    fn is_windows(&self) -> bool {
        self.spec.os.as_ref().is_some_and(|os| os.name == "windows")
    }
}

impl PodPolicy {
    /// Settings that contradict each other: the `pod_policy` key at fault and why.
    pub fn check_settings(&self) -> Result<(), (&'static str, &'static str)> {
        if self.level == PodSecurityLevel::Restricted {
            if self.allow_privilege_escalation {
                return Err((
                    "allow_privilege_escalation",
                    "level = \"restricted\" requires allowPrivilegeEscalation: false",
                ));
            }
            if self.allow_host_path {
                return Err((
                    "allow_host_path",
                    "level = \"restricted\" refuses hostPath volumes (Volume Types)",
                ));
            }
        }
        Ok(())
    }

    /// A per-executor claim template: see [`Self::check_claim_template`]. Paths are the
    /// claim's.
    pub fn check_claim(&self, claim: &PersistentVolumeClaim) -> Result<(), PolicyViolation> {
        let no_spec = PersistentVolumeClaimSpec::default();
        self.check_claim_template("", &claim.metadata, claim.spec.as_ref().unwrap_or(&no_spec))
    }

    /// A claim the service or the cluster creates for an executor (a claim template, or
    /// a pod's generic ephemeral volume): its storage class (`spec.storageClassName`,
    /// and the beta annotation, which takes precedence over it) among
    /// `allowed_storage_classes`, a storage request that parses and is at most
    /// `max_claim_size`, no owner of its own (the service sets the owner), and no
    /// `spec.volumeName`, `spec.selector` or `spec.dataSourceRef.namespace` unless their
    /// keys allow them (each reaches PersistentVolumes or objects outside what the
    /// caller's namespace provisions). Paths start with `prefix`.
    fn check_claim_template(
        &self,
        prefix: &str,
        metadata: &ObjectMeta,
        spec: &PersistentVolumeClaimSpec,
    ) -> Result<(), PolicyViolation> {
        if !self.enforce {
            return Ok(());
        }
        let path = |field: &str| format!("{prefix}{field}");
        if metadata
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty())
        {
            return violation(
                path("metadata.ownerReferences"),
                "the service sets a claim's owner (the driver pod or the executor's pod)",
            );
        }
        let beta_class = metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BETA_STORAGE_CLASS_ANNOTATION))
            .map(|class| {
                (
                    path(&format!(
                        "metadata.annotations[{BETA_STORAGE_CLASS_ANNOTATION}]"
                    )),
                    class.as_str(),
                )
            });
        let spec_class = (spec.storage_class_name.as_deref())
            .map(|class| (path("spec.storageClassName"), class));
        for (at, class) in beta_class.into_iter().chain(spec_class) {
            let allowed = &self.allowed_storage_classes;
            if !allowed.iter().any(|a| a == "*" || a == class) {
                return violation(
                    at,
                    format!(
                        "storage class {class:?} is not allowed (allowed: {allowed:?}; \
                         pod_policy.allowed_storage_classes)"
                    ),
                );
            }
        }
        if !self.allow_claim_volume_name
            && let Some(volume) = spec.volume_name.as_deref().filter(|v| !v.is_empty())
        {
            return violation(
                path("spec.volumeName"),
                format!(
                    "a claim may not name PersistentVolume {volume:?}: it could bind a volume \
                     another tenant released or one the pod policy keeps out \
                     (pod_policy.allow_claim_volume_name)"
                ),
            );
        }
        if !self.allow_claim_selector && spec.selector.is_some() {
            return violation(
                path("spec.selector"),
                "a claim may not select existing PersistentVolumes by label \
                 (pod_policy.allow_claim_selector)",
            );
        }
        if !self.allow_claim_data_source_namespace
            && let Some(namespace) = (spec.data_source_ref.as_ref())
                .and_then(|r| r.namespace.as_deref())
                .filter(|n| !n.is_empty())
        {
            return violation(
                path("spec.dataSourceRef.namespace"),
                format!(
                    "a claim may not be populated from namespace {namespace:?}: only from \
                     its own namespace (pod_policy.allow_claim_data_source_namespace)"
                ),
            );
        }
        let requested = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"));
        let size = path("spec.resources.requests.storage");
        let Some(requested) = requested else {
            return violation(size, "required: a claim must request its storage size");
        };
        match super::claims::quantity_bytes(&requested.0) {
            None => violation(size, format!("{:?} is not a quantity", requested.0)),
            Some(bytes) if bytes > self.max_claim_size.bytes => violation(
                size,
                format!(
                    "{} is more than {} (pod_policy.max_claim_size)",
                    requested.0, self.max_claim_size.text
                ),
            ),
            Some(_) => Ok(()),
        }
    }

    /// Generic ephemeral volumes: the cluster creates their claims for the pod, so each
    /// `volumeClaimTemplate` is held to the claim policy.
    fn ephemeral_volumes(&self, spec: &PodSpec) -> Result<(), PolicyViolation> {
        for (i, volume) in spec.volumes.iter().flatten().enumerate() {
            let Some(ephemeral) = &volume.ephemeral else {
                continue;
            };
            // Without a template the API server refuses the pod: no claim comes of it.
            let Some(template) = &ephemeral.volume_claim_template else {
                continue;
            };
            let prefix = format!("spec.volumes[{i}].ephemeral.volumeClaimTemplate");
            let no_metadata = ObjectMeta::default();
            self.check_claim_template(
                &format!("{prefix}."),
                template.metadata.as_ref().unwrap_or(&no_metadata),
                &template.spec,
            )?;
        }
        Ok(())
    }

    /// The first rule `pod` breaks: metadata, then the Pod Security controls in the page's
    /// order (each over the pod, then every container in the order init, regular,
    /// ephemeral), then the service's placement rules.
    pub fn check(&self, pod: &Pod, use_: TemplateUse<'_>) -> Result<(), PolicyViolation> {
        if !self.enforce {
            return Ok(());
        }
        self.check_metadata(pod, use_)?;
        let no_spec = PodSpec::default();
        let t = Template::new(pod, pod.spec.as_ref().unwrap_or(&no_spec));
        // Baseline.
        self.host_process(&t)?;
        self.host_namespaces(&t)?;
        self.privileged_containers(&t)?;
        self.capabilities(&t)?;
        self.host_path_volumes(&t)?;
        self.host_ports(&t)?;
        self.host_probes_and_lifecycle_hooks(&t)?;
        self.app_armor(&t)?;
        self.se_linux(&t)?;
        self.proc_mount_type(&t)?;
        self.seccomp(&t)?;
        self.sysctls(&t)?;
        if self.level == PodSecurityLevel::Restricted {
            self.volume_types(&t)?;
            self.privilege_escalation(&t)?;
            self.running_as_non_root(&t)?;
            self.running_as_non_root_user(&t)?;
            self.restricted_seccomp(&t)?;
            self.restricted_capabilities(&t)?;
        } else {
            self.no_explicit_privilege_escalation(&t)?;
        }
        self.check_placement(t.spec)?;
        self.ephemeral_volumes(t.spec)
    }

    fn host_process(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let pod = t.pod_context.and_then(|c| c.windows_options.as_ref());
        if pod.and_then(|w| w.host_process) == Some(true) {
            HOST_PROCESS.refuse(
                "spec.securityContext.windowsOptions.hostProcess",
                "Windows HostProcess pods are not allowed",
            )?;
        }
        for (path, context) in t.contexts() {
            if context
                .windows_options
                .as_ref()
                .and_then(|w| w.host_process)
                == Some(true)
            {
                HOST_PROCESS.refuse(
                    format!("{path}.securityContext.windowsOptions.hostProcess"),
                    "Windows HostProcess containers are not allowed",
                )?;
            }
        }
        Ok(())
    }

    fn host_namespaces(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let host = [
            ("spec.hostNetwork", t.spec.host_network),
            ("spec.hostPID", t.spec.host_pid),
            ("spec.hostIPC", t.spec.host_ipc),
        ];
        for (path, value) in host {
            if value == Some(true) && !self.allow_host_namespaces {
                HOST_NAMESPACES.refuse(path, "host namespaces are not allowed")?;
            }
        }
        Ok(())
    }

    fn privileged_containers(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        for (path, context) in t.contexts() {
            if context.privileged == Some(true) && !self.allow_privileged {
                PRIVILEGED_CONTAINERS.refuse(
                    format!("{path}.securityContext.privileged"),
                    "privileged containers are not allowed",
                )?;
            }
        }
        Ok(())
    }

    fn capabilities(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let allowed: Vec<String> = (self.allowed_capabilities.iter())
            .map(|c| capability_name(c))
            .collect();
        for (path, context) in t.contexts() {
            let added = context.capabilities.as_ref().and_then(|c| c.add.as_ref());
            for (j, capability) in added.into_iter().flatten().enumerate() {
                if !allowed.contains(&capability_name(capability)) {
                    CAPABILITIES.refuse(
                        format!("{path}.securityContext.capabilities.add[{j}]"),
                        format_args!("capability {capability:?} is not allowed"),
                    )?;
                }
            }
        }
        Ok(())
    }

    fn host_path_volumes(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        for (i, volume) in t.spec.volumes.iter().flatten().enumerate() {
            if volume.host_path.is_some() && !self.allow_host_path {
                HOST_PATH_VOLUMES.refuse(
                    format!("spec.volumes[{i}].hostPath"),
                    "hostPath volumes are not allowed",
                )?;
            }
        }
        Ok(())
    }

    fn host_ports(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        for c in &t.containers {
            for (j, port) in c.ports.iter().enumerate() {
                if let Some(host_port) = port.host_port.filter(|p| *p != 0) {
                    HOST_PORTS.refuse(
                        format!("{}.ports[{j}].hostPort", c.path),
                        format_args!("host port {host_port} is not allowed"),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// A probe or hook with a `host` makes the kubelet connect wherever the template says.
    fn host_probes_and_lifecycle_hooks(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        for c in &t.containers {
            let hooks = c.lifecycle.map_or([None, None], |l| {
                [l.post_start.as_ref(), l.pre_stop.as_ref()]
            });
            let handlers = (c.probes.iter())
                .map(|(field, probe)| {
                    let actions = probe.map(|p| (p.http_get.as_ref(), p.tcp_socket.as_ref()));
                    (field.to_string(), actions)
                })
                .chain(["postStart", "preStop"].into_iter().zip(hooks).map(
                    |(field, hook): (&str, Option<&LifecycleHandler>)| {
                        let actions = hook.map(|h| (h.http_get.as_ref(), h.tcp_socket.as_ref()));
                        (format!("lifecycle.{field}"), actions)
                    },
                ));
            for (field, actions) in handlers {
                let Some((http_get, tcp_socket)) = actions else {
                    continue;
                };
                let hosts = [
                    ("httpGet", http_get.and_then(|a| a.host.as_deref())),
                    ("tcpSocket", tcp_socket.and_then(|a| a.host.as_deref())),
                ];
                for (action, host) in hosts {
                    if let Some(host) = host.filter(|h| !h.is_empty()) {
                        HOST_PROBES.refuse(
                            format!("{}.{field}.{action}.host", c.path),
                            format_args!("a probe or hook host ({host:?}) is not allowed"),
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    fn app_armor(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let pod = (t.pod_context.and_then(|c| c.app_armor_profile.as_ref()))
            .map(|p| ("spec.securityContext.appArmorProfile.type".to_string(), p));
        let containers = (t.contexts()).filter_map(|(path, context)| {
            (context.app_armor_profile.as_ref())
                .map(|p| (format!("{path}.securityContext.appArmorProfile.type"), p))
        });
        for (path, profile) in pod.into_iter().chain(containers) {
            if !CONFINED_PROFILE_TYPES.contains(&profile.type_.as_str()) {
                APPARMOR.refuse(
                    path,
                    format_args!(
                        "AppArmor profile {:?} is not allowed (RuntimeDefault or Localhost)",
                        profile.type_
                    ),
                )?;
            }
        }
        for (key, value) in t.annotations_of(None, APPARMOR_ANNOTATION_PREFIX) {
            let confined =
                value.is_empty() || value == "runtime/default" || value.starts_with("localhost/");
            if !confined {
                APPARMOR.refuse(
                    format!("metadata.annotations[{key}]"),
                    format_args!(
                        "AppArmor profile {value:?} is not allowed (runtime/default or localhost/…)"
                    ),
                )?;
            }
        }
        Ok(())
    }

    fn se_linux(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let pod = (t.pod_context.and_then(|c| c.se_linux_options.as_ref()))
            .map(|o| ("spec.securityContext".to_string(), o));
        let containers = (t.contexts()).filter_map(|(path, context)| {
            (context.se_linux_options.as_ref()).map(|o| (format!("{path}.securityContext"), o))
        });
        for (at, options) in pod.into_iter().chain(containers) {
            if let Some(type_) = options.type_.as_deref().filter(|v| !v.is_empty())
                && !BASELINE_SELINUX_TYPES.contains(&type_)
            {
                SELINUX.refuse(
                    format!("{at}.seLinuxOptions.type"),
                    format_args!(
                        "SELinux type {type_:?} is not allowed ({})",
                        BASELINE_SELINUX_TYPES.join(", ")
                    ),
                )?;
            }
            let custom = [("user", &options.user), ("role", &options.role)];
            for (field, value) in custom {
                if value.as_deref().is_some_and(|v| !v.is_empty()) {
                    SELINUX.refuse(
                        format!("{at}.seLinuxOptions.{field}"),
                        format_args!("a custom SELinux {field} is not allowed"),
                    )?;
                }
            }
        }
        Ok(())
    }

    fn proc_mount_type(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        // A user namespace masks the host's /proc anyway; restricted still requires Default.
        if t.in_user_namespace() && self.level == PodSecurityLevel::Baseline {
            return Ok(());
        }
        for (path, context) in t.contexts() {
            if let Some(mount) = context.proc_mount.as_deref().filter(|m| *m != "Default") {
                PROC_MOUNT.refuse(
                    format!("{path}.securityContext.procMount"),
                    format_args!(
                        "procMount {mount:?} is not allowed (Default{})",
                        if self.level == PodSecurityLevel::Baseline {
                            ", or any with spec.hostUsers: false"
                        } else {
                            ""
                        }
                    ),
                )?;
            }
        }
        Ok(())
    }

    fn seccomp(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let pod = (t.pod_context.and_then(|c| c.seccomp_profile.as_ref()))
            .map(|p| ("spec.securityContext.seccompProfile.type".to_string(), p));
        let containers = (t.contexts()).filter_map(|(path, context)| {
            (context.seccomp_profile.as_ref())
                .map(|p| (format!("{path}.securityContext.seccompProfile.type"), p))
        });
        for (path, profile) in pod.into_iter().chain(containers) {
            if !CONFINED_PROFILE_TYPES.contains(&profile.type_.as_str()) {
                SECCOMP.refuse(
                    path,
                    format_args!(
                        "seccomp profile {:?} is not allowed (RuntimeDefault or Localhost)",
                        profile.type_
                    ),
                )?;
            }
        }
        // The annotations older API servers copy into the fields.
        let annotations = t.annotations_of(
            Some(SECCOMP_POD_ANNOTATION),
            SECCOMP_CONTAINER_ANNOTATION_PREFIX,
        );
        for (key, value) in annotations {
            let confined = value == "runtime/default"
                || value == "docker/default"
                || value.starts_with("localhost/");
            if !confined {
                SECCOMP.refuse(
                    format!("metadata.annotations[{key}]"),
                    format_args!(
                        "seccomp profile {value:?} is not allowed (runtime/default or localhost/…)"
                    ),
                )?;
            }
        }
        Ok(())
    }

    fn sysctls(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let sysctls = t.pod_context.and_then(|c| c.sysctls.as_ref());
        for (i, sysctl) in sysctls.into_iter().flatten().enumerate() {
            if !BASELINE_SYSCTLS.contains(&sysctl.name.as_str()) {
                SYSCTLS.refuse(
                    format!("spec.securityContext.sysctls[{i}].name"),
                    format_args!("sysctl {:?} is not one of the safe sysctls", sysctl.name),
                )?;
            }
        }
        Ok(())
    }

    fn volume_types(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        for (i, v) in t.spec.volumes.iter().flatten().enumerate() {
            let refused = [
                ("hostPath", v.host_path.is_some()),
                ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
                ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
                ("gitRepo", v.git_repo.is_some()),
                ("nfs", v.nfs.is_some()),
                ("iscsi", v.iscsi.is_some()),
                ("glusterfs", v.glusterfs.is_some()),
                ("rbd", v.rbd.is_some()),
                ("flexVolume", v.flex_volume.is_some()),
                ("cinder", v.cinder.is_some()),
                ("cephfs", v.cephfs.is_some()),
                ("flocker", v.flocker.is_some()),
                ("fc", v.fc.is_some()),
                ("azureFile", v.azure_file.is_some()),
                ("vsphereVolume", v.vsphere_volume.is_some()),
                ("quobyte", v.quobyte.is_some()),
                ("azureDisk", v.azure_disk.is_some()),
                ("portworxVolume", v.portworx_volume.is_some()),
                ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
                ("scaleIO", v.scale_io.is_some()),
                ("storageos", v.storageos.is_some()),
            ];
            if let Some((kind, _)) = refused.iter().find(|(_, set)| *set) {
                VOLUME_TYPES.refuse(
                    format!("spec.volumes[{i}].{kind}"),
                    format_args!(
                        "{kind} volumes are not allowed (configMap, csi, downwardAPI, emptyDir, \
                         ephemeral, image, persistentVolumeClaim, projected, secret)"
                    ),
                )?;
            }
        }
        Ok(())
    }

    fn privilege_escalation(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        if t.is_windows() {
            return Ok(());
        }
        for c in &t.containers {
            if c.context.and_then(|s| s.allow_privilege_escalation) != Some(false) {
                PRIVILEGE_ESCALATION.refuse(
                    format!("{}.securityContext.allowPrivilegeEscalation", c.path),
                    "must be false",
                )?;
            }
        }
        Ok(())
    }

    fn running_as_non_root(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        if t.in_user_namespace() {
            return Ok(());
        }
        let pod = t.pod_context.and_then(|c| c.run_as_non_root);
        if pod == Some(false) {
            RUNNING_AS_NON_ROOT.refuse("spec.securityContext.runAsNonRoot", "must not be false")?;
        }
        for c in &t.containers {
            match (c.context.and_then(|s| s.run_as_non_root), pod) {
                (Some(true), _) | (None, Some(true)) => {}
                (Some(false), _) => RUNNING_AS_NON_ROOT.refuse(
                    format!("{}.securityContext.runAsNonRoot", c.path),
                    "must not be false",
                )?,
                (None, _) => RUNNING_AS_NON_ROOT.refuse(
                    format!("{}.securityContext.runAsNonRoot", c.path),
                    "must be true, here or in spec.securityContext.runAsNonRoot",
                )?,
            }
        }
        Ok(())
    }

    fn running_as_non_root_user(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        if t.in_user_namespace() {
            return Ok(());
        }
        let pod = t.pod_context.and_then(|c| c.run_as_user);
        let containers = (t.contexts()).map(|(path, context)| {
            (
                format!("{path}.securityContext.runAsUser"),
                context.run_as_user,
            )
        });
        let users = std::iter::once(("spec.securityContext.runAsUser".to_string(), pod));
        for (path, user) in users.chain(containers) {
            if user == Some(0) {
                RUNNING_AS_NON_ROOT_USER.refuse(path, "user 0 (root) is not allowed")?;
            }
        }
        Ok(())
    }

    /// Baseline already refused any other value where one is set; here one must be set.
    fn restricted_seccomp(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        let pod_set = t.pod_context.is_some_and(|c| c.seccomp_profile.is_some());
        if t.is_windows() || pod_set {
            return Ok(());
        }
        for c in &t.containers {
            if c.context.is_none_or(|s| s.seccomp_profile.is_none()) {
                RESTRICTED_SECCOMP.refuse(
                    format!("{}.securityContext.seccompProfile.type", c.path),
                    "must be RuntimeDefault or Localhost, here or in spec.securityContext.seccompProfile",
                )?;
            }
        }
        Ok(())
    }

    fn restricted_capabilities(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        if t.is_windows() {
            return Ok(());
        }
        for c in &t.containers {
            let capabilities = c.context.and_then(|s| s.capabilities.as_ref());
            let drop = capabilities.and_then(|c| c.drop.as_ref());
            // Exactly `ALL`, as the admission compares it.
            if !drop.into_iter().flatten().any(|d| d == "ALL") {
                RESTRICTED_CAPABILITIES.refuse(
                    format!("{}.securityContext.capabilities.drop", c.path),
                    "must include ALL",
                )?;
            }
            let added = capabilities.and_then(|c| c.add.as_ref());
            for (j, capability) in added.into_iter().flatten().enumerate() {
                if capability_name(capability) != "NET_BIND_SERVICE" {
                    RESTRICTED_CAPABILITIES.refuse(
                        format!("{}.securityContext.capabilities.add[{j}]", c.path),
                        format_args!(
                            "capability {capability:?} is not allowed (NET_BIND_SERVICE only)"
                        ),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// The service's own rule under baseline: escalation asked for explicitly.
    fn no_explicit_privilege_escalation(&self, t: &Template<'_>) -> Result<(), PolicyViolation> {
        for (path, context) in t.contexts() {
            if context.allow_privilege_escalation == Some(true) && !self.allow_privilege_escalation
            {
                violation(
                    format!("{path}.securityContext.allowPrivilegeEscalation"),
                    "privilege escalation is not allowed (pod_policy.allow_privilege_escalation)",
                )?;
            }
        }
        Ok(())
    }

    /// Where the pods run, who places them and as whom they run.
    fn check_placement(&self, spec: &PodSpec) -> Result<(), PolicyViolation> {
        if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) && !self.allow_node_name {
            violation(
                "spec.nodeName",
                "pinning executors to a node is not allowed (pod_policy.allow_node_name); \
                 use nodeSelector or affinity",
            )?;
        }
        if let Some(scheduler) = spec.scheduler_name.as_deref().filter(|s| !s.is_empty())
            && !self.scheduler_names.iter().any(|s| s == scheduler)
        {
            violation(
                "spec.schedulerName",
                format!(
                    "scheduler {scheduler:?} is not allowed (pod_policy.scheduler_names: {:?})",
                    self.scheduler_names
                ),
            )?;
        }
        let accounts = [
            ("spec.serviceAccountName", &spec.service_account_name),
            ("spec.serviceAccount", &spec.service_account),
        ];
        for (path, account) in accounts {
            if let Some(account) = account.as_deref().filter(|a| !a.is_empty())
                && !self.allowed_service_accounts.iter().any(|a| a == account)
            {
                violation(
                    path,
                    format!(
                        "service account {account:?} is not allowed (pod_policy.allowed_service_accounts: {:?})",
                        self.allowed_service_accounts
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// Namespace, owners and finalizers.
    fn check_metadata(&self, pod: &Pod, use_: TemplateUse<'_>) -> Result<(), PolicyViolation> {
        let meta = &pod.metadata;
        if let Some(namespace) = meta.namespace.as_deref().filter(|n| !n.is_empty()) {
            match use_.namespace {
                Some(expected) if expected == namespace => {}
                Some(expected) => violation(
                    "metadata.namespace",
                    format!(
                        "{namespace:?} is not the application's namespace {expected:?} \
                         (leave it out)"
                    ),
                )?,
                None => violation(
                    "metadata.namespace",
                    "a default template must not name a namespace (each application's applies)",
                )?,
            }
        }
        for (i, owner) in meta.owner_references.iter().flatten().enumerate() {
            let is_driver = owner.kind == "Pod"
                && owner.api_version == "v1"
                && use_.driver_pod_name == Some(owner.name.as_str());
            if !is_driver {
                violation(
                    format!("metadata.ownerReferences[{i}]"),
                    format!(
                        "{} {:?} is not the application's driver pod: executor pods are owned \
                         by their driver only",
                        owner.kind, owner.name
                    ),
                )?;
            }
            if owner.block_owner_deletion == Some(true) {
                violation(
                    format!("metadata.ownerReferences[{i}].blockOwnerDeletion"),
                    "blockOwnerDeletion is not allowed",
                )?;
            }
        }
        for (i, finalizer) in meta.finalizers.iter().flatten().enumerate() {
            if !self.allowed_finalizers.iter().any(|f| f == finalizer) {
                violation(
                    format!("metadata.finalizers[{i}]"),
                    format!(
                        "finalizer {finalizer:?} is not allowed (pod_policy.allowed_finalizers)"
                    ),
                )?;
            }
        }
        Ok(())
    }
}
