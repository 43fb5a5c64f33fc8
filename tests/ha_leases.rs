//! Shard Leases against the simulator's `coordination.k8s.io/v1` (real HTTP, the real
//! resourceVersion semantics): one owner at a time, takeover only after a whole lease with
//! no renewal seen, a stale write refused, a release handing over at once. Time is the
//! test's: each turn is given its instant.
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use spark_pod_allocator::ha::claim::LeaseTiming;
use spark_pod_allocator::ha::shards::Shard;
use spark_pod_allocator::k8s::RequestPolicy;
use spark_pod_allocator::k8s::leases::{ADDRESS_ANNOTATION, ShardLeaseKeeper, Turn};

const NAMESPACE: &str = "default";

fn keeper(client: &kube::Client, identity: &str) -> ShardLeaseKeeper {
    ShardLeaseKeeper::new(
        client.clone(),
        NAMESPACE,
        Shard(0),
        identity,
        LeaseTiming::default(),
        RequestPolicy::default(),
    )
    .advertising(Some(address_of(identity)))
}

/// Where the replica `identity` says it serves.
fn address_of(identity: &str) -> String {
    format!("{identity}.replicas.test:50051")
}

/// The turn of a replica that finds `holder` holding the shard, serving at its address.
fn held_by(holder: &str) -> Turn {
    Turn::HeldBy {
        holder: holder.into(),
        address: Some(address_of(holder)),
    }
}

async fn lease(client: &kube::Client) -> Lease {
    Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get(&Shard(0).lease_name())
        .await
        .expect("the shard's Lease exists")
}

fn holds(turn: &Turn) -> Option<i32> {
    match turn {
        Turn::Holds(ownership) => Some(ownership.epoch),
        _ => None,
    }
}

#[tokio::test]
async fn one_owner_at_a_time_and_a_takeover_only_after_a_whole_lease_unrenewed() {
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("client");
    let (mut a, mut b) = (keeper(&client, "replica-a"), keeper(&client, "replica-b"));
    let t0 = Instant::now();

    assert_eq!(
        holds(&a.turn(t0).await),
        Some(0),
        "the first replica creates it"
    );
    assert_eq!(b.turn(t0).await, held_by("replica-a"));
    let written = lease(&client).await;
    assert_eq!(
        written
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ADDRESS_ANNOTATION)),
        Some(&address_of("replica-a")),
        "the holder's address is in its Lease"
    );
    let spec = written.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-a"));
    assert_eq!(spec.lease_duration_seconds, Some(15));
    assert_eq!(spec.lease_transitions, Some(0));

    // `a` renews every 2 s: `b` never takes over, however long it waits.
    for second in (2..40).step_by(2) {
        let now = t0 + Duration::from_secs(second);
        assert_eq!(holds(&a.turn(now).await), Some(0), "renewal at {second} s");
        assert_eq!(b.turn(now).await, held_by("replica-a"));
    }

    // `a` stops renewing at 38 s: it may act until 48 s, `b` takes over only after 15 s
    // with no change seen (from its read at 38 s), with the next epoch.
    assert!(a.ownership(t0 + Duration::from_millis(47_999)).is_some());
    assert!(a.ownership(t0 + Duration::from_secs(48)).is_none());
    assert_eq!(
        b.turn(t0 + Duration::from_secs(52)).await,
        held_by("replica-a")
    );
    assert_eq!(holds(&b.turn(t0 + Duration::from_secs(53)).await), Some(1));
    assert_eq!(
        lease(&client).await.spec.and_then(|s| s.holder_identity),
        Some("replica-b".into())
    );

    // `a` wakes up and reads: it sees `b` and does not write.
    let before = lease(&client).await.metadata.resource_version;
    assert_eq!(
        a.turn(t0 + Duration::from_secs(54)).await,
        held_by("replica-b")
    );
    assert_eq!(lease(&client).await.metadata.resource_version, before);
}

#[tokio::test]
async fn a_write_from_a_stale_read_is_refused_and_the_writer_steps_down() {
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("client");
    let mut a = keeper(&client, "replica-a");
    let t0 = Instant::now();
    assert_eq!(holds(&a.turn(t0).await), Some(0));

    // Someone else writes the Lease behind `a`'s back (another replica that took it, or an
    // operator): `a`'s renewal, based on the version it wrote, is refused with 409, and the
    // same turn reads again and finds the new holder; nothing of `a`'s lands.
    let api = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    api.patch(
        &Shard(0).lease_name(),
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"holderIdentity": "replica-c", "leaseTransitions": 1}})),
    )
    .await
    .expect("patch");
    let before = lease(&client).await.metadata.resource_version;
    // The address left in the Lease is replica-a's: not believed for replica-c.
    assert_eq!(
        a.turn(t0 + Duration::from_secs(2)).await,
        Turn::HeldBy {
            holder: "replica-c".into(),
            address: None
        }
    );
    assert!(a.ownership(t0 + Duration::from_secs(2)).is_none());
    assert_eq!(lease(&client).await.metadata.resource_version, before);
}

#[tokio::test]
async fn a_process_of_the_same_identity_keeps_the_shard_through_a_conflict() {
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("client");
    let mut a = keeper(&client, "replica-a");
    let t0 = Instant::now();
    assert_eq!(holds(&a.turn(t0).await), Some(0));
    // A restarted process of the same identity renews it first.
    let mut restarted = keeper(&client, "replica-a");
    assert_eq!(holds(&restarted.turn(t0).await), Some(0));
    // The old one's renewal conflicts, reads again, and renews at the same epoch.
    assert_eq!(holds(&a.turn(t0 + Duration::from_secs(2)).await), Some(0));
    let spec = lease(&client).await.spec.expect("spec");
    assert_eq!(spec.lease_transitions, Some(0), "it never changed hands");
}

#[tokio::test]
async fn a_released_shard_is_taken_over_at_once() {
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("client");
    let (mut a, mut b) = (keeper(&client, "replica-a"), keeper(&client, "replica-b"));
    let t0 = Instant::now();
    assert_eq!(holds(&a.turn(t0).await), Some(0));
    assert_eq!(b.turn(t0).await, held_by("replica-a"));

    a.release().await.expect("release");
    assert!(a.ownership(t0).is_none());
    let released = lease(&client).await;
    let spec = released.spec.expect("spec");
    assert_eq!(spec.holder_identity, None);
    assert!(
        spec.acquire_time.is_some(),
        "a release keeps the Lease's history"
    );

    assert_eq!(holds(&b.turn(t0 + Duration::from_secs(1)).await), Some(1));
}

#[tokio::test]
async fn a_release_goes_through_a_requesters_write_but_never_clears_another_holder() {
    use spark_pod_allocator::k8s::leases::REQUESTED_BY_ANNOTATION;
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("client");
    let leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let name = Shard(0).lease_name();
    let mut a = keeper(&client, "replica-a");
    assert_eq!(holds(&a.turn(Instant::now()).await), Some(0));
    // A replica asking for the shard writes its request on the Lease after a's last read:
    // a is still the holder, and its release, refused on the version it saw, is sent again.
    let request = json!({"metadata": {"annotations": {REQUESTED_BY_ANNOTATION: "replica-b"}}});
    leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&request))
        .await
        .expect("the request");
    a.release().await.expect("release");
    assert_eq!(
        lease(&client).await.spec.expect("spec").holder_identity,
        None,
        "released through the requester's write"
    );

    // The requester takes it. A Lease another replica holds by the time the release is
    // sent is left to that one.
    let mut b = keeper(&client, "replica-b");
    assert_eq!(holds(&b.turn(Instant::now()).await), Some(1));
    let taken = json!({"spec": {"holderIdentity": "replica-d"}});
    leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&taken))
        .await
        .expect("another holder");
    b.release().await.expect("release");
    assert_eq!(
        lease(&client)
            .await
            .spec
            .expect("spec")
            .holder_identity
            .as_deref(),
        Some("replica-d")
    );
}

/// The Lease reads served so far.
fn lease_reads(sim: &spark_pod_allocator_sim::SimCluster) -> u64 {
    (sim.requests().into_iter())
        .filter(|((_, verb, resource), _)| verb == "get" && resource == "leases")
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test]
async fn a_replica_following_the_lease_by_its_watch_never_reads_it_and_still_waits_a_whole_lease() {
    let sim = test_kit::sim::manual_cluster().await;
    let client = sim.try_client().expect("client");
    let mut a = keeper(&client, "replica-a");
    assert_eq!(holds(&a.turn(Instant::now()).await), Some(0));
    // b's watch starts after a's create: it arrives no earlier than this.
    let created = Instant::now();
    let mut b = keeper(&client, "replica-b").watching();
    test_kit::wait::until("b follows the Lease by its watch", async || {
        b.is_following()
    })
    .await;
    let reads = lease_reads(&sim);

    // Expiry is judged from when b's watch delivered a's write, on b's clock.
    assert_eq!(
        b.turn(created + Duration::from_secs(14)).await,
        held_by("replica-a")
    );
    assert_eq!(
        holds(&b.turn(Instant::now() + Duration::from_secs(15)).await),
        Some(1),
        "a whole lease after it saw a's last write, b takes the shard over"
    );

    // A release is taken at once by whoever follows the Lease.
    let mut c = keeper(&client, "replica-c").watching();
    test_kit::wait::until("c follows the Lease by its watch", async || {
        c.is_following()
    })
    .await;
    assert_eq!(c.turn(Instant::now()).await, held_by("replica-b"));
    b.release().await.expect("release");
    test_kit::wait::until("c takes the released shard", async || {
        holds(&c.turn(Instant::now()).await) == Some(2)
    })
    .await;
    assert_eq!(
        lease_reads(&sim),
        reads,
        "a keeper following the Lease by its watch reads it no more"
    );
}

/// The LISTs of Leases served so far (a watch's first listing, and each relisting).
fn lease_lists(sim: &spark_pod_allocator_sim::SimCluster) -> u64 {
    (sim.requests().into_iter())
        .filter(|((_, verb, resource), _)| verb == "list" && resource == "leases")
        .map(|(_, n)| n)
        .sum()
}

#[tokio::test]
async fn a_lease_watch_closed_every_second_and_expired_relists_and_stands_in_for_reads_again() {
    let sim = test_kit::sim::manual_cluster().await;
    // Every watch ends after a second: the watcher resumes from the version it saw last.
    sim.set_faults(spark_pod_allocator_sim::FaultSettings {
        watch_close_after_seconds: Some(1),
        ..Default::default()
    });
    let client = sim.try_client().expect("client");
    let mut a = keeper(&client, "replica-a");
    assert_eq!(holds(&a.turn(Instant::now()).await), Some(0));
    let mut b = keeper(&client, "replica-b").watching();
    test_kit::wait::until("b follows the Lease by its watch", async || {
        b.is_following()
    })
    .await;
    let listed = lease_lists(&sim);

    // A change b's watch does not select moves the cluster's version past b's, then the
    // history is gone: b's next resume is answered 410, and its watcher lists again.
    let other: Lease =
        serde_json::from_value(json!({"metadata": {"name": "someone-elses"}})).expect("a Lease");
    (Api::<Lease>::namespaced(client.clone(), NAMESPACE))
        .create(&Default::default(), &other)
        .await
        .expect("create another Lease");
    sim.compact_history();
    test_kit::wait::until("b's watch listed the Lease again", async || {
        lease_lists(&sim) > listed && b.is_following()
    })
    .await;
    let reads = lease_reads(&sim);
    assert_eq!(b.turn(Instant::now()).await, held_by("replica-a"));
    a.release().await.expect("release");
    test_kit::wait::until("b takes the released shard", async || {
        holds(&b.turn(Instant::now()).await) == Some(1)
    })
    .await;
    assert_eq!(
        lease_reads(&sim),
        reads,
        "once relisted, the watch stands in for reads again"
    );
}
