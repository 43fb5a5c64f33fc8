//! The service core in process, without the gRPC edge: `Applications` over a cluster's
//! client and a `ManualClock`, the Start fixture of the allocation scenarios, and the waits
//! that follow the actor's rounds and snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::Api;
use serde_json::json;
use spark_pod_allocator::allocator::{
    AllocationPolicy, AllocationSettings, ExecutorId, ExecutorPod, ResourceProfileId,
};
use spark_pod_allocator::app::registration::Registration;
use spark_pod_allocator::app::{AppId, Applications, ManualClock, StartApplication, Started};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::k8s::RegistrationStore;
use spark_pod_allocator::k8s::registrations::{PROOF_KEY, REGISTRATION_KEY};
use spark_pod_allocator::runtime::Builder;

use crate::grpc::TEMPLATE;
use crate::wait::until;

/// The default resource profile.
pub const P0: ResourceProfileId = ResourceProfileId(0);

/// The batch delay of [`start_application`].
pub const BATCH_DELAY: Duration = Duration::from_secs(1);

/// The registry of a service whose client is `client` and whose time is `clock`, without
/// its gRPC server (so no one waits for its readiness).
pub fn applications(client: kube::Client, clock: &ManualClock, settings: Settings) -> Applications {
    Builder::new(client, Arc::new(clock.clone()))
        .with_settings(&settings)
        .build()
        .into_applications()
}

/// The ConfigMap holding the registration of `app` (of `app_namespace`), in the
/// service's namespace `service_namespace` (`default` unless the test's configuration says
/// otherwise), if there is one.
pub async fn registration_config_map(
    client: &kube::Client,
    service_namespace: &str,
    app_namespace: &str,
    app: &str,
) -> Option<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), service_namespace);
    api.get_opt(&RegistrationStore::config_map_name(app_namespace, app))
        .await
        .expect("get the registration's ConfigMap")
}

/// The registration [`registration_config_map`] holds, decoded (its proof unchecked), once
/// its proof is written: as a restarted service would find it.
pub async fn stored_registration(
    client: &kube::Client,
    service_namespace: &str,
    app_namespace: &str,
    app: &str,
) -> Option<Registration> {
    let config_map = registration_config_map(client, service_namespace, app_namespace, app).await?;
    let mut data = config_map.data?;
    data.get(PROOF_KEY)?;
    let json = data.remove(REGISTRATION_KEY)?;
    Some(serde_json::from_str(&json).expect("registration JSON"))
}

/// An application id the tests know is valid.
pub fn id(app: &str) -> AppId {
    AppId::parse(app).expect("application id")
}

/// Targets for the default profile only.
pub fn targets(n: u32) -> BTreeMap<ResourceProfileId, u32> {
    BTreeMap::from([(P0, n)])
}

/// The ids `from..=to`.
pub fn range(from: u64, to: u64) -> BTreeSet<u64> {
    (from..=to).collect()
}

/// The standard executor template ([`TEMPLATE`]) as a Pod.
pub fn template_pod() -> Pod {
    serde_yaml::from_str(TEMPLATE).expect("the standard template is a Pod")
}

/// The standard template with a label of the user's (`team: data`), to see that the pods
/// keep the template's labels.
pub fn labelled_template() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"labels": {"team": "data"}},
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}]}
    }))
    .expect("template")
}

/// The Start of the allocation scenarios: [`labelled_template`] for the default profile,
/// batches of 10 every [`BATCH_DELAY`] (Spark's pacing, asked for: the default policy is
/// ADAPTIVE), executors pending for 10 s time out.
pub fn start_application(app: &str, namespace: &str) -> StartApplication {
    StartApplication {
        app_id: id(app),
        namespace: namespace.to_string(),
        driver_pod_name: None,
        templates: BTreeMap::from([(P0, labelled_template())]),
        pod_name_prefix: None,
        settings: AllocationSettings {
            batch_size: 10,
            batch_delay: BATCH_DELAY,
            executor_timeout: Duration::from_secs(10),
            policy: AllocationPolicy::Spark,
            ..AllocationSettings::default()
        },
        owner: None,
        claims: Vec::new(),
    }
}

/// Starts an application and waits for its start round (due at once, no targets yet), so
/// later round counts are the test's own.
pub async fn start(apps: &Applications, req: StartApplication) -> Started {
    let app = req.app_id.clone();
    let started = apps.start(req).await.expect("start");
    until("start round", async || {
        apps.rounds(&app).await.expect("rounds") >= 1
    })
    .await;
    started
}

/// The ids in the application's snapshot, as its actor has ingested them.
pub async fn snapshot_ids(apps: &Applications, app: &str) -> BTreeSet<u64> {
    apps.snapshot(&id(app))
        .await
        .expect("snapshot")
        .executors
        .keys()
        .map(|e| e.0)
        .collect()
}

/// Waits until the actor's snapshot holds exactly `ids`.
pub async fn wait_seen(apps: &Applications, app: &str, ids: BTreeSet<u64>) {
    until(&format!("{app} sees {ids:?}"), async || {
        snapshot_ids(apps, app).await == ids
    })
    .await;
}

/// Waits until the actor's snapshot shows executor `exec` of `app` as `wanted` says.
pub async fn wait_executor(
    apps: &Applications,
    app: &str,
    exec: u64,
    wanted: impl Fn(&ExecutorPod) -> bool,
) {
    until(&format!("{app} executor {exec} state"), async || {
        let snapshot = apps.snapshot(&id(app)).await.expect("snapshot");
        snapshot
            .executors
            .get(&ExecutorId(exec))
            .is_some_and(&wanted)
    })
    .await;
}

/// Advances the clock by `by` and waits until the application has run one more round.
pub async fn advance_round(apps: &Applications, clock: &ManualClock, app: &str, by: Duration) {
    let before = apps.rounds(&id(app)).await.expect("rounds");
    clock.advance(by);
    until(&format!("a round of {app}"), async || {
        apps.rounds(&id(app)).await.expect("rounds") > before
    })
    .await;
}

/// Sets targets and waits for the round it triggers (nothing outstanding → notify now).
pub async fn set_targets_and_round(
    apps: &Applications,
    app: &str,
    targets: BTreeMap<ResourceProfileId, u32>,
) {
    let before = apps.rounds(&id(app)).await.expect("rounds");
    apps.set_total_expected(&id(app), targets)
        .await
        .expect("set targets");
    until(
        &format!("the round after SetTotalExpected of {app}"),
        async || apps.rounds(&id(app)).await.expect("rounds") > before,
    )
    .await;
}
