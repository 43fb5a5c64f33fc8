//! Time, at the bottom of the dependency graph: the wall-clock [`Timestamp`] the engine
//! computes with and the [`Clock`] injected into the watches and application actors (the
//! system clock in service, a manual clock in tests: time moves only when a test advances it).
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

/// Wall-clock milliseconds since the Unix epoch. Injected by the caller so the engine
/// stays deterministic; wall clock because pod creationTimestamps are wall clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// Milliseconds elapsed from `earlier` to `self` (negative if `earlier` is later).
    pub fn millis_since(self, earlier: Timestamp) -> i64 {
        self.0.saturating_sub(earlier.0)
    }

    /// `d` later, saturating: a deadline from a configured period never overflows.
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_ms(d)))
    }
}

/// `d` in whole milliseconds, saturating at `i64::MAX`.
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Time source of the actors.
pub trait Clock: Send + Sync + 'static {
    /// Now, as wall-clock milliseconds.
    fn now(&self) -> Timestamp;
    /// Resolves once `now() >= deadline`.
    fn sleep_until(
        &self,
        deadline: Timestamp,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// The real clock.
#[derive(Debug, Clone, Default)]
pub struct SystemClock;

impl SystemClock {
    fn wall_now() -> Timestamp {
        // A clock before 1970 is treated as the epoch; it cannot happen on a sane host.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Timestamp(i64::try_from(ms).unwrap_or(i64::MAX))
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Self::wall_now()
    }

    fn sleep_until(
        &self,
        deadline: Timestamp,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        Box::pin(async move {
            // Wall-clock deadline: re-check after waking in case the clock was stepped.
            loop {
                let left = deadline.millis_since(Self::wall_now());
                if left <= 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(left.unsigned_abs())).await;
            }
        })
    }
}

/// A clock that moves only when told to; every sleeper whose deadline is passed wakes.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<watch::Sender<Timestamp>>,
}

impl ManualClock {
    /// A clock reading `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            now: Arc::new(watch::Sender::new(start)),
        }
    }

    /// A clock starting at the current wall-clock time (so pod creationTimestamps written
    /// by a real API server compare sensibly with it).
    pub fn starting_now() -> Self {
        Self::new(SystemClock::wall_now())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now.send_modify(|t| *t = t.plus(by));
    }

    /// Sets the clock to `to` (may go backwards; sleepers already woken stay woken).
    pub fn set(&self, to: Timestamp) {
        self.now.send_replace(to);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.borrow()
    }

    fn sleep_until(
        &self,
        deadline: Timestamp,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + 'static>> {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            // The sender lives as long as any clone of the clock; if all are gone, time
            // never moves again and the sleeper never wakes.
            if rx.wait_for(|now| *now >= deadline).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn manual_sleep_wakes_only_when_advanced_past_deadline() {
        let clock = ManualClock::new(Timestamp(1_000));
        let mut sleep = clock.sleep_until(Timestamp(2_000));
        assert!((&mut sleep).now_or_never().is_none());
        clock.advance(Duration::from_millis(999));
        assert_eq!(clock.now(), Timestamp(1_999));
        assert!((&mut sleep).now_or_never().is_none());
        clock.advance(Duration::from_millis(1));
        tokio::time::timeout(Duration::from_secs(5), sleep)
            .await
            .expect("sleeper wakes once the deadline is reached");
    }

    #[tokio::test]
    async fn manual_sleep_in_the_past_is_ready_and_set_moves_time() {
        let clock = ManualClock::new(Timestamp(5_000));
        assert!(clock.sleep_until(Timestamp(4_000)).now_or_never().is_some());
        clock.set(Timestamp(10));
        assert_eq!(clock.now(), Timestamp(10));
        let sleep = clock.sleep_until(Timestamp(20));
        let clone = clock.clone();
        clone.set(Timestamp(25));
        tokio::time::timeout(Duration::from_secs(5), sleep)
            .await
            .expect("a clone moves the same clock");
    }

    #[tokio::test]
    async fn system_clock_reads_wall_time_and_sleeps() {
        let clock = SystemClock;
        let before = clock.now();
        assert!(before.0 > 1_600_000_000_000);
        clock.sleep_until(Timestamp(before.0 + 5)).await;
        assert!(clock.now() >= Timestamp(before.0 + 5));
    }
}
