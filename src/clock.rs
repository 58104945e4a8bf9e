//! Clocks: where a store reads "now".
//!
//! Time is whole nanoseconds since the Unix epoch (UTC), so windows line up with calendar
//! time on every store: a day window starts at 00:00 UTC in memory exactly as on Redis,
//! whose scripts read the server's `TIME`. Each clock reads the wall clock once, when it is
//! built, and from then on advances with a monotonic source, so a system clock jump later
//! on cannot grant or deny anything.
//!
//! - The default of every store (`TokioClock`, used without naming it): follows
//!   `tokio::time::Instant`, so
//!   `#[tokio::test(start_paused = true)]` and `tokio::time::advance` drive the limiter and
//!   the delay queue's timers together (outside a runtime it reads the OS monotonic clock).
//! - [`ManualClock`]: moved by hand, for tests and simulations that reproduce decisions
//!   exactly. It starts at the Unix epoch unless built with [`ManualClock::at`].
//! - `TscClock` (feature `tsc`): the CPU's invariant time-stamp counter scaled to
//!   nanoseconds (through `quanta`, as `governor` does). It ignores tokio's paused time;
//!   choose it explicitly when the few nanoseconds it saves per decision matter more.
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
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A source of time in nanoseconds since the Unix epoch. See the [module docs](self).
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since the Unix epoch. Never decreases.
    fn now(&self) -> u64;
}

/// Nanoseconds since the Unix epoch by the system's wall clock (0 before 1970).
fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A clock moved by hand. Clones share one time. See the [module docs](self).
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock at the Unix epoch (time zero).
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at `since_epoch` past the Unix epoch, e.g. a realistic date for a
    /// simulation with day windows.
    pub fn at(since_epoch: Duration) -> Self {
        let clock = Self::new();
        clock.set(since_epoch.as_nanos() as u64);
        clock
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.now.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Sets the time in nanoseconds since the Unix epoch. Going backwards is refused
    /// (ignored): the clock is monotonic.
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

pub(crate) use self::tokio_clock::TokioClock;

/// The default clock, in a module of its own: stores use it when given no other, and no
/// user needs to name it.
mod tokio_clock {
    use super::{unix_now, Clock};

    /// Follows `tokio::time::Instant`, including paused and advanced test time, from the Unix
    /// time read when it was built. Outside a runtime it reads the OS monotonic clock. The
    /// default clock of every store. See the [module docs](super).
    #[derive(Clone, Copy, Debug)]
    pub struct TokioClock {
        start: tokio::time::Instant,
        unix_at_start: u64,
    }

    impl TokioClock {
        /// A clock reading the wall clock now, then advancing with tokio's clock.
        pub fn new() -> Self {
            TokioClock {
                start: tokio::time::Instant::now(),
                unix_at_start: unix_now(),
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
            self.unix_at_start + self.start.elapsed().as_nanos() as u64
        }
    }
}

#[cfg(feature = "tsc")]
mod tsc {
    use std::sync::OnceLock;

    use super::{unix_now, Clock};

    /// The process-wide counter source, calibrated once.
    static SOURCE: OnceLock<quanta::Clock> = OnceLock::new();

    /// The CPU's time-stamp counter (feature `tsc`). See the [module docs](super).
    ///
    /// On x86-64 with an invariant TSC (and on AArch64) it reads the CPU's counter and
    /// scales it to nanoseconds, which costs a fraction of a `clock_gettime` call;
    /// elsewhere it reads the OS monotonic clock. It does not follow tokio's paused time.
    /// The first clock built in a process calibrates the counter against the OS clock, a
    /// busy loop of 0.5 ms to at most 200 ms; later ones are free.
    #[derive(Clone, Copy, Debug)]
    pub struct TscClock {
        source: &'static quanta::Clock,
        start: u64,
        unix_at_start: u64,
    }

    impl TscClock {
        /// A clock reading the wall clock now, then advancing with the counter.
        pub fn new() -> Self {
            let source = SOURCE.get_or_init(quanta::Clock::new);
            TscClock {
                source,
                start: source.raw(),
                unix_at_start: unix_now(),
            }
        }
    }

    impl Default for TscClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Clock for TscClock {
        #[inline]
        fn now(&self) -> u64 {
            // Scaling is monotonic; a reading at or before the start is the start.
            self.unix_at_start + self.source.delta_as_nanos(self.start, self.source.raw())
        }
    }
}

#[cfg(feature = "tsc")]
pub use tsc::TscClock;

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_clock_reads_unix_time() {
        let before = unix_now();
        let now = TokioClock::new().now();
        assert!(now >= before && now - before < 60_000_000_000);
    }

    #[test]
    fn manual_clock_starts_where_told_and_never_goes_back() {
        let c = ManualClock::at(Duration::from_secs(86_400));
        assert_eq!(c.now(), 86_400_000_000_000);
        c.set(5);
        assert_eq!(c.now(), 86_400_000_000_000);
    }
}
