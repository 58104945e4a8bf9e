//! [`FairLimit`]: the service made by [`FairLimitLayer`](super::FairLimitLayer).

use std::{
    fmt,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{
    answer::{settle, FairReplies},
    future::{Deciding, ResponseFuture},
    share::{Pool, Share},
    store::FairStore,
};
use crate::{
    gate::{Common, Decided},
    key::{KeyExtractor, RequestHead},
    quota::Quota,
    response::RateLimitBody,
};

/// How a request's share is chosen.
pub(crate) enum Shares {
    One(Share),
    By(Box<dyn Fn(&RequestHead<'_>) -> Share + Send + Sync>),
}

/// What every service of one layer shares.
pub(crate) struct Shared<X, St> {
    pub(crate) common: Common<X>,
    pub(crate) store: St,
    pub(crate) pool: Pool,
    pub(crate) pool_quota: Quota,
    pub(crate) shares: Shares,
    pub(crate) replies: Arc<FairReplies>,
}

impl<X, St> Shared<X, St> {
    fn share(&self, head: &RequestHead<'_>) -> Share {
        match &self.shares {
            Shares::One(s) => *s,
            Shares::By(f) => f(head),
        }
    }
}

/// The fair-sharing service. Made by [`FairLimitLayer`](super::FairLimitLayer); see the
/// [module docs](super).
///
/// It keeps the inner service's error type and answers refusals with a response, so an
/// axum `Router` stays infallible. `poll_ready` only forwards to the inner service.
pub struct FairLimit<S, X, St> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<X, St>>,
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
            .field("label", &self.shared.common.label)
            .finish_non_exhaustive()
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
    type Future = ResponseFuture<S, B>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let s = &*self.shared;
        let on_error = s.common.on_error;
        let machine = s.common.call(&mut self.inner, req, |key, req| {
            let share = s.share(&RequestHead::of(req));
            let mut deciding = s.store.decide(key.as_ref(), &s.pool, &share);
            match deciding.take_ready() {
                Some(result) => Decided::Now(settle(result, &s.replies, share, on_error, req)),
                None => Decided::Later(Deciding {
                    deciding,
                    replies: Arc::clone(&s.replies),
                    share,
                    on_error,
                }),
            }
        });
        ResponseFuture { machine }
    }
}
