#![doc = include_str!("../docs/algorithms.md")]
#![doc = ""]
#![doc = include_str!("../../docs/charts/idle-then-burst.svg")]
#![doc = ""]
#![doc = include_str!("../../docs/charts/sustained-overload.svg")]

mod div;
mod gcra;
mod window;

use std::{sync::Arc, time::Duration};

pub(crate) use gcra::Gcra;
pub(crate) use window::Window;

use crate::decision::MAX_LIMITS;
use crate::decision::{LimitReport, Outcome};
use crate::error::ConfigError;
use crate::quota::Quota;

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
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    quota: Quota,
    algorithm: Algorithm,
    name: Arc<str>,
    /// Whether the name was set with [`Limit::named`] (a policy set names the others).
    named: bool,
    mode: Enforcement,
    pub(crate) params: Params,
}

/// Whether a limit's refusals refuse the request. See [`Limit::shadow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Enforcement {
    /// Refusals refuse (the default).
    Enforced,
    /// Enforced for this many keys in 10 000 (chosen by a fixed hash of the key), shadow
    /// for the others; 0 is shadow for every key.
    Keys(u16),
}

impl Enforcement {
    /// Whether the limit is enforced for a key whose rollout hash is `key_hash`.
    pub(crate) fn enforced_for(self, key_hash: u64) -> bool {
        match self {
            Enforcement::Enforced => true,
            Enforcement::Keys(n) => key_hash % 10_000 < u64::from(n),
        }
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
            named: false,
            mode: Enforcement::Enforced,
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

    /// Bounds a queue by its longest wait as well as by its length: a request whose slot
    /// is more than `max_wait` away is refused instead of queued (nginx has no such
    /// bound; ASP.NET's queue limiters bound the length only).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Limit, Quota};
    ///
    /// // 10 per second, at most 50 queued, none waiting longer than 300 ms.
    /// let queue = Limit::leaky_queue(Quota::per_second(10)?, 50)?
    ///     .with_max_wait(Duration::from_millis(300))?;
    /// assert_eq!(queue.max_wait(), Some(Duration::from_millis(300)));
    /// // The same in policy text:
    /// let text: tollgate::Policy = "queue 10/s 50 max-wait 300ms".parse()?;
    /// assert_eq!(text.limits()[0], queue);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`ConfigError::MaxWaitNotApplicable`] for an algorithm that does not queue.
    pub fn with_max_wait(mut self, max_wait: Duration) -> Result<Self, ConfigError> {
        match (self.params, self.algorithm) {
            (Params::Gcra(g), Algorithm::LeakyQueue { .. }) => {
                let w = u64::try_from(max_wait.as_nanos()).unwrap_or(u64::MAX);
                // Admitted iff `new_tat - now <= cap`, waiting `new_tat - now - free`.
                let cap = g.free.saturating_add(w).min(g.cap);
                self.params = Params::Gcra(Gcra::new(g.t, g.tau, cap, g.free));
                Ok(self)
            }
            _ => Err(ConfigError::MaxWaitNotApplicable(self.algorithm.name())),
        }
    }

    /// The longest a queued request waits (a queue only): its length's worth of slots,
    /// or less when bounded by [`Limit::with_max_wait`].
    pub fn max_wait(&self) -> Option<Duration> {
        match (self.params, self.algorithm) {
            (Params::Gcra(g), Algorithm::LeakyQueue { .. }) => {
                Some(Duration::from_nanos(g.cap.saturating_sub(g.free)))
            }
            _ => None,
        }
    }

    /// Whether [`Limit::with_max_wait`] shortened this queue.
    #[cfg(feature = "redis")]
    fn max_wait_set(&self) -> bool {
        match (self.params, self.algorithm) {
            (Params::Gcra(g), Algorithm::LeakyQueue { queue, .. }) => {
                g.cap < g.t + u64::from(queue) * g.t
            }
            _ => false,
        }
    }

    /// The same limit with `from`'s name, enforcement and window offset (a scaled copy of
    /// `from`).
    #[cfg(feature = "redis")]
    pub(crate) fn like(mut self, from: &Limit) -> Self {
        self.name = from.name.clone();
        self.named = from.named;
        self.mode = from.mode;
        self.params =
            match (self.params, from.params) {
                (Params::Fixed(w), Params::Fixed(f)) => {
                    Params::Fixed(Window::new(w.w, w.limit, f.shift))
                }
                (Params::Sliding(w), Params::Sliding(f)) => {
                    Params::Sliding(Window::new(w.w, w.limit, f.shift))
                }
                // A queue bounded by its longest wait keeps that bound.
                (Params::Gcra(g), Params::Gcra(f)) if from.max_wait_set() => Params::Gcra(
                    Gcra::new(g.t, g.tau, g.cap.min(g.free + (f.cap - f.free)), g.free),
                ),
                (p, _) => p,
            };
        self
    }

    /// The same limit enforced for every key (`true`) or in shadow for every key.
    pub(crate) fn resolved(mut self, enforced: bool) -> Self {
        self.mode = if enforced {
            Enforcement::Enforced
        } else {
            Enforcement::Keys(0)
        };
        self
    }

    /// Names the limit (the `RateLimit-Policy` item name). Printable ASCII only.
    pub fn named(mut self, name: impl Into<String>) -> Result<Self, ConfigError> {
        let name = name.into();
        if name.is_empty() || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
            return Err(ConfigError::InvalidName(name));
        }
        self.name = name.into();
        self.named = true;
        Ok(self)
    }

    /// Gives the limit a default name (a policy set names its policies' limits after the
    /// policy), unless one was set with [`Limit::named`].
    pub(crate) fn named_by_default(mut self, name: &Arc<str>) -> Self {
        if !self.named {
            self.name = Arc::clone(name);
        }
        self
    }

    /// Runs the limit in shadow: decided and charged exactly as if enforced, but a request
    /// it alone would refuse is let through (and seen in metrics, events and the request's
    /// extensions as a would-be refusal). For rolling a new limit out: watch what it would
    /// refuse, then enforce it, or enforce it for a share of keys first
    /// ([`Limit::enforce_percent`]).
    pub fn shadow(mut self) -> Self {
        self.mode = Enforcement::Keys(0);
        self
    }

    /// Enforces the limit for `percent` of keys and runs it in shadow for the others. The
    /// share is chosen by a fixed hash of the key, the same in every process: a key is
    /// either in or out, so a client does not flap between the two, and raising the share
    /// only adds keys. `100.0` is the default (enforced), `0.0` is [`Limit::shadow`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::Percent`] outside `0..=100`.
    pub fn enforce_percent(mut self, percent: f64) -> Result<Self, ConfigError> {
        if !(0.0..=100.0).contains(&percent) {
            return Err(ConfigError::Percent(percent.to_string()));
        }
        self.mode = if percent >= 100.0 {
            Enforcement::Enforced
        } else {
            Enforcement::Keys((percent * 100.0).round() as u16)
        };
        Ok(self)
    }

    /// Whether the limit is in shadow for every key.
    pub fn is_shadow(&self) -> bool {
        self.mode == Enforcement::Keys(0)
    }

    /// The share of keys the limit is enforced for, in percent (100 unless set with
    /// [`Limit::shadow`] or [`Limit::enforce_percent`]).
    pub fn enforced_percent(&self) -> f64 {
        match self.mode {
            Enforcement::Enforced => 100.0,
            Enforcement::Keys(n) => f64::from(n) / 100.0,
        }
    }

    pub(crate) fn enforcement(&self) -> Enforcement {
        self.mode
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

    /// Whether the name was given with [`Limit::named`] (a policy set names the others).
    pub(crate) fn is_named(&self) -> bool {
        self.named
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

    /// The units a state holds at `now`, rounded up to whole units: what a key keeps when
    /// it changes to another limit (see [`Limit::carry`]).
    pub(crate) fn outstanding(&self, s: &[u64], now: u64) -> u64 {
        match &self.params {
            Params::Gcra(g) => (s[0].max(now) - now).div_ceil(g.t),
            Params::Fixed(w) => {
                if s[0] == w.tag(now) {
                    s[1]
                } else {
                    0
                }
            }
            Params::Sliding(w) => w.sliding_outstanding(s, now),
        }
    }

    /// This limit's state for a key whose state under `old` was `s`: the same state when
    /// the parameters are the same; a token bucket of the same rate keeps its exact fill
    /// (at most full), a window on the same grid (kind, length, offset) its counts (at
    /// most its limit); otherwise the outstanding units, rounded up to whole units, are
    /// charged at `now`, at most a full bucket or a full window.
    pub(crate) fn carry(&self, old: &Limit, s: &[u64], now: u64) -> [u64; 3] {
        let mut out = [0; 3];
        if self.params == old.params {
            out[..self.params.words()].copy_from_slice(&s[..self.params.words()]);
            return out;
        }
        match (&self.params, &old.params) {
            // The same rate and size keep even a debt above full (a local-first store's).
            (Params::Gcra(g), Params::Gcra(o)) if g.t == o.t && g.cap == o.cap => {
                out[0] = s[0];
            }
            (Params::Gcra(g), Params::Gcra(o)) if g.t == o.t => {
                let fill = (s[0].max(now) - now).min(g.cap);
                out[0] = if fill == 0 { 0 } else { now + fill };
            }
            // The same grid (the limit differs: equal parameters were copied above).
            (Params::Fixed(w), Params::Fixed(o)) | (Params::Sliding(w), Params::Sliding(o))
                if w.w == o.w && w.shift == o.shift =>
            {
                let k = self.params.words();
                out[0] = s[0];
                for i in 1..k {
                    out[i] = s[i].min(w.limit);
                }
            }
            (Params::Gcra(g), _) => {
                let units = old.outstanding(s, now);
                let fill = units.checked_mul(g.t).map_or(g.cap, |f| f.min(g.cap));
                out[0] = if fill == 0 { 0 } else { now + fill };
            }
            (Params::Fixed(w), _) => {
                let units = old.outstanding(s, now).min(w.limit);
                if units > 0 {
                    out[0] = w.tag(now);
                    out[1] = units;
                }
            }
            (Params::Sliding(w), _) => {
                let units = old.outstanding(s, now).min(w.limit);
                if units > 0 {
                    out[0] = w.tag(now);
                    out[2] = units;
                }
            }
        }
        out
    }

    /// Charges `cost` units whatever the limit (a request another policy admitted).
    pub(crate) fn force(&self, s: &mut [u64], now: u64, cost: u64) {
        match &self.params {
            Params::Gcra(g) => s[0] = g.force(s[0], now, cost),
            Params::Fixed(w) => w.force_fixed(s, now, cost),
            Params::Sliding(w) => w.force_sliding(s, now, cost),
        }
    }

    /// Refuses every request until `ban` ns after `now` (GCRA-based limits; windows
    /// cannot hold a refusal past their end and are left as they are).
    pub(crate) fn ban(&self, s: &mut [u64], now: u64, ban: u64) {
        if let Params::Gcra(g) = &self.params {
            s[0] = s[0].max(g.banned_until(now, ban));
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
