//! Per-executor claims: what the builder makes, reuse of a free claim (storage class, size
//! at least, not mounted, not given, old enough), waiting to reuse, quantities.
use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::json;

use super::*;
use crate::allocator::claims::{mounted_claims, quantity_bytes};

const CLAIM: &str = "spark-1-exec-{{EXECUTOR_ID}}-pvc-0";

fn claim_template(class: &str, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": CLAIM, "labels": {"disk": "{{EXECUTOR_ID}}"}, "ownerReferences": []},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": size}}},
        "status": {"phase": "Bound"}
    }))
    .unwrap()
}

fn pod_template() -> Pod {
    serde_json::from_value(json!({
        "spec": {
            "containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}],
            "volumes": [{"name": "spark-local-dir-1", "persistentVolumeClaim": {"claimName": CLAIM}}]
        }
    }))
    .unwrap()
}

fn builder(claims: Vec<PersistentVolumeClaim>, driver_owns: bool) -> ExecutorPodBuilder {
    ExecutorPodBuilder::new(
        "spark-1",
        "spark-1",
        [(ResourceProfileId(0), pod_template())].into(),
        Some(DriverOwner {
            name: "driver".into(),
            uid: "driver-uid".into(),
        }),
        "spark-kubernetes-executor",
    )
    .unwrap()
    .with_claims(claims, driver_owns)
}

fn listed(name: &str, class: &str, size: &str, created: i64) -> ListedClaim {
    ListedClaim {
        name: name.into(),
        storage_class: Some(class.into()),
        size: quantity_bytes(size),
        created_at: Some(secs(created)),
    }
}

fn rules(wait_at: Option<u32>) -> ClaimRules {
    ClaimRules {
        reuse: true,
        wait_at,
        min_age_ms: 1000,
    }
}

/// The pod of executor `id` and the claims it wants, as the builder makes them.
fn executor(b: &ExecutorPodBuilder, id: u64) -> (Pod, Vec<PersistentVolumeClaim>) {
    let pod = b.build(ExecutorId(id), ResourceProfileId(0)).unwrap();
    let claims = b.claims(ExecutorId(id), &pod);
    (pod, claims)
}

fn claim_names(pod: &Pod) -> Vec<String> {
    mounted_claims(pod).map(str::to_string).collect()
}

#[test]
fn the_builder_makes_the_claims_a_pod_mounts_named_labelled_and_owned_as_spark_does() {
    let b = builder(vec![claim_template("gp3", "10Gi")], true);
    let (pod, claims) = executor(&b, 7);
    assert_eq!(claim_names(&pod), ["spark-1-exec-7-pvc-0"]);
    assert_eq!(claims.len(), 1);
    let claim = &claims[0];
    assert_eq!(claim.metadata.name.as_deref(), Some("spark-1-exec-7-pvc-0"));
    let labels = claim.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["spark-app-selector"], "spark-1");
    assert_eq!(labels["spark-role"], "executor");
    assert_eq!(labels["disk"], "7");
    let owner = &claim.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.name.as_str(), owner.uid.as_str()),
        ("driver", "driver-uid")
    );
    assert_eq!(owner.controller, Some(true));
    assert!(claim.status.is_none());
    assert!(b.claims_owned_by_driver());

    // Not driver-owned: no owner yet (the worker makes the pod its owner).
    let b = builder(vec![claim_template("gp3", "10Gi")], false);
    let (_, claims) = executor(&b, 7);
    assert!(claims[0].metadata.owner_references.is_none());
    assert!(!b.claims_owned_by_driver());

    // A claim no volume of the pod mounts is not made.
    let mut other = claim_template("gp3", "10Gi");
    other.metadata.name = Some("unmounted-{{EXECUTOR_ID}}".into());
    let b = builder(vec![other], true);
    assert!(executor(&b, 1).1.is_empty());
}

#[test]
fn a_new_executor_reuses_a_free_claim_of_the_same_class_and_at_least_the_size() {
    let b = builder(vec![claim_template("gp3", "10Gi")], true);
    let mut claims = ExecutorClaims::new(rules(None));
    claims.listed(vec![
        listed("spark-1-exec-1-pvc-0", "gp3", "10Gi", 0),
        listed("spark-1-exec-2-pvc-0", "standard", "100Gi", 0),
        listed("spark-1-exec-3-pvc-0", "gp3", "5Gi", 0),
        listed("spark-1-exec-4-pvc-0", "gp3", "20Gi", 0),
    ]);
    // Executor 1's pod still mounts its claim.
    let mounted = BTreeSet::from(["spark-1-exec-1-pvc-0".to_string()]);
    let (mut pod, wanted) = executor(&b, 5);
    let to_create = claims
        .assign(ExecutorId(5), &mut pod, wanted, &mounted, secs(10))
        .unwrap();
    assert!(to_create.is_empty(), "{to_create:?}");
    // Not another class, not smaller: executor 4's 20Gi of gp3.
    assert_eq!(claim_names(&pod), ["spark-1-exec-4-pvc-0"]);

    // The next executor finds none free: 4's is given to executor 5 until its pod shows.
    let (mut pod, wanted) = executor(&b, 6);
    let to_create = claims
        .assign(ExecutorId(6), &mut pod, wanted, &mounted, secs(10))
        .unwrap();
    assert_eq!(claim_names(&pod), ["spark-1-exec-6-pvc-0"]);
    assert_eq!(
        to_create[0].metadata.name.as_deref(),
        Some("spark-1-exec-6-pvc-0")
    );
}

#[test]
fn a_claim_younger_than_a_batch_delay_or_mounted_is_not_free() {
    let mut claims = ExecutorClaims::new(rules(None));
    claims.listed(vec![
        listed("young", "gp3", "10Gi", 10),
        listed("old", "gp3", "10Gi", 0),
        listed("mounted", "gp3", "10Gi", 0),
    ]);
    let mounted = BTreeSet::from(["mounted".to_string()]);
    let free: Vec<&str> = claims
        .free(&mounted, Timestamp(10_500))
        .into_iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(free, ["old"]);
}

#[test]
fn without_reuse_every_executor_creates_its_own_claim() {
    let b = builder(vec![claim_template("gp3", "10Gi")], true);
    let settings = AllocationSettings {
        reuse_claims: true,
        driver_owns_claims: false,
        ..AllocationSettings::default()
    };
    // Pod-owned claims go with their pod: nothing to reuse.
    let rules = ClaimRules::of(&settings, false);
    assert!(!rules.reuse);
    let mut claims = ExecutorClaims::new(rules);
    assert!(!claims.listing_due(secs(0)));
    claims.listed(vec![listed("spark-1-exec-1-pvc-0", "gp3", "10Gi", 0)]);
    let (mut pod, wanted) = executor(&b, 2);
    let to_create = claims
        .assign(ExecutorId(2), &mut pod, wanted, &BTreeSet::new(), secs(60))
        .unwrap();
    assert_eq!(claim_names(&pod), ["spark-1-exec-2-pvc-0"]);
    assert_eq!(to_create.len(), 1);
}

#[test]
fn creation_waits_at_the_maximum_while_no_claim_is_free() {
    let b = builder(vec![claim_template("gp3", "10Gi")], true);
    let mut claims = ExecutorClaims::new(rules(Some(2)));
    let none = BTreeSet::new();
    for id in [1, 2] {
        let (mut pod, wanted) = executor(&b, id);
        let created = claims
            .assign(ExecutorId(id), &mut pod, wanted, &none, secs(0))
            .unwrap();
        assert_eq!(created.len(), 1);
    }
    assert_eq!(claims.count(), 2);
    // Both pods show and mount their claims: at the maximum, none free.
    claims.keep_requests(|_| false);
    let mounted: BTreeSet<String> = ["spark-1-exec-1-pvc-0", "spark-1-exec-2-pvc-0"]
        .map(String::from)
        .into();
    let (mut pod, wanted) = executor(&b, 3);
    let held = claims.assign(ExecutorId(3), &mut pod, wanted, &mounted, secs(60));
    assert_eq!(held, Err(WaitForClaim { claims: 2 }));
    // Executor 1's pod is gone: its claim is free, and executor 3 takes it.
    let mounted = BTreeSet::from(["spark-1-exec-2-pvc-0".to_string()]);
    let (mut pod, wanted) = executor(&b, 3);
    let created = claims
        .assign(ExecutorId(3), &mut pod, wanted, &mounted, secs(60))
        .unwrap();
    assert!(created.is_empty());
    assert_eq!(claim_names(&pod), ["spark-1-exec-1-pvc-0"]);
}

#[test]
fn wait_to_reuse_needs_reuse_and_a_maximum() {
    let base = AllocationSettings {
        wait_to_reuse_claims: true,
        batch_delay: Duration::from_secs(2),
        ..AllocationSettings::default()
    };
    assert_eq!(ClaimRules::of(&base, true).wait_at, None);
    let with_max = AllocationSettings {
        max_claims: Some(4),
        ..base.clone()
    };
    let rules = ClaimRules::of(&with_max, true);
    assert_eq!(
        (rules.reuse, rules.wait_at, rules.min_age_ms),
        (true, Some(4), 2000)
    );
    let no_reuse = AllocationSettings {
        reuse_claims: false,
        ..with_max
    };
    assert_eq!(ClaimRules::of(&no_reuse, true).wait_at, None);
}

#[test]
fn a_listing_keeps_the_claims_created_since_it_was_asked_and_is_due_every_minute() {
    let b = builder(vec![claim_template("gp3", "10Gi")], true);
    let mut claims = ExecutorClaims::new(rules(None));
    assert!(claims.listing_due(secs(0)));
    assert!(!claims.listing_due(secs(59)));
    let (mut pod, wanted) = executor(&b, 1);
    claims
        .assign(ExecutorId(1), &mut pod, wanted, &BTreeSet::new(), secs(1))
        .unwrap();
    claims.keep_requests(|_| false);
    // The listing asked at 0 s misses executor 1's claim, created at 1 s: it is kept.
    claims.listed(vec![listed("from-before", "gp3", "10Gi", -100)]);
    assert_eq!(claims.count(), 2);
    assert!(claims.listing_due(secs(60)));
    // The listing asked at 60 s shows neither: both are gone.
    claims.listed(Vec::new());
    assert_eq!(claims.count(), 0);
}

#[test]
fn quantities_parse_as_kubernetes_writes_them() {
    assert_eq!(quantity_bytes("10Gi"), Some(10 << 30));
    assert_eq!(quantity_bytes("1.5Ti"), Some(3 << 39));
    assert_eq!(quantity_bytes("500M"), Some(500_000_000));
    assert_eq!(quantity_bytes("1e3"), Some(1000));
    assert_eq!(quantity_bytes("1500m"), Some(2));
    assert_eq!(quantity_bytes("123"), Some(123));
    assert_eq!(quantity_bytes("10Gb"), None);
    assert_eq!(quantity_bytes(""), None);
    assert_eq!(quantity_bytes("Gi"), None);
    assert!(quantity_bytes("10Gi") > quantity_bytes("10G"));
}

#[test]
fn a_failed_create_forgets_the_claims_created_for_it() {
    let b = builder(vec![claim_template("gp3", "10Gi")], true);
    let mut claims = ExecutorClaims::new(rules(None));
    let (mut pod, wanted) = executor(&b, 1);
    claims
        .assign(ExecutorId(1), &mut pod, wanted, &BTreeSet::new(), secs(0))
        .unwrap();
    assert_eq!(claims.count(), 1);
    // Its claim may never have been made: no later executor is given it.
    claims.create_failed(ExecutorId(1));
    assert_eq!(claims.count(), 0);
    let (mut pod, wanted) = executor(&b, 2);
    let created = claims
        .assign(ExecutorId(2), &mut pod, wanted, &BTreeSet::new(), secs(60))
        .unwrap();
    assert_eq!(claim_names(&pod), ["spark-1-exec-2-pvc-0"]);
    assert_eq!(created.len(), 1);
}

#[test]
fn a_claim_is_the_applications_only_with_its_labels_and_the_owner_the_service_set() {
    use crate::allocator::claims::owned_claim;
    let with = |labels: serde_json::Value, owner: serde_json::Value| -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "spark-1-exec-1-pvc-0", "labels": labels, "ownerReferences": owner}
        }))
        .unwrap()
    };
    let ours = json!({"spark-app-selector": "spark-1", "spark-role": "executor"});
    let driver = json!([{"apiVersion": "v1", "kind": "Pod", "name": "drv", "uid": "u-drv", "controller": true}]);
    assert!(owned_claim(
        &with(ours.clone(), driver.clone()),
        "spark-1",
        "u-drv"
    ));
    // Forged labels, another owner or none, an owner that is not the controller.
    assert!(!owned_claim(
        &with(ours.clone(), json!([])),
        "spark-1",
        "u-drv"
    ));
    assert!(!owned_claim(
        &with(ours.clone(), driver.clone()),
        "spark-1",
        "u-other"
    ));
    assert!(!owned_claim(
        &with(ours.clone(), driver.clone()),
        "spark-1",
        ""
    ));
    let not_controller =
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "drv", "uid": "u-drv"}]);
    assert!(!owned_claim(
        &with(ours, not_controller),
        "spark-1",
        "u-drv"
    ));
    // Another application's claim, whatever its owner.
    let theirs = json!({"spark-app-selector": "spark-2", "spark-role": "executor"});
    assert!(!owned_claim(&with(theirs, driver), "spark-1", "u-drv"));
}
