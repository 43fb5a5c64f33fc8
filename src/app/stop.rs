//! Stop: an application's executor pods, claims, registration and id record deleted, and
//! the application forgotten.
use std::collections::BTreeSet;

use super::error::AppError;
use super::registry::Applications;
use super::types::AppId;
use crate::metrics::DeleteReason;

impl Applications {
    /// Deletes every executor pod of the application, then its registration and its id
    /// record's ConfigMap, and forgets it; returns the pods this delete deleted (not those
    /// already terminating).
    pub async fn stop(&self, app: &AppId) -> Result<u32, AppError> {
        self.check_running()?;
        let _shared = self.inner.lifecycle.read().await;
        let _serial = self.lock_app(app).await;
        let Some((namespace, actor, id_record)) = self.entry(app) else {
            return Err(self.not_here(app));
        };
        let delete_claims = self
            .apps()
            .get(app)
            .is_some_and(|e| e.first_start.stop_deletes_claims());
        let fence = self.fence(&namespace).await?;
        if let Some(actor) = actor {
            // The actor ends first, so no create of it can follow the delete.
            actor.stop().await;
        }
        let pods = (self.inner.pods)
            .for_application(&namespace, app.as_str())
            .fenced(fence.clone());
        let deleted = async {
            // The executor pods' uids, before they go: the application's claims are those
            // owned by one of them.
            let owners: BTreeSet<String> = if delete_claims {
                (pods
                    .list_executors(&namespace, app.as_str())
                    .await?
                    .into_iter())
                .filter_map(|pod| pod.metadata.uid)
                .collect()
            } else {
                BTreeSet::new()
            };
            let deleted = pods.delete_all(&namespace, app.as_str()).await?;
            // Claims the driver does not own go with the application, as Spark's clean-up
            // deletes them (a driver-owned one goes with the driver pod).
            if delete_claims {
                let claims = pods
                    .delete_claims(&namespace, app.as_str(), &owners)
                    .await?;
                tracing::info!(%app, claims, "executor claims deleted");
            }
            Ok::<u32, kube::Error>(deleted)
        }
        .await;
        let deleted = match deleted {
            // The records go only once no pod holds an id.
            Ok(deleted) => match (self.inner.registrations)
                .fenced(fence)
                .delete(&namespace, app.as_str())
                .await
            {
                Ok(()) => id_record
                    .delete(pods.api(), &namespace)
                    .await
                    .map(|()| deleted),
                Err(err) => Err(err),
            },
            Err(err) => Err(err),
        };
        match deleted {
            Ok(deleted) => {
                self.inner
                    .ctx
                    .metrics
                    .pods_deleted(DeleteReason::Stop, u64::from(deleted));
                {
                    let mut apps = self.apps();
                    apps.remove(app);
                    self.inner.ctx.metrics.set_active_applications(apps.len());
                }
                tracing::info!(%app, %namespace, deleted, "application stopped");
                Ok(deleted)
            }
            Err(err) => {
                // Keep it registered without an actor: a retried Stop deletes again.
                if let Some(entry) = self.apps().get_mut(app) {
                    entry.actor = None;
                }
                Err(AppError::Kubernetes(err))
            }
        }
    }
}
