//! Helpers for tests that run the service binary as a process and read its JSON log lines.
#![allow(dead_code)]

use std::time::Duration;

use tokio::io::{BufReader, Lines};
use tokio::process::ChildStderr;

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
