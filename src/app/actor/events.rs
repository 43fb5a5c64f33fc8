//! Pod events into the actor: its executors' into the engine state and the feed, its
//! driver pod's into the application's life.
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::serve::ApplicationActor;
use crate::allocator::executor_pod_from;
use crate::k8s::{Listed, PodEvent};

impl ApplicationActor {
    /// One pod event of the namespace's watch.
    pub(super) fn ingest(&mut self, event: PodEvent) {
        match event {
            PodEvent::Applied(pod) => self.pod_applied(&pod),
            PodEvent::Deleted(pod) => self.pod_deleted(&pod),
            PodEvent::Driver(pod) => self.driver_changed(&pod),
            PodEvent::DriverDeleted => self.driver_ended("Deleted", Duration::ZERO),
            PodEvent::Resync(pods) => self.relisted(pods),
        }
    }

    /// An executor pod added or changed.
    fn pod_applied(&mut self, pod: &Pod) {
        if let Some(executor) = self.feed.applied(pod, &self.engine.rules) {
            self.failures.observe(pod, &executor, self.clock.now());
            self.requests.seen(&executor);
        }
    }

    /// An executor pod gone from the cluster.
    fn pod_deleted(&mut self, pod: &Pod) {
        if let Some(id) = self.feed.deleted(pod, &self.engine.rules) {
            self.reclaim_pod_gone(id);
            self.failures.pod_gone(id);
            self.requests.forget(id);
            self.engine.allocator.pod_gone(id);
        }
    }

    /// The driver pod changed: its phase, and its end when it Failed or Succeeded.
    fn driver_changed(&mut self, pod: &Pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let ended = phase.clone();
        if let Some(grace) = self.life.driver_seen(phase)
            && let Some(phase) = ended
        {
            self.driver_ended(&phase, grace);
        }
    }

    /// The driver pod ended (`phase`): no round runs any more, creates not sent yet are
    /// skipped, every executor pod is deleted (delete-on-termination), and the application
    /// is forgotten after `grace`.
    fn driver_ended(&mut self, phase: &str, grace: Duration) {
        let now = self.clock.now();
        let delete = self.engine.allocator.settings().delete_on_termination;
        if !self.life.driver_ended(phase, grace, now, delete) {
            return;
        }
        self.outbox.cancel_creates();
        let driver = self.life.driver.as_ref().map(|d| d.pod_name.as_str());
        tracing::warn!(
            driver,
            phase,
            delete_executors = delete,
            grace_ms = grace.as_millis(),
            "driver pod ended: no new executors; the application is forgotten after the grace period"
        );
    }

    /// A full listing of the application's executor pods: unchanged executors stay as
    /// they are, changed ones replace theirs, and those not listed are gone.
    fn relisted(&mut self, pods: Vec<Listed>) {
        let rules = &self.engine.rules;
        let now = self.clock.now();
        for listed in &pods {
            if let Listed::Changed(pod) = listed
                && let Some(executor) = executor_pod_from(pod, rules)
            {
                self.failures.observe(pod, &executor, now);
                self.requests.seen(&executor);
            }
        }
        let gone = self.feed.relisted(&pods, rules, now);
        for id in gone {
            self.reclaim_pod_gone(id);
            self.failures.pod_gone(id);
            self.engine.allocator.pod_gone(id);
        }
    }
}
