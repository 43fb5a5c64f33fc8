//! Objects as a real API server keeps them: system fields, generated names, Status errors with
//! real reasons, type checks, server-side apply, discovery.

use super::*;

#[tokio::test]
async fn create_fills_system_fields_and_get_round_trips_unknown_fields() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let mut pod = executor_pod("exec-1", 1);
    pod.metadata.annotations = Some([("note".to_string(), "kept".to_string())].into());
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    assert!(
        created
            .metadata
            .uid
            .as_deref()
            .is_some_and(|u| u.len() == 36)
    );
    assert!(created.metadata.creation_timestamp.is_some());
    assert!(
        created
            .metadata
            .resource_version
            .as_deref()
            .is_some_and(|rv| rv.parse::<u64>().is_ok())
    );
    let status = created.status.clone().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
    assert_eq!(created.spec.as_ref().unwrap().node_name, None);

    // A field k8s-openapi does not know survives a round trip through the raw API.
    let client = sim.try_client().expect("sim client");
    let (code, _, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "odd"}, "spec": {"containers": [{"name": "c", "image": "i"}], "futureField": {"x": 1}}})),
    )
    .await;
    assert_eq!(code, 201);
    let (_, _, odd) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods/odd",
        "application/json",
        None,
    )
    .await;
    assert_eq!(odd["spec"]["futureField"]["x"], 1);

    let fetched = pods.get("exec-1").await.unwrap();
    assert_eq!(fetched.metadata.annotations.unwrap()["note"], "kept");
    assert_eq!(fetched.metadata.uid, created.metadata.uid);
}

#[tokio::test]
async fn generate_name_gives_distinct_names() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let mut pod = executor_pod("x", 1);
    pod.metadata.name = None;
    pod.metadata.generate_name = Some("app-1-exec-".into());
    let a = pods.create(&PostParams::default(), &pod).await.unwrap();
    let b = pods.create(&PostParams::default(), &pod).await.unwrap();
    let (na, nb) = (a.metadata.name.unwrap(), b.metadata.name.unwrap());
    assert!(
        na.starts_with("app-1-exec-") && na.len() == "app-1-exec-".len() + 5,
        "{na}"
    );
    assert_ne!(na, nb);
}

#[tokio::test]
async fn errors_are_status_objects_with_real_reasons() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &executor_pod("dup", 1))
        .await
        .unwrap();

    let (code, reason, message) = api_error(
        pods.create(&PostParams::default(), &executor_pod("dup", 1))
            .await,
    );
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (409, "AlreadyExists", "pods \"dup\" already exists")
    );

    let (code, reason, message) = api_error(pods.get("nope").await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (404, "NotFound", "pods \"nope\" not found")
    );

    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "nope");
    let (code, _, message) = api_error(
        elsewhere
            .create(&PostParams::default(), &executor_pod("p", 1))
            .await,
    );
    assert_eq!(
        (code, message.as_str()),
        (404, "namespaces \"nope\" not found")
    );

    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Bad_Name"}, "spec": {"containers": []}})),
    )
    .await;
    assert_eq!(code, 422);
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Invalid");
    let fields: Vec<&str> = body["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["metadata.name", "spec.containers"]);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod \"Bad_Name\" is invalid: [")
    );

    let (code, reason, message) =
        api_error(pods.list(&ListParams::default().labels("a in (1")).await);
    assert_eq!((code, reason.as_str()), (400, "BadRequest"));
    assert!(
        message.starts_with("unable to parse requirement"),
        "{message}"
    );

    let (code, _, message) =
        api_error(pods.list(&ListParams::default().fields("spec.foo=x")).await);
    assert_eq!(
        (code, message.as_str()),
        (400, "field label not supported: spec.foo")
    );

    let (code, _, body) = raw(&client, "GET", "/api/v1/widgets", "application/json", None).await;
    assert_eq!(
        (code, body["kind"].as_str(), body["reason"].as_str()),
        (404, Some("Status"), Some("NotFound"))
    );

    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        Some(json!([1, 2])),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
}

#[tokio::test]
async fn wrongly_typed_fields_are_refused_and_nothing_is_stored() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/json",
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "typed"}, "spec": {"containers": [{"name": "c", "image": 5}]}})),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("Pod in version \"v1\" cannot be handled as a Pod"),
        "{body}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    assert!(pods.get_opt("typed").await.unwrap().is_none());

    pods.create(&PostParams::default(), &executor_pod("p", 1))
        .await
        .unwrap();
    for bad in [
        json!({"status": 5}),
        json!({"status": {"containerStatuses": [5]}}),
        json!({"status": {"phase": 1}}),
    ] {
        let (code, _, _) = raw(
            &client,
            "PATCH",
            "/api/v1/namespaces/default/pods/p/status",
            "application/merge-patch+json",
            Some(bad.clone()),
        )
        .await;
        assert_eq!(code, 400, "{bad}");
    }
    assert_eq!(
        pods.get("p")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Pending")
    );
    let (code, _, body) = raw(
        &client,
        "PATCH",
        "/api/v1/namespaces/default/pods/p",
        "text/plain",
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
}

#[tokio::test]
async fn server_side_apply_is_approximated_by_create_or_merge() {
    let sim = manual_cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let desired = |v: &str| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "data": {"k": v}});
    let created = cms
        .patch(
            "applied",
            &PatchParams::apply("allocator"),
            &Patch::Apply(desired("1")),
        )
        .await
        .unwrap();
    assert_eq!(created.data.unwrap()["k"], "1");
    let updated = cms
        .patch(
            "applied",
            &PatchParams::apply("allocator"),
            &Patch::Apply(desired("2")),
        )
        .await
        .unwrap();
    assert_eq!(updated.data.unwrap()["k"], "2");
    assert_eq!(updated.metadata.uid, created.metadata.uid);
}

#[tokio::test]
async fn discovery_answers_what_kube_rs_asks() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let core = client.list_core_api_resources("v1").await.unwrap();
    let names: Vec<&str> = core.resources.iter().map(|r| r.name.as_str()).collect();
    for want in [
        "pods",
        "pods/status",
        "pods/binding",
        "namespaces",
        "configmaps",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let groups = client.list_api_groups().await.unwrap();
    assert!(
        groups
            .groups
            .iter()
            .any(|g| g.name == "coordination.k8s.io")
    );
    let leases = client
        .list_api_group_resources("coordination.k8s.io/v1")
        .await
        .unwrap();
    assert_eq!(leases.resources[0].name, "leases");
}
