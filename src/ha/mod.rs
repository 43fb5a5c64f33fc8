//! Several replicas, one owner per shard: a namespace belongs to one of `ha.shards` shards
//! ([`shards`]), and a replica acts on a shard's applications only while it holds that
//! shard's Lease ([`claim`]: the pure decisions; `k8s::leases`: the requests;
//! [`ownership`]: what is held now, and the fence every write passes). [`rebalance`]
//! decides which shard moves when replicas join or leave.
pub mod claim;
pub mod ownership;
pub mod rebalance;
pub mod settings;
pub mod shards;

pub use ownership::{Fence, NotOwner, OwnerEpoch, Ownerships, Peer, ShardOwner, ShardState};
pub use settings::HaSettings;
