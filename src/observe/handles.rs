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

/// Declares each series once: its constant, kind, name, unit and help text; and
/// `describe`, which gives every one its unit and help (the exporter's `HELP` and unit)
/// in the recorder in force. `describe` is repeated when a layer or a store is built and
/// when a handle finds its recorder.
macro_rules! series {
    ($($(#[$attr:meta])* $konst:ident = $kind:ident($name:literal $(, $unit:ident)?): $help:expr;)+) => {
        $($(#[$attr])* pub(crate) const $konst: &str = $name;)+

        #[cfg(feature = "metrics")]
        fn describe() {
            $(series!(@describe $kind, $konst, $($unit)?, $help);)+
        }
    };
    (@describe counter, $konst:ident, $($unit:ident)?, $help:expr) => {
        metrics::describe_counter!($konst, $(metrics::Unit::$unit,)? $help)
    };
    (@describe gauge, $konst:ident, $($unit:ident)?, $help:expr) => {
        metrics::describe_gauge!($konst, $(metrics::Unit::$unit,)? $help)
    };
    (@describe histogram, $konst:ident, $($unit:ident)?, $help:expr) => {
        metrics::describe_histogram!($konst, $(metrics::Unit::$unit,)? $help)
    };
}

series! {
    RATE_LIMIT_REQUESTS = counter("tollgate.rate_limit.requests_total", Count):
        "Rate-limit decisions, by layer, policy and result";
    IN_FLIGHT_REQUESTS = counter("tollgate.in_flight.requests_total", Count):
        "In-flight limit decisions, by layer and result";
    SCREENED = counter("tollgate.rate_limit.screened_total", Count):
        "Requests never limited (skipped or on an allow list) or denied (on a deny list)";
    TIME_IN_QUEUE = histogram("tollgate.rate_limit.request.time_in_queue_seconds", Seconds):
        "How long admitted requests waited in a leaky-bucket queue";
    QUEUED = gauge("tollgate.rate_limit.queued_requests", Count):
        "Admitted requests waiting in a leaky-bucket queue now";
    ACTIVE_LEASES = gauge("tollgate.in_flight.active_leases", Count):
        "Requests holding an in-flight slot now";
    DEGRADED = counter("tollgate.rate_limit.degraded_decisions_total", Count):
        "Decisions made without the store's backend or from its negative cache";
    OPERATION = histogram("tollgate.store.operation.duration_seconds", Seconds):
        "Duration of calls to a network store";
    ERRORS = counter("tollgate.store.errors_total", Count):
        "Failed store calls, by error type";
    BREAKER = gauge("tollgate.store.breaker.state"):
        "Circuit breaker state: 0 closed, 1 half-open, 2 open";
    KEYS = gauge("tollgate.store.keys", Count):
        "Keys held in memory";
    EVICTIONS = counter("tollgate.store.evictions_total", Count):
        "Keys evicted from memory: back to fresh, or with state to fit the memory budget";
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    BREAKER_OPENINGS = counter("tollgate.store.breaker.openings_total", Count):
        "Times a store's circuit breaker opened, or opened again after a failed probe";
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    RECONNECTS = counter("tollgate.redis.reconnects_total", Count):
        concat!(
            "Redis connections replaced, by reason: connection_lost, readonly, masterdown, ",
            "loading, unresponsive"
        );
    #[cfg_attr(not(feature = "listener"), allow(dead_code))]
    CONNECTIONS = counter("tollgate.connections_total", Count):
        concat!(
            "New connections at a limited listener, by result: admitted, exempt, or refused ",
            "(rate_limited, address_full, total_full)"
        );
    #[cfg_attr(not(feature = "listener"), allow(dead_code))]
    CLOSED_CONNECTIONS = counter("tollgate.connections.closed_total", Count):
        concat!(
            "Connections a limited listener closed, by reason: head_timeout, slow_body, ",
            "idle_timeout, evicted (to make room when full)"
        );
    #[cfg_attr(not(feature = "upstream"), allow(dead_code))]
    UPSTREAM_CALLS = counter("tollgate.upstream.calls_total", Count):
        concat!(
            "Calls through an upstream limit, by result: sent, refused (no slot within ",
            "max_wait), fail_open, fail_closed"
        );
    #[cfg_attr(not(feature = "upstream"), allow(dead_code))]
    UPSTREAM_PAUSES = counter("tollgate.upstream.pauses_total", Count):
        "Pauses an upstream asked for, by field: retry_after, ratelimit, x_ratelimit";
    #[cfg_attr(not(feature = "listener"), allow(dead_code))]
    OPEN_CONNECTIONS = gauge("tollgate.connections.open", Count):
        "Connections open through a limited listener";
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
