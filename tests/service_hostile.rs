//! Hostile callers against the real gRPC server and the simulated cluster: every template
//! the policy refuses, templates built to stall the parser, profile and executor floods,
//! half-open streams, stalled handshakes, too many connections, calls racing Stop and
//! undecodable requests. Each is refused with its code while a gRPC health check, made
//! every 20 ms during the attack, keeps answering (within 1 s each; the latencies are
//! printed). Limits are configured small so that every test takes a few seconds at most.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use test_kit::grpc::{Harness, TEMPLATE, assert_invalid, quiet_cluster, start_request};
use test_kit::wait::until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use spark_pod_allocator::app::AppId;
use spark_pod_allocator::app::limits::RequestLimits;
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::limits::ServerLimits;
use spark_pod_allocator::grpc::{ServeSettings, StartDefaults};
use spark_pod_allocator::proto;
use test_kit::requests::*;

const NS: &str = "team-a";
/// Health must answer within this while an attack runs.
const HEALTHY: Duration = test_kit::wait::NOT_STARVED;
const HANDSHAKE: Duration = Duration::from_millis(500);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(400);
const KEEPALIVE: Duration = Duration::from_millis(300);
const MAX_MESSAGE: usize = 1024 * 1024;
const MAX_CONNECTIONS: usize = 12;
const MAX_UNAUTHENTICATED: usize = 12;
const MAX_STREAMS: u32 = 8;
const MAX_PROFILES: usize = 4;
const MAX_EXECUTORS: u64 = 30;
const ROUND_CAP: u32 = 12;

fn limits() -> RequestLimits {
    RequestLimits {
        max_template_bytes: 64 * 1024,
        max_template_depth: 32,
        max_resource_profiles: MAX_PROFILES,
        max_executors_per_application: MAX_EXECUTORS,
        max_creates_per_round: ROUND_CAP,
        template_parsers: 1,
    }
}

/// The tests of this file run one at a time: each measures health latency, which other
/// attacks in the same process on a 2-core machine would skew.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A harness held alone (see [`SERIAL`]).
struct Alone {
    harness: Harness,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for Alone {
    type Target = Harness;
    fn deref(&self) -> &Harness {
        &self.harness
    }
}

impl std::ops::DerefMut for Alone {
    fn deref_mut(&mut self) -> &mut Harness {
        &mut self.harness
    }
}

async fn harness() -> Alone {
    let serial = SERIAL.lock().await;
    Alone {
        harness: service().await,
        _serial: serial,
    }
}

async fn service() -> Harness {
    let serve = ServeSettings {
        defaults: StartDefaults {
            limits: limits(),
            ..StartDefaults::default()
        },
        limits: ServerLimits {
            max_connections: MAX_CONNECTIONS,
            max_unauthenticated_connections: MAX_UNAUTHENTICATED,
            max_concurrent_streams: MAX_STREAMS,
            handshake_timeout_ms: HANDSHAKE.as_millis() as u64,
            request_timeout_ms: REQUEST_TIMEOUT.as_millis() as u64,
            keepalive_interval_ms: KEEPALIVE.as_millis() as u64,
            keepalive_timeout_ms: KEEPALIVE.as_millis() as u64,
            max_message_bytes: MAX_MESSAGE,
            ..ServerLimits::default()
        },
        ..ServeSettings::default()
    };
    let mut config = Settings::default();
    config.limits = limits();
    Harness::start_with_config(quiet_cluster(), serve, config).await
}

/// Runs `attack` while a health check is made every 20 ms over `channel` (opened before
/// the attack); asserts at least one was made and each answered within [`HEALTHY`].
async fn while_healthy<T>(channel: &Channel, attack: impl Future<Output = T>) -> T {
    let (done_tx, mut done) = tokio::sync::oneshot::channel::<()>();
    let mut health = HealthClient::new(channel.clone());
    // The first call of a channel sets things up; not part of the measure.
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health before the attack");
    let checks = async move {
        let mut latencies = Vec::new();
        loop {
            let started = Instant::now();
            health
                .check(HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .expect("health answers during the attack");
            latencies.push(started.elapsed());
            tokio::select! {
                _ = &mut done => return latencies,
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    };
    let attack = async move {
        let out = attack.await;
        let _ = done_tx.send(());
        out
    };
    let (out, latencies) = tokio::join!(attack, checks);
    let mut sorted = latencies.clone();
    sorted.sort();
    let worst = sorted.last().copied().unwrap_or_default();
    println!(
        "health during the attack: {} checks, median {:?}, worst {worst:?}",
        sorted.len(),
        sorted.get(sorted.len() / 2).copied().unwrap_or_default()
    );
    assert!(
        worst < HEALTHY,
        "a health check took {worst:?} during the attack ({} checks)",
        latencies.len()
    );
    out
}

/// A template: the base one with `extra` appended (YAML under `spec:` or at the top).
fn template(extra: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\n{extra}")
}

const CONTAINER: &str = "  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_template_rule_refuses_start_naming_the_path() {
    let h = harness().await;
    let c = CONTAINER;
    let sc = |context: &str| {
        template(&format!(
            "spec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n    securityContext:\n{context}"
        ))
    };
    let rows: Vec<(String, &str)> = vec![
        (
            sc("      privileged: true\n"),
            "spec.containers[0].securityContext.privileged",
        ),
        (
            template(&format!(
                "spec:\n{c}  initContainers:\n  - name: init\n    image: busybox\n    securityContext:\n      privileged: true\n"
            )),
            "spec.initContainers[0].securityContext.privileged",
        ),
        (
            template(&format!(
                "spec:\n{c}  ephemeralContainers:\n  - name: debug\n    image: busybox\n    securityContext:\n      privileged: true\n"
            )),
            "spec.ephemeralContainers[0].securityContext.privileged",
        ),
        (
            sc("      allowPrivilegeEscalation: true\n"),
            "spec.containers[0].securityContext.allowPrivilegeEscalation",
        ),
        (
            sc("      capabilities:\n        add: [SYS_ADMIN]\n"),
            "spec.containers[0].securityContext.capabilities.add[0]",
        ),
        (
            template(&format!(
                "spec:\n{c}  volumes:\n  - name: root\n    hostPath:\n      path: /\n"
            )),
            "spec.volumes[0].hostPath",
        ),
        (
            template(&format!("spec:\n  hostNetwork: true\n{c}")),
            "spec.hostNetwork",
        ),
        (
            template(&format!("spec:\n  hostPID: true\n{c}")),
            "spec.hostPID",
        ),
        (
            template(&format!("spec:\n  hostIPC: true\n{c}")),
            "spec.hostIPC",
        ),
        (
            template(&format!("spec:\n  nodeName: node-1\n{c}")),
            "spec.nodeName",
        ),
        (
            template(&format!("spec:\n  serviceAccountName: admin\n{c}")),
            "spec.serviceAccountName",
        ),
        (
            template(&format!(
                "metadata:\n  ownerReferences:\n  - apiVersion: apps/v1\n    kind: Deployment\n    name: victim\n    uid: u-1\nspec:\n{c}"
            )),
            "metadata.ownerReferences[0]",
        ),
        (
            template(&format!(
                "metadata:\n  ownerReferences:\n  - apiVersion: v1\n    kind: Pod\n    name: driver-0\n    uid: u-1\n    blockOwnerDeletion: true\nspec:\n{c}"
            )),
            "metadata.ownerReferences[0].blockOwnerDeletion",
        ),
        (
            template(&format!(
                "metadata:\n  finalizers: [example.com/forever]\nspec:\n{c}"
            )),
            "metadata.finalizers[0]",
        ),
        (
            template(&format!("metadata:\n  namespace: kube-system\nspec:\n{c}")),
            "metadata.namespace",
        ),
    ];
    while_healthy(&h.channel, async {
        for (i, (text, path)) in rows.iter().enumerate() {
            let mut req = start_request(&format!("hostile-{i}"), NS);
            req.executor_pod_template = text.clone();
            // The driver pod does not exist: the policy refuses before it is looked up.
            req.driver_pod_name = "driver-0".into();
            let status = h.client.clone().start(req).await.unwrap_err();
            assert_invalid(&status, "executor_pod_template");
            assert!(
                status
                    .message()
                    .starts_with(&format!("executor_pod_template: {path}: ")),
                "{path}: {}",
                status.message()
            );
            // As a profile template of Start, named by its field.
            let mut req = start_request(&format!("hostile-p-{i}"), NS);
            req.resource_profile_templates = [(1, text.clone())].into();
            req.driver_pod_name = "driver-0".into();
            let status = h.client.clone().start(req).await.unwrap_err();
            assert!(
                status
                    .message()
                    .starts_with(&format!("resource_profile_templates[1]: {path}: ")),
                "{path}: {}",
                status.message()
            );
        }
    })
    .await;
    assert!(h.pods(NS, "hostile-0").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_total_expected_templates_are_held_to_the_applications_namespace() {
    let h = harness().await;
    let mut client = h.client.clone();
    client
        .start(start_request("app-1", NS))
        .await
        .expect("start");
    for (text, path) in [
        (
            template(&format!(
                "metadata:\n  namespace: team-b\nspec:\n{CONTAINER}"
            )),
            "metadata.namespace",
        ),
        (
            template(&format!(
                "spec:\n{CONTAINER}  volumes:\n  - name: root\n    hostPath:\n      path: /\n"
            )),
            "spec.volumes[0].hostPath",
        ),
    ] {
        let status = client
            .set_total_expected(proto::SetTotalExpectedRequest {
                application_id: "app-1".into(),
                executors_per_profile: [(1, 1)].into(),
                resource_profile_templates: [(1, text)].into(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status
                .message()
                .starts_with(&format!("resource_profile_templates[1]: {path}: ")),
            "{}",
            status.message()
        );
    }
    // Its own namespace is accepted.
    client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: "app-1".into(),
            executors_per_profile: [(1, 0)].into(),
            resource_profile_templates: [(
                1,
                template(&format!("metadata:\n  namespace: {NS}\nspec:\n{CONTAINER}")),
            )]
            .into(),
        })
        .await
        .expect("a template in the application's namespace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nesting_bombs_fail_fast_and_clearly_while_health_answers() {
    let h = harness().await;
    let flow = "[".repeat(60 * 1024);
    let block: String = (0..300).map(|i| format!("{}k:\n", " ".repeat(i))).collect();
    let json = "{\"a\":".repeat(10_000);
    let attacks = [flow, block, json];
    let refused = while_healthy(&h.channel, async {
        let mut calls = Vec::new();
        for round in 0..8 {
            // A connection per round: fewer calls on each than it may have streams.
            let channel = Endpoint::from_shared(format!("http://{}", h.address))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect");
            for (i, text) in attacks.iter().enumerate() {
                let mut req = start_request(&format!("bomb-{round}-{i}"), NS);
                req.executor_pod_template = text.clone();
                let mut client =
                    proto::executor_allocator_client::ExecutorAllocatorClient::new(channel.clone());
                calls.push(tokio::spawn(async move {
                    let started = Instant::now();
                    (client.start(req).await.unwrap_err(), started.elapsed())
                }));
            }
        }
        let mut refused = Vec::new();
        for call in calls {
            refused.push(call.await.expect("call"));
        }
        refused
    })
    .await;
    for (status, took) in refused {
        assert_invalid(&status, "executor_pod_template");
        assert!(
            status.message().contains("nested more than 32 levels"),
            "{}",
            status.message()
        );
        assert!(took < Duration::from_secs(2), "refused after {took:?}");
    }
    // Over the size limit: refused before any parse.
    let mut req = start_request("big", NS);
    req.executor_pod_template = format!("{TEMPLATE}# {}\n", "x".repeat(65 * 1024));
    let status = h.client.clone().start(req).await.unwrap_err();
    assert_invalid(&status, "executor_pod_template");
    assert!(
        status.message().contains("limits.max_template_bytes"),
        "{}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_flood_is_refused() {
    let h = harness().await;
    let mut client = h.client.clone();
    client
        .start(start_request("app-1", NS))
        .await
        .expect("start");
    let many = |from: i32, n: i32| -> std::collections::HashMap<i32, String> {
        (from..from + n)
            .map(|p| {
                (
                    p,
                    TEMPLATE.replace("spark:4", &format!("spark:4-profile-{p}")),
                )
            })
            .collect()
    };
    let flood = while_healthy(&h.channel, async {
        client
            .clone()
            .set_total_expected(profiles_request("app-1", many(1, 5000)))
            .await
    })
    .await
    .unwrap_err();
    assert_invalid(&flood, "resource_profile_templates");
    let targets = client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: "app-1".into(),
            executors_per_profile: (0..5000).map(|p| (p, 1)).collect(),
            resource_profile_templates: Default::default(),
        })
        .await
        .unwrap_err();
    assert_invalid(&targets, "executors_per_profile");
    // One at a time: profile 0 and three more fill the application's profiles.
    for profile in 1..MAX_PROFILES as i32 {
        client
            .set_total_expected(profiles_request("app-1", many(profile, 1)))
            .await
            .unwrap_or_else(|s| panic!("profile {profile}: {s:?}"));
    }
    let one_more = client
        .set_total_expected(profiles_request("app-1", many(MAX_PROFILES as i32, 1)))
        .await
        .unwrap_err();
    assert_invalid(&one_more, "resource_profile_templates");
    assert!(
        one_more.message().contains("limits.max_resource_profiles"),
        "{}",
        one_more.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_total_expected_u32_max_is_bounded_per_round_and_for_life() {
    let h = harness().await;
    let mut client = h.client.clone();
    let mut start = start_request("greedy", NS);
    start.settings = Some(proto::AllocationSettings {
        max_executors: Some(MAX_EXECUTORS + 1),
        ..Default::default()
    });
    let status = client.start(start).await.unwrap_err();
    assert_invalid(&status, "settings.max_executors");

    let mut start = start_request("greedy", NS);
    // Spark's batches, per profile (ADAPTIVE's window is the application's).
    start.settings = Some(proto::AllocationSettings {
        policy: Some(proto::AllocationPolicy::Spark as i32),
        ..Default::default()
    });
    start.resource_profile_templates = (1..MAX_PROFILES as i32)
        .map(|p| (p, TEMPLATE.replace("spark:4", &format!("spark:4-{p}"))))
        .collect();
    client.start(start).await.expect("start");
    let app = AppId::parse("greedy").expect("id");
    until("the start round", || async {
        h.applications.rounds(&app).await.expect("rounds") >= 1
    })
    .await;
    // Four profiles of batch size 10 would plan 40 creates; the round cap allows 12.
    while_healthy(&h.channel, async {
        client
            .set_total_expected(proto::SetTotalExpectedRequest {
                application_id: "greedy".into(),
                executors_per_profile: (0..MAX_PROFILES as i32).map(|p| (p, u32::MAX)).collect(),
                resource_profile_templates: Default::default(),
            })
            .await
            .expect("targets");
        until("the round's creates", || async {
            h.pods(NS, "greedy").await.len() == ROUND_CAP as usize
        })
        .await;
    })
    .await;
    let status = client
        .get_status(status_request("greedy"))
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.last_executor_id, i64::from(ROUND_CAP));
    // Round after round, up to the lifetime cap and never past it.
    let round = || async {
        let before = h.applications.rounds(&app).await.expect("rounds");
        h.clock.advance(Duration::from_secs(1));
        until("a round", || async {
            h.applications.rounds(&app).await.expect("rounds") > before
        })
        .await;
    };
    for _ in 0..40 {
        let created = h.pods(NS, "greedy").await.len();
        assert!(created <= MAX_EXECUTORS as usize, "{created} pods");
        if created == MAX_EXECUTORS as usize {
            break;
        }
        round().await;
    }
    round().await;
    round().await;
    assert_eq!(h.pods(NS, "greedy").await.len(), MAX_EXECUTORS as usize);
    let status = client
        .get_status(status_request("greedy"))
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.last_executor_id, MAX_EXECUTORS as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_racing_stop_answer_not_found_never_internal() {
    let h = harness().await;
    for attempt in 0..10 {
        let app = format!("racer-{attempt}");
        h.client
            .clone()
            .start(start_request(&app, NS))
            .await
            .expect("start");
        let calls: Vec<_> = (0..24u32)
            .map(|i| {
                let mut client = h.client.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    client
                        .set_total_expected(proto::SetTotalExpectedRequest {
                            application_id: app,
                            executors_per_profile: [(0, i % 3)].into(),
                            resource_profile_templates: Default::default(),
                        })
                        .await
                        .map(|_| ())
                })
            })
            .collect();
        h.client
            .clone()
            .stop(stop_request(app.clone()))
            .await
            .expect("stop");
        for call in calls {
            if let Err(status) = call.await.expect("call") {
                assert_eq!(status.code(), Code::NotFound, "{status:?}");
            }
        }
    }
}

/// An HTTP/2 connection to the server, driven in the background.
async fn h2_connection(h: &Harness) -> h2::client::SendRequest<Bytes> {
    let tcp = TcpStream::connect(h.address).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

fn grpc_request(h: &Harness, method: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{}/spark.allocator.v1.ExecutorAllocator/{method}",
            h.address
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

/// The grpc-status and grpc-message of a response (in its headers when it has no body,
/// else in its trailers).
async fn grpc_status(response: http::Response<h2::RecvStream>) -> (String, String) {
    let field = |headers: &http::HeaderMap, name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if let Some(code) = field(response.headers(), "grpc-status") {
        let message = field(response.headers(), "grpc-message").unwrap_or_default();
        return (code, message);
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        chunk.expect("body");
    }
    let trailers = body.trailers().await.expect("trailers").expect("some");
    (
        field(&trailers, "grpc-status").expect("grpc-status"),
        field(&trailers, "grpc-message").unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_in_a_string_field_is_invalid_argument() {
    let h = harness().await;
    let mut send = h2_connection(&h).await.ready().await.expect("ready");
    // StopRequest { application_id (field 1, length-delimited) = 0xff 0xfe }.
    let message = [0x0a, 0x02, 0xff, 0xfe];
    let mut frame = vec![0u8, 0, 0, 0, message.len() as u8];
    frame.extend_from_slice(&message);
    let (response, mut body) = send
        .send_request(grpc_request(&h, "Stop"), false)
        .expect("send");
    body.send_data(Bytes::from(frame), true).expect("body");
    let (code, message) = grpc_status(response.await.expect("response")).await;
    assert_eq!(code, "3", "INVALID_ARGUMENT, got {code} {message}");
    assert!(message.contains("does%20not%20decode"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_streams_are_bounded_and_reaped() {
    let h = harness().await;
    let streams = while_healthy(&h.channel, async {
        let mut pending = Vec::new();
        let mut bodies = Vec::new();
        for _ in 0..4 {
            let mut send = h2_connection(&h).await;
            // Three times the streams a connection may have open: the rest wait for room.
            for _ in 0..3 * MAX_STREAMS {
                send = tokio::time::timeout(Duration::from_secs(10), send.ready())
                    .await
                    .expect("room for a stream once others are reaped")
                    .expect("ready");
                let (response, body) = send
                    .send_request(grpc_request(&h, "Start"), false)
                    .expect("send");
                // Headers only: the request's body never comes.
                bodies.push(body);
                pending.push(tokio::spawn(async move {
                    match response.await {
                        Ok(response) => format!("status {}", grpc_status(response).await.0),
                        Err(err) => format!("reset {:?}", err.reason()),
                    }
                }));
            }
        }
        let mut ended = Vec::new();
        for stream in pending {
            ended.push(
                tokio::time::timeout(Duration::from_secs(10), stream)
                    .await
                    .expect("a half-open stream is reaped")
                    .expect("task"),
            );
        }
        drop(bodies);
        ended
    })
    .await;
    assert_eq!(streams.len(), 4 * 3 * MAX_STREAMS as usize);
    // Every stream ended: reaped by the request timeout (CANCELLED), or refused outright
    // when the client opened more than the server's SETTINGS allow (sent before it had
    // read them).
    let reaped = streams.iter().filter(|s| *s == "status 1").count();
    let refused = (streams.iter())
        .filter(|s| *s == "reset Some(REFUSED_STREAM)")
        .count();
    assert_eq!(reaped + refused, streams.len(), "{streams:?}");
    assert!(reaped >= 4 * MAX_STREAMS as usize, "{streams:?}");
}

/// Reads until the server closes the connection; the bytes it sent before.
async fn read_until_closed(stream: &mut TcpStream) -> usize {
    let mut total = 0;
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_are_closed_and_connections_capped() {
    let h = harness().await;
    // A call that passes the gate takes the harness's connection out of the unauthenticated
    // pool the stalled ones fill (NOT_FOUND: no such application).
    let unknown = h
        .client
        .clone()
        .get_status(status_request("spark-none"))
        .await;
    assert_eq!(
        unknown.expect_err("no such application").code(),
        Code::NotFound
    );
    let (evicted, closed) = while_healthy(&h.channel, async {
        let mut stalled = Vec::new();
        for _ in 0..MAX_UNAUTHENTICATED {
            let mut tcp = TcpStream::connect(h.address).await.expect("connect");
            // Half the preface, then nothing.
            tcp.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
            stalled.push(tcp);
        }
        // The pool is full: one more is taken, the one idle the longest closed at once.
        let started = Instant::now();
        let mut one_more = TcpStream::connect(h.address).await.expect("connect");
        one_more
            .write_all(b"PRI * HTTP/2.0\r\n")
            .await
            .expect("write");
        let mut oldest = stalled.remove(0);
        tokio::time::timeout(HANDSHAKE, read_until_closed(&mut oldest))
            .await
            .expect("the oldest stalled connection is closed to make room");
        let evicted = started.elapsed();
        stalled.push(one_more);
        for mut tcp in stalled {
            tokio::time::timeout(Duration::from_secs(5), read_until_closed(&mut tcp))
                .await
                .expect("a stalled handshake is closed");
        }
        (evicted, started.elapsed())
    })
    .await;
    assert!(evicted < HANDSHAKE, "{evicted:?}");
    assert!(
        closed >= HANDSHAKE && closed < HANDSHAKE + Duration::from_secs(2),
        "{closed:?}"
    );
    // Their places are free again.
    let channel = Endpoint::from_shared(format!("http://{}", h.address))
        .expect("endpoint")
        .connect()
        .await
        .expect("a new connection once the stalled ones are gone");
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health on the new connection");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_template_was_changed_is_not_resumed() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    use spark_pod_allocator::k8s::RegistrationStore;
    use spark_pod_allocator::k8s::registrations::REGISTRATION_KEY;

    let mut h = harness().await;
    for app in ["kept", "tampered"] {
        h.client
            .clone()
            .start(start_request(app, NS))
            .await
            .expect("start");
    }
    h.stop_server().await;
    // Someone who may edit ConfigMaps in the service's namespace gives a template host
    // networking (the signature no longer matches).
    let service_ns = h.settings.registrations.namespace();
    let api: Api<ConfigMap> = Api::namespaced(h.sim.try_client().expect("client"), service_ns);
    let name = RegistrationStore::config_map_name(NS, "tampered");
    let stored = api.get(&name).await.expect("registration ConfigMap");
    let mut registration: serde_json::Value =
        serde_json::from_str(&stored.data.expect("data")[REGISTRATION_KEY]).expect("JSON");
    registration["templates"]["0"]["spec"]["hostNetwork"] = serde_json::Value::Bool(true);
    let patch = serde_json::json!({"data": {REGISTRATION_KEY: registration.to_string()}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch");

    let restarted = test_kit::service::applications(
        h.sim.try_client().expect("client"),
        &h.clock,
        h.settings.clone(),
    );
    let resumed = restarted.resume_registered().await.expect("resume");
    let resumed: Vec<&str> = resumed.iter().map(|a| a.as_str()).collect();
    assert_eq!(resumed, ["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_spark_builds_passes_the_default_policy() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};

    let h = harness().await;
    let pods: Api<Pod> = Api::namespaced(h.sim.try_client().expect("client"), NS);
    let driver: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pi-driver", "labels": {"spark-app-selector": "spark-pi", "spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .expect("driver");
    let driver = pods
        .create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");
    // What Spark's executor builder puts in a pod: the driver as controller owner, the
    // namespace, the service account, an emptyDir local dir, a downward-API env.
    let template = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "pi-exec-{{EXECUTOR_ID}}", "namespace": NS,
            "labels": {"spark-app-selector": "spark-pi", "spark-role": "executor", "spark-exec-id": "{{EXECUTOR_ID}}"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "pi-driver",
                "uid": driver.metadata.uid.clone().expect("uid"), "controller": true}],
        },
        "spec": {
            "serviceAccountName": "default", "restartPolicy": "Never",
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark:4", "args": ["executor"],
                "env": [{"name": "SPARK_EXECUTOR_POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}}],
                "volumeMounts": [{"name": "spark-local-dir-1", "mountPath": "/var/data/spark"}]}],
            "volumes": [{"name": "spark-local-dir-1", "emptyDir": {}}],
        },
    });
    let mut req = start_request("spark-pi", NS);
    req.driver_pod_name = "pi-driver".into();
    req.executor_pod_template = template.to_string();
    h.client
        .clone()
        .start(req)
        .await
        .expect("Spark's pod is accepted");
    h.client
        .clone()
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: "spark-pi".into(),
            executors_per_profile: [(0, 2)].into(),
            resource_profile_templates: Default::default(),
        })
        .await
        .expect("targets");
    until("two executor pods", || async {
        h.pods(NS, "spark-pi").await.len() == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_answering_after_its_handshake_is_closed() {
    let h = harness().await;
    let silent = while_healthy(&h.channel, async {
        let mut tcp = TcpStream::connect(h.address).await.expect("connect");
        // The whole preface and an empty SETTINGS frame, then silence: PINGs go unanswered.
        tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .expect("preface");
        tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
            .await
            .expect("settings");
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(5), read_until_closed(&mut tcp))
            .await
            .expect("closed by keepalive");
        started.elapsed()
    })
    .await;
    assert!(silent >= KEEPALIVE, "closed after {silent:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_limit_is_refused_unread() {
    let h = harness().await;
    let mut req = start_request("huge", NS);
    req.executor_pod_template = format!("{TEMPLATE}# {}\n", "x".repeat(MAX_MESSAGE));
    let status = while_healthy(&h.channel, async {
        h.client.clone().start(req).await.unwrap_err()
    })
    .await;
    // tonic's code for a message over the decoding limit.
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert!(status.message().contains("too large"), "{status:?}");
}
