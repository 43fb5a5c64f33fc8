//! The simulator held to a real kube-apiserver: the same requests (raw HTTP through kube-rs's
//! client, raw WebSocket watches (see `websocket.rs`), and kubectl with its protobuf bodies)
//! go to both, and what comes back is compared — status codes, Status
//! objects (reason, details), resourceVersion behaviour, label selectors, the order of watch
//! events, graceful deletion and 410 Gone. Every difference is either fixed in the simulator
//! or listed in `KNOWN` (and in docs/simulator.md); the test fails on any other difference and
//! on a listed one that went away. Skipped (reason printed) without `TEST_APISERVER_BIN`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::websocket;
use kube::Client;
use serde_json::{Value, json};
use test_kit::cluster::{Cluster, RealBackend, SimBackend};
use test_kit::sim::raw;

/// Observations that differ between the simulator and the real server, by name, each with
/// why (also in docs/simulator.md).
const KNOWN: &[(&str, &str)] = &[(
    "websocket client close without a status code",
    "kube-apiserver answers any client close with 1000; the simulator's WebSocket layer \
     (tungstenite, under axum) echoes the client's close frame, which here has no code",
)];

fn pod(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox"}]}
    })
}

/// The part of an answer both servers must agree on: the code, and for a Status its reason
/// and details' kind and name.
fn outcome(code: u16, body: &Value) -> Value {
    if body["kind"] == "Status" {
        json!({"code": code, "status": body["status"], "reason": body["reason"],
               "details": {"kind": body["details"]["kind"], "name": body["details"]["name"]},
               "statusCode": body["code"]})
    } else {
        json!({"code": code, "kind": body["kind"]})
    }
}

/// Sends the probes to one backend and records what it answered, by name.
async fn observe(c: &impl Cluster, compact: impl Fn()) -> BTreeMap<&'static str, Value> {
    let client: Client = c.admin_client();
    let ns = c.namespace();
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    let mut seen = BTreeMap::new();
    let json_type = "application/json";

    let (code, _, body) = raw(&client, "GET", &format!("{pods}/missing"), json_type, None).await;
    seen.insert("get missing pod", outcome(code, &body));

    let (code, _, body) = raw(
        &client,
        "POST",
        &pods,
        json_type,
        Some(pod("p1", json!({"app": "x", "tier": "a"}))),
    )
    .await;
    seen.insert("create pod", outcome(code, &body));
    let created_rv: u64 = body["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    seen.insert(
        "create sets uid, rv, creationTimestamp",
        json!([
            body["metadata"]["uid"].is_string(),
            created_rv > 0,
            body["metadata"]["creationTimestamp"].is_string(),
            body["status"]["phase"]
        ]),
    );

    let (code, _, body) = raw(
        &client,
        "POST",
        &pods,
        json_type,
        Some(pod("p1", json!({}))),
    )
    .await;
    seen.insert("create duplicate", outcome(code, &body));

    let mut invalid = pod("bad", json!({}));
    invalid["spec"]["containers"] = json!([]);
    let (code, _, body) = raw(&client, "POST", &pods, json_type, Some(invalid)).await;
    seen.insert("create without containers", outcome(code, &body));

    let (code, _, body) = raw(
        &client,
        "POST",
        &pods,
        "text/plain",
        Some(pod("p9", json!({}))),
    )
    .await;
    seen.insert(
        "create with an unsupported media type",
        json!({"code": code, "reason": body["reason"]}),
    );

    let (_, _, body) = raw(
        &client,
        "POST",
        &pods,
        json_type,
        Some(pod("p2", json!({"app": "x", "tier": "b"}))),
    )
    .await;
    let p2_rv = body["metadata"]["resourceVersion"].clone();
    raw(
        &client,
        "POST",
        &pods,
        json_type,
        Some(pod("p3", json!({"app": "y"}))),
    )
    .await;

    for (name, selector) in [
        ("selector equality", "app%3Dx"),
        ("selector inequality", "app%21%3Dx"),
        ("selector set", "tier+in+%28a%2Cc%29"),
        ("selector exists", "tier"),
        ("selector not exists", "%21tier"),
    ] {
        let (code, _, body) = raw(
            &client,
            "GET",
            &format!("{pods}?labelSelector={selector}"),
            json_type,
            None,
        )
        .await;
        let mut names: Vec<String> = body["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        seen.insert(name, json!({"code": code, "names": names}));
    }

    // An update with a stale resourceVersion conflicts.
    let mut stale = pod("p2", json!({"app": "x"}));
    stale["metadata"]["resourceVersion"] = json!((created_rv).to_string());
    let (code, _, body) = raw(
        &client,
        "PUT",
        &format!("{pods}/p2"),
        json_type,
        Some(stale),
    )
    .await;
    seen.insert("update with a stale resourceVersion", outcome(code, &body));
    let _ = p2_rv;

    // Watch order from a list's resourceVersion: a label change, a binding, a deletion.
    let (_, _, list) = raw(
        &client,
        "GET",
        &format!("{pods}?labelSelector=app%3Dy"),
        json_type,
        None,
    )
    .await;
    let list_rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    raw(
        &client,
        "PATCH",
        &format!("{pods}/p3"),
        "application/merge-patch+json",
        Some(json!({"metadata": {"labels": {"step": "1"}}})),
    )
    .await;
    let (code, _, body) = raw(
        &client,
        "POST",
        &format!("{pods}/p3/binding"),
        json_type,
        Some(json!({
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p3"},
        "target": {"kind": "Node", "name": "node-1"}})),
    )
    .await;
    seen.insert("bind", outcome(code, &body));
    // Bound: the deletion is graceful, the pod stays, terminating.
    let (code, _, body) = raw(&client, "DELETE", &format!("{pods}/p3"), json_type, None).await;
    seen.insert(
        "graceful delete of a bound pod",
        json!([
            outcome(code, &body),
            body["metadata"]["deletionTimestamp"].is_string(),
            body["metadata"]["deletionGracePeriodSeconds"]
        ]),
    );
    let (code, _, _) = raw(&client, "GET", &format!("{pods}/p3"), json_type, None).await;
    seen.insert("terminating pod still readable", json!(code));
    let (code, _, body) = raw(
        &client,
        "DELETE",
        &format!("{pods}/p3"),
        json_type,
        Some(json!({"gracePeriodSeconds": 0})),
    )
    .await;
    seen.insert("grace-0 delete", outcome(code, &body));
    let (code, _, _) = raw(&client, "GET", &format!("{pods}/p3"), json_type, None).await;
    seen.insert("deleted pod gone", json!(code));
    let (code, events) = test_kit::sim::raw_watch_events(
        client.clone(),
        format!(
            "{pods}?watch=true&labelSelector=app%3Dy&resourceVersion={list_rv}&timeoutSeconds=2"
        ),
    )
    .await;
    let kinds: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] != "BOOKMARK")
        .map(|e| {
            json!([
                e["type"],
                e["object"]["metadata"]["labels"]["step"],
                e["object"]["spec"]["nodeName"],
                e["object"]["metadata"]["deletionTimestamp"].is_string()
            ])
        })
        .collect();
    seen.insert(
        "watch events from a list's resourceVersion",
        json!({"code": code, "events": kinds}),
    );

    // After compaction a watch from an old resourceVersion is 410 Gone.
    compact();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let (code, events) = test_kit::sim::raw_watch_events(
        client.clone(),
        format!("{pods}?watch=true&resourceVersion={created_rv}&timeoutSeconds=2"),
    )
    .await;
    let gone: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "ERROR")
        .map(|e| json!([e["object"]["code"], e["object"]["reason"]]))
        .collect();
    seen.insert(
        "watch from a compacted resourceVersion",
        json!({"code": code, "errors": gone}),
    );
    seen
}

/// Runs kubectl with `kubeconfig`; returns its exit code and output (stdout, then stderr with
/// the server-specific parts — names of temporary namespaces — as they are).
async fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> Value {
    let out = tokio::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .await
        .expect("kubectl runs (.ci/run installs it)");
    json!({
        "exit": out.status.code(),
        "stdout": String::from_utf8_lossy(&out.stdout).trim(),
        "stderr": String::from_utf8_lossy(&out.stderr).trim(),
    })
}

/// kubectl's requests, as a user sends them: `create namespace` and `create configmap` send
/// protobuf bodies; `get` reads tables and JSON; `delete` waits for the object to go.
async fn observe_kubectl(kubeconfig: &std::path::Path, ns: &str) -> BTreeMap<&'static str, Value> {
    let mut seen = BTreeMap::new();
    seen.insert(
        "kubectl create namespace (protobuf)",
        kubectl(kubeconfig, &["create", "namespace", "kubectl-made"]).await,
    );
    seen.insert(
        "kubectl create namespace again",
        kubectl(kubeconfig, &["create", "namespace", "kubectl-made"]).await,
    );
    seen.insert(
        "kubectl create configmap (protobuf)",
        kubectl(
            kubeconfig,
            &["-n", ns, "create", "configmap", "cm1", "--from-literal=a=b"],
        )
        .await,
    );
    seen.insert(
        "kubectl get configmap jsonpath",
        kubectl(
            kubeconfig,
            &[
                "-n",
                ns,
                "get",
                "configmap",
                "cm1",
                "-o",
                "jsonpath={.data.a}",
            ],
        )
        .await,
    );
    seen.insert(
        "kubectl get missing pod",
        kubectl(kubeconfig, &["-n", ns, "get", "pod", "missing"]).await,
    );
    seen.insert(
        "kubectl get pods by label, names",
        kubectl(
            kubeconfig,
            &["-n", ns, "get", "pods", "-l", "app=x", "-o", "name"],
        )
        .await,
    );
    seen.insert(
        "kubectl delete configmap",
        kubectl(kubeconfig, &["-n", ns, "delete", "configmap", "cm1"]).await,
    );
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_answers_as_a_real_api_server() {
    let Some(real) = RealBackend::start_own("conformance", &["--watch-cache=false"]).await else {
        return;
    };
    let sim = SimBackend::start().await;
    let mut real_seen = observe(&real, || {
        real.server().compact();
    })
    .await;
    let mut sim_seen = observe(&sim, || sim.sim.compact_history()).await;
    real_seen.extend(
        websocket::observe(
            &websocket::Target {
                url: real.server().url.clone(),
                ca: Some(real.server().dir().join("ca.crt")),
                token: Some(real.server().user_token("admin")),
            },
            &real.admin_client(),
            real.namespace(),
            || {
                real.server().compact();
            },
        )
        .await,
    );
    sim_seen.extend(
        websocket::observe(
            &websocket::Target {
                url: sim.sim.base_url(),
                ca: None,
                token: None,
            },
            &sim.admin_client(),
            sim.namespace(),
            || sim.sim.compact_history(),
        )
        .await,
    );
    real_seen
        .extend(observe_kubectl(&real.server().dir().join("kubeconfig"), real.namespace()).await);
    let sim_dir = tempfile::tempdir().expect("temporary directory");
    let sim_kubeconfig = sim_dir.path().join("kubeconfig");
    sim.sim
        .write_kubeconfig(&sim_kubeconfig)
        .expect("sim kubeconfig");
    sim_seen.extend(observe_kubectl(&sim_kubeconfig, sim.namespace()).await);
    let mut differences = Vec::new();
    for (name, real_value) in &real_seen {
        let sim_value = &sim_seen[name];
        eprintln!("{name}: {real_value}");
        if sim_value != real_value {
            differences.push(format!(
                "{name}:\n  real: {real_value}\n  sim:  {sim_value}"
            ));
        }
    }
    let unexpected: Vec<&String> = differences
        .iter()
        .filter(|d| !KNOWN.iter().any(|(k, _)| d.starts_with(&format!("{k}:"))))
        .collect();
    assert!(
        unexpected.is_empty(),
        "differences:\n{}",
        differences.join("\n")
    );
    for (known, why) in KNOWN {
        assert!(
            differences
                .iter()
                .any(|d| d.starts_with(&format!("{known}:"))),
            "the known difference {known:?} ({why}) went away: remove it from KNOWN and docs"
        );
    }
}
