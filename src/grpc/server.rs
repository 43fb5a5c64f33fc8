//! Serving: the allocator service, gRPC health and server reflection on one listener, and
//! gRPC health alone on another if configured (`health.listen`, for probes: no caller
//! shares its connections). The server serves until told to drain, then finishes its
//! in-flight calls; when it is ready and when it drains are decided by its owner
//! ([`crate::runtime`]).
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::connections::{self, ConnectionLayer, ConnectionPools};
use super::limits::ServerLimits;
use super::observe::ObserveLayer;
use super::service::AllocatorService;
use super::tls::{ReloadingTls, TlsSettings};
use super::validate::StartDefaults;
use crate::app::Applications;
use crate::auth::Gate;
use crate::lifecycle::Ready;
use crate::metrics::Metrics;
use crate::proto::executor_allocator_server::ExecutorAllocatorServer;

/// How the gRPC server behaves around its calls.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// Filled into Start requests that leave fields unset.
    pub defaults: StartDefaults,
    /// How long in-flight calls (and open health watches) may run after shutdown begins.
    pub drain_timeout: Duration,
    /// Health answers NOT_SERVING until this is ready (the runtime's initialization).
    pub ready: Ready,
    /// Where every call is counted and timed.
    pub metrics: Metrics,
    /// Who may call, and what they may do.
    pub gate: Gate,
    /// TLS on the port (off unless both files are set).
    pub tls: TlsSettings,
    /// Message size, streams, keepalive, handshake and connection limits.
    pub limits: ServerLimits,
    /// Where gRPC health alone is also answered (plaintext), apart from the callers'
    /// connections and their caps, e.g. for kubelet probes (`health.listen`; none by
    /// default). Bound by [`crate::runtime::Core::serve`].
    pub health_listen: Option<SocketAddr>,
    /// Where calls for applications other replicas own are sent (off: answered here).
    pub forwarder: super::forward::Forwarder,
}

impl Default for ServeSettings {
    fn default() -> Self {
        Self {
            defaults: StartDefaults::default(),
            drain_timeout: Duration::from_secs(10),
            ready: Ready::now(),
            metrics: Metrics::default(),
            gate: Gate::open(),
            tls: TlsSettings::default(),
            limits: ServerLimits::default(),
            health_listen: None,
            forwarder: super::forward::Forwarder::off(),
        }
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The reflection descriptors did not load (a build problem, not a runtime one).
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The listener failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The TLS certificate or key cannot be used.
    #[error("gRPC TLS: {0}")]
    Tls(String),
}

/// The name health reports the allocator under (`spark.allocator.v1.ExecutorAllocator`).
pub const SERVICE_NAME: &str = <ExecutorAllocatorServer<AllocatorService> as NamedService>::NAME;

/// Serves until `drain` resolves, then stops accepting, lets in-flight calls finish (up to
/// `drain_timeout`) and returns. Health reports SERVING once `settings.ready` is ready and
/// NOT_SERVING again once the drain begins, on `listener` and on `probes` alike (which
/// answers health alone, until the server returns). The applications are left as they are: their owner
/// stops them.
pub async fn serve(
    settings: ServeSettings,
    applications: Applications,
    listener: TcpListener,
    probes: Option<TcpListener>,
    drain: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let tls = if settings.tls.enabled() {
        Some(ReloadingTls::start(&settings.tls).map_err(ServeError::Tls)?)
    } else {
        None
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::NotServing).await;
    let readiness = tokio::spawn(report_when_ready(health.clone(), settings.ready.clone()));
    let service = AllocatorService::new(applications, settings.defaults.clone())
        .with_gate(settings.gate.clone())
        .with_forwarder(settings.forwarder.clone());

    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let signal = {
        let health = health.clone();
        let readiness = readiness.abort_handle();
        async move {
            drain.await;
            readiness.abort();
            tracing::info!("shutting down: no new calls, finishing in-flight ones");
            set_health(&health, ServingStatus::NotServing).await;
            let _ = draining_tx.send(());
        }
    };
    let limits = &settings.limits;
    // The probes' port: the same health service (one status), its own pool of connections.
    let probes = probes.map(|listener| {
        let router = server_builder(limits)
            .layer(ConnectionLayer)
            .add_service(health_service.clone());
        let connections = connections::incoming(listener, ConnectionPools::health(limits));
        tokio::spawn(async move {
            if let Err(err) = router.serve_with_incoming(connections).await {
                tracing::warn!(%err, "the health listener stopped (health.listen)");
            }
        })
    });
    let allocator =
        ExecutorAllocatorServer::new(service).max_decoding_message_size(limits.max_message_bytes);
    let router = server_builder(limits)
        .trace_fn(super::observe::request_span)
        .layer(ConnectionLayer)
        .layer(ObserveLayer::new(settings.metrics.clone()))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(allocator);
    let connections = connections::incoming(listener, ConnectionPools::new(limits));
    let server: std::pin::Pin<
        Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>,
    > = match tls {
        Some(tls) => {
            Box::pin(router.serve_with_incoming_shutdown(tls.incoming(connections), signal))
        }
        None => Box::pin(router.serve_with_incoming_shutdown(connections, signal)),
    };

    let drain_timeout = settings.drain_timeout;
    let result = tokio::select! {
        result = server => result.map_err(ServeError::from),
        () = async move {
            if draining_rx.await.is_ok() {
                tokio::time::sleep(drain_timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(?drain_timeout, "calls still open after the drain timeout; closing them");
            Ok(())
        }
    };
    readiness.abort();
    if let Some(probes) = probes {
        probes.abort();
    }
    result
}

/// A server with the streams, keepalive, header and call-deadline limits of `limits`.
fn server_builder(limits: &ServerLimits) -> tonic::transport::Server {
    let builder = tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_keepalive_interval(limits.keepalive_interval())
        .http2_keepalive_timeout(Some(Duration::from_millis(limits.keepalive_timeout_ms)))
        .http2_max_header_list_size(limits.max_header_list_bytes);
    match limits.request_timeout() {
        Some(timeout) => builder.timeout(timeout),
        None => builder,
    }
}

/// Reflection over our API and the health service (grpcurl lists and describes both).
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// Overall health ("") and the allocator's own entry move together.
async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
}

/// NOT_SERVING until `ready`, then SERVING.
async fn report_when_ready(health: HealthReporter, ready: Ready) {
    ready.wait().await;
    tracing::debug!("ready: serving");
    set_health(&health, ServingStatus::Serving).await;
}
