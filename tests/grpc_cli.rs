//! The binary as a user runs it: `serve --simulate` answering gRPC and stopping cleanly on
//! SIGTERM, `simulate` writing a usable kubeconfig, `demo` finishing with exit 0, and bad
//! configuration refused with a message naming the key (no panic).
use test_kit::grpc::TEMPLATE;
use test_kit::process::{
    HANG_GUARD, SERVE_SIMULATE, connect_serving, exit_status, run_successfully, service_command,
    serving_channel, spawn_logged, terminate, until_logged,
};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ListParams};
use spark_pod_allocator::proto;
use test_kit::requests::*;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

fn command(args: &[&str]) -> Command {
    service_command(BIN, args)
}

#[tokio::test]
async fn serve_simulate_answers_grpc_and_stops_on_sigterm() {
    let (mut child, mut lines) = spawn_logged(command(SERVE_SIMULATE));
    let fields = until_logged(&mut lines, "serving gRPC").await;
    let address = fields["address"].as_str().expect("address").to_string();

    let mut client = connect_serving(&address).await;
    let started = client
        .start(proto::StartRequest {
            application_id: "spark-cli".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("start")
        .into_inner();
    assert!(!started.resumed);
    let status = client
        .get_status(status_request("spark-cli"))
        .await
        .expect("status")
        .into_inner();
    assert_eq!(status.last_executor_id, 0);

    terminate(&child);
    until_logged(
        &mut lines,
        "stopped, and the simulated cluster with its pods",
    )
    .await;
    let exit = exit_status(&mut child).await;
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn a_second_signal_exits_without_waiting_for_open_calls() {
    let (mut child, mut lines) = spawn_logged(command(SERVE_SIMULATE));
    let fields = until_logged(&mut lines, "serving gRPC").await;
    let address = fields["address"].as_str().expect("address").to_string();
    let channel = serving_channel(&address).await;
    // A health Watch is a call that stays open: a graceful shutdown waits for it to drain.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let _open = health
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();

    terminate(&child);
    until_logged(&mut lines, "signal received (another one exits at once)").await;
    terminate(&child);
    until_logged(
        &mut lines,
        "second signal: exiting at once; executor pods are left in place",
    )
    .await;
    let exit = exit_status(&mut child).await;
    // 130, not the 0 of a shutdown that drained its calls.
    assert_eq!(exit.code(), Some(130), "{exit:?}");
}

#[tokio::test]
async fn simulate_writes_a_kubeconfig_kubectl_style_clients_can_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut command = command(&[
        "simulate",
        "--listen",
        "127.0.0.1:0",
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8 path"),
    ]);
    command.arg("--log-format").arg("json");
    let (mut child, mut lines) = spawn_logged(command);
    let fields = until_logged(&mut lines, "simulated cluster serving").await;
    let url = fields["url"].as_str().expect("url");
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let namespaces: Api<Namespace> = Api::all(client);
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .expect("list namespaces")
        .items
        .into_iter()
        .filter_map(|ns| ns.metadata.name)
        .collect();
    assert!(names.contains(&"default".to_string()), "{names:?}");

    terminate(&child);
    let exit = exit_status(&mut child).await;
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn serve_answers_health_on_the_probe_port_and_names_the_key_when_it_is_taken() {
    let mut serve = command(SERVE_SIMULATE);
    serve.env("SPARK_POD_ALLOCATOR__HEALTH__LISTEN", "127.0.0.1:0");
    let (mut child, mut lines) = spawn_logged(serve);
    let fields = until_logged(&mut lines, "serving gRPC health for probes").await;
    let probes = fields["address"].as_str().expect("address").to_string();
    // The probe port answers with the gRPC port's status.
    let status = tonic_health::pb::health_client::HealthClient::new(serving_channel(&probes).await)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health on the probe port")
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    // A second service whose probe port is taken stops at once, naming the key.
    let out = command(SERVE_SIMULATE)
        .env("SPARK_POD_ALLOCATOR__HEALTH__LISTEN", &probes)
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("health.listen"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    terminate(&child);
    let exit = exit_status(&mut child).await;
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn a_bad_configuration_value_is_refused_naming_its_key() {
    let out = command(&["serve", "--simulate"])
        .env("SPARK_POD_ALLOCATOR__KUBERNETES__QPS", "fast")
        .output()
        .await
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("kubernetes.qps"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn a_missing_default_template_file_is_refused_naming_its_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("allocator.toml");
    std::fs::write(
        &config,
        "default_executor_pod_template = \"/nonexistent/template.yaml\"\n",
    )
    .expect("write");
    let out = command(&[
        "--config",
        config.to_str().expect("utf-8 path"),
        "serve",
        "--simulate",
    ])
    .output()
    .await
    .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("default_executor_pod_template"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn the_demo_runs_to_its_summary_and_exits_zero() {
    let stdout = run_successfully(command(&["demo"]), HANG_GUARD * 2).await;
    // Not a terminal: plain lines, no ANSI redraws.
    assert!(!stdout.contains('\u{1b}'), "{stdout}");
    for expected in [
        "reached 200 executors (profile 0: 150, profile 1:  50)",
        "reached  50 executors (profile 0:  30, profile 1:  20)",
        "reached   0 executors",
        "executor pods created: ",
        "executor pods deleted: ",
        "(driver on downscale 200, allocator ",
        "executor ids used: 1..=",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in\n{stdout}"
        );
    }
}

/// `serve --simulate` writes a kubeconfig for its embedded cluster where its log says:
/// kubectl reads through it the executor pods the service creates and the simulated nodes;
/// the file, chosen by the service, is removed when it stops.
#[tokio::test]
async fn serve_simulate_writes_the_kubeconfig_it_logs_and_kubectl_reads_pods_through_it() {
    let (mut child, mut lines) = spawn_logged(command(SERVE_SIMULATE));
    let started = until_logged(&mut lines, "simulated cluster started").await;
    let kubeconfig = std::path::PathBuf::from(started["kubeconfig"].as_str().expect("kubeconfig"));
    let fields = until_logged(&mut lines, "serving gRPC").await;
    let address = fields["address"].as_str().expect("address").to_string();
    let mut client = connect_serving(&address).await;
    client
        .start(proto::StartRequest {
            application_id: "spark-kubectl".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("start");
    client
        .set_total_expected(targets_request("spark-kubectl", 2))
        .await
        .expect("target");
    let kubectl = |args: &[&str]| {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--request-timeout=30s")
            .args(args)
            .kill_on_drop(true);
        command
    };
    // The pods the service creates, read by kubectl through the logged kubeconfig.
    let names = test_kit::wait::eventually("kubectl lists the two executor pods", async || {
        let pods = run_successfully(
            kubectl(&[
                "get",
                "pods",
                "-l",
                "spark-app-selector=spark-kubectl",
                "-o",
                "name",
            ]),
            HANG_GUARD,
        )
        .await;
        let mut names: Vec<String> = pods.lines().map(str::to_string).collect();
        names.sort();
        (names.len() == 2).then_some(names)
    })
    .await;
    assert_eq!(
        names,
        ["pod/spark-kubectl-exec-1", "pod/spark-kubectl-exec-2"]
    );
    let nodes = run_successfully(kubectl(&["get", "nodes", "-o", "name"]), HANG_GUARD).await;
    assert!(nodes.lines().any(|l| l == "node/sim-node-0"), "{nodes}");

    terminate(&child);
    until_logged(
        &mut lines,
        "stopped, and the simulated cluster with its pods",
    )
    .await;
    let exit = exit_status(&mut child).await;
    assert!(exit.success(), "{exit:?}");
    assert!(!kubeconfig.exists(), "{} left behind", kubeconfig.display());
}
