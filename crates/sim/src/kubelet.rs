//! The simulated scheduler, kubelets and garbage collector. They run inside the server
//! process but act only through the store, like controllers reacting to watch events:
//! event-driven, with a timer heap, so 10,000 pods cost nothing per tick.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use nix::sys::signal::Signal;

use super::nodes::{node_index, node_name};
use super::objects::{is_bound, now_rfc3339, phase};
use super::process::{Exited, POD_IP, ProcessRuntime};
use super::server::{Shared, bind_pod, delete_object, set_condition};
use super::store::{EventType, Kind};

type Key = (String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// Containers start (or fail to).
    Start,
    /// `ErrImagePull` becomes `ImagePullBackOff`.
    Backoff,
    /// Containers exit by themselves.
    Exit,
    /// A gracefully deleted pod has stopped: remove it.
    Remove,
    /// The grace period of a process-run pod being deleted is over: SIGKILL.
    Kill,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    seq: u64,
    key: Key,
    uid: String,
    action: Action,
}

struct Track {
    uid: String,
    /// Index of the node whose capacity this pod holds.
    node: Option<usize>,
    started: bool,
    terminating: bool,
    /// The grace period (seconds) a SIGKILL is scheduled for (process runtime).
    kill_grace: Option<u64>,
}

struct Kubelet {
    sh: Arc<Shared>,
    rng: SmallRng,
    load: Vec<u32>,
    pods: HashMap<Key, Track>,
    waiting: VecDeque<Key>,
    waiting_set: HashSet<Key>,
    timers: BinaryHeap<Reverse<Timer>>,
    seq: u64,
    next_ip: u32,
    /// Present with `runtime = "process"`: the containers' local processes.
    processes: Option<ProcessRuntime>,
}

/// Runs the scheduler and kubelets until the server shuts down.
pub(crate) async fn run(sh: Arc<Shared>, processes: Option<ProcessRuntime>) {
    let settings = &sh.settings.kubelet;
    let mut k = Kubelet {
        rng: SmallRng::seed_from_u64(sh.settings.seed ^ 0x006b_7562_656c_6574),
        load: vec![0; settings.nodes as usize],
        pods: HashMap::new(),
        waiting: VecDeque::new(),
        waiting_set: HashSet::new(),
        timers: BinaryHeap::new(),
        seq: 0,
        next_ip: 0,
        processes,
        sh: sh.clone(),
    };
    let mut rx = sh.store.subscribe();
    k.resync();
    loop {
        let next = k.timers.peek().map(|t| t.0.at);
        tokio::select! {
            received = rx.recv() => match received {
                Ok(ev) => {
                    if ev.kind == Kind::Pod {
                        let key = (ev.namespace.clone(), name_of(&ev.object.value));
                        let value = (ev.event_type != EventType::Deleted).then(|| ev.object.value.clone());
                        k.on_pod(key, value);
                    }
                }
                Err(RecvError::Lagged(_)) => k.resync(),
                Err(RecvError::Closed) => break,
            },
            _ = sleep_until(next) => k.fire_due(),
            Some(exited) = next_exit(&mut k.processes) => k.on_exit(exited),
            _ = sh.cancel.cancelled() => break,
        }
    }
    if let Some(p) = &mut k.processes {
        p.stop_all().await;
    }
}

async fn next_exit(processes: &mut Option<ProcessRuntime>) -> Option<Exited> {
    match processes {
        Some(p) => p.next_exit().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn name_of(v: &Value) -> String {
    str_at(v, "/metadata/name")
}

fn uid_of(v: &Value) -> String {
    str_at(v, "/metadata/uid")
}

impl Kubelet {
    fn resync(&mut self) {
        let pods = self.sh.store.select(Kind::Pod, |_| true);
        let present: HashSet<Key> = pods
            .iter()
            .map(|(ns, n, _)| (ns.clone(), n.clone()))
            .collect();
        let gone: Vec<Key> = self
            .pods
            .keys()
            .filter(|k| !present.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            self.on_pod(key, None);
        }
        for (ns, name, v) in pods {
            self.on_pod((ns, name), Some(v));
        }
    }

    fn schedule(&mut self, key: &Key, uid: &str, action: Action, after: Duration) {
        self.seq += 1;
        self.timers.push(Reverse(Timer {
            at: Instant::now() + after,
            seq: self.seq,
            key: key.clone(),
            uid: uid.to_string(),
            action,
        }));
    }

    fn release(&mut self, key: &Key) {
        if let Some(track) = self.pods.get_mut(key)
            && let Some(node) = track.node.take()
        {
            if let Some(l) = self.load.get_mut(node) {
                *l = l.saturating_sub(1);
            }
            self.schedule_waiting();
        }
    }

    /// Kills at once the processes of a pod that is gone from the store.
    fn kill_processes(&self, key: &Key) {
        if let (Some(p), Some(track)) = (&self.processes, self.pods.get(key)) {
            p.signal(&track.uid, Signal::SIGKILL);
        }
    }

    fn on_pod(&mut self, key: Key, pod: Option<Arc<Value>>) {
        let Some(pod) = pod else {
            self.kill_processes(&key);
            self.release(&key);
            self.pods.remove(&key);
            return;
        };
        let uid = uid_of(&pod);
        if self.pods.get(&key).is_some_and(|t| t.uid != uid) {
            // Same name, new pod: forget the old one.
            self.kill_processes(&key);
            self.release(&key);
            self.pods.remove(&key);
        }
        if matches!(phase(&pod), "Succeeded" | "Failed") {
            self.release(&key);
        }
        let deleting = pod.pointer("/metadata/deletionTimestamp").is_some();
        if deleting {
            self.waiting_set.remove(&key);
            let on_sim_node = pod
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .and_then(node_index)
                .is_some();
            if !on_sim_node {
                return;
            }
            // Also a pod this kubelet never saw bound (after a resync): it holds no capacity.
            let track = self.pods.entry(key.clone()).or_insert_with(|| Track {
                uid: uid.clone(),
                node: None,
                started: true,
                terminating: false,
                kill_grace: None,
            });
            let grace_s = pod
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_u64)
                .unwrap_or(30);
            if let Some(p) = &self.processes
                && p.is_running(&uid)
            {
                // The real kubelet's stop: SIGTERM now, SIGKILL when the grace period is
                // over; the pod goes once its processes are gone (see `on_exit`).
                track.terminating = true;
                if track.kill_grace.is_none_or(|g| grace_s < g) {
                    let first = track.kill_grace.is_none();
                    track.kill_grace = Some(grace_s);
                    if first {
                        p.signal(&uid, Signal::SIGTERM);
                    }
                    self.schedule(&key, &uid, Action::Kill, Duration::from_secs(grace_s));
                }
                return;
            }
            if !track.terminating {
                track.terminating = true;
                let grace_ms = pod
                    .pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_u64)
                    .unwrap_or(30)
                    * 1000;
                let delay =
                    Duration::from_millis(grace_ms.min(self.sh.settings.kubelet.termination_ms));
                self.schedule(&key, &uid, Action::Remove, delay);
            }
            return;
        }
        if !is_bound(&pod) {
            let scheduler = pod
                .pointer("/spec/schedulerName")
                .and_then(Value::as_str)
                .unwrap_or("default-scheduler");
            if scheduler == "default-scheduler"
                && phase(&pod) == "Pending"
                && !self.waiting_set.contains(&key)
            {
                self.place(key, &pod);
            }
            return;
        }
        let node = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .and_then(node_index)
            .filter(|i| *i < self.load.len());
        let Some(node) = node else { return };
        if !self.pods.contains_key(&key) {
            let terminal = matches!(phase(&pod), "Succeeded" | "Failed");
            if !terminal {
                self.load[node] += 1;
            }
            self.pods.insert(
                key.clone(),
                Track {
                    uid: uid.clone(),
                    node: (!terminal).then_some(node),
                    started: false,
                    terminating: false,
                    kill_grace: None,
                },
            );
        }
        let started =
            pod.pointer("/status/containerStatuses").is_some() || phase(&pod) != "Pending";
        if let Some(track) = self.pods.get_mut(&key)
            && !track.started
        {
            track.started = true;
            if !started {
                let k = &self.sh.settings.kubelet;
                let delay = self
                    .rng
                    .gen_range(k.start_delay_min_ms..=k.start_delay_max_ms);
                self.schedule(&key, &uid, Action::Start, Duration::from_millis(delay));
            }
        }
    }

    /// A container process ended: its terminated state, the pod's phase once every
    /// container ended, and the pod's removal when it was being deleted.
    fn on_exit(&mut self, exited: Exited) {
        let running = self
            .processes
            .as_ref()
            .is_some_and(|p| p.is_running(&exited.uid));
        let store = &self.sh.store;
        let (ns, name) = (&exited.key.0, &exited.key.1);
        let uid = exited.uid.clone();
        let updated = store.update(
            Kind::Pod,
            ns,
            name,
            Box::new(|cur| {
                if uid_of(cur) != uid {
                    return Ok(None);
                }
                Ok(Some(container_exited(
                    cur,
                    exited.container,
                    exited.code,
                    !running,
                )))
            }),
        );
        let deleting = updated
            .as_ref()
            .is_ok_and(|s| s.value.pointer("/metadata/deletionTimestamp").is_some());
        if !running && deleting {
            let uid = exited.uid.clone();
            let _ = delete_object(store, Kind::Pod, ns, name, Some(0), |cur| {
                if uid_of(cur) == uid {
                    Ok(())
                } else {
                    Err(super::status::ApiError::no_route())
                }
            });
        }
    }

    /// Binds a pod to the least loaded node with room, or marks it Unschedulable.
    fn place(&mut self, key: Key, pod: &Value) {
        let cap = self.sh.settings.kubelet.pods_per_node;
        let best = self
            .load
            .iter()
            .enumerate()
            .filter(|(_, l)| **l < cap)
            .min_by_key(|(_, l)| **l)
            .map(|(i, _)| i);
        match best {
            Some(node) => {
                // The binding's event tracks the pod and counts it on the node.
                if bind_pod(&self.sh.store, &key.0, &key.1, &node_name(node)).is_ok() {
                    self.waiting_set.remove(&key);
                    let uid = uid_of(pod);
                    self.load[node] += 1;
                    self.pods.insert(
                        key,
                        Track {
                            uid,
                            node: Some(node),
                            started: false,
                            terminating: false,
                            kill_grace: None,
                        },
                    );
                }
            }
            None => {
                let nodes = self.load.len();
                let message = format!(
                    "0/{nodes} nodes are available: {nodes} Too many pods. preemption: 0/{nodes} nodes are available: {nodes} No preemption victims found for incoming pod."
                );
                let _ = self.sh.store.update(
                    Kind::Pod,
                    &key.0,
                    &key.1,
                    Box::new(|cur| {
                        if is_bound(cur) {
                            return Ok(None);
                        }
                        let mut next = cur.clone();
                        set_condition(
                            &mut next,
                            "PodScheduled",
                            "False",
                            Some("Unschedulable"),
                            Some(&message),
                        );
                        Ok(Some(next))
                    }),
                );
                if self.waiting_set.insert(key.clone()) {
                    self.waiting.push_back(key);
                }
            }
        }
    }

    fn schedule_waiting(&mut self) {
        let cap = self.sh.settings.kubelet.pods_per_node;
        while self.load.iter().any(|l| *l < cap) {
            let Some(key) = self.waiting.pop_front() else {
                break;
            };
            if !self.waiting_set.remove(&key) {
                continue;
            }
            if let Some(stored) = self.sh.store.get(Kind::Pod, &key.0, &key.1) {
                let pod = stored.value;
                if !is_bound(&pod) && pod.pointer("/metadata/deletionTimestamp").is_none() {
                    self.place(key, &pod);
                }
            }
        }
    }

    fn fire_due(&mut self) {
        let now = Instant::now();
        while self.timers.peek().is_some_and(|t| t.0.at <= now) {
            let Some(Reverse(timer)) = self.timers.pop() else {
                break;
            };
            self.fire(timer);
        }
    }

    fn fire(&mut self, t: Timer) {
        let sh = self.sh.clone();
        let store = &sh.store;
        let Some(current) = store.get(Kind::Pod, &t.key.0, &t.key.1) else {
            return;
        };
        if current.uid() != t.uid {
            return;
        }
        let settings = self.sh.settings.kubelet.clone();
        match t.action {
            Action::Kill => {
                if let Some(p) = &self.processes {
                    p.signal(&t.uid, Signal::SIGKILL);
                }
            }
            Action::Remove => {
                let _ = store.update(
                    Kind::Pod,
                    &t.key.0,
                    &t.key.1,
                    Box::new(|cur| Ok(Some(stopped(cur, 143, "Error")))),
                );
                let uid = t.uid.clone();
                let _ = delete_object(store, Kind::Pod, &t.key.0, &t.key.1, Some(0), |cur| {
                    if uid_of(cur) == uid {
                        Ok(())
                    } else {
                        Err(super::status::ApiError::no_route())
                    }
                });
            }
            Action::Start => {
                // A client may have moved the pod on meanwhile (e.g. patched it Failed).
                if phase(&current.value) != "Pending"
                    || current
                        .value
                        .pointer("/metadata/deletionTimestamp")
                        .is_some()
                {
                    return;
                }
                let images: Vec<String> = containers(&current.value)
                    .iter()
                    .map(|c| str_at(c, "/image"))
                    .collect();
                let bad_image = images
                    .iter()
                    .find(|i| settings.failing_images.contains(i))
                    .cloned();
                let fails = self.processes.is_none()
                    && settings.fail_fraction > 0.0
                    && self.rng.r#gen::<f64>() < settings.fail_fraction;
                self.next_ip += 1;
                let ip = format!(
                    "10.{}.{}.{}",
                    200 + (self.next_ip >> 16) % 50,
                    (self.next_ip >> 8) & 255,
                    self.next_ip & 255
                );
                let (ip, host) = if self.processes.is_some() {
                    (POD_IP.to_string(), POD_IP.to_string())
                } else {
                    (ip, host_ip(&current.value))
                };
                let containerd: String = (0..16)
                    .map(|_| format!("{:x}", self.rng.gen_range(0..16u8)))
                    .collect();
                let outcome = if let Some(image) = bad_image {
                    self.schedule(
                        &t.key,
                        &t.uid,
                        Action::Backoff,
                        Duration::from_millis(settings.image_pull_backoff_ms),
                    );
                    Outcome::PullError(image)
                } else if let Some(p) = &mut self.processes {
                    match p.start(&t.key, &current.value, store) {
                        Ok(true) => Outcome::Running,
                        // Started before (a resync saw the pod again): nothing to do.
                        Ok(false) => return,
                        Err(failure) => match failure.waiting {
                            // As a kubelet waits for a missing ConfigMap: try again soon.
                            Some(reason) => {
                                self.schedule(&t.key, &t.uid, Action::Start, START_RETRY);
                                Outcome::Waiting(failure.container, reason, failure.message)
                            }
                            None => {
                                tracing::warn!(pod = %t.key.1, namespace = %t.key.0, reason = %failure.message, "process runtime cannot start the pod");
                                Outcome::StartFailed(failure.container, failure.message)
                            }
                        },
                    }
                } else if fails {
                    Outcome::Failed(settings.fail_exit_code)
                } else {
                    if let Some(ms) = settings.exit_after_ms {
                        self.schedule(&t.key, &t.uid, Action::Exit, Duration::from_millis(ms));
                    }
                    Outcome::Running
                };
                let _ = store.update(
                    Kind::Pod,
                    &t.key.0,
                    &t.key.1,
                    Box::new(|cur| Ok(Some(started(cur, &outcome, &ip, &host, &containerd)))),
                );
            }
            Action::Backoff => {
                let _ = store.update(
                    Kind::Pod,
                    &t.key.0,
                    &t.key.1,
                    Box::new(|cur| {
                        let mut next = cur.clone();
                        if let Some(statuses) = next.pointer_mut("/status/containerStatuses").and_then(Value::as_array_mut) {
                            for s in statuses.iter_mut().filter(|s| s.is_object()) {
                                if s.pointer("/state/waiting/reason").and_then(Value::as_str) == Some("ErrImagePull") {
                                    let image = str_at(s, "/image");
                                    s["state"] = json!({"waiting": {"reason": "ImagePullBackOff", "message": format!("Back-off pulling image \"{image}\"")}});
                                }
                            }
                        }
                        Ok(Some(next))
                    }),
                );
            }
            Action::Exit => {
                let code = settings.exit_code;
                let _ = store.update(
                    Kind::Pod,
                    &t.key.0,
                    &t.key.1,
                    Box::new(|cur| {
                        if phase(cur) != "Running" {
                            return Ok(None);
                        }
                        Ok(Some(stopped(
                            cur,
                            code,
                            if code == 0 { "Completed" } else { "Error" },
                        )))
                    }),
                );
            }
        }
    }
}

pub(crate) enum Outcome {
    Running,
    Failed(i32),
    PullError(String),
    /// The process runtime could not start container N (pod Failed, `StartError`, 128).
    StartFailed(usize, String),
    /// The process runtime waits for something container N needs (reason, message).
    Waiting(usize, &'static str, String),
}

/// How soon the process runtime tries again to start a pod waiting for a ConfigMap.
pub(crate) const START_RETRY: Duration = Duration::from_millis(500);

fn str_at(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

fn containers(pod: &Value) -> Vec<Value> {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn host_ip(pod: &Value) -> String {
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .and_then(node_index)
        .unwrap_or(0);
    format!("192.168.{}.{}", node / 250, node % 250 + 1)
}

pub(crate) fn started(
    cur: &Value,
    outcome: &Outcome,
    ip: &str,
    host: &str,
    containerd: &str,
) -> Value {
    let now = now_rfc3339();
    let mut next = cur.clone();
    let ready = matches!(outcome, Outcome::Running);
    let statuses: Vec<Value> = containers(cur)
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let image = str_at(c, "/image");
            let state = match outcome {
                Outcome::Running => json!({"running": {"startedAt": now}}),
                Outcome::Failed(code) => json!({"terminated": {"exitCode": code, "reason": "Error", "startedAt": now, "finishedAt": now, "containerID": format!("containerd://{containerd}{i}")}}),
                Outcome::PullError(bad) if *bad == image => json!({"waiting": {"reason": "ErrImagePull", "message": format!("failed to pull and unpack image \"{image}\": not found")}}),
                Outcome::PullError(_) => json!({"waiting": {"reason": "PodInitializing"}}),
                Outcome::Waiting(bad, reason, message) => {
                    let (reason, message) = if *bad == i { (*reason, message.as_str()) } else { ("ContainerCreating", "") };
                    let mut waiting = json!({"reason": reason});
                    if !message.is_empty() {
                        waiting["message"] = json!(message);
                    }
                    json!({"waiting": waiting})
                }
                Outcome::StartFailed(bad, message) => {
                    let message = if *bad == i { message.as_str() } else { "another container of the pod could not start" };
                    json!({"terminated": {"exitCode": 128, "reason": "StartError", "message": message, "startedAt": now, "finishedAt": now, "containerID": format!("containerd://{containerd}{i}")}})
                }
            };
            let mut s = json!({
                "name": str_at(c, "/name"), "image": image, "imageID": "", "ready": ready,
                "restartCount": 0, "started": ready, "state": state, "lastState": {}
            });
            if !matches!(outcome, Outcome::PullError(_) | Outcome::Waiting(..)) {
                s["containerID"] = json!(format!("containerd://{containerd}{i}"));
                s["imageID"] = json!(format!("{}@sha256:{containerd}", str_at(c, "/image")));
            }
            s
        })
        .collect();
    let pod_phase = match outcome {
        Outcome::Running => "Running",
        Outcome::Failed(_) | Outcome::StartFailed(..) => "Failed",
        Outcome::PullError(_) | Outcome::Waiting(..) => "Pending",
    };
    next["status"]["phase"] = json!(pod_phase);
    next["status"]["containerStatuses"] = Value::Array(statuses);
    next["status"]["hostIP"] = json!(host);
    next["status"]["hostIPs"] = json!([{"ip": host}]);
    if !matches!(outcome, Outcome::Waiting(..)) {
        next["status"]["podIP"] = json!(ip);
        next["status"]["podIPs"] = json!([{"ip": ip}]);
    }
    next["status"]["startTime"] = json!(now);
    let flag = if ready { "True" } else { "False" };
    let reason = (!ready).then_some("ContainersNotReady");
    set_condition(&mut next, "PodReadyToStartContainers", "True", None, None);
    set_condition(&mut next, "Initialized", "True", None, None);
    set_condition(&mut next, "Ready", flag, reason, None);
    set_condition(&mut next, "ContainersReady", flag, reason, None);
    next
}

/// The pod after container `index` ended with `code`; with `all_done`, its phase too
/// (Succeeded when every container exited 0, else Failed: no restarts).
pub(crate) fn container_exited(cur: &Value, index: usize, code: i32, all_done: bool) -> Value {
    let now = now_rfc3339();
    let mut next = cur.clone();
    if let Some(s) = next
        .pointer_mut("/status/containerStatuses")
        .and_then(Value::as_array_mut)
        .and_then(|list| list.get_mut(index))
        .filter(|s| s.is_object())
    {
        let started_at = s
            .pointer("/state/running/startedAt")
            .cloned()
            .unwrap_or(Value::Null);
        let container_id = s.get("containerID").cloned().unwrap_or(Value::Null);
        let reason = if code == 0 { "Completed" } else { "Error" };
        s["state"] = json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now, "containerID": container_id}});
        s["ready"] = json!(false);
        s["started"] = json!(false);
    }
    let reason = if all_done {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    set_condition(&mut next, "Ready", "False", Some(reason), None);
    set_condition(&mut next, "ContainersReady", "False", Some(reason), None);
    if all_done {
        let all_zero = next
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .is_some_and(|list| {
                list.iter().all(|s| {
                    s.pointer("/state/terminated/exitCode")
                        .and_then(Value::as_i64)
                        == Some(0)
                })
            });
        next["status"]["phase"] = json!(if all_zero { "Succeeded" } else { "Failed" });
    }
    next
}

/// The pod after its containers stopped with `code`.
fn stopped(cur: &Value, code: i32, reason: &str) -> Value {
    let now = now_rfc3339();
    let mut next = cur.clone();
    if let Some(statuses) = next
        .pointer_mut("/status/containerStatuses")
        .and_then(Value::as_array_mut)
    {
        for s in statuses {
            if !s.is_object() || s.pointer("/state/terminated").is_some() {
                continue;
            }
            let started_at = s
                .pointer("/state/running/startedAt")
                .cloned()
                .unwrap_or(Value::Null);
            s["state"] = json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": started_at, "finishedAt": now}});
            s["ready"] = json!(false);
            s["started"] = json!(false);
        }
    }
    if phase(cur) == "Running" || phase(cur) == "Pending" {
        next["status"]["phase"] = json!(if code == 0 { "Succeeded" } else { "Failed" });
    }
    set_condition(&mut next, "Ready", "False", Some("PodCompleted"), None);
    set_condition(
        &mut next,
        "ContainersReady",
        "False",
        Some("PodCompleted"),
        None,
    );
    next
}

/// The garbage collector: periodically deletes pods all of whose owners are gone (as the
/// controller-manager does with background propagation).
pub(crate) async fn run_gc(sh: Arc<Shared>) {
    let period = Duration::from_millis(sh.settings.kubelet.gc_interval_ms);
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                collect_garbage(&sh);
            }
            _ = sh.cancel.cancelled() => break,
        }
    }
}

fn served_kind(owner: &Value) -> bool {
    let api_version = owner
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("");
    let kind = owner.get("kind").and_then(Value::as_str).unwrap_or("");
    Kind::ALL
        .iter()
        .any(|k| k.api_version() == api_version && k.kind() == kind)
}

/// One pass of the garbage collector; returns how many pods it deleted.
pub(crate) fn collect_garbage(sh: &Shared) -> usize {
    let uids = sh.store.uids();
    let orphans = sh.store.select(Kind::Pod, |v| {
        let owners = v
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array);
        v.pointer("/metadata/deletionTimestamp").is_none()
            && owners.is_some_and(|o| {
                !o.is_empty()
                    && o.iter().all(|r| {
                        // An owner of a kind this cluster does not serve cannot be looked
                        // up, so it is taken to exist (its pods are never collected).
                        served_kind(r)
                            && r.get("uid")
                                .and_then(Value::as_str)
                                .is_none_or(|u| !uids.contains(u))
                    })
            })
    });
    let mut deleted = 0;
    for (ns, name, v) in orphans {
        let uid = uid_of(&v);
        let result = delete_object(&sh.store, Kind::Pod, &ns, &name, None, |cur| {
            if uid_of(cur) == uid {
                Ok(())
            } else {
                Err(super::status::ApiError::no_route())
            }
        });
        if result.is_ok() {
            deleted += 1;
        }
    }
    deleted
}
