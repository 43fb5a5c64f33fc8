//! The one home of the test wiring the service's tests, benchmarks and examples share, so
//! that each set-up is written once:
//!
//! - [`sim`]: the simulated cluster with a manual kubelet (nothing moves unless the test
//!   moves it), pod manifests, raw HTTP through kube-rs's own client;
//! - [`grpc`]: simulator + service + gRPC server + client in one process ([`grpc::Harness`];
//!   [`grpc::serve`], the one way the tests start a service and its gRPC server, built as
//!   `main` builds it: `runtime::Builder`), the standard executor template ([`grpc::TEMPLATE`]) and the Start
//!   request built on it;
//! - [`requests`]: the gRPC requests the tests send most, built one way;
//! - [`service`]: the service core in process (`Applications`, a `ManualClock`), the Start
//!   fixture of the allocation scenarios and the waits on its rounds and snapshot;
//! - [`tls`]: a test CA and a certificate it signed for `localhost` and 127.0.0.1;
//! - [`wait`]: the one polling helper (a condition; a bound, or a quantity that must keep
//!   moving; never a fixed sleep);
//! - [`process`]: the service binary as a process, read through its JSON log;
//! - [`ha`]: the simulator's records judged against the shard Leases (writes only from a
//!   shard's holder, no executor id naming two pods);
//! - [`partition`]: a TCP relay a test cuts and heals (a replica partitioned from its API
//!   server);
//! - [`apiserver`], [`cluster`]: a real kube-apiserver and the backends of the contract
//!   tests (the simulator and the real server behind one trait).
#![forbid(unsafe_code)]

pub mod apiserver;
pub mod cluster;
pub mod grpc;
pub mod ha;
pub mod partition;
pub mod process;
pub mod requests;
pub mod service;
pub mod sim;
pub mod tls;
pub mod wait;
