//! `spark-pod-allocator bench <scenario>`: measurements of the service against the
//! simulated cluster run in a process of its own (so the service's memory is this
//! process's alone). Each scenario prints its goal, what it measured and the ratio.
pub mod fairness;
pub mod harness;
pub mod many_apps;
pub mod memory;
