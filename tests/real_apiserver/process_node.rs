//! The process node (`spark-pod-allocator process-node`, crates/sim/src/node.rs) on the real
//! control plane: the real scheduler binds pods to it, it runs them as local processes and
//! reports them as a kubelet does; a graceful deletion ends with its grace-0 confirmation;
//! its provisioner binds a claim the scheduler gave it. The Spark job on it is
//! `clients/spark` `SparkOnControlPlaneIT`.

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use spark_pod_allocator_sim::{
    KubeletRuntime, KubeletSettings, PROCESS_NODE_PROVISIONER, ProcessImage, run_process_node,
};
use test_kit::apiserver::{CONTROL_PLANE, RealApiServer, binary};
use test_kit::wait::{eventually, until};

const NODE: &str = "process-node";

/// A pod for the process node: `sh -c SCRIPT`.
fn pod(name: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "terminationGracePeriodSeconds": 30,
            "containers": [{"name": "main", "image": "shell", "args": [script],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]
        }
    }))
    .expect("pod")
}

fn phase(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

#[tokio::test]
async fn pods_bound_to_the_process_node_run_as_processes_and_report_as_a_kubelet_does() {
    let Some(bin) = binary() else { return };
    // No kwok node: every pod here can only go to the process node.
    let server =
        RealApiServer::start_configured(&bin, &[CONTROL_PLANE, "--kwok-nodes", "0"], &[], false);
    let admin = server.admin_client().await;
    let work = tempfile::tempdir().expect("work dir");
    let settings = KubeletSettings {
        runtime: KubeletRuntime::Process,
        work_dir: Some(work.path().to_path_buf()),
        process_images: vec![ProcessImage {
            image: "shell".into(),
            command: vec!["sh".into(), "-c".into()],
            env: vec![],
            container: false,
        }],
        ..KubeletSettings::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn({
        let client = admin.clone();
        let api_server: http::Uri = server.url.parse().expect("the API server's URL");
        async move {
            run_process_node(client, &api_server, &settings, NODE, async {
                let _ = stop_rx.await;
            })
            .await
        }
    });
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");

    // A process that exits 3: Failed, its container terminated with the code. Its
    // environment had the pod IP (the script checks it).
    pods.create(
        &PostParams::default(),
        &pod("exits", r#"[ "$POD_IP" = 127.0.0.1 ] || exit 9; exit 3"#),
    )
    .await
    .expect("create");
    let exited = eventually("the exiting pod Failed", async || {
        let p = pods.get("exits").await.ok()?;
        (phase(&p) == "Failed").then_some(p)
    })
    .await;
    assert_eq!(exit_code(&exited), Some(3));
    let spec = exited.spec.clone().unwrap_or_default();
    assert_eq!(spec.node_name.as_deref(), Some(NODE));
    let status = exited.status.clone().unwrap_or_default();
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));

    // A process that runs: Running and ready; a graceful delete sends SIGTERM (the shell's
    // trap answers with exit 0 at once), and the node confirms with a grace-0 delete.
    pods.create(
        &PostParams::default(),
        &pod("runs", "trap 'exit 0' TERM; while true; do sleep 0.1; done"),
    )
    .await
    .expect("create");
    until("the running pod Running and ready", async || {
        pods.get("runs").await.is_ok_and(|p| {
            phase(&p) == "Running"
                && p.status
                    .and_then(|s| s.container_statuses)
                    .is_some_and(|c| c.iter().all(|c| c.ready))
        })
    })
    .await;
    pods.delete("runs", &DeleteParams::default())
        .await
        .expect("delete");
    until("the deleted pod gone", async || {
        pods.get_opt("runs").await.is_ok_and(|p| p.is_none())
    })
    .await;
    let events = server.audit_events();
    // The test's own delete has no grace period of its own: the grace-0 one is the node's.
    let confirmed = events.iter().any(|e| {
        e["verb"] == "delete"
            && e["objectRef"]["name"] == "runs"
            && e["requestObject"]["gracePeriodSeconds"] == 0
    });
    assert!(
        confirmed,
        "no grace-0 delete of the pod in the audit log (the node's confirmation)"
    );
    let binding = events.iter().any(|e| {
        e["objectRef"]["name"] == "runs"
            && e["objectRef"]["subresource"] == "binding"
            && e["user"]["username"] == "system:kube-scheduler"
    });
    assert!(binding, "the scheduler did not bind the pod");

    // A claim of the node's StorageClass: bound by the node's provisioner once the scheduler
    // picked the node; the pod writes into it, and the file is in the volume's directory.
    let classes: Api<StorageClass> = Api::all(admin.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "local"}, "provisioner": PROCESS_NODE_PROVISIONER,
                "volumeBindingMode": "WaitForFirstConsumer"
            }))
            .expect("class"),
        )
        .await
        .expect("create class");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data"},
                "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .expect("claim"),
        )
        .await
        .expect("create claim");
    // The mount path reaches the process through its environment, rewritten to the volume's
    // directory (a literal path inside a shell script is not).
    let mut writer = pod("writes", r#"echo kept > "$DATA/file""#);
    let mut spec = writer.spec.take().unwrap_or_default();
    spec.volumes = Some(vec![
        serde_json::from_value(
            json!({"name": "d", "persistentVolumeClaim": {"claimName": "data"}}),
        )
        .expect("volume"),
    ]);
    if let Some(c) = spec.containers.first_mut() {
        c.env
            .get_or_insert_with(Vec::new)
            .push(serde_json::from_value(json!({"name": "DATA", "value": "/data"})).expect("env"));
        c.volume_mounts = Some(vec![
            serde_json::from_value(json!({"name": "d", "mountPath": "/data"})).expect("mount"),
        ]);
    }
    writer.spec = Some(spec);
    pods.create(&PostParams::default(), &writer)
        .await
        .expect("create");
    until("the writing pod Succeeded", async || {
        pods.get("writes")
            .await
            .is_ok_and(|p| phase(&p) == "Succeeded")
    })
    .await;
    let claim = claims.get("data").await.expect("claim");
    let volume_name = claim.spec.and_then(|s| s.volume_name).expect("bound claim");
    assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    let volume = Api::<PersistentVolume>::all(admin.clone())
        .get(&volume_name)
        .await
        .expect("volume");
    let path = volume
        .spec
        .and_then(|s| s.host_path)
        .map(|h| h.path)
        .expect("hostPath volume");
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&path).join("file")).ok(),
        Some("kept\n".to_string())
    );

    // What a pod takes from the API server: a Secret as a volume and as a variable, the
    // ServiceAccount admission's kube-api-access volume (a token bound to the pod, the
    // cluster's CA, the namespace) and a projected token of another audience, and the
    // API server's address as KUBERNETES_SERVICE_HOST/PORT. The script checks what it can
    // see (the mount paths reach it through its environment, rewritten) and leaves the
    // address for the test.
    Api::<Secret>::namespaced(admin.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds"},
                "stringData": {"password": "pa$(X)ss"}
            }))
            .expect("secret"),
        )
        .await
        .expect("create secret");
    let script = r#"set -e
        [ "$PASSWORD" = 'pa$(X)ss' ]
        [ "$(cat "$CREDS/password")" = 'pa$(X)ss' ]
        [ "$(cat "$SA/namespace")" = default ]
        grep -q 'BEGIN CERTIFICATE' "$SA/ca.crt"
        [ -s "$SA/token" ] && [ -s "$TOKENS/allocator" ]
        echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT" > endpoint"#;
    let mut reader = pod("reads", script);
    let mut spec = reader.spec.take().unwrap_or_default();
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "creds", "secret": {"secretName": "creds"}}))
            .expect("volume"),
        serde_json::from_value(json!({"name": "tokens", "projected": {"sources": [
            {"serviceAccountToken": {"audience": "spark-pod-allocator", "expirationSeconds": 600, "path": "allocator"}}
        ]}}))
        .expect("volume"),
    ]);
    if let Some(c) = spec.containers.first_mut() {
        let env = c.env.get_or_insert_with(Vec::new);
        for variable in [
            json!({"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}),
            json!({"name": "CREDS", "value": "/etc/creds"}),
            json!({"name": "TOKENS", "value": "/var/run/tokens"}),
            json!({"name": "SA", "value": "/var/run/secrets/kubernetes.io/serviceaccount"}),
        ] {
            env.push(serde_json::from_value(variable).expect("env"));
        }
        c.volume_mounts = Some(vec![
            serde_json::from_value(json!({"name": "creds", "mountPath": "/etc/creds"}))
                .expect("mount"),
            serde_json::from_value(json!({"name": "tokens", "mountPath": "/var/run/tokens"}))
                .expect("mount"),
        ]);
    }
    reader.spec = Some(spec);
    pods.create(&PostParams::default(), &reader)
        .await
        .expect("create");
    let read = eventually("the reading pod ended", async || {
        let p = pods.get("reads").await.ok()?;
        matches!(phase(&p).as_str(), "Succeeded" | "Failed").then_some(p)
    })
    .await;
    let uid = read.metadata.uid.clone().unwrap_or_default();
    let pod_dir = work.path().join("default").join(format!("reads-{uid}"));
    assert_eq!(
        phase(&read),
        "Succeeded",
        "the pod's checks failed: {}",
        std::fs::read_to_string(pod_dir.join("main.log")).unwrap_or_default()
    );
    let endpoint = std::fs::read_to_string(pod_dir.join("endpoint")).expect("endpoint file");
    assert_eq!(
        format!("https://{}", endpoint.trim()),
        server.url,
        "KUBERNETES_SERVICE_HOST/PORT are not the API server's address"
    );
    let admission_volume = read
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.iter().find(|v| v.name.starts_with("kube-api-access-")))
        .map(|v| v.name.clone())
        .expect("the ServiceAccount admission's volume");
    let review = async |token_file: std::path::PathBuf, audiences: Vec<&str>| -> Value {
        let token = std::fs::read_to_string(&token_file).expect("token file");
        let review: TokenReview = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences}
        }))
        .expect("review");
        let answer = Api::<TokenReview>::all(admin.clone())
            .create(&PostParams::default(), &review)
            .await
            .expect("token review");
        serde_json::to_value(answer.status).expect("status")
    };
    let volumes = pod_dir.join("volumes");
    for (file, audiences) in [
        (volumes.join(&admission_volume).join("token"), vec![]),
        (
            volumes.join("tokens").join("allocator"),
            vec!["spark-pod-allocator"],
        ),
    ] {
        let status = review(file.clone(), audiences).await;
        assert_eq!(status["authenticated"], true, "{file:?}: {status}");
        assert_eq!(
            status["user"]["username"], "system:serviceaccount:default:default",
            "{file:?}: {status}"
        );
        assert_eq!(
            status["user"]["extra"]["authentication.kubernetes.io/pod-name"][0], "reads",
            "{file:?}: the token is not bound to the pod: {status}"
        );
    }

    let _ = stop_tx.send(());
    node.await.expect("node task").expect("process node");
    server.stop();
}
