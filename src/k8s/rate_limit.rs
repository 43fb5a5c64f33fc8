//! Client-side rate limit on mutating Kubernetes requests, shared by every application so
//! many drivers together cannot flood the API server, and shared fairly at two levels:
//! slots go round-robin first between the *namespaces* (the tenants) that wait, then
//! between the applications waiting within the namespace whose turn it is. A tenant with
//! thousands of applications (and their ConfigMap writes) therefore gets one slot in turn
//! with another tenant's one: the other's first executors wait at most one round of the
//! namespaces that wait, however many applications the first runs. One dispatcher task
//! hands out the slots and wakes exactly one waiter per slot (no waiter sleeps on the
//! bucket itself, so nothing stampedes when a slot frees).
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Whose turn a request waits for: its namespace first, then its application there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Share {
    namespace: Arc<str>,
    application: Arc<str>,
}

impl Share {
    /// The share of `application`'s requests in `namespace`.
    pub fn new(namespace: &str, application: &str) -> Self {
        Self {
            namespace: Arc::from(namespace),
            application: Arc::from(application),
        }
    }

    /// The share of requests made on behalf of no application (start-up, service-wide):
    /// a tenant of its own.
    pub fn service() -> Self {
        Self::new("", "")
    }
}

/// A token bucket (as a theoretical-arrival-time schedule): `qps` sustained, `burst` at
/// once, its slots dealt round-robin between the namespaces waiting for one, and within
/// a namespace between its applications.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<Fair>,
}

/// The bucket and the waiters, per namespace and application.
#[derive(Debug)]
struct Fair {
    interval: Duration,
    tolerance: Duration,
    next_free: Option<Instant>,
    /// Waiters per namespace.
    tenants: HashMap<Arc<str>, Tenant>,
    /// Namespaces with waiters, in the order they are next served.
    turns: VecDeque<Arc<str>>,
    /// A dispatcher task is running (it ends once no one waits).
    dispatching: bool,
}

/// The waiters of one namespace, per application.
#[derive(Debug, Default)]
struct Tenant {
    /// Waiters per application, oldest first.
    queues: HashMap<Arc<str>, VecDeque<oneshot::Sender<()>>>,
    /// Applications with waiters, in the order they are next served.
    turns: VecDeque<Arc<str>>,
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
                    tenants: HashMap::new(),
                    turns: VecDeque::new(),
                    dispatching: false,
                }),
            }),
        }
    }

    /// Waits until one more request of `share` may be sent, and takes its slot. A waiter
    /// that is dropped (cancelled) holds no slot: a slot is taken only for a waiter that
    /// is still there.
    pub async fn acquire(&self, share: &Share) {
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
    /// Queues a waiter of `share` (a namespace not waiting yet takes its turn after those
    /// already waiting; so does an application within its namespace).
    fn enqueue(&mut self, share: &Share, waiter: oneshot::Sender<()>) {
        match self.tenants.get_mut(&share.namespace) {
            Some(tenant) => tenant.enqueue(&share.application, waiter),
            None => {
                let mut tenant = Tenant::default();
                tenant.enqueue(&share.application, waiter);
                self.tenants.insert(Arc::clone(&share.namespace), tenant);
                self.turns.push_back(Arc::clone(&share.namespace));
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

    /// The next live waiter: of the namespace whose turn it is, of the application whose
    /// turn it is there (each goes to the back of its turns if it has more waiters), or
    /// `None` when no one waits.
    fn next_waiter(&mut self) -> Option<oneshot::Sender<()>> {
        while let Some(namespace) = self.turns.pop_front() {
            let Some(tenant) = self.tenants.get_mut(&namespace) else {
                continue;
            };
            let found = tenant.next_waiter();
            if tenant.turns.is_empty() {
                self.tenants.remove(&namespace);
            } else {
                self.turns.push_back(namespace);
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

impl Tenant {
    fn enqueue(&mut self, application: &Arc<str>, waiter: oneshot::Sender<()>) {
        match self.queues.get_mut(application) {
            Some(queue) => queue.push_back(waiter),
            None => {
                self.queues
                    .insert(Arc::clone(application), VecDeque::from([waiter]));
                self.turns.push_back(Arc::clone(application));
            }
        }
    }

    /// The next live waiter in round-robin order between the namespace's applications
    /// (cancelled ones are dropped on the way): at most one is handed out per call, so
    /// the namespace gives up its turn after one slot.
    fn next_waiter(&mut self) -> Option<oneshot::Sender<()>> {
        while let Some(application) = self.turns.pop_front() {
            let Some(queue) = self.queues.get_mut(&application) else {
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
                self.queues.remove(&application);
            } else {
                self.turns.push_back(application);
            }
            if found.is_some() {
                return found;
            }
        }
        None
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

    /// Queues `count` waiters of `application` in `namespace`; their receivers, in order.
    fn wait(
        fair: &mut Fair,
        namespace: &str,
        application: &str,
        count: usize,
    ) -> Vec<oneshot::Receiver<()>> {
        let share = Share::new(namespace, application);
        (0..count)
            .map(|_| {
                let (tx, rx) = oneshot::channel();
                fair.enqueue(&share, tx);
                rx
            })
            .collect()
    }

    /// Which of `waiters` (name, index) were granted a slot since the last call.
    fn granted(waiters: &mut [(&str, Vec<oneshot::Receiver<()>>)]) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for (name, receivers) in waiters.iter_mut() {
            for (i, rx) in receivers.iter_mut().enumerate() {
                if rx.try_recv().is_ok() {
                    out.push(((*name).to_string(), i));
                }
            }
        }
        out
    }

    /// Grants `slots` slots one interval apart from `now`; who got each, in order.
    fn serve(
        limiter: &mut Fair,
        waiters: &mut [(&str, Vec<oneshot::Receiver<()>>)],
        slots: usize,
    ) -> Vec<(String, usize)> {
        let now = Instant::now();
        let mut order = Vec::new();
        let mut at = now;
        for _ in 0..slots {
            let next = limiter.grant(at);
            let slot = granted(waiters);
            assert_eq!(slot.len(), 1, "one waiter per slot, no more: {slot:?}");
            order.extend(slot);
            let Some(next) = next else { break };
            at = next;
            assert_eq!(at - now, Duration::from_millis(100) * order.len() as u32);
        }
        order
    }

    fn names(order: &[(String, usize)]) -> Vec<&str> {
        order.iter().map(|(s, _)| s.as_str()).collect()
    }

    #[test]
    fn slots_go_round_robin_between_applications_of_a_namespace() {
        let mut limiter = fair(10, 1);
        let big = wait(&mut limiter, "team-a", "big", 100);
        let small = wait(&mut limiter, "team-a", "small", 2);
        let mut waiters = [("big", big), ("small", small)];
        let order = serve(&mut limiter, &mut waiters, 6);
        // The small application's two requests are served by the 2nd and 4th slots, not
        // after the big one's hundred.
        assert_eq!(
            names(&order),
            ["big", "small", "big", "small", "big", "big"]
        );
        // Within an application, first come first served.
        let big_order: Vec<usize> = order
            .iter()
            .filter(|(s, _)| s == "big")
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(big_order, [0, 1, 2, 3]);
    }

    #[test]
    fn a_namespace_with_many_applications_gets_one_turn_like_any_other() {
        let mut limiter = fair(10, 1);
        // Tenant A: 50 applications, 4 requests each, all queued before B's first.
        let mut waiters: Vec<(&str, Vec<oneshot::Receiver<()>>)> = Vec::new();
        let apps: Vec<String> = (0..50).map(|i| format!("a-{i}")).collect();
        for app in &apps {
            waiters.push(("a", wait(&mut limiter, "team-a", app, 4)));
        }
        waiters.push(("b", wait(&mut limiter, "team-b", "b-0", 3)));
        let order = serve(&mut limiter, &mut waiters, 8);
        // B's three requests (registration, id record, first create) take every other
        // slot: none waits behind more than one of A's, whatever A's applications.
        assert_eq!(names(&order), ["a", "b", "a", "b", "a", "b", "a", "a"]);
        // And within A, its applications still take turns.
        let a_apps: Vec<usize> = order
            .iter()
            .filter(|(s, _)| s == "a")
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(
            a_apps,
            [0, 0, 0, 0, 0],
            "each of A's first slots goes to another application's first request"
        );
    }

    #[test]
    fn the_service_share_is_a_tenant_of_its_own() {
        let mut limiter = fair(10, 1);
        let a = wait(&mut limiter, "team-a", "x", 3);
        let (tx, rx) = oneshot::channel();
        limiter.enqueue(&Share::service(), tx);
        let mut waiters = [("a", a), ("service", vec![rx])];
        let order = serve(&mut limiter, &mut waiters, 4);
        assert_eq!(names(&order), ["a", "service", "a", "a"]);
    }

    #[test]
    fn a_cancelled_waiter_takes_no_slot() {
        let mut limiter = fair(10, 1);
        let now = Instant::now();
        let mut first = wait(&mut limiter, "ns", "a", 2);
        drop(first.remove(0));
        let mut waiters = [("a", first)];
        assert_eq!(limiter.grant(now), None, "no one waits any more");
        assert_eq!(granted(&mut waiters), [("a".to_string(), 0)]);
        // One slot was used (the live waiter's); the next is an interval later.
        assert_eq!(limiter.try_take(now), Err(now + Duration::from_millis(100)));
    }

    #[test]
    fn a_namespace_whose_waiters_all_left_takes_no_slot() {
        let mut limiter = fair(10, 1);
        let now = Instant::now();
        drop(wait(&mut limiter, "gone", "a", 3));
        let b = wait(&mut limiter, "team-b", "b", 1);
        let mut waiters = [("b", b)];
        assert_eq!(limiter.grant(now), None);
        assert_eq!(granted(&mut waiters), [("b".to_string(), 0)]);
        assert!(limiter.tenants.is_empty() && limiter.turns.is_empty());
    }

    #[test]
    fn a_share_that_stops_waiting_loses_its_turn() {
        let mut limiter = fair(10, 1);
        let now = Instant::now();
        let a = wait(&mut limiter, "team-a", "a", 1);
        let b = wait(&mut limiter, "team-b", "b", 1);
        let mut waiters = [("a", a), ("b", b)];
        let next = limiter.grant(now).expect("b waits");
        assert_eq!(granted(&mut waiters), [("a".to_string(), 0)]);
        assert_eq!(limiter.turns, [Arc::<str>::from("team-b")]);
        assert_eq!(limiter.grant(next), None);
        assert_eq!(granted(&mut waiters), [("b".to_string(), 0)]);
        assert!(limiter.tenants.is_empty() && limiter.turns.is_empty());
    }

    #[tokio::test]
    async fn acquire_waits_for_the_slot() {
        // A lower bound only: sleeping never ends early, so this cannot flake.
        let limiter = RateLimiter::new(100, 1);
        let start = Instant::now();
        limiter.acquire(&Share::new("ns", "a")).await;
        limiter.acquire(&Share::new("ns", "b")).await;
        limiter.acquire(&Share::new("ns", "a")).await;
        assert!(Instant::now() - start >= Duration::from_millis(20));
    }

    #[tokio::test]
    async fn concurrent_waiters_all_get_their_slot() {
        let limiter = RateLimiter::new(1000, 1);
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let limiter = limiter.clone();
                let share = Share::new(if i % 3 == 0 { "x" } else { "y" }, &format!("a{}", i % 2));
                tokio::spawn(async move { limiter.acquire(&share).await })
            })
            .collect();
        for task in tasks {
            task.await.expect("acquired");
        }
        assert!(limiter.lock().turns.is_empty(), "no one is left waiting");
    }

    /// The dispatcher itself, on tokio's paused clock: one tenant's 200 queued requests
    /// delay another's first three by one slot each, not by 200.
    #[tokio::test(start_paused = true)]
    async fn the_dispatcher_serves_a_new_tenant_within_a_round() {
        let limiter = RateLimiter::new(10, 1);
        let start = Instant::now();
        let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..200 {
            let (limiter, done) = (limiter.clone(), done.clone());
            let share = Share::new("team-a", &format!("a-{}", i % 100));
            tokio::spawn(async move {
                limiter.acquire(&share).await;
                let _ = done.send(("a", Instant::now()));
            });
        }
        // Let A's requests queue (the first takes the free slot at once).
        tokio::task::yield_now().await;
        for _ in 0..3 {
            let (limiter, done) = (limiter.clone(), done.clone());
            tokio::spawn(async move {
                limiter.acquire(&Share::new("team-b", "b")).await;
                let _ = done.send(("b", Instant::now()));
            });
        }
        drop(done);
        let mut order = Vec::new();
        while let Some((who, at)) = finished.recv().await {
            order.push((who, at - start));
            if order.iter().filter(|(w, _)| *w == "b").count() == 3 {
                break;
            }
        }
        let b_slots: Vec<usize> = order
            .iter()
            .enumerate()
            .filter(|(_, (w, _))| *w == "b")
            .map(|(i, _)| i)
            .collect();
        // Slot 0 went to A at once, slot 1 to A's turn (queued first); then B, A, B, A, B.
        assert_eq!(b_slots, [2, 4, 6], "{order:?}");
        assert_eq!(
            order[6].1,
            Duration::from_millis(600),
            "seven slots at 10/s"
        );
    }
}
