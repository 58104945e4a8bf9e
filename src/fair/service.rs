//! [`FairLimit`]: the service a [`FairLimitLayer`](super::FairLimitLayer) makes, and the
//! layer's part of the core: the pool asked for the request's share.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower_service::Service;

use super::answer::{settle, FairReplies, Reported};
use super::future::{Deciding, ResponseFuture};
use super::memory::MemoryFair;
use super::share::{Pool, Share};
use super::store::FairStore;
use crate::core::{Begin, Common, Core, Next, Part};
use crate::key::{Global, KeyExtractor, RequestHead};
use crate::quota::Quota;
use crate::response::{OwnAnswer, RateLimitBody};
use crate::store::Budget;

/// How a request's share is chosen.
pub(crate) enum Shares {
    One(Share),
    By(Box<dyn Fn(&RequestHead<'_>) -> Share + Send + Sync>),
}

/// The fair-sharing layer's part of the core: its store, its pool, how shares are chosen
/// and its answers.
#[allow(missing_debug_implementations)]
pub(crate) struct Sharing<St> {
    pub(crate) store: St,
    pub(crate) pool: Pool,
    pub(crate) pool_quota: Quota,
    pub(crate) shares: Shares,
    pub(crate) replies: Arc<FairReplies>,
}

impl<B, K, St: FairStore<K>> Part<Request<B>, K> for Sharing<St> {
    type Answer = OwnAnswer;
    type Extra = Reported;
    type Later = Deciding;

    #[inline]
    fn decide<X: Send + Sync + 'static>(
        core: &Arc<Core<X, Self>>,
        key: Option<K>,
        req: &mut Request<B>,
    ) -> Begin<OwnAnswer, Reported, Deciding> {
        let part = &core.part;
        let share = match &part.shares {
            Shares::One(s) => *s,
            Shares::By(f) => f(&RequestHead::of(req)),
        };
        let on_error = core.common.on_error();
        let budget = req.extensions().get::<Budget>();
        let mut deciding = part.store.decide(key.as_ref(), &part.pool, &share, budget);
        match deciding.take_ready() {
            Some(result) => Begin::Now(Next::at_once(settle(
                result,
                &part.replies,
                share,
                on_error,
                req,
            ))),
            None => Begin::Later(Deciding {
                deciding,
                replies: Arc::clone(&part.replies),
                share,
                on_error,
            }),
        }
    }

    fn keyless(&self, common: &Common, req: &Request<B>, status: StatusCode) -> OwnAnswer {
        common.keyless_answer(req, status)
    }
}

/// The fair-sharing service: the inner service `S` behind the pool of the
/// [`FairLimitLayer`](super::FairLimitLayer) that made it. A refusal is a `429` (or a gRPC
/// status) of the layer's own. Every clone shares the layer's pool.
///
/// See the [module docs](super).
pub struct FairLimit<S, X = Global, St = MemoryFair<()>> {
    inner: S,
    core: Arc<Core<X, Sharing<St>>>,
}

impl<S, X, St> FairLimit<S, X, St> {
    pub(crate) fn new(inner: S, core: &Arc<Core<X, Sharing<St>>>) -> Self {
        FairLimit {
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

impl<S: Clone, X, St> Clone for FairLimit<S, X, St> {
    fn clone(&self) -> Self {
        FairLimit::new(self.inner.clone(), &self.core)
    }
}

impl<S: fmt::Debug, X, St> fmt::Debug for FairLimit<S, X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLimit")
            .field("inner", &self.inner)
            .field("label", &self.core.common.label)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for FairLimit<S, X, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>> + Send + Sync + 'static,
    St: FairStore<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        self.core
            .call(&mut self.inner, req, |machine| ResponseFuture { machine })
    }
}
