//! Waiting for an observable condition: the one polling helper of the tests (never a fixed
//! sleep, never a timing assertion). Two bounds against a hang, neither a guess of machine
//! speed where the test can see the work move:
//!
//! - [`progressing`], [`until_progress`]: the condition is on an observed quantity (executor
//!   ids, Lease holders); the wait fails only once that quantity has not changed for
//!   [`STALL`], so a loaded machine that is slow but moving passes, and a hang fails one
//!   [`STALL`] after its last move. [`LIMIT`] stops a livelock (a quantity that moves for
//!   ever without reaching the condition).
//! - [`eventually`], [`until`]: a condition with nothing to watch on its way (one event, an
//!   answer): fails after [`BOUND`].

use std::fmt::Debug;
use std::time::Duration;

use tokio::time::Instant;

/// How long a condition with nothing to watch may take: a generous bound against a hang,
/// not a timing assertion.
pub const BOUND: Duration = Duration::from_secs(30);

/// How long a call that must not be starved (a health check, a new client, an authenticated
/// caller) may take while an attack runs: an attack that starves the server (a blocked
/// runtime, a full connection table, a queue behind a stalled API server) holds the call
/// for the attack's seconds or its deadline, while a loaded machine's scheduling delays
/// stay well below it. The typical figure (a few ms idle) is printed, not asserted.
pub const NOT_STARVED: Duration = Duration::from_secs(1);

/// How long an observed quantity may stay unchanged before the wait counts it as stuck.
pub const STALL: Duration = Duration::from_secs(30);

/// The longest a moving quantity is waited for: against a livelock only, far above what
/// any test's work takes on a loaded machine.
pub const LIMIT: Duration = Duration::from_secs(600);

/// The first interval between two checks; it doubles while nothing changes, up to
/// [`LAST_POLL`], so a long wait on an expensive check (one LIST per application) does not
/// load the machine it waits on.
const FIRST_POLL: Duration = Duration::from_millis(20);
const LAST_POLL: Duration = Duration::from_millis(200);

fn next(poll: Duration) -> Duration {
    poll.saturating_mul(2).min(LAST_POLL)
}

/// Polls `check` until it returns `Some`, for at most [`BOUND`]; panics with `what` otherwise.
pub async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + BOUND;
    let mut poll = FIRST_POLL;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("condition not reached within {BOUND:?}: {what}");
        }
        tokio::time::sleep(poll).await;
        poll = next(poll);
    }
}

/// [`eventually`] for a yes/no condition.
pub async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    eventually(what, async || check().await.then_some(())).await
}

/// Observes a quantity until `done` holds for it: `Ok` with that observation, or `Err` with
/// the last one once it has not changed for [`STALL`] (or after [`LIMIT`]).
pub async fn progressing<P: PartialEq>(
    mut observe: impl AsyncFnMut() -> P,
    mut done: impl FnMut(&P) -> bool,
) -> Result<P, P> {
    let began = Instant::now();
    let mut last = observe().await;
    let mut moved = Instant::now();
    let mut poll = FIRST_POLL;
    loop {
        if done(&last) {
            return Ok(last);
        }
        if moved.elapsed() > STALL || began.elapsed() > LIMIT {
            return Err(last);
        }
        tokio::time::sleep(poll).await;
        let now = observe().await;
        if now == last {
            poll = next(poll);
        } else {
            (last, moved, poll) = (now, Instant::now(), FIRST_POLL);
        }
    }
}

/// [`progressing`] that panics with `what` and the last observation on a stall.
pub async fn until_progress<P: PartialEq + Debug>(
    what: &str,
    observe: impl AsyncFnMut() -> P,
    done: impl FnMut(&P) -> bool,
) -> P {
    match progressing(observe, done).await {
        Ok(reached) => reached,
        Err(last) => panic!(
            "condition not reached, its quantity unchanged for {STALL:?} (or moving for \
             {LIMIT:?}): {what}; last seen {last:?}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whole seconds of (paused) time since `began`.
    fn seconds(began: Instant) -> u64 {
        began.elapsed().as_secs()
    }

    #[tokio::test(start_paused = true)]
    async fn a_quantity_that_stands_still_fails_one_stall_after_its_last_move() {
        let began = Instant::now();
        // Moves each second for 10 s, then stands still.
        let stalled = progressing(async || seconds(began).min(10), |_| false).await;
        assert_eq!(stalled, Err(10));
        let waited = began.elapsed();
        assert!(
            waited > Duration::from_secs(10) + STALL && waited < Duration::from_secs(11) + STALL,
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quantity_that_moves_is_waited_for_longer_than_a_fixed_bound() {
        let began = Instant::now();
        // One step every 20 s: each step within STALL, the whole far beyond BOUND.
        let reached = progressing(async || seconds(began) / 20, |step| *step >= 6).await;
        assert_eq!(reached, Ok(6));
        assert!(began.elapsed() > BOUND.saturating_mul(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_quantity_moving_for_ever_fails_at_the_limit() {
        let began = Instant::now();
        let livelock = progressing(async || began.elapsed(), |_| false).await;
        assert!(livelock.is_err());
        let waited = began.elapsed();
        assert!(
            waited > LIMIT && waited < LIMIT + Duration::from_secs(1),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "the test's quantity; last seen 3")]
    async fn until_progress_names_the_condition_and_the_last_observation() {
        until_progress("the test's quantity", async || 3, |n| *n > 3).await;
    }
}
