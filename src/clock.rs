//! Clocks: where the in-memory store reads "now".
//!
//! Decisions use monotonic time in whole nanoseconds since the clock's own epoch, never
//! wall-clock time, so a system clock jump cannot grant or deny anything. Three clocks:
//!
//! - [`MonotonicClock`], the default: the CPU's invariant time-stamp counter, scaled to
//!   nanoseconds (through [`quanta`], as `governor` does), or the OS monotonic clock
//!   (`std::time::Instant`'s source) where the CPU has no usable counter.
//! - [`ManualClock`]: moved by hand, for tests that reproduce decisions exactly.
//! - [`TokioClock`]: follows tokio's clock, so `#[tokio::test(start_paused = true)]` and
//!   `tokio::time::advance` drive the limiter and the delay queue's timers together.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::{Clock, ManualClock};
//!
//! let clock = ManualClock::new();
//! let handle = clock.clone(); // clones share one time
//! handle.advance(Duration::from_millis(5));
//! assert_eq!(clock.now(), 5_000_000);
//! ```

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

/// A source of monotonic time in nanoseconds. See the [module docs](self).
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's epoch. Never decreases.
    fn now(&self) -> u64;
}

/// The process-wide counter source, calibrated once.
static SOURCE: OnceLock<quanta::Clock> = OnceLock::new();

/// The default clock: monotonic nanoseconds since its construction. See the
/// [module docs](self).
///
/// On x86-64 with an invariant TSC (and on AArch64) it reads the CPU's counter and scales
/// it to nanoseconds, which costs a fraction of a `clock_gettime` call (see
/// `BENCHMARKS.md`); elsewhere it reads the OS monotonic clock. Either way it never goes
/// backwards. The first clock built in a process calibrates the counter against the OS
/// clock, a busy loop of 0.5 ms to at most 200 ms; later ones are free.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    source: &'static quanta::Clock,
    start: u64,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        let source = SOURCE.get_or_init(quanta::Clock::new);
        MonotonicClock {
            source,
            start: source.raw(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> u64 {
        // Zero for a reading at or before the epoch; scaling is monotonic.
        self.source.delta_as_nanos(self.start, self.source.raw())
    }
}

/// A clock moved by hand. Clones share one time. See the [module docs](self).
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the time in nanoseconds. Going backwards is refused (ignored): the clock is
    /// monotonic.
    pub fn set(&self, nanos: u64) {
        self.now.fetch_max(nanos, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    #[inline]
    fn now(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// Follows `tokio::time::Instant`, including paused and advanced test time. Outside a
/// runtime it reads the system's monotonic clock. See the [module docs](self).
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    start: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        TokioClock {
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }
}

impl<C: Clock> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}
