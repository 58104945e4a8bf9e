//! The service made by [`FairLimitLayer`](super::FairLimitLayer).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::answer::{settle, FairReplies, Reported};
use super::future::Deciding;
use super::share::{Pool, Share};
use super::store::FairStore;
use crate::future::ResponseFuture;
use crate::gate::{Common, Decided};
use crate::key::{KeyExtractor, RequestHead};
use crate::quota::Quota;
use crate::response::OwnAnswer;
use crate::response::RateLimitBody;
use crate::service::Limited;

/// How a request's share is chosen.
pub(crate) enum Shares {
    One(Share),
    By(Box<dyn Fn(&RequestHead<'_>) -> Share + Send + Sync>),
}

/// What every service of one layer shares.
pub struct Shared<X, St> {
    pub(crate) common: Common<X>,
    pub(crate) store: St,
    pub(crate) pool: Pool,
    pub(crate) pool_quota: Quota,
    pub(crate) shares: Shares,
    pub(crate) replies: Arc<FairReplies>,
}

impl<X, St> fmt::Debug for Shared<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("label", &self.common.label)
            .finish_non_exhaustive()
    }
}

impl<X, St> Shared<X, St> {
    fn share(&self, head: &RequestHead<'_>) -> Share {
        match &self.shares {
            Shares::One(s) => *s,
            Shares::By(f) => f(head),
        }
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for Limited<S, Shared<X, St>>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>>,
    St: FairStore<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<B>, OwnAnswer, Reported, Deciding>;

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
