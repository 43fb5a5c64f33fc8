//! What the simulator recorded, judged against the Leases: every write a replica sent for
//! an application's namespace arrived while that namespace's shard Lease named the replica
//! (a deposed owner writes nothing), and no executor id ever named two pods. Read from the
//! simulator's own records ([`SimCluster::writes`], [`SimCluster::history`]), so nothing
//! between two samples is missed.

use std::collections::{BTreeMap, BTreeSet};

use spark_pod_allocator::ha::shards::ShardMap;
use spark_pod_allocator::k8s::replica_user_agent;
use spark_pod_allocator_sim::SimCluster;

/// Where the replicas keep their shard Leases (their own namespace: `default` on the
/// simulator).
pub const LEASE_NAMESPACE: &str = "default";

/// The writes [`writes_without_the_lease`] judged.
#[derive(Debug, Default)]
pub struct Judged {
    /// Writes of the replicas for the namespaces (a check that saw none proves nothing).
    pub checked: usize,
    /// Those sent without the Lease, each as a line saying who wrote what under which
    /// holder.
    pub wrong: Vec<String>,
}

/// Each write a replica of `identities` sent for a namespace of `namespaces` (any resource
/// but Leases) that arrived while its shard's Lease, as stored then, named another holder
/// or none. None: every write came from the shard's holder of the moment. Panics if the
/// simulator's history has dropped changes (give it a `history` large enough for the run).
pub fn writes_without_the_lease(
    sim: &SimCluster,
    map: &ShardMap,
    identities: &[&str],
    namespaces: &[&str],
) -> Judged {
    let history = sim.history();
    assert!(
        history.complete,
        "the simulator's history dropped changes: raise its `history`"
    );
    // Per Lease name, its holder after each change, by resourceVersion.
    let mut holders: BTreeMap<String, Vec<(u64, Option<String>)>> = BTreeMap::new();
    for change in &history.changes {
        if change.resource != "leases" || change.namespace != LEASE_NAMESPACE {
            continue;
        }
        let name = change.object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let holder = match change.kind {
            "DELETED" => None,
            _ => change.object["spec"]["holderIdentity"]
                .as_str()
                .filter(|h| !h.is_empty())
                .map(str::to_string),
        };
        holders
            .entry(name)
            .or_default()
            .push((change.resource_version, holder));
    }
    let agents: BTreeMap<String, &str> = identities
        .iter()
        .map(|id| (replica_user_agent(id), *id))
        .collect();
    let mut judged = Judged::default();
    for write in sim.writes() {
        let Some(identity) = agents.get(&write.agent) else {
            continue;
        };
        if write.resource.starts_with("leases") || !namespaces.contains(&write.namespace.as_str()) {
            continue;
        }
        judged.checked += 1;
        let lease = map.shard_of(&write.namespace).lease_name();
        let holder = holders.get(&lease).and_then(|changes| {
            let before = changes.partition_point(|(rv, _)| *rv <= write.received_at);
            before
                .checked_sub(1)
                .map(|i| (changes[i].0, changes[i].1.clone()))
        });
        if holder.as_ref().and_then(|(_, h)| h.as_deref()) != Some(*identity) {
            judged.wrong.push(format!(
                "{identity} sent {} {} {:?} in {} at resourceVersion {} while {lease} named {:?}",
                write.verb, write.resource, write.name, write.namespace, write.received_at, holder
            ));
        }
    }
    judged
}

/// Each executor id (an application's `spark-exec-id` in a namespace) that named more than
/// one pod over the whole run (two pods created with it, whatever became of the first),
/// and each pod name created twice; as lines naming them. Panics if the simulator's
/// history has dropped changes.
pub fn reused_executor_ids(sim: &SimCluster) -> Vec<String> {
    let history = sim.history();
    assert!(
        history.complete,
        "the simulator's history dropped changes: raise its `history`"
    );
    let mut by_id: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    let mut by_name: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for change in &history.changes {
        if change.resource != "pods" || change.kind != "ADDED" {
            continue;
        }
        let metadata = &change.object["metadata"];
        let labels = &metadata["labels"];
        if labels["spark-role"] != "executor" {
            continue;
        }
        let uid = metadata["uid"].as_str().unwrap_or_default().to_string();
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        by_id
            .entry((
                change.namespace.clone(),
                text(&labels["spark-app-selector"]),
                text(&labels["spark-exec-id"]),
            ))
            .or_default()
            .insert(uid.clone());
        by_name
            .entry((change.namespace.clone(), text(&metadata["name"])))
            .or_default()
            .insert(uid);
    }
    let ids = by_id
        .into_iter()
        .filter(|(_, uids)| uids.len() > 1)
        .map(|((ns, app, id), uids)| format!("{ns}/{app}: executor id {id} named pods {uids:?}"));
    let names = by_name
        .into_iter()
        .filter(|(_, uids)| uids.len() > 1)
        .map(|((ns, name), uids)| format!("{ns}/{name} created {} times: {uids:?}", uids.len()));
    ids.chain(names).collect()
}
