//! The object store of the simulated API server: every object as JSON (unknown fields kept),
//! one cluster-wide resourceVersion counter, a bounded event history for watches resuming
//! from an older version, and a broadcast of every change. One mutex, held only for map
//! updates and one serialization per change.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use super::status::ApiError;

/// The resources the simulated API server serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// core/v1 namespaces (cluster-scoped).
    Namespace,
    /// core/v1 pods.
    Pod,
    /// core/v1 configmaps.
    ConfigMap,
    /// core/v1 services (no endpoints, no proxying: stored and listed only).
    Service,
    /// core/v1 persistentvolumeclaims (never bound: no provisioner).
    PersistentVolumeClaim,
    /// coordination.k8s.io/v1 leases.
    Lease,
    /// core/v1 secrets (stored only: no pod mounts them).
    Secret,
    /// core/v1 resourcequotas: pods, requests.cpu and requests.memory enforced at pod
    /// creation, `status` kept as the resourcequota controller keeps it (see `quota`).
    ResourceQuota,
    /// core/v1 nodes (cluster-scoped): the simulated nodes, Ready, as their kubelets
    /// register them (see `nodes::node_object`).
    Node,
}

impl Kind {
    /// Every kind, in discovery order.
    pub const ALL: [Kind; 9] = [
        Kind::Namespace,
        Kind::Pod,
        Kind::ConfigMap,
        Kind::Service,
        Kind::PersistentVolumeClaim,
        Kind::Lease,
        Kind::Secret,
        Kind::ResourceQuota,
        Kind::Node,
    ];

    fn index(self) -> usize {
        self as usize
    }
    /// The resource name in URLs (`pods`).
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Namespace => "namespaces",
            Kind::Pod => "pods",
            Kind::ConfigMap => "configmaps",
            Kind::Service => "services",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::Lease => "leases",
            Kind::Secret => "secrets",
            Kind::ResourceQuota => "resourcequotas",
            Kind::Node => "nodes",
        }
    }
    /// The `kind` of one object.
    pub fn kind(self) -> &'static str {
        match self {
            Kind::Namespace => "Namespace",
            Kind::Pod => "Pod",
            Kind::ConfigMap => "ConfigMap",
            Kind::Service => "Service",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::Lease => "Lease",
            Kind::Secret => "Secret",
            Kind::ResourceQuota => "ResourceQuota",
            Kind::Node => "Node",
        }
    }
    /// The API group (`""` for core).
    pub fn group(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io",
            _ => "",
        }
    }
    /// The `apiVersion` of its objects.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::Lease => "coordination.k8s.io/v1",
            _ => "v1",
        }
    }
    /// Whether objects live in a namespace.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node)
    }
    /// Short names advertised in discovery (used by kubectl).
    pub fn short_names(self) -> &'static [&'static str] {
        match self {
            Kind::Namespace => &["ns"],
            Kind::Pod => &["po"],
            Kind::ConfigMap => &["cm"],
            Kind::Service => &["svc"],
            Kind::PersistentVolumeClaim => &["pvc"],
            Kind::ResourceQuota => &["quota"],
            Kind::Node => &["no"],
            Kind::Lease | Kind::Secret => &[],
        }
    }
    /// Fields a field selector may name for this resource.
    pub fn field_labels(self) -> &'static [&'static str] {
        match self {
            Kind::Pod => &[
                "metadata.name",
                "metadata.namespace",
                "status.phase",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            Kind::Namespace => &["metadata.name", "status.phase"],
            Kind::Node => &["metadata.name"],
            Kind::Service => &[
                "metadata.name",
                "metadata.namespace",
                "spec.clusterIP",
                "spec.type",
            ],
            _ => &["metadata.name", "metadata.namespace"],
        }
    }
    /// Finds the kind served under `group`/`plural`.
    pub fn from_plural(group: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.group() == group && k.plural() == plural)
    }
}

/// One stored object: its JSON value and its serialization, computed once per change.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The object.
    pub value: Arc<Value>,
    /// `value` serialized, shared by GET answers, lists and watch events.
    pub json: Bytes,
}

impl Stored {
    fn new(value: Value) -> Stored {
        let json = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        Stored {
            value: Arc::new(value),
            json,
        }
    }
    /// `metadata.uid` (empty when absent).
    pub fn uid(&self) -> &str {
        self.value
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as kept in the history and broadcast to watchers.
#[derive(Debug)]
pub struct Event {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// Resource of the object.
    pub kind: Kind,
    /// Namespace of the object (empty for namespaces).
    pub namespace: String,
    /// What happened.
    pub event_type: EventType,
    /// The object after the change (for DELETED, its last state).
    pub object: Stored,
    /// The object before a MODIFIED change, so selector watches can see it leave or enter.
    pub previous: Option<Stored>,
}

/// How a delete ends for one object.
pub enum Deletion {
    /// Removed now; when `Some`, first stored in that state (a MODIFIED event) then removed.
    Now(Option<Value>),
    /// Kept in the given state (graceful deletion pending).
    Graceful(Value),
    /// Nothing changes (a repeated graceful delete that does not shorten the period).
    Unchanged,
}

/// The result of a watch registration.
pub struct WatchStart {
    /// Events already past the requested version, or synthetic ADDED events for the state.
    pub backlog: Vec<Arc<Event>>,
    /// Live events after the backlog.
    pub live: broadcast::Receiver<Arc<Event>>,
    /// The store's version when the watch started.
    pub rv: u64,
}

type Key = (String, String);

struct Inner {
    rv: u64,
    objects: [BTreeMap<Key, Stored>; Kind::ALL.len()],
    history: VecDeque<Arc<Event>>,
    /// Watches from a version below this get 410 Expired.
    compacted: u64,
}

/// The store shared by the API handlers, the kubelet and the garbage collector.
pub struct Store {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    history_cap: usize,
}

/// A mutation callback's verdict: `Ok(None)` leaves the object unchanged.
pub type Mutation<'a> = dyn FnOnce(&Value) -> Result<Option<Value>, ApiError> + 'a;

impl Store {
    /// An empty store whose history keeps `history_cap` events.
    pub fn new(history_cap: usize) -> Store {
        let (events, _) = broadcast::channel(65_536);
        Store {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: Default::default(),
                history: VecDeque::new(),
                compacted: 0,
            }),
            events,
            history_cap,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied change (every change is
        // computed before it is inserted), so a poisoned lock is still consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// The oldest version a watch may resume from.
    pub fn compacted(&self) -> u64 {
        self.lock().compacted
    }

    /// Forgets the history: watches from any earlier version now get 410 Expired.
    pub fn compact(&self) {
        let mut g = self.lock();
        g.history.clear();
        g.compacted = g.rv;
    }

    /// The history kept now (oldest first) and the version below which it was dropped (0:
    /// nothing dropped yet).
    pub fn history(&self) -> (Vec<Arc<Event>>, u64) {
        let g = self.lock();
        (g.history.iter().cloned().collect(), g.compacted)
    }

    /// A receiver of every future change (used by the kubelet).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.events.subscribe()
    }

    fn record(&self, g: &mut Inner, event: Event) {
        let event = Arc::new(event);
        if g.history.len() >= self.history_cap
            && let Some(old) = g.history.pop_front()
        {
            g.compacted = old.rv;
        }
        g.history.push_back(event.clone());
        // No receiver is not an error: nobody watches yet.
        let _ = self.events.send(event);
    }

    /// Gives `value` the next resourceVersion and records the change as an event; the caller
    /// puts the returned object in (or takes it out of) the map.
    fn commit(
        &self,
        g: &mut Inner,
        kind: Kind,
        ns: &str,
        event_type: EventType,
        mut value: Value,
        previous: Option<Stored>,
    ) -> Stored {
        g.rv += 1;
        let rv = g.rv;
        Self::set_rv(&mut value, rv);
        let stored = Stored::new(value);
        self.record(
            g,
            Event {
                rv,
                kind,
                namespace: ns.to_string(),
                event_type,
                object: stored.clone(),
                previous,
            },
        );
        stored
    }

    fn set_rv(value: &mut Value, rv: u64) {
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
    }

    /// Whether a namespace exists.
    pub fn namespace_exists(&self, ns: &str) -> bool {
        self.lock().objects[Kind::Namespace.index()].contains_key(&(String::new(), ns.to_string()))
    }

    /// Number of objects of a kind in a namespace (all namespaces when `None`).
    pub fn count(&self, kind: Kind, ns: Option<&str>) -> usize {
        let g = self.lock();
        match ns {
            None => g.objects[kind.index()].len(),
            Some(ns) => g.objects[kind.index()]
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .count(),
        }
    }

    /// Stores a new object. `name_for` is asked for a name until a free one is found (it
    /// returns the fixed name, or a generated one for `generateName`); `fill` completes the
    /// object with that name.
    pub fn create(
        &self,
        kind: Kind,
        ns: &str,
        mut name_for: impl FnMut() -> String,
        generated: bool,
        fill: impl FnOnce(&str) -> Value,
    ) -> Result<Stored, ApiError> {
        let mut g = self.lock();
        if kind.namespaced()
            && !g.objects[Kind::Namespace.index()].contains_key(&(String::new(), ns.to_string()))
        {
            return Err(ApiError::not_found("namespaces", "", ns));
        }
        let mut name = name_for();
        let mut tries = 0;
        while g.objects[kind.index()].contains_key(&(ns.to_string(), name.clone())) {
            tries += 1;
            if !generated || tries > 8 {
                return Err(ApiError::already_exists(kind.plural(), kind.group(), &name));
            }
            name = name_for();
        }
        let mut value = fill(&name);
        match kind {
            Kind::Pod => {
                let quotas: Vec<&Value> = Self::in_namespace(&g, Kind::ResourceQuota, ns)
                    .map(|s| &*s.value)
                    .collect();
                if !quotas.is_empty() {
                    let used = Self::pod_usage(&g, ns);
                    crate::quota::admit(&name, &value, &quotas, used)?;
                }
            }
            Kind::ResourceQuota => {
                value = crate::quota::with_status(value, Self::pod_usage(&g, ns))
            }
            _ => {}
        }
        let stored = self.commit(&mut g, kind, ns, EventType::Added, value, None);
        g.objects[kind.index()].insert((ns.to_string(), name), stored.clone());
        if kind == Kind::Pod {
            self.refresh_quotas(&mut g, ns);
        }
        Ok(stored)
    }

    /// Allocates a resourceVersion without storing anything (an injected lost create).
    pub fn burn_resource_version(&self) -> u64 {
        let mut g = self.lock();
        g.rv += 1;
        g.rv
    }

    /// One object.
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Stored> {
        self.lock().objects[kind.index()]
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of a kind (in one namespace or all), in key order, starting after `after`,
    /// at most `limit` of them (0 = all) that pass `filter`. Returns them, the store's
    /// version, and whether more remain.
    pub fn list(
        &self,
        kind: Kind,
        ns: Option<&str>,
        after: Option<&(String, String)>,
        limit: usize,
        filter: impl Fn(&Value) -> bool,
    ) -> (Vec<Stored>, u64, bool) {
        let g = self.lock();
        let map = &g.objects[kind.index()];
        let start = match (after, ns) {
            (Some(k), _) => std::ops::Bound::Excluded(k.clone()),
            (None, Some(ns)) => std::ops::Bound::Included((ns.to_string(), String::new())),
            (None, None) => std::ops::Bound::Unbounded,
        };
        let mut out = Vec::new();
        let mut more = false;
        for ((n, _), obj) in map.range((start, std::ops::Bound::Unbounded)) {
            if ns.is_some_and(|ns| ns != n) {
                break;
            }
            if !filter(&obj.value) {
                continue;
            }
            if limit > 0 && out.len() == limit {
                more = true;
                break;
            }
            out.push(obj.clone());
        }
        (out, g.rv, more)
    }

    /// Applies `change` to the current object; a changed object gets a new version and a
    /// MODIFIED event. Returns the object as stored afterwards.
    pub fn update(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        change: Box<Mutation<'_>>,
    ) -> Result<Stored, ApiError> {
        let mut g = self.lock();
        let key = (ns.to_string(), name.to_string());
        let Some(current) = g.objects[kind.index()].get(&key).cloned() else {
            return Err(ApiError::not_found(kind.plural(), kind.group(), name));
        };
        let Some(mut value) = change(&current.value)? else {
            return Ok(current);
        };
        if kind == Kind::ResourceQuota {
            value = crate::quota::with_status(value, Self::pod_usage(&g, ns));
        }
        // Compare ignoring the version the client sent: a no-op change keeps the version.
        if let (Some(meta), Some(rv)) = (
            value.get_mut("metadata").and_then(Value::as_object_mut),
            current.value.pointer("/metadata/resourceVersion"),
        ) {
            meta.insert("resourceVersion".into(), rv.clone());
        }
        if value == *current.value {
            return Ok(current);
        }
        let stored = self.commit(&mut g, kind, ns, EventType::Modified, value, Some(current));
        g.objects[kind.index()].insert(key, stored.clone());
        if kind == Kind::Pod {
            self.refresh_quotas(&mut g, ns);
        }
        Ok(stored)
    }

    /// The objects of `kind` in `ns`.
    fn in_namespace<'a>(g: &'a Inner, kind: Kind, ns: &str) -> impl Iterator<Item = &'a Stored> {
        let ns = ns.to_string();
        g.objects[kind.index()]
            .range((ns.clone(), String::new())..)
            .take_while(move |((n, _), _)| *n == ns)
            .map(|(_, s)| s)
    }

    /// What the pods of `ns` count against its quotas.
    fn pod_usage(g: &Inner, ns: &str) -> [u64; 3] {
        crate::quota::usage(Self::in_namespace(g, Kind::Pod, ns).map(|s| &*s.value))
    }

    /// The resourcequota controller's work, done at once after a pod of `ns` changed: each
    /// quota's `status.used` follows the namespace's pods (a MODIFIED event when it moves).
    fn refresh_quotas(&self, g: &mut Inner, ns: &str) {
        let quotas: Vec<Stored> = Self::in_namespace(g, Kind::ResourceQuota, ns)
            .cloned()
            .collect();
        if quotas.is_empty() {
            return;
        }
        let used = Self::pod_usage(g, ns);
        for quota in quotas {
            let value = crate::quota::with_status((*quota.value).clone(), used);
            if value == *quota.value {
                continue;
            }
            let Some(name) = value.pointer("/metadata/name").and_then(Value::as_str) else {
                continue;
            };
            let key = (ns.to_string(), name.to_string());
            let stored = self.commit(
                g,
                Kind::ResourceQuota,
                ns,
                EventType::Modified,
                value,
                Some(quota),
            );
            g.objects[Kind::ResourceQuota.index()].insert(key, stored);
        }
    }

    /// Deletes one object as `decide` says. Returns its last state and whether it is gone.
    pub fn delete(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        decide: impl FnOnce(&Value) -> Result<Deletion, ApiError>,
    ) -> Result<(Stored, bool), ApiError> {
        let mut g = self.lock();
        self.delete_locked(&mut g, kind, ns, name, decide)
    }

    fn delete_locked(
        &self,
        g: &mut Inner,
        kind: Kind,
        ns: &str,
        name: &str,
        decide: impl FnOnce(&Value) -> Result<Deletion, ApiError>,
    ) -> Result<(Stored, bool), ApiError> {
        let key = (ns.to_string(), name.to_string());
        let Some(current) = g.objects[kind.index()].get(&key).cloned() else {
            return Err(ApiError::not_found(kind.plural(), kind.group(), name));
        };
        match decide(&current.value)? {
            Deletion::Unchanged => Ok((current, false)),
            Deletion::Graceful(value) => {
                let stored = self.commit(g, kind, ns, EventType::Modified, value, Some(current));
                g.objects[kind.index()].insert(key, stored.clone());
                Ok((stored, false))
            }
            Deletion::Now(marked) => {
                let previous = match marked {
                    Some(value) => {
                        self.commit(g, kind, ns, EventType::Modified, value, Some(current))
                    }
                    None => current,
                };
                g.objects[kind.index()].remove(&key);
                let last = (*previous.value).clone();
                let stored = self.commit(g, kind, ns, EventType::Deleted, last, Some(previous));
                if kind == Kind::Pod {
                    self.refresh_quotas(g, ns);
                }
                Ok((stored, true))
            }
        }
    }

    /// Removes a namespace and everything in it (the namespace controller's work, done at once).
    pub fn delete_namespace(&self, name: &str) -> Result<Stored, ApiError> {
        let mut g = self.lock();
        for kind in Kind::ALL.into_iter().filter(|k| k.namespaced()) {
            let keys: Vec<Key> = g.objects[kind.index()]
                .range((name.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == name)
                .map(|(k, _)| k.clone())
                .collect();
            for (ns, n) in keys {
                self.delete_locked(&mut g, kind, &ns, &n, |_| Ok(Deletion::Now(None)))?;
            }
        }
        self.delete_locked(&mut g, Kind::Namespace, "", name, |_| {
            Ok(Deletion::Now(None))
        })
        .map(|(s, _)| s)
    }

    /// Registers a watch. From `Some(rv)`, replays the kept events after `rv` (or fails with
    /// the oldest version still kept when `rv` was compacted away); from `None`, starts with
    /// a synthetic ADDED event per current object.
    pub fn watch(
        &self,
        kind: Kind,
        ns: Option<&str>,
        from: Option<u64>,
    ) -> Result<WatchStart, u64> {
        let g = self.lock();
        let live = self.events.subscribe();
        let backlog = match from {
            Some(from) => {
                if from < g.compacted {
                    return Err(g.compacted + 1);
                }
                let skip = g.history.partition_point(|e| e.rv <= from);
                g.history
                    .iter()
                    .skip(skip)
                    .filter(|e| e.kind == kind)
                    .cloned()
                    .collect()
            }
            None => g.objects[kind.index()]
                .iter()
                .filter(|((n, _), _)| ns.is_none_or(|ns| ns == n))
                .map(|((n, _), obj)| {
                    Arc::new(Event {
                        rv: g.rv,
                        kind,
                        namespace: n.clone(),
                        event_type: EventType::Added,
                        object: obj.clone(),
                        previous: None,
                    })
                })
                .collect(),
        };
        Ok(WatchStart {
            backlog,
            live,
            rv: g.rv,
        })
    }

    /// Every `metadata.uid` currently stored (for the garbage collector).
    pub fn uids(&self) -> std::collections::HashSet<String> {
        let g = self.lock();
        g.objects
            .iter()
            .flat_map(|m| m.values())
            .map(|o| o.uid().to_string())
            .collect()
    }

    /// Pods (namespace, name, value) that pass `filter`.
    pub fn select(
        &self,
        kind: Kind,
        filter: impl Fn(&Value) -> bool,
    ) -> Vec<(String, String, Arc<Value>)> {
        let g = self.lock();
        g.objects[kind.index()]
            .iter()
            .filter(|(_, o)| filter(&o.value))
            .map(|((ns, n), o)| (ns.clone(), n.clone(), o.value.clone()))
            .collect()
    }
}
