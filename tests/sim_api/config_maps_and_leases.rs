//! ConfigMaps (immutable ones included), Leases and Secrets, with the verbs the service uses.

use super::*;

#[tokio::test]
async fn an_immutable_configmap_keeps_its_data() {
    let sim = manual_cluster().await;
    let cms: Api<ConfigMap> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "frozen"}, "data": {"k": "v"}, "immutable": true}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let change_data = cms
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await;
    let (code, reason, message) = api_error(change_data);
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.contains("data: Forbidden: field is immutable"),
        "{message}"
    );
    let unfreeze = cms
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"immutable": false})),
        )
        .await;
    assert_eq!(api_error(unfreeze).0, 422);
    // Metadata may still change, and the object can be deleted.
    cms.patch(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    assert_eq!(cms.get("frozen").await.unwrap().data.unwrap()["k"], "v");
    cms.delete("frozen", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn configmaps_and_leases_support_the_verbs_the_service_uses() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "state"}, "data": {"k": "v"}})).unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut current = cms.get("state").await.unwrap();
    current
        .data
        .as_mut()
        .unwrap()
        .insert("k".into(), "w".into());
    let replaced = cms
        .replace("state", &PostParams::default(), &current)
        .await
        .unwrap();
    assert_eq!(replaced.data.unwrap()["k"], "w");
    // Replacing with the old version is a 409 Conflict.
    let (code, reason, _) = api_error(cms.replace("state", &PostParams::default(), &current).await);
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    let deleted = cms.delete("state", &DeleteParams::default()).await.unwrap();
    assert!(
        deleted.is_right(),
        "configmap delete answers a Success status"
    );
    assert_eq!(api_error(cms.get("state").await).0, 404);

    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}})).unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut mine = created.clone();
    mine.spec.as_mut().unwrap().holder_identity = Some("b".into());
    leases
        .replace("leader", &PostParams::default(), &mine)
        .await
        .unwrap();
    let mut theirs = created;
    theirs.spec.as_mut().unwrap().holder_identity = Some("c".into());
    assert_eq!(
        api_error(
            leases
                .replace("leader", &PostParams::default(), &theirs)
                .await
        )
        .1,
        "Conflict"
    );
    let patched = leases
        .patch(
            "leader",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": "d"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec.unwrap().holder_identity.as_deref(), Some("d"));
    let mut lw = leases
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    match next_within(&mut lw).await.transpose().unwrap() {
        Some(WatchEvent::Added(l)) => assert_eq!(l.metadata.name.as_deref(), Some("leader")),
        other => panic!("expected the lease as ADDED, got {other:?}"),
    }

    let nss: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "team-a"}})).unwrap();
    nss.create(&PostParams::default(), &ns).await.unwrap();
    let in_team: Api<Pod> = Api::namespaced(client, "team-a");
    in_team
        .create(&PostParams::default(), &executor_pod("p", 1))
        .await
        .unwrap();
    nss.delete("team-a", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_error(in_team.get("p").await).0, 404);
}

#[tokio::test]
async fn secrets_are_stored_with_base64_data_and_string_data_folded_in() {
    use k8s_openapi::api::core::v1::Secret;
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "key"},
        "data": {"key": "AAEC"},
        "stringData": {"text": "hi"}
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let stored = secrets.get("key").await.unwrap();
    assert_eq!(stored.type_.as_deref(), Some("Opaque"));
    assert!(stored.string_data.is_none());
    let data = stored.data.unwrap();
    assert_eq!(data["key"].0, vec![0, 1, 2]);
    assert_eq!(data["text"].0, b"hi".to_vec());
    // Data that is not base64 is refused, as the real decoder refuses it.
    let (code, _, _) = raw(
        &client,
        "POST",
        "/api/v1/namespaces/default/secrets",
        "application/json",
        Some(json!({"metadata": {"name": "bad"}, "data": {"k": "%%%"}})),
    )
    .await;
    assert_eq!(code, 400);
    let again = secrets.create(&PostParams::default(), &secret).await;
    assert_eq!(api_error(again).0, 409);
    secrets
        .delete("key", &DeleteParams::default())
        .await
        .unwrap();
    assert!(secrets.get_opt("key").await.unwrap().is_none());
}
