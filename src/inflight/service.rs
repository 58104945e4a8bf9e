//! The service made by [`InFlightLimitLayer`](super::InFlightLimitLayer).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::answer::{settle, InFlightReplies, Slot};
use super::body::InFlightBody;
use super::future::Waiting;
use super::store::{Attempt, InFlightStore, Limits};
use crate::future::ResponseFuture;
use crate::gate::{Common, Decided};
use crate::key::KeyExtractor;
use crate::response::OwnAnswer;
use crate::service::Limited;

/// What every service of one layer shares.
pub struct Shared<X, St> {
    pub(crate) common: Common<X>,
    pub(crate) store: St,
    pub(crate) limits: Limits,
    pub(crate) replies: Arc<InFlightReplies>,
}

impl<X, St> fmt::Debug for Shared<X, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("label", &self.common.label)
            .finish_non_exhaustive()
    }
}

impl<S, X, St, B, ResBody> Service<Request<B>> for Limited<S, Shared<X, St>>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    X: KeyExtractor<Request<B>>,
    St: InFlightStore<X::Key>,
    ResBody: Body<Data = Bytes>,
{
    type Response = Response<InFlightBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, Request<B>, OwnAnswer, Slot, Waiting>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let s = &*self.shared;
        let on_error = s.common.on_error;
        let machine = s.common.call(&mut self.inner, req, |key, req| {
            match s.store.acquire(key, &s.limits) {
                Attempt::Now(acquired) => Decided::Now(settle(acquired, &s.replies, on_error, req)),
                Attempt::Later(acquiring) => Decided::Later(Waiting {
                    acquiring,
                    replies: Arc::clone(&s.replies),
                    on_error,
                }),
            }
        });
        ResponseFuture { machine }
    }
}
