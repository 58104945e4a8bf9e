//! [`RateLimit`]: the service a generic [`RateLimitLayer`](super::RateLimitLayer) makes.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::task::{Context, Poll};

use tower_service::Service;

use super::answer::Generic;
use super::future::ResponseFuture;
use crate::cost::{Cost, UnitCost};
use crate::error::BoxError;
use crate::key::{Global, KeyExtractor};
use crate::ratelimit::limiter::RateCore;
use crate::store::{MemoryStore, Store};

/// The generic rate-limit service: the inner service `S` behind the limit of the
/// [`RateLimitLayer`](super::RateLimitLayer) that made it. A refusal is a
/// [`RateLimited`](super::RateLimited) error (`BoxError`, which `tower`'s layers and
/// `tower::retry` expect). Every clone shares the layer's state.
///
/// See the [module docs](super).
pub struct RateLimit<S, X = Global, St = MemoryStore<Option<()>>, C = UnitCost> {
    inner: S,
    core: Arc<RateCore<X, St, C, Generic>>,
}

impl<S, X, St, C> RateLimit<S, X, St, C> {
    pub(crate) fn new(inner: S, core: &Arc<RateCore<X, St, C, Generic>>) -> Self {
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
        f.debug_struct("generic::RateLimit")
            .field("inner", &self.inner)
            .field("label", &self.core.common.label)
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

    fn call(&mut self, req: Req) -> Self::Future {
        self.core
            .call(&mut self.inner, req, |machine| ResponseFuture { machine })
    }
}
