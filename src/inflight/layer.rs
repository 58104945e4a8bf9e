//! [`InFlightLimitLayer`] and its [`InFlightLimitBuilder`]. One layer value is one limit,
//! shared by every clone and every route it is applied to.

use std::{fmt, hash::Hash, sync::Arc, time::Duration};

use http::{HeaderName, Request};

use tower_layer::Layer;

use super::answer::{InFlightReplies, WORDING};
use super::memory::MemoryInFlight;
use super::service::{InFlightLimit, Slots};
use super::store::{sealed::Attach, Limits};
use crate::core::{CommonOptions, Core};
use crate::deadline::DeadlineSources;
use crate::error::ConfigError;
use crate::key::{Global, KeyExtractor};
use crate::options::{MissingKey, OnStoreError};

/// How long a queued request waits for a slot unless [`InFlightLimitBuilder::max_wait`]
/// says otherwise.
const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(10);

/// Limits how many requests of each key are in flight at once: `.layer(InFlightLimitLayer::new(..))`
/// on an axum `Router`, a route, or any tower HTTP service. See the
/// [module docs](super) for the guide.
///
/// One layer value is one limit: every service it makes (axum calls `layer` once per
/// route, and clones services freely) shares the same counts. Type parameters: `X` the
/// [`KeyExtractor`], `St` the [`InFlightStore`](super::InFlightStore).
pub struct InFlightLimitLayer<X = Global, St = MemoryInFlight<()>> {
    pub(crate) core: Arc<Core<X, Slots<St>>>,
}

impl<X, St> Clone for InFlightLimitLayer<X, St> {
    fn clone(&self) -> Self {
        InFlightLimitLayer {
            core: Arc::clone(&self.core),
        }
    }
}

impl<S, X, St> Layer<S> for InFlightLimitLayer<X, St> {
    type Service = InFlightLimit<S, X, St>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightLimit::new(inner, &self.core)
    }
}

impl<X: fmt::Debug, St: fmt::Debug> fmt::Debug for InFlightLimitLayer<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.core;
        f.debug_struct("InFlightLimitLayer")
            .field("key", &s.key)
            .field("max_in_flight", &s.part.limits.max)
            .field("queue", &s.part.limits.queue)
            .field("max_wait", &s.part.limits.max_wait)
            .field("label", &s.common.label)
            .field("store", &s.part.store)
            .finish_non_exhaustive()
    }
}

impl<X> InFlightLimitLayer<X, MemoryInFlight<<X as KeyExtractor<Request<()>>>::Key>>
where
    X: KeyExtractor<Request<()>>,
    X::Key: Hash + Eq + Send + Sync + 'static,
{
    /// At most `max_in_flight` requests of each key of `key` in flight at once, counted
    /// in memory; a request over the limit is refused at once. A limit of `0` refuses
    /// every request (a kill switch). Cannot fail; [`InFlightLimitLayer::builder`] sets
    /// the rest.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, InFlightLimitLayer};
    ///
    /// let limit = InFlightLimitLayer::new(PeerIp::new(), 2);
    /// # let _: axum::Router = axum::Router::new().layer(limit);
    /// ```
    pub fn new(key: X, max_in_flight: u32) -> Self {
        InFlightLimitBuilder::new(key, max_in_flight)
            .build_with(MemoryInFlight::new())
            .unwrap_or_else(|_| unreachable!("the default label is valid"))
    }
}

impl InFlightLimitLayer {
    /// Starts a builder for a limit of `max_in_flight` requests of each key of `key` in
    /// flight at once.
    pub fn builder<X>(key: X, max_in_flight: u32) -> InFlightLimitBuilder<X> {
        InFlightLimitBuilder::new(key, max_in_flight)
    }
}

impl<X, St> InFlightLimitLayer<X, St> {
    /// The store, for inspection (e.g. [`MemoryInFlight::len`]).
    pub fn store(&self) -> &St {
        &self.core.part.store
    }
}

/// Configures an [`InFlightLimitLayer`]; made by [`InFlightLimitLayer::builder`]. Setters
/// take and return the builder; `build` checks the result.
///
/// See the [module docs](super).
#[derive(Clone, Debug)]
#[must_use]
pub struct InFlightLimitBuilder<X> {
    key: X,
    common: CommonOptions,
    limits: Limits,
    deadline_header: Option<String>,
}

impl<X> InFlightLimitBuilder<X> {
    fn new(key: X, max: u32) -> Self {
        InFlightLimitBuilder {
            key,
            common: CommonOptions::new("inflight"),
            limits: Limits {
                max,
                queue: 0,
                max_wait: DEFAULT_MAX_WAIT,
            },
            deadline_header: None,
        }
    }

    /// Lets up to `len` requests of a key over its limit wait for a slot, first come first
    /// served (default 0: refused at once). A waiting request whose future is dropped (the
    /// client left, a timeout) leaves the queue.
    pub fn queue(mut self, len: u32) -> Self {
        self.limits.queue = len;
        self
    }

    /// The longest a queued request waits for a slot before it is refused (default 10 s).
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.limits.max_wait = wait;
        self
    }

    /// Also reads a request's deadline from `name`, the time its caller has left in
    /// milliseconds (besides `grpc-timeout`, `x-envoy-expected-rq-timeout-ms` and a
    /// [`Deadline`](crate::Deadline) in the extensions, always read). A queued request
    /// leaves the queue at its deadline, refused. A name that is not a header name is
    /// reported by `build`.
    pub fn deadline_header(mut self, name: &str) -> Self {
        self.deadline_header = Some(name.to_owned());
        self
    }

    /// The limit's name: in the `RateLimit` / `RateLimit-Policy` items, the problem body's
    /// `violated-policies`, the logs and the metrics. Default `inflight`; printable ASCII.
    pub fn label(mut self, label: &str) -> Self {
        self.common.label = label.into();
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Reject`] with `400`:
    /// see [`MissingKey`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.common.missing = missing;
        self
    }

    /// What to do when a shared store fails (default [`OnStoreError::FailOpen`]: the
    /// request goes through unlimited). The memory stores never fail.
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.common.on_error = on_error;
        self
    }

    /// Builds the layer with the in-memory store. Refuses a label that cannot be sent in
    /// a header.
    pub fn build<K>(self) -> Result<InFlightLimitLayer<X, MemoryInFlight<K>>, ConfigError>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        K: Hash + Eq + Send + Sync + 'static,
    {
        self.build_with(MemoryInFlight::new())
    }

    /// Builds the layer on `store`: a `RedisInFlight` (feature `redis`) shared by every
    /// instance, or a [`MemoryInFlight`] shared with other layers. The store must be an
    /// [`InFlightStore`](super::InFlightStore) of the extractor's key type for the layer to make services.
    pub fn build_with<St: Attach>(
        self,
        store: St,
    ) -> Result<InFlightLimitLayer<X, St>, ConfigError> {
        let deadlines = match self.deadline_header {
            None => DeadlineSources::default(),
            Some(name) => DeadlineSources::with_header(
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ConfigError::InvalidHeaderName(name))?,
            ),
        };
        let common = self.common.build(b"", &WORDING)?;
        let replies = Arc::new(InFlightReplies::new(&common.label, self.limits.max));
        store.attach(&self.limits)?;
        Ok(InFlightLimitLayer {
            core: Arc::new(Core {
                key: self.key,
                common,
                part: Slots {
                    store,
                    limits: self.limits,
                    replies,
                    deadlines,
                },
            }),
        })
    }
}
