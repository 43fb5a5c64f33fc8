//! The simulated scheduler, kubelets and garbage collector, the injected faults, the admin
//! endpoint and authentication, seen from kube-rs like any client of a real cluster.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use spark_pod_allocator_sim::{FaultSettings, KubeletMode, SimCluster, SimSettings};
use test_kit::sim::*;
use test_kit::wait::*;

fn fast_settings() -> SimSettings {
    let mut s = SimSettings::default();
    s.kubelet.start_delay_min_ms = 0;
    s.kubelet.start_delay_max_ms = 5;
    s.kubelet.termination_ms = 10;
    s.kubelet.image_pull_backoff_ms = 10;
    s.kubelet.gc_interval_ms = 20;
    s
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

async fn pod_where(pods: &Api<Pod>, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Pod {
    eventually(what, || async {
        match pods.get_opt(name).await {
            Ok(Some(p)) if pred(&p) => Some(p),
            _ => None,
        }
    })
    .await
}

#[tokio::test]
async fn pods_are_scheduled_started_and_report_their_container() {
    let sim = SimCluster::start(fast_settings()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.create(&PostParams::default(), &executor_pod("exec-1", 1))
        .await
        .unwrap();
    let running = pod_where(&pods, "exec-1", "exec-1 Running", |p| phase(p) == "Running").await;
    let spec = running.spec.unwrap();
    assert!(spec.node_name.unwrap().starts_with("sim-node-"));
    let status = running.status.unwrap();
    assert!(status.pod_ip.is_some());
    let cs = &status.container_statuses.unwrap()[0];
    assert_eq!(cs.name, "spark-kubernetes-executor");
    assert!(cs.ready);
    assert!(cs.state.as_ref().unwrap().running.is_some());
    assert!(
        status
            .conditions
            .unwrap()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );

    // Graceful deletion of a running pod: deletionTimestamp first, then the kubelet removes it.
    let marked = pods
        .delete("exec-1", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    eventually("exec-1 removed by its kubelet", || async {
        matches!(pods.get_opt("exec-1").await, Ok(None)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn excess_pods_stay_unschedulable_until_room_frees() {
    let mut settings = fast_settings();
    settings.kubelet.nodes = 1;
    settings.kubelet.pods_per_node = 2;
    let sim = SimCluster::start(settings).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    for id in 1..=3 {
        pods.create(
            &PostParams::default(),
            &executor_pod(&format!("exec-{id}"), id),
        )
        .await
        .unwrap();
    }
    let waiting = pod_where(&pods, "exec-3", "exec-3 Unschedulable", |p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                })
            })
    })
    .await;
    assert_eq!(phase(&waiting), "Pending");
    assert!(waiting.spec.unwrap().node_name.is_none());
    for name in ["exec-1", "exec-2"] {
        pod_where(&pods, name, "first two Running", |p| phase(p) == "Running").await;
    }
    pods.delete("exec-1", &DeleteParams::default())
        .await
        .unwrap();
    pod_where(&pods, "exec-3", "exec-3 Running once exec-1 is gone", |p| {
        phase(p) == "Running"
    })
    .await;
    assert!(pods.get_opt("exec-1").await.unwrap().is_none());
}

#[tokio::test]
async fn failing_containers_images_and_exits_are_reported_like_a_kubelet() {
    let mut settings = fast_settings();
    settings.kubelet.failing_images = vec!["broken:1".into()];
    settings.kubelet.exit_after_ms = Some(10);
    let sim = SimCluster::start(settings).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");

    let mut bad = executor_pod("bad-image", 1);
    bad.spec.as_mut().unwrap().containers[0].image = Some("broken:1".into());
    pods.create(&PostParams::default(), &bad).await.unwrap();
    let waiting_reason = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs[0].state.as_ref())
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone())
    };
    let backoff = pod_where(&pods, "bad-image", "ImagePullBackOff", |p| {
        waiting_reason(p).as_deref() == Some("ImagePullBackOff")
    })
    .await;
    assert_eq!(phase(&backoff), "Pending");

    pods.create(&PostParams::default(), &executor_pod("finishes", 2))
        .await
        .unwrap();
    let done = pod_where(&pods, "finishes", "Succeeded", |p| phase(p) == "Succeeded").await;
    let terminated = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(terminated.exit_code, 0);

    let mut failing = fast_settings();
    failing.kubelet.fail_fraction = 1.0;
    failing.kubelet.fail_exit_code = 7;
    let sim2 = SimCluster::start(failing).await.unwrap();
    let pods2: Api<Pod> = Api::namespaced(sim2.try_client().expect("sim client"), "default");
    pods2
        .create(&PostParams::default(), &executor_pod("fails", 3))
        .await
        .unwrap();
    let failed = pod_where(&pods2, "fails", "Failed", |p| phase(p) == "Failed").await;
    let terminated = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(terminated.exit_code, 7);
    drop(sim);
}

#[tokio::test]
async fn manual_mode_moves_nothing_and_gc_removes_orphans() {
    let sim = manual_cluster().await;
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let driver = pods
        .create(&PostParams::default(), &executor_pod("driver", 0))
        .await
        .unwrap();
    let mut exec = executor_pod("exec-1", 1);
    exec.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": driver.metadata.uid.clone().unwrap(), "controller": true
    }))
    .unwrap()]);
    pods.create(&PostParams::default(), &exec).await.unwrap();
    assert_eq!(sim.collect_garbage(), 0, "the owner exists");
    pods.delete("driver", &DeleteParams::default())
        .await
        .unwrap();
    // The API server itself never acts on ownerReferences.
    assert!(pods.get_opt("exec-1").await.unwrap().is_some());
    let unmoved = pods.get("exec-1").await.unwrap();
    assert_eq!(phase(&unmoved), "Pending");
    assert!(
        unmoved.spec.unwrap().node_name.is_none(),
        "manual mode never binds"
    );
    // An owner of a kind the simulator does not serve is taken to exist.
    let mut foreign = executor_pod("exec-2", 2);
    foreign.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "sparkoperator.k8s.io/v1beta2", "kind": "SparkApplication", "name": "app", "uid": "0000-gone"
    }))
    .unwrap()]);
    pods.create(&PostParams::default(), &foreign).await.unwrap();
    assert_eq!(sim.collect_garbage(), 1);
    assert!(pods.get_opt("exec-1").await.unwrap().is_none());
    assert!(pods.get_opt("exec-2").await.unwrap().is_some());
}

#[tokio::test]
async fn auto_gc_deletes_executors_of_a_deleted_driver() {
    let sim = SimCluster::start(fast_settings()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    let driver = pods
        .create(&PostParams::default(), &executor_pod("driver", 0))
        .await
        .unwrap();
    let mut exec = executor_pod("exec-1", 1);
    exec.metadata.owner_references = Some(vec![serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "name": "driver", "uid": driver.metadata.uid.clone().unwrap(), "controller": true
    }))
    .unwrap()]);
    pods.create(&PostParams::default(), &exec).await.unwrap();
    pods.delete(
        "driver",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    eventually("orphaned executor collected", || async {
        matches!(pods.get_opt("exec-1").await, Ok(None)).then_some(())
    })
    .await;
}

fn no_retry_client(sim: &SimCluster) -> kube::Client {
    let mut config = sim.kube_config();
    config.default_retry = false;
    kube::Client::try_from(config).unwrap()
}

#[tokio::test]
async fn injected_errors_are_real_status_answers() {
    let sim = manual_cluster().await;
    let client = no_retry_client(&sim);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        ..FaultSettings::default()
    });
    let (code, reason, _) = api_error(pods.list(&ListParams::default()).await);
    assert_eq!((code, reason.as_str()), (500, "InternalError"));

    sim.set_faults(FaultSettings {
        error_429_fraction: 1.0,
        retry_after_seconds: 3,
        ..FaultSettings::default()
    });
    let (code, headers, body) =
        raw(&client, "GET", "/api/v1/namespaces/default/pods", "", None).await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (429, Some("TooManyRequests"))
    );
    assert_eq!(headers.get("retry-after").unwrap(), "3");

    sim.set_faults(FaultSettings {
        quota_fraction: 1.0,
        ..FaultSettings::default()
    });
    pods.list(&ListParams::default())
        .await
        .expect("only creates are refused");
    let (code, reason, message) = api_error(
        pods.create(&PostParams::default(), &executor_pod("q4", 1))
            .await,
    );
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "pods \"q4\" is forbidden: exceeded quota: sim-quota, requested: pods=1, used: pods=0, limited: pods=0"
    );

    sim.set_faults(FaultSettings {
        lost_create_fraction: 1.0,
        ..FaultSettings::default()
    });
    let answered = pods
        .create(&PostParams::default(), &executor_pod("lost", 1))
        .await
        .expect("201 for a lost create");
    assert!(answered.metadata.uid.is_some());
    sim.set_faults(FaultSettings::default());
    assert!(
        pods.get_opt("lost").await.unwrap().is_none(),
        "a lost create is never stored"
    );
}

#[tokio::test]
async fn discovery_answers_despite_faults_unless_discovery_faults_is_set() {
    let sim = manual_cluster().await;
    let client = no_retry_client(&sim);
    sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        ..FaultSettings::default()
    });
    client
        .apiserver_version()
        .await
        .expect("faults apply to resource requests only");

    sim.set_faults(FaultSettings {
        error_500_fraction: 1.0,
        discovery_faults: true,
        ..FaultSettings::default()
    });
    let err = client
        .apiserver_version()
        .await
        .expect_err("/version fails with discovery_faults");
    assert!(
        matches!(&err, kube::Error::Api(status) if status.code == 500),
        "{err:?}"
    );
    sim.set_faults(FaultSettings::default());
    client
        .apiserver_version()
        .await
        .expect("answers once the fault is lifted");
    sim.shutdown().await;
}

#[tokio::test]
async fn watch_faults_drop_events_and_close_watches() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let from = sim.resource_version();
    pods.create(&PostParams::default(), &executor_pod("a", 1))
        .await
        .unwrap();
    sim.set_faults(FaultSettings {
        watch_drop_fraction: 1.0,
        ..FaultSettings::default()
    });
    let (_, events) = raw_watch_events(
        &client,
        &format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={from}&timeoutSeconds=1"),
    )
    .await;
    assert!(events.is_empty(), "every event dropped: {events:?}");

    sim.set_faults(FaultSettings {
        watch_close_after_seconds: Some(1),
        ..FaultSettings::default()
    });
    // No timeoutSeconds: only the injected close can end this watch (raw_watch_events bounds it).
    let (_, events) = raw_watch_events(
        &client,
        &format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={from}"),
    )
    .await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "ADDED");
}

#[tokio::test]
async fn admin_endpoint_reads_and_changes_faults_and_compacts() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let (code, _, body) = raw(&client, "GET", "/sim/faults", "", None).await;
    assert_eq!(
        (code, body["error_500_fraction"].as_f64()),
        (200, Some(0.0))
    );
    let (code, _, _) = raw(
        &client,
        "PUT",
        "/sim/faults",
        "application/json",
        Some(json!({"latency_ms": 1, "quota_fraction": 0.5})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(sim.faults().quota_fraction, 0.5);
    let (code, _, body) = raw(
        &client,
        "PUT",
        "/sim/faults",
        "application/json",
        Some(json!({"quota_fraction": 2.0})),
    )
    .await;
    assert_eq!((code, body["reason"].as_str()), (400, Some("BadRequest")));
    assert_eq!(
        sim.faults().quota_fraction,
        0.5,
        "a rejected change keeps the old faults"
    );
    let (code, _, _) = raw(
        &client,
        "PUT",
        "/sim/faults",
        "application/json",
        Some(json!({"no_such_fault": 1})),
    )
    .await;
    assert_eq!(code, 400);

    sim.set_faults(FaultSettings::default());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &executor_pod("a", 1))
        .await
        .unwrap();
    let old = sim.resource_version() - 1;
    let (code, _, _) = raw(&client, "POST", "/sim/compact", "", None).await;
    assert_eq!(code, 200);
    let (_, events) = raw_watch_events(
        &client,
        &format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={old}"),
    )
    .await;
    assert_eq!(events[0]["object"]["code"], 410);
}

#[tokio::test]
async fn bearer_tokens_are_required_when_configured() {
    let mut settings = SimSettings::default();
    settings.kubelet.mode = KubeletMode::Manual;
    settings.auth_tokens = vec!["s3cret".into()];
    let sim = SimCluster::start(settings).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(sim.try_client().expect("sim client"), "default");
    pods.list(&ListParams::default())
        .await
        .expect("the cluster's own config carries the token");
    let anonymous =
        kube::Client::try_from(kube::Config::new(sim.base_url().parse().unwrap())).unwrap();
    let anon_pods: Api<Pod> = Api::namespaced(anonymous, "default");
    let (code, reason, message) = api_error(anon_pods.list(&ListParams::default()).await);
    assert_eq!(
        (code, reason.as_str(), message.as_str()),
        (401, "Unauthorized", "Unauthorized")
    );
    assert!(sim.kubeconfig_yaml().contains("token: \"s3cret\""));
    let anonymous =
        kube::Client::try_from(kube::Config::new(sim.base_url().parse().unwrap())).unwrap();
    anonymous
        .apiserver_version()
        .await
        .expect("/version is public, as with default RBAC");
    let mut wrong = kube::Config::new(sim.base_url().parse().unwrap());
    wrong.headers.push((
        http::header::AUTHORIZATION,
        http::HeaderValue::from_static("Bearer nope"),
    ));
    let wrong = kube::Client::try_from(wrong).unwrap();
    assert!(
        wrong.apiserver_version().await.is_err(),
        "a wrong token is refused even for /version"
    );
}

#[tokio::test]
async fn settings_load_from_toml_with_defaults_and_bad_values_are_refused() {
    let toml = "listen = \"127.0.0.1:0\"\n[kubelet]\nmode = \"manual\"\nnodes = 3\n[faults]\nlatency_ms = 5\n";
    let settings: SimSettings = config::Config::builder()
        .add_source(config::File::from_str(toml, config::FileFormat::Toml))
        .build()
        .unwrap()
        .try_deserialize()
        .unwrap();
    assert_eq!(settings.kubelet.mode, KubeletMode::Manual);
    assert_eq!(settings.kubelet.nodes, 3);
    assert_eq!(settings.kubelet.pods_per_node, 110);
    assert_eq!(settings.faults.latency_ms, 5);
    assert_eq!(settings.history, 10_000);

    let mut bad = SimSettings::default();
    bad.faults.error_500_fraction = 1.5;
    let err = SimCluster::start(bad).await.err().expect("refused");
    assert!(err.to_string().contains("error_500_fraction"), "{err}");
    let mut taken = SimSettings::default();
    let first = SimCluster::start(SimSettings::default()).await.unwrap();
    taken.listen = first.local_addr().to_string();
    assert!(
        SimCluster::start(taken).await.is_err(),
        "a used port is a clear error"
    );
}

#[tokio::test]
async fn shutdown_ends_watches_and_stops_listening() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let req = http::Request::get("/api/v1/namespaces/default/pods?watch=1")
        .body(kube::client::Body::from(Vec::new()))
        .unwrap();
    // The response head has arrived: the watch is open on the server.
    let resp = client.send(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = tokio::spawn(resp.into_body().collect_bytes());
    let addr = sim.local_addr();
    sim.shutdown().await;
    let rest = tokio::time::timeout(std::time::Duration::from_secs(30), body)
        .await
        .expect("the watch ends when the server shuts down")
        .unwrap();
    assert!(
        rest.map(|b| b.is_empty()).unwrap_or(true),
        "no event was pending"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "nothing listens after shutdown"
    );
}

#[tokio::test]
async fn run_until_writes_a_kubeconfig_clients_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sim.kubeconfig");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run_path = path.clone();
    let running = tokio::spawn(async move {
        let mut settings = SimSettings::default();
        settings.kubelet.mode = KubeletMode::Manual;
        spark_pod_allocator_sim::run_until(settings, Some(&run_path), async {
            let _ = stop_rx.await;
        })
        .await
    });
    eventually("kubeconfig written", || async {
        path.exists().then_some(())
    })
    .await;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config).unwrap(), "default");
    pods.create(&PostParams::default(), &executor_pod("via-kubeconfig", 1))
        .await
        .unwrap();
    stop_tx.send(()).unwrap();
    running.await.unwrap().unwrap();

    let err = spark_pod_allocator_sim::run_until(
        SimSettings::default(),
        Some(&dir.path().join("missing/dir/kc")),
        async {},
    )
    .await;
    assert!(
        matches!(
            err,
            Err(spark_pod_allocator_sim::SimError::Kubeconfig { .. })
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn admin_endpoint_counts_requests_by_user_agent_verb_and_resource() {
    let sim = manual_cluster().await;
    let client = sim.try_client().expect("sim client");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &executor_pod("a", 1))
        .await
        .unwrap();
    pods.list(&Default::default()).await.unwrap();
    pods.list(&Default::default()).await.unwrap();
    let (_, events) = raw_watch_events(
        &client,
        "/api/v1/namespaces/default/pods?watch=1&resourceVersion=0&timeoutSeconds=1",
    )
    .await;
    assert!(!events.is_empty());
    let (code, _, body) = raw(&client, "GET", "/sim/requests", "", None).await;
    assert_eq!(code, 200);
    let count = |verb: &str| -> u64 {
        body["requests"]
            .as_array()
            .expect("rows")
            .iter()
            .filter(|r| r["verb"] == verb && r["resource"] == "pods")
            .map(|r| {
                assert!(r["userAgent"].as_str().is_some(), "{r}");
                r["count"].as_u64().expect("count")
            })
            .sum()
    };
    assert_eq!(
        (count("create"), count("list"), count("watch")),
        (1, 2, 1),
        "{body}"
    );
    assert_eq!(count("delete"), 0);
}
