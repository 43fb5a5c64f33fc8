//! Layered configuration: built-in defaults < file (`--config PATH`, TOML or YAML) <
//! environment (`SPARK_POD_ALLOCATOR__SECTION__KEY`). Every value is checked at load so a
//! bad one stops start-up with a message naming its key.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::k8s::{InCluster, KubernetesSettings};

pub mod reference;

use crate::allocator::AllocationSettings;

/// Prefix of environment variables; sections and keys are separated by `__`.
pub const ENV_PREFIX: &str = "SPARK_POD_ALLOCATOR";
const ENV_SEPARATOR: &str = "__";

/// Why the configuration cannot be used; the message names the offending key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file's extension says neither TOML nor YAML.
    #[error("config file {0}: unknown format (use .toml, .yaml or .yml)")]
    UnknownFormat(PathBuf),
    /// Reading or deserialising a source failed (the `config` crate names the key).
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    /// A key no section has; says which environment variable (or file) set it.
    #[error("configuration: {error} (set by {origin})")]
    UnknownKey {
        error: config::ConfigError,
        origin: String,
    },
    /// A value deserialised but breaks a rule.
    #[error("configuration key `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

/// The whole service configuration.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// gRPC listen address. Default `127.0.0.1:50051` (loopback, so an unconfigured
    /// service is never exposed); set `0.0.0.0:50051` inside a cluster.
    #[serde(deserialize_with = "socket_address")]
    pub listen: SocketAddr,
    pub kubernetes: KubernetesSettings,
    /// Server-side defaults of every application's allocation settings, with the proto's
    /// `AllocationSettings` field names; unset keys keep Spark's defaults (batch 10, delay
    /// 1000 ms, timeout 600000 ms, idle 60000 ms, no caps, delete on termination, executor
    /// container `spark-kubernetes-executor`, policy `spark`).
    pub allocation: AllocationSettings,
    /// Least wait between the end of a namespace's full LIST, which replaces the snapshots,
    /// and the next.
    pub resync_interval_ms: u64,
    /// Executor pods the full LIST lists per second on average: a namespace with more than
    /// `resync_interval × this` executor pods followed is listed less often (0: every
    /// `resync_interval_ms` whatever its size).
    pub resync_pods_per_second: u32,
    /// The top-level keys the application layer reads (`allowed_namespaces`,
    /// `driver_end_grace_ms`, …), its section written without a table of its own.
    #[serde(flatten)]
    pub app: crate::app::AppSettings,
    /// A Pod (YAML or JSON file) used when Start gives no executor pod template.
    pub default_executor_pod_template: Option<PathBuf>,
    /// The simulated cluster of `serve --simulate`, `simulate` and `demo`.
    pub simulator: spark_pod_allocator_sim::SimSettings,
    pub log: LogSettings,
    pub metrics: MetricsSettings,
    /// The probes' port: gRPC health alone, apart from the callers' connection caps.
    pub health: HealthSettings,
    /// Who may call, and what they may do (see docs/security.md).
    pub auth: crate::auth::AuthSettings,
    /// TLS on the gRPC port.
    pub tls: crate::grpc::tls::TlsSettings,
    /// What an executor pod template may ask for (strict by default).
    pub pod_policy: crate::allocator::pod_policy::PodPolicy,
    /// Bounds on the work one request may cause.
    pub limits: crate::app::limits::RequestLimits,
    /// Limits of the gRPC server: message size, streams, keepalive, connections.
    pub grpc: crate::grpc::limits::ServerLimits,
    /// Where the applications' registrations are kept, and the Secret of their signing key.
    pub registrations: crate::k8s::RegistrationSettings,
    /// Per-tenant limits: applications per identity and namespace, streams per identity.
    pub tenants: crate::app::TenantLimits,
    /// This replica's identity, the shards and their Leases.
    pub ha: crate::ha::HaSettings,
    /// Budgets the applications of a namespace or queue share (fair division, see
    /// docs/service.md); reloaded from the file while the service runs, except which
    /// namespaces each queue holds (they decide shards: start-up only).
    pub budgets: Vec<crate::app::budgets::BudgetEntry>,
    /// A driver-pod label that may name its application's queue: a value other than its
    /// namespace's queue is refused at Start.
    pub budgets_queue_label: Option<String>,
    /// The largest `budget_weight` an application may have (a larger one counts as this).
    pub budgets_max_weight: u32,
    /// How often the configuration file is read again for changed budgets (ms).
    pub budgets_reload_interval_ms: u64,
    /// Each namespace's ResourceQuotas (pods, requests.cpu, requests.memory) are watched
    /// and divided as budgets (needs list and watch on resourcequotas).
    pub budgets_follow_quotas: bool,
    /// `default_executor_pod_template` as parsed and checked once by [`Settings::load`].
    #[serde(skip)]
    loaded_template: Option<k8s_openapi::api::core::v1::Pod>,
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Address of `GET /metrics`, apart from the gRPC port, e.g. `0.0.0.0:9090` in a
    /// cluster. Unset or empty (the default) serves no endpoint: a fixed default port would
    /// make two services on one host (tests, a laptop) collide.
    #[serde(deserialize_with = "optional_socket_address")]
    pub listen: Option<SocketAddr>,
    /// Label the executor gauges with each application's id (per application and
    /// resource profile). Off (the default), they are summed over applications and no
    /// metric names an application: whoever may scrape the endpoint does not learn every
    /// tenant's application ids.
    pub application_labels: bool,
}

/// The gRPC health port for probes (kubelet `grpc` probes, which speak plaintext and open
/// a new connection each time).
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HealthSettings {
    /// Address where `grpc.health.v1.Health` alone is also answered, in plaintext, with
    /// the status of the gRPC port's, e.g. `0.0.0.0:8081` in a cluster. Its connections
    /// never share a cap with the callers'. Unset or empty (the default): none, as for
    /// `metrics.listen`.
    #[serde(deserialize_with = "optional_socket_address")]
    pub listen: Option<SocketAddr>,
}

/// A socket address, or none for an empty string.
fn optional_socket_address<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SocketAddr>, D::Error> {
    let text = String::deserialize(deserializer)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    text.trim().parse().map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "expected an IP address and port such as 127.0.0.1:9090 or 0.0.0.0:9090 \
             (host names are not resolved), or an empty string for none, \
             got {text:?}"
        ))
    })
}

/// A socket address, with an error that shows the expected form.
fn socket_address<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.trim().parse().map_err(|_| {
        serde::de::Error::custom(format!(
            "expected an IP address and port such as 127.0.0.1:50051 or 0.0.0.0:50051 \
             (host names are not resolved), got {text:?}"
        ))
    })
}

/// Logging.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
    /// An `EnvFilter` directive (e.g. `info,spark_pod_allocator=debug`); `RUST_LOG` wins.
    pub filter: String,
}

/// Log line format.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default, Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl TryFrom<String> for LogFormat {
    type Error = String;
    fn try_from(value: String) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("expected `text` or `json`, got {value:?}")),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            kubernetes: KubernetesSettings::default(),
            allocation: AllocationSettings::default(),
            resync_interval_ms: 600_000,
            resync_pods_per_second: 100,
            app: Default::default(),
            default_executor_pod_template: None,
            simulator: spark_pod_allocator_sim::SimSettings::default(),
            log: LogSettings::default(),
            metrics: MetricsSettings::default(),
            health: HealthSettings::default(),
            auth: crate::auth::AuthSettings::default(),
            tls: crate::grpc::tls::TlsSettings::default(),
            pod_policy: Default::default(),
            limits: Default::default(),
            grpc: Default::default(),
            registrations: Default::default(),
            tenants: Default::default(),
            ha: Default::default(),
            budgets: Vec::new(),
            budgets_queue_label: None,
            budgets_max_weight: crate::app::budgets::DEFAULT_MAX_WEIGHT,
            budgets_reload_interval_ms: 10_000,
            budgets_follow_quotas: true,
            loaded_template: None,
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info".to_string(),
        }
    }
}

impl Settings {
    /// Defaults < `path` (TOML or YAML by extension) < process environment.
    pub fn load(path: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_with_env(path, None)
    }

    /// As [`Settings::load`], with `env` standing in for the process environment (tests).
    pub fn load_with_env(
        path: Option<&Path>,
        env: Option<HashMap<String, String>>,
    ) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(path) = path {
            let format = match path.extension().and_then(|e| e.to_str()) {
                Some("toml") => config::FileFormat::Toml,
                Some("yaml") | Some("yml") => config::FileFormat::Yaml,
                _ => return Err(ConfigError::UnknownFormat(path.to_path_buf())),
            };
            let name = path.to_string_lossy();
            builder = builder.add_source(config::File::new(&name, format).required(true));
        }
        let env_names: Vec<String> = match &env {
            Some(vars) => vars.keys().cloned().collect(),
            None => std::env::vars_os()
                .filter_map(|(name, _)| name.into_string().ok())
                .collect(),
        };
        // The downward API's namespace, when `registrations.namespace` is not set.
        let downward = |name: &str| match &env {
            Some(vars) => vars.get(name).cloned(),
            None => std::env::var(name).ok(),
        };
        let pod_namespace = downward("POD_NAMESPACE");
        let pod_name = downward("POD_NAME");
        // A test's environment stands in for the host's too.
        let host_name = match &env {
            Some(vars) => vars.get("HOSTNAME").cloned(),
            None => crate::ha::settings::host_name(),
        };
        let environment = config::Environment::with_prefix(ENV_PREFIX)
            .prefix_separator(ENV_SEPARATOR)
            .separator(ENV_SEPARATOR)
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("allowed_namespaces")
            .with_list_parse_key("auth.audiences")
            .with_list_parse_key("auth.admin_groups")
            .ignore_empty(true)
            .source(env);
        let loaded = builder.add_source(environment).build()?;
        let mut settings: Settings = match loaded.clone().try_deserialize() {
            Ok(settings) => settings,
            Err(error) => {
                // Serde reads a flattened section through a buffer that drops its keys'
                // names from errors; read alone, the section names the key.
                let error =
                    (loaded.try_deserialize::<crate::app::AppSettings>().err()).unwrap_or(error);
                return Err(locate_unknown_key(error, &env_names, path));
            }
        };
        // `a, b` in the environment means `a` and `b`.
        settings.app.allowed_namespaces = (settings.app.allowed_namespaces.iter())
            .map(|ns| ns.trim().to_string())
            .filter(|ns| !ns.is_empty())
            .collect();
        if settings.registrations.namespace.is_none() {
            settings.registrations.namespace = pod_namespace
                .map(|ns| ns.trim().to_string())
                .filter(|ns| !ns.is_empty());
        }
        settings.ha.resolve_identity(pod_name, host_name);
        settings.validate()?;
        settings.loaded_template = settings.read_template()?;
        Ok(settings)
    }

    /// Rules a deserialised value can still break.
    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            key: key.to_string(),
            reason: reason.to_string(),
        };
        if self.kubernetes.qps == 0 {
            return Err(invalid("kubernetes.qps", "must be > 0"));
        }
        if self.kubernetes.burst == 0 {
            return Err(invalid("kubernetes.burst", "must be > 0"));
        }
        if self.kubernetes.create_concurrency == 0 {
            return Err(invalid("kubernetes.create_concurrency", "must be > 0"));
        }
        if self.kubernetes.request_timeout_ms < 100 {
            return Err(invalid("kubernetes.request_timeout_ms", "must be ≥ 100"));
        }
        if !(1..=5).contains(&self.kubernetes.request_attempts) {
            return Err(invalid(
                "kubernetes.request_attempts",
                "must be within 1..=5",
            ));
        }
        if self.resync_interval_ms < 1000 {
            return Err(invalid("resync_interval_ms", "must be ≥ 1000"));
        }
        if self.allocation.executor_container_name.trim().is_empty() {
            return Err(invalid(
                "allocation.executor_container_name",
                "must not be empty",
            ));
        }
        if let Err((key, reason)) = self.app.validate() {
            return Err(ConfigError::Invalid { key, reason });
        }
        if let Err(crate::allocator::SettingsError::Invalid { name, reason }) =
            self.allocation.validate()
        {
            return Err(ConfigError::Invalid {
                key: format!("allocation.{name}"),
                reason,
            });
        }
        if let Err((key, reason)) = self.limits.check() {
            return Err(ConfigError::Invalid {
                key: format!("limits.{key}"),
                reason,
            });
        }
        let cap = self.limits.max_executors_per_application;
        if self.allocation.max_executors.is_some_and(|max| max > cap) {
            return Err(ConfigError::Invalid {
                key: "allocation.max_executors".to_string(),
                reason: format!("must be at most limits.max_executors_per_application ({cap})"),
            });
        }
        if let Err((key, reason)) = self.pod_policy.check_settings() {
            return Err(ConfigError::Invalid {
                key: format!("pod_policy.{key}"),
                reason: reason.to_string(),
            });
        }
        if let Err((key, reason)) = self.grpc.check() {
            return Err(ConfigError::Invalid {
                key: format!("grpc.{key}"),
                reason,
            });
        }
        if let Err((key, reason)) = self.registrations.check() {
            return Err(ConfigError::Invalid {
                key: format!("registrations.{key}"),
                reason,
            });
        }
        if let Err((key, reason)) = self.tenants.check() {
            return Err(ConfigError::Invalid {
                key: format!("tenants.{key}"),
                reason,
            });
        }
        if let Err((key, reason)) = self.ha.check() {
            return Err(ConfigError::Invalid {
                key: format!("ha.{key}"),
                reason,
            });
        }
        self.budget_policy()?;
        if self.budgets_reload_interval_ms < 100 {
            return Err(invalid("budgets_reload_interval_ms", "must be ≥ 100"));
        }
        tracing_filter_check(&self.log.filter)?;
        if let Err((key, reason)) = self.auth.validate() {
            return Err(ConfigError::Invalid { key, reason });
        }
        if let Err((key, reason)) = self.tls.validate() {
            return Err(ConfigError::Invalid { key, reason });
        }
        match (&self.ha.peer_ca_file, self.tls.enabled()) {
            (Some(_), false) => {
                return Err(invalid(
                    "ha.peer_ca_file",
                    "only with tls.cert_file and tls.key_file (the replicas' forwards are plaintext without them)",
                ));
            }
            (None, true) if self.ha.advertise_address.is_some() => {
                return Err(invalid(
                    "ha.peer_ca_file",
                    "required with tls and ha.advertise_address: the replicas forward calls to each other over TLS",
                ));
            }
            _ => {}
        }
        if let Err(reason) = self.simulator.validate() {
            return Err(ConfigError::Invalid {
                key: "simulator".to_string(),
                reason,
            });
        }
        Ok(())
    }

    /// The Pod of `default_executor_pod_template` (YAML or JSON), if configured, within
    /// the template limits and the pod policy: the one [`Settings::load`] read and checked,
    /// else read now.
    pub fn default_template(&self) -> Result<Option<k8s_openapi::api::core::v1::Pod>, ConfigError> {
        match &self.loaded_template {
            Some(pod) => Ok(Some(pod.clone())),
            None => self.read_template(),
        }
    }

    /// Reads and checks `default_executor_pod_template`.
    fn read_template(&self) -> Result<Option<k8s_openapi::api::core::v1::Pod>, ConfigError> {
        let Some(path) = &self.default_executor_pod_template else {
            return Ok(None);
        };
        let invalid = |reason: String| ConfigError::Invalid {
            key: "default_executor_pod_template".to_string(),
            reason: format!("{}: {reason}", path.display()),
        };
        let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
        let pod =
            crate::app::templates::parse("template", &text, &self.limits).map_err(|e| match e {
                crate::app::AppError::InvalidArgument { message, .. } => invalid(message),
                other => invalid(other.to_string()),
            })?;
        let as_default = crate::allocator::pod_policy::TemplateUse {
            namespace: None,
            driver_pod_name: None,
        };
        self.pod_policy
            .check(&pod, as_default)
            .map_err(|violation| invalid(format!("refused by pod_policy: {violation}")))?;
        Ok(Some(pod))
    }

    /// The deadline and retries of every Kubernetes request.
    pub fn request_policy(&self) -> crate::k8s::RequestPolicy {
        crate::k8s::RequestPolicy {
            timeout: Duration::from_millis(self.kubernetes.request_timeout_ms),
            attempts: self.kubernetes.request_attempts,
            ..crate::k8s::RequestPolicy::default()
        }
    }

    /// The full-resync period.
    pub fn resync_interval(&self) -> Duration {
        Duration::from_millis(self.resync_interval_ms)
    }

    /// The budgets, checked (an error names the key, e.g. `budgets[2].max_cpu`).
    pub fn budget_policy(&self) -> Result<crate::app::BudgetPolicy, ConfigError> {
        crate::app::BudgetPolicy::check(
            &self.budgets,
            self.budgets_queue_label.as_deref(),
            self.budgets_max_weight,
        )
        .map(|policy| crate::app::BudgetPolicy {
            follow_quotas: self.budgets_follow_quotas,
            ..policy
        })
        .map_err(|(key, reason)| ConfigError::Invalid { key, reason })
    }
}

/// Reads the configuration file `path` again every `interval` and, when its text changed,
/// puts its budgets in force in `budgets` (the only settings taken while the service runs;
/// the others need a restart). A file that does not load (a bad value, a half-written
/// file) is refused with a log line naming the key, and the budgets in force stay; it is
/// tried again when it changes. Ends when the returned handle is dropped.
pub fn watch_budgets(
    path: PathBuf,
    interval: Duration,
    budgets: crate::app::Budgets,
) -> BudgetReloader {
    // What is in force now: the file as it is when the watch begins.
    let mut seen = std::fs::read(&path).ok();
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = std::fs::read(&path).ok();
            if now == seen {
                continue;
            }
            seen = now;
            match Settings::load(Some(&path)).and_then(|settings| settings.budget_policy()) {
                Ok(policy) => {
                    if policy != budgets.policy() {
                        let count = policy.budgets.len();
                        match budgets.replace(policy) {
                            Ok(()) => tracing::info!(file = %path.display(), budgets = count,
                                "configuration file changed: budgets reloaded (other settings need a restart)"),
                            Err((key, reason)) => {
                                tracing::error!(file = %path.display(), %key, %reason,
                                "configuration file changed but is refused; the budgets in force stay")
                            }
                        }
                    }
                }
                Err(error) => tracing::error!(file = %path.display(), %error,
                    "configuration file changed but is refused; the budgets in force stay"),
            }
        }
    });
    BudgetReloader(task)
}

/// The task of [`watch_budgets`]; dropping it stops the task.
pub struct BudgetReloader(tokio::task::JoinHandle<()>);

impl Drop for BudgetReloader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// serde names an unknown key but not where it came from; a stray environment variable is
/// the usual culprit, so name it (else the file).
fn locate_unknown_key(
    error: config::ConfigError,
    env_names: &[String],
    path: Option<&Path>,
) -> ConfigError {
    let message = error.to_string();
    let Some(field) = message
        .strip_prefix("unknown field `")
        .and_then(|rest| rest.split('`').next())
    else {
        return ConfigError::Load(error);
    };
    let prefix = format!("{ENV_PREFIX}{ENV_SEPARATOR}");
    let variable = env_names.iter().find(|name| {
        name.strip_prefix(&prefix)
            .and_then(|keys| keys.rsplit(ENV_SEPARATOR).next())
            .is_some_and(|last| last.eq_ignore_ascii_case(field))
    });
    let origin = match (variable, path) {
        (Some(name), _) => format!("the environment variable {name}"),
        (None, Some(path)) => format!("the file {}", path.display()),
        (None, None) => return ConfigError::Load(error),
    };
    ConfigError::UnknownKey { error, origin }
}

fn tracing_filter_check(filter: &str) -> Result<(), ConfigError> {
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(|_| ())
        .map_err(|e| ConfigError::Invalid {
            key: "log.filter".to_string(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::pod_policy::PodSecurityLevel;
    use crate::allocator::state::DEFAULT_EXECUTOR_CONTAINER;
    use std::io::Write;

    fn env(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn file(ext: &str, body: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new()
            .suffix(&format!(".{ext}"))
            .tempfile()
            .unwrap();
        f.write_all(body.as_bytes()).unwrap();
        f
    }

    #[test]
    fn defaults_without_file_or_env() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert_eq!(s.listen, "127.0.0.1:50051".parse().unwrap());
        assert_eq!(s.kubernetes.qps, 1_000_000);
        assert_eq!(s.kubernetes.burst, 1_000_000);
        assert_eq!(s.kubernetes.create_concurrency, 100);
        assert_eq!(s.kubernetes.in_cluster, InCluster::Auto);
        assert_eq!(s.resync_interval(), Duration::from_secs(600));
        assert_eq!(s.resync_pods_per_second, 100);
        assert!(s.app.allowed_namespaces.is_empty());
        assert_eq!(s.log.format, LogFormat::Text);
        assert_eq!(
            s.allocation.executor_container_name,
            DEFAULT_EXECUTOR_CONTAINER
        );
        assert_eq!(s.allocation, AllocationSettings::default());
    }

    #[test]
    fn the_replica_identity_is_the_pods_name_unless_set_and_ha_values_are_checked() {
        let s =
            Settings::load_with_env(None, env(&[("POD_NAME", "spa-0"), ("HOSTNAME", "host-1")]))
                .unwrap();
        assert_eq!(s.ha.identity(), "spa-0");
        assert_eq!(s.ha.shards, 1);
        let s = Settings::load_with_env(None, env(&[("HOSTNAME", "host-1")])).unwrap();
        assert_eq!(s.ha.identity(), "host-1");
        let s = Settings::load_with_env(
            None,
            env(&[
                ("POD_NAME", "spa-0"),
                ("SPARK_POD_ALLOCATOR__HA__IDENTITY", "replica-a"),
                ("SPARK_POD_ALLOCATOR__HA__SHARDS", "8"),
            ]),
        )
        .unwrap();
        assert_eq!((s.ha.identity(), s.ha.shards), ("replica-a", 8));
        for (name, value, key) in [
            ("SPARK_POD_ALLOCATOR__HA__SHARDS", "0", "ha.shards"),
            (
                "SPARK_POD_ALLOCATOR__HA__RENEW_DEADLINE_MS",
                "20000",
                "ha.renew_deadline_ms",
            ),
            (
                "SPARK_POD_ALLOCATOR__HA__LEASE_DURATION_MS",
                "2500",
                "ha.lease_duration_ms",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn the_registrations_namespace_is_the_pods_unless_set_and_is_checked() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert_eq!(s.registrations.namespace(), "default");
        assert_eq!(
            s.registrations.key_secret,
            "spark-pod-allocator-registration-key"
        );
        let s = Settings::load_with_env(None, env(&[("POD_NAMESPACE", "spark-system")])).unwrap();
        assert_eq!(s.registrations.namespace(), "spark-system");
        let s = Settings::load_with_env(
            None,
            env(&[
                ("POD_NAMESPACE", "spark-system"),
                ("SPARK_POD_ALLOCATOR__REGISTRATIONS__NAMESPACE", "ops"),
            ]),
        )
        .unwrap();
        assert_eq!(s.registrations.namespace(), "ops");
        for (name, value, key) in [
            (
                "POD_NAMESPACE",
                "Not_A_Namespace",
                "registrations.namespace",
            ),
            (
                "SPARK_POD_ALLOCATOR__REGISTRATIONS__KEY_SECRET",
                "a/b",
                "registrations.key_secret",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&[(name, value)])).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn the_allocation_policy_is_a_server_default_from_file_or_env() {
        use crate::allocator::AllocationPolicy;
        let f = file("toml", "[allocation]\npolicy = \"adaptive\"\n");
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(s.allocation.policy, AllocationPolicy::Adaptive);
        let s = Settings::load_with_env(
            Some(f.path()),
            env(&[("SPARK_POD_ALLOCATOR__ALLOCATION__POLICY", "spark")]),
        )
        .unwrap();
        assert_eq!(s.allocation.policy, AllocationPolicy::Spark);
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__ALLOCATION__POLICY", "fast")]),
        )
        .unwrap_err();
        assert!(err.to_string().contains("allocation.policy"), "{err}");
    }

    #[test]
    fn health_listen_is_off_by_default_and_set_like_metrics_listen() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert_eq!(s.health.listen, None);
        let s = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__HEALTH__LISTEN", "0.0.0.0:8081")]),
        )
        .unwrap();
        assert_eq!(s.health.listen, Some("0.0.0.0:8081".parse().unwrap()));
        let f = file("toml", "[health]\nlisten = \"probes:8081\"\n");
        let err = Settings::load_with_env(Some(f.path()), env(&[])).unwrap_err();
        assert!(err.to_string().contains("health.listen"), "{err}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_when_empty() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert_eq!(s.metrics.listen, None);
        let f = file("toml", "[metrics]\nlisten = \"0.0.0.0:9100\"\n");
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(s.metrics.listen, Some("0.0.0.0:9100".parse().unwrap()));
        let f = file("toml", "[metrics]\nlisten = \"\"\n");
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(s.metrics.listen, None);
        assert!(
            !s.metrics.application_labels,
            "no application id by default"
        );
        let f = file("toml", "[metrics]\napplication_labels = true\n");
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert!(s.metrics.application_labels);
        let f = file("toml", "[metrics]\nlisten = \"localhost:9090\"\n");
        let err = Settings::load_with_env(Some(f.path()), env(&[])).unwrap_err();
        assert!(err.to_string().contains("metrics.listen"), "{err}");
    }

    #[test]
    fn auth_section_is_loaded_and_checked() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert_eq!(s.auth.mode, crate::auth::AuthMode::None);
        let f = file(
            "yaml",
            "auth:\n  mode: kubernetes\n  audiences: [spark-pod-allocator]\n  admin_groups: [ops]\n",
        );
        let s = Settings::load_with_env(
            Some(f.path()),
            env(&[("SPARK_POD_ALLOCATOR__AUTH__ADMIN_GROUPS", "ops,sre")]),
        )
        .unwrap();
        assert_eq!(s.auth.mode, crate::auth::AuthMode::Kubernetes);
        assert_eq!(s.auth.audiences, vec!["spark-pod-allocator"]);
        assert_eq!(s.auth.admin_groups, vec!["ops", "sre"]);
        for (key, value, named) in [
            ("SPARK_POD_ALLOCATOR__AUTH__MODE", "ldap", "auth.mode"),
            (
                "SPARK_POD_ALLOCATOR__AUTH__CACHE_CAPACITY",
                "0",
                "auth.cache_capacity",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{key}={value}: {err}");
        }
    }

    #[test]
    fn tls_needs_both_files_and_reads_them_at_load() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert!(!s.tls.enabled());
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__TLS__CERT_FILE", "/etc/tls.crt")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tls.key_file"), "{err}");
        let err = Settings::load_with_env(
            None,
            env(&[
                (
                    "SPARK_POD_ALLOCATOR__TLS__CERT_FILE",
                    "/nonexistent/tls.crt",
                ),
                ("SPARK_POD_ALLOCATOR__TLS__KEY_FILE", "/nonexistent/tls.key"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("tls.cert_file") && err.contains("/nonexistent/tls.crt"),
            "{err}"
        );
    }

    #[test]
    fn file_overrides_defaults_and_env_overrides_file() {
        let f = file(
            "toml",
            "listen = \"0.0.0.0:6000\"\nallowed_namespaces = [\"a\", \"b\"]\n\
             [allocation]\nbatch_size = 20\nbatch_delay_ms = 500\n\
             [kubernetes]\nqps = 7\n",
        );
        let s = Settings::load_with_env(
            Some(f.path()),
            env(&[("SPARK_POD_ALLOCATOR__ALLOCATION__BATCH_SIZE", "30")]),
        )
        .unwrap();
        assert_eq!(s.listen, "0.0.0.0:6000".parse().unwrap());
        assert_eq!(s.app.allowed_namespaces, vec!["a", "b"]);
        assert_eq!(s.kubernetes.qps, 7);
        let a = &s.allocation;
        assert_eq!(a.batch_size, 30);
        assert_eq!(a.batch_delay, Duration::from_millis(500));
    }

    #[test]
    fn yaml_file_and_env_list() {
        let f = file(
            "yaml",
            "log:\n  format: json\nallocation:\n  max_pending_pods: 40\n  delete_on_termination: false\n",
        );
        let s = Settings::load_with_env(
            Some(f.path()),
            env(&[("SPARK_POD_ALLOCATOR__ALLOWED_NAMESPACES", "spark,batch")]),
        )
        .unwrap();
        assert_eq!(s.log.format, LogFormat::Json);
        assert_eq!(s.app.allowed_namespaces, vec!["spark", "batch"]);
        let spaced = env(&[("SPARK_POD_ALLOCATOR__ALLOWED_NAMESPACES", "spark, batch,")]);
        let s2 = Settings::load_with_env(None, spaced).unwrap();
        assert_eq!(s2.app.allowed_namespaces, vec!["spark", "batch"]);
        let a = &s.allocation;
        assert_eq!(a.max_pending_pods, Some(40));
        assert!(!a.delete_on_termination);
    }

    #[test]
    fn bad_number_in_env_names_the_key() {
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__KUBERNETES__QPS", "fast")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kubernetes.qps"), "{err}");
        // A key of the application layer's flattened section is named as a top-level key.
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__DRIVER_END_GRACE_MS", "soon")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("driver_end_grace_ms"), "{err}");
        let f = file("toml", "driver_end_grace_ms = -5\n");
        let err = (Settings::load_with_env(Some(f.path()), env(&[])).unwrap_err()).to_string();
        assert!(err.contains("driver_end_grace_ms"), "{err}");
    }

    #[test]
    fn the_allocation_section_has_the_apis_names_and_units() {
        let f = file(
            "toml",
            "[allocation]\nexecutor_timeout_ms = 30000\nexecutor_idle_timeout_ms = 5000\n\
             max_pending_pods_per_profile = 3\nmax_executors = 200\n\
             executor_container_name = \"main\"\ncheck_all_containers = true\n\
             stuck_pending_timeout_ms = 45000\n",
        );
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(
            s.allocation,
            AllocationSettings {
                executor_timeout: Duration::from_secs(30),
                executor_idle_timeout: Duration::from_secs(5),
                max_pending_pods_per_profile: Some(3),
                max_executors: Some(200),
                executor_container_name: "main".into(),
                check_all_containers: true,
                stuck_pending_timeout: Duration::from_secs(45),
                ..AllocationSettings::default()
            }
        );
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__ALLOCATION__BATCH_DELAY_MS", "soon")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("allocation.batch_delay_ms"), "{err}");
    }

    #[test]
    fn unknown_log_format_names_the_key() {
        let err =
            Settings::load_with_env(None, env(&[("SPARK_POD_ALLOCATOR__LOG__FORMAT", "xml")]))
                .unwrap_err()
                .to_string();
        assert!(err.contains("log.format"), "{err}");
    }

    #[test]
    fn in_cluster_takes_booleans_and_strings_from_every_source() {
        for (value, expected) in [
            ("true", InCluster::True),
            ("false", InCluster::False),
            ("auto", InCluster::Auto),
            ("yes", InCluster::True),
            ("NO", InCluster::False),
        ] {
            let settings = Settings::load_with_env(
                None,
                env(&[("SPARK_POD_ALLOCATOR__KUBERNETES__IN_CLUSTER", value)]),
            )
            .unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(settings.kubernetes.in_cluster, expected, "{value}");
        }
        let toml = file("toml", "[kubernetes]\nin_cluster = false\n");
        let yaml = file("yaml", "kubernetes:\n  in_cluster: true\n");
        let from_toml = Settings::load_with_env(Some(toml.path()), env(&[])).expect("toml");
        let from_yaml = Settings::load_with_env(Some(yaml.path()), env(&[])).expect("yaml");
        assert_eq!(from_toml.kubernetes.in_cluster, InCluster::False);
        assert_eq!(from_yaml.kubernetes.in_cluster, InCluster::True);
    }

    #[test]
    fn choices_and_addresses_say_what_is_expected() {
        for (key, value, expected) in [
            (
                "SPARK_POD_ALLOCATOR__KUBERNETES__IN_CLUSTER",
                "maybe",
                "`kubernetes.in_cluster`",
            ),
            ("SPARK_POD_ALLOCATOR__LOG__FORMAT", "xml", "`log.format`"),
            (
                "SPARK_POD_ALLOCATOR__POD_POLICY__LEVEL",
                "privileged",
                "`pod_policy.level`",
            ),
            (
                "SPARK_POD_ALLOCATOR__SIMULATOR__KUBELET__MODE",
                "lazy",
                "`simulator.kubelet.mode`",
            ),
            ("SPARK_POD_ALLOCATOR__LISTEN", "localhost:50051", "`listen`"),
        ] {
            let err = Settings::load_with_env(None, env(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expected) && err.contains(&format!("{value:?}")),
                "{err}"
            );
            assert!(err.contains("expected"), "{err}");
            assert!(!err.contains("enum"), "no Rust type names: {err}");
        }
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__LISTEN", "localhost:50051")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("127.0.0.1:50051"), "{err}");
    }

    #[test]
    fn batch_delay_below_rule_names_the_key() {
        let f = file("toml", "[allocation]\nbatch_delay_ms = 50\n");
        let err = Settings::load_with_env(Some(f.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("allocation.batch_delay_ms"), "{err}");
    }

    #[test]
    fn invalid_values_name_their_key() {
        for (key, value, named) in [
            (
                "SPARK_POD_ALLOCATOR__KUBERNETES__BURST",
                "0",
                "kubernetes.burst",
            ),
            ("SPARK_POD_ALLOCATOR__LISTEN", "nowhere", "listen"),
            (
                "SPARK_POD_ALLOCATOR__ALLOWED_NAMESPACES",
                "Bad_NS",
                "allowed_namespaces",
            ),
            (
                "SPARK_POD_ALLOCATOR__RESYNC_INTERVAL_MS",
                "10",
                "resync_interval_ms",
            ),
            (
                "SPARK_POD_ALLOCATOR__ALLOCATION__BATCH_SIZE",
                "0",
                "allocation.batch_size",
            ),
            (
                "SPARK_POD_ALLOCATOR__HA__ADVERTISE_ADDRESS",
                "nowhere",
                "ha.advertise_address",
            ),
            // Without TLS the replicas' forwards are plaintext: a CA would mislead.
            (
                "SPARK_POD_ALLOCATOR__HA__PEER_CA_FILE",
                "/etc/ca.crt",
                "ha.peer_ca_file",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{key}={value}: {err}");
        }
    }

    #[test]
    fn default_template_is_loaded_and_checked() {
        let pod = file(
            "yaml",
            "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: x\n    image: busybox\n",
        );
        let s = Settings::load_with_env(
            None,
            env(&[(
                "SPARK_POD_ALLOCATOR__DEFAULT_EXECUTOR_POD_TEMPLATE",
                pod.path().to_str().unwrap(),
            )]),
        )
        .unwrap();
        let template = s.default_template().unwrap().unwrap();
        assert_eq!(template.spec.unwrap().containers[0].name, "x");
        let err = Settings::load_with_env(
            None,
            env(&[(
                "SPARK_POD_ALLOCATOR__DEFAULT_EXECUTOR_POD_TEMPLATE",
                "/nonexistent/pod.yaml",
            )]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("default_executor_pod_template"), "{err}");
    }

    #[test]
    fn a_default_template_the_policy_refuses_stops_start_up() {
        let pod = file(
            "yaml",
            "apiVersion: v1\nkind: Pod\nspec:\n  hostNetwork: true\n  containers:\n  - name: x\n    image: busybox\n",
        );
        let key = "SPARK_POD_ALLOCATOR__DEFAULT_EXECUTOR_POD_TEMPLATE";
        let path = pod.path().to_str().unwrap();
        let err = Settings::load_with_env(None, env(&[(key, path)]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("default_executor_pod_template") && err.contains("spec.hostNetwork"),
            "{err}"
        );
        let allowed = file("toml", "[pod_policy]\nallow_host_namespaces = true\n");
        let s = Settings::load_with_env(Some(allowed.path()), env(&[(key, path)])).unwrap();
        assert!(s.default_template().unwrap().is_some());
    }

    #[test]
    fn policy_limits_and_server_limits_are_loaded_and_checked() {
        let f = file(
            "toml",
            "[pod_policy]\nallowed_service_accounts = [\"default\", \"spark\"]\n\
             scheduler_names = [\"volcano\"]\n\
             [limits]\nmax_template_bytes = 1024\nmax_executors_per_application = 50\n\
             [grpc]\nmax_connections = 8\nkeepalive_interval_ms = 0\n",
        );
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(s.pod_policy.allowed_service_accounts, ["default", "spark"]);
        assert_eq!(s.pod_policy.scheduler_names, ["volcano"]);
        assert!(s.pod_policy.enforce);
        assert_eq!(s.pod_policy.level, PodSecurityLevel::Baseline);
        assert_eq!(s.limits.max_template_bytes, 1024);
        assert_eq!(s.limits.max_resource_profiles, 64);
        assert_eq!(s.grpc.max_connections, 8);
        assert_eq!(s.grpc.keepalive_interval(), None);
        for (key, value, named) in [
            (
                "SPARK_POD_ALLOCATOR__LIMITS__MAX_TEMPLATE_DEPTH",
                "0",
                "limits.max_template_depth",
            ),
            (
                "SPARK_POD_ALLOCATOR__GRPC__MAX_CONNECTIONS",
                "0",
                "grpc.max_connections",
            ),
            (
                "SPARK_POD_ALLOCATOR__GRPC__MAX_UNAUTHENTICATED_CONNECTIONS",
                "0",
                "grpc.max_unauthenticated_connections",
            ),
            (
                "SPARK_POD_ALLOCATOR__GRPC__UNAUTHENTICATED_IDLE_TIMEOUT_MS",
                "0",
                "grpc.unauthenticated_idle_timeout_ms",
            ),
            (
                "SPARK_POD_ALLOCATOR__ALLOCATION__MAX_EXECUTORS",
                "10001",
                "allocation.max_executors",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&[(key, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named), "{key}={value}: {err}");
        }
    }

    #[test]
    fn the_pod_security_level_is_loaded_and_contradictions_named() {
        let f = file("toml", "[pod_policy]\nlevel = \"restricted\"\n");
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(s.pod_policy.level, PodSecurityLevel::Restricted);
        let level = ("SPARK_POD_ALLOCATOR__POD_POLICY__LEVEL", "Restricted");
        let s = Settings::load_with_env(None, env(&[level])).unwrap();
        assert_eq!(s.pod_policy.level, PodSecurityLevel::Restricted);
        for (key, named) in [
            (
                "SPARK_POD_ALLOCATOR__POD_POLICY__ALLOW_HOST_PATH",
                "pod_policy.allow_host_path",
            ),
            (
                "SPARK_POD_ALLOCATOR__POD_POLICY__ALLOW_PRIVILEGE_ESCALATION",
                "pod_policy.allow_privilege_escalation",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&[level, (key, "true")]))
                .unwrap_err()
                .to_string();
            assert!(err.contains(named) && err.contains("restricted"), "{err}");
            Settings::load_with_env(None, env(&[(key, "true")])).expect("baseline allows it");
        }
    }

    #[test]
    fn simulator_section_is_loaded_and_checked() {
        let f = file(
            "toml",
            "[simulator]\nseed = 7\n[simulator.kubelet]\nmode = \"manual\"\n",
        );
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        assert_eq!(s.simulator.seed, 7);
        assert_eq!(
            s.simulator.kubelet.mode,
            spark_pod_allocator_sim::KubeletMode::Manual
        );
        let err = Settings::load_with_env(
            None,
            env(&[(
                "SPARK_POD_ALLOCATOR__SIMULATOR__FAULTS__QUOTA_FRACTION",
                "2.5",
            )]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("simulator"), "{err}");
    }

    #[test]
    fn unknown_key_and_unknown_extension_are_refused() {
        let f = file("toml", "[allocation]\nbatch_sise = 5\n");
        let err = Settings::load_with_env(Some(f.path()), env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("batch_sise"), "{err}");
        assert!(err.contains(&format!("{}", f.path().display())), "{err}");
        let err = Settings::load_with_env(
            None,
            env(&[("SPARK_POD_ALLOCATOR__ALLOCATION__BATCHSIZE", "5")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`batchsize`")
                && err.contains(
                    "the environment variable SPARK_POD_ALLOCATOR__ALLOCATION__BATCHSIZE"
                ),
            "{err}"
        );
        let f = file("ini", "x=1");
        assert!(matches!(
            Settings::load_with_env(Some(f.path()), env(&[])),
            Err(ConfigError::UnknownFormat(_))
        ));
    }

    #[test]
    fn budgets_load_from_the_file_and_a_bad_one_is_refused_naming_its_key() {
        let f = file(
            "yaml",
            "budgets_queue_label: queue\nbudgets:\n- namespace: team-a\n  max_executors: 30\n  max_pending: 10\n  max_cpu: 64\n  max_memory: 256Gi\n- queue: gold\n  name: gold\n  namespaces:\n  - team-b\n  - namespace: team-c\n    weight: 2\n  max_executors: 100\n  max_cpu: \"500m\"\n",
        );
        let s = Settings::load_with_env(Some(f.path()), env(&[])).unwrap();
        let policy = s.budget_policy().unwrap();
        assert_eq!(policy.queue_label.as_deref(), Some("queue"));
        assert_eq!(policy.budgets[0].name, "namespace/team-a");
        let limits = policy.budgets[0].limits;
        assert_eq!(limits.max_executors, 30);
        assert_eq!(limits.max_pending, Some(10));
        assert_eq!(limits.max_cpu_millis, Some(64_000));
        assert_eq!(limits.max_memory_bytes, Some(256 << 30));
        assert_eq!(policy.budgets[1].limits.max_cpu_millis, Some(500));
        let tenants: Vec<(&str, u32)> = (policy.budgets[1].tenants.iter())
            .map(|(ns, w)| (ns.as_str(), *w))
            .collect();
        assert_eq!(tenants, [("team-b", 1), ("team-c", 2)]);
        let f = file(
            "toml",
            "[[budgets]]\nnamespace = \"a\"\nmax_executors = 1\n[[budgets]]\nnamespace = \"b\"\nmax_executors = 1\nmax_cpu = \"many\"\n",
        );
        let err = Settings::load_with_env(Some(f.path()), env(&[])).unwrap_err();
        assert!(
            matches!(&err, ConfigError::Invalid { key, .. } if key == "budgets[1].max_cpu"),
            "{err}"
        );
        // A queue without namespaces: the driver label no longer makes members.
        let f = file("toml", "[[budgets]]\nqueue = \"gold\"\nmax_executors = 1\n");
        let err = Settings::load_with_env(Some(f.path()), env(&[])).unwrap_err();
        assert!(err.to_string().contains("budgets[0].namespaces"), "{err}");
    }

    #[tokio::test]
    async fn a_changed_file_replaces_the_budgets_and_a_bad_one_leaves_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let write = |max: &str| {
            std::fs::write(
                &path,
                format!("[[budgets]]\nnamespace = \"team\"\nmax_executors = {max}\n"),
            )
            .unwrap()
        };
        write("30");
        let settings = Settings::load_with_env(Some(&path), env(&[])).unwrap();
        let budgets = crate::app::Budgets::new(
            settings.budget_policy().unwrap(),
            crate::metrics::Metrics::new(),
        );
        let _reloader = watch_budgets(path.clone(), Duration::from_millis(20), budgets.clone());
        let max = |b: &crate::app::Budgets| b.policy().budgets[0].limits.max_executors;
        write("40");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while max(&budgets) != 40 {
            assert!(std::time::Instant::now() < deadline, "not reloaded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A bad file is refused; the next good one is taken.
        write("0");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(max(&budgets), 40);
        write("50");
        while max(&budgets) != 50 {
            assert!(std::time::Instant::now() < deadline, "not reloaded");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
