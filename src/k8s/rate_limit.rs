//! Client-side rate limit on mutating Kubernetes requests, shared by every application so
//! many drivers together cannot flood the API server, and shared fairly: each application
//! (a *share*) queues its own requests, and slots go round-robin between the shares that
//! wait, so a small application's first executors are not queued behind another's
//! thousands. One dispatcher task hands out the slots and wakes exactly one waiter per
//! slot (no waiter sleeps on the bucket itself, so nothing stampedes when a slot frees).
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// The share of requests made on behalf of no application (start-up, service-wide).
pub const SERVICE_SHARE: &str = "";

/// A token bucket (as a theoretical-arrival-time schedule): `qps` sustained, `burst` at
/// once, its slots dealt round-robin between the shares waiting for one.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<Fair>,
}

/// The bucket and the waiters, per share.
#[derive(Debug)]
struct Fair {
    interval: Duration,
    tolerance: Duration,
    next_free: Option<Instant>,
    /// Waiters per share, oldest first.
    queues: HashMap<Arc<str>, VecDeque<oneshot::Sender<()>>>,
    /// Shares with waiters, in the order they are next served.
    turns: VecDeque<Arc<str>>,
    /// A dispatcher task is running (it ends once no one waits).
    dispatching: bool,
}

impl RateLimiter {
    /// `qps` and `burst` are clamped to at least 1.
    pub fn new(qps: u32, burst: u32) -> Self {
        let interval = Duration::from_secs(1) / qps.max(1);
        let tolerance = interval * burst.max(1).saturating_sub(1);
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(Fair {
                    interval,
                    tolerance,
                    next_free: None,
                    queues: HashMap::new(),
                    turns: VecDeque::new(),
                    dispatching: false,
                }),
            }),
        }
    }

    /// Waits until one more request of `share` may be sent, and takes its slot. A waiter
    /// that is dropped (cancelled) holds no slot: a slot is taken only for a waiter that
    /// is still there.
    pub async fn acquire(&self, share: &str) {
        let rx = {
            let mut fair = self.lock();
            let now = Instant::now();
            // Nobody waits and a slot is free: taken at once, no task, no channel.
            if fair.turns.is_empty() && fair.try_take(now).is_ok() {
                return;
            }
            let (tx, rx) = oneshot::channel();
            fair.enqueue(share, tx);
            if !fair.dispatching {
                fair.dispatching = true;
                let limiter = self.clone();
                tokio::spawn(async move { limiter.dispatch().await });
            }
            rx
        };
        // The dispatcher only drops a sender after handing it its slot, or when it ends
        // with the runtime: either way the request may go.
        let _ = rx.await;
    }

    /// Hands out slots as they come, one waiter each, until no one waits.
    async fn dispatch(self) {
        loop {
            let wait_until = {
                let mut fair = self.lock();
                match fair.grant(Instant::now()) {
                    Some(at) => at,
                    None => {
                        fair.dispatching = false;
                        return;
                    }
                }
            };
            tokio::time::sleep_until(wait_until).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Fair> {
        match self.inner.state.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

impl Fair {
    /// Queues a waiter of `share` (its share takes its turn after those already waiting).
    fn enqueue(&mut self, share: &str, waiter: oneshot::Sender<()>) {
        match self.queues.get_mut(share) {
            Some(queue) => queue.push_back(waiter),
            None => {
                let share: Arc<str> = Arc::from(share);
                self.queues
                    .insert(Arc::clone(&share), VecDeque::from([waiter]));
                self.turns.push_back(share);
            }
        }
    }

    /// Gives every slot usable at `now` to the next waiter in turn (a cancelled waiter is
    /// dropped without a slot). Returns when the next slot is usable if someone still
    /// waits, `None` when no one does.
    fn grant(&mut self, now: Instant) -> Option<Instant> {
        loop {
            let usable_at = self.usable_at(now);
            if usable_at > now {
                return (!self.turns.is_empty()).then_some(usable_at);
            }
            let waiter = self.next_waiter()?;
            if waiter.send(()).is_ok() {
                let _ = self.try_take(now);
            }
        }
    }

    /// The next live waiter in round-robin order (its share goes to the back of the turns
    /// if it has more waiters), or `None` when no one waits.
    fn next_waiter(&mut self) -> Option<oneshot::Sender<()>> {
        while let Some(share) = self.turns.pop_front() {
            let Some(queue) = self.queues.get_mut(&share) else {
                continue;
            };
            let mut found = None;
            while let Some(waiter) = queue.pop_front() {
                if !waiter.is_closed() {
                    found = Some(waiter);
                    break;
                }
            }
            if queue.is_empty() {
                self.queues.remove(&share);
            } else {
                self.turns.push_back(share);
            }
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// When the next slot is usable.
    fn usable_at(&self, now: Instant) -> Instant {
        let start = self.next_free.map_or(now, |t| t.max(now));
        start.checked_sub(self.tolerance).unwrap_or(now).max(now)
    }

    /// Takes a slot if one is usable at `now`; otherwise says when one will be.
    fn try_take(&mut self, now: Instant) -> Result<(), Instant> {
        let usable_at = self.usable_at(now);
        if usable_at > now {
            return Err(usable_at);
        }
        let start = self.next_free.map_or(now, |t| t.max(now));
        self.next_free = Some(start + self.interval);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fair(qps: u32, burst: u32) -> Fair {
        let limiter = RateLimiter::new(qps, burst);
        let inner = Arc::try_unwrap(limiter.inner).expect("sole owner");
        inner.state.into_inner().expect("not poisoned")
    }

    #[test]
    fn burst_is_free_then_requests_are_spaced_by_the_interval() {
        let mut limiter = fair(10, 3);
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
        let mut limiter = fair(10, 2);
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

    /// Queues `count` waiters of `share`; their receivers, in order.
    fn wait(fair: &mut Fair, share: &str, count: usize) -> Vec<oneshot::Receiver<()>> {
        (0..count)
            .map(|_| {
                let (tx, rx) = oneshot::channel();
                fair.enqueue(share, tx);
                rx
            })
            .collect()
    }

    /// Which of `waiters` (share, index) were granted a slot since the last call.
    fn granted(waiters: &mut [(&str, Vec<oneshot::Receiver<()>>)]) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for (share, receivers) in waiters.iter_mut() {
            for (i, rx) in receivers.iter_mut().enumerate() {
                if rx.try_recv().is_ok() {
                    out.push(((*share).to_string(), i));
                }
            }
        }
        out
    }

    #[test]
    fn slots_go_round_robin_between_applications() {
        let mut limiter = fair(10, 1);
        let now = Instant::now();
        let big = wait(&mut limiter, "big", 100);
        let small = wait(&mut limiter, "small", 2);
        let mut waiters = [("big", big), ("small", small)];
        let mut order = Vec::new();
        let mut at = now;
        for _ in 0..6 {
            let next = limiter.grant(at);
            let slot = granted(&mut waiters);
            assert_eq!(slot.len(), 1, "one waiter per slot, no more: {slot:?}");
            order.extend(slot);
            at = next.expect("still waiting");
            assert_eq!(at - now, Duration::from_millis(100) * order.len() as u32);
        }
        let names: Vec<&str> = order.iter().map(|(s, _)| s.as_str()).collect();
        // The small application's two requests are served by the 2nd and 4th slots, not
        // after the big one's hundred.
        assert_eq!(names, ["big", "small", "big", "small", "big", "big"]);
        // Within an application, first come first served.
        let big_order: Vec<usize> = order
            .iter()
            .filter(|(s, _)| s == "big")
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(big_order, [0, 1, 2, 3]);
    }

    #[test]
    fn a_cancelled_waiter_takes_no_slot() {
        let mut limiter = fair(10, 1);
        let now = Instant::now();
        let mut first = wait(&mut limiter, "a", 2);
        drop(first.remove(0));
        let mut waiters = [("a", first)];
        assert_eq!(limiter.grant(now), None, "no one waits any more");
        assert_eq!(granted(&mut waiters), [("a".to_string(), 0)]);
        // One slot was used (the live waiter's); the next is an interval later.
        assert_eq!(limiter.try_take(now), Err(now + Duration::from_millis(100)));
    }

    #[test]
    fn a_share_that_stops_waiting_loses_its_turn() {
        let mut limiter = fair(10, 1);
        let now = Instant::now();
        let a = wait(&mut limiter, "a", 1);
        let b = wait(&mut limiter, "b", 1);
        let mut waiters = [("a", a), ("b", b)];
        let next = limiter.grant(now).expect("b waits");
        assert_eq!(granted(&mut waiters), [("a".to_string(), 0)]);
        assert_eq!(limiter.turns, [Arc::<str>::from("b")]);
        assert_eq!(limiter.grant(next), None);
        assert_eq!(granted(&mut waiters), [("b".to_string(), 0)]);
        assert!(limiter.queues.is_empty() && limiter.turns.is_empty());
    }

    #[tokio::test]
    async fn acquire_waits_for_the_slot() {
        // A lower bound only: sleeping never ends early, so this cannot flake.
        let limiter = RateLimiter::new(100, 1);
        let start = Instant::now();
        limiter.acquire("a").await;
        limiter.acquire("b").await;
        limiter.acquire("a").await;
        assert!(Instant::now() - start >= Duration::from_millis(20));
    }

    #[tokio::test]
    async fn concurrent_waiters_all_get_their_slot() {
        let limiter = RateLimiter::new(1000, 1);
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let limiter = limiter.clone();
                tokio::spawn(
                    async move { limiter.acquire(if i % 2 == 0 { "a" } else { "b" }).await },
                )
            })
            .collect();
        for task in tasks {
            task.await.expect("acquired");
        }
        assert!(limiter.lock().turns.is_empty(), "no one is left waiting");
    }
}
