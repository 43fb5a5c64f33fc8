//! Settings: Spark's defaults and every validation rule, naming the setting.
use std::time::Duration;

use super::*;

#[test]
fn defaults_are_sparks_but_the_policy_is_adaptive() {
    let s = AllocationSettings::default();
    assert_eq!(s.policy, AllocationPolicy::Adaptive);
    assert_eq!(AllocationPolicy::default(), AllocationPolicy::Adaptive);
    assert_eq!(s.batch_size, 10);
    assert_eq!(s.batch_delay, Duration::from_secs(1));
    assert_eq!(s.executor_timeout, Duration::from_secs(600));
    assert_eq!(s.executor_idle_timeout, Duration::from_secs(60));
    assert_eq!(s.max_pending_pods, None);
    assert_eq!(s.max_pending_pods_per_profile, None);
    assert_eq!(s.max_executors, None);
    assert_eq!(s.min_executors_at_once, None);
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
            "gang of 0",
            |s| s.min_executors_at_once = Some(0),
            Some("min_executors_at_once"),
        ),
        (
            "gang beyond the batch size",
            |s| s.min_executors_at_once = Some(50),
            None,
        ),
        (
            "gang above max pending",
            |s| {
                s.max_pending_pods = Some(7);
                s.min_executors_at_once = Some(8);
            },
            Some("min_executors_at_once"),
        ),
        (
            "gang at max pending",
            |s| {
                s.max_pending_pods = Some(8);
                s.max_pending_pods_per_profile = Some(8);
                s.max_executors = Some(8);
                s.min_executors_at_once = Some(8);
            },
            None,
        ),
        (
            "gang above per-profile pending",
            |s| {
                s.max_pending_pods_per_profile = Some(7);
                s.min_executors_at_once = Some(8);
            },
            Some("min_executors_at_once"),
        ),
        (
            "gang above max executors",
            |s| {
                s.max_executors = Some(7);
                s.min_executors_at_once = Some(8);
            },
            Some("min_executors_at_once"),
        ),
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
fn a_gang_too_large_for_a_cap_names_the_cap() {
    let s = AllocationSettings {
        max_pending_pods_per_profile: Some(5),
        min_executors_at_once: Some(6),
        ..AllocationSettings::default()
    };
    let message = s.validate().unwrap_err().to_string();
    assert!(
        message.starts_with("min_executors_at_once: ")
            && message.contains("max_pending_pods_per_profile (5)"),
        "{message}"
    );
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
            |s| s.min_executors_at_once = Some(4),
            Some("min_executors_at_once"),
        ),
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

/// Unset, the gang stays out of the stored JSON, so a registration without one reads the same
/// in a version that does not know the setting.
#[test]
fn an_unset_gang_is_left_out_of_the_json() {
    let json = serde_json::to_string(&AllocationSettings::default()).unwrap();
    assert!(!json.contains("min_executors_at_once"), "{json}");
    let gang = AllocationSettings {
        min_executors_at_once: Some(4),
        ..AllocationSettings::default()
    };
    let json = serde_json::to_string(&gang).unwrap();
    assert!(json.contains(r#""min_executors_at_once":4"#), "{json}");
    let read: AllocationSettings = serde_json::from_str(&json).unwrap();
    assert_eq!(read, gang);
}
