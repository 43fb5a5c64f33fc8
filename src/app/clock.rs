//! The clock injected into application actors: the system clock in service, a manual
//! clock in tests (time moves only when the test advances it).
use crate::allocator::Timestamp;

/// Time source of the actors.
pub trait Clock: Send + Sync + 'static {
    /// Now, as wall-clock milliseconds.
    fn now(&self) -> Timestamp;
    /// Resolves once `now() >= deadline`.
    fn sleep_until(
        &self,
        deadline: Timestamp,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;
}

/// The real clock.
#[derive(Debug, Clone, Default)]
pub struct SystemClock;

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock {}
