//! Clocks: where a store reads "now".
//!
//! Time is whole nanoseconds since the Unix epoch (UTC), so windows line up with calendar
//! time on every store: a day window starts at 00:00 UTC in memory exactly as on Redis,
//! whose scripts read the server's `TIME`. Each clock reads the wall clock once, when it is
//! built, and from then on advances with a monotonic source, so a system clock jump later
//! on cannot grant or deny anything.
//!
//! - The default of every store (used without naming it): follows tokio's clock, so
//!   `#[tokio::test(start_paused = true)]` and `tokio::time::advance` drive the limiter and
//!   the delay queue's timers together. Only a build whose tokio has its `test-util`
//!   feature (what a test enables to pause time) can pause it; in any other build tokio's
//!   clock is the OS monotonic clock, and the default reads the CPU's time-stamp counter
//!   instead, as `TscClock` does: the same time at a third of the cost of a
//!   `clock_gettime` call (`BENCHMARKS.md`). Which one is settled when the crate is
//!   compiled, so reading it costs no test.
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
    use super::{tsc::TscClock, unix_now, Clock};

    /// Follows tokio's clock, from the Unix time read when it was built: tokio's own
    /// `Instant` (paused and advanced test time included) where tokio can pause, else the
    /// CPU's counter. The default clock of every store. See the [module docs](super).
    #[derive(Clone, Copy, Debug)]
    pub struct TokioClock(Source);

    impl Default for TokioClock {
        fn default() -> Self {
            Self::new()
        }
    }

    #[derive(Clone, Copy, Debug)]
    enum Source {
        /// tokio's `Instant` (outside a runtime, the OS monotonic clock).
        Tokio {
            start: tokio::time::Instant,
            unix_at_start: u64,
        },
        /// The counter: what tokio's clock reads, when it cannot be paused, for less.
        Counter(TscClock),
    }

    impl TokioClock {
        /// A clock reading the wall clock now, then advancing with tokio's clock.
        pub fn new() -> Self {
            TokioClock(if pause::PAUSABLE {
                Source::Tokio {
                    start: tokio::time::Instant::now(),
                    unix_at_start: unix_now(),
                }
            } else {
                Source::Counter(TscClock::new())
            })
        }

        /// Whether the clock reads tokio's `Instant` (it can be paused).
        #[cfg(test)]
        pub(crate) fn follows_paused_time(&self) -> bool {
            matches!(self.0, Source::Tokio { .. })
        }
    }

    impl Clock for TokioClock {
        #[inline]
        fn now(&self) -> u64 {
            match &self.0 {
                Source::Counter(counter) => counter.now(),
                Source::Tokio {
                    start,
                    unix_at_start,
                } => unix_at_start + start.elapsed().as_nanos() as u64,
            }
        }
    }

    /// Whether this build's tokio can pause time: whether it has its `test-util` feature,
    /// which cargo enables in a test build when the tests' tokio asks for it. That
    /// feature adds the inherent `Builder::start_paused`; without it, the path
    /// `Builder::start_paused` falls back on the method of the trait below, whose return
    /// type says so.
    mod pause {
        use tokio::runtime::Builder;

        /// What the fallback `start_paused` returns.
        pub(super) struct Absent;

        /// The fallback, used only when tokio has no `start_paused` of its own.
        #[allow(dead_code)]
        trait StartPaused {
            fn start_paused(&mut self, _: bool) -> Absent {
                Absent
            }
        }

        impl StartPaused for Builder {}

        /// Whether a `start_paused` returning `Self` is tokio's own.
        pub(super) trait Pausable {
            const PAUSABLE: bool;
        }

        impl Pausable for Absent {
            const PAUSABLE: bool = false;
        }

        impl Pausable for &'static mut Builder {
            const PAUSABLE: bool = true;
        }

        const fn pausable<F, R>(_: &F) -> bool
        where
            F: FnOnce(&'static mut Builder, bool) -> R,
            R: Pausable,
        {
            R::PAUSABLE
        }

        /// Whether tokio's clock can be paused in this build.
        pub(super) const PAUSABLE: bool = pausable(&Builder::start_paused);
    }
}

// The counter clock: the default clock reads it in builds where tokio cannot pause; public
// as `TscClock` with the `tsc` feature.
#[cfg_attr(not(feature = "tsc"), allow(unreachable_pub, dead_code))]
mod tsc {
    use std::sync::OnceLock;

    use super::{unix_now, Clock};

    /// The process-wide counter source, calibrated once, and its scale: nanoseconds per
    /// 2^32 counts.
    static SOURCE: OnceLock<(quanta::Clock, u64)> = OnceLock::new();

    /// The counter and its scale, as one multiplication and a shift: quanta's own scaling
    /// (`delta_as_nanos`) is a multiplication by a factor and a shift by a count read per
    /// call; read once, they give the nanoseconds of 2^32 counts, the same to within a
    /// part in a billion. Where quanta reads the OS clock instead of a counter, its raw
    /// readings are nanoseconds and the scale is 2^32.
    pub(super) fn source() -> &'static (quanta::Clock, u64) {
        SOURCE.get_or_init(|| {
            let clock = quanta::Clock::new();
            let scale = clock.delta_as_nanos(0, 1 << 32);
            (clock, scale)
        })
    }

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
        /// Nanoseconds per 2^32 counts.
        scale: u64,
        start: u64,
        unix_at_start: u64,
    }

    impl Default for TscClock {
        fn default() -> Self {
            Self::new()
        }
    }

    impl TscClock {
        /// A clock reading the wall clock now, then advancing with the counter.
        pub fn new() -> Self {
            let (source, scale) = source();
            TscClock {
                source,
                scale: *scale,
                start: source.raw(),
                unix_at_start: unix_now(),
            }
        }
    }

    impl Clock for TscClock {
        #[inline]
        fn now(&self) -> u64 {
            // Scaling is monotonic; a reading at or before the start is the start.
            let counts = self.source.raw().saturating_sub(self.start);
            self.unix_at_start + ((u128::from(counts) * u128::from(self.scale)) >> 32) as u64
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

    /// Tests build tokio with `test-util`, so the default clock must read tokio's
    /// `Instant` there (the benchmarks, built without it, read the counter).
    #[test]
    fn default_clock_follows_tokio_where_time_can_pause() {
        assert!(TokioClock::new().follows_paused_time());
    }

    #[test]
    fn default_clock_reads_unix_time() {
        let before = unix_now();
        let now = TokioClock::new().now();
        assert!(now >= before && now - before < 60_000_000_000);
    }

    /// The counter clock's one multiplication scales as quanta does, to within a part in
    /// a billion (plus a nanosecond of rounding).
    #[test]
    fn counter_clock_scales_as_quanta() {
        let (source, scale) = tsc::source();
        let start = source.raw();
        std::thread::sleep(Duration::from_millis(20));
        let end = source.raw();
        let ours = ((u128::from(end - start) * u128::from(*scale)) >> 32) as u64;
        let quanta = source.delta_as_nanos(start, end);
        assert!(
            ours.abs_diff(quanta) <= 1 + quanta / 1_000_000_000,
            "{ours} vs {quanta}"
        );
    }

    #[test]
    fn manual_clock_starts_where_told_and_never_goes_back() {
        let c = ManualClock::at(Duration::from_secs(86_400));
        assert_eq!(c.now(), 86_400_000_000_000);
        c.set(5);
        assert_eq!(c.now(), 86_400_000_000_000);
    }
}
