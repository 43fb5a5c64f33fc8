//! Executor pods from templates: name, labels, env, hostname, owner, template checks.
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;

fn template(value: Value) -> Pod {
    serde_json::from_value(value).expect("test template")
}

fn basic_template() -> Pod {
    template(json!({
        "metadata": { "labels": { "team": "data" }, "uid": "old", "resourceVersion": "9", "namespace": "elsewhere" },
        "spec": { "containers": [
            { "name": "sidecar", "image": "envoy" },
            { "name": "spark-kubernetes-executor", "image": "spark:4",
              "env": [{ "name": "KEEP", "value": "1" }, { "name": "SPARK_EXECUTOR_ID", "value": "stale" }] }
        ] },
        "status": { "phase": "Running" }
    }))
}

fn driver() -> Option<DriverOwner> {
    Some(DriverOwner {
        name: "driver-pod".into(),
        uid: "uid-1".into(),
    })
}

fn builder(templates: Vec<(i32, Pod)>, prefix: &str) -> Result<ExecutorPodBuilder, TemplateError> {
    let templates = templates
        .into_iter()
        .map(|(p, t)| (ResourceProfileId(p), t))
        .collect();
    ExecutorPodBuilder::new(
        "spark-123",
        prefix,
        templates,
        driver(),
        "spark-kubernetes-executor",
    )
}

fn as_json(pod: &Pod) -> Value {
    serde_json::to_value(pod).expect("serialisable")
}

#[test]
fn stamps_name_labels_env_hostname_owner() {
    let b = builder(vec![(3, basic_template())], "my-app").expect("valid");
    let pod = as_json(&b.build(ExecutorId(17), rp(3)).expect("built"));
    assert_eq!(pod["metadata"]["name"], "my-app-exec-17");
    assert_eq!(
        pod["metadata"]["labels"],
        json!({
            "team": "data",
            "spark-app-selector": "spark-123",
            "spark-role": "executor",
            "spark-exec-id": "17",
            "spark-exec-resourceprofile-id": "3",
        })
    );
    assert_eq!(pod["metadata"].get("uid"), None);
    assert_eq!(pod["metadata"].get("namespace"), None);
    assert_eq!(pod["metadata"].get("resourceVersion"), None);
    assert_eq!(pod.get("status"), None);
    assert_eq!(
        pod["metadata"]["ownerReferences"],
        json!([{ "apiVersion": "v1", "kind": "Pod", "name": "driver-pod", "uid": "uid-1", "controller": true }])
    );
    assert_eq!(pod["spec"]["hostname"], "my-app-exec-17");
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
    let containers = pod["spec"]["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 2);
    assert_eq!(
        containers[0],
        json!({ "name": "sidecar", "image": "envoy" })
    );
    assert_eq!(containers[1]["image"], "spark:4");
    assert_eq!(
        containers[1]["env"],
        json!([
            { "name": "KEEP", "value": "1" },
            { "name": "SPARK_EXECUTOR_ID", "value": "17" },
            { "name": "SPARK_APPLICATION_ID", "value": "spark-123" },
            { "name": "SPARK_RESOURCE_PROFILE_ID", "value": "3" },
            { "name": "SPARK_EXECUTOR_POD_IP",
              "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "status.podIP" } } },
            { "name": "SPARK_EXECUTOR_POD_NAME",
              "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.name" } } },
        ])
    );
}

#[test]
fn built_pods_map_back_to_their_executor() {
    let b = builder(vec![(3, basic_template())], "my-app").expect("valid");
    let pod = b.build(ExecutorId(17), rp(3)).expect("built");
    let back = executor_pod_from(&pod, &StateRules::default()).expect("an executor");
    assert_eq!(
        (back.id, back.profile, back.pod_name.as_str()),
        (ExecutorId(17), rp(3), "my-app-exec-17")
    );
}

#[test]
fn prefix_is_sanitised_to_a_dns_label() {
    let long = "a".repeat(100);
    let dashy = format!("{}-b", "x".repeat(55));
    let cases: Vec<(&str, &str, u64, String)> = vec![
        ("clean", "app", 1, "app-exec-1".into()),
        (
            "upper case and symbols",
            "My_App.Name",
            2,
            "my-app-name-exec-2".into(),
        ),
        (
            "leading and trailing junk",
            "--Spark Pi!--",
            3,
            "spark-pi-exec-3".into(),
        ),
        ("empty", "", 4, "spark-exec-4".into()),
        ("only junk", "__..", 5, "spark-exec-5".into()),
        ("non-ascii", "données", 6, "donn-es-exec-6".into()),
        (
            "long prefix truncated",
            long.as_str(),
            7,
            format!("{}-exec-7", "a".repeat(56)),
        ),
        (
            "long id truncates more",
            long.as_str(),
            1_000_000,
            format!("{}-exec-1000000", "a".repeat(50)),
        ),
        // Cut at 56 lands on a '-': it is dropped so the name stays a DNS label.
        (
            "no dash before the suffix",
            dashy.as_str(),
            8,
            format!("{}-exec-8", "x".repeat(55)),
        ),
    ];
    for (name, prefix, id, expected) in cases {
        let b = builder(vec![(0, basic_template())], prefix).expect("valid");
        let pod = b.build(ExecutorId(id), rp(0)).expect("built");
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        assert_eq!(pod_name, expected, "case {name}");
        assert!(pod_name.len() <= 63, "case {name}");
        assert_eq!(
            pod.spec.and_then(|s| s.hostname),
            Some(expected),
            "case {name}"
        );
    }
}

#[test]
fn reserved_labels_are_refused() {
    for label in [
        "spark-app-selector",
        "spark-role",
        "spark-exec-id",
        "spark-exec-resourceprofile-id",
        "spark-exec-inactive",
    ] {
        let bad = template(
            json!({ "metadata": { "labels": { label: "x" } }, "spec": { "containers": [] } }),
        );
        let err = builder(vec![(0, basic_template()), (4, bad)], "app").expect_err("refused");
        assert!(
            matches!(&err, TemplateError::Invalid { profile, .. } if *profile == rp(4)),
            "{label}: {err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains(label) && message.contains("resource profile 4"),
            "{message}"
        );
    }
}

#[test]
fn unknown_profile() {
    let b = builder(vec![(0, basic_template())], "app").expect("valid");
    assert!(b.has_profile(rp(0)));
    assert!(!b.has_profile(rp(1)));
    assert_eq!(
        b.build(ExecutorId(1), rp(1)),
        Err(TemplateError::NoTemplate(rp(1)))
    );
}

#[test]
fn executor_container_is_found_renamed_or_added() {
    // (template containers, expected container names after building, index of the env)
    let cases: Vec<(&str, Value, Vec<&str>, usize)> = vec![
        (
            "none: added",
            json!([]),
            vec!["spark-kubernetes-executor"],
            0,
        ),
        (
            "single other name: it is the executor",
            json!([{ "name": "main", "image": "spark" }]),
            vec!["spark-kubernetes-executor"],
            0,
        ),
        (
            "several, none named: added",
            json!([{ "name": "a" }, { "name": "b" }]),
            vec!["a", "b", "spark-kubernetes-executor"],
            2,
        ),
        (
            "named among others",
            json!([{ "name": "a" }, { "name": "spark-kubernetes-executor" }, { "name": "b" }]),
            vec!["a", "spark-kubernetes-executor", "b"],
            1,
        ),
    ];
    for (name, containers, expected, env_at) in cases {
        let t = template(json!({ "spec": { "containers": containers } }));
        let b = builder(vec![(0, t)], "app").expect("valid");
        let pod = as_json(&b.build(ExecutorId(1), rp(0)).expect("built"));
        let built = pod["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = built.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, expected, "case {name}");
        for (i, c) in built.iter().enumerate() {
            assert_eq!(
                c.get("env").is_some(),
                i == env_at,
                "case {name}, container {i}"
            );
        }
    }
}

#[test]
fn template_without_spec_or_driver() {
    let templates = BTreeMap::from([(rp(0), Pod::default())]);
    let b = ExecutorPodBuilder::new("app-1", "p", templates, None, "").expect("valid");
    let pod = as_json(&b.build(ExecutorId(9), rp(0)).expect("built"));
    assert_eq!(pod["metadata"].get("ownerReferences"), None);
    assert_eq!(
        pod["spec"]["containers"][0]["name"],
        "spark-kubernetes-executor"
    );
    assert_eq!(pod["spec"]["restartPolicy"], "Never");
}

#[test]
fn the_driver_replaces_a_template_controller() {
    let t = template(json!({
        "metadata": { "ownerReferences": [
            { "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u0", "controller": true },
            { "apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "u2" }
        ] },
        "spec": { "containers": [] }
    }));
    let b = builder(vec![(0, t)], "app").expect("valid");
    let pod = as_json(&b.build(ExecutorId(1), rp(0)).expect("built"));
    let owners: Vec<&str> = pod["metadata"]["ownerReferences"]
        .as_array()
        .map(|o| o.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(owners, vec!["cm", "driver-pod"]);
}

fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let ok_char = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-';
    !name.is_empty()
        && name.len() <= 63
        && bytes.iter().all(ok_char)
        && bytes.first().is_some_and(|b| *b != b'-')
        && bytes.last().is_some_and(|b| *b != b'-')
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// Whatever prefix the driver sends, every pod name (and hostname) is a DNS-1123 label
    /// that ends in `-exec-<id>`.
    #[test]
    fn names_are_always_dns_labels(prefix in "\\PC{0,80}", id in 1u64..=u64::MAX) {
        let b = builder(vec![(0, basic_template())], &prefix).expect("valid");
        let name = b.pod_name(ExecutorId(id));
        proptest::prop_assert!(is_dns_label(&name), "{name:?}");
        let suffix = format!("-exec-{id}");
        proptest::prop_assert!(name.ends_with(&suffix), "{name:?}");
    }
}

fn default_prefix(app_id: &str) -> ExecutorPodBuilder {
    let templates = BTreeMap::from([(rp(0), basic_template())]);
    ExecutorPodBuilder::for_application(app_id, None, templates, driver(), "").expect("valid")
}

#[test]
fn stable_hash_is_32_bit_fnv_1a() {
    use crate::allocator::pod_builder::stable_hash;
    // Published FNV-1a test vectors: the hash must never change between versions.
    assert_eq!(stable_hash(""), "811c9dc5");
    assert_eq!(stable_hash("a"), "e40c292c");
    assert_eq!(stable_hash("foobar"), "bf9cf968");
}

#[test]
fn default_prefix_is_the_application_id_when_sanitising_keeps_it() {
    let b = default_prefix("spark-app-1");
    assert_eq!(b.pod_name(ExecutorId(3)), "spark-app-1-exec-3");
}

#[test]
fn lossy_application_ids_get_their_own_pod_names() {
    use crate::allocator::pod_builder::stable_hash;
    let clean = default_prefix("spark-app-1");
    let lossy = default_prefix("Spark_app.1");
    let other_lossy = default_prefix("spark_app_1");
    let names = [&clean, &lossy, &other_lossy].map(|b| b.pod_name(ExecutorId(1)));
    assert_eq!(
        names[1],
        format!("spark-app-1-{}-exec-1", stable_hash("Spark_app.1"))
    );
    assert_eq!(
        names.iter().collect::<BTreeSet<_>>().len(),
        3,
        "all distinct: {names:?}"
    );
    // The same id always gives the same names (a restarted service finds its pods).
    assert_eq!(
        default_prefix("Spark_app.1").pod_name(ExecutorId(1)),
        names[1]
    );
}

#[test]
fn an_explicit_prefix_is_used_as_given() {
    let templates = BTreeMap::from([(rp(0), basic_template())]);
    let b = ExecutorPodBuilder::for_application(
        "Spark_app.1",
        Some("My_Prefix"),
        templates,
        driver(),
        "",
    )
    .expect("valid");
    assert_eq!(b.pod_name(ExecutorId(2)), "my-prefix-exec-2");
}

#[test]
fn long_application_ids_keep_their_hash_when_cut() {
    // Two ids equal in their first 60 characters would be cut to the same prefix.
    let a = format!("{}-one", "a".repeat(59));
    let b = format!("{}-two", "a".repeat(59));
    for id in [1, 12_345, u64::MAX] {
        let name_a = default_prefix(&a).pod_name(ExecutorId(id));
        let name_b = default_prefix(&b).pod_name(ExecutorId(id));
        assert_ne!(name_a, name_b);
        for name in [&name_a, &name_b] {
            assert!(is_dns_label(name), "{name}");
            assert!(name.ends_with(&format!("-exec-{id}")), "{name}");
        }
    }
    // A short clean id is not touched.
    assert_eq!(
        default_prefix("a1").pod_name(ExecutorId(u64::MAX)),
        format!("a1-exec-{}", u64::MAX)
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// Distinct application ids (label values) never name their pods alike, also when
    /// they differ only in what sanitising drops (case, `_`, `.`), and every name is a
    /// DNS-1123 label ending in `-exec-<id>`.
    #[test]
    fn distinct_application_ids_never_share_pod_names(
        a in "[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?",
        b in "[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?",
        id in 1u64..=u64::MAX,
    ) {
        let lookalikes = [
            a.to_ascii_lowercase(),
            a.to_ascii_uppercase(),
            a.replace(['_', '.'], "-"),
            a.replace('-', "_"),
            a.replace('-', "."),
            a.clone(),
            b,
        ];
        let mut names = BTreeMap::new();
        for app in lookalikes.iter().collect::<BTreeSet<_>>() {
            let name = default_prefix(app).pod_name(ExecutorId(id));
            proptest::prop_assert!(is_dns_label(&name), "{name:?}");
            proptest::prop_assert!(name.ends_with(&format!("-exec-{id}")), "{name:?}");
            if let Some(other) = names.insert(name.clone(), app) {
                proptest::prop_assert!(false, "{app:?} and {other:?} both give {name:?}");
            }
        }
    }
}
