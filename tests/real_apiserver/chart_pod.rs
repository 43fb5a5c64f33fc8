//! The chart's pod for real: `helm install` with the chart's defaults (only
//! `allowedNamespaces` set, and one replica: the process node's pods share the host's
//! network, so a second replica could not bind the same ports) on a control plane whose
//! only node is a process node that runs containers with podman. The pod is the chart's
//! image, with the chart's ServiceAccount token (projected by the node through the
//! TokenRequest API), TLS Secret, RBAC and ConfigMap; it answers gRPC health on the probes'
//! port and a Start over TLS with a driver's token; the README's `spark-submit` runs a Spark
//! job through it (`spark_submit`); `helm uninstall` stops its container. The release, its
//! namespace and the drivers' are the README's (`allocator`, `spark-system`, `spark-jobs`).
//!
//! Runs when `TEST_CHART_IMAGE` names the chart's image in podman's storage (`.ci/run` sets
//! it once `scripts/build-image.sh` built it), the Spark job when `TEST_PLUGIN_JAR` names
//! the plugin's jar (`.ci/run`: the release's).

mod spark_submit;

use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::wait_until_serving;
use spark_pod_allocator_sim::{KubeletRuntime, KubeletSettings, ProcessImage, run_process_node};
use test_kit::apiserver::{CONTROL_PLANE, RealApiServer, binary, create_service_account};
use test_kit::cluster::chart;
use test_kit::grpc::start_request;
use test_kit::requests::{as_caller, status_request};
use test_kit::wait::{eventually, until};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

use crate::chart::Helm;

const RELEASE: &str = "allocator";
const NAMESPACE: &str = "spark-system";
const DRIVERS: &str = "spark-jobs";
/// The chart's name for the release's objects (its Service, ServiceAccount, CA ConfigMap).
const FULLNAME: &str = "allocator-spark-pod-allocator";

/// `podman` as `scripts/build-image.sh` runs it on this kind of machine: the cgroupfs
/// manager, no default ulimits, runc.
fn podman(dir: &Path) -> Vec<String> {
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = []\n\n[engine]\ncgroup_manager = \"cgroupfs\"\nruntime = \"runc\"\n",
    )
    .expect("containers.conf");
    vec![
        "env".into(),
        format!("CONTAINERS_CONF={}", conf.display()),
        "podman".into(),
        "--runtime".into(),
        "runc".into(),
    ]
}

async fn create<K>(api: Api<K>, value: serde_json::Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(value).expect("object"),
    )
    .await
    .expect("create");
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[tokio::test]
async fn the_charts_pod_serves_over_tls_and_runs_the_readmes_spark_submit() {
    let Some(bin) = binary() else { return };
    let Ok(image) = std::env::var("TEST_CHART_IMAGE") else {
        eprintln!("TEST_CHART_IMAGE is unset (the chart's image in podman): skipped");
        return;
    };
    // The process node is the only node: the chart's pod can only go there.
    let server =
        RealApiServer::start_configured(&bin, &[CONTROL_PLANE, "--kwok-nodes", "0"], &[], false);
    let admin = server.admin_client().await;
    let work = tempfile::tempdir().expect("work dir");
    let spark = spark_submit::Spark::prepare().await;
    let mut process_images = vec![ProcessImage {
        image,
        command: podman(work.path()),
        env: vec![],
        container: true,
    }];
    process_images.extend(spark.iter().flat_map(|s| s.process_images()));
    let settings = KubeletSettings {
        runtime: KubeletRuntime::Process,
        work_dir: Some(work.path().join("pods")),
        process_images,
        ..KubeletSettings::default()
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn({
        let client = admin.clone();
        let api_server: http::Uri = server.url.parse().expect("the API server's URL");
        async move {
            run_process_node(client, &api_server, &settings, "process-node", async {
                let _ = stop_rx.await;
            })
            .await
        }
    });
    for namespace in [NAMESPACE, DRIVERS] {
        create(
            Api::<Namespace>::all(admin.clone()),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .await;
    }

    let helm = Helm::new(server.dir().join("kubeconfig"));
    let chart = chart();
    let chart = chart.to_str().expect("a UTF-8 path");
    let drivers = format!("allowedNamespaces={{{DRIVERS}}}");
    let notes = helm
        .run(&[
            "install",
            RELEASE,
            chart,
            "-n",
            NAMESPACE,
            "--set",
            &drivers,
            "--set",
            "replicaCount=1",
        ])
        .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/instance={RELEASE}");
    let pod = eventually("the chart's pod Running", async || {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()?;
        list.items.into_iter().find(running)
    })
    .await;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let log = work
        .path()
        .join("pods")
        .join(NAMESPACE)
        .join(format!("{name}-{uid}"))
        .join("allocator.log");
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let _shown = ShowOnPanic(log.clone());
    // Declared after `_shown`, so dropped before it: the log is printed once the container is
    // gone.
    let _removed = RemoveOnPanic {
        podman: podman(work.path()),
        uid: uid.clone(),
    };

    // The probes' port: plaintext grpc.health.v1, SERVING once the watches synced (with the
    // chart's ServiceAccount token and RBAC).
    let health = Endpoint::from_static("http://127.0.0.1:8081");
    let channel = eventually("the health port accepts", async || {
        health.connect().await.ok()
    })
    .await;
    if let Err(e) = wait_until_serving(channel).await {
        panic!("health: {e}\nthe pod's log:\n{}", logged());
    }

    // The gRPC port over TLS, trusted with the CA the chart publishes in the drivers'
    // namespace, for the Service's name the certificate covers.
    let ca = Api::<ConfigMap>::namespaced(admin.clone(), DRIVERS)
        .get(&format!("{FULLNAME}-ca"))
        .await
        .expect("the CA's ConfigMap")
        .data
        .and_then(|d| d.get("ca.crt").cloned())
        .expect("ca.crt");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(format!("{FULLNAME}.{NAMESPACE}.svc"));
    let channel = Endpoint::from_static("https://127.0.0.1:50051")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("TLS connect: {e}\nthe pod's log:\n{}", logged()));
    let mut client = ExecutorAllocatorClient::new(channel);

    // A driver's identity: a ServiceAccount of the drivers' namespace that may manage pods
    // there, with a token for the chart's audience.
    create_service_account(&admin, DRIVERS, "driver").await;
    create(
        Api::<Role>::namespaced(admin.clone(), DRIVERS),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "driver"},
            "rules": [{"apiGroups": [""], "resources": ["pods"],
                "verbs": ["create", "delete", "get", "list", "watch"]}]}),
    )
    .await;
    create(
        Api::<RoleBinding>::namespaced(admin.clone(), DRIVERS),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "driver"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "driver"},
            "subjects": [{"kind": "ServiceAccount", "name": "driver", "namespace": DRIVERS}]}),
    )
    .await;
    let token = test_kit::apiserver::service_account_token_for(
        &admin,
        DRIVERS,
        "driver",
        &["spark-pod-allocator"],
    )
    .await;
    let started = client
        .start(as_caller(&token, start_request("app-chart-pod", DRIVERS)))
        .await;
    if let Err(e) = started {
        panic!("Start: {e:?}\nthe pod's log:\n{}", logged());
    }
    client
        .get_status(as_caller(&token, status_request("app-chart-pod")))
        .await
        .expect("GetStatus");
    let refused = client
        .get_status(status_request("app-chart-pod"))
        .await
        .expect_err("a call without a token");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // The service spoke to the API server as the chart's ServiceAccount, with the token the
    // node projected (in-cluster configuration: no kubeconfig in the pod).
    let account = format!("system:serviceaccount:{NAMESPACE}:{FULLNAME}");
    let used = server.audit_events().iter().any(|e| {
        e["user"]["username"] == account.as_str()
            && e["user"]["extra"]["authentication.kubernetes.io/pod-name"][0] == name.as_str()
    });
    assert!(
        used,
        "no request of {account} with a token bound to the pod in the audit log"
    );

    // The install's NOTES and the plugin's README give the README's spark-submit, and a Spark
    // job runs it through the pod.
    spark_submit::assert_one_example(&notes);
    if let Some(spark) = &spark {
        spark
            .run_readme_example(
                &admin,
                &server,
                work.path(),
                DRIVERS,
                &format!("{FULLNAME}.{NAMESPACE}"),
            )
            .await;
    }

    // `helm uninstall`: the pod's deletion stops the container (SIGTERM through podman), the
    // node confirms, and podman has no container of it left.
    helm.run(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait"])
        .await;
    until("the chart's pod gone", async || {
        pods.get_opt(&name).await.is_ok_and(|p| p.is_none())
    })
    .await;
    let mut listing = tokio::process::Command::new(&podman(work.path())[0]);
    listing.args(&podman(work.path())[1..]).args([
        "ps",
        "--all",
        "--quiet",
        "--filter",
        &format!("name={uid}"),
    ]);
    let listed = listing.output().await.expect("podman ps");
    assert!(
        listed.status.success() && listed.stdout.is_empty(),
        "a container of the pod is left: {}",
        String::from_utf8_lossy(&listed.stdout)
    );

    let _ = stop_tx.send(());
    node.await.expect("node task").expect("process node");
    server.stop();
}

/// Prints the pod's log when the test fails.
struct ShowOnPanic(std::path::PathBuf);

impl Drop for ShowOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "the chart's pod's log ({}):\n{}",
                self.0.display(),
                std::fs::read_to_string(&self.0).unwrap_or_default()
            );
        }
    }
}

/// Removes the pod's container when the test fails: the process node stops with the test's
/// runtime, and a killed engine client leaves its container running, holding the host's ports
/// the next run needs.
struct RemoveOnPanic {
    podman: Vec<String>,
    uid: String,
}

impl Drop for RemoveOnPanic {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let engine = || {
            let mut command = std::process::Command::new(&self.podman[0]);
            command.args(&self.podman[1..]);
            command
        };
        let Ok(listed) = engine()
            .args(["ps", "--all", "--quiet", "--filter"])
            .arg(format!("name={}", self.uid))
            .output()
        else {
            return;
        };
        for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
            let _ = engine().args(["rm", "--force", "--time", "0", id]).status();
        }
    }
}
