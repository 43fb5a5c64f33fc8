//! Templates registered after the builder was made (resource profiles added while an
//! application runs): all or none, idempotent for an equal template, refused for another.
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::*;

fn pod(value: Value) -> Pod {
    serde_json::from_value(value).expect("test template")
}

fn executor_template(image: &str) -> Pod {
    pod(json!({
        "metadata": { "labels": { "team": "data" } },
        "spec": { "containers": [{ "name": "spark-kubernetes-executor", "image": image }] }
    }))
}

fn base() -> ExecutorPodBuilder {
    let templates = BTreeMap::from([(rp(0), executor_template("spark:4"))]);
    ExecutorPodBuilder::new("spark-123", "app", templates, None, "").expect("builder")
}

#[test]
fn registration_is_all_or_none() {
    let imageless =
        pod(json!({ "spec": { "containers": [{ "name": "spark-kubernetes-executor" }] } }));
    // Map-order differences and an explicit empty list vs. none parse alike only where
    // serde makes them equal: equality is of parsed Pods.
    let same_labels_reordered = pod(json!({
        "spec": { "containers": [{ "image": "spark:4", "name": "spark-kubernetes-executor" }] },
        "metadata": { "labels": { "team": "data" } }
    }));
    // (templates given, expected error, profiles afterwards when accepted)
    type Case = (
        &'static str,
        Vec<(i32, Pod)>,
        Option<TemplateError>,
        Vec<i32>,
    );
    let cases: Vec<Case> = vec![
        ("nothing", vec![], None, vec![0]),
        (
            "a new profile",
            vec![(1, executor_template("spark:4"))],
            None,
            vec![0, 1],
        ),
        (
            "known profile, equal template (other key order)",
            vec![
                (0, same_labels_reordered),
                (2, executor_template("spark:4")),
            ],
            None,
            vec![0, 2],
        ),
        (
            "known profile, other template",
            vec![
                (0, executor_template("spark:5")),
                (1, executor_template("spark:4")),
            ],
            Some(TemplateError::Conflict(rp(0))),
            vec![],
        ),
        (
            "a bad new template beside a good one",
            vec![(1, executor_template("spark:4")), (2, imageless)],
            Some(TemplateError::Invalid {
                profile: rp(2),
                reason: "container `spark-kubernetes-executor` has no image".into(),
            }),
            vec![],
        ),
    ];
    for (name, given, error, profiles) in cases {
        let b = base();
        let result = b.with_templates(given.into_iter().map(|(p, t)| (rp(p), t)).collect());
        match (result, error) {
            (Ok(next), None) => {
                let got: Vec<i32> = next.profiles().map(|p| p.0).collect();
                assert_eq!(got, profiles, "{name}");
                for profile in next.profiles() {
                    assert!(next.build(ExecutorId(1), profile).is_ok(), "{name}");
                }
            }
            (Err(err), Some(expected)) => assert_eq!(err, expected, "{name}"),
            (result, _) => panic!("{name}: unexpected {result:?}"),
        }
        // The builder it was called on never changes.
        assert_eq!(
            b.profiles().map(|p| p.0).collect::<Vec<_>>(),
            vec![0],
            "{name}"
        );
    }
}

#[test]
fn a_registered_profile_keeps_its_first_template() {
    let b = base()
        .with_templates(BTreeMap::from([(rp(1), executor_template("gpu:1"))]))
        .expect("registered");
    let again = b
        .with_templates(BTreeMap::from([(rp(1), executor_template("gpu:1"))]))
        .expect("idempotent");
    assert_eq!(again.template(rp(1)), Some(&executor_template("gpu:1")));
    assert_eq!(
        b.with_templates(BTreeMap::from([(rp(1), executor_template("gpu:2"))]))
            .map(|_| ()),
        Err(TemplateError::Conflict(rp(1)))
    );
    let pod = again.build(ExecutorId(5), rp(1)).expect("built");
    let labels = pod.metadata.labels.unwrap_or_default();
    assert_eq!(labels["spark-exec-resourceprofile-id"], "1");
}
