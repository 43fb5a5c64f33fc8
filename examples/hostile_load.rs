//! The service's memory under hostile load, and after it: starts `serve --simulate` (the
//! binary given, default `target/debug/spark-pod-allocator`) with its default limits, reads
//! its RSS from /proc before, during and after each attack, and prints one line per reading.
//! Linux only. A manual run, documented in docs/security.md:
//!
//! `cargo run --example hostile_load -- target/debug/spark-pod-allocator`
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use test_kit::grpc::TEMPLATE;

use bytes::Bytes;
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const ADDRESS: &str = "127.0.0.1:50199";

/// Kills the service when the run ends, however it ends.
struct Service(Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

async fn health_ms(channel: &Channel) -> f64 {
    let started = Instant::now();
    let _ = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    started.elapsed().as_secs_f64() * 1000.0
}

async fn report(what: &str, pid: u32, channel: &Channel) {
    println!(
        "{what:<48} RSS {:>8.1} MiB   health {:>6.1} ms",
        rss_mib(pid),
        health_ms(channel).await
    );
}

/// `connections` connections, each with as many half-open calls (headers, no body) as the
/// server lets it open, up to `streams`.
async fn half_open_streams(
    connections: usize,
    streams: usize,
) -> Vec<(h2::client::SendRequest<Bytes>, Vec<h2::SendStream<Bytes>>)> {
    let mut held = Vec::new();
    for _ in 0..connections {
        let Ok(tcp) = TcpStream::connect(ADDRESS).await else {
            break;
        };
        let Ok((mut send, connection)) = h2::client::handshake(tcp).await else {
            break;
        };
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut bodies = Vec::new();
        for _ in 0..streams {
            match tokio::time::timeout(Duration::from_millis(200), send.clone().ready()).await {
                Ok(Ok(ready)) => send = ready,
                _ => break,
            }
            let request = http::Request::builder()
                .method("POST")
                .uri(format!(
                    "http://{ADDRESS}/spark.allocator.v1.ExecutorAllocator/Start"
                ))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(())
                .expect("request");
            match send.send_request(request, false) {
                Ok((_response, body)) => bodies.push(body),
                Err(_) => break,
            }
        }
        held.push((send, bodies));
    }
    held
}

#[tokio::main]
async fn main() {
    let binary = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "target/debug/spark-pod-allocator".into());
    let child = Command::new(&binary)
        .args(["serve", "--simulate", "--listen", ADDRESS])
        .env("SPARK_POD_ALLOCATOR__LOG__FILTER", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service");
    let pid = child.id();
    let _service = Service(child);
    let endpoint = Endpoint::from_static("http://127.0.0.1:50199");
    let channel = loop {
        if let Ok(channel) = endpoint.connect().await {
            break channel;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut client = ExecutorAllocatorClient::new(channel.clone());
    client
        .start(proto::StartRequest {
            application_id: "victim".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("start");
    tokio::time::sleep(Duration::from_secs(1)).await;
    report("baseline (one application)", pid, &channel).await;

    // Half-open streams: 1100 connections (over the default cap of 1024) × up to 32 streams (the default limit), three times: memory the
    // allocator keeps for reuse levels off, a leak would grow each time.
    for round in 1..=3 {
        let held = half_open_streams(1100, 32).await;
        let streams: usize = held.iter().map(|(_, b)| b.len()).sum();
        report(
            &format!(
                "#{round}: {streams} half-open streams on {} conns",
                held.len()
            ),
            pid,
            &channel,
        )
        .await;
        drop(held);
        tokio::time::sleep(Duration::from_secs(3)).await;
        report(&format!("#{round}: 3 s after they closed"), pid, &channel).await;
    }

    // Profile floods (refused) and SetTotalExpected(u32::MAX) on every allowed profile.
    let flood: std::collections::HashMap<i32, String> = (1..40_000)
        .map(|p| (p, TEMPLATE.replace("spark:4", &format!("spark:{p}"))))
        .take(20_000)
        .collect();
    for _ in 0..5 {
        let answer = client
            .set_total_expected(proto::SetTotalExpectedRequest {
                application_id: "victim".into(),
                executors_per_profile: Default::default(),
                resource_profile_templates: flood.clone(),
            })
            .await;
        assert!(answer.is_err(), "a profile flood is refused");
    }
    report("after 5 floods of 20,000 profiles (refused)", pid, &channel).await;
    let profiles: std::collections::HashMap<i32, String> = (1..64)
        .map(|p| (p, TEMPLATE.replace("spark:4", &format!("spark:{p}"))))
        .collect();
    client
        .set_total_expected(proto::SetTotalExpectedRequest {
            application_id: "victim".into(),
            executors_per_profile: (0..64).map(|p| (p, u32::MAX)).collect(),
            resource_profile_templates: profiles,
        })
        .await
        .expect("targets");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = client
        .get_status(proto::GetStatusRequest {
            application_id: "victim".into(),
        })
        .await
        .expect("status")
        .into_inner();
    report(
        &format!(
            "64 profiles × u32::MAX, 5 s: last id {}",
            status.last_executor_id
        ),
        pid,
        &channel,
    )
    .await;
    client
        .stop(proto::StopRequest {
            application_id: "victim".into(),
        })
        .await
        .expect("stop");
    tokio::time::sleep(Duration::from_secs(3)).await;
    report("3 s after Stop", pid, &channel).await;
    // The allocator hands freed pages back over a few seconds, not at once.
    tokio::time::sleep(Duration::from_secs(12)).await;
    report("15 s after Stop", pid, &channel).await;
}
