//! The simulated cluster as the tests use it: a manual kubelet (nothing moves unless the
//! test moves it), pod manifests, raw HTTP through kube-rs's own client.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use spark_pod_allocator_sim::{KubeletMode, SimCluster, SimSettings};

use crate::wait::BOUND;

/// Settings of a cluster whose kubelet is manual: pods stay Pending and nothing moves
/// unless the test moves it, as a real API server without kubelets.
pub fn manual_settings() -> SimSettings {
    let mut settings = SimSettings::default();
    settings.kubelet.mode = KubeletMode::Manual;
    settings
}

/// A cluster started with [`manual_settings`].
pub async fn manual_cluster() -> SimCluster {
    start(manual_settings()).await
}

/// Starts a cluster with `settings`, failing the test if it cannot.
pub async fn start(settings: SimSettings) -> SimCluster {
    SimCluster::start(settings)
        .await
        .expect("simulated cluster starts")
}

/// [`executor_ids`] through a client of `sim`.
pub async fn cluster_ids(sim: &SimCluster, namespace: &str, app: &str) -> BTreeSet<u64> {
    executor_ids(&sim.try_client().expect("sim client"), namespace, app).await
}

/// The executor ids (`spark-exec-id`) of the application's pods in `namespace`, inactive
/// ones included, as the API server has them.
pub async fn executor_ids(client: &Client, namespace: &str, app: &str) -> BTreeSet<u64> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let lp = ListParams::default().labels(&format!("spark-app-selector={app},spark-role=executor"));
    api.list(&lp)
        .await
        .expect("list pods")
        .items
        .iter()
        .filter_map(|p| {
            p.metadata
                .labels
                .as_ref()?
                .get("spark-exec-id")?
                .parse()
                .ok()
        })
        .collect()
}

/// Plays the scheduler: binds pod `name` in `namespace` to `node-1` (its deletion becomes
/// graceful: the pod stays, terminating, until a kubelet confirms).
pub async fn bind(client: &Client, namespace: &str, name: &str) -> Result<String, kube::Error> {
    let body = serde_json::to_vec(&json!({
        "kind": "Binding", "apiVersion": "v1", "metadata": {"name": name},
        "target": {"kind": "Node", "name": "node-1"}
    }))
    .expect("binding body");
    let request = http::Request::post(format!(
        "/api/v1/namespaces/{namespace}/pods/{name}/binding"
    ))
    .header("content-type", "application/json")
    .body(body)
    .expect("binding request");
    client.request_text(request).await
}

/// Plays the kubelet: merges `status` into the status of pod `name` (through the
/// `pods/status` subresource, as a kubelet writes it).
pub async fn set_pod_status(client: &Client, namespace: &str, name: &str, status: Value) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("status of {name}: {e}"));
}

/// The `containerStatuses` of an executor pod whose one container is in `state`
/// (`{"running": …}`, `{"waiting": …}`, `{"terminated": …}`) and not ready.
pub fn executor_container(state: Value) -> Value {
    json!([{"name": "spark-kubernetes-executor", "ready": false, "restartCount": 0,
            "image": "spark:4", "imageID": "", "state": state}])
}

/// The status a kubelet writes for a running executor: phase Running, its one container
/// running and ready.
pub fn running_status() -> Value {
    json!({"phase": "Running", "containerStatuses": [{
        "name": "spark-kubernetes-executor", "ready": true, "restartCount": 0,
        "image": "spark:4", "imageID": "",
        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]})
}

/// An executor pod manifest with the labels the allocator uses.
pub fn executor_pod(name: &str, exec_id: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"spark-app-selector": "app-1", "spark-role": "executor", "spark-exec-id": exec_id.to_string()}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "spark-kubernetes-executor", "image": "spark:3.5.1"}]}
    }))
    .expect("valid pod manifest")
}

/// Sends a request through kube-rs's HTTP stack and returns status, headers and body.
pub async fn raw(
    client: &Client,
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<Value>,
) -> (u16, http::HeaderMap, Value) {
    let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::CONTENT_TYPE, content_type)
        .body(kube::client::Body::from(bytes))
        .expect("request builds");
    let resp = client.send(req).await.expect("request is answered");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect_bytes().await.expect("body reads");
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, headers, value)
}

/// Reads a whole (ending) watch response as a list of events.
pub async fn raw_watch_events(
    client: impl std::borrow::Borrow<Client>,
    path: impl AsRef<str>,
) -> (u16, Vec<Value>) {
    let (client, path) = (client.borrow(), path.as_ref());
    let req = http::Request::builder()
        .method("GET")
        .uri(path)
        .body(kube::client::Body::from(Vec::new()))
        .expect("request builds");
    let resp = client.send(req).await.expect("watch is answered");
    let status = resp.status().as_u16();
    let body = tokio::time::timeout(BOUND, resp.into_body().collect_bytes())
        .await
        .expect("watch ends")
        .expect("watch body reads");
    let events = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("each watch line is JSON"))
        .collect();
    (status, events)
}

/// The API error of a kube-rs call, as (code, reason, message).
pub fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String, String) {
    match result {
        Err(kube::Error::Api(status)) => {
            (status.code, status.reason.clone(), status.message.clone())
        }
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// The next item of a stream, failing the test (rather than hanging it) after [`BOUND`].
pub async fn next_within<S: futures::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    use futures::StreamExt;
    tokio::time::timeout(BOUND, stream.next())
        .await
        .expect("the stream yields within the bound")
}

/// Writes a kubeconfig of `sim` into `dir` (for the service binary) and returns its path.
pub fn kubeconfig_in(sim: &SimCluster, dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&path).expect("kubeconfig");
    path
}
