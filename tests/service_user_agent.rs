//! Every request the service sends to Kubernetes names it: User-Agent
//! `spark-pod-allocator/<version>`, so that an audit log tells its requests from other
//! clients'. Over real gRPC against the simulated cluster, which counts the requests it
//! serves by User-Agent (reviews and discovery included).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use spark_pod_allocator::auth::{AuthMode, AuthSettings};
use spark_pod_allocator::k8s::USER_AGENT;
use spark_pod_allocator_sim::{SimGrant, SimToken};
use test_kit::grpc::{Harness, quiet_cluster, start_request};
use test_kit::requests::targets_request;
use test_kit::wait::until;
use tonic::Request;

const NS: &str = "team-a";
const AUDIENCE: &str = "spark-pod-allocator";

/// `message` sent as alice, who may create, delete, list, get and patch pods in team-a.
fn as_alice<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        "Bearer alice-token".parse().expect("metadata value"),
    );
    request
}

#[tokio::test]
async fn every_kubernetes_request_of_the_service_names_it_and_its_version() {
    assert_eq!(
        USER_AGENT,
        format!("spark-pod-allocator/{}", env!("CARGO_PKG_VERSION"))
    );
    let mut settings = quiet_cluster();
    settings.access.tokens = vec![SimToken {
        token: "alice-token".into(),
        username: "alice".into(),
        uid: "uid-alice".into(),
        groups: vec![],
        audiences: vec![AUDIENCE.into()],
    }];
    settings.access.grants = vec![SimGrant {
        users: vec!["alice".into()],
        groups: vec![],
        namespaces: vec![NS.into()],
        verbs: vec!["*".into()],
        resources: vec!["pods".into()],
        names: Vec::new(),
    }];
    let auth = AuthSettings {
        mode: AuthMode::Kubernetes,
        audiences: vec![AUDIENCE.into()],
        ..AuthSettings::default()
    };
    let mut h = Harness::start_with_auth(settings, auth).await;
    // The test's own requests (its client names no User-Agent): the driver pod, and
    // reading the executor pods.
    let pods: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let driver: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "driver-ua"},
        "spec": {"containers": [{"name": "driver", "image": "spark:4"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &driver)
        .await
        .expect("driver pod");

    // The service's work: reviews, the namespace check, the driver pod's GET and label,
    // the watches and LISTs, the id record, creates, a delete.
    let mut request = start_request("app-ua", NS);
    request.driver_pod_name = "driver-ua".into();
    h.client.start(as_alice(request)).await.expect("Start");
    h.client
        .set_total_expected(as_alice(targets_request("app-ua", 2)))
        .await
        .expect("SetTotalExpected");
    until("2 executor pods", async || {
        h.pods(NS, "app-ua").await.len() == 2
    })
    .await;
    pods.delete("driver-ua", &DeleteParams::default())
        .await
        .expect("driver deleted");
    until("its executors deleted", async || {
        h.pods(NS, "app-ua").await.is_empty()
    })
    .await;

    let requests = h.sim.requests();
    let by = |agent: &str| -> BTreeSet<(String, String)> {
        requests
            .keys()
            .filter(|(a, _, _)| a == agent)
            .map(|(_, verb, resource)| (verb.clone(), resource.clone()))
            .collect()
    };
    let service = by(USER_AGENT);
    for expected in [
        ("create", "tokenreviews"),
        ("create", "subjectaccessreviews"),
        ("get", "namespaces"),
        ("get", "pods"),
        ("patch", "pods"),
        ("watch", "pods"),
        ("list", "pods"),
        ("create", "pods"),
        ("deletecollection", "pods"),
    ] {
        assert!(
            service.contains(&(expected.0.to_string(), expected.1.to_string())),
            "{expected:?} sent with User-Agent {USER_AGENT}: {requests:?}"
        );
    }
    // Nothing else reached the API server but the test's own requests.
    let others: BTreeSet<(String, String)> = requests
        .keys()
        .filter(|(agent, _, _)| agent != USER_AGENT)
        .map(|(agent, verb, resource)| {
            assert_eq!(agent, "", "{requests:?}");
            (verb.clone(), resource.clone())
        })
        .collect();
    let own: BTreeSet<(String, String)> =
        [("create", "pods"), ("list", "pods"), ("delete", "pods")]
            .into_iter()
            .map(|(v, r)| (v.to_string(), r.to_string()))
            .collect();
    assert_eq!(others, own, "{requests:?}");
    h.stop_server().await;
}
