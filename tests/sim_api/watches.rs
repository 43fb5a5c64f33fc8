//! Watches: order from a list's version, selectors, 410 after compaction, bookmarks, streaming
//! lists, bounded history.

use super::*;

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
