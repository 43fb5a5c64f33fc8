//! Pods: graceful deletion of bound pods, status only through its subresource.

use super::*;

#[tokio::test]
async fn bound_pods_are_deleted_gracefully_and_unbound_at_once() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &executor_pod("unbound", 1))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &executor_pod("bound", 2))
        .await
        .unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"}, "target": {"kind": "Node", "name": "node-1"}});
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods/bound/binding",
        "application/json",
        Some(binding.clone()),
    )
    .await;
    assert_eq!((code, body["status"].as_str()), (201, Some("Success")));
    let (code, _, body) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/pods/bound/binding",
        "application/json",
        Some(binding),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (409, Some("Conflict")));
    let bound = pods.get("bound").await.unwrap();
    assert_eq!(bound.spec.unwrap().node_name.as_deref(), Some("node-1"));
    let scheduled = bound.status.unwrap().conditions.unwrap();
    assert!(
        scheduled
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True")
    );

    let gone = pods
        .delete("unbound", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .expect("the pod is returned");
    assert!(gone.metadata.deletion_timestamp.is_some());
    assert_eq!(api_error(pods.get("unbound").await).0, 404);

    let pending = pods
        .delete("bound", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(pending.metadata.deletion_timestamp.is_some());
    assert_eq!(pending.metadata.deletion_grace_period_seconds, Some(30));
    // deletionTimestamp is when the grace period ends.
    let created = pending.metadata.creation_timestamp.clone().unwrap().0;
    let deadline = pending.metadata.deletion_timestamp.clone().unwrap().0;
    assert!(
        deadline.duration_since(created).as_secs() >= 29,
        "{created} .. {deadline}"
    );
    let still = pods.get("bound").await.unwrap();
    assert!(
        still.metadata.deletion_timestamp.is_some(),
        "a bound pod waits for its kubelet"
    );

    pods.delete(
        "bound",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(api_error(pods.get("bound").await).0, 404);
}

#[tokio::test]
async fn status_changes_only_through_the_status_subresource() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.create(&PostParams::default(), &executor_pod("p", 1))
        .await
        .unwrap();

    let after = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(after.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(after.metadata.labels.unwrap()["x"], "y");

    let merged = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "podIP": "10.0.0.9"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );
    let patch: json_patch::Patch = serde_json::from_value(
        json!([{"op": "replace", "path": "/status/phase", "value": "Failed"}]),
    )
    .unwrap();
    let jsonp = pods
        .patch_status("p", &PatchParams::default(), &Patch::<Value>::Json(patch))
        .await
        .unwrap();
    let status = jsonp.status.unwrap();
    assert_eq!(
        (status.phase.as_deref(), status.pod_ip.as_deref()),
        (Some("Failed"), Some("10.0.0.9"))
    );

    // A failing JSON-patch test is 422 and changes nothing.
    let failing: json_patch::Patch = serde_json::from_value(
        json!([{"op": "test", "path": "/status/phase", "value": "Running"}]),
    )
    .unwrap();
    assert_eq!(
        api_error(
            pods.patch_status("p", &PatchParams::default(), &Patch::<Value>::Json(failing))
                .await
        )
        .0,
        422
    );

    // A stale resourceVersion in a patch is a conflict.
    let stale = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"x": "z"}}})),
        )
        .await;
    assert_eq!(api_error(stale).1, "Conflict");
}
