//! Bounded waiting for an observable condition: the one polling helper of the tests (never
//! a fixed sleep, never a timing assertion).

use std::time::Duration;

/// How long a condition may take before the test fails: a generous bound against a hang,
/// not a timing assertion.
pub const BOUND: Duration = Duration::from_secs(30);

/// How often a condition is checked again.
const POLL: Duration = Duration::from_millis(20);

/// Polls `check` until it returns `Some`, for at most [`BOUND`]; panics with `what` otherwise.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("condition not reached within {BOUND:?}: {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for a yes/no condition.
pub async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    eventually(what, async || check().await.then_some(())).await
}
