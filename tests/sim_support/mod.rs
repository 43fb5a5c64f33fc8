//! Helpers shared by the simulated-cluster tests: raw HTTP through kube-rs's own client,
//! pod manifests, and bounded waiting for a condition (never a fixed sleep).
#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use serde_json::{Value, json};
use spark_pod_allocator_sim::{KubeletMode, SimCluster, SimSettings};

/// A cluster whose kubelet is manual: nothing moves unless the test moves it.
pub async fn manual_cluster() -> SimCluster {
    let mut settings = SimSettings::default();
    settings.kubelet.mode = KubeletMode::Manual;
    SimCluster::start(settings)
        .await
        .expect("simulated cluster starts")
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
    let body = tokio::time::timeout(Duration::from_secs(30), resp.into_body().collect_bytes())
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

/// Polls `check` until it returns `Some`, for at most 30 s (a generous bound, not a timing
/// assertion); panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("condition not reached within 30 s: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`eventually`] for a yes/no condition.
pub async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually(what, || {
        let reached = check();
        async move { reached.await.then_some(()) }
    })
    .await
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

/// The next item of a stream, failing the test (rather than hanging it) after 30 s.
pub async fn next_within<S: futures::Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    use futures::StreamExt;
    tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("the stream yields within 30 s")
}
