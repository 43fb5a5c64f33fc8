//! spark-pod-allocator: executor-pod allocation for Spark drivers on Kubernetes, as a
//! gRPC service shared by many drivers.
//!
//! - [`naming`]: every id, label and name rule (application id, DNS-1123, pod-name prefix).
//! - [`time`]: the wall-clock timestamp and the injected clock (system or manual).
//! - [`allocator`]: the pure, clock-driven allocation engine (no I/O).
//! - [`k8s`]: everything that talks to Kubernetes (shared watches, resync, create/delete).
//! - [`app`]: one actor per application, joining the engine to Kubernetes.
//! - [`auth`]: who calls (TokenReview) and what they may do (SubjectAccessReview, ownership).
//! - [`grpc`]: the tonic service; validates requests at the edge.
//! - [`ha`]: which replica owns which shard of namespaces (Kubernetes Leases).
//! - [`lifecycle`]: readiness (initialization handles) and the drain signal.
//! - [`runtime`]: the composition root ([`runtime::Builder`] wires every part once) and
//!   a running service's lifecycle, with its gRPC server in process.
//! - [`metrics`]: the Prometheus metrics and their `/metrics` endpoint.
//! - [`jemalloc`]: the allocator's tuning, for the binaries that use jemalloc.
//! - [`config`]: layered configuration (defaults < file < environment).
//!
//! The simulated Kubernetes cluster the tests, `simulate`, `serve --simulate`, `demo` and
//! the benchmarks (`crates/bench`) use is the `spark-pod-allocator-sim` crate (`crates/sim`).
#![forbid(unsafe_code)]

pub mod allocator;
pub mod app;
pub mod auth;
pub mod config;
pub mod grpc;
pub mod ha;
pub mod jemalloc;
pub mod k8s;
pub mod lifecycle;
pub mod metrics;
pub mod naming;
pub mod runtime;
pub mod time;

/// Generated protobuf and gRPC code of the v1 API.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("spark.allocator.v1");

    /// The encoded file descriptor set, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/allocator_descriptor.bin"));
}
