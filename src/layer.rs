//! [`RateLimitLayer`]: one value is one limit, shared by every clone and every route it is
//! applied to.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use tower_layer::Layer;

use crate::{
    clock::TokioClock,
    error::{ConfigError, StoreError},
    future::{Next, RefundGuard},
    key::{Global, KeyExtractor},
    response::{Rejection, Responder},
    service::RateLimit,
    store::{MemoryStore, Store},
    Decision, Limit, Outcome, Policy, Quota, Source,
};

/// The cost of a request in units of the quota. Implemented by [`UnitCost`] (every request
/// costs 1, the default) and by closures through [`cost_fn`].
pub trait Cost<Req> {
    /// Units this request spends.
    fn cost(&self, req: &Req) -> u64;
}

/// Every request costs one unit. See [`Cost`].
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCost;

impl<Req> Cost<Req> for UnitCost {
    #[inline]
    fn cost(&self, _: &Req) -> u64 {
        1
    }
}

/// A [`Cost`] from a closure; built by [`cost_fn`].
#[derive(Clone, Copy)]
pub struct CostFn<F>(F);

/// Weighs requests with a closure: by route, by header, by declared body size.
///
/// ```
/// use http::Request;
/// use tollgate::{cost_fn, Cost};
///
/// // One unit per started KiB of declared body, at least one.
/// let by_size = cost_fn(|req: &Request<()>| {
///     let len = req
///         .headers()
///         .get(http::header::CONTENT_LENGTH)
///         .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
///         .unwrap_or(0);
///     len.div_ceil(1024).max(1)
/// });
/// let req = Request::builder().header("content-length", "4000").body(()).unwrap();
/// assert_eq!(by_size.cost(&req), 4);
/// ```
pub fn cost_fn<F>(f: F) -> CostFn<F> {
    CostFn(f)
}

impl<F> fmt::Debug for CostFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CostFn")
    }
}

impl<Req, F: Fn(&Req) -> u64> Cost<Req> for CostFn<F> {
    #[inline]
    fn cost(&self, req: &Req) -> u64 {
        (self.0)(req)
    }
}

/// What to do with a request from which no key can be extracted. Never silently unlimited
/// unless you choose [`MissingKey::Allow`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum MissingKey {
    /// All keyless requests share one bucket of the same limit (the default): a missing
    /// `x-api-key` is limited like one anonymous client; a server started without
    /// `ConnectInfo` is limited as a whole, which shows at once instead of passing silently.
    #[default]
    Shared,
    /// Refuse keyless requests with this status (e.g. `400`) and a problem body. A `401`
    /// must carry `WWW-Authenticate` (RFC 9110): add it in your auth layer, which knows the
    /// scheme (see the `authenticated_user` example).
    Reject(StatusCode),
    /// Let keyless requests through unlimited.
    Allow,
}

/// What to do when the store fails (a custom store returned an error). The Redis store
/// applies its own failure policy and does not return errors here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnStoreError {
    /// Admit the request (logged with `tracing::warn!`). The default, as at Stripe and in
    /// Envoy: a limiter outage must not become an API outage.
    #[default]
    FailOpen,
    /// Refuse it: `503` with a `temporary-reduced-capacity` problem body for HTTP, a
    /// [`StoreError`] for the generic middleware.
    FailClosed,
}

pub(crate) struct Shared<X, St, C> {
    pub(crate) key: X,
    pub(crate) store: St,
    pub(crate) cost: C,
    pub(crate) missing: MissingKey,
    pub(crate) on_error: OnStoreError,
    pub(crate) responder: Arc<Responder>,
    pub(crate) expose: bool,
    /// Whether the extractor's misconfiguration was logged already (once per layer).
    pub(crate) warned: AtomicBool,
}

/// How a request starts: the store's decision (or pending answer) for its key, or what to
/// do without a key.
pub(crate) enum Start<K> {
    Decided {
        key: Option<K>,
        cost: u64,
        decision: Decision,
    },
    Pending {
        key: Option<K>,
        cost: u64,
        check: crate::store::CheckFuture,
    },
    /// The store failed and the failure policy refuses.
    Failed(StoreError),
    Unlimited,
    Reject(StatusCode),
}

impl<X, St, C> Shared<X, St, C> {
    /// Extracts the key and the cost and asks the store.
    #[inline]
    pub(crate) fn start<Req>(&self, req: &Req) -> Start<X::Key>
    where
        X: KeyExtractor<Req>,
        C: Cost<Req>,
        St: Store<Option<X::Key>>,
    {
        let key = match self.key.extract(req) {
            Some(k) => Some(k),
            None => match self.keyless(req) {
                MissingKey::Shared => None,
                MissingKey::Allow => return Start::Unlimited,
                MissingKey::Reject(status) => return Start::Reject(status),
            },
        };
        let cost = self.cost.cost(req);
        if let Some(decision) = self.store.decide_now(&key, cost) {
            return Start::Decided {
                key,
                cost,
                decision,
            };
        }
        let mut check = self.store.decide(&key, cost);
        match check.take_ready() {
            Some(Ok(decision)) => Start::Decided {
                key,
                cost,
                decision,
            },
            Some(Err(e)) => match self.on_store_error::<X::Key>(e) {
                Ok(decision) => Start::Decided {
                    key,
                    cost,
                    decision,
                },
                Err(e) => Start::Failed(e),
            },
            None => Start::Pending { key, cost, check },
        }
    }

    /// A request without a key: logs once per layer when the extractor says why (the
    /// server is not set up to give it what it needs), then follows `MissingKey`.
    #[cold]
    fn keyless<Req>(&self, req: &Req) -> MissingKey
    where
        X: KeyExtractor<Req>,
    {
        if !self.warned.load(Ordering::Relaxed) {
            if let Some(why) = self.key.misconfiguration(req) {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        target: "tollgate",
                        missing_key = ?self.missing,
                        "rate-limit key missing: {why} (logged once per layer)"
                    );
                }
            }
        }
        self.missing
    }

    /// A failed store call under the `OnStoreError` policy: a decision to go on with, or
    /// the error to refuse with.
    pub(crate) fn on_store_error<K>(&self, e: StoreError) -> Result<Decision, StoreError>
    where
        St: Store<Option<K>>,
    {
        match self.on_error {
            OnStoreError::FailOpen => {
                tracing::warn!(error = %e, "rate-limit store failed; admitting (fail open)");
                Ok(Decision::without_state(
                    Outcome::Allowed {
                        wait: std::time::Duration::ZERO,
                    },
                    Source::FailOpen,
                    self.store.policy().limits().len(),
                ))
            }
            OnStoreError::FailClosed => {
                tracing::warn!(error = %e, "rate-limit store failed; refusing (fail closed)");
                Err(e)
            }
        }
    }

    /// The common step from a decision to the next state. `refuse` builds the refusal,
    /// `allow` the extra carried to the response.
    #[inline]
    pub(crate) fn next<K, O, H>(
        self: &Arc<Self>,
        key: &Option<K>,
        cost: u64,
        decision: &Decision,
        refuse: impl FnOnce(&Self, Result<&Decision, StoreError>) -> O,
        allow: impl FnOnce(&Self, &Decision) -> H,
    ) -> Next<O, H>
    where
        St: Store<Option<K>>,
        K: Clone + Send + Sync + 'static,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        match decision.outcome() {
            Outcome::Allowed { wait } => {
                let refund = (!wait.is_zero()).then(|| {
                    let (shared, key) = (Arc::clone(self), key.clone());
                    RefundGuard::new(move || shared.store.refund(&key, cost))
                });
                Next::Proceed {
                    wait,
                    extra: allow(self, decision),
                    refund,
                }
            }
            _ => Next::Refuse(refuse(self, Ok(decision))),
        }
    }

    /// The slow path's continuation: from the store's eventual answer to the next state.
    pub(crate) fn continuation<K, Req, O, H>(
        self: &Arc<Self>,
        key: Option<K>,
        cost: u64,
        refuse: fn(&Self, Result<&Decision, StoreError>) -> O,
        allow: fn(&Self, &Decision) -> H,
        expose: fn(&Self, &mut Req, &Decision),
    ) -> crate::future::Continuation<Req, O, H>
    where
        St: Store<Option<K>>,
        K: Clone + Send + Sync + 'static,
        X: Send + Sync + 'static,
        C: Send + Sync + 'static,
        Req: 'static,
        O: 'static,
        H: 'static,
    {
        let shared = Arc::clone(self);
        Box::new(move |result, req: &mut Req| {
            match result.or_else(|e| shared.on_store_error::<K>(e)) {
                Ok(d) => {
                    let next = shared.next(&key, cost, &d, refuse, allow);
                    expose(&shared, req, &d);
                    next
                }
                Err(e) => Next::Refuse(refuse(&shared, Err(e))),
            }
        })
    }
}

/// The store a layer builds for itself: in memory, keyed by the extracted key (`None` for
/// keyless requests under [`MissingKey::Shared`]), on tokio's clock.
pub type DefaultStore<K> = MemoryStore<Option<K>, TokioClock>;

/// Applies a rate limit: `.layer(RateLimitLayer::...)` on an axum `Router`, a route, or any
/// tower HTTP service. See the [crate docs](crate) for the guide.
///
/// One layer value is one limit: every service it makes (axum calls `layer` once per
/// route, and clones services freely) shares the same state. Build two layers for two
/// independent limits.
///
/// Type parameters: `X` the [`KeyExtractor`], `St` the [`Store`], `C` the [`Cost`].
pub struct RateLimitLayer<X = Global, St = DefaultStore<()>, C = UnitCost> {
    pub(crate) shared: Arc<Shared<X, St, C>>,
}

impl<X, St, C> Clone for RateLimitLayer<X, St, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<X: fmt::Debug, St, C> fmt::Debug for RateLimitLayer<X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("key", &self.shared.key)
            .field("missing_key", &self.shared.missing)
            .field("responses", &self.shared.responder)
            .finish_non_exhaustive()
    }
}

impl<X, St, C> RateLimitLayer<X, St, C> {
    /// The store, for inspection (e.g. [`MemoryStore::stats`]).
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The same limit for a non-HTTP `tower::Service` (refusals become a typed error).
    pub fn generic(&self) -> crate::generic::RateLimitLayer<X, St, C> {
        crate::generic::RateLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl RateLimitLayer {
    /// Starts a builder: one global limit, unit cost, IETF headers and problem+json bodies
    /// on; pick a key with [`Builder::key`] and at least one limit.
    pub fn builder() -> Builder<Global, UnitCost> {
        Builder {
            key: Global::new(),
            cost: UnitCost,
            cfg: Config {
                limits: Vec::new(),
                error: None,
                missing: MissingKey::default(),
                on_error: OnStoreError::default(),
                ietf: true,
                legacy: false,
                problem: true,
                rejection: None,
                expose: false,
                max_bytes: None,
            },
        }
    }
}

impl<S, X, St, C> Layer<S> for RateLimitLayer<X, St, C> {
    type Service = RateLimit<S, X, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// Configures a [`RateLimitLayer`]. Setters take and return the builder; errors in limits
/// are reported by `build`.
#[must_use]
pub struct Builder<X, C> {
    key: X,
    cost: C,
    cfg: Config,
}

/// Everything of a builder that does not change its type.
struct Config {
    limits: Vec<Limit>,
    error: Option<ConfigError>,
    missing: MissingKey,
    on_error: OnStoreError,
    ietf: bool,
    legacy: bool,
    problem: bool,
    rejection: Option<Rejection>,
    expose: bool,
    max_bytes: Option<usize>,
}

impl<X: fmt::Debug, C> fmt::Debug for Builder<X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("key", &self.key)
            .field("limits", &self.cfg.limits)
            .field("missing", &self.cfg.missing)
            .finish_non_exhaustive()
    }
}

impl<X, C> Builder<X, C> {
    /// Who is limited: a [`KeyExtractor`] (see [`crate::key`]).
    pub fn key<X2>(self, key: X2) -> Builder<X2, C> {
        Builder {
            key,
            cost: self.cost,
            cfg: self.cfg,
        }
    }

    /// What a request costs (default: 1 unit). See [`cost_fn`].
    pub fn cost<C2>(self, cost: C2) -> Builder<X, C2> {
        Builder {
            key: self.key,
            cost,
            cfg: self.cfg,
        }
    }

    fn push(mut self, limit: Result<Limit, ConfigError>) -> Self {
        match limit {
            Ok(l) => self.cfg.limits.push(l),
            Err(e) => {
                self.cfg.error.get_or_insert(e);
            }
        }
        self
    }

    /// Adds a limit; several limits must all admit a request (then all are charged).
    pub fn limit(self, limit: Limit) -> Self {
        self.push(Ok(limit))
    }

    /// Adds every limit of a policy.
    pub fn policy(mut self, policy: impl Into<Policy>) -> Self {
        self.cfg
            .limits
            .extend(policy.into().limits().iter().cloned());
        self
    }

    /// Adds a token-bucket (GCRA) limit: bursts up to the quota's burst.
    pub fn token_bucket(self, quota: Quota) -> Self {
        self.push(Limit::token_bucket(quota))
    }

    /// Adds a strict leaky meter: the rate, evenly spaced, excess refused.
    pub fn leaky_meter(self, quota: Quota) -> Self {
        self.push(Limit::leaky_meter(quota))
    }

    /// Adds a leaky-bucket delay queue: excess waits for its slot, up to `queue` slots.
    pub fn leaky_queue(self, quota: Quota, queue: u32) -> Self {
        self.push(Limit::leaky_queue(quota, queue))
    }

    /// What to do with requests that carry no key (default [`MissingKey::Shared`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.cfg.missing = missing;
        self
    }

    /// What to do when a store call fails (default [`OnStoreError::FailOpen`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.cfg.on_error = on_error;
        self
    }

    /// The IETF `RateLimit` and `RateLimit-Policy` fields on every response (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.cfg.ietf = on;
        self
    }

    /// The legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` trio (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.cfg.legacy = on;
        self
    }

    /// RFC 9457 `application/problem+json` refusal bodies (default on); off, a refusal
    /// has an empty body.
    pub fn problem_details(mut self, on: bool) -> Self {
        self.cfg.problem = on;
        self
    }

    /// Builds refusals with a closure instead. `Retry-After`, `Cache-Control: no-store`
    /// and the rate-limit fields are still added when the closure did not set them.
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.cfg.rejection = Some(Arc::new(f));
        self
    }

    /// Bounds the memory of the built-in store, in bytes (default
    /// [`DEFAULT_MAX_BYTES`](crate::store::DEFAULT_MAX_BYTES), 32 MiB). A flood of keys
    /// never grows it past this: keys back to fresh go first, then those closest to it.
    /// With [`Builder::build_with`], size your own store instead.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.cfg.max_bytes = Some(bytes);
        self
    }

    /// Inserts the [`Decision`] into the request's extensions so handlers can read the
    /// remaining quota (default off: it costs an allocation per request).
    pub fn expose_decision(mut self, on: bool) -> Self {
        self.cfg.expose = on;
        self
    }

    fn finish<St>(self, store: St, policy: &Policy) -> RateLimitLayer<X, St, C> {
        let responder = Responder::new(
            policy,
            self.cfg.ietf,
            self.cfg.legacy,
            self.cfg.problem,
            self.cfg.rejection,
        );
        RateLimitLayer {
            shared: Arc::new(Shared {
                key: self.key,
                store,
                cost: self.cost,
                missing: self.cfg.missing,
                on_error: self.cfg.on_error,
                responder: Arc::new(responder),
                expose: self.cfg.expose,
                warned: AtomicBool::new(false),
            }),
        }
    }

    fn take_policy(&mut self) -> Result<Policy, ConfigError> {
        if let Some(e) = self.cfg.error.take() {
            return Err(e);
        }
        Policy::from_limits(std::mem::take(&mut self.cfg.limits))
    }

    /// Builds the layer for HTTP requests with the in-memory store (following tokio's
    /// clock, so paused-time tests drive it).
    pub fn build<K>(self) -> Result<RateLimitLayer<X, DefaultStore<K>, C>, ConfigError>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        self.build_for::<Request<()>>()
    }

    /// Builds the layer with the in-memory store, for extractors that only work on one
    /// request type (a closure over `Request<axum::body::Body>`, or a non-HTTP request).
    pub fn build_for<Req>(
        mut self,
    ) -> Result<RateLimitLayer<X, DefaultStore<X::Key>, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let policy = self.take_policy()?;
        let mut store = MemoryStore::new(policy.clone());
        if let Some(bytes) = self.cfg.max_bytes {
            store = store.with_max_bytes(bytes)?;
        }
        Ok(self.finish(store, &policy))
    }

    /// Builds the layer on a store of your own (a configured [`MemoryStore`], the Redis
    /// store). The store's policy is the limit; limits given to this builder must be none
    /// or the same.
    pub fn build_with<St>(self, store: St) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        St: Store<Option<<X as KeyExtractor<Request<()>>>::Key>>,
        X: KeyExtractor<Request<()>>,
    {
        self.build_with_for::<Request<()>, St>(store)
    }

    /// [`Builder::build_with`] for a specific request type.
    pub fn build_with_for<Req, St>(
        mut self,
        store: St,
    ) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        St: Store<Option<X::Key>>,
    {
        let policy = store.policy().clone();
        if self.cfg.max_bytes.is_some() {
            return Err(ConfigError::Store(
                "max_bytes sizes the built-in store; set the budget on your store instead".into(),
            ));
        }
        if !self.cfg.limits.is_empty() || self.cfg.error.is_some() {
            let mine = self.take_policy()?;
            if mine != policy {
                return Err(ConfigError::Store(
                    "the builder's limits differ from the store's policy".into(),
                ));
            }
        }
        Ok(self.finish(store, &policy))
    }
}

pub(crate) fn missing_key_refusal(responder: &Responder, status: StatusCode) -> Response<Bytes> {
    responder.plain(
        status,
        "No rate-limit key could be extracted from this request.",
    )
}
