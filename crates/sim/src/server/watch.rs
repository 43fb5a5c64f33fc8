//! Watches: the backlog or initial state, live events as each watcher sees them through
//! its selector, bookmarks, timeouts and injected drops.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{HeaderValue, header};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

use super::shared::{Query, Shared, flag, parse_u64};
use super::verbs::selector_of;
use crate::selector::Selector;
use crate::status::ApiError;
use crate::store::{Event, EventType, Kind};
use crate::table::{IncludeObject, table as printed_table};

/// Renders one event for one watcher (as a one-row Table when `table` is set), or nothing
/// when the watcher does not see it.
fn render(
    ev: &Event,
    ns: Option<&str>,
    sel: &Selector,
    table: Option<IncludeObject>,
) -> Option<Bytes> {
    if ns.is_some_and(|n| n != ev.namespace) {
        return None;
    }
    let (event_type, left) = seen(ev, sel)?;
    let object = match (table, left) {
        (Some(include), left) => {
            let value = left.as_ref().unwrap_or(&ev.object.value);
            let meta = json!({"resourceVersion": ev.rv.to_string()});
            Bytes::from(printed_table(ev.kind, &[value], include, meta).to_string())
        }
        (None, None) => ev.object.json.clone(),
        (None, Some(left)) => Bytes::from(left.to_string()),
    };
    Some(event_line(event_type, &object))
}

/// The event type a watcher with `sel` sees, and, for an object leaving the selector, the
/// object it gets instead of the current one: a DELETED event carrying the previous state
/// (at the event's version), as the real watch cache sends.
fn seen(ev: &Event, sel: &Selector) -> Option<(&'static str, Option<Value>)> {
    if sel.is_empty() {
        return Some((ev.event_type.as_str(), None));
    }
    let now = sel.matches(&ev.object.value);
    let before = ev.previous.as_ref().map(|p| sel.matches(&p.value));
    match (ev.event_type, before, now) {
        (EventType::Added, _, true) | (EventType::Deleted, _, true) => {
            Some((ev.event_type.as_str(), None))
        }
        (EventType::Modified, Some(true) | None, true) => Some(("MODIFIED", None)),
        (EventType::Modified, Some(false), true) => Some(("ADDED", None)),
        (EventType::Modified, Some(true), false) => {
            let mut old = (*ev.previous.as_ref()?.value).clone();
            old["metadata"]["resourceVersion"] = Value::String(ev.rv.to_string());
            Some(("DELETED", Some(old)))
        }
        _ => None,
    }
}

fn event_line(event_type: &str, object: &Bytes) -> Bytes {
    let mut out = BytesMut::with_capacity(object.len() + 32);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(object);
    out.extend_from_slice(b"}\n");
    out.freeze()
}

fn bookmark(kind: Kind, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": kind.kind(), "apiVersion": kind.api_version(), "metadata": meta});
    event_line("BOOKMARK", &Bytes::from(obj.to_string()))
}

/// The events of one watch, each one JSON line (`{"type":..,"object":..}` and a newline),
/// ending when the watch ends (timeout, injected close, lagging, shutdown, or after the
/// 410 ERROR event of a too old resourceVersion).
pub(super) type EventStream = std::pin::Pin<Box<dyn Stream<Item = Bytes> + Send>>;

/// A chunked HTTP watch response: one event per line.
pub(super) fn http_response(events: EventStream) -> Response {
    let mut resp = Response::new(Body::from_stream(events.map(Ok::<Bytes, Infallible>)));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, private"),
    );
    resp
}

/// Starts a watch: validates the query and registers with the store now (so a 400 is
/// answered before any upgrade), and returns the stream of its events.
pub(super) fn events(
    sh: &Arc<Shared>,
    kind: Kind,
    ns: Option<String>,
    q: &Query,
    table: Option<IncludeObject>,
) -> Result<EventStream, ApiError> {
    let sel = selector_of(kind, q)?;
    let from = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(v) => Some(
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {v}")))?,
        ),
    };
    let bookmarks = flag(q, "allowWatchBookmarks");
    let initial_events = flag(q, "sendInitialEvents");
    let faults = sh.faults();
    let timeout = parse_u64(q, "timeoutSeconds")?.map(Duration::from_secs);
    let forced_close = faults.watch_close_after_seconds.map(Duration::from_secs);
    let (deadline, end_bookmark) = match (timeout, forced_close) {
        (Some(t), Some(f)) if f < t => (Some(f), false),
        (Some(t), _) => (Some(t), true),
        (None, Some(f)) => (Some(f), false),
        (None, None) => (None, false),
    };
    let from = if initial_events { None } else { from };
    let start = sh.store.watch(kind, ns.as_deref(), from);
    let sh = sh.clone();
    let bookmark_every = Duration::from_millis(sh.settings.bookmark_interval_ms);
    let stream = async_stream::stream! {
        let ws = match start {
            Ok(ws) => ws,
            Err(oldest) => {
                let err = ApiError::expired(format!("too old resource version: {} ({oldest})", from.unwrap_or(0)));
                yield event_line("ERROR", &Bytes::from(err.to_status().to_string()));
                return;
            }
        };
        let drop_fraction = faults.watch_drop_fraction;
        let dropped = |sh: &Shared| drop_fraction > 0.0 && sh.roll() < drop_fraction;
        for ev in &ws.backlog {
            if let Some(line) = render(ev, ns.as_deref(), &sel, table)
                && !dropped(&sh)
            {
                yield line;
            }
        }
        let mut last_rv = ws.rv;
        if initial_events {
            yield bookmark(kind, last_rv, true);
        }
        let mut live = ws.live;
        let sleep = async move {
            match deadline {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending::<()>().await,
            }
        };
        tokio::pin!(sleep);
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + bookmark_every, bookmark_every);
        loop {
            tokio::select! {
                received = live.recv() => match received {
                    Ok(ev) => {
                        if ev.rv <= last_rv {
                            continue;
                        }
                        last_rv = ev.rv;
                        if ev.kind != kind {
                            continue;
                        }
                        if let Some(line) = render(&ev, ns.as_deref(), &sel, table)
                            && !dropped(&sh)
                        {
                            yield line;
                        }
                    }
                    // A watcher too slow for the broadcast is closed, as the real watch cache
                    // does; the client resumes from its last version.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => break,
                },
                _ = &mut sleep => {
                    if bookmarks && end_bookmark {
                        yield bookmark(kind, last_rv, false);
                    }
                    break;
                }
                _ = ticker.tick(), if bookmarks => {
                    yield bookmark(kind, last_rv, false);
                }
                _ = sh.cancel.cancelled() => break,
            }
        }
    };
    Ok(Box::pin(stream))
}

/// Whether a request asks for its watch over WebSocket, as kube-apiserver decides it
/// (`Upgrade: websocket` and an `upgrade` token in `Connection`).
pub(super) fn is_websocket_request(headers: &http::HeaderMap) -> bool {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"));
    let connection = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    upgrade && connection
}

/// Answers a watch over WebSocket as kube-apiserver does (its watch handler on
/// `golang.org/x/net/websocket`): the handshake needs an `Origin` header (else 403) and
/// at most one subprotocol, which is echoed (two or more are a 400); each event is one
/// text message holding the same JSON line as the chunked watch; anything the client
/// sends is ignored except close (answered) and ping (answered with pong); when the watch
/// ends the server sends a normal close.
pub(super) async fn websocket_response(
    parts: &mut http::request::Parts,
    start: impl FnOnce() -> Result<EventStream, ApiError>,
) -> Result<Response, ApiError> {
    use axum::extract::FromRequestParts;
    use axum::extract::ws::WebSocketUpgrade;
    use axum::response::IntoResponse;

    let mut upgrade = match WebSocketUpgrade::from_request_parts(parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return Ok(rejection.into_response()),
    };
    if !parts.headers.contains_key(header::ORIGIN) {
        return Ok(handshake_refused(
            http::StatusCode::FORBIDDEN,
            "websocket handshake refused: null origin (an Origin header is required)",
        ));
    }
    let requested: Vec<HeaderValue> = upgrade.requested_protocols().cloned().collect();
    match requested.as_slice() {
        [] => {}
        [one] => upgrade.set_selected_protocol(one.clone()),
        _ => {
            return Ok(handshake_refused(
                http::StatusCode::BAD_REQUEST,
                "websocket handshake refused: more than one subprotocol offered",
            ));
        }
    }
    let events = start()?;
    Ok(upgrade.on_upgrade(move |socket| serve_socket(socket, events)))
}

fn handshake_refused(code: http::StatusCode, message: &'static str) -> Response {
    let mut resp = Response::new(Body::from(message));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

async fn serve_socket(mut socket: axum::extract::ws::WebSocket, mut events: EventStream) {
    use axum::extract::ws::{CloseFrame, Message, Utf8Bytes};

    loop {
        tokio::select! {
            next = events.next() => match next {
                Some(line) => {
                    // Every event is serialized JSON, hence UTF-8.
                    let Ok(text) = Utf8Bytes::try_from(line) else { continue };
                    if socket.send(Message::Text(text)).await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            incoming = socket.recv() => match incoming {
                // The close reply is queued by the protocol layer and flushed by the next
                // read, which then reports the end of the connection.
                Some(Ok(Message::Close(_))) => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), socket.recv()).await;
                    return;
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return,
            },
        }
    }
    let close = Message::Close(Some(CloseFrame {
        code: 1000,
        reason: Utf8Bytes::from_static(""),
    }));
    if socket.send(close).await.is_err() {
        return;
    }
    // Give the client a moment to answer the close, as the protocol expects.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(msg)) = socket.recv().await {
            if matches!(msg, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}
