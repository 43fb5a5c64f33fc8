//! Simulator + service + gRPC server + client in one process: a simulated cluster, the
//! real application registry and the real gRPC server on 127.0.0.1:0, reached by the
//! generated client over real HTTP/2.
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

use spark_pod_allocator::allocator::Timestamp;
use spark_pod_allocator::app::{Applications, ManualClock};
use spark_pod_allocator::auth::{AuthSettings, Gate};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::grpc::forward::{Forwarder, PeerSettings};
use spark_pod_allocator::k8s;
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::{Builder, Service};
use spark_pod_allocator_sim::{SimCluster, SimSettings};

/// The standard executor template: the one container Spark names, nothing else.
pub const TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n";

/// A running simulator + service + gRPC server and a client of it; dropping it stops them.
pub struct Harness {
    /// The configuration every service of this harness runs with (a restart keeps it).
    pub settings: Settings,
    pub sim: SimCluster,
    pub applications: Applications,
    pub clock: ManualClock,
    pub address: SocketAddr,
    /// The health-only listener, when `ServeSettings::health_listen` asked for one.
    pub health_address: Option<SocketAddr>,
    pub channel: Channel,
    pub client: ExecutorAllocatorClient<Channel>,
    /// Authentication of every service of this harness (`None`: nobody is authenticated).
    pub auth: Option<AuthSettings>,
    /// The running service; `None` once it has stopped.
    service: Option<Service>,
    /// What the service's builder is given beyond the configuration (a restart keeps it).
    tune: fn(Builder) -> Builder,
}

/// A cluster whose nodes do nothing on their own (pods stay Pending), as a real API server
/// without kubelets: what the tests see depends only on what the service does.
pub fn quiet_cluster() -> SimSettings {
    let mut settings = crate::sim::manual_settings();
    settings.namespaces = vec!["default".into(), "team-a".into(), "team-b".into()];
    settings
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(quiet_cluster(), ServeSettings::default()).await
    }

    pub async fn start_with(sim_settings: SimSettings, serve_settings: ServeSettings) -> Self {
        Self::start_with_config(sim_settings, serve_settings, Settings::default()).await
    }

    /// A harness whose service runs with the configuration `settings` (request deadline,
    /// rate limit, …).
    pub async fn start_with_config(
        sim_settings: SimSettings,
        serve_settings: ServeSettings,
        settings: Settings,
    ) -> Self {
        Self::start_full(sim_settings, serve_settings, settings, None, |builder| {
            builder
        })
        .await
    }

    /// [`Self::start_with_config`] with `tune` given the service's builder, for what is not
    /// a setting (a WatchExecutors stream's buffer, a request's retry pause).
    pub async fn start_tuned(
        sim_settings: SimSettings,
        settings: Settings,
        tune: fn(Builder) -> Builder,
    ) -> Self {
        Self::start_full(sim_settings, ServeSettings::default(), settings, None, tune).await
    }

    /// A harness whose service authenticates callers with the simulator's TokenReview and
    /// authorizes them with its SubjectAccessReview.
    pub async fn start_with_auth(sim_settings: SimSettings, auth: AuthSettings) -> Self {
        Self::start_full(
            sim_settings,
            ServeSettings::default(),
            Settings::default(),
            Some(auth),
            |builder| builder,
        )
        .await
    }

    /// A harness whose service runs with `serve_settings` and authenticates callers as
    /// [`Harness::start_with_auth`] does.
    pub async fn start_with_settings_and_auth(
        sim_settings: SimSettings,
        serve_settings: ServeSettings,
        auth: AuthSettings,
    ) -> Self {
        Self::start_full(
            sim_settings,
            serve_settings,
            Settings::default(),
            Some(auth),
            |builder| builder,
        )
        .await
    }

    /// [`Self::start_with_auth`] with the service's configuration `settings` (tenant
    /// limits, rate limit, …).
    pub async fn start_with_auth_and_config(
        sim_settings: SimSettings,
        auth: AuthSettings,
        settings: Settings,
    ) -> Self {
        Self::start_full(
            sim_settings,
            ServeSettings::default(),
            settings,
            Some(auth),
            |builder| builder,
        )
        .await
    }

    async fn start_full(
        sim_settings: SimSettings,
        serve_settings: ServeSettings,
        settings: Settings,
        auth: Option<AuthSettings>,
        tune: fn(Builder) -> Builder,
    ) -> Self {
        let sim = SimCluster::start(sim_settings)
            .await
            .expect("simulated cluster");
        let clock = ManualClock::new(Timestamp(1_700_000_000_000));
        let service = serve_tuned(
            &sim,
            &clock,
            serve_settings,
            settings.clone(),
            auth.as_ref(),
            tune,
        )
        .await;
        let (channel, client) = connect(service.address()).await;
        Self {
            settings,
            sim,
            applications: service.applications().clone(),
            clock,
            address: service.address(),
            health_address: service.health_address(),
            channel,
            client,
            auth,
            service: Some(service),
            tune,
        }
    }

    /// Stops the service gracefully (its pods stay) and starts a new one, with a registry of
    /// its own, on the same cluster: a restarted service.
    pub async fn restart(&mut self) {
        self.stop_server().await;
        let service = serve_tuned(
            &self.sim,
            &self.clock,
            ServeSettings::default(),
            self.settings.clone(),
            self.auth.as_ref(),
            self.tune,
        )
        .await;
        (self.channel, self.client) = connect(service.address()).await;
        self.applications = service.applications().clone();
        self.address = service.address();
        self.health_address = service.health_address();
        self.service = Some(service);
    }

    /// Stops the server gracefully and waits for it.
    pub async fn stop_server(&mut self) {
        self.signal_stop();
        self.wait_stopped().await;
    }

    /// Begins the graceful shutdown (as SIGTERM would).
    pub fn signal_stop(&self) {
        if let Some(service) = &self.service {
            service.begin_shutdown();
        }
    }

    /// Waits for the server to finish its shutdown (drained, actors stopped).
    pub async fn wait_stopped(&mut self) {
        if let Some(service) = self.service.take() {
            service.stopped().await.expect("server result");
        }
    }

    /// SetTotalExpected: `n` executors of the default profile for `app`.
    pub async fn set_total(&self, app: &str, n: u32) {
        self.client
            .clone()
            .set_total_expected(crate::requests::targets_request(app, n))
            .await
            .expect("SetTotalExpected");
    }

    /// GetStatus of `app`.
    pub async fn status(&self, app: &str) -> Result<proto::ApplicationStatus, tonic::Status> {
        self.client
            .clone()
            .get_status(crate::requests::status_request(app))
            .await
            .map(tonic::Response::into_inner)
    }

    /// The executor pods of `app` in `namespace`, as the API server has them.
    pub async fn pods(&self, namespace: &str, app: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.sim.try_client().expect("sim client"), namespace);
        api.list(
            &ListParams::default().labels(&format!("spark-app-selector={app},spark-role=executor")),
        )
        .await
        .expect("list pods")
        .items
    }
}

/// A Start request that passes validation.
pub fn start_request(app: &str, namespace: &str) -> proto::StartRequest {
    proto::StartRequest {
        application_id: app.into(),
        namespace: namespace.into(),
        executor_pod_template: TEMPLATE.into(),
        ..Default::default()
    }
}

/// A Start request that passes validation, creating batches of `size` pods every
/// `delay_ms` milliseconds (Spark's pacing, asked for: the default policy is ADAPTIVE).
pub fn batched_start_request(
    app: &str,
    namespace: &str,
    size: u32,
    delay_ms: u64,
) -> proto::StartRequest {
    proto::StartRequest {
        settings: Some(proto::AllocationSettings {
            batch_size: Some(size),
            batch_delay_ms: Some(delay_ms),
            policy: Some(proto::AllocationPolicy::Spark as i32),
            ..Default::default()
        }),
        ..start_request(app, namespace)
    }
}

/// Starts the application of `request`, then asks for `n` executors of the default profile.
pub async fn start_scaled(
    client: &mut ExecutorAllocatorClient<Channel>,
    request: proto::StartRequest,
    n: u32,
) -> proto::StartResponse {
    let app = request.application_id.clone();
    let started = client.start(request).await.expect("Start").into_inner();
    client
        .set_total_expected(crate::requests::targets_request(app, n))
        .await
        .expect("SetTotalExpected");
    started
}

/// Asserts an INVALID_ARGUMENT status naming `field` first.
#[track_caller]
pub fn assert_invalid(status: &tonic::Status, field: &str) {
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{field}: ")),
        "expected the message to name {field}: {:?}",
        status.message()
    );
}

/// Starts a service on `sim`'s cluster with time from `clock` and its gRPC server on
/// 127.0.0.1:0, built as `main` builds it ([`Builder`]): it advertises the address it is
/// bound to (unless `settings.ha` names one) and forwards calls for applications of shards
/// other replicas hold (`settings.ha`'s peer settings); with `auth`, callers are
/// authenticated and authorized by the simulator's reviews.
pub async fn serve(
    sim: &SimCluster,
    clock: &ManualClock,
    serve_settings: ServeSettings,
    settings: Settings,
    auth: Option<&AuthSettings>,
) -> Service {
    serve_tuned(sim, clock, serve_settings, settings, auth, |builder| {
        builder
    })
    .await
}

/// [`serve`] with `tune` given the service's builder.
pub async fn serve_tuned(
    sim: &SimCluster,
    clock: &ManualClock,
    mut serve_settings: ServeSettings,
    mut settings: Settings,
    auth: Option<&AuthSettings>,
    tune: fn(Builder) -> Builder,
) -> Service {
    // The service's own client, as `main` builds it (its User-Agent).
    let client = || k8s::client(sim.kube_config()).expect("the service's client");
    if let Some(auth) = auth {
        serve_settings.gate = Gate::kubernetes(auth, client());
    }
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let bound = listener.local_addr().expect("bound address");
    settings.ha.resolve_advertise_address(None, bound);
    let peers = PeerSettings::load(&settings.ha).expect("ha.peer_ca_file");
    let core = tune(Builder::new(client(), Arc::new(clock.clone())))
        .with_settings(&settings)
        .with_metrics(serve_settings.metrics.clone())
        .build();
    serve_settings.forwarder = Forwarder::new(
        core.applications().ownerships().clone(),
        peers,
        serve_settings.metrics.clone(),
    );
    core.serve(serve_settings, listener)
        .expect("service starts")
}

/// A plaintext channel to the server at `address` and the allocator's client over it.
pub async fn connect(address: SocketAddr) -> (Channel, ExecutorAllocatorClient<Channel>) {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let client = ExecutorAllocatorClient::new(channel.clone());
    (channel, client)
}

/// The next event of a WatchExecutors stream (within 10 s); `None` when the stream ended.
pub async fn next_event(
    stream: &mut tonic::Streaming<proto::ExecutorEvent>,
) -> Option<proto::ExecutorEvent> {
    tokio::time::timeout(std::time::Duration::from_secs(10), stream.message())
        .await
        .expect("an event within 10 s")
        .expect("stream status OK")
}

/// Reads events of a WatchExecutors stream until one matches `what`; returns it.
pub async fn until_event(
    stream: &mut tonic::Streaming<proto::ExecutorEvent>,
    what: &str,
    matches: impl Fn(&proto::ExecutorEvent) -> bool,
) -> proto::ExecutorEvent {
    loop {
        let event = next_event(stream)
            .await
            .unwrap_or_else(|| panic!("stream ended before {what}"));
        if matches(&event) {
            return event;
        }
    }
}
