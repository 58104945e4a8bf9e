//! [`RateLimitLayer`] and its [`Builder`]: the HTTP layer. One layer value is one limit,
//! shared by every clone and every route it is applied to.

use std::{fmt, sync::Arc};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response};
use tower_layer::Layer;

use crate::{
    access::{self, Access},
    algorithm::Limit,
    clock::TokioClock,
    cost::UnitCost,
    decision::Decision,
    error::ConfigError,
    key::{ClientIp, Global, KeyExtractor, RequestHead},
    limiter::{KeyList, Limiter, MissingKey, OnStoreError, Settings},
    policy::{IntoPolicy, PolicyHandle, PolicyName, PolicySet, SelectHead},
    quota::Quota,
    response::{Answers, Rejection, ResponseHead, SettleRule},
    service::{Http, RateLimit},
    store::{MemoryStore, Store, StoreFuture},
};

/// The store a layer builds for itself: in memory, keyed by the extracted key (`None` for
/// keyless requests under [`MissingKey::Shared`]), on tokio's clock.
pub type DefaultStore<K> = MemoryStore<Option<K>, TokioClock>;

/// What a decision hook is given: the request's head, the decision, and the name of the
/// policy that applied. See [`Builder::on_decision`].
#[derive(Debug)]
pub struct DecisionEvent<'a> {
    pub(crate) head: RequestHead<'a>,
    pub(crate) decision: &'a Decision,
    pub(crate) policy: Option<&'a str>,
}

impl<'a> DecisionEvent<'a> {
    /// The request's method, URI, headers and extensions.
    pub fn request(&self) -> &RequestHead<'a> {
        &self.head
    }

    /// The decision: admitted or refused, remaining units, retry-after.
    pub fn decision(&self) -> &'a Decision {
        self.decision
    }

    /// The name of the policy that applied, in the layer's set (`None` for a layer of one
    /// unnamed policy).
    pub fn policy(&self) -> Option<&'a str> {
        self.policy
    }
}

/// A decision hook. See [`Builder::on_decision`].
pub(crate) type Hook = Arc<dyn Fn(&DecisionEvent<'_>, &mut HeaderMap) + Send + Sync>;

/// Applies a rate limit: `.layer(RateLimitLayer::...)` on an axum `Router`, a route, or any
/// tower HTTP service. See the [crate docs](crate) for the guide.
///
/// One layer value is one limit: every service it makes (axum calls `layer` once per
/// route, and clones services freely) shares the same state. Build two layers for two
/// independent limits.
///
/// Type parameters: `X` the [`KeyExtractor`], `St` the [`Store`], `C` the
/// [`Cost`](crate::cost::Cost).
pub struct RateLimitLayer<X = Global, St = DefaultStore<()>, C = UnitCost> {
    pub(crate) limiter: Arc<Limiter<X, St, C, Http>>,
}

impl<X, St, C> Clone for RateLimitLayer<X, St, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<X: fmt::Debug, St, C> fmt::Debug for RateLimitLayer<X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RateLimitLayer")
            .field(&self.limiter)
            .finish()
    }
}

impl<X, St, C> RateLimitLayer<X, St, C> {
    /// The store, for inspection (e.g. [`MemoryStore::stats`]).
    pub fn store(&self) -> &St {
        &self.limiter.store
    }

    /// The policies in force.
    pub fn policies(&self) -> PolicySet {
        self.limiter.policies()
    }

    /// Forgets `key`'s state in the layer's store, under every policy: its next request
    /// finds it fresh (a customer unbanned). On the Redis store, every instance sees it.
    ///
    /// ```
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// # tokio_test(async {
    /// let layer = RateLimitLayer::new(HeaderKey::new("x-api-key")?, "1/hour".parse::<tollgate::Policy>()?);
    /// // ... an admin route holding a clone of `layer`:
    /// layer.reset("customer-42").await?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # });
    /// # fn tokio_test<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    /// # }
    /// ```
    pub fn reset<K>(&self, key: impl Into<K>) -> StoreFuture<()>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        St: Store<Option<K>>,
    {
        self.limiter.store.reset(&Some(key.into()))
    }

    /// A handle that swaps this layer's policies while requests flow. See
    /// [`PolicyHandle`].
    pub fn policy_handle(&self) -> PolicyHandle
    where
        X: Send + Sync + 'static,
        St: Send + Sync + 'static,
        C: Send + Sync + 'static,
    {
        PolicyHandle::new(self.limiter.clone())
    }
}

impl<X> RateLimitLayer<X, DefaultStore<<X as KeyExtractor<Request<()>>>::Key>, UnitCost>
where
    X: KeyExtractor<Request<()>>,
    X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A layer limiting each key of `key` to `policy` (a [`Limit`], a [`Policy`](crate::Policy), or a
    /// whole [`PolicySet`]), in memory, with the defaults of [`RateLimitLayer::builder`].
    /// Both are already validated, so this cannot fail.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, Limit, Quota, RateLimitLayer};
    ///
    /// let limit = RateLimitLayer::new(PeerIp::new(), Limit::token_bucket(Quota::per_second(5)?)?);
    /// # let _: axum::Router = axum::Router::new().layer(limit);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn new(key: X, policy: impl Into<PolicySet>) -> Self {
        Builder::with_key(key)
            .policies(policy.into())
            .build()
            .expect("a set of validated policies, which the memory store decides")
    }
}

impl RateLimitLayer {
    /// Starts a builder: one global limit, unit cost, IETF headers and problem+json bodies
    /// on; pick a key with [`Builder::key`] and at least one limit.
    pub fn builder() -> Builder<Global, UnitCost> {
        Builder::with_key(Global::new())
    }
}

impl<S, X, St, C> Layer<S> for RateLimitLayer<X, St, C> {
    type Service = RateLimit<S, X, St, C>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: Arc::clone(&self.limiter),
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
    core: Settings,
    answers: Answers,
    expose: bool,
    shadow_header: Option<HeaderName>,
    hook: Option<Hook>,
    access: Access,
    settle: Option<SettleRule>,
}

impl<X: fmt::Debug, C> fmt::Debug for Builder<X, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("key", &self.key)
            .field("settings", &self.cfg.core)
            .finish_non_exhaustive()
    }
}

impl<X> Builder<X, UnitCost> {
    fn with_key(key: X) -> Self {
        Builder {
            key,
            cost: UnitCost,
            cfg: Config {
                core: Settings::default(),
                answers: Answers::default(),
                expose: false,
                shadow_header: None,
                hook: None,
                access: Access::default(),
                settle: None,
            },
        }
    }
}

impl<X, C> Builder<X, C> {
    /// Who is limited: a [`KeyExtractor`] (see [`crate::key`]). Set it before
    /// [`Builder::select`], which wraps it.
    pub fn key<X2>(self, key: X2) -> Builder<X2, C> {
        Builder {
            key,
            cost: self.cost,
            cfg: self.cfg,
        }
    }

    /// What a request costs (default: 1 unit). See [`cost_fn`](crate::cost::cost_fn).
    pub fn cost<C2>(self, cost: C2) -> Builder<X, C2> {
        Builder {
            key: self.key,
            cost,
            cfg: self.cfg,
        }
    }

    fn push(mut self, limit: Result<Limit, ConfigError>) -> Self {
        self.cfg.core.limit(limit);
        self
    }

    /// Adds a limit; several limits must all admit a request (then all are charged). With
    /// named policies, these limits apply to every one of them, first.
    pub fn limit(self, limit: Limit) -> Self {
        self.push(Ok(limit))
    }

    /// Adds every limit of a policy, or of its text (see [`Builder::limit`]):
    /// `.policy("100/s burst 200")`. A bad text is reported by `build`.
    pub fn policy(mut self, policy: impl IntoPolicy) -> Self {
        self.cfg.core.policy(policy);
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

    /// Adds a named policy (a plan): [`Builder::select`] picks one per request, the first
    /// is the fallback. The limits of [`Builder::limit`] apply to every named policy too.
    /// See [`crate::policy`].
    pub fn named_policy(mut self, name: impl Into<String>, policy: impl IntoPolicy) -> Self {
        self.cfg.core.named_policy(name.into(), policy);
        self
    }

    /// Uses a whole policy set (read from a file, say) instead of
    /// [`Builder::limit`] and [`Builder::named_policy`].
    pub fn policies(mut self, set: PolicySet) -> Self {
        self.cfg.core.policies(set);
        self
    }

    /// Picks, per request, which named policy applies: by the key (a prefix, a claim), by
    /// what an auth layer inserted (a plan), by route. A name the set lacks gets the
    /// fallback; a selector returning a closed set of names ([`PolicyName::all_names`],
    /// an enum of plans) is checked against the set when the layer is built. Call it after
    /// [`Builder::key`].
    ///
    /// ```
    /// use tollgate::{key::{HeaderBytes, HeaderKey, RequestHead}, RateLimitLayer};
    ///
    /// let plans = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-api-key")?)
    ///     .named_policy("free", "10/min")
    ///     .named_policy("pro", "100/min")
    ///     .policy("daily: 1000/day window") // every plan's limit too
    ///     .select(|_: &RequestHead<'_>, key: Option<&HeaderBytes>| {
    ///         match key {
    ///             Some(k) if k.starts_with(b"pro_") => "pro",
    ///             _ => "free",
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn select<F, N, K>(mut self, select: F) -> Builder<SelectHead<X, F, N>, C>
    where
        F: Fn(&RequestHead<'_>, Option<&K>) -> N,
        N: PolicyName,
    {
        self.cfg.core.names = N::all_names();
        Builder {
            key: SelectHead {
                key: self.key,
                select,
                _name: std::marker::PhantomData,
            },
            cost: self.cost,
            cfg: self.cfg,
        }
    }

    /// What to do with requests that carry no key (default [`MissingKey::Shared`]).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.cfg.core.missing = missing;
        self
    }

    /// What to do when a store call fails (default [`OnStoreError::FailOpen`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.cfg.core.on_error = on_error;
        self
    }

    /// The IETF `RateLimit` and `RateLimit-Policy` fields on every response (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.cfg.answers.ietf = on;
        self
    }

    /// The legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` trio (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.cfg.answers.legacy = on;
        self
    }

    /// RFC 9457 `application/problem+json` refusal bodies (default on); off, a refusal
    /// has an empty body.
    pub fn problem_details(mut self, on: bool) -> Self {
        self.cfg.answers.problem = on;
        self
    }

    /// Answers gRPC requests (`content-type: application/grpc...`) with gRPC statuses
    /// (default on): a refusal is `RESOURCE_EXHAUSTED` with the exact retry delay in a
    /// `google.rpc.RetryInfo`, sent trailers-only, so gRPC clients and their retry policies
    /// read it; see [the `response` docs](crate::response#grpc). Off, gRPC requests get the
    /// HTTP answers (a `429` with a problem body, which a tonic client reports as
    /// `INTERNAL`, without a delay).
    pub fn grpc_status(mut self, on: bool) -> Self {
        self.cfg.answers.grpc = on;
        self
    }

    /// Builds refusals with a closure instead. `Retry-After`, `Cache-Control: no-store`
    /// and the rate-limit fields are still added when the closure did not set them. gRPC
    /// requests keep their gRPC refusal unless [`Builder::grpc_status`] is off.
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        let f: Rejection = Arc::new(f);
        self.cfg.answers.rejection = Some(f);
        self
    }

    /// Inserts the [`Decision`] into the request's extensions so handlers can read the
    /// remaining quota (default off: it costs an allocation per request). A request a
    /// shadow limit would have refused always carries its decision
    /// ([`Decision::shadowed`]).
    pub fn expose_decision(mut self, on: bool) -> Self {
        self.cfg.expose = on;
        self
    }

    /// Names a response header that tells, on a request a shadow limit would have refused,
    /// which limits and when they would have let it through (`"free";r=0;t=3`). Off by
    /// default: shadow limits are invisible to clients.
    pub fn shadow_header(mut self, name: &str) -> Self {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => self.cfg.shadow_header = Some(n),
            Err(_) => self
                .cfg
                .core
                .fail(ConfigError::InvalidHeaderName(name.to_owned())),
        }
        self
    }

    /// Calls `hook` with every decision, admitted or refused, before the request goes on:
    /// per-route counts, logs, or headers for the response (what the hook inserts into
    /// the map is added to it).
    ///
    /// ```
    /// use tollgate::{key::PeerIp, Quota, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .key(PeerIp::new())
    ///     .token_bucket(Quota::per_second(10)?)
    ///     .on_decision(|event, headers| {
    ///         if !event.decision().is_allowed() {
    ///             headers.insert("x-refused-route", event.request().route().parse().unwrap());
    ///         }
    ///     })
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn on_decision<F>(mut self, hook: F) -> Self
    where
        F: Fn(&DecisionEvent<'_>, &mut HeaderMap) + Send + Sync + 'static,
    {
        self.cfg.hook = Some(Arc::new(hook));
        self
    }

    /// Never limits the requests `skip` returns `true` for (health checks, internal
    /// routes): no state, no rate-limit fields. Exempt is not keyless:
    /// [`Builder::on_missing_key`] stays about requests without a key.
    ///
    /// ```
    /// use tollgate::{key::PeerIp, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .key(PeerIp::new())
    ///     .policy("10/s")
    ///     .skip(|head| head.uri().path() == "/health")
    ///     .allow_ips(["10.0.0.0/8"])      // internal callers: never limited
    ///     .deny_ips(["203.0.113.66"])     // answered 403
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn skip<F>(mut self, skip: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> bool + Send + Sync + 'static,
    {
        self.cfg.access.skip = Some(Arc::new(skip));
        self
    }

    /// Never limits clients whose address is in one of these blocks (`10.0.0.0/8`,
    /// `2001:db8::/32`, or one address). The address is the connection's peer, or what
    /// [`Builder::client_ip`] finds behind your proxies. A bad block is reported by
    /// `build`.
    pub fn allow_ips<I, S>(mut self, cidrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        match access::blocks(cidrs) {
            Ok(b) => self.cfg.access.allow(b),
            Err(e) => self.cfg.core.fail(e),
        }
        self
    }

    /// Refuses clients whose address is in one of these blocks with `403 Forbidden` and a
    /// problem body, on every request, skipped ones included (an address on both lists is
    /// denied).
    pub fn deny_ips<I, S>(mut self, cidrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        match access::blocks(cidrs) {
            Ok(b) => self.cfg.access.deny(b),
            Err(e) => self.cfg.core.fail(e),
        }
        self
    }

    /// Where [`Builder::allow_ips`] and [`Builder::deny_ips`] read the client's address:
    /// behind reverse proxies, the address they forward (trusted only from them). The
    /// default is the connection's peer address.
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.cfg.access.client_ip = Some(client_ip);
        self
    }

    /// Never limits these keys (an internal caller's API key): no state, no rate-limit
    /// fields. Call it after [`Builder::key`]; the keys are of the type it extracts.
    ///
    /// ```
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// let layer = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-api-key")?)
    ///     .policy("100/min")
    ///     .allow_keys(["internal-batch"])
    ///     .deny_keys(["leaked-key-1"]) // 403
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn allow_keys<K, I>(mut self, keys: I) -> Self
    where
        X: KeyExtractor<Request<()>, Key = K>,
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        I: IntoIterator,
        I::Item: Into<K>,
    {
        self.cfg.core.allow_keys = Some(KeyList::new(keys.into_iter().map(Into::into)));
        self
    }

    /// Refuses these keys (a leaked or abusive API key) with `403 Forbidden` and a problem
    /// body. See [`Builder::allow_keys`].
    pub fn deny_keys<K, I>(mut self, keys: I) -> Self
    where
        X: KeyExtractor<Request<()>, Key = K>,
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        I: IntoIterator,
        I::Item: Into<K>,
    {
        self.cfg.core.deny_keys = Some(KeyList::new(keys.into_iter().map(Into::into)));
        self
    }

    /// Counts only the responses `count` returns `true` for: failed logins, say. Each
    /// request is charged when admitted (so that concurrent requests cannot overrun the
    /// limit) and refunded when its response is not to be counted. A request whose
    /// response never comes (an error, a dropped future) stays charged. Replaces
    /// [`Builder::settle_cost`].
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// // 5 failed logins per 15 minutes per user; successes are not counted.
    /// let failed_logins = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-user")?)
    ///     .policy("5/15min")
    ///     .count_when(|res| res.status() == StatusCode::UNAUTHORIZED)
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn count_when<F>(mut self, count: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        let rule: SettleRule = Arc::new(move |res, reserved| if count(res) { reserved } else { 0 });
        self.cfg.settle = Some(rule);
        self
    }

    /// Bans a key for `ban` once a counted response (see [`Builder::count_when`]) takes
    /// its last unit (fail2ban): after the 5th failed login of `5/15min`, say, the user is
    /// refused for the whole ban instead of until one failure is forgotten. Every limit of
    /// the layer's policies must be a token bucket, meter or queue (a window cannot hold a
    /// refusal past its end); `build` says so otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// let logins = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-user")?)
    ///     .policy("5/15min")
    ///     .count_when(|res| res.status() == 401)
    ///     .ban(Duration::from_secs(3600)) // the 5th failure bans for an hour
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ban(mut self, ban: std::time::Duration) -> Self {
        self.cfg.core.ban = Some(ban);
        self
    }

    /// Settles each request's cost from its response: the request is charged its
    /// estimated cost (the [`Builder::cost`]) when admitted, then `cost` reads the real one
    /// (bytes sent, rows, tokens used, from a header or an extension); the difference is
    /// charged (the key may go over its limit, and then waits it out) or refunded. `None`
    /// keeps the estimate. Replaces [`Builder::count_when`].
    ///
    /// ```
    /// use tollgate::{cost::cost_fn, key::HeaderKey, RateLimitLayer};
    ///
    /// // 100 000 tokens per minute per API key: reserve 500, settle what was used.
    /// let tokens = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-api-key")?)
    ///     .policy("100000/min")
    ///     .cost(cost_fn(|_: &http::Request<axum::body::Body>| 500))
    ///     .settle_cost(|res| res.header_u64("x-tokens-used"))
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn settle_cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> Option<u64> + Send + Sync + 'static,
    {
        let rule: SettleRule = Arc::new(move |res, reserved| cost(res).unwrap_or(reserved));
        self.cfg.settle = Some(rule);
        self
    }

    /// The layer's name in metrics and events (default `tollgate`).
    pub fn label(mut self, label: &str) -> Self {
        self.cfg.core.label = label.into();
        self
    }

    /// Bounds the memory of the built-in store, in bytes (default
    /// [`DEFAULT_MAX_BYTES`](crate::store::DEFAULT_MAX_BYTES), 32 MiB). A flood of keys
    /// never grows it past this: keys back to fresh go first, then those closest to it.
    /// With [`Builder::build_with`], size your own store instead.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.cfg.core.max_bytes = Some(bytes);
        self
    }

    fn finish<K: 'static, St>(
        self,
        store: St,
        set: PolicySet,
    ) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        St: Store<Option<K>>,
    {
        if self.cfg.core.ban.is_some() && self.cfg.settle.is_none() {
            return Err(ConfigError::PolicySet(
                "ban(..) bans after counted responses: give count_when(..) or settle_cost(..)"
                    .into(),
            ));
        }
        let flavour = Http {
            answers: self.cfg.answers,
            expose: self.cfg.expose,
            shadow_header: self.cfg.shadow_header,
            hook: self.cfg.hook,
            access: self.cfg.access.finish(),
            settle: self.cfg.settle,
        };
        let limiter = Limiter::new::<K>(self.key, self.cost, store, flavour, set, self.cfg.core)?;
        Ok(RateLimitLayer {
            limiter: Arc::new(limiter),
        })
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
    /// request type (a closure over `Request<axum::body::Body>`).
    pub fn build_for<Req>(
        mut self,
    ) -> Result<RateLimitLayer<X, DefaultStore<X::Key>, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let (set, store) = self.cfg.core.memory_store()?;
        self.finish::<X::Key, _>(store, set)
    }

    /// Builds the layer on a store of your own (a configured [`MemoryStore`], the Redis
    /// store). Without limits given to this builder, the layer applies the policy the store
    /// was built for.
    pub fn build_with<St>(self, store: St) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        St: Store<Option<<X as KeyExtractor<Request<()>>>::Key>>,
        X: KeyExtractor<Request<()>>,
        X::Key: 'static,
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
        X::Key: 'static,
    {
        let set = self.cfg.core.set_for(&store)?;
        self.finish::<X::Key, _>(store, set)
    }
}
