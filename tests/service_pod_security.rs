//! Pod Security Standards through the service, over real gRPC against the simulated
//! cluster: what got past the policy before (issue 19, point 3) is refused by Start and by
//! SetTotalExpected with INVALID_ARGUMENT naming the field and the template path, and no
//! pod is created; `pod_policy.level = restricted` holds templates to that profile. One test
//! per control and form is in `src/allocator/tests/pod_policy.rs`.

use serde_json::{Value, json};
use spark_pod_allocator::allocator::pod_policy::{PodPolicy, PodSecurityLevel};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use test_kit::grpc::{Harness, TEMPLATE, assert_invalid, quiet_cluster, start_request};
use test_kit::requests::*;
use test_kit::wait::eventually;

const NS: &str = "team-a";

/// An executor pod with `spec` merged into its spec and `metadata` as its metadata.
fn template(metadata: Value, spec: Value) -> String {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}]},
    });
    if let (Some(base), Value::Object(extra)) = (pod["spec"].as_object_mut(), spec) {
        base.extend(extra);
    }
    pod.to_string()
}

fn in_spec(spec: Value) -> String {
    template(json!({}), spec)
}

/// The executor container with `fields` merged in, as the pod's only container.
fn in_executor(fields: Value) -> String {
    let mut container = json!({"name": "spark-kubernetes-executor", "image": "spark:4"});
    if let (Some(c), Value::Object(extra)) = (container.as_object_mut(), fields) {
        c.extend(extra);
    }
    in_spec(json!({"containers": [container]}))
}

/// What the issue found accepted, each with the path it is now refused at.
fn bypasses() -> Vec<(&'static str, String, &'static str)> {
    vec![
        (
            "hostPort",
            in_executor(json!({"ports": [{"containerPort": 22, "hostPort": 22}]})),
            "spec.containers[0].ports[0].hostPort",
        ),
        (
            "procMount: Unmasked in a sidecar",
            in_spec(
                json!({"initContainers": [{"name": "proxy", "image": "envoy",
                "restartPolicy": "Always", "securityContext": {"procMount": "Unmasked"}}]}),
            ),
            "spec.initContainers[0].securityContext.procMount",
        ),
        (
            "seccomp Unconfined, pod",
            in_spec(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})),
            "spec.securityContext.seccompProfile.type",
        ),
        (
            "seccomp Unconfined, container",
            in_executor(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})),
            "spec.containers[0].securityContext.seccompProfile.type",
        ),
        (
            "AppArmor Unconfined, field",
            in_spec(json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}})),
            "spec.securityContext.appArmorProfile.type",
        ),
        (
            "AppArmor unconfined, annotation",
            template(
                json!({"annotations": {
                    "container.apparmor.security.beta.kubernetes.io/spark-kubernetes-executor": "unconfined"}}),
                json!({}),
            ),
            "metadata.annotations[container.apparmor.security.beta.kubernetes.io/spark-kubernetes-executor]",
        ),
        (
            "unsafe sysctl",
            in_spec(json!({"securityContext": {"sysctls": [
                {"name": "kernel.shm_rmid_forced", "value": "1"},
                {"name": "kernel.core_pattern", "value": "|/tmp/x"}]}})),
            "spec.securityContext.sysctls[1].name",
        ),
        (
            "SELinux spc_t in an ephemeral container",
            in_spec(
                json!({"ephemeralContainers": [{"name": "debug", "image": "busybox",
                "securityContext": {"seLinuxOptions": {"type": "spc_t"}}}]}),
            ),
            "spec.ephemeralContainers[0].securityContext.seLinuxOptions.type",
        ),
        (
            "Windows hostProcess",
            in_spec(
                json!({"securityContext": {"windowsOptions": {"hostProcess": true}},
                "hostNetwork": false}),
            ),
            "spec.securityContext.windowsOptions.hostProcess",
        ),
        (
            "a probe aimed at another host",
            in_executor(
                json!({"livenessProbe": {"httpGet": {"port": 80, "host": "169.254.169.254"}}}),
            ),
            "spec.containers[0].livenessProbe.httpGet.host",
        ),
    ]
}

#[track_caller]
fn assert_names(status: &tonic::Status, field: &str, path: &str, what: &str) {
    assert_invalid(status, field);
    assert!(
        status.message().starts_with(&format!("{field}: {path}: ")),
        "{what}: {}",
        status.message()
    );
}

#[tokio::test]
async fn what_got_past_baseline_is_refused_by_start_and_set_total_expected() {
    let mut h = Harness::start().await;
    let app = "app-baseline";
    h.client.start(start_request(app, NS)).await.expect("Start");
    for (i, (what, text, path)) in bypasses().into_iter().enumerate() {
        let mut start = start_request(&format!("hostile-{i}"), NS);
        start.executor_pod_template = text.clone();
        let status = h.client.start(start).await.expect_err(what);
        assert_names(&status, "executor_pod_template", path, what);

        let mut start = start_request(&format!("hostile-profile-{i}"), NS);
        start.resource_profile_templates = [(2, text.clone())].into();
        let status = h.client.start(start).await.expect_err(what);
        assert_names(&status, "resource_profile_templates[2]", path, what);

        let mut register = profiles_request(app, [(1, text)].into());
        register.executors_per_profile = [(1, 2)].into();
        let status = h.client.set_total_expected(register).await.expect_err(what);
        assert_names(&status, "resource_profile_templates[1]", path, what);
    }
    // Nothing was registered or created: profile 1 is unknown, the refused apps do not exist.
    let status = h
        .client
        .set_total_expected(proto_targets(app, 1, 1))
        .await
        .expect_err("profile 1 was never registered");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    let refused = h
        .client
        .get_status(status_request("hostile-0"))
        .await
        .expect_err("never started");
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    assert!(h.pods(NS, app).await.is_empty());
    assert!(h.pods(NS, "hostile-0").await.is_empty());
    h.stop_server().await;
}

fn proto_targets(
    app: &str,
    profile: i32,
    n: u32,
) -> spark_pod_allocator::proto::SetTotalExpectedRequest {
    let mut request = targets_request(app, 0);
    request.executors_per_profile = [(profile, n)].into();
    request
}

/// Spark's executor pod (what the plugin sends) hardened the way `restricted` asks.
fn restricted_spark_pod(app: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"labels": {"spark-app-selector": app, "spark-role": "executor"}},
        "spec": {
            "securityContext": {"runAsNonRoot": true, "runAsUser": 185,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "spark-kubernetes-executor", "image": "spark:4", "args": ["executor"],
                "ports": [{"name": "blockmanager", "containerPort": 7079}],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "spark-local-dir-1", "mountPath": "/var/data"}],
            }],
            "volumes": [{"name": "spark-local-dir-1", "emptyDir": {}}],
        },
    })
    .to_string()
}

#[tokio::test]
async fn a_restricted_service_holds_templates_to_restricted() {
    let mut config = Settings::default();
    config.pod_policy = PodPolicy {
        level: PodSecurityLevel::Restricted,
        ..PodPolicy::default()
    };
    let mut h = Harness::start_with_config(quiet_cluster(), ServeSettings::default(), config).await;
    // The plain template passes baseline, not restricted.
    let mut start = start_request("app-plain", NS);
    start.executor_pod_template = TEMPLATE.into();
    let status = h.client.start(start).await.expect_err("not restricted");
    assert_names(
        &status,
        "executor_pod_template",
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "plain",
    );
    assert!(
        status.message().contains("Pod Security restricted")
            && status.message().contains("pod_policy.level"),
        "{}",
        status.message()
    );

    let app = "app-restricted";
    let mut start = start_request(app, NS);
    start.executor_pod_template = restricted_spark_pod(app);
    h.client.start(start).await.expect("a restricted template");
    h.client
        .set_total_expected(targets_request(app, 2))
        .await
        .expect("targets");
    eventually("two executor pods", || async {
        (h.pods(NS, app).await.len() == 2).then_some(())
    })
    .await;

    // A profile template running as root, or with an NFS volume, is refused by
    // SetTotalExpected.
    let root = restricted_spark_pod(app).replace("\"runAsUser\":185", "\"runAsUser\":0");
    let nfs = restricted_spark_pod(app).replace(
        "\"emptyDir\":{}",
        "\"nfs\":{\"server\":\"nfs.example.com\",\"path\":\"/\"}",
    );
    for (text, path) in [
        (root, "spec.securityContext.runAsUser"),
        (nfs, "spec.volumes[0].nfs"),
    ] {
        let status = h
            .client
            .set_total_expected(profiles_request(app, [(1, text)].into()))
            .await
            .expect_err(path);
        assert_names(&status, "resource_profile_templates[1]", path, path);
    }
    assert_eq!(h.pods(NS, app).await.len(), 2);
    h.stop_server().await;
}
