//! The injected clock: every time-dependent decision in this crate takes `now` from a [`Clock`].
//!
//! Time is a [`Duration`] since an arbitrary origin (the clock's own), so a fake clock can start
//! at zero and a simulation can run 40 s of traffic in a few milliseconds.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A monotonic time source.
pub trait Clock: Send + Sync + 'static {
    /// Time since this clock's origin; never goes backwards.
    fn now(&self) -> Duration;
}

/// The real clock: `CLOCK_MONOTONIC` through rustix (a vDSO call, ~20 ns, no syscall).
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        // CLOCK_MONOTONIC is never negative: both fields are >= 0 by the kernel's contract.
        Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        )
    }
}

/// A clock that moves only when told to: for tests, benches and the simulation.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock at `start`.
    pub fn new(start: Duration) -> Self {
        let clock = Self::default();
        clock.set(start);
        clock
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(as_nanos(by), Ordering::Relaxed);
    }

    /// Sets the clock to `to` (callers keep it monotonic).
    pub fn set(&self, to: Duration) {
        self.nanos.store(as_nanos(to), Ordering::Relaxed);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

impl<C: Clock> Clock for Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
}

/// Nanoseconds of `d`, saturating (584 years of uptime before it matters).
pub(crate) fn as_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
