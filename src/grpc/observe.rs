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
