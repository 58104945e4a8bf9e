//! What the Redis store answers when Redis cannot, and the share of each quota its local
//! fallback applies.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::{Algorithm, Limit, Params, MAX_WORDS};
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::quota::Quota;
use crate::redis::Fleet;

/// What a [`RedisStore`](super::RedisStore) decides when Redis fails, times out, or its
/// circuit breaker is open. See the [module docs](super).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit every request ([`Source::FailOpen`](crate::decision::Source::FailOpen)). No limiting
    /// at all while Redis is down: a slow or failing store then stops limiting altogether.
    FailOpen,
    /// Refuse every request with this retry-after
    /// ([`Source::FailClosed`](crate::decision::Source::FailClosed)).
    FailClosed {
        /// The retry-after of the refusals.
        retry_after: Duration,
    },
    /// Decide from a per-instance local state at `share` of each quota
    /// ([`Source::Fallback`](crate::decision::Source::Fallback)), each key continuing from
    /// the state Redis last returned for it (a key Redis never answered for starts full, at
    /// its share). What it admits is charged to the shared state once Redis answers again.
    /// With `N` instances, `share = 1.0 / N` keeps the fleet at the shared limit;
    /// [`FailurePolicy::FleetShare`] (the default) counts `N` itself.
    ///
    /// Scaling: a GCRA-based limit keeps its exact rate times `share` (the emission
    /// interval is divided by `share`); its burst, a queue's size and `nodelay`, and a
    /// window's limit are multiplied by `share` and rounded down, at least 1 (a queue and
    /// `nodelay` at least 0), so that `N` instances at `1 / N` never hold more than the
    /// whole (unless a part rounds up to 1).
    LocalFallback {
        /// Fraction of each quota, in `(0, 1]`.
        share: f64,
    },
    /// [`FailurePolicy::LocalFallback`] at `1 / N` of each quota, `N` being the instances
    /// counted on Redis at the last successful count (each instance renews a lease every
    /// second; see the [module docs](super#the-fleet-and-its-share)), or the
    /// [`fleet_floor`](super::RedisBuilder::fleet_floor) when it is larger. The default.
    /// Before the first count (Redis unreachable since start, or refusing the fleet's
    /// lease) `N` is the floor, 1 unless set.
    #[default]
    FleetShare,
}

/// Where a local state's share of each quota comes from.
#[derive(Clone, Debug)]
pub(super) enum Share {
    /// A share given (1.0: the whole quota, as a local-first store decides).
    Fixed(f64),
    /// `1 / N`, `N` the fleet's size at its last count, at least the floor.
    Fleet(Arc<Fleet>, u32),
}

impl Share {
    /// The share now.
    pub(super) fn get(&self) -> f64 {
        match self {
            Share::Fixed(s) => *s,
            Share::Fleet(f, floor) => 1.0 / f64::from(f.size().unwrap_or(1).max(*floor).max(1)),
        }
    }
}

/// `share` of `v`, rounded down, at least `min`.
fn scale(v: u64, share: f64, min: u64) -> u64 {
    ((v as f64 * share).floor() as u64).max(min)
}

/// The policy at `share` of each quota (see [`FailurePolicy::LocalFallback`]).
pub(super) fn scaled_policy(policy: &Policy, share: f64) -> Result<Policy, ConfigError> {
    check_share(share)?;
    if share == 1.0 {
        return Ok(policy.clone());
    }
    let mut limits = Vec::with_capacity(policy.limits().len());
    for l in policy.limits() {
        let q = l.quota();
        let alg = l.algorithm();
        let scaled = match alg {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                Limit::new(Quota::new(scale(q.limit(), share, 1), q.period())?, alg)?
            }
            _ => {
                let period_ns = (q.period().as_nanos() as f64 / share).round() as u64;
                let mut nq = Quota::new(q.limit(), Duration::from_nanos(period_ns))?;
                if q.burst_is_set() || alg == Algorithm::TokenBucket {
                    nq = nq.with_burst(scale(q.burst(), share, 1))?;
                }
                let alg = match alg {
                    Algorithm::LeakyQueue { queue, nodelay } => {
                        let queue = scale(u64::from(queue), share, 0) as u32;
                        Algorithm::LeakyQueue {
                            queue,
                            nodelay: (scale(u64::from(nodelay), share, 0) as u32).min(queue),
                        }
                    }
                    other => other,
                };
                Limit::new(nq, alg)?
            }
        };
        limits.push(scaled.like(l));
    }
    Policy::from_limits(limits)
}

/// Refuses a share outside `(0, 1]`.
pub(super) fn check_share(share: f64) -> Result<(), ConfigError> {
    if !(share > 0.0 && share <= 1.0) {
        return Err(ConfigError::Store(format!(
            "fallback share must be in (0, 1], got {share}"
        )));
    }
    Ok(())
}

/// A state of `policy` (the shared limits) as the state of the policy at `share`: a GCRA
/// state as it is (its fill is the same fraction of both buckets), a window's counts times
/// `share` rounded up.
pub(super) fn to_share(policy: &Policy, state: &[u64], share: f64) -> [u64; MAX_WORDS] {
    map_counts(policy, state, |c| (c as f64 * share).ceil() as u64)
}

/// A state of the policy at `share` as a state of `policy`: the inverse of [`to_share`],
/// counts rounded up.
pub(super) fn from_share(policy: &Policy, state: &[u64], share: f64) -> [u64; MAX_WORDS] {
    map_counts(policy, state, |c| (c as f64 / share).ceil() as u64)
}

/// `state` with every window count mapped by `f` (GCRA words and window tags as they are).
fn map_counts(policy: &Policy, state: &[u64], f: impl Fn(u64) -> u64) -> [u64; MAX_WORDS] {
    let mut out = [0; MAX_WORDS];
    let w = policy.state_words().min(state.len());
    out[..w].copy_from_slice(&state[..w]);
    for (l, span) in policy.spans() {
        if !matches!(l.params, Params::Gcra(_)) {
            for c in &mut out[span.start + 1..span.end] {
                *c = f(*c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_rate_and_burst() {
        let p = Policy::new(
            Limit::token_bucket(Quota::per_second(10).unwrap().with_burst(20).unwrap()).unwrap(),
        )
        .and(Limit::fixed_window(Quota::per_minute(7).unwrap()).unwrap())
        .unwrap()
        .and(Limit::leaky_queue(Quota::per_second(4).unwrap(), 5).unwrap())
        .unwrap();
        let h = scaled_policy(&p, 0.5).unwrap();
        let l = h.limits();
        assert_eq!(l[0].quota().emission_interval(), Duration::from_millis(200));
        assert_eq!(l[0].quota().burst(), 10);
        assert_eq!(l[1].quota().limit(), 3); // 3.5 rounds down
        assert_eq!(l[1].quota().period(), Duration::from_secs(60));
        assert_eq!(l[2].quota().emission_interval(), Duration::from_millis(500));
        assert_eq!(
            l[2].algorithm(),
            Algorithm::LeakyQueue {
                queue: 2,
                nodelay: 0
            }
        );
        assert_eq!(l[0].name(), p.limits()[0].name());
        assert!(scaled_policy(&p, 0.0).is_err());
        assert!(scaled_policy(&p, 1.5).is_err());
        assert_eq!(
            scaled_policy(&p, 1.0).unwrap().fingerprint(),
            p.fingerprint()
        );
    }
}
