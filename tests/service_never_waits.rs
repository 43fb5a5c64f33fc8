//! Calls never wait on Kubernetes: with the simulated API server answering slower than the
//! service's request deadline, IsDeleted, GetStatus and SetTotalExpected still answer at
//! once over real gRPC, the stalled requests are given up after their deadline, and the
//! application recovers once the API server does.

use std::time::{Duration, Instant};

use spark_pod_allocator::allocator::Timestamp;
use spark_pod_allocator::app::AppId;
use spark_pod_allocator::config::Settings;
use spark_pod_allocator::k8s::RequestPolicy;
use spark_pod_allocator::proto;
use spark_pod_allocator_sim::FaultSettings;
use test_kit::grpc::{Harness, quiet_cluster, start_request};
use test_kit::requests::*;
use test_kit::wait::until;

/// The service's deadline per request attempt.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
/// The simulated API server's delay, well past the deadline.
const LATENCY: Duration = Duration::from_millis(4000);
/// What "answers at once" means: 9 calls in 10 within this (the bound)…
const TYPICAL_ANSWER: Duration = Duration::from_millis(50);
/// … and every call within this, well under the request deadline, so no call waited on
/// a request (on a machine shared with other builds, a thread may not run for a while).
const ANSWER_BOUND: Duration = Duration::from_millis(300);

async fn harness() -> Harness {
    let h = Harness::start_tuned(quiet_cluster(), Settings::default(), |builder| {
        builder.with_request_policy(RequestPolicy {
            timeout: REQUEST_TIMEOUT,
            attempts: 2,
            retry_delay: Duration::from_millis(50),
        })
    })
    .await;
    // Pods' creationTimestamps are the simulator's wall clock: keep the service's clock
    // with it so idle timeouts mean something.
    h.clock
        .set(Timestamp(jiff::Timestamp::now().as_millisecond()));
    h
}

fn app() -> AppId {
    AppId::parse("app-slow-api").unwrap()
}

async fn set_total(h: &Harness, n: u32) -> Duration {
    let mut client = h.client.clone();
    let began = Instant::now();
    client
        .set_total_expected(targets_request(app().to_string(), n))
        .await
        .expect("SetTotalExpected");
    began.elapsed()
}

async fn status(h: &Harness) -> (proto::ApplicationStatus, Duration) {
    let mut client = h.client.clone();
    let began = Instant::now();
    let status = client
        .get_status(status_request(app().to_string()))
        .await
        .expect("GetStatus")
        .into_inner();
    (status, began.elapsed())
}

async fn is_deleted(h: &Harness, id: u64) -> (bool, Duration) {
    let mut client = h.client.clone();
    let began = Instant::now();
    let deleted = client
        .is_deleted(is_deleted_request(app().to_string(), id.to_string()))
        .await
        .expect("IsDeleted")
        .into_inner()
        .deleted;
    (deleted, began.elapsed())
}

/// Calls all three RPCs every 50 ms for `span`; asserts that 90 % answered within
/// [`TYPICAL_ANSWER`] and all within [`ANSWER_BOUND`].
async fn answers_at_once_during(h: &Harness, span: Duration, target: u32, what: &str) {
    let until = Instant::now() + span;
    let mut took = Vec::new();
    while Instant::now() < until {
        took.push(status(h).await.1);
        took.push(is_deleted(h, 1).await.1);
        took.push(set_total(h, target).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(took.len() >= 30, "only {} calls made", took.len());
    took.sort();
    let at = |q: usize| took[(took.len() - 1) * q / 100];
    let (median, p90, slowest) = (at(50), at(90), at(100));
    println!(
        "{what}: {} calls, median {median:?}, 90th percentile {p90:?}, slowest {slowest:?}",
        took.len()
    );
    assert!(p90 < TYPICAL_ANSWER, "{what}: 90th percentile {p90:?}");
    assert!(slowest < ANSWER_BOUND, "{what}: slowest {slowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_answer_at_once_while_the_api_server_stalls() {
    let h = harness().await;
    let mut client = h.client.clone();
    client
        .start(start_request(app().as_str(), "default"))
        .await
        .expect("Start");
    set_total(&h, 2).await;
    until("2 executor pods", async || {
        h.pods("default", app().as_str()).await.len() == 2
    })
    .await;
    until("a round seeing both pods", async || {
        h.clock.advance(Duration::from_secs(1));
        let (status, _) = status(&h).await;
        status.profiles[0].pending == 2 && status.profiles[0].newly_created == 0
    })
    .await;

    // A scale-up whose id record PATCH (then creates) the API server will not answer in time.
    h.sim.set_faults(FaultSettings {
        latency_ms: LATENCY.as_millis() as u64,
        ..FaultSettings::default()
    });
    let first = set_total(&h, 4).await;
    assert!(first < ANSWER_BOUND, "SetTotalExpected took {first:?}");
    h.clock.advance(Duration::from_secs(1));
    until("the round asking for 2 more", async || {
        status(&h).await.0.profiles[0].newly_created == 2
    })
    .await;
    // Longer than two attempts with their deadlines: the round's requests are given up
    // meanwhile and their failure comes back to the actor as a message.
    answers_at_once_during(&h, REQUEST_TIMEOUT * 3, 4, "while a scale-up stalls").await;
    let (status, _) = status(&h).await;
    let p0 = &status.profiles[0];
    assert_eq!(p0.target, 4);
    assert_eq!(
        p0.newly_created, 0,
        "the stalled round's creates were given up (not sent without their id record)"
    );

    // The API server recovers: the next rounds (after the backoff) reach the target.
    h.sim.set_faults(FaultSettings::default());
    until("4 executor pods after the outage", async || {
        h.clock.advance(Duration::from_secs(2));
        h.pods("default", app().as_str()).await.len() == 4
    })
    .await;

    // A downscale whose delete stalls: IsDeleted is true at once, nothing waits.
    h.clock.advance(Duration::from_secs(120)); // past the idle timeout of pending pods
    h.sim.set_faults(FaultSettings {
        latency_ms: LATENCY.as_millis() as u64,
        ..FaultSettings::default()
    });
    let took = set_total(&h, 0).await;
    assert!(took < ANSWER_BOUND, "SetTotalExpected took {took:?}");
    until("executor 1 marked deleted", async || {
        h.clock.advance(Duration::from_millis(500));
        let (deleted, took) = is_deleted(&h, 1).await;
        assert!(took < ANSWER_BOUND, "IsDeleted took {took:?}");
        deleted
    })
    .await;
    answers_at_once_during(&h, REQUEST_TIMEOUT * 3, 0, "while a downscale stalls").await;
    // Once the API server answers, the retried delete removes every pod.
    h.sim.set_faults(FaultSettings::default());
    until("no executor pod left", async || {
        h.clock.advance(Duration::from_secs(1));
        h.pods("default", app().as_str()).await.is_empty()
    })
    .await;
}
