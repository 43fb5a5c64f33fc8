//! Everything that talks to Kubernetes: shared pod watches per namespace with the periodic
//! resync ([`PodWatches`]); the one client every request goes through, under one
//! client-side rate limit and the request policy ([`ApiClient`]); on it, the executor pods'
//! creates, deletes and listings ([`ExecutorPodClient`]), the executor id record
//! ([`IdRecord`]), the applications' registrations in the service's namespace
//! ([`RegistrationStore`]), and Start's namespace and driver pod lookups ([`placement`]);
//! and building the client from [`KubernetesSettings`] ([`connect`]).
pub mod client;
pub mod config_map;
pub mod executor_claims;
pub mod executor_pods;
pub mod id_record;
pub mod leases;
pub mod placement;
pub mod rate_limit;
pub mod registrations;
pub mod request;
pub mod watch;

pub use client::ApiClient;
pub use executor_pods::{CreateError, ExecutorCreate, ExecutorPodClient, labels};
pub use id_record::IdRecord;
pub use rate_limit::RateLimiter;
pub use registrations::{RegistrationSettings, RegistrationStore};
pub use request::{RequestPolicy, describe_error};
pub use watch::{Listed, PodEvent, PodWatches, ResyncPace, Subscription};

use std::path::PathBuf;

use serde::Deserialize;

/// How the service reaches Kubernetes (the configuration's `kubernetes` section).
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesSettings {
    /// Kubeconfig file; unset = `KUBECONFIG` / `~/.kube/config` or in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context; unset = the current context.
    pub context: Option<String>,
    /// `auto` (in-cluster when running in a pod, else kubeconfig), `true` or `false`.
    pub in_cluster: InCluster,
    /// Sustained mutating requests per second (creates, deletes, patches), shared by all
    /// apps: a cap an operator may set; by default none in practice.
    pub qps: u32,
    /// Mutating requests allowed in a burst above `qps`.
    pub burst: u32,
    /// Creates of one application that may be in flight at once, over all its rounds.
    pub create_concurrency: u32,
    /// Deadline of one attempt of any Kubernetes request.
    pub request_timeout_ms: u64,
    /// Attempts of a request that timed out or failed transiently (1 = no retry).
    pub request_attempts: u32,
}

/// Whether to use the in-cluster service account: `auto`, `true` or `false`, given as a
/// string or as a boolean (TOML and YAML `true`, and the environment, give booleans).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum InCluster {
    #[default]
    Auto,
    True,
    False,
}

impl<'de> Deserialize<'de> for InCluster {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Choice;
        impl serde::de::Visitor<'_> for Choice {
            type Value = InCluster;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("`auto`, `true` or `false`")
            }
            fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<InCluster, E> {
                Ok(if value {
                    InCluster::True
                } else {
                    InCluster::False
                })
            }
            fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<InCluster, E> {
                match value.trim().to_ascii_lowercase().as_str() {
                    "auto" => Ok(InCluster::Auto),
                    "true" | "yes" => Ok(InCluster::True),
                    "false" | "no" => Ok(InCluster::False),
                    _ => Err(E::custom(format!(
                        "expected `auto`, `true` or `false`, got {value:?}"
                    ))),
                }
            }
        }
        deserializer.deserialize_any(Choice)
    }
}

impl schemars::JsonSchema for InCluster {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "InCluster".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": ["string", "boolean"] })
    }
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        let policy = RequestPolicy::default();
        Self {
            kubeconfig: None,
            context: None,
            in_cluster: InCluster::Auto,
            // No cap in practice: the API server's answers pace the creates (429 with
            // Retry-After, ADAPTIVE's window and its bound on what waits unanswered).
            qps: 1_000_000,
            burst: 1_000_000,
            create_concurrency: 100,
            request_timeout_ms: u64::try_from(policy.timeout.as_millis()).unwrap_or(u64::MAX),
            request_attempts: policy.attempts,
        }
    }
}

/// Why no Kubernetes client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// The file of `kubernetes.kubeconfig` cannot be used.
    #[error("kubernetes.kubeconfig {path}: {source}")]
    KubeconfigFile {
        path: std::path::PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("in-cluster configuration: {0}")]
    InCluster(#[from] kube::config::InClusterError),
    #[error(
        "no Kubernetes configuration found (set kubernetes.kubeconfig, i.e. \
         SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG, or run `serve --simulate`): {0}"
    )]
    Infer(#[from] kube::config::InferConfigError),
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// A client as configured: an explicit kubeconfig (and context), in-cluster, or inferred
/// (`KUBECONFIG`, `~/.kube/config`, then in-cluster) when `in_cluster` is `auto`.
pub async fn connect(settings: &KubernetesSettings) -> Result<kube::Client, ConnectError> {
    connect_as(settings, USER_AGENT).await
}

/// As [`connect`], every request sent with `user_agent` (one naming the replica:
/// [`replica_user_agent`]).
pub async fn connect_as(
    settings: &KubernetesSettings,
    user_agent: &str,
) -> Result<kube::Client, ConnectError> {
    Ok(client_as(config(settings).await?, user_agent)?)
}

/// The connection [`connect`] makes, before it is a client (its `cluster_url` is the API
/// server's address as this machine reaches it).
pub async fn config(settings: &KubernetesSettings) -> Result<kube::Config, ConnectError> {
    let options = kube::config::KubeConfigOptions {
        context: settings.context.clone(),
        ..Default::default()
    };
    let mut config = match (&settings.kubeconfig, settings.in_cluster) {
        (_, InCluster::True) => kube::Config::incluster()?,
        (Some(path), _) => {
            let in_file = |source| ConnectError::KubeconfigFile {
                path: path.clone(),
                source,
            };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(in_file)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(in_file)?
        }
        (None, InCluster::False) => kube::Config::from_kubeconfig(&options).await?,
        (None, InCluster::Auto) if settings.context.is_some() => {
            kube::Config::from_kubeconfig(&options).await?
        }
        (None, InCluster::Auto) => kube::Config::infer().await?,
    };
    // Our own deadline and retries apply to every request (`RequestPolicy`); kube's retry
    // layer would retry 429/503/504 up to 15 times honouring Retry-After inside them.
    config.default_retry = false;
    // Later "not reachable" warnings and UNAVAILABLE answers name no address: this does.
    tracing::info!(url = %config.cluster_url, namespace = %config.default_namespace, "kubernetes API server");
    Ok(config)
}

/// The User-Agent of every request the service sends to Kubernetes, so that an audit log
/// tells them from other clients' (kube-rs sends none of its own).
pub const USER_AGENT: &str = concat!("spark-pod-allocator/", env!("CARGO_PKG_VERSION"));

/// The service's client of `config`: every request carries [`USER_AGENT`] (in place of
/// any User-Agent the config names). Every client the service sends requests with is
/// built here (`main`, the demo, the benchmarks and the test kit).
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    client_as(config, USER_AGENT)
}

/// The User-Agent of replica `identity` (`ha.identity`): [`USER_AGENT`], then the
/// identity, so that an audit log tells the replicas apart too.
pub fn replica_user_agent(identity: &str) -> String {
    format!("{USER_AGENT} ({identity})")
}

/// As [`client`], every request sent with `user_agent` (a header value; one that is not
/// is replaced by [`USER_AGENT`]).
pub fn client_as(mut config: kube::Config, user_agent: &str) -> Result<kube::Client, kube::Error> {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    let value = http::HeaderValue::from_str(user_agent)
        .unwrap_or_else(|_| http::HeaderValue::from_static(USER_AGENT));
    config.headers.push((http::header::USER_AGENT, value));
    kube::Client::try_from(config)
}
