//! The runtime: the composition root of a service and the lifecycle of a running one.
//! [`Builder`] wires the parts once, from the clock, the configuration and the metrics: the
//! rate limiter, the Kubernetes request types and the shared watches over one client, and
//! the applications over them, with the readiness that waits for them ([`Initialize`]: the
//! API server probe and every namespace watch started before the service is ready hold a
//! handle). [`Core::serve`] gives that readiness and the drain signal to the gRPC server,
//! and once the server has drained stops every application actor, leaving executor pods
//! in place for a restarted service. `main`, the demo, the benchmarks and the test kit all
//! build a service through [`Builder`].
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::app::{Applications, KubernetesParts, ServiceContext, ShardKeepers, feed};
use crate::config::Settings;
use crate::grpc::{self, ServeError, ServeSettings};
use crate::k8s::{
    ApiClient, ExecutorPodClient, PodWatches, RateLimiter, RegistrationStore, RequestPolicy,
    ResyncPace, leases,
};
use crate::lifecycle::{self, Drain, Initialize};
use crate::metrics::Metrics;
use crate::time::Clock;

/// Builds a service over one Kubernetes client: the one place its parts are wired.
///
/// ```no_run
/// # async fn example(client: kube::Client) -> anyhow::Result<()> {
/// use std::sync::Arc;
/// use spark_pod_allocator::app::SystemClock;
/// use spark_pod_allocator::grpc::ServeSettings;
/// use spark_pod_allocator::runtime::Builder;
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let core = Builder::new(client, Arc::new(SystemClock)).build();
/// core.applications().resume_registered().await?;
/// let service = core.serve(ServeSettings::default(), listener)?;
/// println!("serving on {}", service.address());
/// service.shutdown().await?;
/// # Ok(())
/// # }
/// ```
pub struct Builder {
    client: kube::Client,
    clock: Arc<dyn Clock>,
    settings: Settings,
    metrics: Metrics,
    executor_stream_buffer: usize,
    request_policy: Option<RequestPolicy>,
}

impl Builder {
    /// A service over `client` with time from `clock`, the default configuration and
    /// metrics of its own.
    pub fn new(client: kube::Client, clock: Arc<dyn Clock>) -> Self {
        Self {
            client,
            clock,
            settings: Settings::default(),
            metrics: Metrics::default(),
            executor_stream_buffer: feed::STREAM_BUFFER,
            request_policy: None,
        }
    }

    /// Runs with `settings` (the configuration `main` loaded): each part takes its
    /// section. The start-up checks are [`Settings::load`]'s.
    pub fn with_settings(mut self, settings: &Settings) -> Self {
        self.settings = settings.clone();
        self
    }

    /// Changes a WatchExecutors stream may leave unread before it is given a fresh full
    /// state (not a setting: a test makes a slow reader with a small one).
    pub fn with_executor_stream_buffer(mut self, changes: usize) -> Self {
        self.executor_stream_buffer = changes;
        self
    }

    /// Every Kubernetes request under `policy` instead of the configuration's deadline and
    /// attempts (a test pauses less between retries than the default).
    pub fn with_request_policy(mut self, policy: RequestPolicy) -> Self {
        self.request_policy = Some(policy);
        self
    }

    /// Records into `metrics` (the one the composition root serves).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Wires the parts and starts the API server probe (on the current tokio runtime).
    pub fn build(self) -> Core {
        let Self {
            client,
            clock,
            settings,
            metrics,
            executor_stream_buffer,
            request_policy,
        } = self;
        let initialize = Initialize::new();
        let kubernetes = &settings.kubernetes;
        let limiter = RateLimiter::new(kubernetes.qps, kubernetes.burst);
        let api = ApiClient::new(client.clone(), limiter)
            .with_policy(request_policy.unwrap_or_else(|| settings.request_policy()))
            .with_metrics(metrics.clone());
        let create_concurrency =
            usize::try_from(kubernetes.create_concurrency).unwrap_or(usize::MAX);
        let pods = ExecutorPodClient::new(api.clone(), create_concurrency);
        let registrations = RegistrationStore::new(api, &settings.registrations);
        let lease_namespace = (settings.ha.lease_namespace.clone())
            .unwrap_or_else(|| settings.registrations.namespace().to_string());
        // Checked by `Settings::load`.
        let budgets = settings.budget_policy().unwrap_or_default();
        let release = CancellationToken::new();
        let (ownerships, keepers) = leases::spawn_keepers(
            &client,
            &lease_namespace,
            &settings.ha,
            // Read once: membership decides shards for the life of the process.
            budgets.shard_keys(),
            &release,
            &initialize,
        );
        let watches = PodWatches::new(
            client,
            Arc::clone(&clock),
            ResyncPace {
                interval: settings.resync_interval(),
                pods_per_second: settings.resync_pods_per_second,
            },
            metrics.clone(),
            initialize.joiner(),
        );
        // Ends by itself once the API server answers, or once the watches are dropped.
        drop(watches.spawn_probe());
        let ctx = ServiceContext {
            clock,
            metrics,
            app: settings.app.clone(),
            qps: kubernetes.qps,
            executor_stream_buffer,
            limits: settings.limits.clone(),
            pod_policy: settings.pod_policy.clone(),
            tenants: settings.tenants.clone(),
            ha: settings.ha.clone(),
            budgets,
        };
        let kubernetes = KubernetesParts {
            pods,
            registrations,
            watches,
            ownerships,
        };
        let applications = Applications::new(ctx, kubernetes);
        applications.spawn_shard_supervisor();
        applications.hold_shard_keepers(ShardKeepers::new(release, keepers));
        Core {
            applications,
            initialize,
        }
    }

    /// [`Self::build`], then [`Core::serve`].
    pub fn start(self, settings: ServeSettings, listener: TcpListener) -> std::io::Result<Service> {
        self.build().serve(settings, listener)
    }
}

/// A service built and not serving yet: its applications (to resume what a previous
/// service ran before the first call is taken) and the readiness that waits for them.
pub struct Core {
    applications: Applications,
    initialize: Initialize,
}

impl Core {
    /// The registry the server will call.
    pub fn applications(&self) -> &Applications {
        &self.applications
    }

    /// The registry alone, for a caller without a gRPC server (the benchmarks, the tests of the
    /// application layer): no one waits for its readiness.
    pub fn into_applications(self) -> Applications {
        self.applications
    }

    /// Starts the gRPC server on `listener` (and gRPC health alone on
    /// `settings.health_listen`, if set), in this process. Health is SERVING once the API
    /// server has answered and every watch started before then has completed its first
    /// listing. Dropping the [`Service`] shuts it down too.
    pub fn serve(self, settings: ServeSettings, listener: TcpListener) -> std::io::Result<Service> {
        let address = listener.local_addr()?;
        let health = settings.health_listen.map(bind_health).transpose()?;
        let health_address = health.as_ref().map(TcpListener::local_addr).transpose()?;
        let (drain, draining) = lifecycle::drain();
        let applications = self.applications.clone();
        let server = tokio::spawn(run(settings, self, listener, health, draining.signaled()));
        Ok(Service {
            applications,
            address,
            health_address,
            drain,
            server,
        })
    }
}

/// Serves `core` on `listener` (and gRPC health alone on `health`, if any) until
/// `shutdown` resolves; on shutdown the server stops accepting and finishes its in-flight
/// calls, then every application actor is stopped (their pods stay, for a restarted
/// service to resume).
async fn run(
    mut settings: ServeSettings,
    core: Core,
    listener: TcpListener,
    health: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let Core {
        applications,
        initialize,
    } = core;
    settings.ready = initialize.into_ready();
    let announced = {
        let ready = settings.ready.clone();
        tokio::spawn(async move {
            ready.wait().await;
            tracing::info!("kubernetes watches synced: serving");
        })
    };
    let served = grpc::serve(settings, applications.clone(), listener, health, shutdown).await;
    announced.abort();
    // Every call has ended: stop the actors, leaving their pods for a restarted service,
    // and hand the shards over.
    applications.shutdown().await;
    served
}

/// A service running in this process: its applications and its gRPC server.
pub struct Service {
    applications: Applications,
    address: SocketAddr,
    health_address: Option<SocketAddr>,
    drain: Drain,
    server: JoinHandle<Result<(), ServeError>>,
}

/// The listener of `health.listen`, bound before the service starts so that a port in use
/// stops it at once, naming the key.
fn bind_health(address: SocketAddr) -> std::io::Result<TcpListener> {
    let named = |err: std::io::Error| {
        std::io::Error::new(
            err.kind(),
            format!("cannot listen on {address} (health.listen): {err}"),
        )
    };
    let listener = std::net::TcpListener::bind(address).map_err(named)?;
    listener.set_nonblocking(true).map_err(named)?;
    TcpListener::from_std(listener).map_err(named)
}

impl Service {
    /// Where the gRPC server listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Where gRPC health alone is also answered, if `health_listen` was set.
    pub fn health_address(&self) -> Option<SocketAddr> {
        self.health_address
    }

    /// The registry the server calls.
    pub fn applications(&self) -> &Applications {
        &self.applications
    }

    /// Begins the graceful shutdown (as SIGTERM does); [`Self::stopped`] waits for it.
    pub fn begin_shutdown(&self) {
        self.drain.signal();
    }

    /// Waits until the server has drained and the actors have stopped.
    pub async fn stopped(self) -> Result<(), ServeError> {
        let Self { drain, server, .. } = self;
        let result = server.await;
        drop(drain);
        match result {
            Ok(served) => served,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Ok(()),
        }
    }

    /// Shuts down gracefully: [`Self::begin_shutdown`], then [`Self::stopped`].
    pub async fn shutdown(self) -> Result<(), ServeError> {
        self.begin_shutdown();
        self.stopped().await
    }
}

/// Waits (on the health Watch stream, no polling) until the service behind `channel`
/// reports SERVING.
pub async fn wait_until_serving(channel: Channel) -> anyhow::Result<()> {
    let mut health = HealthClient::new(channel);
    let mut updates = health
        .watch(HealthCheckRequest {
            service: grpc::server::SERVICE_NAME.into(),
        })
        .await
        .context("health Watch")?
        .into_inner();
    while let Some(update) = updates.message().await.context("health Watch")? {
        if update.status == ServingStatus::Serving as i32 {
            return Ok(());
        }
    }
    anyhow::bail!("the health Watch ended before the service was serving")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tonic::transport::Endpoint;

    use super::*;
    use crate::app::{AppError, AppId, ManualClock};

    /// A client of an API server that never answers (nothing listens on port 9).
    fn unreachable_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        kube::Client::try_from(config).expect("client")
    }

    #[tokio::test]
    async fn a_started_service_is_not_ready_without_its_api_server_and_shuts_down() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let service = Builder::new(unreachable_client(), Arc::new(ManualClock::starting_now()))
            .start(ServeSettings::default(), listener)
            .expect("start");
        let channel = Endpoint::from_shared(format!("http://{}", service.address()))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut health = HealthClient::new(channel.clone());
        let status = health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("check")
            .into_inner();
        assert_eq!(status.status, ServingStatus::NotServing as i32);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), wait_until_serving(channel))
                .await
                .is_err(),
            "serving without an API server"
        );

        let applications = service.applications().clone();
        tokio::time::timeout(Duration::from_secs(10), service.shutdown())
            .await
            .expect("shutdown within the drain timeout")
            .expect("served");
        let app = AppId::parse("app-1").expect("id");
        assert!(matches!(
            applications.status(&app).await,
            Err(AppError::ShuttingDown)
        ));
    }
}
