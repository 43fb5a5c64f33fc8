//! The README's `spark-submit`, copied verbatim from between its `spark-submit:begin` and
//! `spark-submit:end` markers, run in client mode by a Spark driver pod made from the chart's
//! example driver pod template (`helm/spark-pod-allocator/examples/driver-pod-template.yaml`,
//! which mounts the token for the service's audience and the CA) on the process node: the
//! driver's plugin reaches the chart's pod over TLS at the Service's name, and the executors it
//! asks for are created by the chart's ServiceAccount and run the job.
//!
//! Only the README's placeholders are filled in: `KUBERNETES-API:443` (the API server) and
//! `...` (the application and what the process node needs of a client-mode driver: the
//! in-cluster credentials' files, which fabric8 reads at fixed paths, and the executors' image
//! and address). The process node runs the driver's image as `clients/spark/spark-submit.sh`
//! (`spark-submit` from Maven's jars), Spark's executors as `scripts/sim-spark-executor.sh`, and
//! rewrites the mount paths in the command's arguments (`docs/process-runtime.md`). Its pods
//! share the host's network, where no cluster DNS resolves the Service's name: a hosts file
//! given to the driver's JVM (`-Djdk.net.hosts.file`, through `SPARK_SUBMIT_OPTS`) maps it to
//! 127.0.0.1, where the chart's pod listens on the Service's port.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use spark_pod_allocator_sim::{ImageEnv, ProcessImage};
use test_kit::apiserver::{RealApiServer, create_service_account};
use test_kit::wait::progressing;

use super::create;

/// The driver container's image in the test's driver pod, and Spark's executors' image.
const DRIVER_IMAGE: &str = "spark-driver:readme";
const EXECUTOR_IMAGE: &str = "spark:readme";
/// The Spark version of the driver and the executors (the newest the plugin is tested with).
const SPARK_VERSION: &str = "4.2.0";
/// The application: ExampleJob sums 1..N.
const N: u32 = 1000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `spark-submit` block between the README's markers, as written there.
pub(super) fn readme_example() -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let (_, rest) = readme
        .split_once("<!-- spark-submit:begin -->")
        .expect("the README's spark-submit:begin marker");
    let (block, _) = rest
        .split_once("<!-- spark-submit:end -->")
        .expect("the README's spark-submit:end marker");
    let block = block.trim();
    let body = block
        .strip_prefix("```sh\n")
        .and_then(|b| b.strip_suffix("```"))
        .expect("a ```sh block between the markers");
    body.trim_end().to_string()
}

/// The README's example is the one the release's NOTES (`notes`, indented there) and the
/// plugin's README give.
pub(super) fn assert_one_example(notes: &str) {
    let example = readme_example();
    let lines = |text: &str| text.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    assert!(
        lines(notes).contains(&lines(&example)),
        "the NOTES do not give the README's spark-submit:\n{example}\nNOTES:\n{notes}"
    );
    let plugin = std::fs::read_to_string(repo().join("clients/spark/README.md"))
        .expect("clients/spark/README.md");
    assert!(
        plugin.contains(&example),
        "clients/spark/README.md does not give the README's spark-submit:\n{example}"
    );
}

/// The block's words as a shell splits them: continued lines joined, no quoting in it.
fn words(example: &str) -> Vec<String> {
    assert!(
        !example.contains(['\'', '"', '$', '`']),
        "the README's spark-submit has quoting or expansions, which this test does not split: {example}"
    );
    example
        .replace("\\\n", " ")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Resolves Spark's jars and builds the example job (`clients/spark/spark-submit.sh
/// --prepare`); returns Spark's classpath and the job's jar.
async fn prepare() -> (String, PathBuf) {
    let script = repo().join("clients/spark/spark-submit.sh");
    let status = tokio::process::Command::new("bash")
        .arg(&script)
        .arg("--prepare")
        .env("SPARK_VERSION", SPARK_VERSION)
        .status()
        .await
        .expect("spark-submit.sh runs");
    assert!(status.success(), "{} --prepare: {status}", script.display());
    let out = repo().join(format!("clients/spark/target/spark-submit-{SPARK_VERSION}"));
    let classpath = std::fs::read_to_string(out.join("classpath")).expect("Spark's classpath");
    (classpath.trim().to_string(), out.join("example-job.jar"))
}

/// What the README's example needs: the plugin's jar (`TEST_PLUGIN_JAR`, the release's),
/// Spark's classpath and the job.
pub(super) struct Spark {
    plugin_jar: PathBuf,
    classpath: String,
    job: PathBuf,
}

impl Spark {
    /// `None` (and why) without `TEST_PLUGIN_JAR`.
    pub(super) async fn prepare() -> Option<Self> {
        let Ok(plugin_jar) = std::env::var("TEST_PLUGIN_JAR") else {
            eprintln!(
                "TEST_PLUGIN_JAR is unset (the plugin's jar): the README's spark-submit skipped"
            );
            return None;
        };
        let (classpath, job) = prepare().await;
        Some(Self {
            plugin_jar: PathBuf::from(plugin_jar),
            classpath,
            job,
        })
    }

    /// The process node's images for the driver's pod and Spark's executors.
    pub(super) fn process_images(&self) -> Vec<ProcessImage> {
        let script = |path: &str| vec!["bash".into(), repo().join(path).display().to_string()];
        vec![
            ProcessImage {
                image: DRIVER_IMAGE.into(),
                command: script("clients/spark/spark-submit.sh"),
                env: vec![ImageEnv {
                    name: "SPARK_VERSION".into(),
                    value: SPARK_VERSION.into(),
                }],
                container: false,
            },
            ProcessImage {
                image: EXECUTOR_IMAGE.into(),
                command: script("scripts/sim-spark-executor.sh"),
                env: vec![ImageEnv {
                    name: "SPARK_SIM_CLASSPATH".into(),
                    value: self.classpath.clone(),
                }],
                container: false,
            },
        ]
    }

    /// Runs the README's spark-submit in a driver pod of `drivers` against the chart's
    /// `service` (`fullname.namespace`) and checks the job's result and that the chart's
    /// ServiceAccount, not the driver, created the executors.
    pub(super) async fn run_readme_example(
        &self,
        admin: &Client,
        server: &RealApiServer,
        work: &Path,
        drivers: &str,
        service: &str,
    ) {
        let template = std::fs::read_to_string(
            repo().join("helm/spark-pod-allocator/examples/driver-pod-template.yaml"),
        )
        .expect("the driver pod template");
        let mut pod: Value = serde_yaml::from_str(&template).expect("the template's YAML");
        assert_eq!(
            pod["metadata"]["namespace"], drivers,
            "the template's namespace"
        );
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();

        let example = readme_example();
        let mut words = words(&example);
        assert_eq!(
            words.first().map(String::as_str),
            Some("spark-submit"),
            "{example}"
        );
        words.remove(0);
        let jar_name = self
            .plugin_jar
            .file_name()
            .and_then(|n| n.to_str())
            .expect("the plugin jar's name");
        let jar_dir = self
            .plugin_jar
            .parent()
            .expect("the plugin jar's directory");
        assert!(
            example.contains(&format!("local:///opt/spark-pod-allocator/{jar_name}")),
            "the README's spark-submit does not name the plugin's jar {jar_name}: {example}"
        );
        let api = server
            .url
            .strip_prefix("https://")
            .expect("an https API server");
        let mut args = Vec::new();
        for word in words {
            match word.as_str() {
                "..." => args.extend(self.application(&name)),
                _ => args.push(word.replace("KUBERNETES-API:443", api)),
            }
        }

        // The driver's ServiceAccount (the template's) with the rights of a client-mode driver
        // (its executor ConfigMap, its own pod, what Spark deletes by label when it stops) and
        // the pod rights the service checks.
        create_service_account(admin, drivers, "spark-driver").await;
        create(
            Api::<Role>::namespaced(admin.clone(), drivers),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "spark-driver"},
                "rules": [{"apiGroups": [""], "resources": ["pods", "configmaps", "services",
                    "persistentvolumeclaims"],
                    "verbs": ["create", "delete", "deletecollection", "get", "list", "watch",
                        "patch"]}]}),
        )
        .await;
        create(
            Api::<RoleBinding>::namespaced(admin.clone(), drivers),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "spark-driver"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "spark-driver"},
                "subjects": [{"kind": "ServiceAccount", "name": "spark-driver",
                    "namespace": drivers}]}),
        )
        .await;

        // The cluster's DNS for the driver's JVM: the Service's name is where the chart's
        // pod listens (the host's network).
        let hosts = work.join("hosts");
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
        std::fs::write(
            &hosts,
            format!("127.0.0.1 localhost {} {service}.svc\n", hostname.trim()),
        )
        .expect("hosts file");

        let container = &mut pod["spec"]["containers"][0];
        container["image"] = json!(DRIVER_IMAGE);
        container["command"] = json!(["spark-submit"]);
        container["args"] = json!(args);
        container["env"] = json!([{"name": "SPARK_SUBMIT_OPTS",
            "value": format!("-Djdk.net.hosts.file={}", hosts.display())}]);
        push(
            &mut container["volumeMounts"],
            json!({"name": "plugin", "mountPath": "/opt/spark-pod-allocator", "readOnly": true}),
        );
        push(
            &mut pod["spec"]["volumes"],
            json!({"name": "plugin", "hostPath": {"path": jar_dir, "type": "Directory"}}),
        );
        pod["spec"]["restartPolicy"] = json!("Never");
        let pods: Api<Pod> = Api::namespaced(admin.clone(), drivers);
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).expect("the driver pod"),
        )
        .await
        .expect("create the driver pod");

        // Until the driver's pod ends: the pods' logs grow while Spark starts and works.
        let logs = work.join("pods").join(drivers);
        let phase = async || {
            let pod = pods.get(&name).await.ok()?;
            pod.status.and_then(|s| s.phase)
        };
        let observed = progressing(
            async || (phase().await, logged_bytes(&logs)),
            |(phase, _)| matches!(phase.as_deref(), Some("Succeeded" | "Failed")),
        )
        .await;
        let driver = pods.get(&name).await.expect("the driver pod");
        let uid = driver.metadata.uid.unwrap_or_default();
        let log = std::fs::read_to_string(
            logs.join(format!("{name}-{uid}"))
                .join("spark-kubernetes-driver.log"),
        )
        .unwrap_or_default();
        let (phase, _) = observed
            .unwrap_or_else(|last| panic!("the driver stalled ({last:?}); its log:\n{log}"));
        assert_eq!(
            phase.as_deref(),
            Some("Succeeded"),
            "the driver's log:\n{log}"
        );
        let expected = format!("sum of 1..{N} = {} on executors [1, 2]", N * (N + 1) / 2);
        assert!(
            log.lines().any(|l| l == expected),
            "no {expected:?} in the driver's log:\n{log}"
        );

        // The executors are the service's: created by the chart's ServiceAccount, none by
        // the driver's.
        let (namespace, fullname) = service
            .split_once('.')
            .map(|(f, n)| (n, f))
            .expect("fullname.namespace");
        let creators: Vec<String> = server
            .audit_events()
            .into_iter()
            .filter(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["resource"] == "pods"
                    && e["objectRef"]["namespace"] == drivers
                    && e["responseStatus"]["code"] == 201
            })
            .map(|e| {
                e["user"]["username"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        let chart = format!("system:serviceaccount:{namespace}:{fullname}");
        assert_eq!(
            creators.iter().filter(|c| **c == chart).count(),
            2,
            "pod creates in {drivers} by {chart}: {creators:?}"
        );
        let driver = format!("system:serviceaccount:{drivers}:spark-driver");
        assert!(
            !creators.contains(&driver),
            "the driver created pods itself: {creators:?}"
        );
        eprintln!("the README's spark-submit: {expected:?}, its executors created by {chart}");
    }

    /// What replaces the README's `...`: the process node's needs of a client-mode driver
    /// (the in-cluster credentials' files, the executors' image, the driver's address and
    /// pod), two executors the job waits for, and the job.
    fn application(&self, driver_pod: &str) -> Vec<String> {
        let conf = [
            "spark.kubernetes.authenticate.oauthTokenFile=/var/run/secrets/kubernetes.io/serviceaccount/token",
            "spark.kubernetes.authenticate.caCertFile=/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
            &format!("spark.kubernetes.driver.pod.name={driver_pod}"),
            &format!("spark.kubernetes.container.image={EXECUTOR_IMAGE}"),
            "spark.driver.host=127.0.0.1",
            "spark.driver.bindAddress=127.0.0.1",
            "spark.executor.instances=2",
            "spark.executor.memory=512m",
            "spark.ui.enabled=false",
            "spark.scheduler.minRegisteredResourcesRatio=1",
            "spark.scheduler.maxRegisteredResourcesWaitingTime=10min",
        ];
        let mut args: Vec<String> = conf
            .iter()
            .flat_map(|c| ["--conf".to_string(), c.to_string()])
            .collect();
        args.extend([
            "--class".into(),
            "io.github.sparkpodallocator.spark.ExampleJob".into(),
            self.job.display().to_string(),
            N.to_string(),
        ]);
        args
    }
}

fn push(list: &mut Value, item: Value) {
    match list.as_array_mut() {
        Some(items) => items.push(item),
        None => *list = json!([item]),
    }
}

/// The bytes in every log file of the pods under `dir`.
fn logged_bytes(dir: &Path) -> u64 {
    let Ok(pods) = std::fs::read_dir(dir) else {
        return 0;
    };
    pods.flatten()
        .filter_map(|pod| std::fs::read_dir(pod.path()).ok())
        .flat_map(|files| files.flatten())
        .filter(|f| f.path().extension().is_some_and(|e| e == "log"))
        .filter_map(|f| f.metadata().ok())
        .map(|m| m.len())
        .sum()
}
