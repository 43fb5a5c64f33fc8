//! Everything that talks to Kubernetes: shared pod watches per namespace with the periodic
//! resync ([`PodWatches`]), executor pod creates and deletes under one client-side rate
//! limit ([`ExecutorPods`]), and building the client from the configuration ([`connect`]).
pub mod id_record;
pub mod pods;
pub mod rate_limit;
pub mod request;
pub mod watch;

pub use id_record::IdRecord;
pub use pods::{CreateError, ExecutorPods};
pub use rate_limit::RateLimiter;
pub use request::RequestPolicy;
pub use watch::{Listed, PodEvent, PodWatches, Subscription};

use crate::config::{InCluster, KubernetesSettings};

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
    Ok(kube::Client::try_from(config)?)
}

/// A Kubernetes error as one log-friendly line; for an API error the server's reason,
/// code and message (`Forbidden (403): pods "x" is forbidden: exceeded quota ...`).
pub fn describe_error(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            format!("{} ({}): {}", status.reason, status.code, status.message)
        }
        other => other.to_string(),
    }
}
