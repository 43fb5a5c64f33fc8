//! Limits of the gRPC server (`grpc` in the configuration), so that slow, half-open or
//! numerous clients cannot hold the service's memory or connections: a message size,
//! streams per connection, HTTP/2 keepalive, a deadline for the connection preface, a
//! request timeout and a cap on open connections.
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

/// The server's limits; every one has a default that holds a busy service's clients.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerLimits {
    /// Largest request message, in bytes (default 4 MiB, gRPC's usual default); a larger
    /// one answers OUT_OF_RANGE (tonic's code), unread.
    pub max_message_bytes: usize,
    /// Streams (calls) open at once on one HTTP/2 connection (default 32: a driver has one
    /// connection with a WatchExecutors stream and a few calls; 32 × `max_connections`
    /// bounds the half-open streams a flood can hold).
    pub max_concurrent_streams: u32,
    /// Connections open at once; one more is closed as soon as it is accepted (default 1024).
    pub max_connections: usize,
    /// Time a new connection has to send the HTTP/2 connection preface and its first
    /// SETTINGS frame before it is closed (default 10 s).
    pub handshake_timeout_ms: u64,
    /// Interval of HTTP/2 PINGs on an idle connection (default 30 s; 0 = none).
    pub keepalive_interval_ms: u64,
    /// Time a PING has to be answered before the connection is closed (default 10 s).
    pub keepalive_timeout_ms: u64,
    /// Deadline of one call until its response starts (its request read, its work done);
    /// streamed responses (WatchExecutors, health Watch) run on after it (default 120 s;
    /// 0 = none). A client's shorter `grpc-timeout` wins.
    pub request_timeout_ms: u64,
    /// Largest header list of a call, in bytes (default 16 KiB).
    pub max_header_list_bytes: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_message_bytes: 4 * 1024 * 1024,
            max_concurrent_streams: 32,
            max_connections: 1024,
            handshake_timeout_ms: 10_000,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 10_000,
            request_timeout_ms: 120_000,
            max_header_list_bytes: 16 * 1024,
        }
    }
}

impl ServerLimits {
    /// The rule a value breaks, as `(key, reason)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let positive = [
            ("max_message_bytes", self.max_message_bytes as u64),
            (
                "max_concurrent_streams",
                u64::from(self.max_concurrent_streams),
            ),
            ("max_connections", self.max_connections as u64),
            ("handshake_timeout_ms", self.handshake_timeout_ms),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms),
            (
                "max_header_list_bytes",
                u64::from(self.max_header_list_bytes),
            ),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err((key, "must be greater than 0".into()));
            }
        }
        Ok(())
    }

    /// The PING interval, if any.
    pub fn keepalive_interval(&self) -> Option<Duration> {
        (self.keepalive_interval_ms > 0).then(|| Duration::from_millis(self.keepalive_interval_ms))
    }

    /// The call deadline, if any.
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.request_timeout_ms > 0).then(|| Duration::from_millis(self.request_timeout_ms))
    }
}

/// The client's connection preface (24 bytes) and the header of its SETTINGS frame: once
/// read, the handshake is under way and HTTP/2 keepalive takes over.
const HANDSHAKE_BYTES: usize = 24 + 9;

/// The connections `listener` accepts, at most `limits.max_connections` open at once (one
/// more is closed at once, before any byte is read), each closed if it has not sent its
/// handshake within `limits.handshake_timeout_ms`.
pub fn incoming(
    listener: TcpListener,
    limits: &ServerLimits,
) -> impl Stream<Item = io::Result<GuardedConnection>> + Send + 'static {
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let max = limits.max_connections;
    let handshake = Duration::from_millis(limits.handshake_timeout_ms);
    let mut accepted = TcpIncoming::from(listener).with_nodelay(Some(true));
    async_stream::stream! {
        let mut refused: u64 = 0;
        while let Some(next) = accepted.next().await {
            let stream = match next {
                Ok(stream) => stream,
                Err(err) => {
                    yield Err(err);
                    continue;
                }
            };
            match Arc::clone(&open).try_acquire_owned() {
                Ok(permit) => yield Ok(GuardedConnection::new(stream, permit, handshake)),
                Err(_) => {
                    refused += 1;
                    // A flood would flood the log: the first refusal, then every 1000th.
                    if refused % 1000 == 1 {
                        tracing::warn!(
                            max_connections = max,
                            refused,
                            "connection refused: grpc.max_connections connections are open"
                        );
                    }
                    drop(stream);
                }
            }
        }
    }
}

/// An accepted connection holding its place among the open ones until it is dropped, and
/// failing its reads once the handshake deadline passes without a handshake.
pub struct GuardedConnection {
    stream: TcpStream,
    _open: OwnedSemaphorePermit,
    /// Until the handshake is read.
    deadline: Option<Pin<Box<Sleep>>>,
    read: usize,
}

impl GuardedConnection {
    fn new(stream: TcpStream, open: OwnedSemaphorePermit, handshake: Duration) -> Self {
        Self {
            stream,
            _open: open,
            deadline: Some(Box::pin(tokio::time::sleep(handshake))),
            read: 0,
        }
    }
}

impl Connected for GuardedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for GuardedConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.read += buf.filled().len() - before;
                if this.read >= HANDSHAKE_BYTES {
                    this.deadline = None;
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(err)) => Poll::Ready(Err(err)),
            Poll::Pending => {
                let expired =
                    (this.deadline.as_mut()).is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if !expired {
                    return Poll::Pending;
                }
                tracing::debug!(
                    peer = ?this.stream.peer_addr().ok(),
                    bytes = this.read,
                    "connection closed: no HTTP/2 handshake within grpc.handshake_timeout_ms"
                );
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 handshake in time",
                )))
            }
        }
    }
}

impl AsyncWrite for GuardedConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
