//! Limits of the gRPC server (`grpc` in the configuration), so that slow, half-open or
//! numerous clients cannot hold the service's memory or connections: a message size,
//! streams per connection, HTTP/2 keepalive, a deadline for the connection preface, a
//! request timeout and caps on open connections, authenticated and not (enforced in
//! [`super::connections`]).
use std::time::Duration;

use serde::Deserialize;

/// The server's limits; every one has a default that holds a busy service's clients.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ServerLimits {
    /// Largest request message, in bytes (default 4 MiB, gRPC's usual default); a larger
    /// one answers OUT_OF_RANGE (tonic's code), unread.
    pub max_message_bytes: usize,
    /// Streams (calls) open at once on one HTTP/2 connection (default 32: a driver has one
    /// connection with a WatchExecutors stream and a few calls; 32 × (`max_connections` +
    /// `max_unauthenticated_connections`) bounds the half-open streams a flood can hold).
    pub max_concurrent_streams: u32,
    /// Authenticated connections open at once (default 1024): a connection enters this
    /// pool once one of its calls has passed authentication, never before, so clients
    /// that have not authenticated cannot fill it.
    pub max_connections: usize,
    /// Connections open at once that have not authenticated yet (default 256). When full,
    /// a new connection is still accepted and the one of this pool idle the longest is
    /// closed, so a flood cannot keep a new client out.
    pub max_unauthenticated_connections: usize,
    /// An unauthenticated connection with no call open for this long is closed (default
    /// 5 s; a call's own time, a TokenReview's included, does not count).
    pub unauthenticated_idle_timeout_ms: u64,
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
            max_unauthenticated_connections: 256,
            unauthenticated_idle_timeout_ms: 5_000,
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
            (
                "max_unauthenticated_connections",
                self.max_unauthenticated_connections as u64,
            ),
            (
                "unauthenticated_idle_timeout_ms",
                self.unauthenticated_idle_timeout_ms,
            ),
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
