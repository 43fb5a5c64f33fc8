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
fn sparks_labels_in_a_template_are_overwritten() {
    // (label in the template, its value there, the value on the built pod, or None: dropped)
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("spark-app-selector", "spark-other", Some("spark-123")),
        ("spark-role", "driver", Some("executor")),
        ("spark-exec-id", "{{EXECUTOR_ID}}", Some("17")),
        ("spark-exec-id", "999", Some("17")),
        ("spark-exec-resourceprofile-id", "0", Some("3")),
        // Born inactive, a pod would be invisible to the engine: only the service marks it.
        ("spark-exec-inactive", "true", None),
        ("spark-app-name", "pi", Some("pi")),
    ];
    for (label, given, expected) in cases {
        let t = template(json!({
            "metadata": { "labels": { *label: given } },
            "spec": { "containers": [{ "name": "spark-kubernetes-executor", "image": "spark:4" }] }
        }));
        let b = builder(vec![(3, t)], "app").expect("accepted");
        assert_eq!(b.check(), Ok(()), "{label}={given}");
        let pod = b.build(ExecutorId(17), rp(3)).expect("built");
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(*label).map(String::as_str),
            *expected,
            "{label}={given}"
        );
        let back = executor_pod_from(&pod, &StateRules::default()).expect("an executor");
        assert_eq!((back.id, back.profile), (ExecutorId(17), rp(3)), "{label}");
    }
}

/// The pod Spark builds for an executor whose id is the literal `{{EXECUTOR_ID}}` (what a
/// Spark plugin sends as its template), trimmed to what matters here.
fn spark_built_template() -> Pod {
    template(json!({
        "metadata": {
            "name": "pi-7f3a-exec-{{EXECUTOR_ID}}",
            "labels": {
                "spark-app-selector": "spark-123",
                "spark-role": "executor",
                "spark-exec-id": "{{EXECUTOR_ID}}",
                "spark-exec-resourceprofile-id": "0",
                "spark-app-name": "pi",
                "shard": "{{APP_ID}}-{{EXECUTOR_ID}}",
            },
            "annotations": { "log-path": "/logs/{{APP_ID}}/{{EXECUTOR_ID}}", "fixed": "{{OTHER}}" },
        },
        "spec": {
            "hostname": "pi-7f3a-exec-__EXECUTOR_ID__",
            "initContainers": [{
                "name": "init", "image": "busybox",
                "args": ["mkdir", "/data/{{EXECUTOR_ID}}"],
                "env": [{ "name": "DIR", "value": "/data/{{APP_ID}}/{{EXECUTOR_ID}}" }],
            }],
            "containers": [{
                "name": "spark-kubernetes-executor", "image": "spark:4",
                "args": ["executor", "--id={{EXECUTOR_ID}}"],
                "command": ["/opt/entrypoint.sh", "{{EXECUTOR_ID}}"],
                "env": [
                    { "name": "SPARK_EXECUTOR_ID", "value": "{{EXECUTOR_ID}}" },
                    { "name": "SPARK_APPLICATION_ID", "value": "spark-123" },
                    { "name": "SPARK_JAVA_OPT_0", "value": "-Dspark.driver.port=7078" },
                    { "name": "SPARK_JAVA_OPT_1", "value": "-Dlog=/tmp/{{APP_ID}}-{{EXECUTOR_ID}}.log" },
                    { "name": "SPARK_EXECUTOR_DIRS", "value": "/data/{{EXECUTOR_ID}}" },
                    { "name": "SPARK_EXECUTOR_POD_IP",
                      "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "status.podIP" } } },
                ],
            }],
            "volumes": [
                { "name": "data", "persistentVolumeClaim": { "claimName": "pi-exec-{{EXECUTOR_ID}}-pvc-0" } },
                { "name": "tmp", "emptyDir": {} },
            ],
        },
    }))
}

#[test]
fn app_and_executor_ids_are_substituted_where_spark_does() {
    let b = builder(vec![(0, spark_built_template())], "pi-7f3a").expect("accepted");
    assert_eq!(b.check(), Ok(()));
    for id in [1u64, 42] {
        let pod = as_json(&b.build(ExecutorId(id), rp(0)).expect("built"));
        let env = |container: &Value, name: &str| {
            container["env"]
                .as_array()
                .and_then(|e| e.iter().find(|v| v["name"] == name))
                .map(|v| v["value"].clone())
        };
        let executor = &pod["spec"]["containers"][0];
        let init = &pod["spec"]["initContainers"][0];
        let name = format!("pi-7f3a-exec-{id}");
        // (what, found, expected)
        let checks: Vec<(&str, Value, Value)> = vec![
            ("pod name", pod["metadata"]["name"].clone(), json!(name)),
            ("hostname", pod["spec"]["hostname"].clone(), json!(name)),
            (
                "spark-exec-id",
                pod["metadata"]["labels"]["spark-exec-id"].clone(),
                json!(id.to_string()),
            ),
            (
                "other label",
                pod["metadata"]["labels"]["shard"].clone(),
                json!(format!("spark-123-{id}")),
            ),
            (
                "annotation",
                pod["metadata"]["annotations"]["log-path"].clone(),
                json!(format!("/logs/spark-123/{id}")),
            ),
            (
                "unknown placeholder",
                pod["metadata"]["annotations"]["fixed"].clone(),
                json!("{{OTHER}}"),
            ),
            (
                "SPARK_EXECUTOR_ID",
                env(executor, "SPARK_EXECUTOR_ID").unwrap_or_default(),
                json!(id.to_string()),
            ),
            (
                "java option",
                env(executor, "SPARK_JAVA_OPT_1").unwrap_or_default(),
                json!(format!("-Dlog=/tmp/spark-123-{id}.log")),
            ),
            (
                "plain env",
                env(executor, "SPARK_JAVA_OPT_0").unwrap_or_default(),
                json!("-Dspark.driver.port=7078"),
            ),
            (
                "executor dirs",
                env(executor, "SPARK_EXECUTOR_DIRS").unwrap_or_default(),
                json!(format!("/data/{id}")),
            ),
            (
                "args",
                executor["args"].clone(),
                json!(["executor", format!("--id={id}")]),
            ),
            // Spark leaves the command alone, and so does the service.
            (
                "command",
                executor["command"].clone(),
                json!(["/opt/entrypoint.sh", "{{EXECUTOR_ID}}"]),
            ),
            (
                "init env",
                env(init, "DIR").unwrap_or_default(),
                json!(format!("/data/spark-123/{id}")),
            ),
            (
                "init args",
                init["args"].clone(),
                json!(["mkdir", format!("/data/{id}")]),
            ),
            (
                "claim name",
                pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"].clone(),
                json!(format!("pi-exec-{id}-pvc-0")),
            ),
        ];
        for (what, found, expected) in checks {
            assert_eq!(found, expected, "executor {id}: {what}");
        }
    }
    // The template itself is untouched: the next executor substitutes afresh.
    assert_eq!(b.template(rp(0)), Some(&spark_built_template()));
}

#[test]
fn templates_are_checked_for_labels_that_stay_valid_once_substituted() {
    let long_app = "a".repeat(60);
    // (label key, label value, app id, refused because of)
    let cases: Vec<(&str, String, &str, Option<&str>)> = vec![
        ("team", "data".into(), "spark-123", None),
        ("team", "".into(), "spark-123", None),
        ("example.com/team", "data".into(), "spark-123", None),
        ("shard", "exec-{{EXECUTOR_ID}}".into(), "spark-123", None),
        ("shard", "{{APP_ID}}".into(), &long_app, None),
        // The widest id (20 digits) must fit too.
        (
            "shard",
            format!("{}-{{{{EXECUTOR_ID}}}}", "x".repeat(42)),
            "spark-123",
            None,
        ),
        (
            "shard",
            format!("{}-{{{{EXECUTOR_ID}}}}", "x".repeat(43)),
            "spark-123",
            Some("shard"),
        ),
        (
            "shard",
            "{{APP_ID}}-{{EXECUTOR_ID}}".into(),
            &long_app,
            Some("shard"),
        ),
        (
            "shard",
            "exec {{EXECUTOR_ID}}".into(),
            "spark-123",
            Some("shard"),
        ),
        ("shard", "{{OTHER}}".into(), "spark-123", Some("shard")),
        ("shard", "-x".into(), "spark-123", Some("shard")),
        ("bad key!", "x".into(), "spark-123", Some("bad key!")),
        (
            "Bad_Prefix/x",
            "x".into(),
            "spark-123",
            Some("Bad_Prefix/x"),
        ),
        (
            "example.com/",
            "x".into(),
            "spark-123",
            Some("example.com/"),
        ),
    ];
    for (key, value, app, refused) in cases {
        let t = template(json!({
            "metadata": { "labels": { key: value } },
            "spec": { "containers": [{ "name": "spark-kubernetes-executor", "image": "spark:4" }] }
        }));
        let b = ExecutorPodBuilder::new(app, "app", BTreeMap::from([(rp(2), t)]), None, "")
            .expect("builder");
        let what = format!("{key}={value:?} for {app}");
        match (b.check(), refused) {
            (Ok(()), None) => {}
            (Err(TemplateError::Invalid { profile, reason }), Some(label)) => {
                assert_eq!(profile, rp(2), "{what}");
                assert!(reason.contains(&format!("`{label}`")), "{what}: {reason}");
            }
            (result, _) => panic!("{what}: unexpected {result:?}"),
        }
    }
}

#[test]
fn templates_need_images() {
    // (containers, init containers, refused)
    let cases: Vec<(Value, Value, bool)> = vec![
        (
            json!([{ "name": "spark-kubernetes-executor", "image": "spark:4" }]),
            json!([]),
            false,
        ),
        (
            json!([{ "name": "spark-kubernetes-executor" }]),
            json!([]),
            true,
        ),
        (
            json!([{ "name": "spark-kubernetes-executor", "image": " " }]),
            json!([]),
            true,
        ),
        (
            json!([{ "name": "spark-kubernetes-executor", "image": "spark:4" }]),
            json!([{ "name": "i" }]),
            true,
        ),
        // Two containers, none the executor's: one without an image would be added.
        (
            json!([{ "name": "a", "image": "x" }, { "name": "b", "image": "y" }]),
            json!([]),
            true,
        ),
    ];
    for (containers, init, refused) in cases {
        let what = format!("{containers} / {init}");
        let t = template(json!({ "spec": { "containers": containers, "initContainers": init } }));
        let b = builder(vec![(0, t)], "app").expect("builder");
        assert_eq!(b.check().is_err(), refused, "{what}");
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

use crate::naming::is_dns_label;

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
    use crate::naming::stable_hash;
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
    use crate::naming::stable_hash;
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
