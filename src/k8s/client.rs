//! The one way the service's requests reach the API server ([`ApiClient`]): every request
//! runs under the [`RequestPolicy`] (deadline, retries), and every mutating one first takes
//! a slot of the shared [`RateLimiter`] in the share of the application it is for. The
//! executor pods, the id record, the registrations and the driver pod lookups all send
//! through it, so a request cannot skip the rate limit or the deadline.
use std::fmt;

use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::rate_limit::{RateLimiter, Share};
use super::request::RequestPolicy;
use crate::ha::{Fence, NotOwner};
use crate::metrics::Metrics;

/// The service's Kubernetes client: shared by all applications, each request in one
/// application's share of the rate limit ([`Self::for_application`]).
#[derive(Clone)]
pub struct ApiClient {
    client: kube::Client,
    limiter: RateLimiter,
    policy: RequestPolicy,
    metrics: Metrics,
    /// Whose share of the rate limit this client's requests take.
    share: Share,
    /// What every mutating request passes right before it is sent (the application's
    /// shard still held at its epoch); `None`: the service's own requests.
    fence: Option<Fence>,
}

/// A namespaced object the service reads and writes.
pub(super) trait Namespaced:
    kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Serialize
    + fmt::Debug
{
}

impl<K> Namespaced for K where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + fmt::Debug
{
}

impl ApiClient {
    /// A client whose mutating requests share `limiter`, under the default policy.
    pub fn new(client: kube::Client, limiter: RateLimiter) -> Self {
        Self {
            client,
            limiter,
            policy: RequestPolicy::default(),
            metrics: Metrics::default(),
            share: Share::service(),
            fence: None,
        }
    }

    /// The same client, its requests queued in `app_id`'s share of the rate limit within
    /// `namespace`'s (slots go round-robin between namespaces, then between applications,
    /// see [`RateLimiter`]).
    pub fn for_application(&self, namespace: &str, app_id: &str) -> Self {
        Self {
            share: Share::new(namespace, app_id),
            ..self.clone()
        }
    }

    /// The same client, each mutating request sent only while `fence` passes (checked
    /// after the rate-limit wait, right before the request goes out); one it refuses fails
    /// with [`not_owner`] and is not retried.
    pub fn fenced(&self, fence: Fence) -> Self {
        Self {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// The same client with every request under `policy` (deadline, retries).
    pub fn with_policy(mut self, policy: RequestPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Records into `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where the callers count what their requests did.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The deadline and retries of every request.
    pub(super) fn policy(&self) -> RequestPolicy {
        self.policy
    }

    /// The API of `K` in `namespace`.
    pub(super) fn namespaced<K: Namespaced>(&self, namespace: &str) -> Api<K> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// The API of a cluster-scoped `K`.
    pub(super) fn cluster<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>,
    {
        Api::all(self.client.clone())
    }

    /// A slot of the shared rate limiter, in this client's share (the wait is recorded),
    /// then the fence: the error when this replica may not write for the application.
    pub(super) async fn acquire(&self) -> Result<(), kube::Error> {
        let started = std::time::Instant::now();
        self.limiter.acquire(&self.share).await;
        self.metrics.rate_limit_waited(started.elapsed());
        self.check_fence()
    }

    /// The epoch of the owner its writes are fenced for (`None`: not fenced).
    pub(super) fn owner_epoch(&self) -> Option<crate::ha::OwnerEpoch> {
        self.fence.as_ref().map(Fence::owner_epoch)
    }

    /// The fence alone (a request sent without a rate-limit slot, or before a batch).
    pub(super) fn check_fence(&self) -> Result<(), kube::Error> {
        match &self.fence {
            Some(fence) => fence.check().map_err(|err| {
                self.metrics.write_fenced();
                kube::Error::Service(Box::new(err))
            }),
            None => Ok(()),
        }
    }

    /// `K` named `name`, or `None` when it does not exist.
    pub(super) async fn get_opt<K: Namespaced>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<K>, kube::Error> {
        let api = self.namespaced::<K>(namespace);
        self.policy.run(|_| api.get_opt(name)).await
    }

    /// Creates `object` (rate-limited, retried); a retry that finds it already created by
    /// an attempt whose answer was lost succeeds.
    pub(super) async fn create<K: Namespaced>(
        &self,
        namespace: &str,
        object: &K,
    ) -> Result<(), kube::Error> {
        self.create_answered(namespace, object).await.map(drop)
    }

    /// [`Self::create`], answering the object created, or `None` when a retry found it
    /// already created (by the attempt whose answer was lost, or by someone else).
    pub(super) async fn create_answered<K: Namespaced>(
        &self,
        namespace: &str,
        object: &K,
    ) -> Result<Option<K>, kube::Error> {
        let api = self.namespaced::<K>(namespace);
        self.policy
            .run(|unknown_outcome| {
                let api = &api;
                async move {
                    self.acquire().await?;
                    match api.create(&PostParams::default(), object).await {
                        Err(err) if unknown_outcome && is_status(&err, 409) => Ok(None),
                        other => other.map(Some),
                    }
                }
            })
            .await
    }

    /// One rate-limited merge PATCH of a namespaced object.
    pub(super) async fn merge_patch<K: Namespaced>(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), kube::Error> {
        self.merge_patch_answered::<K>(namespace, name, patch)
            .await
            .map(drop)
    }

    /// [`Self::merge_patch`], answering the object as patched.
    pub(super) async fn merge_patch_answered<K: Namespaced>(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<K, kube::Error> {
        let api = self.namespaced::<K>(namespace);
        self.policy
            .run(|_| async {
                self.acquire().await?;
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
            })
            .await
    }

    /// Deletes `K` named `name` (rate-limited, retried); gone already is fine.
    pub(super) async fn delete<K: Namespaced>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<(), kube::Error> {
        let api = self.namespaced::<K>(namespace);
        let answer = self
            .policy
            .run(|_| async {
                self.acquire().await?;
                api.delete(name, &DeleteParams::default()).await
            })
            .await;
        match answer {
            Ok(_) => Ok(()),
            Err(err) if is_status(&err, 404) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

/// Whether `err` is a write this replica did not send because it does not own the
/// application's shard.
pub fn not_owner(err: &kube::Error) -> Option<&NotOwner> {
    match err {
        kube::Error::Service(inner) => inner.downcast_ref::<NotOwner>(),
        _ => None,
    }
}

/// Whether `err` is the API server answering `code`.
pub(super) fn is_status(err: &kube::Error, code: u16) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == code)
}
