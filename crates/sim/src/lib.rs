//! The simulated Kubernetes cluster: a real HTTP server speaking the Kubernetes API (so
//! kube-rs and kubectl use it exactly as a real API server), with a scheduler, kubelets,
//! a garbage collector and fault injection. See `docs/simulator.md`.

mod kubelet;
mod node;
mod nodes;
mod objects;
mod process;
mod protobuf;
mod quantity;
mod quota;
pub mod selector;
mod server;
mod settings;
pub mod status;
mod store;
mod table;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use node::{NodeError, PROCESS_NODE_PROVISIONER, run_process_node};
pub use nodes::node_name;
pub use server::SimWrite;
pub use settings::{
    AccessSettings, FaultSettings, ImageEnv, KubeletMode, KubeletRuntime, KubeletSettings,
    ProcessImage, SimGrant, SimSettings, SimToken,
};

use server::Shared;
use store::{Kind, Store};

/// Why the simulated cluster could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A setting is out of range.
    #[error("invalid simulator settings: {0}")]
    InvalidSettings(String),
    /// The kubeconfig file could not be written.
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        /// Where it was to be written.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The listen address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Listen {
        /// The address from the settings.
        address: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The store's changes, as [`SimCluster::history`] returns them.
#[derive(Clone, Debug)]
pub struct SimHistory {
    /// No change has been dropped from the history since the start.
    pub complete: bool,
    /// The changes, oldest first.
    pub changes: Vec<SimChange>,
}

/// One change of one object.
#[derive(Clone, Debug)]
pub struct SimChange {
    /// The resourceVersion it produced.
    pub resource_version: u64,
    /// The resource's plural (`pods`).
    pub resource: &'static str,
    /// The object's namespace (empty for a cluster-scoped one).
    pub namespace: String,
    /// `ADDED`, `MODIFIED` or `DELETED`, as a watch names it.
    pub kind: &'static str,
    /// The object after the change (for `DELETED`, its last state).
    pub object: serde_json::Value,
}

/// A running simulated cluster; dropping it stops it.
pub struct SimCluster {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
    server: Option<JoinHandle<()>>,
}

impl SimCluster {
    /// Starts the API server (and, in auto mode, the scheduler, kubelets and garbage
    /// collector) on `settings.listen`.
    pub async fn start(settings: SimSettings) -> Result<SimCluster, SimError> {
        settings.validate().map_err(SimError::InvalidSettings)?;
        for ns in &settings.namespaces {
            if !selector::is_dns_label(ns) {
                return Err(SimError::InvalidSettings(format!(
                    "namespace {ns:?} is not a valid DNS-1123 label"
                )));
            }
        }
        let listener = tokio::net::TcpListener::bind(&settings.listen)
            .await
            .map_err(|source| SimError::Listen {
                address: settings.listen.clone(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Listen {
            address: settings.listen.clone(),
            source,
        })?;
        let processes = match settings.kubelet.runtime {
            KubeletRuntime::Process => Some(
                process::ProcessRuntime::new(&settings.kubelet).map_err(|e| {
                    SimError::InvalidSettings(format!(
                        "kubelet.work_dir: cannot prepare the process runtime's directory: {e}"
                    ))
                })?,
            ),
            KubeletRuntime::Simulated => None,
        };
        let store = Store::new(settings.history);
        let shared = Arc::new(Shared {
            process_dir: processes.as_ref().map(|p| p.base().to_path_buf()),
            store,
            faults: RwLock::new(settings.faults.clone()),
            rng: Mutex::new(SmallRng::seed_from_u64(settings.seed)),
            cancel: CancellationToken::new(),
            address: addr.to_string(),
            lists: server::Hold::new(),
            pod_creates: server::Hold::new(),
            requests: Mutex::new(std::collections::BTreeMap::new()),
            write_tokens: Mutex::new((0.0, None)),
            writes_shed: std::sync::atomic::AtomicU64::new(0),
            writes: Mutex::new(Vec::new()),
            settings,
        });
        let mut namespaces = shared.settings.namespaces.clone();
        if !namespaces.iter().any(|n| n == "default") {
            namespaces.insert(0, "default".to_string());
        }
        for ns in namespaces {
            let body = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            // A namespace listed twice is already there; nothing else can fail here.
            let _ = server::create_internal(&shared, Kind::Namespace, body);
        }
        let mut tasks = Vec::new();
        if shared.settings.kubelet.mode == KubeletMode::Auto {
            // The nodes that run pods, as their kubelets register them (`kubectl get nodes`).
            let now = objects::now_rfc3339();
            for i in 0..shared.settings.kubelet.nodes as usize {
                let node = nodes::node_object(i, shared.settings.kubelet.pods_per_node, &now);
                // Each name is new in a new store; nothing else can fail here.
                let _ = server::create_internal(&shared, Kind::Node, node);
            }
            tasks.push(tokio::spawn(kubelet::run(shared.clone(), processes)));
            tasks.push(tokio::spawn(kubelet::run_gc(shared.clone())));
        }
        let router = server::router(shared.clone());
        let cancel = shared.cancel.clone();
        let server = tokio::spawn(async move {
            let serve = axum::serve(listener, router)
                .with_graceful_shutdown(async move { cancel.cancelled().await });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "simulated API server stopped");
            }
        });
        Ok(SimCluster {
            shared,
            addr,
            tasks,
            server: Some(server),
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The bound socket address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A kube-rs configuration for this cluster (with the first bearer token when auth is on).
    pub fn kube_config(&self) -> kube::Config {
        let uri = self
            .base_url()
            .parse::<http::Uri>()
            .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1"));
        let mut config = kube::Config::new(uri);
        config.default_namespace = "default".to_string();
        if let Some(token) = self.shared.settings.auth_tokens.first()
            && let Ok(value) = http::HeaderValue::from_str(&format!("Bearer {token}"))
        {
            config.headers.push((http::header::AUTHORIZATION, value));
        }
        config
    }

    /// A kube-rs client for this cluster, or why kube-rs could not build one (its TLS
    /// stack failed to initialise); callers propagate the error.
    pub fn try_client(&self) -> Result<kube::Client, kube::Error> {
        kube::Client::try_from(self.kube_config())
    }

    /// A kubeconfig file for kubectl (context `sim`, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        let user = match self.shared.settings.auth_tokens.first() {
            Some(token) => format!("    token: {}\n", serde_json::Value::String(token.clone())),
            None => "    {}\n".to_string(),
        };
        let user = if user.trim() == "{}" {
            "  user: {}\n".to_string()
        } else {
            format!("  user:\n{user}")
        };
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\nusers:\n- name: sim\n{user}preferences: {{}}\n",
            self.base_url()
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path` (through a temporary file and a rename, so
    /// a reader polling for the file never sees half of it).
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        std::fs::write(&tmp, self.kubeconfig_yaml())?;
        std::fs::rename(&tmp, path)
    }

    /// [`Self::write_kubeconfig`] for a user's kubectl, its failure naming the file.
    pub fn publish_kubeconfig(&self, path: &std::path::Path) -> Result<(), SimError> {
        self.write_kubeconfig(path)
            .map_err(|source| SimError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })
    }

    /// Replaces the injected faults (takes effect for the next request or watch).
    pub fn set_faults(&self, faults: FaultSettings) {
        *self
            .shared
            .faults
            .write()
            .unwrap_or_else(|p| p.into_inner()) = faults;
    }

    /// The faults currently injected.
    pub fn faults(&self) -> FaultSettings {
        self.shared.faults()
    }

    /// Writes answered 429 so far for exceeding `faults.max_writes_per_second`.
    pub fn writes_shed(&self) -> u64 {
        self.shared
            .writes_shed
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The API requests served so far, counted by (User-Agent, verb, resource), as
    /// `GET /sim/requests` answers them.
    pub fn requests(&self) -> std::collections::BTreeMap<(String, String, String), u64> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Every write request to a resource received so far (create, update, patch, delete,
    /// subresource), in order of arrival, injected faults or not: with [`Self::history`],
    /// which client wrote what under which state of the objects (the chaos test's proof that
    /// no replica writes for a shard another holds).
    pub fn writes(&self) -> Vec<SimWrite> {
        self.shared
            .writes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The changes the store still keeps (the watch history, `history` of the settings), in
    /// order; `complete` when none has been dropped yet, so they are every change since
    /// the start.
    pub fn history(&self) -> SimHistory {
        let (changes, compacted) = self.shared.store.history();
        SimHistory {
            complete: compacted == 0,
            changes: changes
                .iter()
                .map(|e| SimChange {
                    resource_version: e.rv,
                    resource: e.kind.plural(),
                    namespace: e.namespace.clone(),
                    kind: e.event_type.as_str(),
                    object: (*e.object.value).clone(),
                })
                .collect(),
        }
    }

    /// The objects of `resource` (a plural: `pods`, `leases`) in `namespace` as stored now,
    /// read in process: no injected fault, latency or count.
    pub fn objects(&self, resource: &str, namespace: &str) -> Vec<serde_json::Value> {
        let Some(kind) = store::Kind::ALL
            .iter()
            .copied()
            .find(|k| k.plural() == resource)
        else {
            return Vec::new();
        };
        let (objects, _, _) = self
            .shared
            .store
            .list(kind, Some(namespace), None, 0, |_| true);
        objects.iter().map(|o| (*o.value).clone()).collect()
    }

    /// Holds back the answers of LIST requests (not watches) until [`Self::release_list_responses`]:
    /// each answer shows the state when the request arrived, as a slow LIST on a real
    /// server does, while watches keep streaming newer events.
    pub fn hold_list_responses(&self) {
        self.shared.lists.close(true);
    }

    /// Sends every held LIST answer and stops holding new ones.
    pub fn release_list_responses(&self) {
        self.shared.lists.close(false);
    }

    /// LIST answers held back right now.
    pub fn held_list_responses(&self) -> usize {
        self.shared.lists.held()
    }

    /// Holds pod creates (POST) before they are served until [`Self::release_pod_creates`]:
    /// [`Self::held_pod_creates`] then counts what a client has in flight at once.
    pub fn hold_pod_creates(&self) {
        self.shared.pod_creates.close(true);
    }

    /// Serves every held pod create and stops holding new ones.
    pub fn release_pod_creates(&self) {
        self.shared.pod_creates.close(false);
    }

    /// Pod creates held right now.
    pub fn held_pod_creates(&self) -> usize {
        self.shared.pod_creates.held()
    }

    /// Forgets the watch history: a watch from any version seen so far gets 410 Expired.
    pub fn compact_history(&self) {
        self.shared.store.compact();
    }

    /// The cluster-wide resourceVersion now.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.resource_version()
    }

    /// Runs one garbage-collection pass now; returns how many pods it deleted.
    pub fn collect_garbage(&self) -> usize {
        kubelet::collect_garbage(&self.shared)
    }

    /// Stops serving: watches end, the server finishes open requests, background tasks stop.
    pub async fn shutdown(mut self) {
        self.shared.cancel.cancel();
        if let Some(server) = self.server.take() {
            // Bounded: connections left idle by clients do not keep the shutdown waiting.
            if tokio::time::timeout(std::time::Duration::from_secs(5), server)
                .await
                .is_err()
            {
                tracing::warn!("simulated API server did not stop within 5 s; aborted");
            }
        }
        // The kubelet ends on the cancellation and kills its processes as it ends: wait for
        // that (bounded), so no process outlives the shutdown.
        for mut task in self.tasks.drain(..) {
            if tokio::time::timeout(std::time::Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }
}

/// Runs a cluster until `stop` completes, after writing a kubeconfig for it when asked:
/// the body of `spark-pod-allocator simulate --listen ADDR --kubeconfig PATH`.
pub async fn run_until(
    settings: SimSettings,
    kubeconfig: Option<&std::path::Path>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), SimError> {
    let sim = SimCluster::start(settings).await?;
    if let Some(path) = kubeconfig {
        sim.publish_kubeconfig(path)?;
    }
    tracing::info!(url = %sim.base_url(), kubeconfig = kubeconfig.map(|p| p.display().to_string()),
        "simulated cluster serving");
    stop.await;
    sim.shutdown().await;
    Ok(())
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        self.shared.cancel.cancel();
        if let Some(server) = self.server.take() {
            server.abort();
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}
