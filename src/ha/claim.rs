//! One replica's claim on one shard's Lease, as pure decisions over what it last read and
//! a monotonic `now`: what to write next, and until when it may act as the owner.
//!
//! Expiry is judged on this replica's own clock, from when it last saw the Lease change
//! (its resourceVersion), never from the `renewTime` another host wrote: clocks of different
//! hosts may disagree, the rate at which they run may not. An owner acts only until
//! `renew_deadline` after it *sent* its last successful write, and `renew_deadline` is
//! shorter than the lease, so it has stopped before any other replica, which waits a whole
//! lease after it *saw* that write, may take the shard over.
use std::time::{Duration, Instant};

/// How long a Lease lasts, how long an owner goes on without renewing, and how often a
/// replica tries (`ha.lease_duration_ms`, `ha.renew_deadline_ms`, `ha.retry_period_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    pub lease: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Default for LeaseTiming {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry: Duration::from_secs(2),
        }
    }
}

impl LeaseTiming {
    /// How long an owner waits after a successful renewal before the next: half of what
    /// its renew deadline leaves after one retry period (4 s by default), never less than
    /// the retry period. A renewal that fails is tried again every retry period, so it still
    /// has several tries before the owner must stop. Replicas that do not hold the shard
    /// see its last renewal when their watch delivers it and wake when a lease has passed
    /// since: a failover waits the lease, whatever the owner's pace.
    pub fn renewal(&self) -> Duration {
        self.retry
            .max(self.renew_deadline.saturating_sub(self.retry) / 2)
    }

    /// The error names the setting: an owner must stop before its Lease can expire for
    /// anyone else, and must try more than once before it stops.
    pub fn check(&self) -> Result<(), (String, String)> {
        let named = |key: &str, why: String| Err((format!("ha.{key}"), why));
        if self.lease.as_secs() < 1 || self.lease.subsec_nanos() != 0 {
            return named(
                "lease_duration_ms",
                "must be a whole number of seconds, at least 1 (the Lease's leaseDurationSeconds)"
                    .into(),
            );
        }
        if self.renew_deadline >= self.lease {
            return named(
                "renew_deadline_ms",
                format!(
                    "must be shorter than ha.lease_duration_ms ({} ms), so an owner stops before its \
                     Lease can expire for another replica",
                    self.lease.as_millis()
                ),
            );
        }
        if self.retry.is_zero() || self.retry >= self.renew_deadline {
            return named(
                "retry_period_ms",
                format!(
                    "must be above 0 and shorter than ha.renew_deadline_ms ({} ms), so an owner tries \
                     to renew more than once before it stops",
                    self.renew_deadline.as_millis()
                ),
            );
        }
        Ok(())
    }
}

/// A shard's Lease as read from the API server: what the claim decides from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity`; `None` or empty: released, free to take.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds` as the holder wrote it.
    pub duration: Duration,
    /// `spec.leaseTransitions`: how many times the shard changed hands, the owner's epoch.
    pub transitions: i32,
    /// `metadata.resourceVersion`: the precondition of the next write.
    pub resource_version: String,
    /// `spec.renewTime` as written (compared, never read as a time): a change of it, the
    /// holder or the transitions is a write of a holder. A requester's write (an
    /// annotation) changes none of them, so it never postpones a dead holder's expiry.
    pub renewed: Option<String>,
    /// Who asked for the shard (`spark-pod-allocator/requested-by`): a Lease released
    /// with a request is the requester's alone for one lease.
    pub requested_by: Option<String>,
}

impl LeaseView {
    fn holders_write(&self) -> (Option<&str>, i32, Option<&str>) {
        (
            self.holder.as_deref().filter(|h| !h.is_empty()),
            self.transitions,
            self.renewed.as_deref(),
        )
    }
}

/// What the claim writes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// No Lease yet: create it, held by this replica at epoch 0.
    Create,
    /// Replace the Lease read at `resource_version`, held by this replica at `epoch`;
    /// `acquired`: it changes hands (a new `acquireTime`).
    Replace {
        resource_version: String,
        epoch: i32,
        acquired: bool,
    },
}

/// What the claim does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this write; report its outcome with [`ShardClaim::written`] or
    /// [`ShardClaim::refused`].
    Write(Write),
    /// Another replica holds it: read again later.
    HeldBy { holder: String },
    /// Nothing read yet: read the Lease first ([`ShardClaim::read`]).
    Read,
    /// Released for `requester`, which alone may take it until a lease has passed since
    /// the release was seen (then anyone may: the requester may be gone).
    Reserved { requester: String },
}

/// This replica's right to act on a shard: the epoch its writes carry and the instant it
/// must stop by if it has not renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ownership {
    pub epoch: i32,
    pub valid_until: Instant,
}

impl Ownership {
    /// True while the owner may still write.
    pub fn is_valid(&self, now: Instant) -> bool {
        now < self.valid_until
    }
}

/// One replica's claim on one shard.
#[derive(Debug, Clone)]
pub struct ShardClaim {
    identity: String,
    timing: LeaseTiming,
    /// The Lease as last read (`Some(None)`: read, and there is none), and when this replica
    /// saw it change.
    observed: Option<(Option<LeaseView>, Instant)>,
    held: Option<Ownership>,
}

impl ShardClaim {
    pub fn new(identity: impl Into<String>, timing: LeaseTiming) -> Self {
        Self {
            identity: identity.into(),
            timing,
            observed: None,
            held: None,
        }
    }

    /// The identity written as the holder.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Takes in the Lease as read at `now` (`None`: it does not exist).
    pub fn read(&mut self, lease: Option<LeaseView>, now: Instant) {
        let changed = match &self.observed {
            Some((seen, _)) => {
                seen.as_ref().map(LeaseView::holders_write)
                    != lease.as_ref().map(LeaseView::holders_write)
            }
            None => true,
        };
        if lease.as_ref().and_then(|l| l.holder.as_deref()) != Some(self.identity.as_str()) {
            // Someone else holds or released it: this replica is not the owner, whatever
            // it believed.
            self.held = None;
        }
        let seen_at = match &self.observed {
            Some((_, at)) if !changed => *at,
            _ => now,
        };
        self.observed = Some((lease, seen_at));
    }

    /// What to do at `now`, from what was last read.
    pub fn step(&self, now: Instant) -> Step {
        let Some((lease, seen_at)) = &self.observed else {
            return Step::Read;
        };
        let Some(lease) = lease else {
            return Step::Write(Write::Create);
        };
        match lease.holder.as_deref().filter(|h| !h.is_empty()) {
            Some(holder) if holder == self.identity => Step::Write(Write::Replace {
                resource_version: lease.resource_version.clone(),
                epoch: lease.transitions,
                acquired: false,
            }),
            Some(holder) if now < *seen_at + lease.duration => Step::HeldBy {
                holder: holder.to_string(),
            },
            None if now < *seen_at + lease.duration
                && lease
                    .requested_by
                    .as_deref()
                    .is_some_and(|r| !r.is_empty() && r != self.identity) =>
            {
                Step::Reserved {
                    requester: lease.requested_by.clone().unwrap_or_default(),
                }
            }
            _ => Step::Write(Write::Replace {
                resource_version: lease.resource_version.clone(),
                epoch: lease.transitions.saturating_add(1),
                acquired: true,
            }),
        }
    }

    /// When the hold last seen (another replica's, or a release reserved for another) has
    /// lasted a whole lease on this replica's clock: the instant a takeover may be due.
    pub fn expires_at(&self) -> Option<Instant> {
        let Some((Some(lease), seen_at)) = &self.observed else {
            return None;
        };
        let holder = lease.holder.as_deref().filter(|h| !h.is_empty());
        (holder != Some(self.identity.as_str())).then(|| *seen_at + lease.duration)
    }

    /// The write sent at `sent_at` landed; the Lease is now `lease`. This replica owns the
    /// shard until `sent_at + renew_deadline` unless it renews again.
    pub fn written(&mut self, lease: LeaseView, sent_at: Instant, now: Instant) {
        let epoch = lease.transitions;
        self.read(Some(lease), now);
        self.held = Some(Ownership {
            epoch,
            valid_until: sent_at + self.timing.renew_deadline,
        });
    }

    /// The write was refused: a 409 (someone else wrote the Lease since it was read) or a
    /// 404 (it was deleted). This replica stops acting at once and reads again.
    pub fn refused(&mut self) {
        self.held = None;
        self.observed = None;
    }

    /// The ownership at `now`, if this replica still may act on the shard.
    pub fn ownership(&self, now: Instant) -> Option<Ownership> {
        self.held.filter(|held| held.is_valid(now))
    }

    /// Forgets the ownership (after a release was sent, or on shutdown).
    pub fn step_down(&mut self) {
        self.held = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> LeaseTiming {
        LeaseTiming::default()
    }

    fn lease(holder: Option<&str>, transitions: i32, rv: &str) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            duration: Duration::from_secs(15),
            transitions,
            resource_version: rv.to_string(),
            renewed: Some(format!("renewed at {rv}")),
            requested_by: None,
        }
    }

    #[test]
    fn an_owner_renews_less_often_than_it_retries_and_still_retries_before_its_deadline() {
        let t = timing();
        assert_eq!(t.renewal(), Duration::from_secs(4));
        // Renewed at 0: tries at 4, 6 and 8 s, all before the deadline at 10 s.
        let tries = (0..)
            .map(|k| t.renewal() + t.retry * k)
            .take_while(|at| *at < t.renew_deadline)
            .count();
        assert_eq!(tries, 3);
        // A retry period close to the deadline: the owner renews at that period.
        let tight = LeaseTiming {
            lease: Duration::from_secs(2),
            renew_deadline: Duration::from_millis(1000),
            retry: Duration::from_millis(900),
        };
        assert_eq!(tight.renewal(), tight.retry);
    }

    #[test]
    fn no_lease_is_created_and_the_creator_owns_it_until_its_renew_deadline() {
        let t0 = Instant::now();
        let mut claim = ShardClaim::new("a", timing());
        assert_eq!(claim.step(t0), Step::Read);
        claim.read(None, t0);
        assert_eq!(claim.step(t0), Step::Write(Write::Create));
        claim.written(lease(Some("a"), 0, "1"), t0, t0 + Duration::from_millis(30));
        assert_eq!(
            claim.expires_at(),
            None,
            "its own hold does not expire for it"
        );
        let owned = claim.ownership(t0 + Duration::from_secs(9)).unwrap();
        assert_eq!(owned.epoch, 0);
        assert_eq!(claim.ownership(t0 + Duration::from_secs(10)), None);
        assert_eq!(
            claim.step(t0 + Duration::from_secs(2)),
            Step::Write(Write::Replace {
                resource_version: "1".into(),
                epoch: 0,
                acquired: false
            })
        );
    }

    #[test]
    fn another_holder_is_waited_for_a_whole_lease_from_when_its_last_change_was_seen() {
        let t0 = Instant::now();
        let mut claim = ShardClaim::new("b", timing());
        claim.read(Some(lease(Some("a"), 3, "7")), t0);
        let held_by_a = Step::HeldBy { holder: "a".into() };
        assert_eq!(claim.step(t0 + Duration::from_secs(14)), held_by_a);
        // `a` renewed at t0 + 10 s: the wait starts again from then.
        claim.read(Some(lease(Some("a"), 3, "8")), t0 + Duration::from_secs(10));
        assert_eq!(claim.step(t0 + Duration::from_secs(24)), held_by_a);
        assert_eq!(claim.expires_at(), Some(t0 + Duration::from_secs(25)));
        // The same version read again does not restart the wait.
        claim.read(Some(lease(Some("a"), 3, "8")), t0 + Duration::from_secs(20));
        assert_eq!(claim.expires_at(), Some(t0 + Duration::from_secs(25)));
        assert_eq!(
            claim.step(t0 + Duration::from_secs(25)),
            Step::Write(Write::Replace {
                resource_version: "8".into(),
                epoch: 4,
                acquired: true
            })
        );
    }

    #[test]
    fn a_released_lease_is_taken_at_once_with_the_next_epoch() {
        let t0 = Instant::now();
        for released in [None, Some("")] {
            let mut claim = ShardClaim::new("b", timing());
            claim.read(Some(lease(released, 5, "9")), t0);
            assert_eq!(
                claim.step(t0),
                Step::Write(Write::Replace {
                    resource_version: "9".into(),
                    epoch: 6,
                    acquired: true
                })
            );
        }
    }

    #[test]
    fn an_owner_stops_at_a_refused_write_or_when_it_reads_another_holder() {
        let t0 = Instant::now();
        let mut claim = ShardClaim::new("a", timing());
        claim.read(None, t0);
        claim.written(lease(Some("a"), 0, "1"), t0, t0);
        assert!(claim.ownership(t0).is_some());
        claim.refused();
        assert_eq!(claim.ownership(t0), None);
        assert_eq!(claim.step(t0), Step::Read);

        claim.read(Some(lease(Some("a"), 0, "1")), t0);
        claim.written(lease(Some("a"), 0, "2"), t0, t0);
        claim.read(Some(lease(Some("b"), 1, "3")), t0 + Duration::from_secs(1));
        assert_eq!(claim.ownership(t0 + Duration::from_secs(1)), None);
    }

    #[test]
    fn the_renew_deadline_bounds_ownership_from_when_the_write_was_sent() {
        let t0 = Instant::now();
        let mut claim = ShardClaim::new("a", timing());
        claim.read(None, t0);
        // The create took 4 s to answer: the owner still stops 10 s after sending it.
        claim.written(lease(Some("a"), 0, "1"), t0, t0 + Duration::from_secs(4));
        assert!(claim.ownership(t0 + Duration::from_millis(9_999)).is_some());
        assert!(claim.ownership(t0 + Duration::from_secs(10)).is_none());
    }

    #[test]
    fn a_lease_released_for_a_requester_is_its_alone_for_one_lease() {
        let t0 = Instant::now();
        let mut released = lease(None, 2, "9");
        released.requested_by = Some("b".into());
        let mut requester = ShardClaim::new("b", timing());
        requester.read(Some(released.clone()), t0);
        assert_eq!(
            requester.step(t0),
            Step::Write(Write::Replace {
                resource_version: "9".into(),
                epoch: 3,
                acquired: true
            })
        );
        // The old holder and any other replica wait, a whole lease at most.
        for other in ["a", "c"] {
            let mut claim = ShardClaim::new(other, timing());
            claim.read(Some(released.clone()), t0);
            let reserved = Step::Reserved {
                requester: "b".into(),
            };
            assert_eq!(claim.step(t0 + Duration::from_secs(14)), reserved);
            assert!(matches!(
                claim.step(t0 + Duration::from_secs(15)),
                Step::Write(Write::Replace { acquired: true, .. })
            ));
        }
    }

    #[test]
    fn a_requesters_write_does_not_postpone_a_holders_expiry() {
        let t0 = Instant::now();
        let mut claim = ShardClaim::new("c", timing());
        claim.read(Some(lease(Some("a"), 3, "7")), t0);
        // b wrote its request at t0 + 10 s: a new resourceVersion, the same renewal.
        let mut requested = lease(Some("a"), 3, "8");
        requested.renewed = lease(Some("a"), 3, "7").renewed;
        requested.requested_by = Some("b".into());
        claim.read(Some(requested), t0 + Duration::from_secs(10));
        assert!(matches!(
            claim.step(t0 + Duration::from_secs(15)),
            Step::Write(Write::Replace {
                acquired: true,
                epoch: 4,
                ..
            })
        ));
    }

    #[test]
    fn settings_that_would_let_two_owners_overlap_are_refused_by_name() {
        assert_eq!(timing().check(), Ok(()));
        let bad = |t: LeaseTiming| t.check().unwrap_err().0;
        let base = timing();
        assert_eq!(
            bad(LeaseTiming {
                renew_deadline: Duration::from_secs(15),
                ..base
            }),
            "ha.renew_deadline_ms"
        );
        assert_eq!(
            bad(LeaseTiming {
                retry: Duration::from_secs(10),
                ..base
            }),
            "ha.retry_period_ms"
        );
        assert_eq!(
            bad(LeaseTiming {
                lease: Duration::from_millis(15_500),
                ..base
            }),
            "ha.lease_duration_ms"
        );
    }
}
