//! The HTTP layer's setters of [`Builder`]: its answers (fields, problem bodies, gRPC
//! statuses, a refusal of your own), its hook, its exemptions and deny lists, counting
//! only some responses, and `build`.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, Response};

use super::access::{self, Access};
use super::answer::{DecisionEvent, HeadSelect, Http};
use super::builder::Builder;
use super::layer::RateLimitLayer;
use crate::deadline::DeadlineSources;
use crate::decision::Decision;
use crate::error::ConfigError;
use crate::key::{cidr::Cidr, ClientIp, KeyExtractor, RequestHead};
use crate::options::KeyList;
use crate::policy::{choose::Chooser, PolicyName};
use crate::response::{Rejection, ResponseHead, SettleRule};
use crate::store::{MemoryStore, Store};

/// The HTTP layer's own setters. See [`RateLimitLayer::builder`].
impl<X, C> Builder<X, C, Http> {
    /// Picks, per request, which named policy applies: by the key (a prefix, a claim), by
    /// what an auth layer inserted (a plan), by route. A name the set lacks gets the
    /// fallback; a selector returning a closed set of names ([`PolicyName::all_names`],
    /// an enum of plans) is checked against the set when the layer is built. Call it after
    /// [`Builder::key`](crate::ratelimit::Builder::key).
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
    pub fn select<F, N, K>(mut self, select: F) -> Self
    where
        F: Fn(&RequestHead<'_>, Option<&K>) -> N + Send + Sync + 'static,
        N: PolicyName,
        K: 'static,
    {
        self.settings.names = N::all_names();
        let select: HeadSelect<K> =
            Box::new(move |head, key, set| set.choose(select(head, key).policy_name()));
        self.settings.chooser = Some(Chooser::new::<_, K>(select));
        self
    }

    /// The IETF `RateLimit` and `RateLimit-Policy` fields on every response (default on).
    pub fn ietf_headers(mut self, on: bool) -> Self {
        self.flavour.answers.ietf = on;
        self
    }

    /// The legacy `X-RateLimit-Limit` / `-Remaining` / `-Reset` trio (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.flavour.answers.legacy = on;
        self
    }

    /// RFC 9457 `application/problem+json` refusal bodies (default on); off, a refusal
    /// has an empty body.
    pub fn problem_details(mut self, on: bool) -> Self {
        self.flavour.answers.problem = on;
        self
    }

    /// Answers gRPC requests (`content-type: application/grpc...`) with gRPC statuses
    /// (default on): a refusal is `RESOURCE_EXHAUSTED` with the exact retry delay in a
    /// `google.rpc.RetryInfo`, sent trailers-only, so gRPC clients and their retry policies
    /// read it; see [the `response` docs](crate::response#grpc). Off, gRPC requests get the
    /// HTTP answers (a `429` with a problem body, which a tonic client reports as
    /// `INTERNAL`, without a delay).
    pub fn grpc_status(mut self, on: bool) -> Self {
        self.flavour.answers.grpc = on;
        self
    }

    /// Builds refusals with a closure instead. `Retry-After`, `Cache-Control: no-store`
    /// and the rate-limit fields are still added when the closure did not set them. gRPC
    /// requests keep their gRPC refusal unless [`Builder::grpc_status`](crate::ratelimit::Builder::grpc_status) is off.
    pub fn on_rejection<F>(mut self, f: F) -> Self
    where
        F: Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    {
        let f: Rejection = Arc::new(f);
        self.flavour.answers.rejection = Some(f);
        self
    }

    /// Inserts the [`Decision`] into the request's extensions so handlers can read the
    /// remaining quota (default off: it costs an allocation per request). A request a
    /// shadow limit would have refused always carries its decision
    /// ([`Decision::shadowed`]).
    pub fn expose_decision(mut self, on: bool) -> Self {
        self.flavour.expose = on;
        self
    }

    /// Counts the layer's decisions (`tollgate.rate_limit.requests_total`) by the route
    /// the request matched, in the attribute `tollgate.route`: axum's `MatchedPath` (a
    /// template such as `/users/{id}`, never a raw path), `unmatched` without one (a
    /// fallback), `other` past 256 distinct routes. Off by default. See the crate docs'
    /// [Metrics](crate#metrics).
    #[cfg(feature = "axum")]
    pub fn route_metrics(mut self, on: bool) -> Self {
        self.settings.route_metrics = on;
        self
    }

    /// Names a response header that tells, on a request a shadow limit would have refused,
    /// which limits and when they would have let it through (`"free";r=0;t=3`). Off by
    /// default: shadow limits are invisible to clients.
    pub fn shadow_header(mut self, name: &str) -> Self {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => self.flavour.shadow_header = Some(n),
            Err(_) => self
                .settings
                .fail(ConfigError::InvalidHeaderName(name.to_owned())),
        }
        self
    }

    /// Also reads a request's deadline from `name`, the time its caller has left in
    /// milliseconds (besides `grpc-timeout`, `x-envoy-expected-rq-timeout-ms` and a
    /// [`Deadline`](crate::Deadline) in the extensions, always read). A queued request
    /// whose slot would come after its deadline is refused at once, its slot left free:
    /// see [`Deadline`](crate::Deadline).
    pub fn deadline_header(mut self, name: &str) -> Self {
        match HeaderName::from_bytes(name.as_bytes()) {
            Ok(n) => self.flavour.deadlines = DeadlineSources::with_header(n),
            Err(_) => self
                .settings
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
        self.flavour.hook = Some(Arc::new(hook));
        self
    }

    /// Never limits the requests `skip` returns `true` for (health checks, internal
    /// routes): no state, no rate-limit fields. Exempt is not keyless:
    /// [`Builder::on_missing_key`](crate::ratelimit::Builder::on_missing_key) stays about requests without a key.
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
        self.flavour.access.skip = Some(Arc::new(skip));
        self
    }

    /// Never limits clients whose address is in one of these blocks (`10.0.0.0/8`,
    /// `2001:db8::/32`, or one address). The address is the connection's peer, or what
    /// [`Builder::client_ip`](crate::ratelimit::Builder::client_ip) finds behind your proxies. A bad block is reported by
    /// `build`.
    pub fn allow_ips<S: AsRef<str>>(self, cidrs: impl IntoIterator<Item = S>) -> Self {
        self.ips(cidrs, Access::allow)
    }

    /// Refuses clients whose address is in one of these blocks with `403 Forbidden` and a
    /// problem body, on every request, skipped ones included (an address on both lists is
    /// denied).
    pub fn deny_ips<S: AsRef<str>>(self, cidrs: impl IntoIterator<Item = S>) -> Self {
        self.ips(cidrs, Access::deny)
    }

    /// Adds the blocks `cidrs` to a list with `add`, or keeps the error for `build`.
    fn ips<S: AsRef<str>>(
        mut self,
        cidrs: impl IntoIterator<Item = S>,
        add: fn(&mut Access, Vec<Cidr>),
    ) -> Self {
        match access::blocks(cidrs) {
            Ok(b) => add(&mut self.flavour.access, b),
            Err(e) => self.settings.fail(e),
        }
        self
    }

    /// Where [`Builder::allow_ips`](crate::ratelimit::Builder::allow_ips) and [`Builder::deny_ips`](crate::ratelimit::Builder::deny_ips) read the client's address:
    /// behind reverse proxies, the address they forward (trusted only from them). The
    /// default is the connection's peer address.
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.flavour.access.client_ip = Some(client_ip);
        self
    }

    /// Counts only the responses `count` returns `true` for: failed logins, say. Each
    /// request is charged when admitted (so that concurrent requests cannot overrun the
    /// limit) and refunded when its response is not to be counted. A request whose
    /// response never comes (an error, a dropped future) stays charged. Replaces
    /// [`Builder::settle_cost`](crate::ratelimit::Builder::settle_cost).
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// // At most 5 failed logins in any 15 minutes per user; successes are not counted.
    /// let failed_logins = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-user")?)
    ///     .policy("1/15min burst 5")
    ///     .count_when(|res| res.status() == StatusCode::UNAUTHORIZED)
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn count_when<F>(mut self, count: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> bool + Send + Sync + 'static,
    {
        let rule: SettleRule = Arc::new(move |res, reserved| if count(res) { reserved } else { 0 });
        self.flavour.settle = Some(rule);
        self
    }

    /// Bans a key for `ban` once a counted response (see [`Builder::count_when`](crate::ratelimit::Builder::count_when)) takes
    /// its last unit (fail2ban): after the 5th failed login within 15 minutes of
    /// `1/15min burst 5`, say, the user is refused for the whole ban instead of until one
    /// try comes back. Every limit of
    /// the layer's policies must be a token bucket, meter or queue (a window cannot hold a
    /// refusal past its end); `build` says so otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// let logins = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-user")?)
    ///     .policy("1/15min burst 5")
    ///     .count_when(|res| res.status() == 401)
    ///     .ban(Duration::from_secs(3600)) // the 5th failure bans for an hour
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn ban(mut self, ban: Duration) -> Self {
        self.settings.ban = Some(ban);
        self
    }

    /// Settles each request's cost from its response: the request is charged its
    /// estimated cost (the [`Builder::cost`](crate::ratelimit::Builder::cost)) when admitted, then `cost` reads the real one
    /// (bytes sent, rows, tokens used, from a header or an extension); the difference is
    /// charged (the key may go over its limit, and then waits it out) or refunded. `None`
    /// keeps the estimate. Replaces [`Builder::count_when`](crate::ratelimit::Builder::count_when).
    ///
    /// ```
    /// use tollgate::{key::HeaderKey, RateLimitLayer};
    ///
    /// // 100 000 tokens per minute per API key: reserve 500, settle what was used.
    /// let tokens = RateLimitLayer::builder()
    ///     .key(HeaderKey::new("x-api-key")?)
    ///     .policy("100000/min")
    ///     .cost(|_: &http::Request<axum::body::Body>| 500)
    ///     .settle_cost(|res| res.header_u64("x-tokens-used"))
    ///     .build()?;
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn settle_cost<F>(mut self, cost: F) -> Self
    where
        F: Fn(&ResponseHead<'_>) -> Option<u64> + Send + Sync + 'static,
    {
        let rule: SettleRule = Arc::new(move |res, reserved| cost(res).unwrap_or(reserved));
        self.flavour.settle = Some(rule);
        self
    }

    /// Checks what only the whole configuration can tell, and readies the answers.
    fn finished(mut self) -> Result<Self, ConfigError> {
        if self.settings.ban.is_some() && self.flavour.settle.is_none() {
            return Err(ConfigError::PolicySet(
                "ban(..) bans after counted responses: give count_when(..) or settle_cost(..)"
                    .into(),
            ));
        }
        self.flavour.access = std::mem::take(&mut self.flavour.access).finish();
        Ok(self)
    }

    /// Builds the layer for HTTP requests with the in-memory store (following tokio's
    /// clock, so paused-time tests drive it).
    pub fn build<K>(self) -> Result<RateLimitLayer<X, MemoryStore<Option<K>>, C>, ConfigError>
    where
        X: KeyExtractor<Request<()>, Key = K>,
        K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        self.build_for::<Request<()>>()
    }

    /// Builds the layer with the in-memory store, for extractors that only work on one
    /// request type (a closure over `Request<axum::body::Body>`).
    #[allow(clippy::type_complexity)] // the built-in store's type, spelled out for the docs
    pub fn build_for<Req>(
        self,
    ) -> Result<RateLimitLayer<X, MemoryStore<Option<X::Key>>, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        X::Key: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    {
        let core = self.finished()?.core_in_memory::<X::Key>()?;
        Ok(RateLimitLayer { core })
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

    /// [`Builder::build_with`](crate::ratelimit::Builder::build_with) for a specific request type.
    pub fn build_with_for<Req, St>(self, store: St) -> Result<RateLimitLayer<X, St, C>, ConfigError>
    where
        X: KeyExtractor<Req>,
        St: Store<Option<X::Key>>,
        X::Key: 'static,
    {
        let core = self.finished()?.core_with::<X::Key, _>(store)?;
        Ok(RateLimitLayer { core })
    }
}

/// The HTTP layer's lists of keys never limited or always refused, of the type its
/// extractor gives.
impl<X, C> Builder<X, C, Http>
where
    X: KeyExtractor<Request<()>>,
    X::Key: std::hash::Hash + Eq + Send + Sync + 'static,
{
    /// Never limits these keys (an internal caller's API key): no state, no rate-limit
    /// fields. Call it after [`Builder::key`](crate::ratelimit::Builder::key); the keys are of the type it extracts.
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
    pub fn allow_keys(mut self, keys: impl IntoIterator<Item = impl Into<X::Key>>) -> Self {
        self.settings.allow_keys = Some(KeyList::new(keys.into_iter().map(Into::<X::Key>::into)));
        self
    }

    /// Refuses these keys (a leaked or abusive API key) with `403 Forbidden` and a problem
    /// body. See [`Builder::allow_keys`](crate::ratelimit::Builder::allow_keys).
    pub fn deny_keys(mut self, keys: impl IntoIterator<Item = impl Into<X::Key>>) -> Self {
        self.settings.deny_keys = Some(KeyList::new(keys.into_iter().map(Into::<X::Key>::into)));
        self
    }
}
