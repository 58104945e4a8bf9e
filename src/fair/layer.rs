//! [`FairLimitLayer`], its builder, its service and response future.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http::{response::Parts, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::{
    memory::MemoryFair,
    share::{FairDecision, Pool, Share},
    store::FairStore,
};
use crate::{
    error::{ConfigError, StoreError},
    future::take_ready,
    gate::{Admission, Decide, GateFuture},
    key::{Global, KeyExtractor, RequestHead},
    observe::outage,
    observe::KeylessWarning,
    observe::OncePerSecond,
    options::{MissingKey, OnStoreError},
    quota::Quota,
    response::{
        grpc, own_answer, problem_body, quota_refusal, rate_limit_item, retry_after_secs,
        sf_string, RateLimitBody, QUOTA_EXCEEDED, RATELIMIT, RATELIMIT_POLICY,
    },
    store::StoreFuture,
};

/// How a request's share is chosen.
enum Shares {
    One(Share),
    By(Box<dyn Fn(&RequestHead<'_>) -> Share + Send + Sync>),
}

/// What every service of one layer shares.
struct Shared<X, St> {
    key: X,
    store: St,
    pool: Pool,
    pool_quota: Quota,
    shares: Shares,
    missing: MissingKey,
    on_error: OnStoreError,
    label: Box<str>,
    /// `"label";r=` (the prefix of every `RateLimit` value).
    prefix: Vec<u8>,
    /// The `RateLimit-Policy` value of the one share, when there is one.
    policy: Option<HeaderValue>,
    body: Bytes,
    keyless: KeylessWarning,
    /// Store failures logged as a warning: the first of each second.
    failures: OncePerSecond,
    /// `tollgate.rate_limit.requests` by result: admitted, refused.
    #[cfg(feature = "metrics")]
    requests: [metrics::Counter; 2],
}

impl<X, St> Shared<X, St> {
    fn share(&self, head: &RequestHead<'_>) -> Share {
        match &self.shares {
            Shares::One(s) => *s,
            Shares::By(f) => f(head),
        }
    }

    fn count(&self, admitted: bool) {
        #[cfg(feature = "metrics")]
        self.requests[usize::from(!admitted)].increment(1);
        let _ = admitted;
    }

    /// `"label";q=G;w=W;borrow=B`: the key's guaranteed quota per its window of whole
    /// seconds, and how much more its ceiling lets it borrow in that window.
    fn policy_value(&self, share: &Share) -> HeaderValue {
        if let Some(v) = &self.policy {
            return v.clone();
        }
        policy_value(&self.label, share)
    }

    /// Adds the share's items to a response's `RateLimit-Policy` and `RateLimit`
    /// fields, beside those of other layers.
    fn apply(&self, headers: &mut HeaderMap, share: &Share, d: &FairDecision) {
        headers.append(&RATELIMIT_POLICY, self.policy_value(share));
        let reset = retry_after_secs(Duration::from_nanos(d.reset_after));
        headers.append(
            &RATELIMIT,
            rate_limit_item(&self.prefix, d.remaining, reset),
        );
    }

    fn refusal(&self, share: &Share, d: &FairDecision, is_grpc: bool) -> Response<Bytes> {
        tracing::info!(
            target: "tollgate",
            limiter = %self.label,
            retry_after_ms = d.retry_after / 1_000_000,
            "fair-share limit refused a request"
        );
        let message =
            is_grpc.then_some("Request quota exceeded; retry after the delay in RetryInfo.");
        let wait = Duration::from_nanos(d.retry_after);
        // `RateLimit-Policy` and `RateLimit` follow.
        let mut r = quota_refusal(Some(self.body.clone()), message, Some(wait), 2);
        let h = r.headers_mut();
        self.apply(h, share, d);
        r
    }
}

fn policy_value(label: &str, share: &Share) -> HeaderValue {
    let g = share.guaranteed();
    let w = retry_after_secs(g.period()).max(1);
    // The guaranteed and the ceiling's units in a window of `w` seconds.
    let per_window = |q: Quota| -> u128 {
        u128::from(w) * 1_000_000_000 / q.emission_interval().as_nanos().max(1)
    };
    let q = per_window(g);
    let borrow = per_window(share.ceiling()).saturating_sub(q);
    let mut v = Vec::new();
    sf_string(label, &mut v);
    for (name, n) in [
        (&b";q="[..], q),
        (b";w=", u128::from(w)),
        (b";borrow=", borrow),
    ] {
        v.extend_from_slice(name);
        v.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    }
    HeaderValue::from_bytes(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Shares a pool among the keys of `key` (HTB-style fair sharing with borrowing):
/// `.layer(FairLimitLayer::builder(..).share(..).build()?)` on an axum `Router`, a route,
/// or any tower HTTP service (a tonic server included). See the [module docs](super).
///
/// One layer value is one pool: every service it makes and every clone shares it.
pub struct FairLimitLayer<X = Global, St = MemoryFair<()>> {
    shared: Arc<Shared<X, St>>,
}

impl<X, St> Clone for FairLimitLayer<X, St> {
    fn clone(&self) -> Self {
        FairLimitLayer {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<X: fmt::Debug, St: fmt::Debug> fmt::Debug for FairLimitLayer<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.shared;
        f.debug_struct("FairLimitLayer")
            .field("key", &s.key)
            .field("pool", &s.pool_quota)
            .field("label", &s.label)
            .field("store", &s.store)
            .finish_non_exhaustive()
    }
}

impl FairLimitLayer {
    /// A builder for a pool of `pool` (its rate and burst: the most every key together
    /// is admitted) shared among the keys of `key`. Set each key's
    /// [`share`](FairLimitBuilder::share), then build.
    pub fn builder<X>(key: X, pool: Quota) -> FairLimitBuilder<X> {
        FairLimitBuilder {
            key,
            pool,
            shares: None,
            label: "fair".into(),
            missing: MissingKey::default(),
            on_error: OnStoreError::default(),
            period: Duration::from_secs(1),
        }
    }
}

/// Builds a [`FairLimitLayer`]. Made by [`FairLimitLayer::builder`].
pub struct FairLimitBuilder<X> {
    key: X,
    pool: Quota,
    shares: Option<Shares>,
    label: String,
    missing: MissingKey,
    on_error: OnStoreError,
    period: Duration,
}

impl<X: fmt::Debug> fmt::Debug for FairLimitBuilder<X> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLimitBuilder")
            .field("key", &self.key)
            .field("pool", &self.pool)
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

impl<X> FairLimitBuilder<X> {
    /// Every key's share: its guaranteed rate and its ceiling.
    pub fn share(mut self, share: Share) -> Self {
        self.shares = Some(Shares::One(share));
        self
    }

    /// Chooses each request's share from its head (a plan an auth layer inserted, a
    /// header's prefix). Keys weigh in the sharing by their guaranteed rates.
    ///
    /// ```
    /// use tollgate::{fair::Share, key::HeaderKey, FairLimitLayer, Quota};
    ///
    /// let free = Share::new(Quota::per_second(2)?, Quota::per_second(10)?)?;
    /// let pro = Share::new(Quota::per_second(6)?, Quota::per_second(20)?)?;
    /// let layer = FairLimitLayer::builder(HeaderKey::new("x-api-key")?, Quota::per_second(40)?)
    ///     .share_by(move |head| match head.headers().get("x-api-key") {
    ///         Some(k) if k.as_bytes().starts_with(b"pro_") => pro,
    ///         _ => free,
    ///     })
    ///     .build()?;
    /// # let _: axum::Router = axum::Router::new().layer(layer);
    /// # Ok::<(), tollgate::ConfigError>(())
    /// ```
    pub fn share_by<F>(mut self, share: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Share + Send + Sync + 'static,
    {
        self.shares = Some(Shares::By(Box::new(share)));
        self
    }

    /// The pool's name in the `RateLimit` fields, the problem body, the logs and the
    /// metrics, and in its Redis key (default `fair`). Printable ASCII without braces.
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.into();
        self
    }

    /// What to do with requests that carry no key (default [`MissingKey::Shared`]: they
    /// share one key's state).
    pub fn on_missing_key(mut self, missing: MissingKey) -> Self {
        self.missing = missing;
        self
    }

    /// What to do when the store fails (default [`OnStoreError::FailOpen`]).
    pub fn on_store_error(mut self, on_error: OnStoreError) -> Self {
        self.on_error = on_error;
        self
    }

    /// How long a key counts as asking for its share after it last asked: until the end
    /// of the next activity period of this length (default 1 s; whole microseconds
    /// between 1 ms and a day). Shorter periods follow changes of who is asking sooner;
    /// a key asking less often than once per period is sometimes left out of the count
    /// (its share is then larger for a while, and the others' smaller).
    pub fn activity_period(mut self, period: Duration) -> Self {
        self.period = period;
        self
    }

    /// Builds the layer on an in-memory store of its own. Refuses a missing share, a
    /// pool or activity period out of range, and a label that cannot be sent in a header.
    pub fn build(self) -> Result<FairLimitLayer<X, MemoryFair<X::Key>>, ConfigError>
    where
        X: KeyExtractor<Request<()>>,
    {
        self.build_with(MemoryFair::new())
    }

    /// Builds the layer on `store` ([`MemoryFair`] with a clock or a budget of your own,
    /// or `RedisFair` to share the pool across instances).
    pub fn build_with<St>(self, store: St) -> Result<FairLimitLayer<X, St>, ConfigError> {
        let label = self.label;
        // Printable, and without braces: the label is the pool's Redis hash tag.
        if label.is_empty()
            || !label
                .bytes()
                .all(|b| (0x20..=0x7e).contains(&b) && b != b'{' && b != b'}')
        {
            return Err(ConfigError::InvalidName(label));
        }
        let shares = self.shares.ok_or_else(|| {
            ConfigError::Fair("no share: call FairLimitBuilder::share or share_by".into())
        })?;
        let pool = Pool::new(&label, self.pool, self.period)?;
        let mut prefix = Vec::new();
        sf_string(&label, &mut prefix);
        prefix.extend_from_slice(b";r=");
        let policy = match &shares {
            Shares::One(s) => Some(policy_value(&label, s)),
            Shares::By(_) => None,
        };
        let body = problem_body(
            429,
            "Too Many Requests",
            "This client's share of the pool is used up; retry after the Retry-After delay.",
            &[&label],
            Some(QUOTA_EXCEEDED),
        );
        #[cfg(feature = "metrics")]
        crate::observe::describe();
        Ok(FairLimitLayer {
            shared: Arc::new(Shared {
                #[cfg(feature = "metrics")]
                requests: ["admitted", "refused"].map(|r| {
                    metrics::counter!(
                        "tollgate.rate_limit.requests",
                        "tollgate.limiter" => label.clone(),
                        "tollgate.policy" => "fair",
                        "tollgate.result" => r
                    )
                }),
                key: self.key,
                store,
                pool,
                pool_quota: self.pool,
                shares,
                missing: self.missing,
                on_error: self.on_error,
                label: label.into(),
                prefix,
                policy,
                body,
                keyless: KeylessWarning::default(),
                failures: OncePerSecond::default(),
            }),
        })
    }
}

impl<S, X, St> Layer<S> for FairLimitLayer<X, St> {
    type Service = FairLimit<S, X, St>;

    fn layer(&self, inner: S) -> Self::Service {
        FairLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The fair-sharing service. Made by [`FairLimitLayer`]; see the [module docs](super).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service.
pub struct FairLimit<S, X, St> {
    inner: S,
    shared: Arc<Shared<X, St>>,
}

impl<S: Clone, X, St> Clone for FairLimit<S, X, St> {
    fn clone(&self) -> Self {
        FairLimit {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, X, St> fmt::Debug for FairLimit<S, X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLimit")
            .field("inner", &self.inner)
            .field("label", &self.shared.label)
            .finish_non_exhaustive()
    }
}

/// What an admitted request's response reports (nothing when it was not limited).
pub(crate) struct Fields<X, St>(Option<Reported<X, St>>);

/// A decision, with what formats its fields.
pub(crate) struct Reported<X, St> {
    shared: Arc<Shared<X, St>>,
    share: Share,
    decision: FairDecision,
}

impl<X, St> Admission for Fields<X, St> {
    type Body<B> = RateLimitBody<B>;

    fn respond<B>(self, parts: &mut Parts, body: B) -> RateLimitBody<B> {
        if let Some(r) = &self.0 {
            r.shared.apply(&mut parts.headers, &r.share, &r.decision);
        }
        RateLimitBody::inner(body)
    }

    fn own<B>(data: Bytes) -> RateLimitBody<B> {
        RateLimitBody::full(data)
    }
}

/// A decision coming from a network store.
pub(crate) struct Deciding<X, St> {
    deciding: StoreFuture<FairDecision>,
    shared: Arc<Shared<X, St>>,
    share: Share,
    is_grpc: bool,
}

impl<X, St> Decide for Deciding<X, St> {
    type Admitted = Fields<X, St>;

    fn poll_decide(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Fields<X, St>, Box<Response<Bytes>>>> {
        let result = ready!(Pin::new(&mut self.deciding).poll(cx));
        Poll::Ready(settle(&self.shared, self.share, result, || self.is_grpc))
    }
}

/// What a decision (or a store failure) means for the request. `grpc` says, when asked,
/// whether the request is a gRPC call (read only for an answer of the layer's own).
fn settle<X, St>(
    shared: &Arc<Shared<X, St>>,
    share: Share,
    result: Result<FairDecision, StoreError>,
    grpc: impl FnOnce() -> bool,
) -> Result<Fields<X, St>, Box<Response<Bytes>>> {
    match result {
        Ok(d) if d.admitted => {
            shared.count(true);
            Ok(Fields(Some(Reported {
                shared: Arc::clone(shared),
                share,
                decision: d,
            })))
        }
        Ok(d) => {
            shared.count(false);
            Err(Box::new(shared.refusal(&share, &d, grpc())))
        }
        Err(e) => failed(shared, &e, grpc),
    }
}

#[cold]
fn failed<X, St>(
    shared: &Shared<X, St>,
    e: &StoreError,
    grpc: impl FnOnce() -> bool,
) -> Result<Fields<X, St>, Box<Response<Bytes>>> {
    outage!(shared.failures, "tollgate", limiter = %shared.label, error = %e, "fair-share store failed");
    match shared.on_error {
        OnStoreError::FailClosed => Err(Box::new(own_answer(
            grpc(),
            StatusCode::SERVICE_UNAVAILABLE,
            "The fair-share limiter's store is unavailable.",
        ))),
        _ => Ok(Fields(None)),
    }
}

pin_project! {
    /// The response future of [`FairLimit`]. No allocation when the decision is made at
    /// once (the in-memory store).
    pub struct ResponseFuture<S, B, X, St>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        inner: GateFuture<S, B, Deciding<X, St>>,
    }
}

impl<S, B, X, St> fmt::Debug for ResponseFuture<S, B, X, St>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResponseFuture")
            .field(&self.inner.state_name())
            .finish()
    }
}

impl<S, B, X, St, ResBody> Future for ResponseFuture<S, B, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, S::Error>;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for FairLimit<S, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>>,
    St: FairStore<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B, X, St>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let shared = &self.shared;
        let key = shared.key.extract(&req);
        if key.is_none() {
            shared.keyless.keyless(
                &shared.key,
                &req,
                &shared.label,
                shared.missing,
                "fair-share limit",
            );
            match shared.missing {
                MissingKey::Allow => {
                    let future = self.inner.call(req);
                    return ResponseFuture {
                        inner: GateFuture::calling(future, Fields(None)),
                    };
                }
                MissingKey::Reject(status) => {
                    let response = own_answer(
                        grpc::is_grpc(req.headers()),
                        status,
                        "No fair-share key could be extracted from this request.",
                    );
                    return ResponseFuture {
                        inner: GateFuture::answered(response),
                    };
                }
                _ => {}
            }
        }
        let share = shared.share(&RequestHead::of(&req));
        let mut deciding = shared.store.decide(key.as_ref(), &shared.pool, &share);
        let inner = match deciding.take_ready() {
            Some(result) => match settle(shared, share, result, || grpc::is_grpc(req.headers())) {
                Ok(fields) => GateFuture::calling(self.inner.call(req), fields),
                Err(response) => GateFuture::answered(*response),
            },
            None => {
                let decide = Deciding {
                    deciding,
                    shared: Arc::clone(shared),
                    share,
                    is_grpc: grpc::is_grpc(req.headers()),
                };
                GateFuture::deciding(decide, take_ready(&mut self.inner), req)
            }
        };
        ResponseFuture { inner }
    }
}
