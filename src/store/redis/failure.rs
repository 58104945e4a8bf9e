//! What the Redis store answers when Redis cannot.

use std::time::Duration;

use crate::algorithm::{Algorithm, Limit};
use crate::error::ConfigError;
use crate::policy::Policy;
use crate::quota::Quota;

/// What a [`RedisStore`](super::RedisStore) decides when Redis fails, times out, or its
/// circuit breaker is open. See the [module docs](super).
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// Decide from a per-instance in-memory store with the same algorithms at `share` of
    /// each quota ([`Source::Fallback`](crate::decision::Source::Fallback)). With `N` instances,
    /// `share = 1.0 / N` keeps the fleet near the shared limit. The default, with
    /// `share = 1.0`.
    ///
    /// Scaling: a GCRA-based limit keeps its exact rate times `share` (the emission
    /// interval is divided by `share`); its burst, a queue's size and `nodelay`, and a
    /// window's limit are multiplied by `share` and rounded to the nearest integer, at
    /// least 1 (a queue and `nodelay` at least 0).
    LocalFallback {
        /// Fraction of each quota, in `(0, 1]`.
        share: f64,
    },
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy::LocalFallback { share: 1.0 }
    }
}

fn scale(v: u64, share: f64, min: u64) -> u64 {
    ((v as f64 * share).round() as u64).max(min)
}

/// The policy at `share` of each quota (see [`FailurePolicy::LocalFallback`]).
pub(super) fn scaled_policy(policy: &Policy, share: f64) -> Result<Policy, ConfigError> {
    if !(share > 0.0 && share <= 1.0) {
        return Err(ConfigError::Store(format!(
            "fallback share must be in (0, 1], got {share}"
        )));
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
        assert_eq!(l[1].quota().limit(), 4); // 3.5 rounds to 4
        assert_eq!(l[1].quota().period(), Duration::from_secs(60));
        assert_eq!(l[2].quota().emission_interval(), Duration::from_millis(500));
        assert_eq!(
            l[2].algorithm(),
            Algorithm::LeakyQueue {
                queue: 3,
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
