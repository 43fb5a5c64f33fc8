//! Which shard a namespace belongs to, and the name of each shard's Lease. Every replica
//! computes the same answer from the namespace alone (a stable hash), so ownership needs no
//! shared table: the applications of one namespace always move together.
use crate::naming::stable_hash_u32;

/// Prefix of the shards' Lease names (`spark-pod-allocator-shard-<n>`).
pub const LEASE_NAME_PREFIX: &str = "spark-pod-allocator-shard-";

/// `ha.shards` shards, numbered from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    shards: u32,
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
        Ok(Self { shards })
    }

    /// One shard: plain leader election.
    pub fn single() -> Self {
        Self { shards: 1 }
    }

    /// How many shards there are.
    pub fn count(&self) -> u32 {
        self.shards
    }

    /// The shard of `namespace`.
    pub fn shard_of(&self, namespace: &str) -> Shard {
        Shard(stable_hash_u32(namespace) % self.shards)
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
