//! Errors: configuration refused at build time, store failures, and the typed refusal of
//! the generic (non-HTTP) middleware.

use std::{error::Error, fmt, sync::Arc, time::Duration};

/// A boxed error, as tower uses (`tower::BoxError`): the generic layer's error type.
pub(crate) type BoxError = Box<dyn Error + Send + Sync>;

/// A configuration value that tollgate refuses. Returned when a quota, a policy or a layer
/// is built, so an invalid limit never reaches a request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The quota's limit (units per period) is zero.
    ZeroLimit,
    /// The quota's period is zero.
    ZeroPeriod,
    /// The burst (bucket capacity) is zero.
    ZeroBurst,
    /// `period / limit` is shorter than the clock's resolution (1 ns): the rate is above
    /// 10^9 units per second.
    IntervalBelowResolution {
        /// The requested limit.
        limit: u64,
        /// The requested period.
        period: Duration,
    },
    /// A value is too large: the bucket's time horizon (burst, queue and period together)
    /// must stay below 2^62 ns (about 146 years).
    Overflow(&'static str),
    /// A burst was set on an algorithm that has none (the strict leaky meter, windows).
    BurstNotApplicable(&'static str),
    /// A window offset was set on an algorithm without windows.
    OffsetNotApplicable(&'static str),
    /// A longest wait was set on an algorithm that does not queue.
    MaxWaitNotApplicable(&'static str),
    /// A list of allowed or denied keys does not hold the layer's key type.
    KeyList(String),
    /// The leaky queue's `nodelay` share is larger than the queue.
    DelayExceedsQueue {
        /// The requested no-delay share.
        nodelay: u32,
        /// The queue size.
        queue: u32,
    },
    /// A policy with no limits in it.
    NoLimits,
    /// More limits in one policy than the four a policy may combine.
    TooManyLimits(usize),
    /// A limit name that cannot be sent in a `RateLimit` header (it must be printable ASCII).
    InvalidName(String),
    /// A CIDR block (for trusted proxies) that does not parse.
    InvalidCidr(String),
    /// An IPv6 grouping prefix longer than 128 bits, or an IPv4 one longer than 32.
    InvalidPrefix(u8),
    /// A header name that is not a valid HTTP header name.
    InvalidHeaderName(String),
    /// A key extractor that cannot work in this build (the message says why): a bearer
    /// token's claim without a crypto provider to verify the token.
    Key(String),
    /// A store setting that cannot work (the message says which).
    Store(String),
    /// A fair-sharing pool or share that cannot work (the message says which part).
    Fair(String),
    /// A rollout share outside 0-100 percent.
    Percent(String),
    /// A policy written as text that does not parse: the part at fault and why.
    Parse {
        /// The text the error was found in (a limit, or the whole policy).
        part: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An error on a line of a policy set's text.
    Line {
        /// The line, counted from 1.
        line: usize,
        /// What is wrong on it.
        error: Box<ConfigError>,
    },
    /// A policy set that cannot be used (the message says why: a duplicate or unknown
    /// name, no policy at all, too many limits with the ones every policy applies).
    PolicySet(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ZeroLimit => f.write_str("quota limit must be at least 1"),
            Self::ZeroPeriod => f.write_str("quota period must be longer than zero"),
            Self::ZeroBurst => f.write_str("burst must be at least 1"),
            Self::IntervalBelowResolution { limit, period } => write!(
                f,
                "{limit} per {period:?} is more than one unit per nanosecond (the clock's resolution)"
            ),
            Self::Overflow(what) => write!(f, "value too large: {what}"),
            Self::BurstNotApplicable(alg) => write!(f, "the {alg} algorithm takes no burst"),
            Self::OffsetNotApplicable(alg) => {
                write!(f, "the {alg} algorithm has no windows to offset")
            }
            Self::KeyList(what) => write!(f, "{what}: give the keys the extractor returns"),
            Self::MaxWaitNotApplicable(alg) => {
                write!(f, "the {alg} algorithm does not queue: max-wait applies to a queue")
            }
            Self::DelayExceedsQueue { nodelay, queue } => {
                write!(f, "nodelay ({nodelay}) is larger than the queue ({queue})")
            }
            Self::NoLimits => f.write_str("a policy needs at least one limit"),
            Self::TooManyLimits(n) => write!(
                f,
                "{n} limits in one policy; at most {} are supported",
                crate::decision::MAX_LIMITS
            ),
            Self::InvalidName(n) => write!(f, "limit name {n:?} is not printable ASCII"),
            Self::InvalidCidr(c) => write!(f, "invalid CIDR block {c:?}"),
            Self::InvalidPrefix(p) => write!(f, "invalid address prefix length /{p}"),
            Self::InvalidHeaderName(h) => write!(f, "invalid header name {h:?}"),
            Self::Key(msg) => write!(f, "key extractor: {msg}"),
            Self::Store(msg) => write!(f, "store configuration: {msg}"),
            Self::Fair(msg) => write!(f, "fair sharing: {msg}"),
            Self::Percent(p) => write!(f, "{p} is not a percent in 0-100"),
            Self::Parse { part, reason } => write!(f, "in {part:?}: {reason}"),
            Self::Line { line, error } => write!(f, "line {line}: {error}"),
            Self::PolicySet(msg) => write!(f, "policy set: {msg}"),
        }
    }
}

impl Error for ConfigError {}

/// A shared store could not decide (Redis slow, gone, or refusing). What the middleware
/// does then is its failure policy.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StoreError {
    /// The call did not finish within its deadline.
    Timeout(Duration),
    /// The circuit breaker is open: the store is not being called.
    CircuitOpen,
    /// The store answered with an error or could not be reached: the cause, which
    /// [`Error::source`] also returns. Build it with [`StoreError::backend`].
    Backend(Arc<dyn Error + Send + Sync>),
}

impl StoreError {
    /// A backend failure caused by `cause` (an error of the store's client, or a message).
    pub fn backend(cause: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        StoreError::Backend(Arc::from(cause.into()))
    }
}

impl PartialEq for StoreError {
    /// Backend errors are equal when their causes read the same.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Timeout(a), Self::Timeout(b)) => a == b,
            (Self::CircuitOpen, Self::CircuitOpen) => true,
            (Self::Backend(a), Self::Backend(b)) => a.to_string() == b.to_string(),
            _ => false,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Timeout(d) => write!(f, "rate-limit store did not answer within {d:?}"),
            Self::CircuitOpen => f.write_str("rate-limit store circuit breaker is open"),
            Self::Backend(cause) => write!(f, "rate-limit store error: {cause}"),
        }
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            Self::Backend(cause) => Some(&**cause),
            _ => None,
        }
    }
}

/// A refusal of the generic middleware, boxed into `tower::BoxError`: downcast it to read
/// why, and when to retry. See [`crate::generic`].
///
/// The request was rate limited ([`RateLimited::retry_after`] says when it would be
/// admitted), its slot in a queue came after its deadline
/// ([`RateLimited::is_past_deadline`]), its key is on the deny list
/// ([`RateLimited::is_denied`]), or it carried no key under `MissingKey::Reject`
/// ([`RateLimited::is_key_missing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimited {
    why: Why,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    Limited(crate::decision::Decision),
    Late(crate::decision::Decision),
    Denied,
    KeyMissing,
}

impl RateLimited {
    pub(crate) fn new(decision: crate::decision::Decision) -> Self {
        RateLimited {
            why: Why::Limited(decision),
        }
    }

    pub(crate) fn late(decision: crate::decision::Decision) -> Self {
        RateLimited {
            why: Why::Late(decision),
        }
    }

    pub(crate) fn denied() -> Self {
        RateLimited { why: Why::Denied }
    }

    pub(crate) fn key_missing() -> Self {
        RateLimited {
            why: Why::KeyMissing,
        }
    }

    /// The exact time until the request would be admitted; `None` when its cost can never
    /// be admitted, or when it was not refused by a limit (denied, or without a key).
    pub fn retry_after(&self) -> Option<Duration> {
        self.decision().and_then(|d| d.retry_after())
    }

    /// The full decision (the limits that refused, remaining units, reset times), when a
    /// limit refused (for a request refused for its deadline: the queues it would have
    /// waited in, and the wait).
    pub fn decision(&self) -> Option<&crate::decision::Decision> {
        match &self.why {
            Why::Limited(d) | Why::Late(d) => Some(d),
            _ => None,
        }
    }

    /// Whether the request was refused for its [`Deadline`](crate::Deadline): the limits
    /// admitted it into their queue, but its slot came after its deadline. Its units were
    /// not spent; [`RateLimited::retry_after`] is the time its slot would have come.
    pub fn is_past_deadline(&self) -> bool {
        matches!(self.why, Why::Late(_))
    }

    /// Whether the request's key is on the layer's deny list.
    pub fn is_denied(&self) -> bool {
        self.why == Why::Denied
    }

    /// Whether the request carried no key (`MissingKey::Reject`).
    pub fn is_key_missing(&self) -> bool {
        self.why == Why::KeyMissing
    }
}

impl fmt::Display for RateLimited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.why {
            Why::Denied => f.write_str("the request's key is denied"),
            Why::KeyMissing => f.write_str("no rate-limit key could be extracted from the request"),
            Why::Late(_) => write!(
                f,
                "refused: the request's slot comes after its deadline; retry after {:?}",
                self.retry_after().unwrap_or_default()
            ),
            Why::Limited(_) => match self.retry_after() {
                Some(d) => write!(f, "rate limited; retry after {d:?}"),
                None => f.write_str("rate limited; the request's cost exceeds the limit"),
            },
        }
    }
}

impl Error for RateLimited {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_error_keeps_its_cause_as_source() {
        let cause = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = StoreError::backend(cause);
        let source = e.source().expect("the cause");
        assert_eq!(
            source.downcast_ref::<std::io::Error>().map(|e| e.kind()),
            Some(std::io::ErrorKind::ConnectionRefused)
        );
        assert_eq!(e.to_string(), "rate-limit store error: refused");
        assert_eq!(e, StoreError::backend("refused"));
        assert!(StoreError::CircuitOpen.source().is_none());
    }
}
