//! Watches over WebSocket, as fabric8 (Spark's Kubernetes client) opens them: a real
//! WebSocket client (tokio-tungstenite) against the simulated API server.

use std::time::Duration;

use futures::SinkExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::Value;
use spark_pod_allocator_sim::SimCluster;
use test_kit::sim::*;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn request(
    sim: &SimCluster,
    path_and_query: &str,
    origin: bool,
    protocols: Option<&str>,
) -> tungstenite::handshake::client::Request {
    let mut req = format!("ws://{}{}", sim.local_addr(), path_and_query)
        .into_client_request()
        .unwrap();
    if origin {
        // fabric8 sends the API server's own URL as Origin.
        req.headers_mut()
            .insert("Origin", sim.base_url().parse().unwrap());
    }
    if let Some(p) = protocols {
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", p.parse().unwrap());
    }
    req
}

async fn open(sim: &SimCluster, path_and_query: &str) -> Socket {
    let (socket, resp) = tokio_tungstenite::connect_async(request(sim, path_and_query, true, None))
        .await
        .expect("the watch upgrades to a WebSocket");
    assert_eq!(resp.status().as_u16(), 101);
    socket
}

/// The next text message as a watch event; panics on anything else.
async fn next_event(socket: &mut Socket) -> Value {
    loop {
        match next_within(socket).await {
            Some(Ok(Message::Text(text))) => {
                return serde_json::from_str(text.as_str())
                    .expect("each message is one JSON event");
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text message with a watch event, got {other:?}"),
        }
    }
}

/// Reads until the server closes; returns the close code it sent.
async fn closed_by_server(socket: &mut Socket) -> Option<u16> {
    loop {
        match next_within(socket).await {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
            Some(Ok(Message::Text(_) | Message::Ping(_) | Message::Pong(_))) => continue,
            None => return None,
            other => panic!("expected the server to close, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn events_arrive_as_text_messages() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().unwrap(), "default");
    pods.create(&PostParams::default(), &executor_pod("before", 1))
        .await
        .unwrap();
    let mut socket = open(
        &sim,
        "/api/v1/namespaces/default/pods?watch=true&labelSelector=spark-role%3Dexecutor",
    )
    .await;
    let first = next_event(&mut socket).await;
    assert_eq!(first["type"], "ADDED");
    assert_eq!(first["object"]["metadata"]["name"], "before");
    pods.create(&PostParams::default(), &executor_pod("after", 2))
        .await
        .unwrap();
    let second = next_event(&mut socket).await;
    assert_eq!(second["type"], "ADDED");
    assert_eq!(second["object"]["metadata"]["name"], "after");
    assert_eq!(second["object"]["kind"], "Pod");
    pods.delete("after", &Default::default()).await.unwrap();
    // Unbound: removed at once (MODIFIED with deletionTimestamp, then DELETED).
    assert_eq!(next_event(&mut socket).await["type"], "MODIFIED");
    let deleted = next_event(&mut socket).await;
    assert_eq!(deleted["type"], "DELETED");
    assert_eq!(deleted["object"]["metadata"]["name"], "after");
}

#[tokio::test]
async fn stale_resource_version_gets_the_410_error_event_then_a_close() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().unwrap(), "default");
    pods.create(&PostParams::default(), &executor_pod("p", 1))
        .await
        .unwrap();
    sim.compact_history();
    let mut socket = open(
        &sim,
        "/api/v1/namespaces/default/pods?watch=1&resourceVersion=1",
    )
    .await;
    let error = next_event(&mut socket).await;
    assert_eq!(error["type"], "ERROR");
    assert_eq!(error["object"]["kind"], "Status");
    assert_eq!(error["object"]["code"], 410);
    assert_eq!(error["object"]["reason"], "Expired");
    assert_eq!(closed_by_server(&mut socket).await, Some(1000));
}

#[tokio::test]
async fn timeout_ends_the_socket_after_a_bookmark() {
    let sim = manual_cluster().await;
    let mut socket = open(
        &sim,
        "/api/v1/namespaces/default/pods?watch=true&timeoutSeconds=1&allowWatchBookmarks=true",
    )
    .await;
    let bookmark = next_event(&mut socket).await;
    assert_eq!(bookmark["type"], "BOOKMARK");
    assert_eq!(closed_by_server(&mut socket).await, Some(1000));
}

#[tokio::test]
async fn ping_is_answered_and_a_client_close_is_answered() {
    let sim = manual_cluster().await;
    let mut socket = open(&sim, "/api/v1/namespaces/default/configmaps?watch=true").await;
    socket
        .send(Message::Ping(b"are you there".to_vec().into()))
        .await
        .unwrap();
    match next_within(&mut socket).await {
        Some(Ok(Message::Pong(payload))) => assert_eq!(&payload[..], b"are you there"),
        other => panic!("expected a pong, got {other:?}"),
    }
    socket.send(Message::Close(None)).await.unwrap();
    // The server answers the close; the stream then ends.
    match next_within(&mut socket).await {
        Some(Ok(Message::Close(_))) | None => {}
        Some(Err(tungstenite::Error::ConnectionClosed)) => {}
        other => panic!("expected the close answer, got {other:?}"),
    }
}

#[tokio::test]
async fn handshake_follows_the_api_server() {
    let sim = manual_cluster().await;
    let path = "/api/v1/namespaces/default/pods?watch=true";
    // kube-apiserver's WebSocket handler refuses a handshake without Origin.
    match tokio_tungstenite::connect_async(request(&sim, path, false, None)).await {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 403),
        other => panic!("expected 403 without Origin, got {other:?}"),
    }
    // One subprotocol is echoed; the events are still plain JSON text.
    let (mut socket, resp) =
        tokio_tungstenite::connect_async(request(&sim, path, true, Some("base64.channel.k8s.io")))
            .await
            .unwrap();
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok()),
        Some("base64.channel.k8s.io")
    );
    let pods: Api<Pod> = Api::namespaced(sim.try_client().unwrap(), "default");
    pods.create(&PostParams::default(), &executor_pod("p", 1))
        .await
        .unwrap();
    assert_eq!(next_event(&mut socket).await["type"], "ADDED");
    // Two subprotocols: golang.org/x/net/websocket cannot choose and answers 400.
    match tokio_tungstenite::connect_async(request(
        &sim,
        path,
        true,
        Some("v4.channel.k8s.io, base64.channel.k8s.io"),
    ))
    .await
    {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 400),
        other => panic!("expected 400 for two subprotocols, got {other:?}"),
    }
    // A bad query is refused before any upgrade, with a Status.
    match tokio_tungstenite::connect_async(request(
        &sim,
        "/api/v1/namespaces/default/pods?watch=true&labelSelector=a%20in",
        true,
        None,
    ))
    .await
    {
        Err(tungstenite::Error::Http(resp)) => assert_eq!(resp.status().as_u16(), 400),
        other => panic!("expected 400 for a malformed selector, got {other:?}"),
    }
}

#[tokio::test]
async fn the_watch_path_form_works_over_websocket_and_chunked() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().unwrap(), "default");
    pods.create(&PostParams::default(), &executor_pod("a", 1))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &executor_pod("b", 2))
        .await
        .unwrap();
    let mut socket = open(&sim, "/api/v1/watch/namespaces/default/pods/b").await;
    let only = next_event(&mut socket).await;
    assert_eq!(only["object"]["metadata"]["name"], "b");
    let (status, events) = raw_watch_events(
        sim.try_client().unwrap(),
        "/api/v1/watch/namespaces/default/pods?timeoutSeconds=1",
    )
    .await;
    assert_eq!(status, 200);
    let names: Vec<&str> = events
        .iter()
        .filter_map(|e| e["object"]["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    drop(socket);
    tokio::time::timeout(Duration::from_secs(10), sim.shutdown())
        .await
        .unwrap();
}
