//! The WebSocket half of the conformance test: raw watches over WebSocket (as fabric8, Spark's
//! client, opens every watch) against the simulator (plain HTTP) and the real server (HTTPS
//! with its own CA, the admin's bearer token), and what each observation looked like — the
//! handshake's code and chosen subprotocol, each message's frame type and trailing newline,
//! the events' order and content, the close code, the answers to a ping and a client close,
//! and the 410 ERROR event of a compacted resourceVersion.
//!
//! kube-apiserver serves a WebSocket watch with `golang.org/x/net/websocket`
//! (`k8s.io/apiserver/pkg/endpoints/handlers/watch.go`, `HandleWS`): an `Origin` header is
//! required (403 without), one subprotocol is echoed and two are a 400, each encoded event is
//! one text message, and when the watch ends the socket is closed with 1000.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

use test_kit::sim::raw;

/// Where the raw WebSockets go.
pub struct Target {
    /// `http://HOST:PORT` or `https://HOST:PORT`.
    pub url: String,
    /// The CA of an HTTPS server's certificate.
    pub ca: Option<PathBuf>,
    /// A bearer token sent as `Authorization`, as fabric8 does on its upgrade request.
    pub token: Option<String>,
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type Socket = tokio_tungstenite::WebSocketStream<Box<dyn Io>>;

/// A hang guard for one read, not a timing assertion.
const READ_GUARD: Duration = Duration::from_secs(30);

/// Opens a TCP (and for https a TLS, HTTP/1.1) connection to the target and sends the
/// upgrade request for `path_and_query`.
async fn connect(
    target: &Target,
    path_and_query: &str,
    origin: bool,
    protocols: Option<&str>,
) -> Result<(Socket, tungstenite::handshake::client::Response), tungstenite::Error> {
    let url = url::Url::parse(&target.url).expect("server URL");
    let host = url.host_str().expect("server host").to_string();
    let port = url.port_or_known_default().expect("server port");
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .expect("server accepts a connection");
    let (scheme, stream): (&str, Box<dyn Io>) = match &target.ca {
        None => ("ws", Box::new(tcp)),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).expect("CA file") {
                roots.add(cert.expect("CA certificate")).expect("CA added");
            }
            let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
            // A WebSocket upgrade is HTTP/1.1.
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            let name = ServerName::try_from(host.clone()).expect("server name");
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .expect("TLS handshake with the server's CA");
            ("wss", Box::new(tls))
        }
    };
    let mut request = format!("{scheme}://{host}:{port}{path_and_query}")
        .into_client_request()
        .expect("upgrade request");
    let headers = request.headers_mut();
    if origin {
        // fabric8 sends the API server's own URL as Origin.
        headers.insert("Origin", target.url.parse().expect("origin header"));
    }
    if let Some(p) = protocols {
        headers.insert(
            "Sec-WebSocket-Protocol",
            p.parse().expect("protocol header"),
        );
    }
    if let Some(token) = &target.token {
        headers.insert(
            "Authorization",
            format!("Bearer {token}")
                .parse()
                .expect("authorization header"),
        );
    }
    tokio_tungstenite::client_async(request, stream).await
}

/// The outcome of a handshake: its code and the subprotocol the server chose.
async fn handshake(target: &Target, path: &str, origin: bool, protocols: Option<&str>) -> Value {
    match connect(target, path, origin, protocols).await {
        Ok((mut socket, resp)) => {
            let _ = socket.close(None).await;
            json!({
                "code": resp.status().as_u16(),
                "protocol": resp.headers().get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok()),
            })
        }
        Err(tungstenite::Error::Http(resp)) => json!({"code": resp.status().as_u16()}),
        Err(e) => json!({"error": e.to_string()}),
    }
}

/// One message as both servers must agree on it: its frame type, whether the text ends with
/// a newline (kube-apiserver's JSON encoder ends every event with one), and for an event its
/// type, the object's kind, `step` label, node, deletion mark and grace period; for a close
/// its code.
fn message(msg: &Message) -> Value {
    let event = |bytes: &[u8]| -> Value {
        let e: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let o = &e["object"];
        json!({
            "type": e["type"],
            "kind": o["kind"],
            "apiVersion": o["apiVersion"],
            "name": o["metadata"]["name"],
            "step": o["metadata"]["labels"]["step"],
            "node": o["spec"]["nodeName"],
            "deleting": o["metadata"]["deletionTimestamp"].is_string(),
            "grace": o["metadata"]["deletionGracePeriodSeconds"],
            "code": o["code"],
            "reason": o["reason"],
        })
    };
    match msg {
        Message::Text(t) => json!({"frame": "text", "newline": t.as_str().ends_with('\n'),
                                   "event": event(t.as_bytes())}),
        Message::Binary(b) => json!({"frame": "binary", "newline": b.ends_with(b"\n"),
                                     "event": event(b)}),
        Message::Close(frame) => json!({"frame": "close",
                                        "code": frame.as_ref().map(|f| u16::from(f.code))}),
        Message::Ping(p) => json!({"frame": "ping", "payload": String::from_utf8_lossy(p)}),
        Message::Pong(p) => json!({"frame": "pong", "payload": String::from_utf8_lossy(p)}),
        Message::Frame(_) => json!({"frame": "raw"}),
    }
}

/// Every message until the stream ends (a close frame, then the end of the connection).
async fn until_end(socket: &mut Socket) -> Vec<Value> {
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(READ_GUARD, socket.next()).await {
            Err(_) => panic!("the WebSocket watch did not end; so far: {seen:?}"),
            Ok(None) => return seen,
            Ok(Some(Ok(msg))) => {
                let closing = matches!(msg, Message::Close(_));
                seen.push(message(&msg));
                if closing {
                    // The close answer is queued by the protocol layer; the next read flushes
                    // it and reports the end.
                    let _ = tokio::time::timeout(READ_GUARD, socket.next()).await;
                    return seen;
                }
            }
            Ok(Some(Err(tungstenite::Error::ConnectionClosed))) => return seen,
            Ok(Some(Err(e))) => {
                seen.push(json!({"error": e.to_string()}));
                return seen;
            }
        }
    }
}

fn pod(name: &str, app: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox"}]}
    })
}

/// Sends the WebSocket probes to one backend (`client` as admin on the same server) and
/// records what came back, by name.
pub async fn observe(
    target: &Target,
    client: &kube::Client,
    ns: &str,
    compact: impl Fn(),
) -> BTreeMap<&'static str, Value> {
    let mut seen = BTreeMap::new();
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    let json_type = "application/json";
    let watch = format!("{pods}?watch=true&timeoutSeconds=1");

    for (name, origin, protocols) in [
        ("websocket handshake without Origin", false, None),
        ("websocket handshake", true, None),
        (
            "websocket handshake, v4.channel.k8s.io",
            true,
            Some("v4.channel.k8s.io"),
        ),
        (
            "websocket handshake, base64.channel.k8s.io",
            true,
            Some("base64.channel.k8s.io"),
        ),
        (
            "websocket handshake, two subprotocols",
            true,
            Some("v4.channel.k8s.io, base64.channel.k8s.io"),
        ),
        (
            "websocket handshake, two subprotocols, no Origin",
            false,
            Some("v4.channel.k8s.io, base64.channel.k8s.io"),
        ),
    ] {
        seen.insert(name, handshake(target, &watch, origin, protocols).await);
    }
    seen.insert(
        "websocket handshake, bad label selector",
        handshake(
            target,
            &format!("{pods}?watch=true&labelSelector=a%20in"),
            true,
            None,
        )
        .await,
    );

    // A pod before the watch (ADDED first, no resourceVersion given), then live changes of
    // another: create, label change, binding, graceful deletion, the kubelet's grace-0 delete.
    let (_, _, w0) = raw(client, "POST", &pods, json_type, Some(pod("w0", "ws"))).await;
    let w0_rv = w0["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let (mut socket, _) = connect(
        target,
        &format!("{pods}?watch=true&labelSelector=app%3Dws&timeoutSeconds=60"),
        true,
        None,
    )
    .await
    .expect("the watch upgrades to a WebSocket");
    let first = tokio::time::timeout(READ_GUARD, socket.next()).await;
    let first = match first {
        Ok(Some(Ok(msg))) => message(&msg),
        other => json!({"error": format!("{other:?}")}),
    };
    raw(client, "POST", &pods, json_type, Some(pod("w1", "ws"))).await;
    raw(
        client,
        "PATCH",
        &format!("{pods}/w1"),
        "application/merge-patch+json",
        Some(json!({"metadata": {"labels": {"step": "1"}}})),
    )
    .await;
    raw(
        client,
        "POST",
        &format!("{pods}/w1/binding"),
        json_type,
        Some(json!({
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "w1"},
            "target": {"kind": "Node", "name": "node-1"}})),
    )
    .await;
    raw(client, "DELETE", &format!("{pods}/w1"), json_type, None).await;
    raw(
        client,
        "DELETE",
        &format!("{pods}/w1"),
        json_type,
        Some(json!({"gracePeriodSeconds": 0})),
    )
    .await;
    // Up to the DELETED event (the watch stays open: no timing involved), then a close.
    let mut messages = vec![first];
    loop {
        match tokio::time::timeout(READ_GUARD, socket.next()).await {
            Ok(Some(Ok(msg))) => {
                let m = message(&msg);
                let end = m["event"]["type"] == "DELETED" || m["frame"] == "close";
                messages.push(m);
                if end {
                    break;
                }
            }
            other => {
                messages.push(json!({"error": format!("{other:?}")}));
                break;
            }
        }
    }
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    messages.extend(until_end(&mut socket).await);
    seen.insert(
        "websocket watch: existing pod, then live changes",
        json!(messages),
    );

    // `timeoutSeconds` ends the watch with a normal close (no bookmark was asked for).
    let (mut socket, _) = connect(
        target,
        &format!("{pods}?watch=true&labelSelector=app%3Dnone&timeoutSeconds=1"),
        true,
        None,
    )
    .await
    .expect("the watch upgrades to a WebSocket");
    seen.insert(
        "websocket watch ends at timeoutSeconds",
        json!(until_end(&mut socket).await),
    );

    // A ping is answered with its payload; a client close is answered and the socket ends.
    // Under the v4 channel subprotocol the events are still plain text (no channel byte).
    // fabric8 closes with 1000; a close without a status code is observed separately.
    for (name, close) in [
        (
            "websocket ping, then a client close 1000 (v4.channel.k8s.io)",
            Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            }),
        ),
        ("websocket client close without a status code", None),
    ] {
        let (mut socket, _) = connect(
            target,
            &format!("{pods}?watch=true&labelSelector=app%3Dws&timeoutSeconds=20"),
            true,
            Some("v4.channel.k8s.io"),
        )
        .await
        .expect("the watch upgrades to a WebSocket");
        let mut replies = Vec::new();
        if let Ok(Some(Ok(msg))) = tokio::time::timeout(READ_GUARD, socket.next()).await {
            replies.push(message(&msg));
        }
        if close.is_some() {
            let _ = socket
                .send(Message::Ping(b"are you there".to_vec().into()))
                .await;
            if let Ok(Some(Ok(msg))) = tokio::time::timeout(READ_GUARD, socket.next()).await {
                replies.push(message(&msg));
            }
        }
        let _ = socket.send(Message::Close(close)).await;
        replies.extend(until_end(&mut socket).await);
        seen.insert(name, json!(replies));
    }

    // From a compacted resourceVersion: the ERROR event (410 Expired), then the close.
    raw(client, "POST", &pods, json_type, Some(pod("w2", "other"))).await;
    compact();
    let (mut socket, _) = connect(
        target,
        &format!("{pods}?watch=true&resourceVersion={w0_rv}&timeoutSeconds=20"),
        true,
        None,
    )
    .await
    .expect("the watch upgrades to a WebSocket");
    seen.insert(
        "websocket watch from a compacted resourceVersion",
        json!(until_end(&mut socket).await),
    );
    seen
}
