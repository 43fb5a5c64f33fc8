//! `demo`: the simulated cluster and the service in one process, and a scripted Spark driver
//! talking to the service over real gRPC, as a JVM or Python driver would. It shows what
//! the service does (batches, failed pods replaced, downscale, Stop) with no cluster at all.
//!
//! The scripted driver behaves like Spark's: it registers executors as their pods start
//! (asking IsDeleted first and refusing deleted ones), reports the registered set with
//! UpdateRegisteredExecutors, and on a downscale kills its surplus idle executors itself by
//! deleting their pods — the allocator never deletes a running executor.
use std::collections::{BTreeMap, BTreeSet};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher;
use tokio::net::TcpListener;
use tonic::transport::{Channel, Endpoint};

use spark_pod_allocator::allocator::types::{
    APP_ID_LABEL, EXECUTOR_ID_LABEL, EXECUTOR_ROLE, ROLE_LABEL,
};
use spark_pod_allocator::allocator::{ExecutorState, StateRules, executor_pod_from};
use spark_pod_allocator::app::SystemClock;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::{self, wait_until_serving};
use spark_pod_allocator_sim::{SimCluster, SimSettings};

/// The application the demo driver runs.
pub const DEMO_APP_ID: &str = "spark-demo-0001";
/// The namespace it runs in (exists in every simulated cluster).
pub const DEMO_NAMESPACE: &str = "default";

/// Profile 0: small executors.
const SMALL_EXECUTOR: &str = r#"apiVersion: v1
kind: Pod
metadata:
  labels:
    team: demo
spec:
  containers:
  - name: spark-kubernetes-executor
    image: apache/spark:4.0.0
    resources:
      requests: {cpu: "1", memory: 2Gi}
"#;

/// Profile 1: large executors, as JSON (the API takes both).
const LARGE_EXECUTOR: &str = r#"{"apiVersion": "v1", "kind": "Pod",
 "metadata": {"labels": {"team": "demo", "size": "large"}},
 "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "apache/spark:4.0.0",
   "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}]}}"#;

/// The scripted scale steps: targets of profile 0 and profile 1.
pub const DEMO_STEPS: [[u32; 2]; 3] = [[150, 50], [30, 20], [0, 0]];

/// How the scripted driver paces itself.
#[derive(Debug, Clone)]
pub struct DriverSettings {
    /// The allocator's batch delay for the demo application.
    pub batch_delay_ms: u64,
    /// Executors requested per profile per round.
    pub batch_size: u32,
    /// How often the driver looks at its executors and redraws the table.
    pub tick: Duration,
    /// A step that has not reached its targets after this long fails the demo.
    pub step_timeout: Duration,
}

impl Default for DriverSettings {
    fn default() -> Self {
        Self {
            batch_delay_ms: 200,
            batch_size: 20,
            tick: Duration::from_millis(100),
            step_timeout: Duration::from_secs(60),
        }
    }
}

/// What the demo did, for the closing summary.
#[derive(Debug, Clone, Default)]
pub struct DemoSummary {
    /// Per step: the targets and how long the application took to reach them.
    pub steps: Vec<(Vec<u32>, Duration)>,
    /// Executor pods that appeared in the cluster.
    pub pods_seen: usize,
    /// Of those, pods whose executor failed (the allocator replaced them).
    pub pods_failed: usize,
    /// Pods that were deleted while the driver watched (by the allocator or by the driver).
    pub pods_deleted: usize,
    /// Pods the driver itself killed on downscale.
    pub pods_killed_by_driver: usize,
    /// Executors the driver refused because IsDeleted said so.
    pub refused_registrations: usize,
    /// The highest executor id the allocator used.
    pub last_executor_id: i64,
    /// Pods the final Stop deleted.
    pub deleted_by_stop: u32,
}

/// Runs the whole demo on loopback ports and prints the table and summary to stdout.
pub async fn run() -> anyhow::Result<DemoSummary> {
    let began = Instant::now();
    let mut sim_settings = SimSettings::default();
    sim_settings.kubelet.fail_fraction = 0.05;
    sim_settings.kubelet.start_delay_min_ms = 100;
    sim_settings.kubelet.start_delay_max_ms = 800;
    let cluster = SimCluster::start(sim_settings)
        .await
        .context("starting the simulated cluster")?;
    let client =
        crate::k8s::client(cluster.kube_config()).context("a client for the simulated cluster")?;
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("binding a loopback port for the service")?;
    let service = runtime::Builder::new(client.clone(), Arc::new(SystemClock))
        .start(ServeSettings::default(), listener)?;
    let address = service.address();

    let mut screen = Screen::stdout();
    screen.note(&format!(
        "simulated cluster at {} (5% of executors fail at start)\nservice at {address}",
        cluster.base_url()
    ))?;
    let channel = Endpoint::from_shared(format!("http://{address}"))?
        .connect()
        .await
        .context("connecting to the service")?;
    wait_until_serving(channel.clone()).await?;
    let driver = ScriptedDriver::new(
        ExecutorAllocatorClient::new(channel),
        client,
        DriverSettings::default(),
    );
    let result = driver.run(&mut screen).await;

    service.shutdown().await.context("the gRPC server failed")?;
    cluster.shutdown().await;
    let summary = result?;
    screen.summary(&summary, began.elapsed())?;
    Ok(summary)
}

/// One executor pod as the driver has seen it.
#[derive(Debug, Clone)]
struct SeenPod {
    profile: i32,
    uid: String,
    failed: bool,
    gone: bool,
}

/// One row of the live table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Row {
    profile: i32,
    target: u32,
    running: u32,
    pending: u32,
    newly_created: u32,
    failed: u32,
    deleted: u32,
}

/// The scripted Spark driver.
pub struct ScriptedDriver {
    client: ExecutorAllocatorClient<Channel>,
    pods: Api<Pod>,
    settings: DriverSettings,
    rules: StateRules,
    /// Every executor pod event of the application, from a watch of the API server.
    events: BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>,
    /// Executor pods that exist now, and their state.
    current: BTreeMap<u64, ExecutorState>,
    /// Ids listed so far during a (re)list of the watch.
    relisted: Option<BTreeSet<u64>>,
    registered: BTreeSet<u64>,
    seen: BTreeMap<u64, SeenPod>,
    killed: BTreeSet<u64>,
    refused: BTreeSet<u64>,
}

impl ScriptedDriver {
    /// A driver calling the service through `client`, seeing its pods through `kube`.
    pub fn new(
        client: ExecutorAllocatorClient<Channel>,
        kube: kube::Client,
        settings: DriverSettings,
    ) -> Self {
        let pods: Api<Pod> = Api::namespaced(kube, DEMO_NAMESPACE);
        let selector = format!("{APP_ID_LABEL}={DEMO_APP_ID},{ROLE_LABEL}={EXECUTOR_ROLE}");
        let events = watcher(pods.clone(), watcher::Config::default().labels(&selector)).boxed();
        Self {
            client,
            pods,
            events,
            current: BTreeMap::new(),
            relisted: None,
            settings,
            rules: StateRules::default(),
            registered: BTreeSet::new(),
            seen: BTreeMap::new(),
            killed: BTreeSet::new(),
            refused: BTreeSet::new(),
        }
    }

    /// Start, scale through [`DEMO_STEPS`], Stop; the table goes to `out`.
    pub async fn run(mut self, out: &mut Screen) -> anyhow::Result<DemoSummary> {
        let started = self
            .client
            .start(proto::StartRequest {
                application_id: DEMO_APP_ID.into(),
                namespace: DEMO_NAMESPACE.into(),
                executor_pod_template: SMALL_EXECUTOR.into(),
                resource_profile_templates: [(1, LARGE_EXECUTOR.to_string())].into(),
                settings: Some(proto::AllocationSettings {
                    batch_size: Some(self.settings.batch_size),
                    batch_delay_ms: Some(self.settings.batch_delay_ms),
                    executor_timeout_ms: Some(self.settings.batch_delay_ms * 50),
                    executor_idle_timeout_ms: Some(self.settings.batch_delay_ms * 5),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .context("Start")?
            .into_inner();
        out.note(&format!(
            "started application {DEMO_APP_ID} in namespace {DEMO_NAMESPACE} (resumed: {})\n  \
             profiles 0 (1 cpu) and 1 (4 cpu), batches of {} every {} ms",
            started.resumed, self.settings.batch_size, self.settings.batch_delay_ms
        ))?;

        let mut summary = DemoSummary::default();
        for (n, targets) in DEMO_STEPS.iter().enumerate() {
            let title = format!(
                "step {}/{}: {} executors (profile 0: {}, profile 1: {})",
                n + 1,
                DEMO_STEPS.len(),
                targets.iter().sum::<u32>(),
                targets[0],
                targets[1]
            );
            out.heading(&title)?;
            let took = self.scale_to(targets, &title, out).await?;
            out.note(&format!("reached in {:.1} s", took.as_secs_f64()))?;
            summary.steps.push((targets.to_vec(), took));
        }

        let status = self.status().await?;
        let stopped = self
            .client
            .stop(proto::StopRequest {
                application_id: DEMO_APP_ID.into(),
            })
            .await
            .context("Stop")?
            .into_inner();
        summary.pods_seen = self.seen.len();
        summary.pods_failed = self.seen.values().filter(|p| p.failed).count();
        summary.pods_deleted = self.seen.values().filter(|p| p.gone).count();
        summary.pods_killed_by_driver = self.killed.len();
        summary.refused_registrations = self.refused.len();
        summary.last_executor_id = status.last_executor_id;
        summary.deleted_by_stop = stopped.deleted_pods;
        Ok(summary)
    }

    /// Sets the targets, then plays driver until every profile runs exactly its target.
    async fn scale_to(
        &mut self,
        targets: &[u32; 2],
        title: &str,
        out: &mut Screen,
    ) -> anyhow::Result<Duration> {
        let wanted: BTreeMap<i32, u32> = [(0, targets[0]), (1, targets[1])].into();
        let begin = Instant::now();
        self.client
            .set_total_expected(proto::SetTotalExpectedRequest {
                application_id: DEMO_APP_ID.into(),
                executors_per_profile: wanted.iter().map(|(k, v)| (*k, *v)).collect(),
                ..Default::default()
            })
            .await
            .context("SetTotalExpected")?;
        let mut tick = tokio::time::interval(self.settings.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                event = self.events.next() => {
                    match event {
                        Some(Ok(event)) => self.observe(event)?,
                        // The watcher retries by itself; a failed attempt is only news.
                        Some(Err(err)) => tracing::warn!(%err, "executor pod watch"),
                        None => bail!("the executor pod watch ended"),
                    }
                    continue;
                }
                _ = tick.tick() => {}
            }
            self.register().await?;
            self.kill_surplus(&wanted).await?;
            let status = self.status().await?;
            let rows = self.rows(&wanted, &status);
            let elapsed = begin.elapsed();
            out.table(title, elapsed, &rows)?;
            let reached = rows
                .iter()
                .all(|r| r.running == r.target && r.pending == 0 && r.newly_created == 0)
                && self.running_pods(&wanted) == wanted;
            if reached {
                return Ok(elapsed);
            }
            if elapsed > self.settings.step_timeout {
                bail!(
                    "targets {targets:?} not reached within {:?}: {rows:?}",
                    self.settings.step_timeout
                );
            }
        }
    }

    async fn status(&mut self) -> anyhow::Result<proto::ApplicationStatus> {
        Ok(self
            .client
            .get_status(proto::GetStatusRequest {
                application_id: DEMO_APP_ID.into(),
            })
            .await
            .context("GetStatus")?
            .into_inner())
    }

    /// Applies one watch event to what the driver knows: new, failed and vanished pods.
    fn observe(&mut self, event: watcher::Event<Pod>) -> anyhow::Result<()> {
        match event {
            watcher::Event::Apply(pod) => {
                self.observe_pod(&pod)?;
            }
            watcher::Event::Delete(pod) => {
                if let Some(id) = self.observe_pod(&pod)? {
                    self.current.remove(&id);
                    if let Some(seen) = self.seen.get_mut(&id) {
                        seen.gone = true;
                    }
                }
            }
            watcher::Event::Init => self.relisted = Some(BTreeSet::new()),
            watcher::Event::InitApply(pod) => {
                if let Some(id) = self.observe_pod(&pod)? {
                    self.relisted.get_or_insert_default().insert(id);
                }
            }
            watcher::Event::InitDone => {
                // After a relist, pods missing from it are gone.
                let listed = self.relisted.take().unwrap_or_default();
                let vanished: Vec<u64> = self
                    .current
                    .keys()
                    .filter(|id| !listed.contains(id))
                    .copied()
                    .collect();
                for id in vanished {
                    self.current.remove(&id);
                    if let Some(seen) = self.seen.get_mut(&id) {
                        seen.gone = true;
                    }
                }
            }
        }
        Ok(())
    }

    fn observe_pod(&mut self, pod: &Pod) -> anyhow::Result<Option<u64>> {
        let Some(executor) = executor_pod_from(pod, &self.rules) else {
            return Ok(None);
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let id = executor.id.0;
        let failed = matches!(executor.state, ExecutorState::Failed { .. });
        match self.seen.get_mut(&id) {
            Some(seen) if seen.uid != uid => {
                bail!(
                    "executor id {id} was used for two pods ({} and {uid})",
                    seen.uid
                )
            }
            Some(seen) => seen.failed |= failed,
            None => {
                self.seen.insert(
                    id,
                    SeenPod {
                        profile: executor.profile.0,
                        uid,
                        failed,
                        gone: false,
                    },
                );
            }
        }
        self.current.insert(id, executor.state);
        Ok(Some(id))
    }

    /// Registers executors whose pods run (unless IsDeleted refuses them) and drops those
    /// whose pods stopped running, then reports the set.
    async fn register(&mut self) -> anyhow::Result<()> {
        let pods = &self.current;
        let mut registered: BTreeSet<u64> = self
            .registered
            .iter()
            .copied()
            .filter(|id| pods.get(id) == Some(&ExecutorState::Running))
            .collect();
        let fresh: Vec<u64> = pods
            .iter()
            .filter(|(id, state)| {
                **state == ExecutorState::Running
                    && !registered.contains(id)
                    && !self.refused.contains(id)
                    && !self.killed.contains(id)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in fresh {
            let deleted = self
                .client
                .is_deleted(proto::IsDeletedRequest {
                    application_id: DEMO_APP_ID.into(),
                    executor_id: id.to_string(),
                })
                .await
                .context("IsDeleted")?
                .into_inner()
                .deleted;
            if deleted {
                self.refused.insert(id);
            } else {
                registered.insert(id);
            }
        }
        if registered != self.registered {
            self.registered = registered;
            self.send_registered().await?;
        }
        Ok(())
    }

    async fn send_registered(&mut self) -> anyhow::Result<()> {
        self.client
            .update_registered_executors(proto::UpdateRegisteredExecutorsRequest {
                application_id: DEMO_APP_ID.into(),
                executor_ids: self.registered.iter().map(u64::to_string).collect(),
                running_tasks: Default::default(),
            })
            .await
            .context("UpdateRegisteredExecutors")?;
        Ok(())
    }

    /// Spark's driver kills idle executors beyond its target itself (newest first).
    async fn kill_surplus(&mut self, wanted: &BTreeMap<i32, u32>) -> anyhow::Result<()> {
        let mut victims = Vec::new();
        for (&profile, &target) in wanted {
            let mine: Vec<u64> = self
                .registered
                .iter()
                .copied()
                .filter(|id| self.seen.get(id).is_some_and(|p| p.profile == profile))
                .collect();
            let surplus = mine.len().saturating_sub(target as usize);
            victims.extend(mine.iter().rev().take(surplus).copied());
        }
        if victims.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = victims.iter().map(u64::to_string).collect();
        let selector = format!(
            "{APP_ID_LABEL}={DEMO_APP_ID},{ROLE_LABEL}={EXECUTOR_ROLE},{EXECUTOR_ID_LABEL} in ({})",
            ids.join(",")
        );
        self.pods
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&selector),
            )
            .await
            .context("killing surplus executors")?;
        for id in victims {
            self.registered.remove(&id);
            self.killed.insert(id);
        }
        self.send_registered().await
    }

    /// Running, not-killed executors per profile, as the driver sees them.
    fn running_pods(&self, wanted: &BTreeMap<i32, u32>) -> BTreeMap<i32, u32> {
        let mut counts: BTreeMap<i32, u32> = wanted.keys().map(|p| (*p, 0)).collect();
        for (id, state) in &self.current {
            let profile = self.seen.get(id).map(|p| p.profile);
            if let (ExecutorState::Running, Some(profile)) = (state, profile)
                && !self.killed.contains(id)
            {
                *counts.entry(profile).or_default() += 1;
            }
        }
        counts
    }

    fn rows(&self, wanted: &BTreeMap<i32, u32>, status: &proto::ApplicationStatus) -> Vec<Row> {
        wanted
            .iter()
            .map(|(&profile, &target)| {
                let counts = status
                    .profiles
                    .iter()
                    .find(|p| p.resource_profile_id == profile);
                let of_profile = || self.seen.values().filter(move |p| p.profile == profile);
                Row {
                    profile,
                    target: counts.map_or(target, |c| c.target),
                    running: counts.map_or(0, |c| c.running),
                    pending: counts.map_or(0, |c| c.pending),
                    newly_created: counts.map_or(0, |c| c.newly_created),
                    failed: count(of_profile().filter(|p| p.failed)),
                    deleted: count(of_profile().filter(|p| p.gone)),
                }
            })
            .collect()
    }
}

fn count<T>(items: impl Iterator<Item = T>) -> u32 {
    u32::try_from(items.count()).unwrap_or(u32::MAX)
}

/// Where the demo writes: a table redrawn in place on a terminal, plain lines (only when
/// something changed) otherwise.
pub struct Screen {
    out: Box<dyn Write + Send>,
    ansi: bool,
    drawn_lines: usize,
    last_rows: Vec<Row>,
}

impl Screen {
    /// Standard output, with ANSI redraws when it is a terminal.
    pub fn stdout() -> Self {
        let ansi = std::io::stdout().is_terminal();
        Self::new(Box::new(std::io::stdout()), ansi)
    }

    /// Any writer; `ansi` chooses in-place redraws.
    pub fn new(out: Box<dyn Write + Send>, ansi: bool) -> Self {
        Self {
            out,
            ansi,
            drawn_lines: 0,
            last_rows: Vec::new(),
        }
    }

    /// A line that stays (the table is redrawn below it).
    pub fn note(&mut self, line: &str) -> std::io::Result<()> {
        self.drawn_lines = 0;
        self.last_rows.clear();
        writeln!(self.out, "{line}")?;
        self.out.flush()
    }

    /// A heading for what follows; on a terminal the table's own title says it.
    fn heading(&mut self, line: &str) -> std::io::Result<()> {
        if self.ansi {
            self.drawn_lines = 0;
            self.last_rows.clear();
            Ok(())
        } else {
            self.note(line)
        }
    }

    fn table(&mut self, title: &str, elapsed: Duration, rows: &[Row]) -> std::io::Result<()> {
        if !self.ansi {
            if rows != self.last_rows.as_slice() {
                let cells: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        format!(
                            "p{} target {} running {} pending {} new {} failed {} deleted {}",
                            r.profile,
                            r.target,
                            r.running,
                            r.pending,
                            r.newly_created,
                            r.failed,
                            r.deleted
                        )
                    })
                    .collect();
                writeln!(
                    self.out,
                    "  {:>5.1}s  {}",
                    elapsed.as_secs_f64(),
                    cells.join(" | ")
                )?;
                self.last_rows = rows.to_vec();
            }
            return self.out.flush();
        }
        if self.drawn_lines > 0 {
            write!(self.out, "\x1b[{}A", self.drawn_lines)?;
        }
        let mut lines = vec![
            format!("\x1b[1m{title}\x1b[0m  {:.1} s", elapsed.as_secs_f64()),
            format!(
                "  {:>7} {:>7} {:>8} {:>8} {:>12} {:>7} {:>8}",
                "profile", "target", "running", "pending", "newly-created", "failed", "deleted"
            ),
        ];
        for r in rows {
            lines.push(format!(
                "  {:>7} {:>7} {:>8} {:>8} {:>12} {:>7} {:>8}",
                r.profile, r.target, r.running, r.pending, r.newly_created, r.failed, r.deleted
            ));
        }
        for line in &lines {
            writeln!(self.out, "\x1b[2K{line}")?;
        }
        self.drawn_lines = lines.len();
        self.last_rows = rows.to_vec();
        self.out.flush()
    }

    /// The closing summary.
    pub fn summary(&mut self, s: &DemoSummary, total: Duration) -> std::io::Result<()> {
        self.note("")?;
        writeln!(self.out, "summary ({:.1} s in all)", total.as_secs_f64())?;
        for (targets, took) in &s.steps {
            writeln!(
                self.out,
                "  reached {:>3} executors (profile 0: {:>3}, profile 1: {:>3}) in {:>5.1} s",
                targets.iter().sum::<u32>(),
                targets.first().copied().unwrap_or(0),
                targets.get(1).copied().unwrap_or(0),
                took.as_secs_f64()
            )?;
        }
        writeln!(
            self.out,
            "  executor pods created: {} ({} failed at start and were replaced)",
            s.pods_seen, s.pods_failed
        )?;
        writeln!(
            self.out,
            "  executor pods deleted: {} (driver on downscale {}, allocator {}, Stop {})",
            s.pods_deleted + s.deleted_by_stop as usize,
            s.pods_killed_by_driver,
            s.pods_deleted.saturating_sub(s.pods_killed_by_driver),
            s.deleted_by_stop
        )?;
        writeln!(
            self.out,
            "  executor ids used: 1..={} (each once); registrations refused by IsDeleted: {}",
            s.last_executor_id, s.refused_registrations
        )?;
        self.out.flush()
    }
}
