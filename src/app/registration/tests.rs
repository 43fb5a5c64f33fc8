use crate::app::AppSettings;
use k8s_openapi::jiff::{Span, Timestamp};

use super::*;

#[test]
fn a_registration_round_trips_through_json() {
    let template: Pod = serde_json::from_value(serde_json::json!({
        "spec": {"containers": [{"name": "spark-kubernetes-executor", "image": "spark:4"}]}
    }))
    .unwrap();
    let req = StartApplication {
        app_id: AppId::parse("app-1").unwrap(),
        namespace: "ns".into(),
        driver_pod_name: Some("driver".into()),
        templates: BTreeMap::from([(ResourceProfileId(0), template)]),
        pod_name_prefix: None,
        settings: AllocationSettings {
            max_executors: Some(9),
            ..AllocationSettings::default()
        },
        owner: Some("system:serviceaccount:ns:driver".into()),
        claims: vec![
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "app-1-exec-{{EXECUTOR_ID}}-pvc-0"},
                "spec": {"resources": {"requests": {"storage": "10Gi"}}}
            }))
            .unwrap(),
        ],
    };
    let mut registration = Registration::of_start(&req);
    registration.targets.insert(0, 4);
    registration.registered.insert(2);
    let json = serde_json::to_string(&registration).unwrap();
    let back: Registration = serde_json::from_str(&json).unwrap();
    assert_eq!(back, registration);
    let again = back.start_request().unwrap();
    assert_eq!(again.settings, req.settings);
    assert_eq!(again.templates, req.templates);
    assert_eq!(again.owner, req.owner);
    assert_eq!(again.claims, req.claims);
    assert_eq!(back.targets(), BTreeMap::from([(ResourceProfileId(0), 4)]));
    assert_eq!(back.registered(), BTreeSet::from([ExecutorId(2)]));
}

#[test]
fn a_stored_registration_with_invalid_settings_is_refused_naming_the_setting() {
    let req = StartApplication {
        app_id: AppId::parse("app-1").unwrap(),
        namespace: "ns".into(),
        driver_pod_name: None,
        templates: BTreeMap::new(),
        pod_name_prefix: None,
        settings: AllocationSettings::default(),
        owner: None,
        claims: Vec::new(),
    };
    let mut registration = Registration::of_start(&req);
    registration.settings.batch_size = 0;
    let err = registration.start_request().unwrap_err();
    assert!(err.contains("batch_size"), "{err}");
    registration.settings.batch_size = 5;
    registration.settings.batch_delay = std::time::Duration::from_millis(1);
    let err = registration.start_request().unwrap_err();
    assert!(err.contains("batch_delay_ms"), "{err}");
}

/// The JSON of a registration as an earlier version wrote it (before `policy`
/// existed), byte for byte: it still decodes, to the same settings, and says the
/// same when written again.
#[test]
fn a_registration_of_a_newer_version_resumes_with_the_settings_this_one_knows() {
    let written = r#"{"app_id":"app-1","namespace":"ns","driver_pod_name":null,"pod_name_prefix":null,"settings":{"batch_size":5,"a_later_setting":{"x":1},"policy":"adaptive"},"templates":{},"targets":{},"registered":[]}"#;
    let registration: Registration = serde_json::from_str(written).unwrap();
    assert_eq!(
        registration.settings,
        AllocationSettings {
            batch_size: 5,
            policy: crate::allocator::AllocationPolicy::Adaptive,
            ..AllocationSettings::default()
        }
    );
    // A known setting with a bad value is still an unreadable registration.
    let bad = written.replace(r#""batch_size":5"#, r#""batch_size":"five""#);
    assert!(serde_json::from_str::<Registration>(&bad).is_err());
}

#[test]
fn a_registration_of_an_earlier_version_still_resumes() {
    let written = r#"{"app_id":"app-1","namespace":"ns","driver_pod_name":null,"pod_name_prefix":null,"settings":{"batch_size":5,"batch_delay_ms":2000,"executor_timeout_ms":600000,"executor_idle_timeout_ms":60000,"max_pending_pods":40,"max_pending_pods_per_profile":null,"max_executors":9,"delete_on_termination":false,"executor_container_name":"spark-kubernetes-executor","check_all_containers":true},"templates":{},"targets":{"0":3},"registered":[1,2]}"#;
    let registration: Registration = serde_json::from_str(written).unwrap();
    let req = registration.start_request().unwrap();
    assert_eq!(
        req.settings,
        AllocationSettings {
            batch_size: 5,
            batch_delay: std::time::Duration::from_secs(2),
            max_pending_pods: Some(40),
            max_executors: Some(9),
            delete_on_termination: false,
            check_all_containers: true,
            policy: crate::allocator::AllocationPolicy::Spark,
            ..AllocationSettings::default()
        }
    );
    assert_eq!(
        registration.targets(),
        BTreeMap::from([(ResourceProfileId(0), 3)])
    );
    let again = serde_json::to_string(&registration).unwrap();
    let with_policy = written.replace(
        r#""check_all_containers":true}"#,
        r#""check_all_containers":true,"policy":"spark","stuck_pending_timeout_ms":120000,"driver_owns_claims":true,"reuse_claims":true,"wait_to_reuse_claims":false}"#,
    );
    assert_eq!(again, with_policy);
}

fn sealed(key: &SigningKey) -> (Registration, StoredRegistration) {
    let req = StartApplication {
        app_id: AppId::parse("app-1").unwrap(),
        namespace: "team-a".into(),
        driver_pod_name: Some("driver".into()),
        templates: BTreeMap::new(),
        pod_name_prefix: None,
        settings: AllocationSettings::default(),
        owner: Some("alice".into()),
        claims: Vec::new(),
    };
    let registration = Registration::of_start(&req);
    let (json, proof) = registration.seal(key.key(), "uid-1").unwrap();
    let stored = StoredRegistration {
        name: RegistrationStore::config_map_name("team-a", "app-1"),
        namespace_label: Some("team-a".into()),
        app_label: Some("app-1".into()),
        json: Some(json),
        proof: Some(proof),
        proof_uid: Some("uid-1".into()),
        signature: None,
        uid: Some("uid-1".into()),
        created: Some(since() - Span::new().hours(1)),
    };
    (registration, stored)
}

/// When the proofs' marker was created, in [`key`].
fn since() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn key(byte: u8) -> SigningKey {
    SigningKey::new(
        hmac::Key::new(hmac::HMAC_SHA256, &[byte; 32]),
        Some(since()),
    )
}

/// `stored` as an earlier version wrote it: signed over all but the uid, no proof.
fn as_earlier_version(stored: &StoredRegistration, key: &SigningKey) -> StoredRegistration {
    let parts = [
        stored.namespace_label.as_deref().unwrap(),
        stored.app_label.as_deref().unwrap(),
        stored.json.as_deref().unwrap(),
    ];
    let tag = hmac::sign(key.key(), &mac_bytes(SIGNED_CONTEXT, &parts));
    StoredRegistration {
        proof: None,
        proof_uid: None,
        signature: Some(base64::engine::general_purpose::STANDARD.encode(tag.as_ref())),
        ..stored.clone()
    }
}

#[test]
fn a_copy_in_another_object_is_refused_as_replayed() {
    let all = AppSettings::default();
    let (registration, stored) = sealed(&key(1));
    assert_eq!(open(&stored, &key(1), &all), Ok(registration));
    // Written back from a copy: the same name, labels and data, another object.
    let copy = StoredRegistration {
        uid: Some("uid-2".into()),
        created: Some(since() + Span::new().hours(1)),
        ..stored.clone()
    };
    let refusal = open(&copy, &key(1), &all).unwrap_err();
    assert_eq!(refusal.reason(), "replayed");
    assert!(refusal.to_string().contains("uid-1") && refusal.to_string().contains("uid-2"));
    // Its proof edited to name the new uid: no longer the service's MAC.
    let relabelled = StoredRegistration {
        proof_uid: Some("uid-2".into()),
        ..copy.clone()
    };
    assert_eq!(open(&relabelled, &key(1), &all), Err(Refusal::BadSignature));
    // A proof without the uid it was made for.
    let no_uid = StoredRegistration {
        proof_uid: None,
        ..stored
    };
    assert_eq!(open(&no_uid, &key(1), &all), Err(Refusal::BadSignature));
}

#[test]
fn an_earlier_versions_record_resumes_only_in_an_object_older_than_the_proofs() {
    let all = AppSettings::default();
    let (registration, stored) = sealed(&key(1));
    let earlier = as_earlier_version(&stored, &key(1));
    assert_eq!(open(&earlier, &key(1), &all), Ok(registration.clone()));
    let at_marker = StoredRegistration {
        created: Some(since()),
        ..earlier.clone()
    };
    assert_eq!(open(&at_marker, &key(1), &all), Ok(registration));
    let written_back = StoredRegistration {
        created: Some(since() + Span::new().seconds(1)),
        ..earlier.clone()
    };
    assert_eq!(
        open(&written_back, &key(1), &all).unwrap_err().reason(),
        "unproven"
    );
    let no_marker = SigningKey::new(hmac::Key::new(hmac::HMAC_SHA256, &[1; 32]), None);
    assert_eq!(
        open(&earlier, &no_marker, &all).unwrap_err().reason(),
        "unproven"
    );
    assert_eq!(open(&earlier, &key(2), &all), Err(Refusal::BadSignature));
}

#[test]
fn a_sealed_registration_opens_with_its_key_only() {
    let all = AppSettings::default();
    let (registration, stored) = sealed(&key(1));
    assert_eq!(open(&stored, &key(1), &all), Ok(registration));
    assert_eq!(open(&stored, &key(2), &all), Err(Refusal::BadSignature));
    let unsigned = StoredRegistration {
        proof: None,
        proof_uid: None,
        ..stored.clone()
    };
    assert_eq!(open(&unsigned, &key(1), &all), Err(Refusal::Unsigned));
    let garbage = StoredRegistration {
        proof: Some("not base64!".into()),
        ..stored
    };
    assert_eq!(open(&garbage, &key(1), &all), Err(Refusal::BadSignature));
}

#[test]
fn an_edited_owner_driver_or_namespace_breaks_the_signature() {
    let all = AppSettings::default();
    let (_, stored) = sealed(&key(1));
    let json = stored.json.clone().unwrap();
    for (from, to) in [
        ("\"owner\":\"alice\"", "\"owner\":\"mallory\""),
        (
            "\"driver_pod_name\":\"driver\"",
            "\"driver_pod_name\":\"other\"",
        ),
        ("\"namespace\":\"team-a\"", "\"namespace\":\"team-b\""),
    ] {
        assert!(json.contains(from), "{json}");
        let edited = StoredRegistration {
            json: Some(json.replace(from, to)),
            ..stored.clone()
        };
        assert_eq!(
            open(&edited, &key(1), &all),
            Err(Refusal::BadSignature),
            "{to}"
        );
    }
}

#[test]
fn a_registration_moved_to_another_name_or_labels_is_refused() {
    let all = AppSettings::default();
    let (_, stored) = sealed(&key(1));
    let relabelled = StoredRegistration {
        name: RegistrationStore::config_map_name("team-b", "app-1"),
        namespace_label: Some("team-b".into()),
        ..stored.clone()
    };
    assert_eq!(open(&relabelled, &key(1), &all), Err(Refusal::BadSignature));
    let other_app = StoredRegistration {
        app_label: Some("app-2".into()),
        ..stored.clone()
    };
    assert_eq!(open(&other_app, &key(1), &all), Err(Refusal::BadSignature));
    let renamed = StoredRegistration {
        name: "spark-pod-allocator.team-a.copy".into(),
        ..stored.clone()
    };
    assert_eq!(
        open(&renamed, &key(1), &all).unwrap_err().reason(),
        "misplaced"
    );
    let unlabelled = StoredRegistration {
        namespace_label: None,
        ..stored.clone()
    };
    assert_eq!(
        open(&unlabelled, &key(1), &all).unwrap_err().reason(),
        "misplaced"
    );
    let only_b = AppSettings {
        allowed_namespaces: vec!["team-b".to_string()],
        ..AppSettings::default()
    };
    assert_eq!(
        open(&stored, &key(1), &only_b),
        Err(Refusal::NamespaceNotAllowed("team-a".into()))
    );
}
