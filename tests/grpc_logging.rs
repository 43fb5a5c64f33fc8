//! The log lines an operator reads, from a real `serve --simulate` process at the default
//! level: a client's mistake is logged at info naming the request field, and every line of
//! a call carries its request id (the client's `x-request-id`, else a generated one).
use std::time::Duration;

use spark_pod_allocator::proto;
use test_kit::process::{SERVE_SIMULATE, connect_serving, service_command, spawn_logged};
use test_kit::requests::*;
use tokio::io::{BufReader, Lines};
use tokio::process::ChildStderr;

const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");
/// Guards against a hang only; every wait ends on output or exit, not on time.
const HANG_GUARD: Duration = Duration::from_secs(60);

/// Reads JSON log lines until one has `message`; returns the whole line.
async fn until_logged(
    lines: &mut Lines<BufReader<ChildStderr>>,
    message: &str,
) -> serde_json::Value {
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                panic!("not a JSON log line: {line}");
            };
            if entry["fields"]["message"] == message {
                return entry;
            }
        }
        panic!("the process ended before logging {message:?}");
    };
    tokio::time::timeout(HANG_GUARD, wait)
        .await
        .expect("log line")
}

/// The `request_id` of the line's enclosing `request` span.
fn request_id(entry: &serde_json::Value) -> String {
    let spans = entry["spans"].as_array().expect("spans");
    let request = spans
        .iter()
        .find(|span| span["name"] == "request")
        .unwrap_or_else(|| panic!("no request span: {entry}"));
    request["request_id"]
        .as_str()
        .expect("request_id")
        .to_string()
}

#[tokio::test]
async fn client_mistakes_are_logged_at_info_with_their_field_and_request_id() {
    let (_child, mut lines) = spawn_logged(service_command(BIN, SERVE_SIMULATE));
    let serving = until_logged(&mut lines, "serving gRPC").await;
    let address = serving["fields"]["address"].as_str().expect("address");
    let mut client = connect_serving(address).await;

    // INVALID_ARGUMENT, with the client's request id (cut to what is safe in a log line).
    let mut start = tonic::Request::new(proto::StartRequest {
        application_id: "spark-logged".into(),
        namespace: "default".into(),
        settings: Some(proto::AllocationSettings {
            batch_size: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    });
    start.metadata_mut().insert(
        "x-request-id",
        "driver-7/start \"1\"".parse().expect("ascii"),
    );
    let status = client.start(start).await.expect_err("invalid");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let refused = until_logged(&mut lines, "refused").await;
    assert_eq!(refused["level"], "INFO", "{refused}");
    assert_eq!(refused["fields"]["code"], "INVALID_ARGUMENT", "{refused}");
    assert_eq!(
        refused["fields"]["field"], "settings.batch_size",
        "{refused}"
    );
    assert_eq!(
        refused["fields"]["detail"], "settings.batch_size: must be greater than 0",
        "{refused}"
    );
    assert_eq!(request_id(&refused), "driver-7/start1");
    assert_eq!(refused["span"]["method"], "Start", "{refused}");

    // NOT_FOUND, without a request id: one is generated, new for each call.
    let mut generated = Vec::new();
    for _ in 0..2 {
        let status = client
            .get_status(status_request("spark-unknown"))
            .await
            .expect_err("unknown application");
        assert_eq!(status.code(), tonic::Code::NotFound);
        let refused = until_logged(&mut lines, "refused").await;
        assert_eq!(refused["level"], "INFO", "{refused}");
        assert_eq!(refused["fields"]["code"], "NOT_FOUND", "{refused}");
        assert_eq!(refused["fields"]["field"], "application_id", "{refused}");
        let id = request_id(&refused);
        assert!(
            id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        generated.push(id);
    }
    assert_ne!(generated[0], generated[1]);
}

/// Reads JSON log lines until one has `message`; returns every line read (raw) and that one.
async fn lines_until(
    lines: &mut Lines<BufReader<ChildStderr>>,
    message: &str,
) -> (Vec<String>, serde_json::Value) {
    let mut read = Vec::new();
    let wait = async {
        while let Some(line) = lines.next_line().await.expect("stderr") {
            read.push(line.clone());
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
                panic!("not a JSON log line: {line}");
            };
            if entry["fields"]["message"] == message {
                return entry;
            }
        }
        panic!("the process ended before logging {message:?}");
    };
    let entry = tokio::time::timeout(HANG_GUARD, wait)
        .await
        .expect("log line");
    (read, entry)
}

/// An operator reads plain values in the log, not Rust's Debug text (`Some("…")`,
/// `ExecutorId(3)`): the start-up lines (the address the other replicas forward to, the
/// authentication mode as configured) and the warning of creates refused by a quota.
#[tokio::test]
async fn log_lines_carry_plain_values_not_rust_debug_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[simulator.faults]\nquota_fraction = 1.0\n").expect("config");
    let mut args = vec!["--config", config.to_str().expect("utf-8 path")];
    args.extend_from_slice(SERVE_SIMULATE);
    let (_child, mut lines) = spawn_logged(service_command(BIN, &args));
    let (mut read, serving) = lines_until(&mut lines, "serving gRPC").await;
    let address = serving["fields"]["address"].as_str().expect("address");
    let forward = read
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| {
            entry["fields"]["message"]
                == "where the other replicas forward this replica's applications' calls"
        })
        .expect("the forwarding address is logged");
    assert_eq!(forward["fields"]["advertise_address"], address, "{forward}");
    let mode = read
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|entry| entry["fields"]["message"] == "authentication")
        .expect("the authentication mode is logged");
    assert_eq!(mode["fields"]["mode"], "none", "{mode}");

    let mut client = connect_serving(address).await;
    client
        .start(test_kit::grpc::start_request("spark-plain", "default"))
        .await
        .expect("start");
    client
        .set_total_expected(targets_request("spark-plain", 2))
        .await
        .expect("target");
    let (more, refused) = lines_until(
        &mut lines,
        "every executor pod create sent failed; backing off",
    )
    .await;
    read.extend(more);
    assert_eq!(refused["level"], "WARN", "{refused}");
    let error = refused["fields"]["error"].as_str().expect("error");
    assert!(error.contains("exceeded quota"), "{refused}");
    for line in &read {
        assert!(
            !line.contains("Some(") && !line.contains("ExecutorId("),
            "Rust Debug text in a log line: {line}"
        );
    }
}
