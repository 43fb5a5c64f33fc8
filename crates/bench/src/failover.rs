//! Failover and forwarding: two replicas of the service binary (`serve`, one shard) on the
//! simulated cluster (a child process) or, with `--cluster real`, on the test control plane
//! (kube-apiserver, kube-scheduler, kube-controller-manager, kwok nodes; the replicas act
//! as its ordinary user, under API Priority and Fairness), one application scaling up
//! through the replica that does not own it. Measured in one run:
//!
//! - forwarding: IsDeleted through the non-owner (forwarded) against the owner directly,
//!   the same number of calls, one at a time;
//! - failover: the owner killed (SIGKILL) mid scale-up; the time from the kill, and from
//!   its Lease's expiry (its last `renewTime` plus `leaseDurationSeconds`), to the other
//!   replica's first create: the first executor above the ids the dead owner had
//!   recorded, which only the new owner hands out. Goal: <= 5 s from the expiry.
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::ListParams;

use super::control_plane::{ClusterArgs, ControlPlane};
use super::harness::{Latencies, ServeProcess, SimProcess, ms, report, wait_for};
use spark_pod_allocator::k8s::IdRecord;
use spark_pod_allocator::k8s::id_record::LAST_EXECUTOR_ID_KEY;
use spark_pod_allocator::proto;

/// What to run.
#[derive(Debug, Clone)]
pub struct FailoverBench {
    /// `ha.lease_duration_ms` (whole seconds), `ha.renew_deadline_ms`, `ha.retry_period_ms`.
    pub lease_ms: u64,
    pub renew_deadline_ms: u64,
    pub retry_ms: u64,
    /// IsDeleted calls through each replica.
    pub calls: u32,
    /// The application's target.
    pub executors: u32,
    /// The test control plane instead of the simulator.
    pub real: Option<ClusterArgs>,
}

/// Where the replicas run: the application, its records and the shard's Lease are in
/// `namespace`; `client` reads them.
struct Cluster {
    namespace: &'static str,
    kubeconfig: std::path::PathBuf,
    client: kube::Client,
    backend: Backend,
}

enum Backend {
    Sim(SimProcess),
    Real(ControlPlane),
}

impl Cluster {
    async fn start(bench: &FailoverBench) -> anyhow::Result<Self> {
        let pods = bench.executors + 100;
        Ok(match &bench.real {
            None => {
                let sim = SimProcess::start(pods).await?;
                Cluster {
                    namespace: "default",
                    kubeconfig: sim.kubeconfig(),
                    client: sim.client.clone(),
                    backend: Backend::Sim(sim),
                }
            }
            Some(args) => {
                let plane = ControlPlane::start(args, pods).await?;
                let namespace = "bench-failover";
                plane.create_namespace(namespace).await?;
                Cluster {
                    namespace,
                    kubeconfig: plane.contender_kubeconfig(),
                    client: plane.client.clone(),
                    backend: Backend::Real(plane),
                }
            }
        })
    }

    async fn stop(self) {
        match self.backend {
            Backend::Sim(sim) => sim.stop().await,
            Backend::Real(plane) => plane.stop().await,
        }
    }
}

const APP: &str = "bench-failover";
const LEASE: &str = "spark-pod-allocator-shard-0";

/// Runs the scenario and prints its figures.
pub async fn run(bench: &FailoverBench) -> anyhow::Result<()> {
    println!(
        "failover: 2 replicas on the {}, lease {} ms, renew deadline {} ms, retry {} ms; {} executors",
        if bench.real.is_some() {
            "test control plane"
        } else {
            "simulator"
        },
        bench.lease_ms,
        bench.renew_deadline_ms,
        bench.retry_ms,
        bench.executors
    );
    let sim = Cluster::start(bench).await?;
    let mut owner = replica(&sim, bench, "replica-a").await?;
    wait_for(
        "replica-a to hold the shard",
        Duration::from_secs(30),
        || async { Ok(holder(&sim).await?.0.as_deref() == Some("replica-a")) },
    )
    .await?;
    let other = replica(&sim, bench, "replica-b").await?;
    let mut via_other = other.client.clone();
    let mut direct = owner.client.clone();
    via_other
        .start(proto::StartRequest {
            application_id: APP.into(),
            namespace: sim.namespace.into(),
            executor_pod_template: TEMPLATE.into(),
            settings: Some(proto::AllocationSettings {
                batch_size: Some(10),
                batch_delay_ms: Some(1000),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .context("Start through the non-owner")?;

    // Forwarding: the same calls through either replica, alternating.
    let (mut forwarded, mut owned) = (Vec::new(), Vec::new());
    for i in 0..bench.calls {
        let request = || proto::IsDeletedRequest {
            application_id: APP.into(),
            executor_id: (1 + i % 50).to_string(),
        };
        let began = Instant::now();
        via_other.is_deleted(request()).await?;
        forwarded.push(began.elapsed());
        let began = Instant::now();
        direct.is_deleted(request()).await?;
        owned.push(began.elapsed());
    }
    let (forwarded, owned) = (Latencies::of(forwarded), Latencies::of(owned));
    println!("  IsDeleted through the owner:     {owned}");
    println!("  IsDeleted through the non-owner: {forwarded}");
    println!(
        "  forwarding costs {:.2}x at p50, {:.2}x at p99 (non-owner / owner, same run)",
        ms(forwarded.p50) / ms(owned.p50).max(f64::MIN_POSITIVE),
        ms(forwarded.p99) / ms(owned.p99).max(f64::MIN_POSITIVE)
    );

    via_other
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: APP.into(),
            executors_per_profile: [(0, bench.executors)].into(),
            ..Default::default()
        })
        .await
        .context("SetTotalExpected through the non-owner")?;
    wait_for("the first batches", Duration::from_secs(60), || async {
        Ok(executor_ids(&sim).await?.len() >= 20)
    })
    .await?;
    owner.child.start_kill().context("SIGKILL")?;
    let killed = Instant::now();
    owner.child.wait().await?;
    // What the dead owner left: the ids it recorded, its last renewal.
    let recorded = recorded_last_id(&sim).await?;
    let (_, renewed) = holder(&sim).await?;
    let expiry_after_kill = renewed
        .map(|renewed| {
            let expiry = renewed + Duration::from_millis(bench.lease_ms);
            expiry
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    let expired_at = killed + expiry_after_kill;
    let mut taken_over = None;
    let first_create = loop {
        if killed.elapsed() > Duration::from_secs(120) {
            bail!("no create by the new owner within 120 s of the kill");
        }
        if taken_over.is_none() && holder(&sim).await?.0.as_deref() == Some("replica-b") {
            taken_over = Some(killed.elapsed());
        }
        if executor_ids(&sim).await?.iter().any(|id| *id > recorded) {
            break killed.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let from_expiry = (killed + first_create).saturating_duration_since(expired_at);
    println!(
        "  kill -> the Lease's expiry {:.0} ms, -> replica-b holds it {:.0} ms, -> its first create {:.0} ms",
        ms(expiry_after_kill),
        taken_over.map_or(f64::NAN, ms),
        ms(first_create)
    );
    report(
        "  the Lease's expiry -> the new owner's first create",
        ms(from_expiry),
        5000.0,
        "ms",
    );
    drop(other);
    sim.stop().await;
    Ok(())
}

const TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n";

/// One replica: [`ServeProcess`] with short Leases and `identity`.
async fn replica(
    sim: &Cluster,
    bench: &FailoverBench,
    identity: &str,
) -> anyhow::Result<ServeProcess> {
    let env = [
        ("SPARK_POD_ALLOCATOR__HA__IDENTITY", identity.to_string()),
        (
            "SPARK_POD_ALLOCATOR__HA__LEASE_NAMESPACE",
            sim.namespace.to_string(),
        ),
        (
            "SPARK_POD_ALLOCATOR__HA__LEASE_DURATION_MS",
            bench.lease_ms.to_string(),
        ),
        (
            "SPARK_POD_ALLOCATOR__HA__RENEW_DEADLINE_MS",
            bench.renew_deadline_ms.to_string(),
        ),
        (
            "SPARK_POD_ALLOCATOR__HA__RETRY_PERIOD_MS",
            bench.retry_ms.to_string(),
        ),
    ];
    ServeProcess::start(&sim.kubeconfig, &env).await
}

/// The shard's holder and its last renewal (wall clock, as the holder wrote it).
async fn holder(sim: &Cluster) -> anyhow::Result<(Option<String>, Option<std::time::SystemTime>)> {
    let leases: Api<Lease> = Api::namespaced(sim.client.clone(), sim.namespace);
    let Some(lease) = leases.get_opt(LEASE).await? else {
        return Ok((None, None));
    };
    let spec = lease.spec.unwrap_or_default();
    let renewed = spec.renew_time.and_then(|t| {
        let nanos = t.0.as_nanosecond();
        let nanos = u64::try_from(nanos).ok()?;
        Some(std::time::UNIX_EPOCH + Duration::from_nanos(nanos))
    });
    Ok((spec.holder_identity, renewed))
}

async fn executor_ids(sim: &Cluster) -> anyhow::Result<Vec<u64>> {
    let pods: Api<Pod> = Api::namespaced(sim.client.clone(), sim.namespace);
    let listed = pods
        .list(
            &ListParams::default().labels(&format!("spark-app-selector={APP},spark-role=executor")),
        )
        .await?;
    Ok(listed
        .items
        .iter()
        .filter_map(|pod| {
            pod.metadata
                .labels
                .as_ref()?
                .get("spark-exec-id")?
                .parse()
                .ok()
        })
        .collect())
}

/// The highest id the application's record holds (its ConfigMap: no driver pod).
async fn recorded_last_id(sim: &Cluster) -> anyhow::Result<u64> {
    let config_maps: Api<ConfigMap> = Api::namespaced(sim.client.clone(), sim.namespace);
    let record = config_maps.get(&IdRecord::config_map_name(APP)).await?;
    let recorded = record
        .data
        .as_ref()
        .and_then(|data| data.get(LAST_EXECUTOR_ID_KEY))
        .context("the id record has no last executor id")?;
    Ok(recorded.parse()?)
}
