//! Authentication and authorization over real gRPC, with the simulator answering
//! TokenReview and SubjectAccessReview over real HTTP: no token, a bad token, a token for
//! another audience, a caller lacking pod rights (or claim rights, for claim templates and
//! ephemeral volumes), the hijack of another identity's application, the admin group, an
//! owner kept across a restart, a slow review, and the health check answering while
//! callers are refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::api::Api;
use serde_json::json;
use spark_pod_allocator::auth::{AuthMode, AuthSettings};
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator_sim::{FaultSettings, SimGrant, SimSettings, SimToken};
use test_kit::grpc::{Harness, TEMPLATE, quiet_cluster, start_request};
use test_kit::requests::*;
use test_kit::sim::raw;
use test_kit::tls::{certificate, tls_channel};
use test_kit::wait::until;
use tonic::{Code, Request};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The tests of this file run one at a time: two of them time a health check, which the
/// others (each with a cluster and a service of its own) would slow down on a small machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const AUDIENCE: &str = "spark-pod-allocator";
const ALICE: &str = "system:serviceaccount:team-a:alice";
const MALLORY: &str = "system:serviceaccount:team-a:mallory";

fn token(token: &str, username: &str, groups: &[&str], audiences: &[&str]) -> SimToken {
    SimToken {
        token: token.into(),
        username: username.into(),
        uid: format!("uid-{token}"),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        audiences: audiences.iter().map(|a| a.to_string()).collect(),
    }
}

fn grant(users: &[&str], groups: &[&str], namespace: &str, verbs: &[&str]) -> SimGrant {
    SimGrant {
        users: users.iter().map(|u| u.to_string()).collect(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
        namespaces: vec![namespace.into()],
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        resources: vec!["pods".into()],
        names: Vec::new(),
    }
}

/// alice and mallory may create, delete and list pods in team-a; carol may only create in
/// team-b; eve may do nothing; ops is in the admin group.
fn cluster() -> SimSettings {
    let mut settings = quiet_cluster();
    settings.access.tokens = vec![
        token(
            "alice-token",
            ALICE,
            &["system:serviceaccounts"],
            &[AUDIENCE],
        ),
        token(
            "mallory-token",
            MALLORY,
            &["system:serviceaccounts"],
            &[AUDIENCE],
        ),
        token("carol-token", "carol", &[], &[AUDIENCE]),
        token("eve-token", "eve", &[], &[AUDIENCE]),
        token("ops-token", "ops", &["allocator-admins"], &[AUDIENCE]),
        // Issued for the API server, not for this service.
        token("apiserver-token", ALICE, &[], &[]),
    ];
    let everything = ["create", "delete", "list"];
    settings.access.grants = vec![
        grant(&[ALICE, MALLORY], &[], "team-a", &everything),
        grant(&["carol"], &[], "team-b", &["create"]),
        grant(&[], &["allocator-admins"], "*", &["*"]),
    ];
    settings
}

fn auth() -> AuthSettings {
    AuthSettings {
        mode: AuthMode::Kubernetes,
        audiences: vec![AUDIENCE.into()],
        admin_groups: vec!["allocator-admins".into()],
        ..AuthSettings::default()
    }
}

/// alice starts `app` in team-a and asks for `n` executors.
async fn alice_starts(h: &mut Harness, app: &str, n: u32) {
    h.client
        .start(as_caller("alice-token", start_request(app, "team-a")))
        .await
        .expect("start");
    h.client
        .set_total_expected(as_caller("alice-token", targets_request(app, n)))
        .await
        .expect("alice scales her application");
}

#[track_caller]
fn assert_code(status: &tonic::Status, code: Code, words: &[&str]) {
    assert_eq!(status.code(), code, "{status:?}");
    for word in words {
        assert!(
            status.message().contains(word),
            "expected {word:?} in {:?}",
            status.message()
        );
    }
}

/// The time one health check takes over a connection of its own (as a kubelet's probe).
async fn health_check_time(h: &Harness) -> Duration {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", h.address))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut health = HealthClient::new(channel);
    let began = Instant::now();
    health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers");
    began.elapsed()
}

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-anon";
    let err = h
        .client
        .start(start_request(app, "team-a"))
        .await
        .unwrap_err();
    assert_code(&err, Code::Unauthenticated, &["authorization: Bearer"]);
    let err = h
        .client
        .start(as_caller("forged", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::Unauthenticated,
        &["not accepted", "invalid bearer token"],
    );
    let err = h
        .client
        .start(as_caller("apiserver-token", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(&err, Code::Unauthenticated, &["audiences"]);
    let mut basic = Request::new(status_request(app));
    basic
        .metadata_mut()
        .insert("authorization", "Basic YWxpY2U6cHc=".parse().unwrap());
    let err = h.client.get_status(basic).await.unwrap_err();
    assert_code(&err, Code::Unauthenticated, &["Bearer <token>"]);
    assert!(h.pods("team-a", app).await.is_empty());
    assert!(h.applications.ownership(&app_id(app)).is_none());
}

fn app_id(app: &str) -> spark_pod_allocator::app::AppId {
    spark_pod_allocator::app::AppId::parse(app).expect("app id")
}

#[tokio::test]
async fn start_needs_create_and_delete_pods_in_the_namespace() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let err = h
        .client
        .start(as_caller("eve-token", start_request("spark-eve", "team-a")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &["eve may not create pods in namespace team-a"],
    );
    let err = h
        .client
        .start(as_caller(
            "carol-token",
            start_request("spark-carol", "team-b"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &["carol may not delete pods in namespace team-b"],
    );
    // Rights in one namespace give none in another (the confused deputy).
    let err = h
        .client
        .start(as_caller(
            "mallory-token",
            start_request("spark-m", "team-b"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&format!(
            "{MALLORY} may not create pods in namespace team-b"
        )],
    );
    for (app, namespace) in [
        ("spark-eve", "team-a"),
        ("spark-carol", "team-b"),
        ("spark-m", "team-b"),
    ] {
        assert!(h.pods(namespace, app).await.is_empty());
        assert!(h.applications.ownership(&app_id(app)).is_none());
    }
    // With the rights, the same call goes through.
    let started = h
        .client
        .start(as_caller(
            "alice-token",
            start_request("spark-alice", "team-a"),
        ))
        .await
        .expect("alice may start in team-a")
        .into_inner();
    assert!(!started.resumed);
}

#[tokio::test]
async fn only_the_owner_or_an_admin_may_call_an_application() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-alice";
    alice_starts(&mut h, app, 2).await;
    let owned = ["started by another identity"];
    let denied = Code::PermissionDenied;
    // mallory has every pod right in team-a, but the application is not hers.
    let m = "mallory-token";
    assert_code(
        &h.client
            .get_status(as_caller(m, status_request(app)))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .set_total_expected(as_caller(m, targets_request(app, 50)))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .is_deleted(as_caller(m, is_deleted_request(app, "1")))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .update_registered_executors(as_caller(
                m,
                proto::UpdateRegisteredExecutorsRequest {
                    application_id: app.into(),
                    executor_ids: vec![],
                },
            ))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .watch_executors(as_caller(m, watch_request(app, 0)))
            .await
            .expect_err("watch refused"),
        denied,
        &owned,
    );
    assert_code(
        &h.client
            .stop(as_caller(m, stop_request(app)))
            .await
            .unwrap_err(),
        denied,
        &owned,
    );
    // Nothing mallory asked for happened.
    let status = h
        .client
        .get_status(as_caller("alice-token", status_request(app)))
        .await
        .expect("alice reads her application")
        .into_inner();
    assert_eq!(status.profiles[0].target, 2);
    // An admin may act on any application.
    h.client
        .get_status(as_caller("ops-token", status_request(app)))
        .await
        .expect("the admin reads it");
    h.client
        .stop(as_caller("ops-token", stop_request(app)))
        .await
        .expect("the admin stops it");
}

#[tokio::test]
async fn a_hijacker_starting_first_never_hands_its_template_to_the_victim() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-victim";
    let mut evil = start_request(app, "team-a");
    evil.executor_pod_template = TEMPLATE.replace("spark:4", "evil:latest");
    h.client
        .start(as_caller("mallory-token", evil))
        .await
        .expect("mallory may start an application in team-a");
    // The victim's Start is refused, never answered `resumed` with mallory's template.
    let err = h
        .client
        .start(as_caller("alice-token", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &["spark-victim", "another identity"],
    );
    // Nor can the victim be led to scale mallory's pods.
    assert_code(
        &h.client
            .set_total_expected(as_caller("alice-token", targets_request(app, 3)))
            .await
            .unwrap_err(),
        Code::PermissionDenied,
        &["another identity"],
    );
    assert!(h.pods("team-a", app).await.is_empty());
    assert_eq!(
        h.applications.ownership(&app_id(app)).and_then(|o| o.owner),
        Some(MALLORY.to_string())
    );
}

#[tokio::test]
async fn the_owner_is_kept_in_the_registration_and_survives_a_restart() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-kept";
    alice_starts(&mut h, app, 1).await;
    let client = h.sim.try_client().expect("client");
    let service_ns = h.options.registrations.namespace().to_string();
    let clock = h.clock.clone();
    until("the registration is written with its owner", || {
        let (client, service_ns, clock) = (client.clone(), service_ns.clone(), clock.clone());
        async move {
            clock.advance(Duration::from_secs(1));
            test_kit::service::stored_registration(&client, &service_ns, "team-a", app)
                .await
                .is_some_and(|r| r.owner.as_deref() == Some(ALICE) && r.targets.get(&0) == Some(&1))
        }
    })
    .await;
    h.restart().await;
    let resumed = h.applications.resume_registered().await.expect("resume");
    assert_eq!(resumed, vec![app_id(app)]);
    let err = h
        .client
        .start(as_caller("mallory-token", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(&err, Code::PermissionDenied, &["another identity"]);
    let again = h
        .client
        .start(as_caller("alice-token", start_request(app, "team-a")))
        .await
        .expect("the owner starts it again")
        .into_inner();
    assert!(again.resumed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_that_does_not_answer_is_unavailable_and_never_stalls_health() {
    let _serial = SERIAL.lock().await;
    let settings = AuthSettings {
        review_timeout_ms: 300,
        ..auth()
    };
    let h = Harness::start_with_auth(cluster(), settings).await;
    h.sim.set_faults(FaultSettings {
        latency_ms: 5_000,
        ..FaultSettings::default()
    });
    // Many callers at once, each with its own token (no cache helps); fewer than the
    // server's streams per connection (`grpc.max_concurrent_streams`, 32), as they share one.
    let calls: Vec<_> = (0..24)
        .map(|i| {
            let mut client = h.client.clone();
            tokio::spawn(async move {
                client
                    .get_status(as_caller(&format!("token-{i}"), status_request("spark-x")))
                    .await
            })
        })
        .collect();
    let health = health_check_time(&h).await;
    assert!(
        health < Duration::from_millis(100),
        "health took {health:?}"
    );
    for call in calls {
        let err = call.await.expect("call task").unwrap_err();
        assert_code(
            &err,
            Code::Unavailable,
            &["TokenReview", "auth.review_timeout_ms"],
        );
    }
    h.sim.set_faults(FaultSettings::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_tokens_is_refused_while_health_answers() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start_with_auth(cluster(), auth()).await;
    // Attackers call back to back with forged tokens (a new one every tenth call), on
    // connections of their own, from a runtime of their own (as from other machines),
    // until the health checks are done.
    let attacking = Arc::new(AtomicBool::new(true));
    let address = h.address;
    let attack = {
        let attacking = Arc::clone(&attacking);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("attackers' runtime");
            runtime.block_on(async move {
                let attackers: Vec<_> = (0..8)
                    .map(|worker| tokio::spawn(attacker(address, worker, Arc::clone(&attacking))))
                    .collect();
                let mut refused = 0;
                for attacker in attackers {
                    refused += attacker.await.expect("attacker");
                }
                refused
            })
        })
    };
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        slowest = slowest.max(health_check_time(&h).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    attacking.store(false, Ordering::Relaxed);
    let refused = attack.join().expect("attack thread");
    eprintln!("{refused} forged calls refused; slowest health check {slowest:?}");
    assert!(refused >= 8, "the attack ran ({refused} calls refused)");
    assert!(
        slowest < Duration::from_millis(100),
        "the slowest health check took {slowest:?} while {refused} forged calls were refused"
    );
    assert!(h.applications.ownership(&app_id("spark-victim")).is_none());
}

/// Calls Start with forged tokens until told to stop; returns how many were refused.
async fn attacker(address: std::net::SocketAddr, worker: u32, attacking: Arc<AtomicBool>) -> u32 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = ExecutorAllocatorClient::new(channel);
    let mut refused = 0u32;
    while attacking.load(Ordering::Relaxed) {
        let forged = format!("forged-{worker}-{}", refused / 10);
        let err = client
            .start(as_caller(&forged, start_request("spark-victim", "team-a")))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        refused += 1;
    }
    refused
}

#[tokio::test]
async fn the_simulator_reviews_tokens_and_access_as_an_api_server() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start_with_auth(cluster(), auth()).await;
    let client = h.sim.try_client().expect("client");
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        Some(
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": "alice-token", "audiences": [AUDIENCE]}}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["kind"], "TokenReview");
    assert_eq!(body["status"]["authenticated"], true);
    assert_eq!(body["status"]["user"]["username"], ALICE);
    assert_eq!(body["status"]["audiences"], json!([AUDIENCE]));
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}})),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (400, Some("BadRequest")),
        "{body}"
    );
    let review = |user: &str, namespace: &str, verb: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": "pods"}}})
    };
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        Some(review("carol", "team-b", "create")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"]["allowed"], true);
    let (_, _, body) = raw(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        Some(review("carol", "team-b", "delete")),
    )
    .await;
    assert_eq!(body["status"]["allowed"], false);
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        Some(
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}),
        ),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (422, Some("Invalid")),
        "{body}"
    );
}

#[test]
fn serve_without_authentication_refuses_a_non_loopback_address() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_spark-pod-allocator"))
        .args(["serve", "--simulate", "--listen", "0.0.0.0:0"])
        .env_remove("SPARK_POD_ALLOCATOR__AUTH__MODE")
        .env_remove("SPARK_POD_ALLOCATOR__AUTH__ALLOW_UNAUTHENTICATED_REMOTE")
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for key in [
        "auth.mode",
        "auth.allow_unauthenticated_remote",
        "0.0.0.0:0",
    ] {
        assert!(stderr.contains(key), "expected {key:?} in {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_with_a_token_and_a_reloaded_certificate() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let (first_ca, first_cert, first_key) = certificate(dir.path(), "first");
    // The files the service reads; replaced below as a Secret update would.
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(&first_cert, &cert).expect("certificate");
    std::fs::copy(&first_key, &key).expect("key");
    let sim = spark_pod_allocator_sim::SimCluster::start(cluster())
        .await
        .expect("simulated cluster");
    let settings = spark_pod_allocator::grpc::ServeSettings {
        tls: spark_pod_allocator::grpc::tls::TlsSettings {
            cert_file: Some(cert.clone()),
            key_file: Some(key.clone()),
            reload_interval_ms: 100,
            ..Default::default()
        },
        ..Default::default()
    };
    let service = test_kit::grpc::serve(
        &sim,
        &spark_pod_allocator::app::ManualClock::starting_now(),
        settings,
        Default::default(),
        Some(&auth()),
    )
    .await;
    let address = service.address();

    // Over TLS, a driver with its token starts its application.
    let channel = tls_channel(address, &first_ca).await.expect("TLS connect");
    let mut driver = ExecutorAllocatorClient::new(channel);
    driver
        .start(as_caller(
            "alice-token",
            start_request("spark-tls", "team-a"),
        ))
        .await
        .expect("Start over TLS");
    // A plaintext client gets no answer from the TLS port.
    let plaintext = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await;
    if let Ok(channel) = plaintext {
        let mut health = HealthClient::new(channel);
        assert!(
            health
                .check(HealthCheckRequest {
                    service: String::new()
                })
                .await
                .is_err(),
            "plaintext answered on the TLS port"
        );
    }

    // A rotated certificate is served to new connections without a restart.
    let (second_ca, second_cert, second_key) = certificate(dir.path(), "second");
    assert!(
        tls_channel(address, &second_ca).await.is_err(),
        "a client trusting only the second CA is refused before the rotation"
    );
    std::fs::copy(&second_key, &key).expect("replace key");
    std::fs::copy(&second_cert, &cert).expect("replace certificate");
    let reloaded = async {
        loop {
            if let Ok(channel) = tls_channel(address, &second_ca).await {
                let mut health = HealthClient::new(channel);
                if health
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), reloaded)
        .await
        .expect("the rotated certificate is served");
    service.shutdown().await.expect("server result");
}

/// How many reviews of `resource` (`tokenreviews`, `subjectaccessreviews`) the API server
/// has answered.
async fn reviews_answered(h: &Harness, resource: &str) -> u64 {
    let client = h.sim.try_client().expect("client");
    let (code, _, body) = raw(&client, "GET", "/sim/requests", "", None).await;
    assert_eq!(code, 200, "{body}");
    body["requests"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|row| row["resource"] == resource)
        .map(|row| row["count"].as_u64().expect("count"))
        .sum()
}

/// A client on a connection of its own.
async fn own_connection(h: &Harness) -> ExecutorAllocatorClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", h.address))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    ExecutorAllocatorClient::new(channel)
}

/// A valid Pod template of about 240 KB (18,000 labels): costly to parse, within
/// `limits.max_template_bytes`.
fn heavy_template() -> String {
    let labels: String = (0..18_000).map(|i| format!("    k{i}: v\n")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n{labels}spec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n"
    )
}

/// A Start of `app` in team-a with 15 heavy profile templates (3.6 MB, under the 4 MiB
/// message limit) and a broken one last: had any template been parsed, the answer would be
/// INVALID_ARGUMENT about `resource_profile_templates[16]`.
fn heavy_broken_start(app: &str) -> proto::StartRequest {
    let heavy = heavy_template();
    let mut request = start_request(app, "team-a");
    request.resource_profile_templates = (1..=15).map(|p| (p, heavy.clone())).collect();
    request
        .resource_profile_templates
        .insert(16, "kind: [".into());
    request
}

/// Calls `call` back to back from `connections` connections × `streams` concurrent loops
/// each, from a runtime of its own (as from other machines), until `attacking` is cleared;
/// returns the codes answered, counted by name.
fn flood<F, Fut>(
    address: std::net::SocketAddr,
    connections: u32,
    streams: u32,
    attacking: Arc<AtomicBool>,
    call: F,
) -> std::thread::JoinHandle<std::collections::BTreeMap<String, u32>>
where
    F: Fn(ExecutorAllocatorClient<tonic::transport::Channel>, String) -> Fut
        + Send
        + Sync
        + 'static,
    Fut: Future<Output = Code> + Send + 'static,
{
    let call = Arc::new(call);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("attackers' runtime");
        runtime.block_on(async move {
            let mut loops = Vec::new();
            for connection in 0..connections {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                    .expect("endpoint")
                    .connect()
                    .await
                    .expect("connect");
                for stream in 0..streams {
                    let client = ExecutorAllocatorClient::new(channel.clone());
                    let attacking = Arc::clone(&attacking);
                    let call = Arc::clone(&call);
                    loops.push(tokio::spawn(async move {
                        let mut codes = Vec::new();
                        let mut n = 0u32;
                        while attacking.load(Ordering::Relaxed) {
                            let tag = format!("{connection}-{stream}-{n}");
                            codes.push(call(client.clone(), tag).await);
                            n += 1;
                        }
                        codes
                    }));
                }
            }
            let mut counted = std::collections::BTreeMap::new();
            for one in loops {
                for code in one.await.expect("attack loop") {
                    *counted.entry(format!("{code:?}")).or_insert(0) += 1;
                }
            }
            counted
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_is_authorized_before_any_template_is_parsed() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    // Without a valid token, and without rights: the identity's answer, not the template's.
    for (token, code, words) in [
        (None, Code::Unauthenticated, "authorization: Bearer"),
        (Some("forged"), Code::Unauthenticated, "not accepted"),
        (
            Some("eve-token"),
            Code::PermissionDenied,
            "eve may not create pods",
        ),
        (Some("carol-token"), Code::PermissionDenied, "team-a"),
    ] {
        let request = heavy_broken_start("spark-heavy");
        let request = match token {
            Some(token) => as_caller(token, request),
            None => Request::new(request),
        };
        let err = h.client.start(request).await.unwrap_err();
        assert_code(&err, code, &[words]);
    }
    // Bad settings are a template's neighbours: checked after authorization too.
    let mut request = start_request("spark-heavy", "team-a");
    request.settings = Some(proto::AllocationSettings {
        batch_delay_ms: Some(50),
        ..Default::default()
    });
    let err = h
        .client
        .start(as_caller("eve-token", request))
        .await
        .unwrap_err();
    assert_code(&err, Code::PermissionDenied, &["eve may not create pods"]);
    // SetTotalExpected: an application that does not run answers NOT_FOUND, unparsed.
    let mut request = targets_request("spark-nowhere", 1);
    request.resource_profile_templates = [(1, "kind: [".to_string())].into();
    let err = h
        .client
        .set_total_expected(as_caller("eve-token", request))
        .await
        .unwrap_err();
    assert_code(&err, Code::NotFound, &["spark-nowhere"]);
    // The same request from a caller with rights is parsed and refused for its template.
    let err = h
        .client
        .start(as_caller("alice-token", heavy_broken_start("spark-heavy")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::InvalidArgument,
        &["resource_profile_templates[16]"],
    );

    // 4 senders without rights flood Start with 3.6 MB of templates while alice starts
    // applications: each flood call is PERMISSION_DENIED, which no parse could answer.
    let attacking = Arc::new(AtomicBool::new(true));
    let heavy = Arc::new(heavy_broken_start("spark-heavy"));
    // Alice goes on until the flood has been answered a few times, however slowly the
    // attackers' connections come up on a loaded machine.
    let flood_answered = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let answered = Arc::clone(&flood_answered);
    let attack = flood(
        h.address,
        4,
        1,
        Arc::clone(&attacking),
        move |mut client, _| {
            let request = as_caller("eve-token", (*heavy).clone());
            let answered = Arc::clone(&answered);
            async move {
                let code = client.start(request).await.unwrap_err().code();
                answered.fetch_add(1, Ordering::Relaxed);
                code
            }
        },
    );
    let mut times = Vec::new();
    for i in 0.. {
        if i >= 10 && flood_answered.load(Ordering::Relaxed) >= 4 {
            break;
        }
        // Below the identity's application cap (100).
        assert!(
            i < 90,
            "the flood was not answered 4 times during 90 Starts"
        );
        let began = Instant::now();
        h.client
            .start(as_caller(
                "alice-token",
                start_request(format!("spark-legit-{i}").as_str(), "team-a"),
            ))
            .await
            .expect("alice's Start during the flood");
        times.push(began.elapsed());
    }
    attacking.store(false, Ordering::Relaxed);
    let codes = attack.join().expect("attack thread");
    times.sort();
    eprintln!(
        "flood answered {codes:?}; alice's Start during it: median {:?}, slowest {:?}",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    assert_eq!(
        codes.keys().collect::<Vec<_>>(),
        ["PermissionDenied"],
        "{codes:?}"
    );
    assert!(codes["PermissionDenied"] >= 4, "the flood ran: {codes:?}");
    assert!(h.applications.ownership(&app_id("spark-heavy")).is_none());
}

/// Settings under which a cached answer expires several times during a flood, the queue
/// of unknown tokens is short and its deadline shorter than the wait behind a flood.
fn slow_server_auth() -> AuthSettings {
    AuthSettings {
        cache_ttl_ms: 600,
        cache_capacity: 32,
        review_timeout_ms: 2_000,
        max_concurrent_reviews: 2,
        max_failed_authentications_per_connection: 1_000_000,
        ..auth()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_caller_is_served_while_forged_tokens_flood_a_slow_api_server() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), slow_server_auth()).await;
    let app = "spark-busy";
    alice_starts(&mut h, app, 1).await;
    h.sim.set_faults(FaultSettings {
        latency_ms: 100,
        ..FaultSettings::default()
    });
    // 64 forged calls at once, each token new: 32 reviews of 100 ms queue for each turn of
    // the unknown queue, longer than the review deadline.
    let attacking = Arc::new(AtomicBool::new(true));
    let attack = flood(
        h.address,
        4,
        16,
        Arc::clone(&attacking),
        |mut client, tag| {
            let request = as_caller(&format!("forged-{tag}"), status_request("spark-busy"));
            async move { client.get_status(request).await.unwrap_err().code() }
        },
    );
    // alice calls every 50 ms for 3 s: five times her answers' lifetime.
    let began = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    while began.elapsed() < Duration::from_secs(3) {
        let call = Instant::now();
        let answer = h
            .client
            .get_status(as_caller("alice-token", status_request(app)))
            .await;
        slowest = slowest.max(call.elapsed());
        calls += 1;
        assert!(
            answer.is_ok(),
            "alice's call {calls} at {:?} failed: {answer:?}",
            began.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    attacking.store(false, Ordering::Relaxed);
    let codes = attack.join().expect("attack thread");
    h.sim.set_faults(FaultSettings::default());
    eprintln!("{calls} calls of alice OK, slowest {slowest:?}; the flood answered {codes:?}");
    assert!(
        codes.get("Unavailable").is_some_and(|n| *n > 0),
        "the flood filled the unknown queue past its deadline: {codes:?}"
    );
    assert!(
        slowest < Duration::from_millis(1_000),
        "alice waited {slowest:?} (the review deadline is 2 s)"
    );
}

#[tokio::test]
async fn a_connection_that_keeps_failing_authentication_is_refused_without_a_review() {
    let _serial = SERIAL.lock().await;
    let budget = 5;
    let settings = AuthSettings {
        max_failed_authentications_per_connection: budget,
        ..auth()
    };
    let h = Harness::start_with_auth(cluster(), settings).await;
    let mut attacker = own_connection(&h).await;
    let before = reviews_answered(&h, "tokenreviews").await;
    for i in 0..budget {
        let err = attacker
            .get_status(as_caller(&format!("forged-{i}"), status_request("spark-x")))
            .await
            .unwrap_err();
        assert_code(&err, Code::Unauthenticated, &["not accepted"]);
    }
    assert_eq!(
        reviews_answered(&h, "tokenreviews").await - before,
        u64::from(budget)
    );
    // Past the budget: refused at once, a valid token included, and no review is asked.
    for token in ["forged-new", "alice-token"] {
        let err = attacker
            .get_status(as_caller(token, status_request("spark-x")))
            .await
            .unwrap_err();
        assert_code(
            &err,
            Code::Unauthenticated,
            &["auth.max_failed_authentications_per_connection"],
        );
    }
    assert_eq!(
        reviews_answered(&h, "tokenreviews").await - before,
        u64::from(budget)
    );
    // Another connection is not affected, and a refused token is reviewed once.
    let mut other = own_connection(&h).await;
    for _ in 0..3 {
        let err = other
            .get_status(as_caller("forged-again", status_request("spark-x")))
            .await
            .unwrap_err();
        assert_code(&err, Code::Unauthenticated, &["not accepted"]);
    }
    let err = other
        .get_status(as_caller("alice-token", status_request("spark-x")))
        .await
        .unwrap_err();
    assert_code(&err, Code::NotFound, &["spark-x"]);
    assert_eq!(
        reviews_answered(&h, "tokenreviews").await - before,
        u64::from(budget) + 2
    );
}

const DORA: &str = "system:serviceaccount:team-a:dora";
const PAUL: &str = "system:serviceaccount:team-a:paul";

/// alice may also get and patch pods in team-a; dora may create, delete and list pods in
/// team-a but get and patch only her own driver pod; paul may get pods but not patch them.
fn driver_cluster() -> SimSettings {
    let mut settings = cluster();
    settings.access.tokens.extend([
        token("dora-token", DORA, &[], &[AUDIENCE]),
        token("paul-token", PAUL, &[], &[AUDIENCE]),
    ]);
    settings.access.grants.extend([
        grant(&[ALICE], &[], "team-a", &["get", "patch"]),
        grant(&[DORA, PAUL], &[], "team-a", &["create", "delete", "list"]),
        SimGrant {
            names: vec!["dora-driver".into()],
            ..grant(&[DORA], &[], "team-a", &["get", "patch"])
        },
        grant(&[PAUL], &[], "team-a", &["get"]),
    ]);
    settings
}

async fn create_driver_pod(h: &Harness, name: &str) -> k8s_openapi::api::core::v1::Pod {
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(h.sim.try_client().expect("client"), "team-a");
    let pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .expect("pod");
    pods.create(&Default::default(), &pod)
        .await
        .expect("driver pod")
}

fn start_with_driver(app: &str, driver: &str) -> proto::StartRequest {
    let mut request = start_request(app, "team-a");
    request.driver_pod_name = driver.into();
    request
}

#[tokio::test]
async fn a_driver_pod_the_caller_may_not_get_answers_as_a_missing_one() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(driver_cluster(), auth()).await;
    let victim = create_driver_pod(&h, "alice-driver").await;
    create_driver_pod(&h, "dora-driver").await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(h.sim.try_client().expect("client"), "team-a");

    // dora names alice's driver pod, then one that does not exist: the same answer.
    let app = "spark-dora";
    let hidden = h
        .client
        .start(as_caller(
            "dora-token",
            start_with_driver(app, "alice-driver"),
        ))
        .await
        .unwrap_err();
    let missing = h
        .client
        .start(as_caller(
            "dora-token",
            start_with_driver(app, "ghost-driver"),
        ))
        .await
        .unwrap_err();
    assert_eq!(hidden.code(), Code::FailedPrecondition, "{hidden:?}");
    assert_eq!(missing.code(), hidden.code());
    assert_eq!(
        hidden.message(),
        "No pod was found named alice-driver in the cluster in the namespace team-a"
    );
    assert_eq!(
        missing.message().replace("ghost-driver", "alice-driver"),
        hidden.message()
    );
    // Nothing was done with alice's pod, and nothing was started for dora.
    let after = pods.get("alice-driver").await.expect("alice's driver");
    assert_eq!(
        after.metadata.resource_version, victim.metadata.resource_version,
        "alice's driver pod was not patched"
    );
    assert!(h.applications.ownership(&app_id(app)).is_none());
    h.client
        .set_total_expected(as_caller("dora-token", targets_request(app, 2)))
        .await
        .expect_err("dora's application does not run");
    assert!(h.pods("team-a", app).await.is_empty());

    // paul may see alice's pod but not patch it: refused, naming the verb.
    let err = h
        .client
        .start(as_caller(
            "paul-token",
            start_with_driver("spark-paul", "alice-driver"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&format!(
            "{PAUL} may not patch pod alice-driver in namespace team-a"
        )],
    );
    assert!(h.applications.ownership(&app_id("spark-paul")).is_none());

    // With the rights on that one pod (a grant naming it), dora's own driver is taken; so
    // is alice's, by alice.
    h.client
        .start(as_caller(
            "dora-token",
            start_with_driver(app, "dora-driver"),
        ))
        .await
        .expect("dora names her own driver pod");
    alice_starts_with(&mut h, "spark-alice", "alice-driver").await;
    let status = h
        .client
        .get_status(as_caller("alice-token", status_request("spark-alice")))
        .await
        .expect("alice's status")
        .into_inner();
    assert_eq!(
        status.driver.map(|d| d.pod_name).as_deref(),
        Some("alice-driver")
    );
}

async fn alice_starts_with(h: &mut Harness, app: &str, driver: &str) {
    h.client
        .start(as_caller("alice-token", start_with_driver(app, driver)))
        .await
        .expect("alice starts with her driver pod");
}

/// A pod template whose executors get a generic ephemeral volume (a claim the cluster
/// creates for the pod).
const EPHEMERAL_TEMPLATE: &str = r#"{"spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}],
  "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {
    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}}]}}"#;

#[tokio::test]
async fn claims_need_the_callers_own_right_to_create_claims() {
    let _serial = SERIAL.lock().await;
    // alice may also create claims in team-a; mallory, with the same pod rights, may not.
    let mut settings = cluster();
    settings.access.grants.push(SimGrant {
        resources: vec!["persistentvolumeclaims".into()],
        ..grant(&[ALICE], &[], "team-a", &["create"])
    });
    let mut h = Harness::start_with_auth(settings, auth()).await;
    let denied = format!("{MALLORY} may not create persistentvolumeclaims in namespace team-a");
    // Refused before its claim template is read: a broken one is not even reported.
    let with_claims = |app: &str, claim: &str| proto::StartRequest {
        executor_claim_templates: vec![claim.into()],
        ..start_request(app, "team-a")
    };
    let err = h
        .client
        .start(as_caller(
            "mallory-token",
            with_claims("spark-m1", "{{{ not yaml"),
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&denied, "executor_claim_templates"],
    );
    // A generic ephemeral volume makes the cluster create a claim for the pod.
    let err = h
        .client
        .start(as_caller(
            "mallory-token",
            proto::StartRequest {
                executor_pod_template: EPHEMERAL_TEMPLATE.into(),
                ..start_request("spark-m2", "team-a")
            },
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[&denied, "executor_pod_template: spec.volumes[0].ephemeral"],
    );
    // Nor through a profile added later.
    h.client
        .start(as_caller(
            "mallory-token",
            start_request("spark-m3", "team-a"),
        ))
        .await
        .expect("mallory may start without claims");
    let err = h
        .client
        .set_total_expected(as_caller(
            "mallory-token",
            proto::SetTotalExpectedRequest {
                application_id: "spark-m3".into(),
                executors_per_profile: [(1, 2)].into(),
                resource_profile_templates: [(1, EPHEMERAL_TEMPLATE.to_string())].into(),
            },
        ))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::PermissionDenied,
        &[
            &denied,
            "resource_profile_templates[1]: spec.volumes[0].ephemeral",
        ],
    );
    for app in ["spark-m1", "spark-m2"] {
        assert!(h.applications.ownership(&app_id(app)).is_none(), "{app}");
    }
    assert!(h.pods("team-a", "spark-m3").await.is_empty());
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(h.sim.try_client().expect("sim client"), "team-a");
    assert!(
        claims
            .list(&Default::default())
            .await
            .expect("claims")
            .items
            .is_empty()
    );

    // With the right, the same calls go through.
    let claim = r#"{"metadata": {"name": "{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}"#;
    h.client
        .start(as_caller(
            "alice-token",
            proto::StartRequest {
                executor_pod_template: EPHEMERAL_TEMPLATE.into(),
                ..with_claims("spark-alice", claim)
            },
        ))
        .await
        .expect("alice may create claims in team-a");
    h.client
        .set_total_expected(as_caller("alice-token", targets_request("spark-alice", 1)))
        .await
        .expect("alice scales");
    until("alice's executor", async || {
        h.pods("team-a", "spark-alice").await.len() == 1
    })
    .await;
}
