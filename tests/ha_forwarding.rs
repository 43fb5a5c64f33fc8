//! Two replicas in one process on one simulated cluster (one shard Lease, real HTTP/2
//! between them), callers authenticated by the simulator's TokenReview: every call that
//! reaches the replica not holding the shard is answered by the holder, as the holder would
//! answer it directly. The caller's own token travels with the forward and is checked
//! again by the owner, so the forwarding replica lends no one its rights; a forward is
//! never forwarded again. With TLS, a replica forwards only to a peer whose certificate
//! its `ha.peer_ca_file` verifies.
use std::path::PathBuf;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use spark_pod_allocator::allocator::Timestamp;
use spark_pod_allocator::app::ManualClock;
use spark_pod_allocator::auth::{AuthMode, AuthSettings};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::grpc::forward::{ANSWERED_BY_METADATA, FORWARDED_BY_METADATA};
use spark_pod_allocator::grpc::tls::TlsSettings;
use spark_pod_allocator::ha::HaSettings;
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::Service;
use spark_pod_allocator_sim::{SimCluster, SimGrant, SimSettings, SimToken};
use test_kit::grpc::{quiet_cluster, start_request, until_event};
use test_kit::requests::*;
use test_kit::tls::{certificate, tls_channel};
use test_kit::wait::until_progress;
use tonic::Code;
use tonic::transport::Channel;

const AUDIENCE: &str = "spark-pod-allocator";
const ALICE: &str = "system:serviceaccount:team-a:alice";
const MALLORY: &str = "system:serviceaccount:team-a:mallory";
const BOB: &str = "system:serviceaccount:team-b:bob";
const NS: &str = "team-a";
const NS_B: &str = "team-b";
const APP: &str = "app-forwarded";

fn token(token: &str, username: &str) -> SimToken {
    SimToken {
        token: token.into(),
        username: username.into(),
        uid: format!("uid-{token}"),
        groups: vec!["system:serviceaccounts".into()],
        audiences: vec![AUDIENCE.into()],
    }
}

/// alice and mallory may create, delete and list pods in team-a; eve may do nothing.
fn cluster() -> SimSettings {
    let mut settings = quiet_cluster();
    settings.access.tokens = vec![
        token("alice-token", ALICE),
        token("mallory-token", MALLORY),
        token("eve-token", "eve"),
        token("bob-token", BOB),
    ];
    let pods = |users: Vec<String>, namespace: &str| SimGrant {
        users,
        groups: Vec::new(),
        namespaces: vec![namespace.into()],
        verbs: vec!["create".into(), "delete".into(), "list".into()],
        resources: vec!["pods".into()],
        names: Vec::new(),
    };
    settings.access.grants = vec![
        pods(vec![ALICE.into(), MALLORY.into()], NS),
        pods(vec![BOB.into()], NS_B),
    ];
    settings
}

/// The TLS of a replica: its certificate and key, and the CA it verifies its peers with.
struct ReplicaTls {
    cert: PathBuf,
    key: PathBuf,
    peer_ca: PathBuf,
}

/// A replica named `identity` (a 2 s lease), started as the test kit starts every service:
/// it advertises the address it is bound to, forwards through its shard ownerships and
/// reviews every caller.
async fn replica(
    sim: &SimCluster,
    clock: &ManualClock,
    identity: &str,
    tls: Option<&ReplicaTls>,
) -> (Service, Metrics) {
    let mut ha = HaSettings {
        identity: Some(identity.into()),
        lease_duration_ms: 2000,
        renew_deadline_ms: 1000,
        retry_period_ms: 250,
        ..HaSettings::default()
    };
    let metrics = Metrics::new();
    let mut settings = ServeSettings {
        metrics: metrics.clone(),
        ..ServeSettings::default()
    };
    if let Some(tls) = tls {
        settings.tls = TlsSettings {
            cert_file: Some(tls.cert.clone()),
            key_file: Some(tls.key.clone()),
            ..TlsSettings::default()
        };
        ha.peer_ca_file = Some(tls.peer_ca.clone());
        ha.peer_server_name = Some("localhost".into());
    }
    let mut config = Settings::default();
    config.ha = ha;
    let auth = AuthSettings {
        mode: AuthMode::Kubernetes,
        audiences: vec![AUDIENCE.into()],
        ..AuthSettings::default()
    };
    let service = test_kit::grpc::serve(sim, clock, settings, config, Some(&auth)).await;
    (service, metrics)
}

/// replica-a holding the shard, then replica-b beside it (forwarding to replica-a), and
/// replica-b's metrics.
async fn holder_and_forwarder(
    sim: &SimCluster,
    clock: &ManualClock,
) -> (Service, Service, Metrics) {
    let (a, _) = replica(sim, clock, "replica-a", None).await;
    until_progress(
        "replica-a holds the shard",
        async || holder(sim).await,
        |holder| holder.as_deref() == Some("replica-a"),
    )
    .await;
    let (b, b_metrics) = replica(sim, clock, "replica-b", None).await;
    (a, b, b_metrics)
}

async fn client_of(service: &Service) -> ExecutorAllocatorClient<Channel> {
    test_kit::grpc::connect(service.address()).await.1
}

fn answered_by(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    metadata
        .get(ANSWERED_BY_METADATA)
        .and_then(|value| value.to_str().ok())
}

async fn holder(sim: &SimCluster) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(sim.try_client().expect("client"), "default");
    let lease = leases
        .get_opt("spark-pod-allocator-shard-0")
        .await
        .expect("get the Lease")?;
    lease.spec?.holder_identity
}

#[track_caller]
fn assert_code(status: &tonic::Status, code: Code, words: &[&str]) {
    assert_eq!(status.code(), code, "{status:?}");
    for word in words {
        assert!(status.message().contains(word), "{word:?} in {status:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_through_the_replica_without_the_shard_is_answered_by_its_holder() {
    let sim = SimCluster::start(cluster())
        .await
        .expect("simulated cluster");
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let (a, b, b_metrics) = holder_and_forwarder(&sim, &clock).await;
    let mut via_b = client_of(&b).await;

    let started = via_b
        .start(as_caller("alice-token", start_request(APP, NS)))
        .await
        .expect("Start through replica-b");
    assert_eq!(answered_by(started.metadata()), Some("replica-a"));
    assert!(a.applications().ownership(&app_id()).is_some());
    assert!(
        b.applications().ownership(&app_id()).is_none(),
        "replica-b runs nothing"
    );
    let scaled = via_b
        .set_total_expected(as_caller("alice-token", targets_request(APP, 3)))
        .await
        .expect("SetTotalExpected through replica-b");
    assert_eq!(answered_by(scaled.metadata()), Some("replica-a"));
    let status = via_b
        .get_status(as_caller("alice-token", status_request(APP)))
        .await
        .expect("GetStatus through replica-b")
        .into_inner();
    assert_eq!(status.profiles[0].target, 3);
    let deleted = via_b
        .is_deleted(as_caller("alice-token", is_deleted_request(APP, "1")))
        .await
        .expect("IsDeleted through replica-b");
    assert!(!deleted.into_inner().deleted);
    via_b
        .update_registered_executors(as_caller(
            "alice-token",
            proto::UpdateRegisteredExecutorsRequest {
                application_id: APP.into(),
                executor_ids: vec!["1".into()],
                running_tasks: Default::default(),
            },
        ))
        .await
        .expect("UpdateRegisteredExecutors through replica-b");
    let mut events = via_b
        .watch_executors(as_caller("alice-token", watch_request(APP, 0)))
        .await
        .expect("WatchExecutors through replica-b")
        .into_inner();
    until_event(&mut events, "the owner's first full state", |event| {
        event.kind == proto::ExecutorEventKind::Synced as i32
    })
    .await;

    // The forwarding replica lends no one its rights: the owner checks each caller.
    let hijack = via_b
        .set_total_expected(as_caller("mallory-token", targets_request(APP, 0)))
        .await
        .expect_err("mallory does not own alice's application");
    assert_code(&hijack, Code::PermissionDenied, &[]);
    assert_eq!(answered_by(hijack.metadata()), Some("replica-a"));
    let nobody = via_b
        .get_status(as_caller("eve-token", status_request(APP)))
        .await
        .expect_err("eve may do nothing");
    assert_code(&nobody, Code::PermissionDenied, &[]);
    let eve_start = via_b
        .start(as_caller("eve-token", start_request("app-eve", NS)))
        .await
        .expect_err("eve may not create pods in team-a");
    assert_code(&eve_start, Code::PermissionDenied, &["team-a"]);
    assert_eq!(
        answered_by(eve_start.metadata()),
        None,
        "refused where it arrived"
    );
    let forged = via_b
        .get_status(as_caller("forged-token", status_request(APP)))
        .await
        .expect_err("no such token");
    assert_code(&forged, Code::Unauthenticated, &[]);
    assert_eq!(answered_by(forged.metadata()), None, "never forwarded");

    // NOT_FOUND from the owner for an application no one runs.
    let unknown = via_b
        .get_status(as_caller("alice-token", status_request("app-nowhere")))
        .await
        .expect_err("no such application");
    assert_code(&unknown, Code::NotFound, &["app-nowhere"]);

    // A call marked as forwarded is answered where it arrives: one hop, never a loop.
    let mut marked = as_caller("alice-token", status_request(APP));
    marked.metadata_mut().insert(
        FORWARDED_BY_METADATA,
        "replica-x".parse().expect("metadata"),
    );
    let refused = via_b.get_status(marked).await.expect_err("not run here");
    assert_code(&refused, Code::NotFound, &[APP]);

    let stopped = via_b
        .stop(as_caller("alice-token", stop_request(APP)))
        .await
        .expect("Stop through replica-b");
    assert_eq!(answered_by(stopped.metadata()), Some("replica-a"));
    assert!(a.applications().ownership(&app_id()).is_none());
    let forwards = b_metrics.encode();
    assert!(
        forwards.contains("spark_pod_allocator_forwards_total{method=\"Start\",outcome=\"OK\"} 1"),
        "{forwards}"
    );
    drop(events);
    b.shutdown().await.expect("replica-b stops");
    a.shutdown().await.expect("replica-a stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_go_over_tls_only_to_a_peer_whose_certificate_the_replica_trusts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, key) = certificate(dir.path(), "replicas");
    let (other_ca, _, _) = certificate(dir.path(), "other");
    let sim = SimCluster::start(cluster())
        .await
        .expect("simulated cluster");
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let trusting = |peer_ca: &PathBuf| ReplicaTls {
        cert: cert.clone(),
        key: key.clone(),
        peer_ca: peer_ca.clone(),
    };
    let (a, _) = replica(&sim, &clock, "replica-a", Some(&trusting(&ca))).await;
    until_progress(
        "replica-a holds the shard",
        async || holder(&sim).await,
        |holder| holder.as_deref() == Some("replica-a"),
    )
    .await;
    let (b, _) = replica(&sim, &clock, "replica-b", Some(&trusting(&ca))).await;
    // `c` trusts another CA: it cannot verify replica-a, so it sends it no caller's token.
    let (c, c_metrics) = replica(&sim, &clock, "replica-c", Some(&trusting(&other_ca))).await;
    let connect = |service: &Service| {
        let address = service.address();
        let ca = ca.clone();
        async move {
            ExecutorAllocatorClient::new(tls_channel(address, &ca).await.expect("TLS connect"))
        }
    };
    let mut via_b = connect(&b).await;
    let mut via_c = connect(&c).await;

    let started = via_b
        .start(as_caller("alice-token", start_request(APP, NS)))
        .await
        .expect("Start through replica-b, over TLS to replica-a");
    assert_eq!(answered_by(started.metadata()), Some("replica-a"));
    let refused = via_c
        .get_status(as_caller("alice-token", status_request(APP)))
        .await
        .expect_err("replica-c cannot verify replica-a");
    assert_code(&refused, Code::Unavailable, &["replica-a"]);
    assert!(
        c_metrics.encode().contains(
            "spark_pod_allocator_forwards_total{method=\"GetStatus\",outcome=\"UNAVAILABLE\"} 1"
        ),
        "{}",
        c_metrics.encode()
    );
    for service in [c, b, a] {
        service.shutdown().await.expect("the replica stops");
    }
}

/// The attack of issue 37: one tenant fills the forwarding replica's connection to the owner
/// with WatchExecutors streams (more than the owner serves on one connection). Another
/// tenant's calls and streams through the same replica are still answered at once: each
/// identity's forwards have connections of their own, its unary calls apart from its
/// streams.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_streams_through_a_replica_never_delay_another_tenants_calls() {
    const STREAMS: usize = 40;
    const CALLS: usize = 200;
    let sim = SimCluster::start(cluster())
        .await
        .expect("simulated cluster");
    let clock = ManualClock::new(Timestamp(1_700_000_000_000));
    let (a, b, _) = holder_and_forwarder(&sim, &clock).await;
    let mut bob = client_of(&b).await;
    let started = bob
        .start(as_caller("bob-token", start_request("app-bob", NS_B)))
        .await
        .expect("bob's Start through replica-b");
    assert_eq!(answered_by(started.metadata()), Some("replica-a"));
    client_of(&b)
        .await
        .start(as_caller("alice-token", start_request(APP, NS)))
        .await
        .expect("alice's Start through replica-b");

    // Alice's streams, over connections of her own to replica-b (each carries at most
    // `grpc.max_concurrent_streams` = 32), all forwarded to replica-a.
    let (synced_tx, mut synced) = tokio::sync::mpsc::unbounded_channel();
    let mut held = Vec::new();
    for connection in 0..2 {
        let alice = client_of(&b).await;
        for _ in 0..STREAMS / 2 {
            let mut alice = alice.clone();
            let synced_tx = synced_tx.clone();
            held.push(tokio::spawn(async move {
                let mut events = alice
                    .watch_executors(as_caller("alice-token", watch_request(APP, 0)))
                    .await
                    .expect("alice's stream through replica-b")
                    .into_inner();
                until_event(&mut events, "the owner's first full state", |event| {
                    event.kind == proto::ExecutorEventKind::Synced as i32
                })
                .await;
                let _ = synced_tx.send(connection);
                // Held open until the test ends.
                while events.message().await.ok().flatten().is_some() {}
            }));
        }
    }
    drop(synced_tx);
    // As many as the owner serves on one connection are open at the owner.
    for _ in 0..32 {
        synced.recv().await.expect("a stream of alice's synced");
    }

    // Bob's unary calls through replica-b, each with a deadline far above an answer's: a
    // call queued behind alice's streams is never answered while they are open, so it fails
    // at its deadline. The latencies are printed, not asserted: a loaded machine moves them.
    let mut latencies = Vec::with_capacity(CALLS);
    for call in 0..CALLS {
        let began = std::time::Instant::now();
        let answer = if call % 2 == 0 {
            let mut request = as_caller("bob-token", status_request("app-bob"));
            request.set_timeout(std::time::Duration::from_secs(3));
            bob.get_status(request).await.map(|r| r.metadata().clone())
        } else {
            let mut request = as_caller("bob-token", targets_request("app-bob", 1));
            request.set_timeout(std::time::Duration::from_secs(3));
            bob.set_total_expected(request)
                .await
                .map(|r| r.metadata().clone())
        };
        let metadata = answer.unwrap_or_else(|status| {
            panic!("bob's call {call} through replica-b while alice's streams are open: {status:?}")
        });
        assert_eq!(answered_by(&metadata), Some("replica-a"));
        latencies.push(began.elapsed());
    }
    latencies.sort();
    let p99 = latencies[CALLS * 99 / 100 - 1];
    println!(
        "bob's {CALLS} forwarded calls beside alice's {STREAMS} streams: median {:?}, p99 {p99:?}, max {:?}",
        latencies[CALLS / 2],
        latencies[CALLS - 1]
    );

    // Bob's own stream through replica-b opens at once too.
    let mut bobs_events = bob
        .watch_executors(as_caller("bob-token", watch_request("app-bob", 0)))
        .await
        .expect("bob's stream through replica-b")
        .into_inner();
    until_event(&mut bobs_events, "bob's first full state", |event| {
        event.kind == proto::ExecutorEventKind::Synced as i32
    })
    .await;
    // And every one of alice's streams is open: hers spread over connections of her own.
    for _ in 32..STREAMS {
        synced.recv().await.expect("a stream of alice's synced");
    }

    for stream in held {
        stream.abort();
    }
    drop(bobs_events);
    b.shutdown().await.expect("replica-b stops");
    a.shutdown().await.expect("replica-a stops");
}

fn app_id() -> spark_pod_allocator::app::AppId {
    spark_pod_allocator::app::AppId::parse(APP).expect("application id")
}
