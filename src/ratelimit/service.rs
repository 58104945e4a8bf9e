//! [`RateLimit`]: the HTTP middleware service made by [`RateLimitLayer`](super::RateLimitLayer).

use std::{
    fmt,
    hash::Hash,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{answer::Http, future::ResponseFuture};
use crate::{
    cost::Cost, future::Machine, key::KeyExtractor, limiter::Limiter, response::RateLimitBody,
    store::Store,
};

/// The HTTP rate-limit service. Made by [`RateLimitLayer`](super::RateLimitLayer); see
/// the [crate docs](crate).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service; the
/// decision is made in `call`.
pub struct RateLimit<S, X, St, C> {
    pub(crate) inner: S,
    pub(crate) limiter: Arc<Limiter<X, St, C, Http>>,
}

impl<S: Clone, X, St, C> Clone for RateLimit<S, X, St, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<S: fmt::Debug, X, St, C> fmt::Debug for RateLimit<S, X, St, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, C, B, ResBody> Service<Request<B>> for RateLimit<S, X, St, C>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    B: Send + 'static,
    ResBody: 'static,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Request<B>> + Send + Sync + 'static,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let begin = self.limiter.begin(&mut req);
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
