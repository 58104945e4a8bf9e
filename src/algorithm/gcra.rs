//! GCRA: one theoretical arrival time (TAT) per key.
//!
//! Token bucket, strict leaky meter and leaky-bucket queue are one function with different
//! parameters (see `REFERENCE.md`): a request of cost `n` at `now` moves the TAT to
//! `new_tat = max(tat, now) + n*T` and is admitted iff `new_tat - now <= cap`, where
//! `cap = tau + T` (+ `queue * T` for a queue). An admitted request waits
//! `new_tat - now - free` where `free = tau + T + nodelay * T` (zero when negative).

use crate::decision::{LimitReport, Outcome};

/// Precomputed GCRA parameters, all in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Gcra {
    /// Emission interval `T`.
    pub(crate) t: u64,
    /// Burst tolerance `tau = (burst - 1) * T`.
    pub(crate) tau: u64,
    /// Largest admissible `new_tat - now`.
    pub(crate) cap: u64,
    /// Largest `new_tat - now` served without a wait.
    pub(crate) free: u64,
}

impl Gcra {
    /// Evaluates a request. Returns the outcome, the new TAT to store when admitted, and
    /// the report.
    #[inline]
    pub(crate) fn eval(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
    ) -> (Outcome, Option<u64>, LimitReport) {
        let base = tat.max(now);
        let inc = match cost.checked_mul(self.t) {
            Some(inc) if inc <= self.cap => inc,
            _ => return (Outcome::Exceeds, None, self.report(base - now, false)),
        };
        let new_tat = base + inc;
        let diff = new_tat - now;
        if diff <= self.cap {
            let wait = diff.saturating_sub(self.free);
            (
                Outcome::Allowed {
                    wait: std::time::Duration::from_nanos(wait),
                },
                Some(new_tat),
                self.report(diff, true),
            )
        } else {
            (
                Outcome::Denied {
                    retry_after: std::time::Duration::from_nanos(diff - self.cap),
                },
                None,
                self.report(base - now, false),
            )
        }
    }

    /// The report for a bucket whose TAT is `fill` ahead of now.
    #[inline]
    fn report(&self, fill: u64, allowed: bool) -> LimitReport {
        let room = self.tau + self.t;
        let remaining = room.saturating_sub(fill) / self.t;
        let next_after = if fill == 0 {
            0
        } else {
            // remaining < burst whenever fill > 0, so (remaining + 1) * T <= room.
            fill - (room - (remaining + 1) * self.t)
        };
        LimitReport {
            index: 0,
            allowed,
            remaining,
            reset_after: fill,
            next_after,
        }
    }

    /// Gives back `cost` units (a queued request that was dropped before its slot).
    pub(crate) fn refund(&self, tat: u64, cost: u64) -> u64 {
        tat.saturating_sub(cost.saturating_mul(self.t))
    }
}
