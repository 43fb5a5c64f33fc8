//! Label and field selectors on lists and on delete-collection.

use super::*;

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
