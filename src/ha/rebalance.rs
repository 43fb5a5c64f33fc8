//! Which shard moves between replicas, as pure decisions over one replica's view of every
//! shard Lease: who holds it and who asked for it.
//!
//! The chart grants `get`, `create` and `update` on Leases, no `list`, so a replica
//! cannot discover another that holds nothing. The members are therefore those the
//! shard Leases name: their holders, and the replicas whose request
//! (`spark-pod-allocator/requested-by`) is on one. A replica holding too few shards
//! announces itself by writing its request on one Lease of the replica holding the most;
//! that owner, on its next renewal, drains the shard (its actors stop and write their
//! registrations) and releases the Lease to an empty holder, keeping the request; the
//! requester then acquires it at once, and for a lease's time nobody else may (see
//! [`super::claim`]). Every write is a PUT under the resourceVersion read.
//!
//! A move is due when the donor holds at least two more shards than the requester. That is
//! exactly "not balanced" (every layout with `max - min <= 1` is stable, and no other is),
//! and each move lowers the sum of squared loads by at least 2, so moves end and never
//! ping-pong. (Releasing only above `ceil(shards / replicas)` would leave 4 shards on 3
//! replicas stuck at 2/2/0.) One shard is in flight at a time: nobody requests while any
//! Lease carries a request or has no live holder, and of two requests written in a race
//! only the one on the lowest shard is answered first.
use std::collections::BTreeMap;

/// One shard's Lease as this replica last saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// The live holder (`None`: released, expired, or no Lease yet).
    pub holder: Option<String>,
    /// Who asked for it (the `spark-pod-allocator/requested-by` annotation).
    pub requested_by: Option<String>,
}

impl Seen {
    pub fn held(holder: &str) -> Self {
        Self {
            holder: Some(holder.to_string()),
            requested_by: None,
        }
    }

    pub fn requested(holder: &str, by: &str) -> Self {
        Self {
            holder: Some(holder.to_string()),
            requested_by: Some(by.to_string()),
        }
    }

    /// Released to `by`: the holder cleared, the request kept.
    pub fn released_to(by: &str) -> Self {
        Self {
            holder: None,
            requested_by: Some(by.to_string()),
        }
    }

    /// No live holder, nobody waiting for it (a failover under way).
    pub fn unowned() -> Self {
        Self::default()
    }

    fn in_flight(&self) -> bool {
        self.holder.is_none() || self.requested_by.is_some()
    }

    /// Whose it is for the loads: its holder's, or its requester's once released.
    fn counted_for(&self) -> Option<&str> {
        self.holder.as_deref().or(self.requested_by.as_deref())
    }
}

/// What the holder of a requested shard does with the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Drain the shard, then release it for the requester.
    Release { to: String },
    /// The move is not due (any more): clear the request with the next renewal.
    Withdraw,
    /// Another move is in flight: keep the request and decide later.
    Wait,
}

/// Shards per member: every holder and requester, and `me`.
fn loads<'a>(me: &'a str, layout: &'a [Seen]) -> BTreeMap<&'a str, usize> {
    let mut loads = BTreeMap::from([(me, 0)]);
    for seen in layout {
        for member in [seen.holder.as_deref(), seen.requested_by.as_deref()]
            .into_iter()
            .flatten()
        {
            loads.entry(member).or_insert(0);
        }
        if let Some(member) = seen.counted_for() {
            *loads.entry(member).or_insert(0) += 1;
        }
    }
    loads
}

/// The shard `me` asks for now, if any: one of the replica holding the most (ties: the
/// first identity), its lowest, when that replica holds at least two more than `me` and
/// nothing is in flight. `layout` must be complete (every shard read this turn or the
/// last); a replica that could not read some Lease asks for nothing.
pub fn request(me: &str, layout: &[Seen]) -> Option<usize> {
    if layout.iter().any(Seen::in_flight) {
        return None;
    }
    let loads = loads(me, layout);
    let mine = loads.get(me).copied().unwrap_or(0);
    // The most loaded, ties broken by identity: every requester picks the same Lease, so
    // two racing requests meet on one resourceVersion and one of them loses.
    let (donor, most) = loads
        .iter()
        .max_by(|(a, x), (b, y)| x.cmp(y).then_with(|| b.cmp(a)))?;
    if *donor == me || *most < mine + 2 {
        return None;
    }
    layout
        .iter()
        .position(|seen| seen.holder.as_deref() == Some(*donor))
}

/// What `me`, the holder of `shard`, does with the request on it (`None`: there is none,
/// or `me` does not hold it).
pub fn answer(me: &str, shard: usize, layout: &[Seen]) -> Option<Answer> {
    let seen = layout.get(shard)?;
    if seen.holder.as_deref() != Some(me) {
        return None;
    }
    let requester = seen.requested_by.as_deref()?;
    if requester == me {
        return Some(Answer::Withdraw);
    }
    // One at a time: a failover under way, a release not taken yet, or a request on a
    // lower shard goes first (two requests racing never wait for each other).
    let blocked = layout.iter().enumerate().any(|(n, other)| {
        n != shard && (other.holder.is_none() || (other.requested_by.is_some() && n < shard))
    });
    if blocked {
        return Some(Answer::Wait);
    }
    let loads = loads(me, layout);
    let mine = loads.get(me).copied().unwrap_or(0);
    let theirs = loads.get(requester).copied().unwrap_or(0);
    Some(if mine >= theirs + 2 {
        Answer::Release {
            to: requester.to_string(),
        }
    } else {
        Answer::Withdraw
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(holders: &[&str]) -> Vec<Seen> {
        holders.iter().map(|h| Seen::held(h)).collect()
    }

    fn count(layout: &[Seen], member: &str) -> usize {
        layout
            .iter()
            .filter(|s| s.holder.as_deref() == Some(member))
            .count()
    }

    /// Runs the handshake among `members` (each deciding from the same layout) until no
    /// one asks: a request, the owner's answer, the release, the requester's acquisition.
    /// Returns the moves made.
    fn settle(layout: &mut [Seen], members: &[&str]) -> Vec<(usize, String, String)> {
        let mut moves = Vec::new();
        for _ in 0..100 {
            let Some((me, shard)) = members
                .iter()
                .find_map(|me| request(me, layout).map(|shard| (*me, shard)))
            else {
                return moves;
            };
            let from = layout[shard]
                .holder
                .clone()
                .expect("requested from a holder");
            layout[shard].requested_by = Some(me.to_string());
            // Nobody else asks while one is in flight.
            for other in members {
                assert_eq!(request(other, layout), None, "{other} while {me} waits");
            }
            match answer(&from, shard, layout) {
                Some(Answer::Release { to }) => {
                    assert_eq!(to, me);
                    layout[shard] = Seen::released_to(me);
                    for other in members {
                        assert_eq!(request(other, layout), None, "{other} mid-release");
                    }
                    layout[shard] = Seen::held(me);
                    moves.push((shard, from, me.to_string()));
                }
                other => panic!("{from} answered {me}'s request with {other:?}"),
            }
        }
        panic!("no end: {moves:?}");
    }

    #[test]
    fn a_balanced_layout_never_moves() {
        for (holders, members) in [
            (vec!["a", "b", "a", "b"], vec!["a", "b"]),
            (vec!["a", "b", "c", "a"], vec!["a", "b", "c"]),
            (vec!["a"], vec!["a", "b"]),
            (vec!["a", "b"], vec!["a", "b", "c"]),
            (vec!["c", "c", "b", "a", "b", "a"], vec!["a", "b", "c"]),
        ] {
            let mut layout = held(&holders);
            assert_eq!(settle(&mut layout, &members), vec![], "{holders:?}");
        }
    }

    #[test]
    fn one_replica_holding_four_and_a_second_joining_end_two_and_two_after_two_moves() {
        let mut layout = held(&["a", "a", "a", "a"]);
        assert_eq!(request("a", &layout), None);
        assert_eq!(request("b", &layout), Some(0));
        let moves = settle(&mut layout, &["a", "b"]);
        assert_eq!(
            moves,
            vec![(0, "a".into(), "b".into()), (1, "a".into(), "b".into())]
        );
        assert_eq!((count(&layout, "a"), count(&layout, "b")), (2, 2));
        assert_eq!(settle(&mut layout, &["a", "b"]), vec![]);
    }

    #[test]
    fn odd_counts_are_stable_one_apart() {
        for (shards, members) in [
            (5, vec!["a", "b"]),
            (3, vec!["a", "b"]),
            (7, vec!["a", "b", "c"]),
            (4, vec!["a", "b", "c"]),
            (8, vec!["a", "b", "c"]),
        ] {
            let mut layout = vec![Seen::held("a"); shards];
            settle(&mut layout, &members);
            let loads: Vec<usize> = members.iter().map(|m| count(&layout, m)).collect();
            let (max, min) = (loads.iter().max(), loads.iter().min());
            assert!(
                max.zip(min).is_some_and(|(x, n)| x - n <= 1),
                "{shards}: {loads:?}"
            );
            assert_eq!(settle(&mut layout, &members), vec![], "stable");
        }
    }

    #[test]
    fn two_holders_and_an_empty_third_end_one_apart() {
        // Releasing only above ceil(4 / 3) = 2 would never move here.
        let mut layout = held(&["a", "a", "b", "b"]);
        let moves = settle(&mut layout, &["a", "b", "c"]);
        assert_eq!(moves, vec![(0, "a".into(), "c".into())]);
    }

    #[test]
    fn a_leaving_members_shards_are_taken_first_then_balanced() {
        // b left: its Leases have no live holder. Nobody asks until they are taken (a
        // failover: whoever turns first), then the layout is balanced again.
        let mut layout = held(&["a", "b", "c", "b"]);
        layout[1] = Seen::unowned();
        layout[3] = Seen::unowned();
        assert_eq!(request("a", &layout), None);
        assert_eq!(request("c", &layout), None);
        assert_eq!(answer("a", 0, &layout), None);
        layout[1] = Seen::held("a");
        layout[3] = Seen::held("a");
        let moves = settle(&mut layout, &["a", "c"]);
        assert_eq!(moves, vec![(0, "a".into(), "c".into())]);
        assert_eq!((count(&layout, "a"), count(&layout, "c")), (2, 2));
    }

    #[test]
    fn a_request_no_longer_due_is_withdrawn_and_one_behind_another_waits() {
        // c asked while b was empty; b has taken one since: a holds 2, c 1 + 0.
        let mut layout = held(&["a", "a", "b", "c"]);
        layout[0].requested_by = Some("c".into());
        assert_eq!(answer("a", 0, &layout), Some(Answer::Withdraw));
        // Two requests written in a race: the lower shard goes first, the other waits.
        let mut layout = held(&["a", "a", "a", "a", "a", "a"]);
        layout[0].requested_by = Some("b".into());
        layout[1].requested_by = Some("c".into());
        assert_eq!(
            answer("a", 0, &layout),
            Some(Answer::Release { to: "b".into() })
        );
        assert_eq!(answer("a", 1, &layout), Some(Answer::Wait));
        // Released and not taken yet: the other waits still.
        layout[0] = Seen::released_to("b");
        assert_eq!(answer("a", 1, &layout), Some(Answer::Wait));
        layout[0] = Seen::held("b");
        assert_eq!(
            answer("a", 1, &layout),
            Some(Answer::Release { to: "c".into() })
        );
        // A request for oneself (a restarted process found its own) is cleared.
        let mut layout = held(&["a", "b"]);
        layout[0].requested_by = Some("a".into());
        assert_eq!(answer("a", 0, &layout), Some(Answer::Withdraw));
        assert_eq!(answer("b", 0, &layout), None);
    }

    #[test]
    fn a_requester_is_a_member_while_its_request_is_on_a_lease() {
        // a holds 3 of 3; b asked for one and c holds nothing: c waits for b's move.
        let mut layout = held(&["a", "a", "a"]);
        layout[0].requested_by = Some("b".into());
        assert_eq!(request("c", &layout), None);
        assert_eq!(
            answer("a", 0, &layout),
            Some(Answer::Release { to: "b".into() })
        );
        layout[0] = Seen::held("b");
        // a 2, b 1, c 0: c asks a.
        assert_eq!(request("c", &layout), Some(1));
        // Ties between the most loaded go to the first identity.
        let layout = held(&["b", "b", "a", "a"]);
        assert_eq!(request("c", &layout), Some(2));
    }
}
