//! A real kube-apiserver (over an embedded etcd) for tests: the Go program under
//! `tests/kube-apiserver/`, built by `scripts/build-test-apiserver.sh`, started and stopped
//! here as a process.
//!
//! `TEST_APISERVER_BIN` names the built binary. Unset, the tests that need it print why and
//! return (a developer without Go); set but missing, they fail (CI sets it after building).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::json;

/// The environment variable naming the built test API server.
pub const BINARY_VAR: &str = "TEST_APISERVER_BIN";

/// How long a cold start (etcd, the API server's post-start hooks, RBAC bootstrap) may take on
/// a loaded two-core machine: a hang guard, not a timing assertion.
const START_GUARD: Duration = Duration::from_secs(180);

/// The test API server's flag that also runs kube-scheduler, kube-controller-manager and kwok
/// (fake nodes whose pods go Running), for the tests that need what a cluster does by itself:
/// scheduling, garbage collection, namespaces and their `default` ServiceAccount.
pub const CONTROL_PLANE: &str = "--control-plane";

/// The pod label that picks a pod's fate on a kwok node: `exit` (Running, then Failed with
/// the exit code of [`KWOK_EXIT_CODE`], 1 by default) or `image-pull-backoff` (Pending, its
/// containers waiting). Without it a pod goes Running.
pub const KWOK_OUTCOME: &str = "spark-pod-allocator.test/kwok-outcome";

/// The pod annotation with the exit code of a pod whose [`KWOK_OUTCOME`] is `exit`.
pub const KWOK_EXIT_CODE: &str = "spark-pod-allocator.test/kwok-exit-code";

/// The pod annotation with how long a pod stays Pending on a kwok node (e.g. `2s`).
pub const KWOK_RUNNING_DELAY: &str = "spark-pod-allocator.test/kwok-running-delay";

/// The built binary, or `None` (with the reason printed) when tests should skip the real server.
pub fn binary() -> Option<PathBuf> {
    match std::env::var_os(BINARY_VAR) {
        None => {
            // Once per test binary, and past libtest's capture (which keeps a passing test's
            // output to itself), so that a run shows what it skipped.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "real API server tests skipped: {BINARY_VAR} is not set \
                     (bash scripts/build-test-apiserver.sh builds it and prints the path)"
                );
            });
            None
        }
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "{BINARY_VAR}={} is set but no such file exists",
                path.display()
            );
            Some(path)
        }
    }
}

/// A running test API server: a child process with its own directory.
pub struct RealApiServer {
    binary: PathBuf,
    dir: PathBuf,
    /// Removed on drop unless the server was started on a directory the caller keeps.
    _tempdir: Option<tempfile::TempDir>,
    ephemeral: bool,
    /// Arguments of the test API server itself (e.g. [`CONTROL_PLANE`]).
    server_args: Vec<String>,
    /// Arguments passed on to kube-apiserver.
    extra_args: Vec<String>,
    /// The process and its stdin, held open: the server shuts down when stdin closes (the
    /// test process ended).
    process: Mutex<Option<(Child, ChildStdin)>>,
    /// How many times [`Self::restart`] ran.
    restarts: std::sync::atomic::AtomicUsize,
    /// `https://127.0.0.1:PORT` (the same after a restart).
    pub url: String,
}

impl RealApiServer {
    /// Starts a server on a fresh directory and waits until it is ready.
    pub fn start(binary: &Path) -> Self {
        Self::start_with(binary, &[], false)
    }

    /// [`Self::start`] with arguments for kube-apiserver (e.g. `--watch-cache=false`).
    /// An `ephemeral` server removes its directory itself when it exits: for one that is
    /// never dropped (shared by a test binary) and never restarted.
    pub fn start_with(binary: &Path, extra_args: &[&str], ephemeral: bool) -> Self {
        Self::start_configured(binary, &[], extra_args, ephemeral)
    }

    /// [`Self::start_with`] with arguments for the test API server itself before those for
    /// kube-apiserver (e.g. [`CONTROL_PLANE`]).
    pub fn start_configured(
        binary: &Path,
        server_args: &[&str],
        extra_args: &[&str],
        ephemeral: bool,
    ) -> Self {
        let tempdir = tempfile::Builder::new()
            .prefix("test-apiserver-")
            .tempdir()
            .expect("temporary directory");
        let dir = tempdir.path().to_path_buf();
        let mut server = Self {
            binary: binary.to_path_buf(),
            dir,
            _tempdir: Some(tempdir),
            ephemeral,
            server_args: server_args.iter().map(|a| a.to_string()).collect(),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            process: Mutex::new(None),
            restarts: Default::default(),
            url: String::new(),
        };
        server.url = server.spawn();
        server
    }

    /// Starts the process and waits for its "ready <url>" line.
    fn spawn(&self) -> String {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("apiserver.log"))
            .expect("server log file");
        let mut child = Command::new(&self.binary)
            .arg("--dir")
            .arg(&self.dir)
            .arg("--exit-with-stdin")
            .args(self.ephemeral.then_some("--ephemeral"))
            .args(&self.server_args)
            .arg("--")
            .args(&self.extra_args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("test API server starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("ready ") {
                    let _ = ready_tx.send(url.to_string());
                }
            }
        });
        let stdin = child.stdin.take().expect("piped stdin");
        *self.process.lock().expect("process lock") = Some((child, stdin));
        match ready_rx.recv_timeout(START_GUARD) {
            Ok(url) => url,
            Err(_) => {
                let log =
                    std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default();
                let tail: String = log
                    .lines()
                    .rev()
                    .take(40)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n");
                panic!("the test API server did not become ready; its log ends:\n{tail}");
            }
        }
    }

    /// Stops the server as SIGTERM does (etcd's data stays) and waits for it to exit.
    pub fn stop(&self) {
        let process = self.process.lock().expect("process lock").take();
        if let Some((mut child, stdin)) = process {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
            drop(stdin);
        }
    }

    /// Stops the server and starts it again on the same directory: same port, same data,
    /// same credentials.
    pub fn restart(&self) {
        self.stop();
        self.restarts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let url = self.spawn();
        assert_eq!(url, self.url, "a restart serves the same address");
    }

    /// Whether the server was restarted: just after a restart kube-apiserver answers 403
    /// (with an empty reason) until its RBAC informers have synced.
    pub fn was_restarted(&self) -> bool {
        self.restarts.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    /// The server's directory (kubeconfig, audit.log, apiserver.log, state.json).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A client with the admin's token (system:masters).
    pub async fn admin_client(&self) -> Client {
        client_from_kubeconfig(&self.dir.join("kubeconfig")).await
    }

    /// A client with `token` instead of the admin's.
    pub async fn client_with_token(&self, token: &str) -> Client {
        let path = self.dir.join(format!(
            "kubeconfig-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        self.write_kubeconfig_with_token(token, &path);
        let client = client_from_kubeconfig(&path).await;
        let _ = std::fs::remove_file(&path);
        client
    }

    /// Writes the admin's kubeconfig with `token` instead of the admin's to `path`.
    pub fn write_kubeconfig_with_token(&self, token: &str, path: &Path) {
        let admin = std::fs::read_to_string(self.dir.join("kubeconfig")).expect("kubeconfig");
        let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).expect("kubeconfig");
        config["users"][0]["user"]["token"] = serde_yaml::Value::String(token.to_string());
        std::fs::write(path, serde_yaml::to_string(&config).expect("yaml")).expect("write");
    }

    /// The token of a test user of the static token file (`alice`, `bob`: no role bound).
    pub fn user_token(&self, user: &str) -> String {
        let state = std::fs::read_to_string(self.dir.join("state.json")).expect("state.json");
        let state: serde_json::Value = serde_json::from_str(&state).expect("state.json");
        state["tokens"][user]
            .as_str()
            .unwrap_or_else(|| panic!("no token for {user}"))
            .to_string()
    }

    /// Compacts etcd at its current revision: a watch or list from an older
    /// resourceVersion gets 410 Gone.
    pub fn compact(&self) -> u64 {
        let body = self.control("/compact");
        body.trim().parse().expect("compaction revision")
    }

    /// Stops etcd for `seconds`; the control port starts it again afterwards.
    pub fn stop_etcd(&self, seconds: u32) {
        self.control(&format!("/etcd/stop?seconds={seconds}"));
    }

    fn control(&self, path: &str) -> String {
        let state = std::fs::read_to_string(self.dir.join("state.json")).expect("state.json");
        let state: serde_json::Value = serde_json::from_str(&state).expect("state.json");
        let port = state["controlPort"].as_u64().expect("control port");
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", port as u16)).expect("control port");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        write!(
            stream,
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        )
        .expect("control request");
        let mut response = String::new();
        std::io::Read::read_to_string(&mut stream, &mut response).expect("control response");
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        assert!(
            head.starts_with("HTTP/1.0 200"),
            "control {path}: {response}"
        );
        body.to_string()
    }

    /// Every audit event (JSON lines of audit.k8s.io/v1 Event) logged so far.
    pub fn audit_events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.join("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

async fn client_from_kubeconfig(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("kubeconfig reads");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig loads");
    Client::try_from(config).expect("client")
}

/// Creates `namespace` with its `default` service account (without [`CONTROL_PLANE`] no
/// controller manager runs to make it, and the ServiceAccount admission plugin refuses pods
/// without it).
pub async fn create_namespace(admin: &Client, namespace: &str) {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))
        .expect("namespace manifest");
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("create namespace {namespace}: {e}"),
    }
    create_service_account(admin, namespace, "default").await;
}

/// Creates a service account (an existing one is fine).
pub async fn create_service_account(admin: &Client, namespace: &str, name: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))
        .expect("service account manifest");
    match accounts.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("create service account {namespace}/{name}: {e}"),
    }
}

/// A token of the service account, from the TokenRequest API (signed by the API server's
/// service-account key, valid for an hour).
pub async fn service_account_token(admin: &Client, namespace: &str, name: &str) -> String {
    service_account_token_for(admin, namespace, name, &[]).await
}

/// [`service_account_token`] for `audiences` (none: the API server's own).
pub async fn service_account_token_for(
    admin: &Client,
    namespace: &str,
    name: &str,
    audiences: &[&str],
) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": audiences, "expirationSeconds": 3600}
    }))
    .expect("token request");
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("token request answered")
        .status
        .expect("token request status")
        .token
}
