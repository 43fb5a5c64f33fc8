use super::*;

const TEMPLATE: &str = "apiVersion: v1\nkind: Pod\nspec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n";

/// A Pod from YAML or JSON within the default [`RequestLimits`].
fn pod_template(field: &str, text: &str) -> Result<Pod, AppError> {
    parse(field, text, &RequestLimits::default())
}

fn field_of(err: AppError) -> (String, String) {
    match err {
        AppError::InvalidArgument { field, message } => (field, message),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn templates_accept_json_and_report_the_line_of_an_error() {
    let json =
        r#"{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"x","image":"y"}]}}"#;
    let pod = pod_template("executor_pod_template", json).unwrap();
    assert_eq!(pod.spec.unwrap().containers[0].name, "x");

    let broken = "apiVersion: v1\nkind: Pod\nspec:\n  containers: [\n";
    let (field, message) = field_of(pod_template("executor_pod_template", broken).unwrap_err());
    assert_eq!(field, "executor_pod_template");
    assert!(message.contains("line "), "{message}");

    let json_wrong_type =
        "{\"apiVersion\": \"v1\",\n \"kind\": \"Pod\",\n \"spec\": {\"containers\": 7}}";
    let (_, message) =
        field_of(pod_template("executor_pod_template", json_wrong_type).unwrap_err());
    assert!(
        message.contains("not a Pod") && message.contains("line 3"),
        "{message}"
    );
    let (_, message) = field_of(pod_template("t", "{\"kind\": \"Pod\",\n").unwrap_err());
    assert!(
        message.contains("not valid JSON") && message.contains("line 2"),
        "{message}"
    );

    let wrong_type = "apiVersion: v1\nkind: Pod\nspec:\n  containers: 7\n";
    let (_, message) = field_of(pod_template("executor_pod_template", wrong_type).unwrap_err());
    assert!(
        message.contains("not a Pod") && message.contains("line 4"),
        "{message}"
    );
}

#[test]
fn a_template_that_is_not_a_pod_is_refused() {
    for text in [
        "apiVersion: apps/v1\nkind: Deployment\n",
        "just text",
        "[1, 2]",
    ] {
        let (field, message) = field_of(pod_template("executor_pod_template", text).unwrap_err());
        assert_eq!(field, "executor_pod_template");
        assert!(message.contains("not a Pod"), "{text}: {message}");
    }
}

#[test]
fn hostile_templates_are_refused_not_expanded() {
    // A billion laughs: nine levels of nine aliases each.
    let mut bomb = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for (prev, next) in ('a'..='h').zip('b'..='i') {
        let refs = vec![format!("*{prev}"); 9].join(", ");
        bomb.push_str(&format!("{next}: &{next} [{refs}]\n"));
    }
    bomb.push_str("metadata:\n  labels: *i\n");
    let (field, message) = field_of(pod_template("executor_pod_template", &bomb).unwrap_err());
    assert_eq!(field, "executor_pod_template");
    assert!(message.starts_with("not valid"), "{message}");
    // Nesting is refused by the scan, before the parser (quadratic in the depth) runs.
    let deep_flow = "[".repeat(100_000);
    let deep_json = "{\"a\":".repeat(10_000);
    let deep_block: String = (0..40)
        .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
        .collect();
    let deep_dashes = format!("{}x\n", "- ".repeat(40));
    for text in [&deep_flow, &deep_json, &deep_block, &deep_dashes] {
        let started = std::time::Instant::now();
        let (field, message) = field_of(pod_template("executor_pod_template", text).unwrap_err());
        assert_eq!(field, "executor_pod_template");
        assert!(message.contains("nested more than 32 levels"), "{message}");
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
    }
    let big = format!("{TEMPLATE}# {}\n", "x".repeat(300 * 1024));
    let (_, message) = field_of(pod_template("executor_pod_template", &big).unwrap_err());
    assert!(message.contains("limits.max_template_bytes"), "{message}");
}

#[test]
fn the_depth_scan_counts_what_nests_and_skips_what_does_not() {
    // (text, depth the scan must accept, one less it must refuse)
    let rows: &[(&str, usize)] = &[
        ("a: 1\n", 1),
        ("a:\n  b:\n    c: 1\n", 3),
        ("a: [[1], {b: [2]}]\n", 4),
        ("- - - x\n", 3),
        ("a:\n- b: 1\n  c:\n    d: 1\n", 3),
        ("a: \"[[[[[\"\nb: '{{{{'\n", 1),
        ("a: x # [[[[[[\n", 1),
        ("s: |\n  [[[[[[\n  {{{{{{\nb: 1\n", 1),
        ("{\"a\": {\n  \"b\": {\n    \"c\": 1}}}\n", 4),
        ("it: it's [x]\n", 2),
    ];
    for (text, depth) in rows {
        assert_eq!(too_deep(text, *depth), None, "{text:?} at {depth}");
        assert!(
            too_deep(text, depth - 1).is_some(),
            "{text:?} under {depth}"
        );
    }
    let spark_like = "apiVersion: v1\nkind: Pod\nspec:\n  affinity:\n    nodeAffinity:\n      \
        requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        \
        - matchExpressions:\n          - key: zone\n            operator: In\n            \
        values: [a, b]\n";
    assert_eq!(too_deep(spark_like, 32), None);
}

proptest::proptest! {
    /// Any text, however broken, is scanned without a panic, and a deeper limit never
    /// refuses what a shallower one accepts.
    #[test]
    fn the_depth_scan_takes_any_text(text in "[ -~\\n\\t\u{e9}\u{1f600}]{0,200}", max in 1usize..8) {
        let shallow = too_deep(&text, max);
        if shallow.is_none() {
            proptest::prop_assert!(too_deep(&text, max + 1).is_none());
        }
    }
}

#[test]
fn template_errors_name_the_request_field() {
    let err = template_error(TemplateError::NoTemplate(ResourceProfileId(0)));
    assert!(
        matches!(err, AppError::InvalidArgument { field, .. } if field == "executor_pod_template")
    );
    let err = template_error(TemplateError::Invalid {
        profile: ResourceProfileId(3),
        reason: "container `x` has no image".into(),
    });
    assert!(
        matches!(err, AppError::InvalidArgument { field, .. } if field == "resource_profile_templates[3]")
    );
    let err = template_error(TemplateError::Conflict(ResourceProfileId(2)));
    assert!(
        matches!(&err, AppError::FailedPrecondition(m) if m.starts_with("resource_profile_templates[2]: ")),
        "{err:?}"
    );
    let err = template_error(TemplateError::Conflict(ResourceProfileId(0)));
    assert!(
        matches!(&err, AppError::FailedPrecondition(m) if m.starts_with("executor_pod_template: ")),
        "{err:?}"
    );
}
