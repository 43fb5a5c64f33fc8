//! `serve --simulate` with `metrics.listen` set, as a platform team scrapes it: after a
//! scale-up the pods created, the gRPC calls by method and code and the active
//! applications read back from `/metrics`; after Stop, the pods it deleted.
mod process_support;
use process_support::{HANG_GUARD, until_logged};

use std::process::Stdio;
use std::time::Duration;

use spark_pod_allocator::demo::wait_until_serving;
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tonic::transport::Endpoint;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const START: &str = "/spark.allocator.v1.ExecutorAllocator/Start";
const SET_TOTAL: &str = "/spark.allocator.v1.ExecutorAllocator/SetTotalExpected";

/// `GET /metrics` over plain HTTP/1.1; returns the body.
async fn scrape(address: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect to the metrics endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    body.to_string()
}

/// The value of the sample `series` (name and labels as exposed), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// Scrapes until `series` has `want`.
async fn until_sample(address: &str, series: &str, want: f64) -> String {
    let wait = async {
        loop {
            let text = scrape(address).await;
            if sample(&text, series) == Some(want) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    match tokio::time::timeout(HANG_GUARD, wait).await {
        Ok(text) => text,
        Err(_) => panic!(
            "{series} never became {want}; last scrape:\n{}",
            scrape(address).await
        ),
    }
}

fn rpcs(method: &str, code: &str) -> String {
    format!("spark_pod_allocator_grpc_requests_total{{method=\"{method}\",code=\"{code}\"}}")
}

#[tokio::test]
async fn a_scale_up_and_a_stop_read_back_from_metrics() {
    let mut child = Command::new(BIN)
        .args([
            "--log-format",
            "json",
            "serve",
            "--simulate",
            "--listen",
            "127.0.0.1:0",
        ])
        .env_remove("RUST_LOG")
        .env_remove("KUBECONFIG")
        .env("SPARK_POD_ALLOCATOR__METRICS__LISTEN", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let metrics = until_logged(&mut lines, "serving metrics at /metrics").await["address"]
        .as_str()
        .expect("metrics address")
        .to_string();
    let grpc = until_logged(&mut lines, "serving gRPC").await["address"]
        .as_str()
        .expect("gRPC address")
        .to_string();
    // Drain the log so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    let before = scrape(&metrics).await;
    assert_eq!(
        sample(&before, "spark_pod_allocator_applications_active"),
        Some(0.0),
        "{before}"
    );
    assert!(
        before.contains("spark_pod_allocator_build_info{version=\""),
        "{before}"
    );

    let channel = Endpoint::from_shared(format!("http://{grpc}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    wait_until_serving(channel.clone()).await.expect("serving");
    let mut client = ExecutorAllocatorClient::new(channel);
    client
        .start(proto::StartRequest {
            application_id: "spark-metrics".into(),
            namespace: "default".into(),
            executor_pod_template: "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n".into(),
            ..Default::default()
        })
        .await
        .expect("start");
    client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: "spark-metrics".into(),
            executors_per_profile: [(0, 3)].into(),
            ..Default::default()
        })
        .await
        .expect("set total expected");
    let unknown = client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: "nobody".into(),
            executors_per_profile: [(0, 1)].into(),
            ..Default::default()
        })
        .await
        .expect_err("an unknown application");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    let text = until_sample(
        &metrics,
        "spark_pod_allocator_executor_pods_created_total",
        3.0,
    )
    .await;
    assert_eq!(sample(&text, &rpcs(START, "OK")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &rpcs(SET_TOTAL, "OK")), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, &rpcs(SET_TOTAL, "NOT_FOUND")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            &format!(
                "spark_pod_allocator_grpc_request_duration_seconds_count{{method=\"{SET_TOTAL}\"}}"
            )
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "spark_pod_allocator_applications_active"),
        Some(1.0),
        "{text}"
    );
    // The gauges are those of the application's last round: until the pods are seen.
    let text = until_sample(
        &metrics,
        "spark_pod_allocator_executors_newly_created{application=\"spark-metrics\",profile=\"0\"}",
        0.0,
    )
    .await;
    assert_eq!(
        sample(
            &text,
            "spark_pod_allocator_executors_target{application=\"spark-metrics\",profile=\"0\"}"
        ),
        Some(3.0),
        "{text}"
    );
    let seen = ["running", "pending"]
        .map(|state| {
            sample(
                &text,
                &format!("spark_pod_allocator_executors_{state}{{application=\"spark-metrics\",profile=\"0\"}}"),
            )
            .expect(state)
        })
        .iter()
        .sum::<f64>();
    assert_eq!(seen, 3.0, "{text}");
    assert!(
        sample(&text, "spark_pod_allocator_watch_relists_total").is_some_and(|n| n >= 1.0),
        "the namespace's watch listed once at least: {text}"
    );
    assert!(
        sample(
            &text,
            "spark_pod_allocator_watch_events_total{kind=\"apply\"}"
        )
        .is_some_and(|n| n >= 3.0),
        "the three pods came as watch events: {text}"
    );
    let seen = sample(&text, "spark_pod_allocator_executor_seen_seconds_count");
    assert_eq!(
        seen,
        Some(3.0),
        "each pod timed once when first seen: {text}"
    );
    let waits = sample(&text, "spark_pod_allocator_rate_limit_wait_seconds_count")
        .expect("rate limiter waits");
    assert!(waits >= 3.0, "one wait per create at least: {text}");
    assert!(
        !text.contains("spark_pod_allocator_executor_pod_create_failures_total{"),
        "no create failed: {text}"
    );

    let stopped = client
        .stop(proto::StopRequest {
            application_id: "spark-metrics".into(),
        })
        .await
        .expect("stop")
        .into_inner();
    let text = scrape(&metrics).await;
    assert_eq!(
        sample(
            &text,
            "spark_pod_allocator_executor_pods_deleted_total{reason=\"stop\"}"
        ),
        Some(f64::from(stopped.deleted_pods)),
        "{text}"
    );
    assert_eq!(stopped.deleted_pods, 3);
    assert_eq!(
        sample(&text, "spark_pod_allocator_applications_active"),
        Some(0.0),
        "{text}"
    );
    assert!(
        !text.contains("application=\"spark-metrics\""),
        "a stopped application's gauges go: {text}"
    );
    child.start_kill().expect("kill");
}
