//! The runtime: owns the lifecycle of a running service and wires it in process. It builds
//! the readiness ([`Initialize`]: the API server answered and the watches that exist have
//! synced) and the drain signal, gives both to the gRPC server, and once the server has
//! drained stops every application actor, leaving executor pods in place for a restarted
//! service. `main`, the demo and the test kit all start a service through [`start`].
use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::app::{Applications, ServiceContext};
use crate::grpc::{self, ServeError, ServeSettings};
use crate::lifecycle::{self, Drain, Initialize};

/// Serves `applications` on `listener` (and gRPC health alone on `health`, if any) until
/// `shutdown` resolves: health is SERVING once
/// the API server has answered and the watches that exist have synced; on shutdown the
/// server stops accepting and finishes its in-flight calls, then every application actor
/// is stopped (their pods stay, for a restarted service to resume).
pub async fn serve(
    mut settings: ServeSettings,
    applications: Applications,
    listener: TcpListener,
    health: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let init = Initialize::new();
    let synced = {
        let handle = init.add_handle();
        let applications = applications.clone();
        tokio::spawn(async move {
            applications.synced().await;
            tracing::info!("kubernetes watches synced: serving");
            drop(handle);
        })
    };
    settings.ready = init.into_ready();
    let served = grpc::serve(settings, applications.clone(), listener, health, shutdown).await;
    synced.abort();
    // Every call has ended: stop the actors, leaving their pods for a restarted service.
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

/// Starts the service core on `ctx` (Kubernetes client, clock, options, metrics) and its
/// gRPC server on `listener`, in this process. Dropping the [`Service`] shuts it down too.
///
/// ```no_run
/// # async fn example(client: kube::Client) -> anyhow::Result<()> {
/// use std::sync::Arc;
/// use spark_pod_allocator::app::{ServiceContext, SystemClock};
/// use spark_pod_allocator::grpc::ServeSettings;
///
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// let ctx = ServiceContext::new(client, Arc::new(SystemClock));
/// let service = spark_pod_allocator::runtime::start(ctx, ServeSettings::default(), listener)?;
/// println!("serving on {}", service.address());
/// service.shutdown().await?;
/// # Ok(())
/// # }
/// ```
pub fn start(
    ctx: ServiceContext,
    settings: ServeSettings,
    listener: TcpListener,
) -> std::io::Result<Service> {
    spawn(Applications::new(ctx), settings, listener)
}

/// As [`start`], serving an existing registry (one that resumed its applications first).
pub fn spawn(
    applications: Applications,
    settings: ServeSettings,
    listener: TcpListener,
) -> std::io::Result<Service> {
    let address = listener.local_addr()?;
    let health = settings.health_listen.map(bind_health).transpose()?;
    let health_address = health.as_ref().map(TcpListener::local_addr).transpose()?;
    let (drain, draining) = lifecycle::drain();
    let server = tokio::spawn(serve(
        settings,
        applications.clone(),
        listener,
        health,
        draining.signaled(),
    ));
    Ok(Service {
        applications,
        address,
        health_address,
        drain,
        server,
    })
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
    use std::sync::Arc;
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
        let ctx = ServiceContext::new(unreachable_client(), Arc::new(ManualClock::starting_now()));
        let service = start(ctx, ServeSettings::default(), listener).expect("start");
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
