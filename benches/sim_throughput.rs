//! Throughput of the simulated cluster through kube-rs over real HTTP: pod creates per
//! second with several watchers open, up to 10,000 live pods, against a baseline measured in
//! the same run (GET /version round trips per second at the same concurrency).
//!
//! Run: `cargo bench --bench sim_throughput` (env `SIM_BENCH_PODS`, `SIM_BENCH_WATCHERS`,
//! `SIM_BENCH_CONCURRENCY` override the defaults 10000 / 4 / 64; `SIM_BENCH_TYPED_WATCHERS=1`
//! makes the watchers decode pods).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use spark_pod_allocator_sim::{KubeletMode, SimCluster, SimSettings};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `SIM_BENCH_TYPED_WATCHERS=1`: watchers decode every event into a `Pod` with kube-rs
/// (in this same process, so their decoding competes with the server for the 2 cores).
fn typed_watchers() -> bool {
    std::env::var("SIM_BENCH_TYPED_WATCHERS").is_ok_and(|v| v == "1")
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("exec-{i}"), "labels": {"spark-app-selector": "bench", "spark-role": "executor", "spark-exec-id": i.to_string()}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "spark-kubernetes-executor", "image": "spark:3.5.1",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}}]}
    }))
    .expect("valid pod")
}

async fn baseline(client: &kube::Client, requests: usize, concurrency: usize) -> f64 {
    let start = Instant::now();
    stream::iter(0..requests)
        .map(|_| {
            let c = client.clone();
            async move { c.apiserver_version().await.expect("GET /version") }
        })
        .buffer_unordered(concurrency)
        .for_each(|_| async {})
        .await;
    requests as f64 / start.elapsed().as_secs_f64()
}

struct Run {
    creates_per_s: f64,
    watchers_done: Duration,
    list_all: Duration,
    live: usize,
}

async fn run(mode: KubeletMode, pods_n: usize, watchers: usize, concurrency: usize) -> (f64, Run) {
    let mut settings = SimSettings::default();
    settings.kubelet.mode = mode;
    // Room for every pod, so the kubelet binds and starts all of them.
    settings.kubelet.nodes = 100;
    settings.kubelet.pods_per_node = 110;
    settings.history = 100_000;
    let sim = SimCluster::start(settings).await.expect("sim starts");
    let client = sim.try_client().expect("sim client");
    let base = baseline(&client, 20_000, concurrency).await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let seen = Arc::new(AtomicUsize::new(0));
    let mut watch_tasks = Vec::new();
    for _ in 0..watchers {
        if typed_watchers() {
            let mut events = pods
                .watch(&WatchParams::default().labels("spark-role=executor"), "0")
                .await
                .expect("watch")
                .boxed();
            let seen = seen.clone();
            watch_tasks.push(tokio::spawn(async move {
                let mut added = 0;
                while let Ok(Some(ev)) = events.try_next().await {
                    if let WatchEvent::Added(_) = ev {
                        added += 1;
                        if added == pods_n {
                            seen.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            }));
            continue;
        }
        // Watchers read the event stream through kube-rs's HTTP stack but only look at each
        // line's type: decoding pods is the client's cost, not the simulator's.
        let req = http::Request::get(
            "/api/v1/namespaces/default/pods?watch=true&labelSelector=spark-role%3Dexecutor",
        )
        .body(Vec::new())
        .expect("request");
        let mut lines = client.request_stream(req).await.expect("watch").lines();
        let seen = seen.clone();
        watch_tasks.push(tokio::spawn(async move {
            let mut added = 0;
            while let Ok(Some(line)) = lines.try_next().await {
                if line.starts_with("{\"type\":\"ADDED\"") {
                    added += 1;
                    if added == pods_n {
                        seen.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }));
    }

    let start = Instant::now();
    stream::iter(0..pods_n)
        .map(|i| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &pod(i))
                    .await
                    .expect("create")
            }
        })
        .buffer_unordered(concurrency)
        .for_each(|_| async {})
        .await;
    let create_time = start.elapsed();
    while seen.load(Ordering::SeqCst) < watchers {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let watchers_done = start.elapsed();
    let t = Instant::now();
    let live = pods
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .len();
    let list_all = t.elapsed();
    for t in watch_tasks {
        t.abort();
    }
    sim.shutdown().await;
    (
        base,
        Run {
            creates_per_s: pods_n as f64 / create_time.as_secs_f64(),
            watchers_done,
            list_all,
            live,
        },
    )
}

fn main() {
    let pods_n = env_or("SIM_BENCH_PODS", 10_000);
    let watchers = env_or("SIM_BENCH_WATCHERS", 4);
    let concurrency = env_or("SIM_BENCH_CONCURRENCY", 64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "simulated cluster throughput: {pods_n} pod creates, {watchers} {} watchers, concurrency {concurrency}, {} cores",
        if typed_watchers() {
            "typed (Pod-decoding)"
        } else {
            "line-counting"
        },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    for mode in [KubeletMode::Manual, KubeletMode::Auto] {
        let (base, r) = rt.block_on(run(mode, pods_n, watchers, concurrency));
        println!(
            "kubelet {mode:?}: creates/s {:.0} | baseline GET /version/s {:.0} | ratio creates/baseline {:.2} | all {watchers} watchers saw every ADDED after {:.2} s | list of {} live pods {:.0} ms",
            r.creates_per_s,
            base,
            r.creates_per_s / base,
            r.watchers_done.as_secs_f64(),
            r.live,
            r.list_all.as_secs_f64() * 1000.0
        );
    }
}
