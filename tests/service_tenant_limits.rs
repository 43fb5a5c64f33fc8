//! Per-tenant limits over real gRPC, with the simulator over real HTTP answering the
//! reviews: applications per identity and per namespace, WatchExecutors streams per
//! identity and in all (refused RESOURCE_EXHAUSTED naming the configuration key, and not
//! refused for another identity or namespace), a registration resumed over a lowered cap,
//! and the API budget shared between namespaces (one tenant's thousand requests do not
//! delay another's first executor by more than a round).

use spark_pod_allocator::app::TenantLimits;
use spark_pod_allocator::auth::{AuthMode, AuthSettings};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::proto;
use spark_pod_allocator_sim::{SimGrant, SimSettings, SimToken};
use test_kit::grpc::{Harness, batched_start_request, quiet_cluster, start_request};
use test_kit::requests::*;
use test_kit::service::stored_registration;
use test_kit::wait::{eventually, until};
use tonic::{Code, Request};

const AUDIENCE: &str = "spark-pod-allocator";
const ALICE: &str = "system:serviceaccount:team-a:alice";
const MALLORY: &str = "system:serviceaccount:team-a:mallory";
const CAROL: &str = "system:serviceaccount:team-b:carol";

/// alice and mallory may manage pods in team-a, carol in team-b.
fn cluster() -> SimSettings {
    let mut settings = quiet_cluster();
    settings.access.tokens = [("alice", ALICE), ("mallory", MALLORY), ("carol", CAROL)]
        .into_iter()
        .map(|(name, user)| SimToken {
            token: format!("{name}-token"),
            username: user.into(),
            uid: format!("uid-{name}"),
            groups: vec!["system:serviceaccounts".into()],
            audiences: vec![AUDIENCE.into()],
        })
        .collect();
    let grant = |users: &[&str], namespace: &str| SimGrant {
        users: users.iter().map(|u| u.to_string()).collect(),
        groups: vec![],
        namespaces: vec![namespace.into()],
        verbs: vec!["create".into(), "delete".into(), "list".into()],
        resources: vec!["pods".into()],
        names: vec![],
    };
    settings.access.grants = vec![
        grant(&[ALICE, MALLORY], "team-a"),
        grant(&[CAROL], "team-b"),
    ];
    settings
}

fn auth() -> AuthSettings {
    AuthSettings {
        mode: AuthMode::Kubernetes,
        audiences: vec![AUDIENCE.into()],
        ..AuthSettings::default()
    }
}

fn with_limits(tenants: TenantLimits) -> Settings {
    let mut config = Settings::default();
    config.tenants = tenants;
    config
}

/// `message` sent with `authorization: Bearer <name>-token`.
fn as_caller<T>(name: &str, message: T) -> Request<T> {
    test_kit::requests::as_caller(&format!("{name}-token"), message)
}

/// Asserts RESOURCE_EXHAUSTED whose message starts with the limit's configuration key.
#[track_caller]
fn assert_exhausted(result: Result<impl std::fmt::Debug, tonic::Status>, key: &str) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{key}: ")),
        "expected the message to name {key}: {:?}",
        status.message()
    );
}

async fn start_as(
    h: &Harness,
    caller: &str,
    app: &str,
    namespace: &str,
) -> Result<proto::StartResponse, tonic::Status> {
    h.client
        .clone()
        .start(as_caller(caller, start_request(app, namespace)))
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn applications_are_capped_per_identity_and_per_namespace() {
    let limits = TenantLimits {
        max_applications_per_identity: 2,
        max_applications_per_namespace: 3,
        ..TenantLimits::default()
    };
    let h = Harness::start_with_auth_and_config(cluster(), auth(), with_limits(limits)).await;
    start_as(&h, "alice", "a-1", "team-a").await.expect("first");
    start_as(&h, "alice", "a-2", "team-a")
        .await
        .expect("second");
    assert_exhausted(
        start_as(&h, "alice", "a-3", "team-a").await,
        "tenants.max_applications_per_identity",
    );
    // A Start repeated for a running application is no new application.
    let again = start_as(&h, "alice", "a-2", "team-a")
        .await
        .expect("repeat");
    assert!(again.resumed);
    // Another identity in the same namespace is not refused, until the namespace is full.
    start_as(&h, "mallory", "m-1", "team-a")
        .await
        .expect("mallory has her own cap");
    assert_exhausted(
        start_as(&h, "mallory", "m-2", "team-a").await,
        "tenants.max_applications_per_namespace",
    );
    // Another namespace is not refused.
    start_as(&h, "carol", "c-1", "team-b")
        .await
        .expect("team-b has its own cap");
    // Nothing of a refused Start is left: no application, no ConfigMap written.
    let status = h
        .client
        .clone()
        .get_status(as_caller("alice", status_request("a-3")))
        .await;
    assert_eq!(status.expect_err("not started").code(), Code::NotFound);
    // A Stop gives the slot back.
    h.client
        .clone()
        .stop(as_caller("alice", stop_request("a-1")))
        .await
        .expect("stop");
    start_as(&h, "alice", "a-3", "team-a")
        .await
        .expect("room again after a Stop");
    let metrics = h.applications.tenants();
    assert_eq!(metrics.applications_in("team-a"), 3);
}

#[tokio::test]
async fn without_authentication_only_the_namespace_cap_applies() {
    let limits = TenantLimits {
        max_applications_per_identity: 1,
        max_applications_per_namespace: 2,
        ..TenantLimits::default()
    };
    let h = Harness::start_with_config(
        quiet_cluster(),
        ServeSettings::default(),
        with_limits(limits),
    )
    .await;
    let mut client = h.client.clone();
    // No identity: the identity cap of 1 does not apply.
    client
        .start(start_request("x-1", "team-a"))
        .await
        .expect("first");
    client
        .start(start_request("x-2", "team-a"))
        .await
        .expect("second");
    assert_exhausted(
        client.start(start_request("x-3", "team-a")).await,
        "tenants.max_applications_per_namespace",
    );
    client
        .start(start_request("y-1", "team-b"))
        .await
        .expect("another namespace");
}

#[tokio::test]
async fn a_registration_resumed_over_a_lowered_cap_is_counted_not_dropped() {
    let mut h = Harness::start().await;
    let mut client = h.client.clone();
    for app in ["r-1", "r-2"] {
        client
            .start(start_request(app, "team-a"))
            .await
            .expect("start");
        h.set_total(app, 1).await;
    }
    // The registrations are written by the first rounds, in the service's namespace.
    let client = h.sim.try_client().expect("client");
    let service_ns = h.settings.registrations.namespace().to_string();
    until("both registrations written", async || {
        let mut written = 0;
        for app in ["r-1", "r-2"] {
            if stored_registration(&client, &service_ns, "team-a", app)
                .await
                .is_some()
            {
                written += 1;
            }
        }
        written == 2
    })
    .await;
    h.settings.tenants.max_applications_per_namespace = 1;
    h.restart().await;
    let resumed = h.applications.resume_registered().await.expect("resume");
    assert_eq!(resumed.len(), 2, "{resumed:?}");
    // Both run again: their executor pods are not left unmanaged.
    for app in ["r-1", "r-2"] {
        h.status(app).await.expect("resumed");
    }
    assert_eq!(h.applications.tenants().applications_in("team-a"), 2);
    // But the namespace is over its cap: a new application is refused until it is under.
    let mut client = h.client.clone();
    assert_exhausted(
        client.start(start_request("r-3", "team-a")).await,
        "tenants.max_applications_per_namespace",
    );
    client.stop(stop_request("r-1")).await.expect("stop");
    assert_exhausted(
        client.start(start_request("r-3", "team-a")).await,
        "tenants.max_applications_per_namespace",
    );
    client.stop(stop_request("r-2")).await.expect("stop");
    client
        .start(start_request("r-3", "team-a"))
        .await
        .expect("under the cap again");
}

#[tokio::test]
async fn watch_streams_are_capped_per_identity() {
    let limits = TenantLimits {
        max_watch_streams_per_identity: 2,
        ..TenantLimits::default()
    };
    let h = Harness::start_with_auth_and_config(cluster(), auth(), with_limits(limits)).await;
    start_as(&h, "alice", "a-1", "team-a").await.expect("alice");
    start_as(&h, "mallory", "m-1", "team-a")
        .await
        .expect("mallory");
    let watch = |caller: &'static str, app: &'static str| {
        let mut client = h.client.clone();
        async move {
            client
                .watch_executors(as_caller(caller, watch_request(app, 0)))
                .await
                .map(tonic::Response::into_inner)
        }
    };
    let first = watch("alice", "a-1").await.expect("first stream");
    let _second = watch("alice", "a-1").await.expect("second stream");
    assert_exhausted(
        watch("alice", "a-1").await,
        "tenants.max_watch_streams_per_identity",
    );
    // Another identity is not refused.
    let _theirs = watch("mallory", "m-1").await.expect("mallory's stream");
    assert_eq!(h.applications.tenants().watch_streams(), 3);
    // A stream the client closes gives its slot back.
    drop(first);
    until("the closed stream's slot is back", async || {
        h.applications.tenants().watch_streams() == 2
    })
    .await;
    watch("alice", "a-1").await.expect("room again");
}

#[tokio::test]
async fn watch_streams_are_capped_in_all_without_authentication() {
    let limits = TenantLimits {
        max_watch_streams: 2,
        ..TenantLimits::default()
    };
    let h = Harness::start_with_config(
        quiet_cluster(),
        ServeSettings::default(),
        with_limits(limits),
    )
    .await;
    let mut client = h.client.clone();
    client
        .start(start_request("w-1", "team-a"))
        .await
        .expect("start");
    let mut open = Vec::new();
    for _ in 0..2 {
        open.push(
            client
                .watch_executors(watch_request("w-1", 0))
                .await
                .expect("stream")
                .into_inner(),
        );
    }
    assert_exhausted(
        client.watch_executors(watch_request("w-1", 0)).await,
        "tenants.max_watch_streams",
    );
    // The streams still work: the first event of the full state arrives.
    let event = open[0].message().await.expect("event").expect("one");
    assert_eq!(event.kind(), proto::ExecutorEventKind::Synced);
}

/// Tenant A starts many applications, whose registration writes, id records and creates
/// saturate a small rate limit; tenant B then starts one. B's first executor pod is created
/// within about one round of the namespaces: the pods of A's created between B's Start and
/// B's pod (ordered by the API server's resourceVersion) are a handful, not A's backlog.
#[tokio::test]
async fn one_tenants_applications_do_not_delay_anothers_first_executor() {
    let mut config = Settings::default();
    config.kubernetes.qps = 20;
    config.kubernetes.burst = 1;
    let h = Harness::start_with_config(quiet_cluster(), ServeSettings::default(), config).await;
    let mut client = h.client.clone();
    const A_APPS: usize = 20;
    for i in 0..A_APPS {
        let app = format!("a-{i}");
        client
            .start(batched_start_request(&app, "team-a", 10, 1000))
            .await
            .expect("A starts");
        client
            .set_total_expected(targets_request(&app, 10))
            .await
            .expect("A scales");
    }
    // A's requests now queue at the rate limit (20 x 12 requests: 12 s of slots).
    let client_kube = h.sim.try_client().expect("client");
    let pods_in = |namespace: &'static str| {
        let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
            kube::Api::namespaced(client_kube.clone(), namespace);
        async move { api.list(&Default::default()).await.expect("list").items }
    };
    until("A's creates under way", async || {
        pods_in("team-a").await.len() >= 5
    })
    .await;
    let before_b = h.sim.resource_version();
    client
        .start(batched_start_request("b-0", "team-b", 1, 1000))
        .await
        .expect("B starts");
    client
        .set_total_expected(targets_request("b-0", 1))
        .await
        .expect("B scales");
    let b_pod = eventually("B's first executor pod", async || {
        pods_in("team-b").await.into_iter().next()
    })
    .await;
    let version = |pod: &k8s_openapi::api::core::v1::Pod| {
        pod.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
            .expect("a numeric resourceVersion")
    };
    let b_version = version(&b_pod);
    let a_pods = pods_in("team-a").await;
    let a_between = a_pods
        .iter()
        .filter(|pod| (before_b..b_version).contains(&version(pod)))
        .count();
    // B's chain is three requests (id record, create, registration beside it); A may take
    // a slot in turn with each, one that was granted as B's Start came in, and a few more
    // while B's actor computes between its requests (6 or 7 in runs here). Round-robin by
    // application alone would give A's 20 applications ~20 slots per one of B's: ~60.
    assert!(
        a_between <= 12,
        "{a_between} of A's pods were created between B's Start and its first pod"
    );
    assert!(
        a_pods.len() < A_APPS * 10,
        "A's backlog was not served first: {} of its pods exist",
        a_pods.len()
    );
}
