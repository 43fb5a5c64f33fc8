//! ResourceQuota as the API server's quota admission and the resourcequota controller keep
//! it: a pod past a quota is refused 403 with the real message, and `status.used` follows
//! the namespace's pods.

use super::*;
use k8s_openapi::api::core::v1::ResourceQuota;

fn pod(name: &str, cpu: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "spark:4",
            "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pod_past_a_quota_is_refused_and_status_used_follows_the_pods() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "compute"},
        "spec": {"hard": {"pods": "2", "requests.cpu": "3", "requests.memory": "8Gi"}}
    }))
    .unwrap();
    let pp = PostParams::default();
    let created = quotas.create(&pp, &quota).await.expect("quota");
    let status = created.status.expect("status");
    assert_eq!(status.hard.unwrap()["pods"].0, "2");
    assert_eq!(status.used.unwrap()["pods"].0, "0");

    pods.create(&pp, &pod("p-1", "1")).await.expect("p-1");
    pods.create(&pp, &pod("p-2", "1")).await.expect("p-2");
    let (code, reason, message) = api_error(pods.create(&pp, &pod("p-3", "500m")).await);
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "pods \"p-3\" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=2, limited: pods=2"
    );
    let used = quotas
        .get("compute")
        .await
        .unwrap()
        .status
        .unwrap()
        .used
        .unwrap();
    assert_eq!(
        (used["pods"].0.as_str(), used["requests.cpu"].0.as_str()),
        ("2", "2")
    );

    // A deleted pod frees its share at once (the controller's work, done in the same step).
    pods.delete("p-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete");
    let (code, _, message) = api_error(pods.create(&pp, &pod("p-4", "2500m")).await);
    assert_eq!(code, 403);
    assert!(
        message.ends_with(
            "requested: requests.cpu=2500m, used: requests.cpu=1, limited: requests.cpu=3"
        ),
        "{message}"
    );
    pods.create(&pp, &pod("p-5", "2")).await.expect("p-5 fits");
    let used = quotas
        .get("compute")
        .await
        .unwrap()
        .status
        .unwrap()
        .used
        .unwrap();
    assert_eq!(used["requests.memory"].0, (2u64 << 30).to_string());
}
