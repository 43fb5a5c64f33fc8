//! Authentication: tokens, the simulator's reviews, TLS, and connections that keep failing.
use super::*;

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    let app = "spark-anon";
    let err = h
        .client
        .start(start_request(app, "team-a"))
        .await
        .unwrap_err();
    assert_code(&err, Code::Unauthenticated, &["authorization: Bearer"]);
    let err = h
        .client
        .start(as_caller("forged", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::Unauthenticated,
        &["not accepted", "invalid bearer token"],
    );
    let err = h
        .client
        .start(as_caller("apiserver-token", start_request(app, "team-a")))
        .await
        .unwrap_err();
    assert_code(&err, Code::Unauthenticated, &["audiences"]);
    let mut basic = Request::new(status_request(app));
    basic
        .metadata_mut()
        .insert("authorization", "Basic YWxpY2U6cHc=".parse().unwrap());
    let err = h.client.get_status(basic).await.unwrap_err();
    assert_code(&err, Code::Unauthenticated, &["Bearer <token>"]);
    assert!(h.pods("team-a", app).await.is_empty());
    assert!(h.applications.ownership(&app_id(app)).is_none());
}

#[tokio::test]
async fn the_simulator_reviews_tokens_and_access_as_an_api_server() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start_with_auth(cluster(), auth()).await;
    let client = h.sim.try_client().expect("client");
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        Some(
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": "alice-token", "audiences": [AUDIENCE]}}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["kind"], "TokenReview");
    assert_eq!(body["status"]["authenticated"], true);
    assert_eq!(body["status"]["user"]["username"], ALICE);
    assert_eq!(body["status"]["audiences"], json!([AUDIENCE]));
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        "application/json",
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {}})),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (400, Some("BadRequest")),
        "{body}"
    );
    let review = |user: &str, namespace: &str, verb: &str| {
        json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": "pods"}}})
    };
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        Some(review("carol", "team-b", "create")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    assert_eq!(body["status"]["allowed"], true);
    let (_, _, body) = raw(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        Some(review("carol", "team-b", "delete")),
    )
    .await;
    assert_eq!(body["status"]["allowed"], false);
    let (code, _, body) = raw(
        &client,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "application/json",
        Some(
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "get", "resource": "pods"}}}),
        ),
    )
    .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (422, Some("Invalid")),
        "{body}"
    );
}

#[test]
fn serve_without_authentication_refuses_a_non_loopback_address() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_spark-pod-allocator"))
        .args(["serve", "--simulate", "--listen", "0.0.0.0:0"])
        .env_remove("SPARK_POD_ALLOCATOR__AUTH__MODE")
        .env_remove("SPARK_POD_ALLOCATOR__AUTH__ALLOW_UNAUTHENTICATED_REMOTE")
        .output()
        .expect("the binary runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for key in [
        "auth.mode",
        "auth.allow_unauthenticated_remote",
        "0.0.0.0:0",
    ] {
        assert!(stderr.contains(key), "expected {key:?} in {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_with_a_token_and_a_reloaded_certificate() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temporary directory");
    let (first_ca, first_cert, first_key) = certificate(dir.path(), "first");
    // The files the service reads; replaced below as a Secret update would.
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::copy(&first_cert, &cert).expect("certificate");
    std::fs::copy(&first_key, &key).expect("key");
    let sim = spark_pod_allocator_sim::SimCluster::start(cluster())
        .await
        .expect("simulated cluster");
    let settings = spark_pod_allocator::grpc::ServeSettings {
        tls: spark_pod_allocator::grpc::tls::TlsSettings {
            cert_file: Some(cert.clone()),
            key_file: Some(key.clone()),
            reload_interval_ms: 100,
            ..Default::default()
        },
        ..Default::default()
    };
    let service = test_kit::grpc::serve(
        &sim,
        &spark_pod_allocator::app::ManualClock::starting_now(),
        settings,
        Default::default(),
        Some(&auth()),
    )
    .await;
    let address = service.address();

    // Over TLS, a driver with its token starts its application.
    let channel = tls_channel(address, &first_ca).await.expect("TLS connect");
    let mut driver = ExecutorAllocatorClient::new(channel);
    driver
        .start(as_caller(
            "alice-token",
            start_request("spark-tls", "team-a"),
        ))
        .await
        .expect("Start over TLS");
    // A plaintext client gets no answer from the TLS port.
    let plaintext = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await;
    if let Ok(channel) = plaintext {
        let mut health = HealthClient::new(channel);
        assert!(
            health
                .check(HealthCheckRequest {
                    service: String::new()
                })
                .await
                .is_err(),
            "plaintext answered on the TLS port"
        );
    }

    // A rotated certificate is served to new connections without a restart.
    let (second_ca, second_cert, second_key) = certificate(dir.path(), "second");
    assert!(
        tls_channel(address, &second_ca).await.is_err(),
        "a client trusting only the second CA is refused before the rotation"
    );
    std::fs::copy(&second_key, &key).expect("replace key");
    std::fs::copy(&second_cert, &cert).expect("replace certificate");
    let reloaded = async {
        loop {
            if let Ok(channel) = tls_channel(address, &second_ca).await {
                let mut health = HealthClient::new(channel);
                if health
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), reloaded)
        .await
        .expect("the rotated certificate is served");
    service.shutdown().await.expect("server result");
}

#[tokio::test]
async fn a_connection_that_keeps_failing_authentication_is_refused_without_a_review() {
    let _serial = SERIAL.lock().await;
    let budget = 5;
    let settings = AuthSettings {
        max_failed_authentications_per_connection: budget,
        ..auth()
    };
    let h = Harness::start_with_auth(cluster(), settings).await;
    let mut attacker = own_connection(&h).await;
    let before = reviews_answered(&h, "tokenreviews").await;
    for i in 0..budget {
        let err = attacker
            .get_status(as_caller(&format!("forged-{i}"), status_request("spark-x")))
            .await
            .unwrap_err();
        assert_code(&err, Code::Unauthenticated, &["not accepted"]);
    }
    assert_eq!(
        reviews_answered(&h, "tokenreviews").await - before,
        u64::from(budget)
    );
    // Past the budget: refused at once, a valid token included, and no review is asked.
    for token in ["forged-new", "alice-token"] {
        let err = attacker
            .get_status(as_caller(token, status_request("spark-x")))
            .await
            .unwrap_err();
        assert_code(
            &err,
            Code::Unauthenticated,
            &["auth.max_failed_authentications_per_connection"],
        );
    }
    assert_eq!(
        reviews_answered(&h, "tokenreviews").await - before,
        u64::from(budget)
    );
    // Another connection is not affected, and a refused token is reviewed once.
    let mut other = own_connection(&h).await;
    for _ in 0..3 {
        let err = other
            .get_status(as_caller("forged-again", status_request("spark-x")))
            .await
            .unwrap_err();
        assert_code(&err, Code::Unauthenticated, &["not accepted"]);
    }
    let err = other
        .get_status(as_caller("alice-token", status_request("spark-x")))
        .await
        .unwrap_err();
    assert_code(&err, Code::NotFound, &["spark-x"]);
    assert_eq!(
        reviews_answered(&h, "tokenreviews").await - before,
        u64::from(budget) + 2
    );
}
