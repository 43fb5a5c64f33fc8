//! Several replicas, one owner per shard: a namespace belongs to one of `ha.shards` shards
//! ([`shards`]), and a replica acts on a shard's applications only while it holds that
//! shard's Lease ([`claim`]: the pure decisions; `k8s::leases`: the requests).
pub mod claim;
pub mod shards;
