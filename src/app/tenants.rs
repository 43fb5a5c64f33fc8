//! Per-tenant limits (`tenants` in the configuration): how many applications one identity
//! and one namespace may run, and how many WatchExecutors streams one identity (and the
//! whole service) may hold open, so that one tenant cannot take the service's memory from
//! the others. The counts are slots held by what they count (an application's registry
//! entry, a stream's reading end) and given back when it is dropped, so no path that
//! forgets an application or ends a stream can leak one.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Deserialize;

use super::AppError;
use crate::metrics::Metrics;

/// Bytes of unread changes a stream may hold before it is given a fresh full state
/// instead (`tenants.watch_stream_buffer_bytes`).
pub const STREAM_BUFFER_BYTES: usize = 256 * 1024;
/// The limits; the defaults hold a busy shared service (see each).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TenantLimits {
    /// Applications one identity may run at once (default 100). An identity is usually
    /// the service account of a namespace's drivers, so this is a team's concurrent Spark
    /// applications; one costs about 60 KiB here before it has executors, so 100 hold
    /// about 6 MiB.
    pub max_applications_per_identity: usize,
    /// Applications one namespace may run at once, whoever started them (default 200:
    /// twice an identity's, so a second identity in the namespace, or a namespace used
    /// with `auth.mode = none`, has room; the only cap there is no identity).
    pub max_applications_per_namespace: usize,
    /// WatchExecutors streams one identity may hold open at once (default 128: a
    /// driver holds one per application, plus room for reconnects).
    pub max_watch_streams_per_identity: usize,
    /// WatchExecutors streams open at once in the whole service (default 2048).
    pub max_watch_streams: usize,
    /// Bytes of unread changes one stream may hold (the pods' JSON) before it is given a
    /// fresh full state instead (default 256 KiB; `executor_stream_buffer` bounds the
    /// count of changes too). Bounds what a stream that is never read costs.
    pub watch_stream_buffer_bytes: usize,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            max_applications_per_identity: 100,
            max_applications_per_namespace: 200,
            max_watch_streams_per_identity: 128,
            max_watch_streams: 2048,
            watch_stream_buffer_bytes: STREAM_BUFFER_BYTES,
        }
    }
}

impl TenantLimits {
    /// The rule a value breaks, as `(key, reason)` (the key without `tenants.`).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        let positive = [
            (
                "max_applications_per_identity",
                self.max_applications_per_identity,
            ),
            (
                "max_applications_per_namespace",
                self.max_applications_per_namespace,
            ),
            (
                "max_watch_streams_per_identity",
                self.max_watch_streams_per_identity,
            ),
            ("max_watch_streams", self.max_watch_streams),
            ("watch_stream_buffer_bytes", self.watch_stream_buffer_bytes),
        ];
        for (key, value) in positive {
            if value == 0 {
                return Err((key, "must be greater than 0".into()));
            }
        }
        Ok(())
    }
}

/// Counts per key; a count at 0 is removed.
#[derive(Debug, Default)]
struct Counts(HashMap<String, usize>);

impl Counts {
    fn get(&self, key: &str) -> usize {
        self.0.get(key).copied().unwrap_or(0)
    }

    fn add(&mut self, key: &str) {
        *self.0.entry(key.to_string()).or_default() += 1;
    }

    fn remove(&mut self, key: &str) {
        if let Some(count) = self.0.get_mut(key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.0.remove(key);
            }
        }
    }
}

/// Whether a slot is taken under the limits or in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// Refused (RESOURCE_EXHAUSTED naming the limit) when it would go over one.
    Enforced,
    /// Taken in any case, with a warning naming the limit it goes over: an application
    /// resumed from its registration after a restart was admitted when it started, and
    /// refusing it now would leave its executor pods with no one to manage them.
    Resumed,
    /// Taken in any case, silently: the application is registered already (left by a
    /// failed Stop) and holds a slot, which the new one replaces.
    Replacing,
}

#[derive(Debug, Default)]
struct Held {
    apps_by_identity: Counts,
    apps_by_namespace: Counts,
    streams_by_identity: Counts,
    streams: usize,
}

/// The service's per-tenant counts and limits.
#[derive(Debug, Clone)]
pub struct Tenants {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    limits: TenantLimits,
    held: Mutex<Held>,
    metrics: Metrics,
}

impl Tenants {
    pub fn new(limits: TenantLimits, metrics: Metrics) -> Self {
        Self {
            inner: Arc::new(Shared {
                limits,
                held: Mutex::new(Held::default()),
                metrics,
            }),
        }
    }

    /// A slot for one more application of `identity` (none: `auth.mode = none`, where only
    /// the namespace cap applies) in `namespace`. The check and the count are one step
    /// under one lock, so concurrent Starts of different applications cannot both pass.
    pub(super) fn admit_application(
        &self,
        namespace: &str,
        identity: Option<&str>,
        admission: Admission,
    ) -> Result<ApplicationSlot, AppError> {
        let limits = &self.inner.limits;
        let mut held = self.lock();
        let over = if held.apps_by_namespace.get(namespace) >= limits.max_applications_per_namespace
        {
            Some((
                "tenants.max_applications_per_namespace",
                format!(
                    "namespace {namespace} already runs {} applications, the most this \
                     service allows; stop one first",
                    limits.max_applications_per_namespace
                ),
            ))
        } else {
            identity
                .filter(|identity| {
                    held.apps_by_identity.get(identity) >= limits.max_applications_per_identity
                })
                .map(|identity| {
                    (
                        "tenants.max_applications_per_identity",
                        format!(
                            "identity {identity} already runs {} applications, the most this \
                             service allows one identity; stop one first",
                            limits.max_applications_per_identity
                        ),
                    )
                })
        };
        if let Some((key, message)) = over {
            match admission {
                Admission::Enforced => {
                    self.inner.metrics.tenant_limit_refused(key);
                    return Err(AppError::ResourceExhausted(format!("{key}: {message}")));
                }
                Admission::Replacing => {}
                Admission::Resumed => {
                    tracing::warn!(
                        limit = key,
                        namespace,
                        identity,
                        "resuming an application over a tenant limit (it was admitted before the restart; new Starts are refused until the tenant is under it again)"
                    );
                }
            }
        }
        held.apps_by_namespace.add(namespace);
        if let Some(identity) = identity {
            held.apps_by_identity.add(identity);
        }
        Ok(ApplicationSlot {
            tenants: self.clone(),
            namespace: namespace.to_string(),
            identity: identity.map(str::to_string),
        })
    }

    /// A slot for one more WatchExecutors stream of `identity` (none: only the service's
    /// cap applies).
    pub(super) fn admit_stream(&self, identity: Option<&str>) -> Result<StreamSlot, AppError> {
        let limits = &self.inner.limits;
        let mut held = self.lock();
        let over = if held.streams >= limits.max_watch_streams {
            Some((
                "tenants.max_watch_streams",
                format!(
                    "the service already holds {} WatchExecutors streams, the most it allows; \
                     try again later",
                    limits.max_watch_streams
                ),
            ))
        } else {
            identity
                .filter(|identity| {
                    held.streams_by_identity.get(identity) >= limits.max_watch_streams_per_identity
                })
                .map(|identity| {
                    (
                        "tenants.max_watch_streams_per_identity",
                        format!(
                            "identity {identity} already holds {} WatchExecutors streams, the \
                             most this service allows one identity; close one first",
                            limits.max_watch_streams_per_identity
                        ),
                    )
                })
        };
        if let Some((key, message)) = over {
            self.inner.metrics.tenant_limit_refused(key);
            return Err(AppError::ResourceExhausted(format!("{key}: {message}")));
        }
        held.streams += 1;
        if let Some(identity) = identity {
            held.streams_by_identity.add(identity);
        }
        self.inner.metrics.set_watch_streams(held.streams);
        Ok(StreamSlot {
            tenants: self.clone(),
            identity: identity.map(str::to_string),
        })
    }

    /// WatchExecutors streams open now.
    pub fn watch_streams(&self) -> usize {
        self.lock().streams
    }

    /// Applications counted in `namespace` now.
    pub fn applications_in(&self, namespace: &str) -> usize {
        self.lock().apps_by_namespace.get(namespace)
    }

    fn lock(&self) -> MutexGuard<'_, Held> {
        match self.inner.held.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }
}

/// One application counted against its namespace and identity while it is held (by its
/// registry entry).
#[derive(Debug)]
pub(super) struct ApplicationSlot {
    tenants: Tenants,
    namespace: String,
    identity: Option<String>,
}

impl Drop for ApplicationSlot {
    fn drop(&mut self) {
        let mut held = self.tenants.lock();
        held.apps_by_namespace.remove(&self.namespace);
        if let Some(identity) = &self.identity {
            held.apps_by_identity.remove(identity);
        }
    }
}

/// One open stream counted against its identity and the service while it is held (by
/// the stream's reading end).
#[derive(Debug)]
pub struct StreamSlot {
    tenants: Tenants,
    identity: Option<String>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut held = self.tenants.lock();
        held.streams = held.streams.saturating_sub(1);
        if let Some(identity) = &self.identity {
            held.streams_by_identity.remove(identity);
        }
        self.tenants.inner.metrics.set_watch_streams(held.streams);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenants(apps_identity: usize, apps_namespace: usize, streams_identity: usize) -> Tenants {
        Tenants::new(
            TenantLimits {
                max_applications_per_identity: apps_identity,
                max_applications_per_namespace: apps_namespace,
                max_watch_streams_per_identity: streams_identity,
                max_watch_streams: 3,
                ..TenantLimits::default()
            },
            Metrics::default(),
        )
    }

    fn refused_key(err: AppError) -> String {
        match err {
            AppError::ResourceExhausted(message) => message
                .split_once(':')
                .map(|(key, _)| key.to_string())
                .unwrap_or(message),
            other => panic!("not RESOURCE_EXHAUSTED: {other:?}"),
        }
    }

    #[test]
    fn applications_are_capped_per_identity_and_per_namespace() {
        let t = tenants(2, 3, 1);
        let a1 = t.admit_application("ns-a", Some("alice"), Admission::Enforced);
        let a2 = t.admit_application("ns-a", Some("alice"), Admission::Enforced);
        let err = t
            .admit_application("ns-b", Some("alice"), Admission::Enforced)
            .unwrap_err();
        assert_eq!(refused_key(err), "tenants.max_applications_per_identity");
        // Another identity still may, until the namespace is full.
        let b1 = t.admit_application("ns-a", Some("bob"), Admission::Enforced);
        let err = t
            .admit_application("ns-a", Some("carol"), Admission::Enforced)
            .unwrap_err();
        assert_eq!(refused_key(err), "tenants.max_applications_per_namespace");
        assert!(
            t.admit_application("ns-b", Some("carol"), Admission::Enforced)
                .is_ok()
        );
        // A slot given back makes room.
        drop(a1);
        assert!(
            t.admit_application("ns-c", Some("alice"), Admission::Enforced)
                .is_ok()
        );
        drop((a2, b1));
        assert_eq!(t.applications_in("ns-a"), 0);
    }

    #[test]
    fn without_an_identity_only_the_namespace_cap_applies() {
        let t = tenants(1, 2, 1);
        let _a = t
            .admit_application("ns", None, Admission::Enforced)
            .unwrap();
        let _b = t
            .admit_application("ns", None, Admission::Enforced)
            .unwrap();
        let err = t
            .admit_application("ns", None, Admission::Enforced)
            .unwrap_err();
        assert_eq!(refused_key(err), "tenants.max_applications_per_namespace");
    }

    #[test]
    fn a_resumed_application_is_counted_even_over_the_cap() {
        let t = tenants(1, 5, 1);
        let _a = t.admit_application("ns", Some("alice"), Admission::Resumed);
        let _b = t
            .admit_application("ns", Some("alice"), Admission::Resumed)
            .unwrap();
        assert_eq!(t.applications_in("ns"), 2);
        let err = t
            .admit_application("ns", Some("alice"), Admission::Enforced)
            .unwrap_err();
        assert_eq!(refused_key(err), "tenants.max_applications_per_identity");
    }

    #[test]
    fn streams_are_capped_per_identity_and_in_all() {
        let t = tenants(1, 1, 2);
        let a = t.admit_stream(Some("alice")).unwrap();
        let _a2 = t.admit_stream(Some("alice")).unwrap();
        let err = t.admit_stream(Some("alice")).unwrap_err();
        assert_eq!(refused_key(err), "tenants.max_watch_streams_per_identity");
        let _b = t.admit_stream(Some("bob")).unwrap();
        let err = t.admit_stream(None).unwrap_err();
        assert_eq!(refused_key(err), "tenants.max_watch_streams");
        drop(a);
        assert_eq!(t.watch_streams(), 2);
        assert!(t.admit_stream(Some("alice")).is_ok());
    }

    #[test]
    fn a_zero_limit_is_refused_by_its_key() {
        let limits = TenantLimits {
            max_watch_streams: 0,
            ..TenantLimits::default()
        };
        assert_eq!(limits.check().unwrap_err().0, "max_watch_streams");
        assert!(TenantLimits::default().check().is_ok());
    }
}
