//! What is observed of decisions: `tracing` events always, metrics through the `metrics`
//! facade with the feature `metrics` (no exporter is chosen for you).
//! The metrics and events are listed in the crate docs ("Watching").

use std::{
    hash::{Hash, Hasher},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{SystemTime, UNIX_EPOCH},
};

use crate::decision::{Decision, Source};
use crate::error::StoreError;
use crate::key::KeyExtractor;
use crate::options::{MissingKey, OnStoreError};

/// A layer's observer: its label and its rate of warnings.
#[derive(Debug)]
pub(crate) struct Observe {
    label: Arc<str>,
    warned: OncePerSecond,
    #[cfg(feature = "metrics")]
    degraded: [metrics::Counter; 4],
    /// Requests exempted, and requests denied, by the layer's lists and skip rule.
    #[cfg(feature = "metrics")]
    screened: [metrics::Counter; 2],
}

/// Gives every metric its unit and description (the exporter's `HELP` and unit), in the
/// recorder installed now; cheap, and repeated at every layer or store build.
#[cfg(feature = "metrics")]
pub(crate) fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "tollgate.rate_limit.requests",
        Unit::Count,
        "Rate-limit decisions, by layer, policy and result"
    );
    describe_counter!(
        "tollgate.in_flight.requests",
        Unit::Count,
        "In-flight limit decisions, by layer and result"
    );
    describe_counter!(
        "tollgate.rate_limit.screened",
        Unit::Count,
        "Requests never limited (skipped or on an allow list) or denied (on a deny list)"
    );
    describe_histogram!(
        "tollgate.rate_limit.request.time_in_queue",
        Unit::Seconds,
        "How long admitted requests waited in a leaky-bucket queue"
    );
    describe_counter!(
        "tollgate.rate_limit.degraded_decisions",
        Unit::Count,
        "Decisions made without the store's backend or from its negative cache"
    );
    describe_histogram!(
        "tollgate.store.operation.duration",
        Unit::Seconds,
        "Duration of calls to a network store"
    );
    describe_counter!(
        "tollgate.store.errors",
        Unit::Count,
        "Failed store calls, by error type"
    );
    describe_gauge!(
        "tollgate.store.breaker.state",
        "Circuit breaker state: 0 closed, 1 half-open, 2 open"
    );
    describe_gauge!("tollgate.store.keys", Unit::Count, "Keys held in memory");
    describe_counter!(
        "tollgate.store.evictions",
        Unit::Count,
        "Keys evicted from memory: back to fresh, or with state to fit the memory budget"
    );
}

/// An outage event: `WARN` for the first of each second counted by `$once` (a
/// [`OncePerSecond`](crate::limiter::OncePerSecond) of the layer or store), `DEBUG` for the
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

pub(crate) fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn policy_label(name: Option<&str>) -> &str {
    name.unwrap_or("default")
}

impl Observe {
    pub(crate) fn new(label: Arc<str>) -> Self {
        #[cfg(feature = "metrics")]
        describe();
        Observe {
            #[cfg(feature = "metrics")]
            degraded: ["negative_cache", "fallback", "fail_open", "fail_closed"].map(|s| {
                metrics::counter!(
                    "tollgate.rate_limit.degraded_decisions",
                    "tollgate.limiter" => label.to_string(),
                    "tollgate.source" => s
                )
            }),
            #[cfg(feature = "metrics")]
            screened: ["exempt", "denied"].map(|s| {
                metrics::counter!(
                    "tollgate.rate_limit.screened",
                    "tollgate.limiter" => label.to_string(),
                    "tollgate.result" => s
                )
            }),
            label,
            warned: OncePerSecond::default(),
        }
    }

    /// A request exempt from the limit (skipped, or on an allow list).
    #[inline]
    pub(crate) fn exempt(&self) {
        #[cfg(feature = "metrics")]
        self.screened[0].increment(1);
    }

    /// A request on a deny list.
    pub(crate) fn denied(&self, route: Option<&str>) {
        #[cfg(feature = "metrics")]
        self.screened[1].increment(1);
        tracing::debug!(target: "tollgate", limiter = %self.label, route, "request denied by a deny list");
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    /// The metrics of one policy of the layer's set.
    pub(crate) fn policy(&self, name: Option<&str>) -> PolicyMetrics {
        #[cfg(feature = "metrics")]
        {
            let (limiter, policy) = (self.label.to_string(), policy_label(name).to_owned());
            let requests = |result: &'static str| {
                metrics::counter!(
                    "tollgate.rate_limit.requests",
                    "tollgate.limiter" => limiter.clone(),
                    "tollgate.policy" => policy.clone(),
                    "tollgate.result" => result
                )
            };
            PolicyMetrics {
                admitted: requests("admitted"),
                delayed: requests("delayed"),
                refused: requests("refused"),
                shadow_refused: requests("shadow_refused"),
                in_queue: metrics::histogram!(
                    "tollgate.rate_limit.request.time_in_queue",
                    "tollgate.limiter" => limiter.clone(),
                    "tollgate.policy" => policy.clone()
                ),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = name;
            PolicyMetrics {}
        }
    }

    /// A decision other than a plain admission: a refusal, a request a limit in shadow
    /// would have refused, or a decision a store made without its backend or from its
    /// negative cache. Those made without the backend are logged as an outage is (at most
    /// one warning a second), not one event per request.
    #[cold]
    pub(crate) fn decided<K: Hash>(
        &self,
        policy: Option<&str>,
        route: Option<&str>,
        key: &K,
        d: &Decision,
    ) {
        match d.source() {
            Source::Fallback | Source::FailOpen | Source::FailClosed => {
                self.degraded(policy, route, d)
            }
            source => {
                #[cfg(feature = "metrics")]
                if source == Source::NegativeCache {
                    self.degraded[0].increment(1);
                }
                let _ = source;
                if !d.is_allowed() || d.shadowed() {
                    self.refused(policy, route, key, d);
                }
            }
        }
    }

    /// A refusal, or a request a shadow limit would have refused. The key's hash and the
    /// fields are computed only when a subscriber wants the event.
    fn refused<K: Hash>(&self, policy: Option<&str>, route: Option<&str>, key: &K, d: &Decision) {
        let retry_after_ms = || d.retry_after().map(|r| r.as_millis() as u64);
        if d.shadowed() {
            tracing::info!(
                target: "tollgate",
                limiter = %self.label,
                policy = policy_label(policy),
                route,
                key = %format_args!("{:016x}", key_hash(key)),
                retry_after_ms = retry_after_ms(),
                "a shadow rate limit would have refused this request (let through)"
            );
        } else {
            tracing::info!(
                target: "tollgate",
                limiter = %self.label,
                policy = policy_label(policy),
                route,
                key = %format_args!("{:016x}", key_hash(key)),
                retry_after_ms = retry_after_ms(),
                outcome = ?d.outcome(),
                "rate limit refused a request"
            );
        }
    }

    /// A store call failed; the layer's `OnStoreError` decides.
    pub(crate) fn store_failed(
        &self,
        policy: Option<&str>,
        route: Option<&str>,
        error: &StoreError,
        then: OnStoreError,
    ) {
        #[cfg(feature = "metrics")]
        self.degraded[if then == OnStoreError::FailOpen { 2 } else { 3 }].increment(1);
        outage!(
            self.warned,
            "tollgate",
            limiter = %self.label,
            policy = policy_label(policy),
            route,
            %error,
            then = ?then,
            "rate-limit store failed"
        );
    }

    /// A decision a store made without its backend.
    fn degraded(&self, policy: Option<&str>, route: Option<&str>, d: &Decision) {
        let source = d.source();
        #[cfg(feature = "metrics")]
        self.degraded[match source {
            Source::Fallback => 1,
            Source::FailOpen => 2,
            _ => 3,
        }]
        .increment(1);
        outage!(
            self.warned,
            "tollgate",
            limiter = %self.label,
            policy = policy_label(policy),
            route,
            ?source,
            admitted = d.is_allowed(),
            retry_after_ms = d.retry_after().map(|r| r.as_millis() as u64),
            "rate-limit store unavailable: decided without it"
        );
    }
}

/// The metrics of one policy, registered when it is installed.
#[derive(Debug)]
pub(crate) struct PolicyMetrics {
    #[cfg(feature = "metrics")]
    admitted: metrics::Counter,
    #[cfg(feature = "metrics")]
    delayed: metrics::Counter,
    #[cfg(feature = "metrics")]
    refused: metrics::Counter,
    #[cfg(feature = "metrics")]
    shadow_refused: metrics::Counter,
    #[cfg(feature = "metrics")]
    in_queue: metrics::Histogram,
}

impl PolicyMetrics {
    #[inline]
    pub(crate) fn decided(&self, d: &Decision) {
        #[cfg(feature = "metrics")]
        {
            if d.shadowed() {
                self.shadow_refused.increment(1);
            } else if !d.is_allowed() {
                self.refused.increment(1);
            } else if d.wait().is_zero() {
                self.admitted.increment(1);
            } else {
                self.delayed.increment(1);
                self.in_queue.record(d.wait().as_secs_f64());
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = d;
    }
}

/// A store's metrics (feature `metrics`): operations, errors, keys, evictions.
#[derive(Debug, Clone)]
pub(crate) struct StoreMetrics {
    #[cfg(feature = "metrics")]
    inner: Arc<StoreHandles>,
}

#[cfg(feature = "metrics")]
#[derive(Debug)]
struct StoreHandles {
    ok: metrics::Histogram,
    failed: metrics::Histogram,
    errors: [metrics::Counter; 3],
    breaker: metrics::Gauge,
    keys: metrics::Gauge,
    evicted_fresh: metrics::Counter,
    evicted_with_state: metrics::Counter,
}

impl StoreMetrics {
    pub(crate) fn new(label: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            describe();
            let store = label.to_owned();
            let duration = |outcome: &'static str| {
                metrics::histogram!(
                    "tollgate.store.operation.duration",
                    "tollgate.store" => store.clone(),
                    "tollgate.outcome" => outcome
                )
            };
            let evictions = |state: &'static str| {
                metrics::counter!(
                    "tollgate.store.evictions",
                    "tollgate.store" => store.clone(),
                    "tollgate.state" => state
                )
            };
            StoreMetrics {
                inner: Arc::new(StoreHandles {
                    ok: duration("ok"),
                    failed: duration("error"),
                    errors: ["timeout", "circuit_open", "backend"].map(|t| {
                        metrics::counter!(
                            "tollgate.store.errors",
                            "tollgate.store" => store.clone(),
                            "error.type" => t
                        )
                    }),
                    breaker: metrics::gauge!("tollgate.store.breaker.state", "tollgate.store" => store.clone()),
                    keys: metrics::gauge!("tollgate.store.keys", "tollgate.store" => store.clone()),
                    evicted_fresh: evictions("fresh"),
                    evicted_with_state: evictions("with_state"),
                }),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = label;
            StoreMetrics {}
        }
    }

    /// One store call: its duration in seconds, and its error if it failed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn operation(&self, seconds: f64, error: Option<&StoreError>) {
        #[cfg(feature = "metrics")]
        match error {
            None => self.inner.ok.record(seconds),
            Some(e) => {
                self.inner.failed.record(seconds);
                let i = match e {
                    StoreError::Timeout(_) => 0,
                    StoreError::CircuitOpen => 1,
                    _ => 2,
                };
                self.inner.errors[i].increment(1);
            }
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (seconds, error);
    }

    /// The breaker moved to `state` (0 closed, 1 half-open, 2 open).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn breaker(&self, state: u8) {
        #[cfg(feature = "metrics")]
        self.inner.breaker.set(f64::from(state));
        #[cfg(not(feature = "metrics"))]
        let _ = state;
    }

    /// Keys added (positive) or removed.
    #[inline]
    pub(crate) fn keys(&self, delta: i64) {
        #[cfg(feature = "metrics")]
        if delta >= 0 {
            self.inner.keys.increment(delta as f64);
        } else {
            self.inner.keys.decrement(-delta as f64);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = delta;
    }

    /// Keys evicted: back to fresh (nothing lost), or still carrying state.
    pub(crate) fn evicted(&self, fresh: u64, with_state: u64) {
        #[cfg(feature = "metrics")]
        {
            self.inner.evicted_fresh.increment(fresh);
            self.inner.evicted_with_state.increment(with_state);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (fresh, with_state);
        self.keys(-((fresh + with_state) as i64));
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
