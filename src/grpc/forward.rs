//! Calls for an application whose shard another replica owns are forwarded to that replica,
//! so a driver needs one address (the Service) whichever replica its connection reaches.
//!
//! The owner is the holder of the shard's Lease, reached at the address it writes there
//! (`ha.advertise_address`). Start names its namespace, so its shard is known; the other
//! calls name only the application, so they go to the replica that answered for it last
//! while it holds a shard, else to each other owner in turn until one knows it (NOT_FOUND from every owner is the
//! answer; with one shard, there is one). A forward carries the caller's own credentials
//! (its `authorization` metadata), which the owner verifies again: no replica takes
//! another's word for who is calling. A forwarded call is never forwarded again.
//!
//! A peer serves `grpc.max_concurrent_streams` calls at once on one connection, and a
//! call past that waits for a slot. So forwards never share a connection across caller
//! identities, nor a tenant's streams with its unary calls: each identity has, to each
//! peer, one connection for its unary calls and as many for its WatchExecutors streams
//! as they fill ([`Lanes`]). One tenant's streams or calls then only ever wait behind its
//! own, and its forwarded streams through one replica are bounded by
//! `tenants.max_watch_streams_per_identity`, as the owner bounds them.
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

use super::error::{RETRY_PUSHBACK_METADATA, code_name, retry_pushback};
use crate::ha::{Ownerships, Peer, ShardOwner};
use crate::metrics::Metrics;
use crate::proto::executor_allocator_client::ExecutorAllocatorClient;

/// A client of another replica.
pub type PeerClient = ExecutorAllocatorClient<Channel>;

/// Metadata of a forwarded call: the identity of the replica it came through.
pub const FORWARDED_BY_METADATA: &str = "x-spark-pod-allocator-forwarded-by";

/// The caller's metadata a forward carries: its credentials and its request id.
const FORWARDED_METADATA: [&str; 2] = ["authorization", super::observe::REQUEST_ID_METADATA];

/// Applications whose last owner is remembered; past it the memory starts afresh (it only
/// saves asking the owners in turn).
const ROUTES_CAPACITY: usize = 10_000;

/// Unary lanes (one identity's connection to one peer) kept at once; past it they start
/// afresh (each connects again on its next call; calls under way finish on theirs).
const UNARY_LANES: usize = 1024;

/// Deadline of a forwarded unary call, and of connecting to a peer.
pub const UNARY_DEADLINE: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How often a connection to a peer is pinged, and how long an answer may take: a peer
/// paused (a frozen VM, a stop-the-world pause) keeps its TCP connections open, and a
/// stream forwarded to it would wait for it for ever instead of following its application
/// to the new owner.
const PEER_KEEPALIVE: Duration = Duration::from_secs(5);

/// How long routing waits for shard keepers' first turns (a replica just started).
pub const FIRST_TURN_WAIT: Duration = Duration::from_secs(10);

/// How long routing waits for a keeper's fresh turn when its last Lease request failed
/// (the API server may be back); a call is answered UNAVAILABLE after it at worst.
const LEASE_RETRY_WAIT: Duration = Duration::from_secs(2);

/// How the replicas reach each other.
#[derive(Debug, Clone)]
pub struct PeerSettings {
    /// PEM CA of the peers' certificates: forwards go over TLS (`ha.peer_ca_file`).
    pub ca_pem: Option<Vec<u8>>,
    /// The name the peers' certificates are verified for (`ha.peer_server_name`).
    pub server_name: Option<String>,
    /// Streams a peer serves at once on one connection: the replicas share the
    /// configuration, so this replica's `grpc.max_concurrent_streams`.
    pub streams_per_connection: u32,
    /// Forwarded WatchExecutors streams one identity may hold through this replica
    /// (`tenants.max_watch_streams_per_identity`).
    pub streams_per_identity: usize,
}

impl Default for PeerSettings {
    fn default() -> Self {
        Self {
            ca_pem: None,
            server_name: None,
            streams_per_connection: super::limits::ServerLimits::default().max_concurrent_streams,
            streams_per_identity: crate::app::TenantLimits::default()
                .max_watch_streams_per_identity,
        }
    }
}

impl PeerSettings {
    /// The peer settings of `ha`: its CA read from `ha.peer_ca_file`, if set.
    pub fn load(ha: &crate::ha::HaSettings) -> Result<Self, String> {
        let ca_pem =
            match &ha.peer_ca_file {
                Some(path) => Some(std::fs::read(path).map_err(|err| {
                    format!("cannot read ha.peer_ca_file {}: {err}", path.display())
                })?),
                None => None,
            };
        Ok(Self {
            ca_pem,
            server_name: ha.peer_server_name.clone(),
            ..Self::default()
        })
    }
}

/// One call to forward: which, for which application and caller, to whom, with what
/// deadline.
pub struct Forward<'a> {
    pub method: &'static str,
    pub app: &'a str,
    /// Who is calling (its authenticated user; empty when nobody is authenticated): its
    /// forwards take their own connections.
    pub identity: &'a str,
    /// The replicas to ask in turn.
    pub peers: Vec<Peer>,
    /// A shard nobody reachable owns now (the application may be there).
    pub unowned: Option<String>,
    /// [`UNARY_DEADLINE`] for a unary call; none for a stream, which lasts as long as
    /// the owner's.
    pub deadline: Option<Duration>,
}

/// Where a call is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Here: this replica owns the application, or nobody else can.
    Here,
    /// By the first of these replicas that knows the application; `unowned` names a shard
    /// nobody reachable owns now (the application may be there).
    Peers {
        peers: Vec<Peer>,
        unowned: Option<String>,
    },
    /// Nobody reachable owns the shard the application may be in: UNAVAILABLE, retry.
    Unowned(String),
}

/// The forwarding side of one replica; [`Forwarder::off`] answers everything here.
#[derive(Clone, Default)]
pub struct Forwarder {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    ownerships: Ownerships,
    peers: PeerSettings,
    metrics: Metrics,
    lanes: Mutex<Lanes>,
    /// Per application, the replica that answered for it last.
    routes: Mutex<HashMap<String, Peer>>,
}

impl std::fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarder")
            .field("on", &self.inner.is_some())
            .finish()
    }
}

impl Forwarder {
    /// No forwarding: every call is answered by this replica.
    pub fn off() -> Self {
        Self::default()
    }

    /// Forwards to the owners `ownerships` knows, as `peers` says to reach them.
    pub fn new(ownerships: Ownerships, peers: PeerSettings, metrics: Metrics) -> Self {
        Self {
            inner: Some(Arc::new(Inner {
                ownerships,
                peers,
                metrics,
                lanes: Mutex::new(Lanes::default()),
                routes: Mutex::new(HashMap::new()),
            })),
        }
    }

    /// The route of a Start for `namespace`: its shard's owner. Waits (at most
    /// [`FIRST_TURN_WAIT`]) for shard keepers that have not finished a first turn, so that a
    /// replica just started forwards a Start its peer owns rather than refusing it. A shard
    /// nobody reachable owns is answered here: the fence says why, UNAVAILABLE.
    pub async fn route_namespace(&self, namespace: &str, metadata: &MetadataMap) -> Route {
        let Some(inner) = self.inner.as_ref().filter(|_| !is_forwarded(metadata)) else {
            return Route::Here;
        };
        let ownerships = &inner.ownerships;
        ownerships.settled(FIRST_TURN_WAIT).await;
        let shard = ownerships.shard_of(namespace);
        match ownerships.owner_now(shard, LEASE_RETRY_WAIT).await {
            ShardOwner::Peer(peer) => Route::Peers {
                peers: vec![peer],
                unowned: None,
            },
            ShardOwner::Here | ShardOwner::Unknown { .. } => Route::Here,
        }
    }

    /// The route of a call for `app`, which this replica runs when `here`. Waits (at most
    /// [`FIRST_TURN_WAIT`]) for shard keepers that have not finished a first turn.
    pub async fn route_application(&self, app: &str, here: bool, metadata: &MetadataMap) -> Route {
        let Some(inner) = self
            .inner
            .as_ref()
            .filter(|_| !here && !is_forwarded(metadata))
        else {
            return Route::Here;
        };
        let ownerships = &inner.ownerships;
        ownerships.settled(FIRST_TURN_WAIT).await;
        let mut peers: Vec<Peer> = Vec::new();
        let mut unowned = None;
        for shard in ownerships.map().shards() {
            match ownerships.owner_now(shard, LEASE_RETRY_WAIT).await {
                ShardOwner::Here => {}
                ShardOwner::Peer(peer) => {
                    if !peers.contains(&peer) {
                        peers.push(peer);
                    }
                }
                ShardOwner::Unknown { holder } => {
                    unowned.get_or_insert_with(|| unowned_message(&shard.lease_name(), holder));
                }
            }
        }
        // The replica that answered last goes first while it still holds a shard; one that
        // holds none (deposed, perhaps paused) is not asked: its answer would never come.
        if let Some(last) = lock(&inner.routes).get(app)
            && let Some(at) = peers.iter().position(|peer| peer == last)
        {
            peers[..=at].rotate_right(1);
        }
        match (peers.is_empty(), unowned) {
            (true, None) => Route::Here,
            (true, Some(why)) => Route::Unowned(why),
            (false, unowned) => Route::Peers { peers, unowned },
        }
    }

    /// Sends `message` to the first of `forward.peers` that knows `forward.app` (through
    /// `call`), and returns its answer. NOT_FOUND from every peer is NOT_FOUND, unless a
    /// peer could not be reached or a shard has no owner now: then UNAVAILABLE, retry.
    pub async fn send<M, R, F, Fut>(
        &self,
        forward: Forward<'_>,
        metadata: &MetadataMap,
        message: M,
        call: F,
    ) -> Result<tonic::Response<R>, Status>
    where
        M: Clone,
        F: Fn(PeerClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let Forward {
            method,
            app,
            identity,
            peers,
            unowned,
            deadline,
        } = forward;
        let Some(inner) = &self.inner else {
            return Err(Status::internal("forwarding is off"));
        };
        let mut unowned = unowned;
        let mut not_found = None;
        for peer in peers {
            // A stream (no deadline) holds a slot of its lane for as long as it lasts.
            let lane = match deadline {
                Some(_) => inner.unary_lane(&peer.address, identity),
                None => inner.stream_lane(&peer.address, identity),
            };
            let (channel, slot) = match lane {
                Ok(lane) => lane,
                Err(LaneError::Unreachable(why)) => {
                    inner.metrics.forwarded(method, "UNAVAILABLE");
                    unowned.get_or_insert(why);
                    continue;
                }
                Err(LaneError::Exhausted(status)) => {
                    inner.metrics.forwarded(method, "RESOURCE_EXHAUSTED");
                    return Err(status);
                }
            };
            let mut request = inner.request(metadata, message.clone());
            if let Some(deadline) = deadline {
                request.set_timeout(deadline);
            }
            match call(ExecutorAllocatorClient::new(channel), request).await {
                Ok(reply) => {
                    inner.metrics.forwarded(method, "OK");
                    inner.remember(app, &peer);
                    let mut reply = reply;
                    mark_answered_by(reply.metadata_mut(), &peer);
                    if let Some(slot) = slot {
                        reply.extensions_mut().insert(slot);
                    }
                    return Ok(reply);
                }
                Err(status) => {
                    let outcome = inner.outcome(method, &peer, &status);
                    match outcome {
                        Outcome::Answer => {
                            let mut status = status;
                            mark_answered_by(status.metadata_mut(), &peer);
                            return Err(status);
                        }
                        Outcome::NotHere => {
                            inner.forget(app, &peer);
                            not_found.get_or_insert(status);
                        }
                        Outcome::Unreachable(why) => {
                            inner.forget(app, &peer);
                            unowned.get_or_insert(why);
                        }
                    }
                }
            }
        }
        match (unowned, not_found) {
            (Some(why), _) => Err(unavailable(&why)),
            (None, Some(status)) => Err(status),
            (None, None) => Err(Status::internal("no replica to forward to")),
        }
    }
}

/// Whether the call came from another replica.
pub fn is_forwarded(metadata: &MetadataMap) -> bool {
    metadata.contains_key(FORWARDED_BY_METADATA)
}

/// What a peer's answer means for the forward.
enum Outcome {
    /// The owner's answer: the caller gets it.
    Answer,
    /// The peer does not run the application: ask the next.
    NotHere,
    /// The peer could not be reached, or no longer owns the shard: the next, else retry.
    Unreachable(String),
}

/// The connections forwards take, per peer and caller identity.
#[derive(Default)]
struct Lanes {
    unary: HashMap<LaneKey, Channel>,
    streams: HashMap<LaneKey, Vec<StreamConnection>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct LaneKey {
    address: String,
    identity: String,
}

/// One connection of an identity's streams to a peer, and how many of them it carries.
struct StreamConnection {
    channel: Channel,
    open: Arc<AtomicUsize>,
}

/// A forwarded stream's place on its connection, given back when the last clone drops
/// (the stream ended). It rides in the forwarded response's extensions.
#[derive(Clone)]
pub struct StreamSlot {
    _guard: Arc<SlotGuard>,
}

struct SlotGuard(Arc<AtomicUsize>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

enum LaneError {
    /// The peer's address or TLS is not usable.
    Unreachable(String),
    /// The identity holds as many forwarded streams as it may.
    Exhausted(Status),
}

impl Inner {
    /// The connection of `identity`'s unary calls to the peer at `address`.
    fn unary_lane(
        &self,
        address: &str,
        identity: &str,
    ) -> Result<(Channel, Option<StreamSlot>), LaneError> {
        let key = LaneKey {
            address: address.to_string(),
            identity: identity.to_string(),
        };
        let mut lanes = lock(&self.lanes);
        if let Some(channel) = lanes.unary.get(&key) {
            return Ok((channel.clone(), None));
        }
        let channel = self.connect(address).map_err(LaneError::Unreachable)?;
        // Identities and replicas (new pod IPs) come and go: past a bound, the lanes start
        // afresh.
        if lanes.unary.len() >= UNARY_LANES {
            lanes.unary.clear();
        }
        lanes.unary.insert(key, channel.clone());
        Ok((channel, None))
    }

    /// A connection of `identity`'s streams to the peer at `address` with a free slot (a
    /// new one when all are full), and the slot; RESOURCE_EXHAUSTED when the identity
    /// holds `streams_per_identity` forwarded streams already.
    fn stream_lane(
        &self,
        address: &str,
        identity: &str,
    ) -> Result<(Channel, Option<StreamSlot>), LaneError> {
        let per_connection =
            usize::try_from(self.peers.streams_per_connection.max(1)).unwrap_or(usize::MAX);
        let mut lanes = lock(&self.lanes);
        // Connections whose streams all ended are let go (their connection closes).
        lanes.streams.retain(|_, connections| {
            connections.retain(|c| c.open.load(Ordering::Acquire) > 0);
            !connections.is_empty()
        });
        let held: usize = (lanes.streams.iter())
            .filter(|(key, _)| key.identity == identity)
            .flat_map(|(_, connections)| connections)
            .map(|c| c.open.load(Ordering::Acquire))
            .sum();
        if held >= self.peers.streams_per_identity {
            let who = if identity.is_empty() {
                "this service's callers"
            } else {
                identity
            };
            return Err(LaneError::Exhausted(Status::resource_exhausted(format!(
                "tenants.max_watch_streams_per_identity: {who} already holds {held} \
                 WatchExecutors streams through this replica, the most it allows one \
                 identity; close one first"
            ))));
        }
        let key = LaneKey {
            address: address.to_string(),
            identity: identity.to_string(),
        };
        let connections = lanes.streams.entry(key).or_default();
        let free = connections
            .iter()
            .find(|c| c.open.load(Ordering::Acquire) < per_connection);
        let (channel, open) = match free {
            Some(c) => (c.channel.clone(), Arc::clone(&c.open)),
            None => {
                let channel = self.connect(address).map_err(LaneError::Unreachable)?;
                let open = Arc::new(AtomicUsize::new(0));
                connections.push(StreamConnection {
                    channel: channel.clone(),
                    open: Arc::clone(&open),
                });
                (channel, open)
            }
        };
        open.fetch_add(1, Ordering::AcqRel);
        Ok((
            channel,
            Some(StreamSlot {
                _guard: Arc::new(SlotGuard(open)),
            }),
        ))
    }

    fn connect(&self, address: &str) -> Result<Channel, String> {
        let scheme = if self.peers.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        let endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|err| format!("the peer address {address} is not usable: {err}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(PEER_KEEPALIVE)
            .keep_alive_timeout(PEER_KEEPALIVE)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true);
        let endpoint = match &self.peers.ca_pem {
            Some(ca) => {
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some(name) = &self.peers.server_name {
                    tls = tls.domain_name(name.clone());
                }
                endpoint
                    .tls_config(tls)
                    .map_err(|err| format!("TLS to the peer {address}: {err}"))?
            }
            None => endpoint,
        };
        Ok(endpoint.connect_lazy())
    }

    fn request<M>(&self, metadata: &MetadataMap, message: M) -> Request<M> {
        let mut request = Request::new(message);
        let forwarded = request.metadata_mut();
        for key in FORWARDED_METADATA {
            if let Some(value) = metadata.get(key) {
                forwarded.insert(key, value.clone());
            }
        }
        if let Ok(identity) = MetadataValue::try_from(self.ownerships.identity()) {
            forwarded.insert(FORWARDED_BY_METADATA, identity);
        }
        request
    }

    /// Counts `status` from `peer` (by its code: the owner's, or the transport's when the
    /// peer could not be reached) and says what it means.
    fn outcome(&self, method: &'static str, peer: &Peer, status: &Status) -> Outcome {
        // A status read from the peer's trailers has no source; one with a source was made
        // here from a failure of the transport: the stream reset or the connection closed
        // under the call (a peer shutting down refuses the streams its GOAWAY did not
        // take), a reply that could not be read, the deadline. Whatever its code
        // (CANCELLED, INTERNAL, UNKNOWN), it is no answer of the owner's: passed on, the
        // driver would take it for one and not retry.
        if std::error::Error::source(status).is_some() {
            self.metrics.forwarded(method, "UNAVAILABLE");
            return Outcome::Unreachable(format!(
                "the replica {} ({}) that held the shard gave no answer: {}",
                peer.identity,
                peer.address,
                status.message()
            ));
        }
        self.metrics.forwarded(method, code_name(status.code()));
        match status.code() {
            Code::NotFound => Outcome::NotHere,
            // The peer's own UNAVAILABLE (it lost the shard, or is shutting down) or the
            // transport's (it is gone): either way, someone else may answer soon.
            Code::Unavailable => Outcome::Unreachable(format!(
                "the replica {} ({}) that held the shard did not answer: {}",
                peer.identity,
                peer.address,
                status.message()
            )),
            _ => Outcome::Answer,
        }
    }

    fn remember(&self, app: &str, peer: &Peer) {
        let mut routes = lock(&self.routes);
        if routes.len() >= ROUTES_CAPACITY && !routes.contains_key(app) {
            routes.clear();
        }
        routes.insert(app.to_string(), peer.clone());
    }

    fn forget(&self, app: &str, peer: &Peer) {
        let mut routes = lock(&self.routes);
        if routes.get(app) == Some(peer) {
            routes.remove(app);
        }
    }
}

/// Metadata naming the replica that answered a forwarded call.
pub const ANSWERED_BY_METADATA: &str = "x-spark-pod-allocator-answered-by";

/// Marks an owner's answer with who gave it.
fn mark_answered_by(metadata: &mut MetadataMap, peer: &Peer) {
    if let Ok(identity) = MetadataValue::try_from(peer.identity.as_str()) {
        metadata.insert(ANSWERED_BY_METADATA, identity);
    }
}

/// UNAVAILABLE with the retry hint: the shard is changing hands.
pub fn unavailable(why: &str) -> Status {
    let mut status = Status::unavailable(format!(
        "{why}; the application's shard is changing hands, retry shortly"
    ));
    status
        .metadata_mut()
        .insert(RETRY_PUSHBACK_METADATA, retry_pushback());
    status
}

fn unowned_message(lease: &str, holder: Option<String>) -> String {
    match holder {
        Some(holder) => format!(
            "the shard of Lease {lease} is held by {holder}, which advertises no address (ha.advertise_address)"
        ),
        None => format!("no replica holds the shard of Lease {lease} now"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::net::TcpListener;
    use tokio::sync::watch;

    use super::*;
    use crate::ha::ShardState;
    use crate::ha::shards::ShardMap;

    /// A peer speaking HTTP/2 that answers every call as `answer` does.
    async fn peer(answer: fn(h2::server::SendResponse<bytes::Bytes>)) -> Peer {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(mut connection) = h2::server::handshake(socket).await else {
                        return;
                    };
                    while let Some(Ok((_request, respond))) = connection.accept().await {
                        answer(respond);
                    }
                });
            }
        });
        Peer {
            identity: "replica-b".into(),
            address,
        }
    }

    async fn forward_to(
        peer: Peer,
    ) -> Result<tonic::Response<crate::proto::ApplicationStatus>, Status> {
        let (_tx, rx) = watch::channel(ShardState::Unknown);
        let ownerships = Ownerships::new(
            ShardMap::new(1).expect("one shard"),
            "replica-a",
            vec![rx],
            vec![Arc::default()],
        );
        let forwarder = Forwarder::new(ownerships, PeerSettings::default(), Metrics::new());
        let forward = Forward {
            method: "GetStatus",
            app: "app-1",
            identity: "alice",
            peers: vec![peer],
            unowned: None,
            deadline: Some(Duration::from_secs(5)),
        };
        let message = crate::proto::GetStatusRequest {
            application_id: "app-1".into(),
        };
        forwarder
            .send(
                forward,
                &MetadataMap::new(),
                message,
                |mut client, request| async move { client.get_status(request).await },
            )
            .await
    }

    #[tokio::test]
    async fn a_call_the_peer_resets_unanswered_is_unavailable_with_the_retry_hint() {
        // As a peer shutting down does to a stream its GOAWAY did not take.
        let status =
            forward_to(peer(|mut respond| respond.send_reset(h2::Reason::REFUSED_STREAM)).await)
                .await
                .expect_err("no answer");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.metadata().get(RETRY_PUSHBACK_METADATA).is_some(),
            "{status:?}"
        );
        let status =
            forward_to(peer(|mut respond| respond.send_reset(h2::Reason::INTERNAL_ERROR)).await)
                .await
                .expect_err("no answer");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }

    #[tokio::test]
    async fn an_error_the_owner_answers_is_passed_on_as_it_came() {
        let owner = peer(|mut respond| {
            let response = http::Response::builder()
                .header("content-type", "application/grpc")
                .header("grpc-status", "13")
                .header("grpc-message", "the owner broke")
                .body(())
                .expect("response");
            let _ = respond.send_response(response, true);
        })
        .await;
        let status = forward_to(owner).await.expect_err("the owner's error");
        assert_eq!(
            (status.code(), status.message()),
            (Code::Internal, "the owner broke")
        );
        assert_eq!(
            status
                .metadata()
                .get(ANSWERED_BY_METADATA)
                .and_then(|v| v.to_str().ok()),
            Some("replica-b")
        );
    }

    #[tokio::test]
    async fn each_identitys_streams_fill_connections_of_their_own_up_to_its_bound() {
        let (_tx, rx) = watch::channel(ShardState::Unknown);
        let ownerships = Ownerships::new(
            ShardMap::new(1).expect("one shard"),
            "replica-a",
            vec![rx],
            vec![Arc::default()],
        );
        let peers = PeerSettings {
            streams_per_connection: 2,
            streams_per_identity: 3,
            ..PeerSettings::default()
        };
        let forwarder = Forwarder::new(ownerships, peers, Metrics::new());
        let inner = forwarder.inner.as_ref().expect("forwarding on");
        let peer = "127.0.0.1:1";
        let slot = |identity: &str| match inner.stream_lane(peer, identity) {
            Ok((_, Some(slot))) => Ok(slot),
            Ok((_, None)) => panic!("a stream without a slot"),
            Err(LaneError::Exhausted(status)) => Err(status),
            Err(LaneError::Unreachable(why)) => panic!("{why}"),
        };
        let connections = |identity: &str| {
            lock(&inner.lanes)
                .streams
                .get(&LaneKey {
                    address: peer.into(),
                    identity: identity.into(),
                })
                .map_or(0, Vec::len)
        };
        let mut alices: Vec<StreamSlot> = (0..3)
            .map(|_| slot("alice").expect("within alice's bound"))
            .collect();
        assert_eq!(connections("alice"), 2, "two streams a connection");
        let refused = slot("alice")
            .err()
            .expect("alice's fourth stream is refused");
        assert_eq!(refused.code(), Code::ResourceExhausted);
        assert!(
            refused
                .message()
                .contains("tenants.max_watch_streams_per_identity"),
            "{refused:?}"
        );
        // Another identity is not held by alice's streams, nor shares their connections.
        let bob = slot("bob").expect("bob's stream");
        assert_eq!(connections("bob"), 1);
        // A stream that ends gives its place back.
        alices.pop();
        alices.push(slot("alice").expect("a place came free"));
        // Connections whose streams all ended are let go.
        alices.clear();
        drop(bob);
        let _carol = slot("carol").expect("carol's stream");
        assert_eq!((connections("alice"), connections("bob")), (0, 0));

        // Unary calls take one connection per identity, apart from its streams.
        for identity in ["alice", "bob", "alice"] {
            assert!(inner.unary_lane(peer, identity).is_ok());
        }
        assert_eq!(lock(&inner.lanes).unary.len(), 2);
    }
}
