//! Settings of the simulated cluster, loadable from a `[simulator]` configuration section.
//! Every field has a default so an empty section gives a usable cluster.

use serde::{Deserialize, Serialize};

/// Everything that shapes one simulated cluster.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SimSettings {
    /// Address the API server listens on; port 0 picks a free port.
    pub listen: String,
    /// Namespaces that exist at start (`default` is always created).
    pub namespaces: Vec<String>,
    /// How many change events are kept for watches resuming from an older resourceVersion.
    pub history: usize,
    /// Static bearer tokens; when non-empty, every request needs one of them (else 401).
    pub auth_tokens: Vec<String>,
    /// How often a watch that asked for bookmarks gets one, in milliseconds.
    pub bookmark_interval_ms: u64,
    /// Seed of every random choice (start delays, failures, injected faults, generated names).
    pub seed: u64,
    /// The scheduler, kubelets and garbage collector.
    pub kubelet: KubeletSettings,
    /// Faults injected from the start (changeable while running).
    pub faults: FaultSettings,
    /// Identities and permissions answered by TokenReview and SubjectAccessReview.
    pub access: AccessSettings,
}

/// What the simulated TokenReview and SubjectAccessReview answer: tokens standing for
/// users, and what users and groups may do. Nothing is granted by default.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Default, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AccessSettings {
    /// Tokens TokenReview accepts; any other is `authenticated: false`.
    pub tokens: Vec<SimToken>,
    /// Permissions SubjectAccessReview allows (as RBAC role bindings would); anything not
    /// granted is `allowed: false`.
    pub grants: Vec<SimGrant>,
    /// The API server's own audience: a token with no `audiences` is meant for it only.
    pub api_audience: String,
}

/// One bearer token and the user it authenticates.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SimToken {
    /// The bearer token a caller sends.
    pub token: String,
    /// User name, e.g. `system:serviceaccount:team-a:spark`.
    pub username: String,
    /// The user's UID in TokenReview's answer.
    #[serde(default)]
    pub uid: String,
    /// The user's groups in TokenReview's answer.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Audiences the token was issued for; empty = the API server's (`api_audience`).
    #[serde(default)]
    pub audiences: Vec<String>,
}

/// Verbs on resources in namespaces, granted to users or groups.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SimGrant {
    /// User names this applies to.
    #[serde(default)]
    pub users: Vec<String>,
    /// Groups this applies to.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Namespaces; `*` for all (as a ClusterRoleBinding).
    pub namespaces: Vec<String>,
    /// Verbs (`create`, `delete`, `list`, …); `*` for all.
    pub verbs: Vec<String>,
    /// Resources (`pods`, …); `*` for all.
    pub resources: Vec<String>,
    /// Object names (RBAC's `resourceNames`); empty for every object. A grant with names
    /// allows only questions about one of them.
    #[serde(default)]
    pub names: Vec<String>,
}

impl Default for SimSettings {
    fn default() -> Self {
        SimSettings {
            listen: "127.0.0.1:0".to_string(),
            namespaces: vec!["default".to_string()],
            history: 10_000,
            auth_tokens: Vec::new(),
            bookmark_interval_ms: 10_000,
            seed: 42,
            kubelet: KubeletSettings::default(),
            faults: FaultSettings::default(),
            access: AccessSettings::default(),
        }
    }
}

/// Whether the simulated nodes act on pods by themselves.
#[derive(
    Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum KubeletMode {
    /// A scheduler binds pods and kubelets start, fail, finish and remove them.
    #[default]
    Auto,
    /// Nothing moves unless a client posts `/binding` or patches `/status`, as a test
    /// playing kubelet would against a real API server with no nodes.
    Manual,
}

impl TryFrom<String> for KubeletMode {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(KubeletMode::Auto),
            "manual" => Ok(KubeletMode::Manual),
            _ => Err(format!("expected `auto` or `manual`, got {value:?}")),
        }
    }
}

/// How a simulated kubelet runs a pod's containers.
#[derive(
    Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum KubeletRuntime {
    /// Nothing runs: containers go Running after the start delay and exit only as the
    /// settings say (`exit_after_ms`, `fail_fraction`, ...).
    #[default]
    Simulated,
    /// Each container runs as a local process chosen by its image from `process_images`;
    /// its exit becomes the container's terminated state and the pod's phase.
    Process,
}

impl TryFrom<String> for KubeletRuntime {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "simulated" => Ok(KubeletRuntime::Simulated),
            "process" => Ok(KubeletRuntime::Process),
            _ => Err(format!("expected `simulated` or `process`, got {value:?}")),
        }
    }
}

/// What runs for containers of one image under the process runtime: the image's
/// entrypoint as a local command, and the image's own environment.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessImage {
    /// The image name exactly as in the pod spec (`spark:4.0.1`), or `*` for every image
    /// without an entry of its own.
    pub image: String,
    /// The argv run for it (as the image's ENTRYPOINT); the container's `args` are
    /// appended, its `command` is ignored.
    pub command: Vec<String>,
    /// Environment of the image (as its ENV lines): below the container's own `env`,
    /// above the simulator's inherited environment.
    #[serde(default)]
    pub env: Vec<ImageEnv>,
    /// Run the container's own image with a container engine instead: `command` is then
    /// the engine's argv (`["podman", "--runtime", "runc"]`), to which `run` (or `rm`) and
    /// their arguments are appended; the pod's volumes are bind-mounted at their mount
    /// paths, the container's `command` is its entrypoint, and `env` is added to the
    /// container's environment (the engine itself runs with the simulator's).
    #[serde(default)]
    pub container: bool,
}

/// One environment variable of a [`ProcessImage`] (a list, not a map, so names keep
/// their case whatever the configuration loader does with keys).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImageEnv {
    /// Variable name.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// Behaviour of the scheduler, the kubelets and the garbage collector.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KubeletSettings {
    /// `auto` or `manual`.
    pub mode: KubeletMode,
    /// Number of nodes, named `sim-node-0` .. `sim-node-{N-1}`.
    pub nodes: u32,
    /// Pods each node runs at most; the excess stays Pending and Unschedulable.
    pub pods_per_node: u32,
    /// Shortest delay from binding to Running, in milliseconds.
    pub start_delay_min_ms: u64,
    /// Longest delay from binding to Running (a seeded random value in between is used).
    pub start_delay_max_ms: u64,
    /// Fraction (0..=1) of pods whose executor container fails at start.
    pub fail_fraction: f64,
    /// Exit code of a container that fails at start.
    pub fail_exit_code: i32,
    /// Images that cannot be pulled: `ErrImagePull`, then `ImagePullBackOff`.
    pub failing_images: Vec<String>,
    /// Delay from `ErrImagePull` to `ImagePullBackOff`, in milliseconds.
    pub image_pull_backoff_ms: u64,
    /// When set, a running pod's containers exit after this many milliseconds.
    pub exit_after_ms: Option<u64>,
    /// Exit code of containers that exit after `exit_after_ms` (0 gives Succeeded).
    pub exit_code: i32,
    /// How long a node takes to stop a pod being deleted gracefully (capped by its grace
    /// period), in milliseconds.
    pub termination_ms: u64,
    /// Period of the garbage collector removing pods whose owner is gone, in milliseconds.
    pub gc_interval_ms: u64,
    /// `simulated` (nothing runs) or `process` (containers run as local processes).
    pub runtime: KubeletRuntime,
    /// The process runtime's images: what runs for each image.
    pub process_images: Vec<ProcessImage>,
    /// Where the process runtime puts each pod's working directory, log files and volumes
    /// (kept afterwards); unset: a temporary directory removed when the cluster stops.
    pub work_dir: Option<std::path::PathBuf>,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        KubeletSettings {
            mode: KubeletMode::Auto,
            nodes: 10,
            pods_per_node: 110,
            start_delay_min_ms: 50,
            start_delay_max_ms: 200,
            fail_fraction: 0.0,
            fail_exit_code: 1,
            failing_images: Vec::new(),
            image_pull_backoff_ms: 1_000,
            exit_after_ms: None,
            exit_code: 0,
            termination_ms: 100,
            gc_interval_ms: 2_000,
            runtime: KubeletRuntime::Simulated,
            process_images: Vec::new(),
            work_dir: None,
        }
    }
}

/// Faults injected into the API server; all off by default.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Default, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FaultSettings {
    /// Added to every API request before it is served, in milliseconds.
    pub latency_ms: u64,
    /// Fraction (0..=1) of API requests answered 500 InternalError.
    pub error_500_fraction: f64,
    /// Fraction (0..=1) of API requests answered 429 TooManyRequests with `Retry-After`.
    pub error_429_fraction: f64,
    /// `Retry-After` seconds sent with a 429.
    pub retry_after_seconds: u64,
    /// Writes (POST, PUT, PATCH, DELETE of a resource) admitted per second, in bursts of
    /// as many; those above are answered 429 with `Retry-After`, as API Priority and
    /// Fairness sheds a flow beyond its share. 0 = no limit.
    pub max_writes_per_second: u32,
    /// When set, every watch is closed by the server after this many seconds.
    pub watch_close_after_seconds: Option<u64>,
    /// Fraction (0..=1) of watch events silently not sent to a watcher.
    pub watch_drop_fraction: f64,
    /// Fraction (0..=1) of pod creates answered 201 although the pod is never stored.
    pub lost_create_fraction: f64,
    /// Fraction (0..=1) of pod creates refused 403 "exceeded quota".
    pub quota_fraction: f64,
    /// The latency and the 500/429 errors above apply to discovery too (`/version`, `/api`,
    /// …), not only to resource requests: an API server that answers nothing, so a client
    /// probing it at start-up waits until the fault is lifted.
    pub discovery_faults: bool,
    /// The latency and the 500/429 errors above apply only to requests for these resources
    /// (plural names: `configmaps`, `pods`); empty: to every resource.
    pub only_resources: Vec<String>,
}

impl FaultSettings {
    /// Checks every fraction is within 0..=1 so a typo cannot silently disable a fault.
    pub fn validate(&self) -> Result<(), String> {
        let fractions = [
            ("error_500_fraction", self.error_500_fraction),
            ("error_429_fraction", self.error_429_fraction),
            ("watch_drop_fraction", self.watch_drop_fraction),
            ("lost_create_fraction", self.lost_create_fraction),
            ("quota_fraction", self.quota_fraction),
        ];
        for (name, value) in fractions {
            if !(0.0..=1.0).contains(&value) {
                return Err(format!("faults.{name} must be within 0..=1, got {value}"));
            }
        }
        if self.error_500_fraction + self.error_429_fraction > 1.0 {
            return Err("faults.error_500_fraction + error_429_fraction must not exceed 1".into());
        }
        if self.lost_create_fraction + self.quota_fraction > 1.0 {
            return Err("faults.lost_create_fraction + quota_fraction must not exceed 1".into());
        }
        Ok(())
    }
}

impl SimSettings {
    /// Rejects settings that cannot describe a cluster, naming the offending key.
    pub fn validate(&self) -> Result<(), String> {
        self.faults.validate()?;
        for (i, token) in self.access.tokens.iter().enumerate() {
            if token.token.trim().is_empty() || token.username.trim().is_empty() {
                return Err(format!(
                    "access.tokens[{i}] needs a non-empty token and username"
                ));
            }
        }
        let k = &self.kubelet;
        if !(0.0..=1.0).contains(&k.fail_fraction) {
            return Err(format!(
                "kubelet.fail_fraction must be within 0..=1, got {}",
                k.fail_fraction
            ));
        }
        if k.start_delay_min_ms > k.start_delay_max_ms {
            return Err("kubelet.start_delay_min_ms must not exceed start_delay_max_ms".into());
        }
        if self.history == 0 {
            return Err("history must be at least 1".into());
        }
        if self.bookmark_interval_ms == 0 {
            return Err("bookmark_interval_ms must be at least 1".into());
        }
        if k.gc_interval_ms == 0 {
            return Err("kubelet.gc_interval_ms must be at least 1".into());
        }
        if k.runtime == KubeletRuntime::Process && k.mode == KubeletMode::Manual {
            return Err(
                "kubelet.runtime = \"process\" needs kubelet.mode = \"auto\" (in manual mode nothing runs pods)"
                    .into(),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, entry) in k.process_images.iter().enumerate() {
            if entry.image.trim().is_empty() {
                return Err(format!(
                    "kubelet.process_images[{i}].image must not be empty"
                ));
            }
            if entry.command.first().is_none_or(|c| c.trim().is_empty()) {
                return Err(format!(
                    "kubelet.process_images[{i}].command must name a program (image {:?})",
                    entry.image
                ));
            }
            if !seen.insert(entry.image.as_str()) {
                return Err(format!(
                    "kubelet.process_images[{i}].image {:?} is listed twice",
                    entry.image
                ));
            }
            if let Some(bad) = entry
                .env
                .iter()
                .find(|e| e.name.is_empty() || e.name.contains('='))
            {
                return Err(format!(
                    "kubelet.process_images[{i}].env has an invalid name {:?}",
                    bad.name
                ));
            }
        }
        Ok(())
    }
}
