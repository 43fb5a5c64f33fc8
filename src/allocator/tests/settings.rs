//! Settings: Spark's defaults and every validation rule, naming the setting.
use std::time::Duration;

use super::*;

#[test]
fn defaults_are_sparks() {
    let s = AllocationSettings::default();
    assert_eq!(s.batch_size, 10);
    assert_eq!(s.batch_delay, Duration::from_secs(1));
    assert_eq!(s.executor_timeout, Duration::from_secs(600));
    assert_eq!(s.executor_idle_timeout, Duration::from_secs(60));
    assert_eq!(s.max_pending_pods, None);
    assert_eq!(s.max_pending_pods_per_profile, None);
    assert_eq!(s.max_executors, None);
    assert!(s.delete_on_termination);
    assert_eq!(s.stuck_pending_timeout, Duration::from_secs(120));
    assert_eq!(s.validate(), Ok(()));
}

#[test]
fn validation_names_the_offending_setting() {
    type Edit = fn(&mut AllocationSettings);
    let cases: &[(&str, Edit, Option<&str>)] = &[
        ("defaults", |_| {}, None),
        ("batch size 0", |s| s.batch_size = 0, Some("batch_size")),
        ("batch size 1", |s| s.batch_size = 1, None),
        (
            "batch delay 100 ms",
            |s| s.batch_delay = Duration::from_millis(100),
            Some("batch_delay_ms"),
        ),
        (
            "batch delay 0",
            |s| s.batch_delay = Duration::ZERO,
            Some("batch_delay_ms"),
        ),
        (
            "batch delay 101 ms",
            |s| s.batch_delay = Duration::from_millis(101),
            None,
        ),
        (
            "timeout below 5 x delay",
            |s| {
                s.batch_delay = Duration::from_secs(2);
                s.executor_timeout = Duration::from_millis(9_999);
            },
            Some("executor_timeout_ms"),
        ),
        (
            "timeout exactly 5 x delay",
            |s| {
                s.batch_delay = Duration::from_secs(2);
                s.executor_timeout = Duration::from_secs(10);
            },
            None,
        ),
        (
            "huge batch delay",
            |s| s.batch_delay = Duration::MAX,
            Some("batch_delay_ms"),
        ),
        (
            "huge idle timeout",
            |s| s.executor_idle_timeout = Duration::MAX,
            Some("executor_idle_timeout_ms"),
        ),
        (
            "idle timeout 0 is allowed",
            |s| s.executor_idle_timeout = Duration::ZERO,
            None,
        ),
        (
            "max pending 0",
            |s| s.max_pending_pods = Some(0),
            Some("max_pending_pods"),
        ),
        ("max pending 1", |s| s.max_pending_pods = Some(1), None),
        (
            "per-profile pending 0",
            |s| s.max_pending_pods_per_profile = Some(0),
            Some("max_pending_pods_per_profile"),
        ),
        (
            "max executors 0",
            |s| s.max_executors = Some(0),
            Some("max_executors"),
        ),
        ("max executors 1", |s| s.max_executors = Some(1), None),
        (
            "stuck timeout 0",
            |s| s.stuck_pending_timeout = Duration::ZERO,
            Some("stuck_pending_timeout_ms"),
        ),
        (
            "stuck timeout too large",
            |s| s.stuck_pending_timeout = Duration::MAX,
            Some("stuck_pending_timeout_ms"),
        ),
        (
            "stuck timeout 1 ms",
            |s| s.stuck_pending_timeout = Duration::from_millis(1),
            None,
        ),
        (
            "container name main",
            |s| s.executor_container_name = "main-1".into(),
            None,
        ),
        (
            "container name empty",
            |s| s.executor_container_name = String::new(),
            Some("executor_container_name"),
        ),
        (
            "container name upper case",
            |s| s.executor_container_name = "Main".into(),
            Some("executor_container_name"),
        ),
        (
            "container name 64 characters",
            |s| s.executor_container_name = "m".repeat(64),
            Some("executor_container_name"),
        ),
    ];
    for (name, edit, expected) in cases {
        let mut s = AllocationSettings::default();
        edit(&mut s);
        let got = s
            .validate()
            .err()
            .map(|SettingsError::Invalid { name, .. }| name);
        assert_eq!(got, *expected, "case {name}");
    }
}

#[test]
fn error_message_carries_name_and_reason() {
    let s = AllocationSettings {
        batch_delay: Duration::from_millis(50),
        ..AllocationSettings::default()
    };
    let message = s.validate().unwrap_err().to_string();
    assert!(message.starts_with("batch_delay_ms: "), "{message}");
    assert!(message.contains("100 ms"), "{message}");
}

#[test]
fn first_difference_names_the_setting_in_the_apis_words() {
    type Edit = fn(&mut AllocationSettings);
    let cases: &[(Edit, Option<&str>)] = &[
        (|_| {}, None),
        (|s| s.batch_size = 3, Some("batch_size")),
        (
            |s| s.batch_delay = Duration::from_millis(1500),
            Some("batch_delay_ms"),
        ),
        (
            |s| s.executor_timeout = Duration::from_secs(30),
            Some("executor_timeout_ms"),
        ),
        (
            |s| s.executor_idle_timeout = Duration::from_secs(5),
            Some("executor_idle_timeout_ms"),
        ),
        (|s| s.max_pending_pods = Some(4), Some("max_pending_pods")),
        (
            |s| s.max_pending_pods_per_profile = Some(4),
            Some("max_pending_pods_per_profile"),
        ),
        (|s| s.max_executors = Some(9), Some("max_executors")),
        (
            |s| s.delete_on_termination = false,
            Some("delete_on_termination"),
        ),
        (
            |s| s.executor_container_name = "main".into(),
            Some("executor_container_name"),
        ),
        (
            |s| s.check_all_containers = true,
            Some("check_all_containers"),
        ),
        (
            |s| s.stuck_pending_timeout = Duration::from_secs(1),
            Some("stuck_pending_timeout_ms"),
        ),
        (
            |s| {
                s.max_executors = Some(9);
                s.batch_size = 3;
            },
            Some("batch_size"),
        ),
    ];
    let first = AllocationSettings::default();
    for (edit, expected) in cases {
        let mut other = first.clone();
        edit(&mut other);
        assert_eq!(first.first_difference(&other), *expected, "{other:?}");
        assert_eq!(other.first_difference(&first), *expected, "{other:?}");
    }
}

#[test]
fn state_rules_follow_the_applications_settings() {
    let s = AllocationSettings {
        executor_container_name: "main".into(),
        check_all_containers: true,
        ..AllocationSettings::default()
    };
    let rules = s.state_rules();
    assert_eq!(rules.executor_container, "main");
    assert!(rules.check_all_containers);
    assert_eq!(
        AllocationSettings::default().state_rules(),
        StateRules::default()
    );
}
