//! kube-rs against the simulated API server: the verbs, selectors, watches, deletion rules,
//! subresources, configmaps and leases, as a real kube-apiserver answers them.
//!
//! One module per topic.

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Service};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use serde_json::{Value, json};
use test_kit::sim::*;

mod config_maps_and_leases;
mod objects;
mod pods;
mod quotas;
mod selectors;
mod services_and_claims;
mod watches;
