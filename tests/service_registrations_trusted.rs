//! Only the registrations the service wrote are resumed, over real gRPC and real HTTP
//! against the simulator. The service keeps them in its own namespace (`spark-system`
//! here) and signs them. A ConfigMap planted in a tenant namespace, an edited owner, and a
//! registration moved to another namespace's name and labels are not resumed. Each one
//! seen is counted by reason, and none makes a pod. Nor does a registration copied before
//! its application's Stop and written back afterwards (as a backup restore would: same
//! name, labels and data), nor an earlier version's unproven record written back after
//! this version's first start, while one that version left behind is resumed and proven.
//! A properly written registration beside them still resumes, and the signing key is one
//! Secret even when replicas race to create it.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use spark_pod_allocator::app::{AppError, Applications};
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::grpc::ServeSettings;
use spark_pod_allocator::k8s::registrations::{
    APPLICATION_NAMESPACE_LABEL, KEY_DATA_KEY, KEY_LEN, PROOF_KEY, PROOF_UID_KEY, PROOFS_MARKER,
    REGISTRATION_KEY, SIGNATURE_KEY,
};
use spark_pod_allocator::k8s::{
    ApiClient, IdRecord, RateLimiter, RegistrationSettings, RegistrationStore,
};
use spark_pod_allocator::metrics::Metrics;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::{Builder, Service};
use spark_pod_allocator_sim::{SimCluster, SimSettings};
use test_kit::grpc::{Harness, quiet_cluster, start_request};
use test_kit::requests::{status_request, stop_request};
use test_kit::service::{registration_config_map, stored_registration};
use test_kit::wait::until;
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

/// The service's own namespace: registrations and the key Secret live here.
const SERVICE_NS: &str = "spark-system";
const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";

fn sim_settings() -> SimSettings {
    let mut settings = quiet_cluster();
    settings.namespaces.push(SERVICE_NS.into());
    settings
}

fn config() -> Settings {
    let mut config = Settings::default();
    config.app.allowed_namespaces = vec![TEAM_A.into(), TEAM_B.into()];
    config.registrations = RegistrationSettings {
        namespace: Some(SERVICE_NS.into()),
        ..RegistrationSettings::default()
    };
    config
}

async fn first_service() -> Harness {
    Harness::start_with_config(sim_settings(), ServeSettings::default(), config()).await
}

/// Starts `app` in `namespace` over gRPC with `n` executors; waits until its pods exist
/// and its registration holds the target.
async fn start_registered(h: &Harness, app: &str, namespace: &str, n: u32) {
    h.client
        .clone()
        .start(start_request(app, namespace))
        .await
        .expect("Start");
    h.set_total(app, n).await;
    let client = h.sim.try_client().expect("client");
    until(&format!("{app}'s pods and registration"), async || {
        h.clock.advance(Duration::from_secs(1));
        h.pods(namespace, app).await.len() == n as usize
            && stored_registration(&client, SERVICE_NS, namespace, app)
                .await
                .is_some_and(|r| r.targets.get(&0) == Some(&n))
    })
    .await;
}

/// Deletes every pod of `app` in `namespace` at once, as a drained node would: a service
/// that resumes `app` creates them again.
async fn delete_pods(h: &Harness, namespace: &str, app: &str) {
    let pods: Api<Pod> = Api::namespaced(h.sim.try_client().expect("client"), namespace);
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels(&format!("spark-app-selector={app}")),
    )
    .await
    .expect("delete pods");
    until(&format!("{app}'s pods gone"), async || {
        h.pods(namespace, app).await.is_empty()
    })
    .await;
}

/// A restarted service: a registry of its own recording into metrics the test reads, that
/// resumed what it found, behind a gRPC server.
struct Restarted {
    applications: Applications,
    metrics: Metrics,
    resumed: Vec<String>,
    client: ExecutorAllocatorClient<Channel>,
    service: Service,
}

async fn restart(h: &mut Harness) -> Restarted {
    h.stop_server().await;
    let metrics = Metrics::new();
    let core = Builder::new(
        h.sim.try_client().expect("client"),
        Arc::new(h.clock.clone()),
    )
    .with_settings(&h.settings)
    .with_metrics(metrics.clone())
    .build();
    let applications = core.applications().clone();
    let resumed = applications
        .resume_registered()
        .await
        .expect("resume")
        .iter()
        .map(|app| app.to_string())
        .collect();
    let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let service = core
        .serve(ServeSettings::default(), listener)
        .expect("service starts");
    let channel = Endpoint::from_shared(format!("http://{}", service.address()))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    Restarted {
        applications,
        metrics,
        resumed,
        client: ExecutorAllocatorClient::new(channel),
        service,
    }
}

impl Restarted {
    /// Shuts it down as SIGTERM would (its registrations kept for the next service).
    async fn stop(self) {
        self.service.begin_shutdown();
        self.service.stopped().await.expect("server result");
    }

    /// `registrations_refused_total` per reason, as `/metrics` serves it.
    fn refused(&self) -> BTreeMap<String, u64> {
        let prefix = "spark_pod_allocator_registrations_refused_total{reason=\"";
        self.metrics
            .encode()
            .lines()
            .filter_map(|line| {
                let (reason, count) = line.strip_prefix(prefix)?.split_once("\"} ")?;
                Some((reason.to_string(), count.parse().ok()?))
            })
            .collect()
    }

    /// GetStatus of `app` over gRPC is NOT_FOUND: no application runs under that id.
    async fn assert_not_running(&self, app: &str) {
        let err = self
            .client
            .clone()
            .get_status(status_request(app))
            .await
            .expect_err("not running");
        assert_eq!(err.code(), Code::NotFound, "{err}");
    }

    /// Runs rounds until `app` has `n` pods again: the resumed service creates.
    async fn await_pods(&self, h: &Harness, namespace: &str, app: &str, n: usize) {
        until(&format!("{app} has {n} pods again"), async || {
            h.clock.advance(Duration::from_secs(1));
            h.pods(namespace, app).await.len() == n
        })
        .await;
    }
}

/// What a registration looks like (the JSON the service writes), for `app` in `namespace`:
/// 3 executors of an attacker's image, mounting a Secret of the target namespace.
fn forged_registration(app: &str, namespace: &str) -> String {
    json!({
        "app_id": app, "namespace": namespace, "driver_pod_name": null, "pod_name_prefix": null,
        "settings": {
            "batch_size": 5, "batch_delay_ms": 1000, "executor_timeout_ms": 600000,
            "executor_idle_timeout_ms": 60000, "max_pending_pods": null,
            "max_pending_pods_per_profile": null, "max_executors": null,
            "delete_on_termination": true, "executor_container_name": "spark-kubernetes-executor",
            "check_all_containers": false
        },
        "templates": {"0": {"spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "attacker/miner:1",
                "volumeMounts": [{"name": "loot", "mountPath": "/loot"}]}],
            "volumes": [{"name": "loot", "secret": {"secretName": "db-password"}}]
        }}},
        "targets": {"0": 3}, "registered": []
    })
    .to_string()
}

async fn create_config_map(
    h: &Harness,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    data: &[(&str, &str)],
) {
    let api: Api<ConfigMap> = Api::namespaced(h.sim.try_client().expect("client"), namespace);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &config_map)
        .await
        .expect("create ConfigMap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_planted_in_a_tenant_namespace_creates_no_pod_after_a_restart() {
    let mut h = first_service().await;
    start_registered(&h, "kept", TEAM_A, 2).await;
    h.stop_server().await;
    delete_pods(&h, TEAM_A, "kept").await;
    // A driver of team-a, which may write ConfigMaps in team-a, plants a registration
    // naming team-b: as the service wrote them before (unsigned, the application's
    // ConfigMap), and as it writes them now (labels, a signature it made up).
    let forged = forged_registration("planted", TEAM_B);
    let old = IdRecord::config_map_name("planted");
    let managed = ("app.kubernetes.io/managed-by", "spark-pod-allocator");
    create_config_map(
        &h,
        TEAM_A,
        &old,
        &[managed, ("spark-app-selector", "planted")],
        &[(REGISTRATION_KEY, &forged)],
    )
    .await;
    let made_up = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    create_config_map(
        &h,
        TEAM_A,
        &RegistrationStore::config_map_name(TEAM_B, "planted"),
        &[
            managed,
            ("spark-app-selector", "planted"),
            (APPLICATION_NAMESPACE_LABEL, TEAM_B),
        ],
        &[(REGISTRATION_KEY, &forged), (SIGNATURE_KEY, &made_up)],
    )
    .await;

    let r = restart(&mut h).await;
    assert_eq!(r.resumed, ["kept"]);
    // The resumed application creates its pods again; the planted one makes none, anywhere.
    r.await_pods(&h, TEAM_A, "kept", 2).await;
    for namespace in [TEAM_A, TEAM_B] {
        assert!(h.pods(namespace, "planted").await.is_empty(), "{namespace}");
    }
    r.assert_not_running("planted").await;
    assert!(
        r.applications
            .ownership(&test_kit::service::id("planted"))
            .is_none()
    );
    // Never even read: registrations are listed in the service's namespace only.
    assert_eq!(r.refused(), BTreeMap::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_owner_is_refused_after_a_restart_counted_and_creates_no_pod() {
    let mut h = first_service().await;
    start_registered(&h, "kept", TEAM_A, 2).await;
    start_registered(&h, "owned", TEAM_A, 2).await;
    h.stop_server().await;
    for app in ["kept", "owned"] {
        delete_pods(&h, TEAM_A, app).await;
    }
    // Someone who may write ConfigMaps in the service's namespace hands "owned" to mallory.
    let client = h.sim.try_client().expect("client");
    let config_map = registration_config_map(&client, SERVICE_NS, TEAM_A, "owned")
        .await
        .expect("owned's registration");
    let data = config_map.data.expect("data");
    let mut registration: serde_json::Value =
        serde_json::from_str(&data[REGISTRATION_KEY]).expect("JSON");
    registration["owner"] = json!("system:serviceaccount:team-a:mallory");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SERVICE_NS);
    let patch = json!({"data": {REGISTRATION_KEY: registration.to_string()}});
    api.patch(
        &RegistrationStore::config_map_name(TEAM_A, "owned"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("patch");

    let r = restart(&mut h).await;
    assert_eq!(r.resumed, ["kept"]);
    r.await_pods(&h, TEAM_A, "kept", 2).await;
    assert!(h.pods(TEAM_A, "owned").await.is_empty());
    r.assert_not_running("owned").await;
    assert!(
        r.applications
            .ownership(&test_kit::service::id("owned"))
            .is_none()
    );
    assert_eq!(r.refused(), BTreeMap::from([("bad_signature".into(), 1)]));
    // The properly written one still reads back as the service wrote it.
    let status = r
        .client
        .clone()
        .get_status(status_request("kept"))
        .await
        .expect("GetStatus")
        .into_inner();
    assert_eq!(status.profiles[0].target, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_moved_to_another_namespaces_name_and_labels_is_refused() {
    let mut h = first_service().await;
    start_registered(&h, "kept", TEAM_A, 2).await;
    start_registered(&h, "moved", TEAM_A, 2).await;
    h.stop_server().await;
    for app in ["kept", "moved"] {
        delete_pods(&h, TEAM_A, app).await;
    }
    let client = h.sim.try_client().expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SERVICE_NS);
    let original = registration_config_map(&client, SERVICE_NS, TEAM_A, "moved")
        .await
        .expect("moved's registration");
    let data = original.data.clone().expect("data");
    let (json, proof, uid) = (
        &data[REGISTRATION_KEY],
        &data[PROOF_KEY],
        &data[PROOF_UID_KEY],
    );
    api.delete(
        original.metadata.name.as_deref().expect("name"),
        &DeleteParams::default(),
    )
    .await
    .expect("delete the original");
    let managed = ("app.kubernetes.io/managed-by", "spark-pod-allocator");
    // Under team-b's name and labels, as written, and with its namespace edited to match.
    let to_team_b = json.replace("\"namespace\":\"team-a\"", "\"namespace\":\"team-b\"");
    assert_ne!(&to_team_b, json);
    for (app, body) in [("moved", json.as_str()), ("moved-b", to_team_b.as_str())] {
        create_config_map(
            &h,
            SERVICE_NS,
            &RegistrationStore::config_map_name(TEAM_B, app),
            &[
                managed,
                ("spark-app-selector", app),
                (APPLICATION_NAMESPACE_LABEL, TEAM_B),
            ],
            &[
                (REGISTRATION_KEY, body),
                (PROOF_KEY, proof),
                (PROOF_UID_KEY, uid),
            ],
        )
        .await;
    }
    // Its own labels and data, under another name.
    create_config_map(
        &h,
        SERVICE_NS,
        "spark-pod-allocator.team-a.copy",
        &[
            managed,
            ("spark-app-selector", "moved"),
            (APPLICATION_NAMESPACE_LABEL, TEAM_A),
        ],
        &[
            (REGISTRATION_KEY, json),
            (PROOF_KEY, proof),
            (PROOF_UID_KEY, uid),
        ],
    )
    .await;

    let r = restart(&mut h).await;
    assert_eq!(r.resumed, ["kept"]);
    r.await_pods(&h, TEAM_A, "kept", 2).await;
    for namespace in [TEAM_A, TEAM_B] {
        assert!(h.pods(namespace, "moved").await.is_empty(), "{namespace}");
        assert!(h.pods(namespace, "moved-b").await.is_empty(), "{namespace}");
    }
    r.assert_not_running("moved").await;
    assert_eq!(
        r.refused(),
        BTreeMap::from([("bad_signature".into(), 2), ("misplaced".into(), 1)])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_of_a_namespace_no_longer_allowed_is_refused() {
    let mut h = first_service().await;
    start_registered(&h, "kept", TEAM_A, 2).await;
    start_registered(&h, "in-b", TEAM_B, 2).await;
    h.stop_server().await;
    delete_pods(&h, TEAM_B, "in-b").await;
    h.settings.app.allowed_namespaces = vec![TEAM_A.into()];

    let r = restart(&mut h).await;
    assert_eq!(r.resumed, ["kept"]);
    r.assert_not_running("in-b").await;
    assert!(h.pods(TEAM_B, "in-b").await.is_empty());
    assert_eq!(
        r.refused(),
        BTreeMap::from([("namespace_not_allowed".into(), 1)])
    );
}

/// `original` written back as a namespace backup restore (or `kubectl apply` of a saved
/// manifest) writes it: the same name, labels and data, in a new object.
async fn write_back(h: &Harness, original: &ConfigMap) {
    let api: Api<ConfigMap> = Api::namespaced(h.sim.try_client().expect("client"), SERVICE_NS);
    let copy = ConfigMap {
        metadata: ObjectMeta {
            name: original.metadata.name.clone(),
            labels: original.metadata.labels.clone(),
            annotations: original.metadata.annotations.clone(),
            ..ObjectMeta::default()
        },
        data: original.data.clone(),
        ..ConfigMap::default()
    };
    let restored = api
        .create(&PostParams::default(), &copy)
        .await
        .expect("write the copy back");
    assert_eq!(restored.data, original.data);
    assert_eq!(restored.metadata.labels, original.metadata.labels);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_written_back_after_its_applications_stop_is_not_resumed() {
    let mut h = first_service().await;
    start_registered(&h, "kept", TEAM_A, 2).await;
    start_registered(&h, "stopped", TEAM_A, 2).await;
    let client = h.sim.try_client().expect("client");
    let copy = registration_config_map(&client, SERVICE_NS, TEAM_A, "stopped")
        .await
        .expect("stopped's registration");
    h.client
        .clone()
        .stop(stop_request("stopped"))
        .await
        .expect("Stop");
    until("stopped's registration deleted", async || {
        registration_config_map(&client, SERVICE_NS, TEAM_A, "stopped")
            .await
            .is_none()
    })
    .await;
    assert!(h.pods(TEAM_A, "stopped").await.is_empty());
    write_back(&h, &copy).await;
    h.stop_server().await;
    delete_pods(&h, TEAM_A, "kept").await;

    let r = restart(&mut h).await;
    // The live application resumes after a plain restart; the stopped one creates nothing.
    assert_eq!(r.resumed, ["kept"]);
    r.await_pods(&h, TEAM_A, "kept", 2).await;
    assert!(h.pods(TEAM_A, "stopped").await.is_empty());
    r.assert_not_running("stopped").await;
    assert_eq!(r.refused(), BTreeMap::from([("replayed".into(), 1)]));
    // Another restart (the next shard owner) resumes the live one again, and counts the
    // copy again: it stays refused.
    r.stop().await;
    let r = restart(&mut h).await;
    assert_eq!(r.resumed, ["kept"]);
    assert_eq!(r.refused(), BTreeMap::from([("replayed".into(), 1)]));
    assert!(h.pods(TEAM_A, "stopped").await.is_empty());
}

/// The signature an earlier version wrote (bound to no object), byte for byte: HMAC-SHA256
/// over its context, then the namespace, the application id and the JSON, each after its
/// length as 8 bytes big-endian.
fn earlier_versions_signature(key: &[u8], namespace: &str, app: &str, json: &str) -> String {
    let mut bytes = b"spark-pod-allocator registration v1".to_vec();
    for part in [namespace, app, json] {
        bytes.extend_from_slice(&(part.len() as u64).to_be_bytes());
        bytes.extend_from_slice(part.as_bytes());
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, &bytes).as_ref())
}

/// Replaces `app`'s registration with the record an earlier version wrote of it (the same
/// JSON, its signature, no proof), in a new ConfigMap.
async fn as_earlier_version(h: &Harness, app: &str) {
    let client = h.sim.try_client().expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SERVICE_NS);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SERVICE_NS);
    let key = secrets
        .get(&RegistrationSettings::default().key_secret)
        .await
        .expect("the key Secret")
        .data
        .expect("data")[KEY_DATA_KEY]
        .0
        .clone();
    let original = registration_config_map(&client, SERVICE_NS, TEAM_A, app)
        .await
        .expect("the registration");
    let json = original.data.clone().expect("data")[REGISTRATION_KEY].clone();
    let name = original.metadata.name.clone().expect("name");
    api.delete(&name, &DeleteParams::default())
        .await
        .expect("delete");
    let signature = earlier_versions_signature(&key, TEAM_A, app, &json);
    let earlier = ConfigMap {
        data: Some(BTreeMap::from([
            (REGISTRATION_KEY.to_string(), json),
            (SIGNATURE_KEY.to_string(), signature),
        ])),
        ..original
    };
    write_back(h, &earlier).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_record_resumes_only_if_it_predates_the_proofs() {
    let mut h = first_service().await;
    start_registered(&h, "upgraded", TEAM_A, 2).await;
    start_registered(&h, "restored", TEAM_A, 2).await;
    h.stop_server().await;
    for app in ["upgraded", "restored"] {
        delete_pods(&h, TEAM_A, app).await;
    }
    // As an earlier version left it: its record, and no marker yet.
    as_earlier_version(&h, "upgraded").await;
    let client = h.sim.try_client().expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), SERVICE_NS);
    api.delete(PROOFS_MARKER, &DeleteParams::default())
        .await
        .expect("delete the marker");

    let r = restart(&mut h).await;
    let mut resumed = r.resumed.clone();
    resumed.sort();
    assert_eq!(resumed, ["restored", "upgraded"]);
    r.await_pods(&h, TEAM_A, "upgraded", 2).await;
    assert_eq!(r.refused(), BTreeMap::new());
    // Proven at its first write: the signature bound to nothing is gone.
    until("upgraded's record proven", async || {
        h.clock.advance(Duration::from_secs(1));
        registration_config_map(&client, SERVICE_NS, TEAM_A, "upgraded")
            .await
            .and_then(|c| c.data)
            .is_some_and(|d| d.contains_key(PROOF_KEY) && !d.contains_key(SIGNATURE_KEY))
    })
    .await;
    r.stop().await;
    for app in ["upgraded", "restored"] {
        delete_pods(&h, TEAM_A, app).await;
    }
    // An earlier version's record written back after the marker (a backup older than the
    // upgrade restored now): created at least a second after it.
    let marker = api.get(PROOFS_MARKER).await.expect("the marker");
    let since = marker.metadata.creation_timestamp.expect("created").0;
    until("a second past the marker", async || {
        k8s_openapi::jiff::Timestamp::now().as_second() > since.as_second()
    })
    .await;
    as_earlier_version(&h, "restored").await;

    let r = restart(&mut h).await;
    assert_eq!(r.resumed, ["upgraded"]);
    r.await_pods(&h, TEAM_A, "upgraded", 2).await;
    assert!(h.pods(TEAM_A, "restored").await.is_empty());
    r.assert_not_running("restored").await;
    assert_eq!(r.refused(), BTreeMap::from([("unproven".into(), 1)]));
}

fn store(sim: &SimCluster) -> RegistrationStore {
    let api = ApiClient::new(sim.try_client().expect("client"), RateLimiter::new(50, 100));
    RegistrationStore::new(api, &config().registrations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_racing_for_the_signing_key_agree_on_one_secret() {
    let sim = test_kit::sim::start(sim_settings()).await;
    let (a, b) = (store(&sim), store(&sim));
    let (key_a, key_b) = tokio::join!(a.signing_key(), b.signing_key());
    let (key_a, key_b) = (key_a.expect("key a"), key_b.expect("key b"));
    let message = b"one key for every replica";
    assert_eq!(
        ring::hmac::sign(key_a.key(), message).as_ref(),
        ring::hmac::sign(key_b.key(), message).as_ref()
    );
    let secrets: Api<Secret> = Api::namespaced(sim.try_client().expect("client"), SERVICE_NS);
    let secret = secrets
        .get(&RegistrationSettings::default().key_secret)
        .await
        .expect("the key Secret");
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    assert_eq!(secret.data.expect("data")[KEY_DATA_KEY].0.len(), KEY_LEN);
    let (since_a, since_b) = (key_a.proofs_since(), key_b.proofs_since());
    assert!(
        since_a.is_some() && since_a == since_b,
        "{since_a:?} {since_b:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_key_secret_resumes_nothing_and_names_the_setting() {
    let mut h = first_service().await;
    start_registered(&h, "kept", TEAM_A, 1).await;
    h.stop_server().await;
    // Someone replaces the key with 8 bytes.
    let secrets: Api<Secret> = Api::namespaced(h.sim.try_client().expect("client"), SERVICE_NS);
    let name = RegistrationSettings::default().key_secret;
    secrets
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the key");
    let weak = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KEY_DATA_KEY.to_string(),
            ByteString(vec![1; 8]),
        )])),
        ..Secret::default()
    };
    secrets
        .create(&PostParams::default(), &weak)
        .await
        .expect("weak key");
    let err = Builder::new(
        h.sim.try_client().expect("client"),
        Arc::new(h.clock.clone()),
    )
    .with_settings(&h.settings)
    .build()
    .into_applications()
    .resume_registered()
    .await
    .expect_err("no resume with a weak key");
    assert!(
        matches!(&err, AppError::Unavailable(m) if m.contains("registrations.key_secret") && m.contains("32")),
        "{err}"
    );
    assert!(h.pods(TEAM_A, "kept").await.len() == 1, "nothing deleted");
}
