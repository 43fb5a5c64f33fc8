//! The process runtime of the simulated kubelet: each container of a scheduled pod runs as
//! a local process (chosen by image from `kubelet.process_images`), with the container's
//! environment (downward API resolved: the pod's IP is 127.0.0.1), its own working
//! directory, one log file per container and per-pod directories for its volumes. Every
//! process leads its own process group, so signals reach what it started too; every group
//! is killed when the runtime is dropped (the cluster stopping), so nothing outlives it.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::task::JoinSet;

use super::settings::{KubeletSettings, ProcessImage};
use super::store::{Kind, Store};

/// Where the runtime reads the ConfigMaps a pod needs (volumes, `envFrom`,
/// `configMapKeyRef`): the simulator's store, or what a process node fetched from a real
/// API server before the start.
pub(crate) trait ConfigMaps {
    /// The ConfigMap `namespace/name`, when it exists.
    fn config_map(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Value>>;
}

impl ConfigMaps for Store {
    fn config_map(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Value>> {
        self.get(Kind::ConfigMap, namespace, name).map(|s| s.value)
    }
}

impl ConfigMaps for HashMap<Key, std::sync::Arc<Value>> {
    fn config_map(&self, namespace: &str, name: &str) -> Option<std::sync::Arc<Value>> {
        self.get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }
}

/// The IP every process-run pod reports and gets through the downward API.
pub(crate) const POD_IP: &str = "127.0.0.1";

/// A pod's (namespace, name).
pub(crate) type Key = (String, String);

/// A container process that ended.
#[derive(Debug)]
pub(crate) struct Exited {
    pub key: Key,
    pub uid: String,
    /// Index of the container in `spec.containers`.
    pub container: usize,
    /// The exit code, or 128 + the signal that killed it.
    pub code: i32,
}

/// Why a pod's containers could not be started.
#[derive(Debug)]
pub(crate) struct StartFailure {
    /// The container the failure is about.
    pub container: usize,
    pub message: String,
    /// `Some(reason)`: something the pod needs is missing for now (a ConfigMap, as a real
    /// kubelet waits for it): the containers wait with that reason and the start is tried
    /// again. `None`: the pod fails with `StartError`.
    pub waiting: Option<&'static str>,
}

/// Why one container cannot be prepared.
enum Problem {
    /// Missing for now (a ConfigMap): wait with this reason and retry.
    Wait(&'static str, String),
    /// Cannot ever start.
    Fail(String),
}

impl From<String> for Problem {
    fn from(message: String) -> Problem {
        Problem::Fail(message)
    }
}

impl Problem {
    fn at(self, container: usize) -> StartFailure {
        match self {
            Problem::Wait(reason, message) => StartFailure {
                container,
                message,
                waiting: Some(reason),
            },
            Problem::Fail(message) => StartFailure {
                container,
                message,
                waiting: None,
            },
        }
    }
}

struct PodProcesses {
    /// Process group of each container still running (`None` once it exited).
    groups: Vec<Option<i32>>,
    /// The engine's container of each container run by a container engine: killing the
    /// engine's client does not stop it, so it is removed too.
    engines: Vec<Option<EngineContainer>>,
}

/// A container run by a container engine (`ProcessImage::container`).
#[derive(Clone, Debug)]
struct EngineContainer {
    /// The engine's argv (`podman --runtime runc`).
    engine: Vec<String>,
    /// The container's name for the engine.
    name: String,
}

impl EngineContainer {
    /// `ENGINE rm --force --time 0 NAME`: the container stops at once and goes.
    fn remove(&self) -> Option<tokio::process::Child> {
        let (program, args) = self.engine.split_first()?;
        tokio::process::Command::new(program)
            .args(args)
            .args(["rm", "--force", "--ignore", "--time", "0", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()
    }
}

/// The processes of every pod this kubelet runs.
pub(crate) struct ProcessRuntime {
    images: Vec<ProcessImage>,
    base: PathBuf,
    /// Every uid ever started: a pod is started at most once.
    started: HashSet<String>,
    pods: HashMap<String, PodProcesses>,
    exits: JoinSet<Exited>,
    /// Variables every container gets first (a kubelet's `KUBERNETES_SERVICE_HOST` and
    /// `_PORT`), below the image's and the container's own.
    cluster_env: Vec<(String, String)>,
    /// Owns the default base directory (removed after the processes are killed).
    _temp: Option<tempfile::TempDir>,
}

impl ProcessRuntime {
    /// Prepares the base directory (the configured one, or a fresh temporary one).
    pub(crate) fn new(settings: &KubeletSettings) -> std::io::Result<ProcessRuntime> {
        let (base, temp) = match &settings.work_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                (dir.clone(), None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("spark-pod-allocator-sim-")
                    .tempdir()?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        Ok(ProcessRuntime {
            images: settings.process_images.clone(),
            base,
            started: HashSet::new(),
            pods: HashMap::new(),
            exits: JoinSet::new(),
            cluster_env: Vec::new(),
            _temp: temp,
        })
    }

    /// Sets the variables every container started from now on gets first.
    pub(crate) fn set_cluster_env(&mut self, env: Vec<(String, String)>) {
        self.cluster_env = env;
    }

    /// The directory holding every pod's working directory.
    pub(crate) fn base(&self) -> &Path {
        &self.base
    }

    /// The next container process to end (pending forever while none runs).
    pub(crate) async fn next_exit(&mut self) -> Option<Exited> {
        loop {
            match self.exits.join_next().await {
                Some(Ok(exited)) => {
                    let all_done = match self.pods.get_mut(&exited.uid) {
                        Some(pod) => {
                            if let Some(group) = pod.groups.get_mut(exited.container)
                                && let Some(pgid) = group.take()
                            {
                                // The container is gone as a whole: what its main process
                                // left behind in its group goes with it.
                                let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
                            }
                            if let Some(engine) =
                                pod.engines.get_mut(exited.container).and_then(Option::take)
                            {
                                // Reaped by tokio once it ends.
                                let _ = engine.remove();
                            }
                            pod.groups.iter().all(Option::is_none)
                        }
                        None => false,
                    };
                    if all_done {
                        self.pods.remove(&exited.uid);
                    }
                    return Some(exited);
                }
                // A wait task cannot panic; an aborted one only happens on drop.
                Some(Err(_)) => continue,
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Kills every process group and waits (bounded) until each container process is
    /// reaped and each group is empty: the cluster's orderly stop.
    pub(crate) async fn stop_all(&mut self) {
        let groups: Vec<i32> = self
            .pods
            .values()
            .flat_map(|p| p.groups.iter().flatten().copied())
            .collect();
        for pgid in &groups {
            let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
        }
        let removals: Vec<tokio::process::Child> = self
            .pods
            .values()
            .flat_map(|p| p.engines.iter().flatten())
            .filter_map(EngineContainer::remove)
            .collect();
        let bound = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        let _ = tokio::time::timeout_at(bound, async {
            while self.exits.join_next().await.is_some() {}
            // What the leaders left in their groups dies asynchronously: wait until every
            // process of the groups is dead (a zombie waiting for its reaper counts).
            while groups.iter().any(|pgid| group_has_live_process(*pgid)) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        })
        .await;
        // An engine's containers stop in their own time (bounded by the engine's `--time 0`).
        for mut removal in removals {
            let _ = removal.wait().await;
        }
        self.pods.clear();
    }

    /// Whether any container process of the pod is still running.
    pub(crate) fn is_running(&self, uid: &str) -> bool {
        self.pods
            .get(uid)
            .is_some_and(|p| p.groups.iter().any(Option::is_some))
    }

    /// Sends `signal` to every running process group of the pod.
    pub(crate) fn signal(&self, uid: &str, signal: Signal) {
        if let Some(pod) = self.pods.get(uid) {
            for pgid in pod.groups.iter().flatten() {
                let _ = killpg(Pid::from_raw(*pgid), signal);
            }
            if signal == Signal::SIGKILL {
                for engine in pod.engines.iter().flatten() {
                    let _ = engine.remove();
                }
            }
        }
    }

    /// Starts every container of the pod, once per uid: `Ok(false)` when this uid was
    /// started before (nothing is done). Nothing is started unless every container can be.
    pub(crate) fn start(
        &mut self,
        key: &Key,
        pod: &Value,
        store: &dyn ConfigMaps,
    ) -> Result<bool, StartFailure> {
        let uid = str_at(pod, "/metadata/uid");
        if self.started.contains(&uid) {
            return Ok(false);
        }
        let containers = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut entries = Vec::with_capacity(containers.len());
        for (i, c) in containers.iter().enumerate() {
            let image = str_at(c, "/image");
            let entry = self
                .images
                .iter()
                .find(|e| e.image == image)
                .or_else(|| self.images.iter().find(|e| e.image == "*"))
                .ok_or_else(|| {
                    Problem::Fail(format!(
                        "no process for image {image:?}: add it (or \"*\") to simulator.kubelet.process_images"
                    ))
                    .at(i)
                })?;
            entries.push(entry.clone());
        }
        let dir = self.base.join(&key.0).join(pod_dir_name(&key.1, &uid));
        std::fs::create_dir_all(&dir)
            .map_err(|e| Problem::Fail(format!("cannot create the pod directory: {e}")).at(0))?;
        let volumes = prepare_volumes(pod, &dir, &key.0, store).map_err(|p| p.at(0))?;
        let mut commands = Vec::with_capacity(containers.len());
        for (i, (c, entry)) in containers.iter().zip(&entries).enumerate() {
            commands.push(
                prepare_container(pod, c, entry, &dir, &volumes, store, &self.cluster_env)
                    .map_err(|p| p.at(i))?,
            );
        }
        self.started.insert(uid.clone());
        let mut groups = Vec::with_capacity(containers.len());
        let mut children = Vec::with_capacity(containers.len());
        let mut engines = Vec::with_capacity(containers.len());
        for (i, (mut cmd, program, engine)) in commands.into_iter().enumerate() {
            match cmd.spawn() {
                Ok(child) => {
                    let pgid = child.id().and_then(|id| i32::try_from(id).ok());
                    groups.push(pgid);
                    children.push(child);
                    engines.push(engine);
                }
                Err(e) => {
                    // What started already goes: the pod fails as a whole.
                    for pgid in groups.iter().flatten() {
                        let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
                    }
                    for engine in engines.iter().flatten() {
                        let _ = engine.remove();
                    }
                    let cname = containers
                        .get(i)
                        .map(|c| str_at(c, "/name"))
                        .unwrap_or_default();
                    return Err(Problem::Fail(format!(
                        "failed to start {program:?} for container {cname:?}: {e}"
                    ))
                    .at(i));
                }
            }
        }
        for (i, mut child) in children.into_iter().enumerate() {
            let key = key.clone();
            let uid = uid.clone();
            self.exits.spawn(async move {
                let code = match child.wait().await {
                    Ok(status) => exit_code(status),
                    Err(_) => 128 + Signal::SIGKILL as i32,
                };
                Exited {
                    key,
                    uid,
                    container: i,
                    code,
                }
            });
        }
        self.pods.insert(uid, PodProcesses { groups, engines });
        Ok(true)
    }
}

impl Drop for ProcessRuntime {
    fn drop(&mut self) {
        for pod in self.pods.values() {
            for pgid in pod.groups.iter().flatten() {
                let _ = killpg(Pid::from_raw(*pgid), Signal::SIGKILL);
            }
            for engine in pod.engines.iter().flatten() {
                if let Some((program, args)) = engine.engine.split_first() {
                    // No runtime to wait on here: the removal runs to its end.
                    let _ = std::process::Command::new(program)
                        .args(args)
                        .args(["rm", "--force", "--ignore", "--time", "0", &engine.name])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                }
            }
        }
        // Dropping the wait tasks drops each child, which kills and reaps it too.
        self.exits.abort_all();
    }
}

/// Whether a process of group `pgid` still runs (not a zombie), from `/proc`; `false`
/// where `/proc` cannot be read.
fn group_has_live_process(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let is_pid = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if !is_pid {
            return false;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            return false;
        };
        // "PID (COMM) STATE PPID PGRP ...": COMM may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
        group == Some(pgid) && state != "Z" && state != "X"
    })
}

/// The ConfigMaps the pod's start reads (volumes, `envFrom`, `configMapKeyRef`), each once.
pub(crate) fn config_maps_needed(pod: &Value) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: String| {
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    };
    let list = |v: &Value, pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for v in list(pod, "/spec/volumes") {
        add(str_at(&v, "/configMap/name"));
    }
    for c in list(pod, "/spec/containers") {
        for from in list(&c, "/envFrom") {
            add(str_at(&from, "/configMapRef/name"));
        }
        for e in list(&c, "/env") {
            add(str_at(&e, "/valueFrom/configMapKeyRef/name"));
        }
    }
    names
}

/// The name of a pod's directory under its namespace's: `NAME-UID`, the name cut to 200
/// bytes so the whole stays within a file name's 255 (pod names may have 253).
pub(crate) fn pod_dir_name(name: &str, uid: &str) -> String {
    let mut cut = name.len().min(200);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{uid}", &name[..cut])
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 128,
    }
}

fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Creates a directory per volume: emptyDir (and every kind without a local meaning)
/// empty, configMap filled with its keys, hostPath the host path itself. Returns volume
/// name → directory.
fn prepare_volumes(
    pod: &Value,
    dir: &Path,
    ns: &str,
    store: &dyn ConfigMaps,
) -> Result<HashMap<String, PathBuf>, Problem> {
    let mut out = HashMap::new();
    let volumes = pod
        .pointer("/spec/volumes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for v in volumes {
        let name = str_at(&v, "/name");
        if let Some(host) = v.pointer("/hostPath/path").and_then(Value::as_str) {
            out.insert(name, PathBuf::from(host));
            continue;
        }
        let path = dir.join("volumes").join(&name);
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create volume {name:?} at {}: {e}", path.display()))?;
        if let Some(cm) = v.get("configMap") {
            let cm_name = str_at(cm, "/name");
            let optional = cm.get("optional").and_then(Value::as_bool) == Some(true);
            match store.config_map(ns, &cm_name) {
                Some(stored) => {
                    let data = stored
                        .get("data")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    let items = cm.get("items").and_then(Value::as_array);
                    let files: Vec<(String, String)> = match items {
                        Some(items) => items
                            .iter()
                            .map(|it| (str_at(it, "/key"), str_at(it, "/path")))
                            .collect(),
                        None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
                    };
                    for (k, file) in files {
                        let Some(content) = data.get(&k).and_then(Value::as_str) else {
                            continue;
                        };
                        let target = path.join(&file);
                        if file.split('/').any(|part| part == "..") {
                            return Err(format!(
                                "volume {name:?}: path {file:?} leaves the volume"
                            )
                            .into());
                        }
                        if let Some(parent) = target.parent() {
                            std::fs::create_dir_all(parent)
                                .map_err(|e| format!("volume {name:?}: {e}"))?;
                        }
                        std::fs::write(&target, content)
                            .map_err(|e| format!("volume {name:?}: {e}"))?;
                    }
                }
                None if optional => {}
                None => {
                    return Err(Problem::Wait(
                        "ContainerCreating",
                        format!(
                            "MountVolume.SetUp failed for volume {name:?} : configmap \"{cm_name}\" not found"
                        ),
                    ));
                }
            }
        }
        out.insert(name, path);
    }
    Ok(out)
}

/// Rewrites every path under a mount path to the volume's directory, in each `,`-, `:`- or
/// `=`-separated part of `value`, so lists such as `SPARK_LOCAL_DIRS`, settings such as
/// `--conf key=/path` and file URIs such as `local:///path` are covered.
fn rewrite_mounts(value: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut out = String::with_capacity(value.len());
    let mut part = String::new();
    let flush = |part: &mut String, out: &mut String| {
        // A URI's empty authority (`//` after `scheme:`) stays in front of the path.
        let (authority, path) = match part.strip_prefix("//") {
            Some(path) if path.starts_with('/') => ("//", path),
            _ => ("", part.as_str()),
        };
        let replaced = mounts.iter().find_map(|(mount, local)| {
            let rest = path.strip_prefix(mount.as_str())?;
            (rest.is_empty() || rest.starts_with('/'))
                .then(|| format!("{authority}{}{rest}", local.display()))
        });
        out.push_str(replaced.as_deref().unwrap_or(part));
        part.clear();
    };
    for ch in value.chars() {
        if ch == ',' || ch == ':' || ch == '=' {
            flush(&mut part, &mut out);
            out.push(ch);
        } else {
            part.push(ch);
        }
    }
    flush(&mut part, &mut out);
    out
}

/// Kubernetes' `$(VAR)` expansion: a defined variable is replaced, an undefined reference
/// is kept as written, `$$` is a literal `$`.
fn expand(value: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match lookup(name) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The value of a downward-API `fieldRef` for a process-run pod.
pub(crate) fn field_ref(pod: &Value, path: &str) -> Option<String> {
    let quoted = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_suffix("']")
            .map(str::to_string)
    };
    if let Some(label) = quoted("metadata.labels['") {
        return Some(str_at(
            pod,
            &format!(
                "/metadata/labels/{}",
                label.replace('~', "~0").replace('/', "~1")
            ),
        ));
    }
    if let Some(annotation) = quoted("metadata.annotations['") {
        return Some(str_at(
            pod,
            &format!(
                "/metadata/annotations/{}",
                annotation.replace('~', "~0").replace('/', "~1")
            ),
        ));
    }
    Some(match path {
        "metadata.name" => str_at(pod, "/metadata/name"),
        "metadata.namespace" => str_at(pod, "/metadata/namespace"),
        "metadata.uid" => str_at(pod, "/metadata/uid"),
        "spec.nodeName" => str_at(pod, "/spec/nodeName"),
        "spec.serviceAccountName" => {
            let sa = str_at(pod, "/spec/serviceAccountName");
            if sa.is_empty() { "default".into() } else { sa }
        }
        "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => POD_IP.into(),
        _ => return None,
    })
}

/// The value of a `resourceFieldRef` (cores rounded up, memory in bytes, over `divisor`).
fn resource_ref(container: &Value, spec: &Value) -> Option<String> {
    let resource = str_at(spec, "/resource");
    let (section, name) = resource.split_once('.')?;
    let declared = container
        .pointer(&format!("/resources/{section}/{name}"))
        .and_then(super::quantity::quantity);
    let value = match (declared, name) {
        (Some(v), _) => v,
        (None, "cpu") => std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        (None, _) => return None,
    };
    let divisor = spec
        .get("divisor")
        .and_then(super::quantity::quantity)
        .filter(|d| *d > 0.0)
        .unwrap_or(1.0);
    Some(format!("{}", (value / divisor).ceil() as i64))
}

/// Everything needed to run one container: its command, ready to spawn, the program it
/// runs (for messages) and, when an engine runs it, the engine's container.
fn prepare_container(
    pod: &Value,
    c: &Value,
    entry: &ProcessImage,
    dir: &Path,
    volumes: &HashMap<String, PathBuf>,
    store: &dyn ConfigMaps,
    cluster_env: &[(String, String)],
) -> Result<(tokio::process::Command, String, Option<EngineContainer>), Problem> {
    let ns = str_at(pod, "/metadata/namespace");
    let cname = str_at(c, "/name");
    let mut mounts: Vec<(String, PathBuf)> = c
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let local = volumes.get(&str_at(m, "/name"))?;
            let sub = str_at(m, "/subPath");
            let local = if sub.is_empty() {
                local.clone()
            } else {
                local.join(sub)
            };
            let mount = str_at(m, "/mountPath").trim_end_matches('/').to_string();
            (!mount.is_empty()).then_some((mount, local))
        })
        .collect();
    // Longest mount path first, so a nested mount wins over its parent.
    mounts.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
    for (_, local) in &mounts {
        std::fs::create_dir_all(local)
            .map_err(|e| format!("cannot create {}: {e}", local.display()))?;
    }
    let mut env: Vec<(String, String)> = cluster_env
        .iter()
        .cloned()
        .chain(entry.env.iter().map(|e| (e.name.clone(), e.value.clone())))
        .collect();
    let set = |env: &mut Vec<(String, String)>, name: String, value: String| {
        env.retain(|(n, _)| *n != name);
        env.push((name, value));
    };
    let hostname = pod
        .pointer("/spec/hostname")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| str_at(pod, "/metadata/name"));
    set(&mut env, "HOSTNAME".into(), hostname);
    // The container's own variables, in order: each may refer to the ones before it.
    let mut own: Vec<(String, String)> = Vec::new();
    let lookup_in = |own: &[(String, String)], name: &str| {
        own.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    for from in c
        .get("envFrom")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let prefix = str_at(from, "/prefix");
        if let Some(cm) = from.get("configMapRef") {
            let name = str_at(cm, "/name");
            match store.config_map(&ns, &name) {
                Some(stored) => {
                    for (k, v) in stored
                        .get("data")
                        .and_then(Value::as_object)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(v) = v.as_str() {
                            own.push((format!("{prefix}{k}"), v.to_string()));
                        }
                    }
                }
                None if cm.get("optional").and_then(Value::as_bool) == Some(true) => {}
                None => {
                    return Err(Problem::Wait(
                        "CreateContainerConfigError",
                        format!("configmap \"{name}\" not found"),
                    ));
                }
            }
        } else if from.get("secretRef").is_some()
            && from.pointer("/secretRef/optional").and_then(Value::as_bool) != Some(true)
        {
            return Err(
                format!("secrets are not simulated (envFrom of container {cname:?})").into(),
            );
        }
    }
    for e in c.get("env").and_then(Value::as_array).into_iter().flatten() {
        let name = str_at(e, "/name");
        let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
            Some(expand(v, |n| lookup_in(&own, n)))
        } else if let Some(from) = e.get("valueFrom") {
            if let Some(path) = from.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                Some(
                    field_ref(pod, path)
                        .ok_or_else(|| format!("env {name:?}: unsupported fieldRef {path:?}"))?,
                )
            } else if let Some(spec) = from.get("resourceFieldRef") {
                resource_ref(c, spec)
            } else if let Some(key_ref) = from.get("configMapKeyRef") {
                let cm = str_at(key_ref, "/name");
                let key = str_at(key_ref, "/key");
                let optional = key_ref.get("optional").and_then(Value::as_bool) == Some(true);
                let found = store.config_map(&ns, &cm).and_then(|s| {
                    s.pointer(&format!(
                        "/data/{}",
                        key.replace('~', "~0").replace('/', "~1")
                    ))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                });
                match found {
                    Some(v) => Some(v),
                    None if optional => None,
                    None => {
                        return Err(Problem::Wait(
                            "CreateContainerConfigError",
                            format!("couldn't find key {key} in ConfigMap {ns}/{cm}"),
                        ));
                    }
                }
            } else if let Some(secret) = from.get("secretKeyRef") {
                if secret.get("optional").and_then(Value::as_bool) == Some(true) {
                    None
                } else {
                    return Err(format!("env {name:?}: secrets are not simulated").into());
                }
            } else {
                None
            }
        } else {
            Some(String::new())
        };
        if let Some(value) = value {
            own.push((name, value));
        }
    }
    for (name, value) in own {
        // In an engine's container the volumes are at their mount paths.
        let value = if entry.container {
            value
        } else {
            rewrite_mounts(&value, &mounts)
        };
        set(&mut env, name, value);
    }
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let args: Vec<String> = c
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(|a| {
            let a = expand(a, lookup);
            if entry.container {
                a
            } else {
                rewrite_mounts(&a, &mounts)
            }
        })
        .collect();
    let Some((program, image_args)) = entry.command.split_first() else {
        return Err(format!("image {:?} has an empty command", entry.image).into());
    };
    let (args, engine) = if entry.container {
        let (run, engine) = engine_run(pod, c, entry, volumes, &env, args)?;
        (run, Some(engine))
    } else {
        (args, None)
    };
    let log_path = dir.join(format!("{cname}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("cannot open {}: {e}", log_path.display()))?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(image_args)
        .args(&args)
        .envs(env)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .process_group(0)
        .kill_on_drop(true);
    Ok((cmd, program.clone(), engine))
}

/// The engine's `run` arguments for a container of the pod's own image: the volumes
/// bind-mounted at their mount paths, the host's network (the pod's IP is the host's),
/// the security context's user and read-only root, each variable passed by name (the
/// engine's process has them: values stay out of its argv), the container's `command` as
/// entrypoint.
fn engine_run(
    pod: &Value,
    c: &Value,
    entry: &ProcessImage,
    volumes: &HashMap<String, PathBuf>,
    env: &[(String, String)],
    args: Vec<String>,
) -> Result<(Vec<String>, EngineContainer), Problem> {
    let cname = str_at(c, "/name");
    let name = format!(
        "k8s_{cname}_{}_{}_{}",
        str_at(pod, "/metadata/name"),
        str_at(pod, "/metadata/namespace"),
        str_at(pod, "/metadata/uid")
    );
    let mut run: Vec<String> = [
        "run",
        "--rm",
        "--pull",
        "never",
        "--network",
        "host",
        "--name",
        &name,
    ]
    .map(str::to_string)
    .to_vec();
    let security = |field: &str| {
        c.pointer(&format!("/securityContext/{field}"))
            .or_else(|| pod.pointer(&format!("/spec/securityContext/{field}")))
            .cloned()
    };
    if let Some(user) = security("runAsUser").and_then(|v| v.as_i64()) {
        let user = match security("runAsGroup").and_then(|v| v.as_i64()) {
            Some(group) => format!("{user}:{group}"),
            None => user.to_string(),
        };
        run.extend(["--user".into(), user]);
    }
    if c.pointer("/securityContext/readOnlyRootFilesystem")
        .and_then(Value::as_bool)
        == Some(true)
    {
        run.push("--read-only".into());
    }
    for m in c
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let volume = str_at(m, "/name");
        let Some(local) = volumes.get(&volume) else {
            return Err(format!("volumeMount {volume:?}: no such volume in the pod").into());
        };
        let sub = str_at(m, "/subPath");
        let local = if sub.is_empty() {
            local.clone()
        } else {
            local.join(sub)
        };
        let read_only = m.get("readOnly").and_then(Value::as_bool) == Some(true);
        run.extend([
            "--volume".into(),
            format!(
                "{}:{}{}",
                local.display(),
                str_at(m, "/mountPath"),
                if read_only { ":ro" } else { "" }
            ),
        ]);
    }
    for (variable, _) in env {
        run.extend(["--env".into(), variable.clone()]);
    }
    if let Some(command) = c.get("command").and_then(Value::as_array) {
        let command: Vec<&str> = command.iter().filter_map(Value::as_str).collect();
        let command = serde_json::to_string(&command)
            .map_err(|e| format!("container {cname:?}: command: {e}"))?;
        run.extend(["--entrypoint".into(), command]);
    }
    run.push(str_at(c, "/image"));
    run.extend(args);
    Ok((
        run,
        EngineContainer {
            engine: entry.command.clone(),
            name,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn expansion_follows_kubernetes() {
        let vars = |n: &str| (n == "A").then(|| "x".to_string());
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", vars), "x-$(B)-$(A)-$");
        assert_eq!(expand("a$(A", vars), "a$(A");
    }

    #[test]
    fn mount_paths_are_rewritten_in_lists() {
        let mounts = vec![
            (
                "/var/data/spark-1".to_string(),
                PathBuf::from("/tmp/p/volumes/v1"),
            ),
            (
                "/opt/spark/conf".to_string(),
                PathBuf::from("/tmp/p/volumes/conf"),
            ),
        ];
        assert_eq!(
            rewrite_mounts("/var/data/spark-1,/var/data/spark-10", &mounts),
            "/tmp/p/volumes/v1,/var/data/spark-10"
        );
        assert_eq!(
            rewrite_mounts("/opt/spark/conf/x:/opt/other", &mounts),
            "/tmp/p/volumes/conf/x:/opt/other"
        );
        assert_eq!(
            rewrite_mounts(
                "spark.files=/opt/spark/conf/a,local:///opt/spark/conf/b",
                &mounts
            ),
            "spark.files=/tmp/p/volumes/conf/a,local:///tmp/p/volumes/conf/b"
        );
        assert_eq!(
            rewrite_mounts("local://host/opt/spark/conf/b=//opt/spark/conf", &mounts),
            "local://host/opt/spark/conf/b=//opt/spark/conf"
        );
    }

    #[test]
    fn an_engine_runs_the_pods_image_with_its_volumes_user_and_variables() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
            "spec": {"securityContext": {"runAsUser": 65532, "runAsGroup": 65532}}
        });
        let c = json!({
            "name": "main", "image": "app:1", "command": ["/app"], "args": ["serve"],
            "securityContext": {"readOnlyRootFilesystem": true},
            "volumeMounts": [
                {"name": "tls", "mountPath": "/etc/tls", "readOnly": true},
                {"name": "data", "mountPath": "/data", "subPath": "d"}
            ]
        });
        let entry = ProcessImage {
            image: "*".into(),
            command: vec!["podman".into(), "--runtime".into(), "runc".into()],
            env: vec![],
            container: true,
        };
        let volumes = HashMap::from([
            ("tls".to_string(), PathBuf::from("/w/volumes/tls")),
            ("data".to_string(), PathBuf::from("/w/volumes/data")),
        ]);
        let env = vec![("TOKEN".to_string(), "secret".to_string())];
        let Ok((run, engine)) = engine_run(&pod, &c, &entry, &volumes, &env, vec!["serve".into()])
        else {
            panic!("engine_run failed");
        };
        assert_eq!(engine.name, "k8s_main_p_ns_u-1");
        assert_eq!(
            run.join(" "),
            "run --rm --pull never --network host --name k8s_main_p_ns_u-1 --user 65532:65532 \
             --read-only --volume /w/volumes/tls:/etc/tls:ro --volume /w/volumes/data/d:/data \
             --env TOKEN --entrypoint [\"/app\"] app:1 serve"
        );
        // A variable's value stays out of the engine's argv.
        assert!(!run.iter().any(|a| a.contains("secret")));
        let missing = json!({"name": "main", "image": "app:1",
            "volumeMounts": [{"name": "nope", "mountPath": "/x"}]});
        assert!(engine_run(&pod, &missing, &entry, &volumes, &env, vec![]).is_err());
    }

    #[test]
    fn downward_api_fields_resolve() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"spark-exec-id": "3"}}, "spec": {"nodeName": "sim-node-0"}});
        assert_eq!(field_ref(&pod, "status.podIP").as_deref(), Some(POD_IP));
        assert_eq!(field_ref(&pod, "metadata.name").as_deref(), Some("p"));
        assert_eq!(
            field_ref(&pod, "spec.nodeName").as_deref(),
            Some("sim-node-0")
        );
        assert_eq!(
            field_ref(&pod, "metadata.labels['spark-exec-id']").as_deref(),
            Some("3")
        );
        assert_eq!(field_ref(&pod, "status.phase"), None);
        let c = json!({"resources": {"limits": {"memory": "1Gi", "cpu": "1500m"}}});
        assert_eq!(
            resource_ref(&c, &json!({"resource": "limits.cpu"})).as_deref(),
            Some("2")
        );
        assert_eq!(
            resource_ref(&c, &json!({"resource": "limits.memory", "divisor": "1Mi"})).as_deref(),
            Some("1024")
        );
    }
}
