//! The two lifecycle signals of a running service, after kubert's `initialized` and
//! `shutdown` modules: readiness from initialization handles ([`Initialize`],
//! [`InitJoiner`], [`Ready`]) and a drain signal ([`drain`]). They are plain primitives;
//! the [`crate::runtime`] owns them and hands them to the parts (the watches release
//! their handles, the gRPC server only waits on them).
use tokio::sync::{mpsc, watch};

/// Collects initialization handles; the service is ready once every handle is dropped.
#[derive(Debug)]
pub struct Initialize {
    /// Each handle holds a clone; `recv` answers `None` once all are gone.
    tx: mpsc::Sender<std::convert::Infallible>,
    rx: mpsc::Receiver<std::convert::Infallible>,
}

/// One part's initialization, under way until this handle is dropped.
#[derive(Debug)]
#[must_use = "the service is ready once this handle is dropped"]
pub struct InitHandle(#[allow(dead_code)] mpsc::Sender<std::convert::Infallible>);

/// Joins an initialization while it is under way ([`Initialize::joiner`]). Once every
/// handle is dropped (after [`Initialize::into_ready`]) it joins nothing: a service that
/// became ready stays ready, whatever starts later.
#[derive(Debug, Clone)]
pub struct InitJoiner(mpsc::WeakSender<std::convert::Infallible>);

impl InitJoiner {
    /// A handle that holds readiness back until it is dropped; `None` once the service is
    /// ready.
    pub fn join(&self) -> Option<InitHandle> {
        self.0.upgrade().map(InitHandle)
    }
}

impl Default for Initialize {
    fn default() -> Self {
        Self::new()
    }
}

impl Initialize {
    /// No handle taken yet.
    pub fn new() -> Self {
        let (tx, rx) = mpsc::channel(1);
        Self { tx, rx }
    }

    /// A handle that holds readiness back until it is dropped.
    pub fn add_handle(&self) -> InitHandle {
        InitHandle(self.tx.clone())
    }

    /// Hands out handles for as long as the service is not ready, to parts that may start
    /// at any time (a namespace watch starts with its first application, before or after
    /// the service is ready).
    pub fn joiner(&self) -> InitJoiner {
        InitJoiner(self.tx.downgrade())
    }

    /// Takes no more handles; resolves once every handle taken is dropped.
    pub async fn initialized(self) {
        let Self { tx, mut rx } = self;
        drop(tx);
        // Nothing is ever sent: `None` means every sender (handle) is gone.
        let _ = rx.recv().await;
    }

    /// Takes no more handles; [`Ready`] turns ready once every handle taken is dropped
    /// (on a task of the current tokio runtime).
    pub fn into_ready(self) -> Ready {
        let (tx, rx) = watch::channel(false);
        tokio::spawn(async move {
            self.initialized().await;
            let _ = tx.send(true);
        });
        Ready(rx)
    }
}

/// Whether the service has initialized; cheap to clone, for whoever reports readiness.
#[derive(Debug, Clone)]
pub struct Ready(watch::Receiver<bool>);

impl Default for Ready {
    /// Ready from the start (nothing to wait for).
    fn default() -> Self {
        Self::now()
    }
}

impl Ready {
    /// Ready from the start.
    pub fn now() -> Self {
        Self(watch::channel(true).1)
    }

    /// True once initialized.
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once initialized; never if initialization was abandoned (its task ended
    /// without every handle dropped).
    pub async fn wait(mut self) {
        if self.0.wait_for(|ready| *ready).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// A drain signal and its watchers.
pub fn drain() -> (Drain, Draining) {
    let (tx, rx) = watch::channel(false);
    (Drain(tx), Draining(rx))
}

/// Tells every [`Draining`] that shutdown has begun.
#[derive(Debug)]
pub struct Drain(watch::Sender<bool>);

impl Drain {
    /// Begins the drain (again is harmless).
    pub fn signal(&self) {
        self.0.send_replace(true);
    }

    /// Another watcher of this signal.
    pub fn watcher(&self) -> Draining {
        Draining(self.0.subscribe())
    }
}

/// Resolves when the drain begins, or when its [`Drain`] is dropped (no one can signal
/// any more: the owner is gone, so the part should stop too).
#[derive(Debug, Clone)]
pub struct Draining(watch::Receiver<bool>);

impl Draining {
    /// Resolves once the drain began.
    pub async fn signaled(mut self) {
        let _ = self.0.wait_for(|draining| *draining).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::time::Duration;

    #[tokio::test]
    async fn ready_once_every_handle_is_dropped() {
        let init = Initialize::new();
        let first = init.add_handle();
        let second = init.add_handle();
        let ready = init.into_ready();
        let waiting = ready.clone().wait();
        tokio::pin!(waiting);
        drop(first);
        tokio::task::yield_now().await;
        assert!(!ready.is_ready());
        assert!((&mut waiting).now_or_never().is_none());
        drop(second);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("ready once the last handle is dropped");
        assert!(ready.is_ready());
    }

    #[tokio::test]
    async fn a_joiner_holds_readiness_back_until_ready_and_joins_nothing_after() {
        let init = Initialize::new();
        let joiner = init.joiner();
        let first = init.add_handle();
        let ready = init.into_ready();
        let joined = joiner.join().expect("joins while not ready");
        drop(first);
        tokio::task::yield_now().await;
        assert!(!ready.is_ready(), "the joined handle holds readiness back");
        drop(joined);
        tokio::time::timeout(Duration::from_secs(5), ready.clone().wait())
            .await
            .expect("ready once the joined handle is dropped");
        assert!(joiner.join().is_none(), "nothing joins a ready service");
    }

    #[tokio::test]
    async fn no_handle_is_ready_at_once() {
        Initialize::new().initialized().await;
        assert!(Ready::now().is_ready());
    }

    #[tokio::test]
    async fn draining_resolves_on_signal_or_when_the_drain_is_gone() {
        let (drain, draining) = drain();
        let mut waiting = Box::pin(draining.clone().signaled());
        assert!((&mut waiting).now_or_never().is_none());
        drain.signal();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("signaled");
        let (drain, draining) = super::drain();
        drop(drain);
        tokio::time::timeout(Duration::from_secs(5), draining.signaled())
            .await
            .expect("a dropped drain releases its watchers");
    }
}
