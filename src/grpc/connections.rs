//! The connections of a listener, in two pools, so that clients that have not
//! authenticated can never lock out those that have (issue 19, "no lock-out").
//!
//! Every accepted connection starts in the **unauthenticated** pool
//! (`grpc.max_unauthenticated_connections`). It moves to the **authenticated** pool
//! (`grpc.max_connections`) once one of its calls has passed the gate
//! ([`mark_authenticated`], called by the service on the gate's success): with
//! `auth.mode = kubernetes` a call whose token TokenReview accepted, with `auth.mode = none`
//! a call that reached an allocator method (decoded; the gate lets everyone in). Health and
//! reflection calls never authenticate a connection.
//!
//! An unauthenticated connection is closed once it has been idle (no call open, a streamed
//! response counting as open until it ends) for `grpc.unauthenticated_idle_timeout_ms`.
//! When the unauthenticated pool is full, a new connection is still accepted and the
//! connection of that pool idle the longest is closed instead (the one open the longest if
//! none is idle). Refusing the new one would let a flood that reconnects every few seconds
//! keep every real client out, since every client starts unauthenticated; evicting makes a
//! flood displace itself, and a real client only needs its slot for the few milliseconds
//! of its first call.
//!
//! The authenticated pool is only ever entered by promotion: an unauthenticated connection
//! never takes its room. When it is full a connection that authenticates stays in the
//! unauthenticated pool (deadline and eviction included).
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use hyper::body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo, TcpIncoming};

use super::limits::ServerLimits;

tokio::task_local! {
    /// The connection of the call being served (set by [`ConnectionLayer`] around each
    /// call), so that the gate's success can promote it without every handler passing its
    /// request extensions along.
    static CALL_CONNECTION: Arc<Connection>;
}

/// Marks the connection of the call being served as authenticated (it moves to the
/// authenticated pool if that has room). A no-op outside a served call.
pub fn mark_authenticated() {
    let _ = CALL_CONNECTION.try_with(|connection| connection.authenticate());
}

/// The client's connection preface (24 bytes) and the header of its SETTINGS frame: once
/// read, the handshake is under way and HTTP/2 keepalive takes over.
const HANDSHAKE_BYTES: usize = 24 + 9;

/// A flood would flood the log: the first event of a kind, then every 1000th.
fn worth_logging(count: u64) -> bool {
    count % 1000 == 1
}

/// The two pools of one listener.
pub struct ConnectionPools {
    /// `grpc` for the API port, `health` for the probe port (in log lines).
    listener: &'static str,
    max_authenticated: usize,
    max_unauthenticated: usize,
    idle_timeout: Duration,
    handshake_timeout: Duration,
    /// Where connection times are counted from.
    epoch: Instant,
    next_id: AtomicU64,
    state: Mutex<PoolState>,
    evicted: AtomicU64,
    not_promoted: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    authenticated: usize,
    unauthenticated: HashMap<u64, Arc<Connection>>,
}

/// Where a connection stands; changed only under the pools' lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Place {
    Unauthenticated = 0,
    Authenticated = 1,
    /// Closed to make room; its I/O fails from now on.
    Evicted = 2,
    /// Its I/O has been dropped: it holds no room any more.
    Closed = 3,
}

/// One connection as its calls and its I/O see it.
pub struct Connection {
    id: u64,
    pools: Arc<ConnectionPools>,
    place: AtomicU8,
    /// Calls open on it (a streamed response until its end).
    open_calls: AtomicUsize,
    /// When a call last began or ended on it, or it was accepted (µs since the epoch).
    last_active_us: AtomicU64,
    /// The I/O task to wake when the connection is evicted.
    waker: AtomicWaker,
    /// Whether eviction has been logged for it (once).
    logged: AtomicBool,
}

impl ConnectionPools {
    /// The pools of the API listener, as `limits` configures them.
    pub fn new(limits: &ServerLimits) -> Arc<Self> {
        Self::build("grpc", limits.max_connections, limits)
    }

    /// The pool of the health listener: nothing on it authenticates, so it has only the
    /// unauthenticated pool, with the same size, deadline and eviction.
    pub fn health(limits: &ServerLimits) -> Arc<Self> {
        Self::build("health", 0, limits)
    }

    fn build(listener: &'static str, max_authenticated: usize, limits: &ServerLimits) -> Arc<Self> {
        Arc::new(Self {
            listener,
            max_authenticated,
            max_unauthenticated: limits.max_unauthenticated_connections.max(1),
            idle_timeout: Duration::from_millis(limits.unauthenticated_idle_timeout_ms),
            handshake_timeout: Duration::from_millis(limits.handshake_timeout_ms),
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            state: Mutex::new(PoolState::default()),
            evicted: AtomicU64::new(0),
            not_promoted: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Takes `stream` into the unauthenticated pool, evicting that pool's longest-idle
    /// connection if it is full.
    fn admit(self: &Arc<Self>, stream: TcpStream) -> GuardedConnection {
        let connection = Arc::new(Connection {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            pools: Arc::clone(self),
            place: AtomicU8::new(Place::Unauthenticated as u8),
            open_calls: AtomicUsize::new(0),
            last_active_us: AtomicU64::new(self.now_us()),
            waker: AtomicWaker::new(),
            logged: AtomicBool::new(false),
        });
        let mut state = self.lock();
        while state.unauthenticated.len() >= self.max_unauthenticated {
            // Idle ones first, then the one whose last call began or ended the longest ago.
            let Some(victim) = state
                .unauthenticated
                .values()
                .min_by_key(|c| {
                    (
                        c.open_calls.load(Ordering::SeqCst) > 0,
                        c.last_active_us.load(Ordering::SeqCst),
                        c.id,
                    )
                })
                .map(Arc::clone)
            else {
                break;
            };
            state.unauthenticated.remove(&victim.id);
            victim.set_place(Place::Evicted);
            victim.waker.wake();
            let evicted = self.evicted.fetch_add(1, Ordering::Relaxed) + 1;
            if worth_logging(evicted) {
                tracing::warn!(
                    listener = self.listener,
                    max_unauthenticated_connections = self.max_unauthenticated,
                    evicted,
                    "unauthenticated connection closed to make room: \
                     grpc.max_unauthenticated_connections are open"
                );
            }
        }
        state
            .unauthenticated
            .insert(connection.id, Arc::clone(&connection));
        drop(state);
        GuardedConnection::new(stream, connection)
    }
}

impl Connection {
    fn place(&self) -> Place {
        match self.place.load(Ordering::SeqCst) {
            0 => Place::Unauthenticated,
            1 => Place::Authenticated,
            2 => Place::Evicted,
            _ => Place::Closed,
        }
    }

    fn set_place(&self, place: Place) {
        self.place.store(place as u8, Ordering::SeqCst);
    }

    fn touch(&self) {
        self.last_active_us
            .store(self.pools.now_us(), Ordering::SeqCst);
    }

    /// Moves it to the authenticated pool, if it is not there yet and that has room.
    fn authenticate(&self) {
        if self.place() != Place::Unauthenticated {
            return;
        }
        let pools = &self.pools;
        let mut state = pools.lock();
        if self.place() != Place::Unauthenticated {
            return;
        }
        if state.authenticated < pools.max_authenticated {
            state.authenticated += 1;
            state.unauthenticated.remove(&self.id);
            self.set_place(Place::Authenticated);
            return;
        }
        drop(state);
        let count = pools.not_promoted.fetch_add(1, Ordering::Relaxed) + 1;
        if worth_logging(count) {
            tracing::warn!(
                max_connections = pools.max_authenticated,
                count,
                "an authenticated connection stays in the unauthenticated pool: \
                 grpc.max_connections authenticated connections are open"
            );
        }
    }

    /// A call begins; it is open until the guard drops.
    fn call_opened(self: &Arc<Self>) -> OpenCall {
        self.touch();
        self.open_calls.fetch_add(1, Ordering::SeqCst);
        OpenCall(Arc::clone(self))
    }

    /// When an unauthenticated connection must be closed (handshake or idle deadline),
    /// and why; `None` when nothing is due yet (the instant of the next check instead).
    fn deadline(&self, handshaken: bool, accepted: Instant) -> Deadline {
        let pools = &self.pools;
        let handshake = (!handshaken).then(|| {
            (
                accepted + pools.handshake_timeout,
                "no HTTP/2 handshake within grpc.handshake_timeout_ms",
            )
        });
        let idle = match self.place() {
            Place::Unauthenticated if self.open_calls.load(Ordering::SeqCst) == 0 => {
                let since = Duration::from_micros(self.last_active_us.load(Ordering::SeqCst));
                Some((
                    pools.epoch + since + pools.idle_timeout,
                    "unauthenticated and idle for grpc.unauthenticated_idle_timeout_ms",
                ))
            }
            // A call is open: check again a timeout later (its end moves the deadline).
            Place::Unauthenticated => Some((Instant::now() + pools.idle_timeout, "")),
            _ => None,
        };
        match (handshake, idle) {
            (None, None) => Deadline::None,
            (Some(one), None) | (None, Some(one)) => Deadline::At(one.0, one.1),
            (Some(a), Some(b)) => {
                let first = if a.0 <= b.0 { a } else { b };
                Deadline::At(first.0, first.1)
            }
        }
    }
}

enum Deadline {
    None,
    /// The instant, and why the connection closes then (empty: only a check is due).
    At(Instant, &'static str),
}

/// A call open on a connection.
struct OpenCall(Arc<Connection>);

impl Drop for OpenCall {
    fn drop(&mut self) {
        self.0.touch();
        self.0.open_calls.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The connections `listener` accepts, into `pools`; each is closed if it has not sent its
/// handshake within `grpc.handshake_timeout_ms`, and while unauthenticated, once idle for
/// `grpc.unauthenticated_idle_timeout_ms` or evicted to make room.
pub fn incoming(
    listener: TcpListener,
    pools: Arc<ConnectionPools>,
) -> impl Stream<Item = io::Result<GuardedConnection>> + Send + 'static {
    let mut accepted = TcpIncoming::from(listener).with_nodelay(Some(true));
    async_stream::stream! {
        while let Some(next) = accepted.next().await {
            match next {
                Ok(stream) => yield Ok(pools.admit(stream)),
                Err(err) => yield Err(err),
            }
        }
    }
}

/// What the server knows of a connection in each of its calls' request extensions (tonic
/// puts it there): its addresses, and its standing among the pools.
#[derive(Clone)]
pub struct ConnectionInfo {
    tcp: TcpConnectInfo,
    connection: Arc<Connection>,
}

impl ConnectionInfo {
    /// The client's address.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.tcp.remote_addr()
    }

    /// What a call's request extensions hold of its connection (plaintext or TLS).
    fn in_extensions(extensions: &http::Extensions) -> Option<&ConnectionInfo> {
        extensions.get::<ConnectionInfo>().or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<ConnectionInfo>>()
                .map(|tls| tls.get_ref())
        })
    }

    /// The connection of a call, from its request extensions.
    fn of(extensions: &http::Extensions) -> Option<Arc<Connection>> {
        Self::in_extensions(extensions).map(|info| Arc::clone(&info.connection))
    }
}

/// The client's address of a call. tonic's `Request::remote_addr` knows only its own
/// connection types, not [`ConnectionInfo`], so it would answer `None` here.
pub fn peer_addr<T>(request: &tonic::Request<T>) -> Option<SocketAddr> {
    ConnectionInfo::in_extensions(request.extensions())
        .and_then(ConnectionInfo::remote_addr)
        .or_else(|| request.remote_addr())
}

/// An accepted connection holding its place in its pool until it is dropped, and failing
/// its I/O once it is evicted or one of its deadlines passes.
pub struct GuardedConnection {
    stream: TcpStream,
    connection: Arc<Connection>,
    accepted: Instant,
    /// Armed while a deadline may apply (handshake not read, or unauthenticated).
    timer: Option<Pin<Box<Sleep>>>,
    read: usize,
}

impl GuardedConnection {
    fn new(stream: TcpStream, connection: Arc<Connection>) -> Self {
        let accepted = Instant::now();
        Self {
            stream,
            connection,
            accepted,
            timer: Some(Box::pin(tokio::time::sleep_until(accepted))),
            read: 0,
        }
    }

    fn evicted(&self) -> io::Error {
        if !self.connection.logged.swap(true, Ordering::Relaxed) {
            tracing::debug!(
                peer = ?self.stream.peer_addr().ok(),
                "connection closed: evicted from the full unauthenticated pool"
            );
        }
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "unauthenticated connection evicted",
        )
    }

    /// An error once a deadline has passed; else arms the timer for the next one.
    fn check_deadlines(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        let Some(timer) = self.timer.as_mut() else {
            return Ok(());
        };
        let handshaken = self.read >= HANDSHAKE_BYTES;
        match self.connection.deadline(handshaken, self.accepted) {
            Deadline::None => {
                self.timer = None;
                Ok(())
            }
            Deadline::At(at, why) if !why.is_empty() && at <= Instant::now() => {
                tracing::debug!(
                    peer = ?self.stream.peer_addr().ok(),
                    bytes = self.read,
                    "connection closed: {why}"
                );
                Err(io::Error::new(io::ErrorKind::TimedOut, why))
            }
            Deadline::At(at, why) => {
                // A deadline moves with the connection's calls; a mere check (a call is
                // open) keeps the timer it has until that one passes.
                let keep = if why.is_empty() {
                    timer.deadline() > Instant::now()
                } else {
                    timer.deadline() == at
                };
                if !keep {
                    timer.as_mut().reset(at);
                }
                // Registers the waker: the connection's task is polled again at `at`.
                let _ = timer.as_mut().poll(cx);
                Ok(())
            }
        }
    }
}

/// The connection is gone: its room in its pool is free (a call still finishing on it can
/// no longer promote it).
impl Drop for GuardedConnection {
    fn drop(&mut self) {
        let connection = &self.connection;
        let mut state = connection.pools.lock();
        match connection.place() {
            Place::Unauthenticated => {
                state.unauthenticated.remove(&connection.id);
            }
            Place::Authenticated => {
                state.authenticated = state.authenticated.saturating_sub(1);
            }
            Place::Evicted | Place::Closed => {}
        }
        connection.set_place(Place::Closed);
    }
}

impl Connected for GuardedConnection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            tcp: self.stream.connect_info(),
            connection: Arc::clone(&self.connection),
        }
    }
}

impl AsyncRead for GuardedConnection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.connection.place() == Place::Evicted {
            return Poll::Ready(Err(this.evicted()));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read {
            this.read += buf.filled().len() - before;
        }
        if let Err(err) = this.check_deadlines(cx) {
            return Poll::Ready(Err(err));
        }
        if read.is_pending() {
            this.connection.waker.register(cx.waker());
            // Evicted between the check above and the registration.
            if this.connection.place() == Place::Evicted {
                return Poll::Ready(Err(this.evicted()));
            }
        }
        read
    }
}

impl AsyncWrite for GuardedConnection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.connection.place() == Place::Evicted {
            return Poll::Ready(Err(this.evicted()));
        }
        Pin::new(&mut this.stream).poll_write(cx, buf)
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
        let this = self.get_mut();
        if this.connection.place() == Place::Evicted {
            return Poll::Ready(Err(this.evicted()));
        }
        Pin::new(&mut this.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A tower layer around the server's services: counts each call as open on its connection
/// until its response ends (so an open call, a Watch stream included, is never "idle"),
/// and lets the gate's success promote that connection ([`mark_authenticated`]).
#[derive(Debug, Clone, Default)]
pub struct ConnectionLayer;

impl<S> tower::Layer<S> for ConnectionLayer {
    type Service = TrackCalls<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TrackCalls { inner }
    }
}

/// The service of [`ConnectionLayer`].
#[derive(Debug, Clone)]
pub struct TrackCalls<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for TrackCalls<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: Body<Data = bytes::Bytes> + Send + Unpin + 'static,
    R::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let connection = ConnectionInfo::of(request.extensions());
        let open = connection.as_ref().map(Connection::call_opened);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = match connection {
                Some(connection) => CALL_CONNECTION.scope(connection, response).await?,
                None => response.await?,
            };
            Ok(response.map(|body| tonic::body::Body::new(CallBody { body, _open: open })))
        })
    }
}

/// A response body that holds its call open until it ends.
struct CallBody<B> {
    body: B,
    _open: Option<OpenCall>,
}

impl<B: Body + Unpin> Body for CallBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
