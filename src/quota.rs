//! Quotas: how many units per period, and how large a burst.
//!
//! A [`Quota`] reads as a rate: `Quota::per_second(100)` is 100 units per second, not one
//! unit every 100 seconds. Its burst (the bucket's capacity) defaults to the limit, so
//! `per_second(100)` lets a rested client send 100 requests at once; set it with
//! [`Quota::with_burst`]. Every constructor validates its input and returns a
//! [`ConfigError`] instead of panicking.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::Quota;
//!
//! let q = Quota::per_second(100)?.with_burst(200)?;
//! assert_eq!(q.emission_interval(), Duration::from_millis(10));
//! assert_eq!(q.burst(), 200);
//!
//! // "5 per 12 seconds": one unit every 2.4 s.
//! let slow = Quota::new(5, Duration::from_secs(12))?;
//! assert_eq!(slow.emission_interval(), Duration::from_millis(2400));
//!
//! assert!(Quota::per_second(0).is_err());
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

use std::time::Duration;

use crate::error::ConfigError;

/// The longest time horizon a bucket may span, in nanoseconds (2^62 ns, about 146 years).
/// Burst, queue and period together must fit in it, so time arithmetic never overflows.
pub(crate) const MAX_HORIZON: u64 = 1 << 62;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// A rate: `limit` units per `period`, with a burst capacity.
///
/// The emission interval `T = period / limit` is kept in whole nanoseconds, rounded down
/// (never stricter than the advertised rate; the error is below one part in 10^9 for any
/// rate of at most one unit per second). See the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quota {
    limit: u64,
    period: u64,
    interval: u64,
    burst: u64,
    burst_set: bool,
}

impl Quota {
    /// `limit` units per `period`. Burst defaults to `limit`.
    pub fn new(limit: u64, period: Duration) -> Result<Self, ConfigError> {
        if limit == 0 {
            return Err(ConfigError::ZeroLimit);
        }
        let period_ns = period.as_nanos();
        if period_ns == 0 {
            return Err(ConfigError::ZeroPeriod);
        }
        if period_ns > u128::from(MAX_HORIZON) {
            return Err(ConfigError::Overflow("period"));
        }
        let period_ns = period_ns as u64;
        let interval = period_ns / limit;
        if interval == 0 {
            return Err(ConfigError::IntervalBelowResolution { limit, period });
        }
        let q = Quota {
            limit,
            period: period_ns,
            interval,
            burst: limit,
            burst_set: false,
        };
        q.check_horizon()?;
        Ok(q)
    }

    /// `limit` units per second.
    pub fn per_second(limit: u64) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(1))
    }

    /// `limit` units per minute.
    pub fn per_minute(limit: u64) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(60))
    }

    /// `limit` units per hour.
    pub fn per_hour(limit: u64) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(3600))
    }

    /// `limit` units per day.
    pub fn per_day(limit: u64) -> Result<Self, ConfigError> {
        Self::new(limit, Duration::from_secs(86_400))
    }

    /// One unit every `interval`.
    pub fn every(interval: Duration) -> Result<Self, ConfigError> {
        Self::new(1, interval)
    }

    /// Sets the burst: how many units a rested client may spend at once.
    pub fn with_burst(self, burst: u64) -> Result<Self, ConfigError> {
        if burst == 0 {
            return Err(ConfigError::ZeroBurst);
        }
        let q = Quota {
            burst,
            burst_set: true,
            ..self
        };
        q.check_horizon()?;
        Ok(q)
    }

    /// Checks that `(burst + 1) * T` fits in `MAX_HORIZON` (the queue's room is checked
    /// where a queue is configured, in `Limit::new`).
    pub(crate) fn check_horizon(&self) -> Result<(), ConfigError> {
        match self
            .burst
            .checked_add(1)
            .and_then(|units| units.checked_mul(self.interval))
        {
            Some(h) if h <= MAX_HORIZON => Ok(()),
            _ => Err(ConfigError::Overflow("burst * emission interval")),
        }
    }

    /// Units per period.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period.
    pub fn period(&self) -> Duration {
        Duration::from_nanos(self.period)
    }

    /// The burst (bucket capacity), in units.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether the burst was set explicitly with [`Quota::with_burst`].
    pub fn burst_is_set(&self) -> bool {
        self.burst_set
    }

    /// The emission interval `T = period / limit`, in whole nanoseconds.
    pub fn emission_interval(&self) -> Duration {
        Duration::from_nanos(self.interval)
    }

    pub(crate) fn interval_ns(&self) -> u64 {
        self.interval
    }

    pub(crate) fn period_ns(&self) -> u64 {
        self.period
    }

    /// A short human name such as `100-per-1s` or `10000-per-1d`, used as the default
    /// policy name in `RateLimit` headers.
    pub fn default_name(&self) -> String {
        const UNITS: [(u64, &str); 5] = [
            (86_400 * NANOS_PER_SEC, "d"),
            (3600 * NANOS_PER_SEC, "h"),
            (60 * NANOS_PER_SEC, "m"),
            (NANOS_PER_SEC, "s"),
            (1_000_000, "ms"),
        ];
        let p = self.period;
        let unit = UNITS
            .iter()
            .find(|(n, _)| p.is_multiple_of(*n))
            .map_or_else(|| format!("{p}ns"), |(n, u)| format!("{}{u}", p / n));
        format!("{}-per-{}", self.limit, unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_rates() {
        let q = Quota::per_second(100).unwrap();
        assert_eq!(q.emission_interval(), Duration::from_millis(10));
        assert_eq!(q.burst(), 100);
        assert_eq!(
            Quota::per_minute(60).unwrap().emission_interval(),
            Duration::from_secs(1)
        );
        assert_eq!(
            Quota::per_hour(1).unwrap().emission_interval(),
            Duration::from_secs(3600)
        );
        assert_eq!(
            Quota::per_day(10_000).unwrap().default_name(),
            "10000-per-1d"
        );
        assert_eq!(Quota::every(Duration::from_millis(250)).unwrap().limit(), 1);
    }

    #[test]
    fn interval_rounds_down() {
        let q = Quota::per_second(3).unwrap();
        assert_eq!(q.interval_ns(), 333_333_333);
    }
}
