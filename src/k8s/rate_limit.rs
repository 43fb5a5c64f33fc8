//! Client-side rate limit on mutating Kubernetes requests, shared by every application so
//! many drivers together cannot flood the API server.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket (as a theoretical-arrival-time schedule): `qps` sustained, `burst` at once.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    interval: Duration,
    tolerance: Duration,
    next_free: Mutex<Option<Instant>>,
}

impl RateLimiter {
    /// `qps` and `burst` are clamped to at least 1.
    pub fn new(qps: u32, burst: u32) -> Self {
        let interval = Duration::from_secs(1) / qps.max(1);
        let tolerance = interval * burst.max(1).saturating_sub(1);
        Self {
            inner: Arc::new(Inner {
                interval,
                tolerance,
                next_free: Mutex::new(None),
            }),
        }
    }

    /// Waits until one more request may be sent, and takes its slot. A waiter that is
    /// dropped (cancelled) holds no slot: slots are taken only when usable at once.
    pub async fn acquire(&self) {
        loop {
            match self.try_take(Instant::now()) {
                Ok(()) => return,
                Err(usable_at) => tokio::time::sleep_until(usable_at).await,
            }
        }
    }

    /// Takes a slot if one is usable at `now`; otherwise says when one will be.
    fn try_take(&self, now: Instant) -> Result<(), Instant> {
        let mut next_free = match self.inner.next_free.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let start = next_free.map_or(now, |t| t.max(now));
        let usable_at = start.checked_sub(self.inner.tolerance).unwrap_or(now);
        if usable_at > now {
            return Err(usable_at);
        }
        *next_free = Some(start + self.inner.interval);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_is_free_then_requests_are_spaced_by_the_interval() {
        let limiter = RateLimiter::new(10, 3);
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(limiter.try_take(now), Ok(()));
        }
        let next = now + Duration::from_millis(100);
        assert_eq!(limiter.try_take(now), Err(next));
        // Asking again takes nothing: the answer is unchanged.
        assert_eq!(limiter.try_take(now), Err(next));
        assert_eq!(limiter.try_take(next), Ok(()));
        assert_eq!(
            limiter.try_take(next),
            Err(next + Duration::from_millis(100))
        );
    }

    #[test]
    fn idle_time_refills_the_bucket_up_to_burst_only() {
        let limiter = RateLimiter::new(10, 2);
        let now = Instant::now();
        assert_eq!(limiter.try_take(now), Ok(()));
        assert_eq!(limiter.try_take(now), Ok(()));
        let later = now + Duration::from_secs(60);
        assert_eq!(limiter.try_take(later), Ok(()));
        assert_eq!(limiter.try_take(later), Ok(()));
        assert_eq!(
            limiter.try_take(later),
            Err(later + Duration::from_millis(100))
        );
    }

    #[tokio::test]
    async fn acquire_waits_for_the_slot() {
        // A lower bound only: sleeping never ends early, so this cannot flake.
        let limiter = RateLimiter::new(100, 1);
        let start = Instant::now();
        limiter.acquire().await;
        limiter.acquire().await;
        limiter.acquire().await;
        assert!(Instant::now() - start >= Duration::from_millis(20));
    }
}
