//! Per-executor PersistentVolumeClaims as Spark's allocator handles them (SPARK-35182,
//! SPARK-35416, SPARK-35593): which claims a new executor creates, which free claim of the
//! application it mounts instead, and when creation waits for a claim to come free.
//!
//! The claims themselves come from the pod builder ([`super::ExecutorPodBuilder::claims`]);
//! what the application has in the cluster comes from a listing the caller makes
//! ([`ExecutorClaims::listed`]), and which claims live pods mount from its executor state.
//! Decisions (each has a test):
//! - A listed claim is free when no executor pod of the application mounts it, no request
//!   not yet seen was given it, and it is older than one batch delay (Spark's guard against
//!   a claim whose pod is about to show).
//! - A wanted claim takes a free one of the same storage class (both unset counts as the
//!   same) and at least its size (Spark 4.2 matches so; earlier versions asked for equal
//!   sizes), the first in the listing's order; the pod's volume is pointed at it.
//! - Reuse needs claims that outlive their executor: driver-owned ones ([`ClaimRules::of`]).
//! - Waiting (`wait_to_reuse_claims`): an executor that wants a claim is not created while
//!   the application has `max_claims` claims or more (listed or given since) and none is
//!   free, as Spark's loop stops there; the caller gives its id back.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};

use super::settings::AllocationSettings;
use super::types::{ExecutorId, Timestamp};

/// How the application's claims are reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimRules {
    /// A new executor mounts a free claim instead of creating its own.
    pub reuse: bool,
    /// The claim count at which creation waits for a free claim (only with `reuse`).
    pub wait_at: Option<u32>,
    /// How old a claim must be to be free (one batch delay), in ms.
    pub min_age_ms: i64,
}

impl ClaimRules {
    /// The rules of an application with `settings`, `with_driver` when Start named a driver
    /// pod: reuse only when the driver owns the claims (a pod-owned claim goes with its pod).
    pub fn of(settings: &AllocationSettings, with_driver: bool) -> Self {
        let reuse = settings.reuse_claims && settings.driver_owns_claims && with_driver;
        Self {
            reuse,
            wait_at: settings
                .max_claims
                .filter(|_| reuse && settings.wait_to_reuse_claims),
            min_age_ms: settings.batch_delay_ms(),
        }
    }
}

/// One claim of the application as the cluster lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedClaim {
    pub name: String,
    pub storage_class: Option<String>,
    /// Its storage request in bytes (none when it has none that parses).
    pub size: Option<u128>,
    pub created_at: Option<Timestamp>,
}

impl ListedClaim {
    /// The claim as listed; `None` without a name.
    pub fn of(claim: &PersistentVolumeClaim) -> Option<Self> {
        let (storage_class, size) = class_and_size(claim);
        Some(Self {
            name: claim.metadata.name.clone()?,
            storage_class,
            size,
            created_at: claim
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| Timestamp(t.0.as_millisecond())),
        })
    }
}

/// Whether `claim` is one the service created for application `app_id` with the
/// controller owner `owner_uid` (the driver pod, or the executor's pod): the
/// application's executor labels and that owner. Anyone who may create claims in the
/// namespace can write the labels; the owner's uid is the driver's or a pod's just
/// created, so a claim under a name an executor would use, made by another application or
/// by hand, is never taken for the application's own.
pub fn owned_claim(claim: &PersistentVolumeClaim, app_id: &str, owner_uid: &str) -> bool {
    use super::types::{APP_ID_LABEL, EXECUTOR_ROLE, ROLE_LABEL};
    let labels = claim.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let controller =
        (claim.metadata.owner_references.iter().flatten()).find(|o| o.controller == Some(true));
    !owner_uid.is_empty()
        && label(APP_ID_LABEL) == Some(app_id)
        && label(ROLE_LABEL) == Some(EXECUTOR_ROLE)
        && controller.is_some_and(|o| o.kind == "Pod" && o.uid == owner_uid)
}

/// A claim's storage class and storage request in bytes.
pub fn class_and_size(claim: &PersistentVolumeClaim) -> (Option<String>, Option<u128>) {
    let spec = claim.spec.as_ref();
    let class = spec.and_then(|s| s.storage_class_name.clone());
    let size = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity_bytes(&q.0));
    (class, size)
}

/// Why an executor is not created now: its claims are at the maximum and none is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForClaim {
    /// The application's claims.
    pub claims: usize,
}

/// How often the application's claims are listed again while reuse reads them: a claim
/// deleted by someone else is forgotten within this (the ones the service creates are
/// known at once).
pub const RELIST_MS: i64 = 60_000;

/// The claims of one application: those listed and those created since, and those given
/// to requests whose pods no snapshot showed yet.
#[derive(Debug, Clone, Default)]
pub struct ExecutorClaims {
    rules: ClaimRules,
    /// The application's claims by name, in the order they became known.
    known: Vec<ListedClaim>,
    /// Claim names given (reused or created) to requests not yet seen, by executor.
    given: BTreeMap<ExecutorId, Vec<String>>,
    /// Of those, the claims created for them (known before the cluster has them).
    created: BTreeMap<ExecutorId, Vec<String>>,
    /// When the last listing was asked for (none yet: the first round asks).
    listing_asked: Option<Timestamp>,
}

impl ExecutorClaims {
    pub fn new(rules: ClaimRules) -> Self {
        Self {
            rules,
            ..Self::default()
        }
    }

    /// Whether to list the application's claims at `now` (only reuse reads them): at the
    /// first round (claims of before a restart), then every [`RELIST_MS`]. Marks it asked.
    pub fn listing_due(&mut self, now: Timestamp) -> bool {
        let due = self.rules.reuse
            && self
                .listing_asked
                .is_none_or(|asked| now.millis_since(asked) >= RELIST_MS);
        if due {
            self.listing_asked = Some(now);
        }
        due
    }

    /// The application's claims as the listing last asked for shows them; the claims
    /// created since it was asked, which it may miss, are kept.
    pub fn listed(&mut self, claims: Vec<ListedClaim>) {
        let asked = self.listing_asked.unwrap_or(Timestamp(i64::MIN));
        let names: BTreeSet<String> = claims.iter().map(|c| c.name.clone()).collect();
        // A claim this service created keeps the time it was created by the service's
        // clock (the age a claim must reach is then free of the API server's clock skew).
        let mut known = claims;
        for claim in &mut known {
            if let Some(ours) = self.known.iter().find(|c| c.name == claim.name) {
                claim.created_at = ours.created_at.or(claim.created_at);
            }
        }
        let newer: Vec<ListedClaim> = self
            .known
            .iter()
            .filter(|c| !names.contains(&c.name) && c.created_at.is_some_and(|at| at >= asked))
            .cloned()
            .collect();
        known.extend(newer);
        self.known = known;
    }

    /// Forgets what was given to executors that are no longer requests unseen (their pods
    /// show in the executor state, which says what they mount, or their create failed).
    pub fn keep_requests(&mut self, unseen: impl Fn(ExecutorId) -> bool) {
        self.given.retain(|id, _| unseen(*id));
        self.created.retain(|id, _| unseen(*id));
    }

    /// Executor `id`'s create failed: the claims created for it may not exist, so they are
    /// no longer known (a listing finds those that do), and what it was given is free again.
    pub fn create_failed(&mut self, id: ExecutorId) {
        self.given.remove(&id);
        if let Some(created) = self.created.remove(&id) {
            self.known.retain(|c| !created.contains(&c.name));
        }
    }

    /// The application's claims: listed, or given since.
    pub fn count(&self) -> usize {
        let names: BTreeSet<&str> = (self.known.iter().map(|c| c.name.as_str()))
            .chain(self.given.values().flatten().map(String::as_str))
            .collect();
        names.len()
    }

    /// Known claims free for a new executor: none of `mounted` (the claims the
    /// application's pods mount), none given to a request unseen, old enough at `now`.
    pub fn free(&self, mounted: &BTreeSet<String>, now: Timestamp) -> Vec<&ListedClaim> {
        let given: BTreeSet<&str> = self.given.values().flatten().map(String::as_str).collect();
        self.known
            .iter()
            .filter(|c| !mounted.contains(&c.name) && !given.contains(c.name.as_str()))
            .filter(|c| {
                c.created_at
                    .is_some_and(|at| now.millis_since(at) > self.rules.min_age_ms)
            })
            .collect()
    }

    /// Executor `id`'s claims: `wanted` (built for it) are the claims its `pod` mounts.
    /// With reuse, each takes a free claim that matches it (the pod's volume then names that
    /// one); returns those left to create. `Err` when creation must wait for a claim.
    pub fn assign(
        &mut self,
        id: ExecutorId,
        pod: &mut Pod,
        wanted: Vec<PersistentVolumeClaim>,
        mounted: &BTreeSet<String>,
        now: Timestamp,
    ) -> Result<Vec<PersistentVolumeClaim>, WaitForClaim> {
        if wanted.is_empty() {
            return Ok(wanted);
        }
        let mut free: Vec<ListedClaim> = if self.rules.reuse {
            self.free(mounted, now).into_iter().cloned().collect()
        } else {
            Vec::new()
        };
        if let Some(max) = self.rules.wait_at {
            let claims = self.count();
            if free.is_empty() && claims >= max as usize {
                return Err(WaitForClaim { claims });
            }
        }
        let mut given = Vec::new();
        let mut created = Vec::new();
        let mut to_create = Vec::new();
        for claim in wanted {
            let Some(name) = claim.metadata.name.clone() else {
                continue;
            };
            let (class, size) = class_and_size(&claim);
            let matching = free.iter().position(|f| {
                f.storage_class == class && matches!((f.size, size), (Some(f), Some(s)) if f >= s)
            });
            match matching {
                Some(index) if point_volume(pod, &name, &free[index].name) => {
                    let reused = free.remove(index);
                    tracing::info!(executor = id.0, claim = %reused.name, "executor reuses a claim");
                    given.push(reused.name);
                }
                _ => {
                    if self.rules.reuse && !self.known.iter().any(|c| c.name == name) {
                        self.known.push(ListedClaim {
                            name: name.clone(),
                            storage_class: class,
                            size,
                            created_at: Some(now),
                        });
                        created.push(name.clone());
                    }
                    given.push(name);
                    to_create.push(claim);
                }
            }
        }
        self.given.insert(id, given);
        if !created.is_empty() {
            self.created.insert(id, created);
        }
        Ok(to_create)
    }
}

/// Points the pod's volume that mounts claim `from` at claim `to`; false when none does.
fn point_volume(pod: &mut Pod, from: &str, to: &str) -> bool {
    let claims = pod
        .spec
        .iter_mut()
        .flat_map(|s| s.volumes.iter_mut().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_mut());
    for claim in claims {
        if claim.claim_name == from {
            claim.claim_name = to.to_string();
            return true;
        }
    }
    false
}

/// The claim names a pod's persistentVolumeClaim volumes mount.
pub fn mounted_claims(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .map(|c| c.claim_name.as_str())
}

/// A Kubernetes quantity (`10Gi`, `500M`, `1.5Ti`, `1e9`) in bytes, rounded up; `None`
/// when it does not parse or does not fit.
pub fn quantity_bytes(text: &str) -> Option<u128> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = digits.parse().ok()?;
    // value = mantissa * 10^exp10 * 2^exp2, then / 10^fraction digits.
    let (exp10, exp2): (i32, u32) = match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        other => {
            let exponent = other.strip_prefix(['e', 'E'])?;
            (exponent.parse().ok()?, 0)
        }
    };
    let exp10 = exp10 - i32::try_from(fraction.len()).ok()?;
    let scaled = mantissa.checked_mul(1u128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        scaled.checked_mul(10u128.checked_pow(u32::try_from(exp10).ok()?)?)
    } else {
        let divisor = 10u128.checked_pow(exp10.unsigned_abs())?;
        Some(scaled.div_ceil(divisor))
    }
}
