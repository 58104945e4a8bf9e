//! What is observed of decisions: `tracing` events always, metrics through the `metrics`
//! facade with the feature `metrics` (no exporter is chosen for you; see [`handles`]).
//! The metrics and events are listed in the observability guide.

mod handles;
mod meters;

use std::{
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{SystemTime, UNIX_EPOCH},
};

pub(crate) use self::handles::{Bind, Count, Held, RATE_LIMIT_REQUESTS};
#[cfg(feature = "listener")]
pub(crate) use self::handles::{Level, CLOSED_CONNECTIONS, CONNECTIONS, OPEN_CONNECTIONS};
use self::handles::{DEGRADED, SCREENED};
#[cfg(feature = "redis")]
pub(crate) use self::meters::RedisMetrics;
pub(crate) use self::meters::{Counted, InFlightMetrics, PolicyMetrics, StoreMetrics};
#[cfg(feature = "upstream")]
pub(crate) use self::meters::{Sent, UpstreamMetrics};
use crate::decision::{Decision, Source};
use crate::error::StoreError;
use crate::key::KeyExtractor;
use crate::options::{MissingKey, OnStoreError};
use crate::response::ms_up;

/// A layer's observer: its label and its rate of warnings.
#[derive(Debug)]
pub(crate) struct Observe {
    label: Arc<str>,
    warned: OncePerSecond,
    /// Whether the layer counts its decisions by matched route.
    by_route: bool,
    /// Decisions made without the store's backend, by source (registered at the first:
    /// a store that never fails never shows them).
    degraded: [Count; 4],
    /// Requests exempted, and requests denied, by the layer's lists and skip rule.
    screened: [Count; 2],
}

/// An outage event: `WARN` for the first of each second counted by `$once` (a
/// [`OncePerSecond`](crate::ratelimit::limiter::OncePerSecond) of the layer or store), `DEBUG` for the
/// others, so that an outage does not log every request.
macro_rules! outage {
    ($once:expr, $target:literal, $($event:tt)+) => {
        if $once.first($crate::observe::unix_secs()) {
            tracing::warn!(target: $target, $($event)+)
        } else {
            tracing::debug!(target: $target, $($event)+)
        }
    };
}
pub(crate) use outage;

/// An [`outage!`] event of a layer's [`Observe`]: its label, the policy and the route,
/// then the event's own fields and message.
macro_rules! layer_outage {
    ($observe:expr, $policy:expr, $route:expr, $($event:tt)+) => {
        outage!(
            $observe.warned,
            "tollgate",
            limiter = %$observe.label,
            policy = policy_label($policy),
            route = $route,
            $($event)+
        )
    };
}

pub(crate) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn policy_label(name: Option<&str>) -> &str {
    name.unwrap_or("default")
}

impl Observe {
    /// The observer of the layer labelled `label`, counting its decisions by matched
    /// route when `by_route`.
    pub(crate) fn new(label: Arc<str>, by_route: bool) -> Self {
        let l = ("tollgate.limiter", &*label);
        Observe {
            degraded: ["negative_cache", "fallback", "fail_open", "fail_closed"]
                .map(|s| Count::new(DEGRADED, &[l, ("tollgate.source", s)], Bind::FirstUse)),
            screened: ["exempt", "denied"]
                .map(|s| Count::new(SCREENED, &[l, ("tollgate.result", s)], Bind::Now)),
            by_route,
            label,
            warned: OncePerSecond::default(),
        }
    }

    /// A request exempt from the limit (skipped, or on an allow list).
    #[inline]
    pub(crate) fn exempt(&self) {
        self.screened[0].add(1);
    }

    /// A request on a deny list.
    pub(crate) fn denied(&self, route: Option<&str>) {
        self.screened[1].add(1);
        tracing::debug!(target: "tollgate", limiter = %self.label, route, "request denied by a deny list");
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The metrics of one policy of the layer's set.
    pub(crate) fn policy(&self, name: Option<&str>) -> PolicyMetrics {
        PolicyMetrics::new(&self.label, policy_label(name), self.by_route)
    }

    /// A decision other than a plain admission: a refusal, a request a limit in shadow
    /// would have refused, or a decision a store made without its backend or from its
    /// negative cache. Those made without the backend are logged as an outage is (at most
    /// one warning a second), not one event per request. `route` is read only for an
    /// event a subscriber wants.
    #[cold]
    pub(crate) fn decided<'r, K: Hash>(
        &self,
        policy: Option<&str>,
        route: &dyn Fn() -> Option<&'r str>,
        key: &K,
        d: &Decision,
    ) {
        match d.source() {
            Source::Fallback | Source::FailOpen | Source::FailClosed => {
                self.degraded(policy, route(), d)
            }
            source => {
                if source == Source::NegativeCache {
                    self.degraded[0].add(1);
                }
                if !d.is_allowed() || d.shadowed() {
                    self.refused(policy, route, key, d);
                }
            }
        }
    }

    /// A refusal, or a request a shadow limit would have refused. The key's hash and the
    /// fields are computed only when a subscriber wants the event. Each fact is one field:
    /// `outcome` (`denied`; `exceeds`: a cost no limit can ever admit; `shadowed`: let
    /// through by a shadow limit; `deadline`, from [`Observe::late`]) and, where there is
    /// one, the wait in `retry_after_ms`.
    fn refused<'r, K: Hash>(
        &self,
        policy: Option<&str>,
        route: &dyn Fn() -> Option<&'r str>,
        key: &K,
        d: &Decision,
    ) {
        let (outcome, message) = match d.retry_after() {
            _ if d.shadowed() => (
                "shadowed",
                "a shadow rate limit would have refused this request (let through)",
            ),
            Some(_) => ("denied", "rate limit refused a request"),
            None => ("exceeds", "rate limit refused a request"),
        };
        tracing::info!(
            target: "tollgate",
            limiter = %self.label,
            policy = policy_label(policy),
            route = route(),
            key = %format_args!("{:016x}", key_hash(key)),
            outcome,
            retry_after_ms = d.retry_after().map(ms_up),
            "{message}"
        );
    }

    /// A request refused because its turn in a queue comes after its deadline (`d`:
    /// denied, retry after its turn): an event like a refusal's, of outcome `deadline`.
    #[cold]
    pub(crate) fn late<'r, K: Hash>(
        &self,
        policy: Option<&str>,
        route: &dyn Fn() -> Option<&'r str>,
        key: &K,
        d: &Decision,
    ) {
        tracing::info!(
            target: "tollgate",
            limiter = %self.label,
            policy = policy_label(policy),
            route = route(),
            key = %format_args!("{:016x}", key_hash(key)),
            outcome = "deadline",
            retry_after_ms = d.retry_after().map(ms_up),
            "rate limit refused a request: its turn in the queue comes after its deadline"
        );
    }

    /// A store call failed; the layer's `OnStoreError` decides.
    pub(crate) fn store_failed(
        &self,
        policy: Option<&str>,
        route: Option<&str>,
        error: &StoreError,
        then: OnStoreError,
    ) {
        self.degraded[if then == OnStoreError::FailOpen { 2 } else { 3 }].add(1);
        layer_outage!(self, policy, route, %error, then = ?then, "rate-limit store failed");
    }

    /// A decision a store made without its backend.
    fn degraded(&self, policy: Option<&str>, route: Option<&str>, d: &Decision) {
        let source = d.source();
        self.degraded[match source {
            Source::Fallback => 1,
            Source::FailOpen => 2,
            _ => 3,
        }]
        .add(1);
        layer_outage!(
            self,
            policy,
            route,
            ?source,
            admitted = d.is_allowed(),
            retry_after_ms = d.retry_after().map(ms_up),
            "rate-limit store unavailable: decided without it"
        );
    }
}

/// A stable hash of a key: for events (keys never appear as they are) and for choosing
/// the keys a partly enforced limit applies to (the same choice in every process).
pub(crate) fn key_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x746f_6c6c_6761_7465, 0x6b65_7973);
    key.hash(&mut h);
    h.finish()
}

/// Counts refusals in a window of one second: the first store failure of each second is
/// logged at `warn`, the others at `debug` (an outage would otherwise log every request).
#[derive(Debug, Default)]
pub(crate) struct OncePerSecond(AtomicU64);

impl OncePerSecond {
    /// Whether this is the first call in the current second of `now_secs`.
    pub(crate) fn first(&self, now_secs: u64) -> bool {
        self.0.swap(now_secs, Ordering::Relaxed) != now_secs
    }
}

/// Events of one kind logged at most once per [`Throttle::INTERVAL_MS`]: the first is
/// logged, the others counted, and the next logged one says how many were left out (an
/// outage would otherwise log its breaker's every probe).
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    /// When the last event was logged, in the caller's milliseconds (0: never).
    last: AtomicU64,
    suppressed: AtomicU64,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Throttle {
    /// The shortest time between two logged events.
    pub(crate) const INTERVAL_MS: u64 = 10_000;

    /// `Some(n)` when an event at `now_ms` (milliseconds on any clock that does not go
    /// back, above 0) is to be logged, `n` the events left out since the last one logged;
    /// `None` when it is left out.
    pub(crate) fn first(&self, now_ms: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= Self::INTERVAL_MS;
        if due
            && self
                .last
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// A layer's one warning about keyless requests whose extractor says why (the server is
/// not set up to give it what it needs: no connection address, no matched route), since
/// such a setup quietly puts every client into one bucket. Shared by every layer kind.
#[derive(Debug, Default)]
pub(crate) struct KeylessWarning(AtomicBool);

impl KeylessWarning {
    #[cold]
    pub(crate) fn keyless<Req, X: KeyExtractor<Req>>(
        &self,
        key: &X,
        req: &Req,
        label: &str,
        missing: MissingKey,
        kind: &str,
    ) {
        if self.0.load(Ordering::Relaxed) {
            return;
        }
        if let Some(why) = key.misconfiguration(req) {
            if !self.0.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    target: "tollgate",
                    limiter = %label,
                    missing_key = ?missing,
                    "{kind} key missing: {why} (logged once per layer)"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    /// An outage's breaker opening again at every failed probe (twice a second) logs one
    /// line per 10 s, each saying how many it stands for.
    #[test]
    fn a_throttle_logs_once_per_interval_and_counts_the_rest() {
        let t = Throttle::default();
        let mut logged = Vec::new();
        for ms in (1..=25_000).step_by(500) {
            if let Some(left_out) = t.first(ms) {
                logged.push((ms, left_out));
            }
        }
        assert_eq!(logged, [(1, 0), (10_001, 19), (20_001, 19)]);
    }
}
