//! GCRA: one theoretical arrival time (TAT) per key.
//!
//! Token bucket, strict leaky meter and leaky-bucket queue are one function with different
//! parameters: a request of cost `n` at `now` moves the TAT to
//! `new_tat = max(tat, now) + n*T` and is admitted iff `new_tat - now <= cap`, where
//! `cap = tau + T` (+ `queue * T` for a queue). An admitted request waits
//! `new_tat - now - free` where `free = tau + T + nodelay * T` (zero when negative).
//!
//! A cost of zero spends nothing and waits for nothing: it is admitted at once, even
//! behind a queue's backlog or on a state in debt, and only reports the state.

use std::sync::atomic::{AtomicU64, Ordering};

use super::div::Divisor;
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
    /// Division by `t`, for the report's `remaining`.
    div: Divisor,
    /// `cap / t`: the most units one request can take.
    most: u64,
}

/// One evaluation step, before anything is written: either the TAT to store (and the
/// resulting `new_tat - now`), or a refusal with how full the bucket is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Step {
    /// Admitted once `new_tat` is stored.
    Admit { new_tat: u64, diff: u64 },
    /// Refused (`Denied` or `Exceeds`); `fill` is `max(tat, now) - now`.
    Refuse { outcome: Outcome, fill: u64 },
}

impl Gcra {
    /// The parameters, all in nanoseconds (`t >= 1`).
    pub(crate) const fn new(t: u64, tau: u64, cap: u64, free: u64) -> Self {
        Gcra {
            t,
            tau,
            cap,
            free,
            div: Divisor::new(t),
            most: cap / t,
        }
    }

    /// Evaluates a request. Returns the outcome, the new TAT to store when admitted, and
    /// the report.
    #[inline]
    pub(crate) fn eval(
        &self,
        tat: u64,
        now: u64,
        cost: u64,
    ) -> (Outcome, Option<u64>, LimitReport) {
        if cost == 0 {
            let (outcome, report) = self.probe(tat, now);
            return (outcome, Some(tat), report);
        }
        match self.step(tat, now, cost) {
            Step::Admit { new_tat, diff } => {
                let (outcome, report) = self.admitted(diff);
                (outcome, Some(new_tat), report)
            }
            Step::Refuse { outcome, fill } => (outcome, None, self.report(fill, false)),
        }
    }

    /// The decision function proper; see the module docs.
    #[inline]
    pub(crate) fn step(&self, tat: u64, now: u64, cost: u64) -> Step {
        let base = tat.max(now);
        let inc = match cost.checked_mul(self.t) {
            Some(inc) if inc <= self.cap => inc,
            _ => {
                return Step::Refuse {
                    outcome: Outcome::Exceeds,
                    fill: base - now,
                }
            }
        };
        let new_tat = base + inc;
        let diff = new_tat - now;
        if diff <= self.cap {
            Step::Admit { new_tat, diff }
        } else {
            Step::Refuse {
                outcome: Outcome::Denied {
                    retry_after: std::time::Duration::from_nanos(diff - self.cap),
                },
                fill: base - now,
            }
        }
    }

    /// A request of cost zero: admitted at once without a wait, nothing written.
    #[inline]
    fn probe(&self, tat: u64, now: u64) -> (Outcome, LimitReport) {
        let fill = tat.max(now) - now;
        (
            Outcome::Allowed {
                wait: std::time::Duration::ZERO,
            },
            self.report(fill, true),
        )
    }

    /// Largest cost one request can be admitted with: `cap / T`.
    #[inline]
    pub(crate) fn max_cost(&self) -> u64 {
        self.most
    }

    /// Outcome and report of an admitted request whose new TAT is `diff` ahead of now.
    #[inline]
    pub(crate) fn admitted(&self, diff: u64) -> (Outcome, LimitReport) {
        // Most admissions do not wait: zero skips the conversion's division.
        let wait = match diff.saturating_sub(self.free) {
            0 => std::time::Duration::ZERO,
            wait => std::time::Duration::from_nanos(wait),
        };
        (Outcome::Allowed { wait }, self.report(diff, true))
    }

    /// Decides against a TAT held in an atomic cell, storing the new TAT with a
    /// compare-and-swap when admitted (a refusal writes nothing). Same decisions as
    /// [`Gcra::eval`]; the report is computed once, after the swap succeeded.
    #[inline(always)]
    pub(crate) fn charge(
        &self,
        cell: &AtomicU64,
        now: impl Fn() -> u64,
        cost: u64,
    ) -> (Outcome, LimitReport) {
        let mut tat = cell.load(Ordering::Acquire);
        if cost == 0 {
            return self.probe(tat, now());
        }
        loop {
            // The clock is read after the state: whoever wrote `tat` read their clock before
            // writing it, so this `now` is never older than theirs. A `now` read earlier
            // (before a preemption) could be older than a TAT written meanwhile and refuse
            // a request that fits.
            let now = now();
            match self.step(tat, now, cost) {
                Step::Admit { new_tat, diff } => {
                    match cell.compare_exchange_weak(
                        tat,
                        new_tat,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    ) {
                        Ok(_) => return self.admitted(diff),
                        Err(current) => tat = current,
                    }
                }
                Step::Refuse { outcome, fill } => return (outcome, self.report(fill, false)),
            }
        }
    }

    /// The report for a bucket whose TAT is `fill` ahead of now. `remaining` counts the
    /// units that would be admitted now, one at a time: up to `cap` ahead of now (for a
    /// queue, the ones that would wait for their slot included); `next_after` is the time
    /// until one more would be, which for a refused unit is its retry-after.
    #[inline]
    fn report(&self, fill: u64, allowed: bool) -> LimitReport {
        let room = self.cap;
        let left = room.saturating_sub(fill);
        // Skips the division (two 64x64-bit multiplications) when less than one unit is
        // left: every refusal of cost 1, which the branch keeps as cheap as an admission
        // (see the refusal rows of the core benchmark).
        let remaining = if left < self.t {
            0
        } else {
            self.div.divide(left)
        };
        // One more unit is admitted once `fill + (remaining + 1) * T - elapsed <= room`:
        // `(remaining + 1) * T > room - fill` by the division, so the difference is
        // positive. None comes when `remaining` is already the most one request can
        // take (a queue bounded by its longest wait holds a part of a unit more).
        let next_after = if fill == 0 || remaining >= self.most {
            0
        } else {
            fill + (remaining + 1) * self.t - room
        };
        LimitReport {
            index: 0,
            name: Default::default(),
            allowed,
            remaining,
            reset_after: fill,
            next_after,
        }
    }

    /// Charges `cost` units whatever the limit, at most twice the capacity ahead.
    pub(crate) fn force(&self, tat: u64, now: u64, cost: u64) -> u64 {
        let base = tat.max(now);
        base.saturating_add(cost.saturating_mul(self.t))
            .min(now.saturating_add(self.cap.saturating_mul(2)))
            .max(tat)
    }

    /// The TAT at which a unit is admitted again `ban` ns after `now`, and no earlier:
    /// a unit is admitted at `t` iff `max(tat, t) + T - t <= cap`, so at `tat - (cap - T)`.
    pub(crate) fn banned_until(&self, now: u64, ban: u64) -> u64 {
        now.saturating_add(ban)
            .saturating_add(self.cap - self.t)
            .min(now.saturating_add(crate::quota::MAX_HORIZON))
    }

    /// Gives back `cost` units (a queued request that was dropped before its slot).
    pub(crate) fn refund(&self, tat: u64, cost: u64) -> u64 {
        tat.saturating_sub(cost.saturating_mul(self.t))
    }
}
