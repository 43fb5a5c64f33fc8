//! Reviews that are slow or flooded, and Start authorized before any template is parsed, while health answers.
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_that_does_not_answer_is_unavailable_and_never_stalls_health() {
    let _serial = SERIAL.lock().await;
    let settings = AuthSettings {
        review_timeout_ms: 300,
        ..auth()
    };
    let h = Harness::start_with_auth(cluster(), settings).await;
    h.sim.set_faults(FaultSettings {
        latency_ms: 5_000,
        ..FaultSettings::default()
    });
    // Many callers at once, each with its own token (no cache helps); fewer than the
    // server's streams per connection (`grpc.max_concurrent_streams`, 32), as they share one.
    let calls: Vec<_> = (0..24)
        .map(|i| {
            let mut client = h.client.clone();
            tokio::spawn(async move {
                client
                    .get_status(as_caller(&format!("token-{i}"), status_request("spark-x")))
                    .await
            })
        })
        .collect();
    let health = health_check_time(&h).await;
    assert!(
        health < test_kit::wait::NOT_STARVED,
        "health took {health:?}"
    );
    for call in calls {
        let err = call.await.expect("call task").unwrap_err();
        assert_code(
            &err,
            Code::Unavailable,
            &["TokenReview", "auth.review_timeout_ms"],
        );
    }
    h.sim.set_faults(FaultSettings::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_tokens_is_refused_while_health_answers() {
    let _serial = SERIAL.lock().await;
    let h = Harness::start_with_auth(cluster(), auth()).await;
    // Attackers call back to back with forged tokens (a new one every tenth call), on
    // connections of their own, from a runtime of their own (as from other machines),
    // until the health checks are done.
    let attacking = Arc::new(AtomicBool::new(true));
    let address = h.address;
    let attack = {
        let attacking = Arc::clone(&attacking);
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("attackers' runtime");
            runtime.block_on(async move {
                let attackers: Vec<_> = (0..8)
                    .map(|worker| tokio::spawn(attacker(address, worker, Arc::clone(&attacking))))
                    .collect();
                let mut refused = 0;
                for attacker in attackers {
                    refused += attacker.await.expect("attacker");
                }
                refused
            })
        })
    };
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        slowest = slowest.max(health_check_time(&h).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    attacking.store(false, Ordering::Relaxed);
    let refused = attack.join().expect("attack thread");
    eprintln!("{refused} forged calls refused; slowest health check {slowest:?}");
    assert!(refused >= 8, "the attack ran ({refused} calls refused)");
    assert!(
        slowest < test_kit::wait::NOT_STARVED,
        "the slowest health check took {slowest:?} while {refused} forged calls were refused"
    );
    assert!(h.applications.ownership(&app_id("spark-victim")).is_none());
}

/// Calls Start with forged tokens until told to stop; returns how many were refused.
async fn attacker(address: std::net::SocketAddr, worker: u32, attacking: Arc<AtomicBool>) -> u32 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = ExecutorAllocatorClient::new(channel);
    let mut refused = 0u32;
    while attacking.load(Ordering::Relaxed) {
        let forged = format!("forged-{worker}-{}", refused / 10);
        let err = client
            .start(as_caller(&forged, start_request("spark-victim", "team-a")))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
        refused += 1;
    }
    refused
}

/// A valid Pod template of about 240 KB (18,000 labels): costly to parse, within
/// `limits.max_template_bytes`.
fn heavy_template() -> String {
    let labels: String = (0..18_000).map(|i| format!("    k{i}: v\n")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  labels:\n{labels}spec:\n  containers:\n  - name: spark-kubernetes-executor\n    image: spark:4\n"
    )
}

/// A Start of `app` in team-a with 15 heavy profile templates (3.6 MB, under the 4 MiB
/// message limit) and a broken one last: had any template been parsed, the answer would be
/// INVALID_ARGUMENT about `resource_profile_templates[16]`.
fn heavy_broken_start(app: &str) -> proto::StartRequest {
    let heavy = heavy_template();
    let mut request = start_request(app, "team-a");
    request.resource_profile_templates = (1..=15).map(|p| (p, heavy.clone())).collect();
    request
        .resource_profile_templates
        .insert(16, "kind: [".into());
    request
}

/// Calls `call` back to back from `connections` connections × `streams` concurrent loops
/// each, from a runtime of its own (as from other machines), until `attacking` is cleared;
/// returns the codes answered, counted by name.
fn flood<F, Fut>(
    address: std::net::SocketAddr,
    connections: u32,
    streams: u32,
    attacking: Arc<AtomicBool>,
    call: F,
) -> std::thread::JoinHandle<std::collections::BTreeMap<String, u32>>
where
    F: Fn(ExecutorAllocatorClient<tonic::transport::Channel>, String) -> Fut
        + Send
        + Sync
        + 'static,
    Fut: Future<Output = Code> + Send + 'static,
{
    let call = Arc::new(call);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("attackers' runtime");
        runtime.block_on(async move {
            let mut loops = Vec::new();
            for connection in 0..connections {
                let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                    .expect("endpoint")
                    .connect()
                    .await
                    .expect("connect");
                for stream in 0..streams {
                    let client = ExecutorAllocatorClient::new(channel.clone());
                    let attacking = Arc::clone(&attacking);
                    let call = Arc::clone(&call);
                    loops.push(tokio::spawn(async move {
                        let mut codes = Vec::new();
                        let mut n = 0u32;
                        while attacking.load(Ordering::Relaxed) {
                            let tag = format!("{connection}-{stream}-{n}");
                            codes.push(call(client.clone(), tag).await);
                            n += 1;
                        }
                        codes
                    }));
                }
            }
            let mut counted = std::collections::BTreeMap::new();
            for one in loops {
                for code in one.await.expect("attack loop") {
                    *counted.entry(format!("{code:?}")).or_insert(0) += 1;
                }
            }
            counted
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_is_authorized_before_any_template_is_parsed() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), auth()).await;
    // Without a valid token, and without rights: the identity's answer, not the template's.
    for (token, code, words) in [
        (None, Code::Unauthenticated, "authorization: Bearer"),
        (Some("forged"), Code::Unauthenticated, "not accepted"),
        (
            Some("eve-token"),
            Code::PermissionDenied,
            "eve may not create pods",
        ),
        (Some("carol-token"), Code::PermissionDenied, "team-a"),
    ] {
        let request = heavy_broken_start("spark-heavy");
        let request = match token {
            Some(token) => as_caller(token, request),
            None => Request::new(request),
        };
        let err = h.client.start(request).await.unwrap_err();
        assert_code(&err, code, &[words]);
    }
    // Bad settings are a template's neighbours: checked after authorization too.
    let mut request = start_request("spark-heavy", "team-a");
    request.settings = Some(proto::AllocationSettings {
        batch_delay_ms: Some(50),
        ..Default::default()
    });
    let err = h
        .client
        .start(as_caller("eve-token", request))
        .await
        .unwrap_err();
    assert_code(&err, Code::PermissionDenied, &["eve may not create pods"]);
    // SetTotalExpected: an application that does not run answers NOT_FOUND, unparsed.
    let mut request = targets_request("spark-nowhere", 1);
    request.resource_profile_templates = [(1, "kind: [".to_string())].into();
    let err = h
        .client
        .set_total_expected(as_caller("eve-token", request))
        .await
        .unwrap_err();
    assert_code(&err, Code::NotFound, &["spark-nowhere"]);
    // The same request from a caller with rights is parsed and refused for its template.
    let err = h
        .client
        .start(as_caller("alice-token", heavy_broken_start("spark-heavy")))
        .await
        .unwrap_err();
    assert_code(
        &err,
        Code::InvalidArgument,
        &["resource_profile_templates[16]"],
    );

    // 4 senders without rights flood Start with 3.6 MB of templates while alice starts
    // applications: each flood call is PERMISSION_DENIED, which no parse could answer.
    let attacking = Arc::new(AtomicBool::new(true));
    let heavy = Arc::new(heavy_broken_start("spark-heavy"));
    // Alice goes on until the flood has been answered a few times, however slowly the
    // attackers' connections come up on a loaded machine.
    let flood_answered = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let answered = Arc::clone(&flood_answered);
    let attack = flood(
        h.address,
        4,
        1,
        Arc::clone(&attacking),
        move |mut client, _| {
            let request = as_caller("eve-token", (*heavy).clone());
            let answered = Arc::clone(&answered);
            async move {
                let code = client.start(request).await.unwrap_err().code();
                answered.fetch_add(1, Ordering::Relaxed);
                code
            }
        },
    );
    let mut times = Vec::new();
    for i in 0.. {
        if i >= 10 && flood_answered.load(Ordering::Relaxed) >= 4 {
            break;
        }
        // Below the identity's application cap (100).
        assert!(
            i < 90,
            "the flood was not answered 4 times during 90 Starts"
        );
        let began = Instant::now();
        h.client
            .start(as_caller(
                "alice-token",
                start_request(format!("spark-legit-{i}").as_str(), "team-a"),
            ))
            .await
            .expect("alice's Start during the flood");
        times.push(began.elapsed());
    }
    attacking.store(false, Ordering::Relaxed);
    let codes = attack.join().expect("attack thread");
    times.sort();
    eprintln!(
        "flood answered {codes:?}; alice's Start during it: median {:?}, slowest {:?}",
        times[times.len() / 2],
        times[times.len() - 1]
    );
    assert_eq!(
        codes.keys().collect::<Vec<_>>(),
        ["PermissionDenied"],
        "{codes:?}"
    );
    assert!(codes["PermissionDenied"] >= 4, "the flood ran: {codes:?}");
    assert!(h.applications.ownership(&app_id("spark-heavy")).is_none());
}

/// Settings under which a cached answer expires several times during a flood, the queue
/// of unknown tokens is short and its deadline shorter than the wait behind a flood.
fn slow_server_auth() -> AuthSettings {
    AuthSettings {
        cache_ttl_ms: 600,
        cache_capacity: 32,
        review_timeout_ms: 2_000,
        max_concurrent_reviews: 2,
        max_failed_authentications_per_connection: 1_000_000,
        ..auth()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_caller_is_served_while_forged_tokens_flood_a_slow_api_server() {
    let _serial = SERIAL.lock().await;
    let mut h = Harness::start_with_auth(cluster(), slow_server_auth()).await;
    let app = "spark-busy";
    alice_starts(&mut h, app, 1).await;
    h.sim.set_faults(FaultSettings {
        latency_ms: 100,
        ..FaultSettings::default()
    });
    // 64 forged calls at once, each token new: 32 reviews of 100 ms queue for each turn of
    // the unknown queue, longer than the review deadline.
    let attacking = Arc::new(AtomicBool::new(true));
    let attack = flood(
        h.address,
        4,
        16,
        Arc::clone(&attacking),
        |mut client, tag| {
            let request = as_caller(&format!("forged-{tag}"), status_request("spark-busy"));
            async move { client.get_status(request).await.unwrap_err().code() }
        },
    );
    // alice calls every 50 ms for 3 s: five times her answers' lifetime.
    let began = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    while began.elapsed() < Duration::from_secs(3) {
        let call = Instant::now();
        let answer = h
            .client
            .get_status(as_caller("alice-token", status_request(app)))
            .await;
        slowest = slowest.max(call.elapsed());
        calls += 1;
        assert!(
            answer.is_ok(),
            "alice's call {calls} at {:?} failed: {answer:?}",
            began.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    attacking.store(false, Ordering::Relaxed);
    let codes = attack.join().expect("attack thread");
    h.sim.set_faults(FaultSettings::default());
    eprintln!("{calls} calls of alice OK, slowest {slowest:?}; the flood answered {codes:?}");
    assert!(
        codes.get("Unavailable").is_some_and(|n| *n > 0),
        "the flood filled the unknown queue past its deadline: {codes:?}"
    );
    assert!(
        slowest < Duration::from_millis(1_000),
        "alice waited {slowest:?} (the review deadline is 2 s)"
    );
}
