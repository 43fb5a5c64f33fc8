//! The ADAPTIVE policy's create window: how many requests of an application may be sent
//! and not yet seen in Kubernetes at once (a congestion window, in executors).
//!
//! Spark asks for `batch_size` executors per round and waits until every request is seen
//! before asking again, so scale-up runs at `batch_size / batch_delay` whatever the API
//! server allows. The window starts at `batch_size` and grows by each create accepted, so
//! it doubles per window's worth of answers (slow start), however many rounds they came
//! in, up to the ceiling: what
//! the service's create rate sends in [`CEILING_BATCH_DELAYS`] batch delays, so the rate
//! limiter always has work queued but no request waits in it for long. A 429 or 5xx
//! refusal halves it (once per batch delay: the refusals of one burst come one by one),
//! and the halved size becomes its threshold: from there it grows by
//! `batch_size` per window's worth of accepted creates, so it does not run straight back
//! into the limit it just met (TCP's congestion avoidance). A quota refusal (403 "exceeded quota") resets
//! it to `batch_size`, to double again up to the threshold.
//! The target, `max_pending_pods` and every other rule bound a round as under SPARK.
//! Growth does not wait for pods to start: how fast the scheduler and kubelets start pods
//! says nothing of what the API server accepts, and the pods a slow start leaves Pending
//! are bounded by the target and `max_pending_pods`, as under SPARK.
//! While the window holds rounds back they come ten times per batch delay (the engine's
//! `window_bound`), so the window is refilled as its pods are seen.
//!
//! The window counts requests until their pods are seen; it says nothing of where they
//! wait. When the API server answers more slowly than the window grows (no 429, only
//! latency), requests would pile up unanswered in the service, each holding its pod, and
//! only a lost Lease or Stop would drop them. So the requests unanswered at once are
//! also bounded by twice what the API server answered in the last
//! [`CEILING_BATCH_DELAYS`] batch delays, and a batch: the service holds no more than
//! about four batch delays of the server's measured pace, whatever client rate it is
//! allowed.

use std::collections::VecDeque;

use crate::time::Timestamp;

/// The ceiling covers the creates the service's rate allows in this many batch delays.
pub const CEILING_BATCH_DELAYS: u64 = 2;

/// Why the API server refused a create, as far as the window cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateRefusal {
    /// 429 Too Many Requests: the API server sheds load.
    Throttled,
    /// 5xx, or no answer: the API server is overloaded or failing.
    ServerError,
    /// 403 with "exceeded quota": the namespace's ResourceQuota is full.
    QuotaExceeded,
    /// Anything else (invalid pod, forbidden, …): says nothing about the rate.
    Other,
}

impl CreateRefusal {
    /// The refusal an HTTP status (and message) stands for; `None` status = no answer.
    pub fn of_status(status: Option<u16>, message: &str) -> Self {
        match status {
            Some(429) => Self::Throttled,
            Some(403) if message.contains("exceeded quota") => Self::QuotaExceeded,
            Some(code) if code >= 500 => Self::ServerError,
            None => Self::ServerError,
            Some(_) => Self::Other,
        }
    }
}

/// The answers to one round's creates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateOutcomes {
    /// Creates the API server accepted.
    pub accepted: u32,
    /// Refused creates, by cause.
    pub refused: Vec<CreateRefusal>,
}

/// The window of one application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateWindow {
    size: u64,
    floor: u64,
    ceiling: u64,
    /// Up to this the window doubles, beyond it grows by `floor`: the size the last
    /// overload halved it to (the ceiling until then).
    threshold: u64,
    /// Creates accepted past the threshold since the window last grew by `floor`.
    accepted_past_threshold: u64,
    /// Creates answered (accepted or refused), by when, over the last `pace_span_ms`.
    answers: VecDeque<(Timestamp, u64)>,
    /// How far back answers count: [`CEILING_BATCH_DELAYS`] batch delays.
    pace_span_ms: i64,
    /// When an overload last halved the window: the refusals of one burst (every create
    /// in flight then) come one by one and halve it once, as TCP halves once per window.
    halved_at: Option<Timestamp>,
    /// One batch delay: refusals within it of a halving belong to the same burst.
    burst_ms: i64,
}

impl CreateWindow {
    /// A window of `batch_size`, growing up to what `creates_per_second` sends in
    /// [`CEILING_BATCH_DELAYS`] batch delays (never below `batch_size`).
    pub fn new(batch_size: u32, batch_delay_ms: i64, creates_per_second: u32) -> Self {
        let floor = u64::from(batch_size.max(1));
        let delay_ms = u64::try_from(batch_delay_ms).unwrap_or(0);
        let per_delays = u64::from(creates_per_second)
            .saturating_mul(delay_ms)
            .saturating_mul(CEILING_BATCH_DELAYS)
            / 1000;
        let ceiling = per_delays.max(floor);
        Self {
            size: floor,
            floor,
            ceiling,
            threshold: ceiling,
            accepted_past_threshold: 0,
            answers: VecDeque::new(),
            pace_span_ms: batch_delay_ms.saturating_mul(CEILING_BATCH_DELAYS as i64),
            halved_at: None,
            burst_ms: batch_delay_ms,
        }
    }

    /// How many requests may wait for an answer at once at `now`: twice the creates the
    /// API server answered in the last [`CEILING_BATCH_DELAYS`] batch delays, and a
    /// batch. Twice, so that while the server keeps up the window may still double each
    /// round; so at most about twice that span of the server's pace waits.
    pub fn unanswered_limit(&self, now: Timestamp) -> u64 {
        let recent = (self.answers.iter())
            .filter(|(at, _)| now.millis_since(*at) < self.pace_span_ms)
            .map(|(_, n)| n)
            .fold(0u64, |sum, n| sum.saturating_add(*n));
        recent.saturating_mul(2).saturating_add(self.floor)
    }

    /// Requests that may be sent and not yet seen at once.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The most the window grows to.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Takes the answers to a round's creates.
    pub fn answered(&mut self, outcomes: &CreateOutcomes, now: Timestamp) {
        let answers = u64::from(outcomes.accepted) + outcomes.refused.len() as u64;
        while (self.answers.front())
            .is_some_and(|(at, _)| now.millis_since(*at) >= self.pace_span_ms)
        {
            self.answers.pop_front();
        }
        if answers > 0 {
            self.answers.push_back((now, answers));
        }
        if outcomes.refused.contains(&CreateRefusal::QuotaExceeded) {
            self.size = self.floor;
            return;
        }
        let overloaded = outcomes
            .refused
            .iter()
            .any(|r| matches!(r, CreateRefusal::Throttled | CreateRefusal::ServerError));
        if overloaded {
            let same_burst =
                (self.halved_at).is_some_and(|at| now.millis_since(at) < self.burst_ms);
            if !same_burst {
                self.size = (self.size / 2).max(self.floor);
                self.threshold = self.size;
                self.accepted_past_threshold = 0;
                self.halved_at = Some(now);
            }
            return;
        }
        if outcomes.accepted > 0 && outcomes.refused.is_empty() {
            let accepted = u64::from(outcomes.accepted);
            let grown = if self.size < self.threshold {
                self.size.saturating_add(accepted).min(self.threshold)
            } else {
                self.accepted_past_threshold += accepted;
                let mut size = self.size;
                while self.accepted_past_threshold >= size {
                    self.accepted_past_threshold -= size;
                    size = size.saturating_add(self.floor);
                }
                size
            };
            self.size = grown.min(self.ceiling);
        }
    }
}
