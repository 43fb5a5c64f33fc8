//! What every handler of the API server shares: the cluster's state, the gates tests close,
//! the query string and the JSON responses.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, RwLock};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use rand::Rng;
use rand::rngs::SmallRng;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::settings::{FaultSettings, SimSettings};
use crate::status::ApiError;
use crate::store::Store;

/// One write request as the API server received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimWrite {
    /// Its User-Agent.
    pub agent: String,
    /// As an audit log names it: `create`, `update`, `patch`, `delete`,
    /// `deletecollection`, `subresource`.
    pub verb: String,
    /// The resource's plural (`pods`), with the subresource after a slash (`pods/binding`).
    pub resource: String,
    /// Its namespace (empty for a cluster-scoped one).
    pub namespace: String,
    /// The object's name (empty for a collection).
    pub name: String,
    /// The store's resourceVersion when it arrived: it was sent after every change up to
    /// this one and before any later one.
    pub received_at: u64,
}

/// State shared by every request, the kubelet and the garbage collector.
pub(crate) struct Shared {
    pub store: Store,
    pub settings: SimSettings,
    pub faults: RwLock<FaultSettings>,
    pub rng: Mutex<SmallRng>,
    pub cancel: CancellationToken,
    /// `host:port` the server listens on (for discovery's serverAddressByClientCIDRs).
    pub address: String,
    /// LIST answers, computed and then held back (see `SimCluster::hold_list_responses`):
    /// reproduces a slow LIST racing watch events.
    pub lists: Hold,
    /// Pod creates, held before they are served (see `SimCluster::hold_pod_creates`):
    /// shows how many a client has in flight at once.
    pub pod_creates: Hold,
    /// The process runtime's base directory (pods' logs), when it runs pods.
    pub process_dir: Option<std::path::PathBuf>,
    /// API requests received (before injected faults), by (User-Agent, verb, resource): lets
    /// a test tell which client listed, watched or created what, and that every request of a
    /// client names it (`GET /sim/requests`). Reviews count as `create` of their resource,
    /// discovery and health as `get` of their path.
    pub requests: Mutex<BTreeMap<(String, String, String), u64>>,
    /// Writes admitted under `faults.max_writes_per_second`: (tokens left, when counted).
    pub write_tokens: Mutex<(f64, Option<std::time::Instant>)>,
    /// Writes answered 429 because they were above `faults.max_writes_per_second`.
    pub writes_shed: std::sync::atomic::AtomicU64,
    /// Every write request to a resource received (before injected faults), in order, with
    /// the store's version at its arrival: which client wrote what, under which state of
    /// the objects (`SimCluster::writes`).
    pub writes: Mutex<Vec<SimWrite>>,
}

impl Shared {
    pub(crate) fn faults(&self) -> FaultSettings {
        self.faults
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A uniform random number in `0..1` from the seeded generator.
    pub(crate) fn roll(&self) -> f64 {
        self.rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .r#gen::<f64>()
    }

    pub(super) fn uid(&self) -> String {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let b: [u8; 16] = rng.r#gen();
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-4{}-a{}-{}",
            &h[0..8],
            &h[8..12],
            &h[13..16],
            &h[17..20],
            &h[20..32]
        )
    }

    pub(super) fn name_suffix(&self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        (0..5)
            .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
            .collect()
    }
}

/// A gate tests close to hold requests of one kind where they are (a LIST's answer,
/// already computed, shows the state at the time of the request, as a slow response on a
/// real server does), and count them.
#[derive(Debug)]
pub(crate) struct Hold {
    closed: tokio::sync::watch::Sender<bool>,
    held: std::sync::atomic::AtomicUsize,
}

impl Hold {
    pub fn new() -> Self {
        Self {
            closed: tokio::sync::watch::channel(false).0,
            held: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Holds the requests that come from now on, or lets every held one go.
    pub fn close(&self, closed: bool) {
        self.closed.send_replace(closed);
    }

    /// Requests held right now.
    pub fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits while the gate is closed.
    pub(super) async fn pass(&self) {
        use std::sync::atomic::Ordering;
        let mut closed = self.closed.subscribe();
        if !*closed.borrow_and_update() {
            return;
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        // Ends when the gate opens or the sender (the cluster) is gone.
        let _ = closed.wait_for(|closed| !*closed).await;
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
}

pub(super) type Query = HashMap<String, String>;

pub(super) fn flag(q: &Query, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true" || v == "1")
}

pub(super) fn parse_u64(q: &Query, key: &str) -> Result<Option<u64>, ApiError> {
    match q.get(key).map(String::as_str) {
        None | Some("") => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "invalid value {v:?} for {key}: must be a non-negative integer"
            ))
        }),
    }
}

pub(super) fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut resp = (code, body.into()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) fn value_response(code: StatusCode, v: &Value) -> Response {
    json_response(code, v.to_string())
}
