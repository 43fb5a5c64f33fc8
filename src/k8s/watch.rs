//! The pod watches of a namespace, shared by every application there: executor pods
//! fanned out by the `spark-app-selector` label, and driver pods (those the service
//! labelled [`FOLLOWED_DRIVER_LABEL`] at Start) by name to the application that named them;
//! plus the periodic full LIST that replaces each application's snapshot. A namespace's
//! watches start with its first subscriber and stop with its last. Each namespace watch
//! started before the service is ready holds a readiness handle until its first listing
//! is done, and the API server probe holds one until the API server answers.
//!
//! Why two selections, not one: a label selector is an AND of requirements, so one watch
//! cannot select "Spark's executors OR the drivers named at Start". A driver pod named at
//! Start may carry no Spark label at all (a notebook, a Python driver in client mode), so
//! the service puts a label of its own on every driver pod named at Start (the pod it
//! already patches for the executor id record) and watches that label beside the
//! executors: two watch connections per namespace, whatever the number of applications,
//! and no event of a driver pod that no application named. The driver watch starts with
//! the namespace's first application that names a driver pod: applications without one
//! (client mode: a notebook, a driver outside the cluster) cost the executors' watch only. One key for both (the
//! service's label on executor pods too) would need one watch only, but executor pods made
//! before it (a resume after an upgrade) would be invisible, and replaced.
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::request::describe_error;
use crate::allocator::budget::QuotaState;
use crate::allocator::types::{APP_ID_LABEL, EXECUTOR_INACTIVE_LABEL, EXECUTOR_ROLE, ROLE_LABEL};
use crate::lifecycle::{InitHandle, InitJoiner};
use crate::metrics::Metrics;
use crate::time::{Clock, Timestamp};

/// What an application actor hears about its executor pods.
#[derive(Debug, Clone)]
pub enum PodEvent {
    /// A pod was added or changed.
    Applied(Pod),
    /// A pod is gone.
    Deleted(Pod),
    /// A full listing of the application's executor pods (watch restart or periodic
    /// LIST): replaces the snapshot; empty when it has none. A pod whose version the
    /// application was already sent comes as its name only, so a listing holds no more
    /// full pods than changed since the last one.
    Resync(Vec<Listed>),
    /// The application's driver pod was added or changed (also sent by every listing
    /// that holds it).
    Driver(Pod),
    /// The application's driver pod is gone (a DELETED event, or a listing without it).
    DriverDeleted,
}

/// One pod of a full listing.
#[derive(Debug, Clone)]
pub enum Listed {
    /// A version of the pod the application was not sent yet (boxed: most of a listing
    /// is names).
    Changed(Box<Pod>),
    /// The pod of this name, as the application was last sent it (unchanged since).
    Unchanged(String),
}

impl Listed {
    /// The pod's name.
    fn name(&self) -> &str {
        match self {
            Self::Changed(pod) => pod.metadata.name.as_deref().unwrap_or_default(),
            Self::Unchanged(name) => name,
        }
    }
}

/// The shared watches of the service.
#[derive(Clone)]
pub struct PodWatches {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    clock: Arc<dyn Clock>,
    resync: ResyncPace,
    namespaces: Mutex<HashMap<String, NamespaceWatch>>,
    /// Set once the API server answered the probe or a watch completed its first listing.
    synced: AtomicBool,
    metrics: Metrics,
    /// Where the probe and each namespace watch take the readiness handle they release.
    readiness: InitJoiner,
    /// Where the namespaces' ResourceQuotas go; none: they are not watched.
    quota_sink: Mutex<Option<Arc<dyn QuotaSink>>>,
}

type Subscribers = Arc<Mutex<HashMap<String, Subscriber>>>;

/// Where the ResourceQuotas of the namespaces watched go, each time one changes (the
/// budgets' ledger): the namespace and every quota it has that limits pods, CPU or memory
/// requests, as their status shows them.
pub trait QuotaSink: Send + Sync {
    fn quotas(&self, namespace: &str, quotas: Vec<QuotaState>);
}

/// A ResourceQuota's status as a budget counts it (`None`: it limits nothing counted, or
/// its status is not known yet).
fn quota_state(quota: &ResourceQuota) -> Option<QuotaState> {
    let name = quota.metadata.name.as_deref()?;
    let status = quota.status.as_ref()?;
    let hard = status.hard.as_ref()?;
    let used = status.used.clone().unwrap_or_default();
    QuotaState::of(
        name,
        hard.iter().map(|(k, v)| (k.as_str(), v.0.as_str())),
        used.iter().map(|(k, v)| (k.as_str(), v.0.as_str())),
    )
}

/// resourceVersions by pod name (one per executor pod followed: boxed, not `String`s).
type Versions = HashMap<Box<str>, Box<str>>;

/// Where one application's events go.
struct Subscriber {
    tx: mpsc::UnboundedSender<PodEvent>,
    /// The driver pod followed for it (named at Start, labelled [`FOLLOWED_DRIVER_LABEL`]).
    driver: Option<String>,
    /// The resourceVersion of each executor pod last sent to it, by pod name.
    sent: Versions,
    /// While a periodic LIST runs beside the watch: the executor pods the watch sent
    /// since it began. The watch is newer than the listing for those.
    touched: Option<HashSet<Box<str>>>,
}

/// The tasks of one namespace: its pod watches with the periodic LIST ([`PodWatch`]), and
/// its ResourceQuota watch when the budgets follow quotas; dropping it stops them.
struct NamespaceWatch {
    subscribers: Subscribers,
    /// Set once this namespace's watch completed its initial listing.
    synced: Arc<AtomicBool>,
    /// Asks the task to watch driver pods too (an application here named one).
    drivers: Arc<DriversWanted>,
    task: JoinHandle<()>,
    quota_task: Option<JoinHandle<()>>,
}

impl Drop for NamespaceWatch {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(task) = &self.quota_task {
            task.abort();
        }
    }
}

/// Whether a namespace's driver pods are to be watched: set (once) by the first
/// application there that names a driver pod, which wakes the namespace's task.
#[derive(Default)]
struct DriversWanted {
    wanted: AtomicBool,
    wake: tokio::sync::Notify,
}

impl DriversWanted {
    fn want(&self) {
        if !self.wanted.swap(true, Ordering::Relaxed) {
            // Kept as a permit when the task is not waiting yet.
            self.wake.notify_one();
        }
    }

    fn is_wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }
}

/// An application's registration with its namespace's watch; dropping it unsubscribes
/// (and stops the watch when it was the last one).
pub struct Subscription {
    /// The application's pod events.
    pub events: mpsc::UnboundedReceiver<PodEvent>,
    namespace: String,
    app_id: String,
    inner: Arc<Inner>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut namespaces = lock(&self.inner.namespaces);
        let now_empty = namespaces.get(&self.namespace).is_some_and(|watch| {
            let mut subscribers = lock(&watch.subscribers);
            subscribers.remove(&self.app_id);
            subscribers.is_empty()
        });
        if now_empty {
            namespaces.remove(&self.namespace);
            tracing::info!(namespace = %self.namespace, "last application left; executor pod watch stopped");
        }
    }
}

/// The label the service puts on every driver pod named at Start (value
/// [`FOLLOWED_DRIVER_VALUE`]), so the namespace's driver watch follows it whatever its
/// other labels. It stays on the pod when the application stops, like the id record's
/// annotation: the pod belongs to the driver, and an extra label costs nothing.
pub const FOLLOWED_DRIVER_LABEL: &str = "spark-pod-allocator/driver";

/// The value of [`FOLLOWED_DRIVER_LABEL`].
pub const FOLLOWED_DRIVER_VALUE: &str = "true";

/// The two selections of pods a namespace's watches follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Selection {
    /// Executor pods (inactive ones are ignored): [`executor_pods_selector`].
    Executors,
    /// Driver pods named at Start: [`followed_drivers_selector`].
    Drivers,
}

impl Selection {
    fn selector(self) -> String {
        match self {
            Self::Executors => executor_pods_selector(),
            Self::Drivers => followed_drivers_selector(),
        }
    }
}

/// The selector of the executor pods the service follows (inactive ones are ignored).
fn executor_pods_selector() -> String {
    format!("{ROLE_LABEL}={EXECUTOR_ROLE},{EXECUTOR_INACTIVE_LABEL}!=true")
}

/// The selector of the driver pods the service follows: those it labelled at Start.
fn followed_drivers_selector() -> String {
    format!("{FOLLOWED_DRIVER_LABEL}={FOLLOWED_DRIVER_VALUE}")
}

impl PodWatches {
    /// Watches with `client`; the full LIST comes at the `resync` pace of `clock`.
    /// Events, relists, errors and LISTs are counted into `metrics`; the probe and the
    /// namespace watches hold the service's readiness back through `readiness`.
    pub fn new(
        client: kube::Client,
        clock: Arc<dyn Clock>,
        resync: ResyncPace,
        metrics: Metrics,
        readiness: InitJoiner,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                clock,
                resync,
                namespaces: Mutex::new(HashMap::new()),
                synced: AtomicBool::new(false),
                metrics,
                readiness,
                quota_sink: Mutex::new(None),
            }),
        }
    }

    /// Watches each namespace's ResourceQuotas too (beside its pods, in a task of their
    /// own), into `sink`, from the next namespace watch started on.
    pub fn follow_quotas(&self, sink: Arc<dyn QuotaSink>) {
        *lock(&self.inner.quota_sink) = Some(sink);
    }

    /// True once a watch has completed its initial listing, or the API server answered
    /// the start-up probe (so a service without applications still reports healthy).
    pub fn is_synced(&self) -> bool {
        self.inner.synced.load(Ordering::Relaxed)
    }

    /// Probes the API server until it answers, then marks the watches synced and
    /// releases its readiness handle: a service without applications is ready once its
    /// API server answers. Runs as a task of the current tokio runtime; retries with
    /// backoff.
    pub fn spawn_probe(&self) -> JoinHandle<()> {
        let readiness = self.inner.readiness.join();
        // Weak: the probe ends once the watches are dropped, even if never answered.
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut delay = Duration::from_millis(100);
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                match inner.client.apiserver_version().await {
                    Ok(_) => {
                        inner.synced.store(true, Ordering::Relaxed);
                        drop(readiness);
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(error = %describe_error(&err), "kubernetes API server not reachable yet");
                    }
                }
                drop(inner);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        })
    }

    /// Subscribes `app_id` to the executor pods of `namespace`, starting the namespace's
    /// watch if it is the first application there, and following the driver pod `driver`
    /// if any (which must carry [`FOLLOWED_DRIVER_LABEL`]: a listing without it reports it
    /// deleted).
    pub fn subscribe_with_driver(
        &self,
        namespace: &str,
        app_id: &str,
        driver: Option<&str>,
    ) -> Subscription {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut namespaces = lock(&self.inner.namespaces);
        let watch = namespaces
            .entry(namespace.to_string())
            .or_insert_with(|| self.start_namespace(namespace));
        if driver.is_some() {
            watch.drivers.want();
        }
        let subscriber = Subscriber {
            tx,
            driver: driver.map(str::to_string),
            sent: HashMap::new(),
            touched: None,
        };
        lock(&watch.subscribers).insert(app_id.to_string(), subscriber);
        Subscription {
            events: rx,
            namespace: namespace.to_string(),
            app_id: app_id.to_string(),
            inner: Arc::clone(&self.inner),
        }
    }

    /// True once the watch of `namespace` runs and has completed its initial listing.
    pub fn is_namespace_synced(&self, namespace: &str) -> bool {
        lock(&self.inner.namespaces)
            .get(namespace)
            .is_some_and(|watch| watch.synced.load(Ordering::Relaxed))
    }

    /// Namespaces with a running watch (for status and tests).
    pub fn watched_namespaces(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.inner.namespaces).keys().cloned().collect();
        names.sort();
        names
    }

    fn start_namespace(&self, namespace: &str) -> NamespaceWatch {
        tracing::info!(
            namespace,
            "first application here; starting executor pod watch"
        );
        let subscribers: Subscribers = Arc::default();
        let first_listing = FirstListing {
            synced: Arc::new(AtomicBool::new(false)),
            readiness: self.inner.readiness.join(),
        };
        let synced = Arc::clone(&first_listing.synced);
        let drivers_wanted = Arc::new(DriversWanted::default());
        let api: Api<Pod> = Api::namespaced(self.inner.client.clone(), namespace);
        // The first full LIST is due one interval after the watch starts (not after the
        // task first gets to run).
        let first_resync = self.inner.clock.now().plus(self.inner.resync.interval);
        let watch = PodWatch {
            api,
            subscribers: Arc::clone(&subscribers),
            inner: Arc::clone(&self.inner),
            namespace: namespace.to_string(),
            first_listing,
            executors: WatchState::Unlisted,
            drivers: WatchState::Unwatched,
            drivers_wanted: Arc::clone(&drivers_wanted),
            periodic: Periodic::Due(first_resync),
        };
        let watch_task = tokio::spawn(watch.run());
        let sink = lock(&self.inner.quota_sink).clone();
        let quota_task = sink.map(|sink| {
            let api = Api::namespaced(self.inner.client.clone(), namespace);
            let inner = Arc::clone(&self.inner);
            tokio::spawn(watch_quotas(api, sink, namespace.to_string(), inner))
        });
        NamespaceWatch {
            subscribers,
            synced,
            drivers: drivers_wanted,
            task: watch_task,
            quota_task,
        }
    }
}

/// A namespace watch's first complete listing of both selections: until it is done the
/// namespace is not synced, and the watch holds back the service's readiness (when it
/// started before the service was ready).
struct FirstListing {
    synced: Arc<AtomicBool>,
    readiness: Option<InitHandle>,
}

impl FirstListing {
    fn done(&mut self, inner: &Inner) {
        self.synced.store(true, Ordering::Relaxed);
        inner.synced.store(true, Ordering::Relaxed);
        self.readiness = None;
    }
}

/// A namespace's two pod watches (one kube-runtime watcher per [`Selection`]) and its
/// periodic full LIST, as one state stepped by what comes next: a watch event, the LIST
/// falling due, the LIST done.
///
/// Each watcher relists after 410 and re-watches with backoff; its restarts (Init …
/// InitDone) become a resync of every subscriber's pods of that selection. The periodic
/// LIST (a consistent read: no `resourceVersion`, never the watch cache's `0`) is the
/// backstop for a missed event. It runs beside the watches, whose events go on being
/// routed meanwhile and are newer than it: the executor pods they touch are noted and the
/// listing gives way to them ([`resync_all`]), so it never undoes an event forwarded while
/// it ran. A relist of the executors' watch supersedes a periodic LIST under way.
struct PodWatch {
    api: Api<Pod>,
    subscribers: Subscribers,
    inner: Arc<Inner>,
    namespace: String,
    first_listing: FirstListing,
    executors: WatchState,
    drivers: WatchState,
    /// Set when an application here names a driver pod: the driver watch then starts.
    drivers_wanted: Arc<DriversWanted>,
    periodic: Periodic,
}

/// Where one selection's watcher is.
enum WatchState {
    /// Not watched: no application here named a pod of it (the drivers' selection only).
    Unwatched,
    /// Its first listing has not begun.
    Unlisted,
    /// Listing (Init … InitDone): the pods listed so far; `listed_before`: not its first.
    Listing {
        listing: Box<Listing>,
        listed_before: bool,
    },
    /// Listed; its events are routed as they come.
    Listed,
}

impl WatchState {
    /// True once a first listing was completed, or when not watched (nothing to list).
    fn has_listed(&self) -> bool {
        match self {
            Self::Unwatched => true,
            Self::Unlisted => false,
            Self::Listing { listed_before, .. } => *listed_before,
            Self::Listed => true,
        }
    }
}

/// The periodic LIST of a namespace: due at an instant, or under way.
enum Periodic {
    Due(Timestamp),
    Listing(futures::future::BoxFuture<'static, ()>),
}

/// What steps a [`PodWatch`]. Not boxed: each is moved once out of the stream, and
/// boxing a pod event would cost an allocation per event.
#[allow(clippy::large_enum_variant)]
enum Input {
    Pods(Selection, Result<watcher::Event<Pod>, watcher::Error>),
    ListDue,
    ListDone,
    /// An application here named a driver pod: the driver watch is to start.
    DriversWanted,
    /// The watchers' stream ended (it does not, while the task runs).
    Ended,
}

type PodEvents = futures::stream::SelectAll<
    futures::stream::BoxStream<'static, (Selection, Result<watcher::Event<Pod>, watcher::Error>)>,
>;

impl PodWatch {
    /// Runs until the task is aborted (the namespace's last application left).
    async fn run(mut self) {
        let api = self.api.clone();
        let watch = |selection: Selection| {
            let config = watcher::Config::default().labels(&selection.selector());
            watcher(api.clone(), config)
                .default_backoff()
                .map(move |event| (selection, event))
        };
        let mut events: PodEvents = futures::stream::SelectAll::new();
        events.push(watch(Selection::Executors).boxed());
        loop {
            let input = self.next(&mut events).await;
            if let Input::DriversWanted = input {
                self.drivers = WatchState::Unlisted;
                events.push(watch(Selection::Drivers).boxed());
                continue;
            }
            if !self.step(input) {
                break;
            }
        }
    }

    /// Waits for the next watch event, or for the periodic LIST to fall due or end.
    async fn next(&mut self, events: &mut PodEvents) -> Input {
        let pods = |event: Option<_>| match event {
            Some((selection, event)) => Input::Pods(selection, event),
            None => Input::Ended,
        };
        let unwatched = matches!(self.drivers, WatchState::Unwatched);
        if unwatched && self.drivers_wanted.is_wanted() {
            return Input::DriversWanted;
        }
        let wanted = Arc::clone(&self.drivers_wanted);
        let drivers_wanted = async {
            if unwatched {
                wanted.wake.notified().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        match &mut self.periodic {
            Periodic::Due(at) => tokio::select! {
                event = events.next() => pods(event),
                () = self.inner.clock.sleep_until(*at) => Input::ListDue,
                () = drivers_wanted => Input::DriversWanted,
            },
            Periodic::Listing(listing) => tokio::select! {
                event = events.next() => pods(event),
                () = listing => Input::ListDone,
                () = drivers_wanted => Input::DriversWanted,
            },
        }
    }

    /// Takes in one input; false when the watch is over.
    fn step(&mut self, input: Input) -> bool {
        match input {
            Input::Ended => return false,
            // Taken by `run`, which owns the watchers.
            Input::DriversWanted => {}
            Input::ListDue => {
                let (api, subscribers) = (self.api.clone(), Arc::clone(&self.subscribers));
                let (namespace, metrics) = (self.namespace.clone(), self.inner.metrics.clone());
                let drivers = !matches!(self.drivers, WatchState::Unwatched);
                self.periodic = Periodic::Listing(Box::pin(async move {
                    resync(&api, &subscribers, &namespace, &metrics, drivers).await;
                }));
            }
            // The next LIST is due an interval after this one ended.
            Input::ListDone => {
                self.periodic = Periodic::Due(self.inner.next_resync(&self.subscribers))
            }
            Input::Pods(selection, event) => self.take(selection, event),
        }
        true
    }

    /// Takes in one event of `selection`'s watcher.
    fn take(&mut self, selection: Selection, event: Result<watcher::Event<Pod>, watcher::Error>) {
        let (subscribers, inner) = (&self.subscribers, &self.inner);
        let state = match selection {
            Selection::Executors => &mut self.executors,
            Selection::Drivers => &mut self.drivers,
        };
        match event {
            Ok(watcher::Event::Apply(pod)) => {
                inner.metrics.watch_event("apply");
                route(subscribers, selection, pod, false)
            }
            Ok(watcher::Event::Delete(pod)) => {
                inner.metrics.watch_event("delete");
                route(subscribers, selection, pod, true)
            }
            Ok(watcher::Event::Init) => {
                inner.metrics.watch_relisted();
                *state = WatchState::Listing {
                    listing: Box::new(Listing::new(subscribers, selection)),
                    listed_before: state.has_listed(),
                };
            }
            Ok(watcher::Event::InitApply(pod)) => {
                if let WatchState::Listing { listing, .. } = state {
                    listing.add(subscribers, pod);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let listing = match std::mem::replace(state, WatchState::Listed) {
                    WatchState::Listing { listing, .. } => *listing,
                    WatchState::Unwatched | WatchState::Unlisted | WatchState::Listed => {
                        Listing::new(subscribers, selection)
                    }
                };
                resync_all(subscribers, listing);
                // The watch listed everything afresh: a periodic LIST begun before is
                // older, and the next one is an interval away.
                if selection == Selection::Executors
                    && matches!(self.periodic, Periodic::Listing(_))
                {
                    stop_tracking(subscribers);
                    self.periodic = Periodic::Due(inner.next_resync(subscribers));
                }
                if self.executors.has_listed() && self.drivers.has_listed() {
                    self.first_listing.done(inner);
                }
                tracing::debug!(namespace = %self.namespace, ?selection, "pod watch (re)listed");
            }
            Err(err) => {
                inner.metrics.watch_failed(watch_error_code(&err));
                tracing::warn!(namespace = %self.namespace, ?selection, error = %err, "pod watch failed; retrying with backoff");
            }
        }
    }
}

/// The ResourceQuotas of `namespace`, into `sink` each time they change, until the task is
/// aborted. A task of its own: the budgets' ledger takes a quota's state whenever it
/// comes, whatever the pod watches are doing.
async fn watch_quotas(
    api: Api<ResourceQuota>,
    sink: Arc<dyn QuotaSink>,
    namespace: String,
    inner: Arc<Inner>,
) {
    let mut quotas = QuotaWatch::default();
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        quotas.take(event, sink.as_ref(), &namespace, &inner);
    }
}

/// A namespace's ResourceQuotas as the watch has them.
#[derive(Default)]
struct QuotaWatch {
    current: std::collections::BTreeMap<String, QuotaState>,
    /// A relist under way (Init … InitDone).
    relisting: Option<std::collections::BTreeMap<String, QuotaState>>,
}

impl QuotaWatch {
    /// Takes in one event; the quotas go to `sink` whenever they changed.
    fn take(
        &mut self,
        event: Result<watcher::Event<ResourceQuota>, watcher::Error>,
        sink: &dyn QuotaSink,
        namespace: &str,
        inner: &Inner,
    ) {
        let name = |q: &ResourceQuota| q.metadata.name.clone().unwrap_or_default();
        match event {
            Ok(watcher::Event::Apply(quota)) => match quota_state(&quota) {
                Some(state) => {
                    self.current.insert(name(&quota), state);
                }
                None => {
                    self.current.remove(&name(&quota));
                }
            },
            Ok(watcher::Event::Delete(quota)) => {
                self.current.remove(&name(&quota));
            }
            Ok(watcher::Event::Init) => {
                self.relisting = Some(Default::default());
                return;
            }
            Ok(watcher::Event::InitApply(quota)) => {
                if let (Some(listing), Some(state)) = (self.relisting.as_mut(), quota_state(&quota))
                {
                    listing.insert(name(&quota), state);
                }
                return;
            }
            Ok(watcher::Event::InitDone) => {
                self.current = self.relisting.take().unwrap_or_default();
            }
            Err(err) => {
                inner.metrics.watch_failed(watch_error_code(&err));
                tracing::warn!(%namespace, error = %err, "resourcequota watch failed; retrying with backoff");
                return;
            }
        }
        sink.quotas(namespace, self.current.values().cloned().collect());
    }
}

/// The HTTP status of a failed watch or LIST (410 Gone: the resource version expired and
/// the watcher relists), or none when no answer came back.
fn watch_error_code(err: &watcher::Error) -> Option<u16> {
    match err {
        watcher::Error::WatchError(status) => Some(status.code),
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

/// Longest wait for one page of the periodic LIST: a page not answered in time gives the
/// listing up (the next one follows an interval later). The listing as a whole has no
/// bound: it holds nothing back, and each page either comes or fails within this.
const RESYNC_PAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// Pods per page of the periodic LIST: the service holds one page of full pods at a time,
/// which with the response's text takes tens of KB per pod (about 40 KB measured): a
/// 100th of the executor pods followed, at least [`RESYNC_PAGE_SIZE_MIN`], so that a page
/// stays small beside what the executors' records take, and at most this.
pub const RESYNC_PAGE_SIZE: u32 = 500;

/// The smallest page of the periodic LIST (see [`RESYNC_PAGE_SIZE`]).
pub const RESYNC_PAGE_SIZE_MIN: u32 = 100;

impl Inner {
    /// When the periodic LIST after one that ends now is due, by the pods followed now.
    fn next_resync(&self, subscribers: &Subscribers) -> Timestamp {
        self.clock
            .now()
            .plus(self.resync.wait(followed_executors(subscribers)))
    }
}

/// The executor pods the namespace's applications follow now.
fn followed_executors(subscribers: &Subscribers) -> usize {
    lock(subscribers).values().map(|s| s.sent.len()).sum()
}

/// The page size of the next periodic LIST, by the executor pods followed now.
fn resync_page_size(subscribers: &Subscribers) -> u32 {
    u32::try_from(followed_executors(subscribers) / 100)
        .unwrap_or(u32::MAX)
        .clamp(RESYNC_PAGE_SIZE_MIN, RESYNC_PAGE_SIZE)
}

/// When a namespace's periodic LIST comes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncPace {
    /// The least wait from the end of one LIST to the next.
    pub interval: Duration,
    /// The LIST's share of the API server, in executor pods listed per second on average
    /// (0: the interval alone). Beyond `interval × this` pods followed the wait grows with
    /// them: a LIST costs the API server and etcd in proportion to the pods it returns, and
    /// the watch, not the LIST, keeps the snapshots current (the LIST repairs an event
    /// missed), so at 100 a namespace of 100,000 executors is listed every 1,000 s rather
    /// than having a LIST of it always under way.
    pub pods_per_second: u32,
}

impl ResyncPace {
    /// The wait from the end of one periodic LIST to the next, with `followed` executor
    /// pods followed.
    fn wait(self, followed: usize) -> Duration {
        if self.pods_per_second == 0 {
            return self.interval;
        }
        let followed = u64::try_from(followed).unwrap_or(u64::MAX);
        self.interval.max(Duration::from_millis(
            followed.saturating_mul(1000) / u64::from(self.pods_per_second),
        ))
    }
}

/// Times a paginated LIST starts over after its `continue` token expired (410) before
/// it is given up until the next one.
const RESYNC_LIST_RESTARTS: u32 = 3;

/// One full LIST of the namespace's executor pods, replacing every subscriber's snapshot,
/// then one of its followed driver pods (a driver not listed is gone). It runs beside the
/// watch: what the watch sends meanwhile is newer than the listing (see [`resync_all`]).
/// The periodic LIST of a namespace's executor pods, and of its followed driver pods when
/// `drivers` are watched.
async fn resync(
    api: &Api<Pod>,
    subscribers: &Subscribers,
    namespace: &str,
    metrics: &Metrics,
    drivers: bool,
) {
    let started = std::time::Instant::now();
    let page_size = resync_page_size(subscribers);
    let executors = list_paginated(
        api,
        subscribers,
        Selection::Executors,
        page_size,
        async |_| {},
    )
    .await;
    match executors {
        Ok(executors) => {
            resync_all(subscribers, executors);
            if !drivers {
                metrics.resync_listed(started.elapsed());
                return;
            }
            let selection = Selection::Drivers;
            match list_paginated(api, subscribers, selection, page_size, async |_| {}).await {
                Ok(drivers) => resync_all(subscribers, drivers),
                Err(failure) => failure.log(namespace),
            }
        }
        Err(failure) => {
            stop_tracking(subscribers);
            failure.log(namespace);
        }
    }
    metrics.resync_listed(started.elapsed());
}

/// Why a periodic LIST was given up.
#[derive(Debug)]
enum ListFailure {
    Kubernetes(kube::Error),
    /// A page was not answered within [`RESYNC_PAGE_TIMEOUT`].
    PageNotAnswered,
}

impl ListFailure {
    fn log(&self, namespace: &str) {
        match self {
            Self::Kubernetes(err) => {
                tracing::warn!(%namespace, error = %describe_error(err), "periodic executor pod LIST failed");
            }
            Self::PageNotAnswered => tracing::warn!(
                namespace,
                timeout_s = RESYNC_PAGE_TIMEOUT.as_secs(),
                "a page of the periodic executor pod LIST was not answered in time; given up until the next one"
            ),
        }
    }
}

/// Ends what a periodic listing given up had the watch note ([`Subscriber::touched`]).
fn stop_tracking(subscribers: &Subscribers) {
    for subscriber in lock(subscribers).values_mut() {
        subscriber.touched = None;
    }
}

/// The pods of `selection`, listed `page_size` at a time (`limit`/`continue`), each page
/// taken into a [`Listing`] before the next is asked for. A `continue` token that expired (410
/// Gone: the list's version was compacted) starts the list over, a few times at most.
/// `after_page` is told the number of each page taken in, from 1 for each start (tests
/// act between pages). The watch goes on meanwhile: it notes what it sends to the
/// applications listed (see [`resync_all`]).
async fn list_paginated(
    api: &Api<Pod>,
    subscribers: &Subscribers,
    selection: Selection,
    page_size: u32,
    mut after_page: impl AsyncFnMut(usize),
) -> Result<Listing, ListFailure> {
    let mut restarts = 0;
    'list: loop {
        let mut pages = 0;
        let mut listing = Listing::beside_the_watch(subscribers, selection);
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default()
                .labels(&selection.selector())
                .limit(page_size);
            if let Some(token) = &token {
                lp = lp.continue_token(token);
            }
            let answer = tokio::time::timeout(RESYNC_PAGE_TIMEOUT, api.list(&lp)).await;
            let page = match answer.map_err(|_| ListFailure::PageNotAnswered)? {
                Ok(page) => page,
                Err(kube::Error::Api(status))
                    if status.code == 410 && token.is_some() && restarts < RESYNC_LIST_RESTARTS =>
                {
                    restarts += 1;
                    tracing::info!(
                        restarts,
                        ?selection,
                        "pod LIST: continue token expired (410); listing again"
                    );
                    continue 'list;
                }
                Err(err) => return Err(ListFailure::Kubernetes(err)),
            };
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            for pod in page.items {
                listing.add(subscribers, pod);
            }
            pages += 1;
            after_page(pages).await;
            if token.is_none() {
                return Ok(listing);
            }
        }
    }
}

/// A full listing of one [`Selection`] being taken in, page by page: each subscriber's
/// executor pods (only those changed since it was last sent them kept whole), or the
/// followed driver pods.
struct Listing {
    /// What was listed: only that is replaced by it.
    selection: Selection,
    /// The applications subscribed when the listing began: only they are sent it (one
    /// that subscribed between two pages would get part of a listing; it listed its pods
    /// at Start, and gets the next listing).
    apps: HashSet<String>,
    by_app: HashMap<String, Vec<Listed>>,
    /// The resourceVersion of each executor pod listed, per application.
    versions: HashMap<String, Versions>,
    drivers: HashMap<String, Pod>,
    /// Taken beside the watch's events, not in their order: what the watch sent while it
    /// ran is newer ([`Subscriber::touched`]).
    beside_the_watch: bool,
}

impl Listing {
    /// A listing of `selection` for the applications subscribed now.
    fn new(subscribers: &Subscribers, selection: Selection) -> Self {
        Self {
            selection,
            apps: lock(subscribers).keys().cloned().collect(),
            by_app: HashMap::new(),
            versions: HashMap::new(),
            drivers: HashMap::new(),
            beside_the_watch: false,
        }
    }

    /// A listing taken beside the watch (the periodic LIST): of executor pods, the watch
    /// notes from now on what it sends to the applications listed.
    fn beside_the_watch(subscribers: &Subscribers, selection: Selection) -> Self {
        let listing = Self {
            beside_the_watch: true,
            ..Self::new(subscribers, selection)
        };
        if selection == Selection::Executors {
            for (app, subscriber) in lock(subscribers).iter_mut() {
                if listing.apps.contains(app) {
                    subscriber.touched = Some(HashSet::new());
                }
            }
        }
        listing
    }

    /// Takes in one listed pod; one no subscriber follows is dropped.
    fn add(&mut self, subscribers: &Subscribers, pod: Pod) {
        let subscribers = lock(subscribers);
        if self.selection == Selection::Drivers {
            let Some(name) = pod.metadata.name.as_deref() else {
                return;
            };
            let followed = subscribers
                .values()
                .any(|s| s.driver.as_deref() == Some(name));
            if followed {
                self.drivers.insert(name.to_string(), pod);
            }
            return;
        }
        let Some((app, subscriber)) = app_of(&pod).and_then(|app| subscribers.get_key_value(app))
        else {
            return;
        };
        let (Some(name), Some(version)) = (
            pod.metadata.name.clone(),
            pod.metadata.resource_version.clone(),
        ) else {
            self.by_app
                .entry(app.clone())
                .or_default()
                .push(Listed::Changed(Box::new(pod)));
            return;
        };
        let unchanged = subscriber.sent.get(name.as_str()).map(|v| &**v) == Some(version.as_str());
        let listed = if unchanged {
            Listed::Unchanged(name.clone())
        } else {
            Listed::Changed(Box::new(pod))
        };
        self.by_app.entry(app.clone()).or_default().push(listed);
        self.versions
            .entry(app.clone())
            .or_default()
            .insert(name.into(), version.into());
    }
}

fn app_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(APP_ID_LABEL)
        .map(String::as_str)
}

/// One watch event to the application it concerns: an executor pod's by its application
/// label, a driver pod's to the applications following it by name. A closed receiver
/// means the application is stopping; nothing to do.
fn route(subscribers: &Subscribers, selection: Selection, pod: Pod, deleted: bool) {
    let mut subscribers = lock(subscribers);
    if selection == Selection::Drivers {
        let name = pod.metadata.name.as_deref();
        for subscriber in subscribers.values() {
            if subscriber.driver.is_some() && subscriber.driver.as_deref() == name {
                let event = if deleted {
                    PodEvent::DriverDeleted
                } else {
                    PodEvent::Driver(pod.clone())
                };
                let _ = subscriber.tx.send(event);
            }
        }
        return;
    }
    let Some(subscriber) = app_of(&pod).and_then(|app| subscribers.get_mut(app)) else {
        return;
    };
    if let Some(name) = &pod.metadata.name {
        if let Some(touched) = subscriber.touched.as_mut() {
            touched.insert(name.as_str().into());
        }
        match (&pod.metadata.resource_version, deleted) {
            (Some(version), false) => {
                subscriber
                    .sent
                    .insert(name.as_str().into(), version.as_str().into());
            }
            _ => {
                subscriber.sent.remove(name.as_str());
            }
        }
    }
    let event = if deleted {
        PodEvent::Deleted(pod)
    } else {
        PodEvent::Applied(pod)
    };
    let _ = subscriber.tx.send(event);
}

/// A full listing to every subscriber: its executor pods, or its driver pod (or that it
/// is gone). Of a listing taken beside the watch, a pod the watch sent meanwhile is as
/// the watch last sent it: listed by name only if it still exists, left out if deleted,
/// and added by name if created after its page was read.
fn resync_all(subscribers: &Subscribers, listing: Listing) {
    let Listing {
        selection,
        apps,
        mut by_app,
        mut versions,
        drivers,
        beside_the_watch,
    } = listing;
    for (app, subscriber) in lock(subscribers).iter_mut() {
        if !apps.contains(app) {
            continue;
        }
        if selection == Selection::Executors {
            let mut listed = by_app.remove(app).unwrap_or_default();
            let mut listed_versions = versions.remove(app).unwrap_or_default();
            let touched = beside_the_watch
                .then(|| subscriber.touched.take())
                .flatten();
            if let Some(touched) = touched {
                let sent = &subscriber.sent;
                listed = (listed.into_iter())
                    .filter_map(|pod| match pod.name() {
                        name if !touched.contains(name) => Some(pod),
                        name => sent
                            .contains_key(name)
                            .then(|| Listed::Unchanged(name.to_string())),
                    })
                    .collect();
                for name in touched {
                    match sent.get(&name) {
                        Some(version) => {
                            if listed_versions
                                .insert(name.clone(), version.clone())
                                .is_none()
                            {
                                listed.push(Listed::Unchanged(name.into()));
                            }
                        }
                        None => {
                            listed_versions.remove(&name);
                        }
                    }
                }
            }
            subscriber.sent = listed_versions;
            let _ = subscriber.tx.send(PodEvent::Resync(listed));
        } else if let Some(driver) = &subscriber.driver {
            let event = match drivers.get(driver) {
                Some(pod) => PodEvent::Driver(pod.clone()),
                None => PodEvent::DriverDeleted,
            };
            let _ = subscriber.tx.send(event);
        }
    }
}

/// Locks a mutex, recovering from poisoning (the guarded maps stay consistent: every
/// critical section is a single insert or remove).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::Initialize;
    use crate::time::ManualClock;
    use kube::api::PostParams;
    use spark_pod_allocator_sim::{KubeletMode, SimCluster, SimSettings};

    fn executor(app: &str, id: u32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": format!("{app}-exec-{id}"), "labels": {
                APP_ID_LABEL: app, ROLE_LABEL: EXECUTOR_ROLE, "spark-exec-id": id.to_string()}},
            "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark"}]}
        }))
        .expect("pod manifest")
    }

    async fn cluster_with(pods: &[(&str, u32)]) -> (SimCluster, Api<Pod>) {
        let mut settings = SimSettings::default();
        settings.kubelet.mode = KubeletMode::Manual;
        let sim = SimCluster::start(settings).await.expect("cluster");
        let api: Api<Pod> = Api::namespaced(sim.try_client().expect("client"), "default");
        for (app, id) in pods {
            api.create(&PostParams::default(), &executor(app, *id))
                .await
                .expect("created");
        }
        (sim, api)
    }

    /// Watches of `sim` listing again at least every `interval`, at 100 pods a second.
    fn watches_on(
        sim: &SimCluster,
        clock: Arc<ManualClock>,
        interval: Duration,
        metrics: Metrics,
        init: &Initialize,
    ) -> PodWatches {
        PodWatches::new(
            sim.try_client().expect("client"),
            clock,
            ResyncPace {
                interval,
                pods_per_second: 100,
            },
            metrics,
            init.joiner(),
        )
    }

    fn subscribe(subscribers: &Subscribers, app: &str) -> mpsc::UnboundedReceiver<PodEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let subscriber = Subscriber {
            tx,
            driver: None,
            sent: HashMap::new(),
            touched: None,
        };
        lock(subscribers).insert(app.to_string(), subscriber);
        rx
    }

    /// The names of a resync, changed ones and unchanged ones, sorted.
    fn resynced(event: Option<PodEvent>) -> (Vec<String>, Vec<String>) {
        let Some(PodEvent::Resync(listed)) = event else {
            panic!("a resync expected, got {event:?}");
        };
        let (mut changed, mut unchanged) = (Vec::new(), Vec::new());
        for pod in listed {
            match pod {
                Listed::Changed(pod) => changed.push(pod.metadata.name.unwrap_or_default()),
                Listed::Unchanged(name) => unchanged.push(name),
            }
        }
        changed.sort();
        unchanged.sort();
        (changed, unchanged)
    }

    #[tokio::test]
    async fn a_namespace_watch_holds_readiness_back_until_its_first_listing() {
        let (sim, _api) = cluster_with(&[("a", 1)]).await;
        sim.hold_list_responses();
        let init = Initialize::new();
        let watches = watches_on(
            &sim,
            Arc::new(ManualClock::starting_now()),
            Duration::from_secs(30),
            Metrics::default(),
            &init,
        );
        let _subscription = watches.subscribe_with_driver("default", "a", Some("driver"));
        let ready = init.into_ready();
        // Both selections' first LISTs are held: the namespace cannot have listed.
        tokio::time::timeout(Duration::from_secs(10), async {
            while sim.held_list_responses() < 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("both first LISTs held");
        assert!(!ready.is_ready(), "ready before the watch listed");
        assert!(!watches.is_namespace_synced("default"));
        sim.release_list_responses();
        tokio::time::timeout(Duration::from_secs(10), ready.clone().wait())
            .await
            .expect("ready once the watch listed");
        assert!(watches.is_namespace_synced("default"));
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn the_listing_is_read_page_by_page_and_routed_per_application() {
        let pods: Vec<(&str, u32)> = (1..=7).map(|i| ("a", i)).chain([("b", 1)]).collect();
        let (sim, api) = cluster_with(&pods).await;
        let subscribers: Subscribers = Arc::default();
        let mut a = subscribe(&subscribers, "a");
        let mut b = subscribe(&subscribers, "b");
        let mut pages = 0;
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 3, async |n| {
            pages = n
        })
        .await
        .expect("listed");
        assert_eq!(pages, 3, "8 pods, 3 per page");
        resync_all(&subscribers, listing);
        let (changed, unchanged) = resynced(a.try_recv().ok());
        assert_eq!(changed.len(), 7);
        assert!(unchanged.is_empty());
        assert_eq!(
            resynced(b.try_recv().ok()),
            (vec!["b-exec-1".to_string()], vec![])
        );
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn an_expired_continue_token_starts_the_list_over() {
        let pods: Vec<(&str, u32)> = (1..=5).map(|i| ("a", i)).collect();
        let (sim, api) = cluster_with(&pods).await;
        let subscribers: Subscribers = Arc::default();
        let mut a = subscribe(&subscribers, "a");
        let mut pages = Vec::new();
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 2, async |n| {
            pages.push(n);
            // After the first page, the cluster moves on and the list's version is
            // compacted away: the next page is refused with 410 Gone, the list starts over.
            if pages.len() == 1 {
                api.create(&PostParams::default(), &executor("other", 1))
                    .await
                    .expect("created");
                sim.compact_history();
            }
        })
        .await
        .expect("listed after starting over");
        assert_eq!(
            pages,
            [1, 1, 2, 3],
            "page 1, then 410, then the whole list again: 3 pages (with the new pod)"
        );
        resync_all(&subscribers, listing);
        let (changed, _) = resynced(a.try_recv().ok());
        assert_eq!(
            changed.len(),
            5,
            "every pod once: the first try's page is not kept"
        );
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn a_pod_already_sent_at_its_version_is_listed_by_name_only() {
        let (sim, api) = cluster_with(&[("a", 1), ("a", 2)]).await;
        let subscribers: Subscribers = Arc::default();
        let mut a = subscribe(&subscribers, "a");
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 500, async |_| {})
            .await
            .expect("listed");
        resync_all(&subscribers, listing);
        assert_eq!(resynced(a.try_recv().ok()).0.len(), 2);
        // Nothing changed: the next listing carries names only.
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 500, async |_| {})
            .await
            .expect("listed");
        resync_all(&subscribers, listing);
        let names = vec!["a-exec-1".to_string(), "a-exec-2".to_string()];
        assert_eq!(resynced(a.try_recv().ok()), (vec![], names.clone()));
        // A watch event sends a new version of one: the listing carries it whole only if
        // it changed after that.
        let changed = api
            .patch(
                "a-exec-1",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    serde_json::json!({"metadata": {"annotations": {"x": "1"}}}),
                ),
            )
            .await
            .expect("patched");
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 500, async |_| {})
            .await
            .expect("listed");
        resync_all(&subscribers, listing);
        assert_eq!(
            resynced(a.try_recv().ok()),
            (vec!["a-exec-1".to_string()], vec!["a-exec-2".to_string()])
        );
        route(&subscribers, Selection::Executors, changed, false);
        assert!(matches!(a.try_recv(), Ok(PodEvent::Applied(_))));
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 500, async |_| {})
            .await
            .expect("listed");
        resync_all(&subscribers, listing);
        assert_eq!(resynced(a.try_recv().ok()), (vec![], names));
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn each_listing_replaces_only_what_it_selected() {
        let (sim, api) = cluster_with(&[("a", 1)]).await;
        let driver: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "notebook", "labels": {FOLLOWED_DRIVER_LABEL: FOLLOWED_DRIVER_VALUE}},
            "spec": {"containers": [{"name": "driver", "image": "spark"}]}
        }))
        .expect("pod manifest");
        api.create(&PostParams::default(), &driver)
            .await
            .expect("created");
        let subscribers: Subscribers = Arc::default();
        let mut a = subscribe(&subscribers, "a");
        if let Some(s) = lock(&subscribers).get_mut("a") {
            s.driver = Some("notebook".into());
        }
        let list = async |selection| {
            let listing = list_paginated(&api, &subscribers, selection, 500, async |_| {})
                .await
                .expect("listed");
            resync_all(&subscribers, listing);
        };
        // The executors' listing holds no driver: it says nothing of the driver.
        list(Selection::Executors).await;
        assert_eq!(resynced(a.try_recv().ok()).0, ["a-exec-1"]);
        assert!(a.try_recv().is_err());
        // The drivers' listing: the driver only, and no executor resync.
        list(Selection::Drivers).await;
        assert!(
            matches!(a.try_recv(), Ok(PodEvent::Driver(pod)) if pod.metadata.name.as_deref() == Some("notebook"))
        );
        assert!(a.try_recv().is_err());
        api.delete("notebook", &Default::default())
            .await
            .expect("deleted");
        list(Selection::Drivers).await;
        assert!(matches!(a.try_recv(), Ok(PodEvent::DriverDeleted)));
        assert!(a.try_recv().is_err());
        sim.shutdown().await;
    }

    /// The pod LISTs and WATCHes `sim` answered so far.
    fn pod_requests(sim: &SimCluster, verb: &str) -> u64 {
        (sim.requests().into_iter())
            .filter(|((_, v, resource), _)| v == verb && resource == "pods")
            .map(|(_, n)| n)
            .sum()
    }

    #[tokio::test]
    async fn driver_pods_are_watched_from_the_first_application_that_names_one() {
        let (sim, api) = cluster_with(&[("a", 1)]).await;
        let driver: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "notebook", "labels": {FOLLOWED_DRIVER_LABEL: FOLLOWED_DRIVER_VALUE}},
            "spec": {"containers": [{"name": "driver", "image": "spark"}]}
        }))
        .expect("pod manifest");
        api.create(&PostParams::default(), &driver)
            .await
            .expect("created");
        let init = Initialize::new();
        let clock = Arc::new(ManualClock::starting_now());
        let interval = Duration::from_secs(30);
        let watches = watches_on(&sim, clock.clone(), interval, Metrics::default(), &init);
        let (lists, watches_before) = (pod_requests(&sim, "list"), pod_requests(&sim, "watch"));
        // An application naming no driver pod: the executors' watch alone.
        let mut a = watches.subscribe_with_driver("default", "a", None);
        let first = next_event("a's first listing", &mut a.events, |_| false).await;
        assert_eq!(resynced(Some(first)).0, ["a-exec-1"]);
        assert!(watches.is_namespace_synced("default"));
        // Its periodic LIST lists no driver pod either.
        clock.advance(interval);
        tokio::time::timeout(Duration::from_secs(10), async {
            while pod_requests(&sim, "list") < lists + 2 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the periodic LIST");
        let resync = next_event("a's periodic listing", &mut a.events, |_| false).await;
        assert_eq!(resynced(Some(resync)).1, ["a-exec-1"]);
        assert_eq!(
            pod_requests(&sim, "list"),
            lists + 2,
            "no LIST of driver pods"
        );
        assert_eq!(
            pod_requests(&sim, "watch"),
            watches_before + 1,
            "no driver watch"
        );
        // The first application naming its driver starts the driver watch: its pod's
        // state and its deletion reach the application.
        let mut b = watches.subscribe_with_driver("default", "b", Some("notebook"));
        let listed = next_event("b's driver listed", &mut b.events, |e| {
            matches!(e, PodEvent::Resync(_))
        })
        .await;
        assert!(
            matches!(listed, PodEvent::Driver(pod) if pod.metadata.name.as_deref() == Some("notebook"))
        );
        api.delete("notebook", &Default::default())
            .await
            .expect("deleted");
        let gone = next_event("b's driver deleted", &mut b.events, |e| {
            matches!(e, PodEvent::Resync(_) | PodEvent::Driver(_))
        })
        .await;
        assert!(matches!(gone, PodEvent::DriverDeleted));
        drop((a, b));
        sim.shutdown().await;
    }

    /// The next event of `events` other than what `skip` says to pass over, within 10 s.
    async fn next_event(
        what: &str,
        events: &mut mpsc::UnboundedReceiver<PodEvent>,
        skip: impl Fn(&PodEvent) -> bool,
    ) -> PodEvent {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let event = events.recv().await.expect("subscribed");
                if !skip(&event) {
                    return event;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no event within 10 s: {what}"))
    }

    #[tokio::test]
    async fn the_watch_goes_on_beside_a_periodic_list_and_is_newer_than_it() {
        let (sim, api) = cluster_with(&[("a", 1), ("a", 2)]).await;
        let clock = Arc::new(ManualClock::starting_now());
        let init = Initialize::new();
        let interval = Duration::from_secs(30);
        let watches = watches_on(&sim, clock.clone(), interval, Metrics::default(), &init);
        let mut subscription = watches.subscribe_with_driver("default", "a", None);
        let first = next_event("first listing", &mut subscription.events, |_| false).await;
        let both = vec!["a-exec-1".to_string(), "a-exec-2".to_string()];
        assert_eq!(resynced(Some(first)), (both, vec![]));
        // The periodic LIST is asked for and its answer held: it shows the pods as they
        // were when it was asked.
        sim.hold_list_responses();
        clock.advance(interval);
        tokio::time::timeout(Duration::from_secs(10), async {
            while sim.held_list_responses() < 1 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the periodic LIST asked for");
        // Meanwhile the watch goes on: a deleted pod, a new one and a changed one reach
        // the application before the LIST is answered.
        api.delete(
            "a-exec-1",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await
        .expect("deleted");
        let deleted = next_event("deleted", &mut subscription.events, |e| {
            matches!(e, PodEvent::Applied(_))
        })
        .await;
        assert!(
            matches!(deleted, PodEvent::Deleted(pod) if pod.metadata.name.as_deref() == Some("a-exec-1"))
        );
        api.create(&PostParams::default(), &executor("a", 3))
            .await
            .expect("created");
        let created = next_event("created", &mut subscription.events, |_| false).await;
        assert!(
            matches!(created, PodEvent::Applied(pod) if pod.metadata.name.as_deref() == Some("a-exec-3"))
        );
        api.patch(
            "a-exec-2",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"annotations": {"x": "1"}}})),
        )
        .await
        .expect("patched");
        let changed = next_event("changed", &mut subscription.events, |_| false).await;
        assert!(
            matches!(changed, PodEvent::Applied(pod) if pod.metadata.name.as_deref() == Some("a-exec-2"))
        );
        // The LIST answered: what the watch sent since it began stands. The deleted pod
        // is not brought back, the new one is kept, the changed one is not set back.
        sim.release_list_responses();
        let listing = next_event("listing", &mut subscription.events, |_| false).await;
        assert_eq!(
            resynced(Some(listing)),
            (vec![], vec!["a-exec-2".to_string(), "a-exec-3".to_string()])
        );
        // And the next listing finds everything as sent: names only. It is due an
        // interval after this one ends, with its drivers' LIST.
        let listing = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                clock.advance(interval);
                let next =
                    tokio::time::timeout(Duration::from_millis(100), subscription.events.recv());
                if let Ok(Some(listing @ PodEvent::Resync(_))) = next.await {
                    return listing;
                }
            }
        })
        .await
        .expect("the next periodic listing");
        assert_eq!(
            resynced(Some(listing)),
            (vec![], vec!["a-exec-2".to_string(), "a-exec-3".to_string()])
        );
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn the_wait_between_periodic_lists_grows_with_the_executors_followed() {
        // 250 executors at 100 listed per second: 2.5 s between LISTs, not the interval.
        let pods: Vec<(&str, u32)> = (1..=250).map(|id| ("a", id)).collect();
        let (sim, _api) = cluster_with(&pods).await;
        let clock = Arc::new(ManualClock::starting_now());
        let init = Initialize::new();
        let interval = Duration::from_secs(1);
        let metrics = Metrics::default();
        let watches = watches_on(&sim, clock.clone(), interval, metrics.clone(), &init);
        let mut subscription = watches.subscribe_with_driver("default", "a", None);
        let first = next_event("first listing", &mut subscription.events, |_| false).await;
        assert_eq!(resynced(Some(first)).0.len(), 250);
        // Periodic LISTs ended so far (each observes its duration once it is over: the
        // wait to the next counts from then).
        let lists_ended = || {
            let text = metrics.encode();
            text.lines()
                .find_map(|line| {
                    line.strip_prefix("spark_pod_allocator_resync_duration_seconds_count ")
                })
                .and_then(|count| count.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let listed_after = async |advance: Duration| {
            let before = lists_ended();
            clock.advance(advance);
            let next = tokio::time::timeout(Duration::from_secs(2), async {
                while lists_ended() == before {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
            next.await.is_ok()
        };
        // The first periodic LIST is due an interval after the watch began.
        assert!(listed_after(interval).await, "the first periodic LIST");
        assert!(
            !listed_after(Duration::from_millis(2400)).await,
            "listed again 2.4 s after the last LIST, with 250 executors followed"
        );
        assert!(
            listed_after(Duration::from_millis(100)).await,
            "listed again 2.5 s after the last LIST"
        );
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn an_application_subscribed_during_a_listing_waits_for_the_next() {
        let (sim, api) = cluster_with(&[("a", 1), ("a", 2), ("b", 1)]).await;
        let subscribers: Subscribers = Arc::default();
        let mut a = subscribe(&subscribers, "a");
        let mut b = None;
        let listing = list_paginated(&api, &subscribers, Selection::Executors, 1, async |n| {
            if n == 1 {
                b = Some(subscribe(&subscribers, "b"));
            }
        })
        .await
        .expect("listed");
        resync_all(&subscribers, listing);
        assert_eq!(resynced(a.try_recv().ok()).0.len(), 2);
        let mut b = b.expect("subscribed");
        assert!(b.try_recv().is_err(), "b gets no partial listing");
        sim.shutdown().await;
    }
}
