//! [`InFlightLimitLayer`] and its [`InFlightLimitBuilder`]. One layer value is one limit,
//! shared by every clone and every route it is applied to.

use std::{fmt, hash::Hash, sync::Arc, time::Duration};

use http::{HeaderName, Request};

use super::answer::{InFlightReplies, WORDING};
use super::memory::MemoryInFlight;
use super::service::Slots;
use super::store::{sealed::Attach, Limits};
use crate::core::gate::CommonOptions;
use crate::core::gate::Gated;
use crate::core::service::layer_of;
use crate::deadline::DeadlineSources;
use crate::error::ConfigError;
use crate::key::{Global, KeyExtractor};
use crate::setters::setters;

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
    pub(crate) shared: Arc<Gated<X, Slots<St>>>,
}

layer_of!(InFlightLimitLayer<X, St> { shared: Gated<X, Slots<St>> });

impl<X: fmt::Debug, St: fmt::Debug> fmt::Debug for InFlightLimitLayer<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("InFlightLimitLayer")
            .field("key", &s.common.key)
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
        &self.shared.part.store
    }
}

/// Configures an [`InFlightLimitLayer`]; made by [`InFlightLimitLayer::builder`]. Setters
/// take and return the builder; `build` checks the result.
///
/// See the [module docs](super).
#[derive(Clone, Debug)]
#[must_use]
pub struct InFlightLimitBuilder<X> {
    common: CommonOptions<X>,
    limits: Limits,
    deadline_header: Option<String>,
}

impl<X> InFlightLimitBuilder<X> {
    fn new(key: X, max: u32) -> Self {
        InFlightLimitBuilder {
            common: CommonOptions::new(key, "inflight"),
            limits: Limits {
                max,
                queue: 0,
                max_wait: DEFAULT_MAX_WAIT,
            },
            deadline_header: None,
        }
    }

    setters! {
        /// Lets up to `len` requests of a key over its limit wait for a slot, first come
        /// first served (default 0: refused at once). A waiting request whose future is
        /// dropped (the client left, a timeout) leaves the queue.
        queue(len: u32) => limits.queue;

        /// The longest a queued request waits for a slot before it is refused (default
        /// 10 s).
        max_wait(wait: Duration) => limits.max_wait;

        /// Also reads a request's deadline from `name`, the time its caller has left in
        /// milliseconds (besides `grpc-timeout`, `x-envoy-expected-rq-timeout-ms` and a
        /// [`Deadline`](crate::Deadline) in the extensions, always read). A queued request
        /// leaves the queue at its deadline, refused. A name that is not a header name is
        /// reported by `build`.
        deadline_header(name: &str) => deadline_header = Some(name.to_owned());
    }

    crate::core::gate::common_setters!("inflight", "");

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
        let on_error = self.common.on_error;
        let common = self.common.build(b"", &WORDING)?;
        let replies = Arc::new(InFlightReplies::new(&common.label, self.limits.max));
        store.attach(&self.limits)?;
        Ok(InFlightLimitLayer {
            shared: Arc::new(Gated {
                common,
                part: Slots {
                    store,
                    limits: self.limits,
                    replies,
                    deadlines,
                    on_error,
                },
            }),
        })
    }
}
