//! What a Spark driver's plugin relies on, over real gRPC against the simulated cluster:
//! Spark's own executor pod as a template (its labels overwritten, `{{APP_ID}}` and
//! `{{EXECUTOR_ID}}` substituted per executor), templates of resource profiles registered by
//! SetTotalExpected, a repeated Start that must repeat the first, the executor container
//! and check-all-containers settings per application, and gang schedulers' pods (their
//! scheduler allowed by the pod policy, their gang asked for at once).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use spark_pod_allocator::allocator::{ExecutorId, ExecutorState};
use spark_pod_allocator::app::AppId;
use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, TEMPLATE, assert_invalid, start_request};
use test_kit::requests::*;
use test_kit::wait::eventually;

const NS: &str = "team-a";

/// The executor pod Spark's builder makes for the literal executor id `{{EXECUTOR_ID}}`
/// (what the plugin sends), with the parts that matter here.
fn spark_template(app: &str) -> String {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "pi-7f3a-exec-{{EXECUTOR_ID}}",
            "labels": {
                "spark-app-selector": app,
                "spark-role": "executor",
                "spark-exec-id": "{{EXECUTOR_ID}}",
                "spark-exec-resourceprofile-id": "0",
                "spark-app-name": "pi",
                "exec-shard": "{{APP_ID}}-{{EXECUTOR_ID}}",
            },
            "annotations": { "logs": "/logs/{{APP_ID}}/{{EXECUTOR_ID}}" },
        },
        "spec": {
            "hostname": "pi-7f3a-exec-{{EXECUTOR_ID}}",
            "initContainers": [{
                "name": "prepare", "image": "busybox",
                "args": ["mkdir", "-p", "/data/{{EXECUTOR_ID}}"],
            }],
            "containers": [{
                "name": "spark-kubernetes-executor",
                "image": "spark:4",
                "args": ["executor"],
                "env": [
                    { "name": "SPARK_EXECUTOR_ID", "value": "{{EXECUTOR_ID}}" },
                    { "name": "SPARK_APPLICATION_ID", "value": app },
                    { "name": "SPARK_JAVA_OPT_0", "value": "-Dspark.driver.port=7078" },
                    { "name": "SPARK_JAVA_OPT_1", "value": "-Dgc.log=/tmp/{{APP_ID}}-{{EXECUTOR_ID}}.log" },
                    { "name": "SPARK_EXECUTOR_DIRS", "value": "/data/{{EXECUTOR_ID}}" },
                    { "name": "SPARK_EXECUTOR_POD_NAME",
                      "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.name" } } },
                ],
            }],
            "volumes": [{
                "name": "spark-local-dir-1",
                "persistentVolumeClaim": { "claimName": "pi-exec-{{EXECUTOR_ID}}-pvc-0" },
            }],
        },
    })
    .to_string()
}

/// A template of profile 1 (another image, so it differs from profile 0's), as YAML.
const GPU_TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark-gpu:4\n";

/// The same Pod as [`GPU_TEMPLATE`], written as JSON.
const GPU_TEMPLATE_JSON: &str = r#"{"kind":"Pod","apiVersion":"v1","spec":{"containers":[{"image":"spark-gpu:4","name":"spark-kubernetes-executor"}]}}"#;

fn set_total(
    app: &str,
    targets: &[(i32, u32)],
    templates: &[(i32, &str)],
) -> proto::SetTotalExpectedRequest {
    proto::SetTotalExpectedRequest {
        application_id: app.into(),
        executors_per_profile: targets.iter().copied().collect(),
        resource_profile_templates: templates.iter().map(|(p, t)| (*p, t.to_string())).collect(),
    }
}

/// Waits until `app` has exactly `count` executor pods and returns them by executor id.
async fn pods_by_id(h: &Harness, app: &str, count: usize) -> HashMap<String, Value> {
    eventually(&format!("{count} pods of {app}"), || async {
        let pods = h.pods(NS, app).await;
        (pods.len() == count).then(|| {
            pods.iter()
                .map(|p| {
                    let value = serde_json::to_value(p).expect("pod as JSON");
                    let id = value["metadata"]["labels"]["spark-exec-id"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    (id, value)
                })
                .collect()
        })
    })
    .await
}

fn env(container: &Value, name: &str) -> Value {
    container["env"]
        .as_array()
        .and_then(|vars| vars.iter().find(|v| v["name"] == name))
        .map(|v| v["value"].clone())
        .unwrap_or(Value::Null)
}

/// Asserts a FAILED_PRECONDITION status naming `field` first.
#[track_caller]
fn assert_refused(status: &tonic::Status, field: &str) {
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{field}: ")),
        "expected the message to name {field}: {:?}",
        status.message()
    );
}

#[tokio::test]
async fn sparks_own_executor_pod_is_a_template() {
    let mut h = Harness::start().await;
    let app = "spark-5d1c0e";
    let mut start = start_request(app, NS);
    start.executor_pod_template = spark_template(app);
    start.pod_name_prefix = "pi-7f3a".into();
    h.client.start(start).await.expect("Start");
    h.client
        .set_total_expected(set_total(app, &[(0, 2)], &[]))
        .await
        .expect("SetTotalExpected");

    let pods = pods_by_id(&h, app, 2).await;
    for id in ["1", "2"] {
        let pod = &pods[id];
        let name = format!("pi-7f3a-exec-{id}");
        let executor = &pod["spec"]["containers"][0];
        // (what, found, expected)
        let checks = [
            ("name", pod["metadata"]["name"].clone(), json!(name)),
            ("hostname", pod["spec"]["hostname"].clone(), json!(name)),
            (
                "labels",
                pod["metadata"]["labels"].clone(),
                json!({
                    "spark-app-selector": app, "spark-role": "executor", "spark-exec-id": id,
                    "spark-exec-resourceprofile-id": "0", "spark-app-name": "pi",
                    "exec-shard": format!("{app}-{id}"),
                }),
            ),
            (
                "annotation",
                pod["metadata"]["annotations"]["logs"].clone(),
                json!(format!("/logs/{app}/{id}")),
            ),
            (
                "SPARK_EXECUTOR_ID",
                env(executor, "SPARK_EXECUTOR_ID"),
                json!(id),
            ),
            (
                "java option",
                env(executor, "SPARK_JAVA_OPT_1"),
                json!(format!("-Dgc.log=/tmp/{app}-{id}.log")),
            ),
            (
                "executor dirs",
                env(executor, "SPARK_EXECUTOR_DIRS"),
                json!(format!("/data/{id}")),
            ),
            (
                "init container args",
                pod["spec"]["initContainers"][0]["args"].clone(),
                json!(["mkdir", "-p", format!("/data/{id}")]),
            ),
            (
                "claim name",
                pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"].clone(),
                json!(format!("pi-exec-{id}-pvc-0")),
            ),
        ];
        for (what, found, expected) in checks {
            assert_eq!(found, expected, "executor {id}: {what}");
        }
    }
    h.stop_server().await;
}

#[tokio::test]
async fn templates_whose_labels_break_once_substituted_are_refused_at_start() {
    let mut h = Harness::start().await;
    let long = "x".repeat(50);
    let template =
        format!("{TEMPLATE}metadata:\n  labels:\n    shard: \"{long}-{{{{EXECUTOR_ID}}}}\"\n");
    let mut start = start_request("app-long", NS);
    start.resource_profile_templates = HashMap::from([(3, template)]);
    let status = h.client.start(start).await.expect_err("refused");
    assert_invalid(&status, "resource_profile_templates[3]");
    assert!(status.message().contains("shard"), "{}", status.message());
    h.stop_server().await;
}

#[tokio::test]
async fn set_total_expected_registers_profile_templates() {
    let mut h = Harness::start().await;
    let app = "app-profiles";
    h.client.start(start_request(app, NS)).await.expect("Start");

    // A profile Start did not know gets its template with its first target.
    h.client
        .set_total_expected(set_total(app, &[(1, 2)], &[(1, GPU_TEMPLATE)]))
        .await
        .expect("register profile 1");
    let pods = pods_by_id(&h, app, 2).await;
    for pod in pods.values() {
        assert_eq!(
            pod["metadata"]["labels"]["spark-exec-resourceprofile-id"],
            "1"
        );
        assert_eq!(pod["spec"]["containers"][0]["image"], "spark-gpu:4");
    }

    // The same template again (as JSON this time) is fine, and so is a target alone.
    h.client
        .set_total_expected(set_total(app, &[(1, 3)], &[(1, GPU_TEMPLATE_JSON)]))
        .await
        .expect("same template again");
    // Asked for once a round has seen the first two (the batch rule).
    let app_id = AppId::parse(app).expect("app id");
    eventually("the first two seen", || async {
        let snapshot = h.applications.snapshot(&app_id).await.expect("snapshot");
        (snapshot.executors.len() == 2).then_some(())
    })
    .await;
    h.clock.advance(Duration::from_secs(1));
    pods_by_id(&h, app, 3).await;

    // Another template for profile 1 (here profile 0's) is refused, and nothing of the
    // request applies: not the new profile 2 beside it, not its targets.
    let status = h
        .client
        .set_total_expected(set_total(
            app,
            &[(1, 5), (2, 1)],
            &[(1, TEMPLATE), (2, TEMPLATE)],
        ))
        .await
        .expect_err("another template for profile 1");
    assert_refused(&status, "resource_profile_templates[1]");

    // A template that cannot make pods is refused like at Start, and its good neighbour is
    // not registered either.
    let imageless =
        "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n";
    let status = h
        .client
        .set_total_expected(set_total(
            app,
            &[(2, 1), (3, 1)],
            &[(2, TEMPLATE), (3, imageless)],
        ))
        .await
        .expect_err("profile 3 has no image");
    assert_invalid(&status, "resource_profile_templates[3]");
    let status = h
        .client
        .set_total_expected(set_total(app, &[(2, 1)], &[(4, "kind: [")]))
        .await
        .expect_err("not YAML");
    assert_invalid(&status, "resource_profile_templates[4]");

    let status = h
        .client
        .get_status(status_request(app))
        .await
        .expect("GetStatus")
        .into_inner();
    let profiles: Vec<(i32, u32)> = status
        .profiles
        .iter()
        .map(|p| (p.resource_profile_id, p.target))
        .collect();
    assert_eq!(profiles, vec![(0, 0), (1, 3)]);
    let status = h
        .client
        .set_total_expected(set_total(app, &[(2, 1)], &[]))
        .await
        .expect_err("profile 2 was never registered");
    assert_refused(&status, "executors_per_profile[2]");
    assert_eq!(h.pods(NS, app).await.len(), 3);
    h.stop_server().await;
}

#[tokio::test]
async fn a_repeated_start_must_repeat_the_first() {
    let mut h = Harness::start().await;
    let app = "app-again";
    let first = || {
        let mut req = start_request(app, NS);
        req.pod_name_prefix = "again".into();
        req.resource_profile_templates = HashMap::from([(1, GPU_TEMPLATE.to_string())]);
        req.settings = Some(proto::AllocationSettings {
            batch_size: Some(4),
            ..Default::default()
        });
        req
    };
    let started = h.client.start(first()).await.expect("Start").into_inner();
    assert!(!started.resumed);

    type Edit = fn(&mut proto::StartRequest);
    // (what changes, the field refused or None when it is still the same Start)
    let cases: Vec<(&str, Edit, Option<&str>)> = vec![
        ("nothing", |_| {}, None),
        (
            "profile 0's template, reformatted as JSON",
            |r| {
                r.executor_pod_template = r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"spark-kubernetes-executor","image":"spark:4"}]}}"#.into()
            },
            None,
        ),
        (
            "a setting given explicitly with its effective value",
            |r| {
                if let Some(s) = r.settings.as_mut() {
                    s.batch_delay_ms = Some(1000);
                }
            },
            None,
        ),
        (
            "profile 0's template",
            |r| r.executor_pod_template = GPU_TEMPLATE.into(),
            Some("executor_pod_template"),
        ),
        (
            "profile 1's template",
            |r| {
                r.resource_profile_templates.insert(1, TEMPLATE.to_string());
            },
            Some("resource_profile_templates[1]"),
        ),
        (
            "a setting",
            |r| {
                if let Some(s) = r.settings.as_mut() {
                    s.batch_size = Some(5);
                }
            },
            Some("settings.batch_size"),
        ),
        (
            "a setting left to the default",
            |r| r.settings = None,
            Some("settings.batch_size"),
        ),
        (
            "the executor container",
            |r| {
                if let Some(s) = r.settings.as_mut() {
                    s.executor_container_name = Some("main".into());
                }
            },
            Some("settings.executor_container_name"),
        ),
        (
            "the driver pod",
            |r| r.driver_pod_name = "driver-0".into(),
            Some("driver_pod_name"),
        ),
        (
            "the prefix",
            |r| r.pod_name_prefix = "other".into(),
            Some("pod_name_prefix"),
        ),
        (
            "a template and a new profile: nothing registered",
            |r| {
                r.executor_pod_template = GPU_TEMPLATE.into();
                r.resource_profile_templates.insert(2, TEMPLATE.to_string());
            },
            Some("executor_pod_template"),
        ),
    ];
    for (what, edit, refused) in cases {
        let mut req = first();
        edit(&mut req);
        match (h.client.start(req).await, refused) {
            (Ok(answer), None) => assert!(answer.into_inner().resumed, "{what}"),
            (Err(status), Some(field)) => assert_refused(&status, field),
            (result, _) => panic!("{what}: unexpected {result:?}"),
        }
    }
    let status = h
        .client
        .set_total_expected(set_total(app, &[(2, 1)], &[]))
        .await
        .expect_err("no refused Start registered profile 2");
    assert_refused(&status, "executors_per_profile[2]");

    // A repeated Start may bring profiles the application does not have yet.
    let mut more = first();
    more.resource_profile_templates
        .insert(2, TEMPLATE.to_string());
    assert!(
        h.client
            .start(more)
            .await
            .expect("new profile")
            .into_inner()
            .resumed
    );
    h.client
        .set_total_expected(set_total(app, &[(2, 1)], &[]))
        .await
        .expect("profile 2 registered by the repeated Start");
    let pods = pods_by_id(&h, app, 1).await;
    assert_eq!(pods["1"]["metadata"]["name"], "again-exec-1");
    assert_eq!(
        pods["1"]["metadata"]["labels"]["spark-exec-resourceprofile-id"],
        "2"
    );
    h.stop_server().await;
}

/// Plays the kubelet: the pod's phase and container states.
async fn set_status(h: &Harness, pod: &str, containers: Value) {
    let api: Api<Pod> = Api::namespaced(h.sim.try_client().expect("sim client"), NS);
    let patch = json!({"status": {"phase": "Running", "containerStatuses": containers}});
    api.patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status patch");
}

fn container_status(name: &str, exit_code: Option<i32>) -> Value {
    let state = match exit_code {
        Some(code) => json!({"terminated": {"exitCode": code, "reason": "Exited"}}),
        None => json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
    };
    json!({"name": name, "ready": exit_code.is_none(), "restartCount": 0, "image": "x",
           "imageID": "", "state": state})
}

#[tokio::test]
async fn the_executor_container_and_check_all_containers_are_per_application() {
    let mut h = Harness::start().await;
    let two_containers = |executor: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: sidecar\n    image: envoy\n  - name: {executor}\n    image: spark:4\n"
        )
    };
    // (app, executor container setting, check all containers, the executor container's
    // exit code (None: running), the sidecar's, the state expected)
    let cases = [
        ("app-all", Some("main"), Some(true), None, Some(1), "failed"),
        ("app-main", Some("main"), None, Some(0), None, "succeeded"),
        ("app-default", None, None, None, Some(1), "running"),
    ];
    for (app, container, check_all, _, _, _) in cases {
        let mut start = start_request(app, NS);
        start.executor_pod_template =
            two_containers(container.unwrap_or("spark-kubernetes-executor"));
        start.settings = Some(proto::AllocationSettings {
            executor_container_name: container.map(str::to_string),
            check_all_containers: check_all,
            ..Default::default()
        });
        h.client.start(start).await.expect("Start");
        h.client
            .set_total_expected(set_total(app, &[(0, 1)], &[]))
            .await
            .expect("SetTotalExpected");
    }
    for (app, container, _, executor_exit, sidecar_exit, expected) in cases {
        let container = container.unwrap_or("spark-kubernetes-executor");
        let pods = pods_by_id(&h, app, 1).await;
        // The application's executor container is the one that gets the executor's env.
        let with_id: Vec<&str> = pods["1"]["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| env(c, "SPARK_EXECUTOR_ID") == json!("1"))
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(with_id, vec![container], "{app}");
        set_status(
            &h,
            &format!("{app}-exec-1"),
            json!([
                container_status("sidecar", sidecar_exit),
                container_status(container, executor_exit)
            ]),
        )
        .await;
        let app_id = AppId::parse(app).expect("app id");
        let state = eventually(&format!("{app} sees its pod Running"), || async {
            let snapshot = h.applications.snapshot(&app_id).await.expect("snapshot");
            let state = snapshot.executors.get(&ExecutorId(1))?.state.clone();
            (state != ExecutorState::Pending).then_some(state)
        })
        .await;
        let found = match state {
            ExecutorState::Running => "running",
            ExecutorState::Succeeded { .. } => "succeeded",
            ExecutorState::Failed { .. } => "failed",
            _ => "other",
        };
        assert_eq!(found, expected, "{app}: {state:?}");
    }
    // The finished executors are deleted by the next round (delete on termination); the
    // running one stays.
    h.clock.advance(Duration::from_secs(1));
    for (app, ..) in &cases[..2] {
        eventually(&format!("{app}'s finished executor deleted"), || async {
            let pods = h.pods(NS, app).await;
            (!pods.iter().any(|p| {
                p.metadata.name.as_deref() == Some(&format!("{app}-exec-1"))
                    && p.metadata.deletion_timestamp.is_none()
            }))
            .then_some(())
        })
        .await;
    }
    assert_eq!(h.pods(NS, "app-default").await.len(), 1);
    h.stop_server().await;
}

/// Spark's executor pod as its Volcano and YuniKorn feature steps leave it: the scheduler,
/// Volcano's pod group, YuniKorn's application id and task group.
fn gang_template(scheduler: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "labels": {"queue": "root.spark", "applicationId": "{{APP_ID}}"},
            "annotations": {
                "scheduling.k8s.io/group-name": "{{APP_ID}}-podgroup",
                "volcano.sh/queue-name": "spark",
                "yunikorn.apache.org/app-id": "{{APP_ID}}",
                "yunikorn.apache.org/task-group-name": "spark-executor",
                "yunikorn.apache.org/task-groups":
                    r#"[{"name":"spark-executor","minMember":4,"minResource":{"cpu":"1"}}]"#,
            },
        },
        "spec": {
            "schedulerName": scheduler,
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}],
        },
    })
    .to_string()
}

#[tokio::test]
async fn gang_scheduler_pods_pass_through_and_their_gang_is_asked_for_at_once() {
    let mut h = Harness::start().await;
    let app = "spark-gang-1";
    let mut start = start_request(app, NS);
    start.executor_pod_template = gang_template("volcano");
    start.settings = Some(proto::AllocationSettings {
        batch_size: Some(1),
        min_executors_at_once: Some(4),
        ..Default::default()
    });
    h.client.start(start).await.expect("Start");
    h.client
        .set_total_expected(set_total(app, &[(0, 6)], &[]))
        .await
        .expect("SetTotalExpected");
    // The clock stands still, so only the round SetTotalExpected ran has created pods: the
    // whole gang, though a batch is 1.
    let pods = pods_by_id(&h, app, 4).await;
    for id in ["1", "2", "3", "4"] {
        let pod = &pods[id];
        let annotations = &pod["metadata"]["annotations"];
        let checks = [
            ("scheduler", &pod["spec"]["schedulerName"], json!("volcano")),
            (
                "pod group",
                &annotations["scheduling.k8s.io/group-name"],
                json!(format!("{app}-podgroup")),
            ),
            (
                "Volcano queue",
                &annotations["volcano.sh/queue-name"],
                json!("spark"),
            ),
            (
                "YuniKorn app id",
                &annotations["yunikorn.apache.org/app-id"],
                json!(app),
            ),
            (
                "YuniKorn task group",
                &annotations["yunikorn.apache.org/task-group-name"],
                json!("spark-executor"),
            ),
            (
                "YuniKorn task groups",
                &annotations["yunikorn.apache.org/task-groups"],
                json!(r#"[{"name":"spark-executor","minMember":4,"minResource":{"cpu":"1"}}]"#),
            ),
            (
                "applicationId label",
                &pod["metadata"]["labels"]["applicationId"],
                json!(app),
            ),
        ];
        for (what, found, expected) in checks {
            assert_eq!(*found, expected, "executor {id}: {what}");
        }
    }
    let status = h.status(app).await.expect("GetStatus");
    let p0 = &status.profiles[0];
    assert_eq!((p0.target, p0.pending + p0.newly_created), (6, 4), "{p0:?}");

    // A scheduler outside pod_policy.scheduler_names is refused, naming the field, at Start
    // and for a profile SetTotalExpected registers.
    let mut start = start_request("spark-gang-2", NS);
    start.executor_pod_template = gang_template("my-scheduler");
    let status = h.client.start(start).await.expect_err("scheduler refused");
    assert_invalid(&status, "executor_pod_template");
    assert!(
        status
            .message()
            .starts_with("executor_pod_template: spec.schedulerName: "),
        "{}",
        status.message()
    );
    let yunikorn = gang_template("yunikorn");
    let other = gang_template("my-scheduler");
    h.client
        .set_total_expected(set_total(app, &[], &[(1, yunikorn.as_str())]))
        .await
        .expect("yunikorn is allowed");
    let status = h
        .client
        .set_total_expected(set_total(app, &[], &[(2, other.as_str())]))
        .await
        .expect_err("scheduler refused");
    assert_invalid(&status, "resource_profile_templates[2]");
    assert!(
        status.message().contains("spec.schedulerName"),
        "{}",
        status.message()
    );
    assert!(h.pods(NS, "spark-gang-2").await.is_empty());
    h.stop_server().await;
}
