//! The executors' PersistentVolumeClaims, sent through the executor client (the same
//! share of the rate limit and the same fence as the pods they serve): a claim's create
//! (AlreadyExists is fine: claims are idempotent by name), the listing reuse reads, and
//! Stop's collection delete. They are selected like executor pods, by
//! `spark-app-selector=<app>,spark-role=executor`, which the service puts on every claim it
//! creates (a driver's own claims, which carry only the application's label, are left alone).
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams};

use super::client::is_status;
use super::describe_error;
use super::executor_pods::{ExecutorPodClient, app_selector};

impl ExecutorPodClient {
    /// Creates `claim`; one that exists already (an earlier attempt, or a restarted
    /// service's) counts as created.
    pub async fn create_claim(
        &self,
        namespace: &str,
        claim: &PersistentVolumeClaim,
    ) -> Result<(), kube::Error> {
        match self.api().create(namespace, claim).await {
            Err(err) if is_status(&err, 409) => Ok(()),
            Err(err) => {
                tracing::debug!(namespace, claim = ?claim.metadata.name, error = %describe_error(&err), "executor claim create failed");
                Err(err)
            }
            Ok(()) => Ok(()),
        }
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

    /// Deletes every executor claim of the application (Stop, when the driver pod does not
    /// own them); returns how many the delete removed.
    pub async fn delete_claims(&self, namespace: &str, app_id: &str) -> Result<u32, kube::Error> {
        let lp = ListParams::default().labels(&app_selector(app_id));
        let api = self.api().namespaced::<PersistentVolumeClaim>(namespace);
        let answer = self
            .api()
            .policy()
            .run(|_| async {
                self.api().acquire().await?;
                api.delete_collection(&DeleteParams::default(), &lp).await
            })
            .await;
        match answer {
            Ok(either) => Ok(either.left().map_or(0, |list| {
                u32::try_from(list.items.len()).unwrap_or(u32::MAX)
            })),
            Err(err) => {
                tracing::warn!(namespace, app_id, error = %describe_error(&err), "executor claim delete failed");
                Err(err)
            }
        }
    }
}
