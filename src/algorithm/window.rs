//! Fixed window and sliding-window counter.
//!
//! Window `i` spans `[i*W + offset, (i+1)*W + offset)` of Unix time (offset 0 unless set:
//! day windows are UTC calendar days). State words: the fixed window keeps
//! `[i + 1, count]`; the sliding window keeps `[i + 1, prev, cur]` (0 in the first word
//! means "never used"). The sliding estimate is `prev * (W - e) / W + cur` where `e` is the
//! time elapsed in the current window; it is compared in exact integer arithmetic.
//!
//! A cost of zero spends nothing and is admitted at once, as on GCRA, even on counts
//! above the limit (a charge's debt, a smaller limit's carried counts): it only reports
//! the state, which it leaves as it is.

use std::time::Duration;

use super::div::Divisor;
use crate::decision::{LimitReport, Outcome};

/// Window parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Window {
    /// Window length in nanoseconds.
    pub(crate) w: u64,
    /// Units admitted per window.
    pub(crate) limit: u64,
    /// Added to the time before it is divided into windows: `(w - offset % w) % w`, so
    /// that a window starts at every `offset + i * w`.
    pub(crate) shift: u64,
    /// Division by `w`, for the window a time falls in.
    div: Divisor,
}

fn allowed(outcome_ok: bool, retry: u64) -> Outcome {
    if outcome_ok {
        Outcome::Allowed {
            wait: Duration::ZERO,
        }
    } else {
        Outcome::Denied {
            retry_after: Duration::from_nanos(retry),
        }
    }
}

impl Window {
    /// A window of `w` ns (`w >= 1`) admitting `limit` units, starting at `offset` past
    /// every multiple of `w` since the Unix epoch.
    pub(crate) const fn new(w: u64, limit: u64, offset: u64) -> Self {
        Window {
            w,
            limit,
            shift: (w - offset % w) % w,
            div: Divisor::new(w),
        }
    }

    /// The tag of the window `now` falls in (its index plus one).
    pub(crate) fn tag(&self, now: u64) -> u64 {
        self.position(now).0
    }

    /// The tag of the window `now` falls in, and the time elapsed in it.
    #[inline]
    fn position(&self, now: u64) -> (u64, u64) {
        let t = now + self.shift;
        let i = self.div.divide(t);
        (i + 1, t - i * self.w)
    }

    /// Fixed window: returns outcome, new state when admitted, report.
    pub(crate) fn eval_fixed(
        &self,
        s: &[u64],
        now: u64,
        cost: u64,
    ) -> (Outcome, Option<[u64; 2]>, LimitReport) {
        let (tag, e) = self.position(now);
        let count = if s[0] == tag { s[1] } else { 0 };
        let report = |count: u64, allowed: bool| {
            let reset = if count > 0 { self.w - e } else { 0 };
            LimitReport {
                index: 0,
                name: Default::default(),
                allowed,
                remaining: self.limit.saturating_sub(count),
                reset_after: reset,
                next_after: reset,
            }
        };
        if cost == 0 {
            // Spends nothing, even on a count above the limit (a charge's debt).
            return (allowed(true, 0), Some([s[0], s[1]]), report(count, true));
        }
        if cost > self.limit {
            return (Outcome::Exceeds, None, report(count, false));
        }
        if count + cost <= self.limit {
            let c = count + cost;
            (allowed(true, 0), Some([tag, c]), report(c, true))
        } else {
            (allowed(false, self.w - e), None, report(count, false))
        }
    }

    fn sliding_counts(&self, s: &[u64], tag: u64) -> (u64, u64) {
        if s[0] == tag {
            (s[1], s[2])
        } else if s[0] != 0 && s[0] + 1 == tag {
            (s[2], 0)
        } else {
            (0, 0)
        }
    }

    /// Whether `prev*(W-e) + (cur+cost)*W <= limit*W`.
    #[inline]
    fn fits(&self, prev: u64, cur: u64, e: u64, cost: u64) -> bool {
        let w = self.w as u128;
        (prev as u128) * (w - e as u128) + (cur as u128 + cost as u128) * w
            <= self.limit as u128 * w
    }

    /// Exact time from offset `e` until `cost` fits, given the counts. `cost <= limit`.
    fn sliding_wait(&self, prev: u64, cur: u64, e: u64, cost: u64) -> u64 {
        let w = self.w as u128;
        if self.fits(prev, cur, e, cost) {
            return 0;
        }
        // Later in this window: need prev*(W-e') <= (limit-cur-cost)*W.
        if let Some(need) = self.limit.checked_sub(cur + cost) {
            if prev > 0 {
                let slack = (need as u128 * w) / prev as u128;
                if slack > 0 && slack < w {
                    // e' >= W - slack, and e' < W.
                    let e_min = (w - slack) as u64;
                    if e_min > e {
                        return e_min - e;
                    }
                }
            }
        }
        // Next window: prev' = cur, cur' = 0: need cur*(W-e2) <= (limit-cost)*W.
        let need2 = (self.limit - cost) as u128;
        let e_min2 = if cur == 0 {
            0
        } else {
            (w - (need2 * w / cur as u128).min(w)) as u64
        };
        (self.w - e) + e_min2
    }

    /// Sliding-window counter: returns outcome, new state when admitted, report.
    pub(crate) fn eval_sliding(
        &self,
        s: &[u64],
        now: u64,
        cost: u64,
    ) -> (Outcome, Option<[u64; 3]>, LimitReport) {
        let (tag, e) = self.position(now);
        let (prev, cur) = self.sliding_counts(s, tag);
        let report = |cur: u64, allowed: bool| {
            let w = self.w as u128;
            let used = prev as u128 * (w - e as u128) + cur as u128 * w;
            let remaining = ((self.limit as u128 * w).saturating_sub(used) / w) as u64;
            let reset_after = if cur > 0 {
                2 * self.w - e
            } else if prev > 0 {
                self.w - e
            } else {
                0
            };
            let next_after = if remaining >= self.limit {
                0
            } else {
                self.sliding_wait(prev, cur, e, remaining + 1)
            };
            LimitReport {
                index: 0,
                name: Default::default(),
                allowed,
                remaining,
                reset_after,
                next_after,
            }
        };
        if cost == 0 {
            // Spends nothing, even on counts above the limit (a charge's debt, a smaller
            // limit's carried counts).
            return (
                allowed(true, 0),
                Some([s[0], s[1], s[2]]),
                report(cur, true),
            );
        }
        if cost > self.limit {
            return (Outcome::Exceeds, None, report(cur, false));
        }
        if self.fits(prev, cur, e, cost) {
            let c = cur + cost;
            (allowed(true, 0), Some([tag, prev, c]), report(c, true))
        } else {
            let retry = self.sliding_wait(prev, cur, e, cost);
            (allowed(false, retry), None, report(cur, false))
        }
    }

    /// The sliding estimate at `now`, rounded up to whole units.
    pub(crate) fn sliding_outstanding(&self, s: &[u64], now: u64) -> u64 {
        let (tag, e) = self.position(now);
        let (prev, cur) = self.sliding_counts(s, tag);
        let w = u128::from(self.w);
        let weighted = (u128::from(prev) * (w - u128::from(e))).div_ceil(w);
        weighted as u64 + cur
    }

    /// Whether fixed-window state is indistinguishable from a fresh key at `now`.
    pub(crate) fn fixed_is_fresh(&self, s: &[u64], now: u64) -> bool {
        s[0] != self.position(now).0 || s[1] == 0
    }

    /// Whether sliding-window state is indistinguishable from a fresh key at `now`.
    pub(crate) fn sliding_is_fresh(&self, s: &[u64], now: u64) -> bool {
        let (prev, cur) = self.sliding_counts(s, self.position(now).0);
        prev == 0 && cur == 0
    }

    /// Charges `cost` units whatever the limit, at most twice the limit (fixed).
    pub(crate) fn force_fixed(&self, s: &mut [u64], now: u64, cost: u64) {
        let tag = self.position(now).0;
        let count = if s[0] == tag { s[1] } else { 0 };
        s[0] = tag;
        s[1] = count.saturating_add(cost).min(self.limit.saturating_mul(2));
    }

    /// Charges `cost` units whatever the limit, at most twice the limit (sliding).
    pub(crate) fn force_sliding(&self, s: &mut [u64], now: u64, cost: u64) {
        let tag = self.position(now).0;
        let (prev, cur) = self.sliding_counts(s, tag);
        s[0] = tag;
        s[1] = prev;
        s[2] = cur.saturating_add(cost).min(self.limit.saturating_mul(2));
    }

    /// Gives back `cost` units charged in the current window (fixed).
    pub(crate) fn refund_fixed(&self, s: &mut [u64], now: u64, cost: u64) {
        if s[0] == self.position(now).0 {
            s[1] = s[1].saturating_sub(cost);
        }
    }

    /// Gives back `cost` units charged in the current or the previous window (sliding).
    pub(crate) fn refund_sliding(&self, s: &mut [u64], now: u64, cost: u64) {
        let tag = self.position(now).0;
        if s[0] == tag || (s[0] != 0 && s[0] + 1 == tag) {
            s[2] = s[2].saturating_sub(cost);
        }
    }
}
