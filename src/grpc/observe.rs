//! A tower layer around every gRPC service of the server: counts each call by method and
//! status code and times it, into [`Metrics`].
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::Code;

use super::error::code_name;
use crate::metrics::Metrics;

/// Records every call's method, code and latency.
#[derive(Debug, Clone)]
pub struct ObserveLayer {
    metrics: Metrics,
}

impl ObserveLayer {
    /// Records into `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics }
    }
}

impl<S> tower::Layer<S> for ObserveLayer {
    type Service = Observe<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Observe {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`ObserveLayer`].
#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
    metrics: Metrics,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Observe<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().to_string();
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(response) => response_code(response),
                Err(_) => Code::Unknown,
            };
            metrics.rpc_answered(&method, code_name(code), started.elapsed());
            result
        })
    }
}

/// A call that failed before its first message carries its code in the response headers
/// (a trailers-only response); a call whose headers have none answered OK (a stream that
/// fails later puts its code in the trailers, and is counted by how it opened).
fn response_code<R>(response: &http::Response<R>) -> Code {
    response
        .headers()
        .get("grpc-status")
        .map_or(Code::Ok, |value| Code::from_bytes(value.as_bytes()))
}

/// Metadata a client may set to find its calls in the service's log lines.
pub const REQUEST_ID_METADATA: &str = "x-request-id";
/// Longest request id taken from a client; the rest is cut.
const REQUEST_ID_MAX_LEN: usize = 64;

/// The span of one call: every log line it causes carries `request_id`, the client's
/// `x-request-id` when it gives a usable one, else one generated here.
pub(super) fn request_span(request: &http::Request<()>) -> tracing::Span {
    let id = client_request_id(request.headers())
        .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
    tracing::info_span!("request", request_id = %id)
}

/// The client's request id, kept to visible ASCII letters, digits and `-_.:/` (nothing that
/// could forge a log field or line) and at most [`REQUEST_ID_MAX_LEN`] characters.
fn client_request_id(headers: &http::HeaderMap) -> Option<String> {
    let value = headers.get(REQUEST_ID_METADATA)?.to_str().ok()?;
    let id: String = value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
        .take(REQUEST_ID_MAX_LEN)
        .collect();
    (!id.is_empty()).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &[u8]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            REQUEST_ID_METADATA,
            http::HeaderValue::from_bytes(value).expect("header value"),
        );
        headers
    }

    #[test]
    fn a_clients_request_id_is_kept_sanitised_and_bounded() {
        assert_eq!(
            client_request_id(&headers(b"job-42/attempt.1")).as_deref(),
            Some("job-42/attempt.1")
        );
        assert_eq!(
            client_request_id(&headers(b"a\"b} c=d")).as_deref(),
            Some("abcd")
        );
        let long = "x".repeat(500);
        assert_eq!(
            client_request_id(&headers(long.as_bytes())).map(|id| id.len()),
            Some(REQUEST_ID_MAX_LEN)
        );
        assert_eq!(client_request_id(&headers(b"{}")), None);
        assert_eq!(client_request_id(&headers("é".as_bytes())), None);
        assert_eq!(client_request_id(&http::HeaderMap::new()), None);
    }
}
