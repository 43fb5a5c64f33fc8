//! `spark-pod-allocator --config FILE serve --simulate` as a Spark integration test runs
//! it: the API server on the configured fixed port, pods run by the process runtime, and
//! SIGTERM stopping the service, the cluster and every pod process.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use test_kit::wait::*;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

/// A port free right now (bound then released), for a configuration that needs a fixed one.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
    })
}

#[tokio::test]
async fn serve_simulate_runs_pods_as_processes_on_a_fixed_port_and_stops_them() {
    let dir = tempfile::tempdir().unwrap();
    let api_port = free_port();
    let config = dir.path().join("sim.toml");
    std::fs::write(
        &config,
        format!(
            r#"listen = "127.0.0.1:0"

[simulator]
listen = "127.0.0.1:{api_port}"

[simulator.kubelet]
runtime = "process"
work_dir = "{work}"
start_delay_min_ms = 0
start_delay_max_ms = 0

[[simulator.kubelet.process_images]]
image = "*"
command = ["sh", "-c"]
"#,
            work = dir.path().join("pods").display()
        ),
    )
    .unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .arg("--config")
        .arg(&config)
        .args(["serve", "--simulate"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let uri: http::Uri = format!("http://127.0.0.1:{api_port}").parse().unwrap();
    let client = kube::Client::try_from(kube::Config::new(uri)).unwrap();
    eventually("the API server answers on the configured port", || async {
        client.apiserver_version().await.ok()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "spark-exec-1"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "spark-kubernetes-executor", "image": "spark:sim",
                 "args": ["echo $$$$ > main.pid; sleep 1000"]}]}
    }))
    .unwrap();
    let created = pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the pod runs", || async {
        let pod = pods.get("spark-exec-1").await.ok()?;
        (pod.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let pid_file = dir.path().join("pods/default").join(format!(
        "spark-exec-1-{}/main.pid",
        created.metadata.uid.unwrap()
    ));
    let pid: i32 = eventually("the process wrote its pid", || async {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .await;
    assert!(alive(pid));
    let server = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the service stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(!alive(pid), "the pod's process outlived the service");
}
