//! The executors' PersistentVolumeClaims, sent through the executor client (the same
//! share of the rate limit and the same fence as the pods they serve): a claim's create
//! (AlreadyExists is fine only for the application's own claim), the listing reuse reads,
//! and Stop's delete. They are selected like executor pods, by
//! `spark-app-selector=<app>,spark-role=executor`, which the service puts on every claim it
//! creates (a driver's own claims, which carry only the application's label, are left
//! alone). Labels anyone may write, so a claim is the application's only with the
//! controller owner the service gave it as well ([`owned_claim`]).
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams, Preconditions};

use super::client::is_status;
use super::describe_error;
use super::executor_pods::{ExecutorPodClient, app_selector};
use crate::allocator::claims::owned_claim;
use crate::allocator::types::APP_ID_LABEL;

/// Whether `existing` is the claim the service meant to create as `wanted`: the same
/// application, and the controller owner `wanted` was given.
fn is_own(wanted: &PersistentVolumeClaim, existing: &PersistentVolumeClaim) -> bool {
    let app = wanted
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(APP_ID_LABEL));
    let owner = (wanted.metadata.owner_references.iter().flatten())
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str());
    match (app, owner) {
        (Some(app), Some(owner)) => owned_claim(existing, app, owner),
        _ => false,
    }
}

/// The error of a create whose name another claim holds.
fn not_ours(wanted: &PersistentVolumeClaim) -> kube::Error {
    let name = wanted.metadata.name.as_deref().unwrap_or_default();
    let app = (wanted.metadata.labels.as_ref())
        .and_then(|l| l.get(APP_ID_LABEL))
        .map_or("", String::as_str);
    kube::Error::Api(Box::new(
        kube::core::Status::failure(
            &format!(
                "persistentvolumeclaims \"{name}\" already exists and is not application \
                 {app}'s (the service did not create it for this application: its labels or \
                 owner differ); no executor mounts it"
            ),
            "AlreadyExists",
        )
        .with_code(409),
    ))
}

impl ExecutorPodClient {
    /// Creates `claim`. One that exists already counts as created only when it is this
    /// application's, with the owner `claim` names ([`owned_claim`]: an earlier attempt,
    /// or claims shared by name); any other is an AlreadyExists error naming it, so that
    /// no executor mounts a claim someone else put under the name it would use.
    pub async fn create_claim(
        &self,
        namespace: &str,
        claim: &PersistentVolumeClaim,
    ) -> Result<(), kube::Error> {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        let answer = match self.api().create(namespace, claim).await {
            Err(err) if is_status(&err, 409) => {
                let existing = self.api().get_opt::<PersistentVolumeClaim>(namespace, name);
                match existing.await {
                    Ok(Some(existing)) if is_own(claim, &existing) => Ok(()),
                    Ok(Some(_)) => Err(not_ours(claim)),
                    // Deleted since: a failed create like any other.
                    Ok(None) => Err(err),
                    Err(read) => Err(read),
                }
            }
            other => other,
        };
        answer.inspect_err(|err| {
            tracing::debug!(namespace, claim = name, error = %describe_error(err), "executor claim create failed");
        })
    }

    /// Refuses, before their pod exists, claims to be owned by it whose name is taken: a
    /// claim there already cannot be the pod's, so the pod is not created to mount it.
    pub(super) async fn check_claim_names_free(
        &self,
        namespace: &str,
        claims: &[PersistentVolumeClaim],
    ) -> Result<(), kube::Error> {
        for claim in claims {
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            let existing = self.api().get_opt::<PersistentVolumeClaim>(namespace, name);
            if existing.await?.is_some() {
                return Err(not_ours(claim));
            }
        }
        Ok(())
    }

    /// Every executor claim of the application.
    pub async fn list_claims(
        &self,
        namespace: &str,
        app_id: &str,
    ) -> Result<Vec<PersistentVolumeClaim>, kube::Error> {
        let lp = ListParams::default().labels(&app_selector(app_id));
        let api = self.api().namespaced::<PersistentVolumeClaim>(namespace);
        self.api()
            .policy()
            .run(|_| api.list(&lp))
            .await
            .map(|list| list.items)
            .inspect_err(|err| {
                tracing::warn!(namespace, app_id, error = %describe_error(err), "listing the executor claims failed");
            })
    }

    /// Deletes the application's executor claims owned by one of `owners` (the uids of
    /// its executor pods: Stop, when the driver pod does not own them), each by name with
    /// its uid as precondition; returns how many were deleted. A claim with the labels but
    /// another owner is not the application's and stays.
    pub async fn delete_claims(
        &self,
        namespace: &str,
        app_id: &str,
        owners: &BTreeSet<String>,
    ) -> Result<u32, kube::Error> {
        let api = self.api().namespaced::<PersistentVolumeClaim>(namespace);
        let mut deleted = 0u32;
        for claim in self.list_claims(namespace, app_id).await? {
            if !owners.iter().any(|uid| owned_claim(&claim, app_id, uid)) {
                continue;
            }
            let (Some(name), uid) = (claim.metadata.name, claim.metadata.uid) else {
                continue;
            };
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let answer = self
                .api()
                .policy()
                .run(|_| async {
                    self.api().acquire().await?;
                    api.delete(&name, &params).await
                })
                .await;
            match answer {
                Ok(_) => deleted = deleted.saturating_add(1),
                // Gone already, or replaced by another claim of that name: not ours now.
                Err(err) if is_status(&err, 404) || is_status(&err, 409) => {}
                Err(err) => {
                    tracing::warn!(namespace, app_id, claim = %name, error = %describe_error(&err), "executor claim delete failed");
                    return Err(err);
                }
            }
        }
        Ok(deleted)
    }
}
