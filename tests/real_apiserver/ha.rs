//! Two replicas of the service binary on a real API server of their own, with the chart's
//! rights only: the owner is paused (SIGSTOP) past its lease, the other takes the shard and
//! finishes the scale-up, and the owner, woken up (SIGCONT), sends not one write. The
//! proof is the API server's audit log: every request names its replica in its User-Agent.
//! Then rebalancing: a second replica joining takes one of two shards by the drain
//! handshake on the real Leases, within the chart's rights, and the old owner writes
//! nothing of the moved shard's after it let it go. And three replicas: the owner cut off
//! from the API server mid scale-up, then the next owner killed mid scale-up; the third
//! finishes it, no pod is created twice, and the cut-off owner, healed, wrote nothing after
//! it lost the shard.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::Value;
use spark_pod_allocator::grpc::forward::ANSWERED_BY_METADATA;
use spark_pod_allocator::ha::shards::ShardMap;
use spark_pod_allocator::k8s::leases::REQUESTED_BY_ANNOTATION;
use spark_pod_allocator::k8s::replica_user_agent;
use test_kit::cluster::{Cluster, RealBackend};
use test_kit::grpc::batched_start_request;
use test_kit::partition::Partition;
use test_kit::process::{connect_serving, pause, serve_with, wake};
use test_kit::requests::*;
use test_kit::wait::{until, until_progress};
use tokio::process::Child;

const APP: &str = "app-ha";
const BIN: &str = env!("CARGO_BIN_EXE_spark-pod-allocator");

async fn replica(c: &RealBackend, kubeconfig: &std::path::Path, identity: &str) -> (Child, String) {
    replica_of(c, kubeconfig, identity, 1).await
}

async fn replica_of(
    c: &RealBackend,
    kubeconfig: &std::path::Path,
    identity: &str,
    shards: u32,
) -> (Child, String) {
    let shards = shards.to_string();
    serve_with(
        BIN,
        kubeconfig,
        &c.service_settings().registrations,
        &[
            ("SPARK_POD_ALLOCATOR__HA__IDENTITY", identity),
            ("SPARK_POD_ALLOCATOR__HA__LEASE_DURATION_MS", "3000"),
            ("SPARK_POD_ALLOCATOR__HA__RENEW_DEADLINE_MS", "2000"),
            ("SPARK_POD_ALLOCATOR__HA__RETRY_PERIOD_MS", "500"),
            ("SPARK_POD_ALLOCATOR__HA__SHARDS", &shards),
        ],
    )
    .await
}

async fn executor_ids(c: &RealBackend) -> BTreeSet<u64> {
    test_kit::sim::executor_ids(&c.admin_client(), c.namespace(), APP).await
}

async fn holder(c: &RealBackend) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(c.admin_client(), c.service_namespace());
    leases
        .get_opt("spark-pod-allocator-shard-0")
        .await
        .expect("get the Lease")
        .and_then(|lease| lease.spec?.holder_identity)
}

/// Per shard of `shards`, its Lease's holder and whether it carries a request.
async fn leases(c: &RealBackend, shards: u32) -> Vec<(Option<String>, bool)> {
    let api: Api<Lease> = Api::namespaced(c.admin_client(), c.service_namespace());
    let mut all = Vec::new();
    for shard in 0..shards {
        let lease = api
            .get_opt(&format!("spark-pod-allocator-shard-{shard}"))
            .await
            .expect("get the Lease");
        let requested = (lease.as_ref())
            .and_then(|l| l.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(REQUESTED_BY_ANNOTATION));
        let holder = (lease.and_then(|l| l.spec))
            .and_then(|spec| spec.holder_identity)
            .filter(|h| !h.is_empty());
        all.push((holder, requested));
    }
    all
}

/// Sends `target` for `app` through `address` until it is answered (UNAVAILABLE is
/// retried, as the driver's plugin does, while the Leases move; anything else fails).
async fn scale(c: &RealBackend, address: &str, app: &str, target: u32) {
    let client = connect_serving(address).await;
    let answer = async || match client
        .clone()
        .set_total_expected(targets_request(app, target))
        .await
    {
        Ok(_) => true,
        Err(status) if status.code() == tonic::Code::Unavailable => false,
        Err(status) => panic!("SetTotalExpected {app}: answered {status:?}"),
    };
    // The scenarios run at most two shards.
    until_progress(
        &format!("SetTotalExpected {app} answered"),
        async || {
            if answer().await {
                None
            } else {
                Some(leases(c, 2).await)
            }
        },
        Option::is_none,
    )
    .await;
}

/// Whether GetStatus of the application through `client` is answered by `identity`.
async fn answered_by(
    mut client: spark_pod_allocator::proto::executor_allocator_client::ExecutorAllocatorClient<
        tonic::transport::Channel,
    >,
    identity: &str,
) -> bool {
    client
        .get_status(status_request(APP))
        .await
        .is_ok_and(|status| {
            status
                .metadata()
                .get(ANSWERED_BY_METADATA)
                .is_some_and(|by| by.to_str().ok() == Some(identity))
        })
}

/// The writes (anything but get, list and watch) of `identity` in the audit log.
fn writes_of(c: &RealBackend, identity: &str) -> Vec<Value> {
    let agent = replica_user_agent(identity);
    c.server()
        .audit_events()
        .into_iter()
        .filter(|e| e["stage"] == "ResponseComplete" || e["stage"] == "Panic")
        .filter(|e| e["userAgent"] == agent.as_str())
        .filter(|e| !matches!(e["verb"].as_str(), Some("get" | "list" | "watch")))
        .collect()
}

/// The Lease requests of `identity` in the audit log: how many by verb and answer code.
fn lease_requests_of(c: &RealBackend, identity: &str) -> BTreeMap<(String, i64), usize> {
    let agent = replica_user_agent(identity);
    let mut seen = BTreeSet::new();
    let mut counts = BTreeMap::new();
    for event in c.server().audit_events() {
        let code = event["responseStatus"]["code"].as_i64();
        if event["userAgent"] != agent.as_str()
            || event["objectRef"]["resource"] != "leases"
            || !seen.insert(event["auditID"].to_string())
        {
            continue;
        }
        let verb = event["verb"].as_str().unwrap_or_default().to_string();
        *counts.entry((verb, code.unwrap_or(0))).or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_woken_after_a_takeover_writes_nothing_by_the_audit_log() {
    let Some(c) = RealBackend::start_own("ha-pause", &[]).await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    c.write_service_kubeconfig(&kubeconfig);
    let (a, address_a) = replica(&c, &kubeconfig, "replica-a").await;
    let mut client_a = connect_serving(&address_a).await;
    let (_b, address_b) = replica(&c, &kubeconfig, "replica-b").await;
    let b_started = std::time::Instant::now();
    let mut client_b = connect_serving(&address_b).await;
    assert_eq!(holder(&c).await.as_deref(), Some("replica-a"));

    client_a
        .start(batched_start_request(APP, c.namespace(), 2, 1000))
        .await
        .expect("Start on the owner");
    client_a
        .set_total_expected(targets_request(APP, 6))
        .await
        .expect("SetTotalExpected");
    until_progress(
        "the first batch",
        async || executor_ids(&c).await,
        |ids| ids.len() >= 2,
    )
    .await;
    assert!(
        !writes_of(&c, "replica-a").is_empty(),
        "the owner's writes are in the log"
    );
    pause(&a);

    until_progress(
        "replica-b holds the shard",
        async || holder(&c).await,
        |holder| holder.as_deref() == Some("replica-b"),
    )
    .await;
    // Until it took the shard over, `b` followed the Lease by a watch of it by name, which
    // the chart's rights allow, and read it only until that watch had listed it, not every
    // retry period (500 ms) over the lease it waited.
    let following = b_started.elapsed();
    let b_leases = lease_requests_of(&c, "replica-b");
    let count = |verb: &str, code: i64| b_leases.get(&(verb.to_string(), code)).copied();
    assert!(count("watch", 200).is_some(), "{b_leases:?}");
    assert!(
        b_leases.keys().all(|(_, code)| *code < 400),
        "the chart's rights allow every Lease request: {b_leases:?}"
    );
    assert!(
        count("get", 200).unwrap_or(0) <= 2,
        "replica-b read the Lease it does not hold over {following:?}: {b_leases:?}"
    );
    eprintln!("replica-b's Lease requests over {following:?}: {b_leases:?}");
    // Once the lease has passed, anything `a` had on the wire has been answered.
    let at_takeover = writes_of(&c, "replica-a").len();
    until_progress(
        "6 executors, through replica-b",
        async || executor_ids(&c).await,
        |ids| ids.len() == 6,
    )
    .await;
    client_b
        .set_total_expected(targets_request(APP, 8))
        .await
        .expect("the new owner takes calls");
    until_progress(
        "8 executors",
        async || executor_ids(&c).await,
        |ids| ids.len() == 8,
    )
    .await;

    wake(&a);
    // Woken, `a` lets the application go and forwards its calls to the new owner.
    until("replica-a let the application go", || {
        answered_by(client_a.clone(), "replica-b")
    })
    .await;
    let writes = writes_of(&c, "replica-a");
    assert_eq!(
        writes.len(),
        at_takeover,
        "the deposed owner wrote: {:?}",
        &writes[at_takeover.min(writes.len())..]
    );
    assert_eq!(executor_ids(&c).await.len(), 8, "no pod beyond the target");
    let stopped = client_b
        .stop(stop_request(APP))
        .await
        .expect("Stop")
        .into_inner();
    assert_eq!(stopped.deleted_pods, 8);
    c.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_takes_a_shard_by_the_drain_handshake_and_the_old_owner_writes_none_of_it()
 {
    let Some(c) = RealBackend::start_own("ha-rebalance", &[]).await else {
        return;
    };
    // One application in each of two namespaces, on shards 0 and 1.
    let map = ShardMap::new(2).expect("2 shards");
    let apps = [("app-a", c.namespace()), ("app-b", c.other_namespace())];
    let shard_of = |ns: &str| map.shard_of(ns).0;
    assert_ne!(
        shard_of(apps[0].1),
        shard_of(apps[1].1),
        "the scenario's namespaces are on different shards"
    );
    let ids = |app: &'static str, ns: &str| {
        let (client, ns) = (c.admin_client(), ns.to_string());
        async move { test_kit::sim::executor_ids(&client, &ns, app).await }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    c.write_service_kubeconfig(&kubeconfig);

    let (_a, address_a) = replica_of(&c, &kubeconfig, "replica-a", 2).await;
    until_progress(
        "replica-a holds both shards",
        async || leases(&c, 2).await,
        |now| now.iter().all(|(h, _)| h.as_deref() == Some("replica-a")),
    )
    .await;
    let mut client_a = connect_serving(&address_a).await;
    for (app, ns) in apps {
        client_a
            .start(batched_start_request(app, ns, 2, 200))
            .await
            .expect("Start");
        scale(&c, &address_a, app, 3).await;
    }
    for (app, ns) in apps {
        until_progress(
            &format!("{app} at 3"),
            async || ids(app, ns).await,
            |ids| ids.len() == 3,
        )
        .await;
    }
    let before = [
        ids(apps[0].0, apps[0].1).await,
        ids(apps[1].0, apps[1].1).await,
    ];

    // b asks for a's lowest shard; a drains and releases it; b takes it.
    let (_b, address_b) = replica_of(&c, &kubeconfig, "replica-b", 2).await;
    until_progress(
        "one shard each, none asked for",
        async || leases(&c, 2).await,
        |now| {
            *now == [
                (Some("replica-b".into()), false),
                (Some("replica-a".into()), false),
            ]
        },
    )
    .await;
    let (moved, stayed) = if shard_of(apps[0].1) == 0 {
        (apps[0], apps[1])
    } else {
        (apps[1], apps[0])
    };
    // a's writes in the moved shard's namespace, now that b holds it (a released it only
    // once its actors had stopped).
    let in_moved = |c: &RealBackend| {
        writes_of(c, "replica-a")
            .into_iter()
            .filter(|e| e["objectRef"]["namespace"] == moved.1)
            .count()
    };
    let at_release = in_moved(&c);
    assert!(
        at_release > 0,
        "the old owner's writes there are in the log"
    );

    // Both go on: the moved one through a (forwarded to b), the other through b (to a).
    scale(&c, &address_a, moved.0, 5).await;
    scale(&c, &address_b, stayed.0, 5).await;
    for (app, ns) in apps {
        until_progress(
            &format!("{app} at 5"),
            async || ids(app, ns).await,
            |ids| ids.len() == 5,
        )
        .await;
    }
    for ((app, ns), before) in apps.iter().zip(&before) {
        let now = ids(app, ns).await;
        let old_max = before.iter().max().copied().unwrap_or(0);
        assert!(before.is_subset(&now), "{app}: {before:?} ⊄ {now:?}");
        assert!(
            now.difference(before).all(|id| *id > old_max),
            "{app}: no id handed out twice: {now:?} after {before:?}"
        );
    }
    let answered_by = client_a
        .get_status(status_request(moved.0))
        .await
        .expect("GetStatus through a");
    assert_eq!(
        answered_by
            .metadata()
            .get(ANSWERED_BY_METADATA)
            .and_then(|v| v.to_str().ok()),
        Some("replica-b"),
        "the moved application answers from its new owner"
    );
    assert_eq!(
        in_moved(&c),
        at_release,
        "the old owner wrote in the moved shard's namespace after it let it go"
    );
    for (app, address) in [(moved.0, &address_b), (stayed.0, &address_a)] {
        let stopped = connect_serving(address)
            .await
            .stop(stop_request(app))
            .await
            .expect("Stop")
            .into_inner();
        assert_eq!(stopped.deleted_pods, 5, "{app}");
    }
    c.finish().await;
}

/// How many times the API server created each executor pod (201), from the audit log.
fn pods_created(c: &RealBackend) -> std::collections::BTreeMap<String, usize> {
    let mut created = std::collections::BTreeMap::new();
    for event in c.server().audit_events() {
        if event["stage"] == "ResponseComplete"
            && event["verb"] == "create"
            && event["objectRef"]["resource"] == "pods"
            && event["objectRef"]["namespace"] == c.namespace()
            && event["responseStatus"]["code"] == 201
            && let Some(name) = event["objectRef"]["name"].as_str()
        {
            *created.entry(name.to_string()).or_default() += 1;
        }
    }
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_finish_a_scale_up_through_a_partitioned_owner_and_a_killed_one() {
    const TARGET: u32 = 30;
    let Some(c) = RealBackend::start_own("ha-three", &[]).await else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    c.write_service_kubeconfig(&kubeconfig);
    // replica-a reaches the API server through a link the test cuts.
    let cut_off = dir.path().join("kubeconfig-a");
    let link = Partition::in_front_of(&kubeconfig, &cut_off).await;
    let (_a, address_a) = replica(&c, &cut_off, "replica-a").await;
    assert_eq!(holder(&c).await.as_deref(), Some("replica-a"));
    let (b, address_b) = replica(&c, &kubeconfig, "replica-b").await;
    let (third, address_c) = replica(&c, &kubeconfig, "replica-c").await;
    let mut others = vec![("replica-b", b, address_b), ("replica-c", third, address_c)];

    // Through a replica that does not own the shard: forwarded to replica-a.
    let mut client = connect_serving(&others[0].2).await;
    client
        .start(batched_start_request(APP, c.namespace(), 2, 1000))
        .await
        .expect("Start through a non-owner");
    // At 2 executors a second (batches of 2, 1 s apart) the new owner needs about 14 s for
    // the rest of TARGET: far more than the test's own steps between its takeover and the
    // kill take on a loaded machine, so the kill lands mid scale-up.
    scale(&c, &others[1].2, APP, TARGET).await;
    until_progress(
        "the first batch",
        async || executor_ids(&c).await,
        |ids| ids.len() >= 2,
    )
    .await;
    // The next owner resumes with the target the registration holds: written as soon as it
    // is set, though answered before it lands (a call answers without waiting on the API
    // server), so the cut waits for it.
    until("the registration holds the target", async || {
        test_kit::service::stored_registration(
            &c.admin_client(),
            c.service_namespace(),
            c.namespace(),
            APP,
        )
        .await
        .is_some_and(|r| r.targets == BTreeMap::from([(0, TARGET)]))
    })
    .await;

    link.cut();
    // Cut off, replica-a still answers its callers: forwarded, or UNAVAILABLE while it
    // cannot tell who holds the shard; never a hang.
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        connect_serving(&address_a)
            .await
            .get_status(status_request(APP)),
    )
    .await
    .expect("the cut-off replica answers within 5 s");
    if let Err(status) = &answer {
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    }
    until_progress(
        "another replica holds the shard",
        async || holder(&c).await,
        |holder| holder.as_deref().is_some_and(|h| h != "replica-a"),
    )
    .await;
    // Its renew deadline (2 s) passed before the lease (3 s) let anyone take the shard.
    let at_takeover = writes_of(&c, "replica-a").len();
    let first = holder(&c).await.expect("a holder");
    let before = executor_ids(&c).await.len();
    until_progress(
        "the new owner goes on with the scale-up",
        async || executor_ids(&c).await,
        |ids| ids.len() > before,
    )
    .await;
    let owner = others
        .iter()
        .position(|(identity, ..)| *identity == first)
        .expect("replica-b or replica-c");
    let (killed, mut child, _) = others.swap_remove(owner);
    let at_kill = executor_ids(&c).await.len();
    assert!(
        at_kill < TARGET as usize,
        "the kill lands mid scale-up ({at_kill} of {TARGET})"
    );
    child.start_kill().expect("SIGKILL");
    child.wait().await.expect("reaped");
    let (survivor, _child, address) = &others[0];
    until_progress(
        "the third replica holds the shard",
        async || holder(&c).await,
        |holder| holder.as_deref() == Some(*survivor),
    )
    .await;
    until_progress(
        "the scale-up finished",
        async || executor_ids(&c).await,
        |ids| ids.len() == TARGET as usize,
    )
    .await;
    scale(&c, address, APP, TARGET + 2).await;
    until_progress(
        "two executors more",
        async || executor_ids(&c).await,
        |ids| ids.len() == TARGET as usize + 2,
    )
    .await;

    // Healed, replica-a sees the holder, lets the application go and forwards to it.
    link.heal();
    let mut client_a = connect_serving(&address_a).await;
    until("replica-a forwards to the survivor", || {
        answered_by(client_a.clone(), survivor)
    })
    .await;
    let writes = writes_of(&c, "replica-a");
    assert_eq!(
        writes.len(),
        at_takeover,
        "the partitioned owner wrote after it lost the shard: {:?}",
        &writes[at_takeover.min(writes.len())..]
    );
    let created = pods_created(&c);
    let twice: Vec<_> = created.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "pods created twice: {twice:?}");
    assert_eq!(
        executor_ids(&c).await.len(),
        TARGET as usize + 2,
        "no pod beyond the target ({killed} killed at {at_kill})"
    );
    let stopped = client_a
        .stop(stop_request(APP))
        .await
        .expect("Stop through the old owner")
        .into_inner();
    assert_eq!(stopped.deleted_pods, TARGET + 2);
    c.finish().await;
}
