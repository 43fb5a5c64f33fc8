//! Helpers for tests that run the service binary as a process and read its JSON log lines.
#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::wait_until_serving;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};
use tonic::transport::{Channel, Endpoint};

/// The service binary built for these tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

/// Guards against a hang only; every wait ends on output or an exit.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Reads JSON log lines until one has `message`; returns that line's fields.
pub async fn until_logged(
    lines: &mut Lines<BufReader<ChildStderr>>,
    message: &str,
) -> serde_json::Value {
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if entry["fields"]["message"] == message {
                return entry["fields"].clone();
            }
        }
        panic!("the process ended before logging {message:?}");
    };
    tokio::time::timeout(HANG_GUARD, wait)
        .await
        .expect("log line")
}

/// Starts the service binary (`serve`, JSON logs, a free loopback port) against the cluster
/// of `kubeconfig`; returns it and a client once its health answers SERVING.
pub async fn serve_against(kubeconfig: &Path) -> (Child, ExecutorAllocatorClient<Channel>) {
    let mut child = Command::new(BIN)
        .args(["--log-format", "json", "serve", "--listen", "127.0.0.1:0"])
        .env_remove("RUST_LOG")
        .env_remove("KUBECONFIG")
        .env("SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let serving = until_logged(&mut lines, "serving gRPC").await;
    let address = serving["address"].as_str().expect("address").to_string();
    // Keep reading its log so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    wait_until_serving(channel.clone()).await.expect("serving");
    (child, ExecutorAllocatorClient::new(channel))
}
