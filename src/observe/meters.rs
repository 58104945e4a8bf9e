//! The metric handles of layers and stores (feature `metrics`): the names, a handle that
//! finds its recorder when it is used, and the metrics of a policy, a store and an
//! in-flight limit. Without the feature every type here is empty and every call does
//! nothing.
//!
//! A handle is registered with the first recorder in force (the thread's local recorder,
//! else the global one) when it is built or, if none was installed then, at its first use
//! once one is: a recorder installed after the layers are built still gets everything.
//! Until then each use looks for one (a thread-local read and an atomic load) and records
//! nothing. The facade's no-op recorder cannot be told from another zero-sized recorder:
//! with one of those, a counter or a histogram is registered for each use (never kept),
//! and the gauges of things held (queued requests, leases) are not recorded.

use std::collections::HashMap;
#[cfg(feature = "metrics")]
use std::sync::OnceLock;
use std::sync::{PoisonError, RwLock};

use crate::decision::Decision;
use crate::error::StoreError;

pub(crate) const RATE_LIMIT_REQUESTS: &str = "tollgate.rate_limit.requests_total";
const IN_FLIGHT_REQUESTS: &str = "tollgate.in_flight.requests_total";
pub(crate) const SCREENED: &str = "tollgate.rate_limit.screened_total";
const TIME_IN_QUEUE: &str = "tollgate.rate_limit.request.time_in_queue_seconds";
const QUEUED: &str = "tollgate.rate_limit.queued_requests";
const ACTIVE_LEASES: &str = "tollgate.in_flight.active_leases";
pub(crate) const DEGRADED: &str = "tollgate.rate_limit.degraded_decisions_total";
const OPERATION: &str = "tollgate.store.operation.duration_seconds";
const ERRORS: &str = "tollgate.store.errors_total";
const BREAKER: &str = "tollgate.store.breaker.state";
const KEYS: &str = "tollgate.store.keys";
const EVICTIONS: &str = "tollgate.store.evictions_total";

/// Gives every metric its unit and description (the exporter's `HELP` and unit), in the
/// recorder in force; repeated when a layer or a store is built and when a handle finds
/// its recorder.
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        RATE_LIMIT_REQUESTS,
        Unit::Count,
        "Rate-limit decisions, by layer, policy and result"
    );
    describe_counter!(
        IN_FLIGHT_REQUESTS,
        Unit::Count,
        "In-flight limit decisions, by layer and result"
    );
    describe_counter!(
        SCREENED,
        Unit::Count,
        "Requests never limited (skipped or on an allow list) or denied (on a deny list)"
    );
    describe_histogram!(
        TIME_IN_QUEUE,
        Unit::Seconds,
        "How long admitted requests waited in a leaky-bucket queue"
    );
    describe_gauge!(
        QUEUED,
        Unit::Count,
        "Admitted requests waiting in a leaky-bucket queue now"
    );
    describe_gauge!(
        ACTIVE_LEASES,
        Unit::Count,
        "Requests holding an in-flight slot now"
    );
    describe_counter!(
        DEGRADED,
        Unit::Count,
        "Decisions made without the store's backend or from its negative cache"
    );
    describe_histogram!(
        OPERATION,
        Unit::Seconds,
        "Duration of calls to a network store"
    );
    describe_counter!(ERRORS, Unit::Count, "Failed store calls, by error type");
    describe_gauge!(
        BREAKER,
        "Circuit breaker state: 0 closed, 1 half-open, 2 open"
    );
    describe_gauge!(KEYS, Unit::Count, "Keys held in memory");
    describe_counter!(
        EVICTIONS,
        Unit::Count,
        "Keys evicted from memory: back to fresh, or with state to fit the memory budget"
    );
}

/// When a handle is registered, if a recorder is in force: when built (a series every
/// layer or store of its kind has, shown from the start), or at its first use (a series
/// only some have, such as a store failure's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bind {
    Now,
    FirstUse,
}

#[cfg(feature = "metrics")]
static META: metrics::Metadata<'static> =
    metrics::Metadata::new("tollgate", metrics::Level::INFO, Some("tollgate"));

/// A kind of handle, as a recorder registers it.
#[cfg(feature = "metrics")]
trait Handle: Sized {
    fn register(r: &dyn metrics::Recorder, key: &metrics::Key) -> Self;
}

#[cfg(feature = "metrics")]
impl Handle for metrics::Counter {
    fn register(r: &dyn metrics::Recorder, key: &metrics::Key) -> Self {
        r.register_counter(key, &META)
    }
}

#[cfg(feature = "metrics")]
impl Handle for metrics::Gauge {
    fn register(r: &dyn metrics::Recorder, key: &metrics::Key) -> Self {
        r.register_gauge(key, &META)
    }
}

#[cfg(feature = "metrics")]
impl Handle for metrics::Histogram {
    fn register(r: &dyn metrics::Recorder, key: &metrics::Key) -> Self {
        r.register_histogram(key, &META)
    }
}

/// One metric of one label set, kept once registered with a recorder (see the module
/// docs).
#[cfg(feature = "metrics")]
#[derive(Debug)]
struct Lazy<H> {
    key: metrics::Key,
    bound: OnceLock<H>,
}

#[cfg(feature = "metrics")]
impl<H: Handle> Lazy<H> {
    fn new(name: &'static str, labels: &[(&'static str, &str)], bind: Bind) -> Self {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|&(k, v)| metrics::Label::new(k, v.to_owned()))
            .collect();
        let lazy = Lazy {
            key: metrics::Key::from_parts(name, labels),
            bound: OnceLock::new(),
        };
        if bind == Bind::Now {
            lazy.bound();
        }
        lazy
    }

    /// The handle registered with a recorder, registering it now if one is in force.
    #[inline]
    fn bound(&self) -> Option<&H> {
        match self.bound.get() {
            Some(h) => Some(h),
            None => self.find(),
        }
    }

    #[cold]
    fn find(&self) -> Option<&H> {
        metrics::with_recorder(|r| {
            (std::mem::size_of_val(r) != 0).then(|| {
                describe();
                self.bound.get_or_init(|| H::register(r, &self.key))
            })
        })
    }

    /// `f` on the registered handle, or on one registered for this use with a
    /// zero-sized recorder; told whether the handle was registered just now.
    #[inline]
    fn with(&self, f: impl FnOnce(&H, bool)) {
        match self.bound.get() {
            Some(h) => f(h, false),
            None => self.unbound(f),
        }
    }

    #[cold]
    fn unbound(&self, f: impl FnOnce(&H, bool)) {
        metrics::with_recorder(|r| {
            if std::mem::size_of_val(r) == 0 {
                f(&H::register(r, &self.key), false);
            } else {
                describe();
                f(self.bound.get_or_init(|| H::register(r, &self.key)), true);
            }
        })
    }
}

/// A counter.
#[derive(Debug)]
pub(crate) struct Count {
    #[cfg(feature = "metrics")]
    lazy: Lazy<metrics::Counter>,
}

impl Count {
    pub(crate) fn new(name: &'static str, labels: &[(&'static str, &str)], bind: Bind) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (name, labels, bind);
        Count {
            #[cfg(feature = "metrics")]
            lazy: Lazy::new(name, labels, bind),
        }
    }

    #[inline]
    pub(crate) fn add(&self, n: u64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|c, _| c.increment(n));
        #[cfg(not(feature = "metrics"))]
        let _ = n;
    }
}

/// A gauge.
#[derive(Debug)]
pub(crate) struct Level {
    #[cfg(feature = "metrics")]
    lazy: Lazy<metrics::Gauge>,
}

impl Level {
    fn new(name: &'static str, labels: &[(&'static str, &str)], bind: Bind) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (name, labels, bind);
        Level {
            #[cfg(feature = "metrics")]
            lazy: Lazy::new(name, labels, bind),
        }
    }

    fn set(&self, value: f64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|g, _| g.set(value));
        #[cfg(not(feature = "metrics"))]
        let _ = value;
    }

    /// Adds `delta` (negative: takes away); a gauge registered just now starts from
    /// `total` instead, which counts what it missed.
    #[inline]
    fn add(&self, delta: f64, total: impl FnOnce() -> f64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|g, now| match now {
            true => g.set(total()),
            false if delta >= 0.0 => g.increment(delta),
            false => g.decrement(-delta),
        });
        #[cfg(not(feature = "metrics"))]
        let _ = (delta, total);
    }

    /// One more held until the guard drops (counted only with a recorder the handle is
    /// registered with, so that the two steps always go to the same one).
    #[inline]
    fn hold(&self) -> Held {
        #[cfg(feature = "metrics")]
        {
            Held(self.lazy.bound().map(|g| {
                g.increment(1.0);
                g.clone()
            }))
        }
        #[cfg(not(feature = "metrics"))]
        Held {}
    }
}

/// One unit of a gauge (a queued request, a lease), given back when dropped.
#[derive(Debug)]
pub(crate) struct Held(#[cfg(feature = "metrics")] Option<metrics::Gauge>);

impl Drop for Held {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(g) = &self.0 {
            g.decrement(1.0);
        }
    }
}

/// A histogram.
#[derive(Debug)]
pub(crate) struct Timing {
    #[cfg(feature = "metrics")]
    lazy: Lazy<metrics::Histogram>,
}

impl Timing {
    fn new(name: &'static str, labels: &[(&'static str, &str)], bind: Bind) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (name, labels, bind);
        Timing {
            #[cfg(feature = "metrics")]
            lazy: Lazy::new(name, labels, bind),
        }
    }

    fn record(&self, value: f64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|h, _| h.record(value));
        #[cfg(not(feature = "metrics"))]
        let _ = value;
    }
}

/// The results a rate-limit decision is counted under, in the order of the counts.
const RESULTS: [&str; 4] = ["admitted", "delayed", "refused", "shadow_refused"];

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
enum Requests {
    Plain([Count; 4]),
    ByRoute(RouteCounts),
}

/// Decisions by matched route (a bounded set: the router's templates).
#[derive(Debug)]
struct RouteCounts {
    limiter: Box<str>,
    policy: Box<str>,
    routes: RwLock<HashMap<Box<str>, [Count; 4]>>,
}

impl RouteCounts {
    fn counts(&self, route: &str) -> [Count; 4] {
        RESULTS.map(|result| {
            Count::new(
                RATE_LIMIT_REQUESTS,
                &[
                    ("tollgate.limiter", &self.limiter),
                    ("tollgate.policy", &self.policy),
                    ("tollgate.route", route),
                    ("tollgate.result", result),
                ],
                Bind::Now,
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
                Count::new(RATE_LIMIT_REQUESTS, &l, Bind::Now)
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
    #[cfg(feature = "metrics")]
    inner: std::sync::Arc<StoreHandles>,
}

#[cfg(feature = "metrics")]
#[derive(Debug)]
struct StoreHandles {
    ok: Timing,
    failed: Timing,
    errors: [Count; 3],
    breaker: Level,
    keys: Level,
    /// The keys held, for a gauge registered after some were added.
    held: std::sync::atomic::AtomicI64,
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
        #[cfg(feature = "metrics")]
        {
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
                inner: std::sync::Arc::new(StoreHandles {
                    ok: duration("ok"),
                    failed: duration("error"),
                    errors: ["timeout", "circuit_open", "backend"]
                        .map(|t| Count::new(ERRORS, &[store, ("error.type", t)], net)),
                    breaker: Level::new(BREAKER, &[store], net),
                    keys: Level::new(KEYS, &[store], mem),
                    held: std::sync::atomic::AtomicI64::new(0),
                    evicted_fresh: evictions("fresh"),
                    evicted_with_state: evictions("with_state"),
                }),
            }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = (label, network);
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
                self.inner.errors[i].add(1);
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
        {
            use std::sync::atomic::Ordering::Relaxed;
            let held = self.inner.held.fetch_add(delta, Relaxed) + delta;
            self.inner.keys.add(delta as f64, || held as f64);
        }
        #[cfg(not(feature = "metrics"))]
        let _ = delta;
    }

    /// Keys evicted: back to fresh (nothing lost), or still carrying state.
    pub(crate) fn evicted(&self, fresh: u64, with_state: u64) {
        #[cfg(feature = "metrics")]
        {
            self.inner.evicted_fresh.add(fresh);
            self.inner.evicted_with_state.add(with_state);
        }
        self.keys(-((fresh + with_state) as i64));
    }
}

/// What became of a request at an in-flight limit, for the metrics.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counted {
    Admitted = 0,
    Refused = 1,
    FailOpen = 2,
    FailClosed = 3,
}

/// An in-flight limit's metrics: its decisions, and the slots held now.
#[derive(Debug)]
pub(crate) struct InFlightMetrics {
    requests: [Count; 4],
    active: Level,
}

impl InFlightMetrics {
    /// The metrics of the in-flight limit labelled `limiter`.
    pub(crate) fn new(limiter: &str) -> Self {
        let l = ("tollgate.limiter", limiter);
        InFlightMetrics {
            requests: ["admitted", "refused", "fail_open", "fail_closed"]
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
