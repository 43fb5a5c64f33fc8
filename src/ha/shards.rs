//! Which shard a namespace belongs to, and the name of each shard's Lease. Every replica
//! computes the same answer from the namespace (a stable hash of it) and the queues'
//! membership in the configuration (a namespace of a queue hashes as `queue/<name>`), so
//! ownership needs no shared table: the applications of one namespace, and of one queue,
//! always move together.
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::naming::stable_hash_u32;

/// Prefix of the shards' Lease names (`spark-pod-allocator-shard-<n>`).
pub const LEASE_NAME_PREFIX: &str = "spark-pod-allocator-shard-";

/// `ha.shards` shards, numbered from 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMap {
    shards: u32,
    /// Namespaces placed by another key than their name: a queue's namespaces by the
    /// queue's (`queue/<name>`), so one replica owns the whole queue.
    keys: Arc<BTreeMap<String, String>>,
}

/// One shard's number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shard(pub u32);

impl Shard {
    /// The name of its Lease in the lease namespace.
    pub fn lease_name(self) -> String {
        format!("{LEASE_NAME_PREFIX}{}", self.0)
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl ShardMap {
    /// The error names the setting: at least one shard, and no more than a Lease each
    /// replica can renew (one request per shard every retry period).
    pub fn new(shards: u32) -> Result<Self, (String, String)> {
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err((
                "ha.shards".into(),
                format!("must be between 1 and {MAX_SHARDS}, got {shards}"),
            ));
        }
        Ok(Self {
            shards,
            keys: Arc::default(),
        })
    }

    /// One shard: plain leader election.
    pub fn single() -> Self {
        Self {
            shards: 1,
            keys: Arc::default(),
        }
    }

    /// Places each namespace of `keys` by its key instead of its name (every replica must
    /// be given the same).
    pub fn with_keys(mut self, keys: BTreeMap<String, String>) -> Self {
        self.keys = Arc::new(keys);
        self
    }

    /// How many shards there are.
    pub fn count(&self) -> u32 {
        self.shards
    }

    /// The shard of `namespace`.
    pub fn shard_of(&self, namespace: &str) -> Shard {
        let key = self.keys.get(namespace).map_or(namespace, String::as_str);
        Shard(stable_hash_u32(key) % self.shards)
    }

    /// Every shard.
    pub fn shards(&self) -> impl Iterator<Item = Shard> + use<> {
        (0..self.shards).map(Shard)
    }
}

/// More shards than this would cost each replica more Lease writes than rounds.
pub const MAX_SHARDS: u32 = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_has_one_shard_the_same_on_every_replica() {
        let map = ShardMap::new(4).unwrap();
        let other = ShardMap::new(4).unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200 {
            let namespace = format!("team-{i}");
            let shard = map.shard_of(&namespace);
            assert_eq!(shard, other.shard_of(&namespace));
            assert!(shard.0 < 4);
            seen.insert(shard);
        }
        assert_eq!(seen.len(), 4, "200 namespaces spread over every shard");
        // Pinned: a namespace never changes shard between versions.
        assert_eq!(stable_hash_u32("default"), 0x933b_5bde);
        assert_eq!(map.shard_of("default"), Shard(2));
    }

    #[test]
    fn the_namespaces_of_a_queue_share_its_shard() {
        let plain = ShardMap::new(6).unwrap();
        let namespaces: Vec<String> = (0..6).map(|i| format!("team-{i}")).collect();
        let apart: std::collections::BTreeSet<Shard> =
            namespaces.iter().map(|ns| plain.shard_of(ns)).collect();
        assert!(
            apart.len() > 1,
            "the namespaces are in several shards alone"
        );
        let keys = (namespaces.iter())
            .map(|ns| (ns.clone(), "queue/gold".to_string()))
            .collect();
        let queued = ShardMap::new(6).unwrap().with_keys(keys);
        for namespace in &namespaces {
            assert_eq!(queued.shard_of(namespace), plain.shard_of("queue/gold"));
        }
        assert_eq!(queued.shard_of("other"), plain.shard_of("other"));
    }

    #[test]
    fn one_shard_is_plain_leader_election_and_bad_counts_name_the_setting() {
        let single = ShardMap::new(1).unwrap();
        assert_eq!(single.shard_of("anything"), Shard(0));
        assert_eq!(single.shards().count(), 1);
        assert_eq!(Shard(3).lease_name(), "spark-pod-allocator-shard-3");
        for bad in [0, MAX_SHARDS + 1] {
            assert_eq!(ShardMap::new(bad).unwrap_err().0, "ha.shards");
        }
    }
}
