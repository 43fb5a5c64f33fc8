//! Every RPC's bad inputs, over real gRPC against the real service and a simulated cluster:
//! the right code, the field named, and nothing created or changed.

use std::collections::HashMap;

use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, TEMPLATE, assert_invalid, start_request};
use test_kit::requests::*;
use tonic::Code;

#[tokio::test]
async fn start_names_each_invalid_field_and_creates_nothing() {
    let mut h = Harness::start().await;
    type Mutation = fn(&mut proto::StartRequest);
    let cases: Vec<(&str, Mutation)> = vec![
        ("application_id", |r| r.application_id = String::new()),
        ("application_id", |r| {
            r.application_id = "-starts-with-dash".into()
        }),
        ("application_id", |r| r.application_id = "has space".into()),
        ("application_id", |r| r.application_id = "a".repeat(64)),
        ("namespace", |r| r.namespace = String::new()),
        ("namespace", |r| r.namespace = "Team_A".into()),
        ("driver_pod_name", |r| r.driver_pod_name = "Driver!".into()),
        ("executor_pod_template", |r| {
            r.executor_pod_template = String::new()
        }),
        ("executor_pod_template", |r| {
            r.executor_pod_template = "apiVersion: apps/v1\nkind: Deployment\n".into()
        }),
        ("executor_pod_template", |r| {
            r.executor_pod_template = "spec: [unclosed\n".into()
        }),
        ("executor_pod_template", |r| {
            r.executor_pod_template = "just words".into()
        }),
        ("executor_pod_template", |r| {
            r.executor_pod_template =
                "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n    spark-exec-id: \"9\"\n".into()
        }),
        // A pod the API server would refuse (422) on every create: refused at Start.
        ("executor_pod_template", |r| {
            r.executor_pod_template = "apiVersion: v1\nkind: Pod\nspec: {}\n".into()
        }),
        ("executor_pod_template", |r| {
            r.executor_pod_template =
                "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: main\n".into()
        }),
        ("resource_profile_templates[3]", |r| {
            r.resource_profile_templates = HashMap::from([(
                3,
                "apiVersion: v1\nkind: Pod\nspec:\n  initContainers:\n  - name: init\n  \
                 containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n"
                    .into(),
            )])
        }),
        ("resource_profile_templates[-1]", |r| {
            r.resource_profile_templates = HashMap::from([(-1, TEMPLATE.into())])
        }),
        ("resource_profile_templates[0]", |r| {
            r.resource_profile_templates = HashMap::from([(0, TEMPLATE.into())])
        }),
        ("resource_profile_templates[2]", |r| {
            r.resource_profile_templates = HashMap::from([(2, "kind: Service\n".into())])
        }),
        ("pod_name_prefix", |r| r.pod_name_prefix = "---".into()),
        ("settings.batch_delay_ms", |r| {
            r.settings = Some(proto::AllocationSettings {
                batch_delay_ms: Some(50),
                ..Default::default()
            })
        }),
        ("settings.batch_size", |r| {
            r.settings = Some(proto::AllocationSettings {
                batch_size: Some(0),
                ..Default::default()
            })
        }),
        ("settings.executor_timeout_ms", |r| {
            r.settings = Some(proto::AllocationSettings {
                batch_delay_ms: Some(1000),
                executor_timeout_ms: Some(4999),
                ..Default::default()
            })
        }),
        ("settings.max_pending_pods", |r| {
            r.settings = Some(proto::AllocationSettings {
                max_pending_pods: Some(0),
                ..Default::default()
            })
        }),
        ("settings.max_executors", |r| {
            r.settings = Some(proto::AllocationSettings {
                max_executors: Some(0),
                ..Default::default()
            })
        }),
    ];
    for (field, mutate) in cases {
        let mut req = start_request("spark-bad", "team-a");
        mutate(&mut req);
        let status = h.client.start(req).await.expect_err(field);
        assert_invalid(&status, field);
    }
    // The broken YAML names the line the parser stopped at.
    let mut req = start_request("spark-bad", "team-a");
    req.executor_pod_template = "apiVersion: v1\nkind: Pod\nspec:\n  containers: 7\n".into();
    let status = h.client.start(req).await.expect_err("containers: 7");
    assert_invalid(&status, "executor_pod_template");
    assert!(status.message().contains("line 4"), "{}", status.message());
    // The image-less container is named; an added executor container is explained.
    let mut req = start_request("spark-bad", "team-a");
    req.executor_pod_template =
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: a\n    image: x\n  - name: b\n    image: y\n"
            .into();
    let status = h.client.start(req).await.expect_err("executor added");
    assert_invalid(&status, "executor_pod_template");
    assert!(
        status.message().contains("no executor container") && status.message().contains("image"),
        "{}",
        status.message()
    );
    let mut req = start_request("spark-bad", "team-a");
    req.resource_profile_templates = HashMap::from([(
        3,
        "apiVersion: v1\nkind: Pod\nspec:\n  initContainers:\n  - name: init\n  containers:\n  - name: main\n    image: spark:4\n"
            .into(),
    )]);
    let status = h.client.start(req).await.expect_err("init without image");
    assert!(
        status.message().contains("container `init` has no image"),
        "{}",
        status.message()
    );

    // Nothing of the refused application exists.
    let status = h
        .client
        .get_status(status_request("spark-bad"))
        .await
        .expect_err("never started");
    assert_eq!(status.code(), Code::NotFound);
    assert!(h.pods("team-a", "spark-bad").await.is_empty());
    h.stop_server().await;
}

#[tokio::test]
async fn every_rpc_refuses_an_invalid_application_id() {
    let mut h = Harness::start().await;
    for bad in ["", "no/slash", "-x"] {
        let c = &mut h.client;
        let statuses = [
            c.set_total_expected(proto::SetTotalExpectedRequest {
                application_id: bad.into(),
                ..Default::default()
            })
            .await
            .expect_err("SetTotalExpected"),
            c.is_deleted(is_deleted_request(bad, "1"))
                .await
                .expect_err("IsDeleted"),
            c.update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
                application_id: bad.into(),
                executor_ids: vec![],
                running_tasks: Default::default(),
            })
            .await
            .expect_err("UpdateRegisteredExecutors"),
            c.stop(stop_request(bad)).await.expect_err("Stop"),
            c.get_status(status_request(bad))
                .await
                .expect_err("GetStatus"),
        ];
        for status in &statuses {
            assert_invalid(status, "application_id");
        }
    }
    h.stop_server().await;
}

#[tokio::test]
async fn every_rpc_on_an_unknown_application_is_not_found() {
    let mut h = Harness::start().await;
    let app = "spark-unknown".to_string();
    let c = &mut h.client;
    let statuses = [
        c.set_total_expected(targets_request(app.clone(), 3))
            .await
            .expect_err("SetTotalExpected"),
        c.is_deleted(is_deleted_request(app.clone(), "1"))
            .await
            .expect_err("IsDeleted"),
        c.update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
            application_id: app.clone(),
            executor_ids: vec!["1".into()],
            running_tasks: Default::default(),
        })
        .await
        .expect_err("UpdateRegisteredExecutors"),
        c.stop(stop_request(app.clone())).await.expect_err("Stop"),
        c.get_status(status_request(app.clone()))
            .await
            .expect_err("GetStatus"),
    ];
    for status in &statuses {
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
        assert!(status.message().contains(&app), "{status:?}");
    }
    assert!(h.pods("team-a", &app).await.is_empty());
    h.stop_server().await;
}

#[tokio::test]
async fn executor_ids_and_profiles_are_checked_on_a_running_application() {
    let mut h = Harness::start().await;
    let app = "spark-ids";
    h.client
        .start(start_request(app, "team-a"))
        .await
        .expect("start");

    for bad in ["", "abc", "-3", "0", "1.5", " 7"] {
        let status = h
            .client
            .is_deleted(is_deleted_request(app, bad))
            .await
            .expect_err(bad);
        assert_invalid(&status, "executor_id");
    }
    let status = h
        .client
        .update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
            application_id: app.into(),
            executor_ids: vec!["1".into(), "x2".into()],
            running_tasks: Default::default(),
        })
        .await
        .expect_err("x2");
    assert_invalid(&status, "executor_ids[1]");

    let status = h
        .client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: app.into(),
            executors_per_profile: HashMap::from([(-1, 2)]),
            ..Default::default()
        })
        .await
        .expect_err("negative profile");
    assert_invalid(&status, "executors_per_profile[-1]");

    let status = h
        .client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: app.into(),
            executors_per_profile: HashMap::from([(0, 2), (5, 1)]),
            ..Default::default()
        })
        .await
        .expect_err("profile without template");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains('5'), "{status:?}");

    // None of the refused calls set a target: no executor was requested.
    let report = h
        .client
        .get_status(status_request(app))
        .await
        .expect("status")
        .into_inner();
    assert_eq!(report.last_executor_id, 0);
    assert!(report.profiles.iter().all(|p| p.target == 0), "{report:?}");
    assert!(h.pods("team-a", app).await.is_empty());
    h.stop_server().await;
}

#[tokio::test]
async fn a_missing_driver_pod_is_a_failed_precondition_with_spark_s_message() {
    let mut h = Harness::start().await;
    let mut req = start_request("spark-driverless", "team-a");
    req.driver_pod_name = "driver-0".into();
    let status = h.client.start(req).await.expect_err("no driver pod");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status.message(),
        "No pod was found named driver-0 in the cluster in the namespace team-a"
    );
    let status = h
        .client
        .get_status(status_request("spark-driverless"))
        .await
        .expect_err("not started");
    assert_eq!(status.code(), Code::NotFound);
    h.stop_server().await;
}

#[tokio::test]
async fn start_is_idempotent_per_namespace_and_exclusive_across_namespaces() {
    let mut h = Harness::start().await;
    let first = h
        .client
        .start(start_request("spark-twice", "team-a"))
        .await
        .expect("first")
        .into_inner();
    assert!(!first.resumed);
    let again = h
        .client
        .start(start_request("spark-twice", "team-a"))
        .await
        .expect("again")
        .into_inner();
    assert!(again.resumed, "{again:?}");
    assert_eq!(again.last_executor_id, first.last_executor_id);
    // A repeated Start is still checked: a template that cannot make a pod is refused.
    let mut bad = start_request("spark-twice", "team-a");
    bad.executor_pod_template = "apiVersion: v1\nkind: Pod\nspec: {}\n".into();
    let status = h.client.start(bad).await.expect_err("bad template");
    assert_invalid(&status, "executor_pod_template");

    let status = h
        .client
        .start(start_request("spark-twice", "team-b"))
        .await
        .expect_err("other namespace");
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(status.message().contains("team-a"), "{status:?}");
    h.stop_server().await;
}

#[tokio::test]
async fn a_namespace_missing_from_the_cluster_is_a_failed_precondition() {
    let mut h = Harness::start().await;
    // Listing pods there would answer an empty list; only every create would fail (404).
    let status = h
        .client
        .start(start_request("spark-nowhere", "no-such-namespace"))
        .await
        .expect_err("missing namespace");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status.message(),
        "namespace no-such-namespace does not exist in the cluster"
    );
    let status = h
        .client
        .get_status(status_request("spark-nowhere"))
        .await
        .expect_err("not started");
    assert_eq!(status.code(), Code::NotFound);
    h.stop_server().await;
}
