//! The decision functions: pure, with time passed in.
//!
//! A [`Limit`] is a [`Quota`] under an [`Algorithm`]; a [`Policy`] is one to
//! [`MAX_LIMITS`] limits that must all admit a request (then all are charged, otherwise
//! none). State is a few `u64` words per limit ([`Policy::state_words`]); all zeros is a
//! fresh key. Nothing here reads a clock, so every decision is reproducible.
//!
//! | algorithm | admits | state |
//! |---|---|---|
//! | [`Algorithm::TokenBucket`] (GCRA) | bursts up to the quota's burst, then the rate | 1 word |
//! | [`Algorithm::LeakyMeter`] | the rate, evenly spaced: no banked burst | 1 word |
//! | [`Algorithm::LeakyQueue`] | the rate; excess waits for its slot up to `queue` slots | 1 word |
//! | [`Algorithm::FixedWindow`] | `limit` per aligned window (up to 2x around an edge) | 2 words |
//! | [`Algorithm::SlidingWindow`] | `limit` per window, previous window weighted | 3 words |
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{Limit, Outcome, Policy, Quota};
//!
//! // 10 per second with a burst of 20, and 10 000 per day.
//! let policy = Policy::new(Limit::token_bucket(Quota::per_second(10)?.with_burst(20)?)?)
//!     .and(Limit::token_bucket(Quota::per_day(10_000)?)?)?;
//! let mut state = vec![0u64; policy.state_words()];
//! let t0 = 1_000_000_000; // time in ns
//! for _ in 0..20 {
//!     assert!(policy.decide(&mut state, t0, 1).is_allowed());
//! }
//! let refused = policy.decide(&mut state, t0, 1);
//! assert_eq!(refused.outcome(), Outcome::Denied { retry_after: Duration::from_millis(100) });
//! # Ok::<(), tollgate::ConfigError>(())
//! ```

mod div;
mod gcra;
mod window;

use std::{fmt, sync::Arc, time::Duration};

pub(crate) use gcra::Gcra;
pub(crate) use window::Window;

use crate::{
    decision::{Decision, LimitReport, Outcome},
    error::ConfigError,
    quota::Quota,
    MAX_LIMITS,
};

/// Largest number of state words a policy can need.
pub(crate) const MAX_WORDS: usize = 3 * MAX_LIMITS;

/// How a quota is enforced. The algorithm is a value, not a type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// GCRA / token bucket: idle time is banked as burst credit up to the quota's burst.
    TokenBucket,
    /// Leaky bucket as a meter: the rate, evenly spaced, nothing banked; excess refused.
    LeakyMeter,
    /// Leaky bucket as a queue (nginx `limit_req`): each request gets the next slot, one
    /// per emission interval; a request whose slot is at most `queue` intervals away is
    /// admitted and told to wait for it, later ones are refused. The first `nodelay`
    /// queued requests are served at once (nginx `delay=N`; `nodelay == queue` is nginx's
    /// `nodelay`).
    LeakyQueue {
        /// Queue size in units (nginx `burst`).
        queue: u32,
        /// How many queued units are served without delay (nginx `delay`).
        nodelay: u32,
    },
    /// Fixed window aligned to the clock: `limit` units per `period`.
    FixedWindow,
    /// Sliding-window counter: the previous window's count weighted by its overlap.
    SlidingWindow,
}

impl Algorithm {
    fn name(&self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token bucket",
            Algorithm::LeakyMeter => "leaky meter",
            Algorithm::LeakyQueue { .. } => "leaky queue",
            Algorithm::FixedWindow => "fixed window",
            Algorithm::SlidingWindow => "sliding window",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Params {
    Gcra(Gcra),
    Fixed(Window),
    Sliding(Window),
}

impl Params {
    pub(crate) fn words(&self) -> usize {
        match self {
            Params::Gcra(_) => 1,
            Params::Fixed(_) => 2,
            Params::Sliding(_) => 3,
        }
    }
}

/// One quota under one algorithm, with a name for the `RateLimit` headers.
/// See the [module docs](self).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Limit {
    quota: Quota,
    algorithm: Algorithm,
    name: Arc<str>,
    pub(crate) params: Params,
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("name", &self.name)
            .field("quota", &self.quota)
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

impl Limit {
    /// Builds a limit, validating that the algorithm and the quota fit together.
    pub fn new(quota: Quota, algorithm: Algorithm) -> Result<Self, ConfigError> {
        let t = quota.interval_ns();
        let no_burst = |q: &Quota| {
            if q.burst_is_set() {
                Err(ConfigError::BurstNotApplicable(algorithm.name()))
            } else {
                Ok(())
            }
        };
        let params = match algorithm {
            Algorithm::TokenBucket => {
                let tau = (quota.burst() - 1) * t;
                Params::Gcra(Gcra::new(t, tau, tau + t, tau + t))
            }
            Algorithm::LeakyMeter => {
                no_burst(&quota)?;
                Params::Gcra(Gcra::new(t, 0, t, t))
            }
            Algorithm::LeakyQueue { queue, nodelay } => {
                no_burst(&quota)?;
                if nodelay > queue {
                    return Err(ConfigError::DelayExceedsQueue { nodelay, queue });
                }
                let queue_room = u64::from(queue)
                    .checked_mul(t)
                    .filter(|r| {
                        r.checked_add(t)
                            .is_some_and(|h| h <= crate::quota::MAX_HORIZON)
                    })
                    .ok_or(ConfigError::Overflow("queue * emission interval"))?;
                Params::Gcra(Gcra::new(t, 0, t + queue_room, t + u64::from(nodelay) * t))
            }
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                no_burst(&quota)?;
                let w = Window::new(quota.period_ns(), quota.limit(), 0);
                if algorithm == Algorithm::FixedWindow {
                    Params::Fixed(w)
                } else {
                    Params::Sliding(w)
                }
            }
        };
        Ok(Limit {
            name: quota.default_name().into(),
            quota,
            algorithm,
            params,
        })
    }

    /// GCRA / token bucket with the quota's burst.
    pub fn token_bucket(quota: Quota) -> Result<Self, ConfigError> {
        Self::new(quota, Algorithm::TokenBucket)
    }

    /// Strict leaky meter: no burst (the quota must not set one).
    pub fn leaky_meter(quota: Quota) -> Result<Self, ConfigError> {
        Self::new(quota, Algorithm::LeakyMeter)
    }

    /// Leaky-bucket queue of `queue` units, all of them delayed to their slot.
    pub fn leaky_queue(quota: Quota, queue: u32) -> Result<Self, ConfigError> {
        Self::new(quota, Algorithm::LeakyQueue { queue, nodelay: 0 })
    }

    /// Leaky-bucket queue of `queue` units whose first `nodelay` are served at once.
    pub fn leaky_queue_nodelay(
        quota: Quota,
        queue: u32,
        nodelay: u32,
    ) -> Result<Self, ConfigError> {
        Self::new(quota, Algorithm::LeakyQueue { queue, nodelay })
    }

    /// Fixed window: `limit` per `period`, aligned to the clock.
    pub fn fixed_window(quota: Quota) -> Result<Self, ConfigError> {
        Self::new(quota, Algorithm::FixedWindow)
    }

    /// Sliding-window counter: `limit` per `period`.
    pub fn sliding_window(quota: Quota) -> Result<Self, ConfigError> {
        Self::new(quota, Algorithm::SlidingWindow)
    }

    /// Moves a window's start: windows begin at `offset` past every multiple of the window
    /// since the Unix epoch, instead of at the multiples themselves. Day windows are UTC
    /// calendar days by default; `Duration::from_secs(5 * 3600)` makes them start at 05:00
    /// UTC (midnight in UTC-5).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limit, Quota};
    ///
    /// let daily = Limit::fixed_window(Quota::per_day(1000)?)?
    ///     .with_window_offset(Duration::from_secs(5 * 3600))?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::OffsetNotApplicable`] for an algorithm without windows (token bucket,
    /// leaky meter and queue).
    pub fn with_window_offset(mut self, offset: Duration) -> Result<Self, ConfigError> {
        let offset = offset.as_nanos();
        self.params = match self.params {
            Params::Fixed(w) => {
                Params::Fixed(Window::new(w.w, w.limit, (offset % u128::from(w.w)) as u64))
            }
            Params::Sliding(w) => {
                Params::Sliding(Window::new(w.w, w.limit, (offset % u128::from(w.w)) as u64))
            }
            Params::Gcra(_) => return Err(ConfigError::OffsetNotApplicable(self.algorithm.name())),
        };
        Ok(self)
    }

    /// Names the limit (the `RateLimit-Policy` item name). Printable ASCII only.
    pub fn named(mut self, name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(ConfigError::InvalidName(name));
        }
        self.name = name.into();
        Ok(self)
    }

    /// The quota.
    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The name used in headers.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Largest cost a single request can ever be admitted with.
    pub fn max_cost(&self) -> u64 {
        match self.params {
            Params::Gcra(g) => g.max_cost(),
            Params::Fixed(w) | Params::Sliding(w) => w.limit,
        }
    }

    /// Evaluates without writing: outcome, the new state when admitted, report.
    #[inline]
    pub(crate) fn eval(
        &self,
        s: &[u64],
        now: u64,
        cost: u64,
    ) -> (Outcome, Option<[u64; 3]>, LimitReport) {
        match &self.params {
            Params::Gcra(g) => {
                let (o, n, r) = g.eval(s[0], now, cost);
                (o, n.map(|t| [t, 0, 0]), r)
            }
            Params::Fixed(w) => {
                let (o, n, r) = w.eval_fixed(s, now, cost);
                (o, n.map(|[a, b]| [a, b, 0]), r)
            }
            Params::Sliding(w) => w.eval_sliding(s, now, cost),
        }
    }

    pub(crate) fn is_fresh(&self, s: &[u64], now: u64) -> bool {
        match &self.params {
            Params::Gcra(_) => s[0] <= now,
            Params::Fixed(w) => w.fixed_is_fresh(s, now),
            Params::Sliding(w) => w.sliding_is_fresh(s, now),
        }
    }

    pub(crate) fn refund(&self, s: &mut [u64], now: u64, cost: u64) {
        match &self.params {
            Params::Gcra(g) => s[0] = g.refund(s[0], cost),
            Params::Fixed(w) => w.refund_fixed(s, now, cost),
            Params::Sliding(w) => w.refund_sliding(s, now, cost),
        }
    }
}

/// One or more limits that must all admit a request. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    limits: Vec<Limit>,
    offsets: [u8; MAX_LIMITS],
    words: usize,
}

impl Policy {
    /// A policy of one limit.
    pub fn new(limit: Limit) -> Self {
        Policy {
            words: limit.params.words(),
            limits: vec![limit],
            offsets: [0; MAX_LIMITS],
        }
    }

    /// A policy of several limits.
    pub fn from_limits(limits: impl IntoIterator<Item = Limit>) -> Result<Self, ConfigError> {
        let mut it = limits.into_iter();
        let mut p = Policy::new(it.next().ok_or(ConfigError::NoLimits)?);
        for l in it {
            p = p.and(l)?;
        }
        Ok(p)
    }

    /// Adds a limit that must also admit every request.
    pub fn and(mut self, limit: Limit) -> Result<Self, ConfigError> {
        if self.limits.len() == MAX_LIMITS {
            return Err(ConfigError::TooManyLimits(MAX_LIMITS + 1));
        }
        self.offsets[self.limits.len()] = self.words as u8;
        self.words += limit.params.words();
        self.limits.push(limit);
        Ok(self)
    }

    /// The limits, in order.
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// How many `u64` words of state one key needs (all zero = fresh).
    pub fn state_words(&self) -> usize {
        self.words
    }

    /// Largest cost any request can ever be admitted with.
    pub fn max_cost(&self) -> u64 {
        self.limits.iter().map(Limit::max_cost).min().unwrap_or(0)
    }

    /// Whether the single limit is GCRA-based (one state word, lock-free in memory).
    pub(crate) fn single_gcra(&self) -> Option<&Gcra> {
        match (self.limits.len(), &self.limits[0].params) {
            (1, Params::Gcra(g)) => Some(g),
            _ => None,
        }
    }

    fn slice<'a>(&self, s: &'a [u64], i: usize) -> &'a [u64] {
        let off = self.offsets[i] as usize;
        &s[off..off + self.limits[i].params.words()]
    }

    /// Evaluates every limit without writing. Returns the decision and, when admitted,
    /// the new state.
    pub(crate) fn eval(
        &self,
        state: &[u64],
        now: u64,
        cost: u64,
    ) -> (Decision, Option<[u64; MAX_WORDS]>) {
        debug_assert!(state.len() >= self.words);
        let mut reports = [LimitReport::default(); MAX_LIMITS];
        let mut next = [0u64; MAX_WORDS];
        let mut wait = Duration::ZERO;
        let mut retry: Option<Duration> = None;
        let mut exceeds = false;
        for (i, limit) in self.limits.iter().enumerate() {
            let s = self.slice(state, i);
            let (o, n, mut r) = limit.eval(s, now, cost);
            r.index = i as u8;
            reports[i] = r;
            let off = self.offsets[i] as usize;
            let k = limit.params.words();
            match o {
                Outcome::Allowed { wait: w } => {
                    wait = wait.max(w);
                    next[off..off + k].copy_from_slice(&n.unwrap_or_default()[..k]);
                }
                Outcome::Denied { retry_after } => {
                    retry = Some(retry.map_or(retry_after, |r| r.max(retry_after)));
                }
                Outcome::Exceeds => exceeds = true,
            }
        }
        let outcome = if exceeds {
            Outcome::Exceeds
        } else if let Some(retry_after) = retry {
            Outcome::Denied { retry_after }
        } else {
            Outcome::Allowed { wait }
        };
        let admitted = matches!(outcome, Outcome::Allowed { .. });
        if !admitted && self.limits.len() > 1 {
            // Nothing is charged: limits that would have admitted report their state as is.
            for (i, limit) in self.limits.iter().enumerate() {
                if reports[i].allowed {
                    reports[i] = LimitReport {
                        index: i as u8,
                        ..limit.eval(self.slice(state, i), now, 0).2
                    };
                }
            }
        }
        let decision = Decision {
            outcome,
            source: crate::decision::Source::Local,
            len: self.limits.len() as u8,
            limits: reports,
        };
        (decision, admitted.then_some(next))
    }

    /// Decides and, when admitted, charges `cost` to `state` (all limits or none).
    ///
    /// `state` must hold at least [`Policy::state_words`] words; `now` is in nanoseconds
    /// of any monotonic clock (the same one for every call on this state).
    pub fn decide(&self, state: &mut [u64], now: u64, cost: u64) -> Decision {
        let (d, next) = self.eval(state, now, cost);
        if let Some(next) = next {
            state[..self.words].copy_from_slice(&next[..self.words]);
        }
        d
    }

    /// Decides without charging anything: what [`Policy::decide`] would answer now.
    pub fn peek(&self, state: &[u64], now: u64, cost: u64) -> Decision {
        self.eval(state, now, cost).0
    }

    /// Gives back `cost` units to every limit (a queued request dropped before its slot).
    pub fn refund(&self, state: &mut [u64], now: u64, cost: u64) {
        for (i, limit) in self.limits.iter().enumerate() {
            let off = self.offsets[i] as usize;
            limit.refund(&mut state[off..off + limit.params.words()], now, cost);
        }
    }

    /// Whether `state` is indistinguishable from a fresh key at `now` (so it may be
    /// forgotten).
    pub fn is_fresh(&self, state: &[u64], now: u64) -> bool {
        self.limits
            .iter()
            .enumerate()
            .all(|(i, l)| l.is_fresh(self.slice(state, i), now))
    }

    /// A stable identifier of the policy's parameters (not its names), used to namespace
    /// shared-store keys so that instances configured alike share state.
    pub fn fingerprint(&self) -> u64 {
        // FNV-1a over the parameters: stable across processes and builds.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |v: u64| {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for l in &self.limits {
            match l.params {
                Params::Gcra(g) => {
                    mix(1);
                    mix(g.t);
                    mix(g.tau);
                    mix(g.cap);
                    mix(g.free);
                }
                Params::Fixed(w) => {
                    mix(2);
                    mix(w.w);
                    mix(w.limit);
                    mix(w.shift);
                }
                Params::Sliding(w) => {
                    mix(3);
                    mix(w.w);
                    mix(w.limit);
                    mix(w.shift);
                }
            }
        }
        h
    }
}

impl From<Limit> for Policy {
    fn from(limit: Limit) -> Self {
        Policy::new(limit)
    }
}
