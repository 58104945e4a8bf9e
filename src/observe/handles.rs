//! The metric handles of layers and stores (feature `metrics`): the metrics' names and
//! descriptions, and handles that find their recorder when they are used. Without the
//! feature every type here is empty and every call does nothing.
//!
//! A handle is registered with the first recorder in force (the thread's local recorder,
//! else the global one) when it is built or, if none was installed then, at its first use
//! once one is: a recorder installed after the layers are built gets everything from then
//! on. Until then uses record nothing, and a thread that found no recorder looks again
//! only once every 64 uses (a look is a few dozen instructions; skipping one is a
//! thread-local read): a recorder installed while requests flow misses at most the 63
//! uses after it on each thread. A zero-sized recorder cannot be told from the facade's
//! no-op one, and is taken for it.

#[cfg(feature = "metrics")]
use std::sync::OnceLock;

pub(crate) const RATE_LIMIT_REQUESTS: &str = "tollgate.rate_limit.requests_total";
pub(crate) const IN_FLIGHT_REQUESTS: &str = "tollgate.in_flight.requests_total";
pub(crate) const SCREENED: &str = "tollgate.rate_limit.screened_total";
pub(crate) const TIME_IN_QUEUE: &str = "tollgate.rate_limit.request.time_in_queue_seconds";
pub(crate) const QUEUED: &str = "tollgate.rate_limit.queued_requests";
pub(crate) const ACTIVE_LEASES: &str = "tollgate.in_flight.active_leases";
pub(crate) const DEGRADED: &str = "tollgate.rate_limit.degraded_decisions_total";
pub(crate) const OPERATION: &str = "tollgate.store.operation.duration_seconds";
pub(crate) const ERRORS: &str = "tollgate.store.errors_total";
pub(crate) const BREAKER: &str = "tollgate.store.breaker.state";
pub(crate) const KEYS: &str = "tollgate.store.keys";
pub(crate) const EVICTIONS: &str = "tollgate.store.evictions_total";
// The listener's series, described with the others.
#[cfg_attr(not(feature = "listener"), allow(dead_code))]
pub(crate) const CONNECTIONS: &str = "tollgate.connections_total";
#[cfg_attr(not(feature = "listener"), allow(dead_code))]
pub(crate) const HEAD_TIMEOUTS: &str = "tollgate.connections.head_timeouts_total";
#[cfg_attr(not(feature = "listener"), allow(dead_code))]
pub(crate) const OPEN_CONNECTIONS: &str = "tollgate.connections.open";

/// Gives every metric its unit and description (the exporter's `HELP` and unit), in the
/// recorder in force; repeated when a layer or a store is built and when a handle finds
/// its recorder.
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        CONNECTIONS,
        Unit::Count,
        "New connections at a limited listener, by result: admitted, exempt, or refused (rate_limited, address_full, total_full)"
    );
    describe_counter!(
        HEAD_TIMEOUTS,
        Unit::Count,
        "Connections closed because their first request head did not arrive in time"
    );
    describe_gauge!(
        OPEN_CONNECTIONS,
        Unit::Count,
        "Connections open through a limited listener"
    );
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
pub(crate) trait Handle: Sized {
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
    pub(crate) fn new(name: &'static str, labels: &[(&'static str, &str)], bind: Bind) -> Self {
        let labels: Vec<metrics::Label> = labels
            .iter()
            .map(|&(k, v)| metrics::Label::new(k, v.to_owned()))
            .collect();
        let lazy = Lazy {
            key: metrics::Key::from_parts(name, labels),
            bound: OnceLock::new(),
        };
        if bind == Bind::Now {
            lazy.find();
        }
        lazy
    }

    /// The handle registered with a recorder, registering it now if one is in force (at
    /// most once every [`RECHECK`] uses on a thread that found none).
    #[inline]
    fn bound(&self) -> Option<&H> {
        match self.bound.get() {
            Some(h) => Some(h),
            None if SKIP.get() > 0 => {
                SKIP.set(SKIP.get() - 1);
                None
            }
            None => self.look(),
        }
    }

    #[cold]
    fn look(&self) -> Option<&H> {
        let found = self.find();
        if found.is_none() {
            SKIP.set(RECHECK);
        }
        found
    }

    /// Registers the handle with the recorder in force, if there is one.
    #[cold]
    fn find(&self) -> Option<&H> {
        metrics::with_recorder(|r| {
            (std::mem::size_of_val(r) != 0).then(|| {
                describe();
                self.bound.get_or_init(|| H::register(r, &self.key))
            })
        })
    }

    /// `f` on the registered handle, if there is one; told whether it was registered
    /// just now.
    #[inline]
    fn with(&self, f: impl FnOnce(&H, bool)) {
        match self.bound.get() {
            Some(h) => f(h, false),
            None => {
                if let Some(h) = self.bound() {
                    f(h, true)
                }
            }
        }
    }
}

#[cfg(feature = "metrics")]
thread_local! {
    /// Uses left on this thread before an unregistered handle looks for a recorder again,
    /// after a look found none.
    static SKIP: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// How many uses an unregistered handle skips, on a thread, after finding no recorder.
#[cfg(feature = "metrics")]
const RECHECK: u8 = 63;

/// What a metric records; each kind has its own handle in the `metrics` crate.
pub(crate) trait Kind {
    #[cfg(feature = "metrics")]
    type Handle: Handle + std::fmt::Debug;
}

/// A counter's kind.
#[derive(Debug)]
pub(crate) struct Counter;
/// A gauge's kind.
#[derive(Debug)]
pub(crate) struct Gauge;
/// A histogram's kind.
#[derive(Debug)]
pub(crate) struct Histogram;

impl Kind for Counter {
    #[cfg(feature = "metrics")]
    type Handle = metrics::Counter;
}
impl Kind for Gauge {
    #[cfg(feature = "metrics")]
    type Handle = metrics::Gauge;
}
impl Kind for Histogram {
    #[cfg(feature = "metrics")]
    type Handle = metrics::Histogram;
}

/// One metric of one label set; without the `metrics` feature it records nothing.
#[derive(Debug)]
pub(crate) struct Metric<M: Kind> {
    #[cfg(feature = "metrics")]
    lazy: Lazy<M::Handle>,
    #[cfg(not(feature = "metrics"))]
    kind: std::marker::PhantomData<M>,
}

/// A counter.
pub(crate) type Count = Metric<Counter>;
/// A gauge.
pub(crate) type Level = Metric<Gauge>;
/// A histogram.
pub(crate) type Timing = Metric<Histogram>;

impl<M: Kind> Metric<M> {
    pub(crate) fn new(name: &'static str, labels: &[(&'static str, &str)], bind: Bind) -> Self {
        #[cfg(not(feature = "metrics"))]
        let _ = (name, labels, bind);
        Metric {
            #[cfg(feature = "metrics")]
            lazy: Lazy::new(name, labels, bind),
            #[cfg(not(feature = "metrics"))]
            kind: std::marker::PhantomData,
        }
    }
}

impl Count {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|c, _| c.increment(n));
        #[cfg(not(feature = "metrics"))]
        let _ = n;
    }
}

impl Level {
    pub(crate) fn set(&self, value: f64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|g, _| g.set(value));
        #[cfg(not(feature = "metrics"))]
        let _ = value;
    }

    /// Adds `delta` (negative: takes away); a gauge registered just now starts from
    /// `total` instead, which counts what it missed.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) fn add(&self, delta: f64, total: impl FnOnce() -> f64) {
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
    pub(crate) fn hold(&self) -> Held {
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

impl Timing {
    pub(crate) fn record(&self, value: f64) {
        #[cfg(feature = "metrics")]
        self.lazy.with(|h, _| h.record(value));
        #[cfg(not(feature = "metrics"))]
        let _ = value;
    }
}
