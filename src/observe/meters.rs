//! What each layer and store counts: a policy's decisions (by matched route on request),
//! its queue and its time in queue; a store's keys and evictions, or its calls, errors
//! and breaker; an in-flight limit's decisions and leases.

use std::collections::HashMap;
#[cfg(feature = "metrics")]
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use super::handles::{
    Bind, Count, Held, Level, Timing, ACTIVE_LEASES, BREAKER, BREAKER_OPENINGS, ERRORS, EVICTIONS,
    IN_FLIGHT_REQUESTS, KEYS, OPERATION, QUEUED, RATE_LIMIT_REQUESTS, TIME_IN_QUEUE,
};
use crate::decision::Decision;
use crate::error::StoreError;

/// The results a rate-limit decision is counted under, in the order of the counts.
/// `deadline`: a queued request refused because its slot came after its deadline; that
/// series appears with its first such request (see [`bind`]).
const RESULTS: [&str; 5] = [
    "admitted",
    "delayed",
    "refused",
    "shadow_refused",
    "deadline",
];

/// When a result's series is registered: at once, but for deadline refusals, which only
/// layers whose requests carry deadlines see.
fn bind(result: &str) -> Bind {
    if result == "deadline" {
        Bind::FirstUse
    } else {
        Bind::Now
    }
}

/// The most routes a layer counts apart; the others are counted as `other`.
const MAX_ROUTES: usize = 256;

/// The metrics of one policy of a layer's set, registered when it is installed.
#[derive(Debug)]
pub(crate) struct PolicyMetrics {
    /// The decisions by result, or by route and result.
    requests: Requests,
    in_queue: Timing,
    queued: Level,
}

#[derive(Debug)]
// The large variant is the common one, read in place on every request.
#[allow(clippy::large_enum_variant)]
enum Requests {
    Plain([Count; 5]),
    ByRoute(RouteCounts),
}

/// Decisions by matched route (a bounded set: the router's templates).
#[derive(Debug)]
struct RouteCounts {
    limiter: Box<str>,
    policy: Box<str>,
    routes: RwLock<HashMap<Box<str>, [Count; 5]>>,
}

impl RouteCounts {
    fn counts(&self, route: &str) -> [Count; 5] {
        RESULTS.map(|result| {
            Count::new(
                RATE_LIMIT_REQUESTS,
                &[
                    ("tollgate.limiter", &self.limiter),
                    ("tollgate.policy", &self.policy),
                    ("tollgate.route", route),
                    ("tollgate.result", result),
                ],
                bind(result),
            )
        })
    }

    fn add(&self, route: Option<&str>, result: usize) {
        let route = route.unwrap_or("unmatched");
        if let Some(c) = self
            .routes
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(route)
        {
            return c[result].add(1);
        }
        let mut routes = self.routes.write().unwrap_or_else(PoisonError::into_inner);
        let route = if routes.len() >= MAX_ROUTES && !routes.contains_key(route) {
            "other"
        } else {
            route
        };
        if !routes.contains_key(route) {
            let counts = self.counts(route);
            routes.insert(route.into(), counts);
        }
        routes[route][result].add(1);
    }
}

impl PolicyMetrics {
    /// The metrics of the policy named `policy` of the layer labelled `limiter`; its
    /// decisions counted by matched route too when `by_route`.
    pub(crate) fn new(limiter: &str, policy: &str, by_route: bool) -> Self {
        let labels = [("tollgate.limiter", limiter), ("tollgate.policy", policy)];
        let requests = if by_route {
            Requests::ByRoute(RouteCounts {
                limiter: limiter.into(),
                policy: policy.into(),
                routes: RwLock::default(),
            })
        } else {
            Requests::Plain(RESULTS.map(|result| {
                let mut l = labels.to_vec();
                l.push(("tollgate.result", result));
                Count::new(RATE_LIMIT_REQUESTS, &l, bind(result))
            }))
        };
        PolicyMetrics {
            requests,
            in_queue: Timing::new(TIME_IN_QUEUE, &labels, Bind::Now),
            queued: Level::new(QUEUED, &labels, Bind::Now),
        }
    }

    /// Counts a decision (under its matched route, given by `route`, when the layer
    /// counts by route).
    #[inline]
    pub(crate) fn decided<'r>(&self, d: &Decision, route: impl FnOnce() -> Option<&'r str>) {
        let result = if d.shadowed() {
            3
        } else if !d.is_allowed() {
            2
        } else if d.wait().is_zero() {
            0
        } else {
            self.in_queue.record(d.wait().as_secs_f64());
            1
        };
        self.count(result, route);
    }

    /// Counts a queued request refused because its slot came after its deadline.
    pub(crate) fn late<'r>(&self, route: impl FnOnce() -> Option<&'r str>) {
        self.count(4, route);
    }

    #[inline]
    fn count<'r>(&self, result: usize, route: impl FnOnce() -> Option<&'r str>) {
        match &self.requests {
            Requests::Plain(counts) => counts[result].add(1),
            Requests::ByRoute(routes) => routes.add(route(), result),
        }
    }

    /// A request waiting in the queue until the guard drops.
    pub(crate) fn queued(&self) -> Held {
        self.queued.hold()
    }
}

/// A store's metrics: keys and evictions of a store in memory, operations, errors and the
/// circuit breaker of a network store.
#[derive(Debug, Clone)]
pub(crate) struct StoreMetrics {
    inner: Arc<StoreHandles>,
}

#[derive(Debug)]
struct StoreHandles {
    ok: Timing,
    failed: Timing,
    errors: [Count; 3],
    breaker: Level,
    openings: Count,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    keys: Level,
    /// The keys held, for a gauge registered after some were added.
    #[cfg(feature = "metrics")]
    held: AtomicI64,
    evicted_fresh: Count,
    evicted_with_state: Count,
}

impl StoreMetrics {
    /// The metrics of a store in memory labelled `label`.
    pub(crate) fn new(label: &str) -> Self {
        Self::of(label, false)
    }

    /// The metrics of a network store labelled `label`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn network(label: &str) -> Self {
        Self::of(label, true)
    }

    /// Each kind's series are registered when it is built, the other kind's never (they
    /// are never used).
    fn of(label: &str, network: bool) -> Self {
        let (net, mem) = if network {
            (Bind::Now, Bind::FirstUse)
        } else {
            (Bind::FirstUse, Bind::Now)
        };
        let store = ("tollgate.store", label);
        let duration =
            |outcome| Timing::new(OPERATION, &[store, ("tollgate.outcome", outcome)], net);
        let evictions = |state| Count::new(EVICTIONS, &[store, ("tollgate.state", state)], mem);
        StoreMetrics {
            inner: Arc::new(StoreHandles {
                ok: duration("ok"),
                failed: duration("error"),
                errors: ["timeout", "circuit_open", "backend"]
                    .map(|t| Count::new(ERRORS, &[store, ("error.type", t)], net)),
                breaker: Level::new(BREAKER, &[store], net),
                openings: Count::new(BREAKER_OPENINGS, &[store], Bind::FirstUse),
                keys: Level::new(KEYS, &[store], mem),
                #[cfg(feature = "metrics")]
                held: AtomicI64::new(0),
                evicted_fresh: evictions("fresh"),
                evicted_with_state: evictions("with_state"),
            }),
        }
    }

    /// One store call: its duration in seconds, and its error if it failed.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    #[inline]
    pub(crate) fn operation(&self, seconds: f64, error: Option<&StoreError>) {
        match error {
            None => self.inner.ok.record(seconds),
            Some(e) => {
                self.inner.failed.record(seconds);
                let i = match e {
                    StoreError::Timeout(_) => 0,
                    StoreError::CircuitOpen => 1,
                    _ => 2,
                };
                self.inner.errors[i].add(1);
            }
        }
    }

    /// The breaker moved to `state` (0 closed, 1 half-open, 2 open).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn breaker(&self, state: u8) {
        self.inner.breaker.set(f64::from(state));
        if state == 2 {
            self.inner.openings.add(1);
        }
    }

    /// Keys added (positive) or removed.
    #[inline]
    pub(crate) fn keys(&self, delta: i64) {
        #[cfg(feature = "metrics")]
        {
            let held = self.inner.held.fetch_add(delta, Ordering::Relaxed) + delta;
            self.inner.keys.add(delta as f64, || held as f64);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = delta;
    }

    /// Keys evicted: back to fresh (nothing lost), or still carrying state.
    pub(crate) fn evicted(&self, fresh: u64, with_state: u64) {
        self.inner.evicted_fresh.add(fresh);
        self.inner.evicted_with_state.add(with_state);
        self.keys(-((fresh + with_state) as i64));
    }
}

/// What became of a request at an in-flight limit, for the metrics: in the order of
/// [`InFlightMetrics`]'s results, so each is its counter's index.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counted {
    Admitted,
    Refused,
    FailOpen,
    FailClosed,
    /// Refused at its deadline, still waiting for a slot.
    Deadline,
}

/// An in-flight limit's metrics: its decisions, and the slots held now.
#[derive(Debug)]
pub(crate) struct InFlightMetrics {
    requests: [Count; 5],
    active: Level,
}

impl InFlightMetrics {
    /// The metrics of the in-flight limit labelled `limiter`.
    pub(crate) fn new(limiter: &str) -> Self {
        let l = ("tollgate.limiter", limiter);
        InFlightMetrics {
            requests: [
                "admitted",
                "refused",
                "fail_open",
                "fail_closed",
                "deadline",
            ]
            .map(|r| Count::new(IN_FLIGHT_REQUESTS, &[l, ("tollgate.result", r)], Bind::Now)),
            active: Level::new(ACTIVE_LEASES, &[l], Bind::Now),
        }
    }

    /// Counts what became of a request.
    #[inline]
    pub(crate) fn count(&self, what: Counted) {
        self.requests[what as usize].add(1);
    }

    /// A slot held until the guard drops.
    #[inline]
    pub(crate) fn lease(&self) -> Held {
        self.active.hold()
    }
}

/// What became of a call through an upstream limit.
#[cfg(feature = "upstream")]
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sent {
    /// Sent upstream (after its wait, if any).
    Upstream,
    /// Not sent: no slot within the caller's wait.
    Refused,
    /// Sent without a decision: the store failed, failing open.
    FailOpen,
    /// Not sent: the store failed, failing closed.
    FailClosed,
}

/// An upstream limit's metrics: its calls by result, and the pauses its upstream asked
/// for, by field.
#[cfg(feature = "upstream")]
#[derive(Debug)]
pub(crate) struct UpstreamMetrics {
    calls: [Count; 4],
    pauses: [Count; 3],
}

#[cfg(feature = "upstream")]
impl UpstreamMetrics {
    /// The metrics of the upstream limit labelled `limiter`.
    pub(crate) fn new(limiter: &str) -> Self {
        use super::handles::{UPSTREAM_CALLS, UPSTREAM_PAUSES};
        let l = ("tollgate.limiter", limiter);
        UpstreamMetrics {
            calls: ["sent", "refused", "fail_open", "fail_closed"]
                .map(|r| Count::new(UPSTREAM_CALLS, &[l, ("tollgate.result", r)], Bind::Now)),
            pauses: ["retry_after", "ratelimit", "x_ratelimit"]
                .map(|f| Count::new(UPSTREAM_PAUSES, &[l, ("tollgate.field", f)], Bind::Now)),
        }
    }

    /// Counts a call.
    pub(crate) fn call(&self, what: Sent) {
        self.calls[what as usize].add(1);
    }

    /// Counts a pause asked for by the field numbered `field` (in the order above).
    pub(crate) fn pause(&self, field: usize) {
        self.pauses[field].add(1);
    }
}

/// A Redis connection's metrics: its replacements, by reason.
#[cfg(feature = "redis")]
#[derive(Debug)]
pub(crate) struct RedisMetrics {
    reconnects: [Count; 5],
}

#[cfg(feature = "redis")]
impl RedisMetrics {
    pub(crate) fn new() -> Self {
        RedisMetrics {
            reconnects: [
                "connection_lost",
                "readonly",
                "masterdown",
                "loading",
                "unresponsive",
            ]
            .map(|r| {
                Count::new(
                    super::handles::RECONNECTS,
                    &[("tollgate.reason", r)],
                    Bind::FirstUse,
                )
            }),
        }
    }

    /// A replacement of the connection began, for `reason` (its index in the list above).
    pub(crate) fn reconnecting(&self, reason: usize) {
        self.reconnects[reason].add(1);
    }
}
