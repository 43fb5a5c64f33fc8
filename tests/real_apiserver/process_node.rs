//! The process node (`spark-pod-allocator process-node`, crates/sim/src/node.rs) on the real
//! control plane: the real scheduler binds pods to it, it runs them as local processes and
//! reports them as a kubelet does; a graceful deletion ends with its grace-0 confirmation;
//! its provisioner binds a claim the scheduler gave it. The Spark job on it is
//! `clients/spark` `SparkOnControlPlaneIT`.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
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
        }],
        ..KubeletSettings::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn({
        let client = admin.clone();
        async move {
            run_process_node(client, &settings, NODE, async {
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

    let _ = stop_tx.send(());
    node.await.expect("node task").expect("process node");
    server.stop();
}
