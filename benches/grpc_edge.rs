//! Cost of the gRPC edge, as ratios against baselines measured in the same run:
//! - validating a Start request (YAML template parsed, settings merged and checked) against
//!   parsing the same Pod from JSON with serde_json alone;
//! - a GetStatus / IsDeleted round trip over loopback HTTP/2 (validation, the actor hop,
//!   the reply) against a `grpc.health.v1.Health/Check` on the same connection.
//!
//! Run: `cargo bench --bench grpc_edge` (plain timing loops: median of 15 samples).
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use spark_pod_allocator::allocator::pod_policy::PodPolicy;
use spark_pod_allocator::grpc::{ServeSettings, StartDefaults, validate};
use spark_pod_allocator::proto;
use test_kit::grpc::Harness;

const SAMPLES: usize = 15;

/// A realistic executor template: resources, env, volumes, tolerations.
const TEMPLATE_YAML: &str = r#"apiVersion: v1
kind: Pod
metadata:
  labels:
    team: analytics
    cost-center: "42"
  annotations:
    prometheus.io/scrape: "true"
spec:
  serviceAccountName: default
  tolerations:
  - key: spark
    operator: Equal
    value: executors
    effect: NoSchedule
  containers:
  - name: spark-kubernetes-executor
    image: apache/spark:4.0.0
    imagePullPolicy: IfNotPresent
    env:
    - name: SPARK_LOCAL_DIRS
      value: /tmp/spark
    - name: JAVA_TOOL_OPTIONS
      value: -XX:+UseG1GC
    resources:
      requests: {cpu: "2", memory: 8Gi}
      limits: {memory: 8Gi}
    volumeMounts:
    - name: scratch
      mountPath: /tmp/spark
  volumes:
  - name: scratch
    emptyDir: {sizeLimit: 20Gi}
"#;

/// Median time of one call of `f`, over `SAMPLES` samples of `iterations` calls.
fn median_per_call(iterations: u32, mut f: impl FnMut()) -> Duration {
    let mut samples: Vec<Duration> = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                f();
            }
            start.elapsed() / iterations
        })
        .collect();
    samples.sort();
    samples[SAMPLES / 2]
}

async fn median_per_call_async<F, Fut>(iterations: u32, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        for _ in 0..iterations {
            f().await;
        }
        samples.push(start.elapsed() / iterations);
    }
    samples.sort();
    samples[SAMPLES / 2]
}

fn report(name: &str, subject: Duration, baseline_name: &str, baseline: Duration) {
    let ratio = subject.as_secs_f64() / baseline.as_secs_f64();
    println!(
        "{name:<44} {:>10.1} µs   {baseline_name} {:>8.1} µs   ratio {ratio:>6.2}",
        subject.as_secs_f64() * 1e6,
        baseline.as_secs_f64() * 1e6
    );
}

fn bench_validation() {
    let template_json =
        serde_json::to_string(&serde_yaml::from_str::<Pod>(TEMPLATE_YAML).expect("template"))
            .expect("json");
    let request = proto::StartRequest {
        application_id: "spark-0123456789abcdef".into(),
        namespace: "analytics".into(),
        driver_pod_name: "spark-0123456789abcdef-driver".into(),
        executor_pod_template: TEMPLATE_YAML.into(),
        pod_name_prefix: "nightly-etl".into(),
        settings: Some(proto::AllocationSettings {
            batch_size: Some(20),
            batch_delay_ms: Some(500),
            max_pending_pods: Some(200),
            ..Default::default()
        }),
        resource_profile_templates: HashMap::from([(1, template_json.clone())]),
        executor_claim_templates: Vec::new(),
    };
    let defaults = StartDefaults::default();
    // What the edge does with a Start once it is authorized.
    let validate_start = |req: proto::StartRequest| {
        let target = validate::start_target(&req)?;
        validate::start(req, target, &defaults, &PodPolicy::default())
    };
    let baseline = median_per_call(200, || {
        // Two templates, as the request carries two.
        black_box(serde_json::from_str::<Pod>(black_box(&template_json)).ok());
        black_box(serde_json::from_str::<Pod>(black_box(&template_json)).ok());
    });
    let yaml_and_json = median_per_call(200, || {
        black_box(validate_start(black_box(request.clone())).ok());
    });
    report(
        "validate Start (YAML + JSON templates)",
        yaml_and_json,
        "2x serde_json Pod",
        baseline,
    );
    let json_only = proto::StartRequest {
        executor_pod_template: template_json.clone(),
        ..request.clone()
    };
    let json = median_per_call(200, || {
        black_box(validate_start(black_box(json_only.clone())).ok());
    });
    report(
        "validate Start (2 JSON templates)",
        json,
        "2x serde_json Pod",
        baseline,
    );
    let mut bad = request.clone();
    bad.settings = Some(proto::AllocationSettings {
        batch_delay_ms: Some(50),
        ..Default::default()
    });
    let refused = median_per_call(200, || {
        black_box(validate_start(black_box(bad.clone())).err());
    });
    report(
        "validate Start refused (batch_delay_ms=50)",
        refused,
        "2x serde_json Pod",
        baseline,
    );
}

async fn bench_round_trips() {
    // Simulator (manual kubelet) + service + gRPC server on loopback, and a client.
    let mut harness =
        Harness::start_with(test_kit::sim::manual_settings(), ServeSettings::default()).await;
    let mut client = harness.client.clone();
    let channel = harness.channel.clone();
    let health = HealthClient::new(channel);
    client
        .start(proto::StartRequest {
            application_id: "spark-bench".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE_YAML.into(),
            ..Default::default()
        })
        .await
        .expect("start");

    let baseline = median_per_call_async(300, || {
        let mut health = health.clone();
        async move {
            black_box(
                health
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .ok(),
            );
        }
    })
    .await;
    let status = median_per_call_async(300, || {
        let mut client = client.clone();
        async move {
            black_box(
                client
                    .get_status(proto::GetStatusRequest {
                        application_id: "spark-bench".into(),
                    })
                    .await
                    .ok(),
            );
        }
    })
    .await;
    report("GetStatus round trip", status, "Health/Check", baseline);
    let is_deleted = median_per_call_async(300, || {
        let mut client = client.clone();
        async move {
            black_box(
                client
                    .is_deleted(proto::IsDeletedRequest {
                        application_id: "spark-bench".into(),
                        executor_id: "17".into(),
                    })
                    .await
                    .ok(),
            );
        }
    })
    .await;
    report("IsDeleted round trip", is_deleted, "Health/Check", baseline);
    let refused = median_per_call_async(300, || {
        let mut client = client.clone();
        async move {
            black_box(
                client
                    .is_deleted(proto::IsDeletedRequest {
                        application_id: "spark-bench".into(),
                        executor_id: "seventeen".into(),
                    })
                    .await
                    .err(),
            );
        }
    })
    .await;
    report(
        "IsDeleted refused (non-numeric id)",
        refused,
        "Health/Check",
        baseline,
    );

    client
        .stop(proto::StopRequest {
            application_id: "spark-bench".into(),
        })
        .await
        .expect("stop");
    harness.stop_server().await;
}

fn main() {
    // `cargo test --benches` runs bench targets with `--bench` absent: keep that quick.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!("gRPC edge benchmarks (median of {SAMPLES} samples)");
    bench_validation();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(bench_round_trips());
}
