//! Services and PersistentVolumeClaims as a Spark driver uses them, and their validation.

use super::*;

/// What a Spark driver does with the kinds besides pods: an immutable executor ConfigMap
/// at start, and on stop a DELETE of services, persistentvolumeclaims and configmaps by
/// the application's label (fabric8's `withLabel(..).delete()` is one collection DELETE).
#[tokio::test]
async fn services_and_claims_support_what_a_spark_driver_does() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let service = |name: &str, app: &str| -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"spark-app-selector": app}},
            "spec": {"clusterIP": "None", "selector": {"spark-app-selector": app}, "ports": [{"name": "driver-rpc-port", "port": 7078}]}
        }))
        .unwrap()
    };
    let claim = |name: &str, app: &str| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"spark-app-selector": app}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    let created = services
        .create(&pp, &service("spark-1-driver-svc", "spark-1"))
        .await
        .unwrap();
    assert_eq!(created.metadata.uid.as_deref().map(str::len), Some(36));
    let spec = created.spec.unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let port = &spec.ports.unwrap()[0];
    assert_eq!(port.protocol.as_deref(), Some("TCP"));
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(7078))
    );
    services
        .create(&pp, &service("spark-2-driver-svc", "spark-2"))
        .await
        .unwrap();
    let defaulted: Service = serde_json::from_value(json!({
        "metadata": {"name": "plain"}, "spec": {"ports": [{"port": 80, "targetPort": 8080}]}
    }))
    .unwrap();
    let plain = services.create(&pp, &defaulted).await.unwrap();
    let ip = plain.spec.unwrap().cluster_ip.unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    let bound = claims
        .create(&pp, &claim("spark-1-exec-1-pvc-0", "spark-1"))
        .await
        .unwrap();
    // Bound at once, as by a provisioner with immediate binding.
    let uid = bound.metadata.uid.clone().unwrap();
    assert_eq!(bound.spec.unwrap().volume_name, Some(format!("pvc-{uid}")));
    let status = bound.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Bound"));
    assert_eq!(status.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert_eq!(status.capacity.unwrap()["storage"].0, "1Gi");
    claims
        .create(&pp, &claim("spark-2-exec-1-pvc-0", "spark-2"))
        .await
        .unwrap();
    let conf: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "spark-exec-1a2b-conf-map", "labels": {"spark-app-selector": "spark-1", "spark-role": "executor"}},
        "immutable": true,
        "data": {"spark.properties": "spark.app.id=spark-1\n", "log4j2.properties": "rootLogger.level = info\n"}
    }))
    .unwrap();
    configmaps.create(&pp, &conf).await.unwrap();
    assert_eq!(
        services
            .get("spark-1-driver-svc")
            .await
            .unwrap()
            .metadata
            .labels
            .unwrap()["spark-app-selector"],
        "spark-1"
    );
    assert_eq!(
        services
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        3
    );
    let mut svc_watch = services
        .watch(
            &WatchParams::default().labels("spark-app-selector=spark-1"),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    match next_within(&mut svc_watch).await {
        Some(Ok(WatchEvent::Added(s))) => {
            assert_eq!(s.metadata.name.as_deref(), Some("spark-1-driver-svc"))
        }
        other => panic!("expected ADDED, got {other:?}"),
    }
    // Spark's stop, through the HTTP calls fabric8 makes.
    for resource in ["services", "persistentvolumeclaims", "configmaps"] {
        let (code, _, body) = raw(
            &client,
            "DELETE",
            &format!("/api/v1/namespaces/default/{resource}?labelSelector=spark-app-selector%3Dspark-1"),
            "application/json",
            Some(json!({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"})),
        )
        .await;
        assert_eq!(code, 200, "{resource}: {body}");
        assert_eq!(
            body["items"].as_array().map(Vec::len),
            Some(1),
            "{resource}: {body}"
        );
    }
    match next_within(&mut svc_watch).await {
        Some(Ok(WatchEvent::Deleted(s))) => {
            assert_eq!(s.metadata.name.as_deref(), Some("spark-1-driver-svc"))
        }
        other => panic!("expected DELETED, got {other:?}"),
    }
    let left: Vec<String> = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(left, ["plain", "spark-2-driver-svc"]);
    assert_eq!(
        claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    assert!(
        configmaps
            .get_opt("spark-exec-1a2b-conf-map")
            .await
            .unwrap()
            .is_none()
    );
    let (code, _, body) = raw(
        &client,
        "DELETE",
        "/api/v1/namespaces/default/services/plain",
        "application/json",
        None,
    )
    .await;
    assert_eq!((code, body["status"].as_str()), (200, Some("Success")));
    assert_eq!(
        api_error(services.get("plain").await),
        (
            404,
            "NotFound".into(),
            "services \"plain\" not found".into()
        )
    );
}

#[tokio::test]
async fn services_and_claims_are_validated() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/services",
        "application/json",
        Some(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "1bad"}, "spec": {"ports": [{"port": 0}]}})),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (422, Some("Invalid")));
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert_eq!(fields, ["metadata.name", "spec.ports[0].port"]);
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/services",
        "application/json",
        Some(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "noports"}, "spec": {}})),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    assert_eq!(body["details"]["causes"][0]["field"], "spec.ports");
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/persistentvolumeclaims",
        "application/json",
        Some(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "c"}, "spec": {}})),
    )
    .await;
    assert_eq!(code, 422, "{body}");
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["field"].as_str())
        .collect();
    assert_eq!(fields, ["spec.accessModes", "spec.resources[storage]"]);
    // Discovery lists both with their verbs and short names.
    let core = client.list_core_api_resources("v1").await.unwrap();
    for (name, short) in [("services", "svc"), ("persistentvolumeclaims", "pvc")] {
        let r = core
            .resources
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name} missing from discovery"));
        assert!(r.namespaced);
        assert_eq!(r.short_names.as_deref(), Some(&[short.to_string()][..]));
        for verb in [
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "watch",
        ] {
            assert!(r.verbs.iter().any(|v| v == verb), "{name} lacks {verb}");
        }
    }
}
