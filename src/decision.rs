//! The outcome of asking "may this key spend `cost` units now?".
//!
//! A [`Decision`] carries everything a response needs: allowed or not, the wait of a
//! queued request, the exact retry-after of a refusal, and per limit the remaining units,
//! the time until the limit is fully restored and the time until one more unit is
//! available (the IETF `RateLimit` field's `t`).

use std::{hash::Hasher, time::Duration};

/// The most limits (quotas) one policy may combine.
pub(crate) const MAX_LIMITS: usize = 4;

/// Allowed (possibly after a wait), denied, or never admissible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Admitted and charged. `wait` is zero except for a queued request (leaky-bucket
    /// queue), which must wait that long before it proceeds.
    Allowed {
        /// How long to wait before proceeding (the request's slot).
        wait: Duration,
    },
    /// Refused; nothing was charged. The same request is admitted exactly `retry_after`
    /// from now (and refused 1 ns earlier), if nothing else spends the quota meanwhile.
    Denied {
        /// Time until the request would be admitted.
        retry_after: Duration,
    },
    /// The cost is larger than some limit could ever admit at once (it exceeds the burst,
    /// or the window's limit). Retrying does not help.
    Exceeds,
}

/// Who made a decision: observable for failure handling (see the Redis store's failure
/// policy) and in `tracing` events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// This process's own state (the in-memory store, or local-first mode).
    #[default]
    Local,
    /// The shared store (Redis) decided.
    Store,
    /// A refusal remembered locally until its retry-after (no store call was made).
    NegativeCache,
    /// The store failed; the local fallback limiter decided.
    Fallback,
    /// The store failed; the request was admitted (fail open).
    FailOpen,
    /// The store failed; the request was refused (fail closed).
    FailClosed,
}

/// A limit's name as its reports carry it: 48 bits of a fixed hash of the name, which fit
/// in a report's padding (a decision is copied with every request; a name is not).
pub(crate) type NameTag = [u8; 6];

/// The tag of the limit named `name`.
pub(crate) fn name_tag(name: &str) -> NameTag {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x006c_696d_6974, 0x6e61_6d65);
    h.write(name.as_bytes());
    let b = h.finish().to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

/// What one limit of a policy says about a request. See [`Decision::limits`] and
/// [`Decision::limit`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitReport {
    pub(crate) index: u8,
    pub(crate) allowed: bool,
    /// The limit's name, as [`name_tag`] gives it.
    pub(crate) name: NameTag,
    pub(crate) remaining: u64,
    pub(crate) reset_after: u64,
    pub(crate) next_after: u64,
}

impl LimitReport {
    /// Position of the limit in its policy.
    pub fn index(&self) -> usize {
        self.index as usize
    }

    /// Whether this limit admits the request (a refusal names the limits that did not).
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Units that would still be admitted now, one at a time, after this decision: for a
    /// queue, the ones that would wait for their slot included ([`Decision::wait`] says
    /// how long an admitted one waits). The IETF `RateLimit` field's `r`.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Time until the limit is fully restored (as if the key had never been seen).
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after)
    }

    /// Time until one more unit would be admitted ([`remaining`](Self::remaining) grows
    /// by one), if nothing else spends the limit meanwhile; zero when the limit is full.
    /// For a refused request of one unit, its retry-after. The IETF `RateLimit` field's
    /// `t`, rounded up to whole seconds.
    pub fn next_after(&self) -> Duration {
        Duration::from_nanos(self.next_after)
    }
}

/// A would-be outcome of limits in shadow as [`Decision`] keeps it.
pub(crate) fn shadow_code(o: Option<Outcome>) -> u64 {
    match o {
        Some(Outcome::Denied { retry_after }) => {
            u64::try_from(retry_after.as_nanos()).map_or(u64::MAX - 1, |n| n.clamp(1, u64::MAX - 1))
        }
        Some(Outcome::Exceeds) => u64::MAX,
        _ => 0,
    }
}

/// The decision for one request. See the [module docs](self).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    pub(crate) outcome: Outcome,
    pub(crate) source: Source,
    pub(crate) len: u8,
    pub(crate) limits: [LimitReport; MAX_LIMITS],
    /// What the limits in shadow that refused would have answered, the request being
    /// admitted by the others: 0 nothing, `u64::MAX` exceeding, else the retry-after in
    /// ns (a word, not an `Option<Outcome>`: decisions are moved on every request).
    pub(crate) shadow: u64,
}

impl Decision {
    #[inline]
    pub(crate) fn single(outcome: Outcome, report: LimitReport) -> Self {
        let mut limits = [LimitReport::default(); MAX_LIMITS];
        limits[0] = report;
        Decision {
            outcome,
            source: Source::Local,
            len: 1,
            limits,
            shadow: 0,
        }
    }

    /// A single limit's decision, its report carrying the limit's `name`; when the limit
    /// is in `shadow` (bit 0), a refusal is let through (it charged nothing) and an
    /// admission does not wait.
    #[inline]
    pub(crate) fn single_in(
        outcome: Outcome,
        report: LimitReport,
        name: NameTag,
        shadow: u8,
    ) -> Self {
        let mut d = Self::single(outcome, LimitReport { name, ..report });
        if shadow & 1 != 0 {
            if !matches!(outcome, Outcome::Allowed { .. }) {
                d.shadow = shadow_code(Some(outcome));
            }
            d.outcome = Outcome::Allowed {
                wait: Duration::ZERO,
            };
        }
        d
    }

    /// Allowed, denied or exceeding.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Who decided.
    pub fn source(&self) -> Source {
        self.source
    }

    /// The same decision, attributed to `source`.
    pub fn with_source(mut self, source: Source) -> Self {
        self.source = source;
        self
    }

    /// A decision made without any limit's state (a store failure handled by failing open
    /// or closed): one report per limit of a policy of `limits` limits, with nothing
    /// remaining. Its reports carry no names ([`Decision::limit`] finds none).
    pub fn without_state(outcome: Outcome, source: Source, limits: usize) -> Self {
        let mut reports = [LimitReport::default(); MAX_LIMITS];
        let len = limits.clamp(1, MAX_LIMITS);
        for (i, r) in reports.iter_mut().enumerate().take(len) {
            r.index = i as u8;
            r.allowed = matches!(outcome, Outcome::Allowed { .. });
        }
        Decision {
            outcome,
            source,
            len: len as u8,
            limits: reports,
            shadow: 0,
        }
    }

    /// Whether a limit in shadow would have refused the request, which the enforced
    /// limits admitted (see [`Limit::shadow`](crate::Limit::shadow)). The outcome is the
    /// enforced limits'; [`Decision::violated`] names the limits in shadow that would have
    /// refused and [`Decision::retry_after`] says when they would have admitted it. Such
    /// a decision is in the request's extensions for handlers to read.
    pub fn shadowed(&self) -> bool {
        self.shadow != 0
    }

    /// Whether the request was admitted (perhaps after [`Decision::wait`]).
    pub fn is_allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allowed { .. })
    }

    /// The wait of an admitted, queued request; zero otherwise.
    pub fn wait(&self) -> Duration {
        match self.outcome {
            Outcome::Allowed { wait } => wait,
            _ => Duration::ZERO,
        }
    }

    /// The exact time until a refused request would be admitted (for a
    /// [shadowed](Decision::shadowed) one, until the limits in shadow would have admitted
    /// it); `None` when allowed or when the cost can never be admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.outcome {
            Outcome::Denied { retry_after } => Some(retry_after),
            _ if self.shadow != 0 && self.shadow != u64::MAX => {
                Some(Duration::from_nanos(self.shadow))
            }
            _ => None,
        }
    }

    /// One report per limit of the policy, in policy order.
    pub fn limits(&self) -> &[LimitReport] {
        &self.limits[..self.len as usize]
    }

    /// The report of the limit named `name` (its [`Limit::named`](crate::Limit::named)
    /// name, the item's name in `RateLimit-Policy`), the first if several share it; `None`
    /// when no limit of the policy has that name.
    ///
    /// ```
    /// use tollgate::{key::Global, RateLimitLayer, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let layer = RateLimitLayer::new(Global::new(), "second: 10/s burst 20, daily: 1000/day window".parse::<Policy>()?);
    /// // What is left today, read without spending anything.
    /// let now = layer.peek(()).await?;
    /// assert_eq!(now.limit("daily").map(|l| l.remaining()), Some(1000));
    /// assert!(now.limit("weekly").is_none());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn limit(&self, name: &str) -> Option<&LimitReport> {
        let tag = name_tag(name);
        self.limits().iter().find(|l| l.name == tag)
    }

    /// The smallest remaining count over all limits.
    pub fn remaining(&self) -> u64 {
        self.limits().iter().map(|l| l.remaining).min().unwrap_or(0)
    }

    /// Time until every limit is fully restored.
    pub fn reset_after(&self) -> Duration {
        Duration::from_nanos(
            self.limits()
                .iter()
                .map(|l| l.reset_after)
                .max()
                .unwrap_or(0),
        )
    }

    /// The limits that refused the request, or that would have refused a
    /// [shadowed](Decision::shadowed) one (empty when allowed otherwise).
    pub fn violated(&self) -> impl Iterator<Item = &LimitReport> + '_ {
        self.limits().iter().filter(|l| !l.allowed)
    }
}
