//! The one retry policy of every Kubernetes request the service sends: each attempt has a
//! deadline, and an attempt that timed out or failed transiently (no answer, 429, 500, 502,
//! 503, 504) is tried again after a short pause, up to a fixed number of attempts. kube's
//! own retry layer (15 retries honouring `Retry-After`, which let one PATCH take 34 s during
//! an etcd outage) is switched off by [`super::connect`]; on a client built elsewhere it
//! still runs, but inside each attempt's deadline.
use std::future::Future;
use std::time::Duration;

/// Deadline and attempts of every Kubernetes request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestPolicy {
    /// How long one attempt may take before it is given up.
    pub timeout: Duration,
    /// Attempts in all (1 = no retry).
    pub attempts: u32,
    /// Pause before the first retry; doubled for each further one.
    pub retry_delay: Duration,
}

impl Default for RequestPolicy {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(10),
            attempts: 2,
            retry_delay: Duration::from_millis(200),
        }
    }
}

/// An attempt not answered within [`RequestPolicy::timeout`].
#[derive(Debug, thiserror::Error)]
#[error("no answer from the Kubernetes API server within {} ms", .0.as_millis())]
pub struct RequestTimedOut(pub Duration);

impl RequestPolicy {
    /// Runs `attempt` under this policy; the error is that of the last attempt (a timeout
    /// becomes a `kube::Error::Service` holding [`RequestTimedOut`]). `attempt` receives
    /// whether an earlier attempt's outcome is unknown (it timed out or lost its
    /// connection), so it may have taken effect (a create's 409 then means it did).
    pub async fn run<T, F, Fut>(&self, attempt: F) -> Result<T, kube::Error>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        self.run_while(|_| true, attempt).await
    }

    /// [`Self::run`], except that a failed attempt is tried again only while `retry`
    /// says so for its error (a round that stops on the first overload answer).
    pub async fn run_while<T, F, Fut>(
        &self,
        retry: impl Fn(&kube::Error) -> bool,
        mut attempt: F,
    ) -> Result<T, kube::Error>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let attempts = self.attempts.max(1);
        let mut delay = self.retry_delay;
        let mut unknown_outcome = false;
        let mut tried = 0;
        loop {
            tried += 1;
            let result = match tokio::time::timeout(self.timeout, attempt(unknown_outcome)).await {
                Ok(result) => result,
                Err(_) => Err(kube::Error::Service(Box::new(RequestTimedOut(
                    self.timeout,
                )))),
            };
            let err = match result {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            if tried >= attempts || !is_transient(&err) || !retry(&err) {
                return Err(err);
            }
            unknown_outcome |= outcome_unknown(&err);
            tracing::debug!(error = %describe_error(&err), attempt = tried, "kubernetes request failed; retrying");
            tokio::time::sleep(delay).await;
            delay = delay.saturating_mul(2);
        }
    }
}

/// Whether `err` may pass if the request is sent again.
pub fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        other => outcome_unknown(other),
    }
}

/// How long the API server asked the client to wait before sending more: a 429's or
/// 503's `details.retryAfterSeconds`, as a `Status` carries it. API Priority and Fairness
/// answers its 429 in plain text with only a `Retry-After` header, which kube keeps no
/// trace of: such a 429 waits [`DEFAULT_RETRY_AFTER`], the header's usual value.
pub fn retry_after(err: &kube::Error) -> Option<Duration> {
    let kube::Error::Api(status) = err else {
        return None;
    };
    let asked = status
        .details
        .as_ref()
        .map(|details| details.retry_after_seconds)
        .filter(|seconds| *seconds > 0)
        .map(|seconds| Duration::from_secs(u64::from(seconds)));
    match status.code {
        429 => Some(asked.unwrap_or(DEFAULT_RETRY_AFTER)),
        503 => asked,
        _ => None,
    }
}

/// The wait after a 429 that names none (see [`retry_after`]).
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Whether the request may have taken effect although no answer said so.
pub fn outcome_unknown(err: &kube::Error) -> bool {
    match err {
        // Refused here, never sent.
        kube::Error::Service(inner) if inner.is::<crate::ha::NotOwner>() => false,
        kube::Error::Service(_) | kube::Error::HyperError(_) => true,
        _ => false,
    }
}

/// Whether `err` is an attempt given up after [`RequestPolicy::timeout`].
pub fn is_timeout(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Service(inner) if inner.is::<RequestTimedOut>())
}

/// A Kubernetes error as one log-friendly line; for an API error the server's reason,
/// code and message (`Forbidden (403): pods "x" is forbidden: exceeded quota ...`).
pub fn describe_error(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => {
            format!("{} ({}): {}", status.reason, status.code, status.message)
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("x", "Reason").with_code(code),
        ))
    }

    #[tokio::test]
    async fn transient_failures_are_retried_up_to_the_attempts() {
        let policy = RequestPolicy {
            timeout: Duration::from_secs(1),
            attempts: 3,
            retry_delay: Duration::from_millis(1),
        };
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = policy
            .run(|_| async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(api(503))
            })
            .await;
        assert!(matches!(result, Err(kube::Error::Api(s)) if s.code == 503));
        assert_eq!(calls.load(Ordering::SeqCst), 3);

        calls.store(0, Ordering::SeqCst);
        let result: Result<(), _> = policy
            .run(|_| async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(api(403))
            })
            .await;
        assert!(result.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1, "a 403 is not retried");
    }

    #[tokio::test]
    async fn run_while_stops_retrying_when_told_and_retry_after_is_read_from_the_status() {
        let policy = RequestPolicy {
            timeout: Duration::from_secs(1),
            attempts: 3,
            retry_delay: Duration::from_millis(1),
        };
        let calls = AtomicU32::new(0);
        let throttled = || {
            let details = kube::core::response::StatusDetails {
                name: String::new(),
                group: String::new(),
                kind: String::new(),
                uid: String::new(),
                causes: Vec::new(),
                retry_after_seconds: 3,
            };
            kube::Error::Api(Box::new(
                kube::core::Status::failure("slow down", "TooManyRequests")
                    .with_code(429)
                    .with_details(details),
            ))
        };
        let result: Result<(), _> = policy
            .run_while(
                |_| false,
                |_| async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err(throttled())
                },
            )
            .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "no retry once told not to");
        let err = result.unwrap_err();
        assert_eq!(retry_after(&err), Some(Duration::from_secs(3)));
        assert_eq!(
            retry_after(&api(429)),
            Some(DEFAULT_RETRY_AFTER),
            "a 429 without details (APF's plain text) waits the usual second"
        );
        assert_eq!(retry_after(&api(500)), None);
    }

    #[tokio::test]
    async fn an_attempt_past_its_deadline_is_given_up_and_marks_the_outcome_unknown() {
        let policy = RequestPolicy {
            timeout: Duration::from_millis(20),
            attempts: 2,
            retry_delay: Duration::from_millis(1),
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let result: Result<(), _> = policy
            .run(|unknown| {
                seen.lock().unwrap().push(unknown);
                async {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(())
                }
            })
            .await;
        let err = result.unwrap_err();
        assert!(is_timeout(&err), "{err}");
        assert_eq!(*seen.lock().unwrap(), vec![false, true]);
    }
}
