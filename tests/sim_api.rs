//! kube-rs against the simulated API server: the verbs, selectors, watches, deletion rules,
//! subresources, configmaps and leases, as a real kube-apiserver answers them.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};
use test_kit::sim::*;

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
async fn label_and_field_selectors_filter_lists() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for id in 1..=4 {
        pods.create(
            &PostParams::default(),
            &executor_pod(&format!("exec-{id}"), id),
        )
        .await
        .unwrap();
    }
    let names = |list: kube::core::ObjectList<Pod>| {
        list.items
            .into_iter()
            .map(|p| p.metadata.name.unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("spark-exec-id in (1,3)"))
                .await
                .unwrap()
        ),
        ["exec-1", "exec-3"]
    );
    assert_eq!(
        names(
            pods.list(
                &ListParams::default().labels("spark-exec-id notin (1,3),spark-role=executor")
            )
            .await
            .unwrap()
        ),
        ["exec-2", "exec-4"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().labels("!spark-role"))
                .await
                .unwrap()
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("metadata.name=exec-2"))
                .await
                .unwrap()
        ),
        ["exec-2"]
    );

    raw(&client, "POST", "/api/v1/namespaces/default/pods/exec-4/binding", "application/json", Some(json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "exec-4"}, "target": {"kind": "Node", "name": "node-1"}}))).await;
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("spec.nodeName=node-1"))
                .await
                .unwrap()
        ),
        ["exec-4"]
    );
    assert_eq!(
        names(
            pods.list(&ListParams::default().fields("status.phase=Pending,spec.nodeName!=node-1"))
                .await
                .unwrap()
        ),
        ["exec-1", "exec-2", "exec-3"]
    );

    // Pagination: limit + continue return everything once, in order.
    let first = pods.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.items.len(), 3);
    let token = first.metadata.continue_.clone().expect("a continue token");
    let rest = pods
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(rest), ["exec-4"]);

    // All-namespaces list.
    let all: Api<Pod> = Api::all(client);
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        4
    );
}

#[tokio::test]
async fn watch_from_list_version_sees_changes_in_order() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.create(&PostParams::default(), &executor_pod("before", 1))
        .await
        .unwrap();
    let list = pods.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut stream = pods
        .watch(&WatchParams::default().labels("spark-role=executor"), &rv)
        .await
        .unwrap()
        .boxed();

    pods.create(&PostParams::default(), &executor_pod("exec-1", 2))
        .await
        .unwrap();
    pods.patch_status(
        "exec-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    pods.delete("exec-1", &DeleteParams::default())
        .await
        .unwrap();

    let mut seen = Vec::new();
    while seen.len() < 4 {
        let ev = next_within(&mut stream)
            .await
            .expect("watch stays open")
            .unwrap();
        seen.push(match ev {
            WatchEvent::Added(p) => (
                "ADDED",
                p.metadata.name.unwrap(),
                p.status.unwrap().phase.unwrap(),
            ),
            WatchEvent::Modified(p) => (
                "MODIFIED",
                p.metadata.name.unwrap(),
                p.status.unwrap().phase.unwrap(),
            ),
            WatchEvent::Deleted(p) => (
                "DELETED",
                p.metadata.name.unwrap(),
                p.status.unwrap().phase.unwrap(),
            ),
            other => panic!("unexpected {other:?}"),
        });
    }
    let seen: Vec<(&str, &str, &str)> = seen
        .iter()
        .map(|(t, n, p)| (*t, n.as_str(), p.as_str()))
        .collect();
    // An unbound pod is deleted at once: MODIFIED (deletionTimestamp set), then DELETED.
    assert_eq!(
        seen,
        [
            ("ADDED", "exec-1", "Pending"),
            ("MODIFIED", "exec-1", "Running"),
            ("MODIFIED", "exec-1", "Running"),
            ("DELETED", "exec-1", "Running")
        ]
    );
}

#[tokio::test]
async fn selector_watch_sees_objects_leave_and_enter() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &executor_pod("p", 1))
        .await
        .unwrap();
    let rv = sim.resource_version().to_string();
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"spark-role": "driver"}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "p",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"spark-role": "executor"}}})),
    )
    .await
    .unwrap();
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    let path = format!(
        "/api/v1/namespaces/default/pods?watch=true&labelSelector=spark-role%3Dexecutor&resourceVersion={rv}&timeoutSeconds=1"
    );
    let (code, events) = raw_watch_events(&client, &path).await;
    assert_eq!(code, 200);
    let types: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap(),
                e["object"]["metadata"]["labels"]["spark-role"]
                    .as_str()
                    .unwrap(),
            )
        })
        .collect();
    // Leaving the selector is DELETED with the object as it was before the change.
    assert_eq!(
        types,
        [
            ("DELETED", "executor"),
            ("ADDED", "executor"),
            ("MODIFIED", "executor"),
            ("DELETED", "executor")
        ]
    );
}

#[tokio::test]
async fn watch_from_compacted_version_gets_410_error_event_and_bookmarks_work() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &executor_pod("a", 1))
        .await
        .unwrap();
    let old = sim.resource_version();
    pods.create(&PostParams::default(), &executor_pod("b", 2))
        .await
        .unwrap();
    sim.compact_history();

    let (code, events) = raw_watch_events(
        &client,
        &format!(
            "/api/v1/namespaces/default/pods?watch=1&resourceVersion={}",
            old - 1
        ),
    )
    .await;
    assert_eq!(code, 200, "a too-old watch still answers 200");
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
    assert!(
        events[0]["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );

    // A list at an exact compacted version is an HTTP 410.
    let (code, _, body) = raw(
        &client,
        "GET",
        &format!(
            "/api/v1/namespaces/default/pods?resourceVersion={}&resourceVersionMatch=Exact",
            old - 1
        ),
        "",
        None,
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (410, Some("Expired")));

    // From the current version: nothing to replay; the timeout ends it with a bookmark.
    let now = sim.resource_version();
    let (_, events) = raw_watch_events(&client, &format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={now}&allowWatchBookmarks=true&timeoutSeconds=1")).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "BOOKMARK");
    assert_eq!(
        events[0]["object"]["metadata"]["resourceVersion"],
        now.to_string()
    );

    // Without a version, a watch starts with the current objects as ADDED.
    let (_, events) = raw_watch_events(
        &client,
        "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1",
    )
    .await;
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
}

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
async fn delete_collection_honours_label_and_field_selectors() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for id in 1..=4 {
        pods.create(
            &PostParams::default(),
            &executor_pod(&format!("exec-{id}"), id),
        )
        .await
        .unwrap();
    }
    pods.patch_status(
        "exec-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    let deleted = pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default()
                .labels("spark-exec-id in (1,2,3)")
                .fields("status.phase=Pending"),
        )
        .await
        .unwrap()
        .left()
        .expect("a pod list");
    let mut names: Vec<String> = deleted
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["exec-1", "exec-3"]);
    let left: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(left, ["exec-2", "exec-4"]);
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
async fn streaming_list_watchers_get_initial_events_then_changes() {
    use kube::runtime::watcher::{self, Event};
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.create(&PostParams::default(), &executor_pod("exec-1", 1))
        .await
        .unwrap();
    let mut stream =
        watcher::watcher(pods.clone(), watcher::Config::default().streaming_lists()).boxed();
    let mut initial = Vec::new();
    loop {
        match next_within(&mut stream)
            .await
            .expect("stream goes on")
            .unwrap()
        {
            Event::Init => {}
            Event::InitApply(p) => initial.push(p.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(initial, ["exec-1"]);
    pods.create(&PostParams::default(), &executor_pod("exec-2", 2))
        .await
        .unwrap();
    match next_within(&mut stream)
        .await
        .expect("stream goes on")
        .unwrap()
    {
        Event::Apply(p) => assert_eq!(p.metadata.name.as_deref(), Some("exec-2")),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test]
async fn bounded_history_expires_old_versions_and_continue_tokens() {
    let mut settings = spark_pod_allocator_sim::SimSettings::default();
    settings.kubelet.mode = spark_pod_allocator_sim::KubeletMode::Manual;
    settings.history = 3;
    let sim = spark_pod_allocator_sim::SimCluster::start(settings)
        .await
        .unwrap();
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let start = sim.resource_version();
    pods.create(&PostParams::default(), &executor_pod("exec-1", 1))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &executor_pod("exec-2", 2))
        .await
        .unwrap();
    let page = pods.list(&ListParams::default().limit(1)).await.unwrap();
    let token = page.metadata.continue_.clone().unwrap();
    // Within the history: replayed.
    let (_, events) = raw_watch_events(
        &client,
        format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={start}&timeoutSeconds=1"),
    )
    .await;
    assert_eq!(events.len(), 2);
    for id in 3..=6 {
        pods.create(
            &PostParams::default(),
            &executor_pod(&format!("exec-{id}"), id),
        )
        .await
        .unwrap();
    }
    // Four more changes pushed the first ones out of a 3-event history.
    let (_, events) = raw_watch_events(
        &client,
        format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={start}"),
    )
    .await;
    assert_eq!(
        (
            events.len(),
            events[0]["type"].as_str(),
            events[0]["object"]["code"].as_u64()
        ),
        (1, Some("ERROR"), Some(410))
    );
    let (code, reason, _) = api_error(
        pods.list(&ListParams::default().limit(1).continue_token(&token))
            .await,
    );
    assert_eq!((code, reason.as_str()), (410, "Expired"));
}

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
    assert_eq!(bound.status.unwrap().phase.as_deref(), Some("Pending"));
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
