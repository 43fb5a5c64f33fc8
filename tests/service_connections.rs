//! No lock-out (issue 19, point 2), over real TCP and HTTP/2 against the real gRPC server
//! and the simulated cluster: idle connections that only sent the HTTP/2 preface fill the
//! unauthenticated pool, and still a new client and a probe on the health port are answered
//! without being starved (within 1 s), the flood's connections are closed at their idle deadline, and an
//! authenticated client keeps its connection and its answers. The health port reports the
//! gRPC port's status. Pools and deadlines are configured small so that each test takes a
//! few seconds.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prost::Message;
use spark_pod_allocator::auth::{AuthMode, AuthSettings};
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::grpc::limits::ServerLimits;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator_sim::{SimGrant, SimSettings, SimToken};
use test_kit::grpc::{Harness, quiet_cluster, start_request};
use test_kit::requests::*;
use test_kit::wait::until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tonic::Request;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const NS: &str = "team-a";
const APP: &str = "spark-kept";
/// A new client and a probe must be answered within this, flood or not.
const ANSWERED: Duration = test_kit::wait::NOT_STARVED;
/// `grpc.max_unauthenticated_connections` here.
const POOL: usize = 8;
/// `grpc.unauthenticated_idle_timeout_ms` here.
const IDLE: Duration = Duration::from_millis(1_000);
/// How late after its deadline a connection may be closed (a loaded 2-core machine).
const LATE: Duration = Duration::from_secs(2);

/// The tests of this file run one at a time: they time answers, which another test's flood
/// in the same process would slow down.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Small pools, a short idle deadline (far shorter than the handshake deadline, so that
/// it is the one that closes the flood), and a health port.
fn settings() -> ServeSettings {
    ServeSettings {
        limits: ServerLimits {
            max_connections: 64,
            max_unauthenticated_connections: POOL,
            unauthenticated_idle_timeout_ms: IDLE.as_millis() as u64,
            handshake_timeout_ms: 30_000,
            ..ServerLimits::default()
        },
        health_listen: Some("127.0.0.1:0".parse().expect("address")),
        ..ServeSettings::default()
    }
}

/// A connection that sends the HTTP/2 preface with its SETTINGS, reads the server's
/// SETTINGS (so it was accepted and is being served), then stays idle; and when it began.
async fn preface_only(address: SocketAddr) -> (TcpStream, Instant) {
    let began = Instant::now();
    let mut tcp = TcpStream::connect(address).await.expect("connect");
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("preface");
    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .expect("settings");
    let mut frame = [0u8; 9];
    tcp.read_exact(&mut frame)
        .await
        .expect("the server's SETTINGS");
    assert_eq!(frame[3], 4, "a SETTINGS frame first");
    (tcp, began)
}

/// Reads (and drops) what the server sends until it closes the connection, for at most
/// `bound`; when it closed, `None` if it did not.
async fn closed_within(tcp: &mut TcpStream, bound: Duration) -> Option<Instant> {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(bound, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return Instant::now(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// Asserts that each of `flood` is closed at its idle deadline: not before `IDLE` after it
/// began, and at most `LATE` after.
async fn closed_at_their_deadline(flood: Vec<(TcpStream, Instant)>, what: &str) {
    for (i, (mut tcp, began)) in flood.into_iter().enumerate() {
        let closed = closed_within(&mut tcp, IDLE + LATE)
            .await
            .unwrap_or_else(|| panic!("{what} {i} is closed by its idle deadline"));
        let after = closed - began;
        assert!(
            after >= IDLE,
            "{what} {i} closed after {after:?}, before {IDLE:?}"
        );
    }
}

async fn channel(address: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

/// A kubelet-style probe: a new connection, one Check; its status and how long it took.
async fn probe(address: SocketAddr) -> (i32, Duration) {
    let started = Instant::now();
    let status = HealthClient::new(channel(address).await)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health check")
        .into_inner()
        .status;
    (status, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_preface_flood_locks_out_neither_a_new_client_nor_a_probe() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start_with(quiet_cluster(), settings()).await;
    let health = h.health_address.expect("a health listener");
    // The harness's connection authenticates (auth.mode = none: a call that passed the
    // gate): it is not in the pool the flood fills.
    h.client
        .clone()
        .start(start_request(APP, NS))
        .await
        .expect("Start");
    until("the service reports SERVING", async || {
        probe(health).await.0 == ServingStatus::Serving as i32
    })
    .await;
    // The flood fills the pool of each port.
    let mut flood = Vec::new();
    let mut probe_flood = Vec::new();
    for _ in 0..POOL {
        flood.push(preface_only(h.address).await);
        probe_flood.push(preface_only(health).await);
    }

    let started = Instant::now();
    let status = ExecutorAllocatorClient::new(channel(h.address).await)
        .get_status(status_request(APP))
        .await
        .expect("a new client is answered")
        .into_inner();
    let client_took = started.elapsed();
    assert!(!status.outstanding);
    let (probed, probe_took) = probe(health).await;
    assert_eq!(probed, ServingStatus::Serving as i32);
    eprintln!(
        "during the flood: a new client answered in {client_took:?}, a probe in {probe_took:?}"
    );
    assert!(
        client_took < ANSWERED,
        "the new client took {client_took:?}"
    );
    assert!(probe_took < ANSWERED, "the probe took {probe_took:?}");

    // Each made room by closing the connection of its pool idle the longest, before its
    // deadline; the rest are closed at theirs.
    for (what, flood) in [("flood", &mut flood), ("probe flood", &mut probe_flood)] {
        let (mut oldest, began) = flood.remove(0);
        let closed = closed_within(&mut oldest, IDLE)
            .await
            .unwrap_or_else(|| panic!("the oldest of the {what} is closed to make room"));
        assert!(closed - began < IDLE);
    }
    closed_at_their_deadline(flood, "flood connection").await;
    closed_at_their_deadline(probe_flood, "probe flood connection").await;
    // The pools are free again.
    let (probed, _) = probe(health).await;
    assert_eq!(probed, ServingStatus::Serving as i32);
}

const AUDIENCE: &str = "spark-pod-allocator";
const ALICE: &str = "system:serviceaccount:team-a:alice";

/// alice may run applications in team-a; nobody else has a token.
fn cluster() -> SimSettings {
    let mut settings = quiet_cluster();
    settings.access.tokens = vec![SimToken {
        token: "alice-token".into(),
        username: ALICE.into(),
        uid: "uid-alice".into(),
        groups: vec!["system:serviceaccounts".into()],
        audiences: vec![AUDIENCE.into()],
    }];
    settings.access.grants = vec![SimGrant {
        users: vec![ALICE.into()],
        groups: Vec::new(),
        namespaces: vec![NS.into()],
        verbs: vec!["create".into(), "delete".into(), "list".into()],
        resources: vec!["pods".into()],
        names: Vec::new(),
    }];
    settings
}

fn auth() -> AuthSettings {
    AuthSettings {
        mode: AuthMode::Kubernetes,
        audiences: vec![AUDIENCE.into()],
        ..AuthSettings::default()
    }
}

/// An HTTP/2 connection and the task driving it (finished once the server closed it).
async fn h2_connection(address: SocketAddr) -> (h2::client::SendRequest<Bytes>, JoinHandle<()>) {
    let tcp = TcpStream::connect(address).await.expect("connect");
    // As gRPC clients do: a request's HEADERS and DATA are not held back by Nagle's
    // algorithm waiting for the server's delayed ACK.
    tcp.set_nodelay(true).expect("nodelay");
    let (send, connection) = h2::client::handshake(tcp).await.expect("handshake");
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    (send, driver)
}

/// GetStatus of [`APP`] on `send` with `token`: its grpc-status, and how long it took.
async fn get_status(
    send: &mut h2::client::SendRequest<Bytes>,
    address: SocketAddr,
    token: &str,
) -> (String, Duration) {
    let started = Instant::now();
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{address}/spark.allocator.v1.ExecutorAllocator/GetStatus"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .expect("request");
    let message = status_request(APP).encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(&message);
    let mut ready = send.clone().ready().await.expect("the connection is open");
    let (response, mut body) = ready.send_request(request, false).expect("send");
    body.send_data(Bytes::from(frame), true).expect("body");
    let response = response.await.expect("response");
    let code = |headers: &http::HeaderMap| {
        headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if let Some(code) = code(response.headers()) {
        return (code, started.elapsed());
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.expect("body");
    }
    let trailers = body.trailers().await.expect("trailers").expect("some");
    (code(&trailers).expect("grpc-status"), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authenticated_client_keeps_working_while_the_unauthenticated_pool_is_full() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start_with_settings_and_auth(cluster(), settings(), auth()).await;
    let mut start = Request::new(start_request(APP, NS));
    start.metadata_mut().insert(
        "authorization",
        "Bearer alice-token".parse().expect("metadata"),
    );
    h.client.clone().start(start).await.expect("alice's Start");
    // alice's connection authenticates with its first call.
    let (mut alice, alice_open) = h2_connection(h.address).await;
    assert_eq!(
        get_status(&mut alice, h.address, "alice-token").await.0,
        "0"
    );

    // A caller whose token is refused is not authenticated by its call.
    let (mut forger, forger_open) = h2_connection(h.address).await;
    assert_eq!(get_status(&mut forger, h.address, "forged").await.0, "16");
    let forger_idle = Instant::now();
    // The flood fills the unauthenticated pool (evicting the forger's, idle the longest),
    // twice over, while alice calls between its connections.
    let mut flood = Vec::new();
    let mut worst = Duration::ZERO;
    for _ in 0..2 * POOL {
        flood.push(preface_only(h.address).await);
        let (code, took) = get_status(&mut alice, h.address, "alice-token").await;
        assert_eq!(code, "0");
        worst = worst.max(took);
    }
    eprintln!("alice's slowest call during the flood: {worst:?}");
    assert!(
        worst < ANSWERED,
        "alice's slowest call during the flood took {worst:?}"
    );
    until("the forger's connection is closed", async || {
        forger_open.is_finished()
    })
    .await;
    assert!(forger_idle.elapsed() < IDLE, "evicted, before its deadline");
    // The first POOL flood connections made room for the next POOL.
    for (i, (mut tcp, _)) in flood.drain(..POOL).enumerate() {
        assert!(
            closed_within(&mut tcp, IDLE).await.is_some(),
            "flood connection {i} is evicted by a newer one"
        );
    }

    // A new authenticated client gets in while the pool is full, and once it has
    // authenticated, a full new flood does not evict it.
    let (mut bob, bob_open) = h2_connection(h.address).await;
    let (code, took) = get_status(&mut bob, h.address, "alice-token").await;
    assert_eq!(code, "0");
    assert!(took < ANSWERED, "the new client took {took:?}");
    for _ in 0..POOL {
        flood.push(preface_only(h.address).await);
    }
    closed_at_their_deadline(flood.split_off(POOL), "flood connection").await;
    // Idle well past the unauthenticated deadline, the authenticated connections are open.
    for (i, (mut tcp, _)) in flood.into_iter().enumerate() {
        assert!(
            closed_within(&mut tcp, IDLE).await.is_some(),
            "flood connection {i} is evicted or closed"
        );
    }
    assert!(!alice_open.is_finished() && !bob_open.is_finished());
    assert_eq!(
        get_status(&mut alice, h.address, "alice-token").await.0,
        "0"
    );
    assert_eq!(get_status(&mut bob, h.address, "alice-token").await.0, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_port_reports_the_grpc_ports_status_through_the_drain() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with(
        quiet_cluster(),
        ServeSettings {
            drain_timeout: Duration::from_secs(30),
            ..settings()
        },
    )
    .await;
    let health = h.health_address.expect("a health listener");
    until("the gRPC port reports SERVING", async || {
        probe(h.address).await.0 == ServingStatus::Serving as i32
    })
    .await;
    assert_eq!(probe(health).await.0, ServingStatus::Serving as i32);

    // An open WatchExecutors stream holds the drain: the health port says NOT_SERVING
    // throughout it, as the gRPC port does.
    h.client
        .clone()
        .start(start_request(APP, NS))
        .await
        .expect("Start");
    let watch = h
        .client
        .clone()
        .watch_executors(watch_request(APP, 0))
        .await
        .expect("watch")
        .into_inner();
    h.signal_stop();
    until(
        "the health port reports NOT_SERVING while draining",
        async || probe(health).await.0 == ServingStatus::NotServing as i32,
    )
    .await;
    assert_eq!(probe(health).await.0, ServingStatus::NotServing as i32);
    drop(watch);
    h.wait_stopped().await;
    until("the health port closes with the server", async || {
        TcpStream::connect(health).await.is_err()
    })
    .await;
}
