//! The application's life as its actor follows it: one [`Phase`] instead of flags, so each
//! turn of the loop asks one question (which phase?) and each phase says what is left to do.
use std::time::Duration;

use super::command::DriverReport;
use super::parts::{DriverLife, ForgetHook};
use crate::allocator::Timestamp;

/// Where the application is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Phase {
    /// Rounds run. The driver pod's phase as last seen, if any.
    Running { driver_phase: Option<String> },
    /// The driver pod ended: no round runs any more; the executor pods are deleted when
    /// their clean-up is due, and the application is forgotten at `forget_at`.
    Ended(Ended),
    /// Stopped, or forgotten once its driver ended (`forget`): the actor only waits for
    /// the work in flight, then ends.
    Ending { forget: bool },
}

/// The end of the driver pod as the actor saw it, and what is left to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ended {
    /// The driver pod's last phase (`Failed`, `Succeeded`, or `Deleted`).
    pub phase: String,
    pub at: Timestamp,
    pub forget_at: Timestamp,
    /// When the delete of every executor pod is due (delete-on-termination); `None` once
    /// sent, or when the executors are kept.
    pub cleanup_due: Option<Timestamp>,
}

/// The driver's life: its pod, the phase, and the hook that forgets the application.
pub(super) struct Life {
    /// The driver pod, when Start named one.
    pub driver: Option<DriverLife>,
    pub phase: Phase,
    /// Forgets the application once its driver ended and the grace period passed.
    forget: Option<ForgetHook>,
}

impl Life {
    pub fn new(driver: Option<DriverLife>, forget: ForgetHook) -> Self {
        Self {
            driver,
            phase: Phase::Running { driver_phase: None },
            forget: Some(forget),
        }
    }

    /// The driver pod's phase as seen in a pod event; returns the grace period when this
    /// is its end (Failed or Succeeded) and a driver pod is followed.
    pub fn driver_seen(&mut self, phase: Option<String>) -> Option<Duration> {
        let ending = phase
            .as_deref()
            .is_some_and(|p| matches!(p, "Failed" | "Succeeded"));
        let grace = self.driver.as_ref().map(|d| d.grace).filter(|_| ending);
        if grace.is_none()
            && let Phase::Running { driver_phase } = &mut self.phase
        {
            *driver_phase = phase;
        }
        grace
    }

    /// The driver pod ended (`phase`) at `now`. Returns whether this is its first end
    /// (then creates not sent yet are to be skipped); a later one (deleted after it
    /// failed) only brings forgetting forward.
    pub fn driver_ended(
        &mut self,
        phase: &str,
        grace: Duration,
        now: Timestamp,
        delete_executors: bool,
    ) -> bool {
        match &mut self.phase {
            Phase::Ended(ended) => {
                ended.forget_at = ended.forget_at.min(now.plus(grace));
                false
            }
            Phase::Ending { .. } => false,
            Phase::Running { .. } => {
                self.phase = Phase::Ended(Ended {
                    phase: phase.to_string(),
                    at: now,
                    forget_at: now.plus(grace),
                    cleanup_due: delete_executors.then_some(now),
                });
                true
            }
        }
    }

    /// The actor ends once its work in flight is answered.
    pub fn end(&mut self, forget: bool) {
        self.phase = Phase::Ending { forget };
    }

    /// The forget hook, once, when the actor ended because its driver ended.
    pub fn take_forget(&mut self) -> Option<ForgetHook> {
        match self.phase {
            Phase::Ending { forget: true } => self.forget.take(),
            _ => None,
        }
    }

    /// The driver pod's life for GetStatus (`None` without a driver pod).
    pub fn driver_report(&self) -> Option<DriverReport> {
        let driver = self.driver.as_ref()?;
        let (phase, ended) = match &self.phase {
            Phase::Running { driver_phase } => (driver_phase.clone(), None),
            Phase::Ended(ended) => (Some(ended.phase.clone()), Some(ended)),
            Phase::Ending { .. } => (None, None),
        };
        Some(DriverReport {
            pod_name: driver.pod_name.clone(),
            phase,
            ended_at: ended.map(|e| e.at),
            forget_at: ended.map(|e| e.forget_at),
        })
    }
}
