//! Per-executor PersistentVolumeClaims (Spark's `OnDemand` claims) over real gRPC against
//! the simulated cluster, which binds claims as a provisioner would, on the manual clock:
//! an executor gets its claim (named and labelled as Spark does, owned by the driver pod),
//! a killed executor's claim is mounted by its replacement, waiting to reuse holds
//! creation at the maximum, and pod-owned claims go on Stop; a claim someone else made
//! under an executor's claim name is never adopted, mounted or deleted, and the claim
//! policy holds claim templates and generic ephemeral volumes alike.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use spark_pod_allocator::allocator::pod_policy::PodPolicy;
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::proto;
use test_kit::grpc::{Harness, assert_invalid, quiet_cluster, start_request};
use test_kit::wait::until;

const NS: &str = "default";

const POD_TEMPLATE: &str = r#"{"spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4",
  "volumeMounts": [{"name": "spark-local-dir-1", "mountPath": "/data"}]}],
  "volumes": [{"name": "spark-local-dir-1",
    "persistentVolumeClaim": {"claimName": "{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0"}}]}}"#;

fn claim_template(size: &str) -> String {
    numbered_claim_template(0, size)
}

fn numbered_claim_template(index: u32, size: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": format!("{{{{APP_ID}}}}-exec-{{{{EXECUTOR_ID}}}}-pvc-{index}")},
        "spec": {"storageClassName": "gp3", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": size}}}
    })
    .to_string()
}

async fn harness() -> Harness {
    Harness::start_with(quiet_cluster(), Default::default()).await
}

fn pods_api(h: &Harness) -> Api<Pod> {
    Api::namespaced(h.sim.try_client().expect("sim client"), NS)
}

fn claims_api(h: &Harness) -> Api<PersistentVolumeClaim> {
    Api::namespaced(h.sim.try_client().expect("sim client"), NS)
}

/// A driver pod, as spark-submit makes it; returns its uid.
async fn create_driver(h: &Harness, name: &str) -> String {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"spark-role": "driver"}},
        "spec": {"containers": [{"name": "spark-kubernetes-driver", "image": "spark:4"}]}
    }))
    .unwrap();
    let created = pods_api(h)
        .create(&PostParams::default(), &pod)
        .await
        .expect("driver pod");
    created.metadata.uid.expect("uid")
}

async fn start(h: &Harness, app: &str, driver: &str, settings: proto::AllocationSettings) {
    h.client
        .clone()
        .start(proto::StartRequest {
            executor_pod_template: POD_TEMPLATE.into(),
            executor_claim_templates: vec![claim_template("10Gi")],
            driver_pod_name: driver.into(),
            settings: Some(settings),
            ..start_request(app, NS)
        })
        .await
        .expect("Start");
}

/// The application's executor pods by name, sorted, with the claim each mounts.
async fn pods_and_claims(h: &Harness, app: &str) -> Vec<(String, String)> {
    let mut pods: Vec<(String, String)> = h
        .pods(NS, app)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let claim = p.spec.and_then(|s| s.volumes).unwrap_or_default()[0]
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.clone())
                .unwrap_or_default();
            (p.metadata.name.unwrap_or_default(), claim)
        })
        .collect();
    pods.sort();
    pods
}

async fn claim_names(h: &Harness) -> Vec<String> {
    let mut names: Vec<String> = claims_api(h)
        .list(&Default::default())
        .await
        .expect("list claims")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    names.sort();
    names
}

/// Moves the clock a batch delay at a time until `check` holds.
async fn rounds_until(h: &Harness, what: &str, mut check: impl AsyncFnMut() -> bool) {
    until(what, async || {
        if check().await {
            return true;
        }
        h.clock.advance(Duration::from_secs(1));
        false
    })
    .await;
}

fn pair(pod: &str, claim: &str) -> (String, String) {
    (pod.to_string(), claim.to_string())
}

#[tokio::test]
async fn an_executor_gets_its_claim_bound_labelled_and_owned_by_the_driver() {
    let h = harness().await;
    let app = "app-claim";
    let driver_uid = create_driver(&h, "drv-claim").await;
    start(&h, app, "drv-claim", proto::AllocationSettings::default()).await;
    h.set_total(app, 1).await;
    until("executor 1 and its claim", async || {
        pods_and_claims(&h, app).await == [pair("app-claim-exec-1", "app-claim-exec-1-pvc-0")]
    })
    .await;
    let claim = claims_api(&h)
        .get("app-claim-exec-1-pvc-0")
        .await
        .expect("the executor's claim");
    let labels = claim.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels["spark-app-selector"], app);
    assert_eq!(labels["spark-role"], "executor");
    let owner = &claim.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Pod", "drv-claim")
    );
    assert_eq!(owner.uid, driver_uid);
    let spec = claim.spec.unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("gp3"));
    assert_eq!(claim.status.unwrap().phase.as_deref(), Some("Bound"));
}

#[tokio::test]
async fn a_killed_executors_claim_is_mounted_by_its_replacement() {
    let h = harness().await;
    let app = "app-reuse";
    create_driver(&h, "drv-reuse").await;
    start(&h, app, "drv-reuse", proto::AllocationSettings::default()).await;
    h.set_total(app, 2).await;
    until("two executors with their claims", async || {
        pods_and_claims(&h, app).await.len() == 2
    })
    .await;
    assert_eq!(
        claim_names(&h).await,
        ["app-reuse-exec-1-pvc-0", "app-reuse-exec-2-pvc-0"]
    );
    // The executors run a while: a claim younger than a batch delay is never reused (its
    // pod may be about to show).
    h.clock.advance(Duration::from_secs(5));
    pods_api(&h)
        .delete("app-reuse-exec-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("kill executor 1");
    rounds_until(&h, "a replacement for executor 1", async || {
        pods_and_claims(&h, app).await.len() == 2
    })
    .await;
    // The replacement (executor 3) mounts executor 1's claim; no claim was created for it.
    assert_eq!(
        pods_and_claims(&h, app).await,
        [
            pair("app-reuse-exec-2", "app-reuse-exec-2-pvc-0"),
            pair("app-reuse-exec-3", "app-reuse-exec-1-pvc-0"),
        ]
    );
    assert_eq!(
        claim_names(&h).await,
        ["app-reuse-exec-1-pvc-0", "app-reuse-exec-2-pvc-0"]
    );
}

#[tokio::test]
async fn waiting_to_reuse_holds_creation_at_the_maximum_until_a_claim_is_free() {
    let h = harness().await;
    let app = "app-wait";
    create_driver(&h, "drv-wait").await;
    let settings = proto::AllocationSettings {
        wait_to_reuse_claims: Some(true),
        max_claims: Some(1),
        ..Default::default()
    };
    start(&h, app, "drv-wait", settings).await;
    h.set_total(app, 2).await;
    until("executor 1", async || {
        pods_and_claims(&h, app).await == [pair("app-wait-exec-1", "app-wait-exec-1-pvc-0")]
    })
    .await;
    // Rounds pass: the second executor waits for a claim, none is created.
    for _ in 0..5 {
        h.clock.advance(Duration::from_secs(1));
        let status = h.status(app).await.expect("GetStatus");
        assert_eq!(status.profiles[0].target, 2);
    }
    assert_eq!(pods_and_claims(&h, app).await.len(), 1);
    assert_eq!(claim_names(&h).await, ["app-wait-exec-1-pvc-0"]);
    pods_api(&h)
        .delete("app-wait-exec-1", &DeleteParams::default().grace_period(0))
        .await
        .expect("kill executor 1");
    rounds_until(&h, "an executor on executor 1's claim", async || {
        pods_and_claims(&h, app).await.len() == 1
            && pods_and_claims(&h, app).await[0].0 != "app-wait-exec-1"
    })
    .await;
    let pods = pods_and_claims(&h, app).await;
    assert_eq!(pods[0].1, "app-wait-exec-1-pvc-0");
    assert_eq!(claim_names(&h).await, ["app-wait-exec-1-pvc-0"]);
}

#[tokio::test]
async fn without_a_driver_claims_are_owned_by_their_pod_and_stop_deletes_them() {
    let h = harness().await;
    let app = "app-own";
    start(&h, app, "", proto::AllocationSettings::default()).await;
    h.set_total(app, 1).await;
    until("executor 1 and its claim", async || {
        pods_and_claims(&h, app).await.len() == 1 && claim_names(&h).await.len() == 1
    })
    .await;
    let pod = pods_api(&h).get("app-own-exec-1").await.expect("pod");
    let claim = claims_api(&h)
        .get("app-own-exec-1-pvc-0")
        .await
        .expect("claim");
    let owner = &claim.metadata.owner_references.unwrap()[0];
    assert_eq!(owner.name, "app-own-exec-1");
    assert_eq!(Some(owner.uid.clone()), pod.metadata.uid);
    h.client
        .clone()
        .stop(proto::StopRequest {
            application_id: app.into(),
        })
        .await
        .expect("Stop");
    assert!(claim_names(&h).await.is_empty());
}

#[tokio::test]
async fn a_claim_over_the_size_cap_is_refused_naming_its_entry() {
    let h = harness().await;
    let status = h
        .client
        .clone()
        .start(proto::StartRequest {
            executor_pod_template: POD_TEMPLATE.into(),
            executor_claim_templates: vec![
                claim_template("10Gi"),
                numbered_claim_template(1, "2Ti"),
            ],
            ..start_request("app-big", NS)
        })
        .await
        .unwrap_err();
    assert_invalid(&status, "executor_claim_templates[1]");
    assert!(status.message().contains("max_claim_size"), "{status:?}");
}

#[tokio::test]
async fn an_application_without_claim_templates_sends_no_claim_request() {
    let h = harness().await;
    let app = "app-plain";
    create_driver(&h, "drv-plain").await;
    h.client
        .clone()
        .start(proto::StartRequest {
            driver_pod_name: "drv-plain".into(),
            ..start_request(app, NS)
        })
        .await
        .expect("Start");
    h.set_total(app, 2).await;
    until("two executors", async || h.pods(NS, app).await.len() == 2).await;
    for _ in 0..3 {
        h.clock.advance(Duration::from_secs(61));
        h.status(app).await.expect("GetStatus");
    }
    h.client
        .clone()
        .stop(proto::StopRequest {
            application_id: app.into(),
        })
        .await
        .expect("Stop");
    let claim_requests: Vec<_> = h
        .sim
        .requests()
        .into_keys()
        .filter(|(_, _, resource)| resource == "persistentvolumeclaims")
        .collect();
    assert!(claim_requests.is_empty(), "{claim_requests:?}");
}

/// A claim made by hand (a tenant with claim rights in the namespace): `labels` and an
/// owner of its choice, the class and size an executor's claim would match.
async fn squat(h: &Harness, name: &str, labels: serde_json::Value, owner_uid: &str) {
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "drv-victim", "uid": owner_uid, "controller": true}]},
        "spec": {"storageClassName": "gp3", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "10Gi"}}}
    }))
    .unwrap();
    claims_api(h)
        .create(&PostParams::default(), &claim)
        .await
        .expect("squatting claim");
}

/// Start of `app` whose claim template and pod volume name `claim` itself (no placeholder).
fn fixed_claim_start(app: &str, claim: &str) -> proto::StartRequest {
    let template = POD_TEMPLATE.replace("{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0", claim);
    let claim_template =
        claim_template("10Gi").replace("{{APP_ID}}-exec-{{EXECUTOR_ID}}-pvc-0", claim);
    proto::StartRequest {
        executor_pod_template: template,
        executor_claim_templates: vec![claim_template],
        ..start_request(app, NS)
    }
}

/// The uid, labels and owners of claim `name`.
async fn claim_identity(h: &Harness, name: &str) -> (Option<String>, String, Vec<String>) {
    let claim = claims_api(h).get(name).await.expect("claim");
    let app = claim.metadata.labels.unwrap_or_default()["spark-app-selector"].clone();
    let owners = (claim
        .metadata
        .owner_references
        .unwrap_or_default()
        .into_iter())
    .map(|o| o.uid)
    .collect();
    (claim.metadata.uid, app, owners)
}

#[tokio::test]
async fn a_claim_under_an_executors_name_made_by_someone_else_is_never_adopted_mounted_or_deleted()
{
    let h = harness().await;
    let victim = "app-b";
    // Executor 1's claim name, taken by hand with the victim's labels (and an owner that is
    // not its driver); executor 2's, taken by another application through the service.
    let forged_labels = json!({"spark-app-selector": victim, "spark-role": "executor"});
    squat(&h, "app-b-exec-1-pvc-0", forged_labels, "forged-uid").await;
    h.client
        .clone()
        .start(fixed_claim_start("app-a", "app-b-exec-2-pvc-0"))
        .await
        .expect("Start app-a");
    h.set_total("app-a", 1).await;
    until("app-a's executor on the claim it named", async || {
        pods_and_claims(&h, "app-a").await == [pair("app-a-exec-1", "app-b-exec-2-pvc-0")]
    })
    .await;
    let squatted = [
        claim_identity(&h, "app-b-exec-1-pvc-0").await,
        claim_identity(&h, "app-b-exec-2-pvc-0").await,
    ];
    // Old enough to be reused, were they the victim's.
    h.clock.advance(Duration::from_secs(5));

    let driver_uid = create_driver(&h, "drv-b").await;
    start(&h, victim, "drv-b", proto::AllocationSettings::default()).await;
    h.set_total(victim, 2).await;
    // Executors 1 and 2 fail (their claims' names are taken); later ids get claims of
    // their own.
    rounds_until(
        &h,
        "two executors of the victim on claims of their own",
        async || pods_and_claims(&h, victim).await.len() == 2,
    )
    .await;
    let pods = pods_and_claims(&h, victim).await;
    for (pod, claim) in &pods {
        assert!(
            !claim.starts_with("app-b-exec-1-") && !claim.starts_with("app-b-exec-2-"),
            "{pod} mounts the squatted claim {claim}: {pods:?}"
        );
        let (_, app, owners) = claim_identity(&h, claim).await;
        assert_eq!(
            (app.as_str(), owners),
            (victim, vec![driver_uid.clone()]),
            "{claim}"
        );
    }
    let status = h.status(victim).await.expect("GetStatus");
    let failure = status.profiles[0]
        .last_create_failure
        .clone()
        .expect("the failed creates are reported");
    assert_eq!(failure.code, "ALREADY_EXISTS", "{failure:?}");
    assert!(
        failure.message.contains("app-b-exec-1-pvc-0")
            || failure.message.contains("app-b-exec-2-pvc-0"),
        "{failure:?}"
    );
    assert!(failure.total_failures >= 2, "{failure:?}");
    // The squatted claims are untouched.
    assert_eq!(claim_identity(&h, "app-b-exec-1-pvc-0").await, squatted[0]);
    assert_eq!(claim_identity(&h, "app-b-exec-2-pvc-0").await, squatted[1]);

    // The squatter's Stop takes nothing of the victim's.
    let victims_claims: Vec<String> = pods.iter().map(|(_, c)| c.clone()).collect();
    h.client
        .clone()
        .stop(proto::StopRequest {
            application_id: "app-a".into(),
        })
        .await
        .expect("Stop app-a");
    assert_eq!(pods_and_claims(&h, victim).await, pods);
    let names = claim_names(&h).await;
    for claim in &victims_claims {
        assert!(names.contains(claim), "{claim} deleted: {names:?}");
    }
}

#[tokio::test]
async fn a_pod_owned_claims_name_taken_creates_no_pod_and_stop_deletes_only_the_applications_claims()
 {
    let h = harness().await;
    let app = "app-pod";
    let labels = json!({"spark-app-selector": app, "spark-role": "executor"});
    squat(&h, "app-pod-exec-1-pvc-0", labels.clone(), "forged-uid").await;
    // Not a name the application uses, but its labels: Stop's delete must not take it.
    squat(&h, "labelled-alike", labels, "forged-uid").await;
    start(&h, app, "", proto::AllocationSettings::default()).await;
    h.set_total(app, 1).await;
    rounds_until(&h, "an executor on a claim of its own", async || {
        pods_and_claims(&h, app).await.len() == 1
    })
    .await;
    assert_eq!(
        pods_and_claims(&h, app).await,
        [pair("app-pod-exec-2", "app-pod-exec-2-pvc-0")]
    );
    // Executor 1's pod was never created to wait on a claim that is not its own.
    let pod_creates: Vec<_> = (h.sim.requests().into_iter())
        .filter(|((_, verb, resource), _)| verb == "create" && resource == "pods")
        .collect();
    assert_eq!(
        pod_creates.iter().map(|(_, n)| *n).sum::<u64>(),
        1,
        "{pod_creates:?}"
    );
    let status = h.status(app).await.expect("GetStatus");
    let failure = status.profiles[0]
        .last_create_failure
        .clone()
        .expect("failure");
    assert!(
        failure.message.contains("app-pod-exec-1-pvc-0"),
        "{failure:?}"
    );
    h.client
        .clone()
        .stop(proto::StopRequest {
            application_id: app.into(),
        })
        .await
        .expect("Stop");
    assert_eq!(
        claim_names(&h).await,
        ["app-pod-exec-1-pvc-0", "labelled-alike"]
    );
}

/// Claim template number `index` of 10Gi with `extra` merged into its spec, and
/// `annotations`.
fn claim_template_with(
    index: u32,
    extra: serde_json::Value,
    annotations: serde_json::Value,
) -> String {
    let mut claim: serde_json::Value =
        serde_json::from_str(&numbered_claim_template(index, "10Gi")).unwrap();
    for (key, value) in extra.as_object().cloned().unwrap_or_default() {
        claim["spec"][key] = value;
    }
    claim["metadata"]["annotations"] = annotations;
    claim.to_string()
}

/// The server's pod policy, but claims may only use class `gp3`.
async fn gp3_only_harness() -> Harness {
    let mut config = Settings::default();
    config.pod_policy = PodPolicy {
        allowed_storage_classes: vec!["gp3".into()],
        ..PodPolicy::default()
    };
    Harness::start_with_config(quiet_cluster(), ServeSettings::default(), config).await
}

#[tokio::test]
async fn claims_reaching_other_volumes_classes_or_namespaces_are_refused_naming_the_path() {
    let h = gp3_only_harness().await;
    let beta_class = "volume.beta.kubernetes.io/storage-class";
    let rows = [
        (
            json!({"volumeName": "pv-released"}),
            json!({}),
            "spec.volumeName".to_string(),
        ),
        (
            json!({"selector": {"matchLabels": {"tenant": "b"}}}),
            json!({}),
            "spec.selector".to_string(),
        ),
        (
            json!({"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "data", "namespace": "team-b"}}),
            json!({}),
            "spec.dataSourceRef.namespace".to_string(),
        ),
        // No class of its own, the annotation naming one outside the list.
        (
            json!({"storageClassName": null}),
            json!({beta_class: "fast-local"}),
            format!("metadata.annotations[{beta_class}]"),
        ),
    ];
    for (i, (extra, annotations, path)) in rows.into_iter().enumerate() {
        let app = format!("app-refused-{i}");
        let status = h
            .client
            .clone()
            .start(proto::StartRequest {
                executor_pod_template: POD_TEMPLATE.into(),
                executor_claim_templates: vec![
                    claim_template("10Gi"),
                    claim_template_with(1, extra, annotations),
                ],
                ..start_request(&app, NS)
            })
            .await
            .unwrap_err();
        assert_invalid(&status, "executor_claim_templates[1]");
        assert!(
            status
                .message()
                .starts_with(&format!("executor_claim_templates[1]: {path}: ")),
            "{path}: {status:?}"
        );
        assert!(h.status(&app).await.is_err(), "{app} was started");
    }
    assert!(claim_names(&h).await.is_empty());
}

/// The executor pod template with a generic ephemeral volume of `spec`.
fn ephemeral_template(spec: serde_json::Value) -> String {
    json!({"spec": {
        "containers": [{"name": "spark-kubernetes-executor", "image": "spark:4",
            "volumeMounts": [{"name": "scratch", "mountPath": "/data"}]}],
        "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}]
    }})
    .to_string()
}

#[tokio::test]
async fn ephemeral_volumes_meet_the_claim_policy_at_start_and_set_total_expected() {
    let h = gp3_only_harness().await;
    let prefix = "spec.volumes[0].ephemeral.volumeClaimTemplate.spec";
    let sized = |extra: serde_json::Value| {
        let mut spec = json!({"accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}}});
        for (key, value) in extra.as_object().cloned().unwrap_or_default() {
            spec[key] = value;
        }
        spec
    };
    let rows = [
        (json!({"volumeName": "pv-released"}), "volumeName"),
        (json!({"selector": {"matchLabels": {"a": "b"}}}), "selector"),
        (json!({"storageClassName": "io2"}), "storageClassName"),
        (
            json!({"resources": {"requests": {"storage": "2Ti"}}}),
            "resources.requests.storage",
        ),
    ];
    for (i, (extra, field)) in rows.iter().enumerate() {
        let app = format!("app-ephemeral-{i}");
        let status = h
            .client
            .clone()
            .start(proto::StartRequest {
                executor_pod_template: ephemeral_template(sized(extra.clone())),
                ..start_request(&app, NS)
            })
            .await
            .unwrap_err();
        assert_invalid(&status, "executor_pod_template");
        assert!(
            status.message().contains(&format!("{prefix}.{field}: ")),
            "{field}: {status:?}"
        );
    }
    // A profile added later is held to it as well.
    let app = "app-ephemeral-later";
    h.client
        .clone()
        .start(start_request(app, NS))
        .await
        .expect("Start");
    let status = h
        .client
        .clone()
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: app.into(),
            executors_per_profile: [(2, 1)].into(),
            resource_profile_templates: [(2, ephemeral_template(sized(rows[0].0.clone())))].into(),
        })
        .await
        .unwrap_err();
    assert_invalid(&status, "resource_profile_templates[2]");
    assert!(
        status.message().contains(&format!("{prefix}.volumeName: ")),
        "{status:?}"
    );
    // Within the policy it runs.
    h.client
        .clone()
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: app.into(),
            executors_per_profile: [(2, 1)].into(),
            resource_profile_templates: [(2, ephemeral_template(sized(json!({}))))].into(),
        })
        .await
        .expect("an ephemeral volume within the policy");
    until("the profile's executor", async || {
        h.pods(NS, app).await.len() == 1
    })
    .await;
}
