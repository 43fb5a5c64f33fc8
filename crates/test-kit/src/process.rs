//! The service binary as a process, read through its JSON log lines. Its path is the
//! calling test's `env!("CARGO_BIN_EXE_spark-pod-allocator")` (only a test of the service
//! package knows it).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use spark_pod_allocator::ha::HaSettings;
use spark_pod_allocator::k8s::RegistrationSettings;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use spark_pod_allocator::runtime::wait_until_serving;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStderr, Command};
use tonic::transport::{Channel, Endpoint};

/// Guards against a hang only; every wait ends on output or an exit.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// Reads JSON log lines until one has `message`; returns that line's fields.
pub async fn until_logged(
    lines: &mut Lines<BufReader<ChildStderr>>,
    message: &str,
) -> serde_json::Value {
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            // Shown with a failing test, as the rest of the log is.
            eprintln!("service: {line}");
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

/// `serve --simulate` (the embedded simulated cluster) on a free loopback port, logging JSON.
pub const SERVE_SIMULATE: &[&str] = &[
    "--log-format",
    "json",
    "serve",
    "--simulate",
    "--listen",
    "127.0.0.1:0",
];

/// The service binary `bin` with `args`, as a user runs it: neither `RUST_LOG` nor
/// `KUBECONFIG` from the test's environment, stdin closed, killed when dropped.
pub fn service_command(bin: &str, args: &[&str]) -> Command {
    let mut command = Command::new(bin);
    command
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Spawns `command` with its log (stderr) piped and its stdout dropped; returns the process
/// and its log lines.
pub fn spawn_logged(mut command: Command) -> (Child, Lines<BufReader<ChildStderr>>) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    (child, lines)
}

/// A channel to the gRPC server at `address` (`host:port`) once its health answers SERVING.
pub async fn serving_channel(address: &str) -> Channel {
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    wait_until_serving(channel.clone()).await.expect("serving");
    channel
}

/// A client of the gRPC server at `address` once its health answers SERVING.
pub async fn connect_serving(address: &str) -> ExecutorAllocatorClient<Channel> {
    ExecutorAllocatorClient::new(serving_channel(address).await)
}

/// Runs `command` to its end (bounded by `bound`) and asserts that it succeeded; returns
/// what it printed on stdout.
pub async fn run_successfully(mut command: Command, bound: Duration) -> String {
    let out = tokio::time::timeout(bound, command.output())
        .await
        .expect("the process ends")
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// How the process exited (bounded by [`HANG_GUARD`]).
pub async fn exit_status(child: &mut Child) -> std::process::ExitStatus {
    tokio::time::timeout(HANG_GUARD, child.wait())
        .await
        .expect("exit")
        .expect("wait")
}

/// Sends SIGTERM to the process, as an orchestrator stopping it does.
pub fn terminate(child: &Child) {
    signal(child, "-TERM");
}

/// [`serve_with`] for a replica named `identity` with a short lease (2 s, renewed every
/// 250 ms, acted on for 1 s after each renewal), as the failover tests run several, with
/// `env` on top.
pub async fn serve_replica(
    bin: &str,
    kubeconfig: &Path,
    identity: &str,
    env: &[(&str, &str)],
) -> (Child, String) {
    let mut all = vec![
        ("SPARK_POD_ALLOCATOR__HA__IDENTITY", identity),
        ("SPARK_POD_ALLOCATOR__HA__LEASE_DURATION_MS", "2000"),
        ("SPARK_POD_ALLOCATOR__HA__RENEW_DEADLINE_MS", "1000"),
        ("SPARK_POD_ALLOCATOR__HA__RETRY_PERIOD_MS", "250"),
    ];
    all.extend_from_slice(env);
    serve_with(bin, kubeconfig, &Default::default(), &all).await
}

/// Pauses the process (SIGSTOP), as a frozen VM or a long stop-the-world pause does.
pub fn pause(child: &Child) {
    signal(child, "-STOP");
}

/// Wakes a paused process (SIGCONT).
pub fn wake(child: &Child) {
    signal(child, "-CONT");
}

fn signal(child: &Child, which: &str) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args([which, &pid])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {which} {pid}");
}

/// Starts the service binary `bin` (`serve`, JSON logs, a free loopback port) against the
/// cluster of `kubeconfig`, keeping its registrations as `registrations` says; returns it
/// and a client once its health answers SERVING.
pub async fn serve_against(
    bin: &str,
    kubeconfig: &Path,
    registrations: &RegistrationSettings,
) -> (Child, ExecutorAllocatorClient<Channel>) {
    let (child, address) = serve_at(bin, kubeconfig, registrations).await;
    (child, connect_serving(&address).await)
}

/// As [`serve_against`], but returns the gRPC address instead of a client: for a test that
/// makes its first call only after a wait. A connection on which no call has authenticated
/// is closed once idle for `grpc.unauthenticated_idle_timeout_ms` (5 s), so a client made
/// before such a wait may find its connection gone.
pub async fn serve_at(
    bin: &str,
    kubeconfig: &Path,
    registrations: &RegistrationSettings,
) -> (Child, String) {
    serve_with(bin, kubeconfig, registrations, &[]).await
}

/// As [`serve_at`], with more of the configuration in `env` (`SPARK_POD_ALLOCATOR__…`
/// variables: a replica's `ha` settings). Unless `env` names another, the process has
/// the replica identity of an in-process service ([`HaSettings`]' default): on a cluster
/// the tests share, every service of a test that names no replicas is the same replica.
pub async fn serve_with(
    bin: &str,
    kubeconfig: &Path,
    registrations: &RegistrationSettings,
    env: &[(&str, &str)],
) -> (Child, String) {
    let mut command = service_command(
        bin,
        &["--log-format", "json", "serve", "--listen", "127.0.0.1:0"],
    );
    command.env("SPARK_POD_ALLOCATOR__KUBERNETES__KUBECONFIG", kubeconfig);
    if let Some(namespace) = &registrations.namespace {
        command.env("SPARK_POD_ALLOCATOR__REGISTRATIONS__NAMESPACE", namespace);
    }
    command.env(
        "SPARK_POD_ALLOCATOR__REGISTRATIONS__KEY_SECRET",
        &registrations.key_secret,
    );
    command.env(
        "SPARK_POD_ALLOCATOR__HA__IDENTITY",
        HaSettings::default().identity(),
    );
    command.envs(env.iter().copied());
    spawn_serving(command).await
}

/// Spawns `command` (a `serve` with JSON logs) and returns it with its gRPC address once
/// it logs that it serves.
pub async fn spawn_serving(command: Command) -> (Child, String) {
    let (child, mut lines) = spawn_logged(command);
    let serving = until_logged(&mut lines, "serving gRPC").await;
    let address = serving["address"].as_str().expect("address").to_string();
    // Keep reading its log so it never blocks on a full pipe; the test harness shows it
    // with a failing test.
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("service: {line}");
        }
    });
    (child, address)
}
