//! The service core end to end: `Applications` (actors, shared watches, pod client) over
//! real HTTP against the simulated cluster. A `ManualClock` drives the rounds, so a round
//! happens only when a test advances time (or SetTotalExpected notifies); tests wait for
//! observable conditions with a bounded deadline, never sleep-then-assert.
//!
//! One module per topic; this file holds the harness and the kubelet/scheduler the tests play.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::json;
use spark_pod_allocator::allocator::{
    AllocationPolicy, ExecutorId, ExecutorState, ResourceProfileId,
};
use spark_pod_allocator::app::{AppError, Applications, Clock, ManualClock};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::naming::stable_hash;
use spark_pod_allocator::runtime::Builder;
use spark_pod_allocator_sim::{FaultSettings, SimCluster};
use test_kit::service::{
    BATCH_DELAY, P0, id, labelled_template as template, range, snapshot_ids, start,
    start_application as request, targets, wait_seen,
};
use test_kit::sim::cluster_ids;
use test_kit::wait::until;

const NS: &str = "default";

struct Harness {
    sim: SimCluster,
    clock: ManualClock,
    apps: Applications,
}

/// A simulated cluster whose kubelet does nothing unless the test plays it.
async fn manual_cluster() -> SimCluster {
    let mut settings = test_kit::sim::manual_settings();
    settings.namespaces = vec![NS.to_string(), "other".to_string()];
    test_kit::sim::start(settings).await
}

fn applications(sim: &SimCluster, clock: &ManualClock, config: Settings) -> Applications {
    test_kit::service::applications(sim.try_client().expect("sim client"), clock, config)
}

/// The periodic LIST of the harness's service: the scenarios count on one every 30 s of
/// the clock (the default is a rarer safety net).
const RESYNC: Duration = Duration::from_secs(30);

async fn harness() -> Harness {
    let sim = manual_cluster().await;
    let clock = ManualClock::starting_now();
    let mut config = Settings::default();
    config.resync_interval_ms = u64::try_from(RESYNC.as_millis()).expect("resync in ms");
    let apps = applications(&sim, &clock, config);
    Harness { sim, clock, apps }
}

/// Advances the clock by `by` and waits until the application has run one more round.
async fn advance_round(h: &Harness, app: &str, by: Duration) {
    test_kit::service::advance_round(&h.apps, &h.clock, app, by).await
}

/// Sets targets and waits for the round it triggers.
async fn set_targets_and_round(h: &Harness, app: &str, n: u32) {
    test_kit::service::set_targets_and_round(&h.apps, app, targets(n)).await
}

/// Plays the kubelet: the pod of executor `exec` runs (phase Running, container running).
async fn set_running(sim: &SimCluster, app: &str, exec: u64) {
    patch_status(
        sim,
        app,
        exec,
        json!({"status": test_kit::sim::running_status()}),
    )
    .await;
}

/// Plays the kubelet: the pod of executor `exec` failed with exit code 1.
async fn set_failed(sim: &SimCluster, app: &str, exec: u64) {
    patch_status(
        sim,
        app,
        exec,
        json!({"status": {"phase": "Failed", "containerStatuses": [{
            "name": "spark-kubernetes-executor", "ready": false, "restartCount": 0,
            "image": "spark:4", "imageID": "",
            "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}}),
    )
    .await;
}

async fn patch_status(sim: &SimCluster, app: &str, exec: u64, patch: serde_json::Value) {
    let client = sim.try_client().expect("sim client");
    let name = format!("{app}-exec-{exec}");
    test_kit::sim::set_pod_status(&client, NS, &name, patch["status"].clone()).await;
}

/// Plays the scheduler: binds the pod so that its deletion becomes graceful.
async fn bind(sim: &SimCluster, app: &str, exec: u64) {
    let client = sim.try_client().expect("sim client");
    test_kit::sim::bind(&client, NS, &format!("{app}-exec-{exec}"))
        .await
        .expect("binding");
}

mod applications;
mod executor_ids;
mod kubernetes;
mod scaling;
