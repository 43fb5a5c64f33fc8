//! Authentication and authorization over real gRPC, with the simulator answering
//! TokenReview and SubjectAccessReview over real HTTP: no token, a bad token, a token for
//! another audience, a caller lacking pod rights (or claim rights, for claim templates and
//! ephemeral volumes), the hijack of another identity's application, the admin group, an
//! owner kept across a restart, a slow review, and the health check answering while
//! callers are refused.

mod driver_pods;
mod floods;
mod owners;
mod tokens;

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

fn app_id(app: &str) -> spark_pod_allocator::app::AppId {
    spark_pod_allocator::app::AppId::parse(app).expect("app id")
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
