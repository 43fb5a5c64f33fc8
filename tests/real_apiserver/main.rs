//! The tests that need a real kube-apiserver (tests/kube-apiserver, named by
//! `TEST_APISERVER_BIN`; without it they print why and return), in one test binary: the
//! service's contract against the simulator and the real server, real faults, the
//! simulator's conformance to the real server, and the Helm chart installed for real. See
//! docs/real-apiserver.md.
mod allocation;
mod binary;
mod budgets;
mod chart;
mod chart_config;
mod chart_pod;
mod conformance;
mod control_plane;
mod faults;
mod ha;
mod pod_security;
mod process_node;
mod registrations;
mod websocket;
