//! `serve --simulate` with `metrics.listen` set, as a platform team scrapes it: after a
//! scale-up the pods created, the gRPC calls by method and code and the active
//! applications read back from `/metrics`; after Stop, the pods it deleted. At the
//! defaults no metric names an application; with `metrics.application_labels` the
//! executor gauges are per application. The chart's alerts and example dashboard use only
//! metrics and labels such a scrape has, and the alerts no application label.
use test_kit::grpc::TEMPLATE;
use test_kit::process::{
    HANG_GUARD, SERVE_SIMULATE, connect_serving, service_command, spawn_logged, until_logged,
};

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use promql_parser::parser::{Expr, parse};
use promql_parser::util::{ExprVisitor, walk_expr};
use spark_pod_allocator::proto;
use spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient;
use test_kit::requests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;
use tonic::transport::Channel;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
const START: &str = "/spark.allocator.v1.ExecutorAllocator/Start";
const SET_TOTAL: &str = "/spark.allocator.v1.ExecutorAllocator/SetTotalExpected";

/// One HTTP/1.1 request with a JSON body (or none); returns the response's head and body.
async fn http(address: &str, method: &str, path: &str, body: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_string(), body.to_string())
}

/// `GET /metrics`; returns the body.
async fn scrape(address: &str) -> String {
    let (head, body) = http(address, "GET", "/metrics", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("application/openmetrics-text"), "{head}");
    body
}

/// `serve --simulate` with metrics on a free port, and its addresses.
struct Service {
    child: Child,
    metrics: String,
    grpc: String,
    /// The simulated API server (`http://…`), which also serves `/sim/faults`.
    api_server: String,
}

async fn start_service(env: &[(&str, &str)]) -> Service {
    let mut command = service_command(BIN, SERVE_SIMULATE);
    command.env("SPARK_POD_ALLOCATOR__METRICS__LISTEN", "127.0.0.1:0");
    for (key, value) in env {
        command.env(key, value);
    }
    let (child, mut lines) = spawn_logged(command);
    let api_server = until_logged(&mut lines, "simulated cluster started").await["api_server"]
        .as_str()
        .expect("API server address")
        .trim_end_matches('/')
        .to_string();
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
    Service {
        child,
        metrics,
        grpc,
        api_server,
    }
}

async fn client(grpc: &str) -> ExecutorAllocatorClient<Channel> {
    connect_serving(grpc).await
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
    until_scraped(address, series, |value| value == want).await
}

/// Scrapes until `series` has a value that `accept`s.
async fn until_scraped(address: &str, series: &str, accept: impl Fn(f64) -> bool) -> String {
    let wait = async {
        loop {
            let text = scrape(address).await;
            if sample(&text, series).is_some_and(&accept) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    match tokio::time::timeout(HANG_GUARD, wait).await {
        Ok(text) => text,
        Err(_) => panic!(
            "{series} never reached the value waited for; last scrape:\n{}",
            scrape(address).await
        ),
    }
}

/// At the defaults a scrape names no application anywhere, while the executor gauges still
/// count its executors (summed); with `metrics.application_labels` they name it. The
/// chart's alerts neither match nor group by an application's labels, and its dashboard's
/// "All" applications also matches series that have none.
#[tokio::test]
async fn only_the_operators_setting_puts_application_ids_in_the_scrape() {
    const APP: &str = "spark-tenant-secret-name";
    for labelled in [false, true] {
        let env: &[(&str, &str)] = if labelled { &[APPLICATION_LABELS] } else { &[] };
        let Service {
            mut child,
            metrics,
            grpc,
            ..
        } = start_service(env).await;
        let mut client = client(&grpc).await;
        client
            .start(proto::StartRequest {
                application_id: APP.into(),
                namespace: "default".into(),
                executor_pod_template: TEMPLATE.into(),
                ..Default::default()
            })
            .await
            .expect("start");
        client
            .set_total_expected(targets_request(APP, 2))
            .await
            .expect("scale up");
        let running = if labelled {
            format!("spark_pod_allocator_executors_running{{application=\"{APP}\",profile=\"0\"}}")
        } else {
            "spark_pod_allocator_executors_running".to_string()
        };
        let text = until_sample(&metrics, &running, 2.0).await;
        assert_eq!(
            sample(&text, "spark_pod_allocator_executor_pods_created_total"),
            Some(2.0),
            "{text}"
        );
        assert_eq!(text.contains(APP), labelled, "{text}");
        assert_eq!(text.contains("application="), labelled, "{text}");
        if !labelled {
            assert_eq!(
                sample(&text, "spark_pod_allocator_executors_target"),
                Some(2.0),
                "{text}"
            );
        }
        client.stop(stop_request(APP)).await.expect("stop");
        let text = scrape(&metrics).await;
        assert!(!text.contains(APP), "{text}");
        child.start_kill().expect("kill");
    }

    let rules: serde_yaml::Value =
        serde_yaml::from_str(&chart_file("files/prometheus-rules.yaml")).expect("rules YAML");
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let expr = rule["expr"].as_str().expect("expr");
            let parsed = parse(expr).unwrap_or_else(|e| panic!("{e}: {expr}"));
            let mut uses = Uses::default();
            let Ok(_) = walk_expr(&mut uses, &parsed);
            for label in ["application", "profile"] {
                assert!(
                    !uses.grouped.contains(label)
                        && !uses.matched.iter().any(|(_, matched)| matched == label),
                    "{:?}: {label} is there only with metrics.application_labels: {expr}",
                    rule["alert"]
                );
            }
        }
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&chart_file("dashboards/spark-pod-allocator.json"))
            .expect("dashboard JSON");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let application = variables
        .iter()
        .find(|v| v["name"] == "application")
        .expect("the application variable");
    let all = application["allValue"].as_str().expect("allValue");
    assert!(
        all == ".*",
        "\"All\" applications must match series without the label: {all}"
    );
}

fn rpcs(method: &str, code: &str) -> String {
    format!("spark_pod_allocator_grpc_requests_total{{method=\"{method}\",code=\"{code}\"}}")
}

/// `metrics.application_labels` on, as an environment variable.
const APPLICATION_LABELS: (&str, &str) =
    ("SPARK_POD_ALLOCATOR__METRICS__APPLICATION_LABELS", "true");

#[tokio::test]
async fn a_scale_up_and_a_stop_read_back_from_metrics() {
    let Service {
        mut child,
        metrics,
        grpc,
        ..
    } = start_service(&[APPLICATION_LABELS]).await;

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

    let mut client = client(&grpc).await;
    client
        .start(proto::StartRequest {
            application_id: "spark-metrics".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("start");
    client
        .set_total_expected(targets_request("spark-metrics", 3))
        .await
        .expect("set total expected");
    let unknown = client
        .set_total_expected(targets_request("nobody", 1))
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
        .stop(stop_request("spark-metrics"))
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

/// Labels Prometheus adds to every series of a target (a PodMonitor's or a
/// ServiceMonitor's), which alerts and dashboards may group and match by.
const TARGET_LABELS: [&str; 7] = [
    "namespace",
    "job",
    "instance",
    "pod",
    "service",
    "container",
    "endpoint",
];

/// Each sample name of `text` (OpenMetrics) with the label names its samples carry.
fn exposed_series(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut series: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = series.entry(line[..end].to_string()).or_default();
        let Some(mut rest) = line[end..].strip_prefix('{') else {
            continue;
        };
        // name="value" pairs; values may hold escaped quotes.
        while let Some((name, after)) = rest.split_once("=\"") {
            labels.insert(name.trim_start_matches(',').to_string());
            let mut escaped = false;
            let close = after
                .char_indices()
                .find(|&(_, c)| {
                    let end = c == '"' && !escaped;
                    escaped = c == '\\' && !escaped;
                    end
                })
                .map(|(i, _)| i)
                .expect("a closed label value");
            rest = &after[close + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    series
}

/// The metric names, the label names matched per metric, and the grouping and
/// vector-matching label names of one PromQL expression.
#[derive(Default)]
struct Uses {
    metrics: BTreeSet<String>,
    matched: BTreeSet<(String, String)>,
    grouped: BTreeSet<String>,
}

impl ExprVisitor for Uses {
    type Error = std::convert::Infallible;

    fn pre_visit(&mut self, expr: &Expr) -> Result<bool, Self::Error> {
        let selector = match expr {
            Expr::VectorSelector(vs) => Some(vs),
            Expr::MatrixSelector(ms) => Some(&ms.vs),
            _ => None,
        };
        if let Some(vs) = selector {
            let name = vs.name.clone().expect("selectors name their metric");
            for matcher in &vs.matchers.matchers {
                self.matched.insert((name.clone(), matcher.name.clone()));
            }
            self.metrics.insert(name);
        }
        let modifier = match expr {
            Expr::Aggregate(a) => a.modifier.as_ref(),
            Expr::Binary(b) => b.modifier.as_ref().and_then(|m| m.matching.as_ref()),
            _ => None,
        };
        if let Some(modifier) = modifier {
            self.grouped
                .extend(modifier.labels().labels.iter().cloned());
        }
        Ok(true)
    }
}

/// Parses `expr` (PromQL; Grafana's `$__rate_interval` stands for a range) and checks that
/// every metric it reads is in `exposed`, with every label it matches or groups by.
fn check_expression(
    origin: &str,
    expr: &str,
    exposed: &BTreeMap<String, BTreeSet<String>>,
) -> Uses {
    let promql = expr.replace("$__rate_interval", "5m");
    let parsed = parse(&promql).unwrap_or_else(|e| panic!("{origin}: {e}\n{promql}"));
    let mut uses = Uses::default();
    let Ok(_) = walk_expr(&mut uses, &parsed);
    assert!(
        !uses.metrics.is_empty(),
        "{origin}: reads no metric: {expr}"
    );
    let mut labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
    for metric in &uses.metrics {
        let carried = exposed.get(metric).unwrap_or_else(|| {
            panic!(
                "{origin}: {metric} is not in the scrape; it has {:?}",
                exposed.keys()
            )
        });
        labels.extend(carried.iter().map(String::as_str));
    }
    for (metric, label) in &uses.matched {
        assert!(
            TARGET_LABELS.contains(&label.as_str()) || exposed[metric].contains(label),
            "{origin}: {metric} has no label {label}: {expr}"
        );
    }
    for label in &uses.grouped {
        assert!(
            labels.contains(label.as_str()),
            "{origin}: groups or matches by {label}, which none of its metrics has: {expr}"
        );
    }
    uses
}

fn chart_file(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("helm/spark-pod-allocator")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The chart's alerts (files/prometheus-rules.yaml) and its dashboard
/// (dashboards/spark-pod-allocator.json) read only metrics and labels that the service
/// exposes, checked against real scrapes: after a scale-up, creates refused 403 by a
/// quota, a watch that got 410 Gone and relisted, and a Stop (a metric family shows in
/// a scrape only once it has a sample).
#[tokio::test]
async fn the_charts_alerts_and_dashboard_read_exposed_metrics() {
    let Service {
        mut child,
        metrics,
        grpc,
        api_server,
    } = start_service(&[
        // Watches end after a second, so a re-watch after compaction gets 410.
        (
            "SPARK_POD_ALLOCATOR__SIMULATOR__FAULTS__WATCH_CLOSE_AFTER_SECONDS",
            "1",
        ),
        // The dashboard's per-application panels read them when the operator has them.
        APPLICATION_LABELS,
    ])
    .await;
    let api = api_server
        .strip_prefix("http://")
        .expect("an http:// API server")
        .to_string();
    let mut client = client(&grpc).await;
    client
        .start(proto::StartRequest {
            application_id: "spark-alerts".into(),
            namespace: "default".into(),
            executor_pod_template: TEMPLATE.into(),
            ..Default::default()
        })
        .await
        .expect("start");
    let scale_to = |n: u32| targets_request("spark-alerts", n);
    client
        .set_total_expected(scale_to(2))
        .await
        .expect("scale up");
    until_sample(
        &metrics,
        "spark_pod_allocator_executors_running{application=\"spark-alerts\",profile=\"0\"}",
        2.0,
    )
    .await;

    // Every create is refused by a quota from now on.
    let (head, body) = http(
        &api,
        "PUT",
        "/sim/faults",
        r#"{"watch_close_after_seconds": 1, "quota_fraction": 1.0}"#,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    client
        .set_total_expected(scale_to(3))
        .await
        .expect("scale up");
    until_scraped(
        &metrics,
        "spark_pod_allocator_executor_pod_create_failures_total{status=\"403\",reason=\"Forbidden\"}",
        |n| n >= 1.0,
    )
    .await;

    // A change the pod watch does not see, then the history compacted: the re-watch
    // from the watch's last version gets 410 Gone and relists.
    let (head, body) = http(
        &api,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "version-bump"}}"#,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 201"), "{head}\n{body}");
    let (head, body) = http(&api, "POST", "/sim/compact", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
    let running = until_scraped(
        &metrics,
        "spark_pod_allocator_watch_errors_total{status=\"410\"}",
        |n| n >= 1.0,
    )
    .await;
    client
        .stop(stop_request("spark-alerts"))
        .await
        .expect("stop");
    let stopped = until_scraped(
        &metrics,
        "spark_pod_allocator_executor_pods_deleted_total{reason=\"stop\"}",
        |n| n >= 2.0,
    )
    .await;
    let mut exposed = exposed_series(&running);
    for (name, labels) in exposed_series(&stopped) {
        exposed.entry(name).or_default().extend(labels);
    }

    // The alerts: each parses, reads exposed metrics, and carries what routing and
    // notifications need; the schema's disabledAlerts names exactly them.
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&chart_file("files/prometheus-rules.yaml")).expect("rules YAML");
    let mut alerts = Vec::new();
    let mut read = BTreeSet::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let alert = rule["alert"].as_str().expect("an alert name").to_string();
            let expr = rule["expr"].as_str().expect("expr");
            read.extend(check_expression(&alert, expr, &exposed).metrics);
            assert!(
                ["warning", "critical", "info"]
                    .contains(&rule["labels"]["severity"].as_str().unwrap_or("")),
                "{alert}: severity"
            );
            for annotation in ["summary", "description"] {
                assert!(
                    rule["annotations"][annotation]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "{alert}: {annotation}"
                );
            }
            alerts.push(alert);
        }
    }
    assert!(alerts.len() >= 8, "{alerts:?}");
    let schema: serde_json::Value =
        serde_json::from_str(&chart_file("values.schema.json")).expect("schema JSON");
    let disabled = &schema["properties"]["metrics"]["properties"]["prometheusRule"]["properties"]["disabledAlerts"]
        ["items"]["enum"];
    assert_eq!(*disabled, serde_json::json!(alerts), "values.schema.json");

    // The dashboard: every panel's query and every variable's label_values().
    let dashboard: serde_json::Value =
        serde_json::from_str(&chart_file("dashboards/spark-pod-allocator.json"))
            .expect("dashboard JSON");
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a panel title");
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            read.extend(check_expression(title, expr, &exposed).metrics);
            queries += 1;
        }
    }
    assert!(queries >= 20, "{queries} dashboard queries");
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let Some(query) = variable["query"]["query"].as_str() else {
            continue;
        };
        let (selector, label) = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(", "))
            .unwrap_or_else(|| panic!("a label_values query: {query}"));
        let uses = check_expression(query, selector, &exposed);
        let metric = uses.metrics.first().expect("a metric");
        assert!(
            TARGET_LABELS.contains(&label) || exposed[metric].contains(label),
            "{query}: {metric} has no label {label}"
        );
    }
    // Between them they read every metric family the service has.
    for family in [
        "grpc_requests_total",
        "grpc_request_duration_seconds_bucket",
        "executor_pods_created_total",
        "executor_pods_deleted_total",
        "executor_pod_create_failures_total",
        "applications_active",
        "executors_target",
        "executors_running",
        "executors_pending",
        "executors_newly_created",
        "applications_unexported",
        "rate_limit_wait_seconds_bucket",
        "executor_seen_seconds_bucket",
        "executor_running_seconds_bucket",
        "watch_events_total",
        "watch_relists_total",
        "watch_errors_total",
        "resync_duration_seconds_bucket",
        "build_info",
    ] {
        let name = format!("spark_pod_allocator_{family}");
        assert!(
            read.contains(&name),
            "neither the alerts nor the dashboard read {name}"
        );
    }
    child.start_kill().expect("kill");
}
