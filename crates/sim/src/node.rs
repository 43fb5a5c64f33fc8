//! A process node for any Kubernetes API server (`spark-pod-allocator process-node`): it
//! registers a Node, runs the pods the scheduler binds to it as local processes with the
//! simulator's [`ProcessRuntime`], and writes their status back as a kubelet does — Running
//! with the pod IP 127.0.0.1, each container's state and exit code, Succeeded or Failed;
//! a graceful deletion is SIGTERM, SIGKILL after the grace period, then the kubelet's grace-0
//! delete. Everything goes through kube-rs over HTTP: one watch of the pods with
//! `spec.nodeName=<node>`, one of the claims (for the node's provisioner), GETs of the
//! ConfigMaps a pod needs, `pods/status` writes. See `docs/process-runtime.md`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret, ServiceAccount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use nix::sys::signal::Signal;
use rand::Rng;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::kubelet::{Outcome, START_RETRY, container_exited, started};
use super::process::{
    Exited, Key, POD_IP, ProcessRuntime, StartFailure, config_maps_needed, field_ref, pod_dir_name,
};
use super::settings::KubeletSettings;

/// The provisioner name of the node's StorageClasses: a claim of such a class that the
/// scheduler gives this node (`volume.kubernetes.io/selected-node`) gets a local
/// PersistentVolume (a directory under the work directory), bound to it.
pub const PROCESS_NODE_PROVISIONER: &str = "spark-pod-allocator.test/process-node";

/// Why the process node stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The work directory could not be prepared.
    #[error("kubelet.work_dir: cannot prepare the process runtime's directory: {0}")]
    WorkDir(std::io::Error),
    /// The Node could not be registered.
    #[error("cannot register node {node}: {source}")]
    Register {
        /// The node's name.
        node: String,
        /// The API server's answer.
        source: kube::Error,
    },
}

/// What the node tracks of one pod bound to it.
struct Track {
    key: Key,
    /// The pod's processes started (or failed to start): never again for this uid.
    started: bool,
    /// The waiting reason last written, so a pod waiting for a ConfigMap is written once.
    waiting: Option<String>,
    /// The grace period a SIGKILL is scheduled for, once SIGTERM was sent.
    kill_grace: Option<u64>,
    /// The grace-0 delete was sent.
    confirmed: bool,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// Try the start again (a ConfigMap was missing).
    Start,
    /// The grace period is over: SIGKILL.
    Kill,
}

struct ProcessNode {
    name: String,
    pods: Api<Pod>,
    client: kube::Client,
    runtime: ProcessRuntime,
    /// By uid.
    tracks: HashMap<String, Track>,
    timers: BinaryHeap<Reverse<(Instant, String, Action)>>,
    /// Uids seen during a relist (a pod not seen again is gone).
    relisted: Option<Vec<String>>,
}

/// Registers node `name` and runs the pods bound to it until `stop` completes; then kills
/// every process it started.
pub async fn run_process_node(
    client: kube::Client,
    api_server: &http::Uri,
    kubelet: &KubeletSettings,
    name: &str,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), NodeError> {
    let mut runtime = ProcessRuntime::new(kubelet).map_err(NodeError::WorkDir)?;
    runtime.set_cluster_env(cluster_env(api_server));
    register(&client, name)
        .await
        .map_err(|source| NodeError::Register {
            node: name.to_string(),
            source,
        })?;
    tracing::info!(node = name, work_dir = %runtime.base().display(), "process node registered");
    let volumes_dir = runtime.base().join("persistent-volumes");
    let mut node = ProcessNode {
        name: name.to_string(),
        pods: Api::all(client.clone()),
        client: client.clone(),
        runtime,
        tracks: HashMap::new(),
        timers: BinaryHeap::new(),
        relisted: None,
    };
    let pod_events = watcher::watcher(
        node.pods.clone(),
        watcher::Config::default().fields(&format!("spec.nodeName={name}")),
    )
    .default_backoff();
    let claim_events = watcher::watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff();
    tokio::pin!(pod_events, claim_events, stop);
    loop {
        let next = node.timers.peek().map(|t| t.0.0);
        tokio::select! {
            event = pod_events.next() => match event {
                Some(Ok(event)) => node.on_event(event).await,
                Some(Err(e)) => tracing::warn!(error = %e, "pod watch"),
                None => break,
            },
            event = claim_events.next() => match event {
                Some(Ok(Event::Apply(claim) | Event::InitApply(claim))) => {
                    if let Err(e) = provision(&client, name, &volumes_dir, &claim).await {
                        tracing::warn!(claim = claim.metadata.name.as_deref(), error = %e, "cannot provision the claim");
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "claim watch"),
                None => break,
            },
            Some(exited) = node.runtime.next_exit() => node.on_exit(exited).await,
            _ = sleep_until(next) => node.fire_due().await,
            _ = &mut stop => break,
        }
    }
    node.runtime.stop_all().await;
    Ok(())
}

/// A kubelet's `KUBERNETES_SERVICE_HOST` and `_PORT`: the API server as this machine
/// reaches it (the pods share its network, where the `kubernetes` Service's cluster IP
/// means nothing).
fn cluster_env(api_server: &http::Uri) -> Vec<(String, String)> {
    let Some(host) = api_server.host() else {
        return Vec::new();
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = api_server
        .port_u16()
        .unwrap_or(if api_server.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    vec![
        ("KUBERNETES_SERVICE_HOST".into(), host),
        ("KUBERNETES_SERVICE_PORT".into(), port.to_string()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.to_string()),
    ]
}

/// The files of a Secret's or ConfigMap's keys (or of `items`, key → path).
fn select_items(spec: &Value, data: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    match spec.get("items").and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .filter_map(|item| {
                let key = str_at(item, "/key");
                let content = data.iter().find(|(k, _)| *k == key)?.1.clone();
                Some((str_at(item, "/path"), content))
            })
            .collect(),
        None => data,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Creates the Node (kept when it exists, as a restarted kubelet finds it), lifts the
/// not-ready taint the API server puts on a new node (no node-lifecycle controller runs to
/// lift it), and reports it Ready with room for many pods.
async fn register(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    // Go's names, as a kubelet reports them.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let body: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch,
            "spark-pod-allocator.test/process-node": "true"
        }},
    }))
    .map_err(kube::Error::SerdeError)?;
    match nodes.create(&PostParams::default(), &body).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e),
    }
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": null}})),
        )
        .await?;
    let now = jiff::Timestamp::now().to_string();
    let capacity =
        json!({"cpu": "32", "memory": "64Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    let condition = |kind: &str, status: &str, reason: &str| json!({"type": kind, "status": status, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now});
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "capacity": capacity, "allocatable": capacity,
                "addresses": [{"type": "InternalIP", "address": POD_IP}, {"type": "Hostname", "address": name}],
                "conditions": [
                    condition("Ready", "True", "KubeletReady"),
                    condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                    condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                    condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                ],
                "nodeInfo": {
                    "architecture": arch, "operatingSystem": "linux",
                    "kubeletVersion": "spark-pod-allocator-process-node", "kubeProxyVersion": "",
                    "containerRuntimeVersion": "local-process://1", "osImage": "", "kernelVersion": "",
                    "machineID": "", "systemUUID": "", "bootID": ""
                }
            }})),
        )
        .await?;
    Ok(())
}

impl ProcessNode {
    async fn on_event(&mut self, event: Event<Pod>) {
        match event {
            Event::Init => self.relisted = Some(Vec::new()),
            Event::InitApply(pod) => {
                if let (Some(seen), Some(uid)) = (&mut self.relisted, pod.metadata.uid.clone()) {
                    seen.push(uid);
                }
                self.on_pod(pod).await;
            }
            Event::InitDone => {
                let seen = self.relisted.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .tracks
                    .keys()
                    .filter(|uid| !seen.contains(uid))
                    .cloned()
                    .collect();
                for uid in gone {
                    self.gone(&uid);
                }
            }
            Event::Apply(pod) => self.on_pod(pod).await,
            Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid {
                    self.gone(&uid);
                }
            }
        }
    }

    /// A pod that left the API server: what still runs of it is killed at once.
    fn gone(&mut self, uid: &str) {
        self.runtime.signal(uid, Signal::SIGKILL);
        self.tracks.remove(uid);
    }

    fn schedule(&mut self, uid: &str, action: Action, after: Duration) {
        self.timers
            .push(Reverse((Instant::now() + after, uid.to_string(), action)));
    }

    async fn on_pod(&mut self, pod: Pod) {
        let Ok(value) = serde_json::to_value(&pod) else {
            return;
        };
        let uid = str_at(&value, "/metadata/uid");
        let key = (
            str_at(&value, "/metadata/namespace"),
            str_at(&value, "/metadata/name"),
        );
        if uid.is_empty() || str_at(&value, "/spec/nodeName") != self.name {
            return;
        }
        let track = self.tracks.entry(uid.clone()).or_insert_with(|| Track {
            key: key.clone(),
            started: false,
            waiting: None,
            kill_grace: None,
            confirmed: false,
        });
        let (started, kill_grace, confirmed) = (track.started, track.kill_grace, track.confirmed);
        if value.pointer("/metadata/deletionTimestamp").is_some() {
            let grace = value
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(30);
            if self.runtime.is_running(&uid) {
                // The kubelet's stop: SIGTERM now, SIGKILL when the grace period is over (a
                // second delete may shorten it); the grace-0 delete follows the exit.
                if kill_grace.is_none_or(|g| grace < g) {
                    if kill_grace.is_none() {
                        self.runtime.signal(&uid, Signal::SIGTERM);
                    }
                    track.kill_grace = Some(grace);
                    self.schedule(&uid, Action::Kill, Duration::from_secs(grace));
                }
            } else if !confirmed {
                track.confirmed = true;
                self.confirm_deletion(&key, &uid).await;
            }
            return;
        }
        let phase = str_at(&value, "/status/phase");
        if started || matches!(phase.as_str(), "Succeeded" | "Failed") {
            return;
        }
        self.start(&key, &uid, value).await;
    }

    /// Starts the pod's containers, or writes why they wait (and tries again soon) or
    /// cannot start.
    async fn start(&mut self, key: &Key, uid: &str, mut pod: Value) {
        let config_maps = self.config_maps(&key.0, &pod).await;
        self.mount_claims(&key.0, &mut pod).await;
        let tried = match self.mount_api_volumes(key, uid, &mut pod).await {
            Ok(()) => self.runtime.start(key, &pod, &config_maps),
            Err(failure) => Err(failure),
        };
        let outcome = match tried {
            Ok(true) => Outcome::Running,
            Ok(false) => return,
            Err(failure) => match failure.waiting {
                Some(reason) => {
                    self.schedule(uid, Action::Start, START_RETRY);
                    let track = self.tracks.get_mut(uid);
                    if track
                        .as_ref()
                        .is_some_and(|t| t.waiting.as_deref() == Some(reason))
                    {
                        return;
                    }
                    if let Some(t) = track {
                        t.waiting = Some(reason.to_string());
                    }
                    Outcome::Waiting(failure.container, reason, failure.message)
                }
                None => {
                    tracing::warn!(pod = %key.1, namespace = %key.0, reason = %failure.message, "cannot start the pod");
                    Outcome::StartFailed(failure.container, failure.message)
                }
            },
        };
        if !matches!(outcome, Outcome::Waiting(..))
            && let Some(t) = self.tracks.get_mut(uid)
        {
            t.started = true;
        }
        let containerd: String = {
            let mut rng = rand::thread_rng();
            (0..16)
                .map(|_| format!("{:x}", rng.gen_range(0..16u8)))
                .collect()
        };
        self.write_status(key, uid, |cur| {
            Some(started(cur, &outcome, POD_IP, POD_IP, &containerd))
        })
        .await;
    }

    /// The ConfigMaps the pod needs, as the API server has them now (a missing one is left
    /// out: the runtime then waits for it).
    async fn config_maps(&self, ns: &str, pod: &Value) -> HashMap<Key, Arc<Value>> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let mut found = HashMap::new();
        for name in config_maps_needed(pod) {
            if let Ok(Some(cm)) = api.get_opt(&name).await
                && let Ok(value) = serde_json::to_value(cm)
            {
                found.insert((ns.to_string(), name), Arc::new(value));
            }
        }
        found
    }

    /// What a kubelet takes from the API server for a pod, written as files and variables
    /// the runtime then uses as they are: each `secret` and `projected` volume (Secrets,
    /// ConfigMaps, the downward API, a ServiceAccount token from the TokenRequest API bound
    /// to the pod, with its audience and expiry) becomes a `hostPath` directory in the
    /// pod's directory, and each `secretKeyRef` variable its value. A missing Secret or
    /// ConfigMap keeps the pod waiting, as a kubelet does.
    async fn mount_api_volumes(
        &self,
        key: &Key,
        uid: &str,
        pod: &mut Value,
    ) -> Result<(), StartFailure> {
        let wait = |reason: &'static str, message: String| StartFailure {
            container: 0,
            message,
            waiting: Some(reason),
        };
        let fail = |message: String| StartFailure {
            container: 0,
            message,
            waiting: None,
        };
        let (ns, name) = key;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), ns);
        let config_maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        let dir = self
            .runtime
            .base()
            .join(ns)
            .join(pod_dir_name(name, uid))
            .join("volumes");
        let snapshot = pod.clone();
        let account = match str_at(&snapshot, "/spec/serviceAccountName") {
            a if a.is_empty() => "default".to_string(),
            a => a,
        };
        if let Some(volumes) = pod
            .pointer_mut("/spec/volumes")
            .and_then(Value::as_array_mut)
        {
            for volume in volumes.iter_mut() {
                let vname = str_at(volume, "/name");
                let mut files: Vec<(String, Vec<u8>)> = Vec::new();
                let sources: Vec<Value> = if let Some(secret) = volume.get("secret") {
                    vec![json!({"secret": {
                        "name": secret.get("secretName").cloned().unwrap_or(Value::Null),
                        "items": secret.get("items").cloned().unwrap_or(Value::Null),
                        "optional": secret.get("optional").cloned().unwrap_or(Value::Null),
                    }})]
                } else if let Some(sources) = volume
                    .pointer("/projected/sources")
                    .and_then(Value::as_array)
                {
                    sources.clone()
                } else {
                    continue;
                };
                for source in &sources {
                    let optional =
                        |v: &Value| v.get("optional").and_then(Value::as_bool) == Some(true);
                    if let Some(spec) = source.get("secret") {
                        let secret_name = str_at(spec, "/name");
                        match secrets.get_opt(&secret_name).await {
                            Ok(Some(secret)) => {
                                let data: Vec<(String, Vec<u8>)> = secret
                                    .data
                                    .unwrap_or_default()
                                    .into_iter()
                                    .map(|(k, v)| (k, v.0))
                                    .collect();
                                files.extend(select_items(spec, data));
                            }
                            Ok(None) if optional(spec) => {}
                            Ok(None) => {
                                return Err(wait(
                                    "ContainerCreating",
                                    format!(
                                        "MountVolume.SetUp failed for volume {vname:?} : secret \"{secret_name}\" not found"
                                    ),
                                ));
                            }
                            Err(e) => {
                                return Err(wait(
                                    "ContainerCreating",
                                    format!("secret {secret_name:?}: {e}"),
                                ));
                            }
                        }
                    } else if let Some(spec) = source.get("configMap") {
                        let cm_name = str_at(spec, "/name");
                        match config_maps.get_opt(&cm_name).await {
                            Ok(Some(cm)) => {
                                let data: Vec<(String, Vec<u8>)> = cm
                                    .data
                                    .unwrap_or_default()
                                    .into_iter()
                                    .map(|(k, v)| (k, v.into_bytes()))
                                    .chain(
                                        cm.binary_data
                                            .unwrap_or_default()
                                            .into_iter()
                                            .map(|(k, v)| (k, v.0)),
                                    )
                                    .collect();
                                files.extend(select_items(spec, data));
                            }
                            Ok(None) if optional(spec) => {}
                            Ok(None) => {
                                return Err(wait(
                                    "ContainerCreating",
                                    format!(
                                        "MountVolume.SetUp failed for volume {vname:?} : configmap \"{cm_name}\" not found"
                                    ),
                                ));
                            }
                            Err(e) => {
                                return Err(wait(
                                    "ContainerCreating",
                                    format!("configmap {cm_name:?}: {e}"),
                                ));
                            }
                        }
                    } else if let Some(spec) = source.get("downwardAPI") {
                        for item in spec
                            .get("items")
                            .and_then(Value::as_array)
                            .into_iter()
                            .flatten()
                        {
                            let path = str_at(item, "/fieldRef/fieldPath");
                            let Some(value) = field_ref(&snapshot, &path) else {
                                return Err(fail(format!(
                                    "volume {vname:?}: unsupported fieldRef {path:?}"
                                )));
                            };
                            files.push((str_at(item, "/path"), value.into_bytes()));
                        }
                    } else if let Some(spec) = source.get("serviceAccountToken") {
                        let token = self
                            .token(ns, &account, name, uid, spec)
                            .await
                            .map_err(|e| wait("ContainerCreating", format!("volume {vname:?}: cannot get a token for service account {account:?}: {e}")))?;
                        files.push((str_at(spec, "/path"), token.into_bytes()));
                    }
                }
                let target = dir.join(&vname);
                for (file, content) in files {
                    if file.is_empty()
                        || file.starts_with('/')
                        || file.split('/').any(|p| p == "..")
                    {
                        return Err(fail(format!(
                            "volume {vname:?}: path {file:?} leaves the volume"
                        )));
                    }
                    let path = target.join(&file);
                    let written = path
                        .parent()
                        .map_or(Ok(()), std::fs::create_dir_all)
                        .and_then(|()| std::fs::write(&path, content));
                    if let Err(e) = written {
                        return Err(fail(format!("volume {vname:?}: {}: {e}", path.display())));
                    }
                }
                if let Err(e) = std::fs::create_dir_all(&target) {
                    return Err(fail(format!("volume {vname:?}: {}: {e}", target.display())));
                }
                if let Some(object) = volume.as_object_mut() {
                    object.remove("secret");
                    object.remove("projected");
                    object.insert("hostPath".into(), json!({"path": target}));
                }
            }
        }
        // Secret variables become plain values (`$` escaped: the runtime expands `$(VAR)`).
        let containers = pod
            .pointer_mut("/spec/containers")
            .and_then(Value::as_array_mut);
        for container in containers.into_iter().flatten() {
            for variable in container
                .get_mut("env")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                let Some(spec) = variable.pointer("/valueFrom/secretKeyRef").cloned() else {
                    continue;
                };
                let (secret_name, wanted) = (str_at(&spec, "/name"), str_at(&spec, "/key"));
                let value = match secrets.get_opt(&secret_name).await {
                    Ok(Some(secret)) => secret
                        .data
                        .unwrap_or_default()
                        .remove(&wanted)
                        .map(|v| String::from_utf8_lossy(&v.0).replace('$', "$$")),
                    Ok(None) => None,
                    Err(e) => {
                        return Err(wait(
                            "CreateContainerConfigError",
                            format!("secret {secret_name:?}: {e}"),
                        ));
                    }
                };
                let Some(object) = variable.as_object_mut() else {
                    continue;
                };
                match value {
                    Some(value) => {
                        object.remove("valueFrom");
                        object.insert("value".into(), Value::String(value));
                    }
                    None if spec.get("optional").and_then(Value::as_bool) == Some(true) => {
                        object.remove("valueFrom");
                    }
                    None => {
                        return Err(wait(
                            "CreateContainerConfigError",
                            format!("couldn't find key {wanted} in Secret {ns}/{secret_name}"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// A token of the pod's ServiceAccount from the TokenRequest API, bound to the pod.
    async fn token(
        &self,
        ns: &str,
        account: &str,
        pod: &str,
        uid: &str,
        spec: &Value,
    ) -> Result<String, kube::Error> {
        let audience = str_at(spec, "/audience");
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {
                "audiences": if audience.is_empty() { json!([]) } else { json!([audience]) },
                "expirationSeconds": spec.get("expirationSeconds").and_then(Value::as_i64).unwrap_or(3600),
                "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid},
            }
        }))
        .map_err(kube::Error::SerdeError)?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), ns);
        let answer = accounts
            .create_token_request(account, &PostParams::default(), &request)
            .await?;
        Ok(answer.status.map(|s| s.token).unwrap_or_default())
    }

    /// Each claim volume whose PersistentVolume is a local directory (`hostPath` or
    /// `local`) becomes that directory, as a kubelet mounts the volume; other claims stay
    /// empty per-pod directories.
    async fn mount_claims(&self, ns: &str, pod: &mut Value) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        let volumes_api: Api<PersistentVolume> = Api::all(self.client.clone());
        let Some(volumes) = pod
            .pointer_mut("/spec/volumes")
            .and_then(Value::as_array_mut)
        else {
            return;
        };
        for volume in volumes.iter_mut() {
            let claim = str_at(volume, "/persistentVolumeClaim/claimName");
            if claim.is_empty() {
                continue;
            }
            let Ok(Some(claim)) = claims.get_opt(&claim).await else {
                continue;
            };
            let Some(pv_name) = claim.spec.and_then(|s| s.volume_name) else {
                continue;
            };
            let Ok(Some(pv)) = volumes_api.get_opt(&pv_name).await else {
                continue;
            };
            let spec = pv.spec.unwrap_or_default();
            let path = spec
                .host_path
                .map(|h| h.path)
                .or(spec.local.map(|l| l.path));
            if let (Some(path), Some(object)) = (path, volume.as_object_mut()) {
                let _ = std::fs::create_dir_all(&path);
                object.remove("persistentVolumeClaim");
                object.insert("hostPath".into(), json!({"path": path}));
            }
        }
    }

    /// Reads the pod, computes its next status from it and writes it with the read
    /// resourceVersion as a precondition (again on a conflict): a status written by someone
    /// else meanwhile is never overwritten blindly.
    async fn write_status(&self, key: &Key, uid: &str, next: impl Fn(&Value) -> Option<Value>) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        for _ in 0..5 {
            let current = match api.get_opt(&key.1).await {
                Ok(Some(pod)) => pod,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(pod = %key.1, error = %e, "cannot read the pod");
                    return;
                }
            };
            let Ok(current) = serde_json::to_value(current) else {
                return;
            };
            if str_at(&current, "/metadata/uid") != uid {
                return;
            }
            let Some(updated) = next(&current) else {
                return;
            };
            let patch = json!({
                "metadata": {"resourceVersion": str_at(&current, "/metadata/resourceVersion")},
                "status": updated.get("status").cloned().unwrap_or(Value::Null),
            });
            match api
                .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return,
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(kube::Error::Api(e)) if e.code == 404 => return,
                Err(e) => {
                    tracing::warn!(pod = %key.1, error = %e, "cannot write the pod's status");
                    return;
                }
            }
        }
    }

    /// The kubelet's confirmation of a graceful deletion: delete with grace 0, this uid only.
    async fn confirm_deletion(&self, key: &Key, uid: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&key.1, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %key.1, error = %e, "cannot confirm the deletion"),
        }
    }

    /// A container process ended: its terminated state, the pod's phase once every
    /// container ended, and the confirmation when the pod was being deleted.
    async fn on_exit(&mut self, exited: Exited) {
        let running = self.runtime.is_running(&exited.uid);
        let key = exited.key.clone();
        self.write_status(&key, &exited.uid, |cur| {
            Some(container_exited(
                cur,
                exited.container,
                exited.code,
                !running,
            ))
        })
        .await;
        if running {
            return;
        }
        let deleting = self
            .tracks
            .get(&exited.uid)
            .is_some_and(|t| t.kill_grace.is_some());
        if deleting && let Some(track) = self.tracks.get_mut(&exited.uid) {
            track.confirmed = true;
            self.confirm_deletion(&key, &exited.uid).await;
        }
    }

    async fn fire_due(&mut self) {
        let now = Instant::now();
        while self.timers.peek().is_some_and(|t| t.0.0 <= now) {
            let Some(Reverse((_, uid, action))) = self.timers.pop() else {
                break;
            };
            match action {
                Action::Kill => self.runtime.signal(&uid, Signal::SIGKILL),
                Action::Start => {
                    let Some(key) = self.tracks.get(&uid).map(|t| t.key.clone()) else {
                        continue;
                    };
                    // The pod as it is now: it may have been deleted or moved on meanwhile.
                    if let Ok(Some(pod)) = Api::<Pod>::namespaced(self.client.clone(), &key.0)
                        .get_opt(&key.1)
                        .await
                        && pod.metadata.uid.as_deref() == Some(uid.as_str())
                    {
                        self.on_pod(pod).await;
                    }
                }
            }
        }
    }
}

/// The node's provisioner: a claim the scheduler placed on this node
/// (`volume.kubernetes.io/selected-node`), unbound, of a StorageClass whose provisioner is
/// [`PROCESS_NODE_PROVISIONER`], gets a PersistentVolume — a directory under the work
/// directory, with this node's affinity — and is bound to it, as a provisioner and the
/// PV controller (which does not run here) would do.
async fn provision(
    client: &kube::Client,
    node: &str,
    dir: &std::path::Path,
    claim: &PersistentVolumeClaim,
) -> Result<(), String> {
    provision_claim(client, node, dir, claim)
        .await
        .map_err(|e| e.to_string())
}

async fn provision_claim(
    client: &kube::Client,
    node: &str,
    dir: &std::path::Path,
    claim: &PersistentVolumeClaim,
) -> Result<(), Box<dyn std::error::Error>> {
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    let spec = claim.spec.clone().unwrap_or_default();
    if annotations
        .get("volume.kubernetes.io/selected-node")
        .map(String::as_str)
        != Some(node)
        || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
        || claim.metadata.deletion_timestamp.is_some()
    {
        return Ok(());
    }
    let (Some(ns), Some(name), Some(uid)) = (
        claim.metadata.namespace.clone(),
        claim.metadata.name.clone(),
        claim.metadata.uid.clone(),
    ) else {
        return Ok(());
    };
    let class_name = spec.storage_class_name.clone().unwrap_or_default();
    let classes: Api<StorageClass> = Api::all(client.clone());
    let Some(class) = classes.get_opt(&class_name).await? else {
        return Ok(());
    };
    if class.provisioner != PROCESS_NODE_PROVISIONER {
        return Ok(());
    }
    let pv_name = format!("pvc-{uid}");
    let path = dir.join(&pv_name);
    std::fs::create_dir_all(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "1Gi".to_string());
    let access_modes = spec
        .access_modes
        .clone()
        .unwrap_or_else(|| vec!["ReadWriteOnce".to_string()]);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": {"pv.kubernetes.io/provisioned-by": PROCESS_NODE_PROVISIONER}},
        "spec": {
            "capacity": {"storage": size}, "accessModes": access_modes,
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": class_name,
            "hostPath": {"path": path.display().to_string(), "type": "DirectoryOrCreate"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "uid": uid},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]}]}}
        }
    }))?;
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    match volumes.create(&PostParams::default(), &pv).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    volumes
        .patch_status(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/storage-provisioner": PROCESS_NODE_PROVISIONER
                }},
                "spec": {"volumeName": pv_name}
            })),
        )
        .await?;
    claims
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Bound", "accessModes": access_modes, "capacity": {"storage": size}
            }})),
        )
        .await?;
    tracing::info!(claim = %name, namespace = %ns, volume = %pv_name, "claim provisioned and bound");
    Ok(())
}
