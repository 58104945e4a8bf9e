//! [`RateLimit`]: the service a [`RateLimitLayer`](super::RateLimitLayer) makes.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::access::Screen;
use super::answer::Http;
use super::future::ResponseFuture;
use super::limiter::RateCore;
use crate::core::{Begin, Machine, Next};
use crate::cost::{Cost, UnitCost};
use crate::key::{Global, KeyExtractor};
use crate::response::RateLimitBody;
use crate::store::{MemoryStore, Store};

/// The HTTP rate-limit service: the inner service `S` behind the limit of the
/// [`RateLimitLayer`](super::RateLimitLayer) that made it. It keeps the inner service's
/// error type and answers a refusal with a response (a `429`, or a gRPC status), so an
/// axum `Router` stays infallible. Every clone shares the layer's state.
///
/// See the [module docs](super).
pub struct RateLimit<S, X = Global, St = MemoryStore<Option<()>>, C = UnitCost> {
    inner: S,
    core: Arc<RateCore<X, St, C, Http>>,
}

impl<S, X, St, C> RateLimit<S, X, St, C> {
    pub(crate) fn new(inner: S, core: &Arc<RateCore<X, St, C, Http>>) -> Self {
        RateLimit {
            inner,
            core: Arc::clone(core),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, without the limit.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, X, St, C> Clone for RateLimit<S, X, St, C> {
    fn clone(&self) -> Self {
        RateLimit::new(self.inner.clone(), &self.core)
    }
}

impl<S: fmt::Debug, X, St, C> fmt::Debug for RateLimit<S, X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("label", &self.core.common.label)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, C, B, ResBody> Service<Request<B>> for RateLimit<S, X, St, C>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    B: Send + 'static,
    ResBody: Body<Data = Bytes> + 'static,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Request<B>> + Send + Sync + 'static,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    /// The layer's access rules first (skipped requests, allowed and denied addresses),
    /// then the core.
    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let limiter = &self.core.part;
        let begin = match limiter.flavour.access.screen(&req) {
            Screen::Limit => self.core.begin(&mut req),
            Screen::Exempt => {
                limiter.observe.exempt();
                Begin::Unlimited
            }
            Screen::Deny => Begin::Now(Next::Refuse(limiter.deny(&req))),
        };
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
