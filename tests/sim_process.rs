//! The simulated kubelet's process runtime with real processes: pods run `sh -c SCRIPT`
//! (the image's command is `sh -c`, the container's args are appended), their exits become
//! container states and phases, deletion signals them, and nothing outlives the cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use spark_pod_allocator_sim::{ImageEnv, KubeletRuntime, ProcessImage, SimCluster, SimSettings};
use test_kit::sim::*;
use test_kit::wait::*;

struct Fixture {
    sim: SimCluster,
    pods: Api<Pod>,
    work: tempfile::TempDir,
}

fn settings(work: &Path) -> SimSettings {
    let mut settings = SimSettings::default();
    settings.kubelet.runtime = KubeletRuntime::Process;
    settings.kubelet.start_delay_min_ms = 0;
    settings.kubelet.start_delay_max_ms = 0;
    settings.kubelet.work_dir = Some(work.to_path_buf());
    settings.kubelet.process_images = vec![ProcessImage {
        image: "sh:sim".into(),
        command: vec!["sh".into(), "-c".into()],
        env: vec![ImageEnv {
            name: "SPARK_SIM_CLASSPATH".into(),
            value: "/jars/*".into(),
        }],
        container: false,
    }];
    settings
}

async fn fixture() -> Fixture {
    let work = tempfile::tempdir().unwrap();
    let sim = SimCluster::start(settings(work.path())).await.unwrap();
    let pods = Api::namespaced(sim.try_client().unwrap(), "default");
    Fixture { sim, pods, work }
}

fn shell_pod(name: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"spark-exec-id": "7"}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "spark-kubernetes-executor", "image": "sh:sim", "args": [script]}]}
    }))
    .unwrap()
}

impl Fixture {
    async fn create(&self, pod: &Pod) -> Pod {
        self.pods.create(&PostParams::default(), pod).await.unwrap()
    }

    /// The pod's working directory (`WORK/NAMESPACE/NAME-UID`).
    fn dir(&self, pod: &Pod) -> PathBuf {
        let meta = &pod.metadata;
        self.work.path().join("default").join(format!(
            "{}-{}",
            meta.name.as_deref().unwrap(),
            meta.uid.as_deref().unwrap()
        ))
    }

    async fn phase_becomes(&self, name: &str, phase: &str) -> Pod {
        eventually(&format!("{name} becomes {phase}"), || async {
            let pod = self.pods.get_opt(name).await.unwrap()?;
            (pod.status.as_ref()?.phase.as_deref() == Some(phase)).then_some(pod)
        })
        .await
    }
}

fn terminated(pod: &Pod) -> Option<(i32, String)> {
    let state = pod.status.as_ref()?.container_statuses.as_ref()?[0]
        .state
        .as_ref()?
        .terminated
        .clone()?;
    Some((state.exit_code, state.reason.unwrap_or_default()))
}

async fn file_appears(path: &Path) -> String {
    eventually(&format!("{} exists", path.display()), || async {
        std::fs::read_to_string(path).ok().filter(|s| !s.is_empty())
    })
    .await
}

/// Whether a process is alive (a zombie waiting for its parent counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .map(|(_, rest)| rest.trim_start())
            .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

#[tokio::test]
async fn exits_become_container_states_and_phases() {
    let f = fixture().await;
    let waiting = f
        .create(&shell_pod(
            "waits",
            "while [ ! -f go ]; do sleep 0.02; done; exit 3",
        ))
        .await;
    let running = f.phase_becomes("waits", "Running").await;
    let status = running.status.clone().unwrap();
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(status.host_ip.as_deref(), Some("127.0.0.1"));
    let cs = &status.container_statuses.unwrap()[0];
    assert!(cs.state.as_ref().unwrap().running.is_some());
    assert!(cs.ready);
    std::fs::write(f.dir(&waiting).join("go"), "").unwrap();
    let failed = f.phase_becomes("waits", "Failed").await;
    assert_eq!(terminated(&failed), Some((3, "Error".into())));

    f.create(&shell_pod("ok", "echo hello; echo oops >&2; exit 0"))
        .await;
    let done = f.phase_becomes("ok", "Succeeded").await;
    assert_eq!(terminated(&done), Some((0, "Completed".into())));
    let log = std::fs::read_to_string(f.dir(&done).join("spark-kubernetes-executor.log")).unwrap();
    assert_eq!(log, "hello\noops\n");
    // The same through `pods/log`, as `kubectl logs` reads it.
    let client = f.sim.try_client().unwrap();
    let (code, headers, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods/ok/log",
        "",
        None,
    )
    .await;
    assert_eq!((code, body.as_str()), (200, Some("hello\noops\n")));
    assert_eq!(headers["content-type"], "text/plain");
    let (_, _, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods/ok/log?container=spark-kubernetes-executor&tailLines=1",
        "",
        None,
    )
    .await;
    assert_eq!(body.as_str(), Some("oops\n"));
    let (code, _, body) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/default/pods/ok/log?container=nope",
        "",
        None,
    )
    .await;
    assert_eq!(code, 400, "{body}");

    // A process killed by a signal: 128 + the signal (`$$$$` is `$$` after Kubernetes'
    // `$(VAR)` expansion of args).
    f.create(&shell_pod("killed", "kill -9 $$$$")).await;
    let killed = f.phase_becomes("killed", "Failed").await;
    assert_eq!(terminated(&killed), Some((137, "Error".into())));
}

#[tokio::test]
async fn an_image_without_a_process_fails_the_pod_with_start_error() {
    let f = fixture().await;
    let mut pod = shell_pod("unknown", "exit 0");
    pod.spec.as_mut().unwrap().containers[0].image = Some("spark:4.0.1".into());
    f.create(&pod).await;
    let failed = f.phase_becomes("unknown", "Failed").await;
    let state = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(state.exit_code, 128);
    assert_eq!(state.reason.as_deref(), Some("StartError"));
    let message = state.message.unwrap();
    assert!(
        message.contains("spark:4.0.1") && message.contains("process_images"),
        "{message}"
    );
}

#[tokio::test]
async fn the_process_sees_the_container_environment_and_its_volumes() {
    let f = fixture().await;
    let configmaps: Api<ConfigMap> = Api::namespaced(f.sim.try_client().unwrap(), "default");
    let conf: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "exec-conf"},
        "data": {"spark.properties": "spark.app.id=app-1\n"}
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &conf)
        .await
        .unwrap();
    let script = "env > env.txt; cat \"$SPARK_CONF_DIR/spark.properties\" > conf.txt; \
                  touch \"$SPARK_LOCAL_DIRS/marker\"; echo \"$@\" > args.txt; exit 0";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "spark-exec-1", "namespace": "default", "labels": {"spark-exec-id": "1"}},
        "spec": {"restartPolicy": "Never",
          "volumes": [
            {"name": "spark-local-dir-1", "emptyDir": {}},
            {"name": "spark-conf-volume-exec", "configMap": {"name": "exec-conf", "items": [{"key": "spark.properties", "path": "spark.properties"}]}}
          ],
          "containers": [{
            "name": "spark-kubernetes-executor", "image": "sh:sim",
            "args": [script, "executor", "$(SPARK_EXECUTOR_ID)", "$(MISSING)"],
            "volumeMounts": [
              {"name": "spark-local-dir-1", "mountPath": "/var/data/spark-1"},
              {"name": "spark-conf-volume-exec", "mountPath": "/opt/spark/conf"}
            ],
            "env": [
              {"name": "SPARK_EXECUTOR_ID", "value": "1"},
              {"name": "SPARK_DRIVER_URL", "value": "spark://CoarseGrainedScheduler@127.0.0.1:7078"},
              {"name": "SPARK_EXECUTOR_POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
              {"name": "SPARK_EXECUTOR_POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
              {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
              {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
              {"name": "EXEC_LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['spark-exec-id']"}}},
              {"name": "EXPANDED", "value": "id-$(SPARK_EXECUTOR_ID)-$$(NOT)"},
              {"name": "SPARK_LOCAL_DIRS", "value": "/var/data/spark-1"},
              {"name": "SPARK_CONF_DIR", "value": "/opt/spark/conf"},
              {"name": "SPARK_JAVA_OPT_0", "value": "-Dspark.driver.port=7078"}
            ]
          }]}
    }))
    .unwrap();
    let created = f.create(&pod).await;
    let done = f.phase_becomes("spark-exec-1", "Succeeded").await;
    let dir = f.dir(&created);
    let env: std::collections::HashMap<String, String> =
        std::fs::read_to_string(dir.join("env.txt"))
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let node = done.spec.unwrap().node_name.unwrap();
    for (name, want) in [
        ("SPARK_EXECUTOR_ID", "1"),
        ("SPARK_EXECUTOR_POD_IP", "127.0.0.1"),
        ("SPARK_EXECUTOR_POD_NAME", "spark-exec-1"),
        ("POD_NAMESPACE", "default"),
        ("NODE", node.as_str()),
        ("EXEC_LABEL", "1"),
        ("EXPANDED", "id-1-$(NOT)"),
        ("SPARK_JAVA_OPT_0", "-Dspark.driver.port=7078"),
        ("SPARK_SIM_CLASSPATH", "/jars/*"),
        ("HOSTNAME", "spark-exec-1"),
    ] {
        assert_eq!(env.get(name).map(String::as_str), Some(want), "{name}");
    }
    // Mount paths point into the pod's own directories.
    let local_dirs = PathBuf::from(&env["SPARK_LOCAL_DIRS"]);
    assert!(local_dirs.starts_with(&dir), "{}", local_dirs.display());
    assert!(local_dirs.join("marker").exists());
    assert!(PathBuf::from(&env["SPARK_CONF_DIR"]).starts_with(&dir));
    assert_eq!(
        std::fs::read_to_string(dir.join("conf.txt")).unwrap(),
        "spark.app.id=app-1\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("args.txt")).unwrap(),
        "1 $(MISSING)\n"
    );
    // `sh -c SCRIPT executor 1 ...`: the first appended arg is $0, the rest $@.
    assert!(
        env.contains_key("PATH"),
        "the simulator's environment is inherited"
    );
}

/// Collects a pod's watch events until it is DELETED.
async fn events_until_deleted(
    mut stream: impl futures::Stream<Item = Result<WatchEvent<Pod>, kube::Error>> + Unpin,
) -> Vec<Pod> {
    let mut seen = Vec::new();
    loop {
        match next_within(&mut stream).await {
            Some(Ok(WatchEvent::Deleted(pod))) => {
                seen.push(pod);
                return seen;
            }
            Some(Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod))) => seen.push(pod),
            Some(Ok(_)) => {}
            other => panic!("watch ended before the pod was deleted: {other:?}"),
        }
    }
}

#[tokio::test]
async fn graceful_delete_sends_sigterm_reports_143_then_removes_the_pod() {
    let f = fixture().await;
    let created = f
        .create(&shell_pod(
            "graceful",
            "trap 'echo term > got-term; exit 143' TERM; echo up > ready; while true; do sleep 0.05; done",
        ))
        .await;
    f.phase_becomes("graceful", "Running").await;
    file_appears(&f.dir(&created).join("ready")).await;
    let watch = f
        .pods
        .watch(
            &WatchParams::default().fields("metadata.name=graceful"),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    f.pods
        .delete("graceful", &DeleteParams::default())
        .await
        .unwrap();
    let seen = events_until_deleted(watch).await;
    let reported = seen
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_some() && terminated(p).is_some())
        .expect("the exit is reported while the pod is Terminating");
    assert_eq!(terminated(reported), Some((143, "Error".into())));
    assert_eq!(
        reported.status.as_ref().unwrap().phase.as_deref(),
        Some("Failed")
    );
    assert_eq!(
        std::fs::read_to_string(f.dir(&created).join("got-term")).unwrap(),
        "term\n"
    );
    assert!(f.pods.get_opt("graceful").await.unwrap().is_none());
}

#[tokio::test]
async fn a_process_ignoring_sigterm_is_killed_after_the_grace_period() {
    let f = fixture().await;
    let created = f
        .create(&shell_pod(
            "stubborn",
            "trap '' TERM; echo $$$$ > main.pid; while true; do sleep 0.05; done",
        ))
        .await;
    f.phase_becomes("stubborn", "Running").await;
    let pid: i32 = file_appears(&f.dir(&created).join("main.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    let watch = f
        .pods
        .watch(
            &WatchParams::default().fields("metadata.name=stubborn"),
            "0",
        )
        .await
        .unwrap()
        .boxed();
    f.pods
        .delete("stubborn", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    let seen = events_until_deleted(watch).await;
    let reported = seen
        .iter()
        .find(|p| terminated(p).is_some())
        .expect("the exit is reported");
    assert_eq!(terminated(reported), Some((137, "Error".into())));
    assert!(!alive(pid));
}

#[tokio::test]
async fn grace_zero_kills_at_once_and_the_pod_is_gone() {
    let f = fixture().await;
    let created = f
        .create(&shell_pod(
            "now",
            "trap '' TERM; echo $$$$ > main.pid; while true; do sleep 0.05; done",
        ))
        .await;
    f.phase_becomes("now", "Running").await;
    let pid: i32 = file_appears(&f.dir(&created).join("main.pid"))
        .await
        .trim()
        .parse()
        .unwrap();
    f.pods
        .delete("now", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(f.pods.get_opt("now").await.unwrap().is_none());
    eventually("the process is killed", || async {
        (!alive(pid)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn no_process_survives_the_shutdown_or_the_drop() {
    for drop_it in [false, true] {
        let f = fixture().await;
        let created = f
            .create(&shell_pod(
                "lingers",
                "trap '' TERM; sleep 1000 & echo $! > child.pid; echo $$$$ > main.pid; wait",
            ))
            .await;
        f.phase_becomes("lingers", "Running").await;
        let dir = f.dir(&created);
        let main: i32 = file_appears(&dir.join("main.pid"))
            .await
            .trim()
            .parse()
            .unwrap();
        let child: i32 = file_appears(&dir.join("child.pid"))
            .await
            .trim()
            .parse()
            .unwrap();
        assert!(alive(main) && alive(child));
        let Fixture { sim, work, .. } = f;
        if drop_it {
            drop(sim);
        } else {
            tokio::time::timeout(Duration::from_secs(10), sim.shutdown())
                .await
                .unwrap();
            // After shutdown() returns, nothing is left: no waiting needed.
            assert!(!alive(main) && !alive(child), "after shutdown");
        }
        eventually("the pod's processes are gone", || async {
            (!alive(main) && !alive(child)).then_some(())
        })
        .await;
        drop(work);
    }
}

#[tokio::test]
async fn a_pod_uid_is_started_once_and_a_reused_name_starts_again() {
    let f = fixture().await;
    let starts = f.work.path().join("starts.log");
    let script = format!("echo $POD_UID >> {}; exit 0", starts.display());
    let with_uid = || {
        let mut pod = shell_pod("exec-1", &script);
        let c = &mut pod.spec.as_mut().unwrap().containers[0];
        c.env = Some(vec![
            serde_json::from_value(json!({"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}))
                .unwrap(),
        ]);
        pod
    };
    let first = f.create(&with_uid()).await;
    f.phase_becomes("exec-1", "Succeeded").await;
    // More events about the same pod never start it again.
    for i in 0..3 {
        f.pods
            .patch(
                "exec-1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"touched": i.to_string()}}})),
            )
            .await
            .unwrap();
    }
    f.pods
        .delete("exec-1", &DeleteParams::default())
        .await
        .unwrap();
    eventually("exec-1 is gone", || async {
        f.pods
            .get_opt("exec-1")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let second = f.create(&with_uid()).await;
    f.phase_becomes("exec-1", "Succeeded").await;
    let lines: Vec<String> = std::fs::read_to_string(&starts)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            first.metadata.uid.clone().unwrap(),
            second.metadata.uid.clone().unwrap()
        ]
    );
}

#[tokio::test]
async fn serve_simulate_reads_the_process_runtime_from_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.toml");
    std::fs::write(
        &path,
        r#"
[simulator]
listen = "127.0.0.1:0"

[simulator.kubelet]
runtime = "process"
work_dir = "/tmp/sim-pods"

[[simulator.kubelet.process_images]]
image = "spark:sim"
command = ["bash", "/repo/scripts/sim-spark-executor.sh"]
env = [{ name = "SPARK_SIM_CLASSPATH", value = "/spark/jars/*:/app/app.jar" }]
"#,
    )
    .unwrap();
    let settings = spark_pod_allocator::config::Settings::load(Some(&path)).unwrap();
    let k = &settings.simulator.kubelet;
    assert_eq!(k.runtime, KubeletRuntime::Process);
    assert_eq!(k.work_dir.as_deref(), Some(Path::new("/tmp/sim-pods")));
    assert_eq!(
        k.process_images,
        [ProcessImage {
            image: "spark:sim".into(),
            command: vec!["bash".into(), "/repo/scripts/sim-spark-executor.sh".into()],
            env: vec![ImageEnv {
                name: "SPARK_SIM_CLASSPATH".into(),
                value: "/spark/jars/*:/app/app.jar".into()
            }],
            container: false,
        }]
    );
    // The same in YAML.
    let yaml = dir.path().join("sim.yaml");
    std::fs::write(
        &yaml,
        "simulator:\n  kubelet:\n    runtime: process\n    process_images:\n      - image: spark:sim\n        command: [bash, /repo/scripts/sim-spark-executor.sh]\n        env:\n          - {name: SPARK_SIM_CLASSPATH, value: \"/spark/jars/*:/app/app.jar\"}\n",
    )
    .unwrap();
    let from_yaml = spark_pod_allocator::config::Settings::load(Some(&yaml)).unwrap();
    assert_eq!(from_yaml.simulator.kubelet.process_images, k.process_images);
    assert_eq!(from_yaml.simulator.kubelet.runtime, KubeletRuntime::Process);
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[simulator.kubelet]\nmode = \"manual\"\nruntime = \"process\"\n",
    )
    .unwrap();
    let err = spark_pod_allocator::config::Settings::load(Some(&bad))
        .unwrap_err()
        .to_string();
    assert!(err.contains("runtime"), "{err}");
}

/// `scripts/sim-spark-executor.sh` under the process runtime, with a stand-in `java` that
/// records its argv: the JVM options in numeric order, memory, classpath and the
/// executor backend's arguments from Spark's environment.
#[tokio::test]
async fn the_spark_executor_entrypoint_runs_the_executor_backend() {
    let work = tempfile::tempdir().unwrap();
    let jdk = work.path().join("jdk");
    std::fs::create_dir_all(jdk.join("bin")).unwrap();
    let java = jdk.join("bin/java");
    std::fs::write(&java, "#!/bin/sh\nprintf '%s\\n' \"$@\" > java-args.txt\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&java, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut s = settings(&work.path().join("pods"));
    s.kubelet.process_images = vec![ProcessImage {
        image: "spark:sim".into(),
        command: vec![
            "bash".into(),
            format!(
                "{}/scripts/sim-spark-executor.sh",
                env!("CARGO_MANIFEST_DIR")
            ),
        ],
        env: vec![
            ImageEnv {
                name: "SPARK_SIM_CLASSPATH".into(),
                value: "/spark/jars/*:/app/app.jar".into(),
            },
            ImageEnv {
                name: "JAVA_HOME".into(),
                value: jdk.display().to_string(),
            },
        ],
        container: false,
    }];
    let sim = SimCluster::start(s).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.try_client().unwrap(), "default");
    let env = |name: &str, value: &str| json!({"name": name, "value": value});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "app-exec-2"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "spark-kubernetes-executor", "image": "spark:sim", "args": ["executor"],
            "env": [
                env("SPARK_JAVA_OPT_10", "-Dten"), env("SPARK_JAVA_OPT_2", "-Dtwo"), env("SPARK_JAVA_OPT_0", "-Dzero"),
                env("SPARK_EXECUTOR_MEMORY", "512m"), env("SPARK_DRIVER_URL", "spark://CoarseGrainedScheduler@127.0.0.1:7078"),
                env("SPARK_EXECUTOR_ID", "2"), env("SPARK_EXECUTOR_CORES", "1"), env("SPARK_APPLICATION_ID", "spark-app-1"),
                env("SPARK_RESOURCE_PROFILE_ID", "0"),
                {"name": "SPARK_EXECUTOR_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "SPARK_EXECUTOR_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ]
        }]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    let done = eventually("the executor ends", || async {
        let pod = pods.get_opt("app-exec-2").await.unwrap()?;
        terminated(&pod)
    })
    .await;
    let dir = work.path().join("pods/default").join(format!(
        "app-exec-2-{}",
        created.metadata.uid.as_deref().unwrap()
    ));
    let log =
        std::fs::read_to_string(dir.join("spark-kubernetes-executor.log")).unwrap_or_default();
    assert_eq!(done, (0, "Completed".into()), "log: {log}");
    let args = std::fs::read_to_string(dir.join("java-args.txt")).unwrap();
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(
        args,
        [
            "-Dzero",
            "-Dtwo",
            "-Dten",
            "-Xms512m",
            "-Xmx512m",
            "-cp",
            "/spark/jars/*:/app/app.jar",
            "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend",
            "--driver-url",
            "spark://CoarseGrainedScheduler@127.0.0.1:7078",
            "--executor-id",
            "2",
            "--cores",
            "1",
            "--app-id",
            "spark-app-1",
            "--hostname",
            "127.0.0.1",
            "--resourceProfileId",
            "0",
            "--podName",
            "app-exec-2"
        ]
    );
}

#[tokio::test]
async fn a_second_delete_shortens_the_grace_period() {
    let f = fixture().await;
    let created = f
        .create(&shell_pod(
            "shortened",
            "trap '' TERM; echo $$$$ > main.pid; while true; do sleep 0.05; done",
        ))
        .await;
    f.phase_becomes("shortened", "Running").await;
    file_appears(&f.dir(&created).join("main.pid")).await;
    f.pods
        .delete("shortened", &DeleteParams::default().grace_period(300))
        .await
        .unwrap();
    f.pods
        .delete("shortened", &DeleteParams::default().grace_period(1))
        .await
        .unwrap();
    // Gone after about a second, well before the first grace period would end.
    eventually(
        "the pod is removed after the shorter grace period",
        || async {
            f.pods
                .get_opt("shortened")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
}

/// Spark creates its executor ConfigMap after asking for executors: a pod mounting it
/// waits (`ContainerCreating`), as on a real node, and starts once it exists.
#[tokio::test]
async fn a_pod_waits_for_its_configmap_then_starts() {
    let f = fixture().await;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "early"},
        "spec": {"restartPolicy": "Never",
          "volumes": [{"name": "conf", "configMap": {"name": "late-conf"}}],
          "containers": [{"name": "c", "image": "sh:sim",
            "args": ["cat \"$CONF/spark.properties\" > seen.txt"],
            "volumeMounts": [{"name": "conf", "mountPath": "/opt/spark/conf"}],
            "env": [{"name": "CONF", "value": "/opt/spark/conf"},
                    {"name": "FROM_MAP", "valueFrom": {"configMapKeyRef": {"name": "late-conf", "key": "spark.properties"}}}]}]}
    }))
    .unwrap();
    let created = f.create(&pod).await;
    let waiting = eventually("the pod waits for its ConfigMap", || async {
        let pod = f.pods.get("early").await.ok()?;
        let state = pod.status?.container_statuses?.first()?.state.clone()?;
        state.waiting
    })
    .await;
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap_or("")
            .contains("late-conf"),
        "{waiting:?}"
    );
    assert_eq!(
        f.pods
            .get("early")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Pending")
    );
    let configmaps: Api<ConfigMap> = Api::namespaced(f.sim.try_client().unwrap(), "default");
    let conf: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "late-conf"}, "data": {"spark.properties": "a=b\n"}
    }))
    .unwrap();
    configmaps
        .create(&PostParams::default(), &conf)
        .await
        .unwrap();
    f.phase_becomes("early", "Succeeded").await;
    assert_eq!(
        std::fs::read_to_string(f.dir(&created).join("seen.txt")).unwrap(),
        "a=b\n"
    );
}
