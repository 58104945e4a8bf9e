//! The generic [`RateLimit`] service.

use std::{
    fmt,
    hash::Hash,
    sync::Arc,
    task::{Context, Poll},
};

use tower_service::Service;

use super::{answer::Generic, future::ResponseFuture};
use crate::{
    cost::Cost, error::BoxError, future::Machine, key::KeyExtractor, limiter::Limiter, store::Store,
};

/// The generic rate-limit service. See the [module docs](super).
pub struct RateLimit<S, X, St, C> {
    pub(crate) inner: S,
    pub(crate) limiter: Arc<Limiter<X, St, C, Generic>>,
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
        f.debug_struct("generic::RateLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, C, Req> Service<Req> for RateLimit<S, X, St, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    Req: Send + 'static,
    X: KeyExtractor<Req> + Send + Sync + 'static,
    X::Key: Hash + Clone + Send + Sync + 'static,
    St: Store<Option<X::Key>>,
    C: Cost<Req> + Send + Sync + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S, Req>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: Req) -> Self::Future {
        let begin = self.limiter.begin(&mut req);
        Machine::start(begin, &mut self.inner, req, |machine| ResponseFuture {
            machine,
        })
    }
}
